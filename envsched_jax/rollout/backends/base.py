"""The generation-backend interface: token ids in, sampled token ids and log-probs out.

Every backend (the in-process JAX sampler, an OpenAI-compatible client for vLLM servers,
transformers ``generate`` as a benchmark baseline, a scripted backend for tests, the Ray backend)
implements :class:`GenerationBackend`. The agent loop never sends text: it renders the chat
template itself and sends the prompt as token ids, and keeps the sampled token ids exactly as the
backend returns them (no re-tokenisation), so the learner trains on the very tokens that were
sampled and their per-token masks are exact.

Log-probs. ``Completion.logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
policy's *raw* next-token distribution (temperature 1, before top-k / top-p filtering): that is
what the learner recomputes (``trainer.make_logprob_fn``), so the importance ratio
pi_theta / pi_old compares like with like (vLLM's ``logprobs_mode="raw_logprobs"``, its default).
CHOICE: the paper samples at temperature 0.99 with top-p / top-k but is silent on which
distribution the ratio's denominator comes from; the raw one is what verl and tunix use too.

Concurrency. :meth:`GenerationBackend.submit` returns a ``concurrent.futures.Future`` at once, so
many episodes (one thread each in the agent loop) can have requests in flight together; a backend
batches what is pending (continuous batching). ``generate`` is the blocking convenience.
A backend that fails a request sets the future's result to a ``Completion`` with
``finish_reason="error"`` and a message; it never leaves a future unresolved, and never raises
from ``submit`` except for a request that is invalid in itself (:class:`RequestError`). A prompt
that leaves no room under the backend's ``max_context`` is such a failure (an error completion
naming the limit), since the limit belongs to the backend, not the request.

Seeds. Requests with the same prompt, sampling and seed may give the same tokens (the JAX sampler
guarantees it): the agent loop derives a distinct seed per episode and turn. A caller building its
own requests must do the same, or a group of K rollouts samples K identical answers (zero
advantage), a known pitfall of tunix's sampler.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "error"]


class RequestError(ValueError):
    """A generation request that no backend could serve (bad ids, bad limits)."""


class BackendError(RuntimeError):
    """A backend that cannot serve at all (server dead and not restartable, model missing)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample; defaults are EnvSched section 3.1's (temperature 0.99, top-p 0.99,
    top-k 100, at most 4,096 tokens per turn).

    Attributes:
      temperature: > 0; sampling divides the logits by it (0 is not allowed: use ``greedy``).
      top_p: nucleus mass in (0, 1].
      top_k: keep the k most likely tokens; 0 keeps all.
      max_new_tokens: tokens generated at most for this request.
      greedy: take the argmax (temperature, top-p and top-k are then ignored).
    """

    temperature: float = 0.99
    top_p: float = 0.99
    top_k: int = 100
    max_new_tokens: int = 4096
    greedy: bool = False

    def __post_init__(self):
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams.temperature must be finite and > 0, got "
                             f"{self.temperature!r} (use greedy=True for argmax decoding)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must lie in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0: all tokens), got {self.top_k!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens!r}")


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One generation: continue ``prompt_ids`` until a stop token or ``sampling.max_new_tokens``.

    Attributes:
      prompt_ids: the whole context so far (chat template rendered by the caller).
      sampling: how to sample.
      stop_token_ids: generation ends after emitting one of these (it is included in the
        completion's tokens, so the learner trains on the end token too).
      seed: this request's sampling seed (backends that support seeding use it, so a rollout
        is reproducible given the same weights and batch composition where the backend allows).
      request_id: a label for logs and errors.
    """

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    request_id: str = ""

    def __post_init__(self):
        if not self.prompt_ids:
            raise RequestError(f"request {self.request_id!r}: empty prompt")
        if any((not isinstance(t, int)) or t < 0 for t in self.prompt_ids):
            raise RequestError(f"request {self.request_id!r}: prompt ids must be non-negative ints")


@dataclasses.dataclass(frozen=True)
class Completion:
    """What a backend returns for one request.

    Attributes:
      token_ids: the sampled tokens (the stop token included when one ended it).
      logprobs: one raw log-prob per sampled token (see the module docstring).
      finish_reason: ``stop`` (a stop token), ``length`` (max_new_tokens or the context limit),
        ``error`` (the backend failed this request; ``error`` says why, tokens may be partial).
      error: the failure's message, for ``finish_reason == "error"``.
      seconds: wall-clock time from submission to completion.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    error: str | None = None
    seconds: float = 0.0

    def __post_init__(self):
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Completion: {len(self.token_ids)} tokens but "
                             f"{len(self.logprobs)} log-probs")

    @classmethod
    def failed(cls, message: str, seconds: float = 0.0) -> Completion:
        return cls((), (), "error", message, seconds)


@runtime_checkable
class GenerationBackend(Protocol):
    """What the agent loop needs from a generator.

    Attributes:
      name: the backend's registry name (``jax``, ``openai``, ``transformers``, ``scripted``, ...).
      max_context: the longest prompt + completion it serves (tokens).
    """

    name: str
    max_context: int

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        """Queue ``request``; the future always resolves (to an error completion on failure)."""
        ...

    def update_weights(self, params_dir: str) -> float:
        """Serve the weights of the safetensors folder ``params_dir`` (an
        :func:`envsched_jax.learner.export.export_model` output) from now on; requests submitted
        before the call finish on the old weights. Returns the seconds it took. Raises
        ``ValueError`` for a folder that is not such an export and :class:`BackendError` when the
        backend cannot serve the new weights."""
        ...

    def close(self) -> None:
        """Stop serving and release everything (threads, processes, servers)."""
        ...


def generate(backend: GenerationBackend, requests: Sequence[GenerationRequest],
             timeout: float | None = None) -> list[Completion]:
    """Submit every request and wait for all (in order). A request not done within ``timeout``
    seconds (from the call) gives an error completion; the others are kept."""
    futures = [backend.submit(r) for r in requests]
    done, _ = concurrent.futures.wait(futures, timeout=timeout)
    return [f.result() if f in done else
            Completion.failed(f"timed out after {timeout:g} s waiting for the backend")
            for f in futures]
