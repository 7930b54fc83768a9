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

:func:`envsched_runs` is the loop for EnvSched as one compiled program per static configuration:
each run a ``lax.scan`` over the steps (the cold-start kernel, then the score pass, progress filter
and greedy batch of :mod:`envsched_jax.sched.kernels`, the testbed's rollouts, observe, the GRPO
step), the runs (settings of the traced hyper-parameters and of :class:`TestbedParams`, x seeds)
mapped over inside it, one after the other (the loop's batches bit for bit) or ``vmap``-ed
(batched). The sweep notebook, ``experiments/sensitivity.py`` and ``experiments/bench_sweep.py``
use it.
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
    batch: np.ndarray | None = None  # [T, B] node indices (graph order) in pick order

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
        heldout=heldout, schedule_ms=1000 * timing, initial_heldout=initial,
        batch=np.array([[index[i] for i in m.task_ids] for m in metrics], np.int32).reshape(steps, batch_size))


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


# --------------------------------------------------------------------------------------------
# EnvSched runs as one compiled program: a lax.scan over steps, vmapped over settings x seeds

PHASES = ("cold", "coverage", "exploitation")
"""Phase codes of :attr:`EnvSchedRuns.phase`."""

TRACES = {"envsched_runs": 0}   # trace counter of the sweep program (tests check what recompiles)


@dataclasses.dataclass
class EnvSchedRuns:
    """Per-step arrays of EnvSched runs on the testbed, [settings, seeds, T(, B(, K))], as
    :func:`envsched_runs` returns them; :meth:`log` gives one run as a :class:`RunLog`.

    ``relaxed``: the relaxation level of each pick (index into
    :data:`envsched_jax.sched.cold_start.COLD_RELAXATIONS` at step 0, into
    :data:`envsched_jax.sched.kernels.RELAXATIONS` after)."""

    configs: list               # [settings] EnvSchedConfig
    params: list                # [settings] TestbedParams
    seeds: list[int]
    batch: np.ndarray               # [C, S, T, B] int32 node indices in pick order
    phase: np.ndarray               # [C, S, T, B] int8 index into PHASES
    relaxed: np.ndarray             # [C, S, T, B] int8
    rewards: np.ndarray             # [C, S, T, B, K] float32, rows in pick order
    predicted_variance: np.ndarray  # [C, S, T, B] vhat of each pick (NaN at step 0)
    environments: np.ndarray        # [C, S, T] distinct environments per batch
    tools: np.ndarray               # [C, S, T] distinct (environment, tool) pairs per batch
    heldout: np.ndarray             # [C, S, T] held-out score after step t's update
    initial_heldout: np.ndarray     # [C]
    programs: int                   # compiled programs run (one per distinct static configuration)
    seconds: float                  # wall time of the whole call, compilation included

    @property
    def realised_variance(self) -> np.ndarray:
        """[C, S, T, B] population variance of each group (float64, as RunLog computes it)."""
        return self.rewards.astype(np.float64).var(axis=-1)

    @property
    def mean_reward(self) -> np.ndarray:
        return self.rewards.astype(np.float64).mean(axis=-1)

    def log(self, setting: int, seed_index: int) -> RunLog:
        """One run as the :class:`RunLog` :func:`run_scheduler` would give (``schedule_ms``: NaN,
        per-step times do not exist inside one program)."""
        c, s = setting, seed_index
        rewards = self.rewards[c, s].astype(np.float64)
        steps = rewards.shape[0]
        return RunLog(scheduler="envsched", seed=int(self.seeds[s]), realised_variance=rewards.var(axis=-1),
                      mean_reward=rewards.mean(axis=-1),
                      predicted_variance=self.predicted_variance[c, s].astype(float),
                      phases=np.array(PHASES)[self.phase[c, s]], environments=self.environments[c, s].copy(),
                      tools=self.tools[c, s].copy(), heldout=self.heldout[c, s].astype(float),
                      schedule_ms=np.full(steps, np.nan), initial_heldout=float(self.initial_heldout[c]),
                      batch=self.batch[c, s].copy())

    def logs(self, setting: int) -> list[RunLog]:
        return [self.log(setting, s) for s in range(len(self.seeds))]


def _play(state, testbed, params, key, t, nodes, graph, structure, *, static, num_envs, max_checks):
    """One step after the selection, as :func:`run_scheduler` does it: rollouts of ``nodes``
    (pick order), observe (in ascending order, as EnvSched does), the simulated GRPO step, the
    held-out score."""
    from envsched_jax.sched import kernels as K

    s_full, s_abs, env_index = graph["s_full"], graph["s_abs"], graph["env_index"]
    safe = jnp.maximum(nodes, 0)   # -1 only after an infeasible pick (raised on the host)
    rewards = tb.rollout(structure, testbed, params, safe, rollout_key(key, t), group_size=static.group_size,
                         max_checks=max_checks)
    order = jnp.argsort(safe)
    ascending = safe[order]
    state = K.observe_update(state, ascending, rewards[order].astype(jnp.dtype(static.dtype)), s_full[ascending],
                             s_abs[ascending], env_index, static, graph["env_members"])
    testbed = tb.learn(structure, testbed, params, safe, rewards)
    present = jnp.zeros((num_envs,), bool).at[env_index[safe]].set(True)
    return state, testbed, {"rewards": rewards, "environments": present.sum(),
                            "tools": jnp.where(present, graph["num_tools"], 0).sum(),
                            "heldout": tb.heldout_score(structure, testbed, params)}


def _envsched_run(hyper, params, seed, graph, structure, *, static, num_envs, max_env_size, steps, max_checks,
                  keep_scores=True):
    """One EnvSched run on the testbed: what :func:`run_scheduler` does for "envsched", step for
    step, with the same kernels, the same rollout keys and the same order of operations."""
    from envsched_jax.sched import kernels as K
    from envsched_jax.sched.cold_start import cold_start
    from envsched_jax.sched.config import KernelConfig

    config = KernelConfig(static, hyper)
    dtype = jnp.dtype(static.dtype)
    s_full, env_index = graph["s_full"], graph["env_index"]
    n, b = env_index.shape[0], static.batch_size
    key = jax.random.PRNGKey(seed)
    state = K.init_state(n, num_envs, static, key).replace(excluded=graph["excluded"])
    testbed = tb.init_state(structure, params)
    def play(state, testbed, t, nodes):
        return _play(state, testbed, params, key, t, nodes, graph, structure, static=static, num_envs=num_envs,
                     max_checks=max_checks)

    if static.cold_start == "random":
        nodes = jax.random.choice(jax.random.fold_in(state.key, 0), n, (b,), replace=False,
                                  p=graph["random_p"]).astype(jnp.int32)
        relaxed, feasible = jnp.zeros((b,), jnp.int32), jnp.ones((b,), bool)
    else:
        cold = cold_start(s_full, env_index, graph["excluded"], hyper.cap_step, batch_size=b, num_envs=num_envs,
                          max_env_size=max_env_size, relax=static.infeasible == "relax")
        nodes, relaxed, feasible = cold.batch, cold.relaxed, cold.feasible
    state, testbed, first = play(state, testbed, jnp.zeros((), jnp.int32), nodes)
    first.update(batch=nodes, phase=jnp.zeros((b,), jnp.int32), relaxed=relaxed, feasible=feasible,
                 predicted=jnp.full((b,), jnp.nan, dtype))

    def select(state):
        """EnvSched's ``_score_and_select``, whole: its every output is kept (below)."""
        scores = K.score_pass(state, config)
        progress = K.progress_filter(state, env_index, num_envs, config)
        sel = K.select_batch(state, scores.q, progress.excluded, s_full, env_index, config)
        return scores, progress, sel, scores.long.yhat[jnp.maximum(sel.batch, 0), K.V]

    def step(carry, t):
        state, testbed, _ = carry
        selected = select(state)
        _, _, sel, predicted = selected
        state, testbed, out = play(state, testbed, t, sel.batch)
        out.update(batch=sel.batch, phase=sel.phase, relaxed=sel.relaxed, feasible=sel.feasible, predicted=predicted)
        return (state, testbed, selected if keep_scores else ()), out

    if steps == 1:
        return jax.tree.map(lambda x: x[None], first), jnp.zeros(())
    # The selection's full output (every score of the step, as EnvSched's jitted step returns it)
    # rides in the carry and is read after the loop. Otherwise XLA would compute only what the
    # batch needs, fuse it differently, and round some yhat in the last bit differently from the
    # loop's compiled step (enough to flip a pick now and then).
    # (Not kept when the runs are vmapped: batched, they are not bit-identical anyway.)
    blank = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(select, state)) if keep_scores else ()
    (_, _, last), rest = jax.lax.scan(step, (state, testbed, blank), jnp.arange(1, steps, dtype=jnp.int32))
    keep = sum((jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(last)), jnp.zeros(()))
    return jax.tree.map(lambda a, r: jnp.concatenate([a[None], r]), first, rest), keep


@functools.partial(jax.jit, static_argnames=("static", "num_envs", "max_env_size", "steps", "max_checks", "vectorize"))
def _envsched_program(hyper, params, seeds, graph, structure, *, static, num_envs, max_env_size, steps, max_checks,
                      vectorize):
    """R runs in one program: ``hyper``, ``params`` and ``seeds`` carry a leading [R] axis;
    ``vectorize``: ``vmap`` over the runs, else ``lax.map`` (one run after the other)."""
    TRACES["envsched_runs"] += 1
    run = functools.partial(_envsched_run, graph=graph, structure=structure, static=static, num_envs=num_envs,
                            max_env_size=max_env_size, steps=steps, max_checks=max_checks, keep_scores=not vectorize)
    if vectorize:
        return jax.vmap(run)(hyper, params, seeds)
    return jax.lax.map(lambda args: run(*args), (hyper, params, seeds))   # (outputs, kept scores)


def _changed_fields(config) -> dict[str, Any]:
    from envsched_jax.sched.config import EnvSchedConfig

    default = EnvSchedConfig()
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(default, f.name)}


def _check_batch_size(setup: Setup, config, mask: np.ndarray) -> None:
    """What EnvSched's constructor checks, with its errors (dense matrices, float64, the caps)."""
    from envsched_jax.sched.base import InfeasibleBatchError
    from envsched_jax.sched.feasibility import batch_feasibility, eligible_tasks_per_environment

    graph = setup.graph
    if graph.s_full is None or graph.s_abs is None:
        raise ValueError("EnvSched needs the dense S_full and S_abs; build the graph with GraphConfig(dense='always')")
    if config.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError("dtype='float64' needs jax.config.update('jax_enable_x64', True) first")
    if config.batch_size > graph.num_nodes:
        raise ValueError(f"batch_size {config.batch_size} exceeds the pool's {graph.num_nodes} tasks")
    feasibility = batch_feasibility(eligible_tasks_per_environment(graph.env_index, len(graph.env_ids), mask), config)
    if feasibility.binding_cap(config.batch_size) is not None:
        if config.infeasible == "error" or config.batch_size > feasibility.num_tasks:
            raise InfeasibleBatchError(f"{feasibility.explain(config.batch_size)}. Use batch_size <= "
                                       f"{feasibility.largest}" + ("" if config.batch_size > feasibility.num_tasks
                                                                   else " or infeasible='relax'"))


def _settings(configs, params) -> tuple[list, list]:
    from envsched_jax.sched.config import EnvSchedConfig

    configs = [configs] if isinstance(configs, EnvSchedConfig) else list(configs)
    params = [params] if isinstance(params, tb.TestbedParams) else list(params)
    if not configs or not params:
        raise ValueError("envsched_runs needs at least one config and one TestbedParams")
    if len(configs) != len(params) and 1 not in (len(configs), len(params)):
        raise ValueError(f"envsched_runs pairs configs with params: got {len(configs)} configs and {len(params)} "
                         "params (give equal numbers, or one of either)")
    count = max(len(configs), len(params))
    return (configs * count if len(configs) == 1 else configs), (params * count if len(params) == 1 else params)


def envsched_runs(setup: Setup, configs, seeds, *, steps: int, params=tb.TestbedParams(), excluded=(),
                  vectorize: bool = False, chunk: int | None = None, group_static: bool = True) -> EnvSchedRuns:
    """EnvSched on the testbed for every (setting, seed) in one jitted program: each run is a
    ``lax.scan`` over the steps doing what :func:`run_scheduler` does for "envsched" (the cold
    start kernel, then score pass, progress filter and greedy batch from
    :mod:`envsched_jax.sched.kernels`; the testbed's rollouts under ``rollout_key(key, t)``;
    observe; the simulated GRPO step; the held-out score), and the runs are mapped over.

    How the runs are mapped (``vectorize``):

    - ``False`` (default): ``lax.map``, one run after the other inside the program. Each run is
      compiled unbatched, like the loop's jitted functions, and in practice gives
      :func:`run_scheduler`'s numbers bit for bit, so the same batches at every step
      (``run_scheduler(setup, "envsched", steps=..., seed=..., params=...,
      batch_size=c.batch_size, group_size=c.group_size, scheduler_kwargs={"config": c})``; 48 of
      48 runs over 200 steps at N = 2,550 in ``experiments/bench_sweep.py``). XLA promises no such
      thing: the tests check it step for step. One measure it takes (see ``_envsched_run``): every
      output of EnvSched's jitted step is kept, not only the batch.
    - ``True``: ``vmap``, all runs batched. The same equations, but XLA compiles the batched
      reductions and transcendentals differently (a reference mean over the history, group
      reward sums), so values differ from the loop's in the last bit, ties between tasks resolve
      differently now and then, and runs drift into other batches (30 of 48 runs within 200
      steps at N = 2,550, half of them by step 3). Statistically the same scheduler, not the same
      trajectories: for sweeps where only summaries matter, and for an accelerator, where
      batching is what should pay (not faster than the default on a 2-core CPU).

    Settings: ``configs`` (EnvSchedConfig, or a list) paired with ``params`` (TestbedParams, or a
    list; one of either is repeated). Within one program the settings may differ only in traced
    fields (:meth:`EnvSchedConfig.hyper`: lambda_g, lambda_s, the half-lives, eta, c0,
    lambda_sim, the ridge penalty, the caps, the calibration weights) and in the testbed
    parameters. Static fields (:meth:`EnvSchedConfig.static`: batch and group size, rho through
    B_cov = floor(rho B), which is a shape, the neighbour counts, the history capacity, the
    policies, the dtype) select the program: settings are grouped by them and each group is one
    compiled program, so a sweep over rho is one program per distinct rho and a rho x lambda_sim
    grid a handful of programs, each mapping over its lambda_sim values x seeds
    (``group_static=False`` refuses such a mix instead, naming the fields that differ).

    ``chunk``: at most this many runs (settings x seeds) per program call, to bound memory (every
    run holds its own EnvSched state and per-step intermediates; the last chunk is padded, so
    every call has the same shape and one compilation serves all). ``excluded``: task ids removed
    from both phases, as EnvSched's ``excluded``.

    An infeasible pick cannot raise inside the program: each pick's flag is recorded and the
    first infeasible pick raises :class:`~envsched_jax.sched.errors.SchedulingError` here,
    naming the setting, the seed, the step and the pick.
    """
    from envsched_jax.sched import kernels as K
    from envsched_jax.sched.cold_start import infeasible_message, max_env_size
    from envsched_jax.sched.errors import SchedulerInputError, SchedulingError

    t_start = time.perf_counter()
    configs, params = _settings(configs, params)
    seeds = [int(s) for s in seeds]
    if not seeds or steps < 1:
        raise ValueError("envsched_runs needs at least one seed and steps >= 1")
    graph = setup.graph
    index = {tid: k for k, tid in enumerate(graph.task_ids)}
    unknown = [t for t in excluded if t not in index]
    if unknown:
        raise SchedulerInputError(f"excluded: unknown task id(s) {unknown[:5]}")
    mask = np.zeros(graph.num_nodes, bool)
    mask[[index[t] for t in excluded]] = True
    for config in dict.fromkeys(configs):
        _check_batch_size(setup, config, mask)
    groups: dict[Any, list[int]] = {}
    for k, config in enumerate(configs):
        groups.setdefault(config.static(), []).append(k)
    if len(groups) > 1 and not group_static:
        from envsched_jax.sched.config import STATIC_FIELDS

        first, other = (configs[members[0]] for members in list(groups.values())[:2])
        fields = [f for f in ("rho",) + STATIC_FIELDS if getattr(first, f) != getattr(other, f)]
        raise ValueError(f"envsched_runs(group_static=False): the configs differ in static field(s) {fields} "
                         "(compile-time constants: one program each); vary only traced fields, or allow grouping")
    if len({p.eval_samples for p in params}) > 1:
        raise ValueError("envsched_runs: every TestbedParams must have the same eval_samples (a static field)")

    num_envs = len(graph.env_ids)
    num_tools = [len(set(tools)) for tools in setup.tools_per_env] if setup.tools_per_env else [0] * num_envs
    num_seeds, num_settings = len(seeds), len(configs)
    outputs: dict[str, np.ndarray] = {}
    for static, members in groups.items():
        dtype = jnp.dtype(static.dtype)
        allowed = ~mask
        device_graph = {"s_full": jnp.asarray(graph.s_full, dtype), "s_abs": jnp.asarray(graph.s_abs),
                        "env_index": jnp.asarray(graph.env_index, jnp.int32), "excluded": jnp.asarray(mask),
                        "env_members": jnp.asarray(K.env_member_table(graph.env_index, num_envs)),
                        "random_p": jnp.asarray(allowed / allowed.sum()),
                        "num_tools": jnp.asarray(num_tools, jnp.int32)}
        runs = [(c, s) for c in members for s in range(num_seeds)]
        size = len(runs) if chunk is None else max(1, min(chunk, len(runs)))
        program = functools.partial(_envsched_program, graph=device_graph, structure=setup.structure, static=static,
                                    num_envs=num_envs, max_env_size=max_env_size(graph.env_index), steps=steps,
                                    max_checks=setup.max_checks, vectorize=vectorize)
        for start in range(0, len(runs), size):
            part = runs[start:start + size]
            padded = part + [part[-1]] * (size - len(part))
            hyper = jax.tree.map(lambda *xs: jnp.stack(xs), *[configs[c].hyper() for c, _ in padded])
            out, _ = jax.device_get(program(hyper, stack_params([params[c] for c, _ in padded]),
                                            jnp.asarray([seeds[s] for _, s in padded], jnp.uint32)))
            for name, value in out.items():
                if name not in outputs:
                    outputs[name] = np.zeros((num_settings, num_seeds) + value.shape[1:], value.dtype)
                for r, (c, s) in enumerate(part):
                    outputs[name][c, s] = value[r]

    infeasible = ~outputs["feasible"]
    if infeasible.any():
        c, s, t, k = (int(x) for x in np.argwhere(infeasible)[0])
        config, b = configs[c], configs[c].batch_size
        where = (f"envsched_runs: setting {c} (config fields changed from the defaults: {_changed_fields(config)}), "
                 f"seed {seeds[s]}: ")
        if t == 0:
            reps = len({int(e) for e in np.asarray(graph.env_index)[~mask]})
            raise SchedulingError(where + infeasible_message(k, b, reps))
        phase = PHASES[int(outputs["phase"][c, s, t, k])]
        raise SchedulingError(where + f"step {t}: no eligible task for pick {k + 1} of {b} ({phase} phase); "
                              "run_scheduler with this config and seed names the caps that rule the candidates out"
                              + ("" if config.infeasible == "relax" else "; set infeasible='relax' to relax them"))
    initial = np.array([float(tb.heldout_score(setup.structure, tb.init_state(setup.structure, p), p)) for p in params])
    return EnvSchedRuns(
        configs=configs, params=params, seeds=seeds, batch=outputs["batch"].astype(np.int32),
        phase=outputs["phase"].astype(np.int8),
        relaxed=outputs["relaxed"].astype(np.int8), rewards=outputs["rewards"],
        predicted_variance=outputs["predicted"], environments=outputs["environments"],
        tools=outputs["tools"], heldout=outputs["heldout"], initial_heldout=initial, programs=len(groups),
        seconds=time.perf_counter() - t_start)
