"""Benchmark of Envs-FORGE's action-selection MILP (issue 14's figures).

For 100 / 1,000 / 10,000 random seeds (:mod:`envsched_jax.forge.instances`) it times, in one run:

- per-seed mode (the paper's evaluated mode; its recorded run: 100 seeds, 600 action variables,
  status optimal): SCIP vs the enumeration fallback, which is exact in this mode;
- portfolio mode with shared coverage targets on 6 skills (each target 0.3 above what the
  frontier-only choice covers, or the most any choice can cover if less: with the slack capped
  at 0.2 the quotas bind): SCIP vs the coverage-aware greedy fallback
  (enumeration is limited to 24 candidates), with the greedy's objective gap.

Times are wall seconds of ``select_actions`` (model building included), best of ``repeats``.

Then, the greedy's quality where the optimum is known: ``small_trials`` random portfolio
instances of 4 seeds over 8 skills (3 shared targets uniform in [0.1, 0.6], 1-4 exports), each
solved by SCIP and by the greedy; it reports how often the greedy is below the optimum.

Usage:
    python experiments/bench_forge_milp.py
    python experiments/bench_forge_milp.py --sizes 100 1000
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import tyro

from envsched_jax.forge.candidates import ForgeInputError, build_candidates
from envsched_jax.forge.instances import random_seeds
from envsched_jax.forge.milp import ForgeInfeasibleError, make_problem, select_actions


@dataclasses.dataclass(frozen=True)
class Args:
    sizes: tuple[int, ...] = (100, 1_000, 10_000)
    """Numbers of seeds."""
    repeats: int = 2
    """Timed repetitions per case (the best is reported)."""
    time_limit_s: float = 300.0
    """SCIP's time limit per solve."""
    small_trials: int = 300
    """Small portfolio instances for the greedy's optimality check."""
    out: Path = Path("runs/bench_forge_milp.json")
    """Where to write the figures as JSON."""


def _best(fn, repeats):
    results = [fn() for _ in range(repeats)]
    return min(results, key=lambda r: r.solve_seconds)


def main(args: Args) -> list[dict]:
    rows = []
    for n in args.sizes:
        seeds, graph = random_seeds(n, seed=n)
        cands = build_candidates(seeds, graph)
        scip = _best(lambda: select_actions(cands, backend="scip", time_limit_s=args.time_limit_s), args.repeats)
        enum = _best(lambda: select_actions(cands, backend="enumeration"), args.repeats)
        rows.append({"mode": "per_seed", "seeds": n, "action_vars": scip.num_action_variables,
                     "scip_vars": scip.num_variables, "scip_status": scip.status, "scip_s": scip.solve_seconds,
                     "scip_objective": scip.objective, "fallback": "enumeration", "fallback_s": enum.solve_seconds,
                     "fallback_objective": enum.objective})
        free = select_actions(cands, mode="portfolio", backend="greedy")
        covered = cands.nodes[np.arange(n), free.choice].mean(axis=0)
        busiest = np.argsort(-cands.nodes.any(axis=1).sum(axis=0), kind="stable")[:6]
        problem = make_problem(cands, mode="portfolio")
        reach = (problem.ok & cands.nodes.transpose(2, 0, 1)).any(axis=2).mean(axis=1)   # [skills]
        targets = {cands.skills[k]: float(min(covered[k] + 0.3, reach[k])) for k in busiest}
        scip_p = _best(lambda: select_actions(cands, mode="portfolio", coverage_targets=targets, backend="scip",
                                              time_limit_s=args.time_limit_s), args.repeats)
        greedy = _best(lambda: select_actions(cands, mode="portfolio", coverage_targets=targets, backend="greedy"),
                       args.repeats)
        rows.append({"mode": "portfolio", "seeds": n, "action_vars": scip_p.num_action_variables,
                     "scip_vars": scip_p.num_variables, "scip_status": scip_p.status, "scip_s": scip_p.solve_seconds,
                     "scip_objective": scip_p.objective, "fallback": "greedy", "fallback_s": greedy.solve_seconds,
                     "fallback_objective": greedy.objective, "targets": targets,
                     "frontier_only_coverage": {k: float(covered[cands.skills.index(k)]) for k in targets}})
        for row in rows[-2:]:
            gap = (row["scip_objective"] - row["fallback_objective"]) / abs(row["scip_objective"])
            print(f"{row['mode']:9s} {n:6d} seeds  {row['action_vars']:6d} action vars ({row['scip_vars']} in SCIP)  "
                  f"SCIP {row['scip_status']} {row['scip_s']:8.3f} s  objective {row['scip_objective']:.4f}  |  "
                  f"{row['fallback']} {row['fallback_s']:8.3f} s  objective {row['fallback_objective']:.4f} "
                  f"(gap {100 * gap:.3f}%)  SCIP / fallback time {row['scip_s'] / row['fallback_s']:.1f}x", flush=True)
    small = _greedy_quality(args.small_trials)
    print(f"greedy on {small['feasible']} feasible small portfolio instances (of {args.small_trials}): below the "
          f"optimum on {small['below']}, no feasible selection on {small['greedy_failed']}, largest gap "
          f"{small['largest_gap']:.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sizes": rows, "small_portfolio": small}, indent=2) + "\n")
    return rows


def _greedy_quality(trials: int) -> dict:
    rng = np.random.default_rng(0)
    feasible = below = failed = 0
    largest = 0.0
    for trial in range(trials):
        seeds, graph = random_seeds(4, seed=10_000 + trial, num_skills=8)
        cands = build_candidates(seeds, graph)
        chosen = rng.choice(len(cands.skills), size=min(3, len(cands.skills)), replace=False)
        kwargs = dict(mode="portfolio", num_exports=int(rng.integers(1, 5)),
                      coverage_targets={cands.skills[k]: float(rng.uniform(0.1, 0.6)) for k in chosen})
        try:
            best = select_actions(cands, backend="scip", **kwargs)
        except (ForgeInfeasibleError, ForgeInputError):
            continue
        feasible += 1
        try:
            greedy = select_actions(cands, backend="greedy", **kwargs)
        except ForgeInfeasibleError:
            failed += 1
            continue
        gap = best.objective - greedy.objective
        below += gap > 1e-9
        largest = max(largest, gap)
    return {"trials": trials, "feasible": feasible, "below": below, "greedy_failed": failed, "largest_gap": largest}


if __name__ == "__main__":
    main(tyro.cli(Args))
