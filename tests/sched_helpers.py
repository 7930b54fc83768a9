"""Small graphs and reward streams for scheduler tests."""

from __future__ import annotations

import numpy as np

from envsched_jax.graph.build import GraphConfig, PoolGraph


def graph_from_matrices(s_full: np.ndarray, s_abs: np.ndarray, env_index: np.ndarray) -> PoolGraph:
    """A PoolGraph holding just what schedulers read (ids, environments, dense matrices)."""
    n = len(env_index)
    empty_i = np.full((n, 1), -1, np.int32)
    empty_f = np.zeros((n, 1), np.float32)
    num_envs = int(env_index.max()) + 1
    return PoolGraph(task_ids=tuple(f"t{i}" for i in range(n)), env_ids=tuple(f"e{e}" for e in range(num_envs)),
                     env_index=np.asarray(env_index, np.int32), within_idx=empty_i, within_sim=empty_f,
                     cross_idx=empty_i, cross_sim=empty_f, s_full=s_full, s_abs=s_abs, features={},
                     config=GraphConfig(), pool_name="synthetic-matrices", pool_hash="none")


def random_graph(rng: np.random.Generator, num_envs: int, per_env: int, dtype=np.float64) -> PoolGraph:
    """Symmetric similarities in [0, 1] with unit diagonal, rounded to 6 decimals like built graphs;
    within-environment pairs are more similar than cross-environment ones."""
    env_index = np.repeat(np.arange(num_envs), per_env)
    n = len(env_index)

    def sym(scale):
        a = rng.random((n, n)) * scale
        a = np.round((a + a.T) / 2, 6)
        np.fill_diagonal(a, 1.0)
        return a.astype(dtype)

    s_full = sym(0.6)
    same = env_index[:, None] == env_index[None, :]
    s_full = np.where(same & ~np.eye(n, dtype=bool), np.minimum(s_full + 0.3, 1.0), s_full).astype(dtype)
    return graph_from_matrices(s_full, sym(1.0), env_index)


def reward_groups(rng: np.random.Generator, batch: int, k: int) -> np.ndarray:
    """A mix of binary, partial-credit and identical-reward groups in [0, 1]."""
    kind = rng.integers(0, 3, size=batch)
    p = rng.random(batch)
    binary = (rng.random((batch, k)) < p[:, None]).astype(float)
    partial = np.round(rng.random((batch, k)) * p[:, None], 2)
    same = np.repeat(np.round(p, 1)[:, None], k, axis=1)
    return np.where(kind[:, None] == 0, binary, np.where(kind[:, None] == 1, partial, same))
