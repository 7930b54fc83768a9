"""Envs-FORGE action selection: actions, priors, frontier, candidates, the MILP and its fallbacks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from envsched_jax.forge import milp
from envsched_jax.forge.actions import (ACTIONS, ARTIFACTS, TransferPriors, action, edit_mask, frontier_score,
                                        projected_pass_rate, recipe_mask)
from envsched_jax.forge.candidates import (ForgeConfig, ForgeInputError, SeedSpec, SkillGraph, build_candidates,
                                           candidate_skills)
from envsched_jax.forge.milp import ForgeInfeasibleError, evaluate, make_problem, select_actions
from envsched_jax.forge.passrate import estimate_pass_rates, predicted_mean_rewards, read_rollout_log

SKILLS = [f"k{i}" for i in range(10)]
GRAPH = SkillGraph(deeper={k: (SKILLS[(i + 1) % 10],) for i, k in enumerate(SKILLS)},
                   neighbours={k: (SKILLS[(i + 3) % 10], SKILLS[(i + 6) % 10]) for i, k in enumerate(SKILLS)})


def random_seeds(rng, n, *, split_prob=0.0):
    seeds = []
    for i in range(n):
        names = rng.permutation(SKILLS)
        r, o = int(rng.integers(0, 3)), int(rng.integers(0, 4))
        seeds.append(SeedSpec(f"s{i}", float(rng.integers(0, 16)) / 15, tuple(names[:r]), tuple(names[r:r + o]),
                              split="test" if rng.random() < split_prob else "train",
                              prompt_tokens=tuple(int(t) for t in rng.integers(0, 10_000, 6)),
                              overlap=tuple(bool(b) for b in rng.random(6) < 0.1)))
    return seeds


# ---------------------------------------------------------------------------------------------
# Actions, priors, frontier


def test_frontier_score_reproduces_the_papers_case_v():
    assert round(frontier_score(8 / 15), 4) == 0.9862
    p = np.linspace(0, 1, 11)
    np.testing.assert_allclose(frontier_score(p), np.exp(-(p - 0.5) ** 2 / (2 * 0.2 ** 2)), rtol=0, atol=1e-15)
    assert frontier_score(0.5) == 1.0


def test_transfer_priors_reproduce_cases_ii_and_v_and_follow_their_formulas():
    assert projected_pass_rate(1.0, action("increase_complexity/in_depth")) == 0.75          # case II
    assert projected_pass_rate(8 / 15, action("diversify_frontier/in_breadth")) == 8 / 15    # case V
    p = np.linspace(0, 1, 7)
    priors = TransferPriors(increase_in_breadth=0.3, reduce_in_breadth=0.2, diversify_in_depth=0.4)
    ref = {"increase_complexity/in_depth": p * 0.75, "increase_complexity/in_breadth": p * 0.7,
           "reduce_complexity/in_depth": p + (1 - p) * 0.5, "reduce_complexity/in_breadth": p + (1 - p) * 0.2,
           "diversify_frontier/in_depth": p + (0.5 - p) * 0.4, "diversify_frontier/in_breadth": p}
    for act in ACTIONS:
        np.testing.assert_allclose(projected_pass_rate(p, act, priors), ref[act.name], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"pass rates must lie in \[0, 1\]"):
        projected_pass_rate(1.2, ACTIONS[0])
    with pytest.raises(ValueError, match="TransferPriors.reduce_in_depth must lie in"):
        TransferPriors(reduce_in_depth=1.5)
    with pytest.raises(ValueError, match="unknown action 'grow/in_depth'"):
        action("grow/in_depth")


def test_edit_masks_never_allow_instruction_only_edits():
    for act in ACTIONS:
        mask = edit_mask(act)
        assert list(mask) == list(ARTIFACTS)
        assert mask["instruction"] and mask["solution"] and mask["tests"], act
    assert edit_mask(action("reduce_complexity/in_depth"))["environment"]
    assert not edit_mask(action("diversify_frontier/in_depth"))["environment"]


def test_recipe_masks():
    names = [a.name for a in ACTIONS]
    assert recipe_mask("forge", 3).all()
    for recipe, expected in (("few_shot", "diversify_frontier/in_depth"),
                             ("self_instruct", "diversify_frontier/in_breadth"),
                             ("evol_instruct_depth", "increase_complexity/in_depth"),
                             ("evol_instruct_breadth", "increase_complexity/in_breadth")):
        mask = recipe_mask(recipe, 4)
        assert (mask.sum(axis=1) == 1).all() and {names[a] for a in np.flatnonzero(mask[0])} == {expected}
    evol = recipe_mask("evol_instruct", 5)
    assert [names[int(np.argmax(r))] for r in evol] == ["increase_complexity/in_depth",
                                                       "increase_complexity/in_breadth"] * 2 + [
        "increase_complexity/in_depth"]
    with pytest.raises(ValueError, match="unknown recipe 'wizard'"):
        recipe_mask("wizard", 2)


# ---------------------------------------------------------------------------------------------
# Candidates


def test_candidate_skill_subgraphs_follow_the_documented_rules():
    graph = SkillGraph(deeper={"parse": ("parse_nested",)}, neighbours={"parse": ("validate", "rank"),
                                                                       "count": ("parse",)})
    seed = SeedSpec("a", 0.5, required=("parse",), optional=("count", "sort"))
    got = dict(zip([a.name for a in ACTIONS], candidate_skills(seed, graph)))
    assert got == {
        "increase_complexity/in_depth": ("parse", "count", "sort", "parse_nested"),
        "increase_complexity/in_breadth": ("parse", "count", "sort", "validate"),
        "reduce_complexity/in_depth": ("parse",),
        "reduce_complexity/in_breadth": ("parse",),
        "diversify_frontier/in_depth": ("parse", "count", "sort"),
        "diversify_frontier/in_breadth": ("parse", "count", "validate"),
    }
    bare = dict(zip([a.name for a in ACTIONS], candidate_skills(SeedSpec("b", 0.1, ("x",)), SkillGraph())))
    assert set(bare.values()) == {("x",)}

    cands = build_candidates([seed], graph)
    assert cands.skills == ("count", "parse", "parse_nested", "sort", "validate")   # "rank" is in no candidate
    a = [x.name for x in ACTIONS].index("diversify_frontier/in_breadth")
    kept, added, removed = cands.preserved_added_removed(0, a)
    assert ([cands.skills[i] for i in kept], [cands.skills[i] for i in added],
            [cands.skills[i] for i in removed]) == (["count", "parse"], ["validate"], ["sort"])
    sizes = np.array([4, 4, 1, 1, 3, 3])
    np.testing.assert_allclose(cands.compactness[0], 1 - sizes / 4)


def test_eligibility_constants_and_their_reasons():
    seeds = [SeedSpec("held", 0.5, split="test"),
             SeedSpec("long", 0.5, prompt_tokens=(100, 9000, 100, 100, 100, 100)),
             SeedSpec("dup", 0.5, overlap=(False, False, False, False, True, False))]
    cands = build_candidates(seeds, config=ForgeConfig(max_prompt_tokens=8192))
    assert not cands.eligible[0].any() and "split 'test'" in cands.why_ineligible[0][0]
    assert cands.eligible[1].tolist() == [True, False, True, True, True, True]
    assert "9000 tokens exceeds max_prompt_tokens 8192" in cands.why_ineligible[1][1]
    assert cands.why_ineligible[2][4] == "overlaps an existing bundle"
    few = build_candidates(seeds[1:], recipe="few_shot")
    assert few.eligible.sum() == 1 and "recipe 'few_shot' excludes it" in few.why_ineligible[0][0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(pass_rate=1.5), r"seed 'x': pass_rate must be a number in \[0, 1\], got 1.5"),
    (dict(pass_rate=0.5, required=("a",), optional=("a",)), r"\['a'\] are both required and optional"),
    (dict(pass_rate=0.5, optional=("a", "a")), "optional lists a skill twice"),
    (dict(pass_rate=0.5, required="abc"), "required must be a sequence of skill names"),
    (dict(pass_rate=0.5, prompt_tokens=(1, 2)), "prompt_tokens must be one int or 6"),
    (dict(pass_rate=0.5, prompt_tokens=-1), "prompt_tokens must be >= 0"),
])
def test_bad_seeds_are_named(kwargs, message):
    with pytest.raises(ForgeInputError, match=message):
        SeedSpec("x", **kwargs)


def test_bad_candidate_sets_and_configs():
    with pytest.raises(ForgeInputError, match=r"seed id\(s\) \['a'\] appear more than once"):
        build_candidates([SeedSpec("a", 0.1), SeedSpec("a", 0.2)])
    with pytest.raises(ForgeInputError, match="no seeds"):
        build_candidates([])
    with pytest.raises(ForgeInputError, match="ForgeConfig.slack_cap must lie in"):
        ForgeConfig(slack_cap=2.0)
    with pytest.raises(ForgeInputError, match=r"SkillGraph.deeper\['a'\] lists the skill itself"):
        SkillGraph(deeper={"a": ("a",)})
    cands = build_candidates([SeedSpec("a", 0.1, ("x",))])
    with pytest.raises(ForgeInputError, match="coverage_targets and num_exports need mode='portfolio'"):
        select_actions(cands, coverage_targets={"x": 0.5})
    with pytest.raises(ForgeInputError, match="skill 'nope' is not a skill"):
        select_actions(cands, mode="portfolio", coverage_targets={"nope": 0.5})
    with pytest.raises(ForgeInputError, match=r"num_exports must be an int in \[1, 1\]"):
        select_actions(cands, mode="portfolio", num_exports=2)


# ---------------------------------------------------------------------------------------------
# The MILP against enumeration


def test_per_seed_scip_is_optimal_and_enumeration_reaches_the_same_objective():
    rng = np.random.default_rng(0)
    config = ForgeConfig(max_prompt_tokens=10**6)
    for _ in range(12):
        seeds = [dataclasses_replace_overlap(s) for s in random_seeds(rng, int(rng.integers(1, 60)))]
        cands = build_candidates(seeds, GRAPH, config=config)
        scip = select_actions(cands, config, backend="scip")
        enum = select_actions(cands, config, backend="enumeration")
        assert (scip.backend, scip.status, enum.backend) == ("scip", "optimal", "enumeration")
        assert scip.objective == pytest.approx(enum.objective, abs=1e-9)
        assert scip.scip_objective == pytest.approx(scip.objective, abs=1e-6)
        assert (scip.choice >= 0).all()


def dataclasses_replace_overlap(seed: SeedSpec) -> SeedSpec:
    """The seed without overlap flags, so every seed keeps at least one eligible action."""
    import dataclasses

    return dataclasses.replace(seed, overlap=False)


def test_the_papers_recorded_run_shape_100_seeds_600_action_variables_optimal():
    rng = np.random.default_rng(7)
    seeds = [SeedSpec(f"s{i}", float(rng.integers(0, 16)) / 15, ("k0",), ("k1", "k2")) for i in range(100)]
    result = select_actions(build_candidates(seeds, GRAPH))
    assert (result.backend, result.status, result.num_action_variables) == ("scip", "optimal", 600)
    # the best action per seed follows the frontier: saturated seeds are hardened, unsolved ones reduced
    names = [ACTIONS[a].name for a in result.choice]
    rates = np.array([s.pass_rate for s in seeds])
    assert all(n.startswith("increase") for n, p in zip(names, rates) if p == 1.0)
    assert all(n.startswith("reduce") for n, p in zip(names, rates) if p == 0.0)


def test_portfolio_scip_matches_enumeration_on_random_small_instances():
    rng = np.random.default_rng(1)
    checked = 0
    for trial in range(40):
        seeds = [dataclasses_replace_overlap(s) for s in random_seeds(rng, 4)]
        config = ForgeConfig(max_prompt_tokens=int(rng.integers(3000, 10_000)), optional_target=float(rng.choice([0.1, 0.2])))
        cands = build_candidates(seeds, GRAPH, config=config)
        if cands.eligible.sum() > milp.ENUMERATION_MAX_CANDIDATES:
            continue
        skills = list(cands.skills)
        targets = {k: float(rng.uniform(0.1, 0.6)) for k in rng.choice(skills, size=min(3, len(skills)), replace=False)}
        exports = int(rng.integers(1, 5))
        kwargs = dict(mode="portfolio", coverage_targets=targets, num_exports=exports)
        try:
            enum = select_actions(cands, config, backend="enumeration", **kwargs)
        except ForgeInfeasibleError:
            with pytest.raises(ForgeInfeasibleError):
                select_actions(cands, config, backend="scip", **kwargs)
            continue
        scip = select_actions(cands, config, backend="scip", **kwargs)
        assert scip.status == "optimal"
        assert scip.objective == pytest.approx(enum.objective, abs=1e-7)
        assert scip.scip_objective == pytest.approx(scip.objective, abs=1e-6)
        assert int((scip.choice >= 0).sum()) == exports
        greedy = select_actions(cands, config, backend="greedy", **kwargs)
        assert greedy.objective <= scip.objective + 1e-9
        checked += 1
    assert checked >= 15


def test_greedy_is_feasible_and_close_on_a_large_portfolio():
    rng = np.random.default_rng(3)
    config = ForgeConfig(max_prompt_tokens=10**6)
    cands = build_candidates([dataclasses_replace_overlap(s) for s in random_seeds(rng, 300)], GRAPH, config=config)
    kwargs = dict(mode="portfolio", coverage_targets={"k1": 0.5, "k4": 0.45, "k7": 0.5})
    scip = select_actions(cands, config, **kwargs)
    greedy = select_actions(cands, config, backend="greedy", **kwargs)
    assert scip.status == "optimal" and greedy.status == "heuristic"
    assert all(z <= config.slack_cap + 1e-9 for z in greedy.coverage_slack.values())
    assert scip.objective - 0.01 * abs(scip.objective) <= greedy.objective <= scip.objective + 1e-9
    # the targets bind: without them the frontier-only choice is better and leaves more slack
    free = select_actions(cands, config, mode="portfolio")
    assert free.objective > scip.objective


# ---------------------------------------------------------------------------------------------
# Fallbacks and infeasibility


def test_fallback_without_scip_and_on_a_non_optimal_status(monkeypatch):
    rng = np.random.default_rng(5)
    config = ForgeConfig(max_prompt_tokens=10**6)
    cands = build_candidates([dataclasses_replace_overlap(s) for s in random_seeds(rng, 30)], GRAPH, config=config)
    reference = select_actions(cands, config)
    monkeypatch.setattr(milp, "_scip_available", lambda: False)
    missing = select_actions(cands, config)
    assert (missing.backend, missing.fallback_reason) == ("enumeration", "PySCIPOpt is not installed")
    assert missing.objective == pytest.approx(reference.objective, abs=1e-9)
    with pytest.raises(ForgeInputError, match="backend='scip' needs PySCIPOpt"):
        select_actions(cands, config, backend="scip")
    big = select_actions(cands, config, mode="portfolio", coverage_targets={"k1": 0.5})
    assert big.backend == "greedy" and big.fallback_reason == "PySCIPOpt is not installed"
    monkeypatch.setattr(milp, "_scip_available", lambda: True)
    monkeypatch.setattr(milp, "solve_scip", lambda problem, limit: ("timelimit", None, None, 10, 5))
    timed = select_actions(cands, config, backend="scip")
    assert (timed.backend, timed.scip_status) == ("enumeration", "timelimit")
    assert timed.fallback_reason == "SCIP status 'timelimit' is not optimal"


def test_a_real_scip_time_limit_falls_back():
    rng = np.random.default_rng(11)
    config = ForgeConfig(max_prompt_tokens=10**6)
    cands = build_candidates([dataclasses_replace_overlap(s) for s in random_seeds(rng, 2000)], GRAPH, config=config)
    result = select_actions(cands, config, mode="portfolio", coverage_targets={"k2": 0.5}, time_limit_s=1e-3)
    assert result.scip_status != "optimal" and result.backend == "greedy"


def test_infeasible_instances_name_their_cause():
    with pytest.raises(ForgeInfeasibleError, match=r"seed 'held' \(increase_complexity/in_depth: split 'test'"):
        select_actions(build_candidates([SeedSpec("ok", 0.5), SeedSpec("held", 0.5, split="test")]))
    forbidding = ForgeConfig(forbidden_skills=("net",))
    with pytest.raises(ForgeInfeasibleError, match=r"uses forbidden skill\(s\) \['net'\]"):
        select_actions(build_candidates([SeedSpec("web", 0.5, required=("net",))], config=forbidding), forbidding)
    strict = ForgeConfig(optional_target=0.5, slack_cap=0.2)
    only_reduce = build_candidates([SeedSpec("r", 0.0, ("a",), ("b",))], config=strict, recipe="few_shot")
    assert select_actions(only_reduce, strict).choice.tolist() == [4]
    reduce_only = build_candidates([SeedSpec("r", 0.0, ("a",), ("b",))], config=strict)
    reduce_only.eligible[:] = False
    reduce_only.eligible[0, 2] = True
    with pytest.raises(ForgeInfeasibleError, match=r"drops optional skill\(s\) \['b'\] while optional_target 0.5"):
        select_actions(reduce_only, strict)
    cands = build_candidates([SeedSpec(f"s{i}", 0.5, ("a",)) for i in range(4)] + [SeedSpec("x", 0.5, ("z",))])
    with pytest.raises(ForgeInfeasibleError, match=r"coverage target of skill 'z' \(0.900 of exports\) is out of reach"):
        select_actions(cands, mode="portfolio", coverage_targets={"z": 0.9})


def test_forbidden_skills_are_linked_to_the_chosen_action():
    graph = SkillGraph(neighbours={"a": ("net",)})
    config = ForgeConfig(forbidden_skills=("net",))
    # at p = 1 increase/in_breadth (0.85) would lose to in_depth anyway; at p = 0.6 in_breadth's
    # 0.51 is the frontier's best, but it adds the forbidden neighbour
    seed = SeedSpec("s", 0.6, ("a",))
    free = select_actions(build_candidates([seed], graph))
    banned = select_actions(build_candidates([seed], graph, config=config), config)
    assert ACTIONS[free.choice[0]].name == "increase_complexity/in_breadth"
    assert ACTIONS[banned.choice[0]].name not in ("increase_complexity/in_breadth", "diversify_frontier/in_breadth")


def test_decisions_are_auditable_json():
    graph = SkillGraph(neighbours={"parse": ("validate",)})
    cands = build_candidates([SeedSpec("a", 8 / 15, ("parse",), ("count",)), SeedSpec("b", 1.0, ("parse",))], graph)
    result = select_actions(cands)
    problem = make_problem(cands)
    report = json.loads(result.to_json(problem))
    assert report["skills"] == list(cands.skills) and report["status"] == "optimal"
    a, b = report["decisions"]
    assert a["action"].startswith("diversify_frontier") and a["frontier_score"] == pytest.approx(0.98621, abs=1e-5)
    assert b["action"] == "increase_complexity/in_depth" and b["projected_pass_rate"] == 0.75
    for d in report["decisions"]:
        for i in d["skills_preserved"] + d["skills_added"] + d["skills_removed"]:
            assert d["skill_names"][str(i)] == cands.skills[i]
    objective, ok, _ = evaluate(problem, result.choice)
    assert ok and objective == pytest.approx(report["objective"])


# ---------------------------------------------------------------------------------------------
# Pass rates


def test_pass_rates_with_jeffreys_intervals(tmp_path):
    log = tmp_path / "rollouts.jsonl"
    records = [("a", 1.0)] * 8 + [("a", 0.0)] * 6 + [("a", 0.5)] + [("b", 0.0)] * 4 + [("other", 1.0)]
    log.write_text("".join(json.dumps({"task_id": t, "reward": r, "extra": 1}) + "\n" for t, r in records) + "\n")
    rates = estimate_pass_rates(read_rollout_log(log), ["a", "b", "c"], predicted={"c": 0.25, "a": 0.0})
    a, b, c = rates["a"], rates["b"], rates["c"]
    assert (a.passes, a.rollouts, a.rate, a.source) == (8, 15, 8 / 15, "rollouts")
    low, high = stats.beta.ppf([0.025, 0.975], 8.5, 7.5)
    assert (a.low, a.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert (b.rate, b.low) == (0.0, 0.0) and b.high == pytest.approx(stats.beta.ppf(0.975, 0.5, 4.5))
    assert (c.rate, c.source, c.low) == (0.25, "predicted", None)
    with pytest.raises(ForgeInputError, match=r"seed\(s\) have fewer than 1 rollouts and no predicted reward: \['c'\]"):
        estimate_pass_rates(records, ["a", "c"])


@pytest.mark.parametrize("line, message", [
    ("{not json", r"rollouts.jsonl:2: not JSON"),
    ('{"task_id": "a"}', r"rollouts.jsonl:2: missing field 'reward'"),
    ('{"task_id": "a", "reward": 1.5}', r"rollouts.jsonl:2: field 'reward' must be a finite number in \[0, 1\], got 1.5"),
    ('{"task_id": "a", "reward": NaN}', r"rollouts.jsonl:2: field 'reward' must be a finite number"),
    ('{"task_id": 3, "reward": 1}', r"rollouts.jsonl:2: field 'task_id' must be a string"),
    ('[1, 2]', r"rollouts.jsonl:2: a record must be a JSON object"),
])
def test_bad_rollout_logs_are_named(tmp_path, line, message):
    log = tmp_path / "rollouts.jsonl"
    log.write_text('{"task_id": "a", "reward": 1}\n' + line + "\n")
    with pytest.raises(ForgeInputError, match=message):
        read_rollout_log(log)


def test_predicted_mean_rewards_from_envsched():
    from envsched_jax.graph.build import build_graph
    from envsched_jax.pool.sources import load_pool
    from envsched_jax.sched import make_scheduler

    graph = build_graph(load_pool("embedded"))
    sched = make_scheduler("envsched", graph, batch_size=16, group_size=4)
    with pytest.raises(ForgeInputError, match="observed nothing yet"):
        predicted_mean_rewards(sched)
    ids = sched.select(0)
    rewards = np.zeros((16, 4), np.float32)
    rewards[:8] = 1.0
    sched.observe(0, ids, rewards)
    mean = predicted_mean_rewards(sched)
    assert set(mean) == set(graph.task_ids)
    assert all(0.0 <= v <= 1.0 for v in mean.values())
    solved, failed = [mean[t] for t in ids[:8]], [mean[t] for t in ids[8:]]
    assert min(solved) > max(failed)       # observed nodes are pulled towards their own history
    rates = estimate_pass_rates([], list(graph.task_ids[:3]), predicted=mean)
    assert all(r.source == "predicted" for r in rates.values())
