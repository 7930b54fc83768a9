"""Tiny runs of the experiment scripts table4.py, figure4.py and cost.py: each writes its CSV and
PNG into a temporary run folder."""

from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

import numpy as np

from envsched_jax.sched import EnvSchedConfig
from envsched_jax.sim.runner import SetupConfig, make_setup, run_scheduler

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
TINY = SetupConfig(train_envs=12, heldout_envs=2, tasks_per_env=8)


def _script(name: str):
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    return importlib.import_module(name)


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_table4_small(tmp_path):
    table4 = _script("table4")
    args = table4.Args(runs=3, steps=2, batch_size=16, setup=TINY, out=tmp_path)
    table4.main(args)
    runs = _read(tmp_path / "table4_runs.csv")
    assert list(runs[0]) == ["seed", "step", "batch_variance", "cumulative_variance", "hit_rate",
                             "exploit_picks", "coverage_hit_rate"]
    assert len(runs) == 3 * 3
    assert all(r["hit_rate"] == "nan" for r in runs if r["step"] == "0")     # the random initial batch
    summary = _read(tmp_path / "table4.csv")
    expected = {"panel", "metric", "group", "step", "mean", "ci_low", "ci_high", "p5", "p95", "paper_mean"}
    assert expected <= set(summary[0])
    assert {r["panel"] for r in summary} == {"a", "b"}
    assert (tmp_path / "table4.png").stat().st_size > 0


def test_table4_loop_matches_runner():
    """The script's own loop (which reads the testbed state) gives the runner's batches."""
    table4 = _script("table4")
    setup = make_setup(TINY)
    args = table4.Args(runs=1, steps=2, batch_size=16, setup=TINY)
    record = table4.run_one(setup, 5, args)
    log = run_scheduler(setup, "envsched", steps=3, seed=5, batch_size=16, eval_every=3,
                        scheduler_kwargs={"config": EnvSchedConfig(cold_start="random")})
    np.testing.assert_allclose(record.batch_variance, log.realised_variance.mean(axis=1), rtol=1e-12)


def test_figure4_small(tmp_path):
    figure4 = _script("figure4")
    figure4.main(figure4.Args(steps=4, seeds=(0, 1), batch_size=16, segments=2, setup=TINY, out=tmp_path))
    rows = _read(tmp_path / "figure4.csv")
    assert list(rows[0])[:8] == ["scheduler", "step", "variance_mean", "variance_min", "variance_max",
                                 "environments_mean", "environments_min", "environments_max"]
    assert {r["scheduler"] for r in rows} == {"random", "envsched"}
    assert len(rows) == 2 * 4
    assert (tmp_path / "figure4.png").stat().st_size > 0


def test_cost_small(tmp_path):
    """The smallest pool EnvSched's B = 64 cold start accepts (32 environments of 50 tasks)."""
    cost = _script("cost")
    cost.main(cost.Args(sizes=(cost.MIN_SIZE,), schedulers=("envsched",), history=2, timed_steps=2, out=tmp_path))
    (row,) = _read(tmp_path / "cost.csv")
    assert {"scheduler", "n", "step_ms", "state_mib", "neighbour_state_mib", "sparse_features_mib", "dense_mib",
            "candidates_mib", "paper_step_ms"} <= set(row)
    assert row["scheduler"] == "envsched" and int(row["n"]) == cost.MIN_SIZE
    assert float(row["step_ms"]) > 0 and float(row["state_mib"]) > float(row["neighbour_state_mib"]) > 0
    assert (tmp_path / "cost.png").stat().st_size > 0
