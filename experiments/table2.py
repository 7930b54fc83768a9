"""Table 2 on the learning-dynamics testbed: selection statistics of Random vs EnvSched.

Each scheduler runs the same seeds for the same number of steps on the simulated GRPO testbed
(envsched_jax/sim/testbed.py; a SIMULATION calibrated against Random only). Reported, pooled over
all selected groups of all seeds: mean and median within-task reward variance of the selected
tasks, median reward, environments and tools per batch, and the held-out score (best over the run
and at the end; mean over seeds with a 95% t-interval). The paper's Qwen3-4B figures are printed
beside ours; its "held-out" column is BFCL-v3, a different measure from the testbed's held-out
environments, shown only for the direction of the change.

Writes RUN/table2.csv (one row per scheduler and seed, plus pooled rows), RUN/table2_steps.csv
(per-step series) and RUN/table2.png.

Usage:
    python experiments/table2.py                      # 3 seeds x 200 steps (about 1 minute)
    python experiments/table2.py --seeds 0 1 2 3 4 --steps 200 --out runs/table2-5seeds
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from reporting import Timer, fmt, mean_ci, rel, run_folder, write_csv  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from envsched_jax.graph.build import GraphConfig  # noqa: E402
from envsched_jax.sim.runner import RunLog, SetupConfig, make_setup, run_scheduler  # noqa: E402

PAPER = {  # Table 2, Qwen3-4B, 200 GRPO steps
    "random": {"mean_variance": 0.03208, "median_variance": 0.01468, "median_reward": 0.595,
               "environments": 36.53, "tools": 413.41, "heldout": 28.83},
    "envsched": {"mean_variance": 0.04290, "median_variance": 0.02108, "median_reward": 0.592,
                 "environments": 45.96, "tools": 478.39, "heldout": 31.88},
}
ROWS = (("mean_variance", "mean reward variance", 4), ("median_variance", "median reward variance", 4),
        ("median_reward", "median reward", 3), ("environments", "environments per batch", 2),
        ("tools", "tools per batch", 1), ("best_heldout", "held-out score, best (%)", 2),
        ("final_heldout", "held-out score, final (%)", 2))


@dataclasses.dataclass(frozen=True)
class Args:
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds (each scheduler runs every seed)."""
    steps: int = 200
    """Training steps per run (the paper's 200)."""
    schedulers: tuple[str, ...] = ("random", "envsched")
    """Registered schedulers to compare (the table's two columns by default)."""
    batch_size: int = 64
    """B (the paper's 64)."""
    group_size: int = 8
    """K rollouts per task (the paper's 8)."""
    setup: SetupConfig = SetupConfig()
    graph: GraphConfig = GraphConfig(dense="always")
    """Static-graph settings (e.g. --graph.hubness csls: the hubness correction, off by default)."""
    out: Path = Path("runs/table2")
    """Run folder."""


def pooled(logs: list[RunLog]) -> dict[str, float]:
    """Statistics over every selected group of every run (the paper pools over its one run)."""
    v = np.concatenate([log.realised_variance.ravel() for log in logs])
    r = np.concatenate([log.mean_reward.ravel() for log in logs])
    return {"mean_variance": float(v.mean()), "median_variance": float(np.median(v)),
            "median_reward": float(np.median(r)),
            "environments": float(np.mean([log.environments.mean() for log in logs])),
            "tools": float(np.mean([log.tools.mean() for log in logs])),
            "best_heldout": float(np.mean([np.nanmax(log.heldout) for log in logs])),
            "final_heldout": float(np.mean([log.heldout[-1] for log in logs]))}


def run(args: Args) -> dict[str, list[RunLog]]:
    setup = make_setup(args.setup, args.graph)
    return {name: [run_scheduler(setup, name, steps=args.steps, seed=s, batch_size=args.batch_size,
                                 group_size=args.group_size) for s in args.seeds]
            for name in args.schedulers}


def main(args: Args) -> dict[str, dict[str, float]]:
    console = Console(width=120)
    out = run_folder(args.out, args)
    with Timer() as timer:
        logs = run(args)
    stats = {name: pooled(runs) for name, runs in logs.items()}

    base = "random" if "random" in args.schedulers else args.schedulers[0]
    last = "envsched" if "envsched" in args.schedulers else args.schedulers[-1]
    table = Table("statistic", *(f"{n} (ours)" for n in args.schedulers), f"{last} vs {base} (ours)",
                  "Random (paper)", "EnvSched (paper)", "change (paper)",
                  title=f"Table 2 on the testbed: {len(args.seeds)} seeds x {args.steps} steps (a simulation)")
    for key, label, digits in ROWS:
        pkey = "heldout" if "heldout" in key else key
        paper_r, paper_e = PAPER["random"].get(pkey), PAPER["envsched"].get(pkey)
        per_seed = {n: [_per_run(log, key) for log in logs[n]] for n in args.schedulers}
        cells = []
        for n in args.schedulers:
            m, lo, hi = mean_ci(per_seed[n]) if "heldout" in key else (stats[n][key], None, None)
            cells.append(fmt(m, digits) + ("" if lo is None or np.isnan(lo) else f" [{lo:.{digits}f}, {hi:.{digits}f}]"))
        paper_note = "BFCL-v3 " if "heldout" in key else ""
        table.add_row(label, *cells, rel(stats[last][key], stats[base][key]),
                      paper_note + fmt(paper_r, digits) if paper_r is not None and key != "final_heldout" else "--",
                      paper_note + fmt(paper_e, digits) if paper_e is not None and key != "final_heldout" else "--",
                      rel(paper_e, paper_r) if paper_r is not None and key != "final_heldout" else "--")
    console.print(table)
    console.print(f"wall time {timer.seconds:.0f} s; held-out intervals: 95% t-interval over seeds")

    rows = [{"scheduler": n, "seed": log.seed, **log.summary()} for n in args.schedulers for log in logs[n]]
    rows += [{"scheduler": n, "seed": "pooled", **stats[n]} for n in args.schedulers]
    write_csv(out / "table2.csv", rows)
    write_csv(out / "table2_steps.csv", [
        {"scheduler": n, "seed": log.seed, "step": t, "mean_variance": float(log.realised_variance[t].mean()),
         "environments": int(log.environments[t]), "tools": int(log.tools[t]), "heldout": float(log.heldout[t])}
        for n in args.schedulers for log in logs[n] for t in range(args.steps)])
    _plot(logs, out / "table2.png")
    console.print(f"written: {out / 'table2.csv'}, {out / 'table2_steps.csv'}, {out / 'table2.png'}")
    return stats


def _per_run(log: RunLog, key: str) -> float:
    return log.summary()[key]


def _plot(logs: dict[str, list[RunLog]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in logs.items():
        var = np.array([log.realised_variance.mean(axis=1) for log in runs])
        held = np.array([log.heldout for log in runs])
        steps = np.arange(1, var.shape[1] + 1)
        axes[0].plot(steps, var.mean(0), label=name)
        axes[1].plot(steps, held.mean(0), label=name)
        axes[1].fill_between(steps, held.min(0), held.max(0), alpha=0.2)
    axes[0].set(xlabel="step", ylabel="mean reward variance of the batch", yscale="log")
    axes[1].set(xlabel="step", ylabel="held-out score (%)")
    for ax in axes:
        ax.legend()
    fig.suptitle("Testbed (simulation): Random vs EnvSched")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(tyro.cli(Args))
