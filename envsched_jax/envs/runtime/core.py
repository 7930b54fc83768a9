"""The episode state machine, shared by every sandbox (standard library only).

This module runs in two places: in the host interpreter (the in-process sandbox, for trusted
project-authored environments) and inside the jailed worker processes (bubblewrap, Docker), where
it is loaded from a read-only bind mount without the rest of the package. It therefore imports
nothing but the standard library, and everything it returns is plain JSON (dicts, lists,
strings, numbers), so that the same episode gives the same record in every sandbox.

Semantics (EnvScaler's runner, ``shared/design/pools.md``; the same rules as
:mod:`envsched_jax.envs.inprocess`):

- ``reset``: exec the class source in a fresh module, instantiate it with ``init_config`` (fall
  back to no argument), set every ``init_config`` key as an attribute; the state is the
  instance's attributes without dunders.
- ``step``: an action naming a public method or ``chat_with_user`` is valid; anything else gives
  an "invalid action" observation and the episode goes on. A tool that raises ends the episode
  (reward 0). ``chat_with_user`` ends a non-conversational episode.
- ``score``: the mean over the checklist of ``check_func(final_state)`` with a global
  ``initial_state`` injected, rounded to 4 decimals; a check that raises counts 0.

Multi-turn episodes (BFCL-v3) add scripted user turns: ``reset`` shows turn 0, and
``chat_with_user`` (the agent's reply that closes a turn) shows the next scripted turn instead of
ending the episode; the episode ends after the last turn. Tools listed in ``withheld_tools``
(BFCL's missing-function category) are invalid actions before their turn, and the empty user turn
that announces them is replaced by BFCL's holdout prompt. BFCL tools catch their own errors (the
composite class returns ``"Error during execution: ..."``), so a wrong call there does not end
the episode. The state at the end of every turn is kept, and checks of a multi-turn task find it
under ``final_state["__turns__"]`` (:func:`with_turns`): BFCL's checks are made turn by turn.

Resource limits are enforced around this module (rlimits, wall clock, cgroups), not in it: a limit
shows up here as an exception derived from :class:`LimitExceeded` (a ``BaseException``, so that
environment code catching ``Exception`` cannot swallow it), which ends the episode with reward 0.
"""

from __future__ import annotations

import copy
import json
import math
import types

CHAT_WITH_USER = "chat_with_user"
REWARD_DECIMALS = 4
TURNS_KEY = "__turns__"
"""Multi-turn episodes: the key under which checks find the state at the end of every user turn."""


class LimitExceeded(BaseException):
    """A resource limit ended the episode; ``kind`` is one of cpu, memory, output, processes."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class EpisodeStateError(RuntimeError):
    """An operation in the wrong phase (step before reset, step after the end, ...)."""


def _json_fallback(obj):
    if isinstance(obj, (set, frozenset)):
        return sorted((to_jsonable(v) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, bytes):
        return {"__bytes__": obj.hex()}
    return {"__repr__": repr(obj)}


def encode(value) -> str:
    """Canonical JSON text of ``value``; what JSON cannot hold is encoded, never dropped."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(repr(value))
    return json.dumps(value, sort_keys=True, default=_json_fallback, ensure_ascii=False,
                      allow_nan=True)


def to_jsonable(value):
    return json.loads(encode(value))


def load_class(env_id: str, class_name: str, class_source: str):
    module = types.ModuleType(f"envsched_env_{env_id}")
    exec(compile(class_source, f"<environment {env_id}>", "exec"), module.__dict__)
    cls = module.__dict__.get(class_name)
    if not isinstance(cls, type):
        raise ValueError(f"environment {env_id!r}: class_source defines no class {class_name!r}")
    return cls


def instantiate(cls, init_config):
    config = copy.deepcopy(dict(init_config))
    try:
        instance = cls(config)
    except TypeError:
        instance = cls()
    for key, value in config.items():
        setattr(instance, key, copy.deepcopy(value))
    return instance


def state_texts(instance) -> dict:
    """Each public attribute of the instance as canonical JSON text (the state, comparable)."""
    return {k: encode(v) for k, v in vars(instance).items() if not k.startswith("__")}


def snapshot(instance) -> dict:
    return {k: copy.deepcopy(v) for k, v in vars(instance).items() if not k.startswith("__")}


def with_turns(final_state: dict, turn_states, num_turns: int) -> dict:
    """The state that checks of a multi-turn task see: the final state plus, under
    :data:`TURNS_KEY`, the JSON state at the end of each of the ``num_turns`` user turns. A turn the
    episode never closed (it ended earlier, or the agent stopped acting) holds the final state.
    Single-turn tasks (``num_turns`` 0) see the final state alone."""
    if not num_turns:
        return final_state
    states = list(turn_states[:num_turns])
    states += [to_jsonable(final_state)] * (num_turns - len(states))
    return {**final_state, TURNS_KEY: states}


def run_checks(task_id: str, checks, final_state, initial_state):
    """(reward, per-check pass, per-check error). A check that raises counts 0; a resource limit
    (and ``MemoryError``) is not a check failure and propagates."""
    results, errors = [], []
    for k, code in enumerate(checks):
        namespace = {"initial_state": copy.deepcopy(initial_state)}
        try:
            exec(compile(code, f"<check {task_id}[{k}]>", "exec"), namespace)
            ok = bool(namespace["check_func"](copy.deepcopy(final_state)))
            results.append(ok)
            errors.append(None)
        except MemoryError:
            raise
        except Exception as err:
            results.append(False)
            errors.append(f"{type(err).__name__}: {err}")
    reward = round(sum(results) / len(results), REWARD_DECIMALS) if results else 0.0
    return reward, results, errors


class EpisodeCore:
    """One episode over one spec (a plain dict, see :func:`envsched_jax.envs.episode.episode_spec`).

    ``cls`` may be given for trusted in-process classes; otherwise ``class_source`` is exec'd.
    """

    def __init__(self, spec: dict, cls=None):
        self.spec = spec
        self._cls = cls
        self.instance = None
        self.done = False
        self.end_reason = None
        self.error = None
        self.turn = 0
        self.num_steps = 0
        self._initial_state = None
        self._last_texts = None
        self.turn_states = []  # state (JSON) at the end of every finished user turn

    # -- phases ---------------------------------------------------------------------------
    def reset(self) -> dict:
        spec = self.spec
        cls = self._cls or load_class(spec["env_id"], spec["class_name"], spec["class_source"])
        self.instance = instantiate(cls, spec["initial_state"])
        self._initial_state = snapshot(self.instance)
        self._last_texts = state_texts(self.instance)
        return {"observation": self._turn_observation(0),
                "state": {k: json.loads(v) for k, v in self._last_texts.items()}}

    def _turn_observation(self, turn: int) -> dict:
        spec = self.spec
        obs = {"tools": self.available_tools(turn)}
        turns = spec.get("user_turns") or []
        if turns:
            text = turns[turn]
            if not text.strip() and any(t == turn for t in spec.get("withheld_tools", {}).values()):
                text = spec.get("holdout_prompt", "")
            obs.update(role="user", content=text, turn=turn, num_turns=len(turns))
        else:
            obs.update(role="user", content=spec["instruction"])
        return obs

    def available_tools(self, turn: int) -> list:
        withheld = self.spec.get("withheld_tools", {})
        return [n for n in self.spec.get("tool_names", []) if withheld.get(n, 0) <= turn]

    def _is_valid(self, name: str) -> bool:
        if name == CHAT_WITH_USER:
            return True
        if name.startswith("_") or not callable(getattr(self.instance, name, None)):
            return False
        return self.spec.get("withheld_tools", {}).get(name, 0) <= self.turn

    def step(self, action: dict) -> dict:
        if self.instance is None:
            raise EpisodeStateError("step before reset")
        if self.done:
            raise EpisodeStateError(f"step after the end of the episode ({self.end_reason})")
        name = action.get("name")
        arguments = action.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise EpisodeStateError("an action needs a string 'name' and an object 'arguments'")
        self.num_steps += 1
        out = {"observation": None, "state_change": {}, "done": False}
        if name == CHAT_WITH_USER:
            turns = self.spec.get("user_turns") or []
            self.turn_states.append(to_jsonable(snapshot(self.instance)))
            if turns and self.turn + 1 < len(turns):
                self.turn += 1
                out["observation"] = self._turn_observation(self.turn)
            else:
                self._end(CHAT_WITH_USER)
        elif not self._is_valid(name):
            out["observation"] = {"success": False, "error": f"invalid action: {name!r}"}
        else:
            try:
                result = getattr(self.instance, name)(**copy.deepcopy(arguments))
            except MemoryError:
                raise
            except Exception as err:
                msg = f"tool {name!r} raised {type(err).__name__}: {err}"
                self._end("tool_error", msg)
                result = {"success": False, "error": msg}
            out["observation"] = self._observation(name, result)
            out["state_change"] = self._state_change()
        max_steps = self.spec.get("max_steps")
        if not self.done and max_steps is not None and self.num_steps >= max_steps:
            self._end("max_steps")
        out.update(done=self.done, end_reason=self.end_reason, error=self.error, turn=self.turn)
        return out

    def _observation(self, name: str, result):
        text = encode(result)
        limit = self.spec.get("max_observation_chars")
        if limit is not None and len(text) > limit:
            raise LimitExceeded("output", f"output limit: tool {name!r} returned {len(text):,} "
                                          f"characters (limit {limit:,})")
        return json.loads(text)

    def _state_change(self) -> dict:
        texts = state_texts(self.instance)
        changed = {k: json.loads(v) for k, v in texts.items() if self._last_texts.get(k) != v}
        removed = sorted(set(self._last_texts) - set(texts))
        self._last_texts = texts
        out = {"set": changed} if changed else {}
        if removed:
            out["removed"] = removed
        return out

    def _end(self, reason: str, error: str | None = None) -> None:
        self.done = True
        self.end_reason = reason
        self.error = error

    def finish(self, reason: str = "actions_exhausted") -> None:
        """End the episode from outside (the agent stopped acting)."""
        if not self.done:
            self._end(reason)

    def score(self) -> dict:
        if self.instance is None:
            raise EpisodeStateError("score before reset")
        self.finish()
        final = snapshot(self.instance)
        checks = self.spec["checks"]
        if self.end_reason == "tool_error":
            reward, results, errors = 0.0, [False] * len(checks), [self.error] * len(checks)
        else:
            seen = with_turns(final, self.turn_states, len(self.spec.get("user_turns") or []))
            reward, results, errors = run_checks(self.spec["task_id"], checks, seen, self._initial_state)
        return {"reward": reward, "check_results": results, "check_errors": errors,
                "final_state": to_jsonable(final), "end_reason": self.end_reason,
                "error": self.error, "turn_states": self.turn_states,
                "num_steps": self.num_steps}


def run_actions(spec: dict, actions, cls=None) -> dict:
    """Reset, apply ``actions`` until the episode ends, score: one whole episode as a record
    ``{"reset", "steps", "score"}`` (used for fixed action sequences: replay, benchmarks)."""
    core = EpisodeCore(spec, cls)
    record = {"reset": core.reset(), "steps": []}
    for action in actions:
        if core.done:
            break
        record["steps"].append(core.step(action))
    record["score"] = core.score()
    return record
