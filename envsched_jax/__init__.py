"""envsched_jax: environment-level data management for agentic RL in JAX.

Start with :mod:`envsched_jax.pool` (task pools), :mod:`envsched_jax.graph` (the static
dual-relation graph) and :mod:`envsched_jax.sched` (EnvSched and the other schedulers).
"""

__version__ = "0.1.0"
