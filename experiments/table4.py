"""Table 4 (initialisation robustness) on the learning-dynamics testbed (a SIMULATION of GRPO
training, see envsched_jax/sim/testbed.py; its numbers are not training results).

Independent EnvSched runs, each starting from a random cold-start batch of B = 64 tasks
(``EnvSchedConfig(cold_start="random")``, drawn from the run's seed) and then scheduling 32
coverage + 32 exploitation picks per step.

Step numbering follows the paper's Table 4: step 0 is the random initial batch ("N/A (initial
batch)" in its panel b), steps 1..7 are the seven scheduled steps, so a run has 8 batches. The
paper's own figures fix this reading: its cumulative mean variance at step 1 (0.0534) is the
mean of an initial batch (about 0.047, the mean of its low and high quartile groups at step 0)
and step 1 (0.0596), and its hit rate is reported from step 1 on.

Per run and step:
- batch variance: mean over the 64 picks of the realised population variance of the K = 8 rewards;
- cumulative mean variance up to step k: mean of the batch variances of steps 0..k;
- exploitation hit rate: share of the step's exploitation picks whose TRUE expected group variance
  (``testbed.expected_group_variance`` under the testbed state at selection time) is in the top
  quartile (>= the 75th percentile) of all training nodes' true variance at that step. A random
  pick hits 25% of the time; the hit rate of the coverage picks is written as a reference.

Intervals: mean with a Student-t 95% interval over runs; range = 5th-95th percentile over runs.
Panel b: the quarter of runs with the lowest / highest step-0 batch variance.

Usage:
    python experiments/table4.py                        # 100 runs x (1 + 7) steps, ~1 min
    python experiments/table4.py --runs 20 --out runs/table4-quick
"""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from rich.console import Console
from rich.table import Table
from scipy import stats

from envsched_jax.sched import EnvSchedConfig, make_scheduler
from envsched_jax.sim import testbed as tb
from envsched_jax.sim.runner import Setup, SetupConfig, rollout_key, make_setup

PAPER_A = {  # Table 4 (a): (mean, ci low, ci high) at steps 1 and 7, and the step-7 5-95% range
    "batch_variance": {1: (0.0596, 0.0584, 0.0609), 7: (0.0813, 0.0803, 0.0823), "range": (0.0726, 0.0894)},
    "cumulative_variance": {1: (0.0534, 0.0524, 0.0543), 7: (0.0679, 0.0673, 0.0684), "range": (0.0639, 0.0723)},
    "hit_rate": {1: (57.2, 55.5, 58.9), 7: (92.1, 91.1, 93.0), "range": (84.4, 100.0)},
}
PAPER_B = {  # Table 4 (b): per step 0, 1, 4, 7 (hit rate has no step 0)
    ("batch_variance", "low"): {0: 0.0406, 1: 0.0574, 4: 0.0746, 7: 0.0810},
    ("batch_variance", "high"): {0: 0.0540, 1: 0.0630, 4: 0.0768, 7: 0.0833},
    ("hit_rate", "low"): {1: 55.9, 4: 84.6, 7: 92.8},
    ("hit_rate", "high"): {1: 60.4, 4: 83.4, 7: 92.5},
}
PANEL_B_STEPS = (0, 1, 4, 7)
METRICS = ("batch_variance", "cumulative_variance", "hit_rate")


@dataclasses.dataclass(frozen=True)
class Args:
    runs: int = 100
    """Independent runs (seeds first_seed .. first_seed + runs - 1)."""
    steps: int = 7
    """Scheduled steps after the random initial batch (the paper's seven)."""
    first_seed: int = 0
    """Seed of the first run."""
    batch_size: int = 64
    """B (paper: 64)."""
    group_size: int = 8
    """K rollouts per task (paper: 8)."""
    setup: SetupConfig = SetupConfig()
    """The testbed pool (default: 51 x 50 training nodes + 10 held-out environments)."""
    out: Path = Path("runs/table4")
    """Run folder (table4_runs.csv, table4.csv, table4.png)."""


@dataclasses.dataclass
class RunRecord:
    """One run: per step 0..steps."""

    seed: int
    batch_variance: np.ndarray   # [T]
    hit_rate: np.ndarray         # [T] % of exploitation picks in the true top quartile (NaN: none)
    exploit_picks: np.ndarray    # [T]
    coverage_hit_rate: np.ndarray  # [T] same for the coverage picks (NaN: none)

    @property
    def cumulative_variance(self) -> np.ndarray:
        return np.cumsum(self.batch_variance) / np.arange(1, len(self.batch_variance) + 1)


def _hit_rate(hits: np.ndarray, mask: np.ndarray) -> float:
    return 100.0 * float(hits[mask].mean()) if mask.any() else float("nan")


def run_one(setup: Setup, seed: int, args: Args, params: tb.TestbedParams = tb.TestbedParams()) -> RunRecord:
    """One EnvSched run with a random cold start; the loop mirrors ``runner.run_scheduler`` (same
    rollout keys) and reads the testbed state before each selection."""
    sched = make_scheduler("envsched", setup.graph, batch_size=args.batch_size, group_size=args.group_size,
                           seed=seed, tools_per_env=setup.tools_per_env, config=EnvSchedConfig(cold_start="random"))
    index = {tid: k for k, tid in enumerate(setup.graph.task_ids)}
    state = tb.init_state(setup.structure, params)
    key = jax.random.PRNGKey(seed)
    num = args.steps + 1
    variance, hit, n_exploit, cov_hit = np.zeros(num), np.zeros(num), np.zeros(num, int), np.zeros(num)
    for t in range(num):
        true_var = np.asarray(tb.expected_group_variance(setup.structure, state, params, group_size=args.group_size))
        ids = sched.select(t)
        phases = np.array(sched.metrics()[-1].phases)
        nodes = np.array([index[i] for i in ids], np.int32)
        hits = true_var[nodes] >= np.quantile(true_var, 0.75)
        hit[t], cov_hit[t] = _hit_rate(hits, phases == "exploitation"), _hit_rate(hits, phases == "coverage")
        n_exploit[t] = int((phases == "exploitation").sum())
        rewards = tb.rollout(setup.structure, state, params, jnp.asarray(nodes), rollout_key(key, t),
                             group_size=args.group_size, max_checks=setup.max_checks)
        rewards_np = np.asarray(rewards, np.float64)
        sched.observe(t, ids, rewards_np)
        state = tb.learn(setup.structure, state, params, jnp.asarray(nodes), rewards)
        variance[t] = rewards_np.var(axis=1).mean()
    return RunRecord(seed, variance, hit, n_exploit, cov_hit)


def t_interval(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and Student-t 95% interval of the finite values of x."""
    x = x[np.isfinite(x)]
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half


def metric_matrix(records: list[RunRecord], metric: str) -> np.ndarray:
    """[runs, T] values of one metric."""
    return np.array([getattr(r, metric) for r in records])


def quartile_groups(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """The quarter of runs with the lowest and the highest step-0 batch variance."""
    order = np.argsort([r.batch_variance[0] for r in records], kind="stable")
    q = max(len(records) // 4, 1)
    return {"low": [records[i] for i in order[:q]], "high": [records[i] for i in order[-q:]]}


def summary_rows(records: list[RunRecord], steps: int) -> list[dict]:
    """Panel a (every step) and panel b (steps 0, 1, 4, 7 when present) rows, ours beside paper."""
    rows = []
    for metric in METRICS:
        values = metric_matrix(records, metric)
        for t in range(steps + 1):
            col = values[:, t]
            if not np.isfinite(col).any():
                continue
            mean, lo, hi = t_interval(col)
            finite = col[np.isfinite(col)]
            paper = PAPER_A[metric].get(t, (np.nan,) * 3)
            paper_range = PAPER_A[metric]["range"] if t == 7 else (np.nan, np.nan)
            rows.append({"panel": "a", "metric": metric, "group": "all", "step": t, "runs": len(finite),
                         "mean": mean, "ci_low": lo, "ci_high": hi, "p5": float(np.percentile(finite, 5)),
                         "p95": float(np.percentile(finite, 95)), "paper_mean": paper[0], "paper_ci_low": paper[1],
                         "paper_ci_high": paper[2], "paper_p5": paper_range[0], "paper_p95": paper_range[1]})
    for group, members in quartile_groups(records).items():
        for metric in ("batch_variance", "hit_rate"):
            values = metric_matrix(members, metric)
            for t in (s for s in PANEL_B_STEPS if s <= steps):
                col = values[:, t]
                if not np.isfinite(col).any():
                    continue
                mean, lo, hi = t_interval(col)
                rows.append({"panel": "b", "metric": metric, "group": group, "step": t,
                             "runs": int(np.isfinite(col).sum()), "mean": mean, "ci_low": lo, "ci_high": hi,
                             "p5": float(np.nanpercentile(col, 5)), "p95": float(np.nanpercentile(col, 95)),
                             "paper_mean": PAPER_B[(metric, group)].get(t, np.nan), "paper_ci_low": np.nan,
                             "paper_ci_high": np.nan, "paper_p5": np.nan, "paper_p95": np.nan})
    return rows


def _fmt(metric: str, x: float) -> str:
    if not np.isfinite(x):
        return "-"
    return f"{x:.1f}" if metric == "hit_rate" else f"{x:.4f}"


def _cell(metric: str, mean: float, lo: float, hi: float) -> str:
    return f"{_fmt(metric, mean)} [{_fmt(metric, lo)}, {_fmt(metric, hi)}]" if np.isfinite(mean) else "-"


def print_tables(console: Console, rows: list[dict], steps: int, coverage_hits: float) -> None:
    label = {"batch_variance": "Mean batch reward variance", "cumulative_variance": "Cumulative mean reward variance",
             "hit_rate": "Exploitation hit rate (%)"}
    a = {(r["metric"], r["step"]): r for r in rows if r["panel"] == "a"}
    table = Table("metric", "source", "step 1", f"step {steps}", f"step {steps} range (5-95%)",
                  title="Table 4 (a): selection quality across random initialisations (mean [95% t-interval])")
    for metric in METRICS:
        first, last = a.get((metric, 1)), a.get((metric, steps))
        table.add_row(label[metric], "paper", _cell(metric, *PAPER_A[metric][1]), _cell(metric, *PAPER_A[metric][7]),
                      f"{_fmt(metric, PAPER_A[metric]['range'][0])}-{_fmt(metric, PAPER_A[metric]['range'][1])}")
        table.add_row("", "ours (testbed)",
                      _cell(metric, first["mean"], first["ci_low"], first["ci_high"]) if first else "-",
                      _cell(metric, last["mean"], last["ci_low"], last["ci_high"]) if last else "-",
                      f"{_fmt(metric, last['p5'])}-{_fmt(metric, last['p95'])}" if last else "-", end_section=True)
    console.print(table)
    b = {(r["metric"], r["group"], r["step"]): r for r in rows if r["panel"] == "b"}
    shown = [s for s in PANEL_B_STEPS if s <= steps]
    table = Table("metric", "group", "source", *(f"step {s}" for s in shown),
                  title="Table 4 (b): persistence of the initial-batch effect (lowest vs highest step-0 "
                        "variance quartile of runs, mean)")
    for metric in ("batch_variance", "hit_rate"):
        for group in ("low", "high"):
            paper = PAPER_B[(metric, group)]
            ours = [b.get((metric, group, s)) for s in shown]
            table.add_row(label[metric] if group == "low" else "", f"{group} initial", "paper",
                          *(_fmt(metric, paper[s]) if s in paper else "N/A" for s in shown))
            table.add_row("", "", "ours (testbed)", *(_fmt(metric, r["mean"]) if r else "N/A" for r in ours),
                          end_section=group == "high")
    console.print(table)
    gaps = []
    for s in shown:
        low, high = b.get(("batch_variance", "low", s)), b.get(("batch_variance", "high", s))
        paper = PAPER_B[("batch_variance", "high")].get(s, np.nan) / PAPER_B[("batch_variance", "low")].get(s, np.nan)
        gaps.append(f"step {s}: ours {100 * (high['mean'] / low['mean'] - 1):+.1f}% "
                    f"(paper {100 * (paper - 1):+.1f}%)")
    console.print("high-vs-low variance gap: " + "; ".join(gaps), highlight=False)
    console.print(f"reference: a random pick hits the top quartile 25% of the time; our coverage picks hit it "
                  f"{coverage_hits:.1f}% (steps 1..{steps}, all runs)", highlight=False)


def write_csvs(out: Path, records: list[RunRecord], rows: list[dict]) -> None:
    with open(out / "table4_runs.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["seed", "step", "batch_variance", "cumulative_variance", "hit_rate", "exploit_picks",
                         "coverage_hit_rate"])
        for r in records:
            for t in range(len(r.batch_variance)):
                writer.writerow([r.seed, t, r.batch_variance[t], r.cumulative_variance[t], r.hit_rate[t],
                                 r.exploit_picks[t], r.coverage_hit_rate[t]])
    with open(out / "table4.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(path: Path, records: list[RunRecord]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = quartile_groups(records)
    for ax, metric, ylabel in ((axes[0], "batch_variance", "mean batch reward variance"),
                               (axes[1], "hit_rate", "exploitation hit rate (%)")):
        values = metric_matrix(records, metric)
        steps = np.arange(values.shape[1])
        ok = np.isfinite(values).any(axis=0)
        ax.plot(steps[ok], np.nanmean(values[:, ok], axis=0), color="C0", label="all runs (mean)")
        ax.fill_between(steps[ok], np.nanpercentile(values[:, ok], 5, axis=0),
                        np.nanpercentile(values[:, ok], 95, axis=0), color="C0", alpha=0.2, label="5-95%")
        for group, colour in (("low", "C2"), ("high", "C3")):
            g = metric_matrix(groups[group], metric)
            ax.plot(steps[ok], np.nanmean(g[:, ok], axis=0), color=colour, ls="--",
                    label=f"{group} initial-variance quartile")
            paper = PAPER_B[(metric, group)]
            ax.plot(list(paper), list(paper.values()), "x", color=colour, label=f"paper, {group}")
        ax.set_xlabel("step (0 = random initial batch)")
        ax.set_ylabel(ylabel)
    axes[1].axhline(25, color="grey", lw=0.8, ls=":", label="random pick (25%)")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Table 4 on the simulated testbed: {len(records)} EnvSched runs from random cold starts")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: Args) -> None:
    console = Console(width=120)
    t0 = time.perf_counter()
    setup = make_setup(args.setup)
    t_setup = time.perf_counter() - t0
    records = []
    for k in range(args.runs):
        records.append(run_one(setup, args.first_seed + k, args))
        if (k + 1) % 10 == 0 or k + 1 == args.runs:
            console.print(f"  {k + 1}/{args.runs} runs, {time.perf_counter() - t0:.0f} s", highlight=False)
    rows = summary_rows(records, args.steps)
    coverage_hits = float(np.nanmean(metric_matrix(records, "coverage_hit_rate")[:, 1:]))
    print_tables(console, rows, args.steps, coverage_hits)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csvs(args.out, records, rows)
    plot(args.out / "table4.png", records)
    console.print(f"SIMULATED testbed, not training results. {args.runs} runs in {time.perf_counter() - t0:.0f} s "
                  f"(setup {t_setup:.0f} s); written to {args.out}/table4.csv, table4_runs.csv, table4.png",
                  highlight=False)


if __name__ == "__main__":
    main(tyro.cli(Args))
