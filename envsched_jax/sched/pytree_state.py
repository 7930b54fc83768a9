"""Snapshot helpers for schedulers whose whole memory is one ``flax.struct`` dataclass of arrays
(DPS, MoPPS, the LEEPS reconstruction): ``state_dict`` arrays are its fields by name."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from envsched_jax.sched.base import SchedulerInputError


def state_arrays(state) -> dict[str, np.ndarray]:
    """Copies of every field of ``state`` as numpy arrays."""
    return {f.name: np.array(getattr(state, f.name)) for f in dataclasses.fields(state)}


def load_state_arrays(state, arrays: dict[str, np.ndarray], scheduler: str):
    """``state`` with every field replaced from ``arrays`` (same names, shapes; dtypes cast to the
    current ones). Raises :class:`SchedulerInputError` and returns nothing on a mismatch."""
    fields = {f.name for f in dataclasses.fields(state)}
    if set(arrays) != fields:
        raise SchedulerInputError(f"{scheduler} state needs exactly {sorted(fields)}, got {sorted(arrays)}")
    new = {}
    for name in fields:
        current = getattr(state, name)
        value = np.asarray(arrays[name])
        if value.shape != current.shape:
            raise SchedulerInputError(f"{scheduler} state array {name!r} has shape {value.shape}, "
                                      f"expected {current.shape}")
        new[name] = jnp.asarray(value, current.dtype)
    return state.replace(**new)
