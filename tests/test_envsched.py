"""EnvSched's JAX kernels against hand-computed values and the plain NumPy reference.

Comparisons run in float64 (``EnvSchedConfig(dtype="float64")``) so that equal quantities tie
exactly in both implementations; a separate test shows float32 (the default) gives the same
batches on a random run."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envsched_jax.sched import EnvSched, EnvSchedConfig, InfeasibleBatchError, SchedulingError
from envsched_jax.sched import envsched as envsched_module
from envsched_jax.sched import kernels as K
from envsched_jax.sched.ablations import ablation_config
from envsched_jax.sched.config import KernelConfig

from reference_envsched import RefConfig, ReferenceEnvSched
from sched_helpers import graph_from_matrices, random_graph, reward_groups
from test_reference_envsched import assert_four_node_details, run_four_node

jax.config.update("jax_enable_x64", True)

F64 = EnvSchedConfig(dtype="float64")


def _ref_config(cfg: EnvSchedConfig) -> RefConfig:
    return RefConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(RefConfig)})


class JaxDetails:
    """Adapter exposing the JAX scheduler with the reference's observe/details interface."""

    def __init__(self, s_full, s_abs, env_index, config=F64):
        # The batch size only matters to select(); observe() here takes any number of nodes.
        # relax: the caps cannot fill every batch of that size on these hand-worked pools (the
        # constructor would refuse it), and nothing here depends on an infeasible pick.
        config = dataclasses.replace(config, batch_size=min(config.batch_size, len(env_index)),
                                     infeasible="relax")
        self.sched = EnvSched(graph_from_matrices(s_full, s_abs, env_index), config)

    def observe(self, t, nodes, rewards):
        """Observe any number of nodes up to the batch size (the kernel ignores -1 padding)."""
        s = self.sched
        order = np.argsort(nodes)
        pad = s.config.batch_size - len(nodes)
        nodes = np.concatenate([np.asarray(nodes)[order], np.full(pad, -1)])
        rewards = np.concatenate([np.asarray(rewards, np.float64)[order], np.zeros((pad, rewards.shape[1]))])
        rows = np.maximum(nodes, 0)
        s.state = envsched_module._observe_update(
            s.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(rewards), s._s_full,
            jnp.asarray(np.asarray(s._s_abs)[rows]), s._env, s._env_members, config=s.config.static())

    def details(self, t):
        s = self.sched
        assert int(s.state.step) == t
        scores, progress, _, _ = envsched_module._score_and_select(
            s.state, s.config.hyper(), s._s_full, s._env, static=s.config.static(), num_envs=s._num_envs)
        return jax_details(scores, progress, s.state, s.config)


def jax_details(scores, progress, state, config) -> dict:
    out = {"nbr_in": np.asarray(state.nbr_in), "nbr_cross": np.asarray(state.nbr_cross),
           "sigma_in": np.asarray(scores.sigma_in), "sigma_cross": np.asarray(scores.sigma_cross),
           "u": np.asarray(scores.u), "q": np.asarray(scores.q), "progress_n": np.asarray(progress.n),
           "progress_est": np.asarray(progress.est), "progress_excluded": np.asarray(progress.excluded)}
    for key in ("bhat", "W", "ybar", "G_in", "G_cross", "P", "yhat", "f"):
        out[key] = {config.h_long: np.asarray(getattr(scores.long, key)),
                    config.h_short: np.asarray(getattr(scores.short, key))}
    out["u_h"] = {config.h_long: np.asarray(scores.long.u), config.h_short: np.asarray(scores.short.u)}
    return out


@pytest.mark.parametrize("progress_fit", ["in_sample", "earlier_steps"])
def test_four_node_example_matches_hand_computation(progress_fit):
    config = dataclasses.replace(F64, progress_fit=progress_fit)
    assert_four_node_details(run_four_node(lambda s_full, s_abs, env: JaxDetails(s_full, s_abs, env, config)),
                             progress_fit)


def test_group_statistics_by_hand():
    rewards = jnp.array([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])
    # m = .5, v = .25, d = .25 / .25 = 1; m = .5, v = 0, d = 0; m = 0, v = 0, d = 0 / max(0, .01) = 0
    np.testing.assert_allclose(K.group_stats(rewards), [[0.25, 0.5, 1.0], [0, 0.5, 0], [0, 0, 0]], atol=1e-12)


def test_percentile_rank_and_quantile_by_hand():
    z = jnp.array([0.3, 0.1, 0.3, 0.9])
    # ranks 2.5 (tied 2nd/3rd), 1, 2.5, 4 -> (r - .5) / 4
    np.testing.assert_allclose(K.percentile_rank(z), [0.5, 0.125, 0.5, 0.875])
    # sorted .1 .3 .3 .9; p = .5 -> position 1.5 -> .3; p = .9 -> position 2.7 -> .3 + .7 * .6 = .72
    np.testing.assert_allclose(K.quantile_map(z, jnp.array([0.5, 0.9, 0.0, 1.0])), [0.3, 0.72, 0.1, 0.9], atol=1e-12)


def test_greedy_selection_by_hand():
    """The reference test's hand-worked 6-node case (see test_reference_envsched.py)."""
    env = np.array([0, 0, 0, 1, 1, 1])
    s_full = np.array([[1.0, 0.3, 0.9, 0.2, 0.3, 0.1], [0.3, 1.0, 0.2, 0.1, 0.9, 0.2],
                       [0.9, 0.2, 1.0, 0.1, 0.1, 0.3], [0.2, 0.1, 0.1, 1.0, 0.2, 0.4],
                       [0.3, 0.9, 0.1, 0.2, 1.0, 0.3], [0.1, 0.2, 0.3, 0.4, 0.3, 1.0]])
    q = jnp.array([0.95, 0.60, 0.55, 0.90, 0.85, 0.50])
    for lambda_sim, expected in ((0.08, [4, 2, 3, 0]), (0.0, [4, 1, 0, 3])):
        impl = JaxDetails(s_full, s_full, env, dataclasses.replace(F64, batch_size=4, lambda_sim=lambda_sim))
        impl.observe(0, [0, 3], np.full((2, 4), 0.5))
        s = impl.sched
        sel = K.select_batch(s.state, q, jnp.zeros(6, bool), s._s_full, s._env, s.config)
        assert np.asarray(sel.batch).tolist() == expected
        assert np.asarray(sel.phase).tolist() == [1, 1, 2, 2]


def _run_both(graph, config, steps, seed, excluded=()):
    """Run JAX EnvSched and the reference side by side; compare every step."""
    sched = EnvSched(graph, config, excluded=[graph.task_ids[i] for i in excluded])
    ref = ReferenceEnvSched(np.asarray(graph.s_full, np.float64), np.asarray(graph.s_abs, np.float64),
                            graph.env_index, _ref_config(config), excluded=excluded)
    rng = np.random.default_rng(seed)
    excluded_steps = 0
    for t in range(steps):
        if t > 0:
            got, want = jax_details(*envsched_module._score_and_select(
                sched.state, config.hyper(), sched._s_full, sched._env, static=config.static(),
                num_envs=sched._num_envs)[:2], sched.state, config), ref.details(t)
            for key in ("u", "q", "sigma_in", "sigma_cross", "progress_est"):
                np.testing.assert_allclose(got[key], want[key], atol=1e-9, err_msg=f"step {t} {key}")
            for key in ("nbr_in", "nbr_cross", "progress_n", "progress_excluded"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"step {t} {key}")
            for key in ("W", "yhat", "f", "u_h"):
                for h in (config.h_long, config.h_short):
                    np.testing.assert_allclose(got[key][h], want[key][h], atol=1e-9, err_msg=f"step {t} {key}")
        ids = sched.select(t)
        nodes, phases = ref.select(t)
        assert [sched._index[i] for i in ids] == nodes, f"step {t}"
        assert sched.metrics()[-1].phases == phases
        rewards = reward_groups(rng, config.batch_size, config.group_size)
        sched.observe(t, ids, rewards)
        ref.observe(t, nodes, rewards)
        excluded_steps += t > 0 and bool(want["progress_excluded"].any())
    return excluded_steps


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), rho=st.sampled_from([0.0, 0.5, 1.0]),
       window=st.sampled_from([3, 6, 128]), steps=st.integers(3, 9),
       progress_fit=st.sampled_from(["earlier_steps", "in_sample"]))
def test_agrees_with_numpy_reference(seed, rho, window, steps, progress_fit):
    graph = random_graph(np.random.default_rng(seed), num_envs=5, per_env=8)
    config = dataclasses.replace(F64, batch_size=8, group_size=4, rho=rho, step_capacity=window,
                                 cap_window=5, progress_fit=progress_fit)
    _run_both(graph, config, steps, seed)


@pytest.mark.parametrize("progress_fit", ["earlier_steps", "in_sample"])
def test_agrees_with_reference_where_the_progress_filter_excludes(progress_fit):
    """Long enough for nodes to reach three scored transitions under either rule."""
    graph = random_graph(np.random.default_rng(21), num_envs=3, per_env=5)
    config = dataclasses.replace(F64, batch_size=6, group_size=4, cap_consecutive=16, cap_window=16,
                                 progress_fit=progress_fit)
    assert _run_both(graph, config, 16, seed=21) > 0


def test_agrees_with_reference_with_exclusions_and_relaxation():
    graph = random_graph(np.random.default_rng(7), num_envs=4, per_env=6)
    config = dataclasses.replace(F64, batch_size=10, group_size=4, cap_step=3, cap_window=6,
                                 infeasible="relax")
    _run_both(graph, config, 8, seed=7, excluded=(0, 5, 13))


def test_jitted_and_not_give_the_same_batches():
    graph = random_graph(np.random.default_rng(3), num_envs=4, per_env=6, dtype=np.float32)
    config = EnvSchedConfig(batch_size=6, group_size=4)

    def run():
        sched = EnvSched(graph, config)
        rng = np.random.default_rng(0)
        out = []
        for t in range(4):
            ids = sched.select(t)
            out.append(ids)
            sched.observe(t, ids, reward_groups(rng, 6, 4))
        return out

    jitted = run()
    with jax.disable_jit():
        assert run() == jitted


def test_float32_default_matches_float64_batches():
    g64 = random_graph(np.random.default_rng(11), num_envs=6, per_env=10)
    g32 = graph_from_matrices(g64.s_full.astype(np.float32), g64.s_abs.astype(np.float32), g64.env_index)
    runs = []
    for graph, config in ((g64, F64), (g32, EnvSchedConfig())):
        sched = EnvSched(graph, dataclasses.replace(config, batch_size=12, group_size=4))
        rng = np.random.default_rng(1)
        batches = []
        for t in range(8):
            ids = sched.select(t)
            batches.append(ids)
            sched.observe(t, ids, reward_groups(rng, 12, 4))
        runs.append(batches)
    assert runs[0] == runs[1]


def test_second_step_does_not_recompile():
    graph = random_graph(np.random.default_rng(5), num_envs=4, per_env=7, dtype=np.float32)
    sched = EnvSched(graph, EnvSchedConfig(batch_size=6, group_size=4, k_within=5))  # a fresh config
    rng = np.random.default_rng(0)
    for t in range(2):
        ids = sched.select(t)
        sched.observe(t, ids, reward_groups(rng, 6, 4))
    before = dict(envsched_module.TRACES)
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), sched.state)
    for t in range(2, 6):
        ids = sched.select(t)
        sched.observe(t, ids, reward_groups(rng, 6, 4))
        assert jax.tree.map(lambda a: (a.shape, a.dtype), sched.state) == shapes
    assert envsched_module.TRACES == before


def test_hyper_parameters_are_traced_one_compilation_for_three_lambda_sim():
    """Only shapes are static: three lambda_sim values (and other float and integer settings) share
    one compiled step, and each still changes what is selected as the eager kernels do."""
    graph = random_graph(np.random.default_rng(8), num_envs=5, per_env=8, dtype=np.float32)
    base = EnvSchedConfig(batch_size=6, group_size=4, k_within=3, k_cross=4)   # shapes no other test uses
    configs = {lam: dataclasses.replace(base, lambda_sim=lam, eta=0.25 * k, c0=8.0 + k, calibration=(13 - k, 7 + k))
               for k, lam in enumerate((0.0, 0.08, 0.5))}

    def run(config):
        sched = EnvSched(graph, config)
        rng = np.random.default_rng(0)
        batches = []
        for t in range(4):
            batches.append(sched.select(t))
            sched.observe(t, batches[-1], reward_groups(rng, 6, 4))
        return batches

    before = dict(envsched_module.TRACES)
    runs = {lam: run(config) for lam, config in configs.items()}
    traced = {name: envsched_module.TRACES[name] - before[name] for name in before}
    # at most one trace each (none if an earlier test compiled these shapes): nothing recompiled
    assert max(traced.values()) <= 1, f"a hyper-parameter change recompiled: {traced}"
    assert runs[0.0] != runs[0.5]
    with jax.disable_jit():   # the traced values are the ones the eager kernels use
        for lam, config in configs.items():
            assert run(config) == runs[lam], lam


def test_infeasible_batch_size_is_refused_up_front_or_relaxed():
    graph = random_graph(np.random.default_rng(1), num_envs=2, per_env=10, dtype=np.float32)
    with pytest.raises(InfeasibleBatchError) as info:   # 2 environments x 2 at the cold start < 8
        EnvSched(graph, EnvSchedConfig(batch_size=8, group_size=4, cap_step=3))
    assert ("batch_size 8 is infeasible: the cold start (step 0) takes at most 2 tasks per environment: "
            "4 from 2 environments < B = 8") in str(info.value)
    assert "is 4 (2 environments, 20 eligible tasks; C1=3, C3=11, Ctask=2" in str(info.value)
    assert isinstance(info.value, SchedulingError) and isinstance(info.value, ValueError)
    relaxed = EnvSched(graph, EnvSchedConfig(batch_size=8, group_size=4, cap_step=3, infeasible="relax"))
    ids = relaxed.select(0)
    # Picks 5-6 lift the cold start's two per environment to C1 = 3, picks 7-8 drop C1 as well.
    assert len(set(ids)) == 8 and relaxed.metrics()[-1].relaxations == {"cold_two_per_env": 2, "cap_step": 2}
    assert relaxed.metrics()[-1].summary()["relaxations"] == 4


def test_step_error_names_the_caps_and_leaves_state_unchanged():
    """At a feasible B only the data can block a pick; here every task is made to look picked in
    the last two steps, so cap Ctask rules all of them out."""
    graph = random_graph(np.random.default_rng(1), num_envs=2, per_env=10, dtype=np.float32)
    sched = EnvSched(graph, EnvSchedConfig(batch_size=4, group_size=4))
    ids = sched.select(0)
    sched.observe(0, ids, np.full((4, 4), 0.5))
    sched.state = sched.state.replace(run=jnp.full(20, 2, jnp.int32))
    before = sched._state_arrays()
    with pytest.raises(SchedulingError) as info:
        sched.select(1)
    assert str(info.value) == (
        "step 1: no eligible task for pick 1 of 4 (coverage phase): of the 20 tasks neither in the batch "
        "nor excluded, cap Ctask (2 consecutive steps) rules out 20 (a task can be ruled out by several); "
        "set infeasible='relax' to relax them")
    after = sched._state_arrays()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sort_values_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=200), [0.0, -0.0, 1e-30, -1e-30, 3.5, 3.5, -7.25]]).astype(dtype)
    got = np.asarray(K.sort_values(jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.sort(x))


def test_paper_defaults_on_a_generated_pool_respect_phases_and_caps():
    """B = 64 = 32 coverage + 32 exploitation on a 51 x 50 pool; the per-step (C1), rolling
    three-step (C3) and consecutive (Ctask) caps hold at every step."""
    from envsched_jax.graph.build import build_graph
    from envsched_jax.pool.generator import generate_pool

    pool = generate_pool(51, 50, seed=2)
    graph = build_graph(pool)
    config = EnvSchedConfig()
    sched = EnvSched(graph, config)
    env = graph.env_index
    rng = np.random.default_rng(0)
    history = []
    for t in range(12):
        ids = sched.select(t)
        nodes = np.array([sched._index[i] for i in ids])
        assert len(set(nodes.tolist())) == 64
        phases = sched.metrics()[-1].phases
        if t == 0:
            assert phases == ["cold"] * 64
            assert np.bincount(env[nodes]).max() <= 2 and len(set(env[nodes].tolist())) == 51
        else:
            assert phases == ["coverage"] * 32 + ["exploitation"] * 32
            assert np.bincount(env[nodes]).max() <= config.cap_step
            window = np.concatenate([nodes] + history[-2:])
            assert np.bincount(env[window]).max() <= config.cap_window
            if len(history) >= 2:
                assert not (set(nodes.tolist()) & set(history[-1].tolist()) & set(history[-2].tolist()))
        history.append(nodes)
        sched.observe(t, ids, reward_groups(rng, 64, 8))


@pytest.mark.parametrize("name", ["within_only", "cross_only", "coverage_only", "exploitation_only", "k3_12"])
def test_ablations_agree_with_reference(name):
    """Each Table 3 ablation is a config of the same kernels and matches the reference."""
    graph = random_graph(np.random.default_rng(21), num_envs=5, per_env=8)
    config = ablation_config(name, dataclasses.replace(F64, batch_size=8, group_size=4, cap_window=5))
    _run_both(graph, config, 6, seed=21)


def test_relation_ablations_use_one_relation():
    graph = random_graph(np.random.default_rng(5), num_envs=4, per_env=6, dtype=np.float64)
    base = dataclasses.replace(F64, batch_size=6, group_size=4)
    sched = EnvSched(graph, base)
    rng = np.random.default_rng(5)
    for t in range(3):
        ids = sched.select(t)
        sched.observe(t, ids, reward_groups(rng, 6, 4))
    # The same state scored under each relation setting.
    full, within, cross = (K.score_pass(sched.state, ablation_config(name, base)).long
                           for name in ("full", "within_only", "cross_only"))
    np.testing.assert_allclose(within.P, full.G_in, atol=1e-12)
    np.testing.assert_allclose(cross.P, full.G_cross, atol=1e-12)
    np.testing.assert_allclose(full.P, 0.5 * (full.G_in + full.G_cross), atol=1e-12)
    assert not np.allclose(within.P, cross.P)
    with pytest.raises(ValueError, match="unknown ablation 'nope'"):
        ablation_config("nope")
    with pytest.raises(ValueError, match="relations"):
        EnvSchedConfig(relations="both_ways")


def test_random_cold_start_depends_on_the_seed_and_respects_exclusions():
    graph = random_graph(np.random.default_rng(2), num_envs=4, per_env=6, dtype=np.float32)
    excluded = list(graph.task_ids[:5])
    config = EnvSchedConfig(batch_size=6, group_size=4, cold_start="random")
    batches = [EnvSched(graph, config, seed=s, excluded=excluded).select(0) for s in (0, 0, 1)]
    assert batches[0] == batches[1] and batches[0] != batches[2]
    assert all(len(set(b)) == 6 and not set(b) & set(excluded) for b in batches)
    static = EnvSched(graph, EnvSchedConfig(batch_size=6, group_size=4)).select(0)
    assert static == EnvSched(graph, EnvSchedConfig(batch_size=6, group_size=4), seed=1).select(0)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_equal_eq5_scores_tie_to_the_lower_index(jit):
    """q omega - lambda_sim s: q = 2341/2400 at similarity 0.75 and q = 2365/2400 at 0.875 score
    the same at lambda_sim = 0.08 (in float64 as NumPy evaluates it), so the lower index wins.
    A fused multiply-add under jit used to pick the higher one."""
    cfg = EnvSchedConfig(batch_size=2, group_size=4, rho=0.0, k_within=2, k_cross=2, dtype="float64",
                         lambda_sim=0.08)
    q = np.array([0.1, 2341 / 2400, 0.2, 2365 / 2400, 0.99, 0.3])
    s_full = np.eye(6)
    s_full[4, 1] = s_full[1, 4] = 0.75
    s_full[4, 3] = s_full[3, 4] = 0.875
    assert q[1] - 0.08 * 0.75 == q[3] - 0.08 * 0.875   # the tie, as NumPy computes it
    state = K.init_state(6, 2, cfg, jax.random.PRNGKey(0))
    env = jnp.asarray([0, 0, 0, 1, 1, 1], jnp.int32)

    def pick(state, hyper, q, s):
        return K.select_batch(state, q, jnp.zeros(6, bool), s, env, KernelConfig(cfg.static(), hyper)).batch

    args = (state, cfg.hyper(), jnp.asarray(q), jnp.asarray(s_full))
    if jit:
        batch = jax.jit(pick)(*args)
    else:
        with jax.disable_jit():
            batch = pick(*args)
    assert np.asarray(batch).tolist() == [4, 1]


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_one_neighbour_rows_weigh_their_neighbour_exactly_alike(jit):
    """With one neighbour, sigma = delta, so delta / sigma = 1 and a_ij = exp(-1/2) clip(W_j)
    whatever delta is: equal inputs give bitwise-equal estimates (a division by a broadcast,
    rewritten by XLA as a reciprocal product, used to give 0.9999999999999999 in some rows)."""
    rng = np.random.default_rng(0)
    n = 2000
    sim = np.zeros((n, 4))
    sim[:, 0] = rng.uniform(0.0, 0.95, n)
    nbr = np.full((n, 4), -1)
    nbr[:, 0] = 0

    def estimate(sim, nbr):
        sigma = K.neighbour_bandwidth(sim, nbr >= 0)
        return K.relation_estimate(nbr, sim, sigma, jnp.full(n, 0.7), jnp.full((n, 3), 0.3), jnp.zeros(3), 2.0)

    args = (jnp.asarray(sim), jnp.asarray(nbr))
    if jit:
        g = np.asarray(jax.jit(estimate)(*args))
    else:
        with jax.disable_jit():
            g = np.asarray(estimate(*args))
    assert np.unique(g[:, 0]).size == 1
    a = np.exp(-0.5) * 0.7
    np.testing.assert_allclose(g[0, 0], a * 0.3 / (a + 2.0), rtol=1e-15)


def test_env_member_table_lists_each_environment_in_ascending_order():
    env_index = np.array([2, 0, 2, 1, 0, 2], np.int32)
    table = K.env_member_table(env_index, 4)
    np.testing.assert_array_equal(table, [[1, 4, -1], [3, -1, -1], [0, 2, 5], [-1, -1, -1]])


@pytest.mark.parametrize("seed", [0, 1])
def test_within_lists_updated_on_environment_rows_equal_the_full_pass(seed):
    """Observing with the environment member table (the scheduler's path) leaves exactly the
    neighbour lists (and every other state field) of the pass over all N rows, step by step,
    with unequal environment sizes, padding in the batch and repeated observations."""
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, num_envs=6, per_env=7, dtype=np.float32)
    keep = np.flatnonzero(~((graph.env_index == 2) & (np.arange(graph.num_nodes) % 7 >= 3)))  # env 2 smaller
    graph = graph_from_matrices(graph.s_full[np.ix_(keep, keep)], graph.s_abs[np.ix_(keep, keep)],
                                graph.env_index[keep])
    config = EnvSchedConfig(batch_size=8, group_size=4, step_capacity=16)
    static = config.static()
    n = graph.num_nodes
    members = jnp.asarray(K.env_member_table(graph.env_index, len(graph.env_ids)))
    env = jnp.asarray(graph.env_index)
    s_full, s_abs = jnp.asarray(graph.s_full), jnp.asarray(graph.s_abs)
    full = local = K.init_state(n, len(graph.env_ids), static, jax.random.PRNGKey(0))
    observe = jax.jit(K.observe_update, static_argnames=("config",))
    for t in range(12):
        size = int(rng.integers(3, 9))
        batch = np.full(8, -1, np.int32)
        batch[:size] = np.sort(rng.choice(n, size, replace=False))
        rows = np.maximum(batch, 0)
        rewards = jnp.asarray(reward_groups(rng, 8, 4), jnp.float32)
        args = (batch, rewards, s_full[rows], s_abs[rows], env)
        full = observe(full, *args, config=static)
        local = observe(local, *args, config=static, env_members=members)
        for name in ("nbr_in", "nbr_in_sim", "nbr_cross", "nbr_cross_sim", "num_obs", "obs_node"):
            np.testing.assert_array_equal(np.asarray(getattr(local, name)), np.asarray(getattr(full, name)),
                                          err_msg=f"step {t}: {name}")
    assert (np.asarray(full.nbr_in) >= 0).sum() > n   # the lists really filled up


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_insert_candidates_on_changed_rows_equals_the_plain_pass(monkeypatch, seed):
    """The compacted update of cross-environment lists (pools above 4 x _COMPACT_ROWS; here the
    threshold is lowered to 8 rows so that a 100-node case takes it, in many chunks) leaves the
    lists that inserting every candidate into every row leaves: full and partly filled lists,
    tied similarities (ties -> lower index), candidates a row may not take."""
    rng = np.random.default_rng(seed)
    n, k, c = 100, 5, 12

    def plain(nbr, sim, cand, cand_sim, ok, order, count):
        for j in range(count):
            b = int(order[j])
            nbr, sim = K._insert(nbr, sim, cand[b], cand_sim[b], ok[b])
        return nbr, sim

    # Lists from a first round of random candidates (some rows stay short).
    nbr = jnp.full((n, k), -1, jnp.int32)
    sim = jnp.zeros((n, k), jnp.float32)
    first = rng.choice(n, 6, replace=False)
    for cand in first:
        row_ok = jnp.asarray(rng.random(n) < 0.6)
        nbr, sim = K._insert(nbr, sim, int(cand), jnp.asarray(np.round(rng.random(n), 1), jnp.float32), row_ok)
    cand = np.sort(rng.choice(np.setdiff1d(np.arange(n), first), c, replace=False)).astype(np.int32)
    cand_sim = jnp.asarray(np.round(rng.random((c, n)), 1), jnp.float32)     # coarse: many ties
    ok = jnp.asarray(rng.random((c, n)) < 0.8)
    order = jnp.asarray(rng.permutation(c).astype(np.int32))
    count = 9
    want = plain(nbr, sim, jnp.asarray(cand), cand_sim, ok, order, count)
    monkeypatch.setattr(K, "_COMPACT_ROWS", 8)
    got = jax.jit(lambda *a: K._insert_candidates(*a))(nbr, sim, jnp.asarray(cand), cand_sim, ok, order,
                                                         jnp.asarray(count))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    assert not np.array_equal(np.asarray(want[0]), np.asarray(nbr))   # the candidates changed lists
    assert ((np.asarray(nbr) < 0).any(axis=1)).sum() > 20              # many rows had room
