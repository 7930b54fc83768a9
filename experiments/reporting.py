"""Small helpers shared by the paper-reproduction scripts: run folders, CSV, intervals, tables."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats


def run_folder(out: Path, args) -> Path:
    """Create ``out`` and record the arguments the script ran with."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(_jsonable(args), indent=2, default=str) + "\n")
    return out


def _jsonable(args):
    import dataclasses

    return dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))


def write_csv(path: Path, rows: Sequence[Mapping]) -> Path:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean (NaN half-width for one value)."""
    x = np.asarray(values, float)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return m, m - half, m + half


def fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "--"
    return f"{value:.{digits}f}"


def rel(ours: float, base: float) -> str:
    return "--" if base == 0 or np.isnan(base) else f"{100 * (ours / base - 1):+.0f}%"


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
