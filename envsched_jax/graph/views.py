"""The six concrete text views of a node and its abstract view (spec "Static graph").

Each view is a string per node; :mod:`envsched_jax.graph.build` fits one TF-IDF encoder per view.

1. ``instruction_words``  - the instruction (all user turns), word unigrams + bigrams
2. ``instruction_chars``  - the same text, character 3-5-grams
3. ``check_text``         - the verifier checks' natural-language text
4. ``check_code``         - verifier code *structure*: AST node types, comparison operators,
                            called builtins, the field names read and literal type placeholders
5. ``initial_context``    - the initial state's keys and values (its JSON text)
6. ``operations``         - the complete (concrete) operation description of the extractor

plus ``abstract``: the appendix-E abstraction of view 6 (cross-environment similarity).

Very large initial states (BFCL's long-context file systems) are cut at ``MAX_CONTEXT_CHARS``
characters so one task cannot dominate memory; the choice is ours, the paper summarises the
initial state with an LLM.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from envsched_jax.graph.extract import Extraction, analyse_check

VIEW_NAMES = ("instruction_words", "instruction_chars", "check_text", "check_code",
              "initial_context", "operations")
MAX_CONTEXT_CHARS = 20_000


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


def flatten_state(state: Any, limit: int = MAX_CONTEXT_CHARS) -> str:
    """The initial state as compact JSON text (keys and values), cut at ``limit`` characters.
    The view's word tokenizer ignores the JSON punctuation."""
    return json.dumps(state, ensure_ascii=False, separators=(",", ":"), default=str)[:limit]


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
