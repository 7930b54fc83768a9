"""Sandbox worker: serves many episodes over stdin/stdout (standard library only).

Started by the bubblewrap and Docker backends as ``python -S -B worker.py CONFIG_JSON`` inside the
jail. ``CONFIG_JSON`` holds ``limits`` (see :class:`envsched_jax.envs.sandbox.base.SandboxLimits`),
``site_dirs`` (read-only folders added to ``sys.path``, e.g. the ``bfcl_eval`` package) and
``drop_to_uid`` (when started as root in a jail without a user namespace, the worker gives up root
before it reads any request, so that the process-count limit applies: the kernel ignores
``RLIMIT_NPROC`` for root).

Before serving, the worker moves its protocol stream to a private file descriptor and points
descriptors 1 and 2 at ``/dev/null``: environment code may print anything without corrupting the
protocol or filling a pipe. Limits set here, per process: ``RLIMIT_AS`` (a memory bomb becomes a
``MemoryError``), ``RLIMIT_NPROC`` (a fork bomb gets ``EAGAIN``), ``RLIMIT_FSIZE`` (with
``SIGXFSZ`` ignored, an oversized write fails with ``EFBIG``) and ``RLIMIT_CPU``, re-armed at every
episode to the CPU time used so far plus the per-episode allowance: its ``SIGXCPU`` becomes a
:class:`LimitExceeded` raised in the episode's code; if that code does not return (a loop in C),
the kernel repeats ``SIGXCPU`` every second and the parent's wall-clock limit kills the jail.

After every request the worker counts the processes of its PID namespace (``/proc``): an
environment that left processes behind (a fork bomb, a background child) ends with a
``processes`` limit error. Any limit error carries ``retire: true``, and the parent replaces the
worker: no state of a hostile episode can leak into the next one.

Requests: ``hello``; ``reset`` {spec}; ``step`` {action}; ``score``; ``run`` {spec, actions} (a whole
fixed-action episode in one round trip). Replies: ``{"ok": true, ...}`` or ``{"ok": false, "kind":
cpu | memory | output | processes | protocol | state | setup, "error": ..., "retire": bool}``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

import core
import frames


class _Limits:
    def __init__(self, raw: dict):
        self.cpu_seconds = float(raw["cpu_seconds"])
        self.memory_bytes = int(raw["memory_bytes"])
        self.max_processes = int(raw["max_processes"])
        self.max_file_bytes = int(raw["max_file_bytes"])
        self.max_message_bytes = int(raw["max_message_bytes"])


def _on_sigxcpu(signum, frame):
    raise core.LimitExceeded("cpu", "CPU time limit exceeded")


def _arm_cpu(limits: _Limits) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    soft = int(used + limits.cpu_seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY and soft > hard:
        raise core.LimitExceeded("cpu", "the worker's lifetime CPU budget is spent")
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _set_limits(limits: _Limits) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _drop_root(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit("worker: could not drop root")


def _count_processes() -> int:
    try:
        return sum(1 for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return 0


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Worker:
    def __init__(self, limits: _Limits, proto_in, proto_out):
        self.limits = limits
        self.proto_in = proto_in
        self.proto_out = proto_out
        self.episode = None
        self.baseline_processes = _count_processes()

    def read(self):
        header = self.proto_in.read(frames.HEADER.size)
        if len(header) < frames.HEADER.size:
            return None
        length = frames.frame_length(header, self.limits.max_message_bytes)
        return frames.unpack(self.proto_in.read(length))

    def write(self, message: dict) -> None:
        try:
            data = frames.pack(message, self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            data = frames.pack({"ok": False, "kind": "output", "retire": True,
                                "error": f"output limit: reply too large ({err})"},
                               self.limits.max_message_bytes)
        self.proto_out.write(data)
        self.proto_out.flush()

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "hello":
            return {"ok": True, "pid": os.getpid(), "uid": os.getuid(),
                    "python": sys.version.split()[0]}
        if op in ("reset", "run"):
            self.episode = None
            _arm_cpu(self.limits)
            spec = dict(request["spec"])
            spec["max_observation_chars"] = self.limits.max_message_bytes // 2
            if op == "run":
                return {"ok": True, "record": core.run_actions(spec, request["actions"])}
            self.episode = core.EpisodeCore(spec)
            return {"ok": True, **self.episode.reset()}
        if self.episode is None:
            return {"ok": False, "kind": "state", "error": f"{op!r} before reset"}
        if op == "step":
            return {"ok": True, **self.episode.step(request["action"])}
        if op == "score":
            return {"ok": True, **self.episode.score()}
        return {"ok": False, "kind": "protocol", "error": f"unknown op {op!r}"}

    def serve(self) -> None:
        while True:
            request = self.read()
            if request is None:
                return
            try:
                reply = self.handle(request)
            except core.LimitExceeded as err:
                reply = {"ok": False, "kind": err.kind, "error": str(err), "retire": True}
            except MemoryError:
                reply = {"ok": False, "kind": "memory", "retire": True,
                         "error": f"memory limit exceeded (address space "
                                  f"{self.limits.memory_bytes // 2**20} MiB)"}
            except core.EpisodeStateError as err:
                reply = {"ok": False, "kind": "state", "error": str(err)}
            except Exception as err:  # environment set-up failed (bad source, bad constructor)
                reply = {"ok": False, "kind": "setup", "error": f"{type(err).__name__}: {err}"}
            _reap_children()
            extra = _count_processes() - self.baseline_processes
            if extra > 0:
                reply = {"ok": False, "kind": "processes", "retire": True,
                         "error": f"process limit: environment code left {extra} process(es) "
                                  f"running (at most {self.limits.max_processes} per sandbox "
                                  "user; environments may not spawn processes)"}
            self.write(reply)


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    limits = _Limits(config["limits"])
    for path in reversed(config.get("site_dirs", [])):
        sys.path.insert(0, path)
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if config.get("drop_to_uid") is not None and os.getuid() == 0:
        _drop_root(int(config["drop_to_uid"]))
    _set_limits(limits)

    class _Reader:
        def read(self, n: int) -> bytes:
            chunks, remaining = [], n
            while remaining:
                chunk = proto_in.read(remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)

    Worker(limits, _Reader(), proto_out).serve()


if __name__ == "__main__":
    main(sys.argv)
