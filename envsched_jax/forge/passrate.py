"""Per-seed pass rates from verifier rewards of policy rollouts, with their uncertainty.

Envs-FORGE's selection starts from each seed's verifier pass rate under the current policy
(seeds/001 section 3; case V's 8/15 is such an estimate from 15 rollouts). A rollout *passes*
when its verifier reward is 1 (the gold standard of a terminal task: every test passed); the
estimate is passes / rollouts. Its uncertainty is the Jeffreys interval, the quantiles of
Beta(passes + 1/2, rollouts - passes + 1/2) (scipy.stats.beta), which stays inside [0, 1] and is
not degenerate at 0 or K passes, unlike the normal approximation. One choice of ours, the usual
convention for this interval: with no passes the lower end is 0, with every rollout passing the
upper end is 1 (the Beta quantiles alone would exclude the observed rate).

Input is any rollout log the project writes: JSON lines with ``task_id`` and ``reward`` (the
trajectory files of :mod:`envsched_jax.envs.trajectory` have both), or (task_id, reward) pairs.
Seeds never rolled out may take a predicted mean reward instead, e.g. EnvSched's posterior mean
(:func:`predicted_mean_rewards`); such estimates carry ``source="predicted"`` and no interval
(our addition: the paper estimates only from rollouts).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from scipy import stats

from envsched_jax.forge.candidates import ForgeInputError


@dataclasses.dataclass(frozen=True)
class PassRate:
    seed_id: str
    rate: float
    passes: int
    rollouts: int
    low: float | None            # Jeffreys interval at ``confidence`` (None for predictions)
    high: float | None
    source: Literal["rollouts", "predicted"]


def read_rollout_log(path: str | os.PathLike) -> list[tuple[str, float]]:
    """(task_id, reward) of every line of a JSON-lines rollout log; a bad line is an error naming
    the file, the line and the field."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ForgeInputError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ForgeInputError(f"{path}:{number}: a record must be a JSON object")
            for field in ("task_id", "reward"):
                if field not in record:
                    raise ForgeInputError(f"{path}:{number}: missing field {field!r}")
            out.append((record["task_id"], _reward(record["reward"], f"{path}:{number}: field 'reward'")))
            if not isinstance(record["task_id"], str):
                raise ForgeInputError(f"{path}:{number}: field 'task_id' must be a string")
    return out


def _reward(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ForgeInputError(f"{where} must be a finite number in [0, 1], got {value!r}")
    return float(value)


def estimate_pass_rates(records: Iterable[tuple[str, float]], seed_ids: Sequence[str], *,
                        predicted: Mapping[str, float] | None = None, confidence: float = 0.95,
                        min_rollouts: int = 1) -> dict[str, PassRate]:
    """Pass rate of every seed in ``seed_ids`` (records of other tasks are ignored).

    A seed with fewer than ``min_rollouts`` rollouts takes ``predicted[seed]`` when given; with
    neither it is an error naming the seeds (a guessed difficulty would silently steer the
    MILP)."""
    if not 0.0 < confidence < 1.0:
        raise ForgeInputError(f"confidence must lie in (0, 1), got {confidence!r}")
    wanted = set(seed_ids)
    passes = {s: 0 for s in seed_ids}
    counts = {s: 0 for s in seed_ids}
    for k, (task_id, reward) in enumerate(records):
        reward = _reward(reward, f"record {k} ({task_id!r}): reward")
        if task_id in wanted:
            counts[task_id] += 1
            passes[task_id] += reward == 1.0
    predicted = dict(predicted or {})
    out, missing = {}, []
    alpha = 1.0 - confidence
    for s in seed_ids:
        n, k = counts[s], passes[s]
        if n >= min_rollouts and n > 0:
            low, high = stats.beta.ppf([alpha / 2, 1 - alpha / 2], k + 0.5, n - k + 0.5)
            out[s] = PassRate(s, k / n, k, n, float(0.0 if k == 0 else low), float(1.0 if k == n else high),
                              "rollouts")
        elif s in predicted:
            rate = _reward(predicted[s], f"predicted[{s!r}]")
            out[s] = PassRate(s, rate, 0, n, None, None, "predicted")
        else:
            missing.append(s)
    if missing:
        raise ForgeInputError(f"{len(missing)} seed(s) have fewer than {min_rollouts} rollouts and no predicted "
                              f"reward: {missing[:5]}")
    return out


def predicted_mean_rewards(scheduler) -> dict[str, float]:
    """EnvSched's posterior mean reward of every task (the long half-life's yhat, the m component:
    eq. 10's fusion of the node's history with its graph prior), keyed by task id. Tasks never
    observed get the graph-propagated value; at step 0 there is nothing to propagate yet."""
    import jax

    from envsched_jax.sched import kernels

    if int(scheduler.state.step) == 0:
        raise ForgeInputError("the scheduler has observed nothing yet: no predicted rewards before step 1")
    scores = jax.jit(lambda state: kernels.score_pass(state, scheduler.config))(scheduler.state)
    mean = np.clip(np.asarray(scores.long.yhat[:, kernels.M], np.float64), 0.0, 1.0)
    return dict(zip(scheduler.graph.task_ids, mean.tolist()))
