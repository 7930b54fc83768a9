"""The main job on the embedded default pool: build the dual-relation graph and show what it
connects.

Usage:
    python experiments/demo.py
    python experiments/demo.py --pool generated:51x50 --examples 2
    python experiments/demo.py --out runs/demo-graph
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table

from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.pool.sources import load_pool


@dataclasses.dataclass(frozen=True)
class Args:
    pool: str = "embedded"
    """Pool spec (see `envsched pool inspect --help`)."""
    examples: int = 3
    """How many example tasks to show with their neighbours."""
    neighbours: int = 3
    """Neighbours shown per relation."""
    out: Path | None = None
    """Optionally write the graph artefact here."""
    seed: int = 0
    """Seed for picking the example tasks."""


def _short(text: str, n: int = 78) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def main(args: Args) -> None:
    console = Console()
    t0 = time.perf_counter()
    pool = load_pool(args.pool)
    console.print(f"[bold]{pool.name}[/bold]: {pool.num_environments} environments, {pool.num_tasks} tasks, "
                  f"{sum(len(e.tools) for e in pool.environments)} tools "
                  f"(loaded in {time.perf_counter() - t0:.2f} s)")
    graph = build_graph(pool, GraphConfig(), progress=True)
    console.print("graph built: " + ", ".join(f"{k} {v:.2f} s" for k, v in graph.timings.items()))
    if args.out is not None:
        from envsched_jax.graph.artefact import save_graph

        save_graph(graph, args.out, overwrite=True)
        console.print(f"graph written to {args.out}")

    env = graph.env_index
    same = env[:, None] == env[None, :]
    off = ~np.eye(graph.num_nodes, dtype=bool)
    stats = Table("similarity", "same environment", "different environments", title="Mean pairwise similarity")
    stats.add_row("S_full (six concrete views)", f"{graph.s_full[same & off].mean():.3f}",
                  f"{graph.s_full[~same].mean():.3f}")
    stats.add_row("S_abs (abstract operations)", f"{graph.s_abs[same & off].mean():.3f}",
                  f"{graph.s_abs[~same].mean():.3f}")
    console.print(stats)

    rng = np.random.default_rng(args.seed)
    picks = rng.choice(graph.num_nodes, size=min(args.examples, graph.num_nodes), replace=False)
    for i in picks:
        task = pool.tasks[i]
        console.rule(f"[bold]{task.task_id}[/bold]  ({task.env_id})")
        console.print(f"instruction: {_short(task.instruction, 200)}")
        console.print(f"abstract:    [cyan]{_short(graph.abstract_texts[i], 200)}[/cyan]")
        table = Table("relation", "sim", "neighbour", "instruction")
        for label, idx, sim in (("within (S_full)", graph.within_idx[i], graph.within_sim[i]),
                                ("cross (S_abs)", graph.cross_idx[i], graph.cross_sim[i])):
            for j, s in list(zip(idx, sim))[: args.neighbours]:
                if j >= 0:
                    table.add_row(label, f"{s:.3f}", pool.tasks[j].task_id, _short(pool.tasks[j].instruction, 60))
        console.print(table)


if __name__ == "__main__":
    main(tyro.cli(Args))
