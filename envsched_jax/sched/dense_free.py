"""EnvSched without dense similarity matrices: the greedy selection, the observation update and
the cold start reading ``S_full`` / ``S_abs`` entries computed on demand.

The dense path (:mod:`.kernels`) reads whole rows of the N x N matrices: the similarity penalty
of eq. 5 keeps ``lambda_sim max_b S_full[b, :]`` for every node, and observing a new node reads
its ``S_full`` and ``S_abs`` rows. At 10^5 - 10^6 tasks those matrices cannot exist (74.5 GiB at
100,000). This module makes the same decisions from a *similarity source*: anything with

- ``block(rows [R], cols [C]) -> [R, C]``: ``S_full[rows[r], cols[c]]``, 0 where an index is -1;
- ``abs_rows(rows [R]) -> [R, N]``: whole rows of ``S_abs``, zeros for a -1 row;
- ``num_nodes`` and ``dtype`` (of the values);

all jit-compatible (a source is a pytree passed into the compiled step). :class:`DenseSimilarity` wraps the dense matrices (tests, small pools);
:func:`envsched_jax.graph.feature_rows.graph_similarity` computes the entries from the graph's
feature rows, bit for bit the dense matrices' values, in O(N x features) memory.

Exact lazy greedy (CHOICE: how the penalty is evaluated; the batches are the dense path's)
----------------------------------------------------------------------------------------
A pick maximises ``base_j - pen_j`` over a candidate mask (``base`` = q for coverage picks,
q omega for exploitation picks; ``pen_j = max(0, max_b fl(lambda_sim S_full[b, j]))`` over the
batch so far), ties to the lower index. ``pen`` only grows as the batch grows, so a penalty
computed against the first k' picks is a lower bound of the current one, and
``fl(base_j - stale_pen_j)`` is an upper bound of node j's exact score (rounding is monotone).
Each node carries its penalty and the number of picks it includes (``fresh_at``). A pick takes
the argmax of the bounds; if that node's penalty is current, no other node can beat it (its
bound is its exact score, every other exact score is at most its bound, and a lower-indexed
node with an equal bound would have been the argmax), so it is the dense path's pick. Otherwise
the ``refresh`` candidates with the largest bounds are brought up to date (for each pick one of
them lacks, one ``block([pick], candidates)`` row; ``max`` is exact, so adding picks one at a time
gives the dense path's penalty) and the argmax is taken again. Every round refreshes the argmax
itself, so it terminates; a candidate refreshed at the previous pick lacks only that pick, so
the usual cost is one or two rows of ``refresh`` entries per pick instead of an N-entry row. All other per-pick work (caps, masks, argmax) is the dense
path's O(N) vector work, with ``lax.top_k`` in place of ``argmax`` (XLA's CPU argmax is a
variadic reduction, 3x slower than its top-k at N = 10^6; top-k breaks ties by the lower index
too, and ``+ 0.0`` maps -0.0 to +0.0 so that they tie as in a float comparison).

The observation update is :func:`~envsched_jax.sched.kernels.observe_update` fed with the new
nodes' ``S_full`` entries on their environment's members only and their ``S_abs`` rows. The cold
start is :func:`~envsched_jax.sched.cold_start.cold_start` with rows from ``block``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envsched_jax.sched import kernels as K


@struct.dataclass
class DenseSimilarity:
    """The similarity-source interface over dense matrices (``s_abs`` may be None when only
    ``block`` is used)."""

    s_full: jax.Array
    s_abs: jax.Array | None = None

    @property
    def num_nodes(self) -> int:
        return self.s_full.shape[0]

    @property
    def dtype(self):
        return self.s_full.dtype

    def block(self, rows: jax.Array, cols: jax.Array) -> jax.Array:
        out = self.s_full[jnp.maximum(rows, 0)][:, jnp.maximum(cols, 0)]
        return jnp.where((rows[:, None] >= 0) & (cols[None, :] >= 0), out, 0.0)

    def abs_rows(self, rows: jax.Array) -> jax.Array:
        return jnp.where(rows[:, None] >= 0, self.s_abs[jnp.maximum(rows, 0)], 0.0)


def _argmax(x: jax.Array) -> jax.Array:
    """Index of the largest value, the lower index among equals (module docstring)."""
    return jax.lax.top_k(x + 0.0, 1)[1][0]


def select_batch_lazy(state: K.EnvSchedState, q: jax.Array, prog_excluded: jax.Array, sim,
                      env_index: jax.Array, config, *, refresh: int = 32) -> K.Selection:
    """:func:`~envsched_jax.sched.kernels.select_batch` with the penalty evaluated lazily from
    ``sim.block`` (module docstring): the same batch, phases and relaxation levels."""
    n = q.shape[0]
    B, b_cov = config.batch_size, config.num_coverage
    dtype = q.dtype
    gain = K.exploitation_gain(state, q, config)
    rules = K.pick_rules(state, prog_excluded, env_index, config)
    ids = jnp.arange(n, dtype=jnp.int32)
    refresh = min(refresh, n)

    def pick(coverage: bool):
        base = q if coverage else gain

        def body(k, carry):
            batch, phase, relaxed, feasible, in_batch, cnt, pen, fresh_at = carry
            eligible, level = rules.eligible(in_batch, cnt, coverage)
            ok = eligible.any()
            mask = rules.coverage_mask(eligible, cnt) if coverage else eligible

            def bounds(pen):
                return jnp.where(mask, base - pen, -jnp.inf)

            def stale_best(state_):
                pen, fresh_at, i = state_
                return ok & (fresh_at[i] < k)

            def refresh_top(state_):
                pen, fresh_at, _ = state_
                stale = jnp.where(fresh_at < k, bounds(pen), -jnp.inf)
                _, cand = jax.lax.top_k(stale + 0.0, refresh)
                since = fresh_at[cand]                     # each candidate lacks picks since..k - 1

                def add_pick(m, cand_pen):   # one similarity row: pick m against the candidates
                    s = sim.block(batch[m][None], cand)[0].astype(dtype)
                    return jnp.where((since <= m) & (batch[m] >= 0),
                                     jnp.maximum(cand_pen, config.lambda_sim * s), cand_pen)

                cand_pen = jax.lax.fori_loop(jnp.min(since), k, add_pick, pen[cand])
                pen = pen.at[cand].set(cand_pen)
                fresh_at = fresh_at.at[cand].set(k)
                return pen, fresh_at, _argmax(bounds(pen)).astype(jnp.int32)

            pen, fresh_at, i = jax.lax.while_loop(
                stale_best, refresh_top, (pen, fresh_at, _argmax(bounds(pen)).astype(jnp.int32)))
            e = env_index[i]
            return (batch.at[k].set(jnp.where(ok, i, -1)),
                    phase.at[k].set(1 if coverage else 2),
                    relaxed.at[k].set(level),
                    feasible.at[k].set(ok),
                    in_batch | ((ids == i) & ok),
                    cnt + ((env_index == e) & ok).astype(jnp.int32),
                    pen, fresh_at)
        return body

    carry = (jnp.full((B,), -1, jnp.int32), jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.int32),
             jnp.zeros((B,), bool), jnp.zeros((n,), bool), jnp.zeros((n,), jnp.int32), jnp.zeros((n,), dtype),
             jnp.zeros((n,), jnp.int32))
    carry = jax.lax.fori_loop(0, b_cov, pick(True), carry)
    batch, phase, relaxed, feasible, *_ = jax.lax.fori_loop(b_cov, B, pick(False), carry)
    return K.Selection(batch, phase, relaxed, feasible)


def new_rows(state: K.EnvSchedState, batch: jax.Array) -> jax.Array:
    """The batch entries observed for the first time (the only rows observing reads), -1 elsewhere."""
    return jnp.where((batch >= 0) & (state.num_obs[jnp.maximum(batch, 0)] == 0), batch, -1)


def observe_update(state: K.EnvSchedState, batch: jax.Array, rewards: jax.Array, sim, env_index: jax.Array,
                   env_members: jax.Array, config) -> K.EnvSchedState:
    """:func:`~envsched_jax.sched.kernels.observe_update` with the similarity entries it reads
    computed by ``sim``: the new nodes' ``S_full`` entries on their own environment's members
    ([B, M]) and their ``S_abs`` rows ([B, N]); rows of nodes seen before are not read, so they
    are left as zeros."""
    rows = new_rows(state, batch)
    members = env_members[env_index[jnp.maximum(batch, 0)]]                              # [B, M]

    def member_row(rc):   # nodes seen before are skipped (a cond: most rows late in a run)
        row, cols = rc
        return jax.lax.cond(row >= 0, lambda: sim.block(row[None], cols)[0].astype(jnp.float32),
                            lambda: jnp.zeros(cols.shape, jnp.float32))

    member_rows = jax.lax.map(member_row, (rows, members))
    return K.observe_update(state, batch, rewards, None, sim.abs_rows(rows), env_index, config,
                            env_members=env_members, s_full_member_rows=member_rows)
