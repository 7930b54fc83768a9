"""The part every trainer adapter shares: a scheduler driven by somebody else's training loop.

A trainer (tunix, TRL, verl, prime-rl / verifiers) owns the loop: it asks its data source for the
next batch of prompts, samples K completions of each, computes rewards, updates the policy, and
counts steps its own way. :class:`SchedulerFeed` puts any registered scheduler
(:func:`envsched_jax.sched.make_scheduler`) behind that loop with the framework's semantics:

- **Steps follow the trainer's.** ``next_batch(trainer_step)`` selects the batch of scheduler step
  ``trainer_step - step_offset`` (trainers count from 0 or 1; the offset says which). Asking again
  for the pending step returns the same ids (data loaders are re-iterated, prefetch peeks ahead is
  not allowed: see below); asking for a later step while the pending one still lacks rewards is an
  error naming the tasks whose rewards are missing, never a silent skip.
- **Rewards come back per rollout, in any order and in any number of calls.** ``record(task_ids,
  rewards)`` takes one reward per completion (a trainer's reward batch repeats each task id K
  times, possibly split over micro-batches); when every task of the pending batch has its K
  rewards the scheduler's ``observe`` runs, with rows in the batch's order and each task's rewards
  in arrival order. A reward for a task that is not pending, a K+1-th reward, or a value that is not
  a finite number in [0, 1] after the optional affine ``reward_range`` map is a
  :class:`~envsched_jax.sched.base.SchedulerInputError` naming the task, the step and the value,
  and nothing is recorded from that call (the integrity issue's rule: a reward that cannot be
  trusted is refused where it enters, not averaged in).
- **Checkpoints resume both sides.** ``save(directory)`` writes the scheduler's orbax checkpoint
  (:mod:`envsched_jax.sched.checkpoint`) and ``feed.json`` (the step offset, the reward range and
  the next step), between steps as trainers checkpoint; ``restore(folder, trainer_step=...)`` loads both and checks that the
  trainer's resumed step is the one the scheduler expects next, so a trainer restored from step
  200 with a scheduler from step 150 is an error, not a silent desynchronisation.

*Choice* (where the trainers differ): EnvSched learns from within-group reward variance, so a
reward range the trainer's reward functions do not share with the scheduler (TRL allows any real
reward) must be stated: ``reward_range=(lo, hi)`` maps ``lo -> 0`` and ``hi -> 1`` linearly, and
values outside [lo, hi] are refused, not clipped.

No trainer is imported here: each adapter (``envsched_jax.integrations.<trainer>``) imports its
own stack, and the core package never does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envsched_jax.sched.base import CheckpointError, Scheduler, SchedulerInputError

FEED_FILE = "feed.json"


class SchedulerFeed:
    """A scheduler behind a trainer's loop (module docstring).

    Args:
      scheduler: any registered scheduler, built for the trainer's batch size B (prompts per step)
        and group size K (completions per prompt).
      step_offset: the trainer's step number of the scheduler's step 0 (0 or 1 for most trainers).
      reward_range: ``(lo, hi)`` of the trainer's rewards, mapped linearly to [0, 1]; None when they
        already lie in [0, 1].
    """

    def __init__(self, scheduler: Scheduler, *, step_offset: int = 0,
                 reward_range: tuple[float, float] | None = None):
        if not isinstance(step_offset, int) or isinstance(step_offset, bool):
            raise TypeError(f"step_offset must be an int, got {step_offset!r}")
        if reward_range is not None:
            lo, hi = reward_range
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"reward_range must be finite (lo, hi) with lo < hi, got {reward_range!r}")
        self.scheduler = scheduler
        self.step_offset = step_offset
        self.reward_range = None if reward_range is None else (float(reward_range[0]), float(reward_range[1]))
        self._pending: tuple[int, list[str]] | None = None   # (scheduler step, ids in batch order)
        self._rewards: dict[str, list[float]] = {}
        self._next = scheduler._next_step                      # the scheduler step to select next

    # -- the trainer's side ------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self.scheduler.batch_size

    @property
    def group_size(self) -> int:
        return self.scheduler.group_size

    @property
    def next_trainer_step(self) -> int:
        """The trainer step whose batch comes next (the pending one, if any)."""
        step = self._pending[0] if self._pending is not None else self._next
        return step + self.step_offset

    @property
    def pending(self) -> list[str] | None:
        """Task ids of the step awaiting rewards (None when none is)."""
        return None if self._pending is None else list(self._pending[1])

    @property
    def recorded(self) -> dict[str, tuple[float, ...]]:
        """The rewards recorded so far for the pending step, per task (mapped to [0, 1])."""
        return {tid: tuple(values) for tid, values in self._rewards.items()}

    def next_batch(self, trainer_step: int | None = None) -> list[str]:
        """The B task ids of ``trainer_step`` (default: the next one). Selecting happens once per
        step; asking again for the pending step returns the same ids."""
        step = self._scheduler_step(trainer_step)
        if self._pending is not None:
            if step == self._pending[0]:
                return list(self._pending[1])
            raise SchedulerInputError(
                f"trainer step {step + self.step_offset}: the batch of trainer step "
                f"{self._pending[0] + self.step_offset} still lacks rewards for {self._missing()[:5]} "
                f"({len(self._missing())} of {self.batch_size} tasks); record them first")
        if step != self._next:
            raise SchedulerInputError(
                f"trainer step {step + self.step_offset}: the scheduler's next step is trainer step "
                f"{self._next + self.step_offset} (restore the scheduler's checkpoint saved with the "
                "trainer's, or build the feed with the right step_offset)")
        ids = self.scheduler.select(step)
        self._pending = (step, list(ids))
        self._rewards = {tid: [] for tid in ids}
        return list(ids)

    def record(self, task_ids: Sequence[str], rewards: Sequence[float], *,
               trainer_step: int | None = None) -> bool:
        """Add one reward per completion (module docstring). Returns True when this call completed
        the pending step (the scheduler has observed it)."""
        if self._pending is None:
            raise SchedulerInputError("record(): no batch awaits rewards (call next_batch first)")
        step, batch = self._pending
        if trainer_step is not None and self._scheduler_step(trainer_step) != step:
            raise SchedulerInputError(f"record(trainer_step={trainer_step}): the pending batch is trainer step "
                                      f"{step + self.step_offset}")
        ids = list(task_ids)
        values = np.asarray(rewards, dtype=object).reshape(-1) if not isinstance(rewards, np.ndarray) \
            else np.asarray(rewards).reshape(-1)
        if len(ids) != len(values):
            raise SchedulerInputError(f"trainer step {step + self.step_offset}: {len(ids)} task ids but "
                                      f"{len(values)} rewards")
        mapped, added = [], {}
        for tid, raw in zip(ids, values.tolist()):
            if not isinstance(tid, str) or tid not in self._rewards:
                raise SchedulerInputError(f"trainer step {step + self.step_offset}: a reward for task {tid!r}, "
                                          "which is not in the pending batch")
            value = self._reward(tid, raw, step)
            added[tid] = added.get(tid, 0) + 1
            if len(self._rewards[tid]) + added[tid] > self.group_size:
                raise SchedulerInputError(f"trainer step {step + self.step_offset}: more than K = "
                                          f"{self.group_size} rewards for task {tid!r}")
            mapped.append((tid, value))
        for tid, value in mapped:           # every check passed: only now is anything recorded
            self._rewards[tid].append(value)
        if self._missing():
            return False
        matrix = np.array([self._rewards[tid] for tid in batch], np.float64)
        self.scheduler.observe(step, batch, matrix)
        self._pending, self._rewards = None, {}
        self._next = step + 1
        return True

    def discard_recorded(self) -> None:
        """Forget the rewards recorded so far for the pending step, keeping its batch: for a
        trainer that retries a step after an exception part-way through it (its rewards are then
        recorded again). Nothing to forget is not an error."""
        self._rewards = {tid: [] for tid in self._rewards}

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the scheduler's checkpoint and ``feed.json`` to ``directory/step_<next step>``.
        Trainers checkpoint between steps: saving while a step still waits for rewards is an error
        (the scheduler's state is only defined between observe and the next select)."""
        from envsched_jax.sched.checkpoint import save_scheduler

        if self._pending is not None:
            raise SchedulerInputError(
                f"save(): trainer step {self._pending[0] + self.step_offset} is still waiting for rewards of "
                f"{len(self._missing())} tasks; save after the step's rewards are recorded")
        folder = save_scheduler(self.scheduler, directory)
        record = {"step_offset": self.step_offset, "reward_range": self.reward_range, "next_step": self._next}
        (folder / FEED_FILE).write_text(json.dumps(record, indent=2) + "\n")
        return folder

    def restore(self, folder: str | os.PathLike, *, trainer_step: int | None = None) -> None:
        """Load a folder written by :meth:`save`; with ``trainer_step`` (the trainer's resumed step),
        check that it is the step the scheduler expects next."""
        from envsched_jax.sched.checkpoint import restore_scheduler

        folder = Path(folder)
        try:
            record = json.loads((folder / FEED_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{folder / FEED_FILE}: cannot read the feed record ({err})") from None
        for key in ("step_offset", "next_step"):
            if not isinstance(record.get(key), int):
                raise CheckpointError(f"{folder / FEED_FILE}: field {key!r} must be an int, got {record.get(key)!r}")
        if record["step_offset"] != self.step_offset:
            raise CheckpointError(f"{folder / FEED_FILE}: saved with step_offset {record['step_offset']}, "
                                  f"this feed has {self.step_offset}")
        if trainer_step is not None and trainer_step != record["next_step"] + self.step_offset:
            raise CheckpointError(f"{folder}: the scheduler continues at trainer step "
                                  f"{record['next_step'] + self.step_offset}, the trainer at {trainer_step}")
        restore_scheduler(self.scheduler, folder)
        self._pending, self._rewards, self._next = None, {}, self.scheduler._next_step

    # -- helpers -------------------------------------------------------------------------------

    def _scheduler_step(self, trainer_step: int | None) -> int:
        if trainer_step is None:
            return self._pending[0] if self._pending is not None else self._next
        if not isinstance(trainer_step, (int, np.integer)) or isinstance(trainer_step, bool):
            raise SchedulerInputError(f"trainer_step must be an int, got {trainer_step!r}")
        step = int(trainer_step) - self.step_offset
        if step < 0:
            raise SchedulerInputError(f"trainer step {trainer_step} comes before the scheduler's step 0 "
                                      f"(step_offset {self.step_offset})")
        return step

    def _missing(self) -> list[str]:
        return [tid for tid, got in self._rewards.items() if len(got) < self.group_size]

    def _reward(self, task_id: str, raw: Any, step: int) -> float:
        where = f"trainer step {step + self.step_offset}: reward of task {task_id!r}"
        if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
            raise SchedulerInputError(f"{where} is {raw!r}, not a real number")
        value = float(raw)
        if not math.isfinite(value):
            raise SchedulerInputError(f"{where} is {value}")
        if self.reward_range is not None:
            lo, hi = self.reward_range
            if not lo <= value <= hi:
                raise SchedulerInputError(f"{where} is {value}, outside the declared reward_range [{lo}, {hi}]")
            return (value - lo) / (hi - lo)
        if not 0.0 <= value <= 1.0:
            raise SchedulerInputError(f"{where} is {value}, outside [0, 1] (declare the trainer's reward_range "
                                      "to map it)")
        return value
