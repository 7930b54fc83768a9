"""Deterministic replay: a saved action sequence gives the same final state and reward again.

Episodes are deterministic functions of (environment code, initial state, actions): the state
machine (:mod:`envsched_jax.envs.runtime.core`) starts each episode from a fresh instance built
from the task's JSON initial state, and every sandbox runs the same interpreter. :func:`replay`
re-runs a stored trajectory's actions (never sampling anything new) and reports whether the reward
agrees within ``tolerance`` (the paper's 1e-4) and whether the final state is identical.
Environment code that reads clocks or unseeded random numbers can break this; such a replay is
reported as a mismatch, not hidden.

Task bundles (``metadata["semantics"] == "terminal"``) replay in a fresh container of their image
(:func:`envsched_jax.envs.terminal.run_terminal_actions`, scored by the bundle's tests); their
final state is the tests' outcome (reward, exit status, reward file), not a Python state.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.runtime.core import USER_STOP
from envsched_jax.envs.sandbox.base import WorkerPool
from envsched_jax.envs.terminal import TerminalRuntime, run_terminal_actions
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.bundles import is_terminal_task
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


def replay_actions(workers: WorkerPool | None, tasks: Pool, task_id: str,
                   actions: Sequence[Action], stored_reward: float, *,
                   tolerance: float = REPLAY_TOLERANCE, timeout: float | None = None,
                   user_stop: bool = False, terminal: TerminalRuntime | None = None) -> ReplayResult:
    """Replay ``actions``; ``user_stop``: the simulated user then ends the conversation, as it
    did in the stored episode (:meth:`~envsched_jax.envs.episode.Episode.user_stop`). A terminal
    task replays in ``terminal`` (a runtime made for this call and closed after it when None);
    ``workers`` are then not used."""
    task = tasks.tasks[tasks.task_index(task_id)]
    env = tasks.environment(task.env_id)
    if is_terminal_task(task):
        runtime = terminal or TerminalRuntime()
        try:
            replayed = run_terminal_actions(runtime, env, task, actions, timeout=timeout)
        finally:
            if terminal is None:
                runtime.close()
        return ReplayResult(task_id, stored_reward, replayed, tolerance)
    if workers is None:
        raise ValueError(f"task {task_id!r} runs in a sandbox worker; replay_actions needs workers")
    replayed = run_actions(workers, env, task, actions, timeout=timeout, user_stop=user_stop)
    return ReplayResult(task_id, stored_reward, replayed, tolerance)


def replay(workers: WorkerPool | None, tasks: Pool, trajectory: Trajectory, *,
           tolerance: float = REPLAY_TOLERANCE, timeout: float | None = None,
           terminal: TerminalRuntime | None = None) -> ReplayResult:
    """Replay ``trajectory``'s actions in ``workers``' sandbox, or in ``terminal`` for a task
    bundle (and the simulated user's end of the conversation where it ended so)."""
    return replay_actions(workers, tasks, trajectory.task_id, trajectory.action_records(),
                          trajectory.reward, tolerance=tolerance, timeout=timeout,
                          user_stop=trajectory.end_reason == USER_STOP, terminal=terminal)
