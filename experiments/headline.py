"""Headline on the learning-dynamics testbed: steps needed to reach Random's best held-out score.

For each seed, Random's best held-out score within the budget (120 steps, as in the paper) is
the bar; every scheduler (same seed, same budget) reports the first step at which its held-out
score reaches that bar, or "not reached". The paper: EnvSched reaches Random's best-in-120-steps
BFCL-v3 score at step 40. The testbed is a SIMULATION calibrated against Random only; its
held-out score is the mean expected reward on never-selectable environments.

Writes RUN/headline.csv (per scheduler and seed) and RUN/headline.png (held-out curves).

Usage:
    python experiments/headline.py                     # 5 schedulers x 3 seeds x 120 steps (~1.5 min)
    python experiments/headline.py --schedulers random envsched --seeds 0 1 2 3 4
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

from envsched_jax.sim.runner import SetupConfig, make_setup, run_scheduler  # noqa: E402

PAPER_STEPS = {"envsched": 40}


@dataclasses.dataclass(frozen=True)
class Args:
    schedulers: tuple[str, ...] = ("random", "envsched", "dps", "mopps", "leeps_reconstruction")
    """Registered schedulers; 'random' is required (it sets the bar)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 120
    """Step budget (the paper's 120)."""
    batch_size: int = 64
    """B (the paper's 64)."""
    group_size: int = 8
    """K rollouts per task (the paper's 8)."""
    setup: SetupConfig = SetupConfig()
    out: Path = Path("runs/headline")
    """Run folder."""


def first_reach(curve: np.ndarray, bar: float) -> int | None:
    """1-based first step whose score is >= bar, or None."""
    hits = np.flatnonzero(curve >= bar)
    return int(hits[0]) + 1 if len(hits) else None


def main(args: Args) -> dict[str, list[int | None]]:
    if "random" not in args.schedulers:
        raise SystemExit("--schedulers must include 'random' (it sets the bar)")
    console = Console(width=120)
    out = run_folder(args.out, args)
    setup = make_setup(args.setup)
    curves: dict[str, list[np.ndarray]] = {}
    with Timer() as timer:
        for name in args.schedulers:
            curves[name] = [run_scheduler(setup, name, steps=args.steps, seed=s, batch_size=args.batch_size,
                                          group_size=args.group_size).heldout for s in args.seeds]
    bars = [float(np.max(c)) for c in curves["random"]]
    reach = {name: [first_reach(c, bar) for c, bar in zip(curves[name], bars)] for name in args.schedulers}

    table = Table("scheduler", *(f"seed {s}" for s in args.seeds), "reached in", "mean steps (reached)",
                  "best held-out (mean)", "paper steps",
                  title=f"Steps to reach Random's best held-out score within {args.steps} steps (testbed, a simulation)")
    rows = []
    for name in args.schedulers:
        hits = [r for r in reach[name] if r is not None]
        best = [float(np.max(c)) for c in curves[name]]
        table.add_row(name, *(str(r) if r is not None else "not reached" for r in reach[name]),
                      f"{len(hits)}/{len(args.seeds)}", fmt(float(np.mean(hits)) if hits else None, 1),
                      fmt(float(np.mean(best)), 2), str(PAPER_STEPS.get(name, "--")))
        for seed, r, b, bar in zip(args.seeds, reach[name], best, bars):
            rows.append({"scheduler": name, "seed": seed, "random_best": bar, "steps_to_reach": r, "best_heldout": b})
    console.print(table)
    console.print(f"Random's bar per seed: {', '.join(f'{b:.2f}' for b in bars)}; wall time {timer.seconds:.0f} s")
    write_csv(out / "headline.csv", rows)
    _plot(curves, bars, out / "headline.png")
    console.print(f"written: {out / 'headline.csv'}, {out / 'headline.png'}")
    return reach


def _plot(curves, bars, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, runs in curves.items():
        arr = np.array(runs)
        steps = np.arange(1, arr.shape[1] + 1)
        ax.plot(steps, arr.mean(0), label=name)
    ax.axhline(float(np.mean(bars)), color="gray", linestyle="--", label="Random's best (mean over seeds)")
    ax.set(xlabel="step", ylabel="held-out score (%)", title="Held-out score (testbed, mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(tyro.cli(Args))
