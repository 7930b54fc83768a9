"""A scripted generation backend: the assistant's messages come from a function (tests, demos).

``ScriptedBackend(tokenizer, respond)`` answers each request with ``respond(prompt_text,
request)``: a string (encoded with the tokenizer, the first stop token appended), or an
exception instance (an error completion naming it). The text is cut at ``max_new_tokens``
(finish reason ``length``, no stop token), exactly as a real backend would. Log-probs are a
constant ``logprob`` per token (there is no model). Requests resolve at once, in the calling
thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from envsched_jax.rollout.backends.base import Completion, GenerationRequest

Respond = Callable[[str, GenerationRequest], "str | BaseException"]


class ScriptedBackend:
    name = "scripted"

    def __init__(self, tokenizer, respond: Respond, *, max_context: int = 1 << 20,
                 logprob: float = -1.0):
        self.tokenizer = tokenizer
        self.respond = respond
        self.max_context = max_context
        self.logprob = logprob
        self.requests: list[GenerationRequest] = []
        self.weights_dir: str | None = None
        self._lock = threading.Lock()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        with self._lock:
            self.requests.append(request)
        try:
            prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
            answer = self.respond(prompt, request)
            if isinstance(answer, BaseException):
                raise answer
            ids = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
            ids += list(request.stop_token_ids[:1])
            limit = min(request.sampling.max_new_tokens,
                        self.max_context - len(request.prompt_ids))
            reason = "stop"
            if len(ids) > limit:
                ids, reason = ids[:max(limit, 0)], "length"
            future.set_result(Completion(tuple(ids), (self.logprob,) * len(ids), reason))
        except Exception as err:
            future.set_result(Completion.failed(f"{type(err).__name__}: {err}"))
        return future

    def update_weights(self, params_dir: str) -> float:
        self.weights_dir = params_dir
        return 0.0

    def close(self) -> None:
        pass
