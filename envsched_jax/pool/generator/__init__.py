"""Seeded generator of synthetic, executable environment-task pools at any scale.

``generate_pool(51, 50)`` gives a pool shaped like the paper's EnvScaler training split (51
environments x 50 tasks = 2,550 environment-task pairs); ``generate_pool_of_size(100_000)`` gives
2,000 environments for scale tests. Each environment is a business domain (clinic beds, hotel
rooms, container yards, ...; see :mod:`.domains`) rendered into an EnvScaler-style class whose
tools return ``{"success": bool, "data" | "error": ...}``, with a subset of nine operation
families enabled (:mod:`.environment`). Tasks come from templates over those families
(:mod:`.tasks`): the same templates recur across domains, so cross-environment structure is shared
while names differ, and every task carries a reference action sequence that scores 1.0.

Randomness: environment ``k`` draws only from ``SeedSequence(seed, spawn_key=(k, 0))`` (its
design) and ``(k, 1)`` (its tasks), and the domain order from the root sequence of ``seed``, so an
environment and its first ``n`` tasks do not depend on how many environments or tasks are asked
for. The same seed gives the same pool (equal ``content_hash``).

Generation executes nothing; the class source is trusted project output, loadable by
:func:`envsched_jax.envs.inprocess.load_class`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from envsched_jax.pool.generator.domains import DOMAINS
from envsched_jax.pool.generator.environment import (
    FAMILIES,
    EnvSpec,
    build_environment,
    make_env_spec,
)
from envsched_jax.pool.generator.stream import stream_for
from envsched_jax.pool.generator.tasks import TEMPLATES, build_task, templates_for
from envsched_jax.pool.model import Environment, Pool, Task

__all__ = ["DOMAINS", "FAMILIES", "TEMPLATES", "GeneratedPoolStream", "generate_pool", "generate_pool_of_size",
           "generated_pool_stream", "environment_spec", "generate_environment"]


def _domain_order(seed: int) -> list[int]:
    return stream_for(seed).shuffled(list(range(len(DOMAINS))))


def environment_spec(seed: int, index: int) -> EnvSpec:
    """The spec of environment ``index`` of the pools generated with ``seed``."""
    return make_env_spec(seed, index, _domain_order(seed), stream_for(seed, index, 0))


def generate_environment(seed: int, index: int, num_tasks: int,
                         domain_order: list[int] | None = None) -> tuple[Environment, list[Task]]:
    """Environment ``index`` and its first ``num_tasks`` tasks."""
    order = _domain_order(seed) if domain_order is None else domain_order
    spec = make_env_spec(seed, index, order, stream_for(seed, index, 0))
    env = build_environment(spec)
    templates = templates_for(spec)
    st = stream_for(seed, index, 1)
    tasks: list[Task] = []
    cycle: list = []
    for j in range(num_tasks):
        if not cycle:  # visit every allowed template once per cycle, in a fresh order
            cycle = st.shuffled(templates)
        tasks.append(build_task(spec, cycle.pop(), st, j))
    return env, tasks


def generate_pool(num_environments: int, tasks_per_environment: int, seed: int = 0) -> Pool:
    """A pool of ``num_environments`` x ``tasks_per_environment`` synthetic tasks."""
    if num_environments < 1 or tasks_per_environment < 1:
        raise ValueError(f"need at least one environment and one task per environment, got "
                         f"{num_environments} x {tasks_per_environment}")
    return _generate([tasks_per_environment] * num_environments, seed,
                     f"synthetic_s{seed}_{num_environments}x{tasks_per_environment}")


def _size_counts(num_tasks: int, tasks_per_environment: int) -> list[int]:
    if num_tasks < 1 or tasks_per_environment < 1:
        raise ValueError(f"num_tasks and tasks_per_environment must be positive, got {num_tasks} "
                         f"and {tasks_per_environment}")
    full, rest = divmod(num_tasks, tasks_per_environment)
    return [tasks_per_environment] * full + ([rest] if rest else [])


def generate_pool_of_size(num_tasks: int, seed: int = 0, tasks_per_environment: int = 50) -> Pool:
    """A pool of exactly ``num_tasks`` tasks, ``tasks_per_environment`` per environment (the last
    environment may get fewer)."""
    return _generate(_size_counts(num_tasks, tasks_per_environment), seed, f"synthetic_s{seed}_{num_tasks}")


@dataclasses.dataclass(frozen=True)
class GeneratedPoolStream:
    """The pool ``generate_pool_of_size(num_tasks, seed, tasks_per_environment)`` would return,
    produced one environment at a time instead of held in memory (at 1,000,000 tasks the
    ``Pool`` object alone takes about 13 GB; see :func:`envsched_jax.graph.build.build_graph_stream`).

    ``environments()`` yields the environments in pool order (cheap: no tasks are drawn);
    ``chunks()`` yields ``(environment, its tasks)`` in pool order. Both are generated afresh on
    every call and equal the corresponding records of the in-memory pool."""

    num_tasks: int
    seed: int = 0
    tasks_per_environment: int = 50

    @property
    def name(self) -> str:
        return f"synthetic_s{self.seed}_{self.num_tasks}"

    def _counts(self) -> list[int]:
        return _size_counts(self.num_tasks, self.tasks_per_environment)

    def environments(self) -> Iterator[Environment]:
        order = _domain_order(self.seed)
        for index in range(len(self._counts())):
            yield build_environment(make_env_spec(self.seed, index, order, stream_for(self.seed, index, 0)))

    def chunks(self) -> Iterator[tuple[Environment, list[Task]]]:
        order = _domain_order(self.seed)
        for index, n in enumerate(self._counts()):
            yield generate_environment(self.seed, index, n, order)

    def to_pool(self) -> Pool:
        return generate_pool_of_size(self.num_tasks, self.seed, self.tasks_per_environment)


def generated_pool_stream(num_tasks: int, seed: int = 0, tasks_per_environment: int = 50) -> GeneratedPoolStream:
    """The streamed form of :func:`generate_pool_of_size` (:class:`GeneratedPoolStream`)."""
    _size_counts(num_tasks, tasks_per_environment)  # validates the arguments
    return GeneratedPoolStream(num_tasks, seed, tasks_per_environment)


def _generate(counts: list[int], seed: int, name: str) -> Pool:
    order = _domain_order(seed)
    envs: list[Environment] = []
    tasks: list[Task] = []
    for index, n in enumerate(counts):
        env, env_tasks = generate_environment(seed, index, n, order)
        envs.append(env)
        tasks.extend(env_tasks)
    return Pool(name=name, environments=tuple(envs), tasks=tuple(tasks))
