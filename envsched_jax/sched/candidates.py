"""Candidate pools of the prompt-level baselines (DPS, MoPPS): which k B tasks a step may choose from.

Both authors' trainers (verl forks; DPS ``maoyixiu/DPS`` recipe/dps, MoPPS ``thu-rllab/MoPPS``
recipe/ours) score one *data-loader batch* per step: the loader's batch size is
C = min(k B, N), its sampler a seeded shuffle of the whole training set drawn anew at the start of
every epoch, and ``drop_last=True``. So within an epoch the candidate pools are consecutive,
disjoint chunks of one permutation, the last N mod C tasks of each epoch are never candidates in
that epoch, and each epoch reshuffles. When k B >= N (every DPS recipe and MoPPS's countdown and
geo3k recipes) every step is an epoch whose pool is the whole set, reshuffled.

Two modes, a field of each baseline's config:

- ``"epoch"`` (default, the authors' loader): step t belongs to epoch e = t // E with
  E = N // C pools per epoch, and takes chunk t mod E of the permutation of epoch e. The
  permutation is ``jax.random.permutation(fold_in(fold_in(key, EPOCH_STREAM), e), N)``, so the
  pool of step t is a pure function of the scheduler's key (saved in its checkpoint: the seeded
  generator) and t, and a restored run draws exactly the pools it would have drawn.
- ``"per_step"``: an independent random subset of C tasks every step
  (``permutation(fold_in(key, t), N)[:C]``), this project's behaviour before the authors' loader
  was matched. Pools of nearby steps overlap and single tasks are re-offered more often; the two
  modes agree only when k B >= N.

Drawing a permutation of N is the expensive part of a baseline's step (about 11 ms at N = 20,000
on a 2-core CPU, more than the rest of a DPS step), so the scheduler objects draw pools through a
:class:`PoolCache`: one permutation per epoch (per step in ``"per_step"`` mode), shared by the
step's select and observe, and exactly the pools :func:`candidate_pool` gives (tested).

Differences from the authors' loader that remain: the permutations come from JAX's PRNG, not a
torch generator seeded with 1, so the same seed does not give the authors' order; and the
scheduler's step counts generation batches, as the authors' loader does (with DAPO-style
filtering, every generation round takes the next pool, :mod:`envsched_jax.sched.dynamic_sampling`).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

CandidateMode = Literal["epoch", "per_step"]
CANDIDATE_MODES: tuple[str, ...] = ("epoch", "per_step")

EPOCH_STREAM = 0x45504F43
"""``fold_in`` tag that separates the epoch permutations from the per-step draws of the same key."""


def pools_per_epoch(num_nodes: int, num_candidates: int) -> int:
    """E = N // C: the disjoint pools of one epoch (the loader's ``drop_last=True``)."""
    if not 1 <= num_candidates <= num_nodes:
        raise ValueError(f"num_candidates must lie in [1, {num_nodes}], got {num_candidates}")
    return num_nodes // num_candidates


def check_mode(mode: str) -> None:
    if mode not in CANDIDATE_MODES:
        raise ValueError(f"candidate_pool must be one of {CANDIDATE_MODES}, got {mode!r}")


def candidate_pool(key: jax.Array, step, *, num_nodes: int, num_candidates: int,
                   mode: CandidateMode = "epoch") -> jax.Array:
    """The ``num_candidates`` distinct task indices step ``step`` may choose from, in random order.

    Jittable; ``step`` may be traced (``num_nodes``, ``num_candidates`` and ``mode`` are static).
    """
    check_mode(mode)
    if mode == "per_step":
        return jax.random.permutation(jax.random.fold_in(key, step), num_nodes)[:num_candidates]
    per_epoch = pools_per_epoch(num_nodes, num_candidates)
    step = jnp.asarray(step, jnp.int32)
    epoch, position = step // per_epoch, step % per_epoch
    order = epoch_order(key, epoch, num_nodes=num_nodes)
    return jax.lax.dynamic_slice(order, (position * num_candidates,), (num_candidates,))


@functools.partial(jax.jit, static_argnames=("num_nodes",))
def epoch_order(key: jax.Array, epoch, *, num_nodes: int) -> jax.Array:
    """The permutation of epoch ``epoch`` whose consecutive chunks are that epoch's pools. [N]."""
    return jax.random.permutation(jax.random.fold_in(jax.random.fold_in(key, EPOCH_STREAM), epoch),
                                  num_nodes)


@functools.partial(jax.jit, static_argnames=("num_nodes", "num_candidates"))
def _per_step_pool(key, step, *, num_nodes: int, num_candidates: int) -> jax.Array:
    return candidate_pool(key, step, num_nodes=num_nodes, num_candidates=num_candidates,
                          mode="per_step")


class PoolCache:
    """``candidate_pool`` for a scheduler object, drawing each permutation once.

    ``cache(key, step)`` returns exactly ``candidate_pool(key, step, ...)``. In ``"epoch"`` mode
    it keeps the current epoch's permutation (redrawn when the epoch or the key changes, e.g.
    after a checkpoint restore); in ``"per_step"`` mode the last step's pool, so a step's select
    and observe share one draw. Only a speed-up: the pools are a pure function of key and step.
    """

    def __init__(self, num_nodes: int, num_candidates: int, mode: CandidateMode = "epoch"):
        check_mode(mode)
        self.num_nodes, self.num_candidates, self.mode = num_nodes, num_candidates, mode
        self.per_epoch = pools_per_epoch(num_nodes, num_candidates)
        self._tag: tuple | None = None
        self._value: jax.Array | None = None

    def __call__(self, key: jax.Array, step: int) -> jax.Array:
        step = int(step)
        key_bytes = np.asarray(key).tobytes()
        if self.mode == "per_step":
            tag = (key_bytes, step)
            if tag != self._tag:
                self._value = _per_step_pool(key, step, num_nodes=self.num_nodes,
                                             num_candidates=self.num_candidates)
                self._tag = tag
            return self._value
        epoch, position = divmod(step, self.per_epoch)
        tag = (key_bytes, epoch)
        if tag != self._tag:
            self._value = epoch_order(key, epoch, num_nodes=self.num_nodes)
            self._tag = tag
        start = position * self.num_candidates
        return self._value[start:start + self.num_candidates]
