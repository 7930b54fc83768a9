"""EnvSched's jit-compiled kernels: pure functions over an immutable state pytree.

``config`` is anything with :class:`~envsched_jax.sched.config.EnvSchedConfig`'s field names:
the config itself (Python values), or, under ``jax.jit``, a
:class:`~envsched_jax.sched.config.KernelConfig` whose hyper-parameters are traced arrays, so that
changing one does not recompile (:mod:`envsched_jax.sched.config`).

Shapes: N nodes, E environments, S = step_capacity, B batch size, K group size, Kw / Kc within /
cross neighbours; "observations" are the [S, B] entries of the step-major ring. Every equation follows the package docstring of
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
    """Everything EnvSched remembers. Fixed shapes; updated only by returning a new state.

    Observations live in a step-major ring: slot ``s % S`` holds the B observations of step s, so
    the history costs O(S B) whatever N is, and every node keeps all of its observations from the
    last S steps. Each observation also records where the same node's previous observation is
    (its step and position), which the progress filter's transitions need."""

    step: jax.Array            # [] int32: the next step to select
    key: jax.Array             # [2] uint32: PRNG key (EnvSched is deterministic; kept for the API)
    step_ids: jax.Array        # [S] int32: step held by each ring slot (slot = step % S), -1 = empty
    step_means: jax.Array      # [S, 3] float: step means b[y, s]
    obs_node: jax.Array        # [S, B] int32: node of each observation, -1 = empty
    obs_y: jax.Array           # [S, B, 3] float: (v, m, d) of each observation
    obs_ord: jax.Array         # [S, B] int32: the node's observation ordinal (0 = its first ever)
    obs_prev_step: jax.Array   # [S, B] int32: step of the node's previous observation, -1 = none
    obs_prev_pos: jax.Array    # [S, B] int32: its position within that step's slot
    last_step: jax.Array       # [N] int32: step of each node's latest observation, -1 = none
    last_pos: jax.Array        # [N] int32: its position within that step's slot
    num_obs: jax.Array         # [N] int32: observations ever made of each node
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
    n, e, s, b = num_nodes, num_envs, config.step_capacity, config.batch_size
    return EnvSchedState(
        step=jnp.zeros((), jnp.int32), key=key,
        step_ids=jnp.full((s,), -1, jnp.int32), step_means=jnp.zeros((s, 3), dtype),
        obs_node=jnp.full((s, b), -1, jnp.int32), obs_y=jnp.zeros((s, b, 3), dtype),
        obs_ord=jnp.zeros((s, b), jnp.int32), obs_prev_step=jnp.full((s, b), -1, jnp.int32),
        obs_prev_pos=jnp.zeros((s, b), jnp.int32),
        last_step=jnp.full((n,), -1, jnp.int32), last_pos=jnp.zeros((n,), jnp.int32),
        num_obs=jnp.zeros((n,), jnp.int32),
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
    r"""[B, K] rewards -> [B, 3] (v, m, d): population variance, mean and mean-corrected
    dispersion $d = \operatorname{clip}\left(v / \max(m (1 - m), 0.01),\ 0,\ 1\right)$."""
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


def _doubled_rank(z: jax.Array, sorted_z: jax.Array | None = None) -> jax.Array:
    """2 rankavg(z_i) as an exact integer (1-based ranks, ties given their average rank)."""
    sorted_z = sort_values(z) if sorted_z is None else sorted_z
    below = jnp.searchsorted(sorted_z, z, side="left")
    upto = jnp.searchsorted(sorted_z, z, side="right")
    return below + upto + 1


def percentile_rank(z: jax.Array, sorted_z: jax.Array | None = None) -> jax.Array:
    r"""$\operatorname{pr}(z)_i = (\operatorname{rankavg}(z)_i - 0.5) / N$ with 1-based ranks, ties
    given their average rank.
    ``sorted_z`` may pass ``jnp.sort(z)`` when the caller already has it."""
    return ((_doubled_rank(z, sorted_z) - 1).astype(z.dtype) / (2 * z.shape[0]))


def quantile_map(values: jax.Array, p: jax.Array, sorted_v: jax.Array | None = None) -> jax.Array:
    """Empirical quantile function of ``values`` at ``p`` in $[0, 1]$, linear interpolation between
    order statistics at position $p (N - 1)$ (numpy.quantile's default)."""
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
    """Masks of usable observations [S, B] and step slots [S]: steps in [t - S, t)."""
    slot_ok = (state.step_ids >= 0) & (state.step_ids < t) & (state.step_ids >= t - step_capacity)
    return slot_ok[:, None] & (state.obs_node >= 0), slot_ok


def _node_sum(values: jax.Array, nodes: jax.Array, num_nodes: int) -> jax.Array:
    """Sum [S, B, ...] observation values into their nodes (entries with node -1 must be 0)."""
    flat = values.reshape((-1,) + values.shape[2:])
    return jax.ops.segment_sum(flat, jnp.maximum(nodes, 0).reshape(-1), num_nodes)


def neighbour_bandwidth(sim: jax.Array, valid: jax.Array, *, sorted_rows: bool = False) -> jax.Array:
    r"""$\sigma_i = \max\left(\operatorname{median}_j \delta_{ij},\ 0.05\right)$ over each row's
    valid neighbours (numpy's median: mean of the two middle values for an even count); 0.05 for
    a row without neighbours.

    ``sorted_rows``: the rows are the state's neighbour lists, kept by :func:`_insert` in
    descending similarity with the valid entries first, so
    $\delta = \operatorname{clip}(1 - \mathrm{sim}, 0, 1)$ is ascending (both maps are monotone,
    also in floating point) and the middle values are read at their positions. Otherwise the
    order statistics come from pairwise rank counting over the (short) rows, which is much cheaper
    on CPU than XLA's batched sort."""
    delta = jnp.where(valid, jnp.clip(1.0 - sim, 0.0, 1.0), jnp.inf)
    count = valid.sum(axis=1)
    lo = jnp.maximum((count - 1) // 2, 0)
    hi = jnp.maximum(count // 2, 0)
    if sorted_rows:
        k = max(delta.shape[1], 1)
        delta = jnp.where(valid, delta, 0.0) if delta.shape[1] else jnp.zeros((delta.shape[0], 1), sim.dtype)
        pick_lo = jnp.take_along_axis(delta, jnp.minimum(lo, k - 1)[:, None], axis=1)[:, 0]
        pick_hi = jnp.take_along_axis(delta, jnp.minimum(hi, k - 1)[:, None], axis=1)[:, 0]
    else:
        k = delta.shape[1]
        pos = jnp.arange(k)
        d_a, d_b = delta[:, :, None], delta[:, None, :]
        rank = ((d_b < d_a) | ((d_b == d_a) & (pos[None, None, :] < pos[None, :, None]))).sum(-1)  # [N, k]
        pick_lo = jnp.where(rank == lo[:, None], delta, 0.0).sum(1)
        pick_hi = jnp.where(rank == hi[:, None], delta, 0.0).sum(1)
    return jnp.where(count > 0, jnp.maximum(0.5 * (pick_lo + pick_hi), 0.05), 0.05).astype(sim.dtype)


def _sum_axis(x: jax.Array, axis: int) -> jax.Array:
    """Sum over a short axis as an unrolled chain of adds, in index order.

    XLA's CPU backend hands reductions to YNNPACK; in a profiled run at N = 2,550 (jaxlib 0.10.2,
    under load) the [N, K, 3] -> [N, 3] neighbour sums took 0.7-0.8 ms each and the
    [5, S, B] -> [S, B] feature sum 0.86 ms. As elementwise adds the same sums fuse with their
    producers into one loop; with the shared neighbour gathers of :func:`_half_life_estimates`
    the score pass went from 2.9 to 1.8 ms (unprofiled)."""
    parts = [jax.lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def relation_estimate(nbr: jax.Array, sim: jax.Array, sigma: jax.Array, W: jax.Array,
                      ybar: jax.Array, bhat: jax.Array, lambda_g: float) -> jax.Array:
    r"""The relation estimate of eq. 3 with the neighbour weights of eq. 7:

    $$
    G^y_i = \frac{\sum_j a_{ij}\, \bar y_j + \lambda_g \hat b^y}{\sum_j a_{ij} + \lambda_g}, \qquad
    a_{ij} = \exp\left(-\tfrac{1}{2} (\delta_{ij} / \sigma_i)^2\right) \operatorname{clip}(W_j, 0.1, 3).
    $$

    ``W`` may carry trailing axes ([N, ...], ``ybar`` [N, ..., 3], ``bhat`` [..., 3]): the score
    pass evaluates both half-lives in one call, sharing the kernel
    $\exp\left(-\tfrac{1}{2} (\delta / \sigma)^2\right)$ and one gather of the neighbours'
    (W, ybar)."""
    n, k = nbr.shape
    extra = W.ndim - 1
    valid = nbr >= 0
    j = jnp.maximum(nbr, 0)
    delta = jnp.clip(1.0 - sim, 0.0, 1.0)
    # delta / sigma is exactly 1 where they are equal (every row with one neighbour, where sigma is
    # that neighbour's delta): XLA rewrites a division by a broadcast as a multiplication by its
    # reciprocal, which gave 0.9999999999999999 for a sixth of such rows, so equal inputs stopped
    # giving equal weights and split percentile ranks that the equations tie.
    ratio = jnp.where(delta == sigma[:, None], 1.0, delta / sigma[:, None])
    kernel = jnp.where(valid, jnp.exp(-0.5 * ratio ** 2), 0.0).reshape((n, k) + (1,) * extra)
    table = jnp.concatenate([W[..., None], ybar], axis=-1)                 # [N, ..., 4]
    rows = jnp.take(table, j, axis=0, mode="clip")                         # [N, k, ..., 4]
    a = kernel * jnp.clip(rows[..., 0], 0.1, 3.0)                          # [N, k, ...]
    num = _sum_axis(a[..., None] * rows[..., 1:], 1) + lambda_g * bhat
    return num / (_sum_axis(a, 1)[..., None] + lambda_g)


def _calibrate(vhat: jax.Array, f: jax.Array, config) -> jax.Array:
    """u = Q_vhat(a pr(vhat) + b pr(f)) (eq. 12-13) with a + b = 1 (0.65 and 0.35 as the integers 13
    and 7), evaluated exactly from doubled ranks (package docstring)."""
    n = vhat.shape[0]
    sorted_vhat = sort_values(vhat)
    a, b = config.calibration
    total = a + b
    p = (a * _doubled_rank(vhat, sorted_vhat) + b * _doubled_rank(f) - total).astype(vhat.dtype) / (2 * total * n)
    return quantile_map(vhat, p, sorted_vhat)


def _half_life_estimates(state: EnvSchedState, t: jax.Array, hs: tuple, sigma_in: jax.Array,
                         sigma_cross: jax.Array, config) -> list[HalfLifeEstimate]:
    """Centering, node histories, relation estimates, fusion, posterior and calibrated u(h) for
    each half-life in ``hs``, evaluated together (a trailing half-life axis) so that the
    neighbour gathers and kernels are shared."""
    dtype = state.obs_y.dtype
    n = state.num_obs.shape[0]
    obs_ok, slot_ok = _usable(state, t, config.step_capacity)
    h = jnp.stack([jnp.asarray(x, dtype) for x in hs])                                  # [H]
    w_s = jnp.where(slot_ok[:, None], jnp.exp2(-(t - state.step_ids).astype(dtype)[:, None] / h), 0.0)  # [S, H]
    bhat = (w_s[:, :, None] * state.step_means[:, None, :]).sum(0) / jnp.maximum(w_s.sum(0), 1e-30)[:, None]  # [H, 3]

    lower = jnp.asarray(_LOWER, dtype)
    upper = jnp.asarray(_UPPER, dtype)
    ytilde = jnp.clip(state.obs_y[:, :, None, :] - state.step_means[:, None, None, :] + bhat, lower, upper)  # [S, B, H, 3]
    w_o = jnp.where(obs_ok[..., None], w_s[:, None, :], 0.0)                           # [S, B, H]
    sums = _node_sum(jnp.concatenate([w_o[..., None], w_o[..., None] * ytilde], axis=-1), state.obs_node, n)
    W = sums[..., 0]                                                                     # [N, H]
    ybar = jnp.where(W[..., None] > 0, sums[..., 1:] / jnp.maximum(W, 1e-30)[..., None], bhat[None])  # [N, H, 3]

    G_in = relation_estimate(state.nbr_in, state.nbr_in_sim, sigma_in, W, ybar, bhat, config.lambda_g)
    G_cross = relation_estimate(state.nbr_cross, state.nbr_cross_sim, sigma_cross, W, ybar, bhat,
                                config.lambda_g)
    P = {"both": 0.5 * G_in + 0.5 * G_cross, "within": G_in, "cross": G_cross}[config.relations]
    yhat = (W[..., None] * ybar + config.lambda_s * P) / (W[..., None] + config.lambda_s)
    mhat = yhat[..., M]
    f = yhat[..., D] * mhat * (1.0 - mhat)
    out = []
    for i in range(len(hs)):
        vhat = yhat[:, i, V]
        out.append(HalfLifeEstimate(bhat[i], W[:, i], ybar[:, i], G_in[:, i], G_cross[:, i], P[:, i],
                                    yhat[:, i], f[:, i], _calibrate(vhat, f[:, i], config)))
    return out


def half_life_estimate(state: EnvSchedState, t: jax.Array, h: float, sigma_in: jax.Array,
                       sigma_cross: jax.Array, config) -> HalfLifeEstimate:
    """Centering, node histories, relation estimates, fusion, posterior and calibrated u(h)."""
    return _half_life_estimates(state, t, (h,), sigma_in, sigma_cross, config)[0]


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
    sigma_in = neighbour_bandwidth(state.nbr_in_sim, state.nbr_in >= 0, sorted_rows=True)
    sigma_cross = neighbour_bandwidth(state.nbr_cross_sim, state.nbr_cross >= 0, sorted_rows=True)
    long, short = _half_life_estimates(state, t, (config.h_long, config.h_short), sigma_in, sigma_cross, config)
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


def _ridge_solve(a11: jax.Array, s_e: jax.Array, n_e: jax.Array, b1: jax.Array, b2: jax.Array,
                 lam: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Ridge on [xs, onehot(env)] with penalty lam on every coefficient, from its normal equations
    (a11 = xs'W xs + lam I [5, 5], s_e = per-environment sums of w xs [E, 5], n_e = per-environment
    weights [E], b1 = xs'W yc [5], b2 = per-environment sums of w yc [E]), solved through the Schur
    complement of the (diagonal) environment block: O(E) instead of O(E^3). Returns (beta, gamma)."""
    inv = 1.0 / (n_e + lam)
    schur = a11 - (s_e * inv[:, None]).T @ s_e
    beta = _spd_solve(schur, b1 - s_e.T @ (b2 * inv))
    return beta, (b2 - s_e @ beta) * inv


def _exclusive_prefix(values: jax.Array, order: jax.Array, inverse: jax.Array, combine, empty) -> jax.Array:
    """For every ring slot, ``combine`` (a cumulative op along axis 0) over the slots of strictly
    earlier steps: ``order`` sorts the slots by step, ``inverse`` undoes it."""
    ordered = values[order]
    inclusive = combine(ordered, axis=0)
    shifted = jnp.concatenate([jnp.full_like(inclusive[:1], empty), inclusive[:-1]], axis=0)
    return shifted[inverse]


def _earlier_steps_residuals(x, target, pair, w, slot_ok, step_ids, env_o, num_envs, lam):
    """The paper's rule (appendix C): the transitions of each step are scored by a ridge fit on the
    transitions of strictly earlier steps (within the history window) only, with the
    standardisation and centring of that fit. Returns residuals [S, B] and the mask of scored
    transitions (those whose step has at least two earlier transitions to fit on).

    Cost: one fit per ring slot, each a 5 x 5 Cholesky solve plus O(E) Schur terms, from
    per-step sufficient statistics accumulated in step order: O(S B + S E) per selection whatever
    t and N, bounded by the ring capacity S (the window the filter reads anyway). The moments are
    taken about the window's mean (a shift that leaves every fit unchanged in exact arithmetic
    and keeps float32 sums well conditioned)."""
    dtype = x.dtype
    cap, width = target.shape
    inf = jnp.asarray(jnp.inf, dtype)
    total = jnp.maximum(w.sum(), 1.0)
    x0 = x - ((w * x).sum((1, 2)) / total)[:, None, None]                   # [5, S, B]
    y0 = target - (w * target).sum() / total                                 # [S, B]
    wx = w * x0
    seg = (jnp.arange(cap)[:, None] * num_envs + env_o.reshape(cap, width)).reshape(-1)
    # Per-environment sums in one scatter, and every statistic's exclusive prefix in one pass over
    # their concatenation (the columns are independent: the same sums as one call each).
    env_stats = jax.ops.segment_sum(
        jnp.concatenate([w.reshape(-1, 1), wx.reshape(5, -1).T, (w * y0).reshape(-1, 1)], axis=1),
        seg, cap * num_envs).reshape(cap, num_envs, 7)
    stats = dict(
        n=w.sum(1),                                                          # [S]
        sx=wx.sum(2).T,                                                      # [S, 5]
        sxx=(wx[:, None] * x0[None]).sum(3).transpose(2, 0, 1),              # [S, 5, 5]
        sy=(w * y0).sum(1),                                                  # [S]
        sxy=(wx * y0[None]).sum(2).T,                                        # [S, 5]
        ne=env_stats[..., 0], sex=env_stats[..., 1:6], sey=env_stats[..., 6])
    order = jnp.argsort(jnp.where(slot_ok, step_ids, jnp.iinfo(jnp.int32).max))
    inverse = jnp.argsort(order)
    flat = _exclusive_prefix(jnp.concatenate([v.reshape(cap, -1) for v in stats.values()], axis=1),
                             order, inverse, jnp.cumsum, 0.0)
    p, at = {}, 0
    for k, v in stats.items():
        size = v[0].size
        p[k] = flat[:, at:at + size].reshape(v.shape)
        at += size
    # min = -max(-x): the running extremes of both in one cumulative max
    extremes = _exclusive_prefix(jnp.concatenate([jnp.max(jnp.where(pair, x, -inf), axis=2).T,
                                                  -jnp.min(jnp.where(pair, x, inf), axis=2).T], axis=1),
                                 order, inverse, jax.lax.cummax, -inf)       # [S, 10]
    col_max, col_min = extremes[:, :5], -extremes[:, 5:]
    n = jnp.maximum(p["n"], 1.0)
    mu = p["sx"] / n[:, None]                                                # [S, 5]
    sd = jnp.sqrt(jnp.maximum(jnp.diagonal(p["sxx"], axis1=1, axis2=2) / n[:, None] - mu ** 2, 0.0))
    constant = col_max <= col_min
    scale = jnp.where(constant, 0.0, 1.0 / jnp.where(constant | (sd == 0), 1.0, sd))   # xs = (x0 - mu) scale
    ybar = p["sy"] / n
    centred = p["sxx"] - p["n"][:, None, None] * mu[:, :, None] * mu[:, None, :]
    a11 = scale[:, :, None] * centred * scale[:, None, :] + lam * jnp.eye(5, dtype=dtype)
    s_e = (p["sex"] - p["ne"][..., None] * mu[:, None, :]) * scale[:, None, :]
    b1 = (p["sxy"] - p["n"][:, None] * mu * ybar[:, None]) * scale
    b2 = p["sey"] - p["ne"] * ybar[:, None]
    beta, gamma = jax.vmap(_ridge_solve, in_axes=(0, 0, 0, 0, 0, None))(a11, s_e, p["ne"], b1, b2, lam)
    xs = (x0 - mu.T[:, :, None]) * scale.T[:, :, None]                       # [5, S, B]
    fitted = _sum_axis(beta.T[:, :, None] * xs, 0) + gamma[jnp.arange(cap)[:, None], env_o.reshape(cap, width)]
    scored = pair & (p["n"] >= 2)[:, None]
    return jnp.where(scored, y0 - ybar[:, None] - fitted, 0.0), scored


def progress_filter(state: EnvSchedState, env_index: jax.Array, num_envs: int, config) -> Progress:
    """Ridge regression of the next mean reward on (m, m^2, v, step, count, environment) over the
    transitions between consecutive usable observations; a node's mean residual is shrunk
    toward environment and neighbour references as in eq. 4; nodes with enough scored
    transitions and a non-positive estimate leave the exploitation candidates.

    ``config.progress_fit``: "earlier_steps" (the paper) scores each transition by a fit on
    strictly earlier steps' transitions (:func:`_earlier_steps_residuals`); "in_sample" fits once
    on all of them and takes in-sample residuals.

    A transition is indexed by its later observation (an entry of the ring) and reads the earlier
    one through the recorded previous-observation pointer; both must be usable."""
    dtype = state.obs_y.dtype
    n = state.num_obs.shape[0]
    cap = config.step_capacity
    t = state.step
    ok, slot_ok = _usable(state, t, cap)                                    # [S, B], [S]
    node = jnp.maximum(state.obs_node, 0)
    prev_step = state.obs_prev_step
    pair = ok & (prev_step >= 0) & (prev_step >= t - cap)
    prev_slot = jnp.maximum(prev_step, 0) % cap
    y1 = state.obs_y[prev_slot, state.obs_prev_pos]                         # [S, B, 3]
    prev_ord = state.obs_ord[prev_slot, state.obs_prev_pos]
    # n1 = usable observations of the node up to and including the earlier one.
    first_ord = jax.ops.segment_min(jnp.where(ok, state.obs_ord, jnp.iinfo(jnp.int32).max).reshape(-1),
                                    node.reshape(-1), n)
    count = (prev_ord - first_ord[node] + 1).astype(dtype)
    m1, v1 = y1[..., M], y1[..., V]
    # Features first ([5, S, B]): every reduction below runs along the minor axes.
    x = jnp.stack([m1, m1 ** 2, v1, prev_step.astype(dtype), count])
    target = state.obs_y[..., M]
    w = pair.astype(dtype)
    env_o = env_index[node].reshape(-1)                                     # [S B]
    lam = config.ridge_lambda

    if config.progress_fit == "earlier_steps":
        resid, scored = _earlier_steps_residuals(x, target, pair, w, slot_ok, state.step_ids, env_o, num_envs, lam)
    else:
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
        yc = target - (w * target).sum() / total
        wxs = (w * xs).reshape(5, -1)                                       # [5, S B]
        beta, gamma = _ridge_solve(
            wxs @ xs.reshape(5, -1).T + lam * jnp.eye(5, dtype=dtype),
            jax.ops.segment_sum(wxs.T, env_o, num_envs), jax.ops.segment_sum(w.reshape(-1), env_o, num_envs),
            wxs @ yc.reshape(-1), jax.ops.segment_sum((w * yc).reshape(-1), env_o, num_envs), lam)
        resid = jnp.where(pair, yc - jnp.tensordot(beta, xs, axes=1) - gamma[env_o].reshape(yc.shape), 0.0)
        scored = pair & (pair.sum() >= 2)   # no fit on fewer than two transitions

    # counts and residual sums together (counts are small integers, exact in floating point)
    per_obs = jnp.stack([scored.astype(dtype), resid], axis=-1)                  # [S, B, 2]
    node_sums = _node_sum(per_obs, state.obs_node, n)                           # [N, 2]
    n_i = node_sums[:, 0].astype(jnp.int32)
    rbar = node_sums[:, 1] / jnp.maximum(n_i, 1)
    env_sums = jax.ops.segment_sum(per_obs.reshape(-1, 2), env_o, num_envs)     # [E, 2]
    r_env = env_sums[:, 1] / jnp.maximum(env_sums[:, 0].astype(jnp.int32), 1)
    nbrs = {"both": jnp.concatenate([state.nbr_in, state.nbr_cross], axis=1), "within": state.nbr_in,
            "cross": state.nbr_cross}[config.relations]
    nb = jnp.take(jnp.stack([n_i.astype(dtype), rbar], axis=-1), jnp.maximum(nbrs, 0), axis=0, mode="clip")
    nb_ok = (nbrs >= 0) & (nb[..., 0] > 0)
    r_nb = (_sum_axis(jnp.where(nb_ok, nb[..., 1], 0.0), 1)
            / jnp.maximum(nb_ok.sum(1), 1))
    prior = 0.5 * r_env[env_index] + 0.5 * r_nb
    est = (n_i * rbar + config.lambda_s * prior) / (n_i + config.lambda_s)
    if config.progress_fit == "in_sample":
        # today's rule, kept exactly: without a fit every estimate is 0, but n counts transitions
        n_i = _node_sum(pair.astype(jnp.int32), state.obs_node, n)
        est = jnp.where(pair.sum() >= 2, est, 0.0)
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


class PickRules(NamedTuple):
    """Who may be picked, as functions of a pick's carry (shared by :func:`select_batch` and the
    dense-free :func:`envsched_jax.sched.dense_free.select_batch_lazy`).

    ``eligible(in_batch, cnt, coverage)`` -> (candidates [N] bool, relaxation level []) and
    ``coverage_mask(eligible, cnt)`` -> the lexicographic restriction of a coverage pick (batch
    environment count, environment exposure, node observations), where ``in_batch`` [N] marks the
    batch so far and ``cnt`` [N] is the batch's picks of each node's environment."""

    eligible: object
    coverage_mask: object


def argmax_first(x: jax.Array) -> jax.Array:
    """Index of the largest value, the lowest index among equals (``jnp.argmax``'s rule), as int32.

    Computed as ``lax.top_k(x, 1)``: on XLA's CPU backend argmax is a variadic (value, index)
    reduction, 2-2.5x slower than top-1 inside the greedy loops at N = 2,550 and 20,000
    (measured, jaxlib 0.10.2). top_k breaks ties by the lower index too; ``+ 0.0`` maps -0.0 to
    +0.0 so that they tie as in a float comparison."""
    return jax.lax.top_k(x + 0.0, 1)[1][0].astype(jnp.int32)


def pick_rules(state: EnvSchedState, prog_excluded: jax.Array, env_index: jax.Array, config) -> PickRules:
    """The candidate masks of eq. 5's greedy picks (caps, progress filter, relaxation levels)."""
    # Loop invariants are computed once here (XLA does not hoist them out of the loop).
    window_i = state.env_recent.sum(axis=0)[env_index]                # steps t-1 and t-2
    env_total_i = state.env_total[env_index]
    allowed = ~state.excluded
    run_ok = state.run < config.cap_consecutive
    prog_ok = ~prog_excluded
    big = jnp.iinfo(jnp.int32).max

    def eligible_at(in_batch, cnt, coverage: bool):
        """The candidates of a pick and its relaxation level (0: none relaxed)."""
        base = ~in_batch & allowed
        caps = (cnt < config.cap_step, window_i + cnt < config.cap_window, run_ok)
        full = base & caps[0] & caps[1] & caps[2]
        if not coverage:   # the progress filter binds exploitation picks only
            full = full & prog_ok
        if config.infeasible != "relax":   # "error": never relax; the caller raises
            return full, jnp.zeros((), jnp.int32)

        def relaxed_levels():  # the first level with a candidate (rarely needed: a cond)
            levels = jnp.stack([full, base & caps[0] & caps[1] & caps[2], base & caps[0] & caps[1],
                                base & caps[0], base])
            level = jnp.argmax(levels.any(axis=1)).astype(jnp.int32)
            return levels[level], level

        return jax.lax.cond(full.any(), lambda: (full, jnp.zeros((), jnp.int32)), relaxed_levels)

    def restrict(mask, key):
        kmin = jnp.min(jnp.where(mask, key, big))
        return mask & (key == kmin)

    def coverage_mask(eligible, cnt):
        return restrict(restrict(restrict(eligible, cnt), env_total_i), state.num_obs)

    return PickRules(eligible_at, coverage_mask)


def exploitation_gain(state: EnvSchedState, q: jax.Array, config) -> jax.Array:
    r"""$q_i \omega_i$ of eq. 5, $\omega_i = (1 + c_i / c_0)^{-1/2}$, computed once per step (see
    select_batch)."""
    omega = (1.0 + state.sel_count.astype(q.dtype) / config.c0) ** -0.5
    return q * omega


def select_batch(state: EnvSchedState, q: jax.Array, prog_excluded: jax.Array, s_full: jax.Array,
                 env_index: jax.Array, config) -> Selection:
    """Coverage picks then exploitation picks into one batch, greedily (eq. 5)."""
    n = q.shape[0]
    B, b_cov = config.batch_size, config.num_coverage
    dtype = q.dtype
    # Eq. 5 is evaluated as NumPy (and the reference) evaluate it: q omega and lambda_sim s each
    # rounded on its own, then subtracted, so that mathematically equal scores tie exactly and the
    # lower index wins. Written as one expression, XLA fuses it and LLVM contracts it into a fused
    # multiply-add whose single rounding splits such ties (q = 2341/2400 at similarity 0.75 vs
    # q = 2365/2400 at 0.875, lambda_sim = 0.08, picked the higher index; an optimization barrier
    # is removed by XLA's CPU pipeline). So the exploitation gain q omega is computed once, outside
    # the loop, and the loop carries the penalty lambda_sim max_b s_ib itself (rounding is
    # monotone, so the max of rounded products is the rounded product of the max): both reach the
    # subtraction as stored values, with no multiplication left to contract.
    gain = exploitation_gain(state, q, config)
    rules = pick_rules(state, prog_excluded, env_index, config)
    ids = jnp.arange(n, dtype=jnp.int32)

    def pick(coverage: bool):
        def body(k, carry):
            batch, phase, relaxed, feasible, in_batch, cnt, penalty = carry
            eligible, level = rules.eligible(in_batch, cnt, coverage)
            ok = eligible.any()
            if coverage:
                mask, score = rules.coverage_mask(eligible, cnt), q - penalty
            else:
                mask, score = eligible, gain - penalty
            i = argmax_first(jnp.where(mask, score, -jnp.inf))
            e = env_index[i]
            return (batch.at[k].set(jnp.where(ok, i, -1)),
                    phase.at[k].set(1 if coverage else 2),
                    relaxed.at[k].set(level),
                    feasible.at[k].set(ok),
                    in_batch | ((ids == i) & ok),   # elementwise: no gather of in_batch[i] across shards
                    cnt + ((env_index == e) & ok).astype(jnp.int32),   # picks of each node's environment
                    jnp.where(ok, jnp.maximum(penalty, config.lambda_sim * s_full[i].astype(dtype)), penalty))
        return body

    carry = (jnp.full((B,), -1, jnp.int32), jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.int32),
             jnp.zeros((B,), bool), jnp.zeros((n,), bool), jnp.zeros((n,), jnp.int32), jnp.zeros((n,), dtype))
    # Coverage picks, then exploitation picks: two loops, so neither evaluates the other's rule.
    carry = jax.lax.fori_loop(0, b_cov, pick(True), carry)
    batch, phase, relaxed, feasible, *_ = jax.lax.fori_loop(b_cov, B, pick(False), carry)
    return Selection(batch, phase, relaxed, feasible)


# --------------------------------------------------------------------------------------------
# Observe: logs, step means, neighbour lists, counts


def _insert(nbr: jax.Array, sim: jax.Array, cand: jax.Array, cand_sim: jax.Array,
            ok: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Insert node ``cand`` into every row's neighbour list where ``ok`` [N].

    Rows are kept in the order (similarity desc, index asc), valid entries first; ``cand_sim`` [N]
    is each row's similarity to ``cand``. The list is truncated to its width, so inserting a set of
    candidates one at a time, in any order, leaves each row's top entries of the union."""
    k = nbr.shape[1]
    if k == 0:
        return nbr, sim
    s = cand_sim[:, None]
    before = (nbr >= 0) & ((sim > s) | ((sim == s) & (nbr < cand)))   # entries that stay in front
    pos = before.sum(axis=1, keepdims=True)                              # [N, 1] insertion point
    j = jnp.arange(k)[None, :]
    take = ok[:, None] & (pos < k)
    prev_idx = jnp.concatenate([jnp.full_like(nbr[:, :1], -1), nbr[:, :-1]], axis=1)
    prev_sim = jnp.concatenate([jnp.zeros_like(sim[:, :1]), sim[:, :-1]], axis=1)
    new_idx = jnp.where(j < pos, nbr, jnp.where(j == pos, cand, prev_idx))
    new_sim = jnp.where(j < pos, sim, jnp.where(j == pos, s, prev_sim))
    return jnp.where(take, new_idx, nbr), jnp.where(take, new_sim, sim)


_COMPACT_ROWS = 2048
"""Rows :func:`_insert_candidates` updates per gathered chunk (pools above 4 x this only)."""


def _insert_candidates(nbr: jax.Array, sim: jax.Array, cand: jax.Array, cand_sim: jax.Array, ok: jax.Array,
                       order: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Insert candidates ``cand[order[:count]]`` one at a time, in that order, into every row's
    list (:func:`_insert`), touching only the rows that can change.

    ``cand_sim`` / ``ok`` are [C, N]: each candidate's similarity to every row and whether the
    row may take it. A row takes a candidate only if its list has room or the candidate precedes
    its last entry, and inserting raises that bar, so the rows that change at all are those that
    change against the lists as they were (one [C, N] test). On pools larger than
    4 x ``_COMPACT_ROWS`` those rows are gathered ``_COMPACT_ROWS`` at a time, every candidate is
    inserted into the gathered rows, and they are scattered back: once the lists are full that is
    a small fraction of N. Rows update independently, so the result is the plain pass's (tested);
    smaller pools take the plain pass."""
    n, k = nbr.shape

    def insert_into(nbr, sim, rows_sim, rows_ok):
        def one(j, lists):
            c = order[j]
            return _insert(lists[0], lists[1], cand[c], rows_sim[c], rows_ok[c])
        return jax.lax.fori_loop(0, count, one, (nbr, sim))

    if k == 0:
        return nbr, sim
    if n <= 4 * _COMPACT_ROWS:
        return insert_into(nbr, sim, cand_sim, ok)
    last_idx, last_sim = nbr[None, :, -1], sim[None, :, -1]
    in_play = jnp.zeros((cand.shape[0],), bool).at[order].set(jnp.arange(order.shape[0]) < count)[:, None]
    change = in_play & ok & ((last_idx < 0) | (cand_sim > last_sim)
                             | ((cand_sim == last_sim) & (cand[:, None] < last_idx)))
    pending = change.any(axis=0)                          # [N]

    def chunk(carry):
        nbr, sim, pending = carry
        rows = jnp.nonzero(pending, size=_COMPACT_ROWS, fill_value=n)[0]
        safe = jnp.minimum(rows, n - 1)
        real = rows < n
        sub_idx, sub_sim = insert_into(nbr[safe], sim[safe], cand_sim[:, safe], ok[:, safe] & real[None, :])
        return (nbr.at[rows].set(sub_idx, mode="drop", unique_indices=True),
                sim.at[rows].set(sub_sim, mode="drop", unique_indices=True),
                pending.at[rows].set(False, mode="drop", unique_indices=True))

    nbr, sim, _ = jax.lax.while_loop(lambda carry: carry[2].any(), chunk, (nbr, sim, pending))
    return nbr, sim


def env_member_table(env_index, num_envs: int):
    """[E, M] int32 NumPy table of each environment's nodes in ascending order, padded with -1
    (M = the largest environment): lets the observation update touch only the rows of a new
    node's own environment when it updates within-environment neighbour lists."""
    import numpy as np

    env_index = np.asarray(env_index)
    counts = np.bincount(env_index, minlength=num_envs)
    table = np.full((num_envs, max(int(counts.max(initial=0)), 1)), -1, np.int32)
    order = np.argsort(env_index, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table[env_index[order], np.arange(len(order)) - starts[env_index[order]]] = order
    return table


def observe_update(state: EnvSchedState, batch: jax.Array, rewards: jax.Array, s_full_rows: jax.Array | None,
                   s_abs_rows: jax.Array, env_index: jax.Array, config,
                   env_members: jax.Array | None = None, s_full_member_rows: jax.Array | None = None) -> EnvSchedState:
    """Record step ``state.step``'s observed groups and advance to the next step.

    ``batch`` [B] holds ascending node indices, optionally followed by -1 padding (rows that are
    ignored; the scheduler always passes a full batch, tests pass smaller ones). ``s_full_rows`` /
    ``s_abs_rows`` are the [B, N] similarity rows of the batch (the matrices are symmetric, so they
    are also its columns), gathered by the caller. ``env_members`` (:func:`env_member_table`, optional):
    with it, a new node's insertion into within-environment lists reads and writes only its
    environment's rows (O(M K) instead of O(N K); the same lists either way, tested).
    ``s_full_member_rows`` [B, M] (with ``env_members``; then ``s_full_rows`` may be None): only
    the entries those insertions read, ``S_full[batch[b], env_members[env of batch[b]]]`` (0 on
    padding): what the dense-free path (:mod:`.dense_free`) computes instead of whole rows."""
    dtype = state.obs_y.dtype
    t = state.step
    n = state.num_obs.shape[0]
    valid = batch >= 0
    node = jnp.maximum(batch, 0)
    drop = jnp.where(valid, batch, n)            # scatters with mode="drop" skip the padding
    stats = group_stats(rewards.astype(dtype))                                   # [B, 3]
    b_t = jnp.where(valid[:, None], stats, 0.0).sum(0) / jnp.maximum(valid.sum(), 1)
    num_obs_b = jnp.where(valid, state.num_obs[node], 0)
    slot = t % config.step_capacity
    positions = jnp.arange(batch.shape[0], dtype=jnp.int32)
    ring = dict(
        step_ids=state.step_ids.at[slot].set(t), step_means=state.step_means.at[slot].set(b_t),
        obs_node=state.obs_node.at[slot].set(jnp.where(valid, batch, -1)),
        obs_y=state.obs_y.at[slot].set(stats), obs_ord=state.obs_ord.at[slot].set(num_obs_b),
        obs_prev_step=state.obs_prev_step.at[slot].set(jnp.where(valid, state.last_step[node], -1)),
        obs_prev_pos=state.obs_prev_pos.at[slot].set(state.last_pos[node]),
        last_step=state.last_step.at[drop].set(t, mode="drop"),
        last_pos=state.last_pos.at[drop].set(positions, mode="drop"))

    # Nodes observed for the first time join every other node's neighbour candidates. They are
    # inserted one at a time (a loop over the step's new nodes only, usually far fewer than B):
    # into the within-environment lists of their own environment's rows (with ``env_members``) or
    # of all N rows, and into the cross-environment lists of the rows that can change
    # (:func:`_insert_candidates`).
    new = valid & (num_obs_b == 0)                                               # [B]
    num_obs = state.num_obs.at[drop].add(1, mode="drop")
    env_b = jnp.where(valid, env_index[node], -1)
    first = jnp.argsort(~new, stable=True)                                       # new nodes first
    num_new = new.sum()
    ids = jnp.arange(n)

    def add_within(k, lists):
        nbr_in, nbr_in_sim = lists
        b = first[k]
        c, e = batch[b], env_b[b]
        if env_members is None:
            return _insert(nbr_in, nbr_in_sim, c, s_full_rows[b].astype(dtype), (env_index == e) & (ids != c))
        rows = env_members[e]                                      # [M], -1 padded
        safe = jnp.maximum(rows, 0)
        sims = s_full_rows[b][safe] if s_full_member_rows is None else s_full_member_rows[b]
        sub_idx, sub_sim = _insert(nbr_in[safe], nbr_in_sim[safe], c, sims.astype(dtype),
                                   (rows >= 0) & (rows != c))
        target = jnp.where(rows >= 0, rows, n)                     # padding: dropped
        return (nbr_in.at[target].set(sub_idx, mode="drop", unique_indices=True),
                nbr_in_sim.at[target].set(sub_sim, mode="drop", unique_indices=True))

    nbr_in, nbr_in_sim = jax.lax.fori_loop(0, num_new, add_within, (state.nbr_in, state.nbr_in_sim))
    cross_ok = new[:, None] & (env_b[:, None] != env_index[None, :])             # [B, N]
    nbr_cross, nbr_cross_sim = _insert_candidates(state.nbr_cross, state.nbr_cross_sim, batch,
                                                  s_abs_rows.astype(dtype), cross_ok, first, num_new)

    picked = jnp.zeros((n,), bool).at[drop].set(True, mode="drop")
    env_now = jax.ops.segment_sum(valid.astype(jnp.int32), jnp.maximum(env_b, 0), state.env_total.shape[0])
    return state.replace(
        step=t + 1, num_obs=num_obs, **ring, nbr_in=nbr_in, nbr_in_sim=nbr_in_sim, nbr_cross=nbr_cross,
        nbr_cross_sim=nbr_cross_sim, sel_count=state.sel_count + picked,
        env_total=state.env_total + env_now, env_recent=jnp.stack([env_now, state.env_recent[0]]),
        run=jnp.where(picked, state.run + 1, 0))
