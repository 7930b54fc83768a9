"""The policy of a run and its warm start by masked SFT on reference trajectories.

The tiny CPU policy (``PolicySpec.source == "tiny"``) comes with a tokenizer trained on the
pool's own text (:mod:`envsched_jax.learner.chat_tokenizer`). Its corpus is the warm-start tasks'
reference episodes as the agent loop renders them (system prompt, compact tool catalog,
instruction, tool calls, observations, answers), played in the run's sandbox with a byte-level
bootstrap tokenizer (256 bytes, no merges) and decoded back to text; the held-out and GRPO tasks'
texts are not used. The tokenizer is saved in the run folder, so a resumed run reads the same one.

Warm start: the reference episodes of the SFT tasks, rendered with the policy's tokenizer by the
agent loop itself (so the token layout, masks included, is exactly what GRPO will see), train the
policy with the masked SFT loss (Env-Rethink's L_SFT: the mean negative log-likelihood of the
assistant tokens) for ``LearnerSpec.sft_steps`` updates of ``sft_batch_size`` sequences drawn
without replacement (reshuffled every epoch by the run's seed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from flax import nnx

from envsched_jax.learner import models
from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer
from envsched_jax.learner.trainer import Trainer, TrainerConfig, sft_batch
from envsched_jax.pool.model import Pool
from envsched_jax.rollout.agent import AgentConfig, AgentEpisode, AgentRunner
from envsched_jax.rollout.backends.scripted import ScriptedBackend, reference_responder
from envsched_jax.training.config import TrainConfig


def reference_episodes(pool: Pool, tokenizer, workers, agent: AgentConfig,
                       stop_token_ids=()) -> list[AgentEpisode]:
    """Every task's reference actions played through the agent loop (one call per message);
    only episodes that reach the task's full reward are kept."""
    runner = AgentRunner(ScriptedBackend(tokenizer, reference_responder(pool, agent.tool_format)),
                         tokenizer, workers, pool, agent, stop_token_ids=stop_token_ids)
    episodes = runner.run([(t, 0, 0) for t in pool.tasks])
    return [ep for ep in episodes if ep.reward == 1.0 and ep.error is None]


def tiny_hf_config(cfg: TrainConfig, tokenizer) -> dict:
    p = cfg.policy
    if p.hidden_size % p.heads:
        raise ValueError(f"PolicySpec: hidden_size {p.hidden_size} is not a multiple of heads "
                         f"{p.heads}")
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(tokenizer),
        "hidden_size": p.hidden_size, "intermediate_size": p.intermediate_size,
        "num_hidden_layers": p.layers, "num_attention_heads": p.heads,
        "num_key_value_heads": p.heads, "head_dim": p.hidden_size // p.heads,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": cfg.rollout.max_context, "tie_word_embeddings": True,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def policy_and_tokenizer(cfg: TrainConfig, split, workers, tokenizer_dir: Path):
    """(policy, tokenizer) of the run (see the module docstring)."""
    if cfg.policy.source != "tiny":
        policy = models.load_policy(cfg.policy.source)
        if policy.tokenizer is None:
            raise ValueError(f"policy {cfg.policy.source!r} has no tokenizer")
        return policy, policy.tokenizer
    from transformers import PreTrainedTokenizerFast

    if (tokenizer_dir / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    elif split.sft is None:
        raise ValueError("PolicySpec.source 'tiny': its tokenizer is trained on the warm-start "
                         "tasks' reference episodes, and PoolSplit.sft_per_env is 0 (no such "
                         "task); choose sft_per_env >= 1 or a policy with its own tokenizer")
    else:
        bootstrap = train_chat_tokenizer([""], vocab_size=259, min_frequency=1)
        eos = [bootstrap.eos_token_id]
        # Byte tokens are several times as many as the trained tokenizer's: the run's token
        # limits would cut the corpus episodes short, so they are lifted for this playback.
        unlimited = dataclasses.replace(cfg.rollout.agent, max_sequence_tokens=1 << 30,
                                        max_tokens_per_turn=1 << 30)
        texts = [bootstrap.decode(ep.transcript.token_ids)
                 for ep in reference_episodes(split.sft, bootstrap, workers, unlimited, eos)]
        if not texts:
            raise ValueError("no reference episode of the warm-start tasks reached full reward: "
                             "nothing to train the tokenizer on")
        tokenizer = train_chat_tokenizer(texts, vocab_size=cfg.policy.vocab_size)
        tokenizer.save_pretrained(tokenizer_dir)
    hf_config = tiny_hf_config(cfg, tokenizer)
    family, config = models.tunix_config(hf_config)
    model = models.make_model(hf_config, seed=cfg.seed)
    policy = models.Policy(model=model, config=config, family=family, hf_config=hf_config,
                           tokenizer=tokenizer, eos_token_ids=(tokenizer.eos_token_id,),
                           pad_token_id=tokenizer.pad_token_id)
    return policy, tokenizer


def initial_policy(cfg: TrainConfig, folder: Path) -> models.Policy:
    """The policy saved in ``folder`` (``LearnerSpec.sft_init``); for the tiny policy its shape
    must be the run's policy spec (the spec's vocabulary size is the saved tokenizer's)."""
    policy = models.load_policy(folder)
    if policy.tokenizer is None:
        raise ValueError(f"{folder}: the saved policy has no tokenizer")
    p, hf = cfg.policy, policy.hf_config
    if p.source == "tiny":
        expected = {"hidden_size": p.hidden_size, "num_hidden_layers": p.layers,
                    "num_attention_heads": p.heads, "intermediate_size": p.intermediate_size}
        differs = {k: (hf.get(k), v) for k, v in expected.items() if hf.get(k) != v}
        if differs:
            raise ValueError(f"{folder}: the saved policy's shape differs from the policy spec "
                             f"(field: saved, spec): {differs}")
    return policy


def sft_arrays(episodes: list[AgentEpisode], pad_id: int, max_length: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, attention mask, loss mask), right-padded to the longest (cut at max_length)."""
    width = min(max(len(ep.transcript) for ep in episodes), max_length)
    n = len(episodes)
    tokens = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    loss = np.zeros((n, width), np.float32)
    for row, ep in enumerate(episodes):
        m = min(len(ep.transcript), width)
        tokens[row, :m] = ep.transcript.token_ids[:m]
        attention[row, :m] = 1
        loss[row, :m] = ep.transcript.loss_mask[:m]
    return tokens, attention, loss


def warm_start(cfg: TrainConfig, policy: models.Policy, tokenizer, split, workers,
               trainer_config: TrainerConfig, log, progress=print) -> nnx.Module:
    """Masked SFT on the reference episodes of ``split.sft``; returns the trained model."""
    if split.sft is None:
        raise ValueError(f"LearnerSpec.sft_steps is {cfg.learner.sft_steps} but PoolSplit."
                         "sft_per_env is 0: no warm-start task; set one of them differently")
    episodes = reference_episodes(split.sft, tokenizer, workers, cfg.rollout.agent,
                                  policy.eos_token_ids)
    if not episodes:
        raise ValueError("no reference episode of the warm-start tasks reached full reward")
    tokens, attention, loss = sft_arrays(episodes, policy.pad_token_id, cfg.learner.max_length)
    trainer = Trainer(policy.model, models.forward, trainer_config)
    rng = np.random.default_rng(cfg.seed)
    size = min(cfg.learner.sft_batch_size, len(episodes))
    order: list[int] = []
    for step in range(cfg.learner.sft_steps):
        if len(order) < size:
            order += list(rng.permutation(len(episodes)))
        rows, order = np.asarray(order[:size]), order[size:]
        used = int(attention[rows].sum(axis=1).max())
        width = min(-(-used // cfg.learner.pad_multiple) * cfg.learner.pad_multiple, tokens.shape[1])
        metrics = trainer.train(sft_batch(tokens[rows, :width], attention[rows, :width],
                                          loss[rows, :width]))
        log.log("sft", step + 1, {"loss": metrics["loss"], "seconds": metrics["step_seconds"],
                                  "tokens": metrics["tokens"]})
        if (step + 1) % 25 == 0 or step == 0 or step + 1 == cfg.learner.sft_steps:
            progress(f"sft {step + 1:4d}/{cfg.learner.sft_steps}: loss {metrics['loss']:.4f}")
    return trainer.model_with_params()
