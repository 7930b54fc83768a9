"""Table 3 on the learning-dynamics testbed: EnvSched's component ablations and neighbourhood sizes.

Every configuration is a named config of the one EnvSched implementation
(envsched_jax/sched/ablations.py); Random is the reference row. All run the same seeds and steps
on the simulated GRPO testbed (a SIMULATION calibrated against Random only). Reported per
configuration: mean within-task reward variance of the selected tasks, environments and tools per
batch, best held-out score (mean over seeds), with the change from full EnvSched; the paper's
figures (Qwen3-4B; its score column is BFCL-v3, a different measure) beside them.

Writes RUN/table3.csv (per configuration and seed, plus means) and RUN/table3.png.

Usage:
    python experiments/table3.py                          # 3 seeds x 200 steps, 10 configurations (~3 min)
    python experiments/table3.py --configs full within_only cross_only --steps 100
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from reporting import Timer, fmt, run_folder, write_csv  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from envsched_jax.sched import EnvSchedConfig  # noqa: E402
from envsched_jax.sched.ablations import ABLATIONS, ablation_config  # noqa: E402
from envsched_jax.sim.runner import SetupConfig, make_setup, run_scheduler  # noqa: E402

# Table 3 (Qwen3-4B, 200 steps): mean reward variance, environments / batch, tools / batch, BFCL-v3.
PAPER = {
    "random": (0.0321, 36.53, 413.41, 28.83),
    "full": (0.0429, 45.96, 478.39, 31.88),
    "within_only": (0.0391, 46.70, 498.55, 30.42),
    "cross_only": (0.0383, 46.18, 466.50, 30.63),
    "coverage_only": (0.0357, 51.00, 502.10, 29.71),
    "exploitation_only": (0.0442, 33.95, 420.63, 29.17),
    "k3_12": (0.0409, 47.18, 488.65, 31.25),
    "k12_12": (0.0434, 45.66, 475.71, 31.71),
    "k6_6": (0.0425, 45.70, 480.01, 30.92),
    "k6_24": (0.0441, 46.90, 493.83, 32.83),
}


@dataclasses.dataclass(frozen=True)
class Args:
    configs: tuple[str, ...] = ("random",) + tuple(ABLATIONS)
    """'random' and EnvSched ablation names (envsched_jax/sched/ablations.py)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 200
    batch_size: int = 64
    """B (the paper's 64)."""
    group_size: int = 8
    """K rollouts per task (the paper's 8)."""
    setup: SetupConfig = SetupConfig()
    out: Path = Path("runs/table3")
    """Run folder."""


def run_config(setup, name: str, seed: int, args: Args):
    size = dict(steps=args.steps, seed=seed, batch_size=args.batch_size, group_size=args.group_size)
    if name == "random":
        return run_scheduler(setup, "random", **size)
    config = ablation_config(name, EnvSchedConfig(batch_size=args.batch_size, group_size=args.group_size))
    return run_scheduler(setup, "envsched", **size, scheduler_kwargs={"config": config})


def main(args: Args) -> dict[str, dict[str, float]]:
    console = Console(width=120)
    out = run_folder(args.out, args)
    setup = make_setup(args.setup)
    rows, means = [], {}
    with Timer() as timer:
        for name in args.configs:
            per_seed = []
            for seed in args.seeds:
                summary = run_config(setup, name, seed, args).summary()
                per_seed.append(summary)
                rows.append({"config": name, "seed": seed, **summary})
            means[name] = {k: float(np.mean([s[k] for s in per_seed])) for k in per_seed[0]}
            rows.append({"config": name, "seed": "mean", **means[name]})
            console.print(f"  {name}: {means[name]}", highlight=False)

    ref = means.get("full")
    table = Table("configuration", "variance", "envs/batch", "tools/batch", "held-out best",
                  "paper variance", "paper envs", "paper tools", "paper BFCL-v3",
                  title=f"Table 3 on the testbed: {len(args.seeds)} seeds x {args.steps} steps (a simulation)")
    for name in args.configs:
        m = means[name]

        def cell(key, digits):
            delta = "" if ref is None or name == "full" else f" ({m[key] - ref[key]:+.{digits}f})"
            return fmt(m[key], digits) + delta

        paper = PAPER.get(name, (float("nan"),) * 4)
        table.add_row(name, cell("mean_variance", 4), cell("environments", 2), cell("tools", 1),
                      cell("best_heldout", 2), fmt(paper[0], 4), fmt(paper[1], 2), fmt(paper[2], 2), fmt(paper[3], 2))
    console.print(table)
    console.print(f"in brackets: change from full EnvSched; wall time {timer.seconds:.0f} s")
    write_csv(out / "table3.csv", rows)
    _plot(means, out / "table3.png")
    console.print(f"written: {out / 'table3.csv'}, {out / 'table3.png'}")
    return means


def _plot(means: dict[str, dict[str, float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, m in means.items():
        ax.scatter(m["environments"], m["mean_variance"], label=name)
        ax.annotate(name, (m["environments"], m["mean_variance"]), fontsize=8, xytext=(3, 3),
                    textcoords="offset points")
    ax.set(xlabel="environments per batch", ylabel="mean reward variance of selected tasks",
           title="Coverage vs variance per configuration (testbed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(tyro.cli(Args))
