"""Loader for EnvScaler's RL-split format (the EnvSched paper's 2,550-task training pool).

The real files live in the EnvScaler repository and on a dataset hub; neither is reachable from
CI, so download them yourself and point the loader at the local copies::

    from envsched_jax.pool.envscaler import load_envscaler_pool
    pool = load_envscaler_pool("env_metadata_rl.json", "rl_scenarios.json", drop_invalid=True)

or on the command line ``envsched pool inspect envscaler:ENV_FILE:TASK_FILE``.

Environment file: a JSON object keyed by ``env_id`` or a JSON list (``.jsonl``: one record a
line) of records with ``env_id``, ``env_class_name``, ``env_class_code`` (required) and
``environment_introduction``, ``constraints_rules``, ``tools``, ``environment_summary``,
``state_space_definition``, ``operation_list``, ``env_class_def``, ``env_func_details``.
Task file: a JSON list or JSON lines of records with ``env_id``, ``task_id``, ``init_config``,
``task``, ``checklist_with_func`` [{``check_func``, ``check_item``}] (required) and
``env_class_name``.

What is required is what EnvScaler's runner reads (``base_env.py`` and ``utils/env_util.py`` of
its RL environment), plus the ids: its runner never reads ``environment_summary`` or
``check_item``, so a record without them loads. A ``check_func`` may be any string: one that is
empty (EnvScaler's check generator, ``scen_generator/task_check_util/gen_check_func.py``, writes
"" when it gives up), does not compile or defines no ``check_func`` counts 0 when it runs, as in
EnvScaler. EnvScaler's repository stores ``init_config`` and ``tools`` as JSON objects, which is
what its runner reads; copies elsewhere may store them (and the list fields) as JSON strings,
which are decoded here, so both load alike. A task whose ``env_class_name`` differs from its
environment's is an error (EnvScaler's runner takes the task's name, the project the
environment's). The real data has a few tasks with empty checklists (EnvScaler's runner divides
by their length and fails); with the default ``drop_invalid=False`` they make loading fail with
every problem listed, with ``drop_invalid=True`` they are left out and listed in ``Pool.dropped``.

Every task is played with EnvScaler's rules (``metadata["semantics"] = "envscaler"``, see
:mod:`envsched_jax.envs.runtime.core`). Options: ``private_methods`` (:data:`PRIVATE_METHODS`) and
``mode`` (:data:`MODES`: ``conversational`` plays EnvScaler's conversational environment, where
a simulated user holds the task and its ``###STOP###`` ends and scores the episode).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from envsched_jax.envs.runtime.core import PRIVATE_METHODS
from envsched_jax.pool.jsontext import decode_utf8, iter_json_lines, no_records_error, parse_json, read_bytes
from envsched_jax.pool.model import (
    Check,
    Environment,
    Location,
    Operation,
    Pool,
    PoolError,
    Task,
    assemble_pool,
)

Mode = Literal["non_conversational", "conversational"]
PrivateMethods = Literal["allow", "refuse"]
MODES = ("non_conversational", "conversational")
"""EnvScaler's two RL environments: the agent ends the episode with ``chat_with_user``
(``rl_non_conv_env.py``), or a simulated user holding the task ends it (``rl_conv_env.py``)."""

# Fields that hub copies may store as JSON strings, with the type they decode to.
_MAYBE_JSON_ENV = {"tools": list, "state_space_definition": list, "constraints_rules": list,
                   "operation_list": list, "env_func_details": dict}
_MAYBE_JSON_TASK = {"init_config": dict, "checklist_with_func": list}


def _read_records(path: Path, problems: list[PoolError]) -> list[tuple[Location, Any]]:
    """(location, record) pairs from a JSON object/list file or a JSON-lines file.

    Records of a whole-file document are located by ``record`` (json reports no line for a
    value it parsed), JSON lines by ``line``. A line that does not parse goes to ``problems``;
    a document that does not parse, or holds no record, raises."""
    source = str(path)
    if not path.is_file():
        raise PoolError("no such file", source=source)
    data = read_bytes(path)
    if not data.strip():
        raise no_records_error(path, data)
    if path.suffix != ".jsonl":
        text = decode_utf8(data, source=source)
        try:
            document = parse_json(text, source=source)
        except PoolError:
            first = next((ln for ln in text.split("\n") if ln.strip()), "")
            if not _parses(first):  # not JSON lines either
                raise
        else:
            return _document_records(document, source)
    out = []
    for line_no, value in iter_json_lines(path):
        if isinstance(value, PoolError):
            problems.append(value)
        else:
            out.append(({"source": source, "line": line_no}, value))
    return out


def _document_records(document: Any, source: str) -> list[tuple[Location, Any]]:
    if isinstance(document, Mapping):  # keyed by id: record k is the k-th key
        records = [{**value, "env_id": value.get("env_id", key)} if isinstance(value, Mapping) else value
                   for key, value in document.items()]
        kind = "object"
    elif isinstance(document, list):
        records, kind = document, "list"
    else:
        raise PoolError(f"expected a JSON object or list of records, got {type(document).__name__}",
                        source=source, line=1)
    if not records:
        raise PoolError(f"no records: the file holds an empty JSON {kind}", source=source, line=1)
    return [({"source": source, "record": k + 1}, rec) for k, rec in enumerate(records)]


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except (ValueError, RecursionError):
        return False


def _decode(record: Mapping[str, Any], field: str, typ: type, where: Location) -> Any:
    value = record.get(field)
    if isinstance(value, str):
        # Hub copies store some fields as JSON text: parse it as strictly as a file.
        try:
            value = parse_json(value, source=where["source"], field=field)
        except PoolError as err:
            raise PoolError(f"string is not valid JSON: {err.reason}", field=field, **where) from None
    if value is None:
        return typ()
    if not isinstance(value, typ):
        raise PoolError(f"expected {typ.__name__}, got {type(value).__name__}", field=field, **where)
    return value


def _require_str(record: Mapping[str, Any], field: str, where: dict) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value.strip():
        raise PoolError("missing or not a non-empty string", field=field, **where)
    return value


def _optional_str(record: Mapping[str, Any], field: str, where: dict) -> str:
    value = record.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PoolError(f"expected a string, got {type(value).__name__}", field=field, **where)
    return value


def environment_from_envscaler(record: Any, where: Location) -> Environment:
    """One EnvScaler environment record; errors name ``where`` (file, line or record) and the
    field as EnvScaler spells it."""
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
            summary=_optional_str(record, "environment_summary", where),
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


def task_from_envscaler(record: Any, where: Location, *,
                        private_methods: PrivateMethods = "allow",
                        mode: Mode = "non_conversational") -> Task:
    """One EnvScaler task record; errors name ``where`` (file, line or record) and the field.
    ``private_methods`` and ``mode``: see :func:`load_envscaler_pool`."""
    if not isinstance(record, Mapping):
        raise PoolError("a task record must be a JSON object", **where)
    init_config = _decode(record, "init_config", dict, where)
    checklist = _decode(record, "checklist_with_func", list, where)
    checks = []
    for k, item in enumerate(checklist):
        fld = f"checklist_with_func[{k}]"
        if not isinstance(item, Mapping):
            raise PoolError("must be an object", field=fld, **where)
        text = item.get("check_item") or ""
        if not isinstance(text, str):
            raise PoolError("not a string", field=f"{fld}.check_item", **where)
        code = item.get("check_func")
        if not isinstance(code, str):
            raise PoolError("missing or not a string", field=f"{fld}.check_func", **where)
        checks.append(Check(text, code))
    metadata = {"format": "envscaler", "semantics": "envscaler",
                "private_methods": private_methods}
    if mode == "conversational":
        metadata.update(user_mode="simulated", user_brief=record.get("task"))
    if isinstance(record.get("env_class_name"), str):
        metadata["env_class_name"] = record["env_class_name"]
    fields = {"task_id": _require_str(record, "task_id", where),
              "env_id": _require_str(record, "env_id", where),
              "instruction": _require_str(record, "task", where)}
    try:
        return Task(**fields, initial_state=init_config, checks=tuple(checks), metadata=metadata)
    except PoolError as err:
        field = {"initial_state": "init_config", "instruction": "task"}.get(err.field, err.field)
        raise PoolError(err.reason, field=field, **where) from None


def load_envscaler_pool(env_path: str | os.PathLike, task_path: str | os.PathLike, *,
                        name: str = "envscaler", drop_invalid: bool = False,
                        private_methods: PrivateMethods = "allow",
                        mode: Mode = "non_conversational") -> Pool:
    """Load EnvScaler environment metadata and task scenarios into a validated :class:`Pool`.

    Every malformed record is reported with its file, line (JSON lines) or record number (a
    whole-file document) and field, all of them at once; duplicate ids, unknown environment ids,
    class names that differ between a task and its environment, and empty checklists too. A file
    that is not UTF-8 or not JSON, has duplicate keys, nests deeper than
    :data:`~envsched_jax.pool.model.MAX_DEPTH` or holds no record is an error naming the file and
    line. Inputs are never modified (records are decoded into fresh objects).

    Args:
      private_methods: ``allow`` (EnvScaler's rule: an action may name any attribute of the
        instance, ``_helper`` and ``__init__`` included) or ``refuse`` (such names are invalid
        actions). CHOICE: ``allow`` by default, so that rewards are EnvScaler's. Calling them
        cannot weaken a sandbox (they run inside it, and the reward is computed outside it), but a
        policy can earn reward by them that the task's tools would not give it (re-running
        ``__init__`` with a state of its choosing, or a private helper that skips the
        environment's rules); ``refuse`` closes that, at the price of rewards that differ from
        EnvScaler's for such episodes.
      mode: ``non_conversational`` (EnvScaler's RL recipe: the instruction is the first message
        and ``chat_with_user`` ends the episode) or ``conversational`` (a simulated user, given
        the task as its brief, talks to the agent; its ``###STOP###`` ends and scores the
        episode: see :mod:`envsched_jax.rollout.users`).
    """
    if private_methods not in PRIVATE_METHODS:
        raise PoolError(f"private_methods must be one of {PRIVATE_METHODS}, got {private_methods!r}",
                        field="private_methods")
    if mode not in MODES:
        raise PoolError(f"mode must be one of {MODES}, got {mode!r}", field="mode")
    env_path, task_path = Path(env_path), Path(task_path)
    problems: list[PoolError] = []
    envs, env_loc, tasks, task_loc = [], [], [], []
    for where, rec in _read_records(env_path, problems):
        try:
            envs.append(environment_from_envscaler(rec, where))
            env_loc.append(where)
        except PoolError as err:
            problems.append(err)
    class_names = {e.env_id: e.class_name for e in envs}
    for where, rec in _read_records(task_path, problems):
        try:
            task = task_from_envscaler(rec, where, private_methods=private_methods, mode=mode)
            _same_class_name(task, class_names, where)
        except PoolError as err:
            problems.append(err)
        else:
            tasks.append(task)
            task_loc.append(where)
    return assemble_pool(name, envs, tasks, env_locations=env_loc, task_locations=task_loc,
                         problems=problems, drop_invalid=drop_invalid)


def _same_class_name(task: Task, class_names: Mapping[str, str], where: Location) -> None:
    named = task.metadata.get("env_class_name")
    known = class_names.get(task.env_id)
    if named is not None and known is not None and named != known:
        raise PoolError(f"task {task.task_id!r} names class {named!r}, its environment "
                        f"{task.env_id!r} defines {known!r}", field="env_class_name", **where)
