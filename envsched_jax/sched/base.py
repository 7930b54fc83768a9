"""The scheduler API shared by every scheduler, its registry and input validation.

A scheduler is built from a :class:`~envsched_jax.graph.build.PoolGraph` and a typed config, and
runs strictly step by step::

    ids = sched.select(t)                 # B distinct task ids
    sched.observe(t, ids, rewards)        # rewards: [B, K] in [0, 1], rows in the order of ids
    sched.select(t + 1) ...

``state_dict()`` / ``load_state_dict()`` give a snapshot of everything the scheduler remembers
(numpy arrays plus a small JSON-able header recording the pool, the graph and the config);
:mod:`envsched_jax.sched.checkpoint` writes it with orbax. Loading validates the whole snapshot
first (:mod:`envsched_jax.sched.snapshot`) and only then swaps it in. ``metrics()`` lists one
:class:`StepMetrics` per selected step.

Bad input (NaN / infinite / out-of-range / complex / non-numeric rewards, the wrong K, ids that
are not strings, unknown or repeated ids, a step that was never selected, a snapshot that does not
fit) raises :class:`SchedulerInputError` naming the problem, and the state is left exactly as it
was.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.errors import (  # noqa: F401  (re-exported: the errors' public home)
    CheckpointError,
    InfeasibleBatchError,
    SchedulerInputError,
    SchedulingError,
)
from envsched_jax.sched.snapshot import config_record, graph_fingerprint, task_ids_hash, validated_state


@dataclasses.dataclass
class StepMetrics:
    """What happened at one step."""

    step: int
    task_ids: list[str]
    phases: list[str]                       # per pick: "cold", "coverage", "exploitation", "random"
    predicted_variance: list[float] | None  # per pick, the scheduler's vhat (None if it has none)
    environments: int                       # distinct environments in the batch
    tools: int | None                       # distinct (environment, tool) pairs, when known
    realised_variance: list[float] | None = None   # per pick, once observed
    mean_reward: list[float] | None = None         # per pick, once observed
    # EnvSched with infeasible="relax": picks per relaxed constraint, e.g. {"cap_window": 2}. A
    # key is the last constraint a pick had to drop (the ones before it in the relaxation order
    # were dropped for that pick too); one aggregated entry per step, not one per pick.
    relaxations: dict[str, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        def mean(x):
            return None if x is None else float(np.mean(x))

        return {"step": self.step, "environments": self.environments, "tools": self.tools,
                "predicted_variance": mean(self.predicted_variance),
                "realised_variance": mean(self.realised_variance), "mean_reward": mean(self.mean_reward),
                "coverage": self.phases.count("coverage"), "exploitation": self.phases.count("exploitation"),
                "relaxations": sum(self.relaxations.values())}


class Scheduler(abc.ABC):
    """Base class: step bookkeeping, id mapping and input validation; subclasses implement
    ``_select`` and ``_observe`` on node indices."""

    name: str = "scheduler"

    def __init__(self, graph: PoolGraph, batch_size: int, group_size: int,
                 tools_per_env: Sequence[Sequence[str]] | None = None):
        self.graph = graph
        self.batch_size = batch_size
        self.group_size = group_size
        self.num_nodes = graph.num_nodes
        if batch_size > self.num_nodes:
            raise ValueError(f"batch_size {batch_size} exceeds the pool's {self.num_nodes} tasks")
        self._index = {tid: k for k, tid in enumerate(graph.task_ids)}
        self._env_index = np.asarray(graph.env_index)
        self._tools_per_env = None if tools_per_env is None else [tuple(t) for t in tools_per_env]
        self._graph_hash: str | None = None   # graph_fingerprint(graph), computed when first needed
        self._next_step = 0
        self._pending: tuple[int, np.ndarray, list[str]] | None = None  # (step, nodes, phases)
        self._metrics: list[StepMetrics] = []

    # -- public API ------------------------------------------------------------------------

    def select(self, step: int) -> list[str]:
        """Choose the batch of ``step`` (which must be the next step)."""
        if self._pending is not None:
            raise SchedulerInputError(f"select({step}) while step {self._pending[0]} awaits observe(); "
                                      "observe it first")
        if step != self._next_step:
            raise SchedulerInputError(f"select({step}): the next step is {self._next_step}")
        nodes, phases, predicted, relaxations = self._select(step)
        nodes = np.asarray(nodes, np.int64)
        if len(nodes) != self.batch_size or len(set(nodes.tolist())) != self.batch_size:
            raise AssertionError(f"{self.name} produced an invalid batch {nodes.tolist()}")
        self._pending = (step, nodes, list(phases))
        ids = [self.graph.task_ids[i] for i in nodes]
        envs = self._env_index[nodes]
        tools = None
        if self._tools_per_env is not None:
            tools = len({(e, tool) for e in set(envs.tolist()) for tool in self._tools_per_env[e]})
        self._metrics.append(StepMetrics(step, ids, list(phases), predicted, len(set(envs.tolist())),
                                         tools, relaxations=dict(relaxations)))
        return ids

    def observe(self, step: int, task_ids: Sequence[str], rewards) -> None:
        """Record the rewards [B, K] of the tasks selected at ``step``."""
        nodes, rewards = self._validate_observation(step, task_ids, rewards)
        self._observe(step, nodes, rewards)
        # Per pick, in the order of the selected batch: population variance and mean reward.
        row_of = np.empty(self.num_nodes, np.int64)
        row_of[nodes] = np.arange(len(nodes))
        rows = row_of[self._pending[1]]
        metric = self._metrics[-1]
        metric.realised_variance = rewards.var(axis=1)[rows].tolist()
        metric.mean_reward = rewards.mean(axis=1)[rows].tolist()
        self._pending = None
        self._next_step = step + 1

    def metrics(self) -> list[StepMetrics]:
        return list(self._metrics)

    def config_record(self) -> dict[str, Any]:
        """The settings the state depends on, as saved in a snapshot's header: the scheduler's
        ``config`` dataclass, or B and K for a scheduler without one."""
        config = getattr(self, "config", None)
        if config is None:
            return {"batch_size": self.batch_size, "group_size": self.group_size}
        return config_record(config)

    def snapshot_header(self) -> dict[str, Any]:
        """The header a snapshot of this scheduler carries (and a loaded one must match)."""
        if self._graph_hash is None:
            self._graph_hash = graph_fingerprint(self.graph)
        return {"name": self.name, "next_step": self._next_step, "num_nodes": self.num_nodes,
                "task_ids_hash": task_ids_hash(self.graph.task_ids), "graph_hash": self._graph_hash,
                "config": self.config_record()}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this scheduler stands."""
        if self._pending is not None:
            raise SchedulerInputError(f"step {self._pending[0]} awaits observe(); save after observing it")
        return {"header": self.snapshot_header(), "arrays": self._state_arrays()}

    def load_state_dict(self, state: Mapping[str, Any], *, source: str = "state") -> None:
        """Continue from ``state`` (a :meth:`state_dict`). Everything is checked first: header
        field types, scheduler name, pool, graph, config (B, K, ...), every array's name, shape,
        dtype kind and finiteness, and the scheduler's own consistency rules; a problem raises
        :class:`CheckpointError` naming ``source`` and leaves this scheduler exactly as it was."""
        header, arrays = validated_state(state, expected_header=self.snapshot_header(),
                                         current_arrays=self._state_arrays(), source=source)
        self._check_state(header, arrays, source)
        # Nothing below can fail: the swap is all or nothing.
        self._load_state_arrays(arrays)
        self._next_step = header["next_step"]
        self._pending = None

    # -- for subclasses --------------------------------------------------------------------

    @abc.abstractmethod
    def _select(self, step: int) -> tuple[np.ndarray, list[str], list[float] | None, dict[str, int]]:
        """(nodes, phases, predicted variance per pick or None, relaxed picks per constraint)."""

    @abc.abstractmethod
    def _observe(self, step: int, nodes: np.ndarray, rewards: np.ndarray) -> None:
        """Rows of ``rewards`` belong to ``nodes`` (validated; same set as the pending batch)."""

    @abc.abstractmethod
    def _state_arrays(self) -> dict[str, np.ndarray]:
        """Copies of every array of the state; also the template a loaded snapshot must match."""

    @abc.abstractmethod
    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Take over ``arrays`` (already validated: the names, shapes and dtypes of
        :meth:`_state_arrays`, finite floats); must not fail."""

    def _check_state(self, header: dict[str, Any], arrays: dict[str, np.ndarray], source: str) -> None:
        """Scheduler-specific consistency of a validated snapshot; raise :class:`CheckpointError`.
        The default has nothing to add."""

    # -- validation ------------------------------------------------------------------------

    def _validate_observation(self, step: int, task_ids: Sequence[str], rewards) -> tuple[np.ndarray, np.ndarray]:
        if self._pending is None or self._pending[0] != step:
            pending = "no step" if self._pending is None else f"step {self._pending[0]}"
            raise SchedulerInputError(f"observe({step}): step {step} was not selected or was already "
                                      f"observed ({pending} awaits observation)")
        ids = _task_id_list(step, task_ids)
        unknown = [t for t in ids if t not in self._index]
        if unknown:
            raise SchedulerInputError(f"observe({step}): unknown task id(s) {unknown[:5]}")
        repeated = sorted(t for t, c in collections.Counter(ids).items() if c > 1)
        if repeated:
            raise SchedulerInputError(f"observe({step}): repeated task id(s) {repeated[:5]}")
        nodes = np.array([self._index[t] for t in ids], np.int64)
        expected = set(self._pending[1].tolist())
        if set(nodes.tolist()) != expected:
            missing = [self.graph.task_ids[i] for i in sorted(expected - set(nodes.tolist()))]
            extra = [self.graph.task_ids[i] for i in sorted(set(nodes.tolist()) - expected)]
            raise SchedulerInputError(f"observe({step}): task ids differ from the batch selected at step "
                                      f"{step}: missing {missing[:5]}, not selected {extra[:5]}")
        rewards = _real_rewards(step, rewards)
        if rewards.shape != (len(ids), self.group_size):
            raise SchedulerInputError(f"observe({step}): rewards must have shape [B={len(ids)}, "
                                      f"K={self.group_size}], got {list(rewards.shape)}")
        bad = ~np.isfinite(rewards)
        if bad.any():
            r, k = np.argwhere(bad)[0]
            raise SchedulerInputError(f"observe({step}): reward of {ids[r]!r} rollout {k} is {rewards[r, k]}")
        out = (rewards < 0) | (rewards > 1)
        if out.any():
            r, k = np.argwhere(out)[0]
            raise SchedulerInputError(f"observe({step}): reward of {ids[r]!r} rollout {k} is "
                                      f"{rewards[r, k]}, outside [0, 1]")
        return nodes, rewards


def _task_id_list(step: int, task_ids: Any) -> list[str]:
    """``task_ids`` as a list, refusing anything but a sequence of strings (``None`` or a number
    as an id would otherwise surface as an unhashable-type or unknown-id error elsewhere)."""
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
        raise SchedulerInputError(f"observe({step}): task_ids must be a sequence of task id strings, "
                                  f"got {type(task_ids).__name__}")
    ids = list(task_ids)
    for position, tid in enumerate(ids):
        if not isinstance(tid, str):
            raise SchedulerInputError(f"observe({step}): task ids must be strings; position {position} "
                                      f"is {tid!r} ({type(tid).__name__})")
    return ids


_REAL_KINDS = "biuf"   # numpy dtype kinds of real numbers: bool, signed, unsigned, float


def _real_rewards(step: int, rewards: Any) -> np.ndarray:
    """``rewards`` as float64, refusing complex numbers, strings and other objects: casting would
    drop an imaginary part or parse a string without a word."""
    try:
        array = np.asarray(rewards)
    except (TypeError, ValueError) as err:   # ragged nesting
        raise SchedulerInputError(f"observe({step}): rewards are not a numeric array ({err})") from None
    if array.dtype.kind not in _REAL_KINDS:
        real = (bool, int, float, np.bool_, np.integer, np.floating)
        examples = [x for x in array.flat if not isinstance(x, real)][:1]
        # An object array of plain Python numbers (a list mixing int and float) is fine.
        if examples or array.dtype.kind != "O":
            raise SchedulerInputError(f"observe({step}): rewards must be real numbers, got dtype {array.dtype}"
                                      + "".join(f" (e.g. {x!r})" for x in examples))
    return array.astype(np.float64)


SchedulerFactory = Callable[..., Scheduler]
_REGISTRY: dict[str, SchedulerFactory] = {}


def register_scheduler(name: str) -> Callable[[SchedulerFactory], SchedulerFactory]:
    """Class decorator: make a scheduler constructible by name with :func:`make_scheduler`."""

    def deco(cls: SchedulerFactory) -> SchedulerFactory:
        if name in _REGISTRY:
            raise ValueError(f"scheduler {name!r} is already registered")
        _REGISTRY[name] = cls
        return cls

    return deco


def registered_schedulers() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_scheduler(name: str, graph: PoolGraph, **kwargs) -> Scheduler:
    """Build the scheduler registered as ``name``; ``kwargs`` go to its constructor."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; registered: {', '.join(registered_schedulers())}") from None
    return factory(graph, **kwargs)
