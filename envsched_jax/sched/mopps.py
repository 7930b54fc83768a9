"""MoPPS, Model Predictive Prompt Selection (Qu et al., arXiv 2507.04632), under the shared API.

Written from the paper and from reading the authors' sampler and trainer (``thu-rllab/MoPPS``,
recipe/ours: ``mopps.py``, ``our_ray_trainer.py``, ``main_generation_prior.py`` and the recipe
scripts); no code copied. Checked against that code run unchanged on the same selections and
outcomes (the posteriors agree to float32 rounding; the batches agree exactly when the random
draws are aligned).

Every task i holds a Beta(alpha_i, beta_i) posterior over its success rate, prior (1, 1).

- select(t): the step's candidate pool of C = min(k B, N) tasks
  (:mod:`envsched_jax.sched.candidates`: by default the authors' epoch-wise loader); one Thompson
  sample ``r_i ~ Beta(alpha_i, beta_i)`` per candidate; then ``strategy``:

  - ``"topk"`` (the authors' default): the B candidates with the smallest ``(r_i - target)^2``,
    target = 0.5;
  - ``"threshold"``: if at least B samples lie in [lower, upper] (0.3, 0.7), B of them uniformly at
    random; otherwise all of them plus the candidates whose samples lie nearest the band
    (distance lower - r below it, r - upper above it);
  - ``"uniform"``: B candidates uniformly at random.

- observe(t), selected tasks only (the others are left exactly as they were)::

      alpha <- lam alpha + (1 - lam) 1 + n y
      beta  <- lam beta  + (1 - lam) 1 + n (1 - y)

  with n = K rollouts and y the group's score (``metric="acc"``: the fraction of rollouts with
  reward >= ``success_threshold``, partial credit counting as failure; ``"score"``: the mean raw
  reward), so n y is the number of fully successful rollouts under ``"acc"``. With ``no_update``
  nothing changes.

Offline prior and saved bandits (files keyed by task id; the authors key them by dataset index):

- ``init_scores``: a JSON object ``{task_id: [score, ...]}`` of earlier rollouts' scores per task
  (the authors' ``bandit_init`` / ``index_score.json`` made by ``main_generation_prior.py``);
  each listed task starts at alpha = w successes + 1, beta = w failures + 1 with successes the
  sum of its scores, failures their count minus that sum, and w = ``init_weight`` (the authors: 3);
- ``load_bandit``: a JSON object ``{task_id: [alpha, beta]}`` as :meth:`MoPPS.save_bandit` writes
  (the authors' saved ``index_score.json``), applied after ``init_scores``; listed tasks take
  those values, the others keep theirs.

Unknown task ids, malformed JSON, and scores or parameters that are not finite numbers of the
right range raise :class:`~envsched_jax.sched.errors.SchedulerInputError` naming the file and
entry; nothing is half-applied.

Recipes (:data:`MOPPS_RECIPES`): countdown and geo3k k = 8, lam = 0.5, top-k; MATH k = 16,
lam = 1.0 (no decay), top-k (``"math"``), the threshold strategy (``"math_threshold"``), or top-k
from an offline prior (``"math_init"``, which needs ``init_scores``). n = 8 rollouts in all; B and
K stay the caller's.

What differs from the authors' code, and why (also in docs/guides/scheduling.md):

- success threshold: reward >= 1 - 1e-6 (authors: >= 1) (:mod:`envsched_jax.sched.outcomes`);
- with one rollout per task (n = 1) the authors' update reads ``X = <update> if n > 1 else 8``
  (an operator-precedence slip: the conditional binds looser than ``+``), so every observed task
  becomes Beta(8, 8) whatever its outcome; their README meant 8 pseudo-rollouts. No recipe uses
  n = 1. This project applies the update as written above for every n and does not reproduce
  either reading;
- the random streams are JAX's: pools, Thompson samples and the threshold shuffle of step t come
  from the scheduler's key and t (a restored run continues identically). The authors draw from
  numpy's global generator, unseeded at start and reseeded to 42 by every validation pass of
  verl, so their draws depend on when validation ran;
- a missing or unreadable ``init_scores`` / ``load_bandit`` file is an error here; the authors'
  loader ignores failures silently.

State (:class:`MoPPSState`, also the checkpoint): ``alpha`` [N], ``beta`` [N], ``key``.
``predicted_variance`` in the metrics is the Bernoulli variance of the posterior mean,
m (1 - m) with m = alpha / (alpha + beta).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler
from envsched_jax.sched.candidates import CandidateMode, PoolCache, candidate_pool, check_mode
from envsched_jax.sched.errors import SchedulerInputError
from envsched_jax.sched.outcomes import SUCCESS_THRESHOLD, success_rate
from envsched_jax.sched.pytree_state import load_state_arrays, state_arrays

STRATEGIES = ("topk", "threshold", "uniform")
METRICS = ("acc", "score")

MOPPS_RECIPES: dict[str, dict[str, object]] = {
    # The authors' recipe scripts (recipe/ours/scripts/**); n = 8 rollouts in all.
    "countdown": {"candidate_ratio": 8, "lam": 0.5, "strategy": "topk"},
    "geo3k": {"candidate_ratio": 8, "lam": 0.5, "strategy": "topk"},
    "math": {"candidate_ratio": 16, "lam": 1.0, "strategy": "topk"},
    "math_threshold": {"candidate_ratio": 16, "lam": 1.0, "strategy": "threshold"},
    "math_init": {"candidate_ratio": 16, "lam": 1.0, "strategy": "topk"},
}


@dataclasses.dataclass(frozen=True)
class MoPPSConfig:
    """MoPPS settings; defaults are the authors' countdown / geo3k recipe (:data:`MOPPS_RECIPES`)."""

    batch_size: int = 64
    """B: tasks per step."""
    group_size: int = 8
    """K (the recipe's n): rollouts per task."""
    candidate_ratio: int = 8
    """k: a pool of min(k B, N) candidates is scored (16 on MATH, 8 elsewhere)."""
    lam: float = 0.5
    """Decay of a selected task's posterior toward the prior (1.0 on MATH, 0.5 elsewhere)."""
    strategy: Literal["topk", "threshold", "uniform"] = "topk"
    """How B tasks are kept from the pool (module docstring)."""
    target: float = 0.5
    """Success rate the Thompson samples are ranked toward (``"topk"``)."""
    lower: float = 0.3
    """Lower bound of the ``"threshold"`` band."""
    upper: float = 0.7
    """Upper bound of the ``"threshold"`` band."""
    no_update: bool = False
    """Observations change nothing (the authors' ``bandit_no_update``)."""
    metric: Literal["acc", "score"] = "acc"
    """The group's score y: binary accuracy (``"acc"``, the authors' default) or the mean reward."""
    candidate_pool: CandidateMode = "epoch"
    """``"epoch"``: the authors' loader; ``"per_step"``: a fresh random subset each step."""
    init_scores: str | None = None
    """A JSON file ``{task_id: [score, ...]}``: the offline prior (the authors' ``bandit_init``)."""
    init_weight: float = 3.0
    """w of the offline prior: alpha = w successes + 1, beta = w failures + 1 (the authors: 3)."""
    load_bandit: str | None = None
    """A JSON file ``{task_id: [alpha, beta]}`` (:meth:`MoPPS.save_bandit`), applied after
    ``init_scores``."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this (``metric="acc"``)."""

    def __post_init__(self):
        for name in ("batch_size", "group_size", "candidate_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoPPSConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("lam", "target", "lower", "upper"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MoPPSConfig.{name} must lie in [0, 1], got {getattr(self, name)!r}")
        if self.lower > self.upper:
            raise ValueError(f"MoPPSConfig.lower ({self.lower}) must not exceed upper ({self.upper})")
        for name, allowed in (("strategy", STRATEGIES), ("metric", METRICS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"MoPPSConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        check_mode(self.candidate_pool)
        if not (math.isfinite(self.init_weight) and self.init_weight >= 0):
            raise ValueError(f"MoPPSConfig.init_weight must be a finite number >= 0, got {self.init_weight!r}")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"MoPPSConfig.success_threshold must lie in (0, 1], got {self.success_threshold!r}")

    @classmethod
    def for_recipe(cls, recipe: str, **overrides) -> MoPPSConfig:
        """The authors' settings for ``recipe`` (:data:`MOPPS_RECIPES`), then ``overrides``
        (B and K are always the caller's). ``"math_init"`` needs ``init_scores=PATH``."""
        if recipe not in MOPPS_RECIPES:
            raise ValueError(f"unknown MoPPS recipe {recipe!r}; known: {', '.join(MOPPS_RECIPES)}")
        config = cls(**{**MOPPS_RECIPES[recipe], **overrides})
        if recipe == "math_init" and config.init_scores is None:
            raise ValueError("MoPPS recipe 'math_init' starts from an offline prior: give "
                             "init_scores=PATH, a JSON file {task_id: [score, ...]}")
        return config


@struct.dataclass
class MoPPSState:
    alpha: jax.Array   # [N] float32, Beta successes (+ prior)
    beta: jax.Array    # [N] float32, Beta failures (+ prior)
    key: jax.Array     # [2] uint32


def init_state(num_nodes: int, key: jax.Array) -> MoPPSState:
    ones = jnp.ones(num_nodes, jnp.float32)
    return MoPPSState(alpha=ones, beta=ones, key=jnp.asarray(key, jnp.uint32))


SAMPLE_STREAM = 0x54484F4D
"""``fold_in`` tag of the Thompson samples and strategy draws (separate from the pools')."""


@functools.partial(jax.jit, static_argnames=("batch_size", "num_candidates", "strategy", "mode"))
def select(state: MoPPSState, step, *, batch_size: int, num_candidates: int, strategy: str = "topk",
           target=0.5, lower=0.3, upper=0.7, mode: str = "epoch",
           candidates: jax.Array | None = None) -> jax.Array:
    """B tasks of the step's candidate pool by ``strategy`` on Thompson samples. [B].

    ``candidates``: the step's pool when the caller has drawn it already (it must equal
    ``candidate_pool(state.key, step, ...)``); None draws it here."""
    if candidates is None:
        candidates = candidate_pool(state.key, step, num_nodes=state.alpha.shape[0],
                                    num_candidates=num_candidates, mode=mode)
    key_sample, key_order = jax.random.split(
        jax.random.fold_in(jax.random.fold_in(state.key, SAMPLE_STREAM), step))
    if strategy == "uniform":
        return jax.random.permutation(key_order, candidates)[:batch_size]
    r = jax.random.beta(key_sample, state.alpha[candidates], state.beta[candidates])
    if strategy == "topk":
        _, pos = jax.lax.top_k(-(r - target) ** 2, batch_size)
        return candidates[pos]
    # "threshold": distance to the band (0 inside), random order among equal distances, so that
    # B in-band samples are a uniform choice when there are that many, else all of them first.
    distance = jnp.where(r < lower, lower - r, jnp.where(r > upper, r - upper, 0.0))
    order = jnp.lexsort((jax.random.uniform(key_order, r.shape), distance))
    return candidates[order[:batch_size]]


@functools.partial(jax.jit, static_argnames=("config",))
def observe(state: MoPPSState, nodes: jax.Array, rewards: jax.Array, *, config: MoPPSConfig) -> MoPPSState:
    """Posterior update of the selected tasks ``nodes`` [B] from their groups ``rewards`` [B, K]."""
    if config.no_update:
        return state
    n = rewards.shape[-1]
    y = (success_rate(rewards, config.success_threshold) if config.metric == "acc"
         else jnp.mean(rewards, axis=-1))
    lam = config.lam
    alpha = state.alpha.at[nodes].set(lam * state.alpha[nodes] + (1.0 - lam) + n * y)
    beta = state.beta.at[nodes].set(lam * state.beta[nodes] + (1.0 - lam) + n * (1.0 - y))
    return state.replace(alpha=alpha, beta=beta)


def _read_json_object(path: str | Path, what: str) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise SchedulerInputError(f"MoPPS {what} {path}: cannot be read ({err.strerror or err})") from None
    except json.JSONDecodeError as err:
        raise SchedulerInputError(f"MoPPS {what} {path}: not JSON ({err.msg} at line {err.lineno}, "
                                  f"column {err.colno})") from None
    if not isinstance(data, dict):
        raise SchedulerInputError(f"MoPPS {what} {path}: expected a JSON object {{task_id: ...}}, "
                                  f"got {type(data).__name__}")
    return data


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def offline_prior(scores: Mapping[str, Sequence[float]], index: Mapping[str, int], *, weight: float,
                  source: str) -> dict[int, tuple[float, float]]:
    """(alpha, beta) per node from earlier scores: w successes + 1, w failures + 1."""
    out = {}
    for tid, values in scores.items():
        if tid not in index:
            raise SchedulerInputError(f"MoPPS init_scores {source}: unknown task id {tid!r}")
        if not isinstance(values, list) or not values or not all(_number(v) and 0 <= v <= 1 for v in values):
            raise SchedulerInputError(f"MoPPS init_scores {source}: task {tid!r} must map to a non-empty "
                                      f"list of scores in [0, 1], got {values!r:.80}")
        successes = float(sum(values))
        out[index[tid]] = (weight * successes + 1.0, weight * (len(values) - successes) + 1.0)
    return out


def saved_bandit(entries: Mapping[str, Sequence[float]], index: Mapping[str, int], *,
                 source: str) -> dict[int, tuple[float, float]]:
    """(alpha, beta) per node from a saved bandit ``{task_id: [alpha, beta]}``."""
    out = {}
    for tid, values in entries.items():
        if tid not in index:
            raise SchedulerInputError(f"MoPPS load_bandit {source}: unknown task id {tid!r}")
        if not (isinstance(values, list) and len(values) == 2 and all(_number(v) and v > 0 for v in values)):
            raise SchedulerInputError(f"MoPPS load_bandit {source}: task {tid!r} must map to [alpha, beta] "
                                      f"with both > 0, got {values!r:.80}")
        out[index[tid]] = (float(values[0]), float(values[1]))
    return out


@register_scheduler("mopps")
class MoPPS(Scheduler):
    """MoPPS under the shared API (see the module docstring).

    Args:
        graph: the pool's graph (MoPPS reads only the task ids).
        config: :class:`MoPPSConfig`; keyword ``overrides`` replace single fields.
        recipe: start from the authors' settings for this recipe (:data:`MOPPS_RECIPES`);
            ``config`` and ``recipe`` are exclusive.
        seed: seeds the candidate pools and Thompson samples.
        tools_per_env: tool names per environment, for the metrics.
    """

    name = "mopps"

    def __init__(self, graph: PoolGraph, config: MoPPSConfig | None = None, *, recipe: str | None = None,
                 seed: int = 0, tools_per_env: Sequence[Sequence[str]] | None = None, **overrides):
        if recipe is not None:
            if config is not None:
                raise ValueError("MoPPS: give either config or recipe, not both")
            config = MoPPSConfig.for_recipe(recipe, **overrides)
        else:
            config = dataclasses.replace(config or MoPPSConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        self.config = config
        self.num_candidates = min(config.candidate_ratio * config.batch_size, self.num_nodes)
        self._pools = PoolCache(self.num_nodes, self.num_candidates, config.candidate_pool)
        state = init_state(self.num_nodes, jax.random.PRNGKey(seed))
        alpha, beta = np.asarray(state.alpha).copy(), np.asarray(state.beta).copy()
        updates = {}
        if config.init_scores is not None:
            updates.update(offline_prior(_read_json_object(config.init_scores, "init_scores"), self._index,
                                         weight=config.init_weight, source=str(config.init_scores)))
        if config.load_bandit is not None:
            updates.update(saved_bandit(_read_json_object(config.load_bandit, "load_bandit"), self._index,
                                        source=str(config.load_bandit)))
        for node, (a, b) in updates.items():
            alpha[node], beta[node] = a, b
        self.state = state.replace(alpha=jnp.asarray(alpha, jnp.float32), beta=jnp.asarray(beta, jnp.float32))

    def _select(self, step):
        c = self.config
        nodes = np.asarray(select(self.state, step, batch_size=self.batch_size,
                                  num_candidates=self.num_candidates, strategy=c.strategy,
                                  target=c.target, lower=c.lower, upper=c.upper, mode=c.candidate_pool,
                                  candidates=self._pools(self.state.key, step)))
        a, b = np.asarray(self.state.alpha)[nodes], np.asarray(self.state.beta)[nodes]
        mean = a / (a + b)
        return nodes, ["mopps"] * self.batch_size, (mean * (1 - mean)).astype(float).tolist(), {}

    def _observe(self, step, nodes, rewards):
        self.state = observe(self.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(rewards, jnp.float32),
                             config=self.config)

    def save_bandit(self, path: str | Path) -> Path:
        """Write ``{task_id: [alpha, beta]}`` for every task (the authors' saved-bandit format,
        keyed by task id), readable by ``load_bandit``. The scheduler checkpoint
        (:mod:`envsched_jax.sched.checkpoint`) is what resumes a run; this file moves a learnt
        posterior between runs."""
        path = Path(path)
        alpha, beta = np.asarray(self.state.alpha), np.asarray(self.state.beta)
        data = {tid: [float(alpha[i]), float(beta[i])] for i, tid in enumerate(self.graph.task_ids)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
        return path

    def _state_arrays(self):
        return state_arrays(self.state)

    def _load_state_arrays(self, arrays):
        self.state = load_state_arrays(self.state, arrays)
