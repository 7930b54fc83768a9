"""Tests of the learner's objectives (GRPO, masked SFT, log-probs) and optimizer.

Hand-computed values carry their arithmetic in comments; random inputs are checked against the
NumPy reference (tests/reference_learner.py) in float64; gradients are checked against central
differences through a tiny softmax policy in float64.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import reference_learner as ref
from envsched_jax.learner import objectives
from envsched_jax.learner.objectives import GRPOConfig
from envsched_jax.learner.optim import OptimConfig, make_optimizer, make_schedule

LN = math.log


@pytest.fixture
def x64():
    """float64 for the duration of one test, restoring the previous setting afterwards."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def _float(x) -> float:
    return float(np.asarray(x))


# -- advantages: hand-computed -------------------------------------------------------------------

# Two tasks, K = 3 rollouts each. Task 0 has rewards (1, 0, 0), mean 1/3; task 1 is constant.
#   centred c = [[2/3, -1/3, -1/3], [0, 0, 0]]
#   batch mean of c = 0; batch variance = (4/9 + 1/9 + 1/9 + 0 + 0 + 0) / 6 = 1/9, std = 1/3
#   whitened (eps = 0) = c / (1/3) = [[2, -1, -1], [0, 0, 0]]
TOY_REWARDS = [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_group_advantages_hand_computed(x64):
    rewards = jnp.asarray(TOY_REWARDS)
    no_clip = GRPOConfig(advantage_clip=math.inf, whiten_eps=0.0)
    np.testing.assert_allclose(objectives.group_advantages(rewards, no_clip),
                               [[2.0, -1.0, -1.0], [0.0, 0.0, 0.0]], rtol=1e-14)
    # the paper's clip to [-0.2, 0.2]: 2 -> 0.2, -1 -> -0.2
    np.testing.assert_allclose(objectives.group_advantages(rewards, GRPOConfig(whiten_eps=0.0)),
                               [[0.2, -0.2, -0.2], [0.0, 0.0, 0.0]], rtol=1e-14)
    # default eps 1e-6: c / (1/3 + 1e-6) = 2 / (1 + 3e-6) for the first rollout
    default_eps = dataclasses.replace(no_clip, whiten_eps=1e-6)
    np.testing.assert_allclose(objectives.group_advantages(rewards, default_eps),
                               [[2.0 / (1 + 3e-6), -1.0 / (1 + 3e-6), -1.0 / (1 + 3e-6)], [0, 0, 0]],
                               rtol=1e-14)
    # whitening off, clip 0.5: c itself with 2/3 clipped to 0.5
    off = GRPOConfig(whiten_advantages=False, advantage_clip=0.5)
    np.testing.assert_allclose(objectives.group_advantages(rewards, off),
                               [[0.5, -1 / 3, -1 / 3], [0.0, 0.0, 0.0]], rtol=1e-14)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_constant_rewards_give_exact_zeros(eps):
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004 in binary: r - mean(r) alone would leave +-1 ulp, which
    # whitening would blow up to +-1; the implementation must return exact zeros, never NaN.
    config = GRPOConfig(whiten_eps=eps, advantage_clip=math.inf)
    constant = objectives.group_advantages(jnp.asarray([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]]), config)
    assert np.all(np.asarray(constant) == 0.0)
    mixed = np.asarray(objectives.group_advantages(jnp.asarray([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]]), config))
    assert np.all(mixed[0] == 0.0) and np.all(np.isfinite(mixed))
    assert np.all(mixed[1] != 0.0)


# -- GRPO loss: hand-computed --------------------------------------------------------------------

# Two sequences, three positions; sequence 1's last token is an environment token (mask 0) whose
# old log-prob is garbage (exp(logp - old_logp) would overflow to inf).
TOY_MASK = np.array([[1, 1, 1], [1, 1, 0]])
TOY_LOGP = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]])
TOY_LOG_RATIO = np.array([[LN(1.5), 0.0, LN(0.5)], [LN(1.5), LN(0.5), 0.0]])
TOY_ADV = np.array([0.2, -0.2])


def _toy_old_logp():
    old = TOY_LOGP - TOY_LOG_RATIO
    old[1, 2] = -1e4
    return old


def _toy_loss(config: GRPOConfig, ref_logp=None, fn=objectives.grpo_loss):
    return fn(jnp.asarray(TOY_LOGP), jnp.asarray(_toy_old_logp()), jnp.asarray(TOY_ADV),
              jnp.asarray(TOY_MASK), config, ref_logp=None if ref_logp is None else jnp.asarray(ref_logp))


@pytest.mark.parametrize("jit", [False, True])
def test_grpo_loss_hand_computed(x64, jit):
    # ratios rho = [[1.5, 1.0, 0.5], [1.5, 0.5, -]]; clip range [0.8, 1.2].
    # sequence 0, A = +0.2: min(1.5 * 0.2, 1.2 * 0.2) = 0.24 (clipped), min(0.2, 0.2) = 0.2,
    #                       min(0.5 * 0.2, 0.8 * 0.2) = min(0.10, 0.16) = 0.10
    # sequence 1, A = -0.2: min(-0.30, 1.2 * -0.2 = -0.24) = -0.30,
    #                       min(-0.10, 0.8 * -0.2 = -0.16) = -0.16 (clipped)
    # token mean: (0.24 + 0.2 + 0.10 - 0.30 - 0.16) / 5 = 0.08 / 5 = 0.016       -> loss -0.016
    # sequence mean: ((0.24 + 0.2 + 0.10) / 3 + (-0.30 - 0.16) / 2) / 2
    #              = (0.18 - 0.23) / 2 = -0.025                                -> loss +0.025
    fn = jax.jit(objectives.grpo_loss) if jit else objectives.grpo_loss
    loss, metrics = _toy_loss(GRPOConfig(), fn=fn)
    assert _float(loss) == pytest.approx(-0.016, rel=1e-12)
    assert _float(metrics["policy_loss"]) == pytest.approx(-0.016, rel=1e-12)
    loss_seq, _ = _toy_loss(GRPOConfig(loss_aggregation="sequence"), fn=fn)
    assert _float(loss_seq) == pytest.approx(0.025, rel=1e-12)
    # clipped in 2 of 5 tokens; mean ratio (1.5 + 1 + 0.5 + 1.5 + 0.5) / 5 = 1
    assert _float(metrics["clip_fraction"]) == pytest.approx(0.4, rel=1e-12)
    assert _float(metrics["ratio_mean"]) == pytest.approx(1.0, rel=1e-12)
    assert _float(metrics["num_tokens"]) == 5.0
    # k3 of KL(old || new): (rho - 1) - ln rho = 0.5 - ln 1.5 at rho 1.5 (twice),
    # -0.5 + ln 2 at rho 0.5 (twice), 0 at rho 1
    approx_kl = (2 * (0.5 - LN(1.5)) + 2 * (LN(2) - 0.5)) / 5
    assert _float(metrics["approx_kl_old"]) == pytest.approx(approx_kl, rel=1e-12)
    assert "kl_ref" not in metrics


@pytest.mark.parametrize("clip_eps, clip_eps_high, expected_loss, expected_clip_fraction", [
    # clip-higher 0.6: the range is [0.8, 1.6]; rho 1.5 with A > 0 is no longer clipped:
    # 0.24 -> 0.30, total 0.08 + 0.06 = 0.14, loss -0.14 / 5; only sequence 1's rho 0.5 clips
    (0.2, 0.6, -0.14 / 5, 1 / 5),
    # a tighter upper clip 0.1: range [0.8, 1.1]; 0.24 -> 1.1 * 0.2 = 0.22, total 0.06
    (0.2, 0.1, -0.06 / 5, 2 / 5),
    # symmetric 0.6: range [0.4, 1.6]; 0.24 -> 0.30 and -0.16 -> min(-0.10, -0.08) = -0.10;
    # total 0.30 + 0.2 + 0.10 - 0.30 - 0.10 = 0.20
    (0.6, None, -0.20 / 5, 0.0),
])
def test_clip_range_hand_computed(x64, clip_eps, clip_eps_high, expected_loss, expected_clip_fraction):
    loss, metrics = _toy_loss(GRPOConfig(clip_eps=clip_eps, clip_eps_high=clip_eps_high))
    assert _float(loss) == pytest.approx(expected_loss, rel=1e-12)
    assert _float(metrics["clip_fraction"]) == pytest.approx(expected_clip_fraction, rel=1e-12)


# ref_logp - logp = d per token: [[ln 2, -ln 2, 0], [ln 2, 0, (masked garbage)]]
#   k3 = e^d - d - 1: ln 2 -> 2 - ln 2 - 1 = 1 - ln 2; -ln 2 -> 1/2 + ln 2 - 1 = ln 2 - 1/2; 0 -> 0
#   k1 = -d:          ln 2 -> -ln 2;                  -ln 2 -> ln 2;                    0 -> 0
TOY_KL_D = np.array([[LN(2), -LN(2), 0.0], [LN(2), 0.0, 1e4]])
K3_TOKEN = ((1 - LN(2)) + (LN(2) - 0.5) + 0 + (1 - LN(2)) + 0) / 5           # = (1.5 - ln 2) / 5
K3_SEQUENCE = ((1 - LN(2) + LN(2) - 0.5 + 0) / 3 + (1 - LN(2) + 0) / 2) / 2   # = (1/6 + (1 - ln 2)/2) / 2
K1_TOKEN = (-LN(2) + LN(2) + 0 - LN(2) + 0) / 5                              # = -ln 2 / 5
K1_SEQUENCE = ((-LN(2) + LN(2) + 0) / 3 + (-LN(2) + 0) / 2) / 2              # = -ln 2 / 4


@pytest.mark.parametrize("estimator, aggregation, policy_loss, kl", [
    ("k3", "token", -0.016, K3_TOKEN),
    ("k3", "sequence", 0.025, K3_SEQUENCE),
    ("k1", "token", -0.016, K1_TOKEN),
    ("k1", "sequence", 0.025, K1_SEQUENCE),
])
def test_kl_to_reference_hand_computed(x64, estimator, aggregation, policy_loss, kl):
    ref_logp = TOY_LOGP + TOY_KL_D
    config = GRPOConfig(kl_coef=0.1, kl_estimator=estimator, loss_aggregation=aggregation)
    loss, metrics = _toy_loss(config, ref_logp)
    assert _float(metrics["kl_ref"]) == pytest.approx(kl, rel=1e-12)
    assert _float(loss) == pytest.approx(policy_loss + 0.1 * kl, rel=1e-12)
    # kl_coef = 0 with reference log-probs: the KL is reported but not added
    loss0, metrics0 = _toy_loss(dataclasses.replace(config, kl_coef=0.0), ref_logp)
    assert _float(loss0) == pytest.approx(policy_loss, rel=1e-12)
    assert _float(metrics0["kl_ref"]) == pytest.approx(kl, rel=1e-12)


def test_kl_coef_without_reference_is_an_error():
    with pytest.raises(ValueError, match="kl_coef = 0.1 needs ref_logp"):
        _toy_loss(GRPOConfig(kl_coef=0.1))


def test_whitening_scales_the_loss_by_the_batch_std(x64):
    # TOY_REWARDS with sequence lengths 1, 2, 3, 1, 1, 1 (9 tokens), on-policy (rho = 1), no clip:
    #   whitened A = [2, -1, -1, 0, 0, 0]: token sum 2*1 - 1*2 - 1*3 = -3, loss = 3/9 = 1/3
    #   centred  A = [2/3, -1/3, -1/3, 0, 0, 0]: token sum (2 - 2 - 3)/3 = -1, loss = 1/9
    # i.e. whitening multiplies the loss by 1 / std = 3.
    lengths = np.array([1, 2, 3, 1, 1, 1])
    mask = jnp.asarray(np.arange(3)[None, :] < lengths[:, None])
    logp = jnp.full((6, 3), -1.0)
    losses = {}
    for whiten in (True, False):
        config = GRPOConfig(whiten_advantages=whiten, advantage_clip=math.inf, whiten_eps=0.0)
        advantages = objectives.group_advantages(jnp.asarray(TOY_REWARDS), config).reshape(-1)
        losses[whiten] = _float(objectives.grpo_loss(logp, logp, advantages, mask, config)[0])
    assert losses[True] == pytest.approx(1 / 3, rel=1e-12)
    assert losses[False] == pytest.approx(1 / 9, rel=1e-12)


def test_sft_loss_hand_computed(x64):
    # token: -(-1 - 2 - 0.5 - 0.3 - 1.2) / 5 = 5.0 / 5 = 1.0
    # sequence: ((1 + 2 + 0.5) / 3 + (0.3 + 1.2) / 2) / 2 = (7/6 + 0.75) / 2 = 23/24
    logp = jnp.asarray(TOY_LOGP).at[1, 2].set(-jnp.inf)  # masked: must not enter
    loss, metrics = objectives.sft_loss(logp, jnp.asarray(TOY_MASK))
    assert _float(loss) == pytest.approx(1.0, rel=1e-12)
    assert _float(metrics["nll"]) == _float(loss) and _float(metrics["num_tokens"]) == 5.0
    loss_seq, _ = objectives.sft_loss(logp, jnp.asarray(TOY_MASK), aggregation="sequence")
    assert _float(loss_seq) == pytest.approx(23 / 24, rel=1e-12)


def test_shape_errors_name_the_shapes():
    logp = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"advantages must be \[N\] = \(2,\), got \(3,\)"):
        objectives.grpo_loss(logp, logp, jnp.zeros(3), jnp.ones((2, 3)), GRPOConfig())
    with pytest.raises(ValueError, match=r"mask must have logp's shape \(2, 3\), got \(2, 4\)"):
        objectives.sft_loss(logp, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match=r"rewards must be \[B, K\]"):
        objectives.group_advantages(jnp.zeros(4), GRPOConfig())


# -- against the NumPy reference -----------------------------------------------------------------

REFERENCE_CONFIGS = [
    GRPOConfig(),
    GRPOConfig(loss_aggregation="sequence"),
    GRPOConfig(clip_eps_high=0.28),
    GRPOConfig(kl_coef=0.05, kl_estimator="k3"),
    GRPOConfig(kl_coef=0.1, kl_estimator="k1", loss_aggregation="sequence", clip_eps_high=0.28),
    GRPOConfig(whiten_advantages=False, advantage_clip=0.5),
    GRPOConfig(advantage_clip=math.inf, clip_eps=0.1),
]


def _random_batch(seed: int, num_tasks=3, group_size=4, length=9):
    rng = np.random.default_rng(seed)
    n = num_tasks * group_size
    rewards = rng.integers(0, 3, size=(num_tasks, group_size)) / 2.0
    rewards[0] = 0.5  # one constant group
    logp = -rng.exponential(1.0, size=(n, length))
    old_logp = logp + rng.normal(0.0, 0.3, size=(n, length))
    ref_logp = logp + rng.normal(0.0, 0.3, size=(n, length))
    mask = (rng.random((n, length)) < 0.7).astype(np.float64)
    mask[1] = 0.0  # a sequence without generated tokens
    return rewards, logp, old_logp, ref_logp, mask


@pytest.mark.parametrize("config", REFERENCE_CONFIGS, ids=lambda c: f"{c.loss_aggregation}-kl{c.kl_coef}"
                         f"-{c.kl_estimator}-hi{c.clip_eps_high}-w{c.whiten_advantages}-a{c.advantage_clip}")
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_matches_reference(x64, config, seed):
    rewards, logp, old_logp, ref_logp, mask = _random_batch(seed)
    advantages = objectives.group_advantages(jnp.asarray(rewards), config)
    expected_adv = ref.group_advantages(rewards, advantage_clip=config.advantage_clip,
                                        whiten=config.whiten_advantages, whiten_eps=config.whiten_eps)
    np.testing.assert_allclose(advantages, expected_adv, rtol=1e-12, atol=1e-15)
    use_ref = config.kl_coef > 0
    loss, metrics = objectives.grpo_loss(jnp.asarray(logp), jnp.asarray(old_logp), advantages.reshape(-1),
                                         jnp.asarray(mask), config,
                                         ref_logp=jnp.asarray(ref_logp) if use_ref else None)
    expected_loss, expected_metrics = ref.grpo_loss(
        logp, old_logp, expected_adv.reshape(-1), mask, clip_eps=config.clip_eps,
        clip_eps_high=config.clip_eps_high, kl_coef=config.kl_coef, kl_estimator=config.kl_estimator,
        loss_aggregation=config.loss_aggregation, ref_logp=ref_logp if use_ref else None)
    assert _float(loss) == pytest.approx(expected_loss, rel=1e-12, abs=1e-15)
    assert set(metrics) == set(expected_metrics)
    for name, value in expected_metrics.items():
        assert _float(metrics[name]) == pytest.approx(value, rel=1e-12, abs=1e-15), name


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_sft_matches_reference(x64, aggregation):
    _, logp, _, _, mask = _random_batch(2)
    loss, _ = objectives.sft_loss(jnp.asarray(logp), jnp.asarray(mask), aggregation)
    assert _float(loss) == pytest.approx(ref.sft_loss(logp, mask, aggregation), rel=1e-12)


def test_logprobs_and_entropy_match_reference(x64):
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 30.0, size=(3, 5, 11))  # large spread: needs the max-shift
    tokens = rng.integers(0, 11, size=(3, 5))
    mask = rng.random((3, 5)) < 0.6
    np.testing.assert_allclose(objectives.token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)),
                               ref.token_logprobs(logits, tokens), rtol=1e-12, atol=1e-12)
    shifted = objectives.next_token_logprobs(jnp.asarray(logits), jnp.asarray(tokens))
    np.testing.assert_allclose(shifted, ref.next_token_logprobs(logits, tokens), rtol=1e-12, atol=1e-12)
    assert np.all(np.asarray(shifted)[:, 0] == 0.0)
    assert _float(objectives.entropy(jnp.asarray(logits), jnp.asarray(mask))) == pytest.approx(
        ref.entropy(logits, mask), rel=1e-10)


def test_shift_convention():
    # logits at position t score the token at t + 1: a model putting all its mass on token t + 1
    # at position t gives log-prob ~0 to every token but the first.
    tokens = jnp.asarray([[3, 1, 4, 1, 5]])
    logits = 50.0 * jax.nn.one_hot(jnp.roll(tokens, -1, axis=1), 7)
    shifted = np.asarray(objectives.next_token_logprobs(logits, tokens))
    assert shifted[0, 0] == 0.0
    np.testing.assert_allclose(shifted[0, 1:], 0.0, atol=1e-12 + 7 * math.exp(-50))
    np.testing.assert_array_equal(shifted[:, 1:], objectives.token_logprobs(logits[:, :-1], tokens[:, 1:]))
    uniform = objectives.entropy(jnp.zeros((1, 4, 7)), jnp.ones((1, 4)))
    assert _float(uniform) == pytest.approx(math.log(7), rel=1e-6)


def test_bfloat16_logits_are_upcast():
    rng = np.random.default_rng(4)
    logits = jnp.asarray(rng.normal(0.0, 8.0, size=(2, 6, 50)), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, 50, size=(2, 6)))
    out = objectives.token_logprobs(logits, tokens)
    assert out.dtype == jnp.float32
    # the upcast is exact, so the result is bit-identical to float32 logits of the same values
    np.testing.assert_array_equal(out, objectives.token_logprobs(logits.astype(jnp.float32), tokens))
    assert objectives.entropy(logits, jnp.ones((2, 6))).dtype == jnp.float32
    # extreme spreads stay finite
    extreme = jnp.asarray([[[1e4, 0.0, -1e4]]], jnp.bfloat16)
    np.testing.assert_array_equal(objectives.token_logprobs(extreme, jnp.asarray([[0]])), [[0.0]])
    assert np.isfinite(np.asarray(objectives.token_logprobs(extreme, jnp.asarray([[2]])))).all()


# -- gradients -----------------------------------------------------------------------------------

def test_masked_tokens_get_exactly_zero_gradient():
    rng = np.random.default_rng(5)
    n, length, vocab = 4, 6, 7
    logits = jnp.asarray(rng.normal(size=(n, length, vocab)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, size=(n, length)))
    mask = jnp.asarray(rng.random((n, length)) < 0.5).at[:, 0].set(False)
    # garbage wherever the mask is 0: overflowing old log-probs, infinite reference log-probs
    old_logp = jnp.where(mask, -1.0, -1e4)
    ref_logp = jnp.where(mask, -1.2, jnp.inf)
    advantages = jnp.asarray([0.2, -0.2, 0.1, -0.05])
    config = GRPOConfig(kl_coef=0.1, clip_eps_high=0.28)

    def grpo(logp):
        return objectives.grpo_loss(logp, old_logp, advantages, mask, config, ref_logp=ref_logp)[0]

    def sft(logp):
        return objectives.sft_loss(logp, mask)[0]

    logp = objectives.next_token_logprobs(logits, tokens).at[~mask].set(-jnp.inf)
    for loss_fn in (grpo, sft):
        loss, grad = jax.jit(jax.value_and_grad(loss_fn))(logp)
        assert np.isfinite(_float(loss))
        assert np.all(np.asarray(grad)[~np.asarray(mask)] == 0.0)
        assert np.all(np.asarray(grad)[np.asarray(mask)] != 0.0)
        # through the log-softmax: the distribution at t - 1 of a masked token t gets no gradient
        grad_logits = jax.jit(jax.grad(lambda z: loss_fn(objectives.next_token_logprobs(z, tokens))))(logits)
        unused = np.ones((n, length), bool)
        unused[:, :-1] = ~np.asarray(mask)[:, 1:]
        assert np.all(np.asarray(grad_logits)[unused] == 0.0)
        assert np.all(np.isfinite(np.asarray(grad_logits)))


VOCAB = 7


def _tiny_params(rng, hidden=5):
    """Embedding -> tanh layer -> softmax over VOCAB tokens (a bigram policy), float64."""
    return {"embed": jnp.asarray(rng.normal(0, 0.8, (VOCAB, hidden))),
            "w1": jnp.asarray(rng.normal(0, 0.8, (hidden, hidden))),
            "b1": jnp.asarray(rng.normal(0, 0.1, hidden)),
            "w2": jnp.asarray(rng.normal(0, 0.8, (hidden, VOCAB))),
            "b2": jnp.asarray(rng.normal(0, 0.1, VOCAB))}


def _tiny_logits(params, tokens):
    hidden = jnp.tanh(params["embed"][tokens] @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def _tiny_setup(seed=6, n=4, length=6):
    rng = np.random.default_rng(seed)
    params = _tiny_params(rng)
    ref_params = jax.tree.map(lambda p: p + 0.1 * jnp.asarray(rng.normal(size=p.shape)), params)
    tokens = jnp.asarray(rng.integers(0, VOCAB, size=(n, length)))
    # prompt (positions 0-1), generated turn (2-3), tool output (4), generated turn (5)
    mask = jnp.asarray(np.tile([0, 0, 1, 1, 0, 1], (n, 1)))
    # log-ratios at params: kept >= 0.05 away from every clip boundary
    # (ln 0.8 = -0.223, ln 1.2 = 0.182, ln 1.28 = 0.247) so the loss is smooth there
    deltas = jnp.asarray(rng.choice([-0.5, -0.1, 0.05, 0.3, 0.6], size=(n, length)))
    logp0 = objectives.next_token_logprobs(_tiny_logits(params, tokens), tokens)
    old_logp = logp0 - deltas
    ref_logp = objectives.next_token_logprobs(_tiny_logits(ref_params, tokens), tokens)
    return params, tokens, mask, old_logp, ref_logp


def _assert_gradient_matches_central_differences(loss_fn, params):
    """jax.grad against (f(x + h e_i) - f(x - h e_i)) / 2h for every parameter, float64.

    h = 1e-5: truncation error ~h^2 |f'''| / 6 ~ 1e-11 and rounding ~1e-16 |f| / h ~ 1e-12, both
    far below the tolerance (rtol 1e-7, atol 1e-9 of the largest component).
    """
    flat, unravel = ravel_pytree(params)
    grad = np.asarray(ravel_pytree(jax.jit(jax.grad(loss_fn))(params))[0])
    step = 1e-5
    central = jax.jit(jax.vmap(
        lambda e: (loss_fn(unravel(flat + step * e)) - loss_fn(unravel(flat - step * e))) / (2 * step)))
    fd = np.asarray(central(jnp.eye(flat.size, dtype=flat.dtype)))
    assert np.abs(grad).max() > 1e-3  # the check is not vacuous
    np.testing.assert_allclose(grad, fd, rtol=1e-7, atol=1e-9 * np.abs(grad).max())


@pytest.mark.parametrize("config", [
    GRPOConfig(kl_coef=0.1),
    GRPOConfig(kl_coef=0.05, kl_estimator="k1", loss_aggregation="sequence", clip_eps_high=0.28),
], ids=["token-k3", "sequence-k1-clip_higher"])
def test_grpo_gradient_matches_finite_differences(x64, config):
    params, tokens, mask, old_logp, ref_logp = _tiny_setup()
    advantages = jnp.asarray([0.2, -0.2, 0.13, -0.05])

    def loss_fn(p):
        logp = objectives.next_token_logprobs(_tiny_logits(p, tokens), tokens)
        return objectives.grpo_loss(logp, old_logp, advantages, mask, config, ref_logp=ref_logp)[0]

    _assert_gradient_matches_central_differences(loss_fn, params)


def test_sft_gradient_matches_finite_differences(x64):
    params, tokens, mask, _, _ = _tiny_setup(seed=7)

    def loss_fn(p):
        return objectives.sft_loss(objectives.next_token_logprobs(_tiny_logits(p, tokens), tokens), mask)[0]

    _assert_gradient_matches_central_differences(loss_fn, params)


def test_equal_rewards_give_zero_policy_gradient():
    params, tokens, mask, old_logp, _ = _tiny_setup()
    params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
    config = GRPOConfig()
    advantages = objectives.group_advantages(jnp.full((2, 2), 0.1), config).reshape(-1)
    assert np.all(np.asarray(advantages) == 0.0)

    def loss_fn(p):
        logp = objectives.next_token_logprobs(_tiny_logits(p, tokens), tokens)
        return objectives.grpo_loss(logp, old_logp.astype(jnp.float32), advantages, mask, config)[0]

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert _float(loss) == 0.0
    assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(grads))


# -- compilation ---------------------------------------------------------------------------------

def test_changing_values_does_not_recompile():
    traces = []

    def loss_fn(logp, old_logp, advantages, mask, config, ref_logp):
        traces.append(None)
        return objectives.grpo_loss(logp, old_logp, advantages, mask, config, ref_logp=ref_logp)

    jitted = jax.jit(loss_fn)
    rng = np.random.default_rng(8)

    def call(config, seed_offset):
        arrays = [jnp.asarray(rng.normal(size=(4, 5)) - 2.0, jnp.float32) for _ in range(3)]
        mask = jnp.asarray(rng.random((4, 5)) < 0.5 + 0.1 * seed_offset, jnp.float32)
        advantages = jnp.asarray(rng.normal(size=4), jnp.float32)
        return jitted(arrays[0], arrays[1], advantages, mask, config, arrays[2])

    call(GRPOConfig(kl_coef=0.1, clip_eps_high=0.28), 0)
    # new values of every array and of every float hyper-parameter: same program
    call(GRPOConfig(kl_coef=0.3, clip_eps=0.1, clip_eps_high=0.4, advantage_clip=1.0), 1)
    call(GRPOConfig(kl_coef=0.0, clip_eps=0.3, clip_eps_high=0.2, whiten_eps=1e-3), 2)
    assert len(traces) == 1 and jitted._cache_size() == 1
    # a structural option is static: one more program
    call(GRPOConfig(kl_coef=0.1, clip_eps_high=0.28, loss_aggregation="sequence"), 0)
    assert len(traces) == 2 and jitted._cache_size() == 2

    advantages_fn = jax.jit(objectives.group_advantages)
    for clip in (0.2, 0.5, 1.0):
        advantages_fn(jnp.asarray(rng.random((3, 4)), jnp.float32), GRPOConfig(advantage_clip=clip))
    assert advantages_fn._cache_size() == 1


def test_config_is_a_pytree_of_its_float_fields():
    config = GRPOConfig(clip_eps_high=0.28, kl_coef=0.1, loss_aggregation="sequence")
    assert jax.tree.leaves(config) == [0.2, 0.28, 0.2, 1e-6, 0.1]
    assert jax.tree.map(lambda x: x, config) == config
    doubled = jax.tree.map(lambda x: 2 * x, config)
    assert doubled.clip_eps == 0.4 and doubled.loss_aggregation == "sequence"


# -- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"clip_eps": 1.5}, "clip_eps must lie in \\(0, 1\\), got 1.5"),
    ({"clip_eps": 0.0}, "clip_eps must lie in \\(0, 1\\), got 0.0"),
    ({"clip_eps_high": 0.0}, "clip_eps_high must be > 0 or None, got 0.0"),
    ({"advantage_clip": -0.2}, "advantage_clip must be > 0 .* got -0.2"),
    ({"advantage_clip": math.nan}, "advantage_clip must be > 0 .* got nan"),
    ({"whiten_eps": -1.0}, "whiten_eps must be finite and >= 0, got -1.0"),
    ({"kl_coef": -0.1}, "kl_coef must be finite and >= 0, got -0.1"),
    ({"kl_estimator": "k2"}, "kl_estimator must be 'k3' or 'k1', got 'k2'"),
    ({"loss_aggregation": "mean"}, "loss_aggregation must be 'token' or 'sequence', got 'mean'"),
    ({"epochs_per_batch": 0}, "epochs_per_batch must be an int >= 1, got 0"),
])
def test_grpo_config_validation(overrides, message):
    with pytest.raises(ValueError, match="GRPOConfig." + message):
        GRPOConfig(**overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"learning_rate": 0.0}, "learning_rate must be finite and > 0, got 0.0"),
    ({"warmup_steps": -1}, "warmup_steps must be >= 0, got -1"),
    ({"total_steps": 10}, "total_steps must exceed warmup_steps = 10, got 10"),
    ({"end_learning_rate": 2e-6}, "end_learning_rate must lie in .* got 2e-06"),
    ({"b2": 1.0}, "b2 must lie in \\[0, 1\\), got 1.0"),
    ({"eps": 0.0}, "eps must be > 0, got 0.0"),
    ({"grad_clip_norm": 0.0}, "grad_clip_norm must be > 0 or None, got 0.0"),
    ({"weight_decay": -0.1}, "weight_decay must be finite and >= 0, got -0.1"),
])
def test_optim_config_validation(overrides, message):
    with pytest.raises(ValueError, match="OptimConfig." + message):
        OptimConfig(**overrides)


def test_configs_parse_with_tyro():
    tyro = pytest.importorskip("tyro")
    config = tyro.cli(GRPOConfig, args=["--clip-eps-high", "0.28", "--loss-aggregation", "sequence",
                                        "--kl-coef", "0.05"])
    assert config == GRPOConfig(clip_eps_high=0.28, loss_aggregation="sequence", kl_coef=0.05)
    assert tyro.cli(OptimConfig, args=["--learning-rate", "3e-6"]) == OptimConfig(learning_rate=3e-6)
    assert GRPOConfig() == GRPOConfig(clip_eps=0.2, clip_eps_high=None, advantage_clip=0.2,
                                      whiten_advantages=True, kl_coef=0.0, epochs_per_batch=1)
    assert not GRPOConfig().uses_reference and GRPOConfig(kl_coef=0.1).uses_reference


# -- optimizer -----------------------------------------------------------------------------------

def _closed_form_lr(step, peak=1e-6, warmup=10, total=200, end=0.0):
    if step < warmup:
        return peak * step / warmup
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


# optax evaluates the schedule in float32, where 0.5 (1 + cos x) cancels near x = pi (step 199's
# factor is 6.8e-5): its absolute error is a few float32 ulps of 1, times the peak rate.
F32_LR_ABS = 4 * 1e-6 * float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("end", [0.0, 1e-7])
def test_schedule_closed_form(end):
    schedule = make_schedule(OptimConfig(end_learning_rate=end))
    # 0 -> 0; 5 -> half the warm-up; 10 -> peak; 105 = 10 + 190/2 -> cos(pi/2) = 0, halfway
    # between peak and floor; 200 -> the floor, kept afterwards
    expected = {0: 0.0, 5: 0.5e-6, 10: 1e-6, 105: end + 0.5 * (1e-6 - end), 200: end, 250: end}
    for step, value in expected.items():
        assert _closed_form_lr(step, end=end) == pytest.approx(value, rel=1e-12, abs=1e-20)
        assert _float(schedule(step)) == pytest.approx(value, rel=1e-6, abs=F32_LR_ABS)
    for step in (3, 17, 64, 150, 199):
        assert _float(schedule(step)) == pytest.approx(_closed_form_lr(step, end=end), rel=1e-6,
                                                       abs=F32_LR_ABS)


def test_adam_follows_the_schedule():
    # with a constant gradient Adam's bias-corrected moments are m = g and v = g^2, so every
    # update is -lr(s) g / (|g| + eps); the first (s = 0) has lr 0 and does not move anything
    config = OptimConfig(learning_rate=1e-3)
    tx = make_optimizer(config)
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    grads = {"w": jnp.asarray([0.3, -0.1, 2.0])}
    state = tx.init(params)
    for step in range(12):
        updates, state = tx.update(grads, state, params)
        lr = _closed_form_lr(step, peak=1e-3)
        expected = -lr * np.asarray(grads["w"]) / (np.abs(np.asarray(grads["w"])) + config.eps)
        np.testing.assert_allclose(updates["w"], expected, rtol=1e-5, atol=1e-12)


def test_grad_clip_and_weight_decay():
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    grads = {"w": jnp.asarray([30.0, -40.0, 0.0])}  # global norm 50
    config = OptimConfig(learning_rate=1e-3, warmup_steps=0, grad_clip_norm=1.0)
    clipped_grads = {"w": grads["w"] / 50.0}
    plain = optax.adam(make_schedule(config))
    expected, _ = plain.update(clipped_grads, plain.init(params), params)
    tx = make_optimizer(config)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], expected["w"], rtol=1e-6)
    # with zero gradients Adam's step is 0 and only the decoupled decay -lr wd w remains
    decay = make_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=0, weight_decay=0.1))
    updates, _ = decay.update({"w": jnp.zeros(3)}, decay.init(params), params)
    np.testing.assert_allclose(updates["w"], -1e-3 * 0.1 * np.asarray(params["w"]), rtol=1e-6)
