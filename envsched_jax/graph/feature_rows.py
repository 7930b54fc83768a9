"""Entries of the dense similarity matrices ``S_full`` and ``S_abs``, computed on the fly from the
feature rows, bit for bit equal to the matrices :func:`envsched_jax.graph.build.build_graph` builds.

The dense matrices are N x N; for pools of 10^5 - 10^6 tasks they cannot exist. This module keeps
the sparse feature rows of a pool and computes any block of entries inside ``jax.jit``:

- :class:`CSRRows`: one CSR matrix X in storage order (``indptr``, ``indices``, ``data``; O(nnz)
  memory), plus the CSLS radius when the matrix is ``S_abs`` under ``hubness="csls"``;
  :meth:`CSRRows.from_csr`;
- :func:`block_similarity` (``S[rows[r], cols[c]]``, a [R, C] block; -1 pads), the fast path;
- :class:`GroupedRows` / :func:`abs_groups` / :func:`grouped_rows`: whole rows of ``S_abs`` from
  its few distinct feature rows (a U x U table of raw similarities);
- :func:`graph_feature_rows` (a :class:`GraphFeatureRows`: ``full`` for ``S_full``, ``abs`` and
  ``abs_grouped`` for ``S_abs``) from a :class:`~envsched_jax.graph.build.PoolGraph`, and
  :func:`graph_similarity` (a :class:`GraphSimilarity`: the similarity-source interface of
  :mod:`envsched_jax.sched.dense_free`, ``block`` and ``abs_rows``);
- :func:`pair_similarity` (``S[i, j]`` for broadcast index arrays) and :func:`row_similarity`
  (a whole row ``S[i, :]``), for :class:`CSRRows` and for the older padded :class:`FeatureRows`
  (ELL form, binary-search lookups: kept as an independent reference and as the benchmark's
  baseline, ``experiments/bench_feature_rows.py``).

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
   :class:`CSRRows` instead scatters the query row i into a dense value map over the F columns
   (0 where row i lacks a column) and reads it at row j's columns;
2. the products ``a_k * b_jk`` over all positions (padding and non-shared columns give exact
   zeros) are formed as one array behind :func:`jax.lax.optimization_barrier`, so that XLA cannot
   fuse the multiplication into the summation loop and LLVM cannot contract ``acc + a * b`` into a
   fused multiply-add (XLA's CPU and GPU backends both allow contraction);
3. they are summed sequentially over the positions (a ``fori_loop``); adding an exact zero leaves
   a float32 sum unchanged (``x + 0 = x``, and ``+0 + -0 = +0`` as in scipy), so the result is
   scipy's sum as long as the nonzero terms come in row i's storage order. :class:`CSRRows`
   places each product at row i's position of its column (a scatter into [P, ...]) -- or, when
   every row's storage order agrees with one global order of the columns (checked once in
   :meth:`CSRRows.from_csr`: the graph "column a stored right before column b in some row" is
   acyclic; true of scikit-learn's TF-IDF rows, whose order is the vocabulary's first-occurrence
   order), sums in row j's own storage order, which then lists the shared columns in the same
   relative order as row i (``ordered=True``: no scatter);
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

Rows with equal indices and values in the same storage order give equal sums with every other
row, so ``S_abs`` (88 distinct abstract rows among 2,550 tasks in the generated pool) is a lookup
``table[group[i], group[j]]`` of raw finished values followed by steps 5 (:class:`GroupedRows`).

The radius r (mean of the ``hubness_k`` largest raw cross-environment ``S_abs`` values) is
recomputed exactly as ``build_graph`` does (the same functions on the same matrix) or passed in.

Where exactness rests on assumptions (see also the tests): the sparse product being scipy's
``csr_matmat`` in float32 with separate multiply and add (scipy's wheels are built for baseline
x86-64, without FMA); no duplicate column in a row (checked, :class:`ValueError`); no subnormal
products (XLA flushes subnormals to zero, scipy does not; TF-IDF products are > 1e-30); XLA not
reassociating the chain of float additions of the summation loop (it does not: no fast-math by
default; the tests compare against the dense matrices). Out-of-range node indices raise
:class:`ValueError` when the indices are concrete (host) values; under ``jit`` they give NaN
(negative indices in :func:`block_similarity` / :func:`grouped_rows` are padding: 0.0).

Memory and cost
---------------
:class:`CSRRows`: ``4 (N + 1) + 8 (nnz + G)`` bytes (G = the padded row length), i.e. 4 + 8 x
(mean row length) bytes per node: at N = 2,550 about 3.3 kB per node for the stacked concrete
views (mean 417 entries; P = 836) and 219 bytes for the abstract view, against 16 P bytes (13.4 kB
and 832 bytes) for the padded :class:`FeatureRows`. Plus a 4 MB rounding table shared by all.
:func:`block_similarity` costs O(R F + R C G) work per block (F = columns of X, G ~ the longest
row: every pair reads all of row j's stored entries, shared or not) and O(F + c G) memory for one
query row against a chunk of c columns (c G bounded by ``_ELEMENT_BUDGET``). The R F term (a fresh
zeroed [F + 1] value map per query row) dominates small blocks when F is large: a 64 x 64 block of
S_full took ~5 ms at F = 81,653 (N = 2,550) and ~60 ms with the same rows widened to F = 2 x 10^6.
Tried and not faster: one map carried across the rows and reset after each (XLA did not update it
in place), and binary searches in a sorted copy of the query row instead of a map (``searchsorted``:
0.8x - 40x the map's speed).
:class:`GroupedRows`: 4 N + 4 U^2 bytes (U distinct rows); a row costs O(N).
Building (host): :meth:`CSRRows.from_csr` checks the rows in chunks of ``_CHECK_CHUNK`` entries
(duplicate columns; the storage-order check keeps the distinct "stored right before" column pairs,
at most nnz); :func:`abs_groups` hashes every row once (a Python loop over N rows).
Measured figures: ``experiments/bench_feature_rows.py``.
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

_UNROLL = 8
"""Additions per iteration of the summation loop (unrolled in order: fewer loop trips, the same
sequential sum). The gathered row width G is P rounded up to a multiple of it."""

_ELEMENT_BUDGET = 1 << 19
"""Elements of one [c, G] product array of :func:`block_similarity` (2 MiB of float32): the
column chunk size is ``_ELEMENT_BUDGET // G`` (624 columns of S_full's stacked views, 9,362 of the
abstract view). CHOICE: measured on the 2-core CPU at N = 2,550: 2^19 was the fastest of 2^19 -
2^22 for 8 x 4096 and 64 x 64 blocks (up to 1.5x; the arrays stay in cache), within noise for
1 x 4096."""

_MAP_BUDGET = 1 << 23
"""Elements of the [m, F + 1] value (and position) maps of a chunk of m pairs
(:func:`pair_similarity`)."""

_MAX_GROUPS = 20_000
"""Default largest number of distinct rows :func:`abs_groups` accepts (the table is 4 U^2 bytes:
1.6 GB at 20,000)."""


_MAX_OFFSET = int(np.iinfo(np.int32).max)
"""Largest entry offset of :class:`CSRRows` (int32: JAX's default integers without x64)."""

_CHECK_CHUNK = 1 << 22
"""Stored entries per chunk of the host-side checks (bounds their temporary memory)."""


def _row_chunks(indptr: np.ndarray):
    """``(first_row, stop_row)`` ranges of whole rows with about ``_CHECK_CHUNK`` entries each."""
    n = len(indptr) - 1
    start = 0
    while start < n:
        stop = int(np.searchsorted(indptr, indptr[start] + _CHECK_CHUNK, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        yield start, stop
        start = stop


def _check_csr(X, who: str) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``(n, f, indptr, indices, data)`` (int64, int32, float32; no copies where X's
    arrays already have those types) of a float32 CSR matrix: scipy CSR, float32, column indices in
    range, finite values, no column twice in a row (checked in chunks of rows: O(nnz) time,
    O(``_CHECK_CHUNK``) temporary memory)."""
    if not sp.issparse(X) or X.format != "csr":
        raise ValueError(f"{who} needs a scipy CSR matrix, got {type(X).__name__}"
                         + (f" ({X.format})" if sp.issparse(X) else ""))
    if X.dtype != np.float32:
        raise ValueError(f"{who} needs float32 values (the dense matrices are float32 "
                         f"products), got {X.dtype}")
    n, f = X.shape
    if f >= np.iinfo(np.int32).max:
        raise ValueError(f"{who}: {f} columns do not fit int32 indices")
    indptr = np.asarray(X.indptr, np.int64)
    nnz = int(indptr[-1])
    indices = np.asarray(X.indices[:nnz])
    data = np.asarray(X.data[:nnz], np.float32)
    if nnz and (indices.min() < 0 or indices.max() >= f):
        raise ValueError(f"{who}: column indices outside [0, {f})")
    indices = indices.astype(np.int32, copy=False)
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{who}: non-finite values")
    for first, stop in _row_chunks(indptr):
        a, b = indptr[first], indptr[stop]
        if b - a < 2:
            continue
        rows = np.repeat(np.arange(first, stop, dtype=np.int64), np.diff(indptr[first:stop + 1]))
        keys = np.sort(rows * f + indices[a:b])
        if np.any(np.diff(keys) == 0):
            raise ValueError(f"{who}: a row holds the same column twice (call "
                             "sum_duplicates() first; scipy's product order then changes)")
    return n, f, indptr, indices, data


def _check_radius(radius, n: int, who: str) -> tuple[np.ndarray, np.float32, bool]:
    """``(radius, rbar, csls)``: zeros without a radius; ``rbar`` as ``csls_correct`` computes it."""
    if radius is None:
        return np.zeros(n, np.float32), np.float32(0.0), False
    radius = np.asarray(radius)
    if radius.shape != (n,) or radius.dtype != np.float32:
        raise ValueError(f"{who}: radius must be float32 [{n}], got {radius.dtype} {radius.shape}")
    if not np.all(np.isfinite(radius)):
        raise ValueError(f"{who}: non-finite radius")
    rbar = np.float32(radius.astype(np.float64).mean()) if n else np.float32(0.0)
    return radius, rbar, True


def storage_order_is_global(indptr: np.ndarray, indices: np.ndarray, num_cols: int) -> bool:
    """Whether one total order of the columns agrees with every row's storage order: the directed
    graph with an edge a -> b whenever column a is stored right before column b in a row is
    acyclic (then a topological order is such an order, and any two rows list the columns they
    share in the same relative order). O(nnz) time; memory O(distinct edges) (collected in chunks
    of rows, then scipy's strong components)."""
    from scipy.sparse.csgraph import connected_components

    indptr = np.asarray(indptr, np.int64)
    if int(indptr[-1]) < 2 or num_cols < 2:
        return True
    edges = []
    for first, stop in _row_chunks(indptr):
        a, b = indptr[first], indptr[stop]
        if b - a < 2:
            continue
        cols = np.asarray(indices[a:b], np.int64)
        keep = np.ones(b - a - 1, bool)   # pair (e, e + 1) within one row: e + 1 starts no row
        starts = indptr[first + 1:stop] - a
        keep[starts[(starts > 0) & (starts < b - a)] - 1] = False
        edges.append(np.unique(cols[:-1][keep] * num_cols + cols[1:][keep]))
    keys = np.unique(np.concatenate(edges)) if edges else np.zeros(0, np.int64)
    if len(keys) == 0:
        return True
    src, dst = np.divmod(keys, num_cols)
    graph = sp.csr_matrix((np.ones(len(keys), np.int8), (src, dst)), shape=(num_cols, num_cols))
    count, _ = connected_components(graph, directed=True, connection="strong")
    return count == num_cols  # acyclic iff every strong component is one column (no self loops:
    # a self loop would be a column stored twice in a row, rejected before)


@struct.dataclass
class CSRRows:
    """A float32 CSR matrix X (N x F) in storage order, for entries of ``finish(X X^T)``
    (module docstring), O(nnz) memory.

    ``indptr`` [N + 1] int32; ``indices`` / ``data`` [nnz + G] int32 / float32, row i at
    ``indptr[i]:indptr[i + 1]``, padded at the end with G = :attr:`gather_width` entries (column
    0, value 0) so that a fixed-width slice of G entries from any row start is in bounds (the
    entries past a row's end are masked by its length). ``radius`` / ``rbar``: the CSLS radius per
    node and its mean (zeros unless ``csls``). ``round_table``: :data:`ROUND_TABLE`.
    Static: ``num_cols`` (F), ``width`` (P, the longest row, at least 1), ``csls``, ``ordered``
    (every row's storage order agrees with one global column order: sums in either row's order,
    module docstring 3)."""

    indptr: jax.Array       # [N + 1] int32
    indices: jax.Array      # [nnz + G] int32, storage order, padded
    data: jax.Array         # [nnz + G] float32, storage order, padded with 0
    radius: jax.Array       # [N] float32: CSLS radius r_i (zeros without CSLS)
    rbar: jax.Array         # [] float32: mean of r (0 without CSLS)
    round_table: jax.Array  # [10^6 + 1] float32
    num_cols: int = struct.field(pytree_node=False, default=0)
    width: int = struct.field(pytree_node=False, default=1)
    csls: bool = struct.field(pytree_node=False, default=False)
    ordered: bool = struct.field(pytree_node=False, default=False)

    @property
    def num_nodes(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def nnz(self) -> int:
        return self.indices.shape[0] - self.gather_width

    @property
    def gather_width(self) -> int:
        """G: the width of a row slice, P rounded up to a multiple of ``_UNROLL``."""
        return -(-self.width // _UNROLL) * _UNROLL

    def nbytes(self, include_table: bool = False) -> int:
        """Bytes of the per-node arrays (and of the shared rounding table when asked)."""
        arrays = [self.indptr, self.indices, self.data, self.radius, self.rbar]
        return int(sum(a.nbytes for a in arrays) + (self.round_table.nbytes if include_table else 0))

    @classmethod
    def from_csr(cls, X: sp.spmatrix, radius: np.ndarray | None = None,
                 round_table: jax.Array | None = None, ordered: bool | None = None) -> "CSRRows":
        """The float32 CSR matrix ``X`` in its storage order (not re-sorted).

        ``radius``: CSLS radius per node (float32 [N], :func:`~envsched_jax.graph.build.csls_radius`)
        for a CSLS-corrected ``S_abs``; ``rbar`` is computed as ``csls_correct`` does.
        ``round_table``: a device copy of :data:`ROUND_TABLE` to share between instances.
        ``ordered``: None checks :func:`storage_order_is_global` (O(nnz)); False forces the
        general path (a scatter into row i's positions); True is trusted (wrong if it is not so)."""
        who = "CSRRows.from_csr"
        n, f, indptr, indices, data = _check_csr(X, who)
        nnz = int(indptr[-1])
        lens = np.diff(indptr)
        width = max(int(lens.max()) if n else 0, 1)
        gather = -(-width // _UNROLL) * _UNROLL
        if nnz + gather > _MAX_OFFSET:
            raise ValueError(f"{who}: nnz = {nnz} (+ {gather} padding) does not fit int32 offsets "
                             "(JAX's default integers); split the matrix")
        radius, rbar, csls = _check_radius(radius, n, who)
        if ordered is None:
            ordered = storage_order_is_global(indptr, indices, f)
        table = jnp.asarray(ROUND_TABLE) if round_table is None else round_table
        return cls(indptr=jnp.asarray(indptr.astype(np.int32)),
                   indices=jnp.asarray(np.concatenate([indices, np.zeros(gather, np.int32)])),
                   data=jnp.asarray(np.concatenate([data, np.zeros(gather, np.float32)])),
                   radius=jnp.asarray(radius, jnp.float32), rbar=jnp.asarray(rbar, jnp.float32),
                   round_table=table, num_cols=int(f), width=width, csls=csls, ordered=bool(ordered))


def _gather_rows(rows: CSRRows, nodes: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Row slices of ``nodes`` ([M], already in [0, N) or -1 for none): columns [M, G] (F past a
    row's end: the value maps' always-zero sentinel column), values [M, G] (0 past the end) and
    lengths [M] (0 for -1). One ``dynamic_slice`` of G entries per node (in bounds: the arrays are
    padded by G). CHOICE: the [M, G] layout (each slice contiguous); a [G, M] layout costs a
    transpose that measured 4x the rest of a 1 x 2048 block."""
    g = rows.gather_width
    valid = nodes >= 0
    node = jnp.maximum(nodes, 0)
    start = rows.indptr[node]
    length = jnp.where(valid, rows.indptr[node + 1] - start, 0)

    def window(a):
        return jax.vmap(lambda s: jax.lax.dynamic_slice(a, (s,), (g,)))(start)

    inside = jnp.arange(g, dtype=jnp.int32)[None, :] < length[:, None]
    cols = jnp.where(inside, window(rows.indices), rows.num_cols)
    vals = jnp.where(inside, window(rows.data), jnp.float32(0.0))
    return cols, vals, length


def _sequential_sum(x: jax.Array, length: jax.Array) -> jax.Array:
    """``x[..., 0] + x[..., 1] + ... + x[..., length - 1]`` in that order (float32, from +0), ``x``
    [..., G] with G a multiple of ``_UNROLL`` and entries past ``length`` exact zeros (they may be
    added: ``length`` may round up)."""
    def body(b, acc):
        blk = jax.lax.dynamic_slice_in_dim(x, b * _UNROLL, _UNROLL, axis=x.ndim - 1)
        for u in range(_UNROLL):  # unrolled, in order: ((acc + x0) + x1) + ...
            acc = acc + blk[..., u]
        return acc

    trips = (length + _UNROLL - 1) // _UNROLL
    return jax.lax.fori_loop(0, trips, body, jnp.zeros(x.shape[:-1], jnp.float32))


def _raw_sums(rows: CSRRows, q: jax.Array, cdata) -> jax.Array:
    """Unfinished ``X X^T`` sums (module docstring 1 - 3) of query nodes ``q`` [m] with the
    gathered nodes ``cdata`` (:func:`_gather_rows`): [m] pairwise when ``cdata`` is [m, G] (pair
    k: ``q[k]`` with node k of ``cdata``); [c] for one query node (``q`` [1]) against [c, G]."""
    f, g = rows.num_cols, rows.gather_width
    qc, qv, ql = _gather_rows(rows, q)                       # [m, G]
    m = q.shape[0]
    cc, cv, cl = cdata
    # row q[k]'s values by column; column f (the sentinel of positions past a row's end) stays 0
    vmap = jnp.zeros((m, f + 1), jnp.float32).at[jnp.arange(m)[:, None], qc].set(qv)
    sel = jnp.arange(m)[:, None] if m > 1 else jnp.zeros((1, 1), jnp.int32)
    prods = vmap[sel, cc] * cv                               # row j's storage order
    if rows.ordered:
        x = jax.lax.optimization_barrier(prods)
        length = jnp.max(cl, initial=0)
    else:
        # place each product at row i's position of its column (G: not shared, dropped)
        p = jnp.arange(g, dtype=jnp.int32)[None, :]
        pmap = jnp.full((m, f + 1), g, jnp.int32).at[jnp.arange(m)[:, None], qc].set(jnp.where(p < ql[:, None], p, g))
        pos = pmap[sel, cc]
        x = jnp.zeros(prods.shape, jnp.float32).at[jnp.arange(prods.shape[0])[:, None], pos].set(prods, mode="drop")
        x = jax.lax.optimization_barrier(x)
        length = jnp.max(ql, initial=0)
    return _sequential_sum(x, length)


class QueryMaps(NamedTuple):
    """Query rows prepared once for many blocks (:func:`query_maps`): the value map of each row
    over the F columns (and its position map when the rows are not ``ordered``). A pytree: it can
    be carried through loops, e.g. the batch's rows through the greedy selection."""

    q: jax.Array        # [R] int32 node indices (-1: padding)
    vmap: jax.Array     # [R, F + 1] float32: row q[r]'s value at each column (0 where absent)
    pmap: jax.Array     # [R, F + 1] int32: its storage position (G where absent); [R, 0] if ordered
    length: jax.Array   # [R] int32: row lengths


def query_maps(rows: CSRRows, q: jax.Array) -> QueryMaps:
    """The value (and position) maps of query rows ``q`` [R] (-1: padding, an all-zero map)."""
    q = jnp.asarray(q, jnp.int32).reshape(-1)
    f, g = rows.num_cols, rows.gather_width
    qc, qv, ql = _gather_rows(rows, jnp.where(q < rows.num_nodes, q, -1))
    r = jnp.arange(q.shape[0])[:, None]
    vmap = jnp.zeros((q.shape[0], f + 1), jnp.float32).at[r, qc].set(qv)
    if rows.ordered:
        pmap = jnp.zeros((q.shape[0], 0), jnp.int32)
    else:
        p = jnp.arange(g, dtype=jnp.int32)[None, :]
        pmap = jnp.full((q.shape[0], f + 1), g, jnp.int32).at[r, qc].set(jnp.where(p < ql[:, None], p, g))
    return QueryMaps(q, vmap, pmap, ql)


def column_data(rows: CSRRows, c: jax.Array):
    """The gathered entries of column nodes ``c`` [C] (-1: padding), for :func:`block_from_maps`."""
    c = jnp.asarray(c, jnp.int32).reshape(-1)
    return _gather_rows(rows, jnp.where(c < rows.num_nodes, c, -1))


def block_from_maps(rows: CSRRows, maps: QueryMaps, c: jax.Array, cdata, which: jax.Array | None = None) -> jax.Array:
    """:func:`block_similarity` ``(rows, maps.q[which], c)`` from prepared query maps and column
    data (:func:`query_maps`, :func:`column_data`): the same finished [W, C] entries, without
    building a value map per call. ``which`` (default: all) indexes the prepared rows; the maps
    are read in place (gathers), never sliced out (a copy of F entries per row)."""
    c = jnp.asarray(c, jnp.int32).reshape(-1)
    which = jnp.arange(maps.q.shape[0]) if which is None else jnp.asarray(which, jnp.int32).reshape(-1)
    cc, cv, cl = cdata
    g = rows.gather_width

    def one(k):
        prods = maps.vmap[k, cc] * cv                                   # [C, G], row j's order
        pos = maps.pmap[k, cc]
        x = jnp.zeros(prods.shape, jnp.float32).at[jnp.arange(prods.shape[0])[:, None], pos].set(
            prods, mode="drop")
        x = jax.lax.optimization_barrier(x)
        return _sequential_sum(x, jnp.minimum(maps.length[k], g))

    if rows.ordered:   # every row at once: one summation loop over [W, C] sums
        prods = maps.vmap[which[:, None, None], cc[None]] * cv[None]     # [W, C, G], row j's order
        raw = _sequential_sum(jax.lax.optimization_barrier(prods), jnp.minimum(jnp.max(cl, initial=0), g))
    else:
        raw = one(which[0])[None] if which.shape[0] == 1 else jax.lax.map(one, which)
    return _finish_entries(rows, raw, maps.q[which][:, None], c[None, :])


def _finish_entries(rows: CSRRows, raw: jax.Array, q: jax.Array, c: jax.Array) -> jax.Array:
    """Finished entries from raw sums ``raw`` of query nodes ``q`` with column nodes ``c``
    (broadcast against ``raw``): rounding, unit diagonal, CSLS, 0 where an index is -1, NaN where
    one is out of range."""
    s = _finish(raw, rows.round_table)
    n = rows.num_nodes
    qv, cv_ = jnp.where(q < n, q, -1), jnp.where(c < n, c, -1)
    s = _diag_csls(s, q == c, rows.radius[jnp.maximum(qv, 0)], rows.radius[jnp.maximum(cv_, 0)],
                   rows.rbar, rows.csls, rows.round_table)
    s = jnp.where((q >= 0) & (c >= 0), s, jnp.float32(0.0))
    return jnp.where((q >= n) | (c >= n), jnp.float32(jnp.nan), s)


def pairs_from_maps(rows: CSRRows, maps: QueryMaps, which: jax.Array, c: jax.Array, cdata) -> jax.Array:
    """Entries ``S[maps.q[which[p]], c[p]]`` of P pairs ([P]) from prepared query maps and the
    pairs' column data (``cdata``: :func:`column_data` of ``c``, [P, G]): the values
    :func:`block_from_maps` gives, with work per pair rather than per (row, column) of a block."""
    which = jnp.asarray(which, jnp.int32).reshape(-1)
    c = jnp.asarray(c, jnp.int32).reshape(-1)
    cc, cv, cl = cdata
    g = rows.gather_width
    prods = maps.vmap[which[:, None], cc] * cv                           # [P, G], row j's order
    if rows.ordered:
        x = jax.lax.optimization_barrier(prods)
        length = jnp.minimum(jnp.max(cl, initial=0), g)
    else:
        pos = maps.pmap[which[:, None], cc]
        x = jnp.zeros(prods.shape, jnp.float32).at[jnp.arange(prods.shape[0])[:, None], pos].set(
            prods, mode="drop")
        x = jax.lax.optimization_barrier(x)
        length = jnp.minimum(jnp.max(maps.length[which], initial=0), g)
    return _finish_entries(rows, _sequential_sum(x, length), maps.q[which], c)


def _finish(x: jax.Array, table: jax.Array) -> jax.Array:
    """``_finish_block``: clip into [0, 1], then numpy's float32 ``round(x, 6)`` (module docstring, 4)."""
    x = jnp.clip(x, jnp.float32(0.0), jnp.float32(1.0))
    k = jax.lax.round(x * jnp.float32(1e6), jax.lax.RoundingMethod.TO_NEAREST_EVEN)
    return table[k.astype(jnp.int32)]


def _diag_csls(s: jax.Array, same: jax.Array, ri: jax.Array, rj: jax.Array, rbar: jax.Array,
               csls: bool, table: jax.Array) -> jax.Array:
    """Steps 5 of the module docstring on finished raw values ``s``: unit diagonal, then (with
    ``csls``) ``s - 0.5 (r_i + r_j) + rbar``, finished, unit diagonal again (``csls_correct``)."""
    s = jnp.where(same, jnp.float32(1.0), s)
    if csls:
        s = s - jnp.float32(0.5) * (ri + rj)
        s = s + rbar
        s = _finish(s, table)
        s = jnp.where(same, jnp.float32(1.0), s)
    return s


def _chunks(x: jax.Array, size: int) -> tuple[jax.Array, int]:
    """``x`` [M] padded with -1 to a multiple of ``size`` and reshaped [M / size, size]."""
    num = -(-x.shape[0] // size)
    return jnp.pad(x, (0, num * size - x.shape[0]), constant_values=-1).reshape(num, size), num


def _map(fn, xs: jax.Array, num: int) -> jax.Array:
    """``lax.map(fn, xs)``, without a loop for one chunk."""
    return fn(xs[0])[None] if num == 1 else jax.lax.map(fn, xs)


def _block_raw(rows: CSRRows, q: jax.Array, c: jax.Array) -> jax.Array:
    """Finished raw ``S[q[r], c[k]]`` (no diagonal, no CSLS; 0 where an index is -1), [R, C].
    Columns in chunks of at most ``_ELEMENT_BUDGET / G`` (gathered once per chunk), then one query
    row at a time (``lax.map``). CHOICE: one row at a time; an [r, c, G] product array for several
    rows at once measured 4 - 6x slower per pair than r = 1 on the 2-core CPU (it leaves the caches),
    and a value map carried across rows (reset after each) was no faster than a fresh one."""
    n_r, n_c = q.shape[0], c.shape[0]
    if n_r == 0 or n_c == 0:
        return jnp.zeros((n_r, n_c), jnp.float32)
    c_size = max(1, min(n_c, _ELEMENT_BUDGET // rows.gather_width))
    c_chunks, c_num = _chunks(c, c_size)

    def col_chunk(cols):
        cdata = _gather_rows(rows, cols)
        return _map(lambda i: _raw_sums(rows, i[None], cdata), q, n_r)          # [R, c]

    out = _map(col_chunk, c_chunks, c_num)                                     # [cn, R, c]
    out = out.transpose(1, 0, 2).reshape(n_r, c_num * c_size)[:, :n_c]
    return _finish(out, rows.round_table)


def _block_similarity(rows: CSRRows, q: jax.Array, c: jax.Array) -> jax.Array:
    n = rows.num_nodes
    q = jnp.asarray(q, jnp.int32).reshape(-1)
    c = jnp.asarray(c, jnp.int32).reshape(-1)
    bad_q, bad_c = q >= n, c >= n
    qv = jnp.where(bad_q, -1, q)
    cv = jnp.where(bad_c, -1, c)
    s = _block_raw(rows, qv, cv)
    same = q[:, None] == c[None, :]
    s = _diag_csls(s, same, rows.radius[jnp.maximum(qv, 0)][:, None], rows.radius[jnp.maximum(cv, 0)][None, :],
                   rows.rbar, rows.csls, rows.round_table)
    s = jnp.where((q[:, None] >= 0) & (c[None, :] >= 0), s, jnp.float32(0.0))
    return jnp.where(bad_q[:, None] | bad_c[None, :], jnp.float32(jnp.nan), s)


_block_similarity_jit = jax.jit(_block_similarity)


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_nodes(who: str, n: int, allow_negative: bool, **arrays) -> None:
    """Integer node indices below n (and >= 0 unless ``allow_negative``) when concrete."""
    for name, x in arrays.items():
        if _is_concrete(x):
            values = np.asarray(x)
            if not np.issubdtype(values.dtype, np.integer):
                raise ValueError(f"{who}: {name} must hold integers, got {values.dtype}")
            low = values.min() < 0 and not allow_negative if values.size else False
            if values.size and (low or values.max() >= n):
                raise ValueError(f"{who}: {name} holds node indices outside "
                                 f"{'[-1' if allow_negative else '[0'}, {n}): min {values.min()}, "
                                 f"max {values.max()}")


def block_similarity(rows: CSRRows, q, c) -> jax.Array:
    """``S[q[r], c[k]]`` for node vectors ``q`` [R] and ``c`` [C]: a float32 [R, C] block, bit for bit
    the dense matrix's entries (module docstring). An entry is 0.0 where ``q[r]`` or ``c[k]`` is
    negative (padding). jit-compatible with traced ``q`` / ``c`` (shapes static); indices >= N
    raise :class:`ValueError` when concrete and give NaN when traced.

    Per query row (one at a time) and chunk of column nodes: the row's values are scattered into a
    dense [F + 1] map, each column node's G stored entries are read through it (the products
    a_ik b_jk, exact zeros where not shared), and the products are summed in storage order (module
    docstring 3). Work O(R (F + C G)), memory O(F + C + c G) (``_ELEMENT_BUDGET``) besides the
    [R, C] result."""
    _check_nodes("block_similarity", rows.num_nodes, True, q=q, c=c)
    return _block_similarity_jit(rows, q, c)


@struct.dataclass
class GroupedRows:
    """Whole rows of ``finish(X X^T)`` (diagonal, CSLS) when X has few distinct rows (module
    docstring): ``group`` [N] int32 (nodes with equal indices and values in the same storage order
    share a group, numbered by first occurrence), ``table`` [U, U] float32 the finished raw
    similarities of the distinct rows (no unit diagonal: two nodes of one group are not one node),
    ``distinct`` the U distinct rows (:class:`CSRRows`, no radius), ``radius`` / ``rbar`` as in
    :class:`CSRRows`. Memory 4 N + 4 U^2 bytes (+ the distinct rows)."""

    group: jax.Array        # [N] int32
    table: jax.Array        # [U, U] float32, finished raw similarities
    distinct: CSRRows       # the U distinct rows
    radius: jax.Array       # [N] float32
    rbar: jax.Array         # [] float32
    round_table: jax.Array  # [10^6 + 1] float32
    csls: bool = struct.field(pytree_node=False, default=False)

    @property
    def num_nodes(self) -> int:
        return self.group.shape[0]

    @property
    def num_groups(self) -> int:
        return self.table.shape[0]


def abs_groups(X: sp.spmatrix, radius: np.ndarray | None = None, round_table: jax.Array | None = None,
               max_groups: int = _MAX_GROUPS) -> GroupedRows:
    """:class:`GroupedRows` of the float32 CSR matrix ``X`` (validated as in
    :meth:`CSRRows.from_csr`), the CSLS ``radius`` as there. The table is computed with
    :func:`block_similarity`'s exact kernel. Raises :class:`ValueError` when X has more than
    ``max_groups`` distinct rows (the caller then uses :func:`block_similarity` over all columns).
    O(nnz) host work (a dict over the rows' bytes) plus O(U^2 G) for the table."""
    who = "abs_groups"
    n, f, indptr, indices, data = _check_csr(X, who)
    radius, rbar, csls = _check_radius(radius, n, who)
    seen: dict[bytes, int] = {}
    group = np.empty(n, np.int32)
    first = []
    for i in range(n):
        a, b = indptr[i], indptr[i + 1]
        key = indices[a:b].tobytes() + data[a:b].tobytes()  # equal keys: equal rows, same order
        gid = seen.get(key)
        if gid is None:
            gid = seen[key] = len(first)
            first.append(i)
            if len(first) > max_groups:
                raise ValueError(f"abs_groups: more than max_groups = {max_groups} distinct rows "
                                 f"(U > {max_groups} at row {i} of {n}); use block_similarity "
                                 "over all columns instead")
        group[i] = gid
    u = len(first)
    table = jnp.asarray(ROUND_TABLE) if round_table is None else round_table
    distinct = CSRRows.from_csr(X[np.asarray(first, np.int64)], round_table=table)
    ids = jnp.arange(u, dtype=jnp.int32)
    sim = jax.jit(_block_raw)(distinct, ids, ids) if u else jnp.zeros((0, 0), jnp.float32)
    return GroupedRows(group=jnp.asarray(group), table=sim, distinct=distinct,
                       radius=jnp.asarray(radius, jnp.float32), rbar=jnp.asarray(rbar, jnp.float32),
                       round_table=table, csls=csls)


def _grouped_rows(g: GroupedRows, q: jax.Array) -> jax.Array:
    n = g.num_nodes
    q = jnp.asarray(q, jnp.int32).reshape(-1)
    bad = q >= n
    node = jnp.clip(q, 0, n - 1)
    # [R, N], one row at a time (lax.map of a 1-D take, mode="clip": the indices are in range by
    # construction). CHOICE: a 2-D gather is laid out [N, R] by XLA CPU and transposed inside
    # every fusion that reads it (44 ms at R = 64, N = 100,000, twice in the observation update)
    s = jax.lax.map(lambda r: jnp.take(r, g.group, mode="clip"), g.table[g.group[node]])
    same = node[:, None] == jnp.arange(n, dtype=jnp.int32)[None, :]
    s = _diag_csls(s, same, g.radius[node][:, None], g.radius[None, :], g.rbar, g.csls, g.round_table)
    s = jnp.where(q[:, None] >= 0, s, jnp.float32(0.0))
    return jnp.where(bad[:, None], jnp.float32(jnp.nan), s)


_grouped_rows_jit = jax.jit(_grouped_rows)


def grouped_rows(g: GroupedRows, q) -> jax.Array:
    """Rows ``S[q[r], :]`` ([R, N] float32) bit for bit, from the group table: the raw finished
    value ``table[group[i], group[j]]``, the unit diagonal, then the CSLS steps (module docstring
    5). A negative ``q[r]`` (padding) gives a row of zeros; indices >= N raise when concrete and
    give NaN rows when traced. O(R N) work and memory."""
    _check_nodes("grouped_rows", g.num_nodes, True, q=q)
    return _grouped_rows_jit(g, q)


_PAD_SORTED = np.iinfo(np.int32).max  # padding of the sorted column indices: after every column


@struct.dataclass
class FeatureRows:
    """A float32 CSR matrix X (N x F) in padded (ELL) form, for entries of ``finish(X X^T)``: the
    older layout (16 P bytes per node, binary-search lookups, ~41k pairs/s at N = 2,550), kept as
    an independent reference for tests and as the benchmark's baseline; prefer :class:`CSRRows`.

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
        n, f, indptr, indices, data = _check_csr(X, "FeatureRows.from_csr")
        nnz = int(indptr[-1])
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
        sidx = np.full((n, width), _PAD_SORTED, np.int32)
        sval = np.zeros((n, width), np.float32)
        sidx[rows, pos] = s_cols
        sval[rows, pos] = data[order]
        radius, rbar, csls = _check_radius(radius, n, "FeatureRows.from_csr")
        table = jnp.asarray(ROUND_TABLE) if round_table is None else round_table
        return cls(idx=jnp.asarray(idx), val=jnp.asarray(val), sidx=jnp.asarray(sidx),
                   sval=jnp.asarray(sval), radius=jnp.asarray(radius, jnp.float32),
                   rbar=jnp.asarray(rbar, jnp.float32), round_table=table, num_cols=int(f), csls=csls)


class GraphFeatureRows(NamedTuple):
    """The feature rows of a graph's two similarity matrices."""

    full: CSRRows                     # S_full: the stacked, weighted concrete views
    abs: CSRRows                      # S_abs: the abstract view (CSLS-corrected when configured)
    abs_grouped: GroupedRows | None   # S_abs by distinct rows; None when there are too many


def _graph_matrices(graph, radius: np.ndarray | None):
    """``(concrete, abstract, radius)`` of a graph (see :func:`graph_feature_rows`)."""
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
    return concrete, abstract, radius


def graph_feature_rows(graph, radius: np.ndarray | None = None,
                       max_groups: int = _MAX_GROUPS) -> GraphFeatureRows:
    """:class:`CSRRows` of ``graph``'s ``S_full`` and ``S_abs``, and :class:`GroupedRows` of
    ``S_abs`` (None with more than ``max_groups`` distinct abstract rows): a :class:`GraphFeatureRows`.

    ``S_full``'s matrix is :func:`~envsched_jax.graph.build.stack_views` of the concrete views in
    ``GraphConfig.concrete_weights()`` order, as ``build_graph`` stacks them (the semantic view
    included when ``semantic_view`` is on: its features are in ``graph.features``). Under
    ``hubness="csls"`` the radius is recomputed as ``build_graph`` computes it (raw
    cross-environment candidates, then :func:`~envsched_jax.graph.build.csls_radius`; as costly as
    that step of the build) unless ``radius`` is given."""
    concrete, abstract, radius = _graph_matrices(graph, radius)
    table = jnp.asarray(ROUND_TABLE)
    try:
        grouped = abs_groups(abstract, radius=radius, round_table=table, max_groups=max_groups)
    except ValueError as err:
        if "max_groups" not in str(err):
            raise
        grouped = None
    return GraphFeatureRows(full=CSRRows.from_csr(concrete, round_table=table),
                            abs=CSRRows.from_csr(abstract, radius=radius, round_table=table),
                            abs_grouped=grouped)


@struct.dataclass
class GraphSimilarity:
    """The similarity source of :mod:`envsched_jax.sched.dense_free` from feature rows:
    ``block(rows, cols)`` = ``S_full[rows[r], cols[c]]`` (0 where an index is -1) and
    ``abs_rows(rows)`` = ``S_abs[rows[r], :]`` (zeros for a -1 row), bit for bit the dense
    matrices, jit-compatible. ``abs_rows`` uses the grouped table when there is one, else
    :func:`block_similarity` over all N columns."""

    full: CSRRows
    abs: CSRRows
    abs_grouped: GroupedRows | None = None

    @property
    def num_nodes(self) -> int:
        return self.full.num_nodes

    def block(self, rows: jax.Array, cols: jax.Array) -> jax.Array:
        return block_similarity(self.full, rows, cols)

    def prepare_rows(self, rows: jax.Array) -> QueryMaps:
        """``S_full`` query rows prepared for :meth:`pairs_prepared` (:func:`query_maps`)."""
        return query_maps(self.full, rows)

    def prepare_cols(self, cols: jax.Array):
        return column_data(self.full, cols)

    def pairs_prepared(self, maps: QueryMaps, which: jax.Array, cols: jax.Array, cdata) -> jax.Array:
        """Entries of pairs (prepared row ``which[p]``, column ``cols[p]``), ``cdata`` the
        pairs' prepared columns (:func:`pairs_from_maps`): the same values as :meth:`block`."""
        return pairs_from_maps(self.full, maps, which, cols, cdata)

    def abs_rows(self, rows: jax.Array) -> jax.Array:
        if self.abs_grouped is not None:
            return grouped_rows(self.abs_grouped, rows)
        return block_similarity(self.abs, rows, jnp.arange(self.abs.num_nodes, dtype=jnp.int32))


def graph_similarity(graph, radius: np.ndarray | None = None, max_groups: int = _MAX_GROUPS) -> GraphSimilarity:
    """A :class:`GraphSimilarity` of ``graph`` (:func:`graph_feature_rows`)."""
    full, abs_, grouped = graph_feature_rows(graph, radius=radius, max_groups=max_groups)
    return GraphSimilarity(full=full, abs=abs_, abs_grouped=grouped)


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
    """Finished S[i, j] for flat index vectors, padded rows (the exactness steps of the module docstring)."""
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
    s = _diag_csls(_finish(acc, rows.round_table), i == j, rows.radius[i], rows.radius[j], rows.rbar,
                   rows.csls, rows.round_table)
    return jnp.where(valid, s, jnp.float32(jnp.nan))


def _csr_pairs_chunk(rows: CSRRows, i: jax.Array, j: jax.Array) -> jax.Array:
    """Finished S[i, j] for flat index vectors, CSR rows (one value map per pair)."""
    n = rows.num_nodes
    valid = (i >= 0) & (i < n) & (j >= 0) & (j < n)
    i = jnp.where(valid, i, -1)
    j = jnp.where(valid, j, -1)
    raw = _raw_sums(rows, i, _gather_rows(rows, j))
    s = _diag_csls(_finish(raw, rows.round_table), i == j, rows.radius[jnp.maximum(i, 0)],
                   rows.radius[jnp.maximum(j, 0)], rows.rbar, rows.csls, rows.round_table)
    return jnp.where(valid, s, jnp.float32(jnp.nan))


def _pair_similarity(rows, i: jax.Array, j: jax.Array, chunk: int) -> jax.Array:
    i, j = jnp.broadcast_arrays(jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32))
    shape = i.shape
    i, j = i.reshape(-1), j.reshape(-1)
    m = i.shape[0]
    if m == 0:
        return jnp.zeros(shape, jnp.float32)
    if isinstance(rows, CSRRows):
        fn = _csr_pairs_chunk
        chunk = max(1, min(chunk, _MAP_BUDGET // (rows.num_cols + 1), _ELEMENT_BUDGET // rows.gather_width))
    else:
        fn = _pairs_chunk
    if m <= chunk:
        return fn(rows, i, j).reshape(shape)
    num = -(-m // chunk)
    pad = num * chunk - m
    i = jnp.pad(i, (0, pad)).reshape(num, chunk)  # padding pairs (0, 0), dropped below
    j = jnp.pad(j, (0, pad)).reshape(num, chunk)
    out = jax.lax.map(lambda ij: fn(rows, *ij), (i, j))
    return out.reshape(-1)[:m].reshape(shape)


_pair_similarity_jit = jax.jit(_pair_similarity, static_argnames=("chunk",))


def pair_similarity(rows: CSRRows | FeatureRows, i, j, *, chunk: int = 2048) -> jax.Array:
    """``S[i, j]`` (float32, the broadcast shape of ``i`` and ``j``), bit for bit the dense
    matrix's entry (module docstring). jit-compatible; pairs are processed ``chunk`` at a time
    (for :class:`CSRRows` at most ``_MAP_BUDGET / (F + 1)``: one value map per pair; an outer
    product of blocks is much faster with :func:`block_similarity`). Out-of-range indices
    (negative included) raise :class:`ValueError` when concrete, give NaN when traced."""
    _check_nodes("pair_similarity", rows.num_nodes, False, i=i, j=j)
    return _pair_similarity_jit(rows, i, j, chunk=chunk)


def row_similarity(rows: CSRRows | FeatureRows, i, *, chunk: int = 2048) -> jax.Array:
    """The whole row ``S[i, :]`` ([N] float32) of node ``i`` (a scalar index); for
    :class:`CSRRows` through :func:`block_similarity` (``chunk`` unused)."""
    if _is_concrete(i) and np.ndim(i) != 0:
        raise ValueError(f"row_similarity: i must be a scalar node index, got shape {np.shape(i)}")
    if isinstance(rows, CSRRows):
        _check_nodes("row_similarity", rows.num_nodes, False, i=i)
        q = jnp.asarray(i, jnp.int32).reshape(1)
        return block_similarity(rows, q, jnp.arange(rows.num_nodes, dtype=jnp.int32))[0]
    return pair_similarity(rows, i, jnp.arange(rows.num_nodes, dtype=jnp.int32), chunk=chunk)
