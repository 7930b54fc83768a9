"""Export a policy's parameters as a transformers safetensors folder.

The folder holds ``model.safetensors`` (transformers names and layout, ``[out, in]`` linear
weights, no Q/K permutation: transformers, vLLM and tunix all read that layout), ``config.json``
and ``generation_config.json`` written by transformers' own config classes (no torch needed), and,
when the policy has a tokenizer, ``tokenizer.json``, ``tokenizer_config.json`` and
``chat_template.jinja`` (transformers 5 keeps the chat template in its own file).
``transformers.AutoModelForCausalLM.from_pretrained(folder)`` and
:func:`envsched_jax.learner.models.load_policy` load it (tested); vLLM reads the same files (not
tested here: vLLM needs its own environment).

Each tensor is the inverse of tunix's load-time transform: the parameter is reshaped back to the
transposed transformers shape and transposed again (:func:`model_tensors`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from tunix.models import safetensors_loader
from tunix.utils import torch_utils

from envsched_jax.learner import models as models_lib

_DTYPES = ("float32", "bfloat16")


def model_tensors(model: nnx.Module, hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The model's parameters as float32 transformers-named tensors.

    Raises:
      ValueError: the model lacks a parameter the config implies, or a shape differs.
    """
    family, config = models_lib.tunix_config(hf_config)
    key_map = models_lib.tunix_key_map(family, config)
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    params = {safetensors_loader.path_to_key(path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]}
    tensors: dict[str, np.ndarray] = {}
    for name, shape in models_lib.hf_tensor_shapes(hf_config).items():
        key, transform = torch_utils.torch_key_to_jax_key(key_map, name)
        if key not in params:
            raise ValueError(f"the model has no parameter {key!r} (for {name!r})")
        value = np.asarray(jax.device_get(params[key]), dtype=np.float32)
        if transform is not None:
            permute, _ = transform
            if permute:
                transposed_shape = tuple(shape[p] for p in permute)
                value = value.reshape(transposed_shape).transpose(np.argsort(permute))
        if value.shape != shape:
            raise ValueError(f"{name}: parameter {key!r} gives shape {value.shape}, "
                             f"expected {shape}")
        tensors[name] = np.ascontiguousarray(value)
    return tensors


def _config_for_transformers(hf_config: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    config = {k: v for k, v in hf_config.items()
              if not re.fullmatch(r"transformers_version|_name_or_path|torch_dtype|dtype", k)}
    config["rope_theta"] = models_lib.rope_theta_of(hf_config)
    config.pop("rope_parameters", None)
    config.pop("rope_scaling", None)
    config["torch_dtype"] = dtype
    return config


def export_model(model: nnx.Module, hf_config: Mapping[str, Any], out_dir: str | Path, *,
                 tokenizer: Any | None = None, dtype: str = "float32") -> Path:
    """Write ``model`` as a transformers safetensors folder.

    Args:
      model: a tunix ``Llama3`` / ``Qwen3`` module (``nnx.merge(graphdef, params)`` of a trained
        state).
      hf_config: the transformers config it was built from (``Policy.hf_config``).
      out_dir: created if missing; files of the same names are overwritten.
      tokenizer: a transformers tokenizer to save beside the weights (with its chat template).
      dtype: ``float32`` or ``bfloat16`` for the stored tensors.

    Returns:
      ``out_dir`` as a Path.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {_DTYPES}")
    import ml_dtypes
    from safetensors.numpy import save_file
    from transformers import AutoConfig, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    tensors = {name: value.astype(np_dtype)
               for name, value in model_tensors(model, hf_config).items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})

    config = _config_for_transformers(hf_config, dtype)
    AutoConfig.for_model(config.pop("model_type"), **config).save_pretrained(out)
    generation = {k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                  if hf_config.get(k) is not None}
    GenerationConfig(**generation).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def export_policy(policy: models_lib.Policy, out_dir: str | Path, *,
                  model: nnx.Module | None = None, dtype: str = "float32") -> Path:
    """:func:`export_model` of ``policy`` (or of ``model``, trained parameters of the same
    architecture), with the policy's config and tokenizer."""
    return export_model(policy.model if model is None else model, policy.hf_config, out_dir,
                        tokenizer=policy.tokenizer, dtype=dtype)
