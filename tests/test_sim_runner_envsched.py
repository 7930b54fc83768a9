"""EnvSched runs as one compiled program (``envsched_runs``: a lax.scan over steps vmapped over
settings x seeds) against the Python loop ``run_scheduler``: the same batches, phases and
rewards step for step; settings grouped by their static fields; testbed parameters batched;
an infeasible pick raised on the host after the program, naming setting, seed and step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envsched_jax.sched import EnvSchedConfig, SchedulingError
from envsched_jax.sim import runner
from envsched_jax.sim import testbed as tb
from envsched_jax.sim.runner import SetupConfig, envsched_runs, make_setup, run_scheduler

SMALL = SetupConfig(train_envs=6, heldout_envs=2, tasks_per_env=8)
BASE = EnvSchedConfig(batch_size=8, group_size=4)
STEPS = 10


@pytest.fixture(scope="module")
def setup():
    return make_setup(SMALL)


def _loop(setup, config, seed, steps=STEPS, params=tb.TestbedParams()):
    return run_scheduler(setup, "envsched", steps=steps, seed=seed, params=params, batch_size=config.batch_size,
                         group_size=config.group_size, scheduler_kwargs={"config": config})


def _assert_same_run(got, want):
    np.testing.assert_array_equal(got.batch, want.batch)
    np.testing.assert_array_equal(got.phases, want.phases)
    np.testing.assert_array_equal(got.realised_variance, want.realised_variance)
    np.testing.assert_array_equal(got.mean_reward, want.mean_reward)
    np.testing.assert_array_equal(got.environments, want.environments)
    np.testing.assert_array_equal(got.tools, want.tools)
    np.testing.assert_allclose(got.heldout, want.heldout, atol=1e-4)
    np.testing.assert_allclose(got.predicted_variance, want.predicted_variance, atol=1e-6)  # NaN at step 0 in both
    assert got.initial_heldout == pytest.approx(want.initial_heldout, abs=1e-5)


def test_one_program_selects_the_loops_batches(setup):
    configs = [BASE, dataclasses.replace(BASE, lambda_sim=0.3, eta=0.2, cap_step=3, calibration=(1, 1))]
    runs = envsched_runs(setup, configs, [0, 1], steps=STEPS)
    assert runs.programs == 1 and runs.batch.shape == (2, 2, STEPS, 8) and runs.rewards.shape == (2, 2, STEPS, 8, 4)
    for c, config in enumerate(configs):
        for s, seed in enumerate([0, 1]):
            _assert_same_run(runs.log(c, s), _loop(setup, config, seed))
    # the settings and the seeds did change the runs
    assert not np.array_equal(runs.batch[0, 0], runs.batch[1, 0])
    assert not np.array_equal(runs.batch[0, 0], runs.batch[0, 1])
    assert list(runs.log(0, 0).phases[0]) == ["cold"] * 8


def test_traced_changes_do_not_recompile_and_chunks_agree(setup):
    configs = [dataclasses.replace(BASE, lambda_sim=lam) for lam in (0.0, 0.1, 0.2)]
    whole = envsched_runs(setup, configs, [3], steps=4)
    before = dict(runner.TRACES)
    # other traced values, the same shapes: no new trace
    again = envsched_runs(setup, [dataclasses.replace(c, h_short=3.0) for c in configs], [3], steps=4)
    assert runner.TRACES == before
    # chunks of 2 runs (the last one padded): one more program shape, the same results
    chunked = envsched_runs(setup, configs, [3], steps=4, chunk=2)
    np.testing.assert_array_equal(chunked.batch, whole.batch)
    np.testing.assert_array_equal(chunked.rewards, whole.rewards)


def test_static_fields_are_grouped_or_refused(setup):
    configs = [BASE, dataclasses.replace(BASE, rho=0.25, cold_start="random")]
    with pytest.raises(ValueError, match=r"static field\(s\) \['rho', 'cold_start'\]"):
        envsched_runs(setup, configs, [0], steps=3, group_static=False)
    runs = envsched_runs(setup, configs, [0, 1], steps=6)
    assert runs.programs == 2
    for c, config in enumerate(configs):
        for s, seed in enumerate([0, 1]):
            _assert_same_run(runs.log(c, s), _loop(setup, config, seed, steps=6))
    assert (runs.phase[1, :, 1:] == 1).sum(axis=-1).max() == 2   # B_cov = floor(0.25 * 8)


def test_testbed_parameters_are_batched_too(setup):
    noisy = dataclasses.replace(tb.TestbedParams(), rollout_noise=0.8, lr_skill=0.3)
    runs = envsched_runs(setup, BASE, [2], steps=5, params=[tb.TestbedParams(), noisy])
    assert runs.programs == 1 and len(runs.configs) == 2
    _assert_same_run(runs.log(1, 0), _loop(setup, BASE, 2, steps=5, params=noisy))
    assert runs.initial_heldout[0] != runs.initial_heldout[1]
    with pytest.raises(ValueError, match="pairs configs with params"):
        envsched_runs(setup, [BASE, BASE], [0], steps=2, params=[noisy] * 3)


def test_an_infeasible_pick_is_raised_after_the_program(setup, monkeypatch):
    """EnvSched's constructor refuses these batch sizes up front; with that check bypassed the
    program runs into the infeasible pick, records it, and the host names setting, seed, step."""
    monkeypatch.setattr(runner, "_check_batch_size", lambda *a: None)
    # C3 = 2: after the cold start (6 representatives + 2) at most 4 tasks fit step 1
    tight = dataclasses.replace(BASE, cap_window=2)
    with pytest.raises(SchedulingError, match=r"setting 1 \(config fields changed from the defaults: .*'cap_window': 2.*"
                                              r"seed 7: step 1: no eligible task for pick 5 of 8 \(exploitation phase\)"):
        envsched_runs(setup, [BASE, tight], [7], steps=3)
    relaxed = envsched_runs(setup, dataclasses.replace(tight, infeasible="relax"), [7], steps=3)
    assert (relaxed.relaxed[0, 0, 1] > 0).sum() == 4
    # the cold start: 6 environments x 2 < B = 16
    with pytest.raises(SchedulingError, match=r"seed 7: cold start: only 12 of 16 slots can be filled"):
        envsched_runs(setup, dataclasses.replace(BASE, batch_size=16), [7], steps=2)


def test_the_constructors_checks_apply(setup):
    with pytest.raises(SchedulingError, match="batch_size 16 is infeasible"):
        envsched_runs(setup, dataclasses.replace(BASE, batch_size=16), [0], steps=2)


def test_vectorized_runs_are_valid_envsched_runs(setup):
    """vmap over the runs: the same equations, batched (not bit-identical to the loop: see
    envsched_runs). The cold start is exact integer-like work, so step 0 agrees; every batch is
    B distinct tasks with B_cov coverage picks, and the traced setting changes the runs."""
    configs = [BASE, dataclasses.replace(BASE, lambda_sim=0.3)]
    runs = envsched_runs(setup, configs, [0, 1], steps=6, vectorize=True)
    mapped = envsched_runs(setup, configs, [0, 1], steps=6)
    np.testing.assert_array_equal(runs.batch[:, :, 0], mapped.batch[:, :, 0])
    assert all(len(set(b.tolist())) == 8 for b in runs.batch.reshape(-1, 8))
    assert ((runs.phase[:, :, 1:] == 1).sum(-1) == 4).all() and ((runs.phase[:, :, 1:] == 2).sum(-1) == 4).all()
    assert not np.array_equal(runs.batch[0], runs.batch[1])
    np.testing.assert_allclose(runs.heldout, mapped.heldout, atol=1.0)   # the same scheduler, statistically


def test_sensitivity_script_runs_both_schedulers_in_one_program_each(setup, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import sensitivity

    rows = sensitivity.main(sensitivity.Args(params=("lr_skill",), seeds=(0, 1), steps=4, batch_size=8, group_size=4,
                                             setup=SMALL, out=tmp_path))
    assert [(r["parameter"], r["multiplier"]) for r in rows] == [("calibrated", 1.0), ("lr_skill", 0.5), ("lr_skill", 2.0)]
    assert (tmp_path / "sensitivity.csv").exists()
    # EnvSched's numbers are those of the loop
    params = dataclasses.replace(tb.TestbedParams(), lr_skill=0.3)
    logs = [_loop(setup, BASE, seed, steps=4, params=params) for seed in (0, 1)]
    assert rows[2]["envsched_variance"] == pytest.approx(np.mean([log.realised_variance.mean() for log in logs]), rel=1e-12)
    assert rows[2]["envsched_heldout"] == pytest.approx(np.mean([np.nanmax(log.heldout) for log in logs]), abs=1e-4)



def test_bench_sweep_script_small(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import bench_sweep

    result = bench_sweep.main(bench_sweep.Args(configs=2, seeds=2, steps=3, batch_size=8, group_size=4, setup=SMALL,
                                               out=tmp_path))
    assert result["runs"] == 4 and result["mapped_same_batch_runs"] == 4 and result["loop_runs"] == 4
    assert (tmp_path / "bench_sweep.json").exists()
