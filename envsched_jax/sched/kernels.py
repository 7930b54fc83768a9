"""EnvSched's jit-compiled kernels: pure functions over an immutable state pytree.

Shapes: N nodes, E environments, L = history_capacity, S = step_capacity, B batch size, K group
size, Kw / Kc within / cross neighbours. Index suffixes: ``_i`` node, ``_e`` environment, ``_l``
log slot, ``_s`` step slot. Every equation follows the package docstring of
:mod:`envsched_jax.sched`; the NumPy reference in ``tests/reference_envsched.py`` is tested against
these kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

# Column order of the statistics y in logs and references.
V, M, D = 0, 1, 2
_LOWER = (0.0, 0.0, 0.0)
_UPPER = (0.25, 1.0, 1.0)


@struct.dataclass
class EnvSchedState:
    """Everything EnvSched remembers. Fixed shapes; updated only by returning a new state."""

    step: jax.Array            # [] int32: the next step to select
    key: jax.Array             # [2] uint32: PRNG key (EnvSched is deterministic; kept for the API)
    log_step: jax.Array        # [N, L] int32: step of each logged observation (oldest first), -1 = empty
    log_y: jax.Array           # [N, L, 3] float: (v, m, d) of each logged observation
    log_b: jax.Array           # [N, L, 3] float: the step means b[y, s] of each observation's step
    num_obs: jax.Array         # [N] int32: observations ever made of each node
    step_ids: jax.Array        # [S] int32: step held by each step slot (slot = step % S), -1 = empty
    step_means: jax.Array      # [S, 3] float: step means b[y, s]
    nbr_in: jax.Array          # [N, Kw] int32: within-environment neighbours among observed nodes
    nbr_in_sim: jax.Array      # [N, Kw] float: their S_full similarities
    nbr_cross: jax.Array       # [N, Kc] int32: cross-environment neighbours among observed nodes
    nbr_cross_sim: jax.Array   # [N, Kc] float: their S_abs similarities
    sel_count: jax.Array       # [N] int32: c_i, selections over completed steps
    env_total: jax.Array       # [E] int32: selections of each environment over completed steps
    env_recent: jax.Array      # [2, E] int32: per-environment selections at steps t-1 and t-2
    run: jax.Array             # [N] int32: consecutive steps up to t-1 in which the node was picked
    excluded: jax.Array        # [N] bool: identifier-filtered nodes (never eligible)


def init_state(num_nodes: int, num_envs: int, config, key: jax.Array) -> EnvSchedState:
    dtype = jnp.dtype(config.dtype)
    n, e = num_nodes, num_envs
    return EnvSchedState(
        step=jnp.zeros((), jnp.int32), key=key,
        log_step=jnp.full((n, config.history_capacity), -1, jnp.int32),
        log_y=jnp.zeros((n, config.history_capacity, 3), dtype),
        log_b=jnp.zeros((n, config.history_capacity, 3), dtype),
        num_obs=jnp.zeros((n,), jnp.int32),
        step_ids=jnp.full((config.step_capacity,), -1, jnp.int32),
        step_means=jnp.zeros((config.step_capacity, 3), dtype),
        nbr_in=jnp.full((n, config.k_within), -1, jnp.int32),
        nbr_in_sim=jnp.zeros((n, config.k_within), dtype),
        nbr_cross=jnp.full((n, config.k_cross), -1, jnp.int32),
        nbr_cross_sim=jnp.zeros((n, config.k_cross), dtype),
        sel_count=jnp.zeros((n,), jnp.int32), env_total=jnp.zeros((e,), jnp.int32),
        env_recent=jnp.zeros((2, e), jnp.int32), run=jnp.zeros((n,), jnp.int32),
        excluded=jnp.zeros((n,), bool))


# --------------------------------------------------------------------------------------------
# Observation statistics (eq. 2, 9)


def group_stats(rewards: jax.Array) -> jax.Array:
    """[B, K] rewards -> [B, 3] (v, m, d): population variance, mean and mean-corrected
    dispersion d = clip(v / max(m (1 - m), 0.01), 0, 1)."""
    m = rewards.mean(axis=1)
    v = ((rewards - m[:, None]) ** 2).mean(axis=1)
    d = jnp.clip(v / jnp.maximum(m * (1.0 - m), 0.01), 0.0, 1.0)
    return jnp.stack([v, m, d], axis=1)


# --------------------------------------------------------------------------------------------
# Ranks and quantiles (eq. 8, 12, 13)


def sort_values(x: jax.Array) -> jax.Array:
    """``jnp.sort(x)`` for a 1-D float array, computed on integer keys.

    XLA's CPU sort is several times faster on integers than on floats (it compares floats through
    a total-order comparator). Float bits map to integers of the same order: non-negative floats
    keep their bit pattern, negative ones have their 31 (63) magnitude bits flipped; -0.0 is made
    +0.0 first so that it ties with 0.0 as in a float comparison."""
    itype = jnp.int32 if x.dtype == jnp.float32 else jnp.int64
    mask = jnp.asarray(jnp.iinfo(itype).max, itype)
    bits = jax.lax.bitcast_convert_type(x + 0.0, itype)
    key = jnp.where(bits < 0, bits ^ mask, bits)
    key = jax.lax.sort(key, is_stable=False)
    return jax.lax.bitcast_convert_type(jnp.where(key < 0, key ^ mask, key), x.dtype)


def percentile_rank(z: jax.Array, sorted_z: jax.Array | None = None) -> jax.Array:
    """pr(z_i) = (rankavg(z_i) - 0.5) / N with 1-based ranks, ties given their average rank.
    ``sorted_z`` may pass ``jnp.sort(z)`` when the caller already has it."""
    n = z.shape[0]
    sorted_z = sort_values(z) if sorted_z is None else sorted_z
    below = jnp.searchsorted(sorted_z, z, side="left")
    upto = jnp.searchsorted(sorted_z, z, side="right")
    rank = (below + upto + 1) / 2.0
    return ((rank - 0.5) / n).astype(z.dtype)


def quantile_map(values: jax.Array, p: jax.Array, sorted_v: jax.Array | None = None) -> jax.Array:
    """Empirical quantile function of ``values`` at ``p`` in [0, 1], linear interpolation between
    order statistics at position p (N - 1) (numpy.quantile's default)."""
    sorted_v = sort_values(values) if sorted_v is None else sorted_v
    pos = jnp.clip(p, 0.0, 1.0) * (values.shape[0] - 1)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, values.shape[0] - 1)
    frac = (pos - lo).astype(values.dtype)
    return sorted_v[lo] + frac * (sorted_v[hi] - sorted_v[lo])


# --------------------------------------------------------------------------------------------
# History, references, relations (eq. 3, 4, 6, 7, 10, 11)


class HalfLifeEstimate(NamedTuple):
    bhat: jax.Array     # [3] global reference
    W: jax.Array        # [N] effective history weight
    ybar: jax.Array     # [N, 3] history estimate
    G_in: jax.Array     # [N, 3]
    G_cross: jax.Array  # [N, 3]
    P: jax.Array        # [N, 3] graph prior
    yhat: jax.Array     # [N, 3] posterior
    f: jax.Array        # [N] reconstructed variance
    u: jax.Array        # [N] calibrated score for this half-life


def _usable(state: EnvSchedState, t: jax.Array, step_capacity: int) -> tuple[jax.Array, jax.Array]:
    """Masks of usable log entries [N, L] and step slots [S]: steps in [t - S, t) whose step
    mean is still held."""
    slot_ok = (state.step_ids >= 0) & (state.step_ids < t) & (state.step_ids >= t - step_capacity)
    # Steps are strictly sequential, so the step ring holds exactly the steps in [t - S, t).
    log_ok = (state.log_step >= 0) & (state.log_step >= t - step_capacity)
    return log_ok, slot_ok


def neighbour_bandwidth(sim: jax.Array, valid: jax.Array) -> jax.Array:
    """sigma = max(median_j delta_ij, 0.05) over each row's valid neighbours (numpy's median:
    mean of the two middle values for an even count); 0.05 for a row without neighbours.

    The order statistics come from pairwise rank counting over the (short) rows, which is much
    cheaper on CPU than XLA's batched sort."""
    delta = jnp.where(valid, jnp.clip(1.0 - sim, 0.0, 1.0), jnp.inf)
    k = delta.shape[1]
    pos = jnp.arange(k)
    d_a, d_b = delta[:, :, None], delta[:, None, :]
    rank = ((d_b < d_a) | ((d_b == d_a) & (pos[None, None, :] < pos[None, :, None]))).sum(-1)  # [N, k]
    count = valid.sum(axis=1)
    lo = jnp.maximum((count - 1) // 2, 0)
    hi = jnp.maximum(count // 2, 0)
    pick_lo = jnp.where(rank == lo[:, None], delta, 0.0).sum(1)
    pick_hi = jnp.where(rank == hi[:, None], delta, 0.0).sum(1)
    return jnp.where(count > 0, jnp.maximum(0.5 * (pick_lo + pick_hi), 0.05), 0.05).astype(sim.dtype)


def relation_estimate(nbr: jax.Array, sim: jax.Array, sigma: jax.Array, W: jax.Array,
                      ybar: jax.Array, bhat: jax.Array, lambda_g: float) -> jax.Array:
    """G[y, i] = (sum_j a_ij ybar_j + lambda_g bhat) / (sum_j a_ij + lambda_g),
    a_ij = exp(-0.5 (delta_ij / sigma_i)^2) clip(W_j, 0.1, 3)."""
    valid = nbr >= 0
    j = jnp.maximum(nbr, 0)
    delta = jnp.clip(1.0 - sim, 0.0, 1.0)
    a = jnp.exp(-0.5 * (delta / sigma[:, None]) ** 2) * jnp.clip(W[j], 0.1, 3.0)
    a = jnp.where(valid, a, 0.0)
    num = (a[..., None] * ybar[j]).sum(axis=1) + lambda_g * bhat[None, :]
    return num / (a.sum(axis=1, keepdims=True) + lambda_g)


def half_life_estimate(state: EnvSchedState, t: jax.Array, h: float, sigma_in: jax.Array,
                       sigma_cross: jax.Array, config) -> HalfLifeEstimate:
    """Centering, node histories, relation estimates, fusion, posterior and calibrated u(h)."""
    dtype = state.log_y.dtype
    log_ok, slot_ok = _usable(state, t, config.step_capacity)
    age_s = (t - state.step_ids).astype(dtype)
    w_s = jnp.where(slot_ok, jnp.exp2(-age_s / h), 0.0)
    bhat = (w_s[:, None] * state.step_means).sum(0) / jnp.maximum(w_s.sum(), 1e-30)

    lower = jnp.asarray(_LOWER, dtype)
    upper = jnp.asarray(_UPPER, dtype)
    ytilde = jnp.clip(state.log_y - state.log_b + bhat, lower, upper)       # [N, L, 3]
    w_l = jnp.where(log_ok, jnp.exp2(-(t - state.log_step).astype(dtype) / h), 0.0)
    W = w_l.sum(axis=1)
    ybar = jnp.where(W[:, None] > 0,
                     (w_l[..., None] * ytilde).sum(axis=1) / jnp.maximum(W, 1e-30)[:, None],
                     bhat[None, :])

    G_in = relation_estimate(state.nbr_in, state.nbr_in_sim, sigma_in, W, ybar, bhat, config.lambda_g)
    G_cross = relation_estimate(state.nbr_cross, state.nbr_cross_sim, sigma_cross, W, ybar, bhat,
                                config.lambda_g)
    P = 0.5 * G_in + 0.5 * G_cross
    yhat = (W[:, None] * ybar + config.lambda_s * P) / (W[:, None] + config.lambda_s)
    vhat, mhat, dhat = yhat[:, V], yhat[:, M], yhat[:, D]
    f = dhat * mhat * (1.0 - mhat)
    sorted_vhat = sort_values(vhat)
    u = quantile_map(vhat, 0.65 * percentile_rank(vhat, sorted_vhat) + 0.35 * percentile_rank(f), sorted_vhat)
    return HalfLifeEstimate(bhat, W, ybar, G_in, G_cross, P, yhat, f, u)


class Scores(NamedTuple):
    long: HalfLifeEstimate
    short: HalfLifeEstimate
    sigma_in: jax.Array
    sigma_cross: jax.Array
    u: jax.Array   # [N] after the recent-decline correction
    q: jax.Array   # [N] final score


def score_pass(state: EnvSchedState, config) -> Scores:
    """The whole estimation pass for selecting at ``state.step`` (eq. 3-4, 6-8, 10-13)."""
    t = state.step
    sigma_in = neighbour_bandwidth(state.nbr_in_sim, state.nbr_in >= 0)
    sigma_cross = neighbour_bandwidth(state.nbr_cross_sim, state.nbr_cross >= 0)
    long = half_life_estimate(state, t, config.h_long, sigma_in, sigma_cross, config)
    short = half_life_estimate(state, t, config.h_short, sigma_in, sigma_cross, config)
    u = long.u - config.eta * jnp.maximum(long.u - short.u, 0.0)
    return Scores(long, short, sigma_in, sigma_cross, u, percentile_rank(u))


# --------------------------------------------------------------------------------------------
# Progress filter (appendix C; the formula is ours, see the package docstring)


class Progress(NamedTuple):
    n: jax.Array          # [N] scorable transitions per node
    est: jax.Array        # [N] shrunk residual estimate
    excluded: jax.Array   # [N] bool: leaves the exploitation candidates


def _spd_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """Solve a x = b for a small symmetric positive-definite ``a`` by an unrolled Cholesky
    factorisation (a handful of scalar ops; cheaper on CPU than a LAPACK call for 5 x 5)."""
    k = a.shape[0]
    L = [[None] * k for _ in range(k)]
    for i in range(k):
        for j in range(i + 1):
            acc = a[i, j] - sum((L[i][p] * L[j][p] for p in range(j)), jnp.zeros((), a.dtype))
            L[i][j] = jnp.sqrt(acc) if i == j else acc / L[j][j]
    z = []
    for i in range(k):  # L z = b
        z.append((b[i] - sum((L[i][p] * z[p] for p in range(i)), jnp.zeros((), a.dtype))) / L[i][i])
    x = [None] * k
    for i in reversed(range(k)):  # L^T x = z
        x[i] = (z[i] - sum((L[p][i] * x[p] for p in range(i + 1, k)), jnp.zeros((), a.dtype))) / L[i][i]
    return jnp.stack(x)


def progress_filter(state: EnvSchedState, env_index: jax.Array, num_envs: int, config) -> Progress:
    """Ridge regression of the next mean reward on (m, m^2, v, step, count, environment), fitted on
    the transitions between consecutive usable observations; a node's mean residual is shrunk
    toward environment and neighbour references as in eq. 4; nodes with enough transitions and a
    non-positive estimate leave the exploitation candidates."""
    dtype = state.log_y.dtype
    ok, _ = _usable(state, state.step, config.step_capacity)
    steps, y = state.log_step, state.log_y      # chronological: oldest first, empty slots last
    pair = ok[:, :-1] & ok[:, 1:]                                     # [N, L-1]
    count = jnp.cumsum(ok, axis=1)[:, :-1].astype(dtype)              # usable observations up to s1
    m1, v1 = y[:, :-1, M], y[:, :-1, V]
    # Features first ([5, N, L-1]): every reduction below runs along the minor axes.
    x = jnp.stack([m1, m1 ** 2, v1, steps[:, :-1].astype(dtype), count])
    target = y[:, 1:, M]
    w = pair.astype(dtype)
    total = jnp.maximum(w.sum(), 1.0)
    mean = (w * x).sum((1, 2)) / total
    std = jnp.sqrt((w * (x - mean[:, None, None]) ** 2).sum((1, 2)) / total)
    # A constant column (max == min over the transitions) standardises to exactly 0; testing
    # std == 0 instead would turn rounding noise in the mean into +-1 values.
    inf = jnp.asarray(jnp.inf, dtype)
    col_max = jnp.max(jnp.where(pair, x, -inf), axis=(1, 2))
    col_min = jnp.min(jnp.where(pair, x, inf), axis=(1, 2))
    constant = (col_max <= col_min)[:, None, None]
    xs = jnp.where(constant, 0.0, (x - mean[:, None, None]) / jnp.where(constant, 1.0, std[:, None, None]))
    ybar = (w * target).sum() / total
    yc = target - ybar

    # Ridge on [xs, onehot(env)] with penalty lam on every coefficient, solved through the Schur
    # complement of the (diagonal) environment block: O(transitions + E) instead of O(E^3).
    # Environment sums go node sums first, so the scatter runs over N rows, not N x L.
    lam = config.ridge_lambda
    wxs = (w * xs).reshape(5, -1)                                         # [5, N (L-1)]
    a11 = wxs @ xs.reshape(5, -1).T + lam * jnp.eye(5, dtype=dtype)
    s_e = jax.ops.segment_sum((w * xs).sum(axis=2).T, env_index, num_envs)   # [E, 5]
    n_e = jax.ops.segment_sum(w.sum(axis=1), env_index, num_envs)            # [E]
    b1 = wxs @ yc.reshape(-1)
    b2 = jax.ops.segment_sum((w * yc).sum(axis=1), env_index, num_envs)
    inv = 1.0 / (n_e + lam)
    schur = a11 - (s_e * inv[:, None]).T @ s_e
    beta = _spd_solve(schur, b1 - s_e.T @ (b2 * inv))
    gamma = (b2 - s_e @ beta) * inv
    resid = jnp.where(pair, yc - jnp.tensordot(beta, xs, axes=1) - gamma[env_index][:, None], 0.0)

    n_i = pair.sum(axis=1)
    rbar = resid.sum(axis=1) / jnp.maximum(n_i, 1)
    r_env = jax.ops.segment_sum(resid.sum(axis=1), env_index, num_envs) / jnp.maximum(
        jax.ops.segment_sum(n_i, env_index, num_envs), 1)
    nbrs = jnp.concatenate([state.nbr_in, state.nbr_cross], axis=1)
    nb_ok = (nbrs >= 0) & (n_i[jnp.maximum(nbrs, 0)] > 0)
    r_nb = (jnp.where(nb_ok, rbar[jnp.maximum(nbrs, 0)], 0.0).sum(1)
            / jnp.maximum(nb_ok.sum(1), 1))
    prior = 0.5 * r_env[env_index] + 0.5 * r_nb
    est = (n_i * rbar + config.lambda_s * prior) / (n_i + config.lambda_s)
    est = jnp.where(pair.sum() >= 2, est, 0.0)  # no fit on fewer than two transitions
    return Progress(n_i, est, (n_i >= config.progress_min_transitions) & (est <= 0))


# --------------------------------------------------------------------------------------------
# Greedy batch selection (eq. 5, appendix C)

# Relaxation levels of an infeasible pick, in order: 0 none, 1 progress filter, 2 consecutive cap,
# 3 rolling three-step cap, 4 per-step cap.
RELAXATIONS = ("none", "progress_filter", "cap_consecutive", "cap_window", "cap_step")


class Selection(NamedTuple):
    batch: jax.Array      # [B] int32 node indices in pick order
    phase: jax.Array      # [B] int32: 1 coverage, 2 exploitation
    relaxed: jax.Array    # [B] int32: relaxation level used for the pick (index into RELAXATIONS)
    feasible: jax.Array   # [B] bool: some node was available at all


def select_batch(state: EnvSchedState, q: jax.Array, prog_excluded: jax.Array, s_full: jax.Array,
                 env_index: jax.Array, config) -> Selection:
    """Coverage picks then exploitation picks into one batch, greedily (eq. 5)."""
    n = q.shape[0]
    B, b_cov = config.batch_size, config.num_coverage
    dtype = q.dtype
    omega = (1.0 + state.sel_count.astype(dtype) / config.c0) ** -0.5
    window_env = state.env_recent.sum(axis=0)                          # steps t-1 and t-2
    env_total_i = state.env_total[env_index]
    big = jnp.iinfo(jnp.int32).max

    def pick(k, carry):
        batch, phase, relaxed, feasible, in_batch, env_count, max_sim = carry
        coverage = k < b_cov
        cnt = env_count[env_index]
        base = ~in_batch & ~state.excluded
        levels = jnp.stack([
            base & (cnt < config.cap_step) & (window_env[env_index] + cnt < config.cap_window)
            & (state.run < config.cap_consecutive) & (coverage | ~prog_excluded),
            base & (cnt < config.cap_step) & (window_env[env_index] + cnt < config.cap_window)
            & (state.run < config.cap_consecutive),
            base & (cnt < config.cap_step) & (window_env[env_index] + cnt < config.cap_window),
            base & (cnt < config.cap_step),
            base,
        ])
        if config.infeasible == "relax":   # static choice: the first level with a candidate
            level = jnp.argmax(levels.any(axis=1))
        else:                              # "error": never relax; the caller raises
            level = jnp.zeros((), jnp.int32)
        eligible = levels[level]
        ok = eligible.any()

        # Coverage: lexicographic restriction (batch env count, env exposure, node observations).
        def restrict(mask, key):
            kmin = jnp.min(jnp.where(mask, key, big))
            return mask & (key == kmin)

        cov_mask = restrict(restrict(restrict(eligible, cnt), env_total_i), state.num_obs)
        mask = jnp.where(coverage, cov_mask, eligible)
        penalty = config.lambda_sim * max_sim
        score = jnp.where(coverage, q, q * omega) - penalty
        i = jnp.argmax(jnp.where(mask, score, -jnp.inf)).astype(jnp.int32)
        e = env_index[i]
        return (batch.at[k].set(jnp.where(ok, i, -1)),
                phase.at[k].set(jnp.where(coverage, 1, 2)),
                relaxed.at[k].set(level.astype(jnp.int32)),
                feasible.at[k].set(ok),
                in_batch.at[i].set(in_batch[i] | ok),
                env_count.at[e].add(ok.astype(jnp.int32)),
                jnp.where(ok, jnp.maximum(max_sim, s_full[i].astype(dtype)), max_sim))

    init = (jnp.full((B,), -1, jnp.int32), jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.int32),
            jnp.zeros((B,), bool), jnp.zeros((n,), bool), jnp.zeros_like(state.env_total),
            jnp.zeros((n,), dtype))
    batch, phase, relaxed, feasible, *_ = jax.lax.fori_loop(0, B, pick, init)
    return Selection(batch, phase, relaxed, feasible)


# --------------------------------------------------------------------------------------------
# Observe: logs, step means, neighbour lists, counts


def _precedes(sim_a, idx_a, ok_a, sim_b, idx_b, ok_b):
    """Whether b comes before a in the order (valid first, similarity desc, index asc)."""
    return ok_b & (~ok_a | (sim_b > sim_a) | ((sim_b == sim_a) & (idx_b < idx_a)))


def _merge_topk(nbr: jax.Array, sim: jax.Array, cand: jax.Array, cand_sim: jax.Array,
                cand_ok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Merge candidate columns into each row's top list, ordered by (similarity desc, index asc).

    ``cand`` holds the same ascending node indices in every row, so ``lax.top_k`` (ties -> lower
    position) picks the candidates' own top list in exactly that order; the two sorted lists of
    width k are then merged by counting, for each entry, the entries of the other list that come
    before it (O(N k^2), no general sort)."""
    n, k = nbr.shape
    if k == 0:
        return nbr, sim
    neg = jnp.asarray(-jnp.inf, sim.dtype)
    top_sim, pos = jax.lax.top_k(jnp.where(cand_ok, cand_sim, neg), min(k, cand.shape[1]))
    c_idx = jnp.take_along_axis(cand, pos, axis=1)
    c_ok = jnp.take_along_axis(cand_ok, pos, axis=1)
    e_ok = nbr >= 0
    # rank of each existing entry: its position + candidates before it; and vice versa.
    before_e = _precedes(sim[:, :, None], nbr[:, :, None], e_ok[:, :, None],
                         top_sim[:, None, :], c_idx[:, None, :], c_ok[:, None, :]).sum(-1)
    before_c = _precedes(top_sim[:, :, None], c_idx[:, :, None], c_ok[:, :, None],
                         sim[:, None, :], nbr[:, None, :], e_ok[:, None, :]).sum(-1)
    rank_e = jnp.where(e_ok, jnp.arange(k)[None, :] + before_e, k)
    rank_c = jnp.where(c_ok, jnp.arange(c_idx.shape[1])[None, :] + before_c, k)
    rows = jnp.arange(n)[:, None]
    out_idx = jnp.full((n, k), -1, jnp.int32)
    out_sim = jnp.zeros((n, k), sim.dtype)
    out_idx = out_idx.at[rows, rank_e].set(nbr, mode="drop").at[rows, rank_c].set(c_idx, mode="drop")
    out_sim = out_sim.at[rows, rank_e].set(sim, mode="drop").at[rows, rank_c].set(top_sim, mode="drop")
    return out_idx, out_sim


def observe_update(state: EnvSchedState, batch: jax.Array, rewards: jax.Array, s_full_rows: jax.Array,
                   s_abs_rows: jax.Array, env_index: jax.Array, config) -> EnvSchedState:
    """Record step ``state.step``'s observed groups and advance to the next step.

    ``s_full_rows`` / ``s_abs_rows`` are the [B, N] similarity rows of the batch (the matrices are
    symmetric, so they are also its columns), gathered by the caller."""
    dtype = state.log_y.dtype
    t = state.step
    n = state.num_obs.shape[0]
    stats = group_stats(rewards.astype(dtype))                                   # [B, 3]
    # Each node's log stays in chronological order (oldest first): a full row shifts left by one
    # before the new observation goes into its last slot.
    cap = config.history_capacity
    full = state.num_obs[batch] >= cap
    pos = jnp.minimum(state.num_obs[batch], cap - 1)
    rows = jnp.arange(batch.shape[0])
    row_step = jnp.where(full[:, None], jnp.roll(state.log_step[batch], -1, axis=1), state.log_step[batch])
    row_y = jnp.where(full[:, None, None], jnp.roll(state.log_y[batch], -1, axis=1), state.log_y[batch])
    row_b = jnp.where(full[:, None, None], jnp.roll(state.log_b[batch], -1, axis=1), state.log_b[batch])
    b_t = stats.mean(axis=0)
    log_step = state.log_step.at[batch].set(row_step.at[rows, pos].set(t))
    log_y = state.log_y.at[batch].set(row_y.at[rows, pos].set(stats))
    log_b = state.log_b.at[batch].set(row_b.at[rows, pos].set(b_t))
    s_slot = t % config.step_capacity
    step_ids = state.step_ids.at[s_slot].set(t)
    step_means = state.step_means.at[s_slot].set(b_t)

    # Nodes observed for the first time join every other node's neighbour candidates.
    new = state.num_obs[batch] == 0                                              # [B]
    num_obs = state.num_obs.at[batch].add(1)
    ids = jnp.arange(n)
    same_env = env_index[batch][None, :] == env_index[:, None]                   # [N, B]
    not_self = batch[None, :] != ids[:, None]
    cand = jnp.broadcast_to(batch[None, :], (n, batch.shape[0]))
    nbr_in, nbr_in_sim = _merge_topk(state.nbr_in, state.nbr_in_sim, cand,
                                     s_full_rows.T.astype(dtype), new[None, :] & same_env & not_self)
    nbr_cross, nbr_cross_sim = _merge_topk(state.nbr_cross, state.nbr_cross_sim, cand,
                                           s_abs_rows.T.astype(dtype), new[None, :] & ~same_env)

    picked = jnp.zeros((n,), bool).at[batch].set(True)
    env_now = jax.ops.segment_sum(jnp.ones_like(batch), env_index[batch], state.env_total.shape[0])
    return state.replace(
        step=t + 1, log_step=log_step, log_y=log_y, log_b=log_b, num_obs=num_obs, step_ids=step_ids,
        step_means=step_means, nbr_in=nbr_in, nbr_in_sim=nbr_in_sim, nbr_cross=nbr_cross,
        nbr_cross_sim=nbr_cross_sim, sel_count=state.sel_count + picked,
        env_total=state.env_total + env_now, env_recent=jnp.stack([env_now, state.env_recent[0]]),
        run=jnp.where(picked, state.run + 1, 0))
