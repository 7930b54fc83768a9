"""Shared fixtures. Tests run on CPU; JAX is kept on one host device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def envscaler_files() -> tuple[Path, Path]:
    return FIXTURES / "envscaler" / "env_metadata.json", FIXTURES / "envscaler" / "tasks.json"


@pytest.fixture(scope="session")
def envscaler_pool(envscaler_files):
    from envsched_jax.pool.envscaler import load_envscaler_pool

    return load_envscaler_pool(*envscaler_files)
