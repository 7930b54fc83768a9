"""Finished episodes -> the learner's batch and the scheduler's reward matrix.

:func:`episodes_to_batch` groups a step's episodes by task (the scheduler's order, K rollouts
each), pads their token sequences on the right to a common length (rounded up to
``pad_multiple`` so that the train step compiles for few shapes), and computes the paper's
group-relative advantages from the rewards. ``old_logp`` is the sampler's raw log-prob of each
sampled token (zero elsewhere): the denominator of the importance ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from envsched_jax.learner.objectives import GRPOConfig, group_advantages
from envsched_jax.learner.trainer import PolicyBatch
from envsched_jax.rollout.agent import AgentEpisode


def group_episodes(episodes: Sequence[AgentEpisode], task_ids: Sequence[str],
                   group_size: int) -> list[list[AgentEpisode]]:
    """``[len(task_ids)][group_size]`` episodes, each group in rollout-index order.

    Raises:
      ValueError: an episode of another task, or a group without exactly ``group_size``.
    """
    groups: dict[str, list[AgentEpisode]] = {t: [] for t in task_ids}
    for ep in episodes:
        if ep.task_id not in groups:
            raise ValueError(f"episode of task {ep.task_id!r}, which is not in the step's tasks")
        groups[ep.task_id].append(ep)
    bad = {t: len(g) for t, g in groups.items() if len(g) != group_size}
    if bad:
        raise ValueError(f"expected {group_size} episodes per task, got {bad}")
    return [sorted(groups[t], key=lambda e: e.rollout_index) for t in task_ids]


def reward_matrix(groups: Sequence[Sequence[AgentEpisode]]) -> np.ndarray:
    """[B, K] float32 rewards (what the scheduler observes)."""
    return np.array([[ep.reward for ep in group] for group in groups], dtype=np.float32)


def episodes_to_batch(groups: Sequence[Sequence[AgentEpisode]], *, pad_id: int,
                      grpo: GRPOConfig | None = None, max_length: int | None = None,
                      pad_multiple: int = 64) -> PolicyBatch:
    """The learner's batch of ``B x K`` sequences (group-major order).

    Args:
      groups: from :func:`group_episodes`.
      pad_id: the token written after each sequence's end (masked out).
      grpo: advantage settings (the paper's defaults when None).
      max_length: cut longer sequences (and their masks) to this many tokens; None keeps all.
      pad_multiple: round the padded length up to a multiple of this.
    """
    flat = [ep for group in groups for ep in group]
    if not flat:
        raise ValueError("no episodes")
    lengths = [len(ep.transcript) for ep in flat]
    longest = max(lengths) if max_length is None else min(max(lengths), max_length)
    width = max(pad_multiple, -(-longest // pad_multiple) * pad_multiple)
    if max_length is not None:
        width = min(width, max_length)
    n = len(flat)
    tokens = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    loss = np.zeros((n, width), np.float32)
    old = np.zeros((n, width), np.float32)
    for row, ep in enumerate(flat):
        t = ep.transcript
        m = min(len(t), width)
        tokens[row, :m] = t.token_ids[:m]
        attention[row, :m] = 1
        loss[row, :m] = t.loss_mask[:m]
        old[row, :m] = t.logprobs[:m]
    advantages = group_advantages(jnp.asarray(reward_matrix(groups)), grpo or GRPOConfig())
    return PolicyBatch(jnp.asarray(tokens), jnp.asarray(attention), jnp.asarray(loss),
                       jnp.asarray(advantages, jnp.float32).reshape(n), jnp.asarray(old))
