"""Small helpers shared by the embedded environments' task builders.

- :func:`build_tools` derives OpenAI function schemas (and the operation list) from a class's
  method signatures plus a table of descriptions, so a schema can never drift from its method;
- the check builders return :class:`~envsched_jax.pool.model.Check` records whose code is a plain
  ``def check_func(final_state): ...`` (EnvScaler's convention; ``initial_state`` is a global);
- :class:`TaskSpec` is what a task builder returns before the pool assigns task ids.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.pool.model import Action, Check, Operation

_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
               "list": "array", "dict": "object"}


def build_tools(cls: type, docs: Mapping[str, tuple[str, str, Mapping[str, str]]]):
    """``docs[name] = (kind, description, {param: description})`` for every public method of
    ``cls``, in catalog order. Returns ``(tools, operations)``."""
    public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    if public != set(docs):
        raise ValueError(f"{cls.__name__}: documented tools {sorted(docs)} != methods {sorted(public)}")
    tools, operations = [], []
    for name, (kind, description, param_docs) in docs.items():
        params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
        if {p.name for p in params} != set(param_docs):
            raise ValueError(f"{cls.__name__}.{name}: parameter docs do not match the signature")
        properties, required = {}, []
        for p in params:
            ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            properties[p.name] = {"type": _JSON_TYPES.get(ann, "string"), "description": param_docs[p.name]}
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        tools.append({"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
        operations.append(Operation(name, description, kind))
    return tuple(tools), tuple(operations)


@dataclasses.dataclass
class TaskSpec:
    """One task before it gets an id. ``shape`` names the abstract task shape shared across
    environments; ``gate`` says whether the direct path's precondition (capacity, state or
    authorization) holds ("pass") or fails ("fail": the instruction's fallback is then the correct
    behaviour, and checks verify that the gated record was not changed or that the permitted
    actor acted). ``wrong`` holds
    plausible but incorrect action sequences (used by the tests; never part of the pool)."""

    instruction: str
    initial_state: dict[str, Any]
    checks: list[Check]
    actions: list[Action]
    shape: str
    gate: str = "pass"
    wrong: list[list[Action]] = dataclasses.field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {"shape": self.shape, "gate": self.gate}


def act(tool: str, /, **arguments: Any) -> Action:
    return Action(tool, arguments)


def reply(message: str) -> Action:
    return Action("chat_with_user", {"message": message})


def _path(root: str, keys: Sequence[Any]) -> str:
    return root + "".join(f"[{k!r}]" for k in keys)


def _check(text: str, body: str) -> Check:
    return Check(text, "def check_func(final_state):\n" + body)


def field_eq(text: str, keys: Sequence[Any], value: Any) -> Check:
    """``final_state[k0][k1]... == value``."""
    return _check(text, f"    return {_path('final_state', keys)} == {value!r}\n")


def unchanged(text: str, keys: Sequence[Any]) -> Check:
    """The value at ``keys`` equals its value in ``initial_state``."""
    return _check(text, f"    return {_path('final_state', keys)} == {_path('initial_state', keys)}\n")


def absent(text: str, table: str, key: str) -> Check:
    return _check(text, f"    return {key!r} not in final_state[{table!r}]\n")


def new_records(text: str, table: str, fields: Mapping[str, Any], count: int = 1) -> Check:
    """Exactly ``count`` records created in ``table`` (ids not in ``initial_state``) match ``fields``."""
    return _check(text, (
        f"    want = {dict(fields)!r}\n"
        f"    new = [r for k, r in final_state[{table!r}].items() if k not in initial_state[{table!r}]]\n"
        "    return sum(all(r.get(f) == v for f, v in want.items()) for r in new) == "
        f"{count}\n"))


def table_size(text: str, table: str, delta: int) -> Check:
    """``len(final_state[table]) == len(initial_state[table]) + delta``."""
    return _check(text, f"    return len(final_state[{table!r}]) == len(initial_state[{table!r}]) + {delta}\n")


def logged(text: str, op: str, actor: str, target: str) -> Check:
    """An ``audit_log`` entry records ``op`` by ``actor`` on ``target``."""
    want = {"op": op, "actor": actor, "target": target}
    return _check(text, f"    return {want!r} in final_state['audit_log']\n")


def where_eq(text: str, table: str, match: Mapping[str, Any], field: str, value: Any) -> Check:
    """Every record of ``table`` matching ``match`` (in the initial state) has ``field == value``
    in the final state, and there is at least one."""
    return _check(text, (
        f"    want = {dict(match)!r}\n"
        f"    keys = [k for k, r in initial_state[{table!r}].items() if all(r.get(f) == v for f, v in want.items())]\n"
        f"    return bool(keys) and all(final_state[{table!r}][k][{field!r}] == {value!r} for k in keys)\n"))


def others_unchanged(text: str, table: str, keys: Sequence[str]) -> Check:
    """Every record of ``table`` other than ``keys`` is exactly as in the initial state."""
    return _check(text, (
        f"    skip = {list(keys)!r}\n"
        f"    return all(final_state[{table!r}].get(k) == r for k, r in initial_state[{table!r}].items() if k not in skip)\n"))


def all_absent(text: str, table: str, keys: Sequence[str]) -> Check:
    return _check(text, f"    return all(k not in final_state[{table!r}] for k in {list(keys)!r})\n")


def all_field_eq(text: str, table: str, keys: Sequence[str], field: str, value: Any) -> Check:
    """Every record ``keys`` of ``table`` has ``field == value``."""
    return _check(text, f"    return all(final_state[{table!r}][k][{field!r}] == {value!r} for k in {list(keys)!r})\n")


# Bystander names: no task mentions them, so a bystander record never changes the correct actions.
BYSTANDER_NAMES = (
    "Abel Novik", "Bianca Serra", "Cyrus Lowe", "Dalia Frost", "Emil Varga", "Fatima Noor",
    "Gideon Pratt", "Hilde Berg", "Ismael Cruz", "Joanna Pike", "Kofi Mensah", "Larissa Vogt",
    "Mateo Ibarra", "Noemi Laine", "Oskar Dahl", "Pia Rinaldi", "Rafael Soto", "Selma Aksoy",
    "Teodor Marin", "Ulla Hagen", "Valentin Roy", "Wanda Kress", "Xavier Lund", "Yusuf Demir",
)


def add_bystanders(tasks: list[TaskSpec], table: str, prefix: str, make) -> list[TaskSpec]:
    """Give task ``k`` one extra, unrelated record ``make(name, k)`` in ``table`` under id
    ``<prefix><900+k>``, so that initial states differ across tasks without changing what the
    correct action sequence is."""
    for k, task in enumerate(tasks):
        name = BYSTANDER_NAMES[k % len(BYSTANDER_NAMES)]
        task.initial_state[table][f"{prefix}{900 + k}"] = make(name, k)
    return tasks
