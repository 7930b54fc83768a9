"""Loader for EnvScaler's RL-split format (the EnvSched paper's 2,550-task training pool).

The real files live in the EnvScaler repository and on a dataset hub; neither is reachable from
CI, so download them yourself and point the loader at the local copies::

    from envsched_jax.pool.envscaler import load_envscaler_pool
    pool = load_envscaler_pool("env_metadata_rl.json", "rl_scenarios.json", drop_invalid=True)

or on the command line ``envsched pool inspect envscaler:ENV_FILE:TASK_FILE``.

Environment file: a JSON object keyed by ``env_id`` or a JSON list (``.jsonl``: one record a
line) of records with ``env_id``, ``environment_summary``, ``environment_introduction``,
``state_space_definition``, ``constraints_rules``, ``operation_list``, ``env_class_name``,
``env_class_code``, ``env_class_def``, ``env_func_details``, ``tools``.
Task file: a JSON list or JSON lines of records with ``env_id``, ``env_class_name``, ``task_id``,
``init_config``, ``task``, ``checklist_with_func`` [{``check_item``, ``check_func``}].

On the hub copies some fields (``tools``, ``init_config``, and occasionally the list fields) are
JSON strings: they are decoded here. The real data has a few tasks with empty checklists; with the
default ``drop_invalid=False`` they make loading fail with every problem listed, with
``drop_invalid=True`` they are left out and listed in ``Pool.dropped``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envsched_jax.pool.model import (
    Check,
    Environment,
    Operation,
    Pool,
    PoolError,
    Task,
    assemble_pool,
)

# Fields that hub copies may store as JSON strings, with the type they decode to.
_MAYBE_JSON_ENV = {"tools": list, "state_space_definition": list, "constraints_rules": list,
                   "operation_list": list, "env_func_details": dict}
_MAYBE_JSON_TASK = {"init_config": dict, "checklist_with_func": list}


def _read_records(path: Path) -> list[tuple[int, Any]]:
    """(line or record number, record) pairs from a JSON object/list file or a JSON-lines file."""
    source = str(path)
    if not path.is_file():
        raise PoolError("no such file", source=source)
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            first = next((ln for ln in text.splitlines() if ln.strip()), "")
            if not _parses(first):  # not JSON lines either
                raise PoolError(f"invalid JSON ({err.msg})", source=source, line=err.lineno) from None
        else:
            if isinstance(data, Mapping):  # keyed by id: record k is the k-th key
                return [(k + 1, {**value, "env_id": value.get("env_id", key)}
                         if isinstance(value, Mapping) else value)
                        for k, (key, value) in enumerate(data.items())]
            if isinstance(data, list):
                return [(k + 1, rec) for k, rec in enumerate(data)]
            raise PoolError("expected a JSON object or list of records", source=source)
    out = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            try:
                out.append((line_no, json.loads(raw)))
            except json.JSONDecodeError as err:
                raise PoolError(f"invalid JSON ({err.msg})", source=source, line=line_no) from None
    return out


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _decode(record: Mapping[str, Any], field: str, typ: type, where: dict) -> Any:
    value = record.get(field)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise PoolError(f"string is not valid JSON ({err.msg})", field=field, **where) from None
    if value is None:
        return typ()
    if not isinstance(value, typ):
        raise PoolError(f"expected {typ.__name__}, got {type(value).__name__}", field=field, **where)
    return value


def _require_str(record: Mapping[str, Any], field: str, where: dict, *, allow_empty: bool = False) -> str:
    value = record.get(field)
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise PoolError("missing or not a non-empty string", field=field, **where)
    return value


def environment_from_envscaler(record: Any, *, source: str, line: int) -> Environment:
    where = {"source": source, "line": line}
    if not isinstance(record, Mapping):
        raise PoolError("an environment record must be a JSON object", **where)
    decoded = {f: _decode(record, f, t, where) for f, t in _MAYBE_JSON_ENV.items()}
    operations = []
    for k, op in enumerate(decoded["operation_list"]):
        fld = f"operation_list[{k}]"
        if not isinstance(op, Mapping) or not isinstance(op.get("operation_name"), str):
            raise PoolError("needs a string 'operation_name'", field=fld, **where)
        kind = op.get("operation_type", "query")
        if kind not in ("query", "state_change"):
            raise PoolError(f"operation_type must be 'query' or 'state_change', got {kind!r}",
                            field=f"{fld}.operation_type", **where)
        operations.append(Operation(op["operation_name"], op.get("operation_description", ""), kind))
    for k, entity in enumerate(decoded["state_space_definition"]):
        if not isinstance(entity, Mapping):
            raise PoolError("must be an object", field=f"state_space_definition[{k}]", **where)
    if not all(isinstance(c, str) for c in decoded["constraints_rules"]):
        raise PoolError("must be a list of strings", field="constraints_rules", **where)
    metadata = {"format": "envscaler"}
    if decoded["env_func_details"]:
        metadata["func_details"] = decoded["env_func_details"]
    if isinstance(record.get("env_class_def"), str):
        metadata["class_def"] = record["env_class_def"]
    try:
        return Environment(
            env_id=_require_str(record, "env_id", where),
            class_name=_require_str(record, "env_class_name", where),
            summary=_require_str(record, "environment_summary", where, allow_empty=True),
            introduction=record.get("environment_introduction") or "",
            tools=tuple(decoded["tools"]),
            state_space=tuple(decoded["state_space_definition"]),
            constraints=tuple(decoded["constraints_rules"]),
            operations=tuple(operations),
            class_source=_require_str(record, "env_class_code", where),
            metadata=metadata,
        )
    except PoolError as err:
        if err.source is not None:
            raise
        raise PoolError(err.reason, field=err.field and _env_field(err.field), **where) from None


# Our field names -> EnvScaler's, so that errors name the field as it is spelt in the file.
_ENVSCALER_FIELD = {"class_source": "env_class_code", "summary": "environment_summary",
                    "class_name": "env_class_name", "state_space": "state_space_definition",
                    "constraints": "constraints_rules"}


def _env_field(field: str) -> str:
    head, rest = re.match(r"([A-Za-z_]*)(.*)", field).groups()
    return _ENVSCALER_FIELD.get(head, head) + rest


def task_from_envscaler(record: Any, *, source: str, line: int) -> Task:
    where = {"source": source, "line": line}
    if not isinstance(record, Mapping):
        raise PoolError("a task record must be a JSON object", **where)
    init_config = _decode(record, "init_config", dict, where)
    checklist = _decode(record, "checklist_with_func", list, where)
    checks = []
    for k, item in enumerate(checklist):
        fld = f"checklist_with_func[{k}]"
        if not isinstance(item, Mapping):
            raise PoolError("must be an object", field=fld, **where)
        text = item.get("check_item")
        code = item.get("check_func")
        if not isinstance(text, str):
            raise PoolError("missing or not a string", field=f"{fld}.check_item", **where)
        if not isinstance(code, str) or "def check_func" not in code:
            raise PoolError("missing, or does not define check_func", field=f"{fld}.check_func", **where)
        checks.append(Check(text, code))
    metadata = {"format": "envscaler"}
    if isinstance(record.get("env_class_name"), str):
        metadata["env_class_name"] = record["env_class_name"]
    return Task(
        task_id=_require_str(record, "task_id", where),
        env_id=_require_str(record, "env_id", where),
        instruction=_require_str(record, "task", where),
        initial_state=init_config,
        checks=tuple(checks),
        metadata=metadata,
    )


def load_envscaler_pool(env_path: str | os.PathLike, task_path: str | os.PathLike, *,
                        name: str = "envscaler", drop_invalid: bool = False) -> Pool:
    """Load EnvScaler environment metadata and task scenarios into a validated :class:`Pool`.

    Every malformed record is reported with its file, record number and field (all of them at
    once); duplicate ids, unknown environment ids and empty checklists too. Inputs are never
    modified (records are decoded into fresh objects).
    """
    env_path, task_path = Path(env_path), Path(task_path)
    problems: list[PoolError] = []
    envs, env_loc, tasks, task_loc = [], [], [], []
    for line, rec in _read_records(env_path):
        try:
            envs.append(environment_from_envscaler(rec, source=str(env_path), line=line))
            env_loc.append((str(env_path), line))
        except PoolError as err:
            problems.append(err)
    for line, rec in _read_records(task_path):
        try:
            tasks.append(task_from_envscaler(rec, source=str(task_path), line=line))
            task_loc.append((str(task_path), line))
        except PoolError as err:
            problems.append(err)
    return assemble_pool(name, envs, tasks, env_locations=env_loc, task_locations=task_loc,
                         problems=problems, drop_invalid=drop_invalid)
