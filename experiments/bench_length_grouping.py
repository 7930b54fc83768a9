"""Length-grouped GRPO updates against the batch padded to its longest row, same model, same batch.

Agent episodes differ several-fold in length; the learner's plain step pads every row to the
longest and pays that row's attention cost on all of them. ``TrainerConfig.length_grouping``
sorts the rows by length and pads each micro-batch of ``--micro-batch-size`` rows to its own
power-of-two width. This script builds one GRPO batch of ``--rows`` sequences whose lengths are
drawn log-uniformly between ``--min-len`` and ``--max-len`` (seeded; a stand-in for a step of the
CPU recipe, whose episodes ran from a few hundred tokens to the 2,048 limit), and times one
update of each trainer on the tiny CPU policy (the recipe's default shape) from the same weights:
the first call (compilation included) and the median of ``--steps`` later calls. It also checks
that the two updates agree (largest parameter difference after one update from the same state).

Usage:
    python experiments/bench_length_grouping.py
    python experiments/bench_length_grouping.py --rows 64 --max-len 4096
Results go to ``runs/bench_length_grouping.json``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from envsched_jax.learner import models
from envsched_jax.learner.trainer import PolicyBatch, Trainer, TrainerConfig
from envsched_jax.training.config import TrainConfig
from envsched_jax.training.warm_start import tiny_hf_config


@dataclasses.dataclass(frozen=True)
class Args:
    rows: int = 32
    """Sequences in the batch (the CPU recipe: 8 tasks x 4 rollouts)."""
    min_len: int = 256
    max_len: int = 2048
    prompt_len: int = 128
    """Leading tokens of every row outside the loss mask."""
    micro_batch_size: int = 4
    pad_multiple: int = 64
    steps: int = 3
    seed: int = 0
    out: Path = Path("runs/bench_length_grouping.json")


class _StandInTokenizer:
    """All the recipe's model config reads of a tokenizer: its size and two special ids."""

    eos_token_id, pad_token_id = 1, 0

    def __len__(self) -> int:
        return TrainConfig().policy.vocab_size


def tiny_config() -> dict:
    """The CPU recipe's default policy, built by the recipe's own function."""
    return tiny_hf_config(TrainConfig(), _StandInTokenizer())


def ragged_batch(args: Args, vocab: int) -> PolicyBatch:
    rng = np.random.default_rng(args.seed)
    lengths = np.exp(rng.uniform(np.log(args.min_len), np.log(args.max_len), args.rows)).astype(int)
    width = -(-int(lengths.max()) // args.pad_multiple) * args.pad_multiple
    tokens = rng.integers(2, vocab, size=(args.rows, width)).astype(np.int32)
    attention = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    loss = attention.astype(np.float32)
    loss[:, :args.prompt_len] = 0.0
    old = np.where(attention > 0, -np.log(vocab) + rng.normal(0, 0.1, attention.shape), 0.0)
    advantages = rng.normal(size=args.rows).astype(np.float32)
    return PolicyBatch(jnp.asarray(tokens), jnp.asarray(attention), jnp.asarray(loss),
                       jnp.asarray(advantages), jnp.asarray(old, jnp.float32))


def time_trainer(trainer: Trainer, batch: PolicyBatch, steps: int) -> dict[str, float]:
    first = trainer.train(batch)["step_seconds"]
    later = [trainer.train(batch)["step_seconds"] for _ in range(steps)]
    return {"first_call_s": first, "median_s": statistics.median(later)}


def main(args: Args) -> dict:
    hf = tiny_config()
    batch = ragged_batch(args, hf["vocab_size"])
    lengths = np.asarray(batch.attention_mask).sum(axis=1)
    results = {"args": {k: str(v) for k, v in dataclasses.asdict(args).items()},
               "lengths": {"mean": float(lengths.mean()), "max": int(lengths.max()),
                           "padded_width": int(batch.tokens.shape[1])}}
    configs = {"padded": TrainerConfig(micro_batch_size=args.micro_batch_size),
               "length_grouped": TrainerConfig(micro_batch_size=args.micro_batch_size,
                                               length_grouping=True,
                                               pad_multiple=args.pad_multiple)}
    trainers = {name: Trainer(models.make_model(hf, seed=args.seed), models.forward, c)
                for name, c in configs.items()}
    # agreement: the first update from the same initial state (its loss and gradient norm; the
    # parameters after a first Adam step are lr * sign(g) and would hide a wrong magnitude)
    first = {name: t.train(batch) for name, t in trainers.items()}
    diff = max(abs(first["padded"][k] - first["length_grouped"][k])
               / max(abs(first["padded"][k]), 1e-12) for k in ("loss", "grad_norm"))
    results["first_update_relative_difference"] = diff
    for name, trainer in trainers.items():
        start = time.perf_counter()
        results[name] = time_trainer(trainer, batch, args.steps)
        results[name]["wall_s"] = time.perf_counter() - start
    ratio = results["padded"]["median_s"] / results["length_grouped"]["median_s"]
    results["speedup"] = ratio
    print(f"batch: {args.rows} rows, lengths mean {lengths.mean():.0f} max {lengths.max()}, "
          f"padded width {batch.tokens.shape[1]}")
    for name in configs:
        r = results[name]
        print(f"{name:15s} median {r['median_s']:7.2f} s per update "
              f"(after the agreement update's compile; {r['first_call_s']:.2f} s first timed)")
    print(f"speed-up (padded / length-grouped, same run): {ratio:.2f}x; largest "
          f"relative difference of the first update's loss / grad norm: {diff:.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
