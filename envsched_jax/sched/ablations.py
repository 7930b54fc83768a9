"""EnvSched's ablations (paper Table 3) as named configurations of the one implementation.

Each entry is a set of :class:`~envsched_jax.sched.config.EnvSchedConfig` overrides; nothing is
forked. Panel (a) varies one component, panel (b) halves or doubles one neighbourhood size
around the defaults K_within = 6, K_cross = 12::

    config = ablation_config("within_only")            # EnvSchedConfig(relations="within")
    sched = make_scheduler("envsched", graph, config=config)
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from envsched_jax.sched.config import EnvSchedConfig

ABLATIONS = MappingProxyType({
    # (a) components
    "full": {},
    "within_only": {"relations": "within"},
    "cross_only": {"relations": "cross"},
    "coverage_only": {"rho": 1.0},
    "exploitation_only": {"rho": 0.0},
    # (b) neighbourhood sizes (K_within, K_cross)
    "k3_12": {"k_within": 3, "k_cross": 12},
    "k12_12": {"k_within": 12, "k_cross": 12},
    "k6_6": {"k_within": 6, "k_cross": 6},
    "k6_24": {"k_within": 6, "k_cross": 24},
})
"""Ablation name -> EnvSchedConfig overrides."""


def ablation_config(name: str, base: EnvSchedConfig | None = None) -> EnvSchedConfig:
    """``base`` (paper defaults if None) with the overrides of ablation ``name``."""
    try:
        overrides = ABLATIONS[name]
    except KeyError:
        raise ValueError(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}") from None
    return dataclasses.replace(base or EnvSchedConfig(), **overrides)
