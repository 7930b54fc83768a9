"""Environment evolution (seeds/002, section 4.2 and appendix C): (E_t, y_t, V_t) -> (E_t+1, y_t+1, V_t+1).

An evolver turns a workspace E_t with its reference outcome y_t and rubric V_t into a variant
under the byte-identical request: new files (causally linked events: notices, errata, memos),
a recomputed reference y_t+1 and a revised rubric V_t+1. Every variant carries at least three
**counter-default decision points** (:class:`DecisionPoint`), each pairing a plausible wrong
choice with the evidence that resolves it and a rubric check that rejects it.

:func:`validate` is the paper's validation, all deterministic:

- structural: every file path and evidence path exists, every check compiles and defines
  ``check_func``, the request is byte-identical, the seed's files are unchanged (evolution adds
  files; it never edits sources);
- answer: the new reference passes every check of V_t+1 and the previous expected output y_t
  fails at least one;
- decision points: at least ``min_points``, each one's wrong choice fails its own check;
- evidence chain (:func:`evidence_chain`) no shorter than the seed's;
- shortcut audit: no added file states the new answer's value in any of its usual spellings, or
  quotes a rubric check's text (a conclusion that would let an agent skip the reasoning).

:class:`HeuristicEvolver` is the offline, deterministic evolver, for workspaces whose reference
``value`` is a number (every numeric kind of :mod:`.generator`); others are refused with a named
reason (an LLM evolver behind :mod:`.roles` is the route for them). Its four decision-point
kinds are the paper's (effective dates, exclusions, exception rules, numerical recalculation):

- ``recalculation``: an erratum states that the authoritative record misstated one amount by
  +-delta (the delta, never the corrected total, is written): wrong choice = the figure as
  recorded.
- ``exclusion``: a memo orders a one-off amount excluded from the reported figure: wrong choice
  = the figure with it included.
- ``exception_rule``: an exclusion memo names this subject's record, and a later policy note
  exempts the record from it: wrong choice = applying the void exclusion.
- ``effective_date``: a revision notice restates the figure with an effective date after every
  file of the workspace ("not yet in effect"): wrong choice = the revised figure.

The reference ``source`` stays the authoritative record (the figure is derived from it).

:func:`paired_evaluation` runs agents on seed and variant under identical settings and aggregates
as appendix C.1: Delta_{i,m} = 100 (p_evolved - p_seed), h_i = sum_m 1{Delta_{i,m} <= -20}, means
over pairs with nonzero seed success.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from envsched_jax.envs.runtime import core as runtime_core
from envsched_jax.pool.model import Check
from envsched_jax.rethink.generator import check_code
from envsched_jax.rethink.workspace import FileLabel, Workspace, WorkspaceError, WorkspaceFile, check_relative_path

POINT_KINDS = ("recalculation", "exclusion", "exception_rule", "effective_date")
MIN_POINTS = 3
"""Section 4.2: at least three counter-default decision points per variant."""
DROP_THRESHOLD = -20.0
"""Appendix C.1: a success-rate change of at most -20 points counts as lower success."""


class EvolutionError(WorkspaceError):
    """A workspace that an evolver cannot evolve, with the reason."""


@dataclasses.dataclass(frozen=True)
class DecisionPoint:
    """A counter-default decision point: the plausible wrong choice, the evidence resolving it,
    and the check that rejects it."""

    kind: str
    wrong_value: Any
    evidence: tuple[str, ...]
    check: Check
    note: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "wrong_value": self.wrong_value, "evidence": list(self.evidence),
                "check": {"text": self.check.text, "code": self.check.code}, "note": self.note}


@dataclasses.dataclass(frozen=True)
class Validation:
    passed: bool
    failures: tuple[str, ...]
    chain_seed: int
    chain_variant: int


@dataclasses.dataclass(frozen=True)
class Variant:
    """E_t+1 (``workspace``, with V_t+1 as its rubric and y_t+1 as its reference), how it was made
    and whether it passed validation."""

    workspace: Workspace
    seed_id: str
    round: int
    points: tuple[DecisionPoint, ...]
    validation: Validation
    history: tuple[Mapping[str, Any], ...]


# ---- checks ---------------------------------------------------------------------------------

def _number_check(text: str, target: float, *, equal: bool, tolerance: float) -> Check:
    """A check on ``answer["value"]`` read as a number the way the generator's checks read it
    (:func:`~envsched_jax.rethink.generator.check_code`: "43,500", "3.45 %", "EUR 12" count), so a
    seed and its variant judge the same answer formats."""
    op = "<=" if equal else ">"
    body = f'value = _number(answer.get("value"))\nreturn value is not None and abs(value - {target!r}) {op} {tolerance!r}'
    return Check(text, check_code(body))


def value_check(target: float, tolerance: float) -> Check:
    return _number_check(f"The reported value is {_fmt(target)}.", target, equal=True, tolerance=tolerance)


def rejection_check(wrong: float, tolerance: float, why: str) -> Check:
    return _number_check(f"The reported value is not {_fmt(wrong)} ({why}).", wrong, equal=False,
                         tolerance=tolerance)


def run_rubric(checks: Sequence[Check], answer: Any, task_id: str = "rubric") -> tuple[float, list[bool]]:
    """(pass rate, per-check results) of ``answer`` as ``final_state["answer"]`` (trusted checks:
    generated ones)."""
    reward, results, _ = runtime_core.run_checks(task_id, [c.code for c in checks], {"answer": answer}, {})
    return reward, list(results)


# ---- helpers --------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:.2f}"


def spellings(value: float) -> set[str]:
    """How a number is commonly written. An ``int``: 12345, 12,345, 12 345, 12.345, 12345.00,
    12,345.00. A ``float`` (rates, amounts with cents): its decimal forms only (7.50, 7.5, 7,50),
    since a bare "7" is too common in dates and names for the audit to mean anything."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {str(value), f"{value:,}", f"{value:,}".replace(",", " "), f"{value:,}".replace(",", "."),
                f"{value:.2f}", f"{value:,.2f}"}
    out = {f"{value:.2f}", f"{value:.2f}".replace(".", ","), f"{value:,.2f}"}
    if "." in f"{value:g}":
        out.add(f"{value:g}")
    return out


def _later(time: str, days: int) -> str:
    import datetime

    t = datetime.datetime.strptime(time, "%Y-%m-%dT%H:%M:%SZ") + datetime.timedelta(days=days)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _date(time: str) -> str:
    return time[:10]


def evidence_chain(workspace: Workspace) -> int:
    """Files an agent must consult to justify the reference: the reference's ``source`` plus,
    transitively, the evidence of every labelled file reached (1 without labels)."""
    source = workspace.reference.get("source")
    labels = workspace.labels()
    if not isinstance(source, str):
        return 0
    seen, stack = set(), [source]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        label = labels.get(path)
        if label is not None:
            stack.extend(label.evidence)
    for point in workspace.metadata.get("decision_points", []):
        seen.update(point.get("evidence", []))
    return len(seen)


# ---- validation -----------------------------------------------------------------------------

def validate(seed: Workspace, variant: Workspace, points: Sequence[DecisionPoint], *,
             min_points: int = MIN_POINTS) -> Validation:
    """The checks of the module docstring; ``failures`` names each one that failed."""
    failures = []
    if variant.request.encode() != seed.request.encode():
        failures.append("structure: the request changed")
    seed_files = {f.path: f for f in seed.files}
    var_files = {f.path: f for f in variant.files}
    for path, f in seed_files.items():
        if path not in var_files:
            failures.append(f"structure: seed file {path!r} was removed")
        elif var_files[path].data != f.data or var_files[path].modified != f.modified:
            failures.append(f"structure: seed file {path!r} was modified")
    for k, check in enumerate(variant.rubric):
        try:
            namespace: dict[str, Any] = {}
            exec(compile(check.code, f"<check {k}>", "exec"), namespace)
            if not callable(namespace.get("check_func")):
                failures.append(f"structure: check {k} defines no check_func")
        except SyntaxError as err:
            failures.append(f"structure: check {k} does not compile: {err.msg}")
    for point in points:
        for path in point.evidence:
            if path not in var_files:
                failures.append(f"structure: decision point {point.kind} cites missing file {path!r}")
    source = variant.reference.get("source")
    if isinstance(source, str) and source not in var_files:
        failures.append(f"structure: the reference source {source!r} is not a file")
    reward, results = run_rubric(variant.rubric, variant.reference, variant.workspace_id)
    if reward < 1.0:
        failed = [variant.rubric[k].text for k, ok in enumerate(results) if not ok]
        failures.append(f"answer: the new reference fails {failed}")
    old_reward, _ = run_rubric(variant.rubric, seed.reference, variant.workspace_id)
    if old_reward >= 1.0:
        failures.append("answer: the previous expected output still passes every check")
    if len(points) < min_points:
        failures.append(f"points: {len(points)} decision point(s), at least {min_points} required")
    for point in points:
        wrong = dict(variant.reference, value=point.wrong_value)
        if run_rubric([point.check], wrong)[0] >= 1.0:
            failures.append(f"points: the wrong choice of {point.kind} ({point.wrong_value!r}) passes its check")
    chain_seed, chain_variant = evidence_chain(seed), evidence_chain(variant)
    if chain_variant < chain_seed:
        failures.append(f"chain: evidence chain {chain_variant} is shorter than the seed's {chain_seed}")
    failures.extend(shortcut_audit(seed, variant))
    return Validation(not failures, tuple(failures), chain_seed, chain_variant)


def shortcut_audit(seed: Workspace, variant: Workspace) -> list[str]:
    """Leaks in the files the variant added: the new value in any usual spelling, a rubric
    check's text, or an explicit answer phrase."""
    added = [f for f in variant.files if f.path not in set(seed.paths) and f.text is not None]
    value = variant.reference.get("value")
    problems = []
    forms = spellings(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else set()
    for f in added:
        text = f.text
        for form in sorted(forms):
            if _contains_number(text, form):
                problems.append(f"shortcut: {f.path!r} states the new answer ({form})")
        for check in variant.rubric:
            if len(check.text) >= 20 and check.text in text:
                problems.append(f"shortcut: {f.path!r} quotes the rubric ({check.text[:40]!r})")
        lowered = text.lower()
        for phrase in ("correct answer", "the answer is", "expected output"):
            if phrase in lowered:
                problems.append(f"shortcut: {f.path!r} says {phrase!r}")
    return problems


def _contains_number(text: str, form: str) -> bool:
    """``form`` occurs in ``text`` not as part of a longer number."""
    start = 0
    while True:
        k = text.find(form, start)
        if k < 0:
            return False
        before = text[k - 1] if k else " "
        after = text[k + len(form)] if k + len(form) < len(text) else " "
        if not (before.isdigit() or before in ".,") and not (after.isdigit() or (after in ".," and
                                                                                   text[k + len(form) + 1:k + len(form) + 2].isdigit())):
            return True
        start = k + 1


# ---- evolvers -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Proposal:
    """What an evolver proposes: files to add (with labels), the new reference, the checks
    replacing V_t, and the decision points."""

    files: tuple[WorkspaceFile, ...]
    reference: Mapping[str, Any]
    rubric: tuple[Check, ...]
    points: tuple[DecisionPoint, ...]
    notes: tuple[str, ...] = ()


class Evolver(Protocol):
    name: str

    def propose(self, workspace: Workspace, *, history: Sequence[Mapping[str, Any]],
                feedback: Sequence[str], rng: np.random.Generator) -> Proposal:
        ...


@dataclasses.dataclass(frozen=True)
class HeuristicEvolverConfig:
    num_points: int = 3
    """Decision points per variant (at least 3, section 4.2)."""
    tolerance: float = 0.01
    """Numeric tolerance of the generated checks."""

    def __post_init__(self):
        if not MIN_POINTS <= self.num_points <= len(POINT_KINDS):
            raise ValueError(f"num_points must be in [{MIN_POINTS}, {len(POINT_KINDS)}] (at least three, section "
                             f"4.2; one of each kind at most), got {self.num_points}")


class HeuristicEvolver:
    """The offline evolver of the module docstring."""

    name = "heuristic"

    def __init__(self, config: HeuristicEvolverConfig | None = None):
        self.config = config or HeuristicEvolverConfig()

    def propose(self, workspace, *, history, feedback, rng):
        value = workspace.reference.get("value")
        source = workspace.reference.get("source")
        where = f"workspace {workspace.workspace_id!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EvolutionError(f"the heuristic evolver needs a numeric reference value, got {value!r}", source=where)
        if not isinstance(source, str) or source not in workspace.paths:
            raise EvolutionError(f"the reference source {source!r} is not a file of the workspace", source=where)
        tol = self.config.tolerance
        integral = isinstance(value, int)   # counts and whole-euro amounts stay integers; rates stay decimal
        newest = max(f.modified for f in workspace.files)
        directory = workspace.file(source).directory or "notes"
        subject = workspace.file(source).name
        round_no = len(history) + 1
        tag = f"r{round_no}"
        kinds = self._kinds(rng, feedback)
        files, points = [], []
        current = value
        # Amounts are drawn relative to the value: at least 10 for integers (counts such as 18
        # reference entries would otherwise round every amount to 0), at least 0.5 for decimals.
        scale = max(abs(current), 10.0) if integral else max(abs(current), 0.5)

        def amount(lo, hi):
            x = float(rng.uniform(lo, hi)) * scale
            return int(round(x)) if integral else round(x, 2)

        def add_file(path, text, days, label):
            files.append(WorkspaceFile(path, text.encode(), _later(newest, days), label=label))
            return path

        # Draw every amount first, then compute y_t+1, then write the files: each point's wrong
        # choice is y_t+1 with that one point resolved the wrong way.
        for _ in range(50):     # redraw until y_t+1 differs from y_t (the old answer must fail)
            draws = {}
            for kind in kinds:
                if kind == "recalculation":
                    draws[kind] = amount(0.02, 0.08) * (1 if rng.random() < 0.5 else -1)
                    draws[kind] = draws[kind] if integral else round(draws[kind], 2)
                elif kind in ("exclusion", "exception_rule"):
                    draws[kind] = amount(0.03, 0.10)
                else:
                    draws[kind] = amount(0.05, 0.15)
            new_value = current + draws.get("recalculation", 0) - draws.get("exclusion", 0)
            new_value = int(round(new_value)) if integral else round(new_value, 2)
            positive = current <= 0 or new_value > 0          # a positive figure stays positive
            if positive and (abs(new_value - current) > tol or not {"recalculation", "exclusion"} & set(kinds)):
                break
        std = FileLabel("standard", "authoritative_record")
        for kind in kinds:
            n = len(files) + 1
            if kind == "recalculation":
                delta = draws[kind]
                path = add_file(f"{directory}/erratum_{tag}_{n}.txt",
                                f"ERRATUM {tag.upper()}-{n}\nRecord: {source}\n"
                                f"One line of {subject} was misstated by {_fmt(abs(delta))} "
                                f"({'understated' if delta > 0 else 'overstated'}). The figure in that record "
                                f"is to be corrected by {'+' if delta > 0 else '-'}{_fmt(abs(delta))} before it is "
                                "reported.\nIssued by: records office (verified against the ledger)\n", 2, std)
                wrong = new_value - delta
                points.append(DecisionPoint(kind, wrong, (path, source), rejection_check(
                    wrong, tol, "the erratum's correction is not applied"),
                    "an erratum states a correction to the authoritative figure"))
            elif kind == "exclusion":
                cut = draws[kind]
                path = add_file(f"{directory}/exclusion_memo_{tag}_{n}.txt",
                                f"MEMO {tag.upper()}-{n}\nSubject: {subject}\n"
                                f"A one-off amount of {_fmt(cut)} included in the figure of {source} is excluded "
                                "from the reported figure, per the reporting policy.\n", 3, std)
                wrong = new_value + cut
                points.append(DecisionPoint(kind, wrong, (path, source), rejection_check(
                    wrong, tol, "the excluded one-off amount is still included"), "a memo excludes a one-off amount"))
            elif kind == "exception_rule":
                cut2 = draws[kind]
                memo = add_file(f"{directory}/exclusion_memo_{tag}_{n}.txt",
                                f"MEMO {tag.upper()}-{n}\nSubject: {subject}\n"
                                f"A further amount of {_fmt(cut2)} in {source} falls under the standard "
                                "exclusion for shared services.\n", 4,
                                FileLabel("noise", "misleading_redirection"))
                exempt = add_file(f"{directory}/policy_exception_{tag}_{n + 1}.txt",
                                  f"POLICY NOTE {tag.upper()}-{n + 1}\nThe shared-services exclusion does not apply "
                                  f"to {subject}: that record is exempt under the exception for records approved "
                                  f"before {_date(newest)}. Memo {memo} is void for it.\n", 5, std)
                wrong = new_value - cut2
                points.append(DecisionPoint(kind, wrong, (memo, exempt), rejection_check(
                    wrong, tol, "the exempted exclusion is applied"), "a policy exception voids an exclusion"))
            elif kind == "effective_date":
                revised = new_value + draws[kind]
                revised = int(round(revised)) if integral else round(revised, 2)
                effective = _later(newest, 120)
                path = add_file(f"{directory}/revision_notice_{tag}_{n}.txt",
                                f"REVISION NOTICE {tag.upper()}-{n}\nRecord: {source}\nThe figure is restated as "
                                f"{_fmt(revised)} with effect from {_date(effective)}. Until that date the current "
                                "figure applies.\n", 1, FileLabel("noise", "misleading_redirection", "revised"))
                points.append(DecisionPoint(kind, revised, (path,), rejection_check(
                    revised, tol, "the revision is not yet in effect"),
                    "a revision whose effective date lies after every record"))
        kept = [c for c in workspace.rubric if run_rubric([c], dict(workspace.reference, value=new_value))[0] >= 1.0]
        rubric = tuple(kept) + (value_check(new_value, tol),) + tuple(p.check for p in points)
        reference = dict(workspace.reference, value=new_value)
        return Proposal(tuple(files), reference, rubric, tuple(points))

    def _kinds(self, rng, feedback) -> list[str]:
        """``num_points`` distinct kinds in a seeded order; a kind named in the feedback moves to
        the end of the preference when it failed validation last attempt, or when the last
        round's check of that kind was passed by every agent (it did not make the task harder:
        the next round favours the kinds that exposed failures)."""
        order = [POINT_KINDS[k] for k in rng.permutation(len(POINT_KINDS))]
        failed = {k for k in POINT_KINDS for line in feedback
                  if k in line and (not line.startswith("execution:") or "passed by every agent" in line)}
        order = [k for k in order if k not in failed] + [k for k in order if k in failed]
        return order[: self.config.num_points]


PROPOSAL_SCHEMA = {
    "type": "object",
    "required": ["files", "reference", "decision_points"],
    "additionalProperties": False,
    "properties": {
        "files": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["path", "text"], "additionalProperties": False,
            "properties": {"path": {"type": "string", "minLength": 1}, "text": {"type": "string", "minLength": 1},
                           "days_after_newest": {"type": "integer", "minimum": 0, "maximum": 3650}}}},
        "reference": {"type": "object"},
        "decision_points": {"type": "array", "items": {
            "type": "object", "required": ["kind", "wrong_value", "evidence", "check_text"],
            "additionalProperties": False,
            "properties": {"kind": {"enum": list(POINT_KINDS)}, "wrong_value": {},
                           "evidence": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                           "check_text": {"type": "string", "minLength": 1}, "note": {"type": "string"}}}},
    },
}
"""What :class:`LLMEvolver` asks the model for. Choice: the model writes files, the new reference
and, per decision point, the wrong value and its evidence; the checks' CODE is generated here
(a numeric rejection of the wrong value, or a string inequality), never taken from the model,
and the value check of the new reference likewise. The model cannot edit or delete seed files."""

_EVOLVER_INSTRUCTION = """You evolve a file workspace into a harder variant under the SAME request (Env-Rethink, section 4.2).
Add new files (notices, errata, memos, revisions) that change which answer is correct, and give the new reference answer.
Every variant needs at least {min_points} counter-default decision points. Each pairs a plausible wrong answer value with
the new file(s) that resolve it; kinds: effective_date (a change not yet in effect), exclusion (an amount to exclude),
exception_rule (a rule that does not apply here), recalculation (a stated correction). The new reference must follow from
the files; no new file may state the final answer value itself or say "the answer is". Do not change existing files.
Reply with one JSON object only, valid against this JSON schema:
{schema}"""


@dataclasses.dataclass(frozen=True)
class LLMEvolverConfig:
    max_file_chars: int = 3000
    """Characters of each readable seed file shown to the model."""
    max_tokens: int = 2048
    max_repairs: int = 2
    """Re-asks with the schema errors before the proposal is rejected."""
    tolerance: float = 0.01
    seed: int = 0


class LLMEvolver:
    """The Environment Evolver on an LLM (the project's chat-client protocol,
    :class:`envsched_jax.graph.llm_clients.ChatClient`): receives the workspace, its reference,
    the generation history and the feedback; replies are parsed and validated against
    :data:`PROPOSAL_SCHEMA` (and new paths must be new, evidence paths must exist), re-asked with
    the errors up to ``max_repairs`` times, then refused with :class:`EvolutionError` naming the
    last problem. :func:`validate` then judges the assembled variant like any other."""

    name = "llm"

    def __init__(self, client, config: LLMEvolverConfig | None = None):
        self.client = client
        self.config = config or LLMEvolverConfig()

    def messages(self, workspace: Workspace, history, feedback) -> list[dict[str, str]]:
        files = []
        for f in workspace.files:
            body = f.text[: self.config.max_file_chars] if f.text is not None else f"<{f.kind} file: not readable as text>"
            files.append(f"=== {f.path} ({f.kind}, modified {f.modified})\n{body}")
        user = (f"Request (unchanged):\n{workspace.request}\n\nCurrent reference answer:\n"
                f"{json.dumps(workspace.reference, sort_keys=True)}\n\nGeneration history:\n"
                f"{json.dumps(list(history)[-5:], sort_keys=True)}\n\nFeedback from the last attempt or round:\n"
                + ("\n".join(feedback) or "(none)") + "\n\nFiles:\n" + "\n\n".join(files))
        system = _EVOLVER_INSTRUCTION.format(min_points=MIN_POINTS, schema=json.dumps(PROPOSAL_SCHEMA, sort_keys=True))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def problems(self, workspace: Workspace, value: Any) -> list[str]:
        import jsonschema

        errors = [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in jsonschema.Draft202012Validator(PROPOSAL_SCHEMA).iter_errors(value)]
        if errors:
            return errors[:10]
        new_paths = [f["path"] for f in value["files"]]
        out = []
        for path in new_paths:
            try:
                check_relative_path(path)
            except WorkspaceError as err:
                out.append(f"files: {path!r}: {err.reason}")
            if path in workspace.paths:
                out.append(f"files: {path!r} already exists; existing files cannot be changed")
        if len(set(new_paths)) != len(new_paths):
            out.append("files: duplicate paths")
        known = set(workspace.paths) | set(new_paths)
        for k, point in enumerate(value["decision_points"]):
            missing = [p for p in point["evidence"] if p not in known]
            if missing:
                out.append(f"decision_points/{k}/evidence: {missing} are not files of the variant")
        return out

    def propose(self, workspace, *, history, feedback, rng):
        from envsched_jax.rethink.roles import parse_json_object

        messages = self.messages(workspace, history, feedback)
        why = "no reply"
        for attempt in range(self.config.max_repairs + 1):
            reply = self.client.complete(messages, json_object=True, max_tokens=self.config.max_tokens,
                                         seed=self.config.seed + attempt)
            if reply.finish_reason == "error":
                why = f"the model call failed: {reply.error}"
                break
            value, why = parse_json_object(reply.text)
            if value is not None:
                problems = self.problems(workspace, value)
                if not problems:
                    return self._proposal(workspace, value)
                why = "; ".join(problems)
            messages = messages + [{"role": "assistant", "content": reply.text},
                                   {"role": "user", "content": f"That reply is invalid: {why}. Reply again with "
                                                               "the corrected JSON object only."}]
        raise EvolutionError(f"the LLM evolver gave no valid proposal: {why}",
                             source=f"workspace {workspace.workspace_id!r}")

    def _proposal(self, workspace: Workspace, value: Mapping[str, Any]) -> Proposal:
        newest = max(f.modified for f in workspace.files)
        files = tuple(WorkspaceFile(f["path"], f["text"].encode(), _later(newest, f.get("days_after_newest", 1)))
                      for f in value["files"])
        reference = dict(value["reference"])
        tol = self.config.tolerance
        new_value = reference.get("value")
        numeric = isinstance(new_value, (int, float)) and not isinstance(new_value, bool)
        points = []
        for point in value["decision_points"]:
            wrong = point["wrong_value"]
            if numeric and isinstance(wrong, (int, float)) and not isinstance(wrong, bool):
                check = rejection_check(wrong, tol, point["check_text"])
            else:
                check = Check(f"The reported value is not {wrong!r} ({point['check_text']}).",
                              check_code(f'return "value" in answer and not _same(answer["value"], {wrong!r})'))
            points.append(DecisionPoint(point["kind"], wrong, tuple(point["evidence"]), check, point.get("note", "")))
        if numeric:
            target = value_check(new_value, tol)
        else:
            target = Check(f"The reported value is {new_value!r}.",
                           check_code(f'return "value" in answer and _same(answer["value"], {new_value!r})'))
        kept = [c for c in workspace.rubric if run_rubric([c], reference)[0] >= 1.0]
        return Proposal(files, reference, tuple(kept) + (target,) + tuple(p.check for p in points), tuple(points))


EVOLVERS: dict[str, Callable[..., Evolver]] = {"heuristic": HeuristicEvolver, "llm": LLMEvolver}


def assemble(seed: Workspace, proposal: Proposal, *, round_no: int, evolver: str) -> Workspace:
    """E_t+1: the seed's files plus the proposal's, the proposal's reference and rubric, the
    request unchanged; metadata records the lineage and the decision points."""
    files = seed.files + proposal.files
    metadata = dict(seed.metadata)
    metadata.pop("scenario", None)      # the generator's scenario describes the seed, not the variant
    lineage = list(seed.metadata.get("lineage", [])) + [seed.workspace_id]
    # Decision points accumulate over rounds: earlier points' evidence stays part of the chain.
    points = list(seed.metadata.get("decision_points", [])) + [p.to_json() for p in proposal.points]
    metadata.update(lineage=lineage, evolver=evolver, round=round_no, decision_points=points)
    digest = hashlib.sha256(json.dumps([f.path for f in proposal.files]).encode()).hexdigest()[:6]
    return dataclasses.replace(seed, workspace_id=f"{seed.workspace_id}~e{round_no}-{digest}", files=files,
                               rubric=proposal.rubric, reference=proposal.reference, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class EvolveConfig:
    rounds: int = 1
    """Evolution rounds per seed; round t+1 evolves round t's validated variant."""
    attempts: int = 3
    """Proposals tried per round before the round gives up (each failure's summary is fed to the next)."""
    seed: int = 0


def execution_feedback(points: Sequence[DecisionPoint], answers: Mapping[str, Any]) -> list[str]:
    """Failed-check summaries of a validated variant (section 4.2, "Validation and feedback"):
    for each decision point, which agents' answers its check rejected (``answers``: agent name ->
    the answer it submitted on the variant)."""
    lines = []
    for point in points:
        failed = sorted(name for name, answer in answers.items() if run_rubric([point.check], answer)[0] < 1.0)
        lines.append(f"execution: {point.kind} check failed by {failed}" if failed
                     else f"execution: {point.kind} check passed by every agent")
    return lines


def evolve(seed: Workspace, evolver: Evolver, config: EvolveConfig = EvolveConfig(), *,
           evaluate: Callable[[Workspace], Mapping[str, Any]] | None = None) -> list[Variant]:
    """Evolve ``seed`` for ``config.rounds`` rounds. Each round tries up to ``attempts`` proposals,
    feeding each failed validation's failures to the next attempt; with ``evaluate`` (variant ->
    each agent's submitted answer) a validated variant's execution feedback
    (:func:`execution_feedback`) is recorded and fed to the next round (section 4.2: failed-check
    summaries guide subsequent evolution). A round that yields no valid variant ends the
    lineage. Returns every attempted variant (valid or not) in order."""
    rng = np.random.default_rng([config.seed, int(hashlib.sha256(seed.workspace_id.encode()).hexdigest()[:8], 16)])
    current, history, out = seed, [], []
    carried: list[str] = []
    for round_no in range(1, config.rounds + 1):
        feedback: list[str] = list(carried)
        accepted = None
        for attempt in range(config.attempts):
            try:
                proposal = evolver.propose(current, history=history, feedback=feedback, rng=rng)
            except EvolutionError as err:
                # A seed the evolver cannot evolve at all is refused; a later round that yields
                # no proposal ends the lineage but keeps the rounds that passed.
                if round_no == 1 and not out and attempt == config.attempts - 1:
                    raise
                history.append({"round": round_no, "attempt": attempt, "error": err.reason,
                                "feedback_in": list(feedback)})
                feedback = [f"proposal: {err.reason}"]
                continue
            candidate = assemble(current, proposal, round_no=round_no, evolver=evolver.name)
            validation = validate(current, candidate, proposal.points)
            record = {"round": round_no, "attempt": attempt, "workspace_id": candidate.workspace_id,
                      "passed": validation.passed, "failures": list(validation.failures), "feedback_in": list(feedback)}
            if validation.passed and evaluate is not None:
                record["execution_feedback"] = execution_feedback(proposal.points, evaluate(candidate))
            history.append(record)
            out.append(Variant(candidate, seed.workspace_id, round_no, proposal.points, validation, tuple(history)))
            if validation.passed:
                accepted = candidate
                carried = list(record.get("execution_feedback", []))
                break
            feedback = list(validation.failures)
        if accepted is None:
            break
        current = accepted
    return out


# ---- paired seed / variant evaluation (appendix C.1) ----------------------------------------

@dataclasses.dataclass(frozen=True)
class PairedResult:
    """Per task i and agent m: success rates on seed and variant, Delta and h_i."""

    tasks: tuple[str, ...]
    agents: tuple[str, ...]
    seed_success: np.ndarray       # [tasks, agents]
    variant_success: np.ndarray    # [tasks, agents]

    @property
    def delta(self) -> np.ndarray:
        return 100.0 * (self.variant_success - self.seed_success)

    @property
    def h(self) -> np.ndarray:
        """h_i = sum_m 1{Delta_i,m <= -20}."""
        return (self.delta <= DROP_THRESHOLD).sum(axis=1)

    def share_lower(self, at_least: int) -> float:
        """Share of tasks with lower success (Delta <= -20) for at least ``at_least`` agents."""
        return float((self.h >= at_least).mean()) if len(self.tasks) else float("nan")

    def mean_delta(self) -> np.ndarray:
        """Per agent: mean Delta over pairs with nonzero seed success (NaN if none)."""
        ok = self.seed_success > 0
        with np.errstate(invalid="ignore"):
            return np.where(ok.any(0), (self.delta * ok).sum(0) / np.maximum(ok.sum(0), 1), np.nan)


def paired_evaluation(pairs: Sequence[tuple[Workspace, Workspace]],
                      agents: Mapping[str, Callable[[Workspace, int], bool]], *, trials: int = 1) -> PairedResult:
    """Run every agent ``trials`` times on each (seed, variant) pair under identical settings.
    ``agents[name](workspace, trial) -> success`` (binary task success: every rubric check
    passes). Success rates are means over trials."""
    names = tuple(agents)
    seed_s = np.zeros((len(pairs), len(names)))
    var_s = np.zeros((len(pairs), len(names)))
    for i, (seed, variant) in enumerate(pairs):
        for m, name in enumerate(names):
            seed_s[i, m] = np.mean([bool(agents[name](seed, t)) for t in range(trials)])
            var_s[i, m] = np.mean([bool(agents[name](variant, t)) for t in range(trials)])
    return PairedResult(tuple(v.workspace_id for _, v in pairs), names, seed_s, var_s)
