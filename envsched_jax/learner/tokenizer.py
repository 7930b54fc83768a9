"""The tokenizer and chat template stored in a GGUF file, without torch.

transformers can build a tokenizer from a GGUF file (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``), but that path goes through its GGUF model loader, which refuses to run without
torch, takes ~17 s for SmolLM2 (it parses every metadata field in Python), and sets SmolLM2's end
token to ``<|im_start|>`` and no pad token. Here the tokenizer fields are read with ``gguf``'s
reader and handed to the same converter transformers uses
(``transformers.integrations.ggml.convert_gguf_tokenizer``, a ``tokenizers`` byte-level BPE for
SmolLM2's ``gpt2`` model); the special tokens are set from the file's own ids
(``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` / ``padding_token_id``) and the Jinja chat
template from ``tokenizer.chat_template``. The result is a ``transformers``
``PreTrainedTokenizerFast``; its ``save_pretrained`` writes ``tokenizer.json``,
``tokenizer_config.json`` and ``chat_template.jinja``, which :mod:`envsched_jax.learner.export`
puts beside exported weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# GGUF metadata key (after ``tokenizer.ggml.``) -> key of transformers' converter input.
_TOKENIZER_FIELDS = {
    "model": "tokenizer_type", "tokens": "tokens", "scores": "scores", "token_type": "token_type",
    "merges": "merges", "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
    "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id",
    "add_space_prefix": "add_prefix_space",
}


def read_gguf_tokenizer_fields(path: str | Path, reader=None
                               ) -> tuple[str, dict[str, Any], str | None]:
    """The architecture, the converter's ``tokenizer_dict`` and the chat template of a GGUF file
    (``reader``: an already opened ``gguf.GGUFReader`` of it)."""
    if reader is None:
        from envsched_jax.learner.weights import open_gguf

        reader = open_gguf(path)
    fields = reader.fields
    architecture = fields["general.architecture"].contents()
    tokenizer_dict: dict[str, Any] = {}
    for suffix, key in _TOKENIZER_FIELDS.items():
        field = fields.get(f"tokenizer.ggml.{suffix}")
        if field is not None:
            value = field.contents()
            tokenizer_dict[key] = value.item() if hasattr(value, "item") else value
    if "tokens" not in tokenizer_dict:
        raise ValueError(f"{path}: the GGUF file carries no tokenizer (tokenizer.ggml.tokens)")
    template = fields.get("tokenizer.chat_template")
    return architecture, tokenizer_dict, None if template is None else template.contents()


def load_gguf_tokenizer(path: str | Path, reader=None):
    """A ``transformers.PreTrainedTokenizerFast`` built from a GGUF file's tokenizer fields, with
    its special tokens and chat template (no torch; about 1 s for SmolLM2 given an open
    ``reader``, plus the 2-6 s of opening one)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer

    architecture, tokenizer_dict, chat_template = read_gguf_tokenizer_fields(path, reader)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tokens = tokenizer_dict["tokens"]
    special = {name: tokens[tokenizer_dict[key]]
               for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                                 ("unk_token", "unk_token_id"), ("pad_token", "pad_token_id"))
               if tokenizer_dict.get(key) is not None and tokenizer_dict[key] < len(tokens)}
    extra = {k: v for k, v in extra.items() if k not in special}
    # Clean-up of spaces before punctuation is for WordPiece; on a byte-level BPE it corrupts text.
    extra["clean_up_tokenization_spaces"] = False
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=chat_template,
                                   **special, **extra)


def chat_token_ids(tokenizer, messages: Sequence[Mapping[str, Any]], *,
                   add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
    """Token ids of ``messages`` (``[{"role": ..., "content": ...}, ...]``) rendered with the
    tokenizer's chat template; the template writes every special token itself, so none is added.

    Args:
      add_generation_prompt: end with the assistant header so the model answers next.
      template_kwargs: extra template variables (``tools=...``, ...).
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
