"""Chat clients for LLM operation extraction (appendix E): one call, messages in, text out.

Extraction needs a chat reply, not token ids, so it has its own small interface
(:class:`ChatClient`) with three implementations:

- :class:`OpenAIChatClient`: any OpenAI-compatible server (vLLM, a hosted API) through
  ``POST /v1/chat/completions``, with ``response_format={"type": "json_object"}`` as the paper's
  API call has it (appendix E.2) when ``json_object`` is asked for;
- :class:`BackendChatClient`: any :class:`~envsched_jax.rollout.backends.base.GenerationBackend`
  (the in-process JAX sampler, the token-level vLLM client) with the model's tokenizer and chat
  template. A token-level backend cannot constrain its output to JSON: the reply is validated
  and repaired like any other (``constrains_json`` is False, and the report says so);
- :class:`ScriptedChatClient`: a function of the messages, for tests.

CHOICE: the paper gives no sampling settings for extraction; every client decodes greedily
(temperature 0), so that a pool's extraction is reproducible and a cache entry is what the model
would answer again.

A client never raises for a failed call: it returns a :class:`ChatReply` whose ``error`` names the
cause (connection refused, HTTP status and the server's message, malformed reply, timeout), so
the extractor can record it and fall back.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

Messages = Sequence[Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """One chat completion.

    Attributes:
      text: the assistant's message ("" when the call failed).
      prompt_tokens / completion_tokens: as the server or tokenizer counted them (0 if unknown).
      seconds: wall-clock time of the call.
      finish_reason: ``stop``, ``length`` (cut by ``max_tokens``) or ``error``.
      error: what went wrong, for ``finish_reason == "error"``.
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"
    error: str | None = None


@runtime_checkable
class ChatClient(Protocol):
    """What the extractor needs. ``model`` names the model for the cache key and the report;
    ``constrains_json`` says whether ``json_object=True`` is enforced by the server."""

    model: str
    constrains_json: bool

    def complete(self, messages: Messages, *, json_object: bool, max_tokens: int,
                 seed: int) -> ChatReply:
        ...


class OpenAIChatClient:
    """``POST {base_url}/v1/chat/completions`` on an OpenAI-compatible server.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
      model: the served model name.
      api_key: sent as a bearer token when given.
      timeout_s: per call.
    """

    constrains_json = True

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 600.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIChatClient.base_url must start with http:// or https://, "
                             f"got {base_url!r}")
        if not timeout_s > 0:
            raise ValueError(f"OpenAIChatClient.timeout_s must be positive, got {timeout_s!r}")
        base = base_url.rstrip("/")
        self.url = (base[:-3] if base.endswith("/v1") else base) + "/v1/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout_s = float(timeout_s)

    def complete(self, messages: Messages, *, json_object: bool, max_tokens: int,
                 seed: int) -> ChatReply:
        body = {"model": self.model, "messages": [dict(m) for m in messages],
                "max_tokens": int(max_tokens), "temperature": 0.0, "seed": int(seed)}
        if json_object:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers=headers)
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as err:
            try:
                detail = err.read().decode(errors="replace")[:500]
            except OSError:
                detail = ""
            return _failed(f"HTTP {err.code} {err.reason} from {self.url}: {detail}", t0)
        except (OSError, urllib.error.URLError) as err:
            return _failed(f"{type(err).__name__} calling {self.url}: {err}", t0)
        try:
            payload = json.loads(raw)
            choice = payload["choices"][0]
            text = choice["message"]["content"] or ""
            usage = payload.get("usage") or {}
            reason = "length" if choice.get("finish_reason") == "length" else "stop"
            return ChatReply(text, int(usage.get("prompt_tokens") or 0),
                             int(usage.get("completion_tokens") or 0),
                             time.perf_counter() - t0, reason)
        except (ValueError, KeyError, IndexError, TypeError) as err:
            return _failed(f"malformed reply from {self.url} ({type(err).__name__}: {err}): "
                           f"{raw[:300]!r}", t0)


class BackendChatClient:
    """A chat client over a token-level generation backend.

    Renders ``messages`` with the tokenizer's chat template (generation prompt added), sends the
    token ids, decodes the sampled ids (special tokens skipped). The end-of-turn token of the
    template (``eos_token_id``) stops generation.
    """

    constrains_json = False

    def __init__(self, backend, tokenizer, model: str, *, timeout_s: float | None = None):
        self.backend = backend
        self.tokenizer = tokenizer
        self.model = model
        self.timeout_s = timeout_s

    def complete(self, messages: Messages, *, json_object: bool, max_tokens: int,
                 seed: int) -> ChatReply:
        from envsched_jax.rollout.backends.base import (GenerationRequest, RequestError,
                                                        SamplingParams, generate)

        t0 = time.perf_counter()
        text = self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                  add_generation_prompt=True)
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        eos = self.tokenizer.eos_token_id
        stop = (int(eos),) if eos is not None else ()
        try:
            request = GenerationRequest(ids, SamplingParams(max_new_tokens=int(max_tokens),
                                                            greedy=True),
                                        stop_token_ids=stop, seed=int(seed))
        except RequestError as err:
            return _failed(str(err), t0)
        (completion,) = generate(self.backend, [request], timeout=self.timeout_s)
        if completion.finish_reason == "error":
            return _failed(f"{self.backend.name} backend: {completion.error}", t0,
                           prompt_tokens=len(ids))
        reply = self.tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
        return ChatReply(reply, len(ids), len(completion.token_ids), time.perf_counter() - t0,
                         completion.finish_reason)


class ScriptedChatClient:
    """Replies from ``respond(messages) -> str`` (or an exception instance, a failed call).
    Token counts are characters / 4, a rough stand-in; every call is kept in ``calls``."""

    def __init__(self, respond: Callable[[Messages], "str | BaseException"], *,
                 model: str = "scripted", constrains_json: bool = False):
        self.respond = respond
        self.model = model
        self.constrains_json = constrains_json
        self.calls: list[list[dict[str, str]]] = []

    def complete(self, messages: Messages, *, json_object: bool, max_tokens: int,
                 seed: int) -> ChatReply:
        t0 = time.perf_counter()
        self.calls.append([dict(m) for m in messages])
        answer = self.respond(messages)
        if isinstance(answer, BaseException):
            return _failed(f"{type(answer).__name__}: {answer}", t0)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return ChatReply(answer, prompt_chars // 4, len(answer) // 4, time.perf_counter() - t0)


def _failed(message: str, t0: float, *, prompt_tokens: int = 0) -> ChatReply:
    return ChatReply("", prompt_tokens, 0, time.perf_counter() - t0, "error", message)
