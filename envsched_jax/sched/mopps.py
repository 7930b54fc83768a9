"""MoPPS, Model Predictive Prompt Selection (Qu et al., arXiv 2507.04632), under the shared API.

Written from the paper's public recipe (no code copied).

Every task i holds a Beta(alpha_i, beta_i) posterior over its success rate, prior (1, 1).

- select(t): draw a uniformly random candidate pool of min(k B, N) distinct tasks, Thompson-sample
  ``r_i ~ Beta(alpha_i, beta_i)`` for each, keep the B with the smallest ``(r_i - 0.5)^2``
  (ties keep the random candidate order).
- observe(t), selected tasks only (the others are left exactly as they were)::

      alpha <- lam alpha + (1 - lam) 1 + n s
      beta  <- lam beta  + (1 - lam) 1 + n (1 - s)

  with n = K rollouts and s the group's binary accuracy (:mod:`envsched_jax.sched.outcomes`:
  a rollout is correct iff its reward >= 1 - 1e-6; partial credit counts as failure), so n s is
  the number of fully successful rollouts.

CHOICES where the summary is silent: the candidate pool and the Thompson samples of step t come
from ``fold_in(key, t)`` (a restored run continues identically); ``predicted_variance`` in the
metrics is the Bernoulli variance of the posterior mean, m (1 - m) with m = alpha / (alpha + beta).

Defaults (non-MATH tasks): lam = 0.5, k = 8. The threshold variant (keep r in [0.3, 0.7]) is not
implemented.

State (:class:`MoPPSState`, also the checkpoint): ``alpha`` [N], ``beta`` [N], ``key``.
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
from envsched_jax.sched.dps import random_candidates
from envsched_jax.sched.outcomes import SUCCESS_THRESHOLD, success_rate
from envsched_jax.sched.pytree_state import load_state_arrays, state_arrays


@dataclasses.dataclass(frozen=True)
class MoPPSConfig:
    """MoPPS settings; defaults are the recipe's for non-MATH tasks."""

    batch_size: int = 64
    """B: tasks per step."""
    group_size: int = 8
    """K (the recipe's n): rollouts per task."""
    candidate_ratio: int = 8
    """k: a random pool of k B candidates is scored (16 on MATH, 8 elsewhere)."""
    lam: float = 0.5
    """Decay of a selected task's posterior toward the prior (1.0 on MATH, 0.5 elsewhere)."""
    target: float = 0.5
    """Success rate the Thompson samples are ranked toward."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this."""

    def __post_init__(self):
        for name in ("batch_size", "group_size", "candidate_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if not 0.0 <= self.target <= 1.0:
            raise ValueError(f"target must lie in [0, 1], got {self.target}")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"success_threshold must lie in (0, 1], got {self.success_threshold}")


@struct.dataclass
class MoPPSState:
    alpha: jax.Array   # [N] float32, Beta successes (+ prior)
    beta: jax.Array    # [N] float32, Beta failures (+ prior)
    key: jax.Array     # [2] uint32


def init_state(num_nodes: int, key: jax.Array) -> MoPPSState:
    ones = jnp.ones(num_nodes, jnp.float32)
    return MoPPSState(alpha=ones, beta=ones, key=jnp.asarray(key, jnp.uint32))


@functools.partial(jax.jit, static_argnames=("batch_size", "num_candidates", "target"))
def select(state: MoPPSState, step, *, batch_size: int, num_candidates: int, target: float) -> jax.Array:
    """The B candidates whose Thompson sample lies closest to ``target``. [B]."""
    key_pool, key_sample = jax.random.split(jax.random.fold_in(state.key, step))
    candidates = random_candidates(key_pool, state.alpha.shape[0], num_candidates)
    r = jax.random.beta(key_sample, state.alpha[candidates], state.beta[candidates])
    _, pos = jax.lax.top_k(-(r - target) ** 2, batch_size)
    return candidates[pos]


@functools.partial(jax.jit, static_argnames=("config",))
def observe(state: MoPPSState, nodes: jax.Array, rewards: jax.Array, *, config: MoPPSConfig) -> MoPPSState:
    """Posterior update of the selected tasks ``nodes`` [B] from their groups ``rewards`` [B, K]."""
    hits = rewards.shape[-1] * success_rate(rewards, config.success_threshold)
    misses = rewards.shape[-1] - hits
    lam = config.lam
    alpha = state.alpha.at[nodes].set(lam * state.alpha[nodes] + (1.0 - lam) + hits)
    beta = state.beta.at[nodes].set(lam * state.beta[nodes] + (1.0 - lam) + misses)
    return state.replace(alpha=alpha, beta=beta)


@register_scheduler("mopps")
class MoPPS(Scheduler):
    """MoPPS under the shared API (see the module docstring).

    Args:
        graph: the pool's graph (MoPPS reads only the task ids).
        config: :class:`MoPPSConfig`; keyword ``overrides`` replace single fields.
        seed: seeds the candidate pools and Thompson samples.
        tools_per_env: tool names per environment, for the metrics.
    """

    name = "mopps"

    def __init__(self, graph: PoolGraph, config: MoPPSConfig | None = None, *, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None, **overrides):
        config = dataclasses.replace(config or MoPPSConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        self.config = config
        self.num_candidates = min(config.candidate_ratio * config.batch_size, self.num_nodes)
        self.state = init_state(self.num_nodes, jax.random.PRNGKey(seed))

    def _select(self, step):
        nodes = np.asarray(select(self.state, step, batch_size=self.batch_size,
                                  num_candidates=self.num_candidates, target=self.config.target))
        a, b = np.asarray(self.state.alpha)[nodes], np.asarray(self.state.beta)[nodes]
        mean = a / (a + b)
        return nodes, ["mopps"] * self.batch_size, (mean * (1 - mean)).astype(float).tolist(), {}

    def _observe(self, step, nodes, rewards):
        self.state = observe(self.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(rewards, jnp.float32),
                             config=self.config)

    def _state_arrays(self):
        return state_arrays(self.state)

    def _load_state_arrays(self, arrays):
        self.state = load_state_arrays(self.state, arrays)
