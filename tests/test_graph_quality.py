"""Label-based graph quality (envsched_jax.graph.quality): hand-computed figures on a six-node
example, a brute-force reference on random inputs, the embedded pool's real graph, and a smoke
run of experiments/neighbour_quality.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from envsched_jax.graph import quality
from envsched_jax.pool.model import Action, Operation

ROOT = Path(__file__).resolve().parents[1]

# Six nodes in two environments; node 5 has no label. Padded (-1) entries in both relations.
ENV = np.array([0, 0, 0, 1, 1, 1])
WITHIN = np.array([[1, 2, -1], [0, 2, -1], [0, 1, -1], [4, 5, -1], [5, 3, -1], [3, 4, -1]])
WITHIN_CODES = np.array([0, 0, 1, 2, 2, -1])
CROSS = np.array([[3, 4, -1], [3, 5, 4], [4, 3, 5], [0, 1, 2], [0, 2, 1], [0, 1, 2]])
CROSS_CODES = np.array([0, 1, 0, 0, 1, -1])          # a b a | a b None


def test_within_precision_hand_computed():
    # k=1: nodes 0, 1, 3 hit, node 2 misses, node 4's top-1 (node 5) is unlabelled -> 3/4.
    assert quality.precision_at_k(WITHIN, WITHIN_CODES, 1) == (0.75, 4)
    # k=2: 1/2, 1/2, 0, 1 (node 5 left out), 1 (node 5 left out) -> 3/5; k=3 adds only padding.
    assert quality.precision_at_k(WITHIN, WITHIN_CODES, 2) == pytest.approx((0.6, 5))
    assert quality.precision_at_k(WITHIN, WITHIN_CODES, 3) == pytest.approx((0.6, 5))


def test_within_chance_hand_computed():
    # Other labelled same-environment nodes sharing the label: 1/2, 1/2, 0/2, 1/1, 1/1.
    assert quality.chance_precision(WITHIN_CODES, ENV, "within") == pytest.approx((0.6, 5))
    report = quality.label_precision(WITHIN, WITHIN_CODES, ENV, "within", (1, 2), "tools")
    assert report.precision == pytest.approx((0.75, 0.6))
    assert report.ratio == pytest.approx((1.25, 1.0))
    assert report.num_scored == (4, 5)
    assert (report.num_labelled, report.num_unlabelled, report.num_distinct_labels) == (5, 1, 3)


def test_cross_precision_and_chance_hand_computed():
    # k=1: 3->a hit, b vs a, a vs b, a hit, b vs a -> 2/5.
    assert quality.precision_at_k(CROSS, CROSS_CODES, 1) == pytest.approx((0.4, 5))
    # k=2: 1/2, 0 (node 5 unlabelled), 1/2, 1/2, 0 -> 0.3.
    assert quality.precision_at_k(CROSS, CROSS_CODES, 2) == pytest.approx((0.3, 5))
    # Other-environment labelled population: env 1 = {a, b}, env 0 = {a, b, a}:
    # 1/2, 1/2, 1/2, 2/3, 1/3 -> 0.5.
    assert quality.chance_precision(CROSS_CODES, ENV, "cross") == pytest.approx((0.5, 5))


def test_jaccard_precision_and_chance_hand_computed():
    sets = [frozenset("x"), frozenset("xy"), frozenset("y"), frozenset("x"), frozenset(), None]
    codes, distinct = quality.encode_labels(sets)
    sim = quality.jaccard_matrix(distinct)
    np.testing.assert_array_equal(codes, [0, 1, 2, 0, 3, -1])
    np.testing.assert_allclose(sim, [[1, .5, 0, 0], [.5, 1, .5, 0], [0, .5, 1, 0], [0, 0, 0, 1]])
    # top-1: J(x,x)=1, J(xy,x)=.5, J(y,{})=0, J(x,x)=1, J({},x)=0 -> 2.5/5
    assert quality.precision_at_k(CROSS, codes, 1, sim) == pytest.approx((0.5, 5))
    # population means: (1+0)/2, (.5+0)/2, 0, (1+.5+0)/3, 0 -> 1.25/5
    assert quality.chance_precision(codes, ENV, "cross", sim) == pytest.approx((0.25, 5))


def test_nothing_to_score_is_nan():
    codes = np.array([-1, -1, -1, -1, -1, -1])
    p, n = quality.precision_at_k(WITHIN, codes, 1)
    assert math.isnan(p) and n == 0
    c, n = quality.chance_precision(codes, ENV, "within")
    assert math.isnan(c) and n == 0


def _reference_precision(idx, codes, k, sim):
    per_node = []
    for i in range(len(codes)):
        if codes[i] < 0:
            continue
        nbrs = [j for j in idx[i, :k] if j >= 0 and codes[j] >= 0]
        if nbrs:
            per_node.append(np.mean([sim[codes[i], codes[j]] for j in nbrs]))
    return np.mean(per_node), len(per_node)


def _reference_chance(codes, env, relation, sim):
    per_node = []
    for i in range(len(codes)):
        if codes[i] < 0:
            continue
        same = env == env[i]
        pop = [j for j in range(len(codes)) if codes[j] >= 0 and j != i
               and (same[j] if relation == "within" else not same[j])]
        if pop:
            per_node.append(np.mean([sim[codes[i], codes[j]] for j in pop]))
    return np.mean(per_node), len(per_node)


@pytest.mark.parametrize("jaccard", [False, True])
def test_precision_and_chance_match_brute_force(jaccard):
    rng = np.random.default_rng(3)
    n, m, num_codes = 60, 7, 5
    env = rng.integers(0, 4, n)
    codes = rng.integers(-1, num_codes, n)
    idx = rng.integers(-1, n, (n, m))
    sim = rng.random((num_codes, num_codes)) if jaccard else np.eye(num_codes)
    sim = (sim + sim.T) / 2
    np.fill_diagonal(sim, 1.0)
    pair_sim = sim if jaccard else None
    for k in (1, 3, 7):
        got = quality.precision_at_k(idx, codes, k, pair_sim)
        assert got == pytest.approx(_reference_precision(idx, codes, k, sim))
    for relation in ("within", "cross"):
        got = quality.chance_precision(codes, env, relation, pair_sim)
        assert got == pytest.approx(_reference_chance(codes, env, relation, sim))


def test_hubness_hand_computed():
    hub = quality.hubness(CROSS, 2, [f"t{i}" for i in range(6)])
    # top-1 lists: 3 3 4 0 0 0 -> N_1 = [3, 0, 0, 2, 1, 0]
    assert (hub.top1_max_in_degree, hub.top1_hub_task, hub.top1_distinct) == (3, "t0", 3)
    assert hub.top1_hub_share == 0.5 and hub.num_with_neighbour == 6
    assert hub.top1_skewness == pytest.approx(stats.skew([3, 0, 0, 2, 1, 0]))
    # top-2: N_2 = [3, 2, 1, 3, 2, 1]; the first of the tied largest is the hub.
    np.testing.assert_array_equal(quality.k_occurrence(CROSS, 2), [3, 2, 1, 3, 2, 1])
    assert (hub.topk_max_in_degree, hub.topk_hub_task, hub.topk_distinct) == (3, "t0", 6)
    assert hub.topk_skewness == pytest.approx(stats.skew([3, 2, 1, 3, 2, 1]))


def test_hubness_ignores_padding_and_constant_skew_is_nan():
    # Every node is in exactly two within lists (the -1 column counts for nobody).
    np.testing.assert_array_equal(quality.k_occurrence(WITHIN, 3), [2] * 6)
    hub = quality.hubness(WITHIN, 3)
    assert math.isnan(hub.topk_skewness)
    assert (hub.top1_max_in_degree, hub.top1_hub_task, hub.top1_distinct) == (2, "0", 5)
    padded = CROSS.copy()
    padded[5] = -1
    hub = quality.hubness(padded, 12)
    assert hub.num_with_neighbour == 5 and hub.top1_hub_share == pytest.approx(2 / 5)
    np.testing.assert_array_equal(quality.k_occurrence(padded, 12), [2, 2, 2, 3, 3, 2])


def test_worst_env_pair():
    names, envs = [f"t{i}" for i in range(6)], ("A", "B")
    pair = quality.worst_env_pair(CROSS, ENV, names, envs)
    # env B's three tasks all have t0 on top; env A's have t3, t3, t4.
    assert pair == quality.EnvPairHub("B", "A", "t0", 3, 3, 1.0)
    padded = CROSS.copy()
    padded[5] = -1
    # Count tie (2 and 2): the larger share (2 of 2 over 2 of 3) wins.
    assert quality.worst_env_pair(padded, ENV, names, envs) == quality.EnvPairHub("B", "A", "t0", 2, 2, 1.0)
    assert quality.worst_env_pair(np.full((6, 3), -1), ENV) is None


def test_distinct_counts():
    # Rows 0 and 1 are equal once canonicalised (unsorted indices, an explicit zero).
    m = sp.csr_matrix((np.array([0.5, 1.0, 1.0, 0.5, 0.0, 1.0], np.float32),
                       np.array([1, 0, 0, 1, 2, 2]), np.array([0, 2, 5, 6])), shape=(3, 3))
    assert quality.distinct_rows(m) == 2
    assert quality.distinct_rows(m.toarray()) == 2
    report = quality.distinct_abstract(["a b", "b a", "c"], m)
    assert (report.distinct_texts, report.distinct_rows, report.num_nodes) == (3, 2, 3)
    assert report.row_ratio == pytest.approx(2 / 3)
    assert quality.distinct_abstract(["a", "a", "c"], None).distinct_rows == 2


def test_state_change_labels_declared_and_not():
    declared = SimpleNamespace(env_id="d", operations=(Operation("get", kind="query"),
                                                       Operation("put", kind="state_change")))
    undeclared = SimpleNamespace(env_id="u", operations=())
    tasks = [SimpleNamespace(env_id="d", reference_actions=(Action("get"), Action("put"), Action("chat"))),
             SimpleNamespace(env_id="d", reference_actions=(Action("get"),)),
             SimpleNamespace(env_id="u", reference_actions=(Action("get"), Action("put"))),
             SimpleNamespace(env_id="u", reference_actions=None)]
    pool = SimpleNamespace(environments=(declared, undeclared), tasks=tasks, num_environments=2)
    labels, source = quality.state_change_labels(pool)
    assert labels == [frozenset({"put"}), frozenset(), frozenset({"get", "put"}), None]
    assert "1 of 2" in source
    codes, _ = quality.encode_labels(labels)
    np.testing.assert_array_equal(codes, [0, 1, 2, -1])


def test_cross_label_not_available():
    tasks = [SimpleNamespace(metadata={"shape": "s1"}), SimpleNamespace(metadata={})]
    pool = SimpleNamespace(tasks=tasks)
    template, shape = quality.CROSS_LABELS[0], quality.CROSS_LABELS[3]
    assert quality.cross_label_codes(pool, template) is None
    codes, sim = quality.cross_label_codes(pool, shape)
    np.testing.assert_array_equal(codes, [0, -1])
    assert sim is None


def test_scales_to_twenty_thousand_nodes():
    rng = np.random.default_rng(0)
    n, m = 20_000, 32
    env = np.repeat(np.arange(400), 50)
    idx = rng.integers(-1, n, (n, m)).astype(np.int32)
    codes = rng.integers(-1, 300, n)
    fam_codes = rng.integers(0, 12, n)
    sim = rng.random((12, 12))
    start = time.perf_counter()
    quality.label_precision(idx, codes, env, "within", (1, 5, 6), "tools")
    quality.label_precision(idx, fam_codes, env, "cross", (1, 5, 12), "families", (sim + sim.T) / 2)
    quality.hubness(idx, 12)
    quality.worst_env_pair(idx, env)
    assert time.perf_counter() - start < 5.0


@pytest.fixture(scope="module")
def embedded():
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.pool.sources import load_pool

    pool = load_pool("embedded")
    graph = build_graph(pool, GraphConfig())
    return pool, graph, quality.graph_quality(pool, graph)


def test_embedded_report_is_consistent(embedded):
    pool, graph, report = embedded
    n = pool.num_tasks
    assert report.num_nodes == n and report.num_environments == pool.num_environments
    available = {k: v for k, v in report.cross_precision.items() if not isinstance(v, str)}
    assert set(available) == {"shape"}                   # the embedded pool has no template/families
    assert report.cross_precision["template"] == quality.NOT_AVAILABLE
    assert report.within_precision.ks == (1, 5, 6) and available["shape"].ks == (1, 5, 12)
    for r in (report.within_precision, *available.values()):
        assert all(0.0 <= p <= 1.0 for p in r.precision) and 0.0 < r.chance <= 1.0
        assert r.num_labelled + r.num_unlabelled == n
        assert all(s <= r.num_labelled for s in r.num_scored)
        assert r.ratio == pytest.approx(tuple(p / r.chance for p in r.precision))
    for hub, idx in ((report.within_hubness, graph.within_idx), (report.cross_hubness, graph.cross_idx)):
        (hub_node, count), = Counter(idx[:, 0][idx[:, 0] >= 0].tolist()).most_common(1)
        assert hub.top1_max_in_degree == count
        assert hub.top1_hub_share == pytest.approx(count / hub.num_with_neighbour)
        assert hub.top1_distinct == len(set(idx[:, 0][idx[:, 0] >= 0].tolist())) <= n
    pair = report.cross_worst_pair
    assert pair.count <= pair.source_size and pair.source_env != pair.target_env
    assert pair.count <= report.cross_hubness.top1_max_in_degree
    d = report.distinct_abstract
    assert d.distinct_rows <= d.distinct_texts == len(set(graph.abstract_texts)) <= n
    json.dumps(report.to_json(), allow_nan=False)


def test_embedded_within_precision_matches_direct_count(embedded):
    """P@1 recomputed from the pool's own records, without the encoders."""
    pool, graph, report = embedded
    state_change = {e.env_id: {o.name for o in e.operations if o.kind == "state_change"}
                    for e in pool.environments}
    label = [frozenset(a.name for a in t.reference_actions) & state_change[t.env_id] for t in pool.tasks]
    hits = [label[i] == label[j] for i, j in enumerate(graph.within_idx[:, 0]) if j >= 0]
    assert report.within_precision.precision[0] == pytest.approx(np.mean(hits))
    shape = [t.metadata["shape"] for t in pool.tasks]
    hits = [shape[i] == shape[j] for i, j in enumerate(graph.cross_idx[:, 0]) if j >= 0]
    assert report.cross_precision["shape"].precision[0] == pytest.approx(np.mean(hits))


def test_script_smoke(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "neighbour_quality.py"), "--pools", "embedded",
         "--out", str(out), "--graph.num-candidates", "8", "--k-cross", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "quality.json").read_text())
    embedded = results["embedded"]
    assert embedded["num_candidates"] == 8 and embedded["k_cross"] == 8
    assert embedded["cross_precision"]["template"] == quality.NOT_AVAILABLE
    assert embedded["cross_precision"]["shape"]["ks"] == [1, 5, 8]
    assert json.loads((out / "args.json").read_text())["graph"]["num_candidates"] == 8
    assert "tool set" in proc.stdout and "not available" in proc.stdout
