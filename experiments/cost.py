"""Scheduling cost (paper section 3.3.2): per-step scheduling time and memory vs pool size N, for
EnvSched and the baseline schedulers, beside the paper's figures at N = 2,550.

Time: the measurement of experiments/bench_scheduler.py, imported from it (not copied): for each
N a generated pool of 50 tasks per environment is built and saved (not timed), then each
scheduler runs in a fresh child process on the memory-mapped graph: ``--history`` steps of
synthetic rewards, then the median of ``--timed-steps`` select + observe steps (after compilation).
Memory: the graph's sparse TF-IDF features, the two dense float32 matrices and the candidate lists
(bytes recorded in the graph's manifest), and each scheduler's state (the bytes of every array in
its ``state_dict()``, measured in its own child process right after construction; all states
have fixed capacity, so the size does not change with the step). EnvSched's neighbour lists
(``nbr_*``) are shown apart: the closest counterpart of the paper's "neighbor and progress state".

The paper's timing (34.93 s per step, 6,985.94 s over 200 steps) is its own Python backend on the
training cluster; ours is this machine's CPU with jitted kernels, so the ratio says little beyond
"both are small next to a GRPO step".

Usage:
    python experiments/cost.py                               # N = 2,550 .. 20,000, all schedulers, ~6 min
    python experiments/cost.py --sizes 2550 --schedulers envsched random --out runs/cost-quick
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import tyro
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scheduler  # noqa: E402  (experiments/ is not a package)
from benchlib import run_in_child  # noqa: E402

PAPER = {"n": 2550, "step_s": 34.93, "sparse_features_mib": 85.87, "neighbour_progress_state_mib": 1.24,
         "dense_mib": 42.59}
MIB = 2**20
MIN_SIZE = 1600


@dataclasses.dataclass(frozen=True)
class Args:
    sizes: tuple[int, ...] = (2550, 5000, 10000, 20000)
    """Pool sizes N (generated pools of 50 tasks per environment; dense matrices at every N). At least
    1,600: EnvSched's cold start at B = 64 takes at most two tasks per environment, so needs 32."""
    schedulers: tuple[str, ...] = ("envsched", "dps", "mopps", "leeps_reconstruction", "random")
    """Registered schedulers to measure."""
    history: int = 50
    """Steps run before timing."""
    timed_steps: int = 20
    """Steps timed after the history (median reported)."""
    out: Path = Path("runs/cost")
    """Run folder (cost.csv, cost.png)."""


def _state_bytes(folder: str, names: tuple[str, ...], queue) -> None:
    """Child process: bytes of each scheduler's state arrays on the saved graph."""
    from envsched_jax.graph.artefact import load_graph
    from envsched_jax.sched import make_scheduler

    graph = load_graph(folder, mmap=True)
    result = {}
    for name in names:
        arrays = make_scheduler(name, graph, batch_size=64, group_size=8, seed=0).state_dict()["arrays"]
        result[name] = {"state_bytes": int(sum(a.nbytes for a in arrays.values())),
                        "neighbour_bytes": int(sum(a.nbytes for k, a in arrays.items() if k.startswith("nbr_")))}
    queue.put(result)


def measure_size(n: int, args: Args, folder: str) -> list[dict]:
    """One row per scheduler at pool size n."""
    build_s = run_in_child(bench_scheduler._build, n, folder)
    graph_bytes = json.loads((Path(folder) / "manifest.json").read_text())["bytes"]
    states = run_in_child(_state_bytes, folder, args.schedulers)
    bench_args = bench_scheduler.Args(history=args.history, timed_steps=args.timed_steps, reference_steps=0)
    rows = []
    for name in args.schedulers:
        if name == "envsched":
            r = run_in_child(bench_scheduler._measure, folder, bench_args)
        else:
            r = run_in_child(bench_scheduler._measure_baseline, folder, name, bench_args)
        rows.append({"scheduler": name, "n": r["n"], "step_ms": r["step_ms"], "step_ms_min": r["step_ms_min"],
                     "compile_s": r["compile_s"], "setup_s": r["setup_s"], "peak_rss_gib": r["peak_rss_gib"],
                     "graph_build_s": build_s,
                     "state_mib": states[name]["state_bytes"] / MIB,
                     "neighbour_state_mib": states[name]["neighbour_bytes"] / MIB,
                     "sparse_features_mib": graph_bytes["sparse_features"] / MIB,
                     "dense_mib": graph_bytes["dense_matrices"] / MIB,
                     "candidates_mib": graph_bytes["candidates"] / MIB,
                     "paper_step_ms": 1000 * PAPER["step_s"] if (name == "envsched" and r["n"] == PAPER["n"])
                     else float("nan")})
    return rows


def print_tables(console: Console, rows: list[dict]) -> None:
    table = Table("N", "scheduler", "step ms (median)", "min ms", "compile s", "peak RSS GiB", "state MiB",
                  title="Per-step scheduling time (select + observe, after compilation) and scheduler state")
    table.add_row("2,550", "paper EnvSched", f"{1000 * PAPER['step_s']:,.0f}", "", "", "",
                  f"{PAPER['neighbour_progress_state_mib']:.2f} (nbr + progress)", end_section=True)
    sizes = sorted({r["n"] for r in rows})
    for n in sizes:
        group = [r for r in rows if r["n"] == n]
        for r in group:
            state = f"{r['state_mib']:.2f}"
            if r["neighbour_state_mib"]:
                state += f" (nbr {r['neighbour_state_mib']:.2f})"
            table.add_row(f"{n:,}", r["scheduler"], f"{r['step_ms']:.2f}", f"{r['step_ms_min']:.2f}",
                          f"{r['compile_s']:.2f}", f"{r['peak_rss_gib']:.2f}", state, end_section=r is group[-1])
    console.print(table)
    table = Table("N", "sparse features MiB", "two dense matrices MiB", "candidate lists MiB", "graph build s",
                  title="Static graph memory (float32 dense S_full + S_abs)")
    table.add_row("2,550 (paper)", f"{PAPER['sparse_features_mib']:.2f}", f"{PAPER['dense_mib']:.2f}", "", "",
                  end_section=True)
    for n in sizes:
        r = next(r for r in rows if r["n"] == n)
        table.add_row(f"{n:,}", f"{r['sparse_features_mib']:.2f}", f"{r['dense_mib']:.2f}",
                      f"{r['candidates_mib']:.2f}", f"{r['graph_build_s']:.1f}")
    console.print(table)


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for k, name in enumerate(dict.fromkeys(r["scheduler"] for r in rows)):
        pts = sorted((r["n"], r["step_ms"]) for r in rows if r["scheduler"] == name)
        ax.plot(*zip(*pts), "o-", color=f"C{k}", label=name)
    ax.plot([PAPER["n"]], [1000 * PAPER["step_s"]], "k*", ms=12, label="paper EnvSched (34.93 s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pool size N (tasks)")
    ax.set_ylabel("scheduling time per step (ms)")
    ax.set_title("Per-step scheduling time vs N (B = 64, K = 8)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: Args) -> None:
    if min(args.sizes) < MIN_SIZE:
        raise SystemExit(f"--sizes: N >= {MIN_SIZE} needed (32 environments of 50 tasks for a B = 64 cold start)")
    console = Console(width=120)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            rows += measure_size(n, args, str(Path(tmp) / f"graph_{n}"))
            console.print(f"  N = {n:,} done, {time.perf_counter() - t0:.0f} s", highlight=False)
    print_tables(console, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "cost.csv", rows)
    plot(args.out / "cost.png", rows)
    console.print(f"{len(rows)} measurements in {time.perf_counter() - t0:.0f} s; written to {args.out}/cost.csv, "
                  "cost.png", highlight=False)


if __name__ == "__main__":
    main(tyro.cli(Args))
