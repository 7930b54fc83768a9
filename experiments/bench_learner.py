"""Learner train-step speed and memory: our jitted GRPO step against transformers + torch.

For each model it builds one GRPO batch (``--groups`` tasks x ``--group-size`` rollouts of
``--seq-len`` tokens: a prompt, then a generated part that is the loss mask, with some rows
left-padded) and times one full training step, forward, backward and an Adam update, in two
fresh child processes from the same weights:

* **ours**: :class:`envsched_jax.learner.trainer.Trainer` with the paper's GRPO objective (its
  step also computes the clip fraction, KLs and the entropy of the generated tokens);
* **torch**: ``transformers.AutoModelForCausalLM`` loaded from our own safetensors export of the
  same weights, the same clipped surrogate, token-mean aggregation and entropy written in torch,
  and ``torch.optim.Adam`` (eager mode, ``torch.set_num_threads(os.cpu_count())``).

Both receive the same batch, advantages (from random 0/1 rewards through the paper's
group-relative, whitened, clipped advantages) and old log-probs (the policy's own log-probs plus
N(0, ``--old-logp-noise``) so that some ratios are clipped). The first step's loss, grad norm
and clip fraction of the two must agree (printed, and the script fails if the relative grad-norm
difference exceeds ``--agreement-tol``): the comparison is of the same computation.

Figures: compile time (ours: the first call; torch: its first step), median step time over
``--steps`` steps after ``--warmup`` steps, processed tokens/s (every position of every row,
padding included: the work done) and generated tokens/s (the loss-mask tokens), peak memory (CPU:
the child's peak resident set; GPU: the device's peak allocation), and on a GPU the model FLOPs
utilisation, MFU = 6 P D + 12 L H T D (P parameters without the embedding, D processed tokens,
L layers, H = heads x head dim, T sequence length; the PaLM paper's appendix B count) over the
step time and the device's dense bf16 peak (a table of known devices; unknown devices print n/a).

Usage:
    python experiments/bench_learner.py                       # tiny_llama and SmolLM2-135M
    python experiments/bench_learner.py --models tiny_llama --steps 10
    python experiments/bench_learner.py --compute-dtype bfloat16   # on a GPU
Results go to ``runs/bench_learner.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import run_in_child  # noqa: E402

# Dense bf16 peak FLOP/s by device kind (vendor data sheets, SXM parts, no sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
    "A10G": 70e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
}


@dataclasses.dataclass(frozen=True)
class Args:
    models: tuple[str, ...] = ("tiny_llama", "smollm2")
    """Policies to time (any ``load_policy`` source: a name, a GGUF file or a safetensors folder)."""
    backends: tuple[str, ...] = ("ours", "torch")
    """``ours`` (JAX) and/or ``torch`` (transformers, the baseline)."""
    groups: int = 2
    """Tasks in the batch."""
    group_size: int = 4
    """Rollouts per task (the paper's K is 8; 2 x 4 = 8 sequences keeps SmolLM2 under a minute
    per step on two CPU cores)."""
    seq_len: int = 128
    """Tokens per sequence (prompt + generated)."""
    prompt_len: int = 48
    """Prompt tokens (masked out of the loss); the rest of the row is 'generated'."""
    steps: int = 3
    """Timed steps (median reported)."""
    warmup: int = 1
    """Untimed steps after the first (compiling) one."""
    compute_dtype: str = "float32"
    """``float32`` or ``bfloat16`` (both backends; torch uses autocast)."""
    micro_batch_size: int | None = None
    """Gradient-accumulation micro-batch (ours only; None: the whole batch)."""
    old_logp_noise: float = 0.1
    """Std of the noise added to the policy's log-probs to make the old log-probs."""
    agreement_tol: float = 1e-3
    """Largest relative grad-norm difference between the backends at the first step (f32)."""
    seed: int = 0
    out: Path = Path("runs/bench_learner.json")


# -- the shared batch ----------------------------------------------------------------------------

def make_batch(args: Args, vocab: int, pad_id: int) -> dict[str, np.ndarray]:
    """Tokens, attention mask (every third row left-padded by up to a quarter of the prompt),
    loss mask (the generated part), and advantages from random 0/1 rewards."""
    import jax.numpy as jnp

    from envsched_jax.learner.objectives import GRPOConfig, group_advantages

    rng = np.random.default_rng(args.seed)
    n, t = args.groups * args.group_size, args.seq_len
    tokens = rng.integers(3, vocab, size=(n, t)).astype(np.int32)
    attention = np.ones((n, t), np.int32)
    for row in range(0, n, 3):
        pad = int(rng.integers(1, max(2, args.prompt_len // 4)))
        attention[row, :pad] = 0
        tokens[row, :pad] = pad_id
    loss = np.zeros((n, t), np.float32)
    loss[:, args.prompt_len:] = 1.0
    rewards = rng.integers(0, 2, size=(args.groups, args.group_size)).astype(np.float32)
    rewards[0, 0], rewards[0, 1] = 1.0, 0.0  # at least one informative group
    advantages = np.asarray(group_advantages(jnp.asarray(rewards), GRPOConfig())).reshape(n)
    return {"tokens": tokens, "attention_mask": attention, "loss_mask": loss,
            "advantages": advantages.astype(np.float32)}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# -- ours ----------------------------------------------------------------------------------------

def run_ours(model_dir: str, batch: dict, args: Args, results) -> None:
    import jax
    import jax.numpy as jnp

    from envsched_jax.learner import models
    from envsched_jax.learner.trainer import PolicyBatch, Trainer, TrainerConfig

    policy = models.load_policy(model_dir, with_tokenizer=False)
    config = TrainerConfig(compute_dtype=args.compute_dtype, micro_batch_size=args.micro_batch_size)
    trainer = Trainer(policy.model, models.forward, config)
    del policy
    tokens = jnp.asarray(batch["tokens"])
    mask = jnp.asarray(batch["attention_mask"])
    policy_batch = PolicyBatch(tokens, mask, jnp.asarray(batch["loss_mask"]),
                               jnp.asarray(batch["advantages"]), jnp.asarray(batch["old_logp"]))
    start = time.perf_counter()
    first = trainer.train(policy_batch)
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        trainer.train(policy_batch)
    times = [trainer.train(policy_batch)["step_seconds"] for _ in range(args.steps)]
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    results.put({
        "compile_s": compile_s, "step_s": times, "loss": first["loss"],
        "grad_norm": first["grad_norm"], "clip_fraction": first["clip_fraction"],
        "entropy": first["entropy"], "peak_rss_gib": peak_rss_gib(),
        "device_peak_gib": stats.get("peak_bytes_in_use", 0) / 2**30 or None,
        "device": f"{device.platform}:{getattr(device, 'device_kind', '')}",
    })


def old_logprobs(model_dir: str, batch: dict, args: Args, results) -> None:
    """The policy's own next-token log-probs plus noise (computed in a child, like the steps)."""
    import jax.numpy as jnp

    from envsched_jax.learner import models
    from envsched_jax.learner.trainer import Trainer, TrainerConfig

    policy = models.load_policy(model_dir, with_tokenizer=False)
    trainer = Trainer(policy.model, models.forward, TrainerConfig())
    logp = np.asarray(trainer.logprobs(jnp.asarray(batch["tokens"]),
                                       jnp.asarray(batch["attention_mask"])))
    noise = np.random.default_rng(args.seed + 1).normal(0.0, args.old_logp_noise, logp.shape)
    results.put((logp + noise * batch["loss_mask"]).astype(np.float32))


# -- torch ---------------------------------------------------------------------------------------

def run_torch(model_dir: str, batch: dict, args: Args, results) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8)
    tokens = torch.tensor(batch["tokens"], dtype=torch.long, device=device)
    attention = torch.tensor(batch["attention_mask"], dtype=torch.long, device=device)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    loss_mask = torch.tensor(batch["loss_mask"], device=device)[:, 1:]
    advantages = torch.tensor(batch["advantages"], device=device)[:, None]
    old = torch.tensor(batch["old_logp"], device=device)[:, 1:]
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.compute_dtype == "bfloat16")
    count = loss_mask.sum().clamp(min=1.0)

    def step() -> dict[str, float]:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(input_ids=tokens, attention_mask=attention,
                           position_ids=positions).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(logp - old)
        unclipped = ratio * advantages
        clipped = ratio.clamp(0.8, 1.2) * advantages
        loss = -(torch.minimum(unclipped, clipped) * loss_mask).sum() / count
        loss.backward()
        with torch.no_grad():
            entropy = (-(logp_all.exp() * logp_all).sum(-1) * loss_mask).sum() / count
            clip_fraction = ((clipped < unclipped).float() * loss_mask).sum() / count
            grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters()
                                       if p.grad is not None))
        optimizer.step()
        metrics = {"loss": loss, "grad_norm": grad_norm, "clip_fraction": clip_fraction,
                   "entropy": entropy}
        return {k: float(v.detach()) for k, v in metrics.items()}  # synchronises

    start = time.perf_counter()
    first = step()
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    results.put({
        "compile_s": compile_s, "step_s": times, **first, "peak_rss_gib": peak_rss_gib(),
        "device_peak_gib": (torch.cuda.max_memory_allocated() / 2**30
                            if device == "cuda" else None),
        "device": device if device == "cpu" else f"cuda:{torch.cuda.get_device_name()}",
    })


# -- driver --------------------------------------------------------------------------------------

def model_flops(hf_config: dict, tokens: int, seq_len: int) -> tuple[float, int]:
    """(FLOPs of one training step, parameters without the input embedding)."""
    d, layers = hf_config["hidden_size"], hf_config["num_hidden_layers"]
    heads, kv = hf_config["num_attention_heads"], hf_config.get("num_key_value_heads") or \
        hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or d // heads
    ff, vocab = hf_config["intermediate_size"], hf_config["vocab_size"]
    per_layer = d * heads * head_dim * 2 + d * kv * head_dim * 2 + 3 * d * ff
    params = layers * per_layer + d * vocab  # the output projection (tied or not) is a matmul
    return 6.0 * params * tokens + 12.0 * layers * heads * head_dim * seq_len * tokens, params


def peak_flops(device: str) -> float | None:
    for name, flops in PEAK_BF16_FLOPS.items():
        if name.lower() in device.lower():
            return flops
    return None


def main(args: Args) -> None:
    unknown = sorted(set(args.backends) - {"ours", "torch"})
    if unknown:
        raise SystemExit(f"unknown backends {unknown}; choose from ours, torch")
    if not 0 < args.prompt_len < args.seq_len:
        raise SystemExit(f"--prompt-len must lie in (0, --seq-len = {args.seq_len}), "
                         f"got {args.prompt_len}")
    from envsched_jax.learner import export, models

    out: dict = {"args": {k: str(v) for k, v in dataclasses.asdict(args).items()}, "models": {}}
    header = (f"{'model':12} {'backend':7} {'step (s)':>9} {'compile (s)':>12} {'tok/s':>9} "
              f"{'gen tok/s':>10} {'peak (GiB)':>11} {'MFU':>6}  loss / grad norm / clip frac")
    print(header)
    failures = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="bench_learner_") as tmp:
            policy = models.load_policy(name, seed=args.seed)
            hf_config = dict(policy.hf_config)
            export.export_policy(policy, tmp)
            vocab, pad = hf_config["vocab_size"], policy.pad_token_id
            del policy
            batch = make_batch(args, vocab, pad)
            batch["old_logp"] = run_in_child(old_logprobs, tmp, batch, args)
            n_tokens = int(batch["tokens"].size)
            generated = int(batch["loss_mask"][:, 1:].sum())
            flops, params = model_flops(hf_config, n_tokens, args.seq_len)
            entry = {"parameters_without_embedding": params, "tokens_per_step": n_tokens,
                     "generated_tokens_per_step": generated, "flops_per_step": flops,
                     "backends": {}}
            for backend in args.backends:
                result = run_in_child(run_ours if backend == "ours" else run_torch, tmp, batch, args)
                step_s = statistics.median(result["step_s"])
                peak = peak_flops(result["device"])
                mfu = flops / step_s / peak if peak and not result["device"].startswith("cpu") \
                    else None
                result.update(median_step_s=step_s, tokens_per_s=n_tokens / step_s,
                              generated_tokens_per_s=generated / step_s, mfu=mfu)
                entry["backends"][backend] = result
                memory = result["device_peak_gib"] or result["peak_rss_gib"]
                print(f"{name:12} {backend:7} {step_s:9.3f} {result['compile_s']:12.2f} "
                      f"{n_tokens / step_s:9.0f} {generated / step_s:10.0f} {memory:11.2f} "
                      f"{'n/a' if mfu is None else f'{mfu:.1%}':>6}  {result['loss']:+.6f} / "
                      f"{result['grad_norm']:.6g} / {result['clip_fraction']:.4f}")
            if {"ours", "torch"} <= set(entry["backends"]):
                ours, ref = entry["backends"]["ours"], entry["backends"]["torch"]
                ratio = ref["median_step_s"] / ours["median_step_s"]
                diff = abs(ours["grad_norm"] - ref["grad_norm"]) / max(ref["grad_norm"], 1e-30)
                entry.update(speedup_vs_torch=ratio, grad_norm_rel_diff=diff)
                print(f"{name:12} ours is {ratio:.2f}x torch's step speed; first-step grad norm "
                      f"differs by {diff:.2e} relative, loss by "
                      f"{abs(ours['loss'] - ref['loss']):.2e}")
                if args.compute_dtype == "float32" and diff > args.agreement_tol:
                    failures.append(f"{name}: grad norms differ by {diff:.2e} > {args.agreement_tol}")
            out["models"][name] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    if failures:
        raise SystemExit("the backends disagree, so the timings are not of the same step: "
                         + "; ".join(failures))


if __name__ == "__main__":
    main(tyro.cli(Args))
