"""The episode API: ``reset(task)``, ``step(tool_call)``, ``score()``, in any sandbox.

:class:`Episode` is the host-side handle of one episode. It leases a worker from a
:class:`~envsched_jax.envs.sandbox.WorkerPool` at ``reset`` and gives it back at ``score``; the
state machine itself (EnvScaler's and BFCL-v3 multi-turn semantics, documented in
:mod:`envsched_jax.envs.runtime.core`) runs inside the worker, so the host only ever sees JSON.
Everything is recorded into a :class:`~envsched_jax.envs.trajectory.Trajectory`.

A sandbox failure (a limit, a crash, a wall-clock timeout) ends the episode at once with reward 0
and an error naming the cause (``"cpu: CPU time limit exceeded"``, ``"wall_clock: ..."``); the
worker is replaced if it is no longer trustworthy. A wrong use of the API (``step`` after the end)
raises :class:`EpisodeError`.

:func:`run_actions` plays a fixed action sequence in one round trip (replay, benchmarks,
reference checks); :func:`with_turn_ends` turns a multi-turn reference sequence (actions tagged
with their user turn) into the sequence an agent would produce, with a ``chat_with_user`` closing
every turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.envs.runtime.core import CHAT_WITH_USER
from envsched_jax.envs.sandbox.base import SandboxError, Worker, WorkerPool
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.model import Action, Environment, Task


class EpisodeError(RuntimeError):
    """The episode API was used out of order."""


@dataclasses.dataclass(frozen=True)
class Score:
    reward: float
    check_results: tuple[bool, ...]
    check_errors: tuple[str | None, ...]
    error: str | None
    end_reason: str


@dataclasses.dataclass(frozen=True)
class StepResult:
    observation: Any
    done: bool


def episode_spec(env: Environment, task: Task, max_steps: int | None = None) -> dict[str, Any]:
    """The JSON an episode's worker receives: everything about ``env`` and ``task`` it needs."""
    if task.env_id != env.env_id:
        raise ValueError(f"task {task.task_id!r} belongs to {task.env_id!r}, not {env.env_id!r}")
    return {
        "env_id": env.env_id, "class_name": env.class_name, "class_source": env.class_source,
        "task_id": task.task_id, "instruction": task.instruction,
        "initial_state": dict(task.initial_state), "checks": [c.code for c in task.checks],
        "user_turns": list(task.user_turns),
        "withheld_tools": dict(task.metadata.get("withheld_tools", {})),
        "holdout_prompt": task.metadata.get("holdout_prompt", ""),
        "tool_names": list(env.tool_names), "max_steps": max_steps,
    }


def action_json(action: Action | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(action, Action):
        return {"name": action.name, "arguments": dict(action.arguments), "turn": action.turn}
    if not isinstance(action, Mapping) or not isinstance(action.get("name"), str):
        raise EpisodeError(f"an action must be an Action or a mapping with a string 'name', "
                           f"got {action!r}")
    return {"name": action["name"], "arguments": dict(action.get("arguments") or {}),
            "turn": int(action.get("turn", 0))}


def with_turn_ends(task: Task, actions: Sequence[Action]) -> tuple[Action, ...]:
    """For a multi-turn task, close every user turn with ``chat_with_user`` (turns taken from the
    actions' ``turn``); single-turn tasks and sequences that already chat are returned as is."""
    if not task.user_turns or any(a.name == CHAT_WITH_USER for a in actions):
        return tuple(actions)
    out: list[Action] = []
    turn = 0
    for action in actions:
        if action.turn < turn:
            raise ValueError(f"task {task.task_id!r}: action turns must not decrease "
                             f"({action.name} has turn {action.turn} after turn {turn})")
        while turn < action.turn:
            out.append(Action(CHAT_WITH_USER, {"message": ""}, turn=turn))
            turn += 1
        out.append(action)
    while turn < len(task.user_turns):
        out.append(Action(CHAT_WITH_USER, {"message": ""}, turn=turn))
        turn += 1
    return tuple(out)


class Episode:
    """One episode of ``env`` in the pool's sandbox.

    Args:
      pool: the workers to run in.
      env: the environment (admitted by the pool's backend at construction).
      max_steps: episode length limit (EnvScaler's RL recipe uses 40); None for no limit.
      timeout: wall-clock limit of the whole episode, from ``reset``; None uses the sandbox's
        per-request limit only.
    """

    def __init__(self, pool: WorkerPool, env: Environment, *, max_steps: int | None = None,
                 timeout: float | None = None):
        pool.admit(env)
        self.pool = pool
        self.env = env
        self.max_steps = max_steps
        self.timeout = timeout
        self._worker: Worker | None = None
        self._task: Task | None = None
        self._deadline = float("inf")
        self._start = 0.0
        self._actions: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._failure: SandboxError | None = None
        self.done = False
        self.trajectory: Trajectory | None = None

    # -- plumbing -------------------------------------------------------------------------
    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        limit = self.pool.backend.limits.wall_seconds
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise SandboxError("wall_clock", f"episode timeout of {self.timeout:g} s exceeded",
                               retire=False)
        timeout = min(limit, remaining)
        try:
            return self._worker.request(message, timeout)
        except SandboxError as err:
            if err.kind == "wall_clock" and remaining < limit:
                raise SandboxError("wall_clock", f"episode timeout of {self.timeout:g} s "
                                   "exceeded; the sandbox was killed", retire=True) from None
            raise

    def _fail(self, err: SandboxError) -> None:
        self._failure = err
        self.done = True
        self._release(healthy=not err.retire)

    def _release(self, healthy: bool) -> None:
        if self._worker is not None:
            self.pool.give_back(self._worker, healthy)
            self._worker = None

    # -- the API --------------------------------------------------------------------------
    def reset(self, task: Task) -> Any:
        if self._worker is not None or self._task is not None:
            raise EpisodeError("reset called twice: use a new Episode per task")
        self._task = task
        self._start = time.monotonic()
        self._deadline = self._start + self.timeout if self.timeout else float("inf")
        self._worker = self.pool.lease()
        try:
            reply = self._request({"op": "reset",
                                   "spec": episode_spec(self.env, task, self.max_steps)})
        except SandboxError as err:
            self._events.append({"kind": "reset", "observation": None, "state": {}})
            self._fail(err)
            return None
        self._events.append({"kind": "reset", "observation": reply["observation"],
                             "state": reply["state"]})
        return reply["observation"]

    def step(self, action: Action | Mapping[str, Any]) -> StepResult:
        if self._task is None:
            raise EpisodeError("step before reset")
        if self.done:
            raise EpisodeError("step after the end of the episode")
        act = action_json(action)
        self._actions.append(act)
        try:
            reply = self._request({"op": "step", "action": act})
        except SandboxError as err:
            self._events.append({"kind": "step", "action": act, "observation": None,
                                 "state_change": {}, "done": True, "error": str(err)})
            self._fail(err)
            return StepResult(None, True)
        self.done = bool(reply["done"])
        self._events.append({"kind": "step", "action": act, "observation": reply["observation"],
                             "state_change": reply["state_change"], "done": self.done,
                             "turn": reply.get("turn", 0)})
        return StepResult(reply["observation"], self.done)

    def score(self) -> Score:
        if self._task is None:
            raise EpisodeError("score before reset")
        if self.trajectory is not None:
            raise EpisodeError("score called twice")
        if self._failure is None:
            try:
                reply = self._request({"op": "score"})
            except SandboxError as err:
                self._fail(err)
            else:
                self._release(healthy=True)
                self.done = True
                self._finish(reply)
        if self._failure is not None:
            n = len(self._task.checks)
            self._finish({"reward": 0.0, "check_results": [False] * n,
                          "check_errors": [str(self._failure)] * n, "final_state": {},
                          "end_reason": f"sandbox_{self._failure.kind}",
                          "error": str(self._failure)})
        t = self.trajectory
        return Score(t.reward, tuple(t.check_results), tuple(t.check_errors), t.error,
                     t.end_reason)

    def _finish(self, reply: Mapping[str, Any]) -> None:
        self._events.append({"kind": "score", "reward": reply["reward"],
                             "check_results": reply["check_results"],
                             "check_errors": reply["check_errors"],
                             "turn_states": reply.get("turn_states", [])})
        self.trajectory = Trajectory(
            task_id=self._task.task_id, env_id=self.env.env_id, sandbox=self.pool.kind,
            actions=self._actions, events=self._events, reward=float(reply["reward"]),
            check_results=list(reply["check_results"]), check_errors=list(reply["check_errors"]),
            end_reason=reply["end_reason"], error=reply.get("error"),
            final_state=reply["final_state"], wall_seconds=time.monotonic() - self._start)

    def close(self) -> None:
        """Give the worker back without scoring (e.g. the caller gave up)."""
        self._release(healthy=False)
        self.done = True


def run_actions(pool: WorkerPool, env: Environment, task: Task,
                actions: Sequence[Action | Mapping[str, Any]], *, max_steps: int | None = None,
                timeout: float | None = None) -> Trajectory:
    """Play a fixed action sequence as one episode in one worker round trip; the trajectory is
    the same as stepping through the actions one by one."""
    pool.admit(env)
    acts = [action_json(a) for a in actions]
    limit = pool.backend.limits.wall_seconds
    start = time.monotonic()
    worker = pool.lease()
    try:
        reply = worker.request({"op": "run", "spec": episode_spec(env, task, max_steps),
                                "actions": acts},
                               min(limit, timeout) if timeout else limit)
    except SandboxError as err:
        pool.give_back(worker, healthy=not err.retire)
        if err.kind == "wall_clock" and timeout and timeout < limit:
            err = SandboxError("wall_clock", f"episode timeout of {timeout:g} s exceeded; the "
                               "sandbox was killed", retire=True)
        n = len(task.checks)
        return Trajectory(task.task_id, env.env_id, pool.kind, acts,
                          [{"kind": "reset", "observation": None, "state": {}}], 0.0,
                          [False] * n, [str(err)] * n, f"sandbox_{err.kind}", str(err), {},
                          time.monotonic() - start)
    except BaseException:
        pool.give_back(worker, healthy=False)
        raise
    pool.give_back(worker, healthy=True)
    return trajectory_from_record(reply["record"], task, env, pool.kind, acts,
                                  time.monotonic() - start)


def trajectory_from_record(record: Mapping[str, Any], task: Task, env: Environment, sandbox: str,
                           actions: list[dict[str, Any]], wall_seconds: float) -> Trajectory:
    reset = record["reset"]
    events: list[dict[str, Any]] = [{"kind": "reset", "observation": reset["observation"],
                                     "state": reset["state"]}]
    for act, step in zip(actions, record["steps"]):
        events.append({"kind": "step", "action": act, "observation": step["observation"],
                       "state_change": step["state_change"], "done": step["done"],
                       "turn": step.get("turn", 0)})
    score = record["score"]
    events.append({"kind": "score", "reward": score["reward"],
                   "check_results": score["check_results"], "check_errors": score["check_errors"],
                   "turn_states": score.get("turn_states", [])})
    return Trajectory(task.task_id, env.env_id, sandbox, actions[:len(record["steps"])], events,
                      float(score["reward"]), list(score["check_results"]),
                      list(score["check_errors"]), score["end_reason"], score.get("error"),
                      score["final_state"], wall_seconds)
