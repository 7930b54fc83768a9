"""Env-Rethink's offline post-training of a file verifier (seeds/002 section 4.1, appendix A.5-A.7,
B.1-B.3): sub-environments -> teacher trajectories -> qualification with revised hints -> masked
SFT (L_SFT) of a policy through the project's learner -> the student evaluated as a verifier.

Steps, all from the generated benchmark's TRAIN split (held-out parents are only evaluated):

1. cut verification sub-environments (A.5) and run the teachers (``heuristic``; ``llm`` with an
   OpenAI-compatible server) with qualification and at most two retries (A.6, A.7);
2. build the SFT corpus (student prompt without hints, assistant-only loss mask, overlength
   examples dropped, teachers rotated; B.1, B.3) with the policy's tokenizer (the tiny policy:
   a byte-level BPE trained on the corpus's texts, saved in the run folder);
3. masked SFT with ``TrainerConfig(objective="sft")``, train / dev loss and token accuracy (B.2);
4. the student generates greedily through the same JSON tool loop on a few held-out
   sub-environments; files without a parsed judgment count as wrong (B.4 scores). The
   evidence-rule teacher and the trust-the-filename baseline are scored on the same files.

Writes to ``--out``: ``run.json`` (the arguments), ``qualification.jsonl`` (every attempt with
its provenance), ``corpus.json``, ``metrics.jsonl`` / ``metrics.csv`` (per step; dev rows at each
evaluation), ``checkpoints/step_*`` (the learner's orbax checkpoints), ``tokenizer/``,
``student_eval.json`` and ``summary.json``. A run killed part-way resumes from its newest
checkpoint when started again with the same arguments (the batches of step s are drawn from
``(seed, s)``, so the continuation sees the same data).

Usage:
    python experiments/rethink_sft.py                                     # tiny policy, CPU, a few minutes
    python experiments/rethink_sft.py --steps 4 --eval-every 2 --out runs/rethink_sft_smoke
    python experiments/rethink_sft.py --policy smollm2 --learning-rate 1e-4 --batch-size 1 \\
        --corpus.max-tokens 4096 --out runs/rethink_sft_smollm2          # SmolLM2-135M (slow on CPU)
    python experiments/rethink_sft.py --teachers heuristic llm --llm-base-url http://127.0.0.1:8000 \\
        --llm-model NAME --out runs/rethink_sft_llm                      # an LLM teacher beside the rules
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Literal

import numpy as np
import tyro
from rich.progress import Progress, track

from envsched_jax.learner import models
from envsched_jax.learner.checkpoint import restore_checkpoint, save_checkpoint
from envsched_jax.learner.optim import OptimConfig
from envsched_jax.learner.trainer import Trainer, TrainerConfig
from envsched_jax.rethink import paper, teacher
from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.verify import EvidenceVerifier, FilenameVerifier, score_split, verify


@dataclasses.dataclass(frozen=True)
class Args:
    out: Path = Path("runs/rethink_sft")
    """Run folder (created; an existing one is resumed when its run.json matches)."""
    generator: GeneratorConfig = GeneratorConfig()
    """The labelled benchmark; only its train split feeds the corpus."""
    sub_envs: teacher.SubEnvConfig = teacher.SubEnvConfig()
    """Sub-environment cuts (appendix A.5)."""
    qualification: teacher.QualifyConfig = teacher.QualifyConfig()
    """Qualification and retries (appendix A.7)."""
    corpus: teacher.CorpusConfig = teacher.CorpusConfig(max_tokens=3072, max_observation_chars=400)
    """The SFT corpus (context, truncation of tool outputs, rotation, dev share)."""
    teachers: tuple[str, ...] = ("heuristic",)
    """Teachers by name (``heuristic``, ``llm``)."""
    llm_base_url: str = ""
    """OpenAI-compatible server of the ``llm`` teacher."""
    llm_model: str = ""
    """Served model name of the ``llm`` teacher."""
    policy: Literal["tiny", "smollm2"] = "tiny"
    """``tiny``: a random 2-layer Llama with a corpus-trained tokenizer; ``smollm2``: SmolLM2-135M."""
    vocab_size: int = 2048
    """The tiny policy's tokenizer vocabulary (at most)."""
    steps: int = 40
    """Optimisation steps."""
    batch_size: int = 2
    """Examples per step."""
    learning_rate: float = 3e-3
    """Peak learning rate (cosine schedule after ``warmup_steps``; the paper: 1e-4 for LoRA on 27B)."""
    warmup_steps: int = 2
    """Linear warm-up steps."""
    eval_every: int = 10
    """Dev (and train-subset) loss / token accuracy every this many steps, and at the end."""
    checkpoint_every: int = 10
    """Save the learner's state every this many steps, and at the end."""
    eval_sub_envs: int = 3
    """Held-out sub-environments the student verifies (the smallest by file count)."""
    eval_max_turns: int = 8
    """Student turns per held-out sub-environment."""
    eval_max_new_tokens: int = 256
    """Tokens per student reply."""
    seed: int = 0
    """Seeds the model's initialisation and the batches."""
    resume: bool = True
    """Continue from the newest checkpoint of ``--out``."""


def _record(args: Args) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(args), default=str))


def _teachers(args: Args) -> list:
    out = []
    for name in args.teachers:
        if name == "llm":
            from envsched_jax.graph.llm_clients import OpenAIChatClient

            if not (args.llm_base_url and args.llm_model):
                raise SystemExit("the llm teacher needs --llm-base-url and --llm-model")
            out.append(teacher.make_teacher("llm", client=OpenAIChatClient(args.llm_base_url, args.llm_model)))
        else:
            out.append(teacher.make_teacher(name))
    return out


def _policy(args: Args, accepted, out: Path):
    """(model, tokenizer, hf_config)."""
    if args.policy == "smollm2":
        policy = models.load_policy("smollm2")
        return policy.model, policy.tokenizer, policy.hf_config
    from transformers import PreTrainedTokenizerFast

    from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer

    folder = out / "tokenizer"
    if (folder / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    else:
        tokenizer = train_chat_tokenizer(teacher.corpus_texts(accepted, args.corpus), vocab_size=args.vocab_size)
        tokenizer.save_pretrained(folder)
    hf_config = dict(models.tiny_llama(len(tokenizer)), max_position_embeddings=args.corpus.max_tokens,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return models.make_model(hf_config, seed=args.seed), tokenizer, hf_config


def _write_csv(rows: list[dict], path: Path) -> None:
    keys = sorted({k for r in rows for k in r})
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _rates(scores) -> dict:
    j = scores.to_json()
    return {k: (None if j[k]["rate"] is None else round(100 * j[k]["rate"], 1)) for k in
            ("partition", "category", "stage", "joint")} | {"missing": scores.missing}


def main(args: Args) -> dict:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    record = _record(args)
    run_file = out / "run.json"
    if run_file.exists():
        saved = json.loads(run_file.read_text())
        if not args.resume or {k: v for k, v in saved.items() if k != "resume"} != \
                {k: v for k, v in record.items() if k != "resume"}:
            raise SystemExit(f"{out} holds another run (or --no-resume was given); choose another --out")
    run_file.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

    # 1. sub-environments and qualified teacher trajectories (train split only)
    bench = generate_benchmark(args.generator)
    subs = teacher.cut_all(bench.train, args.sub_envs)
    record_t = teacher.run_teachers(subs, _teachers(args), args.qualification,
                              progress=lambda items, n: track(items, total=n, description="teachers"))
    with (out / "qualification.jsonl").open("w") as fh:
        for attempt in record_t.attempts:
            fh.write(json.dumps(attempt.to_json(), sort_keys=True) + "\n")
    if not record_t.accepted:
        raise SystemExit("no trajectory qualified; nothing to train on (see qualification.jsonl)")

    # 2. corpus
    model, tokenizer, hf_config = _policy(args, record_t.accepted, out)
    corpus = teacher.build_corpus(record_t.accepted, tokenizer, args.corpus)
    if not corpus.train or not corpus.dev:
        raise SystemExit(f"corpus too small after dropping overlength examples: {corpus.summary()}")
    width = -(-max(e.length for e in corpus.train + corpus.dev) // 64) * 64
    (out / "corpus.json").write_text(json.dumps({**corpus.summary(), "dropped": corpus.dropped,
                                                 "pad_width": width}, indent=2) + "\n")

    # 3. masked SFT through the learner
    config = TrainerConfig(objective="sft", seed=args.seed,
                           optim=OptimConfig(learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                                             total_steps=max(args.steps, args.warmup_steps + 1)),
                           micro_batch_size=1 if args.policy == "smollm2" else None,
                           remat=args.policy == "smollm2")
    trainer = Trainer(model, models.forward, config)
    checkpoints = out / "checkpoints"
    start = 0
    latest = sorted(checkpoints.glob("step_*"))[-1] if args.resume and checkpoints.exists() and \
        any(checkpoints.glob("step_*")) else None
    metrics_path = out / "metrics.jsonl"
    rows = []
    if latest is not None:
        trainer.state = restore_checkpoint(latest, trainer.state, trainer.config)
        start = int(trainer.state.step)
        rows = [r for r in map(json.loads, metrics_path.read_text().splitlines()) if r["step"] <= start] \
            if metrics_path.exists() else []
    pad = tokenizer.pad_token_id
    metrics_fn = teacher.make_lm_metrics_fn(trainer)
    probe = [corpus.train[i] for i in sorted(np.random.default_rng(args.seed).choice(
        len(corpus.train), size=min(len(corpus.train), max(len(corpus.dev), 4)), replace=False))]

    def evaluate(step: int) -> dict:
        dev = teacher.lm_metrics(trainer, corpus.dev, pad, batch_size=args.batch_size, metrics_fn=metrics_fn, width=width)
        tr = teacher.lm_metrics(trainer, probe, pad, batch_size=args.batch_size, metrics_fn=metrics_fn, width=width)
        return {"step": step, "kind": "eval", "dev_loss": dev["loss"], "dev_token_accuracy": dev["token_accuracy"],
                "train_loss": tr["loss"], "train_token_accuracy": tr["token_accuracy"]}

    if start == 0 and not rows:
        rows.append(evaluate(0))
    with Progress() as progress:
        task = progress.add_task("SFT", total=args.steps, completed=start)
        for step in range(start, args.steps):
            idx = teacher.batch_indices(len(corpus.train), args.batch_size, args.seed, step)
            m = trainer.train(teacher.pad_examples([corpus.train[i] for i in idx], pad, width=width))
            rows.append({"step": step + 1, "kind": "train", "loss": m["loss"], "grad_norm": m["grad_norm"],
                         "tokens": m["tokens"], "step_seconds": m["step_seconds"]})
            done = step + 1
            if done % args.eval_every == 0 or done == args.steps:
                rows.append(evaluate(done))
                progress.console.print(f"step {done}: dev loss {rows[-1]['dev_loss']:.3f}, "
                                       f"dev token acc {rows[-1]['dev_token_accuracy']:.3f}")
            if done % args.checkpoint_every == 0 or done == args.steps:
                save_checkpoint(checkpoints, trainer.state, trainer.config, extra={"policy": args.policy})
            metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            progress.update(task, completed=done)
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write_csv(rows, out / "metrics.csv")

    # 4. the student as a verifier on held-out sub-environments
    from envsched_jax.graph.llm_clients import BackendChatClient
    from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

    held = sorted(teacher.cut_all(bench.held_out, args.sub_envs), key=lambda w: (len(w.files), w.workspace_id))
    held = held[:args.eval_sub_envs]
    context = max(args.corpus.max_tokens, 512)
    with JaxSamplerBackend((trainer.graphdef, trainer.state.params), max_batch=1, max_context=context) as backend:
        client = BackendChatClient(backend, tokenizer, "student")
        loop = teacher.LoopConfig(max_turns=args.eval_max_turns, max_repairs=2, max_tokens=args.eval_max_new_tokens)
        predictions, problems = teacher.student_verify(client, held, loop)
    student = score_split(zip(predictions, held))
    rules = score_split((verify(EvidenceVerifier(), w), w) for w in held)
    filename = score_split((verify(FilenameVerifier(), w), w) for w in held)
    (out / "student_eval.json").write_text(json.dumps(
        {"sub_envs": [w.workspace_id for w in held], "problems": [list(p) for p in problems],
         "judged_files": [len(p) for p in predictions], "student": student.to_json(),
         "evidence_rules": rules.to_json(), "filename": filename.to_json()}, indent=2) + "\n")

    last_eval = [r for r in rows if r["kind"] == "eval"][-1]
    summary = {
        "qualification": record_t.summary(), "sub_environments": len(subs), "corpus": corpus.summary(),
        "final": {k: last_eval[k] for k in ("dev_loss", "dev_token_accuracy", "train_loss", "train_token_accuracy")},
        "first_eval": {k: rows[0][k] for k in ("dev_loss", "dev_token_accuracy")} if rows[0]["kind"] == "eval" else None,
        "paper_b2": paper.SFT_RUN,
        "student_verification_percent": _rates(student), "evidence_rules_percent": _rates(rules),
        "filename_percent": _rates(filename), "held_out_files": student.partition.eligible,
        "policy": args.policy, "steps": args.steps,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
