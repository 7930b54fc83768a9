"""Envs-FORGE vs the fixed recipes under an equal export budget (the paper's protocol, our scale).

For each simulated policy (``--policy-seeds``; :mod:`envsched_jax.forge.simulated_policy`), a rollout
log of the 25 built-in seeds (``--k`` rollouts each) is written; then every recipe (``--recipes``:
FORGE and the fixed recipes, which are action masks of the same model) runs the same pipeline
(``experiments/forge_synthesize.py``: same seeds, same log, same materialiser, same gold
verification) to the same number of verified exports. The exports are then placed relative to the
policy's learning frontier: their true pass probability under that policy and a ``--k``-rollout
estimate, the share inside the frontier band (``forge.actions.frontier_band``: 0.2 to 0.8), the
shares below / above it, the mean frontier score; and what each recipe spent (requests, materialised directories, LLM tokens, time).

This measures selection, not learning: the policy is simulated and the materialiser programmatic.
It says nothing about the paper's downstream Pass@1 gains, which need a policy trained on the
exports (docs/papers/forge.md). Writes ``compare.json`` and ``compare.csv`` to ``--out``; each run
keeps its folder (``<recipe>_p<seed>``) and resumes.

Usage:
    python experiments/forge_compare.py                                   # 4 recipes x 5 policies
    python experiments/forge_compare.py --policy-seeds 0 --num-exports 10 --out runs/forge_compare_small
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import tyro

from envsched_jax.forge.bundle import read_bundle
from envsched_jax.forge.families import builtin_seeds, to_bundle
from envsched_jax.forge.pipeline import SynthesisConfig, synthesize
from envsched_jax.forge.simulated_policy import SkillCompetencePolicy, frontier_placement, write_rollout_log


@dataclasses.dataclass(frozen=True)
class Args:
    recipes: tuple[str, ...] = ("forge", "few_shot", "self_instruct", "evol_instruct")
    policy_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    num_exports: int = 25
    """Verified exports per recipe (the paper: 100 per method from 100 seeds; here one per seed)."""
    k: int = 15
    """Rollouts per seed for the log, and per export for the estimate."""
    base: SynthesisConfig = dataclasses.field(default_factory=lambda: SynthesisConfig(rollout_log="(per policy)"))
    """Everything else of each synthesis run (``--base.materializer``, ``--base.mode``...)."""
    out: Path = Path("runs/forge_compare")


METRICS = ("in_band", "below", "above", "frontier_score", "mean")


def main(args: Args) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = [to_bundle(n, p) for n, p in builtin_seeds()]
    rows = []
    for policy_seed in args.policy_seeds:
        policy = SkillCompetencePolicy.draw(policy_seed)
        log = write_rollout_log(policy.rollouts(seeds, args.k, policy_seed), args.out / f"rollouts_p{policy_seed}.jsonl")
        seed_place = frontier_placement(seeds, policy, k=args.k, seed=policy_seed, frontier=args.base.forge.frontier)
        rows.append({"recipe": "seeds", "policy": policy_seed, "exported": len(seeds),
                     **{f"true_{m}": seed_place["true"][m] for m in METRICS},
                     **{f"est_{m}": seed_place["estimated"][m] for m in METRICS}})
        for recipe in args.recipes:
            cfg = dataclasses.replace(args.base, rollout_log=str(log), recipe=recipe, num_exports=args.num_exports,
                                      out=str(args.out / f"{recipe}_p{policy_seed}"))
            report = synthesize(cfg, progress=False, log=lambda _: None)
            exports = [read_bundle(Path(cfg.out) / "exports" / name) for name in report["exports"]]
            # the estimate draws from a stream no synthesis saw (seed + 1000)
            place = frontier_placement(exports, policy, k=args.k, seed=policy_seed + 1000,
                                       frontier=args.base.forge.frontier)
            rows.append({"recipe": recipe, "policy": policy_seed, "exported": report["exported"],
                         "requests": report["requests"], "materialized": report["materialized"],
                         "tokens": report["prompt_tokens"] + report["completion_tokens"],
                         "seconds": report["seconds"], "solver": report["solver"]["status"],
                         "actions": report["actions_exported"],
                         **{f"true_{m}": place["true"][m] for m in METRICS},
                         **{f"est_{m}": place["estimated"][m] for m in METRICS}})
            print(f"policy {policy_seed} {recipe:>14}: {report['exported']} exports, in band "
                  f"{place['true']['in_band']:.2f} (true) / {place['estimated']['in_band']:.2f} (estimated)")
    table = {}
    for recipe in ("seeds", *args.recipes):
        mine = [r for r in rows if r["recipe"] == recipe]
        table[recipe] = {key: {"mean": float(np.mean([r[key] for r in mine])), "sd": float(np.std([r[key] for r in mine]))}
                         for key in [f"{v}_{m}" for v in ("true", "est") for m in METRICS] + ["exported"]}
    (args.out / "compare.json").write_text(json.dumps({"rows": rows, "table": table}, indent=2, default=str) + "\n")
    with open(args.out / "compare.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rows)
    print(f"\n{'recipe':>14} | in band (true) | in band (est.) | below | above | frontier score | mean p")
    for recipe, t in table.items():
        print(f"{recipe:>14} | {t['true_in_band']['mean']:.2f} +- {t['true_in_band']['sd']:.2f} | "
              f"{t['est_in_band']['mean']:.2f} +- {t['est_in_band']['sd']:.2f} | {t['true_below']['mean']:.2f} | "
              f"{t['true_above']['mean']:.2f} | {t['true_frontier_score']['mean']:.3f} | {t['true_mean']['mean']:.3f}")
    return table


if __name__ == "__main__":
    main(tyro.cli(Args))
