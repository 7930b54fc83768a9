"""Label-based quality of the static graph's neighbour lists, per pool.

Builds each pool's graph and scores it with :func:`envsched_jax.graph.quality.graph_quality`:
within-environment precision@k of the state-changing tool set, cross-environment precision@k of
the pool's own task categories (where it has them), each beside its chance level; hubness of both
relations; distinct abstract descriptions. Prints one table per pool and writes RUN/quality.json
(one report per pool) and RUN/args.json.

Usage:
    python experiments/neighbour_quality.py
    python experiments/neighbour_quality.py --pools embedded --out runs/neighbour_quality-embedded
    python experiments/neighbour_quality.py --pools generated:51x50 --graph.num-candidates 64
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import tyro
from reporting import fmt, run_folder
from rich.console import Console
from rich.table import Table

from envsched_jax.graph.build import GraphConfig, build_graph
from envsched_jax.graph.quality import GraphQualityReport, PrecisionReport, graph_quality
from envsched_jax.pool.sources import load_pool
from envsched_jax.sched.config import EnvSchedConfig

_SCHED = EnvSchedConfig()


@dataclasses.dataclass(frozen=True)
class Args:
    pools: tuple[str, ...] = ("embedded", "generated:51x50", "bfcl")
    """Pool specs (see `envsched pool inspect --help`)."""
    out: Path = Path("runs/neighbour_quality")
    """Run folder: quality.json and args.json."""
    k_within: int = _SCHED.k_within
    """K_within: within-environment neighbourhood scored (precision@K, hubness N_K)."""
    k_cross: int = _SCHED.k_cross
    """K_cross: cross-environment neighbourhood scored."""
    graph: GraphConfig = GraphConfig()
    """Graph build settings."""


def _precision_row(table: Table, name: str, result: PrecisionReport | str) -> None:
    if isinstance(result, str):
        table.add_row(name, result, *[""] * (len(table.columns) - 2))
        return
    table.add_row(name, *(fmt(p, 3) for p in result.precision), fmt(result.chance, 3),
                  fmt(result.ratio[-1], 2), str(result.num_distinct_labels), str(result.num_unlabelled))


def report_tables(report: GraphQualityReport, seconds: float) -> list[Table]:
    """The precision table (within and cross) and the hubness table of one pool's report."""
    title = (f"{report.pool_name}: N={report.num_nodes}, {report.num_environments} envs, "
             f"M={report.num_candidates}, built in {seconds:.1f} s")
    tables = []
    for relation, k, rows in (("within", report.k_within, {"tool set": report.within_precision}),
                              ("cross", report.k_cross, report.cross_precision)):
        ks = next((r.ks for r in rows.values() if not isinstance(r, str)), (1, 5, k))
        table = Table(title=title if relation == "within" else None)
        for column in (f"{relation} label", *(f"P@{k}" for k in ks), "chance", f"P@{ks[-1]}/chance",
                       "labels", "unlabelled"):
            table.add_column(column)
        for name, result in rows.items():
            _precision_row(table, name, result)
        tables.append(table)
    hubs = Table()
    for column in ("relation", "top-1 hub in-degree", "share", "distinct top-1", "skew N_1", "k",
                   "max N_k", "skew N_k"):
        hubs.add_column(column)
    for relation, hub in (("within", report.within_hubness), ("cross", report.cross_hubness)):
        hubs.add_row(relation, f"{hub.top1_max_in_degree} ({hub.top1_hub_task})",
                     f"{fmt(100 * hub.top1_hub_share, 1)}%", str(hub.top1_distinct),
                     fmt(hub.top1_skewness, 2), str(hub.k), str(hub.topk_max_in_degree),
                     fmt(hub.topk_skewness, 2))
    tables.append(hubs)
    return tables


def report_lines(report: GraphQualityReport) -> list[str]:
    lines = [f"within label: {report.within_label_source}"]
    pair = report.cross_worst_pair
    if pair is not None:
        lines.append(f"worst cross pair: {pair.target_task} ({pair.target_env}) is the top-1 cross "
                     f"neighbour of {pair.count} of {pair.source_size} tasks of {pair.source_env}")
    d = report.distinct_abstract
    lines.append(f"distinct abstract descriptions: {d.distinct_texts} texts, {d.distinct_rows} TF-IDF "
                 f"rows of {d.num_nodes} nodes ({fmt(100 * d.text_ratio, 1)}%, {fmt(100 * d.row_ratio, 1)}%)")
    return lines


def main(args: Args) -> dict[str, dict]:
    out = run_folder(args.out, args)
    console = Console(width=max(Console().width, 120))
    results: dict[str, dict] = {}
    for spec in args.pools:
        pool = load_pool(spec)
        start = time.perf_counter()
        graph = build_graph(pool, args.graph, progress=True)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        report = graph_quality(pool, graph, args.k_within, args.k_cross)
        score_s = time.perf_counter() - start
        for table in report_tables(report, build_s):
            console.print(table)
        for line in report_lines(report):
            console.print(line, highlight=False)
        results[spec] = {"build_s": build_s, "score_s": score_s, **report.to_json()}
    (out / "quality.json").write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"figures written to {out / 'quality.json'}")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
