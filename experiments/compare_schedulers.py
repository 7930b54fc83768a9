"""EnvSched vs Random (and DPS) on the real end-to-end recipe, several seeds, the same budget.

For each seed the policy is warm-started once (SFT on reference trajectories) and cached, so every
scheduler of that seed starts from the very same policy; then each scheduler trains for
``--steps`` GRPO steps (``experiments/train_grpo.py``'s loop, same batch size, group size and
sampling). Reported per scheduler, mean and standard deviation over seeds: the paper's
statistics (within-group reward variance of the selected batches, environments per batch,
informative groups), the training reward, and the held-out reward (greedy, tasks seen by neither
the warm start nor GRPO) before and after training. Writes ``comparison.csv``,
``comparison.json`` and ``comparison.png`` (mean curves) to ``--out``; each run keeps its own
folder (``<scheduler>_s<seed>``), so an interrupted comparison resumes where it stopped.

Usage:
    python experiments/compare_schedulers.py                              # 3 x 3 runs, CPU recipe
    python experiments/compare_schedulers.py --schedulers envsched random --seeds 0 --steps 10
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import tyro

from envsched_jax.training.config import TrainConfig
from envsched_jax.training.loop import train
from envsched_jax.training.metrics import read_metrics


@dataclasses.dataclass(frozen=True)
class Args:
    schedulers: tuple[str, ...] = ("envsched", "random", "dps")
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 30
    """GRPO steps per run (the same budget for every scheduler)."""
    base: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Everything else of each run (``--base.learner.sft-steps``, ``--base.rollout.sandbox``...)."""
    out: Path = Path("runs/compare_schedulers")
    shared_warm_start: bool = False
    """False: each seed warm-starts its own policy (the seed-to-seed spread includes the warm
    start). True: the first run's warm start (made with the first seed) is shared by every seed
    and scheduler, so the seeds vary only the GRPO phase (sampling, the scheduler's randomness);
    cheaper on a CPU. Either way every scheduler of a seed starts from the same policy, and the
    step-0 held-out evaluation (greedy) is computed once per warm start and shared."""


STATS = ("group_variance", "environments", "informative_groups", "mean_reward")


def run_stats(folder: Path) -> dict[str, float]:
    steps = read_metrics(folder / "metrics.jsonl", "step")
    evals = read_metrics(folder / "metrics.jsonl", "eval")
    out = {k: float(np.mean([s[k] for s in steps])) for k in STATS}
    out["last5_reward"] = float(np.mean([s["mean_reward"] for s in steps[-5:]]))
    out["heldout_before"] = evals[0]["heldout_reward"]
    out["heldout_after"] = evals[-1]["heldout_reward"]
    out["heldout_gain"] = out["heldout_after"] - out["heldout_before"]
    out["step_seconds"] = float(np.mean([s["step_seconds"] for s in steps]))
    return out


def mean_curves(folders: list[Path], kind: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    series = [[r[metric] for r in read_metrics(f / "metrics.jsonl", kind)] for f in folders]
    n = min(len(s) for s in series)
    steps = [r["step"] for r in read_metrics(folders[0] / "metrics.jsonl", kind)][:n]
    return np.asarray(steps), np.mean([s[:n] for s in series], axis=0)


def main(args: Args) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    folders: dict[str, list[Path]] = {name: [] for name in args.schedulers}
    for seed in args.seeds:
        cache = args.out / ("warm_start_shared" if args.shared_warm_start
                            else f"warm_start_s{seed}")
        for name in args.schedulers:
            folder = args.out / f"{name}_s{seed}"
            cfg = dataclasses.replace(
                args.base, seed=seed, steps=args.steps, out=folder,
                scheduler=dataclasses.replace(args.base.scheduler, name=name),
                learner=dataclasses.replace(args.base.learner, sft_cache=cache))
            print(f"== {name}, seed {seed} -> {folder}")
            train(cfg)
            folders[name].append(folder)
    table = {}
    for name, runs in folders.items():
        stats = [run_stats(f) for f in runs]
        table[name] = {k: {"mean": float(np.mean([s[k] for s in stats])),
                           "std": float(np.std([s[k] for s in stats])),
                           "runs": [s[k] for s in stats]} for k in stats[0]}
    keys = list(next(iter(table.values())))
    with (args.out / "comparison.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scheduler", *[f"{k}_{m}" for k in keys for m in ("mean", "std")]])
        for name, stats in table.items():
            writer.writerow([name, *[f"{stats[k][m]:.4f}" for k in keys for m in ("mean", "std")]])
    (args.out / "comparison.json").write_text(json.dumps(table, indent=2) + "\n")
    plot(folders, args.out / "comparison.png")
    width = max(len(n) for n in table)
    print(f"{'scheduler':{width}}  " + "  ".join(f"{k:>20}" for k in keys))
    for name, stats in table.items():
        print(f"{name:{width}}  " + "  ".join(
            f"{stats[k]['mean']:>12.4f} +- {stats[k]['std']:.3f}" for k in keys))
    return table


def plot(folders: dict[str, list[Path]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("step", "mean_reward", "training reward"), ("eval", "heldout_reward", "held-out reward"),
              ("step", "group_variance", "within-group variance"),
              ("step", "environments", "environments per batch"))
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 3.6))
    for ax, (kind, metric, title) in zip(axes, panels):
        for name, runs in folders.items():
            x, y = mean_curves(runs, kind, metric)
            ax.plot(x, y, label=f"{name} (mean of {len(runs)})")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main(tyro.cli(Args))
