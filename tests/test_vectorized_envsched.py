"""The vectorised NumPy baseline (tests/vectorized_envsched.py) against the JAX scheduler and the
loop reference, and Random's jitted selection.

The benchmark times the vectorised module as the fair CPU baseline of the JAX kernels, so it
must do the same work: every step's batch, phases and relaxations equal, and per-node u, q,
sigma, the per-half-life estimates and the progress filter equal to 1e-9 in float64, over
multi-step runs. Few static configurations (each compiles the JAX step once, several seconds on
a 2-core machine), each varying several structural choices at once."""

from __future__ import annotations

import collections
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from envsched_jax.sched import EnvSched, EnvSchedConfig, RandomScheduler
from envsched_jax.sched.random import random_batch

from reference_envsched import RefConfig, ReferenceEnvSched
from sched_helpers import random_graph, reward_groups
from vectorized_envsched import VectorizedEnvSched, doubled_rank, percentile_rank, quantile_map

jax.config.update("jax_enable_x64", True)

F64 = EnvSchedConfig(dtype="float64")
TOL = 1e-9


def _jax_scores(sched: EnvSched, config: EnvSchedConfig) -> dict:
    """What the JAX scheduler's last select computed, under the vectorised module's names."""
    scores, progress, state = sched.last_scores, sched.last_progress, sched.state
    out = {"u": scores.u, "q": scores.q, "sigma_in": scores.sigma_in, "sigma_cross": scores.sigma_cross,
           "progress_n": progress.n, "progress_est": progress.est, "progress_excluded": progress.excluded,
           "nbr_in": state.nbr_in, "nbr_cross": state.nbr_cross}
    out = {key: np.asarray(value) for key, value in out.items()}
    for key in ("W", "ybar", "yhat", "f"):
        out[key] = {config.h_long: np.asarray(getattr(scores.long, key)),
                    config.h_short: np.asarray(getattr(scores.short, key))}
    out["u_h"] = {config.h_long: np.asarray(scores.long.u), config.h_short: np.asarray(scores.short.u)}
    return out


def _assert_same_scores(got: dict, want: dict, config, where: str) -> None:
    """``got``: the vectorised module's scores plus its neighbour lists; ``want``: the same names
    from the JAX scheduler or the loop reference."""
    for key in ("u", "q", "sigma_in", "sigma_cross", "progress_est"):
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=TOL, err_msg=f"{where} {key}")
    for key in ("nbr_in", "nbr_cross", "progress_n", "progress_excluded"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{where} {key}")
    for key in ("W", "ybar", "yhat", "f", "u_h"):
        for h in (config.h_long, config.h_short):
            value = got[key][h]
            value = np.stack(value, axis=1) if isinstance(value, list) else value   # columns v, m, d
            np.testing.assert_allclose(value, want[key][h], rtol=0, atol=TOL, err_msg=f"{where} {key} h={h}")


def _run_against_jax(graph, config: EnvSchedConfig, steps: int, seed: int, excluded=()) -> dict:
    """Run the JAX scheduler and the vectorised one side by side; compare every step. Returns
    counts of what the run exercised (progress-filter exclusions, relaxed picks)."""
    sched = EnvSched(graph, config, excluded=[graph.task_ids[i] for i in excluded])
    vec = VectorizedEnvSched(graph.s_full, graph.s_abs, graph.env_index, config, excluded=excluded)
    rng = np.random.default_rng(seed)
    seen = collections.Counter()
    for t in range(steps):
        ids = sched.select(t)
        nodes, phases = vec.select(t)
        assert nodes == [sched._index[i] for i in ids], f"step {t}: batches differ"
        metric = sched.metrics()[-1]
        assert phases == metric.phases, f"step {t}"
        assert dict(collections.Counter(vec.relaxations)) == metric.relaxations, f"step {t}"
        if t > 0:
            got = dict(vec.last, nbr_in=vec.nbr_in, nbr_cross=vec.nbr_cross)
            _assert_same_scores(got, _jax_scores(sched, config), config, f"step {t}")
            seen["progress_excluded"] += int(got["progress_excluded"].sum())
        seen["relaxed"] += len(vec.relaxations)
        rewards = reward_groups(rng, config.batch_size, config.group_size)
        sched.observe(t, ids, rewards)
        vec.observe(t, nodes, rewards)
    return seen


# Three static configurations (shapes, rho, relations, history window, infeasible policy and the
# progress fit are compile-time choices of the JAX step); the hyper-parameters vary freely.
# Not eta = 1: then u = u_short for every declining node, so nodes with equal u_short but different
# u_long tie in exact arithmetic, and whether u_long - (u_long - u_short) splits the tie in floating
# point depends on the last bit of u_short, which differs by an ulp between the kernels and NumPy
# (summation order in yhat). Seed 5 of "cover_cross_relax" with eta = 1: the kernels tie two nodes'
# q, NumPy (this module and the loop reference alike) splits them by one rank; the batches agree.
BASE = dataclasses.replace(F64, batch_size=8, group_size=4, cap_window=5)
TIGHT = dict(cap_step=2, cap_window=3, cap_consecutive=1, infeasible="relax")   # caps that must relax
CONFIGS = {
    "paper_rules": BASE,
    "exploit_within_relax": dataclasses.replace(BASE, rho=0.0, relations="within", step_capacity=6,
                                                lambda_sim=0.3, calibration=(1, 1), **TIGHT),
    "cover_cross_relax": dataclasses.replace(
        BASE, rho=1.0, relations="cross", step_capacity=3, k_within=3, h_short=1.0, eta=0.75,
        progress_fit="in_sample", **TIGHT),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_jax_paper_rules(seed):
    """rho = 0.5, both relations, the default progress fit, a window longer than the run."""
    graph = random_graph(np.random.default_rng(seed), num_envs=5, per_env=8)
    _run_against_jax(graph, CONFIGS["paper_rules"], steps=12, seed=seed)


def test_agrees_with_jax_exploitation_only_within_relaxed_with_exclusions():
    """rho = 0 (every pick exploitation), within-environment relation only, a 6-step window,
    caps tight enough that picks relax, identifier-excluded nodes, lambda_sim 0.3 and 1:1
    calibration; the progress filter excludes nodes on the way."""
    config = CONFIGS["exploit_within_relax"]
    seen = collections.Counter()
    for seed in (3, 4):
        graph = random_graph(np.random.default_rng(seed), num_envs=5, per_env=8)
        seen += _run_against_jax(graph, config, steps=14, seed=seed, excluded=(1, 17, 30))
    assert seen["relaxed"] > 0 and seen["progress_excluded"] > 0, seen


def test_agrees_with_jax_coverage_only_cross_relaxed():
    """rho = 1 (every pick coverage), cross-environment relation only, a 3-step window, the
    in-sample progress fit, tight caps."""
    config = CONFIGS["cover_cross_relax"]
    seen = collections.Counter()
    for seed in (5, 6):
        graph = random_graph(np.random.default_rng(seed), num_envs=5, per_env=8)
        seen += _run_against_jax(graph, config, steps=10, seed=seed)
    assert seen["relaxed"] > 0, seen


def test_agrees_with_loop_reference():
    """The readable loop reference and the vectorised module on a small run: the same batches and
    the same per-node details (no JAX involved)."""
    graph = random_graph(np.random.default_rng(9), num_envs=4, per_env=6)
    config = dataclasses.replace(F64, batch_size=8, group_size=4, cap_window=6, step_capacity=5, infeasible="relax")
    ref_config = RefConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(RefConfig)
                              if hasattr(config, f.name)})
    ref = ReferenceEnvSched(graph.s_full, graph.s_abs, graph.env_index, ref_config, excluded=(2,))
    vec = VectorizedEnvSched(graph.s_full, graph.s_abs, graph.env_index, config, excluded=(2,))
    rng = np.random.default_rng(9)
    for t in range(9):
        if t > 0:
            want = ref.details(t)
        nodes, phases = vec.select(t)
        assert (nodes, phases) == ref.select(t), f"step {t}"
        if t > 0:
            _assert_same_scores(dict(vec.last, nbr_in=vec.nbr_in, nbr_cross=vec.nbr_cross), want, config, f"step {t}")
        rewards = reward_groups(rng, config.batch_size, config.group_size)
        ref.observe(t, nodes, rewards)
        vec.observe(t, nodes, rewards)


def test_float32_gives_the_float64_batches():
    """The benchmark runs the module in float32 (the scheduler's default dtype)."""
    graph = random_graph(np.random.default_rng(11), num_envs=6, per_env=10)
    runs = []
    for dtype in ("float64", "float32"):
        config = dataclasses.replace(EnvSchedConfig(dtype=dtype), batch_size=12, group_size=4)
        vec = VectorizedEnvSched(graph.s_full.astype(dtype), graph.s_abs.astype(dtype), graph.env_index, config)
        rng = np.random.default_rng(1)
        batches = []
        for t in range(8):
            nodes, _ = vec.select(t)
            batches.append(nodes)
            vec.observe(t, nodes, reward_groups(rng, 12, 4))
        assert vec.last["u"].dtype == np.dtype(dtype)
        runs.append(batches)
    assert runs[0] == runs[1]


def test_ranks_and_quantiles_are_scipys_and_numpys():
    from scipy.stats import rankdata

    rng = np.random.default_rng(0)
    for z in (np.round(rng.random(500), 2), rng.random(501), np.zeros(7), np.array([0.3, 0.1, 0.3, 0.9])):
        ranks, sorted_z = doubled_rank(z)
        np.testing.assert_array_equal(ranks, 2 * rankdata(z, method="average"))
        np.testing.assert_array_equal(sorted_z, np.sort(z))
        p = rng.random(len(z))
        np.testing.assert_allclose(quantile_map(sorted_z, p), np.quantile(z, p), rtol=0, atol=1e-15)
    np.testing.assert_allclose(percentile_rank(np.array([0.3, 0.1, 0.3, 0.9])), [0.5, 0.125, 0.5, 0.875])


def test_imports_neither_jax_nor_the_package():
    """The baseline measures NumPy and SciPy alone."""
    code = ("import json, sys; sys.path.insert(0, 'tests'); import vectorized_envsched; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'envsched_jax'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# -- Random: one jitted selection ---------------------------------------------------------------

# Batches of the eager implementation (jax.random.choice called per step, commit 91c080e):
# random_graph(rng 0, 6 x 10), B = 8, seed 3, steps 0-2.
EAGER_RANDOM_BATCHES = [["t12", "t50", "t6", "t14", "t7", "t30", "t2", "t58"],
                        ["t53", "t51", "t43", "t10", "t16", "t39", "t6", "t11"],
                        ["t54", "t17", "t26", "t53", "t33", "t55", "t11", "t46"]]


def test_random_selection_is_one_compiled_program_with_the_eager_batches():
    graph = random_graph(np.random.default_rng(0), num_envs=6, per_env=10, dtype=np.float32)
    sched = RandomScheduler(graph, batch_size=8, group_size=2, seed=3)
    batches = []
    for t in range(6):
        batches.append(sched.select(t))
        sched.observe(t, batches[-1], np.zeros((8, 2)))
        if t == 0:
            compiled = random_batch._cache_size()
    assert batches[:3] == EAGER_RANDOM_BATCHES
    assert random_batch._cache_size() == compiled   # later steps reuse the step-0 program
    key = jax.random.PRNGKey(3)
    for t in range(6):   # the jitted draw is the eager one
        eager = np.asarray(jax.random.choice(jax.random.fold_in(key, t), 60, (8,), replace=False))
        assert [graph.task_ids[i] for i in eager] == batches[t]
    # a restored state continues with the same draws
    restored = RandomScheduler(graph, batch_size=8, group_size=2, seed=0)
    fresh = RandomScheduler(graph, batch_size=8, group_size=2, seed=3)
    for t in range(2):
        fresh.observe(t, fresh.select(t), np.zeros((8, 2)))
    restored.load_state_dict(fresh.state_dict())
    assert restored.select(2) == batches[2]
