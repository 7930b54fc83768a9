"""Parallel rollouts: the paper's step (64 tasks x 8 rollouts) over jailed workers, with hostile
episodes mixed in that must not cost the other episodes their results."""

from __future__ import annotations

import numpy as np
import pytest

from envsched_jax.envs.inprocess import run_episode
from envsched_jax.envs.rollout import RolloutConfig, RolloutJob, RolloutPool, group_rewards
from envsched_jax.envs.sandbox import SandboxConfig, SandboxLimits, make_worker_pool
from envsched_jax.pool.embedded import wrong_action_sequences
from envsched_jax.pool.model import Action, Pool
from envsched_jax.pool.sources import load_pool
from sandbox_helpers import sandbox_param
from test_sandbox_hostile import hostile_pool  # not "tests.": verl installs a top-level "tests" package

MiB = 2**20


def mixed_pool() -> Pool:
    emb, hostile = load_pool("embedded"), hostile_pool()
    return Pool("mixed", emb.environments + hostile.environments, emb.tasks + hostile.tasks)


@pytest.mark.parametrize("kind", [sandbox_param("bwrap"), sandbox_param("docker")])
def test_paper_step_64_by_8_survives_failing_episodes(kind):
    pool = mixed_pool()
    wrong = wrong_action_sequences()
    tasks = [t for t in pool.tasks if t.env_id != "hostile"][::3][:64]
    assert len(tasks) == 64
    jobs, expected = [], []
    for task in tasks:
        env = pool.environment(task.env_id)
        options = [task.reference_actions, *wrong.get(task.task_id, []), ()]
        for k in range(8):
            actions = tuple(options[k % len(options)])
            jobs.append(RolloutJob(task, actions=actions, rollout_index=k))
            expected.append(run_episode(env, task, actions).reward)
    hostile = pool.tasks[pool.task_index("hostile-0")]
    bad = {5: Action("spin"), 200: Action("nap"), 400: Action("fork_bomb")}
    for position, action in sorted(bad.items()):
        jobs.insert(position, RolloutJob(hostile, actions=(action,)))
    limits = SandboxLimits(cpu_seconds=1.0, wall_seconds=10.0, memory_bytes=256 * MiB,
                           max_processes=16)
    with make_worker_pool(SandboxConfig(kind=kind, limits=limits, num_workers=3)) as workers:
        # 6 s, not less: under a loaded CI machine an honest episode once took over 2 s
        results = RolloutPool(workers, pool, RolloutConfig(episode_timeout_s=6.0)).run(jobs)
        # the failing episodes' processes were killed inside their jails; no jail was replaced
        assert (workers.num_started, workers.num_replaced) == (3, 0)
    assert len(results) == len(jobs) == 512 + 3
    failed = [results[p] for p in sorted(bad)]
    # on a busy 2-core machine the spinning episode may reach the wall clock before 1 s of CPU
    assert failed[0].error.startswith(("cpu: CPU time limit", "wall_clock: episode timeout"))
    assert failed[1].error.startswith("wall_clock: episode timeout of 6 s")
    assert "process" in failed[2].error
    honest = [r for k, r in enumerate(results) if k not in bad]
    assert [r.reward for r in honest] == expected
    assert all(r.error is None or r.end_reason == "tool_error" for r in honest)
    rewards = group_rewards(honest, [t.task_id for t in tasks], 8)
    assert rewards.shape == (64, 8) and rewards.dtype == np.float32
    assert (rewards[:, 0] == 1.0).all()  # rollout 0 of every task is its reference


def test_policy_rollouts_and_a_raising_policy():
    pool = load_pool("embedded")
    task = pool.tasks[0]

    def reference_policy(t, observations):
        step = len(observations) - 1
        return t.reference_actions[step] if step < len(t.reference_actions) else None

    def broken_policy(t, observations):
        raise RuntimeError("policy crashed")

    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as workers:
        runner = RolloutPool(workers, pool, RolloutConfig(max_steps=40))
        good, broken = runner.run([RolloutJob(task, policy=reference_policy),
                                   RolloutJob(task, policy=broken_policy)])
    assert good.reward == 1.0 and good.end_reason == "chat_with_user"
    assert broken.reward == 0.0 and broken.error == "policy_error: RuntimeError: policy crashed"


def test_bad_jobs_and_configs_are_rejected():
    task = load_pool("embedded").tasks[0]
    with pytest.raises(ValueError, match="exactly one of 'actions' and 'policy'"):
        RolloutJob(task)
    with pytest.raises(ValueError, match="episode_timeout_s must be positive"):
        RolloutConfig(episode_timeout_s=0)
    with pytest.raises(ValueError, match="num_workers must be a positive integer"):
        SandboxConfig(num_workers=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        SandboxConfig(kind="vm")
    with pytest.raises(ValueError, match="expected 8 rollouts per task"):
        group_rewards([], [task.task_id], 8)
