"""Parametrisation shared by the sandbox tests."""

from __future__ import annotations

import pytest

from envsched_jax.envs.sandbox import unavailable_reason


def sandbox_param(kind: str):
    """``pytest.param(kind)``, marked ``docker`` for Docker, and skipped with the concrete reason
    (no bwrap binary, no engine answering) where that sandbox cannot run on this machine."""
    marks = [pytest.mark.docker] if kind == "docker" else []
    reason = unavailable_reason(kind)
    if reason:
        marks.append(pytest.mark.skip(reason=f"{kind} sandbox unavailable here: {reason}"))
    return pytest.param(kind, marks=marks, id=kind)
