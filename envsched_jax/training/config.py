"""Typed, nested configuration of an end-to-end training run (``experiments/train_grpo.py``).

Every field has the default of the CPU recipe (a tiny Llama-architecture policy with a small
vocabulary on a generated pool of 8 environments x 40 templated tasks); the paper's settings
for an accelerator are one flag set away (see docs/guides/rollouts.md). tyro turns the nesting into ``--pool.spec``,
``--scheduler.name``, ``--learner.grpo-steps`` and so on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from envsched_jax.learner.objectives import GRPOConfig
from envsched_jax.learner.optim import OptimConfig
from envsched_jax.rollout.agent import AgentConfig
from envsched_jax.rollout.backends.base import SamplingParams


@dataclasses.dataclass(frozen=True)
class PoolSplit:
    """Which tasks the run uses, split per environment (tasks shuffled by ``seed``).

    Attributes:
      spec: the pool (any pool spec).
      sft_per_env: tasks per environment whose reference trajectories warm-start the policy.
      heldout_per_env: tasks per environment kept out of training, for the held-out reward.
      seed: the split's shuffle (the same for every scheduler and run seed, so runs compare).

    CHOICE (the CPU recipe's pool): ``generated:8x40`` (20 SFT, 4 held-out and 16 GRPO tasks per
    environment) rather than the embedded pool. On the embedded pool (24 hand-written tasks per
    environment, 10 for SFT) the tiny policy, warm-started for 60 to 200 SFT steps, produced K
    identical rewards in every group of every step measured (no gradient), and its greedy
    held-out episodes called the same non-existent tool whatever the environment: it had not
    learnt to read the prompt. On the generated pool's templated tasks (ids in the instruction,
    lookup-then-branch rules), after the 1,200-step warm start below, its sampled rollouts differ
    within groups (a GRPO signal), although it solves none of the held-out tasks outright: see
    docs/guides/rollouts.md for what was measured.
    """

    spec: str = "generated:8x40"
    sft_per_env: int = 20
    heldout_per_env: int = 4
    seed: int = 0

    def __post_init__(self):
        if self.sft_per_env < 0 or self.heldout_per_env < 0:
            raise ValueError(f"PoolSplit: sft_per_env and heldout_per_env must be >= 0, got "
                             f"{self.sft_per_env}, {self.heldout_per_env}")


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """The policy.

    Attributes:
      source: ``tiny`` (a Llama-architecture model built here with a tokenizer trained on the
        pool's text), or any :func:`envsched_jax.learner.models.load_policy` source
        (``smollm2``, a GGUF file, a safetensors folder).
      vocab_size, hidden_size, layers, heads, intermediate_size: the tiny model's shape.
      dtype: parameter dtype of the sampler copy (the trainer keeps float32 master weights).
    """

    source: str = "tiny"
    vocab_size: int = 1024
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    intermediate_size: int = 256
    dtype: Literal["float32", "bfloat16"] = "float32"


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """Attributes:
      name: a registered scheduler (``envsched``, ``random``, ``dps``, ...).
      batch_size: tasks per step (B; the paper: 64).
      group_size: rollouts per task (K; the paper: 8).
    """

    name: str = "envsched"
    batch_size: int = 8
    group_size: int = 4


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """Attributes:
      sft_steps: masked-SFT updates on the warm-start trajectories (0: none).
      sft_batch_size: sequences per SFT update.
      sft_optim: the SFT optimizer (a tiny model from scratch needs a far larger rate than the
        paper's 1e-6 for a 7B model).
      grpo: the GRPO objective (the paper's defaults).
      optim: the GRPO optimizer. Its schedule's ``total_steps`` is explicit (30, the recipe's
        ``--steps``), not tied to ``--steps``, so a run resumed with more steps keeps its
        schedule; set both together for a longer run.
      micro_batch_size: gradient-accumulation micro-batch (None: the whole batch).
      length_grouping: SFT and GRPO updates are accumulated over length-sorted micro-batches of
        ``micro_batch_size`` rows, each padded to its own power-of-two multiple of
        ``pad_multiple`` (:mod:`envsched_jax.learner.trainer`), instead of padding every row to
        the batch's longest: the same update, without paying the longest episode's attention
        cost on every row (agent episodes here range from a few hundred to 2,048 tokens).
        Off when ``micro_batch_size`` is None. Measured by
        ``experiments/bench_length_grouping.py``.
      remat: recompute activations in the backward pass (with ``micro_batch_size``, what lets
        a real model's long agent sequences fit: SmolLM2-135M on 4 sequences of a few thousand
        tokens asked for 44.6 GB at once without either).
      max_length: sequences are cut to this many tokens in the learner's batch.
      pad_multiple: batches are padded to a multiple of this (fewer compilations).
      mask_infrastructure_failures: episodes that failed for reasons that are not the policy's
        (a sandbox crash, a backend error, a user-simulator failure) are kept in their group's
        reward (0) for the scheduler but contribute no tokens to the loss.
      sft_cache: a folder for the warm-started policy (safetensors, config, tokenizer): written
        after the warm start, and read instead of warm-starting when it exists, so runs that
        differ only in the scheduler start from the very same policy.
      sft_init: a warm-started policy folder (one written through ``sft_cache``) that the warm
        start continues instead of starting from a fresh initialisation: ``sft_steps`` more
        updates (``sft_optim``'s schedule from its start), with that folder's tokenizer and
        architecture (the policy spec must agree). Its own record is nested in the new cache's,
        so a continued warm start is never mistaken for a fresh one.
    """

    sft_steps: int = 1200
    sft_batch_size: int = 8
    sft_optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        learning_rate=3e-3, warmup_steps=50, total_steps=1200, end_learning_rate=3e-4))
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        learning_rate=1e-4, warmup_steps=2, total_steps=30))
    micro_batch_size: int | None = 4
    length_grouping: bool = True
    remat: bool = False
    max_length: int = 2048
    pad_multiple: int = 64
    mask_infrastructure_failures: bool = True
    sft_cache: Path | None = None
    sft_init: Path | None = None


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Attributes:
      backend: ``jax`` (the in-process sampler, the learner's weights shared in memory) or
        ``openai`` (a vLLM server this run starts; weights synced by export).
      sandbox: where the environments run (``bwrap``, ``docker``, or ``inprocess`` for the
        project's own trusted environments).
      workers: sandbox workers (episodes holding an environment at once).
      max_batch: the sampler's concurrent sequences.
      max_context: the sampler's longest sequence.
      agent: the agent loop's limits and sampling (the paper's by default, except the token
        limits, sized here for the tiny CPU policy, and the system prompt: CHOICE, the recipe's
        system message is the compact tool catalog alone, without the environment's prose
        summary, which a 2-layer model trained on a few hundred episodes cannot use and which
        roughly doubled every sequence; pass ``--rollout.agent.system-prompt`` to restore it).
      step_deadline_s: the rollout phase's budget per step; episodes still acting then end as
        ``step_deadline`` and are scored on the state they reached (groups stay whole, so the
        scheduler and the advantages see every rollout). None: wait for every episode (each
        bounded by its own ``episode_timeout_s``).
      eval_sampling: held-out evaluation's sampling (greedy by default).
      sync_every: learner steps between weight syncs to the generation backend. 1 (the
        default): every step's rollouts use the weights of the step before, so the batch is
        on-policy (staleness 0). S > 1: the backend keeps serving weights up to S - 1 updates
        old (a vLLM server skips S - 1 of every S export-and-reload round trips); the ratio's
        denominator is still the sampler's log-prob of the weights that sampled each token, so
        PPO's clip bounds the off-policy update. Each step logs ``policy_lag`` (updates the
        serving weights are behind the learner's when the step's rollouts start). A resumed run
        starts its backend on the restored weights (lag 0).
    """

    backend: Literal["jax", "openai"] = "jax"
    sandbox: Literal["bwrap", "docker", "inprocess"] = "bwrap"
    workers: int = 16
    max_batch: int = 32
    max_context: int = 2048
    agent: AgentConfig = dataclasses.field(default_factory=lambda: AgentConfig(
        max_turns=12, max_tokens_per_turn=128, max_sequence_tokens=2048,
        tool_catalog="compact", episode_timeout_s=600.0, system_prompt=""))
    step_deadline_s: float | None = None
    eval_sampling: SamplingParams = dataclasses.field(
        default_factory=lambda: SamplingParams(greedy=True, max_new_tokens=128))
    sync_every: int = 1

    def __post_init__(self):
        if self.sync_every < 1:
            raise ValueError(f"RolloutSpec.sync_every must be >= 1, got {self.sync_every!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole run.

    Attributes:
      steps: GRPO steps (select -> rollouts -> observe -> update).
      seed: the run's seed (model initialisation, sampling, the scheduler's randomness).
      out: the run folder (metrics, curves, checkpoints, tokenizer).
      checkpoint_every: steps between checkpoints (and at the end).
      eval_every: steps between held-out evaluations (and before the first step, and at the
        end); 0 disables them.
      resume: continue from the newest checkpoint in ``out`` if there is one.
      probe_tasks: GRPO-training tasks played at every evaluation (0: none), a fixed choice
        (round-robin over environments, shuffled by ``pool.seed``, so the same for every run
        seed and scheduler), each ``probe_samples`` times with the training sampling and fixed
        seeds: two evaluations then differ only by the weights (common random numbers). It
        measures what GRPO optimises, the expected reward of sampled episodes on its own tasks,
        free of which tasks a scheduler happened to pick; logged as kind ``probe``.
      probe_samples: episodes per probe task.
    """

    pool: PoolSplit = dataclasses.field(default_factory=PoolSplit)
    policy: PolicySpec = dataclasses.field(default_factory=PolicySpec)
    scheduler: SchedulerSpec = dataclasses.field(default_factory=SchedulerSpec)
    learner: LearnerSpec = dataclasses.field(default_factory=LearnerSpec)
    rollout: RolloutSpec = dataclasses.field(default_factory=RolloutSpec)
    steps: int = 30
    seed: int = 0
    out: Path = Path("runs/train_grpo")
    checkpoint_every: int = 10
    eval_every: int = 5
    resume: bool = True
    probe_tasks: int = 0
    probe_samples: int = 2

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"TrainConfig.steps must be >= 0, got {self.steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"TrainConfig.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.eval_every < 0:
            raise ValueError(f"TrainConfig.eval_every must be >= 0, got {self.eval_every}")
        if self.probe_tasks < 0 or self.probe_samples < 1:
            raise ValueError(f"TrainConfig: probe_tasks must be >= 0 and probe_samples >= 1, got "
                             f"{self.probe_tasks}, {self.probe_samples}")
