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

With a prepared layer (a Collection Map and an Event Log, :func:`envsched_jax.rethink.event_log.prepare`),
the environment has three more tools (``list_collections``, ``read_card``, ``file_history``) and
every agent reads the layer through them (:func:`read_layer`): records a quoted event withdraws or
supersedes are dropped, and a record the map groups with its approval document (and no other
record) is preferred (the paper's Task Executor browses cards and "retrieves sessions by file
path"). The layer tools never say how a collection was formed. An agent never reads labels, the
rubric or the reference.
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


class ToolSession:
    """The agent's side of an episode: calls the file tools on a private copy of the initial
    state (with the prepared ``layer``'s collections and events, if given) and records each call
    as an action."""

    def __init__(self, workspace: Workspace, layer=None):
        self._tools = FileWorkspace()
        for key, value in initial_state(workspace.public(), layer).items():
            setattr(self._tools, key, value)
        self.actions: list[Action] = []

    def call(self, name: str, **arguments) -> Any:
        self.actions.append(Action(name, arguments))
        return getattr(self._tools, name)(**arguments)

    def finish(self, answer: Mapping[str, Any]) -> list[Action]:
        self.call("submit_answer", answer=dict(answer))
        self.actions.append(Action("chat_with_user", {"message": "submitted"}))
        return self.actions


@dataclasses.dataclass(frozen=True)
class Context:
    """What the prepared layer said about the candidate records (read through the layer tools
    by :func:`read_layer`): ``out`` maps a path to the event that withdraws or supersedes it;
    ``in_force`` lists the records the map groups with their approval document."""

    out: Mapping[str, str] = dataclasses.field(default_factory=dict)
    in_force: tuple[str, ...] = ()


def _approval_document(text: str) -> bool:
    """A register or sign-off record, by the wording every one of them carries."""
    lowered = text.lower()
    return "approvals register" in lowered or lowered.lstrip("# ").startswith("sign-off record")


def read_layer(session: ToolSession, candidates: Sequence[str], texts: Mapping[str, str]) -> Context | None:
    """How the agents use a prepared layer (the Task Executor's "browses cards, retrieves
    sessions by file path, checks original evidence", section 4.1), through the tools:

    - ``file_history(path)`` of each candidate: an event whose relation ``withdraws`` or
      ``supersedes`` it on a ``quoted`` basis puts it ``out`` (the log's reviewer admits those only
      with a quoted line of the source, never from a later timestamp);
    - ``list_collections()``: a candidate the map groups with an approval document (a register or
      a sign-off record) and with no other candidate is ``in_force``: the organisation put the
      record next to its approval. The tool does not say how a collection was formed, so a
      task-guided group (TGS) helps only through what it groups.

    ``None`` when the workspace has no layer (the tools say so).
    """
    listing = session.call("list_collections")
    if not listing.get("success"):
        return None
    wanted = set(candidates)
    in_force = []
    for collection in listing["collections"]:
        members = set(collection["members"])
        records = members & wanted
        if len(records) == 1 and any(_approval_document(texts.get(m, "")) for m in members - records):
            in_force.extend(records)
    out = {}
    for path in candidates:
        for event in session.call("file_history", path=path).get("events", []):
            rel = event.get("relation") or {}
            if rel.get("target") == path and rel.get("basis") == "quoted" and rel.get("kind") in ("withdraws", "supersedes"):
                out.setdefault(path, f"{rel.get('source')} {rel.get('kind')} it (event {event.get('event_id')})")
    return Context(out, tuple(dict.fromkeys(in_force)))


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


def _gather(workspace: Workspace, layer) -> tuple[ToolSession, dict[str, str], list[Record]]:
    session = ToolSession(workspace, layer)
    texts = _read_all(session)
    listing = {row["path"]: row["modified"] for row in session.call("list_files")["files"]}
    return session, texts, _of_subject(_records(texts, listing), workspace.request)


def filename_agent(workspace: Workspace, layer=None) -> list[Action]:
    session, texts, candidates = _gather(workspace, layer)
    candidates = _apply_context(candidates, read_layer(session, [r.path for r in candidates], texts) if layer else None)
    if not candidates:
        return session.finish({})
    best = max(candidates, key=lambda r: (_name_claim(r.path), r.modified, r.path))
    return session.finish(_answer(best))


def newest_agent(workspace: Workspace, layer=None) -> list[Action]:
    session, texts, candidates = _gather(workspace, layer)
    candidates = _apply_context(candidates, read_layer(session, [r.path for r in candidates], texts) if layer else None)
    if not candidates:
        return session.finish({})
    best = max(candidates, key=lambda r: (r.modified, r.path))
    return session.finish(_answer(best))


_REGISTER_ROW = re.compile(r"^[^,\n]+,[^,\n]*,[^,\n]*,([^,\n]+),approved,", re.M)
_DOCUMENT = re.compile(r"^Document: (\S+)\s*$", re.M)
_WITHDRAWN_RE = re.compile(r"^Re: (\S+)\s*$", re.M)


def careful_agent(workspace: Workspace, layer=None) -> list[Action]:
    session, texts, candidates = _gather(workspace, layer)
    approved, withdrawn = set(), set()
    for text in texts.values():
        if "approvals register" in text.lower():
            approved.update(_REGISTER_ROW.findall(text))
        if text.lower().startswith("# sign-off record"):
            approved.update(_DOCUMENT.findall(text))
        if "withdrawal notice" in text.lower():
            withdrawn.update(_WITHDRAWN_RE.findall(text))
    context = read_layer(session, [r.path for r in candidates], texts) if layer else None
    if context is not None:
        withdrawn.update(context.out)
    live = [r for r in candidates if r.path not in withdrawn]
    chosen = [r for r in live if r.path in approved]
    if not chosen:
        chosen = [r for r in live if not re.search(r"\b(draft|not approved)\b", r.text, re.I)] or live or candidates
    if not chosen:
        return session.finish({})
    return session.finish(_answer(max(chosen, key=lambda r: (r.modified, r.path))))


AGENTS: dict[str, Callable[..., list[Action]]] = {
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


def run_agent(name: str, workspace: Workspace, layer=None) -> AgentRun:
    """Play agent ``name`` on ``workspace`` (prepared with ``layer``, if given) and score its
    episode with the workspace's rubric (in-process: generated workspaces are the project's own;
    run the actions in a sandbox pool for others)."""
    actions = AGENTS[name](workspace, layer)
    env = workspace_environment("workspace:eval", "evaluation", prepared=layer is not None)
    task = workspace_task(workspace, layer)
    result = run_episode(env, dataclasses.replace(task, env_id=env.env_id), actions)
    passed = sum(result.check_results)
    return AgentRun(name, workspace.workspace_id, result.reward, passed, len(result.check_results),
                    passed == len(result.check_results), result.final_state.get("answer"))
