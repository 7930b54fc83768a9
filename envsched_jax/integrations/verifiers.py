"""prime-rl / verifiers: EnvSched as the task sampler of a verifiers environment.

verifiers 0.4 (the ``verifiers.v1`` API, which prime-rl consumes) has no ``SingleTurnEnv``,
``ToolEnv``, ``EnvGroup``, ``Rubric`` class or HF-dataset columns any more; what they were is
spread over these pieces, and this adapter reads each of them:

============================  ====================================================================
verifiers 0.1 idea            verifiers 0.4 piece read here
============================  ====================================================================
dataset rows                  a :class:`verifiers.v1.Taskset`: ``load()`` yields ``Task`` objects
                              whose ``TaskData`` holds ``idx`` (set by iterating the taskset),
                              ``id``, ``prompt`` (text or messages), ``system_prompt`` and the
                              taskset's own fields (``answer``, a category, ...)
Rubric (funcs, weights)       the task's ``@vf.reward(weight=...)`` methods merged with the
                              config-plugged rewards (``Task.hooks("reward")``) and judges
                              (``TaskConfig.judges``); ``Task.score(trace)`` records each as a
                              weighted ``Reward`` on the trace, and ``Trace.reward`` is their sum
SingleTurnEnv / MultiTurnEnv  a :class:`verifiers.v1.Env` (``SingleAgentEnv`` for a plain
                              taskset) over the taskset; the harness (``null``: a chat loop)
                              decides the turns, not the data
ToolEnv's tools               the ``vf.Toolset`` servers of ``Task.toolsets`` / ``Taskset.toolsets``
EnvGroup                      several envs in one run (prime-rl's orchestrator env keys):
                              here a mapping ``{name: env or taskset}``
a rollout and its reward      an ``Episode`` (or ``WireEpisode`` from the env server) of traces,
                              each scored by its task
============================  ====================================================================

**The loader** (:func:`load_verifiers_pool`) turns each task of each source into one prompt
record for :func:`envsched_jax.pool.prompts.prompt_pool`: the task id is ``TaskData.id`` when the
taskset gives one, else its position ``idx`` (prefixed ``"<source>/"`` when several sources
share the pool); the instruction is the prompt (a messages prompt: its last user message); the
environment is the source's name (``Env.config.env_id``, the taskset id, or the group key), or
``"<source>:<value>"`` of a ``TaskData`` field named by ``environment_field`` (the old ``task``
column); the check text is the rubric (each reward and judge with its weight and docstring) and
the *kind* of the reference answer (never its value: the kind is what tasks share); the context
is the system prompt and any few-shot messages before the last user message.

*Decision* (tools): a source whose tasks or taskset declare toolsets gets the tools the model is
shown (each ``@vf.tool``, registered on an in-process MCP server exactly as verifiers serves it
and named ``<server>_<tool>`` as the harnesses advertise it) as its environment's tool catalog.
The graph's operation extractor then finds the tools an instruction names, which gives
tool-using tasks a real abstract view and cross-environment relation (tool-less prompt tasks
all share one abstract view: see :mod:`envsched_jax.pool.prompts`). The tools are never run
here; verifiers runs them in its rollouts.

**The sampler** (:class:`VerifiersSampler`) is a :class:`~envsched_jax.integrations.core.SchedulerFeed`
that speaks verifiers: ``next_batch(step)`` returns the step's B tasks as
:class:`ScheduledTask` (the verifiers ``Task`` to roll out K times with ``Env.run_episode`` or
``Agent.run``, and its ``task_data``, the dumped ``TaskData`` the env server's ``run`` request
takes); :func:`select_configs` names them as one verifiers ``SelectConfig`` per source, for the
entry points that pick tasks through ``Taskset.select``. ``record(rollouts)`` takes scored
episodes or traces back, in any order and pieces. *Decisions*:

- A rollout is one trainable trace: an episode contributes one reward per trace whose
  ``agent.trainable`` is set (one for ``SingleAgentEnv``; a judge seat's trace is skipped), so
  K counts trainable traces per task. The reward is ``Trace.reward``, the rubric's weighted sum.
- An episode is matched to its task by ``episode.task.key`` (a bare trace by ``trace.task.key``),
  the identity verifiers stamps on every trace and that survives the env server's wire; the
  loader refuses a pool in which two tasks share a key.
- A trace whose rubric did not run (no rewards, or a reward left ``None`` because the rollout
  failed first) is a missing reward and an error naming the task and the trace's last error,
  never a zero. Retry the rollout, or record a reward of your choosing with ``sampler.feed``.
- An episode stamped with a training run's step (``TrainRunInfo.work.step``, the step at which
  the consumer dispatched it) must belong to the pending step; an eval episode or eval work is refused
  (evaluation does not train, so it must not move the curriculum).
- The weighted sum lies in [0, 1] only when the weights allow it: :attr:`VerifiersPool.reward_range`
  is the range the rubric implies if every score lies in [0, 1] (a correctness reward at 1.0
  plus a format reward at 0.2 gives [0, 1.2]); pass it, or your own, as ``reward_range``.
  Without one, a reward outside [0, 1] is refused by the feed, not clipped.

Steps follow the trainer's (``step_offset``: the trainer's number of the scheduler's step 0, 0 by
default), and ``save``/``restore`` are the feed's (the scheduler's orbax checkpoint plus
``feed.json``), to be written beside the trainer's own checkpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

try:
    import verifiers.v1 as vf
    from verifiers.v1.configs.judge import judge_key
    from verifiers.v1.types import content_text
except ImportError as err:  # the adapter is an optional extra
    raise ImportError("envsched_jax.integrations.verifiers needs verifiers 0.4 (`pip install "
                      f"'envsched_jax[verifiers]'`): {err}") from err

from envsched_jax.integrations.core import SchedulerFeed
from envsched_jax.pool.model import Pool, PoolError
from envsched_jax.pool.prompts import prompt_pool
from envsched_jax.sched.base import Scheduler, SchedulerInputError

Source = Any
"""A ``vf.Env`` or a ``vf.Taskset`` (or a view of one: ``taskset.take(100)``)."""


@dataclasses.dataclass(frozen=True)
class RubricTerm:
    """One weighted signal of a task's rubric: a ``@vf.reward`` (or plugged reward) or a judge."""

    name: str
    weight: float
    kind: Literal["reward", "judge"]
    description: str = ""

    def text(self) -> str:
        head = f"{self.name} ({self.kind}, weight {self.weight:g})"
        return f"{head}: {self.description}" if self.description else head


@dataclasses.dataclass(frozen=True)
class VerifiersPool:
    """What :func:`load_verifiers_pool` returns: the schedulable pool and the verifiers side of
    each of its tasks, by task id (the pool's order is the sources' load order)."""

    pool: Pool
    tasks: Mapping[str, Any]                   # task id -> vf.Task (idx, system prompt as iterated)
    sources: Mapping[str, str]                 # task id -> source name
    rubrics: Mapping[str, tuple[RubricTerm, ...]]   # task id -> its rubric
    task_ids_by_key: Mapping[str, str]         # vf Task.key -> task id

    @property
    def reward_range(self) -> tuple[float, float]:
        """The range of ``Trace.reward`` when every reward and judge score lies in [0, 1]:
        (sum of the negative weights, sum of the positive ones), widest over the pool's tasks.
        A reward function returning keyed scores records one weighted reward per key, which
        this cannot count: declare the range yourself for such a rubric."""
        lows = [sum(min(t.weight, 0.0) for t in terms) for terms in self.rubrics.values()]
        highs = [sum(max(t.weight, 0.0) for t in terms) for terms in self.rubrics.values()]
        lo, hi = min(lows), max(highs)
        if not lo < hi:
            raise ValueError(f"the rubrics' weights give the empty reward range [{lo}, {hi}] "
                             "(a task without a positive or negative weight): declare the range")
        return lo, hi


@dataclasses.dataclass(frozen=True)
class ScheduledTask:
    """One task of a step's batch: roll ``task`` out K times (``env.run_episode(task, ctx)``,
    ``agent.run(task)``), or send ``task_data`` to the env server's ``run`` request."""

    task_id: str
    source: str
    environment: str
    task: Any                                   # vf.Task

    @property
    def key(self) -> str:
        return self.task.key

    @property
    def task_data(self) -> dict[str, Any]:
        return self.task.data.model_dump(mode="json")


# -- the loader ----------------------------------------------------------------------------------

def load_verifiers_pool(source: Source | Mapping[str, Source], *, name: str = "verifiers",
                        environment_field: str | None = None,
                        answer_field: str = "answer") -> VerifiersPool:
    """The pool of a verifiers env, taskset or group ``{name: env or taskset}`` (module
    docstring). A source that is not an env or taskset, an unbounded taskset, an empty one, a
    task without prompt, description or name, an ``environment_field`` a task lacks, repeated
    task ids or task keys are :class:`PoolError` naming the source, the task and the field."""
    sources = _sources(source)
    several = len(sources) > 1
    records, tasks, owner, rubrics, by_key, catalogs = [], {}, {}, {}, {}, {}
    for src_name, taskset in sources:
        if not taskset.bounded:
            raise PoolError("the taskset is infinite; bound it first (taskset.take(n))", source=src_name)
        items = list(taskset)
        if not items:
            raise PoolError("the taskset yields no task", source=src_name)
        catalog = _tool_catalog(taskset, items[0])
        for k, task in enumerate(items, 1):
            data = task.data
            local = data.id if data.id else str(data.idx)
            task_id = f"{src_name}/{local}" if several else local
            env_id = src_name if environment_field is None else \
                f"{src_name}:{_field(data, environment_field, src_name, k)}"
            terms = rubric_terms(task)
            system, few_shot, instruction = _prompt_parts(data, src_name, k)
            records.append({"task_id": task_id, "prompt": instruction, "environment": env_id,
                            "check": _check_text(terms, _field_value(data, answer_field), answer_field),
                            "context": "\n".join(p for p in (system, few_shot) if p)})
            if task.key in by_key:
                raise PoolError(f"task {task_id!r} has the verifiers task key of task {by_key[task.key]!r}; "
                                "rollouts of the two could not be told apart", source=src_name, record=k,
                                field="key")
            tasks[task_id], owner[task_id], rubrics[task_id], by_key[task.key] = task, src_name, terms, task_id
            if catalog:
                catalogs[env_id] = (type(task).__name__, catalog)
    pool = prompt_pool(records, name=name)
    if catalogs:
        pool = _with_tools(pool, catalogs)
    frozen = types.MappingProxyType
    return VerifiersPool(pool=pool, tasks=frozen(tasks), sources=frozen(owner), rubrics=frozen(rubrics),
                         task_ids_by_key=frozen(by_key))


def rubric_terms(task: Any) -> tuple[RubricTerm, ...]:
    """A verifiers task's rubric as :meth:`vf.Task.score` will run it: its reward hooks
    (decorated and config-plugged, in verifiers' order) with their weights, then its judges."""
    terms = [RubricTerm(fn.__name__, float(getattr(fn, "_vf_weight", 1.0)), "reward", _first_line(fn.__doc__))
             for fn in task.hooks("reward")]
    terms += [RubricTerm(judge_key(judge), float(judge.weight), "judge", f"judge {judge.id!r}")
              for judge in task.config.judges]
    return tuple(terms)


def _sources(source: Any) -> list[tuple[str, Any]]:
    if isinstance(source, Mapping):
        if not source:
            raise PoolError("the group names no environment")
        out = []
        for src_name, member in source.items():
            if not isinstance(src_name, str) or not src_name or "/" in src_name:
                raise PoolError(f"a group key must be a non-empty string without '/', got {src_name!r}")
            out.append((src_name, _taskset_of(member, src_name)))
        return out
    taskset = _taskset_of(source, None)
    if isinstance(source, vf.Env):
        return [(source.config.env_id, taskset)]
    return [(taskset.config.id or type(taskset).__name__, taskset)]


def _taskset_of(member: Any, src_name: str | None) -> Any:
    if isinstance(member, vf.Env):
        return member.taskset
    if isinstance(member, vf.Taskset):
        return member
    raise PoolError(f"expected a verifiers Env or Taskset, got {type(member).__name__}", source=src_name)


def _field_value(data: Any, field: str) -> Any:
    if field in type(data).model_fields:
        return getattr(data, field)
    return (data.model_extra or {}).get(field)


def _field(data: Any, field: str, src_name: str, k: int) -> str:
    value = _field_value(data, field)
    if not isinstance(value, str) or not value:
        raise PoolError(f"environment_field {field!r} must be a non-empty string on every task, got {value!r}",
                        source=src_name, record=k, field=field)
    return value


def _prompt_parts(data: Any, src_name: str, k: int) -> tuple[str, str, str]:
    """(system prompt, few-shot text, instruction) of a task's data."""
    system = data.system_prompt or ""
    prompt = data.prompt
    if isinstance(prompt, str) and prompt.strip():
        return system, "", prompt
    if prompt:
        messages = list(prompt)
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last_user is not None and content_text(messages[last_user].content).strip():
            shots = "\n".join(f"{m.role}: {content_text(m.content)}" for m in messages[:last_user])
            return system, shots, content_text(messages[last_user].content)
        if data.prompt_text.strip():
            return system, "", data.prompt_text
    fallback = data.description or data.name
    if fallback:
        return system, "", fallback
    raise PoolError("the task has no prompt text, description or name to schedule it by", source=src_name,
                    record=k, field="prompt")


def _check_text(terms: Sequence[RubricTerm], answer: Any, answer_field: str) -> str:
    lines = ["rubric: " + "; ".join(t.text() for t in terms) if terms else "rubric: none declared"]
    if answer is not None:
        lines.append(f"reference {answer_field}: {value_kind(answer)}")
    return "\n".join(lines)


def value_kind(value: Any) -> str:
    """The kind of a reference answer (what the check view compares across tasks)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        text = value.strip()
        for kind, parse in (("integer", int), ("number", float)):
            try:
                parse(text.replace(",", ""))
                return kind
            except ValueError:
                pass
        if len(text) == 1 and text.isalpha():
            return "choice letter"
        return "short text" if len(text.split()) <= 5 else "text"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, Iterable):
        return "list"
    return type(value).__name__


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0].strip()


def _tool_catalog(taskset: Any, first: Any) -> list[dict[str, Any]]:
    """The tools a source's tasks are served: the taskset's shared toolsets and the task class's
    per-rollout ones (built from the first task's config, as verifiers sizes placement by class)."""
    servers = [*type(taskset).toolsets(taskset.config), *type(first).toolsets(first.config)]
    if not servers:
        return []
    return _run_sync(lambda: _advertised_tools(servers))


async def _advertised_tools(servers: Sequence[Any]) -> list[dict[str, Any]]:
    from mcp.server.mcpserver import MCPServer

    schemas = []
    for server in servers:
        registry = MCPServer(server.server_name or type(server).__name__)
        server.register(registry)
        for tool in await registry.list_tools():
            full = f"{server.server_name}_{tool.name}" if server.server_name else tool.name
            schemas.append({"type": "function", "function": {
                "name": full, "description": tool.description or "", "parameters": tool.input_schema}})
    return schemas


def _run_sync(make_coroutine):
    """Run a coroutine to completion from sync code, also when the caller is itself inside an
    event loop (an async orchestrator's setup), where ``asyncio.run`` is not allowed."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coroutine())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(lambda: asyncio.run(make_coroutine())).result()


def _with_tools(pool: Pool, catalogs: Mapping[str, tuple[str, list[dict[str, Any]]]]) -> Pool:
    envs = []
    for env in pool.environments:
        if env.env_id in catalogs:
            class_name, tools = catalogs[env.env_id]
            names = ", ".join(t["function"]["name"] for t in tools)
            env = dataclasses.replace(env, class_name=class_name, tools=tuple(tools),
                                      summary=f"{env.summary} Tools: {names}.")
        envs.append(env)
    return Pool(name=pool.name, environments=tuple(envs), tasks=pool.tasks)


# -- the sampler ---------------------------------------------------------------------------------

class VerifiersSampler:
    """A scheduler as the task sampler of a verifiers / prime-rl loop (module docstring).

    Args:
      scheduler: any registered scheduler, built on ``build_graph(loaded.pool, ...)`` with the
        loop's batch size B (tasks per step) and group size K (trainable traces per task).
      loaded: the :func:`load_verifiers_pool` result the scheduler's graph was built from.
      step_offset: as for :class:`SchedulerFeed`.
      reward_range: as for :class:`SchedulerFeed` (``loaded.reward_range`` is the rubric's range
        when every score lies in [0, 1]).
    """

    def __init__(self, scheduler: Scheduler, loaded: VerifiersPool, *, step_offset: int = 0,
                 reward_range: tuple[float, float] | None = None):
        graph_ids = list(scheduler.graph.task_ids)
        if graph_ids != [t.task_id for t in loaded.pool.tasks]:
            unknown = sorted(set(graph_ids) - set(loaded.tasks))[:3]
            raise ValueError(f"the scheduler's graph has {len(graph_ids)} tasks, the loaded pool "
                             f"{loaded.pool.num_tasks} (in another order, or other ids such as {unknown}); "
                             "build the graph from loaded.pool")
        self.loaded = loaded
        self.feed = SchedulerFeed(scheduler, step_offset=step_offset, reward_range=reward_range)

    @property
    def next_trainer_step(self) -> int:
        return self.feed.next_trainer_step

    @property
    def pending(self) -> list[str] | None:
        return self.feed.pending

    def next_batch(self, trainer_step: int | None = None) -> list[ScheduledTask]:
        """The B tasks of ``trainer_step`` (default: the next one); asking again for the
        pending step returns the same tasks."""
        return [ScheduledTask(task_id=tid, source=self.loaded.sources[tid],
                              environment=self.loaded.pool.tasks[self.loaded.pool.task_index(tid)].env_id,
                              task=self.loaded.tasks[tid])
                for tid in self.feed.next_batch(trainer_step)]

    def record(self, rollouts: Iterable[Any], *, trainer_step: int | None = None) -> bool:
        """Take scored episodes or traces of the pending step back (any order, any number of
        calls). Returns True when this call completed the step. Nothing is recorded from a call
        with any bad rollout."""
        if self.feed.pending is None:
            raise SchedulerInputError("record(): no batch awaits rollouts (call next_batch first)")
        task_ids, rewards = rollout_rewards(rollouts, self.loaded, trainer_step=self.feed.next_trainer_step)
        return self.feed.record(task_ids, rewards, trainer_step=trainer_step)

    def save(self, directory: str | Path) -> Path:
        return self.feed.save(directory)

    def restore(self, folder: str | Path, *, trainer_step: int | None = None) -> None:
        self.feed.restore(folder, trainer_step=trainer_step)


def rollout_rewards(rollouts: Iterable[Any], loaded: VerifiersPool, *,
                    trainer_step: int | None = None) -> tuple[list[str], list[float]]:
    """(task id, ``Trace.reward``) of every trainable trace of ``rollouts`` (episodes, wire
    episodes or traces), in order; a rollout of no task of the pool, of another training step
    (when stamped), an eval rollout, or a trace whose rubric did not run is a
    :class:`SchedulerInputError` naming it."""
    task_ids, rewards = [], []
    for k, rollout in enumerate(rollouts):
        if isinstance(rollout, vf.Episode):
            where = f"rollout {k} (episode {rollout.id})"
            _check_run(rollout.run, where, trainer_step)
            task_id = _task_id(rollout.task, loaded, where)
            traces = [t for t in rollout.traces if t.agent.trainable]
            if not traces:
                errors = "; ".join(f"{e.type}: {e.message}" for e in rollout.errors[-2:]) or "none recorded"
                raise SchedulerInputError(f"{where} of task {task_id!r} has no trainable trace, so no reward "
                                          f"(episode errors: {errors}); retry the rollout")
        elif isinstance(rollout, vf.Trace):
            where = f"rollout {k} (trace {rollout.id})"
            task_id = _task_id(rollout.task, loaded, where)
            traces = [rollout]
        else:
            raise SchedulerInputError(f"rollout {k}: expected a verifiers Episode or Trace, got "
                                      f"{type(rollout).__name__}")
        for trace in traces:
            task_ids.append(task_id)
            rewards.append(_scored_reward(trace, task_id, where))
    return task_ids, rewards


def _check_run(run: Any, where: str, trainer_step: int | None) -> None:
    if run is None:
        return
    work = getattr(run, "work", None)
    if run.type != "train" or work is None or work.type != "train":
        raise SchedulerInputError(f"{where} is evaluation work of run {run.id!r}; only training rollouts "
                                  "feed the scheduler")
    if trainer_step is not None and work.step != trainer_step:
        raise SchedulerInputError(f"{where} was dispatched at training step {work.step}, but the pending "
                                  f"batch is trainer step {trainer_step}")


def _task_id(task: Any, loaded: VerifiersPool, where: str) -> str:
    task_id = loaded.task_ids_by_key.get(task.key) if task.key is not None else None
    if task_id is None:
        data = task.data
        raise SchedulerInputError(f"{where}: task key {task.key!r} (idx {data.idx}, id {data.id!r}) is no task "
                                  "of the loaded pool")
    return task_id


def _scored_reward(trace: Any, task_id: str, where: str) -> float:
    last = trace.last_error
    cause = f"; last error {last.type}: {last.message}" if last is not None else ""
    if not trace.rewards:
        raise SchedulerInputError(f"{where} of task {task_id!r} has no reward: its rubric did not run "
                                  f"(score it with task.score(trace)){cause}")
    unscored = sorted(name for name, value in trace.rewards.items() if value is None)
    if unscored:
        raise SchedulerInputError(f"{where} of task {task_id!r}: reward(s) {unscored} were not scored{cause}")
    value = trace.reward
    if not math.isfinite(value):
        raise SchedulerInputError(f"{where} of task {task_id!r}: the rubric's reward is {value}")
    return value


def select_configs(batch: Sequence[ScheduledTask]) -> dict[str, Any]:
    """The batch as one verifiers ``SelectConfig`` per source, naming its tasks by key:
    ``source_taskset.select(config)`` yields exactly that source's tasks of the batch (in the
    taskset's order), for loops that pick tasks through verifiers' own selection."""
    keys: dict[str, list[str]] = {}
    for item in batch:
        keys.setdefault(item.source, []).append(item.key)
    return {src: vf.SelectConfig(include=vf.TaskMatchConfig(keys=k)) for src, k in keys.items()}
