"""TRL: a scheduler as the prompt sampler of ``trl.GRPOTrainer`` (``pip install 'envsched_jax[trl]'``).

:class:`ScheduledGRPOTrainer` is a ``GRPOTrainer`` whose prompts are chosen by a
:class:`~envsched_jax.integrations.core.SchedulerFeed` (any registered scheduler) and whose
scheduler observes the rewards TRL trains on. Everything else (generation, reward functions, loss,
logging, evaluation, checkpoints) is TRL's own.

**One scheduler step is one TRL generation batch.** TRL generates ``generation_batch_size``
completions at once: ``B = generation_batch_size / num_generations`` prompts, each
``K = num_generations`` times, so the scheduler is built with ``batch_size=B, group_size=K``. It
generates once every ``E = steps_per_generation * num_iterations`` micro-batches and steps the
optimizer (``state.global_step += 1``) every ``A = gradient_accumulation_steps`` micro-batches, so
generation ``n`` starts at micro-batch ``n * E``, inside optimizer step ``floor(n * E / A)``. With
TRL's defaults (``steps_per_generation = A``, ``num_iterations = 1``) that is one generation per
optimizer step and ``n == global_step``. The feed counts generations: its trainer step ``n`` is the
generation index, hence ``step_offset`` must be 0 (TRL counts both from 0).

**Why the prompts are chosen at generation time, not in the sampler.** The scheduler must observe
generation ``n``'s rewards before it selects generation ``n + 1`` (that is what it learns from),
but TRL's data loader runs ahead of generation: accelerate's ``DataLoaderShard`` fetches the next
batch before yielding the current one, and worker processes prefetch more. A sampler that selected
when the loader asked would select step ``n + 1`` before step ``n`` is scored (with TRL's default
of one micro-batch per generation, on every step). So ``_get_train_sampler`` returns placeholder
slots (row 0; an epoch is one pass over the scheduler's pool counted as ``RepeatSampler`` counts a
pass over the dataset, rounded to whole generations and optimizer steps), and ``_generate_and_score_completions`` replaces the placeholder rows, in training
only, with the dataset rows of the scheduler's batch, each repeated K times in a row as
``RepeatSampler`` lays them out. The reward functions then receive exactly those rows' columns.

**Rewards flow back from ``_calculate_rewards``**, the one place that sees every reward function's
column: the scheduler records ``sum_i w_i r_i`` with TRL's ``reward_weights`` and TRL's
``nansum`` (a function returning None counts 0, as in TRL's ``sum_then_normalize`` aggregation),
keyed by each row's task id column. A completion for which every function returned None is an
error naming the task (TRL would train on it with advantage 0; the scheduler cannot observe a
missing reward). Values must lie in [0, 1] or in the feed's declared ``reward_range`` (TRL allows
any real reward), else the feed refuses them. ``normalize_then_sum`` is refused: its "reward" is a
group z-score, not a bounded success signal.

**Checkpoints.** A callback's ``on_save`` writes the feed to ``checkpoint-<global_step>/envsched``
beside TRL's files; :meth:`ScheduledGRPOTrainer.train` with ``resume_from_checkpoint`` restores it
and checks that the scheduler continues at the generation TRL continues at. TRL keeps a
generation's completions in memory (not in the checkpoint) and regenerates on resume, so a
checkpoint must fall on a generation boundary: ``save_steps`` must be a multiple of
``E / gcd(E, A)`` (checked up front, and again at every save).

Refused up front with a ``ValueError`` naming the setting: ``num_generations`` or
``generation_batch_size`` that do not match the feed, a feed ``step_offset`` other than 0, more than
one process (each rank would need the same scheduler fed all ranks' rewards; not supported here),
``multi_objective_aggregation="normalize_then_sum"``, ``remove_unused_columns=True`` (it drops the
task id column), an iterable or missing ``train_dataset``, task ids missing, repeated or not
strings, and scheduler tasks absent from the dataset.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch.utils.data import Sampler
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import GRPOTrainer

from envsched_jax.integrations.core import SchedulerFeed
from envsched_jax.sched.base import CheckpointError, SchedulerInputError
from envsched_jax.sched.checkpoint import latest_checkpoint

FEED_DIR = "envsched"   # the feed's folder inside each TRL checkpoint-<global_step> folder

__all__ = ["FEED_DIR", "GenerationClock", "ScheduledGRPOTrainer", "prompt_records"]


@dataclasses.dataclass(frozen=True)
class GenerationClock:
    """TRL's two counters and the generation index between them (module docstring).

    Args:
      micro_batches_per_generation: E = ``steps_per_generation * num_iterations``.
      gradient_accumulation_steps: A, micro-batches per optimizer step (``global_step``).
    """

    micro_batches_per_generation: int
    gradient_accumulation_steps: int

    def __post_init__(self):
        for field in ("micro_batches_per_generation", "gradient_accumulation_steps"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GenerationClock.{field} must be a positive int, got {value!r}")

    @classmethod
    def from_args(cls, args: Any) -> GenerationClock:
        return cls(micro_batches_per_generation=args.steps_per_generation * args.num_iterations,
                   gradient_accumulation_steps=args.gradient_accumulation_steps)

    @property
    def save_multiple(self) -> int:
        """Optimizer steps between two points where a generation and an optimizer step both end."""
        e, a = self.micro_batches_per_generation, self.gradient_accumulation_steps
        return e // math.gcd(e, a)

    @property
    def generations_per_cycle(self) -> int:
        """Generations between two such points."""
        e, a = self.micro_batches_per_generation, self.gradient_accumulation_steps
        return a // math.gcd(e, a)

    def generation_at_micro_batch(self, micro_batch: int) -> int:
        """The generation that starts at ``micro_batch`` (0-based over the whole run)."""
        if micro_batch % self.micro_batches_per_generation:
            raise SchedulerInputError(
                f"TRL generated at micro-batch {micro_batch}, which is not a multiple of steps_per_generation * "
                f"num_iterations = {self.micro_batches_per_generation}: its generations no longer follow the "
                "scheduler's steps")
        return micro_batch // self.micro_batches_per_generation

    def generation_at_optimizer_step(self, global_step: int) -> int:
        """The next generation when ``global_step`` optimizer steps are done; refuses a step in the
        middle of a generation (TRL would regenerate there on resume)."""
        if global_step % self.save_multiple:
            raise CheckpointError(
                f"global_step {global_step} falls inside a generation (steps_per_generation * num_iterations = "
                f"{self.micro_batches_per_generation} micro-batches, gradient_accumulation_steps = "
                f"{self.gradient_accumulation_steps}); checkpoints must be at a multiple of {self.save_multiple} steps")
        return global_step * self.gradient_accumulation_steps // self.micro_batches_per_generation


class _PlaceholderSlots(Sampler):
    """``num_slots`` times row 0: the data loader's rows are replaced at generation time (module
    docstring), so the sampler only gives TRL's loop its length."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots

    def __iter__(self) -> Iterator[int]:
        return itertools.repeat(0, self.num_slots)

    def __len__(self) -> int:
        return self.num_slots


class _FeedCheckpoints(TrainerCallback):
    """Writes the feed into every checkpoint TRL writes (``on_save`` runs after TRL's files are)."""

    def __init__(self, trainer: ScheduledGRPOTrainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        self.trainer.save_feed(state.global_step)


class ScheduledGRPOTrainer(GRPOTrainer):
    """A ``GRPOTrainer`` whose training prompts are the feed's batches (module docstring).

    Args:
      *args: ``GRPOTrainer``'s positional arguments.
      **kwargs: ``GRPOTrainer``'s keyword arguments; ``args`` (a ``GRPOConfig``) and a
        ``datasets.Dataset`` ``train_dataset`` are required.
      feed: the scheduler behind the loop, built for ``batch_size = generation_batch_size /
        num_generations`` and ``group_size = num_generations``, ``step_offset=0``, and
        ``reward_range`` when the weighted reward can leave [0, 1].
      task_id_column: the dataset column holding each row's task id (the scheduler's ids).
    """

    def __init__(self, *args, feed: SchedulerFeed, task_id_column: str = "task_id", **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        self.clock = _check_config(config, feed)
        self._row_of = _task_rows(dataset, task_id_column, feed)
        self.feed = feed
        self.task_id_column = task_id_column
        self._micro_offset: int | None = None    # run-wide micro-batch of TRL's _step == 0, set by train()
        self._generation: int | None = None      # the generation whose rewards are awaited
        super().__init__(*args, **kwargs)
        self.add_callback(_FeedCheckpoints(self))

    # -- TRL's hooks -------------------------------------------------------------------------

    def _get_train_sampler(self, dataset: Dataset | None = None) -> Sampler:
        """As many slots per epoch as TRL's RepeatSampler would give for one pass over the pool,
        rounded to whole optimizer steps and whole generations."""
        per_cycle = self.clock.generations_per_cycle
        generations = max(per_cycle, self.feed.scheduler.num_nodes // self.feed.batch_size // per_cycle * per_cycle)
        rows = self.feed.batch_size * self.feed.group_size * self.clock.micro_batches_per_generation
        return _PlaceholderSlots(generations * rows)

    def _generate_and_score_completions(self, inputs):
        if self.model.training:
            inputs = self._scheduled_rows(len(inputs))
        return super()._generate_and_score_completions(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._report(inputs, rewards_per_func)
        return rewards_per_func

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """TRL's ``train``; with ``resume_from_checkpoint`` (a path, or True for the last one in
        ``output_dir``) the feed is restored from that checkpoint's ``envsched`` folder first."""
        checkpoint = resume_from_checkpoint or None
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
            if checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if checkpoint is None:
            if self.feed.pending is not None or self.feed.next_trainer_step != 0:
                raise SchedulerInputError(
                    f"train() from step 0, but the feed continues at generation {self.feed.next_trainer_step}: "
                    "resume TRL from the checkpoint saved with the feed (resume_from_checkpoint=...)")
            global_step = 0
        else:
            global_step = self._restore_feed(Path(checkpoint))
        self._micro_offset = global_step * self.clock.gradient_accumulation_steps - self._step
        return super().train(resume_from_checkpoint=checkpoint, **kwargs)

    # -- checkpoints ---------------------------------------------------------------------------

    def save_feed(self, global_step: int) -> Path:
        """Write the feed into ``output_dir/checkpoint-<global_step>/envsched`` (called by the
        callback after TRL's own checkpoint)."""
        self.clock.generation_at_optimizer_step(global_step)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{global_step}"
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: TRL's checkpoint folder for global_step {global_step} is missing, so "
                                  "the scheduler's state has nowhere to go")
        return self.feed.save(folder / FEED_DIR)

    def _restore_feed(self, checkpoint: Path) -> int:
        try:
            global_step = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE_NAME)).global_step
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{checkpoint / TRAINER_STATE_NAME}: cannot read TRL's state ({err})") from None
        generation = self.clock.generation_at_optimizer_step(global_step)
        folder = latest_checkpoint(checkpoint / FEED_DIR)
        if folder is None:
            raise CheckpointError(f"{checkpoint}: no scheduler state in {FEED_DIR}/ (was it written by a "
                                  "ScheduledGRPOTrainer?)")
        self.feed.restore(folder, trainer_step=generation)
        return global_step

    # -- the scheduler's side of a generation ----------------------------------------------------

    def _scheduled_rows(self, num_rows: int) -> list[dict[str, Any]]:
        if self._micro_offset is None:
            raise SchedulerInputError("ScheduledGRPOTrainer generates training batches only inside train()")
        generation = self.clock.generation_at_micro_batch(self._step + self._micro_offset)
        expected = self.feed.batch_size * self.feed.group_size
        if num_rows != expected:
            raise SchedulerInputError(f"generation {generation}: TRL's generation batch has {num_rows} rows, the "
                                      f"scheduler's B * K = {expected}")
        task_ids = self.feed.next_batch(generation)
        self._generation = generation
        indices = [self._row_of[tid] for tid in task_ids for _ in range(self.feed.group_size)]
        return [self.train_dataset[i] for i in indices]

    def _report(self, inputs: Sequence[Mapping[str, Any]], rewards_per_func: torch.Tensor) -> None:
        task_ids = [row.get(self.task_id_column) for row in inputs]
        unscorable = torch.isnan(rewards_per_func).all(dim=1).nonzero(as_tuple=True)[0]
        if len(unscorable):
            j = int(unscorable[0])
            raise SchedulerInputError(
                f"generation {self._generation}: every reward function ({', '.join(self.reward_func_names)}) "
                f"returned None for completion {j} (task {task_ids[j]!r}); the scheduler needs one reward per "
                "completion")
        # TRL's own combination (sum_then_normalize), computed the same way on the same device.
        combined = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        if not self.feed.record(task_ids, combined.tolist(), trainer_step=self._generation):
            pending = self.feed.pending or []
            raise SchedulerInputError(f"generation {self._generation}: TRL scored {len(task_ids)} completions, "
                                      f"which leaves tasks of {pending[:5]} without their K rewards")


def prompt_records(dataset: Dataset, *, task_id_column: str = "task_id", environment_column: str | None = None,
                   check_column: str | None = None) -> list[dict[str, str]]:
    """The rows of a TRL prompt dataset as :func:`~envsched_jax.pool.prompts.prompt_pool` records.

    A standard prompt (a string) is the task's instruction; a conversational prompt (a list of
    ``{"role", "content"}`` messages) gives its non-system messages' text as the instruction and
    its system messages' text as the context, which the graph's context view reads."""
    columns = [task_id_column, "prompt"] + [c for c in (environment_column, check_column) if c is not None]
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"prompt_records: the dataset has no column(s) {missing} (it has {dataset.column_names})")
    records = []
    for k, row in enumerate(dataset.select_columns(columns)):
        prompt, context = _prompt_text(row["prompt"], k)
        record = {"task_id": row[task_id_column], "prompt": prompt}
        if context:
            record["context"] = context
        if environment_column is not None:
            record["environment"] = row[environment_column]
        if check_column is not None:
            record["check"] = row[check_column]
        records.append(record)
    return records


def _prompt_text(prompt: Any, row: int) -> tuple[str, str]:
    if isinstance(prompt, str):
        return prompt, ""
    if not isinstance(prompt, list) or not all(isinstance(m, Mapping) and "role" in m for m in prompt):
        raise ValueError(f"prompt_records: row {row}, column 'prompt': expected a string or a list of "
                         f"{{'role', 'content'}} messages, got {type(prompt).__name__}")
    parts: dict[bool, list[str]] = {True: [], False: []}
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):      # content blocks: keep the text ones
            content = "\n".join(b.get("text", "") for b in content
                                 if isinstance(b, Mapping) and b.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError(f"prompt_records: row {row}, column 'prompt': a {message['role']!r} message has "
                             f"content {content!r}, not text")
        parts[message["role"] == "system"].append(content)
    return "\n".join(parts[False]), "\n".join(parts[True])


def _check_config(args: Any, feed: SchedulerFeed) -> GenerationClock:
    if not isinstance(feed, SchedulerFeed):
        raise TypeError(f"feed must be a SchedulerFeed, got {type(feed).__name__}")
    if args is None:
        raise ValueError("ScheduledGRPOTrainer needs args=GRPOConfig(...): the feed is checked against it")
    if feed.step_offset != 0:
        raise ValueError(f"feed.step_offset is {feed.step_offset}; the feed counts TRL's generations, which start "
                         "at 0, so it must be 0")
    if args.world_size != 1:
        raise ValueError(f"world_size is {args.world_size}; ScheduledGRPOTrainer runs in one process (each rank "
                         "would need the same scheduler fed every rank's rewards)")
    if args.num_generations != feed.group_size:
        raise ValueError(f"num_generations is {args.num_generations} but the scheduler's group_size is "
                         f"{feed.group_size}; they are the same K")
    if args.generation_batch_size != feed.batch_size * feed.group_size:
        raise ValueError(f"generation_batch_size is {args.generation_batch_size} but the scheduler's batch_size * "
                         f"group_size is {feed.batch_size} * {feed.group_size} = {feed.batch_size * feed.group_size}; "
                         "one scheduler step is one generation batch")
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(f"multi_objective_aggregation is {args.multi_objective_aggregation!r}; the scheduler "
                         "observes the weighted sum of rewards, which only 'sum_then_normalize' trains on")
    if args.remove_unused_columns:
        raise ValueError("remove_unused_columns is True, which drops the task id column; set it to False")
    clock = GenerationClock.from_args(args)
    save_steps = args.save_steps
    if (args.save_strategy == "steps" and float(save_steps).is_integer() and save_steps >= 1
            and int(save_steps) % clock.save_multiple):
        raise ValueError(f"save_steps is {save_steps}; a checkpoint must fall between generations, so it must be "
                         f"a multiple of {clock.save_multiple} (steps_per_generation * num_iterations = "
                         f"{clock.micro_batches_per_generation}, gradient_accumulation_steps = "
                         f"{clock.gradient_accumulation_steps})")
    return clock


def _task_rows(dataset: Any, column: str, feed: SchedulerFeed) -> dict[str, int]:
    """Each task id's row; every scheduler task must have one (extra rows are never scheduled)."""
    if not isinstance(dataset, Dataset):
        raise ValueError(f"train_dataset must be a datasets.Dataset (rows are fetched by index), got "
                         f"{type(dataset).__name__}")
    if column not in dataset.column_names:
        raise ValueError(f"train_dataset has no task id column {column!r} (it has {dataset.column_names})")
    rows: dict[str, int] = {}
    for k, tid in enumerate(dataset[column]):
        if not isinstance(tid, str):
            raise ValueError(f"train_dataset row {k}, column {column!r}: task ids are strings, got {tid!r}")
        if tid in rows:
            raise ValueError(f"train_dataset row {k}, column {column!r}: task id {tid!r} repeats row {rows[tid]}")
        rows[tid] = k
    absent = [tid for tid in feed.scheduler.graph.task_ids if tid not in rows]
    if absent:
        raise ValueError(f"{len(absent)} of the scheduler's tasks have no row in train_dataset, e.g. {absent[:3]}")
    return rows
