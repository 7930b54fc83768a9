"""Task pools: the data model, the canonical JSON-lines form and the loaders.

``load_pool(spec)`` loads any pool by name (see :mod:`envsched_jax.pool.sources`); the loaders
themselves are :func:`~envsched_jax.pool.envscaler.load_envscaler_pool`,
:func:`~envsched_jax.pool.bfcl.load_bfcl_pool`,
:func:`~envsched_jax.pool.embedded.load_embedded_pool` and
:func:`~envsched_jax.pool.generator.generate_pool`.

Every loader turns a broken file (not UTF-8, not JSON, duplicate keys, nesting or integers beyond
the limits of :mod:`~envsched_jax.pool.jsontext`, no records) into a :class:`PoolError` naming the
file and the line, and an empty pool (no task or no environment) is an error, never a pool.
"""

from envsched_jax.pool.jsonl import read_pool, write_pool
from envsched_jax.pool.model import (
    Action,
    Check,
    Environment,
    Operation,
    Pool,
    PoolError,
    PoolValidationErrors,
    Task,
)
from envsched_jax.pool.sources import load_pool

__all__ = ["Action", "Check", "Environment", "Operation", "Pool", "PoolError", "PoolValidationErrors",
           "Task", "load_pool", "read_pool", "write_pool"]
