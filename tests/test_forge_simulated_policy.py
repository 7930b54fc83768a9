"""The simulated skill-competence policy: its pass probability by hand, its rollouts' frequencies,
independent per-bundle streams, and the rollout log the pass-rate estimator reads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from envsched_jax.forge import families
from envsched_jax.forge.passrate import estimate_pass_rates, read_rollout_log
from envsched_jax.forge.simulated_policy import SkillCompetencePolicy, write_rollout_log


def test_pass_probability_is_the_product_of_competences_times_the_knob_factor():
    params = families.LogsParams(variant=3, depth=2, extras=("logs.hosts",), size=80)
    policy = SkillCompetencePolicy.draw(4)
    family = families.FAMILIES["logs"]
    skills = [families.REQUIREMENTS[r].skill for r in families.describe_requirements(params)]
    steps = sum(k.values.index(getattr(params, k.name)) for k in family.knobs)
    want = math.prod(policy.competence[s] for s in skills) * 0.95 ** steps
    assert steps > 0 and len(skills) == 3
    assert policy.pass_probability(params) == pytest.approx(want, rel=1e-12)


def test_competences_are_uniform_on_the_range_and_cover_every_family_skill():
    policy = SkillCompetencePolicy.draw(0)
    values = np.array(list(policy.competence.values()))
    assert values.min() >= 0.5 and values.max() <= 1.0
    for family in families.FAMILIES.values():
        assert {r.skill for r in family.requirements} <= set(policy.competence)
    assert SkillCompetencePolicy.draw(0) == policy and SkillCompetencePolicy.draw(1) != policy


def test_rollout_frequencies_match_the_probability_and_streams_are_per_bundle():
    policy = SkillCompetencePolicy.draw(2)
    bundles = [families.to_bundle(n, p) for n, p in families.builtin_seeds()[:3]]
    records = policy.rollouts(bundles, 400, seed=9)
    for bundle in bundles:
        wins = sum(r for t, r in records if t == bundle.name)
        p = policy.bundle_pass_probability(bundle)
        assert stats.binomtest(int(wins), 400, p).pvalue > 1e-4, (bundle.name, wins, p)
    alone = policy.rollouts(bundles[1:2], 400, seed=9)
    assert alone == [r for r in records if r[0] == bundles[1].name]


def test_the_written_log_is_what_the_estimator_reads(tmp_path):
    policy = SkillCompetencePolicy.draw(0)
    bundles = [families.to_bundle(n, p) for n, p in families.builtin_seeds()[:4]]
    records = policy.rollouts(bundles, 15, seed=0)
    path = write_rollout_log(records, tmp_path / "log.jsonl")
    assert read_rollout_log(path) == records
    rates = estimate_pass_rates(read_rollout_log(path), [b.name for b in bundles])
    assert all(r.rollouts == 15 and r.source == "rollouts" for r in rates.values())


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=r"competence\['x'\] must lie in \[0, 1\]"):
        SkillCompetencePolicy({"x": 1.5})
    with pytest.raises(ValueError, match="knob_penalty"):
        SkillCompetencePolicy({}, knob_penalty=1.0)
    with pytest.raises(ValueError, match="no competence for skill"):
        SkillCompetencePolicy({}).pass_probability(families.LogsParams())
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        SkillCompetencePolicy.draw(0).rollouts([], 0, 0)


def test_frontier_placement_counts_each_bundle_once_against_the_shared_band():
    from envsched_jax.forge.actions import FrontierConfig, frontier_band
    from envsched_jax.forge.simulated_policy import frontier_placement

    assert frontier_band() == pytest.approx((0.2, 0.8))
    assert frontier_band(FrontierConfig(center=0.9, width=0.2)) == pytest.approx((0.6, 1.0))
    policy = SkillCompetencePolicy.draw(0)
    bundles = [families.to_bundle(n, p) for n, p in families.builtin_seeds()]
    place = frontier_placement(bundles, policy, k=15, seed=0)
    true = np.array([r["true"] for r in place["rows"]])
    for view in ("true", "estimated"):
        s = place[view]
        assert s["in_band"] + s["below"] + s["above"] == pytest.approx(1.0)
    assert place["true"]["in_band"] == pytest.approx(np.mean((true >= 0.2) & (true <= 0.8)))
    assert place["true"]["frontier_score"] == pytest.approx(np.mean(np.exp(-((true - 0.5) ** 2) / 0.08)))
