"""Similarity entries from feature rows (envsched_jax.graph.feature_rows) equal the dense matrices
of build_graph bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils.extmath import safe_sparse_dot

from envsched_jax.graph.build import GraphConfig, _finish_block, build_graph, stack_views
from envsched_jax.graph.feature_rows import (
    ROUND_TABLE, FeatureRows, _finish, graph_feature_rows, pair_similarity, row_similarity)
from envsched_jax.pool.generator import generate_pool_of_size

N = 2550


@pytest.fixture(scope="module")
def pool():
    return generate_pool_of_size(N, seed=0)


@pytest.fixture(scope="module")
def graph(pool):
    return build_graph(pool, GraphConfig(dense="always"))


@pytest.fixture(scope="module")
def graph_csls(pool):
    return build_graph(pool, GraphConfig(dense="always", hubness="csls"))


@pytest.fixture(scope="module")
def rows(graph):
    return graph_feature_rows(graph)


@pytest.fixture(scope="module")
def rows_csls(graph_csls):
    return graph_feature_rows(graph_csls)


def _check_rows(feature_rows: FeatureRows, dense: np.ndarray, ids: np.ndarray) -> None:
    got = np.asarray(pair_similarity(feature_rows, ids[:, None], np.arange(N)[None, :]))
    np.testing.assert_array_equal(got, dense[ids])
    np.testing.assert_array_equal(got[np.arange(len(ids)), ids], 1.0)


def _sample(count: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).choice(N, count, replace=False)
    return np.concatenate([[0, N - 1], ids[(ids != 0) & (ids != N - 1)]])


def test_structure(graph, rows):
    concrete = stack_views([graph.features[v] for v in graph.config.concrete_weights()],
                           list(graph.config.concrete_weights().values()))
    assert rows.full.idx.shape == (N, int(np.diff(concrete.indptr).max()))
    assert rows.full.num_cols == concrete.shape[1]
    assert rows.abs.num_cols == graph.features["abstract"].shape[1]
    assert not rows.full.csls and not rows.abs.csls
    # storage order kept: row 5's padded columns are the CSR row as stored
    k = concrete.indptr[6] - concrete.indptr[5]
    np.testing.assert_array_equal(np.asarray(rows.full.idx[5, :k]), concrete.indices[concrete.indptr[5]:concrete.indptr[6]])
    assert np.all(np.asarray(rows.full.idx[5, k:]) == -1)
    assert rows.full.nbytes() == N * rows.full.width * 16 + N * 4 + 4


def test_full_rows_equal_dense(graph, rows):
    _check_rows(rows.full, graph.s_full, _sample(160, 0))


def test_abs_rows_equal_dense(graph, rows):
    _check_rows(rows.abs, graph.s_abs, _sample(400, 1))


def test_csls_rows_equal_dense(graph_csls, rows_csls):
    assert rows_csls.abs.csls and not rows_csls.full.csls
    _check_rows(rows_csls.abs, graph_csls.s_abs, _sample(400, 2))
    _check_rows(rows_csls.full, graph_csls.s_full, _sample(48, 3))


def test_csls_radius_passed_in(graph_csls, rows_csls):
    again = graph_feature_rows(graph_csls, radius=np.asarray(rows_csls.abs.radius))
    ids = _sample(64, 4)
    _check_rows(again.abs, graph_csls.s_abs, ids)
    with pytest.raises(ValueError, match="hubness"):
        graph_feature_rows(build_graph(generate_pool_of_size(60, seed=0)), radius=np.zeros(60, np.float32))


@pytest.mark.slow
def test_all_rows_equal_dense(graph, rows, graph_csls, rows_csls):
    _check_rows(rows.full, graph.s_full, np.arange(N))
    _check_rows(rows.abs, graph.s_abs, np.arange(N))
    _check_rows(rows_csls.abs, graph_csls.s_abs, np.arange(N))


def test_finish_matches_numpy(graph):
    """The finishing step equals _finish_block on raw products and on values at rounding midpoints
    (jnp.round(x, 6) does not: XLA turns its division into a multiplication)."""
    Z = graph.features["abstract"]
    raw = [safe_sparse_dot(Z[:300], Z.T.tocsr(), dense_output=True).astype(np.float32).ravel()]
    rng = np.random.default_rng(0)
    raw.append(rng.uniform(-0.1, 1.1, 500_000).astype(np.float32))
    mid = (np.arange(0, 1_000_000, 7, dtype=np.float64) + 0.5) / 1e6
    for ulps in range(-3, 4):
        raw.append(np.nextafter(mid.astype(np.float32), np.float32(np.sign(ulps) or 1) * np.inf).astype(np.float32)
                   if ulps else mid.astype(np.float32))
    x = np.concatenate(raw + [np.array([0.0, 1.0, -0.0, 1e-7, 0.9999995, 1.5, -3.0], np.float32)])
    got = np.asarray(jax.jit(_finish)(jnp.asarray(x), jnp.asarray(ROUND_TABLE)))
    np.testing.assert_array_equal(got, _finish_block(x.copy()))


def test_jit_eager_broadcast_chunks(graph, rows):
    i = np.array([[3], [17], [2549]])
    j = np.array([[0, 3, 100, 2549, 1200]])
    want = graph.s_full[np.ix_(i[:, 0], j[0])]
    np.testing.assert_array_equal(np.asarray(pair_similarity(rows.full, i, j)), want)
    np.testing.assert_array_equal(np.asarray(pair_similarity(rows.full, i, j, chunk=4)), want)  # padded chunks
    np.testing.assert_array_equal(np.asarray(pair_similarity(rows.full, jnp.asarray(i), jnp.asarray(j))), want)
    with jax.disable_jit():
        np.testing.assert_array_equal(np.asarray(pair_similarity(rows.full, i[:2], j[:, :2])), want[:2, :2])

    @jax.jit
    def inside(r, a, b):
        return pair_similarity(r, a, b, chunk=7)

    np.testing.assert_array_equal(np.asarray(inside(rows.full, i, j)), want)
    # traced out-of-range indices cannot raise: they give NaN
    assert np.isnan(np.asarray(inside(rows.full, jnp.array([N]), jnp.array([0])))).all()
    # scalars, empty
    assert pair_similarity(rows.abs, 5, 7).shape == ()
    assert float(pair_similarity(rows.abs, 5, 7)) == graph.s_abs[5, 7]
    assert pair_similarity(rows.abs, np.zeros((0,), int), 3).shape == (0,)
    np.testing.assert_array_equal(np.asarray(row_similarity(rows.abs, 11, chunk=1000)), graph.s_abs[11])


def _order_case() -> sp.csr_matrix:
    """Row 0 stores columns [2, 0, 1]; summed in that order its product with row 1 (all ones)
    rounds to 0.5, in sorted order to 0.500001. Row 2 is empty."""
    a, s1, s2 = np.float32(0.50000036), np.float32(7.199094e-08), np.float32(8.355692e-08)
    data = np.array([a, s1, s2, 1.0, 1.0, 1.0], np.float32)
    indices = np.array([2, 0, 1, 0, 1, 2], np.int32)
    X = sp.csr_matrix((data, indices, np.array([0, 3, 6, 6])), shape=(3, 3))
    assert not X.has_sorted_indices
    return X


def test_storage_order_matters():
    X = _order_case()
    dense = _finish_block(safe_sparse_dot(X, X.T.tocsr(), dense_output=True).astype(np.float32))
    np.fill_diagonal(dense, 1.0)
    Xs = X.copy()
    Xs.sort_indices()
    dense_sorted = _finish_block(safe_sparse_dot(Xs, Xs.T.tocsr(), dense_output=True).astype(np.float32))
    np.fill_diagonal(dense_sorted, 1.0)
    assert dense[0, 1] == np.float32(0.5) and dense_sorted[0, 1] == np.float32(0.500001)  # order matters
    assert dense[1, 0] == np.float32(0.500001)  # row 1 sums in its own (sorted) order
    r = FeatureRows.from_csr(X)
    got = np.asarray(pair_similarity(r, np.arange(3)[:, None], np.arange(3)[None, :]))
    np.testing.assert_array_equal(got, dense)
    assert got[2, 2] == 1.0 and got[2, 0] == 0.0 and got[0, 2] == 0.0
    # the sorted copy gives the sorted matrix
    np.testing.assert_array_equal(
        np.asarray(pair_similarity(FeatureRows.from_csr(Xs), np.arange(3)[:, None], np.arange(3)[None, :])),
        dense_sorted)


def test_bad_input(graph, rows):
    with pytest.raises(ValueError, match=r"outside \[0, 2550\)"):
        pair_similarity(rows.full, [0, N], 1)
    with pytest.raises(ValueError, match="outside"):
        pair_similarity(rows.full, 0, -1)
    with pytest.raises(ValueError, match="integers"):
        pair_similarity(rows.full, np.array([0.5]), 1)
    with pytest.raises(ValueError, match="scalar"):
        row_similarity(rows.abs, [1, 2])
    X = _order_case()
    with pytest.raises(ValueError, match="float32"):
        FeatureRows.from_csr(X.astype(np.float64))
    with pytest.raises(ValueError, match="CSR"):
        FeatureRows.from_csr(X.tocsc())
    with pytest.raises(ValueError, match="CSR"):
        FeatureRows.from_csr(X.toarray())
    dup = sp.csr_matrix((np.ones(2, np.float32), np.array([1, 1]), np.array([0, 2])), shape=(1, 3))
    with pytest.raises(ValueError, match="same column twice"):
        FeatureRows.from_csr(dup)
    out = sp.csr_matrix((3, 3), dtype=np.float32)
    out.indices, out.data, out.indptr = np.array([5], np.int32), np.ones(1, np.float32), np.array([0, 1, 1, 1], np.int32)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        FeatureRows.from_csr(out)
    with pytest.raises(ValueError, match="radius"):
        FeatureRows.from_csr(X, radius=np.zeros(2, np.float32))
    import dataclasses
    semantic = dataclasses.replace(graph, config=GraphConfig(semantic_view="add"))
    with pytest.raises(ValueError, match="semantic_view='add'"):
        graph_feature_rows(semantic)
