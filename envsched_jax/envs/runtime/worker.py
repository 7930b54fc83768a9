"""Sandbox supervisor: serves many episodes over stdin/stdout, running none of their code itself
(standard library only).

Started by the bubblewrap and Docker backends as ``python -S -B worker.py CONFIG_JSON``, as PID 1
of the jail's own PID namespace (it refuses to run otherwise: it cleans up with ``kill(-1)``).
``CONFIG_JSON`` holds ``limits`` (see :class:`envsched_jax.envs.sandbox.base.SandboxLimits`),
``site_dirs`` (read-only folders added to ``sys.path``), ``preload`` (trusted modules imported
once, before any episode, so that episode processes do not import them again), ``preload_when``
(more such modules, imported the first time an environment's source names a key) and
``drop_to_uid`` (when started as root in a jail without a user namespace, the supervisor gives up
root before it reads any request, so that the process-count limit applies).

Isolation, per request of the parent:

- The supervisor holds the protocol stream (moved to private descriptors; 0, 1, 2 point at
  ``/dev/null``) and never executes environment or check code. It is non-dumpable and PID 1, so
  processes of its uid can neither trace it, nor open its descriptors or memory through
  ``/proc``, nor signal it; a seccomp filter (:mod:`hardening`) applies to it and all its
  children.
- Each episode runs in a fresh process forked from the supervisor (a clean interpreter with the
  preloaded modules; no pool code ever ran in it), which keeps only its own socket to the
  supervisor: ``reset``/``step`` requests go there, and ``score`` asks it for the final payload
  (:meth:`core.EpisodeCore.final_payload`: the states as data).
- Processes of the episode still alive at that point (a background child, a fork bomb) end the
  episode with a ``processes`` error. The episode process is killed, and the checks run in
  another fresh process on the payload (:func:`core.check_payload`). The supervisor validates the
  results (one boolean per declared check) and computes the reward itself
  (:func:`core.assemble_score`).
- After every reply that ends an episode, and before anything else runs, every process but the
  supervisor is killed (``kill(-1, SIGKILL)``, repeated until none is left) and ``/tmp`` and
  ``/dev/shm`` are emptied. Threads, timers, descriptors, patched builtins and module state die
  with the processes.
- Speed (the parent is not kept waiting for it): the next episode process and check process are
  forked right after that clean-up and wait, non-dumpable, warming up on a built-in episode
  (:func:`core.warm_up`), for their request; an environment's source is compiled once, in a
  process that only compiles it, and its code is handed to later episode processes as
  :mod:`marshal` bytes (:data:`CODE_CACHE`). The checks start while the killed episode process is
  still being torn down: a killed process runs no more code, and the check process is
  non-dumpable and reachable only through its own socket (an episode could at most signal it,
  which fails that episode alone).

Limits set per episode process and per check process: ``RLIMIT_CPU`` (``cpu_seconds`` each;
``SIGXCPU`` becomes :class:`core.LimitExceeded`, a loop in C is killed one second later);
inherited from the supervisor: ``RLIMIT_AS`` (a memory bomb becomes ``MemoryError``),
``RLIMIT_NPROC`` (a fork bomb gets ``EAGAIN``), ``RLIMIT_FSIZE`` (an oversized write fails with
``EFBIG``). The parent sends each request's time allowance (``time_limit``); the supervisor kills
the episode's processes when it runs out and answers ``wall_clock``, so a slow episode costs no
jail. The parent keeps its own, slightly longer deadline for a supervisor that does not answer.

Requests: ``hello``; ``reset`` {spec}; ``step`` {action}; ``user_stop`` (the simulated user
ended the conversation); ``score``; ``run`` {spec, actions, user_stop} (a whole fixed-action
episode in one round trip); ``abort`` (end the episode unscored). Whether an ``envscaler``
episode is scored at all is decided here, from the actions relayed and the parent's stops
(:func:`core.unscored_reason`), never from the episode process's report. Every
request carries ``seq`` and ``nonce``, echoed in its reply so that the parent can match them.
Replies: ``{"ok": true, ...}`` or ``{"ok": false, "kind": cpu | memory | output | processes |
protocol | state | setup | wall_clock | crashed, "error": ..., "retire": bool}``; ``retire`` is
true only when the clean-up itself failed.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import marshal
import math
import os
import resource
import select
import signal
import socket
import stat
import sys
import time

import core
import frames
import hardening

SCRATCH_DIRS = ("/tmp", "/dev/shm")
WIPE_SECONDS = 2.0
KILL_ROUNDS = 200
CODE_CACHE_BYTES = 32 * 2**20

# Compiled environment classes (base64 marshal text) by hash of env id and source, filled by the
# supervisor; a process forked from it reads its inherited copy, so a cached class needs no
# transfer (the request names the key).
CODE_CACHE: collections.OrderedDict[str, str] = collections.OrderedDict()


class _Limits:
    def __init__(self, raw: dict):
        self.cpu_seconds = float(raw["cpu_seconds"])
        self.memory_bytes = int(raw["memory_bytes"])
        self.max_processes = int(raw["max_processes"])
        self.max_file_bytes = int(raw["max_file_bytes"])
        self.max_message_bytes = int(raw["max_message_bytes"])


class EpisodeFailed(Exception):
    """The episode (or its checks) failed; ``kind`` names the cause."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class OwnerGone(Exception):
    """The parent closed the protocol stream (or wrote out of turn): shut down."""


def _error(kind: str, message: str, retire: bool = False) -> dict:
    return {"ok": False, "kind": kind, "error": message, "retire": retire}


# -- inside an episode or check process ---------------------------------------------------------

def _on_sigxcpu(signum, frame):
    raise core.LimitExceeded("cpu", "CPU time limit exceeded")


def _read_exact(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return b""
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class _ChildChannel:
    """The episode or check process's end of its socket (blocking)."""

    def __init__(self, fd: int, limits: _Limits):
        self.fd = fd
        self.limits = limits

    def read(self):
        header = _read_exact(self.fd, frames.HEADER.size)
        if not header:
            return None
        return frames.unpack(_read_exact(self.fd, frames.frame_length(
            header, self.limits.max_message_bytes)))

    def write(self, message: dict) -> None:
        try:
            data = frames.pack(message, self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            data = frames.pack(_error("output", f"output limit: reply too large ({err})"),
                               self.limits.max_message_bytes)
        except (ValueError, TypeError, RecursionError) as err:
            data = frames.pack(_error("state", f"the reply cannot be encoded "
                                               f"({type(err).__name__}: {err})"),
                               self.limits.max_message_bytes)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def _enter_child(fd: int, limits: _Limits) -> _ChildChannel:
    """First thing in a forked episode, check or compile process: keep only ``fd`` (and
    /dev/null on 0-2), arm the per-process CPU limit. The process stays non-dumpable (see
    :mod:`hardening`) until it runs pool code: a spare process waiting for its request cannot be
    traced or written by an episode that is still running."""
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    soft = max(1, math.ceil(limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    os.chdir("/tmp")
    return _ChildChannel(fd, limits)


def _guarded(fn, failure_kind: str) -> dict:
    """Run ``fn`` and turn whatever it raises into an error reply."""
    try:
        return {"ok": True, **fn()}
    except core.LimitExceeded as err:
        return _error(err.kind, str(err))
    except MemoryError:
        return _error("memory", "memory limit exceeded (MemoryError)")
    except core.EpisodeStateError as err:
        return _error("state", str(err))
    except (core.StateError, RecursionError) as err:
        return _error("state", f"the environment's state cannot be carried to the checks "
                               f"({type(err).__name__}: {err})")
    except Exception as err:
        return _error(failure_kind, f"{type(err).__name__}: {err}")
    except BaseException as err:  # SystemExit, KeyboardInterrupt raised by pool code
        return _error("crashed", f"environment code raised {type(err).__name__}")


def _serve_episode(chan: _ChildChannel) -> None:
    core.warm_up()
    episode = None
    while True:
        request = chan.read()
        if request is None:
            return
        if episode is None:
            try:  # /proc/self belongs to root while non-dumpable; pool code may read it
                hardening.set_dumpable(True)
            except OSError:
                pass
        op = request.get("op")
        if op in ("reset", "run"):
            spec = request["spec"]
            if "compiled_key" in spec:
                spec["compiled_class"] = CODE_CACHE.get(spec["compiled_key"])
            episode = core.EpisodeCore(spec)
            if op == "reset":
                reply = _guarded(episode.reset, "setup")
            else:
                actions, stop = request["actions"], bool(request.get("user_stop"))
                reply = _guarded(lambda: {"record": core.play_actions(episode, actions, stop),
                                          "payload": episode.final_payload()}, "setup")
        elif episode is None:
            reply = _error("state", f"{op!r} before reset")
        elif op == "step":
            reply = _guarded(lambda: episode.step(request["action"]), "state")
        elif op == "user_stop":
            reply = _guarded(episode.user_stop, "state")
        elif op == "final":
            reply = _guarded(lambda: {"payload": episode.final_payload()}, "state")
        else:
            reply = _error("protocol", f"unknown op {op!r}")
        chan.write(reply)


def _serve_compile(chan: _ChildChannel) -> None:
    """Compile (never run) an environment's source; reply with the code as marshal bytes."""
    request = chan.read()
    if request is not None:
        chan.write(_guarded(lambda: {"code": base64.b64encode(marshal.dumps(
            core.compile_class_source(request["env_id"], request["source"]))).decode()}, "setup"))


def _serve_checks(chan: _ChildChannel) -> None:
    """Two requests: the task's checks (compiled while the episode runs elsewhere), then the
    episode's final payload (checked; one reply)."""
    core.warm_up("checks")
    task = chan.read()
    if task is None:
        return
    compiled = _guarded(lambda: {"code": core.compile_checks(task["spec"]["task_id"],
                                                             task["spec"]["checks"])}, "state")
    request = chan.read()
    if request is None:
        return
    if not compiled["ok"]:
        chan.write(compiled)
        return
    chan.write(_guarded(lambda: core.check_payload(task["spec"], request["payload"],
                                                   compiled["code"]), "state"))


# -- the supervisor ---------------------------------------------------------------------------

def _other_processes(live_only: bool = False) -> list[int]:
    """PIDs of the jail but this one's (with ``live_only``, zombies left out)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        if live_only:
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                        continue
            except (OSError, IndexError):
                continue
        out.append(int(name))
    return out


class Supervisor:
    def __init__(self, limits: _Limits, proto_in: int, proto_out: int, hello: dict,
                 preload_when: dict | None = None):
        self.limits = limits
        self.pending_preload = dict(preload_when or {})
        self.code_cache = CODE_CACHE
        self.proto_in = proto_in
        self.proto_out = proto_out
        self.hello = hello
        self.child = None          # (pid, socket) of the running episode process
        self.checker = None        # (pid, socket) of its check process, compiling the checks
        self.agent_messages = []   # the episode's chat_with_user messages, as relayed here
        self.relayed = []          # the episode's actions, as relayed here (unscored_reason)
        self.user_stopped = False  # the parent said the simulated user ended the conversation
        self.spares: dict[str, tuple[int, socket.socket]] = {}  # forked ahead, by role
        self.spare_keys: dict[str, set[str]] = {}  # CODE_CACHE keys each spare inherited
        self.child_keys: set[str] = set()
        self.dirty = False         # something ran since the last full clean-up
        self.unsettled = False     # processes were killed but not yet waited for
        self.spec = None
        self.exits: dict[int, tuple[int, float]] = {}  # reaped pid -> (status, CPU seconds)

    # -- the parent's stream --------------------------------------------------------------
    def read_request(self):
        header = _read_exact(self.proto_in, frames.HEADER.size)
        if not header:
            return None
        length = frames.frame_length(header, self.limits.max_message_bytes)
        body = _read_exact(self.proto_in, length)
        if len(body) < length:
            return None
        return frames.unpack(body)

    def write_reply(self, reply: dict) -> None:
        try:
            data = frames.pack(reply, self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            data = frames.pack({**_error("output", f"output limit: reply too large ({err})"),
                                "seq": reply.get("seq"), "nonce": reply.get("nonce")},
                               self.limits.max_message_bytes)
        view = memoryview(data)
        while view:
            view = view[os.write(self.proto_out, view):]

    def serve(self) -> None:
        while True:
            request = self.read_request()
            if request is None:
                return
            deadline = time.monotonic() + float(request.get("time_limit", 60.0))
            try:
                reply = self.handle(request, deadline)
            except EpisodeFailed as err:
                reply = _error(err.kind, str(err), retire=not self.clean_up())
            except OwnerGone:
                return
            except Exception as err:  # a malformed request: end the episode, keep serving
                reply = _error("protocol", f"bad request ({type(err).__name__}: {err})",
                               retire=not self.clean_up())
            reply["seq"], reply["nonce"] = request.get("seq"), request.get("nonce")
            self.write_reply(reply)
            self.after_reply()

    def after_reply(self) -> None:
        """Between episodes, while the parent reads the reply: SIGKILL every other process (no
        waiting: :meth:`settle` waits, before the next episode starts), then fork the next
        episode and check processes ahead; they warm up (:func:`core.warm_up`) meanwhile. A
        killed process runs no more code; the spares are non-dumpable and run none of it."""
        if self.child is not None or (self.spares and not self.dirty):
            return
        for proc in (self.child, self.checker, *self.spares.values()):
            if proc is not None:
                proc[1].close()
        self.child = self.checker = None
        self.spares.clear()
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.spares = self._spawn_spares()
        self.spare_keys = {role: set(self.code_cache) for role in self.spares}
        self.dirty = False
        self.unsettled = True

    def settle(self) -> bool:
        """Before an episode starts: every process killed after the last one is gone (the
        spares excepted) and the scratch folders are empty."""
        if not self.unsettled:
            return True
        self.resolve_spare_checker()
        self.unsettled = not (self.kill_others(self.spare_pids()) and _wipe_scratch())
        return not self.unsettled

    # -- processes --------------------------------------------------------------------------
    def _spawn_spares(self) -> dict[str, tuple]:
        """One fork for both spares: the episode spare forks the check spare first thing, and
        the check spare announces its PID on its socket (both still run only our code)."""
        env_parent, env_child = socket.socketpair()
        chk_parent, chk_child = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                env_parent.close()
                chk_parent.close()
                if os.fork() == 0:
                    env_child.close()
                    chan = _enter_child(chk_child.fileno(), self.limits)
                    chan.write({"pid": os.getpid()})
                    _serve_checks(chan)
                else:
                    chk_child.close()
                    _serve_episode(_enter_child(env_child.fileno(), self.limits))
            finally:
                os._exit(0)
        env_child.close()
        chk_child.close()
        return {"episode": (pid, env_parent), "checks": (None, chk_parent)}

    def resolve_spare_checker(self) -> None:
        """Read the check spare's PID (it sent it when it started); drop the spare if it cannot
        be read."""
        spare = self.spares.get("checks")
        if spare is None or spare[0] is not None:
            return
        try:
            message = self._read_frame(spare[1], time.monotonic() + 5.0)
            pid = int(message["pid"])
        except Exception:
            spare[1].close()
            del self.spares["checks"]
            return
        self.spares["checks"] = (pid, spare[1])

    def _read_frame(self, sock: socket.socket, deadline: float) -> dict:
        header = self._recv((None, sock), frames.HEADER.size, deadline, "spare")
        length = frames.frame_length(header, self.limits.max_message_bytes)
        return frames.unpack(self._recv((None, sock), length, deadline, "spare"))

    def _spawn(self, serve) -> tuple[int, socket.socket]:
        parent_end, child_end = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                parent_end.close()
                serve(_enter_child(child_end.fileno(), self.limits))
            finally:
                os._exit(0)
        child_end.close()
        return pid, parent_end

    def spare_pids(self) -> set[int]:
        return {pid for pid, _ in self.spares.values() if pid is not None}

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exits[pid] = (status, usage.ru_utime + usage.ru_stime)

    def take(self, role: str, serve) -> tuple[int, socket.socket]:
        """The spare process for ``role`` if it is still alive, else a freshly forked one."""
        self.dirty = True
        self.resolve_spare_checker()
        spare = self.spares.pop(role, None)
        self.child_keys = self.spare_keys.pop(role, set())
        if spare is not None:
            self._reap()
            if spare[0] not in self.exits and os.path.exists(f"/proc/{spare[0]}"):
                try:
                    os.kill(spare[0], signal.SIGCONT)  # in case an episode stopped it
                    return spare
                except ProcessLookupError:
                    pass
            spare[1].close()
        self.child_keys = set(self.code_cache)
        return self._spawn(serve)

    def kill_others(self, keep: set[int]) -> bool:
        """Kill every process of the jail but this one and ``keep`` (the idle spares): SIGKILL
        each, again until none is left (a process forking meanwhile is caught by the next
        round); True when none is left."""
        for _ in range(KILL_ROUNDS):
            victims = [pid for pid in _other_processes() if pid not in keep]
            if not victims:
                return True
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                self._reap()
                if not [pid for pid in _other_processes() if pid not in keep]:
                    return True
                time.sleep(0.0002)
        return False

    def kill_all(self) -> bool:
        """Kill every process of the jail but this one; True when none is left."""
        for _ in range(KILL_ROUNDS):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for _ in range(50):  # a killed process needs a moment to exit
                self._reap()
                if not _other_processes():
                    return True
                time.sleep(0.0002)
        return False

    def clean_up(self) -> bool:
        """End the current episode: kill every other process, empty the scratch folders. False
        when something could not be removed (the parent then replaces this jail)."""
        for proc in (self.child, self.checker):
            if proc is not None:
                proc[1].close()
        self.child = self.checker = None
        for _, sock in self.spares.values():
            sock.close()
        self.spares.clear()
        self.spare_keys.clear()
        killed = self.kill_all()
        self.exits.clear()
        self.dirty = self.unsettled = False
        return killed and _wipe_scratch()

    # -- talking to a child ---------------------------------------------------------------
    def send(self, child, message: dict, deadline: float, who: str) -> None:
        pid, sock = child
        try:
            data = frames.pack(message, self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            raise EpisodeFailed("output", f"the request for the {who} is too large ({err})") from None
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.sendall(data)
        except TimeoutError:
            raise EpisodeFailed("wall_clock", f"wall-clock limit: the {who} stopped reading") from None
        except OSError:
            raise EpisodeFailed(*self._death(pid, who)) from None

    def ask(self, child, message: dict, deadline: float, who: str) -> dict:
        self.send(child, message, deadline, who)
        header = self._recv(child, frames.HEADER.size, deadline, who)
        try:
            length = frames.frame_length(header, self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            raise EpisodeFailed("output", f"output limit: the {who} sent too much ({err})") from None
        try:
            reply = frames.unpack(self._recv(child, length, deadline, who))
        except (ValueError, RecursionError) as err:
            raise EpisodeFailed("protocol", f"the {who} sent a malformed message "
                                            f"({type(err).__name__})") from None
        if not isinstance(reply.get("ok"), bool):
            raise EpisodeFailed("protocol", f"the {who} sent a reply without 'ok'")
        if not reply["ok"]:
            raise EpisodeFailed(str(reply.get("kind", "protocol")), str(reply.get("error")))
        return reply

    def _recv(self, child, n: int, deadline: float, who: str) -> bytes:
        pid, sock = child
        chunks, remaining = [], n
        while remaining:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise EpisodeFailed("wall_clock", "wall-clock limit exceeded; the episode's "
                                                  "processes were killed")
            ready, _, _ = select.select([sock, self.proto_in], [], [], timeout)
            if self.proto_in in ready:
                self.clean_up()
                raise OwnerGone()
            if not ready:
                continue
            chunk = sock.recv(min(remaining, 1 << 20))
            if not chunk:
                raise EpisodeFailed(*self._death(pid, who))
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _death(self, pid: int, who: str) -> tuple[str, str]:
        """(kind, message) for a child whose socket closed."""
        for _ in range(200):
            self._reap()
            if pid in self.exits:
                break
            time.sleep(0.001)
        else:
            return "protocol", f"the {who} closed its channel"
        status, cpu = self.exits[pid]
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= self.limits.cpu_seconds):
                return "cpu", "CPU time limit exceeded"
            if sig == signal.SIGKILL:
                return "memory", (f"the {who} was killed (SIGKILL: the memory limit's OOM killer "
                                  "or a process outside it)")
            return "crashed", f"the {who} died of signal {signal.Signals(sig).name}"
        return "crashed", f"the {who} exited with status {os.WEXITSTATUS(status)}"

    def compiled_class(self, spec: dict, deadline: float) -> str | None:
        """The :data:`CODE_CACHE` key of the environment source's code, compiled once in a
        process of its own (which runs nothing of it); None where it does not compile (the
        episode process then compiles it and reports the error)."""
        source = spec.get("class_source")
        if not isinstance(source, str):
            return None
        key = hashlib.sha256(f"{spec.get('env_id')}\0{source}".encode()).hexdigest()
        if key in self.code_cache:
            self.code_cache.move_to_end(key)
            return key
        compiler = self._spawn(_serve_compile)
        try:
            reply = self.ask(compiler, {"env_id": spec.get("env_id"), "source": source},
                             deadline, "compiler")
            code = reply.get("code")
        except EpisodeFailed:
            code = None
        finally:
            compiler[1].close()
        if not self.kill_others(self.spare_pids()):
            raise EpisodeFailed("processes", "the compiler process could not be killed")
        if not isinstance(code, str):
            return None
        self.code_cache[key] = code
        while sum(len(c) for c in self.code_cache.values()) > CODE_CACHE_BYTES:
            self.code_cache.popitem(last=False)
        return key

    def preload_for(self, spec: dict) -> None:
        """Import the trusted modules an environment's source names (once), so that its episode
        processes find them loaded (the check is a substring test: nothing of the source runs)."""
        source = spec.get("class_source") or ""
        for marker in [m for m in self.pending_preload if m in source]:
            for name in self.pending_preload.pop(marker):
                try:
                    __import__(name)
                except Exception:  # the episode then fails on its own import, with the reason
                    pass

    # -- requests -------------------------------------------------------------------------
    def handle(self, request: dict, deadline: float) -> dict:
        op = request.get("op")
        if op == "hello":
            return {"ok": True, **self.hello}
        if op == "abort":
            if not self.clean_up():
                return _error("processes", "could not clean up the episode", retire=True)
            return {"ok": True}
        if op in ("reset", "run"):
            if self.child is not None and not self.clean_up():
                return _error("processes", "could not clean up the previous episode", retire=True)
            if not self.settle():
                return _error("processes", "could not clean up after the previous episode",
                              retire=True)
            spec = dict(request["spec"])
            spec["max_observation_chars"] = self.limits.max_message_bytes // 2
            self.preload_for(spec)
            self.spec = spec
            key = self.compiled_class(spec, deadline)
            self.checker = self.take("checks", _serve_checks)
            task = {k: spec.get(k)
                    for k in ("task_id", "checks", "user_turns", "user_mode", "semantics")}
            self.agent_messages = []
            self.relayed, self.user_stopped = [], False
            self.send(self.checker, {"spec": task}, deadline, "checks")
            self.child = self.take("episode", _serve_episode)
            spec = {k: v for k, v in spec.items() if k != "checks"}  # the checker has them
            if key in self.child_keys:  # the episode process has the code: no source, no bytes
                spec.update(compiled_key=key, class_source="")
            elif key is not None:
                spec.update(compiled_class=self.code_cache[key], class_source="")
            if op == "reset":
                reply = self.ask(self.child, {"op": "reset", "spec": spec}, deadline, "episode")
                if not isinstance(reply.get("state"), dict):
                    raise EpisodeFailed("protocol", "the episode process sent a malformed reset "
                                                    "reply")
                return {"ok": True, "observation": reply.get("observation"),
                        "state": reply["state"]}
            reply = self.ask(self.child, {"op": "run", "spec": spec, "actions": request["actions"],
                                          "user_stop": bool(request.get("user_stop"))},
                             deadline, "episode")
            record = reply.get("record")
            if not isinstance(record, dict):
                raise EpisodeFailed("protocol", "the episode process sent no record")
            done = record.get("steps")
            count = len(done) if isinstance(done, list) else 0
            self.agent_messages = _messages_of(request["actions"][:count])
            self.relayed = list(request["actions"])
            self.user_stopped = bool(request.get("user_stop"))
            record["score"] = self.score(reply.get("payload"), deadline)
            return {"ok": True, "record": record}
        if self.child is None:
            return _error("state", f"{op!r} before reset")
        if op == "step":
            reply = self.ask(self.child, {"op": "step", "action": request["action"]}, deadline,
                             "episode")
            self.agent_messages.extend(_messages_of([request["action"]], len(self.agent_messages)))
            self.relayed.append(request["action"])
            if (not isinstance(reply.get("done"), bool) or not isinstance(reply.get("turn"), int)
                    or not isinstance(reply.get("state_change"), dict)
                    or not _is_message(reply.get("message"))):
                raise EpisodeFailed("protocol", "the episode process sent a malformed step reply")
            return {k: reply.get(k) for k in ("ok", "observation", "message", "state_change",
                                                "done", "end_reason", "error", "turn")}
        if op == "user_stop":
            self.ask(self.child, {"op": "user_stop"}, deadline, "episode")
            self.user_stopped = True
            return {"ok": True, "done": True, "end_reason": core.USER_STOP}
        if op == "score":
            reply = self.ask(self.child, {"op": "final"}, deadline, "episode")
            return {"ok": True, **self.score(reply.get("payload"), deadline)}
        return _error("protocol", f"unknown op {op!r}")

    def score(self, payload, deadline: float) -> dict:
        """Refuse an episode that left processes, kill the episode process, run the checks in
        the check process bound at reset (fresh, compiled them meanwhile), validate them and
        compute the reward. The full clean-up follows the reply (:meth:`after_reply`)."""
        _validate_payload(payload)
        assert self.child is not None
        keep = self.spare_pids() | ({self.checker[0]} if self.checker else set())
        env_pid = self.child[0]
        known = keep | {env_pid}
        leftover = [p for p in _other_processes() if p not in known]
        if leftover:  # rare: look closer (zombies do not count)
            leftover = [p for p in _other_processes(live_only=True) if p not in known]
        self.child[1].close()
        self.child = None
        # The checks start while the killed episode process is still being torn down (the full
        # clean-up follows the reply, before anything else runs): a SIGKILLed process runs no
        # more code, and the check process is non-dumpable and reachable only by its own socket.
        try:
            os.kill(env_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if leftover:
            raise EpisodeFailed("processes", f"process limit: environment code left "
                                             f"{len(leftover)} process(es) running (environments "
                                             "may not spawn processes)")
        checks = self.spec["checks"]
        checker, self.checker = self.checker, None
        # decided here, from the actions relayed and the parent's stops, not from the payload
        unscored = core.unscored_reason(self.spec, self.relayed, self.user_stopped)
        if unscored is not None:
            checker[1].close()
            return core.assemble_score(payload, core.unscored_checks(len(checks), unscored))
        try:
            os.kill(checker[0], signal.SIGCONT)  # in case the episode stopped it
            # the agent's messages as relayed here, not as the episode process reports them
            sent = {k: v for k, v in payload.items() if k != "final_state"}
            sent["agent_messages"] = self.agent_messages
            checked = self.ask(checker, {"payload": sent}, deadline, "checks")
        except ProcessLookupError:
            raise EpisodeFailed("crashed", "the check process was killed during the episode") from None
        finally:
            checker[1].close()
        results, errors = checked.get("check_results"), checked.get("check_errors")
        if (not isinstance(results, list) or not isinstance(errors, list)
                or len(results) != len(checks) or len(errors) != len(checks)
                or not all(isinstance(r, bool) for r in results)
                or not all(e is None or isinstance(e, str) for e in errors)):
            raise EpisodeFailed("protocol", f"the check process did not return one boolean "
                                            f"per check ({len(checks)} declared)")
        return core.assemble_score(payload, {"check_results": results, "check_errors": errors})


def _messages_of(actions, first_turn: int = 0) -> list:
    """The agent-message records of the ``chat_with_user`` actions among ``actions`` (relayed
    by this supervisor), numbered from ``first_turn``: the k-th message closes user turn k."""
    out = []
    for action in actions:
        if isinstance(action, dict) and action.get("name") == core.CHAT_WITH_USER:
            out.append(core.agent_message(first_turn + len(out), action.get("arguments") or {}))
    return out


def _is_message(message) -> bool:
    """Whether a step reply's ``message`` is None or ``{"role": "tool" | "user", "content": str}``
    (what the policy is shown; its text is the environment's to choose)."""
    return message is None or (isinstance(message, dict) and set(message) == {"role", "content"}
                               and message["role"] in ("tool", "user")
                               and isinstance(message["content"], str))


def _validate_payload(payload) -> None:
    ok = (isinstance(payload, dict) and "final" in payload and "initial" in payload
          and isinstance(payload.get("turn_states"), list)
          and isinstance(payload.get("end_reason"), str)
          and (payload.get("error") is None or isinstance(payload.get("error"), str))
          and isinstance(payload.get("num_steps"), int) and "final_state" in payload)
    if not ok:
        raise EpisodeFailed("protocol", "the episode process sent a malformed final payload")


def _wipe(path: str, deadline: float) -> bool:
    """Empty the folder ``path`` (its entries may have any mode: they are ours); False when
    something is left or the time ran out."""
    try:
        names = os.listdir(path)
    except OSError:
        return True  # absent or not ours to list: nothing an episode could have written
    stack = [os.path.join(path, n) for n in names]
    dirs = []
    while stack:
        if time.monotonic() > deadline:
            return False
        entry = stack.pop()
        try:
            mode = os.lstat(entry).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(entry, 0o700)
                dirs.append(entry)
                stack.extend(os.path.join(entry, n) for n in os.listdir(entry))
            else:
                os.unlink(entry)
        except OSError:
            return False
    for entry in reversed(dirs):
        try:
            os.rmdir(entry)
        except OSError:
            return False
    return not os.listdir(path)


def _wipe_scratch() -> bool:
    return all(_wipe(path, time.monotonic() + WIPE_SECONDS) for path in SCRATCH_DIRS)


def _drop_root(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit("worker: could not drop root")


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    limits = _Limits(config["limits"])
    if os.getpid() != 1:
        raise SystemExit("worker: must run as PID 1 of its own PID namespace (it cleans up "
                         "with kill(-1))")
    for path in reversed(config.get("site_dirs", [])):
        sys.path.insert(0, path)
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    if config.get("drop_to_uid") is not None and os.getuid() == 0:
        _drop_root(int(config["drop_to_uid"]))
    preloaded = []
    for name in config.get("preload", []):
        try:
            __import__(name)
            preloaded.append(name)
        except Exception:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # inherited by every episode process: the OOM killer takes the largest, never us first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    applied = hardening.harden()
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hello = {"pid": os.getpid(), "uid": os.getuid(), "python": sys.version.split()[0],
             "preloaded": preloaded, **applied}
    Supervisor(limits, proto_in, proto_out, hello, config.get("preload_when")).serve()


if __name__ == "__main__":
    main(sys.argv)
