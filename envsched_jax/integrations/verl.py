"""verl adapter: a scheduler as the curriculum sampler of verl's PPO / GRPO trainer.

verl (0.7.1) builds its training data loader (``RayPPOTrainer._create_dataloader``) as a torchdata
``StatefulDataLoader`` over the prompt dataset (``RLHFDataset``), with ``num_workers =
data.dataloader_num_workers``, ``drop_last=True``, a batch of ``data.gen_batch_size`` (default
``data.train_batch_size``) prompts, and the sampler that ``create_rl_sampler`` instantiates from
``data.sampler.class_path`` / ``class_name`` as ``cls(data_source=dataset, data_config=config.data)``.
After each step's actor update, ``fit()`` calls ``sampler.update(batch=batch)`` when the sampler is
an ``AbstractCurriculumSampler``. :class:`SchedulerSampler` is that sampler:

- **Configuration.** verl hands the sampler only the dataset and ``config.data``, and builds it
  inside its Ray driver process, so a registry filled by the launching script would not be seen
  there. Everything comes from ``data.sampler.envsched`` (:class:`VerlSamplerConfig`); the pool is
  the training dataset itself: a task per row, its id ``extra_info[task_id_key]`` (default
  ``"index"``, which verl's example data sets already carry), its prompt the row's chat messages
  (``data.prompt_key``; system messages become the context), its environment the row's
  ``data.reward_fn_key`` column (``data_source``: rows sharing a reward function). The graph is
  built from that pool (or loaded from ``graph_dir``, built once), and the scheduler is
  ``make_scheduler(scheduler, graph, batch_size=B, group_size=K, seed=..., **options)``.
- **Steps.** verl counts ``global_steps`` from 1: trainer step t is scheduler step t - 1
  (:class:`~envsched_jax.integrations.core.SchedulerFeed` with ``step_offset=1``). The sampler
  yields, per step, the dataset positions of the scheduler's B tasks in its order; the scheduler
  selects a step when the data loader asks for that step's first index. verl requires
  ``dataloader_num_workers=0`` for a curriculum sampler (no prefetch), so that happens after the
  previous step's ``update``; asking for a step whose predecessor never got its update is a
  :class:`~envsched_jax.sched.base.SchedulerInputError`, never a repeated or skipped batch. An
  "epoch" (verl's ``len(train_dataloader)``) is ``steps_per_epoch`` steps, ``len(dataset) // B``
  by default, the number a shuffled sampler gives; the scheduler's steps run on across epochs.
- **Rewards.** ``update(batch)`` reads, per completion row, the task id from
  ``non_tensor_batch["extra_info"]`` and the sequence reward ``batch["token_level_scores"].sum(-1)``.
  verl's reward loop writes each completion's score at its last valid response token and zeros
  elsewhere (``rm_scores``, which ``fit()`` stores as ``token_level_scores``); verl's own
  ``critic/score`` metric and GRPO's outcome advantage reduce it with the same sum.
  ``token_level_rewards`` is not used: with ``algorithm.use_kl_in_reward`` it has the KL penalty
  subtracted per token, which is the policy's cost, not the task's outcome. Top-level dataset
  columns are not read either: ``_get_gen_batch`` moves every non-tensor column except
  ``data_source``, ``reward_model``, ``extra_info`` and ``uid`` out of the batch. Before anything is
  recorded, the batch must hold exactly K rows of every task of the step, the K rows of a task one
  ``uid`` group (verl's GRPO group), and no other task; the feed then checks every value (finite,
  in [0, 1] or the declared ``reward_range``) and the scheduler observes the step.
- **Checkpoints.** The sampler's ``state_dict`` / ``load_state_dict`` ride in verl's ``data.pt``
  (the ``StatefulDataLoader`` state). verl writes ``data.pt`` of step N *before* it calls
  ``update`` for step N (``_save_checkpoint`` runs right after the actor update), so the state
  then holds the scheduler as it was before step N's selection, and step N's ids; ``update``
  then writes step N's rewards to ``<checkpoint_dir>/global_step_N/envsched_rewards.json`` beside
  verl's files. Loading replays step N (the restored scheduler selects the same ids, which is
  checked) with those rewards, so a resumed run continues at trainer step N + 1 with exactly the
  scheduler state, and the batch, of the uninterrupted run. A run that stopped between the two
  writes (a crash in validation, for instance) leaves no rewards file: loading it is a
  :class:`~envsched_jax.sched.base.CheckpointError`, resume from the global step before. The
  state also records the settings (scheduler, B, K, steps per epoch, task id key, reward range)
  and the scheduler's snapshot header (pool, graph and config hashes): a mismatch is refused.

verl is imported here only; the core package never imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.experimental.dataset.sampler import AbstractCurriculumSampler

from envsched_jax.graph.artefact import load_graph, save_graph
from envsched_jax.graph.build import GraphConfig, PoolGraph, build_graph
from envsched_jax.integrations.core import SchedulerFeed
from envsched_jax.pool.model import Pool
from envsched_jax.pool.prompts import prompt_pool
from envsched_jax.sched import make_scheduler, registered_schedulers
from envsched_jax.sched.base import CheckpointError, SchedulerInputError

CONFIG_PATH = "data.sampler.envsched"
REWARDS_FILE = "envsched_rewards.json"
STATE_FORMAT = "envsched_jax.integrations.verl/1"
FIRST_TRAINER_STEP = 1   # verl's fit() increments global_steps to 1 before its first batch
POOL_NAME = "verl_train_dataset"

__all__ = ["CONFIG_PATH", "REWARDS_FILE", "SchedulerSampler", "VerlSamplerConfig", "dataset_prompt_records",
           "rewards_file", "sequence_scores", "task_ids_of"]


@dataclasses.dataclass(frozen=True)
class VerlSamplerConfig:
    """``data.sampler.envsched``: what verl's ``config.data`` cannot say by itself."""

    group_size: int
    """K, completions per prompt: must be ``actor_rollout_ref.rollout.n`` (write the interpolation
    ``${actor_rollout_ref.rollout.n}``)."""
    checkpoint_dir: str
    """verl's ``trainer.default_local_dir`` (write ``${trainer.default_local_dir}``): step N's
    rewards go to ``global_step_N/`` there (module docstring, Checkpoints)."""
    scheduler: str = "envsched"
    """A registered scheduler (:func:`envsched_jax.sched.registered_schedulers`)."""
    task_id_key: str = "index"
    """The key of a row's ``extra_info`` holding its task id (a string or an integer)."""
    seed: int | None = None
    """The scheduler's seed; None: ``data.seed``, or 0 when that is null too."""
    steps_per_epoch: int | None = None
    """Steps in verl's epoch; None: ``len(dataset) // B``."""
    reward_range: tuple[float, float] | None = None
    """(lo, hi) of the reward function's scores, mapped to [0, 1]; None: they lie in [0, 1]."""
    graph_dir: str | None = None
    """A graph directory: loaded when it exists (it must match the pool and ``graph``), else
    built and saved there; None: built in memory at every launch."""
    graph: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """:class:`~envsched_jax.graph.build.GraphConfig` fields."""
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Further keyword arguments of the scheduler's constructor (its config's fields)."""

    def __post_init__(self):
        where = CONFIG_PATH
        if not _is_int(self.group_size) or self.group_size < 1:
            raise ValueError(f"{where}.group_size must be a positive int (actor_rollout_ref.rollout.n), "
                             f"got {self.group_size!r}")
        if not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir:
            raise ValueError(f"{where}.checkpoint_dir must be a non-empty path (write "
                             f"'${{trainer.default_local_dir}}'), got {self.checkpoint_dir!r}")
        if self.scheduler not in registered_schedulers():
            raise ValueError(f"{where}.scheduler {self.scheduler!r} is not registered; registered: "
                             f"{', '.join(registered_schedulers())}")
        if not isinstance(self.task_id_key, str) or not self.task_id_key:
            raise ValueError(f"{where}.task_id_key must be a non-empty string, got {self.task_id_key!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"{where}.seed must be an int or null, got {self.seed!r}")
        if self.steps_per_epoch is not None and (not _is_int(self.steps_per_epoch) or self.steps_per_epoch < 1):
            raise ValueError(f"{where}.steps_per_epoch must be a positive int or null, got {self.steps_per_epoch!r}")
        if self.reward_range is not None:
            lo_hi = tuple(self.reward_range)
            if len(lo_hi) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in lo_hi) \
                    or not lo_hi[0] < lo_hi[1]:
                raise ValueError(f"{where}.reward_range must be [lo, hi] with finite lo < hi, got {self.reward_range!r}")
            object.__setattr__(self, "reward_range", (float(lo_hi[0]), float(lo_hi[1])))
        if self.graph_dir is not None and (not isinstance(self.graph_dir, str) or not self.graph_dir):
            raise ValueError(f"{where}.graph_dir must be a non-empty path or null, got {self.graph_dir!r}")
        for name in ("graph", "options"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"{where}.{name} must be a mapping, got {getattr(self, name)!r}")
        reserved = sorted(set(self.options) & {"batch_size", "group_size", "seed"})
        if reserved:
            raise ValueError(f"{where}.options sets {reserved}: B comes from data.train_batch_size (or "
                             f"gen_batch_size), K from {where}.group_size, the seed from {where}.seed")

    @classmethod
    def from_data_config(cls, data_config: DictConfig) -> VerlSamplerConfig:
        """Read ``sampler.envsched`` of verl's ``config.data`` (interpolations resolved against
        the whole trainer config); a missing or unknown field is an error naming it."""
        node = OmegaConf.select(data_config, "sampler.envsched")
        if node is None:
            raise ValueError(f"{CONFIG_PATH} is missing: set at least +{CONFIG_PATH}.group_size="
                             f"'${{actor_rollout_ref.rollout.n}}' and +{CONFIG_PATH}.checkpoint_dir="
                             f"'${{trainer.default_local_dir}}'")
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        if not isinstance(values, dict):
            raise ValueError(f"{CONFIG_PATH} must be a mapping, got {values!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"{CONFIG_PATH}: unknown field(s) {unknown}; the fields are {sorted(fields)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                         and f.name not in values)
        if missing:
            raise ValueError(f"{CONFIG_PATH}: missing field(s) {missing}")
        if isinstance(values.get("graph"), dict):   # YAML lists -> the tuples GraphConfig compares by
            values["graph"] = {k: tuple(v) if isinstance(v, list) else v for k, v in values["graph"].items()}
        return cls(**values)


class SchedulerSampler(AbstractCurriculumSampler):
    """A registered scheduler as verl's training sampler (module docstring).

    Args:
      data_source: verl's training dataset (``RLHFDataset`` or any dataset whose items carry the
        prompt, ``extra_info`` with the task id, and the ``reward_fn_key`` column).
      data_config: verl's ``config.data`` with ``sampler.envsched`` (:class:`VerlSamplerConfig`).
    """

    def __init__(self, data_source: Sized, data_config: DictConfig):
        if not isinstance(data_config, DictConfig):
            raise TypeError(f"data_config must be verl's config.data (an omegaconf DictConfig), "
                            f"got {type(data_config).__name__}")
        self.config = VerlSamplerConfig.from_data_config(data_config)
        workers = data_config.get("dataloader_num_workers", 8)
        if workers != 0:
            raise ValueError(f"data.dataloader_num_workers must be 0 with a scheduler as sampler (worker "
                             f"processes prefetch batches before the previous step's rewards), got {workers}")
        self.batch_size = int(data_config.get("gen_batch_size", data_config.train_batch_size))
        records, self.positions = dataset_prompt_records(
            data_source, task_id_key=self.config.task_id_key, prompt_key=data_config.get("prompt_key", "prompt"),
            environment_key=data_config.get("reward_fn_key", "data_source"))
        if self.batch_size > len(records):
            raise ValueError(f"data.train_batch_size (or gen_batch_size) {self.batch_size} exceeds the dataset's "
                             f"{len(records)} rows")
        graph = _pool_graph(prompt_pool(records, name=POOL_NAME), self.config)
        seed = self.config.seed if self.config.seed is not None else data_config.get("seed") or 0
        self.scheduler = make_scheduler(self.config.scheduler, graph, batch_size=self.batch_size,
                                        group_size=self.config.group_size, seed=seed, **self.config.options)
        self.feed = self._new_feed()
        self.steps_per_epoch = self.config.steps_per_epoch or len(records) // self.batch_size
        self._snapshot: dict[str, Any] | None = None   # the scheduler before the pending step's select
        self._saved_while_pending: int | None = None     # trainer step whose data.pt predates its update

    # -- the data loader's side ----------------------------------------------------------------

    def __len__(self) -> int:
        """Indices per epoch: verl's ``len(train_dataloader)`` is this over B."""
        return self.steps_per_epoch * self.batch_size

    def __iter__(self) -> Iterator[int]:
        return self._epoch_indices()

    def _epoch_indices(self) -> Iterator[int]:
        # A generator: nothing is selected until the data loader asks for a step's first index,
        # and an iterator made but never used (torchdata makes one before loading a state) is free.
        trainer_step = self.feed.next_trainer_step
        epoch_end = _epoch_start(trainer_step, self.steps_per_epoch) + self.steps_per_epoch
        while trainer_step < epoch_end:
            if self.feed.pending is None:
                self._snapshot = self.scheduler.state_dict()
            for task_id in self.feed.next_batch(trainer_step):
                yield self.positions[task_id]
            trainer_step += 1

    def update(self, batch: DataProto) -> None:
        """Record the rewards of the pending step from verl's training batch (module docstring)."""
        pending = self.feed.pending
        if pending is None:
            raise SchedulerInputError("update(): no step awaits rewards (the data loader has not yielded a "
                                      "batch since the last update)")
        trainer_step = self.feed.next_trainer_step
        task_ids = task_ids_of(batch, self.config.task_id_key)
        scores = sequence_scores(batch)
        if len(scores) != len(task_ids):
            raise SchedulerInputError(f"trainer step {trainer_step}: {len(task_ids)} extra_info rows but "
                                      f"{len(scores)} token_level_scores rows")
        _check_groups(task_ids, _uids(batch), pending, self.config.group_size, self.positions, trainer_step)
        self.feed.record(task_ids, scores, trainer_step=trainer_step)
        if self._saved_while_pending == trainer_step:
            _write_rewards(self.rewards_file(trainer_step), trainer_step, pending, task_ids, scores)
        self._snapshot, self._saved_while_pending = None, None

    # -- checkpoints (torchdata's Stateful protocol: the state goes into verl's data.pt) -------------

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state; taken while a step awaits its update (as verl does), it holds the
        scheduler before that step's selection and the step's ids (module docstring)."""
        pending = self.feed.pending
        if pending is None:
            scheduler_state, pending_record = self.scheduler.state_dict(), None
        else:
            trainer_step = self.feed.next_trainer_step
            scheduler_state = self._snapshot
            pending_record = {"trainer_step": trainer_step, "task_ids": pending}
            self._saved_while_pending = trainer_step
        return {"format": STATE_FORMAT, "settings": self._settings(), "scheduler": scheduler_state,
                "pending": pending_record}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (of a previous run: verl's data.pt)."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"sampler state: format {found!r}, expected {STATE_FORMAT!r} (data.pt was "
                                  "written with another sampler)")
        saved = state.get("settings")
        for key, value in self._settings().items():
            if not isinstance(saved, Mapping) or saved.get(key) != value:
                got = saved.get(key) if isinstance(saved, Mapping) else saved
                raise CheckpointError(f"sampler state: saved with {key} = {got!r}, this run has {value!r}")
        pending = state.get("pending")
        completion = None if pending is None else self._read_rewards(pending)
        self.scheduler.load_state_dict(state["scheduler"], source="verl data.pt (sampler state)")
        self.feed = self._new_feed()
        self._snapshot, self._saved_while_pending = None, None
        if completion is None:
            return
        trainer_step, task_ids, rewards = completion
        if self.feed.next_trainer_step != trainer_step:
            raise CheckpointError(f"sampler state: the scheduler continues at trainer step "
                                  f"{self.feed.next_trainer_step}, its pending step is {trainer_step}")
        replayed = self.feed.next_batch(trainer_step)
        if replayed != task_ids:
            raise CheckpointError(f"sampler state: replaying trainer step {trainer_step} selected {replayed[:5]}..., "
                                  f"the saved run {task_ids[:5]}...; the scheduler did not restore exactly")
        self.feed.record([t for t in task_ids for _ in rewards[t]], [r for t in task_ids for r in rewards[t]],
                         trainer_step=trainer_step)

    def rewards_file(self, trainer_step: int) -> Path:
        """Where step ``trainer_step``'s rewards go when its data.pt predates its update."""
        return rewards_file(self.config.checkpoint_dir, trainer_step)

    # -- helpers -------------------------------------------------------------------------------

    def _new_feed(self) -> SchedulerFeed:
        return SchedulerFeed(self.scheduler, step_offset=FIRST_TRAINER_STEP, reward_range=self.config.reward_range)

    def _settings(self) -> dict[str, Any]:
        rr = self.config.reward_range
        return {"scheduler": self.config.scheduler, "batch_size": self.batch_size,
                "group_size": self.config.group_size, "steps_per_epoch": self.steps_per_epoch,
                "task_id_key": self.config.task_id_key, "reward_range": None if rr is None else list(rr)}

    def _read_rewards(self, pending: Any) -> tuple[int, list[str], dict[str, list[float]]]:
        if not isinstance(pending, Mapping) or not _is_int(pending.get("trainer_step")) \
                or not isinstance(pending.get("task_ids"), list):
            raise CheckpointError(f"sampler state: malformed pending step {pending!r}")
        trainer_step, task_ids = pending["trainer_step"], pending["task_ids"]
        path = self.rewards_file(trainer_step)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is missing: verl wrote data.pt of global step {trainer_step} before the sampler's "
                f"update for that step, and the run stopped in between; resume from an earlier global_step "
                f"folder (or check {CONFIG_PATH}.checkpoint_dir = {self.config.checkpoint_dir!r})") from None
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path}: cannot read the rewards record ({err})") from None
        if not isinstance(record, Mapping) or record.get("trainer_step") != trainer_step \
                or record.get("task_ids") != task_ids:
            found = record.get("trainer_step") if isinstance(record, Mapping) else None
            raise CheckpointError(f"{path}: not the rewards of global step {trainer_step}'s batch (it names "
                                  f"trainer step {found!r})")
        rewards = record.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != len(task_ids) or not all(
                isinstance(row, list) and len(row) == self.config.group_size for row in rewards):
            raise CheckpointError(f"{path}: 'rewards' must hold K = {self.config.group_size} values for each of "
                                  f"the {len(task_ids)} tasks")
        return trainer_step, task_ids, dict(zip(task_ids, rewards))


def rewards_file(checkpoint_dir: str | os.PathLike, trainer_step: int) -> Path:
    """``<checkpoint_dir>/global_step_<trainer_step>/envsched_rewards.json`` (verl's folder)."""
    return Path(checkpoint_dir) / f"global_step_{trainer_step}" / REWARDS_FILE


def dataset_prompt_records(dataset: Sized, *, task_id_key: str, prompt_key: str = "prompt",
                           environment_key: str = "data_source") -> tuple[list[dict[str, str]], dict[str, int]]:
    """Prompt records (:func:`~envsched_jax.pool.prompts.prompt_pool`) of a verl dataset's rows,
    read through its ``__getitem__`` as the data loader reads them, and each task id's row
    position. A row without a usable task id or prompt, or a repeated task id, is a ValueError
    naming the row."""
    records, positions = [], {}
    for position in range(len(dataset)):
        row = dataset[position]
        where = f"dataset row {position}"
        if not isinstance(row, Mapping):
            raise ValueError(f"{where} is a {type(row).__name__}; verl's collate_fn takes a mapping per row")
        task_id = _task_id(row.get("extra_info"), task_id_key, where, ValueError)
        if task_id in positions:
            raise ValueError(f"{where}: task id {task_id!r} (extra_info[{task_id_key!r}]) repeats row "
                             f"{positions[task_id]}")
        prompt, context = _prompt_text(row.get(prompt_key), f"{where}, column {prompt_key!r}")
        record = {"task_id": task_id, "prompt": prompt}
        if context:
            record["context"] = context
        environment = row.get(environment_key)
        if isinstance(environment, str) and environment:
            record["environment"] = environment
        records.append(record)
        positions[task_id] = position
    if not records:
        raise ValueError("the training dataset has no rows")
    return records, positions


def task_ids_of(batch: DataProto, task_id_key: str) -> list[str]:
    """Per row of ``batch``, the task id in ``non_tensor_batch["extra_info"][row][task_id_key]``."""
    infos = batch.non_tensor_batch.get("extra_info")
    if infos is None:
        raise SchedulerInputError(f"update(): the batch has no non_tensor_batch['extra_info'] (its keys: "
                                  f"{sorted(batch.non_tensor_batch)}); the task id travels in extra_info")
    return [_task_id(info, task_id_key, f"update(): batch row {row}", SchedulerInputError)
            for row, info in enumerate(infos.tolist())]


def sequence_scores(batch: DataProto) -> np.ndarray:
    """Per row, the completion's score: ``token_level_scores`` summed over the response (module
    docstring, Rewards)."""
    if batch.batch is None or "token_level_scores" not in batch.batch.keys():
        keys = [] if batch.batch is None else sorted(batch.batch.keys())
        raise SchedulerInputError(f"update(): the batch has no 'token_level_scores' (its tensors: {keys}); "
                                  "verl's fit() stores the reward there before calling update")
    scores = batch.batch["token_level_scores"]
    if scores.ndim != 2:
        raise SchedulerInputError(f"update(): token_level_scores must be [rows, response_length], got shape "
                                  f"{tuple(scores.shape)}")
    return scores.detach().to(torch.float64).sum(-1).cpu().numpy()


def _pool_graph(pool: Pool, config: VerlSamplerConfig) -> PoolGraph:
    try:
        graph_config = GraphConfig(**config.graph)
    except TypeError as err:
        raise ValueError(f"{CONFIG_PATH}.graph: {err}") from None
    if config.graph_dir is None:
        return build_graph(pool, graph_config)
    directory = Path(config.graph_dir)
    if directory.exists():
        graph = load_graph(directory, pool)   # refuses a graph of another pool
        if graph.config != graph_config:
            raise ValueError(f"{CONFIG_PATH}.graph_dir {directory}: built with {graph.config}, "
                             f"{CONFIG_PATH}.graph asks for {graph_config}; remove the directory to rebuild")
        return graph
    graph = build_graph(pool, graph_config)
    save_graph(graph, directory)
    return graph


def _check_groups(task_ids: Sequence[str], uids: Sequence[Any], pending: Sequence[str], group_size: int,
                  known: Mapping[str, int], trainer_step: int) -> None:
    """The batch holds exactly K rows of each pending task, one uid group per task; else an error
    naming the first offending task (nothing is recorded)."""
    where = f"update() at trainer step {trainer_step}"
    unknown = sorted({t for t in task_ids if t not in known})
    if unknown:
        raise SchedulerInputError(f"{where}: unknown task id(s) {unknown[:5]} (not in the training dataset's "
                                  "extra_info)")
    outside = sorted(set(task_ids) - set(pending))
    if outside:
        raise SchedulerInputError(f"{where}: rows of task(s) {outside[:5]}, which are not in this step's batch")
    counts = {t: 0 for t in pending}
    groups: dict[str, set] = {t: set() for t in pending}
    for task_id, uid in zip(task_ids, uids):
        counts[task_id] += 1
        groups[task_id].add(uid)
    for task_id in pending:
        if counts[task_id] != group_size:
            raise SchedulerInputError(
                f"{where}: task {task_id!r} has {counts[task_id]} rewarded rows, expected K = {group_size} "
                f"(actor_rollout_ref.rollout.n must equal {CONFIG_PATH}.group_size, and every completion "
                "of the step must reach update)")
        if len(groups[task_id]) != 1:
            raise SchedulerInputError(f"{where}: the {group_size} rows of task {task_id!r} span uid groups "
                                      f"{sorted(map(str, groups[task_id]))[:3]}; each task must be one group")
    owner: dict[Any, str] = {}
    for task_id in pending:
        (uid,) = groups[task_id]
        if uid in owner:
            raise SchedulerInputError(f"{where}: uid {uid!r} groups tasks {owner[uid]!r} and {task_id!r}")
        owner[uid] = task_id


def _uids(batch: DataProto) -> list[Any]:
    uids = batch.non_tensor_batch.get("uid")
    if uids is None:
        raise SchedulerInputError("update(): the batch has no non_tensor_batch['uid'] (verl's fit() gives each "
                                  "prompt one, shared by its K completions)")
    return uids.tolist()


def _write_rewards(path: Path, trainer_step: int, pending: Sequence[str], task_ids: Sequence[str],
                   scores: np.ndarray) -> None:
    per_task: dict[str, list[float]] = {t: [] for t in pending}
    for task_id, score in zip(task_ids, scores.tolist()):
        per_task[task_id].append(score)
    record = {"trainer_step": trainer_step, "task_ids": list(pending), "rewards": [per_task[t] for t in pending]}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(partial, path)   # a crash mid-write never leaves a truncated record


def _task_id(info: Any, key: str, where: str, error: type[Exception]) -> str:
    if not isinstance(info, Mapping):
        raise error(f"{where}: extra_info is {type(info).__name__}, not a mapping with the task id {key!r}")
    value = info.get(key)
    if isinstance(value, str) and value:
        return value
    if _is_int(value):
        return str(int(value))
    raise error(f"{where}: extra_info[{key!r}] is {value!r}; a task id is a non-empty string or an int")


def _prompt_text(value: Any, where: str) -> tuple[str, str]:
    """(prompt, context) of a row's prompt: a string, or chat messages whose system turns are the
    context and whose other turns (text parts of multimodal content included) are the prompt."""
    if isinstance(value, str):
        text, context = value, ""
    else:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (list, tuple)) or not all(isinstance(m, Mapping) for m in value):
            raise ValueError(f"{where}: expected a string or a list of chat messages, got {type(value).__name__}")
        turns: dict[bool, list[str]] = {True: [], False: []}
        for message in value:
            turns[message.get("role") == "system"].append(_message_text(message.get("content")))
        text, context = "\n".join(filter(None, turns[False])), "\n".join(filter(None, turns[True]))
    if not text.strip():
        raise ValueError(f"{where}: the prompt has no text")
    return text, context


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return " ".join(part["text"] for part in content
                        if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return ""


def _epoch_start(trainer_step: int, steps_per_epoch: int) -> int:
    return FIRST_TRAINER_STEP + (trainer_step - FIRST_TRAINER_STEP) // steps_per_epoch * steps_per_epoch


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
