"""Train and evaluate file verifiers (Env-Rethink "cleaning", section 4.1; metrics of appendix B.4).

Reads a labelled pool folder (``experiments/rethink_generate.py``), fits the learned verifier on its
``train`` split (or loads the one saved in ``<out>/model`` when it was fitted on the same data and
config: resumable), and evaluates every verifier (the filename and newest-timestamp baselines, the
rule-based evidence reader, the learned one) on the training-source and held-out splits: partition,
noise-category, observed-stage and joint accuracy as pooled counts (missing predictions count as
wrong), and table 6's selection counts. Writes ``<out>/verification.json``.

Usage:
    python experiments/rethink_generate.py --out runs/rethink_pool
    python experiments/rethink_verifier.py --pool runs/rethink_pool --out runs/rethink_verifier
    python experiments/rethink_verifier.py --pool runs/rethink_pool --learned.steps 600 --learned.hidden 128
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import tyro
from rich.console import Console
from rich.progress import track
from rich.table import Table

from envsched_jax.rethink import paper
from envsched_jax.rethink.learned_verifier import LearnedConfig, fit, load, save, training_data_hash
from envsched_jax.rethink.store import read_pool
from envsched_jax.rethink.verify import VERIFIERS, evaluate, make_verifier, preparation_scores, verify


@dataclasses.dataclass(frozen=True)
class Args:
    pool: Path = Path("runs/rethink_pool")
    out: Path = Path("runs/rethink_verifier")
    learned: LearnedConfig = LearnedConfig()
    seed: int = 0


def learned_verifier(args: Args, train):
    folder = args.out / "model"
    try:
        saved = load(folder)
        if saved.data_hash == training_data_hash(train) and saved.config == args.learned:
            return saved, "loaded"
    except Exception:       # missing, partial (an interrupted save) or another layout: fit afresh
        pass
    model = fit(train, args.learned, args.seed)
    save(model, folder)
    return model, "fitted"


def main(args: Args) -> dict:
    splits = read_pool(args.pool)
    train, held_out = splits.get("train", []), splits.get("held_out", [])
    if not train:
        raise SystemExit(f"{args.pool} has no train split to fit the learned verifier on")
    verifiers = {name: make_verifier(name) for name in VERIFIERS}
    verifiers["learned"], how = learned_verifier(args, train)
    results = {}
    for name, verifier in track(list(verifiers.items()), description="evaluating"):
        results[name] = {"training_source": evaluate(verifier, train).to_json(),
                         "held_out": evaluate(verifier, held_out).to_json() if held_out else None,
                         "preparation": preparation_scores((verify(verifier, w), w) for w in train + held_out).to_json()}
    out = {"pool": str(args.pool), "train_workspaces": len(train), "held_out_workspaces": len(held_out),
           "learned_model": how, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verification.json").write_text(json.dumps(out, indent=1) + "\n")
    table = Table(title="File verification accuracy (%): training-source / held-out")
    for col in ("verifier", "partition", "noise category", "observed stage", "joint"):
        table.add_column(col)
    for name, r in results.items():
        row = []
        for metric in ("partition", "category", "stage", "joint"):
            cells = [r[split][metric] for split in ("training_source", "held_out") if r[split] is not None]
            row.append(" / ".join("--" if c["rate"] is None else f"{100 * c['rate']:.1f} ({c['correct']}/{c['eligible']})"
                                  for c in cells))
        table.add_row(name, *row)
    for who, k in (("paper Qwen3.8-27B", 0), ("paper Env-Rethink", 1)):
        table.add_row(who, *[f"{paper.VERIFICATION['training_source'][m][k]:.1f} / "
                             f"{paper.VERIFICATION['held_out'][m][k]:.1f}"
                             for m in ("partition", "noise_category", "observed_stage", "joint")])
    Console().print(table)
    return out


if __name__ == "__main__":
    main(tyro.cli(Args))
