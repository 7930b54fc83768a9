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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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
# Environment-level analysis (cached per class source)


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
    control: bool = False           # hands the conversation over or ends it (module docstring)


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


# Control tools: the name hands the conversation to someone else or ends it.
_HANDOFF_VERBS = frozenset({"transfer", "escalate", "handoff", "handover", "hand", "forward", "route",
                            "connect", "redirect"})
_HANDOFF_TARGETS = frozenset({"human", "humans", "agent", "agents", "supervisor", "supervisors",
                              "operator", "operators", "representative", "representatives", "rep",
                              "reps", "live"})
_END_VERBS = frozenset({"end", "terminate", "finish", "close", "stop", "quit", "exit", "conclude",
                        "done"})
_CONVERSATION = frozenset({"conversation", "session", "chat", "episode", "task", "dialog", "dialogue",
                           "interaction", "call"})
_FILLER = frozenset({"to", "the", "a", "an", "this", "current", "with", "off", "over"})


def _is_control_name(name: str) -> bool:
    words = split_identifier(name)
    if not words:
        return False
    vocabulary = set(words)
    if vocabulary & _HANDOFF_VERBS and vocabulary <= _HANDOFF_VERBS | _HANDOFF_TARGETS | _CONVERSATION | _FILLER:
        bare_handoff = ("handoff" in vocabulary or "handover" in vocabulary
                        or ("hand" in vocabulary and vocabulary & {"off", "over"}))
        return bool(vocabulary & (_HANDOFF_TARGETS | _CONVERSATION)) or bare_handoff
    if vocabulary & _END_VERBS and vocabulary <= _END_VERBS | _CONVERSATION | _FILLER:
        return bool(vocabulary & _CONVERSATION) or len(words) == 1
    return False


class _Ref(NamedTuple):
    """What an expression may refer to (flow-insensitively): ``obj`` the roots of the object
    itself, ``elem`` the roots of the elements of a fresh container built from such objects
    (``[o for o in self.orders.values()]``: appending to it writes nothing, writing into one of
    its elements writes ``orders``). A root is a ``self`` attribute name or ``@p`` for parameter
    ``p`` of the method (bound at each call site)."""

    obj: frozenset[str] = frozenset()
    elem: frozenset[str] = frozenset()


_NOTHING = _Ref()


def _union(refs: Iterable[_Ref]) -> _Ref:
    obj: set[str] = set()
    elem: set[str] = set()
    for r in refs:
        obj |= r.obj
        elem |= r.elem
    return _Ref(frozenset(obj), frozenset(elem))


def _element(r: _Ref) -> _Ref:
    """A part of ``r`` (subscript, attribute, iteration item, ``.get``/``.values()`` result)."""
    return _Ref(r.obj | r.elem) if r.elem else r


def _fresh(r: _Ref) -> _Ref:
    """A new container holding ``r``'s object or its elements (``list(x)``, ``x.copy()``)."""
    return _Ref(frozenset(), r.obj | r.elem)


_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
             "setdefault", "popitem", "sort", "reverse", "__setitem__", "__delitem__"}
# Methods whose result is a new object sharing nothing with the receiver, or a copy of it.
_NON_ALIASING = {"keys", "count", "index", "__len__", "__contains__"}
_COPYING = {"copy"}
# Builtins returning a new container of their argument's elements, or one element of it.
_CONTAINER_CALLS = {"list", "tuple", "set", "frozenset", "dict", "sorted", "reversed", "filter",
                    "iter", "enumerate", "zip"}
_ELEMENT_CALLS = {"next", "max", "min"}
_MAX_ALIAS_PASSES = 12
_MAX_SUMMARY_PASSES = 32


@dataclasses.dataclass
class _MethodAst:
    """What the analysis reads of one method, gathered once per class source."""

    positional: tuple[str, ...]     # parameters a call binds by position (self excluded)
    keyword: tuple[str, ...]        # keyword-only parameters
    vararg: str | None
    kwarg: str | None
    is_property: bool
    bindings: list[tuple[ast.expr, ast.expr, bool]]  # (target, value, target is an element of value)
    mutated: list[ast.expr]         # objects changed in place (``x`` of ``x[k] = v``, ``x.append``)
    attr_writes: list[tuple[str, bool]]  # direct ``self.X = ...``: (X, value is a bool/None constant)
    self_calls: list[tuple[str, ast.Call]]  # ``self.m(...)`` of methods of the source
    returns: list[ast.expr]
    guards: list[ast.If]            # ``if`` statements whose body returns a failure
    depends: bool                   # reads another method's summary (calls or properties)


class _Summary(NamedTuple):
    writes: frozenset[str] = frozenset()   # roots written other than flag constants
    flags: frozenset[str] = frozenset()    # self attributes set to a bool/None constant
    returns: _Ref = _NOTHING


class _MethodFacts(NamedTuple):
    writes: frozenset[str]          # self attributes written, directly or through helpers
    flags: frozenset[str]           # those of them only ever set to a bool/None constant
    guards: frozenset[str]


_NO_FACTS = _MethodFacts(frozenset(), frozenset(), frozenset())


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


def _is_flag_value(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool))


def _constant_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _self_names(bindings: Sequence[tuple[ast.expr, ast.expr, bool]]) -> frozenset[str]:
    """``self`` and the local names bound to it (``s = self``)."""
    names = {"self"}
    for _ in range(3):
        for target, value, element in bindings:
            if (not element and isinstance(target, ast.Name) and isinstance(value, ast.Name)
                    and value.id in names):
                names.add(target.id)
    return frozenset(names)


def _gather(fn: ast.FunctionDef, method_names: frozenset[str]) -> _MethodAst:
    decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in fn.decorator_list}
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    if "staticmethod" not in decorators:
        positional = positional[1:]
    nodes = list(ast.walk(fn))
    bindings: list[tuple[ast.expr, ast.expr, bool]] = []
    for node in nodes:
        if isinstance(node, ast.Assign):
            bindings.extend((t, node.value, False) for t in node.targets)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            bindings.append((node.target, node.value, False))
        elif isinstance(node, ast.NamedExpr):
            bindings.append((node.target, node.value, False))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bindings.append((node.target, node.iter, True))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            bindings.extend((item.optional_vars, item.context_expr, False) for item in node.items
                            if item.optional_vars is not None)
    selves = _self_names(bindings)

    def is_self(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in selves

    mutated: list[ast.expr] = []
    attr_writes: list[tuple[str, bool]] = []
    self_calls: list[tuple[str, ast.Call]] = []
    returns: list[ast.expr] = []
    guards: list[ast.If] = []
    depends = False

    def store(target: ast.expr, value: ast.AST | None) -> None:
        """A store into ``target``; rebinding a plain local name is not a write to state."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                store(t, None)
        elif isinstance(target, ast.Starred):
            store(target.value, None)
        elif isinstance(target, ast.Attribute) and is_self(target.value):
            attr_writes.append((target.attr, _is_flag_value(value)))
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            mutated.append(target.value)

    for node in nodes:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                store(t, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            store(node.target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.Delete)):
            for t in (node.targets if isinstance(node, ast.Delete) else [node.target]):
                store(t, None)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and is_self(func.value):
                if func.attr in method_names:
                    self_calls.append((func.attr, node))
            elif isinstance(func, ast.Attribute) and func.attr in _MUTATORS:
                mutated.append(func.value)
            elif (isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and len(node.args) >= 2):
                attr = _constant_str(node.args[1])
                if is_self(node.args[0]):
                    if attr is not None:
                        value = node.args[2] if func.id == "setattr" and len(node.args) > 2 else None
                        attr_writes.append((attr, _is_flag_value(value)))
                else:
                    mutated.append(node.args[0])
        elif isinstance(node, ast.Return) and node.value is not None:
            returns.append(node.value)
        elif isinstance(node, ast.If) and _returns_failure(node.body):
            guards.append(node)
        if isinstance(node, ast.Attribute) and is_self(node.value) and node.attr in method_names:
            depends = True
    return _MethodAst(tuple(positional), tuple(p.arg for p in a.kwonlyargs),
                      a.vararg.arg if a.vararg else None, a.kwarg.arg if a.kwarg else None,
                      "property" in decorators, bindings, mutated, attr_writes, self_calls, returns,
                      guards, depends)


class _Evaluator:
    """Alias resolution inside one method, given the current summaries of the others."""

    def __init__(self, method: _MethodAst, methods: Mapping[str, _MethodAst],
                 summaries: Mapping[str, _Summary]):
        self.methods = methods
        self.summaries = summaries
        params = [*method.positional, *method.keyword, method.vararg, method.kwarg]
        self.env: dict[str, _Ref] = {p: _Ref(frozenset({"@" + p})) for p in params if p}
        self.selves = _self_names(method.bindings)
        self.changed = False
        for _ in range(_MAX_ALIAS_PASSES):
            self.changed = False
            for target, value, element in method.bindings:
                self.bind(target, value, element)
            if not self.changed:
                break

    def is_self(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in self.selves

    # Expressions -------------------------------------------------------------------------------
    def ref(self, node: ast.AST) -> _Ref:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, _NOTHING)
        if isinstance(node, ast.Attribute):
            if self.is_self(node.value):
                method = self.methods.get(node.attr)
                if method is None:
                    return _Ref(frozenset({node.attr}))
                return self.summaries[node.attr].returns if method.is_property else _NOTHING
            return _element(self.ref(node.value))
        if isinstance(node, ast.Subscript):
            inner = self.ref(node.value)
            return _fresh(inner) if isinstance(node.slice, ast.Slice) else _element(inner)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BoolOp):
            return _union([self.ref(v) for v in node.values])
        if isinstance(node, ast.IfExp):
            return _union([self.ref(node.body), self.ref(node.orelse)])
        if isinstance(node, (ast.NamedExpr, ast.Starred, ast.Await)):
            return self.ref(node.value)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return _fresh(_union([self.ref(e) for e in node.elts]))
        if isinstance(node, ast.Dict):
            return _fresh(_union([self.ref(v) for v in node.values]))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return _fresh(self.ref(node.elt))
        if isinstance(node, ast.DictComp):
            return _fresh(self.ref(node.value))
        return _NOTHING

    def call(self, node: ast.Call) -> _Ref:
        func = node.func
        if isinstance(func, ast.Attribute):
            if self.is_self(func.value):
                if func.attr not in self.methods:  # an attribute holding a callable, or inherited
                    return _NOTHING
                binding = self.binding(self.methods[func.attr], node)
                returns = self.summaries[func.attr].returns
                return _Ref(_substitute(returns.obj, binding), _substitute(returns.elem, binding))
            if func.attr in _NON_ALIASING:
                return _NOTHING
            base = self.ref(func.value)
            return _fresh(base) if func.attr in _COPYING else _element(base)
        if isinstance(func, ast.Name):
            if func.id == "getattr" and len(node.args) >= 2 and self.is_self(node.args[0]):
                attr = _constant_str(node.args[1])
                return _Ref(frozenset({attr})) if attr is not None and attr not in self.methods else _NOTHING
            if func.id in _CONTAINER_CALLS:
                return _fresh(_union([self.ref(a) for a in node.args]))
            if func.id in _ELEMENT_CALLS:
                return _element(_union([self.ref(a) for a in node.args]))
        return _NOTHING

    def binding(self, callee: _MethodAst, node: ast.Call) -> dict[str, _Ref]:
        """Parameter of ``callee`` -> what the call site passes (a ``*``/``**`` argument may reach
        every parameter not bound otherwise)."""
        out: dict[str, _Ref] = {}
        extra: list[_Ref] = []
        spread: list[_Ref] = []
        for k, arg in enumerate(node.args):
            r = self.ref(arg)
            if isinstance(arg, ast.Starred):
                spread.append(_element(r))
            elif k < len(callee.positional):
                out[callee.positional[k]] = r
            else:
                extra.append(r)
        if callee.vararg and extra:
            out[callee.vararg] = _fresh(_union(extra))
        named = set(callee.positional) | set(callee.keyword)
        for kw in node.keywords:
            r = self.ref(kw.value)
            if kw.arg is None:
                spread.append(_element(r))
            elif kw.arg in named:
                out[kw.arg] = r
            elif callee.kwarg:
                out[callee.kwarg] = _union([out.get(callee.kwarg, _NOTHING), _fresh(r)])
        if spread:
            reached = _union(spread)
            for p in (*callee.positional, *callee.keyword, callee.vararg, callee.kwarg):
                if p and p not in out:
                    out[p] = reached
        return out

    # Bindings ----------------------------------------------------------------------------------
    def bind(self, target: ast.expr, value: ast.expr, element: bool) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            parts = self.parts(value, element)
            if parts is not None and self.bind_parts(target.elts, parts):
                return
        r = self.ref(value)
        self.bind_ref(target, _element(r) if element else r)

    def parts(self, value: ast.expr, element: bool) -> list[tuple[ast.expr, bool] | _Ref] | None:
        """Per-position sources of an unpacked value when its shape is visible."""
        if not element:
            if isinstance(value, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in value.elts):
                return [(e, False) for e in value.elts]
            return None
        if isinstance(value, ast.Call):
            func = value.func
            if isinstance(func, ast.Attribute) and func.attr == "items" and not value.args:
                return [_NOTHING, _element(self.ref(func.value))]
            if isinstance(func, ast.Name) and func.id == "enumerate" and value.args:
                return [_NOTHING, _element(self.ref(value.args[0]))]
            if isinstance(func, ast.Name) and func.id == "zip" and not any(isinstance(a, ast.Starred) for a in value.args):
                return [_element(self.ref(a)) for a in value.args]
        return None

    def bind_parts(self, targets: Sequence[ast.expr], parts: Sequence[tuple[ast.expr, bool] | _Ref]) -> bool:
        starred = [k for k, t in enumerate(targets) if isinstance(t, ast.Starred)]
        if not starred:
            if len(targets) != len(parts):
                return False
            pairs = list(zip(targets, parts))
        else:
            k = starred[0]
            after = len(targets) - k - 1
            if len(starred) > 1 or len(parts) < len(targets) - 1:
                return False
            middle = parts[k:len(parts) - after]
            rest = _union([p if isinstance(p, _Ref) else self.ref(p[0]) for p in middle])
            self.bind_ref(targets[k].value, _fresh(rest))
            pairs = list(zip(targets[:k], parts[:k])) + list(zip(targets[k + 1:], parts[len(parts) - after:]))
        for target, source in pairs:
            if isinstance(source, _Ref):
                self.bind_ref(target, source)
            else:
                self.bind(target, *source)
        return True

    def bind_ref(self, target: ast.expr, r: _Ref) -> None:
        if isinstance(target, ast.Name):
            old = self.env.get(target.id, _NOTHING)
            new = _Ref(old.obj | r.obj, old.elem | r.elem)
            if new != old:
                self.env[target.id] = new
                self.changed = True
        elif isinstance(target, ast.Starred):
            self.bind_ref(target.value, _fresh(r))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind_ref(t, _element(r))

    def reads_state(self, node: ast.AST) -> bool:
        """Whether ``node`` reads ``self`` or a local alias of its state."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                if sub.id in self.selves:
                    return True
                r = self.env.get(sub.id, _NOTHING)
                if any(not root.startswith("@") for root in r.obj | r.elem):
                    return True
        return False


def _substitute(roots: frozenset[str], binding: Mapping[str, _Ref]) -> frozenset[str]:
    """Roots of a callee in the caller's terms: parameter ``@p`` -> what the call passes for p
    (its object or anything reached through it)."""
    if not any(r.startswith("@") for r in roots):
        return roots
    out: set[str] = set()
    for root in roots:
        if root.startswith("@"):
            bound = binding.get(root[1:], _NOTHING)
            out |= bound.obj | bound.elem
        else:
            out.add(root)
    return frozenset(out)


def _summarise(method: _MethodAst, methods: Mapping[str, _MethodAst],
               summaries: Mapping[str, _Summary]) -> tuple[_Summary, _Evaluator]:
    ev = _Evaluator(method, methods, summaries)
    writes: set[str] = set()
    flags: set[str] = set()
    for attr, flag in method.attr_writes:
        (flags if flag else writes).add(attr)
    for obj in method.mutated:
        writes |= ev.ref(obj).obj
    for name, node in method.self_calls:
        callee = summaries[name]
        writes |= _substitute(callee.writes, ev.binding(methods[name], node))
        flags |= callee.flags
    returns = _union([ev.ref(r) for r in method.returns])
    return _Summary(frozenset(writes), frozenset(flags), returns), ev


def _guard_kinds(method: _MethodAst, ev: _Evaluator) -> frozenset[str]:
    guards: set[str] = set()
    for node in method.guards:
        cond = _words(node.test)
        if _AUTH_WORDS.search(cond):
            guards.add("actor_authorization")
        elif _CAPACITY_WORDS.search(cond):
            guards.add("capacity_or_eligibility")
        elif ev.reads_state(node.test):  # a guard on arguments alone is input validation, not a gate
            guards.add("state_precondition")
    return frozenset(guards)


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
def _analyse_source(source: str | None) -> dict[str, _MethodFacts]:
    """Writes, flag writes and guards of every method of the classes in ``source``: local alias
    resolution per method, then a fixpoint of method summaries (what each writes, directly or
    through parameters, and what it returns) over ``self.m(...)`` calls."""
    bodies = _method_bodies(source)
    names = frozenset(bodies)
    methods = {name: _gather(fn, names) for name, fn in bodies.items()}
    summaries = {name: _Summary() for name in methods}
    evaluators: dict[str, _Evaluator] = {}
    pending = list(methods)
    for _ in range(_MAX_SUMMARY_PASSES):
        changed = False
        for name in pending:
            summary, evaluators[name] = _summarise(methods[name], methods, summaries)
            old = summaries[name]
            merged = _Summary(old.writes | summary.writes, old.flags | summary.flags,
                              _union([old.returns, summary.returns]))
            if merged != old:
                summaries[name] = merged
                changed = True
        if not changed:
            break
        pending = [name for name, m in methods.items() if m.depends]
    out: dict[str, _MethodFacts] = {}
    for name, method in methods.items():
        s = summaries[name]
        writes = frozenset(r for r in s.writes if not r.startswith("@"))
        out[name] = _MethodFacts(writes | s.flags, s.flags - writes, _guard_kinds(method, evaluators[name]))
    return out


def _bookkeeping(tools: Mapping[str, _MethodFacts], names: Sequence[str]) -> frozenset[str]:
    """Attributes written by every tool, lookups included: a call log or audit trail (BFCL's
    composite appends each call to ``call_log``), not evidence of a state change."""
    if len(names) < 2 or any(n not in tools for n in names):
        return frozenset()
    common = frozenset.intersection(*(tools[n].writes for n in names))
    if common and any(_family_from_name(n) in _QUERY_FAMILIES for n in names):
        return common
    return frozenset()


def analyse_environment(env: Environment) -> dict[str, ToolInfo]:
    """Family, state-changing flag, parameters, writes, guards and control flag of every tool of
    ``env``."""
    methods = _analyse_source(env.class_source)
    declared = {op.name: op.kind for op in env.operations}
    schemas = [(tool_name(schema), tool_function(schema)) for schema in env.tools]
    bookkeeping = _bookkeeping(methods, [name for name, _ in schemas])
    out: dict[str, ToolInfo] = {}
    for name, fn in schemas:
        params_schema = fn.get("parameters") or {}
        params = tuple((params_schema.get("properties") or {}).keys())
        required = tuple(params_schema.get("required") or ())
        facts = methods.get(name, _NO_FACTS)
        writes = facts.writes - bookkeeping
        # A hand-off or end-of-conversation tool that sets at most flags changes no record.
        control = _is_control_name(name) and writes <= facts.flags
        family = _family_from_name(name)
        if name in declared:
            changing = declared[name] == "state_change"
            control = control and not changing
        else:
            # Writes to self prove a change; a method with none (for instance a generated method
            # that delegates to another object, as BFCL's composite does) is judged by its verb.
            changing = not control and (bool(writes) or family not in _QUERY_FAMILIES | {"other", "authorize"})
        if control:
            family = "other"
        elif changing and family in _QUERY_FAMILIES | {"other"}:
            family = "update"
        elif not changing and family not in _QUERY_FAMILIES | {"authorize"}:
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
        out[name] = ToolInfo(name, family, changing, params, required, writes, facts.guards,
                             lookup_kind, control)
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
    control: bool = False  # from a control tool (hand-off / end of conversation)


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
            if op.control:
                kind = "control"
            elif op.family == "lookup":
                kind = op.lookup_kind
            else:
                kind = "entity_field" if op.state_changing else "query"
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
                                          arg_types, deps, info.state_changing, info.control))
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
