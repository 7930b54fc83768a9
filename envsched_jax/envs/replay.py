"""Deterministic replay: a saved action sequence gives the same final state and reward again.

Episodes are deterministic functions of (environment code, initial state, actions): the state
machine (:mod:`envsched_jax.envs.runtime.core`) starts each episode from a fresh instance built
from the task's JSON initial state, and every sandbox runs the same interpreter. :func:`replay`
re-runs a stored trajectory's actions (never sampling anything new) and reports whether the reward
agrees within ``tolerance`` (the paper's 1e-4) and whether the final state is identical.
Environment code that reads clocks or unseeded random numbers can break this; such a replay is
reported as a mismatch, not hidden.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.runtime.core import USER_STOP
from envsched_jax.envs.sandbox.base import WorkerPool
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.model import Action, Pool

REPLAY_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    task_id: str
    stored_reward: float
    replayed: Trajectory
    tolerance: float

    @property
    def reward(self) -> float:
        return self.replayed.reward

    @property
    def reward_matches(self) -> bool:
        return abs(self.replayed.reward - self.stored_reward) <= self.tolerance


def same_state(a: dict, b: dict) -> bool:
    """States compared as canonical JSON (key order and tuple/list spelling do not matter)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def replay_actions(workers: WorkerPool, tasks: Pool, task_id: str, actions: Sequence[Action],
                   stored_reward: float, *, tolerance: float = REPLAY_TOLERANCE,
                   timeout: float | None = None, user_stop: bool = False) -> ReplayResult:
    """Replay ``actions``; ``user_stop``: the simulated user then ends the conversation, as it
    did in the stored episode (:meth:`~envsched_jax.envs.episode.Episode.user_stop`)."""
    task = tasks.tasks[tasks.task_index(task_id)]
    replayed = run_actions(workers, tasks.environment(task.env_id), task, actions,
                           timeout=timeout, user_stop=user_stop)
    return ReplayResult(task_id, stored_reward, replayed, tolerance)


def replay(workers: WorkerPool, tasks: Pool, trajectory: Trajectory, *,
           tolerance: float = REPLAY_TOLERANCE, timeout: float | None = None) -> ReplayResult:
    """Replay ``trajectory``'s actions in ``workers``' sandbox (and the simulated user's end of
    the conversation where it ended so)."""
    return replay_actions(workers, tasks, trajectory.task_id, trajectory.action_records(),
                          trajectory.reward, tolerance=tolerance, timeout=timeout,
                          user_stop=trajectory.end_reason == USER_STOP)
