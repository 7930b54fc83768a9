"""Benchmark of one full EnvSched step (score pass + batch selection + observe) after compilation.

Targets (scheduler-core issue), B = 64, K = 8, after a history of 50 steps:
- N = 2,550 (generated 51 x 50 pool): <= 10 ms per step, and >= 5x faster than the plain NumPy
  reference (tests/reference_envsched.py) measured in the same run on the same history;
- N = 20,000 (dense matrices): <= 250 ms per step, peak memory <= 4 GiB;
- compile time for each N.
Targets (issue 13, "a fair baseline"):
- >= 5x faster than the vectorised NumPy implementation of the same step
  (tests/vectorized_envsched.py: what a careful NumPy user would write; the loop reference above
  is written for readability, so its ratio says little), at N = 2,550 and 20,000, same run;
- the shared API's host overhead <= 0.5 ms per step.

Each N runs in a fresh child process. The graph is built and saved first (not timed), then the
child loads it memory-mapped, so the peak resident memory it reports is the scheduler's (the
device copy of S_full, rows of S_abs read on demand, the state), not the graph build's. Rewards
come from a fixed-seed generator of mixed binary / partial-credit / constant groups.

The vectorised baseline runs in the same child after EnvSched (the peak RSS above is taken
before it starts), with the same config (float32, as the scheduler), on the same memory-mapped
matrices: it replays the EnvSched run's first ``history`` steps (observe only), then times
``vectorized_steps`` steps (its own select, then observe of the batch EnvSched picked at that
step, so both time the same states) and counts how many of its batches equal EnvSched's
(float32 rounding may split a tie differently; float64 agreement is a test). The ratio is
vectorised step / EnvSched step (the EnvSched step goes through the shared API, the vectorised
one works on node indices, so the ratio is conservative); the ratio to EnvSched's compiled
functions alone is printed too.

Host overhead (``overhead_steps`` further steps, rewards drawn beforehand), two figures:
- Random: ``select + observe`` of a RandomScheduler minus its jitted kernel
  (``sched.random.random_batch``, timed alone with the same inputs). Random does nothing else,
  so this is the shared API itself (id mapping, validation, metrics): the figure the <= 0.5 ms
  target applies to.
- EnvSched: ``select + observe`` (blocking until the new state is ready) minus the two compiled
  functions timed alone on the same state and inputs (``_score_and_select``, ``_observe_update``).
  This adds EnvSched's own host work (one device-to-host transfer per select, sorting the batch
  and reading its S_abs rows from the memory map for observe) to the shared API's.
Both are medians over the steps: median(full) - median(kernels).

With ``--schedulers`` the same step (select + observe, after compilation, after the same history)
is timed for the baseline schedulers too (dps, mopps, leeps_reconstruction, random; B = 64,
K = 8, their default configs), each in its own child process on the same saved graph. Only
EnvSched gets the NumPy comparisons and the targets; the default (``envsched`` alone) prints what
it printed before plus the vectorised baseline and host overhead lines.

Usage:
    python experiments/bench_scheduler.py
    python experiments/bench_scheduler.py --sizes 2550 --timed-steps 10
    python experiments/bench_scheduler.py --sizes 2550 --reference-steps 0    # no loop reference
    python experiments/bench_scheduler.py --schedulers envsched dps mopps leeps_reconstruction random
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import tyro
from benchlib import run_in_child

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Args:
    sizes: tuple[int, ...] = (2550, 20000)
    """Pool sizes N (generated pools of 50 tasks per environment)."""
    history: int = 50
    """Steps run before timing."""
    timed_steps: int = 20
    """Steps timed after the history (median reported)."""
    reference_steps: int = 3
    """Steps of the NumPy reference timed at N = 2,550."""
    vectorized_steps: int = 20
    """Steps of the vectorised NumPy baseline timed at each N (0: skip; at most timed_steps)."""
    overhead_steps: int = 20
    """Steps timed for the host-overhead figures (0: skip)."""
    schedulers: tuple[str, ...] = ("envsched",)
    """Registered schedulers to time (envsched, dps, mopps, leeps_reconstruction, random)."""
    out: Path = Path("runs/bench_scheduler.json")


def _rewards(rng, b, k):
    import numpy as np

    kind = rng.integers(0, 3, size=b)
    p = rng.random(b)
    binary = (rng.random((b, k)) < p[:, None]).astype(float)
    partial = np.round(rng.random((b, k)) * p[:, None], 2)
    return np.where(kind[:, None] == 0, binary, np.where(kind[:, None] == 1, partial, np.repeat(p[:, None], k, 1)))


def _build(n: int, folder: str, queue) -> None:
    from envsched_jax.graph.artefact import save_graph
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.pool.generator import generate_pool_of_size

    t0 = time.perf_counter()
    graph = build_graph(generate_pool_of_size(n, seed=0), GraphConfig(dense="always"))
    save_graph(graph, folder, overwrite=True)
    queue.put(time.perf_counter() - t0)


def _time_steps(step, first_step: int, args: Args) -> dict[str, float]:
    """Run ``step(first_step)`` (trace + compile + run), the rest of the history, then time
    ``args.timed_steps`` steps: median / min step time, compile time and peak RSS."""
    import numpy as np

    t0 = time.perf_counter()
    step(first_step)
    first = time.perf_counter() - t0
    for t in range(first_step + 1, args.history):
        step(t)
    times = []
    for t in range(args.history, args.history + args.timed_steps):
        t0 = time.perf_counter()
        step(t)
        times.append(time.perf_counter() - t0)
    steady = float(np.median(times))
    return {"step_ms": 1000 * steady, "step_ms_min": 1000 * min(times), "compile_s": first - steady,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def _measure(folder: str, args: Args, queue) -> None:
    import numpy as np

    from envsched_jax.graph.artefact import load_graph
    from envsched_jax.sched import EnvSched, EnvSchedConfig

    graph = load_graph(folder, mmap=True)
    config = EnvSchedConfig()
    t0 = time.perf_counter()
    sched = EnvSched(graph, config)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    history = []

    def step(t):
        ids = sched.select(t)
        rewards = _rewards(rng, config.batch_size, config.group_size)
        sched.observe(t, ids, rewards)
        history.append(([sched._index[i] for i in ids], rewards))

    step(0)                                   # cold start (NumPy, static structure)
    result = {"n": graph.num_nodes, "setup_s": setup, **_time_steps(step, 1, args)}

    if graph.num_nodes <= 5000 and args.reference_steps:
        sys.path.insert(0, str(ROOT / "tests"))
        from reference_envsched import RefConfig, ReferenceEnvSched

        ref = ReferenceEnvSched(np.asarray(graph.s_full, np.float64), np.asarray(graph.s_abs, np.float64),
                                np.asarray(graph.env_index), RefConfig())
        for t, (nodes, rewards) in enumerate(history[: args.history]):
            ref.observe(t, nodes, rewards)
        ref_times = []
        for t in range(args.history, args.history + args.reference_steps):
            nodes, rewards = history[t]
            t0 = time.perf_counter()
            ref.select(t)
            ref.observe(t, nodes, rewards)
            ref_times.append(time.perf_counter() - t0)
        result["reference_step_ms"] = 1000 * float(np.median(ref_times))
    if args.vectorized_steps:
        result.update(_vectorized(graph, config, history, args))
    if args.overhead_steps:
        result.update(_envsched_overhead(sched, config, rng, args))
        result.update(_random_overhead(graph, config, args))
    queue.put(result)


def _vectorized(graph, config, history, args: Args) -> dict:
    """Time the vectorised NumPy step on EnvSched's timed steps (module docstring)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from vectorized_envsched import VectorizedEnvSched

    steps = min(args.vectorized_steps, args.timed_steps)
    vec = VectorizedEnvSched(graph.s_full, graph.s_abs, np.asarray(graph.env_index), config)
    for t in range(args.history):
        vec.observe(t, *history[t])
    times, same = [], 0
    for t in range(args.history, args.history + steps):
        nodes, rewards = history[t]
        t0 = time.perf_counter()
        picked, _ = vec.select(t)
        vec.observe(t, nodes, rewards)
        times.append(time.perf_counter() - t0)
        same += sorted(picked) == sorted(nodes)
    return {"vectorized_step_ms": 1000 * float(np.median(times)), "vectorized_step_ms_min": 1000 * min(times),
            "vectorized_steps": steps, "vectorized_same_batches": same, "vectorized_dtype": config.dtype}


def _envsched_overhead(sched, config, rng, args: Args) -> dict:
    """EnvSched's select + observe minus its two compiled functions alone (module docstring)."""
    import jax
    import numpy as np

    full, select_k, observe_k = [], [], []
    first = args.history + args.timed_steps
    for t in range(first, first + args.overhead_steps):
        rewards = _rewards(rng, config.batch_size, config.group_size)
        state = sched.state
        t0 = time.perf_counter()
        jax.block_until_ready(sched._step_fn(state, sched._hyper, sched._s_full, sched._env))
        select_k.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids = sched.select(t)
        t_select = time.perf_counter() - t0
        # the observe kernel's inputs, as EnvSched._observe prepares them (not timed here)
        nodes = np.sort(np.array([sched._index[i] for i in ids]))
        row = {n: k for k, n in enumerate(sched._index[i] for i in ids)}
        args_k = (state, nodes.astype(np.int32), rewards[[row[n] for n in nodes]].astype(config.dtype),
                  sched._s_full, np.asarray(sched._s_abs[nodes]), sched._env, sched._env_members)
        t0 = time.perf_counter()
        jax.block_until_ready(sched._observe_fn(*args_k))
        observe_k.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sched.observe(t, ids, rewards)
        jax.block_until_ready(sched.state)
        full.append(t_select + time.perf_counter() - t0)
    med = {name: 1000 * float(np.median(v)) for name, v in
           (("full", full), ("select", select_k), ("observe", observe_k))}
    kernels = 1000 * float(np.median(np.add(select_k, observe_k)))
    return {"envsched_api_step_ms": med["full"], "envsched_kernels_ms": kernels,
            "envsched_select_kernel_ms": med["select"], "envsched_observe_kernel_ms": med["observe"],
            "envsched_host_overhead_ms": med["full"] - kernels}


def _random_overhead(graph, config, args: Args) -> dict:
    """Random's select + observe minus its jitted kernel alone: the shared API's host overhead."""
    import jax
    import numpy as np

    from envsched_jax.sched import RandomScheduler
    from envsched_jax.sched.random import random_batch

    sched = RandomScheduler(graph, batch_size=config.batch_size, group_size=config.group_size, seed=0)
    rng = np.random.default_rng(1)
    full, kernel = [], []
    for t in range(args.overhead_steps + 5):   # the first steps compile and warm up
        rewards = _rewards(rng, config.batch_size, config.group_size)
        t0 = time.perf_counter()
        jax.block_until_ready(random_batch(sched._device_key, np.uint32(t), num_nodes=sched.num_nodes,
                                           batch_size=sched.batch_size))
        k = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = sched.select(t)
        sched.observe(t, ids, rewards)
        if t >= 5:
            kernel.append(k)
            full.append(time.perf_counter() - t0)
    full_ms, kernel_ms = 1000 * float(np.median(full)), 1000 * float(np.median(kernel))
    return {"random_api_step_ms": full_ms, "random_kernel_ms": kernel_ms, "api_host_overhead_ms": full_ms - kernel_ms}


def _measure_baseline(folder: str, name: str, args: Args, queue) -> None:
    """Time one registered baseline scheduler (default config, B = 64, K = 8) like EnvSched."""
    import numpy as np

    from envsched_jax.graph.artefact import load_graph
    from envsched_jax.sched import make_scheduler

    graph = load_graph(folder, mmap=True)
    batch_size, group_size = 64, 8
    t0 = time.perf_counter()
    sched = make_scheduler(name, graph, batch_size=batch_size, group_size=group_size, seed=0)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(0)

    def step(t):
        ids = sched.select(t)
        sched.observe(t, ids, _rewards(rng, batch_size, group_size))

    queue.put({"scheduler": name, "n": graph.num_nodes, "setup_s": setup, **_time_steps(step, 0, args)})


def main(args: Args) -> None:
    from envsched_jax.sched import registered_schedulers

    unknown = sorted(set(args.schedulers) - set(registered_schedulers()))
    if unknown:
        raise SystemExit(f"unknown scheduler(s) {unknown}; registered: {', '.join(registered_schedulers())}")
    results = []
    targets = {2550: 10.0, 20000: 250.0}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            folder = str(Path(tmp) / f"graph_{n}")
            build_s = run_in_child(_build, n, folder)
            if "envsched" in args.schedulers:
                r = run_in_child(_measure, folder, args)
                r["graph_build_s"] = build_s
                results.append(r)
                line = (f"N={r['n']:>6}: step {r['step_ms']:.2f} ms (median of {args.timed_steps}; min "
                        f"{r['step_ms_min']:.2f}; target <= {targets.get(n, float('nan')):.0f} ms), compile "
                        f"{r['compile_s']:.2f} s, peak RSS {r['peak_rss_gib']:.2f} GiB")
                if "reference_step_ms" in r:
                    line += (f"; NumPy reference {r['reference_step_ms']:.0f} ms per step -> "
                             f"{r['reference_step_ms'] / r['step_ms']:.0f}x (target >= 5x)")
                print(line, flush=True)
                if "vectorized_step_ms" in r:
                    r["vectorized_ratio"] = r["vectorized_step_ms"] / r["step_ms"]
                    extra = ""
                    if "envsched_kernels_ms" in r:
                        r["vectorized_ratio_kernels"] = r["vectorized_step_ms"] / r["envsched_kernels_ms"]
                        extra = (f"; {r['vectorized_ratio_kernels']:.2f}x EnvSched's compiled functions alone "
                                 f"({r['envsched_kernels_ms']:.2f} ms)")
                    print(f"N={r['n']:>6}: vectorised NumPy step {r['vectorized_step_ms']:.2f} ms (median of "
                          f"{r['vectorized_steps']}; min {r['vectorized_step_ms_min']:.2f}; {r['vectorized_dtype']}; "
                          f"same batch as EnvSched at {r['vectorized_same_batches']} of {r['vectorized_steps']} steps) "
                          f"-> EnvSched's step is {r['vectorized_ratio']:.2f}x faster (target >= 5x){extra}", flush=True)
                if "api_host_overhead_ms" in r:
                    print(f"N={r['n']:>6}: host overhead per step: shared API (Random select + observe "
                          f"{r['random_api_step_ms']:.3f} ms - jitted kernel {r['random_kernel_ms']:.3f} ms) "
                          f"{r['api_host_overhead_ms']:.3f} ms (target <= 0.5 ms); EnvSched (select + observe "
                          f"{r['envsched_api_step_ms']:.2f} ms - compiled functions {r['envsched_kernels_ms']:.2f} ms) "
                          f"{r['envsched_host_overhead_ms']:.2f} ms", flush=True)
            for name in args.schedulers:
                if name == "envsched":
                    continue
                r = run_in_child(_measure_baseline, folder, name, args)
                r["graph_build_s"] = build_s
                results.append(r)
                print(f"N={r['n']:>6}, {name}: step {r['step_ms']:.2f} ms (median of {args.timed_steps}; min "
                      f"{r['step_ms_min']:.2f}), compile {r['compile_s']:.2f} s, setup {r['setup_s']:.2f} s, "
                      f"peak RSS {r['peak_rss_gib']:.2f} GiB", flush=True)
    if "envsched" in args.schedulers:
        print("paper: 34.93 s per scheduling step at N = 2,550")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
