"""Prompt pools: the rows of another trainer's dataset as schedulable tasks.

Trainers such as TRL, tunix, verl and prime-rl train on a dataset of prompts, not on executable
environments; their reward functions (or rubrics) live in the trainer. To schedule over such a
dataset, EnvSched needs its nodes and their static graph, so :func:`prompt_pool` turns records
``{"task_id", "prompt", "environment"?, "check"?, "context"?}`` into a :class:`~envsched_jax.pool.model.Pool`:

- a task per record (``task_id`` unique; ``prompt`` its instruction; ``check`` a text describing
  how it is graded, e.g. the rubric or the reference answer's kind, shown to the graph's check
  view; ``context`` any other text, e.g. a system prompt, for its context view);
- an environment per distinct ``environment`` value (a dataset's source, category or sub-task;
  the whole dataset is one environment when no record names one), with no tools and no code.
  With one environment, EnvSched's cold start (at most two tasks per environment in the first
  batch) refuses batches of more than two: give the records a category, or build the scheduler
  with ``infeasible="relax"``.

What the graph can use (*decision*): the instruction, check and context views carry the signal;
the environments give the within/cross split. Such tasks have no operations, so the abstract view
(and with it the cross-environment relation, appendix E) is the same for every task: the
cross-environment neighbours are then ordered by index alone, and EnvSched's graph prior rests on
the within-environment relation. A dataset whose records carry structure (tools, checks with
code) should be loaded as a proper pool instead.

The tasks' single check has empty code: it is never run; the trainer computes the reward.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envsched_jax.pool.model import Check, Environment, Pool, PoolError, Task

DEFAULT_ENVIRONMENT = "dataset"
_FIELDS = ("task_id", "prompt", "environment", "check", "context")


def prompt_pool(records: Iterable[Mapping[str, Any]], *, name: str = "prompts",
                default_environment: str = DEFAULT_ENVIRONMENT) -> Pool:
    """The pool of ``records`` (module docstring). A record that is not a mapping, lacks a
    non-empty string ``task_id`` or ``prompt``, has a non-string optional field or an unknown
    field, or repeats a task id is a :class:`PoolError` naming the record and field."""
    tasks, envs = [], {}
    seen: dict[str, int] = {}
    for k, record in enumerate(records, 1):
        if not isinstance(record, Mapping):
            raise PoolError(f"expected a mapping, got {type(record).__name__}", source=name, record=k)
        unknown = sorted(set(record) - set(_FIELDS))
        if unknown:
            raise PoolError(f"unknown field(s) {unknown}; a prompt record has {list(_FIELDS)}", source=name,
                            record=k, field=unknown[0])
        for field in ("task_id", "prompt"):
            value = record.get(field)
            if not isinstance(value, str) or not value.strip():
                raise PoolError(f"must be a non-empty string, got {value!r}", source=name, record=k, field=field)
        for field in ("environment", "check", "context"):
            if field in record and not isinstance(record[field], str):
                raise PoolError(f"must be a string, got {record[field]!r}", source=name, record=k, field=field)
        task_id = record["task_id"]
        if task_id in seen:
            raise PoolError(f"task id {task_id!r} repeats record {seen[task_id]}", source=name, record=k,
                            field="task_id")
        seen[task_id] = k
        env_id = record.get("environment") or default_environment
        envs.setdefault(env_id, Environment(
            env_id=env_id, class_name="PromptDataset", class_source="",
            summary=f"Prompts of {name!r} ({env_id}); graded by the trainer's reward functions.", tools=()))
        tasks.append(Task(
            task_id=task_id, env_id=env_id, instruction=record["prompt"],
            initial_state={"context": record.get("context", "")},
            checks=(Check(record.get("check", "") or "graded by the trainer's reward functions", ""),),
            metadata={"semantics": "prompt"}))
    if not tasks:
        raise PoolError("no records", source=name)
    return Pool(name=name, environments=tuple(envs.values()), tasks=tuple(tasks))
