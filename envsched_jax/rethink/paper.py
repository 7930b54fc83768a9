"""The figures Env-Rethink's paper reports (seeds/002), in one place, for printing beside ours.

All rates in percent, as printed in the paper. They are results on the paper's data (Workspace-Bench
tasks, Terminal-Bench 2.1 seeds, 27B models); nothing here is a target for the offline benchmark.
"""

from __future__ import annotations

CLEAN_VS_NOISE = {"clean_mean": 83.9, "noise_mean": 57.6, "checks": 1280, "tasks": 30, "configurations": 9}
"""Section 2.2 / figure 3: mean rubric pass rate of nine model-harness configurations."""

SYNTHESIS = {   # table 1: rubric pass rate (%) with TGS, EGS and in the noisy environment
    "DeepSeek-V4.1-Flash": {"tgs": 87.3, "egs": 82.9, "noise": 64.4},
    "GLM-5.3-Flash": {"tgs": 81.6, "egs": 63.6, "noise": 58.3},
    "Claude Opus 4.8": {"tgs": 79.6, "egs": 71.3, "noise": 60.5},
    "HY3": {"tgs": 62.0, "egs": 46.3, "noise": 45.1},
    "GPT-5.6-Sol": {"tgs": 78.2, "egs": 69.6, "noise": 62.9},
}

VERIFICATION = {   # table 2: file-verification accuracy (%), Qwen3.8-27B -> Env-Rethink
    "training_source": {"partition": (74.0, 90.0), "noise_category": (39.8, 56.8),
                        "observed_stage": (68.2, 72.0), "joint": (27.5, 45.5)},
    "held_out": {"partition": (56.2, 76.5), "noise_category": (33.4, 38.1),
                 "observed_stage": (26.1, 59.7), "joint": (19.4, 32.4)},
}
VERIFICATION_COUNTS = {   # appendix B.4: correct counts (Qwen3.8-27B, Env-Rethink) and denominators
    "training_source": {"files": 1579, "noise_files": 1492, "staged_files": 1328,
                        "partition": (1169, 1421), "noise_category": (594, 848), "observed_stage": (906, 956),
                        "joint": (434, 719)},
    "held_out": {"files": 617, "noise_files": 512, "staged_files": 372,
                 "partition": (347, 472), "noise_category": (171, 195), "observed_stage": (97, 222),
                 "joint": (120, 200)},
}

PREPARATION = {   # table 6: selection quality over 30 tasks, 2,196 files (192 standard)
    "Env-Rethink": {"selected": 431, "standard_rejected": 32, "noise_admitted": 271, "standard_recall": 83.3},
    "Qwen3.8-27B": {"selected": 742, "standard_rejected": 56, "noise_admitted": 606, "standard_recall": 70.8},
}

DOWNSTREAM_MEANS = {"full": 57.6, "qwen3.8-27b": 59.4, "env_rethink": 72.7}
"""Section 5.3.2 / table 7: mean rubric pass rate over nine downstream models."""

EVOLUTION = {"paired_tasks": 55, "lower_for_at_least_3_of_4": 32, "share": 58.2, "lower_for_all_4": 21,
             "lower_for_exactly_2": 4, "models": 4, "threshold_points": -20}
"""Section 5.4 / appendix C.1: seed vs evolved success on Terminal-Bench 2.1."""

SFT_RUN = {"train_loss": 0.199, "train_token_accuracy": 93.6, "dev_loss": 0.197, "dev_token_accuracy": 94.1,
           "epochs": 3, "steps": 168, "train_examples": 1780, "dev_examples": 201, "qualified_trajectories": 2116}
"""Appendix B.1-B.2 / tables 4-5: the SFT run (Qwen3.8-27B, LoRA rank 64, on qualified teacher
trajectories)."""
