"""Generate the labelled Env-Rethink workspace benchmark into a pool folder (resumable).

Writes ``<out>/train/<workspace>/`` and ``<out>/held_out/<workspace>/`` (files plus
``workspace.json``: request, rubric, reference outcome and per-file labels) and ``<out>/index.json``
(:mod:`envsched_jax.rethink.store`). A rerun skips every workspace already written with the same
content and rewrites any that differ; a workspace is written to a temporary folder and renamed, so
an interrupted run leaves no half-written workspace.

Usage:
    python experiments/rethink_generate.py                                   # 12 parents x 3 variants
    python experiments/rethink_generate.py --generator.num-parents 40 --out runs/rethink_pool_40
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import tyro
from rich.progress import track

from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.store import write_pool


@dataclasses.dataclass(frozen=True)
class Args:
    out: Path = Path("runs/rethink_pool")
    """Pool folder to write (created; existing complete workspaces are kept)."""
    generator: GeneratorConfig = GeneratorConfig()


def main(args: Args) -> dict:
    bench = generate_benchmark(args.generator)
    counts = write_pool(args.out, {"train": bench.train, "held_out": bench.held_out},
                        progress=lambda items, n: track(items, total=n, description="workspaces"))
    sizes = collections.Counter(ws.size_class for ws in bench.workspaces)
    print(f"{len(bench.train)} train and {len(bench.held_out)} held-out workspaces "
          f"({len(bench.held_out_parents)} held-out parents) in {args.out}: {counts['written']} written, "
          f"{counts['skipped']} already there; sizes {dict(sizes)}")
    return counts


if __name__ == "__main__":
    main(tyro.cli(Args))
