"""Executable terminal-task bundles: one model, read and written losslessly in two layouts.

Envs-FORGE reads seed tasks, rewrites them, filters them and writes them back out. Every stage
works on the same :class:`TaskBundle`: the task's files as bytes (plus each file's executable
bit) and a parsed view of them (instruction, metadata). Files are the source of truth, so an
unchanged bundle writes back byte for byte, comments and key order of its metadata file included;
the metadata file is re-rendered only when the metadata (or, in Terminal-Bench 1, the instruction
that lives in it) is changed through :meth:`TaskBundle.with_metadata` or
:meth:`TaskBundle.with_instruction`. Bundles come from untrusted sources, so reading refuses
links, special files, oversized files and malformed metadata with a :class:`BundleError` that
names the bundle directory, the file and the field.

Layouts (field names checked against the upstream models' Python sources; the
laude-institute repositories themselves are not in the stored index, so their public forks
were read):

* ``"harbor"`` (Harbor / Terminal-Bench 2): LegoX/harbor at 73fd120e731217b38f31667932ea26a28cdd4fff
  (``src/harbor/models/task/config.py``, ``task.py``) and UniPat-AI/harbor_multiturn at
  bd2c50b71b67bb9fb3e2f0fa77374dcf4e7284cf (``src/harbor/models/task/paths.py``).
  Files: ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` with the rest of
  ``environment/`` as its build context, ``solution/solve.sh`` (plus other solution files),
  ``tests/test.sh`` (writes ``/logs/verifier/reward.txt``) plus other test files.
  Fields type-checked: ``version``/``schema_version``; ``[metadata]`` ``author_name``,
  ``author_email``, ``difficulty``, ``category`` (strings), ``tags`` (list of strings),
  ``skills``; ``[verifier].timeout_sec``, ``[agent].timeout_sec``,
  ``[environment].build_timeout_sec`` (positive numbers). Other keys are kept untouched.
  A task that names only ``[environment].docker_image`` (no Dockerfile) is not supported:
  FORGE rebuilds every environment it rewrites.
* ``"tb1"`` (Terminal-Bench 1): finyorko/longcli-bench at 82c7eb3b3b1c0d2aff312292575182ab9df03fcf
  (``terminal_bench/handlers/trial_handler.py``, a fork of laude-institute/terminal-bench).
  Files: ``task.yaml``, ``Dockerfile`` (build context: the task folder), optional
  ``docker-compose.yaml``, ``solution.sh`` or ``solution.yaml`` (a list of commands, each a
  string or a mapping with a ``command`` string; ``solution.sh`` wins when both exist),
  ``run-tests.sh``, ``tests/`` (e.g. ``tests/test_outputs.py``). The instruction is
  ``instruction`` or the older ``descriptions: [{key: base, description: ...}]``.
  Fields type-checked: ``author_name``, ``author_email``, ``difficulty``, ``category``,
  ``parser_name`` (strings), ``tags`` (list of strings), ``max_agent_timeout_sec``,
  ``max_test_timeout_sec`` (positive numbers), ``run_tests_in_same_shell``,
  ``disable_asciinema`` (booleans), ``skills``. Other keys are kept untouched.

Both layouts are stricter than their harnesses in one way: the solution entry and the test
entry are required, because FORGE validates every bundle by running its oracle against its
verifier. Empty directories are not files and are not kept.

The skill subgraph of a task is stored in its metadata as ``skills = {required = [...],
optional = [...]}`` (Harbor: under ``[metadata]``; TB1: a top-level ``skills:`` mapping).

:func:`convert` maps between the layouts; its docstring lists what does not carry over.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w
import yaml

Layout = Literal["harbor", "tb1"]

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
"""Per-file size limit of :func:`read_bundle`: a task file larger than this is an image or a
data dump that belongs in the Dockerfile's downloads, not in a bundle."""

HARBOR_REWARD_FILE = "/logs/verifier/reward.txt"

_TB1_INSTRUCTION_KEYS = ("instruction", "descriptions")
_TB1_TIMEOUT_KEYS = ("max_agent_timeout_sec", "max_test_timeout_sec")
_TB1_ROLE_FILES = frozenset({"task.yaml", "docker-compose.yaml", "solution.sh", "solution.yaml", "run-tests.sh"})
_SKILL_KEYS = ("required", "optional")


class BundleError(ValueError):
    """A bundle that cannot be read, built or written; the message names the bundle, file and field."""


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle: its bytes and whether it is executable (the only mode bit kept)."""

    data: bytes
    executable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(f"BundleFile.data must be bytes, got {type(self.data).__name__}")
        if not isinstance(self.executable, bool):
            raise TypeError(f"BundleFile.executable must be a bool, got {self.executable!r}")


@dataclass(frozen=True)
class SkillSubgraph:
    """The skills a task exercises: those it cannot be solved without, and those it may use.

    FORGE's evolution actions keep, add or remove nodes of this subgraph (seeds/001 section 3), so
    a skill listed twice, or as both required and optional, is an authoring error to report rather
    than something to guess around.
    """

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in _SKILL_KEYS:
            names = getattr(self, key)
            if not isinstance(names, tuple):
                raise ValueError(f"{key} must be a tuple of skill names, got {names!r}")
            seen: set[str] = set()
            for index, name in enumerate(names):
                if not isinstance(name, str) or not name:
                    raise ValueError(f"{key}[{index}] must be a non-empty string, got {name!r}")
                if name in seen:
                    raise ValueError(f"{key} lists {name!r} twice")
                seen.add(name)
        both = sorted(set(self.required) & set(self.optional))
        if both:
            raise ValueError(f"optional lists {both[0]!r}, which is also required")


@dataclass(frozen=True)
class Timeouts:
    """The limits a bundle's metadata sets, in seconds; ``None`` where it sets none (the
    harness's default then applies, and the two harnesses' defaults differ)."""

    agent_sec: float | None
    verifier_sec: float | None
    build_sec: float | None


@dataclass(frozen=True)
class _LayoutSpec:
    """Where each role lives in one layout."""

    title: str
    metadata_file: str
    instruction_file: str | None
    dockerfile: str
    context_dir: str
    solution_entries: tuple[str, ...]
    test_entry: str
    tests_dir: str
    skills_keys: tuple[str, ...]


_SPECS: dict[str, _LayoutSpec] = {
    "harbor": _LayoutSpec(
        title="Harbor", metadata_file="task.toml", instruction_file="instruction.md",
        dockerfile="environment/Dockerfile", context_dir="environment",
        solution_entries=("solution/solve.sh",), test_entry="tests/test.sh", tests_dir="tests",
        skills_keys=("metadata", "skills"),
    ),
    "tb1": _LayoutSpec(
        title="Terminal-Bench 1", metadata_file="task.yaml", instruction_file=None,
        dockerfile="Dockerfile", context_dir=".",
        solution_entries=("solution.sh", "solution.yaml"), test_entry="run-tests.sh",
        tests_dir="tests", skills_keys=("skills",),
    ),
}


def _is_positive_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _is_string(value: object) -> bool:
    return isinstance(value, str)


def _is_string_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


_FieldRule = tuple[tuple[str, ...], Callable[[object], bool], str]
_STRING = (_is_string, "a string")
_POSITIVE = (_is_positive_number, "a positive number")

_FIELD_RULES: dict[str, tuple[_FieldRule, ...]] = {
    "harbor": (
        (("version",), *_STRING), (("schema_version",), *_STRING),
        (("metadata", "author_name"), *_STRING), (("metadata", "author_email"), *_STRING),
        (("metadata", "difficulty"), *_STRING), (("metadata", "category"), *_STRING),
        (("metadata", "tags"), _is_string_list, "a list of strings"),
        (("verifier", "timeout_sec"), *_POSITIVE), (("agent", "timeout_sec"), *_POSITIVE),
        (("environment", "build_timeout_sec"), *_POSITIVE),
    ),
    "tb1": (
        (("author_name",), *_STRING), (("author_email",), *_STRING),
        (("difficulty",), *_STRING), (("category",), *_STRING), (("parser_name",), *_STRING),
        (("tags",), _is_string_list, "a list of strings"),
        (("max_agent_timeout_sec",), *_POSITIVE), (("max_test_timeout_sec",), *_POSITIVE),
        (("run_tests_in_same_shell",), _is_bool, "true or false"),
        (("disable_asciinema",), _is_bool, "true or false"),
    ),
}


def _field_name(layout: str, keys: tuple[str, ...]) -> str:
    """How the user would point at a field: ``[verifier].timeout_sec`` in TOML, dotted in YAML."""
    if layout == "harbor" and len(keys) > 1:
        return f"[{keys[0]}]." + ".".join(keys[1:])
    return ".".join(keys)


def _lookup(doc: Mapping[str, Any], layout: str, keys: tuple[str, ...]) -> tuple[bool, Any]:
    """The value at ``keys`` (found, value); raises ValueError when a section on the way is not a table."""
    node: Any = doc
    for depth, key in enumerate(keys):
        if not isinstance(node, dict):
            section = ".".join(keys[:depth])
            raise ValueError(f"[{section}] must be a table, got {node!r}" if layout == "harbor"
                             else f"{section} must be a mapping, got {node!r}")
        if key not in node:
            return False, None
        node = node[key]
    return True, node


def _check_fields(doc: Mapping[str, Any], layout: str) -> None:
    for keys, is_valid, expected in _FIELD_RULES[layout]:
        found, value = _lookup(doc, layout, keys)
        if found and not is_valid(value):
            raise ValueError(f"{_field_name(layout, keys)} must be {expected}, got {value!r}")


def _parse_skills(doc: Mapping[str, Any], layout: str) -> SkillSubgraph:
    """The skill subgraph stored in parsed metadata; ValueError (naming the field) if malformed."""
    keys = _SPECS[layout].skills_keys
    found, raw = _lookup(doc, layout, keys)
    if not found:
        return SkillSubgraph()
    name = _field_name(layout, keys)
    if not isinstance(raw, dict):
        raise ValueError(f"{name} must be a mapping of 'required' and 'optional' lists, got {raw!r}")
    unknown = sorted(set(raw) - set(_SKILL_KEYS))
    if unknown:
        raise ValueError(f"{name} has unknown key {unknown[0]!r} (only 'required' and 'optional')")
    lists = {key: raw.get(key, []) for key in _SKILL_KEYS}
    for key, names in lists.items():
        if not isinstance(names, list):
            raise ValueError(f"{name}.{key} must be a list of skill names, got {names!r}")
    try:
        return SkillSubgraph(tuple(lists["required"]), tuple(lists["optional"]))
    except ValueError as exc:
        raise ValueError(f"{name}.{exc}") from None


def _tb1_base_description(descriptions: object) -> int:
    """Index of the ``key: base`` entry of TB1's older ``descriptions`` list."""
    if not isinstance(descriptions, list):
        raise ValueError(f"descriptions must be a list of {{key, description}} mappings, got {descriptions!r}")
    for index, entry in enumerate(descriptions):
        if isinstance(entry, dict) and entry.get("key") == "base":
            if not isinstance(entry.get("description"), str):
                raise ValueError(f"descriptions[{index}].description must be a string, "
                                 f"got {entry.get('description')!r}")
            return index
    raise ValueError("descriptions has no entry with key 'base'")


def _tb1_instruction(doc: Mapping[str, Any]) -> str:
    present = [key for key in _TB1_INSTRUCTION_KEYS if key in doc]
    if len(present) == 2:
        raise ValueError("instruction and descriptions are both present; keep one")
    if not present:
        raise ValueError("instruction is missing (neither 'instruction' nor 'descriptions' is set)")
    if present[0] == "descriptions":
        return doc["descriptions"][_tb1_base_description(doc["descriptions"])]["description"]
    if not isinstance(doc["instruction"], str):
        raise ValueError(f"instruction must be a string, got {doc['instruction']!r}")
    return doc["instruction"]


def _set_tb1_instruction(doc: dict[str, Any], text: str) -> None:
    """Put ``text`` where this task.yaml keeps its instruction, so its form is kept."""
    if "descriptions" in doc:
        doc["descriptions"][_tb1_base_description(doc["descriptions"])]["description"] = text
    else:
        doc["instruction"] = text


def _decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 ({exc.reason} at byte offset {exc.start})") from None


def _load_toml(data: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(_decode_utf8(data))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from None


def _load_yaml(data: bytes) -> Any:
    try:
        return yaml.safe_load(_decode_utf8(data))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None


def _load_metadata(layout: str, data: bytes) -> dict[str, Any]:
    doc = _load_toml(data) if layout == "harbor" else _load_yaml(data)
    if not isinstance(doc, dict):
        raise ValueError(f"must hold a mapping at the top level, got {type(doc).__name__}")
    _check_fields(doc, layout)
    _parse_skills(doc, layout)
    return doc


def _solution_commands(data: bytes) -> list[str]:
    """TB1 ``solution.yaml``: the oracle's commands in order."""
    doc = _load_yaml(data)
    if not isinstance(doc, list):
        raise ValueError(f"must be a list of commands, got {type(doc).__name__}")
    commands = []
    for index, item in enumerate(doc):
        command = item.get("command") if isinstance(item, dict) else item
        if not isinstance(command, str):
            raise ValueError(f"[{index}].command must be a string, got {command!r}")
        commands.append(command)
    return commands


def _error(where: str, file: str, message: str) -> BundleError:
    return BundleError(f"bundle {where}: {file}: {message}")


def _in_file(where: str, file: str, parse: Callable[..., Any], *args: Any) -> Any:
    """Run ``parse`` and name the bundle and file in any ValueError it raises."""
    try:
        return parse(*args)
    except BundleError:
        raise
    except ValueError as exc:
        raise _error(where, file, str(exc)) from None


def _check_path(path: object) -> None:
    """A bundle path is relative, POSIX, normalised and stays inside the bundle."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty string, got {path!r}")
    if path.startswith("/"):
        raise ValueError("path must be relative to the bundle, not absolute")
    if "\\" in path or "\x00" in path:
        raise ValueError("path must be POSIX (no backslash or NUL)")
    parts = path.split("/")
    if ".." in parts:
        raise ValueError("path must stay inside the bundle ('..' is refused)")
    if any(part in ("", ".") for part in parts):
        raise ValueError("path must be normalised (no empty or '.' parts)")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("path must be valid UTF-8") from None


def _detect_layout(files: Mapping[str, BundleFile], where: str) -> Layout:
    markers = [layout for layout, spec in _SPECS.items() if spec.metadata_file in files]
    if len(markers) == 2:
        raise _error(where, "task.toml", "task.toml (Harbor) and task.yaml (Terminal-Bench 1) are both "
                     "present; a bundle has one layout")
    if not markers:
        raise _error(where, "task.toml", "missing: a bundle needs task.toml (Harbor) or task.yaml "
                     "(Terminal-Bench 1)")
    return markers[0]  # type: ignore[return-value]


def _require(files: Mapping[str, BundleFile], where: str, spec: _LayoutSpec) -> None:
    roles = [(spec.dockerfile, "its Dockerfile"), (spec.test_entry, "its test entry")]
    if spec.instruction_file is not None:
        roles.insert(0, (spec.instruction_file, "its instruction"))
    for path, role in roles:
        if path not in files:
            raise _error(where, path, f"missing: a {spec.title} bundle needs it as {role}")
    if not any(path in files for path in spec.solution_entries):
        first, *others = spec.solution_entries
        alternatives = "".join(f" (or {other})" for other in others)
        raise _error(where, first, f"missing: a {spec.title} bundle needs it{alternatives} as its solution entry")


def _parse_view(layout: str, files: Mapping[str, BundleFile], where: str) -> tuple[str, dict[str, Any]]:
    """Validate the files of one layout and return (instruction, metadata) read from them."""
    spec = _SPECS[layout]
    if _detect_layout(files, where) != layout:
        raise _error(where, _SPECS["tb1" if layout == "harbor" else "harbor"].metadata_file,
                     f"present in a {spec.title} bundle, where it would change the layout")
    _require(files, where, spec)
    metadata = _in_file(where, spec.metadata_file, _load_metadata, layout,
                        files[spec.metadata_file].data)
    if spec.instruction_file is not None:
        instruction = _in_file(where, spec.instruction_file, _decode_utf8, files[spec.instruction_file].data)
    else:
        instruction = _in_file(where, spec.metadata_file, _tb1_instruction, metadata)
    if layout == "tb1" and "solution.sh" not in files:
        _in_file(where, "solution.yaml", _solution_commands, files["solution.yaml"].data)
    return instruction, metadata


def _check_files(files: Mapping[str, BundleFile], where: str) -> dict[str, BundleFile]:
    """Paths valid, values BundleFiles, no path both a file and a folder; returned sorted."""
    checked: dict[str, BundleFile] = {}
    for path in sorted(files, key=str):
        _in_file(where, str(path), _check_path, path)
        if not isinstance(files[path], BundleFile):
            raise _error(where, path, f"must map to a BundleFile, got {type(files[path]).__name__}")
        checked[path] = files[path]
    folders = {path.rsplit("/", depth)[0] for path in checked for depth in range(1, path.count("/") + 1)}
    clash = sorted(folders & set(checked))
    if clash:
        raise _error(where, clash[0], "is both a file and a folder")
    return checked


class _BlockTextDumper(yaml.SafeDumper):
    """``yaml.safe_dump`` that writes multi-line strings (instructions) as ``|`` blocks, as TB1
    task files do, so a re-rendered task.yaml stays readable; PyYAML falls back to a quoted
    style by itself where a block cannot hold the string exactly."""


def _represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockTextDumper.add_representer(str, _represent_text)


def _render_metadata(layout: str, doc: dict[str, Any], where: str) -> bytes:
    spec = _SPECS[layout]
    try:
        if layout == "harbor":
            return tomli_w.dumps(doc).encode("utf-8")
        return yaml.dump(doc, Dumper=_BlockTextDumper, sort_keys=False, allow_unicode=True,
                         default_flow_style=False).encode("utf-8")
    except (TypeError, ValueError, yaml.YAMLError) as exc:
        raise _error(where, spec.metadata_file, f"cannot write the metadata: {exc}") from None


@dataclass(frozen=True)
class TaskBundle:
    """One executable terminal task.

    ``files`` maps every relative POSIX path of the bundle (metadata file and instruction
    included) to its bytes and executable bit; it is the whole state. ``instruction`` and
    ``metadata`` (the whole parsed task.toml or task.yaml, so in TB1 it also holds the
    instruction) are parsed from ``files`` on construction, which is also where a bundle is
    checked, so no bundle exists whose view disagrees with its files; equality therefore
    compares name, layout and files. Treat ``metadata`` as read-only: the ``with_*`` methods
    return new bundles. ``origin`` (where it was read from) only labels error messages.
    """

    name: str
    layout: Layout
    files: Mapping[str, BundleFile] = field(repr=False)
    origin: str = field(default="", compare=False, repr=False)
    instruction: str = field(init=False, compare=False, repr=False)
    metadata: dict[str, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = self.origin or str(self.name)
        if not isinstance(self.name, str) or not self.name:
            raise BundleError(f"bundle {where}: name must be a non-empty string, got {self.name!r}")
        if self.layout not in _SPECS:
            raise BundleError(f"bundle {where}: layout must be 'harbor' or 'tb1', got {self.layout!r}")
        if not isinstance(self.files, Mapping):
            raise BundleError(f"bundle {where}: files must map paths to BundleFiles, got {type(self.files).__name__}")
        files = _check_files(self.files, where)
        instruction, metadata = _parse_view(self.layout, files, where)
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "instruction", instruction)
        object.__setattr__(self, "metadata", metadata)

    @property
    def _spec(self) -> _LayoutSpec:
        return _SPECS[self.layout]

    @property
    def _where(self) -> str:
        return self.origin or self.name

    @property
    def dockerfile_path(self) -> str:
        return self._spec.dockerfile

    @property
    def build_context_dir(self) -> str:
        """The Docker build context, relative to the bundle (``"."`` is the bundle itself)."""
        return self._spec.context_dir

    def build_context(self) -> dict[str, BundleFile]:
        """The files Docker sees when building, by path inside the context (TB1: every file)."""
        folder = self._spec.context_dir
        if folder == ".":
            return dict(self.files)
        prefix = folder + "/"
        return {path[len(prefix):]: data for path, data in self.files.items() if path.startswith(prefix)}

    @property
    def solution_entry(self) -> str:
        return next(path for path in self._spec.solution_entries if path in self.files)

    @property
    def test_entry(self) -> str:
        return self._spec.test_entry

    @property
    def test_files(self) -> tuple[str, ...]:
        """Files under ``tests/`` other than the test entry, sorted."""
        prefix = self._spec.tests_dir + "/"
        return tuple(path for path in self.files if path.startswith(prefix) and path != self.test_entry)

    @property
    def timeouts(self) -> Timeouts:
        def seconds(*keys: str) -> float | None:
            found, value = _lookup(self.metadata, self.layout, keys)
            return float(value) if found else None

        if self.layout == "harbor":
            return Timeouts(agent_sec=seconds("agent", "timeout_sec"),
                            verifier_sec=seconds("verifier", "timeout_sec"),
                            build_sec=seconds("environment", "build_timeout_sec"))
        return Timeouts(agent_sec=seconds("max_agent_timeout_sec"),
                        verifier_sec=seconds("max_test_timeout_sec"), build_sec=None)

    @property
    def skills(self) -> SkillSubgraph:
        return _parse_skills(self.metadata, self.layout)

    def content_hash(self) -> str:
        """SHA-256 over the sorted (path, mode, bytes) of every file: equal files, equal hash,
        whatever the bundle's name or where it was read from. Lengths prefix each part so no
        two different file sets share a byte stream."""
        digest = hashlib.sha256()
        for path in sorted(self.files):
            entry = self.files[path]
            encoded = path.encode("utf-8")
            digest.update(len(encoded).to_bytes(8, "big") + encoded)
            digest.update(_file_mode(entry).to_bytes(2, "big"))
            digest.update(len(entry.data).to_bytes(8, "big") + entry.data)
        return digest.hexdigest()

    def with_files(self, files: Mapping[str, BundleFile]) -> TaskBundle:
        """This bundle with its whole file set replaced (re-parsed and re-checked)."""
        return TaskBundle(self.name, self.layout, files, origin=self.origin)

    def with_file(self, path: str, data: bytes, executable: bool = False) -> TaskBundle:
        """This bundle with ``path`` added or replaced; writing the metadata file re-parses it."""
        return self.with_files({**self.files, path: BundleFile(data, executable)})

    def without_file(self, path: str) -> TaskBundle:
        if path not in self.files:
            raise _error(self._where, path, "no such file in the bundle")
        return self.with_files({name: entry for name, entry in self.files.items() if name != path})

    def with_metadata(self, metadata: Mapping[str, Any]) -> TaskBundle:
        """This bundle with its metadata file re-rendered from ``metadata`` (comments and
        formatting of the old file are lost); unchanged metadata keeps the original text."""
        doc = copy.deepcopy(dict(metadata))
        if doc == self._metadata_as_written():
            return self
        spec = self._spec
        entry = self.files[spec.metadata_file]
        data = _render_metadata(self.layout, doc, self._where)
        return self.with_file(spec.metadata_file, data, entry.executable)

    def with_instruction(self, text: str) -> TaskBundle:
        """This bundle with a new instruction: Harbor rewrites instruction.md, TB1 re-renders
        task.yaml (keeping its ``instruction`` or ``descriptions`` form)."""
        if text == self.instruction:
            return self
        if self._spec.instruction_file is not None:
            entry = self.files[self._spec.instruction_file]
            return self.with_file(self._spec.instruction_file, text.encode("utf-8"), entry.executable)
        doc = self._metadata_as_written()
        _set_tb1_instruction(doc, text)
        return self.with_metadata(doc)

    def _metadata_as_written(self) -> dict[str, Any]:
        """A fresh parse of the metadata file: ``metadata`` may have been edited in place, and an
        edit must not pass for "unchanged" nor leak into a re-render it was not given to."""
        return _load_metadata(self.layout, self.files[self._spec.metadata_file].data)


def _file_mode(entry: BundleFile) -> int:
    return 0o755 if entry.executable else 0o644


def _read_file(path: Path, rel: str, where: str, max_file_bytes: int) -> BundleFile:
    """Read one file without following a link and without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise _error(where, rel, f"cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _error(where, rel, "is not a regular file")
        if info.st_size > max_file_bytes:
            raise _error(where, rel, f"is {info.st_size} bytes, over the limit of {max_file_bytes} bytes")
        data = handle.read(max_file_bytes + 1)
    if len(data) > max_file_bytes:
        raise _error(where, rel, f"grew past the limit of {max_file_bytes} bytes while being read")
    return BundleFile(data, bool(info.st_mode & stat.S_IXUSR))


def _read_tree(root: Path, where: str, max_file_bytes: int) -> dict[str, BundleFile]:
    files: dict[str, BundleFile] = {}
    folders = [""]
    while folders:
        folder = folders.pop()
        with os.scandir(root / folder if folder else root) as entries:
            for entry in entries:
                rel = f"{folder}/{entry.name}" if folder else entry.name
                if entry.is_symlink():
                    raise _error(where, rel, "is a symbolic link; links are refused, since bundles "
                                 "come from untrusted sources")
                if entry.is_dir(follow_symlinks=False):
                    folders.append(rel)
                else:
                    files[rel] = _read_file(root / rel, rel, where, max_file_bytes)
    return files


def read_bundle(path: str | os.PathLike[str], *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> TaskBundle:
    """Read the bundle in folder ``path``, detecting its layout from task.toml or task.yaml.

    Every file is kept, known or not; links, special files and files over ``max_file_bytes``
    are refused. The bundle's name is the folder's name.
    """
    where = os.path.abspath(path)
    root = Path(where)
    if not root.is_dir():
        raise BundleError(f"bundle {where}: not a directory")
    files = _read_tree(root, where, max_file_bytes)
    layout = _detect_layout(files, where)
    return TaskBundle(root.name, layout, files, origin=where)


def _write_file(root: Path, path: str, entry: BundleFile) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as handle:
        handle.write(entry.data)
    os.chmod(target, _file_mode(entry))


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished staging folder onto ``out``. An empty ``out`` is replaced by one
    atomic rename; a full one is first moved aside and put back if the second rename fails."""
    if not out.exists() or not any(out.iterdir()):
        os.replace(staging, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, aside)
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def write_bundle(bundle: TaskBundle, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write every file of ``bundle`` into ``out_dir`` (modes 0o755 / 0o644) and return its path.

    The files go into a temporary sibling folder that is renamed onto ``out_dir`` only when
    complete, so a failure leaves ``out_dir`` as it was. A non-empty ``out_dir`` is refused
    unless ``overwrite``, which replaces its whole content.
    """
    out = Path(os.path.abspath(out_dir))
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BundleError(f"bundle {out}: cannot write {bundle.name}: the path is a link or not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BundleError(f"bundle {out}: cannot write {bundle.name}: the directory is not empty; "
                          "pass overwrite=True to replace its content")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for path, entry in bundle.files.items():
            _write_file(staging, path, entry)
        os.chmod(staging, 0o755)
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


TB1_TEST_WRAPPER = f"""#!/bin/bash
# Made by envsched_jax.forge.bundle.convert from a Terminal-Bench 1 task: Harbor reads a reward
# file where TB1 parsed the test output. Runs the task's run-tests.sh and, unless that script wrote a
# reward itself, writes 1 if it exited 0 and 0 otherwise.
here="$(cd "$(dirname "$0")" && pwd)"
export TEST_DIR="${{TEST_DIR:-$here}}"
reward={HARBOR_REWARD_FILE}
mkdir -p "$(dirname "$reward")"
rm -f "$reward"
bash "$here/run-tests.sh"
status=$?
if [ ! -f "$reward" ]; then
  if [ "$status" -eq 0 ]; then echo 1 > "$reward"; else echo 0 > "$reward"; fi
fi
exit "$status"
""".encode()
"""Harbor ``tests/test.sh`` that :func:`convert` writes for a TB1 task (its run-tests.sh
moves to ``tests/run-tests.sh``); converting back to TB1 recognises it and restores the original."""


def _solve_script(commands: list[str]) -> bytes:
    lines = ["#!/bin/bash",
             "# Made by envsched_jax.forge.bundle.convert from a Terminal-Bench 1 solution.yaml: its",
             "# commands in order (per-command timeouts and key-press options do not carry over).",
             *commands]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _claim(files: dict[str, BundleFile], path: str, entry: BundleFile, source: str, where: str) -> None:
    """Place a converted file, refusing to let two source files land on one path."""
    if path in files:
        raise _error(where, source, f"would land on {path}, which another file of the converted bundle "
                     "already takes")
    files[path] = entry


def _tb1_to_harbor(bundle: TaskBundle) -> TaskBundle:
    where = bundle._where
    files: dict[str, BundleFile] = {}
    for path, entry in bundle.files.items():
        if path not in _TB1_ROLE_FILES:
            target = path if path.startswith("tests/") else "environment/" + path
            _claim(files, target, entry, path, where)
    if "solution.sh" in bundle.files:
        _claim(files, "solution/solve.sh", bundle.files["solution.sh"], "solution.sh", where)
    else:
        script = _solve_script(_solution_commands(bundle.files["solution.yaml"].data))
        _claim(files, "solution/solve.sh", BundleFile(script, True), "solution.yaml", where)
    _claim(files, "tests/run-tests.sh", bundle.files["run-tests.sh"], "run-tests.sh", where)
    _claim(files, "tests/test.sh", BundleFile(TB1_TEST_WRAPPER, True), "run-tests.sh", where)

    meta = bundle.metadata
    doc: dict[str, Any] = {"version": "1.0"}
    carried = {key: value for key, value in meta.items()
               if key not in _TB1_INSTRUCTION_KEYS + _TB1_TIMEOUT_KEYS and value is not None}
    if carried:
        doc["metadata"] = carried
    if "max_test_timeout_sec" in meta:
        doc["verifier"] = {"timeout_sec": meta["max_test_timeout_sec"]}
    if "max_agent_timeout_sec" in meta:
        doc["agent"] = {"timeout_sec": meta["max_agent_timeout_sec"]}
    files["task.toml"] = BundleFile(_render_metadata("harbor", doc, where))
    files["instruction.md"] = BundleFile(bundle.instruction.encode("utf-8"))
    return TaskBundle(bundle.name, "harbor", files, origin=bundle.origin)


def _harbor_to_tb1_path(path: str, where: str) -> str | None:
    """Where a Harbor file goes in TB1 (None: handled apart), or a BundleError if nowhere."""
    if path in ("task.toml", "instruction.md", "tests/test.sh"):
        return None
    if path == "solution/solve.sh":
        return "solution.sh"
    if path.startswith("solution/"):
        raise _error(where, path, "has no Terminal-Bench 1 counterpart (TB1 copies only solution.sh "
                     "into the container)")
    target = path.removeprefix("environment/")
    if target in _TB1_ROLE_FILES or (target != path and target.startswith("tests/")):
        raise _error(where, path, f"would become the Terminal-Bench 1 {target}, which has another role there")
    return target


def _harbor_to_tb1(bundle: TaskBundle) -> TaskBundle:
    where = bundle._where
    files: dict[str, BundleFile] = {}
    for path, entry in bundle.files.items():
        target = _harbor_to_tb1_path(path, where)
        if target is not None:
            _claim(files, target, entry, path, where)
    test_sh = bundle.files["tests/test.sh"]
    if test_sh.data == TB1_TEST_WRAPPER and "tests/run-tests.sh" in files:
        files["run-tests.sh"] = files.pop("tests/run-tests.sh")
    else:
        _claim(files, "run-tests.sh", test_sh, "tests/test.sh", where)

    carried = bundle.metadata.get("metadata", {})
    clash = sorted(set(carried) & set(_TB1_INSTRUCTION_KEYS + _TB1_TIMEOUT_KEYS))
    if clash:
        raise _error(where, "task.toml", f"[metadata].{clash[0]} would overwrite the Terminal-Bench 1 field "
                     "of that name")
    doc: dict[str, Any] = {"instruction": bundle.instruction, **copy.deepcopy(carried)}
    for key, keys in zip(_TB1_TIMEOUT_KEYS, (("agent", "timeout_sec"), ("verifier", "timeout_sec"))):
        found, value = _lookup(bundle.metadata, "harbor", keys)
        if found:
            doc[key] = value
    files["task.yaml"] = BundleFile(_render_metadata("tb1", doc, where))
    return TaskBundle(bundle.name, "tb1", files, origin=bundle.origin)


def convert(bundle: TaskBundle, layout: Layout) -> TaskBundle:
    """The same task in the other layout (``bundle`` itself if it is already in ``layout``).

    TB1 -> Harbor maps ``Dockerfile`` -> ``environment/Dockerfile`` and every other file outside
    the TB1 roles and ``tests/`` -> ``environment/`` (TB1 builds from the task folder, so COPY
    lines keep working); ``solution.sh`` -> ``solution/solve.sh`` (a ``solution.yaml`` becomes a
    solve.sh of its commands); ``run-tests.sh`` -> ``tests/run-tests.sh`` behind a generated
    ``tests/test.sh`` (:data:`TB1_TEST_WRAPPER`) that writes Harbor's reward file; ``tests/`` ->
    ``tests/``; the instruction -> ``instruction.md``; ``max_test_timeout_sec`` ->
    ``[verifier].timeout_sec``, ``max_agent_timeout_sec`` -> ``[agent].timeout_sec``, every
    other task.yaml key -> ``[metadata]``. Not carried over: ``docker-compose.yaml`` (Harbor
    builds from the Dockerfile; TB1's compose file only wires its own harness), a
    ``solution.yaml`` shadowed by ``solution.sh``, solution.yaml's per-command options, keys
    whose value is null (TOML has no null), and task.yaml's comments and formatting.

    Harbor -> TB1 maps the same roles back (the generated wrapper is recognised and the original
    run-tests.sh restored; any other test.sh becomes run-tests.sh as is, and TB1 grades it by
    parsing its output); ``[metadata]`` keys become top-level task.yaml keys. Not carried over:
    every other task.toml key (``version``, ``[environment]`` including ``build_timeout_sec``
    and resources, ``[verifier].env``, ``[solution]``, ``[task]``, ``source``) and its comments.
    Refused with a BundleError: solution files besides solve.sh, and environment files that would
    take a TB1 role's path (e.g. ``environment/docker-compose.yaml``).
    """
    if layout not in _SPECS:
        raise BundleError(f"bundle {bundle._where}: layout must be 'harbor' or 'tb1', got {layout!r}")
    if layout == bundle.layout:
        return bundle
    return _tb1_to_harbor(bundle) if layout == "harbor" else _harbor_to_tb1(bundle)
