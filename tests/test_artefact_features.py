"""Graph artefacts keep the TF-IDF feature matrices exactly (data, indices, indptr, storage order)
and load them memory-mapped."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import scipy.sparse as sp

from envsched_jax.graph.artefact import load_graph, save_graph
from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.pool.generator import generate_pool


@pytest.fixture(scope="module")
def graph():
    return build_graph(generate_pool(6, 9, seed=2), GraphConfig(dense="never", num_candidates=4))


def _assert_same(a: sp.csr_matrix, b: sp.csr_matrix) -> None:
    assert sp.isspmatrix_csr(b) and a.shape == b.shape and a.dtype == b.dtype
    for part in ("data", "indices", "indptr"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.dtype == y.dtype and np.array_equal(x, y), part


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip_keeps_features_bit_identical(graph, tmp_path, mmap):
    # a matrix whose rows are not sorted by column: storage order must survive the round trip
    unsorted = sp.csr_matrix((np.array([0.5, 0.25, 1.0], np.float32), np.array([3, 1, 0], np.int32),
                              np.array([0, 2, 2, 3] + [3] * (graph.num_nodes - 3), np.int32)),
                             shape=(graph.num_nodes, 5))
    assert not unsorted.has_sorted_indices
    features = dict(graph.features, extra=unsorted)
    g = dataclasses.replace(graph, features=features)
    save_graph(g, tmp_path / "g")
    loaded = load_graph(tmp_path / "g", mmap=mmap)
    assert list(loaded.features) == list(features)
    for view, matrix in features.items():
        _assert_same(matrix, loaded.features[view])
        assert loaded.features[view].data.flags.writeable is not mmap  # memory-mapped: read-only
    assert loaded.features["extra"].indices.tolist() == [3, 1, 0]
    assert loaded.abstract_texts == graph.abstract_texts and loaded.task_ids == graph.task_ids
    assert loaded.pool_hash == graph.pool_hash
    # the loaded matrices compute as the built ones do
    view = "instruction_words"
    assert np.array_equal((loaded.features[view] @ loaded.features[view].T).toarray(),
                          (graph.features[view] @ graph.features[view].T).toarray())


def test_artefacts_with_npz_features_still_load(graph, tmp_path):
    directory = save_graph(graph, tmp_path / "g")
    manifest = json.loads((directory / "manifest.json").read_text())
    files = [f for f in manifest["files"] if not f.startswith("features_")]
    for view, matrix in graph.features.items():
        for part in ("data", "indices", "indptr"):
            (directory / f"features_{view}.{part}.npy").unlink()
        sp.save_npz(directory / f"features_{view}.npz", matrix)
        files.append(f"features_{view}.npz")
    manifest["files"] = files
    del manifest["features"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    loaded = load_graph(directory)
    for view, matrix in graph.features.items():
        _assert_same(matrix, loaded.features[view])
