r"""Schedulers: EnvSched (the paper's) and baselines, behind one API and registry.

# EnvSched as implemented here: every equation and every choice the paper leaves open

Source: the EnvSched paper (sections 2.2-2.4, appendices B-D). Where the paper
is silent the choice below is ours (marked CHOICE). Both the JAX implementation
(`envsched_jax/sched/`) and the plain NumPy reference (`tests/reference_envsched.py`) follow
exactly this text. The paper guide (`docs/papers/envsched.md`) maps each equation to its function.

Notation: $N$ nodes (tasks), $E$ environments, $\operatorname{env}(i)$ its environment index, $B$
batch size, $K$ rollouts per node. $S^{\mathrm{full}}$, $S^{\mathrm{abs}}$: dense $N \times N$
float similarity matrices in $[0, 1]$ with unit diagonal (from the static graph). Steps
$t = 0, 1, 2, \dots$: `select(t)` picks a batch, `observe(t, ids, rewards[B, K])` records it.
Steps are strictly sequential: select(t) -> observe(t) -> select(t+1).

## Observations
For a node observed at step $s$ with rewards $r_1, \dots, r_K$ (each in $[0, 1]$): mean $m$,
population variance $v$ and mean-corrected dispersion $d$,

$$
m = \frac{1}{K} \sum_{k=1}^{K} r_k, \qquad
v = \frac{1}{K} \sum_{k=1}^{K} (r_k - m)^2, \qquad
d = \operatorname{clip}\left(\frac{v}{\max(m (1 - m),\ 0.01)},\ 0,\ 1\right).
$$

Step mean $b^y_s$ ($y \in \{v, m, d\}$) = mean of $y$ over the nodes observed at step $s$.

CHOICE (bounded history): only observations and step means from the last `step_capacity` = 128
steps are used (steps $s$ with $t - 128 \le s < t$); within that window every observation of a
node counts. An observation 128 steps old would weigh $2^{-16}$ at $h = 8$, so the truncation is
negligible. (The implementation keeps a step-major ring of $S \times B$ observations: $O(S B)$,
independent of $N$.)

## Half-life weighting and centering (per half-life h in {h_long = 8, h_short = 2})
Weight of step $s$ seen at step $t$, global reference $\hat b^y_t$ (sums over the steps $s$ in the
window that have observations; `select(t)` for $t \ge 1$ always has at least the observed step
$t - 1$) and centered observation $\tilde y_{i,s}$, with $I_v = [0, 0.25]$,
$I_m = I_d = [0, 1]$:

$$
w^{(h)}_{t,s} = 2^{-(t - s)/h}, \qquad
\hat b^y_t = \frac{\sum_s w^{(h)}_{t,s}\, b^y_s}{\sum_s w^{(h)}_{t,s}}, \qquad
\tilde y_{i,s} = \operatorname{clip}_{I_y}\left(y_{i,s} - b^y_s + \hat b^y_t\right).
$$

Node history, over $i$'s usable observations $s$:

$$
W_i = \sum_s w^{(h)}_{t,s}, \qquad
\bar y_i = \frac{\sum_s w^{(h)}_{t,s}\, \tilde y_{i,s}}{W_i} \ \text{ if } W_i > 0,
\ \text{ else } \bar y_i = \hat b^y_t.
$$

## Neighbours (independent of h)
"Observed" node = has at least one observation at a step $< t$ (ever, even if since evicted).
$N_{\mathrm{in}}(i)$: up to $K_{\mathrm{within}} = 6$ observed nodes $j \ne i$ with
$\operatorname{env}(j) = \operatorname{env}(i)$, with the largest $S^{\mathrm{full}}_{ij}$;
$N_{\mathrm{cross}}(i)$: up to $K_{\mathrm{cross}} = 12$ observed nodes with
$\operatorname{env}(j) \ne \operatorname{env}(i)$, with the largest $S^{\mathrm{abs}}_{ij}$.
CHOICE: ties broken by lower index $j$. For $q \in \{\mathrm{in}, \mathrm{cross}\}$
($S^{\mathrm{in}} = S^{\mathrm{full}}$, $S^{\mathrm{cross}} = S^{\mathrm{abs}}$):

$$
\delta^q_{ij} = \operatorname{clip}\left(1 - S^q_{ij},\ 0,\ 1\right), \qquad
\sigma^q_i = \max\left(\operatorname{median}_{j \in N_q(i)} \delta^q_{ij},\ 0.05\right)
$$

(CHOICE: numpy median, i.e. the mean of the two middle values for an even count); no
neighbours -> no $\sigma$ needed.

## Relation estimates, fusion, posterior (per h, per y)

$$
a^q_{ij} = \exp\left(-\tfrac{1}{2} \left(\delta^q_{ij} / \sigma^q_i\right)^2\right)
\operatorname{clip}\left(W^{(h)}_j,\ 0.1,\ 3\right), \qquad
G^{q,y}_i = \frac{\sum_{j \in N_q(i)} a^q_{ij}\, \bar y_j + \lambda_g \hat b^y}
{\sum_{j \in N_q(i)} a^q_{ij} + \lambda_g},
$$

$\lambda_g = 2$; no neighbour -> $G^{q,y}_i = \hat b^y$.
CHOICE (numerics): $\delta^q_{ij} / \sigma^q_i$ is exactly 1 where $\delta^q_{ij} = \sigma^q_i$
(e.g. every row with one neighbour), so equal inputs give bit-for-bit equal weights.

$$
P^y_i = 0.5\, G^{\mathrm{in},y}_i + 0.5\, G^{\mathrm{cross},y}_i, \qquad
\hat y_i = \frac{W_i \bar y_i + \lambda_s P^y_i}{W_i + \lambda_s}, \quad \lambda_s = 2.
$$

(Ablations, `relations` = "within" / "cross": $P = G^{\mathrm{in}}$ / $G^{\mathrm{cross}}$, and
the progress filter's $R_{\mathrm{nb}}$ uses only that relation's neighbours.)

## Calibration and score (per h, then combined)
$\operatorname{pr}(z)_i = (\operatorname{rankavg}(z)_i - 0.5) / N$, rankavg =
`scipy.stats.rankdata(z, "average")` (1-based, ties averaged), over all $N$ nodes.
$Q_{\hat v}(p)$ = `numpy.quantile(vhat, p)` (linear interpolation, position $p (N - 1)$ in the
sorted values).

$$
f_i = \hat d_i\, \hat m_i (1 - \hat m_i), \qquad
u^{(h)}_i = Q_{\hat v^{(h)}}\left(0.65\, \operatorname{pr}(\hat v^{(h)})_i
+ 0.35\, \operatorname{pr}(f^{(h)})_i\right).
$$

CHOICE (numerics): with $R = 2\, \operatorname{rankavg}$ (an integer), the argument equals
$(13 R_{\hat v} + 7 R_f - 20) / (40 N)$ and is computed that way, so that mathematically equal
arguments are bit-for-bit equal and tie in $q$ (evaluating $0.65 a + 0.35 b$ in floating point
can differ in the last bit between nodes, or between implementations, and flip a tie).

$$
u_i = u^{(h_{\mathrm{long}})}_i - \eta \max\left(u^{(h_{\mathrm{long}})}_i
- u^{(h_{\mathrm{short}})}_i,\ 0\right), \quad \eta = 0.5, \qquad
q_i = \operatorname{pr}(u)_i.
$$

## Progress filter (exploitation eligibility) -- the paper gives no formula: all CHOICE
Transitions: consecutive pairs ($s_1 < s_2$) of a node's usable observations (both steps $< t$).
Features $x = (m_1, m_1^2, v_1, s_1, n_1)$ with $n_1$ = the node's number of observations up to
and including $s_1$ (counted over its usable observations, oldest first); target $y = m_2$.
Fit (only on those transitions): standardise each feature column (mean, population std; a
column with max == min becomes exactly 0), giving $x_{\mathrm{std}}$; center the target
($\bar y$ = mean $y$); ridge regression of $y - \bar y$ on
$[x_{\mathrm{std}}, \operatorname{onehot}(\operatorname{env})]$ with penalty
$\lambda_{\mathrm{ridge}} = 1.0$ on every coefficient (no intercept beyond the centering):

$$
(\beta, \gamma) = \operatorname{argmin}_{\beta, \gamma} \sum_{\text{transitions}}
\left(y - \bar y - x_{\mathrm{std}} \beta - \gamma_{\operatorname{env}}\right)^2
+ \lambda_{\mathrm{ridge}} \left(\lVert \beta \rVert^2 + \lVert \gamma \rVert^2\right).
$$

Residual of a transition: $r = y - (\bar y + x_{\mathrm{std}} \beta + \gamma_{\operatorname{env}})$.
Which fit scores which transition (`progress_fit`): "earlier_steps" (default; the paper's
appendix C, "each transition is predicted using only transitions from earlier completed training
steps"): the transitions whose later observation is at step $s$ are scored by the fit above
computed on the transitions with later step $< s$ only (standardisation, centring and the
max == min test on those too); a step with fewer than two earlier transitions has no fit and its
transitions are not scored (they count in no $n_i$, $\bar r_i$ or $R_{\mathrm{env}}$). Cost: one
fit per step of the window, $O(S B + S E)$ per selection from per-step sums. "in_sample" (this
project's rule until 2026-12-04): one fit on all transitions, each scored by its in-sample
residual.
Node residual: $n_i$ = number of its scored transitions, $\bar r_i$ = their mean residual (0 if
none). Environment reference $R_{\mathrm{env}}(e)$ = mean residual over all scored transitions of
nodes of $e$ (0 if none). Neighbour reference $R_{\mathrm{nb}}(i)$ = mean of $\bar r_j$ over
$j \in N_{\mathrm{in}}(i) \cup N_{\mathrm{cross}}(i)$ with $n_j > 0$ (0 if none; the neighbour
sets of this step). Shrinkage as in eq. 4:

$$
\mathrm{est}_i = \frac{n_i \bar r_i + \lambda_s \left(0.5\, R_{\mathrm{env}}(\operatorname{env}(i))
+ 0.5\, R_{\mathrm{nb}}(i)\right)}{n_i + \lambda_s}.
$$

A node with $n_i \ge 3$ and $\mathrm{est}_i \le 0$ is excluded from exploitation (stays eligible
for coverage).
("in_sample") With fewer than 2 transitions in the whole pool there is no fit: every estimate is
0 and no node is excluded ($n_i$ still counts its transitions).

## Batch construction (select at step t >= 1)
$B_{\mathrm{cov}} = \lfloor \rho B \rfloor$, $B_{\mathrm{exp}} = B - B_{\mathrm{cov}}$,
$\rho = 0.5$; coverage picks first, then exploitation, into one shared batch.
Eligible for any pick: not in the batch yet; not in `excluded` (the identifier filter's set);

- (a) count of $\operatorname{env}(i)$ in the current batch $< C_1 = 4$;
- (b) selections of $\operatorname{env}(i)$ in steps $t-1$ and $t-2$ plus its count in the
  current batch $< C_3 = 11$;
- (c) $\mathrm{run}_i < C_{\mathrm{task}} = 2$, where $\mathrm{run}_i$ = number of consecutive
  steps immediately before $t$ in which $i$ was selected ($\mathrm{run}_i = 0$ if $i$ was not
  selected at $t-1$).

Penalty $\mathrm{pen}(i) = \lambda_{\mathrm{sim}} \max_{j \in \text{batch}} S^{\mathrm{full}}_{ij}$,
0 for an empty batch; $\lambda_{\mathrm{sim}} = 0.08$.
Coverage pick: among eligible nodes keep those with the smallest key1 = count of
$\operatorname{env}(i)$ in the current batch; among those the smallest key2 = cumulative
selections of $\operatorname{env}(i)$ over steps $< t$; among those the smallest key3 = number of
observations of $i$ (all ever). Pick $\operatorname{argmax}_i\, q_i - \mathrm{pen}(i)$; ties ->
lower index.
Exploitation pick: among eligible nodes not excluded by the progress filter, pick

$$
\operatorname{argmax}_i\ q_i \omega_i - \mathrm{pen}(i), \qquad
\omega_i = (1 + c_i / c_0)^{-1/2},
$$

$c_i$ = cumulative selections of $i$ over steps $< t$, $c_0 = 16$; ties -> lower index.
CHOICE (numerics): $q \omega$ and $\mathrm{pen}$ are each rounded on their own and then
subtracted (as NumPy evaluates the expression), so that mathematically equal scores tie exactly;
the kernel keeps XLA from contracting them into a fused multiply-add (`kernels.select_batch`).
CHOICE (infeasible picks): policy "error" (default) raises an error naming the step, the phase,
the pick and how many candidates each cap (and the progress filter) rules out, and the state is
unchanged; policy "relax" re-tries the pick dropping cumulatively, in order, the progress filter
(exploitation only), then cap (c), then (b), then (a). Per step it records, for each constraint,
how many picks had to drop it last (one aggregated metrics entry and one log line per step, not
one per pick).
CHOICE (feasible batch sizes, checked up front): `sched/feasibility.py` computes the largest $B$
the caps can fill at every step whatever the rewards (the cold start's two per environment, cap
(a) with the environments' sizes, and the worst history caps (b) and (c) allow); the progress
filter is data-dependent and not part of it. A larger $B$ is refused by the constructor naming
the binding cap under "error", and logged once under "relax". Two environments of 7 or more
tasks each: $B = 4$ (the cold start binds; later steps alone would allow 7: after 4 + 4 picks of
one environment in two steps, $C_3 = 11$ leaves it 3).

## Cold start (step 0, static structure only)
Representative of env $e$: $\operatorname{argmax}$ over the non-excluded $i$ in $e$ of
$\operatorname{mean}_{j \in e,\ j \ne i} S^{\mathrm{full}}_{ij}$ (the mean runs over all members;
a single-task environment: its task); ties -> lower index. An environment whose tasks are all
excluded has no representative.
Combined novelty of $i$ given the batch, each max taken as 0 when empty:

$$
\mathrm{nov}(i) = 0.5 \left(1 - \max_{j \in \text{batch}} S^{\mathrm{full}}_{ij}\right)
+ 0.5 \left(1 - \max_{j \in \text{batch},\ \operatorname{env}(j) = \operatorname{env}(i)}
S^{\mathrm{full}}_{ij}\right).
$$

If $E \le B$: the batch starts with all representatives (in environment order); else
representatives are added greedily by argmax combined novelty until $B$, ties -> lower node index
(not the first environment: the first such pick is always a tie, every novelty being 1 on an
empty batch, and goes to the lowest-index representative).
Remaining slots: greedy argmax combined novelty over nodes not in the batch whose environment has
fewer than 2 nodes in the batch (ties -> lower index). If fewer than $B$ can be placed: the
infeasible-pick policy applies ("relax" first lifts the two-per-environment cap to $C_1$, then
drops $C_1$ too, recording "cold_two_per_env" or "cap_step" for the pick).
CHOICE (numerics): both comparisons are exact (`sched/cold_start.py`, one jitted kernel): a
representative's mean through exact fixed-point sums of its similarities, the novelty through the
error-free pair $(\mathrm{fl}(g + w), \text{rounding error})$ of $g + w$, where $g, w$ are the two
maxima; so mathematically equal values tie and the lower index wins, as in the NumPy reference's
float64.

## State after observe(t)
Selection count $c_i \leftarrow c_i + 1$ for each picked node; env cumulative selections += count;
$\mathrm{run}_i \leftarrow \mathrm{run}_i + 1$ for picked nodes, 0 for the others; the step's
per-env counts are kept for cap (b); observations are appended to the logs; step means appended.
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
