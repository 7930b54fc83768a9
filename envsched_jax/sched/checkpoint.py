"""Saving and restoring a scheduler with orbax: one step-numbered folder per checkpoint, the
arrays as an orbax PyTree and the header (scheduler name, next step, pool fingerprint) as JSON
beside them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp

from envsched_jax.sched.base import Scheduler


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
    """Load a folder written by :func:`save_scheduler` into ``scheduler`` (built for the same pool
    and config); returns it."""
    folder = Path(folder).absolute()
    header = json.loads((folder / "header.json").read_text())
    with ocp.PyTreeCheckpointer() as ckpt:
        arrays = ckpt.restore(folder / "arrays")
    scheduler.load_state_dict({"header": header, "arrays": {k: np.asarray(v) for k, v in arrays.items()}})
    return scheduler


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    folders = sorted(Path(directory).glob("step_*"))
    return folders[-1] if folders else None
