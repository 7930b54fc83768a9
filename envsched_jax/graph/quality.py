"""Label-based quality of a built graph's neighbour lists (:class:`~envsched_jax.graph.build.PoolGraph`).

The graph is scored only by labels the pool itself provides; nothing here invents a label.

Within-environment label precision@k
    The label of a task is the exact set of *state-changing* tools among its reference actions.
    State-changing is what the environment declares (``Operation.kind == "state_change"``) when it
    declares at least one such operation; otherwise (no kinds declared) the label is the set of
    all tools of the task's reference actions. Tasks without reference actions have no label.

Cross-environment label precision@k
    A pool-provided cross-environment category (:data:`CROSS_LABELS`): the generated pool's
    ``metadata["template"]`` and ``metadata["families"]`` (a set: exact match, and mean Jaccard),
    the embedded pool's ``metadata["shape"]``. A pool whose tasks carry none of a label's key
    reports :data:`NOT_AVAILABLE` for it.

For node ``i`` with label ``a_i`` and top-k list ``N_k(i)`` (padded ``-1`` entries and unlabelled
neighbours left out), ``prec_k(i) = mean_{j in N_k(i)} s(a_i, a_j)`` with ``s`` equality (or
Jaccard); precision@k is its mean over the nodes with at least one such neighbour. The chance
level is the expected precision of neighbours drawn at random from the relation's population
(other same-environment nodes for within, other-environment nodes for cross), computed exactly
from label counts: ``chance(i) = mean_{j in P(i)} s(a_i, a_j)``, averaged over labelled nodes with
a non-empty labelled population.

Hubness (Radovanovic et al. 2010)
    ``N_k(x)``, the k-occurrence of node ``x``, counts the lists whose first k entries hold ``x``.
    Reported for k = 1 and k = K (K_within / K_cross): the largest in-degree and its task, the
    share of nodes whose top-1 neighbour is the single largest top-1 hub, the number of distinct
    top-1 neighbours and the skewness of ``N_k`` over all nodes (``scipy.stats.skew``). For the
    cross lists also the worst environment pair: one task that is the top-1 cross neighbour of X of
    the Y tasks of another environment.

Distinct abstract descriptions
    The number of distinct ``abstract_texts`` and of distinct rows of the abstract TF-IDF matrix.

Every figure is O(N M) NumPy work on the [N, M] candidate arrays (plus label counts), so a graph
of N = 20,000 is scored in well under a second.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from scipy import stats

from envsched_jax.pool.model import Pool, Task

NOT_AVAILABLE = "not available"


@dataclasses.dataclass(frozen=True)
class CrossLabel:
    """A cross-environment category read from ``task.metadata[key]``.

    ``match``: ``exact`` compares values as they are (a list as an ordered tuple), ``set`` compares
    them as sets, ``jaccard`` scores a pair of sets by ``|A & B| / |A | B|`` (1 for two empty sets).
    """

    name: str
    key: str
    match: Literal["exact", "set", "jaccard"]


CROSS_LABELS: tuple[CrossLabel, ...] = (
    CrossLabel("template", "template", "exact"),
    CrossLabel("families", "families", "set"),
    CrossLabel("families_jaccard", "families", "jaccard"),
    CrossLabel("shape", "shape", "exact"),
)


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    """Label precision@k of one relation's neighbour lists against one label.

    ``precision[n]`` / ``ratio[n]`` / ``num_scored[n]`` belong to ``ks[n]``; ``ratio`` is
    ``precision / chance`` (NaN where chance is 0 or undefined)."""

    label: str
    ks: tuple[int, ...]
    precision: tuple[float, ...]
    chance: float
    ratio: tuple[float, ...]
    num_scored: tuple[int, ...]
    """Nodes with a label and at least one labelled neighbour among their first k."""
    num_chance_scored: int
    """Nodes with a label and a non-empty labelled population (the chance level's average)."""
    num_labelled: int
    num_unlabelled: int
    num_distinct_labels: int


@dataclasses.dataclass(frozen=True)
class HubnessReport:
    """In-degrees of one relation's neighbour lists (k-occurrences ``N_1`` and ``N_k``)."""

    k: int
    num_with_neighbour: int
    """Nodes whose list has a top-1 entry (the denominator of ``top1_hub_share``)."""
    top1_max_in_degree: int
    top1_hub_task: str | None
    top1_hub_share: float
    top1_distinct: int
    top1_skewness: float
    topk_max_in_degree: int
    topk_hub_task: str | None
    topk_distinct: int
    topk_skewness: float


@dataclasses.dataclass(frozen=True)
class EnvPairHub:
    """The worst environment pair of a cross relation: ``target_task`` (of ``target_env``) is the
    top-1 neighbour of ``count`` of the ``source_size`` tasks of ``source_env`` that have one."""

    source_env: str
    target_env: str
    target_task: str
    count: int
    source_size: int
    share: float


@dataclasses.dataclass(frozen=True)
class DistinctReport:
    num_nodes: int
    distinct_texts: int
    distinct_rows: int
    text_ratio: float
    row_ratio: float


@dataclasses.dataclass(frozen=True)
class GraphQualityReport:
    """Every figure of :func:`graph_quality`; ``cross_precision[name]`` is a report or
    :data:`NOT_AVAILABLE`."""

    pool_name: str
    num_nodes: int
    num_environments: int
    num_candidates: int
    k_within: int
    k_cross: int
    within_label_source: str
    within_precision: PrecisionReport
    cross_precision: Mapping[str, PrecisionReport | str]
    within_hubness: HubnessReport
    cross_hubness: HubnessReport
    cross_worst_pair: EnvPairHub | None
    distinct_abstract: DistinctReport

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types; NaN becomes ``None``."""
        return _json_clean(dataclasses.asdict(self))


def _json_clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------------------- labels

def encode_labels(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Integer codes [N] (``-1`` where the value is ``None``) and the distinct values by code.
    Values must be hashable; codes follow first appearance."""
    table: dict[Any, int] = {}
    codes = np.full(len(values), -1, np.int64)
    for i, v in enumerate(values):
        if v is not None:
            codes[i] = table.setdefault(v, len(table))
    return codes, list(table)


def jaccard_matrix(sets: Sequence[frozenset]) -> np.ndarray:
    """[U, U] Jaccard similarity of distinct sets (1 between two empty sets)."""
    universe = sorted({x for s in sets for x in s}, key=repr)
    pos = {x: k for k, x in enumerate(universe)}
    member = np.zeros((len(sets), len(universe)), np.float64)
    for u, s in enumerate(sets):
        member[u, [pos[x] for x in s]] = 1.0
    inter = member @ member.T
    size = member.sum(axis=1)
    union = size[:, None] + size[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1.0), 1.0)


def state_change_labels(pool: Pool) -> tuple[list[frozenset | None], str]:
    """Per task, the set of state-changing tools of its reference actions (``None`` without
    reference actions), and a description of the label used."""
    declared = {e.env_id: frozenset(o.name for o in e.operations if o.kind == "state_change")
                for e in pool.environments}
    labels: list[frozenset | None] = []
    for task in pool.tasks:
        if task.reference_actions is None:
            labels.append(None)
            continue
        tools = frozenset(a.name for a in task.reference_actions)
        state_change = declared[task.env_id]
        labels.append(tools & state_change if state_change else tools)
    num_declared = sum(bool(s) for s in declared.values())
    num_envs = pool.num_environments
    if num_declared == num_envs:
        source = "state-changing reference tools (kinds declared by every environment)"
    elif num_declared == 0:
        source = "all reference-action tools (no environment declares state-changing operations)"
    else:
        source = (f"state-changing reference tools in the {num_declared} of {num_envs} environments "
                  "that declare kinds, all reference-action tools in the others")
    return labels, source


def _metadata_value(task: Task, label: CrossLabel) -> Any:
    if label.key not in task.metadata:
        return None
    value = task.metadata[label.key]
    if label.match == "exact":
        return tuple(value) if isinstance(value, list) else value
    return frozenset(value) if isinstance(value, (list, tuple, set, frozenset)) else frozenset([value])


def cross_label_codes(pool: Pool, label: CrossLabel) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Codes [N] of one cross-environment label and the pair-similarity matrix ([U, U] for
    Jaccard, ``None`` for equality), or ``None`` when no task carries the key."""
    values = [_metadata_value(t, label) for t in pool.tasks]
    if all(v is None for v in values):
        return None
    codes, distinct = encode_labels(values)
    return codes, (jaccard_matrix(distinct) if label.match == "jaccard" else None)


# ------------------------------------------------------------------------------------ precision

def _pair_scores(codes_i: np.ndarray, codes_j: np.ndarray, pair_sim: np.ndarray | None) -> np.ndarray:
    if pair_sim is None:
        return (codes_i == codes_j).astype(np.float64)
    return pair_sim[np.maximum(codes_i, 0), np.maximum(codes_j, 0)]


def precision_at_k(neighbour_idx: np.ndarray, codes: np.ndarray, k: int,
                   pair_sim: np.ndarray | None = None) -> tuple[float, int]:
    """Mean over nodes of the mean label score of their first ``k`` neighbours.

    Args:
        neighbour_idx: [N, M] int, neighbour lists sorted best first, ``-1`` padded.
        codes: [N] int label codes, ``-1`` for no label.
        k: list prefix scored (``min(k, M)`` columns).
        pair_sim: [U, U] score of a pair of codes; ``None`` scores equality.

    Returns:
        (precision, number of nodes scored); precision is NaN when no node is scored.
    """
    idx = neighbour_idx[:, :k]
    nb_codes = codes[np.maximum(idx, 0)]
    valid = (idx >= 0) & (nb_codes >= 0) & (codes >= 0)[:, None]
    scores = np.where(valid, _pair_scores(codes[:, None], nb_codes, pair_sim), 0.0)
    count = valid.sum(axis=1)
    scored = count > 0
    if not scored.any():
        return float("nan"), 0
    return float((scores.sum(axis=1)[scored] / count[scored]).mean()), int(scored.sum())


def chance_precision(codes: np.ndarray, env_index: np.ndarray, relation: Literal["within", "cross"],
                     pair_sim: np.ndarray | None = None) -> tuple[float, int]:
    """Expected precision of neighbours drawn at random from a node's population: the other
    labelled nodes of its environment (``within``) or the labelled nodes of other environments
    (``cross``), averaged over labelled nodes with a non-empty population. Exact, from label
    counts per environment (O(N) for equality, O(E U^2) with ``pair_sim``).

    Returns:
        (chance, number of nodes averaged); NaN when none.
    """
    lab = codes >= 0
    if not lab.any():
        return float("nan"), 0
    c, e = codes[lab], env_index[lab].astype(np.int64)
    num_codes = int(c.max()) + 1
    env_size = np.bincount(e, minlength=int(env_index.max()) + 1)
    if pair_sim is None:
        pair = e * num_codes + c
        _, inverse, pair_count = np.unique(pair, return_inverse=True, return_counts=True)
        same_env = pair_count[inverse.reshape(-1)].astype(np.float64)           # incl. the node
        total = np.bincount(c, minlength=num_codes)[c].astype(np.float64)
        self_score = 1.0
    else:
        counts = np.zeros((len(env_size), num_codes))
        np.add.at(counts, (e, c), 1.0)
        env_scores = counts @ pair_sim[:num_codes, :num_codes].T                   # [E, U]
        same_env = env_scores[e, c]
        total = (counts.sum(axis=0) @ pair_sim[:num_codes, :num_codes].T)[c]
        self_score = pair_sim[c, c]
    if relation == "within":
        hits, size = same_env - self_score, env_size[e] - 1.0
    else:
        hits, size = total - same_env, float(lab.sum()) - env_size[e]
    ok = size > 0
    if not ok.any():
        return float("nan"), 0
    return float((hits[ok] / size[ok]).mean()), int(ok.sum())


def label_precision(neighbour_idx: np.ndarray, codes: np.ndarray, env_index: np.ndarray,
                    relation: Literal["within", "cross"], ks: Sequence[int], label: str,
                    pair_sim: np.ndarray | None = None) -> PrecisionReport:
    """:func:`precision_at_k` for every k with the relation's :func:`chance_precision`."""
    results = [precision_at_k(neighbour_idx, codes, k, pair_sim) for k in ks]
    chance, num_chance = chance_precision(codes, env_index, relation, pair_sim)
    ratio = tuple(p / chance if chance > 0 else float("nan") for p, _ in results)
    labelled = codes >= 0
    return PrecisionReport(
        label=label, ks=tuple(int(k) for k in ks), precision=tuple(p for p, _ in results),
        chance=chance, ratio=ratio, num_scored=tuple(n for _, n in results),
        num_chance_scored=num_chance, num_labelled=int(labelled.sum()),
        num_unlabelled=int((~labelled).sum()), num_distinct_labels=len(np.unique(codes[labelled])))


# -------------------------------------------------------------------------------------- hubness

def k_occurrence(neighbour_idx: np.ndarray, k: int) -> np.ndarray:
    """[N] int: how many lists hold each node among their first ``k`` entries (``-1`` ignored)."""
    idx = neighbour_idx[:, :k]
    return np.bincount(idx[idx >= 0], minlength=neighbour_idx.shape[0])


def _skewness(values: np.ndarray) -> float:
    """``scipy.stats.skew``; NaN for a constant distribution (where it is undefined)."""
    if values.size == 0 or np.ptp(values) == 0:
        return float("nan")
    return float(stats.skew(values.astype(np.float64)))


def hubness(neighbour_idx: np.ndarray, k: int, task_ids: Sequence[str] | None = None) -> HubnessReport:
    """In-degree figures of the first entry and of the first ``k`` entries of every list.

    Args:
        neighbour_idx: [N, M] int neighbour lists, ``-1`` padded.
        k: the relation's neighbourhood size (K_within or K_cross).
        task_ids: names of the nodes (default: their indices as strings).
    """
    n = neighbour_idx.shape[0]
    names = task_ids if task_ids is not None else [str(i) for i in range(n)]
    occ_1, occ_k = k_occurrence(neighbour_idx, 1), k_occurrence(neighbour_idx, k)
    with_neighbour = int((neighbour_idx[:, 0] >= 0).sum()) if neighbour_idx.shape[1] else 0
    hub_1, hub_k = int(np.argmax(occ_1)), int(np.argmax(occ_k))
    return HubnessReport(
        k=int(k), num_with_neighbour=with_neighbour,
        top1_max_in_degree=int(occ_1[hub_1]), top1_hub_task=names[hub_1] if occ_1[hub_1] else None,
        top1_hub_share=occ_1[hub_1] / with_neighbour if with_neighbour else float("nan"),
        top1_distinct=int(np.count_nonzero(occ_1)), top1_skewness=_skewness(occ_1),
        topk_max_in_degree=int(occ_k[hub_k]), topk_hub_task=names[hub_k] if occ_k[hub_k] else None,
        topk_distinct=int(np.count_nonzero(occ_k)), topk_skewness=_skewness(occ_k))


def worst_env_pair(neighbour_idx: np.ndarray, env_index: np.ndarray, task_ids: Sequence[str] | None = None,
                   env_ids: Sequence[str] | None = None) -> EnvPairHub | None:
    """The (source environment, target task) pair with the most top-1 links: the target is the
    top-1 neighbour of that many tasks of the source environment. Ties: the larger share, then
    the lower source environment and target index. ``None`` when no list has an entry."""
    n = neighbour_idx.shape[0]
    if neighbour_idx.shape[1] == 0:
        return None
    top1 = neighbour_idx[:, 0].astype(np.int64)
    has = top1 >= 0
    if not has.any():
        return None
    src_env = env_index[has].astype(np.int64)
    keys, counts = np.unique(src_env * n + top1[has], return_counts=True)
    sizes = np.bincount(src_env, minlength=int(env_index.max()) + 1)
    key_env = keys // n
    share = counts / sizes[key_env]
    best = int(np.lexsort((keys, -share, -counts))[0])
    source, target = int(key_env[best]), int(keys[best] % n)
    names = task_ids if task_ids is not None else [str(i) for i in range(n)]
    envs = env_ids if env_ids is not None else [str(e) for e in range(int(env_index.max()) + 1)]
    return EnvPairHub(source_env=envs[source], target_env=envs[int(env_index[target])],
                      target_task=names[target], count=int(counts[best]),
                      source_size=int(sizes[source]), share=float(share[best]))


# ------------------------------------------------------------------------------------- distinct

def distinct_rows(matrix: sp.spmatrix | np.ndarray) -> int:
    """Number of distinct rows of a sparse or dense matrix (exact float equality)."""
    if not sp.issparse(matrix):
        dense = np.asarray(matrix)
        return int(len(np.unique(dense, axis=0))) if dense.shape[0] else 0
    csr = sp.csr_matrix(matrix, copy=True)
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.sort_indices()
    ptr = csr.indptr
    return len({(csr.indices[a:b].tobytes(), csr.data[a:b].tobytes()) for a, b in zip(ptr[:-1], ptr[1:])})


def distinct_abstract(texts: Sequence[str], matrix: sp.spmatrix | np.ndarray | None) -> DistinctReport:
    """Distinct abstract descriptions and distinct abstract TF-IDF rows (``matrix`` may be
    ``None``: rows are then counted as the texts)."""
    n = len(texts)
    num_texts = len(set(texts))
    num_rows = distinct_rows(matrix) if matrix is not None else num_texts
    return DistinctReport(num_nodes=n, distinct_texts=num_texts, distinct_rows=num_rows,
                          text_ratio=num_texts / n if n else float("nan"),
                          row_ratio=num_rows / n if n else float("nan"))


# -------------------------------------------------------------------------------------- wrapper

def graph_quality(pool: Pool, graph, k_within: int = 6, k_cross: int = 12) -> GraphQualityReport:
    """Score ``graph`` (a :class:`~envsched_jax.graph.build.PoolGraph` of ``pool``) by the pool's
    labels. Precision is reported at k = 1, 5 and ``k_within`` (within) / ``k_cross`` (cross);
    hubness at k = 1 and the same K."""
    if graph.task_ids != tuple(t.task_id for t in pool.tasks):
        raise ValueError(f"graph_quality: the graph's nodes are not the tasks of pool {pool.name!r}")
    env_index = np.asarray(graph.env_index)
    within_values, within_source = state_change_labels(pool)
    within_codes, _ = encode_labels(within_values)
    within = label_precision(graph.within_idx, within_codes, env_index, "within",
                             _ks(k_within), within_source)
    cross: dict[str, PrecisionReport | str] = {}
    for label in CROSS_LABELS:
        encoded = cross_label_codes(pool, label)
        if encoded is None:
            cross[label.name] = NOT_AVAILABLE
            continue
        codes, pair_sim = encoded
        cross[label.name] = label_precision(graph.cross_idx, codes, env_index, "cross", _ks(k_cross),
                                            f"metadata[{label.key!r}] ({label.match})", pair_sim)
    return GraphQualityReport(
        pool_name=pool.name, num_nodes=graph.num_nodes, num_environments=len(graph.env_ids),
        num_candidates=int(graph.within_idx.shape[1]), k_within=k_within, k_cross=k_cross,
        within_label_source=within_source, within_precision=within, cross_precision=cross,
        within_hubness=hubness(graph.within_idx, k_within, graph.task_ids),
        cross_hubness=hubness(graph.cross_idx, k_cross, graph.task_ids),
        cross_worst_pair=worst_env_pair(graph.cross_idx, env_index, graph.task_ids, graph.env_ids),
        distinct_abstract=distinct_abstract(graph.abstract_texts, graph.features.get("abstract")))


def _ks(k_max: int) -> tuple[int, ...]:
    return tuple(sorted({1, 5, k_max}))
