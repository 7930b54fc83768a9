"""Schedulers: EnvSched (the paper's) and baselines, behind one API and registry.

# EnvSched as implemented here: every equation and every choice the paper leaves open

Source: the EnvSched paper (sections 2.2-2.4, appendices B-D). Where the paper
is silent the choice below is ours (marked CHOICE). Both the JAX implementation
(`envsched_jax/sched/`) and the plain NumPy reference (`tests/reference_envsched.py`) follow
exactly this text.

Notation: N nodes (tasks), E environments, env(i) its environment index, B batch size, K rollouts
per node. S_full, S_abs: dense N x N float similarity matrices in [0, 1] with unit diagonal
(from the static graph). Steps t = 0, 1, 2, ...: `select(t)` picks a batch, `observe(t, ids,
rewards[B, K])` records it. Steps are strictly sequential: select(t) -> observe(t) -> select(t+1).

## Observations
For a node observed at step s with rewards r_1..r_K (each in [0, 1]):
m = mean r; v = population variance (1/K) sum (r - m)^2; d = clip(v / max(m (1 - m), 0.01), 0, 1).
Step mean b[y, s] (y in {v, m, d}) = mean of y over the nodes observed at step s.

CHOICE (bounded history): only observations and step means from the last `step_capacity` = 128
steps are used (steps s with t - 128 <= s < t); within that window every observation of a node
counts. An observation 128 steps old would weigh 2^-16 at h = 8, so the truncation is negligible.
(The implementation keeps a step-major ring of S x B observations: O(S B), independent of N.)

## Half-life weighting and centering (per half-life h in {h_long = 8, h_short = 2})
w(h)[t, s] = 2^(-(t - s)/h).
Global reference bhat[y, t] = sum_s w b[y, s] / sum_s w over the steps s in the window that have
observations. (select(t) for t >= 1 always has at least the observed step t-1.)
Centered observation ytilde[i, s] = clip(y[i, s] - b[y, s] + bhat[y, t], I_y), I_v = [0, 0.25],
I_m = I_d = [0, 1].
Node history: W[i] = sum over i's usable observations of w(h)[t, s];
ybar[i] = sum w ytilde / W if W > 0 else bhat[y, t].

## Neighbours (independent of h)
"Observed" node = has at least one observation at a step < t (ever, even if since evicted).
N_in(i): up to K_within = 6 observed nodes j != i with env(j) == env(i), with the largest
S_full[i, j]; N_cross(i): up to K_cross = 12 observed nodes with env(j) != env(i), with the largest
S_abs[i, j]. CHOICE: ties broken by lower index j.
delta_q[i, j] = clip(1 - S_q[i, j], 0, 1).
sigma_q[i] = max(median over j in N_q(i) of delta_q[i, j], 0.05) (CHOICE: numpy median, i.e. the
mean of the two middle values for an even count); no neighbours -> no sigma needed.

## Relation estimates, fusion, posterior (per h, per y)
a_q[i, j] = exp(-0.5 (delta_q[i, j] / sigma_q[i])^2) * clip(W(h)[j], 0.1, 3)
G_q[y, i] = (sum_{j in N_q(i)} a_q[i, j] ybar[j] + lambda_g bhat[y]) / (sum_j a_q[i, j] + lambda_g),
lambda_g = 2; no neighbour -> bhat[y].
CHOICE (numerics): delta_q / sigma_q is exactly 1 where delta_q[i, j] == sigma_q[i] (e.g. every row
with one neighbour), so equal inputs give bit-for-bit equal weights.
P[y, i] = 0.5 G_in + 0.5 G_cross. (Ablations, `relations` = "within" / "cross": P = G_in / G_cross,
and the progress filter's R_nb uses only that relation's neighbours.)
yhat[i] = (W[i] ybar[i] + lambda_s P[y, i]) / (W[i] + lambda_s), lambda_s = 2.

## Calibration and score (per h, then combined)
pr(z)_i = (rankavg(z)_i - 0.5) / N, rankavg = scipy.stats.rankdata(z, "average") (1-based, ties
averaged), over all N nodes.
Q_vhat(p) = numpy.quantile(vhat, p) (linear interpolation, position p (N - 1) in the sorted
values).
f[i] = dhat[i] mhat[i] (1 - mhat[i]).
u(h)[i] = Q_vhat(h)( 0.65 pr(vhat(h))_i + 0.35 pr(f(h))_i ).
CHOICE (numerics): with R = 2 rankavg (an integer), the argument equals
(13 R_vhat + 7 R_f - 20) / (40 N) and is computed that way, so that mathematically equal
arguments are bit-for-bit equal and tie in q (evaluating 0.65 a + 0.35 b in floating point can
differ in the last bit between nodes, or between implementations, and flip a tie).
u[i] = u(h_long)[i] - eta max(u(h_long)[i] - u(h_short)[i], 0), eta = 0.5.
q[i] = pr(u)_i.

## Progress filter (exploitation eligibility) -- the paper gives no formula: all CHOICE
Transitions: consecutive pairs (s1 < s2) of a node's usable observations (both steps < t).
Features x = (m1, m1^2, v1, s1, n1) with n1 = the node's number of observations up to and including
s1 (counted over its usable observations, oldest first); target y = m2.
Fit (only on those transitions): standardise each feature column (mean, population std; a
column with max == min becomes exactly 0); center the target (ybar = mean y); ridge regression of y - ybar on [x_std, onehot(env)] with
penalty lambda_ridge = 1.0 on every coefficient (no intercept beyond the centering).
Residual of a transition: r = y - (ybar + x_std beta + gamma[env]).
Which fit scores which transition (`progress_fit`): "earlier_steps" (default; the paper's
appendix C, "each transition is predicted using only transitions from earlier completed training
steps"): the transitions whose later observation is at step s are scored by the fit above computed
on the transitions with later step < s only (standardisation, centring and the max == min test on
those too); a step with fewer than two earlier transitions has no fit and its transitions are not
scored (they count in no n_i, rbar or R_env). Cost: one fit per step of the window, O(S B + S E)
per selection from per-step sums. "in_sample" (this project's rule until 2026-12-04): one fit on
all transitions, each scored by its in-sample residual.
Node residual: n_i = number of its scored transitions, rbar_i = their mean residual (0 if none).
Environment reference R_env(e) = mean residual over all scored transitions of nodes of e (0 if none).
Neighbour reference R_nb(i) = mean of rbar_j over j in N_in(i) union N_cross(i) with n_j > 0 (0 if
none; the neighbour sets of this step).
Shrinkage as in eq. 4: est_i = (n_i rbar_i + lambda_s (0.5 R_env(env i) + 0.5 R_nb(i))) / (n_i + lambda_s).
A node with n_i >= 3 and est_i <= 0 is excluded from exploitation (stays eligible for coverage).
("in_sample") With fewer than 2 transitions in the whole pool there is no fit: every estimate is 0
and no node is excluded (n_i still counts its transitions).

## Batch construction (select at step t >= 1)
B_cov = floor(rho B), B_exp = B - B_cov, rho = 0.5; coverage picks first, then exploitation, into
one shared batch.
Eligible for any pick: not in the batch yet; not in `excluded` (the identifier filter's set);
(a) count of env(i) in the current batch < C1 = 4;
(b) selections of env(i) in steps t-1 and t-2 plus its count in the current batch < C3 = 11;
(c) run_i < Ctask = 2, where run_i = number of consecutive steps immediately before t in which i
was selected (run = 0 if i was not selected at t-1).
Penalty pen(i) = lambda_sim max_{j in batch} S_full[i, j], 0 for an empty batch; lambda_sim = 0.08.
Coverage pick: among eligible nodes keep those with the smallest key1 = count of env(i) in the
current batch; among those the smallest key2 = cumulative selections of env(i) over steps < t;
among those the smallest key3 = number of observations of i (all ever). Pick argmax q - pen;
ties -> lower index.
Exploitation pick: among eligible nodes not excluded by the progress filter, pick argmax
q * omega - pen, omega = (1 + c_i / c0)^(-1/2), c_i = cumulative selections of i over steps < t,
c0 = 16; ties -> lower index.
CHOICE (numerics): q omega and pen are each rounded on their own and then subtracted (as NumPy
evaluates the expression), so that mathematically equal scores tie exactly; the kernel keeps XLA
from contracting them into a fused multiply-add (`kernels.select_batch`).
CHOICE (infeasible picks): policy "error" (default) raises an error naming the step, the phase,
the pick and how many candidates each cap (and the progress filter) rules out, and the state is
unchanged; policy "relax" re-tries the pick dropping cumulatively, in order, the progress filter
(exploitation only), then cap (c), then (b), then (a). Per step it records, for each constraint,
how many picks had to drop it last (one aggregated metrics entry and one log line per step, not
one per pick).
CHOICE (feasible batch sizes, checked up front): `sched/feasibility.py` computes the largest B the
caps can fill at every step whatever the rewards (the cold start's two per environment, cap (a)
with the environments' sizes, and the worst history caps (b) and (c) allow); the progress filter
is data-dependent and not part of it. A larger B is refused by the constructor naming the
binding cap under "error", and logged once under "relax". Two environments of 7 or more tasks
each: B = 4 (the cold start binds; later steps alone would allow 7: after 4 + 4 picks of one
environment in two steps, C3 = 11 leaves it 3).

## Cold start (step 0, static structure only)
Representative of env e: argmax over the non-excluded i in e of mean_{j in e, j != i} S_full[i, j]
(the mean runs over all members; a single-task environment: its task); ties -> lower index. An
environment whose tasks are all excluded has no representative.
Combined novelty of i given the batch: 0.5 (1 - max_{j in batch} S_full[i, j])
+ 0.5 (1 - max_{j in batch, env(j) = env(i)} S_full[i, j]), each max taken as 0 when empty.
If E <= B: the batch starts with all representatives (in environment order); else representatives
are added greedily by argmax combined novelty until B, ties -> lower node index (not the first
environment: the first such pick is always a tie, every novelty being 1 on an empty batch, and goes
to the lowest-index representative).
Remaining slots: greedy argmax combined novelty over nodes not in the batch whose environment has
fewer than 2 nodes in the batch (ties -> lower index). If fewer than B can be placed: the
infeasible-pick policy applies ("relax" first lifts the two-per-environment cap to C1, then drops
C1 too, recording "cold_two_per_env" or "cap_step" for the pick).
CHOICE (numerics): both comparisons are exact (`sched/cold_start.py`, one jitted kernel): a
representative's mean through exact fixed-point sums of its similarities, the novelty through the
error-free pair (fl(g + w), rounding error) of g + w, where g, w are the two maxima; so
mathematically equal values tie and the lower index wins, as in the NumPy reference's float64.

## State after observe(t)
selection count c_i += 1 for each picked node; env cumulative selections += count; run_i = run_i + 1
for picked nodes, 0 for the others; the step's per-env counts are kept for cap (b); observations are
appended to the logs; step means appended.
"""

from envsched_jax.sched.base import (  # noqa: E402
    CheckpointError,
    InfeasibleBatchError,
    Scheduler,
    SchedulerInputError,
    SchedulingError,
    StepMetrics,
    make_scheduler,
    register_scheduler,
    registered_schedulers,
)
from envsched_jax.sched.config import EnvSchedConfig  # noqa: E402
from envsched_jax.sched.envsched import EnvSched  # noqa: E402
from envsched_jax.sched.feasibility import Feasibility, batch_feasibility  # noqa: E402
from envsched_jax.sched.random import RandomScheduler  # noqa: E402

__all__ = ["CheckpointError", "EnvSched", "EnvSchedConfig", "Feasibility", "InfeasibleBatchError",
           "RandomScheduler", "Scheduler", "SchedulerInputError", "SchedulingError", "StepMetrics",
           "batch_feasibility", "make_scheduler", "register_scheduler", "registered_schedulers"]

# Baseline schedulers (registered on import): DPS, MoPPS, the LEEPS reconstruction.
from envsched_jax.sched.dps import DPS, DPSConfig  # noqa: E402
from envsched_jax.sched.leeps import LEEPSReconstruction, LEEPSReconstructionConfig  # noqa: E402
from envsched_jax.sched.mopps import MoPPS, MoPPSConfig  # noqa: E402

__all__ += ["DPS", "DPSConfig", "LEEPSReconstruction", "LEEPSReconstructionConfig", "MoPPS", "MoPPSConfig"]
