"""EnvSched without dense similarity matrices: the greedy selection, the observation update and
the cold start reading ``S_full`` / ``S_abs`` entries computed on demand.

The dense path (:mod:`.kernels`) reads whole rows of the N x N matrices: the similarity penalty
of eq. 5 keeps ``lambda_sim max_b S_full[b, :]`` for every node, and observing a new node reads
its ``S_full`` and ``S_abs`` rows. At 10^5 - 10^6 tasks those matrices cannot exist (74.5 GiB at
100,000). This module makes the same decisions from a *similarity source*: anything with

- ``block(rows [R], cols [C]) -> [R, C]``: ``S_full[rows[r], cols[c]]``, 0 where an index is -1;
- ``abs_rows(rows [R]) -> [R, N]``: whole rows of ``S_abs``, zeros for a -1 row;
- ``prepare_rows(rows [R])`` -> a pytree with leading axis R, ``prepare_cols(cols [C])`` -> any
  pytree, and ``block_prepared(prepared_rows, which [W], cols, prepared_cols)`` =
  ``block(rows[which], cols)``: the selection prepares each pick's row once (e.g. its value map
  over the feature columns, kept for the whole batch) and the candidates' columns once per round;
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
a *round* brings candidates of largest bound up to date (for each pick one of them lacks, one
similarity row; ``max`` is exact, so adding picks one at a time gives the dense path's penalty)
and the argmax is taken again. Every round refreshes the argmax itself, so the rounds end. The
rounds of an exploitation pick first run within a shortlist of the largest gains
(:func:`select_batch_lazy`), in O(L) each; coverage picks and the fallback run them over all N.
Each pick's own feature row is prepared once (``prepare_rows``: its value map over the feature
columns) and kept for the batch. The other per-pick work (caps, masks, argmax) is the dense
path's O(N) vector work (:func:`~envsched_jax.sched.kernels.argmax_first`: top-1 in place of
``argmax``, 3x faster at N = 10^6).

Cost (measured, ``experiments/bench_dense_free.py``; README): the work is the number of
(pick, candidate) similarity entries the rounds need, which grows with how many nodes score
within the penalty's range of the best. At N = 2,550 that is ~6,000 entries per step; at
100,000 ~66,000 plus ~2,500 rounds over all N (mostly coverage picks among the many
never-observed nodes of never-visited environments, whose scores nearly tie): the step is
slower than the dense path wherever both run, and this path is for pools whose dense matrices
do not fit.

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

    def prepare_rows(self, rows: jax.Array) -> jax.Array:
        return rows

    def prepare_cols(self, cols: jax.Array) -> jax.Array:
        return cols

    def block_prepared(self, rows: jax.Array, which: jax.Array, cols: jax.Array, cdata) -> jax.Array:
        return self.block(rows[which], cols)


def select_batch_lazy(state: K.EnvSchedState, q: jax.Array, prog_excluded: jax.Array, sim,
                      env_index: jax.Array, config, *, refresh: int = 8, rows_per_call: int = 1,
                      shortlist: int = 4096) -> K.Selection:
    """:func:`~envsched_jax.sched.kernels.select_batch` with the penalty evaluated lazily from
    ``sim`` (module docstring): the same batch, phases and relaxation levels.

    Rounds (bring candidates up to date, take the argmax again) run in two places:

    - exploitation picks first run them within a *shortlist*: the ``shortlist`` nodes of largest
      gain among those eligible when the exploitation phase starts (one ``top_k`` outside the
      loop). Eligibility only shrinks as the batch fills, and a bound never exceeds the gain, so
      no node outside the list can beat the list's L-th gain: a pick whose best in-list node is
      current and strictly above it is accepted there, in O(L) per round (``refresh`` candidates
      per round). Otherwise (or for a relaxed pick, whose candidates may be new) the rounds
      continue over all N;
    - over all N (coverage picks, and the fallback): one candidate per round, found with
      ``top_k(x, 1)``. CHOICE: on XLA's CPU backend ``top_k`` with k > 1 inside a loop lowers
      to a full sort (measured 20 ms per call at N = 100,000, against 0.17 ms for k = 1).

    ``rows_per_call``: picks per ``block_prepared`` call. Speed only: every setting gives the same
    batch (tested)."""
    n = q.shape[0]
    B, b_cov = config.batch_size, config.num_coverage
    dtype = q.dtype
    gain = K.exploitation_gain(state, q, config)
    rules = K.pick_rules(state, prog_excluded, env_index, config)
    ids = jnp.arange(n, dtype=jnp.int32)
    L = min(max(shortlist, 1), n)
    refresh = min(refresh, L)

    def penalties(k, batch, prepared, cand_pen, since, cand):
        """Exact penalties of nodes ``cand`` against the first k picks, from their penalties
        ``cand_pen`` against the first ``since`` picks (only the picks each lacks are read)."""
        cols = sim.prepare_cols(cand)

        def add_picks(c, cand_pen):   # picks c*R .. c*R + R - 1 against the candidates
            m = c * rows_per_call + jnp.arange(rows_per_call)
            m_safe = jnp.minimum(m, B - 1)
            s = sim.block_prepared(prepared, m_safe, cand, cols).astype(dtype)   # [R, C]
            need = (m[:, None] < k) & (since[None, :] <= m[:, None]) & (batch[m_safe] >= 0)[:, None]
            return jnp.maximum(cand_pen, jnp.where(need, config.lambda_sim * s, 0.0).max(0))

        return jax.lax.fori_loop(jnp.min(since) // rows_per_call, (k + rows_per_call - 1) // rows_per_call,
                                 add_picks, cand_pen)

    def global_rounds(k, batch, prepared, pen, fresh_at, bounds, ok):
        """Rounds over all N, one candidate each, until the argmax is current."""
        def go(st):
            pen, fresh_at, i = st
            return ok & (fresh_at[i] < k)

        def round_(st):
            pen, fresh_at, _ = st
            cand = K.argmax_first(jnp.where(fresh_at < k, bounds(pen), -jnp.inf))[None]
            cand_pen = penalties(k, batch, prepared, pen[cand], fresh_at[cand], cand)
            pen, fresh_at = pen.at[cand].set(cand_pen), fresh_at.at[cand].set(k)
            return pen, fresh_at, K.argmax_first(bounds(pen)).astype(jnp.int32)

        return jax.lax.while_loop(go, round_, (pen, fresh_at, K.argmax_first(bounds(pen)).astype(jnp.int32)))

    def pick(coverage: bool, short=None, thr=None):
        base = q if coverage else gain

        def body(k, carry):
            batch, phase, relaxed, feasible, in_batch, cnt, pen, fresh_at, prepared = carry
            eligible, level = rules.eligible(in_batch, cnt, coverage)
            ok = eligible.any()
            mask = rules.coverage_mask(eligible, cnt) if coverage else eligible

            def bounds(pen):
                return jnp.where(mask, base - pen, -jnp.inf) + 0.0

            if coverage:
                pen, fresh_at, i = global_rounds(k, batch, prepared, pen, fresh_at, bounds, ok)
            else:
                # Rounds within the shortlist, on list-local copies (O(L) per round).
                def list_best(sb, lfresh):
                    best = jnp.max(sb)
                    at = jnp.argmin(jnp.where(sb == best, short, n))   # ties: the lower node index
                    return best, short[at], lfresh[at] == k

                def list_go(st):
                    lpen, lfresh, sb = st
                    best, _, fresh = list_best(sb, lfresh)
                    return ok & (level == 0) & ~fresh & (best > thr)

                def list_round(st):
                    lpen, lfresh, sb = st
                    stale = jnp.where(lfresh < k, sb, -jnp.inf)
                    at = (K.argmax_first(stale)[None] if refresh == 1 else jax.lax.top_k(stale, refresh)[1])
                    cand = short[at]
                    cand_pen = penalties(k, batch, prepared, lpen[at], lfresh[at], cand)
                    sb = sb.at[at].set(jnp.where(mask[cand], base[cand] - cand_pen, -jnp.inf) + 0.0)
                    return lpen.at[at].set(cand_pen), lfresh.at[at].set(k), sb

                lpen, lfresh = pen[short], fresh_at[short]
                sb = jnp.where(mask[short], base[short] - lpen, -jnp.inf) + 0.0
                lpen, lfresh, sb = jax.lax.while_loop(list_go, list_round, (lpen, lfresh, sb))
                pen, fresh_at = pen.at[short].set(lpen), fresh_at.at[short].set(lfresh)
                best, node, fresh = list_best(sb, lfresh)
                accepted = ok & (level == 0) & fresh & (best > thr)
                pen, fresh_at, i = jax.lax.cond(
                    accepted, lambda pen, fresh_at: (pen, fresh_at, node.astype(jnp.int32)),
                    lambda pen, fresh_at: global_rounds(k, batch, prepared, pen, fresh_at, bounds, ok),
                    pen, fresh_at)
            e = env_index[i]
            picked = jnp.where(ok, i, -1)
            prepared = jax.tree_util.tree_map(lambda a, b: a.at[k].set(b[0]), prepared,
                                              sim.prepare_rows(picked[None]))
            return (batch.at[k].set(picked),
                    phase.at[k].set(1 if coverage else 2),
                    relaxed.at[k].set(level),
                    feasible.at[k].set(ok),
                    in_batch | ((ids == i) & ok),
                    cnt + ((env_index == e) & ok).astype(jnp.int32),
                    pen, fresh_at, prepared)
        return body

    carry = (jnp.full((B,), -1, jnp.int32), jnp.zeros((B,), jnp.int32), jnp.zeros((B,), jnp.int32),
             jnp.zeros((B,), bool), jnp.zeros((n,), bool), jnp.zeros((n,), jnp.int32), jnp.zeros((n,), dtype),
             jnp.zeros((n,), jnp.int32), sim.prepare_rows(jnp.full((B,), -1, jnp.int32)))
    carry = jax.lax.fori_loop(0, b_cov, pick(True), carry)
    # The exploitation shortlist: the L largest gains among the nodes eligible now (unrelaxed).
    eligible0 = rules.eligible(carry[4], carry[5], False)[0] if config.infeasible != "relax" else \
        _unrelaxed(rules, carry[4], carry[5])
    top, short = jax.lax.top_k(jnp.where(eligible0, gain, -jnp.inf) + 0.0, L)
    thr = top[L - 1] if L < n else -jnp.inf
    batch, phase, relaxed, feasible, *_ = jax.lax.fori_loop(b_cov, B, pick(False, short, thr), carry)
    return K.Selection(batch, phase, relaxed, feasible)


def _unrelaxed(rules, in_batch, cnt):
    """The exploitation candidates before any relaxation (level 0), also under ``relax``."""
    eligible, level = rules.eligible(in_batch, cnt, False)
    return jnp.where(level == 0, eligible, False)


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
