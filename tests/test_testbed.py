"""The learning-dynamics testbed: reward shape, learning rule, transfer, expectations, vmap,
agreement of the vmapped Random run with the scheduler API, and the frozen calibration."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envsched_jax.sim import calibration as C
from envsched_jax.sim import testbed as tb
from envsched_jax.sim.runner import SetupConfig, make_setup, random_runs, run_scheduler

TINY = SetupConfig(train_envs=6, heldout_envs=2, tasks_per_env=10)


@pytest.fixture(scope="module")
def setup():
    return make_setup(TINY)


def test_structure(setup):
    s = setup.structure
    assert s.num_train == 60 and int(s.heldout.sum()) == 20
    assert not bool(s.heldout[:60].any()) and bool(s.heldout[60:].all())
    np.testing.assert_allclose(np.asarray(s.skills).sum(1), 1.0, atol=1e-6)  # every task has skills
    assert any(n.startswith("gate:") for n in s.skill_names) and any(n.startswith("op:") for n in s.skill_names)
    with pytest.raises(ValueError, match="held-out environments"):
        tb.build_structure(setup.pool, ["no-such-env"])


def test_rewards_are_gated_partial_credit(setup):
    params = tb.TestbedParams()
    state = tb.init_state(setup.structure, params)
    nodes = jnp.arange(setup.structure.num_train, dtype=jnp.int32)
    r = np.asarray(tb.rollout(setup.structure, state, params, nodes, jax.random.PRNGKey(0), group_size=8,
                              max_checks=setup.max_checks))
    assert r.shape == (60, 8) and r.min() >= 0 and r.max() <= 1
    n = np.asarray(setup.structure.num_checks)[:60]
    np.testing.assert_allclose(r * n[:, None], np.round(r * n[:, None]), atol=1e-5)  # multiples of 1/n
    # A hopeless policy fails everything; a perfect one passes everything.
    low = state.replace(c_env=state.c_env - 50.0)
    high = state.replace(c_env=state.c_env + 50.0)
    kw = dict(group_size=8, max_checks=setup.max_checks)
    assert np.asarray(tb.rollout(setup.structure, low, params, nodes, jax.random.PRNGKey(1), **kw)).max() == 0.0
    assert np.asarray(tb.rollout(setup.structure, high, params, nodes, jax.random.PRNGKey(1), **kw)).min() == 1.0


def test_learning_needs_reward_spread_and_transfers_through_skills(setup):
    params = tb.TestbedParams()
    s = setup.structure
    state = tb.init_state(s, params)
    nodes = jnp.arange(10, dtype=jnp.int32)  # environment 0's tasks
    same = jnp.full((10, 8), 0.5)
    assert np.array_equal(np.asarray(tb.learn(s, state, params, nodes, same).c_env), np.asarray(state.c_env))
    spread = jnp.tile(jnp.array([0.0, 1.0] * 4), (10, 1))  # sd 0.5 per group
    new = tb.learn(s, state, params, nodes, spread)
    d_env = np.asarray(new.c_env - state.c_env)
    assert d_env[0] == pytest.approx(params.lr_env * 0.5, rel=1e-5) and np.all(d_env[1:] == 0)
    d_skill = np.asarray(new.c_skill - state.c_skill)
    np.testing.assert_allclose(d_skill, params.lr_skill * 0.5 * np.asarray(s.skills[:10]).mean(0), rtol=1e-5)
    # Held-out environments gain only through shared skills.
    assert float(tb.heldout_score(s, new, params)) > float(tb.heldout_score(s, state, params))
    # Idle skills decay toward their start.
    bumped = state.replace(c_skill=state.c_skill + 1.0)
    idle = tb.learn(s, bumped, params, nodes, same)
    np.testing.assert_allclose(np.asarray(idle.c_skill), 1.0 - params.forget, rtol=1e-6)


def test_expected_group_variance_matches_sampling(setup):
    params = dataclasses.replace(tb.TestbedParams(), eval_samples=256)
    s = setup.structure
    state = tb.init_state(s, params)
    expected = np.asarray(tb.expected_group_variance(s, state, params, group_size=8))
    nodes = jnp.tile(jnp.arange(s.num_train, dtype=jnp.int32), 400)
    r = np.asarray(tb.rollout(s, state, params, nodes, jax.random.PRNGKey(3), group_size=8,
                              max_checks=setup.max_checks))
    groups = r.var(axis=1).reshape(400, s.num_train)
    sampled = groups.mean(0)
    se = groups.std(0) / np.sqrt(400)
    # Within 4.5 standard errors per node (a chance failure is ~1e-5 per node), plus a little
    # for the 256-point quadrature.
    assert np.all(np.abs(sampled - expected) <= 4.5 * se + 1e-3), np.max(np.abs(sampled - expected) / (se + 1e-9))
    assert np.corrcoef(sampled, expected)[0, 1] > 0.95


def test_vmapped_random_run_agrees_with_the_scheduler_api(setup):
    params = tb.TestbedParams()
    out = random_runs(setup, params, [0, 1], steps=6, batch_size=8)
    log = run_scheduler(setup, "random", steps=6, seed=1, batch_size=8)
    np.testing.assert_allclose(log.realised_variance, out["variance"][1], atol=1e-6)
    np.testing.assert_allclose(log.heldout, out["heldout"][1], atol=1e-4)
    assert not np.allclose(out["variance"][0], out["variance"][1])


def test_calibration_is_frozen_into_the_defaults():
    """The defaults are the recorded grid point, and Random on them still gives the recorded
    statistics (the calibration never runs EnvSched)."""
    params = tb.TestbedParams()
    assert {k: getattr(params, k) for k in C.FROZEN} == C.FROZEN
    stats = C.random_statistics(make_setup(), params, seeds=(0, 1, 2), steps=200)
    for key in ("mean_variance", "median_variance", "median_reward", "environments"):
        assert stats[key] == pytest.approx(C.FROZEN_RANDOM[key], rel=0.02), key
    assert C.loss(stats) < 0.05


def test_float32_even_with_x64_enabled(setup):
    """Other tests (and users) enable jax_enable_x64; the testbed must still run in float32 and
    give the same numbers."""
    params = tb.TestbedParams()
    plain = random_runs(setup, params, [0], steps=4, batch_size=8)
    with jax.enable_x64(True):
        wide = random_runs(setup, params, [0], steps=4, batch_size=8)
        state = tb.learn(setup.structure, tb.init_state(setup.structure, params), params,
                         jnp.arange(8, dtype=jnp.int32), jnp.tile(jnp.array([0.0, 1.0] * 2), (8, 1)))
    assert state.c_env.dtype == jnp.float32 and state.c_skill.dtype == jnp.float32
    for key in plain:
        np.testing.assert_allclose(wide[key], plain[key], rtol=1e-6, err_msg=key)


def test_random_runs_vmap_over_parameter_settings(setup):
    from envsched_jax.sim.runner import stack_params

    settings = [tb.TestbedParams(), dataclasses.replace(tb.TestbedParams(), rollout_noise=0.8)]
    both = random_runs(setup, stack_params(settings), [0, 1], steps=4, batch_size=8, batched_params=True)
    assert both["variance"].shape == (2, 2, 4, 8)
    for k, p in enumerate(settings):
        one = random_runs(setup, p, [0, 1], steps=4, batch_size=8)
        np.testing.assert_allclose(both["variance"][k], one["variance"], atol=1e-6)
        np.testing.assert_allclose(both["heldout"][k], one["heldout"], atol=1e-4)
    assert not np.allclose(both["variance"][0], both["variance"][1])
