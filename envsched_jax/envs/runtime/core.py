"""The episode state machine, shared by every sandbox (standard library only).

This module runs in two places: in the host interpreter (the in-process sandbox, for trusted
project-authored environments) and inside the jailed worker processes (bubblewrap, Docker), where
it is loaded from a read-only bind mount without the rest of the package. It therefore imports
nothing but the standard library, and everything it returns is plain JSON (dicts, lists,
strings, numbers), so that the same episode gives the same record in every sandbox.

Two semantics, chosen per task by ``spec["semantics"]`` (:data:`SEMANTICS`):

``envscaler`` (EnvScaler's pool): the rules of EnvScaler's own non-conversational RL environment
as its training manager loops it (``rl/roll/pipeline/agentic/env/envscaler_env/base_env.py``,
``utils/env_util.py`` and ``rl_non_conv_env.py``, ``env_manager/traj_env_manager_for_env_scaler.py``
in the RUC-NLPIR/EnvScaler repository; written from reading them, no code copied;
:mod:`envsched_jax.pool.envscaler_conformance` holds one probe task per rule with the reward
EnvScaler's runner gives and the file and function each rule lives in):

- ``reset``: exec the class source in a fresh module, instantiate it with one deep copy of
  ``init_config`` (no argument if the constructor refuses one) and set each of that copy's values
  as an attribute, the very objects the constructor saw (:func:`instantiate` with ``share``).
- ``step``: an action is valid when the instance has an attribute of that name (``hasattr``:
  private and dunder names too, unless ``spec["private_methods"] == "refuse"``) or it is
  ``chat_with_user`` with a ``content`` argument. An invalid action gives ``Error: Invalid
  action`` and the episode goes on. A valid name is called with the arguments; if that raises
  (a plain attribute is not callable) the episode ends with reward 0. ``chat_with_user`` ends the
  episode (with a simulated user, ``spec["user_mode"] == "simulated"``: the user's stop does,
  :meth:`EpisodeCore.user_stop`). The step reply's ``message`` is the observation as EnvScaler's
  runner words it for the policy (:func:`envscaler_message`).
- ``score``: only an episode that the environment ended (at a valid ``chat_with_user``, or at the
  user's stop, within ``spec["max_steps"]``) has a reward (:func:`unscored_reason`); any other
  (the step limit, the agent stopped acting, a tool raised) scores 0. The reward is the mean over
  the checklist, rounded to 4 decimals, where a check passes only if ``check_func`` returns the
  bool ``True``; every check gets the same ``final_state`` object (a check that changes it
  changes what later checks see) and a fresh copy of ``initial_state``. A check whose code is
  empty, does not compile, defines no ``check_func`` or raises counts 0.

``project`` (the project's own pools: embedded, generated, BFCL-v3, JSON lines; the same rules as
:func:`envsched_jax.envs.inprocess.run_episode`): set-up sets a deep copy of each ``init_config``
value; an action naming a public method or ``chat_with_user`` is valid; anything else gives an
"invalid action" observation and the episode goes on. A tool that raises ends the episode
(reward 0). ``chat_with_user`` ends a non-conversational episode. ``score``: the mean over the
checklist of ``bool(check_func(final_state))`` (each check on its own copy of the state) with a
global ``initial_state`` injected, rounded to 4 decimals; a check that raises counts 0; an
episode that ended at its step limit or when the agent stopped acting is scored on the state it
reached.

In both, the state is the instance's attributes except those whose names start and end with
``__`` (:func:`is_state_key`, EnvScaler's rule).

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
(BFCL's missing-function category) are left out of the catalog before their turn, and the empty
user turn that announces them is replaced by BFCL's holdout prompt; a call of one before its turn
runs, as BFCL's executor runs it (``spec["withheld_calls"] == "refuse"`` makes it an invalid
action instead). BFCL tools catch their own errors (the
composite class returns ``"Error during execution: ..."``), so a wrong call there does not end
the episode. The state at the end of every turn is kept, and checks of a multi-turn task find it
under ``final_state["__turns__"]`` (:func:`with_turns`): BFCL's checks are made turn by turn.

Simulated-user episodes (``spec["user_mode"] == "simulated"``: tau-bench style, and EnvScaler's
conversational mode): the user is a simulator outside the environment (the agent loop's), so
``reset`` shows no user text and ``chat_with_user`` closes a turn without ending the episode; the
host ends it when the simulator ends the conversation (:meth:`EpisodeCore.user_stop`). Checks of
the project semantics find the agent's messages to the user, in order, under
``final_state["__messages__"]`` (:data:`MESSAGES_KEY`) as ``{"turn": n, "message": text}``; in a
jail the supervisor records them from the actions it relays, so environment code cannot forge
them. For the same reason the supervisor, not the episode process, decides whether an
``envscaler`` episode is scored (:func:`unscored_reason` on the actions it relayed and the stops
its parent sent).

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
import traceback
import types

CHAT_WITH_USER = "chat_with_user"
REWARD_DECIMALS = 4
TURNS_KEY = "__turns__"
"""Multi-turn episodes: the key under which checks find the state at the end of every user turn."""
MESSAGES_KEY = "__messages__"
"""Simulated-user episodes: the key under which checks find the agent's messages to the user."""
SEMANTICS = ("project", "envscaler")
"""Episode rules a task may ask for (``spec["semantics"]``; see the module docstring)."""
PRIVATE_METHODS = ("allow", "refuse")
"""``envscaler`` semantics: whether an action may name an attribute starting with ``_``
(``spec["private_methods"]``). ``allow`` is EnvScaler's ``hasattr`` rule; ``refuse`` makes such a
name an invalid action (see :func:`envscaler_valid`)."""
USER_STOP = "user_stop"
"""End reason of a simulated-user episode whose user ended the conversation."""
INVALID_ACTION_TEXT = "Error: Invalid action"
"""``envscaler`` semantics: the observation an invalid action gives the policy."""


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


def is_state_key(name: str) -> bool:
    """Whether an attribute belongs to the state: all but names that start and end with ``__``
    (Python's own; EnvScaler's ``get_state_info`` rule). ``__x`` is state."""
    return not (name.startswith("__") and name.endswith("__"))


def public_attrs(instance) -> dict:
    """The instance's state attributes (:func:`is_state_key`), not copied."""
    return {k: v for k, v in vars(instance).items() if is_state_key(k)}


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
                          if is_state_key(str(k))}}
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


def instantiate(cls, init_config, *, share: bool = False):
    """An instance of ``cls`` set up from ``init_config``: the constructor gets a deep copy of it
    (no argument when it refuses one, i.e. raises ``TypeError``), then every key of that copy is
    set as an attribute. ``share`` (EnvScaler's ``init_env_instance``): the attributes are the very
    objects the constructor got, so structures it built from them (an index of the same dicts)
    stay linked; without it each attribute is a fresh deep copy (the project semantics)."""
    config = copy.deepcopy(dict(init_config))
    try:
        instance = cls(config)
    except TypeError:
        instance = cls()
    for key, value in config.items():
        setattr(instance, key, value if share else copy.deepcopy(value))
    return instance


def state_texts(instance) -> dict:
    """Each state attribute of the instance as canonical JSON text (the state, comparable)."""
    return {k: encode(v) for k, v in public_attrs(instance).items()}


def snapshot(instance) -> dict:
    return {k: copy.deepcopy(v) for k, v in public_attrs(instance).items()}


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


def run_checks(task_id: str, checks, final_state, initial_state, compiled=None,
               semantics: str = "project"):
    """(reward, per-check pass, per-check error). Each check gets a fresh copy of
    ``initial_state`` as a global. ``semantics`` ``envscaler``: every check gets the same
    ``final_state`` object, and only the bool ``True`` passes (EnvScaler's ``run_check_function``
    and ``calculate_reward``); ``project``: each check gets its own copy, and its result counts
    as ``bool(...)``. A check that raises, or defines no ``check_func``, counts 0; a resource
    limit (and ``MemoryError``) is not a check failure and propagates. ``compiled`` is
    :func:`compile_checks` of ``checks``, when already made."""
    compiled = compile_checks(task_id, checks) if compiled is None else compiled
    shared = semantics == "envscaler"
    results, errors = [], []
    for code in compiled:
        namespace = {"initial_state": copy.deepcopy(initial_state)}
        try:
            if isinstance(code, BaseException):
                raise code
            exec(code, namespace)
            if "check_func" not in namespace:
                raise LookupError("the check's code defines no check_func")
            value = namespace["check_func"](final_state if shared else copy.deepcopy(final_state))
            if shared and not isinstance(value, bool):
                raise TypeError(f"check_func returned {type(value).__name__} {value!r:.80}, "
                                "not a bool (EnvScaler counts it failed)")
            results.append(bool(value))
            errors.append(None)
        except MemoryError:
            raise
        except Exception as err:
            results.append(False)
            errors.append(f"{type(err).__name__}: {err}")
    reward = round(sum(results) / len(results), REWARD_DECIMALS) if results else 0.0
    return reward, results, errors


def semantics_of(spec: dict) -> str:
    """The spec's :data:`SEMANTICS` (``project`` when it names none)."""
    semantics = spec.get("semantics", "project")
    if semantics not in SEMANTICS:
        raise EpisodeStateError(f"spec semantics must be one of {SEMANTICS}, got {semantics!r}")
    return semantics


def is_chat(action) -> bool:
    """Whether ``action`` (a JSON action) is a ``chat_with_user`` EnvScaler accepts: it needs a
    ``content`` argument (``check_vaild_action`` in EnvScaler's ``base_env.py``)."""
    return (isinstance(action, dict) and action.get("name") == CHAT_WITH_USER
            and isinstance(action.get("arguments"), dict) and "content" in action["arguments"])


def envscaler_valid(instance, name: str, arguments, private_methods: str = "allow") -> bool:
    """EnvScaler's action validity (``check_vaild_action``): a non-empty name the instance has as
    an attribute (``hasattr``; a plain attribute too, whose call then raises) or a
    ``chat_with_user`` with ``content``, and arguments that are an object. ``private_methods``
    ``refuse`` (the project's option, see :data:`PRIVATE_METHODS`) also refuses names that start
    with ``_``."""
    if not name or not isinstance(arguments, dict):
        return False
    if name == CHAT_WITH_USER:
        return "content" in arguments
    if private_methods == "refuse" and name.startswith("_"):
        return False
    return hasattr(instance, name)


def envscaler_message(kind: str, value=None) -> dict:
    """An observation as EnvScaler's runner words it for the policy: ``{"role", "content"}``,
    with ``role`` ``tool`` for a tool's result and ``user`` for everything else (EnvScaler's
    observation ``type``). ``kind``: ``result`` (``value`` is the text of the tool's return value,
    ``f"{result}"``), ``invalid``, ``error`` (``value`` is the exception: its traceback, from the
    environment's frames on) or ``finished``."""
    if kind == "result":
        return {"role": "tool", "content": value}
    if kind == "invalid":
        return {"role": "user", "content": INVALID_ACTION_TEXT}
    if kind == "error":
        trace = value.__traceback__.tb_next if value.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(value), value, trace))
        if not text.startswith("Traceback"):  # raised by the call itself (wrong arguments)
            text = "Traceback (most recent call last):\n" + text
        return {"role": "user", "content": "Error: <Exception>\n" + text}
    if kind == "finished":
        return {"role": "user", "content": "Task finished"}
    raise ValueError(f"unknown observation kind {kind!r}")


def unscored_reason(spec: dict, actions, user_stopped: bool) -> str | None:
    """Why an episode gets no reward whatever its final state, or None when it is scored.

    Only ``envscaler`` episodes can be unscored: EnvScaler's runner computes a reward only at the
    step where the environment ends the episode (``base_env.py``, ``step``), so one the step limit
    or the end of the agent's actions cut is worth 0 (its training manager sums the per-step
    rewards, ``traj_env_manager_for_env_scaler.py``). The decision uses only what the host sent:
    ``actions`` (the JSON actions relayed, in order) and ``user_stopped`` (the host said the
    simulated user ended the conversation, right after the last action), never what the episode
    process reports, so that environment code cannot make an episode scored. An episode ended by a
    raising tool is unscored by :func:`check_payload` (its own report can only lose it reward)."""
    if semantics_of(spec) != "envscaler":
        return None
    actions = list(actions)
    if spec.get("user_mode") == "simulated":
        end = len(actions) - 1 if user_stopped and actions and is_chat(actions[-1]) else None
        how = "the simulated user's stop after a chat_with_user"
    else:
        end = next((k for k, a in enumerate(actions) if is_chat(a)), None)
        how = "a chat_with_user with a 'content' argument"
    if end is None:
        return f"unscored: the episode did not end at {how} (EnvScaler rewards only that)"
    max_steps = spec.get("max_steps")
    if max_steps is not None and end + 1 > max_steps:
        return (f"unscored: the episode ended at step {end + 1}, after the step limit of "
                f"{max_steps} (EnvScaler rewards only an episode ended within it)")
    return None


def unscored_checks(num_checks: int, reason: str) -> dict:
    """The check results of an unscored episode: every check failed, with ``reason``."""
    return {"check_results": [False] * num_checks, "check_errors": [reason] * num_checks}


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
        self.actions = []  # the actions stepped, in order (for unscored_reason in-process)
        self.user_stopped = False
        self.semantics = semantics_of(spec)

    # -- phases ---------------------------------------------------------------------------
    def reset(self) -> dict:
        spec = self.spec
        compiled = spec.get("compiled_class")
        cls = self._cls or load_class(spec["env_id"], spec["class_name"], spec["class_source"],
                                      base64.b64decode(compiled) if compiled else None)
        self.instance = instantiate(cls, spec["initial_state"],
                                    share=self.semantics == "envscaler")
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

    def _is_valid(self, name: str, arguments: dict) -> bool:
        if self.semantics == "envscaler":
            return envscaler_valid(self.instance, name, arguments,
                                   self.spec.get("private_methods", "allow"))
        if name == CHAT_WITH_USER:
            return True
        if name.startswith("_") or not callable(getattr(self.instance, name, None)):
            return False
        if self.spec.get("withheld_calls", "execute") == "refuse":
            return self.spec.get("withheld_tools", {}).get(name, 0) <= self.turn
        return True  # BFCL's executor runs a withheld tool called before its turn

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
        self.actions.append({"name": name, "arguments": arguments})
        envscaler = self.semantics == "envscaler"
        out = {"observation": None, "state_change": {}, "done": False}
        if not self._is_valid(name, arguments):
            out["observation"] = {"success": False, "error": f"invalid action: {name!r}"}
            if envscaler:
                out["message"] = envscaler_message("invalid")
        elif name == CHAT_WITH_USER:
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
                if envscaler:
                    out["message"] = envscaler_message("finished")
        else:
            self._call(name, arguments, out)
        max_steps = self.spec.get("max_steps")
        if not self.done and max_steps is not None and self.num_steps >= max_steps:
            self._end("max_steps")
        out.update(done=self.done, end_reason=self.end_reason, error=self.error, turn=self.turn)
        return out

    def _call(self, name: str, arguments: dict, out: dict) -> None:
        """Call tool ``name`` and put its observation (and, ``envscaler``, the policy's message:
        the result's text ``f"{result}"``, made inside the same ``try`` as the call, as EnvScaler
        does) and the state change into ``out``; a call that raises ends the episode."""
        envscaler = self.semantics == "envscaler"
        try:
            result = getattr(self.instance, name)(**copy.deepcopy(arguments))
            text = f"{result}" if envscaler else None
        except MemoryError:
            raise
        except Exception as err:
            msg = f"tool {name!r} raised {type(err).__name__}: {err}"
            self._end("tool_error", msg)
            result = {"success": False, "error": msg}
            if envscaler:
                out["message"] = envscaler_message("error", err)
        else:
            if envscaler:
                out["message"] = envscaler_message("result", text)
        if "message" in out:
            self._within_limit(name, out["message"]["content"])
        out["observation"] = json.loads(self._within_limit(name, encode(result)))
        out["state_change"] = self._state_change()

    def _within_limit(self, name: str, text: str) -> str:
        limit = self.spec.get("max_observation_chars")
        if limit is not None and len(text) > limit:
            raise LimitExceeded("output", f"output limit: tool {name!r} returned {len(text):,} "
                                          f"characters (limit {limit:,})")
        return text

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

    def user_stop(self) -> dict:
        """The simulated user ended the conversation (EnvScaler's ``###STOP###``): the episode
        ends here; an ``envscaler`` episode is scored when the last action was a valid
        ``chat_with_user`` (:func:`unscored_reason`)."""
        if self.instance is None:
            raise EpisodeStateError("user_stop before reset")
        if self.spec.get("user_mode") != "simulated":
            raise EpisodeStateError("user_stop in an episode without a simulated user")
        if self.done:
            raise EpisodeStateError(f"user_stop after the end of the episode ({self.end_reason})")
        self.user_stopped = True
        self._end(USER_STOP)
        return {"done": True, "end_reason": USER_STOP}

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
        reason = unscored_reason(self.spec, self.actions, self.user_stopped)
        checked = (unscored_checks(len(self.spec["checks"]), reason) if reason
                   else check_payload(self.spec, payload))
        return assemble_score(payload, checked)


def check_payload(spec: dict, payload: dict, compiled=None) -> dict:
    """Run the task's checks on a :meth:`EpisodeCore.final_payload`: per-check results and
    errors. An episode ended by a raising tool fails every check (EnvScaler). ``compiled``:
    :func:`compile_checks` of the checks, when already made. ``envscaler`` checks see the
    instance's state alone; ``project`` checks also the per-turn states of a multi-turn task and
    the agent's messages of a simulated-user one."""
    checks = spec["checks"]
    if payload.get("end_reason") == "tool_error":
        return unscored_checks(len(checks), payload.get("error"))
    final = decode_state(payload["final"])
    if not isinstance(final, dict):
        raise StateError("the final state is not a mapping")
    semantics = semantics_of(spec)
    seen = final
    if semantics == "project":
        seen = with_turns(final, payload.get("turn_states") or [],
                          len(spec.get("user_turns") or []))
        if spec.get("user_mode") == "simulated":
            seen = {**seen, MESSAGES_KEY: list(payload.get("agent_messages") or [])}
    _, results, errors = run_checks(spec["task_id"], checks, seen, decode_state(payload["initial"]),
                                    compiled, semantics)
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


def play_actions(core: EpisodeCore, actions, user_stop: bool = False) -> dict:
    """Reset ``core`` and apply ``actions`` until the episode ends: ``{"reset", "steps"}``.
    ``user_stop``: the simulated user then ends the conversation (:meth:`EpisodeCore.user_stop`),
    unless the episode has already ended."""
    record = {"reset": core.reset(), "steps": []}
    for action in actions:
        if core.done:
            break
        record["steps"].append(core.step(action))
    if user_stop and not core.done:
        core.user_stop()
    return record


def run_actions(spec: dict, actions, cls=None, user_stop: bool = False) -> dict:
    """Reset, apply ``actions`` until the episode ends, score: one whole episode as a record
    ``{"reset", "steps", "score"}`` (used for fixed action sequences: replay, benchmarks).
    ``user_stop``: see :func:`play_actions`."""
    core = EpisodeCore(spec, cls)
    record = play_actions(core, actions, user_stop)
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
