"""Throughput of the on-the-fly similarity entries (envsched_jax.graph.feature_rows).

For ``S_full`` (stacked concrete views) and ``S_abs`` (abstract view) of a generated pool it
prints, per block shape R x C: pairs per second of :func:`block_similarity` on :class:`CSRRows`
(after compilation, median of ``--repeats`` calls), beside the older padded layout's
binary-search :func:`pair_similarity` on :class:`FeatureRows` measured in the same run (on at most
``--old-max-pairs`` pairs of the block: it is slow), and their ratio; then rows per second of
:func:`grouped_rows` (R = 64 whole ``S_abs`` rows) and of :func:`block_similarity` for the same
rows; then the per-node memory of both layouts. With the dense matrices at hand (N <= 5,000) each
measured block is also checked bit for bit against them.

Usage:
    python experiments/bench_feature_rows.py
    python experiments/bench_feature_rows.py --n 20000 --repeats 3
    python experiments/bench_feature_rows.py --hubness csls
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from envsched_jax.graph.build import GraphConfig, build_graph, stack_views
from envsched_jax.graph.feature_rows import (
    ROUND_TABLE, FeatureRows, block_similarity, graph_feature_rows, grouped_rows, pair_similarity)
from envsched_jax.pool.generator import generate_pool_of_size


@dataclasses.dataclass(frozen=True)
class Args:
    n: int = 2550
    """Pool size (generated pool, 50 tasks per environment: 2,550 = generated:51x50)."""
    seed: int = 0
    shapes: tuple[str, ...] = ("1x4096", "64x4096", "64x64", "1x50")
    """Block shapes R x C (rows x columns, random nodes)."""
    repeats: int = 5
    """Timed calls per case (median reported), after one compiling call."""
    old_max_pairs: int = 65536
    """Pairs of a block measured with the old binary-search pair_similarity (the first rows)."""
    grouped_rows: int = 64
    """R of the whole-row S_abs case."""
    hubness: str = "none"
    """'none' or 'csls' (S_abs CSLS-corrected; the radius costs an O(N^2) pass at build)."""
    check: bool = True
    """Compare each measured block with the dense matrices when N <= 5,000."""


def _median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(args: Args) -> None:
    t0 = time.perf_counter()
    dense = args.check and args.n <= 5000
    graph = build_graph(generate_pool_of_size(args.n, seed=args.seed),
                        GraphConfig(dense="always" if dense else "never", hubness=args.hubness))
    rows = graph_feature_rows(graph)
    weights = graph.config.concrete_weights()
    concrete = stack_views([graph.features[v] for v in weights], list(weights.values()))
    table = jnp.asarray(ROUND_TABLE)
    old = {"S_full": FeatureRows.from_csr(concrete, round_table=table),
           "S_abs": FeatureRows.from_csr(graph.features["abstract"], round_table=table,
                                         radius=np.asarray(rows.abs.radius) if rows.abs.csls else None)}
    new = {"S_full": rows.full, "S_abs": rows.abs}
    dense_of = {"S_full": graph.s_full, "S_abs": graph.s_abs} if dense else {}
    print(f"N = {args.n:,}, hubness = {args.hubness}, setup {time.perf_counter() - t0:.1f} s, "
          f"{jax.default_backend()} backend, {jax.device_count()} device(s)")

    block_fn = jax.jit(block_similarity)
    old_fn = jax.jit(lambda r, i, j: pair_similarity(r, i[:, None], j[None, :]))
    rng = np.random.default_rng(args.seed)
    print(f"\n{'matrix':<7} {'block':>8} {'CSRRows pairs/s':>16} {'old pairs/s':>12} {'ratio':>7}  exact")
    for name in ("S_full", "S_abs"):
        for shape in args.shapes:
            r, c = (int(x) for x in shape.split("x"))
            q = jnp.asarray(rng.integers(0, args.n, r).astype(np.int32))
            cols = jnp.asarray(rng.integers(0, args.n, c).astype(np.int32))
            sec = _median_seconds(lambda: block_fn(new[name], q, cols), args.repeats)
            r_old = max(1, min(r, args.old_max_pairs // c))
            c_old = min(c, args.old_max_pairs)
            q_old, c_old_ids = q[:r_old], cols[:c_old]
            sec_old = _median_seconds(lambda: old_fn(old[name], q_old, c_old_ids), max(1, min(args.repeats, 3)))
            fast, slow = r * c / sec, r_old * c_old / sec_old
            exact = "-"
            if name in dense_of:
                want = dense_of[name][np.ix_(np.asarray(q), np.asarray(cols))]
                exact = str(np.array_equal(np.asarray(block_fn(new[name], q, cols)), want))
            print(f"{name:<7} {shape:>8} {fast:>16,.0f} {slow:>12,.0f} {fast / slow:>6.1f}x  {exact}", flush=True)

    R = args.grouped_rows
    q = jnp.asarray(rng.integers(0, args.n, R).astype(np.int32))
    all_cols = jnp.arange(args.n, dtype=jnp.int32)
    if rows.abs_grouped is not None:
        g = rows.abs_grouped
        sec = _median_seconds(lambda: jax.jit(grouped_rows)(g, q), args.repeats)
        exact = (str(np.array_equal(np.asarray(grouped_rows(g, q)), graph.s_abs[np.asarray(q)]))
                 if "S_abs" in dense_of else "-")
        print(f"\nS_abs whole rows, R = {R}: grouped ({g.num_groups} distinct rows) {R / sec:,.0f} rows/s "
              f"({R * args.n / sec:,.0f} entries/s), exact {exact}")
    else:
        print("\nS_abs: too many distinct rows for the grouped table")
    sec = _median_seconds(lambda: block_fn(rows.abs, q, all_cols), args.repeats)
    print(f"S_abs whole rows, R = {R}: block_similarity {R / sec:,.0f} rows/s")

    print(f"\n{'matrix':<7} {'nnz/node':>9} {'P':>5} {'CSRRows B/node':>15} {'padded B/node':>14} {'ratio':>6}")
    for name in ("S_full", "S_abs"):
        n_new, n_old = new[name].nbytes() / args.n, old[name].nbytes() / args.n
        print(f"{name:<7} {new[name].nnz / args.n:>9.1f} {new[name].width:>5} {n_new:>15,.0f} {n_old:>14,.0f} "
              f"{n_old / n_new:>5.1f}x")
    if rows.abs_grouped is not None:
        g = rows.abs_grouped
        print(f"GroupedRows: {(g.group.nbytes + g.table.nbytes + g.radius.nbytes) / args.n:,.1f} B/node "
              f"(group ids + {g.num_groups}^2 table), plus the distinct rows")
    print("(rounding table shared by all: 4.0 MB)")


if __name__ == "__main__":
    main(tyro.cli(Args))
