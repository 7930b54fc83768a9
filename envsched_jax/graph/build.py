"""Build the static dual-relation graph of a pool (eq. 1, appendix D).

- Six concrete TF-IDF views with weights ``alpha`` give ``S_full = sum_a alpha_a cos(h_a)``.
- The abstract operation description gives ``S_abs = cos(g)``.
- Within-environment relations use ``S_full``; cross-environment relations use ``S_abs``.

Two outputs, for two scales:

- dense float32 ``S_full`` and ``S_abs`` (N x N) for N up to ``GraphConfig.dense_max_nodes``
  (20,000 by default: two matrices of 1.6 GB each), computed in row blocks;
- for any N, per-node candidate neighbour lists: the top ``num_candidates`` nodes of the same
  environment by ``S_full`` and of other environments by ``S_abs``, computed in row blocks so that
  memory stays bounded by ``block_size x N`` floats.

At very large N (1,000,000 tasks) the in-memory ``Pool`` itself outgrows the machine (about
13 KB of Python objects per generated task), so :func:`build_graph_stream` builds the same graph
from a pool produced environment by environment (:class:`PoolSource`, e.g.
``envsched_jax.pool.generator.generated_pool_stream``), keeping only what the graph holds;
``build_graph(pool)`` runs the same code over the in-memory pool.

Two options beyond the paper, both off by default (so the default graph is the paper's):

- ``semantic_view``: a dense sentence-embedding view of the instruction
  (:mod:`envsched_jax.graph.semantic`, all-MiniLM-L6-v2), either replacing the character view
  (``"replace_chars"``: it takes alpha_2) or added as a seventh view (``"add"``: weight
  ``semantic_weight``, the six paper weights scaled by ``1 - semantic_weight``).
- ``hubness="csls"``: a CSLS-style correction of ``S_abs`` (Conneau et al., 2018, adapted to
  similarities in [0, 1]): with ``r_i`` the mean of node i's ``hubness_k`` largest
  cross-environment ``S_abs`` values and ``rbar`` the mean of r,
  ``S'_ij = clip(S_ij - (r_i + r_j) / 2 + rbar, 0, 1)`` (diagonal 1, rounded to 6 decimals).
  A node similar to everything (a hub) is pulled down; the shift by ``rbar`` keeps the typical
  value where it was, so the scheduler's similarity-weighted propagation keeps its scale. Only
  the cross relation reads ``S_abs``. ``r_i + r_j`` is computed before halving, so S' stays
  exactly symmetric.

Every TF-IDF encoder uses scikit-learn's ``TfidfVectorizer`` with ``min_df=1``,
``max_features=35000`` and ``sublinear_tf=True`` (appendix D); rows are L2-normalised, so cosine
similarity is a dot product. A node whose text in some view is empty has a zero row there: its
similarity to others in that view is 0 and, by definition, 1 to itself (unit diagonal).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.utils.extmath import safe_sparse_dot

from envsched_jax.graph.extract import Extraction, analyse_environment, extract
from envsched_jax.graph.views import VIEW_NAMES, NodeViews, node_views
from envsched_jax.pool.model import Environment, Pool, Task, _canonical

PAPER_VIEW_WEIGHTS = (0.28, 0.08, 0.16, 0.12, 0.16, 0.20)


@dataclasses.dataclass(frozen=True)
class GraphConfig:
    """Static-graph settings; defaults are the paper's (appendix D) where it gives one."""

    view_weights: tuple[float, float, float, float, float, float] = PAPER_VIEW_WEIGHTS
    """alpha: weights of the six concrete views in S_full (paper: 0.28 0.08 0.16 0.12 0.16 0.20)."""
    max_features: int = 35_000
    """Feature cap of every TF-IDF encoder (paper: 35,000)."""
    min_df: int = 1
    """Minimum document frequency (paper: 1)."""
    num_candidates: int = 32
    """Candidate neighbours kept per node and relation (>= the scheduler's K_within / K_cross)."""
    dense: Literal["auto", "always", "never"] = "auto"
    """Dense N x N matrices: 'auto' builds them up to dense_max_nodes."""
    dense_max_nodes: int = 20_000
    """Largest N for which 'auto' builds the dense matrices."""
    block_size: int = 1024
    """Rows per block when computing similarities (bounds memory to block_size x N floats)."""
    semantic_view: Literal["off", "replace_chars", "add"] = "off"
    """Beyond the paper: a sentence-embedding view of the instruction (module docstring);
    'replace_chars' gives it the character view's weight, 'add' makes it a seventh view."""
    semantic_weight: float = 0.16
    """Weight of the seventh view when semantic_view='add' (our choice: the paper's middle weight);
    the six paper weights are scaled by 1 - semantic_weight."""
    semantic_cache_dir: str | None = None
    """Directory of the embedding cache (a pool is embedded once); None: no cache."""
    hubness: Literal["none", "csls"] = "none"
    """Beyond the paper: 'csls' corrects S_abs for hubness (module docstring)."""
    hubness_k: int = 12
    """Neighbourhood size of the CSLS radius r_i (default: the scheduler's K_cross)."""

    def __post_init__(self):
        if len(self.view_weights) != 6 or any(w < 0 for w in self.view_weights):
            raise ValueError(f"view_weights must be six non-negative numbers, got {self.view_weights}")
        if abs(sum(self.view_weights) - 1.0) > 1e-6:
            raise ValueError(f"view_weights must sum to 1 (so S_full lies in [0, 1]), got "
                             f"{sum(self.view_weights):.6f}")
        if self.semantic_view not in ("off", "replace_chars", "add"):
            raise ValueError(f"semantic_view must be 'off', 'replace_chars' or 'add', got {self.semantic_view!r}")
        if not 0.0 < self.semantic_weight < 1.0:
            raise ValueError(f"semantic_weight must lie in (0, 1), got {self.semantic_weight}")
        if self.hubness not in ("none", "csls"):
            raise ValueError(f"hubness must be 'none' or 'csls', got {self.hubness!r}")
        for name in ("max_features", "min_df", "num_candidates", "dense_max_nodes", "block_size", "hubness_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dense not in ("auto", "always", "never"):
            raise ValueError(f"dense must be 'auto', 'always' or 'never', got {self.dense!r}")

    def concrete_weights(self) -> dict[str, float]:
        """Weight of every concrete view in S_full, the semantic view included when it is on."""
        weights = dict(zip(VIEW_NAMES, self.view_weights))
        if self.semantic_view == "replace_chars":
            weights["semantic"] = weights.pop("instruction_chars")
        elif self.semantic_view == "add":
            weights = {name: (1.0 - self.semantic_weight) * w for name, w in weights.items()}
            weights["semantic"] = self.semantic_weight
        return weights


def _vectorizer(view: str, config: GraphConfig) -> TfidfVectorizer:
    common = dict(min_df=config.min_df, max_features=config.max_features, sublinear_tf=True,
                  dtype=np.float32)
    if view == "instruction_words":
        return TfidfVectorizer(analyzer="word", ngram_range=(1, 2), **common)
    if view == "instruction_chars":
        return TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), **common)
    if view == "check_text":
        return TfidfVectorizer(analyzer="word", ngram_range=(1, 2), **common)
    if view == "initial_context":  # JSON text: default word tokens drop the punctuation
        return TfidfVectorizer(analyzer="word", **common)
    # Structured views: whitespace/';'-separated tokens kept verbatim (case and underscores matter).
    ngrams = (1, 2) if view in ("operations", "abstract") else (1, 1)
    return TfidfVectorizer(analyzer="word", token_pattern=r"[^\s;]+", lowercase=False,
                           ngram_range=ngrams, **common)


def encode_view(texts: Sequence[str], view: str, config: GraphConfig) -> sp.csr_matrix:
    """TF-IDF matrix (N x F, float32, rows L2-normalised) of one view; N x 0 if it has no terms."""
    try:
        return _vectorizer(view, config).fit_transform(texts).tocsr()
    except ValueError as err:  # every document empty (e.g. a pool without check text)
        if "empty vocabulary" not in str(err):
            raise
        return sp.csr_matrix((len(texts), 0), dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class PoolGraph:
    """The static dual-relation graph of a pool. Node ``i`` is ``pool.tasks[i]``.

    ``within_idx[i]`` / ``cross_idx[i]``: candidate neighbours (sorted by decreasing similarity,
    padded with -1), with similarities in ``within_sim`` / ``cross_sim`` (0 where padded).
    """

    task_ids: tuple[str, ...]
    env_ids: tuple[str, ...]
    env_index: np.ndarray            # [N] int32, index into env_ids
    within_idx: np.ndarray           # [N, M] int32
    within_sim: np.ndarray           # [N, M] float32
    cross_idx: np.ndarray            # [N, M] int32
    cross_sim: np.ndarray            # [N, M] float32
    s_full: np.ndarray | None        # [N, N] float32 or None
    s_abs: np.ndarray | None         # [N, N] float32 or None
    features: dict[str, sp.csr_matrix] = dataclasses.field(repr=False, compare=False)
    abstract_texts: tuple[str, ...] = dataclasses.field(repr=False, compare=False, default=())
    config: GraphConfig = GraphConfig()
    pool_name: str = ""
    pool_hash: str = ""
    timings: dict[str, float] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def num_nodes(self) -> int:
        return len(self.task_ids)

    def feature_bytes(self) -> int:
        """Bytes held by the sparse TF-IDF feature matrices (data + indices + indptr)."""
        return int(sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in self.features.values()))

    def dense_bytes(self) -> int:
        return int(sum(m.nbytes for m in (self.s_full, self.s_abs) if m is not None))

    def candidate_bytes(self) -> int:
        return int(sum(a.nbytes for a in (self.within_idx, self.within_sim, self.cross_idx, self.cross_sim)))


def _progress(items: Iterable, description: str, total: int, enabled: bool) -> Iterable:
    """A rich progress bar over ``items`` when enabled and attached to a terminal."""
    from rich.console import Console

    if not enabled or not Console().is_terminal:
        return items
    from rich.progress import track

    return track(items, description=description, total=total, transient=True)


class _Bar:
    """A rich progress bar advanced by hand (``advance(k)``), shown when enabled and attached to a
    terminal; a no-op otherwise. Used as a context manager."""

    def __init__(self, description: str, total: int, enabled: bool):
        self._progress = None
        if enabled:
            from rich.console import Console

            if Console().is_terminal:
                from rich.progress import Progress, TimeElapsedColumn

                self._progress = Progress(*Progress.get_default_columns(), TimeElapsedColumn(), transient=True)
                self._task = self._progress.add_task(description, total=total)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, k: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, k)


def stack_views(features: Sequence[sp.csr_matrix], weights: Sequence[float]) -> sp.csr_matrix:
    """``Z = [sqrt(w_1) X_1, ..., sqrt(w_6) X_6]``, so that ``Z Z^T = sum_a w_a X_a X_a^T``:
    the weighted sum of the six cosine matrices is one sparse product instead of six."""
    parts = [np.float32(np.sqrt(w)) * X for X, w in zip(features, weights) if w > 0 and X.shape[1] > 0]
    if not parts:
        return sp.csr_matrix((features[0].shape[0], 0), dtype=np.float32)
    return sp.hstack(parts, format="csr", dtype=np.float32)


def _gram_block(Z: sp.csr_matrix, ZT: sp.csr_matrix, rows: np.ndarray | slice) -> np.ndarray:
    """Dense ``Z[rows] Z^T`` (float32) through scikit-learn's sparse-times-sparse-to-dense kernel
    (about 3x faster than scipy's sparse product followed by ``toarray``). ``ZT`` is ``Z.T`` in
    CSR form, converted once by the caller.

    Entry (i, j) is accumulated over row i's stored entries in their storage order, whatever other
    rows are in ``rows``: the result of a row does not depend on the block it is computed in (the
    blocked and dense paths agree to the last bit)."""
    return safe_sparse_dot(Z[rows], ZT, dense_output=True).astype(np.float32, copy=False)


def _finish_block(block: np.ndarray) -> np.ndarray:
    """Clip into [0, 1] and round to 6 decimals, in place.

    Rounding makes similarities that differ only in their last bits (two tasks with the same
    description reached through differently ordered sums) compare equal, so that ties are broken
    by lower index. It cannot remove last-bit noise, only make it rare: a value within noise of a
    rounding boundary still lands on either side. Block-size independence therefore comes from the
    kernel: every similarity of the graph's blocked paths is computed by :func:`_gram_block`, which
    computes each entry from its own row in a fixed order."""
    np.clip(block, 0.0, 1.0, out=block)
    np.round(block, 6, out=block)
    return block


def _dense_similarity(Z: sp.csr_matrix, block_size: int, label: str, progress: bool,
                      radius: np.ndarray | None = None) -> np.ndarray:
    """Dense ``Z Z^T``, finished (:func:`_finish_block`) with a unit diagonal; with ``radius``,
    CSLS-corrected (:func:`csls_correct`)."""
    n = Z.shape[0]
    out = np.empty((n, n), np.float32)
    ZT = Z.T.tocsr()
    all_ids = np.arange(n)
    starts = range(0, n, block_size)
    for start in _progress(starts, f"dense {label}", len(starts), progress):
        rows = all_ids[start:start + block_size]
        block = _finish_block(_gram_block(Z, ZT, rows))
        block[np.arange(len(rows)), rows] = 1.0  # unit diagonal, also for empty rows
        if radius is not None:
            csls_correct(block, rows, radius)
        out[rows] = block
    return out


def _top_m(sims: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-m indices and values of a small block, sorted by decreasing value, ties broken
    by lower index (a stable sort). Entries equal to -inf are absent (index -1, value 0)."""
    rows, cols = sims.shape
    k = min(m, cols)
    part = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    idx = part.astype(np.int32)
    val = np.take_along_axis(sims, part, axis=1).astype(np.float32)
    absent = ~np.isfinite(val)
    idx[absent] = -1
    val[absent] = 0.0
    if m > k:
        idx = np.pad(idx, ((0, 0), (0, m - k)), constant_values=-1)
        val = np.pad(val, ((0, 0), (0, m - k)))
    return idx, val


@functools.partial(jax.jit, static_argnames=("m",))
def _rank_cross_block(sims: jax.Array, row_env: jax.Array, col_env: jax.Array, m: int):
    """Top-m other-environment columns of each row of a finished similarity block
    (:func:`_finish_block`): drop same-environment columns, then ``lax.top_k``, which breaks ties
    by lower index. The block is finished by NumPy, not here: XLA compiles ``jnp.round(x * 1e6) /
    1e6`` with a multiplication by the reciprocal, which differs from ``np.round(x, 6)`` in the
    last bit for about 2% of float32 similarities (:mod:`envsched_jax.graph.feature_rows`, point
    4), and the candidates' similarities are to be the dense matrix's entries exactly."""
    sims = jnp.where(row_env[:, None] == col_env[None, :], -jnp.inf, sims)
    vals, idx = jax.lax.top_k(sims, m)
    absent = ~jnp.isfinite(vals)
    return jnp.where(absent, -1, idx).astype(jnp.int32), jnp.where(absent, 0.0, vals)


def csls_radius(cross_sim: np.ndarray, cross_idx: np.ndarray, k: int) -> np.ndarray:
    """r_i: mean of the first ``k`` valid entries of each node's cross-environment candidate list
    (sorted by decreasing S_abs); 0 for a node without any. float32 [N]."""
    valid = cross_idx[:, :k] >= 0
    total = np.where(valid, cross_sim[:, :k], 0.0).sum(axis=1, dtype=np.float64)
    count = valid.sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0).astype(np.float32)


def csls_correct(block: np.ndarray, rows: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """Apply the CSLS correction to finished rows ``rows`` of S_abs, in place:
    ``S'_ij = clip(S_ij - (r_i + r_j) / 2 + rbar, 0, 1)``, rounded to 6 decimals, unit diagonal.
    Every operation is elementwise float32 in a fixed order and ``r_i + r_j`` is commutative, so
    the result does not depend on the block and S' is exactly symmetric when S is."""
    rbar = np.float32(radius.astype(np.float64).mean()) if len(radius) else np.float32(0.0)
    pair = radius[rows][:, None] + radius[None, :]
    block -= np.float32(0.5) * pair
    block += rbar
    _finish_block(block)
    block[np.arange(len(rows)), rows] = 1.0
    return block


def within_candidates(Z: sp.csr_matrix, env_index: np.ndarray, m: int,
                      progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Top-m same-environment neighbours of every node by S_full (self excluded); ``Z`` is the
    stacked concrete views (:func:`stack_views`)."""
    n = len(env_index)
    idx = np.full((n, m), -1, np.int32)
    val = np.zeros((n, m), np.float32)
    order = np.argsort(env_index, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(env_index[order])) + 1)
    for members in _progress(groups, "within-environment candidates", len(groups), progress):
        Zm = Z[members]
        block = _finish_block(safe_sparse_dot(Zm, Zm.T.tocsr(), dense_output=True).astype(np.float32, copy=False))
        np.fill_diagonal(block, -np.inf)
        local_idx, local_val = _top_m(block, m)
        idx[members] = np.where(local_idx >= 0, members[np.maximum(local_idx, 0)], -1)
        val[members] = local_val
    return idx, val


def within_candidates_from_views(features: Sequence[sp.csr_matrix], weights: Sequence[float],
                                 env_index: np.ndarray, m: int, progress: bool = False,
                                 batch_rows: int = 16_384) -> tuple[np.ndarray, np.ndarray]:
    """:func:`within_candidates` of ``stack_views(features, weights)`` without stacking all N rows
    at once: the rows of a batch of environments (about ``batch_rows`` rows) are stacked at a time.
    Row selection keeps every row's entries in storage order and the weighting is elementwise, so
    each environment's block is bit-identical to the one cut from the full stack."""
    n = len(env_index)
    idx = np.full((n, m), -1, np.int32)
    val = np.zeros((n, m), np.float32)
    order = np.argsort(env_index, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(env_index[order])) + 1)
    with _Bar("within-environment candidates", len(groups), progress) as bar:
        start = 0
        while start < len(groups):
            stop, rows = start, 0
            while stop < len(groups) and (stop == start or rows + len(groups[stop]) <= batch_rows):
                rows += len(groups[stop])
                stop += 1
            batch = np.concatenate(groups[start:stop])
            Zb = stack_views([X[batch] for X in features], weights)
            offset = 0
            for members in groups[start:stop]:
                Zm = Zb[offset:offset + len(members)]
                offset += len(members)
                block = _finish_block(safe_sparse_dot(Zm, Zm.T.tocsr(), dense_output=True).astype(np.float32, copy=False))
                np.fill_diagonal(block, -np.inf)
                local_idx, local_val = _top_m(block, m)
                idx[members] = np.where(local_idx >= 0, members[np.maximum(local_idx, 0)], -1)
                val[members] = local_val
            bar.advance(stop - start)
            start = stop
    return idx, val


def cross_candidates(abstract: sp.csr_matrix, env_index: np.ndarray, m: int, block_size: int,
                     progress: bool = False, radius: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-m other-environment neighbours of every node by S_abs (ties -> lower index); with
    ``radius`` (:func:`csls_radius`), by the CSLS-corrected S_abs, always in row blocks.

    The abstraction maps many tasks to the same description, so when the abstract rows have few
    distinct values (at most ``max(n // 8, 1)``) the ranking is computed once per distinct row
    (:func:`_cross_candidates_grouped`, exact and O(U N log N)); otherwise in row blocks of
    ``block_size`` (:func:`_cross_candidates_blocked`, O(N^2), memory ~ ``block_size x N``)."""
    n = abstract.shape[0]
    if radius is not None:
        return _cross_candidates_blocked(abstract, env_index, m, block_size, progress, radius)
    if abstract.shape[1] * n * 4 <= 2**30:
        dense = abstract.toarray()
        uniq, inverse = np.unique(dense, axis=0, return_inverse=True)
        if len(uniq) <= max(n // 8, 1):
            return _cross_candidates_grouped(uniq, inverse.reshape(-1), env_index, m, progress)
    return _cross_candidates_blocked(abstract, env_index, m, block_size, progress)


def _cross_candidates_grouped(uniq: np.ndarray, inverse: np.ndarray, env_index: np.ndarray, m: int,
                              progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-m lists when nodes share abstract rows: for each distinct row a, all nodes are
    ordered once by (similarity to a desc, index asc); a node of group a takes the first m entries
    of that order outside its own environment. Only the first m + (largest environment) entries
    can be needed, so only those are kept."""
    n = len(inverse)
    sim_u = _finish_block((uniq @ uniq.T).astype(np.float32))
    np.fill_diagonal(sim_u, 1.0)
    width = min(n, m + int(np.bincount(env_index).max()))
    idx = np.full((n, m), -1, np.int32)
    val = np.zeros((n, m), np.float32)
    ids = np.arange(n)
    for a in _progress(range(len(uniq)), "cross-environment candidates", len(uniq), progress):
        members = np.flatnonzero(inverse == a)
        sims = sim_u[a, inverse]
        prefix = np.lexsort((ids, -sims))[:width]
        other = env_index[prefix][None, :] != env_index[members][:, None]          # [n_a, width]
        rank = np.cumsum(other, axis=1) - 1
        take = other & (rank < m)
        rows, cols = np.nonzero(take)
        idx[members[rows], rank[rows, cols]] = prefix[cols]
        val[members[rows], rank[rows, cols]] = sims[prefix[cols]]
    return idx, val


def _cross_candidates_blocked(abstract: sp.csr_matrix, env_index: np.ndarray, m: int, block_size: int,
                              progress: bool, radius: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-m other-environment neighbours in row blocks: one sparse product per block
    (:func:`_gram_block`), finished as :func:`_dense_similarity` finishes it and, with ``radius``,
    CSLS-corrected (:func:`csls_correct`), then a jitted ranking kernel (the last block is padded
    so it compiles once).

    The sparse kernel computes every entry from its own row alone, so the lists do not depend on
    ``block_size`` and their similarities are the dense matrix's entries to the last bit. A dense
    float32 BLAS product per block was used here until 2026-12-06: it is 7x faster on dense-ish
    abstract rows (10,000 generated tasks, 27 of 129 columns set: 0.16 s against 1.11 s) and 16x
    slower on sparse ones (20,000 random rows, 30 of 2,000 set: 8.7 s against 0.53 s), but its
    last bit depends on the block's shape and the machine's BLAS kernel, and after rounding to 6
    decimals that moved 31 of 3,072 CSLS-corrected candidate values by 1e-6 between block sizes
    50 and 512 on one CI machine."""
    n = abstract.shape[0]
    idx = np.empty((n, m), np.int32)
    val = np.empty((n, m), np.float32)
    # The rows come from the sparse kernel that _dense_similarity uses (see _gram_block), so the
    # candidates are the top of the dense matrix to the last bit, whatever the block size.
    abstract_t = abstract.T.tocsr()
    col_env = jnp.asarray(env_index)
    k = min(m, n)
    starts = range(0, n, block_size)
    for start in _progress(starts, "cross-environment candidates", len(starts), progress):
        rows = np.arange(start, start + block_size) % n  # the last block wraps round (padding)
        sims = _finish_block(_gram_block(abstract, abstract_t, rows))
        sims[np.arange(len(rows)), rows] = 1.0  # as _dense_similarity (same environment: dropped)
        if radius is not None:
            sims = csls_correct(sims, rows, radius)
        b_idx, b_val = _rank_cross_block(sims, jnp.asarray(env_index[rows]), col_env, k)
        stop = min(start + block_size, n)
        idx[start:stop, :k] = np.asarray(b_idx)[: stop - start]
        val[start:stop, :k] = np.asarray(b_val)[: stop - start]
    idx[:, k:] = -1
    val[:, k:] = 0.0
    return idx, val


def pool_views(pool: Pool, progress: bool = False,
               extractions: Sequence[Extraction] | None = None) -> list[NodeViews]:
    """Extract every task's structure and render its views (environment analysis is shared).
    ``extractions``: one per task in pool order (e.g. the LLM extractor's,
    :mod:`envsched_jax.graph.llm_extract`) instead of the default: the static extractor's, except
    for terminal tasks (``bundles:DIR`` pools), whose operations come from their skill subgraphs
    (:func:`envsched_jax.pool.bundles.skill_extraction`: to the static extractor every bundle is
    the same single shell call, so their cross-environment relation would be arbitrary)."""
    if extractions is not None:
        if len(extractions) != pool.num_tasks:
            raise ValueError(f"pool_views: {len(extractions)} extractions for {pool.num_tasks} tasks")
        return [node_views(task, e) for task, e in zip(pool.tasks, extractions)]
    from envsched_jax.pool.bundles import is_terminal_task, skill_extraction

    tool_info = {env.env_id: analyse_environment(env) for env in pool.environments}
    return [node_views(task, skill_extraction(task) if is_terminal_task(task)
                       else extract(pool.environment(task.env_id), task, tool_info[task.env_id]))
            for task in _progress(pool.tasks, "extracting operations", pool.num_tasks, progress)]


class PoolSource(Protocol):
    """A pool produced environment by environment (e.g.
    :class:`envsched_jax.pool.generator.GeneratedPoolStream`), for :func:`build_graph_stream`:
    ``environments()`` yields the environments in pool order, ``chunks()`` yields
    ``(environment, tasks)`` with every task in pool order. Equal to a ``Pool`` whose
    ``environments`` and ``tasks`` are those records in that order."""

    name: str
    num_tasks: int

    def environments(self) -> Iterable[Environment]: ...

    def chunks(self) -> Iterable[tuple[Environment, Sequence[Task]]]: ...


class _PoolChunks:
    """An in-memory ``Pool`` as a :class:`PoolSource`: each run of consecutive tasks of one
    environment is a chunk; its content hash is the pool's own."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.name = pool.name
        self.num_tasks = pool.num_tasks

    def environments(self) -> Iterable[Environment]:
        return iter(self.pool.environments)

    def chunks(self) -> Iterator[tuple[Environment, Sequence[Task]]]:
        tasks = self.pool.tasks
        start = 0
        while start < len(tasks):
            env_id = tasks[start].env_id
            stop = start + 1
            while stop < len(tasks) and tasks[stop].env_id == env_id:
                stop += 1
            yield self.pool.environment(env_id), tasks[start:stop]
            start = stop


def _env_record(env: Environment) -> dict:
    """What ``Pool.content_hash`` hashes of an environment."""
    return env.to_json() if env.class_source is not None else {"env_id": env.env_id, "trusted": env.class_name}


class _TextColumn:
    """One view's text of every node, kept zlib-compressed in blocks of ``block`` texts (the
    generated pools' texts compress about 5x; at 1,000,000 tasks the views as Python strings take
    about 4.5 GB). Iterating yields the texts in order, decompressing one block at a time."""

    def __init__(self, block: int = 4096):
        self._block = block
        self._blobs: list[tuple[bytes, np.ndarray]] = []
        self._pending: list[str] = []
        self._len = 0

    def append(self, text: str) -> None:
        self._pending.append(text)
        self._len += 1
        if len(self._pending) >= self._block:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            encoded = [t.encode("utf-8", "surrogatepass") for t in self._pending]
            self._blobs.append((zlib.compress(b"".join(encoded), 1),
                                np.fromiter((len(e) for e in encoded), np.int64, len(encoded))))
            self._pending = []

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        self._flush()
        for blob, lengths in self._blobs:
            raw = zlib.decompress(blob)
            pos = 0
            for size in lengths.tolist():
                yield raw[pos:pos + size].decode("utf-8", "surrogatepass")
                pos += size

    def nbytes(self) -> int:
        return sum(len(b) + lengths.nbytes for b, lengths in self._blobs)


class _Counted:
    """``texts`` whose iteration advances a progress bar (every 1,024 texts)."""

    def __init__(self, texts: Sequence[str] | _TextColumn, bar: _Bar):
        self._texts, self._bar = texts, bar

    def __len__(self) -> int:
        return len(self._texts)

    def __iter__(self) -> Iterator[str]:
        count = 0
        for text in self._texts:
            yield text
            count += 1
            if count == 1024:
                self._bar.advance(count)
                count = 0
        self._bar.advance(count)


def build_graph(pool: Pool, config: GraphConfig = GraphConfig(), *, progress: bool = False,
                extractions: Sequence[Extraction] | None = None) -> PoolGraph:
    """Build the static graph of ``pool`` (see the module docstring); ``extractions`` replaces
    the static extractor's output (see :func:`pool_views`)."""
    return build_graph_stream(_PoolChunks(pool), config, progress=progress, extractions=extractions)


def build_graph_stream(source: PoolSource | Pool, config: GraphConfig = GraphConfig(), *,
                       progress: bool = False,
                       extractions: Sequence[Extraction] | None = None) -> PoolGraph:
    """:func:`build_graph` of a pool that is produced environment by environment and never held
    whole (:class:`PoolSource`); the graph is identical to ``build_graph`` of the same pool, its
    ``pool_hash`` included (computed as the records stream past).

    Memory: each environment's tasks are dropped once their views are rendered; the views' texts
    are kept compressed (:class:`_TextColumn`) and each view's column is dropped after its TF-IDF
    fit; the within-environment candidates stack the weighted views a batch of environments at a
    time. What stays is what the graph holds: the feature matrices, candidate lists, ids and
    abstract texts (equal texts share one string). ``timings`` gains ``generate`` (time spent
    producing the records) for a source that is not an in-memory ``Pool``, and ``hash``."""
    from envsched_jax.pool.bundles import is_terminal_task, skill_extraction

    if isinstance(source, Pool):
        source = _PoolChunks(source)
    if extractions is not None and len(extractions) != source.num_tasks:
        raise ValueError(f"pool_views: {len(extractions)} extractions for {source.num_tasks} tasks")
    in_memory = isinstance(source, _PoolChunks)
    timings: dict[str, float] = {}
    t_generate = t_hash = t_extract = 0.0

    hasher = None if in_memory else hashlib.sha256()
    t0 = time.perf_counter()
    env_ids: list[str] = []
    for env in source.environments():
        env_ids.append(env.env_id)
        if hasher is not None:
            hasher.update(_canonical(_env_record(env)))
    t_generate += time.perf_counter() - t0
    env_pos = {env_id: k for k, env_id in enumerate(env_ids)}

    columns = {name: _TextColumn() for name in ("instruction", "check_text", "check_code",
                                                 "initial_context", "operations")}
    abstract_texts: list[str] = []
    shared: dict[str, str] = {}
    task_ids: list[str] = []
    env_index_list: list[int] = []
    with _Bar("generating + extracting" if not in_memory else "extracting operations",
              source.num_tasks, progress) as bar:
        chunks = iter(source.chunks())
        while True:
            t0 = time.perf_counter()
            chunk = next(chunks, None)
            t_generate += time.perf_counter() - t0
            if chunk is None:
                break
            env, tasks = chunk
            if hasher is not None:
                t0 = time.perf_counter()
                for task in tasks:
                    hasher.update(_canonical(task.to_json()))
                t_hash += time.perf_counter() - t0
            t0 = time.perf_counter()
            info = analyse_environment(env) if extractions is None else None
            for task in tasks:
                if extractions is not None:
                    extraction = extractions[len(task_ids)]
                elif is_terminal_task(task):
                    extraction = skill_extraction(task)
                else:
                    extraction = extract(env, task, info)
                v = node_views(task, extraction)
                columns["instruction"].append(v.instruction)
                columns["check_text"].append(v.check_text)
                columns["check_code"].append(v.check_code)
                columns["initial_context"].append(v.initial_context)
                columns["operations"].append(v.operations)
                abstract_texts.append(shared.setdefault(v.abstract, v.abstract))
                task_ids.append(task.task_id)
                env_index_list.append(env_pos[task.env_id])
            t_extract += time.perf_counter() - t0
            bar.advance(len(tasks))
        del chunks, chunk
    if not in_memory:
        timings["generate"] = t_generate
    timings["extract"] = t_extract
    t0 = time.perf_counter()
    pool_hash = source.pool.content_hash() if in_memory else hasher.hexdigest()
    timings["hash"] = t_hash + time.perf_counter() - t0
    n = len(task_ids)
    if n != source.num_tasks:
        raise ValueError(f"pool source {source.name!r} announced {source.num_tasks} tasks but gave {n}")

    t0 = time.perf_counter()
    weights = config.concrete_weights()
    view_column = dict(zip(VIEW_NAMES, ("instruction", "instruction", "check_text", "check_code",
                                        "initial_context", "operations")))
    keep = {"instruction"} if config.semantic_view != "off" else set()
    features: dict[str, sp.csr_matrix] = {}
    for position, name in enumerate(VIEW_NAMES):
        if name in weights:
            with _Bar(f"TF-IDF {name}", n, progress) as bar:
                features[name] = encode_view(_Counted(columns[view_column[name]], bar), name, config)
        later = {view_column[v] for v in VIEW_NAMES[position + 1:]} | keep
        if view_column[name] not in later:
            columns.pop(view_column[name], None)
    with _Bar("TF-IDF abstract", n, progress) as bar:
        features["abstract"] = encode_view(_Counted(abstract_texts, bar), "abstract", config)
    timings["tfidf"] = time.perf_counter() - t0
    if config.semantic_view != "off":
        from envsched_jax.graph.semantic import semantic_features

        t0 = time.perf_counter()
        features["semantic"] = semantic_features(
            list(columns.pop("instruction")), progress=progress,
            cache_dir=None if config.semantic_cache_dir is None else Path(config.semantic_cache_dir))
        timings["semantic"] = time.perf_counter() - t0

    env_index = np.asarray(env_index_list, np.int32)
    del env_index_list
    concrete_views = [features[name] for name in weights]
    concrete_weights = list(weights.values())
    abstract = features["abstract"]

    t0 = time.perf_counter()
    m = config.num_candidates
    within_idx, within_sim = within_candidates_from_views(concrete_views, concrete_weights, env_index, m, progress)
    radius = None
    if config.hubness == "csls":
        raw_idx, raw_sim = cross_candidates(abstract, env_index, max(m, config.hubness_k),
                                            config.block_size, progress)
        radius = csls_radius(raw_sim, raw_idx, config.hubness_k)
    cross_idx, cross_sim = cross_candidates(abstract, env_index, m, config.block_size, progress, radius)
    timings["candidates"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    build_dense = config.dense == "always" or (config.dense == "auto" and n <= config.dense_max_nodes)
    s_full = s_abs = None
    if build_dense:
        concrete = stack_views(concrete_views, concrete_weights)
        s_full = _dense_similarity(concrete, config.block_size, "S_full", progress)
        del concrete
        s_abs = _dense_similarity(abstract, config.block_size, "S_abs", progress, radius)
    timings["dense"] = time.perf_counter() - t0

    return PoolGraph(
        task_ids=tuple(task_ids), env_ids=tuple(env_ids), env_index=env_index,
        within_idx=within_idx, within_sim=within_sim, cross_idx=cross_idx, cross_sim=cross_sim,
        s_full=s_full, s_abs=s_abs, features=features,
        abstract_texts=tuple(abstract_texts), config=config,
        pool_name=source.name, pool_hash=pool_hash, timings=timings)
