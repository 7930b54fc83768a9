"""Vectorised NumPy EnvSched: the fair CPU baseline for the JAX kernels (tests, benchmark).

``tests/reference_envsched.py`` is written for readability (Python loops over nodes and
neighbours) and is thousands of times slower than the JAX scheduler, so its ratio says little
about what JAX buys. This module is what a careful NumPy user would write for the same equations
without JAX. It uses the same algorithm and state layout as ``envsched_jax/sched/kernels.py``: a
step-major ring of S x B observations, neighbour lists kept up to date by merging only the step's
first-time nodes, the earlier-steps progress fits from step-ordered sums. Every per-node quantity
is a whole-array NumPy operation: ``np.bincount`` for per-node and per-environment sums, average
ranks from one argsort (what ``scipy.stats.rankdata(z, "average")`` returns, a third faster at
N = 20,000), values sorted once for the quantile map, batched 5 x 5 Schur-complement solves for
the ridge fits. Python loops only where the procedure is sequential: the B greedy picks of a
batch, the cold start's picks. NumPy's dynamic shapes are used where they save work: only the
ring slots of the window's steps are read (fewer than S early in a run), only the (row,
candidate) pairs where a new node can enter a neighbour list are merged, and each greedy pick
costs a handful of length-N operations (level-0 eligibility and the coverage keys are updated for
the picked environment's members instead of being rebuilt from the caps).

Every equation, tie rule and numerical choice is the package docstring of
:mod:`envsched_jax.sched` (the text the JAX kernels and the loop reference follow); the tests
(``tests/test_vectorized_envsched.py``) check batches, u and q against the JAX scheduler to 1e-9
in float64 and against the loop reference on a small case.

``config`` is an :class:`envsched_jax.sched.config.EnvSchedConfig` (or anything with its field
names); this module reads it by attribute and imports neither JAX nor ``envsched_jax``, so that it
measures NumPy alone. Arrays use ``config.dtype`` (float32 or float64) like the kernels: float32,
the scheduler's default, is also the faster one here (the tests compare in float64).

Usage mirrors the scheduler API on node indices::

    sched = VectorizedEnvSched(s_full, s_abs, env_index, config)
    nodes, phases = sched.select(t)        # t = 0, 1, 2, ... in order
    sched.observe(t, nodes, rewards)       # rewards [B, K] in the order of nodes
"""
from __future__ import annotations

from typing import Any

import numpy as np

V, M, D = 0, 1, 2                       # column order of the statistics (v, m, d)
RELAXATIONS = ("none", "progress_filter", "cap_consecutive", "cap_window", "cap_step")
SIGMA_FLOOR = 0.05


class VectorizedInfeasible(ValueError):
    """No eligible node for a pick (policy "error"), or none even after relaxing ("relax")."""


def group_stats(rewards: np.ndarray) -> np.ndarray:
    """[B, K] rewards -> [B, 3] (v, m, d) (eq. 2, 9)."""
    m = rewards.mean(axis=1)
    v = ((rewards - m[:, None]) ** 2).mean(axis=1)
    d = np.clip(v / np.maximum(m * (1.0 - m), 0.01), 0.0, 1.0)
    return np.stack([v, m, d], axis=1)


def doubled_rank(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2 rankavg(z) as exact integers (1-based ranks, ties given their average rank, as
    ``scipy.stats.rankdata(z, "average")``), and ``z`` sorted. One unstable argsort: a tie group
    at sorted positions [lo, hi) has doubled average rank lo + hi + 1 whatever order its members
    are in, so no stable sort is needed."""
    n = z.shape[0]
    order = np.argsort(z)
    sorted_z = z[order]
    starts_group = np.empty(n, bool)
    starts_group[:1] = True
    np.not_equal(sorted_z[1:], sorted_z[:-1], out=starts_group[1:])
    lo = np.flatnonzero(starts_group)
    hi = np.append(lo[1:], n)
    ranks = np.empty(n, np.int64)
    ranks[order] = (lo + hi + 1)[np.cumsum(starts_group) - 1]
    return ranks, sorted_z


def percentile_rank(z: np.ndarray) -> np.ndarray:
    """pr(z)_i = (rankavg(z)_i - 0.5) / N."""
    return (doubled_rank(z)[0] - 1).astype(z.dtype) / (2 * z.shape[0])


def quantile_map(sorted_values: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Empirical quantile function at p, linear interpolation at position p (N - 1) (the
    definition of ``numpy.quantile``'s default method, evaluated as lo + frac (hi - lo) on values
    sorted once; ``np.quantile`` with N quantiles selects them again and rounds the interpolation
    differently in the last bit)."""
    n = sorted_values.shape[0]
    pos = np.clip(p, 0.0, 1.0) * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = (pos - lo).astype(sorted_values.dtype)
    low = sorted_values[lo]
    return low + frac * (sorted_values[hi] - low)


def merge_neighbours(nbr: np.ndarray, sim: np.ndarray, rows: np.ndarray, cand: np.ndarray,
                     cand_sim: np.ndarray, cand_ok: np.ndarray) -> None:
    """Merge candidate nodes into the neighbour lists of ``rows``, in place.

    A list holds its entries in the order (similarity desc, index asc), valid entries first
    (-1 and similarity 0 after them); ``cand``, ``cand_sim``, ``cand_ok`` [len(rows), C] are
    each row's candidates, its similarity to them and whether they count (padding does not). The
    result is each row's top-k of the union under that order, which is what inserting the
    candidates one at a time and truncating gives (the kernels' way)."""
    k = nbr.shape[1]
    if k == 0 or len(rows) == 0:
        return
    ids = np.concatenate([nbr[rows], cand], axis=1)
    sims = np.concatenate([sim[rows], cand_sim], axis=1)
    valid = np.concatenate([nbr[rows] >= 0, cand_ok], axis=1)
    order = np.lexsort((ids, -sims, ~valid), axis=1)[:, :k]      # last key sorts first
    keep = np.take_along_axis(valid, order, axis=1)
    nbr[rows] = np.where(keep, np.take_along_axis(ids, order, axis=1), -1)
    sim[rows] = np.where(keep, np.take_along_axis(sims, order, axis=1), 0.0)


class VectorizedEnvSched:
    """EnvSched, one step at a time, in vectorised NumPy (module docstring).

    Args:
        s_full, s_abs: [N, N] similarity matrices (symmetric, unit diagonal; memory maps are fine:
            ``s_full`` is read one row per pick, ``s_abs`` one row per first-time node).
        env_index: [N] environment of each node.
        config: an ``EnvSchedConfig``.
        excluded: node indices removed from both phases (the identifier filter's output).
    """

    def __init__(self, s_full, s_abs, env_index, config: Any, excluded=()):
        self.config = config
        self.dtype = np.dtype(config.dtype)
        dt = self.dtype
        self.s_full = np.asarray(s_full, dt)           # no copy for a matching memory map
        self.s_abs = s_abs
        self.env = np.asarray(env_index, np.int64)
        n = self.n = self.env.shape[0]
        e = self.num_envs = int(self.env.max()) + 1
        self.members = [np.flatnonzero(self.env == k) for k in range(e)]
        self.excluded = np.zeros(n, bool)
        self.excluded[np.asarray(list(excluded), np.int64)] = True
        s, b = config.step_capacity, config.batch_size
        self.step = 0
        # Step-major ring: slot s % S holds step s's observations (see kernels.EnvSchedState).
        self.step_ids = np.full(s, -1, np.int64)
        self.step_means = np.zeros((s, 3), dt)
        self.obs_node = np.full((s, b), -1, np.int64)
        self.obs_y = np.zeros((s, b, 3), dt)
        self.obs_ord = np.zeros((s, b), np.int64)         # the node's observation ordinal
        self.obs_prev_step = np.full((s, b), -1, np.int64)
        self.obs_prev_pos = np.zeros((s, b), np.int64)
        self.last_step = np.full(n, -1, np.int64)
        self.last_pos = np.zeros(n, np.int64)
        self.num_obs = np.zeros(n, np.int64)
        self.nbr_in = np.full((n, config.k_within), -1, np.int64)
        self.nbr_in_sim = np.zeros((n, config.k_within), dt)
        self.nbr_cross = np.full((n, config.k_cross), -1, np.int64)
        self.nbr_cross_sim = np.zeros((n, config.k_cross), dt)
        self.sel_count = np.zeros(n, np.int64)
        self.env_total = np.zeros(e, np.int64)
        self.env_recent = np.zeros((2, e), np.int64)      # selections at steps t-1, t-2
        self.run = np.zeros(n, np.int64)
        self.last: dict[str, Any] | None = None          # the last select's scores and filter
        # The last select's relaxed picks: per pick the last constraint it dropped (the names of
        # EnvSched's metrics().relaxations, "cold_two_per_env" / "cap_step" at the cold start).
        self.relaxations: list[str] = []

    # ------------------------------------------------------------------ score pass (eq. 3-4, 6-13)

    def _scalar(self, x) -> np.generic:
        return self.dtype.type(x)

    def scores(self) -> dict[str, Any]:
        """Everything the selection at ``self.step`` (>= 1) reads: per half-life (a dict keyed by
        h) bhat, W, ybar, G_in, G_cross, P, yhat (each [N, 3] quantity as its columns v, m, d; the
        G of an unused relation is None), f, u(h); sigma_in, sigma_cross; the corrected u and q;
        progress_n, progress_est, progress_excluded."""
        cfg, dt, n = self.config, self.dtype, self.n
        t = self.step
        # The window's ring slots only (all S of them once t >= S; fewer before).
        used = np.flatnonzero((self.step_ids >= 0) & (self.step_ids < t) & (self.step_ids >= t - cfg.step_capacity))
        node_u = self.obs_node[used]                      # [S', B]
        obs_ok = node_u >= 0
        node = node_u[obs_ok]                             # usable observations, flat
        age = (t - self.step_ids[used]).astype(dt)        # per used slot
        y_obs = self.obs_y[used][obs_ok]
        step_means = self.step_means[used]
        slot_obs = np.broadcast_to(np.arange(len(used))[:, None], obs_ok.shape)[obs_ok]
        mean_obs = step_means[slot_obs]

        # sigma = max(median delta, 0.05): lists are sorted by similarity desc, so delta = 1 - sim
        # is ascending along valid entries and the median is read off by position.
        sigmas = []
        kernels = []   # exp(-0.5 (delta / sigma)^2), shared by both half-lives
        for nbr, sim in ((self.nbr_in, self.nbr_in_sim), (self.nbr_cross, self.nbr_cross_sim)):
            valid = nbr >= 0
            delta = np.clip(1.0 - sim, 0.0, 1.0)
            count = valid.sum(axis=1)
            rows = np.arange(n)
            if nbr.shape[1]:   # count // 2 < k whenever count <= k
                lo = delta[rows, np.maximum((count - 1) // 2, 0)]
                hi = delta[rows, count // 2]
                sigma = np.where(count > 0, np.maximum(0.5 * (lo + hi), SIGMA_FLOOR), SIGMA_FLOOR).astype(dt)
            else:
                sigma = np.full(n, SIGMA_FLOOR, dt)
            sigmas.append(sigma)
            ratio = delta / sigma[:, None]                # exactly 1 where delta == sigma (IEEE)
            kernels.append(np.where(valid, np.exp(-0.5 * ratio ** 2), 0.0).astype(dt))

        nbr_j = [np.maximum(self.nbr_in, 0), np.maximum(self.nbr_cross, 0)]
        rels = {"both": (0, 1), "within": (0,), "cross": (1,)}[cfg.relations]
        lower, upper = np.zeros(3, dt), np.array([0.25, 1.0, 1.0], dt)
        lam_g, lam_s = self._scalar(cfg.lambda_g), self._scalar(cfg.lambda_s)
        a, b = cfg.calibration
        per_h = {}
        for h in (cfg.h_long, cfg.h_short):
            w_s = np.exp2(-age / self._scalar(h)).astype(dt)
            bhat = (w_s[:, None] * step_means).sum(0) / max(w_s.sum(), 1e-30)
            ytilde = np.clip(y_obs - mean_obs + bhat, lower, upper)
            w_o = w_s[slot_obs]
            W = np.bincount(node, w_o, minlength=n).astype(dt)
            seen = W > 0
            W_safe = np.maximum(W, 1e-30)
            # Per statistic y in (v, m, d), each a contiguous [N] array: gathers by neighbour index
            # and reductions along the neighbour axis stay cheap.
            ybar = [np.where(seen, np.bincount(node, w_o * ytilde[:, c], minlength=n) / W_safe, bhat[c]).astype(dt)
                    for c in range(3)]
            W_clip = np.clip(W, 0.1, 3.0)
            G = [None, None]
            for r in rels:
                j = nbr_j[r]
                wt = kernels[r] * W_clip[j]                  # [N, k]; 0 where invalid
                den = wt.sum(axis=1) + lam_g
                G[r] = [((wt * ybar[c][j]).sum(axis=1) + lam_g * bhat[c]) / den for c in range(3)]
            if cfg.relations == "both":
                P = [0.5 * G[0][c] + 0.5 * G[1][c] for c in range(3)]
            else:
                P = G[rels[0]]
            vhat, mhat, dhat = ((W * ybar[c] + lam_s * P[c]) / (W + lam_s) for c in range(3))
            f = dhat * mhat * (1.0 - mhat)
            # a pr(vhat) + b pr(f) from doubled ranks, exactly (package docstring).
            rank_v, sorted_vhat = doubled_rank(vhat)
            p = (a * rank_v + b * doubled_rank(f)[0] - (a + b)).astype(dt) / (2 * (a + b) * n)
            u = quantile_map(sorted_vhat, p)
            # [N, 3] quantities are kept as their three columns (v, m, d): nothing needs them stacked
            per_h[h] = dict(bhat=bhat, W=W, ybar=ybar, G_in=G[0], G_cross=G[1], P=P, yhat=[vhat, mhat, dhat],
                            f=f, u_h=u)
        u_long, u_short = per_h[cfg.h_long]["u_h"], per_h[cfg.h_short]["u_h"]
        u = u_long - self._scalar(cfg.eta) * np.maximum(u_long - u_short, 0.0)
        out = {key: {h: per_h[h][key] for h in per_h} for key in per_h[cfg.h_long]}
        out.update(sigma_in=sigmas[0], sigma_cross=sigmas[1], u=u, q=percentile_rank(u))
        out.update(self.progress_filter(used))
        return out

    # ------------------------------------------------------------------ progress filter

    def progress_filter(self, used: np.ndarray) -> dict[str, np.ndarray]:
        """Ridge fit of the next mean on (m, m^2, v, step, count, env) over the transitions between
        consecutive usable observations; shrunk residual estimates; exclusions (package
        docstring; ``config.progress_fit`` chooses which fit scores a transition). ``used``: the
        ring slots of the window's steps. Returns progress_n, progress_est, progress_excluded.

        A transition is indexed by its later observation (an entry [slot, position] of the ring)
        and reads the earlier one through the recorded previous-observation pointer."""
        cfg, dt, n, e = self.config, self.dtype, self.n, self.num_envs
        t, cap = self.step, cfg.step_capacity
        node = self.obs_node[used]                                                      # [S', B]
        obs_ok = node >= 0
        prev_step = self.obs_prev_step[used]
        prev_pos = self.obs_prev_pos[used]
        pair = obs_ok & (prev_step >= 0) & (prev_step >= t - cap)
        node = np.maximum(node, 0)
        # n1 = usable observations of the node up to and including the earlier one: ordinals
        # count every observation ever, so subtract the node's first usable ordinal.
        first_ord = np.full(n, np.iinfo(np.int64).max)
        np.minimum.at(first_ord, node[obs_ok], self.obs_ord[used][obs_ok])
        prev_slot = np.maximum(prev_step, 0) % cap
        y1 = self.obs_y[prev_slot, prev_pos]                                            # [S', B, 3]
        count = self.obs_ord[prev_slot, prev_pos] - first_ord[node] + 1
        x = np.stack([y1[..., M], y1[..., M] ** 2, y1[..., V], prev_step, count], axis=-1).astype(dt)
        x = np.where(pair[..., None], x, 0.0).astype(dt)                                # [S', B, 5]
        target = self.obs_y[used][..., M]
        env_o = self.env[node]
        if cfg.progress_fit == "earlier_steps":
            resid, scored = self._earlier_steps_residuals(x, target, pair, self.step_ids[used], env_o)
        else:
            resid, scored = self._in_sample_residuals(x, target, pair, env_o)
        n_i = np.bincount(node[scored], minlength=n)
        rbar = np.bincount(node[scored], resid[scored], minlength=n) / np.maximum(n_i, 1)
        r_env = (np.bincount(env_o[scored], resid[scored], minlength=e)
                 / np.maximum(np.bincount(env_o[scored], minlength=e), 1))
        nbrs = {"both": np.concatenate([self.nbr_in, self.nbr_cross], axis=1), "within": self.nbr_in,
                "cross": self.nbr_cross}[cfg.relations]
        j = np.maximum(nbrs, 0)
        nb_ok = (nbrs >= 0) & (n_i[j] > 0)
        r_nb = np.where(nb_ok, rbar[j], 0.0).sum(axis=1) / np.maximum(nb_ok.sum(axis=1), 1)
        prior = 0.5 * r_env[self.env] + 0.5 * r_nb
        est = ((n_i * rbar + cfg.lambda_s * prior) / (n_i + cfg.lambda_s)).astype(dt)
        if cfg.progress_fit == "in_sample":
            # without a fit every estimate is 0, but n counts every transition
            n_i = np.bincount(node[pair], minlength=n)
            if pair.sum() < 2:
                est = np.zeros(n, dt)
        return {"progress_n": n_i, "progress_est": est,
                "progress_excluded": (n_i >= cfg.progress_min_transitions) & (est <= 0)}

    def _in_sample_residuals(self, x, target, pair, env_o):
        """One ridge fit on every transition; in-sample residuals [S, B] and the scored mask."""
        cfg, dt, e = self.config, self.dtype, self.num_envs
        resid = np.zeros(target.shape, dt)
        if pair.sum() < 2:                                                # no fit
            return resid, np.zeros_like(pair)
        xp, yp, env_p = x[pair], target[pair], env_o[pair]               # [T, 5], [T], [T]
        mean = xp.mean(axis=0)
        std = xp.std(axis=0)
        constant = xp.max(axis=0) <= xp.min(axis=0)                       # -> exactly 0
        xs = np.where(constant, 0.0, (xp - mean) / np.where(constant, 1.0, std)).astype(dt)
        yc = yp - yp.mean()
        beta, gamma = self._ridge(xs.T @ xs, np.stack([np.bincount(env_p, xs[:, c], minlength=e)
                                                       for c in range(5)], axis=1),
                                  np.bincount(env_p, minlength=e), xs.T @ yc,
                                  np.bincount(env_p, yc, minlength=e), cfg.ridge_lambda)
        resid[pair] = yc - xs @ beta - gamma[env_p]
        return resid, pair

    @staticmethod
    def _ridge(xtx, s_e, n_e, b1, b2, lam):
        """Ridge on [xs, onehot(env)] with penalty lam on every coefficient, from its normal
        equations (xtx = xs'xs, s_e = per-environment sums of xs, n_e = per-environment counts,
        b1 = xs'yc, b2 = per-environment sums of yc), through the Schur complement of the diagonal
        environment block; leading axes broadcast (one fit per step). Returns (beta, gamma)."""
        inv = 1.0 / (n_e + lam)                                            # [..., E]
        scaled_t = np.swapaxes(s_e * inv[..., None], -1, -2)               # [..., 5, E]
        schur = xtx + lam * np.eye(5) - scaled_t @ s_e
        rhs = b1 - (scaled_t @ b2[..., None])[..., 0]
        beta = np.linalg.solve(schur, rhs[..., None])[..., 0]
        return beta, (b2 - (s_e @ beta[..., None])[..., 0]) * inv

    def _earlier_steps_residuals(self, x, target, pair, steps, env_o):
        """The paper's rule: the transitions of step s are scored by the fit on the transitions of
        the window's steps < s (standardised and centred on those). One fit per ring slot from
        per-step sums accumulated in step order; the moments are taken about the window's mean
        (which leaves every fit unchanged in exact arithmetic). Returns residuals [S, B] and the
        scored mask (steps with at least two earlier transitions)."""
        cfg, dt, e = self.config, self.dtype, self.num_envs
        cap, width = target.shape
        w = pair.astype(dt)
        total = max(w.sum(), 1.0)
        x0 = np.where(pair[..., None], x - (w[..., None] * x).sum((0, 1)) / total, 0.0)   # [S, B, 5]
        y0 = np.where(pair, target - (w * target).sum() / total, 0.0)                      # [S, B]
        seg = (np.arange(cap)[:, None] * e + env_o).ravel()
        x0_t = np.swapaxes(x0, 1, 2)                                                        # [S, 5, B]
        stats = {
            "n": w.sum(axis=1), "sx": x0.sum(axis=1), "sxx": x0_t @ x0, "sy": y0.sum(axis=1),
            "sxy": (x0_t @ y0[..., None])[..., 0],
            "ne": np.bincount(seg, w.ravel(), minlength=cap * e).reshape(cap, e),
            # per (slot, environment, feature): one bincount over the flattened [S, B, 5]
            "sex": np.bincount((seg[:, None] * 5 + np.arange(5)).ravel(), x0.ravel(),
                               minlength=cap * e * 5).reshape(cap, e, 5),
            "sey": np.bincount(seg, y0.ravel(), minlength=cap * e).reshape(cap, e)}
        order = np.argsort(steps)

        def earlier(values, accumulate, empty):
            """For every slot: ``accumulate`` over the slots of strictly earlier steps."""
            acc = accumulate(values[order], axis=0)
            out = np.empty_like(acc)
            out[order] = np.concatenate([np.full_like(acc[:1], empty), acc[:-1]])
            return out

        p = {key: earlier(value, np.cumsum, 0.0) for key, value in stats.items()}
        col_max = earlier(np.where(pair[..., None], x, -np.inf).max(axis=1), np.maximum.accumulate, -np.inf)
        col_min = earlier(np.where(pair[..., None], x, np.inf).min(axis=1), np.minimum.accumulate, np.inf)
        n_fit = np.maximum(p["n"], 1.0)
        mu = p["sx"] / n_fit[:, None]                                                     # [S, 5]
        sd = np.sqrt(np.maximum(np.diagonal(p["sxx"], axis1=1, axis2=2) / n_fit[:, None] - mu ** 2, 0.0))
        constant = col_max <= col_min
        scale = np.where(constant, 0.0, 1.0 / np.where(constant | (sd == 0), 1.0, sd))   # xs = (x0 - mu) scale
        ybar = p["sy"] / n_fit
        centred = p["sxx"] - p["n"][:, None, None] * mu[:, :, None] * mu[:, None, :]
        fits = p["n"] >= 2
        xtx = np.where(fits[:, None, None], scale[:, :, None] * centred * scale[:, None, :], 0.0)
        s_e = (p["sex"] - p["ne"][..., None] * mu[:, None, :]) * scale[:, None, :]
        b1 = (p["sxy"] - p["n"][:, None] * mu * ybar[:, None]) * scale
        b2 = p["sey"] - p["ne"] * ybar[:, None]
        beta, gamma = self._ridge(xtx, np.where(fits[:, None, None], s_e, 0.0), np.where(fits[:, None], p["ne"], 0.0),
                                  np.where(fits[:, None], b1, 0.0), np.where(fits[:, None], b2, 0.0),
                                  cfg.ridge_lambda)
        xs = (x0 - mu[:, None, :]) * scale[:, None, :]                                    # [S, B, 5]
        fitted = (xs * beta[:, None, :]).sum(-1) + np.take_along_axis(gamma, env_o, axis=1)
        scored = pair & fits[:, None]
        return np.where(scored, y0 - ybar[:, None] - fitted, 0.0).astype(dt), scored

    # ------------------------------------------------------------------ greedy batch (eq. 5)

    def _eligible_at(self, level: int, coverage: bool, in_batch, env_count, window_env, prog_excluded):
        """Eligibility with the first ``level`` relaxations dropped (the slow path, only when the
        level-0 candidates ran out under policy "relax")."""
        cfg = self.config
        cnt = env_count[self.env]
        caps = [cnt < cfg.cap_step, window_env[self.env] + cnt < cfg.cap_window,
                self.run < cfg.cap_consecutive, np.ones(self.n, bool) if coverage else ~prog_excluded]
        mask = ~in_batch & ~self.excluded
        for cap in caps[:4 - level]:
            mask &= cap
        return mask

    def select_batch(self, q: np.ndarray, prog_excluded: np.ndarray) -> tuple[list[int], list[str], list[int]]:
        """Coverage picks then exploitation picks into one batch (eq. 5, appendix C). Returns the
        batch, the phase of each pick and its relaxation level (index into RELAXATIONS)."""
        cfg, dt, env = self.config, self.dtype, self.env
        B, b_cov = cfg.batch_size, int(cfg.rho * cfg.batch_size)
        relax = cfg.infeasible == "relax"
        lam_sim = self._scalar(cfg.lambda_sim)
        omega = (1.0 + self.sel_count.astype(dt) / self._scalar(cfg.c0)) ** -0.5
        gain = (q * omega).astype(dt)          # rounded on its own, then the penalty subtracted
        window_env = self.env_recent.sum(axis=0)
        in_batch = np.zeros(self.n, bool)
        env_count = np.zeros(self.num_envs, np.int64)
        penalty = np.zeros(self.n, dt)
        # Level-0 eligibility without the progress filter, kept up to date pick by pick.
        env_open = (cfg.cap_step > 0) & (window_env < cfg.cap_window)
        avail = ~self.excluded & (self.run < cfg.cap_consecutive) & env_open[env]
        exp_ok = ~prog_excluded
        # Coverage key (batch env count, env exposure, node observations) as one exact integer;
        # the batch count term is added to an environment's members when it gains a pick.
        span2 = int(self.env_total.max()) + 1
        span3 = int(self.num_obs.max()) + 1
        if (B + 1) * span2 * span3 >= 2 ** 62:
            raise OverflowError("coverage key does not fit in int64")
        key = self.env_total[env] * span3 + self.num_obs
        big = np.iinfo(np.int64).max
        batch, phases, levels = [], [], []
        for k in range(B):
            coverage = k < b_cov
            level = 0
            mask = avail if coverage else avail & exp_ok
            if coverage:
                keyed = np.where(mask, key, big)
                kmin = keyed.min()
                ok = kmin != big
            else:
                score = np.where(mask, gain - penalty, -np.inf)
                i = int(np.argmax(score))
                ok = score[i] != -np.inf
            if not ok:
                if not relax:
                    raise VectorizedInfeasible(f"step {self.step}: no eligible node for pick {k + 1} of {B} "
                                               f"({'coverage' if coverage else 'exploitation'})")
                for level in range(1, 5):
                    mask = self._eligible_at(level, coverage, in_batch, env_count, window_env, prog_excluded)
                    if mask.any():
                        break
                else:
                    raise VectorizedInfeasible(f"step {self.step}: no node left for pick {k + 1} of {B}")
                if coverage:   # ``key`` already leads with the batch count of the environment
                    keyed = np.where(mask, key, big)
                    kmin = keyed.min()
                else:
                    score = np.where(mask, gain - penalty, -np.inf)
                    i = int(np.argmax(score))
            if coverage:   # argmax q - pen among the eligible nodes with the smallest key
                i = int(np.argmax(np.where(keyed == kmin, q - penalty, -np.inf)))
            batch.append(i)
            phases.append("coverage" if coverage else "exploitation")
            levels.append(level)
            e = env[i]
            in_batch[i] = True
            avail[i] = False
            env_count[e] += 1
            members = self.members[e]
            key[members] += span2 * span3                 # this environment's batch count + 1
            if env_count[e] >= cfg.cap_step or window_env[e] + env_count[e] >= cfg.cap_window:
                avail[members] = False
            np.maximum(penalty, lam_sim * self.s_full[i], out=penalty)
        return batch, phases, levels

    # ------------------------------------------------------------------ cold start

    def cold_start(self) -> tuple[list[int], list[str]]:
        """Step 0 from static structure only (package docstring). Returns the batch and, per pick
        that needed relaxing, the last constraint it dropped."""
        cfg, env, n = self.config, self.env, self.n
        B = cfg.batch_size
        allowed = ~self.excluded
        reps = []
        for members in self.members:
            if not allowed[members].any():
                continue
            if len(members) == 1:
                reps.append(int(members[0]))
                continue
            block = np.asarray(self.s_full[np.ix_(members, members)], np.float64)
            mean_other = (block.sum(axis=1) - np.diag(block)) / (len(members) - 1)
            reps.append(int(members[np.argmax(np.where(allowed[members], mean_other, -np.inf))]))
        batch: list[int] = []
        glob = np.zeros(n)
        within = np.zeros(n)
        count = np.zeros(self.num_envs, np.int64)

        def add(i):
            batch.append(i)
            row = np.asarray(self.s_full[i], np.float64)
            np.maximum(glob, row, out=glob)
            members = self.members[env[i]]
            within[members] = np.maximum(within[members], row[members])
            count[env[i]] += 1

        if len(reps) <= B:
            for i in reps:
                add(i)
        else:
            reps_arr = np.array(sorted(reps))   # ascending node index: ties -> the lower index
            taken = np.zeros(len(reps), bool)
            while len(batch) < B:
                novelty = 0.5 * (1.0 - glob[reps_arr]) + 0.5 * (1.0 - within[reps_arr])
                r = int(np.argmax(np.where(taken, -np.inf, novelty)))
                taken[r] = True
                add(int(reps_arr[r]))
        relaxations = []
        free = allowed.copy()
        free[batch] = False
        while len(batch) < B:
            levels = [(free & (count[env] < 2), None), (free & (count[env] < cfg.cap_step), "cold_two_per_env"),
                      (free, "cap_step")]
            eligible, dropped = next(((m, d) for m, d in levels if m.any()), (None, None))
            if eligible is None or (dropped and cfg.infeasible != "relax"):
                raise VectorizedInfeasible(f"cold start: only {len(batch)} of {B} slots can be filled")
            if dropped:
                relaxations.append(dropped)
            novelty = 0.5 * (1.0 - glob) + 0.5 * (1.0 - within)
            i = int(np.argmax(np.where(eligible, novelty, -np.inf)))
            free[i] = False
            add(i)
        return batch, relaxations

    # ------------------------------------------------------------------ the step API

    def select(self, t: int) -> tuple[list[int], list[str]]:
        """The batch of step ``t`` (the next step) and each pick's phase."""
        if t != self.step:
            raise ValueError(f"select({t}): the next step is {self.step}")
        if t == 0:
            batch, self.relaxations = self.cold_start()
            return batch, ["cold"] * len(batch)
        self.last = self.scores()
        batch, phases, levels = self.select_batch(self.last["q"], self.last["progress_excluded"])
        self.relaxations = [RELAXATIONS[level] for level in levels if level]
        return batch, phases

    def observe(self, t: int, nodes, rewards) -> None:
        """Record step t's groups (any order of ``nodes``, at most B of them) and advance."""
        if t != self.step:
            raise ValueError(f"observe({t}): the next step is {self.step}")
        cfg, dt = self.config, self.dtype
        nodes = np.asarray(nodes, np.int64)
        order = np.argsort(nodes, kind="stable")
        nodes = nodes[order]
        rewards = np.asarray(rewards, dt)[order]
        b = len(nodes)
        if b > cfg.batch_size or len(np.unique(nodes)) != b:
            raise ValueError("observe: at most B distinct nodes")
        stats = group_stats(rewards)
        slot = t % cfg.step_capacity
        self.step_ids[slot] = t
        self.step_means[slot] = stats.sum(axis=0) / max(b, 1)
        self.obs_node[slot] = -1
        self.obs_node[slot, :b] = nodes
        self.obs_y[slot] = 0.0
        self.obs_y[slot, :b] = stats
        self.obs_ord[slot] = 0
        self.obs_ord[slot, :b] = self.num_obs[nodes]
        self.obs_prev_step[slot] = -1
        self.obs_prev_step[slot, :b] = self.last_step[nodes]
        self.obs_prev_pos[slot] = 0
        self.obs_prev_pos[slot, :b] = self.last_pos[nodes]
        self.last_step[nodes] = t
        self.last_pos[nodes] = np.arange(b)
        new = nodes[self.num_obs[nodes] == 0]
        self.num_obs[nodes] += 1
        if len(new):
            self._add_neighbours(new)
        picked = np.zeros(self.n, bool)
        picked[nodes] = True
        env_now = np.bincount(self.env[nodes], minlength=self.num_envs)
        self.sel_count += picked
        self.env_total += env_now
        self.env_recent = np.stack([env_now, self.env_recent[0]])
        self.run = np.where(picked, self.run + 1, 0)
        self.step = t + 1

    def _add_neighbours(self, new: np.ndarray) -> None:
        """First-time nodes ``new`` (ascending) join the other nodes' neighbour candidates: rows of
        their environments (within, by S_full) and every other row (cross, by S_abs).

        A candidate can only enter a row's list if it beats the row's current last entry (the last
        entry only improves as candidates enter), so only those (row, candidate) pairs, usually a
        few per row and in a minority of rows, are merged."""
        dt, env = self.dtype, self.env
        new_env = env[new]
        for nbr, sim, matrix, same in ((self.nbr_in, self.nbr_in_sim, self.s_full, True),
                                       (self.nbr_cross, self.nbr_cross_sim, self.s_abs, False)):
            k = nbr.shape[1]
            if k == 0:
                continue
            rows = np.flatnonzero(np.isin(env, new_env)) if same else np.arange(self.n)
            cand_sim = np.asarray(matrix[new], dt)                 # [C, N]: row c = column c (symmetric)
            if same:
                cand_sim = cand_sim[:, rows]
            ok = (new_env[:, None] == env[rows][None, :]) == same    # [C, R]
            if same:
                ok &= new[:, None] != rows[None, :]
            last_id = nbr[rows, k - 1]
            worst = np.where(last_id >= 0, sim[rows, k - 1], -np.inf)
            beats = ok & ((cand_sim > worst) | ((cand_sim == worst) & (new[:, None] < last_id)))
            cc, rr = np.nonzero(beats)                               # pairs, by candidate
            if len(rr) == 0:
                continue
            by_row = np.lexsort((cc, rr))                            # group by row, ascending candidate
            cc, rr = cc[by_row], rr[by_row]
            start = np.flatnonzero(np.r_[True, rr[1:] != rr[:-1]])
            counts = np.diff(np.r_[start, len(rr)])
            which = np.repeat(np.arange(len(start)), counts)         # the pair's hit row
            slot = np.arange(len(rr)) - start[which]                 # its place among the row's candidates
            width = int(counts.max())
            pad_ids = np.full((len(start), width), -1, np.int64)
            pad_sim = np.zeros((len(start), width), dt)
            pad_ok = np.zeros((len(start), width), bool)
            pad_ids[which, slot] = new[cc]
            pad_sim[which, slot] = cand_sim[cc, rr]
            pad_ok[which, slot] = True
            merge_neighbours(nbr, sim, rows[rr[start]], pad_ids, pad_sim, pad_ok)
