"""Episode throughput per sandbox: reference-action replays of the embedded pool and BFCL base.

For each sandbox (in-process, bubblewrap, Docker) it replays every task's reference actions
(``--repeats`` times) through a :class:`~envsched_jax.envs.rollout.RolloutPool` and prints
episodes per second, the ratio to in-process execution measured in the same run, and the worker
start-up time (median of ``--starts`` fresh workers). Sandboxes that cannot run here are reported
with the reason and skipped. Results go to ``runs/bench_episodes.json``.

Usage:
    python experiments/bench_episodes.py
    python experiments/bench_episodes.py --sandboxes inprocess bwrap --workers 2 --repeats 3
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import tyro

from envsched_jax.envs.episode import with_turn_ends
from envsched_jax.envs.rollout import RolloutConfig, RolloutJob, RolloutPool
from envsched_jax.envs.sandbox import SANDBOX_KINDS, SandboxConfig, make_worker_pool, unavailable_reason
from envsched_jax.pool.sources import load_pool


@dataclasses.dataclass(frozen=True)
class Args:
    sandboxes: tuple[str, ...] = SANDBOX_KINDS
    """Sandboxes to measure (in-process is always measured: it is the baseline)."""
    pools: tuple[str, ...] = ("embedded", "bfcl:base")
    """Pool specs whose reference actions are replayed."""
    workers: int = 1
    """Workers (episodes at once)."""
    repeats: int = 2
    """Passes over each pool."""
    starts: int = 5
    """Fresh workers timed for start-up."""
    out: Path = Path("runs/bench_episodes.json")


def jobs_for(pool, repeats: int) -> list[RolloutJob]:
    return [RolloutJob(t, actions=with_turn_ends(t, t.reference_actions))
            for _ in range(repeats) for t in pool.tasks]


def startup_seconds(kind: str, starts: int) -> float:
    with make_worker_pool(SandboxConfig(kind=kind, num_workers=1, trust="any")) as pool:
        times = []
        for _ in range(starts):
            worker = pool.lease()
            times.append(worker.startup_seconds)
            pool.give_back(worker, healthy=False)
        return statistics.median(times)


def throughput(kind: str, pool, jobs, workers: int) -> tuple[float, float]:
    """(episodes per second, mean reward), workers started before the clock runs."""
    config = SandboxConfig(kind=kind, num_workers=workers, trust="any")
    with make_worker_pool(config) as wp:
        leased = [wp.lease() for _ in range(workers)]
        for w in leased:
            wp.give_back(w, healthy=True)
        runner = RolloutPool(wp, pool, RolloutConfig(max_steps=None, episode_timeout_s=60))
        start = time.perf_counter()
        results = runner.run(jobs)
        elapsed = time.perf_counter() - start
    errors = [r.error for r in results if r.error and r.end_reason != "tool_error"]
    if errors:
        raise RuntimeError(f"{kind}: {len(errors)} episodes failed, first: {errors[0]}")
    return len(jobs) / elapsed, statistics.fmean(r.reward for r in results)


def main(args: Args) -> None:
    unknown = sorted(set(args.sandboxes) - set(SANDBOX_KINDS))
    if unknown:
        raise SystemExit(f"unknown sandboxes {unknown}; choose from {', '.join(SANDBOX_KINDS)}")
    pools = {name: load_pool(name) for name in args.pools}
    out: dict = {"workers": args.workers, "repeats": args.repeats, "sandboxes": {}}
    kinds = ["inprocess"] + [k for k in args.sandboxes if k != "inprocess"]
    base: dict[str, float] = {}
    print(f"{'sandbox':10} {'pool':10} {'episodes/s':>11} {'vs in-process':>14} "
          f"{'mean reward':>12}   worker start-up")
    for kind in kinds:
        reason = unavailable_reason(kind)
        if reason:
            print(f"{kind:10} skipped: {reason}")
            out["sandboxes"][kind] = {"skipped": reason}
            continue
        start_s = startup_seconds(kind, args.starts)
        entry = {"startup_seconds": start_s, "pools": {}}
        for name, pool in pools.items():
            rate, mean_reward = throughput(kind, pool, jobs_for(pool, args.repeats), args.workers)
            if kind == "inprocess":
                base[name] = rate
            ratio = rate / base[name] if name in base else float("nan")
            entry["pools"][name] = {"episodes_per_second": rate, "ratio_to_inprocess": ratio,
                                    "mean_reward": mean_reward,
                                    "episodes": len(pool.tasks) * args.repeats}
            print(f"{kind:10} {name:10} {rate:11.1f} {ratio:13.2f}x {mean_reward:12.4f}   "
                  f"{start_s * 1000:.0f} ms")
        out["sandboxes"][kind] = entry
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(tyro.cli(Args))
