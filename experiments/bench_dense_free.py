"""Benchmark of EnvSched's step without dense matrices (issue 13, items 1 and 2).

For each pool size N (generated pools, 50 tasks per environment) the graph is built without
dense matrices (``GraphConfig(dense='never')``; its build time and peak memory are reported),
saved, and loaded memory-mapped in a fresh child process that runs
``EnvSched(graph, similarity='features')`` (:mod:`envsched_jax.sched.dense_free`): B = 64,
K = 8, the paper's defaults, rewards from a fixed-seed generator of mixed groups. Reported per N:
the cold start (step 0), the first selecting step (with compilation), the median step (select +
observe through the shared API, after ``history`` steps) beside the target, and the child's peak
resident memory beside 8 GiB.

At the sizes in ``dense_at`` (default 20,000) the same run is repeated in another child on the
dense path (a graph with the dense matrices), with the same reward stream: the ratio of the two
step times, and the number of steps at which the two picked the same batch (they must all be
equal: the dense-free path is exact).

Targets (issue 13): step <= 3 ms at N = 2,550, <= 20 ms at 20,000, <= 100 ms at 100,000,
<= 1 s at 1,000,000, peak memory <= 8 GiB.

Usage:
    python experiments/bench_dense_free.py                              # 2,550, 20,000, 100,000
    python experiments/bench_dense_free.py --sizes 2550 20000 100000 1000000 --graph-dir runs/graphs
    python experiments/bench_dense_free.py --sizes 2550 --timed-steps 5
"""

from __future__ import annotations

import dataclasses
import json
import resource
import tempfile
import time
from pathlib import Path

import tyro
from benchlib import run_in_child

TARGET_MS = {2550: 3.0, 20000: 20.0, 100000: 100.0, 1000000: 1000.0}
MEMORY_TARGET_GIB = 8.0


@dataclasses.dataclass(frozen=True)
class Args:
    sizes: tuple[int, ...] = (2550, 20000, 100000)
    """Pool sizes N (generated pools of 50 tasks per environment)."""
    dense_at: tuple[int, ...] = (20000,)
    """Sizes at which the dense path runs too, for the ratio and the batch check."""
    history: int = 30
    """Steps run before timing (the cold start included)."""
    timed_steps: int = 10
    """Steps timed after the history (median reported)."""
    refresh: int = 8
    """EnvSched's ``refresh`` (candidates per round within the exploitation shortlist)."""
    graph_dir: Path | None = None
    """Keep the built graphs here and reuse them (a 10^6-task build takes many minutes); None: a
    temporary folder."""
    out: Path = Path("runs/bench_dense_free.json")


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _build(n: int, folder: str, dense: bool, queue) -> None:
    from envsched_jax.graph.artefact import save_graph
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.pool.generator import generate_pool_of_size

    before = _rss_gib()
    t0 = time.perf_counter()
    pool = generate_pool_of_size(n, seed=0)
    graph = build_graph(pool, GraphConfig(dense="always" if dense else "never"), progress=True)
    seconds = time.perf_counter() - t0
    save_graph(graph, folder, overwrite=True)
    queue.put({"build_s": seconds, "build_peak_gib": _rss_gib(), "build_start_gib": before,
               "timings": dict(graph.timings)})


def _measure(folder: str, similarity: str, args: Args, queue) -> None:
    import jax
    import numpy as np

    from envsched_jax.graph.artefact import load_graph
    from envsched_jax.sched import EnvSched, EnvSchedConfig

    graph = load_graph(folder, mmap=True)
    config = EnvSchedConfig()
    t0 = time.perf_counter()
    sched = EnvSched(graph, config, similarity=similarity, refresh=args.refresh)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    batches, times = [], []
    for t in range(args.history + args.timed_steps):
        k = rng.integers(0, 3, size=config.batch_size)
        p = rng.random(config.batch_size)
        g = config.group_size
        rewards = np.where(k[:, None] == 0, (rng.random((config.batch_size, g)) < p[:, None]).astype(float),
                           np.where(k[:, None] == 1, np.round(rng.random((config.batch_size, g)) * p[:, None], 2),
                                    np.repeat(p[:, None], g, 1)))
        t0 = time.perf_counter()
        ids = sched.select(t)
        sched.observe(t, ids, rewards)
        jax.block_until_ready(sched.state)
        times.append(time.perf_counter() - t0)
        batches.append([sched._index[i] for i in ids])
    timed = times[args.history:]
    queue.put({"n": graph.num_nodes, "similarity": similarity, "setup_s": setup, "cold_start_s": times[0],
               "first_step_s": times[1], "step_ms": 1000 * float(np.median(timed)),
               "step_ms_min": 1000 * float(np.min(timed)), "peak_rss_gib": _rss_gib(), "batches": batches})


def main(args: Args) -> None:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.graph_dir) if args.graph_dir else Path(tmp)
        for n in args.sizes:
            for dense in ((False, True) if n in args.dense_at else (False,)):
                folder = root / f"generated_{n}_{'dense' if dense else 'features'}"
                if (folder / "manifest.json").is_file():
                    build = {"reused": str(folder)}
                    print(f"N={n:>7}: reusing the graph in {folder}", flush=True)
                else:
                    build = run_in_child(_build, n, str(folder), dense)
                    t = build["timings"]
                    phases = ", ".join(f"{k} {v:.1f}" for k, v in t.items() if isinstance(v, float))
                    print(f"N={n:>7}: graph ({'dense' if dense else 'no dense matrices'}) built in "
                          f"{build['build_s']:.1f} s ({phases}), peak RSS {build['build_peak_gib']:.2f} GiB "
                          f"(limit 24 GiB)", flush=True)
                r = run_in_child(_measure, str(folder), "dense" if dense else "features", args)
                r["graph"] = build
                results.append(r)
                target = TARGET_MS.get(n)
                print(f"N={n:>7} [{r['similarity']:>8}]: step {r['step_ms']:.2f} ms (median of {args.timed_steps}, "
                      f"min {r['step_ms_min']:.2f}; target <= {target if target else float('nan'):g} ms), "
                      f"cold start {r['cold_start_s']:.2f} s, first step (compiles) {r['first_step_s']:.2f} s, "
                      f"setup {r['setup_s']:.2f} s, peak RSS {r['peak_rss_gib']:.2f} GiB "
                      f"(target <= {MEMORY_TARGET_GIB:g})", flush=True)
            pair = [r for r in results if r["n"] == n]
            if len(pair) == 2:
                free, dense_r = pair
                same = sum(a == b for a, b in zip(free["batches"], dense_r["batches"]))
                print(f"N={n:>7}: dense path {dense_r['step_ms']:.2f} ms vs dense-free {free['step_ms']:.2f} ms "
                      f"-> dense-free / dense = {free['step_ms'] / dense_r['step_ms']:.2f}; same batch at "
                      f"{same} of {len(free['batches'])} steps", flush=True)
                free["dense_step_ms"] = dense_r["step_ms"]
                free["same_batches_as_dense"] = same
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for r in results:
        r.pop("batches")
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
