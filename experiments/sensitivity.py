"""Sensitivity of the testbed's conclusions to its parameters.

The calibration (envsched_jax/sim/calibration.py) fixes the difficulty and noise parameters from
Random's statistics only; the learning rates, forgetting and gate/check shape are not identified by
them. This script changes one parameter at a time (halved and doubled; forgetting set to 0 and
multiplied by 5) and reruns Random and EnvSched on the same seeds, reporting EnvSched / Random
for the mean reward variance of the selected tasks, environments per batch and the best held-out
score, and whether each conclusion ("EnvSched selects higher-variance tasks", "covers more
environments", "reaches a higher held-out score") keeps its direction.

Every setting runs in one program per scheduler: Random as ``random_runs`` and EnvSched as
``envsched_runs`` (a ``lax.scan`` over the steps for each run, mapped over settings x seeds, the
TestbedParams of the settings stacked), which select exactly the batches ``run_scheduler``
selects (``--vectorize``: EnvSched's runs vmapped instead, batched: see ``envsched_runs``).

Writes RUN/sensitivity.csv.

Usage:
    python experiments/sensitivity.py                     # 15 settings x 2 schedulers x 2 seeds x 200 steps
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
from envsched_jax.sched import EnvSchedConfig
from envsched_jax.sim.runner import SetupConfig, envsched_runs, make_setup, random_runs, stack_params

SCALES = {"forget": (0.0, 5.0)}  # multipliers; every other parameter is halved and doubled


@dataclasses.dataclass(frozen=True)
class Args:
    params: tuple[str, ...] = ("lr_env", "lr_skill", "forget", "rollout_noise", "difficulty_noise",
                               "gate_scale", "check_scale")
    """TestbedParams fields to vary one at a time."""
    seeds: tuple[int, ...] = (0, 1)
    steps: int = 200
    batch_size: int = 64
    group_size: int = 8
    setup: SetupConfig = SetupConfig()
    vectorize: bool = False
    """vmap EnvSched's runs (batched) instead of mapping them one after the other (bit-identical to
    run_scheduler)."""
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
        points = settings(args.params)
        params = [base if name == "calibrated" else dataclasses.replace(base, **{name: getattr(base, name) * mult})
                  for name, mult in points]
        # Random: one scan vmapped over seeds and the stacked settings ([P, seeds, T, B]).
        rnd = random_runs(setup, stack_params(params), args.seeds, steps=args.steps, batch_size=args.batch_size,
                          group_size=args.group_size, batched_params=True)
        # EnvSched (paper defaults): one program for all settings.
        config = EnvSchedConfig(batch_size=args.batch_size, group_size=args.group_size)
        env = envsched_runs(setup, config, args.seeds, steps=args.steps, params=params, vectorize=args.vectorize)
        for k, ((name, mult), p) in enumerate(zip(points, params)):
            res = {"random": {"variance": rnd["variance"][k].mean(axis=(1, 2)).mean(),
                              "environments": rnd["environments"][k].mean(),
                              "heldout": np.nanmax(rnd["heldout"][k], axis=1).mean(),
                              "median_reward": np.median(rnd["mean_reward"][k])},
                   "envsched": {"variance": env.realised_variance[k].mean(axis=(1, 2)).mean(),
                                "environments": env.environments[k].mean(),
                                "heldout": np.nanmax(env.heldout[k], axis=1).mean(),
                                "median_reward": np.median(env.mean_reward[k])}}
            row = {"parameter": name, "multiplier": mult,
                   "value": getattr(p, name) if name != "calibrated" else None,
                   **{f"{s}_{key}": float(v) for s in res for key, v in res[s].items()},
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
