"""The streamed graph build (``build_graph_stream``) equals ``build_graph`` of the in-memory pool."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from envsched_jax.graph.build import (
    GraphConfig,
    _TextColumn,
    build_graph,
    build_graph_stream,
    stack_views,
    within_candidates,
    within_candidates_from_views,
)
from envsched_jax.pool.generator import generate_pool_of_size, generated_pool_stream


def _same_csr(a: sp.csr_matrix, b: sp.csr_matrix) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    for x, y in ((a.data, b.data), (a.indices, b.indices), (a.indptr, b.indptr)):
        assert x.dtype == y.dtype and np.array_equal(x, y)  # storage order included


@pytest.fixture(scope="module")
def pair():
    stream = generated_pool_stream(1130, seed=3, tasks_per_environment=40)
    pool = generate_pool_of_size(1130, seed=3, tasks_per_environment=40)
    config = GraphConfig(dense="never", num_candidates=8)
    return build_graph_stream(stream, config), build_graph(pool, config), pool, stream


def test_stream_records_equal_the_pool(pair):
    _, _, pool, stream = pair
    assert stream.name == pool.name
    assert tuple(stream.environments()) == pool.environments
    assert tuple(t for _, tasks in stream.chunks() for t in tasks) == pool.tasks


def test_stream_build_equals_pool_build(pair):
    streamed, built, pool, _ = pair
    assert streamed.pool_hash == built.pool_hash == pool.content_hash()
    assert streamed.pool_name == built.pool_name
    assert streamed.task_ids == built.task_ids and streamed.env_ids == built.env_ids
    assert streamed.abstract_texts == built.abstract_texts
    for name in ("env_index", "within_idx", "within_sim", "cross_idx", "cross_sim"):
        a, b = getattr(streamed, name), getattr(built, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert streamed.s_full is None and streamed.s_abs is None
    assert list(streamed.features) == list(built.features)
    for view in built.features:
        _same_csr(streamed.features[view], built.features[view])
    assert "generate" in streamed.timings and "generate" not in built.timings


def test_batched_within_candidates_equal_the_full_stack(pair):
    graph = pair[1]
    weights = graph.config.concrete_weights()
    views = [graph.features[v] for v in weights]
    full = within_candidates(stack_views(views, list(weights.values())), graph.env_index, 8)
    for batch_rows in (1, 100, 10**6):
        got = within_candidates_from_views(views, list(weights.values()), graph.env_index, 8, batch_rows=batch_rows)
        assert np.array_equal(got[0], full[0]) and np.array_equal(got[1], full[1])


def test_text_column_round_trip():
    texts = ["", "a", "caf\u00e9 \U0001f600", "x" * 10_000, "\ud800 lone surrogate", "line\nbreak"] * 7
    column = _TextColumn(block=4)
    for t in texts:
        column.append(t)
    assert len(column) == len(texts)
    assert list(column) == texts
    assert list(column) == texts  # iterable more than once


def test_stream_with_a_wrong_task_count_is_an_error():
    class Short:
        name, num_tasks = "short", 5
        _inner = generated_pool_stream(3, seed=0)

        def environments(self):
            return self._inner.environments()

        def chunks(self):
            return self._inner.chunks()

    with pytest.raises(ValueError, match="announced 5 tasks but gave 3"):
        build_graph_stream(Short(), GraphConfig(dense="never"))
