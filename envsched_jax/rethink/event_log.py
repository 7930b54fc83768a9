"""Event Log: evidence-reviewed synthetic histories (seeds/002, section 4.1, "Evidence-reviewed
histories"), and :func:`prepare`, the reorganisation entry point (Collection Map + Event Log).

Pipeline (:func:`build_event_log`):

1. The History Synthesizer proposes :class:`Event` s (read, write, copy, export) per collection of
   the Collection Map, each linked to verbatim :class:`~.roles.Excerpt` s; duplicates found from
   two collections are kept once. Every event and the log are marked ``synthetic``; actors and
   timestamps are invented; a relation records whether it is ``quoted`` (a quoted line states
   it) or ``inferred`` (quotations stay distinct from inferred relationships).
2. Deterministic checks (:func:`structure_problems`): fields, actions, paths exist, excerpts
   verbatim in their text files, timestamps well formed, relation endpoints among the event's
   files.
3. The Evidence Reviewer (the heuristic one, :func:`review_event`, shares no code with the
   synthesizer's detection) checks excerpts, action and relation against the files. A
   withdrawal or supersession needs a quoted line of the right file naming the other with that
   language: a later timestamp alone never establishes it.
4. Repair within a budget (:func:`repair_event`: drop excerpts that are not verbatim, drop an
   unsupported relation), then review again; an event still failing after ``max_repairs``
   repairs, or with a problem repair cannot fix, is discarded with its reasons.
5. The Timeline Integrator orders accepted events causally (an event that outputs a file comes
   before every event that inputs it; ties by proposed timestamp, then id). Events on a causal
   cycle are discarded; synthetic timestamps are re-assigned so that they increase along the
   order (:func:`retime`).
6. TGS only: :func:`find_leaks` audits the public log; an event that carries a rubric window or a
   label word is discarded, and the final log must audit clean.

Choices the paper leaves open, made here:

- Choice (event shapes): a file X whose line names file Y gives one event: withdrawal language:
  ``write`` (in Y, out X, X withdraws Y); "superseded by"/"replaced by": ``write`` (in X, out Y,
  Y supersedes X); "supersedes"/"replaces": ``write`` (in Y, out X, X supersedes Y);
  confirmation language: ``write`` (in Y, out X, X confirms Y); redirection language: ``write``
  (out X, X redirects Y); otherwise ``read`` (in Y, X cites Y). Value lines (a digit, at least
  ``min_copy_line_chars``) shared by two text files give a ``copy`` from the closest older file
  (by modification time, then path) to each newer one, relation ``copies`` *inferred*. Files
  with the same stem and different extensions give an ``export`` from the older to the newer.
  A line naming two files with withdrawal language withdraws both (a known coarseness).
- Choice (TGS synthesis): labels add ``write`` events along each version family's labelled
  order (no relation; an excerpt of the later member) and let a file's label evidence be matched
  by a distinctive stem; the request and the rubric's check texts (never their code) pick up to
  ``max_task_reads`` files whose lines share at least two task words, giving ``read`` events
  with that line. Nothing from the labels, request or rubric is written except verbatim file
  lines, and the leak audit removes any event that carries a 5-word window of a rubric check.
- Choice (timestamps): proposed timestamps are the latest modification time of the event's
  outputs (its inputs and quoted files for ``read``); :func:`retime` keeps each one unless it
  would not be later than the previous event's, then it becomes previous + ``step_seconds``.
- Choice (leak audit words): category identifiers (``false_final_version``) anywhere; category
  phrases ("false final version", "out of scope", ...) outside verbatim quotes (a file may say
  so itself); JSON keys ``partition``, ``category``, ``label(s)``, ``stage``, ``family``,
  ``noise_category``; a window of ``leak_window`` consecutive words (``[a-z0-9]+``, never spanning a
  workspace path or file name, which are public) of any rubric check's text or code anywhere in
  the serialised log, quotes included.
- Choice (files): :func:`prepare` writes ``collection_map.json``, ``event_log.json`` (the public
  log: accepted events only) and ``prepare_report.json`` (discards with reasons, rejected
  proposals, notes, the audit: for the operator, not the agent) under ``out_dir`` and nowhere
  else.
"""

from __future__ import annotations

import dataclasses
import datetime
import heapq
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.rethink.collection_map import CollectionConfig, CollectionMap, build_collection_map
from envsched_jax.rethink.roles import (ACTIONS, BASES, RELATIONS, TIME_PATTERN, Excerpt, Roles, WorkspaceIndex,
                                        index_for)
from envsched_jax.rethink.workspace import CATEGORIES, Workspace, WorkspaceError

ACTOR = "synthetic-actor"
REPAIRABLE = ("excerpt_not_verbatim", "excerpt_not_text", "relation_unsupported", "relation_needs_quote")


@dataclasses.dataclass(frozen=True)
class EventConfig:
    """Settings of the Event Log (section 4.1).

    Attributes:
        max_repairs: repair rounds an event may have before it is discarded.
        min_copy_line_chars: shortest shared value line that suggests a copy.
        max_task_reads: TGS: most files given a request/rubric ``read`` event.
        step_seconds: spacing the Timeline Integrator enforces between consecutive events.
        leak_window: words in the rubric windows of the leak audit.
        max_text_chars: characters of a file read (a prefix).
    """

    max_repairs: int = 2
    min_copy_line_chars: int = 12
    max_task_reads: int = 5
    step_seconds: int = 60
    leak_window: int = 5
    max_text_chars: int = 100_000

    def __post_init__(self):
        for name in ("max_repairs", "min_copy_line_chars", "max_task_reads", "step_seconds", "leak_window",
                     "max_text_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name in ("max_repairs", "max_task_reads") else 1):
                raise WorkspaceError(f"EventConfig.{name} must be a non-negative (positive) integer, got {value!r}",
                                     field=name)


# ---- records ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Relation:
    """``<source> <kind> <target>``, ``quoted`` or ``inferred``."""

    kind: str
    source: str
    target: str
    basis: str

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Event:
    event_id: str
    action: str
    actor: str
    timestamp: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    excerpts: tuple[Excerpt, ...] = ()
    relation: Relation | None = None
    note: str = ""
    synthetic: bool = True

    def files(self) -> tuple[str, ...]:
        out = list(self.inputs) + list(self.outputs) + [e.path for e in self.excerpts]
        if self.relation is not None:
            out += [self.relation.source, self.relation.target]
        return tuple(dict.fromkeys(out))

    def to_json(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "action": self.action, "actor": self.actor, "timestamp": self.timestamp,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "excerpts": [e.to_json() for e in self.excerpts],
                "relation": None if self.relation is None else self.relation.to_json(),
                "note": self.note, "synthetic": self.synthetic}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Event:
        rel = record.get("relation")
        return cls(record["event_id"], record["action"], record["actor"], record["timestamp"],
                   tuple(record["inputs"]), tuple(record["outputs"]),
                   tuple(Excerpt.from_json(e) for e in record.get("excerpts", ())),
                   None if rel is None else Relation(rel["kind"], rel["source"], rel["target"], rel["basis"]),
                   record.get("note", ""), record.get("synthetic", True))

    def key(self) -> str:
        """Identity for de-duplication (everything but the id)."""
        record = self.to_json()
        record.pop("event_id")
        return json.dumps(record, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class EventLog:
    """The public, synthetic Event Log: accepted events in causal order."""

    workspace_id: str
    mode: str
    events: tuple[Event, ...]
    synthetic: bool = True

    def events_for(self, path: str) -> tuple[Event, ...]:
        """The sessions that touch ``path`` (input, output, quote or relation), in log order."""
        return tuple(e for e in self.events if path in e.files())

    def to_json(self) -> dict[str, Any]:
        return {"synthetic": self.synthetic, "workspace_id": self.workspace_id, "mode": self.mode,
                "events": [e.to_json() for e in self.events]}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> EventLog:
        if record.get("synthetic") is not True:
            raise WorkspaceError("an Event Log must be marked synthetic", field="synthetic")
        events = tuple(Event.from_json(e) for e in record["events"])
        bad = [e.event_id for e in events if e.synthetic is not True]
        if bad:
            raise WorkspaceError(f"events {bad} are not marked synthetic", field="synthetic")
        return cls(record["workspace_id"], record["mode"], events, True)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Discard:
    event: Event
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event.to_json(), "reasons": list(self.reasons)}


# ---- heuristic History Synthesizer --------------------------------------------------------------

_WITHDRAW = re.compile(r"\b(withdraw\w*|cancel+(?:ed|ation)|revoked|retracted|rescinded|void(?:ed)?|"
                       r"no longer valid|do not use)\b", re.IGNORECASE)
_SUPERSEDED_BY = re.compile(r"\b(superseded by|replaced by|obsoleted by)\b", re.IGNORECASE)
_SUPERSEDES = re.compile(r"\b(supersedes|replaces|obsoletes)\b", re.IGNORECASE)
_CONFIRMS = re.compile(r"\b(confirm\w*|verified|approved by)\b", re.IGNORECASE)
_REDIRECTS = re.compile(r"\b(moved to|refer to|see|instead|now (?:kept|stored|lives) (?:at|in)|points? to|go to)\b",
                        re.IGNORECASE)
_VALUE_LINE = re.compile(r"\d")


def _lines(text: str | None) -> list[str]:
    return [ln.strip() for ln in (text or "").splitlines() if ln.strip()]


def _latest(index: WorkspaceIndex, paths: Sequence[str]) -> str:
    return max(index.file(p).modified for p in paths)


def _event(index: WorkspaceIndex, action, inputs, outputs, excerpts, relation, note, when=None) -> dict[str, Any]:
    when = when or _latest(index, outputs or list(inputs) + [e[0] for e in excerpts])
    return {"event_id": "", "action": action, "actor": ACTOR, "timestamp": when, "inputs": list(inputs),
            "outputs": list(outputs), "excerpts": [{"path": p, "quote": q} for p, q in excerpts],
            "relation": None if relation is None else dict(zip(("kind", "source", "target", "basis"), relation)),
            "note": note, "synthetic": True}


def _naming_event(index: WorkspaceIndex, x: str, y: str, line: str) -> dict[str, Any]:
    quote = [(x, line)]
    if _WITHDRAW.search(line):
        return _event(index, "write", [y], [x], quote, ("withdraws", x, y, "quoted"),
                      f"{x} names {y} in withdrawal language")
    if _SUPERSEDED_BY.search(line):
        return _event(index, "write", [x], [y], quote, ("supersedes", y, x, "quoted"),
                      f"{x} says it is replaced by {y}")
    if _SUPERSEDES.search(line):
        return _event(index, "write", [y], [x], quote, ("supersedes", x, y, "quoted"), f"{x} says it replaces {y}")
    if _CONFIRMS.search(line):
        return _event(index, "write", [y], [x], quote, ("confirms", x, y, "quoted"), f"{x} states a confirmation of {y}")
    if _REDIRECTS.search(line):
        return _event(index, "write", [], [x], quote, ("redirects", x, y, "quoted"), f"{x} points readers to {y}")
    return _event(index, "read", [y], [], quote, ("cites", x, y, "quoted"), f"{x} refers to {y}")


_STRONG = (_WITHDRAW, _SUPERSEDED_BY, _SUPERSEDES)
_SENTENCE_END = (".", "!", "?", ":")


def _sentence(text: str, line: str, max_lines: int = 3) -> str:
    """The sentence around ``line`` in ``text``, verbatim: extended backwards over earlier lines
    of the same paragraph that do not end a sentence, and forwards until a line ends one (at
    most ``max_lines`` lines each way; a blank line always ends it). A statement wrapped over
    lines ("The document x.csv circulated on ...\nas the final budget ... is withdrawn.") is
    one unit."""
    start = text.find(line)
    if start < 0:
        return line
    end = start + len(line)
    for _ in range(max_lines):
        before = text.rfind("\n", 0, max(start - 1, 0))
        prev = text[before + 1:start - 1] if start > 0 else ""
        if start == 0 or not prev.strip() or prev.rstrip().endswith(_SENTENCE_END):
            break
        start = before + 1
    for _ in range(max_lines):
        if text[start:end].rstrip().endswith(_SENTENCE_END) or end >= len(text):
            break
        nxt = text.find("\n", end + 1)
        following = text[end + 1:nxt if nxt >= 0 else len(text)]
        if not following.strip():
            break
        end = nxt if nxt >= 0 else len(text)
    return text[start:end]


def _strongest_unit(index: WorkspaceIndex, text: str, lines: Sequence[str], path: str, allow_stem: bool,
                    first: str) -> str:
    """The quote for a file X naming ``path``: the first sentence (:func:`_sentence`) around a
    line naming ``path`` that states withdrawal or supersession, else the first naming line.
    Choice: a notice often names the file on one line ("Re: x.csv") and withdraws it in a
    wrapped sentence below; reading only the first naming line missed every such withdrawal."""
    if not any(rx.search(text) for rx in _STRONG):
        return first
    for ln in lines:
        if not index.names_file(ln, path, allow_stem=allow_stem):
            continue
        unit = _sentence(text, ln)
        if any(rx.search(unit) for rx in _STRONG):
            return unit
    return first


def _stem(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[0] if "." in name else name


def synthesize_events(workspace: Workspace, task: Mapping[str, Any],
                      index: WorkspaceIndex | None = None) -> dict[str, Any]:
    """Heuristic History Synthesizer over ``task["paths"]`` (event shapes in the module
    docstring). TGS tasks add ``labels``, ``request`` and ``rubric`` (check texts).

    ``index``: the preparation's :class:`~.roles.WorkspaceIndex`. The naming scan pairs every
    batch file with every workspace file; with the index a pair whose naming tokens do not occur
    in the text at all costs a few substring tests, and texts are not decoded again."""
    settings = EventConfig(**task.get("settings", {}))
    cap = settings.max_text_chars
    lookup = index_for(workspace, index)
    batch = [p for p in task["paths"] if p in lookup.paths]
    labels = task.get("labels") or {}
    events: list[dict[str, Any]] = []

    def linked(x: str, y: str) -> bool:
        return x in (labels.get(y) or {}).get("evidence", ()) or y in (labels.get(x) or {}).get("evidence", ())

    for x in batch:
        text = lookup.readable(x, cap)
        lines = _lines(text)
        for g in workspace.files:
            if g.path == x:
                continue
            stem = linked(x, g.path)
            line = lookup.first_naming_line(lines, g.path, allow_stem=stem, within=text)
            if line is not None:
                events.append(_naming_event(lookup, x, g.path, _strongest_unit(lookup, text, lines, g.path, stem, line)))

    texts = {f.path: set(_lines(lookup.readable(f.path, cap))) for f in workspace.files if f.kind == "text"}
    chrono = sorted(workspace.files, key=lambda f: (f.modified, f.path))
    rank = {f.path: k for k, f in enumerate(chrono)}
    for n in batch:
        if n not in texts:
            continue
        values = {ln for ln in texts[n] if len(ln) >= settings.min_copy_line_chars and _VALUE_LINE.search(ln)}
        older = [f.path for f in chrono[:rank[n]] if f.path in texts and values & texts[f.path]]
        if older:
            o = older[-1]
            line = min(values & texts[o])
            events.append(_event(lookup, "copy", [o], [n], [(o, line), (n, line)], ("copies", n, o, "inferred"),
                                 f"{n} repeats a value line of {o}"))
    for n in batch:
        older = [f.path for f in chrono[:rank[n]] if _stem(f.path) == _stem(n) and f.name != lookup.file(n).name]
        if older:
            events.append(_event(lookup, "export", [older[-1]], [n], [], None, f"{n} looks exported from {older[-1]}"))

    if task.get("mode") == "tgs":
        events += _task_guided_events(lookup, task, batch, settings)
    for k, e in enumerate(events):
        e["event_id"] = f"h{k:03d}"
    return {"events": events}


def _task_guided_events(index: WorkspaceIndex, task: Mapping[str, Any], batch: Sequence[str],
                        settings: EventConfig) -> list[dict[str, Any]]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    cap = settings.max_text_chars
    labels = task.get("labels") or {}
    events = []
    families: dict[str, list[tuple[int, str]]] = {}
    for path, lab in labels.items():
        if lab.get("family") and lab.get("order") is not None:
            families.setdefault(lab["family"], []).append((lab["order"], path))
    for family in sorted(families):
        chain = [p for _, p in sorted(families[family])]
        for prev, nxt in zip(chain, chain[1:]):
            lines = _lines(index.readable(nxt, cap))
            if nxt not in batch or not lines:
                continue
            shared = sorted(set(lines) & set(_lines(index.readable(prev, cap))))
            events.append(_event(index, "write", [prev], [nxt], [(nxt, shared[0] if shared else lines[0])], None,
                                 f"{nxt} drafted after {prev}"))
    source = " ".join([task.get("request", "")] + list(task.get("rubric", ())))
    terms = {w for w in re.findall(r"[a-z][a-z]+", source.lower()) if len(w) >= 4 and w not in ENGLISH_STOP_WORDS}
    scored = []
    for p in batch:
        for k, ln in enumerate(_lines(index.readable(p, cap))):
            hits = len(terms & set(re.findall(r"[a-z][a-z]+", ln.lower())))
            if hits >= 2:
                scored.append((-hits, p, k, ln))
    chosen: dict[str, str] = {}
    for _, p, _, ln in sorted(scored):
        if p not in chosen and len(chosen) < settings.max_task_reads:
            chosen[p] = ln
    for p in sorted(chosen):
        events.append(_event(index, "read", [p], [], [(p, chosen[p])], None, f"{p} consulted for the request"))
    return events


# ---- deterministic checks, reviewer, repair -----------------------------------------------------

def structure_problems(workspace: Workspace, event: Event, index: WorkspaceIndex | None = None) -> list[tuple[str, str]]:
    """Deterministic checks of one event: ``(code, detail)`` pairs, empty when it is sound.
    ``index``: an optional :class:`~.roles.WorkspaceIndex` of ``workspace`` (same answer)."""
    index = index_for(workspace, index)
    paths = index.paths
    out = []
    if not event.event_id:
        out.append(("bad_structure", "empty event_id"))
    if event.action not in ACTIONS:
        out.append(("bad_structure", f"action {event.action!r} is not one of {ACTIONS}"))
    if event.synthetic is not True:
        out.append(("bad_structure", "event not marked synthetic"))
    if not event.actor:
        out.append(("bad_structure", "empty actor"))
    if not re.match(TIME_PATTERN, event.timestamp or ""):
        out.append(("bad_timestamp", f"timestamp {event.timestamp!r} is not like 2026-03-01T09:30:00Z"))
    if not event.inputs and not event.outputs:
        out.append(("bad_structure", "an event needs inputs or outputs"))
    if set(event.inputs) & set(event.outputs):
        out.append(("bad_structure", f"{sorted(set(event.inputs) & set(event.outputs))} are both input and output"))
    for p in event.inputs + event.outputs:
        if p not in paths:
            out.append(("missing_path", f"{p!r} is not a file of the workspace"))
    for e in event.excerpts:
        if e.path not in paths:
            out.append(("missing_path", f"excerpt from {e.path!r}, which is not a file of the workspace"))
        elif index.text(e.path) is None:
            out.append(("excerpt_not_text", f"excerpt from {e.path!r}, which is not a text file"))
        elif not e.quote or e.quote not in index.text(e.path):
            out.append(("excerpt_not_verbatim", f"{e.quote[:60]!r} does not occur in {e.path!r}"))
    r = event.relation
    if r is not None:
        if r.kind not in RELATIONS or r.basis not in BASES:
            out.append(("bad_structure", f"relation kind {r.kind!r} / basis {r.basis!r} unknown"))
        for p in (r.source, r.target):
            if p not in paths:
                out.append(("missing_path", f"relation names {p!r}, which is not a file of the workspace"))
        if r.source == r.target:
            out.append(("bad_structure", "relation source equals target"))
        own = set(event.inputs) | set(event.outputs) | {e.path for e in event.excerpts}
        if r.source not in own:
            out.append(("relation_unsupported", "the relation's source must be one of the event's files"))
    return out


_R_WITHDRAW = re.compile(r"\b(withdrawn|withdraws?|withdrawal|withdrawing|cancell?ed|cancell?ation|revoked|"
                         r"retracted|rescinded|voided|void|no longer valid|do not use)\b", re.IGNORECASE)
_R_FORWARD = re.compile(r"\b(supersedes|replaces|obsoletes)\b", re.IGNORECASE)
_R_BACKWARD = re.compile(r"\b(superseded by|replaced by|obsoleted by)\b", re.IGNORECASE)


def review_event(workspace: Workspace, task: Mapping[str, Any], index: WorkspaceIndex | None = None) -> dict[str, Any]:
    """Heuristic Evidence Reviewer: re-reads the files of ``task["event"]`` and checks its
    excerpts, action and relation (rules in the module docstring); a relation that needs a
    quote is never supported by timestamps. ``index``: an optional
    :class:`~.roles.WorkspaceIndex` of ``workspace`` (same answer)."""
    index = index_for(workspace, index)
    event = Event.from_json(task["event"])
    problems: list[tuple[str, str]] = []
    text = {p: index.text(p) for p in event.files() if p in index.paths}
    quotes = [(e.path, e.quote) for e in event.excerpts if text.get(e.path) is not None and e.quote in text[e.path]]
    for e in event.excerpts:
        if (e.path, e.quote) not in quotes:
            problems.append(("excerpt_not_verbatim", f"{e.quote[:60]!r} is not a line of the text file {e.path!r}"))

    def shared_quote(a: str, b: str) -> bool:
        return any(text.get(a) is not None and text.get(b) is not None and q in text[a] and q in text[b]
                   for _, q in quotes)

    a = event.action
    if a == "read" and (not event.inputs or event.outputs):
        problems.append(("action_mismatch", "a read has inputs and no outputs"))
    if a == "write" and (not event.outputs or not quotes):
        problems.append(("action_mismatch", "a write needs outputs and a verbatim excerpt"))
    if a in ("copy", "export") and (len(event.inputs) != 1 or len(event.outputs) != 1):
        problems.append(("action_mismatch", f"a {a} has one input and one output"))
    elif a == "copy" and not shared_quote(event.inputs[0], event.outputs[0]):
        problems.append(("action_mismatch", "a copy needs a quote found in both files"))
    elif a == "export" and _stem(event.inputs[0]) != _stem(event.outputs[0]):
        problems.append(("action_mismatch", "an export's files share no stem"))

    r = event.relation
    if r is not None:
        if r.kind != "copies" and r.basis != "quoted":
            problems.append(("relation_needs_quote", f"a {r.kind} relation must be quoted, not {r.basis}"))
        source_lines = [q for p, q in quotes if p == r.source]
        target_lines = [q for p, q in quotes if p == r.target]
        naming = [q for q in source_lines if index.names_file(q, r.target, allow_stem=True)]
        if r.kind == "withdraws":
            ok = any(_R_WITHDRAW.search(q) for q in naming)
        elif r.kind == "supersedes":
            ok = (any(_R_FORWARD.search(q) for q in naming)
                  or any(_R_BACKWARD.search(q) and index.names_file(q, r.source, allow_stem=True)
                         for q in target_lines))
        elif r.kind == "copies":
            ok = shared_quote(r.source, r.target)
        else:
            ok = bool(naming)
        if not ok:
            problems.append(("relation_unsupported",
                             f"'{r.source} {r.kind} {r.target}' has no supporting quoted line"
                             + (" (a later timestamp alone does not establish it)"
                                if r.kind in ("withdraws", "supersedes") else "")))
    return {"event_id": event.event_id, "verdict": "reject" if problems else "accept",
            "problems": [{"code": c, "detail": d} for c, d in problems]}


def repair_event(workspace: Workspace, event: Event, problems: Sequence[tuple[str, str]],
                 index: WorkspaceIndex | None = None) -> Event | None:
    """Drop excerpts that are not verbatim in a text file and, when the relation is unsupported,
    the relation; ``None`` when a problem is not repairable or nothing would change."""
    codes = {c for c, _ in problems}
    if codes - set(REPAIRABLE):
        return None
    index = index_for(workspace, index)
    excerpts = tuple(e for e in event.excerpts if e.path in index.paths
                     and index.text(e.path) is not None and e.quote and e.quote in index.text(e.path))
    relation = None if codes & {"relation_unsupported", "relation_needs_quote"} else event.relation
    note = event.note if relation is event.relation else f"{event.note} [relation dropped: unsupported]"
    repaired = dataclasses.replace(event, excerpts=excerpts, relation=relation, note=note)
    return None if repaired == event else repaired


# ---- Timeline Integrator ------------------------------------------------------------------------

def _edges(events: Sequence[Event]) -> dict[str, set[str]]:
    succ: dict[str, set[str]] = {e.event_id: set() for e in events}
    for a in events:
        for b in events:
            if a.event_id != b.event_id and set(a.outputs) & set(b.inputs):
                succ[a.event_id].add(b.event_id)
    return succ


def cycle_members(events: Sequence[Event]) -> set[str]:
    """Ids of the events that lie on a causal cycle."""
    succ = _edges(events)
    on_cycle = set()
    for start in succ:
        stack, seen = list(succ[start]), set()
        while stack:
            node = stack.pop()
            if node == start:
                on_cycle.add(start)
                break
            if node not in seen:
                seen.add(node)
                stack.extend(succ[node])
    return on_cycle


def order_events(workspace: Workspace, task: Mapping[str, Any], index: WorkspaceIndex | None = None) -> dict[str, Any]:
    """Heuristic Timeline Integrator: Kahn's topological order, ties by (timestamp, id).
    (``index`` is accepted for the role interface; ordering reads no file.)"""
    events = [Event.from_json(e) for e in task["events"]]
    by_id = {e.event_id: e for e in events}
    succ = _edges(events)
    indegree = {i: 0 for i in succ}
    for i in succ:
        for j in succ[i]:
            indegree[j] += 1
    heap = [(by_id[i].timestamp, i) for i, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in sorted(succ[i]):
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(heap, (by_id[j].timestamp, j))
    return {"order": order}


def retime(events: Sequence[Event], step_seconds: int) -> tuple[Event, ...]:
    """Synthetic timestamps increasing along the given order: each kept unless it is not later
    than the previous one, then previous + ``step_seconds``."""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    out, previous = [], None
    for e in events:
        t = datetime.datetime.strptime(e.timestamp, fmt)
        if previous is not None and t <= previous:
            t = previous + datetime.timedelta(seconds=step_seconds)
        out.append(dataclasses.replace(e, timestamp=t.strftime(fmt)))
        previous = t
    return tuple(out)


# ---- leak audit ---------------------------------------------------------------------------------

_LABEL_KEYS = frozenset({"partition", "category", "label", "labels", "stage", "family", "noise_category"})


def _windows(text: str, n: int, public: Sequence[str]) -> set[tuple[str, ...]]:
    """Windows of ``n`` consecutive words of ``text``, never spanning a workspace path or file
    name (those are public: every log names files); a text with no such run of ``n`` words gives
    its longest run when that has at least 3 words."""
    for token in sorted(public, key=len, reverse=True):
        text = text.replace(token, " | ")
    runs = [re.findall(r"[a-z0-9]+", part.lower()) for part in text.split("|")]
    windows = {tuple(run[i:i + n]) for run in runs for i in range(len(run) - n + 1)}
    if not windows:
        longest = max(runs, key=len, default=[])
        if len(longest) >= 3:
            windows.add(tuple(longest))
    return windows


def find_leaks(log: Mapping[str, Any], workspace: Workspace, *, window: int = 5) -> list[str]:
    """What of the rubric or the labels a public log (its JSON) reveals: empty when clean."""
    serial = json.dumps(log, sort_keys=True)
    leaks = []
    public = [p for f in workspace.files for p in (f.path, f.name)]
    log_tokens = re.findall(r"[a-z0-9]+", serial.lower())
    grams = {tuple(log_tokens[i:i + w]) for w in {window, *range(3, window)} for i in range(len(log_tokens) - w + 1)}
    for k, check in enumerate(workspace.rubric):
        for part, source in (("text", check.text), ("code", check.code)):
            hit = sorted(w for w in _windows(source, window, public) if w in grams)
            if hit:
                leaks.append(f"rubric check {k} {part}: the log repeats {' '.join(hit[0])!r}")
    unquoted: list[str] = []
    stack: list[Any] = [log]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _LABEL_KEYS:
                    leaks.append(f"label field {key!r} in the log")
                if key == "quote":
                    continue
                stack.append(value)
                unquoted.append(str(key))
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            unquoted.append(node)
    flat = " ".join(unquoted).lower()
    for category in CATEGORIES:
        if category in serial.lower():
            leaks.append(f"category identifier {category!r} in the log")
        phrase = category.replace("_", " ")
        if re.search(r"\b" + phrase.replace(" ", r"[\s\-]+") + r"\b", flat.replace("_", " ")):
            leaks.append(f"category phrase {phrase!r} outside quotes")
    return sorted(set(leaks))


# ---- pipeline -----------------------------------------------------------------------------------

def heuristic_role_functions() -> dict[str, Callable[[Workspace, Mapping[str, Any], WorkspaceIndex | None], Any]]:
    """Role name -> ``fn(workspace, task, index)`` (``index`` may be ``None``)."""
    return {"history_synthesizer": synthesize_events, "evidence_reviewer": review_event,
            "timeline_integrator": order_events}


@dataclasses.dataclass(frozen=True)
class EventReport:
    proposed: int
    discarded: tuple[Discard, ...]
    notes: tuple[str, ...]
    leaks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"proposed": self.proposed, "discarded": [d.to_json() for d in self.discarded],
                "notes": list(self.notes), "leaks": list(self.leaks)}


def review_with_repairs(workspace: Workspace, event: Event, reviewer, max_repairs: int,
                        index: WorkspaceIndex | None = None) -> tuple[Event | None, tuple[str, ...]]:
    """Deterministic checks, then the reviewer; repair and retry up to ``max_repairs`` times.
    Returns (accepted event, ()) or (None, reasons). ``index``: the preparation's
    :class:`~.roles.WorkspaceIndex`, shared with the checks and the reviewer."""
    index = index_for(workspace, index)
    repairs = 0
    while True:
        problems = structure_problems(workspace, event, index)
        if not problems:
            outcome = reviewer(workspace, {"event": event.to_json()}, index)
            if not outcome.ok:
                problems = [("reviewer_failed", outcome.reason)]
            elif outcome.value["verdict"] == "reject":
                problems = [(p["code"], p["detail"]) for p in outcome.value["problems"]] or [("rejected", "no detail")]
        if not problems:
            return event, ()
        reasons = tuple(f"{c}: {d}" for c, d in problems)
        if repairs >= max_repairs:
            return None, reasons + (f"repair budget of {max_repairs} spent",)
        repaired = repair_event(workspace, event, problems, index)
        if repaired is None:
            return None, reasons + ("not repairable",)
        event, repairs = repaired, repairs + 1


def integrate(workspace: Workspace, events: Sequence[Event], integrator, step_seconds: int,
              index: WorkspaceIndex | None = None) -> tuple[tuple[Event, ...], list[Discard], list[str]]:
    """Drop events on causal cycles, order the rest (the role, checked; the deterministic order
    when the role fails) and re-time them."""
    cyclic = cycle_members(events)
    discards = [Discard(e, (f"on a causal cycle with {sorted(cyclic - {e.event_id})}",)) for e in events
                if e.event_id in cyclic]
    kept = [e for e in events if e.event_id not in cyclic]
    notes = []
    task = {"events": [e.to_json() for e in kept]}
    outcome = integrator(workspace, task, index)
    if outcome.ok:
        order = outcome.value["order"]
    else:
        notes.append(f"{integrator.name} failed ({outcome.reason}); deterministic causal order used")
        order = order_events(workspace, task)["order"]
    by_id = {e.event_id: e for e in kept}
    return retime([by_id[i] for i in order], step_seconds), discards, notes


def _synthesis_task(workspace: Workspace, paths: Sequence[str], mode: str, config: EventConfig) -> dict[str, Any]:
    task: dict[str, Any] = {"mode": mode, "paths": list(paths), "settings": dataclasses.asdict(config)}
    if mode == "tgs":
        task["request"] = workspace.request
        task["rubric"] = [c.text for c in workspace.rubric]
        task["labels"] = {p: lab.to_json() for p, lab in workspace.labels().items()}
    return task


def build_event_log(workspace: Workspace, collection_map: CollectionMap, roles: Roles, *,
                    mode: Literal["egs", "tgs"] = "egs", config: EventConfig = EventConfig(),
                    index: WorkspaceIndex | None = None) -> tuple[EventLog, EventReport]:
    """Section 4.1's evidence-reviewed histories (steps in the module docstring).

    ``index``: the :class:`~.roles.WorkspaceIndex` of ``workspace`` to share with the roles and
    checks (built here when ``None``); it only saves recomputation, the log is the same."""
    index = index_for(workspace, index)
    notes: list[str] = []
    proposed: dict[str, Event] = {}
    for c in collection_map.collections:
        outcome = roles.synthesizer(workspace, _synthesis_task(workspace, c.members, mode, config), index)
        if not outcome.ok:
            notes.append(f"{roles.synthesizer.name} failed for {c.collection_id}: {outcome.reason}")
            continue
        for record in outcome.value["events"]:
            event = Event.from_json(record)
            proposed.setdefault(event.key(), event)
    ordered = sorted(proposed.values(), key=lambda e: (e.timestamp, e.key()))
    candidates = [dataclasses.replace(e, event_id=f"ev{k:04d}") for k, e in enumerate(ordered)]
    accepted, discards = [], []
    for event in candidates:
        kept, reasons = review_with_repairs(workspace, event, roles.reviewer, config.max_repairs, index)
        if kept is None:
            discards.append(Discard(event, reasons))
        else:
            accepted.append(kept)
    leaks: list[str] = []
    if mode == "tgs":
        clean = []
        for event in accepted:
            found = find_leaks({"events": [event.to_json()]}, workspace, window=config.leak_window)
            if found:
                discards.append(Discard(event, tuple(f"leak: {f}" for f in found)))
            else:
                clean.append(event)
        accepted = clean
    events, cycle_discards, integration_notes = integrate(workspace, accepted, roles.integrator, config.step_seconds,
                                                          index)
    discards += cycle_discards
    notes += integration_notes
    log = EventLog(workspace.workspace_id, mode, events)
    if mode == "tgs":
        leaks = find_leaks(log.to_json(), workspace, window=config.leak_window)
        if leaks:
            raise WorkspaceError(f"the public log still leaks after filtering: {leaks}",
                                 source=f"workspace {workspace.workspace_id!r}")
    return log, EventReport(len(candidates), tuple(discards), tuple(notes), tuple(leaks))


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    collection: CollectionConfig = CollectionConfig()
    events: EventConfig = EventConfig()


@dataclasses.dataclass(frozen=True)
class PreparedLayer:
    """The organisation layer an agent gets (section 4.1, "Inputs and execution"): cards to
    browse, sessions retrievable by file path; ``report`` is for the operator."""

    collection_map: CollectionMap
    event_log: EventLog
    report: Mapping[str, Any]


def prepare(workspace: Workspace, *, mode: Literal["egs", "tgs"] = "egs", roles: Roles, out_dir: str | Path,
            config: PrepareConfig = PrepareConfig()) -> PreparedLayer:
    """Build the Collection Map and Event Log of ``workspace`` (EGS: files and metadata; TGS:
    also labels, request and rubric) and write ``collection_map.json``, ``event_log.json`` and
    ``prepare_report.json`` under ``out_dir`` (created if needed). Sources are only read."""
    source = f"workspace {workspace.workspace_id!r}"
    if mode not in ("egs", "tgs"):
        raise WorkspaceError(f"mode must be 'egs' or 'tgs', got {mode!r}", source=source, field="mode")
    if mode == "tgs" and not workspace.labels():
        raise WorkspaceError("TGS needs file labels and this workspace has none", source=source, field="label")
    # One index for the whole preparation: every step and role call shares its lookups.
    index = WorkspaceIndex(workspace)
    cmap = build_collection_map(workspace, roles, mode=mode, config=config.collection, index=index)
    log, report = build_event_log(workspace, cmap, roles, mode=mode, config=config.events, index=index)
    full_report = {"workspace_id": workspace.workspace_id, "mode": mode, "backend": roles.backend,
                   "rejected_proposals": [h.to_json() for h in cmap.history if h.status == "rejected"],
                   "collection_notes": list(cmap.notes), **report.to_json()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "collection_map.json").write_text(cmap.dumps())
    (out / "event_log.json").write_text(log.dumps())
    (out / "prepare_report.json").write_text(json.dumps(full_report, indent=1, sort_keys=True))
    return PreparedLayer(cmap, log, full_report)
