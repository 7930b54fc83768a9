"""A hyper-parameter sweep of EnvSched on the testbed as one compiled program vs the Python loop.

Issue 13, item 4: a 16-config x 3-seed x 200-step sweep at N = 2,550, run in the same process as
``envsched_runs`` (each run a ``lax.scan`` over the steps, the runs mapped over inside one
program: one after the other, the default, and ``vmap``-ed, ``vectorize=True``) and as
``run_scheduler`` (the Python loop every scheduler uses: select -> rollouts -> observe ->
simulated GRPO step) on every config and seed. The configs are a grid over two traced
hyper-parameters (lambda_sim x eta), so each sweep is one program. The script compares every
run's batches with the loop's, step by step: the default (mapped) program must select the same
batches (the script fails otherwise); the vmapped one is reported, it drifts (see envsched_runs).

Reported: wall time of each (the program with and without its compilation: it is run twice), the
ratios, the agreement, the load average. Writes RUN/bench_sweep.json.

Usage:
    python experiments/bench_sweep.py                                   # 16 x 3 x 200 at N = 2,550
    python experiments/bench_sweep.py --configs 4 --seeds 1 --steps 20  # a quick look
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import time
from pathlib import Path

import jax
import numpy as np
from reporting import run_folder

from envsched_jax.sched import EnvSchedConfig
from envsched_jax.sim.runner import SetupConfig, envsched_runs, make_setup, run_scheduler

LAMBDA_SIMS = (0.0, 0.04, 0.08, 0.16)
ETAS = (0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class Args:
    configs: int = 16
    """Configs: the first ones of the lambda_sim x eta grid (4 x 4 = 16 at most)."""
    seeds: int = 3
    """Seeds 0 .. seeds - 1, the same for every config."""
    steps: int = 200
    batch_size: int = 64
    group_size: int = 8
    chunk: int | None = None
    """At most this many runs per program call (bounds memory; None: all runs at once)."""
    loop: bool = True
    """Also run the Python loop (run_scheduler) on every config and seed, and compare."""
    loop_runs: int | None = None
    """Loop over only the first this many (config, seed) runs (compared on those; its time is then
    also given scaled to all runs, marked as such). None: all."""
    vectorized: bool = True
    """Also run the sweep vmapped (batched; not bit-identical to the loop, see envsched_runs)."""
    setup: SetupConfig = SetupConfig()
    out: Path = Path("runs/bench_sweep")


def grid(count: int) -> list[EnvSchedConfig]:
    points = list(itertools.product(LAMBDA_SIMS, ETAS))
    if not 1 <= count <= len(points):
        raise SystemExit(f"--configs must be 1..{len(points)}")
    return [EnvSchedConfig(lambda_sim=lam, eta=eta) for lam, eta in points[:count]]


def main(args: Args) -> dict:
    out = run_folder(args.out, args)
    t0 = time.perf_counter()
    setup = make_setup(args.setup)
    n = setup.structure.num_train
    configs = [dataclasses.replace(c, batch_size=args.batch_size, group_size=args.group_size) for c in grid(args.configs)]
    seeds = list(range(args.seeds))
    runs_total = len(configs) * len(seeds)
    print(f"N = {n} schedulable tasks ({args.setup.train_envs} x {args.setup.tasks_per_env}), setup "
          f"{time.perf_counter() - t0:.1f} s; {len(configs)} configs (lambda_sim x eta) x {len(seeds)} seeds x "
          f"{args.steps} steps = {runs_total} runs; B = {args.batch_size}, K = {args.group_size}; "
          f"{jax.devices()[0].platform} backend, {os.cpu_count()} CPUs")

    result = {"n": n, "configs": len(configs), "seeds": len(seeds), "steps": args.steps, "runs": runs_total,
              "batch_size": args.batch_size, "group_size": args.group_size, "chunk": args.chunk,
              "backend": jax.devices()[0].platform, "machine": platform.node(), "cpus": os.cpu_count(),
              "load_average_start": os.getloadavg()}
    modes = {"mapped": False, "vmapped": True} if args.vectorized else {"mapped": False}
    sweeps = {}
    for mode, vectorize in modes.items():
        first = envsched_runs(setup, configs, seeds, steps=args.steps, chunk=args.chunk, vectorize=vectorize)
        again = envsched_runs(setup, configs, seeds, steps=args.steps, chunk=args.chunk, vectorize=vectorize)
        assert np.array_equal(first.batch, again.batch)
        sweeps[mode] = again
        result[f"{mode}_first_s"], result[f"{mode}_s"] = first.seconds, again.seconds
        print(f"one program, runs {'vmapped (batched)' if vectorize else 'mapped (lax.map, one after the other)'}: "
              f"{again.seconds:.1f} s compiled, {first.seconds:.1f} s first call (compilation included), "
              f"{first.programs} program")
    if args.loop:
        pairs = [(c, s) for c in range(len(configs)) for s in range(len(seeds))][:args.loop_runs]
        t0 = time.perf_counter()
        logs = {(c, s): run_scheduler(setup, "envsched", steps=args.steps, seed=seeds[s], batch_size=args.batch_size,
                                      group_size=args.group_size, scheduler_kwargs={"config": configs[c]})
                for c, s in pairs}
        measured = time.perf_counter() - t0
        loop_s = measured * runs_total / len(pairs)
        result.update(loop_measured_s=measured, loop_runs=len(pairs), loop_s=loop_s)
        if len(pairs) < runs_total:
            print(f"Python loop (run_scheduler) on {len(pairs)} of the {runs_total} runs: {measured:.1f} s; "
                  f"scaled to all {runs_total} runs (used below): {loop_s:.1f} s")
        else:
            print(f"Python loop (run_scheduler, {runs_total} runs one after the other): {loop_s:.1f} s")
        print(f"\n{'figure':<48} {'issue asks':<10} {'one program':>22} {'loop':>8} {'ratio':>13}  same batches")
        label = f"{len(configs)} configs x {len(seeds)} seeds x {args.steps} steps, N = {n}"
        for mode, runs in sweeps.items():
            agree = {key: (log.batch == runs.batch[key]).all(axis=1) for key, log in logs.items()}
            same = sum(bool(a.all()) for a in agree.values())
            first_diff = sorted(int(np.argmin(a)) for a in agree.values() if not a.all())
            result[f"{mode}_same_batch_runs"] = same
            result[f"{mode}_first_difference_steps"] = first_diff
            result[f"{mode}_ratio"] = loop_s / runs.seconds
            result[f"{mode}_ratio_with_compile"] = loop_s / result[f"{mode}_first_s"]
            print(f"{label:<48} {'report':<10} {mode:>8} {runs.seconds:6.1f} s ({result[f'{mode}_first_s']:.0f} s) "
                  f"{loop_s:6.1f} s {loop_s / runs.seconds:5.2f}x ({loop_s / result[f'{mode}_first_s']:.2f}x)  "
                  f"{same} of {len(pairs)} runs" + (f" (first differences at steps {first_diff[:8]})" if first_diff else ""))
        print("(one program: the compiled call; in parentheses the first call, compilation included. The loop "
              "includes EnvSched's one compilation.)")
        if result["mapped_same_batch_runs"] != len(pairs):
            raise SystemExit("the mapped program and the loop selected different batches")
    result["load_average_end"] = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the start {result['load_average_start']}, at the end "
          f"{result['load_average_end']} on {os.cpu_count()} CPUs")
    (out / "bench_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out / 'bench_sweep.json'}")
    return result


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
