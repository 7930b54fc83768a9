"""What every sandbox backend shares: limits, the worker handle, the reusable worker pool.

A *worker* is one long-lived jail that serves many episodes (starting a jail costs tens of
milliseconds for bubblewrap and about half a second for Docker; inside it, each episode runs in
fresh processes: see :mod:`envsched_jax.envs.runtime.worker`). A backend only knows how to start
one (:meth:`Backend.start_worker`); :class:`WorkerPool` reuses workers across episodes and
replaces one whenever it crashed, timed out, broke the protocol or could not clean up after an
episode (the worker then says ``retire``).

Errors seen by the host are :class:`SandboxError` with a ``kind`` naming the cause (cpu, memory,
output, processes, wall_clock, crashed, setup, protocol, state, input, invalid_score).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any, Protocol

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-worker resource limits.

    Attributes:
      cpu_seconds: CPU time one episode (reset to score) may use (``RLIMIT_CPU``, re-armed per
        episode).
      wall_seconds: wall-clock limit of one request to the worker, enforced by the parent (it
        kills the whole jail); an episode's own timeout (see the rollout pool) can be shorter.
      memory_bytes: address-space limit of the worker (``RLIMIT_AS``); Docker also gets a cgroup
        memory limit a little above it.
      max_processes: ``RLIMIT_NPROC`` of the sandbox user; Docker also gets ``--pids-limit``.
      max_file_bytes: largest file the worker may write (``RLIMIT_FSIZE``).
      tmp_bytes: size of the private ``/tmp`` (a tmpfs).
      max_message_bytes: largest protocol frame either way; an observation may use half.
    """

    cpu_seconds: float = 5.0
    wall_seconds: float = 20.0
    memory_bytes: int = 768 * MiB
    max_processes: int = 64
    max_file_bytes: int = 8 * MiB
    tmp_bytes: int = 16 * MiB
    max_message_bytes: int = 8 * MiB

    def __post_init__(self):
        for name in ("cpu_seconds", "wall_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("memory_bytes", "max_processes", "max_file_bytes", "tmp_bytes",
                     "max_message_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive integer, got {value!r}")
        if self.memory_bytes < 128 * MiB:
            raise ValueError(f"SandboxLimits.memory_bytes must be at least 128 MiB (a Python "
                             f"interpreter needs it), got {self.memory_bytes}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class SandboxError(RuntimeError):
    """A worker request failed; ``kind`` names the cause, ``retire`` says the worker is unusable."""

    def __init__(self, kind: str, message: str, *, retire: bool = False):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retire = retire


class SandboxUnavailable(RuntimeError):
    """The backend cannot run on this machine (no ``bwrap``, no Docker engine); says why."""


class Worker(Protocol):
    """One running worker. ``request`` sends one message and returns the reply's payload."""

    startup_seconds: float

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    limits: SandboxLimits

    def start_worker(self) -> Worker: ...

    def close(self) -> None: ...


def checked_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The payload of an ``ok`` reply; a :class:`SandboxError` for an error reply."""
    if reply.get("ok"):
        return reply
    raise SandboxError(str(reply.get("kind", "protocol")), str(reply.get("error", reply)),
                       retire=bool(reply.get("retire", False)))


class WorkerPool:
    """Reusable workers of one backend, at most ``size`` alive at a time; thread-safe.

    ``lease()`` gives a worker to one episode; ``give_back(worker, healthy)`` returns it, and an
    unhealthy worker is closed and replaced lazily by the next lease.
    """

    def __init__(self, backend: Backend, size: int = 1):
        if size < 1:
            raise ValueError(f"WorkerPool size must be >= 1, got {size}")
        self.backend = backend
        self.size = size
        self._idle: queue.LifoQueue[Worker] = queue.LifoQueue()
        self._slots = threading.Semaphore(size)
        self._lock = threading.Lock()
        self._all: list[Worker] = []
        self.num_started = 0
        self.num_replaced = 0
        self.startup_seconds: list[float] = []

    def lease(self, timeout: float | None = None) -> Worker:
        """A worker for one episode, started if none is idle; waits at most ``timeout`` seconds
        for a free slot (:class:`SandboxError` ``wall_clock`` after that)."""
        if not self._slots.acquire(timeout=timeout):
            raise SandboxError("wall_clock", f"no sandbox worker became free within "
                               f"{timeout:g} s (all {self.size} busy)")
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        try:
            start = time.perf_counter()
            worker = self.backend.start_worker()
            self.startup_seconds.append(time.perf_counter() - start)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self.num_started += 1
            self._all.append(worker)
        return worker

    def admit(self, env: Any) -> None:
        """Check that the backend may run ``env`` (the in-process backend admits trusted
        environments only; jails admit everything)."""
        admit = getattr(self.backend, "admit", None)
        if admit is not None:
            admit(env)

    @property
    def kind(self) -> str:
        return self.backend.name

    def give_back(self, worker: Worker, healthy: bool) -> None:
        if healthy:
            self._idle.put(worker)
        else:
            with self._lock:
                self.num_replaced += 1
                if worker in self._all:
                    self._all.remove(worker)
            worker.close()
        self._slots.release()

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break
        self.backend.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
