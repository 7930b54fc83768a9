"""End-to-end training: the pool split, the small tokenizer, metrics, and a tiny real run
(select -> rollouts with the JAX sampler in sandboxed environments -> observe -> GRPO -> sync ->
evaluate -> checkpoint) that resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer
from envsched_jax.pool.sources import load_pool
from envsched_jax.training.config import (LearnerSpec, PolicySpec, PoolSplit, RolloutSpec,
                                          SchedulerSpec, TrainConfig)
from envsched_jax.training.loop import split_pool
from envsched_jax.training.metrics import MetricsLog, plot_curves, read_metrics


def test_split_is_disjoint_per_environment_and_seeded():
    pool = load_pool("embedded")
    split = split_pool(pool, 10, 3, seed=0)
    ids = split.ids()
    assert len(ids["sft"]) == 80 and len(ids["heldout"]) == 24
    assert len(ids["train"]) == len(pool.tasks) - 104
    everything = ids["sft"] + ids["heldout"] + ids["train"]
    assert sorted(everything) == sorted(t.task_id for t in pool.tasks)
    assert all(t.reference_actions for t in split.sft.tasks)
    for env in pool.environments:
        assert sum(t.env_id == env.env_id for t in split.sft.tasks) == 10
    assert split_pool(pool, 10, 3, seed=0).ids() == ids
    assert split_pool(pool, 10, 3, seed=1).ids() != ids
    with pytest.raises(ValueError, match="no task left for GRPO"):
        split_pool(pool, 20, 10, seed=0)
    empty = split_pool(pool, 0, 0, seed=0)  # no warm-start tasks, no held-out tasks
    assert empty.sft is None and empty.heldout is None
    assert empty.ids()["sft"] == empty.ids()["heldout"] == [] and len(empty.train.tasks) == 192


def test_chat_tokenizer_round_trips_and_renders_chatml():
    texts = ["<|im_start|>user\nmove the file<|im_end|>\n", '{"name": "mv", "arguments": {}}'] * 20
    tok = train_chat_tokenizer(texts, vocab_size=300)
    assert 259 < len(tok) <= 300  # at most: a small corpus runs out of merges
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1
    odd = "d\u00e9j\u00e0 vu \u2603 \x00 tab\t"
    assert tok.decode(tok(odd, add_special_tokens=False)["input_ids"]) == odd
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    with pytest.raises(ValueError, match="vocab_size must be >= 259"):
        train_chat_tokenizer(texts, vocab_size=100)


def test_metrics_log_keeps_the_latest_record_per_step_and_plots(tmp_path):
    with MetricsLog(tmp_path / "a") as log:
        log.log("step", 1, {"mean_reward": 0.1, "environments": 3, "group_variance": 0.01})
        log.log("step", 2, {"mean_reward": 0.2, "environments": 4, "group_variance": 0.02})
        log.log("step", 2, {"mean_reward": 0.3, "environments": 4, "group_variance": 0.02})
        log.log("eval", 2, {"heldout_reward": 0.5, "end_reasons": {"answered": 3}})
    rows = read_metrics(tmp_path / "a" / "metrics.jsonl", "step")
    assert [r["mean_reward"] for r in rows] == [0.1, 0.3]
    assert any((tmp_path / "a" / "tb").iterdir())  # TensorBoard event file
    png = plot_curves({"a": tmp_path / "a" / "metrics.jsonl"}, tmp_path / "c.png")
    assert png.stat().st_size > 1000
    (tmp_path / "bad.jsonl").write_text('{"kind": "step", "step": 1}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 2: invalid JSON"):
        read_metrics(tmp_path / "bad.jsonl")


def tiny_config(out: Path, steps: int, scheduler: str = "envsched", sandbox: str = "inprocess",
                **kw) -> TrainConfig:
    return TrainConfig(
        pool=PoolSplit(spec="embedded", sft_per_env=2, heldout_per_env=1),
        policy=PolicySpec(vocab_size=320, hidden_size=32, layers=1, heads=2, intermediate_size=64),
        scheduler=SchedulerSpec(name=scheduler, batch_size=4, group_size=2),
        learner=LearnerSpec(sft_steps=3, sft_batch_size=4, max_length=1024, pad_multiple=256),
        rollout=RolloutSpec(sandbox=sandbox, workers=4, max_batch=8, max_context=2048),
        steps=steps, out=out, checkpoint_every=1, eval_every=2, **kw)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    from envsched_jax.training.loop import train

    summary = train(tiny_config(root / "full", steps=3, probe_tasks=3), progress=lambda *_: None)
    return root, summary


def test_tiny_run_writes_everything(tiny_run):
    root, summary = tiny_run
    out = root / "full"
    steps = read_metrics(out / "metrics.jsonl", "step")
    evals = read_metrics(out / "metrics.jsonl", "eval")
    assert [s["step"] for s in steps] == [1, 2, 3] and [e["step"] for e in evals] == [0, 2, 3]
    for e in evals:  # each held-out task's reward, averaging to the logged mean
        per_task = e["heldout_task_rewards"]
        heldout = json.loads((out / "run.json").read_text())["split"]["heldout"]
        assert sorted(per_task) == sorted(heldout)
        assert np.mean(list(per_task.values())) == pytest.approx(e["heldout_reward"])
    for s in steps:
        assert 0.0 <= s["mean_reward"] <= 1.0 and s["environments"] >= 1
        assert s["sampled_tokens"] > 0 and np.isfinite(s["learner_loss"])
        assert s["rollout_seconds"] > 0 and s["learner_seconds"] > 0
        assert sum(s["end_reasons"].values()) == 4 * 2
    probes = read_metrics(out / "metrics.jsonl", "probe")
    assert [p["step"] for p in probes] == [0, 2, 3]
    train_ids = set(json.loads((out / "run.json").read_text())["split"]["train"])
    for p in probes:  # the same three training tasks each time, two samples each
        assert sorted(p["probe_task_rewards"]) == sorted(probes[0]["probe_task_rewards"])
        assert set(p["probe_task_rewards"]) <= train_ids and len(p["probe_task_rewards"]) == 3
        assert np.mean(list(p["probe_task_rewards"].values())) == pytest.approx(p["probe_reward"])
        assert sum(p["probe_end_reasons"].values()) == 3 * 2
    assert summary["probe_last"] == probes[-1]["probe_reward"]
    assert len(read_metrics(out / "metrics.jsonl", "sft")) == 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000001", "step_00000002", "step_00000003"]
    assert (out / "curves.png").stat().st_size > 1000 and (out / "tokenizer" / "tokenizer.json").exists()
    assert summary["steps"] == 3 and json.loads((out / "summary.json").read_text())["steps"] == 3


def test_resumed_run_continues_exactly(tiny_run):
    """A run killed after its step-2 checkpoint, started again, redoes step 3 exactly as the
    uninterrupted run did (scheduler, learner, sampler seeds and all)."""
    import shutil

    root, _ = tiny_run
    from envsched_jax.training.loop import train

    shutil.copytree(root / "full", root / "killed")
    shutil.rmtree(root / "killed" / "checkpoints" / "step_00000003")
    lines = (root / "killed" / "metrics.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["step"] < 3 or json.loads(ln)["kind"] == "sft"]
    (root / "killed" / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    train(tiny_config(root / "killed", steps=3, probe_tasks=3), progress=lambda *_: None)
    full = read_metrics(root / "full" / "metrics.jsonl", "step")
    resumed = read_metrics(root / "killed" / "metrics.jsonl", "step")
    keys = ("mean_reward", "group_variance", "sampled_tokens", "learner_loss", "learner_grad_norm")
    assert len(resumed) == 3
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in full]
    assert read_metrics(root / "killed" / "metrics.jsonl", "eval")[-1]["heldout_reward"] == \
        read_metrics(root / "full" / "metrics.jsonl", "eval")[-1]["heldout_reward"]
    assert read_metrics(root / "killed" / "metrics.jsonl", "probe")[-1]["probe_task_rewards"] == \
        read_metrics(root / "full" / "metrics.jsonl", "probe")[-1]["probe_task_rewards"]
    # a run folder holding another run is refused
    with pytest.raises(ValueError, match=r"holds another run \(differs in \['config.scheduler.name'\]"):
        train(tiny_config(root / "killed", steps=3, scheduler="random", probe_tasks=3),
              progress=lambda *_: None)


def test_probe_tasks_are_spread_over_environments_and_fixed_by_the_split_seed():
    from envsched_jax.training.loop import choose_probe_tasks

    split = split_pool(load_pool("embedded"), 2, 1, seed=0)
    envs = [e.env_id for e in split.train.environments]
    chosen = choose_probe_tasks(split.train, 10, seed=0)
    assert len(chosen) == 10 and len({t.task_id for t in chosen}) == 10
    # round-robin: the first len(envs) tasks cover every environment once, in pool order
    assert [t.env_id for t in chosen[:len(envs)]] == envs
    assert [t.env_id for t in chosen[len(envs):]] == envs[:10 - len(envs)]
    assert [t.task_id for t in choose_probe_tasks(split.train, 10, seed=0)] == \
        [t.task_id for t in chosen]
    assert [t.task_id for t in choose_probe_tasks(split.train, 10, seed=1)] != \
        [t.task_id for t in chosen]
    everything = choose_probe_tasks(split.train, 10_000, seed=0)
    assert sorted(t.task_id for t in everything) == sorted(t.task_id for t in split.train.tasks)


def test_tokenizer_corpus_is_not_cut_by_the_runs_token_limits(tmp_path):
    """The tokenizer's corpus is played with a byte tokenizer (several times as many tokens as
    the trained one): a run whose sequence limit fits its trained-tokenizer episodes must not
    lose the corpus to that limit."""
    import dataclasses

    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
    from envsched_jax.training import warm_start

    cfg = tiny_config(tmp_path / "run", steps=0)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, agent=dataclasses.replace(
        cfg.rollout.agent, max_sequence_tokens=700)))
    split = split_pool(load_pool("embedded"), 2, 1, seed=0)
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as workers:
        policy, tokenizer = warm_start.policy_and_tokenizer(cfg, split, workers, tmp_path / "tok")
    assert len(tokenizer) == 320 and (tmp_path / "tok" / "tokenizer.json").is_file()


def test_step0_evaluation_of_a_cached_warm_start_is_shared(tmp_path):
    """Runs that read one cached warm start share its greedy step-0 evaluation: the first
    computes and stores it, the next (another scheduler and seed) reads it; a run whose
    evaluation differs (another held-out split) computes its own."""
    import dataclasses

    from envsched_jax.training.loop import train

    def cfg(name, **kw):
        base = tiny_config(tmp_path / name, steps=0, **kw)
        return dataclasses.replace(base, learner=dataclasses.replace(
            base.learner, sft_cache=tmp_path / "cache"))

    train(cfg("a", probe_tasks=2), progress=lambda *_: None)
    first = read_metrics(tmp_path / "a" / "metrics.jsonl", "eval")
    first_probe = read_metrics(tmp_path / "a" / "metrics.jsonl", "probe")
    assert len(first) == 1 and "eval_cached" not in first[0]
    assert len(first_probe) == 1 and "eval_cached" not in first_probe[0]
    assert (tmp_path / "cache" / "eval_step0.json").is_file()
    assert (tmp_path / "cache" / "probe_step0.json").is_file()
    train(cfg("b", scheduler="random", seed=1, probe_tasks=2), progress=lambda *_: None)
    second = read_metrics(tmp_path / "b" / "metrics.jsonl", "eval")
    assert second[0]["eval_cached"] is True
    assert second[0]["heldout_reward"] == first[0]["heldout_reward"]
    second_probe = read_metrics(tmp_path / "b" / "metrics.jsonl", "probe")
    assert second_probe[0]["eval_cached"] is True
    assert second_probe[0]["probe_task_rewards"] == first_probe[0]["probe_task_rewards"]
    greedy = cfg("c")
    sampled = dataclasses.replace(greedy, rollout=dataclasses.replace(
        greedy.rollout, eval_sampling=dataclasses.replace(greedy.rollout.eval_sampling,
                                                          greedy=False)))
    train(sampled, progress=lambda *_: None)
    third = read_metrics(tmp_path / "c" / "metrics.jsonl", "eval")
    assert "eval_cached" not in third[0]
    # a cache made for another warm start (here: other SFT tasks) is refused, naming the field
    other = cfg("d")
    other = dataclasses.replace(other, pool=dataclasses.replace(other.pool, seed=5))
    with pytest.raises(ValueError, match=r"warm_start.json: the cached warm start was made for "
                                         r"another configuration \(differs in \['sft_tasks'\]"):
        train(other, progress=lambda *_: None)


def test_a_warm_start_continues_from_a_saved_one(tmp_path):
    """LearnerSpec.sft_init: the warm start continues a saved policy (its weights and tokenizer)
    for sft_steps more updates; the new cache's record nests the first one's, and a policy spec
    of another shape is refused, naming the fields."""
    import dataclasses

    from envsched_jax.learner import models
    from envsched_jax.training.loop import train

    def cfg(name, cache, **learner):
        base = dataclasses.replace(tiny_config(tmp_path / name, steps=0), eval_every=0)
        return dataclasses.replace(base, learner=dataclasses.replace(
            base.learner, sft_cache=tmp_path / cache, **learner))

    train(cfg("a", "first"), progress=lambda *_: None)
    train(cfg("b", "second", sft_init=tmp_path / "first", sft_steps=2), progress=lambda *_: None)
    assert len(read_metrics(tmp_path / "b" / "metrics.jsonl", "sft")) == 2
    first = json.loads((tmp_path / "first" / "warm_start.json").read_text())
    second = json.loads((tmp_path / "second" / "warm_start.json").read_text())
    assert second["sft_init"] == first and first["sft_init"] is None
    a, b = models.load_policy(tmp_path / "first"), models.load_policy(tmp_path / "second")
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    from flax import nnx
    leaves = lambda p: jax.tree_util.tree_leaves(nnx.split(p.model, nnx.Param)[1])  # noqa: E731
    assert any(not np.array_equal(x, y) for x, y in zip(leaves(a), leaves(b)))  # it trained on
    wide = cfg("c", "third", sft_init=tmp_path / "first")
    wide = dataclasses.replace(wide, policy=dataclasses.replace(wide.policy, hidden_size=64))
    with pytest.raises(ValueError, match=r"shape differs from the policy spec.*hidden_size"):
        train(wide, progress=lambda *_: None)
    with pytest.raises(ValueError, match="not a warm-started policy folder"):
        train(cfg("d", "fourth", sft_init=tmp_path / "a"), progress=lambda *_: None)


def test_sync_every_serves_stale_weights_and_logs_the_lag(tmp_path):
    """RolloutSpec.sync_every = 2: the backend gets the learner's weights after every second
    update, so step 2's rollouts run on weights one update old; each step logs that lag."""
    import dataclasses

    from envsched_jax.training.loop import train

    base = tiny_config(tmp_path / "lag", steps=3)
    short = dataclasses.replace(base.rollout.agent, max_turns=2, max_tokens_per_turn=16)
    cfg = dataclasses.replace(  # no warm start: the lag's bookkeeping needs none
        base, eval_every=0, checkpoint_every=3,
        learner=dataclasses.replace(base.learner, sft_steps=0),
        rollout=dataclasses.replace(base.rollout, agent=short, sync_every=2))
    train(cfg, progress=lambda *_: None)
    steps = read_metrics(tmp_path / "lag" / "metrics.jsonl", "step")
    assert [s["policy_lag"] for s in steps] == [0, 1, 0]
    assert steps[0]["sync_seconds"] == 0.0 and steps[1]["sync_seconds"] > 0.0
    with pytest.raises(ValueError, match="RolloutSpec.sync_every must be >= 1, got 0"):
        RolloutSpec(sync_every=0)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smollm2_runs_a_few_steps_of_the_documented_accelerator_recipe(tmp_path):
    """The README's SmolLM2-135M recipe (no warm start, the full tool catalog, the model's own
    tokenizer and chat template) runs end to end on this CPU: two GRPO steps of 2 tasks x 2
    rollouts, real sandboxed episodes and a checkpoint, the learner in micro-batches of one
    sequence with remat (without them the update asked for 44.6 GB). Sizes are cut to keep it
    to minutes: no held-out split (an evaluation of 8 tasks took minutes of SmolLM2 sampling)."""
    import dataclasses

    from envsched_jax.rollout.agent import DEFAULT_SYSTEM_PROMPT
    from envsched_jax.training.loop import train

    agent = dataclasses.replace(RolloutSpec().agent, max_turns=2, max_tokens_per_turn=48,
                                max_sequence_tokens=4096, tool_catalog="full",
                                system_prompt=DEFAULT_SYSTEM_PROMPT)
    cfg = TrainConfig(
        pool=PoolSplit(spec="embedded", sft_per_env=0, heldout_per_env=0),
        policy=PolicySpec(source="smollm2"),
        scheduler=SchedulerSpec(name="envsched", batch_size=2, group_size=2),
        learner=LearnerSpec(sft_steps=0, max_length=4096, pad_multiple=256, micro_batch_size=1,
                            remat=True),
        rollout=RolloutSpec(sandbox="bwrap", workers=4, max_batch=4, max_context=4096, agent=agent,
                            eval_sampling=dataclasses.replace(RolloutSpec().eval_sampling,
                                                              max_new_tokens=48)),
        steps=2, out=tmp_path / "smollm2", checkpoint_every=2, eval_every=2)
    summary = train(cfg, progress=lambda *_: None)
    steps = read_metrics(tmp_path / "smollm2" / "metrics.jsonl", "step")
    assert [s["step"] for s in steps] == [1, 2] and summary["steps"] == 2
    for s in steps:
        assert sum(s["end_reasons"].values()) == 2 * 2 and s["sampled_tokens"] > 0
        assert np.isfinite(s["learner_loss"]) and np.isfinite(s["learner_grad_norm"])
    assert read_metrics(tmp_path / "smollm2" / "metrics.jsonl", "eval") == []  # nothing held out
    assert (tmp_path / "smollm2" / "checkpoints" / "step_00000002").is_dir()


def test_compare_schedulers_runs_each_scheduler_and_reports_from_the_folders(tmp_path, capsys):
    """experiments/compare_schedulers.py: every scheduler trains from the one shared warm start
    (the same step-0 evaluation), the table has each run's statistics, and --report-only
    rebuilds the same table from the folders without training (and refuses a missing run)."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import compare_schedulers as compare

    base = tiny_config(tmp_path / "unused", steps=0)
    base = dataclasses.replace(base, learner=dataclasses.replace(base.learner, sft_steps=2))
    args = compare.Args(schedulers=("envsched", "random"), seeds=(0,), steps=2, base=base,
                        out=tmp_path / "cmp", shared_warm_start=True)
    table = compare.main(args)
    assert set(table) == {"envsched", "random"}
    for name in table:
        stats = table[name]
        assert stats["heldout_before"]["runs"] == table["envsched"]["heldout_before"]["runs"]
        assert 1 <= stats["environments"]["mean"] <= 4 and np.isfinite(stats["reward_slope"]["mean"])
        assert len(read_metrics(tmp_path / "cmp" / f"{name}_s0" / "metrics.jsonl", "step")) == 2
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 1000
    csv_text = (tmp_path / "cmp" / "comparison.csv").read_text()
    assert "== envsched, seed 0" in capsys.readouterr().out  # the first call trained
    again = compare.main(dataclasses.replace(args, report_only=True))
    assert again == table and (tmp_path / "cmp" / "comparison.csv").read_text() == csv_text
    assert "== " not in capsys.readouterr().out  # the report-only call trained nothing
    with pytest.raises(FileNotFoundError, match=r"dps_s0: no metrics.jsonl"):
        compare.main(dataclasses.replace(args, schedulers=("dps",), report_only=True))
    paired = json.loads((tmp_path / "cmp" / "paired.json").read_text())
    assert set(paired["runs"]) == {"envsched_s0", "random_s0"}
    heldout = read_metrics(tmp_path / "cmp" / "random_s0" / "metrics.jsonl", "eval")
    assert paired["runs"]["random_s0"]["eval"]["tasks"] == len(heldout[0]["heldout_task_rewards"])
    assert set(paired["against_envsched"]) == {"random"}


def test_paired_per_task_change_matches_hand_computed_wilcoxon():
    """compare_schedulers.paired_change: six tasks all up gives the exact two-sided signed-rank
    p = 2 / 2**6; unchanged tasks are dropped; no change at all gives p = 1; mismatched ids
    are refused."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import compare_schedulers as compare

    before = {f"t{i}": 0.1 * i for i in range(8)}
    after = {t: r + (0.05 * (i + 1) if i < 6 else 0.0) for i, (t, r) in enumerate(before.items())}
    out = compare.paired_change(before, after)
    assert (out["tasks"], out["up"], out["down"]) == (8, 6, 0)
    assert out["p"] == pytest.approx(2 / 2**6)
    assert out["mean_diff"] == pytest.approx(sum(0.05 * (i + 1) for i in range(6)) / 8)
    assert compare.paired_change(before, before)["p"] == 1.0
    with pytest.raises(ValueError, match="same tasks"):
        compare.paired_change(before, {"t0": 0.0})
