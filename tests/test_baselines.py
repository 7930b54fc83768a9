"""Baseline schedulers (DPS, MoPPS, the LEEPS reconstruction) and the DAPO admission gate against
updates worked out by hand. The shared conformance test covers their API behaviour."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envsched_jax.sched import DPS, DPSConfig, MoPPS, MoPPSConfig, make_scheduler
from envsched_jax.sched import dps as dps_k
from envsched_jax.sched import leeps as leeps_k
from envsched_jax.sched import mopps as mopps_k
from envsched_jax.sched.candidates import candidate_pool
from envsched_jax.sched.dynamic_sampling import DynamicSamplingConfig, dynamic_sampling, keep_mask
from envsched_jax.sched.outcomes import informative, solving_state, success_rate

from sched_helpers import graph_from_matrices, random_graph

B, K = 8, 4
TOL = 1e-6


@pytest.fixture(scope="module")
def graph():
    return random_graph(np.random.default_rng(0), num_envs=6, per_env=10, dtype=np.float32)


# -- outcomes shared by every baseline -------------------------------------------------------

def test_partial_credit_counts_as_failure():
    rewards = np.array([[1.0, 1.0 - 1e-7, 0.0, 0.0],      # two full successes (one up to rounding)
                        [0.9, 0.5, 0.99, 0.999],          # varied partial credit, no success
                        [1.0, 1.0, 1.0, 1.0],
                        [0.5, 0.5, 0.5, 0.5]])
    np.testing.assert_allclose(success_rate(rewards), [0.5, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(solving_state(rewards), [1, 0, 2, 0])
    np.testing.assert_array_equal(informative(rewards), [True, False, False, False])


# -- DPS ----------------------------------------------------------------------------------------

def _dps_observe(state, node, reward_row, config):
    return dps_k.observe(state, jnp.array([node], jnp.int32), jnp.array([reward_row], jnp.float32),
                         config=config)


def test_dps_transition_update_by_hand():
    """Task 0: partially solved at step 0, not selected at step 1, solved at step 2 (lam = 0.5,
    A0 = ones). Task 1 is selected at step 1 only (as unsolved)."""
    config = DPSConfig(batch_size=1, group_size=4)
    state = dps_k.init_state(2, config, jax.random.PRNGKey(0))
    partial, solved, unsolved = [1, 0, 0.7, 0], [1, 1, 1, 1], [0.9, 0, 0, 0.5]

    # Step 0. P uniform (1/3), post_prev uniform: joint[to=1, from=j] = 1/9, xi[1, :] = 1/3.
    # A = 0.5 * 1 + 0.5 * 1 + xi: row 1 = 4/3, rows 0 and 2 = 1 (every column).
    state = _dps_observe(state, 0, partial, config)
    np.testing.assert_allclose(state.alpha[0], [[1, 1, 1], [4 / 3, 4 / 3, 4 / 3], [1, 1, 1]], atol=TOL)
    # belief = P(A) @ onehot(1) = column 1 / (10/3) = (0.3, 0.4, 0.3).
    np.testing.assert_allclose(state.belief[0], [0.3, 0.4, 0.3], atol=TOL)
    np.testing.assert_allclose(state.prev_posterior[0], [0, 1, 0], atol=TOL)
    np.testing.assert_allclose(state.alpha[1], np.ones((3, 3)), atol=TOL)  # decayed toward A0 = itself
    np.testing.assert_allclose(state.belief[1], [1 / 3] * 3, atol=TOL)

    # Step 1, task 0 not selected: decay only, A row 1 = 0.5 * 4/3 + 0.5 = 7/6; post = prior
    # (0.3, 0.4, 0.3); every column of P is (1, 7/6, 1) / (19/6) = (6, 7, 6) / 19.
    state = _dps_observe(state, 1, unsolved, config)
    np.testing.assert_allclose(state.alpha[0], [[1] * 3, [7 / 6] * 3, [1] * 3], atol=TOL)
    np.testing.assert_allclose(state.prev_posterior[0], [0.3, 0.4, 0.3], atol=TOL)
    np.testing.assert_allclose(state.belief[0], np.array([6, 7, 6]) / 19, atol=TOL)
    # Task 1 (unsolved, all rewards below 1): xi[0, :] = 1/3 -> A row 0 = 4/3.
    np.testing.assert_allclose(state.alpha[1], [[4 / 3] * 3, [1] * 3, [1] * 3], atol=TOL)
    np.testing.assert_allclose(state.belief[1], [0.4, 0.3, 0.3], atol=TOL)

    # Step 2, task 0 solved: joint[2, j] = P[2, j] * prev[j] = 6/19 * (0.3, 0.4, 0.3), so the soft
    # count is xi[2, :] = (0.3, 0.4, 0.3). A = 0.5 A + 0.5 + xi: row 0 = 1, row 1 = 13/12,
    # row 2 = (1.3, 1.4, 1.3). belief = column 2 of P = (1, 13/12, 1.3) / (203/60).
    state = _dps_observe(state, 0, solved, config)
    np.testing.assert_allclose(state.alpha[0], [[1] * 3, [13 / 12] * 3, [1.3, 1.4, 1.3]], atol=TOL)
    np.testing.assert_allclose(state.belief[0], np.array([60, 65, 78]) / 203, atol=TOL)
    np.testing.assert_allclose(state.prev_posterior[0], [0, 0, 1], atol=TOL)
    np.testing.assert_array_equal(state.count, [2, 1])


def _with_state(sched, **arrays):
    current = sched.state_dict()
    current["arrays"].update({k: np.asarray(v) for k, v in arrays.items()})
    sched.load_state_dict(current)
    return sched


def test_dps_picks_the_highest_partial_prior(graph):
    n = graph.num_nodes
    belief = np.full((n, 3), 1 / 3, np.float32)
    favoured = [3, 11, 17, 25, 31, 42, 50, 58]
    belief[favoured] = [0.05, 0.9, 0.05]
    belief[[5, 6]] = [0.0, 0.8, 0.2]       # runners-up
    # k B = 64 >= 60: the candidate pool is the whole pool, so the batch is exactly the top B.
    sched = _with_state(DPS(graph, batch_size=B, group_size=K, seed=1), belief=belief)
    assert sorted(sched._index[t] for t in sched.select(0)) == favoured


def test_dps_selects_only_from_its_candidate_pool(graph):
    n = graph.num_nodes
    config = DPSConfig(batch_size=B, group_size=K, candidate_ratio=2)
    sched = DPS(graph, config, seed=4)
    candidates = np.asarray(candidate_pool(sched.state.key, 0, num_nodes=n, num_candidates=2 * B))
    belief = np.full((n, 3), 1 / 3, np.float32)
    belief[:, 1] = np.linspace(0.1, 0.9, n)   # a strict order: the top B candidates are known
    sched = _with_state(sched, belief=belief)
    expected = candidates[np.argsort(-belief[candidates, 1])[:B]]
    picked = np.array([sched._index[t] for t in sched.select(0)])
    np.testing.assert_array_equal(np.sort(picked), np.sort(expected))
    assert set(expected.tolist()) != set(np.argsort(-belief[:, 1])[:B].tolist())  # the pool mattered


def test_dps_decays_every_task_and_treats_partial_credit_as_failure(graph):
    chosen = [graph.task_ids.index(t) for t in DPS(graph, batch_size=B, group_size=K, seed=0).select(0)]
    other = next(i for i in range(graph.num_nodes) if i not in chosen)
    alpha = np.ones((graph.num_nodes, 3, 3), np.float32)
    alpha[other] = 3.0
    sched = _with_state(DPS(graph, batch_size=B, group_size=K, seed=0), alpha=alpha)
    ids = sched.select(0)   # selection reads beliefs only: the same batch
    assert [sched._index[t] for t in ids] == chosen
    sched.observe(0, ids, np.full((B, K), 0.9))          # shaped partial credit, no success
    state = sched.state
    np.testing.assert_allclose(state.alpha[other], np.full((3, 3), 2.0), atol=TOL)   # 0.5 * 3 + 0.5
    for i in (sched._index[t] for t in ids):
        np.testing.assert_allclose(state.prev_posterior[i], [1, 0, 0], atol=TOL)   # unsolved
    assert int(state.count.sum()) == B


# -- MoPPS --------------------------------------------------------------------------------------

def test_mopps_posterior_update_by_hand():
    config = MoPPSConfig(batch_size=1, group_size=4)
    state = mopps_k.init_state(3, jax.random.PRNGKey(0))

    def step(state, node, row):
        return mopps_k.observe(state, jnp.array([node], jnp.int32), jnp.array([row], jnp.float32),
                               config=config)

    # s = 2/4 (0.5 is partial credit = failure): alpha = 0.5 * 1 + 0.5 + 4 * 0.5 = 3, beta = 3.
    state = step(state, 1, [1.0, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(state.alpha, [1, 3, 1], atol=TOL)
    np.testing.assert_allclose(state.beta, [1, 3, 1], atol=TOL)
    # s = 1: alpha = 0.5 * 3 + 0.5 + 4 = 6, beta = 0.5 * 3 + 0.5 + 0 = 2; tasks 0 and 2 untouched.
    state = step(state, 1, [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(state.alpha, [1, 6, 1], atol=TOL)
    np.testing.assert_allclose(state.beta, [1, 2, 1], atol=TOL)
    # s = 1/4 on task 2: alpha = 1 + 1 = 2, beta = 1 + 3 = 4.
    state = step(state, 2, [0.2, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(state.alpha, [1, 6, 2], atol=TOL)
    np.testing.assert_allclose(state.beta, [1, 2, 4], atol=TOL)


def test_mopps_prefers_tasks_near_one_half(graph):
    n = graph.num_nodes
    alpha, beta = np.ones(n, np.float32), np.ones(n, np.float32)
    near = [2, 9, 14, 23, 30, 37, 44, 59]
    alpha[:], beta[:] = 500.0, 1.0           # almost always solved
    alpha[::2], beta[::2] = 1.0, 500.0       # almost always failed
    alpha[near], beta[near] = 400.0, 400.0   # Thompson samples within ~0.05 of 0.5
    for seed in range(3):
        sched = _with_state(MoPPS(graph, batch_size=B, group_size=K, seed=seed), alpha=alpha, beta=beta)
        assert sorted(sched._index[t] for t in sched.select(0)) == near


# -- LEEPS reconstruction -----------------------------------------------------------------------

def test_leeps_informative_probability_by_hand():
    a, b = jnp.array([1.0, 2.0, 1.0]), jnp.array([1.0, 1.0, 3.0])
    # K = 2. Beta(1,1): E p^2 = 1/3 = E (1-p)^2 -> 1/3. Beta(2,1): E p^2 = 2/3 * 3/4 = 1/2,
    # E (1-p)^2 = 1/3 * 2/4 = 1/6 -> 1/3. Beta(1,3): E p^2 = 1/4 * 2/5 = 1/10, E (1-p)^2 = 3/4 * 4/5
    # = 3/5 -> 3/10.
    np.testing.assert_allclose(leeps_k.informative_probability(a, b, 2), [1 / 3, 1 / 3, 3 / 10], atol=TOL)


def test_leeps_neighbour_transfer_and_portfolio_slots_by_hand():
    state = leeps_k.init_state(3, jax.random.PRNGKey(0))
    state = state.replace(a=jnp.array([5.0, 1.0, 3.0]), b=jnp.array([1.0, 1.0, 7.0]))
    idx = jnp.array([[1, 2], [0, 2], [0, -1]], jnp.int32)
    w = jnp.array([[0.5, 0.5], [0.75, 0.25], [1.0, 0.0]], jnp.float32)
    a, b = leeps_k.effective_posterior(state, idx, w, 0.5)
    # Task 1: A = 1 + 0.5 (0.75 * 4 + 0.25 * 2) = 2.75, B = 1 + 0.5 (0.75 * 0 + 0.25 * 6) = 1.75.
    np.testing.assert_allclose(a, [5 + 0.5 * (0 + 1), 2.75, 3 + 0.5 * 4], atol=TOL)
    np.testing.assert_allclose(b, [1 + 0.5 * (0 + 3), 1.75, 7 + 0], atol=TOL)

    # Equal yields: 64/3 = 21.33 each, the remainder to the first arm.
    ones = jnp.ones(3)
    np.testing.assert_array_equal(leeps_k.arm_slots(ones, ones, 64, 0.125), [22, 21, 21])
    # Means (0.9, 0.5, 0.1): shares 0.125 + 0.625 (0.6, 1/3, 1/15) = (0.5, 1/3, 1/6) -> raw
    # (32, 21.33, 10.67) -> (32, 21, 11).
    np.testing.assert_array_equal(
        leeps_k.arm_slots(jnp.array([9.0, 1.0, 1.0]), jnp.array([1.0, 1.0, 9.0]), 64, 0.125), [32, 21, 11])


def test_leeps_exploits_the_informative_cluster():
    """Two clusters by S_full; tasks of cluster A were always informative, cluster B always solved.
    Unobserved tasks of A inherit that through their neighbours and the exploit arm takes them."""
    env = np.repeat([0, 1], 10)
    same = env[:, None] == env[None, :]
    s_full = np.where(same, 0.9, 0.05).astype(np.float32)
    np.fill_diagonal(s_full, 1.0)
    g = graph_from_matrices(s_full, s_full, env)
    sched = make_scheduler("leeps_reconstruction", g, batch_size=4, group_size=K, seed=0,
                           num_neighbors=5)
    seen_a, seen_b = [0, 1, 2], [10, 11, 12]
    a, b = np.ones(20, np.float32), np.ones(20, np.float32)
    a[seen_a], b[seen_a] = 3.0, 3.0             # s = 1/2 seen twice
    a[seen_b], b[seen_b] = 9.0, 1.0             # s = 1 seen twice
    count = np.zeros(20, np.int32)
    count[seen_a + seen_b] = 2
    sched = _with_state(sched, a=a, b=b, count=count)
    ids = sched.select(0)
    phases = sched.metrics()[-1].phases
    nodes = [sched._index[t] for t in ids]
    assert phases == ["exploit", "exploit", "thompson", "explore"]   # slots (2, 1, 1) for B = 4
    assert all(env[i] == 0 for i in nodes[:2])                       # exploit: cluster A
    assert all(count[i] == 0 for i in nodes[3:])                     # explore: never observed
    # Observing updates the arm that picked each task: exploit's pick informative, the others not.
    rewards = np.zeros((4, K))
    rewards[:2] = [1, 0, 1, 0]
    sched.observe(0, ids, rewards)
    np.testing.assert_allclose(sched.state.arm_a, [0.9 + 0.1 + 2, 1, 1], atol=TOL)
    np.testing.assert_allclose(sched.state.arm_b, [1, 2, 2], atol=TOL)


def test_leeps_neighbours_from_candidate_lists_without_dense_matrices():
    idx = np.array([[1, -1], [0, 2], [1, -1]], np.int32)
    sim = np.array([[0.8, 0.0], [0.6, 0.2], [0.4, 0.0]], np.float32)
    cross_idx = np.array([[2], [-1], [0]], np.int32)
    cross_sim = np.array([[0.2], [0.0], [0.4]], np.float32)
    g = graph_from_matrices(None, None, np.array([0, 0, 1]))
    g = dataclasses.replace(g, within_idx=idx, within_sim=sim, cross_idx=cross_idx, cross_sim=cross_sim)
    nbr, w = leeps_k.neighbour_lists(g, 2)
    np.testing.assert_array_equal(nbr, [[1, 2], [0, 2], [1, 0]])   # merged, by similarity (stable)
    np.testing.assert_allclose(w, [[0.8, 0.2], [0.75, 0.25], [0.5, 0.5]], atol=TOL)


# -- DAPO dynamic sampling ----------------------------------------------------------------------

def _scripted(sched, fn):
    """rollout_fn whose rewards for a task come from fn(node index)."""
    return lambda ids: np.array([fn(sched._index[t]) for t in ids], np.float64)


def test_gate_drops_zero_std_groups_and_counts_extra_rollouts(graph):
    sched = make_scheduler("random", graph, batch_size=B, group_size=K, seed=0)
    # Odd tasks give mixed binary groups, even tasks are always solved (dropped).
    result = dynamic_sampling(sched, 0, _scripted(sched, lambda i: [1, 0, 1, 1] if i % 2 else [1, 1, 1, 1]))
    assert result.full and len(result.task_ids) == B == len(set(result.task_ids))
    assert all(sched._index[t] % 2 == 1 for t in result.task_ids)
    generated = [sched._index[t] for m in sched.metrics() for t in m.task_ids]
    assert len(generated) == result.rounds * B and result.rounds > 1      # the scheduler saw every round
    assert result.dropped == sum(i % 2 == 0 for i in generated)
    assert result.rollouts == result.rounds * B * K
    assert result.extra_rollouts == (result.rounds - 1) * B * K
    kept = sum(i % 2 == 1 for i in generated)
    assert result.surplus + result.duplicates == kept - B
    np.testing.assert_array_equal(result.rewards, np.tile([1, 0, 1, 1], (B, 1)))
    assert result.next_step == result.rounds
    sched.select(result.next_step)   # the scheduler stands at the gate's next step


def test_gate_respects_the_round_cap(graph):
    sched = make_scheduler("dps", graph, batch_size=B, group_size=K, seed=0)
    result = dynamic_sampling(sched, 0, lambda ids: np.zeros((len(ids), K)), DynamicSamplingConfig(max_rounds=3))
    assert not result.full and result.task_ids == [] and result.rewards.shape == (0, K)
    assert (result.rounds, result.rollouts, result.extra_rollouts, result.dropped) == (3, 3 * B * K, 2 * B * K, 3 * B)
    assert result.next_step == 3 and len(sched.metrics()) == 3
    # DPS learned from the dropped groups: every selected task is now believed unsolved.
    assert int(sched.state.count.sum()) == 3 * B


def test_gate_filters_on_binary_accuracy_not_shaped_reward(graph):
    shaped_fail = [0.2, 0.5, 0.2, 0.5]          # varied partial credit, no success
    rewards = np.array([shaped_fail, [1, 0.5, 0.5, 0.5], [0.5] * 4, [1.0] * 4])
    np.testing.assert_array_equal(keep_mask(rewards), [False, True, False, False])
    np.testing.assert_array_equal(keep_mask(rewards, DynamicSamplingConfig(filter_on="reward")),
                                  [True, True, False, False])
    sched = make_scheduler("mopps", graph, batch_size=B, group_size=K, seed=0)
    accuracy = dynamic_sampling(sched, 0, lambda ids: np.tile(shaped_fail, (len(ids), 1)),
                                DynamicSamplingConfig(max_rounds=2))
    assert (accuracy.rounds, len(accuracy.task_ids), accuracy.dropped) == (2, 0, 2 * B)
    by_reward = dynamic_sampling(sched, accuracy.next_step, lambda ids: np.tile(shaped_fail, (len(ids), 1)),
                                 DynamicSamplingConfig(max_rounds=2, filter_on="reward"))
    assert (by_reward.rounds, len(by_reward.task_ids), by_reward.extra_rollouts) == (1, B, 0)


def test_baseline_selection_does_not_recompile(graph):
    sched = DPS(graph, batch_size=B, group_size=K, seed=0)
    rng = np.random.default_rng(0)
    for t in range(2):
        ids = sched.select(t)
        sched.observe(t, ids, (rng.random((B, K)) < 0.5).astype(float))
    sizes = (dps_k.select._cache_size(), dps_k.observe._cache_size())
    for t in range(2, 5):
        ids = sched.select(t)
        sched.observe(t, ids, (rng.random((B, K)) < 0.5).astype(float))
    assert (dps_k.select._cache_size(), dps_k.observe._cache_size()) == sizes
