"""Environment evolution (section 4.2, appendix C): decision points, validation (each failure
mode caught), the shortcut audit, rounds with feedback, and the paired aggregation of C.1."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envsched_jax.pool.model import Check
from envsched_jax.rethink.evolve import (
    POINT_KINDS,
    EvolutionError,
    EvolveConfig,
    HeuristicEvolver,
    HeuristicEvolverConfig,
    PairedResult,
    assemble,
    evidence_chain,
    evolve,
    paired_evaluation,
    run_rubric,
    shortcut_audit,
    spellings,
    validate,
)
from envsched_jax.rethink.workspace import FileLabel, Workspace, WorkspaceFile

VALUE_CHECK = Check("value is 4800", "def check_func(final_state):\n    a = final_state.get('answer') or {}\n"
                    "    return a.get('value') == 4800\n")
SOURCE_CHECK = Check("source is the approved record", "def check_func(final_state):\n"
                     "    return (final_state.get('answer') or {}).get('source') == 'finance/plan_v2.txt'\n")
NOT_FINAL = Check("value is not the withdrawn 5600", "def check_func(final_state):\n"
                  "    return (final_state.get('answer') or {}).get('value') != 5600\n")


def seed_workspace(value=4800) -> Workspace:
    files = (
        WorkspaceFile("finance/plan_v1.txt", b"Plan draft\nTotal: 4100\n", "2026-02-01T09:00:00Z",
                      label=FileLabel("noise", "superseded_version", "draft", "plan", 0)),
        WorkspaceFile("finance/plan_v2.txt", f"Plan approved\nTotal: {value}\n".encode(), "2026-02-03T09:00:00Z",
                      label=FileLabel("standard", "authoritative_record", "approved", "plan", 1,
                                      evidence=("finance/register.csv",))),
        WorkspaceFile("finance/register.csv", b"record,status\nplan_v2.txt,approved\n", "2026-02-04T09:00:00Z",
                      label=FileLabel("standard", "authoritative_record")),
        WorkspaceFile("drafts/plan_FINAL.txt", b"Plan FINAL\nTotal: 5600\n", "2026-02-09T09:00:00Z",
                      label=FileLabel("noise", "false_final_version", "final", "plan", 2,
                                      evidence=("finance/register.csv",))),
    )
    return Workspace("seed-1", "What is the approved plan total? Submit the value and its source file.", files,
                     (VALUE_CHECK, SOURCE_CHECK, NOT_FINAL), {"value": value, "source": "finance/plan_v2.txt"},
                     "plan", "small")


def test_spellings():
    assert spellings(12345) == {"12345", "12345.00", "12,345.00", "12,345", "12 345", "12.345"}
    assert spellings(12.5) == {"12.50", "12,50", "12.5"}
    assert spellings(3.0) == {"3.00", "3,00"}


def test_one_round_is_valid_and_has_every_property():
    seed = seed_workspace()
    variants = evolve(seed, HeuristicEvolver(), EvolveConfig(rounds=1, seed=3))
    assert len(variants) == 1
    v = variants[0]
    assert v.validation.passed, v.validation.failures
    ws = v.workspace
    assert ws.request == seed.request and ws.files[:len(seed.files)] == seed.files
    assert len(v.points) == 3 and len({p.kind for p in v.points}) == 3
    assert run_rubric(ws.rubric, ws.reference)[0] == 1.0
    spelled = dict(ws.reference, value=f"{ws.reference['value']:,}")        # "4,123": read as the seed's checks read it
    assert run_rubric(ws.rubric, spelled)[0] == 1.0
    assert run_rubric(ws.rubric, seed.reference)[0] < 1.0                 # y_t fails V_t+1
    for p in v.points:                                                   # each wrong choice is rejected
        assert run_rubric([p.check], dict(ws.reference, value=p.wrong_value))[0] == 0.0
        assert p.wrong_value != ws.reference["value"]
    assert v.validation.chain_variant > v.validation.chain_seed == 2
    assert ws.metadata["lineage"] == ["seed-1"] and len(ws.metadata["decision_points"]) == 3
    assert shortcut_audit(seed, ws) == []


def test_new_value_follows_the_stated_amounts():
    """y_t+1 recomputed by hand from the texts the evolver wrote."""
    import re

    for s in range(6):
        v = evolve(seed_workspace(), HeuristicEvolver(HeuristicEvolverConfig(num_points=4)), EvolveConfig(seed=s))[0]
        texts = {f.path: f.text for f in v.workspace.files}
        expected = 4800.0
        for p in v.points:
            text = texts[p.evidence[0]]
            if p.kind == "recalculation":
                sign, amount = re.search(r"corrected by ([+-])(\d+)", text).groups()
                expected += float(amount) * (1 if sign == "+" else -1)
            elif p.kind == "exclusion":
                expected -= float(re.search(r"amount of (\d+)", text).group(1))
        assert v.workspace.reference["value"] == expected
        assert {p.kind for p in v.points} == set(POINT_KINDS)


@pytest.mark.parametrize("tamper, message", [
    (lambda seed, ws: dataclasses.replace(ws, request=seed.request + " "), "the request changed"),
    (lambda seed, ws: dataclasses.replace(ws, files=(dataclasses.replace(ws.files[0], data=b"x"),) + ws.files[1:]),
     "was modified"),
    (lambda seed, ws: dataclasses.replace(ws, rubric=ws.rubric + (Check("bad", "def check_func(:"),)),
     "does not compile"),
    (lambda seed, ws: dataclasses.replace(ws, reference=dict(ws.reference, value=1)), "the new reference fails"),
    (lambda seed, ws: dataclasses.replace(ws, rubric=seed.rubric[1:], reference=seed.reference),
     "previous expected output still passes"),
])
def test_validation_catches_each_failure(tamper, message):
    seed = seed_workspace()
    v = evolve(seed, HeuristicEvolver(), EvolveConfig(seed=1))[0]
    result = validate(seed, tamper(seed, v.workspace), v.points)
    assert not result.passed and any(message in f for f in result.failures), result.failures


def test_too_few_points_and_a_leak_are_caught():
    seed = seed_workspace()
    v = evolve(seed, HeuristicEvolver(), EvolveConfig(seed=2))[0]
    assert any("at least 3" in f for f in validate(seed, v.workspace, v.points[:2]).failures)
    value = v.workspace.reference["value"]
    leak = WorkspaceFile("notes/leak.txt", f"Reported figure: {value:,}\n".encode(), "2026-03-01T00:00:00Z",
                         label=FileLabel("noise", "out_of_scope"))
    leaky = dataclasses.replace(v.workspace, files=v.workspace.files + (leak,))
    assert any("states the new answer" in f for f in validate(seed, leaky, v.points).failures)
    # a longer number that merely contains the digits is not a leak
    fine = dataclasses.replace(leak, data=f"Ticket 9{value}1\n".encode())
    assert not shortcut_audit(seed, dataclasses.replace(v.workspace, files=v.workspace.files + (fine,)))


def test_rounds_chain_and_failures_feed_the_next_attempt():
    seed = seed_workspace()
    variants = evolve(seed, HeuristicEvolver(), EvolveConfig(rounds=3, seed=4))
    assert [v.round for v in variants] == [1, 2, 3] and all(v.validation.passed for v in variants)
    assert variants[2].workspace.metadata["lineage"] == ["seed-1", variants[0].workspace.workspace_id,
                                                         variants[1].workspace.workspace_id]
    assert evidence_chain(variants[2].workspace) > evidence_chain(variants[0].workspace)
    assert len(variants[2].workspace.metadata["decision_points"]) == 9

    class Stubborn(HeuristicEvolver):
        """Proposes a non-numeric change first; records the feedback it receives."""
        seen: list = []

        def propose(self, workspace, *, history, feedback, rng):
            self.seen.append(list(feedback))
            proposal = super().propose(workspace, history=history, feedback=feedback, rng=rng)
            if len(self.seen) == 1:
                return dataclasses.replace(proposal, points=proposal.points[:2])
            return proposal

    stubborn = Stubborn()
    out = evolve(seed, stubborn, EvolveConfig(rounds=1, attempts=3, seed=5))
    assert [v.validation.passed for v in out] == [False, True]
    assert stubborn.seen[0] == [] and any("at least 3" in line for line in stubborn.seen[1])


def test_non_numeric_seeds_are_refused_with_the_reason():
    seed = dataclasses.replace(seed_workspace(), reference={"value": "Finance", "source": "finance/plan_v2.txt"})
    with pytest.raises(EvolutionError, match="numeric reference value.*'Finance'"):
        evolve(seed, HeuristicEvolver())
    with pytest.raises(ValueError, match="at least three"):
        HeuristicEvolverConfig(num_points=2)


def test_paired_aggregation_by_hand():
    r = PairedResult(("a", "b", "c"), ("m1", "m2", "m3"),
                     seed_success=np.array([[1.0, 1.0, 0.0], [1.0, 2 / 3, 1.0], [0.0, 0.0, 1.0]]),
                     variant_success=np.array([[0.0, 2 / 3, 0.0], [0.0, 0.0, 1 / 3], [1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(r.delta, [[-100, -100 / 3, 0], [-100, -200 / 3, -200 / 3], [100, 0, 0]])
    assert r.h.tolist() == [2, 3, 0]
    assert r.share_lower(3) == pytest.approx(1 / 3) and r.share_lower(2) == pytest.approx(2 / 3)
    # means over pairs with nonzero seed success only
    np.testing.assert_allclose(r.mean_delta(), [-100, -50, (-200 / 3 + 0) / 2])


def test_paired_evaluation_runs_agents_on_both_arms():
    seed = seed_workspace()
    variant = evolve(seed, HeuristicEvolver(), EvolveConfig(seed=6))[0].workspace
    def recorded(ws, trial):
        return run_rubric(ws.rubric, {"value": 4800, "source": "finance/plan_v2.txt"})[0] == 1.0
    def oracle(ws, trial):
        return run_rubric(ws.rubric, ws.reference)[0] == 1.0
    r = paired_evaluation([(seed, variant)], {"recorded": recorded, "oracle": oracle}, trials=2)
    assert r.seed_success.tolist() == [[1.0, 1.0]] and r.variant_success.tolist() == [[0.0, 1.0]]
    assert r.h.tolist() == [1]


def test_execution_feedback_reaches_the_next_round():
    """Agents' answers on a validated variant become failed-check summaries; a kind every agent
    passed moves to the end of the next round's preference."""
    seed = seed_workspace()
    recorded = {"value": 4800, "source": "finance/plan_v2.txt"}
    variants = evolve(seed, HeuristicEvolver(), EvolveConfig(rounds=2, seed=7),
                      evaluate=lambda ws: {"recorded": recorded, "oracle": ws.reference})
    first = variants[0].history[0]
    assert len(first["execution_feedback"]) == 3
    for line, point in zip(first["execution_feedback"], variants[0].points):
        assert line.startswith(f"execution: {point.kind} check ")
        assert ("failed by ['recorded']" in line) == (run_rubric([point.check], recorded)[0] < 1.0)
    second = [h for h in variants[-1].history if h["round"] == 2][0]
    assert second["feedback_in"] == first["execution_feedback"]
    passed_by_all = {p.kind for p, line in zip(variants[0].points, first["execution_feedback"])
                     if "passed by every agent" in line}
    ranked = HeuristicEvolver()._kinds(np.random.default_rng(0), first["execution_feedback"])
    preferred = [k for k in POINT_KINDS if k not in passed_by_all]      # kinds that exposed a failure, or new
    assert set(ranked[:len(preferred)]) == set(preferred[:len(ranked)]) or set(ranked) <= set(preferred)


class ScriptedClient:
    """A chat client replying from a script (no network)."""

    model = "scripted"
    constrains_json = False

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def complete(self, messages, *, json_object, max_tokens, seed):
        from envsched_jax.graph.llm_clients import ChatReply

        self.seen.append(messages)
        return ChatReply(self.replies.pop(0))


def _llm_reply(value=4500, leak=False, overwrite=False):
    import json

    files = [{"path": "finance/erratum_e1.txt", "text": "ERRATUM\nplan_v2.txt overstated travel by 500.\n"},
             {"path": "finance/memo_e2.txt", "text": "MEMO\nExclude the one-off 200 audit fee from plan_v2.txt.\n"
              + (f"Reported figure: {value}\n" if leak else "")},
             {"path": "finance/memo_e3.txt", "text": "MEMO\nA revision to 6000 takes effect next year.\n"}]
    if overwrite:
        files[0]["path"] = "finance/plan_v2.txt"
    return json.dumps({"files": files, "reference": {"value": value, "source": "finance/plan_v2.txt"},
                       "decision_points": [
                           {"kind": "recalculation", "wrong_value": 4800, "evidence": ["finance/erratum_e1.txt"],
                            "check_text": "the erratum is ignored"},
                           {"kind": "exclusion", "wrong_value": 4300, "evidence": ["finance/memo_e2.txt"],
                            "check_text": "the fee is still included"},
                           {"kind": "effective_date", "wrong_value": 6000, "evidence": ["finance/memo_e3.txt"],
                            "check_text": "the revision is not yet in effect"}]})


def test_llm_evolver_valid_reply_is_validated_like_any_other():
    from envsched_jax.rethink.evolve import LLMEvolver

    client = ScriptedClient([_llm_reply(4100)])
    v = evolve(seed_workspace(), LLMEvolver(client), EvolveConfig(seed=0))[-1]
    assert v.validation.passed, v.validation.failures
    assert v.workspace.reference["value"] == 4100 and [p.kind for p in v.points][0] == "recalculation"
    assert "Request (unchanged)" in client.seen[0][1]["content"] and "plan_v2.txt" in client.seen[0][1]["content"]


def test_llm_evolver_repairs_then_refuses_and_validation_catches_leaks():
    from envsched_jax.rethink.evolve import LLMEvolver

    client = ScriptedClient(["not json", _llm_reply(4100, overwrite=True), _llm_reply(4100)])
    v = evolve(seed_workspace(), LLMEvolver(client), EvolveConfig(seed=0))[-1]
    assert v.validation.passed and len(client.seen) == 3
    assert "already exists" in client.seen[2][-1]["content"]
    with pytest.raises(EvolutionError, match="no valid proposal.*not JSON"):
        evolve(seed_workspace(), LLMEvolver(ScriptedClient(["nope"] * 6)), EvolveConfig(seed=0, attempts=2))
    # a later round without a valid proposal ends the lineage and keeps the validated round
    kept = evolve(seed_workspace(), LLMEvolver(ScriptedClient([_llm_reply(4100)] + ["nope"] * 3)),
                  EvolveConfig(seed=0, rounds=2, attempts=1))
    assert [v.round for v in kept] == [1] and kept[0].validation.passed
    leaky = evolve(seed_workspace(), LLMEvolver(ScriptedClient([_llm_reply(4100, leak=True)] * 3)),
                   EvolveConfig(seed=0, attempts=1))[-1]
    assert not leaky.validation.passed and any("states the new answer" in f for f in leaky.validation.failures)
