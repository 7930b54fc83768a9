"""Plain NumPy reference of the learner's objectives (tests only).

Written from the equations in ``envsched_jax/learner/objectives.py``'s docstrings, for
readability: explicit loops over sequences and tokens, float64 throughout, no shared code with the
JAX implementation. Options are plain keyword arguments mirroring ``GRPOConfig``'s fields.
"""

from __future__ import annotations

import math

import numpy as np


def group_advantages(rewards, *, advantage_clip=0.2, whiten=True, whiten_eps=1e-6):
    """[B, K] rewards -> [B, K] advantages: centre per group, whiten over the batch, clip;
    a group of equal rewards gets exactly 0."""
    rewards = np.asarray(rewards, dtype=np.float64)
    constant = [group.max() == group.min() for group in rewards]
    centred = np.zeros_like(rewards)
    for b, group in enumerate(rewards):
        if not constant[b]:
            centred[b] = group - group.mean()
    if whiten and not all(constant):
        flat = centred.ravel()
        std = math.sqrt(float(np.mean((flat - flat.mean()) ** 2)))
        for b in range(len(rewards)):
            if not constant[b]:  # constant groups stay exactly 0
                centred[b] = (centred[b] - flat.mean()) / (std + whiten_eps)
    return np.clip(centred, -advantage_clip, advantage_clip)


def aggregate(values, mask, how="token"):
    """Masked token mean over the batch, or mean over non-empty sequences of their token means."""
    values = np.asarray(values, dtype=np.float64)
    mask = np.asarray(mask) != 0
    if how == "token":
        picked = [values[n, t] for n in range(values.shape[0]) for t in range(values.shape[1])
                  if mask[n, t]]
        return float(np.sum(picked)) / len(picked) if picked else 0.0
    means = []
    for n in range(values.shape[0]):
        picked = [values[n, t] for t in range(values.shape[1]) if mask[n, t]]
        if picked:
            means.append(float(np.sum(picked)) / len(picked))
    return float(np.mean(means)) if means else 0.0


def grpo_loss(logp, old_logp, advantages, mask, *, clip_eps=0.2, clip_eps_high=None,
              kl_coef=0.0, kl_estimator="k3", loss_aggregation="token", ref_logp=None):
    """(loss, metrics) of the clipped surrogate, token by token."""
    logp = np.asarray(logp, dtype=np.float64)
    old_logp = np.asarray(old_logp, dtype=np.float64)
    advantages = np.asarray(advantages, dtype=np.float64)
    mask = np.asarray(mask) != 0
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    n_seq, n_tok = logp.shape
    objective = np.zeros((n_seq, n_tok))
    clipped_active = np.zeros((n_seq, n_tok))
    ratio = np.ones((n_seq, n_tok))
    approx_kl = np.zeros((n_seq, n_tok))
    kl = np.zeros((n_seq, n_tok))
    for n in range(n_seq):
        a = advantages[n]
        for t in range(n_tok):
            if not mask[n, t]:
                continue
            r = math.exp(logp[n, t] - old_logp[n, t])
            unclipped = r * a
            clipped = min(max(r, 1.0 - clip_eps), 1.0 + eps_high) * a
            objective[n, t] = min(unclipped, clipped)
            clipped_active[n, t] = float(clipped < unclipped)
            ratio[n, t] = r
            approx_kl[n, t] = (r - 1.0) - math.log(r)
            if ref_logp is not None:
                d = float(ref_logp[n, t]) - logp[n, t]
                kl[n, t] = (math.exp(d) - d - 1.0) if kl_estimator == "k3" else -d
    policy_loss = -aggregate(objective, mask, loss_aggregation)
    metrics = {
        "policy_loss": policy_loss,
        "clip_fraction": aggregate(clipped_active, mask),
        "approx_kl_old": aggregate(approx_kl, mask),
        "ratio_mean": aggregate(ratio, mask),
        "num_tokens": float(mask.sum()),
    }
    loss = policy_loss
    if ref_logp is not None:
        metrics["kl_ref"] = aggregate(kl, mask, loss_aggregation)
        loss += kl_coef * metrics["kl_ref"]
    return loss, metrics


def sft_loss(logp, mask, aggregation="token"):
    """Mean negative log-likelihood of the masked-in tokens."""
    return -aggregate(logp, mask, aggregation)


def token_logprobs(logits, targets):
    """[N, T, V], [N, T] -> [N, T]: log softmax(logits[n, t])[targets[n, t]], no shift."""
    logits = np.asarray(logits, dtype=np.float64)
    out = np.zeros(logits.shape[:2])
    for n in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            z = logits[n, t]
            top = z.max()
            out[n, t] = z[targets[n, t]] - (top + math.log(np.sum(np.exp(z - top))))
    return out


def next_token_logprobs(logits, tokens):
    """[N, T, V], [N, T] -> [N, T]: entry t is log p(tokens[t] | logits[t - 1]); entry 0 is 0."""
    out = np.zeros(np.shape(tokens))
    out[:, 1:] = token_logprobs(np.asarray(logits)[:, :-1], np.asarray(tokens)[:, 1:])
    return out


def entropy(logits, mask):
    """Token mean over the masked-in positions of -sum_v p_v log p_v."""
    logits = np.asarray(logits, dtype=np.float64)
    per_token = np.zeros(logits.shape[:2])
    for n in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            z = logits[n, t] - logits[n, t].max()
            p = np.exp(z) / np.sum(np.exp(z))
            per_token[n, t] = -np.sum(p * np.log(p))
    return aggregate(per_token, mask)
