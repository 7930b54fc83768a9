"""The LLM workspace agent with a scripted model: scoring from the trajectory's checks, the
terminate tool, malformed calls, plain-text answers, the prepared layer's tools, and that no
label or rubric text reaches the model."""

from __future__ import annotations

import json
import re

import pytest

from envsched_jax.envs.runtime.core import run_checks
from envsched_jax.rethink.event_log import prepare
from envsched_jax.rethink.generator import GeneratorConfig, Scenario, generate_benchmark
from envsched_jax.rethink.llm_agent import (SYSTEM_PROMPT, LLMAgentConfig, LLMWorkspaceAgent,
                                            make_llm_agent)
from envsched_jax.rethink.roles import make_roles
from envsched_jax.rethink.workspace import CATEGORIES, WorkspaceError
from envsched_jax.rollout.backends.scripted import ScriptedBackend


@pytest.fixture(scope="module")
def tokenizer():
    from envsched_jax.learner import tokenizer as tokenizer_lib
    from envsched_jax.learner.weights import smollm2_gguf_path

    return tokenizer_lib.load_gguf_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def workspaces():
    bench = generate_benchmark(GeneratorConfig(seed=3, num_parents=2, variants_per_parent=1,
                                               kinds=("budget", "policy_rate")))
    return {ws.metadata["generator"]["kind"]: ws for ws in bench.workspaces}


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps([{"name": name, "arguments": arguments}]) + "</tool_call>"


def turn_of(request) -> int:
    return int(re.search(r"/turn(\d+)$", request.request_id).group(1))


def scripted(tokenizer, messages, *, config=None, prompts=None):
    """An agent whose model says ``messages[turn]`` (the last one again after the end)."""
    def respond(prompt, request):
        if prompts is not None:
            prompts.append(prompt)
        return messages[min(turn_of(request), len(messages) - 1)]

    backend = ScriptedBackend(tokenizer, respond)
    return LLMWorkspaceAgent(backend, tokenizer, config or LLMAgentConfig(), name="llm:scripted"), backend


def expected_checks(ws, answer):
    """Independent scoring: the rubric run directly on a final state holding ``answer``."""
    _, results, _ = run_checks(ws.workspace_id, [c.code for c in ws.rubric], {"answer": answer}, {})
    return [bool(r) for r in results]


@pytest.mark.parametrize("kind", ["budget", "policy_rate"])
def test_reading_then_submitting_the_reference_passes_every_check(tokenizer, workspaces, kind):
    ws = workspaces[kind]
    source = ws.reference["source"]
    agent, backend = scripted(tokenizer, [call("list_files"), call("read_file", path=source),
                                          call("submit_answer", answer=dict(ws.reference)),
                                          "never reached"])
    with agent:
        out = agent.play(ws)
    run = out.run
    assert run.success and run.passed == run.total == len(ws.rubric) and run.reward == 1.0
    assert run.agent == "llm:scripted" and run.workspace_id == ws.workspace_id
    assert run.answer == ws.reference
    # submit_answer ends the episode: three turns, the fourth message is never asked for
    assert out.end_reason == "terminate_tool" and out.num_turns == 3 and len(backend.requests) == 3
    assert out.tool_calls == ("list_files", "read_file", "submit_answer")
    assert out.episode.trajectory.final_state["reads"] == [source]
    # the sampler was asked for greedy decoding within the turn limit
    assert all(r.sampling.greedy for r in backend.requests)
    assert backend.requests[0].sampling.max_new_tokens <= LLMAgentConfig().max_tokens_per_turn


def test_a_decoy_answer_fails(tokenizer, workspaces):
    ws = workspaces["budget"]
    ff = Scenario.from_json(ws.metadata["scenario"]).false_final
    decoy = {"value": ff.value, "source": ff.path}
    assert decoy["value"] != ws.reference["value"]
    agent, _ = scripted(tokenizer, [call("read_file", path=ff.path), call("submit_answer", answer=decoy)])
    with agent:
        run = agent.run(ws)
    want = expected_checks(ws, decoy)
    assert not all(want)  # the rubric rejects the false final version
    assert run.passed == sum(want) and run.total == len(ws.rubric) and not run.success
    assert run.reward == pytest.approx(sum(want) / len(want)) and run.answer == decoy


def test_malformed_tool_calls_end_at_the_turn_limit_without_success(tokenizer, workspaces):
    ws = workspaces["budget"]
    config = LLMAgentConfig(max_turns=3)
    agent, backend = scripted(tokenizer, ['<tool_call>[{"name": "read_file", "arguments": {path}}]</tool_call>'],
                              config=config)
    with agent:
        out = agent.play(ws)
    assert out.end_reason == "max_turns" and out.num_turns == 3 and out.malformed_calls == 3
    assert out.tool_calls == () and len(backend.requests) == 3
    assert not out.run.success and out.run.passed == sum(expected_checks(ws, None)) == 0
    assert out.run.total == len(ws.rubric) and out.run.answer is None
    # the model was told what was wrong
    assert any("malformed tool call" in m["content"] for m in out.episode.transcript.messages if m["role"] == "tool")


def test_a_plain_text_answer_is_not_an_answer(tokenizer, workspaces):
    ws = workspaces["budget"]
    agent, _ = scripted(tokenizer, [json.dumps(dict(ws.reference))])
    with agent:
        out = agent.play(ws)
    assert out.end_reason == "answered" and out.num_turns == 1
    assert out.run.answer is None and out.run.passed == 0 and not out.run.success


def test_prepared_layer_tools_are_offered_and_callable(tokenizer, workspaces, tmp_path):
    ws = workspaces["budget"]
    layer = prepare(ws, mode="egs", roles=make_roles("heuristic"), out_dir=tmp_path / "egs")
    collections = layer.collection_map.to_json()["collections"]
    first = collections[0]["collection_id"]
    source = ws.reference["source"]
    prompts: list[str] = []
    agent, _ = scripted(tokenizer, [call("list_collections"), call("read_card", collection_id=first),
                                    call("file_history", path=source),
                                    call("submit_answer", answer=dict(ws.reference))], prompts=prompts)
    with agent:
        out = agent.play(ws, layer)
        plain = agent.play(ws)  # the same script without a layer
    for name in ("list_collections(", "read_card(", "file_history("):
        assert name in prompts[0]
    steps = out.episode.trajectory.steps()
    assert [s["action"]["name"] for s in steps] == ["list_collections", "read_card", "file_history", "submit_answer"]
    assert all(s["observation"]["success"] for s in steps)
    assert [c["collection_id"] for c in steps[0]["observation"]["collections"]] == [c["collection_id"]
                                                                                   for c in collections]
    touching = [e["event_id"] for e in layer.event_log.to_json()["events"]
                if source in e["inputs"] + e["outputs"] + [x["path"] for x in e["excerpts"]]
                + [(e.get("relation") or {}).get("source"), (e.get("relation") or {}).get("target")]]
    assert [e["event_id"] for e in steps[2]["observation"]["events"]] == touching
    assert out.run.success
    # unprepared: the layer tools are neither offered nor working
    assert "list_collections(" not in prompts[len(prompts) - plain.num_turns]
    first_step = plain.episode.trajectory.steps()[0]
    assert first_step["observation"]["success"] is False


def _label_words(ws) -> list[str]:
    """The category identifiers and every rubric check's text (stage words such as "draft" are
    left out: files legitimately say them)."""
    assert all(f.label is not None for f in ws.files)
    return sorted(set(CATEGORIES) | {c.text for c in ws.rubric})


@pytest.mark.parametrize("prepared", [None, "egs", "tgs"])
def test_no_label_or_rubric_text_reaches_the_model(tokenizer, workspaces, tmp_path, prepared):
    """Nothing of the labels or the rubric reaches the model, prepared or not; with TGS (whose
    groups are formed from the labels) not even how a collection was formed."""
    ws = workspaces["policy_rate"]
    layer = prepare(ws, mode=prepared, roles=make_roles("heuristic"), out_dir=tmp_path / prepared) if prepared else None
    texts = [f.path for f in ws.files if f.kind == "text"]
    script = [call("list_files")] + [call("read_file", path=p) for p in texts]
    if prepared:
        script += [call("list_collections")] + [call("read_card", collection_id=c["collection_id"])
                                                for c in layer.collection_map.to_json()["collections"]]
        script += [call("file_history", path=p) for p in texts]
    script += [call("submit_answer", answer={"value": 1})]
    config = LLMAgentConfig(max_turns=len(script), max_sequence_tokens=60_000)
    prompts: list[str] = []
    agent, _ = scripted(tokenizer, script, config=config, prompts=prompts)
    with agent:
        out = agent.play(ws, layer)
    assert out.end_reason == "terminate_tool" and out.num_turns == len(script)
    seen = "\n".join(m["content"] for m in out.episode.transcript.messages) + "\n".join(prompts)
    # the scan is real: file text the model read is in what it saw
    assert all(f.text.splitlines()[0] in seen for f in ws.files if f.kind == "text" and f.text.strip())
    leaked = [w for w in _label_words(ws) if w in seen]
    assert leaked == []
    assert '"partition"' not in seen and '"category"' not in seen
    assert "task_guided" not in seen and "task-guided" not in seen and '"origin"' not in seen


def test_trials_vary_the_seed_and_config_maps_to_the_rollout(tokenizer, workspaces):
    ws = workspaces["budget"]
    agent, backend = scripted(tokenizer, [call("submit_answer", answer={})],
                              config=LLMAgentConfig(trials=2, seed=4, temperature=0.7, tool_catalog="full"))
    with agent:
        runs = agent.run_trials(ws)
    assert [r.run.workspace_id for r in runs] == [ws.workspace_id] * 2
    assert [r.seed for r in backend.requests] == [4000 * 1000, 4001 * 1000]
    sampling = backend.requests[0].sampling
    assert not sampling.greedy and sampling.temperature == 0.7 and sampling.top_k == 100
    cfg = LLMAgentConfig().agent_config()
    assert cfg.terminate_tools == ("submit_answer",) and cfg.tool_catalog == "compact"
    assert cfg.system_prompt == SYSTEM_PROMPT and cfg.max_turns == 12
    with pytest.raises(WorkspaceError, match="closed"):
        agent.run(ws)  # closed


def test_config_errors_name_the_field():
    with pytest.raises(WorkspaceError, match="client"):
        LLMAgentConfig(client="hf")
    with pytest.raises(WorkspaceError, match="max_turns"):
        LLMAgentConfig(max_turns=0)
    with pytest.raises(WorkspaceError, match="temperature"):
        LLMAgentConfig(temperature=-1.0)
    assert LLMAgentConfig(client="openai", model="qwen").agent_name() == "llm:qwen"
    assert LLMAgentConfig(policy="/models/run7").agent_name() == "llm:run7"


def test_openai_factory_builds_without_contacting_a_server():
    agent = make_llm_agent(LLMAgentConfig(client="openai", base_url="http://127.0.0.1:9", model="served"))
    try:
        assert agent.name == "llm:served" and agent.backend.name == "openai"
        assert agent.backend.max_context == LLMAgentConfig().max_sequence_tokens
    finally:
        agent.close()
