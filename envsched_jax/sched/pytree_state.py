"""Snapshot helpers for schedulers whose whole memory is one ``flax.struct`` dataclass of arrays
(DPS, MoPPS, the LEEPS reconstruction): ``state_dict`` arrays are its fields by name."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np


def state_arrays(state) -> dict[str, np.ndarray]:
    """Copies of every field of ``state`` as numpy arrays."""
    return {f.name: np.array(getattr(state, f.name)) for f in dataclasses.fields(state)}


def load_state_arrays(state, arrays: dict[str, np.ndarray]):
    """``state`` with every field replaced from ``arrays``, which
    :meth:`~envsched_jax.sched.base.Scheduler.load_state_dict` has already checked against
    :func:`state_arrays` (names, shapes, dtypes, finite values)."""
    return state.replace(**{name: jnp.asarray(value) for name, value in arrays.items()})
