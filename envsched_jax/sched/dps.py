"""DPS, Dynamics-Predictive Sampling (Mao et al., ICLR 2026), under the shared scheduler API.

Written from the paper and from reading the authors' sampler and trainer (``maoyixiu/DPS``,
recipe/dps: ``task_sampler.py``, ``our_ray_trainer.py`` and the recipe scripts); no code copied.
Checked against that code run unchanged on the same selections and outcomes (the per-prompt
updates agree to float32 rounding).

Model. Every task i has a hidden solving state z in {0 unsolved, 1 partially solved, 2 solved}
and its own 3 x 3 Dirichlet count matrix A_i with A_i[to, from]; P_i = A_i normalised per column
(column = from-state), so ``prior = P_i @ posterior`` predicts the next state.

Per step t:

- select(t): the step's candidate pool of C = min(k B, N) tasks (:mod:`envsched_jax.sched.candidates`:
  by default the authors' epoch-wise loader, disjoint pools within an epoch, the last partial pool
  dropped); every candidate becomes *tracked*. ``strategy``:

  - ``"topk"`` (the authors' default and every recipe): the B candidates with the largest
    predicted probability of "partially solved", ``belief_i[1]``;
  - ``"topk+entropy"``: the B largest ``belief_i[1] + w H(belief_i)``, H = -sum p log(p + 1e-10),
    w = ``entropy_weight`` (the authors' default 0.0, which is ``"topk"``);
  - ``"uniform"``: B candidates uniformly at random.

- observe(t): a selected task's group reveals its state exactly, ``post_now = onehot(z)``, with z
  from the group's score y (``metric="acc"``: the fraction of rollouts with reward >=
  ``success_threshold``; ``"score"``: the mean raw reward): z = 0 iff y = 0, 2 iff y = 1, else 1.
  For any other tracked task ``post_now = belief`` (its prior: the belief is propagated one step
  and spreads out). Soft transition count, selected tasks only, with P from before this update::

      xi = normalise(outer(post_now, post_prev) * P)      # sums to 1 over the 3 x 3 entries

  Counts, every tracked task (decay toward the prior A0, plus xi for the selected ones)::

      A <- lam A + (1 - lam) A0 + [selected] xi

  Then ``belief <- P(A) @ post_now`` (the next step's prior) and ``post_prev <- post_now``. Tasks
  that have never been candidates are not touched, as in the authors' code (which creates a
  task's state the first time it is offered). With ``no_update`` nothing changes at all.

Priors. ``prior`` is A0: a positive number c (every entry c; the recipes: 1.0) or one of the
authors' presets, written [to, from] (rows: next state, columns: current state):
``"progress"`` [[1, .5, .5], [1, 1, .5], [1, 1, 1]] (backward moves down-weighted),
``"stability"`` (1 on the diagonal, 0.5 elsewhere) and ``"local"`` [[1, 1, 0], [1, 1, 1],
[0, 1, 1]] (no jump between unsolved and solved). ``initial_belief`` is ``"uniform"`` (the
default) or one-hot on ``"unsolved"``, ``"partial"`` or ``"solved"`` (the authors' '1', '2', '3').

Recipes (:data:`DPS_RECIPES`, ``DPS(graph, recipe="math")`` or :meth:`DPSConfig.for_recipe`):
countdown and geo3k k = 8, lam = 0.5; MATH k = 32, lam = 0.7; all with A0 = ones, uniform initial
belief, top-k, n = 8 rollouts. B and K stay the caller's (the authors' B is 256 or 512).

What differs from the authors' code, and why (also in docs/guides/scheduling.md):

- success threshold: reward >= 1 - 1e-6 (authors: >= 1), so a reward of 1 lost to float rounding
  still counts (:mod:`envsched_jax.sched.outcomes`);
- ties: a stable top-k over the randomly ordered pool, so tied tasks are chosen uniformly at random;
  the authors' ``np.argsort`` (not stable) resolves ties in an order fixed by the sorting algorithm
  over the shuffled pool, also "some order within the shuffled pool" but not exactly uniform;
- an observation the transition model deems impossible (the ``"local"`` prior's unsolved -> solved
  jump from a one-hot previous state, where every entry of outer(post_now, post_prev) * P is 0)
  adds no soft count here; in the authors' code it divides 0 by 0, that task's counts become NaN
  and it is never selected again;
- the random streams are JAX's: the pools, the ``"uniform"`` strategy and everything else of step t
  come from the scheduler's key and t (a restored run continues identically), not from a torch
  generator seeded with 1 and numpy's global generator;
- ``prior`` accepts an integer (the authors' check accepts only a Python float).

State (:class:`DPSState`, also the checkpoint): ``alpha`` [N, 3, 3], ``belief`` [N, 3],
``prev_posterior`` [N, 3], ``count`` [N] observations per task, ``tracked`` [N] offered at least
once, ``key`` the PRNG key. ``predicted_variance`` in the metrics is None (DPS predicts states,
not variances).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler
from envsched_jax.sched.candidates import CandidateMode, PoolCache, candidate_pool, check_mode
from envsched_jax.sched.outcomes import PARTIAL, SOLVED, SUCCESS_THRESHOLD, UNSOLVED, success_rate
from envsched_jax.sched.pytree_state import load_state_arrays, state_arrays

NUM_STATES = 3

PRIOR_PRESETS: dict[str, tuple[tuple[float, ...], ...]] = {
    # A0[to, from]; the authors' hmm_prior_alpha presets.
    "progress": ((1.0, 0.5, 0.5), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0)),
    "stability": ((1.0, 0.5, 0.5), (0.5, 1.0, 0.5), (0.5, 0.5, 1.0)),
    "local": ((1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (0.0, 1.0, 1.0)),
}
INITIAL_BELIEFS = ("uniform", "unsolved", "partial", "solved")
STRATEGIES = ("topk", "topk+entropy", "uniform")
METRICS = ("acc", "score")

DPS_RECIPES: dict[str, dict[str, object]] = {
    # The authors' recipe scripts (recipe/dps/scripts/<task>/*_dps.sh); n = 8 rollouts in all.
    "countdown": {"candidate_ratio": 8, "lam": 0.5},
    "geo3k": {"candidate_ratio": 8, "lam": 0.5},
    "math": {"candidate_ratio": 32, "lam": 0.7},
}


@dataclasses.dataclass(frozen=True)
class DPSConfig:
    """DPS settings; defaults are the authors' countdown / geo3k recipe (see :data:`DPS_RECIPES`)."""

    batch_size: int = 64
    """B: tasks per step."""
    group_size: int = 8
    """K (the recipe's n): rollouts per task."""
    candidate_ratio: int = 8
    """k: a pool of min(k B, N) candidates is scored (32 on MATH, 8 elsewhere)."""
    lam: float = 0.5
    """Decay of the transition counts toward A0 (0.7 on MATH, 0.5 elsewhere)."""
    prior: float | Literal["progress", "stability", "local"] = 1.0
    """A0: every entry this number (the recipes: 1.0), or one of the authors' presets."""
    initial_belief: Literal["uniform", "unsolved", "partial", "solved"] = "uniform"
    """Every task's belief (and previous posterior) before it is observed."""
    strategy: Literal["topk", "topk+entropy", "uniform"] = "topk"
    """How B tasks are kept from the pool (module docstring)."""
    entropy_weight: float = 0.0
    """w of ``"topk+entropy"`` (the authors' default 0.0)."""
    no_update: bool = False
    """Observations change nothing (the authors' ``hmm_no_update``)."""
    metric: Literal["acc", "score"] = "acc"
    """The group's score y: binary accuracy (``"acc"``, the authors' default) or the mean reward."""
    candidate_pool: CandidateMode = "epoch"
    """``"epoch"``: the authors' loader; ``"per_step"``: a fresh random subset each step."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this (``metric="acc"``)."""

    def __post_init__(self):
        for name in ("batch_size", "group_size", "candidate_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"DPSConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"DPSConfig.lam must lie in [0, 1], got {self.lam!r}")
        if isinstance(self.prior, str):
            if self.prior not in PRIOR_PRESETS:
                raise ValueError(f"DPSConfig.prior must be a positive number or one of "
                                 f"{tuple(PRIOR_PRESETS)}, got {self.prior!r}")
        elif isinstance(self.prior, bool) or not isinstance(self.prior, (int, float)) \
                or not np.isfinite(self.prior) or self.prior <= 0:
            raise ValueError(f"DPSConfig.prior must be a positive number or one of "
                             f"{tuple(PRIOR_PRESETS)}, got {self.prior!r}")
        for name, allowed in (("initial_belief", INITIAL_BELIEFS), ("strategy", STRATEGIES),
                              ("metric", METRICS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DPSConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not np.isfinite(self.entropy_weight):
            raise ValueError(f"DPSConfig.entropy_weight must be finite, got {self.entropy_weight!r}")
        check_mode(self.candidate_pool)
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"DPSConfig.success_threshold must lie in (0, 1], got {self.success_threshold!r}")

    @classmethod
    def for_recipe(cls, recipe: str, **overrides) -> DPSConfig:
        """The authors' settings for ``recipe`` (``countdown``, ``geo3k``, ``math``), then
        ``overrides`` (B and K are always the caller's: ``batch_size=..., group_size=...``)."""
        if recipe not in DPS_RECIPES:
            raise ValueError(f"unknown DPS recipe {recipe!r}; known: {', '.join(DPS_RECIPES)}")
        return cls(**{**DPS_RECIPES[recipe], **overrides})

    def prior_matrix(self) -> np.ndarray:
        """A0 as a [3, 3] float32 array, [to, from]."""
        if isinstance(self.prior, str):
            return np.asarray(PRIOR_PRESETS[self.prior], np.float32)
        return np.full((NUM_STATES, NUM_STATES), self.prior, np.float32)

    def initial_belief_vector(self) -> np.ndarray:
        if self.initial_belief == "uniform":
            return np.full(NUM_STATES, 1.0 / NUM_STATES, np.float32)
        return np.eye(NUM_STATES, dtype=np.float32)[INITIAL_BELIEFS.index(self.initial_belief) - 1]


@struct.dataclass
class DPSState:
    alpha: jax.Array            # [N, 3, 3] float32, Dirichlet counts A[i, to, from]
    belief: jax.Array           # [N, 3] float32, prior of the next step's state
    prev_posterior: jax.Array   # [N, 3] float32, posterior of the last step (the next "from")
    count: jax.Array            # [N] int32, observations per task
    tracked: jax.Array          # [N] bool, offered as a candidate at least once
    key: jax.Array              # [2] uint32


def init_state(num_nodes: int, config: DPSConfig, key: jax.Array) -> DPSState:
    pi0 = jnp.broadcast_to(jnp.asarray(config.initial_belief_vector()), (num_nodes, NUM_STATES))
    a0 = jnp.broadcast_to(jnp.asarray(config.prior_matrix()), (num_nodes, NUM_STATES, NUM_STATES))
    return DPSState(alpha=jnp.array(a0), belief=jnp.array(pi0), prev_posterior=jnp.array(pi0),
                    count=jnp.zeros(num_nodes, jnp.int32), tracked=jnp.zeros(num_nodes, bool),
                    key=jnp.asarray(key, jnp.uint32))


def transition_matrix(alpha: jax.Array) -> jax.Array:
    """P = A normalised per column: [..., 3, 3], ``P[..., to, from]``."""
    return alpha / jnp.sum(alpha, axis=-2, keepdims=True)


def top_candidates(scores: jax.Array, candidates: jax.Array, batch_size: int) -> jax.Array:
    """The ``batch_size`` candidates with the largest score; ties keep the candidates' order."""
    _, pos = jax.lax.top_k(scores[candidates], batch_size)
    return candidates[pos]


def belief_entropy(belief: jax.Array) -> jax.Array:
    """H = -sum p log(p + 1e-10) per row (the authors' form)."""
    return -jnp.sum(belief * jnp.log(belief + 1e-10), axis=-1)


STRATEGY_STREAM = 0x53545241
"""``fold_in`` tag of the ``"uniform"`` strategy's draws (separate from the pools')."""


@functools.partial(jax.jit, static_argnames=("batch_size", "num_candidates", "strategy", "mode"))
def select(state: DPSState, step, *, batch_size: int, num_candidates: int, strategy: str = "topk",
           entropy_weight=0.0, mode: str = "epoch", candidates: jax.Array | None = None) -> jax.Array:
    """B tasks of the step's candidate pool by ``strategy`` (module docstring). [B].

    ``candidates``: the step's pool when the caller has drawn it already (it must equal
    ``candidate_pool(state.key, step, ...)``; the scheduler object passes its
    :class:`~envsched_jax.sched.candidates.PoolCache`'s); None draws it here."""
    if candidates is None:
        candidates = candidate_pool(state.key, step, num_nodes=state.belief.shape[0],
                                    num_candidates=num_candidates, mode=mode)
    if strategy == "uniform":
        key = jax.random.fold_in(jax.random.fold_in(state.key, STRATEGY_STREAM), step)
        return jax.random.permutation(key, candidates)[:batch_size]
    scores = state.belief[:, PARTIAL]
    if strategy == "topk+entropy":
        scores = scores + entropy_weight * belief_entropy(state.belief)
    return top_candidates(scores, candidates, batch_size)


def group_states(rewards: jax.Array, metric: str, success_threshold: float) -> jax.Array:
    """Solving state per group from its score y: 0 iff y = 0, 2 iff y = 1, else 1. [n] int32."""
    y = success_rate(rewards, success_threshold) if metric == "acc" else jnp.mean(rewards, axis=-1)
    return jnp.where(y == 0.0, UNSOLVED, jnp.where(y == 1.0, SOLVED, PARTIAL)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("config", "num_candidates"))
def observe(state: DPSState, nodes: jax.Array, rewards: jax.Array, step=0, *, config: DPSConfig,
            num_candidates: int | None = None, candidates: jax.Array | None = None) -> DPSState:
    """One DPS update, given the groups ``rewards`` [B, K] of the tasks ``nodes`` [B] selected at
    ``step`` from a pool of ``num_candidates`` (None: every task is tracked); ``candidates`` as
    in :func:`select`."""
    if config.no_update:
        return state
    n = state.alpha.shape[0]
    if num_candidates is None:
        tracked = jnp.ones(n, bool)
    else:
        if candidates is None:
            candidates = candidate_pool(state.key, step, num_nodes=n, num_candidates=num_candidates,
                                        mode=config.candidate_pool)
        tracked = state.tracked.at[candidates].set(True).at[nodes].set(True)
    z = group_states(rewards, config.metric, config.success_threshold)
    selected = jnp.zeros(n, bool).at[nodes].set(True)
    post_now = state.belief.at[nodes].set(jax.nn.one_hot(z, NUM_STATES, dtype=state.belief.dtype))
    p = transition_matrix(state.alpha)
    joint = post_now[:, :, None] * state.prev_posterior[:, None, :] * p
    total = jnp.sum(joint, axis=(1, 2), keepdims=True)
    # An observation the model deems impossible (total 0) adds no count (the authors' code: NaN).
    xi = jnp.where(total > 0, joint / jnp.where(total > 0, total, 1.0), 0.0)
    a0 = jnp.asarray(config.prior_matrix())
    alpha = (config.lam * state.alpha + (1.0 - config.lam) * a0
             + jnp.where(selected[:, None, None], xi, 0.0))
    belief = jnp.einsum("ntf,nf->nt", transition_matrix(alpha), post_now)
    keep = tracked[:, None]
    return state.replace(alpha=jnp.where(keep[:, :, None], alpha, state.alpha),
                         belief=jnp.where(keep, belief, state.belief),
                         prev_posterior=jnp.where(keep, post_now, state.prev_posterior),
                         count=state.count + selected.astype(jnp.int32), tracked=tracked)


@register_scheduler("dps")
class DPS(Scheduler):
    """DPS under the shared API (see the module docstring for the update as implemented).

    Args:
        graph: the pool's graph (DPS reads only the task ids).
        config: :class:`DPSConfig`; keyword ``overrides`` replace single fields,
            e.g. ``DPS(graph, batch_size=16)``.
        recipe: start from the authors' settings for this recipe (:data:`DPS_RECIPES`) instead of
            the defaults; ``config`` and ``recipe`` are exclusive.
        seed: seeds the candidate pools.
        tools_per_env: tool names per environment, for the metrics.
    """

    name = "dps"

    def __init__(self, graph: PoolGraph, config: DPSConfig | None = None, *, recipe: str | None = None,
                 seed: int = 0, tools_per_env: Sequence[Sequence[str]] | None = None, **overrides):
        if recipe is not None:
            if config is not None:
                raise ValueError("DPS: give either config or recipe, not both")
            config = DPSConfig.for_recipe(recipe, **overrides)
        else:
            config = dataclasses.replace(config or DPSConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        self.config = config
        self.num_candidates = min(config.candidate_ratio * config.batch_size, self.num_nodes)
        self.state = init_state(self.num_nodes, config, jax.random.PRNGKey(seed))
        self._pools = PoolCache(self.num_nodes, self.num_candidates, config.candidate_pool)

    def _select(self, step):
        nodes = select(self.state, step, batch_size=self.batch_size, num_candidates=self.num_candidates,
                       strategy=self.config.strategy, entropy_weight=self.config.entropy_weight,
                       mode=self.config.candidate_pool, candidates=self._pools(self.state.key, step))
        return np.asarray(nodes), ["dps"] * self.batch_size, None, {}

    def _observe(self, step, nodes, rewards):
        self.state = observe(self.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(rewards, jnp.float32),
                             step, config=self.config, num_candidates=self.num_candidates,
                             candidates=self._pools(self.state.key, step))

    def _state_arrays(self):
        return state_arrays(self.state)

    def _load_state_arrays(self, arrays):
        self.state = load_state_arrays(self.state, arrays)
