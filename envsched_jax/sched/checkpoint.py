"""Saving and restoring a scheduler with orbax: one step-numbered folder per checkpoint, the
arrays as an orbax PyTree and the header (scheduler name, next step, pool, graph fingerprint and
config) as JSON beside them.

:func:`restore_scheduler` reads and validates the whole checkpoint before it touches the
scheduler (see :meth:`~envsched_jax.sched.base.Scheduler.load_state_dict`): a missing or
unreadable file, a bad header, another pool, graph or config, or an array of the wrong shape,
dtype or with non-finite values raises :class:`CheckpointError` naming the folder, file, field or
array and the value, and the scheduler is left exactly as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

from envsched_jax.sched.base import CheckpointError, Scheduler


def save_scheduler(scheduler: Scheduler, directory: str | os.PathLike) -> Path:
    """Write ``scheduler.state_dict()`` to ``directory/step_<next step>``; returns that folder."""
    state = scheduler.state_dict()
    folder = Path(directory).absolute() / f"step_{state['header']['next_step']:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    with ocp.PyTreeCheckpointer() as ckpt:
        ckpt.save(folder / "arrays", state["arrays"], force=True)
    (folder / "header.json").write_text(json.dumps(state["header"], indent=2) + "\n")
    return folder


def restore_scheduler(scheduler: Scheduler, folder: str | os.PathLike) -> Scheduler:
    """Load a folder written by :func:`save_scheduler` into ``scheduler`` (built for the same pool,
    graph and config); returns it. Everything is validated before anything is replaced."""
    folder = Path(folder).absolute()
    header = _read_header(folder / "header.json")
    arrays = _read_arrays(folder / "arrays")
    scheduler.load_state_dict({"header": header, "arrays": arrays}, source=str(folder))
    return scheduler


def _read_header(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read the header ({err})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: line {err.lineno}: invalid JSON ({err.msg})") from None


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such array folder")
    try:
        with ocp.PyTreeCheckpointer() as ckpt:
            arrays = ckpt.restore(path)
    except Exception as err:  # orbax's read errors share no base class beyond Exception
        raise CheckpointError(f"{path}: cannot read the arrays ({type(err).__name__}: {err})") from None
    if not isinstance(arrays, dict):
        raise CheckpointError(f"{path}: expected a dict of arrays, got {type(arrays).__name__}")
    return arrays


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    folders = sorted(Path(directory).glob("step_*"))
    return folders[-1] if folders else None
