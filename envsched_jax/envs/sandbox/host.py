"""What a jail needs from the host: the interpreter, the worker code, the allowed packages.

Both jails (bubblewrap, Docker) run the host's own Python interpreter, bind-mounted read-only, so
that no image has to be downloaded and environment code runs under exactly the interpreter the
in-process runs use (which is what makes replay agree across sandboxes). They see only:

- ``/usr`` and the interpreter's installation prefix (``sys.base_prefix``), read-only, with every
  folder of installed third-party packages masked by an empty read-only tmpfs
  (:func:`masked_dirs`: ``site-packages``, ``dist-packages``, the wheels bundled for
  ``ensurepip``): the standard library is importable, no installed package is;
- a staged copy (:func:`staging_dir`), mounted at :data:`STAGE_MOUNT`, of the worker code
  (:mod:`envsched_jax.envs.runtime`, standard library only) and of the top-level packages named in
  ``site_packages`` (by default ``bfcl_eval`` and ``mpmath``, which BFCL's environments import).

The project's source tree, the virtual environment, ``/home``, ``/root``, ``/etc`` and ``/work``
are not mounted. What a jail can still learn about the host: the files under ``/usr`` and the
interpreter prefix, and, from ``/proc/self/mountinfo``, the host paths of these mounts (the
interpreter prefix, mounted at its own path, and the staging folder).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from envsched_jax.envs.sandbox.base import SandboxLimits

STAGE_MOUNT = "/opt/envsched"
RUNTIME_MOUNT = f"{STAGE_MOUNT}/runtime"
SITE_MOUNT = f"{STAGE_MOUNT}/site"
SANDBOX_UID = 65534  # nobody: owner in the image's /etc/passwd; workers get their own uid
DEFAULT_SITE_PACKAGES: tuple[str, ...] = ("bfcl_eval", "mpmath")
RUNTIME_FILES = ("core.py", "frames.py", "hardening.py", "worker.py")

# Imported once by each jail's supervisor before any episode: the modules environment code
# commonly imports, so that episode processes (forked from it) do not import them again.
STDLIB_PRELOAD = ("copy", "collections", "dataclasses", "datetime", "decimal", "enum",
                  "functools", "itertools", "math", "random", "re", "string", "typing", "uuid")
BFCL_MODULES_DIR = ("eval_checker", "multi_turn_eval", "func_source_code")


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


def masked_dirs() -> list[str]:
    """Folders of installed third-party packages under ``/usr`` and the interpreter prefix,
    which the jails cover with an empty read-only tmpfs."""
    _, prefix = interpreter()
    roots = sorted({prefix, "/usr", "/usr/local"})
    patterns = []
    for root in roots:
        patterns += [f"{root}/lib/python3*/site-packages", f"{root}/lib/python3*/dist-packages",
                     f"{root}/lib/python3/dist-packages", f"{root}/lib/python3*/ensurepip/_bundled",
                     f"{root}/local/lib/python3*/site-packages",
                     f"{root}/local/lib/python3*/dist-packages", f"{root}/share/python-wheels"]
    found = {os.path.realpath(p) for pattern in patterns for p in glob.glob(pattern)
             if os.path.isdir(p) and not os.path.islink(p)}
    return sorted(p for p in found if p.startswith(("/usr/", prefix + "/")))


def preload_when(site_packages: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules a supervisor imports the first time an environment's source names the key:
    BFCL's API classes (importing them takes about half a second, so only jails that serve BFCL
    pay it, once)."""
    dirs = package_dirs(site_packages)
    if "bfcl_eval" not in dirs:
        return {}
    folder = Path(dirs["bfcl_eval"]).joinpath(*BFCL_MODULES_DIR)
    return {"bfcl_eval": [f"bfcl_eval.{'.'.join(BFCL_MODULES_DIR)}.{p.stem}"
                          for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]}


def _cache_root() -> Path:
    env = os.environ.get("ENVSCHED_JAIL_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/envsched_jax/jail")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "envsched_jax" / "jail"


def _content_key(packages: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in RUNTIME_FILES:
        digest.update(name.encode() + b"\0" + (runtime_dir() / name).read_bytes())
    for name, folder in sorted(packages.items()):
        digest.update(f"package {name} {folder}\0".encode())
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                digest.update(f"{path.relative_to(folder)} {st.st_size} {st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:20]


_stage_lock = threading.Lock()
_staged: dict[tuple[str, ...], Path] = {}


def staging_dir(site_packages: tuple[str, ...]) -> Path:
    """A read-only-by-convention folder holding ``runtime/`` (the worker code) and ``site/<pkg>``
    (copies of the allowed packages), named by the hash of its content and built once per
    machine (atomically: copied aside, then renamed into place)."""
    key_names = tuple(sorted(site_packages))
    with _stage_lock:
        if key_names in _staged and _staged[key_names].is_dir():
            return _staged[key_names]
        packages = package_dirs(key_names)
        root = _cache_root()
        final = root / _content_key(packages)
        if not final.is_dir():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            scratch = root / f".building-{secrets.token_hex(6)}"
            (scratch / "runtime").mkdir(parents=True)
            for name in RUNTIME_FILES:
                shutil.copyfile(runtime_dir() / name, scratch / "runtime" / name)
            (scratch / "site").mkdir()
            for name, folder in packages.items():
                shutil.copytree(folder, scratch / "site" / name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            for dirpath, dirnames, filenames in os.walk(scratch):
                os.chmod(dirpath, 0o755)
                for f in filenames:
                    os.chmod(os.path.join(dirpath, f), 0o644)
            try:
                os.rename(scratch, final)
            except OSError:  # another process staged the same content first
                shutil.rmtree(scratch, ignore_errors=True)
        _staged[key_names] = final
        return final


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
    out.append(Mount(str(staging_dir(site_packages)), STAGE_MOUNT))
    return out


def worker_argv(limits: SandboxLimits, drop_to_uid: int | None,
                site_packages: tuple[str, ...]) -> list[str]:
    executable, _ = interpreter()
    config: dict[str, Any] = {"limits": limits.to_json(), "site_dirs": [SITE_MOUNT],
                              "drop_to_uid": drop_to_uid, "preload": list(STDLIB_PRELOAD),
                              "preload_when": preload_when(site_packages)}
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
