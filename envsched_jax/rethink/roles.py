"""The preparation roles of Env-Rethink's reorganisation (seeds/002, section 4.1) behind one
interface, with two kinds of backend.

Section 4.1 names six roles: the Collection Summarizer (cards), the Semantic Coordinator
(split / merge / transfer / overlap proposals), the Collection Refiner (re-reads changed groups),
the History Synthesizer (read / write / copy / export events), the Evidence Reviewer (checks an
event against the files) and the Timeline Integrator (causal order). Every role here is a
callable ``role(workspace, task) -> RoleOutcome``: ``task`` is the role's JSON input and
``RoleOutcome.value`` its JSON output, which validates against :data:`ROLE_SCHEMAS` and passes the
role's semantic check (:func:`validate_output`), whichever backend produced it.

Backends (:data:`ROLE_BACKENDS`, :func:`make_roles`):

- ``heuristic``: deterministic, offline implementations (in :mod:`.collection_map` and
  :mod:`.event_log`), so the pipeline runs and is tested without a model. Their outputs go
  through the same validation; a failure there is a bug and is reported, not hidden.
- ``llm``: :class:`LLMRoleRunner` around the project's
  :class:`~envsched_jax.graph.llm_clients.ChatClient`. It writes the role's prompt, parses the
  reply as JSON, validates it (JSON schema, every referenced file exists, every quoted excerpt
  occurs verbatim in its text file, the role's semantic check) and on failure re-asks with the
  list of problems, up to ``max_repairs`` times; then it rejects with a reason.

Choices the paper leaves open, made here:

- Choice: the prompts are this project's own wording; replies must be one JSON object.
- Choice: the Collection Refiner has the summarizer's output (a card) and also sees the previous
  card; the heuristic refiner recomputes the card from the members (it ignores the old card).
- Choice: the Timeline Integrator's role output is an order of event ids; the causal edges,
  cycle removal and timestamp re-assignment stay deterministic (:mod:`.event_log`), and an order
  that breaks a causal edge is a validation error, so an LLM cannot break causal order.
- Choice: references are found by key: every string under a key in :data:`PATH_KEYS` must be a
  workspace path, and every object with both ``path`` and ``quote`` is an excerpt to check
  verbatim. Proposal ``support`` items are not references (the pipeline checks them).
- Choice: the LLM sees at most ``max_file_chars`` characters of a file (its prefix); images and
  binary files are shown as a one-line placeholder (the text tools cannot read them).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import jsonschema
import numpy as np

from envsched_jax.rethink.workspace import Workspace, WorkspaceError, WorkspaceFile

ROLE_NAMES = ("collection_summarizer", "semantic_coordinator", "collection_refiner",
              "history_synthesizer", "evidence_reviewer", "timeline_integrator")
ACTIONS = ("read", "write", "copy", "export")
"""Section 4.1: the History Synthesizer's event actions."""
RELATIONS = ("withdraws", "supersedes", "copies", "cites", "confirms", "redirects")
"""Relation kinds, read as ``<source> <kind> <target>``."""
BASES = ("quoted", "inferred")
"""``quoted``: established by a verbatim excerpt; ``inferred``: a relationship the synthesizer
derived (section 4.1: "quotations remain distinct from inferred relationships")."""
PROPOSAL_KINDS = ("split", "merge", "transfer", "overlap")
PATH_KEYS = frozenset({"path", "paths", "members", "source_paths", "inputs", "outputs", "source", "target"})
TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"


class RoleError(WorkspaceError):
    """A role was misconfigured (unknown backend or role, missing client)."""


# ---- shared text helpers ------------------------------------------------------------------------

def readable_text(f: WorkspaceFile, max_chars: int | None = None) -> str | None:
    """The text the reading tools show (``None`` for images and binary files), cut to
    ``max_chars``: a prefix, so any quote taken from it is verbatim in the whole file."""
    text = f.text
    if text is None:
        return None
    return text if max_chars is None else text[:max_chars]


def unique_names(workspace: Workspace) -> dict[str, str]:
    """File name -> path for the names that only one file of the workspace has."""
    count: dict[str, list[str]] = {}
    for f in workspace.files:
        count.setdefault(f.name, []).append(f.path)
    return {name: paths[0] for name, paths in count.items() if len(paths) == 1}


def naming_tokens(path: str, unique: Mapping[str, str], *, allow_stem: bool = False) -> tuple[str, ...]:
    """The strings by which a line can name the file at ``path`` (:func:`names_file`), in the
    order they are tried: its path; its file name when ``unique`` (the workspace's
    :func:`unique_names`) maps that name to it; with ``allow_stem``, also its stem when distinctive."""
    tokens = [path]
    name = path.rsplit("/", 1)[-1]
    if unique.get(name) == path:
        tokens.append(name)
        stem = name.rsplit(".", 1)[0] if "." in name else name
        if allow_stem and stem != name and re.search(r"[_\-0-9]", stem):
            tokens.append(stem)
    return tuple(tokens)


def names_file(line: str, path: str, workspace: Workspace, *, allow_stem: bool = False,
               unique: Mapping[str, str] | None = None) -> bool:
    """Whether ``line`` names the file at ``path``: by its path, or by its file name when no other
    file has that name (``allow_stem``: also by the name without extension when that stem is a
    distinctive identifier, i.e. holds ``_``, ``-`` or a digit).

    ``unique``: the workspace's :func:`unique_names` when the caller has it (a
    :class:`WorkspaceIndex` does); without it every call makes a pass over all files, which is
    what made the pairwise scans quadratic in calls and cubic in time."""
    unique = unique_names(workspace) if unique is None else unique
    return any(_mentions(line, token) for token in naming_tokens(path, unique, allow_stem=allow_stem))


def _mentions(line: str, token: str) -> bool:
    if len(token) < 3:
        return False
    pattern = r"(?<![\w/.\-])" + re.escape(token) + r"(?![\w/\-]|\.\w)"
    return re.search(pattern, line) is not None


@dataclasses.dataclass(frozen=True)
class Excerpt:
    """A verbatim quote from a text file of the workspace."""

    path: str
    quote: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "quote": self.quote}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Excerpt:
        return cls(record["path"], record["quote"])


WORD = re.compile(r"[a-z][a-z]+")


def words_of(f: WorkspaceFile, max_chars: int | None = None) -> frozenset[str]:
    """Lower-case words (two letters or more) of a file's name and readable text."""
    text = (f.name + " " + (readable_text(f, max_chars) or "")).lower()
    return frozenset(WORD.findall(re.sub(r"[_\-./]", " ", text)))


@dataclasses.dataclass(frozen=True)
class TextIndex:
    """L2-normalised TF-IDF rows of every workspace file (row order = ``paths``); the model is
    described in :mod:`.collection_map` (the "themes" choice)."""

    paths: tuple[str, ...]
    terms: tuple[str, ...]
    matrix: np.ndarray
    position: Mapping[str, int] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # Row lookup by path, built once: rows() is called per member in ranking loops.
        object.__setattr__(self, "position", {p: k for k, p in enumerate(self.paths)})

    def rows(self, members: Sequence[str]) -> np.ndarray:
        return self.matrix[[self.position[p] for p in members]]

    def centroid(self, members: Sequence[str]) -> np.ndarray:
        if not members:
            return np.zeros(self.matrix.shape[1])
        return self.rows(members).mean(axis=0)


def text_index(workspace: Workspace, max_text_chars: int) -> TextIndex:
    """The workspace's TF-IDF model (see :mod:`.collection_map`'s "themes" choice): a document
    is the file name without extension (``_-.`` read as spaces) plus its readable text."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    docs = [re.sub(r"[_\-.]", " ", f.name.rsplit(".", 1)[0] if "." in f.name else f.name) + "\n"
            + (readable_text(f, max_text_chars) or "") for f in workspace.files]
    vectorizer = TfidfVectorizer(token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z]+\b", stop_words="english",
                                 sublinear_tf=True, lowercase=True)
    try:
        matrix = vectorizer.fit_transform(docs).toarray()
        terms = tuple(vectorizer.get_feature_names_out())
    except ValueError:  # no word in any document
        matrix, terms = np.zeros((len(docs), 0)), ()
    return TextIndex(workspace.paths, terms, matrix)


@dataclasses.dataclass(frozen=True)
class WorkspaceIndex:
    """Lookups over one workspace that preparation asks for again and again, computed once.

    Why it exists: the heuristic roles and the deterministic checks put the same questions to a
    workspace thousands of times per preparation (the file at a path, its decoded text, which
    file names are unique, a file's words, the TF-IDF model). Recomputed on every call they made
    a 70-file workspace take several seconds. :func:`~.event_log.prepare` builds one index and
    passes it explicitly to every step and role call (``role(workspace, task, index)``); there
    is no global cache, so an index lives as long as the preparation that made it.

    Every answer is a pure function of the workspace (and, for ``words`` and ``text_index``, of
    ``max_chars``: those are kept per value asked for), so code given an index returns exactly
    what it returns without one; the tests compare both paths. The workspace is immutable
    (frozen records of bytes), so the index cannot go stale.
    """

    workspace: Workspace
    files: Mapping[str, WorkspaceFile] = dataclasses.field(init=False, repr=False)
    paths: frozenset[str] = dataclasses.field(init=False, repr=False)
    texts: Mapping[str, str | None] = dataclasses.field(init=False, repr=False)
    unique: Mapping[str, str] = dataclasses.field(init=False, repr=False)
    _derived: dict[tuple[Any, ...], Any] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        files = {f.path: f for f in self.workspace.files}
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "paths", frozenset(files))
        object.__setattr__(self, "texts", {p: f.text for p, f in files.items()})  # decoded once
        object.__setattr__(self, "unique", unique_names(self.workspace))
        object.__setattr__(self, "_derived", {})

    def file(self, path: str) -> WorkspaceFile:
        if path not in self.files:
            raise KeyError(f"workspace {self.workspace.workspace_id!r} has no file {path!r}")
        return self.files[path]

    def text(self, path: str) -> str | None:
        """``file(path).text`` without decoding the bytes again."""
        self.file(path)
        return self.texts[path]

    def readable(self, path: str, max_chars: int | None = None) -> str | None:
        """:func:`readable_text` of the file at ``path``."""
        text = self.text(path)
        return text if text is None or max_chars is None else text[:max_chars]

    def derived(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, run once per ``key`` for this index. Only for values that are a pure
        function of the workspace and of what ``key`` names (every input other than the
        workspace must be in the key); treat the value as read-only."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def words(self, path: str, max_chars: int | None = None) -> frozenset[str]:
        """:func:`words_of` of the file at ``path``."""
        return self.derived(("words", path, max_chars), lambda: words_of(self.file(path), max_chars))

    def text_index(self, max_chars: int) -> TextIndex:
        """:func:`text_index` of the workspace (one TF-IDF fit per ``max_chars``)."""
        return self.derived(("text_index", max_chars), lambda: text_index(self.workspace, max_chars))

    def names_file(self, line: str, path: str, *, allow_stem: bool = False) -> bool:
        """:func:`names_file` with the precomputed unique names."""
        return names_file(line, path, self.workspace, allow_stem=allow_stem, unique=self.unique)

    def first_naming_line(self, lines: Sequence[str], path: str, *, allow_stem: bool = False,
                          within: str | None = None) -> str | None:
        """The first of ``lines`` that names ``path`` (:meth:`names_file`), or ``None``.

        ``within``: a text that contains every line (the text they were split from). A token
        absent from it is in no line, so only the tokens it contains are matched line by line;
        in a pairwise scan most file pairs then cost a few substring tests, with the same answer.
        """
        tokens = [t for t in naming_tokens(path, self.unique, allow_stem=allow_stem)
                  if within is None or t in within]
        if not tokens:
            return None
        return next((ln for ln in lines if any(_mentions(ln, t) for t in tokens)), None)


def index_for(workspace: Workspace, index: WorkspaceIndex | None = None) -> WorkspaceIndex:
    """``index`` when given (it must index this very workspace: another's would give that
    workspace's answers), else a fresh index (a caller without one pays for one build)."""
    if index is None:
        return WorkspaceIndex(workspace)
    if index.workspace is not workspace:
        raise WorkspaceError(f"the index given is of workspace {index.workspace.workspace_id!r}, not of this "
                             "workspace object", source=f"workspace {workspace.workspace_id!r}", field="index")
    return index


# ---- outcome and interface ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RoleOutcome:
    """What a role returned: ``ok`` with a validated JSON ``value``, or a rejection with its
    ``reason``; ``attempts`` counts calls (1 + repairs for the LLM backend)."""

    ok: bool
    value: Any = None
    reason: str = ""
    attempts: int = 1


class Role(Protocol):
    """``role(workspace, task, index=None)``. ``index``: a :class:`WorkspaceIndex` of
    ``workspace`` the caller already has (lookups only); a role answers the same with or without
    it."""

    name: str

    def __call__(self, workspace: Workspace, task: Mapping[str, Any],
                 index: WorkspaceIndex | None = None) -> RoleOutcome:
        ...


# ---- schemas ------------------------------------------------------------------------------------

_STR_LIST = {"type": "array", "items": {"type": "string"}}
_EXCERPT = {"type": "object", "required": ["path", "quote"], "additionalProperties": False,
            "properties": {"path": {"type": "string"}, "quote": {"type": "string", "minLength": 1}}}
CARD_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["collection_id", "themes", "contents", "evidence", "source_paths"],
    "properties": {
        "collection_id": {"type": "string"},
        "themes": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 12},
        "contents": {"type": "array", "items": {
            "type": "object", "required": ["path", "kind", "gist"], "additionalProperties": False,
            "properties": {"path": {"type": "string"}, "kind": {"enum": ["text", "image", "binary"]},
                           "gist": {"type": "string"}}}},
        "evidence": {"type": "array", "items": _EXCERPT},
        "source_paths": _STR_LIST,
    },
}
PROPOSAL_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["kind", "collections", "paths", "support", "rationale"],
    "properties": {"kind": {"enum": list(PROPOSAL_KINDS)}, "collections": _STR_LIST, "paths": _STR_LIST,
                   "support": _STR_LIST, "rationale": {"type": "string"}},
}
RELATION_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "source", "target", "basis"],
    "properties": {"kind": {"enum": list(RELATIONS)}, "source": {"type": "string"},
                   "target": {"type": "string"}, "basis": {"enum": list(BASES)}},
}
EVENT_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["event_id", "action", "actor", "timestamp", "inputs", "outputs", "excerpts", "relation",
                 "note", "synthetic"],
    "properties": {
        "event_id": {"type": "string", "minLength": 1}, "action": {"enum": list(ACTIONS)},
        "actor": {"type": "string", "minLength": 1},
        "timestamp": {"type": "string", "pattern": TIME_PATTERN},
        "inputs": _STR_LIST, "outputs": _STR_LIST, "excerpts": {"type": "array", "items": _EXCERPT},
        "relation": {"oneOf": [{"type": "null"}, RELATION_SCHEMA]}, "note": {"type": "string"},
        "synthetic": {"const": True},
    },
}
ROLE_SCHEMAS: dict[str, dict[str, Any]] = {
    "collection_summarizer": CARD_SCHEMA,
    "collection_refiner": CARD_SCHEMA,
    "semantic_coordinator": {"type": "object", "required": ["proposals"], "additionalProperties": False,
                             "properties": {"proposals": {"type": "array", "items": PROPOSAL_SCHEMA}}},
    "history_synthesizer": {"type": "object", "required": ["events"], "additionalProperties": False,
                            "properties": {"events": {"type": "array", "items": EVENT_SCHEMA}}},
    "evidence_reviewer": {
        "type": "object", "required": ["event_id", "verdict", "problems"], "additionalProperties": False,
        "properties": {"event_id": {"type": "string"}, "verdict": {"enum": ["accept", "reject"]},
                       "problems": {"type": "array", "items": {
                           "type": "object", "required": ["code", "detail"], "additionalProperties": False,
                           "properties": {"code": {"type": "string"}, "detail": {"type": "string"}}}}}},
    "timeline_integrator": {"type": "object", "required": ["order"], "additionalProperties": False,
                            "properties": {"order": _STR_LIST}},
}


# ---- validation ---------------------------------------------------------------------------------

def reference_problems(workspace: Workspace, value: Any, index: WorkspaceIndex | None = None) -> list[str]:
    """Every string under a :data:`PATH_KEYS` key that is not a workspace path, and every
    ``{"path", "quote"}`` excerpt whose quote does not occur verbatim in that text file."""
    index = index_for(workspace, index)
    paths = index.paths
    problems: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, item in node.items():
            if key in PATH_KEYS:
                for p in ([item] if isinstance(item, str) else item if isinstance(item, list) else []):
                    if isinstance(p, str) and p not in paths:
                        problems.append(f"{key!r} names {p!r}, which is not a file of the workspace")
            if isinstance(item, (dict, list)):
                stack.append(item)
        if isinstance(node.get("path"), str) and isinstance(node.get("quote"), str) and node["path"] in paths:
            text = index.text(node["path"])
            if text is None:
                problems.append(f"excerpt from {node['path']!r}, which is not a text file")
            elif node["quote"] not in text:
                problems.append(f"quote {node['quote'][:60]!r} does not occur verbatim in {node['path']!r}")
    return sorted(set(problems))


def _card_problems(workspace: Workspace, task: Mapping[str, Any], value: Any) -> list[str]:
    problems = []
    if value.get("collection_id") != task.get("collection_id"):
        problems.append(f"collection_id is {value.get('collection_id')!r}, expected {task.get('collection_id')!r}")
    members = set(task.get("members", ()))
    listed = [c["path"] for c in value.get("contents", ())]
    if set(listed) != members or len(listed) != len(members):
        problems.append("contents must list every member of the collection exactly once "
                        f"(missing {sorted(members - set(listed))}, extra {sorted(set(listed) - members)})")
    for c in value.get("contents", ()):
        if c["path"] in members and workspace.file(c["path"]).kind != c["kind"]:
            problems.append(f"contents gives kind {c['kind']!r} for {c['path']!r}, "
                            f"which is {workspace.file(c['path']).kind!r}")
    for key in ("source_paths",):
        outside = sorted(set(value.get(key, ())) - members)
        if outside:
            problems.append(f"{key} names files outside the collection: {outside}")
    outside = sorted({e["path"] for e in value.get("evidence", ())} - members)
    if outside:
        problems.append(f"evidence quotes files outside the collection: {outside}")
    return problems


def _coordinator_problems(workspace: Workspace, task: Mapping[str, Any], value: Any) -> list[str]:
    known = {c["collection_id"] for c in task.get("collections", ())}
    return [f"proposal {k} names unknown collection {cid!r}"
            for k, p in enumerate(value.get("proposals", ())) for cid in p["collections"] if cid not in known]


def _synthesizer_problems(workspace: Workspace, task: Mapping[str, Any], value: Any) -> list[str]:
    ids = [e["event_id"] for e in value.get("events", ())]
    return [f"event id {i!r} is used more than once" for i in sorted({i for i in ids if ids.count(i) > 1})]


def _reviewer_problems(workspace: Workspace, task: Mapping[str, Any], value: Any) -> list[str]:
    expected = task.get("event", {}).get("event_id")
    return [] if value.get("event_id") == expected else [f"event_id is {value.get('event_id')!r}, expected {expected!r}"]


def causal_edges(events: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(a, b) when event a outputs a file that event b takes as input: a must come first."""
    edges = []
    for a in events:
        for b in events:
            if a["event_id"] != b["event_id"] and set(a["outputs"]) & set(b["inputs"]):
                edges.append((a["event_id"], b["event_id"]))
    return edges


def _integrator_problems(workspace: Workspace, task: Mapping[str, Any], value: Any) -> list[str]:
    events = task.get("events", ())
    ids = [e["event_id"] for e in events]
    order = list(value.get("order", ()))
    if sorted(order) != sorted(ids):
        return [f"order must list every event id exactly once (missing {sorted(set(ids) - set(order))}, "
                f"extra or repeated {sorted({o for o in order if order.count(o) > 1 or o not in ids})})"]
    position = {e: k for k, e in enumerate(order)}
    return [f"event {a!r} outputs a file that {b!r} reads, so it must come first"
            for a, b in causal_edges(events) if position[a] > position[b]]


SEMANTIC_CHECKS: dict[str, Callable[[Workspace, Mapping[str, Any], Any], list[str]]] = {
    "collection_summarizer": _card_problems,
    "collection_refiner": _card_problems,
    "semantic_coordinator": _coordinator_problems,
    "history_synthesizer": _synthesizer_problems,
    "evidence_reviewer": _reviewer_problems,
    "timeline_integrator": _integrator_problems,
}


def validate_output(role: str, workspace: Workspace, task: Mapping[str, Any], value: Any,
                    index: WorkspaceIndex | None = None) -> list[str]:
    """All problems of a role's output: JSON schema, file references and quotes, semantics.
    Empty when the output is valid. ``index``: an optional :class:`WorkspaceIndex` of
    ``workspace`` (same answer, fewer passes over the files)."""
    validator = jsonschema.Draft202012Validator(ROLE_SCHEMAS[role])
    problems = [f"schema: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))]
    if problems:
        return problems
    return reference_problems(workspace, value, index) + SEMANTIC_CHECKS[role](workspace, task, value)


# ---- backends -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HeuristicRole:
    """A deterministic role implementation ``fn(workspace, task) -> JSON``, validated like an
    LLM's reply (an invalid output is rejected with the problems, attempts 1).

    ``uses_index``: ``fn`` takes a third argument, the caller's :class:`WorkspaceIndex` (or
    ``None``), so that it need not rebuild its lookups on every call; the built-in heuristics do."""

    name: str
    fn: Callable[..., Any]
    uses_index: bool = False

    def __call__(self, workspace: Workspace, task: Mapping[str, Any],
                 index: WorkspaceIndex | None = None) -> RoleOutcome:
        value = self.fn(workspace, task, index) if self.uses_index else self.fn(workspace, task)
        problems = validate_output(self.name, workspace, task, value, index)
        if problems:
            return RoleOutcome(False, None, f"heuristic {self.name} produced invalid output: {problems}")
        return RoleOutcome(True, value)


_INSTRUCTIONS = {
    "collection_summarizer": (
        "You summarise one collection of files from a shared workspace. Write a card: 'themes' (a few "
        "short topic terms), 'contents' (every member path once, with its kind and a one-line gist), "
        "'evidence' (a few representative lines quoted verbatim from member text files, each with its "
        "path) and 'source_paths' (member paths the card draws on)."),
    "collection_refiner": (
        "The membership of a collection changed. Reread its files and write its updated card "
        "(same fields as before: themes, contents, evidence quoted verbatim, source_paths). The previous "
        "card is given for reference only; the card must describe the current members."),
    "semantic_coordinator": (
        "You compare collection cards and member paths and propose changes: 'split' (move 'paths' of "
        "one collection into a new one), 'merge' (two collections), 'transfer' (move 'paths' from the "
        "first collection to the second), 'overlap' (add 'paths' also to the second collection). Each "
        "proposal needs 'support': theme terms from the cards or file paths that justify it. Propose "
        "nothing you cannot support."),
    "history_synthesizer": (
        "You reconstruct a plausible synthetic work history of the given files: events with action "
        "read, write, copy or export, inputs and outputs (workspace paths), excerpts quoted verbatim from "
        "the files, and optionally one relation (withdraws, supersedes, copies, cites, confirms, redirects) "
        "read as '<source> <kind> <target>' with basis 'quoted' (a quoted line states it) or 'inferred'. "
        "Every event is synthetic (\"synthetic\": true) and its actor and timestamp are invented. A later "
        "timestamp never establishes a withdrawal or supersession: such a relation needs a quoted line. "
        "Never reproduce rubric entries, file labels or category names in any field."),
    "evidence_reviewer": (
        "You review one synthetic event against the files. Check that every excerpt occurs verbatim, that "
        "the action fits the files, and that the relation is supported: withdraws, supersedes, redirects, "
        "cites and confirms need a quoted line of the source naming the target; a later timestamp alone "
        "never supports a withdrawal. Answer with verdict accept or reject and a list of problems."),
    "timeline_integrator": (
        "Order the accepted events so that causal order holds: an event that writes, copies or exports a "
        "file comes before any event that takes that file as input. Answer with 'order', the event ids."),
}


def _file_view(f: WorkspaceFile, max_chars: int) -> str:
    text = readable_text(f, max_chars)
    if text is None:
        body = f"[{f.kind} file, {len(f.data)} bytes: not readable by the text tools]"
    elif not text:
        body = "[empty file]"
    else:
        body = text + ("\n[... cut]" if f.text is not None and len(f.text) > max_chars else "")
    return f"=== {f.path} ({f.kind}, modified {f.modified}) ===\n{body}"


def _files_for(role: str, workspace: Workspace, task: Mapping[str, Any]) -> list[str]:
    if role in ("collection_summarizer", "collection_refiner"):
        return list(task.get("members", ()))
    if role == "history_synthesizer":
        return list(task.get("paths", ()))
    if role == "evidence_reviewer":
        event = task.get("event", {})
        files = list(event.get("inputs", ())) + list(event.get("outputs", ()))
        files += [e["path"] for e in event.get("excerpts", ())]
        if event.get("relation"):
            files += [event["relation"]["source"], event["relation"]["target"]]
        return [p for p in dict.fromkeys(files) if p in set(workspace.paths)]
    return []


def build_messages(role: str, workspace: Workspace, task: Mapping[str, Any], *,
                   max_file_chars: int) -> list[dict[str, str]]:
    """The role's chat prompt: instruction and output schema (system), the task, the workspace
    manifest (paths, kinds, times, sizes) and the files the role reads (user)."""
    system = (_INSTRUCTIONS[role] + "\nReply with one JSON object only, valid against this JSON schema:\n"
              + json.dumps(ROLE_SCHEMAS[role], sort_keys=True))
    manifest = "\n".join(f"{f.path}\t{f.kind}\t{f.modified}\t{len(f.data)} bytes" for f in workspace.files)
    views = [_file_view(workspace.file(p), max_file_chars) for p in _files_for(role, workspace, task)]
    user = (f"Task:\n{json.dumps(dict(task), sort_keys=True)}\n\nWorkspace manifest:\n{manifest}"
            + ("\n\nFiles:\n" + "\n\n".join(views) if views else ""))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_json_object(text: str) -> tuple[Any, str | None]:
    """The JSON object of a reply (a ```json fence is accepted), or ``(None, why)``."""
    body = text.strip()
    fence = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.DOTALL)
    if fence:
        body = fence.group(1)
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return None, f"the reply is not JSON ({err.msg} at line {err.lineno} column {err.colno})"
    if not isinstance(value, dict):
        return None, f"the reply must be a JSON object, got {type(value).__name__}"
    return value, None


@dataclasses.dataclass(frozen=True)
class LLMRoleRunner:
    """A role answered by a chat model, validated and repaired.

    Each attempt sends the prompt (plus, after a failure, the model's reply and the list of
    problems); a reply that parses and passes :func:`validate_output` is returned; after
    ``1 + max_repairs`` failed attempts the outcome is a rejection naming the last problems.
    """

    name: str
    client: Any
    max_repairs: int = 2
    max_tokens: int = 2048
    seed: int = 0
    max_file_chars: int = 4000

    def __post_init__(self):
        if self.name not in ROLE_NAMES:
            raise RoleError(f"unknown role {self.name!r}; roles are {ROLE_NAMES}", field="name")
        if self.max_repairs < 0:
            raise RoleError(f"max_repairs must be >= 0, got {self.max_repairs}", field="max_repairs")

    def __call__(self, workspace: Workspace, task: Mapping[str, Any],
                 index: WorkspaceIndex | None = None) -> RoleOutcome:
        messages = build_messages(self.name, workspace, task, max_file_chars=self.max_file_chars)
        problems: list[str] = []
        for attempt in range(1, self.max_repairs + 2):
            reply = self.client.complete(messages, json_object=True, max_tokens=self.max_tokens,
                                         seed=self.seed + attempt - 1)
            if reply.error is not None or reply.finish_reason == "error":
                problems = [f"the call failed: {reply.error}"]
            else:
                value, why = parse_json_object(reply.text)
                problems = [why] if why else validate_output(self.name, workspace, task, value, index)
                if not problems:
                    return RoleOutcome(True, value, "", attempt)
                if reply.finish_reason == "length":
                    problems.append("the reply was cut by max_tokens")
            messages = messages + [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": "Your reply was rejected:\n- " + "\n- ".join(problems)
                 + "\nAnswer again with one corrected JSON object only."}]
        return RoleOutcome(False, None, f"{self.name}: rejected after {self.max_repairs + 1} attempt(s): "
                           + "; ".join(problems), self.max_repairs + 1)


@dataclasses.dataclass(frozen=True)
class Roles:
    """The six roles the preparation pipelines use, and which backend made them."""

    backend: str
    summarizer: Role
    coordinator: Role
    refiner: Role
    synthesizer: Role
    reviewer: Role
    integrator: Role

    def by_name(self) -> dict[str, Role]:
        return dict(zip(ROLE_NAMES, (self.summarizer, self.coordinator, self.refiner, self.synthesizer,
                                     self.reviewer, self.integrator)))


def _heuristic_roles(client: Any = None, **_: Any) -> Roles:
    from envsched_jax.rethink import collection_map, event_log

    fns = collection_map.heuristic_role_functions() | event_log.heuristic_role_functions()
    return Roles("heuristic", *(HeuristicRole(name, fns[name], uses_index=True) for name in ROLE_NAMES))


def _llm_roles(client: Any = None, *, max_repairs: int = 2, max_tokens: int = 2048, seed: int = 0,
               max_file_chars: int = 4000) -> Roles:
    if client is None or not hasattr(client, "complete"):
        raise RoleError("the llm backend needs a ChatClient (an object with complete(...))", field="client")
    return Roles("llm", *(LLMRoleRunner(name, client, max_repairs, max_tokens, seed, max_file_chars)
                          for name in ROLE_NAMES))


ROLE_BACKENDS: dict[str, Callable[..., Roles]] = {"heuristic": _heuristic_roles, "llm": _llm_roles}


def make_roles(backend: Literal["heuristic", "llm"] = "heuristic", client: Any = None, **options: Any) -> Roles:
    """The :class:`Roles` bundle of a backend (:data:`ROLE_BACKENDS`). ``llm`` needs ``client``
    and accepts ``max_repairs``, ``max_tokens``, ``seed`` and ``max_file_chars``."""
    if backend not in ROLE_BACKENDS:
        raise RoleError(f"unknown role backend {backend!r}; choose one of {tuple(ROLE_BACKENDS)}", field="backend")
    return ROLE_BACKENDS[backend](client, **options)
