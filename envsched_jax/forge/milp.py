"""The Envs-FORGE action-selection MILP (seeds/001 section 3, appendix B), in PySCIPOpt / SCIP.

Given the constants of a :class:`~envsched_jax.forge.candidates.CandidateSet` (seed s, action a,
skill k; E_s = sum_a x_sa is 1 when seed s is exported):

    maximise   sum_sa (f_sa + beta c_sa) x_sa  -  lambda (sum_sk z_sk + M sum_k Z_k)
    subject to x_sa in {0, 1}, and x_sa = 0 where (s, a) is ineligible (constants fixed before
               solving: recipe mask, split, prompt length, overlap)
               sum_a x_sa = 1 for every seed                     (per-seed mode)
               sum_a x_sa <= 1, sum_sa x_sa = M                  (portfolio mode, M exports)
               sum_a n_sak x_sa >= E_s     k required by s       (required skills kept)
               sum_a n_sak x_sa  = 0       k forbidden           (forbidden skills never chosen)
               w_sk <= sum_a n_sak x_sa,  w_sk + z_sk >= tau E_s,  0 <= w_sk <= 1,  0 <= z_sk <= xi_bar
                                           k optional for s      (bounded activation, no big-M)
               sum_sa n_sak x_sa + M Z_k >= t_k M,  0 <= Z_k <= xi_bar
                                           k with a shared coverage target t_k (portfolio mode)

with f the frontier score, c the compactness, n the candidate-skill incidence (uniform
indexing), beta / lambda / tau / xi_bar = ``ForgeConfig.compactness_bonus / coverage_penalty /
optional_target / slack_cap`` (xi_bar = 0.2 as in the paper's evaluated run). A shared slack Z_k
is a share of the M exports, so it is weighted by M: each export short of a target costs lambda,
on the scale of one seed's frontier score (our choice; the paper gives no weights). Per-seed mode is
the paper's evaluated mode, solved as one model whose seeds share no constraint (the paper's
recorded run: 100 seeds, 600 action variables, status optimal); portfolio mode adds the shared
coverage targets and an export count.

Backends (appendix B's fallback rule): SCIP when PySCIPOpt imports and reports ``optimal``;
otherwise exhaustive enumeration when the problem has at most 24 eligible candidates (per-seed
mode is separable, so every seed is enumerated on its own and enumeration is always exact there),
otherwise a deterministic coverage-aware greedy. The backend used, SCIP's status and the reason
for any fallback are part of the :class:`Selection`.

Given a choice, the continuous variables have closed forms (w = min(1, coverage), z = max(0,
target - w)), so :func:`evaluate` computes the objective and feasibility of any choice exactly;
enumeration and greedy use it, and the tests check SCIP's objective against it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from envsched_jax.forge.actions import ACTIONS, edit_mask
from envsched_jax.forge.candidates import CandidateSet, ForgeConfig, ForgeInputError

Mode = Literal["per_seed", "portfolio"]
Backend = Literal["auto", "scip", "enumeration", "greedy"]
ENUMERATION_MAX_CANDIDATES = 24
_TOL = 1e-9


class ForgeInfeasibleError(ValueError):
    """No selection satisfies the constraints; the message names the seeds or skills."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """A candidate set plus the mode's constants, validated once."""
    cands: CandidateSet
    config: ForgeConfig
    mode: Mode
    num_exports: int
    target_skills: np.ndarray          # [T] skill indices with a shared coverage target
    targets: np.ndarray                # [T] target shares t_k

    @property
    def ok(self) -> np.ndarray:
        """[S, 6] bool: candidate is eligible and meets its own seed's constraints."""
        c, cfg = self.cands, self.config
        keeps_required = ~(c.required[:, None, :] & ~c.nodes).any(axis=2)
        no_forbidden = ~(c.nodes & c.forbidden[None, None, :]).any(axis=2)
        ok = c.eligible & keeps_required & no_forbidden
        if cfg.optional_target > cfg.slack_cap + _TOL:
            ok &= ~(c.optional[:, None, :] & ~c.nodes).any(axis=2)
        return ok

    @property
    def seed_value(self) -> np.ndarray:
        """[S, 6]: a candidate's objective terms that depend on its seed alone."""
        c, cfg = self.cands, self.config
        uncovered = (c.optional[:, None, :] & ~c.nodes).sum(axis=2)
        return c.candidate_value(cfg) - cfg.coverage_penalty * cfg.optional_target * uncovered


def make_problem(cands: CandidateSet, config: ForgeConfig = ForgeConfig(), *, mode: Mode = "per_seed",
                 coverage_targets: Mapping[str, float] | None = None,
                 num_exports: int | None = None) -> Problem:
    """Validate the mode's constants (shared targets and export count exist only in portfolio mode)."""
    coverage_targets = dict(coverage_targets or {})
    if mode not in ("per_seed", "portfolio"):
        raise ForgeInputError(f"mode must be 'per_seed' or 'portfolio', got {mode!r}")
    if mode == "per_seed" and (coverage_targets or num_exports not in (None, cands.num_seeds)):
        raise ForgeInputError("coverage_targets and num_exports need mode='portfolio' (per-seed mode exports "
                              "every seed and shares no constraint between seeds)")
    m = cands.num_seeds if num_exports is None else num_exports
    if not (isinstance(m, int) and 1 <= m <= cands.num_seeds):
        raise ForgeInputError(f"num_exports must be an int in [1, {cands.num_seeds}], got {num_exports!r}")
    index = {k: i for i, k in enumerate(cands.skills)}
    for skill, share in coverage_targets.items():
        if skill not in index:
            raise ForgeInputError(f"coverage_targets: skill {skill!r} is not a skill of any seed or candidate")
        if not (isinstance(share, (int, float)) and 0.0 <= share <= 1.0):
            raise ForgeInputError(f"coverage_targets[{skill!r}] must be a share in [0, 1], got {share!r}")
    skills = np.array([index[k] for k in coverage_targets], np.int64)
    return Problem(cands, config, mode, m, skills, np.array(list(coverage_targets.values()), np.float64))


def evaluate(problem: Problem, choice: np.ndarray) -> tuple[float, bool, np.ndarray]:
    """Objective, feasibility and shared slacks Z [T] of ``choice`` ([S] action index, -1 = not
    exported), with the continuous variables at their optimal closed forms."""
    choice = np.asarray(choice)
    exported = choice >= 0
    s = np.flatnonzero(exported)
    a = choice[exported]
    ok = bool(problem.ok[s, a].all()) and int(exported.sum()) == problem.num_exports
    if problem.mode == "per_seed":
        ok &= bool(exported.all())
    objective = float(problem.seed_value[s, a].sum())
    cov = problem.cands.nodes[s, a][:, problem.target_skills].sum(axis=0) / problem.num_exports
    slack = np.maximum(problem.targets - cov, 0.0)
    ok &= bool((slack <= problem.config.slack_cap + _TOL).all())
    objective -= problem.config.coverage_penalty * problem.num_exports * float(slack.sum())
    return objective, ok, slack


@dataclasses.dataclass(frozen=True)
class Selection:
    """A solved selection. ``choice[s]`` is seed s's action index (-1: not exported)."""
    backend: Literal["scip", "enumeration", "greedy"]
    status: str                      # SCIP's status, "optimal" (enumeration) or "heuristic" (greedy)
    objective: float
    choice: np.ndarray
    coverage_slack: dict[str, float]
    solve_seconds: float
    num_variables: int               # SCIP's model (0 for the fallbacks, which build none)
    num_constraints: int
    num_action_variables: int        # the primary x_sa, one per eligible candidate
    scip_status: str | None = None   # set when SCIP ran (also when its result was not used)
    scip_objective: float | None = None
    fallback_reason: str | None = None

    def decisions(self, problem: Problem) -> list[dict[str, Any]]:
        """The auditable payload: one record per seed, skills by global index and name."""
        c = problem.cands
        out = []
        for s, a in enumerate(self.choice.tolist()):
            if a < 0:
                out.append({"seed_id": c.seed_ids[s], "action": None})
                continue
            kept, added, removed = c.preserved_added_removed(s, a)
            out.append({
                "seed_id": c.seed_ids[s], "action": ACTIONS[a].name, "action_index": a,
                "pass_rate": float(c.pass_rate[s]), "projected_pass_rate": float(c.projected[s, a]),
                "frontier_score": float(c.frontier[s, a]), "compactness": float(c.compactness[s, a]),
                "skills_preserved": kept, "skills_added": added, "skills_removed": removed,
                "skill_names": {i: c.skills[i] for i in kept + added + removed},
                "edit_mask": edit_mask(ACTIONS[a])})
        return out

    def report(self, problem: Problem) -> dict[str, Any]:
        return {"backend": self.backend, "status": self.status, "scip_status": self.scip_status,
                "fallback_reason": self.fallback_reason, "objective": self.objective,
                "mode": problem.mode, "num_seeds": problem.cands.num_seeds, "num_exports": problem.num_exports,
                "num_variables": self.num_variables, "num_constraints": self.num_constraints,
                "num_action_variables": self.num_action_variables, "scip_objective": self.scip_objective,
                "solve_seconds": self.solve_seconds, "coverage_slack": self.coverage_slack,
                "skills": list(problem.cands.skills), "decisions": self.decisions(problem)}

    def to_json(self, problem: Problem) -> str:
        return json.dumps(self.report(problem), indent=2, sort_keys=True)


def _precheck(problem: Problem) -> None:
    """Infeasibility that can be named before solving: seeds without a usable candidate, too few
    exportable seeds, a shared target out of reach even on its own."""
    c, ok = problem.cands, problem.ok
    stuck = np.flatnonzero(~ok.any(axis=1))
    if problem.mode == "per_seed" and len(stuck):
        lines = []
        for s in stuck[:5]:
            why = [f"{ACTIONS[a].name}: {_why_not(problem, s, a)}" for a in range(len(ACTIONS))]
            lines.append(f"seed {c.seed_ids[s]!r} ({'; '.join(why)})")
        raise ForgeInfeasibleError(f"{len(stuck)} seed(s) have no feasible action: " + "; ".join(lines))
    usable = ok.any(axis=1)
    if usable.sum() < problem.num_exports:
        raise ForgeInfeasibleError(f"only {int(usable.sum())} seeds have a feasible action, fewer than "
                                   f"num_exports = {problem.num_exports}")
    for k, share in zip(problem.target_skills.tolist(), problem.targets.tolist()):
        reach = min(int((ok & c.nodes[:, :, k]).any(axis=1).sum()), problem.num_exports) / problem.num_exports
        if share - reach > problem.config.slack_cap + _TOL:
            raise ForgeInfeasibleError(
                f"coverage target of skill {c.skills[k]!r} ({share:.3f} of exports) is out of reach: at most "
                f"{reach:.3f} of the exports can cover it and the slack is capped at {problem.config.slack_cap}")


def _why_not(problem: Problem, s: int, a: int) -> str:
    c, cfg = problem.cands, problem.config
    if not c.eligible[s, a]:
        return c.why_ineligible[s][a]
    missing = np.flatnonzero(c.required[s] & ~c.nodes[s, a])
    if len(missing):
        return f"drops required skill(s) {[c.skills[k] for k in missing]}"
    bad = np.flatnonzero(c.nodes[s, a] & c.forbidden)
    if len(bad):
        return f"uses forbidden skill(s) {[c.skills[k] for k in bad]}"
    dropped = np.flatnonzero(c.optional[s] & ~c.nodes[s, a])
    return (f"drops optional skill(s) {[c.skills[k] for k in dropped]} while optional_target "
            f"{cfg.optional_target} exceeds slack_cap {cfg.slack_cap}")


def _finish(problem: Problem, backend, status, choice, start, num_vars, num_cons, **extra) -> Selection:
    objective, ok, slack = evaluate(problem, choice)
    if not ok:
        raise ForgeInfeasibleError(f"the {backend} backend found no feasible selection"
                                   + (" (it is a heuristic: SCIP may still find one)" if backend == "greedy" else ""))
    names = {problem.cands.skills[k]: float(z) for k, z in zip(problem.target_skills.tolist(), slack.tolist())}
    return Selection(backend, status, objective, np.asarray(choice, np.int64), names, time.perf_counter() - start,
                     num_vars, num_cons, int(problem.cands.eligible.sum()), **extra)


# ------------------------------------------------------------------------------------------
# Backends


def _scip_available() -> bool:
    try:
        import pyscipopt  # noqa: F401
    except ImportError:
        return False
    return True


def solve_scip(problem: Problem, time_limit_s: float = 60.0) -> tuple[str, np.ndarray | None, float | None, int, int]:
    """Build and solve the MILP of the module docstring. Returns (status, choice or None,
    SCIP's objective or None, variables, constraints)."""
    from pyscipopt import Model, quicksum

    c, cfg = problem.cands, problem.config
    model = Model("envs_forge")
    model.hideOutput()
    model.setParam("limits/time", float(time_limit_s))
    base_value = c.candidate_value(cfg)
    x: dict[tuple[int, int], Any] = {}   # the primary action variables, eligible candidates only
    for s, a in zip(*np.nonzero(c.eligible)):
        x[s, a] = model.addVar(vtype="B", name=f"x_{s}_{a}", obj=float(base_value[s, a]))
    penalty = -float(cfg.coverage_penalty)
    for s in range(c.num_seeds):
        xs = [(a, x[s, a]) for a in range(len(ACTIONS)) if (s, a) in x]
        exported = quicksum(v for _, v in xs)
        if problem.mode == "per_seed":
            model.addCons(exported == 1, name=f"one_{s}")
        else:
            model.addCons(exported <= 1, name=f"one_{s}")
        for k in np.flatnonzero(c.required[s]):
            model.addCons(quicksum(v for a, v in xs if c.nodes[s, a, k]) >= exported, name=f"req_{s}_{k}")
        for k in np.flatnonzero(c.forbidden & c.nodes[s].any(axis=0)):
            model.addCons(quicksum(v for a, v in xs if c.nodes[s, a, k]) == 0, name=f"forbid_{s}_{k}")
        for k in np.flatnonzero(c.optional[s]):
            w = model.addVar(vtype="C", lb=0.0, ub=1.0, name=f"w_{s}_{k}")
            z = model.addVar(vtype="C", lb=0.0, ub=float(cfg.slack_cap), name=f"z_{s}_{k}", obj=penalty)
            model.addCons(w <= quicksum(v for a, v in xs if c.nodes[s, a, k]), name=f"act_{s}_{k}")
            model.addCons(w + z >= float(cfg.optional_target) * exported, name=f"cov_{s}_{k}")
    m = problem.num_exports
    if problem.mode == "portfolio":
        model.addCons(quicksum(x.values()) == m, name="exports")
        for k, share in zip(problem.target_skills.tolist(), problem.targets.tolist()):
            zk = model.addVar(vtype="C", lb=0.0, ub=float(cfg.slack_cap), name=f"Z_{k}", obj=penalty * m)
            covered = quicksum(v for (s, a), v in x.items() if c.nodes[s, a, k])
            model.addCons(covered + m * zk >= share * m, name=f"quota_{k}")
    model.setMaximize()
    model.optimize()
    status = model.getStatus()
    num_vars, num_cons = model.getNVars(transformed=False), model.getNConss(transformed=False)
    if status != "optimal":
        return status, None, None, num_vars, num_cons
    choice = np.full(c.num_seeds, -1, np.int64)
    for (s, a), v in x.items():
        if model.getVal(v) > 0.5:
            choice[s] = a
    return status, choice, float(model.getObjVal()), num_vars, num_cons


def solve_enumeration(problem: Problem) -> np.ndarray:
    """Exact by exhaustive enumeration: per seed in per-seed mode (separable), over all joint
    choices in portfolio mode (only up to :data:`ENUMERATION_MAX_CANDIDATES` eligible candidates).
    Ties go to the lower action index (per seed) or the first joint choice in product order."""
    ok = problem.ok
    if problem.mode == "per_seed":
        value = np.where(ok, problem.seed_value, -np.inf)
        return np.argmax(value, axis=1).astype(np.int64)
    count = int(problem.cands.eligible.sum())
    if count > ENUMERATION_MAX_CANDIDATES:
        raise ForgeInputError(f"enumeration takes at most {ENUMERATION_MAX_CANDIDATES} eligible candidates in "
                              f"portfolio mode; this problem has {count}")
    skip = problem.num_exports < problem.cands.num_seeds
    options = [([-1] if skip else []) + np.flatnonzero(ok[s]).tolist() for s in range(problem.cands.num_seeds)]
    best, best_value = None, -math.inf
    for combo in itertools.product(*options):
        choice = np.array(combo, np.int64)
        if int((choice >= 0).sum()) != problem.num_exports:
            continue
        value, feasible, _ = evaluate(problem, choice)
        if feasible and value > best_value + _TOL:
            best, best_value = choice, value
    if best is None:
        raise ForgeInfeasibleError("no joint choice meets the coverage targets within the slack cap")
    return best


def _shared_penalty(problem: Problem, cov_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(penalty, cap excess) of coverage counts [..., T]."""
    slack = np.maximum(problem.targets - cov_counts / problem.num_exports, 0.0)
    excess = np.maximum(slack - problem.config.slack_cap, 0.0).sum(axis=-1)
    return problem.config.coverage_penalty * problem.num_exports * slack.sum(axis=-1), excess


def solve_greedy(problem: Problem, max_rounds: int | None = None) -> np.ndarray:
    """Deterministic coverage-aware greedy: every seed starts at its best feasible action (or, with
    fewer exports than seeds, seeds are added one at a time by marginal gain, shared coverage
    included); then single-seed action changes are applied while one improves the objective,
    first reducing any slack above the cap. Ties go to the lowest (seed, action) index."""
    c, ok = problem.cands, problem.ok
    value = np.where(ok, problem.seed_value, -np.inf)                 # [S, 6]
    inc = c.nodes[:, :, problem.target_skills].astype(np.float64)      # [S, 6, T]
    num_seeds, num_actions = value.shape
    choice = np.full(num_seeds, -1, np.int64)
    cov = np.zeros(len(problem.target_skills))
    if problem.num_exports == num_seeds:
        choice = np.argmax(value, axis=1).astype(np.int64)
        if not np.isfinite(value[np.arange(num_seeds), choice]).all():
            raise ForgeInfeasibleError("some seed has no feasible action")
        cov = inc[np.arange(num_seeds), choice].sum(axis=0)
    else:
        for _ in range(problem.num_exports):
            pen, excess = _shared_penalty(problem, cov[None, None, :] + inc)
            gain = np.where(choice[:, None] < 0, value - pen - 1e3 * excess, -np.inf)
            s, a = np.unravel_index(int(np.argmax(gain)), gain.shape)
            if not np.isfinite(gain[s, a]):
                raise ForgeInfeasibleError("too few seeds with a feasible action")
            choice[s], cov = a, cov + inc[s, a]
    exported = np.flatnonzero(choice >= 0)
    for _ in range(max_rounds or 10 * num_seeds + 10):
        pen0, excess0 = _shared_penalty(problem, cov)
        current = value[exported, choice[exported]]
        new_cov = cov[None, None, :] - inc[exported, choice[exported]][:, None, :] + inc[exported]
        pen, excess = _shared_penalty(problem, new_cov)                 # [E, 6]
        # lexicographic: cap excess first, then the objective
        delta = (excess0 - excess) * 1e3 + (value[exported] - current[:, None]) - (pen - pen0)
        delta = np.where(np.isfinite(value[exported]), delta, -np.inf)
        e, a = np.unravel_index(int(np.argmax(delta)), delta.shape)
        if not delta[e, a] > 1e-12:
            break
        s = exported[e]
        cov = cov - inc[s, choice[s]] + inc[s, a]
        choice[s] = a
    return choice


def select_actions(cands: CandidateSet, config: ForgeConfig = ForgeConfig(), *, mode: Mode = "per_seed",
                   coverage_targets: Mapping[str, float] | None = None, num_exports: int | None = None,
                   backend: Backend = "auto", time_limit_s: float = 60.0) -> Selection:
    """Choose one action per exported seed (module docstring for the model and the fallbacks).

    ``backend="auto"`` uses SCIP when PySCIPOpt imports; ``"scip"`` insists on it (an error when
    it is missing) but still falls back when its status is not optimal; ``"enumeration"`` and
    ``"greedy"`` force a fallback."""
    problem = make_problem(cands, config, mode=mode, coverage_targets=coverage_targets, num_exports=num_exports)
    if backend not in ("auto", "scip", "enumeration", "greedy"):
        raise ForgeInputError(f"backend must be auto, scip, enumeration or greedy, got {backend!r}")
    _precheck(problem)
    start = time.perf_counter()
    fallback, scip_status = None, None
    if backend in ("auto", "scip"):
        if _scip_available():
            status, choice, scip_obj, num_vars, num_cons = solve_scip(problem, time_limit_s)
            scip_status = status
            if status == "infeasible":
                raise ForgeInfeasibleError("SCIP: the coverage targets cannot be met together within the slack cap "
                                           f"{config.slack_cap} with {problem.num_exports} exports")
            if choice is not None:
                return _finish(problem, "scip", status, choice, start, num_vars, num_cons, scip_status=status,
                               scip_objective=scip_obj)
            fallback = f"SCIP status {status!r} is not optimal"
        elif backend == "scip":
            raise ForgeInputError("backend='scip' needs PySCIPOpt (pip install pyscipopt)")
        else:
            fallback = "PySCIPOpt is not installed"
    exact = mode == "per_seed" or int(cands.eligible.sum()) <= ENUMERATION_MAX_CANDIDATES
    if backend == "greedy" or (backend != "enumeration" and not exact):
        choice = solve_greedy(problem)
        return _finish(problem, "greedy", "heuristic", choice, start, 0, 0, scip_status=scip_status,
                       fallback_reason=fallback)
    choice = solve_enumeration(problem)
    return _finish(problem, "enumeration", "optimal", choice, start, 0, 0, scip_status=scip_status,
                   fallback_reason=fallback)
