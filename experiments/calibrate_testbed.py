"""Calibrate the learning-dynamics testbed against Random scheduling only (see
envsched_jax/sim/calibration.py for the procedure and the frozen result).

Prints every grid point's Random statistics next to the paper's Random figures, best first, and
writes them to RUN/calibration.csv. EnvSched is never run here.

Usage:
    python experiments/calibrate_testbed.py                 # the full grid, 3 seeds x 200 steps (~3 min)
    python experiments/calibrate_testbed.py --seeds 0 --steps 50   # a quick look
"""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path

import tyro
from rich.console import Console
from rich.table import Table

from envsched_jax.sim import calibration as C
from envsched_jax.sim import testbed as tb
from envsched_jax.sim.runner import SetupConfig, make_setup


@dataclasses.dataclass(frozen=True)
class Args:
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds per grid point."""
    steps: int = 200
    """Steps per run (the paper's 200)."""
    setup: SetupConfig = SetupConfig()
    out: Path = Path("runs/calibration")
    """Run folder."""


def main(args: Args) -> None:
    console = Console(width=120)
    t0 = time.perf_counter()
    setup = make_setup(args.setup)
    rows = C.calibrate(setup, seeds=args.seeds, steps=args.steps,
                       progress=lambda r: console.print(f"  {r}", highlight=False))
    table = Table("difficulty mean", "difficulty noise", "rollout noise", "check scale", "mean var",
                  "median var", "median reward", "envs/batch", "loss", title="Random on the testbed, best first")
    table.add_row("paper Random", "", "", "", *(f"{C.PAPER_RANDOM[k]}" for k in
                                                ("mean_variance", "median_variance", "median_reward", "environments")), "")
    for r in rows[:10]:
        table.add_row(f"{r['difficulty_mean']}", f"{r['difficulty_noise']}", f"{r['rollout_noise']}",
                      f"{r['check_scale']}", f"{r['mean_variance']:.4f}", f"{r['median_variance']:.4f}",
                      f"{r['median_reward']:.3f}", f"{r['environments']:.2f}", f"{r['loss']:.4f}")
    console.print(table)
    frozen = {k: getattr(tb.TestbedParams(), k) for k in C.FROZEN}
    console.print(f"frozen defaults (TestbedParams): {frozen}; best of this run: "
                  f"{ {k: rows[0][k] for k in C.FROZEN} }")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "calibration.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    console.print(f"{len(rows)} grid points in {time.perf_counter() - t0:.0f} s; written to {args.out / 'calibration.csv'}")


if __name__ == "__main__":
    main(tyro.cli(Args))
