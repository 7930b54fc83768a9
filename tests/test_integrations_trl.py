"""TRL adapter: real ``GRPOTrainer`` steps on CPU with a tiny random Llama and a tokenizer built
here, every registered scheduler choosing the prompts, the scheduler observing TRL's weighted
rewards, checkpoint/resume of both, TRL's counters under other accumulation settings, and the
configurations and inputs the adapter refuses."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing here may come from a hub

pytest.importorskip("trl", reason="the TRL adapter needs the trl extra (pip install 'envsched_jax[trl]')")

import torch  # noqa: E402
from datasets import Dataset, IterableDataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from envsched_jax.graph.build import GraphConfig, build_graph  # noqa: E402
from envsched_jax.integrations import SchedulerFeed  # noqa: E402
from envsched_jax.integrations.trl import (  # noqa: E402
    FEED_DIR,
    GenerationClock,
    ScheduledGRPOTrainer,
    prompt_records,
)
from envsched_jax.pool.prompts import prompt_pool  # noqa: E402
from envsched_jax.sched import make_scheduler, registered_schedulers  # noqa: E402
from envsched_jax.sched.base import CheckpointError, SchedulerInputError  # noqa: E402

pytestmark = pytest.mark.trainers

B, K = 3, 2
ROWS = [{"task_id": f"t{i:02d}", "prompt": f"compute {i} {'+-*'[i % 3]} {i % 7} and answer with digits only",
         "family": ("add", "sub", "mul")[i % 3]} for i in range(18)]
PROMPT_OF = {r["task_id"]: r["prompt"] for r in ROWS}
WEIGHTS = [1.0, 0.5]
REWARD_RANGE = (-0.5, 1.5)      # length in [0, 1] plus 0.5 * parity in [-1, 1]


@pytest.fixture(scope="module")
def dataset():
    return Dataset.from_list(ROWS)


@pytest.fixture(scope="module")
def graph(dataset):
    return build_graph(prompt_pool(prompt_records(dataset, environment_column="family")), GraphConfig(dense="always"))


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for word in " ".join(r["prompt"] for r in ROWS).split() + [str(i) for i in range(20)]:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def _model(tokenizer):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None))


class RewardLog:
    """Two reward functions that record what TRL passed them and what they returned."""

    def __init__(self):
        self.calls: list[dict] = []

    def length(self, prompts, completions, task_id, **kwargs):
        values = [len(c.split()) / 4 for c in completions]          # max_completion_length is 4 tokens
        self.calls.append({"prompts": list(prompts), "task_ids": list(task_id), "length": values})
        return values

    def parity(self, prompts, completions, task_id, **kwargs):
        # None for some tasks: TRL's nansum counts it 0, and so must the scheduler.
        values = [None if int(t[1:]) % 5 == 0 else (1.0 if int(t[1:]) % 2 else -1.0) for t in task_id]
        self.calls[-1]["parity"] = values
        return values

    def expected_means(self, call) -> dict[str, float]:
        """Per task, the mean of TRL's float32 weighted sum mapped by REWARD_RANGE."""
        w = np.float32(WEIGHTS)
        total = {}
        for tid, a, b in zip(call["task_ids"], call["length"], call["parity"]):
            value = np.float32(a) * w[0] + (np.float32(0.0) if b is None else np.float32(b) * w[1])
            total.setdefault(tid, []).append((float(value) - REWARD_RANGE[0]) / (REWARD_RANGE[1] - REWARD_RANGE[0]))
        return {tid: float(np.mean(v)) for tid, v in total.items()}


def _config(out, **overrides):
    kw = dict(output_dir=str(out), use_cpu=True, per_device_train_batch_size=B * K, num_generations=K,
              max_completion_length=4, max_steps=3, save_steps=2, report_to="none", logging_steps=1,
              disable_tqdm=True, seed=0, reward_weights=WEIGHTS, dataloader_num_workers=0)
    kw.update(overrides)
    return GRPOConfig(**kw)


def _trainer(graph, dataset, tokenizer, out, *, name="envsched", log=None, feed=None, reward_funcs=None,
             eval_dataset=None, **overrides):
    log = log or RewardLog()
    feed = feed or SchedulerFeed(make_scheduler(name, graph, batch_size=B, group_size=K, seed=0),
                                 reward_range=REWARD_RANGE)
    trainer = ScheduledGRPOTrainer(
        model=_model(tokenizer), reward_funcs=reward_funcs or [log.length, log.parity], args=_config(out, **overrides),
        train_dataset=dataset, eval_dataset=eval_dataset, processing_class=tokenizer, feed=feed)
    return trainer, feed, log


@pytest.mark.parametrize("name", registered_schedulers())
def test_trl_generates_for_the_schedulers_batches_and_a_restart_continues_them(graph, dataset, tokenizer, tmp_path,
                                                                               name):
    trainer, feed, log = _trainer(graph, dataset, tokenizer, tmp_path / "run", name=name)
    trainer.train()
    assert trainer.state.global_step == 3 and feed.next_trainer_step == 3 and len(log.calls) == 3
    metrics = feed.scheduler.metrics()
    for step, (call, metric) in enumerate(zip(log.calls, metrics)):
        assert metric.step == step
        assert call["task_ids"] == [t for t in metric.task_ids for _ in range(K)]          # each id K times in a row
        assert call["prompts"] == [PROMPT_OF[t] for t in call["task_ids"]]                # what TRL generated for
        expected = log.expected_means(call)
        np.testing.assert_allclose(metric.mean_reward, [expected[t] for t in metric.task_ids], rtol=1e-12)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint-2" / FEED_DIR).iterdir()) == ["step_00000002"]

    resumed, resumed_feed, resumed_log = _trainer(graph, dataset, tokenizer, tmp_path / "resumed", name=name)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.state.global_step == 3 and resumed_feed.next_trainer_step == 3
    assert [c["task_ids"] for c in resumed_log.calls] == [log.calls[2]["task_ids"]]       # the same next batch


@pytest.mark.parametrize("overrides, generations, saved", [
    (dict(gradient_accumulation_steps=2, steps_per_generation=1, max_steps=2, save_steps=1), 4, {1: 2, 2: 4}),
    (dict(num_iterations=2, max_steps=4, save_steps=2), 2, {2: 1, 4: 2}),
])
def test_generations_follow_trls_counters_under_accumulation_and_reuse(graph, dataset, tokenizer, tmp_path, overrides,
                                                                       generations, saved):
    trainer, feed, log = _trainer(graph, dataset, tokenizer, tmp_path, **overrides)
    trainer.train()
    assert feed.next_trainer_step == generations == len(log.calls)
    for call, metric in zip(log.calls, feed.scheduler.metrics()):
        assert call["task_ids"] == [t for t in metric.task_ids for _ in range(K)]
    for global_step, next_generation in saved.items():
        folders = list((tmp_path / f"checkpoint-{global_step}" / FEED_DIR).iterdir())
        assert [f.name for f in folders] == [f"step_{next_generation:08d}"]


def test_the_clock_maps_trls_counters_by_hand():
    clock = GenerationClock(micro_batches_per_generation=2, gradient_accumulation_steps=3)
    assert (clock.save_multiple, clock.generations_per_cycle) == (2, 3)
    assert clock.generation_at_optimizer_step(4) == 6 and clock.generation_at_micro_batch(8) == 4
    with pytest.raises(CheckpointError, match="global_step 3 falls inside a generation"):
        clock.generation_at_optimizer_step(3)
    with pytest.raises(SchedulerInputError, match="micro-batch 3, which is not a multiple"):
        clock.generation_at_micro_batch(3)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be a positive int, got 0"):
        GenerationClock(1, 0)


def test_configurations_the_adapter_cannot_follow_are_refused(graph, dataset, tokenizer, tmp_path):
    def feed(**kw):
        return SchedulerFeed(make_scheduler("random", graph, batch_size=kw.pop("b", B), group_size=kw.pop("k", K),
                                            seed=0), **kw)

    cases = [
        (dict(feed=feed(k=3, b=2)), "num_generations is 2 but the scheduler's group_size is 3"),
        (dict(feed=feed(b=2)), r"generation_batch_size is 6 but the scheduler's batch_size \* group_size is 2 \* 2"),
        (dict(feed=feed(step_offset=1)), "feed.step_offset is 1"),
        (dict(multi_objective_aggregation="normalize_then_sum"), "multi_objective_aggregation is 'normalize_then_sum'"),
        (dict(remove_unused_columns=True), "remove_unused_columns is True, which drops the task id column"),
        (dict(num_iterations=2, save_steps=3), "save_steps is 3; .* a multiple of 2"),
        (dict(dataset=dataset.remove_columns("task_id")), "train_dataset has no task id column 'task_id'"),
        (dict(dataset=Dataset.from_list(ROWS + ROWS[:1])), "row 18, column 'task_id': task id 't00' repeats row 0"),
        (dict(dataset=Dataset.from_list(ROWS[1:])),
         r"1 of the scheduler's tasks have no row in train_dataset, e.g. \['t00'\]"),
        (dict(dataset=IterableDataset.from_generator(lambda: iter(ROWS))), "must be a datasets.Dataset"),
    ]
    for overrides, message in cases:
        data = overrides.pop("dataset", dataset)
        with pytest.raises(ValueError, match=message):
            _trainer(graph, data, tokenizer, tmp_path, **overrides)


def test_bad_rewards_and_mismatched_checkpoints_are_named(graph, dataset, tokenizer, tmp_path):
    def doubled(prompts, completions, task_id, **kwargs):
        return [2.0] * len(prompts)
    plain = SchedulerFeed(make_scheduler("random", graph, batch_size=B, group_size=K, seed=0))   # no reward_range
    trainer, *_ = _trainer(graph, dataset, tokenizer, tmp_path / "a", feed=plain, reward_funcs=[doubled],
                           reward_weights=[1.0])
    with pytest.raises(SchedulerInputError, match="is 2.0, outside \\[0, 1\\] \\(declare the trainer's reward_range"):
        trainer.train()
    assert plain.pending is not None and all(not r for r in plain._rewards.values())     # nothing recorded

    def unscorable(prompts, completions, task_id, **kwargs):
        return [None if t == task_id[0] else 0.5 for t in task_id]
    trainer, feed, _ = _trainer(graph, dataset, tokenizer, tmp_path / "b", reward_funcs=[unscorable],
                                reward_weights=[1.0])
    with pytest.raises(SchedulerInputError,
                       match="every reward function \\(unscorable\\) returned None for completion 0"):
        trainer.train()

    # Evaluation generates and scores too, on TRL's own eval sampler: the scheduler sees none of it.
    trainer, feed, log = _trainer(graph, dataset, tokenizer, tmp_path / "c", max_steps=2, eval_strategy="steps",
                                  eval_steps=1, eval_dataset=dataset.select(range(4)), per_device_eval_batch_size=8)
    trainer.train()
    assert feed.next_trainer_step == 2 and len(log.calls) == 4       # 2 training and 2 evaluation generations
    again, *_ = _trainer(graph, dataset, tokenizer, tmp_path / "c", feed=feed)
    with pytest.raises(SchedulerInputError, match="train\\(\\) from step 0, but the feed continues at generation 2"):
        again.train()
    shutil.rmtree(tmp_path / "c" / "checkpoint-2" / FEED_DIR)
    fresh, *_ = _trainer(graph, dataset, tokenizer, tmp_path / "d")
    with pytest.raises(CheckpointError, match="no scheduler state in envsched/"):
        fresh.train(resume_from_checkpoint=str(tmp_path / "c" / "checkpoint-2"))


def test_prompt_records_reads_standard_and_conversational_prompts():
    rows = Dataset.from_list([
        {"task_id": "a", "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"}]},
        {"task_id": "b", "prompt": [{"role": "user", "content": "2 + 2?"}]},
    ])
    assert prompt_records(rows) == [{"task_id": "a", "prompt": "1 + 1?", "context": "Be brief."},
                                    {"task_id": "b", "prompt": "2 + 2?"}]
    assert prompt_records(Dataset.from_list(ROWS[:1]), check_column="family") == [
        {"task_id": "t00", "prompt": ROWS[0]["prompt"], "check": "add"}]
    with pytest.raises(ValueError, match=r"no column\(s\) \['env'\]"):
        prompt_records(rows, environment_column="env")
