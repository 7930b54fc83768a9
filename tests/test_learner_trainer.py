"""The trainer: gradient accumulation, learning on a toy task, SFT, bit-identical resume, sharded
training on fake CPU devices against one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from envsched_jax.learner.checkpoint import TrainCheckpointError, restore_checkpoint, save_checkpoint
from envsched_jax.learner.objectives import GRPOConfig
from envsched_jax.learner.optim import OptimConfig
from envsched_jax.learner.trainer import (PolicyBatch, Trainer, TrainerConfig, length_groups,
                                          sft_batch)

VOCAB = 11


class TinyLM(nnx.Module):
    """A causal toy language model: each position sees its token and the mean of the embeddings
    of the tokens before it (no attention; enough to test the trainer's mechanics)."""

    def __init__(self, rngs: nnx.Rngs, dim: int = 16):
        self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
        self.hidden = nnx.Linear(2 * dim, dim, rngs=rngs)
        self.out = nnx.Linear(dim, VOCAB, rngs=rngs)

    def __call__(self, tokens, attention_mask):
        x = self.embed(tokens) * attention_mask[..., None]
        counts = jnp.maximum(jnp.cumsum(attention_mask, axis=1), 1)[..., None]
        prefix = jnp.cumsum(x, axis=1) / counts
        return self.out(jnp.tanh(self.hidden(jnp.concatenate([x, prefix], axis=-1))))


def tiny_forward(model, tokens, attention_mask):
    return model(tokens, attention_mask.astype(jnp.float32))


def toy_batch(seed: int = 0, n: int = 8, t: int = 6) -> PolicyBatch:
    """n sequences: 2 prompt tokens, then generated tokens; advantage +1 for sequences whose
    generated tokens are all 3, -1 otherwise; the last sequence is padded by one token."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(n, t))
    tokens[: n // 2, 2:] = 3
    attention = np.ones((n, t), np.int32)
    attention[-1, -1] = 0
    loss_mask = np.zeros((n, t), np.float32)
    loss_mask[:, 2:] = 1.0
    loss_mask *= attention
    advantages = np.where(np.arange(n) < n // 2, 0.2, -0.2).astype(np.float32)
    return PolicyBatch(jnp.asarray(tokens, jnp.int32), jnp.asarray(attention),
                       jnp.asarray(loss_mask), jnp.asarray(advantages),
                       jnp.zeros((n, t), jnp.float32))


def make_trainer(config: TrainerConfig, seed: int = 0) -> Trainer:
    return Trainer(TinyLM(nnx.Rngs(seed)), tiny_forward, config)


def with_old_logp(trainer: Trainer, batch: PolicyBatch) -> PolicyBatch:
    return batch.replace(old_logp=trainer.logprobs(batch.tokens, batch.attention_mask))


FAST = OptimConfig(learning_rate=3e-2, warmup_steps=0, total_steps=50)


def params_of(trainer: Trainer) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batches_accumulate_to_the_whole_batch_update(aggregation):
    batch = toy_batch()
    batch = batch.replace(loss_mask=batch.loss_mask.at[1, 3:].set(0.0))  # unequal lengths
    grpo = GRPOConfig(loss_aggregation=aggregation)
    whole = make_trainer(TrainerConfig(optim=FAST, grpo=grpo))
    split = make_trainer(TrainerConfig(optim=FAST, grpo=grpo, micro_batch_size=2))
    m_whole = whole.train(with_old_logp(whole, batch))
    m_split = split.train(with_old_logp(split, batch))
    assert m_whole["loss"] == pytest.approx(m_split["loss"], rel=1e-5, abs=1e-7)
    assert m_whole["tokens"] == m_split["tokens"] == float(batch.loss_mask[:, 1:].sum())
    for a, b in zip(params_of(whole), params_of(split)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def ragged_batch(seed: int = 0, n: int = 8, t: int = 40) -> PolicyBatch:
    """Rows of very different lengths (right-padded; row 5 left-padded too), generated tokens
    after a 2-token prompt, mixed advantages."""
    rng = np.random.default_rng(seed)
    lengths = np.array([40, 5, 17, 9, 33, 24, 6, 12])[:n]
    tokens = rng.integers(0, VOCAB, size=(n, t))
    attention = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    attention[5, :3] = 0
    loss = attention.astype(np.float32)
    loss[:, :2] = 0.0
    loss[5, :5] = 0.0
    advantages = rng.normal(size=n).astype(np.float32)
    return PolicyBatch(jnp.asarray(tokens, jnp.int32), jnp.asarray(attention), jnp.asarray(loss),
                       jnp.asarray(advantages), jnp.zeros((n, t), jnp.float32))


def test_length_groups_sort_rows_and_pad_each_to_a_power_of_two_width():
    groups = length_groups(ragged_batch(), size=2, pad_multiple=4)
    assert [sorted(rows.tolist()) for rows, _ in groups] == [[1, 6], [3, 7], [2, 5], [0, 4]]
    assert [width for _, width in groups] == [8, 16, 32, 40]  # 40: capped at the batch's width


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_length_grouped_update_equals_the_padded_update(aggregation):
    grpo = GRPOConfig(loss_aggregation=aggregation)
    plain = make_trainer(TrainerConfig(optim=FAST, grpo=grpo))
    grouped = make_trainer(TrainerConfig(optim=FAST, grpo=grpo, micro_batch_size=2,
                                         length_grouping=True, pad_multiple=4))
    for seed in range(3):  # three updates: the optimizer state must follow too
        batch = ragged_batch(seed)
        m_plain = plain.train(with_old_logp(plain, batch))
        m_grouped = grouped.train(with_old_logp(grouped, batch))
        for key in ("loss", "grad_norm", "entropy", "clip_fraction"):
            assert m_plain[key] == pytest.approx(m_grouped[key], rel=1e-4, abs=1e-6), key
        assert m_plain["tokens"] == m_grouped["tokens"]
    for a, b in zip(params_of(plain), params_of(grouped)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_grpo_raises_the_probability_of_advantaged_sequences():
    batch = toy_batch()
    trainer = make_trainer(TrainerConfig(optim=FAST, grpo=GRPOConfig(advantage_clip=0.2)))
    before = np.asarray(trainer.logprobs(batch.tokens, batch.attention_mask))
    for _ in range(15):
        metrics = trainer.train(with_old_logp(trainer, batch))
    after = np.asarray(trainer.logprobs(batch.tokens, batch.attention_mask))
    mask = np.asarray(batch.loss_mask)
    gain = ((after - before) * mask).sum(axis=1) / mask.sum(axis=1)
    assert (gain[:4] > 0).all() and (gain[4:] < 0).all(), gain
    assert np.isfinite([metrics["loss"], metrics["grad_norm"], metrics["entropy"]]).all()
    assert metrics["tokens_per_second"] > 0


def test_masked_sft_lowers_the_loss_on_generated_tokens_only():
    batch = toy_batch()
    sft = sft_batch(batch.tokens, batch.attention_mask, batch.loss_mask)
    trainer = make_trainer(TrainerConfig(objective="sft", optim=FAST))
    first = trainer.train(sft)["loss"]
    for _ in range(20):
        last = trainer.train(sft)["loss"]
    assert last < first * 0.8, (first, last)


def test_bfloat16_compute_and_remat_train():
    batch = toy_batch()
    for config in (TrainerConfig(optim=FAST, compute_dtype="bfloat16"),
                   TrainerConfig(optim=FAST, remat=True, micro_batch_size=4)):
        trainer = make_trainer(config)
        metrics = trainer.train(with_old_logp(trainer, batch))
        assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
        assert all(p.dtype == np.float32 for p in params_of(trainer))


def test_resume_continues_bit_identically(tmp_path):
    from envsched_jax.graph.build import build_graph
    from envsched_jax.pool.sources import load_pool
    from envsched_jax.sched import EnvSchedConfig, make_scheduler

    config = TrainerConfig(optim=FAST, micro_batch_size=4)
    batches = [toy_batch(seed) for seed in range(4)]
    straight = make_trainer(config)
    for b in batches:
        straight.train(with_old_logp(straight, b))

    graph = build_graph(load_pool("embedded"))
    sched = make_scheduler("envsched", graph, config=EnvSchedConfig(batch_size=8))
    ids = sched.select(0)
    sched.observe(0, ids, np.full((8, sched.group_size), 0.5, np.float32))
    first = make_trainer(config)
    for b in batches[:2]:
        first.train(with_old_logp(first, b))
    folder = save_checkpoint(tmp_path, first.state, config, scheduler=sched,
                             extra={"model": "TinyLM"})
    assert folder.name == "step_00000002"
    assert json.loads((folder / "train_state.json").read_text())["extra"] == {"model": "TinyLM"}

    resumed = make_trainer(config, seed=7)  # other initial weights: all must come from the folder
    twin = make_scheduler("envsched", graph, config=EnvSchedConfig(batch_size=8))
    resumed.state = restore_checkpoint(folder, resumed.state, config, scheduler=twin)
    assert int(resumed.state.step) == 2 and twin.select(1) == sched.select(1)
    for b in batches[2:]:
        resumed.train(with_old_logp(resumed, b))
    for a, b in zip(params_of(straight), params_of(resumed)):
        assert np.array_equal(a, b)
    assert np.array_equal(np.asarray(straight.state.key), np.asarray(resumed.state.key))


def test_restore_refuses_another_config_and_changes_nothing(tmp_path):
    config = TrainerConfig(optim=FAST)
    trainer = make_trainer(config)
    trainer.train(with_old_logp(trainer, toy_batch()))
    folder = save_checkpoint(tmp_path, trainer.state, config)
    other = make_trainer(TrainerConfig(optim=OptimConfig(learning_rate=1e-3)))
    before = params_of(other)
    with pytest.raises(TrainCheckpointError, match="another trainer config"):
        restore_checkpoint(folder, other.state, other.config)
    assert all(np.array_equal(a, b) for a, b in zip(before, params_of(other)))
    with pytest.raises(TrainCheckpointError, match="cannot read train_state.json"):
        restore_checkpoint(tmp_path / "missing", trainer.state, config)


SHARDED_SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, numpy as np
    from flax import nnx
    sys.path.insert(0, sys.argv[1])
    from test_learner_trainer import FAST, TinyLM, tiny_forward, toy_batch, with_old_logp
    from envsched_jax.learner.trainer import Trainer, TrainerConfig, make_mesh
    assert jax.device_count() == 4, jax.devices()
    out = {}
    for name, mesh, sharding in (("one", None, "data"), ("data", make_mesh(), "data"),
                                 ("fsdp", make_mesh(), "fsdp")):
        trainer = Trainer(TinyLM(nnx.Rngs(0)), tiny_forward,
                          TrainerConfig(optim=FAST, micro_batch_size=4, sharding=sharding), mesh)
        for seed in range(3):
            batch = toy_batch(seed)
            trainer.train(with_old_logp(trainer, batch))
        leaves = jax.tree.leaves(trainer.state.params)
        out[name] = {"params": [np.asarray(x).tolist() for x in leaves],
                     "specs": sorted({str(getattr(x.sharding, "spec", None)) for x in leaves})}
    print(json.dumps(out))
''')


def test_data_parallel_and_fsdp_on_four_devices_match_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT, str(Path(__file__).parent)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert any("data" in spec for spec in out["fsdp"]["specs"])  # some parameters were split
    assert out["data"]["specs"] == [str(PartitionSpec())]  # replicated
    for name in ("data", "fsdp"):
        for a, b in zip(out["one"]["params"], out[name]["params"]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_config_validation_names_the_value():
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1 or None, got 0"):
        TrainerConfig(micro_batch_size=0)
    with pytest.raises(ValueError, match="objective must be 'grpo' or 'sft', got 'ppo'"):
        TrainerConfig(objective="ppo")
    with pytest.raises(ValueError, match="length_grouping needs micro_batch_size"):
        TrainerConfig(length_grouping=True)
    trainer = make_trainer(TrainerConfig(micro_batch_size=3))
    with pytest.raises(ValueError, match="micro_batch_size 3 does not divide the batch of 8"):
        trainer.train(toy_batch())
