"""Sensitivity of the testbed's conclusions to its parameters.

The calibration (envsched_jax/sim/calibration.py) fixes the difficulty and noise parameters from
Random's statistics only; the learning rates, forgetting and gate/check shape are not identified by
them. This script changes one parameter at a time (halved and doubled; forgetting set to 0 and
multiplied by 5) and reruns Random and EnvSched on the same seeds, reporting EnvSched / Random
for the mean reward variance of the selected tasks, environments per batch and the best held-out
score, and whether each conclusion ("EnvSched selects higher-variance tasks", "covers more
environments", "reaches a higher held-out score") keeps its direction.

Writes RUN/sensitivity.csv.

Usage:
    python experiments/sensitivity.py                     # 15 settings x 2 schedulers x 2 seeds x 200 steps (~6 min)
    python experiments/sensitivity.py --params lr_env rollout_noise --seeds 0 1 2
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tyro
from reporting import Timer, fmt, run_folder, write_csv
from rich.console import Console
from rich.table import Table

from envsched_jax.sim import testbed as tb
from envsched_jax.sim.runner import SetupConfig, make_setup, run_scheduler

SCALES = {"forget": (0.0, 5.0)}  # multipliers; every other parameter is halved and doubled


@dataclasses.dataclass(frozen=True)
class Args:
    params: tuple[str, ...] = ("lr_env", "lr_skill", "forget", "rollout_noise", "difficulty_noise",
                               "gate_scale", "check_scale")
    """TestbedParams fields to vary one at a time."""
    seeds: tuple[int, ...] = (0, 1)
    steps: int = 200
    setup: SetupConfig = SetupConfig()
    out: Path = Path("runs/sensitivity")
    """Run folder."""


def settings(names) -> list[tuple[str, float]]:
    base = tb.TestbedParams()
    out = [("calibrated", 1.0)]
    for name in names:
        if not hasattr(base, name):
            raise SystemExit(f"unknown TestbedParams field {name!r}")
        out += [(name, m) for m in SCALES.get(name, (0.5, 2.0))]
    return out


def main(args: Args) -> list[dict]:
    console = Console(width=120)
    out = run_folder(args.out, args)
    setup = make_setup(args.setup)
    base = tb.TestbedParams()
    rows = []
    with Timer() as timer:
        for name, mult in settings(args.params):
            params = base if name == "calibrated" else dataclasses.replace(base, **{name: getattr(base, name) * mult})
            res = {}
            for sched in ("random", "envsched"):
                logs = [run_scheduler(setup, sched, steps=args.steps, seed=s, params=params) for s in args.seeds]
                res[sched] = {"variance": np.mean([log.realised_variance.mean() for log in logs]),
                              "environments": np.mean([log.environments.mean() for log in logs]),
                              "heldout": np.mean([np.nanmax(log.heldout) for log in logs]),
                              "median_reward": np.median(np.concatenate([log.mean_reward.ravel() for log in logs]))}
            row = {"parameter": name, "multiplier": mult,
                   "value": getattr(params, name) if name != "calibrated" else None,
                   **{f"{s}_{k}": float(v) for s in res for k, v in res[s].items()},
                   "variance_ratio": res["envsched"]["variance"] / res["random"]["variance"],
                   "environments_ratio": res["envsched"]["environments"] / res["random"]["environments"],
                   "heldout_diff": res["envsched"]["heldout"] - res["random"]["heldout"]}
            rows.append(row)
            console.print(f"  {name} x{mult}: {row}", highlight=False)
    table = Table("parameter", "x", "Random median reward", "variance EnvSched/Random", "envs EnvSched/Random",
                  "held-out EnvSched - Random", title="Testbed sensitivity (one parameter at a time)")
    for r in rows:
        table.add_row(r["parameter"], f"{r['multiplier']}", fmt(r["random_median_reward"], 3),
                      fmt(r["variance_ratio"], 3), fmt(r["environments_ratio"], 3), fmt(r["heldout_diff"], 2))
    console.print(table)
    keep = {k: sum(1 for r in rows if cond(r)) for k, cond in (
        ("higher variance", lambda r: r["variance_ratio"] > 1), ("more environments", lambda r: r["environments_ratio"] > 1),
        ("higher held-out", lambda r: r["heldout_diff"] > 0))}
    console.print("conclusion holds in: " + ", ".join(f"{k} {v}/{len(rows)}" for k, v in keep.items())
                  + f"; wall time {timer.seconds:.0f} s")
    write_csv(out / "sensitivity.csv", rows)
    console.print(f"written: {out / 'sensitivity.csv'}")
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
