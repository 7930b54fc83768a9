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

__all__ = ["DOMAINS", "FAMILIES", "TEMPLATES", "generate_pool", "generate_pool_of_size",
           "environment_spec", "generate_environment"]


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


def generate_pool_of_size(num_tasks: int, seed: int = 0, tasks_per_environment: int = 50) -> Pool:
    """A pool of exactly ``num_tasks`` tasks, ``tasks_per_environment`` per environment (the last
    environment may get fewer)."""
    if num_tasks < 1 or tasks_per_environment < 1:
        raise ValueError(f"num_tasks and tasks_per_environment must be positive, got {num_tasks} "
                         f"and {tasks_per_environment}")
    full, rest = divmod(num_tasks, tasks_per_environment)
    counts = [tasks_per_environment] * full + ([rest] if rest else [])
    return _generate(counts, seed, f"synthetic_s{seed}_{num_tasks}")


def _generate(counts: list[int], seed: int, name: str) -> Pool:
    order = _domain_order(seed)
    envs: list[Environment] = []
    tasks: list[Task] = []
    for index, n in enumerate(counts):
        env, env_tasks = generate_environment(seed, index, n, order)
        envs.append(env)
        tasks.extend(env_tasks)
    return Pool(name=name, environments=tuple(envs), tasks=tuple(tasks))
