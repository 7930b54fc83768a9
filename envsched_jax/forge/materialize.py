"""Materialisation: from a seed bundle and its selected action to one gold-verified bundle.

seeds/001 section 3 and appendices A.2-A.3, C: the solver picks the discrete action; generation
then rewrites instruction, fixtures, oracle, tests and container together under the action's edit
mask and skill subgraph, and a repair loop corrects parsing, build, static-validation and oracle
failures until the bundle passes gold verification or the budget is spent. Only accepted bundles
are exported; every attempt is counted (tokens, materialised directories), as the paper counts
synthesis cost (194-210 task directories and 2.27-2.88M tokens for 100 exports).

Every materialiser implements :class:`Materializer`: ``materialize(request, verify)`` returns a
:class:`MaterializeResult` with every attempt, whatever happened. ``verify`` is the gold
verification the pipeline applies (:func:`envsched_jax.forge.verify.verify_bundle` with the seed
as parent and the earlier exports as ``others``), passed in so that a materialiser never decides
acceptance itself. Two implementations:

- :class:`ProgrammaticMaterializer` (here): the deterministic offline stand-in for the LLM, for
  bundles of the built-in families (:mod:`envsched_jax.forge.families`). An attempt realises the
  action with :func:`~envsched_jax.forge.families.transform`; a "repair" is a fresh draw of the
  data (a new ``variant``), which is what can fix the failures a generator can cause (an overlap
  with an earlier export); a generator bug that fails the oracle fails every draw and ends with
  the budget, named.
- :class:`~envsched_jax.forge.llm_materialize.LLMMaterializer`: the paper's route, prompts of
  appendix C through any :class:`~envsched_jax.graph.llm_clients.ChatClient`.

*Decision*: an action the family cannot apply as named (see ``families.transform``: e.g. reduce
on a task already minimal) gives a data-only variant with a note. ``allow_data_only=False`` turns
that into a failure (``check = "inapplicable"``) so that a recipe that needs a real change can
refuse it; by default it is kept, with its note in the report, because the paper exports one
bundle per selected seed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from envsched_jax.forge.bundle import TaskBundle
from envsched_jax.forge.verify import Verification

Verify = Callable[[TaskBundle], Verification]
"""Gold verification of a candidate bundle (the pipeline binds the seed and earlier exports)."""


@dataclasses.dataclass(frozen=True)
class MaterializeRequest:
    """One seed to rewrite.

    Attributes:
      seed: the seed bundle (any layout; materialisers work on its Harbor form).
      decision: the seed's record of :meth:`envsched_jax.forge.milp.Selection.decisions` (action,
        pass rate, projected pass rate, frontier score, skills preserved / added / removed with
        their names, edit mask).
      recipe: the prompting policy (:data:`envsched_jax.forge.actions.RECIPES`); fixed recipes
        get the shared baseline contract of appendix C.1, ``forge`` the solver-conditioned C.2.
      name: the name of the bundle to produce.
      attempt_seed: seeds everything random in the attempt (data draws, LLM sampling).
      pass_rate_source: ``rollouts`` or ``predicted`` (how the seed's pass rate was estimated).
      rollouts: how many rollouts the estimate rests on (0 when predicted).
    """

    seed: TaskBundle
    decision: Mapping[str, Any]
    recipe: str
    name: str
    attempt_seed: int = 0
    pass_rate_source: str = "rollouts"
    rollouts: int = 0

    @property
    def action(self) -> str:
        action = self.decision.get("action")
        if not isinstance(action, str):
            raise ValueError(f"seed {self.seed.name!r}: the decision selects no action ({action!r})")
        return action


FailureKind = Literal["parse", "inapplicable", "generation", "schema", "safety", "length", "overlap", "sync",
                      "build", "oracle", "untouched", "infrastructure"]
"""``infrastructure``: the engine failed, not the bundle (:func:`envsched_jax.forge.pipeline.guarded_verify`)."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One generation or repair. ``materialized``: it produced a bundle directory that went to
    verification (the paper's "materialized task directories"); ``failed``: the check or stage
    that rejected it (None when accepted)."""

    kind: Literal["generate", "repair"]
    materialized: bool
    failed: FailureKind | None
    reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MaterializeResult:
    """Everything one request cost and produced; ``bundle`` is set only when accepted."""

    name: str
    seed: str
    action: str
    recipe: str
    bundle: TaskBundle | None
    verification: Verification | None
    attempts: tuple[Attempt, ...]
    note: str = ""
    last_bundle: TaskBundle | None = None
    """The last bundle that went to verification (the accepted one, or the last rejected one, which
    the pipeline keeps beside its reasons)."""

    @property
    def accepted(self) -> bool:
        return self.bundle is not None

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.attempts)

    @property
    def materialized(self) -> int:
        return sum(a.materialized for a in self.attempts)

    @property
    def failure(self) -> FailureKind | None:
        """What rejected the last attempt (None when accepted)."""
        return None if self.accepted or not self.attempts else self.attempts[-1].failed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "action": self.action, "recipe": self.recipe,
                "accepted": self.accepted, "failure": self.failure, "note": self.note,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "materialized": self.materialized, "attempts": [a.to_json() for a in self.attempts],
                "verification": None if self.verification is None else _verification_summary(self.verification)}


def _verification_summary(v: Verification) -> dict[str, Any]:
    return {"accepted": v.accepted, "checks": [dataclasses.asdict(c) for c in v.checks],
            "oracle_reward": v.oracle_reward, "untouched_reward": v.untouched_reward,
            "image": v.image, "cache_hit": v.cache_hit}


@runtime_checkable
class Materializer(Protocol):
    """Turns a request into an accepted bundle or a named failure, within its own budget."""

    name: str

    def materialize(self, request: MaterializeRequest, verify: Verify) -> MaterializeResult: ...


def attempt_from_verification(kind: Literal["generate", "repair"], verification: Verification, *,
                              prompt_tokens: int = 0, completion_tokens: int = 0,
                              seconds: float = 0.0) -> Attempt:
    """The :class:`Attempt` record of a bundle that went to verification."""
    failed = verification.failed_check
    if verification.accepted:
        return Attempt(kind, True, None, "", prompt_tokens, completion_tokens, seconds)
    if failed is None:  # static checks passed but no engine ran the executed ones
        return Attempt(kind, True, "build", "not verified: no Docker verifier", prompt_tokens,
                       completion_tokens, seconds)
    return Attempt(kind, True, failed.name, failed.reason, prompt_tokens, completion_tokens, seconds)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class ProgrammaticMaterializer:
    """The offline materialiser for the built-in families (module docstring).

    Attributes:
      budget: attempts per request (the first generation plus ``budget - 1`` fresh draws).
      allow_data_only: keep a data-only variant when the action cannot apply (module docstring).
    """

    budget: int = 3
    allow_data_only: bool = True
    name: str = "programmatic"

    def __post_init__(self):
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"ProgrammaticMaterializer.budget must be an int >= 1, got {self.budget!r}")

    def materialize(self, request: MaterializeRequest, verify: Verify) -> MaterializeResult:
        from envsched_jax.forge import families

        action = request.action
        attempts: list[Attempt] = []
        try:
            params = families.params_from_metadata(_harbor_metadata(request.seed))
        except ValueError as err:
            attempts.append(Attempt("generate", False, "generation",
                                    f"seed {request.seed.name!r} is not a built-in family bundle: {err}"))
            return MaterializeResult(request.name, request.seed.name, action, request.recipe, None, None,
                                     tuple(attempts))
        verification, note, bundle = None, "", None
        for k in range(self.budget):
            kind: Literal["generate", "repair"] = "generate" if k == 0 else "repair"
            start = time.perf_counter()
            rewrite = families.transform(params, action, rng_seed=request.attempt_seed * 1_000 + k)
            note = rewrite.note
            if note and not self.allow_data_only:
                attempts.append(Attempt(kind, False, "inapplicable", note, seconds=time.perf_counter() - start))
                break
            bundle = families.to_bundle(request.name, rewrite.params)
            verification = verify(bundle)
            attempts.append(attempt_from_verification(kind, verification, seconds=time.perf_counter() - start))
            if verification.accepted:
                return MaterializeResult(request.name, request.seed.name, action, request.recipe, bundle,
                                         verification, tuple(attempts), note, bundle)
        return MaterializeResult(request.name, request.seed.name, action, request.recipe, None, verification,
                                 tuple(attempts), note, bundle)


def _harbor_metadata(bundle: TaskBundle) -> Mapping[str, Any]:
    from envsched_jax.forge.bundle import convert

    return (bundle if bundle.layout == "harbor" else convert(bundle, "harbor")).metadata
