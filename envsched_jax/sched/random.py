"""Uniform random scheduling: B distinct tasks per step, the paper's baseline."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler


@functools.partial(jax.jit, static_argnames=("num_nodes", "batch_size"))
def random_batch(key: jax.Array, step: jax.Array, *, num_nodes: int, batch_size: int) -> jax.Array:
    """B distinct node indices drawn uniformly for ``step``: ``choice`` without replacement under
    ``fold_in(key, step)``. One compiled program per (N, B); the step is traced, so every step
    reuses it (the batches are those the eager calls gave)."""
    return jax.random.choice(jax.random.fold_in(key, step), num_nodes, (batch_size,), replace=False)


@register_scheduler("random")
class RandomScheduler(Scheduler):
    """Draws B distinct tasks uniformly at random each step. The batch of step t depends only on
    the seed and t (``fold_in(key, t)``), so a restored run continues identically."""

    name = "random"

    def __init__(self, graph: PoolGraph, *, batch_size: int = 64, group_size: int = 8, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None):
        super().__init__(graph, batch_size, group_size, tools_per_env)
        self._key = np.asarray(jax.random.PRNGKey(seed))
        self._device_key = jnp.asarray(self._key)   # kept on the device: no transfer per step

    def _select(self, step):
        nodes = np.asarray(random_batch(self._device_key, np.uint32(step), num_nodes=self.num_nodes,
                                        batch_size=self.batch_size))
        return nodes, ["random"] * self.batch_size, None, {}

    def _observe(self, step, nodes, rewards):
        """Random keeps no statistics."""

    def _state_arrays(self):
        return {"key": self._key.copy()}

    def _load_state_arrays(self, arrays):
        self._key = arrays["key"]
        self._device_key = jnp.asarray(self._key)
