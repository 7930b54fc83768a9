"""Benchmark of Envs-FORGE's gold verification in the local Docker engine (issue 14's figures).

Verifies every built-in seed (25 bundles) and the same number of rewrites of them (one action
each, cycling through the six), in one run:

- **cold**: the task images are removed first, so every bundle builds its image;
- **warm**: the same bundles again, every image a cache hit (images are tagged by the SHA-256 of
  the build context);
- **rewrites**: new bundles whose environment differs from every seed's (new data), so they build,
  as a synthesis run's exports do.

Reported per phase: bundles per minute through all eight checks, the cache hit rate, and the
median seconds of each executed check (build, oracle, untouched); the warm / cold ratio is the
cache's worth. Every bundle must be accepted (the figure is of accepted bundles' throughput).

Usage:
    python experiments/bench_forge_verify.py
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import tyro

from envsched_jax.forge.actions import ACTIONS
from envsched_jax.forge.families import builtin_seeds, to_bundle, transform
from envsched_jax.forge.verify import DockerVerifier, remove_task_images, verify_bundle


@dataclasses.dataclass(frozen=True)
class Args:
    out: Path = Path("runs/bench_forge_verify.json")


def _phase(name, bundles, verifier, parents=None):
    builds, hits = verifier.builds, verifier.cache_hits
    per_check: dict[str, list[float]] = {}
    start = time.perf_counter()
    for k, bundle in enumerate(bundles):
        result = verify_bundle(bundle, verifier, parent=None if parents is None else parents[k])
        if not result.accepted:
            raise RuntimeError(f"{name}: {bundle.name} was rejected: {result.failed_check}")
        for check in result.checks:
            per_check.setdefault(check.name, []).append(check.seconds)
    seconds = time.perf_counter() - start
    lookups = verifier.builds - builds + verifier.cache_hits - hits
    row = {"phase": name, "bundles": len(bundles), "seconds": seconds, "bundles_per_minute": 60 * len(bundles) / seconds,
           "builds": verifier.builds - builds, "cache_hits": verifier.cache_hits - hits,
           "cache_hit_rate": (verifier.cache_hits - hits) / lookups,
           "median_check_seconds": {c: statistics.median(v) for c, v in per_check.items()}}
    print(f"{name:>9}: {len(bundles)} bundles in {seconds:.1f} s = {row['bundles_per_minute']:.1f} per minute; "
          f"cache hit rate {row['cache_hit_rate']:.2f}; median build {row['median_check_seconds']['build']:.2f} s, "
          f"oracle {row['median_check_seconds']['oracle']:.2f} s, untouched {row['median_check_seconds']['untouched']:.2f} s")
    return row


def main(args: Args) -> list[dict]:
    verifier = DockerVerifier()
    removed = remove_task_images(verifier.client)
    print(f"removed {removed} cached task images")
    seeds = [to_bundle(n, p) for n, p in builtin_seeds()]
    rewrites = [to_bundle(f"{n}-rw", transform(p, ACTIONS[k % len(ACTIONS)], rng_seed=101).params)
                for k, (n, p) in enumerate(builtin_seeds())]
    rows = [_phase("cold", seeds, verifier), _phase("warm", seeds, verifier),
            _phase("rewrites", rewrites, verifier, parents=seeds)]
    print(f"warm / cold throughput: {rows[1]['bundles_per_minute'] / rows[0]['bundles_per_minute']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
