"""Figure 4 on the learning-dynamics testbed (a SIMULATION of GRPO training, see
envsched_jax/sim/testbed.py; its numbers are not training results): per-step selected-task reward
variance (mean realised variance of the batch's K-groups) and environment coverage (distinct
environments per batch) for Random and EnvSched (paper defaults, static cold start).

Each scheduler runs ``--steps`` steps for every seed; the curves are the mean over seeds with a
min-max band over seeds. The variance panel has a log-scale y axis (the paper plots
log-transformed values). The paper's Figure 4 gives no numbers; its Table 2 run means (same
200-step runs) are printed beside ours, together with the share of steps where EnvSched is above
Random (the paper: "higher variance and coverage for most of the 200 training steps").

Usage:
    python experiments/figure4.py                      # 200 steps x 3 seeds x 2 schedulers, ~30 s
    python experiments/figure4.py --steps 50 --seeds 0 --out runs/figure4-quick
"""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table

from envsched_jax.sim.runner import Setup, SetupConfig, make_setup, run_scheduler

PAPER_TABLE2 = {"random": {"variance": 0.03208, "environments": 36.53},
                "envsched": {"variance": 0.04290, "environments": 45.96}}
SCHEDULERS = ("random", "envsched")
SERIES = ("variance", "environments")


@dataclasses.dataclass(frozen=True)
class Args:
    steps: int = 200
    """Steps per run (the paper's 200)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds per scheduler."""
    batch_size: int = 64
    """B (paper: 64)."""
    group_size: int = 8
    """K rollouts per task (paper: 8)."""
    segments: int = 4
    """Equal step segments in the printed table."""
    setup: SetupConfig = SetupConfig()
    """The testbed pool (default: 51 x 50 training nodes + 10 held-out environments)."""
    out: Path = Path("runs/figure4")
    """Run folder (figure4.csv, figure4.png)."""


def collect(setup: Setup, args: Args) -> dict[str, dict[str, np.ndarray]]:
    """[seeds, T] per-step batch variance and environments for each scheduler."""
    out = {}
    for name in SCHEDULERS:
        logs = [run_scheduler(setup, name, steps=args.steps, seed=s, batch_size=args.batch_size,
                              group_size=args.group_size, eval_every=args.steps) for s in args.seeds]
        out[name] = {"variance": np.array([log.realised_variance.mean(axis=1) for log in logs]),
                     "environments": np.array([log.environments for log in logs], float)}
    return out


def write_csv(path: Path, series: dict[str, dict[str, np.ndarray]], seeds: tuple[int, ...]) -> None:
    """Long format: one row per (scheduler, step) with the mean, min, max over seeds and each seed."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["scheduler", "step", *(f"{s}_{stat}" for s in SERIES for stat in ("mean", "min", "max")),
                         *(f"{s}_seed{seed}" for s in SERIES for seed in seeds)])
        for name, data in series.items():
            for t in range(data["variance"].shape[1]):
                stats = [f(data[s][:, t]) for s in SERIES for f in (np.mean, np.min, np.max)]
                writer.writerow([name, t + 1, *stats, *(data[s][k, t] for s in SERIES for k in range(len(seeds)))])


def print_table(console: Console, series: dict[str, dict[str, np.ndarray]], segments: int) -> None:
    steps = series["random"]["variance"].shape[1]
    bounds = np.linspace(0, steps, segments + 1).astype(int)
    spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    table = Table("series", "scheduler", "paper (Table 2, all steps)", f"ours, steps 1-{steps}",
                  *(f"steps {a + 1}-{b}" for a, b in spans),
                  title="Figure 4: per-step series averaged over steps and seeds (testbed vs paper)")
    for s in SERIES:
        for name in SCHEDULERS:
            seed_mean = series[name][s].mean(axis=0)
            fmt = (lambda x: f"{x:.5f}") if s == "variance" else (lambda x: f"{x:.2f}")
            table.add_row(s if name == "random" else "", name, fmt(PAPER_TABLE2[name][s]), fmt(seed_mean.mean()),
                          *(fmt(seed_mean[a:b].mean()) for a, b in spans), end_section=name == SCHEDULERS[-1])
    console.print(table)
    for s in SERIES:
        ours = series["envsched"][s].mean(axis=0) > series["random"][s].mean(axis=0)
        gain = series["envsched"][s].mean() / series["random"][s].mean() - 1
        paper = PAPER_TABLE2["envsched"][s] / PAPER_TABLE2["random"][s] - 1
        console.print(f"{s}: EnvSched above Random (seed means) on {ours.sum()} of {steps} steps; run-mean "
                      f"change {100 * gain:+.1f}% (paper Table 2: {100 * paper:+.1f}%)", highlight=False)


def plot(path: Path, series: dict[str, dict[str, np.ndarray]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    colours = {"random": "C1", "envsched": "C0"}
    for ax, s, ylabel in ((axes[0], "variance", "selected-task reward variance (log scale)"),
                          (axes[1], "environments", "environments per batch")):
        for name in SCHEDULERS:
            data = series[name][s]
            steps = np.arange(1, data.shape[1] + 1)
            ax.plot(steps, data.mean(axis=0), color=colours[name], lw=1.2, label=f"{name} (mean of {len(data)} seeds)")
            ax.fill_between(steps, data.min(axis=0), data.max(axis=0), color=colours[name], alpha=0.2)
            ax.axhline(PAPER_TABLE2[name][s], color=colours[name], ls=":", lw=1, label=f"paper {name} run mean")
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("Figure 4 on the simulated testbed (band: min-max over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: Args) -> None:
    console = Console(width=120)
    t0 = time.perf_counter()
    setup = make_setup(args.setup)
    series = collect(setup, args)
    print_table(console, series, args.segments)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "figure4.csv", series, args.seeds)
    plot(args.out / "figure4.png", series)
    console.print(f"SIMULATED testbed, not training results. {len(args.seeds)} seeds x {args.steps} steps in "
                  f"{time.perf_counter() - t0:.0f} s; written to {args.out}/figure4.csv, figure4.png", highlight=False)


if __name__ == "__main__":
    main(tyro.cli(Args))
