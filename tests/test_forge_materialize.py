"""The materialiser interface and the programmatic materialiser: attempts, repairs by fresh draws,
the data-only decision, and failures named without raising."""

from __future__ import annotations

import pytest

from envsched_jax.forge import families
from envsched_jax.forge.bundle import TaskBundle
from envsched_jax.forge.materialize import (MaterializeRequest, Materializer, ProgrammaticMaterializer,
                                            attempt_from_verification)
from envsched_jax.forge.verify import CheckResult, Verification, verify_bundle

NAME, PARAMS = families.builtin_seeds()[1]
SEED = families.to_bundle(NAME, PARAMS)


def _accept(bundle: TaskBundle) -> Verification:
    static = verify_bundle(bundle, None, parent=SEED)
    return Verification(bundle.name, static.failed_check is None, static.checks)


def _request(action="increase_complexity/in_depth", name="out", attempt_seed=0):
    return MaterializeRequest(SEED, {"action": action}, "forge", name, attempt_seed)


def test_programmatic_materializer_is_a_materializer_and_accepts_a_static_clean_rewrite():
    mat = ProgrammaticMaterializer()
    assert isinstance(mat, Materializer)
    result = mat.materialize(_request(), _accept)
    assert result.accepted and result.failure is None and result.materialized == 1
    assert result.bundle.name == "out" and result.bundle.instruction != SEED.instruction
    assert result.to_json()["attempts"][0]["kind"] == "generate"
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)


def test_failures_are_repaired_by_fresh_draws_until_the_budget_ends():
    seen = []

    def reject_twice(bundle):
        seen.append(bundle)
        if len(seen) < 3:
            return Verification(bundle.name, False, (CheckResult("overlap", False, "near copy of 'x'"),))
        return _accept(bundle)

    result = ProgrammaticMaterializer(budget=3).materialize(_request(), reject_twice)
    assert result.accepted and [a.kind for a in result.attempts] == ["generate", "repair", "repair"]
    assert [a.failed for a in result.attempts] == ["overlap", "overlap", None]
    assert len({b.files["tests/expected.json"].data for b in seen}) == 3   # three different data draws
    seen.clear()
    failed = ProgrammaticMaterializer(budget=2).materialize(_request(), reject_twice)
    assert not failed.accepted and failed.bundle is None and failed.failure == "overlap"
    assert failed.materialized == 2 and "near copy" in failed.attempts[-1].reason


def test_inapplicable_action_is_kept_as_data_only_or_refused():
    minimal = families.to_bundle("minimal", families.builtin_seeds()[0][1])   # depth 1, no extras
    req = MaterializeRequest(minimal, {"action": "reduce_complexity/in_breadth"}, "forge", "r")
    kept = ProgrammaticMaterializer().materialize(req, _accept)
    refused = ProgrammaticMaterializer(allow_data_only=False).materialize(req, _accept)
    assert kept.accepted and "only the data changed" in kept.note    # logs-severity-01 is minimal
    assert not refused.accepted and refused.failure == "inapplicable" and refused.materialized == 0
    assert "only the data changed" in refused.attempts[0].reason


def test_non_family_seed_and_missing_action_are_named():
    foreign = SEED.with_metadata({"version": "1.0", "metadata": {"author_name": "x"}})
    result = ProgrammaticMaterializer().materialize(
        MaterializeRequest(foreign, {"action": "reduce_complexity/in_depth"}, "forge", "f"), _accept)
    assert not result.accepted and result.failure == "generation" and "not a built-in family bundle" in \
        result.attempts[0].reason
    with pytest.raises(ValueError, match="selects no action"):
        MaterializeRequest(SEED, {"action": None}, "forge", "n").action
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        ProgrammaticMaterializer(budget=0)


def test_attempt_from_an_unexecuted_verification_is_not_an_acceptance():
    static_only = verify_bundle(SEED, None)
    attempt = attempt_from_verification("generate", static_only)
    assert attempt.failed == "build" and "no Docker verifier" in attempt.reason
