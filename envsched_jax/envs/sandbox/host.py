"""What a jail needs from the host: the interpreter, the worker code, the allowed packages.

Both jails (bubblewrap, Docker) run the host's own Python interpreter, bind-mounted read-only, so
that no image has to be downloaded and environment code runs under exactly the interpreter the
in-process runs use (which is what makes replay agree across sandboxes). They see only:

- the interpreter's installation prefix (``sys.base_prefix``) and ``/usr`` (its shared libraries),
- :mod:`envsched_jax.envs.runtime` (the worker, standard library only) at :data:`RUNTIME_MOUNT`,
- the top-level packages named in ``site_packages`` (by default ``bfcl_eval`` and ``mpmath``,
  which BFCL's environments import), each at ``SITE_MOUNT/<name>``.

The project's source tree, the virtual environment, ``/home``, ``/root``, ``/etc`` and ``/work``
are not mounted at all. ``/usr`` is visible read-only; it holds no project data.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from envsched_jax.envs.sandbox.base import SandboxLimits

RUNTIME_MOUNT = "/opt/envsched/runtime"
SITE_MOUNT = "/opt/envsched/site"
SANDBOX_UID = 65534  # nobody: owner in the image's /etc/passwd; workers get their own uid
DEFAULT_SITE_PACKAGES: tuple[str, ...] = ("bfcl_eval", "mpmath")


def worker_uid() -> int:
    """A fresh unprivileged uid for one worker (from 10^8 to 2*10^8, far above any real user).

    The kernel counts ``RLIMIT_NPROC`` per uid over the whole machine, so a shared uid would let
    one worker's fork bomb block every other worker's processes; with its own uid each worker has
    its own process budget and cannot signal the others."""
    return 10**8 + secrets.randbelow(10**8)


def runtime_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "runtime"


def interpreter() -> tuple[str, str]:
    """(real interpreter path, installation prefix) of the running Python, venv resolved."""
    executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return executable, os.path.realpath(sys.base_prefix)


def package_dirs(names: tuple[str, ...]) -> dict[str, str]:
    """Host folder of each installed top-level package in ``names`` (missing ones are left out:
    an environment importing one then fails with ``ModuleNotFoundError``, named in its error)."""
    out = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            out[name] = os.path.realpath(list(spec.submodule_search_locations)[0])
    return out


@dataclasses.dataclass(frozen=True)
class Mount:
    source: str
    target: str


def mounts(site_packages: tuple[str, ...]) -> list[Mount]:
    """Read-only bind mounts of a jail (besides ``/usr``)."""
    _, prefix = interpreter()
    out = []
    if not prefix.startswith("/usr/") and prefix != "/usr":
        out.append(Mount(prefix, prefix))
    out.append(Mount(str(runtime_dir()), RUNTIME_MOUNT))
    for name, path in package_dirs(site_packages).items():
        out.append(Mount(path, f"{SITE_MOUNT}/{name}"))
    return out


def worker_argv(limits: SandboxLimits, drop_to_uid: int | None) -> list[str]:
    executable, _ = interpreter()
    config: dict[str, Any] = {"limits": limits.to_json(), "site_dirs": [SITE_MOUNT],
                              "drop_to_uid": drop_to_uid}
    return [executable, "-S", "-B", f"{RUNTIME_MOUNT}/worker.py", json.dumps(config)]


def root_links() -> list[tuple[str, str | None]]:
    """Top-level ``/bin``, ``/lib``, ``/lib64``, ``/sbin``: (name, symlink target or None for a
    real folder) as they are on the host (Debian 12 has merged ``/usr``: all are links)."""
    out = []
    for name in ("bin", "lib", "lib64", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            out.append((name, os.readlink(path)))
        elif path.is_dir():
            out.append((name, None))
    return out
