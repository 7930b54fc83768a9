"""Plain NumPy reference implementation of the EnvSched scheduler (tests only).

This module follows the implementation specification ("EnvSched as implemented here", the text
shared by the JAX implementation in ``envsched_jax/sched/`` and this reference) line by line.
It is written for readability, not speed: Python loops over nodes, float64 everywhere, the full
observation history kept in plain Python lists with the truncation rules applied when computing.

Independent choices made here (they are the points where the specification needed a reading;
the JAX side must match them):

* Progress filter, standardisation: a feature column whose values are all exactly equal
  (max == min) is treated as having std 0: its divisor is 1 and its standardised values are set to
  exactly 0 (rather than ``x - mean``, which can be +-1 ulp off for an inexact mean).
* Progress filter, ``progress_fit="earlier_steps"`` (the paper's rule, the default): the
  transitions of step s are scored by a fit on those of steps < s; a step with fewer than two
  earlier transitions is not scored, and ``progress_n`` counts scored transitions only.
* Progress filter, ``progress_fit="in_sample"``, fewer than 2 transitions in the pool: no fit;
  ``progress_est`` is 0 for every node and nobody is excluded (``progress_n`` still counts
  transitions).
* Relaxation under policy "relax" is cumulative: the pick is retried dropping first the progress
  filter (exploitation only), then also cap (c), then also (b), then also (a). Every dropped
  constraint of the level that succeeded is appended to ``self.relaxations[t]`` once per pick
  (so one pick that needed to drop the progress filter and cap (c) appends
  ``"progress_filter", "cap_consecutive"``). When even dropping every cap leaves no candidate (all
  remaining nodes are in the batch or identifier-excluded) ``ReferenceInfeasible`` is raised under
  both policies. ``self.relaxations[t]`` is set (possibly to an empty list) by every successful
  ``select(t)``, under both policies.
* Cold start: identifier-excluded nodes are never picked. The representative of an environment is
  the argmax over its non-excluded members of the mean similarity to all other members (excluded
  members included in that mean); an environment whose members are all excluded has none.
  "E" in "E <= B" is the number of environments that have a representative. When the remaining
  slots cannot be filled under "relax", the two-per-environment cap is lifted but the per-step
  environment cap C1 (``cap_step``) still applies ("cold_two_per_env" recorded per such pick);
  only if that is still infeasible C1 is dropped as well ("cap_step" recorded in addition).
* ``select(t)``, ``details(t)`` and ``observe(t, ...)`` require ``t`` to be the next step (the
  number of ``observe`` calls made so far). ``observe`` does not require a preceding ``select``:
  selection counts, runs and environment counts are taken from the nodes passed to ``observe``.
* A step with no observed node has no step mean and is skipped by bhat; ``details(t)`` raises
  ``ValueError`` when the window has no observed step at all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy.stats import rankdata

Y_NAMES = ("v", "m", "d")
# clip intervals of the centred observations, in the order (v, m, d)
Y_LO = np.array([0.0, 0.0, 0.0])
Y_HI = np.array([0.25, 1.0, 1.0])
SIGMA_FLOOR = 0.05


class ReferenceInfeasible(ValueError):
    """No eligible node for a pick (policy "error"), or none even after relaxing (policy "relax")."""


@dataclasses.dataclass(frozen=True)
class RefConfig:
    batch_size: int = 64
    rho: float = 0.5
    k_within: int = 6
    k_cross: int = 12
    lambda_g: float = 2.0
    lambda_s: float = 2.0
    h_long: float = 8.0
    h_short: float = 2.0
    eta: float = 0.5
    c0: float = 16.0
    lambda_sim: float = 0.08
    cap_step: int = 4
    cap_window: int = 11
    cap_consecutive: int = 2
    step_capacity: int = 128
    ridge_lambda: float = 1.0
    progress_min_transitions: int = 3
    infeasible: str = "error"  # or "relax"
    relations: str = "both"  # or "within" / "cross" (ablations)
    calibration: tuple[int, int] = (13, 7)  # eq. 12's 0.65 : 0.35 as integers
    progress_fit: str = "earlier_steps"  # or "in_sample"


@dataclasses.dataclass(frozen=True)
class Observation:
    step: int
    v: float
    m: float
    d: float

    def y(self) -> np.ndarray:
        return np.array([self.v, self.m, self.d], dtype=np.float64)


def observation_stats(rewards: np.ndarray) -> tuple[float, float, float]:
    """(m, v, d) of one node's K rewards."""
    r = np.asarray(rewards, dtype=np.float64)
    m = float(np.mean(r))
    v = float(np.mean((r - m) ** 2))
    d = float(np.clip(v / max(m * (1.0 - m), 0.01), 0.0, 1.0))
    return m, v, d


def percentile_rank(z: np.ndarray) -> np.ndarray:
    """pr(z)_i = (rankavg(z)_i - 0.5) / N over all N entries (ties averaged)."""
    z = np.asarray(z, dtype=np.float64)
    return (rankdata(z, method="average") - 0.5) / z.shape[0]


def fit_ridge(design: np.ndarray, target: np.ndarray, lam: float) -> np.ndarray:
    """Ridge coefficients for ``target ~ design`` (no intercept), one explicit dense solve."""
    a = design.T @ design + lam * np.eye(design.shape[1])
    return np.linalg.solve(a, design.T @ target)


class ReferenceEnvSched:
    def __init__(
        self,
        s_full: np.ndarray,
        s_abs: np.ndarray,
        env_index: np.ndarray,
        config: RefConfig = RefConfig(),
        excluded=(),
    ):
        self.s_full = np.array(s_full, dtype=np.float64)
        self.s_abs = np.array(s_abs, dtype=np.float64)
        self.env = np.array(env_index, dtype=np.int64)
        n = self.env.shape[0]
        if self.s_full.shape != (n, n) or self.s_abs.shape != (n, n):
            raise ValueError("similarity matrices must be N x N")
        if config.infeasible not in ("error", "relax"):
            raise ValueError(f"unknown infeasible policy {config.infeasible!r}")
        self.config = config
        self.n = n
        self.n_env = int(self.env.max()) + 1
        self.excluded = frozenset(int(i) for i in excluded)
        # full history, plain lists
        self.obs: list[list[Observation]] = [[] for _ in range(n)]
        self.step_means: list[np.ndarray | None] = []  # per step: (v, m, d) or None
        self.step_env_counts: list[list[int]] = []  # per step: selections per environment
        self.sel_count = [0] * n  # c_i: cumulative selections over steps < t
        self.env_cum = [0] * self.n_env  # cumulative selections per environment
        self.run = [0] * n  # consecutive steps immediately before t in which i was selected
        self.next_step = 0
        self.relaxations: dict[int, list[str]] = {}

    # ------------------------------------------------------------------ helpers
    def _check_step(self, t: int) -> None:
        if t != self.next_step:
            raise ValueError(f"step {t} is not the next step {self.next_step}")

    def _in_window(self, s: int, t: int) -> bool:
        return t - self.config.step_capacity <= s < t

    def usable(self, i: int, t: int) -> list[Observation]:
        """i's observations with steps in the window, oldest first."""
        return [o for o in self.obs[i] if self._in_window(o.step, t)]

    def _observed(self, i: int, t: int) -> bool:
        return any(o.step < t for o in self.obs[i])

    def _neighbours(self, t: int, same_env: bool) -> np.ndarray:
        k = self.config.k_within if same_env else self.config.k_cross
        sim = self.s_full if same_env else self.s_abs
        out = np.full((self.n, k), -1, dtype=np.int64)
        observed = [self._observed(j, t) for j in range(self.n)]
        for i in range(self.n):
            cands = [
                j
                for j in range(self.n)
                if j != i and observed[j] and ((self.env[j] == self.env[i]) == same_env)
            ]
            cands.sort(key=lambda j: (-sim[i, j], j))
            for slot, j in enumerate(cands[:k]):
                out[i, slot] = j
        return out

    @staticmethod
    def _sigma(nbr: np.ndarray, sim: np.ndarray) -> np.ndarray:
        sigma = np.full(nbr.shape[0], SIGMA_FLOOR)
        for i in range(nbr.shape[0]):
            js = [j for j in nbr[i] if j >= 0]
            if js:
                deltas = [min(max(1.0 - sim[i, j], 0.0), 1.0) for j in js]
                sigma[i] = max(float(np.median(deltas)), SIGMA_FLOOR)
        return sigma

    def _relation_estimate(self, nbr, sim, sigma, W, ybar, bhat) -> np.ndarray:
        lg = self.config.lambda_g
        G = np.empty((self.n, 3))
        for i in range(self.n):
            js = [j for j in nbr[i] if j >= 0]
            if not js:
                G[i] = bhat
                continue
            num = lg * bhat.copy()
            den = lg
            for j in js:
                delta = min(max(1.0 - sim[i, j], 0.0), 1.0)
                a = math.exp(-0.5 * (delta / sigma[i]) ** 2) * min(max(W[j], 0.1), 3.0)
                num = num + a * ybar[j]
                den += a
            G[i] = num / den
        return G

    # ------------------------------------------------------------------ progress filter
    def progress_fit(self, t: int, nbr_in: np.ndarray, nbr_cross: np.ndarray) -> dict:
        """Transitions, ridge fit and shrunken residual estimates of the progress filter."""
        cfg = self.config
        trans_node, feats, target, later = [], [], [], []
        for i in range(self.n):
            u = self.usable(i, t)
            for k in range(len(u) - 1):
                o1, o2 = u[k], u[k + 1]
                trans_node.append(i)
                feats.append([o1.m, o1.m**2, o1.v, float(o1.step), float(k + 1)])
                target.append(o2.m)
                later.append(o2.step)
        n_trans = np.zeros(self.n, dtype=np.int64)
        for i in trans_node:
            n_trans[i] += 1
        out = {
            "transition_node": np.array(trans_node, dtype=np.int64),
            "X": np.array(feats, dtype=np.float64).reshape(-1, 5),
            "y": np.array(target, dtype=np.float64),
            "progress_n": n_trans,
            "progress_est": np.zeros(self.n),
            "progress_excluded": np.zeros(self.n, dtype=bool),
        }
        X = out["X"]
        y = out["y"]

        def standardise(X_fit, X_apply):
            x_std = np.zeros_like(X_apply)
            for c in range(X_fit.shape[1]):
                col = X_fit[:, c]
                if col.max() == col.min():
                    continue  # std 0 -> divisor 1, standardised column exactly 0
                x_std[:, c] = (X_apply[:, c] - col.mean()) / col.std()
            return x_std

        def onehot(rows):
            out_ = np.zeros((len(rows), self.n_env))
            for r, i in enumerate(rows):
                out_[r, self.env[i]] = 1.0
            return out_

        nodes = np.array(trans_node, dtype=np.int64)
        if cfg.progress_fit == "earlier_steps":
            # The paper's rule: each transition is predicted by a fit on the transitions of
            # strictly earlier steps only (standardised and centred on those); a step with fewer
            # than two earlier transitions has no fit and its transitions are not scored.
            later_arr = np.array(later, dtype=np.int64)
            resid = np.zeros(len(trans_node))
            scored = np.zeros(len(trans_node), dtype=bool)
            for s_ in sorted(set(later)):
                fit, here = later_arr < s_, later_arr == s_
                if fit.sum() < 2:
                    continue
                y_mean = float(y[fit].mean())
                coef = fit_ridge(np.concatenate([standardise(X[fit], X[fit]), onehot(nodes[fit])], axis=1),
                                 y[fit] - y_mean, cfg.ridge_lambda)
                design_here = np.concatenate([standardise(X[fit], X[here]), onehot(nodes[here])], axis=1)
                resid[here] = y[here] - (y_mean + design_here @ coef)
                scored[here] = True
            keep = np.flatnonzero(scored)
            trans_node = [trans_node[r] for r in keep]
            resid = resid[keep]
            n_trans = np.zeros(self.n, dtype=np.int64)
            for i in trans_node:
                n_trans[i] += 1
            out.update(progress_n=n_trans, scored=scored)
        else:
            if len(trans_node) < 2:
                return out
            design = np.concatenate([standardise(X, X), onehot(nodes)], axis=1)
            y_mean = float(y.mean())
            coef = fit_ridge(design, y - y_mean, cfg.ridge_lambda)
            resid = y - (y_mean + design @ coef)
            out.update(design=design, y_centered=y - y_mean, y_mean=y_mean, coef=coef)

        rbar = np.zeros(self.n)
        for i in range(self.n):
            mine = [resid[r] for r in range(len(trans_node)) if trans_node[r] == i]
            if mine:
                rbar[i] = float(np.mean(mine))
        r_env = np.zeros(self.n_env)
        for e in range(self.n_env):
            of_e = [resid[r] for r in range(len(trans_node)) if self.env[trans_node[r]] == e]
            if of_e:
                r_env[e] = float(np.mean(of_e))
        est = np.zeros(self.n)
        ls = cfg.lambda_s
        for i in range(self.n):
            kept = {"both": list(nbr_in[i]) + list(nbr_cross[i]), "within": list(nbr_in[i]),
                    "cross": list(nbr_cross[i])}[cfg.relations]
            nbrs = [j for j in kept if j >= 0 and n_trans[j] > 0]
            r_nb = float(np.mean([rbar[j] for j in nbrs])) if nbrs else 0.0
            ref = 0.5 * r_env[self.env[i]] + 0.5 * r_nb
            est[i] = (n_trans[i] * rbar[i] + ls * ref) / (n_trans[i] + ls)
        out.update(
            residuals=resid,
            rbar=rbar,
            r_env=r_env,
            progress_est=est,
            progress_excluded=(n_trans >= cfg.progress_min_transitions) & (est <= 0.0),
        )
        return out

    # ------------------------------------------------------------------ scores
    def details(self, t: int) -> dict:
        self._check_step(t)
        if t < 1:
            raise ValueError("details needs t >= 1")
        cfg = self.config
        window = [s for s in range(t) if self._in_window(s, t) and self.step_means[s] is not None]
        if not window:
            raise ValueError(f"step {t}: no observed step in the window")
        nbr_in = self._neighbours(t, same_env=True)
        nbr_cross = self._neighbours(t, same_env=False)
        sigma_in = self._sigma(nbr_in, self.s_full)
        sigma_cross = self._sigma(nbr_cross, self.s_abs)

        res = {k: {} for k in ("bhat", "W", "ybar", "G_in", "G_cross", "P", "yhat", "f", "u_h")}
        for h in (float(cfg.h_long), float(cfg.h_short)):

            def w(s: int) -> float:
                return 2.0 ** (-(t - s) / h)

            num = sum(w(s) * self.step_means[s] for s in window)
            bhat = num / sum(w(s) for s in window)
            W = np.zeros(self.n)
            ybar = np.empty((self.n, 3))
            for i in range(self.n):
                acc = np.zeros(3)
                for o in self.usable(i, t):
                    ytil = np.clip(o.y() - self.step_means[o.step] + bhat, Y_LO, Y_HI)
                    acc += w(o.step) * ytil
                    W[i] += w(o.step)
                ybar[i] = acc / W[i] if W[i] > 0 else bhat
            G_in = self._relation_estimate(nbr_in, self.s_full, sigma_in, W, ybar, bhat)
            G_cross = self._relation_estimate(nbr_cross, self.s_abs, sigma_cross, W, ybar, bhat)
            P = {"both": 0.5 * G_in + 0.5 * G_cross, "within": G_in, "cross": G_cross}[self.config.relations]
            ls = cfg.lambda_s
            yhat = (W[:, None] * ybar + ls * P) / (W[:, None] + ls)
            vhat, mhat, dhat = yhat[:, 0], yhat[:, 1], yhat[:, 2]
            f = dhat * mhat * (1.0 - mhat)
            # 0.65 pr(vhat) + 0.35 pr(f) (config.calibration = (13, 7)), evaluated exactly (see the
            # spec's numerics note): a pr(vhat) + b pr(f) with pr = (r - 1) / (2 n), r = 2 rankavg.
            a, b = cfg.calibration
            r_v = 2 * rankdata(vhat, method="average")
            r_f = 2 * rankdata(f, method="average")
            p = (a * r_v + b * r_f - (a + b)) / (2 * (a + b) * self.n)
            u_h = np.quantile(vhat, p)
            for key, val in (
                ("bhat", bhat), ("W", W), ("ybar", ybar), ("G_in", G_in), ("G_cross", G_cross),
                ("P", P), ("yhat", yhat), ("f", f), ("u_h", u_h),
            ):
                res[key][h] = val
        u_long = res["u_h"][float(cfg.h_long)]
        u_short = res["u_h"][float(cfg.h_short)]
        u = u_long - cfg.eta * np.maximum(u_long - u_short, 0.0)
        q = percentile_rank(u)
        prog = self.progress_fit(t, nbr_in, nbr_cross)
        res.update(
            nbr_in=nbr_in,
            nbr_cross=nbr_cross,
            sigma_in=sigma_in,
            sigma_cross=sigma_cross,
            u=u,
            q=q,
            progress_n=prog["progress_n"],
            progress_est=prog["progress_est"],
            progress_excluded=prog["progress_excluded"],
        )
        return res

    # ------------------------------------------------------------------ selection
    def select(self, t: int) -> tuple[list[int], list[str]]:
        self._check_step(t)
        if t == 0:
            picks, relax = self._cold_start()
            phases = ["cold"] * len(picks)
        else:
            d = self.details(t)
            picks, phases, relax = self._build_batch(t, d["q"], d["progress_excluded"])
        self.relaxations[t] = relax
        return picks, phases

    def construct_batch(self, t: int, q: np.ndarray, progress_excluded=None):
        """Batch construction for step t >= 1 from given scores (no state change)."""
        self._check_step(t)
        if progress_excluded is None:
            progress_excluded = np.zeros(self.n, dtype=bool)
        picks, phases, _ = self._build_batch(t, np.asarray(q, dtype=np.float64), progress_excluded)
        return picks, phases

    def _build_batch(self, t, q, progress_excluded):
        cfg = self.config
        b_cov = int(math.floor(cfg.rho * cfg.batch_size))
        b_exp = cfg.batch_size - b_cov
        prev_env = [0] * self.n_env  # selections of each environment in steps t-1 and t-2
        for s in (t - 1, t - 2):
            if s >= 0:
                for e in range(self.n_env):
                    prev_env[e] += self.step_env_counts[s][e]
        batch: list[int] = []
        phases: list[str] = []
        relax: list[str] = []
        batch_env = [0] * self.n_env

        def eligible(i: int, dropped: tuple[str, ...], phase: str) -> bool:
            e = self.env[i]
            if i in batch or i in self.excluded:
                return False
            if "cap_step" not in dropped and batch_env[e] >= cfg.cap_step:
                return False
            if "cap_window" not in dropped and prev_env[e] + batch_env[e] >= cfg.cap_window:
                return False
            if "cap_consecutive" not in dropped and self.run[i] >= cfg.cap_consecutive:
                return False
            if phase == "exploitation" and "progress_filter" not in dropped and progress_excluded[i]:
                return False
            return True

        def penalty(i: int) -> float:
            if not batch:
                return 0.0
            return cfg.lambda_sim * max(self.s_full[i, j] for j in batch)

        def argmax(cands: list[int], score) -> int:
            best, best_val = -1, -math.inf
            for i in sorted(cands):
                val = score(i)
                if val > best_val:
                    best, best_val = i, val
            return best

        for phase, count in (("coverage", b_cov), ("exploitation", b_exp)):
            order = ["cap_consecutive", "cap_window", "cap_step"]
            if phase == "exploitation":
                order = ["progress_filter"] + order
            levels = [tuple(order[:k]) for k in range(len(order) + 1)]
            if cfg.infeasible == "error":
                levels = levels[:1]
            for _ in range(count):
                cands: list[int] = []
                for dropped in levels:
                    cands = [i for i in range(self.n) if eligible(i, dropped, phase)]
                    if cands:
                        break
                if not cands:
                    raise ReferenceInfeasible(
                        f"step {t}: no eligible node for {phase} pick {len(batch) + 1} of "
                        f"{cfg.batch_size}; picks so far: {batch}"
                    )
                relax.extend(dropped)
                if phase == "coverage":

                    def key(i: int) -> tuple[int, int, int]:
                        e = self.env[i]
                        return (batch_env[e], self.env_cum[e], len(self.obs[i]))

                    kmin = min(key(i) for i in cands)
                    cands = [i for i in cands if key(i) == kmin]
                    pick = argmax(cands, lambda i: q[i] - penalty(i))
                else:

                    def omega(i: int) -> float:
                        return (1.0 + self.sel_count[i] / cfg.c0) ** -0.5

                    pick = argmax(cands, lambda i: q[i] * omega(i) - penalty(i))
                batch.append(pick)
                phases.append(phase)
                batch_env[self.env[pick]] += 1
        return batch, phases, relax

    def representatives(self) -> list[int]:
        """Representative of each environment (environment order), see module docstring."""
        reps = []
        for e in range(self.n_env):
            members = [i for i in range(self.n) if self.env[i] == e]
            best, best_val = -1, -math.inf
            for i in members:
                if i in self.excluded:
                    continue
                others = [j for j in members if j != i]
                val = float(np.mean([self.s_full[i, j] for j in others])) if others else 0.0
                if val > best_val:
                    best, best_val = i, val
            if best >= 0:
                reps.append(best)
        return reps

    def _novelty(self, i: int, batch: list[int]) -> float:
        glob = max((self.s_full[i, j] for j in batch), default=0.0)
        same = max((self.s_full[i, j] for j in batch if self.env[j] == self.env[i]), default=0.0)
        return 0.5 * (1.0 - glob) + 0.5 * (1.0 - same)

    def _greedy_novelty(self, cands: list[int], batch: list[int]) -> int:
        best, best_val = -1, -math.inf
        for i in sorted(cands):
            val = self._novelty(i, batch)
            if val > best_val:
                best, best_val = i, val
        return best

    def _cold_start(self) -> tuple[list[int], list[str]]:
        cfg = self.config
        B = cfg.batch_size
        reps = self.representatives()
        batch: list[int] = []
        relax: list[str] = []
        if len(reps) <= B:
            batch = list(reps)
        else:
            while len(batch) < B:
                batch.append(self._greedy_novelty([r for r in reps if r not in batch], batch))

        def env_count(e: int) -> int:
            return sum(1 for j in batch if self.env[j] == e)

        levels: list[tuple[str, ...]] = [()]
        if cfg.infeasible == "relax":
            levels += [("cold_two_per_env",), ("cold_two_per_env", "cap_step")]
        while len(batch) < B:
            cands: list[int] = []
            for dropped in levels:
                if "cap_step" in dropped:
                    limit = math.inf
                elif "cold_two_per_env" in dropped:
                    limit = cfg.cap_step
                else:
                    limit = 2
                cands = [
                    i
                    for i in range(self.n)
                    if i not in batch and i not in self.excluded and env_count(self.env[i]) < limit
                ]
                if cands:
                    break
            if not cands:
                raise ReferenceInfeasible(
                    f"step 0: no eligible node for cold pick {len(batch) + 1} of {B}; "
                    f"picks so far: {batch}"
                )
            relax.extend(dropped)
            batch.append(self._greedy_novelty(cands, batch))
        return batch, relax

    # ------------------------------------------------------------------ observe
    def observe(self, t: int, nodes: Sequence[int], rewards: np.ndarray) -> None:
        self._check_step(t)
        nodes = [int(i) for i in nodes]
        rewards = np.asarray(rewards, dtype=np.float64)
        if len(set(nodes)) != len(nodes):
            raise ValueError("observed nodes must be distinct")
        if rewards.ndim != 2 or rewards.shape[0] != len(nodes):
            raise ValueError("rewards must have shape [len(nodes), K]")
        ys = []
        for i, r in zip(nodes, rewards):
            m, v, d = observation_stats(r)
            self.obs[i].append(Observation(step=t, v=v, m=m, d=d))
            ys.append([v, m, d])
        self.step_means.append(np.mean(np.array(ys), axis=0) if ys else None)
        counts = [0] * self.n_env
        for i in nodes:
            counts[self.env[i]] += 1
            self.sel_count[i] += 1
        for e in range(self.n_env):
            self.env_cum[e] += counts[e]
        self.step_env_counts.append(counts)
        picked = set(nodes)
        self.run = [self.run[i] + 1 if i in picked else 0 for i in range(self.n)]
        self.next_step = t + 1
