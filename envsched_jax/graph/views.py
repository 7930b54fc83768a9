"""The six concrete text views of a node and its abstract view (spec "Static graph").

Each view is a string per node; :mod:`envsched_jax.graph.build` fits one TF-IDF encoder per view.

1. ``instruction_words``  - the instruction (all user turns), word unigrams + bigrams
2. ``instruction_chars``  - the same text, character 3-5-grams
3. ``check_text``         - the verifier checks' natural-language text
4. ``check_code``         - verifier code *structure*: AST node types, comparison operators,
                            called builtins, the field names read and literal type placeholders
5. ``initial_context``    - the initial state flattened to key paths and scalar values
6. ``operations``         - the complete (concrete) operation description of the extractor

plus ``abstract``: the appendix-E abstraction of view 6 (cross-environment similarity).

Very large initial states (BFCL's long-context file systems) are truncated to
``MAX_CONTEXT_TOKENS`` tokens so one task cannot dominate memory; the choice is ours, the paper
summarises the initial state with an LLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from envsched_jax.graph.extract import Extraction, analyse_check

VIEW_NAMES = ("instruction_words", "instruction_chars", "check_text", "check_code",
              "initial_context", "operations")
MAX_CONTEXT_TOKENS = 2000


@dataclasses.dataclass(frozen=True)
class NodeViews:
    instruction: str
    check_text: str
    check_code: str
    initial_context: str
    operations: str
    abstract: str

    def concrete(self) -> tuple[str, str, str, str, str, str]:
        """The six concrete views in the order of ``VIEW_NAMES`` (views 1 and 2 share the text)."""
        return (self.instruction, self.instruction, self.check_text, self.check_code,
                self.initial_context, self.operations)


def flatten_state(state: Any, limit: int = MAX_CONTEXT_TOKENS) -> str:
    """Key paths and scalar values of a JSON state, depth first, at most ``limit`` tokens."""
    tokens: list[str] = []
    stack: list[tuple[str, Any]] = [("", state)]
    while stack and len(tokens) < limit:
        prefix, value = stack.pop()
        if isinstance(value, Mapping):
            for key in reversed(list(value.keys())):
                stack.append((f"{prefix}.{key}" if prefix else str(key), value[key]))
        elif isinstance(value, (list, tuple)):
            for item in reversed(value[:50]):
                stack.append((prefix, item))
        else:
            tokens.append(prefix)
            tokens.append(str(value)[:64])
    return " ".join(tokens[:limit])


def code_structure(code: str) -> str:
    info = analyse_check(code)
    fields = " ".join(f"field_{f}" for f in info.fields)
    return " ".join([" ".join(info.structure), fields, " ".join(info.literal_types)])


def node_views(task, extraction: Extraction) -> NodeViews:
    instruction = " \n".join(t for t in (task.user_turns or (task.instruction,)) if t) or task.instruction
    return NodeViews(
        instruction=instruction,
        check_text=" \n".join(c.text for c in task.checks),
        check_code=" \n".join(code_structure(c.code) for c in task.checks),
        initial_context=flatten_state(task.initial_state),
        operations=extraction.concrete_text(),
        abstract=extraction.abstract_text(),
    )
