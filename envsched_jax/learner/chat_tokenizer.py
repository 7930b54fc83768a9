"""A small chat tokenizer trained on a pool's own text, for tiny CPU policies.

A tiny policy with SmolLM2's 49,152-token vocabulary spends most of its time and memory on the
logits. The CPU training recipe therefore uses a byte-level BPE
with a vocabulary of about a thousand tokens trained on the texts the policy will read and write:
system prompts and tool catalogs, instructions, tool calls and observations of the pool's
reference trajectories. Byte-level means any text (including a model's garbage) still encodes.

The chat template is ChatML (the format SmolLM2 and Qwen use): ``<|im_start|>role\\ncontent
<|im_end|>\\n`` per message, ``<|im_start|>assistant\\n`` as the generation prompt, and no default
system message. ``<|im_end|>`` is the end token, ``<|endoftext|>`` the padding.

Training uses Hugging Face ``tokenizers`` (its BPE trainer), wrapped as a transformers
``PreTrainedTokenizerFast`` so that the agent loop and :mod:`envsched_jax.learner.export` treat it
like any other tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def train_chat_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, min_frequency: int = 2):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML template, trained on ``texts``.

    Args:
      texts: the training corpus (iterated once).
      vocab_size: the largest vocabulary (the 256 byte tokens and 3 special tokens included;
        a small corpus may run out of merges first).
      min_frequency: a merge needs this many occurrences.

    Raises:
      ValueError: ``vocab_size`` too small to hold the bytes and special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    floor = 256 + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be >= {floor} (256 bytes + {len(SPECIAL_TOKENS)} "
                         f"special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=CHATML_TEMPLATE,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, clean_up_tokenization_spaces=False)
