"""The task-pool data model: environments, tasks, verifier checks and actions.

A *node* of the scheduler is one environment-task pair. An :class:`Environment` is an executable
setting (tool catalog, state definition, rules, and the class that implements the tools); a
:class:`Task` is one request inside it (instruction, initial state, verifier checks, and optionally
a reference action sequence). A :class:`Pool` holds both and guarantees the cross-record
invariants (unique ids, every task's environment exists, no empty checklist).

Records are frozen dataclasses. Nested JSON values (initial states, tool schemas, arguments) are
deep-copied on construction so that a record never aliases its caller's data: loading never
mutates its inputs, and mutating an input after loading never changes a loaded record.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

OperationKind = Literal["query", "state_change"]


class PoolError(ValueError):
    """A pool record or a whole pool is invalid.

    ``source`` names the file (or other origin), ``line`` the 1-based line of the file, or, for a
    record of a whole-file JSON document (whose lines json does not report), ``record`` its
    1-based position in the document; ``field`` the offending field. The message names all of
    them, so that it points at exactly what to fix.
    """

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None, record: int | None = None):
        self.reason = message
        self.source = source
        self.line = line
        self.record = record
        self.field = field
        where = []
        if source is not None:
            where.append(str(source))
        if line is not None:
            where.append(f"line {line}")
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")


class PoolValidationErrors(PoolError):
    """Several problems found while validating a pool; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[PoolError]):
        self.problems = tuple(problems)
        head = f"{len(self.problems)} problem(s) in the task pool:\n"
        super().__init__(head + "\n".join(f"  - {p}" for p in self.problems))


# Deepest JSON nesting a pool value may have. Real pools nest a few levels; json itself fails
# near 1,000 levels and copy.deepcopy (used when records are written) near 500.
MAX_DEPTH = 100


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests lists/objects more than ``limit`` deep (``[]`` is depth
    1). Iterative, so that it cannot itself hit the recursion limit."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _frozen_json(value: Any, field: str) -> Any:
    """A fresh copy of a JSON value in exactly the form it has on disk.

    Encoding and decoding both checks that the value is JSON and copies it (faster than
    ``copy.deepcopy``); it also normalises what JSON cannot keep (tuples become lists, non-string
    keys become strings), so a record equals itself after a round trip through the JSON-lines form.
    """
    try:
        text = json.dumps(value, default=_json_default_error, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise PoolError(f"value is not JSON-serialisable ({err})", field=field) from None
    except RecursionError:
        raise PoolError(f"value is nested deeper than {MAX_DEPTH} levels", field=field) from None
    copied = json.loads(text)
    if json_depth_exceeds(copied, MAX_DEPTH):
        raise PoolError(f"value is nested deeper than {MAX_DEPTH} levels", field=field)
    return copied


def _json_default_error(obj: Any) -> Any:
    raise TypeError(f"object of type {type(obj).__name__} is not JSON-serialisable")


@dataclasses.dataclass(frozen=True)
class Check:
    """One verifier check: human-readable text plus Python source defining
    ``check_func(final_state) -> bool`` (EnvScaler's convention; a global ``initial_state`` is
    injected when it runs). Code that is empty, does not compile or defines no ``check_func`` is
    kept and counts 0 when it runs, as in EnvScaler's runner (its check generator writes an empty
    ``check_func`` when it gives up)."""

    text: str
    code: str

    def __post_init__(self):
        if not isinstance(self.text, str):
            raise PoolError("check text must be a string", field="text")
        if not isinstance(self.code, str):
            raise PoolError("check code must be a string", field="code")


@dataclasses.dataclass(frozen=True)
class Action:
    """One tool call ``{"name", "arguments"}``. ``turn`` indexes the user turn of a multi-turn
    task (0 for single-turn pools)."""

    name: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    turn: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise PoolError("action name must be a non-empty string", field="name")
        if not isinstance(self.arguments, Mapping):
            raise PoolError("action arguments must be an object", field="arguments")
        if not isinstance(self.turn, int) or self.turn < 0:
            raise PoolError(f"action turn must be a non-negative integer, got {self.turn!r}",
                            field="turn")
        object.__setattr__(self, "arguments", _frozen_json(dict(self.arguments), "arguments"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": copy.deepcopy(dict(self.arguments))}
        if self.turn:
            out["turn"] = self.turn
        return out


@dataclasses.dataclass(frozen=True)
class Operation:
    """An entry of an environment's operation list (EnvScaler's ``operation_list``)."""

    name: str
    description: str = ""
    kind: OperationKind = "query"

    def __post_init__(self):
        if self.kind not in ("query", "state_change"):
            raise PoolError(f"operation kind must be 'query' or 'state_change', got {self.kind!r}",
                            field="operation_type")


@dataclasses.dataclass(frozen=True)
class Environment:
    """An executable environment.

    Exactly one of ``class_source`` (Python source defining ``class_name``; untrusted when it comes
    from a pool file) and ``trusted_class`` (a Python class object, for project-authored code that
    may run in-process) is normally set; pools loaded from disk always carry source.
    """

    env_id: str
    class_name: str
    summary: str
    tools: tuple[Mapping[str, Any], ...]
    state_space: tuple[Mapping[str, Any], ...] = ()
    constraints: tuple[str, ...] = ()
    operations: tuple[Operation, ...] = ()
    class_source: str | None = None
    trusted_class: type | None = dataclasses.field(default=None, compare=False, repr=False)
    introduction: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("env_id", "class_name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise PoolError(f"{name} must be a non-empty string, got {value!r}", field=name)
        if not isinstance(self.summary, str):
            raise PoolError("summary must be a string", field="summary")
        if self.class_source is None and self.trusted_class is None:
            raise PoolError("an environment needs class_source or a trusted_class",
                            field="class_source")
        if self.class_source is not None and not isinstance(self.class_source, str):
            raise PoolError("class_source must be a string", field="class_source")
        tools = tuple(_frozen_json(dict(t), "tools") for t in _as_list(self.tools, "tools"))
        for k, tool in enumerate(tools):
            _validate_tool_schema(tool, f"tools[{k}]")
        names = [tool_name(t) for t in tools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PoolError(f"duplicate tool names {dup}", field="tools")
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "state_space",
                           tuple(_frozen_json(dict(e), "state_space")
                                 for e in _as_list(self.state_space, "state_space")))
        constraints = tuple(_as_list(self.constraints, "constraints"))
        if not all(isinstance(c, str) for c in constraints):
            raise PoolError("constraints must be a list of strings", field="constraints")
        object.__setattr__(self, "constraints", constraints)
        object.__setattr__(self, "operations", tuple(_as_list(self.operations, "operations")))
        object.__setattr__(self, "metadata", _frozen_json(dict(self.metadata), "metadata"))

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool_name(t) for t in self.tools)

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON record (see :mod:`envsched_jax.pool.jsonl`)."""
        if self.class_source is None:
            raise PoolError(f"environment {self.env_id!r} has only a trusted in-process class and "
                            "no source, so it cannot be written to disk", field="class_source")
        return {
            "kind": "environment",
            "env_id": self.env_id,
            "class_name": self.class_name,
            "summary": self.summary,
            "introduction": self.introduction,
            "state_space": [copy.deepcopy(dict(e)) for e in self.state_space],
            "constraints": list(self.constraints),
            "operations": [{"name": o.name, "description": o.description, "kind": o.kind}
                           for o in self.operations],
            "tools": [copy.deepcopy(dict(t)) for t in self.tools],
            "class_source": self.class_source,
            "metadata": copy.deepcopy(dict(self.metadata)),
        }


@dataclasses.dataclass(frozen=True)
class Task:
    """One task inside an environment.

    ``user_turns`` holds the scripted user messages of a multi-turn task (BFCL); for single-turn
    pools it is empty and ``instruction`` is the whole request.
    """

    task_id: str
    env_id: str
    instruction: str
    initial_state: Mapping[str, Any]
    checks: tuple[Check, ...]
    reference_actions: tuple[Action, ...] | None = None
    user_turns: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("task_id", "env_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise PoolError(f"{name} must be a non-empty string, got {value!r}", field=name)
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise PoolError("instruction must be a non-empty string", field="instruction")
        if not isinstance(self.initial_state, Mapping):
            raise PoolError("initial_state must be an object", field="initial_state")
        object.__setattr__(self, "initial_state",
                           _frozen_json(dict(self.initial_state), "initial_state"))
        checks = tuple(_as_list(self.checks, "checks"))
        if not all(isinstance(c, Check) for c in checks):
            raise PoolError("checks must be Check records", field="checks")
        object.__setattr__(self, "checks", checks)
        if self.reference_actions is not None:
            acts = tuple(_as_list(self.reference_actions, "reference_actions"))
            if not all(isinstance(a, Action) for a in acts):
                raise PoolError("reference_actions must be Action records",
                                field="reference_actions")
            object.__setattr__(self, "reference_actions", acts)
        turns = tuple(_as_list(self.user_turns, "user_turns"))
        if not all(isinstance(t, str) for t in turns):
            raise PoolError("user_turns must be strings", field="user_turns")
        object.__setattr__(self, "user_turns", turns)
        object.__setattr__(self, "metadata", _frozen_json(dict(self.metadata), "metadata"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "task",
            "task_id": self.task_id,
            "env_id": self.env_id,
            "instruction": self.instruction,
            "initial_state": copy.deepcopy(dict(self.initial_state)),
            "checks": [{"text": c.text, "code": c.code} for c in self.checks],
            "reference_actions": (None if self.reference_actions is None
                                  else [a.to_json() for a in self.reference_actions]),
            "metadata": copy.deepcopy(dict(self.metadata)),
        }
        if self.user_turns:
            out["user_turns"] = list(self.user_turns)
        return out


def tool_name(schema: Mapping[str, Any]) -> str:
    """Name of an OpenAI function schema (``{"type": "function", "function": {...}}`` or the
    bare ``{"name", "description", "parameters"}`` form)."""
    fn = schema.get("function", schema)
    return fn["name"]


def tool_function(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``function`` part of an OpenAI tool schema, whichever form it is given in."""
    return schema.get("function", schema)


def _validate_tool_schema(schema: Mapping[str, Any], field: str) -> None:
    fn = schema.get("function", schema)
    if not isinstance(fn, Mapping):
        raise PoolError("tool 'function' must be an object", field=field)
    if not isinstance(fn.get("name"), str) or not fn.get("name"):
        raise PoolError("tool schema needs a non-empty 'name'", field=f"{field}.name")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise PoolError("tool 'parameters' must be an object", field=f"{field}.parameters")
    props = params.get("properties", {})
    if not isinstance(props, Mapping):
        raise PoolError("tool 'parameters.properties' must be an object",
                        field=f"{field}.parameters.properties")


def _as_list(value: Any, field: str) -> Iterable[Any]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise PoolError(f"expected a list, got {type(value).__name__}", field=field)
    return value


@dataclasses.dataclass(frozen=True)
class Pool:
    """A validated task pool. Tasks keep their given order; node ``i`` of the graph and of the
    scheduler is ``tasks[i]``."""

    name: str
    environments: tuple[Environment, ...]
    tasks: tuple[Task, ...]
    # Problems found while loading that were dropped on request (``drop_invalid=True``); each
    # names its file, line and field. Not part of the content hash.
    dropped: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self):
        object.__setattr__(self, "environments", tuple(self.environments))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        # An empty pool cannot be scheduled or summarised; refuse it here, where every loader
        # and every hand-built pool passes.
        if not self.tasks or not self.environments:
            raise PoolError(f"pool {self.name!r} has {len(self.environments)} environment(s) and "
                            f"{len(self.tasks)} task(s); a pool needs at least one of each")
        problems = pool_problems(self.environments, self.tasks)
        if problems:
            raise PoolValidationErrors(problems)
        object.__setattr__(self, "_env_by_id", {e.env_id: e for e in self.environments})
        object.__setattr__(self, "_task_index", {t.task_id: k for k, t in enumerate(self.tasks)})

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_environments(self) -> int:
        return len(self.environments)

    def environment(self, env_id: str) -> Environment:
        try:
            return self._env_by_id[env_id]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"pool {self.name!r} has no environment {env_id!r}") from None

    def task_index(self, task_id: str) -> int:
        try:
            return self._task_index[task_id]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"pool {self.name!r} has no task {task_id!r}") from None

    def env_index(self) -> list[int]:
        """Environment index (into ``environments``) of every task, in task order."""
        pos = {e.env_id: k for k, e in enumerate(self.environments)}
        return [pos[t.env_id] for t in self.tasks]

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of every record; stable across runs and machines."""
        h = hashlib.sha256()
        for env in self.environments:
            h.update(_canonical(env.to_json() if env.class_source is not None
                                else {"env_id": env.env_id, "trusted": env.class_name}))
        for task in self.tasks:
            h.update(_canonical(task.to_json()))
        return h.hexdigest()


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# Where a record came from: ``{"source": file, "line": n}`` for a JSON-lines file, or
# ``{"source": file, "record": k}`` for a record of a whole-file JSON document.
Location = Mapping[str, Any]


def describe_location(where: Location) -> str:
    """``"FILE line N"`` / ``"FILE record K"`` for messages that point at a second place."""
    parts = [str(where.get("source", "?"))]
    if where.get("line") is not None:
        parts.append(f"line {where['line']}")
    if where.get("record") is not None:
        parts.append(f"record {where['record']}")
    return " ".join(parts)


def pool_problems(environments: Sequence[Environment], tasks: Sequence[Task], *,
                  env_locations: Sequence[Location] | None = None,
                  task_locations: Sequence[Location] | None = None) -> list[PoolError]:
    """Every cross-record problem of a pool (duplicate ids, dangling environment ids, empty
    checklists), each named with its location; nothing is dropped silently."""
    problems: list[PoolError] = []
    env_loc = env_locations or [{"source": "environments", "record": k + 1} for k in range(len(environments))]
    task_loc = task_locations or [{"source": "tasks", "record": k + 1} for k in range(len(tasks))]
    seen_env: dict[str, Location] = {}
    for env, where in zip(environments, env_loc):
        if env.env_id in seen_env:
            problems.append(PoolError(
                f"duplicate environment id {env.env_id!r} (first at {describe_location(seen_env[env.env_id])})",
                field="env_id", **where))
        else:
            seen_env[env.env_id] = where
    seen_task: dict[str, Location] = {}
    for task, where in zip(tasks, task_loc):
        if task.task_id in seen_task:
            problems.append(PoolError(
                f"duplicate task id {task.task_id!r} (first at {describe_location(seen_task[task.task_id])})",
                field="task_id", **where))
        else:
            seen_task[task.task_id] = where
        if task.env_id not in seen_env:
            problems.append(PoolError(
                f"task {task.task_id!r} names unknown environment {task.env_id!r}",
                field="env_id", **where))
        if not task.checks:
            problems.append(PoolError(f"task {task.task_id!r} has an empty checklist",
                                      field="checks", **where))
    return problems


def assemble_pool(name: str, environments: Sequence[Environment], tasks: Sequence[Task], *,
                  env_locations: Sequence[Location], task_locations: Sequence[Location],
                  problems: Sequence[PoolError] = (), drop_invalid: bool = False) -> Pool:
    """Build a :class:`Pool` from parsed records plus the problems found while parsing them.

    With ``drop_invalid=False`` (the default) any problem raises :class:`PoolValidationErrors`
    listing all of them. With ``drop_invalid=True`` the offending records are left out (the first
    record of a duplicated id is kept) and every problem is kept in ``Pool.dropped``: a real pool
    with a few broken tasks stays usable, and nothing disappears without a trace. Nothing left
    to load (no valid task) is an error either way.
    """
    all_problems = list(problems) + pool_problems(
        environments, tasks, env_locations=env_locations, task_locations=task_locations)
    if all_problems and not drop_invalid:
        raise PoolValidationErrors(all_problems)
    keep_envs, seen_env = [], set()
    for env in environments:
        if env.env_id not in seen_env:
            seen_env.add(env.env_id)
            keep_envs.append(env)
    keep_tasks, seen_task = [], set()
    for task in tasks:
        if task.task_id in seen_task or task.env_id not in seen_env or not task.checks:
            continue
        seen_task.add(task.task_id)
        keep_tasks.append(task)
    if not keep_tasks:
        empty = (f"pool {name!r}: no valid task is left after leaving out the records above"
                 if all_problems else f"pool {name!r} has no tasks")
        raise PoolValidationErrors(all_problems + [PoolError(empty)])
    used = {t.env_id for t in keep_tasks}
    keep_envs = [e for e in keep_envs if e.env_id in used]
    return Pool(name=name, environments=tuple(keep_envs), tasks=tuple(keep_tasks),
                dropped=tuple(str(p) for p in all_problems))
