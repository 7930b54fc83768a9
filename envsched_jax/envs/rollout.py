"""Parallel rollouts: many episodes at once over a sandbox's workers.

:class:`RolloutPool` runs a list of :class:`RolloutJob` (a task plus either a fixed action
sequence or a policy) with one thread per worker; the threads only wait on their worker's pipe,
so the episodes really run in parallel, one per jailed worker. Every episode has a wall-clock
timeout, which bounds the wait for a worker and every sandbox request, and is checked between
policy calls (a policy call itself is not interrupted); an episode that fails in any way (a limit,
a crash, a timeout, a policy that raises, a request too large to send, a malformed reply) gives a
reward-0 trajectory whose ``error`` names the cause, gives its worker back, and never costs
another episode its result: :meth:`RolloutPool.run` always returns. Results come back in job order. :func:`group_rewards` turns them into the ``[B, K]``
reward matrix the schedulers observe (the paper's step: B = 64 tasks x K = 8 rollouts).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envsched_jax.envs.episode import Episode, run_actions
from envsched_jax.envs.sandbox.base import WorkerPool
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.model import Action, Pool, Task

Policy = Callable[[Task, Sequence[Any]], Action | None]
"""A policy: (task, observations so far) -> the next action, or None to stop acting."""


@dataclasses.dataclass(frozen=True)
class RolloutJob:
    """One episode to run: ``task`` with a fixed ``actions`` sequence or a ``policy``."""

    task: Task
    actions: tuple[Action, ...] | None = None
    policy: Policy | None = None
    rollout_index: int = 0

    def __post_init__(self):
        if (self.actions is None) == (self.policy is None):
            raise ValueError(f"RolloutJob for {self.task.task_id!r}: give exactly one of "
                             "'actions' and 'policy'")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Attributes:
      episode_timeout_s: wall-clock limit of one episode (reset to score).
      max_steps: actions per episode (EnvScaler's RL recipe: 40); None for no limit.
    """

    episode_timeout_s: float = 30.0
    max_steps: int | None = 40

    def __post_init__(self):
        if not self.episode_timeout_s > 0:
            raise ValueError(f"RolloutConfig.episode_timeout_s must be positive, "
                             f"got {self.episode_timeout_s!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"RolloutConfig.max_steps must be >= 1 or None, got {self.max_steps!r}")


def _failed(job: RolloutJob, kind: str, pool: WorkerPool, env_id: str, message: str) -> Trajectory:
    n = len(job.task.checks)
    error = f"{kind}: {message}"
    return Trajectory(job.task.task_id, env_id, pool.kind, [], [], 0.0, [False] * n,
                      [error] * n, kind, error, {})


class RolloutPool:
    def __init__(self, workers: WorkerPool, tasks: Pool, config: RolloutConfig | None = None):
        self.workers = workers
        self.tasks = tasks
        self.config = config or RolloutConfig()

    def run_one(self, job: RolloutJob) -> Trajectory:
        env = self.tasks.environment(job.task.env_id)
        try:
            if job.actions is not None:
                return run_actions(self.workers, env, job.task, job.actions,
                                   max_steps=self.config.max_steps,
                                   timeout=self.config.episode_timeout_s)
            return self._run_policy(job, env)
        except Exception as err:  # one failing episode must not lose the others
            return _failed(job, "rollout_error", self.workers, env.env_id,
                           f"{type(err).__name__}: {err}")

    def _run_policy(self, job: RolloutJob, env) -> Trajectory:
        timeout = self.config.episode_timeout_s
        episode = Episode(self.workers, env, max_steps=self.config.max_steps, timeout=timeout)
        observations = [episode.reset(job.task)]
        try:
            while not episode.done:
                action = job.policy(job.task, observations)
                if action is None:
                    break
                if episode.remaining_seconds() <= 0:
                    episode.close()
                    return _failed(job, "wall_clock", self.workers, env.env_id,
                                   f"episode timeout of {timeout:g} s exceeded (the policy "
                                   "was still acting)")
                observations.append(episode.step(action).observation)
        except Exception as err:
            episode.close()
            return _failed(job, "policy_error", self.workers, env.env_id,
                           f"{type(err).__name__}: {err}")
        episode.score()
        return episode.trajectory

    def run(self, jobs: Sequence[RolloutJob]) -> list[Trajectory]:
        """Run every job; results in job order."""
        with concurrent.futures.ThreadPoolExecutor(self.workers.size) as executor:
            return list(executor.map(self.run_one, jobs))


def group_rewards(trajectories: Sequence[Trajectory], task_ids: Sequence[str],
                  rollouts_per_task: int) -> np.ndarray:
    """``[len(task_ids), rollouts_per_task]`` float32 rewards, trajectories grouped by task in
    ``task_ids`` order (each task must have exactly ``rollouts_per_task`` of them)."""
    by_task: dict[str, list[float]] = {t: [] for t in task_ids}
    for traj in trajectories:
        if traj.task_id not in by_task:
            raise ValueError(f"trajectory of task {traj.task_id!r}, which is not in task_ids")
        by_task[traj.task_id].append(traj.reward)
    bad = {t: len(r) for t, r in by_task.items() if len(r) != rollouts_per_task}
    if bad:
        raise ValueError(f"expected {rollouts_per_task} rollouts per task, got {bad}")
    return np.array([by_task[t] for t in task_ids], dtype=np.float32)
