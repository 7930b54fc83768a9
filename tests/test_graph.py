"""Static graph: TF-IDF views against a hand computation, S_full / S_abs invariants, the
abstraction, candidate lists, the artefact and determinism."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from envsched_jax.graph.artefact import GraphArtefactError, load_graph, save_graph
from envsched_jax.graph.build import GraphConfig, build_graph, encode_view
from envsched_jax.graph.extract import analyse_environment, extract
from envsched_jax.pool.model import Action, Check, Environment, Pool, Task


def _reference_tfidf_cosine(docs_tokens: list[list[str]]) -> np.ndarray:
    """Plain TF-IDF as appendix D states it: sublinear tf = 1 + ln(tf), smooth idf =
    ln((1 + n) / (1 + df)) + 1, rows L2-normalised, cosine = dot product."""
    vocab = sorted({t for doc in docs_tokens for t in doc})
    n = len(docs_tokens)
    df = {t: sum(t in doc for doc in docs_tokens) for t in vocab}
    rows = []
    for doc in docs_tokens:
        vec = np.array([(1 + math.log(doc.count(t))) * (math.log((1 + n) / (1 + df[t])) + 1)
                        if t in doc else 0.0 for t in vocab])
        rows.append(vec / np.linalg.norm(vec))
    m = np.array(rows)
    return m @ m.T


def test_check_text_view_matches_hand_computed_cosine():
    texts = ["bed free", "bed free bed", "room booked"]
    # Word unigrams + bigrams, as the check-text view encodes them.
    tokens = [["bed", "free", "bed free"], ["bed", "free", "bed", "bed free", "free bed"],
              ["room", "booked", "room booked"]]
    expected = _reference_tfidf_cosine(tokens)
    X = encode_view(texts, "check_text", GraphConfig())
    got = (X @ X.T).toarray()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # Worked by hand for docs 0 and 1: idf(bed)=idf(free)=idf(bed free)=ln(4/3)+1,
    # idf(free bed)=ln(2)+1; doc 1 tf(bed)=2 -> 1+ln 2.
    a = math.log(4 / 3) + 1
    b = math.log(2) + 1
    d0 = np.array([a, a, a, 0.0])
    d1 = np.array([(1 + math.log(2)) * a, a, a, b])
    assert got[0, 1] == pytest.approx(d0 @ d1 / np.linalg.norm(d0) / np.linalg.norm(d1), abs=1e-6)
    assert got[0, 2] == pytest.approx(0.0)


def _env(env_id: str, entity: str, slot: str) -> Environment:
    source = f'''
class {entity.title()}System:
    def __init__(self, init_config):
        self.{entity}s = {{}}
        self.{slot}s = {{}}

    def get_{entity}_by_name(self, name):
        for key, rec in self.{entity}s.items():
            if rec["name"] == name:
                return {{"success": True, "data": {{"{entity}_id": key}}}}
        return {{"success": False, "error": "not found"}}

    def assign_{entity}_to_{slot}(self, {entity}_id, {slot}_id):
        slot = self.{slot}s.get({slot}_id)
        if slot is None or slot["holder"] is not None:
            return {{"success": False, "error": "{slot} not free"}}
        slot["holder"] = {entity}_id
        return {{"success": True}}
'''

    def tool(name, params):
        return {"type": "function", "function": {"name": name, "description": name.replace("_", " "),
                "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in params},
                               "required": list(params)}}}

    return Environment(env_id=env_id, class_name=f"{entity.title()}System", summary=f"{entity}s and {slot}s",
                       tools=(tool(f"get_{entity}_by_name", ["name"]),
                              tool(f"assign_{entity}_to_{slot}", [f"{entity}_id", f"{slot}_id"])),
                       class_source=source)


def _task(env: Environment, k: int, entity: str, slot: str, person: str, target: str) -> Task:
    key = f"{entity[0].upper()}{k}"
    return Task(
        task_id=f"{env.env_id}-{k}", env_id=env.env_id,
        instruction=f"Assign {person} to {slot} {target}.",
        initial_state={f"{entity}s": {key: {"name": person}}, f"{slot}s": {target: {"holder": None}}},
        checks=(Check(f"{person} holds {target}",
                      f"def check_func(final_state):\n    return final_state['{slot}s']['{target}']['holder'] == '{key}'"),
                Check(f"{person} record unchanged",
                      f"def check_func(final_state):\n    return final_state['{entity}s'] == initial_state['{entity}s']")),
        reference_actions=(Action(f"get_{entity}_by_name", {"name": person}),
                           Action(f"assign_{entity}_to_{slot}", {f"{entity}_id": key, f"{slot}_id": target}),
                           Action("chat_with_user", {"message": "done"})))


@pytest.fixture(scope="module")
def small_pool() -> Pool:
    envs = [_env("ward", "patient", "bed"), _env("rooms", "guest", "room"), _env("school", "student", "seat")]
    names = ["Ana Ruiz", "Tom Lee", "Mia Wong", "Raj Patel"]
    tasks = [_task(env, k, env.class_name[:-6].lower(), env.tools[1]["function"]["name"].rsplit("_", 1)[1],
                   names[k], f"X{k}{j}")
             for j, env in enumerate(envs) for k in range(4)]
    return Pool("small", tuple(envs), tuple(tasks))


def test_similarity_matrices_are_valid(small_pool):
    graph = build_graph(small_pool)
    for s in (graph.s_full, graph.s_abs):
        assert s.dtype == np.float32 and s.shape == (12, 12)
        np.testing.assert_allclose(s, s.T, atol=1e-6)
        np.testing.assert_array_equal(np.diag(s), 1.0)
        assert s.min() >= 0.0 and s.max() <= 1.0
    # S_full is the alpha-weighted sum of per-view cosines.
    manual = sum(w * (graph.features[v] @ graph.features[v].T).toarray()
                 for v, w in zip(["instruction_words", "instruction_chars", "check_text", "check_code",
                                  "initial_context", "operations"], GraphConfig().view_weights))
    off = ~np.eye(12, dtype=bool)
    np.testing.assert_allclose(graph.s_full[off], manual[off], atol=1e-5)
    # Same abstract shape in three domains: cross-environment abstract similarity is high,
    # while concrete similarity across domains is lower than within a domain.
    env = graph.env_index
    cross = env[:, None] != env[None, :]
    within = (env[:, None] == env[None, :]) & off
    assert graph.s_abs[cross].mean() > 0.9
    assert graph.s_full[within].mean() > graph.s_full[cross].mean()


def test_abstraction_removes_every_identifier(small_pool):
    task = small_pool.tasks[5]
    env = small_pool.environment(task.env_id)
    ex = extract(env, task)
    concrete = ex.concrete_text()
    abstract = ex.abstract_text()
    identifiers = {task.task_id, env.env_id, env.class_name, "guest", "room", "Tom", "Lee", "X11", "G1",
                   "holder", "name", *env.tool_names, "guests", "rooms", "guest_id", "room_id"}
    assert "assign_guest_to_room" in concrete  # the concrete description keeps them ...
    for ident in identifiers:                  # ... the abstract one has none of them
        assert not re.search(rf"(?<![A-Za-z0-9_]){re.escape(ident)}(?![A-Za-z0-9_])", abstract, re.I), ident
    assert "op_lookup" in abstract and "op_link" in abstract and "gate_state_precondition" in abstract
    assert "<string>" in abstract


def test_extraction_of_families_writes_and_gates(small_pool):
    env = small_pool.environments[0]
    tools = analyse_environment(env)
    lookup, assign = tools["get_patient_by_name"], tools["assign_patient_to_bed"]
    assert (lookup.family, lookup.state_changing, lookup.lookup_kind) == ("lookup", False, "entity_by_name")
    assert (assign.family, assign.state_changing) == ("link", True)
    assert assign.writes == {"beds"} and "state_precondition" in assign.guard_kinds
    ex = extract(env, small_pool.tasks[0])
    assert [g.type for g in ex.gates].count("identifier_resolution") == 1  # patient id, not in the text
    assert {r.relation for r in ex.reward_groups} == {"independent", "initially_satisfied"}
    assert ex.operations[1].depends_on == ("o0",)


def test_candidates_agree_with_dense_matrices(small_pool):
    graph = build_graph(small_pool, GraphConfig(num_candidates=5))
    env = graph.env_index
    for i in range(graph.num_nodes):
        w = graph.within_idx[i]
        assert (w[:3] >= 0).all() and (w[3:] == -1).all()  # 3 other tasks in the environment
        assert set(env[w[:3]]) == {env[i]} and i not in w
        np.testing.assert_allclose(graph.within_sim[i, :3], graph.s_full[i, w[:3]], atol=1e-6)
        assert (np.diff(graph.within_sim[i, :3]) <= 1e-7).all()
        c = graph.cross_idx[i]
        assert (env[c] != env[i]).all()
        best = np.sort(np.where(env != env[i], graph.s_abs[i], -1))[::-1][:5]
        np.testing.assert_allclose(graph.cross_sim[i], best, atol=1e-6)


def test_blocked_computation_matches_one_block(small_pool):
    a = build_graph(small_pool, GraphConfig(block_size=5))
    b = build_graph(small_pool, GraphConfig(block_size=512))
    np.testing.assert_allclose(a.s_full, b.s_full, atol=1e-6)
    np.testing.assert_array_equal(a.cross_idx, b.cross_idx)


@pytest.mark.parametrize("hubness", ["none", "csls"])
def test_cross_candidates_are_dense_entries_whatever_the_block(hubness):
    # The embedded pool has 79 distinct abstract rows for 192 tasks: the blocked path (not the
    # grouped one) ranks its cross-environment candidates. Its lists and similarities must not
    # depend on the block size, and each similarity must be the dense S_abs entry to the last bit
    # (a dense BLAS product per block and rounding inside the jitted ranking kernel broke both).
    from envsched_jax.pool.embedded import load_embedded_pool

    pool = load_embedded_pool()
    graphs = [build_graph(pool, GraphConfig(block_size=b, hubness=hubness)) for b in (1, 7, 512)]
    abstract = graphs[0].features["abstract"].toarray()
    assert len(np.unique(abstract, axis=0)) > graphs[0].num_nodes // 8
    for g in graphs[1:]:
        np.testing.assert_array_equal(g.cross_idx, graphs[0].cross_idx)
        np.testing.assert_array_equal(g.cross_sim, graphs[0].cross_sim)
    g = graphs[-1]
    rows, ranks = np.nonzero(g.cross_idx >= 0)
    np.testing.assert_array_equal(g.cross_sim[rows, ranks], g.s_abs[rows, g.cross_idx[rows, ranks]])


def test_artefact_round_trip_and_pool_check(small_pool, envscaler_pool, tmp_path):
    graph = build_graph(small_pool)
    out = save_graph(graph, tmp_path / "g")
    loaded = load_graph(out, small_pool)
    np.testing.assert_array_equal(loaded.s_full, graph.s_full)
    np.testing.assert_array_equal(loaded.cross_idx, graph.cross_idx)
    assert loaded.task_ids == graph.task_ids and loaded.config == graph.config
    with pytest.raises(GraphArtefactError, match="content hash"):
        load_graph(out, envscaler_pool)
    with pytest.raises(GraphArtefactError, match="already exists"):
        save_graph(graph, out)
    (out / "s_abs.npy").unlink()
    with pytest.raises(GraphArtefactError, match="missing file"):
        load_graph(out)


def test_same_pool_gives_identical_graph(small_pool):
    a, b = build_graph(small_pool), build_graph(small_pool)
    np.testing.assert_array_equal(a.s_full, b.s_full)
    np.testing.assert_array_equal(a.s_abs, b.s_abs)
    np.testing.assert_array_equal(a.within_idx, b.within_idx)
    assert a.abstract_texts == b.abstract_texts


def test_sparse_only_mode_for_large_pools(small_pool):
    graph = build_graph(small_pool, GraphConfig(dense="never"))
    assert graph.s_full is None and graph.s_abs is None
    assert graph.within_idx.shape == (12, 32)


@pytest.mark.parametrize("bad", [dict(view_weights=(0.5, 0.5, 0.5, 0, 0, 0)), dict(num_candidates=0),
                                 dict(dense="maybe")])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        GraphConfig(**bad)


def test_same_seed_gives_identical_generated_pool_and_graph():
    from envsched_jax.pool.generator import generate_pool

    pool_a, pool_b = generate_pool(4, 6, seed=11), generate_pool(4, 6, seed=11)
    assert pool_a.content_hash() == pool_b.content_hash()
    a, b = build_graph(pool_a), build_graph(pool_b)
    np.testing.assert_array_equal(a.s_full, b.s_full)
    np.testing.assert_array_equal(a.s_abs, b.s_abs)
    np.testing.assert_array_equal(a.cross_idx, b.cross_idx)
    other = build_graph(generate_pool(4, 6, seed=12))
    assert not np.array_equal(a.s_full, other.s_full)


def test_embedded_pool_graph_carries_information_on_both_edge_types():
    """Within an environment the concrete views separate tasks; across environments the abstract
    view finds the same task shape in another domain more often than chance."""
    from envsched_jax.pool.embedded import load_embedded_pool

    pool = load_embedded_pool()
    graph = build_graph(pool)
    shapes = np.array([t.metadata["shape"] for t in pool.tasks])
    env = graph.env_index
    same_env = env[:, None] == env[None, :]
    off = ~np.eye(graph.num_nodes, dtype=bool)
    assert graph.s_full[same_env & off].mean() > 2 * graph.s_full[~same_env].mean()
    top_cross = graph.cross_idx[:, 0]
    hit_rate = float(np.mean(shapes[top_cross] == shapes))
    chance = float(np.mean([np.mean(shapes[env != env[i]] == shapes[i]) for i in range(graph.num_nodes)]))
    assert hit_rate > 2 * chance, (hit_rate, chance)


@pytest.mark.slow
def test_dense_matrices_at_twenty_thousand_nodes():
    from envsched_jax.pool.generator import generate_pool

    pool = generate_pool(400, 50, seed=0)
    graph = build_graph(pool)
    assert graph.s_full.shape == (20_000, 20_000) and graph.s_full.dtype == np.float32
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, 20_000, size=(2, 2000))
    np.testing.assert_allclose(graph.s_full[i, j], graph.s_full[j, i], atol=1e-6)
    np.testing.assert_array_equal(np.diag(graph.s_abs), 1.0)
    # The candidate lists are the top of the dense rows.
    for r in i[:50]:
        w = graph.within_idx[r][graph.within_idx[r] >= 0]
        np.testing.assert_allclose(graph.within_sim[r, : len(w)], graph.s_full[r, w], atol=1e-6)


def test_grouped_and_blocked_cross_candidates_agree():
    from envsched_jax.graph.build import _cross_candidates_blocked, _cross_candidates_grouped
    from envsched_jax.pool.generator import generate_pool

    graph = build_graph(generate_pool(12, 10, seed=3), GraphConfig(dense="never"))
    abstract = graph.features["abstract"]
    uniq, inverse = np.unique(abstract.toarray(), axis=0, return_inverse=True)
    assert len(uniq) < graph.num_nodes  # shared abstract descriptions: the grouped path applies
    g_idx, g_val = _cross_candidates_grouped(uniq, inverse.reshape(-1), graph.env_index, 16, False)
    b_idx, b_val = _cross_candidates_blocked(abstract, graph.env_index, 16, 37, False)
    # Both are top lists of the same similarities: equal values; the indices may differ only
    # where two candidates' similarities agree to within the 1e-6 rounding (last-bit BLAS noise
    # can put a value on either side of a rounding boundary).
    np.testing.assert_allclose(g_val, b_val, atol=2e-6)
    differ = g_idx != b_idx
    assert differ.mean() < 0.01
    s_abs = (abstract @ abstract.T).toarray()
    rows = np.nonzero(differ)[0]
    np.testing.assert_allclose(s_abs[rows, g_idx[differ]], s_abs[rows, b_idx[differ]], atol=2e-6)
