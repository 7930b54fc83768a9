"""Similarity entries from feature rows (envsched_jax.graph.feature_rows) equal the dense matrices
of build_graph bit for bit (np.array_equal on float32, never allclose)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils.extmath import safe_sparse_dot

from envsched_jax.graph.build import GraphConfig, _finish_block, build_graph, csls_correct, stack_views
from envsched_jax.graph.feature_rows import (
    ROUND_TABLE, CSRRows, FeatureRows, GraphSimilarity, _finish, abs_groups, block_similarity,
    graph_feature_rows, graph_similarity, grouped_rows, pair_similarity, row_similarity,
    storage_order_is_global)
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


def _concrete(graph) -> sp.csr_matrix:
    weights = graph.config.concrete_weights()
    return stack_views([graph.features[v] for v in weights], list(weights.values()))


@pytest.fixture(scope="module")
def legacy(graph, rows_csls):
    """The padded (ELL, binary-search) FeatureRows: full, abs, and abs with the CSLS radius."""
    table = jnp.asarray(ROUND_TABLE)
    abstract = graph.features["abstract"]
    return (FeatureRows.from_csr(_concrete(graph), round_table=table),
            FeatureRows.from_csr(abstract, round_table=table),
            FeatureRows.from_csr(abstract, radius=np.asarray(rows_csls.abs.radius), round_table=table))


def _check_rows(feature_rows, dense: np.ndarray, ids: np.ndarray) -> None:
    got = np.asarray(pair_similarity(feature_rows, ids[:, None], np.arange(N)[None, :]))
    np.testing.assert_array_equal(got, dense[ids])
    np.testing.assert_array_equal(got[np.arange(len(ids)), ids], 1.0)


def _sample(count: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).choice(N, count, replace=False)
    return np.concatenate([[0, N - 1], ids[(ids != 0) & (ids != N - 1)]])


def _padded_dense(dense: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """dense[q][:, c] with 0 where q or c is -1."""
    want = dense[np.ix_(np.maximum(q, 0), np.maximum(c, 0))].copy()
    want[q < 0, :] = 0.0
    want[:, c < 0] = 0.0
    return want


def _random_block(seed: int, r: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Random rows / columns with -1 padding, repeats, and some diagonal pairs."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, N, r).astype(np.int32)
    cols = rng.integers(0, N, c).astype(np.int32)
    cols[: min(r, c) // 2] = q[: min(r, c) // 2]          # diagonal entries
    q[rng.random(r) < 0.1] = -1
    cols[rng.random(c) < 0.1] = -1
    q[0], cols[-1] = -1, -1
    return q, cols


def _reference(X: sp.csr_matrix, radius: np.ndarray | None = None) -> np.ndarray:
    """build.py's dense pipeline on any CSR matrix: sparse product, finish, unit diagonal, CSLS."""
    n = X.shape[0]
    block = _finish_block(safe_sparse_dot(X, X.T.tocsr(), dense_output=True).astype(np.float32))
    block[np.arange(n), np.arange(n)] = 1.0
    if radius is not None:
        csls_correct(block, np.arange(n), radius)
    return block


def _shuffled_csr(seed: int, n: int = 60, f: int = 40, empty: int = 5) -> sp.csr_matrix:
    """A random float32 CSR matrix whose rows store their columns in random orders (no global
    order agrees with them), with ``empty`` empty rows and a few repeated rows."""
    rng = np.random.default_rng(seed)
    indptr, indices, data = [0], [], []
    for i in range(n):
        k = 0 if i < empty else int(rng.integers(1, f // 2))
        cols = rng.permutation(f)[:k]
        indices.extend(cols)
        data.extend(rng.uniform(0.01, 0.4, k).astype(np.float32))
        indptr.append(len(indices))
    X = sp.csr_matrix((np.asarray(data, np.float32), np.asarray(indices, np.int32), np.asarray(indptr)),
                      shape=(n, f))
    X = sp.vstack([X, X[n - 3:]], format="csr")   # three repeated rows (in storage order)
    return X[rng.permutation(X.shape[0])]


# --- structure ----------------------------------------------------------------------------------

def test_structure(graph, rows):
    concrete = _concrete(graph)
    full = rows.full
    nnz, width = concrete.nnz, int(np.diff(concrete.indptr).max())
    assert full.width == width and full.gather_width == -(-width // 8) * 8
    assert full.num_nodes == N and full.nnz == nnz
    assert full.num_cols == concrete.shape[1]
    assert rows.abs.num_cols == graph.features["abstract"].shape[1]
    assert not full.csls and not rows.abs.csls and not rows.abs_grouped.csls
    assert full.ordered and rows.abs.ordered  # TF-IDF storage order is one global column order
    assert full.indptr.dtype == jnp.int32 and full.indices.dtype == jnp.int32 and full.data.dtype == jnp.float32
    # storage order kept, padded at the end with G entries
    np.testing.assert_array_equal(np.asarray(full.indptr), concrete.indptr)
    np.testing.assert_array_equal(np.asarray(full.indices[:nnz]), concrete.indices)
    np.testing.assert_array_equal(np.asarray(full.data[:nnz]), concrete.data)
    assert full.indices.shape == (nnz + full.gather_width,) and not np.any(np.asarray(full.data[nnz:]))
    assert full.nbytes() == 4 * (N + 1) + 8 * (nnz + full.gather_width) + 4 * N + 4
    assert full.nbytes() < N * width * 16 / 3  # O(nnz), against the padded layout's 16 P per node
    assert rows.abs_grouped.num_groups == 88 and rows.abs_grouped.num_nodes == N


def test_legacy_structure(graph, legacy):
    concrete = _concrete(graph)
    full = legacy[0]
    assert full.idx.shape == (N, int(np.diff(concrete.indptr).max()))
    k = concrete.indptr[6] - concrete.indptr[5]
    np.testing.assert_array_equal(np.asarray(full.idx[5, :k]), concrete.indices[concrete.indptr[5]:concrete.indptr[6]])
    assert np.all(np.asarray(full.idx[5, k:]) == -1)
    assert full.nbytes() == N * full.width * 16 + N * 4 + 4


def test_storage_order_is_global():
    X = _order_case()
    assert not storage_order_is_global(X.indptr, X.indices.astype(np.int64), 3)
    Xs = X.copy()
    Xs.sort_indices()
    assert storage_order_is_global(Xs.indptr, Xs.indices.astype(np.int64), 3)
    assert not CSRRows.from_csr(X).ordered and CSRRows.from_csr(Xs).ordered
    assert not CSRRows.from_csr(Xs, ordered=False).ordered


# --- block_similarity ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["full", "abs", "abs_csls", "full_csls"])
def test_block_random_equals_dense(graph, rows, graph_csls, rows_csls, which):
    source, dense = {"full": (rows.full, graph.s_full), "abs": (rows.abs, graph.s_abs),
                     "abs_csls": (rows_csls.abs, graph_csls.s_abs),
                     "full_csls": (rows_csls.full, graph_csls.s_full)}[which]
    for seed, (r, c) in enumerate([(1, 50), (64, 64), (7, 700), (1, N), (40, 3)]):
        q, cols = _random_block(seed, r, c)
        got = np.asarray(block_similarity(source, q, cols))
        assert got.dtype == np.float32 and got.shape == (r, c)
        assert np.array_equal(got, _padded_dense(dense, q, cols)), (which, r, c)


def test_block_jit_traced(graph, rows, graph_csls, rows_csls):
    @jax.jit
    def inside(source, q, c):
        return block_similarity(source, q, c) + 0.0

    for source, dense in [(rows.full, graph.s_full), (rows_csls.abs, graph_csls.s_abs)]:
        for seed in range(2):
            q, cols = _random_block(10 + seed, 16, 300)
            got = np.asarray(inside(source, jnp.asarray(q), jnp.asarray(cols)))
            assert np.array_equal(got, _padded_dense(dense, q, cols))
    # traced indices >= N cannot raise: NaN; negative ones are padding
    out = np.asarray(inside(rows.abs, jnp.array([N, 3, -1]), jnp.array([0, 3])))
    assert np.isnan(out[0]).all() and np.array_equal(out[1], [graph.s_abs[3, 0], 1.0]) and not out[2].any()
    # the GraphSimilarity source, in jit
    sim = GraphSimilarity(full=rows_csls.full, abs=rows_csls.abs, abs_grouped=rows_csls.abs_grouped)
    q, cols = _random_block(12, 8, 40)
    got = jax.jit(lambda s, a, b: (s.block(a, b), s.abs_rows(a)))(sim, jnp.asarray(q), jnp.asarray(cols))
    assert np.array_equal(np.asarray(got[0]), _padded_dense(graph_csls.s_full, q, cols))
    assert np.array_equal(np.asarray(got[1]), _padded_dense(graph_csls.s_abs, q, np.arange(N)))


def test_block_full_abs_matrix(graph, rows, graph_csls, rows_csls):
    """All of S_abs (with and without CSLS) in blocks of 512 x N, the last block padded with -1."""
    for source, dense in [(rows.abs, graph.s_abs), (rows_csls.abs, graph_csls.s_abs)]:
        for start in range(0, N, 512):
            q = np.arange(start, start + 512)
            q[q >= N] = -1
            got = np.asarray(block_similarity(source, q, np.arange(N)))
            assert np.array_equal(got, _padded_dense(dense, q, np.arange(N))), start


def test_block_full_rows_sample(graph, rows):
    """Whole S_full rows of a sample (the whole matrix: test_block_all_full_slow)."""
    q = _sample(96, 5)
    got = np.asarray(block_similarity(rows.full, q, np.arange(N)))
    assert np.array_equal(got, graph.s_full[q])
    assert np.array_equal(got[np.arange(len(q)), q], np.ones(len(q), np.float32))


@pytest.mark.slow
def test_block_all_full_slow(graph, rows, graph_csls, rows_csls):
    for source, dense in [(rows.full, graph.s_full), (rows_csls.full, graph_csls.s_full)]:
        for start in range(0, N, 256):
            q = np.arange(start, min(start + 256, N))
            assert np.array_equal(np.asarray(block_similarity(source, q, np.arange(N))), dense[q]), start


def test_block_general_path(graph, rows, graph_csls, rows_csls):
    """ordered=False (products placed at row i's positions) gives the same entries."""
    for source, dense in [(rows.full, graph.s_full), (rows_csls.abs, graph_csls.s_abs)]:
        general = source.replace(ordered=False)
        q, cols = _random_block(20, 6, 500)
        assert np.array_equal(np.asarray(block_similarity(general, q, cols)), _padded_dense(dense, q, cols))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_shuffled_storage_order_and_empty_rows(seed):
    """Rows stored in random column orders (no global order: the general path), empty rows,
    repeated rows, with and without a CSLS radius, against build.py's pipeline on the same CSR."""
    X = _shuffled_csr(seed)
    n = X.shape[0]
    assert not storage_order_is_global(X.indptr, X.indices.astype(np.int64), X.shape[1])
    radius = np.random.default_rng(seed).uniform(0.0, 0.3, n).astype(np.float32)
    for rad in (None, radius):
        want = _reference(X, rad)
        r = CSRRows.from_csr(X, radius=rad)
        assert not r.ordered
        ids = np.arange(n)
        assert np.array_equal(np.asarray(block_similarity(r, ids, ids)), want)
        g = abs_groups(X, radius=rad)
        assert g.num_groups <= n - 3
        assert np.array_equal(np.asarray(grouped_rows(g, ids)), want)
        empty = np.flatnonzero(np.diff(X.indptr) == 0)
        assert len(empty) == 5
        if rad is None:  # empty rows: 0 with every other row, 1 on the diagonal
            assert np.array_equal(want[empty], np.eye(n, dtype=np.float32)[empty])


def test_block_diagonal_and_empty(rows, rows_csls, graph_csls):
    ids = np.arange(0, N, 7)
    for source in (rows.full, rows.abs, rows_csls.abs):
        got = np.asarray(block_similarity(source, ids, ids))
        np.testing.assert_array_equal(np.diag(got), 1.0)
    assert block_similarity(rows.full, np.zeros(0, np.int32), ids).shape == (0, len(ids))
    assert block_similarity(rows.full, ids, np.zeros(0, np.int32)).shape == (len(ids), 0)
    assert not np.asarray(block_similarity(rows.full, [-1, -1], [-1, 5])).any()


def test_block_bad_input(rows):
    with pytest.raises(ValueError, match=r"outside \[-1, 2550\)"):
        block_similarity(rows.full, [0, N], [1])
    with pytest.raises(ValueError, match="integers"):
        block_similarity(rows.full, np.array([0.5]), [1])


# --- grouped rows -------------------------------------------------------------------------------

def test_grouped_rows_equal_dense(graph, rows, graph_csls, rows_csls):
    for grouped, dense in [(rows.abs_grouped, graph.s_abs), (rows_csls.abs_grouped, graph_csls.s_abs)]:
        assert grouped.table.shape == (88, 88)
        for start in range(0, N, 1024):
            q = np.arange(start, min(start + 1024, N))
            assert np.array_equal(np.asarray(grouped_rows(grouped, q)), dense[q])
        q = np.array([-1, 5, -1, N - 1], np.int32)
        got = np.asarray(jax.jit(grouped_rows)(grouped, jnp.asarray(q)))
        assert np.array_equal(got, _padded_dense(dense, q, np.arange(N)))
    assert rows_csls.abs_grouped.csls
    # equal rows share a group: same indices and values in the same storage order
    Z = graph.features["abstract"]
    group = np.asarray(rows.abs_grouped.group)
    a, b = np.flatnonzero(group == group[0])[:2]
    assert np.array_equal(Z[a].indices, Z[b].indices) and np.array_equal(Z[a].data, Z[b].data)


def test_grouped_too_many(graph, graph_csls):
    with pytest.raises(ValueError, match=r"U > 10"):
        abs_groups(graph.features["abstract"], max_groups=10)
    fallback = graph_feature_rows(graph_csls, max_groups=10)
    assert fallback.abs_grouped is None
    sim = graph_similarity(graph_csls, radius=np.asarray(fallback.abs.radius), max_groups=10)
    assert sim.abs_grouped is None and sim.num_nodes == N
    q = np.array([3, -1, 2000], np.int32)
    assert np.array_equal(np.asarray(sim.abs_rows(q)), _padded_dense(graph_csls.s_abs, q, np.arange(N)))


# --- pair_similarity / row_similarity (new and padded layouts) ----------------------------------

def test_full_rows_equal_dense(graph, rows, legacy):
    _check_rows(rows.full, graph.s_full, _sample(40, 0))
    _check_rows(legacy[0], graph.s_full, _sample(40, 0))


def test_abs_rows_equal_dense(graph, rows, legacy):
    _check_rows(rows.abs, graph.s_abs, _sample(400, 1))
    _check_rows(legacy[1], graph.s_abs, _sample(400, 1))


def test_csls_rows_equal_dense(graph_csls, rows_csls, legacy):
    assert rows_csls.abs.csls and not rows_csls.full.csls
    _check_rows(rows_csls.abs, graph_csls.s_abs, _sample(400, 2))
    _check_rows(rows_csls.full, graph_csls.s_full, _sample(24, 3))
    _check_rows(legacy[2], graph_csls.s_abs, _sample(200, 2))


def test_csls_radius_passed_in(graph_csls, rows_csls):
    again = graph_feature_rows(graph_csls, radius=np.asarray(rows_csls.abs.radius))
    ids = _sample(64, 4)
    _check_rows(again.abs, graph_csls.s_abs, ids)
    assert np.array_equal(np.asarray(grouped_rows(again.abs_grouped, ids)), graph_csls.s_abs[ids])
    with pytest.raises(ValueError, match="hubness"):
        graph_feature_rows(build_graph(generate_pool_of_size(60, seed=0)), radius=np.zeros(60, np.float32))


@pytest.mark.slow
def test_all_rows_equal_dense(graph, rows, graph_csls, rows_csls, legacy):
    """Every pair through pair_similarity (S_full's: test_block_all_full_slow, by blocks)."""
    _check_rows(rows.abs, graph.s_abs, np.arange(N))
    _check_rows(rows_csls.abs, graph_csls.s_abs, np.arange(N))
    _check_rows(legacy[1], graph.s_abs, np.arange(N))
    _check_rows(legacy[2], graph_csls.s_abs, np.arange(N))


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


@pytest.mark.parametrize("layout", ["csr", "padded"])
def test_jit_eager_broadcast_chunks(graph, rows, legacy, layout):
    full, abs_ = (rows.full, rows.abs) if layout == "csr" else (legacy[0], legacy[1])
    i = np.array([[3], [17], [2549]])
    j = np.array([[0, 3, 100, 2549, 1200]])
    want = graph.s_full[np.ix_(i[:, 0], j[0])]
    np.testing.assert_array_equal(np.asarray(pair_similarity(full, i, j)), want)
    np.testing.assert_array_equal(np.asarray(pair_similarity(full, i, j, chunk=4)), want)  # padded chunks
    np.testing.assert_array_equal(np.asarray(pair_similarity(full, jnp.asarray(i), jnp.asarray(j))), want)
    with jax.disable_jit():
        np.testing.assert_array_equal(np.asarray(pair_similarity(full, i[:2], j[:, :2])), want[:2, :2])

    @jax.jit
    def inside(r, a, b):
        return pair_similarity(r, a, b, chunk=7)

    np.testing.assert_array_equal(np.asarray(inside(full, i, j)), want)
    # traced out-of-range indices cannot raise: they give NaN
    assert np.isnan(np.asarray(inside(full, jnp.array([N]), jnp.array([0])))).all()
    assert np.isnan(np.asarray(inside(full, jnp.array([0]), jnp.array([-1])))).all()
    # scalars, empty
    assert pair_similarity(abs_, 5, 7).shape == ()
    assert float(pair_similarity(abs_, 5, 7)) == graph.s_abs[5, 7]
    assert pair_similarity(abs_, np.zeros((0,), int), 3).shape == (0,)
    np.testing.assert_array_equal(np.asarray(row_similarity(abs_, 11, chunk=1000)), graph.s_abs[11])
    np.testing.assert_array_equal(np.asarray(row_similarity(full, 2549)), graph.s_full[2549])


def _order_case() -> sp.csr_matrix:
    """Row 0 stores columns [2, 0, 1]; summed in that order its product with row 1 (all ones)
    rounds to 0.5, in sorted order to 0.500001. Row 2 is empty."""
    a, s1, s2 = np.float32(0.50000036), np.float32(7.199094e-08), np.float32(8.355692e-08)
    data = np.array([a, s1, s2, 1.0, 1.0, 1.0], np.float32)
    indices = np.array([2, 0, 1, 0, 1, 2], np.int32)
    X = sp.csr_matrix((data, indices, np.array([0, 3, 6, 6])), shape=(3, 3))
    assert not X.has_sorted_indices
    return X


@pytest.mark.parametrize("layout", [CSRRows, FeatureRows])
def test_storage_order_matters(layout):
    X = _order_case()
    dense = _reference(X)
    Xs = X.copy()
    Xs.sort_indices()
    dense_sorted = _reference(Xs)
    assert dense[0, 1] == np.float32(0.5) and dense_sorted[0, 1] == np.float32(0.500001)  # order matters
    assert dense[1, 0] == np.float32(0.500001)  # row 1 sums in its own (sorted) order
    ids = np.arange(3)
    r = layout.from_csr(X)
    got = np.asarray(pair_similarity(r, ids[:, None], ids[None, :]))
    np.testing.assert_array_equal(got, dense)
    assert got[2, 2] == 1.0 and got[2, 0] == 0.0 and got[0, 2] == 0.0
    # the sorted copy gives the sorted matrix
    np.testing.assert_array_equal(np.asarray(pair_similarity(layout.from_csr(Xs), ids[:, None], ids[None, :])),
                                  dense_sorted)
    if layout is CSRRows:
        np.testing.assert_array_equal(np.asarray(block_similarity(r, ids, ids)), dense)
        np.testing.assert_array_equal(np.asarray(block_similarity(CSRRows.from_csr(Xs), ids, ids)), dense_sorted)
        # forcing the global-order path on rows that have none gives the wrong (j-order) sum
        wrong = np.asarray(block_similarity(r.replace(ordered=True), ids, ids))
        assert wrong[0, 1] == np.float32(0.500001)
        np.testing.assert_array_equal(np.asarray(grouped_rows(abs_groups(X), ids)), dense)


@pytest.mark.parametrize("build", [CSRRows.from_csr, FeatureRows.from_csr, abs_groups])
def test_bad_input(build):
    X = _order_case()
    with pytest.raises(ValueError, match="float32"):
        build(X.astype(np.float64))
    with pytest.raises(ValueError, match="CSR"):
        build(X.tocsc())
    with pytest.raises(ValueError, match="CSR"):
        build(X.toarray())
    dup = sp.csr_matrix((np.ones(2, np.float32), np.array([1, 1]), np.array([0, 2])), shape=(1, 3))
    with pytest.raises(ValueError, match="same column twice"):
        build(dup)
    out = sp.csr_matrix((3, 3), dtype=np.float32)
    out.indices, out.data, out.indptr = np.array([5], np.int32), np.ones(1, np.float32), np.array([0, 1, 1, 1], np.int32)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        build(out)
    bad = X.copy()
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        build(bad)
    with pytest.raises(ValueError, match="radius"):
        build(X, radius=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="radius"):
        build(X, radius=np.zeros(3, np.float64))


def test_bad_indices_and_views(graph, rows):
    with pytest.raises(ValueError, match=r"outside \[0, 2550\)"):
        pair_similarity(rows.full, [0, N], 1)
    with pytest.raises(ValueError, match="outside"):
        pair_similarity(rows.full, 0, -1)
    with pytest.raises(ValueError, match="integers"):
        pair_similarity(rows.full, np.array([0.5]), 1)
    with pytest.raises(ValueError, match="scalar"):
        row_similarity(rows.abs, [1, 2])
    with pytest.raises(ValueError, match=r"outside \[-1, 2550\)"):
        grouped_rows(rows.abs_grouped, [N])
    semantic = dataclasses.replace(graph, config=GraphConfig(semantic_view="add"))
    with pytest.raises(ValueError, match="semantic_view='add'"):
        graph_feature_rows(semantic)


def test_checks_in_chunks_and_offset_limit(monkeypatch):
    """The host-side checks give the same answers in small chunks; nnz must fit int32 offsets."""
    import envsched_jax.graph.feature_rows as fr

    X = _shuffled_csr(7)
    Xs = X.copy()
    Xs.sort_indices()
    # row 2 stores column 2 twice (row 1 is empty)
    dup = sp.csr_matrix((np.ones(5, np.float32), np.array([0, 1, 2, 4, 2]), np.array([0, 2, 2, 5])), shape=(3, 5))
    for chunk in (1, 3, 1 << 22):
        monkeypatch.setattr(fr, "_CHECK_CHUNK", chunk)
        assert not CSRRows.from_csr(X).ordered and CSRRows.from_csr(Xs).ordered
        assert not storage_order_is_global(_order_case().indptr, _order_case().indices, 3)
        with pytest.raises(ValueError, match="same column twice"):
            CSRRows.from_csr(dup)
    monkeypatch.setattr(fr, "_MAX_OFFSET", X.nnz + 8)
    with pytest.raises(ValueError, match="int32 offsets"):
        CSRRows.from_csr(X)


def test_prepared_maps_give_block_similarity(graph, rows):
    """query_maps / column_data / block_from_maps (what the dense-free selection uses: each pick's
    map built once) equal block_similarity and the dense matrix, -1 padding included, ordered and
    general summation paths."""
    from envsched_jax.graph.feature_rows import CSRRows, block_from_maps, column_data, query_maps

    rng = np.random.default_rng(11)
    q = np.concatenate([rng.choice(N, 6, replace=False), [-1]]).astype(np.int32)
    c = np.concatenate([rng.choice(N, 40, replace=False), q[:2], [-1]]).astype(np.int32)
    which = np.array([3, 0, 6, 3], np.int32)
    concrete = stack_views([graph.features[v] for v in graph.config.concrete_weights()],
                           list(graph.config.concrete_weights().values()))
    for ordered in (True, False):
        csr = CSRRows.from_csr(concrete, ordered=ordered)
        maps = query_maps(csr, jnp.asarray(q))
        got = np.asarray(jax.jit(block_from_maps)(csr, maps, jnp.asarray(c), column_data(csr, jnp.asarray(c)),
                                                  jnp.asarray(which)))
        want = np.where((q[which][:, None] >= 0) & (c[None, :] >= 0),
                        graph.s_full[np.maximum(q[which], 0)][:, np.maximum(c, 0)], 0.0)
        np.testing.assert_array_equal(got, want.astype(np.float32))
