"""Prepare a workspace pool (Env-Rethink section 4.1): a Collection Map and an Event Log per workspace.

Reads a pool folder (``experiments/rethink_generate.py`` writes one) and writes, for each workspace,
``<out>/<mode>/<split>/<workspace>/`` with ``collection_map.json``, ``event_log.json`` (the public,
synthetic log), ``prepare_report.json`` (discards, rejected proposals, the leak audit: for the
operator, not for agents) and ``source.json`` (what it was made from). EGS uses files and metadata
only; TGS also uses the labels, the request and the rubric (rubric text never reaches the public
log: audited). Resumable: a workspace whose folder was completed (written through a temporary
folder, renamed at the end) from the same content, labels, mode, backend and configuration is
skipped; anything else is redone. The pool folder is hashed before and after
(:func:`~envsched_jax.rethink.workspace.tree_digest`) and the run fails if preparation changed
anything there.

Usage:
    python experiments/rethink_generate.py --out runs/rethink_pool
    python experiments/rethink_prepare.py --pool runs/rethink_pool --out runs/rethink_prepared
    python experiments/rethink_prepare.py --pool runs/rethink_pool --modes tgs --backend openai --base-url http://localhost:8000/v1 --model Qwen/Qwen3-8B
    python experiments/rethink_prepare.py --pool runs/rethink_pool --backend jax --policy smollm2
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Literal

import tyro
from rich.progress import track

from envsched_jax.rethink.event_log import PrepareConfig, prepare
from envsched_jax.rethink.roles import make_roles
from envsched_jax.rethink.store import read_pool
from envsched_jax.rethink.workspace import WorkspaceError, tree_digest


@dataclasses.dataclass(frozen=True)
class Args:
    pool: Path = Path("runs/rethink_pool")
    """Pool folder to prepare (only read)."""
    out: Path = Path("runs/rethink_prepared")
    modes: tuple[Literal["egs", "tgs"], ...] = ("egs", "tgs")
    backend: Literal["heuristic", "openai", "jax"] = "heuristic"
    """Role backend: the deterministic heuristic roles; an OpenAI-compatible server (vLLM:
    ``--base-url``, ``--model``); or the in-process JAX model (``--policy``). LLM outputs are
    validated (JSON schema, files that exist, verbatim quotes) and repaired or rejected."""
    base_url: str = "http://localhost:8000/v1"
    """openai backend: the server's OpenAI-compatible base URL."""
    model: str = ""
    """openai backend: the served model's name."""
    policy: str = ""
    """jax backend: a policy spec or checkpoint for envsched_jax.learner.models.load_policy."""
    max_context: int = 8192
    """jax backend: the sampler's context (prompt plus reply tokens)."""
    config: PrepareConfig = PrepareConfig()


def _roles(args: Args):
    """(roles, close): the role bundle and what releases its backend."""
    if args.backend == "heuristic":
        return make_roles("heuristic"), lambda: None
    from envsched_jax.graph.llm_clients import BackendChatClient, OpenAIChatClient

    if args.backend == "openai":
        if not args.model:
            raise SystemExit("--backend openai needs --model (the served model's name)")
        return make_roles("llm", client=OpenAIChatClient(args.base_url, args.model)), lambda: None
    if not args.policy:
        raise SystemExit("--backend jax needs --policy (what envsched_jax.learner.models.load_policy loads)")
    from envsched_jax.learner import models
    from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

    policy = models.load_policy(args.policy)
    sampler = JaxSamplerBackend(policy, max_batch=1, max_context=args.max_context)
    client = BackendChatClient(sampler, policy.tokenizer, f"jax:{args.policy}")
    return make_roles("llm", client=client), sampler.close


def _stamp(ws, mode: str, args: Args) -> dict:
    """What a prepared folder was made from: a rerun skips it only when all of this is equal
    (the workspace's content and labels, the mode, the backend and the configuration)."""
    labels = {p: lab.to_json() for p, lab in sorted(ws.labels().items())}
    return {"content_hash": ws.content_hash(), "labels": hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest(),
            "mode": mode, "backend": args.backend, "model": args.model or args.policy,
            "config": json.loads(json.dumps(dataclasses.asdict(args.config), default=str))}


def main(args: Args) -> dict:
    before = tree_digest(args.pool)
    splits = read_pool(args.pool)
    roles, close = _roles(args)
    counts = collections.Counter()
    jobs = [(mode, split, ws) for mode in args.modes for split, items in splits.items() for ws in items]
    for mode, split, ws in track(jobs, description="preparing"):
        folder = args.out / mode / split / ws.workspace_id.replace("/", "_")
        stamp = _stamp(ws, mode, args)
        done = folder / "source.json"
        if done.exists() and json.loads(done.read_text()) == stamp:
            counts["skipped"] += 1
            continue
        tmp = folder.with_name(folder.name + ".partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            layer = prepare(ws, mode=mode, roles=roles, out_dir=tmp, config=args.config)
        except WorkspaceError as err:
            counts["failed"] += 1
            print(f"{mode} {ws.workspace_id}: {err}")
            continue
        (tmp / "source.json").write_text(json.dumps(stamp, sort_keys=True))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        counts["prepared"] += 1
        counts[f"{mode}_events"] += len(layer.event_log.events)
        counts[f"{mode}_collections"] += len(layer.collection_map.collections)
    close()
    if tree_digest(args.pool) != before:
        raise SystemExit(f"preparation modified the pool folder {args.pool}: this is a bug, please report it")
    summary = {"jobs": len(jobs), **counts, "pool_unchanged": True}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prepare_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
