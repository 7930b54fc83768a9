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


def reference_responder(pool, tool_format: str = "json_list", *, calls_per_turn: int = 1,
                        preamble: str = "") -> Respond:
    """A ``respond`` function that plays each task's reference actions: ``calls_per_turn`` tool
    calls per assistant message, in the given format, and a plain answer (the reference's own
    ``chat_with_user`` message where it has one) when the user turn's actions are done. It reads
    the task and the turn from the request id the agent loop writes (``task#k/turnN``). Used to
    make SFT warm-start data and to test the agent loop; tasks without reference actions get
    an immediate answer."""
    import json

    from envsched_jax.envs.episode import with_turn_ends
    from envsched_jax.envs.runtime.core import CHAT_WITH_USER

    plans: dict[str, list[str]] = {}

    def render(calls) -> str:
        payload = [{"name": a.name, "arguments": dict(a.arguments)} for a in calls]
        if tool_format == "json_list":
            return f"{preamble}<tool_call>{json.dumps(payload)}</tool_call>"
        if tool_format == "hermes":
            return preamble + "".join(f"<tool_call>\n{json.dumps(p)}\n</tool_call>" for p in payload)
        if tool_format == "llama3_json":
            return "; ".join(json.dumps({"name": p["name"], "parameters": p["arguments"]})
                             for p in payload)
        raise ValueError(f"unknown tool-call format {tool_format!r}")

    def plan(task) -> list[str]:
        messages: list[str] = []
        pending: list = []
        for action in with_turn_ends(task, task.reference_actions or ()):
            if action.name == CHAT_WITH_USER:
                messages.extend(render(pending[i:i + calls_per_turn])
                                for i in range(0, len(pending), calls_per_turn))
                pending = []
                messages.append(str(action.arguments.get("message") or "Done."))
            else:
                pending.append(action)
        messages.extend(render(pending[i:i + calls_per_turn])
                        for i in range(0, len(pending), calls_per_turn))
        if not messages or messages[-1].startswith((preamble + "<tool_call>", "{")):
            messages.append("Done.")
        return messages

    def respond(prompt: str, request: GenerationRequest) -> str:
        task_id, _, rest = request.request_id.partition("#")
        turn = int(rest.rsplit("/turn", 1)[1])
        if task_id not in plans:
            plans[task_id] = plan(pool.tasks[pool.task_index(task_id)])
        messages = plans[task_id]
        return messages[turn] if turn < len(messages) else "Done."

    return respond
