"""Distributed rollouts on Ray: generation servers and sandbox workers as Ray actors.

Two classes put the rollout machinery on a Ray cluster without changing the agent loop:

- :class:`RayGenerationBackend` (registry name ``ray``) is a generation backend
  (:mod:`.backends.base`) whose requests are served by N Ray actors. Each actor builds an
  ordinary *local* backend on its node from a picklable factory and relays requests to it:

  * ``("jax", {...kwargs})``, ``("openai", {"base_url": ..., "model": ..., "max_context": ...})``,
    ``("scripted", {"tokenizer": ..., "respond": ...})``: a registry name and the keyword
    arguments of its class (they must pickle);
  * a zero-argument callable (``functools.partial(my_module.make_backend, cfg)``) for anything
    else, e.g. a backend that starts a vLLM server on the actor's node and wraps it in
    ``OpenAIBackend(server.base_url, ..., server=server)``, or loads a policy for the JAX
    sampler there. The callable must be importable on every node (install the project there).

  Actors ask for ``num_cpus`` / ``num_gpus`` / custom ``resources``, so generation servers land
  on GPU nodes. Routing: every request of one episode (the agent loop's request id is
  ``"<task>#<k>/turn<n>"``; the episode key is the part before ``/turn``) goes to the actor that
  served its first turn, so the backend's prefix cache keeps the episode's KV blocks; a new
  episode goes to the actor with the fewest outstanding requests. ``submit`` returns a
  ``concurrent.futures.Future`` at once; a driver-side thread resolves it from the actor's
  reply. Every future resolves: an actor that dies gives its in-flight requests an error
  completion naming the actor, its node and Ray's reason, and is replaced by a new actor (built
  with the weights most recently synced; at most ``max_replacements`` times per slot, so a
  factory that always crashes does not loop forever). Ray's own ``max_restarts`` is not used:
  a restarted actor would rerun its constructor with the *original* weights.

  ``update_weights(dir)`` calls every actor and returns the slowest actor's seconds. The folder
  must be readable on every node: either a filesystem every node mounts at the same path
  (``weight_sync="shared_fs"``, the default: NFS, a cluster filesystem, or the caller copying
  it), or ``weight_sync="object_store"``: the driver reads the safetensors folder once, puts its
  bytes in Ray's object store, and each actor writes them to a fresh local temporary folder
  and loads from there (the previous one is deleted after the swap). Requests submitted before
  the call still finish on the old weights: each actor first waits until every request the
  driver had sent it has reached its local backend, and the local backend keeps that promise.

- :class:`RaySandboxBackend` implements the sandbox ``Backend`` protocol
  (:mod:`envsched_jax.envs.sandbox.base`), so ``WorkerPool(RaySandboxBackend(...))`` and with it
  :class:`~envsched_jax.rollout.agent.AgentRunner` and
  :class:`~envsched_jax.envs.rollout.RolloutPool` work unchanged. Each ``start_worker()`` places
  one Ray actor (``num_cpus``, ``resources``) that starts one local worker of the wrapped kind
  (``bwrap``, ``docker`` or ``inprocess``, the backends of :mod:`envsched_jax.envs.sandbox`) and
  relays ``request(message, timeout)``. The driver waits at most ``timeout + grace_s`` for a
  reply (the local worker enforces ``timeout`` itself and answers ``wall_clock``; a hung or
  unreachable node does not), then kills the actor and raises ``SandboxError("wall_clock",
  ..., retire=True)``; a dead actor raises ``SandboxError("crashed", ..., retire=True)``; the
  pool replaces a retired worker. ``admit(env)`` is the wrapped kind's admission, run on the
  driver: the in-process kind admits trusted classes only (``trust="any"`` also admits source
  strings), exactly as :class:`~envsched_jax.envs.sandbox.inprocess.InProcessBackend`; the jails
  admit everything. Admitted environments travel to each actor with its first episode of them.

Running across machines: ``ray start --head`` on one node, ``ray start --address=HEAD:6379`` on
the others (declaring ``--num-gpus`` / ``--resources``), then run the driver with
``RAY_ADDRESS=HEAD:6379`` (or pass ``address=``). The project and its dependencies must be
installed on every node (same Python), bubblewrap / Docker on nodes that host sandbox actors.
Only a single-machine local cluster is exercised by the tests.

``ray`` is imported on first use (``pip install envsched_jax[distributed]``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import math
import os
import queue
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from envsched_jax.envs.sandbox.base import SandboxError, SandboxLimits, SandboxUnavailable
from envsched_jax.rollout.backends.base import (BackendError, Completion, GenerationBackend,
                                                GenerationRequest)

WeightSync = Literal["shared_fs", "object_store"]
BackendFactory = Callable[[], GenerationBackend] | tuple[str, Mapping[str, Any]]

_ORDER_WAIT_S = 30.0
"""How long an actor's weight update waits for earlier requests to reach its local backend."""


def _ray():
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the Ray backends need the 'ray' package: pip install "
                          "'envsched_jax[distributed]'") from err
    return ray


def ensure_ray(address: str | None = None) -> None:
    """Connect to Ray unless already connected: to ``address``, else ``RAY_ADDRESS``, else a
    new local cluster (Ray's own rule)."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _short(err: BaseException, limit: int = 600) -> str:
    """A readable line of a (often very long) Ray error: for an exception raised inside an
    actor, that exception; for a dead actor, Ray's summary, why it died, and the exception of
    a failed constructor (the last line of its traceback)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(err, _ray().exceptions.RayActorError):
        err = cause
    lines = [ln for ln in _ANSI.sub("", str(err)).splitlines() if ln.strip()]
    keep = [re.sub(r", repr=<[^>]*>", "", lines[0].strip())] if lines else []
    keep += [ln.strip() for ln in lines[1:] if ln.strip().startswith("The actor ")]
    if len(lines) > 1 and not lines[-1][:1].isspace() and lines[-1].strip() not in keep:
        keep.append(lines[-1].strip())  # a traceback's exception line
    text = " | ".join(keep) or repr(err)
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(err).__name__}: {text}"


def _node_label(info: Mapping[str, Any] | None) -> str:
    if not info:
        return "node unknown"
    node = str(info.get("node_id", "?"))[:12]
    return f"node {node} ({info.get('host', '?')}, pid {info.get('pid', '?')})"


def _actor_info() -> dict[str, Any]:
    ray = _ray()
    try:
        node = ray.get_runtime_context().get_node_id()
    except Exception:
        node = "?"
    return {"node_id": node, "host": socket.gethostname(), "pid": os.getpid()}


def episode_key(request_id: str) -> str:
    """The episode a request belongs to: the part of ``"<task>#<k>/turn<n>"`` before ``/turn``
    (the whole id when it has no ``/turn``)."""
    head, sep, _ = request_id.rpartition("/turn")
    return head if sep else request_id


# -- generation ---------------------------------------------------------------------------------

def build_backend(factory: BackendFactory) -> GenerationBackend:
    """The local backend a factory describes (see the module docstring)."""
    check_factory(factory)
    if callable(factory):
        backend = factory()
    else:
        from envsched_jax.rollout.backends import backend_class

        name, kwargs = factory
        backend = backend_class(name)(**dict(kwargs or {}))
    missing = [a for a in ("submit", "update_weights", "close", "max_context")
               if not hasattr(backend, a)]
    if missing:
        raise TypeError(f"the backend factory made a {type(backend).__name__}, which lacks "
                        f"{', '.join(missing)} (not a generation backend)")
    return backend


def check_factory(factory: Any) -> None:
    """Raise ``TypeError`` / ``ValueError`` unless ``factory`` is a zero-argument callable or a
    ``(registry name, kwargs)`` pair naming a local backend."""
    if callable(factory):
        return
    if (isinstance(factory, (tuple, list)) and len(factory) == 2 and isinstance(factory[0], str)
            and (factory[1] is None or isinstance(factory[1], Mapping))):
        from envsched_jax.rollout.backends import BACKENDS

        if factory[0] == "ray":
            raise ValueError("a Ray generation actor cannot host another 'ray' backend")
        if factory[0] not in BACKENDS:
            raise ValueError(f"unknown generation backend {factory[0]!r} in the Ray factory; "
                             f"choose from {', '.join(sorted(set(BACKENDS) - {'ray'}))}")
        return
    raise TypeError(f"a Ray backend factory is a zero-argument callable or a (name, kwargs) "
                    f"pair, got {factory!r}")


def _read_weights(params_dir: str | os.PathLike) -> dict[str, bytes]:
    root = Path(params_dir)
    if not root.is_dir():
        raise ValueError(f"weights folder {root} does not exist (or is not a folder)")
    files = {p.relative_to(root).as_posix(): p.read_bytes()
             for p in sorted(root.rglob("*")) if p.is_file()}
    if not files:
        raise ValueError(f"weights folder {root} is empty")
    return files


class _GenerationActor:
    """Runs on a Ray node: one local backend, requests relayed to it (an async actor, so many
    requests are in flight at once and the local backend batches them)."""

    def __init__(self, factory: BackendFactory, weights_mode: str | None, weights: Any):
        self.backend = build_backend(factory)
        self.info_ = {**_actor_info(), "name": getattr(self.backend, "name", "?"),
                      "max_context": int(self.backend.max_context)}
        self._started: set[int] = set()
        self._dirs: list[str] = []
        self.weights_dir: str | None = None
        if weights_mode is not None:
            self._apply(weights_mode, weights)

    def info(self) -> dict[str, Any]:
        return {**self.info_, "weights_dir": self.weights_dir}

    async def generate(self, seq: int, request: GenerationRequest) -> Completion:
        self._started.add(seq)
        try:
            future = self.backend.submit(request)
        except Exception as err:  # an invalid request: the local backend refused it
            return Completion.failed(f"{type(err).__name__}: {err}")
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as err:  # a backend must not fail its future; name it if it does
            return Completion.failed(f"{type(err).__name__}: {err}")

    async def update_weights(self, mode: str, weights: Any, upto: int,
                             pending: list[int]) -> float:
        start = time.perf_counter()
        wanted = set(pending)
        deadline = time.monotonic() + _ORDER_WAIT_S
        while not wanted <= self._started and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # earlier requests still on their way to this actor
        self._started = {s for s in self._started if s > upto or s in wanted}
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._apply, mode, weights)
        return time.perf_counter() - start

    def _apply(self, mode: str, weights: Any) -> float:
        start = time.perf_counter()
        if mode == "shared_fs":
            path = str(weights)
            if not os.path.isdir(path):
                raise FileNotFoundError(
                    f"weights folder {path} does not exist on {_node_label(self.info_)}: put it "
                    "on a filesystem every node mounts at the same path, or use "
                    "weight_sync='object_store'")
            new_dir = None
        else:
            new_dir = tempfile.mkdtemp(prefix="envsched-weights-")
            try:
                for rel, data in weights.items():
                    target = Path(new_dir, rel)
                    if ".." in Path(rel).parts or Path(rel).is_absolute():
                        raise ValueError(f"unsafe file name {rel!r} in shipped weights")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
            except BaseException:
                shutil.rmtree(new_dir, ignore_errors=True)
                raise
            path = new_dir
        try:
            self.backend.update_weights(path)
        except BaseException:
            if new_dir is not None:
                shutil.rmtree(new_dir, ignore_errors=True)
            raise
        self.weights_dir = path
        if new_dir is not None:  # the served folder stays (a server may reload it on restart)
            old, self._dirs = self._dirs, [new_dir]
            for d in old:
                shutil.rmtree(d, ignore_errors=True)
        return time.perf_counter() - start

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.backend)

    def shutdown(self) -> None:
        try:
            self.backend.close()
        finally:
            for d in self._dirs:
                shutil.rmtree(d, ignore_errors=True)
            self._dirs = []


@dataclasses.dataclass
class _Slot:
    index: int
    handle: Any = None
    incarnation: int = 0
    state: str = "starting"  # starting | ready | dead
    info: dict[str, Any] | None = None
    outstanding: int = 0
    episodes: int = 0
    next_seq: int = 0
    replacements: int = 0
    last_error: str | None = None


@dataclasses.dataclass
class _Pending:
    future: concurrent.futures.Future
    ref: Any
    slot: int
    incarnation: int
    seq: int
    request_id: str
    start: float
    deadline: float
    where: str


class RayGenerationBackend:
    """A generation backend served by Ray actors, each hosting a local backend.

    Args:
      factory: how each actor builds its local backend (see the module docstring).
      num_actors: how many actors (generation servers).
      num_cpus: CPUs each actor asks Ray for.
      num_gpus: GPUs each actor asks Ray for (``num_gpus=1`` puts one server per GPU).
      resources: custom Ray resources each actor asks for (``{"generation": 1}`` pins them to
        nodes that declared it).
      actor_options: further ``ray.remote`` options (``scheduling_strategy="SPREAD"``,
        ``runtime_env``); ``max_restarts`` is refused (see the module docstring).
      weight_sync: ``shared_fs`` (every node reads ``update_weights``'s folder at the same path)
        or ``object_store`` (its bytes are shipped through Ray's object store).
      start_timeout_s: how long to wait for an actor to be placed and build its backend.
      request_timeout_s: driver-side limit of one request (None: none; the agent loop has its
        own ``generation_timeout_s``).
      update_timeout_s: limit of one ``update_weights`` on every actor.
      max_replacements: how many times one actor slot is replaced after a death.
      address: the Ray cluster to connect to when not connected yet (default: ``RAY_ADDRESS``,
        else a new local cluster).
    """

    name = "ray"

    def __init__(self, factory: BackendFactory, num_actors: int = 1, *, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, resources: Mapping[str, float] | None = None,
                 actor_options: Mapping[str, Any] | None = None,
                 weight_sync: WeightSync = "shared_fs", start_timeout_s: float = 600.0,
                 request_timeout_s: float | None = None, update_timeout_s: float = 1800.0,
                 max_replacements: int = 3, max_concurrency: int = 1000,
                 sticky_episodes: int = 65536, address: str | None = None):
        check_factory(factory)
        if not isinstance(num_actors, int) or num_actors < 1:
            raise ValueError(f"num_actors must be a positive integer, got {num_actors!r}")
        if weight_sync not in ("shared_fs", "object_store"):
            raise ValueError(f"weight_sync must be 'shared_fs' or 'object_store', "
                             f"got {weight_sync!r}")
        if num_cpus < 0 or num_gpus < 0:
            raise ValueError(f"num_cpus and num_gpus must be >= 0, got {num_cpus!r}, {num_gpus!r}")
        if request_timeout_s is not None and not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {request_timeout_s!r}")
        if max_replacements < 0:
            raise ValueError(f"max_replacements must be >= 0, got {max_replacements!r}")
        options = dict(actor_options or {})
        if options.get("max_restarts"):
            raise ValueError("RayGenerationBackend replaces dead actors itself (a Ray restart "
                             "would come back with the first weights): do not set max_restarts")
        ray = _ray()
        ensure_ray(address)
        self.factory = factory
        self.weight_sync = weight_sync
        self.start_timeout_s = float(start_timeout_s)
        self.request_timeout_s = request_timeout_s
        self.update_timeout_s = float(update_timeout_s)
        self.max_replacements = int(max_replacements)
        options.update(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0,
                       max_concurrency=max_concurrency)
        if resources:
            options["resources"] = dict(resources)
        self._actor_cls = ray.remote(_GenerationActor).options(**options)
        self._lock = threading.Lock()
        self._weights_lock = threading.Lock()  # weight updates vs. building replacements
        self._weights: tuple[str, Any] | None = None  # (mode, folder or object ref)
        self._sticky: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._sticky_cap = int(sticky_episodes)
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count()
        self._done: queue.Queue = queue.Queue()
        self._closed = False
        self.num_replaced = 0
        self.routed: collections.deque[tuple[str, int]] = collections.deque(maxlen=10_000)
        """(request id, actor index) of the latest requests, for inspection."""
        self.last_update_seconds: list[float] = []

        self._slots = [_Slot(i, handle=self._actor_cls.remote(factory, None, None))
                       for i in range(num_actors)]
        errors = []
        refs = [s.handle.info.remote() for s in self._slots]
        for slot, ref in zip(self._slots, refs):
            try:
                slot.info = ray.get(ref, timeout=self.start_timeout_s)
                slot.state = "ready"
            except ray.exceptions.GetTimeoutError:
                errors.append(f"actor {slot.index}: not placed and started within "
                              f"{self.start_timeout_s:g} s (does the cluster have "
                              f"{self._resources_text(options)} free?)")
            except Exception as err:
                errors.append(f"actor {slot.index}: {_short(err)}")
        if errors:
            for slot in self._slots:
                ray.kill(slot.handle, no_restart=True)
            raise BackendError(f"RayGenerationBackend could not start its {num_actors} "
                               f"generation actor(s): " + "; ".join(errors))
        self.max_context = min(int(s.info["max_context"]) for s in self._slots)
        self.inner_name = str(self._slots[0].info["name"])
        self._resolver = threading.Thread(target=self._resolve_loop, daemon=True,
                                          name="envsched-ray-generation-resolver")
        self._resolver.start()

    @staticmethod
    def _resources_text(options: Mapping[str, Any]) -> str:
        parts = [f"{options['num_cpus']:g} CPU"]
        if options.get("num_gpus"):
            parts.append(f"{options['num_gpus']:g} GPU")
        parts += [f"{v:g} {k}" for k, v in (options.get("resources") or {}).items()]
        return " + ".join(parts)

    # -- inspection ---------------------------------------------------------------------------
    @property
    def actors(self) -> list[Any]:
        """The current actor handles, by slot (None for a slot being replaced or dead)."""
        with self._lock:
            return [s.handle if s.state == "ready" else None for s in self._slots]

    def actor_infos(self) -> list[dict[str, Any] | None]:
        """Node, host, pid, local backend name of each slot's actor, with its state."""
        with self._lock:
            return [None if s.info is None else {**s.info, "state": s.state,
                                                  "outstanding": s.outstanding,
                                                  "replacements": s.replacements}
                    for s in self._slots]

    def call_actors(self, fn: Callable[[Any], Any], timeout: float = 60.0) -> list[Any]:
        """``fn(local_backend)`` on every ready actor (diagnostics: statistics, caches)."""
        ray = _ray()
        handles = [h for h in self.actors if h is not None]
        return ray.get([h.call.remote(fn) for h in handles], timeout=timeout)

    # -- requests -------------------------------------------------------------------------------
    def _route(self, request_id: str) -> _Slot | None:
        key = episode_key(request_id) if request_id else None
        if key is not None and key in self._sticky:
            slot = self._slots[self._sticky[key]]
            if slot.state == "ready":
                self._sticky.move_to_end(key)
                return slot
        candidates = [s for s in self._slots if s.state == "ready"]
        if not candidates:
            return None
        slot = min(candidates, key=lambda s: (s.outstanding, s.episodes, s.index))
        if key is not None:
            self._sticky[key] = slot.index
            self._sticky.move_to_end(key)
            slot.episodes += 1
            while len(self._sticky) > self._sticky_cap:
                self._sticky.popitem(last=False)
        return slot

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                future.set_result(Completion.failed("RayGenerationBackend is closed"))
                return future
            slot = self._route(request.request_id)
            if slot is None:
                reasons = "; ".join(f"actor {s.index}: {s.last_error or s.state}"
                                    for s in self._slots)
                future.set_result(Completion.failed(
                    f"no Ray generation actor is serving (all {len(self._slots)} dead or being "
                    f"replaced): {reasons}"))
                return future
            seq = slot.next_seq
            slot.next_seq += 1
            try:
                ref = slot.handle.generate.remote(seq, request)
            except Exception as err:
                future.set_result(Completion.failed(
                    f"could not send request {request.request_id!r} to Ray generation actor "
                    f"{slot.index}: {_short(err)}"))
                return future
            slot.outstanding += 1
            now = time.monotonic()
            deadline = now + self.request_timeout_s if self.request_timeout_s else math.inf
            key = next(self._ids)
            entry = _Pending(future, ref, slot.index, slot.incarnation, seq, request.request_id,
                             now, deadline,
                             f"Ray generation actor {slot.index} ({_node_label(slot.info)})")
            self._pending[key] = entry
            self.routed.append((request.request_id, slot.index))
        ref.future().add_done_callback(lambda rf, key=key: self._done.put((key, rf)))
        future.add_done_callback(lambda f, ref=ref: self._cancel_remote(f, ref))
        return future

    @staticmethod
    def _cancel_remote(future: concurrent.futures.Future, ref: Any) -> None:
        if future.cancelled():  # the caller gave up (e.g. the agent loop's generation timeout)
            try:
                _ray().cancel(ref)
            except Exception:
                pass

    def _resolve_loop(self) -> None:
        while True:
            try:
                item = self._done.get(timeout=0.5)
            except queue.Empty:
                item = None
            if item == "stop":
                return
            if item is not None:
                key, ref_future = item
                self._finish(key, ref_future)
            if self.request_timeout_s:
                now = time.monotonic()
                with self._lock:
                    late = [k for k, e in self._pending.items() if e.deadline <= now]
                for k in late:
                    self._finish(k, None)

    def _finish(self, key: int, ref_future: concurrent.futures.Future | None) -> None:
        ray = _ray()
        with self._lock:
            entry = self._pending.pop(key, None)
            if entry is None:
                return  # already resolved (a timeout, then the late reply)
            slot = self._slots[entry.slot]
            same = slot.incarnation == entry.incarnation
            if same:
                slot.outstanding -= 1
        where = entry.where
        died = None
        if ref_future is None:
            completion = Completion.failed(f"no reply from {where} to request "
                                           f"{entry.request_id!r} within "
                                           f"{self.request_timeout_s:g} s")
            try:
                ray.cancel(entry.ref)
            except Exception:
                pass
        else:
            try:
                result = ref_future.result()
            except ray.exceptions.TaskCancelledError:
                completion = Completion.failed(f"request {entry.request_id!r} was cancelled")
            except ray.exceptions.RayActorError as err:
                died = _short(err)
                completion = Completion.failed(
                    f"{where} died while serving request {entry.request_id!r} "
                    f"({'the backend was closed' if self._closed else 'it is being replaced'}): "
                    f"{died}")
            except Exception as err:
                completion = Completion.failed(f"{where} failed request {entry.request_id!r}: "
                                               f"{_short(err)}")
            else:
                completion = (result if isinstance(result, Completion) else Completion.failed(
                    f"{where} returned a {type(result).__name__}, not a Completion"))
        completion = dataclasses.replace(completion, seconds=time.monotonic() - entry.start)
        if died is not None and same:
            self._actor_died(entry.slot, entry.incarnation, died)
        if not entry.future.done():
            try:
                entry.future.set_result(completion)
            except concurrent.futures.InvalidStateError:
                pass  # cancelled by the caller meanwhile

    def _actor_died(self, index: int, incarnation: int, reason: str) -> None:
        with self._lock:
            slot = self._slots[index]
            if self._closed or slot.incarnation != incarnation or slot.state != "ready":
                return
            slot.state = "starting"
            slot.last_error = reason
        threading.Thread(target=self._replace, args=(index, incarnation), daemon=True,
                         name=f"envsched-ray-replace-{index}").start()

    def _replace(self, index: int, incarnation: int) -> None:
        """Build a new actor for slot ``index`` (with the latest weights)."""
        ray = _ray()
        slot = self._slots[index]
        try:
            ray.kill(slot.handle, no_restart=True)
        except Exception:
            pass
        while True:
            with self._lock:
                if self._closed:
                    return
                if slot.replacements >= self.max_replacements:
                    slot.state = "dead"
                    slot.last_error = (f"dead after {slot.replacements} replacement(s); last "
                                       f"error: {slot.last_error}")
                    return
                slot.replacements += 1
            with self._weights_lock:
                mode, weights = self._weights if self._weights else (None, None)
                handle = self._actor_cls.remote(self.factory, mode, weights)
                try:
                    info = ray.get(handle.info.remote(), timeout=self.start_timeout_s)
                except Exception as err:
                    try:
                        ray.kill(handle, no_restart=True)
                    except Exception:
                        pass
                    with self._lock:
                        slot.last_error = f"replacement failed: {_short(err)}"
                    continue
            with self._lock:
                if self._closed:
                    ray.kill(handle, no_restart=True)
                    return
                slot.handle, slot.info, slot.state = handle, info, "ready"
                slot.incarnation = incarnation + 1
                slot.outstanding = 0
                slot.next_seq = 0
                self.num_replaced += 1
                return

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, params_dir: str, *, weight_sync: WeightSync | None = None) -> float:
        """Every actor serves ``params_dir`` from now on; returns the slowest actor's seconds.

        Raises:
          ValueError: ``object_store`` shipping and ``params_dir`` is not a readable folder.
          BackendError: closed, or an actor's backend could not load the weights (the error
            names the actor and its node; the other actors did load them).
        """
        ray = _ray()
        mode = weight_sync or self.weight_sync
        if mode not in ("shared_fs", "object_store"):
            raise ValueError(f"weight_sync must be 'shared_fs' or 'object_store', got {mode!r}")
        if self._closed:
            raise BackendError("update_weights on a closed RayGenerationBackend")
        payload: Any = (ray.put(_read_weights(params_dir)) if mode == "object_store"
                        else os.path.abspath(params_dir))
        with self._weights_lock:
            self._weights = (mode, payload)
            calls = []
            with self._lock:
                for slot in self._slots:
                    if slot.state != "ready":
                        continue  # a replacement being built gets these weights (this lock)
                    pending = [e.seq for e in self._pending.values()
                               if e.slot == slot.index and e.incarnation == slot.incarnation]
                    ref = slot.handle.update_weights.remote(mode, payload, slot.next_seq - 1,
                                                            pending)
                    calls.append((slot, slot.incarnation, ref))
            seconds, errors, died = [], [], []
            deadline = time.monotonic() + self.update_timeout_s
            for slot, incarnation, ref in calls:
                where = f"Ray generation actor {slot.index} ({_node_label(slot.info)})"
                try:
                    left = max(0.0, deadline - time.monotonic())
                    seconds.append(float(ray.get(ref, timeout=left)))
                except ray.exceptions.GetTimeoutError:
                    errors.append(f"{where}: no answer within {self.update_timeout_s:g} s")
                except ray.exceptions.RayActorError as err:
                    died.append((slot.index, incarnation, _short(err)))
                except Exception as err:
                    errors.append(f"{where}: {_short(err)}")
        for index, incarnation, reason in died:  # replaced with the new weights
            self._actor_died(index, incarnation, reason)
        self.last_update_seconds = seconds
        if errors or not seconds:
            raise BackendError(f"update_weights({params_dir!r}) failed on "
                               f"{len(errors) + len(died)} of {len(calls)} actor(s): "
                               + "; ".join(errors + [f"actor {i} died: {r}" for i, _, r in died]))
        return max(seconds)

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every actor's local backend (servers stopped), kill the actors, resolve every
        pending future."""
        ray = _ray()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = [s.handle for s in self._slots if s.handle is not None and s.state == "ready"]
        refs = []
        for handle in handles:
            try:
                refs.append(handle.shutdown.remote())
            except Exception:
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=60.0)
        for slot in self._slots:
            try:
                ray.kill(slot.handle, no_restart=True)
            except Exception:
                pass
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    break
            time.sleep(0.02)
        with self._lock:
            leftover, self._pending = list(self._pending.values()), {}
        for entry in leftover:
            if not entry.future.done():
                try:
                    entry.future.set_result(Completion.failed(
                        f"RayGenerationBackend closed before request {entry.request_id!r} "
                        "finished"))
                except concurrent.futures.InvalidStateError:
                    pass
        self._done.put("stop")
        self._resolver.join(timeout=5.0)

    def __enter__(self) -> RayGenerationBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- sandboxes ----------------------------------------------------------------------------------

def _local_sandbox_backend(kind: str, limits: SandboxLimits, trust: str,
                           site_packages: tuple[str, ...], docker_cpus: float):
    if kind == "inprocess":
        from envsched_jax.envs.sandbox.inprocess import InProcessBackend

        return InProcessBackend(limits, trust)
    if kind == "bwrap":
        from envsched_jax.envs.sandbox.bwrap import BwrapBackend

        return BwrapBackend(limits, site_packages)
    if kind == "docker":
        from envsched_jax.envs.sandbox.docker_backend import DockerBackend

        return DockerBackend(limits, site_packages, docker_cpus)
    raise ValueError(f"unknown sandbox kind {kind!r}")


def _probe_sandbox(kind: str) -> tuple[dict[str, Any], str | None]:
    from envsched_jax.envs.sandbox import unavailable_reason

    return _actor_info(), unavailable_reason(kind)


class _SandboxActor:
    """Runs on a Ray node: one local sandbox worker of ``kind``, requests relayed to it."""

    def __init__(self, kind: str, limits: SandboxLimits, trust: str,
                 site_packages: tuple[str, ...], docker_cpus: float):
        start = time.perf_counter()
        self.backend = _local_sandbox_backend(kind, limits, trust, site_packages, docker_cpus)
        self.worker = self.backend.start_worker()
        self.info_ = {**_actor_info(), "kind": kind,
                      "startup_seconds": time.perf_counter() - start}

    def hello(self) -> dict[str, Any]:
        return self.info_

    def request(self, message: dict[str, Any], timeout: float, envs: list[Any]) -> tuple:
        try:
            for env in envs:
                self.backend.admit(env)
            return ("ok", self.worker.request(message, timeout))
        except SandboxError as err:
            return ("sandbox_error", err.kind, err.message, err.retire)
        except Exception as err:
            return ("error", err)

    def close(self) -> None:
        try:
            self.worker.close()
        finally:
            self.backend.close()


class RaySandboxWorker:
    """The driver's handle of one sandbox actor (a ``Worker``)."""

    def __init__(self, backend: RaySandboxBackend, handle: Any, info: dict[str, Any]):
        self.backend = backend
        self.actor = handle
        self.info = info
        self.startup_seconds = float(info.get("startup_seconds", 0.0))
        self.closed = False
        self._sent_envs: set[str] = set()

    @property
    def where(self) -> str:
        return f"Ray sandbox actor ({self.backend.kind}) on {_node_label(self.info)}"

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        ray = _ray()
        if self.closed:
            raise SandboxError("crashed", f"{self.where} was closed", retire=True)
        envs = []
        if message.get("op") in ("reset", "run") and self.backend.kind == "inprocess":
            env_id = (message.get("spec") or {}).get("env_id")
            env = self.backend._admitted.get(env_id)
            if env is not None and env_id not in self._sent_envs:
                envs.append(env)
        wait = timeout + self.backend.grace_s if math.isfinite(timeout) else None
        try:
            ref = self.actor.request.remote(message, timeout, envs)
            reply = ray.get(ref, timeout=wait)
        except ray.exceptions.GetTimeoutError:
            self._kill()
            raise SandboxError("wall_clock", f"no reply from the {self.where} within "
                               f"{timeout:g} s + {self.backend.grace_s:g} s grace (a hung or "
                               "unreachable node); the actor was killed", retire=True) from None
        except ray.exceptions.RayActorError as err:
            self._kill()
            raise SandboxError("crashed", f"the {self.where} died: {_short(err)}",
                               retire=True) from None
        except Exception as err:
            self._kill()
            raise SandboxError("protocol", f"relaying to the {self.where} failed: "
                               f"{_short(err)}", retire=True) from None
        for env in envs:
            self._sent_envs.add(env.env_id)
        tag = reply[0] if isinstance(reply, tuple) and reply else None
        if tag == "ok":
            return reply[1]
        if tag == "sandbox_error":
            _, kind, text, retire = reply
            raise SandboxError(kind, text, retire=retire)
        if tag == "error":
            raise reply[1]
        raise SandboxError("protocol", f"the {self.where} sent {reply!r}", retire=True)

    def _kill(self) -> None:
        self.closed = True
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:
            pass
        self.backend._forget(self)

    def close(self) -> None:
        """Close the jail (container, process group) on its node, then end the actor."""
        if self.closed:
            return
        try:
            _ray().get(self.actor.close.remote(), timeout=self.backend.close_timeout_s)
        except Exception:
            pass  # dead or hung: killing the actor is all that is left
        self._kill()


class RaySandboxBackend:
    """Sandbox workers as Ray actors (see the module docstring).

    Args:
      kind: the sandbox each actor runs (``bwrap``, ``docker``, ``inprocess``).
      limits: per-worker limits, enforced on the worker's node; ``wall_seconds`` also bounds
        the driver's wait (plus ``grace_s``).
      trust: in-process admission (``trusted_class`` or ``any``), as ``InProcessBackend``.
      site_packages: as :class:`envsched_jax.envs.sandbox.SandboxConfig`.
      docker_cpus: as :class:`envsched_jax.envs.sandbox.SandboxConfig`.
      num_cpus: CPUs each actor asks Ray for.
      resources: custom Ray resources each actor asks for (``{"sandbox": 1}`` keeps them on
        nodes that declared that resource).
      actor_options: further ``ray.remote`` options (``scheduling_strategy``, ``runtime_env``).
      grace_s: how much longer than a request's allowance the driver waits before it declares
        the node hung (the local jail already waits 5 s past the allowance itself).
      start_timeout_s: how long ``start_worker`` waits for an actor to be placed and started.
      close_timeout_s: how long closing waits for the actor to close its jail.
      check: run a probe task (same resources) at construction and raise
        :class:`SandboxUnavailable` when the kind cannot run on the node it lands on.
      address: the Ray cluster (default: ``RAY_ADDRESS``, else a new local cluster).
    """

    def __init__(self, kind: str = "bwrap", limits: SandboxLimits | None = None, *,
                 trust: str = "trusted_class", site_packages: tuple[str, ...] | None = None,
                 docker_cpus: float = 2.0, num_cpus: float = 1.0,
                 resources: Mapping[str, float] | None = None,
                 actor_options: Mapping[str, Any] | None = None, grace_s: float = 10.0,
                 start_timeout_s: float = 120.0, close_timeout_s: float = 10.0,
                 check: bool = True, address: str | None = None):
        from envsched_jax.envs.sandbox import SANDBOX_KINDS
        from envsched_jax.envs.sandbox.host import DEFAULT_SITE_PACKAGES
        from envsched_jax.envs.sandbox.inprocess import InProcessBackend

        if kind not in SANDBOX_KINDS:
            raise ValueError(f"RaySandboxBackend kind must be one of {SANDBOX_KINDS}, got {kind!r}")
        if not grace_s > 0 or not start_timeout_s > 0:
            raise ValueError(f"grace_s and start_timeout_s must be > 0, got {grace_s!r}, "
                             f"{start_timeout_s!r}")
        if num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus!r}")
        ray = _ray()
        ensure_ray(address)
        self.kind = kind
        self.name = f"ray-{kind}"
        self.limits = limits or SandboxLimits()
        self.trust = trust
        self.site_packages = tuple(site_packages if site_packages is not None
                                   else DEFAULT_SITE_PACKAGES)
        self.docker_cpus = docker_cpus
        self.grace_s = float(grace_s)
        self.start_timeout_s = float(start_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        # admission is the wrapped kind's, decided here on the driver
        self._admission = InProcessBackend(self.limits, trust) if kind == "inprocess" else None
        self._admitted: dict[str, Any] = {}
        options = dict(actor_options or {})
        options.update(num_cpus=num_cpus, max_restarts=0, max_concurrency=1)
        if resources:
            options["resources"] = dict(resources)
        self._options = options
        self._actor_cls = ray.remote(_SandboxActor).options(**options)
        self._lock = threading.Lock()
        self._workers: list[RaySandboxWorker] = []
        if check:
            probe_options = {k: v for k, v in options.items() if k in (
                "num_cpus", "resources", "scheduling_strategy", "runtime_env")}
            probe = ray.remote(_probe_sandbox).options(**probe_options)
            try:
                info, reason = ray.get(probe.remote(kind), timeout=self.start_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise SandboxUnavailable(
                    f"no Ray node could run a task with "
                    f"{RayGenerationBackend._resources_text(options)} "
                    f"within {self.start_timeout_s:g} s (sandbox kind {kind!r})") from None
            if reason:
                raise SandboxUnavailable(f"{kind} sandbox unavailable on Ray {_node_label(info)}: "
                                         f"{reason}")

    def admit(self, env: Any) -> None:
        """The wrapped kind's admission (in-process: trusted classes only unless
        ``trust='any'``; jails: everything)."""
        if self._admission is not None:
            self._admission.admit(env)  # raises UntrustedEnvironment as in-process does
            with self._lock:
                self._admitted[env.env_id] = env

    def start_worker(self) -> RaySandboxWorker:
        """Place one actor and start its local worker (blocks until it answers)."""
        ray = _ray()
        handle = self._actor_cls.remote(self.kind, self.limits, self.trust, self.site_packages,
                                        self.docker_cpus)
        try:
            info = ray.get(handle.hello.remote(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(handle, no_restart=True)
            raise SandboxError("setup", f"no Ray sandbox actor ({self.kind}) was placed and "
                               f"started within {self.start_timeout_s:g} s (does the cluster "
                               f"have {RayGenerationBackend._resources_text(self._options)} "
                               "free?)", retire=True) from None
        except Exception as err:
            ray.kill(handle, no_restart=True)
            raise SandboxError("setup", f"the Ray sandbox actor ({self.kind}) could not start "
                               f"its worker: {_short(err)}", retire=True) from None
        worker = RaySandboxWorker(self, handle, info)
        with self._lock:
            self._workers.append(worker)
        return worker

    def _forget(self, worker: RaySandboxWorker) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)

    def close(self) -> None:
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.close()


def make_ray_worker_pool(config, **ray_options) -> Any:
    """A :class:`~envsched_jax.envs.sandbox.base.WorkerPool` of ``config.num_workers`` Ray
    sandbox actors running ``config.kind`` with ``config``'s limits and trust; ``ray_options``
    go to :class:`RaySandboxBackend` (``num_cpus``, ``resources``, ``grace_s``, ...)."""
    from envsched_jax.envs.sandbox.base import WorkerPool

    backend = RaySandboxBackend(config.kind, config.limits, trust=config.trust,
                                site_packages=config.site_packages,
                                docker_cpus=config.docker_cpus, **ray_options)
    return WorkerPool(backend, config.num_workers)


__all__ = ["RayGenerationBackend", "RaySandboxBackend", "RaySandboxWorker", "build_backend",
           "check_factory", "ensure_ray", "episode_key", "make_ray_worker_pool"]
