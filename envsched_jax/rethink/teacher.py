"""The paper's route to a learned file verifier: sub-environments, teacher trajectories,
qualification with revised hints, and a masked-SFT corpus (seeds/002 section 4.1 "Offline
post-training", appendix A.5-A.7, B.1-B.3).

Pipeline (each step a small function over frozen records):

1. :func:`cut_sub_environments` cuts *verification sub-environments* from a labelled workspace
   (A.5): every file that is not out of scope (authoritative records, their decoy chains,
   version families, redirects), closed under label evidence, plus a seeded number of fillers
   reaching a size drawn from the A.5 mixture.
2. A *teacher* (registry :data:`TEACHERS`) inspects a sub-environment through the file tools of
   :mod:`.file_tools` and returns a :class:`~.verify.VerificationTrajectory` (tool steps with their
   observations, then per-file judgments). ``heuristic`` lists the files, reads every readable
   one, and judges what it read with :class:`~.verify.EvidenceVerifier`; ``llm`` drives any
   :class:`~envsched_jax.graph.llm_clients.ChatClient` through a JSON tool-call loop
   (:func:`run_tool_loop`) whose replies are validated (JSON schema, existing files) and repaired
   or rejected with a reason.
3. :func:`run_teachers` qualifies each trajectory (:func:`~.verify.qualify`, A.7); a failure is
   retried at most :attr:`QualifyConfig.max_retries` (2) times with a hint revised by a separate
   *hint reviser* (registry :data:`HINT_REVISERS`) that sees the failures and the annotations
   (A.6); the remaining failures are kept for analysis. Each accepted trajectory carries its
   :class:`Provenance` (teacher, hint level, attempt, revised hint, digest of the teacher prompt).
4. :func:`build_corpus` turns qualified trajectories into chats with the *student* prompt
   (:func:`student_prompt`: instruction, schema, reading requirements, no teacher hint), tokenises
   them with the policy's chat template and a loss mask over the assistant tokens only (the m_t of
   L_SFT), drops (never truncates) examples longer than the context, rotates among teachers when
   a sub-environment has several trajectories (B.3), and splits train / dev.
5. :func:`lm_metrics` (loss and token accuracy of B.2) and :func:`student_verify` (the trained
   policy run as a verifier through the same tool loop; unparsable output = missing predictions)
   serve ``experiments/rethink_sft.py``.

Choices the paper leaves open are marked "Choice:" where they are made.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import jsonschema
import numpy as np

from envsched_jax.rethink import file_tools
from envsched_jax.rethink.pool import initial_state
from envsched_jax.rethink.verify import (
    EvidenceVerifier,
    Prediction,
    Qualification,
    ToolStep,
    VerificationTrajectory,
    qualify,
    verifier_view,
)
from envsched_jax.rethink.workspace import (
    CATEGORIES,
    PARTITIONS,
    SIZE_CLASSES,
    SIZE_MIX,
    Workspace,
    WorkspaceError,
    WorkspaceFile,
)

# ---- 1. sub-environments (appendix A.5) -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SubEnvConfig:
    """How sub-environments are cut from one labelled workspace.

    Attributes:
      per_workspace: cuts attempted per workspace.
      max_identical: the most cuts with the same file set (A.2: "identical file sets at most
        twice"); further duplicates are skipped.
      seed: seeds every draw (with the workspace id, so a workspace's cuts do not depend on the
        others).
    """

    per_workspace: int = 2
    max_identical: int = 2
    seed: int = 0

    def __post_init__(self):
        if self.per_workspace < 1 or self.max_identical < 1:
            raise WorkspaceError(f"per_workspace and max_identical must be >= 1, got {self.per_workspace}, "
                                 f"{self.max_identical}", field="per_workspace")


def core_paths(workspace: Workspace) -> tuple[str, ...]:
    """The files a sub-environment must keep (A.5): every file whose label is not
    ``out_of_scope`` (authoritative records, version families, decoy chains, redirects and the
    evidence files), closed under label evidence (a kept file's evidence is kept too, even a
    filler). In the workspace's file order."""
    labels = _labels(workspace)
    keep = {p for p, y in labels.items() if y.category != "out_of_scope"}
    frontier = list(keep)
    while frontier:
        for e in labels[frontier.pop()].evidence:
            if e not in keep:
                keep.add(e)
                frontier.append(e)
    return tuple(p for p in workspace.paths if p in keep)


def _labels(workspace: Workspace):
    if not workspace.labelled:
        missing = [f.path for f in workspace.files if f.label is None]
        raise WorkspaceError("cutting sub-environments needs every file labelled",
                             source=f"workspace {workspace.workspace_id!r}", path=missing[0], field="label")
    return workspace.labels()


def _stable_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def size_class_of(count: int, preferred: str) -> str:
    """``preferred`` if ``count`` lies in its A.5 range, else the first class (small, medium,
    large) whose range holds it."""
    lo, hi = SIZE_CLASSES[preferred]
    if lo <= count <= hi:
        return preferred
    return next(name for name, (a, b) in SIZE_CLASSES.items() if a <= count <= b)


def cut_sub_environments(workspace: Workspace, config: SubEnvConfig = SubEnvConfig()) -> list[Workspace]:
    """Verification sub-environments of one labelled workspace (A.5).

    Each cut keeps :func:`core_paths` and adds fillers (the out-of-scope files outside the core)
    up to a target count: a size class is drawn from :data:`~.workspace.SIZE_MIX`, then a count
    uniformly in its range (:data:`~.workspace.SIZE_CLASSES`). Choice: the count is clipped to
    what the workspace can give (never fewer than the core, never more than all its files), and
    the recorded ``size_class`` is the drawn one when the count lies in its range, else the
    first class holding the count. Sub-environments keep the request, rubric and reference
    (the core holds every file the reference needs), the parent task, and record their source in
    ``metadata`` (``sub_environment_of``, ``drawn_size_class``, ``core_files``).
    """
    core = core_paths(workspace)
    core_set = set(core)
    fillers = [p for p in workspace.paths if p not in core_set]
    rng = np.random.default_rng([config.seed, _stable_seed(workspace.workspace_id)])
    classes, weights = tuple(SIZE_MIX), np.asarray(tuple(SIZE_MIX.values()))
    seen: collections.Counter[frozenset[str]] = collections.Counter()
    out = []
    for k in range(config.per_workspace):
        drawn = str(rng.choice(classes, p=weights / weights.sum()))
        lo, hi = SIZE_CLASSES[drawn]
        target = int(np.clip(rng.integers(lo, hi + 1), len(core), len(core) + len(fillers)))
        chosen = set(rng.choice(len(fillers), size=target - len(core), replace=False).tolist()) if fillers else set()
        keep = core_set | {fillers[i] for i in chosen}
        key = frozenset(keep)
        if seen[key] >= config.max_identical:
            continue
        seen[key] += 1
        files = tuple(f for f in workspace.files if f.path in keep)
        out.append(dataclasses.replace(
            workspace, workspace_id=f"{workspace.workspace_id}-sub{k}", files=files,
            size_class=size_class_of(len(files), drawn),
            metadata={"sub_environment_of": workspace.workspace_id, "drawn_size_class": drawn,
                      "core_files": len(core)}))
    return out


def cut_all(workspaces: Iterable[Workspace], config: SubEnvConfig = SubEnvConfig()) -> list[Workspace]:
    """:func:`cut_sub_environments` of every workspace, in order."""
    return [sub for ws in workspaces for sub in cut_sub_environments(ws, config)]


# ---- prompts (appendix A.6, B.1) --------------------------------------------------------------------

HINT_LEVELS = ("L0", "L1", "L2")
"""A.6: L0 the verification task only, L1 adds category features and separates the claimed stage
from the verified category, L2 adds a checking sequence."""

READ_TOOLS = ("list_files", "read_file", "search_files")
"""The tools a verifier may call (verification writes nothing and submits no task answer)."""
STEP_NAMES = {"list_files": "list", "read_file": "read", "search_files": "search"}
"""File tool -> :class:`~.verify.ToolStep` name (what :func:`~.verify.qualify` reads)."""
TOOL_OF_STEP = {v: k for k, v in STEP_NAMES.items()}

VERIFICATION_INSTRUCTION = (
    "You verify a collection of files. For every file in the collection decide whether it is a "
    "standard file (an authoritative record) or noise, which category it belongs to, the stage it "
    "shows, the version family it belongs to and its place in that family's timeline, and which "
    "files support your judgment. Judge each file relative to the other records, not by the "
    "status it claims for itself.")

TOOL_PROTOCOL = (
    "Reply with exactly one JSON object per turn and nothing else. To call a tool: "
    '{"tool": "list_files", "arguments": {"directory": ""}}, '
    '{"tool": "read_file", "arguments": {"path": "<path>", "start_line": 1}} or '
    '{"tool": "search_files", "arguments": {"query": "<text>"}}. '
    "The tool's result comes back in the next message. When you have read enough, reply with "
    'your final judgments: {"judgments": [{"path": "<path>", "partition": "standard|noise", '
    '"category": "<category>", "stage": "<stage or empty>", "family": "<family or empty>", '
    '"order": <integer or null>, "evidence": ["<path>", ...]}, ...]}.')

SCHEMA_TEXT = (
    "Categories: " + ", ".join(CATEGORIES) + ". A file is standard exactly when its category is "
    "authoritative_record; every other category is noise. stage is the stage the file shows "
    "(draft, revised, review, final, approved, proposed, withdrawn, superseded, archived) or an "
    "empty string; family names the document a file is a version of (empty if none); order is the "
    "file's position in its family's timeline, 0 for the earliest (null outside a family); "
    "evidence lists the paths of the files that support the judgment.")

READING_REQUIREMENTS = (
    "Reading requirements: list the collection first; read every text file before you judge it; "
    "cite as evidence only files you have read or listed; images and binary files cannot be read "
    "with the text tools, judge them from the listing; give a judgment for every file.")

HINTS = {
    "L0": "",
    "L1": ("Category features: an authoritative record is backed by a register, a sign-off or "
           "content consistency; a false final version claims to be final or newest but is "
           "contradicted by a notice, a register or its own content; fabricated authority is an "
           "approval or confirmation that no register backs, or several notes repeating one "
           "outdated source; a misleading redirection points to a withdrawn or unapproved file; "
           "a superseded version is an earlier member of a family; out-of-scope files belong to "
           "other subjects. The stage a file claims (its name, its status line) is not its "
           "verified category."),
    "L2": ("Checking sequence: (1) read registers, sign-offs and notices first and note what they "
           "approve or withdraw; (2) group files into version families by name; (3) in each "
           "family, the approved member not withdrawn is authoritative, earlier members are "
           "superseded, a newer member claiming finality without approval is a false final; "
           "(4) check each approval or confirmation against the register; (5) check every pointer "
           "note's target; (6) everything else is out of scope; (7) order family members by their "
           "true timeline."),
}
"""Teacher hint text per level; L2 includes L1's features (levels are cumulative)."""


def student_prompt() -> str:
    """The student's system prompt (A.6, B.1): the verification instruction, the tool protocol,
    the schema and the reading requirements, without any discriminative guidance or hint."""
    return "\n\n".join((VERIFICATION_INSTRUCTION, TOOL_PROTOCOL, SCHEMA_TEXT, READING_REQUIREMENTS))


@dataclasses.dataclass(frozen=True)
class Hint:
    """A teacher's hint: the A.6 level and, after a failed attempt, the reviser's notes."""

    level: str = "L0"
    notes: str = ""

    def __post_init__(self):
        if self.level not in HINT_LEVELS:
            raise WorkspaceError(f"hint level must be one of {HINT_LEVELS}, got {self.level!r}", field="hint")

    def text(self) -> str:
        parts = [HINTS["L1"]] if self.level in ("L1", "L2") else []
        if self.level == "L2":
            parts.append(HINTS["L2"])
        if self.notes:
            parts.append("Notes from the review of your previous attempt:\n" + self.notes)
        return "\n\n".join(parts)


def teacher_prompt(hint: Hint) -> str:
    """The teacher's system prompt: the student prompt plus the hint (empty at L0 without notes)."""
    extra = hint.text()
    return student_prompt() + ("\n\nHints for this run:\n" + extra if extra else "")


def manifest_text(workspace: Workspace) -> str:
    """The user message (B.1): the collection manifest (path, kind, modification time, size);
    never the request (section 4.1) nor labels."""
    rows = "\n".join(f"{f.path}\t{f.kind}\t{f.modified}\t{len(f.data)}" for f in workspace.files)
    return (f"Collection {workspace.workspace_id} ({len(workspace.files)} files; path, kind, modified, "
            f"bytes):\n{rows}")


# ---- the file tools and their observations ----------------------------------------------------------


def open_tools(workspace: Workspace) -> file_tools.FileWorkspace:
    """A :class:`~.file_tools.FileWorkspace` holding the public files of ``workspace``."""
    tools = file_tools.FileWorkspace()
    for key, value in initial_state(workspace.public()).items():
        setattr(tools, key, value)
    return tools


def format_observation(tool: str, result: Mapping[str, Any]) -> str:
    """A tool result as the text a model reads.

    Choice: plain text rather than JSON, so that a read's observation holds the file's text
    verbatim (read fidelity, :func:`~.verify.qualify`, looks for the file's first characters in
    it): a header line, then the lines, then a newline (the tool joins lines without the final
    one)."""
    if not result.get("success", False):
        return f"error: {result.get('error', 'the call failed')}"
    if tool == "list_files":
        rows = result["files"]
        return f"{len(rows)} files:\n" + "".join(
            f"{r['path']}\t{r['kind']}\t{r['modified']}\t{r['size']}\n" for r in rows)
    if tool == "read_file":
        start = result["start_line"]
        end = start + max(len(result["text"].splitlines()), 1) - 1
        return f"{result['path']} (lines {start}-{min(end, result['total_lines'])} of " \
               f"{result['total_lines']}):\n{result['text']}\n"
    hits = result["hits"]
    return f"{len(hits)} hits{' (truncated)' if result['truncated'] else ''}:\n" + "".join(
        f"{h['path']}:{h['line']}: {h['text']}\n" for h in hits)


def call_tool(tools: file_tools.FileWorkspace, tool: str, arguments: Mapping[str, Any]) -> tuple[ToolStep, dict]:
    """Run one read-only tool call; returns the trajectory step and the raw result. A wrong call
    (unknown tool, bad arguments) is an error observation, never an exception."""
    if tool not in READ_TOOLS:
        result = {"success": False, "error": f"unknown tool {tool!r}; use one of {list(READ_TOOLS)}"}
    else:
        try:
            result = getattr(tools, tool)(**dict(arguments))
        except TypeError as err:
            result = {"success": False, "error": f"bad arguments for {tool}: {err}"}
    step_args = dict(arguments)
    if tool == "list_files":
        step_args = {"path": str(arguments.get("directory", ""))}
    return ToolStep(STEP_NAMES.get(tool, tool), step_args, format_observation(tool, result)), result


def tool_call_of(step: ToolStep) -> dict[str, Any]:
    """The tool call (as the model writes it) that produced ``step``."""
    tool = TOOL_OF_STEP.get(step.tool, step.tool)
    arguments = dict(step.arguments)
    if tool == "list_files":
        arguments = {"directory": arguments.get("path", "")}
    return {"tool": tool, "arguments": arguments}


# ---- 2. teachers (appendix A.6) ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TeacherRun:
    """One teacher attempt: the trajectory, the system prompt it was given (hints included, kept
    for provenance only) and the problems met (invalid replies, failed calls)."""

    trajectory: VerificationTrajectory
    prompt: str
    problems: tuple[str, ...] = ()


class Teacher(Protocol):
    """``run(view, hint) -> TeacherRun`` on :func:`~.verify.verifier_view` of a sub-environment.
    ``hint_sensitive`` says whether a revised hint can change what the teacher does."""

    name: str
    hint_sensitive: bool

    def run(self, view: Workspace, hint: Hint) -> TeacherRun: ...


def _observed_workspace(view: Workspace, listing: Sequence[Mapping[str, Any]], texts: Mapping[str, str]) -> Workspace:
    """The collection as the tools showed it: listed files, with the text read for text files.
    Choice: an unreadable file (image or binary) gets placeholder bytes of its listed kind, since
    the tools never show its bytes."""
    placeholder = {"image": b"\x89PNG\r\n\x1a\n", "binary": b"\x00"}
    files = []
    for row in listing:
        if row["kind"] == "text":
            data = texts.get(row["path"], "").encode("utf-8")
        else:
            data = placeholder.get(row["kind"], b"\x00")
        files.append(WorkspaceFile(row["path"], data, row["modified"] or "1970-01-01T00:00:00Z", row["kind"]))
    return dataclasses.replace(view, files=tuple(files))


@dataclasses.dataclass(frozen=True)
class HeuristicTeacher:
    """A deterministic teacher: list the collection, read every text file (page by page when it
    is longer than the tool's line limit), then judge the collection *as read* (rebuilt from the
    observations, :func:`_observed_workspace`) with :class:`~.verify.EvidenceVerifier`.

    The hint level changes only the prompt recorded for provenance: this teacher reads no
    prompt, so a revised hint cannot change its judgments (``hint_sensitive`` False) and a
    failed trajectory fails again on retry; the retries are still run and recorded so that every
    teacher goes through the same protocol.
    """

    name: str = "heuristic"
    hint_sensitive: bool = False

    def run(self, view: Workspace, hint: Hint) -> TeacherRun:
        tools = open_tools(view)
        steps = []
        step, listing = call_tool(tools, "list_files", {"directory": ""})
        steps.append(step)
        texts: dict[str, str] = {}
        for row in listing["files"]:
            if row["kind"] != "text":
                continue
            pages, start = [], 1
            while True:
                arguments = {"path": row["path"]} if start == 1 else {"path": row["path"], "start_line": start}
                step, result = call_tool(tools, "read_file", arguments)
                steps.append(step)
                if not result.get("success"):
                    break
                pages.append(result["text"])
                start += file_tools.MAX_LINES
                if start > result["total_lines"]:
                    break
            texts[row["path"]] = "\n".join(pages) + ("\n" if pages and pages[-1] else "")
        observed = _observed_workspace(view, listing["files"], texts)
        predictions = EvidenceVerifier().predict(observed)
        return TeacherRun(VerificationTrajectory(tuple(steps), predictions), teacher_prompt(hint))


JUDGMENT_SCHEMA = {
    "type": "object", "required": ["path", "partition", "category"], "additionalProperties": False,
    "properties": {
        "path": {"type": "string"}, "partition": {"enum": list(PARTITIONS)},
        "category": {"enum": list(CATEGORIES)}, "stage": {"type": "string"}, "family": {"type": "string"},
        "order": {"type": ["integer", "null"]}, "evidence": {"type": "array", "items": {"type": "string"}},
    },
}
REPLY_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["tool", "arguments"], "additionalProperties": False,
         "properties": {"tool": {"enum": list(READ_TOOLS)}, "arguments": {"type": "object"}}},
        {"type": "object", "required": ["judgments"], "additionalProperties": False,
         "properties": {"judgments": {"type": "array", "items": JUDGMENT_SCHEMA}}},
    ],
}
"""A reply of the tool loop: one tool call, or the final judgments."""


def parse_reply(text: str) -> tuple[dict | None, str | None]:
    """(the reply's JSON object, None) or (None, the reason it is invalid). Choice: the first
    JSON object in the text is taken (models often wrap it in prose or a code fence)."""
    start = text.find("{")
    if start < 0:
        return None, "no JSON object in the reply"
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as err:
        return None, f"invalid JSON: {err.msg} at character {err.pos}"
    errors = list(jsonschema.Draft202012Validator(REPLY_SCHEMA).iter_errors(value))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        where = "/".join(map(str, best.absolute_path)) or "(top)"
        return None, f"schema: {where}: {best.message}"
    return value, None


def judgments_of(value: Mapping[str, Any], known: Iterable[str]) -> tuple[dict[str, Prediction], list[str]]:
    """Predictions from a schema-valid ``{"judgments": [...]}`` and the problems of the rejected
    entries (unknown path, evidence naming a file the collection lacks, a repeated path). Valid
    entries are kept."""
    known = set(known)
    out: dict[str, Prediction] = {}
    problems = []
    for k, j in enumerate(value["judgments"]):
        path = j["path"]
        bad = [e for e in j.get("evidence", ()) if e not in known]
        if path not in known:
            problems.append(f"judgments/{k}: no file {path!r} in the collection")
        elif path in out:
            problems.append(f"judgments/{k}: {path!r} judged twice")
        elif bad:
            problems.append(f"judgments/{k}: evidence {bad} not in the collection")
        else:
            out[path] = Prediction(j["partition"], j["category"], j.get("stage", ""), j.get("family", ""),
                                   j.get("order"), tuple(j.get("evidence", ())))
    return out, problems


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The JSON tool-call loop's limits.

    Attributes:
      max_turns: model replies per run (tool calls, repairs and the final answer together).
      max_repairs: invalid replies answered with the reason before the run gives up.
      max_tokens: per reply.
      seed: passed to the client.
    """

    max_turns: int = 200
    max_repairs: int = 3
    max_tokens: int = 4096
    seed: int = 0


OBSERVATION_ROLE = "user"
"""Choice: tool observations come back as ``user`` messages ("Observation of read_file: ...")
rather than a ``tool`` role, which needs tool-call ids on OpenAI-compatible servers and which
some chat templates (SmolLM2's) do not know. The SFT chats use the same turns, so the student is
trained on exactly what the loop shows it."""


def observation_message(tool: str, observation: str) -> dict[str, str]:
    return {"role": OBSERVATION_ROLE, "content": f"Observation of {tool}:\n{observation}"}


def run_tool_loop(client, view: Workspace, system_prompt: str, config: LoopConfig = LoopConfig()
                  ) -> tuple[VerificationTrajectory, tuple[str, ...], list[dict[str, str]]]:
    """Drive ``client`` (a :class:`~envsched_jax.graph.llm_clients.ChatClient`) through the tool
    protocol on ``view``: (trajectory, problems, transcript).

    Every reply is parsed and validated (:func:`parse_reply`, :func:`judgments_of`); an invalid
    one is answered with its reason and counts against ``max_repairs``; a failed call, the turn
    limit or the repair limit ends the run with the judgments so far (none: every file missing).
    Judgments with problems are answered once with the reasons; if the repair budget runs out,
    the valid entries are kept."""
    tools = open_tools(view)
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": manifest_text(view)}]
    steps: list[ToolStep] = []
    problems: list[str] = []
    predictions: dict[str, Prediction] = {}
    repairs = 0
    for _ in range(config.max_turns):
        reply = client.complete(messages, json_object=True, max_tokens=config.max_tokens, seed=config.seed)
        if reply.error is not None:
            problems.append(f"call failed: {reply.error}")
            break
        messages.append({"role": "assistant", "content": reply.text})
        value, reason = parse_reply(reply.text)
        if value is not None and "judgments" in value:
            predictions, bad = judgments_of(value, view.paths)
            if not bad:
                break
            reason = "; ".join(bad)
        if reason is not None:
            problems.append(reason)
            repairs += 1
            if repairs > config.max_repairs:
                problems.append(f"gave up after {config.max_repairs} repairs")
                break
            messages.append({"role": "user", "content": f"Invalid reply ({reason}). Reply with one JSON object "
                                                         "following the protocol."})
            continue
        step, _ = call_tool(tools, value["tool"], value["arguments"])
        steps.append(step)
        messages.append(observation_message(value["tool"], step.observation))
    else:
        problems.append(f"no final judgments within {config.max_turns} turns")
    return VerificationTrajectory(tuple(steps), predictions), tuple(problems), messages


@dataclasses.dataclass
class LLMTeacher:
    """A teacher backed by a chat model (:class:`~envsched_jax.graph.llm_clients.ChatClient`:
    the OpenAI-compatible / vLLM client, or the in-process JAX model through
    ``BackendChatClient``), driven by :func:`run_tool_loop` with :func:`teacher_prompt`. A revised
    hint changes its prompt (``hint_sensitive``)."""

    client: Any
    name: str = "llm"
    loop: LoopConfig = dataclasses.field(default_factory=LoopConfig)
    hint_sensitive: bool = True

    def run(self, view: Workspace, hint: Hint) -> TeacherRun:
        prompt = teacher_prompt(hint)
        trajectory, problems, _ = run_tool_loop(self.client, view, prompt, self.loop)
        return TeacherRun(trajectory, prompt, problems)


TEACHERS: dict[str, Callable[..., Teacher]] = {"heuristic": HeuristicTeacher, "llm": LLMTeacher}
"""Teachers by name (``llm`` needs ``client=``)."""


def make_teacher(name: str, **kwargs) -> Teacher:
    try:
        return TEACHERS[name](**kwargs)
    except KeyError:
        raise WorkspaceError(f"unknown teacher {name!r}; known: {sorted(TEACHERS)}", field="teacher") from None


# ---- 3. qualification, hint revision, retries (appendix A.6, A.7) ----------------------------------

CHECK_GUIDANCE = {
    "missing_judgment": "give a judgment for every file of the collection, and only for them",
    "read_fidelity": "read (or, for images and binary files, list) every file before judging it",
    "evidence_not_read": "cite as evidence only files you have actually read or listed",
    "partition_f1": "separate standard files from noise more carefully",
    "false_rejection": "do not judge a supported authoritative record as noise",
    "strong_decoy": "check claims of finality and authority against registers and notices",
    "version_order": "order every version family by its true timeline",
}


def revise_from_annotations(hint: Hint, qualification: Qualification, workspace: Workspace) -> Hint:
    """The hint reviser (A.6): a separate step that sees the failed trajectory's qualification
    and the ground-truth annotations and writes the next hint.

    Choice: it raises the hint level by one (up to L2) and writes one note per failure naming
    the check, the file, the guidance of :data:`CHECK_GUIDANCE` and, where the annotation has
    them, the file's annotated category and supporting files (the "annotations" the paper's
    reviser uses). Such notes carry label information, which is why the student prompt never
    holds a hint (:func:`student_prompt`)."""
    labels = workspace.labels()
    notes = []
    for failure in qualification.failures:
        line = f"- {failure.check}: {failure.path or 'collection'}: {CHECK_GUIDANCE.get(failure.check, failure.detail)}"
        y = labels.get(failure.path)
        if y is not None and failure.check in ("strong_decoy", "false_rejection", "version_order"):
            line += f" (annotated {y.category}" + (f", supported by {', '.join(y.evidence)}" if y.evidence else "") + ")"
        notes.append(line)
    level = HINT_LEVELS[min(HINT_LEVELS.index(hint.level) + 1, len(HINT_LEVELS) - 1)]
    return Hint(level, "\n".join(dict.fromkeys(notes)))


HINT_REVISERS: dict[str, Callable[[Hint, Qualification, Workspace], Hint]] = {"annotations": revise_from_annotations}


@dataclasses.dataclass(frozen=True)
class QualifyConfig:
    """Attributes:
      start_hint: the first attempt's hint level (A.6).
      max_retries: further attempts after a failed one (A.7: at most two).
      reviser: a name in :data:`HINT_REVISERS`.
      min_f1: the partition-F1 threshold of :func:`~.verify.qualify` (A.7: 0.9).
    """

    start_hint: str = "L0"
    max_retries: int = 2
    reviser: str = "annotations"
    min_f1: float = 0.9

    def __post_init__(self):
        if self.start_hint not in HINT_LEVELS:
            raise WorkspaceError(f"start_hint must be one of {HINT_LEVELS}, got {self.start_hint!r}",
                                 field="start_hint")
        if not 0 <= self.max_retries <= 2:
            raise WorkspaceError(f"max_retries must lie in [0, 2] (appendix A.7), got {self.max_retries}",
                                 field="max_retries")
        if self.reviser not in HINT_REVISERS:
            raise WorkspaceError(f"unknown reviser {self.reviser!r}; known: {sorted(HINT_REVISERS)}", field="reviser")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where an accepted trajectory came from (A.6: prompt provenance)."""

    teacher: str
    hint_level: str
    attempt: int
    hint_notes: str
    prompt_sha256: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One qualification attempt (accepted or not)."""

    sub_env_id: str
    provenance: Provenance
    passed: bool
    reasons: tuple[str, ...]
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"sub_env_id": self.sub_env_id, **self.provenance.to_json(), "passed": self.passed,
                "reasons": list(self.reasons), "problems": list(self.problems)}


@dataclasses.dataclass(frozen=True)
class QualifiedTrajectory:
    """An accepted trajectory with its sub-environment and provenance."""

    workspace: Workspace
    trajectory: VerificationTrajectory
    provenance: Provenance


@dataclasses.dataclass(frozen=True)
class TeacherRecord:
    """Everything :func:`run_teachers` did: the accepted trajectories, every attempt, and the
    (sub-environment, teacher) pairs that failed all attempts (kept for analysis, A.7)."""

    accepted: tuple[QualifiedTrajectory, ...]
    attempts: tuple[Attempt, ...]
    failed: tuple[tuple[str, str], ...]

    def summary(self) -> dict[str, Any]:
        reasons = collections.Counter(r.split(":", 1)[0] for a in self.attempts if not a.passed for r in a.reasons)
        by_attempt = collections.Counter(q.provenance.attempt for q in self.accepted)
        return {"accepted": len(self.accepted), "attempts": len(self.attempts), "failed": len(self.failed),
                "accepted_by_attempt": {str(k): v for k, v in sorted(by_attempt.items())},
                "failure_checks": dict(sorted(reasons.items()))}


def qualify_with_retries(teacher: Teacher, sub_env: Workspace, config: QualifyConfig = QualifyConfig()
                         ) -> tuple[QualifiedTrajectory | None, list[Attempt]]:
    """A.7: run ``teacher`` on :func:`~.verify.verifier_view` of ``sub_env``, qualify against the
    labels, and on failure retry with the reviser's hint, at most ``max_retries`` times."""
    view = verifier_view(sub_env)
    reviser = HINT_REVISERS[config.reviser]
    hint = Hint(config.start_hint)
    attempts = []
    for attempt in range(config.max_retries + 1):
        run = teacher.run(view, hint)
        q = qualify(run.trajectory, sub_env, min_f1=config.min_f1)
        provenance = Provenance(teacher.name, hint.level, attempt, hint.notes,
                                hashlib.sha256(run.prompt.encode()).hexdigest())
        attempts.append(Attempt(sub_env.workspace_id, provenance, q.passed, tuple(q.reasons()), run.problems))
        if q.passed:
            return QualifiedTrajectory(sub_env, run.trajectory, provenance), attempts
        hint = reviser(hint, q, sub_env)
    return None, attempts


def run_teachers(sub_envs: Sequence[Workspace], teachers: Sequence[Teacher],
                 config: QualifyConfig = QualifyConfig(), *, progress: Callable | None = None) -> TeacherRecord:
    """Every teacher on every sub-environment through :func:`qualify_with_retries`.
    ``progress(iterable, total)`` may wrap the loop (a progress bar)."""
    pairs = [(s, t) for s in sub_envs for t in teachers]
    accepted, attempts, failed = [], [], []
    for sub_env, teacher in (progress(pairs, len(pairs)) if progress else pairs):
        result, tried = qualify_with_retries(teacher, sub_env, config)
        attempts.extend(tried)
        if result is None:
            failed.append((sub_env.workspace_id, teacher.name))
        else:
            accepted.append(result)
    return TeacherRecord(tuple(accepted), tuple(attempts), tuple(failed))


# ---- 4. the SFT corpus (appendix B.1, B.3) ----------------------------------------------------------


def judgments_json(predictions: Mapping[str, Prediction]) -> str:
    """The final assistant turn: ``{"judgments": [...]}`` sorted by path, compact."""
    rows = [{"path": p, **predictions[p].to_json()} for p in sorted(predictions)]
    return json.dumps({"judgments": rows}, separators=(",", ":"))


def truncate_observation(text: str, max_chars: int) -> str:
    """B.3: a long tool output keeps its first ``max_chars`` characters and a marker saying how
    many were cut; shorter outputs are unchanged."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... {len(text) - max_chars} characters truncated]"


def trajectory_messages(workspace: Workspace, trajectory: VerificationTrajectory, *,
                        max_observation_chars: int = 1500) -> list[dict[str, str]]:
    """The student chat of one trajectory (B.1): system = :func:`student_prompt` (no hint), user
    = :func:`manifest_text`, then per tool step an assistant turn with the call serialised as
    JSON text and an observation turn (truncated, :func:`truncate_observation`), and a final
    assistant turn with :func:`judgments_json`."""
    messages = [{"role": "system", "content": student_prompt()},
                {"role": "user", "content": manifest_text(verifier_view(workspace))}]
    for step in trajectory.steps:
        call = tool_call_of(step)
        messages.append({"role": "assistant", "content": json.dumps(call, separators=(",", ":"))})
        messages.append(observation_message(call["tool"], truncate_observation(step.observation,
                                                                               max_observation_chars)))
    messages.append({"role": "assistant", "content": judgments_json(trajectory.predictions)})
    return messages


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


def tokenize_chat(tokenizer, messages: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [T] int32, loss mask [T] float32) of a chat rendered with the tokenizer's
    template; the mask is 1 exactly on the assistant turns' content and their end token.

    The rendering is cut into segments by rendering growing prefixes (so any template works):
    before an assistant turn, the header the template writes as its generation prompt (mask 0),
    then the turn's content through the end token (mask 1), then whatever the template adds after
    the end token (a newline in ChatML; mask 0). Segments are tokenised separately and
    concatenated. Choice: the end token is in the mask (the student must learn to stop); the
    assistant header is not (at inference the template writes it)."""
    eos = tokenizer.eos_token or ""
    ids: list[int] = []
    mask: list[float] = []

    def add(text: str, value: float):
        if text:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids.extend(piece)
            mask.extend([value] * len(piece))

    previous = ""
    for k, message in enumerate(messages):
        full = _render(tokenizer, messages[:k + 1], False)
        if message["role"] == "assistant":
            head = _render(tokenizer, messages[:k], True)
            if not (head.startswith(previous) and full.startswith(head)):
                raise ValueError("the chat template does not render prefixes as prefixes; cannot locate "
                                 f"assistant turn {k}")
            body = full[len(head):]
            cut = body.rfind(eos) + len(eos) if eos and eos in body else len(body)
            add(head[len(previous):], 0.0)
            add(body[:cut], 1.0)
            add(body[cut:], 0.0)
        else:
            if not full.startswith(previous):
                raise ValueError(f"the chat template does not render prefixes as prefixes (turn {k})")
            add(full[len(previous):], 0.0)
        previous = full
    return np.asarray(ids, np.int32), np.asarray(mask, np.float32)


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One tokenised chat: ``tokens`` [T] int32, ``loss_mask`` [T] float32 (assistant tokens)."""

    example_id: str
    sub_env_id: str
    source_workspace: str
    teacher: str
    tokens: np.ndarray
    loss_mask: np.ndarray

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """Attributes:
      max_tokens: the training context; longer examples are dropped whole (B.3).
      max_observation_chars: tool outputs are truncated to this (B.3).
      per_sub_env: trajectories kept per sub-environment, rotating among teachers (B.3).
      dev_share: share of source workspaces whose examples form the dev split.
      seed: the split's seed.
    """

    max_tokens: int = 2048
    max_observation_chars: int = 1500
    per_sub_env: int = 1
    dev_share: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if self.max_tokens < 8 or self.max_observation_chars < 1 or self.per_sub_env < 1:
            raise WorkspaceError(f"max_tokens >= 8, max_observation_chars >= 1, per_sub_env >= 1 needed; got "
                                 f"{self.max_tokens}, {self.max_observation_chars}, {self.per_sub_env}",
                                 field="max_tokens")
        if not 0.0 <= self.dev_share < 1.0:
            raise WorkspaceError(f"dev_share must lie in [0, 1), got {self.dev_share}", field="dev_share")


def rotate_teachers(accepted: Sequence[QualifiedTrajectory], per_sub_env: int = 1) -> list[QualifiedTrajectory]:
    """B.3: where a sub-environment has several qualified trajectories, keep ``per_sub_env`` of
    them, starting at a teacher that rotates from one sub-environment to the next (sub-
    environments in sorted order, candidates by teacher name then attempt), so every teacher
    contributes while each environment is seen a bounded number of times."""
    groups: dict[str, list[QualifiedTrajectory]] = collections.defaultdict(list)
    for q in accepted:
        groups[q.workspace.workspace_id].append(q)
    out = []
    for i, sub_id in enumerate(sorted(groups)):
        candidates = sorted(groups[sub_id], key=lambda q: (q.provenance.teacher, q.provenance.attempt))
        start = i % len(candidates)
        out.extend(candidates[(start + j) % len(candidates)] for j in range(min(per_sub_env, len(candidates))))
    return out


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The SFT corpus: train and dev examples, and the dropped overlength ones (id, length)."""

    train: tuple[SFTExample, ...]
    dev: tuple[SFTExample, ...]
    dropped: tuple[tuple[str, int], ...]

    def summary(self) -> dict[str, Any]:
        lengths = [e.length for e in self.train + self.dev]
        return {"train": len(self.train), "dev": len(self.dev), "dropped_overlength": len(self.dropped),
                "tokens": int(sum(lengths)), "max_length": max(lengths, default=0),
                "assistant_tokens": int(sum(e.loss_mask.sum() for e in self.train + self.dev)),
                "teachers": dict(collections.Counter(e.teacher for e in self.train + self.dev))}


def split_dev(sources: Iterable[str], dev_share: float, seed: int) -> set[str]:
    """The source workspaces held out as dev: a seeded permutation's first
    ``round(dev_share * n)`` (at least one when ``dev_share > 0`` and there are two or more).
    Choice: the split is by source workspace, so the cuts of one workspace never straddle it."""
    names = sorted(set(sources))
    n_dev = int(round(dev_share * len(names)))
    if dev_share > 0 and len(names) >= 2:
        n_dev = min(max(n_dev, 1), len(names) - 1)
    order = np.random.default_rng(seed).permutation(len(names))
    return {names[int(i)] for i in order[:n_dev]}


def build_corpus(accepted: Sequence[QualifiedTrajectory], tokenizer, config: CorpusConfig = CorpusConfig()) -> Corpus:
    """B.1/B.3: rotate among teachers, render each trajectory as a student chat, tokenise with an
    assistant-only mask, drop overlength examples, split train / dev by source workspace."""
    examples, dropped = [], []
    for q in rotate_teachers(accepted, config.per_sub_env):
        messages = trajectory_messages(q.workspace, q.trajectory, max_observation_chars=config.max_observation_chars)
        tokens, mask = tokenize_chat(tokenizer, messages)
        example_id = f"{q.workspace.workspace_id}:{q.provenance.teacher}:{q.provenance.attempt}"
        if len(tokens) > config.max_tokens:
            dropped.append((example_id, int(len(tokens))))
            continue
        source = str(q.workspace.metadata.get("sub_environment_of", q.workspace.workspace_id))
        examples.append(SFTExample(example_id, q.workspace.workspace_id, source, q.provenance.teacher, tokens, mask))
    dev_sources = split_dev((e.source_workspace for e in examples), config.dev_share, config.seed)
    train = tuple(e for e in examples if e.source_workspace not in dev_sources)
    dev = tuple(e for e in examples if e.source_workspace in dev_sources)
    return Corpus(train, dev, tuple(dropped))


def corpus_texts(accepted: Sequence[QualifiedTrajectory], config: CorpusConfig = CorpusConfig()) -> list[str]:
    """Every message text of the student chats (to train a small tokenizer on)."""
    return [m["content"] for q in rotate_teachers(accepted, config.per_sub_env)
            for m in trajectory_messages(q.workspace, q.trajectory, max_observation_chars=config.max_observation_chars)]


# ---- 5. batches, B.2 metrics and the student as a verifier ------------------------------------------


def pad_examples(examples: Sequence[SFTExample], pad_id: int, multiple: int = 64, width: int | None = None):
    """A right-padded :class:`~envsched_jax.learner.trainer.PolicyBatch` for masked SFT; the
    width is ``width`` when given (one shape for a whole run: one compilation), else the longest
    example rounded up to ``multiple``."""
    from envsched_jax.learner.trainer import sft_batch

    longest = max(e.length for e in examples)
    if width is None:
        width = -(-longest // multiple) * multiple
    if width < longest:
        raise ValueError(f"width {width} is shorter than the longest example ({longest} tokens)")
    tokens = np.full((len(examples), width), pad_id, np.int32)
    attention = np.zeros((len(examples), width), np.int32)
    mask = np.zeros((len(examples), width), np.float32)
    for i, e in enumerate(examples):
        tokens[i, :e.length] = e.tokens
        attention[i, :e.length] = 1
        mask[i, :e.length] = e.loss_mask
    return sft_batch(tokens, attention, mask)


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The examples of training step ``step``: a draw without replacement from a generator
    seeded by ``(seed, step)``, so a resumed run sees the same batches."""
    rng = np.random.default_rng([seed, step])
    return rng.choice(num_examples, size=min(batch_size, num_examples), replace=False)


def make_lm_metrics_fn(trainer):
    """``fn(params, batch) -> (nll_sum, correct, count)`` over the masked tokens (jitted): the
    summed negative log-likelihood, the tokens whose argmax prediction is right, and how many."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from envsched_jax.learner import objectives

    def fn(params, batch):
        model = nnx.merge(trainer.graphdef, params)
        logits = trainer.forward(model, batch.tokens, batch.attention_mask).astype(jnp.float32)[:, :-1]
        targets = batch.tokens[:, 1:]
        mask = batch.loss_mask[:, 1:]
        logp = objectives.token_logprobs(logits, targets)
        correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        return -(logp * mask).sum(), (correct * mask).sum(), mask.sum()

    return jax.jit(fn)


def lm_metrics(trainer, examples: Sequence[SFTExample], pad_id: int, *, batch_size: int = 4,
               metrics_fn=None, width: int | None = None) -> dict[str, float]:
    """B.2's loss (mean NLL per masked token, the L_SFT value) and token accuracy (argmax) over
    ``examples`` under the trainer's current parameters."""
    fn = metrics_fn or make_lm_metrics_fn(trainer)
    nll = correct = count = 0.0
    for start in range(0, len(examples), batch_size):
        rows = list(examples[start:start + batch_size])
        # a short last batch is filled with mask-free copies (same shape: no new compilation)
        rows += [dataclasses.replace(rows[0], loss_mask=np.zeros_like(rows[0].loss_mask))] * (batch_size - len(rows))
        batch = pad_examples(rows, pad_id, width=width)
        a, b, c = (float(x) for x in fn(trainer.state.params, batch))
        nll, correct, count = nll + a, correct + b, count + c
    return {"loss": nll / count if count else float("nan"),
            "token_accuracy": correct / count if count else float("nan"), "tokens": count}


def student_verify(client, workspaces: Sequence[Workspace], loop: LoopConfig = LoopConfig()
                   ) -> tuple[list[dict[str, Prediction]], list[tuple[str, ...]]]:
    """Run a trained policy (``client``: e.g. ``BackendChatClient`` over the JAX sampler,
    greedy) as a verifier on each workspace through :func:`run_tool_loop` with the student
    prompt; returns the predictions (files without a valid judgment are missing, scored wrong by
    :func:`~.verify.score_split`) and each run's problems."""
    predictions, problems = [], []
    for ws in workspaces:
        trajectory, issues, _ = run_tool_loop(client, verifier_view(ws), student_prompt(), loop)
        predictions.append(dict(trajectory.predictions))
        problems.append(issues)
    return predictions, problems
