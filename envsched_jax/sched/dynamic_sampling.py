"""DAPO dynamic sampling as an admission gate around any registered scheduler.

DAPO (as in verl's recipe) is not a scheduler: after rollout it drops every group whose
per-rollout accuracy has zero standard deviation (all correct or all wrong: GRPO advantages are all
zero) and keeps generating batches until B groups survive or a cap of generation rounds is hit.

Design (our choices, kept inside the scheduler API's strict select(t) / observe(t) sequencing):

- One generation round = one scheduler step. Round r of a gate call that starts at scheduler step
  t runs ``ids = scheduler.select(t + r)``, ``rewards = rollout_fn(ids)`` and
  ``scheduler.observe(t + r, ids, rewards)``. So the scheduler observes every group it selected
  and that was generated, including the dropped ones: their outcome (all solved / all failed) is
  exactly what DPS, MoPPS or EnvSched learn from (the DPS and MoPPS authors' trainers do the same:
  their sampler is updated on every generation batch, before the filter, and the next batch takes
  the loader's next candidate pool, as round r + 1 takes step t + r + 1's pool here). Further
  candidates come from the scheduler
  itself, not from a random fallback, as when verl's dynamic sampling draws further batches from
  a curriculum sampler. The caller trains on the admitted groups and starts the next gate call at
  ``result.next_step``; scheduler steps therefore count generation rounds, not training steps.
- A group is admitted iff its filter value has non-zero standard deviation. ``filter_on =
  "accuracy"`` (default) filters on binary accuracy (a rollout is correct iff its reward
  >= 1 - 1e-6, :mod:`envsched_jax.sched.outcomes`), as DAPO's recipe does for shaped rewards;
  ``"reward"`` filters on the raw rewards (then all-fail groups with varied partial credit pass).
- Admitted groups are kept in generation order; once B have survived the round stops adding and
  the rest of that round's survivors are counted as ``surplus`` (generated, observed by the
  scheduler, not trained on). A task already admitted in this call is not admitted again
  (``duplicates``). If the cap of ``max_rounds`` (default 10, as in the DAPO scripts) is reached
  first, fewer than B groups are returned.
- Cost: every round generates B groups of K rollouts; ``rollouts`` counts them all and
  ``extra_rollouts`` those beyond the first round's B K.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from envsched_jax.sched.base import Scheduler
from envsched_jax.sched.outcomes import SUCCESS_THRESHOLD, informative

RolloutFn = Callable[[Sequence[str]], np.ndarray]
"""rollout_fn(task_ids) -> rewards [len(task_ids), K] in [0, 1]."""


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """Settings of the DAPO admission gate."""

    max_rounds: int = 10
    """Cap on generation rounds (scheduler steps) per gate call (DAPO scripts: 10)."""
    filter_on: Literal["accuracy", "reward"] = "accuracy"
    """Zero-std filter on binary accuracy (DAPO's choice for shaped rewards) or on the raw rewards."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this (filter_on='accuracy')."""

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.filter_on not in ("accuracy", "reward"):
            raise ValueError(f"filter_on must be 'accuracy' or 'reward', got {self.filter_on!r}")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"success_threshold must lie in (0, 1], got {self.success_threshold}")


@dataclasses.dataclass(frozen=True)
class GateResult:
    """What one gate call admitted and what it cost."""

    task_ids: list[str]          # admitted tasks, at most B, in generation order
    rewards: np.ndarray          # [len(task_ids), K] their rewards
    next_step: int               # the scheduler step the next gate call starts at
    rounds: int                  # generation rounds (scheduler steps) used
    rollouts: int                # rollouts generated in all rounds
    extra_rollouts: int          # rollouts beyond the first round's B K
    dropped: int                 # groups with zero standard deviation
    surplus: int                 # surviving groups beyond B
    duplicates: int              # surviving groups of a task already admitted in this call
    batch_size: int              # B, the number of groups asked for

    @property
    def full(self) -> bool:
        """Whether B groups were admitted (False when the round cap was hit first)."""
        return len(self.task_ids) == self.batch_size


def keep_mask(rewards, config: DynamicSamplingConfig = DynamicSamplingConfig()) -> np.ndarray:
    """[n] bool: groups of ``rewards`` [n, K] whose filter value has non-zero standard deviation."""
    rewards = np.asarray(rewards, np.float64)
    if config.filter_on == "accuracy":
        return np.asarray(informative(rewards, config.success_threshold))
    return np.ptp(rewards, axis=1) > 0


def dynamic_sampling(scheduler: Scheduler, step: int, rollout_fn: RolloutFn,
                     config: DynamicSamplingConfig = DynamicSamplingConfig()) -> GateResult:
    """Run generation rounds from scheduler step ``step`` until B groups survive the zero-std
    filter or ``config.max_rounds`` rounds have run (see the module docstring).

    Rewards returned by ``rollout_fn`` are validated by ``scheduler.observe`` before the gate looks
    at them: bad rewards raise ``SchedulerInputError``, earlier rounds of the call stay observed and
    the scheduler still awaits ``observe`` of the failing round's step.
    """
    size = scheduler.batch_size
    ids_out: list[str] = []
    rewards_out: list[np.ndarray] = []
    admitted: set[str] = set()
    rollouts = dropped = surplus = duplicates = rounds = 0
    while rounds < config.max_rounds and len(ids_out) < size:
        t = step + rounds
        ids = scheduler.select(t)
        rewards = rollout_fn(ids)
        scheduler.observe(t, ids, rewards)
        rewards = np.asarray(rewards, np.float64)   # observe() has checked it is [B, K] in [0, 1]
        rounds += 1
        rollouts += rewards.size
        keep = keep_mask(rewards, config)
        dropped += int((~keep).sum())
        for task, row, ok in zip(ids, rewards, keep):
            if not ok:
                continue
            if task in admitted:
                duplicates += 1
            elif len(ids_out) == size:
                surplus += 1
            else:
                admitted.add(task)
                ids_out.append(task)
                rewards_out.append(row)
    k = scheduler.group_size
    return GateResult(task_ids=ids_out,
                      rewards=np.array(rewards_out).reshape(len(ids_out), k),
                      next_step=step + rounds, rounds=rounds, rollouts=rollouts,
                      extra_rollouts=rollouts - size * k, dropped=dropped, surplus=surplus,
                      duplicates=duplicates, batch_size=size)
