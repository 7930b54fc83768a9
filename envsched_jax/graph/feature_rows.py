"""Entries of the dense similarity matrices ``S_full`` and ``S_abs``, computed on the fly from the
feature rows, bit for bit equal to the matrices :func:`envsched_jax.graph.build.build_graph` builds.

The dense matrices are N x N; for pools of 10^5 - 10^6 tasks they cannot exist. This module keeps
the sparse feature rows of a pool in padded (ELL) form, O(N x nnz-per-row) memory, and computes any
entry ``S[i, j]`` inside ``jax.jit``:

- :class:`FeatureRows`: one CSR matrix in ELL form (row storage order, and a sorted copy for
  lookups), plus the CSLS radius when the matrix is ``S_abs`` under ``hubness="csls"``;
  :meth:`FeatureRows.from_csr`, and :func:`graph_feature_rows` (a :class:`GraphFeatureRows`:
  ``full`` for ``S_full``, ``abs`` for ``S_abs``) from a :class:`~envsched_jax.graph.build.PoolGraph`;
- :func:`pair_similarity` (``S[i, j]`` for broadcast index arrays) and :func:`row_similarity`
  (a whole row ``S[i, :]``).

Exactness: why the result equals the dense matrix to the last bit
------------------------------------------------------------------
``build.py`` computes a block of rows as ``safe_sparse_dot(Z[rows], Z.T.tocsr(), dense_output=True)``:
scipy's sparse product (``csr_matmat``, the SMMP algorithm) followed by ``toarray``. For row i of
the left factor it walks row i's entries **in CSR storage order** (TF-IDF rows are not sorted by
column) and, for every entry ``(k, a_k)``, adds ``a_k * b_jk`` to an accumulator of every node j
that has column k: ``sums[j] = float32(sums[j] + float32(a_k * b_jk))``, starting from 0. So
``Z Z^T [i, j]`` is the sequential float32 sum of the products over the columns that rows i and j
share, in row i's storage order. Here:

1. ``b_jk`` is looked up by binary search in row j's sorted copy (0 where row j lacks column k);
2. the products ``a_k * b_jk`` over all P positions of row i (padding and non-shared columns
   give exact zeros) are formed as one array behind :func:`jax.lax.optimization_barrier`, so that
   XLA cannot fuse the multiplication into the summation loop and LLVM cannot contract
   ``acc + a * b`` into a fused multiply-add (XLA's CPU and GPU backends both allow contraction);
3. they are summed sequentially over the positions (a ``fori_loop``); adding an exact zero leaves
   a float32 sum unchanged (``x + 0 = x``, and ``+0 + -0 = +0`` as in scipy), so the result is
   scipy's sum;
4. the finishing step is ``_finish_block``'s: clip into [0, 1], then numpy's ``np.round(x, 6)``,
   which on float32 is ``rint(x * 1e6) / 1e6`` in float32. XLA rewrites a division by a
   (broadcast) scalar into a multiplication by its reciprocal, which differs from the division on
   about 3 % of the values (checked: 31,758 of the 10^6 + 1 quotients k / 1e6), and
   ``jnp.round(x, 6)`` is compiled exactly that way. The division is therefore replaced by a lookup:
   after clipping, ``rint(x * 1e6)`` is an integer k in [0, 10^6], and ``k / 1e6`` is read from a
   table computed by numpy (:data:`ROUND_TABLE`), exact by construction on every backend;
5. the unit diagonal (``i == j`` gives 1.0, also for empty rows), and for ``S_abs`` under
   ``hubness="csls"`` the correction of :func:`~envsched_jax.graph.build.csls_correct` in its
   float32 order: ``s - 0.5 * (r_i + r_j)``, then ``+ rbar``, then finish again, diagonal 1.
   ``0.5 * x`` is exact, so a contraction of ``s - 0.5 * x`` into an FMA cannot change it.

The radius r (mean of the ``hubness_k`` largest raw cross-environment ``S_abs`` values) is
recomputed exactly as ``build_graph`` does (the same functions on the same matrix) or passed in.

Where exactness rests on assumptions (see also the tests): the sparse product being scipy's
``csr_matmat`` in float32 with separate multiply and add (scipy's wheels are built for baseline
x86-64, without FMA); no duplicate column in a row (checked, :class:`ValueError`); no subnormal
products (XLA flushes subnormals to zero, scipy does not; TF-IDF products are > 1e-30).
Out-of-range node indices raise :class:`ValueError` when the indices are concrete (host) values;
under ``jit`` they give NaN.

Memory: four [N, P] arrays (storage-order and sorted column indices, int32, and values, float32),
16 P bytes per node, P the largest row length; at N = 2,550 the stacked concrete views have P = 836
(13.4 kB per node) and the abstract view P = 52 (832 bytes), plus a 4 MB rounding table shared by
all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from flax import struct

ROUND_TABLE = np.arange(1_000_001, dtype=np.float32) / np.float32(1e6)
"""``ROUND_TABLE[k] = float32(k) / float32(1e6)``, numpy's float32 division (module docstring, 4)."""

_PAD_SORTED = np.iinfo(np.int32).max  # padding of the sorted column indices: after every column


@struct.dataclass
class FeatureRows:
    """A float32 CSR matrix X (N x F) in padded form, for entries of ``finish(X X^T)``.

    ``idx`` / ``val``: row i's column indices and values in CSR storage order, padded with -1 / 0
    to P = the largest row length (at least 1). ``sidx`` / ``sval``: the same sorted by column,
    padded with int32 max / 0 (binary-search lookups of row j's value at a column). ``radius`` /
    ``rbar``: the CSLS radius per node and its mean (zeros unless ``csls``). ``round_table``:
    :data:`ROUND_TABLE`."""

    idx: jax.Array          # [N, P] int32, -1 padded, storage order
    val: jax.Array          # [N, P] float32, 0 padded, storage order
    sidx: jax.Array         # [N, P] int32, int32-max padded, sorted by column
    sval: jax.Array         # [N, P] float32, 0 padded, sorted by column
    radius: jax.Array       # [N] float32: CSLS radius r_i (zeros without CSLS)
    rbar: jax.Array         # [] float32: mean of r (0 without CSLS)
    round_table: jax.Array  # [10^6 + 1] float32
    num_cols: int = struct.field(pytree_node=False, default=0)
    csls: bool = struct.field(pytree_node=False, default=False)

    @property
    def num_nodes(self) -> int:
        return self.idx.shape[0]

    @property
    def width(self) -> int:
        """P, the padded row length."""
        return self.idx.shape[1]

    def nbytes(self, include_table: bool = False) -> int:
        """Bytes of the per-node arrays (and of the shared rounding table when asked)."""
        arrays = [self.idx, self.val, self.sidx, self.sval, self.radius, self.rbar]
        return int(sum(a.nbytes for a in arrays) + (self.round_table.nbytes if include_table else 0))

    @classmethod
    def from_csr(cls, X: sp.spmatrix, radius: np.ndarray | None = None,
                 round_table: jax.Array | None = None) -> "FeatureRows":
        """Padded form of the float32 CSR matrix ``X``, in its storage order (not re-sorted).

        ``radius``: CSLS radius per node (float32 [N], :func:`~envsched_jax.graph.build.csls_radius`)
        for a CSLS-corrected ``S_abs``; ``rbar`` is computed as ``csls_correct`` does.
        ``round_table``: a device copy of :data:`ROUND_TABLE` to share between instances."""
        if not sp.issparse(X) or X.format != "csr":
            raise ValueError(f"FeatureRows.from_csr needs a scipy CSR matrix, got {type(X).__name__}"
                             + (f" ({X.format})" if sp.issparse(X) else ""))
        if X.dtype != np.float32:
            raise ValueError(f"FeatureRows.from_csr needs float32 values (the dense matrices are float32 "
                             f"products), got {X.dtype}")
        n, f = X.shape
        if f >= _PAD_SORTED:
            raise ValueError(f"FeatureRows.from_csr: {f} columns do not fit int32 indices")
        indptr = np.asarray(X.indptr, np.int64)
        indices = np.asarray(X.indices, np.int64)
        data = np.asarray(X.data, np.float32)
        nnz = int(indptr[-1])
        indices, data = indices[:nnz], data[:nnz]
        if nnz and (indices.min() < 0 or indices.max() >= f):
            raise ValueError(f"FeatureRows.from_csr: column indices outside [0, {f})")
        if not np.all(np.isfinite(data)):
            raise ValueError("FeatureRows.from_csr: non-finite values")
        lens = np.diff(indptr)
        width = max(int(lens.max()) if n else 0, 1)
        rows = np.repeat(np.arange(n, dtype=np.int64), lens)
        pos = np.arange(nnz, dtype=np.int64) - indptr[rows]
        idx = np.full((n, width), -1, np.int32)
        val = np.zeros((n, width), np.float32)
        idx[rows, pos] = indices
        val[rows, pos] = data
        order = np.lexsort((indices, rows))  # by row, then column
        s_cols = indices[order]
        if nnz > 1 and np.any((np.diff(s_cols) == 0) & (np.diff(rows[order]) == 0)):
            raise ValueError("FeatureRows.from_csr: a row holds the same column twice (call "
                             "sum_duplicates() first; scipy's product order then changes)")
        sidx = np.full((n, width), _PAD_SORTED, np.int32)
        sval = np.zeros((n, width), np.float32)
        sidx[rows, pos] = s_cols
        sval[rows, pos] = data[order]
        csls = radius is not None
        if csls:
            radius = np.asarray(radius)
            if radius.shape != (n,) or radius.dtype != np.float32:
                raise ValueError(f"FeatureRows.from_csr: radius must be float32 [{n}], got "
                                 f"{radius.dtype} {radius.shape}")
            # as csls_correct computes it
            rbar = np.float32(radius.astype(np.float64).mean()) if len(radius) else np.float32(0.0)
        else:
            radius, rbar = np.zeros(n, np.float32), np.float32(0.0)
        table = jnp.asarray(ROUND_TABLE) if round_table is None else round_table
        return cls(idx=jnp.asarray(idx), val=jnp.asarray(val), sidx=jnp.asarray(sidx),
                   sval=jnp.asarray(sval), radius=jnp.asarray(radius, jnp.float32),
                   rbar=jnp.asarray(rbar, jnp.float32), round_table=table, num_cols=int(f), csls=csls)


class GraphFeatureRows(NamedTuple):
    """The feature rows of a graph's two similarity matrices."""

    full: FeatureRows  # S_full: the stacked, weighted concrete views
    abs: FeatureRows   # S_abs: the abstract view (CSLS-corrected when the graph's config says so)


def graph_feature_rows(graph, radius: np.ndarray | None = None) -> GraphFeatureRows:
    """:class:`FeatureRows` of ``graph``'s ``S_full`` and ``S_abs`` (a :class:`GraphFeatureRows`).

    ``S_full``'s matrix is :func:`~envsched_jax.graph.build.stack_views` of the concrete views in
    ``GraphConfig.concrete_weights()`` order, as ``build_graph`` stacks them (the semantic view
    included when ``semantic_view`` is on: its features are in ``graph.features``). Under
    ``hubness="csls"`` the radius is recomputed as ``build_graph`` computes it (raw
    cross-environment candidates, then :func:`~envsched_jax.graph.build.csls_radius`; as costly as
    that step of the build) unless ``radius`` is given."""
    from envsched_jax.graph.build import cross_candidates, csls_radius, stack_views

    config = graph.config
    weights = config.concrete_weights()
    missing = [name for name in weights if name not in graph.features]
    if missing:
        option = " (semantic_view=%r)" % config.semantic_view if "semantic" in missing else ""
        raise ValueError(f"graph_feature_rows: the graph holds no features of view(s) {missing}{option}")
    concrete = stack_views([graph.features[name] for name in weights], list(weights.values()))
    abstract = graph.features["abstract"]
    if config.hubness == "csls":
        if radius is None:
            m = config.num_candidates
            raw_idx, raw_sim = cross_candidates(abstract, np.asarray(graph.env_index), max(m, config.hubness_k),
                                                config.block_size)
            radius = csls_radius(raw_sim, raw_idx, config.hubness_k)
    elif radius is not None:
        raise ValueError("graph_feature_rows: radius given but the graph's hubness is not 'csls'")
    table = jnp.asarray(ROUND_TABLE)
    return GraphFeatureRows(full=FeatureRows.from_csr(concrete, round_table=table),
                            abs=FeatureRows.from_csr(abstract, radius=radius, round_table=table))


def _finish(x: jax.Array, table: jax.Array) -> jax.Array:
    """``_finish_block``: clip into [0, 1], then numpy's float32 ``round(x, 6)`` (module docstring, 4)."""
    x = jnp.clip(x, jnp.float32(0.0), jnp.float32(1.0))
    k = jax.lax.round(x * jnp.float32(1e6), jax.lax.RoundingMethod.TO_NEAREST_EVEN)
    return table[k.astype(jnp.int32)]


def _lookup(sidx: jax.Array, sval: jax.Array, j: jax.Array, cols: jax.Array) -> jax.Array:
    """Row j's value at each column of ``cols`` ([M, P]; 0 where row j lacks it): a lower-bound
    binary search in row j's sorted columns, a fixed number of halvings."""
    width = sidx.shape[1]
    jj = j[:, None]
    lo = jnp.zeros(cols.shape, jnp.int32)
    hi = jnp.full(cols.shape, width, jnp.int32)
    for _ in range(math.ceil(math.log2(width + 1))):
        mid = (lo + hi) // 2
        right = sidx[jj, jnp.minimum(mid, width - 1)] < cols
        active = lo < hi
        lo = jnp.where(active & right, mid + 1, lo)
        hi = jnp.where(active & ~right, mid, hi)
    pos = jnp.minimum(lo, width - 1)
    return jnp.where(sidx[jj, pos] == cols, sval[jj, pos], jnp.float32(0.0))


def _pairs_chunk(rows: FeatureRows, i: jax.Array, j: jax.Array) -> jax.Array:
    """Finished S[i, j] for flat index vectors (the exactness steps of the module docstring)."""
    n = rows.num_nodes
    valid = (i >= 0) & (i < n) & (j >= 0) & (j < n)
    i = jnp.clip(i, 0, n - 1)
    j = jnp.clip(j, 0, n - 1)
    a = rows.val[i]                                   # [M, P] row i, storage order
    b = _lookup(rows.sidx, rows.sval, j, rows.idx[i])  # [M, P] row j at row i's columns
    prods = jax.lax.optimization_barrier((a * b).T)   # [P, M]: products materialised (no FMA)
    # Only the positions up to the longest row i of the chunk can hold a nonzero product.
    length = jnp.max(jnp.sum(rows.idx[i] >= 0, axis=1))
    acc = jax.lax.fori_loop(0, length, lambda p, s: s + prods[p], jnp.zeros(i.shape, jnp.float32))
    s = _finish(acc, rows.round_table)
    same = i == j
    s = jnp.where(same, jnp.float32(1.0), s)
    if rows.csls:
        pair = rows.radius[i] + rows.radius[j]
        s = s - jnp.float32(0.5) * pair
        s = s + rows.rbar
        s = _finish(s, rows.round_table)
        s = jnp.where(same, jnp.float32(1.0), s)
    return jnp.where(valid, s, jnp.float32(jnp.nan))


def _pair_similarity(rows: FeatureRows, i: jax.Array, j: jax.Array, chunk: int) -> jax.Array:
    i, j = jnp.broadcast_arrays(jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32))
    shape = i.shape
    i, j = i.reshape(-1), j.reshape(-1)
    m = i.shape[0]
    if m == 0:
        return jnp.zeros(shape, jnp.float32)
    if m <= chunk:
        return _pairs_chunk(rows, i, j).reshape(shape)
    num = -(-m // chunk)
    pad = num * chunk - m
    i = jnp.pad(i, (0, pad)).reshape(num, chunk)  # padding pairs (0, 0), dropped below
    j = jnp.pad(j, (0, pad)).reshape(num, chunk)
    out = jax.lax.map(lambda ij: _pairs_chunk(rows, *ij), (i, j))
    return out.reshape(-1)[:m].reshape(shape)


_pair_similarity_jit = jax.jit(_pair_similarity, static_argnames=("chunk",))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_range(rows: FeatureRows, *arrays) -> None:
    n = rows.num_nodes
    for name, x in zip(("i", "j"), arrays):
        if _is_concrete(x):
            values = np.asarray(x)
            if not np.issubdtype(values.dtype, np.integer):
                raise ValueError(f"pair_similarity: {name} must hold integers, got {values.dtype}")
            if values.size and (values.min() < 0 or values.max() >= n):
                raise ValueError(f"pair_similarity: {name} holds node indices outside [0, {n}): "
                                 f"min {values.min()}, max {values.max()}")


def pair_similarity(rows: FeatureRows, i, j, *, chunk: int = 2048) -> jax.Array:
    """``S[i, j]`` (float32, the broadcast shape of ``i`` and ``j``), bit for bit the dense
    matrix's entry (module docstring). jit-compatible; pairs are processed ``chunk`` at a time
    (memory ~ 20 x chunk x P bytes). Out-of-range indices raise :class:`ValueError` when concrete,
    give NaN when traced."""
    _check_range(rows, i, j)
    return _pair_similarity_jit(rows, i, j, chunk=chunk)


def row_similarity(rows: FeatureRows, i, *, chunk: int = 2048) -> jax.Array:
    """The whole row ``S[i, :]`` ([N] float32) of node ``i`` (a scalar index)."""
    if _is_concrete(i) and np.ndim(i) != 0:
        raise ValueError(f"row_similarity: i must be a scalar node index, got shape {np.shape(i)}")
    return pair_similarity(rows, i, jnp.arange(rows.num_nodes, dtype=jnp.int32), chunk=chunk)
