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


@functools.partial(jax.jit, static_argnames=("static", "num_envs", "lazy", "tuning"))
def _select(state, hyper, s_full, env, *, static, num_envs, lazy, tuning=()):
    config = KernelConfig(static, hyper)
    scores = K.score_pass(state, config)
    progress = K.progress_filter(state, env, num_envs, config)
    if lazy:
        return select_batch_lazy(state, scores.q, progress.excluded, DenseSimilarity(s_full), env, config,
                                 **dict(tuning))
    return K.select_batch(state, scores.q, progress.excluded, s_full, env, config)


# Settings of the lazy selection (speed only): a shortlist of 2 or 5 forces the fallback to rounds
# over all N; a candidate list of 3 forces rounds over all N after the first; one bisection step
# gives poor thresholds; 3 or 7 pairs per call straddle the picks a candidate lacks; one
# candidate per round is the plain lazy greedy.
TUNINGS = (
    dict(refresh=1, shortlist=4096, pairs_per_call=1, global_refresh=1),
    dict(refresh=3, shortlist=5, pairs_per_call=3, global_refresh=2, candidates=3, bisect=1),
    dict(refresh=8, shortlist=2, pairs_per_call=64),
    dict(refresh=64, shortlist=64, pairs_per_call=7, global_refresh=5, candidates=16),
)


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
            for tuning in TUNINGS:
                got = _select(*args, lazy=True, tuning=tuple(tuning.items()), **kw)
                for name, a, b in zip(K.Selection._fields, want, got):
                    np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=f"step {t} {name} {tuning}")
                compared += 1
        sched.observe(t, nodes, reward_groups(rng, len(nodes), 4))
    assert compared == 19 * len(TUNINGS)


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


@pytest.mark.parametrize("seed", range(6))
def test_first_true_is_nonzero(seed):
    """first_true (two-level compaction) equals jnp.nonzero(size=..., fill_value=N): all-False,
    all-True, sparse and dense masks, sizes below and above the number of Trues, N not a multiple
    of the block."""
    from envsched_jax.sched.dense_free import first_true

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 1200))
    for density in (0.0, 0.003, 0.2, 1.0):
        mask = rng.random(n) < density
        for size in (1, 7, 64, n + 3):
            for block in (16, 256):
                got = np.asarray(jax.jit(first_true, static_argnums=(1, 2))(jnp.asarray(mask), size, block))
                want = np.asarray(jnp.nonzero(jnp.asarray(mask), size=size, fill_value=n)[0])
                np.testing.assert_array_equal(got, want, err_msg=f"n={n} density={density} size={size}")


@pytest.mark.parametrize("seed", range(6))
def test_shortlist_holds_everything_above_its_threshold(seed):
    """_shortlist: at most ``size`` nodes, ascending, padded with N; every node left out has a value
    at most ``thr``, every listed node at least it, and ``thr`` is the largest value left out
    (ties at the top larger than the list and -inf entries included)."""
    from envsched_jax.sched.dense_free import _shortlist

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 600))
    g = np.round(rng.random(n), int(rng.integers(1, 4))).astype(np.float32)
    g[rng.random(n) < 0.3] = -np.inf
    if seed == 0:
        g[:] = 0.5                       # one tie larger than every list
    for size in (1, 4, 50, n):
        for bisect in (1, 12):
            short, thr = jax.jit(_shortlist, static_argnums=(1, 2))(jnp.asarray(g), size, bisect)
            short, thr = np.asarray(short), float(thr)
            real = short[short < n]
            assert np.all(np.diff(real) > 0) and np.all(short[len(real):] == n)
            out = np.setdiff1d(np.arange(n), real)
            left = g[out][g[out] > -np.inf]
            assert thr == (left.max() if left.size else -np.inf)
            assert np.all(g[real] >= thr)


def test_pairs_equal_block_entries():
    """pairs_prepared (the penalty rounds' entries) equals block(): DenseSimilarity and the
    feature-row source, -1 pads included, ordered and general summation paths."""
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.graph.feature_rows import column_data, graph_similarity, pairs_from_maps, query_maps
    from envsched_jax.pool.generator import generate_pool_of_size

    graph = build_graph(generate_pool_of_size(300, seed=3), GraphConfig(dense="always"))
    n = graph.num_nodes
    rng = np.random.default_rng(5)
    q = np.concatenate([rng.choice(n, 5, replace=False), [-1]]).astype(np.int32)
    which = rng.integers(0, len(q), 40).astype(np.int32)
    c = rng.integers(-1, n, 40).astype(np.int32)
    c[:3] = q[which[:3]]                                                 # diagonal entries
    want = np.where((q[which] >= 0) & (c >= 0), graph.s_full[np.maximum(q[which], 0), np.maximum(c, 0)], 0.0)
    dense = DenseSimilarity(jnp.asarray(graph.s_full))
    np.testing.assert_array_equal(np.asarray(dense.pairs_prepared(jnp.asarray(q), jnp.asarray(which),
                                                                  jnp.asarray(c), None)), want)
    src = graph_similarity(graph)
    assert src.full.ordered       # scikit-learn's TF-IDF rows; False forces the general path
    for ordered in (True, False):
        csr = dataclasses.replace(src.full, ordered=ordered)
        maps = query_maps(csr, jnp.asarray(q))
        got = jax.jit(pairs_from_maps)(csr, maps, jnp.asarray(which), jnp.asarray(c),
                                       column_data(csr, jnp.asarray(c)))
        np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32), err_msg=f"ordered={ordered}")
