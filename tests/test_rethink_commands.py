"""Tiny runs of the Env-Rethink commands: generate, prepare, verifier, evolve and the table; each
writes its outputs into a temporary folder, resumes on a rerun, and never modifies the pool."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from envsched_jax.rethink.generator import GeneratorConfig
from envsched_jax.rethink.learned_verifier import LearnedConfig
from envsched_jax.rethink.workspace import tree_digest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
TINY = GeneratorConfig(seed=5, num_parents=3, variants_per_parent=1, kinds=("budget", "policy_rate", "reference_list"))


def _script(name: str):
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    gen = _script("rethink_generate")
    assert gen.main(gen.Args(out=root, generator=TINY)) == {"written": 3, "skipped": 0}
    assert gen.main(gen.Args(out=root, generator=TINY)) == {"written": 0, "skipped": 3}
    return root


def test_prepare_resumes_and_leaves_the_pool_unchanged(pool, tmp_path):
    prep = _script("rethink_prepare")
    before = tree_digest(pool)
    first = prep.main(prep.Args(pool=pool, out=tmp_path))
    assert first["prepared"] == 6 and first["pool_unchanged"]
    again = prep.main(prep.Args(pool=pool, out=tmp_path))
    assert again["skipped"] == 6 and "prepared" not in again
    from envsched_jax.rethink.collection_map import CollectionConfig
    from envsched_jax.rethink.event_log import PrepareConfig

    changed = prep.main(prep.Args(pool=pool, out=tmp_path, config=PrepareConfig(collection=CollectionConfig(max_files=4))))
    assert changed["prepared"] == 6                                      # another configuration: redone
    assert tree_digest(pool) == before
    logs = sorted(tmp_path.glob("*/*/*/event_log.json"))
    assert len(logs) == 6 and all(json.loads(p.read_text())["synthetic"] for p in logs)


def test_verifier_fits_once_then_loads(pool, tmp_path):
    ver = _script("rethink_verifier")
    args = ver.Args(pool=pool, out=tmp_path, learned=LearnedConfig(steps=20, hidden=16))
    first = ver.main(args)
    assert first["learned_model"] == "fitted"
    assert set(first["results"]) == {"filename", "newest", "evidence", "learned"}
    second = ver.main(args)
    assert second["learned_model"] == "loaded" and second["results"] == first["results"]
    model = next((tmp_path / "model").glob("*.npz"))
    model.write_bytes(model.read_bytes()[:100])                          # as an interrupted save would leave it
    third = ver.main(args)
    assert third["learned_model"] == "fitted" and third["results"] == first["results"]


def test_evolve_writes_validated_variants(pool, tmp_path):
    evo = _script("rethink_evolve")
    summary = evo.main(evo.Args(pool=pool, out=tmp_path))
    assert summary["seeds"] == 3 and summary["refused"] == 0 and summary["validated"] == 3
    report = json.loads((tmp_path / "evolution.json").read_text())
    assert all(a["passed"] for s in report["seeds"] for a in s["attempts"][-1:])
    index = json.loads((tmp_path / "variants" / "index.json").read_text())
    assert sum(len(rows) for rows in index.values()) == 3


def test_table_runs_end_to_end(tmp_path):
    table = _script("rethink_table")
    result = table.main(table.Args(out=tmp_path, generator=TINY, learned=LearnedConfig(steps=20, hidden=16)))
    assert result["benchmark"]["workspaces"] == 3
    for agent in result["agents"].values():
        assert set(agent) == {"clean", "noise", "egs", "tgs"}
        assert all(0.0 <= row["rate"] <= 1.0 for row in agent.values())
    assert result["evolution"]["validated"] + result["evolution"]["refused"] + result["evolution"]["failed_validation"] == 3
    assert (tmp_path / "rethink_table.json").exists()


def test_table_wires_an_llm_agent_into_every_condition(tmp_path, monkeypatch):
    """The table plays the configured LLM agent like the others and closes it (the agent itself is
    tested with a scripted backend in test_rethink_llm_agent.py)."""
    from envsched_jax.rethink.agents import run_agent

    table = _script("rethink_table")
    calls, closed = [], []

    class FakeLLM:
        def run(self, ws, layer=None, trial=0):
            calls.append(layer is not None)
            return run_agent("newest", ws, layer)

        def close(self):
            closed.append(True)

    monkeypatch.setattr(table, "make_llm_agent", lambda config: FakeLLM())
    result = table.main(table.Args(out=tmp_path, generator=TINY, agents=("filename",), llm_agent=True,
                                   learned=LearnedConfig(steps=5, hidden=8)))
    name = table.LLMAgentConfig().agent_name()
    assert set(result["agents"]) == {"filename", name} and closed == [True]
    assert calls.count(False) == 2 * 3 and calls.count(True) == 2 * 3     # clean + noise, egs + tgs per workspace


def test_evolve_refuses_workspaces_it_did_not_generate(pool, tmp_path):
    """Rubric code read from a pool folder runs in-process during validation, so a workspace that
    is not exactly the generator's rendering is refused, with the reason."""
    import dataclasses

    from envsched_jax.pool.model import Check
    from envsched_jax.rethink.generator import is_generated
    from envsched_jax.rethink.store import read_pool, write_pool

    ws = read_pool(pool)["train"][0]
    assert is_generated(ws)
    foreign = dataclasses.replace(ws, workspace_id="foreign", rubric=ws.rubric + (Check("x", "def check_func(s):\n    return True\n"),))
    assert not is_generated(foreign)
    write_pool(tmp_path / "pool", {"train": [foreign]})
    evo = _script("rethink_evolve")
    summary = evo.main(evo.Args(pool=tmp_path / "pool", out=tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "evolution.json").read_text())
    assert summary["refused"] == 1 and "not a workspace this project generated" in report["seeds"][0]["refused"]
