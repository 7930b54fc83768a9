"""Loader for the BFCL-v3 multi-turn pool (``bfcl-eval==2025.7.17``, Apache-2.0).

The four multi-turn categories (``base``, ``miss_func``, ``miss_param``, ``long_context``; 200
tasks each) become a :class:`~envsched_jax.pool.model.Pool` that runs under the project's
EnvScaler semantics (:mod:`envsched_jax.envs.inprocess`). The data, the tool documentation and the
executable API classes are read from the installed ``bfcl_eval`` package at run time; nothing of
it is copied into this repository. Install it with
``pip install --no-deps bfcl-eval==2025.7.17 mpmath`` (its declared dependencies conflict with JAX;
the API classes need only ``mpmath``).

Environment
    An environment is the sorted set of API classes a task involves: ``env_id`` is
    ``"bfcl:" + "+".join(sorted(classes))`` (e.g. ``bfcl:GorillaFileSystem+TwitterAPI``), and all
    tasks over the same class set, whatever their category, share it. Its ``tools`` are the OpenAI
    function schemas of every function of those classes, converted from
    ``multi_turn_func_doc/*.json`` with BFCL's own type table (``dict`` -> ``object``, ``float`` ->
    ``number`` plus ``format: float`` and a note in the description, as BFCL's OpenAI handler
    renders them). Where BFCL's docs disagree with the methods (``MessageAPI.delete_message``
    documents a ``message_id`` it does not accept; ``TravelAPI.purchase_insurance`` lists its
    parameters in another order) the docs are kept, since they are what the model sees, and the
    disagreement is listed in ``metadata["doc_quirks"]``. Its ``class_source`` is a small
    generated composite class :data:`COMPOSITE_CLASS_NAME` whose ``__init__(init_config)`` imports
    each involved ``bfcl_eval`` class by module name, instantiates it, calls
    ``_load_scenario(config, long_context=...)`` exactly as BFCL's executor does, and then
    deep-copies the instance (the long-context scenarios share nested dicts with module-level
    constants of ``bfcl_eval``, which a tool call would otherwise mutate for every later task in
    the process). Every tool is a method that dispatches to the owning instance.

    The composite's ``vars()`` is its observable state (the BFCL instances sit in a ``__slots__``
    slot, so they are not part of it): one JSON-able snapshot per involved class, named by the
    class, holding that instance's public attributes (BFCL's state checker compares exactly
    these), plus ``call_log``, the list of ``{"name", "arguments", "result"}`` of every tool call.
    Both are refreshed after every call. The snapshot encoding keeps what Python equality
    compares: dicts whose keys are not all strings become ``{"__dict_items__": [[key, value],
    ...]}`` and sets ``{"__set__": [...]}`` (both sorted canonically), other objects (the file
    system's ``Directory``/``File``) ``{"__class__": name, **public attributes}`` without a
    directory's ``parent`` back-reference, which BFCL's ``Directory.__eq__`` ignores too.

    Tool calls follow BFCL, not EnvScaler: a call that raises (including a call with wrong
    arguments) does not end the episode; it returns ``"Error during execution: <message>"``, the
    string BFCL shows the model. Results are returned as BFCL formats them (strings kept, dicts as
    ``json.dumps``, anything else ``str``).

Task
    ``task_id`` is the BFCL id; ``user_turns[k]`` is turn ``k``'s user text (``""`` for the
    holdout turns of ``miss_func``, so that turn indices line up with the ground truth);
    ``instruction`` joins the non-empty turns with newlines. ``initial_state`` is
    ``{"initial_config": <BFCL initial_config, class -> config>, "long_context": bool}`` (nested
    rather than flat because the runner sets every ``initial_state`` key as an attribute of the
    instance, which would overwrite the per-class snapshots). ``long_context`` is BFCL's own flag:
    true for the ``long_context`` category. ``reference_actions`` are the ``possible_answer``
    calls, parsed with :mod:`ast` (never evaluated), positional arguments bound to parameter names
    with the real method's signature, with ``turn=k``. ``metadata`` keeps every other BFCL field:
    ``category``, ``involved_classes`` (BFCL order), ``path``, ``num_turns``,
    ``turns_without_ground_truth`` (turns where the model should not act, e.g. the turn with a
    missing parameter), the data ``source`` file and ``line``, and for ``miss_func``
    ``missed_function`` (turn index -> withheld function names, as BFCL has it),
    ``withheld_tools`` (function name -> turn from which it is offered) and ``holdout_prompt``
    (BFCL's user message for that turn). Unknown extra fields of a record are kept verbatim.
    ``multi_turn_base_154`` has 5 user turns but 6 ground-truth turns (BFCL's own evaluation
    scores it as a forced termination, i.e. always failed); the shorter side is padded (``""``
    user turns, ``[]`` ground-truth turns) and ``metadata["turn_count_mismatch"]`` records it.

Missing functions (``miss_func``)
    The environment always implements every tool of its classes, because environments are shared
    between categories. Withholding is the runner's job: it leaves the tools named in
    ``withheld_tools`` out of the catalog until their turn, and sends ``holdout_prompt`` as that
    (empty) user turn, as BFCL's inference loop does. A call of a withheld tool before its turn
    runs, as BFCL's executor runs it (the turn's state check then sees its effect);
    ``withheld_calls="refuse"`` makes it an invalid action instead (:data:`WITHHELD_CALLS`).

Verifier checks
    The expected outcomes are computed at load time by replaying the ground truth in-process with
    the same composite class (``bfcl_eval`` is trusted library code), turn by turn, and are embedded
    in each check, as BFCL's ``multi_turn_checker`` makes them for every turn with ground truth:

    - one check per involved *stateful* class (all but ``MathAPI``): the class's snapshot at the end
      of the turn equals the one the ground-truth calls reach by then, under Python equality as
      BFCL's ``state_checker`` compares instance attributes (``44420 == 44420.0``; the tests
      confirm that it agrees with BFCL's own instance comparison; ``state_equality="exact"``
      compares the JSON snapshots type-exactly instead, :data:`STATE_EQUALITY`). The expected
      snapshot is embedded as the SHA-256 of the canonical JSON of its Python-equality form
      (:func:`state_digest`), which keeps long-context checks small;
    - one response check: the agent made at least one call in the turn (BFCL fails a turn with
      ground truth and no call) and the results of the turn's ground-truth calls are a
      sub-multiset of the results of all the agent's calls up to the end of the turn (BFCL's
      ``response_checker``, which also accepts results obtained in earlier turns).

    Checks find the state at the end of every user turn under ``final_state["__turns__"]``, which
    every executor provides for multi-turn tasks
    (:func:`envsched_jax.envs.runtime.core.with_turns`). Turns without ground truth are not
    checked (BFCL 2025.7.17 has its irrelevance check switched off). Reward is the mean of these
    checks (EnvScaler), where BFCL scores a task all-or-nothing (reward 1.0 when every per-turn
    condition holds). The loader plays every task's reference actions through the episode runtime
    and refuses a task whose reference does not score 1.0 (:func:`verify_reference`).

Agreement with BFCL's checker
    :mod:`envsched_jax.pool.bfcl_conformance` drives the installed ``bfcl_eval``'s multi-turn
    checker and this runtime with the same action sequences; ``reward == 1.0`` agrees with BFCL's
    ``valid`` except for the differences listed in its ``DOCUMENTED_DIFFERENCES``
    (``multi_turn_base_154``, which BFCL scores as a forced termination because its ground truth
    has more turns than its question, can reach 1.0 here).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import importlib
import inspect
import json
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envsched_jax.envs.inprocess import instantiate, snapshot_state
from envsched_jax.envs.runtime.core import TURNS_KEY, to_jsonable
from envsched_jax.pool.jsonl import read_json_objects
from envsched_jax.pool.model import (
    Action,
    Check,
    Environment,
    Pool,
    PoolError,
    PoolValidationErrors,
    Task,
)

BFCL_CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
BFCL_VERSION = "2025.7.17"
INSTALL_HINT = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath"
COMPOSITE_CLASS_NAME = "BFCLEnvironment"
CALL_LOG = "call_log"
ERROR_PREFIX = "Error during execution: "
ENV_PREFIX = "bfcl:"

_KNOWN_FIELDS = ("id", "question", "initial_config", "path", "involved_classes", "missed_function")


@dataclasses.dataclass(frozen=True)
class _BfclApi:
    """What the loader takes from the installed ``bfcl_eval`` package."""

    package_dir: Path
    class_modules: Mapping[str, str]        # class name -> module path
    stateless: frozenset[str]               # classes without a scenario (MathAPI)
    func_doc_files: Mapping[str, str]       # class name -> multi_turn_func_doc file name
    type_map: Mapping[str, str]             # BFCL type name -> JSON-schema type
    holdout_prompt: str                     # user message of a miss_func holdout turn


def _import_bfcl() -> _BfclApi:
    try:
        import bfcl_eval
        from bfcl_eval.constants.category_mapping import MULTI_TURN_FUNC_DOC_FILE_MAPPING
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
        )
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            CLASS_FILE_PATH_MAPPING,
            STATELESS_CLASSES,
        )
        for module in CLASS_FILE_PATH_MAPPING.values():
            importlib.import_module(module)
    except ImportError as err:
        raise PoolError(f"the BFCL-v3 pool needs the bfcl-eval package and mpmath ({err}); "
                        f"install them with `{INSTALL_HINT}`", source="bfcl_eval") from None
    return _BfclApi(
        package_dir=Path(bfcl_eval.__file__).parent,
        class_modules=dict(CLASS_FILE_PATH_MAPPING),
        stateless=frozenset(STATELESS_CLASSES),
        func_doc_files=dict(MULTI_TURN_FUNC_DOC_FILE_MAPPING),
        type_map=dict(GORILLA_TO_OPENAPI),
        holdout_prompt=DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    )


def default_data_dir() -> Path:
    """The ``data`` folder of the installed ``bfcl_eval`` package."""
    return _import_bfcl().package_dir / "data"


# --------------------------------------------------------------------------------------------
# Reading files


def _read_json_lines(path: Path, problems: list[PoolError]) -> list[tuple[int, dict[str, Any]]]:
    """Every JSON object of a JSON-lines file with its 1-based line; bad lines go to
    ``problems``."""
    if not path.is_file():
        raise PoolError(f"missing BFCL data file (reinstall with `{INSTALL_HINT}`)",
                        source=str(path))
    return read_json_objects(path, problems)


# --------------------------------------------------------------------------------------------
# Tool documentation -> OpenAI schemas


@dataclasses.dataclass(frozen=True)
class _ClassDocs:
    name: str
    domain: str                              # the shared "This tool belongs to ..." sentence(s)
    tools: tuple[dict[str, Any], ...]        # OpenAI schemas, doc order
    responses: Mapping[str, Any]             # tool name -> BFCL response schema
    signatures: Mapping[str, inspect.Signature]  # tool name -> method signature without self
    state_attributes: tuple[str, ...]        # public attributes of a loaded instance
    doc_quirks: tuple[str, ...]              # where the docs disagree with the methods


def _convert_schema(schema: Any, type_map: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise PoolError(f"parameter schema must be an object, got {type(schema).__name__}",
                        field=where)
    out = dict(schema)
    bfcl_type = schema.get("type", "string")
    if bfcl_type not in type_map:
        raise PoolError(f"unknown BFCL type {bfcl_type!r}", field=f"{where}.type")
    out["type"] = type_map[bfcl_type]
    if bfcl_type == "float":  # as BFCL's OpenAI handler renders a float parameter
        out["format"] = "float"
        if isinstance(out.get("description"), str):
            out["description"] += " This is a float type value."
    if "properties" in schema:
        if not isinstance(schema["properties"], Mapping):
            raise PoolError("'properties' must be an object", field=f"{where}.properties")
        out["properties"] = {k: _convert_schema(v, type_map, f"{where}.properties.{k}")
                             for k, v in schema["properties"].items()}
    if "items" in schema:
        out["items"] = _convert_schema(schema["items"], type_map, f"{where}.items")
    return out


def _tool_domain(descriptions: Sequence[str]) -> str:
    """The sentence(s) every tool description of a class starts with ("This tool belongs to the
    Gorilla file system. ... Tool description: <specific>")."""
    heads = [d.split(" Tool description:", 1)[0].strip() for d in descriptions]
    return heads[0] if heads and all(h == heads[0] for h in heads) else ""


def _method_signature(cls: type, name: str) -> inspect.Signature:
    sig = inspect.signature(getattr(cls, name))
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _read_class_docs(api: _BfclApi, data_dir: Path, class_name: str) -> _ClassDocs:
    path = data_dir / "multi_turn_func_doc" / api.func_doc_files[class_name]
    problems: list[PoolError] = []
    records = _read_json_lines(path, problems)
    if problems:
        raise PoolValidationErrors(problems)
    cls = getattr(importlib.import_module(api.class_modules[class_name]), class_name)
    tools, responses, signatures, descriptions, quirks = [], {}, {}, [], []
    for line_no, doc in records:
        where = {"source": str(path), "line": line_no}
        name = doc.get("name")
        if not isinstance(name, str) or not isinstance(doc.get("description"), str):
            raise PoolError("a function doc needs a string 'name' and 'description'", **where)
        if name.startswith("_") or not callable(getattr(cls, name, None)):
            raise PoolError(f"{class_name} has no public method {name!r}", field="name", **where)
        params = _convert_schema(doc.get("parameters", {"type": "dict", "properties": {}}),
                                 api.type_map, "parameters")
        params.setdefault("properties", {})
        signature = _method_signature(cls, name)
        undocumented = [p.name for p in signature.parameters.values()
                        if p.default is inspect.Parameter.empty
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                        and p.name not in params["properties"]]
        if undocumented:
            raise PoolError(f"required parameters {undocumented} of {class_name}.{name}"
                            f"{signature} are not documented", field="parameters", **where)
        # BFCL's docs have quirks that the loader keeps (the model sees these docs) and reports
        extra = [p for p in params["properties"] if p not in signature.parameters]
        if extra:
            quirks.append(f"{name}: documented parameters {extra} are not accepted by the "
                          "method (a call passing them returns an execution error)")
        order = [p for p in params["properties"] if p in signature.parameters]
        if order != [p for p in signature.parameters if p in params["properties"]]:
            quirks.append(f"{name}: documented parameter order {order} differs from the "
                          f"method's {list(signature.parameters)} (positional ground-truth "
                          "arguments are bound by the method's order)")
        tools.append({"type": "function", "function": {
            "name": name, "description": doc["description"], "parameters": params}})
        responses[name] = copy.deepcopy(doc.get("response", {}))
        signatures[name] = signature
        descriptions.append(doc["description"])
    instance = cls()
    if class_name not in api.stateless:
        instance._load_scenario({})
    attributes = tuple(k for k in vars(instance) if not k.startswith("_"))
    return _ClassDocs(class_name, _tool_domain(descriptions), tuple(tools), responses,
                      signatures, attributes, tuple(quirks))


# --------------------------------------------------------------------------------------------
# The composite environment class (generated source)

_COMPOSITE_PRELUDE = '''\
"""BFCL-v3 multi-turn environment over {classes} (generated by envsched_jax.pool.bfcl).

Runs the API classes of the installed bfcl-eval package ({install}).
State: one JSON-able snapshot of each class's public attributes, named by the class, and
`call_log`, refreshed after every tool call.
"""

import copy
import importlib
import json

_MODULES = {modules!r}
_STATELESS = {stateless!r}
_OWNER = {owner!r}
_ERROR_PREFIX = {error_prefix!r}


def _sort_key(value):
    return json.dumps(value, sort_keys=True, default=repr)


def _jsonable(value, _ancestors=()):
    """A JSON-able encoding of `value` under which equality is Python equality."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in _ancestors:
        return {{"__ref__": type(value).__name__}}
    inner = _ancestors + (id(value),)
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {{k: _jsonable(v, inner) for k, v in value.items()}}
        items = [[_jsonable(k, inner), _jsonable(v, inner)] for k, v in value.items()]
        return {{"__dict_items__": sorted(items, key=lambda kv: _sort_key(kv[0]))}}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, inner) for v in value]
    if isinstance(value, (set, frozenset)):
        return {{"__set__": sorted((_jsonable(v, inner) for v in value), key=_sort_key)}}
    out = {{"__class__": type(value).__name__}}
    for key, attr in vars(value).items():
        # BFCL's Directory equality ignores the back-reference to the parent directory (which
        # goes stale when a directory is moved)
        if not key.startswith("_") and key != "parent":
            out[key] = _jsonable(attr, inner)
    return out


def _bfcl_result(result):
    """The string BFCL's executor shows the model for a call result."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class {class_name}:
    __slots__ = ("_bfcl_instances", "__dict__")

    def __init__(self, init_config=None):
        config = dict(init_config or {{}})
        per_class = config.get("initial_config") or {{}}
        long_context = bool(config.get("long_context", False))
        instances = {{}}
        for name, module in _MODULES.items():
            instance = getattr(importlib.import_module(module), name)()
            if name not in _STATELESS:
                instance._load_scenario(copy.deepcopy(per_class.get(name, {{}})),
                                        long_context=long_context)
            # break aliasing with bfcl_eval's module-level constants (long-context extensions)
            instances[name] = copy.deepcopy(instance)
        self._bfcl_instances = instances
        self.{call_log} = []
        self._bfcl_refresh()

    def _bfcl_refresh(self):
        for name, instance in self._bfcl_instances.items():
            setattr(self, name, {{k: _jsonable(v) for k, v in vars(instance).items()
                                 if not k.startswith("_")}})

    def _bfcl_call(self, name, args, kwargs):
        method = getattr(self._bfcl_instances[_OWNER[name]], name)
        try:
            result = _bfcl_result(method(*args, **kwargs))
        except Exception as err:  # BFCL reports a failing call to the model and goes on
            result = _ERROR_PREFIX + str(err)
        entry = {{"name": name, "arguments": _jsonable(kwargs), "result": result}}
        if args:
            entry["args"] = _jsonable(args)
        self.{call_log}.append(entry)
        self._bfcl_refresh()
        return result
'''

_COMPOSITE_METHOD = '''
    def {name}(self, *args, **kwargs):
        {doc!r}
        return self._bfcl_call({name!r}, args, kwargs)
'''


def composite_source(api: _BfclApi, docs: Sequence[_ClassDocs]) -> str:
    """Python source of the composite class over ``docs``' classes (sorted by name)."""
    owner = {tool["function"]["name"]: d.name for d in docs for tool in d.tools}
    src = _COMPOSITE_PRELUDE.format(
        classes=", ".join(d.name for d in docs), install=INSTALL_HINT,
        modules={d.name: api.class_modules[d.name] for d in docs},
        stateless=tuple(sorted(api.stateless & {d.name for d in docs})),
        owner=owner, error_prefix=ERROR_PREFIX, class_name=COMPOSITE_CLASS_NAME,
        call_log=CALL_LOG)
    for d in docs:
        for tool in d.tools:
            fn = tool["function"]
            src += _COMPOSITE_METHOD.format(name=fn["name"], doc=f"{d.name}.{fn['name']}: "
                                            + fn["description"])
    return src


def _exec_composite(env_id: str, source: str) -> type:
    module = types.ModuleType(f"envsched_bfcl_{env_id}")
    exec(compile(source, f"<environment {env_id}>", "exec"), module.__dict__)
    return module.__dict__[COMPOSITE_CLASS_NAME]


def _build_environment(api: _BfclApi, env_id: str, docs: Sequence[_ClassDocs]) -> Environment:
    names = [d.name for d in docs]
    domains = [f"{d.name}: {d.domain}" if d.domain else d.name for d in docs]
    state_space = [{
        "entity": d.name,
        "attributes": list(d.state_attributes),
        "description": (f"Public attributes of bfcl_eval's {d.name} instance, exposed as the "
                        f"JSON snapshot final_state[{d.name!r}]"
                        + ("; the class is stateless." if d.name in api.stateless else ".")),
    } for d in docs]
    state_space.append({
        "entity": CALL_LOG,
        "attributes": ["name", "arguments", "result"],
        "description": "Every tool call of the episode, with the result string BFCL shows "
                       "the model.",
    })
    constraints = [
        "Only the tools of the involved API classes exist; each acts on its own class's state.",
        f"A call that fails returns {ERROR_PREFIX!r} plus the message and does not end the "
        "episode.",
        "The BFCL checker compares each class's public state with the ground truth's and requires "
        "the ground-truth call results among the agent's results.",
    ]
    return Environment(
        env_id=env_id,
        class_name=COMPOSITE_CLASS_NAME,
        summary="BFCL-v3 multi-turn environment with the API domains: " + "; ".join(domains),
        introduction=("Executable API classes of the Berkeley Function Calling Leaderboard v3 "
                      f"(bfcl-eval=={BFCL_VERSION}): " + ", ".join(names) + "."),
        tools=tuple(t for d in docs for t in d.tools),
        state_space=tuple(state_space),
        constraints=tuple(constraints),
        class_source=composite_source(api, docs),
        metadata={
            "source": f"bfcl-eval=={BFCL_VERSION}",
            "involved_classes": names,
            "tool_owner": {t["function"]["name"]: d.name for d in docs for t in d.tools},
            "tool_responses": {n: r for d in docs for n, r in d.responses.items()},
            "doc_quirks": [f"{d.name}.{q}" for d in docs for q in d.doc_quirks],
        },
    )


# --------------------------------------------------------------------------------------------
# Ground truth


def parse_call(text: str,
               signatures: Mapping[str, inspect.Signature]) -> tuple[str, dict[str, Any]]:
    """Parse one ground-truth call such as ``"sort('final_report.pdf')"`` into ``(name,
    arguments)`` with :mod:`ast` (never evaluated); positional arguments are bound to parameter
    names with the method's signature. Raises ``ValueError`` on anything but a call of a known
    function with literal arguments."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"not a Python call expression ({err.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("expected a call of a plain function name")
    name = node.func.id
    if name not in signatures:
        raise ValueError(f"unknown function {name!r}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError):
        raise ValueError("arguments must be literals") from None
    if any(k is None for k in kwargs):
        raise ValueError("**kwargs unpacking is not supported")
    try:
        bound = signatures[name].bind(*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"arguments do not fit {name}{signatures[name]} ({err})") from None
    return name, dict(bound.arguments)


@dataclasses.dataclass(frozen=True)
class _Replay:
    initial: dict[str, Any]
    final: dict[str, Any]
    turn_states: tuple[dict[str, Any], ...]      # JSON state at the end of each turn
    turn_results: tuple[tuple[str, ...], ...]
    errors: tuple[tuple[int, str, str], ...]     # (turn, call, error result)


def _replay(cls: type, initial_state: Mapping[str, Any], actions: Sequence[Action],
            num_turns: int, refused: Mapping[str, int] | None = None) -> _Replay:
    """Run the ground truth turn by turn. ``refused`` (``withheld_calls="refuse"``): tool name ->
    first turn it may be called; an earlier call is skipped, as the runtime refuses it."""
    instance = instantiate(cls, initial_state)
    initial = snapshot_state(instance)
    results: list[list[str]] = [[] for _ in range(num_turns)]
    states = []
    errors = []
    for turn in range(num_turns):
        for action in (a for a in actions if a.turn == turn):
            if refused and refused.get(action.name, 0) > turn:
                continue
            result = getattr(instance, action.name)(**copy.deepcopy(dict(action.arguments)))
            results[turn].append(result)
            if isinstance(result, str) and result.startswith(ERROR_PREFIX):
                errors.append((turn, action.name, result))
        states.append(to_jsonable(snapshot_state(instance)))
    return _Replay(initial, snapshot_state(instance), tuple(states), tuple(tuple(r) for r in results),
                   tuple(errors))


def run_in_runtime(env: Environment, task: Task, actions: Sequence[Action],
                   cls: type | None = None) -> dict[str, Any]:
    """Play ``actions`` (turn-tagged; each user turn closed by ``chat_with_user``) through the
    episode runtime every sandbox runs (:func:`envsched_jax.envs.runtime.core.run_actions`): the
    whole record ``{"reset", "steps", "score"}``. ``cls``: the composite class, when already
    made (else ``env.class_source`` is executed)."""
    from envsched_jax.envs.episode import action_json, episode_spec, with_turn_ends
    from envsched_jax.envs.runtime import core

    if cls is None:
        cls = core.load_class(env.env_id, env.class_name, env.class_source)
    played = [action_json(a) for a in with_turn_ends(task, actions)]
    return core.run_actions(episode_spec(env, task), played, cls)


def verify_reference(env: Environment, task: Task, cls: type | None = None) -> None:
    """Play ``task``'s reference actions through the episode runtime (:func:`run_in_runtime`) and
    raise :class:`PoolError` naming the task and its failed checks unless they score 1.0. The
    loader calls this for every task, so checks that expect what the runtime cannot produce fail
    at load time, not in training."""
    score = run_in_runtime(env, task, task.reference_actions, cls)["score"]
    if score["reward"] != 1.0:
        failed = [f"{c.text} ({err})" if err else c.text for c, ok, err in
                  zip(task.checks, score["check_results"], score["check_errors"]) if not ok]
        raise PoolError(f"the reference actions of {task.task_id!r} score {score['reward']} in the "
                        f"episode runtime (end: {score['end_reason']}), not 1.0; failed checks: "
                        + "; ".join(failed), field="reference_actions")


# --------------------------------------------------------------------------------------------
# Checks (BFCL's multi_turn_checker, turn by turn: see the module docstring)

_PY_EQUAL_FORM = '''\
def py_equal_form(value):
    """A canonical form of a decoded state value: two values have equal forms exactly when
    Python's == calls them equal, for everything a BFCL state holds. Numbers that compare equal
    (1, 1.0, True) get one form; containers recurse, and the sorted item lists of sets and of
    dicts with non-string keys are sorted again, since their elements' forms may have changed.
    Not told apart, unlike in Python: a tuple and a list with equal items (the snapshot makes both
    lists), and NaN from NaN (the snapshot makes it a string)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [py_equal_form(v) for v in value]
    if isinstance(value, dict):
        out = {k: py_equal_form(v) for k, v in value.items()}
        for tag in ("__set__", "__dict_items__"):
            if len(out) == 1 and isinstance(out.get(tag), list):
                out[tag] = sorted(out[tag], key=lambda v: json.dumps(v, sort_keys=True))
        return out
    return value
'''

_STATE_CHECK = '''\
import hashlib
import json

{form_source}

def check_func(final_state):
    turns = final_state.get({turns_key!r}) or []
    if len(turns) <= {turn}:
        return False
    value = turns[{turn}].get({key!r})
    text = json.dumps({form_call}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest() == {digest!r}
'''

STATE_EQUALITY = ("python", "exact")
"""How a class's state is compared with the ground truth's. ``python`` (the default, BFCL's rule):
Python equality of the instances' attributes, so ``44420 == 44420.0`` and ``True == 1``.
``exact``: equality of the canonical JSON snapshots, which also tells integers from floats and
booleans from numbers; stricter than BFCL (a float parameter sent as an integer fails every later
state check), kept for researchers who want type-exact states."""

WITHHELD_CALLS = ("execute", "refuse")
"""What a call of a ``miss_func`` tool before its turn does (the tool is not in the catalog
then either way). ``execute`` (the default, BFCL's rule: its executor runs any call of a method
of the involved classes): the call runs and changes the state, and the turn's state check sees
it. ``refuse``: the call is an invalid action (an observation, no state change), so an agent
cannot act with a tool it has not been offered; stricter than BFCL, and its checks are made from
a ground-truth replay under the same rule (BFCL's own ground truth of
``multi_turn_miss_func_49`` calls ``tail`` two turns before it is offered)."""

_FORM_NAMESPACE: dict[str, Any] = {"json": json}
exec(_PY_EQUAL_FORM, _FORM_NAMESPACE)
py_equal_form = _FORM_NAMESPACE["py_equal_form"]


def state_digest(value: Any, equality: str = "python") -> str:
    """The SHA-256 a state check compares: of the canonical JSON of ``value``'s Python-equality
    form (``python``) or of ``value`` itself (``exact``); the checks compute the same."""
    form = py_equal_form(value) if equality == "python" else value
    return hashlib.sha256(_canonical(form).encode("utf-8")).hexdigest()


_RESPONSE_CHECK = '''\
import json

EXPECTED = json.loads({expected!r})


def check_func(final_state):
    turns = final_state.get({turns_key!r}) or []
    if len(turns) <= {turn}:
        return False
    log = turns[{turn}].get({call_log!r}, [])
    before = turns[{turn} - 1].get({call_log!r}, []) if {turn} > 0 else []
    if len(log) <= len(before):
        return False  # no call in this turn
    remaining = [entry.get("result") for entry in log]
    for result in EXPECTED:
        if result not in remaining:
            return False
        remaining.remove(result)
    return True
'''


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _make_checks(api: _BfclApi, classes: Sequence[str], replay: _Replay,
                 ground_truth: Sequence[Sequence[str]], equality: str = "python") -> list[Check]:
    checks = []
    form_source, form_call = ((_PY_EQUAL_FORM, "py_equal_form(value)") if equality == "python"
                              else ("", "value"))
    for turn, calls in enumerate(ground_truth):
        if not calls:
            continue  # BFCL checks nothing at a turn without ground truth
        for name in classes:
            if name in api.stateless:
                continue
            checks.append(Check(
                f"Turn {turn}: the state of {name} at the end of the turn equals the one the "
                "ground-truth calls reach",
                _STATE_CHECK.format(turns_key=TURNS_KEY, turn=turn, key=name,
                                    form_source=form_source, form_call=form_call,
                                    digest=state_digest(replay.turn_states[turn][name], equality))))
        checks.append(Check(
            f"Turn {turn}: the agent calls a tool in the turn, and the results of the ground-truth "
            f"calls {', '.join(calls)} all appear among the results of its calls so far",
            _RESPONSE_CHECK.format(expected=_canonical(list(replay.turn_results[turn])),
                                   turns_key=TURNS_KEY, turn=turn, call_log=CALL_LOG)))
    return checks


# --------------------------------------------------------------------------------------------
# The loader


def env_id_for(classes: Iterable[str]) -> str:
    """``bfcl:`` plus the sorted class names joined by ``+``."""
    return ENV_PREFIX + "+".join(sorted(set(classes)))


def _user_text(turn: Any, where: dict[str, Any], k: int) -> str:
    if not isinstance(turn, list):
        raise PoolError(f"turn {k} must be a list of messages", field=f"question[{k}]", **where)
    texts = []
    for m in turn:
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise PoolError(f"turn {k} has a message without string 'content'",
                            field=f"question[{k}]", **where)
        if m.get("role") == "user":
            texts.append(m["content"])
    return "\n".join(texts)


def load_bfcl_pool(categories: Sequence[str] = BFCL_CATEGORIES,
                   data_dir: str | Path | None = None, *,
                   name: str = "bfcl_v3_multi_turn",
                   state_equality: str = "python",
                   withheld_calls: str = "execute") -> Pool:
    """Load BFCL-v3 multi-turn tasks as a validated :class:`Pool`.

    Args:
      categories: any of :data:`BFCL_CATEGORIES`, in the order the tasks should appear.
      data_dir: a folder laid out like ``bfcl_eval/data`` (``BFCL_v3_multi_turn_<category>.json``,
        ``possible_answer/``, ``multi_turn_func_doc/``); defaults to the installed package's.
      name: the pool's name.
      state_equality: how the state checks compare states, one of :data:`STATE_EQUALITY`
        (default ``python``, as BFCL's checker does).
      withheld_calls: what an early call of a withheld ``miss_func`` tool does, one of
        :data:`WITHHELD_CALLS` (default ``execute``, as BFCL's executor does).

    Every task's reference actions are played through the episode runtime and must score 1.0
    (:func:`verify_reference`).

    Raises:
      PoolError: ``bfcl_eval`` (or ``mpmath``) is not installed, or a file is missing; a
        :class:`PoolValidationErrors` lists every malformed record with its file and line.
    """
    if isinstance(categories, str):
        categories = (categories,)
    unknown = [c for c in categories if c not in BFCL_CATEGORIES]
    if unknown or len(set(categories)) != len(categories):
        raise PoolError(f"categories must be distinct values of {BFCL_CATEGORIES}, "
                        f"got {tuple(categories)!r}", field="categories")
    for option, value, allowed in (("state_equality", state_equality, STATE_EQUALITY),
                                   ("withheld_calls", withheld_calls, WITHHELD_CALLS)):
        if value not in allowed:
            raise PoolError(f"{option} must be one of {allowed}, got {value!r}", field=option)
    api = _import_bfcl()
    data_dir = Path(data_dir) if data_dir is not None else api.package_dir / "data"
    class_docs = {c: _read_class_docs(api, data_dir, c) for c in sorted(api.class_modules)}

    problems: list[PoolError] = []
    tasks: list[Task] = []
    composites: dict[str, type] = {}
    environments: dict[str, Environment] = {}

    for category in categories:
        q_path = data_dir / f"BFCL_v3_multi_turn_{category}.json"
        a_path = data_dir / "possible_answer" / f"BFCL_v3_multi_turn_{category}.json"
        questions = _read_json_lines(q_path, problems)
        answers: dict[str, tuple[int, Any]] = {}
        for line_no, rec in _read_json_lines(a_path, problems):
            if not isinstance(rec.get("id"), str) or not isinstance(rec.get("ground_truth"), list):
                problems.append(PoolError("a ground-truth record needs a string 'id' and a list "
                                          "'ground_truth'", source=str(a_path), line=line_no))
                continue
            answers[rec["id"]] = (line_no, rec["ground_truth"])
        for line_no, rec in questions:
            where = {"source": str(q_path), "line": line_no}
            try:
                task, env_id, classes = _load_task(api, class_docs, category, rec, where,
                                                   answers, a_path, composites,
                                                   state_equality, withheld_calls)
                if env_id not in environments:
                    environments[env_id] = _build_environment(
                        api, env_id, [class_docs[c] for c in classes])
                verify_reference(environments[env_id], task, composites[env_id])
            except PoolError as err:
                problems.append(PoolError(err.reason, field=err.field, **where)
                                if err.source is None else err)
                continue
            tasks.append(task)
    if problems:
        raise PoolValidationErrors(problems)
    return Pool(name=name, environments=tuple(environments[e] for e in sorted(environments)),
                tasks=tuple(tasks))


def _load_task(api: _BfclApi, class_docs: Mapping[str, _ClassDocs], category: str,
               rec: Mapping[str, Any], where: dict[str, Any],
               answers: Mapping[str, tuple[int, Any]], a_path: Path,
               composites: dict[str, type], state_equality: str = "python",
               withheld_calls: str = "execute") -> tuple[Task, str, list[str]]:
    task_id = rec.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise PoolError("missing or non-string 'id'", field="id", **where)
    involved = rec.get("involved_classes")
    if (not isinstance(involved, list) or not involved
            or not all(isinstance(c, str) for c in involved)):
        raise PoolError("'involved_classes' must be a non-empty list of class names",
                        field="involved_classes", **where)
    unknown = sorted(set(involved) - set(class_docs))
    if unknown:
        raise PoolError(f"unknown API classes {unknown}", field="involved_classes", **where)
    question = rec.get("question")
    if not isinstance(question, list) or not question:
        raise PoolError("'question' must be a non-empty list of turns", field="question", **where)
    initial_config = rec.get("initial_config", {})
    if not isinstance(initial_config, dict):
        raise PoolError("'initial_config' must be an object", field="initial_config", **where)
    user_turns = [_user_text(turn, where, k) for k, turn in enumerate(question)]

    classes = sorted(set(involved))
    env_id = env_id_for(classes)
    docs = [class_docs[c] for c in classes]
    signatures = {n: s for d in docs for n, s in d.signatures.items()}

    if task_id not in answers:
        raise PoolError(f"no ground truth for {task_id!r} in {a_path}", field="id", **where)
    a_line, ground_truth = answers[task_id]
    a_where = {"source": str(a_path), "line": a_line}
    if not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in ground_truth):
        raise PoolError("ground truth must be a list of turns, each a list of call strings",
                        field="ground_truth", **a_where)
    # BFCL data bug (multi_turn_base_154 has 5 user turns and 6 ground-truth turns, which BFCL's
    # own evaluation scores as a forced termination): pad the shorter side and record it
    num_turns = max(len(question), len(ground_truth))
    turn_mismatch = len(ground_truth) != len(question)
    user_turns += [""] * (num_turns - len(user_turns))
    ground_truth = list(ground_truth) + [[]] * (num_turns - len(ground_truth))
    actions = []
    for turn, calls in enumerate(ground_truth):
        for call in calls:
            try:
                fn, arguments = parse_call(call, signatures)
            except ValueError as err:
                raise PoolError(f"turn {turn} call {call!r}: {err}", field="ground_truth",
                                **a_where) from None
            actions.append(Action(fn, arguments, turn=turn))

    missed = rec.get("missed_function")
    withheld: dict[str, int] = {}
    if missed is not None:
        if not isinstance(missed, dict):
            raise PoolError("'missed_function' must be an object", field="missed_function", **where)
        for turn_key, fns in missed.items():
            if not (str(turn_key).isdigit() and int(turn_key) < len(question)
                    and isinstance(fns, list) and all(f in signatures for f in fns)):
                raise PoolError(f"bad entry {turn_key!r}: {fns!r}", field="missed_function",
                                **where)
            withheld.update({f: int(turn_key) for f in fns})

    initial_state = {"initial_config": initial_config, "long_context": category == "long_context"}
    if env_id not in composites:
        composites[env_id] = _exec_composite(env_id, composite_source(api, docs))
    try:
        replay = _replay(composites[env_id], initial_state, actions, num_turns,
                         withheld if withheld_calls == "refuse" else None)
    except Exception as err:  # a scenario bfcl_eval cannot load, or an unencodable state
        raise PoolError(f"replaying the ground truth of {task_id!r} failed "
                        f"({type(err).__name__}: {err})", **where) from None
    checks = _make_checks(api, classes, replay, ground_truth, state_equality)
    if not checks:
        raise PoolError(f"task {task_id!r} gets no check: its ground truth has no call and its "
                        "classes are stateless", field="checks", **where)

    metadata: dict[str, Any] = {
        "category": category,
        "involved_classes": list(involved),
        "path": rec.get("path", []),
        "num_turns": num_turns,
        "turns_without_ground_truth": [k for k, t in enumerate(ground_truth) if not t],
        "source": Path(where["source"]).name,
        "line": where["line"],
        "state_equality": state_equality,
    }
    if missed is not None:
        metadata.update(missed_function=missed, withheld_tools=withheld,
                        holdout_prompt=api.holdout_prompt, withheld_calls=withheld_calls)
    if turn_mismatch:
        metadata["turn_count_mismatch"] = {"question_turns": len(question),
                                           "ground_truth_turns": len(answers[task_id][1])}
    if replay.errors:
        metadata["ground_truth_errors"] = [list(e) for e in replay.errors]
    metadata.update({k: v for k, v in rec.items() if k not in _KNOWN_FIELDS})
    try:
        task = Task(task_id=task_id, env_id=env_id,
                    instruction="\n".join(t for t in user_turns if t.strip()),
                    initial_state=initial_state, checks=tuple(checks),
                    reference_actions=tuple(actions), user_turns=tuple(user_turns),
                    metadata=metadata)
    except PoolError as err:
        raise PoolError(err.reason, field=err.field, **where) from None
    return task, env_id, classes
