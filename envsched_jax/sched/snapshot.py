"""Validation of a scheduler snapshot (``state_dict()``) before anything of it is used.

A snapshot is ``{"header": {...}, "arrays": {name: array}}``. The header records what the state
was made under: the scheduler's name, the next step, the pool (number of nodes, a hash of the task
ids), the graph (:func:`graph_fingerprint`) and the whole config (B, K and every other field).
:func:`validated_state` checks all of it against the scheduler it is to be loaded into, and every
array against the scheduler's current arrays (same names, shapes and dtype kinds; integers in the
range of the current dtype; floats finite, since no scheduler state uses NaN or infinity), and
returns the arrays cast to the current dtypes. Only then does the scheduler swap them in, so a bad
snapshot raises :class:`CheckpointError` and leaves the scheduler exactly as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.errors import CheckpointError


HEADER_FIELDS: dict[str, type] = {"name": str, "next_step": int, "num_nodes": int,
                                  "task_ids_hash": str, "graph_hash": str, "config": dict}

# Rows of each dense similarity matrix that enter the graph fingerprint: hashing all N^2 entries
# would take seconds at N = 20,000, and any rebuilt or different graph changes sampled rows too.
_FINGERPRINT_ROWS = 257


def task_ids_hash(task_ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(task_ids).encode()).hexdigest()[:16]


def graph_fingerprint(graph: PoolGraph) -> str:
    """A short hash of what a scheduler reads from ``graph``: ids, environments, the pool hash
    and graph config, the candidate lists and evenly spaced rows of S_full and S_abs (as float64,
    so a float32 copy of the same graph has the same fingerprint)."""
    h = hashlib.sha256()
    h.update(json.dumps([list(graph.task_ids), list(graph.env_ids), graph.pool_hash,
                         dataclasses.asdict(graph.config)], sort_keys=True, default=str).encode())
    arrays = [np.asarray(graph.env_index, np.int64), graph.within_idx, graph.within_sim,
              graph.cross_idx, graph.cross_sim]
    rows = np.unique(np.linspace(0, graph.num_nodes - 1, _FINGERPRINT_ROWS).astype(np.int64))
    for dense in (graph.s_full, graph.s_abs):
        arrays.append(None if dense is None else np.asarray(dense[rows]))
    for array in arrays:
        if array is None:
            h.update(b"none")
            continue
        exact = np.asarray(array, np.int64 if np.asarray(array).dtype.kind in "iub" else np.float64)
        h.update(repr(exact.shape).encode())
        h.update(np.ascontiguousarray(exact).tobytes())
    return h.hexdigest()[:16]


def config_record(config: Any) -> dict[str, Any]:
    """A config dataclass as the JSON-able dict the header stores."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def validated_state(state: Any, *, expected_header: Mapping[str, Any],
                    current_arrays: Mapping[str, np.ndarray], source: str) -> tuple[dict, dict]:
    """(header, arrays cast to the current dtypes) after checking everything; raises
    :class:`CheckpointError` naming ``source``, the field or array and the value otherwise."""
    if not isinstance(state, Mapping) or set(state) != {"header", "arrays"}:
        keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise CheckpointError(f"{source}: a scheduler state is a dict with exactly 'header' and "
                              f"'arrays', got {keys}")
    header = _checked_header(state["header"], expected_header, source)
    arrays = _checked_arrays(state["arrays"], current_arrays, source)
    return header, arrays


def _checked_header(header: Any, expected: Mapping[str, Any], source: str) -> dict:
    if not isinstance(header, Mapping):
        raise CheckpointError(f"{source}: the header must be a JSON object, got {type(header).__name__}")
    missing = sorted(set(HEADER_FIELDS) - set(header))
    unknown = sorted(set(header) - set(HEADER_FIELDS))
    if missing or unknown:
        raise CheckpointError(f"{source}: header fields differ from {sorted(HEADER_FIELDS)}: "
                              f"missing {missing}, unknown {unknown}")
    for field, typ in HEADER_FIELDS.items():
        value = header[field]
        # bool is an int to Python, never a step count
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise CheckpointError(f"{source}: header field {field!r} must be {_type_name(typ)}, "
                                  f"got {value!r}")
    if header["next_step"] < 0:
        raise CheckpointError(f"{source}: header field 'next_step' must be >= 0, got {header['next_step']}")
    if header["name"] != expected["name"]:
        raise CheckpointError(f"{source}: the state is for scheduler {header['name']!r}, "
                              f"not {expected['name']!r}")
    if header["num_nodes"] != expected["num_nodes"] or header["task_ids_hash"] != expected["task_ids_hash"]:
        raise CheckpointError(
            f"{source}: the state was saved for a different pool: {header['num_nodes']} tasks with ids "
            f"hash {header['task_ids_hash']}, this scheduler has {expected['num_nodes']} tasks with ids "
            f"hash {expected['task_ids_hash']}")
    if header["graph_hash"] != expected["graph_hash"]:
        raise CheckpointError(f"{source}: the state was saved for a different graph (fingerprint "
                              f"{header['graph_hash']}, this scheduler's graph has {expected['graph_hash']})")
    diff = config_differences(header["config"], expected["config"])
    if diff:
        raise CheckpointError(f"{source}: the state was saved under a different config: {'; '.join(diff)}")
    return dict(header)


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"field: X in the checkpoint, Y here"`` for every field that differs."""
    out = []
    for name in sorted(set(saved) | set(current)):
        if name not in saved:
            out.append(f"{name}: missing in the checkpoint, {current[name]!r} here")
        elif name not in current:
            out.append(f"{name}: {saved[name]!r} in the checkpoint, no such field here")
        elif saved[name] != current[name]:
            out.append(f"{name}: {saved[name]!r} in the checkpoint, {current[name]!r} here")
    return out


def _checked_arrays(arrays: Any, current: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"{source}: 'arrays' must be a dict of arrays, got {type(arrays).__name__}")
    if set(arrays) != set(current):
        raise CheckpointError(f"{source}: state arrays differ: missing {sorted(set(current) - set(arrays))}, "
                              f"unknown {sorted(set(arrays) - set(current))}")
    out = {}
    for name in sorted(current):
        out[name] = _checked_array(name, arrays[name], np.asarray(current[name]), source)
    return out


_KINDS = {"b": "bool", "i": "integer", "u": "unsigned integer", "f": "float"}


def _checked_array(name: str, value: Any, template: np.ndarray, source: str) -> np.ndarray:
    where = f"{source}: state array {name!r}"
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where} is not an array ({err})") from None
    if array.shape != template.shape:
        raise CheckpointError(f"{where} has shape {list(array.shape)}, expected {list(template.shape)}")
    if array.dtype.kind != template.dtype.kind:
        raise CheckpointError(f"{where} has dtype {array.dtype} ({_KINDS.get(array.dtype.kind, 'other')}), "
                              f"expected {template.dtype} ({_KINDS[template.dtype.kind]})")
    if array.dtype.kind in "iu" and array.size:
        info = np.iinfo(template.dtype)
        lo, hi = int(array.min()), int(array.max())
        if lo < info.min or hi > info.max:
            raise CheckpointError(f"{where} holds {lo if lo < info.min else hi}, outside {template.dtype}")
    if array.dtype.kind == "f":
        with np.errstate(over="ignore"):
            cast = array.astype(template.dtype)
        bad = ~np.isfinite(cast)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise CheckpointError(f"{where} holds {array[index]} at index {list(index)}; every value "
                                  f"must be finite (as {template.dtype})")
        return cast
    return array.astype(template.dtype)


def _type_name(typ: type) -> str:
    return {str: "a string", int: "an integer", dict: "a JSON object"}[typ]
