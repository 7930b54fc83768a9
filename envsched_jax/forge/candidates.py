"""Candidate construction: six action variants per seed, their constants and skill subgraphs.

Appendix A.2: after pass-rate estimation each seed yields six candidates; transfer priors,
frontier utilities and skill nodes are computed, and prompt length, split membership and overlap
are constants fixed before solving. This module computes all of them into one
:class:`CandidateSet` of arrays ``[S, 6]`` (seed s, action a in :data:`~.actions.ACTIONS` order)
that the MILP (:mod:`envsched_jax.forge.milp`) reads and nothing else.

**Skill subgraphs** (our rules; the paper names preserved / added / removed nodes but not how a
direction picks them). A seed carries required skills R and optional skills O; a
:class:`SkillGraph` gives, per skill, the next skills along its chain (``deeper``) and its
neighbouring skills (``neighbours``). With base = R + O, in that order:

- increase / in_depth: base plus the first deeper skill of a base skill that is not in base;
- increase / in_breadth: base plus the first neighbour of a base skill that is not in base;
- reduce (both directions): R only (the optional skills are removed: a bridge task keeps the
  target reasoning and drops what masks it, appendix A.5 cases III-IV);
- diversify / in_depth: base (requirements vary within the same skills);
- diversify / in_breadth: the last optional skill is swapped for the first outside neighbour
  (added when there is no optional skill; base when there is no neighbour).

"First" means in base order, then in the order ``deeper`` / ``neighbours`` list them, so the
subgraphs are a pure function of the inputs.

**Uniform candidate-skill indexing**: all skills named anywhere get one global index (sorted
names); candidate (s, a) has the incidence row ``nodes[s, a]`` over that index, and the decoded
payload reports skills by the same indices and names, so a solution can be audited against the
model it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from envsched_jax.forge.actions import (ACTIONS, FrontierConfig, TransferPriors, frontier_score,
                                        projected_pass_rate, recipe_mask)


class ForgeInputError(ValueError):
    """A seed, skill graph or configuration value is invalid; the message names it."""


@dataclasses.dataclass(frozen=True)
class SeedSpec:
    """One seed as the selector sees it.

    ``pass_rate`` is the estimated verifier pass rate (:mod:`envsched_jax.forge.passrate`).
    ``prompt_tokens`` is the length of the materialisation prompt, one value for all six
    candidates or one per candidate; ``overlap`` marks candidates known to duplicate an existing
    bundle (one flag or six). ``split`` is the seed's split: only ``ForgeConfig.eligible_splits``
    may be rewritten (a held-out seed must never leak into training data)."""
    seed_id: str
    pass_rate: float
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    split: str = "train"
    prompt_tokens: int | tuple[int, ...] = 0
    overlap: bool | tuple[bool, ...] = False

    def __post_init__(self):
        where = f"seed {self.seed_id!r}"
        if not isinstance(self.seed_id, str) or not self.seed_id:
            raise ForgeInputError(f"seed_id must be a non-empty string, got {self.seed_id!r}")
        p = self.pass_rate
        if not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0):
            raise ForgeInputError(f"{where}: pass_rate must be a number in [0, 1], got {p!r}")
        for name in ("required", "optional"):
            skills = getattr(self, name)
            if isinstance(skills, str) or not all(isinstance(k, str) and k for k in skills):
                raise ForgeInputError(f"{where}: {name} must be a sequence of skill names, got {skills!r}")
            if len(set(skills)) != len(skills):
                raise ForgeInputError(f"{where}: {name} lists a skill twice: {list(skills)}")
            object.__setattr__(self, name, tuple(str(k) for k in skills))
        both = sorted(set(self.required) & set(self.optional))
        if both:
            raise ForgeInputError(f"{where}: skill(s) {both} are both required and optional")
        for name, kind in (("prompt_tokens", int), ("overlap", bool)):
            value = getattr(self, name)
            values = value if isinstance(value, tuple) else (value,)
            if len(values) not in (1, len(ACTIONS)) or not all(isinstance(v, kind) for v in values):
                raise ForgeInputError(f"{where}: {name} must be one {kind.__name__} or {len(ACTIONS)}, got {value!r}")
            if kind is int and any(v < 0 for v in values):
                raise ForgeInputError(f"{where}: prompt_tokens must be >= 0, got {value!r}")

    def per_candidate(self, name: str) -> tuple:
        value = getattr(self, name)
        return value if isinstance(value, tuple) else (value,) * len(ACTIONS)


@dataclasses.dataclass(frozen=True)
class SkillGraph:
    """Skill chains (``deeper``) and adjacency (``neighbours``), each skill -> ordered skills."""
    deeper: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    neighbours: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("deeper", "neighbours"):
            table = getattr(self, name)
            for skill, targets in table.items():
                if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets):
                    raise ForgeInputError(f"SkillGraph.{name}[{skill!r}] must be a sequence of skill names, "
                                          f"got {targets!r}")
                if skill in targets:
                    raise ForgeInputError(f"SkillGraph.{name}[{skill!r}] lists the skill itself")
            object.__setattr__(self, name, {str(k): tuple(str(t) for t in v) for k, v in table.items()})


@dataclasses.dataclass(frozen=True)
class ForgeConfig:
    """Every constant of candidate scoring and the MILP (defaults: module docstrings).

    Objective (maximised): sum over chosen candidates of ``frontier + compactness_bonus *
    compactness`` minus ``coverage_penalty`` times the slack of the coverage targets (per-seed
    optional targets as they are, shared targets times the export count), each slack capped at
    ``slack_cap`` (the paper's xi_bar = 0.2). :mod:`envsched_jax.forge.milp` states the model."""
    priors: TransferPriors = TransferPriors()
    frontier: FrontierConfig = FrontierConfig()
    compactness_bonus: float = 0.01
    coverage_penalty: float = 0.1
    slack_cap: float = 0.2
    optional_target: float = 0.2
    """Per-seed target activation of each optional skill; at the default (= slack_cap) dropping an
    optional skill is allowed and costs ``coverage_penalty * optional_target``."""
    max_prompt_tokens: int = 8192
    eligible_splits: tuple[str, ...] = ("train",)
    forbidden_skills: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("compactness_bonus", "coverage_penalty"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ForgeInputError(f"ForgeConfig.{name} must be >= 0, got {value!r}")
        for name in ("slack_cap", "optional_target"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ForgeInputError(f"ForgeConfig.{name} must lie in [0, 1], got {value!r}")
        if not (isinstance(self.max_prompt_tokens, int) and self.max_prompt_tokens > 0):
            raise ForgeInputError(f"ForgeConfig.max_prompt_tokens must be a positive int, got {self.max_prompt_tokens!r}")


@dataclasses.dataclass(frozen=True)
class CandidateSet:
    """All constants of one selection problem; arrays are [S, 6] unless noted."""
    seed_ids: tuple[str, ...]
    skills: tuple[str, ...]            # the global skill index
    pass_rate: np.ndarray              # [S]
    projected: np.ndarray              # p'
    frontier: np.ndarray               # frontier score of p'
    compactness: np.ndarray            # 1 - |nodes| / max over the seed's candidates
    eligible: np.ndarray               # bool
    why_ineligible: tuple[tuple[str, ...], ...]   # [S][6] reason, "" when eligible
    nodes: np.ndarray                  # [S, 6, num_skills] bool: candidate-skill incidence
    required: np.ndarray               # [S, num_skills] bool
    optional: np.ndarray               # [S, num_skills] bool
    forbidden: np.ndarray              # [num_skills] bool

    @property
    def num_seeds(self) -> int:
        return len(self.seed_ids)

    def candidate_value(self, config: ForgeConfig) -> np.ndarray:
        """The per-candidate part of the objective before coverage penalties, [S, 6]."""
        return self.frontier + config.compactness_bonus * self.compactness

    def preserved_added_removed(self, s: int, a: int) -> tuple[list[int], list[int], list[int]]:
        """Skill indices of candidate (s, a) kept from, added to and removed from the seed."""
        base = self.required[s] | self.optional[s]
        cand = self.nodes[s, a]
        return (np.flatnonzero(base & cand).tolist(), np.flatnonzero(cand & ~base).tolist(),
                np.flatnonzero(base & ~cand).tolist())


def _first_outside(base: Sequence[str], table: Mapping[str, tuple[str, ...]]) -> str | None:
    present = set(base)
    for skill in base:
        for target in table.get(skill, ()):
            if target not in present:
                return target
    return None


def candidate_skills(seed: SeedSpec, graph: SkillGraph) -> list[tuple[str, ...]]:
    """The skill nodes of the seed's six candidates, in :data:`ACTIONS` order (module docstring)."""
    base = seed.required + seed.optional
    deeper = _first_outside(base, graph.deeper)
    neighbour = _first_outside(base, graph.neighbours)
    swap = (seed.required + seed.optional[:-1]) if seed.optional else base
    nodes = {
        "increase_complexity/in_depth": base + ((deeper,) if deeper else ()),
        "increase_complexity/in_breadth": base + ((neighbour,) if neighbour else ()),
        "reduce_complexity/in_depth": seed.required,
        "reduce_complexity/in_breadth": seed.required,
        "diversify_frontier/in_depth": base,
        "diversify_frontier/in_breadth": (swap + (neighbour,)) if neighbour else base,
    }
    return [nodes[a.name] for a in ACTIONS]


def build_candidates(seeds: Sequence[SeedSpec], graph: SkillGraph = SkillGraph(),
                     config: ForgeConfig = ForgeConfig(), recipe: str = "forge") -> CandidateSet:
    """Score every seed's six candidates and fix their eligibility (module docstring).

    A candidate is ineligible when the recipe's action mask excludes it, the seed's split is not
    in ``config.eligible_splits``, its prompt is longer than ``config.max_prompt_tokens``, or it
    overlaps an existing bundle; each reason is kept in ``why_ineligible``. Forbidden skills are
    not an eligibility constant: the MILP links them to the chosen action (a constraint)."""
    if not seeds:
        raise ForgeInputError("no seeds to select actions for")
    ids = [s.seed_id for s in seeds]
    dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dup:
        raise ForgeInputError(f"seed id(s) {dup[:5]} appear more than once")
    subgraphs = [candidate_skills(s, graph) for s in seeds]
    names = set(config.forbidden_skills)
    for seed, cands in zip(seeds, subgraphs):
        names.update(seed.required, seed.optional, *cands)
    skills = tuple(sorted(names))
    index = {k: i for i, k in enumerate(skills)}
    num_seeds, num_actions, num_skills = len(seeds), len(ACTIONS), len(skills)

    pass_rate = np.array([s.pass_rate for s in seeds], np.float64)
    projected = np.stack([projected_pass_rate(pass_rate, a, config.priors) for a in ACTIONS], axis=1)
    frontier = frontier_score(projected, config.frontier)
    nodes = np.zeros((num_seeds, num_actions, num_skills), bool)
    required = np.zeros((num_seeds, num_skills), bool)
    optional = np.zeros((num_seeds, num_skills), bool)
    for s, (seed, cands) in enumerate(zip(seeds, subgraphs)):
        required[s, [index[k] for k in seed.required]] = True
        optional[s, [index[k] for k in seed.optional]] = True
        for a, cand in enumerate(cands):
            nodes[s, a, [index[k] for k in cand]] = True
    sizes = nodes.sum(axis=2).astype(np.float64)
    compactness = 1.0 - sizes / np.maximum(sizes.max(axis=1, keepdims=True), 1.0)
    forbidden = np.zeros(num_skills, bool)
    forbidden[[index[k] for k in config.forbidden_skills]] = True

    allowed = recipe_mask(recipe, num_seeds)
    reasons = []
    for s, seed in enumerate(seeds):
        row = []
        for a, (tokens, overlaps) in enumerate(zip(seed.per_candidate("prompt_tokens"), seed.per_candidate("overlap"))):
            if not allowed[s, a]:
                row.append(f"recipe {recipe!r} excludes it")
            elif seed.split not in config.eligible_splits:
                row.append(f"split {seed.split!r} is not in eligible_splits {list(config.eligible_splits)}")
            elif tokens > config.max_prompt_tokens:
                row.append(f"prompt of {tokens} tokens exceeds max_prompt_tokens {config.max_prompt_tokens}")
            elif overlaps:
                row.append("overlaps an existing bundle")
            else:
                row.append("")
        reasons.append(tuple(row))
    eligible = np.array([[r == "" for r in row] for row in reasons], bool)
    return CandidateSet(tuple(ids), skills, pass_rate, projected, frontier, compactness, eligible,
                        tuple(reasons), nodes, required, optional, forbidden)
