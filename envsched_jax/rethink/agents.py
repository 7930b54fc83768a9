"""Offline task agents for workspace episodes: honest heuristic stand-ins for the paper's models.

The paper evaluates LLM agents (section 2.2, 5.2, 5.4) and names their failure modes:
incomplete search and reading, trusting filenames, and unchecked reuse. The agents here act
through the same file tools as any agent (:mod:`.file_tools`; every call is recorded as an
:class:`~envsched_jax.pool.model.Action`, so the episode can be replayed in any sandbox) and
embody those behaviours, plus one careful reader:

- ``filename``: trusts the name. Among the records of the requested subject it takes the one
  whose file name claims the most (``final`` > ``approved`` > the highest version number), ties
  to the newest.
- ``newest``: trusts the timestamp: the newest record of the subject.
- ``careful``: reads every text file, applies approvals registers and sign-off records (a record
  they name is in force) and text withdrawal notices (a record they name is out), and otherwise
  takes the newest record whose own status does not say draft / not approved. It cannot read
  images, so an image-only withdrawal is invisible to it, as to every text tool.

*Records* are the text files stating a value in the form of the requested kind (the generator's
formats, :mod:`.generator`: ``Total,<n>`` for budgets, ``Rate: <x> %`` with ``Effective from:``
for rates, ``Entries: <n>`` for reference lists, ``Department: <name>`` for profiles); a record is
*of the subject* when its heading shares the most words with the request. These readers know the
formats of the benchmark they run on: that is what makes them stand-ins rather than general agents.

With a prepared layer (:class:`Context`, from the Collection Map and Event Log of
:mod:`.collection_map` / :mod:`.event_log`), the ``filename`` and ``newest`` agents first drop the
records the context marks as withdrawn or superseded and prefer those it marks as in force: the
paper's Task Executor "checks original evidence" through the log's sessions. An agent never reads
labels, the rubric or the reference.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envsched_jax.envs.inprocess import run_episode
from envsched_jax.pool.model import Action
from envsched_jax.rethink.file_tools import FileWorkspace
from envsched_jax.rethink.pool import initial_state, workspace_environment, workspace_task
from envsched_jax.rethink.workspace import Workspace

_VALUE_PATTERNS = (
    ("budget", re.compile(r"^Total,(\d+(?:\.\d+)?)\s*$", re.M), float),
    ("policy_rate", re.compile(r"^Rate: (\d+(?:\.\d+)?) %\s*$", re.M), float),
    ("reference_list", re.compile(r"^Entries: (\d+)\s*$", re.M), float),
    ("employee_profile", re.compile(r"^Department: (.+?)\s*$", re.M), str),
)
_EFFECTIVE = re.compile(r"^Effective from: (\d{4}-\d{2}-\d{2})\s*$", re.M)
_WORD = re.compile(r"[a-z0-9][a-z0-9\-]{2,}")
_GENERIC = {"project", "budget", "rate", "schedule", "references", "personnel", "record", "employee", "status",
            "the", "and", "for", "list", "approved", "draft", "final"}
_VERSION = re.compile(r"v(\d+)")


@dataclasses.dataclass(frozen=True)
class Record:
    path: str
    value: Any
    heading: str
    modified: str
    text: str
    effective: str = ""


class Context:
    """What a prepared layer tells an agent about a path: ``out`` (withdrawn / superseded,
    with the supporting reason) and ``in_force``. :func:`context_from_layer` builds it from a
    Collection Map and an Event Log (or by hand in tests)."""

    def __init__(self, out: Mapping[str, str] | None = None, in_force: Sequence[str] = ()):
        self.out = dict(out or {})
        self.in_force = tuple(in_force)


def context_from_layer(collection_map, event_log) -> Context:
    """How the agents read a prepared layer (the Task Executor's "retrieve sessions by file path,
    check original evidence"):

    - ``out``: the target of every accepted event whose relation is ``withdraws`` or
      ``supersedes`` on a ``quoted`` basis (the log's reviewer admits those only with a quoted
      line of the source: never from a later timestamp);
    - ``in_force``: the members of the task-guided collections (TGS only: the paper's TGS
      groups files with their clean/noise labels; EGS has none).
    """
    out: dict[str, str] = {}
    for event in event_log.events:
        rel = event.relation
        if rel is not None and rel.basis == "quoted" and rel.kind in ("withdraws", "supersedes"):
            out.setdefault(rel.target, f"{rel.source} {rel.kind} it (event {event.event_id})")
    in_force = [m for c in collection_map.collections if c.origin == "task_guided" for m in c.members]
    return Context(out, in_force)


class ToolSession:
    """The agent's side of an episode: calls the file tools on a private copy of the initial
    state and records each call as an action."""

    def __init__(self, workspace: Workspace):
        self._tools = FileWorkspace()
        for key, value in initial_state(workspace.public()).items():
            setattr(self._tools, key, value)
        self.actions: list[Action] = []

    def call(self, name: str, **arguments) -> Any:
        self.actions.append(Action(name, arguments))
        return getattr(self._tools, name)(**arguments)

    def finish(self, answer: Mapping[str, Any]) -> list[Action]:
        self.call("submit_answer", answer=dict(answer))
        self.actions.append(Action("chat_with_user", {"message": "submitted"}))
        return self.actions


def _read_all(session: ToolSession) -> dict[str, str]:
    texts = {}
    for row in session.call("list_files")["files"]:
        if row["kind"] == "text":
            reply = session.call("read_file", path=row["path"])
            if reply.get("success"):
                texts[row["path"]] = reply["text"]
    return texts


def _records(texts: Mapping[str, str], listing: Mapping[str, str]) -> list[Record]:
    """Text files stating a value of the most common record kind."""
    by_kind: dict[str, list[Record]] = {}
    for path, text in texts.items():
        for kind, pattern, cast in _VALUE_PATTERNS:
            match = pattern.search(text)
            if match:
                eff = _EFFECTIVE.search(text)
                heading = next((line for line in text.splitlines() if line.strip()), "")
                by_kind.setdefault(kind, []).append(Record(path, cast(match.group(1)), heading, listing[path], text,
                                                           eff.group(1) if eff else ""))
                break
    return max(by_kind.values(), key=len) if by_kind else []


def _of_subject(records: Sequence[Record], request: str) -> list[Record]:
    """The records whose heading shares the most non-generic words with the request."""
    wanted = set(_WORD.findall(request.lower())) - _GENERIC
    scored = [(len((set(_WORD.findall(r.heading.lower())) - _GENERIC) & wanted), r) for r in records]
    best = max((s for s, _ in scored), default=0)
    return [r for s, r in scored if s == best and best > 0] or list(records)


def _name_claim(path: str) -> tuple[int, int]:
    name = path.rsplit("/", 1)[-1].lower()
    claim = 2 if "final" in name else 1 if "approved" in name else 0
    versions = [int(v) for v in _VERSION.findall(name)]
    return claim, max(versions, default=-1)


def _answer(record: Record) -> dict[str, Any]:
    value = record.value
    if isinstance(value, float) and value.is_integer() and not record.effective:
        value = int(value)
    out = {"value": value, "source": record.path}
    if record.effective:
        out["effective_date"] = record.effective
    return out


def _apply_context(candidates: list[Record], context: Context | None) -> list[Record]:
    if context is None:
        return candidates
    kept = [r for r in candidates if r.path not in context.out] or candidates
    preferred = [r for r in kept if r.path in context.in_force]
    return preferred or kept


def filename_agent(workspace: Workspace, context: Context | None = None) -> list[Action]:
    session = ToolSession(workspace)
    texts = _read_all(session)
    listing = {row["path"]: row["modified"] for row in session.call("list_files")["files"]}
    candidates = _apply_context(_of_subject(_records(texts, listing), workspace.request), context)
    if not candidates:
        return session.finish({})
    best = max(candidates, key=lambda r: (_name_claim(r.path), r.modified, r.path))
    return session.finish(_answer(best))


def newest_agent(workspace: Workspace, context: Context | None = None) -> list[Action]:
    session = ToolSession(workspace)
    texts = _read_all(session)
    listing = {row["path"]: row["modified"] for row in session.call("list_files")["files"]}
    candidates = _apply_context(_of_subject(_records(texts, listing), workspace.request), context)
    if not candidates:
        return session.finish({})
    best = max(candidates, key=lambda r: (r.modified, r.path))
    return session.finish(_answer(best))


_REGISTER_ROW = re.compile(r"^[^,\n]+,[^,\n]*,[^,\n]*,([^,\n]+),approved,", re.M)
_DOCUMENT = re.compile(r"^Document: (\S+)\s*$", re.M)
_WITHDRAWN_RE = re.compile(r"^Re: (\S+)\s*$", re.M)


def careful_agent(workspace: Workspace, context: Context | None = None) -> list[Action]:
    session = ToolSession(workspace)
    texts = _read_all(session)
    listing = {row["path"]: row["modified"] for row in session.call("list_files")["files"]}
    candidates = _of_subject(_records(texts, listing), workspace.request)
    approved, withdrawn = set(), set()
    for text in texts.values():
        if "approvals register" in text.lower():
            approved.update(_REGISTER_ROW.findall(text))
        if text.lower().startswith("# sign-off record"):
            approved.update(_DOCUMENT.findall(text))
        if "withdrawal notice" in text.lower():
            withdrawn.update(_WITHDRAWN_RE.findall(text))
    if context is not None:
        withdrawn.update(context.out)
    live = [r for r in candidates if r.path not in withdrawn]
    chosen = [r for r in live if r.path in approved]
    if not chosen:
        chosen = [r for r in live if not re.search(r"\b(draft|not approved)\b", r.text, re.I)] or live or candidates
    if not chosen:
        return session.finish({})
    return session.finish(_answer(max(chosen, key=lambda r: (r.modified, r.path))))


AGENTS: dict[str, Callable[[Workspace, Context | None], list[Action]]] = {
    "filename": filename_agent, "newest": newest_agent, "careful": careful_agent}


@dataclasses.dataclass(frozen=True)
class AgentRun:
    agent: str
    workspace_id: str
    reward: float
    passed: int
    total: int
    success: bool
    answer: Any


def run_agent(name: str, workspace: Workspace, context: Context | None = None) -> AgentRun:
    """Play agent ``name`` on ``workspace`` and score its episode with the workspace's rubric
    (in-process: generated workspaces are the project's own; use a sandbox pool for others)."""
    actions = AGENTS[name](workspace, context)
    env = workspace_environment("workspace:eval", "evaluation")
    task = workspace_task(workspace)
    result = run_episode(env, dataclasses.replace(task, env_id=env.env_id), actions)
    passed = sum(result.check_results)
    return AgentRun(name, workspace.workspace_id, result.reward, passed, len(result.check_results),
                    passed == len(result.check_results), result.final_state.get("answer"))
