"""The episode API: ``reset(task)``, ``step(tool_call)``, ``score()``, in any sandbox.

:class:`Episode` is the host-side handle of one episode. It leases a worker from a
:class:`~envsched_jax.envs.sandbox.WorkerPool` at ``reset`` and gives it back at ``score``; the
state machine itself (EnvScaler's runner's rules for EnvScaler's pool, the project's for its own
pools and BFCL-v3 multi-turn, chosen by the task's ``metadata["semantics"]`` and documented in
:mod:`envsched_jax.envs.runtime.core`) runs inside the worker, so the host only ever sees JSON.
Everything is recorded into a :class:`~envsched_jax.envs.trajectory.Trajectory`.

A sandbox failure (a limit, a crash, a wall-clock timeout) ends the episode at once with reward 0
and an error naming the cause (``"cpu: CPU time limit exceeded"``, ``"wall_clock: ..."``); the
worker is replaced if it is no longer trustworthy. So does anything else that goes wrong between
``reset`` and ``score`` (a request too large to send, a malformed reply): the worker is always
given back, and the episode always ends with a named error. What a worker reports as the score is
validated where it enters this process (:func:`validate_score`: a finite reward in [0, 1] equal
to the fraction of passed checks, one boolean per declared check); a score that fails ends the
episode with reward 0 and an ``invalid_score`` error. A wrong use of the API (``step`` after the
end) raises :class:`EpisodeError`.

:func:`run_actions` plays a fixed action sequence in one round trip (replay, benchmarks,
reference checks); :func:`with_turn_ends` turns a multi-turn reference sequence (actions tagged
with their user turn) into the sequence an agent would produce, with a ``chat_with_user`` closing
every turn.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.envs.runtime.core import (CHAT_WITH_USER, PRIVATE_METHODS, SEMANTICS, USER_STOP,
                                            reward_of)
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
    """One step's outcome. ``message``: for ``envscaler`` tasks, the observation as EnvScaler's
    runner shows it to the policy (``{"role": "tool" | "user", "content": text}``, see
    :func:`envsched_jax.envs.runtime.core.envscaler_message`); None otherwise."""

    observation: Any
    done: bool
    message: Mapping[str, str] | None = None


def episode_spec(env: Environment, task: Task, max_steps: int | None = None) -> dict[str, Any]:
    """The JSON an episode's worker receives: everything about ``env`` and ``task`` it needs."""
    if task.env_id != env.env_id:
        raise ValueError(f"task {task.task_id!r} belongs to {task.env_id!r}, not {env.env_id!r}")
    user_mode = task.metadata.get("user_mode", "scripted")
    if user_mode not in ("scripted", "simulated"):
        raise ValueError(f"task {task.task_id!r}: metadata user_mode must be 'scripted' or "
                         f"'simulated', got {user_mode!r}")
    semantics = task_semantics(task)
    private_methods = task.metadata.get("private_methods", "allow")
    if private_methods not in PRIVATE_METHODS:
        raise ValueError(f"task {task.task_id!r}: metadata private_methods must be one of "
                         f"{PRIVATE_METHODS}, got {private_methods!r}")
    return {
        "env_id": env.env_id, "class_name": env.class_name, "class_source": env.class_source,
        "task_id": task.task_id, "instruction": task.instruction,
        "initial_state": dict(task.initial_state), "checks": [c.code for c in task.checks],
        "user_turns": list(task.user_turns),
        "withheld_tools": dict(task.metadata.get("withheld_tools", {})),
        "withheld_calls": task.metadata.get("withheld_calls", "execute"),
        "holdout_prompt": task.metadata.get("holdout_prompt", ""),
        "tool_names": list(env.tool_names), "max_steps": max_steps,
        "user_mode": user_mode, "semantics": semantics, "private_methods": private_methods,
    }


def task_semantics(task: Task) -> str:
    """The episode rules ``task`` asks for (``metadata["semantics"]``, one of
    :data:`~envsched_jax.envs.runtime.core.SEMANTICS`; ``project`` when it names none)."""
    semantics = task.metadata.get("semantics", "project")
    if semantics not in SEMANTICS:
        raise ValueError(f"task {task.task_id!r}: metadata semantics must be one of {SEMANTICS}, "
                         f"got {semantics!r}")
    return semantics


def chat_action(task: Task, text: str, turn: int = 0) -> Action:
    """The ``chat_with_user`` action that says ``text`` to the user, with the argument the task's
    semantics reads: ``content`` for ``envscaler`` (EnvScaler's runner requires it), ``message``
    for ``project`` (the project's pools' convention)."""
    key = "content" if task_semantics(task) == "envscaler" else "message"
    return Action(CHAT_WITH_USER, {key: text}, turn=turn)


def validate_score(reply: Mapping[str, Any], num_checks: int) -> None:
    """Raise :class:`SandboxError` (``invalid_score``) unless ``reply`` is a well-formed score of a
    task with ``num_checks`` checks: a finite reward in [0, 1] equal to the fraction of passed
    checks (to 4 decimals, as every executor rounds it), one boolean and one error (string or
    None) per check, a string end reason."""
    def bad(message: str) -> SandboxError:
        return SandboxError("invalid_score", message, retire=True)

    reward = reply.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise bad(f"reward {reward!r} is not a number")
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise bad(f"reward {reward!r} is not a finite number in [0, 1]")
    results, errors = reply.get("check_results"), reply.get("check_errors")
    if not isinstance(results, list) or len(results) != num_checks:
        raise bad(f"check_results has {len(results) if isinstance(results, list) else results!r} "
                  f"entries for {num_checks} declared checks")
    if not all(isinstance(r, bool) for r in results):
        raise bad("check_results holds a value that is not a boolean")
    if (not isinstance(errors, list) or len(errors) != num_checks
            or not all(e is None or isinstance(e, str) for e in errors)):
        raise bad(f"check_errors is not one string or null per check ({num_checks})")
    if abs(reward - reward_of(results)) > 1e-9:
        raise bad(f"reward {reward!r} is not the fraction of passed checks "
                  f"({sum(results)} of {num_checks})")
    if not isinstance(reply.get("end_reason"), str):
        raise bad(f"end_reason {reply.get('end_reason')!r} is not a string")
    if not (reply.get("error") is None or isinstance(reply.get("error"), str)):
        raise bad("error is neither a string nor null")


def _unexpected(err: BaseException) -> SandboxError:
    """A named, retiring sandbox error for anything unexpected between reset and score."""
    if isinstance(err, SandboxError):
        return err
    return SandboxError("protocol", f"{type(err).__name__}: {err}", retire=True)


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
    def remaining_seconds(self) -> float:
        """Time left before the episode's timeout (infinite without one)."""
        return self._deadline - time.monotonic()

    def _timeout_error(self) -> SandboxError:
        return SandboxError("wall_clock", f"episode timeout of {self.timeout:g} s exceeded",
                            retire=False)

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        limit = self.pool.backend.limits.wall_seconds
        remaining = self.remaining_seconds()
        if remaining <= 0:
            raise self._timeout_error()
        try:
            return self._worker.request(message, min(limit, remaining))
        except SandboxError as err:
            if err.kind == "wall_clock" and remaining < limit:
                raise SandboxError("wall_clock", f"episode timeout of {self.timeout:g} s "
                                   "exceeded; its processes were killed",
                                   retire=err.retire) from None
            raise

    def _fail(self, err: BaseException) -> None:
        self._failure = _unexpected(err)
        self.done = True
        self._release(healthy=not self._failure.retire)

    def _release(self, healthy: bool) -> None:
        if self._worker is not None:
            worker, self._worker = self._worker, None
            self.pool.give_back(worker, healthy)

    # -- the API --------------------------------------------------------------------------
    def reset(self, task: Task) -> Any:
        if self._worker is not None or self._task is not None:
            raise EpisodeError("reset called twice: use a new Episode per task")
        self._task = task
        self._start = time.monotonic()
        self._events.append({"kind": "reset", "observation": None, "state": {}})
        try:
            # the wait for a worker (and its start-up) is bounded by the timeout too, but not
            # charged to the episode: its clock starts when it has a worker
            self._worker = self.pool.lease(timeout=self.timeout)
            self._deadline = time.monotonic() + self.timeout if self.timeout else float("inf")
            reply = self._request({"op": "reset",
                                   "spec": episode_spec(self.env, task, self.max_steps)})
            self._events[-1] = {"kind": "reset", "observation": reply["observation"],
                                "state": reply["state"]}
        except Exception as err:
            self._fail(err)
            return None
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
            done = reply["done"]
            if not isinstance(done, bool):
                raise SandboxError("protocol", f"step reply with done={done!r}", retire=True)
            event = {"kind": "step", "action": act, "observation": reply["observation"],
                     "state_change": reply["state_change"], "done": done,
                     "turn": reply.get("turn", 0)}
            if reply.get("message") is not None:
                event["message"] = reply["message"]
        except Exception as err:
            self._events.append({"kind": "step", "action": act, "observation": None,
                                 "state_change": {}, "done": True, "error": str(_unexpected(err))})
            self._fail(err)
            return StepResult(None, True)
        self.done = done
        self._events.append(event)
        return StepResult(reply["observation"], done, reply.get("message"))

    def user_stop(self) -> None:
        """The simulated user ended the conversation (EnvScaler's ``###STOP###``): the episode
        ends, and an ``envscaler`` episode whose last action was a ``chat_with_user`` is scored
        (:func:`~envsched_jax.envs.runtime.core.unscored_reason`). A failure ends the episode
        with its named error, as a failed step does."""
        if self._task is None:
            raise EpisodeError("user_stop before reset")
        if self.done:
            raise EpisodeError("user_stop after the end of the episode")
        try:
            self._request({"op": "user_stop"})
        except Exception as err:
            self._fail(err)
            return
        self.done = True
        self._events.append({"kind": "user_stop"})

    def score(self) -> Score:
        if self._task is None:
            raise EpisodeError("score before reset")
        if self.trajectory is not None:
            raise EpisodeError("score called twice")
        if self._failure is None:
            try:
                reply = self._request({"op": "score"})
                validate_score(reply, len(self._task.checks))
            except Exception as err:
                self._fail(err)
            else:
                self._release(healthy=True)
                self.done = True
                self._finish(reply)
        if self._failure is not None:
            self._finish(failure_score(self._failure, len(self._task.checks)))
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
        """End the episode without scoring (e.g. the caller gave up). The worker is asked to
        discard the episode and kept; if it cannot, it is replaced."""
        if self._worker is not None:
            try:
                self._worker.request({"op": "abort"},
                                     min(self.pool.backend.limits.wall_seconds, 5.0))
                healthy = True
            except Exception:
                healthy = False
            self._release(healthy)
        self.done = True


def failure_score(err: SandboxError, num_checks: int) -> dict[str, Any]:
    """The score of an episode that failed with ``err``: reward 0, the error on every check."""
    return {"reward": 0.0, "check_results": [False] * num_checks,
            "check_errors": [str(err)] * num_checks, "final_state": {},
            "end_reason": f"sandbox_{err.kind}", "error": str(err)}


def run_actions(pool: WorkerPool, env: Environment, task: Task,
                actions: Sequence[Action | Mapping[str, Any]], *, max_steps: int | None = None,
                timeout: float | None = None, user_stop: bool = False) -> Trajectory:
    """Play a fixed action sequence as one episode in one worker round trip; the trajectory is
    the same as stepping through the actions one by one (and, with ``user_stop``, calling
    :meth:`Episode.user_stop` after them). Always returns: a failure of any kind gives a
    reward-0 trajectory whose ``error`` names it, and the worker is given back."""
    pool.admit(env)
    acts = [action_json(a) for a in actions]
    limit = pool.backend.limits.wall_seconds
    start = time.monotonic()
    worker = None
    try:
        worker = pool.lease(timeout=timeout)  # bounded, but not charged to the episode
        reply = worker.request({"op": "run", "spec": episode_spec(env, task, max_steps),
                                "actions": acts, "user_stop": user_stop},
                               min(limit, timeout) if timeout else limit)
        record = reply["record"]
        validate_score(record["score"], len(task.checks))
        trajectory = trajectory_from_record(record, task, env, pool.kind, acts,
                                            time.monotonic() - start)
    except Exception as err:
        err = _unexpected(err)
        if err.kind == "wall_clock" and timeout and timeout < limit:
            err = SandboxError("wall_clock", f"episode timeout of {timeout:g} s exceeded; its "
                               "processes were killed", retire=err.retire)
        if worker is not None:
            pool.give_back(worker, healthy=not err.retire)
        score = failure_score(err, len(task.checks))
        return Trajectory(task.task_id, env.env_id, pool.kind, acts,
                          [{"kind": "reset", "observation": None, "state": {}}], 0.0,
                          score["check_results"], score["check_errors"], score["end_reason"],
                          score["error"], {}, time.monotonic() - start)
    except BaseException:
        if worker is not None:
            pool.give_back(worker, healthy=False)
        raise
    pool.give_back(worker, healthy=True)
    return trajectory


def trajectory_from_record(record: Mapping[str, Any], task: Task, env: Environment, sandbox: str,
                           actions: list[dict[str, Any]], wall_seconds: float) -> Trajectory:
    reset = record["reset"]
    events: list[dict[str, Any]] = [{"kind": "reset", "observation": reset["observation"],
                                     "state": reset["state"]}]
    for act, step in zip(actions, record["steps"]):
        events.append({"kind": "step", "action": act, "observation": step["observation"],
                       "state_change": step["state_change"], "done": step["done"],
                       "turn": step.get("turn", 0),
                       **({"message": step["message"]} if step.get("message") else {})})
    score = record["score"]
    if score["end_reason"] == USER_STOP:
        events.append({"kind": "user_stop"})
    events.append({"kind": "score", "reward": score["reward"],
                   "check_results": score["check_results"], "check_errors": score["check_errors"],
                   "turn_states": score.get("turn_states", [])})
    return Trajectory(task.task_id, env.env_id, sandbox, actions[:len(record["steps"])], events,
                      float(score["reward"]), list(score["check_results"]),
                      list(score["check_errors"]), score["end_reason"], score.get("error"),
                      score["final_state"], wall_seconds)
