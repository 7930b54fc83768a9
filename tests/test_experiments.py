"""The paper-reproduction scripts run end to end on a tiny testbed and write their outputs."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from envsched_jax.sim.runner import SetupConfig  # noqa: E402

TINY = SetupConfig(train_envs=6, heldout_envs=2, tasks_per_env=10)
SMALL = dict(seeds=(0, 1), steps=6, batch_size=8, group_size=4, setup=TINY)


def _rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_table2_small(tmp_path):
    import table2

    stats = table2.main(table2.Args(**SMALL, out=tmp_path))
    assert set(stats) == {"random", "envsched"}
    rows = _rows(tmp_path / "table2.csv")
    assert {r["scheduler"] for r in rows} == {"random", "envsched"} and len(rows) == 2 * 2 + 2
    assert all(0 <= float(r["mean_variance"]) <= 0.25 for r in rows)
    assert len(_rows(tmp_path / "table2_steps.csv")) == 2 * 2 * 6
    assert (tmp_path / "table2.png").stat().st_size > 0
    # Coverage is EnvSched's own guarantee (not a testbed outcome): at least as many environments.
    assert stats["envsched"]["environments"] >= stats["random"]["environments"]


def test_table3_small(tmp_path):
    import table3

    means = table3.main(table3.Args(**SMALL, configs=("random", "full", "coverage_only", "within_only"), out=tmp_path))
    assert set(means) == {"random", "full", "coverage_only", "within_only"}
    # rho = 1 spreads the whole batch: with 6 environments and B = 8 every environment appears.
    assert means["coverage_only"]["environments"] == pytest.approx(6.0)
    assert (tmp_path / "table3.png").exists() and len(_rows(tmp_path / "table3.csv")) == 4 * 3


def test_headline_small(tmp_path):
    import headline

    reach = headline.main(headline.Args(**SMALL, schedulers=("random", "envsched", "dps"), out=tmp_path))
    # Random reaches its own best by definition, at the step where it attains it.
    assert all(r is not None for r in reach["random"])
    rows = _rows(tmp_path / "headline.csv")
    assert {r["scheduler"] for r in rows} == {"random", "envsched", "dps"}
    assert headline.first_reach(__import__("numpy").array([1.0, 2.0, 3.0]), 2.0) == 2
    assert headline.first_reach(__import__("numpy").array([1.0, 2.0]), 5.0) is None


def test_bench_episodes_small(tmp_path, capsys):
    """The episode benchmark runs (in-process only here; the sandboxes have their own tests)."""
    import json

    import bench_episodes

    out = tmp_path / "bench.json"
    bench_episodes.main(bench_episodes.Args(sandboxes=("inprocess",), pools=("embedded",), repeats=1,
                                            starts=1, out=out))
    result = json.loads(out.read_text())
    entry = result["sandboxes"]["inprocess"]["pools"]["embedded"]
    assert entry["episodes"] == 192 and entry["mean_reward"] == 1.0 and entry["episodes_per_second"] > 0
    assert "inprocess  embedded" in capsys.readouterr().out


def test_bench_length_grouping_small(tmp_path, capsys):
    """The length-grouping benchmark times both updates of the same batch and they agree."""
    import json

    import bench_length_grouping as bench

    out = tmp_path / "bench.json"
    bench.main(bench.Args(rows=8, min_len=16, max_len=200, prompt_len=8, pad_multiple=16,
                          micro_batch_size=2, steps=1, out=out))
    result = json.loads(out.read_text())
    assert result["first_update_relative_difference"] < 1e-4
    assert result["padded"]["median_s"] > 0 and result["length_grouped"]["median_s"] > 0
    longest = result["lengths"]["max"]
    assert 16 <= longest <= 200 and result["lengths"]["padded_width"] == -(-longest // 16) * 16
    assert "speed-up (padded / length-grouped, same run)" in capsys.readouterr().out


def test_bench_learner_tiny(tmp_path):
    """The learner benchmark times our step and torch's on the tiny model, and the two agree on
    the first step (the script itself fails when they do not)."""
    pytest.importorskip("torch", reason="torch (CPU build) is the benchmark's baseline; "
                        "`make install` installs it")
    import json

    import bench_learner

    out = tmp_path / "bench.json"
    bench_learner.main(bench_learner.Args(models=("tiny_llama",), steps=1, warmup=0, seq_len=32,
                                          prompt_len=8, out=out))
    entry = json.loads(out.read_text())["models"]["tiny_llama"]
    assert set(entry["backends"]) == {"ours", "torch"}
    assert entry["grad_norm_rel_diff"] <= 1e-3 and entry["speedup_vs_torch"] > 0
    assert entry["generated_tokens_per_step"] == 8 * 24
    ours = entry["backends"]["ours"]
    assert ours["loss"] == pytest.approx(entry["backends"]["torch"]["loss"], rel=1e-4, abs=1e-7)
    assert ours["clip_fraction"] == entry["backends"]["torch"]["clip_fraction"]
