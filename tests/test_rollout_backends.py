"""Conformance of the generation backends (the in-process JAX sampler, transformers, scripted;
the vLLM client has its own real-server tests): every future resolves, the stop token ends and is
kept, the length limit gives ``length``, an impossible request gives a named error, and the
model backends agree with each other and with the learner's log-probs on the same weights."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from envsched_jax.learner import models
from envsched_jax.learner.trainer import Trainer, TrainerConfig
from envsched_jax.rollout.backends import (BACKENDS, GenerationRequest, RequestError,
                                           SamplingParams, backend_class, generate)

torch = pytest.importorskip("torch", reason="the transformers backend needs torch (CPU build); "
                            "`make install` installs it")

GREEDY = SamplingParams(greedy=True, max_new_tokens=12)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from envsched_jax.learner.export import export_policy

    policy = models.load_policy("tiny_llama", seed=3)
    folder = tmp_path_factory.mktemp("tiny")
    export_policy(policy, folder)
    return policy, folder


@pytest.fixture(scope="module", params=["jax", "transformers"])
def backend(request, policy_dir):
    policy, folder = policy_dir
    if request.param == "jax":
        made = backend_class("jax")(policy, max_batch=4, max_context=64)
    else:
        made = backend_class("transformers")(str(folder), max_batch=4, max_context=64,
                                             pad_token_id=policy.pad_token_id)
    yield made
    made.close()


def prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(3, 256, size=int(rng.integers(3, 20))))
            for _ in range(n)]


def test_registry_names_every_backend():
    assert set(BACKENDS) == {"jax", "openai", "transformers", "scripted", "ray"}


def test_greedy_completions_agree_across_backends_and_with_the_learner(backend, policy_dir):
    policy, _ = policy_dir
    requests = [GenerationRequest(p, GREEDY, request_id=f"r{k}") for k, p in enumerate(prompts(6))]
    got = generate(backend, requests, timeout=120)
    ours = [models.generate(policy.model, np.asarray([r.prompt_ids], np.int32),
                            np.ones((1, len(r.prompt_ids)), np.int32), jax.random.key(0),
                            max_new_tokens=12, pad_token_id=policy.pad_token_id)
            for r in requests]
    trainer = Trainer(policy.model, models.forward, TrainerConfig())
    for request, completion, reference in zip(requests, got, ours):
        assert completion.finish_reason == "length" and len(completion.token_ids) == 12
        assert list(completion.token_ids) == [int(t) for t in np.asarray(reference.tokens)[0][:12]]
        full = np.asarray([list(request.prompt_ids) + list(completion.token_ids)], np.int32)
        logp = np.asarray(trainer.logprobs(full, np.ones_like(full)))[0, len(request.prompt_ids):]
        np.testing.assert_allclose(completion.logprobs, logp, atol=2e-5)


def test_stop_tokens_end_and_are_kept(backend):
    prompt = prompts(1, seed=5)[0]
    free = generate(backend, [GenerationRequest(prompt, GREEDY)], timeout=120)[0]
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    done = generate(backend, [GenerationRequest(prompt, GREEDY, stop_token_ids=(stop,))],
                    timeout=120)[0]
    assert done.finish_reason == "stop" and done.token_ids == free.token_ids[:first + 1]


def test_context_overflow_is_a_named_error_and_bad_requests_are_refused(backend):
    done = generate(backend, [GenerationRequest(tuple(range(3, 70)), GREEDY)], timeout=60)[0]
    assert done.finish_reason == "error" and "64" in done.error
    with pytest.raises(RequestError, match="empty prompt"):
        GenerationRequest(())
    with pytest.raises(RequestError, match="non-negative ints"):
        GenerationRequest((1, -2))
