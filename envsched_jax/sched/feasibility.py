"""The largest batch size B that EnvSched's caps can always fill on a pool, and which cap binds.

The caps (package docstring, "Batch construction" and "Cold start"), applied to one environment
e with n_e eligible tasks (tasks the identifier filter excluded never count):

- cold start (step 0, ``cold_start="static"``): at most 2 tasks of e;
- (a) C1: at most C1 tasks of e in one batch (and never more than n_e: tasks are distinct);
- (b) C3: at most C3 selections of e over the current and the two previous steps;
- (c) Ctask: a task picked in each of the last Ctask steps is not eligible.

"Feasible" here means *guaranteed*: every pick of every step finds an eligible task, whatever the
rewards (they steer which tasks the greedy picks, so any history the caps allow can happen). A
count such as "C3 = 11 over three steps, so 11 E / 3 per step" is not enough: the greedy may
pick C1 tasks of one environment two steps running, after which that environment can give only
C3 - 2 C1 more. CHOICE (where the spec is silent): the progress filter is not part of the bound,
because which tasks it excludes depends on the rewards; in ``infeasible="error"`` mode it can
still leave an exploitation pick without a candidate, and that step's error says so.

How the bound is computed. At step t an environment can take
``cap_e = min(C1, n_e - blocked_e, C3 - w_e)`` picks (clipped at 0), where w_e is its selections at
steps t-1 and t-2 and blocked_e its tasks picked in each of the last Ctask steps. An adversary
(the rewards) has the picks of the last steps, B per step, to spend; it spends them where they
remove the most capacity. For each environment we enumerate every (picks at t-1, picks at t-2,
blocked tasks) the caps allow and its cost in picks, then a max-plus knapsack over environments
gives the most capacity D(P) that P picks can remove. B is feasible at a step iff
``sum_e cap0_e - D(picks of the previous steps) >= B`` with cap0_e = min(C1, n_e, C3). Steps 1 and
2 are checked on their own (step 0 follows the cold-start rule, not the caps), steps >= 3 in
steady state. Lumping the per-step budgets into one (B picks per step, spent anywhere) and
ignoring how the history itself came about only helps the adversary, so the bound is safe: at or
below it no pick is ever infeasible. tests/test_feasibility.py checks it against an exhaustive
search of every history on small pools: with Ctask = 2 (the paper's) it is exact; with another
Ctask the lumped budget can make it lower than the true largest B (never higher).

Cost: O(E^2) small vector operations (about 0.3 s for 1,000 environments), once per scheduler.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from envsched_jax.sched.config import EnvSchedConfig

COLD_PER_ENV = 2  # the paper's cold start: at most 2 tasks per environment in the first batch


@dataclasses.dataclass(frozen=True)
class Feasibility:
    """The largest batch size each phase can always fill, and the binding cap for a given B.

    ``cold_start``: the largest B step 0 can fill; ``per_batch``: sum_e min(C1, n_e), the most
    any later step can hold; ``window`` / ``consecutive``: the largest B the worst-case history
    allows with only cap (b) / only cap (c) on top of (a); ``later_steps``: the same with every
    cap; ``largest``: min(cold_start, later_steps).
    """

    num_environments: int          # environments with at least one eligible task
    num_tasks: int                 # eligible tasks
    config: EnvSchedConfig
    cold_start: int
    per_batch: int
    window: int
    consecutive: int
    later_steps: int

    @property
    def largest(self) -> int:
        return min(self.cold_start, self.later_steps)

    @property
    def _environments(self) -> str:
        return f"{self.num_environments} environment{'s' if self.num_environments != 1 else ''}"

    def binding_cap(self, batch_size: int) -> str | None:
        """Why ``batch_size`` is infeasible (None when it is feasible), naming the cap and its
        numbers. The first phase to fail is named: the cold start before later steps."""
        cfg, b = self.config, batch_size
        if b > self.num_tasks:
            return f"the pool has only {self.num_tasks} eligible tasks < B = {b}"
        if b > self.cold_start:   # static only: a random cold start can draw any eligible task
            return (f"the cold start (step 0) takes at most {COLD_PER_ENV} tasks per environment: "
                    f"{self.cold_start} from {self._environments} < B = {b}")
        if b > self.per_batch:
            return (f"cap C1: at most {cfg.cap_step} tasks per environment per batch: "
                    f"{self.per_batch} from {self._environments} < B = {b}")
        if b <= self.later_steps:
            return None
        worst = (f"after the heaviest history the caps allow, a step has fewer than B = {b} "
                 "eligible picks")
        window = (f"at most C3 = {cfg.cap_window} selections of one environment over three "
                  "consecutive steps")
        consecutive = f"no task in more than Ctask = {cfg.cap_consecutive} consecutive steps"
        if b > self.window and b > self.consecutive:
            return f"cap C3 ({window}) and cap Ctask ({consecutive}), each on its own: {worst}"
        if b > self.window:
            return f"cap C3 ({window}): {worst}"
        if b > self.consecutive:
            return f"cap Ctask ({consecutive}): {worst}"
        return f"caps C3 ({window}) and Ctask ({consecutive}) together: {worst}"

    def explain(self, batch_size: int) -> str:
        """One message: the largest feasible B and, if ``batch_size`` exceeds it, the binding cap."""
        head = (f"the largest batch size EnvSched's caps can always fill on this pool is {self.largest} "
                f"({self._environments}, {self.num_tasks} eligible tasks; "
                f"C1={self.config.cap_step}, C3={self.config.cap_window}, "
                f"Ctask={self.config.cap_consecutive}, cold_start={self.config.cold_start!r})")
        why = self.binding_cap(batch_size)
        return head if why is None else f"batch_size {batch_size} is infeasible: {why}; {head}"


def eligible_tasks_per_environment(env_index: Sequence[int] | np.ndarray, num_envs: int,
                                   excluded: np.ndarray | None = None) -> np.ndarray:
    """[E] number of tasks of each environment that are not excluded."""
    env_index = np.asarray(env_index, np.int64)
    keep = np.ones(len(env_index), bool) if excluded is None else ~np.asarray(excluded, bool)
    return np.bincount(env_index[keep], minlength=num_envs)


def batch_feasibility(tasks_per_env: Sequence[int] | np.ndarray, config: EnvSchedConfig) -> Feasibility:
    """The largest batch size each phase can always fill (see the module docstring).

    Args:
        tasks_per_env: [E] eligible tasks of each environment.
        config: the caps (``cap_step``, ``cap_window``, ``cap_consecutive``) and ``cold_start``.

    >>> f = batch_feasibility([10, 10], EnvSchedConfig())   # two environments of ten tasks
    >>> f.cold_start, f.per_batch, f.window, f.later_steps, f.largest
    (4, 8, 7, 7, 4)
    """
    sizes = [int(n) for n in tasks_per_env if n > 0]
    num_tasks = sum(sizes)
    if config.cold_start == "static":
        cold = sum(min(COLD_PER_ENV, n) for n in sizes)
    else:
        cold = num_tasks
    per_batch = sum(min(config.cap_step, n) for n in sizes)
    bounds = {(w, c): _later_bound(sizes, config, window=w, consecutive=c)
              for w, c in ((True, False), (False, True), (True, True))}
    return Feasibility(num_environments=len(sizes), num_tasks=num_tasks, config=config,
                       cold_start=cold, per_batch=per_batch, window=bounds[True, False],
                       consecutive=bounds[False, True], later_steps=bounds[True, True])


def _later_bound(sizes: list[int], config: EnvSchedConfig, *, window: bool, consecutive: bool) -> int:
    """The largest B every step t >= 1 can fill after the worst history (cap (a) always, (b) if
    ``window``, (c) if ``consecutive``)."""
    a, c, k = config.cap_step, config.cap_window, config.cap_consecutive
    cap0 = [min(a, n, c) if window else min(a, n) for n in sizes]
    top = sum(min(a, n) for n in sizes)
    if top < 1:
        return 0
    total = sum(cap0)
    # Picks of the previous steps that matter at step t: two for the window, Ctask for blocking.
    span = max(2 if window else 1, k if consecutive else 1)
    budgets = {1: 1, 2: 2, 3: span}   # phase (step 1, step 2, steady) -> steps of picks spent
    removed = {}
    for phase, steps in budgets.items():
        options = Counter(_options(n, config, phase, window=window, consecutive=consecutive)
                          for n in sizes)
        removed[phase] = _max_removed(options, steps * top)
    best = 0
    for b in range(1, top + 1):
        if all(removed[phase][steps * b] <= total - b for phase, steps in budgets.items()):
            best = b
        else:
            break  # removed capacity grows with B and the need grows with B: monotone
    return best


def _options(n: int, config: EnvSchedConfig, phase: int, *, window: bool,
             consecutive: bool) -> tuple[tuple[int, int], ...]:
    """Pareto set of (picks spent, capacity removed) for one environment with ``n`` tasks before
    step 1 (``phase`` 1), step 2 (2) or a later step (3).

    x1 / x2: its picks at steps t-1 / t-2 (x2 at step 0 is the cold start's); ``blocked``: its
    tasks picked in each of the last Ctask steps (at most min over those steps; picks at t-3 ..
    t-Ctask cost ``blocked`` each)."""
    a, c, k = config.cap_step, config.cap_window, config.cap_consecutive
    static = config.cold_start == "static"
    cold_max = min(COLD_PER_ENV, n) if static else n        # step 0 ignores C1
    step_max = min(a, n)
    cap0 = min(a, n, c) if window else min(a, n)
    if phase == 1:                       # history: step 0 only
        histories = [(x0, 0) for x0 in range(cold_max + 1)]
    elif phase == 2:                     # steps 1 (x1) and 0 (x2)
        histories = list(itertools.product(range(step_max + 1), range(cold_max + 1)))
    else:
        histories = list(itertools.product(range(step_max + 1), repeat=2))
    best: dict[int, int] = {}
    for x1, x2 in histories:
        if window and phase >= 2 and x1 + x2 > c:   # step t-1 obeyed C3 itself
            continue
        choices = _blocked_choices(x1, x2, phase, config, window=window) if consecutive else [(0, 0)]
        for blocked, extra_cost in choices:
            cap = min(a, n - blocked)
            if window:
                cap = min(cap, max(0, c - x1 - x2))
            cost = x1 + x2 + extra_cost
            gain = cap0 - max(cap, 0)
            if gain > best.get(cost, -1):
                best[cost] = gain
    pareto, top = [], 0
    for cost in sorted(best):
        if best[cost] > top:
            top = best[cost]
            pareto.append((cost, top))
    return tuple(pareto)


def _blocked_choices(x1: int, x2: int, phase: int, config: EnvSchedConfig, *,
                     window: bool) -> list[tuple[int, int]]:
    """(tasks of the environment blocked by cap (c) at step t, picks this costs at steps t-3 ..
    t-Ctask) for picks x1 at t-1 and x2 at t-2."""
    k, c = config.cap_consecutive, config.cap_window
    if k == 1:
        return [(x1, 0)]                        # everything picked at t-1
    history = {1: 1, 2: 2, 3: k}[phase]         # steps before t; steady state has Ctask of them
    if history < k:
        return [(0, 0)]                         # no task can have run Ctask steps yet
    extra = k - 2                               # the same tasks at t-3 .. t-Ctask
    # Under C3 those picks also count at t-1: x1 + x2 + (picks at t-3) <= C3.
    return [(b, extra * b) for b in range(min(x1, x2) + 1) if not (window and extra and x1 + x2 + b > c)]


def _max_removed(options: Counter, budget: int) -> np.ndarray:
    """removed[p] = the most capacity ``p`` picks can remove over all environments, p = 0..budget
    (a max-plus knapsack; ``options`` maps each environment's Pareto set to how many have it)."""
    removed = np.zeros(budget + 1, np.int64)
    for pareto, count in options.items():
        for _ in range(count):
            new = removed.copy()
            for cost, gain in pareto:
                if cost == 0:
                    new += gain
                elif cost <= budget:
                    np.maximum(new[cost:], removed[:-cost] + gain, out=new[cost:])
            removed = new
    return removed


def explain_infeasible_pick(*, env_index: np.ndarray, excluded: np.ndarray, batch_before: np.ndarray,
                            window_counts: np.ndarray, run: np.ndarray, progress_excluded: np.ndarray,
                            coverage: bool, config: EnvSchedConfig) -> str:
    """Why no task is eligible for a pick: how many of the candidates each rule rules out.

    Args:
        env_index: [N] environment of each task.
        excluded: [N] bool, the identifier filter's exclusions.
        batch_before: node indices picked earlier in this batch.
        window_counts: [E] selections of each environment at steps t-1 and t-2.
        run: [N] consecutive steps up to t-1 in which each task was picked.
        progress_excluded: [N] bool, tasks the progress filter excludes from exploitation.
        coverage: whether the pick is a coverage pick (the progress filter does not apply).
    """
    env_index = np.asarray(env_index)
    free = ~np.asarray(excluded, bool)
    free[np.asarray(batch_before, np.int64)] = False
    count = np.bincount(env_index[np.asarray(batch_before, np.int64)],
                        minlength=len(window_counts))[env_index]
    rules = [(f"cap C1 ({config.cap_step} per environment per batch)", count >= config.cap_step),
             (f"cap C3 ({config.cap_window} per environment over three steps)",
              np.asarray(window_counts)[env_index] + count >= config.cap_window),
             (f"cap Ctask ({config.cap_consecutive} consecutive steps)",
              np.asarray(run) >= config.cap_consecutive)]
    if not coverage:
        rules.append(("the progress filter", np.asarray(progress_excluded, bool)))
    parts = [f"{name} rules out {int((free & mask).sum())}" for name, mask in rules if (free & mask).any()]
    return (f"of the {int(free.sum())} tasks neither in the batch nor excluded, "
            + (", ".join(parts) if parts else "none is ruled out")
            + " (a task can be ruled out by several)")
