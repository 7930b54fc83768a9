"""A scheduler as tunix's task sampler: real GRPOLearner steps on CPU with a tiny Llama and a
byte-level BPE tokenizer trained on the prompts; tunix's own checkpoints and restart; the
mismatches named through tunix's own reward manager."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

grpo = pytest.importorskip("tunix.rl.grpo.grpo_learner",
                           reason="google-tunix (the 'tunix' extra) is not installed")

import jax  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from tunix.rl import reward_manager as tunix_reward_manager  # noqa: E402
from tunix.rl import rl_cluster as rlc  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from envsched_jax.graph.build import GraphConfig, build_graph  # noqa: E402
from envsched_jax.integrations import SchedulerFeed  # noqa: E402
from envsched_jax.integrations.tunix import (PLACEHOLDER_PREFIX, TunixTaskSource,  # noqa: E402
                                             prompt_records)
from envsched_jax.learner import models  # noqa: E402
from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer  # noqa: E402
from envsched_jax.pool.prompts import prompt_pool  # noqa: E402
from envsched_jax.sched import make_scheduler, registered_schedulers  # noqa: E402
from envsched_jax.sched.base import CheckpointError, SchedulerInputError  # noqa: E402

# tunix 0.1.7 calls flax 0.12 and jax 0.10 APIs that are deprecated (the warnings are raised inside
# flax and jax, so a filter on tunix's modules would not catch them): hundreds per test.
pytestmark = [pytest.mark.trainers, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

B, K = 4, 2
ROWS = [{"task_id": f"q{i:02d}", "prompts": f"What is {i} {'+-'[i % 2]} {i % 5}? Answer:",
         "answer": str(i + i % 5 if i % 2 == 0 else i - i % 5), "kind": ("add", "sub")[i % 2]}
        for i in range(24)]
BY_ID = {row["task_id"]: row for row in ROWS}


def length_reward(prompts, completions, **kwargs):
    """In [0, 1]: depends on the sampled text, so a group's rewards differ."""
    return [(len(c) % 5) / 4 for c in completions]


def answer_reward(prompts, completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


@pytest.fixture(scope="module", autouse=True)
def _without_x64():
    """tunix 0.1.7's Llama decoding cache mixes int32 and int64 indices under jax_enable_x64
    (``dynamic_update_slice`` refuses them), and another test module turns x64 on for the whole
    process; these tests run tunix as a user would, with JAX's default 32-bit types."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", previous)


@pytest.fixture(scope="module")
def tokenizer():
    return train_chat_tokenizer([r["prompts"] for r in ROWS] * 4, vocab_size=300)


@pytest.fixture(scope="module")
def graph():
    return build_graph(prompt_pool(prompt_records(ROWS, environment_column="kind")), GraphConfig(dense="always"))


def _feed(graph, name="envsched"):
    # two reward functions in [0, 1]: tunix trains on their sum, in [0, 2]
    return SchedulerFeed(make_scheduler(name, graph, batch_size=B, group_size=K, seed=0), reward_range=(0.0, 2.0))


def _learner(tokenizer, source, *, root=None, max_steps=2, reward_fns=None, num_generations=K, spy=None,
             **batching):
    config = models.tiny_llama(len(tokenizer))
    config.update(bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
    training = rlc.RLTrainingConfig(
        actor_optimizer=optax.adam(1e-3), max_steps=max_steps, eval_every_n_steps=100,
        checkpoint_root_directory=None if root is None else str(root),
        checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=1, max_to_keep=1,
                                                           enable_async_checkpointing=False),
        **batching)
    cluster = rlc.RLCluster(
        actor=models.make_model(config, seed=0), reference=None, tokenizer=tokenizer,
        cluster_config=rlc.ClusterConfig(
            role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", training_config=training,
            rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=8, max_prompt_length=32,
                                                      kv_cache_size=64, temperature=1.0, seed=7)))
    fns = reward_fns if reward_fns is not None else source.reward_fns([length_reward, answer_reward])
    return grpo.GRPOLearner(cluster, grpo.GRPOConfig(num_generations=num_generations, beta=0.0),
                            reward_fns=fns, metric_fns=[spy] if spy else None)


class Spy:
    """A tunix metric function: sees, per reward computation, the prompts tunix sampled from and
    the rewards it trains on (the reward manager's sum), independently of the adapter's hook."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, rewards, advantages, task_id, **kwargs):
        self.calls.append((list(prompts), [str(t) for t in task_id], np.asarray(rewards, np.float64)))
        return {}


def _expected_prompts(ids):
    return [BY_ID[t]["prompts"] for t in ids for _ in range(K)]


def _replay(name, graph, calls):
    """A twin scheduler driven by what tunix did: the spy's calls, in order, cut into steps of
    B * K completions; checks each step's prompts are the twin's selection."""
    twin = make_scheduler(name, graph, batch_size=B, group_size=K, seed=0)
    prompts = [p for call in calls for p in call[0]]
    rewards = np.concatenate([call[2] for call in calls])
    assert len(prompts) % (B * K) == 0
    for step in range(len(prompts) // (B * K)):
        ids, rows = twin.select(step), slice(step * B * K, (step + 1) * B * K)
        assert prompts[rows] == _expected_prompts(ids), f"step {step}"
        twin.observe(step, ids, rewards[rows].reshape(B, K) / 2.0)        # reward_range (0, 2) -> [0, 1]
    return twin


def _folders(path):
    return sorted(p.name for p in path.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def trained(tokenizer, graph, tmp_path_factory):
    """Two real GRPO steps with EnvSched selecting; tunix checkpoints every step."""
    root = tmp_path_factory.mktemp("tunix_run")
    feed, spy = _feed(graph), Spy()
    source = TunixTaskSource(feed, ROWS)
    learner = _learner(tokenizer, source, root=root, spy=spy)
    assert source.attach(learner) == 0
    learner.train(source)
    return root, feed, spy, learner


def test_tunix_trains_on_the_schedulers_batches_and_feeds_back_its_rewards(trained, graph):
    root, feed, spy, learner = trained
    assert learner.rl_cluster.actor_trainer.train_steps == 2 and len(spy.calls) == 2
    twin = _replay("envsched", graph, spy.calls)          # the prompts tunix trained on, step by step
    assert feed.next_trainer_step == 2 and feed.pending is None
    for ours, theirs in zip(feed.scheduler.metrics(), twin.metrics(), strict=True):
        assert ours.task_ids == theirs.task_ids
        np.testing.assert_allclose(ours.mean_reward, theirs.mean_reward)   # the rewards tunix computed
        assert ours.realised_variance == theirs.realised_variance
    # one feed checkpoint beside each checkpoint tunix kept (max_to_keep=1)
    assert _folders(root / "actor") == ["2"] and _folders(root / "envsched") == ["step_00000002"]


def test_a_restart_resumes_tunix_and_the_scheduler_at_the_same_batch(trained, tokenizer, graph, tmp_path):
    root, _, first, _ = trained
    expected = _replay("envsched", graph, first.calls).select(2)    # what an unbroken run selects next
    shutil.copytree(root, tmp_path / "run")
    resumed, spy = _feed(graph), Spy()
    source = TunixTaskSource(resumed, ROWS)
    learner = _learner(tokenizer, source, root=tmp_path / "run", max_steps=3, spy=spy)
    assert source.attach(learner) == 2 and resumed.next_trainer_step == 2
    learner.train(source)                    # tunix fast-forwards two placeholders, then trains step 2
    assert len(spy.calls) == 1 and spy.calls[0][0] == _expected_prompts(expected)
    assert resumed.scheduler.metrics()[-1].task_ids == expected and resumed.next_trainer_step == 3
    np.testing.assert_allclose(resumed.scheduler.metrics()[-1].mean_reward,
                               spy.calls[0][2].reshape(B, K).mean(axis=1) / 2.0)
    assert _folders(tmp_path / "run" / "envsched") == ["step_00000003"]


def test_mini_batches_send_rewards_in_pieces_and_checkpoint_at_step_boundaries(tokenizer, graph, tmp_path):
    """mini_batch_size 2 of B = 4, micro-batches of 1: two updates per global step, rewards per
    micro-batch; tunix's checkpoint after the first update (inside the step) has no feed
    checkpoint, the one after the second has, and a restart from it maps back to global step 1."""
    feed, spy = _feed(graph), Spy()
    source = TunixTaskSource(feed, ROWS)
    batching = {"mini_batch_size": 2, "train_micro_batch_size": 1}
    learner = _learner(tokenizer, source, root=tmp_path, spy=spy, **batching)
    source.attach(learner)
    learner.train(source)
    assert [len(call[0]) for call in spy.calls] == [K] * B and feed.next_trainer_step == 1
    twin = _replay("envsched", graph, spy.calls)
    np.testing.assert_allclose(feed.scheduler.metrics()[0].mean_reward, twin.metrics()[0].mean_reward)
    assert _folders(tmp_path / "actor") == ["2"] and _folders(tmp_path / "envsched") == ["step_00000001"]
    resumed = TunixTaskSource(_feed(graph), ROWS)
    assert resumed.attach(_learner(tokenizer, resumed, root=tmp_path, max_steps=4, **batching)) == 1
    batches = iter(resumed)
    assert next(batches)["task_id"][0].startswith(PLACEHOLDER_PREFIX)     # tunix's fast-forward
    assert list(next(batches)["task_id"]) == twin.select(1)


def test_a_tunix_checkpoint_without_the_schedulers_is_refused(trained, tokenizer, graph, tmp_path):
    root, _, _, _ = trained
    shutil.copytree(root / "actor", tmp_path / "actor")
    source = TunixTaskSource(_feed(graph), ROWS)
    learner = _learner(tokenizer, source, root=tmp_path, max_steps=3)
    with pytest.raises(CheckpointError,
                       match=r"tunix resumed at global step 2 .*envsched/step_00000002 does not exist"):
        source.attach(learner)


def test_a_reward_for_a_fast_forward_placeholder_is_refused(trained, tokenizer, graph, tmp_path):
    root, _, _, _ = trained
    shutil.copytree(root, tmp_path / "run")
    source = TunixTaskSource(_feed(graph), ROWS)
    learner = _learner(tokenizer, source, root=tmp_path / "run", max_steps=3)
    source.attach(learner)
    placeholder = next(iter(source))         # what tunix's fast-forward discards
    assert all(t.startswith(PLACEHOLDER_PREFIX) for t in placeholder["task_id"])
    flat = np.repeat(placeholder["task_id"], K)
    with pytest.raises(SchedulerInputError, match="a step its checkpoint had already trained"):
        learner.reward_manager(prompts=["p"] * len(flat), completions=["c"] * len(flat), task_id=flat,
                               mode="train", trajectory_ids=[str(i) for i in range(len(flat))])


@pytest.mark.parametrize("name", registered_schedulers())
def test_every_registered_scheduler_samples_through_tunixs_data_and_reward_paths(tokenizer, graph, name):
    """The adapter never branches on the scheduler: two steps of tunix's data path (its rows
    repeated K times, as the learner does) and its real reward manager, with each scheduler."""
    source = TunixTaskSource(_feed(graph, name), ROWS)
    learner = _learner(tokenizer, source)
    source.attach(learner)
    twin = make_scheduler(name, graph, batch_size=B, group_size=K, seed=0)
    batches = iter(source)
    for step in range(2):
        batch = {k: np.repeat(v, K, axis=0) for k, v in next(batches).items()}
        ids = twin.select(step)
        assert list(batch["task_id"]) == [t for t in ids for _ in range(K)]
        assert list(batch["prompts"]) == _expected_prompts(ids)
        completions = [f"{step} {'7' * i}" for i in range(B * K)]
        info = learner.reward_manager(prompts=list(batch.pop("prompts")), completions=completions, mode="train",
                                      trajectory_ids=[str(i) for i in range(B * K)], **batch)
        twin.observe(step, ids, info["rewards"].reshape(B, K) / 2.0)
    assert source.feed.next_trainer_step == 2 and source.feed.pending is None
    assert [m.mean_reward for m in source.feed.scheduler.metrics()] == [m.mean_reward for m in twin.metrics()]


# -- mismatches --------------------------------------------------------------------------------


def _rewards_call(learner, task_ids, *, mode="train"):
    """tunix's own reward path (its sequence-level manager), one completion per entry."""
    n = len(task_ids)
    return learner.reward_manager(prompts=["p"] * n, completions=["abc"] * n,
                                  task_id=np.asarray(task_ids, dtype=object),
                                  answer=np.asarray(["1"] * n, dtype=object), mode=mode,
                                  trajectory_ids=[str(i) for i in range(n)])


@pytest.fixture
def attached(tokenizer, graph):
    source = TunixTaskSource(_feed(graph), ROWS)
    learner = _learner(tokenizer, source)
    source.attach(learner)
    return source, learner


def test_mismatched_rewards_are_named_and_record_nothing(attached):
    source, learner = attached
    batches = iter(source)
    ids = list(next(batches)["task_id"])
    flat = [t for t in ids for _ in range(K)]
    outsider = next(r["task_id"] for r in ROWS if r["task_id"] not in ids)
    with pytest.raises(SchedulerInputError, match=f"task {outsider!r}, which is not in the pending batch"):
        _rewards_call(learner, flat[:-1] + [outsider])
    with pytest.raises(SchedulerInputError, match="more than K = 2 rewards"):
        _rewards_call(learner, flat + flat[:1])
    assert source.feed.pending == ids and all(len(v) == 0 for v in source.feed._rewards.values())
    _rewards_call(learner, flat, mode="eval")                       # evaluation: passed through
    assert all(len(v) == 0 for v in source.feed._rewards.values())
    _rewards_call(learner, flat[:3])                                 # a piece: step still pending
    with pytest.raises(SchedulerInputError, match=r"trainer step 1: the batch of trainer step 0 still lacks"):
        next(batches)                                                # tunix asking ahead of the rewards


def test_bad_rewards_are_refused_where_they_enter(tokenizer, graph):
    returned = []

    def bad_reward(prompts, completions, **kwargs):
        return returned[-1]

    source = TunixTaskSource(_feed(graph), ROWS)
    learner = _learner(tokenizer, source, reward_fns=source.reward_fns([length_reward, bad_reward]))
    source.attach(learner)
    task = next(iter(source))["task_id"][0]
    for value, message in [
        ([float("nan"), 0.5], f"reward function 'bad_reward': the reward of task {task!r} is nan"),
        ([0.5], "reward function 'bad_reward' returned 1 rewards for 2 completions"),
        ([True, 0.5], "is True, not a real number"),
        (None, "returned None, not one reward per completion"),
        ([0.5, 2.0], r"outside the declared reward_range \[0.0, 2.0\]"),   # the sum: 0.x + 2.0
    ]:
        returned.append(value)
        with pytest.raises(SchedulerInputError, match=message):
            _rewards_call(learner, [task] * 2)
        assert all(len(v) == 0 for v in source.feed._rewards.values())
    returned.append([0.5, 1.0])
    _rewards_call(learner, [task] * 2)
    assert len(source.feed._rewards[task]) == 2


def test_attach_checks_the_learner_matches_the_source(tokenizer, graph):
    source = TunixTaskSource(_feed(graph), ROWS)
    with pytest.raises(SchedulerInputError, match="after attach"):
        iter(source)
    plain = _learner(tokenizer, source, reward_fns=[length_reward])
    with pytest.raises(ValueError, match=r"calls the reward functions \['length_reward'\], not the list"):
        source.attach(plain)
    other = TunixTaskSource(_feed(graph), ROWS)
    with pytest.raises(ValueError, match="num_generations is 3, the feed's group size K is 2"):
        other.attach(_learner(tokenizer, other, num_generations=3))
    with pytest.raises(TypeError, match="expected a tunix GRPOLearner"):
        source.attach(object())
    with pytest.raises(SchedulerInputError, match="without tunix's mode keyword"):
        other._reward_fns[0](prompts=["p"], completions=["c"], task_id=["q00"])
    assert isinstance(plain.reward_manager, tunix_reward_manager.SequenceRewardManager)


def test_rows_must_match_the_pool(graph):
    feed = _feed(graph)
    for rows, message in [
        (ROWS + [{"task_id": "zz", "prompts": "x", "answer": "1", "kind": "add"}],
         "task id 'zz' is not in the scheduler's pool"),
        (ROWS[1:], r"1 task\(s\) of the scheduler's pool have no row, e.g. \['q00'\]"),
        (ROWS + ROWS[:1], "task id 'q00' repeats"),
        ([{**ROWS[0], "mode": "x"}] + ROWS[1:], r"column\(s\) \['mode'\] collide"),
        ([{**ROWS[0], "prompts": ""}] + ROWS[1:], "column 'prompts': must be a non-empty string"),
        ([{k: v for k, v in ROWS[0].items() if k != "answer"}] + ROWS[1:], "columns"),
    ]:
        with pytest.raises(ValueError, match=message):
            TunixTaskSource(feed, rows)
    with pytest.raises(ValueError, match="step_offset must be 0"):
        TunixTaskSource(SchedulerFeed(feed.scheduler, step_offset=1), ROWS)
    source = TunixTaskSource(feed, ROWS)
    assert source.columns == ("prompts", "task_id", "answer", "kind")
    with pytest.raises(ValueError, match="reward_fns"):
        source.reward_fns([])
