"""A rollout log of the built-in seeds (or any built-in-family bundles) under the simulated policy.

Envs-FORGE needs the current policy's verifier pass rate on every seed. No model on a CPU machine
solves these tasks, so this script writes the log of a simulated policy
(:mod:`envsched_jax.forge.simulated_policy`: per-skill competence, labelled ``simulated`` on every
line); a real policy's log comes from any rollout the project runs on a ``bundles:DIR`` pool (each
line has ``task_id`` and ``reward``).

Usage:
    python experiments/forge_rollouts.py --out runs/forge/rollouts.jsonl               # 25 seeds x 15
    python experiments/forge_rollouts.py --bundles runs/forge/forge/exports --k 15 --out runs/forge/exports.jsonl
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import tyro

from envsched_jax.forge.bundle import read_bundle
from envsched_jax.forge.families import builtin_seeds, to_bundle
from envsched_jax.forge.passrate import estimate_pass_rates
from envsched_jax.forge.simulated_policy import SkillCompetencePolicy, write_rollout_log


@dataclasses.dataclass(frozen=True)
class Args:
    bundles: str = "builtin"
    """``builtin`` (the 25 built-in seeds) or a directory of bundles made by the built-in families."""
    k: int = 15
    """Rollouts per bundle (the paper's case V: 8 of 15)."""
    policy_seed: int = 0
    """Seeds the simulated policy's competences."""
    rollout_seed: int = 0
    out: Path = Path("runs/forge/rollouts.jsonl")


def main(args: Args) -> dict:
    if args.bundles == "builtin":
        bundles = [to_bundle(name, params) for name, params in builtin_seeds()]
    else:
        bundles = [read_bundle(p) for p in sorted(Path(args.bundles).iterdir()) if p.is_dir()]
    policy = SkillCompetencePolicy.draw(args.policy_seed)
    records = policy.rollouts(bundles, args.k, args.rollout_seed)
    write_rollout_log(records, args.out)
    rates = estimate_pass_rates(records, [b.name for b in bundles])
    summary = {"bundles": len(bundles), "rollouts": len(records), "out": str(args.out),
               "pass_rates": {name: round(r.rate, 3) for name, r in rates.items()}}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
