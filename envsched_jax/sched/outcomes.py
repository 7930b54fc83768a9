"""Binary outcomes of reward groups, shared by the prompt-level baselines (DPS, MoPPS, the LEEPS
reconstruction) and the DAPO admission gate.

Those methods were written for binary verifiers: a rollout is correct or not, and a prompt's
accuracy s is the fraction of its n rollouts that are correct. Our rewards lie in [0, 1] and may
carry partial credit (a fraction of verifier checks passed). The choice made here, used by every
baseline so that they agree:

- a rollout counts as a success iff its reward is >= ``success_threshold`` (default 1 - 1e-6,
  i.e. full credit up to float rounding); partial credit counts as failure;
- s = mean success over the group; "unsolved" is s = 0, "solved" is s = 1, "partially solved"
  is anything in between (the DPS states);
- a group is informative (non-zero standard deviation of binary accuracy, the DAPO filter) iff
  0 < s < 1.

Why not the mean shaped reward: a group whose every rollout earns 0.5 would then look "partially
solved" to DPS and s = 0.5 to MoPPS, although its rewards have zero variance and give GRPO no
signal; and DAPO's own recipe filters on binary accuracy for shaped rewards, since filtering on
the shaped score lets all-fail groups with varied partial credit through. The cost of the choice:
a group of varied partial credit with no full success is "unsolved" here, although its shaped
rewards do differ.
"""

from __future__ import annotations

import jax.numpy as jnp

SUCCESS_THRESHOLD = 1.0 - 1e-6
"""Default reward at or above which a rollout counts as a success."""

UNSOLVED, PARTIAL, SOLVED = 0, 1, 2
"""DPS solving states (indices into the 3-state belief)."""


def success_rate(rewards, success_threshold: float = SUCCESS_THRESHOLD):
    """s per group: the fraction of rollouts with reward >= ``success_threshold``.

    Args:
        rewards: [n, K] rewards in [0, 1].
    Returns:
        [n] float32 success rates.
    """
    rewards = jnp.asarray(rewards)
    return jnp.mean((rewards >= success_threshold).astype(jnp.float32), axis=-1)


def solving_state(rewards, success_threshold: float = SUCCESS_THRESHOLD):
    """DPS state per group: 0 unsolved (s = 0), 1 partially solved, 2 solved (s = 1). [n] int32."""
    hits = jnp.sum(jnp.asarray(rewards) >= success_threshold, axis=-1)
    k = jnp.asarray(rewards).shape[-1]
    return jnp.where(hits == 0, UNSOLVED, jnp.where(hits == k, SOLVED, PARTIAL)).astype(jnp.int32)


def informative(rewards, success_threshold: float = SUCCESS_THRESHOLD):
    """[n] bool: the group's binary accuracy has non-zero standard deviation (0 < s < 1)."""
    return solving_state(rewards, success_threshold) == PARTIAL
