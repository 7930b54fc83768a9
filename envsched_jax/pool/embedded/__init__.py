"""The embedded default task pool: project-authored tool environments in EnvScaler's style.

Every environment is one class in :mod:`envsched_jax.pool.embedded.envs` (standard library only,
so its module source doubles as ``class_source``) with metadata and deterministic task builders
in :mod:`envsched_jax.pool.embedded.tasks`. Tasks across environments share abstract shapes
(``task.metadata["shape"]``): ``lookup_update``, ``reassign_gated``, ``create_gated``,
``authorized_delete``, ``multi_step`` and ``filter_bulk_update``; ``metadata["gate"]`` is
``"fail"`` when the main precondition does not hold and the correct behaviour leaves the gated
record unchanged.
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
from pathlib import Path

from envsched_jax.pool.model import Action, Environment, Pool, Task

EMBEDDED_ENV_IDS: tuple[str, ...] = (
    "clinic_beds",
    "library_lending",
    "warehouse_inventory",
    "room_booking",
    "it_access",
    "insurance_policy",
    "fleet_rental",
    "course_enrollment",
)

__all__ = ["EMBEDDED_ENV_IDS", "load_embedded_pool", "write_embedded_jsonl", "wrong_action_sequences"]


def _spec_module(env_id: str):
    return importlib.import_module(f"envsched_jax.pool.embedded.tasks.{env_id}")


def _environment(env_id: str) -> Environment:
    from envsched_jax.pool.embedded._spec import build_tools

    spec = _spec_module(env_id)
    tools, operations = build_tools(spec.CLASS, spec.TOOL_DOCS)
    source = importlib.resources.files("envsched_jax.pool.embedded.envs").joinpath(f"{env_id}.py").read_text(
        encoding="utf-8")
    return Environment(
        env_id=env_id, class_name=spec.CLASS.__name__, summary=spec.SUMMARY, tools=tools,
        state_space=spec.STATE_SPACE, constraints=spec.CONSTRAINTS, operations=operations,
        class_source=source, trusted_class=spec.CLASS, introduction=spec.SUMMARY.split(". ")[0] + ".",
        metadata={"origin": "embedded"})


def _tasks(env_id: str) -> list[Task]:
    return [Task(task_id=f"{env_id}-task_{k}", env_id=env_id, instruction=t.instruction,
                 initial_state=t.initial_state, checks=tuple(t.checks),
                 reference_actions=tuple(t.actions), metadata=t.metadata())
            for k, t in enumerate(_spec_module(env_id).build_tasks())]


def load_embedded_pool() -> Pool:
    """The embedded pool: environments in :data:`EMBEDDED_ENV_IDS` order, each environment's
    tasks in builder order with ids ``<env_id>-task_<k>``. Deterministic."""
    envs = tuple(_environment(e) for e in EMBEDDED_ENV_IDS)
    tasks = tuple(t for e in EMBEDDED_ENV_IDS for t in _tasks(e))
    return Pool(name="embedded", environments=envs, tasks=tasks)


def write_embedded_jsonl(path: str | os.PathLike) -> Path:
    """Write the embedded pool in canonical JSON-lines form (see :mod:`envsched_jax.pool.jsonl`)."""
    from envsched_jax.pool.jsonl import write_pool

    return write_pool(load_embedded_pool(), path)


def wrong_action_sequences() -> dict[str, list[tuple[Action, ...]]]:
    """Plausible but incorrect action sequences per task id (for tests and sanity checks; not part
    of the pool). Each must score below 1.0."""
    out: dict[str, list[tuple[Action, ...]]] = {}
    for env_id in EMBEDDED_ENV_IDS:
        for k, t in enumerate(_spec_module(env_id).build_tasks()):
            if t.wrong:
                out[f"{env_id}-task_{k}"] = [tuple(w) for w in t.wrong]
    return out
