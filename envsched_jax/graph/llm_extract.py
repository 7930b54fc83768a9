"""LLM operation extraction as appendix E does it, with validation, repair, cache and fallback.

The paper's cross-environment representation S_abs comes from an LLM that reads each task (its
instruction, an initial-state summary, the exact verifier checks, the tool catalog and the real
implementations of the relevant tools) and returns operations, gates, reward groups, conflicts
and independent branches with fixed enums (appendix E.1-E.3). This module sends exactly that
request and turns a valid answer into the same :class:`~envsched_jax.graph.extract.Extraction`
the static extractor returns, so the deterministic abstraction (``Extraction.abstract_text``) and
everything downstream are unchanged.

The request (appendix E):

- **System prompt**: :data:`SYSTEM_PROMPT`, appendix E.2's text with its enums, output structure
  and rules; ``response_format={"type": "json_object"}`` where the client can enforce it.
- **User message**: structured JSON only (appendix E.3): a ``shared_environment`` object
  (environment class name, summary, state space, constraints, tool catalog with name,
  description, required, arguments and signature) and ``tasks`` (task id, instruction,
  ``initial_state_summary``, ``verifier_checks`` with ``check_id`` c0.., requirement,
  ``initially_true`` and verifier code, and ``relevant_tool_implementations``).
- **Batching per environment**: the tasks of one environment are sent together, at most
  ``tasks_per_request`` per request, sharing the ``shared_environment`` object.

CHOICES where the paper is silent (each documented where it is made):

- ``summarize_initial_state`` (named by the paper, not defined): every top-level key with its
  type and size, and the first ``state_sample_records`` records of each collection, values cut at
  ``state_value_chars`` characters (:func:`summarize_initial_state`).
- ``initially_true``: each check run on the untouched initial state *in the sandbox* (a pool's
  checks are untrusted code); without a sandbox the field is ``null``.
- Relevant tools: the tools of the task's reference actions, else those of the static
  extractor's inferred plan; implementations are cut at ``implementation_chars`` characters.
- **Validation** (:func:`validate_task`): the exact key structure of E.2, every enum, ids local
  and sequential (o0.., g0.., r0.., b0..), references only to ids of the same task, tool
  candidates only from the catalog, check ids only the task's, reward groups partitioning every
  check exactly once, and the length limits (30 operations, 30 gates, 30 reward groups,
  20 conflicts, 20 branches, 5 uncertainties).
- **Repair**: an invalid answer is answered by a repair message listing every problem, task by
  task, and asking for the corrected JSON of the invalid tasks only; at most ``max_repairs``
  repairs per request. Valid tasks of any attempt are kept.
- **Fallback**: a task still invalid after the budget (or a failed call) makes its environment
  fall back to the static extractor, with the reason recorded (``fallback="environment"``, the
  default: one environment's tasks are then abstracted by one procedure, so their S_abs rows stay
  comparable), or only that task (``fallback="task"``).
- **Cache**: one JSON file per request, keyed by the SHA-256 of (prompt version, system prompt,
  model, user message, max tokens, repair budget), written atomically; a rerun reads finished
  requests back (a pool is extracted once; an interrupted run resumes where it stopped). Failed
  requests are cached too, so a rerun does not pay for them again; ``retry_failed`` asks again.
- **Conversion**: operation family, dependencies, gates (type, provenance), reward groups and
  conflicts come from the answer; the concrete tool is the first candidate in the catalog, its
  lookup kind and state-changing flag from the static analysis of that tool, argument type
  placeholders from the tool schema's required parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.graph.extract import (CONFLICT_KINDS, GATE_TYPES, GROUP_RELATIONS,
                                        OPERATION_FAMILIES, PROVENANCES, Extraction, GateRecord,
                                        OperationRecord, RewardGroup, ToolInfo, analyse_check,
                                        analyse_environment, extract)
from envsched_jax.graph.llm_clients import ChatClient, ChatReply
from envsched_jax.pool.model import Environment, Pool, Task, tool_function, tool_name

PROMPT_VERSION = "appendix-e/1"

REACHABILITY = ("ambiguous", "direct", "indirect", "unknown", "unsupported")
OBSERVABILITY = ("explicit_result", "silent", "state_query", "unknown")
RECOVERABILITY = ("irreversible", "retryable", "unknown")
LIMITS = {"operations": 30, "gates": 30, "reward_groups": 30, "conflicts": 20,
          "independent_branches": 20, "uncertainties": 5}
_QUERY_FAMILIES = frozenset({"lookup", "validate", "aggregate", "report", "authorize"})


def _enum_line(name: str, values: Sequence[str]) -> str:
    return f"- {name}: [{', '.join(repr(v) for v in values)}]"


SYSTEM_PROMPT = "\n\n".join([
    "You extract factual static topology from tool-agent tasks. You receive no rollout, "
    "trajectory, action trace, model output, reward observation, success rate, or variance. Do "
    "not predict any of them and do not assign difficulty, probability, capability, or high/low "
    "labels.",
    "Build two connected structures from the supplied task, initial state, exact verifier "
    "checks, tool catalog, and selected real tool implementations:\n"
    "1. execution topology: the minimum correct operations, their dependencies, and factual "
    "prerequisite gates such as identifier provenance, state preconditions, ordering, "
    "authorization, exact arguments, and missing tool affordances;\n"
    "2. reward topology: a partition of verifier check IDs into groups that are controlled by the "
    "same operation or prerequisite gate. Check weights are not yours to estimate; downstream "
    "code computes them from the exact check IDs.",
    "A gate is a prerequisite whose resolution can jointly enable or block one or more "
    "operations/checks. Do not create a gate for every ordinary literal. Distinguish a direct task "
    "literal, unique lookup, broad lookup, prior tool output, agent-generated value, and genuinely "
    "unavailable value. Mark reachability unsupported only when the supplied tools/implementation "
    "establish that no path exists; otherwise use unknown. Describe topology, not likely model "
    "behavior.",
    "The initial_state_summary is evidence available to this static analyzer, not information "
    "shown to the agent. Never mark an identifier direct merely because it appears in that "
    "summary. From the agent's execution perspective, an identifier is task_literal only when the "
    "task supplies the execution-ready value; otherwise classify the actual tool path as "
    "unique_lookup, broad_lookup, prior_tool_output, inferred, or unavailable. Use the initial "
    "state only to verify that records, matches, and preconditions exist and to determine whether "
    "a supplied lookup can resolve them.",
    "Use these enums exactly:\n" + "\n".join([
        _enum_line("operation.family", OPERATION_FAMILIES),
        _enum_line("gate.type", GATE_TYPES),
        _enum_line("gate.provenance", PROVENANCES),
        _enum_line("gate.reachability", REACHABILITY),
        _enum_line("gate.observability", OBSERVABILITY),
        _enum_line("gate.recoverability", RECOVERABILITY),
        _enum_line("reward_group.relation", GROUP_RELATIONS),
        _enum_line("conflict.kind", CONFLICT_KINDS)]),
    'Return JSON with key "tasks". Every task item must have exactly this structure:\n'
    '{ "task_id": "...", "operations": [ {"id":"o0","family":"lookup","description":"...",'
    '"tool_candidates":["..."], "depends_on_operations":[],"gate_ids":["g0"],'
    '"affected_checks":["c0"]} ], "gates": [ {"id":"g0","type":"identifier_resolution",'
    '"description":"...", "provenance":"unique_lookup","reachability":"indirect", '
    '"observability":"explicit_result","recoverability":"retryable", "depends_on_gates":[],'
    '"affected_operations":["o0"],"affected_checks":["c0"]} ], "reward_groups": [ {"id":"r0",'
    '"check_ids":["c0"],"shared_gate_ids":["g0"], "producer_operations":["o0"],'
    '"relation":"shared_gate"} ], "conflicts": [{"left_operation":"o0","right_operation":"o1",'
    '"kind":"order"}], "independent_branches": [ {"id":"b0","operation_ids":["o0"],'
    '"check_ids":["c0"]} ], "uncertainties": ["short factual ambiguity in the supplied static '
    'evidence"] }',
    "Rules:\n"
    "- Use only supplied check IDs and tool names.\n"
    "- reward_groups must partition every verifier check exactly once. Group checks only when "
    "they share a concrete gate/producer; otherwise use singleton or independent groups.\n"
    "- A check already true in the untouched initial state belongs in an initially_satisfied "
    "group unless later required operations can invalidate it.\n"
    "- Operations describe the shortest correct state-changing/query plan, not speculative "
    "retries.\n"
    "- IDs must be local sequential identifiers o0..., g0..., r0..., b0....\n"
    "- Keep descriptions concise and case-specific. At most 30 operations, 30 gates, 30 reward "
    "groups, 20 conflicts, 20 branches, and 5 uncertainties per task.\n"
    "- Return JSON only.",
])

REPAIR_INSTRUCTION = (
    "Your previous reply is not valid. Problems, by task:\n{problems}\n"
    'Return JSON with key "tasks" holding corrected items for exactly these task ids: {ids}. '
    "Keep the structure, enums and rules of the system prompt. Return JSON only.")


@dataclasses.dataclass(frozen=True)
class LLMExtractConfig:
    """LLM extraction settings (the paper gives the prompt; these are our choices)."""

    tasks_per_request: int = 4
    """Tasks of one environment sent in one request (they share the environment object)."""
    max_repairs: int = 2
    """Repair prompts per request after the first answer (the retry budget)."""
    max_tokens: int = 4096
    """Completion tokens per call."""
    fallback: Literal["environment", "task"] = "environment"
    """What falls back to the static extractor when a task stays invalid."""
    state_sample_records: int = 3
    """Records of each initial-state collection shown in initial_state_summary."""
    state_value_chars: int = 200
    """Characters of any one value in initial_state_summary."""
    implementation_chars: int = 4000
    """Characters of one tool implementation in relevant_tool_implementations."""
    retry_failed: bool = False
    """Ask again for requests whose cached outcome is a failure."""
    seed: int = 0
    """Sampling seed sent with every call."""

    def __post_init__(self):
        for name in ("tasks_per_request", "max_tokens", "state_sample_records",
                     "state_value_chars", "implementation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"LLMExtractConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_repairs < 0:
            raise ValueError(f"LLMExtractConfig.max_repairs must be >= 0, got {self.max_repairs!r}")
        if self.fallback not in ("environment", "task"):
            raise ValueError(f"LLMExtractConfig.fallback must be 'environment' or 'task', got "
                             f"{self.fallback!r}")


# ---------------------------------------------------------------------------------------------
# The user message (appendix E.3)


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "..."
    if isinstance(value, Mapping):
        return {str(k): _cut(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut(v, limit) for v in value]
    return value


def summarize_initial_state(state: Mapping[str, Any], *, sample_records: int = 3,
                            value_chars: int = 200) -> dict[str, Any]:
    """CHOICE (the paper names ``summarize_initial_state`` without defining it): per top-level
    key, its type; for a collection (object or list) its size and its first ``sample_records``
    entries, values cut at ``value_chars`` characters; a scalar as it is (cut)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Mapping):
            items = list(value.items())[:sample_records]
            out[str(key)] = {"type": "object", "size": len(value),
                             "sample": {str(k): _cut(v, value_chars) for k, v in items}}
        elif isinstance(value, (list, tuple)):
            out[str(key)] = {"type": "array", "size": len(value),
                             "sample": [_cut(v, value_chars) for v in value[:sample_records]]}
        else:
            out[str(key)] = {"type": type(value).__name__, "value": _cut(value, value_chars)}
    return out


def _signature(schema: Mapping[str, Any]) -> str:
    fn = tool_function(schema)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or ())
    parts = []
    for name, spec in props.items():
        kind = spec.get("type", "any") if isinstance(spec, Mapping) else "any"
        parts.append(f"{name}: {kind}" + ("" if name in required else " = None"))
    return f"{tool_name(schema)}({', '.join(parts)})"


def tool_catalog(env: Environment) -> list[dict[str, Any]]:
    """The environment's tools as appendix E.3's ``tool_catalog`` entries."""
    out = []
    for schema in env.tools:
        fn = tool_function(schema)
        params = fn.get("parameters") or {}
        out.append({"name": tool_name(schema), "description": fn.get("description", ""),
                    "required": list(params.get("required") or ()),
                    "arguments": list((params.get("properties") or {}).keys()),
                    "signature": _signature(schema)})
    return out


def _class_source(env: Environment) -> str | None:
    if env.class_source is not None:
        return env.class_source
    if env.trusted_class is not None:
        import inspect

        try:
            return inspect.getsource(env.trusted_class)
        except (OSError, TypeError):
            return None
    return None


def tool_implementations(env: Environment, names: Sequence[str],
                         limit: int = 4000) -> list[dict[str, str]]:
    """``relevant_tool_implementations`` entries: each named method's signature, docstring and
    source (cut at ``limit`` characters), read from the environment's class source (never run)."""
    import ast

    source = _class_source(env)
    methods: dict[str, ast.FunctionDef] = {}
    if source:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        methods.setdefault(item.name, item)
    schemas = {tool_name(s): s for s in env.tools}
    out = []
    for name in dict.fromkeys(names):
        fn = methods.get(name)
        if fn is None:
            continue
        code = ast.get_source_segment(source, fn) or ""
        out.append({"name": name,
                    "signature": _signature(schemas[name]) if name in schemas else name,
                    "documentation": ast.get_docstring(fn) or "",
                    "implementation": code[:limit]})
    return out


def shared_environment(env: Environment) -> dict[str, Any]:
    """Appendix E.3's ``shared_environment`` object."""
    return {"environment": env.class_name, "summary": env.summary or env.introduction,
            "state_space": json.dumps([dict(s) for s in env.state_space], ensure_ascii=False,
                                      default=str),
            "constraints": "\n".join(env.constraints), "tool_catalog": tool_catalog(env)}


def task_entry(env: Environment, task: Task, tools: Mapping[str, ToolInfo],
               initially_true: Sequence[bool | None] | None, config: LLMExtractConfig) -> dict[str, Any]:
    """One item of the user message's ``tasks`` (appendix E.3)."""
    relevant = [op.tool for op in extract(env, task, tools).operations]
    flags = list(initially_true) if initially_true is not None else [None] * len(task.checks)
    instruction = "\n".join(t for t in task.user_turns if t) or task.instruction
    return {
        "task_id": task.task_id,
        "task": instruction,
        "initial_state_summary": summarize_initial_state(
            task.initial_state, sample_records=config.state_sample_records,
            value_chars=config.state_value_chars),
        "verifier_checks": [{"check_id": f"c{k}", "requirement": c.text,
                             "initially_true": flags[k], "verifier_code": c.code}
                            for k, c in enumerate(task.checks)],
        "relevant_tool_implementations": tool_implementations(env, relevant,
                                                              config.implementation_chars),
    }


def user_message(env: Environment, entries: Sequence[Mapping[str, Any]]) -> str:
    """The structured JSON user message, no natural language (appendix E.3)."""
    return json.dumps({"shared_environment": shared_environment(env), "tasks": list(entries)},
                      ensure_ascii=False, default=str)


def initial_check_results(pool, env: Environment, task: Task) -> tuple[list[bool | None], str | None]:
    """Each check on the untouched initial state, run in the sandbox ``pool`` (a
    :class:`~envsched_jax.envs.sandbox.WorkerPool`): (flags, error). A failed run gives
    ``None`` flags and names the error."""
    from envsched_jax.envs.episode import run_actions

    trajectory = run_actions(pool, env, task, [])
    if trajectory.error:
        return [None] * len(task.checks), trajectory.error
    return [bool(x) for x in trajectory.check_results], None


# ---------------------------------------------------------------------------------------------
# Validation


_TASK_KEYS = ("task_id", "operations", "gates", "reward_groups", "conflicts",
              "independent_branches", "uncertainties")
_OPERATION_KEYS = ("id", "family", "description", "tool_candidates", "depends_on_operations",
                   "gate_ids", "affected_checks")
_GATE_KEYS = ("id", "type", "description", "provenance", "reachability", "observability",
              "recoverability", "depends_on_gates", "affected_operations", "affected_checks")
_GROUP_KEYS = ("id", "check_ids", "shared_gate_ids", "producer_operations", "relation")
_CONFLICT_KEYS = ("left_operation", "right_operation", "kind")
_BRANCH_KEYS = ("id", "operation_ids", "check_ids")
_MAX_DESCRIPTION = 500


def validate_task(item: Any, *, task_id: str, check_ids: Sequence[str],
                  tool_names: Sequence[str]) -> list[str]:
    """Every problem of one task item against appendix E.2 (empty when valid)."""
    if not isinstance(item, Mapping):
        return [f"task item is {type(item).__name__}, not an object"]
    problems: list[str] = []
    keys = set(item)
    if keys != set(_TASK_KEYS):
        missing, extra = sorted(set(_TASK_KEYS) - keys), sorted(keys - set(_TASK_KEYS))
        problems.append(f"task keys must be exactly {list(_TASK_KEYS)}"
                        + (f"; missing {missing}" if missing else "")
                        + (f"; unexpected {extra}" if extra else ""))
    if item.get("task_id") != task_id:
        problems.append(f"task_id is {item.get('task_id')!r}, expected {task_id!r}")
    lists = {}
    for key in _TASK_KEYS[1:]:
        value = item.get(key, [])
        if not isinstance(value, list):
            problems.append(f"{key} must be a list, got {type(value).__name__}")
            value = []
        if len(value) > LIMITS[key]:
            problems.append(f"{key} has {len(value)} entries; at most {LIMITS[key]}")
        lists[key] = value
    checks, tools = set(check_ids), set(tool_names)

    def records(key: str, fields: Sequence[str], prefix: str | None) -> list[Mapping[str, Any]]:
        good = []
        for k, rec in enumerate(lists[key]):
            where = f"{key}[{k}]"
            if not isinstance(rec, Mapping):
                problems.append(f"{where} must be an object")
                continue
            if set(rec) != set(fields):
                missing, extra = sorted(set(fields) - set(rec)), sorted(set(rec) - set(fields))
                problems.append(f"{where} keys must be exactly {list(fields)}"
                                + (f"; missing {missing}" if missing else "")
                                + (f"; unexpected {extra}" if extra else ""))
            if prefix is not None and rec.get("id") != f"{prefix}{k}":
                problems.append(f"{where}.id is {rec.get('id')!r}; ids must be sequential, "
                                f"expected {prefix + str(k)!r}")
            good.append(rec)
        return good

    ops = records("operations", _OPERATION_KEYS, "o")
    gates = records("gates", _GATE_KEYS, "g")
    groups = records("reward_groups", _GROUP_KEYS, "r")
    conflicts = records("conflicts", _CONFLICT_KEYS, None)
    branches = records("independent_branches", _BRANCH_KEYS, "b")
    op_ids = {f"o{k}" for k in range(len(lists["operations"]))}
    gate_ids = {f"g{k}" for k in range(len(lists["gates"]))}

    def enum(where: str, value: Any, allowed: Sequence[str]) -> None:
        if value not in allowed:
            problems.append(f"{where} is {value!r}; allowed: {list(allowed)}")

    def refs(where: str, value: Any, allowed: set[str], what: str) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{where} must be a list of strings")
            return
        unknown = [v for v in value if v not in allowed]
        if unknown:
            problems.append(f"{where} names unknown {what} {unknown}")

    def text(where: str, value: Any) -> None:
        if not isinstance(value, str):
            problems.append(f"{where} must be a string")
        elif len(value) > _MAX_DESCRIPTION:
            problems.append(f"{where} has {len(value)} characters; keep it under {_MAX_DESCRIPTION}")

    for k, op in enumerate(ops):
        w = f"operations[{k}]"
        enum(f"{w}.family", op.get("family"), OPERATION_FAMILIES)
        text(f"{w}.description", op.get("description", ""))
        refs(f"{w}.tool_candidates", op.get("tool_candidates", []), tools, "tools")
        refs(f"{w}.depends_on_operations", op.get("depends_on_operations", []), op_ids, "operations")
        refs(f"{w}.gate_ids", op.get("gate_ids", []), gate_ids, "gates")
        refs(f"{w}.affected_checks", op.get("affected_checks", []), checks, "checks")
        if op.get("id") in (op.get("depends_on_operations") or []):
            problems.append(f"{w} depends on itself")
    for k, g in enumerate(gates):
        w = f"gates[{k}]"
        enum(f"{w}.type", g.get("type"), GATE_TYPES)
        enum(f"{w}.provenance", g.get("provenance"), PROVENANCES)
        enum(f"{w}.reachability", g.get("reachability"), REACHABILITY)
        enum(f"{w}.observability", g.get("observability"), OBSERVABILITY)
        enum(f"{w}.recoverability", g.get("recoverability"), RECOVERABILITY)
        text(f"{w}.description", g.get("description", ""))
        refs(f"{w}.depends_on_gates", g.get("depends_on_gates", []), gate_ids, "gates")
        refs(f"{w}.affected_operations", g.get("affected_operations", []), op_ids, "operations")
        refs(f"{w}.affected_checks", g.get("affected_checks", []), checks, "checks")
    seen: dict[str, int] = {}
    for k, r in enumerate(groups):
        w = f"reward_groups[{k}]"
        enum(f"{w}.relation", r.get("relation"), GROUP_RELATIONS)
        refs(f"{w}.check_ids", r.get("check_ids", []), checks, "checks")
        refs(f"{w}.shared_gate_ids", r.get("shared_gate_ids", []), gate_ids, "gates")
        refs(f"{w}.producer_operations", r.get("producer_operations", []), op_ids, "operations")
        for c in r.get("check_ids") or []:
            if isinstance(c, str):
                seen[c] = seen.get(c, 0) + 1
    missing = [c for c in check_ids if c not in seen]
    twice = sorted(c for c, n in seen.items() if n > 1 and c in checks)
    if missing:
        problems.append(f"reward_groups must partition every check exactly once; missing {missing}")
    if twice:
        problems.append(f"reward_groups must partition every check exactly once; repeated {twice}")
    for k, c in enumerate(conflicts):
        w = f"conflicts[{k}]"
        enum(f"{w}.kind", c.get("kind"), CONFLICT_KINDS)
        for side in ("left_operation", "right_operation"):
            if c.get(side) not in op_ids:
                problems.append(f"{w}.{side} is {c.get(side)!r}, not an operation id")
    for k, b in enumerate(branches):
        w = f"independent_branches[{k}]"
        refs(f"{w}.operation_ids", b.get("operation_ids", []), op_ids, "operations")
        refs(f"{w}.check_ids", b.get("check_ids", []), checks, "checks")
    for k, u in enumerate(lists["uncertainties"]):
        text(f"uncertainties[{k}]", u)
    return problems


def parse_reply(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """The reply's JSON object (``{"tasks": [...]}``), or None and why not. The whole reply must
    be one JSON object (as ``response_format=json_object`` guarantees); surrounding whitespace and
    a Markdown code fence are tolerated, nothing else."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    if not body:
        return None, "the reply is empty"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return None, f"the reply is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
    if not isinstance(value, dict):
        return None, f"the reply is a JSON {type(value).__name__}, not an object"
    if set(value) != {"tasks"} or not isinstance(value["tasks"], list):
        return None, f'the reply must be an object with the single key "tasks" (a list); got keys {sorted(value)}'
    return value, None


# ---------------------------------------------------------------------------------------------
# Conversion to the shared Extraction record


_SCHEMA_TYPES = {"string": "<string>", "integer": "<int>", "number": "<float>",
                 "boolean": "<bool>", "null": "<null>"}


def to_extraction(item: Mapping[str, Any], env: Environment, task: Task,
                  tools: Mapping[str, ToolInfo]) -> Extraction:
    """A valid task item (see :func:`validate_task`) as an :class:`Extraction` (the conversion is
    described in the module docstring)."""
    schemas = {tool_name(s): tool_function(s) for s in env.tools}
    operations = []
    for op in item["operations"]:
        tool = next((t for t in op["tool_candidates"] if t in tools), "")
        info = tools.get(tool)
        family = op["family"]
        params = (schemas[tool].get("parameters") or {}) if tool else {}
        props = params.get("properties") or {}
        required = tuple(params.get("required") or ())
        arg_types = tuple(_SCHEMA_TYPES.get((props.get(a) or {}).get("type"), "<value>")
                          for a in required)
        lookup_kind = info.lookup_kind if info is not None and info.lookup_kind != "none" else "entity_list"
        # A hand-off / end-of-conversation tool (the static analysis's control flag) changes no
        # record, whatever family the model gave it.
        control = info.control if info is not None else False
        changing = (info.state_changing if info is not None else family not in _QUERY_FAMILIES) and not control
        operations.append(OperationRecord(op["id"], family, tool, lookup_kind, required, arg_types,
                                          tuple(op["depends_on_operations"]), changing, control))
    gates = tuple(GateRecord(g["id"], g["type"], g["provenance"], tuple(g["affected_operations"]),
                             g["description"]) for g in item["gates"])
    check_fields = [analyse_check(c.code).fields for c in task.checks]
    groups = []
    for r in item["reward_groups"]:
        fields = tuple(dict.fromkeys(f for c in r["check_ids"] for f in check_fields[int(c[1:])]))[:6]
        groups.append(RewardGroup(r["id"], tuple(r["check_ids"]), r["relation"], fields))
    conflicts = tuple((c["left_operation"], c["right_operation"], c["kind"]) for c in item["conflicts"])
    return Extraction(tuple(operations), gates, tuple(groups), conflicts)


def extraction_to_json(extraction: Extraction) -> dict[str, Any]:
    return dataclasses.asdict(extraction)


def extraction_from_json(record: Mapping[str, Any]) -> Extraction:
    """Inverse of :func:`extraction_to_json` (lists become tuples)."""
    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    return Extraction(
        operations=tuple(OperationRecord(**{k: tup(v) for k, v in op.items()}) for op in record["operations"]),
        gates=tuple(GateRecord(**{k: tup(v) for k, v in g.items()}) for g in record["gates"]),
        reward_groups=tuple(RewardGroup(**{k: tup(v) for k, v in r.items()}) for r in record["reward_groups"]),
        conflicts=tuple(tuple(c) for c in record["conflicts"]))


# ---------------------------------------------------------------------------------------------
# The cache


class ExtractionCache:
    """One JSON file per request under ``root``, named by the request's key; written to a
    temporary file and renamed, so an interrupted run never leaves a half-written entry. A file
    that does not parse is an error naming it (delete it to ask again)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        if not path.exists():
            return None
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"extraction cache entry {path} is unreadable ({err}); delete it to "
                             "extract that request again") from None
        if not isinstance(value, dict) or value.get("key") != key:
            raise ValueError(f"extraction cache entry {path} does not hold request {key}; delete it")
        return value

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({**value, "key": key}, f, ensure_ascii=False)
        os.replace(tmp, self.path(key))


def request_key(model: str, message: str, config: LLMExtractConfig) -> str:
    payload = json.dumps({"prompt_version": PROMPT_VERSION,
                          "system": hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest(),
                          "model": model, "user": message, "max_tokens": config.max_tokens,
                          "max_repairs": config.max_repairs, "seed": config.seed},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Driving the extraction


@dataclasses.dataclass
class RequestOutcome:
    """What one request (a batch of one environment's tasks) gave."""

    env_id: str
    task_ids: list[str]
    items: dict[str, dict[str, Any]]      # valid task items by task id
    problems: dict[str, list[str]]        # remaining problems by task id (invalid tasks)
    calls: int = 0
    repairs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None              # a failed call (no usable reply at all)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "cached"}


@dataclasses.dataclass(frozen=True)
class EnvironmentReport:
    env_id: str
    source: Literal["llm", "static", "mixed"]
    reason: str | None
    tasks: int
    llm_tasks: int


@dataclasses.dataclass(frozen=True)
class ExtractionReport:
    """The extraction's cost and outcome, per environment and in total."""

    model: str
    prompt_version: str
    constrains_json: bool
    environments: tuple[EnvironmentReport, ...]
    requests: int
    cached_requests: int
    calls: int
    repairs: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    task_fallbacks: dict[str, str]   # task id -> why it uses the static extraction

    @property
    def llm_tasks(self) -> int:
        return sum(e.llm_tasks for e in self.environments)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["llm_tasks"] = self.llm_tasks
        return out


def _problem_text(problems: Mapping[str, Sequence[str]], limit: int = 12) -> str:
    lines = []
    for task_id, items in problems.items():
        shown = list(items[:limit]) + ([f"... and {len(items) - limit} more"] if len(items) > limit else [])
        lines.append(f"- {task_id}: " + "; ".join(shown))
    return "\n".join(lines)


def run_request(client: ChatClient, env: Environment, entries: Sequence[Mapping[str, Any]],
                message: str, config: LLMExtractConfig) -> RequestOutcome:
    """One request with its repairs (module docstring): valid items and remaining problems."""
    specs = {e["task_id"]: ([c["check_id"] for c in e["verifier_checks"]]) for e in entries}
    tools = [t["name"] for t in tool_catalog(env)]
    outcome = RequestOutcome(env.env_id, list(specs), {}, {t: ["no answer"] for t in specs})
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": message}]
    for attempt in range(config.max_repairs + 1):
        reply: ChatReply = client.complete(messages, json_object=True,
                                           max_tokens=config.max_tokens, seed=config.seed)
        outcome.calls += 1
        outcome.repairs += attempt > 0
        outcome.prompt_tokens += reply.prompt_tokens
        outcome.completion_tokens += reply.completion_tokens
        outcome.seconds += reply.seconds
        if reply.error is not None:
            outcome.error = reply.error
            outcome.problems = {t: [f"call failed: {reply.error}"] for t in outcome.problems}
            break
        pending = list(outcome.problems)
        parsed, why = parse_reply(reply.text)
        if parsed is None:
            if reply.finish_reason == "length":
                why += f" (the reply was cut at max_tokens = {config.max_tokens})"
            outcome.problems = {t: [why] for t in pending}
        else:
            by_id: dict[str, list[Any]] = {}
            for item in parsed["tasks"]:
                tid = item.get("task_id") if isinstance(item, Mapping) else None
                by_id.setdefault(tid if isinstance(tid, str) else "", []).append(item)
            problems: dict[str, list[str]] = {}
            for tid in pending:
                found = by_id.get(tid, [])
                if len(found) != 1:
                    problems[tid] = [f"expected one item with task_id {tid!r}, found {len(found)}"]
                    continue
                errors = validate_task(found[0], task_id=tid, check_ids=specs[tid],
                                       tool_names=tools)
                if errors:
                    problems[tid] = errors
                else:
                    outcome.items[tid] = found[0]
            stray = sorted(k for k in by_id if k not in specs)
            if stray and problems:
                problems[next(iter(problems))].append(f"unknown task ids in the reply: {stray}")
            outcome.problems = problems
        if not outcome.problems:
            break
        messages = messages[:2] + [
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": REPAIR_INSTRUCTION.format(
                problems=_problem_text(outcome.problems), ids=list(outcome.problems))}]
    return outcome


def _batches(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    return [list(tasks[k:k + size]) for k in range(0, len(tasks), size)]


def extract_pool(pool: Pool, client: ChatClient, config: LLMExtractConfig = LLMExtractConfig(), *,
                 cache_dir: str | os.PathLike | None = None, sandbox=None,
                 progress: bool = False) -> tuple[list[Extraction], list[str], ExtractionReport]:
    """LLM extraction of every task of ``pool``.

    Returns (extractions in pool task order, source per task ``"llm"`` / ``"static"``, report).
    ``sandbox``: a :class:`~envsched_jax.envs.sandbox.WorkerPool` to compute each check's
    ``initially_true`` (None: the field is null). ``cache_dir``: where finished requests are
    kept (None: no cache).
    """
    from envsched_jax.graph.build import _progress

    cache = ExtractionCache(cache_dir) if cache_dir is not None else None
    tool_info = {env.env_id: analyse_environment(env) for env in pool.environments}
    by_env: dict[str, list[Task]] = {}
    for task in pool.tasks:
        by_env.setdefault(task.env_id, []).append(task)
    plan = [(env_id, batch) for env_id, tasks in by_env.items()
            for batch in _batches(tasks, config.tasks_per_request)]
    outcomes: list[RequestOutcome] = []
    t0 = time.perf_counter()
    for env_id, batch in _progress(plan, f"LLM extraction ({client.model})", len(plan), progress):
        env = pool.environment(env_id)
        entries = []
        for task in batch:
            flags = None
            if sandbox is not None:
                flags, _ = initial_check_results(sandbox, env, task)
            entries.append(task_entry(env, task, tool_info[env_id], flags, config))
        message = user_message(env, entries)
        key = request_key(client.model, message, config)
        cached = cache.get(key) if cache is not None else None
        if cached is not None and not (config.retry_failed and cached["problems"]):
            outcome = RequestOutcome(**{k: v for k, v in cached.items() if k != "key"})
            outcome.cached = True
        else:
            outcome = run_request(client, env, entries, message, config)
            if cache is not None:
                cache.put(key, outcome.to_json())
        outcomes.append(outcome)

    items: dict[str, dict[str, Any]] = {}
    problems: dict[str, list[str]] = {}
    for o in outcomes:
        items.update(o.items)
        problems.update(o.problems)
    extractions: list[Extraction] = []
    sources: list[str] = []
    fallbacks: dict[str, str] = {}
    env_reports = []
    for env in pool.environments:
        tasks = by_env.get(env.env_id, [])
        bad = [t.task_id for t in tasks if t.task_id in problems]
        env_static = bool(bad) and config.fallback == "environment"
        reason = None
        if bad:
            first = bad[0]
            reason = (f"{len(bad)} of {len(tasks)} task(s) invalid after {config.max_repairs} "
                      f"repair(s); first, {first}: " + "; ".join(problems[first][:3]))
        for t in tasks:
            if env_static or t.task_id in problems:
                why = ("; ".join(problems[t.task_id][:3]) if t.task_id in problems
                       else f"environment {env.env_id} fell back: {reason}")
                fallbacks[t.task_id] = why
        n_llm = sum(t.task_id not in fallbacks for t in tasks)
        source = "llm" if n_llm == len(tasks) else ("static" if n_llm == 0 else "mixed")
        env_reports.append(EnvironmentReport(env.env_id, source, reason, len(tasks), n_llm))
    for task in pool.tasks:
        tools = tool_info[task.env_id]
        env = pool.environment(task.env_id)
        if task.task_id in fallbacks:
            extractions.append(extract(env, task, tools))
            sources.append("static")
        else:
            extractions.append(to_extraction(items[task.task_id], env, task, tools))
            sources.append("llm")
    report = ExtractionReport(
        model=client.model, prompt_version=PROMPT_VERSION,
        constrains_json=bool(getattr(client, "constrains_json", False)),
        environments=tuple(env_reports), requests=len(outcomes),
        cached_requests=sum(o.cached for o in outcomes), calls=sum(o.calls for o in outcomes if not o.cached),
        repairs=sum(o.repairs for o in outcomes if not o.cached),
        prompt_tokens=sum(o.prompt_tokens for o in outcomes if not o.cached),
        completion_tokens=sum(o.completion_tokens for o in outcomes if not o.cached),
        seconds=time.perf_counter() - t0, task_fallbacks=fallbacks)
    return extractions, sources, report


def save_extractions(path: str | os.PathLike, pool: Pool, extractions: Sequence[Extraction],
                     sources: Sequence[str], report: ExtractionReport) -> None:
    """Write the extraction of ``pool`` as one JSON document (pool hash, per-task records, the
    report), atomically."""
    path = Path(path)
    doc = {"pool": pool.name, "pool_hash": pool.content_hash(), "prompt_version": PROMPT_VERSION,
           "report": report.to_json(),
           "tasks": [{"task_id": t.task_id, "source": s, "extraction": extraction_to_json(e)}
                     for t, e, s in zip(pool.tasks, extractions, sources)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
    os.replace(tmp, path)


def load_extractions(path: str | os.PathLike, pool: Pool) -> list[Extraction]:
    """Read :func:`save_extractions`' file for ``pool``; an error names the file and what does
    not match (another pool, a missing or extra task, a malformed record)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the extraction file ({err})") from None
    if not isinstance(doc, dict) or "tasks" not in doc:
        raise ValueError(f"{path}: not an extraction file (no 'tasks')")
    if doc.get("pool_hash") != pool.content_hash():
        raise ValueError(f"{path}: extracted from pool {doc.get('pool')!r} with hash "
                         f"{str(doc.get('pool_hash'))[:12]}..., not this pool {pool.name!r} "
                         f"({pool.content_hash()[:12]}...)")
    records = doc["tasks"]
    ids = [r.get("task_id") for r in records]
    if ids != [t.task_id for t in pool.tasks]:
        raise ValueError(f"{path}: task ids do not match the pool's, in order")
    out = []
    for k, r in enumerate(records):
        try:
            out.append(extraction_from_json(r["extraction"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: record {k + 1} (task {ids[k]!r}): malformed extraction "
                             f"({type(err).__name__}: {err})") from None
    return out
