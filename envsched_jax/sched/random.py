"""Uniform random scheduling: B distinct tasks per step, the paper's baseline."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler


@register_scheduler("random")
class RandomScheduler(Scheduler):
    """Draws B distinct tasks uniformly at random each step. The batch of step t depends only on
    the seed and t (``fold_in(key, t)``), so a restored run continues identically."""

    name = "random"

    def __init__(self, graph: PoolGraph, *, batch_size: int = 64, group_size: int = 8, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None):
        super().__init__(graph, batch_size, group_size, tools_per_env)
        self._key = np.asarray(jax.random.PRNGKey(seed))

    def _select(self, step):
        key = jax.random.fold_in(jax.numpy.asarray(self._key), step)
        nodes = np.asarray(jax.random.choice(key, self.num_nodes, (self.batch_size,), replace=False))
        return nodes, ["random"] * self.batch_size, None, {}

    def _observe(self, step, nodes, rewards):
        """Random keeps no statistics."""

    def _state_arrays(self):
        return {"key": self._key.copy()}

    def _load_state_arrays(self, arrays):
        self._key = arrays["key"]
