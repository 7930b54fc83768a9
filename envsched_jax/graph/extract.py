"""Static operation extraction and the appendix-E abstraction.

The paper has an LLM read each task (instruction, initial state, verifier checks, tool catalog and
implementations) and return operations, gates, dependencies, reward groups and conflicts with fixed
enums (appendix E), which a deterministic procedure then abstracts. This module is the
deterministic, LLM-free counterpart: it derives the same structure from the tool catalog, the
instruction and the Python AST of the environment class and of the verifier code. Its output fills
the same enums, so an LLM extractor can replace it later without changing anything downstream.

How each part is derived (choices the paper leaves to the LLM, documented here):

- **Operation family** of a tool: from the verbs of its name (``get_patient_by_name`` -> lookup,
  ``transfer_patient`` -> link, ``mkdir`` -> create); a tool the environment lists as
  ``state_change``, or whose method body writes to ``self``, is state-changing, and a
  state-changing tool with a query verb becomes ``update``.
- **Operations of a task**: the tools of its reference action sequence when the pool supplies one
  (the minimum correct plan the prompt asks for); otherwise the state-changing tools whose written
  attributes are read by the verifier checks, plus tools whose name words appear in the
  instruction (a lookup is added when ids must be resolved).
- **Gates**: identifier resolution (an operation takes an id argument that the instruction does
  not state), state precondition / capacity-or-eligibility / actor authorization (the operation's
  implementation returns a failure under a guard that reads state, a count or limit, or a role or
  permission), temporal conversion (dates or times in the instruction), generated identifier (an
  operation consumes what an earlier ``create`` produced), tool affordance (a needed tool that is
  withheld, as in BFCL's missing-function tasks).
- **Reward groups**: verifier checks that read the same record (first two subscript keys of
  ``final_state``) form one ``shared_operation`` group; a check that compares final state with
  ``initial_state`` for equality is ``initially_satisfied``; the rest are ``independent``.
- **Conflicts**: ``order`` when a validate/authorize operation precedes a state change,
  ``destructive`` when a delete precedes another operation.

Abstraction (appendix E, steps 1-5): tool names become their family, identifiers and field names
are dropped, literals become ``<string>``/``<int>``/``<float>``/``<bool>``/``<null>``, and the
dependency structure, gate types and group relations are kept. The abstract string is built from
enum values and placeholders only, so no identifier can leak into it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from envsched_jax.pool.model import Environment, Task, tool_function, tool_name

OPERATION_FAMILIES = ("aggregate", "authorize", "create", "delete", "link", "lookup", "other",
                      "report", "schedule", "transition", "update", "validate")
GATE_TYPES = ("actor_authorization", "argument_exactness", "capacity_or_eligibility",
              "cross_entity_join", "generated_identifier", "identifier_resolution", "ordering",
              "other", "state_precondition", "temporal_conversion", "termination_horizon",
              "tool_affordance")
PROVENANCES = ("agent_generated", "broad_lookup", "inferred", "none", "prior_tool_output",
               "task_literal", "unavailable", "unique_lookup", "unknown", "wall_clock")
GROUP_RELATIONS = ("fixed_unreachable", "independent", "initially_satisfied", "mixed",
                   "shared_gate", "shared_operation")
CONFLICT_KINDS = ("destructive", "mutual_exclusion", "order", "preservation")

# Verb -> family. The first word of a tool name that is in this table decides its family.
_VERBS: dict[str, str] = {}
for _family, _words in {
    "lookup": "get find lookup search retrieve read fetch show view list query browse locate ls "
              "cat grep pwd cd head tail du wc display check_status inspect",
    "validate": "check verify validate is has can test confirm ensure diff compare",
    "authorize": "authorize authorise authenticate login logout permit permission auth grant_access",
    "create": "create add register new insert book open issue make mkdir touch post submit file "
              "generate reserve enroll enrol schedule_new place log record",
    "delete": "delete remove cancel discharge revoke drop rm rmdir unregister withdraw purge "
              "unenroll evict terminate",
    "update": "update set change modify edit rename mark adjust increase decrease replace fill "
              "refill reset toggle lock unlock start stop",
    "link": "assign transfer move reassign link attach mv cp copy allocate relocate swap "
            "unassign detach associate",
    "schedule": "schedule reschedule plan postpone",
    "transition": "approve reject activate deactivate suspend complete close resolve escalate "
                  "confirm_booking checkout checkin return release renew process",
    "aggregate": "count sum total average calculate compute mean max min sort",
    "report": "report summarize summarise export print send notify message respond echo",
}.items():
    for _w in _words.split():
        _VERBS.setdefault(_w, _family)

_QUERY_FAMILIES = frozenset({"lookup", "validate", "aggregate", "report"})
_AUTH_WORDS = re.compile(r"role|permission|authori[sz]|admin|privilege|access_level|clearance|is_staff",
                         re.I)
_CAPACITY_WORDS = re.compile(r"capacity|limit|max|quota|stock|available|eligib|\blen\b|count|seats|"
                             r"balance|remaining|full", re.I)
_DATE_WORDS = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}\b|\b(?:monday|tuesday|wednesday|"
                         r"thursday|friday|saturday|sunday|tomorrow|yesterday|today|next week|"
                         r"january|february|march|april|may|june|july|august|september|october|"
                         r"november|december)\b", re.I)
_ID_PARAM = re.compile(r"(?:^|_)(?:id|ids|key|code|number|no)$", re.I)


def split_identifier(name: str) -> list[str]:
    """``getPatientByName`` / ``get_patient_by_name`` -> ``["get", "patient", "by", "name"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


# ---------------------------------------------------------------------------------------------
# Environment-level analysis (cached per environment)


@dataclasses.dataclass(frozen=True)
class ToolInfo:
    name: str
    family: str
    state_changing: bool
    params: tuple[str, ...]
    required: tuple[str, ...]
    writes: frozenset[str]          # self attributes the implementation writes
    guard_kinds: frozenset[str]     # gate types its failure guards imply
    lookup_kind: str                # entity_by_name / entity_by_id / entity_list / none


def _family_from_name(name: str) -> str:
    words = split_identifier(name)
    for k in range(len(words)):
        joined = "_".join(words[: k + 1])
        if joined in _VERBS and k:
            return _VERBS[joined]
    for w in words:
        if w in _VERBS:
            return _VERBS[w]
    return "other"


def _method_bodies(source: str | None) -> dict[str, ast.FunctionDef]:
    if not source:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.setdefault(item.name, item)
    return out


_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
             "setdefault", "popitem"}


def _root(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """Attribute X when ``node`` is ``self.X[...]...`` or a local alias of (part of) ``self.X``."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def _aliases(nodes: Sequence[ast.AST]) -> dict[str, str]:
    """Local names bound to parts of ``self`` state (``p = self.projects[pid]``,
    ``for other in self.projects.values()``), so that writes through them count as writes."""
    aliases: dict[str, str] = {}
    bindings = [(node.value, node.targets) if isinstance(node, ast.Assign) else (node.iter, [node.target])
                for node in nodes if isinstance(node, (ast.Assign, ast.For, ast.comprehension))]
    for _ in range(2):  # a second pass catches aliases of aliases
        for value, targets in bindings:
            root = _root(value, aliases)
            if root is None:
                continue
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        aliases[name.id] = root
    return aliases


def _words(node: ast.AST) -> str:
    """Names, attribute names, string constants and ``False``/``None`` of a small subtree, as one
    lower-case string: the evidence the guard classification reads (cheaper than unparsing)."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.append(sub.attr)
        elif isinstance(sub, ast.Constant) and (isinstance(sub.value, (str, bool)) or sub.value is None):
            out.append(str(sub.value))
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not):
            out.append("not")
    return " ".join(out).lower()


def _analyse_method(fn: ast.FunctionDef) -> tuple[frozenset[str], frozenset[str]]:
    """(attributes written, gate kinds of failure guards) of one method."""
    nodes = list(ast.walk(fn))
    aliases = _aliases(nodes)
    writes: set[str] = set()
    guards: set[str] = set()
    for node in nodes:
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            # Rebinding a plain local name is not a write to state.
            targets = [t for t in targets if not isinstance(t, ast.Name)]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        for target in targets:
            root = _root(target, aliases)
            if root is not None:
                writes.add(root)
        if isinstance(node, ast.If) and _returns_failure(node.body):
            cond = _words(node.test)
            reads_state = any(_root(sub, aliases) is not None for sub in ast.walk(node.test)
                              if isinstance(sub, (ast.Name, ast.Attribute, ast.Subscript)))
            if _AUTH_WORDS.search(cond):
                guards.add("actor_authorization")
            elif _CAPACITY_WORDS.search(cond):
                guards.add("capacity_or_eligibility")
            elif reads_state:  # a guard on arguments alone is input validation, not a gate
                guards.add("state_precondition")
    return frozenset(writes), frozenset(guards)


def _returns_failure(body: Sequence[ast.stmt]) -> bool:
    for stmt in body:
        if isinstance(stmt, ast.Raise):
            return True
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            text = _words(stmt.value)
            if "false" in text or "error" in text or "fail" in text or "not" in text.split():
                return True
    return False


@functools.lru_cache(maxsize=4096)
def _analyse_source(source: str | None) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    return {name: _analyse_method(fn) for name, fn in _method_bodies(source).items()}


def analyse_environment(env: Environment) -> dict[str, ToolInfo]:
    """Family, state-changing flag, parameters, writes and guards of every tool of ``env``."""
    methods = _analyse_source(env.class_source)
    declared = {op.name: op.kind for op in env.operations}
    out: dict[str, ToolInfo] = {}
    for schema in env.tools:
        fn = tool_function(schema)
        name = tool_name(schema)
        params_schema = fn.get("parameters") or {}
        params = tuple((params_schema.get("properties") or {}).keys())
        required = tuple(params_schema.get("required") or ())
        writes, guards = methods.get(name, (frozenset(), frozenset()))
        family = _family_from_name(name)
        if name in declared:
            changing = declared[name] == "state_change"
        else:
            # Writes to self prove a change; a method with none (for instance a generated method
            # that delegates to another object, as BFCL's composite does) is judged by its verb.
            changing = bool(writes) or family not in _QUERY_FAMILIES | {"other", "authorize"}
        if changing and family in _QUERY_FAMILIES | {"other"}:
            family = "update"
        if not changing and family not in _QUERY_FAMILIES | {"authorize"}:
            family = "lookup" if family in ("other", "link", "update") else family
        if family == "lookup":
            if any(p.endswith("name") or p in ("query", "keyword", "title") for p in params):
                lookup_kind = "entity_by_name"
            elif any(_ID_PARAM.search(p) for p in params):
                lookup_kind = "entity_by_id"
            else:
                lookup_kind = "entity_list"
        else:
            lookup_kind = "none"
        out[name] = ToolInfo(name, family, changing, params, required, writes, guards, lookup_kind)
    return out


# ---------------------------------------------------------------------------------------------
# Verifier-check analysis


@dataclasses.dataclass(frozen=True)
class CheckInfo:
    fields: tuple[str, ...]          # string subscript keys / .get keys, in order
    record: tuple[str, ...]          # first two keys read from final_state (entity, record)
    reads_initial: bool
    compares_initial_eq: bool
    structure: tuple[str, ...]       # AST node types and operators (concrete view 4)
    literal_types: tuple[str, ...]


def _literal_type(value: Any) -> str:
    if value is None:
        return "<null>"
    if isinstance(value, bool):
        return "<bool>"
    if isinstance(value, int):
        return "<int>"
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, str):
        return "<string>"
    return "<value>"


# Single-line string literals (no triple quotes); a check whose skeleton does not parse is
# analysed directly.
_STRING_LITERAL = re.compile(r"""(?<!['"])('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")(?!['"])""")
_PLACEHOLDER = re.compile(r"^__lit(\d+)__$")


def analyse_check(code: str) -> CheckInfo:
    """Structure, fields and record of a verifier check (from its AST).

    Checks in one pool differ mostly in their string literals (record ids, names), so the AST is
    analysed once per *skeleton* (string literals replaced by numbered placeholders) and the
    literals are put back into the fields; this makes extraction for 100,000 tasks affordable.
    """
    literals: list[str] = []

    def _swap(m: re.Match) -> str:
        literals.append(m.group(1))
        return f"'__lit{len(literals) - 1}__'"

    skeleton = _STRING_LITERAL.sub(_swap, code)
    info = _analyse_skeleton(skeleton)
    if info is None:
        return _analyse_check_ast(code)
    if not literals:
        return info

    def _restore(value: str) -> str:
        m = _PLACEHOLDER.match(value)
        if not m:
            return value
        literal = literals[int(m.group(1))]
        if "\\" not in literal:  # no escapes: the value is the text between the quotes
            return literal[1:-1]
        try:
            return str(ast.literal_eval(literal))
        except (ValueError, SyntaxError):
            return value

    return dataclasses.replace(info, fields=tuple(_restore(f) for f in info.fields),
                               record=tuple(_restore(f) for f in info.record))


@functools.lru_cache(maxsize=65536)
def _analyse_skeleton(skeleton: str) -> CheckInfo | None:
    try:
        ast.parse(skeleton)
    except SyntaxError:
        return None
    return _analyse_check_ast(skeleton)


def _analyse_check_ast(code: str) -> CheckInfo:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return CheckInfo((), (), False, False, ("SyntaxError",), ())
    fields: list[str] = []
    structure: list[str] = []
    literals: list[str] = []
    record: tuple[str, ...] = ()
    reads_initial = False
    compares_initial_eq = False
    for node in ast.walk(tree):
        if isinstance(node, ast.expr_context):
            continue
        structure.append(type(node).__name__)
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, (str, int)):
                fields.append(str(key.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                fields.append(node.args[0].value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            structure.append(f"call:{node.func.id}")
        elif isinstance(node, ast.Compare):
            structure.extend(type(op).__name__ for op in node.ops)
            if any(isinstance(op, ast.Eq) for op in node.ops) and "initial_state" in ast.unparse(node):
                compares_initial_eq = True
        elif isinstance(node, ast.Name) and node.id == "initial_state":
            reads_initial = True
        elif isinstance(node, ast.Constant):
            literals.append(_literal_type(node.value))
        if not record and isinstance(node, ast.Subscript):
            keys = _final_state_path(node)
            if keys:
                record = tuple(keys[:2])
    return CheckInfo(tuple(fields), record, reads_initial, compares_initial_eq, tuple(structure),
                     tuple(literals))


def _final_state_path(node: ast.Subscript) -> list[str]:
    """Constant keys of ``final_state[k1][k2]...`` from the outermost subscript inwards."""
    keys: list[str] = []
    cur: ast.AST = node
    while isinstance(cur, ast.Subscript):
        if isinstance(cur.slice, ast.Constant) and isinstance(cur.slice.value, (str, int)):
            keys.append(str(cur.slice.value))
        else:
            keys.append("*")
        cur = cur.value
    if isinstance(cur, ast.Name) and cur.id == "final_state":
        return [k for k in reversed(keys) if k != "*"]
    return []


# ---------------------------------------------------------------------------------------------
# Task-level extraction


@dataclasses.dataclass(frozen=True)
class OperationRecord:
    id: str
    family: str
    tool: str
    lookup_kind: str
    arg_names: tuple[str, ...]
    arg_types: tuple[str, ...]
    depends_on: tuple[str, ...]
    state_changing: bool


@dataclasses.dataclass(frozen=True)
class GateRecord:
    id: str
    type: str
    provenance: str
    affected_operations: tuple[str, ...]
    detail: str  # concrete evidence (parameter or field names); dropped by the abstraction


@dataclasses.dataclass(frozen=True)
class RewardGroup:
    id: str
    check_ids: tuple[str, ...]
    relation: str
    fields: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Extraction:
    """The structured operation description of one task (appendix E's five components)."""

    operations: tuple[OperationRecord, ...]
    gates: tuple[GateRecord, ...]
    reward_groups: tuple[RewardGroup, ...]
    conflicts: tuple[tuple[str, str, str], ...]  # (left op, right op, kind)

    def concrete_text(self) -> str:
        """The complete operation description with domain names (concrete view 6)."""
        parts = []
        for op in self.operations:
            args = " ".join(f"{n}:{t}" for n, t in zip(op.arg_names, op.arg_types))
            dep = f" after {' '.join(op.depends_on)}" if op.depends_on else ""
            parts.append(f"operation {op.family} {op.tool} {' '.join(split_identifier(op.tool))} {args}{dep}")
        for g in self.gates:
            parts.append(f"gate {g.type} {g.provenance} {g.detail}")
        for r in self.reward_groups:
            parts.append(f"group {r.relation} {len(r.check_ids)} {' '.join(r.fields)}")
        for left, right, kind in self.conflicts:
            parts.append(f"conflict {kind} {left} {right}")
        return " ; ".join(parts)

    def abstract_text(self) -> str:
        """Appendix-E abstraction: families, gate types, group relations, dependency structure
        and literal type placeholders only; no tool name, field name, identifier or value."""
        index = {op.id: k for k, op in enumerate(self.operations)}
        parts = []
        for k, op in enumerate(self.operations):
            kind = op.lookup_kind if op.family == "lookup" else ("entity_field" if op.state_changing else "query")
            deps = " ".join(f"dep_{self.operations[index[d]].family}" for d in op.depends_on if d in index)
            parts.append(f"op_{op.family} type_{kind} {' '.join(op.arg_types)} {deps}".strip())
        for g in self.gates:
            n_ops = len(g.affected_operations)
            parts.append(f"gate_{g.type} prov_{g.provenance} gate_ops_{min(n_ops, 3)}")
        for r in self.reward_groups:
            parts.append(f"group_{r.relation} group_size_{min(len(r.check_ids), 4)}")
        for left, right, kind in self.conflicts:
            fam = {op.id: op.family for op in self.operations}
            parts.append(f"conflict_{kind} {fam.get(left, 'other')}_before_{fam.get(right, 'other')}")
        return " ; ".join(parts) if parts else "op_none"


def _inferred_plan(task: Task, tools: Mapping[str, ToolInfo], checks: Sequence[CheckInfo]) -> list[tuple[str, dict]]:
    """Operations for a task without reference actions (documented in the module docstring)."""
    words = set(split_identifier(task.instruction))
    check_roots = {c.record[0] for c in checks if c.record}
    plan: list[str] = []
    changing = [t for t in tools.values() if t.state_changing and t.writes & check_roots]
    name_hits = [t for t in tools.values()
                 if len(set(split_identifier(t.name)) & words) >= max(1, min(2, len(split_identifier(t.name)) - 1))]
    for t in name_hits:
        if not t.state_changing:
            plan.append(t.name)
    for t in changing:
        if t in name_hits or not any(x.state_changing for x in name_hits):
            plan.append(t.name)
    if any(tools[n].state_changing for n in plan) and not any(tools[n].family == "lookup" for n in plan):
        lookups = [t for t in tools.values() if t.family == "lookup"]
        if lookups:
            best = max(lookups, key=lambda t: len(set(split_identifier(t.name)) & words))
            plan.insert(0, best.name)
    seen: set[str] = set()
    return [(n, {}) for n in plan if not (n in seen or seen.add(n))]


def extract(env: Environment, task: Task, tools: Mapping[str, ToolInfo] | None = None) -> Extraction:
    """Structured operation description of ``task`` (see the module docstring)."""
    tools = tools if tools is not None else analyse_environment(env)
    checks = [analyse_check(c.code) for c in task.checks]
    instruction = " ".join([task.instruction, *task.user_turns])
    if task.reference_actions:
        plan = [(a.name, dict(a.arguments)) for a in task.reference_actions
                if a.name in tools][:30]
    else:
        plan = _inferred_plan(task, tools, checks)

    operations: list[OperationRecord] = []
    last_producer: str | None = None
    last_create: int | None = None
    for k, (name, args) in enumerate(plan):
        info = tools[name]
        arg_names = tuple(args) if args else info.required
        arg_types = tuple(_literal_type(args[a]) if a in args else "<value>" for a in arg_names)
        consumes = info.state_changing or info.family in ("validate", "authorize")
        deps = (last_producer,) if last_producer is not None and consumes else ()
        operations.append(OperationRecord(f"o{k}", info.family, name, info.lookup_kind, arg_names,
                                          arg_types, deps, info.state_changing))
        if info.family in ("lookup", "create"):
            last_producer = f"o{k}"
        if info.family == "create":
            last_create = k

    gates: list[GateRecord] = []

    def add_gate(gtype: str, provenance: str, ops: Sequence[str], detail: str) -> None:
        gates.append(GateRecord(f"g{len(gates)}", gtype, provenance, tuple(ops), detail))

    for k, op in enumerate(operations):
        info = tools[op.tool]
        args = plan[k][1]
        for a in op.arg_names:
            if not _ID_PARAM.search(a):
                continue
            value = args.get(a)
            if value is not None and str(value) and str(value) in instruction:
                continue
            earlier = [o for o in operations[:k] if o.family in ("lookup", "create")]
            if any(o.family == "create" for o in earlier):
                prov = "prior_tool_output"
            elif any(o.lookup_kind == "entity_list" for o in earlier):
                prov = "broad_lookup"
            elif earlier:
                prov = "unique_lookup"
            else:
                prov = "unknown"
            add_gate("identifier_resolution", prov, [op.id], a)
        for gtype in sorted(info.guard_kinds):
            if info.state_changing:
                add_gate(gtype, "none", [op.id], op.tool)
        if last_create is not None and k > last_create and op.state_changing and op.family != "create":
            add_gate("generated_identifier", "prior_tool_output", [op.id], op.tool)
    if _DATE_WORDS.search(instruction):
        add_gate("temporal_conversion", "task_literal", [o.id for o in operations if o.state_changing],
                 "date")
    missing = task.metadata.get("missed_function") if isinstance(task.metadata, Mapping) else None
    if missing:
        names = sorted({n for v in (missing.values() if isinstance(missing, Mapping) else [missing])
                        for n in (v if isinstance(v, list) else [v])})
        add_gate("tool_affordance", "unavailable", [o.id for o in operations if o.tool in names],
                 " ".join(map(str, names)))

    groups: list[RewardGroup] = []
    by_record: dict[tuple[str, ...], list[int]] = {}
    for k, c in enumerate(checks):
        if c.compares_initial_eq:
            groups.append(RewardGroup(f"r{len(groups)}", (f"c{k}",), "initially_satisfied",
                                      tuple(dict.fromkeys(c.fields))[:4]))
        elif c.record:
            by_record.setdefault(c.record, []).append(k)
        else:
            groups.append(RewardGroup(f"r{len(groups)}", (f"c{k}",), "independent",
                                      tuple(dict.fromkeys(c.fields))[:4]))
    for record, members in by_record.items():
        relation = "shared_operation" if len(members) > 1 else "independent"
        fields = tuple(dict.fromkeys(f for m in members for f in checks[m].fields))[:6]
        groups.append(RewardGroup(f"r{len(groups)}", tuple(f"c{m}" for m in members), relation, fields))

    conflicts: list[tuple[str, str, str]] = []
    for a_idx, a in enumerate(operations):
        for b in operations[a_idx + 1:]:
            if a.family in ("validate", "authorize") and b.state_changing:
                conflicts.append((a.id, b.id, "order"))
                break
            if a.family == "delete" and b.id != a.id:
                conflicts.append((a.id, b.id, "destructive"))
                break
    return Extraction(tuple(operations), tuple(gates), tuple(groups), tuple(conflicts[:20]))
