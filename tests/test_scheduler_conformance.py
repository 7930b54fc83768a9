"""One conformance test that every registered scheduler passes."""

from __future__ import annotations

import numpy as np
import pytest

from envsched_jax.sched import SchedulerInputError, make_scheduler, registered_schedulers
from envsched_jax.sched.checkpoint import latest_checkpoint, restore_scheduler, save_scheduler

from sched_helpers import random_graph, reward_groups

B, K = 8, 4


@pytest.fixture(scope="module")
def graph():
    return random_graph(np.random.default_rng(0), num_envs=6, per_env=10, dtype=np.float32)


def _run(sched, steps, seed, start=0):
    rng = np.random.default_rng(seed + start)
    batches = []
    for t in range(start, start + steps):
        ids = sched.select(t)
        batches.append(ids)
        sched.observe(t, ids, reward_groups(rng, len(ids), K))
    return batches


def test_registry_has_the_schedulers():
    assert {"envsched", "random"} <= set(registered_schedulers())
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        make_scheduler("nope", None)


@pytest.mark.parametrize("name", registered_schedulers())
def test_conformance(name, graph, tmp_path):
    sched = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    batches = _run(sched, 5, seed=1)
    for ids in batches:  # distinct batches of the requested size, ids from the pool
        assert len(ids) == B and len(set(ids)) == B and set(ids) <= set(graph.task_ids)
    metrics = sched.metrics()
    assert [m.step for m in metrics] == list(range(5))
    assert all(m.realised_variance is not None and len(m.phases) == B for m in metrics)

    # Determinism for a seed.
    again = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    assert _run(again, 5, seed=1) == batches

    # Save at step 5, restore into a fresh scheduler: identical continuation.
    folder = save_scheduler(sched, tmp_path / name)
    assert latest_checkpoint(tmp_path / name) == folder
    restored = restore_scheduler(make_scheduler(name, graph, batch_size=B, group_size=K, seed=3), folder)
    assert _run(restored, 4, seed=1, start=5) == _run(sched, 4, seed=1, start=5)

    # Bad rewards are rejected and change nothing.
    t = 9
    ids = sched.select(t)
    before = sched._state_arrays()
    good = np.full((B, K), 0.5)
    for bad in (np.where(np.eye(B, K, dtype=bool), np.nan, good), good + 1.0, good[:, :K - 1],
                np.where(np.eye(B, K, dtype=bool), np.inf, good)):
        with pytest.raises(SchedulerInputError):
            sched.observe(t, ids, bad)
    with pytest.raises(SchedulerInputError, match="repeated"):
        sched.observe(t, [ids[0]] * B, good)
    with pytest.raises(SchedulerInputError, match="unknown"):
        sched.observe(t, ["nope"] + ids[1:], good)
    with pytest.raises(SchedulerInputError, match="was not selected"):
        sched.observe(t + 1, ids, good)
    with pytest.raises(SchedulerInputError, match="awaits observe"):
        sched.select(t + 1)
    after = sched._state_arrays()
    assert before.keys() == after.keys()
    for key in before:  # the state is exactly as before the bad calls
        np.testing.assert_array_equal(before[key], after[key])
    sched.observe(t, ids, good)  # and the right observation is still accepted
