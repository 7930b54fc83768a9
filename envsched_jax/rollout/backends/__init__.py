"""Generation backends behind one interface (:mod:`.base`), chosen by name.

| name | what | module |
| --- | --- | --- |
| ``jax`` | the in-process JAX sampler: batched, KV cache, continuous over episodes | :mod:`.jax_sampler` |
| ``openai`` | an OpenAI-compatible HTTP client (vLLM servers; :mod:`..vllm_server` starts one) | :mod:`.openai_client` |
| ``transformers`` | transformers ``generate`` with static batching (the benchmark's baseline) | :mod:`.transformers_backend` |
| ``scripted`` | assistant messages from a function (tests, demos) | :mod:`.scripted` |
| ``ray`` | Ray actors on a cluster, each hosting one of the above; sticky per episode | :mod:`..distributed` |

Modules are imported on first use, so choosing one backend never imports another's
dependencies.
"""

from __future__ import annotations

import importlib

from envsched_jax.rollout.backends.base import (BackendError, Completion, GenerationBackend,
                                                GenerationRequest, RequestError, SamplingParams,
                                                generate)

BACKENDS = {
    "jax": ("envsched_jax.rollout.backends.jax_sampler", "JaxSamplerBackend"),
    "openai": ("envsched_jax.rollout.backends.openai_client", "OpenAIBackend"),
    "transformers": ("envsched_jax.rollout.backends.transformers_backend", "TransformersBackend"),
    "scripted": ("envsched_jax.rollout.backends.scripted", "ScriptedBackend"),
    "ray": ("envsched_jax.rollout.distributed", "RayGenerationBackend"),
}


def backend_class(name: str) -> type:
    """The class registered under ``name``."""
    try:
        module, attr = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown generation backend {name!r}; choose from "
                         f"{', '.join(sorted(BACKENDS))}") from None
    return getattr(importlib.import_module(module), attr)


__all__ = ["BACKENDS", "BackendError", "Completion", "GenerationBackend", "GenerationRequest",
           "RequestError", "SamplingParams", "backend_class", "generate"]
