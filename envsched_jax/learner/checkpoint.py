"""Checkpoints of a training run: the train state and, optionally, the scheduler, in one folder.

``directory/step_<step>/`` holds

- ``train_state/``: every array of the :class:`~envsched_jax.learner.trainer.TrainState`
  (parameters, optimizer state, step, key), written by orbax as a flat mapping ``leaf_00000`` ...
  in the state's tree order;
- ``train_state.json``: the sidecar: the trainer config, each leaf's tree path, shape and dtype,
  and anything the caller adds under ``extra`` (e.g. the model's source and config);
- ``scheduler/`` + ``scheduler.json``: the scheduler's arrays and header
  (:meth:`~envsched_jax.sched.base.Scheduler.state_dict`), when a scheduler is given.

:func:`restore_checkpoint` reads and checks everything first (the config must equal the run's,
every leaf's path, shape and dtype must match the state it restores into, the scheduler's snapshot
is validated by the scheduler) and only then returns the new state and loads the scheduler; a
restored run continues bit-identically (``tests/test_learner_trainer.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from envsched_jax.learner.trainer import TrainerConfig, TrainState
from envsched_jax.sched.base import Scheduler


class TrainCheckpointError(ValueError):
    """A checkpoint that cannot be restored into this run; names the folder and the problem."""


def _config_json(config: TrainerConfig) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _leaves(state: TrainState) -> tuple[list[str], list[Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return [jax.tree_util.keystr(path) for path, _ in flat], [leaf for _, leaf in flat]


def save_checkpoint(directory: str | os.PathLike, state: TrainState, config: TrainerConfig, *,
                    scheduler: Scheduler | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``directory/step_<state.step>``; returns the folder."""
    step = int(jax.device_get(state.step))
    folder = Path(directory).absolute() / f"step_{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    paths, leaves = _leaves(state)
    arrays = {f"leaf_{k:05d}": np.asarray(jax.device_get(leaf)) for k, leaf in enumerate(leaves)}
    with ocp.PyTreeCheckpointer() as ckpt:
        ckpt.save(folder / "train_state", arrays, force=True)
    sidecar = {"step": step, "config": _config_json(config),
               "leaves": [{"path": p, "shape": list(a.shape), "dtype": str(a.dtype)}
                          for p, a in zip(paths, arrays.values())],
               "extra": extra or {}}
    (folder / "train_state.json").write_text(json.dumps(sidecar, indent=2) + "\n")
    if scheduler is not None:
        snapshot = scheduler.state_dict()
        with ocp.PyTreeCheckpointer() as ckpt:
            ckpt.save(folder / "scheduler", snapshot["arrays"], force=True)
        (folder / "scheduler.json").write_text(json.dumps(snapshot["header"], indent=2) + "\n")
    return folder


def restore_checkpoint(folder: str | os.PathLike, state: TrainState, config: TrainerConfig, *,
                       scheduler: Scheduler | None = None) -> TrainState:
    """The state saved in ``folder``, shaped and placed like ``state`` (the run's fresh state,
    used as the template: its shardings are kept); loads the scheduler too when given. Nothing is
    changed unless everything checks out."""
    folder = Path(folder).absolute()

    def fail(message: str) -> TrainCheckpointError:
        return TrainCheckpointError(f"{folder}: {message}")

    try:
        sidecar = json.loads((folder / "train_state.json").read_text())
    except (OSError, ValueError) as err:
        raise fail(f"cannot read train_state.json ({err})") from None
    if sidecar.get("config") != _config_json(config):
        raise fail("the checkpoint was written under another trainer config: "
                   f"{sidecar.get('config')} != {_config_json(config)}")
    paths, leaves = _leaves(state)
    saved = sidecar.get("leaves", [])
    if [s["path"] for s in saved] != paths:
        raise fail(f"the state's structure differs ({len(saved)} saved leaves, {len(paths)} here)")
    for entry, leaf in zip(saved, leaves):
        if tuple(entry["shape"]) != tuple(leaf.shape) or entry["dtype"] != str(leaf.dtype):
            raise fail(f"leaf {entry['path']} is {entry['dtype']}{entry['shape']}, "
                       f"expected {leaf.dtype}{list(leaf.shape)}")
    try:
        with ocp.PyTreeCheckpointer() as ckpt:
            arrays = ckpt.restore(folder / "train_state")
    except Exception as err:  # orbax raises several types for missing or broken files
        raise fail(f"cannot read train_state/ ({type(err).__name__}: {err})") from None
    values = [np.asarray(arrays[f"leaf_{k:05d}"]) for k in range(len(leaves))]
    if scheduler is not None:
        try:
            header = json.loads((folder / "scheduler.json").read_text())
            with ocp.PyTreeCheckpointer() as ckpt:
                sched_arrays = ckpt.restore(folder / "scheduler")
        except Exception as err:
            raise fail(f"cannot read the scheduler's snapshot ({type(err).__name__}: {err})") from None
        # validates everything before it swaps anything in (raises CheckpointError otherwise)
        scheduler.load_state_dict({"header": header,
                                   "arrays": {k: np.asarray(v) for k, v in sched_arrays.items()}},
                                  source=str(folder / "scheduler"))
    placed = [jax.device_put(v, getattr(leaf, "sharding", None)) for v, leaf in zip(values, leaves)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), placed)
