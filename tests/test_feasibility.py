"""The largest batch size EnvSched's caps can always fill (sched/feasibility.py): hand-worked
values, an exhaustive search over every history on small pools, the constructor's up-front check
on a two-environment pool and on the embedded pool, and relax mode's one log line per step."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from envsched_jax.sched import EnvSchedConfig, InfeasibleBatchError, make_scheduler
from envsched_jax.sched.feasibility import batch_feasibility, eligible_tasks_per_environment, explain_infeasible_pick

from sched_helpers import random_graph, reward_groups

K = 4


def _run(sched, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for t in range(steps):
        ids = sched.select(t)
        sched.observe(t, ids, reward_groups(rng, len(ids), K))


# -- hand-worked values ------------------------------------------------------------------------

def test_two_environments_fit_a_batch_of_four():
    """Two environments of ten tasks, the paper's caps (C1 = 4, C3 = 11, Ctask = 2):

    - step 0: the cold start takes at most 2 tasks per environment: 2 x 2 = 4;
    - any later step: at most C1 = 4 per environment: 4 x 2 = 8;
    - but if the rewards make the greedy pick 4 tasks of one environment two steps running, C3 = 11
      leaves that environment 3: 4 + 3 = 7 is all a step can be sure of (cap Ctask never binds:
      at most 4 of a environment's 10 tasks were picked in both of the last two steps).

    So B = 4 (the cold start binds), and B = 7 once the cold start is not the paper's."""
    f = batch_feasibility([10, 10], EnvSchedConfig())
    assert (f.cold_start, f.per_batch, f.window, f.consecutive, f.later_steps, f.largest) == (4, 8, 7, 8, 7, 4)
    assert f.binding_cap(4) is None
    assert f.binding_cap(5) == ("the cold start (step 0) takes at most 2 tasks per environment: "
                                "4 from 2 environments < B = 5")
    # A random step 0 may draw all of its B tasks from one environment: with B = 6, 6 + 4 of
    # one environment at steps 0 and 1 leave it 1 at step 2, and 1 + 4 < 6.
    rand = batch_feasibility([10, 10], EnvSchedConfig(cold_start="random"))
    assert (rand.cold_start, rand.later_steps, rand.largest) == (20, 5, 5)
    assert rand.binding_cap(16) == ("cap C1: at most 4 tasks per environment per batch: "
                                    "8 from 2 environments < B = 16")
    assert rand.binding_cap(6).startswith("cap C3 (at most C3 = 11 selections of one environment over "
                                          "three consecutive steps): after the heaviest history")


def test_small_environments_are_bound_by_the_consecutive_cap():
    """Two environments of 5 tasks (random step 0, so the cold start does not bind): picking the
    same 4 tasks of one environment at steps t-2 and t-1 leaves it 1 eligible task at t
    (Ctask = 2), and the other gives at most 4: B = 5. C3 alone would allow 6."""
    f = batch_feasibility([5, 5], EnvSchedConfig(cold_start="random"))
    assert (f.window, f.consecutive, f.largest) == (6, 5, 5)
    assert f.binding_cap(6).startswith("cap Ctask (no task in more than Ctask = 2 consecutive steps)")


def test_excluded_tasks_do_not_count():
    env_index = np.repeat([0, 1], 10)
    excluded = np.zeros(20, bool)
    excluded[:9] = True                          # environment 0 keeps one task
    sizes = eligible_tasks_per_environment(env_index, 2, excluded)
    assert sizes.tolist() == [1, 10]
    assert batch_feasibility(sizes, EnvSchedConfig()).cold_start == 1 + 2


# -- exhaustive search over every history on small pools ---------------------------------------

def _moves(n: int, caps: tuple[int, int, int], state):
    """Every (picks, next state) of one environment. State: picks at t-1, t-2 and how many of
    its tasks have run 1 .. Ctask (picked in the last 1 .. Ctask steps)."""
    a, c, k = caps
    x1, x2, runs = state
    eligible = [n - sum(runs)] + list(runs[:k - 1])      # run 0 .. Ctask-1 may be picked
    for take in itertools.product(*(range(m + 1) for m in eligible)):
        y = sum(take)
        if y <= min(a, c - x1 - x2):
            yield y, (y, x1, take)


def _always_fillable(sizes, batch, caps, cold) -> bool:
    """Whether no sequence of choices the caps allow ever leaves a step without ``batch`` picks."""
    a, c, k = caps
    first = [min(2, n) if cold == "static" else n for n in sizes]
    starts = [tuple((x, 0, (x,) + (0,) * (k - 1)) for x in x0)
              for x0 in itertools.product(*(range(m + 1) for m in first)) if sum(x0) == batch]
    seen, todo = set(starts), list(starts)
    if not starts:
        return False
    while todo:
        moves = [list(_moves(n, caps, s)) for n, s in zip(sizes, todo.pop())]
        if sum(max(y for y, _ in m) for m in moves) < batch:
            return False
        for combo in itertools.product(*moves):
            if sum(y for y, _ in combo) == batch:
                nxt = tuple(s for _, s in combo)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    return True


def _exhaustive_largest(sizes, caps, cold) -> int:
    largest = 0
    while _always_fillable(sizes, largest + 1, caps, cold):
        largest += 1
    return largest


SMALL_POOLS = [(1, 1), (2, 2), (3, 3), (5, 5), (1, 6), (2, 5), (4, 7), (6,), (9,), (2, 2, 2), (1, 3, 5)]


@pytest.mark.parametrize("caps", [(4, 11, 2), (2, 5, 2), (2, 3, 2)])
@pytest.mark.parametrize("cold", ["static", "random"])
def test_bound_is_exact_with_ctask_two(caps, cold):
    """With Ctask = 2 (the paper's) the bound equals the exhaustive search's answer."""
    for sizes in SMALL_POOLS:
        config = EnvSchedConfig(cap_step=caps[0], cap_window=caps[1], cap_consecutive=caps[2], cold_start=cold)
        assert batch_feasibility(sizes, config).largest == _exhaustive_largest(sizes, caps, cold), sizes


@pytest.mark.parametrize("caps", [(3, 5, 1), (4, 6, 3)])
def test_bound_is_safe_with_other_ctask(caps):
    """For other Ctask the bound spends the picks of the last Ctask steps as one budget, which
    can only overstate the worst history: it may be below the true largest B, never above."""
    below = 0
    for sizes in SMALL_POOLS[:7]:
        config = EnvSchedConfig(cap_step=caps[0], cap_window=caps[1], cap_consecutive=caps[2])
        bound, exact = batch_feasibility(sizes, config).largest, _exhaustive_largest(sizes, caps, "static")
        assert bound <= exact, sizes
        below += bound < exact
    assert below > 0   # documents that it is not exact here


# -- the constructor's check -------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_env_graph():
    return random_graph(np.random.default_rng(2), num_envs=2, per_env=10, dtype=np.float32)


def test_make_scheduler_states_the_largest_batch_size(two_env_graph):
    sched = make_scheduler("envsched", two_env_graph, batch_size=4, group_size=K)
    assert sched.feasibility.largest == 4
    _run(sched, 40)   # never infeasible, whatever the rewards
    with pytest.raises(InfeasibleBatchError) as info:
        make_scheduler("envsched", two_env_graph, batch_size=5, group_size=K)
    assert str(info.value) == (
        "batch_size 5 is infeasible: the cold start (step 0) takes at most 2 tasks per environment: "
        "4 from 2 environments < B = 5; the largest batch size EnvSched's caps can always fill on this "
        "pool is 4 (2 environments, 20 eligible tasks; C1=4, C3=11, Ctask=2, cold_start='static'). "
        "Use batch_size <= 4 or infeasible='relax'")
    with pytest.raises(InfeasibleBatchError, match="cap C1: at most 4 tasks per environment per batch: "
                                                   "8 from 2 environments < B = 16"):
        make_scheduler("envsched", two_env_graph, config=EnvSchedConfig(batch_size=16, cold_start="random"))
    # The bound covers the caps, not the data-dependent progress filter (docs/guides/scheduling.md): on these i.i.d.
    # rewards the paper's earlier-steps filter rules out 15 of 16 candidates at step 21, so the
    # filter is kept out of this run (a node would need 10,000 scored transitions).
    random_start = make_scheduler("envsched", two_env_graph,
                                  config=EnvSchedConfig(batch_size=5, group_size=K, cold_start="random",
                                                        progress_min_transitions=10_000))
    _run(random_start, 40)


def test_relax_constructs_and_logs_one_line_per_step(two_env_graph, caplog):
    caplog.set_level(logging.INFO, logger="envsched_jax.sched.envsched")
    sched = make_scheduler("envsched", two_env_graph, batch_size=8, group_size=K, infeasible="relax")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "batch_size 8 is infeasible" in warnings[0].getMessage()
    caplog.clear()
    steps = 8
    _run(sched, steps)
    lines = [r.getMessage() for r in caplog.records]
    relaxed = [m for m in sched.metrics() if m.relaxations]
    assert relaxed and len(lines) == len(relaxed) <= steps         # one line per step, at most
    for metric, line in zip(relaxed, lines):
        total = sum(metric.relaxations.values())
        assert line.startswith(f"EnvSched step {metric.step}: relaxed {total} of 8 picks (")
        assert all(f"{name} x{count}" in line for name, count in metric.relaxations.items())
    assert sched.metrics()[0].relaxations == {"cold_two_per_env": 4}   # C1 = 4 lets step 0 fill


def test_too_few_tasks_fail_even_with_relax(two_env_graph):
    excluded = list(two_env_graph.task_ids[:15])
    # Environment 0 loses all ten tasks, environment 1 keeps five: relaxing caps cannot help.
    with pytest.raises(InfeasibleBatchError, match=r"only 5 eligible tasks < B = 8.*\(1 environment, 5 eligible "
                                                   r"tasks.*Use batch_size <= 2$"):
        make_scheduler("envsched", two_env_graph, batch_size=8, group_size=K, infeasible="relax",
                       excluded=excluded)


def test_embedded_pool():
    """Eight environments of 24 tasks: the cold start's 2 x 8 = 16 binds; later steps alone would
    allow 26 (32 - 6: six environments picked 4 + 4 in two steps have 3 left each)."""
    from envsched_jax.graph.build import build_graph
    from envsched_jax.pool import load_pool

    graph = build_graph(load_pool("embedded"))
    sched = make_scheduler("envsched", graph, batch_size=16, group_size=K)
    f = sched.feasibility
    assert (f.num_environments, f.cold_start, f.per_batch, f.later_steps, f.largest) == (8, 16, 32, 26, 16)
    _run(sched, 6)
    with pytest.raises(InfeasibleBatchError, match="16 from 8 environments < B = 17"):
        make_scheduler("envsched", graph, batch_size=17, group_size=K)
    with pytest.raises(InfeasibleBatchError, match=r"cap C3 .*fewer than B = 21 .* is 20 \("):
        make_scheduler("envsched", graph, config=EnvSchedConfig(batch_size=21, cold_start="random"))


def test_explain_infeasible_pick_counts_each_rule():
    config = EnvSchedConfig(cap_step=2, cap_window=3, cap_consecutive=1)
    env_index = np.array([0, 0, 0, 1, 1, 1])
    text = explain_infeasible_pick(
        env_index=env_index, excluded=np.array([0, 0, 0, 0, 0, 1], bool), batch_before=np.array([0, 1]),
        window_counts=np.array([0, 2]), run=np.array([0, 0, 0, 1, 0, 0]),
        progress_excluded=np.array([0, 0, 0, 0, 1, 0], bool), coverage=False, config=config)
    # Candidates: tasks 2 (environment 0), 3 and 4 (environment 1); 0 and 1 are in the batch, 5
    # is excluded. C1 = 2 rules out task 2 (environment 0 has 2 in the batch); C3 = 3 rules out
    # nothing (environment 1: 2 in the window + 0 in the batch < 3); Ctask = 1 rules out task 3
    # (picked at t-1); the progress filter (an exploitation pick) rules out task 4.
    assert text == ("of the 3 tasks neither in the batch nor excluded, cap C1 (2 per environment per batch) "
                    "rules out 1, cap Ctask (1 consecutive steps) rules out 1, the progress filter rules out 1 "
                    "(a task can be ruled out by several)")
