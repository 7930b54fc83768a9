"""The dense-free EnvSched path (:mod:`envsched_jax.sched.dense_free`) makes the dense path's
decisions: the lazy greedy selection against ``kernels.select_batch`` on states of real runs (coarse
similarities, so that penalties tie often; refresh sizes from 1, which forces many refresh rounds),
and whole schedulers (cold start, selection, observation) step for step, state included."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envsched_jax.sched import EnvSched, EnvSchedConfig
from envsched_jax.sched import kernels as K
from envsched_jax.sched.config import KernelConfig
from envsched_jax.sched.dense_free import DenseSimilarity, select_batch_lazy

from sched_helpers import random_graph, reward_groups


@functools.partial(jax.jit, static_argnames=("static", "num_envs", "lazy", "refresh", "shortlist", "rows"))
def _select(state, hyper, s_full, env, *, static, num_envs, lazy, refresh=8, shortlist=4096, rows=1):
    config = KernelConfig(static, hyper)
    scores = K.score_pass(state, config)
    progress = K.progress_filter(state, env, num_envs, config)
    if lazy:
        return select_batch_lazy(state, scores.q, progress.excluded, DenseSimilarity(s_full), env, config,
                                 refresh=refresh, shortlist=shortlist, rows_per_call=rows)
    return K.select_batch(state, scores.q, progress.excluded, s_full, env, config)


def _tied_graph(rng):
    """A random graph whose S_full takes a few distinct values (many exactly equal penalties)."""
    g = random_graph(rng, num_envs=int(rng.integers(3, 12)), per_env=int(rng.integers(4, 20)), dtype=np.float32)
    levels = int(rng.integers(2, 10))
    s = np.round(g.s_full * levels) / levels
    np.fill_diagonal(s, 1.0)
    return dataclasses.replace(g, s_full=s.astype(np.float32))


def _config(rng):
    return EnvSchedConfig(batch_size=int(rng.integers(4, 16)), group_size=4, infeasible="relax",
                          lambda_sim=float(rng.choice([0.08, 0.5, 2.0])))


@pytest.mark.parametrize("trial", range(4))
def test_lazy_selection_is_the_dense_selection(trial):
    rng = np.random.default_rng(trial)
    graph, cfg = _tied_graph(rng), _config(rng)
    sched = EnvSched(graph, cfg)
    compared = 0
    for t in range(20):
        nodes = sched.select(t)
        if t:
            args = (sched.state, sched._hyper, sched._s_full, sched._env)
            kw = dict(static=cfg.static(), num_envs=sched._num_envs)
            want = _select(*args, lazy=False, **kw)
            # a shortlist of 2 or 5 forces the fallback to rounds over all N; 3 rows per call
            # reads picks in blocks that straddle the ones a candidate lacks
            for refresh, shortlist, rows in ((1, 4096, 1), (3, 5, 3), (8, 2, 1), (64, 64, 4)):
                got = _select(*args, lazy=True, refresh=refresh, shortlist=shortlist, rows=rows, **kw)
                for name, a, b in zip(K.Selection._fields, want, got):
                    np.testing.assert_array_equal(np.asarray(b), np.asarray(a),
                                                  err_msg=f"step {t} {name} {refresh} {shortlist} {rows}")
                compared += 1
        sched.observe(t, nodes, reward_groups(rng, len(nodes), 4))
    assert compared == 19 * 4


@pytest.mark.parametrize("trial", range(3))
def test_dense_free_scheduler_runs_as_the_dense_one(trial):
    rng = np.random.default_rng(100 + trial)
    graph, cfg = _tied_graph(rng), _config(rng)
    dense = EnvSched(graph, cfg)
    free = EnvSched(graph, cfg, similarity=DenseSimilarity(jnp.asarray(graph.s_full), jnp.asarray(graph.s_abs)),
                    refresh=3)
    assert dense.dense and not free.dense
    rewards = np.random.default_rng(7)
    for t in range(25):
        got, want = free.select(t), dense.select(t)
        assert got == want, f"step {t}"
        r = reward_groups(rewards, len(want), 4)
        dense.observe(t, want, r)
        free.observe(t, want, r)
    a, b = jax.device_get(dense.state), jax.device_get(free.state)
    for field in dataclasses.fields(a):
        np.testing.assert_array_equal(getattr(b, field.name), getattr(a, field.name), err_msg=field.name)


def test_similarity_argument_is_checked():
    graph = random_graph(np.random.default_rng(0), 3, 5, dtype=np.float32)
    cfg = EnvSchedConfig(batch_size=4, group_size=4)
    with pytest.raises(ValueError, match="similarity must be"):
        EnvSched(graph, cfg, similarity="sparse")
    with pytest.raises(ValueError, match="refresh must be >= 1"):
        EnvSched(graph, cfg, refresh=0)
    no_dense = dataclasses.replace(graph, s_full=None, s_abs=None)
    with pytest.raises(ValueError, match="needs the graph's dense S_full"):
        EnvSched(no_dense, cfg, similarity="dense")
