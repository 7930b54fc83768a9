"""Docker backend: each worker is a container of a locally built image, driven by the Python
``docker`` SDK over the container's attach socket.

The image (:func:`ensure_image`). No registry is reachable from these machines, so the image is
built locally with ``docker import`` from a tarball that this module writes itself: an almost
empty root file system (the ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` links of a merged-``/usr``
Debian, empty ``/usr``, ``/tmp``, ``/opt/envsched`` mount points, and an ``/etc/passwd`` naming
``nobody``). At run time the host's interpreter, ``/usr`` and the worker code are bind-mounted
read-only into it (:mod:`.host`), exactly as for bubblewrap. This was chosen over a debootstrap
root file system because it needs no download at all, builds in well under a second, and runs the
same interpreter as the in-process and bubblewrap sandboxes, which keeps replay identical across
all three. The tarball is deterministic (fixed owners and times), and the image is tagged with the
SHA-256 of its bytes (``envsched-sandbox:<hash>``), so it is built once per machine and reused;
any change to its content gives a new tag.

The container: ``--network none``, read-only root, a private size-limited tmpfs ``/tmp`` and
``/dev/shm``, the installed-package folders masked by empty tmpfs mounts (:func:`.host.masked_dirs`),
a fresh unprivileged uid per worker (:func:`.host.worker_uid`), all capabilities dropped,
``no-new-privileges``, a cgroup memory limit (the worker's address-space limit plus a margin,
swap equal to it), ``--cpus``, ``--pids-limit``. The supervisor is the container's PID 1 and
sets its own rlimits and seccomp filter, as in bubblewrap.

Lifetime. Containers carry the label ``envsched.sandbox=1`` and ``envsched.owner=HOST:PID:START``
naming the owning process (its start time guards against a reused PID). They are removed:

- with force when the worker is closed (a timeout, a crash, the pool's ``close``);
- by the engine when the owner dies, even by ``SIGKILL``: the container is created with
  ``StdinOnce`` and ``AutoRemove``, so the engine closes its standard input when the owner's
  attach connection drops, the supervisor reads end-of-file and exits, and the engine removes
  the stopped container;
- at interpreter exit (``atexit``) for any the owner still has;
- at the start of every backend (:func:`remove_stale_containers`): labelled containers whose
  owner process no longer exists on this host.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import socket
import tarfile
import threading
import time

from envsched_jax.envs.sandbox import host
from envsched_jax.envs.sandbox.base import MiB, SandboxLimits, SandboxUnavailable
from envsched_jax.envs.sandbox.stream import StreamWorker

IMAGE_REPOSITORY = "envsched-sandbox"
LABEL = "envsched.sandbox"
OWNER_LABEL = "envsched.owner"
_STDOUT = 1


def _process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_label(pid: int | None = None) -> str:
    """``HOST:PID:START`` of the owning process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def _owner_alive(label: str) -> bool:
    host_name, _, rest = label.partition(":")
    pid, _, start = rest.partition(":")
    if host_name != socket.gethostname():
        return True  # another machine's container on a shared engine: not ours to judge
    return pid.isdigit() and _process_start(int(pid)) == start


def remove_stale_containers(client) -> int:
    """Remove sandbox containers whose owner process is gone (or that carry no owner label, as
    older versions made them); returns how many were removed."""
    removed = 0
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        owner = container.labels.get(OWNER_LABEL)
        if owner is None or not _owner_alive(owner):
            try:
                container.remove(force=True)
                removed += 1
            except Exception:  # removed meanwhile by the engine (AutoRemove) or another owner
                pass
    return removed


def _remove_own_containers() -> None:
    """At exit: remove the containers this process still owns."""
    try:
        import docker

        client = docker.from_env(timeout=30)
        for container in client.containers.list(
                all=True, filters={"label": f"{OWNER_LABEL}={owner_label()}"}):
            container.remove(force=True)
        client.close()
    except Exception:
        pass


_atexit_registered = False


def unavailable_reason(timeout: float = 5.0) -> str | None:
    """Why Docker cannot be used here (no SDK, no engine answering), or None."""
    try:
        import docker
    except ImportError:
        return "the Python 'docker' package is not installed"
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        client.close()
    except Exception as err:  # the SDK raises several types for a missing engine
        return f"no Docker engine answers ({type(err).__name__}: {err})"
    return None


def rootfs_tarball() -> bytes:
    """The image's root file system as a deterministic tar archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            tar.addfile(info)

        def add_file(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        for name in ("usr", "tmp", "proc", "dev", "sys", "etc", "opt", "opt/envsched",
                     "opt/envsched/runtime", "opt/envsched/site"):
            add_dir(name, 0o1777 if name == "tmp" else 0o755)
        for name, target in host.root_links():
            if target is None:
                add_dir(name)
            else:
                info = tarfile.TarInfo(name)
                info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
                tar.addfile(info)
        add_file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                               f"nobody:x:{host.SANDBOX_UID}:{host.SANDBOX_UID}:nobody:/tmp:/bin/false\n")
        add_file("etc/group", f"root:x:0:\nnogroup:x:{host.SANDBOX_UID}:\n")
    return buf.getvalue()


def image_tag(tarball: bytes) -> str:
    return f"{IMAGE_REPOSITORY}:{hashlib.sha256(tarball).hexdigest()[:16]}"


_image_lock = threading.Lock()


def ensure_image(client) -> str:
    """Tag of the sandbox image, importing it first if this engine does not have it yet."""
    import docker

    tarball = rootfs_tarball()
    tag = image_tag(tarball)
    with _image_lock:
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            repository, version = tag.split(":")
            client.api.import_image_from_data(tarball, repository=repository, tag=version)
            client.images.get(tag)  # raises if the import did not produce it
    return tag


class DockerWorker(StreamWorker):
    def __init__(self, client, image: str, limits: SandboxLimits, site_packages: tuple[str, ...],
                 cpus: float):
        super().__init__(limits)
        start = time.perf_counter()
        volumes = {"/usr": {"bind": "/usr", "mode": "ro"}}
        for mount in host.mounts(site_packages):
            volumes[mount.source] = {"bind": mount.target, "mode": "ro"}
        tmpfs = {"/tmp": f"size={limits.tmp_bytes},mode=1777"}
        for folder in host.masked_dirs():
            tmpfs[folder] = "size=4096,ro"
        memory = limits.memory_bytes + 128 * MiB
        uid = host.worker_uid()
        self.container = client.containers.create(
            image, command=host.worker_argv(limits, None, site_packages), stdin_open=True,
            auto_remove=True, detach=False,  # detach=False sets StdinOnce (with stdin_open)
            network_mode="none", read_only=True, user=f"{uid}:{uid}",
            mem_limit=memory, memswap_limit=memory, nano_cpus=int(cpus * 1e9),
            pids_limit=limits.max_processes, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], volumes=volumes, tmpfs=tmpfs,
            shm_size=limits.tmp_bytes, working_dir="/tmp",
            environment={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
            labels={LABEL: "1", OWNER_LABEL: owner_label()})
        try:
            self._sock_io = self.container.attach_socket(
                params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._sock: socket.socket = self._sock_io._sock
            self.container.start()
            self._pending = b""       # payload bytes received but not yet consumed
            self._frame_left = 0      # bytes left in the current multiplexed frame
            self._frame_stream = 0
            self.request({"op": "hello"}, timeout=max(limits.wall_seconds, 30.0))
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.perf_counter() - start

    def _send(self, data: bytes) -> None:
        self._sock.settimeout(self.limits.wall_seconds)
        self._sock.sendall(data)

    def _raw(self, n: int, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b""
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv(n)
        except TimeoutError:
            return b""

    def _recv(self, n: int, deadline: float) -> bytes:
        # Docker multiplexes the streams of a non-TTY container: 8-byte headers (stream id, 3
        # zero bytes, big-endian length) before each chunk; keep stdout, drop stderr.
        while True:
            if self._pending:
                out, self._pending = self._pending[:n], self._pending[n:]
                return out
            if self._frame_left == 0:
                header = b""
                while len(header) < 8:
                    chunk = self._raw(8 - len(header), deadline)
                    if not chunk:
                        return b""
                    header += chunk
                self._frame_stream = header[0]
                self._frame_left = int.from_bytes(header[4:8], "big")
                continue
            chunk = self._raw(min(self._frame_left, 1 << 20), deadline)
            if not chunk:
                return b""
            self._frame_left -= len(chunk)
            if self._frame_stream == _STDOUT:
                self._pending = chunk

    def _exit_cause(self) -> str:
        try:
            self.container.reload()
            state = self.container.attrs["State"]
        except Exception as err:
            return f"container state unknown ({err})"
        if state.get("OOMKilled"):
            return "the container's memory limit was hit (OOM killed)"
        if state.get("Running"):
            return "container still running but its stream closed"
        return f"container exit code {state.get('ExitCode')}"

    def _kill(self) -> None:
        try:
            self._sock_io.close()
        except Exception:
            pass
        try:
            self.container.remove(force=True)
        except Exception:
            pass


class DockerBackend:
    name = "docker"

    def __init__(self, limits: SandboxLimits, site_packages: tuple[str, ...], cpus: float = 2.0):
        reason = unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)
        import docker

        global _atexit_registered
        self.client = docker.from_env(timeout=120)
        self.stale_removed = remove_stale_containers(self.client)
        if not _atexit_registered:
            atexit.register(_remove_own_containers)
            _atexit_registered = True
        self.image = ensure_image(self.client)
        self.limits = limits
        self.site_packages = site_packages
        self.cpus = cpus

    def start_worker(self) -> DockerWorker:
        return DockerWorker(self.client, self.image, self.limits, self.site_packages, self.cpus)

    def close(self) -> None:
        self.client.close()
