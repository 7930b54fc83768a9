"""Collection Map: coverage-preserving semantic regrouping of a workspace (seeds/002, section 4.1,
"Semantic regrouping").

Pipeline (:func:`build_collection_map`):

1. :func:`initial_grouping`, deterministic, by directory and file count.
2. The Collection Summarizer writes a :class:`Card` per collection (themes, contents,
   representative evidence, source paths).
3. Rounds of the Semantic Coordinator's :class:`Proposal` s (split, merge, transfer, overlap).
   Each proposal is applied only when :func:`support_problem` finds its support in the cards or
   member paths and files; after it is applied, :func:`coverage_problems` must find every file
   of the workspace in at least one collection (and no collection naming a file that does not
   exist, no empty collection); otherwise the change is rejected and recorded with the reason.
4. After each applied change the Collection Refiner rewrites the cards of the affected
   collections, so cards stay consistent with membership. Rounds stop early when a round applies
   nothing.

Choices the paper leaves open, made here:

- Choice (initial grouping): one group per directory (the file's full directory path). A
  directory with fewer than ``min_files`` files is merged into its parent directory's group,
  deepest directories first (so a chain of tiny directories folds upwards); the root group never
  merges. A group with more than ``max_files`` files is cut into ``k = ceil(n / max_files)``
  consecutive chunks of its sorted paths, of sizes differing by at most one (earlier chunks
  larger). Collections are numbered ``c00, c01, ...`` in sorted directory order, chunks in
  order; later collections continue the numbering.
- Choice (themes): one TF-IDF model (scikit-learn ``TfidfVectorizer``, English stop words,
  words of two letters or more, sublinear tf) over every file of the workspace, a document being
  the file name without its extension plus its readable text (images and binary files:
  the name only). A collection's
  themes are the top terms of its members' mean vector (ties alphabetical); the same vectors
  drive the heuristic coordinator.
- Choice (evidence): members ranked by cosine to the collection's mean vector; from each of the
  top ``max_evidence`` text files, the line holding the most theme words (first on ties), cut to
  160 characters from its start, so the quote is verbatim.
- Choice (support rules, :func:`support_problem`): merge: every support term is a theme of both
  cards; split: every support term is a word of every file split off; transfer: every support
  term is a theme of the receiving card and a word of every moved file; overlap: every support
  item is the path or (unique) file name of a member of the receiving collection that the text of
  every added file names.
- Choice (application): a round's proposals are applied in the coordinator's order, each checked
  against the map as it stands then (a proposal about a collection changed earlier in the round
  may be rejected as no longer supported); a merge keeps the first id, a split's new part gets a
  new id, a transfer that empties a collection removes it.
- Choice (TGS): with ``mode="tgs"`` and labelled files, each version family with standard files
  gets a dedicated collection (origin ``task_guided``) holding its standard files and the files
  their labels cite as evidence; files stay in their other collections too (overlap). These
  groups are kept as built: a proposal naming one is rejected. Labels are used only for grouping
  and never written into cards.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from envsched_jax.rethink.roles import Excerpt, Roles, WorkspaceIndex, index_for
from envsched_jax.rethink.roles import TextIndex, text_index  # noqa: F401  (they lived here; kept importable)
from envsched_jax.rethink.workspace import Workspace, WorkspaceError

ORIGINS = ("directory", "split", "merge", "task_guided")


@dataclasses.dataclass(frozen=True)
class CollectionConfig:
    """Settings of the Collection Map (section 4.1).

    Attributes:
        max_files: a directory group above this many files is cut into chunks.
        min_files: a directory with fewer files joins its parent's group.
        rounds: Collection Refiner rounds (coordinator proposals, then refinement).
        merge_threshold: heuristic coordinator: cosine of mean vectors at or above which two
            collections are proposed for merging.
        transfer_margin: a file is proposed for transfer when its cosine to another
            collection's mean exceeds that to its own (without it) by this much.
        min_transfer_similarity: and that cosine is at least this.
        split_silhouette: a collection is proposed for splitting when a 2-means clustering of
            its members has at least this silhouette (cosine distance).
        max_themes / max_evidence: card sizes.
        max_text_chars: characters of a file read (a prefix) by the heuristic roles.
        seed: for the 2-means clustering.
    """

    max_files: int = 12
    min_files: int = 2
    rounds: int = 3
    merge_threshold: float = 0.5
    transfer_margin: float = 0.15
    min_transfer_similarity: float = 0.2
    split_silhouette: float = 0.35
    max_themes: int = 6
    max_evidence: int = 4
    max_text_chars: int = 100_000
    seed: int = 0

    def __post_init__(self):
        for name in ("max_files", "min_files", "max_themes", "max_text_chars"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise WorkspaceError(f"CollectionConfig.{name} must be a positive integer, got {getattr(self, name)!r}",
                                     field=name)
        if self.rounds < 0 or self.max_evidence < 0:
            raise WorkspaceError("CollectionConfig.rounds and max_evidence must be >= 0", field="rounds")
        if self.min_files > self.max_files:
            raise WorkspaceError(f"CollectionConfig.min_files {self.min_files} exceeds max_files {self.max_files}",
                                 field="min_files")

    def settings(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- records ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ContentEntry:
    path: str
    kind: str
    gist: str


@dataclasses.dataclass(frozen=True)
class Card:
    """A Collection Summarizer card: themes, contents (every member with kind and gist),
    representative evidence (verbatim quotes) and source paths."""

    collection_id: str
    themes: tuple[str, ...]
    contents: tuple[ContentEntry, ...]
    evidence: tuple[Excerpt, ...]
    source_paths: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"collection_id": self.collection_id, "themes": list(self.themes),
                "contents": [dataclasses.asdict(c) for c in self.contents],
                "evidence": [e.to_json() for e in self.evidence], "source_paths": list(self.source_paths)}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Card:
        return cls(record["collection_id"], tuple(record["themes"]),
                   tuple(ContentEntry(c["path"], c["kind"], c["gist"]) for c in record["contents"]),
                   tuple(Excerpt.from_json(e) for e in record["evidence"]), tuple(record["source_paths"]))


@dataclasses.dataclass(frozen=True)
class Collection:
    collection_id: str
    name: str
    members: tuple[str, ...]
    card: Card | None = None
    origin: str = "directory"

    def to_json(self) -> dict[str, Any]:
        return {"collection_id": self.collection_id, "name": self.name, "origin": self.origin,
                "members": list(self.members), "card": None if self.card is None else self.card.to_json()}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Collection:
        card = None if record.get("card") is None else Card.from_json(record["card"])
        return cls(record["collection_id"], record["name"], tuple(record["members"]), card,
                   record.get("origin", "directory"))


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A Semantic Coordinator proposal.

    ``merge``: collections (a, b). ``split``: collections (c,), ``paths`` go to a new collection.
    ``transfer``: ``paths`` move from collections[0] to collections[1]. ``overlap``: ``paths``
    (members of collections[0]) are also added to collections[1]. ``support``: theme terms or
    paths that justify it (checked by :func:`support_problem`).
    """

    kind: str
    collections: tuple[str, ...]
    paths: tuple[str, ...] = ()
    support: tuple[str, ...] = ()
    rationale: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "collections": list(self.collections), "paths": list(self.paths),
                "support": list(self.support), "rationale": self.rationale}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Proposal:
        return cls(record["kind"], tuple(record["collections"]), tuple(record.get("paths", ())),
                   tuple(record.get("support", ())), record.get("rationale", ""))


@dataclasses.dataclass(frozen=True)
class ChangeRecord:
    round: int
    proposal: Proposal
    status: Literal["applied", "rejected"]
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, **self.proposal.to_json(), "status": self.status, "reason": self.reason}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> ChangeRecord:
        return cls(record["round"], Proposal.from_json(record), record["status"], record.get("reason", ""))


@dataclasses.dataclass(frozen=True)
class CollectionMap:
    """Collections (each with its card), the history of applied and rejected proposals, and
    notes (role failures and fallbacks)."""

    workspace_id: str
    mode: str
    collections: tuple[Collection, ...]
    history: tuple[ChangeRecord, ...] = ()
    notes: tuple[str, ...] = ()

    def collection(self, collection_id: str) -> Collection:
        for c in self.collections:
            if c.collection_id == collection_id:
                return c
        raise KeyError(f"collection map of {self.workspace_id!r} has no collection {collection_id!r}")

    def collections_of(self, path: str) -> tuple[str, ...]:
        return tuple(c.collection_id for c in self.collections if path in c.members)

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "mode": self.mode,
                "collections": [c.to_json() for c in self.collections],
                "history": [h.to_json() for h in self.history], "notes": list(self.notes)}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> CollectionMap:
        return cls(record["workspace_id"], record["mode"],
                   tuple(Collection.from_json(c) for c in record["collections"]),
                   tuple(ChangeRecord.from_json(h) for h in record.get("history", ())),
                   tuple(record.get("notes", ())))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)


# ---- initial grouping ---------------------------------------------------------------------------

def _parent(directory: str) -> str:
    return directory.rsplit("/", 1)[0] if "/" in directory else ""


def initial_grouping(workspace: Workspace, *, max_files: int, min_files: int) -> tuple[Collection, ...]:
    """Deterministic grouping by directory and file count (the rule is in the module docstring)."""
    groups: dict[str, list[str]] = {}
    for f in workspace.files:
        groups.setdefault(f.directory, []).append(f.path)
    for directory in sorted(groups, key=lambda d: (-d.count("/") - (d != ""), d)):
        if directory and len(groups[directory]) < min_files:
            groups.setdefault(_parent(directory), []).extend(groups.pop(directory))
    collections = []
    for directory in sorted(groups):
        paths = sorted(groups[directory])
        label = directory or "(root)"
        k = math.ceil(len(paths) / max_files)
        sizes = [len(paths) // k + (1 if j < len(paths) % k else 0) for j in range(k)]
        start = 0
        for j, size in enumerate(sizes):
            name = label if k == 1 else f"{label} ({j + 1}/{k})"
            collections.append(Collection(f"c{len(collections):02d}", name, tuple(paths[start:start + size])))
            start += size
    return tuple(collections)


def coverage_problems(workspace: Workspace, collections: Sequence[Collection]) -> list[str]:
    """The deterministic coverage check: every workspace file in at least one collection; no
    collection naming a missing file, repeating a member or empty; unique ids."""
    paths = set(workspace.paths)
    problems = []
    ids = [c.collection_id for c in collections]
    problems += [f"collection id {i!r} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    covered: set[str] = set()
    for c in collections:
        if not c.members:
            problems.append(f"collection {c.collection_id!r} is empty")
        if len(set(c.members)) != len(c.members):
            problems.append(f"collection {c.collection_id!r} lists a member twice")
        for p in c.members:
            if p not in paths:
                problems.append(f"collection {c.collection_id!r} names {p!r}, which is not a file of the workspace")
        covered |= set(c.members)
    problems += [f"file {p!r} is in no collection" for p in sorted(paths - covered)]
    return problems


# ---- heuristic Collection Summarizer / Refiner --------------------------------------------------

# TextIndex and text_index (the TF-IDF model) live in .roles, next to the WorkspaceIndex that
# keeps one fit per preparation; they are imported above and stay importable from here.


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def _top_terms(index: TextIndex, vector: np.ndarray, k: int) -> list[str]:
    order = sorted((i for i in range(len(index.terms)) if vector[i] > 0), key=lambda i: (-vector[i], index.terms[i]))
    return [index.terms[i] for i in order[:k]]


def _gist(index: WorkspaceIndex, path: str, max_chars: int) -> str:
    f = index.file(path)
    text = index.readable(path, max_chars)
    if text is None:
        return f"({f.kind}, {len(f.data)} bytes; not readable by the text tools)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:80] if first else "(empty file)"


def summarize_collection(workspace: Workspace, task: Mapping[str, Any],
                         index: WorkspaceIndex | None = None) -> dict[str, Any]:
    """Heuristic Collection Summarizer (and Refiner): a card from the members alone.
    ``index``: the preparation's :class:`~.roles.WorkspaceIndex` (its TF-IDF fit is reused
    across cards instead of refitting per card)."""
    settings = CollectionConfig(**task.get("settings", {}))
    cap = settings.max_text_chars
    members = sorted(task["members"])
    lookup = index_for(workspace, index)
    tfidf = lookup.text_index(cap)
    centroid = tfidf.centroid(members)
    themes = _top_terms(tfidf, centroid, settings.max_themes)
    theme_set = set(themes)
    text_members = [p for p in members if lookup.readable(p, cap)]
    ranked = sorted(text_members, key=lambda p: (-_cosine(tfidf.rows([p])[0], centroid), p))
    evidence = []
    for p in ranked[:settings.max_evidence]:
        lines = [line.strip() for line in lookup.readable(p, cap).splitlines()]
        lines = [line for line in lines if line]
        if lines:
            best = max(range(len(lines)), key=lambda k: (len(set(words_of_line(lines[k])) & theme_set), -k))
            evidence.append({"path": p, "quote": lines[best][:160]})
    return {"collection_id": task["collection_id"], "themes": themes,
            "contents": [{"path": p, "kind": lookup.file(p).kind, "gist": _gist(lookup, p, cap)} for p in members],
            "evidence": evidence, "source_paths": members}


def words_of_line(line: str) -> list[str]:
    return re.findall(r"[a-z][a-z]+", re.sub(r"[_\-./]", " ", line.lower()))


# ---- heuristic Semantic Coordinator -------------------------------------------------------------

def coordinate(workspace: Workspace, task: Mapping[str, Any], index: WorkspaceIndex | None = None) -> dict[str, Any]:
    """Heuristic Semantic Coordinator: merge (similar mean vectors, shared themes, combined size
    within ``max_files``, neither collection inside the other), split (2-means with a clear silhouette, support words common to the
    part split off and absent from the rest), transfer (a single-membership file much closer to
    another collection's mean), overlap (a file whose text names a file of another collection
    joins that collection).

    ``index``: the preparation's :class:`~.roles.WorkspaceIndex`. The overlap scan looks at
    every ordered pair of files; with the index it tests the few tokens that can name a file
    against the whole text first and reads lines only when one occurs."""
    settings = CollectionConfig(**task.get("settings", {}))
    cap = settings.max_text_chars
    collections = [(c["collection_id"], list(c["members"]), c.get("card") or {}) for c in task["collections"]
                   if c.get("origin") != "task_guided"]
    lookup = index_for(workspace, index)
    tfidf = lookup.text_index(cap)
    centroids = {cid: tfidf.centroid(members) for cid, members, _ in collections}
    themes = {cid: list(card.get("themes", ())) for cid, _, card in collections}
    proposals: list[dict[str, Any]] = []

    for i, (a, ma, _) in enumerate(collections):
        for b, mb, _ in collections[i + 1:]:
            shared = [t for t in themes[a] if t in themes[b]]
            nested = set(ma) <= set(mb) or set(mb) <= set(ma)
            if (shared and not nested and len(set(ma) | set(mb)) <= settings.max_files
                    and _cosine(centroids[a], centroids[b]) >= settings.merge_threshold):
                proposals.append({"kind": "merge", "collections": [a, b], "paths": [], "support": shared,
                                  "rationale": f"cards share themes {shared}"})

    words = {f.path: lookup.words(f.path, cap) for f in workspace.files}
    for cid, members, _ in collections:
        # A collection unchanged since the last round has the same split: computed once per index.
        key = ("split_part", tuple(members), cap, settings.seed, settings.split_silhouette)
        part = list(lookup.derived(key, lambda: tuple(_split_part(tfidf, members, settings))))
        if part:
            rest = [p for p in members if p not in part]
            common = set.intersection(*(set(words[p]) for p in part)) - set().union(*(words[p] for p in rest))
            weight = tfidf.centroid(part)
            term_pos = {t: k for k, t in enumerate(tfidf.terms)}
            support = sorted(common, key=lambda t: (-(weight[term_pos[t]] if t in term_pos else 0.0), t))[:3]
            if support:
                proposals.append({"kind": "split", "collections": [cid], "paths": part, "support": support,
                                  "rationale": "two clearly separated clusters of files"})

    membership: dict[str, list[str]] = {}
    for cid, members, _ in collections:
        for p in members:
            membership.setdefault(p, []).append(cid)
    for cid, members, _ in collections:
        if len(members) < 2:
            continue
        for p in members:
            if len(membership[p]) != 1:
                continue
            x = tfidf.rows([p])[0]
            own = _cosine(x, tfidf.centroid([q for q in members if q != p]))
            best = None
            for other, other_members, _ in collections:
                if other == cid or len(other_members) >= settings.max_files:
                    continue
                sim = _cosine(x, centroids[other])
                if sim >= settings.min_transfer_similarity and sim - own >= settings.transfer_margin:
                    if best is None or sim > best[0]:
                        best = (sim, other)
            if best is not None:
                support = [t for t in themes[best[1]] if t in words[p]]
                if support:
                    proposals.append({"kind": "transfer", "collections": [cid, best[1]], "paths": [p],
                                      "support": support[:3],
                                      "rationale": f"closer to {best[1]} ({best[0]:.2f}) than to its own collection ({own:.2f})"})

    seen = set()
    for f in workspace.files:
        text = lookup.readable(f.path, cap)
        if not text or f.path not in membership:
            continue
        lines = text.splitlines()
        for g in workspace.files:
            if g.path == f.path or g.path not in membership:
                continue
            line = lookup.first_naming_line(lines, g.path, within=text)
            if line is None:
                continue
            token = g.path if g.path in line else g.name
            for target in membership[g.path]:
                if f.path in next(m for c, m, _ in collections if c == target) or (f.path, target) in seen:
                    continue
                seen.add((f.path, target))
                proposals.append({"kind": "overlap", "collections": [membership[f.path][0], target],
                                  "paths": [f.path], "support": [token],
                                  "rationale": f"{f.path} names {g.path}"})
    return {"proposals": proposals}


def _split_part(index: TextIndex, members: Sequence[str], settings: CollectionConfig) -> list[str]:
    """The smaller cluster of a clear 2-means split of the members (``[]`` when none).

    KMeans runs with OpenMP held to one thread. Why: for fewer than 256 rows (scikit-learn's
    chunk size; a collection is far smaller) its Lloyd iterations use one thread anyway and only
    the final inertia sum is spread over the cores, and on a loaded machine each such tiny
    parallel region waited milliseconds for a busy core (n_init=10 runs per call, every
    coordinator round). One thread gives the same labels except when two different clusterings'
    inertias differ by less than rounding, and makes the split independent of the core count."""
    if len(members) < 4 or index.matrix.shape[1] == 0:
        return []
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score
    from threadpoolctl import threadpool_limits

    x = index.rows(members)
    if np.linalg.matrix_rank(x) < 2:
        return []
    with threadpool_limits(limits=1, user_api="openmp"):
        labels = KMeans(n_clusters=2, n_init=10, random_state=settings.seed).fit_predict(x)
    if min(np.bincount(labels, minlength=2)) < 2:
        return []
    if silhouette_score(x, labels, metric="cosine") < settings.split_silhouette:
        return []
    first = labels[0]
    return [p for p, lab in zip(members, labels) if lab != first]


def heuristic_role_functions() -> dict[str, Callable[[Workspace, Mapping[str, Any], WorkspaceIndex | None], Any]]:
    """Role name -> ``fn(workspace, task, index)`` (``index`` may be ``None``)."""
    return {"collection_summarizer": summarize_collection, "collection_refiner": summarize_collection,
            "semantic_coordinator": coordinate}


# ---- support check, appliers, pipeline ----------------------------------------------------------

def support_problem(workspace: Workspace, collections: Sequence[Collection], proposal: Proposal,
                    *, max_text_chars: int = 100_000, index: WorkspaceIndex | None = None) -> str | None:
    """``None`` when the proposal is well formed and its support is found in the current cards or
    member paths and files (rules in the module docstring); else the reason to reject it.
    ``index``: an optional :class:`~.roles.WorkspaceIndex` of ``workspace`` (same answer)."""
    lookup = index_for(workspace, index)
    by_id = {c.collection_id: c for c in collections}
    arity = {"merge": 2, "split": 1, "transfer": 2, "overlap": 2}
    if proposal.kind not in arity:
        return f"unknown proposal kind {proposal.kind!r}"
    if len(proposal.collections) != arity[proposal.kind] or len(set(proposal.collections)) != len(proposal.collections):
        return f"a {proposal.kind} names {arity[proposal.kind]} distinct collection(s), got {list(proposal.collections)}"
    missing = [c for c in proposal.collections if c not in by_id]
    if missing:
        return f"collection(s) {missing} do not exist (now); the proposal is stale or wrong"
    fixed = [c for c in proposal.collections if by_id[c].origin == "task_guided"]
    if fixed:
        return f"collection(s) {fixed} are task-guided groups, kept as built"
    if not proposal.support:
        return "no support given"
    unknown = [p for p in proposal.paths if p not in lookup.paths]
    if unknown:
        return f"paths {unknown} are not files of the workspace"
    first = by_id[proposal.collections[0]]
    second = by_id[proposal.collections[1]] if len(proposal.collections) > 1 else None
    paths = set(proposal.paths)
    themes = lambda c: set(c.card.themes) if c.card else set()  # noqa: E731
    words = {p: lookup.words(p, max_text_chars) for p in proposal.paths}

    if proposal.kind == "merge":
        if paths:
            return "a merge moves no paths"
        bad = [s for s in proposal.support if s not in themes(first) or s not in themes(second)]
        return f"support {bad} is not a theme of both cards" if bad else None
    if not paths:
        return f"a {proposal.kind} needs paths"
    if not paths <= set(first.members):
        return f"paths {sorted(paths - set(first.members))} are not members of {first.collection_id}"
    if proposal.kind == "split":
        if paths == set(first.members):
            return "a split must leave members in both parts"
        bad = [s for s in proposal.support if any(s not in words[p] for p in paths)]
        return f"support {bad} is not a word of every file split off" if bad else None
    if paths & set(second.members):
        return f"paths {sorted(paths & set(second.members))} are already members of {second.collection_id}"
    if proposal.kind == "transfer":
        bad = [s for s in proposal.support if s not in themes(second) or any(s not in words[p] for p in paths)]
        return (f"support {bad} is not both a theme of {second.collection_id} and a word of the moved files"
                if bad else None)
    targets = {m: m for m in second.members} | {n: p for n, p in lookup.unique.items() if p in second.members}
    bad = []
    for s in proposal.support:
        member = targets.get(s)
        ok = member is not None and all(
            any(lookup.names_file(line, member) for line in (lookup.readable(p, max_text_chars) or "").splitlines())
            for p in paths)
        if not ok:
            bad.append(s)
    return (f"support {bad} is not a member of {second.collection_id} named in the text of the added files"
            if bad else None)


def _next_id(collections: Sequence[Collection]) -> str:
    numbers = [int(c.collection_id[1:]) for c in collections if c.collection_id[1:].isdigit()]
    return f"c{max(numbers, default=-1) + 1:02d}"


def _apply_merge(collections, proposal, new_id):
    a, b = proposal.collections
    ca, cb = (next(c for c in collections if c.collection_id == x) for x in (a, b))
    merged = Collection(a, f"{ca.name} + {cb.name}", tuple(sorted(set(ca.members) | set(cb.members))), None, "merge")
    return tuple(merged if c.collection_id == a else c for c in collections if c.collection_id != b), (a,)


def _apply_split(collections, proposal, new_id):
    (cid,) = proposal.collections
    out = []
    for c in collections:
        if c.collection_id == cid:
            out.append(dataclasses.replace(c, members=tuple(p for p in c.members if p not in proposal.paths), card=None))
            out.append(Collection(new_id, f"{c.name} / {proposal.support[0]}", tuple(sorted(proposal.paths)), None, "split"))
        else:
            out.append(c)
    return tuple(out), (cid, new_id)


def _apply_transfer(collections, proposal, new_id):
    a, b = proposal.collections
    out = []
    for c in collections:
        if c.collection_id == a:
            rest = tuple(p for p in c.members if p not in proposal.paths)
            if rest:
                out.append(dataclasses.replace(c, members=rest, card=None))
        elif c.collection_id == b:
            out.append(dataclasses.replace(c, members=tuple(sorted(set(c.members) | set(proposal.paths))), card=None))
        else:
            out.append(c)
    return tuple(out), tuple(x for x in (a, b) if any(c.collection_id == x for c in out))


def _apply_overlap(collections, proposal, new_id):
    _, b = proposal.collections
    return tuple(dataclasses.replace(c, members=tuple(sorted(set(c.members) | set(proposal.paths))), card=None)
                 if c.collection_id == b else c for c in collections), (b,)


APPLIERS: dict[str, Callable[[tuple[Collection, ...], Proposal, str], tuple[tuple[Collection, ...], tuple[str, ...]]]] = {
    "merge": _apply_merge, "split": _apply_split, "transfer": _apply_transfer, "overlap": _apply_overlap}
"""Proposal kind -> ``apply(collections, proposal, new_id) -> (new collections, affected ids)``
(``new_id``: the id a new collection takes; ids are never reused within a map); the affected
collections lose their cards until the Refiner rewrites them."""


def _card_task(c: Collection, config: CollectionConfig) -> dict[str, Any]:
    return {"collection_id": c.collection_id, "members": list(c.members),
            "previous_card": None if c.card is None else c.card.to_json(), "settings": config.settings()}


def _write_cards(workspace, collections, ids, role, config, notes, index=None):
    out = []
    for c in collections:
        if c.collection_id not in ids:
            out.append(c)
            continue
        task = _card_task(c, config)
        outcome = role(workspace, task, index)
        if outcome.ok:
            card = Card.from_json(outcome.value)
        else:
            notes.append(f"{role.name} failed for {c.collection_id} ({outcome.reason}); heuristic card used")
            card = Card.from_json(summarize_collection(workspace, task, index))
        out.append(dataclasses.replace(c, card=card))
    return tuple(out)


def _task_guided_collections(workspace: Workspace, collections: tuple[Collection, ...]) -> tuple[Collection, ...]:
    labels = workspace.labels()
    families = sorted({lab.family for lab in labels.values() if lab.family and lab.partition == "standard"})
    out = list(collections)
    for family in families:
        standard = [p for p, lab in labels.items() if lab.family == family and lab.partition == "standard"]
        members = set(standard) | {e for p in standard for e in labels[p].evidence}
        if any(set(c.members) == members for c in out):
            continue
        out.append(Collection(_next_id(out), f"task-guided group {len(out)}", tuple(sorted(members)), None, "task_guided"))
    return tuple(out)


def build_collection_map(workspace: Workspace, roles: Roles, *, mode: Literal["egs", "tgs"] = "egs",
                         config: CollectionConfig = CollectionConfig(),
                         index: WorkspaceIndex | None = None) -> CollectionMap:
    """Section 4.1's semantic regrouping (see the module docstring for every step).

    ``index``: the :class:`~.roles.WorkspaceIndex` of ``workspace`` to share with the roles
    (built here when ``None``); it only saves recomputation, the map is the same."""
    if mode not in ("egs", "tgs"):
        raise WorkspaceError(f"mode must be 'egs' or 'tgs', got {mode!r}", source=f"workspace {workspace.workspace_id!r}",
                             field="mode")
    index = index_for(workspace, index)
    notes: list[str] = []
    collections = initial_grouping(workspace, max_files=config.max_files, min_files=config.min_files)
    if mode == "tgs":
        collections = _task_guided_collections(workspace, collections)
    problems = coverage_problems(workspace, collections)
    if problems:
        raise WorkspaceError(f"initial grouping breaks coverage: {problems}", source=f"workspace {workspace.workspace_id!r}")
    collections = _write_cards(workspace, collections, {c.collection_id for c in collections}, roles.summarizer, config,
                               notes, index)
    history: list[ChangeRecord] = []
    issued = int(_next_id(collections)[1:])
    for round_ in range(1, config.rounds + 1):
        task = {"collections": [{"collection_id": c.collection_id, "origin": c.origin, "members": list(c.members),
                                 "card": c.card.to_json()} for c in collections], "settings": config.settings()}
        outcome = roles.coordinator(workspace, task, index)
        if not outcome.ok:
            notes.append(f"round {round_}: {roles.coordinator.name} failed ({outcome.reason}); no proposals")
            break
        applied = 0
        for record in outcome.value["proposals"]:
            proposal = Proposal.from_json(record)
            why = support_problem(workspace, collections, proposal, max_text_chars=config.max_text_chars, index=index)
            if why is not None:
                history.append(ChangeRecord(round_, proposal, "rejected", f"unsupported: {why}"))
                continue
            candidate, affected = APPLIERS[proposal.kind](collections, proposal, f"c{issued:02d}")
            problems = coverage_problems(workspace, candidate)
            if problems:
                history.append(ChangeRecord(round_, proposal, "rejected", f"coverage check failed: {problems}"))
                continue
            collections = _write_cards(workspace, candidate, set(affected), roles.refiner, config, notes, index)
            history.append(ChangeRecord(round_, proposal, "applied"))
            issued += proposal.kind == "split"
            applied += 1
        if not applied:
            break
    return CollectionMap(workspace.workspace_id, mode, collections, tuple(history), tuple(notes))
