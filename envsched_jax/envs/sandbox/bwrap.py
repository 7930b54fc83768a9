"""Bubblewrap backend: each worker is a subprocess jailed with ``bwrap``, serving over a pipe.

The jail (see :func:`bwrap_argv`): new mount, PID, network, IPC and UTS namespaces (no network
interface but a down loopback), only the read-only mounts of :mod:`.host` (installed packages
masked) plus a fresh ``/proc``, a minimal ``/dev`` with a size-limited ``/dev/shm``, and a
private, size-limited tmpfs ``/tmp``; a new session (no access to the parent's terminal); an
empty environment. The supervisor runs as PID 1 of the jail (``--as-pid-1``): it cannot be
signalled from inside, and when it dies the kernel kills everything else in the jail. It sets
its rlimits and seccomp filter itself (:mod:`envsched_jax.envs.runtime.worker`), which also
refuses new user namespaces: bubblewrap's own ``--disable-userns`` needs a user namespace, which
the root case below does not use.

Run as root (as CI does), bubblewrap creates the namespaces without a user namespace and the
supervisor drops to a fresh unprivileged uid (:func:`.host.worker_uid`) before it reads a
request, because the kernel does not apply ``RLIMIT_NPROC`` to root; run as an ordinary user,
bubblewrap adds a user namespace and the supervisor keeps the caller's uid.

Lifetime. ``--die-with-parent`` ties a jail to the thread that started it (the kernel's parent-
death signal follows the creating thread, not the process), so every jail is started from one
long-lived spawner thread (:func:`_spawn`) that lives as long as the owning process: a jail
outlives the rollout threads that leased it and dies with its owner, also when the owner is
killed. A jail whose supervisor sees its stream close also exits. On timeout the parent kills
the jail's process group.
"""

from __future__ import annotations

import os
import queue
import select
import shutil
import signal
import subprocess
import threading
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
    argv = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session", "--as-pid-1",
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
    for folder in host.masked_dirs():
        argv += ["--size", "4096", "--tmpfs", folder, "--remount-ro", folder]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
             "--chdir", "/tmp",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "LANG", "C.UTF-8", "--"]
    argv += host.worker_argv(limits, host.worker_uid() if as_root else None, site_packages)
    return argv


_spawn_requests: queue.Queue = queue.Queue()
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def _spawner_loop() -> None:
    while True:
        argv, reply = _spawn_requests.get()
        try:
            reply.put(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True))
        except BaseException as err:  # handed to the caller, raised there
            reply.put(err)


def _spawn(argv: list[str]) -> subprocess.Popen:
    """Start ``argv`` from the process-long spawner thread (see the module docstring)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawner_loop, name="envsched-bwrap-spawner",
                                        daemon=True)
            _spawner.start()
    reply: queue.Queue = queue.Queue(maxsize=1)
    _spawn_requests.put((argv, reply))
    result = reply.get()
    if isinstance(result, BaseException):
        raise result
    return result


class BwrapWorker(StreamWorker):
    def __init__(self, limits: SandboxLimits, site_packages: tuple[str, ...]):
        super().__init__(limits)
        argv = bwrap_argv(limits, site_packages, as_root=os.geteuid() == 0)
        start = time.perf_counter()
        self.proc = _spawn(argv)
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
            hint = {"SIGKILL": " (killed from outside the jail: the OOM killer or a signal to "
                               "its process group)"}.get(name, "")
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
