"""DPS and MoPPS as their authors run them: the epoch-wise candidate pools of their data loader,
their priors, strategies, offline prior and saved bandits, recipes and no-update modes, each
against values worked out by hand (see the modules' docstrings for the authors' code they follow)."""

from __future__ import annotations

import json
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envsched_jax.sched import DPS, DPSConfig, MoPPS, MoPPSConfig, SchedulerInputError, make_scheduler
from envsched_jax.sched import dps as dps_k
from envsched_jax.sched import mopps as mopps_k
from envsched_jax.sched.candidates import candidate_pool, pools_per_epoch

from sched_helpers import random_graph

TOL = 1e-6


@pytest.fixture(scope="module")
def graph():
    return random_graph(np.random.default_rng(0), num_envs=6, per_env=10, dtype=np.float32)


def _with_state(sched, **arrays):
    current = sched.state_dict()
    current["arrays"].update({k: np.asarray(v) for k, v in arrays.items()})
    sched.load_state_dict(current)
    return sched


def _pools(key, steps, n, c, mode):
    return [np.asarray(candidate_pool(key, t, num_nodes=n, num_candidates=c, mode=mode)) for t in range(steps)]


# -- candidate pools --------------------------------------------------------------------------

def test_epoch_pools_are_disjoint_within_an_epoch_and_drop_the_last_partial_pool():
    key, n, c = jax.random.PRNGKey(3), 60, 16
    assert pools_per_epoch(n, c) == 3                  # 60 // 16; 12 tasks dropped per epoch
    pools = _pools(key, 6, n, c, "epoch")
    for pool in pools:
        assert len(pool) == c == len(set(pool.tolist()))
    first, second = np.concatenate(pools[:3]), np.concatenate(pools[3:])
    assert len(set(first.tolist())) == 48 == len(set(second.tolist()))      # disjoint in an epoch
    assert set(first.tolist()) != set(second.tolist())                      # each epoch reshuffles
    # Jitted with a traced step, the same pools.
    jitted = jax.jit(lambda t: candidate_pool(key, t, num_nodes=n, num_candidates=c, mode="epoch"))
    for t in range(6):
        np.testing.assert_array_equal(jitted(t), pools[t])


def test_pools_cover_the_whole_set_when_k_b_reaches_n():
    key, n = jax.random.PRNGKey(0), 40
    for mode in ("epoch", "per_step"):
        pools = _pools(key, 3, n, n, mode)
        assert all(sorted(p.tolist()) == list(range(n)) for p in pools)
        assert not np.array_equal(pools[0], pools[1])                      # reshuffled every step


def test_the_issue_figure_distinct_prompts_in_the_first_seven_steps():
    """N = 1,000, B = 16, k = 8: the authors' loader offers 7 x 128 = 896 distinct prompts in the
    first 7 steps (one epoch); independent per-step subsets offer fewer."""
    key, n, c = jax.random.PRNGKey(0), 1000, 128
    assert len(set(np.concatenate(_pools(key, 7, n, c, "epoch")).tolist())) == 896
    per_step = [len(set(np.concatenate(_pools(jax.random.PRNGKey(s), 7, n, c, "per_step")).tolist()))
                for s in range(5)]
    assert max(per_step) < 896 and 560 < np.mean(per_step) < 700    # E = 1000 (1 - (1 - 0.128)^7) = 617


def test_pool_size_is_checked():
    with pytest.raises(ValueError, match=r"num_candidates must lie in \[1, 10\]"):
        pools_per_epoch(10, 11)
    with pytest.raises(ValueError, match="candidate_pool must be one of"):
        DPSConfig(candidate_pool="fresh")


@pytest.mark.parametrize("name", ["dps", "mopps"])
def test_selection_stays_in_the_epoch_pool_and_a_restored_run_continues_identically(graph, name):
    b, k = 4, 2                                           # C = 8 of 60: E = 7 pools per epoch
    sched = make_scheduler(name, graph, batch_size=b, group_size=4, candidate_ratio=k, seed=5)
    assert sched.config.candidate_pool == "epoch"
    rng = np.random.default_rng(0)
    rewards = [(rng.random((b, 4)) < 0.5).astype(float) for _ in range(12)]
    for t in range(5):
        ids = sched.select(t)
        pool = np.asarray(candidate_pool(sched.state.key, t, num_nodes=60, num_candidates=8))
        assert {sched._index[i] for i in ids} <= set(pool.tolist())
        sched.observe(t, ids, rewards[t])
    snapshot = sched.state_dict()
    rest = []
    for t in range(5, 12):
        ids = sched.select(t)
        rest.append(ids)
        sched.observe(t, ids, rewards[t])
    restored = make_scheduler(name, graph, batch_size=b, group_size=4, candidate_ratio=k, seed=5)
    restored.load_state_dict(snapshot)
    for t in range(5, 12):
        ids = restored.select(t)
        assert ids == rest[t - 5]
        restored.observe(t, ids, rewards[t])


def test_per_step_mode_is_the_earlier_behaviour(graph):
    sched = DPS(graph, batch_size=4, group_size=4, candidate_ratio=2, candidate_pool="per_step", seed=2)
    key = sched.state.key
    for t in range(3):
        pool = np.asarray(jax.random.permutation(jax.random.fold_in(key, t), 60)[:8])
        ids = sched.select(t)
        assert {sched._index[i] for i in ids} <= set(pool.tolist())
        sched.observe(t, ids, np.zeros((4, 4)))


# -- DPS -------------------------------------------------------------------------------------

def test_dps_prior_presets_and_initial_beliefs():
    progress = DPSConfig(prior="progress").prior_matrix()
    np.testing.assert_allclose(progress, [[1, .5, .5], [1, 1, .5], [1, 1, 1]])
    stability = DPSConfig(prior="stability").prior_matrix()
    np.testing.assert_allclose(np.diag(stability), 1.0)
    np.testing.assert_allclose(stability[~np.eye(3, dtype=bool)], 0.5)
    np.testing.assert_allclose(DPSConfig(prior="local").prior_matrix(), [[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    np.testing.assert_allclose(DPSConfig(prior=2).prior_matrix(), np.full((3, 3), 2.0))
    np.testing.assert_allclose(DPSConfig(initial_belief="partial").initial_belief_vector(), [0, 1, 0])
    np.testing.assert_allclose(DPSConfig(initial_belief="solved").initial_belief_vector(), [0, 0, 1])
    np.testing.assert_allclose(DPSConfig().initial_belief_vector(), [1 / 3] * 3)
    for bad in ("increase", -1.0, 0, float("nan"), True):
        with pytest.raises(ValueError, match="DPSConfig.prior must be a positive number"):
            DPSConfig(prior=bad)
    with pytest.raises(ValueError, match="DPSConfig.strategy must be one of"):
        DPSConfig(strategy="thompson")
    with pytest.raises(ValueError, match="DPSConfig.initial_belief must be one of"):
        DPSConfig(initial_belief="1")


def test_dps_progress_prior_update_by_hand():
    """A0 = 'progress', lam = 0.5, uniform start; one task observed partially solved.

    P(A0) columns: from unsolved (1/3, 1/3, 1/3), from partial (1/5, 2/5, 2/5), from solved
    (1/4, 1/4, 1/2). joint[to = 1, from = j] = 1/3 P[1, j] = (1/9, 2/15, 1/12), total 59/180, so
    xi[1, :] = (20, 24, 15) / 59 and A = A0 + xi (lam A0 + (1 - lam) A0 = A0). The belief is
    column 1 of P(A): (1/2, 1 + 24/59, 1) / (343/118) = (59, 166, 118) / 343."""
    config = DPSConfig(batch_size=1, group_size=4, prior="progress")
    state = dps_k.init_state(2, config, jax.random.PRNGKey(0))
    state = dps_k.observe(state, jnp.array([0], jnp.int32), jnp.array([[1.0, 0, 0, 1.0]], jnp.float32),
                          config=config)
    a0 = config.prior_matrix()
    expected = a0.copy()
    expected[1] += np.array([20, 24, 15]) / 59
    np.testing.assert_allclose(state.alpha[0], expected, atol=TOL)
    np.testing.assert_allclose(state.belief[0], np.array([59, 166, 118]) / 343, atol=TOL)
    # The other task (tracked, not selected): counts stay A0, the belief is propagated one step,
    # P(A0) @ uniform = (1/3 + 1/5 + 1/4, 1/3 + 2/5 + 1/4, 1/3 + 2/5 + 1/2) / 3.
    third = Fraction(1, 3)
    propagated = [float((third + Fraction(1, 5) + Fraction(1, 4)) / 3),
                  float((third + Fraction(2, 5) + Fraction(1, 4)) / 3),
                  float((third + Fraction(2, 5) + Fraction(1, 2)) / 3)]
    np.testing.assert_allclose(state.alpha[1], a0, atol=TOL)
    np.testing.assert_allclose(state.belief[1], propagated, atol=TOL)


def test_dps_touches_only_tasks_that_have_been_candidates(graph):
    """Under a non-uniform prior a never-offered task would drift if it were propagated; the
    authors create a task's state when it is first offered, and so does the project."""
    sched = DPS(graph, batch_size=4, group_size=4, candidate_ratio=2, prior="progress", seed=1)
    pool = set(np.asarray(candidate_pool(sched.state.key, 0, num_nodes=60, num_candidates=8)).tolist())
    before = sched.state_dict()["arrays"]
    ids = sched.select(0)
    sched.observe(0, ids, np.zeros((4, 4)))
    after = sched.state_dict()["arrays"]
    outside = [i for i in range(60) if i not in pool]
    np.testing.assert_array_equal(after["tracked"], [i in pool for i in range(60)])
    np.testing.assert_array_equal(after["alpha"][outside], before["alpha"][outside])
    np.testing.assert_array_equal(after["belief"][outside], before["belief"][outside])
    offered_not_chosen = sorted(pool - {sched._index[t] for t in ids})
    assert offered_not_chosen
    assert not np.allclose(after["belief"][offered_not_chosen], 1 / 3)     # propagated


def test_dps_local_prior_impossible_jump_adds_no_count_instead_of_nan():
    """'local' forbids unsolved -> solved. From a one-hot solved belief an unsolved observation has
    joint probability 0: the authors' code divides 0 by 0 (NaN); here it adds no count."""
    config = DPSConfig(batch_size=1, group_size=2, prior="local", initial_belief="solved")
    state = dps_k.init_state(1, config, jax.random.PRNGKey(0))
    state = dps_k.observe(state, jnp.array([0], jnp.int32), jnp.zeros((1, 2), jnp.float32), config=config)
    assert np.isfinite(np.asarray(state.alpha)).all()
    np.testing.assert_allclose(state.alpha[0], config.prior_matrix(), atol=TOL)
    np.testing.assert_allclose(state.belief[0], [0.5, 0.5, 0.0], atol=TOL)   # column 0 of P(A0)


def test_dps_entropy_strategy_by_hand(graph):
    n = graph.num_nodes
    belief = np.tile(np.float32([1.0, 0.0, 0.0]), (n, 1))     # p1 = 0, H = 0: never preferred
    belief[7] = [0.0, 0.6, 0.4]      # p1 0.6, H = 0.673
    belief[21] = [0.25, 0.5, 0.25]   # p1 0.5, H = 1.040
    picks = {}
    for strategy, w in (("topk", 0.0), ("topk+entropy", 0.0), ("topk+entropy", 1.0)):
        sched = _with_state(DPS(graph, batch_size=1, group_size=4, candidate_ratio=n, strategy=strategy,
                                entropy_weight=w, seed=0), belief=belief)     # the pool: every task
        picks[(strategy, w)] = sched._index[sched.select(0)[0]]
    assert picks == {("topk", 0.0): 7, ("topk+entropy", 0.0): 7, ("topk+entropy", 1.0): 21}


def test_dps_uniform_strategy_ignores_the_beliefs(graph):
    n = graph.num_nodes
    belief = np.tile(np.float32([0.5, 0.0, 0.5]), (n, 1))
    favoured = list(range(8))
    belief[favoured] = [0.0, 1.0, 0.0]
    picked = set()
    for seed in range(4):
        sched = _with_state(DPS(graph, batch_size=8, group_size=4, strategy="uniform", seed=seed),
                            belief=belief)
        ids = sched.select(0)
        assert len(set(ids)) == 8
        picked |= {sched._index[t] for t in ids}
        assert sorted(sched._index[t] for t in _with_state(
            DPS(graph, batch_size=8, group_size=4, seed=seed), belief=belief).select(0)) == favoured
    assert len(picked - set(favoured)) > 8


def test_dps_score_metric_and_no_update(graph):
    shaped = np.full((1, 4), 0.5, np.float32)
    for metric, state in (("acc", 0), ("score", 1)):
        np.testing.assert_array_equal(dps_k.group_states(jnp.asarray(shaped), metric, 1 - 1e-6), [state])
    np.testing.assert_array_equal(dps_k.group_states(jnp.ones((1, 4)), "score", 1 - 1e-6), [2])
    sched = DPS(graph, batch_size=8, group_size=4, no_update=True, seed=0)
    before = sched.state_dict()["arrays"]
    ids = sched.select(0)
    sched.observe(0, ids, np.tile([1.0, 0.0, 1.0, 0.0], (8, 1)))
    after = sched.state_dict()["arrays"]
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_dps_recipes(graph):
    math = DPSConfig.for_recipe("math", batch_size=16, group_size=8)
    assert (math.candidate_ratio, math.lam, math.prior, math.strategy) == (32, 0.7, 1.0, "topk")
    assert (math.batch_size, math.group_size) == (16, 8)
    for name in ("countdown", "geo3k"):
        assert (DPSConfig.for_recipe(name).candidate_ratio, DPSConfig.for_recipe(name).lam) == (8, 0.5)
    sched = make_scheduler("dps", graph, recipe="math", batch_size=4, group_size=4)
    assert sched.config.lam == 0.7 and sched.num_candidates == 60
    with pytest.raises(ValueError, match="unknown DPS recipe 'gsm8k'"):
        DPSConfig.for_recipe("gsm8k")
    with pytest.raises(ValueError, match="either config or recipe"):
        DPS(graph, DPSConfig(batch_size=4), recipe="math")


# -- MoPPS -----------------------------------------------------------------------------------

def _beta_arrays(n, default, overrides):
    alpha, beta = np.full(n, default[0], np.float32), np.full(n, default[1], np.float32)
    for nodes, (a, b) in overrides:
        alpha[nodes], beta[nodes] = a, b
    return alpha, beta


def test_mopps_threshold_picks_in_band_at_random_when_enough(graph):
    band = list(range(0, 60, 3))                                       # 20 tasks near 0.5
    alpha, beta = _beta_arrays(60, (1.0, 2000.0), [(band, (500.0, 500.0))])
    chosen = set()
    for seed in range(4):
        sched = _with_state(MoPPS(graph, batch_size=8, group_size=4, strategy="threshold", seed=seed),
                            alpha=alpha, beta=beta)
        picks = {sched._index[t] for t in sched.select(0)}
        assert picks <= set(band)
        chosen |= picks
    assert len(chosen) > 8                                             # a random choice among the band


def test_mopps_threshold_falls_back_to_the_nearest_outside_the_band(graph):
    band = [4, 40]                                                     # only 2 in [0.3, 0.7]
    near = [10, 11, 12, 13, 14, 15]                                    # samples ~ 0.25
    alpha, beta = _beta_arrays(60, (1.0, 5000.0), [(band, (5000.0, 5000.0)), (near, (2500.0, 7500.0))])
    sched = _with_state(MoPPS(graph, batch_size=8, group_size=4, strategy="threshold", seed=0),
                        alpha=alpha, beta=beta)
    assert sorted(sched._index[t] for t in sched.select(0)) == sorted(band + near)
    with pytest.raises(ValueError, match="lower .* must not exceed upper"):
        MoPPSConfig(lower=0.8, upper=0.2)


def test_mopps_uniform_score_metric_and_no_update(graph):
    alpha, beta = _beta_arrays(60, (1.0, 500.0), [(list(range(8)), (400.0, 400.0))])
    picked = set()
    for seed in range(3):
        sched = _with_state(MoPPS(graph, batch_size=8, group_size=4, strategy="uniform", seed=seed),
                            alpha=alpha, beta=beta)
        picked |= {sched._index[t] for t in sched.select(0)}
    assert len(picked - set(range(8))) > 8
    # metric="score": y = mean reward 0.5 -> alpha = beta = 0.5 + 0.5 + 4 * 0.5 = 3; with "acc" the
    # same group is 0 successes -> alpha = 1, beta = 5.
    for metric, expected in (("score", (3.0, 3.0)), ("acc", (1.0, 5.0))):
        config = MoPPSConfig(batch_size=1, group_size=4, metric=metric)
        state = mopps_k.observe(mopps_k.init_state(2, jax.random.PRNGKey(0)), jnp.array([1], jnp.int32),
                                jnp.full((1, 4), 0.5, jnp.float32), config=config)
        np.testing.assert_allclose([state.alpha[1], state.beta[1]], expected, atol=TOL)
    config = MoPPSConfig(batch_size=1, group_size=4, no_update=True)
    state = mopps_k.observe(mopps_k.init_state(2, jax.random.PRNGKey(0)), jnp.array([1], jnp.int32),
                            jnp.ones((1, 4), jnp.float32), config=config)
    np.testing.assert_array_equal(state.alpha, [1, 1])


def test_mopps_offline_prior_saved_bandit_and_their_errors(graph, tmp_path):
    ids = graph.task_ids
    scores = tmp_path / "index_score.json"
    scores.write_text(json.dumps({ids[0]: [1, 0, 1], ids[5]: [0, 0, 0, 0]}))
    sched = MoPPS(graph, batch_size=4, group_size=4, init_scores=str(scores))
    alpha, beta = np.asarray(sched.state.alpha), np.asarray(sched.state.beta)
    # 2 successes of 3 -> alpha = 3 * 2 + 1 = 7, beta = 3 * 1 + 1 = 4; 0 of 4 -> 1 and 13.
    np.testing.assert_allclose([alpha[0], beta[0], alpha[5], beta[5]], [7, 4, 1, 13])
    np.testing.assert_allclose(np.delete(alpha, [0, 5]), 1.0)
    # A saved bandit is applied after the offline prior and round-trips through save_bandit.
    saved = tmp_path / "bandit.json"
    saved.write_text(json.dumps({ids[0]: [2.5, 9.0]}))
    sched = MoPPS(graph, batch_size=4, group_size=4, init_scores=str(scores), load_bandit=str(saved))
    np.testing.assert_allclose([sched.state.alpha[0], sched.state.beta[0], sched.state.alpha[5]], [2.5, 9.0, 1.0])
    out = sched.save_bandit(tmp_path / "out" / "bandit.json")
    again = MoPPS(graph, batch_size=4, group_size=4, load_bandit=str(out))
    np.testing.assert_allclose(again.state.alpha, sched.state.alpha)
    np.testing.assert_allclose(again.state.beta, sched.state.beta)

    bad = tmp_path / "bad.json"
    cases = [('{"nope": [1]}', r"init_scores .*bad.json: unknown task id 'nope'"),
             (json.dumps({ids[1]: [1, 2]}), rf"task '{ids[1]}' must map to a non-empty list of scores in \[0, 1\]"),
             (json.dumps({ids[1]: []}), "non-empty list"),
             ("[1, 2]", "expected a JSON object"),
             ('{"a": ', "not JSON")]
    for text, message in cases:
        bad.write_text(text)
        with pytest.raises(SchedulerInputError, match=message):
            MoPPS(graph, batch_size=4, group_size=4, init_scores=str(bad))
    bad.write_text(json.dumps({ids[2]: [1.0, -1.0]}))
    with pytest.raises(SchedulerInputError, match=r"load_bandit .*must map to \[alpha, beta\] with both > 0"):
        MoPPS(graph, batch_size=4, group_size=4, load_bandit=str(bad))
    with pytest.raises(SchedulerInputError, match="missing.json: cannot be read"):
        MoPPS(graph, batch_size=4, group_size=4, init_scores=str(tmp_path / "missing.json"))


def test_mopps_recipes(graph, tmp_path):
    expected = {"countdown": (8, 0.5, "topk"), "geo3k": (8, 0.5, "topk"), "math": (16, 1.0, "topk"),
                "math_threshold": (16, 1.0, "threshold")}
    for name, values in expected.items():
        c = MoPPSConfig.for_recipe(name)
        assert (c.candidate_ratio, c.lam, c.strategy) == values
    with pytest.raises(ValueError, match="'math_init' starts from an offline prior: give init_scores"):
        MoPPSConfig.for_recipe("math_init")
    scores = tmp_path / "s.json"
    scores.write_text(json.dumps({graph.task_ids[3]: [1, 1]}))
    sched = make_scheduler("mopps", graph, recipe="math_init", init_scores=str(scores), batch_size=2,
                           group_size=4)
    assert sched.config.lam == 1.0 and float(sched.state.alpha[3]) == 7.0
    # lam = 1: no decay, the plain Beta-Bernoulli update.
    ids = sched.select(0)
    sched.observe(0, ids, np.array([[1, 1, 0, 0], [0, 0, 0, 0]], float))
    node = sched._index[ids[0]]
    assert float(sched.state.alpha[node]) == float(np.asarray(
        MoPPS(graph, batch_size=2, group_size=4, recipe="math_init", init_scores=str(scores)).state.alpha)[node]) + 2


@pytest.mark.parametrize("mode", ["epoch", "per_step"])
def test_pool_cache_gives_exactly_the_candidate_pools_and_follows_a_new_key(mode):
    """PoolCache (one permutation per epoch, shared by a step's select and observe) returns the
    same pools as candidate_pool over several epochs, also when steps are asked out of order or
    again, and redraws when the key changes (a restored checkpoint)."""
    from envsched_jax.sched.candidates import PoolCache

    n, c = 50, 8  # 6 pools per epoch, 2 tasks dropped per epoch
    cache = PoolCache(n, c, mode)
    for key in (jax.random.PRNGKey(3), jax.random.PRNGKey(4)):
        for t in [0, 1, 5, 6, 7, 13, 13, 2, 20]:
            expected = np.asarray(candidate_pool(key, t, num_nodes=n, num_candidates=c, mode=mode))
            np.testing.assert_array_equal(np.asarray(cache(key, t)), expected)
