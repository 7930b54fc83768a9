"""Training objectives: the paper's GRPO (EnvSched section 3.1) and masked SFT (Env-Rethink).

Everything here is a pure, jittable function of arrays, optax style: the caller computes
per-token log-probabilities of the taken tokens (:func:`token_logprobs`) and hands them, with a
mask of the model-generated tokens, to :func:`grpo_loss` or :func:`sft_loss`, which return
``(loss, metrics)``; ``jax.value_and_grad(..., has_aux=True)`` then gives the update direction.

The paper's setting, which :class:`GRPOConfig`'s defaults reproduce: K rollouts per task,
group-relative advantages, batch-whitened and clipped to [-0.2, 0.2] (:func:`group_advantages`);
a PPO-style policy-ratio clip of 0.2; the loss over model-generated tokens only, reasoning
included (every environment, user and tool token has mask 0); one epoch per batch. The paper
does not say how token losses are aggregated; see :attr:`GRPOConfig.loss_aggregation` (CHOICE).

Index letters: ``B`` tasks in a batch, ``K`` rollouts per task, ``N`` sequences (N = B K for
GRPO, flattened task-major), ``T`` token positions, ``V`` vocabulary size.

Shift convention (:func:`next_token_logprobs`): a causal model's logits at position t are the
distribution of the token at position t + 1. :func:`token_logprobs` does no shifting (it reads
``targets[..., t]`` from ``logits[..., t, :]``); :func:`next_token_logprobs` applies the shift and
returns log-probs aligned with the tokens themselves, so a per-token mask applies unshifted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

Aggregation = Literal["token", "sequence"]
"""How per-token values become one scalar: see :func:`aggregate`."""

_TRACED_FIELDS = ("clip_eps", "clip_eps_high", "advantage_clip", "whiten_eps", "kl_coef")
"""GRPOConfig fields that are pytree leaves (traced under jit: changing them does not recompile);
the other fields are static structure (changing them does)."""


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """The GRPO objective's settings; defaults are the paper's (EnvSched section 3.1).

    The config is a pytree: its float fields (``clip_eps``, ``clip_eps_high``, ``advantage_clip``,
    ``whiten_eps``, ``kl_coef``) are leaves, so a jitted function taking the config as an argument
    is traced once and a new value of them does not recompile (a sweep over them can be a
    ``vmap``). The remaining fields are static. Validation runs when a config is constructed, not
    when JAX rebuilds one from (possibly traced) leaves.
    """

    clip_eps: float = 0.2
    """epsilon_low: the policy ratio is clipped below at 1 - clip_eps (the paper: 0.2)."""
    clip_eps_high: float | None = None
    """epsilon_high: the ratio is clipped above at 1 + clip_eps_high (DAPO's clip-higher, e.g.
    0.28); None clips symmetrically at 1 + clip_eps, as the paper does."""
    advantage_clip: float = 0.2
    """Advantages are clipped to [-advantage_clip, advantage_clip] after whitening (the paper:
    0.2); ``inf`` disables the clip."""
    whiten_advantages: bool = True
    """Whiten the group-centred advantages over the whole batch (subtract the batch mean, divide
    by the batch standard deviation plus ``whiten_eps``), as the paper does."""
    whiten_eps: float = 1e-6
    """Added to the batch standard deviation when whitening (our choice; the paper gives none)."""
    kl_coef: float = 0.0
    """beta: weight of the KL penalty to a reference policy (0: off, as in the paper). The KL is
    computed whenever reference log-probs are passed, and only added to the loss with this
    weight; a positive value requires them."""
    kl_estimator: Literal["k3", "k1"] = "k3"
    """Per-token estimator of KL(pi_theta || pi_ref) from tokens sampled by the policy:
    ``k3`` = exp(d) - d - 1 with d = log pi_ref - log pi_theta (non-negative; DeepSeekMath's
    GRPO), ``k1`` = -d (unbiased, can be negative)."""
    loss_aggregation: Aggregation = "token"
    """How per-token terms become the loss. CHOICE (the paper is silent): ``token``, the mean over
    all generated tokens of the batch (DAPO), so every generated token weighs the same and long
    multi-turn trajectories (up to 32,000 tokens here) are not down-weighted per token, and no
    length bias favours short answers (Dr. GRPO). ``sequence`` averages within each sequence and
    then over sequences (the original GRPO)."""
    epochs_per_batch: int = 1
    """Passes over each batch of rollouts (the paper: one; read by the trainer, not the loss)."""

    def __post_init__(self):
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"GRPOConfig.clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0.0:
            raise ValueError(f"GRPOConfig.clip_eps_high must be > 0 or None, got {self.clip_eps_high!r}")
        if not self.advantage_clip > 0.0:
            raise ValueError(f"GRPOConfig.advantage_clip must be > 0 (inf for no clip), "
                             f"got {self.advantage_clip!r}")
        if not isinstance(self.whiten_advantages, bool):
            raise ValueError(f"GRPOConfig.whiten_advantages must be a bool, got {self.whiten_advantages!r}")
        if not (self.whiten_eps >= 0.0 and math.isfinite(self.whiten_eps)):
            raise ValueError(f"GRPOConfig.whiten_eps must be finite and >= 0, got {self.whiten_eps!r}")
        if not (self.kl_coef >= 0.0 and math.isfinite(self.kl_coef)):
            raise ValueError(f"GRPOConfig.kl_coef must be finite and >= 0, got {self.kl_coef!r}")
        if self.kl_estimator not in ("k3", "k1"):
            raise ValueError(f"GRPOConfig.kl_estimator must be 'k3' or 'k1', got {self.kl_estimator!r}")
        if self.loss_aggregation not in ("token", "sequence"):
            raise ValueError(f"GRPOConfig.loss_aggregation must be 'token' or 'sequence', "
                             f"got {self.loss_aggregation!r}")
        if isinstance(self.epochs_per_batch, bool) or not isinstance(self.epochs_per_batch, int) \
                or self.epochs_per_batch < 1:
            raise ValueError(f"GRPOConfig.epochs_per_batch must be an int >= 1, "
                             f"got {self.epochs_per_batch!r}")

    @property
    def uses_reference(self) -> bool:
        """Whether the loss needs reference-policy log-probs (``kl_coef > 0``)."""
        return self.kl_coef > 0.0


def _flatten_grpo_config(config: GRPOConfig):
    static = tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                   if f.name not in _TRACED_FIELDS)
    return tuple(getattr(config, name) for name in _TRACED_FIELDS), static


def _unflatten_grpo_config(static, leaves) -> GRPOConfig:
    # JAX rebuilds configs from tracers or placeholder leaves: bypass __init__ (and validation).
    config = object.__new__(GRPOConfig)
    for name, value in (*static, *zip(_TRACED_FIELDS, leaves)):
        object.__setattr__(config, name, value)
    return config


jax.tree_util.register_pytree_node(GRPOConfig, _flatten_grpo_config, _unflatten_grpo_config)


# -- advantages ------------------------------------------------------------------------------------

def group_advantages(rewards: jax.Array, config: GRPOConfig) -> jax.Array:
    r"""The paper's advantages: group-relative, batch-whitened, clipped.

    With rewards r_{b,k} of rollout k of task b::

        c_{b,k} = r_{b,k} - (1/K) sum_j r_{b,j}
        w_{b,k} = (c_{b,k} - mean(c)) / (std(c) + eps)   (mean, std over all B K)
        A_{b,k} = clip(w_{b,k}, -a, a)                    (a = advantage_clip)

    and A_{b,k} = 0 exactly when group b's rewards are all equal.

    CHOICEs (the paper says only "group-relative advantages, batch-whitened then clipped"):

    - no division by the group's standard deviation: the batch whitening sets the scale, and a
      per-group std would up-weight groups whose rewards barely differ (Dr. GRPO);
    - whitening statistics over all B K rollouts, constant groups included (their zeros count);
    - population standard deviation (ddof 0) plus ``whiten_eps``;
    - a group whose rewards are all exactly equal gets advantages exactly 0, before and after
      whitening (not r - mean(r), which rounding can leave 1 ulp away from 0, nor -mean(c) / std,
      the rounding of a batch mean that is 0 in exact arithmetic), and a batch of constant groups
      gives exactly 0, never NaN.

    With ``whiten_advantages=False``, w = c.

    Args:
      rewards: [B, K] rewards of K rollouts of each of B tasks (any real dtype; computed in
        float32, or float64 for float64 rewards).
      config: ``advantage_clip``, ``whiten_advantages`` and ``whiten_eps`` are read.

    Returns:
      [B, K] advantages; flatten task-major (``reshape(-1)``) to get the [N] ``advantages`` of
      :func:`grpo_loss`.
    """
    rewards = jnp.asarray(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, K], got shape {rewards.shape}")
    rewards = rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32))
    constant_group = jnp.max(rewards, axis=1, keepdims=True) == jnp.min(rewards, axis=1, keepdims=True)
    centred = jnp.where(constant_group, 0.0, rewards - jnp.mean(rewards, axis=1, keepdims=True))
    if config.whiten_advantages:
        # mean(c) is 0 in exact arithmetic; its rounding must not hand constant groups a signal.
        constant_batch = jnp.max(centred) == jnp.min(centred)
        scale = jnp.where(constant_batch, 1.0, jnp.std(centred) + config.whiten_eps)
        whitened = (centred - jnp.mean(centred)) / scale
        centred = jnp.where(constant_group | constant_batch, 0.0, whitened)
    return jnp.clip(centred, -config.advantage_clip, config.advantage_clip)


# -- aggregation -----------------------------------------------------------------------------------

def aggregate(values: jax.Array, mask: jax.Array, how: Aggregation = "token") -> jax.Array:
    r"""Masked mean of per-token values, pooled over the batch or per sequence.

    With m the 0/1 mask::

        token:    sum_{n,t} m_{n,t} x_{n,t} / sum_{n,t} m_{n,t}
        sequence: (1/|S|) sum_{n in S} [ sum_t m_{n,t} x_{n,t} / sum_t m_{n,t} ],
                  S = sequences with at least one masked-in token

    Masked-out values never enter (not even as 0 * inf), and an empty mask gives 0.

    Args:
      values: [N, T] per-token values.
      mask: [N, T], nonzero where the token counts.
      how: ``token`` or ``sequence``.

    Returns:
      a scalar.
    """
    valid = mask != 0
    weight = valid.astype(values.dtype)
    masked = jnp.where(valid, values, 0.0)
    if how == "token":
        return jnp.sum(masked) / jnp.maximum(jnp.sum(weight), 1.0)
    if how == "sequence":
        count = jnp.sum(weight, axis=-1)
        per_sequence = jnp.sum(masked, axis=-1) / jnp.maximum(count, 1.0)
        has_tokens = (count > 0).astype(values.dtype)
        return jnp.sum(per_sequence * has_tokens) / jnp.maximum(jnp.sum(has_tokens), 1.0)
    raise ValueError(f"aggregation must be 'token' or 'sequence', got {how!r}")


def _check_token_arrays(logp: jax.Array, mask: jax.Array, **others: jax.Array | None) -> None:
    if logp.ndim != 2:
        raise ValueError(f"logp must be [N, T], got shape {logp.shape}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask must have logp's shape {logp.shape}, got {mask.shape}")
    for name, array in others.items():
        if array is not None and array.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {logp.shape}, got {array.shape}")


# -- GRPO ------------------------------------------------------------------------------------------

def grpo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
              config: GRPOConfig, ref_logp: jax.Array | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""The paper's GRPO loss: PPO's clipped surrogate over the model-generated tokens.

    For sequence n with advantage A_n and token t with mask m_{n,t}::

        rho_{n,t} = exp(logp_{n,t} - old_logp_{n,t})
        J_{n,t}   = min( rho_{n,t} A_n,  clip(rho_{n,t}, 1 - eps_low, 1 + eps_high) A_n )
        loss      = -Agg_m(J) + beta Agg_m(kl)                        (kl term only with ref_logp)
        kl_{n,t}  = exp(d) - d - 1   (k3)   or   -d   (k1),   d = ref_logp_{n,t} - logp_{n,t}

    where Agg_m is :func:`aggregate` with ``config.loss_aggregation``, eps_low = ``clip_eps``,
    eps_high = ``clip_eps_high`` (or ``clip_eps``), beta = ``kl_coef``. Tokens with m = 0 enter
    nothing and receive exactly zero gradient, whatever their (even non-finite) log-probs.

    ``old_logp`` are the log-probs under the policy that sampled the rollouts (treated as
    constants). With one epoch and one update per batch, rho = 1 up to the mismatch between the
    sampler's and the learner's numerics, and the clip acts only on that mismatch.

    Args:
      logp: [N, T] log-probs of the taken tokens under the current policy (differentiated).
      old_logp: [N, T] log-probs of the same tokens under the sampling policy.
      advantages: [N] one advantage per sequence, broadcast over its tokens.
      mask: [N, T] 1 for model-generated tokens (reasoning included), 0 for every prompt,
        environment, user, tool and padding token.
      config: the objective's settings.
      ref_logp: [N, T] log-probs under the reference policy, or None (no KL term). Required
        when ``config.kl_coef > 0``.

    Returns:
      ``(loss, metrics)``; metrics are scalars: ``policy_loss`` (-Agg(J)), ``clip_fraction``
      (share of generated tokens where the clipped term is strictly smaller, so its gradient is
      zero), ``approx_kl_old`` (token mean of k3 of KL(pi_old || pi_theta)), ``ratio_mean`` (token
      mean of rho), ``num_tokens`` (sum of the mask), and with ``ref_logp`` also ``kl_ref``
      (Agg(kl), so that loss = policy_loss + beta kl_ref).
    """
    _check_token_arrays(logp, mask, old_logp=old_logp, ref_logp=ref_logp)
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [N] = {logp.shape[:1]}, got {advantages.shape}")
    if ref_logp is None and not isinstance(config.kl_coef, jax.core.Tracer) \
            and float(config.kl_coef) != 0.0:
        raise ValueError(f"GRPOConfig.kl_coef = {config.kl_coef} needs ref_logp")
    valid = mask != 0
    eps_low = config.clip_eps
    eps_high = config.clip_eps if config.clip_eps_high is None else config.clip_eps_high

    # Masked positions get log-ratio 0 before exp: padding with arbitrary old log-probs can
    # neither overflow nor leak a gradient.
    log_ratio = jnp.where(valid, logp - old_logp, 0.0)
    ratio = jnp.exp(log_ratio)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    objective = jnp.minimum(unclipped, clipped)

    policy_loss = -aggregate(objective, mask, config.loss_aggregation)
    metrics = {
        "policy_loss": policy_loss,
        "clip_fraction": aggregate((clipped < unclipped).astype(logp.dtype), mask),
        "approx_kl_old": aggregate(jnp.expm1(log_ratio) - log_ratio, mask),
        "ratio_mean": aggregate(ratio, mask),
        "num_tokens": jnp.sum(valid.astype(logp.dtype)),
    }
    loss = policy_loss
    if ref_logp is not None:
        kl_ref = aggregate(kl_to_reference(logp, ref_logp, mask, config.kl_estimator), mask,
                           config.loss_aggregation)
        metrics["kl_ref"] = kl_ref
        loss = loss + config.kl_coef * kl_ref
    return loss, metrics


def kl_to_reference(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array,
                    estimator: Literal["k3", "k1"] = "k3") -> jax.Array:
    r"""Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from pi_theta.

    With d = ref_logp - logp: k3 = exp(d) - d - 1 (>= 0, low variance), k1 = -d (unbiased).
    Masked-out tokens give 0 and no gradient.

    Args:
      logp: [N, T] the policy's token log-probabilities.
      ref_logp: [N, T] the reference model's.
      mask: [N, T] which tokens count.
      estimator: ``k3`` or ``k1``.

    Returns:
      [N, T] per-token estimates.
    """
    d = jnp.where(mask != 0, ref_logp - logp, 0.0)
    if estimator == "k3":
        return jnp.expm1(d) - d
    if estimator == "k1":
        return -d
    raise ValueError(f"kl estimator must be 'k3' or 'k1', got {estimator!r}")


# -- SFT -------------------------------------------------------------------------------------------

def sft_loss(logp: jax.Array, mask: jax.Array, aggregation: Aggregation = "token"
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Masked SFT: mean negative log-likelihood of the masked-in tokens (Env-Rethink's L_SFT).

    For one sequence the paper's loss is ``-sum_t m_t log p(x_t | x_<t) / sum_t m_t``. Over a
    batch, CHOICE: ``token`` aggregation (default) pools every masked-in token of the batch into
    one mean, which is that formula applied to the concatenated batch; ``sequence`` averages the
    per-sequence losses (see :func:`aggregate`).

    Args:
      logp: [N, T] log-probs of the target tokens.
      mask: [N, T] 1 for tokens to imitate, 0 otherwise (those get exactly zero gradient).
      aggregation: ``token`` or ``sequence``.

    Returns:
      ``(loss, metrics)`` with scalar metrics ``nll`` (= loss) and ``num_tokens``.
    """
    _check_token_arrays(logp, mask)
    loss = -aggregate(logp, mask, aggregation)
    return loss, {"nll": loss, "num_tokens": jnp.sum((mask != 0).astype(logp.dtype))}


# -- log-probs and entropy -------------------------------------------------------------------------

def _at_least_float32(x: jax.Array) -> jax.Array:
    """bfloat16/float16 logits are upcast: a log-softmax over a large vocabulary in 8 mantissa
    bits loses the probabilities of every token but the top few."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    r"""log softmax(logits)[target] at every position, with no shift.

    ``out[..., t] = logits[..., t, targets[..., t]] - logsumexp(logits[..., t, :])``, computed in
    float32 (float64 for float64 logits) whatever the logits' dtype. For a causal model's output
    use :func:`next_token_logprobs`, or pass ``logits[:, :-1]`` and ``tokens[:, 1:]``.

    Args:
      logits: [..., T, V] unnormalised scores.
      targets: [..., T] integer ids in [0, V) (an id outside gives NaN).

    Returns:
      [..., T] log-probabilities, float32 or float64.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"targets must have logits' leading shape {logits.shape[:-1]}, "
                         f"got {targets.shape}")
    logits = _at_least_float32(logits)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def next_token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    r"""Log-probs of each token of the sequences that produced the logits, shift applied.

    A causal model's ``logits[..., t, :]`` is the distribution of ``tokens[..., t + 1]``, so::

        out[..., 0] = 0                                       (nothing predicts the first token)
        out[..., t] = log softmax(logits[..., t - 1, :])[tokens[..., t]],   t >= 1

    The output is aligned with ``tokens``: a per-token mask (1 = model-generated) applies to it
    unshifted; position 0 is never generated and must be masked out.

    Args:
      logits: [..., T, V] the model's output on ``tokens``.
      tokens: [..., T] the input token ids.

    Returns:
      [..., T] log-probabilities, float32 or float64.
    """
    shifted = token_logprobs(logits[..., :-1, :], tokens[..., 1:])
    return jnp.concatenate([jnp.zeros_like(shifted[..., :1]), shifted], axis=-1)


def entropy(logits: jax.Array, mask: jax.Array) -> jax.Array:
    r"""Token mean of the entropy of the distributions at the masked-in positions.

    ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}``, averaged with :func:`aggregate`
    (token level), in at least float32. The mask is aligned with the logits' positions: with
    the shift convention, the distribution of a generated token t sits at ``logits[..., t - 1]``.

    Args:
      logits: [N, T, V].
      mask: [N, T].

    Returns:
      a scalar (nats).
    """
    logits = _at_least_float32(logits)
    per_token = jax.nn.logsumexp(logits, axis=-1) - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits,
                                                            axis=-1)
    return aggregate(per_token, mask)
