"""The six synthesis actions of Envs-FORGE, their transfer priors, frontier scores and edit masks.

An action is a projection (how the seed's difficulty should move relative to the current policy)
times an evolution direction (same skill chain or neighbouring skills), seeds/001 section 3 and
appendix A.1:

- ``increase_complexity``: make an easy (or saturated) seed harder;
- ``reduce_complexity``: turn an overmatched seed into a bridge task;
- ``diversify_frontier``: vary requirements of a seed near the frontier, keeping its difficulty;
- ``in_depth``: along the seed's own skill chain; ``in_breadth``: towards neighbouring skills.

**Transfer priors** (our choice; the paper says only that "transfer priors rank candidates before
generation" and gives two worked cases). A prior maps the seed's estimated pass rate p to the
projected pass rate p' of the rewritten bundle:

- increase: ``p' = p (1 - g)``, with g = 0.25 in depth and 0.15 in breadth;
- reduce: ``p' = p + (1 - p) g``, with g = 0.5 in depth and 0.35 in breadth;
- diversify: ``p' = p + (0.5 - p) g``, with g = 0 in both directions (difficulty preserved).

They reproduce the paper's two quantified cases: case II (a saturated seed, 1.0, hardened in
depth to 0.750) and case V (0.533 diversified in breadth to 0.533). Every constant is a field of
:class:`TransferPriors`, so a sensitivity study is one ``dataclasses.replace`` away.

**Frontier score**: ``exp(-(p' - c)^2 / (2 w^2))`` with centre c = 0.5 and width w = 0.2. The
paper gives one value, 0.9862 for p' = 8/15; this Gaussian gives 0.98621 (tested).

**Edit masks** (appendix A.2: "derived deterministically from the selected action"; the table is
ours). Every mask requires the instruction, the oracle solution and the tests to change together,
so no action allows an instruction-only edit (appendix A.3's consistency contract).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np

Projection = Literal["increase_complexity", "reduce_complexity", "diversify_frontier"]
Direction = Literal["in_depth", "in_breadth"]

PROJECTIONS: tuple[Projection, ...] = ("increase_complexity", "reduce_complexity", "diversify_frontier")
DIRECTIONS: tuple[Direction, ...] = ("in_depth", "in_breadth")
ARTIFACTS = ("instruction", "data", "solution", "tests", "environment", "helpers")


@dataclasses.dataclass(frozen=True)
class Action:
    projection: Projection
    direction: Direction

    @property
    def name(self) -> str:
        return f"{self.projection}/{self.direction}"

    def __str__(self) -> str:
        return self.name


ACTIONS: tuple[Action, ...] = tuple(Action(p, d) for p in PROJECTIONS for d in DIRECTIONS)
"""The six actions in a fixed order; the candidate index a of every seed is a position here."""
ACTION_INDEX = {a.name: k for k, a in enumerate(ACTIONS)}


def action(name: str) -> Action:
    """The action called ``name`` (``"projection/direction"``)."""
    try:
        return ACTIONS[ACTION_INDEX[name]]
    except KeyError:
        raise ValueError(f"unknown action {name!r}; the actions are {sorted(ACTION_INDEX)}") from None


@dataclasses.dataclass(frozen=True)
class TransferPriors:
    """Shift constants g of the projected pass rate, per action (module docstring)."""
    increase_in_depth: float = 0.25
    increase_in_breadth: float = 0.15
    reduce_in_depth: float = 0.5
    reduce_in_breadth: float = 0.35
    diversify_in_depth: float = 0.0
    diversify_in_breadth: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"TransferPriors.{field.name} must lie in [0, 1], got {value!r}")

    def shift(self, act: Action) -> float:
        short = act.projection.split("_")[0]
        return float(getattr(self, f"{short}_{act.direction}"))


def projected_pass_rate(p, act: Action, priors: TransferPriors = TransferPriors()):
    """p' for pass rate(s) ``p`` (scalar or array in [0, 1]) under action ``act``."""
    p = np.asarray(p, np.float64)
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"pass rates must lie in [0, 1], got {p[~((p >= 0) & (p <= 1))][:3].tolist()}")
    g = priors.shift(act)
    if act.projection == "increase_complexity":
        out = p * (1.0 - g)
    elif act.projection == "reduce_complexity":
        out = p + (1.0 - p) * g
    else:
        out = p + (0.5 - p) * g
    return out if out.ndim else float(out)


@dataclasses.dataclass(frozen=True)
class FrontierConfig:
    """The learning frontier: a Gaussian of the projected pass rate around ``center``."""
    center: float = 0.5
    width: float = 0.2

    def __post_init__(self):
        if not 0.0 <= self.center <= 1.0:
            raise ValueError(f"FrontierConfig.center must lie in [0, 1], got {self.center!r}")
        if not (self.width > 0 and math.isfinite(self.width)):
            raise ValueError(f"FrontierConfig.width must be positive, got {self.width!r}")


def frontier_score(p, frontier: FrontierConfig = FrontierConfig()):
    """``exp(-(p - c)^2 / (2 w^2))`` for projected pass rate(s) ``p``."""
    p = np.asarray(p, np.float64)
    out = np.exp(-((p - frontier.center) ** 2) / (2.0 * frontier.width ** 2))
    return out if out.ndim else float(out)


def frontier_band(frontier: FrontierConfig = FrontierConfig()) -> tuple[float, float]:
    """The learning frontier as a band of pass rates, ``center -+ 1.5 width`` clipped to [0, 1]
    (0.2 to 0.8 at the defaults), where the frontier score has fallen to exp(-1.125) = 0.32.

    CHOICE (the paper names reward bands, not their edges). Below the band a seed is
    *overmatched* (the policy rarely solves it), above it *saturated*. One definition serves the
    C.2 prompt's reward bands (:func:`envsched_jax.forge.prompts.reward_band`) and the reports of
    where exports land (:mod:`envsched_jax.forge.pipeline`, :mod:`envsched_jax.forge.simulated_policy`)."""
    return (max(frontier.center - 1.5 * frontier.width, 0.0), min(frontier.center + 1.5 * frontier.width, 1.0))


# Which artifacts each action must rewrite (True) -- the edit mask handed to materialisation.
_MASKS: dict[str, tuple[str, ...]] = {
    "increase_complexity/in_depth": ("instruction", "data", "solution", "tests"),
    "increase_complexity/in_breadth": ("instruction", "data", "solution", "tests", "environment", "helpers"),
    "reduce_complexity/in_depth": ("instruction", "solution", "tests", "environment"),
    "reduce_complexity/in_breadth": ("instruction", "data", "solution", "tests", "environment"),
    "diversify_frontier/in_depth": ("instruction", "data", "solution", "tests"),
    "diversify_frontier/in_breadth": ("instruction", "data", "solution", "tests", "helpers"),
}


def edit_mask(act: Action) -> dict[str, bool]:
    """Artifact -> must be edited, for ``act`` (module docstring)."""
    edited = _MASKS[act.name]
    return {artifact: artifact in edited for artifact in ARTIFACTS}


# Fixed synthesis recipes as restricted action masks of the same model (seeds/001 section 3).
# Few-shot stays structurally close (diversify, in depth); Self-Instruct writes a related task of
# the same domain (diversify, in breadth); Evol-Instruct makes tasks harder in depth or in
# breadth. Plain "evol_instruct" alternates the direction seed by seed starting in depth, as the
# paper's toolkit (DataArcTech/DataArc-SynData-Toolkit, sdgsystem/distillation/evol_instruct.py)
# alternates it batch by batch: the direction is fixed before any policy reward is seen.
Recipe = Literal["forge", "few_shot", "self_instruct", "evol_instruct", "evol_instruct_depth",
                 "evol_instruct_breadth"]
RECIPES: tuple[str, ...] = ("forge", "few_shot", "self_instruct", "evol_instruct", "evol_instruct_depth",
                            "evol_instruct_breadth")


def recipe_mask(recipe: str, num_seeds: int) -> np.ndarray:
    """[num_seeds, 6] bool: the actions ``recipe`` allows for each seed (in :data:`ACTIONS` order)."""
    mask = np.zeros((num_seeds, len(ACTIONS)), bool)
    if recipe == "forge":
        mask[:] = True
    elif recipe == "few_shot":
        mask[:, ACTION_INDEX["diversify_frontier/in_depth"]] = True
    elif recipe == "self_instruct":
        mask[:, ACTION_INDEX["diversify_frontier/in_breadth"]] = True
    elif recipe == "evol_instruct_depth":
        mask[:, ACTION_INDEX["increase_complexity/in_depth"]] = True
    elif recipe == "evol_instruct_breadth":
        mask[:, ACTION_INDEX["increase_complexity/in_breadth"]] = True
    elif recipe == "evol_instruct":
        mask[0::2, ACTION_INDEX["increase_complexity/in_depth"]] = True
        mask[1::2, ACTION_INDEX["increase_complexity/in_breadth"]] = True
    else:
        raise ValueError(f"unknown recipe {recipe!r}; the recipes are {list(RECIPES)}")
    return mask
