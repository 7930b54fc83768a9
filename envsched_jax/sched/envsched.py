"""The EnvSched scheduler object: jitted kernels from :mod:`.kernels` behind the shared API."""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched import dense_free
from envsched_jax.sched import kernels as K
from envsched_jax.sched.base import (
    CheckpointError,
    InfeasibleBatchError,
    Scheduler,
    SchedulerInputError,
    SchedulingError,
    register_scheduler,
)
from envsched_jax.sched.cold_start import cold_start_batch
from envsched_jax.sched.config import EnvSchedConfig, KernelConfig
from envsched_jax.sched.feasibility import batch_feasibility, eligible_tasks_per_environment, explain_infeasible_pick

LOG = logging.getLogger(__name__)


TRACES = {"score_and_select": 0, "observe": 0}  # trace counters (a test checks nothing recompiles)


@functools.partial(jax.jit, static_argnames=("static", "num_envs"))
def _score_and_select(state, hyper, s_full, env_index, *, static, num_envs):
    """One compiled program per (static config, shapes): score pass, progress filter, greedy
    batch. The hyper-parameters are traced (``hyper``)."""
    TRACES["score_and_select"] += 1
    config = KernelConfig(static, hyper)
    scores = K.score_pass(state, config)
    progress = K.progress_filter(state, env_index, num_envs, config)
    selection = K.select_batch(state, scores.q, progress.excluded, s_full, env_index, config)
    predicted = scores.long.yhat[jnp.maximum(selection.batch, 0), K.V]
    return scores, progress, selection, predicted


@functools.partial(jax.jit, static_argnames=("config",))
def _observe_update(state, batch, rewards, s_full, s_abs_rows, env_index, env_members, *, config):
    """``batch``: ascending node indices (-1 padding allowed); ``s_abs_rows``: their S_abs rows;
    ``env_members``: :func:`.kernels.env_member_table`. ``config``: the static config (observing
    reads no hyper-parameter)."""
    TRACES["observe"] += 1
    s_full_rows = s_full[jnp.maximum(batch, 0)]
    return K.observe_update(state, batch, rewards, s_full_rows, s_abs_rows, env_index, config, env_members)


@functools.partial(jax.jit, static_argnames=("static", "num_envs", "refresh"))
def _score_and_select_dense_free(state, hyper, sim, env_index, *, static, num_envs, refresh):
    """:func:`_score_and_select` with the selection penalty computed lazily from a similarity
    source (:func:`.dense_free.select_batch_lazy`): the same batches."""
    TRACES["score_and_select"] += 1
    config = KernelConfig(static, hyper)
    scores = K.score_pass(state, config)
    progress = K.progress_filter(state, env_index, num_envs, config)
    selection = dense_free.select_batch_lazy(state, scores.q, progress.excluded, sim, env_index, config,
                                             refresh=refresh)
    predicted = scores.long.yhat[jnp.maximum(selection.batch, 0), K.V]
    return scores, progress, selection, predicted


@functools.partial(jax.jit, static_argnames=("config",))
def _observe_update_dense_free(state, batch, rewards, sim, env_index, env_members, *, config):
    """:func:`_observe_update` reading similarities from a source (:func:`.dense_free.observe_update`)."""
    TRACES["observe"] += 1
    return dense_free.observe_update(state, batch, rewards, sim, env_index, env_members, config)


@register_scheduler("envsched")
class EnvSched(Scheduler):
    """EnvSched (the paper's scheduler), on the graph's dense ``s_full`` / ``s_abs`` or, without
    them, on similarities computed from its feature rows (:mod:`.dense_free`): the same batches.

    The constructor checks the batch size against the caps (:mod:`.feasibility`):
    ``self.feasibility.largest`` is the largest B they can always fill on this pool. A larger B
    raises :class:`InfeasibleBatchError` naming the binding cap, or, with
    ``infeasible="relax"``, logs that once and then one aggregated line per step that needed
    relaxing (also in ``metrics()[t].relaxations``).

    Args:
        graph: the pool's static graph.
        config: hyper-parameters (paper defaults); keyword ``overrides`` replace single fields,
            e.g. ``EnvSched(graph, batch_size=16)``.
        seed: seeds the state's PRNG key (EnvSched's selection itself is deterministic).
        tools_per_env: tool names of each environment (``graph.env_ids`` order), for the metrics.
        excluded: task ids removed from both phases (the identifier filter's output).
        similarity: where similarity entries come from. ``"auto"``: the dense matrices when the
            graph has them, else ``"features"``; ``"dense"``: the matrices (an error without
            them); ``"features"``: computed on demand from the graph's feature rows
            (:func:`envsched_jax.graph.feature_rows.graph_similarity`; memory O(N x features),
            nothing N x N); or a similarity source object itself (:mod:`.dense_free`).
        refresh: candidates a dense-free exploitation pick brings up to date per round
            (:func:`.dense_free.select_batch_lazy`; speed only, never the batch).
    """

    name = "envsched"

    def __init__(self, graph: PoolGraph, config: EnvSchedConfig | None = None, *, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None, excluded: Iterable[str] = (),
                 similarity="auto", refresh: int = 8, **overrides):
        config = dataclasses.replace(config or EnvSchedConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        has_dense = graph.s_full is not None and graph.s_abs is not None
        if isinstance(similarity, str) and similarity not in ("auto", "dense", "features"):
            raise ValueError(f"similarity must be 'auto', 'dense', 'features' or a similarity source, "
                             f"got {similarity!r}")
        if similarity == "dense" and not has_dense:
            raise ValueError("similarity='dense' needs the graph's dense S_full and S_abs; build the graph "
                             "with GraphConfig(dense='always') (or 'auto' below dense_max_nodes), or use "
                             "similarity='features'")
        if refresh < 1:
            raise ValueError(f"refresh must be >= 1, got {refresh}")
        if config.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError("dtype='float64' needs jax.config.update('jax_enable_x64', True) first")
        self.config = config
        dtype = jnp.dtype(config.dtype)
        # S_full lives on the device (selection penalty, within-environment neighbours); S_abs is
        # only ever read B rows at a time, so it stays where the graph keeps it (memory or mmap).
        self.dense = similarity == "dense" or (similarity == "auto" and has_dense)
        if self.dense:
            self._s_full = jnp.asarray(graph.s_full, dtype)
            self._s_abs = graph.s_abs
            self._sim = None
        else:
            if isinstance(similarity, str):
                from envsched_jax.graph.feature_rows import graph_similarity

                similarity = graph_similarity(graph)
            self._s_full = self._s_abs = None
            self._sim = similarity
        self._env = jnp.asarray(graph.env_index, jnp.int32)
        self._num_envs = len(graph.env_ids)
        self._env_members = jnp.asarray(K.env_member_table(graph.env_index, self._num_envs))
        excluded = list(excluded)   # iterated twice below
        unknown = [t for t in excluded if t not in self._index]
        if unknown:
            raise SchedulerInputError(f"excluded: unknown task id(s) {unknown[:5]}")
        mask = np.zeros(self.num_nodes, bool)
        mask[[self._index[t] for t in excluded]] = True
        self.feasibility = batch_feasibility(
            eligible_tasks_per_environment(graph.env_index, self._num_envs, mask), config)
        if self.feasibility.binding_cap(config.batch_size) is not None:
            message = self.feasibility.explain(config.batch_size)
            # Relaxing caps cannot conjure tasks: too few eligible tasks fails in either mode.
            if config.infeasible == "error" or config.batch_size > self.feasibility.num_tasks:
                raise InfeasibleBatchError(f"{message}. Use batch_size <= {self.feasibility.largest}"
                                           + ("" if config.batch_size > self.feasibility.num_tasks
                                              else " or infeasible='relax'"))
            LOG.warning("%s; infeasible='relax' relaxes the caps where a pick has no candidate "
                        "(one log line per step that needs it)", message)
        self.state = K.init_state(self.num_nodes, self._num_envs, config, jax.random.PRNGKey(seed))
        self.state = self.state.replace(excluded=jnp.asarray(mask))
        self._hyper = config.hyper()
        if self.dense:
            self._step_fn = functools.partial(_score_and_select, static=config.static(), num_envs=self._num_envs)
            self._observe_fn = functools.partial(_observe_update, config=config.static())
        else:
            self._step_fn = functools.partial(_score_and_select_dense_free, static=config.static(),
                                              num_envs=self._num_envs, refresh=refresh)
            self._observe_fn = functools.partial(_observe_update_dense_free, config=config.static())
        self.last_scores: K.Scores | None = None
        self.last_progress: K.Progress | None = None

    def _select(self, step):
        if step == 0 and self.config.cold_start == "random":
            allowed = ~np.asarray(self.state.excluded)
            if allowed.sum() < self.batch_size:
                raise SchedulingError(f"random cold start: only {int(allowed.sum())} tasks are not excluded, "
                                      f"fewer than batch_size {self.batch_size}")
            key = jax.random.fold_in(self.state.key, 0)
            nodes = np.asarray(jax.random.choice(key, self.num_nodes, (self.batch_size,), replace=False,
                                                 p=jnp.asarray(allowed / allowed.sum())))
            return nodes, ["cold"] * len(nodes), None, {}
        if step == 0:
            nodes, relax = cold_start_batch(self._similarity, self.graph.env_index, self.state.excluded,
                                            self._hyper.cap_step, batch_size=self.batch_size,
                                            relax=self.config.infeasible == "relax", num_envs=self._num_envs)
            return nodes, ["cold"] * len(nodes), None, self._relaxation_summary(step, relax)
        scores, progress, sel, predicted = self._step_fn(self.state, self._hyper, self._similarity, self._env)
        # One transfer for everything the host needs.
        nodes, phase, relaxed, feasible, predicted = jax.device_get(
            (sel.batch, sel.phase, sel.relaxed, sel.feasible, predicted))
        if not feasible.all():
            k = int(np.argmin(feasible))
            coverage = k < self.config.num_coverage
            state = jax.device_get(self.state)
            why = explain_infeasible_pick(
                env_index=np.asarray(self.graph.env_index), excluded=state.excluded, batch_before=nodes[:k],
                window_counts=state.env_recent.sum(axis=0), run=state.run,
                progress_excluded=np.asarray(progress.excluded), coverage=coverage, config=self.config)
            raise SchedulingError(
                f"step {step}: no eligible task for pick {k + 1} of {self.batch_size} "
                f"({'coverage' if coverage else 'exploitation'} phase): {why}"
                + ("" if self.config.infeasible == "relax" else "; set infeasible='relax' to relax them"))
        self.last_scores, self.last_progress = scores, progress
        phases = ["coverage" if p == 1 else "exploitation" for p in phase.tolist()]
        relaxations = [K.RELAXATIONS[lvl] for lvl in relaxed.tolist() if lvl]
        return nodes, phases, predicted.astype(float).tolist(), self._relaxation_summary(step, relaxations)

    @property
    def _similarity(self):
        """What the selection reads: the dense S_full, or the similarity source."""
        return self._s_full if self.dense else self._sim

    def _relaxation_summary(self, step: int, relaxations: list[str]) -> dict[str, int]:
        """Picks per relaxed constraint, logged as one line for the step (none if nothing was
        relaxed)."""
        counts = dict(collections.Counter(relaxations))
        if counts:
            LOG.info("EnvSched step %d: relaxed %d of %d picks (%s)", step, len(relaxations), self.batch_size,
                     ", ".join(f"{name} x{count}" for name, count in counts.items()))
        return counts

    def _observe(self, step, nodes, rewards):
        order = np.argsort(nodes, kind="stable")
        sorted_nodes = nodes[order]
        if not self.dense:
            self.state = self._observe_fn(self.state, sorted_nodes.astype(np.int32),
                                          rewards[order].astype(self.config.dtype), self._sim, self._env,
                                          self._env_members)
            return
        s_abs_rows = np.asarray(self._s_abs[sorted_nodes])   # ascending rows: a cheap mmap read
        self.state = self._observe_fn(self.state, sorted_nodes.astype(np.int32),
                                      rewards[order].astype(self.config.dtype), self._s_full, s_abs_rows,
                                      self._env, self._env_members)

    def _state_arrays(self):
        return {f.name: np.asarray(getattr(self.state, f.name)) for f in dataclasses.fields(self.state)}

    def _load_state_arrays(self, arrays):
        self.state = self.state.replace(**{name: jnp.asarray(value) for name, value in arrays.items()})
        self.last_scores = self.last_progress = None   # they described the replaced state

    def _check_state(self, header, arrays, source):
        if int(arrays["step"]) != header["next_step"]:
            raise CheckpointError(f"{source}: state array 'step' is {int(arrays['step'])} but the header's "
                                  f"next_step is {header['next_step']}")
        # The score pass reads each neighbour list's median at its position (kernels.neighbour_bandwidth):
        # lists must hold valid entries first, in descending similarity, as observe keeps them.
        for name in ("nbr_in", "nbr_cross"):
            nbr, sim = arrays[name], arrays[f"{name}_sim"]
            valid = nbr >= 0
            bad = (~valid[:, :-1] & valid[:, 1:]) | (valid[:, 1:] & (sim[:, 1:] > sim[:, :-1]))
            if bad.any():
                row = int(np.argwhere(bad)[0, 0])
                raise CheckpointError(f"{source}: state array '{name}' row {row} is not in observe's order "
                                      f"(valid entries first, descending '{name}_sim')")
