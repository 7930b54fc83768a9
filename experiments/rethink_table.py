"""Env-Rethink's results, in the shape of the paper's, on the generated workspace benchmark.

Three tables, each printed beside the paper's figures (:mod:`envsched_jax.rethink.paper`):

1. **Clean vs Noise vs EGS vs TGS** (section 2.2 / figure 3, section 5.2 / table 1): rubric pass
   rate (passed / total checks, pooled over every workspace) and task success of each agent in
   the ground-truth-selected workspace (Clean), the full one (Noise), and the full one with the
   Collection Map and Event Log prepared without (EGS) or with (TGS) task supervision. The
   agents are :mod:`envsched_jax.rethink.agents`' offline stand-ins (they trust filenames or
   timestamps, or read registers carefully); a prepared layer reaches them through
    the layer's tools (``list_collections``, ``file_history``).
2. **File verification** (table 2, table 6): appendix B.4's pooled accuracies of every verifier
   on training-source and held-out workspaces (split by parent task), and table 6's selection
   counts. The learned verifier is fitted on the training split only.
3. **Evolution** (section 5.4, appendix C.1): how many seeds the heuristic evolver turns into
   validated variants, the agents' success on seed and variant, and the share of validated
   variants with lower success (Delta <= -20 points) for at least one agent and for all agents.

The paper's figures come from LLM agents on real workspaces; ours from heuristic agents on a
generated benchmark. Only the shape (which condition is above which) is comparable, and it is
reported whichever way it comes out. Prepared layers are cached under ``<out>/prepared`` (keyed
by mode and content hash), so a rerun resumes.

Usage:
    python experiments/rethink_table.py
    python experiments/rethink_table.py --generator.num-parents 24 --out runs/rethink_table_24
    python experiments/rethink_table.py --llm-agent --llm.client openai --llm.base-url http://127.0.0.1:8000 --llm.model M
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path

import tyro
from rich.console import Console
from rich.progress import track
from rich.table import Table

from envsched_jax.rethink import paper
from envsched_jax.rethink.agents import AGENTS, run_agent
from envsched_jax.rethink.collection_map import CollectionMap
from envsched_jax.rethink.event_log import EventLog, PreparedLayer, prepare
from envsched_jax.rethink.evolve import (
    EvolutionError,
    EvolveConfig,
    HeuristicEvolver,
    HeuristicEvolverConfig,
    evolve,
    paired_evaluation,
)
from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.learned_verifier import LearnedConfig, fit
from envsched_jax.rethink.llm_agent import LLMAgentConfig, make_llm_agent
from envsched_jax.rethink.roles import make_roles
from envsched_jax.rethink.verify import VERIFIERS, evaluate, make_verifier, preparation_scores, verify
from envsched_jax.rethink.workspace import Workspace

CONDITIONS = ("clean", "noise", "egs", "tgs")


@dataclasses.dataclass(frozen=True)
class Args:
    out: Path = Path("runs/rethink_table")
    generator: GeneratorConfig = GeneratorConfig()
    agents: tuple[str, ...] = tuple(AGENTS)
    llm_agent: bool = False
    """Also run an LLM agent (``--llm.*``: the in-process JAX model or an OpenAI-compatible server)
    in every condition of table 1 (slow on a CPU: see docs/papers/rethink.md)."""
    llm: LLMAgentConfig = LLMAgentConfig()
    learned: LearnedConfig = LearnedConfig()
    evolver: HeuristicEvolverConfig = HeuristicEvolverConfig()
    seed: int = 0
    """Seeds the learned verifier and the evolver."""


def _pct(x: float | None) -> str:
    return "--" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def prepared_layer(ws: Workspace, mode: str, cache: Path) -> PreparedLayer:
    """``ws``'s prepared layer in ``mode`` (heuristic roles), prepared once and cached."""
    labels = json.dumps({p: lab.to_json() for p, lab in sorted(ws.labels().items())}, sort_keys=True)
    key = hashlib.sha256((ws.content_hash() + labels).encode()).hexdigest()[:16]    # TGS reads the labels
    folder = cache / mode / key
    if not (folder / "prepare_report.json").exists():
        tmp = folder.with_name(folder.name + ".partial")
        for stale in (tmp, folder):
            if stale.exists():
                shutil.rmtree(stale)
        layer = prepare(ws, mode=mode, roles=make_roles("heuristic"), out_dir=tmp)
        tmp.rename(folder)
        return layer
    cmap = CollectionMap.from_json(json.loads((folder / "collection_map.json").read_text()))
    log = EventLog.from_json(json.loads((folder / "event_log.json").read_text()))
    return PreparedLayer(cmap, log, json.loads((folder / "prepare_report.json").read_text()))


def agent_table(workspaces: list[Workspace], agents: dict, cache: Path) -> dict:
    """``agents``: name -> ``(workspace, layer) -> AgentRun``."""
    results = {a: {c: {"passed": 0, "total": 0, "success": 0} for c in CONDITIONS} for a in agents}
    for ws in track(workspaces, description="agents x conditions"):
        layers = {"egs": prepared_layer(ws, "egs", cache), "tgs": prepared_layer(ws, "tgs", cache)}
        for agent, play in agents.items():
            for cond in CONDITIONS:
                run = play(ws.clean() if cond == "clean" else ws, layers.get(cond))
                row = results[agent][cond]
                row["passed"] += run.passed
                row["total"] += run.total
                row["success"] += int(run.success)
    for agent in agents:
        for cond in CONDITIONS:
            row = results[agent][cond]
            row["rate"] = row["passed"] / row["total"]
            row["success_rate"] = row["success"] / len(workspaces)
    return results


def verification_table(train: list[Workspace], held_out: list[Workspace], learned: LearnedConfig, seed: int) -> dict:
    verifiers = {name: make_verifier(name) for name in VERIFIERS}
    verifiers["learned"] = fit(train, learned, seed)
    out = {}
    for name, verifier in track(list(verifiers.items()), description="verifiers"):
        out[name] = {"training_source": evaluate(verifier, train).to_json(),
                     "held_out": evaluate(verifier, held_out).to_json(),
                     "preparation": preparation_scores((verify(verifier, w), w) for w in train + held_out).to_json()}
    return out


def evolution_table(workspaces: list[Workspace], agents: tuple[str, ...], config: HeuristicEvolverConfig,
                    seed: int) -> dict:
    evolver = HeuristicEvolver(config)
    pairs, refused, failed = [], {}, 0
    for ws in track(workspaces, description="evolution"):
        try:
            variants = evolve(ws, evolver, EvolveConfig(rounds=1, seed=seed))
        except EvolutionError as err:
            reason = err.reason.split(", got")[0]      # grouped by reason, not by the value refused
            refused[reason] = refused.get(reason, 0) + 1
            continue
        valid = [v for v in variants if v.validation.passed]
        if valid:
            pairs.append((ws, valid[-1].workspace))
        else:
            failed += 1
    runner = {a: (lambda a: lambda w, trial: run_agent(a, w).success)(a) for a in agents}
    paired = paired_evaluation(pairs, runner)
    m = len(agents)
    return {"seeds": len(workspaces), "refused": sum(refused.values()), "refusal_reasons": refused,
            "failed_validation": failed, "validated": len(pairs),
            "seed_success": dict(zip(agents, paired.seed_success.mean(0).tolist())) if pairs else {},
            "variant_success": dict(zip(agents, paired.variant_success.mean(0).tolist())) if pairs else {},
            "lower_for_at_least_one": int((paired.h >= 1).sum()), "lower_for_all": int((paired.h >= m).sum()),
            "share_lower_for_at_least_one": paired.share_lower(1) if pairs else None,
            "share_lower_for_all": paired.share_lower(m) if pairs else None}


def main(args: Args) -> dict:
    console = Console()
    bench = generate_benchmark(args.generator)
    train, held_out = list(bench.train), list(bench.held_out)
    workspaces = train + held_out
    args.out.mkdir(parents=True, exist_ok=True)
    players = {name: (lambda name: lambda ws, layer: run_agent(name, ws, layer))(name) for name in args.agents}
    llm = make_llm_agent(args.llm) if args.llm_agent else None
    if llm is not None:
        players[args.llm.agent_name()] = llm.run
    try:
        agents = agent_table(workspaces, players, args.out / "prepared")
    finally:
        if llm is not None:
            llm.close()
    verification = verification_table(train, held_out, args.learned, args.seed)
    evolution = evolution_table(workspaces, args.agents, args.evolver, args.seed)
    result = {"benchmark": {"workspaces": len(workspaces), "train": len(train), "held_out": len(held_out),
                            "files": sum(len(w.files) for w in workspaces),
                            "checks": sum(len(w.rubric) for w in workspaces)},
              "agents": agents, "verification": verification, "evolution": evolution,
              "args": json.loads(json.dumps(dataclasses.asdict(args), default=str))}
    (args.out / "rethink_table.json").write_text(json.dumps(result, indent=1) + "\n")

    b = result["benchmark"]
    t1 = Table(title=f"1. Rubric pass rate (%) \\[task success %]: {b['workspaces']} workspaces, {b['checks']} checks")
    for col in ("agent",) + CONDITIONS:
        t1.add_column(col, justify="left" if col == "agent" else "right")
    for agent in agents:
        t1.add_row(agent, *[f"{_pct(agents[agent][c]['rate'])} [{_pct(agents[agent][c]['success_rate'])}]"
                            for c in CONDITIONS])
    t1.add_row("paper (mean)", f"{paper.CLEAN_VS_NOISE['clean_mean']:.1f}", f"{paper.CLEAN_VS_NOISE['noise_mean']:.1f}",
               f"{sum(r['egs'] for r in paper.SYNTHESIS.values()) / len(paper.SYNTHESIS):.1f} (5 models)",
               f"{sum(r['tgs'] for r in paper.SYNTHESIS.values()) / len(paper.SYNTHESIS):.1f} (5 models)")
    console.print(t1)

    t2 = Table(title="2. File verification accuracy (%), training-source / held-out (appendix B.4 pooled counts)")
    for col in ("verifier", "partition", "noise category", "observed stage", "joint", "std recall", "noise admitted"):
        t2.add_column(col, justify="left" if col == "verifier" else "right")
    for name, scores in verification.items():
        cells = []
        for metric in ("partition", "category", "stage", "joint"):
            tr, ho = scores["training_source"][metric], scores["held_out"][metric]
            cells.append(f"{_pct(tr['rate'])} / {_pct(ho['rate'])}")
        prep = scores["preparation"]
        t2.add_row(name, *cells, _pct(prep["standard_recall"]), str(prep["noise_admitted"]))
    for who, k in (("paper Qwen3.8-27B", 0), ("paper Env-Rethink", 1)):
        t2.add_row(who, *[f"{paper.VERIFICATION['training_source'][m][k]:.1f} / {paper.VERIFICATION['held_out'][m][k]:.1f}"
                          for m in ("partition", "noise_category", "observed_stage", "joint")],
                   f"{paper.PREPARATION['Qwen3.8-27B' if k == 0 else 'Env-Rethink']['standard_recall']:.1f}",
                   str(paper.PREPARATION['Qwen3.8-27B' if k == 0 else 'Env-Rethink']['noise_admitted']))
    console.print(t2)

    e = evolution
    t3 = Table(title="3. Evolution (heuristic evolver, one round, >= 3 decision points)")
    t3.add_column("quantity")
    t3.add_column("ours", justify="right")
    t3.add_column("paper", justify="right")
    t3.add_row("seeds / refused (non-numeric) / failed validation / validated",
               f"{e['seeds']} / {e['refused']} / {e['failed_validation']} / {e['validated']}",
               f"59 seeds, {paper.EVOLUTION['paired_tasks']} paired")
    for agent in args.agents:
        t3.add_row(f"success seed -> variant: {agent}",
                   f"{_pct(e['seed_success'].get(agent))} -> {_pct(e['variant_success'].get(agent))}", "")
    t3.add_row("variants with lower success for >= 1 agent", f"{e['lower_for_at_least_one']} ({_pct(e['share_lower_for_at_least_one'])} %)", "")
    t3.add_row(f"variants with lower success for all {len(args.agents)} agents",
               f"{e['lower_for_all']} ({_pct(e['share_lower_for_all'])} %)",
               f"{paper.EVOLUTION['lower_for_all_4']} of 55 for all 4; {paper.EVOLUTION['lower_for_at_least_3_of_4']} "
               f"({paper.EVOLUTION['share']} %) for >= 3 of 4")
    console.print(t3)
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
