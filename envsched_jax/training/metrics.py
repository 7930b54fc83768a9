"""A run's metrics: one JSON line per record, TensorBoard event files, PNG curves.

:class:`MetricsLog` appends ``{"kind": ..., "step": ..., <scalars>}`` records to
``metrics.jsonl`` (the source of truth: plain text, appended and flushed per record so a killed
run keeps what it logged) and mirrors every scalar to TensorBoard event files under ``tb/``
(``tensorboard --logdir runs/...``) through ``tensorboardX``. A resumed run appends to both.
:func:`plot_curves` draws the curves of one or several runs from their ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, folder: str | Path, *, tensorboard: bool = True):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.folder / "tb"))

    def log(self, kind: str, step: int, values: Mapping[str, Any]) -> None:
        record = {"kind": kind, "step": int(step), **values}
        self._file.write(json.dumps(record, sort_keys=True, default=_jsonable) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{name}", value, int(step))
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (of one kind); a later record of the same kind and
    step replaces an earlier one (a resumed run re-logs the steps after its checkpoint)."""
    records: dict[tuple[str, int], dict[str, Any]] = {}
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: invalid JSON ({err.msg})") from None
            if kind is None or record.get("kind") == kind:
                records[(record["kind"], record["step"])] = record
    return sorted(records.values(), key=lambda r: (r["kind"], r["step"]))


DEFAULT_PANELS: tuple[tuple[str, str, str], ...] = (
    ("step", "mean_reward", "training reward (batch mean)"),
    ("eval", "heldout_reward", "held-out reward"),
    ("step", "group_variance", "within-group reward variance"),
    ("step", "environments", "environments per batch"),
)
"""(kind, metric, title) of the panels :func:`plot_curves` draws by default."""


def plot_curves(runs: Mapping[str, str | Path], out: str | Path,
                panels: Sequence[tuple[str, str, str]] = DEFAULT_PANELS) -> Path:
    """One PNG with a panel per ``(kind, metric, title)``; one line per run (label -> its
    ``metrics.jsonl``), or per label prefix's mean over seeds is left to the caller."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (kind, metric, title) in zip(axes, panels):
        for label, path in runs.items():
            rows = [r for r in read_metrics(path, kind) if metric in r]
            if rows:
                ax.plot([r["step"] for r in rows], [r[metric] for r in rows], label=label,
                        marker="." if kind == "eval" else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
