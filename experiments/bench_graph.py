"""Benchmark of the static graph build (foundation issue targets).

1. Full graph of the generated 51 x 50 = 2,550-task pool: six concrete views + abstract view +
   dense S_full and S_abs + candidate lists. Target: <= 30 s wall on the 2-core machine. Baseline
   measured in the same run: the dense matrices computed the obvious way, scikit-learn's
   ``cosine_similarity`` per view (float64) summed with the view weights.
2. Candidate lists only (no dense matrices) at N = 100,000. Target: < 5 min and < 8 GiB peak.
3. Optional (``--huge-n 1000000``, off by default: about half an hour): what a dense-free
   scheduler needs at that scale, built from a generated pool streamed environment by environment
   (``build_graph_stream``, with progress bars on a terminal): time per phase, peak resident memory
   beside the machine's 24 GiB, the feature rows' size per node (stored entries of the stacked
   concrete view and of the abstract view) and the number of distinct abstract rows (equal indices
   and data in storage order), then the time to save the artefact and to load it memory-mapped.

Each case runs in a fresh child process so that its peak resident memory (ru_maxrss) is its own;
"peak" below is the child's peak minus its resident size just before the measured phase.

Usage:
    python experiments/bench_graph.py
    python experiments/bench_graph.py --large-n 20000      # quicker second case
    python experiments/bench_graph.py --skip-large
    python experiments/bench_graph.py --skip-full --skip-large --huge-n 1000000   # only the third case
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
    huge_n: int = 0
    """Number of tasks of the streamed dense-free case (0: skip it; e.g. 1000000)."""
    skip_full: bool = False
    """Skip the 2,550-task full-graph case."""
    artefact_dir: Path = Path("runs/bench_graph_huge_artefact")
    """Where the huge case saves its artefact (removed afterwards)."""
    out: Path = Path("runs/bench_graph.json")
    """Where to write the figures of the first two cases as JSON."""
    huge_out: Path = Path("runs/bench_graph_huge.json")
    """Where to write the figures of the huge case as JSON."""


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


MACHINE_GIB = 24


def _huge_case(n: int, artefact_dir: str, queue) -> None:
    import shutil
    import threading

    import numpy as np

    from envsched_jax.graph.artefact import load_graph, save_graph
    from envsched_jax.graph.build import GraphConfig, build_graph_stream
    from envsched_jax.pool.generator import generated_pool_stream

    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:  # resident memory every second, to tell the phases' peaks apart
        while not stop.wait(1.0):
            samples.append((time.perf_counter(), _rss_mib()))

    threading.Thread(target=sample, daemon=True).start()
    base_rss = _rss_mib()
    t_start = time.perf_counter()
    graph = build_graph_stream(generated_pool_stream(n, seed=0), GraphConfig(dense="never"), progress=True)
    wall = time.perf_counter() - t_start
    build_peak = _peak_mib()
    phase_peaks, t = {}, t_start
    for phase, seconds in graph.timings.items():
        if phase in ("generate", "hash") or seconds < 1.0:  # interleaved with extraction / not run
            continue
        end = t + (seconds if phase != "extract" else graph.timings.get("generate", 0) + graph.timings["hash"] + seconds)
        phase_peaks[phase] = max((r for s_, r in samples if t <= s_ <= end), default=float("nan"))
        t = end

    weights = graph.config.concrete_weights()
    concrete_nnz = sum(graph.features[v].nnz for v, w in weights.items() if w > 0 and graph.features[v].shape[1] > 0)
    abstract = graph.features["abstract"]
    rows = {(abstract.indices[a:b].tobytes(), abstract.data[a:b].tobytes())
            for a, b in zip(abstract.indptr[:-1].tolist(), abstract.indptr[1:].tolist())}

    directory = Path(artefact_dir)
    t0 = time.perf_counter()
    save_graph(graph, directory, overwrite=True)
    save_s = time.perf_counter() - t0
    disk = sum(f.stat().st_size for f in directory.iterdir())
    rss_before_load = _rss_mib()
    t0 = time.perf_counter()
    loaded = load_graph(directory, mmap=True)
    load_s = time.perf_counter() - t0
    load_rss = _rss_mib() - rss_before_load
    same = all(np.array_equal(getattr(graph.features[v], part), getattr(loaded.features[v], part))
               for v in graph.features for part in ("data", "indices", "indptr"))
    del loaded
    shutil.rmtree(directory)
    stop.set()
    queue.put({
        "n": n, "wall_s": wall, "timings_s": graph.timings, "base_rss_mib": base_rss,
        "process_peak_mib": build_peak, "peak_mib": build_peak - base_rss, "phase_peak_rss_mib": phase_peaks,
        "machine_gib": MACHINE_GIB,
        "feature_nnz": {v: int(m.nnz) for v, m in graph.features.items()},
        "feature_columns": {v: int(m.shape[1]) for v, m in graph.features.items()},
        "concrete_stacked_nnz_per_node": concrete_nnz / n, "abstract_nnz_per_node": abstract.nnz / n,
        "concrete_stacked_bytes_per_node": concrete_nnz * 8 / n + 4,  # float32 data + int32 index, + indptr
        "abstract_bytes_per_node": abstract.nnz * (abstract.data.itemsize + abstract.indices.itemsize) / n
        + abstract.indptr.itemsize,
        "distinct_abstract_rows": len(rows),
        "sparse_features_mib": graph.feature_bytes() / MIB, "candidates_mib": graph.candidate_bytes() / MIB,
        "save_s": save_s, "artefact_mib": disk / MIB, "load_mmap_s": load_s, "load_rss_mib": load_rss,
        "loaded_features_identical": bool(same),
    })


def main(args: Args) -> None:
    if args.huge_n:
        r = run_in_child(_huge_case, args.huge_n, str(args.artefact_dir))
        print(f"[dense-free graph, streamed, N={r['n']:,}]  wall {r['wall_s']:.0f} s  "
              + ", ".join(f"{k} {v:.1f} s" for k, v in r["timings_s"].items()))
        print(f"  peak resident memory {r['process_peak_mib'] / 1024:.2f} GiB of the machine's {MACHINE_GIB} GiB "
              f"(+{r['peak_mib'] / 1024:.2f} GiB over the {r['base_rss_mib'] / 1024:.2f} GiB before the build); "
              "per phase " + ", ".join(f"{k} {v / 1024:.2f}" for k, v in r["phase_peak_rss_mib"].items()) + " GiB")
        print(f"  feature rows: stacked concrete view {r['concrete_stacked_nnz_per_node']:.1f} entries/node "
              f"({r['concrete_stacked_bytes_per_node']:.0f} B), abstract view {r['abstract_nnz_per_node']:.1f} "
              f"entries/node ({r['abstract_bytes_per_node']:.0f} B); {r['distinct_abstract_rows']:,} distinct "
              f"abstract rows; features {r['sparse_features_mib'] / 1024:.2f} GiB, candidate lists "
              f"{r['candidates_mib']:.0f} MiB")
        _write(args.huge_out, {"huge_stream": r})
        print(f"  artefact: save {r['save_s']:.1f} s ({r['artefact_mib'] / 1024:.2f} GiB on disk), load "
              f"memory-mapped {r['load_mmap_s']:.1f} s (+{r['load_rss_mib']:.0f} MiB resident), features "
              f"identical: {r['loaded_features_identical']}")
    results = {}
    if not args.skip_full:
        _print_full(results.setdefault("full_graph_2550", run_in_child(_full_graph_case)))
    if not args.skip_large:
        _print_large(results.setdefault("candidates_large", run_in_child(_candidate_case, args.large_n)))
    if results:
        _write(args.out, results)


def _print_full(r: dict) -> None:
    print(f"[graph build, N={r['n']}]  wall {r['wall_s']:.2f} s (target <= 30 s)   "
          + ", ".join(f"{k} {v:.2f} s" for k, v in r["timings_s"].items()))
    print(f"  peak memory +{r['peak_mib']:.0f} MiB; sparse features {r['sparse_features_mib']:.2f} MiB "
          f"(paper 85.87 MiB), two dense matrices {r['dense_mib']:.2f} MiB (paper 42.59 MiB), "
          f"candidate lists {r['candidates_mib']:.2f} MiB")
    print(f"  dense phase: ours {r['ours_dense_s']:.2f} s vs per-view sklearn cosine_similarity "
          f"{r['baseline_dense_s']:.2f} s -> {r['baseline_dense_s'] / r['ours_dense_s']:.2f}x; "
          f"max |diff| {r['max_abs_diff_vs_baseline']:.1e}")


def _print_large(r: dict) -> None:
    print(f"[candidate lists, N={r['n']}]  wall {r['wall_s']:.1f} s (target < 300 s), peak memory "
          f"+{r['peak_mib'] / 1024:.2f} GiB (target < 8 GiB; whole process {r['process_peak_mib'] / 1024:.2f} GiB)  "
          + ", ".join(f"{k} {v:.1f} s" for k, v in r["timings_s"].items()))
    print(f"  pool generation {r['generate_s']:.1f} s (not counted); sparse features "
          f"{r['sparse_features_mib']:.0f} MiB; candidate lists {r['candidates_mib']:.0f} MiB; "
          f"dense matrices would need {r['dense_would_need_mib'] / 1024:.1f} GiB")


def _write(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"figures written to {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
