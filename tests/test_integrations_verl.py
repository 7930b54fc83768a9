"""The verl adapter against verl 0.7.1's own code: its sampler base class, ``create_rl_dataset`` /
``create_rl_sampler`` (main_ppo), ``RLHFDataset`` over a parquet file with a tiny offline
tokenizer (its overlong-prompt filter on), ``RayPPOTrainer._create_dataloader`` (the torchdata
``StatefulDataLoader``) and ``_get_gen_batch``, ``extract_reward``, ``DataProto``, a config
composed by Hydra from verl's ``ppo_trainer.yaml`` with the overrides a user types.

``main_ppo`` and ``ray_trainer`` are imported as they are (the ``verl`` extra installs ``peft``,
which their FSDP engine imports). ``fit()`` is not run (it needs GPU worker groups and a vLLM/SGLang rollout): each step does what fit() does
between the data loader and ``sampler.update(batch=batch)`` -- DataProto.from_single_dict, a uid
per prompt, _get_gen_batch, repeat(n, interleave=True), a rollout output shaped like the agent
loop's (rm_scores at the last valid response token), union, the row shuffle of balance_batch,
extract_reward, token_level_scores, and token_level_rewards with a per-token KL penalty as
use_kl_in_reward gives -- and checkpoints write ``train_dataloader.state_dict()`` to ``global_step_N/data.pt`` before
the update, where ``_save_checkpoint`` sits in fit().
"""

from __future__ import annotations

import copy
import os
import types
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.trainers

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing may be downloaded
pytest.importorskip("verl", reason="verl is not installed (pip install 'envsched_jax[verl]', then verl --no-deps)")
adapter = pytest.importorskip("envsched_jax.integrations.verl",
                              reason="the verl extra's dependencies (torchdata, tensordict, omegaconf) are missing")

import datasets  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.dataset.sampler import AbstractCurriculumSampler  # noqa: E402
from verl.trainer.ppo.reward import extract_reward  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from envsched_jax.graph.build import build_graph  # noqa: E402
from envsched_jax.integrations import SchedulerFeed  # noqa: E402
from envsched_jax.pool.prompts import prompt_pool  # noqa: E402
from envsched_jax.sched import make_scheduler, registered_schedulers  # noqa: E402
from envsched_jax.sched.base import CheckpointError, SchedulerInputError  # noqa: E402

SchedulerSampler = adapter.SchedulerSampler
B, K, TASKS = 4, 3, 24          # prompts per step, rollout.n, rows kept by the length filter
STEPS_PER_EPOCH = TASKS // B
PROMPT_LEN, RESPONSE_LEN = 6, 5


# -- verl's own code -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verl_code():
    from verl.trainer import main_ppo
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return types.SimpleNamespace(main_ppo=main_ppo, create_dataloader=RayPPOTrainer._create_dataloader,
                                 get_gen_batch=RayPPOTrainer._get_gen_batch)


# -- a dataset, a tokenizer, a config ----------------------------------------------------------

@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl_data")
    rows = [{"data_source": ("arith_add", "arith_mul")[i % 2], "ability": "math",
             "prompt": [{"role": "system", "content": "Answer with digits only."},
                        {"role": "user", "content": f"Compute {i} {'+*'[i % 2]} {i % 5 + 2}."}],
             "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"split": "train", "index": i}} for i in range(TASKS + 1)]
    rows[7]["prompt"][1]["content"] = "word " * 200        # the length filter drops this row
    rows = rows[:7] + rows[8:] + [dict(rows[7], extra_info={"split": "train", "index": 7})]
    pd.DataFrame(rows).to_parquet(folder / "train.parquet")
    pd.DataFrame(rows[:B]).to_parquet(folder / "val.parquet")
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    model = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1}, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]",
                                   chat_template=template)


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


def _verl_config(folder: Path, run: Path, *overrides: str):
    """verl's ppo_trainer config, composed by Hydra with the command-line overrides of the README."""
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[
            f"data.train_files={folder / 'train.parquet'}", f"data.val_files={folder / 'val.parquet'}",
            f"data.train_batch_size={B}", "data.dataloader_num_workers=0", "data.max_prompt_length=32",
            "data.filter_overlong_prompts=True", "data.filter_overlong_prompts_workers=null",
            f"+data.cache_dir={run / 'verl_cache'}", f"actor_rollout_ref.rollout.n={K}",
            "trainer.total_epochs=2", f"trainer.default_local_dir={run / 'checkpoints'}",
            "data.sampler.class_path=pkg://envsched_jax.integrations.verl",
            "data.sampler.class_name=SchedulerSampler",
            "+data.sampler.envsched.group_size=${actor_rollout_ref.rollout.n}",
            "+data.sampler.envsched.checkpoint_dir=${trainer.default_local_dir}",
            *overrides])


def _trainer(verl_code, config, tokenizer):
    """What main_ppo's TaskRunner.run does before RayPPOTrainer.fit, for the data: the datasets,
    the sampler from data.sampler, and the trainer's _create_dataloader."""
    create_rl_dataset, create_rl_sampler = verl_code.main_ppo.create_rl_dataset, verl_code.main_ppo.create_rl_sampler
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, None, is_train=False)
    sampler = create_rl_sampler(config.data, train)
    trainer = types.SimpleNamespace(config=config, tokenizer=tokenizer, processor=None)
    verl_code.create_dataloader(trainer, train, val, collate_fn, sampler)
    return trainer


# -- one step of fit() without the model ----------------------------------------------------------

def reward_of(task_id: str, completion: int, trainer_step: int) -> float:
    """A deterministic reward in {0, 1/4, ..., 1} per completion, varying within a group; exact in
    float32, the dtype of verl's rm_scores, so a directly fed twin scheduler sees the same values."""
    return (zlib.crc32(f"{task_id}/{completion}/{trainer_step}".encode()) % 5) / 4


def _rollout(gen_batch: DataProto, trainer_step: int) -> DataProto:
    """A rollout output shaped like verl's agent loop: left-padded prompts, right-padded responses
    of varying length, response_mask, and rm_scores holding each completion's score at its last
    valid response token."""
    rows = len(gen_batch)
    ids = [str(info["index"]) for info in gen_batch.non_tensor_batch["extra_info"]]
    lengths = torch.tensor([1 + (r * 7) % RESPONSE_LEN for r in range(rows)])
    response_mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).long()
    attention_mask = torch.cat([torch.ones(rows, PROMPT_LEN, dtype=torch.long), response_mask], dim=1)
    rm_scores = torch.zeros(rows, RESPONSE_LEN)
    scores = [reward_of(tid, r % K, trainer_step) for r, tid in enumerate(ids)]   # interleaved: K rows a task
    rm_scores[torch.arange(rows), lengths - 1] = torch.tensor(scores)
    responses = torch.randint(2, 50, (rows, RESPONSE_LEN)) * response_mask
    prompts = torch.randint(2, 50, (rows, PROMPT_LEN))
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": response_mask,
                 "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
                 "position_ids": torch.cumsum(attention_mask, dim=1) - 1, "rm_scores": rm_scores},
        non_tensors={"__num_turns__": np.full(rows, 2, dtype=np.int32),
                     "completion_index": np.arange(rows) % K},     # test bookkeeping: which of the K
        meta_info={"metrics": [], "reward_extra_keys": []})


def _fit_batch(verl_code, trainer, batch_dict, trainer_step: int) -> DataProto:
    """ray_trainer.fit's path from the data loader's dict to the batch passed to sampler.update."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = verl_code.get_gen_batch(trainer, batch)
    gen_batch.meta_info["global_steps"] = trainer_step
    gen_batch_output = _rollout(gen_batch.repeat(repeat_times=K, interleave=True), trainer_step)
    batch = batch.repeat(repeat_times=K, interleave=True).union(gen_batch_output)
    # trainer.balance_batch (on by default) reorders the rows across data-parallel ranks
    batch.reorder(torch.randperm(len(batch), generator=torch.Generator().manual_seed(trainer_step)))
    reward_tensor, reward_extra_infos = extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    # algorithm.use_kl_in_reward=True: apply_kl_penalty subtracts beta * KL per response token; the
    # scheduler must keep reading the task's score, not this
    batch.batch["token_level_rewards"] = reward_tensor - 0.05 * batch.batch["response_mask"]
    return batch


def _batch_ids(batch_dict) -> list[str]:
    return [str(info["index"]) for info in batch_dict["extra_info"]]


def _row_task_ids(batch: DataProto) -> list[str]:
    return [str(info["index"]) for info in batch.non_tensor_batch["extra_info"]]


# -- tests ------------------------------------------------------------------------------------------

def test_verl_drives_the_scheduler_one_step_per_trainer_step(verl_code, data_files, tokenizer, tmp_path):
    config = _verl_config(data_files, tmp_path)
    trainer = _trainer(verl_code, config, tokenizer)
    loader, sampler = trainer.train_dataloader, trainer.train_dataloader.sampler
    assert isinstance(sampler, SchedulerSampler) and isinstance(sampler, AbstractCurriculumSampler)
    assert len(loader) == STEPS_PER_EPOCH == trainer.total_training_steps // 2
    assert "7" not in sampler.positions and len(sampler.positions) == TASKS        # filtered out by verl
    rows, _ = adapter.dataset_prompt_records(trainer.train_dataset, task_id_key="index")
    twin = SchedulerFeed(make_scheduler("envsched", build_graph(prompt_pool(rows, name=adapter.POOL_NAME)),
                                        batch_size=B, group_size=K, seed=0), step_offset=1)
    global_steps = 1                       # fit(): "we start from step 1"
    for _epoch in range(2):
        for batch_dict in loader:
            ids = _batch_ids(batch_dict)
            assert ids == twin.next_batch(global_steps) == sampler.scheduler.metrics()[-1].task_ids
            assert len(sampler.scheduler.metrics()) == global_steps               # one select per step
            assert [trainer.train_dataset[sampler.positions[t]]["extra_info"]["index"] for t in ids] == \
                [int(t) for t in ids]
            batch = _fit_batch(verl_code, trainer, batch_dict, global_steps)
            if isinstance(loader.sampler, AbstractCurriculumSampler):      # fit()'s own guard
                loader.sampler.update(batch=batch)
            arrival = list(zip(_row_task_ids(batch), batch.non_tensor_batch["completion_index"].tolist()))
            twin.record([t for t, _ in arrival], [reward_of(t, k, global_steps) for t, k in arrival])
            assert sampler.feed.next_trainer_step == global_steps + 1 and sampler.feed.pending is None
            global_steps += 1
            if global_steps == STEPS_PER_EPOCH + 3:
                break
    assert global_steps == STEPS_PER_EPOCH + 3                    # an epoch ended and the next one began
    ours, theirs = sampler.scheduler.metrics(), twin.scheduler.metrics()
    assert [m.mean_reward for m in ours] == [m.mean_reward for m in theirs]
    assert [m.realised_variance for m in ours] == [m.realised_variance for m in theirs]


def test_data_pt_resumes_the_scheduler_and_the_loader(verl_code, data_files, tokenizer, tmp_path):
    graph_dir = tmp_path / "graph"
    config = _verl_config(data_files, tmp_path, f"+data.sampler.envsched.graph_dir={graph_dir}")
    trainer = _trainer(verl_code, config, tokenizer)
    loader, sampler = trainer.train_dataloader, trainer.train_dataloader.sampler
    checkpoint = Path(config.trainer.default_local_dir) / "global_step_2"
    batches, states = {}, {}
    for global_steps, batch_dict in enumerate(loader, start=1):
        batches[global_steps] = _batch_ids(batch_dict)
        batch = _fit_batch(verl_code, trainer, batch_dict, global_steps)
        if global_steps == 2:              # _save_checkpoint: data.pt, before sampler.update
            checkpoint.mkdir(parents=True)
            torch.save(loader.state_dict(), checkpoint / "data.pt")
        sampler.update(batch=batch)
        states[global_steps] = sampler.scheduler.state_dict()
        if global_steps == 4:
            break
    assert (checkpoint / adapter.REWARDS_FILE).is_file() and (graph_dir / "manifest.json").is_file()

    resumed = _trainer(verl_code, config, tokenizer)       # a new process: graph loaded from graph_dir
    resumed.train_dataloader.load_state_dict(torch.load(checkpoint / "data.pt", weights_only=False))
    resumed_steps = []
    for global_steps, batch_dict in enumerate(resumed.train_dataloader, start=3):   # _load_checkpoint: 2, +1
        resumed_steps.append(global_steps)
        if global_steps in batches:
            assert _batch_ids(batch_dict) == batches[global_steps]
        resumed.train_dataloader.sampler.update(batch=_fit_batch(verl_code, resumed, batch_dict, global_steps))
        if global_steps in states:
            _assert_same_state(resumed.train_dataloader.sampler.scheduler.state_dict(), states[global_steps])
    assert resumed_steps == list(range(3, STEPS_PER_EPOCH + 1))   # the rest of verl's current epoch

    (checkpoint / adapter.REWARDS_FILE).unlink()                  # stopped between data.pt and update
    other = _verl_config(data_files, tmp_path, "+data.sampler.envsched.scheduler=random")
    for run_config, message in [
        (config, "envsched_rewards.json is missing: verl wrote data.pt of global step 2 before the sampler's update"),
        (other, "saved with scheduler = 'envsched', this run has 'random'"),
    ]:
        loader = _trainer(verl_code, run_config, tokenizer).train_dataloader
        loader.load_state_dict(torch.load(checkpoint / "data.pt", weights_only=False))
        with pytest.raises(CheckpointError, match=message):
            iter(loader)                   # torchdata hands the sampler its state with the first iterator
    regraphed = _verl_config(data_files, tmp_path, f"+data.sampler.envsched.graph_dir={graph_dir}",
                             "+data.sampler.envsched.graph.num_candidates=16")
    with pytest.raises(ValueError, match="data.sampler.envsched.graph_dir .* remove the directory to rebuild"):
        _trainer(verl_code, regraphed, tokenizer)


def _assert_same_state(a, b):
    assert a["header"] == b["header"]
    assert a["arrays"].keys() == b["arrays"].keys()
    for name in a["arrays"]:
        np.testing.assert_array_equal(a["arrays"][name], b["arrays"][name], err_msg=name)


def test_mismatches_are_named_and_record_nothing(verl_code, data_files, tokenizer, tmp_path):
    trainer = _trainer(verl_code, _verl_config(data_files, tmp_path, "+data.sampler.envsched.scheduler=random"),
                       tokenizer)
    loader, sampler = trainer.train_dataloader, trainer.train_dataloader.sampler
    with pytest.raises(SchedulerInputError, match="no step awaits rewards"):
        sampler.update(batch=DataProto.from_dict(tensors={"x": torch.zeros(1, 1)}))
    iterator = iter(loader)
    batch_dict = next(iterator)
    good = _fit_batch(verl_code, trainer, batch_dict, 1)
    ids = _batch_ids(batch_dict)
    row_task = _row_task_ids(good)                  # the rows are shuffled (balance_batch)

    unknown = copy.deepcopy(good)
    unknown.non_tensor_batch["extra_info"][0] = dict(unknown.non_tensor_batch["extra_info"][0], index=999)
    outsider = next(t for t in sampler.positions if t not in ids)
    foreign = copy.deepcopy(good)
    foreign.non_tensor_batch["extra_info"][0] = dict(foreign.non_tensor_batch["extra_info"][0], index=int(outsider))
    out_of_range = copy.deepcopy(good)
    out_of_range.batch["token_level_scores"][4, 0] += 1.5
    regrouped = copy.deepcopy(good)
    regrouped.non_tensor_batch["uid"][1] = "another-group"
    no_scores = copy.deepcopy(good)
    no_scores.pop(batch_keys=["token_level_scores"])
    cases = [
        (unknown, r"unknown task id\(s\) \['999'\] \(not in the training dataset's extra_info\)"),
        (foreign, rf"rows of task\(s\) \['{outsider}'\], which are not in this step's batch"),
        (good[: len(good) - 1], rf"task '{row_task[-1]}' has 2 rewarded rows, expected K = 3 "
                                r"\(actor_rollout_ref.rollout.n must equal data.sampler.envsched.group_size"),
        (good[[0] + list(range(len(good)))], rf"task '{row_task[0]}' has 4 rewarded rows"),
        (out_of_range, rf"reward of task '{row_task[4]}' is .*, outside \[0, 1\]"),
        (regrouped, rf"the 3 rows of task '{row_task[1]}' span uid groups"),
        (no_scores, r"the batch has no 'token_level_scores'"),
    ]
    for batch, message in cases:
        with pytest.raises(SchedulerInputError, match=message):
            sampler.update(batch=batch)
        assert sampler.feed.pending == ids and all(v == [] for v in sampler.feed._rewards.values())
    with pytest.raises(SchedulerInputError, match="trainer step 2: the batch of trainer step 1 still lacks rewards"):
        next(iterator)                     # a loop that forgot update() gets no batch
    sampler.update(batch=good)
    assert sampler.feed.next_trainer_step == 2 and sampler.scheduler.metrics()[0].mean_reward == \
        [np.mean([reward_of(t, k, 1) for k in range(K)]) for t in ids]


def test_configuration_errors_name_the_field(verl_code, data_files, tokenizer, tmp_path):
    base = _verl_config(data_files, tmp_path)
    train = verl_code.main_ppo.create_rl_dataset(base.data.train_files, base.data, tokenizer, None)
    for overrides, error, message in [
        (["data.dataloader_num_workers=8"], ValueError, "data.dataloader_num_workers must be 0"),
        (["+data.sampler.envsched.scheduler=nope"], ValueError, "data.sampler.envsched.scheduler 'nope' is not registered"),
        (["+data.sampler.envsched.task_id=3"], ValueError, r"data.sampler.envsched: unknown field\(s\) \['task_id'\]"),
        (["+data.sampler.envsched.reward_range=[1,0]"], ValueError, "reward_range must be \\[lo, hi\\]"),
        (["+data.sampler.envsched.task_id_key=split"], ValueError,
         "dataset row 1: task id 'train' \\(extra_info\\['split'\\]\\) repeats row 0"),
        (["+data.sampler.envsched.task_id_key=answer"], ValueError,
         "dataset row 0: extra_info\\['answer'\\] is None"),
    ]:
        config = _verl_config(data_files, tmp_path, *overrides)
        with pytest.raises(error, match=message):
            verl_code.main_ppo.create_rl_sampler(config.data, train)
    with open_dict(base):
        del base.data.sampler["envsched"]
    with pytest.raises(ValueError, match=r"data.sampler.envsched is missing: set at least \+data.sampler.envsched"):
        verl_code.main_ppo.create_rl_sampler(base.data, train)


@pytest.mark.parametrize("name", registered_schedulers())
def test_every_registered_scheduler_is_a_verl_sampler(verl_code, data_files, tokenizer, tmp_path, name):
    config = _verl_config(data_files, tmp_path, f"+data.sampler.envsched.scheduler={name}")
    trainer = _trainer(verl_code, config, tokenizer)
    loader, sampler = trainer.train_dataloader, trainer.train_dataloader.sampler
    for global_steps, batch_dict in enumerate(loader, start=1):
        assert _batch_ids(batch_dict) == sampler.scheduler.metrics()[-1].task_ids
        sampler.update(batch=_fit_batch(verl_code, trainer, batch_dict, global_steps))
        if global_steps == 2:
            break
    state = loader.state_dict()            # between steps: the scheduler's own snapshot, nothing pending
    following = _batch_ids(next(iter(loader)))
    fresh = _trainer(verl_code, config, tokenizer).train_dataloader
    fresh.load_state_dict(state)
    assert _batch_ids(next(iter(fresh))) == following
    assert fresh.sampler.feed.next_trainer_step == 3
