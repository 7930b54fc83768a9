"""The in-process JAX sampler: continuous batching over fixed KV-cache slots (backend ``jax``).

One engine thread owns the model, its parameters and a :class:`SlotState` on the device; the
agent loop's threads only queue requests (:meth:`JaxSamplerBackend.submit`) and wait on futures.

Slots. ``max_batch`` slots, each with its own KV-cache rows (``max_context`` columns per layer),
its own length (the tokens in its cache, which is also the next token's RoPE position), sampling
parameters, key and stop tokens. Each turn of the engine loop

1. admits queued requests (first in, first out) into free slots: one jitted *prefill* per request
   runs its prompt, right-padded to the smallest prefill bucket that holds it, through the model
   with a fresh bucket-sized cache, writes the keys and values into the slot's rows at columns
   0..P-1 and samples the first token; or, on a prefix-cache hit (below), one jitted *extend*
   runs only the prompt's uncached suffix;
2. runs one jitted *decode* call of ``decode_steps`` single-token steps over every slot at once
   (free and finished slots ride along, masked);
3. resolves the requests that ended (stop token, ``max_new_tokens``, context limit) and frees
   their slots at once (parking their caches).

A request that arrives while others decode therefore waits at most one decode call before its
prefill, and the others carry on after it (prefill first, as vLLM schedules by default: a burst
of long prompts pauses decoding while they prefill).

Per-row cache positions. tunix 0.1.7's attention writes a step's keys and values at
``cache["end_index"][0]``: one index for the whole batch, so its cache cannot hold rows of
different lengths. CHOICE: instead of rewriting the attention, the decode step ``jax.vmap``s
tunix's unchanged model over the slots, each row seeing a batch-of-one cache whose
``end_index[0]`` is its own length. vmap turns the per-row ``dynamic_update_slice`` into a
scatter and keeps every projection one matmul over the slots (the weights are not batched), so
the numerics, the families (Llama 3, Qwen3) and models.py's RoPE-base fix are tunix's own, and a
request's keys and values sit at columns 0..len-1 whatever else is in the batch. Costs: the
attention of every step spans the window's columns for every slot (no paging; a slot's memory
is reserved for ``max_context`` tokens whatever its length); prefixes are shared by copying, not
by reference (below); a 2-core CPU measured the vmapped step about 10% slower than tunix's
shared-index step on a 4-layer, SmolLM2-wide model at 16 slots.

Prefix cache (``prefix_cache=True``, the default). Each turn of an agent episode submits the
whole conversation so far, and the previous turn's prompt and completion are a prefix of it, so
re-prefilling it each turn would dominate the sampler's cost. As vLLM's prefix caching does for
this pattern:

- A finished request's slot keeps its cache rows and, on the host, the tokens they hold: the
  prompt and every sampled token but the last (the last one's keys and values are written only
  when it is fed to a decode step, which never happens). The slot is *parked*: free for
  admission, but a request that needs a slot takes a plain free slot first and evicts the least
  recently used parked one only when there is none.
- Admitting a request, the engine finds the slot, parked or running, whose cached tokens share
  the longest prefix with the prompt (host-side token comparison), capped at ``len(prompt) - 1``
  (the prompt's last token must run to give the first token's logits). Below
  ``prefix_min_match`` (16) tokens it prefills cold. Otherwise an *extend* runs the suffix only,
  right-padded to a prefill bucket, at positions ``start``.. over a window of the source slot's
  first W columns (W the smallest bucket >= start + suffix bucket), tunix writing the suffix's
  keys and values at columns ``start``..; the row goes to the request's slot, whose length
  becomes the prompt's, and decoding goes on as usual. Where the padded suffix would overrun
  ``max_context``, fewer cached tokens are reused (some run again).
- CHOICE, partial matches (the prompt diverges inside a slot's cached tokens, or the source is
  still running): the common prefix is reused, not thrown away. If the source is parked and its
  cached tokens are all a prefix of the prompt (the same conversation one turn on: nothing is
  lost), the extend runs in place. Otherwise the shared prefix is *copied* into the slot a cold
  prefill would have taken (a plain free slot, else the least recently used parked one: a
  partial match never evicts more than a miss would), and the source keeps its entry: agents of
  one task share the system prompt and tool catalog, and a GRPO group submits the same prompt
  several times at once; the second and later members fork from the first while it runs.
- Numerics: an extend attends over the cached keys and values with a mask (query i sees columns
  <= start + i), so a request's tokens and raw log-probs equal a cold prefill's up to float
  rounding (tested: greedy and seeded samples identical, log-probs within 1e-5, 1e-6 measured);
  the per-request seed scheme is unchanged, so seeded reproducibility holds whichever slot or
  path serves a request.
- A weight swap drops every parked entry (their keys and values belong to the old weights).
- Decode calls write back, for the slots not active when a call starts, their cache rows
  unchanged: a parked slot's cached tokens may reach past a small window, where tunix's write at
  ``end_index % window`` would land inside them.
- :meth:`JaxSamplerBackend.stats` counts ``prefix_hits``, ``prefix_forks``,
  ``prefix_tokens_reused``, ``prefill_tokens``, ``prefix_evictions`` and
  ``prefix_invalidations``.

Weak points: the match is a linear scan over the slots (well under a millisecond at 16 slots of
1,000 tokens, under the engine lock); a prefix is shared by copying rows, not by reference, so
two conversations that share a system prompt each hold it; the LRU policy thrashes under
lockstep round-robin with more conversations than slots (each turn evicts the entry needed next:
one run of the test with 5 conversations on 4 slots hit 6 of 15 times); an extend pads its
suffix to a bucket (the default smallest is 32: a 9-token suffix runs 32 tokens).

Measured once with an ad-hoc script that is not in the repository (a 2-core CPU shared with
other work, so +-30%; to be replaced by `experiments/bench_rollouts.py` figures): 16 conversations x 6 turns, one
thread each as the agent loop, 400-token first prompts growing by 32 sampled + 8 observation
tokens a turn to 600, 16 slots, ``max_context`` 1024, a 4-layer d=128 Llama with vocabulary 1024
(``models.make_model``), default buckets and sampling, after a warm-up pass: without the cache
31-40 s, 77-99 generated tokens/s, 48,000 prompt tokens prefilled; with it 6.1-10.5 s, 293-505
generated tokens/s (3.6-4.5x in back-to-back runs), 7,120 prefilled (16 first turns cold, 80
hits reusing 40,880 tokens), the same tokens in both runs (log-probs within 1e-6).

Attention window. A decode call attends over the first W cache columns only, W the smallest
bucket >= the longest active row + ``decode_steps``; the window is sliced before the call's
``lax.scan`` and written back after it, so short conversations do not read a long cache.

Compilations. Prompts are padded to ``prefill_buckets`` (the last bucket is always
``max_context``), windows come from the same buckets, and the slot count is fixed: at most one
prefill per bucket, one decode per bucket and one extend per (suffix bucket, window bucket >=
it) pair are ever compiled, whatever the mix of requests
(:meth:`JaxSamplerBackend.num_compilations`; tested).

Sampling, per slot, without recompiling: temperature, top-k (0: all tokens), top-p and greedy are
traced arrays (:func:`filter_logits`, :func:`sample_tokens`). Token i of a request is drawn with
``fold_in(fold_in(key(seed_lo), seed_hi), i)``, so a request's tokens depend on its prompt,
sampling parameters, seed and the weights, not on the other slots or on when it was admitted
(tested against the same request alone; it holds as long as XLA computes a row of a batched
matmul the same whatever the other rows hold, which it does on CPU). The log-probs returned are
the raw ones (temperature 1, unfiltered) of each sampled token, as :mod:`.base` requires.

Limits. A request's budget is ``min(max_new_tokens, max_context - len(prompt))`` tokens; reaching
it gives finish reason ``length``. A prompt of ``max_context`` tokens or more (no room for one
token), a token id outside the vocabulary or more than ``max_stop_tokens`` stop tokens give an
error completion at once (these depend on this backend, so they are not :class:`RequestError`).
Only the request's own ``stop_token_ids`` end it (not the policy's end tokens).

Weights. :meth:`~JaxSamplerBackend.set_params` takes the learner's in-memory ``nnx.Param`` state
(``TrainState.params``, same graph definition) and :meth:`~JaxSamplerBackend.update_weights` a
safetensors folder (``learner.export`` output); both copy the parameters (the trainer donates
its state to its step, which would free arrays shared with the sampler) and stage them. CHOICE:
as :mod:`.base` specifies, requests submitted before the call finish on the old weights: the
engine stops admitting requests submitted after the call, lets the slots drain, swaps, then
admits them. The call returns once the weights are staged (``wait=True``: once they serve).

Errors. An exception in the engine thread resolves every queued and running request with an
error completion naming it; later submits resolve at once with the same error. ``close()`` stops
the thread and resolves whatever is left. Every future resolves.

Memory: ``2 * num_layers * max_batch * max_context * num_kv_heads * head_dim`` cache entries
(SmolLM2-135M, 16 slots x 2,048 tokens, float32: 1.5 GB).

Measured on the 2-core CPU (shared with other work, so +-30%), 16 slots, ``decode_steps=4``,
prompts of 20-60 tokens, 128 new tokens, top-k 100 / top-p 0.99: tiny_llama ~9,500 generated
tokens/s; SmolLM2-135M float32 39 tokens/s (``models.generate``, a static batch of 16 with plain
temperature sampling, gave 51 tokens/s on the machine minutes later; the top-k / top-p kernel
takes ~20 ms of a ~330 ms step). Weight sync for SmolLM2: ``set_params`` 0.3-0.55 s (a copy),
``update_weights`` 2.8-3.8 s (reading the safetensors folder and building the model).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envsched_jax.learner import models
from envsched_jax.rollout.backends.base import (BackendError, Completion, GenerationRequest,
                                                RequestError)

# -- sampling kernels ----------------------------------------------------------------------------


def _ordered_bits(x: jax.Array) -> jax.Array:
    """uint32 keys in the order of the float32 values (IEEE bits, negatives' magnitudes flipped,
    sign bit toggled): ``x < y`` iff ``key(x) < key(y)`` for non-NaN floats."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    signed = jnp.where(bits >= 0, bits, bits ^ jnp.int32(0x7FFFFFFF))
    return jax.lax.bitcast_convert_type(signed, jnp.uint32) ^ jnp.uint32(0x80000000)


def _bisect(predicate, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Per row, the smallest uint32 ``t`` in [lo, hi] with ``predicate(t)`` true, for a predicate
    false-then-true in t and true at ``hi`` (32 halvings cover the uint32 range)."""

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        true = predicate(mid)
        return jnp.where(true, lo, mid), jnp.where(true, mid, hi)

    _, hi_final = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return jnp.where(predicate(lo), lo, hi_final)


def filter_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array) -> jax.Array:
    r"""Temperature-scaled logits with the tokens outside top-k and then top-p set to -inf.

    With ``z = logits * (1 / T)`` per row (float32):

    - top-k keeps token i iff fewer than k tokens have a larger ``z`` (ties at the k-th value are
      all kept; ``k = 0`` keeps every token);
    - top-p then keeps token i iff the probability mass (softmax of the top-k survivors) of the
      tokens with a strictly larger ``z`` is below p: the smallest most-likely set reaching mass
      p, ties at its edge included (so the result never depends on an order among equal logits);
      p = 1 keeps every top-k survivor. Masses are float32 sums.

    The most likely token always survives. No sort: both thresholds are found by bisection over
    the float order (:func:`_ordered_bits`), 2 x 32 masked reductions over the vocabulary. (A
    full sort of 16 x 49,152 logits took 175 ms a step on a 2-core CPU, the bisection 11 ms.)

    Args:
      logits: [B, V] float32.
      temperature: [B] float32, > 0.
      top_k: [B] int32, 0 (all) or >= 1 (values above V mean all).
      top_p: [B] float32 in (0, 1].

    Returns:
      [B, V] float32: ``z`` where kept, -inf elsewhere.
    """
    vocab = logits.shape[-1]
    # a multiply by the reciprocal, written out: XLA rewrites a division by a broadcast so anyway
    scaled = logits.astype(jnp.float32) * (1.0 / temperature.astype(jnp.float32))[:, None]
    order = _ordered_bits(scaled)
    lowest = jnp.min(order, axis=-1)
    highest = jnp.max(order, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab).astype(jnp.int32)
    # the k-th largest value: the smallest t with fewer than k tokens above it
    kth = _bisect(lambda t: jnp.sum(order > t[:, None], axis=-1) < k, lowest, highest)
    keep_k = order >= kth[:, None]
    probs = jax.nn.softmax(jnp.where(keep_k, scaled, -jnp.inf), axis=-1)
    # the smallest t whose strictly-greater mass is below p; every token at or above it is kept
    threshold_p = _bisect(
        lambda t: jnp.sum(jnp.where(order > t[:, None], probs, 0.0), axis=-1) < top_p,
        lowest, highest)
    # p = 1 keeps everything by definition; the float32 mass above the least likely tokens can
    # round to 1 and would cut them
    keep_p = (top_p[:, None] >= 1.0) | (order >= threshold_p[:, None])
    return jnp.where(keep_k & keep_p, scaled, -jnp.inf)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array, greedy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token per row and its raw log-probability.

    A sampled row draws one uniform ``u`` from its key and takes the first token whose
    cumulative filtered probability exceeds ``u`` (inverse CDF: one random number per row rather
    than a Gumbel variate per vocabulary entry).

    Args:
      logits: [B, V] the model's logits (any float dtype; computed in float32).
      keys: [B] typed PRNG keys, one per row.
      temperature: [B] as in :func:`filter_logits`.
      top_k: [B] as in :func:`filter_logits`.
      top_p: [B] as in :func:`filter_logits`.
      greedy: [B] bool: the argmax of ``logits`` (the other parameters ignored).

    Returns:
      (tokens [B] int32, logprobs [B] float32): ``logprobs`` is ``log_softmax(logits)`` at the
      token (temperature 1, unfiltered).
    """
    logits = logits.astype(jnp.float32)
    filtered = filter_logits(logits, jnp.where(greedy, 1.0, temperature), top_k, top_p)
    cdf = jnp.cumsum(jax.nn.softmax(filtered, axis=-1), axis=-1)
    uniform = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys)
    # tokens whose cumulative mass is <= u*total come before the draw; zero-mass tokens never
    # start a jump, so they are never drawn
    drawn = jnp.sum(cdf <= (uniform * cdf[:, -1])[:, None], axis=-1).astype(jnp.int32)
    # u*total rounds up to total once in ~2^24 draws: fall back to the most likely token
    sampled = jnp.where(drawn < logits.shape[-1], drawn, jnp.argmax(filtered, axis=-1))
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)
    return tokens, logprobs[:, 0]


# -- device state and the two jitted programs ----------------------------------------------------

Cache = dict[str, dict[str, jax.Array]]


@flax.struct.dataclass
class SlotState:
    """Everything the device holds about the slots (B slots, S = max_context, M stop ids).

    Attributes:
      cache: per layer ``{"k", "v"}`` [B, S, K, H] (K key-value heads of H dims).
      lengths: [B] int32, tokens in each slot's cache (its next RoPE position).
      next_token: [B] int32, the last sampled token, not yet in the cache.
      active: [B] bool, the slot is generating.
      num_generated: [B] int32, tokens sampled so far by the slot's request.
      budget: [B] int32, tokens the request may sample at most.
      temperature: [B] float32.
      top_k: [B] int32 (0: all).
      top_p: [B] float32.
      greedy: [B] bool.
      keys: [B] typed PRNG keys, the request's base key.
      stop_ids: [B, M] int32, the request's stop tokens, -1 padded.
    """

    cache: Cache
    lengths: jax.Array
    next_token: jax.Array
    active: jax.Array
    num_generated: jax.Array
    budget: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    greedy: jax.Array
    keys: jax.Array
    stop_ids: jax.Array


class SlotRequest(NamedTuple):
    """One request as the prefill and extend programs take it (P = its bucket, M stop ids).

    For a prefill, ``prompt`` is the whole prompt and ``start`` is 0 (``source`` is ignored); for
    an extend, ``prompt`` is the suffix ``prompt_ids[start:]`` and ``source`` the slot whose first
    ``start`` cache columns hold the keys and values of ``prompt_ids[:start]``.
    """

    prompt: jax.Array        # [P] int32, right-padded
    prompt_len: jax.Array    # int32, the whole prompt's length (start + the suffix's)
    slot: jax.Array          # int32, where the request runs
    temperature: jax.Array   # float32
    top_k: jax.Array         # int32
    top_p: jax.Array         # float32
    greedy: jax.Array        # bool
    seed: jax.Array          # [2] uint32 (low, high words)
    stop_ids: jax.Array      # [M] int32, -1 padded
    budget: jax.Array        # int32
    start: jax.Array         # int32, cached tokens reused (extend only)
    source: jax.Array        # int32, the slot they are read from (extend only)


def _cache_dtype(model: nnx.Module) -> jnp.dtype:
    """The dtype tunix writes into its cache: the embedding's (Llama 3), the config's (Qwen3)."""
    dtype = getattr(model.config, "dtype", None)
    return dtype if dtype is not None else model.embedder.input_embedding[...].dtype


def _empty_cache(model: nnx.Module, batch: int, size: int) -> Cache:
    config = model.config
    shape = (batch, size, config.num_kv_heads, config.head_dim)
    dtype = _cache_dtype(model)
    return {f"layer_{i}": {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
            for i in range(config.num_layers)}


def _tunix_cache(cache: Cache, end_index: jax.Array) -> dict[str, dict[str, jax.Array]]:
    # the default integer type: tunix adds Python ints to it (int64 under jax_enable_x64)
    end = end_index.astype(int)
    return {name: {"k": layer["k"], "v": layer["v"], "end_index": end}
            for name, layer in cache.items()}


def _strip_cache(tunix_cache) -> Cache:
    return {name: {"k": layer["k"], "v": layer["v"]} for name, layer in tunix_cache.items()}


def init_slot_state(model: nnx.Module, max_batch: int, max_context: int,
                    max_stop_tokens: int) -> SlotState:
    """Every slot free, its cache zero."""
    b = max_batch
    return SlotState(
        cache=_empty_cache(model, b, max_context),
        lengths=jnp.zeros((b,), jnp.int32), next_token=jnp.zeros((b,), jnp.int32),
        active=jnp.zeros((b,), bool), num_generated=jnp.zeros((b,), jnp.int32),
        budget=jnp.zeros((b,), jnp.int32), temperature=jnp.ones((b,), jnp.float32),
        top_k=jnp.zeros((b,), jnp.int32), top_p=jnp.ones((b,), jnp.float32),
        greedy=jnp.zeros((b,), bool), keys=jax.random.split(jax.random.key(0), b),
        stop_ids=jnp.full((b, max_stop_tokens), -1, jnp.int32))


def prefill(model: nnx.Module, state: SlotState, request: SlotRequest
            ) -> tuple[SlotState, jax.Array, jax.Array, jax.Array]:
    """Run ``request``'s prompt into its slot and sample its first token.

    The prompt (right-padded to P) goes through the model with a fresh [1, P] cache and a causal
    mask (padding comes after every real token, so no real token sees it); the cache is copied
    into the slot's rows at columns 0..P-1 (columns from ``prompt_len`` on are garbage that the
    slot's length masks and its decode steps overwrite).

    Returns:
      (state, first token int32, its raw log-prob float32, whether the slot goes on generating).
    """
    size = request.prompt.shape[0]
    positions = jnp.arange(size, dtype=jnp.int32)[None]
    causal = jnp.tril(jnp.ones((size, size), bool))[None]
    fresh = _tunix_cache(_empty_cache(model, 1, size), jnp.zeros((1,), jnp.int32))
    logits, filled = model(request.prompt[None], positions, fresh, causal)
    last = jax.lax.dynamic_index_in_dim(logits[0], request.prompt_len - 1, keepdims=False)
    return _start_slot(state, request, filled, last)


def extend(model: nnx.Module, state: SlotState, request: SlotRequest, *, window: int
           ) -> tuple[SlotState, jax.Array, jax.Array, jax.Array]:
    """Prefill only a prompt's suffix on top of cached keys and values (the prefix cache), and
    sample its first token.

    Reads the first ``window`` cache columns of slot ``request.source`` (its columns
    0..``start``-1 hold the keys and values of the prompt's first ``start`` tokens), runs the
    suffix (right-padded to P, ``start + P <= window``) through the model at positions
    ``start``..``start+P-1`` with the row as its cache (tunix writes the suffix's keys and values
    at columns ``start``.. and attends over the row), query i seeing columns ``<= start + i``,
    and writes the row into slot ``request.slot``'s columns 0..window-1: in place when ``source
    == slot``, a copy of the shared prefix otherwise (the source slot is left as it was).

    Returns:
      as :func:`prefill`.
    """
    size = request.prompt.shape[0]
    start = request.start.astype(jnp.int32)
    positions = start + jnp.arange(size, dtype=jnp.int32)
    columns = jnp.arange(window, dtype=jnp.int32)
    mask = (columns[None, :] <= positions[:, None])[None]
    zero = jnp.zeros((), jnp.int32)
    source = request.source.astype(jnp.int32)
    row = {name: {kv: jax.lax.dynamic_slice(layer[kv], (source, zero, zero, zero),
                                            (1, window, *layer[kv].shape[2:]))
                  for kv in ("k", "v")}
           for name, layer in state.cache.items()}
    logits, filled = model(request.prompt[None], positions[None], _tunix_cache(row, start[None]),
                           mask)
    last = jax.lax.dynamic_index_in_dim(logits[0], request.prompt_len - start - 1,
                                        keepdims=False)
    return _start_slot(state, request, filled, last)


def _start_slot(state: SlotState, request: SlotRequest, filled, last: jax.Array
                ) -> tuple[SlotState, jax.Array, jax.Array, jax.Array]:
    """Sample the first token from the prompt's last logits ``last`` [V], write the keys and
    values ``filled`` (per layer [1, C, K, H]) into the slot's columns 0..C-1 and set its state."""
    base_key = jax.random.fold_in(jax.random.key(request.seed[0]), request.seed[1])
    token, logprob = sample_tokens(
        last[None], jax.random.fold_in(base_key, 0)[None], request.temperature[None],
        request.top_k[None], request.top_p[None], request.greedy[None])
    active = ~jnp.isin(token[0], request.stop_ids) & (request.budget > 1)

    slot = request.slot.astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)  # index types must agree, Python ints are int64 under x64
    cache = {name: {kv: jax.lax.dynamic_update_slice(
                        layer[kv], filled[name][kv].astype(layer[kv].dtype),
                        (slot, zero, zero, zero))
                    for kv in ("k", "v")}
             for name, layer in state.cache.items()}
    state = state.replace(
        cache=cache,
        lengths=state.lengths.at[slot].set(request.prompt_len),
        next_token=state.next_token.at[slot].set(token[0]),
        active=state.active.at[slot].set(active),
        num_generated=state.num_generated.at[slot].set(1),
        budget=state.budget.at[slot].set(request.budget),
        temperature=state.temperature.at[slot].set(request.temperature),
        top_k=state.top_k.at[slot].set(request.top_k),
        top_p=state.top_p.at[slot].set(request.top_p),
        greedy=state.greedy.at[slot].set(request.greedy),
        keys=state.keys.at[slot].set(base_key),
        stop_ids=state.stop_ids.at[slot].set(request.stop_ids))
    return state, token[0], logprob[0], active


class DecodeOutput(NamedTuple):
    """What a decode call produced, step-major (N steps, B slots)."""

    tokens: jax.Array    # [N, B] int32
    logprobs: jax.Array  # [N, B] float32, raw
    emitted: jax.Array   # [N, B] bool: the slot was active and sampled this token


def decode(model: nnx.Module, state: SlotState, *, num_steps: int, window: int
           ) -> tuple[SlotState, DecodeOutput]:
    """``num_steps`` single-token steps for every slot, attending over cache columns < ``window``.

    Each step feeds every slot's ``next_token`` at position ``lengths`` (tunix's model vmapped
    over the slots, a batch-of-one cache per row), samples the next token per slot, and ends a
    slot on one of its stop tokens or when it has sampled ``budget`` tokens. Inactive slots
    compute too (fixed shapes) but change nothing: their lengths stay, and the cache rows of the
    slots inactive when the call starts are written back unchanged (a parked slot's cached
    tokens may reach past the window, where tunix's write at ``end_index % window`` would land
    inside them). Every active slot must satisfy ``lengths + num_steps <= window`` or finish
    before it reaches the window (its budget); a slot that finishes mid-call only writes at its
    final length, past its cached tokens.
    """
    columns = jnp.arange(window, dtype=jnp.int32)

    def row_forward(token, length, row_cache):
        cache = _tunix_cache({name: {kv: layer[kv][None] for kv in ("k", "v")}
                              for name, layer in row_cache.items()}, length[None])
        mask = (columns <= length)[None, None, :]
        logits, new_cache = model(token[None, None], length[None, None], cache, mask)
        return logits[0, 0], {name: {kv: layer[kv][0] for kv in ("k", "v")}
                              for name, layer in _strip_cache(new_cache).items()}

    def step(state: SlotState, _):
        logits, cache = jax.vmap(row_forward)(state.next_token, state.lengths, state.cache)
        keys = jax.vmap(jax.random.fold_in)(state.keys, state.num_generated)
        tokens, logprobs = sample_tokens(logits, keys, state.temperature, state.top_k,
                                         state.top_p, state.greedy)
        emitted = state.active
        num_generated = state.num_generated + emitted
        stopped = jnp.any(tokens[:, None] == state.stop_ids, axis=-1)
        state = state.replace(
            cache=cache,
            lengths=state.lengths + emitted,
            next_token=jnp.where(emitted, tokens, state.next_token),
            num_generated=num_generated,
            active=emitted & ~stopped & (num_generated < state.budget))
        return state, DecodeOutput(tokens, logprobs, emitted)

    full = state.cache
    windowed = {name: {kv: layer[kv][:, :window] for kv in ("k", "v")}
                for name, layer in full.items()}
    started = state.active[:, None, None, None]
    state, output = jax.lax.scan(step, state.replace(cache=windowed), None, length=num_steps)
    cache = {name: {kv: jax.lax.dynamic_update_slice(
                        full[name][kv], jnp.where(started, layer[kv], windowed[name][kv]),
                        (0, 0, 0, 0))
                    for kv in ("k", "v")}
             for name, layer in state.cache.items()}
    return state.replace(cache=cache), output


class Programs(NamedTuple):
    """The jitted programs of one graph definition (the state donated in each).

    Attributes:
      prefill: ``(params, state, request) -> (state, token, logprob, active)``; compiles once
        per (slot shapes, prompt bucket).
      extend: ``(params, state, request, window=W) -> (state, token, logprob, active)``;
        compiles once per (slot shapes, suffix bucket, W).
      decode: ``(params, state, num_steps=N, window=W) -> (state, DecodeOutput)``; compiles once
        per (slot shapes, N, W).
    """

    prefill: Any
    extend: Any
    decode: Any


_PROGRAMS: list[tuple[nnx.GraphDef, Programs]] = []
_PROGRAMS_LOCK = threading.Lock()


def programs_for(graphdef: nnx.GraphDef) -> Programs:
    """The programs of ``graphdef``, shared process-wide by backends over an equal graph
    definition (a test's backends, a backend re-created between runs), so that they compile
    once. (Looked up by equality: Qwen3's graph definition is not hashable, so it cannot be a
    static jit argument.)"""
    with _PROGRAMS_LOCK:
        for known, programs in _PROGRAMS:
            if known == graphdef:
                return programs

        def prefill_program(params, state, request):
            return prefill(nnx.merge(graphdef, params), state, request)

        def extend_program(params, state, request, window):
            return extend(nnx.merge(graphdef, params), state, request, window=window)

        def decode_program(params, state, num_steps, window):
            return decode(nnx.merge(graphdef, params), state, num_steps=num_steps, window=window)

        programs = Programs(
            prefill=jax.jit(prefill_program, donate_argnums=(1,)),
            extend=jax.jit(extend_program, static_argnames=("window",), donate_argnums=(1,)),
            decode=jax.jit(decode_program, static_argnames=("num_steps", "window"),
                           donate_argnums=(1,)))
        _PROGRAMS.append((graphdef, programs))
        return programs


# -- the backend ---------------------------------------------------------------------------------


def default_buckets(max_context: int, smallest: int = 32) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``max_context``, then ``max_context``."""
    buckets = []
    size = smallest
    while size < max_context:
        buckets.append(size)
        size *= 2
    return (*buckets, max_context)


@dataclasses.dataclass
class _Pending:
    seq: int
    request: GenerationRequest
    future: concurrent.futures.Future
    submitted: float


@dataclasses.dataclass
class _Running:
    pending: _Pending
    prompt_len: int
    tokens: list[int]
    logprobs: list[float]
    prompt: np.ndarray  # the prompt's ids (prefix matching)

    @property
    def cache_length(self) -> int:
        return self.prompt_len + len(self.tokens) - 1

    def cached_tokens(self) -> np.ndarray:
        """The tokens whose keys and values the slot's cache holds (once its prefill ran): the
        prompt and every sampled token but the last, which is fed at the next decode step."""
        if len(self.tokens) <= 1:
            return self.prompt
        return np.concatenate([self.prompt, np.asarray(self.tokens[:-1], self.prompt.dtype)])


@dataclasses.dataclass(frozen=True)
class _Admission:
    slot: int    # where the request runs
    source: int  # the slot whose cached columns it starts from (== slot when cold or in place)
    start: int   # cached tokens reused (0: a cold prefill)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two 1-D arrays."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m


@dataclasses.dataclass
class _WeightUpdate:
    fence: int  # requests with seq < fence finish on the previous weights
    params: Any
    settled: threading.Event = dataclasses.field(default_factory=threading.Event)
    swapped: bool = False  # settled by the swap (not by a failure or close)


def _resolve(future: concurrent.futures.Future, completion: Completion) -> None:
    try:
        future.set_result(completion)
    except concurrent.futures.InvalidStateError:  # already resolved (close racing the engine)
        pass


class JaxSamplerBackend:
    """In-process continuous-batching sampler over a tunix Llama 3 / Qwen3 policy.

    Args:
      policy: a :class:`~envsched_jax.learner.models.Policy`, an ``nnx.Module``, or a
        ``(graphdef, params)`` pair as ``nnx.split(model, nnx.Param, ...)`` (the trainer's
        :func:`~envsched_jax.learner.trainer.init_state`) gives them.
      max_batch: slots (requests decoded together).
      max_context: the longest prompt + completion served (tokens); the cache holds this many
        columns per slot.
      prefill_buckets: prompt lengths compiled for (prompts are right-padded to the smallest
        that holds them); ``max_context`` is added as the last. Also the attention windows.
        Default :func:`default_buckets`.
      dtype: parameter dtype (float32, or bfloat16 to halve memory). Llama computes and caches in
        its parameters' dtype; Qwen3 in its config's ``dtype`` (``load_policy(dtype=...)``).
      decode_steps: single-token steps per decode call (fewer host round trips; a request that
        ends mid-call leaves its slot idle until the call ends).
      max_stop_tokens: stop tokens a request may carry.
      prefix_cache: keep a finished request's keys and values in its slot (parked) and prefill
        only the part of a later prompt that they do not cover (see the module docstring).
      prefix_min_match: the fewest cached tokens worth reusing (a shorter match prefills cold).

    Attributes:
      name: ``"jax"``.
      max_context: as given.
      weights_version: weight swaps applied so far (0 for the constructor's).
    """

    name = "jax"

    def __init__(self, policy: models.Policy | nnx.Module | tuple[nnx.GraphDef, Any], *,
                 max_batch: int = 16, max_context: int = 2048,
                 prefill_buckets: Sequence[int] | None = None, dtype: Any = jnp.float32,
                 decode_steps: int = 4, max_stop_tokens: int = 8, prefix_cache: bool = True,
                 prefix_min_match: int = 16):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context!r}")
        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {decode_steps!r}")
        if max_stop_tokens < 1:
            raise ValueError(f"max_stop_tokens must be >= 1, got {max_stop_tokens!r}")
        if prefix_min_match < 1:
            raise ValueError(f"prefix_min_match must be >= 1, got {prefix_min_match!r}")
        self.dtype = jnp.dtype(dtype)
        if self.dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype}")
        buckets = sorted(set(int(b) for b in (prefill_buckets or default_buckets(max_context))))
        if buckets[0] < 1 or buckets[-1] > max_context:
            raise ValueError(f"prefill_buckets must lie in [1, max_context={max_context}], "
                             f"got {buckets}")
        if buckets[-1] != max_context:
            buckets.append(max_context)
        self.buckets = tuple(buckets)
        self.max_batch = int(max_batch)
        self.max_context = int(max_context)
        self.decode_steps = int(decode_steps)
        self.max_stop_tokens = int(max_stop_tokens)
        self.prefix_cache = bool(prefix_cache)
        self.prefix_min_match = int(prefix_min_match)

        if isinstance(policy, models.Policy):
            policy = policy.model
        if isinstance(policy, tuple):
            graphdef, params = policy
        else:
            graphdef, params, rest = nnx.split(policy, nnx.Param, ...)
            if jax.tree.leaves(rest):
                raise ValueError("the sampler expects a model whose state is all nnx.Param")
        self._graphdef = graphdef
        self._params = self._copy_params(params)
        model = nnx.merge(graphdef, self._params)
        self.config = model.config
        self.vocab_size = int(model.config.vocab_size)
        self._state = init_slot_state(model, self.max_batch, self.max_context,
                                      self.max_stop_tokens)
        programs = programs_for(graphdef)
        self._prefill_fn = programs.prefill
        self._extend_fn = programs.extend
        self._decode_fn = programs.decode
        self.weights_version = 0

        self._cv = threading.Condition()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._updates: collections.deque[_WeightUpdate] = collections.deque()
        self._slots: list[_Running | None] = [None] * self.max_batch
        # a free slot's parked entry: the tokens its cache rows hold (None: nothing reusable)
        self._parked: list[np.ndarray | None] = [None] * self.max_batch
        self._last_used = [0] * self.max_batch  # LRU clock per slot
        self._clock = 0
        self._next_seq = 0
        self._closing = False
        self._error: str | None = None
        self._stats = collections.Counter()
        self._thread = threading.Thread(target=self._engine, name="jax-sampler", daemon=True)
        self._thread.start()

    # -- public interface ------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        if not isinstance(request, GenerationRequest):
            raise RequestError(f"submit takes a GenerationRequest, got {type(request).__name__}")
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        problem = self._check(request)
        with self._cv:
            if problem is None and self._error is not None:
                problem = f"the JAX sampler's engine failed earlier: {self._error}"
            elif problem is None and self._closing:
                problem = "the JAX sampler is closed"
            if problem is None:
                self._queue.append(_Pending(self._next_seq, request, future, time.monotonic()))
                self._next_seq += 1
                self._cv.notify_all()
                return future
        future.set_result(Completion.failed(problem))
        return future

    def set_params(self, params: Any, *, wait: bool = False) -> float:
        """Serve ``params`` (an ``nnx.Param`` state of this model's graph definition, e.g. the
        trainer's ``TrainState.params``) from now on; requests submitted before the call finish
        on the old weights. Returns the seconds taken to copy and stage them (and, with
        ``wait``, until they serve)."""
        start = time.perf_counter()
        expected = jax.tree.structure(self._params)
        if jax.tree.structure(params) != expected:
            raise ValueError("set_params: the parameter tree differs from the served model's "
                             f"(got {jax.tree.structure(params)}, expected {expected})")
        for new, old in zip(jax.tree.leaves(params), jax.tree.leaves(self._params)):
            if tuple(new.shape) != tuple(old.shape):
                raise ValueError(f"set_params: a parameter has shape {tuple(new.shape)}, the "
                                 f"served model's {tuple(old.shape)}")
        update = _WeightUpdate(-1, self._copy_params(params))
        jax.block_until_ready(update.params)
        with self._cv:
            if self._error is not None or self._closing:
                raise BackendError("set_params: the JAX sampler is "
                                   + (f"failed ({self._error})" if self._error else "closed"))
            update.fence = self._next_seq
            self._updates.append(update)
            self._cv.notify_all()
        if wait:
            update.settled.wait()
            if not update.swapped:
                raise BackendError("set_params: the JAX sampler "
                                   + (f"failed ({self._error})" if self._error else "was closed")
                                   + " before the weights served")
        return time.perf_counter() - start

    def update_weights(self, params_dir: str, *, wait: bool = False) -> float:
        """Serve the weights of the safetensors folder ``params_dir`` (``learner.export``
        output) from now on (as :meth:`set_params`). Returns the seconds taken, reading
        included."""
        start = time.perf_counter()
        load_dtype = getattr(self.config, "param_dtype", jnp.float32)
        policy = models.load_policy(params_dir, dtype=load_dtype, with_tokenizer=False)
        if policy.config != self.config:
            raise ValueError(f"update_weights: {params_dir} holds a different model "
                             f"({policy.config}) from the one served ({self.config})")
        _, params, _ = nnx.split(policy.model, nnx.Param, ...)
        self.set_params(params, wait=wait)
        return time.perf_counter() - start

    def close(self) -> None:
        """Stop the engine thread; requests still queued or running get an error completion."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._fail_all("the JAX sampler was closed")

    def __enter__(self) -> JaxSamplerBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def num_compilations(self) -> dict[str, int]:
        """Programs compiled so far, process-wide (backends over the same graph definition share
        them): ``prefill`` (one per prompt bucket used), ``extend`` (one per (suffix bucket,
        window) used by prefix-cache hits), ``decode`` (one per window used)."""
        return {"prefill": self._prefill_fn._cache_size(),
                "extend": self._extend_fn._cache_size(),
                "decode": self._decode_fn._cache_size()}

    def stats(self) -> dict[str, int]:
        """Counters (absent ones are 0): ``requests`` admitted, ``prefills`` (cold, whole
        prompt), ``prefix_hits`` (requests that reused cached tokens: only their suffix was
        prefilled), ``prefix_forks`` (hits whose cached tokens were copied from another slot),
        ``prefix_tokens_reused`` (cached tokens not prefilled again), ``prefill_tokens`` (prompt
        tokens run through a prefill or an extend, padding excluded), ``prefix_evictions``
        (parked entries dropped for a request that did not use them), ``prefix_invalidations``
        (parked entries dropped by a weight swap), ``decode_calls``, ``decode_steps``,
        ``generated_tokens`` and ``slot_steps`` (active slots summed over decode steps:
        ``slot_steps / (decode_steps * max_batch)`` is the slot occupancy)."""
        with self._cv:
            return dict(self._stats)

    # -- engine ----------------------------------------------------------------------------------

    def _copy_params(self, params: Any) -> Any:
        # a copy: the trainer donates its state to its step, which frees the arrays it held
        def copy(leaf):
            leaf = jnp.asarray(leaf)
            dtype = self.dtype if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf.dtype
            return jnp.array(leaf, dtype=dtype, copy=True)

        return jax.tree.map(copy, params)

    def _check(self, request: GenerationRequest) -> str | None:
        n = len(request.prompt_ids)
        if n >= self.max_context:
            return (f"request {request.request_id!r}: the prompt has {n} tokens, no room for a "
                    f"completion within max_context={self.max_context}")
        if max(request.prompt_ids) >= self.vocab_size:
            return (f"request {request.request_id!r}: prompt token id {max(request.prompt_ids)} "
                    f"is outside the vocabulary of {self.vocab_size}")
        if len(request.stop_token_ids) > self.max_stop_tokens:
            return (f"request {request.request_id!r}: {len(request.stop_token_ids)} stop tokens, "
                    f"this backend takes at most max_stop_tokens={self.max_stop_tokens}")
        return None

    def _engine(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._closing or self._queue or self._updates
                               or any(self._slots)):
                        self._cv.wait()
                    if self._closing:
                        return
                    swap = None
                    if (self._updates and not any(self._slots)
                            and (not self._queue or self._queue[0].seq >= self._updates[0].fence)):
                        swap = self._updates.popleft()
                        # the parked keys and values belong to the old weights
                        self._stats["prefix_invalidations"] += sum(
                            entry is not None for entry in self._parked)
                        self._parked = [None] * self.max_batch
                    fence = self._updates[0].fence if self._updates else None
                    admitted = []
                    while self._queue and (fence is None or self._queue[0].seq < fence):
                        admission = self._admit(self._queue[0])
                        if admission is None:
                            break
                        self._queue.popleft()
                        admitted.append(admission)
                if swap is not None:
                    self._params = swap.params
                    self.weights_version += 1
                    swap.swapped = True
                    swap.settled.set()
                for admission in admitted:
                    self._prefill(admission)
                if any(self._slots):
                    self._decode()
        except BaseException as err:  # noqa: BLE001 - every failure must reach the futures
            with self._cv:
                self._error = f"{type(err).__name__}: {err}"
            self._fail_all(f"the JAX sampler's engine failed: {self._error}")

    def _fail_all(self, message: str) -> None:
        with self._cv:
            pending = list(self._queue) + [r.pending for r in self._slots if r is not None]
            self._queue.clear()
            self._slots = [None] * self.max_batch
            self._parked = [None] * self.max_batch
            updates = list(self._updates)
            self._updates.clear()
        now = time.monotonic()
        for p in pending:
            _resolve(p.future, Completion.failed(message, now - p.submitted))
        for update in updates:
            update.settled.set()

    def _bucket(self, length: int) -> int:
        return next(b for b in self.buckets if b >= length)

    def _admit(self, pending: _Pending) -> _Admission | None:
        """Choose the slot of ``pending`` (under the lock), or None when every slot runs.

        The request's destination for a cold prefill is a plain free slot, else the least
        recently used parked one (evicted). With the prefix cache, the slot (parked or running)
        whose cached tokens share the longest prefix with the prompt, at least
        ``prefix_min_match`` tokens, is the source of an extend: in place when it is parked and
        its cached tokens are all a prefix of the prompt (the same conversation, one turn on:
        nothing is lost), otherwise the shared prefix is copied into the cold destination (the
        source keeps its entry; if the source is itself the least recently used parked slot,
        the destination, the prompt overwrites it from the divergence on)."""
        free = [s for s in range(self.max_batch) if self._slots[s] is None]
        if not free:
            return None
        request = pending.request
        prompt = np.asarray(request.prompt_ids, np.int64)
        n = len(prompt)
        plain = [s for s in free if self._parked[s] is None]
        cold = plain[0] if plain else min(free, key=self._last_used.__getitem__)
        slot, source, start = cold, cold, 0
        if self.prefix_cache:
            best, best_key = None, None
            for s in range(self.max_batch):
                running = self._slots[s]
                cached = self._parked[s] if running is None else running.cached_tokens()
                if cached is None:
                    continue
                common = _common_prefix(prompt, cached)
                whole = common == len(cached)  # every cached token is a prefix of the prompt
                reuse = min(common, n - 1)     # the prompt's last token is always run
                key = (reuse, whole, running is None, self._last_used[s])
                if reuse >= self.prefix_min_match and (best_key is None or key > best_key):
                    best, best_key = s, key
            if best is not None:
                reuse, whole, parked = best_key[:3]
                # the suffix's bucket, and its window, must fit in max_context: reuse less
                # (run some cached tokens again) where the padded suffix would not
                reuse = min(reuse, self.max_context - self._bucket(n - reuse))
                if reuse >= self.prefix_min_match:
                    source, start = best, reuse
                    slot = best if parked and whole else cold
        if self._parked[slot] is not None and not (start and source == slot):
            self._stats["prefix_evictions"] += 1  # dropped, not extended in place
        if source != slot:
            self._clock += 1
            self._last_used[source] = self._clock
            self._stats["prefix_forks"] += 1
        self._parked[slot] = None
        self._slots[slot] = _Running(pending, n, [], [], prompt)
        self._stats["requests"] += 1
        self._stats["prefill_tokens"] += n - start
        if start:
            self._stats["prefix_hits"] += 1
            self._stats["prefix_tokens_reused"] += start
        else:
            self._stats["prefills"] += 1
        return _Admission(slot, source, start)

    def _prefill(self, admission: _Admission) -> None:
        """Run the admitted request's prompt (a cold prefill) or its suffix (an extend on cached
        tokens) into its slot and take its first token."""
        slot, start = admission.slot, admission.start
        running = self._slots[slot]
        request = running.pending.request
        sampling = request.sampling
        n = running.prompt_len
        size = self._bucket(n - start)
        prompt = np.zeros(size, np.int32)
        prompt[:n - start] = request.prompt_ids[start:]
        stops = np.full(self.max_stop_tokens, -1, np.int32)
        stops[:len(request.stop_token_ids)] = request.stop_token_ids
        seed = request.seed & 0xFFFF_FFFF_FFFF_FFFF
        slot_request = SlotRequest(
            prompt=prompt, prompt_len=np.int32(n), slot=np.int32(slot),
            temperature=np.float32(sampling.temperature),
            top_k=np.int32(min(sampling.top_k, self.vocab_size)),
            top_p=np.float32(sampling.top_p), greedy=np.bool_(sampling.greedy),
            seed=np.array([seed & 0xFFFF_FFFF, seed >> 32], np.uint32), stop_ids=stops,
            budget=np.int32(min(sampling.max_new_tokens, self.max_context - n)),
            start=np.int32(start), source=np.int32(admission.source))
        if start:
            self._state, token, logprob, active = self._extend_fn(
                self._params, self._state, slot_request, window=self._bucket(start + size))
        else:
            self._state, token, logprob, active = self._prefill_fn(
                self._params, self._state, slot_request)
        token, logprob, active = jax.device_get((token, logprob, active))
        running.tokens.append(int(token))
        running.logprobs.append(float(logprob))
        with self._cv:
            self._stats["generated_tokens"] += 1
        if not active:
            self._finish(slot)

    def _decode(self) -> None:
        longest = max(r.cache_length for r in self._slots if r is not None)
        window = self._bucket(min(longest + self.decode_steps, self.max_context))
        self._state, output = self._decode_fn(self._params, self._state,
                                              num_steps=self.decode_steps, window=window)
        tokens, logprobs, emitted, active = jax.device_get(
            (output.tokens, output.logprobs, output.emitted, self._state.active))
        for slot, running in enumerate(self._slots):
            if running is None:
                continue
            steps = emitted[:, slot]
            running.tokens.extend(int(t) for t in tokens[steps, slot])
            running.logprobs.extend(float(x) for x in logprobs[steps, slot])
            if not active[slot]:
                self._finish(slot)
        with self._cv:
            self._stats["decode_calls"] += 1
            self._stats["decode_steps"] += self.decode_steps
            self._stats["generated_tokens"] += int(emitted.sum())
            self._stats["slot_steps"] += int(emitted.sum())

    def _finish(self, slot: int) -> None:
        running = self._slots[slot]
        request = running.pending.request
        reason = "stop" if running.tokens[-1] in request.stop_token_ids else "length"
        completion = Completion(tuple(running.tokens), tuple(running.logprobs), reason,
                                seconds=time.monotonic() - running.pending.submitted)
        with self._cv:
            self._slots[slot] = None
            if self.prefix_cache:
                self._parked[slot] = running.cached_tokens()
                self._clock += 1
                self._last_used[slot] = self._clock
        _resolve(running.pending.future, completion)
