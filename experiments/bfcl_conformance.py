"""Agreement of the project's BFCL-v3 rewards with BFCL's own multi-turn checker.

Plays every task of the pool under each action-sequence variant
(:data:`envsched_jax.pool.bfcl_conformance.VARIANTS`) through the installed ``bfcl_eval``'s
checker (its runner's turn-count rule included) and through the project's episode runtime, each
comparison in a fresh process, and prints how often BFCL's ``valid`` equals the project's
``reward == 1``, per variant, with every disagreement: documented ones with their reason, and
undocumented ones (conformance failures). Results go to ``--out``.

Usage:
    python experiments/bfcl_conformance.py                       # all 800 tasks
    python experiments/bfcl_conformance.py --every 20 --processes 2
    python experiments/bfcl_conformance.py --pool bfcl:base,state_equality=exact
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import tyro
from rich.progress import track

from envsched_jax.pool import bfcl_conformance as conf
from envsched_jax.pool.sources import load_pool


@dataclasses.dataclass(frozen=True)
class Args:
    pool: str = "bfcl"
    """BFCL pool spec (categories and loader options, e.g. ``bfcl:miss_func,withheld_calls=refuse``)."""
    every: int = 1
    """Compare every k-th task of the pool (1: all)."""
    variants: tuple[str, ...] = tuple(conf.VARIANTS)
    processes: int = 2
    out: Path = Path("runs/bfcl_conformance.json")


def main(args: Args) -> dict:
    if args.every < 1:
        raise SystemExit(f"--every must be at least 1, got {args.every}")
    pool = load_pool(args.pool)
    task_ids = [t.task_id for t in pool.tasks[::args.every]]
    t0 = time.perf_counter()
    results = conf.compare(pool, task_ids, args.variants, processes=args.processes,
                           progress=lambda it, n: track(it, total=n, description="comparisons"))
    report = {"pool": args.pool, "tasks": len(task_ids), "seconds": time.perf_counter() - t0,
              **conf.summary(results)}
    print(f"{args.pool}: {report['agree']} of {report['runs']} runs agree with BFCL's checker "
          f"({len(task_ids)} tasks, {report['seconds']:.0f} s on {args.processes} processes)")
    for variant, v in report["per_variant"].items():
        print(f"  {variant:15s} {v['agree']:5d} / {v['runs']:5d}")
    for kind in ("documented", "undocumented"):
        rows = report[kind]
        print(f"{kind} differences: {len(rows)}")
        for r in rows:
            print(f"  {r['task_id']} {r['variant']}: BFCL valid={r['official_valid']} "
                  f"({r['official_error']}), project reward {r['project_reward']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
