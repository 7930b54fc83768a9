"""EnvSched's step-0 cold start (package docstring, "Cold start") as one jitted kernel.

:func:`cold_start` is a pure function of ``S_full``, the environment index and the identifier
filter's mask, with the batch size, the environment count and the relaxation policy static and
C1 (``cap_step``) traced. It returns the batch, each pick's relaxation level and a feasibility
flag per pick, like :func:`~envsched_jax.sched.kernels.select_batch`, so that a whole run can be
one compiled program (:func:`envsched_jax.sim.runner.envsched_runs`) and an infeasible pick is a
flag rather than an exception. :func:`cold_start_batch` is the host wrapper EnvSched's
``select(0)`` calls: it raises the same :class:`~envsched_jax.sched.errors.SchedulingError` the
NumPy version raised. :func:`cold_start_reference` is that NumPy version, kept as the reference
the tests hold the kernel to.

Numerics (CHOICE, so that mathematically equal values tie and the lower index wins, and the
kernel agrees with the NumPy reference, which evaluates in float64): with float32 similarities
every comparison is exact. The representative's within-environment mean is compared through
exact fixed-point sums (each similarity split into 12-bit integer limbs, summed in int32 and
carried: exact to 2^-48 for float32, 2^-72 for float64, for values in [0, 1]); the division by
n_e - 1 is common to the members of an environment and dropped. The combined novelty
0.5 (1 - g) + 0.5 (1 - w) of a node (g, w: its largest similarity to the batch and to the batch's
members of its environment) is ordered as -(g + w), compared exactly as the error-free pair
(fl(g + w), its rounding error). NumPy's float64 evaluation of float32 values is exact too
(except for similarities below 2^-29), so the two agree bit for bit. With float64 similarities
the kernel evaluates the novelty as NumPy does (in float64), while the representative's sums are
the exact fixed-point ones where NumPy rounds: they can differ only where two members' means
differ by less than float64 rounding.

Shapes: N nodes, E environments, M the largest environment (static: the kernel gathers each
node's environment as an [N, M] block, so the representatives cost O(N M), not O(N^2)), B.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envsched_jax.sched.errors import SchedulingError

# Relaxation level of a cold-start pick: 0 none, 1 the two-per-environment cap lifted to C1,
# 2 C1 dropped too (the names are those EnvSched's metrics use).
COLD_RELAXATIONS = ("none", "cold_two_per_env", "cap_step")
COLD_PER_ENV = 2
_LIMB_BITS = 12


class ColdStart(NamedTuple):
    batch: jax.Array                # [B] int32 node indices in pick order, -1 where infeasible
    relaxed: jax.Array              # [B] int32 relaxation level (index into COLD_RELAXATIONS)
    feasible: jax.Array             # [B] bool: the pick found an eligible node
    num_representatives: jax.Array  # [] int32: environments with a non-excluded task


def _fixed_point_sums(values: jax.Array, mask: jax.Array) -> list[jax.Array]:
    """Exact sums over the last axis of ``values`` (in [0, 1]) where ``mask``, as int32 limbs in
    base 2^12, most significant first (after carrying, every limb but the first is in
    [0, 2^12)). Comparing the limb tuples lexicographically compares the exact sums."""
    num_limbs = 4 if values.dtype == jnp.float32 else 6
    rest = jnp.where(mask, values, 0.0)
    sums = []
    for _ in range(num_limbs):
        rest = rest * float(1 << _LIMB_BITS)     # exact: a power of two
        digit = jnp.floor(rest)
        rest = rest - digit                      # exact: the fraction of a float is a float
        sums.append(digit.astype(jnp.int32).sum(axis=-1))
    for k in range(num_limbs - 1, 0, -1):        # carry (floor division: exact for negatives too)
        carry = sums[k] >> _LIMB_BITS
        sums[k] = sums[k] - (carry << _LIMB_BITS)
        sums[k - 1] = sums[k - 1] + carry
    return sums


def _novelty_argmax(mask: jax.Array, glob: jax.Array, within: jax.Array) -> jax.Array:
    """argmax over ``mask`` of 0.5 (1 - glob) + 0.5 (1 - within), ties -> lower index (module
    docstring for the numerics)."""
    if glob.dtype == jnp.float64:
        novelty = 0.5 * (1.0 - glob) + 0.5 * (1.0 - within)
        return jnp.argmax(jnp.where(mask, novelty, -jnp.inf)).astype(jnp.int32)
    # The novelty decreases with g + w: minimise it exactly as (s, e) with s = fl(g + w) and
    # e = (g + w) - s (Knuth's two-sum, error-free in round-to-nearest).
    s = glob + within
    bv = s - glob
    e = (glob - (s - bv)) + (within - bv)
    keep = mask & (s == jnp.min(jnp.where(mask, s, jnp.inf)))
    keep = keep & (e == jnp.min(jnp.where(keep, e, jnp.inf)))
    return jnp.argmax(keep).astype(jnp.int32)


def _is_source(s_full) -> bool:
    """A similarity source (:mod:`.dense_free`) rather than a dense matrix."""
    return hasattr(s_full, "block")


def _row(s_full, i: jax.Array) -> jax.Array:
    """``S_full[i, :]`` from a dense matrix or a similarity source."""
    if _is_source(s_full):
        return s_full.block(i[None], jnp.arange(s_full.num_nodes, dtype=jnp.int32))[0]
    return s_full[i]


def representatives(s_full: jax.Array, env_index: jax.Array, excluded: jax.Array, *, num_envs: int,
                    max_env_size: int) -> jax.Array:
    """[E] int32: each environment's representative (argmax over its non-excluded tasks of the
    mean S_full to its other members, ties -> lower index), -1 for an environment without a
    non-excluded task."""
    n, m = env_index.shape[0], max_env_size
    order = jnp.argsort(env_index, stable=True)                # by environment, then by index
    env_sorted = env_index[order]
    sizes = jnp.zeros((num_envs,), jnp.int32).at[env_index].add(1)
    starts = jnp.cumsum(sizes) - sizes
    slot = jnp.arange(n, dtype=jnp.int32) - starts[env_sorted]
    members = jnp.full((num_envs, m), -1, jnp.int32).at[env_sorted, slot].set(order.astype(jnp.int32))
    cols = members[env_index]                                  # [N, M] each node's environment
    valid = (cols >= 0) & (cols != jnp.arange(n)[:, None])
    if _is_source(s_full):   # each environment's block S[members, members], moved to its members' rows
        blocks = jax.lax.map(lambda mem: s_full.block(mem, mem), members)            # [E, M, M]
        block = blocks[env_index, jnp.zeros((n,), jnp.int32).at[order].set(slot)]   # [N, M]
    else:
        block = jnp.take_along_axis(s_full, jnp.maximum(cols, 0), axis=1)
    limbs = _fixed_point_sums(block, valid)                    # [N] each
    cand = (members >= 0) & ~excluded[jnp.maximum(members, 0)]  # [E, M]
    low = jnp.iinfo(jnp.int32).min
    for limb in limbs:
        per_member = limb[jnp.maximum(members, 0)]
        cand = cand & (per_member == jnp.max(jnp.where(cand, per_member, low), axis=1, keepdims=True))
    first = jnp.argmax(cand, axis=1)                           # lowest slot = lowest index
    return jnp.where(cand.any(axis=1), members[jnp.arange(num_envs), first], -1)


@functools.partial(jax.jit, static_argnames=("batch_size", "num_envs", "max_env_size", "relax"))
def cold_start(s_full: jax.Array, env_index: jax.Array, excluded: jax.Array, cap_step: jax.Array, *,
               batch_size: int, num_envs: int, max_env_size: int, relax: bool) -> ColdStart:
    """Step 0's batch from static structure only (package docstring, "Cold start").

    The representatives first: all of them in environment order if there are at most B, else B
    of them greedily by combined novelty (ties -> lower index). Then greedy novelty picks over the
    non-excluded nodes whose environment has fewer than two in the batch. With ``relax`` a pick
    without such a node lifts that cap to C1 (``cap_step``, level 1), then drops C1 too (level
    2); without ``relax`` it is infeasible (``feasible`` False, batch entry -1, nothing added).
    ``max_env_size``: at least the largest environment (:func:`max_env_size`). ``s_full``: the
    dense matrix, or a similarity source (:mod:`.dense_free`): then the representatives read each
    environment's block and every pick one row, computed on demand."""
    n = env_index.shape[0]
    B, E = batch_size, num_envs
    env_index = env_index.astype(jnp.int32)
    allowed = ~excluded
    reps = representatives(s_full, env_index, excluded, num_envs=E, max_env_size=max_env_size)
    has_rep = reps >= 0
    num_reps = has_rep.sum().astype(jnp.int32)
    rep_list = reps[jnp.argsort(~has_rep, stable=True)]        # environment order, -1s last
    is_rep = jnp.zeros((n,), bool).at[jnp.where(has_rep, reps, n)].set(True, mode="drop")
    many = num_reps > B
    dtype = jnp.dtype(getattr(s_full, "dtype", jnp.float32))   # a source without one gives float32

    def pick(k, carry):
        batch, relaxed, feasible, in_batch, glob, within, count = carry
        rep_phase = k < jnp.minimum(num_reps, B)
        free = allowed & ~in_batch
        cnt = count[env_index]
        if relax:   # static: the first level with a candidate
            levels = jnp.stack([free & (cnt < COLD_PER_ENV), free & (cnt < cap_step), free])
            level = jnp.argmax(levels.any(axis=1)).astype(jnp.int32)
            mask = levels[level]
        else:
            level = jnp.zeros((), jnp.int32)
            mask = free & (cnt < COLD_PER_ENV)
        mask = jnp.where(rep_phase, is_rep & ~in_batch, mask)
        best = _novelty_argmax(mask, glob, within)
        i = jnp.where(rep_phase & ~many, rep_list[jnp.minimum(k, E - 1)], best)
        ok = rep_phase | mask.any()
        level = jnp.where(rep_phase, 0, level)
        row = _row(s_full, i).astype(dtype)
        same = env_index == env_index[i]
        return (batch.at[k].set(jnp.where(ok, i, -1)), relaxed.at[k].set(level), feasible.at[k].set(ok),
                in_batch.at[i].set(in_batch[i] | ok),
                jnp.where(ok, jnp.maximum(glob, row), glob),
                jnp.where(ok & same, jnp.maximum(within, row), within),
                count.at[env_index[i]].add(ok.astype(jnp.int32)))

    init = (jnp.full((B,), -1, jnp.int32), jnp.zeros((B,), jnp.int32), jnp.zeros((B,), bool),
            jnp.zeros((n,), bool), jnp.zeros((n,), dtype), jnp.zeros((n,), dtype), jnp.zeros((E,), jnp.int32))
    batch, relaxed, feasible, *_ = jax.lax.fori_loop(0, B, pick, init)
    return ColdStart(batch, relaxed, feasible, num_reps)


def max_env_size(env_index) -> int:
    """The largest environment's task count (the kernel's static ``max_env_size``)."""
    return int(np.bincount(np.asarray(env_index)).max())


def infeasible_message(num_filled: int, batch_size: int, num_representatives: int) -> str:
    """The error of a cold start that cannot fill B (the NumPy version's text)."""
    return (f"cold start: only {num_filled} of {batch_size} slots can be filled with at most two "
            f"tasks per environment ({num_representatives} environments); use a smaller batch_size or "
            "infeasible='relax'")


def cold_start_batch(s_full, env_index, excluded, cap_step, *, batch_size: int, relax: bool,
                     num_envs: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Run :func:`cold_start` and return (batch [B] int64, the last constraint each relaxed pick
    dropped), raising :class:`SchedulingError` when B cannot be filled. ``env_index``: a host
    array (the static ``max_env_size`` is read from it)."""
    env_np = np.asarray(env_index)
    num_envs = int(env_np.max()) + 1 if num_envs is None else num_envs
    s_full = s_full if _is_source(s_full) else jnp.asarray(s_full)
    out = jax.device_get(cold_start(s_full, jnp.asarray(env_np, jnp.int32), jnp.asarray(excluded, bool),
                                    jnp.asarray(cap_step, jnp.int32), batch_size=batch_size, num_envs=num_envs,
                                    max_env_size=max_env_size(env_np), relax=relax))
    if not out.feasible.all():
        raise SchedulingError(infeasible_message(int(np.argmin(out.feasible)), batch_size,
                                                 int(out.num_representatives)))
    return out.batch.astype(np.int64), [COLD_RELAXATIONS[lvl] for lvl in out.relaxed.tolist() if lvl]


def cold_start_reference(s_full: np.ndarray, env_index: np.ndarray, batch_size: int, excluded: np.ndarray,
                         relax: bool, cap_step: int) -> tuple[np.ndarray, list[str]]:
    """The cold start in plain NumPy (float64), the reference the kernel is tested against (it
    was EnvSched's step 0 until the kernel replaced it): one representative per environment
    (highest mean within-environment S_full), then combined global and within-environment
    novelty, at most two per environment; every tie goes to the lower node index. Returns the
    batch and, per pick that needed relaxing ("relax" only), the last constraint it dropped."""
    n = len(env_index)
    allowed = ~excluded
    envs = [e for e in np.unique(env_index) if (allowed & (env_index == e)).any()]
    reps = []
    for e in envs:
        # The mean runs over every member (excluded ones too); the argmax over allowed members.
        members = np.flatnonzero(env_index == e)
        if len(members) == 1:
            reps.append(int(members[0]))
            continue
        block = s_full[np.ix_(members, members)].astype(np.float64)
        mean_other = (block.sum(axis=1) - np.diag(block)) / (len(members) - 1)
        reps.append(int(members[int(np.argmax(np.where(allowed[members], mean_other, -np.inf)))]))
    batch: list[int] = []
    glob = np.zeros(n)     # max similarity to the batch
    within = np.zeros(n)   # max similarity to same-environment batch members
    count = np.zeros(int(env_index.max()) + 1, np.int64)

    def add(i: int) -> None:
        batch.append(i)
        row = s_full[i].astype(np.float64)
        np.maximum(glob, row, out=glob)
        np.maximum(within, np.where(env_index == env_index[i], row, 0.0), out=within)
        count[env_index[i]] += 1

    def novelty() -> np.ndarray:
        return 0.5 * (1.0 - glob) + 0.5 * (1.0 - within)

    if len(reps) <= batch_size:
        for i in reps:
            add(i)
    else:
        reps_arr = np.array(sorted(reps))   # ascending node index: np.argmax's first maximum is the lowest
        while len(batch) < batch_size:
            taken = np.isin(reps_arr, batch)
            score = np.where(taken, -np.inf, novelty()[reps_arr])
            add(int(reps_arr[int(np.argmax(score))]))
    relaxations = []
    while len(batch) < batch_size:
        free = allowed.copy()
        free[batch] = False
        # "relax" first lifts the two-per-environment cap to C1, then drops C1 as well.
        levels = [(free & (count[env_index] < COLD_PER_ENV), []),
                  (free & (count[env_index] < cap_step), ["cold_two_per_env"]),
                  (free, ["cold_two_per_env", "cap_step"])]
        eligible, relaxed = next(((m, r) for m, r in levels if m.any()), (None, None))
        if eligible is None or (relaxed and not relax):
            raise SchedulingError(infeasible_message(len(batch), batch_size, len(envs)))
        if relaxed:   # the last constraint this pick dropped (the ones before it went too)
            relaxations.append(relaxed[-1])
        add(int(np.argmax(np.where(eligible, novelty(), -np.inf))))
    return np.array(batch, np.int64), relaxations
