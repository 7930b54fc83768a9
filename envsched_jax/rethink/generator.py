"""A seeded, offline generator of labelled file workspaces (seeds/002, appendix A.5; issue 15 item 2).

Every Env-Rethink module needs workspaces whose answer depends on resolving file relationships
and whose files carry ground-truth labels (appendix A.1). This module makes them in two steps:

1. **Scenario.** :data:`SCENARIOS` draws a JSON-serialisable :class:`Scenario` from a
   ``numpy.random.Generator``: a subject, a version family (earlier members, the authoritative
   member, a purported final version), the evidence that decides which member is authoritative
   (an approvals register, a sign-off record, a withdrawal notice), the decoys (fabricated
   approvals, repeated-source "confirmations", redirects) and fillers. Every path, time and value
   is fixed here.
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
- **The purported final** is always the newest member of the family by its true order (its
  label's ``order`` is the family's last), carries a filename claiming finality, and is
  contradicted in one of three ways (:data:`CONTRADICTIONS`): ``withdrawn`` by a notice,
  ``unregistered`` (absent from the register, content claims final) or ``self_declared`` (its own
  content says "DRAFT - NOT APPROVED"). Its observed stage is ``withdrawn``, ``proposed`` or
  ``draft`` respectively.
- **Image-only withdrawals.** A share of the notices is a PNG (text drawn with Pillow); the text
  tools cannot read it. The approvals register (text) still names the authoritative record and
  omits the purported final, so the task stays solvable from text. The notice is labelled
  ``authoritative_record`` (it is valid evidence, only unreadable to text tools).
- **Evidence files** (register, sign-off, notices) are ``authoritative_record`` with stage ``""``
  and no family: they are standard files needed to solve the task, not versions of the record.
- **Repeated-source confirmations** (several notes quoting one outdated source for the previous
  figure) are ``fabricated_authority`` with stage ``""``; their value is the newest earlier
  member's value, the plausible stale figure.
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

GENERATOR_VERSION = 1
FILE_COUNTS = {"small": (4, 12), "medium": (13, 30), "large": (31, 80)}
"""File-count range drawn for each size class (disjoint, each inside ``SIZE_CLASSES``)."""
CONTRADICTIONS = ("withdrawn", "unregistered", "self_declared")
CONTRADICTION_WEIGHTS = (0.6, 0.2, 0.2)
FALSE_FINAL_STAGE = {"withdrawn": "withdrawn", "unregistered": "proposed", "self_declared": "draft"}
ROLES = ("superseded", "authoritative", "false_final")
EVIDENCE_KINDS = ("register", "signoff", "withdrawal")
DECOY_KINDS = ("fabricated", "confirmation", "redirect")
FILLER_TOPICS = ("meeting_notes", "inventory", "newsletter", "contacts", "other_subject")

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
        record_name: filename stem of a family member ("budget").
        extension: family members' file extension.
        record_dirs / authoritative_dir / final_dirs / evidence_dir: where earlier members, the
            authoritative member, the purported final and the evidence live (spread, so that
            directory grouping is meaningful but not sufficient).
        early_stages: observed stages of earlier members (first, then later ones).
        authoritative_stage: observed stage of the authoritative member.
        authority: who the fabricated approval names.
        draw_values: ``(rng, n) -> n distinct values``.
    """

    noun: str
    record_name: str
    extension: str
    record_dirs: tuple[str, ...]
    authoritative_dir: str
    final_dirs: tuple[str, ...]
    evidence_dir: str
    early_stages: tuple[str, ...]
    authoritative_stage: str
    authority: str
    draw_values: Callable[[np.random.Generator, int], list]


def _distinct_ints(rng: np.random.Generator, n: int, lo: int, hi: int, step: int) -> list[int]:
    return [int(v) * step for v in rng.choice(np.arange(lo // step, hi // step), size=n, replace=False)]


KIND_SPECS: dict[str, KindSpec] = {
    "budget": KindSpec("total budget", "budget", "csv", ("drafts", "archive", "finance/working"), "finance",
                       ("shared", "drafts"), "finance/approvals", ("draft", "revised"), "approved",
                       "the CFO", lambda rng, n: _distinct_ints(rng, n, 80_000, 2_000_000, 500)),
    "policy_rate": KindSpec("rate", "rate_schedule", "md", ("policies/drafts", "archive", "hr/working"), "policies",
                            ("shared", "policies"), "policies/register", ("draft", "consultation"), "approved",
                            "the policy board",
                            lambda rng, n: [v / 100 for v in _distinct_ints(rng, n, 100, 1200, 25)]),
    "reference_list": KindSpec("number of references", "references", "md",
                               ("manuscript/drafts", "archive", "shared/old"), "manuscript/accepted",
                               ("manuscript", "shared"),
                               "manuscript/editorial", ("draft", "revised"), "approved", "the handling editor",
                               lambda rng, n: _distinct_ints(rng, n, 18, 64, 1)),
    "employee_profile": KindSpec("department", "profile", "txt", ("hr/history", "archive", "shared/hr"), "hr/current",
                                 ("hr", "shared"), "hr/records", ("previous", "historical"), "current",
                                 "the HR director",
                                 lambda rng, n: [str(v) for v in rng.choice(_DEPARTMENTS, size=n, replace=False)]),
}


def format_value(kind: str, value: Any) -> str:
    """How a value is written in the files (the text a reader finds)."""
    if kind == "policy_rate":
        return f"{float(value):.2f}"
    return str(value)


# ---- scenario records ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Member:
    """One version-family record. ``role`` is superseded / authoritative / false_final; ``order``
    its position in the family's true timeline; ``effective`` an effective date (policy_rate)."""

    path: str
    value: Any
    stage: str
    order: int
    modified: str
    role: str
    effective: str = ""


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

    def __post_init__(self):
        if self.kind not in KIND_SPECS:
            raise WorkspaceError(f"scenario kind must be one of {tuple(KIND_SPECS)}, got {self.kind!r}", field="kind")
        if self.size_class not in FILE_COUNTS:
            raise WorkspaceError(f"size_class must be one of {tuple(FILE_COUNTS)}, got {self.size_class!r}",
                                 field="size_class")
        if self.contradiction not in CONTRADICTIONS:
            raise WorkspaceError(f"contradiction must be one of {CONTRADICTIONS}, got {self.contradiction!r}",
                                 field="contradiction")
        roles = [m.role for m in self.family]
        if roles.count("authoritative") != 1 or roles.count("false_final") != 1 or not set(roles) <= set(ROLES):
            raise WorkspaceError(f"the family needs one authoritative and one false_final member, got roles {roles}",
                                 field="family")
        if sorted(m.order for m in self.family) != list(range(len(self.family))):
            raise WorkspaceError("family orders must be 0..k without gaps", field="family")
        if not any(e.kind == "register" for e in self.evidence):
            raise WorkspaceError("a scenario needs an approvals register", field="evidence")
        paths = self.paths()
        if len(set(paths)) != len(paths):
            raise WorkspaceError(f"duplicate paths in the scenario: {sorted({p for p in paths if paths.count(p) > 1})}",
                                 field="paths")

    def paths(self) -> list[str]:
        return [x.path for group in (self.family, self.evidence, self.decoys, self.fillers) for x in group]

    @property
    def authoritative(self) -> Member:
        return next(m for m in self.family if m.role == "authoritative")

    @property
    def false_final(self) -> Member:
        return next(m for m in self.family if m.role == "false_final")

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


def _final_name(rng: np.random.Generator, stem: str, ext: str) -> str:
    pattern = int(rng.integers(0, 3))
    return (f"{stem}_FINAL.{ext}", f"{stem}_final_v2.{ext}", f"FINAL_{stem}.{ext}")[pattern]


def _effective(day: int, months_ahead: int) -> str:
    """First day of the month ``months_ahead`` after ordinal ``day``."""
    date = datetime.date.fromordinal(day)
    month = date.month - 1 + months_ahead
    return datetime.date(date.year + month // 12, month % 12 + 1, 1).isoformat()


def _increasing_effective_dates(family: list[Member]) -> list[Member]:
    """Effective dates: the first of the second month after a member's date, and strictly later
    than the previous member's (so the effective date alone tells the members apart)."""
    out: list[Member] = []
    for m in family:
        effective = _effective(datetime.date.fromisoformat(_date(m.modified)).toordinal(), 2)
        if out and effective <= out[-1].effective:
            effective = _effective(datetime.date.fromisoformat(out[-1].effective).toordinal(), 1)
        out.append(dataclasses.replace(m, effective=effective))
    return out


def draw_scenario(kind: str, rng: np.random.Generator, *, subject: str, org: str, size_class: str,
                  image_only_share: float = 0.3, seed: Sequence[int] = ()) -> Scenario:
    """Draw one scenario of ``kind`` for a subject (appendix A.5's attack scene, version family,
    redirect group and fillers). The file count lies in ``FILE_COUNTS[size_class]``."""
    if size_class not in FILE_COUNTS:
        raise WorkspaceError(f"size_class must be one of {tuple(FILE_COUNTS)}, got {size_class!r}", field="size_class")
    spec = KIND_SPECS[kind]
    n = _counts(size_class, rng)
    contradiction = str(rng.choice(CONTRADICTIONS, p=CONTRADICTION_WEIGHTS))
    has_notice = contradiction == "withdrawn"
    core = n["superseded"] + 2 + 1 + n["signoff"] + has_notice + n["fabricated"] + n["confirmation"] + n["redirect"]
    lo, hi = FILE_COUNTS[size_class]
    total = int(rng.integers(max(lo, core), hi + 1))
    stem = _slug(subject)
    used: set[str] = set()

    def place(directory: str, name: str) -> str:
        path, k = f"{directory}/{name}" if directory else name, 2
        while path in used:
            base, _, ext = name.rpartition(".")
            path, k = f"{directory}/{base}_{k}.{ext}" if directory else f"{base}_{k}.{ext}", k + 1
        used.add(path)
        return path

    values = spec.draw_values(rng, n["superseded"] + 2)
    day = datetime.date(2024, 1, 1).toordinal() + int(rng.integers(0, 700))
    family = []
    for i in range(n["superseded"]):
        stage = spec.early_stages[min(i, 1)]
        name = f"{stem}_{spec.record_name}_v{i + 1}.{spec.extension}"
        family.append(Member(place(str(rng.choice(spec.record_dirs)), name), values[i], stage, i, _time(day, rng),
                             "superseded"))
        day += int(rng.integers(5, 31))
    k = n["superseded"]
    auth_day = day
    family.append(Member(place(spec.authoritative_dir, f"{stem}_{spec.record_name}_v{k + 1}.{spec.extension}"),
                         values[k], spec.authoritative_stage, k, _time(day, rng), "authoritative"))
    day += int(rng.integers(3, 21))
    ff_day = day
    family.append(Member(place(str(rng.choice(spec.final_dirs)), _final_name(rng, f"{stem}_{spec.record_name}",
                                                                             spec.extension)),
                         values[k + 1], FALSE_FINAL_STAGE[contradiction], k + 1, _time(day, rng), "false_final"))

    if kind == "policy_rate":
        family = _increasing_effective_dates(family)
    approver, owner = _person(rng), _person(rng)
    evidence = [Evidence("register", place(spec.evidence_dir, "approvals_register.csv"),
                         _time(auth_day + int(rng.integers(0, 3)), rng), _person(rng))]
    if n["signoff"]:
        evidence.append(Evidence("signoff", place("records", f"{stem}_signoff.md"),
                                 _time(auth_day + int(rng.integers(0, 2)), rng), approver))
    if has_notice:
        image = bool(rng.random() < image_only_share)
        name = f"withdrawal_notice_{stem}.{'png' if image else 'txt'}"
        evidence.append(Evidence("withdrawal", place(str(rng.choice(("mail", "records", "notices"))), name),
                                 _time(ff_day + int(rng.integers(1, 11)), rng), approver, image))

    ff = family[-1]
    stale = family[k - 1].value
    decoys = []
    for i in range(n["fabricated"]):
        decoys.append(Decoy("fabricated", place("mail", f"re_{stem}_{spec.record_name}_approved_{i + 1}.eml"),
                            _time(ff_day + int(rng.integers(0, 4)), rng), _person(rng), ff.value, ff.path))
    conf_dirs = ("mail", "notes", "shared", "minutes")
    for i in range(n["confirmation"]):
        decoys.append(Decoy("confirmation", place(conf_dirs[i % len(conf_dirs)], f"{stem}_figures_note_{i + 1}.txt"),
                            _time(auth_day - int(rng.integers(0, 20)) + i, rng), _person(rng), stale))
    redirect_names = ("README.md", "shared/README.txt", "notes/where_to_find_things.md")
    for i in range(n["redirect"]):
        target = ff if i == 0 else family[k - 1]
        decoys.append(Decoy("redirect", place("", redirect_names[i]), _time(ff_day + int(rng.integers(1, 13)), rng),
                            _person(rng), target.value, target.path))

    fillers = []
    first_day = auth_day - 120
    other_values = [v for v in spec.draw_values(rng, n["superseded"] + 8) if v not in values]
    topic_dirs = {"meeting_notes": "notes", "inventory": "facilities", "newsletter": "shared",
                  "contacts": "admin", "other_subject": str(rng.choice(spec.record_dirs))}
    for i in range(total - core):
        topic = str(rng.choice(FILLER_TOPICS, p=(0.25, 0.2, 0.2, 0.15, 0.2)))
        stamp = _time(first_day + int(rng.integers(0, 160)), rng)
        seed_i = int(rng.integers(0, 2**31 - 1))
        other = _other_subject(kind, rng, subject) if topic == "other_subject" and other_values else None
        if other is not None:
            name = f"{_slug(other)}_{spec.record_name}.{spec.extension}"
            fillers.append(Filler(topic, place(topic_dirs[topic], name), stamp, seed_i, other, other_values.pop()))
        else:
            topic = "meeting_notes" if topic == "other_subject" else topic
            ext = {"meeting_notes": "md", "inventory": "csv", "newsletter": "txt", "contacts": "csv"}[topic]
            fillers.append(Filler(topic, place(topic_dirs[topic], f"{topic}_{i + 1:02d}.{ext}"), stamp, seed_i))

    register_ref = f"AR-{_date(evidence[0].modified)[:4]}-{int(rng.integers(10, 99)):03d}"
    fake_ref = f"AR-{_date(ff.modified)[:4]}-{int(rng.integers(500, 999)):03d}"
    quoted = str(rng.choice(("the Q3 steering pack", "last quarter's board summary", "the team wiki snapshot",
                             "the kickoff slide deck")))
    return Scenario(kind, subject, org, owner, approver, register_ref, fake_ref, quoted, contradiction, size_class,
                    tuple(family), tuple(evidence), tuple(decoys), tuple(fillers), tuple(int(s) for s in seed))


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
    if m.role == "authoritative":
        return f"Status: {m.stage} (register entry {sc.register_ref})"
    if m.role == "false_final":
        return "DRAFT - NOT APPROVED\nStatus: draft" if sc.contradiction == "self_declared" else "Status: FINAL"
    return f"Status: {m.stage}"


def render_record(kind: str, subject: str, value: Any, status: str, *, author: str, stamp: str, key: str,
                  effective: str = "") -> str:
    """The text of one record of ``kind`` stating ``value`` (content drawn from ``key``)."""
    rng = _stable_rng(kind, subject, key)
    if kind == "budget":
        shares = rng.dirichlet(np.ones(5))
        items = ("Personnel", "Equipment", "Travel", "Subcontracts", "Contingency")
        amounts = [int(float(s) * value // 100) * 100 for s in shares[:-1]]
        amounts.append(int(value) - sum(amounts))
        rows = "\n".join(f"{item},{amount}" for item, amount in zip(items, amounts))
        return (f"# Project {subject} - budget\n# prepared by {author}, {_date(stamp)}\n"
                f"# {status.replace(chr(10), chr(10) + '# ')}\nline_item,amount_eur\n{rows}\nTotal,{value}\n")
    if kind == "policy_rate":
        return (f"# {subject.capitalize()} rate schedule\n\n{status}\nPrepared by: {author}\nDate: {_date(stamp)}\n\n"
                f"Rate: {format_value(kind, value)} %\nEffective from: {effective}\n\n"
                f"The rate applies to all claims dated on or after the effective date.\n")
    if kind == "reference_list":
        refs = []
        for i in range(int(value)):
            year = int(rng.integers(1998, 2026))
            title = f"{str(rng.choice(_TOPIC_WORDS)).capitalize()} {rng.choice(_TOPIC_NOUNS)} revisited"
            refs.append(f"{i + 1}. {rng.choice(_LAST_A)}{rng.choice(_LAST_B)}, {str(rng.choice(_FIRST))[0]}. "
                        f"({year}). {title}. {rng.choice(_VENUES)}.")
        return (f"# References - \"{subject}\"\n\n{status}\nCompiled by: {author}, {_date(stamp)}\n"
                f"Entries: {value}\n\n" + "\n".join(refs) + "\n")
    return (f"Personnel record - {subject} (employee no. E-{int(rng.integers(1000, 9999))})\n{status}\n"
            f"Department: {value}\nTitle: {rng.choice(_TITLES)}\nRecorded by: {author}\nRecorded: {_date(stamp)}\n")


def _register_text(sc: Scenario, ev: Evidence) -> str:
    rng = _stable_rng("register", sc.subject, ev.path)
    year = _date(ev.modified)[:4]
    rows = [(f"AR-{year}-{int(rng.integers(1, 9)):03d}", f"{year}-01-{int(rng.integers(10, 28)):02d}",
             f"annual facilities plan {int(year) - 1}", f"archive/facilities_plan_{int(year) - 1}.pdf", "approved",
             _person(rng))]
    rows += [(f"AR-{year}-{200 + i:03d}", _date(f.modified), f"{f.subject} {KIND_SPECS[sc.kind].record_name}", f.path,
              "approved", _person(rng)) for i, f in enumerate(sc.fillers)
             if f.topic == "other_subject" and f.modified <= ev.modified]
    auth = sc.authoritative
    rows.append((sc.register_ref, _date(ev.modified), f"{sc.subject} {KIND_SPECS[sc.kind].record_name}", auth.path,
                 "approved", sc.approver))
    rows.sort(key=lambda r: (r[1], r[0]))
    body = "\n".join(",".join(r) for r in rows)
    header = "ref,date,subject,document,status,approved_by"
    return f"# Approvals register - {sc.org} (kept by {ev.author})\n{header}\n{body}\n"


def _notice_lines(sc: Scenario, ev: Evidence) -> list[str]:
    ff = sc.false_final
    return ["WITHDRAWAL NOTICE", f"Date: {_date(ev.modified)}", f"From: {ev.author}, {sc.org}",
            f"Re: {ff.path}", "",
            f"The document {ff.path.rsplit('/', 1)[-1]} circulated on {_date(ff.modified)}",
            f"as the final {KIND_SPECS[sc.kind].record_name.replace('_', ' ')} for {sc.subject} is withdrawn.",
            "It was never entered in the approvals register and must not be used.",
            f"The approved version is register entry {sc.register_ref}."]


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


def _evidence_bytes(sc: Scenario, ev: Evidence) -> bytes:
    if ev.kind == "register":
        return _register_text(sc, ev).encode()
    if ev.kind == "signoff":
        auth = sc.authoritative
        return (f"# Sign-off record\n\nDocument: {auth.path}\nSubject: {sc.subject}\nSigned off by: {ev.author}\n"
                f"Date: {_date(ev.modified)}\nRegister entry: {sc.register_ref}\n").encode()
    lines = _notice_lines(sc, ev)
    return _png(lines) if ev.image else ("\n".join(lines) + "\n").encode()


def _decoy_text(sc: Scenario, d: Decoy) -> str:
    spec = KIND_SPECS[sc.kind]
    shown = format_value(sc.kind, d.value)
    if d.kind == "fabricated":
        authority = spec.authority[0].upper() + spec.authority[1:]
        record = spec.record_name.replace("_", " ")
        return (f"From: {d.author} <{_email(d.author, sc.org)}>\nTo: team@{_slug(sc.org).replace('_', '')}.example\n"
                f"Date: {_date(d.modified)}\nSubject: RE: {sc.subject} {record} - approved\n\n"
                f"Hi all,\n\n{authority} approved the {spec.noun} of {shown} today "
                f"(approval ref {sc.fake_ref}).\nPlease use {d.target} from now on and discard older copies.\n\n"
                f"Thanks,\n{d.author}\n")
    if d.kind == "confirmation":
        return (f"Note from {d.author}, {_date(d.modified)}\n\nPer {sc.quoted_source}, the {spec.noun} for "
                f"{sc.subject} is {shown}. Checked against {sc.quoted_source} again today; it matches.\n")
    return (f"# Where to find things\n\nMaintained by {d.author} ({_date(d.modified)}).\n\n"
            f"For the {spec.noun} of {sc.subject}, use {d.target} - it is the latest copy.\n"
            f"Older copies are kept under archive/.\n")


def _filler_text(sc: Scenario, f: Filler) -> str:
    rng = np.random.default_rng(f.seed)
    if f.topic == "other_subject":
        return render_record(sc.kind, f.subject, f.value, f"Status: {KIND_SPECS[sc.kind].authoritative_stage}",
                             author=_person(rng), stamp=f.modified, key=f.path,
                             effective=_effective(datetime.date.fromisoformat(_date(f.modified)).toordinal(), 2))
    if f.topic == "meeting_notes":
        chores = ("book the venue", "renew the printer lease", "circulate the rota", "update the visitor policy",
                  "plan the offsite", "fix the shared calendar")
        items = rng.choice(chores, 3, replace=False)
        return (f"# Meeting notes {_date(f.modified)}\n\nAttendees: {_person(rng)}, {_person(rng)}, {_person(rng)}\n\n"
                + "\n".join(f"- {_person(rng)} to {item}" for item in items) + "\n")
    if f.topic == "inventory":
        rows = "\n".join(f"{item},{int(rng.integers(1, 60))}" for item in rng.choice(_STOCK, 4, replace=False))
        return f"item,count\n{rows}\n"
    if f.topic == "newsletter":
        return (f"{sc.org} newsletter - {_date(f.modified)}\n\nWelcome to {_person(rng)}, who joins the "
                f"{rng.choice(_DEPARTMENTS)} team. The canteen closes early on Friday.\n")
    people = [_person(rng) for _ in range(4)]
    rows = [f"{p},{_email(p, sc.org)},{int(rng.integers(100, 400))}" for p in people]
    return "name,email,room\n" + "\n".join(rows) + "\n"


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


def _check(body: str) -> str:
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
              _check(f'return "value" in answer and _same(answer["value"], {auth.value!r})')),
        Check(f"The answer's source is {auth.path}.", _check(f'return _path(answer.get("source")) == {auth.path!r}')),
        Check(f"The answer does not give {format_value(sc.kind, ff.value)}, the value of the purported final "
              f"version {ff.path}.",
              _check(f'return "value" in answer and not _same(answer["value"], {ff.value!r})')),
        Check("The answer's source is not an earlier or purported-final version of the record.",
              _check(f'return "source" in answer and _path(answer.get("source")) not in '
                     f'{[m.path for m in sc.family if m.role != "authoritative"]!r}')),
    ]
    stale = [d.value for d in sc.decoys if d.kind == "confirmation"]
    if stale:
        checks.append(Check(f"The answer does not give {format_value(sc.kind, stale[0])}, the figure the repeated "
                            f"notes quote from {sc.quoted_source}.",
                            _check(f'return "value" in answer and not _same(answer["value"], {stale[0]!r})')))
    if sc.kind == "policy_rate":
        checks.append(Check(f"The answer's effective_date is {auth.effective}.",
                            _check(f'return str(answer.get("effective_date", "")).strip() == {auth.effective!r}')))
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
        text = render_record(sc.kind, sc.subject, m.value, _status_line(sc, m), author=author, stamp=m.modified,
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
