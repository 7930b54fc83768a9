"""A RECONSTRUCTION inspired by LEEPS (Liang et al., arXiv 2607.28077), registered as
``leeps_reconstruction``. It does not reproduce LEEPS.

The LEEPS paper is not available to this project. The EnvSched paper describes it in one sentence:
it "combines representation-space neighbors, historical rollout outcomes, and explore-exploit
portfolios to select prompts likely to yield nonzero reward variance". Everything below is our own
reading of that sentence; each numbered item is a CHOICE, not something taken from LEEPS. Results
obtained with this scheduler must be reported as "LEEPS reconstruction", never as LEEPS.

1. Historical rollout outcomes: every task i holds a Beta(a_i, b_i) posterior over its success rate
   p_i, prior (1, 1), updated when the task is observed, with the same decay toward the prior as
   MoPPS: ``a <- lam a + (1 - lam) + K s``, ``b <- lam b + (1 - lam) + K (1 - s)``, s the group's
   binary accuracy (:mod:`envsched_jax.sched.outcomes`: a rollout is correct iff its reward
   >= 1 - 1e-6; partial credit counts as failure). Default lam = 0.5.
2. Representation-space neighbours: each task gets ``num_neighbors`` = 16 neighbours, fixed at
   construction: the most similar other tasks by the graph's dense ``s_full`` over the whole pool
   (any environment; ties to the lower index) when the graph has it, else the graph's candidate
   lists (``within_idx`` by S_full and ``cross_idx`` by S_abs) merged and ranked by their stored
   similarity. Weights w_ij = s_ij / sum_j s_ij over the neighbour list.
3. Neighbour transfer: the task's effective posterior adds the neighbours' evidence, scaled by
   ``neighbor_weight`` eta = 0.5: ``A_i = a_i + eta sum_j w_ij (a_j - 1)``, likewise B_i. A task
   never rolled out thus inherits half the evidence of an average neighbour.
4. Target, "likely to yield non-zero reward variance": the probability that a group of K is neither
   all correct nor all wrong under Beta(A_i, B_i), the Beta-binomial
   ``q_i = 1 - E[p^K] - E[(1 - p)^K]``, ``E[p^K] = prod_{j<K} (A + j) / (A + B + j)``.
5. Explore-exploit portfolio of three arms that fill the batch in this order, each from the tasks
   not yet taken: "exploit" (largest q_i), "thompson" (largest 1 - p^K - (1 - p)^K for one
   p ~ Beta(A_i, B_i) per task) and "explore" (fewest own observations). Ties follow a random
   permutation of the pool drawn from ``fold_in(key, t)``.
6. Portfolio shares adapt: each arm keeps a Beta posterior (prior (1, 1), decay ``arm_lam`` = 0.9
   toward it every step) of the fraction of its picks whose group was informative (0 < s < 1).
   Share of arm k = min_share + (1 - 3 min_share) m_k / sum m, m_k the posterior mean,
   min_share = 0.125; slots are floor(B share) with the remainder to the largest fractional parts
   (ties to the earlier arm).
7. The whole pool is scored each step (no candidate sub-pool). ``predicted_variance`` in the
   metrics is m (1 - m), m = A / (A + B), the binary variance at the predicted success rate.

State (:class:`LEEPSState`, also the checkpoint): ``a``, ``b`` [N], ``count`` [N], ``arm_a``,
``arm_b`` [3], ``key``. The neighbour lists are static (rebuilt from the graph).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envsched_jax.graph.build import PoolGraph
from envsched_jax.sched.base import Scheduler, register_scheduler
from envsched_jax.sched.outcomes import SUCCESS_THRESHOLD, informative, success_rate
from envsched_jax.sched.pytree_state import load_state_arrays, state_arrays

ARMS = ("exploit", "thompson", "explore")


@dataclasses.dataclass(frozen=True)
class LEEPSReconstructionConfig:
    """Settings of the LEEPS reconstruction (all values are our choices; see the module docstring)."""

    batch_size: int = 64
    """B: tasks per step."""
    group_size: int = 8
    """K: rollouts per task."""
    num_neighbors: int = 16
    """Representation-space neighbours per task."""
    neighbor_weight: float = 0.5
    """eta: weight of the neighbours' pooled evidence in a task's effective posterior."""
    lam: float = 0.5
    """Decay of an observed task's success posterior toward Beta(1, 1)."""
    arm_lam: float = 0.9
    """Per-step decay of each portfolio arm's yield posterior toward Beta(1, 1)."""
    min_share: float = 0.125
    """Smallest share of the batch any arm gets."""
    success_threshold: float = SUCCESS_THRESHOLD
    """A rollout is correct iff its reward is >= this."""

    def __post_init__(self):
        for name in ("batch_size", "group_size", "num_neighbors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lam", "arm_lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.neighbor_weight < 0:
            raise ValueError(f"neighbor_weight must be >= 0, got {self.neighbor_weight}")
        if not 0.0 <= self.min_share <= 1.0 / len(ARMS):
            raise ValueError(f"min_share must lie in [0, 1/3], got {self.min_share}")
        if not 0.0 < self.success_threshold <= 1.0:
            raise ValueError(f"success_threshold must lie in (0, 1], got {self.success_threshold}")


@struct.dataclass
class LEEPSState:
    a: jax.Array       # [N] float32, Beta successes (+ prior)
    b: jax.Array       # [N] float32, Beta failures (+ prior)
    count: jax.Array   # [N] int32, own observations
    arm_a: jax.Array   # [3] float32, informative picks per arm (+ prior)
    arm_b: jax.Array   # [3] float32, uninformative picks per arm (+ prior)
    key: jax.Array     # [2] uint32


def init_state(num_nodes: int, key: jax.Array) -> LEEPSState:
    ones = jnp.ones(num_nodes, jnp.float32)
    arms = jnp.ones(len(ARMS), jnp.float32)
    return LEEPSState(a=ones, b=ones, count=jnp.zeros(num_nodes, jnp.int32), arm_a=arms, arm_b=arms,
                      key=jnp.asarray(key, jnp.uint32))


def neighbour_lists(graph: PoolGraph, num_neighbors: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(idx [N, M] int32 padded with -1, weights [N, M] float32 summing to 1 per row or all 0)."""
    n = graph.num_nodes
    m = min(num_neighbors, n - 1)
    if graph.s_full is not None:
        idx = np.empty((n, m), np.int64)
        sim = np.empty((n, m), np.float32)
        for lo in range(0, n, block):
            rows = np.array(graph.s_full[lo:lo + block], np.float32)
            rows[np.arange(len(rows)), np.arange(lo, lo + len(rows))] = -np.inf   # not itself
            # top_k: the largest similarities first, ties to the lower index.
            top_sim, top = jax.lax.top_k(jnp.asarray(rows), m)
            idx[lo:lo + block] = np.asarray(top)
            sim[lo:lo + block] = np.asarray(top_sim)
    else:
        idx = np.concatenate([graph.within_idx, graph.cross_idx], axis=1).astype(np.int64)
        sim = np.concatenate([graph.within_sim, graph.cross_sim], axis=1).astype(np.float32)
        sim = np.where(idx >= 0, sim, -np.inf)
        order = np.argsort(-sim, axis=1, kind="stable")[:, :m]
        idx, sim = np.take_along_axis(idx, order, axis=1), np.take_along_axis(sim, order, axis=1)
    valid = (idx >= 0) & np.isfinite(sim)
    sim = np.where(valid, np.clip(sim, 0.0, None), 0.0)
    total = sim.sum(axis=1, keepdims=True)
    weights = np.divide(sim, total, out=np.zeros_like(sim), where=total > 0)
    return np.where(valid, idx, -1).astype(np.int32), weights.astype(np.float32)


def effective_posterior(state: LEEPSState, nbr_idx: jax.Array, nbr_w: jax.Array, neighbor_weight: float):
    """(A, B) [N]: own counts plus eta times the weighted mean of the neighbours' evidence."""
    safe = jnp.maximum(nbr_idx, 0)
    nb_a = jnp.sum(nbr_w * (state.a[safe] - 1.0), axis=1)
    nb_b = jnp.sum(nbr_w * (state.b[safe] - 1.0), axis=1)
    return state.a + neighbor_weight * nb_a, state.b + neighbor_weight * nb_b


def informative_probability(a: jax.Array, b: jax.Array, group_size: int) -> jax.Array:
    """P(0 < successes < K) for K = ``group_size`` draws with p ~ Beta(a, b) (Beta-binomial)."""
    j = jnp.arange(group_size, dtype=a.dtype)
    all_hit = jnp.prod((a[..., None] + j) / (a[..., None] + b[..., None] + j), axis=-1)
    all_miss = jnp.prod((b[..., None] + j) / (a[..., None] + b[..., None] + j), axis=-1)
    return 1.0 - all_hit - all_miss


def arm_slots(arm_a: jax.Array, arm_b: jax.Array, batch_size: int, min_share: float) -> jax.Array:
    """Slots per arm [3] int32, summing to ``batch_size`` (largest-remainder rounding)."""
    mean = arm_a / (arm_a + arm_b)
    share = min_share + (1.0 - len(ARMS) * min_share) * mean / jnp.sum(mean)
    raw = batch_size * share
    slots = jnp.floor(raw).astype(jnp.int32)
    remainder = batch_size - jnp.sum(slots)
    order = jnp.argsort(-(raw - slots), stable=True)
    bonus = jnp.zeros(len(ARMS), jnp.int32).at[order].set((jnp.arange(len(ARMS)) < remainder).astype(jnp.int32))
    return slots + bonus


@functools.partial(jax.jit, static_argnames=("config",))
def select(state: LEEPSState, nbr_idx, nbr_w, step, *, config: LEEPSReconstructionConfig):
    """(batch [B], arm of each pick [B], effective posterior mean of each pick [B])."""
    n, size = state.a.shape[0], config.batch_size
    key_perm, key_sample = jax.random.split(jax.random.fold_in(state.key, step))
    a, b = effective_posterior(state, nbr_idx, nbr_w, config.neighbor_weight)
    p = jax.random.beta(key_sample, a, b)
    k = config.group_size
    scores = (informative_probability(a, b, k), 1.0 - p ** k - (1.0 - p) ** k,
              -state.count.astype(jnp.float32))
    slots = arm_slots(state.arm_a, state.arm_b, size, config.min_share)
    perm = jax.random.permutation(key_perm, n)
    taken = jnp.zeros(n, bool)
    ranked = []
    for arm, score in enumerate(scores):
        _, pos = jax.lax.top_k(jnp.where(taken, -jnp.inf, score)[perm], size)
        order = perm[pos]
        taken = taken | jnp.zeros(n, bool).at[order].set(jnp.arange(size) < slots[arm])
        ranked.append(order)
    slot = jnp.arange(size)
    ends = jnp.cumsum(slots)
    arm_of = jnp.searchsorted(ends, slot, side="right").astype(jnp.int32)
    batch = jnp.stack(ranked)[arm_of, slot - (ends - slots)[arm_of]]
    return batch, arm_of, a[batch] / (a[batch] + b[batch])


@functools.partial(jax.jit, static_argnames=("config",))
def observe(state: LEEPSState, nodes, arms, rewards, *, config: LEEPSReconstructionConfig) -> LEEPSState:
    """Update the observed tasks ``nodes`` [B] and the yields of the arms ``arms`` [B] that picked them."""
    k = rewards.shape[-1]
    hits = k * success_rate(rewards, config.success_threshold)
    lam = config.lam
    a = state.a.at[nodes].set(lam * state.a[nodes] + (1.0 - lam) + hits)
    b = state.b.at[nodes].set(lam * state.b[nodes] + (1.0 - lam) + (k - hits))
    good = informative(rewards, config.success_threshold).astype(jnp.float32)
    arm_hits = jnp.zeros(len(ARMS), jnp.float32).at[arms].add(good)
    arm_picks = jnp.zeros(len(ARMS), jnp.float32).at[arms].add(1.0)
    keep = config.arm_lam
    return state.replace(a=a, b=b, count=state.count.at[nodes].add(1),
                         arm_a=keep * state.arm_a + (1.0 - keep) + arm_hits,
                         arm_b=keep * state.arm_b + (1.0 - keep) + arm_picks - arm_hits)


@register_scheduler("leeps_reconstruction")
class LEEPSReconstruction(Scheduler):
    """Our reconstruction inspired by LEEPS (not LEEPS itself; see the module docstring).

    Args:
        graph: the pool's graph (dense ``s_full`` or candidate lists give the neighbours).
        config: :class:`LEEPSReconstructionConfig`; keyword ``overrides`` replace single fields.
        seed: seeds the tie-breaking permutations and Thompson samples.
        tools_per_env: tool names per environment, for the metrics.
    """

    name = "leeps_reconstruction"

    def __init__(self, graph: PoolGraph, config: LEEPSReconstructionConfig | None = None, *, seed: int = 0,
                 tools_per_env: Sequence[Sequence[str]] | None = None, **overrides):
        config = dataclasses.replace(config or LEEPSReconstructionConfig(), **overrides)
        super().__init__(graph, config.batch_size, config.group_size, tools_per_env)
        self.config = config
        idx, w = neighbour_lists(graph, config.num_neighbors)
        self._nbr_idx, self._nbr_w = jnp.asarray(idx), jnp.asarray(w)
        self.state = init_state(self.num_nodes, jax.random.PRNGKey(seed))
        self._pending_arms: dict[int, int] = {}

    def _select(self, step):
        batch, arms, mean = select(self.state, self._nbr_idx, self._nbr_w, step, config=self.config)
        nodes, arms, mean = np.asarray(batch), np.asarray(arms), np.asarray(mean, np.float64)
        self._pending_arms = dict(zip(nodes.tolist(), arms.tolist()))
        return nodes, [ARMS[k] for k in arms], (mean * (1 - mean)).tolist(), {}

    def _observe(self, step, nodes, rewards):
        arms = np.array([self._pending_arms[int(i)] for i in nodes], np.int32)
        self.state = observe(self.state, jnp.asarray(nodes, jnp.int32), jnp.asarray(arms),
                             jnp.asarray(rewards, jnp.float32), config=self.config)

    def _state_arrays(self):
        return state_arrays(self.state)

    def _load_state_arrays(self, arrays):
        self.state = load_state_arrays(self.state, arrays)
