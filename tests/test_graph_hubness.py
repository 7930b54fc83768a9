"""The CSLS hubness correction of S_abs (GraphConfig.hubness, off by default) against a plain
NumPy reference, on both build paths, and its effect on a constructed hub."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envsched_jax.graph.build import GraphConfig, build_graph, csls_correct, csls_radius
from envsched_jax.graph.quality import hubness
from envsched_jax.pool.embedded import load_embedded_pool


@pytest.fixture(scope="module")
def pool():
    return load_embedded_pool()


@pytest.fixture(scope="module")
def graphs(pool):
    base = GraphConfig(num_candidates=16)
    return (build_graph(pool, base),
            build_graph(pool, dataclasses.replace(base, hubness="csls", hubness_k=12)))


def _reference_radius(s_abs: np.ndarray, env: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest other-environment S_abs values of each node (plain loop)."""
    out = np.zeros(len(env))
    for i in range(len(env)):
        other = np.sort(s_abs[i, env != env[i]])[::-1][:k]
        out[i] = other.mean() if len(other) else 0.0
    return out


def _reference_top(s: np.ndarray, env: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-m other-environment columns of each row, (similarity desc, index asc)."""
    n = len(env)
    idx = np.full((n, m), -1)
    val = np.zeros((n, m), np.float32)
    for i in range(n):
        cols = np.flatnonzero(env != env[i])
        order = cols[np.lexsort((cols, -s[i, cols]))][:m]
        idx[i, :len(order)] = order
        val[i, :len(order)] = s[i, order]
    return idx, val


def test_off_by_default():
    assert GraphConfig().hubness == "none"


def test_corrected_s_abs_matches_the_numpy_reference(graphs):
    plain, corrected = graphs
    env = plain.env_index
    r = _reference_radius(plain.s_abs.astype(np.float64), env, 12)
    np.testing.assert_allclose(csls_radius(plain.cross_sim, plain.cross_idx, 12), r, atol=1e-6)
    ref = np.clip(plain.s_abs - (r[:, None] + r[None, :]) / 2 + r.mean(), 0.0, 1.0)
    np.fill_diagonal(ref, 1.0)
    np.testing.assert_allclose(corrected.s_abs, ref, atol=2e-6)
    np.testing.assert_allclose(corrected.s_abs, corrected.s_abs.T, atol=1e-6)
    assert not np.allclose(corrected.s_abs, plain.s_abs)  # the correction does something here
    # The concrete side is untouched.
    np.testing.assert_array_equal(corrected.s_full, plain.s_full)
    np.testing.assert_array_equal(corrected.within_idx, plain.within_idx)


def test_candidates_are_the_top_of_the_corrected_matrix(graphs):
    _, corrected = graphs
    idx, val = _reference_top(corrected.s_abs, corrected.env_index, 16)
    np.testing.assert_array_equal(corrected.cross_idx, idx)
    np.testing.assert_allclose(corrected.cross_sim, val, atol=1e-6)


def test_dense_and_blocked_paths_agree(pool, graphs):
    _, corrected = graphs
    never = build_graph(pool, dataclasses.replace(corrected.config, dense="never", block_size=50))
    assert never.s_abs is None
    np.testing.assert_array_equal(never.cross_idx, corrected.cross_idx)
    np.testing.assert_array_equal(never.cross_sim, corrected.cross_sim)


def test_a_node_similar_to_everything_loses_its_hub_role():
    # Nodes 0..5 in six environments; node 0 is moderately similar (0.6) to every node, while each
    # of the others has one specific partner at 0.55 (1<->2, 3<->4, 5 pairs with nobody).
    n = 6
    s = np.full((n, n), 0.1, np.float32)
    s[0, :] = s[:, 0] = 0.6
    s[1, 2] = s[2, 1] = s[3, 4] = s[4, 3] = 0.55
    np.fill_diagonal(s, 1.0)
    env = np.arange(n)
    before, _ = _reference_top(s, env, 1)
    assert (before[1:, 0] == 0).all()  # node 0 is everyone's top neighbour
    r = _reference_radius(s, env, 3).astype(np.float32)  # r_0 = 0.6, r_1 = (0.6 + 0.55 + 0.1) / 3
    corrected = csls_correct(s.copy(), np.arange(n), r)
    after, _ = _reference_top(corrected, env, 1)
    assert after[1, 0] == 2 and after[2, 0] == 1 and after[3, 0] == 4 and after[4, 0] == 3
    assert hubness(after, 1).top1_max_in_degree < hubness(before, 1).top1_max_in_degree


@pytest.mark.parametrize("kwargs,match", [
    (dict(hubness="mnn"), "hubness must be"),
    (dict(hubness_k=0), "hubness_k must be >= 1"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraphConfig(**kwargs)
