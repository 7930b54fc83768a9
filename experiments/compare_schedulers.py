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
    python experiments/compare_schedulers.py --report-only     # tables and plot from the folders

Statistics per run: the means over steps of the paper's batch statistics and of the training
reward; ``reward_slope`` (least-squares slope of the training reward over the steps, per step,
``scipy.stats.linregress``; it mixes learning with what the scheduler chose to train on, so it is
not comparable across schedulers as a learning measure); ``last5_reward``; and the held-out
reward (the same tasks, greedy) at the first and last evaluation and their difference; with
``--base.probe-tasks``, the same for the training-task probe (``probe_before``, ``probe_after``,
``probe_gain``: the same training tasks for every run, sampled with fixed seeds).

Paired per-task figures (``paired.json``, printed after the table): the held-out evaluation and
the probe score the same tasks in every run, so each run's first and last per-task rewards are
paired: tasks up / down and the Wilcoxon signed-rank p-value (``scipy.stats.wilcoxon``, two-sided,
tasks with no change dropped as Wilcoxon's rule does; p = 1 when no task changed). Each scheduler
after the first is also compared with the first on the last evaluation's per-task rewards averaged
over the seeds (tasks up / down against the first scheduler, mean difference, Wilcoxon p). The
seeds share a warm start only with ``--shared-warm-start``; otherwise per-task means still pair
by task but mix warm starts.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import scipy.stats
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
    report_only: bool = False
    """Train nothing: read the run folders already in ``--out`` and write the tables and plot."""


STATS = ("group_variance", "environments", "informative_groups", "mean_reward")


def run_stats(folder: Path) -> dict[str, float]:
    steps = read_metrics(folder / "metrics.jsonl", "step")
    evals = read_metrics(folder / "metrics.jsonl", "eval")
    out = {k: float(np.mean([s[k] for s in steps])) for k in STATS}
    out["reward_slope"] = float(scipy.stats.linregress(
        [s["step"] for s in steps], [s["mean_reward"] for s in steps]).slope) \
        if len(steps) > 1 else 0.0
    out["last5_reward"] = float(np.mean([s["mean_reward"] for s in steps[-5:]]))
    out["heldout_before"] = evals[0]["heldout_reward"]
    out["heldout_after"] = evals[-1]["heldout_reward"]
    out["heldout_gain"] = out["heldout_after"] - out["heldout_before"]
    out["step_seconds"] = float(np.mean([s["step_seconds"] for s in steps]))
    probes = read_metrics(folder / "metrics.jsonl", "probe")
    if probes:
        out["probe_before"] = probes[0]["probe_reward"]
        out["probe_after"] = probes[-1]["probe_reward"]
        out["probe_gain"] = out["probe_after"] - out["probe_before"]
    return out


TASK_REWARDS = {"eval": "heldout_task_rewards", "probe": "probe_task_rewards"}


def paired_change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Tasks up / down from ``before`` to ``after`` (the same task ids) and the two-sided Wilcoxon
    signed-rank p-value of the per-task differences (1.0 when no task changed)."""
    if set(before) != set(after):
        raise ValueError(f"paired per-task rewards need the same tasks: {len(before)} vs "
                         f"{len(after)} task ids, {len(set(before) ^ set(after))} not in both")
    diff = np.array([after[t] - before[t] for t in sorted(before)])
    changed = np.abs(diff) > 1e-9
    p = float(scipy.stats.wilcoxon(diff[changed]).pvalue) if changed.any() else 1.0
    return {"tasks": int(diff.size), "up": int((diff > 1e-9).sum()),
            "down": int((diff < -1e-9).sum()), "mean_diff": float(diff.mean()), "p": p}


def paired_report(folders: dict[str, list[Path]]) -> dict:
    """Per run: first -> last per-task change of the held-out evaluation and the probe. Per
    scheduler after the first: its seed-mean last per-task rewards against the first's."""
    first = next(iter(folders))
    report: dict = {"runs": {}, "against_" + first: {}}
    last: dict[str, dict[str, dict[str, float]]] = {}
    for name, runs in folders.items():
        for kind, key in TASK_REWARDS.items():
            records = [read_metrics(f / "metrics.jsonl", kind) for f in runs]
            if not all(records):
                continue
            for folder, recs in zip(runs, records):
                report["runs"].setdefault(folder.name, {})[kind] = paired_change(
                    recs[0][key], recs[-1][key])
            tasks = sorted(records[0][-1][key])
            last.setdefault(name, {})[kind] = {
                t: float(np.mean([recs[-1][key][t] for recs in records])) for t in tasks}
    for name in list(folders)[1:]:
        for kind in last.get(name, {}):
            if kind in last.get(first, {}):
                report["against_" + first].setdefault(name, {})[kind] = paired_change(
                    last[first][kind], last[name][kind])
    return report


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
            if args.report_only:
                if not (folder / "metrics.jsonl").is_file():
                    raise FileNotFoundError(f"{folder}: no metrics.jsonl (run it first, without "
                                            "--report-only)")
            else:
                print(f"== {name}, seed {seed} -> {folder}")
                train(cfg)
            folders[name].append(folder)
    table = {}
    for name, runs in folders.items():
        stats = [run_stats(f) for f in runs]
        table[name] = {k: {"mean": float(np.mean([s[k] for s in stats])),
                           # sample standard deviation over the seeds (0 for a single seed)
                           "std": float(np.std([s[k] for s in stats], ddof=1))
                           if len(stats) > 1 else 0.0,
                           "runs": [s[k] for s in stats]} for k in stats[0]}
    keys = list(next(iter(table.values())))
    with (args.out / "comparison.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["scheduler", *[f"{k}_{m}" for k in keys for m in ("mean", "std")]])
        for name, stats in table.items():
            writer.writerow([name, *[f"{stats[k][m]:.4f}" for k in keys for m in ("mean", "std")]])
    (args.out / "comparison.json").write_text(json.dumps(table, indent=2) + "\n")
    paired = paired_report(folders)
    (args.out / "paired.json").write_text(json.dumps(paired, indent=2) + "\n")
    plot(folders, args.out / "comparison.png")
    width = max(len(n) for n in table)
    print(f"{'scheduler':{width}}  " + "  ".join(f"{k:>20}" for k in keys))
    for name, stats in table.items():
        print(f"{name:{width}}  " + "  ".join(
            f"{stats[k]['mean']:>12.4f} +- {stats[k]['std']:.3f}" for k in keys))
    label = {"eval": "held-out", "probe": "probe"}
    print("per task, first -> last evaluation (up / down, Wilcoxon p):")
    for run, kinds in paired["runs"].items():
        print(f"  {run}: " + "; ".join(f"{label[k]} {c['up']} up / {c['down']} down, p = {c['p']:.3g}"
                                       for k, c in kinds.items()))
    first = next(iter(folders))
    for name, kinds in paired["against_" + first].items():
        print(f"  {name} vs {first}, last evaluation, seed means per task: " + "; ".join(
            f"{label[k]} {c['up']} higher / {c['down']} lower, mean {c['mean_diff']:+.4f}, "
            f"p = {c['p']:.3g}" for k, c in kinds.items()))
    return table


def plot(folders: dict[str, list[Path]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("step", "mean_reward", "training reward"), ("eval", "heldout_reward", "held-out reward"),
              ("step", "group_variance", "within-group variance"),
              ("step", "environments", "environments per batch"))
    if all(read_metrics(f / "metrics.jsonl", "probe") for runs in folders.values() for f in runs):
        panels += (("probe", "probe_reward", "training-task probe reward"),)
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
