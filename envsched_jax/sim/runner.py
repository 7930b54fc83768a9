"""Run schedulers on the learning-dynamics testbed (:mod:`envsched_jax.sim.testbed`).

:func:`make_setup` builds the experiment once: a generated pool whose first ``train_envs``
environments are the schedulable nodes (the paper's 51 x 50 = 2,550) and whose last
``heldout_envs`` environments are never selectable and measure downstream performance; the
scheduler's static graph over the training nodes; the testbed's static structure.

:func:`run_scheduler` runs any registered scheduler through the shared API
(``select(t)`` -> testbed rollouts -> ``observe(t)`` -> simulated GRPO step). The rollout key of
step t depends only on (seed, t), so every scheduler sees the same randomness for a seed.

:func:`random_runs` is the same loop for Random scheduling written as one ``lax.scan``,
``vmap``-ed over seeds (and, through ``jax.vmap`` by the caller, over parameters): it is what the
calibration and sensitivity sweeps use. It draws Random's batches exactly as
:class:`~envsched_jax.sched.random.RandomScheduler` does, so the two agree step for step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envsched_jax.graph.build import GraphConfig, PoolGraph, build_graph
from envsched_jax.pool.generator import generate_pool
from envsched_jax.pool.model import Pool
from envsched_jax.sched import make_scheduler
from envsched_jax.sim import testbed as tb


@dataclasses.dataclass(frozen=True)
class SetupConfig:
    """The simulated experiment's pool."""

    train_envs: int = 51
    """Schedulable environments (paper: 51)."""
    heldout_envs: int = 10
    """Held-out environments for the downstream score (never selectable)."""
    tasks_per_env: int = 50
    """Tasks per environment (paper: 2,550 / 51 = 50)."""
    pool_seed: int = 0
    """Seed of the generated pool and of the testbed's fixed difficulty draw."""


@dataclasses.dataclass
class Setup:
    config: SetupConfig
    pool: Pool                     # training + held-out
    train_pool: Pool               # training environments only (the scheduler's pool)
    graph: PoolGraph               # static graph of train_pool
    structure: tb.TestbedStructure
    tools_per_env: list[list[str]]

    @property
    def max_checks(self) -> int:
        return int(np.max(np.asarray(self.structure.num_checks)))


def make_setup(config: SetupConfig = SetupConfig(), graph_config: GraphConfig | None = None) -> Setup:
    pool = generate_pool(config.train_envs + config.heldout_envs, config.tasks_per_env, seed=config.pool_seed)
    env_ids = [e.env_id for e in pool.environments]
    train_ids, held_ids = env_ids[: config.train_envs], env_ids[config.train_envs:]
    train_set = set(train_ids)
    train_pool = Pool(name=f"{pool.name}[train {config.train_envs}]",
                      environments=[e for e in pool.environments if e.env_id in train_set],
                      tasks=[t for t in pool.tasks if t.env_id in train_set])
    graph = build_graph(train_pool, graph_config or GraphConfig(dense="always"))
    structure = tb.build_structure(pool, held_ids, seed=config.pool_seed)
    if list(graph.task_ids) != tb.train_order(pool, held_ids):
        raise AssertionError("graph and testbed disagree on the node order")
    tools = [list(train_pool.environment(e).tool_names) for e in graph.env_ids]
    return Setup(config, pool, train_pool, graph, structure, tools)


@dataclasses.dataclass
class RunLog:
    """Per-step record of one scheduler run on the testbed ([T] or [T, B] arrays)."""

    scheduler: str
    seed: int
    realised_variance: np.ndarray   # [T, B] population variance of each selected group
    mean_reward: np.ndarray         # [T, B]
    predicted_variance: np.ndarray  # [T, B] the scheduler's prediction (NaN when it has none)
    phases: np.ndarray              # [T, B] str
    environments: np.ndarray        # [T] distinct environments per batch
    tools: np.ndarray               # [T] distinct (environment, tool) pairs per batch
    heldout: np.ndarray             # [T] held-out score after step t's update (NaN if not evaluated)
    schedule_ms: np.ndarray         # [T] select + observe time
    initial_heldout: float = float("nan")

    def summary(self) -> dict[str, float]:
        """Table 2's statistics over the whole run."""
        v = self.realised_variance.ravel()
        return {"mean_variance": float(v.mean()), "median_variance": float(np.median(v)),
                "median_reward": float(np.median(self.mean_reward)),
                "environments": float(self.environments.mean()), "tools": float(self.tools.mean()),
                "best_heldout": float(np.nanmax(self.heldout)),
                "final_heldout": float(self.heldout[~np.isnan(self.heldout)][-1])}


def run_scheduler(setup: Setup, name: str, *, steps: int, seed: int, params: tb.TestbedParams = tb.TestbedParams(),
                  batch_size: int = 64, group_size: int = 8, eval_every: int = 1,
                  scheduler_kwargs: Mapping[str, Any] | None = None, progress=None) -> RunLog:
    """Run scheduler ``name`` for ``steps`` steps on the testbed; ``progress(t)`` is called per step."""
    kwargs = dict(scheduler_kwargs or {})
    sched = make_scheduler(name, setup.graph, batch_size=batch_size, group_size=group_size, seed=seed,
                           tools_per_env=setup.tools_per_env, **kwargs)
    index = {tid: k for k, tid in enumerate(setup.graph.task_ids)}
    structure, max_checks = setup.structure, setup.max_checks
    state = tb.init_state(structure, params)
    key = jax.random.PRNGKey(seed)
    heldout = np.full(steps, np.nan)
    timing = np.zeros(steps)
    initial = float(tb.heldout_score(structure, state, params))
    for t in range(steps):
        t0 = time.perf_counter()
        ids = sched.select(t)
        timing[t] = time.perf_counter() - t0
        nodes = jnp.asarray([index[i] for i in ids], jnp.int32)
        rewards = tb.rollout(structure, state, params, nodes, rollout_key(key, t), group_size=group_size,
                             max_checks=max_checks)
        rewards_np = np.asarray(rewards, np.float64)
        t0 = time.perf_counter()
        sched.observe(t, ids, rewards_np)
        timing[t] += time.perf_counter() - t0
        state = tb.learn(structure, state, params, nodes, rewards)
        if (t + 1) % eval_every == 0 or t == steps - 1:
            heldout[t] = float(tb.heldout_score(structure, state, params))
        if progress is not None:
            progress(t)
    metrics = sched.metrics()
    nan_row = [np.nan] * batch_size
    return RunLog(
        scheduler=name, seed=seed,
        realised_variance=np.array([m.realised_variance for m in metrics]),
        mean_reward=np.array([m.mean_reward for m in metrics]),
        predicted_variance=np.array([m.predicted_variance if m.predicted_variance is not None else nan_row
                                     for m in metrics], float),
        phases=np.array([m.phases for m in metrics]),
        environments=np.array([m.environments for m in metrics]),
        tools=np.array([m.tools for m in metrics]),
        heldout=heldout, schedule_ms=1000 * timing, initial_heldout=initial)


def rollout_key(key: jax.Array, t) -> jax.Array:
    """Rollout randomness of step t (independent of the scheduler's own key use)."""
    return jax.random.fold_in(jax.random.fold_in(key, 0x5EED), t)


@functools.partial(jax.jit, static_argnames=("steps", "batch_size", "group_size", "max_checks", "num_train"))
def _random_run(structure, params, seed, *, steps, batch_size, group_size, max_checks, num_train):
    key = jax.random.PRNGKey(seed)
    state = tb.init_state(structure, params)

    def step(state, t):
        nodes = jax.random.choice(jax.random.fold_in(key, t), num_train, (batch_size,), replace=False)
        nodes = nodes.astype(jnp.int32)
        rewards = tb.rollout(structure, state, params, nodes, rollout_key(key, t), group_size=group_size,
                             max_checks=max_checks)
        new = tb.learn(structure, state, params, nodes, rewards)
        out = {"variance": rewards.var(axis=1), "mean_reward": rewards.mean(axis=1),
               "heldout": tb.heldout_score(structure, new, params),
               "environments": (jnp.zeros(structure.env_noise.shape[0], bool)
                                .at[structure.env[nodes]].set(True).sum())}
        return new, out

    _, out = jax.lax.scan(step, state, jnp.arange(steps))
    return out


def random_runs(setup: Setup, params: tb.TestbedParams, seeds, *, steps: int, batch_size: int = 64,
                group_size: int = 8, batched_params: bool = False) -> dict[str, np.ndarray]:
    """Random scheduling on the testbed, one compiled scan vmapped over ``seeds``: arrays
    [seeds, T] / [seeds, T, B] of variance, mean_reward, heldout, environments.

    With ``batched_params=True``, ``params`` holds a leading axis of settings (see
    :func:`stack_params`) and the result gains a leading [settings] axis: one program for a whole
    parameter sweep."""
    fn = functools.partial(_random_run, steps=steps, batch_size=batch_size, group_size=group_size,
                           max_checks=setup.max_checks, num_train=setup.structure.num_train)
    run = jax.vmap(fn, in_axes=(None, None, 0))
    if batched_params:
        run = jax.vmap(run, in_axes=(None, 0, None))
    out = run(setup.structure, params, jnp.asarray(seeds, jnp.uint32))
    return {k: np.asarray(v) for k, v in out.items()}


def stack_params(settings) -> tb.TestbedParams:
    """Stack several TestbedParams (same ``eval_samples``) into one with a leading axis."""
    settings = list(settings)
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), *settings)
