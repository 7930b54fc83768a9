"""The canonical on-disk form of a task pool: one JSON-lines file.

Every line is one JSON object with a ``kind``:

``{"kind": "environment", "env_id", "class_name", "summary", "tools", "class_source",
"state_space"?, "constraints"?, "operations"?, "introduction"?, "metadata"?}``

``{"kind": "task", "task_id", "env_id", "instruction", "initial_state", "checks":
[{"text", "code"}], "reference_actions"?: [{"name", "arguments", "turn"?}] | null,
"user_turns"?, "metadata"?}``

Reading validates every field against this schema. Unknown fields are errors (a misspelt
optional field would otherwise vanish silently). Lines are parsed strictly
(:mod:`envsched_jax.pool.jsontext`: UTF-8, no duplicate keys, bounded nesting and integer length).
All problems of a file are collected and raised together as :class:`PoolValidationErrors`, each
naming the file, the line and the field. A file without any record, or without an environment
or a task record, is an error too: a pool is never empty.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envsched_jax.pool.model import (
    Action,
    Check,
    Environment,
    Operation,
    Pool,
    PoolError,
    Task,
    assemble_pool,
)
from envsched_jax.pool.jsontext import iter_json_lines

_ENV_REQUIRED = {"kind": str, "env_id": str, "class_name": str, "summary": str, "tools": list,
                 "class_source": str}
_ENV_OPTIONAL = {"state_space": list, "constraints": list, "operations": list,
                 "introduction": str, "metadata": dict}
_TASK_REQUIRED = {"kind": str, "task_id": str, "env_id": str, "instruction": str,
                  "initial_state": dict, "checks": list}
_TASK_OPTIONAL = {"reference_actions": (list, type(None)), "user_turns": list, "metadata": dict}


def _check_fields(obj: Mapping[str, Any], required: dict, optional: dict, where: dict) -> None:
    for name, typ in required.items():
        if name not in obj:
            raise PoolError("missing required field", field=name, **where)
        if not isinstance(obj[name], typ):
            raise PoolError(f"expected {_type_name(typ)}, got {type(obj[name]).__name__}",
                            field=name, **where)
    for name, typ in optional.items():
        if name in obj and not isinstance(obj[name], typ):
            raise PoolError(f"expected {_type_name(typ)}, got {type(obj[name]).__name__}",
                            field=name, **where)
    unknown = sorted(set(obj) - set(required) - set(optional))
    if unknown:
        raise PoolError(f"unknown field(s) {unknown}", field=unknown[0], **where)


def _type_name(typ: Any) -> str:
    if isinstance(typ, tuple):
        return " or ".join(_type_name(t) for t in typ)
    return {str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(typ, typ.__name__)


def _rewrap(err: PoolError, where: dict, prefix: str = "") -> PoolError:
    field = err.field if not prefix else f"{prefix}.{err.field}" if err.field else prefix
    return PoolError(err.reason, field=field, **where)


def environment_from_json(obj: Mapping[str, Any], *, source: str = "<record>", line: int = 1) -> Environment:
    """Parse one canonical environment record; errors name ``source``, ``line`` and the field."""
    where = {"source": source, "line": line}
    _check_fields(obj, _ENV_REQUIRED, _ENV_OPTIONAL, where)
    operations = []
    for k, op in enumerate(obj.get("operations", [])):
        fld = f"operations[{k}]"
        if not isinstance(op, Mapping) or not isinstance(op.get("name"), str):
            raise PoolError("operation needs a string 'name'", field=fld, **where)
        try:
            operations.append(Operation(op["name"], op.get("description", ""), op.get("kind", "query")))
        except PoolError as err:
            raise _rewrap(err, where, fld) from None
    for k, entity in enumerate(obj.get("state_space", [])):
        if not isinstance(entity, Mapping):
            raise PoolError("state-space entry must be an object", field=f"state_space[{k}]", **where)
    try:
        return Environment(
            env_id=obj["env_id"], class_name=obj["class_name"], summary=obj["summary"],
            tools=tuple(obj["tools"]), state_space=tuple(obj.get("state_space", ())),
            constraints=tuple(obj.get("constraints", ())), operations=tuple(operations),
            class_source=obj["class_source"], introduction=obj.get("introduction", ""),
            metadata=obj.get("metadata", {}))
    except PoolError as err:
        raise _rewrap(err, where) from None
    except (TypeError, AttributeError) as err:
        raise PoolError(f"malformed value ({err})", field="tools", **where) from None


def task_from_json(obj: Mapping[str, Any], *, source: str = "<record>", line: int = 1) -> Task:
    """Parse one canonical task record; errors name ``source``, ``line`` and the field."""
    where = {"source": source, "line": line}
    _check_fields(obj, _TASK_REQUIRED, _TASK_OPTIONAL, where)
    checks = []
    for k, chk in enumerate(obj["checks"]):
        fld = f"checks[{k}]"
        if not isinstance(chk, Mapping):
            raise PoolError("check must be an object", field=fld, **where)
        extra = sorted(set(chk) - {"text", "code"})
        if extra:
            raise PoolError(f"unknown field(s) {extra}", field=f"{fld}.{extra[0]}", **where)
        for name in ("text", "code"):
            if not isinstance(chk.get(name), str):
                raise PoolError("missing or non-string", field=f"{fld}.{name}", **where)
        try:
            checks.append(Check(chk["text"], chk["code"]))
        except PoolError as err:
            raise _rewrap(err, where, fld) from None
    actions = None
    if obj.get("reference_actions") is not None:
        actions = []
        for k, act in enumerate(obj["reference_actions"]):
            fld = f"reference_actions[{k}]"
            if not isinstance(act, Mapping):
                raise PoolError("action must be an object", field=fld, **where)
            extra = sorted(set(act) - {"name", "arguments", "turn"})
            if extra:
                raise PoolError(f"unknown field(s) {extra}", field=f"{fld}.{extra[0]}", **where)
            try:
                actions.append(Action(act.get("name"), act.get("arguments", {}), act.get("turn", 0)))
            except PoolError as err:
                raise _rewrap(err, where, fld) from None
    try:
        return Task(task_id=obj["task_id"], env_id=obj["env_id"], instruction=obj["instruction"],
                    initial_state=obj["initial_state"], checks=tuple(checks),
                    reference_actions=None if actions is None else tuple(actions),
                    user_turns=tuple(obj.get("user_turns", ())), metadata=obj.get("metadata", {}))
    except PoolError as err:
        raise _rewrap(err, where) from None


def read_json_objects(path: Path, problems: list[PoolError]) -> list[tuple[int, dict[str, Any]]]:
    """Every JSON object of a JSON-lines file with its 1-based line number; an invalid line (bad
    JSON or UTF-8, a duplicate key, deep nesting, an over-long integer) or a non-object goes to
    ``problems`` (naming file and line) and is skipped. A file without any record raises."""
    records = []
    for line_no, value in iter_json_lines(path):
        if isinstance(value, PoolError):
            problems.append(value)
        elif not isinstance(value, dict):
            problems.append(PoolError("a record must be a JSON object", source=str(path), line=line_no))
        else:
            records.append((line_no, value))
    return records


def read_pool(path: str | os.PathLike, *, name: str | None = None, drop_invalid: bool = False) -> Pool:
    """Read and validate a canonical JSON-lines pool file.

    Raises :class:`PoolValidationErrors` listing every malformed record and every cross-record
    problem (duplicate ids, unknown environment ids, empty checklists, no environment or no task
    record at all). With ``drop_invalid=True`` those records are left out and listed in
    ``Pool.dropped`` instead; a pool with no valid task left is still an error.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise PoolError("no such pool file", source=source)
    envs, env_loc, tasks, task_loc = [], [], [], []
    problems: list[PoolError] = []
    kinds: set[str] = set()
    records = read_json_objects(path, problems)
    unreadable = len(problems)   # lines that did not parse may be the missing kind: no guess then
    for line_no, obj in records:
        kind = obj.get("kind")
        kinds.add(kind if isinstance(kind, str) else "")
        where = {"source": source, "line": line_no}
        try:
            if kind == "environment":
                envs.append(environment_from_json(obj, **where))
                env_loc.append(where)
            elif kind == "task":
                tasks.append(task_from_json(obj, **where))
                task_loc.append(where)
            else:
                problems.append(PoolError(f"'kind' must be 'environment' or 'task', got {kind!r}",
                                          field="kind", **where))
        except PoolError as err:
            problems.append(err)
    for kind in ("environment", "task"):
        if kind not in kinds and not unreadable:
            problems.append(PoolError(f"no {kind} record (no line has \"kind\": \"{kind}\")",
                                      source=source))
    return assemble_pool(name or path.stem, envs, tasks, env_locations=env_loc,
                         task_locations=task_loc, problems=problems, drop_invalid=drop_invalid)


def write_pool(pool: Pool, path: str | os.PathLike) -> Path:
    """Write ``pool`` in canonical form (environments first, then tasks), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for env in pool.environments:
            fh.write(json.dumps(env.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
        for task in pool.tasks:
            fh.write(json.dumps(task.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path
