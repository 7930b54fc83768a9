"""The jitted cold start (envsched_jax/sched/cold_start.py) against its NumPy reference: identical
batches and relaxations on many random graphs (environments in shuffled order, more environments
than B, excluded tasks, both infeasibility policies, similarities on a coarse grid so that means
and novelties tie exactly), the tie rule of the package docstring, and EnvSched's step 0."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from envsched_jax.sched import EnvSched, EnvSchedConfig, SchedulingError
from envsched_jax.sched.cold_start import (
    COLD_RELAXATIONS,
    cold_start,
    cold_start_batch,
    cold_start_reference,
    infeasible_message,
    max_env_size,
    representatives,
)

from sched_helpers import graph_from_matrices


def _scenario(rng, *, n, num_envs, grid, dtype, excluded_frac, shuffled=True):
    """Symmetric S_full with unit diagonal; ``grid``: round to multiples of 1/grid (0: 6
    decimals, like built graphs), coarse grids make many exact ties."""
    env = np.concatenate([np.arange(num_envs), rng.integers(0, num_envs, size=n - num_envs)])
    if shuffled:
        rng.shuffle(env)
    else:
        env = np.sort(env)
    a = rng.random((n, n)) * 0.7
    a = (a + a.T) / 2
    same = env[:, None] == env[None, :]
    a = np.where(same, np.minimum(a + 0.3, 1.0), a)
    a = np.round(a * grid) / grid if grid else np.round(a, 6)
    np.fill_diagonal(a, 1.0)
    excluded = rng.random(n) < excluded_frac
    return a.astype(dtype), env.astype(np.int32), excluded


PAD_N, PAD_E = 64, 13


def _kernel(s_full, env, excluded, *, batch_size, relax, cap_step, pad=False):
    """Run the kernel. ``pad``: embed the graph in a fixed [PAD_N] one (the extra tasks excluded,
    in an environment of their own: they change nothing), so that the random cases share a few
    compilations."""
    num_envs, m = int(env.max()) + 1, max_env_size(env)
    if pad:
        n = len(env)
        big = np.zeros((PAD_N, PAD_N), s_full.dtype)
        big[:n, :n] = s_full
        np.fill_diagonal(big, 1.0)
        env = np.concatenate([env, np.full(PAD_N - n, PAD_E - 1, np.int32)])
        excluded = np.concatenate([excluded, np.ones(PAD_N - n, bool)])
        s_full, num_envs, m = big, PAD_E, PAD_N
    out = jax.device_get(cold_start(s_full, env, excluded, np.int32(cap_step), batch_size=batch_size,
                                    num_envs=num_envs, max_env_size=m, relax=relax))
    return out


def _compare(s_full, env, excluded, *, batch_size, relax, cap_step):
    """Kernel vs reference: the same batch and relaxations, or both infeasible at the same pick."""
    try:
        want, want_relax = cold_start_reference(s_full, env, batch_size, excluded, relax, cap_step)
    except SchedulingError as err:
        want, want_relax = None, str(err)
    got = _kernel(s_full, env, excluded, batch_size=batch_size, relax=relax, cap_step=cap_step, pad=True)
    if want is None:
        assert not got.feasible.all()
        filled = int(np.argmin(got.feasible))
        assert got.feasible[:filled].all() and not got.feasible[filled:].any()
        assert infeasible_message(filled, batch_size, int(got.num_representatives)) == want_relax
        return "infeasible"
    assert got.feasible.all()
    np.testing.assert_array_equal(got.batch, want)
    assert [COLD_RELAXATIONS[lvl] for lvl in got.relaxed.tolist() if lvl] == want_relax
    return "relaxed" if want_relax else "plain"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kernel_matches_the_numpy_reference_on_random_graphs(dtype):
    rng = np.random.default_rng(0 if dtype == "float32" else 1)
    outcomes = {"plain": 0, "relaxed": 0, "infeasible": 0}
    more_envs_than_b = excluded_any = 0
    with jax.enable_x64(dtype == "float64"):
        for case in range(60):
            num_envs = int(rng.integers(1, 12))
            n = int(rng.integers(num_envs + 1, 60))
            grid = [0, 4, 8, 64][case % 4]
            s_full, env, excluded = _scenario(rng, n=n, num_envs=num_envs, grid=grid, dtype=dtype,
                                              excluded_frac=[0.0, 0.2, 0.5][case % 3], shuffled=case % 5 != 0)
            excluded_any += excluded.any()
            batch_size = int(rng.choice([1, 3, 8, 16]))   # few distinct shapes: few compilations
            more_envs_than_b += num_envs > batch_size
            for relax in (False, True):
                for cap_step in (1, 2, 3, 4):
                    outcomes[_compare(s_full, env, excluded, batch_size=batch_size, relax=relax,
                                      cap_step=cap_step)] += 1
    assert min(outcomes.values()) > 0, outcomes
    assert more_envs_than_b >= 5 and excluded_any >= 20


def test_representatives_tie_to_the_lower_index_exactly():
    """Members whose means are mathematically equal tie whatever the summation order: these five
    float32 values summed one by one in float32 give three different results depending on the
    order. Nodes 0 and 6 see the same values (in other orders); both must tie, and node 0 wins."""
    vals = np.float32([0.750365, 0.280409, 0.485191, 0.980737, 0.961657])
    n = 7
    s = np.zeros((n, n), np.float32)
    others = [1, 2, 3, 4, 5]
    for j, v in zip(others, vals):
        s[0, j] = s[j, 0] = v
    for j, v in zip(others, vals[[3, 0, 4, 2, 1]]):
        s[6, j] = s[j, 6] = v
    s[0, 6] = s[6, 0] = 0.2
    np.fill_diagonal(s, 1.0)
    env = np.zeros(n, np.int32)
    for excluded in (np.zeros(n, bool), np.eye(n, dtype=bool)[0]):
        reps = np.asarray(representatives(s, env, excluded, num_envs=1, max_env_size=n))
        ref, _ = cold_start_reference(s, env, 1, excluded, False, 4)
        assert reps.tolist() == ref.tolist() == [0 if not excluded[0] else 6]


def test_more_environments_than_b_ties_go_to_the_lowest_index():
    """Item 8c: on an empty batch every representative's novelty is 1, so the first pick is a
    tie; it goes to the lowest node index, not to the first environment. Environment 0's tasks
    come last here, so the two rules differ."""
    env = np.array([2, 2, 1, 1, 0, 0], np.int32)
    s = np.full((6, 6), 0.1, np.float32)
    for e in range(3):
        i, j = np.flatnonzero(env == e)
        s[i, j] = s[j, i] = 0.5
    s[0, 4] = s[4, 0] = 0.4     # the second pick avoids what is similar to the first
    np.fill_diagonal(s, 1.0)
    excluded = np.zeros(6, bool)
    got = _kernel(s, env, excluded, batch_size=2, relax=False, cap_step=4)
    want, _ = cold_start_reference(s, env, 2, excluded, False, 4)
    # representatives: ties inside each environment -> its lower index: 4 (env 0), 2 (env 1), 0 (env 2)
    assert np.asarray(representatives(s, env, excluded, num_envs=3, max_env_size=2)).tolist() == [4, 2, 0]
    assert got.batch.tolist() == want.tolist() == [0, 2]
    # with E <= B all representatives enter in environment order, then novelty picks
    got = _kernel(s, env, excluded, batch_size=4, relax=False, cap_step=4)
    want, _ = cold_start_reference(s, env, 4, excluded, False, 4)
    assert got.batch.tolist()[:3] == [4, 2, 0] and got.batch.tolist() == want.tolist()


@pytest.mark.parametrize("g1, w1, g2, w2, winner", [
    # g1 + w1 == g2 + w2 exactly: a tie, node 1 wins; 0.5 (1 - g) + 0.5 (1 - w) evaluated in
    # float32 prefers node 2
    (0.6899851, 0.49555513, 0.8877665, 0.29777375, 1),
    # g2 + w2 smaller by one float32 ulp: node 2 is more novel; in float32 the two novelties tie
    (0.6996535, 0.414143, 0.5699056, 0.5438909, 2),
])
def test_novelty_ties_are_exact(g1, w1, g2, w2, winner):
    """Batch [0, 3, 4] (the representatives; node 0 is environment 0's), then one novelty pick
    between nodes 1 and 2 of environment 0: w = similarity to node 0, g = to node 3 (larger)."""
    g1, w1, g2, w2 = np.float32([g1, w1, g2, w2])
    exact = (float(g1) + float(w1)) - (float(g2) + float(w2))    # float64: exact for these
    assert exact == 0.0 if winner == 1 else exact > 0.0
    env = np.array([0, 0, 0, 1, 2], np.int32)
    s = np.zeros((5, 5), np.float32)
    s[0, 1], s[1, 3], s[0, 2], s[2, 3] = w1, g1, w2, g2
    s = np.maximum(s, s.T)
    np.fill_diagonal(s, 1.0)
    excluded = np.zeros(5, bool)
    got = _kernel(s, env, excluded, batch_size=4, relax=False, cap_step=4)
    want, _ = cold_start_reference(s, env, 4, excluded, False, 4)
    assert got.batch.tolist() == want.tolist() == [0, 3, 4, winner]


def test_envsched_step_zero_uses_the_kernel():
    rng = np.random.default_rng(3)
    s_full, env, _ = _scenario(rng, n=40, num_envs=10, grid=8, dtype="float32", excluded_frac=0.0)
    graph = graph_from_matrices(s_full, s_full, env)
    excluded = [f"t{i}" for i in (1, 5, 17)]
    mask = np.zeros(40, bool)
    mask[[1, 5, 17]] = True
    for batch_size in (6, 12):   # fewer and more slots than environments
        sched = EnvSched(graph, EnvSchedConfig(batch_size=batch_size, group_size=4), excluded=excluded)
        ids = sched.select(0)
        want, _ = cold_start_reference(s_full, env, batch_size, mask, False, 4)
        assert ids == [f"t{i}" for i in want]


def test_host_wrapper_raises_the_numpy_versions_error():
    s_full, _, _ = _scenario(np.random.default_rng(8), n=10, num_envs=2, grid=0, dtype="float32",
                             excluded_frac=0.0)
    env = np.array([0] * 5 + [1] * 5, np.int32)
    excluded = np.zeros(10, bool)
    with pytest.raises(SchedulingError) as want:
        cold_start_reference(s_full, env, 6, excluded, False, 4)
    with pytest.raises(SchedulingError) as got:
        cold_start_batch(s_full, env, excluded, 4, batch_size=6, relax=False)
    assert str(got.value) == str(want.value) == (
        "cold start: only 4 of 6 slots can be filled with at most two tasks per environment (2 environments); "
        "use a smaller batch_size or infeasible='relax'")
    batch, relaxed = cold_start_batch(s_full, env, excluded, 4, batch_size=6, relax=True)
    want_batch, want_relaxed = cold_start_reference(s_full, env, 6, excluded, True, 4)
    assert batch.tolist() == want_batch.tolist() and relaxed == want_relaxed == ["cold_two_per_env"] * 2
