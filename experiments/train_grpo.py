"""End-to-end GRPO training with a scheduler in the loop, on real sandboxed environments.

select (EnvSched, Random, DPS, ...) -> agent rollouts (the policy acting through tools in
bubblewrap / Docker / in-process environments) -> verifier rewards -> observe -> one GRPO update
-> weight sync -> held-out evaluation -> checkpoint. The defaults are the CPU recipe: a tiny
Llama-architecture policy with a tokenizer trained on the pool's text (a generated pool of 8
environments x 40 templated tasks), warm-started by masked SFT (1,200 steps) on reference
trajectories of 20 tasks per environment, then GRPO on the other tasks (4 per environment held
out). Writes to ``--out``: ``metrics.jsonl`` and TensorBoard files
(``tb/``), ``curves.png``, ``summary.json``, ``checkpoints/step_*``, ``tokenizer/``. A run
killed part-way resumes from its newest checkpoint when started again with the same flags.

Usage:
    python experiments/train_grpo.py                                  # the CPU recipe, EnvSched
    python experiments/train_grpo.py --scheduler.name random --seed 1 --out runs/grpo_random_s1
    python experiments/train_grpo.py --steps 3 --learner.sft-steps 20 --out runs/grpo_smoke
    # SmolLM2-135M (slow on CPU; the documented recipe for an accelerator):
    python experiments/train_grpo.py --policy.source smollm2 --learner.sft-steps 0 \\
        --rollout.agent.tool-catalog full --rollout.agent.system-prompt "$(python -c \\
        'from envsched_jax.rollout.agent import DEFAULT_SYSTEM_PROMPT as p; print(p)')" \\
        --rollout.max-context 8192 --learner.micro-batch-size 1 --learner.remat \\
        --out runs/grpo_smollm2
"""

from __future__ import annotations

import json

import tyro

from envsched_jax.training.config import TrainConfig
from envsched_jax.training.loop import train


def main(cfg: TrainConfig) -> dict:
    summary = train(cfg)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return summary


if __name__ == "__main__":
    main(tyro.cli(TrainConfig))
