"""The in-process JAX sampler backend: the top-k / top-p kernel against a NumPy reference and its
sampling frequencies, greedy parity with ``models.generate`` for concurrent multi-turn episodes
arriving while others decode, raw log-probs against the trainer's, seeded reproducibility
whatever the batch, stop tokens and limits, engine failure and close, weight updates (safetensors
folder and in-memory trainer state), the compilation bound, jax_enable_x64 and bfloat16, and
the prefix cache (multi-turn conversations served as by a cold prefill, evictions, prefixes
shared between conversations, invalidation by weight updates, its compilation bound)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from envsched_jax.learner import export, models, trainer, weights
from envsched_jax.rollout.backends import backend_class
from envsched_jax.rollout.backends.base import (GenerationBackend, GenerationRequest,
                                                RequestError, SamplingParams, generate)
from envsched_jax.rollout.backends.jax_sampler import (JaxSamplerBackend, filter_logits,
                                                       sample_tokens)

# tunix 0.1.7 uses flax APIs deprecated in 0.12: one warning per parameter access.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:tunix"),
              pytest.mark.filterwarnings("ignore:'sharding' is deprecated:DeprecationWarning")]

# One slot geometry for most tests, so that their backends share compiled programs.
GEOMETRY = {"max_batch": 4, "max_context": 64, "prefill_buckets": (16, 32), "decode_steps": 4}
NEW_TOKENS = 8
TIMEOUT = 120


def greedy(max_new_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(greedy=True, max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen3"])
def policy(request):
    return models.load_policy(request.param)


@pytest.fixture(scope="module")
def llama():
    return models.load_policy("tiny_llama")


@pytest.fixture
def backend_of():
    """``backend_of(policy, **overrides)``: a backend closed after the test."""
    made = []

    def make(policy, **overrides):
        backend = JaxSamplerBackend(policy, **{**GEOMETRY, **overrides})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def reference_greedy(policy, prompts, max_new_tokens=NEW_TOKENS, stop=None):
    """``models.generate``'s greedy continuation of each prompt (left-padded into one batch of a
    fixed shape, so one compilation serves every test), through the first stop token."""
    stop = tuple(policy.eos_token_ids if stop is None else stop)
    graphdef, own_params, _ = nnx.split(policy.model, nnx.Param, ...)
    key = (policy.family, repr(policy.config), max_new_tokens, stop)
    if key not in _generate_fns:
        _generate_fns[key] = models.make_generate_fn(graphdef, max_new_tokens=max_new_tokens,
                                                     eos_token_ids=stop,
                                                     pad_token_id=policy.pad_token_id)
    fn = _generate_fns[key]
    rows, width = 32, 64
    assert len(prompts) <= rows and max(map(len, prompts)) <= width
    tokens = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), np.int32)
    for i in range(rows):
        prompt = prompts[i] if i < len(prompts) else (3,)
        tokens[i, width - len(prompt):] = prompt
        mask[i, width - len(prompt):] = 1
    out = fn(own_params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0), 0.0)
    return [np.asarray(out.tokens[i])[np.asarray(out.mask[i])].tolist()
            for i in range(len(prompts))]


_generate_fns: dict = {}


def random_prompt(rng, length, vocab=256):
    return tuple(int(t) for t in rng.integers(3, vocab, length))


# -- the sampling kernel -------------------------------------------------------------------------


def reference_keep(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Which tokens top-k then top-p keep, from the definitions (float64 masses)."""
    z = logits.astype(np.float32) * (np.float32(1) / np.float32(temperature))
    greater = z[None, :] > z[:, None]           # [i, j]: z_j > z_i
    keep_k = np.ones(len(z), bool) if top_k == 0 else greater.sum(axis=1) < top_k
    weights_ = np.where(keep_k, np.exp(z.astype(np.float64) - z.max()), 0.0)
    probs = weights_ / weights_.sum()
    mass_greater = (greater * probs[None, :]).sum(axis=1)
    return keep_k & (mass_greater < top_p)


def test_filter_logits_matches_numpy_reference():
    """Random rows, half with heavy ties, every kind of k (0, 1, mid, >= V) and p (incl. 1)."""
    rng = np.random.default_rng(0)
    rows, vocab = 400, 40
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 2
    ties = rng.integers(-3, 3, (rows // 2, vocab)).astype(np.float32) * 0.75
    logits[: rows // 2] = ties
    temperature = rng.uniform(0.3, 2.0, rows).astype(np.float32)
    top_k = rng.choice([0, 1, 2, 5, 17, vocab, vocab + 9], rows).astype(np.int32)
    top_p = np.where(rng.random(rows) < 0.2, 1.0, rng.uniform(0.05, 1.0, rows)).astype(np.float32)
    out = np.asarray(jax.jit(filter_logits)(logits, temperature, top_k, top_p))
    kept = np.isfinite(out)
    expected = np.stack([reference_keep(logits[i], temperature[i], top_k[i], top_p[i])
                         for i in range(rows)])
    np.testing.assert_array_equal(kept, expected)
    scaled = logits * (np.float32(1) / temperature)[:, None]
    np.testing.assert_array_equal(out[kept], scaled[kept])
    assert kept[np.arange(rows), logits.argmax(axis=1)].all()
    # the cases are not degenerate: ties cut at the edge, and rows keep 1..V tokens
    assert {1, vocab} <= set(kept.sum(axis=1)) and len(set(kept.sum(axis=1))) > 10


def test_sample_tokens_frequencies_follow_the_filtered_softmax():
    logits = np.array([2.0, 1.5, 1.5, 0.3, 0.0, -0.5, -1.0, -3.0], np.float32)
    temperature, top_k, top_p = 0.8, 5, 0.9
    keep = reference_keep(logits, temperature, top_k, top_p)
    assert 2 <= keep.sum() < 5  # top-p cuts below top-k
    z = logits.astype(np.float64) / temperature
    expected = np.where(keep, np.exp(z - z.max()), 0.0)
    expected /= expected.sum()
    num = 40_000
    keys = jax.random.split(jax.random.key(3), num)
    tokens, logprobs = jax.jit(sample_tokens)(
        jnp.broadcast_to(logits, (num, 8)), keys, jnp.full(num, temperature),
        jnp.full(num, top_k, jnp.int32), jnp.full(num, top_p), jnp.zeros(num, bool))
    counts = np.bincount(np.asarray(tokens), minlength=8)
    assert counts[~keep].sum() == 0
    assert stats.chisquare(counts[keep], num * expected[keep]).pvalue > 1e-3
    # the test can fail: the unfiltered tempered softmax is rejected
    unfiltered = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert stats.chisquare(counts, num * unfiltered).pvalue < 1e-6
    raw = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose(np.asarray(logprobs), raw[np.asarray(tokens)], atol=1e-6)


def test_sample_tokens_greedy_and_top_k_one_take_the_argmax():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((64, 30)).astype(np.float32)
    keys = jax.random.split(jax.random.key(0), 64)
    ones = jnp.ones(64)
    by_greedy, _ = sample_tokens(logits, keys, ones, jnp.zeros(64, jnp.int32), ones,
                                 jnp.ones(64, bool))
    by_top1, _ = sample_tokens(logits, keys, ones * 3.0, jnp.ones(64, jnp.int32), ones,
                               jnp.zeros(64, bool))
    np.testing.assert_array_equal(np.asarray(by_greedy), logits.argmax(axis=1))
    np.testing.assert_array_equal(np.asarray(by_top1), logits.argmax(axis=1))


# -- greedy parity, concurrency, log-probs -------------------------------------------------------


def test_is_a_registered_generation_backend(llama, backend_of):
    backend = backend_of(llama)
    assert isinstance(backend, GenerationBackend)
    assert backend_class("jax") is JaxSamplerBackend
    assert backend.name == "jax" and backend.max_context == GEOMETRY["max_context"]


def test_concurrent_multi_turn_greedy_matches_models_generate(policy, backend_of):
    """Episodes in threads (3 turns each: the next prompt is the last one, the completion and a
    new observation) join while a long request decodes; every turn equals models.generate."""
    backend = backend_of(policy)
    rng = np.random.default_rng(2)
    stop = policy.eos_token_ids
    long_prompt = random_prompt(rng, 20)
    long_future = backend.submit(GenerationRequest(long_prompt, greedy(40), stop,
                                                   request_id="long"))
    deadline = time.monotonic() + TIMEOUT
    while (backend.stats().get("decode_calls", 0) < 1 and not long_future.done()
           and time.monotonic() < deadline):
        time.sleep(0.01)
    assert not long_future.done(), "the long request ended before the others arrived"

    starts = [random_prompt(rng, n) for n in (1, 5, 9, 14, 3, 11)]
    observations = [[random_prompt(rng, 4) for _ in range(3)] for _ in starts]
    transcript: dict[int, list] = {}

    def episode(i):
        prompt = starts[i]
        turns = []
        for turn in range(3):
            time.sleep(0.005 * ((i + turn) % 3))
            completion = backend.submit(GenerationRequest(
                prompt, greedy(), stop, request_id=f"e{i}/t{turn}")).result(TIMEOUT)
            turns.append((prompt, completion))
            prompt = prompt + completion.token_ids + observations[i][turn]
        transcript[i] = turns

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(len(starts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    long = long_future.result(TIMEOUT)

    pairs = [pair for i in sorted(transcript) for pair in transcript[i]]
    assert len(pairs) == 3 * len(starts)
    assert all(c.finish_reason in ("stop", "length") and c.error is None for _, c in pairs)
    expected = reference_greedy(policy, [p for p, _ in pairs])
    assert [list(c.token_ids) for _, c in pairs] == expected
    assert list(long.token_ids) == reference_greedy(policy, [long_prompt], 40)[0]
    assert all(len(c.logprobs) == len(c.token_ids) for _, c in pairs)
    counters = backend.stats()
    assert counters["slot_steps"] > counters["decode_steps"]  # slots really decoded together
    assert counters["requests"] == len(pairs) + 1


def test_raw_logprobs_match_the_trainer(policy, backend_of):
    """Sampled with temperature, top-k and top-p, each token's log-prob is the unfiltered
    temperature-1 one the learner recomputes on the whole sequence."""
    backend = backend_of(policy)
    rng = np.random.default_rng(3)
    prompts = [random_prompt(rng, n) for n in (4, 13, 21, 30)]
    sampling = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=12)
    completions = generate(backend, [GenerationRequest(p, sampling, seed=i)
                                     for i, p in enumerate(prompts)], timeout=TIMEOUT)
    graphdef, params, _ = nnx.split(policy.model, nnx.Param, ...)
    logprob_fn = trainer.make_logprob_fn(graphdef, models.forward, trainer.TrainerConfig())
    width = 64
    tokens = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros_like(tokens)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        assert completion.finish_reason == "length" and len(completion.token_ids) == 12
        sequence = prompt + completion.token_ids
        tokens[i, :len(sequence)] = sequence
        mask[i, :len(sequence)] = 1
    expected = np.asarray(logprob_fn(params, jnp.asarray(tokens), jnp.asarray(mask)))
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        span = slice(len(prompt), len(prompt) + len(completion.token_ids))
        np.testing.assert_allclose(completion.logprobs, expected[i, span], atol=1e-5)


def test_seeded_sampling_is_reproducible_whatever_the_batch(llama, backend_of):
    backend = backend_of(llama)
    rng = np.random.default_rng(4)
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16)
    probe = GenerationRequest(random_prompt(rng, 10), sampling, seed=7)
    alone = backend.submit(probe).result(TIMEOUT)
    others = [backend.submit(GenerationRequest(random_prompt(rng, n), sampling, seed=n))
              for n in (3, 17, 25)]
    crowded = backend.submit(probe).result(TIMEOUT)  # lands in another slot, among others
    for future in others:
        future.result(TIMEOUT)
    assert crowded.token_ids == alone.token_ids
    np.testing.assert_allclose(crowded.logprobs, alone.logprobs, atol=1e-6)
    reseeded = backend.submit(GenerationRequest(probe.prompt_ids, sampling, seed=8)).result(TIMEOUT)
    assert reseeded.token_ids != alone.token_ids
    top1 = SamplingParams(temperature=1.5, top_k=1, top_p=1.0, max_new_tokens=NEW_TOKENS)
    by_top1 = backend.submit(GenerationRequest(probe.prompt_ids, top1, seed=9)).result(TIMEOUT)
    assert list(by_top1.token_ids) == reference_greedy(llama, [probe.prompt_ids], stop=())[0]


def tiny_vocab_policy(vocab: int = 8):
    """A tiny Llama over 8 tokens with large weights, so that its next-token distribution is far
    from uniform."""
    hf_config = models.tiny_llama(vocab_size=vocab)
    checkpoint = weights.Checkpoint(hf_config, models.random_tensors(hf_config, 5, init_std=0.3),
                                    None)
    return models.policy_from_checkpoint(checkpoint)


def test_engine_sampling_frequencies_follow_the_filtered_softmax(backend_of):
    policy = tiny_vocab_policy()
    backend = backend_of(policy, max_context=16, prefill_buckets=(16,))
    prompt = (1, 4, 6, 3)
    logits = np.asarray(models.forward(policy.model, jnp.asarray([prompt], jnp.int32),
                                       jnp.ones((1, 4), jnp.int32))[0, -1])
    temperature, top_k, top_p = 1.5, 5, 0.85
    keep = reference_keep(logits, temperature, top_k, top_p)
    assert 3 <= keep.sum() <= 4, keep
    z = logits.astype(np.float64) / temperature
    expected = np.where(keep, np.exp(z - z.max()), 0.0)
    expected /= expected.sum()
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                              max_new_tokens=1)
    num = 600
    completions = generate(backend, [GenerationRequest(prompt, sampling, seed=s)
                                     for s in range(num)], timeout=TIMEOUT)
    tokens = np.array([c.token_ids[0] for c in completions])
    counts = np.bincount(tokens, minlength=8)
    assert counts[~keep].sum() == 0
    assert stats.chisquare(counts[keep], num * expected[keep]).pvalue > 1e-3
    raw = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose([c.logprobs[0] for c in completions], raw[tokens], atol=1e-5)


# -- stop tokens, limits, errors -----------------------------------------------------------------


def test_stop_tokens_and_finish_reasons(llama, backend_of):
    backend = backend_of(llama)
    prompt = random_prompt(np.random.default_rng(5), 12)
    free = reference_greedy(llama, [prompt], 20, stop=())[0]
    stop_at = next(i for i in range(2, 20) if free[i] not in free[:i])
    stopped = backend.submit(GenerationRequest(prompt, greedy(20), (free[stop_at], 255)))
    limited = backend.submit(GenerationRequest(prompt, greedy(5)))
    first = backend.submit(GenerationRequest(prompt, greedy(20), (free[0],)))
    one = backend.submit(GenerationRequest(prompt, greedy(1)))
    stopped, limited, first, one = (f.result(TIMEOUT) for f in (stopped, limited, first, one))
    assert (list(stopped.token_ids), stopped.finish_reason) == (free[:stop_at + 1], "stop")
    assert (list(limited.token_ids), limited.finish_reason) == (free[:5], "length")
    assert (list(first.token_ids), first.finish_reason) == (free[:1], "stop")
    assert (list(one.token_ids), one.finish_reason) == (free[:1], "length")
    assert stopped.seconds > 0


def test_context_limit(llama, backend_of):
    backend = backend_of(llama)
    limit = GEOMETRY["max_context"]
    rng = np.random.default_rng(6)
    near = random_prompt(rng, limit - 4)
    last = random_prompt(rng, limit - 1)
    full = random_prompt(rng, limit)
    out_near, out_last, out_full = generate(
        backend, [GenerationRequest(p, greedy(50)) for p in (near, last, full)], timeout=TIMEOUT)
    expected = reference_greedy(llama, [near], 50, stop=())[0]
    assert (list(out_near.token_ids), out_near.finish_reason) == (expected[:4], "length")
    assert len(out_last.token_ids) == 1 and out_last.finish_reason == "length"
    assert out_full.finish_reason == "error" and "max_context=64" in out_full.error


def test_invalid_requests_fail_with_clear_errors(llama, backend_of):
    backend = backend_of(llama)
    out_of_vocab = backend.submit(GenerationRequest((5, 300))).result(TIMEOUT)
    assert out_of_vocab.finish_reason == "error" and "vocabulary of 256" in out_of_vocab.error
    many_stops = backend.submit(GenerationRequest((5,), stop_token_ids=tuple(range(9))))
    assert "max_stop_tokens=8" in many_stops.result(TIMEOUT).error
    with pytest.raises(RequestError, match="GenerationRequest"):
        backend.submit((5, 6))
    with pytest.raises(ValueError, match="prefill_buckets"):
        JaxSamplerBackend(llama, max_context=64, prefill_buckets=(16, 128))


def test_engine_failure_resolves_every_future_and_later_submits_fail_fast(llama, backend_of):
    backend = backend_of(llama)
    started = threading.Event()

    def broken_decode(*args, **kwargs):
        started.set()
        time.sleep(0.05)  # let the queue fill behind the failing call
        raise RuntimeError("device lost")

    backend._decode_fn = broken_decode
    rng = np.random.default_rng(7)
    futures = [backend.submit(GenerationRequest(random_prompt(rng, 5), greedy(30)))
               for _ in range(GEOMETRY["max_batch"] + 3)]
    done, not_done = concurrent.futures.wait(futures, timeout=TIMEOUT)
    assert not not_done and started.is_set()
    for future in futures:
        completion = future.result()
        assert completion.finish_reason == "error"
        assert "RuntimeError: device lost" in completion.error
    later = backend.submit(GenerationRequest((5, 6)))
    assert later.done() and "failed earlier: RuntimeError: device lost" in later.result().error
    backend.close()
    assert not backend._thread.is_alive()


def test_close_resolves_queued_requests_and_stops_the_thread(llama):
    backend = JaxSamplerBackend(llama, **GEOMETRY)
    rng = np.random.default_rng(8)
    futures = [backend.submit(GenerationRequest(random_prompt(rng, 6), greedy(40)))
               for _ in range(10)]
    backend.close()
    assert not backend._thread.is_alive()
    assert all(f.done() for f in futures)
    reasons = {f.result().finish_reason for f in futures}
    assert "error" in reasons and reasons <= {"error", "length", "stop"}
    assert "closed" in backend.submit(GenerationRequest((5,))).result(0).error
    backend.close()  # idempotent


# -- weights -------------------------------------------------------------------------------------


def test_weight_updates_from_the_trainer_and_from_a_folder(llama, backend_of, tmp_path):
    """A request in flight when the weights change finishes on the old ones, later requests run
    on the new: first the trainer's in-memory parameters (whose buffers its donating step then
    frees: the sampler keeps its own copy), then a safetensors export."""
    backend = backend_of(llama)
    rng = np.random.default_rng(9)
    prompts = [random_prompt(rng, n) for n in (6, 19)]
    other = models.load_policy("tiny_llama", seed=1)
    expected_llama = reference_greedy(llama, prompts)
    expected_other = reference_greedy(other, prompts)
    assert expected_other != expected_llama

    # hold the engine inside its first decode call while the update is staged
    entered, release = threading.Event(), threading.Event()
    real_decode = backend._decode_fn

    def gated_decode(*args, **kwargs):
        entered.set()
        release.wait(TIMEOUT)
        return real_decode(*args, **kwargs)

    backend._decode_fn = gated_decode
    before = backend.submit(GenerationRequest(prompts[0], greedy(30)))
    assert entered.wait(TIMEOUT)
    config = trainer.TrainerConfig()
    graphdef, state, optimizer = trainer.init_state(other.model, config)
    seconds = backend.set_params(state.params)
    assert seconds > 0 and not before.done()
    after = [backend.submit(GenerationRequest(p, greedy())) for p in prompts]
    release.set()
    backend._decode_fn = real_decode
    assert list(before.result(TIMEOUT).token_ids) == reference_greedy(llama, prompts[:1], 30)[0]
    assert [list(f.result(TIMEOUT).token_ids) for f in after] == expected_other
    assert backend.weights_version == 1

    step = trainer.make_train_step(graphdef, models.forward, config, optimizer)
    batch = trainer.sft_batch(np.full((2, 8), 5), np.ones((2, 8)), np.ones((2, 8)))
    state, _ = step(state, batch)  # donates (frees) the parameters handed to the sampler
    again = generate(backend, [GenerationRequest(p, greedy()) for p in prompts], timeout=TIMEOUT)
    assert [list(c.token_ids) for c in again] == expected_other

    export.export_policy(llama, tmp_path / "llama")
    seconds = backend.update_weights(str(tmp_path / "llama"), wait=True)
    assert seconds > 0 and backend.weights_version == 2
    back = generate(backend, [GenerationRequest(p, greedy()) for p in prompts], timeout=TIMEOUT)
    assert [list(c.token_ids) for c in back] == expected_llama

    with pytest.raises(ValueError, match="parameter tree differs"):
        backend.set_params({"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="different model"):
        export.export_policy(models.load_policy("tiny_qwen3"), tmp_path / "qwen")
        backend.update_weights(str(tmp_path / "qwen"))


# -- compilation, dtypes -------------------------------------------------------------------------


def test_compilations_are_bounded_by_the_buckets(llama, backend_of):
    """Many prompt lengths and sampling settings compile one prefill per bucket used and one
    decode per window used, and nothing more on a second pass; then conversations of many
    lengths (suffixes of 1 to 16 tokens on 4 to 27 cached ones) extend with at most one program
    per (suffix bucket, window) pair. (A geometry no other test uses, so the first pass compiles
    for real.)"""
    buckets = (8, 16)
    backend = backend_of(llama, max_batch=3, max_context=32, prefill_buckets=buckets,
                         prefix_min_match=4)
    before = backend.num_compilations()
    rng = np.random.default_rng(10)

    def random_sampling():
        return SamplingParams(temperature=float(rng.uniform(0.5, 1.5)),
                              top_k=int(rng.integers(0, 50)), top_p=float(rng.uniform(0.5, 1.0)),
                              max_new_tokens=int(rng.integers(1, 12)),
                              greedy=bool(rng.random() < 0.3))

    def serve():
        requests = [GenerationRequest(
            random_prompt(rng, n), random_sampling(),
            stop_token_ids=tuple(int(t) for t in rng.integers(3, 256, rng.integers(0, 4))),
            seed=int(rng.integers(0, 2**40)))
            for n in range(1, 31, 2)]
        outs = generate(backend, requests, timeout=TIMEOUT)
        assert all(o.finish_reason in ("stop", "length") for o in outs)

    serve()
    first = backend.num_compilations()
    assert first["prefill"] - before["prefill"] == len(buckets) + 1  # 8, 16 and 32
    assert 1 <= first["decode"] - before["decode"] <= len(buckets) + 1
    serve()
    assert backend.num_compilations() == first
    assert backend.stats().get("prefix_hits", 0) == 0  # random prompts share no prefix

    def converse_randomly():
        prompts = [random_prompt(rng, int(n)) for n in rng.integers(4, 9, 3)]
        hits = backend.stats().get("prefix_hits", 0)
        while prompts:
            requests = [GenerationRequest(p, greedy(int(rng.integers(1, 5)))) for p in prompts]
            outs = generate(backend, requests, timeout=TIMEOUT)
            prompts = [p + o.token_ids + random_prompt(rng, int(rng.integers(1, 13)))
                       for p, o in zip(prompts, outs)]
            prompts = [p for p in prompts if len(p) < 28]
        assert backend.stats()["prefix_hits"] - hits >= 3

    for _ in range(4):
        converse_randomly()
    compiled = {name: count - before[name]
                for name, count in backend.num_compilations().items()}
    # suffix bucket 8 with a window of 16 or 32, 16 with 32 (with >= 4 tokens reused, a suffix
    # of 16 or more cannot fit a window)
    assert 2 <= compiled["extend"] <= 3
    assert compiled["prefill"] == len(buckets) + 1
    assert compiled["decode"] <= len(buckets) + 1


def test_runs_under_jax_enable_x64(llama):
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        backend = JaxSamplerBackend(llama, max_batch=2, max_context=32, prefill_buckets=(16,))
        try:
            prompt = random_prompt(np.random.default_rng(11), 7)
            outs = generate(backend, [GenerationRequest(prompt, greedy()),
                                      GenerationRequest(prompt, SamplingParams(max_new_tokens=5),
                                                        seed=2**40 + 3)], timeout=TIMEOUT)
        finally:
            backend.close()
    finally:
        jax.config.update("jax_enable_x64", previous)
    assert outs[0].error is None and list(outs[0].token_ids) == reference_greedy(llama, [prompt])[0]
    assert outs[1].error is None and len(outs[1].token_ids) == 5


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3"])
def test_bfloat16_serves(name, backend_of):
    policy = models.load_policy(name, dtype=jnp.bfloat16)
    backend = backend_of(policy, dtype=jnp.bfloat16, max_context=32, prefill_buckets=(16,))
    leaves = jax.tree.leaves(backend._params)
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    rng = np.random.default_rng(12)
    outs = generate(backend, [GenerationRequest(random_prompt(rng, n), SamplingParams(
        max_new_tokens=6), seed=n) for n in (3, 20)], timeout=TIMEOUT)
    assert all(o.finish_reason == "length" and len(o.token_ids) == 6 for o in outs)
    assert all(np.isfinite(o.logprobs).all() and max(o.logprobs) <= 0 for o in outs)


# -- the prefix cache ----------------------------------------------------------------------------


def converse(backend, starts, turns, rng, sampling_of, between=None):
    """Conversations in lockstep rounds: round r submits every conversation's turn r together (in
    reverse order on odd rounds), each prompt the previous prompt, its completion and a new
    4-token observation, as the agent loop sends them. ``between(r)`` runs after round r.
    Returns [(prompt, completion)] round-major."""
    observations = [[random_prompt(rng, 4) for _ in starts] for _ in range(turns)]
    prompts = list(starts)
    pairs = []
    for r in range(turns):
        order = list(range(len(prompts)))[::(-1 if r % 2 else 1)]
        requests = [GenerationRequest(prompts[i], sampling_of(i), seed=100 * r + i,
                                      request_id=f"c{i}/t{r}") for i in order]
        outs = dict(zip(order, generate(backend, requests, timeout=TIMEOUT)))
        assert all(c.error is None for c in outs.values()), outs
        pairs += [(prompts[i], outs[i]) for i in range(len(prompts))]
        prompts = [p + outs[i].token_ids + observations[r][i] for i, p in enumerate(prompts)]
        if between is not None:
            between(r)
    return pairs


def assert_same_completions(cached_pairs, cold_pairs):
    assert [p for p, _ in cached_pairs] == [p for p, _ in cold_pairs]
    for (_, hot), (_, cold) in zip(cached_pairs, cold_pairs):
        assert hot.token_ids == cold.token_ids and hot.finish_reason == cold.finish_reason
        np.testing.assert_allclose(hot.logprobs, cold.logprobs, atol=1e-5)


def test_prefix_cache_serves_multi_turn_conversations_as_a_cold_prefill(policy, backend_of):
    """Five conversations over four slots (parked entries evicted), four turns each, greedy and
    seeded sampling; between rounds a short request decodes alone in a small window while the
    conversations' longer caches sit parked (they must come through untouched), and the last
    turn's padded suffix would overrun max_context (fewer cached tokens are reused). Every token
    equals a cache-less backend's, log-probs within 1e-5; hits are recorded and the tokens not
    prefilled are exactly the ones reused."""
    sampled = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS)

    def sampling_of(i):
        return greedy() if i % 2 == 0 else sampled

    def serve(backend):
        rng = np.random.default_rng(13)
        starts = [random_prompt(rng, 18) for _ in range(5)]
        shorts = []

        def between(r):
            shorts.append(backend.submit(GenerationRequest((5, 6, 7), greedy())).result(TIMEOUT))

        return converse(backend, starts, 4, rng, sampling_of, between), shorts

    cached = backend_of(policy)
    cold = backend_of(policy, prefix_cache=False)
    cached_pairs, cached_shorts = serve(cached)
    cold_pairs, cold_shorts = serve(cold)
    assert_same_completions(cached_pairs, cold_pairs)
    assert [c.token_ids for c in cached_shorts] == [c.token_ids for c in cold_shorts]
    assert max(len(p) + len(c.token_ids) for p, c in cold_pairs) == 62  # near max_context 64
    hot, plain = cached.stats(), cold.stats()
    assert "prefix_hits" not in plain and plain["prefills"] == plain["requests"]
    # (how many hit depends on how admissions interleave with the finishing requests)
    assert hot["prefix_hits"] >= 1 and hot["prefix_evictions"] >= 1
    assert hot["prefix_hits"] + hot["prefills"] == hot["requests"] == plain["requests"]
    assert hot["prefill_tokens"] + hot["prefix_tokens_reused"] == plain["prefill_tokens"]
    assert hot["prefill_tokens"] < plain["prefill_tokens"]


def test_prefix_cache_shares_a_common_prefix_between_conversations(llama, backend_of):
    """A conversation that shares only a system prompt with a parked one copies that prefix into
    its own slot (the parked entry survives: the first conversation's next turn still hits in
    place), and a group of identical prompts submitted together (a GRPO group) forks from the
    first one while it runs; each completion equals a cache-less backend's."""
    sampled = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_new_tokens=NEW_TOKENS)

    def serve(backend):
        rng = np.random.default_rng(14)
        system = random_prompt(rng, 24)
        a1 = system + random_prompt(rng, 4)
        b1 = system + random_prompt(rng, 5)
        outs = [backend.submit(GenerationRequest(a1, sampled, seed=1)).result(TIMEOUT)]
        outs.append(backend.submit(GenerationRequest(b1, sampled, seed=2)).result(TIMEOUT))
        a2 = a1 + outs[0].token_ids + random_prompt(rng, 3)
        outs.append(backend.submit(GenerationRequest(a2, sampled, seed=3)).result(TIMEOUT))
        group = system + random_prompt(rng, 6)
        outs += generate(backend, [GenerationRequest(group, sampled, seed=10 + g)
                                   for g in range(3)], timeout=TIMEOUT)
        return outs

    cached = backend_of(llama)
    cold = backend_of(llama, prefix_cache=False)
    hot_outs, cold_outs = serve(cached), serve(cold)
    for hot, plain in zip(hot_outs, cold_outs):
        assert hot.token_ids == plain.token_ids
        np.testing.assert_allclose(hot.logprobs, plain.logprobs, atol=1e-5)
    assert len({c.token_ids for c in hot_outs[3:]}) > 1  # the group's seeds differ
    counters = cached.stats()
    # b1 forks from a1; a2 extends a1's slot in place; the group's first forks from a parked
    # slot, the other two from it while it runs
    assert counters["prefix_hits"] == 5 and counters["prefix_forks"] == 4
    assert counters["prefills"] == 1


def test_weight_updates_invalidate_the_prefix_cache(llama, backend_of):
    """Cached keys and values belong to the weights that computed them: after a swap the next
    turn prefills cold on the new weights, and the turn after it hits again."""
    backend = backend_of(llama)
    other = models.load_policy("tiny_llama", seed=1)
    rng = np.random.default_rng(15)
    prompt = random_prompt(rng, 20)
    first = backend.submit(GenerationRequest(prompt, greedy())).result(TIMEOUT)
    _, other_params, _ = nnx.split(other.model, nnx.Param, ...)
    backend.set_params(other_params, wait=True)
    follow = prompt + first.token_ids + random_prompt(rng, 4)
    second = backend.submit(GenerationRequest(follow, greedy())).result(TIMEOUT)
    counters = backend.stats()
    assert counters.get("prefix_hits", 0) == 0 and counters["prefix_invalidations"] == 1
    third_prompt = follow + second.token_ids + random_prompt(rng, 4)
    third = backend.submit(GenerationRequest(third_prompt, greedy())).result(TIMEOUT)
    assert backend.stats()["prefix_hits"] == 1
    assert [list(second.token_ids), list(third.token_ids)] == reference_greedy(
        other, [follow, third_prompt])


# -- SmolLM2 -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_chat_greedy_matches_models_generate():
    from envsched_jax.learner import tokenizer as tokenizer_lib

    policy = models.load_policy("smollm2")
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Name a colour."}]]
    prompts = [tuple(tokenizer_lib.chat_token_ids(policy.tokenizer, chat)) for chat in chats]
    with JaxSamplerBackend(policy, max_batch=2, max_context=64, prefill_buckets=(48,),
                           decode_steps=8) as backend:
        outs = generate(backend, [GenerationRequest(p, greedy(16), policy.eos_token_ids)
                                  for p in prompts], timeout=600)
    expected = reference_greedy(policy, prompts, 16)
    assert [list(o.token_ids) for o in outs] == expected
    assert "Paris" in policy.tokenizer.decode(outs[0].token_ids)
