"""Envs-FORGE end to end: seeds + a rollout log -> N gold-verified bundles, with a report.

Pass rates from the log (Jeffreys intervals), six candidates per seed, the selection MILP (SCIP,
per seed or as a portfolio; fixed recipes as action masks), materialisation (programmatic for the
built-in families, or an LLM through an OpenAI-compatible server with the appendix-C prompts and
a repair loop), gold verification in the local Docker engine, export. Writes to ``--out``:
``exports/`` (accepted bundles: a ``bundles:DIR`` pool), ``rejected/`` (the last rejected bundle
of each failed request, with its reasons), ``selection.json`` (the solver's auditable payload),
``results.jsonl`` (one line per request), ``report.json``. Interrupted runs resume where they
stopped when started again with the same flags; accepted exports are not verified again.

Usage:
    python experiments/forge_rollouts.py --out runs/forge/rollouts.jsonl      # a (simulated) log
    python experiments/forge_synthesize.py --rollout-log runs/forge/rollouts.jsonl --out runs/forge/forge
    python experiments/forge_synthesize.py --rollout-log runs/forge/rollouts.jsonl --recipe evol_instruct \\
        --out runs/forge/evol
    python experiments/forge_synthesize.py --seeds my_bundles/ --rollout-log runs/grpo/rollouts.jsonl \\
        --materializer llm --llm.model my-model --llm.base-url http://127.0.0.1:8000 --num-exports 100
    python experiments/forge_synthesize.py --rollout-log LOG --mode portfolio --num-exports 20 --out runs/forge/pf
"""

from __future__ import annotations

import json

import tyro

from envsched_jax.forge.pipeline import SynthesisConfig, synthesize


def main(cfg: SynthesisConfig) -> dict:
    report = synthesize(cfg)
    summary = {k: report[k] for k in ("recipe", "exported", "requests", "materialized", "solver",
                                      "rejected_requests_by_failure", "verification", "seconds")}
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return report


if __name__ == "__main__":
    main(tyro.cli(SynthesisConfig))
