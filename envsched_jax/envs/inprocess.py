"""In-process episode execution, for TRUSTED environments only.

This runs environment and verifier code in the calling interpreter, so it is only for
project-authored environments (the embedded pool, the generator) and for tests. Code that comes
from a task pool file is untrusted and must run in a sandbox.

:func:`run_episode` plays a fixed action sequence. A task with the ``project`` semantics (see
:mod:`envsched_jax.envs.runtime.core`) is played by the loop below, written apart from the
runtime's state machine so that the sandboxes are checked against an independent implementation
of the same rules:

- set-up: instantiate the class with ``init_config`` (fall back to no argument when the
  constructor takes none), then set a deep copy of every ``init_config`` value as an attribute;
- state: the instance's attributes except those named ``__...__``, deep-copied;
- an action ``{"name", "arguments"}`` naming a public method of the class or ``chat_with_user`` is
  valid; anything else returns an "invalid action" observation without ending the episode;
- a tool that raises ends the episode with reward 0;
- ``chat_with_user`` ends the episode (non-conversational mode);
- reward = mean over the checklist of ``check_func(final_state)`` with a global ``initial_state``
  injected, rounded to 4 decimals; a check that raises counts 0.

A task with the ``envscaler`` semantics is played by the runtime's state machine
(:func:`envsched_jax.envs.runtime.core.run_actions`), whose rules are checked against
EnvScaler's own runner instead (:mod:`envsched_jax.pool.envscaler_conformance`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.envs.episode import action_json, episode_spec, task_semantics
from envsched_jax.envs.runtime import core as _core
from envsched_jax.pool.model import Action, Environment, Task

CHAT_WITH_USER = "chat_with_user"


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    reward: float
    check_results: tuple[bool, ...]
    check_errors: tuple[str | None, ...]
    observations: tuple[Any, ...]
    final_state: Mapping[str, Any]
    end_reason: str  # "chat_with_user" | "actions_exhausted" | "tool_error" | "max_steps"
    error: str | None = None


def load_class(env: Environment) -> type:
    """The environment's class: the trusted class if given, else ``class_source`` exec'd in a
    fresh module (trusted code only: see the module docstring)."""
    if env.trusted_class is not None:
        return env.trusted_class
    module = types.ModuleType(f"envsched_env_{env.env_id}")
    exec(compile(env.class_source, f"<environment {env.env_id}>", "exec"), module.__dict__)
    try:
        return module.__dict__[env.class_name]
    except KeyError:
        raise ValueError(f"environment {env.env_id!r}: class_source defines no class "
                         f"{env.class_name!r}") from None


# One definition of set-up and state snapshot, shared with the sandboxed runtime (stdlib only).
instantiate = _core.instantiate
snapshot_state = _core.snapshot


def is_valid_tool(instance: Any, name: str) -> bool:
    if name == CHAT_WITH_USER:
        return True
    return not name.startswith("_") and callable(getattr(instance, name, None))


def run_checks(task: Task, final_state: Mapping[str, Any],
               initial_state: Mapping[str, Any]) -> tuple[float, tuple[bool, ...], tuple[str | None, ...]]:
    """Score ``final_state`` against the task's checklist: (reward, per-check pass, per-check error).
    The rule (a raising check counts 0, reward rounded to 4 decimals) is the runtime's, shared with
    every sandbox."""
    reward, results, errors = _core.run_checks(task.task_id, [c.code for c in task.checks],
                                               dict(final_state), dict(initial_state))
    return reward, tuple(results), tuple(errors)


def run_episode(env: Environment, task: Task, actions: Sequence[Action]) -> EpisodeResult:
    """Execute a fixed action sequence and score it.

    Multi-turn tasks: a user turn ends when the next action carries a later ``turn`` or at a
    ``chat_with_user`` (which ends the episode only after the last turn); checks see the state at
    the end of every turn (:func:`envsched_jax.envs.runtime.core.with_turns`), as in every
    sandbox. ``envscaler`` tasks: see the module docstring (observations and final state as
    JSON)."""
    if task_semantics(task) == "envscaler":
        return _runtime_episode(env, task, actions)
    instance = instantiate(load_class(env), task.initial_state)
    initial_state = snapshot_state(instance)
    num_turns = len(task.user_turns)
    turn_states: list[Any] = []
    observations: list[Any] = []
    end_reason = "actions_exhausted"

    def close_turn() -> None:
        turn_states.append(_core.to_jsonable(snapshot_state(instance)))

    for action in actions:
        while num_turns and len(turn_states) < min(action.turn, num_turns - 1):
            close_turn()
        if action.name == CHAT_WITH_USER:
            if num_turns and len(turn_states) + 1 < num_turns:
                close_turn()
                continue
            end_reason = CHAT_WITH_USER
            break
        refused = (task.metadata.get("withheld_calls") == "refuse"
                   and task.metadata.get("withheld_tools", {}).get(action.name, 0) > len(turn_states))
        if refused or not is_valid_tool(instance, action.name):
            observations.append({"success": False, "error": f"invalid action: {action.name!r}"})
            continue
        try:
            observations.append(getattr(instance, action.name)(**copy.deepcopy(dict(action.arguments))))
        except Exception as err:
            msg = f"tool {action.name!r} raised {type(err).__name__}: {err}"
            return EpisodeResult(0.0, tuple(False for _ in task.checks), tuple(msg for _ in task.checks),
                                 tuple(observations), snapshot_state(instance), "tool_error", msg)
    final = snapshot_state(instance)
    reward, results, errors = run_checks(task, _core.with_turns(final, turn_states, num_turns), initial_state)
    return EpisodeResult(reward, results, errors, tuple(observations), final, end_reason)


def _runtime_episode(env: Environment, task: Task, actions: Sequence[Action]) -> EpisodeResult:
    record = _core.run_actions(episode_spec(env, task), [action_json(a) for a in actions],
                               load_class(env))
    score = record["score"]
    return EpisodeResult(score["reward"], tuple(score["check_results"]),
                         tuple(score["check_errors"]),
                         tuple(step["observation"] for step in record["steps"]),
                         score["final_state"], score["end_reason"], score["error"])
