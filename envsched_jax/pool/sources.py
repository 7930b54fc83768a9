"""Pool specifications: one string names any pool the project can load.

=========================================  ================================================
spec                                        pool
=========================================  ================================================
``embedded``                                the embedded default pool (8+ environments)
``generated:51x50`` / ``generated:51x50:7``  seeded synthetic pool, 51 environments x 50 tasks
``generated:100000`` / ``generated:2550:3``  seeded synthetic pool of that many tasks
``bfcl`` / ``bfcl:base,miss_func``          BFCL-v3 multi-turn (all four categories by default)
``bfcl:miss_func,withheld_calls=refuse``    ... with the loader's stricter options (see below)
``envscaler:ENV_FILE:TASK_FILE``            EnvScaler RL-format files you downloaded
``envscaler:ENV:TASKS,mode=conversational``  ... with the loader's options (see below)
``PATH.jsonl``                              a pool in the canonical JSON-lines form
``bundles:DIR`` / ``bundles:DIR1:DIR2``     every task bundle folder under DIR (terminal tasks)
=========================================  ================================================

A ``bfcl`` spec's comma list may hold ``state_equality=exact`` and ``withheld_calls=refuse``
(:func:`envsched_jax.pool.bfcl.load_bfcl_pool`; both off by default, where the pool follows BFCL's
checker). An ``envscaler`` spec may end with ``,private_methods=refuse`` and
``,mode=conversational`` (:func:`envsched_jax.pool.envscaler.load_envscaler_pool`; EnvScaler's
rules by default), so its task file's name must not hold ``,NAME=``. A ``bundles`` spec loads
Harbor / Terminal-Bench bundles (:mod:`envsched_jax.pool.bundles`: one environment per category,
one task per bundle, played in Docker by :mod:`envsched_jax.envs.terminal`); its directories are
separated by ``os.pathsep``. EnvScaler, JSON-lines and bundle pools accept ``drop_invalid`` (leave
out broken records, list them in ``Pool.dropped``).
"""

from __future__ import annotations

import re
from pathlib import Path

from envsched_jax.pool.model import Pool, PoolError

SPEC_HELP = ("embedded | generated:ENVSxTASKS[:SEED] | generated:N[:SEED] | bfcl[:CATEGORIES[,OPTION=VALUE]] | "
             "envscaler:ENV_FILE:TASK_FILE[,OPTION=VALUE] | PATH.jsonl | bundles:DIR[:DIR...]")


def load_pool(spec: str, *, drop_invalid: bool = False) -> Pool:
    """Load the pool named by ``spec`` (see the module docstring)."""
    if spec == "embedded":
        from envsched_jax.pool.embedded import load_embedded_pool

        return load_embedded_pool()
    if spec.startswith("generated:"):
        from envsched_jax.pool.generator import generate_pool, generate_pool_of_size

        m = re.fullmatch(r"generated:(\d+)x(\d+)(?::(\d+))?", spec)
        if m:
            return generate_pool(int(m[1]), int(m[2]), seed=int(m[3] or 0))
        m = re.fullmatch(r"generated:(\d+)(?::(\d+))?", spec)
        if m:
            return generate_pool_of_size(int(m[1]), seed=int(m[2] or 0))
        raise PoolError(f"cannot parse pool spec {spec!r}; expected generated:ENVSxTASKS[:SEED] "
                        "or generated:N[:SEED]")
    if spec == "bfcl" or spec.startswith("bfcl:"):
        from envsched_jax.pool.bfcl import load_bfcl_pool

        if spec == "bfcl":
            return load_bfcl_pool()
        parts = [c for c in spec[5:].split(",") if c]
        options = dict(p.split("=", 1) for p in parts if "=" in p)
        unknown = sorted(set(options) - {"state_equality", "withheld_calls"})
        if unknown:
            raise PoolError(f"cannot parse pool spec {spec!r}: unknown option(s) {unknown}; a bfcl "
                            "spec takes categories and state_equality=..., withheld_calls=...")
        categories = tuple(p for p in parts if "=" not in p)
        return load_bfcl_pool(**({"categories": categories} if categories else {}), **options)
    if spec.startswith("envscaler:"):
        from envsched_jax.pool.envscaler import load_envscaler_pool

        parts = spec.split(":", 2)
        if len(parts) != 3 or not all(parts[1:]):
            raise PoolError(f"cannot parse pool spec {spec!r}; expected envscaler:ENV_FILE:TASK_FILE")
        task_file, *pairs = re.split(r",(?=\w+=)", parts[2])
        options = dict(p.split("=", 1) for p in pairs)
        unknown = sorted(set(options) - {"private_methods", "mode"})
        if unknown:
            raise PoolError(f"cannot parse pool spec {spec!r}: unknown option(s) {unknown}; an "
                            "envscaler spec takes private_methods=..., mode=...")
        return load_envscaler_pool(parts[1], task_file, drop_invalid=drop_invalid, **options)
    if spec.startswith("bundles:"):
        from envsched_jax.pool.bundles import load_bundle_spec

        return load_bundle_spec(spec, drop_invalid=drop_invalid)
    path = Path(spec)
    if path.suffix == ".jsonl" or path.is_file():
        from envsched_jax.pool.jsonl import read_pool

        return read_pool(path, drop_invalid=drop_invalid)
    raise PoolError(f"unknown pool spec {spec!r}; expected one of: {SPEC_HELP}")
