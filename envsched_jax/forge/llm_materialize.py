"""Materialisation by an LLM: appendix C's prompts, gold verification, and a bounded repair loop.

:class:`LLMMaterializer` implements :class:`~envsched_jax.forge.materialize.Materializer` through
any :class:`~envsched_jax.graph.llm_clients.ChatClient` (a vLLM or OpenAI-compatible server, the
in-process JAX sampler, a scripted client in tests). One request runs at most ``budget`` calls
(default 3: one generation and two repairs):

1. the first call sends :func:`~envsched_jax.forge.prompts.request_messages`: the shared contract,
   then the recipe's prompt (appendix C.1 for the fixed recipes, C.2 for ``forge``);
2. the reply is parsed (:func:`~envsched_jax.forge.prompts.parse_bundle_reply`); a reply that is
   not the bundle JSON fails as ``parse``, one whose files are no Harbor bundle as ``schema``;
3. a parsed bundle that declares no requirements while its seed does fails as ``sync`` before
   verification: without the declaration the synchronization check of gold verification would be
   skipped, and added or removed requirements would go unchecked;
4. otherwise ``verify`` (passed in, so acceptance is never the materialiser's own decision) runs
   the gold checks; the first failed check names the failure;
5. a failure is answered by :func:`~envsched_jax.forge.prompts.repair_messages` (same policy, the
   reason and log tails quoted, the complete bundle asked for again) until a bundle is accepted
   or the calls are spent. An ``infrastructure`` failure (the engine failed, not the bundle) is not
   the model's to repair: the request ends there, named, and the caller may retry it.

A failed client call (``ChatReply.error``) is recorded as ``generation`` and counts against the
budget; the next call re-sends the same messages, since there is no reply to repair, and keeps
the failed call's kind (``generate`` or ``repair``). Every call is one :class:`Attempt` with the
tokens the client reported; ``materialized`` is true only for a bundle that went to ``verify``.
Nothing a model writes makes :meth:`LLMMaterializer.materialize` raise; a request whose prompt
cannot be rendered (a decision without the fields C.2 needs, an action the recipe does not allow,
a seed that has no Harbor form) is returned as a ``generation`` failure with no call made.

CHOICE, sampling: the paper gives temperature 1.0 / top-p 0.9 for the RL rollouts only (appendix
D), where spread over trajectories is the point. Synthesis wants one well-formed, reproducible
bundle per request; its variety comes from the seeds and the selected actions. The project's chat
clients decode greedily (temperature 0, ``json_object`` where the server can enforce it), and
each call passes ``seed = attempt_seed * 1000 + call`` so that a sampling client would draw a
fresh stream per call. A repair is not a replay even when greedy: its messages differ.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

from envsched_jax.forge.bundle import BundleError, TaskBundle
from envsched_jax.forge.materialize import (Attempt, MaterializeRequest, MaterializeResult, Verify,
                                            attempt_from_verification)
from envsched_jax.forge.prompts import (BundleReplyError, Failure, Messages, PromptConfig, PromptError,
                                        parse_bundle_reply, repair_messages, request_messages)
from envsched_jax.forge.verify import declared_requirements
from envsched_jax.graph.llm_clients import ChatClient


def undeclared_requirements(bundle: TaskBundle, seed: TaskBundle) -> str:
    """Why ``bundle`` must declare its requirements ("" when it does, or when ``seed`` declares none).

    A malformed declaration is left to gold verification's ``sync`` check, which names it."""
    try:
        if declared_requirements(seed) is None or declared_requirements(bundle) is not None:
            return ""
    except BundleError:
        return ""
    return ("the seed declares its requirements ([metadata.forge] requirements) but the new bundle declares "
            "none: list them in the reply's \"requirements\" field so that added and removed requirements "
            "can be checked")


@dataclasses.dataclass(frozen=True)
class LLMMaterializer:
    """The paper's materialiser (module docstring).

    Attributes:
      client: the chat model.
      budget: calls per request: the first generation and ``budget - 1`` repairs (default 3, one
        generation and two repairs); a failed client call counts.
      max_tokens: completion tokens per call. A family bundle is 5-30 KB of text, about 1.5k-8k
        tokens; 8192 is the paper's maximum response length (appendix D).
      prompts: the prompt and reply-parser settings.
      name: the materialiser's name in reports.
    """

    client: ChatClient = dataclasses.field(compare=False)
    budget: int = 3
    max_tokens: int = 8192
    prompts: PromptConfig = PromptConfig()
    name: str = "llm"

    def __post_init__(self):
        if not isinstance(self.client, ChatClient):
            raise TypeError(f"LLMMaterializer.client must be a ChatClient (model, constrains_json, complete), "
                            f"got {type(self.client).__name__}")
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"LLMMaterializer.budget must be an int >= 1, got {self.budget!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"LLMMaterializer.max_tokens must be an int >= 1, got {self.max_tokens!r}")

    def materialize(self, request: MaterializeRequest, verify: Verify) -> MaterializeResult:
        def result(bundle=None, verification=None, note=""):
            return MaterializeResult(request.name, request.seed.name, str(request.decision.get("action") or ""),
                                     request.recipe, bundle, verification, tuple(attempts), note)

        attempts: list[Attempt] = []
        try:
            first = request_messages(request.seed, request.decision, request.recipe,
                                     pass_rate_source=request.pass_rate_source, rollouts=request.rollouts,
                                     config=self.prompts)
        except PromptError as err:
            attempts.append(Attempt("generate", False, "generation", f"no prompt: {err}"))
            return result(note="the request could not be rendered as a prompt")
        messages, verification = first, None
        for call in range(self.budget):
            kind: Literal["generate", "repair"] = "generate" if messages is first else "repair"
            start = time.perf_counter()
            reply = self.client.complete(messages, json_object=True, max_tokens=self.max_tokens,
                                         seed=request.attempt_seed * 1000 + call)
            tokens = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
            if reply.error is not None:
                attempts.append(Attempt(kind, False, "generation", f"{self.client.model}: {reply.error}",
                                        seconds=time.perf_counter() - start, **tokens))
                continue
            failure, bundle = self._read(reply.text, reply.finish_reason, request)
            if failure is not None:
                attempts.append(Attempt(kind, False, failure.kind, failure.reason,  # type: ignore[arg-type]
                                        seconds=time.perf_counter() - start, **tokens))
            else:
                verification = verify(bundle)
                attempt = attempt_from_verification(kind, verification, seconds=time.perf_counter() - start, **tokens)
                attempts.append(attempt)
                if verification.accepted:
                    return result(bundle, verification)
                if attempt.failed == "infrastructure":
                    break
                failure = Failure(str(attempt.failed), attempt.reason, dict(verification.logs))
            messages = self._repair(first, reply.text, request, failure)
        return result(None, verification)

    def _read(self, text: str, finish_reason: str,
              request: MaterializeRequest) -> tuple[Failure | None, TaskBundle | None]:
        """The parsed bundle, or the failure that stops it before verification."""
        try:
            bundle = parse_bundle_reply(text, request.name, self.prompts.limits)
        except BundleReplyError as err:
            reason = str(err)
            if finish_reason == "length":
                reason += (f" (the reply was cut at max_tokens = {self.max_tokens}: make the bundle smaller, "
                           "e.g. shorter fixtures)")
            return Failure(err.kind, reason), None
        missing = undeclared_requirements(bundle, request.seed)
        return (Failure("sync", missing), None) if missing else (None, bundle)

    def _repair(self, first: Messages, previous: str, request: MaterializeRequest, failure: Failure) -> Messages:
        return repair_messages(first, previous, request.seed, request.decision, request.recipe, failure, self.prompts)
