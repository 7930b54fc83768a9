"""A scheduler as the task sampler of tunix's GRPO learners (google-tunix 0.1.7: ``GRPOLearner``
and its subclasses ``DAPOLearner`` and ``DrGRPOLearner``).

tunix owns the loop: ``learner.train(train_ds)`` calls ``iter(train_ds)`` and takes one item per
global step, a dict of columns of B rows (``"prompts"`` plus anything else), repeats every row
K = ``num_generations`` times, samples, and calls the reward functions with ``prompts``,
``completions``, every other column (repeated the same way), ``mode`` and ``trajectory_ids``;
their per-completion sum is the reward it trains on. :class:`TunixTaskSource` sits on both ends,
over a :class:`~envsched_jax.integrations.core.SchedulerFeed`:

- **Batches through tunix's data interface.** The source is the iterable ``train_ds``: its k-th
  item is the scheduler's batch of trainer step k (``feed.next_batch(k)``), the rows of the
  selected tasks in the scheduler's order with a ``task_id`` column beside ``prompts`` and the
  rows' other columns (an object array each, so reward functions get the values as given).
- **Rewards through tunix's reward-function hook.** :meth:`TunixTaskSource.reward_fns` wraps the
  user's reward functions; tunix still calls each one (``functools.wraps`` keeps its name for
  tunix's per-function logs and its signature for tunix's injection of config fields). When the
  last one of a call has returned, the wrapper sums their rewards as tunix does and hands them,
  one per completion with its ``task_id``, to ``feed.record``; the feed observes the step once
  every task has its K rewards, whatever micro-batches tunix computed them in. Calls with
  ``mode="eval"`` (tunix's evaluation on the user's own ``eval_ds``) are passed through and not
  recorded.
- **Steps.** Trainer step k is tunix's k-th global step, counted from 0: the index of the
  iterator item, and the number of global steps tunix has completed before it (``step_offset``
  0). With ``mini_batch_size`` equal to the batch (tunix's default) it is also tunix's
  ``train_steps`` and checkpoint step; with u = B / ``mini_batch_size`` optimizer updates per
  global step, tunix's checkpoint step is u * k. The adapter reads tunix's position from its
  actor trainer's ``train_steps``, not from its restored ``global_steps``, which 0.1.7 resets to
  0 when it resumes from the final checkpoint ``close()`` writes (that one carries no metadata).
- **Checkpoints.** :meth:`TunixTaskSource.attach` links the source to the learner after tunix
  has restored its actor checkpoint (in the learner's constructor). Every time tunix writes an
  actor checkpoint at a global-step boundary, the feed is written beside it
  (``<checkpoint_root_directory>/envsched/step_<k>``; tunix's own are under ``actor/``), and
  feed folders whose tunix checkpoint tunix has deleted (``max_to_keep``) are deleted too. On a
  restart, ``attach`` restores the feed saved with tunix's restored step, and a tunix checkpoint
  without one is a :class:`~envsched_jax.sched.base.CheckpointError`, never a silent fresh
  scheduler.
- **Prefetch and re-iteration.** tunix 0.1.7 takes step k + 1's item only after step k's rewards
  (its data preparation for a step runs to completion before the next is submitted), so the
  feed never has two steps in flight; a version that prefetched further would get the feed's
  error naming the tasks still without rewards, not a skipped or repeated batch. After a
  restore, tunix re-creates the iterator and fast-forwards it past the steps its checkpoint
  already trained: the first iterator after ``attach`` yields those k items as placeholders
  (real prompts and columns of the pool's first tasks, task ids marked as placeholders), which
  tunix discards; a reward for a placeholder (tunix and the source disagreeing on where training
  resumed) is an error. Every later ``iter()`` continues at the feed's next step.

*Choices.* Sum, not per function: the scheduler observes the reward tunix computes its
advantages from; a ``reward_range`` declared on the feed applies to that sum (two functions in
[0, 1] give (0, 2)). A reward function's non-finite value is refused with the function's name
(tunix itself would ``nansum`` it to 0). A tunix checkpoint taken inside a global step (u > 1,
after the first of its updates) cannot be resumed: the feed cannot be saved while a step still
waits for rewards, and resuming from it is refused by name.

Only this module imports tunix's RL stack; :mod:`envsched_jax.integrations.core` and the
schedulers never do.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tunix.rl import reward_manager as tunix_reward_manager
from tunix.rl.grpo import grpo_learner as tunix_grpo

from envsched_jax.integrations.core import SchedulerFeed
from envsched_jax.sched.base import CheckpointError, SchedulerInputError

TASK_COLUMN = "task_id"
PROMPT_COLUMN = "prompts"            # tunix's name for the prompt column
FEED_FOLDER = "envsched"             # beside tunix's actor/ (and critic/) checkpoint folders
PLACEHOLDER_PREFIX = "<envsched placeholder: trainer step "
# Keyword arguments tunix's reward manager adds itself: a column of that name would collide.
_RESERVED_COLUMNS = ("mode", "trajectory_ids", "completions")

RewardFn = Callable[..., Any]


def prompt_records(rows: Iterable[Mapping[str, Any]], *, environment_column: str | None = None
                   ) -> list[dict[str, str]]:
    """The :func:`~envsched_jax.pool.prompts.prompt_pool` records of tunix rows: ``task_id``,
    ``prompt`` from ``prompts``, and ``environment`` from ``environment_column`` when given
    (the rows' other columns are the reward functions', not the graph's)."""
    records = []
    for k, row in enumerate(rows, 1):
        record = {"task_id": row.get(TASK_COLUMN), "prompt": row.get(PROMPT_COLUMN)}
        if environment_column is not None:
            if environment_column not in row:
                raise ValueError(f"row {k}: no column {environment_column!r} (environment_column)")
            record["environment"] = row[environment_column]
        records.append(record)
    return records


class TunixTaskSource:
    """A scheduler's batches as a tunix learner's ``train_ds``, its reward functions' rewards fed
    back (module docstring).

    Use::

        source = TunixTaskSource(feed, rows)
        learner = GRPOLearner(rl_cluster, grpo_config, reward_fns=source.reward_fns(my_fns))
        source.attach(learner)
        learner.train(source)

    Args:
      feed: the scheduler behind tunix's loop, built for B = tunix's batch (prompts per step)
        and K = ``num_generations``; ``step_offset`` must be 0 (tunix's global steps count from
        0).
      rows: one mapping per task of the scheduler's pool: ``task_id``, ``prompts`` (the prompt
        string tunix samples from) and the same other columns in every row (what the reward
        functions need: a reference answer, a test, ...).

    Raises:
      ValueError: a row without a string ``task_id`` or non-empty ``prompts``, a repeated task
        id, a task id not in the pool or a pool task without a row, rows with different columns,
        or a column tunix's reward manager reserves (``mode``, ``trajectory_ids``,
        ``completions``).
    """

    def __init__(self, feed: SchedulerFeed, rows: Iterable[Mapping[str, Any]]):
        if feed.step_offset != 0:
            raise ValueError(f"feed.step_offset must be 0 (tunix counts global steps from 0), "
                             f"got {feed.step_offset}")
        self.feed = feed
        self._rows, self._columns = _index_rows(rows, list(feed.scheduler.graph.task_ids))
        self._reward_fns: tuple[RewardFn, ...] = ()
        self._parts: list[np.ndarray] = []          # the current reward call's per-function rewards
        self._learner: Any = None
        self._fast_forward = 0                     # placeholders the next iterator yields first
        self._updates_per_step = 1
        self._checkpoint_directory: Path | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of every batch: ``prompts``, ``task_id`` and the rows' others."""
        return (PROMPT_COLUMN, TASK_COLUMN, *self._columns[1:])

    @property
    def checkpoint_directory(self) -> Path | None:
        """Where the feed's checkpoints go (None before :meth:`attach`, or when tunix does not
        checkpoint)."""
        return self._checkpoint_directory

    # -- rewards -------------------------------------------------------------------------------

    def reward_fns(self, fns: RewardFn | Sequence[RewardFn]) -> list[RewardFn]:
        """The user's reward functions, wrapped to pass their summed rewards to the feed; give
        the list to the learner as ``reward_fns``. Call once per source."""
        fns = [fns] if callable(fns) else list(fns)
        if not fns or not all(callable(fn) for fn in fns):
            raise ValueError(f"reward_fns: expected one or more callables, got {fns!r}")
        if self._reward_fns:
            raise ValueError("reward_fns() was already called on this source; build the learner "
                             "with the list it returned")
        self._reward_fns = tuple(self._wrap(i, fn, len(fns)) for i, fn in enumerate(fns))
        return list(self._reward_fns)

    def _wrap(self, index: int, fn: RewardFn, count: int) -> RewardFn:
        @functools.wraps(fn)
        def reward_fn(prompts, completions, **kwargs):
            rewards = fn(prompts=prompts, completions=completions, **kwargs)
            if "mode" not in kwargs:
                raise SchedulerInputError(f"reward function {_name(fn)!r} was called without tunix's "
                                          "mode keyword (call it through a tunix learner)")
            if kwargs["mode"] == "train":
                self._collect(index, count, fn, len(prompts), kwargs, rewards)
            return rewards

        return reward_fn

    def _collect(self, index: int, count: int, fn: RewardFn, num_prompts: int,
                 kwargs: Mapping[str, Any], rewards: Any) -> None:
        where = f"reward function {_name(fn)!r}"
        if TASK_COLUMN not in kwargs:
            raise SchedulerInputError(f"{where}: the batch has no {TASK_COLUMN!r} column (train on "
                                      "the TunixTaskSource's batches)")
        task_ids = [str(t) for t in kwargs[TASK_COLUMN]]
        if len(task_ids) != num_prompts:
            raise SchedulerInputError(f"{where}: {num_prompts} prompts but {len(task_ids)} task ids")
        placeholder = next((t for t in task_ids if t.startswith(PLACEHOLDER_PREFIX)), None)
        if placeholder is not None:
            raise SchedulerInputError(
                f"{where}: tunix trained on {placeholder!r}, a step its checkpoint had already "
                f"trained; the feed resumed at trainer step {self.feed.next_trainer_step}")
        values = _reward_values(where, rewards, task_ids)
        if index == 0:
            self._parts = []
        if index != len(self._parts):
            raise SchedulerInputError(f"{where}: called as function {index + 1} of {count} after "
                                      f"{len(self._parts)} (tunix calls them in order)")
        self._parts.append(values)
        if index == count - 1:
            total, self._parts = np.sum(self._parts, axis=0), []
            self.feed.record(task_ids, total)

    # -- the learner ---------------------------------------------------------------------------

    def attach(self, learner: Any) -> int:
        """Link the source to a tunix learner built with :meth:`reward_fns`: check the learner
        matches the feed, restore the feed to tunix's restored step, and write the feed with
        each of tunix's checkpoints from now on. Returns the trainer step training continues at.

        Raises:
          TypeError: not a tunix GRPO learner, or one whose reward manager is not tunix's
            sequence-level sum.
          ValueError: the learner's reward functions are not this source's (DAPO's overlong
            reward shaping, which its learner appends, included), K differs from
            ``num_generations``, or the batch is not a multiple of ``mini_batch_size``.
          CheckpointError: tunix resumed from a checkpoint the feed has no checkpoint for (or one
            taken inside a global step).
        """
        if not isinstance(learner, tunix_grpo.GRPOLearner):
            raise TypeError(f"attach(): expected a tunix GRPOLearner (or DAPOLearner, DrGRPOLearner), "
                            f"got {type(learner).__name__}")
        manager = learner.reward_manager
        if type(manager) is not tunix_reward_manager.SequenceRewardManager:
            raise TypeError(f"attach(): the learner's reward manager is {type(manager).__name__}; the "
                            "source mirrors tunix's 'sequence-level' manager (the sum of the functions)")
        if not self._reward_fns or tuple(manager.reward_fns) != self._reward_fns:
            raise ValueError(f"attach(): the learner calls the reward functions "
                             f"{[_name(fn) for fn in manager.reward_fns]}, not the list this source's "
                             f"reward_fns() returned ({[_name(fn) for fn in self._reward_fns]}), in that order")
        generations = learner.algo_config.num_generations
        if generations != self.feed.group_size:
            raise ValueError(f"attach(): num_generations is {generations}, the feed's group size K is "
                             f"{self.feed.group_size}")
        trainer = learner.rl_cluster.actor_trainer
        config = learner.rl_cluster.cluster_config.training_config
        batch = self.feed.batch_size
        mini = config.mini_batch_size or batch
        if batch % mini:
            raise ValueError(f"attach(): the batch B = {batch} is not a multiple of mini_batch_size {mini}")
        self._updates_per_step = batch // mini
        root = config.checkpoint_root_directory
        self._checkpoint_directory = None if root is None else Path(root) / FEED_FOLDER
        step = self._resume(trainer.train_steps)
        self._learner = learner
        self._fast_forward = step
        self._link_checkpoints(trainer)
        return step

    def _resume(self, tunix_step: int) -> int:
        step, inside = divmod(tunix_step, self._updates_per_step)
        if inside:
            raise CheckpointError(
                f"tunix resumed from checkpoint step {tunix_step}, inside global step {step} "
                f"({self._updates_per_step} updates each); the feed is saved at global-step boundaries only")
        if self.feed.pending is None and self.feed.next_trainer_step == step:
            return step                   # a fresh start, or a feed restored by the caller
        if self._checkpoint_directory is None:
            raise CheckpointError(f"tunix resumed at global step {step} without a checkpoint "
                                  f"directory, but the feed is at trainer step {self.feed.next_trainer_step}")
        folder = self._checkpoint_directory / f"step_{step:08d}"
        if not folder.is_dir():
            raise CheckpointError(f"tunix resumed at global step {step} (checkpoint step {tunix_step}), "
                                  f"but {folder} does not exist: the scheduler cannot resume with it")
        self.feed.restore(folder, trainer_step=step)
        return step

    def _link_checkpoints(self, trainer: Any) -> None:
        """Wrap the actor trainer's checkpoint manager so each checkpoint tunix writes at a
        global-step boundary writes the feed's too (tunix offers no save hook: its training hooks
        run before its checkpoints, and not at all for the final one ``close()`` writes)."""
        manager = trainer.checkpoint_manager
        save = getattr(manager.save, "__wrapped__", manager.save)

        @functools.wraps(save)
        def save_both(step, *args, **kwargs):
            saved = save(step, *args, **kwargs)
            if saved and self._checkpoint_directory is not None:
                self._save_feed(step, trainer)
            return saved

        manager.save = save_both

    def _save_feed(self, tunix_step: int, trainer: Any) -> None:
        step, inside = divmod(tunix_step, self._updates_per_step)
        if inside:
            return                        # inside a global step: the feed waits for rewards (module docstring)
        if self.feed.next_trainer_step != step or self.feed.pending is not None:
            raise CheckpointError(f"tunix checkpoints global step {step}, the feed is at trainer step "
                                  f"{self.feed.next_trainer_step} (pending: {self.feed.pending is not None})")
        self.feed.save(self._checkpoint_directory)
        kept = _tunix_steps(trainer.config.checkpoint_root_directory) | {tunix_step}
        for folder in self._checkpoint_directory.glob("step_*"):
            suffix = folder.name.removeprefix("step_")
            if suffix.isdigit() and int(suffix) * self._updates_per_step not in kept:
                shutil.rmtree(folder)

    # -- the data iterator ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._learner is None:
            raise SchedulerInputError("iterate a TunixTaskSource after attach(learner): tunix's "
                                      "restored step decides where its batches start")
        skip, self._fast_forward = self._fast_forward, 0
        return self._batches(skip)

    def _batches(self, skip: int) -> Iterator[dict[str, np.ndarray]]:
        filler = list(self.feed.scheduler.graph.task_ids[:self.feed.batch_size])
        for k in range(skip):
            yield self._batch(filler, task_ids=[f"{PLACEHOLDER_PREFIX}{k}: {t}>" for t in filler])
        step = self.feed.next_trainer_step
        while True:
            yield self._batch(self.feed.next_batch(step))
            step += 1

    def _batch(self, ids: Sequence[str], task_ids: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        batch = {column: _object_column([self._rows[t][column] for t in ids]) for column in self._columns}
        batch[TASK_COLUMN] = _object_column(list(task_ids if task_ids is not None else ids))
        return batch


# -- helpers -------------------------------------------------------------------------------------


def _index_rows(rows: Iterable[Mapping[str, Any]], pool_ids: list[str]
                ) -> tuple[dict[str, Mapping[str, Any]], tuple[str, ...]]:
    indexed: dict[str, Mapping[str, Any]] = {}
    columns: tuple[str, ...] | None = None
    known = set(pool_ids)
    for k, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            raise ValueError(f"row {k}: expected a mapping, got {type(row).__name__}")
        task_id, prompt = row.get(TASK_COLUMN), row.get(PROMPT_COLUMN)
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"row {k}, column {TASK_COLUMN!r}: must be a non-empty string, got {task_id!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"row {k} ({task_id!r}), column {PROMPT_COLUMN!r}: must be a non-empty "
                             f"string, got {prompt!r}")
        if task_id in indexed:
            raise ValueError(f"row {k}: task id {task_id!r} repeats an earlier row")
        if task_id not in known:
            raise ValueError(f"row {k}: task id {task_id!r} is not in the scheduler's pool")
        reserved = sorted(set(row) & set(_RESERVED_COLUMNS))
        if reserved:
            raise ValueError(f"row {k} ({task_id!r}): column(s) {reserved} collide with the keywords "
                             "tunix passes to reward functions")
        names = (PROMPT_COLUMN, *sorted(set(row) - {TASK_COLUMN, PROMPT_COLUMN}))
        if columns is None:
            columns = names
        elif names != columns:
            raise ValueError(f"row {k} ({task_id!r}): columns {list(names)}, the first row has {list(columns)}")
        indexed[task_id] = row
    missing = [t for t in pool_ids if t not in indexed]
    if missing:
        raise ValueError(f"{len(missing)} task(s) of the scheduler's pool have no row, e.g. {missing[:3]}")
    return indexed, columns


def _object_column(values: list[Any]) -> np.ndarray:
    """A 1-D object array: tunix repeats and concatenates arrays along axis 0, and an object
    array hands each value back as given (a string stays a ``str``, a list a list)."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _reward_values(where: str, rewards: Any, task_ids: list[str]) -> np.ndarray:
    """One finite float per completion from what a reward function returned (a list, NumPy or
    JAX array, as tunix accepts), or an error naming the function and the task."""
    if rewards is None or isinstance(rewards, (str, bytes)) or np.ndim(rewards) != 1:
        raise SchedulerInputError(f"{where} returned {rewards!r}, not one reward per completion")
    values = list(rewards)
    if len(values) != len(task_ids):
        raise SchedulerInputError(f"{where} returned {len(values)} rewards for {len(task_ids)} completions")
    out = np.empty(len(values), np.float64)
    for i, (task_id, value) in enumerate(zip(task_ids, values)):
        scalar = np.asarray(value)
        if scalar.ndim != 0 or scalar.dtype.kind not in "iuf":      # bools and strings included
            raise SchedulerInputError(f"{where}: the reward of task {task_id!r} is {value!r}, not a real number")
        if not np.isfinite(scalar):
            raise SchedulerInputError(f"{where}: the reward of task {task_id!r} is {float(scalar)}")
        out[i] = float(scalar)
    return out


def _tunix_steps(root: str | None) -> set[int]:
    """The steps of tunix's actor checkpoints on disk (its manager keeps ``max_to_keep``)."""
    folder = None if root is None else Path(root)
    if folder is None or not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}


def _name(fn: RewardFn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
