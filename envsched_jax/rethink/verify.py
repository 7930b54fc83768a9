"""File verification ("cleaning", seeds/002 section 4.1; appendix A.1, A.6, A.7, B.4, B.5).

A *verifier* is given a collection of files with their manifest (paths, kinds, times) and reading
tools, and predicts for every file its standard/noise partition, its category (appendix A.1,
table 3), the stage the file shows, its version family, its place in the family's timeline and
the files that support the judgment (:class:`Prediction`). Verification never sees labels and
excludes the downstream request (section 4.1): :func:`verify` hands a verifier
:func:`verifier_view` of the workspace, never the workspace itself.

This module holds

- the paper's scores, exactly as appendix B.4 defines them (:func:`score_split`): correct
  predictions are *pooled* over the eligible files of a split (counts, not a mean of per-task
  rates); partition and joint accuracy are over all files, noise-category accuracy over the files
  whose reference partition is noise, observed-stage accuracy over the files with a nonempty
  reference stage; a missing prediction is wrong and stays in every denominator it is eligible
  for; joint accuracy needs partition, category and stage all equal to the reference;
- table 6's preparation scores (:func:`preparation_scores`): files selected (predicted standard),
  standard files rejected, noise files admitted, standard recall;
- appendix A.7's qualification of a teacher trajectory (:func:`qualify`);
- name- and text-reading helpers shared with :mod:`.learned_verifier` (:func:`family_key`,
  :func:`infer_families`, :func:`infer_stage`, :func:`find_mentions`);
- three rule-based verifiers in the registry :data:`VERIFIERS`: ``filename`` (trust the
  filename), ``newest`` (trust the newest timestamp) and ``evidence`` (read notices, registers
  and pointers and apply them). The first two are the honest offline stand-ins for models that
  rely on filenames or apparent recency, which is what the paper's cleaning step sets out to
  discourage.

Choices the paper leaves open are marked "Choice:" where they are made.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from envsched_jax.pool.model import Check
from envsched_jax.rethink.workspace import (
    CATEGORIES,
    PARTITIONS,
    STRONG_DECOYS,
    FileLabel,
    Workspace,
    WorkspaceError,
    WorkspaceFile,
)

# ---- predictions --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One file judgment of a verifier (section 4.1: partition, category, observed stage, family,
    timeline, supporting evidence).

    Choice: ``partition`` and ``category`` are kept as two fields that may disagree (a model may
    say "standard" and "superseded_version"); the scores judge each against the reference on its
    own, and joint accuracy needs both right. :meth:`of` builds a consistent pair.
    """

    partition: str
    category: str
    stage: str = ""
    family: str = ""
    order: int | None = None
    evidence: tuple[str, ...] = ()

    def __post_init__(self):
        if self.partition not in PARTITIONS:
            raise WorkspaceError(f"partition must be one of {PARTITIONS}, got {self.partition!r}",
                                 field="partition")
        if self.category not in CATEGORIES:
            raise WorkspaceError(f"category must be one of {CATEGORIES}, got {self.category!r}",
                                 field="category")
        if not isinstance(self.stage, str) or not isinstance(self.family, str):
            raise WorkspaceError(f"stage and family must be strings, got {self.stage!r}, {self.family!r}",
                                 field="stage")
        if self.order is not None and (isinstance(self.order, bool) or not isinstance(self.order, int)):
            raise WorkspaceError(f"order must be an integer or None, got {self.order!r}", field="order")
        object.__setattr__(self, "evidence", tuple(self.evidence))

    @classmethod
    def of(cls, category: str, stage: str = "", family: str = "", order: int | None = None,
           evidence: Iterable[str] = ()) -> Prediction:
        """A prediction whose partition follows from its category (standard exactly for
        ``authoritative_record``, as in :class:`~envsched_jax.rethink.workspace.FileLabel`)."""
        partition = "standard" if category == "authoritative_record" else "noise"
        return cls(partition, category, stage, family, order, tuple(evidence))

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "category": self.category, "stage": self.stage,
                "family": self.family, "order": self.order, "evidence": list(self.evidence)}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Prediction:
        return cls(record["partition"], record["category"], record.get("stage", ""), record.get("family", ""),
                   record.get("order"), tuple(record.get("evidence", ())))


Predictions = dict[str, Prediction]
"""A verifier's output for one workspace: path -> judgment (files may be missing)."""


class Verifier(Protocol):
    """Anything with a ``name`` and ``predict(workspace) -> {path: Prediction}``. ``predict`` is
    called through :func:`verify`, which passes only :func:`verifier_view`."""

    name: str

    def predict(self, workspace: Workspace) -> Predictions: ...


WITHHELD_REQUEST = "(withheld: file verification excludes the downstream request, section 4.1)"


def verifier_view(workspace: Workspace) -> Workspace:
    """What a verifier may see: the files and their manifest, nothing else.

    Choice: besides the labels (:meth:`Workspace.public`), the request, rubric, reference outcome
    and metadata are withheld too. The paper excludes the request from verification (section
    4.1); the rubric and reference contain the answer, and a generator's metadata may carry the
    scenario the labels were drawn from. The workspace keeps its id and files; its request is a
    fixed placeholder and its rubric one empty check (a :class:`Workspace` needs both).
    """
    public = workspace.public()
    return dataclasses.replace(public, request=WITHHELD_REQUEST, rubric=(Check("withheld", ""),),
                               reference={}, metadata={})


def verify(verifier: Verifier, workspace: Workspace) -> Predictions:
    """Run ``verifier`` on :func:`verifier_view` of ``workspace``; a judgment about a path the
    workspace does not have is an error naming the verifier, the workspace and the path."""
    predictions = dict(verifier.predict(verifier_view(workspace)))
    known = set(workspace.paths)
    for path, prediction in predictions.items():
        if path not in known:
            raise WorkspaceError(f"verifier {getattr(verifier, 'name', verifier)!r} judged a file that does "
                                 "not exist", source=f"workspace {workspace.workspace_id!r}", path=str(path))
        if not isinstance(prediction, Prediction):
            raise WorkspaceError(f"verifier returned {type(prediction).__name__}, not a Prediction",
                                 source=f"workspace {workspace.workspace_id!r}", path=path)
    return predictions


# ---- appendix B.4 scores ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Count:
    """``correct`` of ``eligible`` files; ``rate`` is ``None`` when nothing is eligible."""

    correct: int
    eligible: int

    def __post_init__(self):
        if not 0 <= self.correct <= self.eligible:
            raise ValueError(f"need 0 <= correct <= eligible, got {self.correct}/{self.eligible}")

    @property
    def rate(self) -> float | None:
        return self.correct / self.eligible if self.eligible else None

    def __add__(self, other: Count) -> Count:
        return Count(self.correct + other.correct, self.eligible + other.eligible)


@dataclasses.dataclass(frozen=True)
class VerificationScores:
    """Appendix B.4's four accuracies as pooled counts, plus how many files had no prediction.

    Adding two scores pools their counts, so the score of a split is the sum over its workspaces
    (never a mean of per-workspace rates)."""

    partition: Count = Count(0, 0)
    category: Count = Count(0, 0)
    stage: Count = Count(0, 0)
    joint: Count = Count(0, 0)
    missing: int = 0

    def __add__(self, other: VerificationScores) -> VerificationScores:
        return VerificationScores(self.partition + other.partition, self.category + other.category,
                                  self.stage + other.stage, self.joint + other.joint,
                                  self.missing + other.missing)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"missing": self.missing}
        for name in ("partition", "category", "stage", "joint"):
            c = getattr(self, name)
            out[name] = {"correct": c.correct, "eligible": c.eligible, "rate": c.rate}
        return out


def score_labels(predictions: Mapping[str, Prediction], labels: Mapping[str, FileLabel]) -> VerificationScores:
    """Appendix B.4 over one set of labelled files (``labels``: path -> reference label).

    Per file with reference label ``y`` and prediction ``p`` (``None`` if missing):

    - partition: every file is eligible; correct iff ``p.partition == y.partition``;
    - noise category: eligible iff ``y.partition == "noise"``; correct iff ``p.category == y.category``;
    - observed stage: eligible iff ``y.stage != ""``; correct iff ``p.stage == y.stage``;
    - joint: every file is eligible; correct iff partition, category and stage all equal
      (a file with an empty reference stage needs an empty predicted stage).

    A missing prediction is wrong for every metric it is eligible for. Predictions for paths
    without a label are ignored (:func:`verify` already refuses unknown paths).
    """
    part, cat, stg, joint = [0, 0], [0, 0], [0, 0], [0, 0]
    missing = 0
    for path, y in labels.items():
        p = predictions.get(path)
        missing += p is None
        part_ok = p is not None and p.partition == y.partition
        cat_ok = p is not None and p.category == y.category
        stage_ok = p is not None and p.stage == y.stage
        part[0] += part_ok
        part[1] += 1
        if y.partition == "noise":
            cat[0] += cat_ok
            cat[1] += 1
        if y.stage:
            stg[0] += stage_ok
            stg[1] += 1
        joint[0] += part_ok and cat_ok and stage_ok
        joint[1] += 1
    return VerificationScores(Count(*part), Count(*cat), Count(*stg), Count(*joint), missing)


def _labels_of(workspace: Workspace) -> dict[str, FileLabel]:
    if not workspace.labelled:
        unlabelled = [f.path for f in workspace.files if f.label is None]
        raise WorkspaceError("scoring needs every file labelled", source=f"workspace {workspace.workspace_id!r}",
                             path=unlabelled[0], field="label")
    return workspace.labels()


def score_workspace(predictions: Mapping[str, Prediction], workspace: Workspace) -> VerificationScores:
    """:func:`score_labels` against the labels of a fully labelled workspace."""
    return score_labels(predictions, _labels_of(workspace))


def score_split(pairs: Iterable[tuple[Mapping[str, Prediction], Workspace]]) -> VerificationScores:
    """Appendix B.4's pooled scores of a split: the sum of the per-workspace counts."""
    total = VerificationScores()
    for predictions, workspace in pairs:
        total = total + score_workspace(predictions, workspace)
    return total


def evaluate(verifier: Verifier, workspaces: Sequence[Workspace]) -> VerificationScores:
    """Run ``verifier`` on every workspace (through :func:`verify`) and pool the scores."""
    return score_split((verify(verifier, w), w) for w in workspaces)


# ---- appendix B.5 / table 6 ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreparationScores:
    """Table 6: ``selected`` files (predicted standard), ``standard_rejected`` (reference standard,
    not selected), ``noise_admitted`` (reference noise, selected) and the totals; recall is over
    the standard-labelled files. A missing prediction is not a selection."""

    selected: int = 0
    standard_rejected: int = 0
    noise_admitted: int = 0
    standard_total: int = 0
    noise_total: int = 0

    @property
    def standard_retained(self) -> int:
        return self.standard_total - self.standard_rejected

    @property
    def standard_recall(self) -> float | None:
        return self.standard_retained / self.standard_total if self.standard_total else None

    def __add__(self, other: PreparationScores) -> PreparationScores:
        return PreparationScores(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "standard_retained": self.standard_retained,
                "standard_recall": self.standard_recall}


def preparation_labels(predictions: Mapping[str, Prediction], labels: Mapping[str, FileLabel]) -> PreparationScores:
    """Table 6 counts over one set of labelled files."""
    selected = {path for path, p in predictions.items() if p.partition == "standard" and path in labels}
    standard = {path for path, y in labels.items() if y.partition == "standard"}
    return PreparationScores(selected=len(selected), standard_rejected=len(standard - selected),
                             noise_admitted=len(selected - standard), standard_total=len(standard),
                             noise_total=len(labels) - len(standard))


def preparation_scores(pairs: Iterable[tuple[Mapping[str, Prediction], Workspace]]) -> PreparationScores:
    """Table 6 counts pooled over workspaces."""
    total = PreparationScores()
    for predictions, workspace in pairs:
        total = total + preparation_labels(predictions, _labels_of(workspace))
    return total


# ---- reading names and texts --------------------------------------------------------------------

_TOKEN = re.compile(r"[a-z0-9]+")
_VERSION_TOKEN = re.compile(r"^(?:v|ver|version|rev|r)?\d+$")
_STAGE_DIGIT_TOKEN = re.compile(r"^(?:final|draft|rev|v|ver|version|copy)\d+$")
_NAME_NOISE_WORDS = frozenset({
    "final", "draft", "approved", "latest", "revised", "revision", "old", "new", "copy", "of", "updated",
    "current", "signed", "clean", "wip", "tmp", "backup", "bak", "orig", "original", "edited", "v",
    "ver", "version", "rev"})
"""Name tokens that mark a version, a stage or a copy rather than the document itself."""

STAGE_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("withdrawn", frozenset({"withdrawn", "retracted", "rescinded", "cancelled", "canceled", "void"})),
    ("superseded", frozenset({"superseded", "obsolete", "replaced"})),
    ("approved", frozenset({"approved", "signed"})),
    ("final", frozenset({"final"})),
    ("revised", frozenset({"revised", "revision", "updated"})),
    ("review", frozenset({"review", "reviewed"})),
    ("draft", frozenset({"draft", "wip", "preliminary"})),
    ("archived", frozenset({"archived"})),
)
"""Stage vocabulary of :func:`infer_stage`, in priority order (the first group a text shows
wins). Choice: these eight stages; a stage label outside them is never predicted by the rules."""

_STATUS_LINE = re.compile(r"\b(?:status|stage)\s*[:=\-]\s*([a-z][a-z\- ]*)", re.IGNORECASE)


def name_tokens(path: str) -> list[str]:
    """Lower-case alphanumeric tokens of a file's name without its last extension."""
    name = path.rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return _TOKEN.findall(stem.lower())


def family_key(path: str) -> str:
    """The version family a file's name suggests: its name tokens without version numbers,
    dates, stage words (final, draft, approved, latest, ...) and copy markers, joined by ``_``
    (``""`` when nothing is left).

    Choice: the directory and the extension are ignored, so copies in other folders or formats
    fall in one family (``drafts/budget_v1.txt`` and ``shared/Budget-FINAL.md`` are both
    ``budget``); any purely numeric token is dropped (versions and dates alike).

    >>> family_key("drafts/Q3_budget_v2_2026-03-01.txt"), family_key("shared/Copy of q3-budget FINAL.md")
    ('q3_budget', 'q3_budget')
    """
    kept = [t for t in name_tokens(path)
            if t not in _NAME_NOISE_WORDS and not _VERSION_TOKEN.match(t) and not _STAGE_DIGIT_TOKEN.match(t)]
    return "_".join(kept)


def infer_families(paths: Iterable[str]) -> dict[str, str]:
    """Path -> family key for the paths whose :func:`family_key` is shared by at least two paths
    (a key held by one file is no family: such a file is absent from the result)."""
    keys = {p: family_key(p) for p in paths}
    counts: dict[str, int] = {}
    for k in keys.values():
        if k:
            counts[k] = counts.get(k, 0) + 1
    return {p: k for p, k in keys.items() if k and counts[k] >= 2}


def version_number(path: str) -> int:
    """The largest explicit version number in the name (``v3``, ``rev2``, ``version 4``, ``final2``),
    or -1 if none. Bare numbers (dates, years) are not versions."""
    tokens = name_tokens(path)
    best = -1
    for i, t in enumerate(tokens):
        m = re.match(r"^(?:v|ver|version|rev|r|final|draft)(\d+)$", t)
        if m:
            best = max(best, int(m.group(1)))
        elif t in ("v", "ver", "version", "rev") and i + 1 < len(tokens) and tokens[i + 1].isdigit():
            best = max(best, int(tokens[i + 1]))
    return best


_CLAIM_WORDS = frozenset({"final", "approved", "latest", "official", "signed", "current"})


def name_claims_final(path: str) -> bool:
    """Whether the name claims finality or authority (final, approved, latest, official, signed,
    current; also ``final2``)."""
    return any(t in _CLAIM_WORDS or re.match(r"^final\d+$", t) for t in name_tokens(path))


def _stage_of_words(words: Iterable[str]) -> str:
    found = set(words)
    for stage, vocabulary in STAGE_WORDS:
        if found & vocabulary:
            return stage
    return ""


def infer_stage(path: str, text: str | None = None) -> str:
    """The stage a file shows: an explicit ``Status:``/``Stage:`` line of its text, else a stage
    word of its name, else a stage word in the first three lines of its text; ``""`` if none.

    Choice: the file's own status line wins over its name (a file named FINAL whose text says
    "Status: draft" shows "draft"); within a source the priority of :data:`STAGE_WORDS` decides.
    """
    if text:
        m = _STATUS_LINE.search(text)
        if m:
            stage = _stage_of_words(_TOKEN.findall(m.group(1).lower()))
            if stage:
                return stage
    stage = _stage_of_words(name_tokens(path))
    if stage or not text:
        return stage
    head = "\n".join(text.splitlines()[:3]).lower()
    return _stage_of_words(_TOKEN.findall(head))


@dataclasses.dataclass(frozen=True)
class Mention:
    """``source`` names ``target`` (by path or by file name) in ``line``, the sentence of its text
    that holds the name (:func:`sentences`)."""

    source: str
    target: str
    line: str


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_RECORD_ROW = re.compile(r"[,|\t]")


def sentences(text: str) -> list[str]:
    """The text cut into sentences, for reading what a sentence says about the files it names.

    Choice: a line continues the previous one when it starts with a lower-case letter, the
    previous line is not blank and does not end in ``. ! ? :``, and neither line is a record row
    (holds ``,``, ``|`` or a tab: register rows stay one unit each); the joined blocks are then
    split after ``. ! ?`` followed by white space (a dot inside a file name is not followed by
    white space). So "The document x.csv circulated on 1 May / as the final budget is withdrawn."
    is one sentence, and each row of a CSV register is its own.
    """
    blocks: list[str] = []
    previous = ""
    for raw in text.splitlines():
        line = raw.strip()
        joins = (blocks and line[:1].islower() and previous and previous[-1] not in ".!?:"
                 and not _RECORD_ROW.search(line) and not _RECORD_ROW.search(previous))
        if joins:
            blocks[-1] = f"{blocks[-1]} {line}"
        elif line:
            blocks.append(line)
        previous = line
    return [part for block in blocks for part in _SENTENCE_END.split(block) if part]


def find_mentions(files: Sequence[WorkspaceFile]) -> list[Mention]:
    """Every (text file, other file, sentence) where the sentence names the other file.

    Choice: matching is case-insensitive on the full path or on the bare file name; a bare name
    shared by several files names all of them. A file never mentions itself.
    """
    out: list[Mention] = []
    for source in files:
        text = source.text
        if not text:
            continue
        units = sentences(text)
        lowered = [u.lower() for u in units]
        for target in files:
            if target.path == source.path:
                continue
            needles = (target.path.lower(), target.name.lower())
            for unit, low in zip(units, lowered):
                if any(n in low for n in needles):
                    out.append(Mention(source.path, target.path, unit))
    return out


WITHDRAW_PHRASES = ("withdrawn", "withdraw", "retracted", "rescinded", "cancelled", "canceled", "void",
                    "not approved", "do not use", "superseded", "replaced by", "obsolete", "invalid")
APPROVAL_PHRASES = ("approved", "approval", "signed off", "sign-off", "signoff", "authorised", "authorized",
                    "confirmed", "confirms", "endorsed", "on behalf of", "according to", "per the ",
                    "checked against")
"""Phrases of an authority claim or a "confirmation" that rests on another source."""
POINTER_PHRASES = ("use ", "see ", "refer to", "moved to", "go to", "latest version", "points to",
                   "instead", "please open", "current version is")
REGISTER_WORDS = frozenset({"register", "registry", "ledger", "signoff", "approvals"})
"""Words (matched case-insensitively as substrings of a line, or as name tokens for registers)
that the ``evidence`` verifier and the learned verifier's features read."""

_REPLACEMENT = re.compile(r"(superseded|replaced) by", re.IGNORECASE)


def has_phrase(text: str, phrases: Iterable[str]) -> bool:
    low = text.lower()
    return any(p in low for p in phrases)


def withdraws(mention: Mention) -> bool:
    """Whether the mention's line withdraws its target: the line has a withdrawal phrase and the
    target is not named after "superseded by"/"replaced by" (that one is the replacement)."""
    low = mention.line.lower()
    if not has_phrase(low, WITHDRAW_PHRASES):
        return False
    m = _REPLACEMENT.search(low)
    if m is None:
        return True
    before = low[:m.start()]
    target = mention.target.lower()
    return target in before or target.rsplit("/", 1)[-1] in before


def is_register(f: WorkspaceFile) -> bool:
    """A register or sign-off list: by a name token, or by the first line of its text."""
    tokens = set(name_tokens(f.path))
    if tokens & REGISTER_WORDS or {"sign", "off"} <= tokens:
        return True
    text = f.text or ""
    first = text.splitlines()[0].lower() if text.strip() else ""
    return any(w in first for w in ("register", "sign-off", "signoff", "approvals log"))


# ---- rule-based verifiers -----------------------------------------------------------------------


def _newest_first(files: Sequence[WorkspaceFile]) -> list[WorkspaceFile]:
    """Newest first; ties by path (descending) so the choice is deterministic."""
    return sorted(files, key=lambda f: (f.modified, f.path), reverse=True)


def _orders(members: Sequence[WorkspaceFile], key: Callable[[WorkspaceFile], Any]) -> dict[str, int]:
    return {f.path: i for i, f in enumerate(sorted(members, key=key))}


def _rank_within_families(workspace: Workspace, key: Callable[[WorkspaceFile], Any]) -> Predictions:
    """The two baselines' rule: in each inferred family the member with the largest ``key`` is the
    authoritative record and the rest superseded versions, ordered by ``key``; stages from the
    name; lone files by :func:`_singleton_by_name`."""
    out: Predictions = {}
    for family, members in _families(workspace).items():
        orders = _orders(members, key)
        winner = max(members, key=key).path
        for f in members:
            category = "authoritative_record" if f.path == winner else "superseded_version"
            out[f.path] = Prediction.of(category, infer_stage(f.path), family, orders[f.path])
    for f in workspace.files:
        if f.path not in out:
            out[f.path] = _singleton_by_name(f, infer_stage(f.path))
    return out


def _families(workspace: Workspace) -> dict[str, list[WorkspaceFile]]:
    by_path = infer_families(workspace.paths)
    out: dict[str, list[WorkspaceFile]] = {}
    for f in workspace.files:
        if f.path in by_path:
            out.setdefault(by_path[f.path], []).append(f)
    return out


def _singleton_by_name(f: WorkspaceFile, stage: str) -> Prediction:
    """Shared by ``filename`` and ``newest`` for files outside any inferred family. Choice: a
    name that claims authority (final, approved, official, register, notice, ...) is taken at its
    word as an authoritative record; any other lone file is out of scope, since neither rule has
    anything to compare it with."""
    tokens = set(name_tokens(f.path))
    claims = name_claims_final(f.path) or bool(tokens & (REGISTER_WORDS | {"notice", "signoff", "memo"}))
    return Prediction.of("authoritative_record" if claims else "out_of_scope", stage)


@dataclasses.dataclass(frozen=True)
class FilenameVerifier:
    """Trust the filename (a baseline; never reads a file's text).

    In each inferred family (:func:`infer_families`) the member whose name claims the most wins
    (key: claims final/approved/latest, then :func:`version_number`, then the path) and is an
    authoritative record; the other members are superseded versions, ordered by the same key.
    Stages come from the name alone. Lone files: :func:`_singleton_by_name`.
    """

    name: str = "filename"

    def predict(self, workspace: Workspace) -> Predictions:
        return _rank_within_families(workspace, lambda f: (name_claims_final(f.path), version_number(f.path), f.path))


@dataclasses.dataclass(frozen=True)
class NewestVerifier:
    """Trust the newest timestamp (a baseline; never reads a file's text).

    In each inferred family the newest member (ties: the larger path) is an authoritative record
    and the rest superseded versions, ordered by time. Stages come from the name alone. Lone
    files: :func:`_singleton_by_name` (as ``filename``, so the two baselines differ only inside
    families).
    """

    name: str = "newest"

    def predict(self, workspace: Workspace) -> Predictions:
        return _rank_within_families(workspace, lambda f: (f.modified, f.path))


def claim_text(text: str | None) -> str:
    """The text without its ``Status:``/``Stage:`` lines: a record stating its own status is not
    an authority claim about anything else."""
    return "\n".join(line for line in (text or "").splitlines() if not _STATUS_LINE.search(line))


def has_version_signal(members: Sequence[WorkspaceFile], mentioned: set[str]) -> bool:
    """Whether a name family looks like versions of one document: some member's name carries a
    version number, a stage word or a finality claim, or another file names a member. Choice:
    numbered siblings without any of these (``meeting_notes_01``, ``meeting_notes_02``) are
    separate files, not versions."""
    return any(version_number(f.path) >= 0 or name_claims_final(f.path) or infer_stage(f.path)
               or f.path in mentioned for f in members)


@dataclasses.dataclass(frozen=True)
class EvidenceVerifier:
    """A rule-based reader: it reads every text file and applies what registers, withdrawal
    notices, pointer notes and approval claims say about other files.

    Rules, in order (a file gets the first that applies):

    1. *Registers* (:func:`is_register`) and *notices* (a text with a sentence that withdraws
       another file, :func:`withdraws`) are authoritative records: they are the evidence a task is
       solved from. A file named in a register sentence without a withdrawal phrase is
       *endorsed*; a file named in a withdrawing sentence is *withdrawn*.
    2. *Messages about other files* (a text that names other files): with an approval or
       confirmation phrase (:data:`APPROVAL_PHRASES`, status lines aside: :func:`claim_text`) it is
       an approval claim about the files it names (rule 4); else, with a pointer phrase in a
       sentence naming a file, a pointer note: misleading redirection when a target is withdrawn,
       or is not endorsed while some file is; otherwise out of scope. Choice: messages come before
       families, since numbered messages ("confirmation_1", "confirmation_2") look like a version
       family by name but are claims about other files.
    3. *Family members* (inferred from names, with a version signal: :func:`has_version_signal`):
       the endorsed members are authoritative; if none is endorsed, the newest member not
       withdrawn is. Another member is a false final version if its name or stage claims
       finality, else a superseded version. Order is by time.
    4. *Approval claims* (also a remaining text with a claim phrase that names no file): when a
       register exists, a claim whose file and named targets are all unendorsed is fabricated
       authority, and one naming an endorsed file is an authoritative record (it supports the
       record). Choice: with no register in the collection a claim cannot be refuted and is kept
       as authoritative.
    5. Endorsed lone files are authoritative; an image or binary file (unreadable) whose name says
       notice/withdrawal/register is authoritative; everything else is out of scope.

    Stages come from :func:`infer_stage` with the text; evidence lists the files whose sentences
    decided the judgment.
    """

    name: str = "evidence"

    def predict(self, workspace: Workspace) -> Predictions:
        files = workspace.files
        mentions = find_mentions(files)
        registers = {f.path for f in files if f.kind == "text" and is_register(f)}
        endorsed: dict[str, list[str]] = {}
        withdrawn: dict[str, list[str]] = {}
        for m in mentions:
            if withdraws(m):
                withdrawn.setdefault(m.target, []).append(m.source)
            elif m.source in registers:
                endorsed.setdefault(m.target, []).append(m.source)
        notices = {src for sources in withdrawn.values() for src in sources}
        out: Predictions = {}

        def stage_of(f: WorkspaceFile) -> str:
            return infer_stage(f.path, f.text)

        for f in files:
            if f.path in registers or f.path in notices:
                cited = sorted({m.target for m in mentions if m.source == f.path})
                out[f.path] = Prediction.of("authoritative_record", stage_of(f), evidence=cited)

        for f in files:
            own = [m for m in mentions if m.source == f.path]
            if f.path in out or not own:
                continue
            pointers = [m for m in own if has_phrase(m.line, POINTER_PHRASES)]
            if has_phrase(claim_text(f.text), APPROVAL_PHRASES):
                out[f.path] = self._claim(f, {m.target for m in own}, endorsed, registers, stage_of(f))
            elif pointers:
                bad = [m.target for m in pointers
                       if m.target in withdrawn or (endorsed and m.target not in endorsed)]
                category = "misleading_redirection" if bad else "out_of_scope"
                out[f.path] = Prediction.of(category, stage_of(f), evidence=sorted({m.target for m in pointers}))

        mentioned = {m.target for m in mentions}
        for family, members in _families(workspace).items():
            members = [f for f in members if f.path not in out]
            if not members or not has_version_signal(members, mentioned):
                continue
            orders = _orders(members, lambda f: (f.modified, f.path))
            winners = {f.path for f in members if f.path in endorsed and f.path not in withdrawn}
            if not winners:
                fresh = [f for f in _newest_first(members) if f.path not in withdrawn]
                winners = {fresh[0].path} if fresh else set()
            for f in members:
                stage = stage_of(f)
                evidence = sorted(set(endorsed.get(f.path, ())) | set(withdrawn.get(f.path, ())))
                if f.path in winners:
                    category = "authoritative_record"
                elif name_claims_final(f.path) or stage in ("final", "approved"):
                    category = "false_final_version"
                else:
                    category = "superseded_version"
                out[f.path] = Prediction.of(category, stage, family, orders[f.path], evidence)

        for f in files:
            if f.path in out:
                continue
            stage = stage_of(f)
            if f.path in endorsed:
                out[f.path] = Prediction.of("authoritative_record", stage, evidence=sorted(endorsed[f.path]))
            elif f.kind == "text" and has_phrase(claim_text(f.text), APPROVAL_PHRASES):
                out[f.path] = self._claim(f, set(), endorsed, registers, stage)
            elif f.kind != "text":
                tokens = set(name_tokens(f.path))
                evidence_like = bool(tokens & (REGISTER_WORDS | {"notice", "withdrawal", "withdrawn"}))
                out[f.path] = Prediction.of("authoritative_record" if evidence_like else "out_of_scope", stage)
            else:
                out[f.path] = Prediction.of("out_of_scope", stage)
        return out

    @staticmethod
    def _claim(f: WorkspaceFile, targets: set[str], endorsed: Mapping[str, Any], registers: set[str],
               stage: str) -> Prediction:
        """Rule 4: an approval claim about ``targets`` (possibly none)."""
        if not endorsed or f.path in endorsed or targets & set(endorsed):
            category = "authoritative_record"
        else:
            category = "fabricated_authority"
        support = sorted(registers | targets) if endorsed else sorted(targets)
        return Prediction.of(category, stage, evidence=support)


VERIFIERS: dict[str, Callable[[], Verifier]] = {
    "filename": FilenameVerifier,
    "newest": NewestVerifier,
    "evidence": EvidenceVerifier,
}
"""Rule-based verifiers by name (the learned one needs training: :mod:`.learned_verifier`)."""


def make_verifier(name: str) -> Verifier:
    try:
        return VERIFIERS[name]()
    except KeyError:
        raise WorkspaceError(f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}", field="verifier") from None


# ---- appendix A.7: qualification of teacher trajectories ----------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolStep:
    """One tool call of a teacher trajectory: ``tool`` (``list``, ``read``, ``search``, ...),
    its ``arguments`` (``{"path": ...}`` for list and read) and the ``observation`` it returned."""

    tool: str
    arguments: Mapping[str, Any]
    observation: str

    def __post_init__(self):
        object.__setattr__(self, "arguments", dict(self.arguments))


@dataclasses.dataclass(frozen=True)
class VerificationTrajectory:
    """A teacher's verification run (appendix A.6): its tool calls with observations, and its
    final per-file judgments."""

    steps: tuple[ToolStep, ...]
    predictions: Mapping[str, Prediction]

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "predictions", dict(self.predictions))


@dataclasses.dataclass(frozen=True)
class QualificationFailure:
    """A named reason a trajectory fails (``check`` is one of :data:`QUALIFICATION_CHECKS`)."""

    check: str
    path: str
    detail: str


QUALIFICATION_CHECKS = ("missing_judgment", "read_fidelity", "evidence_not_read", "partition_f1",
                        "false_rejection", "strong_decoy", "version_order")


@dataclasses.dataclass(frozen=True)
class Qualification:
    passed: bool
    failures: tuple[QualificationFailure, ...]
    partition_f1: float

    def reasons(self) -> list[str]:
        return [f"{f.check}: {f.path}: {f.detail}" for f in self.failures]


FIDELITY_PREFIX_CHARS = 200
MIN_PARTITION_F1 = 0.9


def _accessed(trajectory: VerificationTrajectory, workspace: Workspace) -> set[str]:
    """Files the trajectory faithfully accessed.

    Choice (read fidelity): a text file counts as read when a ``read`` step with its path
    returned an observation containing the file's first :data:`FIDELITY_PREFIX_CHARS` characters
    (so a made-up observation does not count; an empty file counts when read at all). Images and
    binary files cannot be read by the text tools: for them a ``list`` step whose observation
    names the file (path, or name when the listed folder is the file's folder) counts, as does
    a ``read`` step of the path.
    """
    by_path = {f.path: f for f in workspace.files}
    seen: set[str] = set()
    for step in trajectory.steps:
        path = str(step.arguments.get("path", ""))
        if step.tool == "read" and path in by_path:
            f = by_path[path]
            text = f.text
            if text is None or text[:FIDELITY_PREFIX_CHARS] in step.observation:
                seen.add(path)
        elif step.tool == "list":
            folder = path.strip("/")
            for f in workspace.files:
                if f.kind == "text":
                    continue
                if f.path in step.observation or (f.directory == folder and f.name in step.observation):
                    seen.add(f.path)
    return seen


def _f1_standard(predictions: Mapping[str, Prediction], labels: Mapping[str, FileLabel]) -> float:
    """F1 of the standard class; a missing prediction is not standard; 1.0 when the reference
    and the predictions have no standard file at all."""
    tp = fp = fn = 0
    for path, y in labels.items():
        p = predictions.get(path)
        predicted = p is not None and p.partition == "standard"
        actual = y.partition == "standard"
        tp += predicted and actual
        fp += predicted and not actual
        fn += actual and not predicted
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def qualify(trajectory: VerificationTrajectory, workspace: Workspace, *,
            min_f1: float = MIN_PARTITION_F1) -> Qualification:
    """Appendix A.7's deterministic qualification of one teacher trajectory on a labelled
    workspace. It passes only with no failure of:

    - ``missing_judgment``: every file has a judgment;
    - ``read_fidelity``: every judged file was accessed (:func:`_accessed`);
    - ``evidence_not_read``: every evidence path of every judgment was accessed;
    - ``partition_f1``: F1 of the standard class >= ``min_f1`` (0.9);
    - ``false_rejection``: no authoritative record is judged noise;
    - ``strong_decoy``: every file of a :data:`STRONG_DECOYS` category gets exactly that category;
    - ``version_order``: in every reference family with two or more ordered members, the
      predicted orders exist and rank every pair of members as the reference does.

    Choice: all checks are run and reported (the paper gates the others on read fidelity; here
    ``passed`` is the same, and the extra reasons help the hint reviser of appendix A.6).
    """
    labels = _labels_of(workspace)
    preds = trajectory.predictions
    failures: list[QualificationFailure] = []
    for path in preds:
        if path not in labels:
            failures.append(QualificationFailure("missing_judgment", path, "judged a file the workspace lacks"))
    accessed = _accessed(trajectory, workspace)
    for path, y in labels.items():
        p = preds.get(path)
        if p is None:
            failures.append(QualificationFailure("missing_judgment", path, "no judgment"))
            continue
        if path not in accessed:
            failures.append(QualificationFailure("read_fidelity", path, "judged without a faithful read/listing"))
        for e in p.evidence:
            if e not in accessed:
                failures.append(QualificationFailure("evidence_not_read", path, f"cites {e!r}, never read"))
        if y.partition == "standard" and p.partition != "standard":
            failures.append(QualificationFailure("false_rejection", path, "authoritative record judged noise"))
        if y.category in STRONG_DECOYS and p.category != y.category:
            failures.append(QualificationFailure("strong_decoy", path,
                                                 f"is {y.category}, judged {p.category}"))
    f1 = _f1_standard(preds, labels)
    if f1 < min_f1:
        failures.append(QualificationFailure("partition_f1", "", f"standard-class F1 {f1:.3f} < {min_f1}"))
    families: dict[str, list[str]] = {}
    for path, y in labels.items():
        if y.family and y.order is not None:
            families.setdefault(y.family, []).append(path)
    for family, members in sorted(families.items()):
        if len(members) < 2:
            continue
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                pa, pb = preds.get(a), preds.get(b)
                ra, rb = labels[a].order, labels[b].order
                if pa is None or pb is None or pa.order is None or pb.order is None:
                    failures.append(QualificationFailure("version_order", a if pa is None or pa.order is None else b,
                                                         f"family {family!r}: no predicted order"))
                    continue
                if _sign(pa.order - pb.order) != _sign(ra - rb):
                    detail = (f"family {family!r}: order vs {b!r} disagrees "
                              f"(predicted {pa.order} vs {pb.order}, reference {ra} vs {rb})")
                    failures.append(QualificationFailure("version_order", a, detail))
    return Qualification(not failures, tuple(_dedupe(failures)), f1)


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _dedupe(failures: Iterable[QualificationFailure]) -> list[QualificationFailure]:
    seen, out = set(), []
    for f in failures:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


def rate_percent(count: Count) -> float:
    """A rate in percent rounded to one decimal, as the paper's tables print it (NaN if nothing
    is eligible)."""
    return math.nan if count.rate is None else round(100 * count.rate, 1)
