"""Tool-call formats: how a model family writes tool calls, and how its prompt lists the tools.

A format is a small object in :data:`TOOL_FORMATS` with

- ``parse(text) -> ParsedTurn``: the tool calls in one assistant message, the text around them,
  and, for calls that are not well formed, a message saying what is wrong (the agent loop
  returns it to the model as the tool's observation, so a malformed call costs a turn, not the
  episode);
- ``tools_prompt(tools, compact=False) -> str``: the tool catalog written into the system
  prompt, for chat templates that ignore the ``tools`` argument (SmolLM2's does), or always when
  the compact catalog (one ``name(arg: type)`` line per tool, :func:`compact_signature`) is
  asked for.

Formats (each as its family documents it):

- ``hermes`` (Qwen 2.5 / Qwen3, Hermes): every call is ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``, one JSON object per tag, any number of tags per message.
- ``json_list`` (SmolLM2-Instruct's function calling): ``<tool_call>[{"name": ..., "arguments":
  {...}}, ...]</tool_call>``, a JSON list in one tag (a single object is accepted too).
- ``llama3_json`` (Llama 3.1+ JSON tool calling): the message is one JSON object
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``), or several
  separated by ``;``.

A message with no call is a message to the user (``chat_with_user``); text outside the tags is
kept as the message's content (reasoning included).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """One assistant message, parsed.

    Attributes:
      content: the text outside tool-call markup (stripped).
      calls: the well-formed calls, in order.
      errors: one message per malformed call (what was wrong and the offending text, cut).
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.errors)


class ToolFormat(Protocol):
    name: str

    def parse(self, text: str) -> ParsedTurn: ...

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]], compact: bool = False) -> str: ...


def _snippet(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _call_from(obj: Any, args_key: str = "arguments") -> ToolCall | str:
    """A ToolCall from a decoded JSON object, or the reason it is not one."""
    if not isinstance(obj, dict):
        return f"a tool call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "a tool call needs a non-empty string 'name'"
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            return f"tool call {name!r}: arguments are a string that is not JSON ({err.msg})"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return f"tool call {name!r}: arguments must be a JSON object, got {type(args).__name__}"
    return ToolCall(name, args)


def _decode(payload: str) -> tuple[Any, str | None]:
    try:
        return json.loads(payload), None
    except json.JSONDecodeError as err:
        return None, f"invalid JSON ({err.msg} at character {err.pos}): {_snippet(payload)}"


def _schema_lines(tools: Sequence[Mapping[str, Any]], compact: bool = False) -> str:
    if compact:
        return "\n".join(compact_signature(t) for t in tools)
    return "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)


def compact_signature(tool: Mapping[str, Any]) -> str:
    """``name(arg: type, opt?: type)`` of an OpenAI function schema: the catalog line of the
    compact tool catalog (no descriptions), for small models with short contexts."""
    function = tool.get("function", tool)
    params = (function.get("parameters") or {}).get("properties") or {}
    required = set((function.get("parameters") or {}).get("required") or ())
    args = ", ".join(f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
                     for name, spec in params.items())
    return f"{function.get('name', '?')}({args})"


_TAGGED = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class TaggedFormat:
    """``<tool_call>...</tool_call>`` formats: one object per tag (hermes) or a list (json_list)."""

    name: str
    list_payload: bool

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for match in _TAGGED.finditer(text):
            payload, closed = match.group(1), match.group(2)
            if not closed:
                errors.append(f"unterminated <tool_call> (no </tool_call>): {_snippet(payload)}")
                continue
            obj, error = _decode(payload.strip())
            if error:
                errors.append(error)
                continue
            items = obj if (self.list_payload and isinstance(obj, list)) else [obj]
            for item in items:
                call = _call_from(item)
                (calls.append if isinstance(call, ToolCall) else errors.append)(call)
        content = _TAGGED.sub("", text).strip()
        return ParsedTurn(content, tuple(calls), tuple(errors))

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]], compact: bool = False) -> str:
        if self.list_payload:
            example = '<tool_call>[{"name": "tool_name", "arguments": {"arg": "value"}}]</tool_call>'
            how = "write a JSON list of calls inside one <tool_call></tool_call> tag"
        else:
            example = '<tool_call>\n{"name": "tool_name", "arguments": {"arg": "value"}}\n</tool_call>'
            how = "write each call as a JSON object inside its own <tool_call></tool_call> tag"
        return ("You can call the following tools. Their signatures are in <tools></tools>:\n"
                f"<tools>\n{_schema_lines(tools, compact)}\n</tools>\n"
                f"To call tools, {how}, for example:\n{example}\n"
                "Tool results come back in the next message. To answer the user, write a "
                "message without a tool call.")


@dataclasses.dataclass(frozen=True)
class Llama3JsonFormat:
    """Llama 3.1+ JSON tool calling: the whole message is the call(s)."""

    name: str = "llama3_json"

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>"):].strip()
        if not body.startswith("{"):
            return ParsedTurn(text.strip())
        calls: list[ToolCall] = []
        errors: list[str] = []
        for part in _split_top_level(body, ";"):
            obj, error = _decode(part)
            if error:
                errors.append(error)
                continue
            call = _call_from(obj, args_key="parameters")
            (calls.append if isinstance(call, ToolCall) else errors.append)(call)
        return ParsedTurn("", tuple(calls), tuple(errors))

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]], compact: bool = False) -> str:
        return ("You have access to the following functions:\n"
                f"{_schema_lines(tools, compact)}\n"
                'To call a function, respond with only a JSON object of the form '
                '{"name": function name, "parameters": {argument name: value}}. '
                "To answer the user, respond in plain text.")


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside JSON strings and brackets."""
    parts, depth, start, in_str, escape = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if ch == '"' and not escape:
                in_str = False
            escape = ch == "\\" and not escape
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": TaggedFormat("hermes", list_payload=False),
    "json_list": TaggedFormat("json_list", list_payload=True),
    "llama3_json": Llama3JsonFormat(),
}

# Model family (transformers ``model_type``, or a name fragment) -> its native format.
FAMILY_FORMATS = {"qwen3": "hermes", "qwen2": "hermes", "llama": "json_list"}


def tool_format(name: str) -> ToolFormat:
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; choose from "
                         f"{', '.join(sorted(TOOL_FORMATS))}") from None


def format_for_model(model_type: str) -> str:
    """The native format of a transformers ``model_type``. CHOICE: ``llama`` maps to
    ``json_list`` because the Llama-architecture model every machine has, SmolLM2-Instruct, was
    tuned on that format; pass ``llama3_json`` explicitly for Meta's Llama 3.1+ checkpoints."""
    try:
        return FAMILY_FORMATS[model_type]
    except KeyError:
        raise ValueError(f"no native tool-call format known for model_type {model_type!r}; "
                         f"pass one of {', '.join(sorted(TOOL_FORMATS))}") from None
