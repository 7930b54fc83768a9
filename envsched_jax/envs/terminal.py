"""Terminal episodes: an agent acting through a bash tool in a task bundle's own container.

Bundle tasks (:mod:`envsched_jax.pool.bundles`, ``metadata["semantics"] == "terminal"``) are not
Python environments: the environment is a Linux container of the image built from the bundle's
``environment/``, the one tool is ``run_command(command)``, and the reward is what the bundle's
tests write. :class:`TerminalEpisode` has the API the agent loop uses on
:class:`~envsched_jax.envs.episode.Episode` (``reset``, ``step``, ``done``, ``score``, ``close``,
``trajectory``, ``remaining_seconds``, ``user_stop``); :class:`TerminalRuntime` holds the Docker
side (engine client, image cache, containers), and one runtime serves many episodes at once.

One episode:

1. ``reset``: the bundle is read again from its folder and must have the content hash it had when
   the pool was loaded; its image is built (cached by the SHA-256 of the build context, shared
   with gold verification: :func:`envsched_jax.forge.verify.build_task_image`), and a *workspace*
   container of it is started. The first observation is the instruction and the tool.
2. ``step(run_command)``: the command runs by ``docker exec`` as ``bash -c`` in ``/app`` with
   stdin from ``/dev/null``, under ``timeout`` (TERM at the limit, KILL 2 s later, to the
   command's whole process group): the limit is :attr:`TerminalConfig.command_timeout_s` or what
   is left of the episode, whichever is less. stdout and stderr come back together; past
   :attr:`TerminalConfig.max_output_bytes` only the first and last halves are kept and the result
   says how much was left out. A command that runs out of time is reported as such and the episode
   goes on. Processes a command leaves in the background keep running (a server, say) until the
   episode ends; their later output is not shown. The end of a command is found by a marker with a
   fresh random nonce that the wrapper prints on the same stream after the command (Docker does
   not keep the order between an exec's stdout and stderr, so it cannot travel apart).
   The agent's plain answer (``chat_with_user``) ends the episode; an unknown tool or a malformed
   argument gives an error observation and the episode goes on.
3. ``score``: the workspace container is killed (SIGKILL to its PID 1, so no process the agent
   started survives), its file system is committed to a *snapshot* image, and the container is
   removed. The tests then run in a fresh container of the snapshot, ``bash /tests/test.sh`` with
   cwd ``/app``, with the bundle's ``tests/`` mounted read-only at ``/tests`` and an empty host
   folder at ``/logs``; the snapshot is removed afterwards. An episode cut by a limit (time,
   steps) or stopped by its caller is scored on the workspace it reached, as Harbor runs its
   verifier after an agent timeout.

Reward. The number in ``/logs/verifier/reward.txt`` (Harbor's convention; read without following
links, at most 1 KiB), which must be a finite number in [0, 1]; a missing or malformed file, or
tests that run past their limit (the bundle's ``[verifier].timeout_sec`` capped by
:attr:`TerminalConfig.max_test_s`), give reward 0 with an error naming the cause. Terminal-Bench 1
bundles grade by the exit status of run-tests.sh: they are converted to Harbor's layout, whose
generated test.sh (:data:`envsched_jax.forge.bundle.TB1_TEST_WRAPPER`) runs run-tests.sh and writes
1 when it exits 0 and 0 otherwise (unless run-tests.sh wrote a reward itself); so both
conventions end in the reward file, and the score records the tests' exit status too. The task's
one check passes when the reward is 1 (the rule of its :data:`~envsched_jax.pool.bundles.REWARD_CHECK_CODE`,
applied here directly on the final state ``{"reward", "test_exit_status", "reward_text"}``).

Isolation (the project's security model, and gold verification's containers,
:func:`envsched_jax.forge.verify.create_task_container`): both containers have ``--network none``,
every capability dropped, ``no-new-privileges``, cgroup memory (swap equal), CPU and pid limits,
a per-file size limit, a private size-limited ``/tmp`` (not part of the snapshot), and the host's
``/usr`` read-only as the toolchain. The agent's container never has ``/tests``, ``/solution`` or
``/logs``. Reward integrity: the agent's processes are dead before the tests start, the tests
and the reward folder are mounted fresh, and everything the tests execute comes from read-only
mounts laid over the snapshot: ``/usr``, the top-level links into it (``/bin``, ``/lib``,
``/lib64``, ``/sbin``: an agent that replaces ``/lib64`` would otherwise choose the ELF loader of
every test program), the ``/etc`` folders the host's ``/usr`` links into for code
(``/etc/alternatives``, ``/etc/python3*``, home of Python's ``sitecustomize``), and the loader's
``/etc/ld.so.preload`` and ``/etc/ld.so.cache``, masked by an empty file. The same mounts are in
the workspace, so the agent uses the toolchain the tests use and cannot write to it.

Not isolated (inherent to Harbor's contract, where tests inspect what the agent produced): the
tests read the workspace, so planted data is seen as the agent's answer; tests that *run* a
program the agent wrote (a script task) give that program the tests' rights, the reward folder
included; other ``/etc`` files (time zone, certificates) are workspace data; disk use of the
workspace's writable layer is bounded only per file and by time (the engine's storage driver has
no quota here).

Cleanup. Workspace, test and snapshot resources carry the labels :data:`ROLE_LABEL` (their role),
:data:`RUN_LABEL` (the runtime's id) and the sandbox backend's owner label (host, PID, start
time). Every path removes them, failures and timeouts included (``close`` for an episode that is
not scored); at exit the process removes what it still owns, and a new runtime removes those of
owners that are gone. The built task images are a cache and stay (``envsched.forge=1``, as gold
verification leaves them).
"""

from __future__ import annotations

import atexit
import dataclasses
import glob
import math
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envsched_jax.envs.episode import EpisodeError, Score, StepResult, action_json, chat_action
from envsched_jax.envs.runtime.core import CHAT_WITH_USER
from envsched_jax.envs.sandbox import host
from envsched_jax.envs.sandbox.base import SandboxError
from envsched_jax.envs.sandbox.docker_backend import OWNER_LABEL, owner_label
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.forge.bundle import BundleError, TaskBundle, convert, read_bundle
from envsched_jax.forge.verify import (CONTAINER_ENV, ContainerLimits, build_task_image,
                                       create_task_container, ensure_base_image)
from envsched_jax.pool.bundles import RUN_COMMAND, is_terminal_task, task_bundle_path
from envsched_jax.pool.model import Action, Environment, Task

ROLE_LABEL = "envsched.terminal"
"""Role of a terminal resource: ``workspace``, ``tests`` or ``snapshot``."""
RUN_LABEL = "envsched.terminal.run"
"""Id of the :class:`TerminalRuntime` that made a resource."""
SNAPSHOT_REPOSITORY = "envsched-terminal-snapshot"
SANDBOX_NAME = "docker"
"""``Trajectory.sandbox`` of terminal episodes."""

_WORKSPACE_INIT = "while :; do sleep 86400 & wait $!; done"
"""PID 1 of a workspace: bash, which reaps the orphans of the agent's background processes and,
as the namespace's init, ignores every signal sent from inside."""
_KILL_GRACE_S = 2
"""Seconds between ``timeout``'s TERM and its KILL."""
_COMMAND_WRAPPER = ('exec 2>&1 </dev/null\n'
                    f'timeout -k {_KILL_GRACE_S} "$2" bash -c "$1"\n'
                    'printf \'\\n%s %d\\n\' "$3" "$?"\n')
"""``bash -c WRAPPER run_command COMMAND LIMIT NONCE``: the command under ``timeout``, then the
end marker with its exit status on the same stream."""
_HOST_GRACE_S = 5.0
"""Beyond a command's limit and timeout's KILL grace: the longest the host waits for its marker."""
_TIMEOUT_STATUSES = (124, 137)
_MAX_REWARD_FILE_BYTES = 1024
_LOG_TAIL_BYTES = 16 * 1024


@dataclasses.dataclass(frozen=True)
class TerminalConfig:
    """Limits of terminal episodes.

    Attributes:
      max_episode_s: cap on an episode's wall-clock time (the bundle's ``[agent].timeout_sec``
        applies when lower; 900 s is the paper's per-trajectory timeout).
      command_timeout_s: cap on one command's time.
      max_output_bytes: output shown per command (first and last halves beyond it).
      max_test_s: cap on the tests' time (the bundle's ``[verifier].timeout_sec`` when lower).
      memory_bytes, cpus, max_processes: cgroup limits of each container.
      tmp_bytes: size of the private ``/tmp`` tmpfs.
      max_file_bytes: largest file a process may write (``RLIMIT_FSIZE``).
      docker_timeout_s: timeout of one engine API call.
    """

    max_episode_s: float = 900.0
    command_timeout_s: float = 120.0
    max_output_bytes: int = 16 * 1024
    max_test_s: float = 300.0
    memory_bytes: int = 1024 * 2**20
    cpus: float = 1.0
    max_processes: int = 256
    tmp_bytes: int = 256 * 2**20
    max_file_bytes: int = 1024 * 2**20
    docker_timeout_s: float = 120.0

    def __post_init__(self):
        for name in ("max_episode_s", "command_timeout_s", "max_test_s", "cpus", "docker_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"TerminalConfig.{name} must be a positive number, got {value!r}")
        for name in ("max_output_bytes", "memory_bytes", "max_processes", "tmp_bytes", "max_file_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise ValueError(f"TerminalConfig.{name} must be an integer >= 2, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Commands


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """One command's outcome. ``output`` is what the agent sees (the first and last halves of
    the limit when cut); ``exit_status`` is None when the wrapper never reported one."""

    output: str
    exit_status: int | None
    timed_out: bool
    total_bytes: int
    shown_bytes: int
    seconds: float
    time_limit_s: float

    @property
    def truncated(self) -> bool:
        return self.total_bytes > self.shown_bytes

    def observation(self) -> dict[str, Any]:
        return {"output": self.output, "exit_status": self.exit_status, "timed_out": self.timed_out,
                "truncated": self.truncated, "output_bytes": self.total_bytes,
                "seconds": round(self.seconds, 3)}

    def text(self) -> str:
        """The tool message: the output, then what happened, in brackets."""
        notes = []
        if self.truncated:
            notes.append(f"[output truncated: {self.total_bytes} bytes in all, {self.shown_bytes} shown "
                         "(the first and the last part)]")
        if self.timed_out:
            notes.append(f"[the command ran past its time limit of {self.time_limit_s:g} s and was stopped]")
        if self.exit_status is None:
            notes.append("[the command's shell ended without reporting an exit status]")
        else:
            notes.append(f"[exit status {self.exit_status}]")
        body = self.output if not self.output or self.output.endswith("\n") else self.output + "\n"
        return body + "\n".join(notes)


class _CommandStream:
    """Collects a command's output up to its end marker: keeps the first and last halves of
    ``limit`` bytes and counts the rest. Fed from the reader thread, read after it stops."""

    def __init__(self, limit: int, nonce: str):
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._pending = b""
        self._marker = f"\n{nonce} ".encode()
        self._lock = threading.Lock()
        self.total = 0
        self.status: int | None = None
        self.ended = False

    def _keep(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._tail_cap:
                del self._tail[:len(self._tail) - self._tail_cap]

    def feed(self, chunk: bytes) -> bool:
        """Take a chunk; True once the end marker (and so the exit status) has arrived."""
        with self._lock:
            if self.ended:
                return True
            data = self._pending + chunk
            at = data.find(self._marker)
            while at >= 0:
                after = data[at + len(self._marker):]
                status = re.match(rb"(\d{1,3})\n", after)
                if status:
                    self._keep(data[:at])
                    self.status, self.ended, self._pending = int(status[1]), True, b""
                    return True
                if re.fullmatch(rb"\d{0,3}", after):  # the marker's end is still on its way
                    self._keep(data[:at])
                    self._pending = data[at:]
                    return False
                at = data.find(self._marker, at + 1)
            hold = len(self._marker) + 4  # the longest tail that may begin a marker
            self._keep(data[:-hold] if len(data) > hold else b"")
            self._pending = data[-hold:] if len(data) > hold else data
            return False

    def result(self, seconds: float, limit_s: float, finished: bool) -> CommandResult:
        with self._lock:
            if not self.ended:
                self._keep(self._pending)
                self._pending = b""
            shown = len(self._head) + len(self._tail)
            if self.total > shown:
                text = (self._head.decode("utf-8", "replace") + "\n[...]\n"
                        + self._tail.decode("utf-8", "replace"))
            else:
                text = (self._head + self._tail).decode("utf-8", "replace")
            timed_out = not finished or (self.status in _TIMEOUT_STATUSES and seconds >= limit_s)
            return CommandResult(text, self.status, timed_out, self.total, shown, seconds, limit_s)


# ---------------------------------------------------------------------------------------------
# Verdicts


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the tests gave: the reward (0 on any error), the error naming the cause, the
    tests' exit status (None when they were stopped), the reward file's text and the log tail."""

    reward: float
    error: str | None
    test_exit_status: int | None
    reward_text: str | None
    log: str

    def final_state(self) -> dict[str, Any]:
        return {"reward": self.reward, "test_exit_status": self.test_exit_status,
                "reward_text": self.reward_text}


def read_reward_file(logs: Path) -> str | None:
    """``logs/verifier/reward.txt`` without following a link anywhere below ``logs`` (the tests'
    container could plant one pointing at a host file); None when absent. Raises ValueError when
    it is not a small regular file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW
    try:
        root = os.open(logs, flags | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        try:
            folder = os.open("verifier", flags | os.O_DIRECTORY, dir_fd=root)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ValueError(f"/logs/verifier is not a plain folder ({err.strerror})") from None
        try:
            fd = os.open("reward.txt", flags | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ValueError(f"reward.txt cannot be opened as a plain file ({err.strerror})") from None
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ValueError("reward.txt is not a regular file")
            data = handle.read(_MAX_REWARD_FILE_BYTES + 1)
    finally:
        os.close(root)
    if len(data) > _MAX_REWARD_FILE_BYTES:
        raise ValueError(f"reward.txt is over {_MAX_REWARD_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


def parse_reward(text: str) -> float:
    """The reward a reward file states; ValueError unless it is one finite number in [0, 1]."""
    try:
        reward = float(text.strip())
    except ValueError:
        raise ValueError(f"reward file says {text.strip()[:40]!r}, not a number") from None
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise ValueError(f"reward file says {reward!r}, not a finite number in [0, 1]")
    return reward


def _write_tests(bundle: TaskBundle, out: Path) -> None:
    for path, entry in bundle.files.items():
        if path.startswith("tests/"):
            target = out / path[len("tests/"):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(entry.data)
            target.chmod(0o755 if entry.executable else 0o644)
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)


# ---------------------------------------------------------------------------------------------
# The runtime


def _owner_alive(label: str) -> bool:
    """Whether the process an owner label names still runs (another host's: assumed so)."""
    hostname, _, rest = label.partition(":")
    pid = rest.partition(":")[0]
    if hostname != socket.gethostname():
        return True
    return pid.isdigit() and owner_label(int(pid)) == label


def remove_stale_resources(client) -> int:
    """Remove terminal containers and snapshots whose owning process is gone; returns how many."""
    removed = 0
    for container in client.containers.list(all=True, filters={"label": ROLE_LABEL}):
        if not _owner_alive(container.labels.get(OWNER_LABEL, "")):
            try:
                container.remove(force=True)
                removed += 1
            except Exception:  # removed meanwhile by its owner or another runtime
                pass
    for image in client.images.list(filters={"label": f"{ROLE_LABEL}=snapshot"}):
        if not _owner_alive(image.labels.get(OWNER_LABEL, "")):
            try:
                client.images.remove(image.id, force=True)
                removed += 1
            except Exception:
                pass
    return removed


def _remove_owned_at_exit() -> None:
    try:
        import docker

        client = docker.from_env(timeout=30)
        mine = f"{OWNER_LABEL}={owner_label()}"
        for container in client.containers.list(all=True, filters={"label": [ROLE_LABEL, mine]}):
            container.remove(force=True)
        for image in client.images.list(filters={"label": [f"{ROLE_LABEL}=snapshot", mine]}):
            client.images.remove(image.id, force=True)
        client.close()
    except Exception:
        pass


_process_lock = threading.Lock()
_empty_file_path: str | None = None


def _process_setup() -> str:
    """Once per process: register the exit cleanup and make the empty, read-only file that masks
    the loader's files (removed at exit); returns its path."""
    global _empty_file_path
    with _process_lock:
        if _empty_file_path is None:
            folder = tempfile.mkdtemp(prefix="envsched-terminal-")
            os.chmod(folder, 0o755)
            path = os.path.join(folder, "empty")
            with open(path, "xb"):
                pass
            os.chmod(path, 0o444)
            atexit.register(shutil.rmtree, folder, True)
            atexit.register(_remove_owned_at_exit)
            _empty_file_path = path
        return _empty_file_path


def toolchain_mounts(empty_file: str) -> list[tuple[str, str]]:
    """The read-only mounts laid over both containers (module docstring), as (container path,
    host path): the top-level links into ``/usr``, ``/etc/alternatives`` and ``/etc/python3*``
    where the host has them, and the loader's preload list and cache masked by ``empty_file``."""
    mounts = [(f"/{name}", f"/{target or name}") for name, target in host.root_links()]
    for path in ["/etc/alternatives", *sorted(glob.glob("/etc/python3*"))]:
        if os.path.isdir(path) and not os.path.islink(path):
            mounts.append((path, path))
    mounts += [("/etc/ld.so.preload", empty_file), ("/etc/ld.so.cache", empty_file)]
    return mounts


class TerminalRuntime:
    """The Docker side of terminal episodes: one engine client, the image cache, the containers.

    Thread-safe: the agent loop runs many episodes at once on one runtime. ``close`` releases
    the client (containers belong to episodes, which remove their own).
    """

    def __init__(self, config: TerminalConfig = TerminalConfig(), client=None):
        import docker

        self.config = config
        self._owns_client = client is None
        # one connection per command in flight: as many as the agent loop has episodes, at least
        self.client = client or docker.from_env(timeout=int(math.ceil(config.docker_timeout_s)),
                                                max_pool_size=64)
        self.base_image = ensure_base_image(self.client)
        self.run_id = uuid.uuid4().hex[:16]
        self._owner = owner_label()
        self._build_lock = threading.Lock()
        self._toolchain = toolchain_mounts(_process_setup())
        self._limits = ContainerLimits(config.memory_bytes, config.cpus, config.max_processes)
        remove_stale_resources(self.client)

    def labels(self, role: str) -> dict[str, str]:
        return {ROLE_LABEL: role, RUN_LABEL: self.run_id, OWNER_LABEL: self._owner}

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> TerminalRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- images and containers -----------------------------------------------------------------
    def image(self, bundle: TaskBundle) -> str:
        """The tag of ``bundle``'s image, built once (cached by build-context hash)."""
        with self._build_lock:
            try:
                return build_task_image(self.client, bundle)[0]
            except RuntimeError as err:
                raise SandboxError("build", f"bundle {bundle.name!r}: {err}") from None

    def _container(self, image: str, command: Sequence[str], role: str,
                   volumes: dict[str, dict[str, str]] | None = None):
        import docker

        fsize = docker.types.Ulimit(name="fsize", soft=self.config.max_file_bytes,
                                    hard=self.config.max_file_bytes)
        toolchain = [docker.types.Mount(target, source, type="bind", read_only=True)
                     for target, source in self._toolchain]
        return create_task_container(
            self.client, image, command, limits=self._limits, volumes=volumes or {},
            labels=self.labels(role), tmp_options=f"size={self.config.tmp_bytes},mode=1777",
            mounts=toolchain, ulimits=[fsize])

    def start_workspace(self, image: str):
        """A running workspace container of ``image`` (the caller removes it)."""
        container = self._container(image, ["bash", "-c", _WORKSPACE_INIT], "workspace")
        try:
            container.start()
        except BaseException:
            self.discard(container)
            raise
        return container

    @staticmethod
    def _kill(container) -> None:
        """SIGKILL to the container's PID 1; one that already stopped is not an error."""
        import docker

        try:
            container.kill()
        except docker.errors.APIError:
            container.reload()
            if container.status == "running":
                raise

    def discard(self, container) -> None:
        """Remove ``container`` whatever its state; a container already gone is not an error."""
        import docker

        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass

    # -- commands ------------------------------------------------------------------------------
    def run(self, container, command: str, time_limit_s: float) -> CommandResult:
        """Run ``command`` in the workspace (module docstring, step 2)."""
        nonce = secrets.token_hex(16)
        api = self.client.api
        start = time.monotonic()
        exec_id = api.exec_create(container.id, ["bash", "-c", _COMMAND_WRAPPER, RUN_COMMAND, command,
                                                 f"{time_limit_s:.3f}", nonce],
                                  workdir="/app", environment=dict(CONTAINER_ENV))["Id"]
        stream = api.exec_start(exec_id, stream=True)
        collected = _CommandStream(self.config.max_output_bytes, nonce)
        finished = threading.Event()

        def pump() -> None:
            try:
                for chunk in stream:
                    if collected.feed(chunk):
                        break
            except Exception:  # the stream was closed under it: the command is over for us
                pass
            finally:
                finished.set()

        threading.Thread(target=pump, name="terminal-command", daemon=True).start()
        in_time = finished.wait(time_limit_s + _KILL_GRACE_S + _HOST_GRACE_S)
        stream.close()
        return collected.result(time.monotonic() - start, time_limit_s, in_time)

    # -- scoring -------------------------------------------------------------------------------
    def snapshot(self, container) -> str:
        """Kill the workspace (every process in it dies with its PID 1), commit its file system
        and remove it; returns the snapshot's image id (the caller removes it)."""
        try:
            self._kill(container)
            container.wait(timeout=self.config.docker_timeout_s)
            image = container.commit(repository=SNAPSHOT_REPOSITORY, tag=uuid.uuid4().hex[:16],
                                     conf={"Labels": self.labels("snapshot")})
            return image.id
        finally:
            self.discard(container)

    def run_tests(self, snapshot: str, bundle: TaskBundle, time_limit_s: float) -> Verdict:
        """Run the bundle's tests in a fresh container of ``snapshot`` (module docstring, step 3)."""
        with tempfile.TemporaryDirectory(prefix="envsched-terminal-tests-",
                                         ignore_cleanup_errors=True) as tmp:
            tests, logs = Path(tmp) / "tests", Path(tmp) / "logs"
            _write_tests(bundle, tests)
            (logs / "verifier").mkdir(parents=True)
            for folder in (logs, logs / "verifier"):
                folder.chmod(0o777)
            container = self._container(snapshot, ["bash", "/tests/test.sh"], "tests", {
                str(tests): {"bind": "/tests", "mode": "ro"}, str(logs): {"bind": "/logs", "mode": "rw"}})
            try:
                container.start()
                try:
                    status: int | None = container.wait(timeout=time_limit_s)["StatusCode"]
                except Exception:  # the SDK raises a requests timeout type
                    self._kill(container)
                    status = None
                log = container.logs(tail=200).decode("utf-8", "replace")[-_LOG_TAIL_BYTES:]
            finally:
                self.discard(container)
            if status is None:
                return Verdict(0.0, f"verifier_timeout: the tests ran past {time_limit_s:g} s and were "
                               "stopped", None, None, log)
            try:
                text = read_reward_file(logs)
                if text is None:
                    return Verdict(0.0, f"verifier_no_reward: the tests exited with status {status} and "
                                   "wrote no /logs/verifier/reward.txt", status, None, log)
                return Verdict(parse_reward(text), None, status, text.strip()[:64], log)
            except ValueError as err:
                return Verdict(0.0, f"verifier_bad_reward: {err}", status, None, log)

    def score(self, container, bundle: TaskBundle, time_limit_s: float) -> Verdict:
        """Snapshot the workspace, run the tests on it, remove the snapshot."""
        snapshot = self.snapshot(container)
        try:
            return self.run_tests(snapshot, bundle, time_limit_s)
        finally:
            self.client.images.remove(snapshot, force=True)


# ---------------------------------------------------------------------------------------------
# Episodes


def load_task_bundle(task: Task) -> TaskBundle:
    """The bundle of a terminal task, read from its folder, in Harbor's layout. Raises
    :class:`SandboxError` (``bundle``) when it cannot be read or changed since the pool was loaded."""
    path, expected = task_bundle_path(task)
    try:
        bundle = read_bundle(path)
        if bundle.content_hash() != expected:
            raise SandboxError("bundle", f"task {task.task_id!r}: the bundle at {path} changed since the "
                               "pool was loaded (content hash differs); load the pool again")
        return convert(bundle, "harbor")
    except BundleError as err:
        raise SandboxError("bundle", f"task {task.task_id!r}: {err}") from None


def _as_sandbox_error(err: BaseException) -> SandboxError:
    if isinstance(err, SandboxError):
        return err
    return SandboxError("docker", f"{type(err).__name__}: {err}")


def _limit(*values: float | None) -> float:
    return min(v for v in values if v is not None)



class TerminalEpisode:
    """One terminal episode (module docstring), with :class:`~envsched_jax.envs.episode.Episode`'s API.

    Args:
      runtime: the runtime, or a function returning it (called at ``reset``, so that a runtime
        that cannot start, e.g. without a Docker engine, fails that episode with a named error).
      env: the task's environment (its tool catalog; the container comes from the task).
      max_steps: actions per episode; None for no limit.
      timeout: wall-clock limit of the episode; the bundle's ``[agent].timeout_sec`` and
        :attr:`TerminalConfig.max_episode_s` apply too (the least wins). The clock starts when
        the workspace is running (building the image is not charged to it).
    """

    def __init__(self, runtime: TerminalRuntime | Callable[[], TerminalRuntime], env: Environment, *,
                 max_steps: int | None = None, timeout: float | None = None):
        self._runtime_source = runtime
        self.env = env
        self.max_steps = max_steps
        self.timeout = timeout
        self._runtime: TerminalRuntime | None = None
        self._container = None
        self._bundle: TaskBundle | None = None
        self._task: Task | None = None
        self._deadline = float("inf")
        self._start = 0.0
        self._actions: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._failure: SandboxError | None = None
        self._end_reason = ""
        self._closed = False
        self.done = False
        self.trajectory: Trajectory | None = None

    def remaining_seconds(self) -> float:
        return self._deadline - time.monotonic()

    # -- plumbing -----------------------------------------------------------------------------
    def _fail(self, err: BaseException) -> None:
        self._failure = _as_sandbox_error(err)
        self.done = True
        self._discard()

    def _discard(self) -> None:
        if self._container is not None:
            container, self._container = self._container, None
            try:
                self._runtime.discard(container)
            except Exception:  # the engine is gone: the owner-label sweep removes it later
                pass

    def _end(self, reason: str) -> None:
        self._end_reason = reason
        self.done = True

    # -- the API -------------------------------------------------------------------------------
    def reset(self, task: Task) -> dict[str, Any] | None:
        if self._task is not None:
            raise EpisodeError("reset called twice: use a new TerminalEpisode per task")
        if not is_terminal_task(task):
            raise ValueError(f"task {task.task_id!r} is not a terminal task (metadata semantics "
                             f"{task.metadata.get('semantics')!r})")
        if task.env_id != self.env.env_id:
            raise ValueError(f"task {task.task_id!r} belongs to {task.env_id!r}, not {self.env.env_id!r}")
        self._task = task
        self._start = time.monotonic()
        self._events.append({"kind": "reset", "observation": None, "state": {}})
        try:
            runtime = self._runtime_source if isinstance(self._runtime_source, TerminalRuntime) \
                else self._runtime_source()
            self._runtime = runtime
            self._bundle = load_task_bundle(task)
            image = runtime.image(self._bundle)
            self._container = runtime.start_workspace(image)
        except Exception as err:
            self._fail(err)
            return None
        limit = _limit(self._bundle.timeouts.agent_sec, runtime.config.max_episode_s, self.timeout)
        self._deadline = time.monotonic() + limit
        observation = {"content": task.instruction, "tools": [RUN_COMMAND]}
        self._events[-1] = {"kind": "reset", "observation": observation,
                            "state": {"image": image, "time_limit_s": limit}}
        return observation

    def step(self, action: Action | Mapping[str, Any]) -> StepResult:
        if self._task is None:
            raise EpisodeError("step before reset")
        if self.done:
            raise EpisodeError("step after the end of the episode")
        act = action_json(action)
        self._actions.append(act)
        event: dict[str, Any] = {"kind": "step", "action": act, "observation": None, "state_change": {},
                                 "done": True}
        remaining = self.remaining_seconds()
        if remaining <= 0:
            self._end("wall_clock")
            event["error"] = "wall_clock: the episode's time limit passed before this action"
            self._events.append(event)
            return StepResult(None, True)
        if act["name"] == CHAT_WITH_USER:
            self._end("answered")
            self._events.append(event)
            return StepResult(None, True)
        if act["name"] == RUN_COMMAND:
            arguments = act["arguments"]
            if set(arguments) != {"command"} or not isinstance(arguments["command"], str):
                observation = {"error": "run_command takes exactly one argument, 'command', a string; "
                                        f"got {sorted(arguments)}"}
                text = f"Error: {observation['error']}"
            else:
                limit = min(self._runtime.config.command_timeout_s, remaining)
                try:
                    result = self._runtime.run(self._container, arguments["command"], limit)
                except Exception as err:
                    event["error"] = str(_as_sandbox_error(err))
                    self._events.append(event)
                    self._fail(err)
                    return StepResult(None, True)
                observation, text = result.observation(), result.text()
        else:
            observation = {"error": f"unknown tool {act['name']!r}; the only tool is {RUN_COMMAND!r} "
                                    "(answer in plain text when the task is done)"}
            text = f"Error: {observation['error']}"
        if self.max_steps is not None and len(self._actions) >= self.max_steps:
            self._end("max_steps")
        elif self.remaining_seconds() <= 0:
            self._end("wall_clock")
        event.update(observation=observation, done=self.done)
        self._events.append(event)
        return StepResult(observation, self.done, {"role": "tool", "content": text})

    def user_stop(self) -> None:
        """The simulated user ended the conversation: the episode ends (bundle tasks have no
        user; this keeps the API whole) and is scored on the workspace it reached."""
        if self._task is None:
            raise EpisodeError("user_stop before reset")
        if self.done:
            raise EpisodeError("user_stop after the end of the episode")
        self._end("user_stop")
        self._events.append({"kind": "user_stop"})

    def score(self) -> Score:
        if self._task is None:
            raise EpisodeError("score before reset")
        if self.trajectory is not None:
            raise EpisodeError("score called twice")
        if self._closed:
            raise EpisodeError("score after close: the workspace was removed unscored")
        verdict = None
        if self._failure is None:
            container, self._container = self._container, None
            try:
                verifier_s = _limit(self._bundle.timeouts.verifier_sec, self._runtime.config.max_test_s)
                verdict = self._runtime.score(container, self._bundle, verifier_s)
            except Exception as err:
                self._fail(err)
        self.done = True
        if verdict is None:
            err = self._failure
            num_checks = len(self._task.checks)
            reward, results, errors = 0.0, [False] * num_checks, [str(err)] * num_checks
            end_reason, error, final_state = f"sandbox_{err.kind}", str(err), {}
            extra: dict[str, Any] = {}
        else:
            passed = verdict.reward == 1.0
            reward, results = verdict.reward, [passed] * len(self._task.checks)
            errors = [verdict.error] * len(self._task.checks)
            end_reason, error = self._end_reason or "stopped", verdict.error
            final_state = verdict.final_state()
            extra = {"test_log": verdict.log}
        self._events.append({"kind": "score", "reward": reward, "check_results": results,
                             "check_errors": errors, **extra})
        self.trajectory = Trajectory(
            task_id=self._task.task_id, env_id=self.env.env_id, sandbox=SANDBOX_NAME,
            actions=self._actions, events=self._events, reward=float(reward), check_results=results,
            check_errors=errors, end_reason=end_reason, error=error, final_state=final_state,
            wall_seconds=time.monotonic() - self._start)
        return Score(self.trajectory.reward, tuple(results), tuple(errors), error, end_reason)

    def close(self) -> None:
        """End the episode without scoring; its container is removed. After ``score`` it only
        makes sure nothing is left."""
        self._discard()
        self._closed = self.trajectory is None
        self.done = True


def answer_action(task: Task, text: str) -> Action:
    """The action of the agent's plain answer: ``chat_with_user``, with the argument the task's
    semantics reads (terminal tasks take ``message``, as the project's own pools do)."""
    if is_terminal_task(task):
        return Action(CHAT_WITH_USER, {"message": text})
    return chat_action(task, text)


def run_terminal_actions(runtime: TerminalRuntime, env: Environment, task: Task,
                         actions: Sequence[Action | Mapping[str, Any]], *, max_steps: int | None = None,
                         timeout: float | None = None) -> Trajectory:
    """Play a fixed action sequence as one terminal episode and score it. Always returns a
    trajectory (a failure is reward 0 with its named error) and leaves no container behind."""
    episode = TerminalEpisode(runtime, env, max_steps=max_steps, timeout=timeout)
    try:
        if episode.reset(task) is not None:
            for action in actions:
                if episode.done:
                    break
                episode.step(action)
        episode.score()
    finally:
        episode.close()
    return episode.trajectory
