"""Chat rendering for the agent loop: a growing token sequence with a per-token loss mask.

The agent loop keeps one token sequence per episode. The model's own tokens are appended exactly
as sampled (never decoded and re-encoded) and are the only ones learned from (loss mask 1,
reasoning included); everything else (system prompt, tool catalog, user turns, tool results, and
the template's markup between messages) is rendered with the tokenizer's chat template and masked
out (0).

Appending messages to a sequence the model already wrote into needs the template's rendering of
*only the new messages*. :class:`ChatRenderer` gets it by difference: it renders a fixed
three-message base (system, user, assistant) with and without the new messages and keeps the
text after the base. That works for any template that renders a message independently of the
ones before it, which is checked: a template whose rendering of the base is not a prefix of its
rendering of base + new messages is refused with an error naming the template's behaviour.

After a completion, the template's end-of-assistant markup is completed: SmolLM2's assistant
message ends with ``<|im_end|>\\n``; the model stops after emitting ``<|im_end|>`` (learned), and
the ``\\n`` is appended masked. A completion cut by a length limit gets the whole closing markup.

Tools. When the chat template renders the ``tools`` argument (Qwen's do), it is used; when it
ignores it (SmolLM2's), the tool format's own catalog text (:mod:`.tool_calls`) is appended to the
system prompt.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.rollout.tool_calls import ToolFormat

_MARK = "\u2063ASSISTANT_CONTENT\u2063"


def _render(tokenizer, messages, *, add_generation_prompt: bool, tools=None) -> str:
    kwargs = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


class TemplateError(ValueError):
    """The chat template cannot be used incrementally (see the module docstring)."""


class ChatRenderer:
    """Token ids of prompts and of message deltas for one tokenizer and tool format.

    Args:
      tokenizer: a transformers tokenizer with a chat template.
      tool_format: how the model writes tool calls (for the catalog text, when the template
        ignores ``tools``).
      compact_tools: write the compact catalog (signatures only) into the system prompt, even
        when the template renders ``tools``.
    """

    def __init__(self, tokenizer, tool_format: ToolFormat, *, compact_tools: bool = False):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tool_format = tool_format
        self.compact_tools = compact_tools
        self._base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                      {"role": "assistant", "content": _MARK}]
        base_text = _render(tokenizer, self._base, add_generation_prompt=False)
        at = base_text.rfind(_MARK)
        if at < 0:
            raise TemplateError("the chat template drops the assistant message's content")
        self._base_text = base_text
        self.assistant_suffix = base_text[at + len(_MARK):]
        """The template's markup closing an assistant message (``<|im_end|>\\n`` for ChatML)."""
        probe = [{"type": "function", "function": {"name": "probe_tool", "description": "",
                                                    "parameters": {"type": "object",
                                                                   "properties": {}}}}]
        plain = _render(tokenizer, self._base[:2], add_generation_prompt=True)
        self.template_renders_tools = _render(tokenizer, self._base[:2], add_generation_prompt=True,
                                              tools=probe) != plain

    @property
    def _template_tools(self) -> bool:
        return self.template_renders_tools and not self.compact_tools

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def initial_messages(self, system: str, user: str,
                         tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The system and first user message, the tool catalog in the system prompt when the
        template would ignore ``tools``."""
        if tools and not self._template_tools:
            catalog = self.tool_format.tools_prompt(tools, compact=self.compact_tools)
            system = f"{system}\n\n{catalog}" if system else catalog
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]]) -> list[int]:
        """The whole first prompt, ending with the assistant header."""
        renders = tools if self._template_tools else None
        return self.encode(_render(self.tokenizer, messages, add_generation_prompt=True,
                                   tools=renders))

    def delta_ids(self, new_messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens that append ``new_messages`` after a closed assistant message and open the
        next assistant message."""
        full = _render(self.tokenizer, [*self._base, *new_messages], add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise TemplateError("the chat template renders earlier messages differently once "
                                "more messages follow, so a conversation cannot be extended "
                                "token by token")
        return self.encode(full[len(self._base_text):])

    def closing_ids(self, completion_ids: Sequence[int]) -> list[int]:
        """The part of the end-of-assistant markup the completion did not write itself."""
        text = self.decode(completion_ids, skip_special_tokens=False)
        suffix = self.assistant_suffix
        for k in range(len(suffix), 0, -1):
            if text.endswith(suffix[:k]):
                return self.encode(suffix[k:]) if k < len(suffix) else []
        return self.encode(suffix)


@dataclasses.dataclass
class Transcript:
    """An episode's token sequence: ``token_ids``, ``loss_mask`` (1 for sampled tokens),
    ``logprobs`` (the sampler's raw log-prob of each sampled token, 0 elsewhere), and the chat
    ``messages`` it renders (for logs and inspection)."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def add_context(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} log-probs")
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)


def observation_text(observation: Any) -> str:
    """A tool result as the text of a tool message (JSON; strings as they are)."""
    if isinstance(observation, str):
        return observation
    return json.dumps(observation, ensure_ascii=False, sort_keys=True)
