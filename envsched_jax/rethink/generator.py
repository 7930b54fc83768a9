"""A seeded, offline generator of labelled file workspaces (seeds/002, appendix A.5; issue 15 item 2).

Every Env-Rethink module needs workspaces whose answer depends on resolving file relationships
and whose files carry ground-truth labels (appendix A.1). This module makes them in two steps:

1. **Scenario.** :data:`SCENARIOS` draws a JSON-serialisable :class:`Scenario` from a
   ``numpy.random.Generator``: a subject, a version family (earlier members, the authoritative
   member, a purported final version), the evidence that decides which member is authoritative
   (an approvals register, a sign-off record, a withdrawal notice), the decoys (fabricated
   approvals, repeated-source "confirmations", redirects), fillers, the timing of the family
   and the wording templates (:class:`Style`). Every path, time, value and template is fixed here.
2. **Rendering.** :func:`render` turns a scenario into a :class:`~.workspace.Workspace`: file
   bytes, labels, the request, the rubric (executable :class:`~envsched_jax.pool.model.Check`
   code) and the reference outcome ``{"value": ..., "source": ...}``. It is a pure function of the
   scenario, so evolution can change a scenario and re-render it, and a scenario that went through
   JSON renders byte-identically.

Appendix A.5 retains "attack scenes" (authoritative targets with decoys and fabricated supporting
chains), version families with their order, redirect groups and fillers; this generator makes all
four in every kind. Choices the paper leaves open, made here:

- **Sizes.** Appendix A.5's classes overlap (small 4-12, medium 8-30, large at most 80). Choice: a
  workspace's file count is drawn from the disjoint sub-ranges 4-12, 13-30 and 31-80
  (:data:`FILE_COUNTS`, each inside its class's range), so the class can be read from the count;
  the class is drawn per workspace from :data:`~.workspace.SIZE_MIX`. The class decides how many
  earlier versions, decoys and evidence files appear; fillers make up the rest.
- **The purported final** carries a claim of finality (in its name, its content, or both) and is
  contradicted in one of three ways (:data:`CONTRADICTIONS`): ``withdrawn`` by a notice,
  ``unregistered`` (absent from the register, content claims final) or ``self_declared`` (its own
  content says it is a draft, not approved). Its observed stage is ``withdrawn``, ``proposed`` or
  ``draft`` respectively.
- **Image-only withdrawals.** A share of the notices is a PNG (text drawn with Pillow); the text
  tools cannot read it. The approvals register (text) still names the authoritative record and
  never the purported final, so the task stays solvable from text. The notice is labelled
  ``authoritative_record`` (it is valid evidence, only unreadable to text tools).
- **Evidence files** (register, sign-off, notices) are ``authoritative_record`` with stage ``""``
  and no family: they are standard files needed to solve the task, not versions of the record.
- **Repeated-source confirmations** (several notes quoting one outdated source for the previous
  figure) are ``fabricated_authority`` with stage ``""``; their value is the last earlier
  (superseded) member's value, the plausible stale figure.
- **Fabricated approvals** back the purported final's value with an approval reference that is not
  in the register (a decoy chain: redirect -> purported final <- fabricated approval).
- **Fillers** are ``out_of_scope``; one filler template is a record of the same kind for another
  subject (listed in the register too), so scope matters, not only the kind of document.
- **Parents.** A parent task is a (kind, subject) pair; its variants are different draws of the
  same subject (different values, paths, decoys and size class). Kinds are assigned to parents in
  turn so every kind appears; the held-out parents are a seeded permutation's head.
- **Rubric.** Checks compare numbers with a relative tolerance of 1e-6 (numbers may come as
  strings with thousands separators or a percent sign), strings case- and space-insensitively,
  paths after stripping a leading ``./``; a missing or ill-typed answer makes every check False.

Version 2 (:data:`GENERATOR_VERSION`) removes surface cues that coincided with the labels in
version 1 (there the purported final was always the newest file and always had a finality word
in its name, the authoritative record never had one, and every file type had one template, so a
verifier could score well by memorising templates, and trusting the filename and trusting the
newest timestamp chose the same file every time). Choices:

- **Time is decorrelated from authority** (:data:`TIMINGS`, drawn per workspace with
  :data:`TIMING_WEIGHTS`): ``ordered`` (65 %): earlier members, then the authoritative member,
  then the purported final, modification times in that order (the v1 layout); ``premature``
  (17.5 %): the purported final is an earlier version circulated as final *before* the approval,
  so the authoritative member is both later in the true order and the newest file; ``resaved``
  (17.5 %): as ``ordered``, but one earlier member was re-saved (touched) after the purported final
  circulated, so the newest family member is a superseded version. Labels' ``order`` is always the
  true version order (the order in which the versions were written, :attr:`Member.written`);
  modification time follows that order except for the re-saved member of a ``resaved`` workspace,
  whose ``modified`` is later than every other member's while its ``order`` and the date its text
  states stay its original ones. So the purported final is the newest member exactly in the
  ``ordered`` workspaces (65 % of draws).
- **Names are decorrelated from authority.** The authoritative record's name is drawn from
  :data:`AUTH_NAMES` (a plain version, ``..._approved``, ``..._final_approved``, ``..._final``,
  ``..._signed`` or the bare base name: a finality word in about a quarter of workspaces);
  the purported final's from :data:`FINAL_NAMES` (``..._FINAL``, ``..._final_v3``,
  ``..._v3_approved``, ...) or, with share :data:`NEUTRAL_FINAL_SHARE` and only when its own
  content claims finality (contradiction ``withdrawn`` or ``unregistered``), from the neutral
  :data:`NEUTRAL_FINAL_NAMES` (``..._latest``, ``..._for_circulation``, a plain version, the bare
  base name...). Version numbers are ``order + 1``
  wherever a name shows one, so an approved v2 sits beside a withdrawn v3 in ``ordered``
  workspaces and beside an earlier-numbered false final in ``premature`` ones. With share
  :data:`FORMER_FINAL_SHARE` one earlier member is a *former final* (:data:`FORMER_FINAL_NAMES`):
  it was issued as final (named final, approved or signed), then revised; its label is
  ``superseded_version`` with observed stage ``final``, its status line says final with its issue
  date, and the register lists it with status ``superseded`` (text evidence that it is out of
  force). Earlier members use one naming scheme per workspace (:data:`OLD_NAMES`: ``_v<n>``,
  ``_rev<n>`` or a date stamp), the first one the bare base name with share
  :data:`FIRST_BARE_SHARE`; the base name (subject stem and record noun) takes one of
  :data:`BASE_FORMS`. So every naming pattern of the authoritative record also occurs on noise
  members.
- **Wording varies per workspace** (:class:`Style`, one template index per file role drawn per
  workspace): status lines of the authoritative record, of the purported final (claiming or
  self-declared) and of earlier members, withdrawal notices, fabricated approval emails,
  confirmation notes, redirects, sign-off records, the register's heading, and fillers each have
  3-5 templates stating the same facts. The layout of a record file (its heading lines) is drawn
  per file from a hash of its path, so layouts do not follow roles. File names of evidence, decoys
  and fillers and the directories of every role are drawn from a few alternatives per workspace
  (:class:`KindSpec` and :data:`ROLE_DIRS`); every directory a family member can be placed in
  is among the alternatives of at least two of the three family roles (checked at import).
- **Fixed line formats** (read by :mod:`.agents` and the verifiers): record value lines
  ``Total,<n>``, ``Rate: <x> %`` with ``Effective from: <YYYY-MM-DD>``, ``Entries: <n>``,
  ``Department: <name>``; a record's first non-empty line contains its subject; the register is a
  CSV with rows ``ref,date,subject,document,status,approved_by`` under comment lines, the first of
  which contains "approvals register"; a sign-off record starts with ``# Sign-off record`` and has a
  ``Document: <path>`` line; a text withdrawal notice has a ``Re: <path>`` line and the words
  "withdrawal notice".
- **Solvability.** Only the authoritative record has a register row with status ``approved`` for
  the subject; the purported final never appears in the register. Every task is therefore solved
  by reading the register and the record it names, whatever the names, times and templates say.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envsched_jax.pool.model import Check
from envsched_jax.rethink.workspace import SIZE_CLASSES, SIZE_MIX, FileLabel, Workspace, WorkspaceError, WorkspaceFile

GENERATOR_VERSION = 2
FILE_COUNTS = {"small": (4, 12), "medium": (13, 30), "large": (31, 80)}
"""File-count range drawn for each size class (disjoint, each inside ``SIZE_CLASSES``)."""
CONTRADICTIONS = ("withdrawn", "unregistered", "self_declared")
CONTRADICTION_WEIGHTS = (0.6, 0.2, 0.2)
FALSE_FINAL_STAGE = {"withdrawn": "withdrawn", "unregistered": "proposed", "self_declared": "draft"}
TIMINGS = ("ordered", "premature", "resaved")
TIMING_WEIGHTS = (0.65, 0.175, 0.175)
"""Share of workspaces per timing: the purported final is the newest member only when ``ordered``."""
ROLES = ("superseded", "authoritative", "false_final")
EVIDENCE_KINDS = ("register", "signoff", "withdrawal")
DECOY_KINDS = ("fabricated", "confirmation", "redirect")
FILLER_TOPICS = ("meeting_notes", "inventory", "newsletter", "contacts", "other_subject")

BASE_FORMS = ("{stem}_{record}", "{record}_{stem}", "{Stem}-{Record}")
"""How a family's base name is built from the subject stem and the record noun."""
OLD_NAMES = ("{base}_v{n}", "{base}_rev{n}", "{base}_{stamp}")
"""Names of earlier members (one scheme per workspace; ``n`` = order + 1, ``stamp`` = written date)."""
AUTH_NAMES = ("{base}_v{n}", "{base}_v{n}_approved", "{base}_final_approved", "{base}_final", "{base}",
              "{base}_signed")
AUTH_NAME_WEIGHTS = (0.3, 0.15, 0.15, 0.1, 0.15, 0.15)
FINAL_NAMES = ("{base}_FINAL", "{base}_final_v{n}", "FINAL_{base}", "{base}_FINAL_v{n}", "{base}_final_final",
               "{base}_v{n}_approved")
NEUTRAL_FINAL_NAMES = ("{base}_latest", "{base}_for_circulation", "{base}_{year}_latest", "{base}_current",
                       "{base}_v{n}", "{base}")
NEUTRAL_FINAL_SHARE = 0.3
"""Share of claim-in-content purported finals (``withdrawn`` / ``unregistered``) with a neutral name."""
FORMER_FINAL_NAMES = ("{base}_final", "{base}_final_v{n}", "{base}_FINAL_{stamp}", "{base}_v{n}_approved",
                      "{base}_signed", "{base}_final_approved")
FORMER_FINAL_SHARE = 0.2
"""Share of workspaces where one earlier member is a former final (issued as final, then revised)."""
FORMER_FINAL_STAGE = "final"
FIRST_BARE_SHARE = 0.25
"""Share of workspaces whose first member (order 0, not a former final) has the bare base name."""

for _size in FILE_COUNTS:
    _lo, _hi = FILE_COUNTS[_size]
    assert SIZE_CLASSES[_size][0] <= _lo and _hi <= SIZE_CLASSES[_size][1], _size

# ---- invented vocabulary (no real people) --------------------------------------------------------

_FIRST = ("Maren", "Tobiah", "Ilsa", "Corvin", "Ysolde", "Bram", "Lioba", "Elric", "Sunniva", "Odran",
          "Petra", "Kasimir", "Runa", "Evander", "Thessa", "Jorun", "Aldith", "Fenna", "Osric", "Velma")
_LAST_A = ("Vel", "Thorn", "Brenn", "Quill", "Mord", "Hal", "Iver", "Skel", "Oden", "Tarr", "Wend", "Gral")
_LAST_B = ("wick", "stad", "holt", "mere", "vane", "croft", "ley", "dottir", "by", "sund")
_PLACE_A = ("Heron", "Cinder", "Moss", "Lark", "Quarry", "Tidal", "Amber", "Flint", "Willow", "Basalt",
            "Kestrel", "Juniper", "Sorrel", "Bramble")
_PLACE_B = ("vale", "gate", "field", "point", "wood", "reach", "moor", "crest", "haven", "ridge")
_DEPARTMENTS = ("Logistics", "Procurement", "Field Operations", "Data Platform", "Customer Care",
                "Internal Audit", "Facilities", "Research Liaison", "Quality Assurance", "Treasury",
                "Learning and Development", "Legal Affairs", "Product Design", "Security Office")
_TITLES = ("Analyst", "Senior Analyst", "Coordinator", "Specialist", "Team Lead", "Officer")
_POLICIES = ("travel per-diem", "late-payment interest", "remote-work allowance", "equipment depreciation",
             "overtime premium", "mileage reimbursement")
_TOPIC_WORDS = ("sparse", "adaptive", "federated", "causal", "streaming", "robust", "latent", "graph",
                "spectral", "ordinal", "recurrent", "modular")
_TOPIC_NOUNS = ("retrieval", "scheduling", "calibration", "segmentation", "compression", "forecasting",
                "alignment", "annotation", "sampling", "indexing")
_VENUES = ("Proc. Workshop on Applied Systems", "Journal of Synthetic Studies", "Trans. on Invented Methods",
           "Letters in Placeholder Science")
_STOCK = ("toner cartridges", "HDMI cables", "desk lamps", "label printers", "whiteboard markers",
          "USB hubs", "chairs", "headsets")


def _person(rng: np.random.Generator) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST_A)}{rng.choice(_LAST_B)}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def _email(name: str, org: str) -> str:
    return f"{name.lower().replace(' ', '.')}@{_slug(org).replace('_', '')}.example"


def _stable_rng(*parts: str) -> np.random.Generator:
    """A generator seeded from text (rendering is a pure function of the scenario's fields)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _time(day: int, rng: np.random.Generator) -> str:
    """ISO time of the proleptic ordinal ``day`` at a drawn office hour."""
    date = datetime.date.fromordinal(int(day))
    hour, minute, second = (int(rng.integers(lo, hi)) for lo, hi in ((8, 19), (0, 60), (0, 60)))
    return f"{date.isoformat()}T{hour:02d}:{minute:02d}:{second:02d}Z"


def _date(stamp: str) -> str:
    return stamp[:10]


# ---- kinds --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KindSpec:
    """What differs between scenario kinds: nouns, directories, value draws and stages.

    Attributes:
        noun: what the value is, as decoys name it ("total budget").
        record_name: record noun used in file names ("budget").
        extension: family members' file extension.
        record_dirs / authoritative_dirs / final_dirs / evidence_dirs: alternatives for where
            earlier members, the authoritative member, the purported final and the register live
            (one authoritative / final / evidence directory is drawn per workspace, each earlier
            member draws its own; the sets overlap, so a directory does not give a role away).
        early_stages: observed stages of earlier members (first, then later ones).
        authoritative_stage: observed stage of the authoritative member.
        authority: who the fabricated approval names.
        draw_values: ``(rng, n) -> n distinct values``.
    """

    noun: str
    record_name: str
    extension: str
    record_dirs: tuple[str, ...]
    authoritative_dirs: tuple[str, ...]
    final_dirs: tuple[str, ...]
    evidence_dirs: tuple[str, ...]
    early_stages: tuple[str, ...]
    authoritative_stage: str
    authority: str
    draw_values: Callable[[np.random.Generator, int], list]


def _distinct_ints(rng: np.random.Generator, n: int, lo: int, hi: int, step: int) -> list[int]:
    return [int(v) * step for v in rng.choice(np.arange(lo // step, hi // step), size=n, replace=False)]


KIND_SPECS: dict[str, KindSpec] = {
    "budget": KindSpec("total budget", "budget", "csv", ("drafts", "archive", "finance/working", "finance", "shared"),
                       ("finance", "finance/approved", "shared", "finance/working"),
                       ("shared", "drafts", "finance", "finance/approved", "archive"),
                       ("finance/approvals", "governance", "records"), ("draft", "revised"), "approved", "the CFO",
                       lambda rng, n: _distinct_ints(rng, n, 80_000, 2_000_000, 500)),
    "policy_rate": KindSpec("rate", "rate_schedule", "md", ("policies/drafts", "archive", "hr/working", "policies", "shared"),
                            ("policies", "policies/current", "shared", "hr/working"),
                            ("shared", "policies", "policies/current", "policies/drafts", "archive"),
                            ("policies/register", "governance", "records"), ("draft", "consultation"), "approved",
                            "the policy board",
                            lambda rng, n: [v / 100 for v in _distinct_ints(rng, n, 100, 1200, 25)]),
    "reference_list": KindSpec("number of references", "references", "md",
                               ("manuscript/drafts", "archive", "manuscript", "shared", "submission"),
                               ("manuscript", "manuscript/accepted", "submission", "manuscript/drafts"),
                               ("manuscript", "shared", "manuscript/accepted", "submission", "archive"),
                               ("manuscript/editorial", "editorial", "records"), ("draft", "revised"), "approved",
                               "the handling editor", lambda rng, n: _distinct_ints(rng, n, 18, 64, 1)),
    "employee_profile": KindSpec("department", "profile", "txt", ("hr/history", "archive", "hr", "shared"),
                                 ("hr", "hr/current", "shared", "hr/history"),
                                 ("hr", "shared", "hr/current", "archive", "hr/history"),
                                 ("hr/records", "people/admin", "records"),
                                 ("previous", "historical"), "current", "the HR director",
                                 lambda rng, n: [str(v) for v in rng.choice(_DEPARTMENTS, size=n, replace=False)]),
}

for _kind, _spec in KIND_SPECS.items():  # every family directory is shared by at least two roles
    for _dir in set(_spec.record_dirs + _spec.authoritative_dirs + _spec.final_dirs):
        assert sum(_dir in d for d in (_spec.record_dirs, _spec.authoritative_dirs, _spec.final_dirs)) >= 2, _dir

ROLE_DIRS: dict[str, tuple[str, ...]] = {
    "signoff": ("records", "governance", "approvals"),
    "notice": ("mail", "records", "notices", "announcements"),
    "mail": ("mail", "inbox", "correspondence"),
    "notes": ("notes", "minutes", "shared", "team"),
    "meeting_notes": ("notes", "minutes", "team"),
    "inventory": ("facilities", "office", "admin"),
    "newsletter": ("shared", "news", "comms"),
    "contacts": ("admin", "office", "people"),
}
"""Directory alternatives of evidence, decoy and filler roles (the ``notes`` role spreads the
confirmations over up to four of them)."""


def format_value(kind: str, value: Any) -> str:
    """How a value is written in the files (the text a reader finds)."""
    if kind == "policy_rate":
        return f"{float(value):.2f}"
    return str(value)


# ---- wording templates --------------------------------------------------------------------------
# Each tuple holds alternatives stating the same facts; a workspace draws one index per role
# (:class:`Style`). Fields: stage, ref (register entry), date, authority, n (version number).

AUTH_STATUS = ("Status: {stage} (register entry {ref})", "Status: {stage}",
               "Stage: {stage} - entered in the register as {ref}", "Status: {stage}, signed off {date}",
               "Document status: {stage}")
CLAIM_STATUS = ("Status: FINAL", "Status: final - for circulation", "Stage: final version",
                "Status: final (approved)", "Document status: final, replaces all earlier copies")
"""Status lines of a purported final whose content claims finality (withdrawn / unregistered)."""
DRAFT_STATUS = ("DRAFT - NOT APPROVED\nStatus: draft", "Status: draft - not approved, do not circulate",
                "Working copy, not approved\nStage: draft", "Status: draft (not approved by {authority})")
"""Status lines of a self-declared purported final: each says draft and "not approved"."""
OLD_STATUS = ("Status: {stage}", "Stage: {stage}", "Status: {stage} - for comment", "Document status: {stage}")
FORMER_FINAL_STATUS = ("Status: final (issued {date})", "Status: final as of {date}",
                       "Stage: final - issued {date} for round {n}")
NOTICE_NAMES = ("withdrawal_notice_{stem}", "{stem}_withdrawn", "notice_{stem}", "memo_{date}")
EMAIL_NAMES = ("re_{stem}_{record}_approved_{i}", "fwd_{stem}_{i}", "{stem}_sign_off_news_{i}", "mail_{date}_{i}")
CONFIRMATION_NAMES = ("{stem}_figures_note_{i}", "figures_check_{i}", "note_{i}_{stem}", "{stem}_numbers_{i}")
SIGNOFF_NAMES = ("{stem}_signoff", "signoff_{stem}", "{stem}_sign_off_sheet", "approval_record_{stem}")
REGISTER_NAMES = ("approvals_register", "register_of_approvals", "approvals_log", "document_register")
REDIRECT_NAMES = ("README.md", "shared/README.txt", "notes/where_to_find_things.md", "INDEX.md", "START_HERE.txt",
                  "notes/pointers.md")
REGISTER_HEADINGS = ("# Approvals register - {org} (kept by {author})",
                     "# {org} approvals register\n# maintained by {author}; one row per decision",
                     "# Approvals register\n# owner: {author}, {org}")
FILLER_NAMES = {
    "meeting_notes": ("meeting_notes_{i:02d}.md", "minutes_{date}.md", "team_sync_{i:02d}.md"),
    "inventory": ("inventory_{i:02d}.csv", "stock_count_{date}.csv", "supplies_{i:02d}.csv"),
    "newsletter": ("newsletter_{i:02d}.txt", "bulletin_{date}.txt", "news_{i:02d}.txt"),
    "contacts": ("contacts_{i:02d}.csv", "phone_list_{i:02d}.csv", "directory_{date}.csv"),
}
NUM_NOTICE_TEMPLATES = NUM_EMAIL_TEMPLATES = NUM_CONFIRMATION_TEMPLATES = NUM_REDIRECT_TEMPLATES = 4
NUM_SIGNOFF_TEMPLATES = NUM_FILLER_TEMPLATES = 3


@dataclasses.dataclass(frozen=True)
class Style:
    """The wording drawn for one workspace: an index into each role's templates and names."""

    base: int = 0
    old_names: int = 0
    auth_status: int = 0
    claim_status: int = 0
    draft_status: int = 0
    old_status: int = 0
    former_status: int = 0
    notice: int = 0
    notice_name: int = 0
    email: int = 0
    email_name: int = 0
    confirmation: int = 0
    confirmation_name: int = 0
    redirect: int = 0
    signoff: int = 0
    signoff_name: int = 0
    register: int = 0
    register_name: int = 0
    filler: int = 0


STYLE_CHOICES: dict[str, int] = {
    "base": len(BASE_FORMS), "old_names": len(OLD_NAMES), "auth_status": len(AUTH_STATUS),
    "claim_status": len(CLAIM_STATUS), "draft_status": len(DRAFT_STATUS), "old_status": len(OLD_STATUS),
    "former_status": len(FORMER_FINAL_STATUS), "notice": NUM_NOTICE_TEMPLATES, "notice_name": len(NOTICE_NAMES),
    "email": NUM_EMAIL_TEMPLATES, "email_name": len(EMAIL_NAMES), "confirmation": NUM_CONFIRMATION_TEMPLATES,
    "confirmation_name": len(CONFIRMATION_NAMES), "redirect": NUM_REDIRECT_TEMPLATES,
    "signoff": NUM_SIGNOFF_TEMPLATES, "signoff_name": len(SIGNOFF_NAMES), "register": len(REGISTER_HEADINGS),
    "register_name": len(REGISTER_NAMES), "filler": NUM_FILLER_TEMPLATES}
"""Number of alternatives of every :class:`Style` field (each drawn uniformly per workspace)."""
assert set(STYLE_CHOICES) == {f.name for f in dataclasses.fields(Style)}


def draw_style(rng: np.random.Generator) -> Style:
    return Style(**{name: int(rng.integers(0, n)) for name, n in STYLE_CHOICES.items()})


# ---- scenario records ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Member:
    """One version-family record. ``role`` is superseded / authoritative / false_final; ``order``
    its position in the family's true version order; ``modified`` the file's modification time;
    ``written`` when its content was written (the date its text states; ``""``: same as
    ``modified``; differs only for a re-saved member); ``effective`` an effective date
    (policy_rate). A superseded member with stage ``final`` is a former final."""

    path: str
    value: Any
    stage: str
    order: int
    modified: str
    role: str
    effective: str = ""
    written: str = ""

    @property
    def written_at(self) -> str:
        return self.written or self.modified

    @property
    def former_final(self) -> bool:
        return self.role == "superseded" and self.stage == FORMER_FINAL_STAGE


@dataclasses.dataclass(frozen=True)
class Evidence:
    """A file that decides authority: ``register`` (approvals register), ``signoff``, or
    ``withdrawal`` (a notice withdrawing the purported final; ``image`` if stored as a PNG)."""

    kind: str
    path: str
    modified: str
    author: str
    image: bool = False


@dataclasses.dataclass(frozen=True)
class Decoy:
    """A noise file: ``fabricated`` approval, repeated-source ``confirmation`` or ``redirect``.
    ``target`` is the path a redirect or fabricated approval points at; ``value`` the value it
    claims (for a redirect, the value its target states)."""

    kind: str
    path: str
    modified: str
    author: str
    value: Any
    target: str = ""


@dataclasses.dataclass(frozen=True)
class Filler:
    """An out-of-scope file; its content is drawn from ``seed`` at rendering time.
    ``other_subject`` fillers are a record of the same kind for ``subject`` with ``value``."""

    topic: str
    path: str
    modified: str
    seed: int
    subject: str = ""
    value: Any = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Everything a workspace is made from (JSON round trip via :meth:`to_json` / :meth:`from_json`)."""

    kind: str
    subject: str
    org: str
    owner: str
    approver: str
    register_ref: str
    fake_ref: str
    quoted_source: str
    contradiction: str
    size_class: str
    family: tuple[Member, ...]
    evidence: tuple[Evidence, ...]
    decoys: tuple[Decoy, ...]
    fillers: tuple[Filler, ...]
    seed: tuple[int, ...] = ()
    timing: str = "ordered"
    style: Style = Style()

    def __post_init__(self):
        if self.kind not in KIND_SPECS:
            raise WorkspaceError(f"scenario kind must be one of {tuple(KIND_SPECS)}, got {self.kind!r}", field="kind")
        if self.size_class not in FILE_COUNTS:
            raise WorkspaceError(f"size_class must be one of {tuple(FILE_COUNTS)}, got {self.size_class!r}",
                                 field="size_class")
        if self.contradiction not in CONTRADICTIONS:
            raise WorkspaceError(f"contradiction must be one of {CONTRADICTIONS}, got {self.contradiction!r}",
                                 field="contradiction")
        if self.timing not in TIMINGS:
            raise WorkspaceError(f"timing must be one of {TIMINGS}, got {self.timing!r}", field="timing")
        roles = [m.role for m in self.family]
        if roles.count("authoritative") != 1 or roles.count("false_final") != 1 or not set(roles) <= set(ROLES):
            raise WorkspaceError(f"the family needs one authoritative and one false_final member, got roles {roles}",
                                 field="family")
        if sorted(m.order for m in self.family) != list(range(len(self.family))):
            raise WorkspaceError("family orders must be 0..k without gaps", field="family")
        if not any(e.kind == "register" for e in self.evidence):
            raise WorkspaceError("a scenario needs an approvals register", field="evidence")
        paths = self.paths()
        folded = [p.casefold() for p in paths]
        if len(set(folded)) != len(folded):
            raise WorkspaceError(f"duplicate paths (case-insensitively) in the scenario: "
                                 f"{sorted({p for p in paths if folded.count(p.casefold()) > 1})}", field="paths")

    def paths(self) -> list[str]:
        return [x.path for group in (self.family, self.evidence, self.decoys, self.fillers) for x in group]

    @property
    def authoritative(self) -> Member:
        return next(m for m in self.family if m.role == "authoritative")

    @property
    def false_final(self) -> Member:
        return next(m for m in self.family if m.role == "false_final")

    @property
    def last_superseded(self) -> Member | None:
        """The latest superseded member by true order (the stale figure's source)."""
        old = [m for m in self.family if m.role == "superseded"]
        return max(old, key=lambda m: m.order) if old else None

    def evidence_of(self, kind: str) -> Evidence | None:
        return next((e for e in self.evidence if e.kind == kind), None)

    @property
    def family_id(self) -> str:
        return f"{_slug(self.subject)}-{KIND_SPECS[self.kind].record_name}"

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Scenario:
        try:
            fields = dict(record)
            nested = {"family": Member, "evidence": Evidence, "decoys": Decoy, "fillers": Filler}
            for name, record_cls in nested.items():
                fields[name] = tuple(record_cls(**item) for item in fields[name])
            fields["seed"] = tuple(int(s) for s in fields.get("seed", ()))
            fields["style"] = Style(**fields.get("style", {}))
            return cls(**fields)
        except (KeyError, TypeError) as err:
            raise WorkspaceError(f"not a scenario record: {err}", field="scenario") from None


# ---- drawing a scenario -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parent:
    """A parent task: a kind and its subject (shared by all variants of the task)."""

    task_id: str
    kind: str
    subject: str
    org: str


def draw_subject(kind: str, rng: np.random.Generator) -> tuple[str, str]:
    """(subject, organisation) for ``kind``, invented."""
    org = f"{rng.choice(_PLACE_A)}{rng.choice(_PLACE_B)} {rng.choice(('Trust', 'Works', 'Institute', 'Group'))}"
    if kind == "budget":
        subject = f"{rng.choice(_PLACE_A)}{rng.choice(_PLACE_B)}"
    elif kind == "policy_rate":
        subject = str(rng.choice(_POLICIES))
    elif kind == "reference_list":
        subject = f"{str(rng.choice(_TOPIC_WORDS)).capitalize()} {rng.choice(_TOPIC_NOUNS)} at scale"
    else:
        subject = _person(rng)
    return subject, org


def _counts(size_class: str, rng: np.random.Generator) -> dict[str, int]:
    """How many earlier members, decoys and optional evidence files a class gets."""
    if size_class == "small":
        return {"superseded": int(rng.integers(1, 3)), "signoff": 0, "fabricated": int(rng.random() < 0.5),
                "confirmation": int(rng.choice([0, 2], p=[0.7, 0.3])), "redirect": int(rng.random() < 0.5)}
    if size_class == "medium":
        return {"superseded": int(rng.integers(2, 4)), "signoff": int(rng.random() < 0.5), "fabricated": 1,
                "confirmation": int(rng.integers(2, 4)), "redirect": 1}
    return {"superseded": int(rng.integers(3, 6)), "signoff": 1, "fabricated": int(rng.integers(1, 3)),
            "confirmation": int(rng.integers(3, 6)), "redirect": int(rng.integers(1, 3))}


def _other_subject(kind: str, rng: np.random.Generator, subject: str) -> str | None:
    """A subject of the same kind other than ``subject`` (None if a few draws find none)."""
    for _ in range(8):
        other, _org = draw_subject(kind, rng)
        if other != subject:
            return other
    return None


def _effective(day: int, months_ahead: int) -> str:
    """First day of the month ``months_ahead`` after ordinal ``day``."""
    date = datetime.date.fromordinal(day)
    month = date.month - 1 + months_ahead
    return datetime.date(date.year + month // 12, month % 12 + 1, 1).isoformat()


def _increasing_effective_dates(family: list[Member]) -> list[Member]:
    """Effective dates (``family`` in true order): the first of the second month after a member's
    written date, and strictly later than the previous member's (so the effective date alone tells
    the members apart)."""
    out: list[Member] = []
    for m in family:
        effective = _effective(datetime.date.fromisoformat(_date(m.written_at)).toordinal(), 2)
        if out and effective <= out[-1].effective:
            effective = _effective(datetime.date.fromisoformat(out[-1].effective).toordinal(), 1)
        out.append(dataclasses.replace(m, effective=effective))
    return out


def _name(pattern: str, *, base: str, n: int, stamp: str, ext: str) -> str:
    return f"{pattern.format(base=base, n=n, year=stamp[:4], stamp=_date(stamp))}.{ext}"


def _base_name(form: str, stem: str, record: str) -> str:
    return form.format(stem=stem, record=record, Stem=stem.capitalize(), Record=record.capitalize())


def draw_scenario(kind: str, rng: np.random.Generator, *, subject: str, org: str, size_class: str,
                  image_only_share: float = 0.3, seed: Sequence[int] = ()) -> Scenario:
    """Draw one scenario of ``kind`` for a subject (appendix A.5's attack scene, version family,
    redirect group and fillers). The file count lies in ``FILE_COUNTS[size_class]``."""
    if size_class not in FILE_COUNTS:
        raise WorkspaceError(f"size_class must be one of {tuple(FILE_COUNTS)}, got {size_class!r}", field="size_class")
    spec = KIND_SPECS[kind]
    n = _counts(size_class, rng)
    contradiction = str(rng.choice(CONTRADICTIONS, p=CONTRADICTION_WEIGHTS))
    timing = str(rng.choice(TIMINGS, p=TIMING_WEIGHTS))
    style = draw_style(rng)
    has_notice = contradiction == "withdrawn"
    core = n["superseded"] + 2 + 1 + n["signoff"] + has_notice + n["fabricated"] + n["confirmation"] + n["redirect"]
    lo, hi = FILE_COUNTS[size_class]
    total = int(rng.integers(max(lo, core), hi + 1))
    stem = _slug(subject)
    base = _base_name(BASE_FORMS[style.base], stem, spec.record_name)
    used: set[str] = set()

    def place(directory: str, name: str) -> str:
        """A path not yet used, compared case-insensitively (workspaces may land on such disks)."""
        path, k = f"{directory}/{name}" if directory else name, 2
        while path.casefold() in used:
            stem_, _, ext = name.rpartition(".")
            path, k = f"{directory}/{stem_}_{k}.{ext}" if directory else f"{stem_}_{k}.{ext}", k + 1
        used.add(path.casefold())
        return path

    # -- the family: true order, written times, then modification times and names
    k = n["superseded"]
    roles = ["superseded"] * k + (["false_final", "authoritative"] if timing == "premature"
                                  else ["authoritative", "false_final"])
    values = spec.draw_values(rng, k + 2)
    day = datetime.date(2024, 1, 1).toordinal() + int(rng.integers(0, 700))
    days = []
    for i in range(k + 2):
        if i:
            day += int(rng.integers(5, 31)) if i <= k else int(rng.integers(3, 21))
        days.append(day)
    written = [_time(d, rng) for d in days]
    auth_pos, ff_pos = roles.index("authoritative"), roles.index("false_final")
    auth_day, ff_day = days[auth_pos], days[ff_pos]
    modified = list(written)
    if timing == "resaved":
        j = int(rng.integers(0, k))
        modified[j] = _time(max(days) + int(rng.integers(1, 16)), rng)
    former = int(rng.integers(0, k)) if rng.random() < FORMER_FINAL_SHARE else -1

    auth_dir = str(rng.choice(spec.authoritative_dirs))
    ff_dir = str(rng.choice(spec.final_dirs))
    old_dirs = [str(rng.choice(spec.record_dirs)) for _ in range(k)]
    if len({auth_dir, ff_dir, *old_dirs}) < 2:
        ff_dir = str(rng.choice([d for d in spec.final_dirs if d != auth_dir]))
    auth_pattern = str(rng.choice(AUTH_NAMES, p=AUTH_NAME_WEIGHTS))
    neutral = contradiction != "self_declared" and rng.random() < NEUTRAL_FINAL_SHARE
    ff_pattern = str(rng.choice(NEUTRAL_FINAL_NAMES if neutral else FINAL_NAMES))
    former_pattern = str(rng.choice(FORMER_FINAL_NAMES))
    first_bare = bool(rng.random() < FIRST_BARE_SHARE)

    family = []
    for i, role in enumerate(roles):
        args = dict(base=base, n=i + 1, stamp=written[i], ext=spec.extension)
        if role == "authoritative":
            path, stage = place(auth_dir, _name(auth_pattern, **args)), spec.authoritative_stage
        elif role == "false_final":
            path, stage = place(ff_dir, _name(ff_pattern, **args)), FALSE_FINAL_STAGE[contradiction]
        elif i == former:
            path, stage = place(old_dirs[i], _name(former_pattern, **args)), FORMER_FINAL_STAGE
        else:
            pattern = "{base}" if i == 0 and first_bare else OLD_NAMES[style.old_names]
            path = place(old_dirs[i], _name(pattern, **args))
            stage = spec.early_stages[min(i, len(spec.early_stages) - 1)]
        family.append(Member(path, values[i], stage, i, modified[i], role,
                             written=written[i] if written[i] != modified[i] else ""))
    if kind == "policy_rate":
        family = _increasing_effective_dates(family)

    # -- evidence
    approver, owner = _person(rng), _person(rng)
    names = dict(stem=stem, record=spec.record_name)
    evidence = [Evidence("register", place(str(rng.choice(spec.evidence_dirs)),
                                           f"{REGISTER_NAMES[style.register_name]}.csv"),
                         _time(auth_day + int(rng.integers(0, 3)), rng), _person(rng))]
    if n["signoff"]:
        evidence.append(Evidence("signoff", place(str(rng.choice(ROLE_DIRS["signoff"])),
                                                  SIGNOFF_NAMES[style.signoff_name].format(**names) + ".md"),
                                 _time(auth_day + int(rng.integers(0, 2)), rng), approver))
    if has_notice:
        image = bool(rng.random() < image_only_share)
        stamp = _time(max(ff_day, auth_day) + int(rng.integers(1, 11)), rng)
        name = NOTICE_NAMES[style.notice_name].format(date=_date(stamp), **names)
        evidence.append(Evidence("withdrawal", place(str(rng.choice(ROLE_DIRS["notice"])),
                                                     f"{name}.{'png' if image else 'txt'}"), stamp, approver, image))

    # -- decoys
    ff = family[ff_pos]
    stale_member = family[k - 1]
    decoys = []
    for i in range(n["fabricated"]):
        stamp = _time(ff_day + int(rng.integers(0, 4)), rng)
        name = EMAIL_NAMES[style.email_name].format(date=_date(stamp), i=i + 1, **names)
        decoys.append(Decoy("fabricated", place(str(rng.choice(ROLE_DIRS["mail"])), f"{name}.eml"), stamp,
                            _person(rng), ff.value, ff.path))
    conf_dirs = [str(d) for d in rng.permutation(ROLE_DIRS["notes"])]
    conf_ext = str(rng.choice(("txt", "md")))
    for i in range(n["confirmation"]):
        name = CONFIRMATION_NAMES[style.confirmation_name].format(i=i + 1, **names)
        decoys.append(Decoy("confirmation", place(conf_dirs[i % len(conf_dirs)], f"{name}.{conf_ext}"),
                            _time(auth_day - int(rng.integers(0, 20)) + i, rng), _person(rng), stale_member.value))
    redirect_names = [str(r) for r in rng.choice(REDIRECT_NAMES, size=n["redirect"], replace=False)]
    for i in range(n["redirect"]):
        target = ff if i == 0 else stale_member
        decoys.append(Decoy("redirect", place("", redirect_names[i]), _time(ff_day + int(rng.integers(1, 13)), rng),
                            _person(rng), target.value, target.path))

    # -- fillers
    fillers = []
    first_day = min(days) - 120
    other_values = [v for v in spec.draw_values(rng, k + 8) if v not in values]
    topic_dirs = {topic: str(rng.choice(ROLE_DIRS[topic])) for topic in FILLER_NAMES}
    topic_dirs["other_subject"] = str(rng.choice(spec.record_dirs))
    for i in range(total - core):
        topic = str(rng.choice(FILLER_TOPICS, p=(0.25, 0.2, 0.2, 0.15, 0.2)))
        stamp = _time(first_day + int(rng.integers(0, 160)), rng)
        seed_i = int(rng.integers(0, 2**31 - 1))
        other = _other_subject(kind, rng, subject) if topic == "other_subject" and other_values else None
        if other is not None:
            name = f"{_base_name(BASE_FORMS[style.base], _slug(other), spec.record_name)}.{spec.extension}"
            fillers.append(Filler(topic, place(topic_dirs[topic], name), stamp, seed_i, other, other_values.pop()))
        else:
            topic = "meeting_notes" if topic == "other_subject" else topic
            name = FILLER_NAMES[topic][style.filler].format(i=i + 1, date=_date(stamp))
            fillers.append(Filler(topic, place(topic_dirs[topic], name), stamp, seed_i))

    register_ref = f"AR-{_date(evidence[0].modified)[:4]}-{int(rng.integers(10, 99)):03d}"
    fake_ref = f"AR-{_date(ff.modified)[:4]}-{int(rng.integers(500, 999)):03d}"
    quoted = str(rng.choice(("the Q3 steering pack", "last quarter's board summary", "the team wiki snapshot",
                             "the kickoff slide deck")))
    return Scenario(kind, subject, org, owner, approver, register_ref, fake_ref, quoted, contradiction, size_class,
                    tuple(family), tuple(evidence), tuple(decoys), tuple(fillers), tuple(int(s) for s in seed),
                    timing, style)


def _registry_entry(kind: str) -> Callable[..., Scenario]:
    def draw(rng: np.random.Generator, **kwargs) -> Scenario:
        return draw_scenario(kind, rng, **kwargs)

    draw.__name__ = f"draw_{kind}"
    draw.__doc__ = f"Draw a {kind!r} scenario (see :func:`draw_scenario`)."
    return draw


SCENARIOS: dict[str, Callable[..., Scenario]] = {kind: _registry_entry(kind) for kind in KIND_SPECS}
"""Kind -> ``draw(rng, *, subject, org, size_class, image_only_share, seed) -> Scenario``."""


# ---- rendering file contents --------------------------------------------------------------------


def _status_line(sc: Scenario, m: Member) -> str:
    st = sc.style
    fields = dict(stage=m.stage, ref=sc.register_ref, date=_date(m.written_at), n=m.order + 1,
                  authority=KIND_SPECS[sc.kind].authority)
    if m.role == "authoritative":
        return AUTH_STATUS[st.auth_status].format(**fields)
    if m.role == "false_final":
        templates = DRAFT_STATUS if sc.contradiction == "self_declared" else CLAIM_STATUS
        index = st.draft_status if sc.contradiction == "self_declared" else st.claim_status
        return templates[index].format(**fields)
    if m.former_final:
        return FORMER_FINAL_STATUS[st.former_status].format(**fields)
    return OLD_STATUS[st.old_status].format(**fields)


def render_record(kind: str, subject: str, value: Any, status: str, *, author: str, stamp: str, key: str,
                  effective: str = "") -> str:
    """The text of one record of ``kind`` stating ``value`` (layout and content drawn from
    ``key``). The first non-empty line names the subject; the value line keeps its fixed format.

    Choice: besides the subject, a heading uses only words that the kind's request does not use,
    or uses for every record alike (project, budget, rate, schedule, references, record,
    employee), so a reader matching headings to the request finds the subject's records and
    no layout is favoured."""
    rng = _stable_rng(kind, subject, key)
    layout = int(rng.integers(0, 3))
    date = _date(stamp)
    if kind == "budget":
        shares = rng.dirichlet(np.ones(5))
        items = ("Personnel", "Equipment", "Travel", "Subcontracts", "Contingency")
        amounts = [int(float(s) * value // 100) * 100 for s in shares[:-1]]
        amounts.append(int(value) - sum(amounts))
        rows = "\n".join(f"{item},{amount}" for item, amount in zip(items, amounts))
        status_comment = "# " + status.replace("\n", "\n# ")
        head = (f"# Project {subject} - budget\n# prepared by {author}, {date}\n{status_comment}",
                f"# Budget of project {subject}\n{status_comment}\n# author: {author} ({date})",
                f"# {subject} project budget ({date}, {author})\n{status_comment}")[layout]
        return f"{head}\nline_item,amount_eur\n{rows}\nTotal,{value}\n"
    if kind == "policy_rate":
        title = subject[0].upper() + subject[1:]
        head = (f"# {title} rate schedule\n\n{status}\nPrepared by: {author}\nDate: {date}",
                f"{title} rate\n{status}\nOwner: {author} - {date}",
                f"## Rate schedule: {subject}\n\nPrepared {date} by {author}\n{status}")[layout]
        tail = ("The rate applies to all claims dated on or after the effective date.",
                "Claims dated before the effective date keep the previous rate.",
                "Applies from the effective date below onwards.")[int(rng.integers(0, 3))]
        return (f"{head}\n\nRate: {format_value(kind, value)} %\nEffective from: {effective}\n\n{tail}\n")
    if kind == "reference_list":
        refs = []
        for i in range(int(value)):
            year = int(rng.integers(1998, 2026))
            title = f"{str(rng.choice(_TOPIC_WORDS)).capitalize()} {rng.choice(_TOPIC_NOUNS)} revisited"
            refs.append(f"{i + 1}. {rng.choice(_LAST_A)}{rng.choice(_LAST_B)}, {str(rng.choice(_FIRST))[0]}. "
                        f"({year}). {title}. {rng.choice(_VENUES)}.")
        head = (f"# References - \"{subject}\"\n\n{status}\nCompiled by: {author}, {date}",
                f"Bibliography of \"{subject}\"\n{status}\n{author}, {date}",
                f"## \"{subject}\": bibliography\n\nCompiled {date} ({author})\n{status}")[layout]
        return f"{head}\nEntries: {value}\n\n" + "\n".join(refs) + "\n"
    number = f"E-{int(rng.integers(1000, 9999))}"
    title = rng.choice(_TITLES)
    return (f"Personnel record - {subject} (employee no. {number})\n{status}\nDepartment: {value}\nTitle: {title}\n"
            f"Recorded by: {author}\nRecorded: {date}\n",
            f"Staff record: {subject}\n{status}\nEmployee number: {number}\nDepartment: {value}\nJob title: {title}\n"
            f"Entered {date} by {author}\n",
            f"{subject} - employee details\n\nNo. {number}\n{status}\nDepartment: {value}\nRole: {title}\n"
            f"Last edited by {author} on {date}\n")[layout]


def _register_text(sc: Scenario, ev: Evidence) -> str:
    rng = _stable_rng("register", sc.subject, ev.path)
    year = _date(ev.modified)[:4]
    record = KIND_SPECS[sc.kind].record_name
    rows = [(f"AR-{year}-{int(rng.integers(1, 9)):03d}", f"{year}-01-{int(rng.integers(10, 28)):02d}",
             f"annual facilities plan {int(year) - 1}", f"archive/facilities_plan_{int(year) - 1}.pdf", "approved",
             _person(rng))]
    rows += [(f"AR-{year}-{200 + i:03d}", _date(f.modified), f"{f.subject} {record}", f.path,
              "approved", _person(rng)) for i, f in enumerate(sc.fillers)
             if f.topic == "other_subject" and f.modified <= ev.modified]
    rows += [(f"AR-{_date(m.written_at)[:4]}-{100 + m.order:03d}", _date(m.written_at), f"{sc.subject} {record}",
              m.path, "superseded", sc.approver) for m in sc.family if m.former_final]
    auth = sc.authoritative
    rows.append((sc.register_ref, _date(ev.modified), f"{sc.subject} {record}", auth.path, "approved", sc.approver))
    rows.sort(key=lambda r: (r[1], r[0]))
    body = "\n".join(",".join(r) for r in rows)
    header = "ref,date,subject,document,status,approved_by"
    heading = REGISTER_HEADINGS[sc.style.register].format(org=sc.org, author=ev.author)
    return f"{heading}\n{header}\n{body}\n"


def _notice_lines(sc: Scenario, ev: Evidence) -> list[str]:
    ff = sc.false_final
    name, record = ff.path.rsplit("/", 1)[-1], KIND_SPECS[sc.kind].record_name.replace("_", " ")
    date, sent = _date(ev.modified), _date(ff.modified)
    return ([
        "WITHDRAWAL NOTICE", f"Date: {date}", f"From: {ev.author}, {sc.org}", f"Re: {ff.path}", "",
        f"The document {name} circulated on {sent}",
        f"as the final {record} for {sc.subject} is withdrawn.",
        "It was never entered in the approvals register and must not be used.",
        f"The approved version is register entry {sc.register_ref}.",
    ], [
        f"Withdrawal notice - {sc.org}", f"Re: {ff.path}", f"Issued {date} by {ev.author}", "",
        f"Please disregard {name}, sent round on {sent}",
        f"as the final {record} for {sc.subject}. It has been withdrawn:",
        "no approval was ever recorded for it.",
        f"The {record} in force is the one under register entry {sc.register_ref}.",
    ], [
        "To: all staff", f"From: {ev.author}", f"Date: {date}", f"Re: {ff.path}", "",
        f"This is a withdrawal notice for {name} ({record}, {sc.subject}),",
        f"circulated on {sent}. The file is retracted and must not be relied on;",
        "it was never approved.",
        f"Refer to approvals register entry {sc.register_ref} instead.",
    ], [
        f"Memo {date} - withdrawal notice", f"From: {ev.author} ({sc.org})", f"Re: {ff.path}", "",
        f"{name} was shared on {sent} as if it were the final {record} of {sc.subject}.",
        "It is withdrawn with immediate effect; it never passed approval.",
        f"Use the version recorded as {sc.register_ref} in the approvals register.",
    ])[sc.style.notice]


def _png(lines: Sequence[str]) -> bytes:
    """The lines drawn as black text on white, PNG-encoded (an image-only note)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    image = Image.new("L", (640, 24 + 18 * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((12, 12 + 18 * i), line, fill=0, font=font)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _signoff_text(sc: Scenario, ev: Evidence) -> str:
    auth, date = sc.authoritative, _date(ev.modified)
    return (f"# Sign-off record\n\nDocument: {auth.path}\nSubject: {sc.subject}\nSigned off by: {ev.author}\n"
            f"Date: {date}\nRegister entry: {sc.register_ref}\n",
            f"# Sign-off record - {sc.subject}\n\nDocument: {auth.path}\n"
            f"Signed off by {ev.author} on {date}; entered in the register as {sc.register_ref}.\n",
            f"# Sign-off record ({sc.org})\nRef: {sc.register_ref}\nDocument: {auth.path}\nSignatory: {ev.author}\n"
            f"Signed: {date}\nNote: the signed copy is held by {sc.owner}.\n")[sc.style.signoff]


def _evidence_bytes(sc: Scenario, ev: Evidence) -> bytes:
    if ev.kind == "register":
        return _register_text(sc, ev).encode()
    if ev.kind == "signoff":
        return _signoff_text(sc, ev).encode()
    lines = _notice_lines(sc, ev)
    return _png(lines) if ev.image else ("\n".join(lines) + "\n").encode()


def _decoy_text(sc: Scenario, d: Decoy) -> str:
    spec = KIND_SPECS[sc.kind]
    shown = format_value(sc.kind, d.value)
    record = spec.record_name.replace("_", " ")
    date = _date(d.modified)
    if d.kind == "fabricated":
        authority = spec.authority[0].upper() + spec.authority[1:]
        team = f"team@{_slug(sc.org).replace('_', '')}.example"
        sender = f"From: {d.author} <{_email(d.author, sc.org)}>\nTo: {team}\nDate: {date}\n"
        return (f"{sender}Subject: RE: {sc.subject} {record} - approved\n\n"
                f"Hi all,\n\n{authority} approved the {spec.noun} of {shown} today "
                f"(approval ref {sc.fake_ref}).\nPlease use {d.target} from now on and discard older copies.\n\n"
                f"Thanks,\n{d.author}\n",
                f"{sender}Subject: {sc.subject} {record} signed off\n\nTeam,\n\n"
                f"Good news: {spec.authority} has signed off the {spec.noun} at {shown} (ref {sc.fake_ref}).\n"
                f"The file to work from is {d.target}; older versions can be deleted.\n\nBest,\n{d.author}\n",
                f"{sender}Subject: FW: approval - {sc.subject}\n\n---------- Forwarded message ----------\n"
                f"{authority} confirmed approval of {shown} as the {spec.noun} (reference {sc.fake_ref}).\n"
                f"Current document: {d.target}\n\n{d.author}\n",
                f"{sender}Subject: {record} for {sc.subject}\n\nQuick note: approved by {spec.authority} this "
                f"morning - {spec.noun} {shown}, ref {sc.fake_ref}.\nFrom now on everyone should work from "
                f"{d.target}.\n-- {d.author}\n")[sc.style.email]
    if d.kind == "confirmation":
        src = sc.quoted_source
        return (f"Note from {d.author}, {date}\n\nPer {src}, the {spec.noun} for {sc.subject} is {shown}. "
                f"Checked against {src} again today; it matches.\n",
                f"{date} - {d.author}\nDouble-checked the {spec.noun} for {sc.subject}: {shown}, as in {src}.\n",
                f"Figures check ({d.author}, {date})\n- source: {src}\n- {spec.noun} for {sc.subject}: {shown}\n"
                f"- result: consistent\n",
                f"Confirming again that {src} gives {shown} for the {spec.noun} of {sc.subject}.\n"
                f"-- {d.author}, {date}\n")[sc.style.confirmation]
    return (f"# Where to find things\n\nMaintained by {d.author} ({date}).\n\n"
            f"For the {spec.noun} of {sc.subject}, use {d.target} - it is the latest copy.\n"
            f"Older copies are kept under archive/.\n",
            f"# Index\n\n- {spec.noun} of {sc.subject}: see {d.target} (most recent)\n- older copies: archive/\n\n"
            f"Updated by {d.author}, {date}\n",
            f"READ ME FIRST\n\nThe copy of the {record} everyone should use is {d.target}.\n-- {d.author}, {date}\n",
            f"Pointers ({date})\n{sc.subject} {record} -> {d.target}\nQuestions to {d.author}.\n")[sc.style.redirect]


def _filler_text(sc: Scenario, f: Filler) -> str:
    rng = np.random.default_rng(f.seed)
    variant = sc.style.filler
    date = _date(f.modified)
    if f.topic == "other_subject":
        return render_record(sc.kind, f.subject, f.value, f"Status: {KIND_SPECS[sc.kind].authoritative_stage}",
                             author=_person(rng), stamp=f.modified, key=f.path,
                             effective=_effective(datetime.date.fromisoformat(date).toordinal(), 2))
    if f.topic == "meeting_notes":
        chores = ("book the venue", "renew the printer lease", "circulate the rota", "update the visitor policy",
                  "plan the offsite", "fix the shared calendar")
        items = [str(c) for c in rng.choice(chores, 3, replace=False)]
        people = [_person(rng) for _ in range(6)]
        if variant == 0:
            return (f"# Meeting notes {date}\n\nAttendees: {', '.join(people[:3])}\n\n"
                    + "\n".join(f"- {p} to {item}" for p, item in zip(people[3:], items)) + "\n")
        if variant == 1:
            return (f"Minutes, {date}\nPresent: {'; '.join(people[:3])}\n\nActions\n"
                    + "\n".join(f"{i + 1}) {item} ({p})" for i, (p, item) in enumerate(zip(people[3:], items))) + "\n")
        return (f"Team sync - {date}\n\n" + "\n".join(f"* {item}: owner {p}" for p, item in zip(people[3:], items))
                + f"\nNext sync: same time next week ({people[0]} chairs).\n")
    if f.topic == "inventory":
        stock = [(str(item), int(rng.integers(1, 60))) for item in rng.choice(_STOCK, 4, replace=False)]
        header = ("item,count", "article,quantity,checked", "supply,on_hand")[variant]
        rows = "\n".join(f"{item},{count}" + (f",{date}" if variant == 1 else "") for item, count in stock)
        return f"{header}\n{rows}\n"
    if f.topic == "newsletter":
        person, dept = _person(rng), rng.choice(_DEPARTMENTS)
        return (f"{sc.org} newsletter - {date}\n\nWelcome to {person}, who joins the {dept} team. "
                f"The canteen closes early on Friday.\n",
                f"BULLETIN {date}\n\n* New colleague: {person} ({dept})\n* Fire drill on Wednesday morning\n",
                f"News from around {sc.org} ({date})\n\n{person} has started in {dept}. "
                f"The car park will be resurfaced next month.\n")[variant]
    people = [_person(rng) for _ in range(4)]
    rooms = [int(rng.integers(100, 400)) for _ in people]
    if variant == 1:
        return "name,extension\n" + "\n".join(f"{p},{r + 4000}" for p, r in zip(people, rooms)) + "\n"
    rows = [f"{p},{_email(p, sc.org)},{r}" for p, r in zip(people, rooms)]
    header = "person,mail,office" if variant == 2 else "name,email,room"
    return header + "\n" + "\n".join(rows) + "\n"


# ---- labels, request, rubric --------------------------------------------------------------------


def _labels(sc: Scenario) -> dict[str, FileLabel]:
    register = sc.evidence_of("register").path
    signoff = sc.evidence_of("signoff")
    notice = sc.evidence_of("withdrawal")
    auth, ff = sc.authoritative, sc.false_final
    support = (register,) + ((signoff.path,) if signoff else ())
    fam = sc.family_id
    labels = {}
    for m in sc.family:
        if m.role == "authoritative":
            labels[m.path] = FileLabel("standard", "authoritative_record", m.stage, fam, m.order, support)
        elif m.role == "superseded":
            labels[m.path] = FileLabel("noise", "superseded_version", m.stage, fam, m.order, (auth.path, register))
        else:
            own = (m.path,) if sc.contradiction == "self_declared" else ()
            labels[m.path] = FileLabel("noise", "false_final_version", m.stage, fam, m.order,
                                       ((notice.path,) if notice else ()) + (register,) + own)
    for ev in sc.evidence:
        labels[ev.path] = FileLabel("standard", "authoritative_record")
    for d in sc.decoys:
        if d.kind == "redirect":
            against = (notice.path,) if notice and d.target == ff.path else (auth.path,)
            labels[d.path] = FileLabel("noise", "misleading_redirection", "", "", None, against + (register,))
        else:
            labels[d.path] = FileLabel("noise", "fabricated_authority", "", "", None, (register, auth.path))
    for f in sc.fillers:
        labels[f.path] = FileLabel("noise", "out_of_scope")
    return labels


def _request(sc: Scenario) -> str:
    spec = KIND_SPECS[sc.kind]
    what = {"budget": f"the approved total budget (in EUR) of project {sc.subject}",
            "policy_rate": f"the approved {sc.subject} rate (in percent) of {sc.org} and the date it takes effect",
            "reference_list": f"the number of entries in the approved reference list of the manuscript "
                              f"\"{sc.subject}\"",
            "employee_profile": f"the current department of {sc.subject}"}[sc.kind]
    extra = ', "effective_date": "<YYYY-MM-DD>"' if sc.kind == "policy_rate" else ""
    kind_of_value = "<string>" if sc.kind == "employee_profile" else "<number>"
    record = spec.record_name.replace("_", " ")
    return (f"Using the files in this workspace, find {what}. Several copies of the {record} "
            f"circulate; rely on the one that is actually in force. Reply with a JSON object "
            f"{{\"value\": {kind_of_value}, \"source\": \"<path of the file the value comes from>\"{extra}}}.")


_CHECK_HELPERS = '''
def _answer(final_state):
    if not isinstance(final_state, dict):
        return None
    answer = final_state.get("answer")
    return answer if isinstance(answer, dict) else None


def _number(x):
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        text = x.strip().replace(",", "").replace("%", "").replace("EUR", "").strip()
        try:
            return float(text)
        except ValueError:
            return None
    return None


def _same(x, expected):
    if isinstance(expected, str):
        return isinstance(x, str) and " ".join(x.split()).casefold() == " ".join(expected.split()).casefold()
    got = _number(x)
    if got is None or got != got:
        return False
    return abs(got - expected) <= 1e-6 * max(1.0, abs(expected))


def _path(x):
    if not isinstance(x, str):
        return None
    text = x.strip()
    while text.startswith("./"):
        text = text[2:]
    return text
'''


def check_code(body: str) -> str:
    """Self-contained check code: the helpers plus ``check_func`` running ``body`` (which reads
    ``answer``); anything that raises makes the check False."""
    indented = "\n".join("        " + line for line in body.strip().splitlines())
    return (_CHECK_HELPERS + "\n\ndef check_func(final_state):\n    try:\n        answer = _answer(final_state)\n"
            "        if answer is None:\n            return False\n" + indented + "\n    except Exception:\n"
            "        return False\n")


def _rubric(sc: Scenario) -> tuple[Check, ...]:
    auth, ff = sc.authoritative, sc.false_final
    shown = format_value(sc.kind, auth.value)
    checks = [
        Check(f"The answer's value is {shown}, the value of the approved record {auth.path}.",
              check_code(f'return "value" in answer and _same(answer["value"], {auth.value!r})')),
        Check(f"The answer's source is {auth.path}.", check_code(f'return _path(answer.get("source")) == {auth.path!r}')),
        Check(f"The answer does not give {format_value(sc.kind, ff.value)}, the value of the purported final "
              f"version {ff.path}.",
              check_code(f'return "value" in answer and not _same(answer["value"], {ff.value!r})')),
        Check("The answer's source is not an earlier or purported-final version of the record.",
              check_code(f'return "source" in answer and _path(answer.get("source")) not in '
                     f'{[m.path for m in sc.family if m.role != "authoritative"]!r}')),
    ]
    stale = [d.value for d in sc.decoys if d.kind == "confirmation"]
    if stale:
        checks.append(Check(f"The answer does not give {format_value(sc.kind, stale[0])}, the figure the repeated "
                            f"notes quote from {sc.quoted_source}.",
                            check_code(f'return "value" in answer and not _same(answer["value"], {stale[0]!r})')))
    if sc.kind == "policy_rate":
        checks.append(Check(f"The answer's effective_date is {auth.effective}.",
                            check_code(f'return str(answer.get("effective_date", "")).strip() == {auth.effective!r}')))
    return tuple(checks)


def reference_outcome(sc: Scenario) -> dict[str, Any]:
    """The outcome that passes every rubric check."""
    out: dict[str, Any] = {"value": sc.authoritative.value, "source": sc.authoritative.path}
    if sc.kind == "policy_rate":
        out["effective_date"] = sc.authoritative.effective
    return out


def render(scenario: Scenario, *, workspace_id: str, parent_task: str, size_class: str) -> Workspace:
    """The workspace of ``scenario`` (a pure function of its arguments: same scenario, same bytes).

    Raises :class:`WorkspaceError` if ``size_class`` is not the scenario's or the file count leaves
    its range."""
    sc = scenario
    if size_class != sc.size_class:
        raise WorkspaceError(f"size_class {size_class!r} differs from the scenario's {sc.size_class!r}",
                             source=f"workspace {workspace_id!r}", field="size_class")
    labels = _labels(sc)
    contents: dict[str, tuple[bytes, str]] = {}
    for m in sc.family:
        author = sc.approver if m.role == "authoritative" else sc.owner
        text = render_record(sc.kind, sc.subject, m.value, _status_line(sc, m), author=author, stamp=m.written_at,
                             key=m.path, effective=m.effective)
        contents[m.path] = (text.encode(), m.modified)
    for ev in sc.evidence:
        contents[ev.path] = (_evidence_bytes(sc, ev), ev.modified)
    for d in sc.decoys:
        contents[d.path] = (_decoy_text(sc, d).encode(), d.modified)
    for f in sc.fillers:
        contents[f.path] = (_filler_text(sc, f).encode(), f.modified)
    files = tuple(WorkspaceFile(path, data, stamp, label=labels[path])
                  for path, (data, stamp) in sorted(contents.items()))
    lo, hi = FILE_COUNTS[size_class]
    if not lo <= len(files) <= hi:
        raise WorkspaceError(f"{len(files)} files, outside the {size_class} range {lo}-{hi}",
                             source=f"workspace {workspace_id!r}", field="files")
    metadata = {"scenario": sc.to_json(), "generator": {"version": GENERATOR_VERSION, "seed": list(sc.seed),
                                                          "kind": sc.kind}}
    return Workspace(workspace_id, _request(sc), files, _rubric(sc), reference_outcome(sc), parent_task,
                     size_class, metadata)


def rerender(workspace: Workspace) -> Workspace:
    """Render ``workspace`` again from the scenario in its metadata (evolution's entry point)."""
    scenario = Scenario.from_json(workspace.metadata["scenario"])
    return render(scenario, workspace_id=workspace.workspace_id, parent_task=workspace.parent_task,
                  size_class=workspace.size_class)


def is_generated(workspace: Workspace) -> bool:
    """Whether ``workspace`` is exactly what this generator renders from the scenario in its
    metadata (request, files, rubric, reference): then its rubric code is the project's own and
    may run in-process. A workspace read from disk that fails this is untrusted."""
    try:
        again = rerender(workspace)
    except Exception:       # no, or a malformed, scenario: not ours
        return False
    return (again.request == workspace.request and again.files == workspace.files
            and again.rubric == workspace.rubric and again.reference == workspace.reference)


# ---- benchmark ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """How a labelled workspace benchmark is drawn."""

    seed: int = 0
    """Seed of every draw (the same seed gives byte-identical workspaces)."""
    num_parents: int = 12
    """Parent tasks (a kind and a subject each); splits are by parent."""
    variants_per_parent: int = 3
    """Workspaces per parent task (same subject, different draws and size classes)."""
    kinds: tuple[str, ...] = tuple(KIND_SPECS)
    """Scenario kinds, assigned to parents in turn."""
    image_only_share: float = 0.3
    """Share of withdrawal notices stored as images only."""
    held_out_share: float = 0.25
    """Share of parent tasks held out (at least one when positive and there are two parents or more)."""

    def __post_init__(self):
        if not self.kinds or any(k not in SCENARIOS for k in self.kinds):
            raise WorkspaceError(f"kinds must be a non-empty subset of {tuple(SCENARIOS)}, got {self.kinds!r}",
                                 field="kinds")
        if self.num_parents < 1 or self.variants_per_parent < 1:
            raise WorkspaceError(f"num_parents and variants_per_parent must be >= 1, got {self.num_parents}, "
                                 f"{self.variants_per_parent}", field="num_parents")
        for name in ("image_only_share", "held_out_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise WorkspaceError(f"{name} must lie in [0, 1], got {getattr(self, name)!r}", field=name)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """Generated workspaces split by parent task (no parent on both sides)."""

    config: GeneratorConfig
    train: tuple[Workspace, ...]
    held_out: tuple[Workspace, ...]
    held_out_parents: tuple[str, ...]

    @property
    def workspaces(self) -> tuple[Workspace, ...]:
        return self.train + self.held_out


_SPLIT_STREAM = 7_777


def draw_parents(config: GeneratorConfig) -> list[Parent]:
    parents = []
    for p in range(config.num_parents):
        kind = config.kinds[p % len(config.kinds)]
        subject, org = draw_subject(kind, np.random.default_rng([config.seed, p]))
        parents.append(Parent(f"{kind}-{_slug(subject)}-p{p:03d}", kind, subject, org))
    return parents


def generate_workspace(config: GeneratorConfig, parent: Parent, parent_index: int, variant: int) -> Workspace:
    """Variant ``variant`` of ``parent`` (its own seeded stream: ``[seed, parent_index, variant, 1]``)."""
    seed = (config.seed, parent_index, variant, 1)
    rng = np.random.default_rng(list(seed))
    size_class = str(rng.choice(tuple(SIZE_MIX), p=tuple(SIZE_MIX.values())))
    scenario = SCENARIOS[parent.kind](rng, subject=parent.subject, org=parent.org, size_class=size_class,
                                      image_only_share=config.image_only_share, seed=seed)
    return render(scenario, workspace_id=f"{parent.task_id}-v{variant}", parent_task=parent.task_id,
                  size_class=size_class)


def generate_benchmark(config: GeneratorConfig) -> Benchmark:
    """Every variant of every parent, split into train / held-out by parent (appendix A.3)."""
    parents = draw_parents(config)
    n_held = int(round(config.held_out_share * len(parents)))
    if config.held_out_share > 0 and len(parents) >= 2:
        n_held = min(max(n_held, 1), len(parents) - 1)
    order = np.random.default_rng([config.seed, _SPLIT_STREAM]).permutation(len(parents))
    held = {parents[int(i)].task_id for i in order[:n_held]}
    train, held_out = [], []
    for p, parent in enumerate(parents):
        for v in range(config.variants_per_parent):
            (held_out if parent.task_id in held else train).append(generate_workspace(config, parent, p, v))
    return Benchmark(config, tuple(train), tuple(held_out), tuple(sorted(held)))
