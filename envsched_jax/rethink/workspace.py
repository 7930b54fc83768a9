"""File environments E = (F, S) of Env-Rethink (seeds/002, section 2.1 and appendix A).

A :class:`Workspace` is one task environment: the files F (path, bytes, kind, modification time),
the task request, a rubric of executable checks (the project's :class:`~envsched_jax.pool.model.Check`:
``check_func(final_state) -> bool``, where ``final_state["answer"]`` is the agent's submitted
outcome), the reference outcome that passes them, and, where known, a :class:`FileLabel` per file
(appendix A.1: partition, category, observed stage, family, timeline position, evidence).

Choices the paper leaves open, made here:

- **Partition and category agree.** A file is *standard* exactly when its category is
  ``authoritative_record``; the other five categories are noise (appendix B.4 scores
  noise-category accuracy over the noise files only, and counts superseded versions and
  out-of-scope files among the noise).
- **Kinds.** ``text`` is valid UTF-8 without NUL bytes; ``image`` is a file whose bytes start with
  a PNG, JPEG or GIF signature (the "image-only withdrawal" of section 1 is one: the text tools
  cannot read it); anything else is ``binary``. Reading tools show only ``text`` files.
- **Times** are ISO-8601 UTC strings (``2026-03-01T09:30:00Z``), compared as strings, which
  orders them because the format is fixed.

Loading a directory from disk (:func:`scan_directory`) never follows a symlink out of the
workspace, never reads a file above ``max_file_bytes`` into memory, and reports every file it
leaves out with a named reason (:class:`Skipped`). Nothing here writes outside the folder it is
given; :func:`tree_digest` hashes a source tree so callers can check that preparation left it
unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.pool.model import Check

CATEGORIES = ("authoritative_record", "false_final_version", "fabricated_authority",
              "misleading_redirection", "superseded_version", "out_of_scope")
"""Appendix A.1, table 3 (spelled as identifiers)."""
NOISE_CATEGORIES = CATEGORIES[1:]
STRONG_DECOYS = ("false_final_version", "fabricated_authority", "misleading_redirection")
"""Appendix A.7: the categories a qualified trajectory must classify without error."""
PARTITIONS = ("standard", "noise")
KINDS = ("text", "image", "binary")
SIZE_CLASSES = {"small": (4, 12), "medium": (8, 30), "large": (1, 80)}
"""Appendix A.5: file counts of small, medium and large sub-environments (large: at most 80)."""
SIZE_MIX = {"small": 0.45, "medium": 0.35, "large": 0.20}
"""Appendix A.5: the specified mixture of sizes."""

Partition = Literal["standard", "noise"]
FileKind = Literal["text", "image", "binary"]

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")
MANIFEST = "workspace.json"
FILES_DIR = "files"


class WorkspaceError(ValueError):
    """A workspace, one of its files or a field is invalid. The message names the workspace (or
    folder), the file path and the field, whichever apply."""

    def __init__(self, message: str, *, source: str | None = None, path: str | None = None,
                 field: str | None = None):
        self.reason, self.source, self.path, self.field = message, source, path, field
        where = [w for w in (source, None if path is None else f"file {path!r}",
                             None if field is None else f"field {field!r}") if w]
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


def file_kind(data: bytes) -> FileKind:
    """``image`` by signature, ``text`` for NUL-free UTF-8 (empty included), else ``binary``."""
    if data.startswith(_IMAGE_MAGIC):
        return "image"
    if b"\x00" in data:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "text"


def check_relative_path(path: str) -> str:
    """A workspace path: relative, ``/``-separated, no empty, ``.`` or ``..`` component, no
    backslash or NUL. Returns it unchanged or raises :class:`WorkspaceError`."""
    if not isinstance(path, str) or not path:
        raise WorkspaceError(f"a file path must be a non-empty string, got {path!r}", field="path")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise WorkspaceError("a file path must be relative and use '/' (no backslash or NUL)", path=path)
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise WorkspaceError("a file path may not have empty, '.' or '..' components", path=path)
    return path


@dataclasses.dataclass(frozen=True)
class FileLabel:
    """Appendix A.1: what a file is, relative to the other records of its collection.

    Attributes:
        partition: ``standard`` (kept for the task) or ``noise``; fixed by ``category``.
        category: one of :data:`CATEGORIES`.
        stage: the observed stage ("draft", "approved", "withdrawn", ...; ``""`` when the file
            shows none: appendix B.4 scores stage only over files with a nonempty label).
        family: the version family the file belongs to (``""`` if none).
        order: position in its family's true timeline (0 = earliest; ``None`` outside a family).
        evidence: paths of the files that support this label.
    """

    partition: Partition
    category: str
    stage: str = ""
    family: str = ""
    order: int | None = None
    evidence: tuple[str, ...] = ()

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise WorkspaceError(f"category must be one of {CATEGORIES}, got {self.category!r}",
                                 field="category")
        expected = "standard" if self.category == "authoritative_record" else "noise"
        if self.partition != expected:
            raise WorkspaceError(f"partition {self.partition!r} disagrees with category {self.category!r} "
                                 f"(which is {expected})", field="partition")
        if not isinstance(self.stage, str) or not isinstance(self.family, str):
            raise WorkspaceError("stage and family must be strings", field="stage")
        if self.order is not None and (not isinstance(self.order, int) or self.order < 0):
            raise WorkspaceError(f"order must be a non-negative integer or None, got {self.order!r}",
                                 field="order")
        if self.order is not None and not self.family:
            raise WorkspaceError("order is set but family is empty", field="order")
        object.__setattr__(self, "evidence", tuple(check_relative_path(p) for p in self.evidence))

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "category": self.category, "stage": self.stage,
                "family": self.family, "order": self.order, "evidence": list(self.evidence)}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> FileLabel:
        return cls(record["partition"], record["category"], record.get("stage", ""),
                   record.get("family", ""), record.get("order"), tuple(record.get("evidence", ())))


@dataclasses.dataclass(frozen=True)
class WorkspaceFile:
    """One file of F. ``kind`` is derived from the bytes (:func:`file_kind`) when left ``None``."""

    path: str
    data: bytes
    modified: str
    kind: FileKind | None = None
    label: FileLabel | None = None

    def __post_init__(self):
        check_relative_path(self.path)
        if not isinstance(self.data, bytes):
            raise WorkspaceError("file data must be bytes", path=self.path, field="data")
        if not isinstance(self.modified, str) or not _TIME.match(self.modified):
            raise WorkspaceError(f"modified must be an ISO-8601 UTC time like 2026-03-01T09:30:00Z, "
                                 f"got {self.modified!r}", path=self.path, field="modified")
        kind = file_kind(self.data) if self.kind is None else self.kind
        if kind not in KINDS:
            raise WorkspaceError(f"kind must be one of {KINDS}, got {kind!r}", path=self.path, field="kind")
        if kind == "text" and file_kind(self.data) != "text":
            raise WorkspaceError("kind 'text' but the bytes are not NUL-free UTF-8", path=self.path, field="kind")
        object.__setattr__(self, "kind", kind)

    @property
    def text(self) -> str | None:
        """The contents as text, or ``None`` for images and binary files (the reading tools'
        view)."""
        return self.data.decode("utf-8") if self.kind == "text" else None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def directory(self) -> str:
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""


@dataclasses.dataclass(frozen=True)
class Workspace:
    """One task environment (section 2.1): files, the request q, the rubric V and the reference
    outcome y (a JSON object that passes every rubric check as ``final_state["answer"]``).

    ``parent_task`` groups workspaces derived from the same task (train / held-out splits are by
    parent, appendix A.3); ``size_class`` is ``small``, ``medium`` or ``large`` (appendix A.5).
    """

    workspace_id: str
    request: str
    files: tuple[WorkspaceFile, ...]
    rubric: tuple[Check, ...]
    reference: Mapping[str, Any]
    parent_task: str = ""
    size_class: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.workspace_id, str) or not self.workspace_id:
            raise WorkspaceError(f"workspace_id must be a non-empty string, got {self.workspace_id!r}",
                                 field="workspace_id")
        source = f"workspace {self.workspace_id!r}"
        if not isinstance(self.request, str) or not self.request.strip():
            raise WorkspaceError("the request must be a non-empty string", source=source, field="request")
        files = tuple(self.files)
        if not all(isinstance(f, WorkspaceFile) for f in files):
            raise WorkspaceError("files must be WorkspaceFile records", source=source, field="files")
        seen: set[str] = set()
        for f in files:
            if f.path in seen:
                raise WorkspaceError("duplicate path", source=source, path=f.path)
            seen.add(f.path)
            for e in (f.label.evidence if f.label else ()):
                if e not in {g.path for g in files}:
                    raise WorkspaceError(f"label evidence names {e!r}, which is not a file of the workspace",
                                         source=source, path=f.path, field="evidence")
        object.__setattr__(self, "files", files)
        rubric = tuple(self.rubric)
        if not rubric or not all(isinstance(c, Check) for c in rubric):
            raise WorkspaceError("the rubric must be a non-empty list of Check records", source=source,
                                 field="rubric")
        object.__setattr__(self, "rubric", rubric)
        if not isinstance(self.reference, Mapping):
            raise WorkspaceError("the reference outcome must be a JSON object", source=source, field="reference")
        try:
            reference = json.loads(json.dumps(dict(self.reference)))
            metadata = json.loads(json.dumps(dict(self.metadata)))
        except (TypeError, ValueError) as err:
            raise WorkspaceError(f"reference and metadata must be JSON: {err}", source=source) from None
        object.__setattr__(self, "reference", reference)
        object.__setattr__(self, "metadata", metadata)
        if self.size_class and self.size_class not in SIZE_CLASSES:
            raise WorkspaceError(f"size_class must be one of {tuple(SIZE_CLASSES)}, got {self.size_class!r}",
                                 source=source, field="size_class")

    # ---- views ------------------------------------------------------------------------------

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def file(self, path: str) -> WorkspaceFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(f"workspace {self.workspace_id!r} has no file {path!r}")

    @property
    def labelled(self) -> bool:
        return all(f.label is not None for f in self.files)

    def labels(self) -> dict[str, FileLabel]:
        """Path -> label of every labelled file."""
        return {f.path: f.label for f in self.files if f.label is not None}

    def standard_paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files if f.label is not None and f.label.partition == "standard")

    def public(self) -> Workspace:
        """The workspace as an agent may see it: labels, the reference outcome and the metadata
        removed (a generated workspace's metadata holds its scenario, answer included). The
        request, files and rubric stay (the rubric is the episode's verifier; agents are given
        the request and the files only)."""
        return dataclasses.replace(self, files=tuple(dataclasses.replace(f, label=None) for f in self.files),
                                   reference={}, metadata={})

    def clean(self) -> Workspace:
        """Section 2.2's Clean condition: only the ground-truth standard files (needs labels)."""
        if not self.labelled:
            raise WorkspaceError("the Clean condition needs every file labelled",
                                 source=f"workspace {self.workspace_id!r}")
        keep = set(self.standard_paths())
        return dataclasses.replace(self, files=tuple(f for f in self.files if f.path in keep))

    def content_hash(self) -> str:
        """SHA-256 over the request, the files (path, kind, time, bytes) and the rubric: what an
        agent's task is made of (labels and metadata excluded)."""
        h = hashlib.sha256()
        h.update(self.request.encode())
        for f in sorted(self.files, key=lambda f: f.path):
            for part in (f.path.encode(), f.kind.encode(), f.modified.encode(), hashlib.sha256(f.data).digest()):
                h.update(len(part).to_bytes(8, "little") + part)
        for c in self.rubric:
            h.update(json.dumps([c.text, c.code]).encode())
        return h.hexdigest()

    # ---- serialisation ----------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        """The JSON manifest :func:`save_workspace` writes beside the files."""
        return {
            "workspace_id": self.workspace_id, "request": self.request, "parent_task": self.parent_task,
            "size_class": self.size_class, "reference": self.reference, "metadata": self.metadata,
            "rubric": [{"text": c.text, "code": c.code} for c in self.rubric],
            "files": [{"path": f.path, "modified": f.modified, "kind": f.kind,
                       "sha256": hashlib.sha256(f.data).hexdigest(),
                       "label": None if f.label is None else f.label.to_json()} for f in self.files],
        }


def save_workspace(workspace: Workspace, folder: str | Path) -> Path:
    """Write ``folder/files/<path>`` and ``folder/workspace.json``. The folder must not exist or
    be empty; everything is written under it (paths are checked relative ones)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise WorkspaceError("the output folder exists and is not empty; refusing to overwrite it",
                             source=str(folder))
    root = folder / FILES_DIR
    root.mkdir(parents=True, exist_ok=True)
    for f in workspace.files:
        target = root / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
    (folder / MANIFEST).write_text(json.dumps(workspace.manifest(), indent=1, sort_keys=True))
    return folder


def load_workspace(folder: str | Path) -> Workspace:
    """Read a folder written by :func:`save_workspace`; every file's bytes must match the
    manifest's hash. Errors name the folder, the file and the field."""
    folder = Path(folder)
    source = str(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise WorkspaceError(f"no {MANIFEST} in the folder", source=source) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WorkspaceError(f"{MANIFEST} is not valid JSON: {err}", source=source) from None
    if not isinstance(manifest, dict):
        raise WorkspaceError(f"{MANIFEST} must hold a JSON object", source=source)
    try:
        files = []
        records = manifest["files"]
        if not isinstance(records, list):
            raise WorkspaceError(f"'files' must be a list, got {type(records).__name__}", source=source, field="files")
        for k, record in enumerate(records):
            if not isinstance(record, dict):
                raise WorkspaceError(f"files[{k}] must be an object, got {type(record).__name__}", source=source,
                                     field=f"files[{k}]")
            path = check_relative_path(record.get("path"))
            try:
                data = _read_inside(folder / FILES_DIR, path, source)
                if hashlib.sha256(data).hexdigest() != record["sha256"]:
                    raise WorkspaceError("the bytes on disk do not match the manifest's sha256", source=source,
                                         path=path, field="sha256")
                label = None if record.get("label") is None else FileLabel.from_json(record["label"])
                files.append(WorkspaceFile(path, data, record["modified"], record.get("kind"), label))
            except KeyError as err:
                raise WorkspaceError(f"lacks the field {err.args[0]!r}", source=source, path=path) from None
            except (TypeError, AttributeError) as err:
                raise WorkspaceError(f"malformed record: {err}", source=source, path=path) from None
            except WorkspaceError as err:
                if err.path is None:
                    raise WorkspaceError(err.reason, source=source, path=path, field=err.field) from None
                raise
        rubric = tuple(Check(c["text"], c["code"]) for c in manifest["rubric"])
        return Workspace(manifest["workspace_id"], manifest["request"], tuple(files), rubric,
                         manifest["reference"], manifest.get("parent_task", ""), manifest.get("size_class", ""),
                         manifest.get("metadata", {}))
    except KeyError as err:
        raise WorkspaceError(f"{MANIFEST} lacks the field {err.args[0]!r}", source=source) from None
    except (TypeError, AttributeError) as err:
        raise WorkspaceError(f"{MANIFEST} is malformed: {err}", source=source) from None
    except WorkspaceError as err:
        if err.source is None:
            raise WorkspaceError(err.reason, source=source, path=err.path, field=err.field) from None
        raise


def _read_inside(root: Path, path: str, source: str) -> bytes:
    """Read ``root/path`` refusing symlinks anywhere on the way (so nothing outside ``root`` is
    read)."""
    current = root
    for part in path.split("/"):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise WorkspaceError("missing on disk", source=source, path=path) from None
        if stat.S_ISLNK(mode):
            raise WorkspaceError("is (or lies under) a symlink; workspaces are read without following links",
                                 source=source, path=path)
    if not stat.S_ISREG(os.lstat(current).st_mode):
        raise WorkspaceError("is not a regular file", source=source, path=path)
    return current.read_bytes()


# ---- raw directories ------------------------------------------------------------------------

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A file :func:`scan_directory` left out, and why (``symlink``, ``symlink_outside``,
    ``too_large``, ``not_regular``, ``unreadable``, ``bad_path``)."""

    path: str
    reason: str
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class ScanResult:
    files: tuple[WorkspaceFile, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[Skipped, ...]
    """Files kept but worth a word (``empty``, ``not_utf8``: read as binary)."""


def _utc(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def scan_directory(root: str | Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> ScanResult:
    """Files of a raw directory tree, read-only. Symlinks are never followed (one pointing
    outside the tree is reported as ``symlink_outside``, one inside as ``symlink``: its target
    is scanned where it lies); a file above ``max_file_bytes`` is reported ``too_large`` without
    being read; sockets, devices and FIFOs are ``not_regular``. Paths come out sorted."""
    root = Path(root)
    if not root.is_dir():
        raise WorkspaceError("not a directory", source=str(root))
    real_root = root.resolve()
    files, skipped, notes = [], [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (base / d).is_symlink()]:
            full = base / name
            rel = full.relative_to(root).as_posix()
            try:
                check_relative_path(rel)
            except WorkspaceError as err:
                skipped.append(Skipped(rel, "bad_path", err.reason))
                continue
            try:
                st = os.lstat(full)
            except OSError as err:
                skipped.append(Skipped(rel, "unreadable", str(err)))
                continue
            if stat.S_ISLNK(st.st_mode):
                target = Path(os.path.realpath(full))
                inside = target == real_root or real_root in target.parents
                skipped.append(Skipped(rel, "symlink" if inside else "symlink_outside", os.readlink(full)))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append(Skipped(rel, "not_regular"))
                continue
            if st.st_size > max_file_bytes:
                skipped.append(Skipped(rel, "too_large", f"{st.st_size} bytes > max_file_bytes {max_file_bytes}"))
                continue
            try:
                data = full.read_bytes()
            except OSError as err:
                skipped.append(Skipped(rel, "unreadable", str(err)))
                continue
            kind = file_kind(data)
            if not data:
                notes.append(Skipped(rel, "empty"))
            elif kind == "binary" and b"\x00" not in data:
                notes.append(Skipped(rel, "not_utf8", "kept as a binary file"))
            files.append(WorkspaceFile(rel, data, _utc(st.st_mtime), kind))
        dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()]
    return ScanResult(tuple(files), tuple(skipped), tuple(notes))


def workspace_from_directory(root: str | Path, *, workspace_id: str, request: str, rubric: Sequence[Check],
                             reference: Mapping[str, Any] | None = None, parent_task: str = "",
                             max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> tuple[Workspace, ScanResult]:
    """A workspace from a raw directory of your own (unlabelled): the files :func:`scan_directory`
    keeps, your request and rubric. Returns the scan too, whose ``skipped`` and ``notes`` name
    every file left out or kept with a caveat, and why. The directory is only read.

    ``reference`` (the outcome that passes the rubric) may be omitted for workspaces used only
    for preparation or verification; evolution needs it."""
    scan = scan_directory(root, max_file_bytes=max_file_bytes)
    if not scan.files:
        raise WorkspaceError("no readable file in the directory" + (
            f" ({len(scan.skipped)} skipped: " + ", ".join(f"{s.path} ({s.reason})" for s in scan.skipped[:5]) + ")"
            if scan.skipped else ""), source=str(root))
    return Workspace(workspace_id, request, scan.files, tuple(rubric), dict(reference or {}), parent_task), scan


def tree_digest(root: str | Path) -> str:
    """SHA-256 over every entry under ``root`` (path, type, bytes or link target), without
    following links: equal digests before and after a step show it modified nothing there."""
    root = Path(root)
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = full.relative_to(root).as_posix().encode()
            if stat.S_ISLNK(st.st_mode):
                payload = b"L" + os.readlink(full).encode()
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as fh:
                    payload = b"F" + hashlib.file_digest(fh, "sha256").digest()
            elif stat.S_ISDIR(st.st_mode):
                payload = b"D"
            else:
                payload = b"O"
            h.update(len(rel).to_bytes(8, "little") + rel + payload)
    return h.hexdigest()


def split_by_parent(workspaces: Sequence[Workspace], held_out: Iterable[str]) -> tuple[list[Workspace], list[Workspace]]:
    """(train, held-out) by parent task (appendix A.3: the held-out parents are separate)."""
    held = set(held_out)
    train = [w for w in workspaces if w.parent_task not in held]
    test = [w for w in workspaces if w.parent_task in held]
    return train, test
