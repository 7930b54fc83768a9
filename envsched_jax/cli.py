"""The ``envsched`` command line.

Usage:
    envsched pool inspect embedded
    envsched pool inspect envscaler:env_metadata.json:rl_scenarios.json --drop-invalid
    envsched graph build generated:51x50 --out runs/graph-51x50
    envsched graph build bfcl --out runs/graph-bfcl --config.num-candidates 24
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Union

import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from envsched_jax.graph.build import GraphConfig
from envsched_jax.pool.model import Pool, PoolError
from envsched_jax.pool.sources import SPEC_HELP, load_pool


@dataclasses.dataclass(frozen=True)
class PoolInspect:
    """Summarise a pool: environments, tasks, tools and validation problems."""

    pool: tyro.conf.Positional[str]
    """Pool spec: embedded | generated:ENVSxTASKS[:SEED] | generated:N[:SEED] | bfcl[:CATEGORIES] |
    envscaler:ENV_FILE:TASK_FILE | PATH.jsonl"""
    drop_invalid: bool = False
    """Leave out invalid records (each is listed) instead of failing."""
    max_rows: int = 60
    """Most environments to list in the table."""


@dataclasses.dataclass(frozen=True)
class GraphBuild:
    """Build the static dual-relation graph of a pool and write it with a manifest."""

    pool: tyro.conf.Positional[str]
    """Pool spec (see `envsched pool inspect --help`)."""
    out: Path
    """Output directory for the graph artefact."""
    config: GraphConfig = GraphConfig()
    overwrite: bool = False
    """Replace an existing output directory."""
    drop_invalid: bool = False
    """Leave out invalid records (each is listed) instead of failing."""
    extractions: Path | None = None
    """An operation-extraction file of this pool (experiments/extract_operations.py) to use
    instead of the static extractor."""


Command = Union[
    Annotated[PoolInspect, tyro.conf.subcommand("pool inspect", prefix_name=False)],
    Annotated[GraphBuild, tyro.conf.subcommand("graph build", prefix_name=False)],
]


def _load(spec: str, drop_invalid: bool, console: Console) -> Pool | None:
    """The pool, or None after printing why it cannot be loaded (every loader reports a broken,
    unreadable or empty pool file as a PoolError naming the file and line)."""
    try:
        with console.status(f"loading pool {escape(repr(spec))}"):
            pool = load_pool(spec, drop_invalid=drop_invalid)
    except PoolError as err:
        # escape: messages quote file content and field names such as 'checks[0]', not markup;
        # soft_wrap: a long path or message stays on one line, as the loader wrote it
        console.print(f"[red]cannot load pool {escape(repr(spec))}:[/red]\n{escape(str(err))}",
                      soft_wrap=True)
        return None
    return pool


def pool_inspect(args: PoolInspect, console: Console) -> int:
    pool = _load(args.pool, args.drop_invalid, console)
    if pool is None:
        return 1
    tasks_per_env = Counter(t.env_id for t in pool.tasks)
    checks = [len(t.checks) for t in pool.tasks]
    with_ref = sum(t.reference_actions is not None for t in pool.tasks)
    all_tools = {(e.env_id, n) for e in pool.environments for n in e.tool_names}
    console.print(f"[bold]pool[/bold] {pool.name}  content hash {pool.content_hash()[:16]}")
    console.print(f"{pool.num_environments} environments, {pool.num_tasks} tasks, "
                  f"{len(all_tools)} tools, {sum(checks)} verifier checks "
                  f"({min(checks)}-{max(checks)} per task), {with_ref} tasks with reference actions")
    table = Table()
    table.add_column("environment", overflow="fold", min_width=24)
    table.add_column("tasks", justify="right", min_width=5)
    table.add_column("tools", justify="right", min_width=5)
    table.add_column("summary", no_wrap=True, overflow="ellipsis", max_width=40)
    for env in pool.environments[: args.max_rows]:
        table.add_row(env.env_id, str(tasks_per_env[env.env_id]), str(len(env.tools)), env.summary)
    console.print(table)
    if pool.num_environments > args.max_rows:
        console.print(f"... and {pool.num_environments - args.max_rows} more environments")
    if pool.dropped:
        console.print(f"[yellow]{len(pool.dropped)} validation problem(s); those records were left out:[/yellow]")
        for problem in pool.dropped:
            console.print(f"  - {problem}")
    else:
        console.print("validation problems: none")
    return 0


def graph_build(args: GraphBuild, console: Console) -> int:
    from envsched_jax.graph.artefact import GraphArtefactError, save_graph
    from envsched_jax.graph.build import build_graph

    if args.out.exists() and not args.overwrite:
        console.print(f"[red]{args.out} exists; pass --overwrite to replace it[/red]")
        return 1
    pool = _load(args.pool, args.drop_invalid, console)
    if pool is None:
        return 1
    console.print(f"building graph of {pool.name}: {pool.num_tasks} nodes, {pool.num_environments} environments")
    extractions = None
    if args.extractions is not None:
        from envsched_jax.graph.llm_extract import load_extractions

        try:
            extractions = load_extractions(args.extractions, pool)
        except ValueError as err:
            console.print(f"[red]{err}[/red]")
            return 1
    graph = build_graph(pool, args.config, progress=True, extractions=extractions)
    try:
        save_graph(graph, args.out, overwrite=args.overwrite)
    except GraphArtefactError as err:
        console.print(f"[red]{err}[/red]")
        return 1
    mib = 2**20
    console.print(f"wrote {args.out}: sparse features {graph.feature_bytes() / mib:.2f} MiB, "
                  f"dense matrices {graph.dense_bytes() / mib:.2f} MiB, "
                  f"candidate lists {graph.candidate_bytes() / mib:.2f} MiB")
    console.print("timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in graph.timings.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # "pool inspect X" -> "pool inspect" is one subcommand name for tyro.
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in ("pool inspect", "graph build"):
        argv = [f"{argv[0]} {argv[1]}", *argv[2:]]
    args = tyro.cli(Command, args=argv, prog="envsched",
                    description=f"envsched_jax command line. Pool specs: {SPEC_HELP}")
    # Piped or logged output gets a fixed 120 columns (rich would assume 80 and squeeze tables).
    console = Console() if Console().is_terminal else Console(width=120)
    if isinstance(args, PoolInspect):
        return pool_inspect(args, console)
    return graph_build(args, console)


if __name__ == "__main__":
    raise SystemExit(main())
