"""Evolve a workspace pool into harder, still-verifiable variants (Env-Rethink section 4.2), validate
them, and compare agents on seed vs variant under identical settings (appendix C.1).

Reads a pool folder (``experiments/rethink_generate.py``), evolves every workspace for ``--rounds``
rounds with the chosen evolver, and writes the results below. Validation and the agents run each
workspace's rubric code in this process, so only workspaces that are exactly what the generator
renders are evolved here; any other is refused with that reason.

- ``<out>/variants/``: the validated variants of the last round, as a pool folder (resumable: a
  rerun skips variants already written with the same content);
- ``<out>/evolution.json``: per seed, every attempt's validation failures and (for validated
  variants) the agents' failed-check summaries, which feed the next round; refusals with their
  reason; and the paired results (Delta_{i,m} = 100 (p_evolved - p_seed), h_i) per agent.

Usage:
    python experiments/rethink_generate.py --out runs/rethink_pool
    python experiments/rethink_evolve.py --pool runs/rethink_pool --out runs/rethink_evolved
    python experiments/rethink_evolve.py --pool runs/rethink_pool --rounds 2 --evolver.num-points 4
    python experiments/rethink_evolve.py --pool runs/rethink_pool --backend openai --model Qwen/Qwen3-8B
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import tyro
from rich.progress import track

from envsched_jax.rethink.agents import AGENTS, run_agent
from envsched_jax.rethink.evolve import (
    EvolutionError,
    EvolveConfig,
    HeuristicEvolver,
    HeuristicEvolverConfig,
    LLMEvolver,
    LLMEvolverConfig,
    evolve,
    paired_evaluation,
)
from envsched_jax.rethink.generator import is_generated
from envsched_jax.rethink.store import read_pool, write_pool


@dataclasses.dataclass(frozen=True)
class Args:
    pool: Path = Path("runs/rethink_pool")
    """Pool folder of seed workspaces."""
    out: Path = Path("runs/rethink_evolved")
    rounds: int = 1
    attempts: int = 3
    """Proposals per round before it gives up (each failure summary feeds the next)."""
    seed: int = 0
    evolver: HeuristicEvolverConfig = HeuristicEvolverConfig()
    """The heuristic evolver's settings."""
    backend: Literal["heuristic", "openai"] = "heuristic"
    """``heuristic`` (offline, numeric reference values) or an LLM Environment Evolver on an
    OpenAI-compatible server (``--base-url``, ``--model``)."""
    base_url: str = "http://localhost:8000/v1"
    model: str = ""
    llm: LLMEvolverConfig = LLMEvolverConfig()
    agents: tuple[str, ...] = tuple(AGENTS)


def main(args: Args) -> dict:
    splits = read_pool(args.pool)
    if args.backend == "heuristic":
        evolver = HeuristicEvolver(args.evolver)
    else:
        if not args.model:
            raise SystemExit("--backend openai needs --model (the served model's name)")
        from envsched_jax.graph.llm_clients import OpenAIChatClient

        evolver = LLMEvolver(OpenAIChatClient(args.base_url, args.model), args.llm)
    config = EvolveConfig(rounds=args.rounds, attempts=args.attempts, seed=args.seed)
    report, variants, pairs = [], {split: [] for split in splits}, []
    seeds = [(split, ws) for split, items in splits.items() for ws in items]
    def answers(variant):       # each agent's answer on a validated variant: the execution feedback
        return {name: run_agent(name, variant).answer for name in args.agents}

    for split, ws in track(seeds, description="evolving"):
        if not is_generated(ws):
            # Validation and the agents run rubric code in this process; code read from a pool
            # folder is trusted only when it is exactly what the generator renders.
            report.append({"seed": ws.workspace_id, "refused": "not a workspace this project generated (its "
                           "rubric code would run unsandboxed); evolve it from Python with a sandboxed evaluation"})
            continue
        try:
            attempts = evolve(ws, evolver, config, evaluate=answers)
        except EvolutionError as err:
            report.append({"seed": ws.workspace_id, "refused": err.reason})
            continue
        valid = [v for v in attempts if v.validation.passed]
        report.append({"seed": ws.workspace_id, "attempts": [
            {"round": v.round, "workspace_id": v.workspace.workspace_id, "passed": v.validation.passed,
             "failures": list(v.validation.failures), "points": [p.kind for p in v.points],
             "execution_feedback": v.history[-1].get("execution_feedback", []),
             "chain": [v.validation.chain_seed, v.validation.chain_variant]} for v in attempts]})
        if valid and valid[-1].round == args.rounds:
            variants[split].append(valid[-1].workspace)
            pairs.append((ws, valid[-1].workspace))
    write_pool(args.out / "variants", variants)
    agents = {name: (lambda name: lambda w, trial: run_agent(name, w).success)(name) for name in args.agents}
    paired = paired_evaluation(pairs, agents)
    m = len(paired.agents)
    summary = {
        "seeds": len(seeds), "refused": sum("refused" in r for r in report), "validated": len(pairs),
        "agents": list(paired.agents),
        "seed_success": paired.seed_success.mean(0).tolist() if pairs else [],
        "variant_success": paired.variant_success.mean(0).tolist() if pairs else [],
        # None where no pair has nonzero seed success (appendix C.1 averages only those)
        "mean_delta_nonzero_seed": [None if d != d else d for d in paired.mean_delta().tolist()] if pairs else [],
        "share_lower_for_all_agents": paired.share_lower(m) if pairs else None,
        "share_lower_for_at_least_one": paired.share_lower(1) if pairs else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "evolution.json").write_text(json.dumps({"summary": summary, "seeds": report,
                                                          "paired": {"tasks": list(paired.tasks),
                                                                     "delta": paired.delta.tolist(),
                                                                     "h": paired.h.tolist()}}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
