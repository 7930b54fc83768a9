"""Benchmark of the static graph build (foundation issue targets).

1. Full graph of the generated 51 x 50 = 2,550-task pool: six concrete views + abstract view +
   dense S_full and S_abs + candidate lists. Target: <= 30 s wall on the 2-core machine. Baseline
   measured in the same run: the dense matrices computed the obvious way, scikit-learn's
   ``cosine_similarity`` per view (float64) summed with the view weights.
2. Candidate lists only (no dense matrices) at N = 100,000. Target: < 5 min and < 8 GiB peak.

Each case runs in a fresh child process so that its peak resident memory (ru_maxrss) is its own;
"peak" below is the child's peak minus its resident size just before the measured phase.

Usage:
    python experiments/bench_graph.py
    python experiments/bench_graph.py --large-n 20000      # quicker second case
    python experiments/bench_graph.py --skip-large
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from pathlib import Path

import tyro
from benchlib import run_in_child

MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Args:
    large_n: int = 100_000
    """Number of tasks of the candidate-list case."""
    skip_large: bool = False
    """Skip the candidate-list case."""
    out: Path = Path("runs/bench_graph.json")
    """Where to write the figures as JSON."""


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _full_graph_case(queue) -> None:
    import numpy as np
    from sklearn.metrics.pairwise import cosine_similarity

    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.graph.views import VIEW_NAMES
    from envsched_jax.pool.generator import generate_pool

    pool = generate_pool(51, 50, seed=0)
    base_rss = _rss_mib()
    t0 = time.perf_counter()
    graph = build_graph(pool, GraphConfig())
    wall = time.perf_counter() - t0
    peak = _peak_mib() - base_rss

    t0 = time.perf_counter()
    naive = sum(w * cosine_similarity(graph.features[v]) for v, w in zip(VIEW_NAMES, graph.config.view_weights))
    naive_abs = cosine_similarity(graph.features["abstract"])
    naive_wall = time.perf_counter() - t0
    off = ~np.eye(graph.num_nodes, dtype=bool)
    max_err = float(max(np.abs(naive - graph.s_full)[off].max(), np.abs(naive_abs - graph.s_abs)[off].max()))
    queue.put({
        "n": graph.num_nodes, "wall_s": wall, "timings_s": graph.timings, "peak_mib": peak,
        "sparse_features_mib": graph.feature_bytes() / MIB, "dense_mib": graph.dense_bytes() / MIB,
        "candidates_mib": graph.candidate_bytes() / MIB,
        "baseline_dense_s": naive_wall, "ours_dense_s": graph.timings["dense"], "max_abs_diff_vs_baseline": max_err,
    })


def _candidate_case(n: int, queue) -> None:
    from envsched_jax.graph.build import GraphConfig, build_graph
    from envsched_jax.pool.generator import generate_pool_of_size

    t0 = time.perf_counter()
    pool = generate_pool_of_size(n, seed=0)
    gen_wall = time.perf_counter() - t0
    base_rss = _rss_mib()
    t0 = time.perf_counter()
    graph = build_graph(pool, GraphConfig(dense="never"))
    wall = time.perf_counter() - t0
    queue.put({"n": n, "generate_s": gen_wall, "wall_s": wall, "timings_s": graph.timings,
               "peak_mib": _peak_mib() - base_rss, "process_peak_mib": _peak_mib(),
               "sparse_features_mib": graph.feature_bytes() / MIB,
               "candidates_mib": graph.candidate_bytes() / MIB,
               "dense_would_need_mib": 2 * n * n * 4 / MIB})


def main(args: Args) -> None:
    results = {"full_graph_2550": run_in_child(_full_graph_case)}
    r = results["full_graph_2550"]
    print(f"[graph build, N={r['n']}]  wall {r['wall_s']:.2f} s (target <= 30 s)   "
          + ", ".join(f"{k} {v:.2f} s" for k, v in r["timings_s"].items()))
    print(f"  peak memory +{r['peak_mib']:.0f} MiB; sparse features {r['sparse_features_mib']:.2f} MiB "
          f"(paper 85.87 MiB), two dense matrices {r['dense_mib']:.2f} MiB (paper 42.59 MiB), "
          f"candidate lists {r['candidates_mib']:.2f} MiB")
    print(f"  dense phase: ours {r['ours_dense_s']:.2f} s vs per-view sklearn cosine_similarity "
          f"{r['baseline_dense_s']:.2f} s -> {r['baseline_dense_s'] / r['ours_dense_s']:.2f}x; "
          f"max |diff| {r['max_abs_diff_vs_baseline']:.1e}")
    if not args.skip_large:
        results["candidates_large"] = r = run_in_child(_candidate_case, args.large_n)
        print(f"[candidate lists, N={r['n']}]  wall {r['wall_s']:.1f} s (target < 300 s), peak memory "
              f"+{r['peak_mib'] / 1024:.2f} GiB (target < 8 GiB; whole process {r['process_peak_mib'] / 1024:.2f} GiB)  "
              + ", ".join(f"{k} {v:.1f} s" for k, v in r["timings_s"].items()))
        print(f"  pool generation {r['generate_s']:.1f} s (not counted); sparse features "
              f"{r['sparse_features_mib']:.0f} MiB; candidate lists {r['candidates_mib']:.0f} MiB; "
              f"dense matrices would need {r['dense_would_need_mib'] / 1024:.1f} GiB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
