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

Scoring is split in two so that the checks never share a process with environment code: the
episode's process ends with :meth:`EpisodeCore.final_payload` (the initial and final states in the
tagged JSON of :func:`encode_state`, the per-turn states, how the episode ended), and
:func:`check_payload` runs the checks on that payload, decoded afresh (the jailed supervisor runs
it in a new process; in-process it runs inline, on the same encoding, so every sandbox scores the
same values). :func:`assemble_score` computes the reward from the check results alone. Checks
therefore see a copy of the state rebuilt from data: dicts, lists, tuples, sets, bytes, numbers,
strings and ``None`` exactly; any other object as a :class:`StateObject` carrying its class name
and attributes (a back-reference to an enclosing object as a :class:`StateRef`).

Multi-turn episodes (BFCL-v3) add scripted user turns: ``reset`` shows turn 0, and
``chat_with_user`` (the agent's reply that closes a turn) shows the next scripted turn instead of
ending the episode; the episode ends after the last turn. Tools listed in ``withheld_tools``
(BFCL's missing-function category) are invalid actions before their turn, and the empty user turn
that announces them is replaced by BFCL's holdout prompt. BFCL tools catch their own errors (the
composite class returns ``"Error during execution: ..."``), so a wrong call there does not end
the episode. The state at the end of every turn is kept, and checks of a multi-turn task find it
under ``final_state["__turns__"]`` (:func:`with_turns`): BFCL's checks are made turn by turn.

Simulated-user episodes (``spec["user_mode"] == "simulated"``, tau-bench style): the user is a
simulator outside the environment (the agent loop's), so ``reset`` shows no user text and
``chat_with_user`` closes a turn without ending the episode (the host scores when the simulator
ends the conversation). Checks find the agent's messages to the user, in order, under
``final_state["__messages__"]`` (:data:`MESSAGES_KEY`) as ``{"turn": n, "message": text}``; in a
jail the supervisor records them from the actions it relays, so environment code cannot forge
them.

Resource limits are enforced around this module (rlimits, wall clock, cgroups), not in it: a limit
shows up here as an exception derived from :class:`LimitExceeded` (a ``BaseException``, so that
environment code catching ``Exception`` cannot swallow it), which ends the episode with reward 0.
"""

from __future__ import annotations

import base64
import copy
import json
import marshal
import math
import types

CHAT_WITH_USER = "chat_with_user"
REWARD_DECIMALS = 4
TURNS_KEY = "__turns__"
"""Multi-turn episodes: the key under which checks find the state at the end of every user turn."""
MESSAGES_KEY = "__messages__"
"""Simulated-user episodes: the key under which checks find the agent's messages to the user."""


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


MAX_STATE_DEPTH = 100
"""Deepest nesting of containers and objects in a state that :func:`encode_state` accepts."""
_TAG = "__t__"


class StateError(ValueError):
    """A state that cannot be carried to the checks (too deep, a key that cannot be encoded)."""


class StateObject:
    """An object of the environment's state as the checks see it: its class name
    (``__class_name__``) and its attributes, rebuilt from data (no environment code runs)."""

    def __init__(self, class_name: str, attrs: dict):
        self.__dict__.update(attrs)
        self.__class_name__ = class_name

    def __eq__(self, other):
        return (isinstance(other, StateObject) and vars(self) == vars(other))

    __hash__ = None

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "__class_name__")
        return f"{self.__class_name__}({fields})"


class StateRef:
    """A reference back to an enclosing object of the state (a cycle), by class name."""

    def __init__(self, class_name: str):
        self.class_name = class_name

    def __eq__(self, other):
        return isinstance(other, StateRef) and other.class_name == self.class_name

    __hash__ = None

    def __repr__(self):
        return f"<ref {self.class_name}>"


def public_attrs(instance) -> dict:
    """The instance's attributes without dunders: the state (not copied)."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("__")}


def encode_state(value, _depth: int = 0, _ancestors: tuple = (), _tagged: list | None = None):
    """``value`` as tagged JSON that :func:`decode_state` turns back into equal built-in values.
    ``_tagged`` (a list) receives an entry for every tag used: without any, the encoding is the
    value's plain JSON."""
    if _tagged is None:
        _tagged = []
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        if value.bit_length() > 10_000:  # json cannot read back more than 4,300 digits
            _tagged.append("int")
            return {_TAG: "int", "hex": hex(value)}
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        _tagged.append("float")
        return {_TAG: "float", "repr": repr(value)}
    if _depth >= MAX_STATE_DEPTH:
        raise StateError(f"state nested deeper than {MAX_STATE_DEPTH} levels")
    if id(value) in _ancestors:
        _tagged.append("ref")
        return {_TAG: "ref", "class": type(value).__name__}
    depth, inner = _depth + 1, _ancestors + (id(value),)
    if isinstance(value, dict):
        if all(type(k) is str for k in value) and _TAG not in value:
            return {k: encode_state(v, depth, inner, _tagged) for k, v in value.items()}
        _tagged.append("dict")
        return {_TAG: "dict", "items": [[encode_state(k, depth, inner, _tagged),
                                         encode_state(v, depth, inner, _tagged)]
                                        for k, v in value.items()]}
    if isinstance(value, list):
        return [encode_state(v, depth, inner, _tagged) for v in value]
    if isinstance(value, (tuple, set, frozenset)):
        kind = ("tuple" if isinstance(value, tuple)
                else "frozenset" if isinstance(value, frozenset) else "set")
        _tagged.append(kind)
        return {_TAG: kind, "items": [encode_state(v, depth, inner, _tagged) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        _tagged.append("bytes")
        return {_TAG: "bytes", "hex": bytes(value).hex()}
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        _tagged.append("object")
        return {_TAG: "object", "class": type(value).__name__,
                "attrs": {str(k): encode_state(v, depth, inner, _tagged) for k, v in attrs.items()
                          if not str(k).startswith("__")}}
    _tagged.append("repr")
    return {_TAG: "repr", "class": type(value).__name__, "repr": repr(value)[:10_000]}


def decode_state(data, _depth: int = 0):
    """The value :func:`encode_state` encoded (objects as :class:`StateObject`)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if _depth >= 3 * MAX_STATE_DEPTH + 3:
        raise StateError(f"state nested deeper than {MAX_STATE_DEPTH} levels")
    depth = _depth + 1
    if isinstance(data, list):
        return [decode_state(v, depth) for v in data]
    if not isinstance(data, dict):
        raise StateError(f"unexpected {type(data).__name__} in an encoded state")
    tag = data.get(_TAG)
    if tag is None:
        return {k: decode_state(v, depth) for k, v in data.items()}
    if tag == "dict":
        return {_hashable(decode_state(k, depth)): decode_state(v, depth) for k, v in data["items"]}
    if tag in ("tuple", "set", "frozenset"):
        items = [decode_state(v, depth) for v in data["items"]]
        if tag == "tuple":
            return tuple(items)
        items = [_hashable(v) for v in items]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "int":
        return int(data["hex"], 16)
    if tag == "float":
        return float(data["repr"])
    if tag == "bytes":
        return bytes.fromhex(data["hex"])
    if tag == "object":
        return StateObject(str(data["class"]), {str(k): decode_state(v, depth)
                                                for k, v in data["attrs"].items()})
    if tag == "ref":
        return StateRef(str(data["class"]))
    if tag == "repr":
        return StateObject(str(data["class"]), {"repr": str(data["repr"])})
    raise StateError(f"unknown tag {tag!r} in an encoded state")


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        raise StateError(f"an unhashable {type(value).__name__} as a set member or dict key") from None
    return value


def compile_class_source(env_id: str, class_source: str):
    return compile(class_source, f"<environment {env_id}>", "exec")


def load_class(env_id: str, class_name: str, class_source: str, compiled: bytes | None = None):
    """The environment's class: ``class_source`` executed in a fresh module. ``compiled`` is the
    source's code object as :mod:`marshal` bytes, made by a process that only compiled it (the
    jailed supervisor caches it per source; compiling costs a fresh process milliseconds)."""
    module = types.ModuleType(f"envsched_env_{env_id}")
    code = marshal.loads(compiled) if compiled is not None else None
    if not isinstance(code, types.CodeType):
        code = compile_class_source(env_id, class_source)
    exec(code, module.__dict__)
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


def agent_message(turn: int, arguments) -> dict:
    """The record of one ``chat_with_user`` action that checks see under :data:`MESSAGES_KEY`."""
    message = arguments.get("message", "") if isinstance(arguments, dict) else ""
    return {"turn": turn, "message": message if isinstance(message, str) else encode(message)}


def compile_checks(task_id: str, checks) -> list:
    """Each check's code object, or the exception its compilation raised (that check then
    counts 0 with the error, as a check that raises)."""
    out = []
    for k, code in enumerate(checks):
        try:
            out.append(compile(code, f"<check {task_id}[{k}]>", "exec"))
        except MemoryError:
            raise
        except Exception as err:
            out.append(err)
    return out


def run_checks(task_id: str, checks, final_state, initial_state, compiled=None):
    """(reward, per-check pass, per-check error). A check that raises counts 0; a resource limit
    (and ``MemoryError``) is not a check failure and propagates. ``compiled`` is
    :func:`compile_checks` of ``checks``, when already made."""
    compiled = compile_checks(task_id, checks) if compiled is None else compiled
    results, errors = [], []
    for code in compiled:
        namespace = {"initial_state": copy.deepcopy(initial_state)}
        try:
            if isinstance(code, BaseException):
                raise code
            exec(code, namespace)
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
        self.agent_messages = []  # the agent's chat_with_user messages (agent_message records)

    # -- phases ---------------------------------------------------------------------------
    def reset(self) -> dict:
        spec = self.spec
        compiled = spec.get("compiled_class")
        cls = self._cls or load_class(spec["env_id"], spec["class_name"], spec["class_source"],
                                      base64.b64decode(compiled) if compiled else None)
        self.instance = instantiate(cls, spec["initial_state"])
        self._initial_state = encode_state(public_attrs(self.instance))
        self._last_texts = state_texts(self.instance)
        return {"observation": self._turn_observation(0),
                "state": {k: json.loads(v) for k, v in self._last_texts.items()}}

    def _turn_observation(self, turn: int) -> dict:
        spec = self.spec
        obs = {"tools": self.available_tools(turn)}
        turns = spec.get("user_turns") or []
        if spec.get("user_mode") == "simulated":
            obs.update(role="user", content=None, turn=turn)
        elif turns:
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
            self.agent_messages.append(agent_message(len(self.agent_messages), arguments))
            if self.spec.get("user_mode") == "simulated":
                self.turn += 1
                out["observation"] = self._turn_observation(self.turn)
            elif turns and self.turn + 1 < len(turns):
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

    def final_payload(self) -> dict:
        """End the episode and return what the checks need, as data: the initial and final
        states (:func:`encode_state`), the per-turn states, how the episode ended; plus the final
        state as plain JSON for the trajectory."""
        if self.instance is None:
            raise EpisodeStateError("score before reset")
        self.finish()
        final = public_attrs(self.instance)
        tagged: list = []
        encoded = encode_state(final, _tagged=tagged)
        return {"final": encoded, "initial": self._initial_state,
                "turn_states": self.turn_states, "end_reason": self.end_reason,
                "error": self.error, "num_steps": self.num_steps,
                "agent_messages": self.agent_messages,
                # None: the same as "final" (plain JSON), not sent twice
                "final_state": to_jsonable(final) if tagged else None}

    def score(self) -> dict:
        """Final payload, checks and reward in this process (the in-process sandbox)."""
        payload = self.final_payload()
        return assemble_score(payload, check_payload(self.spec, payload))


def check_payload(spec: dict, payload: dict, compiled=None) -> dict:
    """Run the task's checks on a :meth:`EpisodeCore.final_payload`: per-check results and
    errors. An episode ended by a raising tool fails every check (EnvScaler). ``compiled``:
    :func:`compile_checks` of the checks, when already made."""
    checks = spec["checks"]
    if payload.get("end_reason") == "tool_error":
        return {"check_results": [False] * len(checks),
                "check_errors": [payload.get("error")] * len(checks)}
    final = decode_state(payload["final"])
    if not isinstance(final, dict):
        raise StateError("the final state is not a mapping")
    seen = with_turns(final, payload.get("turn_states") or [], len(spec.get("user_turns") or []))
    if spec.get("user_mode") == "simulated":
        seen = {**seen, MESSAGES_KEY: list(payload.get("agent_messages") or [])}
    _, results, errors = run_checks(spec["task_id"], checks, seen, decode_state(payload["initial"]),
                                    compiled)
    return {"check_results": results, "check_errors": errors}


def reward_of(check_results) -> float:
    """The reward: the fraction of checks passed, rounded to 4 decimals (0 without checks)."""
    results = list(check_results)
    return round(sum(1 for r in results if r is True) / len(results), REWARD_DECIMALS) if results else 0.0


def assemble_score(payload: dict, checked: dict) -> dict:
    """The score reply: the reward computed here from the check results, and the payload's
    record fields."""
    return {"reward": reward_of(checked["check_results"]),
            "check_results": checked["check_results"], "check_errors": checked["check_errors"],
            "final_state": (payload["final"] if payload["final_state"] is None
                            else payload["final_state"]),
            "end_reason": payload["end_reason"],
            "error": payload["error"], "turn_states": payload["turn_states"],
            "num_steps": payload["num_steps"]}


def play_actions(core: EpisodeCore, actions) -> dict:
    """Reset ``core`` and apply ``actions`` until the episode ends: ``{"reset", "steps"}``."""
    record = {"reset": core.reset(), "steps": []}
    for action in actions:
        if core.done:
            break
        record["steps"].append(core.step(action))
    return record


def run_actions(spec: dict, actions, cls=None) -> dict:
    """Reset, apply ``actions`` until the episode ends, score: one whole episode as a record
    ``{"reset", "steps", "score"}`` (used for fixed action sequences: replay, benchmarks)."""
    core = EpisodeCore(spec, cls)
    record = play_actions(core, actions)
    record["score"] = core.score()
    return record


_WARM_UP_SPEC = {
    "env_id": "warm-up", "class_name": "WarmUp", "task_id": "warm-up", "instruction": "",
    "class_source": (
        "class WarmUp:\n"
        "    def __init__(self, init_config):\n"
        "        self.records = {'r1': {'name': 'a', 'tags': ['x', 'y'], 'n': 1.5}}\n"
        "        self.log = []\n"
        "    def update(self, key, value):\n"
        "        self.records.setdefault(key, {})['name'] = value\n"
        "        self.log.append({'op': 'update', 'key': key})\n"
        "        return {'success': True, 'data': self.records[key]}\n"),
    "initial_state": {"records": {"r0": {"name": "b", "tags": [], "n": 2}}},
    "checks": ["def check_func(final_state):\n    return final_state['records']['r0']['name'] == 'c'\n",
               "def check_func(final_state):\n    return len(final_state['log']) == 2\n"],
    "tool_names": ["update"], "max_observation_chars": 10_000,
}


def warm_up(role: str = "episode") -> None:
    """Run the code paths of one role on a tiny built-in episode: ``episode`` (set-up, steps,
    state encoding, JSON) or ``checks`` (decoding, compiling and running checks). A process
    forked from the jail's supervisor calls this while it waits for its request: the first run of
    these paths in a fresh process costs page faults and interpreter warm-up that would otherwise
    fall on the episode."""
    try:
        if role == "checks":
            state = {"records": {"r0": {"name": "c", "tags": [], "n": 2}}, "log": [{"op": "u"}]}
            payload = json.loads(json.dumps({"final": state, "initial": state, "turn_states": [],
                                             "end_reason": "chat_with_user", "error": None}))
            check_payload(_WARM_UP_SPEC, payload,
                          compile_checks("warm-up", _WARM_UP_SPEC["checks"]))
            return
        episode = EpisodeCore(dict(_WARM_UP_SPEC))
        play_actions(episode, [{"name": "update", "arguments": {"key": "r0", "value": "c"}},
                               {"name": "update", "arguments": {"key": "r1", "value": "d"}}])
        json.loads(json.dumps(episode.final_payload()))
    except Exception:  # a failed warm-up costs only speed
        pass
