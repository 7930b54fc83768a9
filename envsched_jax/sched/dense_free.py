"""EnvSched without dense similarity matrices: the greedy selection, the observation update and
the cold start reading ``S_full`` / ``S_abs`` entries computed on demand.

The dense path (:mod:`.kernels`) reads whole rows of the N x N matrices: the similarity penalty
of eq. 5 keeps ``lambda_sim max_b S_full[b, :]`` for every node, and observing a new node reads
its ``S_full`` and ``S_abs`` rows. At 10^5 - 10^6 tasks those matrices cannot exist (74.5 GiB at
100,000). This module makes the same decisions from a *similarity source*: anything with

- ``block(rows [R], cols [C]) -> [R, C]``: ``S_full[rows[r], cols[c]]``, 0 where an index is -1;
- ``abs_rows(rows [R]) -> [R, N]``: whole rows of ``S_abs``, zeros for a -1 row;
- ``prepare_rows(rows [R])`` -> a pytree with leading axis R, ``prepare_cols(cols [C])`` -> a
  pytree with leading axis C, and ``pairs_prepared(prepared_rows, which [P], cols [P],
  prepared_cols)`` = ``S_full[rows[which[p]], cols[p]]`` (``prepared_cols`` indexed to the P
  pairs): the selection prepares each pick's row once (e.g. its value map over the feature
  columns, kept for the whole batch) and a round's candidates once, then reads only the
  (pick, candidate) pairs a candidate lacks;
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
a *round* brings candidates of largest bound up to date (each against the picks it lacks;
``max`` is exact and order-free, so adding picks in any order gives the dense path's penalty)
and the argmax is taken again. Every round refreshes the argmax itself, so the rounds end.
Rounds run on a list, in O(list) each: exploitation picks first within a shortlist of the
largest gains (:func:`select_batch_lazy`); a coverage pick (or the fallback) after one round
over all N within the nodes that can still win, when they are few enough; otherwise over all N.
A round over a list or all N takes the stale nodes whose bound reaches a threshold found by
bisection (up to ``global_refresh``; no full sort: :func:`first_true`).
Each pick's own feature row is prepared once (``prepare_rows``: its value map over the feature
columns) and kept for the batch. The other per-pick work (caps, masks, argmax) is the dense
path's O(N) vector work (:func:`~envsched_jax.sched.kernels.argmax_first`: top-1 in place of
``argmax``, 3x faster at N = 10^6).

Cost (measured, ``experiments/bench_dense_free.py``; docs/performance.md): the work is the number of
(pick, candidate) similarity entries the rounds need, which grows with how many nodes score
within the penalty's range of the best, and the rounds over all N. At 100,000 the first
coverage picks of a step face about 2,000 never-observed nodes of never-visited environments
whose scores nearly tie, so that the penalty decides: batched rounds (64 candidates, a list of
the nodes that can still win) and per-pair entries took the selection from about 2 s to about
0.22 s (2026-12-05). The step stays slower than the dense path wherever both run; this path is
for pools whose dense matrices do not fit.

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

    def pairs_prepared(self, rows: jax.Array, which: jax.Array, cols: jax.Array, cdata) -> jax.Array:
        r = rows[which]
        out = self.s_full[jnp.maximum(r, 0), jnp.maximum(cols, 0)]
        return jnp.where((r >= 0) & (cols >= 0), out, 0.0)


def select_batch_lazy(state: K.EnvSchedState, q: jax.Array, prog_excluded: jax.Array, sim,
                      env_index: jax.Array, config, *, refresh: int = 8, pairs_per_call: int = 64,
                      shortlist: int = 4096, global_refresh: int = 64, bisect: int = 12,
                      candidates: int = 4096) -> K.Selection:
    """:func:`~envsched_jax.sched.kernels.select_batch` with the penalty evaluated lazily from
    ``sim`` (module docstring): the same batch, phases and relaxation levels.

    Rounds (bring candidates up to date, take the argmax again) run in three places:

    - exploitation picks first run them within a *shortlist* (:func:`_shortlist`: at most
      ``shortlist`` nodes holding every eligible gain above ``thr``, the largest gain left out,
      found once when the exploitation phase starts). Eligibility only shrinks as the batch
      fills, and a bound never exceeds the gain, so no node outside the list can beat ``thr``: a
      pick whose best in-list node is current and strictly above it is accepted there, in O(L)
      per round (``refresh`` candidates per round). Otherwise (or for a relaxed pick, whose
      candidates may be new) the rounds continue as for a coverage pick;
    - coverage picks (and that fallback): one round over all N; if the argmax is still stale,
      the nodes that can still win are gathered into a list of at most ``candidates`` and the
      rounds go on there (the nested ``rounds`` says which nodes those are);
    - over all N when that list would be larger.

    A round outside the shortlist brings up to date up to ``global_refresh`` stale nodes of
    largest bound (a threshold found with ``bisect`` halvings; :func:`first_true`).
    CHOICE: no ``top_k`` with k > 1 in a loop, which XLA's CPU backend lowers to a full sort
    (20 ms per call at N = 100,000, against 0.17 ms for k = 1).

    ``pairs_per_call``: (pick, candidate) entries per similarity call. Every setting gives the
    same batch (tested): they trade loop trips against padded work.
    """
    n = q.shape[0]
    B, b_cov = config.batch_size, config.num_coverage
    dtype = q.dtype
    gain = K.exploitation_gain(state, q, config)
    rules = K.pick_rules(state, prog_excluded, env_index, config)
    ids = jnp.arange(n, dtype=jnp.int32)
    L = min(max(shortlist, 1), n)
    refresh = min(refresh, L)
    global_refresh = min(max(global_refresh, 1), n)
    L_cov = min(max(candidates, 1), n)

    def penalties(k, batch, prepared, cand_pen, since, cand):
        """Exact penalties of nodes ``cand`` [C] (-1: padding) against the first k picks, from
        their penalties ``cand_pen`` against the first ``since`` picks: only the (pick, node)
        pairs each lacks are read, ``pairs_per_call`` at a time (``max`` is exact and
        order-free, so the result is the dense path's penalty)."""
        c_n = cand.shape[0]
        cols = sim.prepare_cols(cand)
        lacking = jnp.where(cand >= 0, jnp.maximum(k - since, 0), 0)
        ends = jnp.cumsum(lacking)
        starts = ends - lacking
        total = ends[-1]
        offsets = jnp.arange(pairs_per_call, dtype=jnp.int32)

        def chunk(j, cand_pen):
            t = j * pairs_per_call + offsets
            c = jnp.minimum(jnp.searchsorted(ends, t, side="right"), c_n - 1)
            m = jnp.clip(since[c] + t - starts[c], 0, B - 1)
            valid = (t < total) & (batch[m] >= 0)
            cdata = jax.tree_util.tree_map(lambda a: a[c], cols)
            s = sim.pairs_prepared(prepared, m, jnp.where(valid, cand[c], -1), cdata).astype(dtype)
            return cand_pen.at[c].max(jnp.where(valid, config.lambda_sim * s, 0.0))

        return jax.lax.fori_loop(0, (total + pairs_per_call - 1) // pairs_per_call, chunk,
                                 jnp.maximum(cand_pen, 0.0))

    def rounds(k, batch, prepared, idx, lbase, lpen, lfresh, ok, limit=None):
        """Rounds over the nodes ``idx`` [S] (ascending; ``n``: padding), ``lbase`` their base
        scores (-inf: not a candidate), ``lpen`` / ``lfresh`` their penalties and ``fresh_at``,
        until their argmax is current (or ``limit`` rounds). Returns the updated ``lpen``,
        ``lfresh`` and the argmax's position in ``idx``.

        A round brings up to date the (at most ``global_refresh``) stale nodes of largest bound:
        those whose bound reaches a threshold tau, the lowest indices first, tau found by
        bisection (``bisect`` halvings) in [lo, b_i] so that at most ``global_refresh`` reach it,
        where i is the argmax and lo the larger of the best current exact score and
        ``b_i - max(lambda_sim, 0)``: no node below lo can still win (i's exact score is at
        least ``b_i - max(lambda_sim, 0)``, S_full being clipped into [0, 1]). A tie at the top
        larger than ``global_refresh`` gives tau = b_i: the lowest-indexed ties, i among them.
        ``global_refresh`` = 1: the largest stale bound alone (``top_k(x, 1)``)."""
        def bounds(lpen):
            return lbase - lpen + 0.0

        def go(st):
            lpen, lfresh, i, r = st
            more = ok & (lfresh[i] < k)
            return more if limit is None else more & (r < limit)

        def round_(st):
            lpen, lfresh, i, r = st
            b = bounds(lpen)
            stale = jnp.where(lfresh < k, b, -jnp.inf)
            if global_refresh == 1:
                at = K.argmax_first(stale)[None]
            else:
                m = b[i]
                best_fresh = jnp.max(jnp.where(lfresh < k, -jnp.inf, b))
                lo = jnp.maximum(best_fresh, m - jnp.maximum(config.lambda_sim, 0.0).astype(dtype))

                def halve(_, st):
                    bad, good = st     # count(bad) > global_refresh >= count(good), or good = m
                    mid = bad + 0.5 * (good - bad)
                    small = jnp.sum(stale >= mid) <= global_refresh
                    return jnp.where(small, bad, mid), jnp.where(small, mid, good)

                few = jnp.sum(stale >= lo) <= global_refresh
                tau = jnp.where(few, lo, jax.lax.fori_loop(0, bisect, halve, (lo, m))[1])
                at = first_true(stale >= tau, global_refresh)                  # positions in idx
            cand = jnp.where(at < idx.shape[0], idx[jnp.minimum(at, idx.shape[0] - 1)], n)
            real = cand < n
            at_safe = jnp.minimum(at, idx.shape[0] - 1)
            cand_pen = penalties(k, batch, prepared, lpen[at_safe], jnp.where(real, lfresh[at_safe], k),
                                 jnp.where(real, cand, -1))
            lpen = lpen.at[at].set(cand_pen, mode="drop")
            lfresh = lfresh.at[at].set(jnp.where(real, k, lfresh[at_safe]), mode="drop")
            return lpen, lfresh, K.argmax_first(bounds(lpen)), r + 1

        lpen, lfresh, i, _ = jax.lax.while_loop(go, round_, (lpen, lfresh, K.argmax_first(bounds(lpen)), 0))
        return lpen, lfresh, i

    def global_rounds(k, batch, prepared, pen, fresh_at, base, mask, ok):
        """The exact argmax of a pick over all N: one round over all N; if that does not settle
        it, the nodes that can still win (bound at least lo, see :func:`rounds`) are gathered into
        a list of at most ``candidates`` and the rounds continue there in O(list) each (no node
        outside it can win: each one's bound is below lo, which the winner's exact score reaches);
        a larger set continues over all N."""
        ids = jnp.arange(n, dtype=jnp.int32)
        lbase = jnp.where(mask, base, -jnp.inf)
        pen, fresh_at, i = rounds(k, batch, prepared, ids, lbase, pen, fresh_at, ok, limit=1)
        b = lbase - pen + 0.0
        best_fresh = jnp.max(jnp.where(fresh_at < k, -jnp.inf, b))
        lo = jnp.maximum(best_fresh, b[i] - jnp.maximum(config.lambda_sim, 0.0).astype(dtype))
        keep = b >= lo
        settled = ~ok | (fresh_at[i] >= k)

        def in_list(pen, fresh_at):
            idx = first_true(keep, L_cov)
            safe = jnp.minimum(idx, n - 1)
            real = idx < n
            lpen, lfresh, li = rounds(k, batch, prepared, idx, jnp.where(real, lbase[safe], -jnp.inf),
                                      pen[safe], fresh_at[safe], ok)
            return pen.at[idx].set(lpen, mode="drop"), fresh_at.at[idx].set(lfresh, mode="drop"), idx[li]

        def over_all(pen, fresh_at):
            return rounds(k, batch, prepared, ids, lbase, pen, fresh_at, ok)

        if L_cov >= n:
            branch = jnp.where(settled, 0, 2)
        else:
            branch = jnp.where(settled, 0, jnp.where(jnp.sum(keep) <= L_cov, 1, 2))
        return jax.lax.switch(branch, [lambda pen, fresh_at: (pen, fresh_at, i), in_list, over_all], pen, fresh_at)

    def pick(coverage: bool, short=None, thr=None):
        base = q if coverage else gain

        def body(k, carry):
            batch, phase, relaxed, feasible, in_batch, cnt, pen, fresh_at, prepared = carry
            eligible, level = rules.eligible(in_batch, cnt, coverage)
            ok = eligible.any()
            mask = rules.coverage_mask(eligible, cnt) if coverage else eligible

            if coverage:
                pen, fresh_at, i = global_rounds(k, batch, prepared, pen, fresh_at, base, mask, ok)
            else:
                # Rounds within the shortlist, on list-local copies (O(L) per round).
                lmask = short_real & mask[short_safe]

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
                    cand = jnp.where(lmask[at], short[at], -1)
                    cand_pen = penalties(k, batch, prepared, lpen[at], jnp.where(lmask[at], lfresh[at], k), cand)
                    sb = sb.at[at].set(jnp.where(lmask[at], base[short_safe[at]] - cand_pen, -jnp.inf) + 0.0)
                    return lpen.at[at].set(cand_pen), lfresh.at[at].set(k), sb

                lpen, lfresh = pen[short_safe], fresh_at[short_safe]
                sb = jnp.where(lmask, base[short_safe] - lpen, -jnp.inf) + 0.0
                lpen, lfresh, sb = jax.lax.while_loop(list_go, list_round, (lpen, lfresh, sb))
                pen = pen.at[short].set(lpen, mode="drop")
                fresh_at = fresh_at.at[short].set(lfresh, mode="drop")
                best, node, fresh = list_best(sb, lfresh)
                accepted = ok & (level == 0) & fresh & (best > thr)
                pen, fresh_at, i = jax.lax.cond(
                    accepted, lambda pen, fresh_at: (pen, fresh_at, node.astype(jnp.int32)),
                    lambda pen, fresh_at: global_rounds(k, batch, prepared, pen, fresh_at, base, mask, ok),
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
    short, thr = _shortlist(jnp.where(eligible0, gain, -jnp.inf) + 0.0, L, bisect)
    short_real = short < n
    short_safe = jnp.minimum(short, n - 1)
    batch, phase, relaxed, feasible, *_ = jax.lax.fori_loop(b_cov, B, pick(False, short, thr), carry)
    return K.Selection(batch, phase, relaxed, feasible)


def _shortlist(g: jax.Array, size: int, bisect: int) -> tuple[jax.Array, jax.Array]:
    """A list of at most ``size`` nodes (ascending, padded with N) holding the largest values of
    ``g`` (-inf: not eligible), and ``thr``, the largest value left out of it (-inf if none): the
    nodes whose value reaches a threshold tau found by bisection (``bisect`` halvings), so that
    at most ``size`` reach it (a tie at the top larger than ``size``: its lowest indices, and
    ``thr`` = that value). CHOICE: a threshold, not ``top_k(g, size)``, which XLA CPU lowers to a
    full sort of N (18.6 ms at N = 100,000); the list need not be the exact top ``size``, only
    everything above ``thr``."""
    n = g.shape[0]
    hi = jnp.max(g)
    lo = jnp.min(jnp.where(g > -jnp.inf, g, hi))

    def halve(_, st):
        bad, good = st         # count(bad) > size >= count(good), or good = hi
        mid = bad + 0.5 * (good - bad)
        small = jnp.sum(g >= mid) <= size
        return jnp.where(small, bad, mid), jnp.where(small, mid, good)

    everything = jnp.sum(g > -jnp.inf) <= size
    tau = jnp.where(everything, -jnp.inf, jax.lax.fori_loop(0, bisect, halve, (lo, hi))[1])
    keep = (g >= tau) & (g > -jnp.inf)
    short = first_true(keep, size)
    overflow = jnp.sum(keep) > size
    thr = jnp.where(overflow, tau, jnp.max(jnp.where(keep, -jnp.inf, g)))
    return short, jnp.where(everything, -jnp.inf, thr)


def first_true(mask: jax.Array, size: int, block: int = 256) -> jax.Array:
    """The indices of the first ``size`` True entries of a 1-D ``mask``, ascending, padded with
    ``len(mask)``: ``jnp.nonzero(mask, size=size, fill_value=len(mask))[0]`` in two levels (block
    counts, then a prefix sum within the ``size`` blocks that hold the answers), 2-3x faster than
    ``nonzero``'s prefix sum and scatter over the whole mask on XLA CPU (0.32 vs 0.85 ms at
    N = 100,000, size 64)."""
    n = mask.shape[0]
    blocks = jnp.pad(mask, (0, (-n) % block)).reshape(-1, block)
    ends = jnp.cumsum(blocks.sum(1, dtype=jnp.int32))                      # Trues up to each block
    want = jnp.arange(1, size + 1, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(ends, want, side="left"), blocks.shape[0] - 1)
    before = jnp.where(row > 0, ends[jnp.maximum(row - 1, 0)], 0)
    within = jnp.cumsum(blocks[row].astype(jnp.int32), axis=1)             # [size, block]
    col = jax.vmap(lambda r, w: jnp.searchsorted(r, w, side="left"))(within, want - before)
    return jnp.where(want <= ends[-1], row * block + col, n).astype(jnp.int32)


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
