"""DPS, Dynamics-Predictive Sampling (Mao et al., ICLR 2026), under the shared scheduler API.

Written from the paper's public recipe (no code copied).

Model. Every task i has a hidden solving state z in {0 unsolved, 1 partially solved, 2 solved}
and its own 3 x 3 Dirichlet count matrix A_i with A_i[to, from]; P_i = A_i normalised per column
(column = from-state), so ``prior = P_i @ posterior`` predicts the next state.

Per step t, for every task (all N tasks are tracked):

- select(t): draw a uniformly random candidate pool of min(k B, N) distinct tasks; keep the B with
  the largest predicted probability of "partially solved", ``belief_i[1]``. Ties (e.g. among tasks
  never seen) fall back to the random candidate order.
- observe(t): a selected task's group reveals its state exactly, ``post_now = onehot(z)``, with z
  from the group's binary accuracy (see :mod:`envsched_jax.sched.outcomes`: a rollout is correct
  iff its reward >= 1 - 1e-6; s = 0 unsolved, s = 1 solved, else partially solved). For any other
  task ``post_now = belief`` (the prior: its belief is propagated one step and spreads out).

  Soft transition count, selected tasks only, with P from before this update::

      xi = normalise(outer(post_now, post_prev) * P)      # sums to 1 over the 3 x 3 entries

  Counts, every task (decay toward the prior A0 for all, plus xi for the selected ones)::

      A <- lam A + (1 - lam) A0 + [selected] xi

  Then ``belief <- P(A) @ post_now`` (the next step's prior) and ``post_prev <- post_now``.

CHOICES where the summary is silent: the first observation of a task also adds a soft count, from
its propagated belief (uniform before anything is known) as post_prev; the candidate pool is drawn
anew each step from ``fold_in(key, t)``, so the batch of step t depends only on the seed, t and the
state (a restored run continues identically); ``predicted_variance`` in the metrics is None (DPS
predicts states, not variances).

Defaults (non-MATH tasks): k = 8, lam = 0.5, A0 = all ones, uniform initial belief.

State (:class:`DPSState`, also the checkpoint): ``alpha`` [N, 3, 3], ``belief`` [N, 3],
``prev_posterior`` [N, 3], ``count`` [N] observations per task, ``key`` the PRNG key.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler
from envsched_jax.sched.outcomes import PARTIAL, SUCCESS_THRESHOLD, solving_state
from envsched_jax.sched.pytree_state import load_state_arrays, state_arrays

NUM_STATES = 3


@dataclasses.dataclass(frozen=True)
class DPSConfig:
    """DPS settings; defaults are the recipe's for non-MATH tasks."""

    batch_size: int = 64
    """B: tasks per step."""
    group_size: int = 8
    """K (the recipe's n): rollouts per task."""
    candidate_ratio: int = 8
    """k: a random pool of k B candidates is scored (32 on MATH, 8 elsewhere)."""
    lam: float = 0.5
    """Decay of the transition counts toward A0 (0.7 on MATH, 0.5 elsewhere)."""
    prior_count: float = 1.0
    """Every entry of A0 (all ones in the recipe)."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this."""

    def __post_init__(self):
        for name in ("batch_size", "group_size", "candidate_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.prior_count <= 0:
            raise ValueError(f"prior_count must be > 0, got {self.prior_count}")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"success_threshold must lie in (0, 1], got {self.success_threshold}")


@struct.dataclass
class DPSState:
    alpha: jax.Array            # [N, 3, 3] float32, Dirichlet counts A[i, to, from]
    belief: jax.Array           # [N, 3] float32, prior of the next step's state
    prev_posterior: jax.Array   # [N, 3] float32, posterior of the last step (the next "from")
    count: jax.Array            # [N] int32, observations per task
    key: jax.Array              # [2] uint32


def init_state(num_nodes: int, config: DPSConfig, key: jax.Array) -> DPSState:
    uniform = jnp.full((num_nodes, NUM_STATES), 1.0 / NUM_STATES, jnp.float32)
    return DPSState(alpha=jnp.full((num_nodes, NUM_STATES, NUM_STATES), config.prior_count, jnp.float32),
                    belief=uniform, prev_posterior=uniform, count=jnp.zeros(num_nodes, jnp.int32),
                    key=jnp.asarray(key, jnp.uint32))


def transition_matrix(alpha: jax.Array) -> jax.Array:
    """P = A normalised per column: [..., 3, 3], ``P[..., to, from]``."""
    return alpha / jnp.sum(alpha, axis=-2, keepdims=True)


def random_candidates(key: jax.Array, num_nodes: int, num_candidates: int) -> jax.Array:
    """``num_candidates`` distinct task indices in uniformly random order."""
    return jax.random.permutation(key, num_nodes)[:num_candidates]


def top_candidates(scores: jax.Array, candidates: jax.Array, batch_size: int) -> jax.Array:
    """The ``batch_size`` candidates with the largest score; ties keep the candidates' order."""
    _, pos = jax.lax.top_k(scores[candidates], batch_size)
    return candidates[pos]


@functools.partial(jax.jit, static_argnames=("batch_size", "num_candidates"))
def select(state: DPSState, step, *, batch_size: int, num_candidates: int) -> jax.Array:
    """Top-B predicted probability of "partially solved" among a random candidate pool. [B]."""
    key = jax.random.fold_in(state.key, step)
    candidates = random_candidates(key, state.belief.shape[0], num_candidates)
    return top_candidates(state.belief[:, PARTIAL], candidates, batch_size)


@functools.partial(jax.jit, static_argnames=("config",))
def observe(state: DPSState, nodes: jax.Array, rewards: jax.Array, *, config: DPSConfig) -> DPSState:
    """One DPS update of every task, given the groups ``rewards`` [B, K] of the tasks ``nodes`` [B]."""
    n = state.alpha.shape[0]
    z = solving_state(rewards, config.success_threshold)
    selected = jnp.zeros(n, bool).at[nodes].set(True)
    post_now = state.belief.at[nodes].set(jax.nn.one_hot(z, NUM_STATES, dtype=state.belief.dtype))
    p = transition_matrix(state.alpha)
    joint = post_now[:, :, None] * state.prev_posterior[:, None, :] * p
    xi = joint / jnp.sum(joint, axis=(1, 2), keepdims=True)
    alpha = (config.lam * state.alpha + (1.0 - config.lam) * config.prior_count
             + jnp.where(selected[:, None, None], xi, 0.0))
    belief = jnp.einsum("ntf,nf->nt", transition_matrix(alpha), post_now)
    return state.replace(alpha=alpha, belief=belief, prev_posterior=post_now,
                         count=state.count + selected.astype(jnp.int32))


@register_scheduler("dps")
class DPS(Scheduler):
    """DPS under the shared API (see the module docstring for the update as implemented).

    Args:
        graph: the pool's graph (DPS reads only the task ids).
        config: :class:`DPSConfig`; keyword ``overrides`` replace single fields,
            e.g. ``DPS(graph, batch_size=16)``.
        seed: seeds the candidate pools.
        tools_per_env: tool names per environment, for the metrics.
    """

    name = "dps"

    def __init__(self, graph: PoolGraph, config: DPSConfig | None = None, *, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None, **overrides):
        config = dataclasses.replace(config or DPSConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        self.config = config
        self.num_candidates = min(config.candidate_ratio * config.batch_size, self.num_nodes)
        self.state = init_state(self.num_nodes, config, jax.random.PRNGKey(seed))

    def _select(self, step):
        nodes = select(self.state, step, batch_size=self.batch_size, num_candidates=self.num_candidates)
        return np.asarray(nodes), ["dps"] * self.batch_size, None, {}

    def _observe(self, step, nodes, rewards):
        self.state = observe(self.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(rewards, jnp.float32),
                             config=self.config)

    def _state_arrays(self):
        return state_arrays(self.state)

    def _load_state_arrays(self, arrays):
        self.state = load_state_arrays(self.state, arrays)
