"""SchedulerFeed: a scheduler behind a trainer's loop (steps, rewards in pieces, checkpoints,
bad input), and prompt pools (a trainer's dataset as tasks)."""

from __future__ import annotations

import numpy as np
import pytest

from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.integrations import SchedulerFeed
from envsched_jax.pool.model import PoolError
from envsched_jax.pool.prompts import prompt_pool
from envsched_jax.sched import make_scheduler
from envsched_jax.sched.base import CheckpointError, SchedulerInputError

RECORDS = [{"task_id": f"t{i:02d}", "prompt": f"Compute {i} {'+-*'[i % 3]} {i % 7} and answer with digits only.",
            "environment": ("add", "sub", "mul")[i % 3], "check": "exact match of the number"} for i in range(48)]


@pytest.fixture(scope="module")
def graph():
    return build_graph(prompt_pool(RECORDS), GraphConfig(dense="always"))


def _feed(graph, name="envsched", **kw):
    return SchedulerFeed(make_scheduler(name, graph, batch_size=6, group_size=4, seed=0), **kw)


def _rollouts(ids, k, rng):
    flat = [t for t in ids for _ in range(k)]
    order = rng.permutation(len(flat))   # trainers may return rewards in any order
    return [flat[i] for i in order], rng.random(len(flat))[order]


@pytest.mark.parametrize("name", ["envsched", "random", "dps"])
def test_the_feed_drives_any_scheduler_like_its_own_api(graph, name):
    feed, twin = _feed(graph, name, step_offset=1), make_scheduler(name, graph, batch_size=6, group_size=4, seed=0)
    rng = np.random.default_rng(0)
    for trainer_step in range(1, 6):
        ids = feed.next_batch(trainer_step)
        assert ids == twin.select(trainer_step - 1) == feed.next_batch(trainer_step)   # asked twice: same
        flat, rewards = _rollouts(ids, 4, rng)
        assert feed.record(flat[:7], rewards[:7]) is False and feed.pending == ids
        assert feed.record(flat[7:], rewards[7:], trainer_step=trainer_step) is True
        matrix = np.zeros((6, 4))
        filled = {t: 0 for t in ids}
        for t, r in zip(flat, rewards):
            matrix[ids.index(t), filled[t]] = r
            filled[t] += 1
        twin.observe(trainer_step - 1, ids, matrix)
    assert feed.next_trainer_step == 6
    assert [m.realised_variance for m in feed.scheduler.metrics()] == [m.realised_variance for m in twin.metrics()]


def test_a_restart_resumes_both_sides_exactly(graph, tmp_path):
    rng = np.random.default_rng(1)
    feed = _feed(graph)
    for step in range(3):
        flat, r = _rollouts(feed.next_batch(step), 4, rng)
        feed.record(flat, r)
    folder = feed.save(tmp_path)
    flat, r = _rollouts(feed.next_batch(3), 4, rng)
    feed.record(flat, r)
    after = feed.next_batch(4)
    resumed = _feed(graph)
    resumed.restore(folder, trainer_step=3)
    assert resumed.next_batch(3) == feed.scheduler.metrics()[3].task_ids
    resumed.record(flat, r)
    assert resumed.next_batch(4) == after
    with pytest.raises(CheckpointError, match="the scheduler continues at trainer step 3, the trainer at 7"):
        _feed(graph).restore(folder, trainer_step=7)
    with pytest.raises(CheckpointError, match="saved with step_offset 0, this feed has 1"):
        _feed(graph, step_offset=1).restore(folder)


def test_mismatches_are_named_and_record_nothing(graph):
    feed = _feed(graph)
    with pytest.raises(SchedulerInputError, match="no batch awaits rewards"):
        feed.record(["t00"], [1.0])
    ids = feed.next_batch(0)
    outsider = next(r["task_id"] for r in RECORDS if r["task_id"] not in ids)
    cases = [
        ((ids[:1] + [outsider], [0.5, 0.5]), f"task {outsider!r}, which is not in the pending batch"),
        (([ids[0]] * 5, [1.0] * 5), "more than K = 4 rewards"),
        ((ids[:2], [0.5, float("nan")]), f"reward of task {ids[1]!r} is nan"),
        ((ids[:2], [0.5, 1.5]), "outside [0, 1] (declare the trainer's reward_range"),
        ((ids[:2], [0.5, "1"]), "is '1', not a real number"),
        ((ids[:2], [0.5]), "2 task ids but 1 rewards"),
    ]
    for (tids, rewards), message in cases:
        with pytest.raises(SchedulerInputError, match=message.replace("(", r"\(").replace("[", r"\[")):
            feed.record(tids, rewards)
        assert feed.recorded == {t: () for t in ids}                   # nothing half-recorded
    with pytest.raises(SchedulerInputError, match=r"trainer step 1: the batch of trainer step 0 still lacks rewards"):
        feed.next_batch(1)
    with pytest.raises(SchedulerInputError, match="the pending batch is trainer step 0"):
        feed.record(ids, [0.5] * 6, trainer_step=1)
    with pytest.raises(SchedulerInputError, match="save after the step's rewards are recorded"):
        feed.save("/nonexistent")
    fresh = _feed(graph)
    with pytest.raises(SchedulerInputError, match="the scheduler's next step is trainer step 0"):
        fresh.next_batch(5)


def test_a_declared_reward_range_is_mapped_and_enforced(graph):
    feed = _feed(graph, reward_range=(-1.0, 3.0))
    ids = feed.next_batch(0)
    flat = [t for t in ids for _ in range(4)]
    with pytest.raises(SchedulerInputError, match=r"outside the declared reward_range \[-1.0, 3.0\]"):
        feed.record(flat[:1], [3.5])
    assert feed.record(flat, [-1.0, 3.0, 1.0, 1.0] * 6)
    assert feed.scheduler.metrics()[0].mean_reward == [0.5] * 6
    with pytest.raises(ValueError, match="lo < hi"):
        _feed(graph, reward_range=(1.0, 1.0))


def test_prompt_pool_builds_a_graph_and_names_bad_records():
    pool = prompt_pool(RECORDS)
    assert pool.num_environments == 3 and pool.num_tasks == 48
    assert prompt_pool([{"task_id": "a", "prompt": "x"}]).environments[0].env_id == "dataset"
    for records, message in [
        ([{"task_id": "a"}], "record 1, field 'prompt': must be a non-empty string"),
        ([{"task_id": "a", "prompt": "x"}, {"task_id": "a", "prompt": "y"}], "record 2, field 'task_id': task id 'a' repeats record 1"),
        ([{"task_id": "a", "prompt": "x", "answer": 3}], "record 1, field 'answer': unknown field"),
        ([{"task_id": "a", "prompt": "x", "environment": 3}], "field 'environment': must be a string"),
        (["text"], "record 1: expected a mapping"),
        ([], "no records"),
    ]:
        with pytest.raises(PoolError, match=message):
            prompt_pool(records)


def test_a_retried_step_can_discard_what_it_recorded(graph):
    feed = _feed(graph)
    ids = feed.next_batch(0)
    flat = [t for t in ids for _ in range(4)]
    feed.record(flat[:10], [0.5] * 10)
    with pytest.raises(SchedulerInputError, match="more than K = 4 rewards"):
        feed.record(flat, [0.5] * 24)          # the retry of the whole step, without discarding
    feed.discard_recorded()
    assert feed.recorded == {t: () for t in ids} and feed.next_batch(0) == ids
    assert feed.record(flat, [1.0] * 24) is True
    assert feed.scheduler.metrics()[0].mean_reward == [1.0] * 6
