"""Bubblewrap backend: each worker is a subprocess jailed with ``bwrap``, serving over a pipe.

The jail (see :func:`bwrap_argv`): new mount, PID, network, IPC and UTS namespaces (no network
interface but a down loopback), only the read-only mounts of :mod:`.host` plus a fresh ``/proc``,
a minimal ``/dev`` and a private, size-limited tmpfs ``/tmp``; a new session (no access to the
parent's terminal) and ``--die-with-parent``; an empty environment. The worker sets its rlimits
itself (:mod:`envsched_jax.envs.runtime.worker`).

Run as root (as CI does), bubblewrap creates the namespaces without a user namespace and the
worker drops to a fresh unprivileged uid (:func:`.host.worker_uid`) before it reads a request,
because the kernel does not apply ``RLIMIT_NPROC`` to root; run as an ordinary user, bubblewrap
adds a user namespace and the worker keeps the caller's uid. On timeout the parent kills the whole process group (bwrap, its
PID-namespace init and everything inside).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import PurePosixPath

from envsched_jax.envs.sandbox import host
from envsched_jax.envs.sandbox.base import SandboxLimits, SandboxUnavailable
from envsched_jax.envs.sandbox.stream import StreamWorker


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def unavailable_reason() -> str | None:
    """Why bubblewrap cannot be used here, or None."""
    if bwrap_path() is None:
        return "bubblewrap is not installed (no 'bwrap' on PATH; apt-get install bubblewrap)"
    return None


def bwrap_argv(limits: SandboxLimits, site_packages: tuple[str, ...], *, as_root: bool) -> list[str]:
    argv = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if not as_root:
        argv.append("--unshare-user")
    argv += ["--ro-bind", "/usr", "/usr"]
    for name, target in host.root_links():
        argv += (["--symlink", target, f"/{name}"] if target is not None
                 else ["--ro-bind", f"/{name}", f"/{name}"])
    mounts = host.mounts(site_packages)
    # bwrap creates missing parents of a mount point with mode 0700 (owned by root), which the
    # worker could not traverse after dropping to nobody: create them world-readable first.
    parents = sorted({str(p) for m in mounts for p in PurePosixPath(m.target).parents
                      if str(p) != "/"}, key=lambda p: p.count("/"))
    for parent in parents:
        argv += ["--perms", "0755", "--dir", parent]
    for mount in mounts:
        argv += ["--ro-bind", mount.source, mount.target]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
             "--chdir", "/tmp",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "LANG", "C.UTF-8", "--"]
    argv += host.worker_argv(limits, host.worker_uid() if as_root else None)
    return argv


class BwrapWorker(StreamWorker):
    def __init__(self, limits: SandboxLimits, site_packages: tuple[str, ...]):
        super().__init__(limits)
        argv = bwrap_argv(limits, site_packages, as_root=os.geteuid() == 0)
        start = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self._out = self.proc.stdout.fileno()
        hello = self.request({"op": "hello"}, timeout=max(limits.wall_seconds, 10.0))
        self.startup_seconds = time.perf_counter() - start
        self.uid = hello["uid"]

    def _send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _recv(self, n: int, deadline: float) -> bytes:
        ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return b""
        return os.read(self._out, min(n, 1 << 20))

    def _exit_cause(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "no exit status"
        if code < 0:
            name = signal.Signals(-code).name
            hint = {"SIGKILL": " (killed: a hard limit or the OOM killer)",
                    "SIGXCPU": " (CPU time limit)"}.get(name, "")
            return f"signal {name}{hint}"
        err = self.proc.stderr.read(2000).decode(errors="replace").strip() if code else ""
        return f"exit status {code}" + (f": {err}" if err else "")

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


class BwrapBackend:
    name = "bwrap"

    def __init__(self, limits: SandboxLimits, site_packages: tuple[str, ...]):
        reason = unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)
        self.limits = limits
        self.site_packages = site_packages

    def start_worker(self) -> BwrapWorker:
        return BwrapWorker(self.limits, self.site_packages)

    def close(self) -> None:
        pass
