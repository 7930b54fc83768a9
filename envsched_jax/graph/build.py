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

Every TF-IDF encoder uses scikit-learn's ``TfidfVectorizer`` with ``min_df=1``,
``max_features=35000`` and ``sublinear_tf=True`` (appendix D); rows are L2-normalised, so cosine
similarity is a dot product. A node whose text in some view is empty has a zero row there: its
similarity to others in that view is 0 and, by definition, 1 to itself (unit diagonal).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer

from envsched_jax.graph.extract import analyse_environment, extract
from envsched_jax.graph.views import VIEW_NAMES, NodeViews, node_views
from envsched_jax.pool.model import Pool

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
    block_size: int = 512
    """Rows per block when computing similarities (bounds memory to block_size x N floats)."""

    def __post_init__(self):
        if len(self.view_weights) != 6 or any(w < 0 for w in self.view_weights):
            raise ValueError(f"view_weights must be six non-negative numbers, got {self.view_weights}")
        if abs(sum(self.view_weights) - 1.0) > 1e-6:
            raise ValueError(f"view_weights must sum to 1 (so S_full lies in [0, 1]), got "
                             f"{sum(self.view_weights):.6f}")
        for name in ("max_features", "min_df", "num_candidates", "dense_max_nodes", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dense not in ("auto", "always", "never"):
            raise ValueError(f"dense must be 'auto', 'always' or 'never', got {self.dense!r}")


def _vectorizer(view: str, config: GraphConfig) -> TfidfVectorizer:
    common = dict(min_df=config.min_df, max_features=config.max_features, sublinear_tf=True,
                  dtype=np.float32)
    if view == "instruction_words":
        return TfidfVectorizer(analyzer="word", ngram_range=(1, 2), **common)
    if view == "instruction_chars":
        return TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), **common)
    if view == "check_text":
        return TfidfVectorizer(analyzer="word", ngram_range=(1, 2), **common)
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
    if not enabled:
        return items
    from rich.progress import track

    return track(items, description=description, total=total, transient=True)


def _weighted_block(features: Sequence[sp.csr_matrix], weights: Sequence[float],
                    rows: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
    """sum_a w_a X_a[rows] X_a[cols]^T as a dense float32 array (cols = all nodes if None)."""
    n_cols = features[0].shape[0] if cols is None else len(cols)
    out = np.zeros((len(rows), n_cols), np.float32)
    for X, w in zip(features, weights):
        if w == 0 or X.shape[1] == 0:
            continue
        right = X if cols is None else X[cols]
        out += w * (X[rows] @ right.T).toarray()
    return out


def _finish_block(block: np.ndarray, row_ids: np.ndarray, col_ids: np.ndarray) -> np.ndarray:
    """Clip into [0, 1], round to 6 decimals and put exact ones on the diagonal.

    Rounding removes the last-bit noise that BLAS kernels of different block shapes produce, so
    that equal similarities compare equal and rankings (ties broken by lower index) do not depend
    on ``block_size`` or on the machine."""
    np.clip(block, 0.0, 1.0, out=block)
    np.round(block, 6, out=block)
    same = row_ids[:, None] == col_ids[None, :]
    block[same] = 1.0
    return block


def _dense_similarity(features: Sequence[sp.csr_matrix], weights: Sequence[float], n: int,
                      block_size: int, label: str, progress: bool) -> np.ndarray:
    out = np.empty((n, n), np.float32)
    all_ids = np.arange(n)
    starts = range(0, n, block_size)
    for start in _progress(starts, f"dense {label}", len(starts), progress):
        rows = all_ids[start:start + block_size]
        out[rows] = _finish_block(_weighted_block(features, weights, rows), rows, all_ids)
    return out


def _top_m(sims: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-m indices and values, sorted by decreasing value, ties broken by lower index.
    Entries equal to -inf are treated as absent (index -1, value 0)."""
    rows, cols = sims.shape
    k = min(m, cols)
    if k == 0:
        return np.full((rows, m), -1, np.int32), np.zeros((rows, m), np.float32)
    if k < cols:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(cols), (rows, cols)).copy()
    vals = np.take_along_axis(sims, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    idx = np.take_along_axis(part, order, axis=1).astype(np.int32)
    val = np.take_along_axis(vals, order, axis=1).astype(np.float32)
    absent = ~np.isfinite(val)
    idx[absent] = -1
    val[absent] = 0.0
    pad = m - k
    if pad:
        idx = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1)
        val = np.pad(val, ((0, 0), (0, pad)))
    return idx, val


def within_candidates(features: Sequence[sp.csr_matrix], weights: Sequence[float],
                      env_index: np.ndarray, m: int, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Top-m same-environment neighbours of every node by S_full (self excluded)."""
    n = len(env_index)
    idx = np.full((n, m), -1, np.int32)
    val = np.zeros((n, m), np.float32)
    groups = np.split(np.argsort(env_index, kind="stable"),
                      np.flatnonzero(np.diff(np.sort(env_index, kind="stable"))) + 1)
    for members in _progress(groups, "within-environment candidates", len(groups), progress):
        block = _finish_block(_weighted_block(features, weights, members, members), members, members)
        np.fill_diagonal(block, -np.inf)
        local_idx, local_val = _top_m(block, m)
        idx[members] = np.where(local_idx >= 0, members[np.maximum(local_idx, 0)], -1)
        val[members] = local_val
    return idx, val


def cross_candidates(abstract: sp.csr_matrix, env_index: np.ndarray, m: int, block_size: int,
                     progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Top-m other-environment neighbours of every node by S_abs, in row blocks.

    The abstract vocabulary is small (enum values and placeholders), so the features are
    densified when that costs at most 1 GiB and each block is one BLAS product."""
    n = abstract.shape[0]
    idx = np.empty((n, m), np.int32)
    val = np.empty((n, m), np.float32)
    dense = abstract.toarray() if abstract.shape[1] * n * 4 <= 2**30 else None
    all_ids = np.arange(n)
    starts = range(0, n, block_size)
    for start in _progress(starts, "cross-environment candidates", len(starts), progress):
        rows = slice(start, min(start + block_size, n))
        if dense is not None:
            sims = dense[rows] @ dense.T
        else:
            sims = (abstract[rows] @ abstract.T).toarray().astype(np.float32)
        sims = _finish_block(sims, all_ids[rows], all_ids)
        sims[env_index[rows][:, None] == env_index[None, :]] = -np.inf
        idx[rows], val[rows] = _top_m(sims, m)
    return idx, val


def pool_views(pool: Pool, progress: bool = False) -> list[NodeViews]:
    """Extract every task's structure and render its views (environment analysis is shared)."""
    tool_info = {env.env_id: analyse_environment(env) for env in pool.environments}
    return [node_views(task, extract(pool.environment(task.env_id), task, tool_info[task.env_id]))
            for task in _progress(pool.tasks, "extracting operations", pool.num_tasks, progress)]


def build_graph(pool: Pool, config: GraphConfig = GraphConfig(), *, progress: bool = False) -> PoolGraph:
    """Build the static graph of ``pool`` (see the module docstring)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    views = pool_views(pool, progress)
    timings["extract"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    concrete_texts = list(zip(*(v.concrete() for v in views)))
    features = {name: encode_view(texts, name, config) for name, texts in zip(VIEW_NAMES, concrete_texts)}
    features["abstract"] = encode_view([v.abstract for v in views], "abstract", config)
    timings["tfidf"] = time.perf_counter() - t0

    env_ids = tuple(e.env_id for e in pool.environments)
    env_index = np.asarray(pool.env_index(), np.int32)
    n = pool.num_tasks
    concrete = [features[name] for name in VIEW_NAMES]

    t0 = time.perf_counter()
    build_dense = config.dense == "always" or (config.dense == "auto" and n <= config.dense_max_nodes)
    s_full = s_abs = None
    if build_dense:
        s_full = _dense_similarity(concrete, config.view_weights, n, config.block_size, "S_full", progress)
        s_abs = _dense_similarity([features["abstract"]], (1.0,), n, config.block_size, "S_abs", progress)
    timings["dense"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    m = config.num_candidates
    within_idx, within_sim = within_candidates(concrete, config.view_weights, env_index, m, progress)
    cross_idx, cross_sim = cross_candidates(features["abstract"], env_index, m, config.block_size, progress)
    timings["candidates"] = time.perf_counter() - t0

    return PoolGraph(
        task_ids=tuple(t.task_id for t in pool.tasks), env_ids=env_ids, env_index=env_index,
        within_idx=within_idx, within_sim=within_sim, cross_idx=cross_idx, cross_sim=cross_sim,
        s_full=s_full, s_abs=s_abs, features=features,
        abstract_texts=tuple(v.abstract for v in views), config=config,
        pool_name=pool.name, pool_hash=pool.content_hash(), timings=timings)
