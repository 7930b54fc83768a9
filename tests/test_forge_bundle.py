"""Envs-FORGE task bundles: lossless round trips in both layouts, conversion, skills, hashing,
and a clear BundleError (naming bundle, file and field) for each kind of bad input."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from envsched_jax.forge import bundle as bundle_module
from envsched_jax.forge.bundle import (TB1_TEST_WRAPPER, BundleError, BundleFile, SkillSubgraph, TaskBundle,
                                       Timeouts, convert, read_bundle, write_bundle)

HARBOR_TOML = b"""# A comment that must survive a round trip.
version = "1.0"

[verifier]
timeout_sec = 120.0

[metadata]
difficulty = "medium"
author_name = "Ada"
tags = ["git", "shell"]
skills = { required = ["git"], optional = ["bash-scripting"] }

[agent]
timeout_sec = 600
"""

HARBOR_FILES: dict[str, bytes | tuple[bytes, bool]] = {
    "task.toml": HARBOR_TOML,
    "instruction.md": "Rebase the branch in /app onto main \u2014 keep the history linear.\n".encode(),
    "environment/Dockerfile": b"FROM ubuntu:24.04\nCOPY repo /app\n",
    "environment/repo/README": b"seed repository\n",
    "solution/solve.sh": (b"#!/bin/bash\ncd /app && git rebase main\n", True),
    "tests/test.sh": (b"#!/bin/bash\npytest /tests/test_state.py && echo 1 > /logs/verifier/reward.txt\n", True),
    "tests/test_state.py": b"def test_linear():\n    assert True\n",
    "NOTES.txt": b"an unknown extra file\n",
}

TB1_YAML = b"""# Terminal-Bench 1 task; this comment must survive.
descriptions:
  - key: base
    description: |
      Sort /app/data.txt into /app/sorted.txt.
author_email: ada@example.com
difficulty: easy
tags: [files]
max_agent_timeout_sec: 180
max_test_timeout_sec: 30
skills:
  required: [sort]
test_scripts: [setup-uv-pytest.sh, run-uv-pytest.sh]
"""

TB1_FILES: dict[str, bytes | tuple[bytes, bool]] = {
    "task.yaml": TB1_YAML,
    "Dockerfile": b"FROM python:3.12-slim\nCOPY data.txt /app/data.txt\n",
    "docker-compose.yaml": b"services:\n  client:\n    build: .\n",
    "data.txt": b"b\na\n",
    "solution.sh": (b"#!/bin/bash\nsort /app/data.txt > /app/sorted.txt\n", True),
    "run-tests.sh": (b"#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n", True),
    "tests/test_outputs.py": b"def test_sorted():\n    assert True\n",
}


def write_tree(root: Path, files: dict[str, bytes | tuple[bytes, bool]]) -> Path:
    """Lay out a bundle by hand (not through write_bundle), so reading is tested on its own."""
    for path, content in files.items():
        data, executable = content if isinstance(content, tuple) else (content, False)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if executable else 0o644)
    return root


def tree_of(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under ``root`` with its bytes and owner-executable bit."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR))
            for p in sorted(root.rglob("*")) if p.is_file()}


def normalised(files: dict[str, bytes | tuple[bytes, bool]]) -> dict[str, tuple[bytes, bool]]:
    return {path: content if isinstance(content, tuple) else (content, False) for path, content in files.items()}


def assert_carried(source, target, moves: dict[str, str]) -> None:
    """Each source file landed at its mapped path with the same bytes and executable bit."""
    landed = {dst: target.files.get(dst) for dst in moves.values()}
    assert landed == {dst: source.files[src] for src, dst in moves.items()}


def convert_and_reread(task, layout, out: Path):
    """Convert, write and read back, as FORGE does when it emits a task in the other layout."""
    result = read_bundle(write_bundle(convert(task, layout), out))
    assert (result.layout, result.instruction, result.skills) == (layout, task.instruction, task.skills)
    return result


@pytest.fixture
def harbor_dir(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "rebase-task", HARBOR_FILES)


@pytest.fixture
def tb1_dir(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "sort-task", TB1_FILES)


@pytest.mark.parametrize("files", [HARBOR_FILES, TB1_FILES], ids=["harbor", "tb1"])
def test_read_then_write_reproduces_every_file_byte_for_byte(tmp_path, files):
    source = write_tree(tmp_path / "task", files)
    out = write_bundle(read_bundle(source), tmp_path / "copy")
    assert tree_of(out) == normalised(files)
    assert tree_of(out)["task.toml" if "task.toml" in files else "task.yaml"][0].startswith(b"# ")


def test_harbor_view_and_roles(harbor_dir):
    task = read_bundle(harbor_dir)
    assert (task.name, task.layout) == ("rebase-task", "harbor")
    assert task.instruction == HARBOR_FILES["instruction.md"].decode()
    assert list(task.metadata) == ["version", "verifier", "metadata", "agent"]
    assert task.metadata["metadata"]["author_name"] == "Ada"
    assert task.dockerfile_path == "environment/Dockerfile"
    assert task.build_context_dir == "environment"
    assert sorted(task.build_context()) == ["Dockerfile", "repo/README"]
    assert task.solution_entry == "solution/solve.sh"
    assert task.test_entry == "tests/test.sh"
    assert task.test_files == ("tests/test_state.py",)
    assert task.timeouts == Timeouts(agent_sec=600.0, verifier_sec=120.0, build_sec=None)
    assert task.files["solution/solve.sh"].executable and not task.files["NOTES.txt"].executable
    assert task.skills == SkillSubgraph(required=("git",), optional=("bash-scripting",))


def test_tb1_view_and_roles(tb1_dir):
    task = read_bundle(tb1_dir)
    assert (task.name, task.layout) == ("sort-task", "tb1")
    assert task.instruction == "Sort /app/data.txt into /app/sorted.txt.\n"
    assert task.dockerfile_path == "Dockerfile"
    assert task.build_context_dir == "."
    assert set(task.build_context()) == set(TB1_FILES)
    assert (task.solution_entry, task.test_entry) == ("solution.sh", "run-tests.sh")
    assert task.test_files == ("tests/test_outputs.py",)
    assert task.timeouts == Timeouts(agent_sec=180.0, verifier_sec=30.0, build_sec=None)
    assert task.skills == SkillSubgraph(required=("sort",), optional=())


def test_tb1_solution_yaml_and_instruction_field(tmp_path):
    files = {**TB1_FILES, "task.yaml": b"instruction: Say hi.\ndifficulty: easy\n",
             "solution.yaml": b"- command: echo hi\n  min_timeout_sec: 5\n- echo bye\n"}
    del files["solution.sh"]
    task = read_bundle(write_tree(tmp_path / "hi", files))
    assert (task.instruction, task.solution_entry, task.skills) == ("Say hi.", "solution.yaml", SkillSubgraph())
    solve = convert(task, "harbor").files["solution/solve.sh"]
    assert solve.executable and solve.data.decode().splitlines()[-2:] == ["echo hi", "echo bye"]


def test_with_instruction_harbor_rewrites_only_instruction_md(harbor_dir):
    task = read_bundle(harbor_dir)
    changed = task.with_instruction("New text.\n")
    assert changed.files["instruction.md"].data == b"New text.\n"
    assert changed.files["task.toml"].data == HARBOR_TOML
    assert task.with_instruction(task.instruction) is task


@pytest.mark.parametrize("yaml_text", [TB1_YAML, b"instruction: old\ndifficulty: easy\n"],
                         ids=["descriptions", "instruction"])
def test_with_instruction_tb1_re_renders_task_yaml_in_its_form(tmp_path, yaml_text):
    task = read_bundle(write_tree(tmp_path / "t", {**TB1_FILES, "task.yaml": yaml_text}))
    text = "Line one.\nLine two  \n\twith a tab.\n"
    out = write_bundle(task.with_instruction(text), tmp_path / "out")
    reread = read_bundle(out)
    assert reread.instruction == text
    assert ("descriptions" in reread.metadata) == (b"descriptions" in yaml_text)
    assert reread.metadata["difficulty"] == task.metadata["difficulty"]
    assert not out.joinpath("task.yaml").read_bytes().startswith(b"#")


def test_with_metadata_re_renders_and_unchanged_metadata_keeps_text(harbor_dir):
    task = read_bundle(harbor_dir)
    assert task.with_metadata(task.metadata) is task
    doc = {**task.metadata, "verifier": {"timeout_sec": 45.5}}
    changed = task.with_metadata(doc)
    assert changed.timeouts.verifier_sec == 45.5
    assert changed.metadata == doc
    assert b"# A comment" not in changed.files["task.toml"].data
    assert task.timeouts.verifier_sec == 120.0
    task.metadata["agent"]["timeout_sec"] = 5
    edited_in_place = task.with_metadata(task.metadata)
    assert tomllib.loads(edited_in_place.files["task.toml"].data.decode())["agent"]["timeout_sec"] == 5


def test_with_file_and_without_file(harbor_dir):
    task = read_bundle(harbor_dir)
    added = task.with_file("tests/helper.sh", b"echo\n", executable=True)
    assert added.files["tests/helper.sh"] == BundleFile(b"echo\n", True)
    assert added.test_files == ("tests/helper.sh", "tests/test_state.py")
    assert added.without_file("tests/helper.sh") == task
    with pytest.raises(BundleError, match=r"tests/test.sh: missing: a Harbor bundle needs it as its test entry"):
        task.without_file("tests/test.sh")
    with pytest.raises(BundleError, match=r"nope\.txt: no such file"):
        task.without_file("nope.txt")


def test_convert_tb1_to_harbor_and_back(tb1_dir, tmp_path):
    task = read_bundle(tb1_dir)
    harbor = convert_and_reread(task, "harbor", tmp_path / "as-harbor")
    assert_carried(task, harbor, {"Dockerfile": "environment/Dockerfile", "data.txt": "environment/data.txt",
                                  "solution.sh": "solution/solve.sh", "run-tests.sh": "tests/run-tests.sh",
                                  "tests/test_outputs.py": "tests/test_outputs.py"})
    assert harbor.files["tests/test.sh"] == BundleFile(TB1_TEST_WRAPPER, True)
    assert not any(path.endswith("docker-compose.yaml") for path in harbor.files)
    assert harbor.timeouts == Timeouts(agent_sec=180.0, verifier_sec=30.0, build_sec=None)
    assert harbor.metadata["metadata"]["test_scripts"] == ["setup-uv-pytest.sh", "run-uv-pytest.sh"]

    back = convert_and_reread(harbor, "tb1", tmp_path / "back")
    kept = {path: entry for path, entry in task.files.items() if path not in ("task.yaml", "docker-compose.yaml")}
    assert {path: entry for path, entry in back.files.items() if path != "task.yaml"} == kept
    assert back.timeouts == task.timeouts


def test_convert_harbor_to_tb1_and_back(harbor_dir, tmp_path):
    task = read_bundle(harbor_dir)
    tb1 = convert_and_reread(task, "tb1", tmp_path / "as-tb1")
    assert_carried(task, tb1, {"environment/Dockerfile": "Dockerfile", "environment/repo/README": "repo/README",
                               "solution/solve.sh": "solution.sh", "tests/test.sh": "run-tests.sh",
                               "tests/test_state.py": "tests/test_state.py", "NOTES.txt": "NOTES.txt"})
    assert tb1.metadata["max_agent_timeout_sec"] == 600 and tb1.metadata["max_test_timeout_sec"] == 120.0
    assert convert(tb1, "tb1") is tb1

    back = convert_and_reread(tb1, "harbor", tmp_path / "back")
    assert back.metadata["metadata"] == task.metadata["metadata"]
    assert_carried(task, back, {"environment/repo/README": "environment/repo/README",
                                "tests/test_state.py": "tests/test_state.py"})


@pytest.mark.parametrize("source, path, message", [
    ("harbor", "solution/data.bin", r"solution/data\.bin: has no Terminal-Bench 1 counterpart"),
    ("harbor", "environment/docker-compose.yaml",
     r"environment/docker-compose\.yaml: would become the Terminal-Bench 1 docker-compose\.yaml"),
    ("harbor", "environment/tests/extra.py",
     r"environment/tests/extra\.py: would become the Terminal-Bench 1 tests/"),
    ("tb1", "tests/test.sh", r"run-tests\.sh: would land on tests/test\.sh, which another file"),
])
def test_convert_refuses_what_the_other_layout_cannot_hold(harbor_dir, tb1_dir, source, path, message):
    task = read_bundle(harbor_dir if source == "harbor" else tb1_dir).with_file(path, b"x")
    with pytest.raises(BundleError, match=message):
        convert(task, "tb1" if source == "harbor" else "harbor")


@pytest.mark.parametrize("script, reward", [("exit 0", "1"), ("exit 3", "0"), ('echo 0.5 > "$R"; exit 1', "0.5")],
                         ids=["pass", "fail", "own-reward"])
def test_tb1_test_wrapper_turns_exit_status_into_a_reward(tmp_path, script, reward):
    reward_file = tmp_path / "logs" / "reward.txt"
    wrapper = TB1_TEST_WRAPPER.replace(bundle_module.HARBOR_REWARD_FILE.encode(), str(reward_file).encode())
    write_tree(tmp_path / "tests", {"test.sh": (wrapper, True), "run-tests.sh": script.encode() + b"\n"})
    env = {"PATH": os.environ["PATH"], "R": str(reward_file)}
    subprocess.run(["bash", str(tmp_path / "tests" / "test.sh")], env=env, check=False, timeout=10)
    assert reward_file.read_text().strip() == reward


def test_content_hash_follows_content_only(tmp_path):
    first = read_bundle(write_tree(tmp_path / "a", HARBOR_FILES))
    second = read_bundle(write_tree(tmp_path / "b", HARBOR_FILES))
    assert first.name != second.name and first.content_hash() == second.content_hash()
    assert len(first.content_hash()) == 64
    one_byte = first.with_file("NOTES.txt", b"an unknown extra file!")
    assert one_byte.content_hash() != first.content_hash()
    mode_only = first.with_file("NOTES.txt", first.files["NOTES.txt"].data, executable=True)
    assert mode_only.content_hash() != first.content_hash()


@pytest.mark.parametrize("skills, message", [
    ('{ required = ["git"], optional = ["git"] }',
     r"\[metadata\]\.skills\.optional lists 'git', which is also required"),
    ('{ required = ["git", 3] }', r"\[metadata\]\.skills\.required\[1\] must be a non-empty string, got 3"),
    ('{ required = ["git", "git"] }', r"\[metadata\]\.skills\.required lists 'git' twice"),
    ('{ required = "git" }', r"\[metadata\]\.skills\.required must be a list of skill names, got 'git'"),
    ('{ needed = ["git"] }', r"\[metadata\]\.skills has unknown key 'needed'"),
    ('["git"]', r"\[metadata\]\.skills must be a mapping of 'required' and 'optional' lists, got \['git'\]"),
])
def test_malformed_skills_harbor(tmp_path, skills, message):
    toml = HARBOR_TOML.replace(b'{ required = ["git"], optional = ["bash-scripting"] }', skills.encode())
    root = write_tree(tmp_path / "t1", {**HARBOR_FILES, "task.toml": toml})
    with pytest.raises(BundleError, match=rf"^bundle {root}: task\.toml: {message}"):
        read_bundle(root)


def test_malformed_skills_tb1(tmp_path):
    root = write_tree(tmp_path / "t1", {**TB1_FILES, "task.yaml": TB1_YAML.replace(b"[sort]", b"[sort, sort]")})
    with pytest.raises(BundleError, match=rf"^bundle {root}: task\.yaml: skills\.required lists 'sort' twice"):
        read_bundle(root)


def test_skill_subgraph_checks_itself():
    with pytest.raises(ValueError, match="optional lists 'a', which is also required"):
        SkillSubgraph(required=("a",), optional=("a",))


@pytest.mark.parametrize("layout, missing, message", [
    ("harbor", "instruction.md", "missing: a Harbor bundle needs it as its instruction"),
    ("harbor", "environment/Dockerfile", "missing: a Harbor bundle needs it as its Dockerfile"),
    ("harbor", "tests/test.sh", "missing: a Harbor bundle needs it as its test entry"),
    ("harbor", "solution/solve.sh", "missing: a Harbor bundle needs it as its solution entry"),
    ("tb1", "Dockerfile", "missing: a Terminal-Bench 1 bundle needs it as its Dockerfile"),
    ("tb1", "run-tests.sh", "missing: a Terminal-Bench 1 bundle needs it as its test entry"),
    ("tb1", "solution.sh",
     r"missing: a Terminal-Bench 1 bundle needs it \(or solution\.yaml\) as its solution entry"),
])
def test_missing_required_file(tmp_path, layout, missing, message):
    files = dict(HARBOR_FILES if layout == "harbor" else TB1_FILES)
    del files[missing]
    root = write_tree(tmp_path / "t1", files)
    with pytest.raises(BundleError, match=rf"^bundle {root}: {missing}: {message}"):
        read_bundle(root)


@pytest.mark.parametrize("layout, text, message", [
    ("harbor", b'version = "1.0"\n[verifier]\ntimeout_sec = \n', r"task\.toml: not valid TOML: .*at line 3"),
    ("tb1", b"instruction: hi\ntags: [a\ndifficulty: easy\n", r"task\.yaml: not valid YAML at line 3, column 11"),
    ("harbor", b'[verifier]\ntimeout_sec = "abc"\n',
     r"task\.toml: \[verifier\]\.timeout_sec must be a positive number, got 'abc'$"),
    ("harbor", b"[agent]\ntimeout_sec = -5\n",
     r"task\.toml: \[agent\]\.timeout_sec must be a positive number, got -5$"),
    ("harbor", b"verifier = 3\n", r"task\.toml: \[verifier\] must be a table, got 3$"),
    ("harbor", b'[metadata]\ntags = "git"\n',
     r"task\.toml: \[metadata\]\.tags must be a list of strings, got 'git'$"),
    ("tb1", b"instruction: hi\nmax_agent_timeout_sec: soon\n",
     r"task\.yaml: max_agent_timeout_sec must be a positive number, got 'soon'$"),
    ("tb1", b"instruction: hi\nrun_tests_in_same_shell: 1\n",
     r"task\.yaml: run_tests_in_same_shell must be true or false, got 1$"),
    ("tb1", b"instruction: [hi]\n", r"task\.yaml: instruction must be a string, got \['hi'\]$"),
    ("tb1", b"descriptions:\n  - key: hard\n    description: x\n",
     r"task\.yaml: descriptions has no entry with key 'base'$"),
    ("tb1", b"difficulty: easy\n", r"task\.yaml: instruction is missing"),
    ("tb1", b"- just a list\n", r"task\.yaml: must hold a mapping at the top level, got list$"),
])
def test_bad_metadata(tmp_path, layout, text, message):
    base = HARBOR_FILES if layout == "harbor" else TB1_FILES
    name = "task.toml" if layout == "harbor" else "task.yaml"
    root = write_tree(tmp_path / "t1", {**base, name: text})
    with pytest.raises(BundleError, match=rf"^bundle {root}: {message}"):
        read_bundle(root)


def test_bad_solution_yaml(tmp_path):
    files = {**TB1_FILES, "solution.yaml": b"- command: 3\n"}
    del files["solution.sh"]
    root = write_tree(tmp_path / "t1", files)
    with pytest.raises(BundleError,
                       match=rf"^bundle {root}: solution\.yaml: \[0\]\.command must be a string, got 3$"):
        read_bundle(root)


@pytest.mark.parametrize("path, named, message", [
    ("/etc/passwd", "/etc/passwd", "path must be relative to the bundle, not absolute"),
    ("../escape.sh", "../escape.sh", r"path must stay inside the bundle \('\.\.' is refused\)"),
    ("tests/../../escape.sh", "tests/../../escape.sh", "path must stay inside the bundle"),
    ("tests//x", "tests//x", "path must be normalised"),
    ("tests\\x", "tests\\x", "path must be POSIX"),
    ("tests/test.sh/inner", "tests/test.sh", "is both a file and a folder"),
])
def test_bad_paths(harbor_dir, path, named, message):
    task = read_bundle(harbor_dir)
    with pytest.raises(BundleError, match=rf"^bundle {harbor_dir}: {re.escape(named)}: {message}"):
        task.with_file(path, b"x")
    with pytest.raises(BundleError, match=rf"^bundle t: {re.escape(named)}: {message}"):
        TaskBundle("t", "harbor", {**task.files, path: BundleFile(b"x")})


@pytest.mark.parametrize("link_to_dir", [False, True], ids=["file", "folder"])
def test_symlink_is_refused(harbor_dir, tmp_path, link_to_dir):
    target = tmp_path / ("secrets" if link_to_dir else "secret.txt")
    target.mkdir() if link_to_dir else target.write_text("key")
    (harbor_dir / "environment" / "link").symlink_to(target)
    with pytest.raises(BundleError, match=rf"^bundle {harbor_dir}: environment/link: is a symbolic link"):
        read_bundle(harbor_dir)


def test_fifo_is_refused(harbor_dir):
    os.mkfifo(harbor_dir / "tests" / "pipe")
    with pytest.raises(BundleError, match=rf"^bundle {harbor_dir}: tests/pipe: is not a regular file"):
        read_bundle(harbor_dir)


def test_file_over_size_limit(harbor_dir):
    (harbor_dir / "environment" / "big.bin").write_bytes(b"x" * 2048)
    with pytest.raises(BundleError, match=rf"^bundle {harbor_dir}: environment/big\.bin: is 2048 bytes, "
                                          r"over the limit of 1024 bytes"):
        read_bundle(harbor_dir, max_file_bytes=1024)
    assert read_bundle(harbor_dir, max_file_bytes=4096).files["environment/big.bin"].data == b"x" * 2048


@pytest.mark.parametrize("layout, name", [("harbor", "instruction.md"), ("tb1", "task.yaml")])
def test_non_utf8_instruction(tmp_path, layout, name):
    base = HARBOR_FILES if layout == "harbor" else TB1_FILES
    root = write_tree(tmp_path / "t1", {**base, name: b"instruction: caf\xe9\n"})
    with pytest.raises(BundleError, match=rf"^bundle {root}: {name}: not valid UTF-8 \(invalid continuation "
                                          r"byte at byte offset 16\)"):
        read_bundle(root)


def test_layout_markers(tmp_path):
    both = write_tree(tmp_path / "both", {**HARBOR_FILES, "task.yaml": TB1_YAML})
    with pytest.raises(BundleError,
                       match=rf"^bundle {both}: task\.toml: task\.toml \(Harbor\) and task\.yaml .* both"):
        read_bundle(both)
    neither = write_tree(tmp_path / "neither", {"Dockerfile": b"FROM x\n"})
    with pytest.raises(BundleError, match=rf"^bundle {neither}: task\.toml: missing: a bundle needs task\.toml"):
        read_bundle(neither)
    with pytest.raises(BundleError, match="not a directory"):
        read_bundle(tmp_path / "absent")


def test_bundle_built_in_memory_equals_the_one_read(harbor_dir):
    task = read_bundle(harbor_dir)
    files = {path: BundleFile(*content) for path, content in normalised(HARBOR_FILES).items()}
    built = TaskBundle("rebase-task", "harbor", files)
    assert built == task and built.metadata == task.metadata and built.instruction == task.instruction
    assert repr(built) == "TaskBundle(name='rebase-task', layout='harbor')"
    with pytest.raises(BundleError, match="^bundle t: files must map paths to BundleFiles, got list$"):
        TaskBundle("t", "harbor", [])


def test_write_refuses_a_non_empty_directory_unless_overwrite(harbor_dir, tmp_path):
    task = read_bundle(harbor_dir)
    out = tmp_path / "out"
    out.mkdir()
    write_bundle(task, out)
    with pytest.raises(BundleError, match=rf"^bundle {out}: cannot write rebase-task: the directory is not empty"):
        write_bundle(task, out)
    (out / "stale.txt").write_text("old")
    write_bundle(task, out, overwrite=True)
    assert tree_of(out) == normalised(HARBOR_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "rebase-task"]


@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_write_is_atomic(harbor_dir, tmp_path, monkeypatch, existing):
    task = read_bundle(harbor_dir)
    out = tmp_path / "out"
    if existing:
        write_tree(out, {"old.txt": b"keep me"})
    real_write = bundle_module._write_file
    calls = []

    def failing_write(root, path, entry):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        real_write(root, path, entry)

    monkeypatch.setattr(bundle_module, "_write_file", failing_write)
    with pytest.raises(OSError, match="disk full"):
        write_bundle(task, out, overwrite=True)
    assert len(calls) == 3
    assert (tree_of(out) if existing else out.exists()) == ({"old.txt": (b"keep me", False)} if existing else False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["rebase-task"] + (["out"] if existing else []))


def test_write_puts_the_old_bundle_back_when_the_final_rename_fails(harbor_dir, tmp_path, monkeypatch):
    out = write_tree(tmp_path / "out", {"old.txt": b"keep me"})
    real_replace = os.replace

    def failing_replace(source, target):
        if str(source).endswith(".tmp"):
            raise OSError("rename failed")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        write_bundle(read_bundle(harbor_dir), out, overwrite=True)
    assert tree_of(out) == {"old.txt": (b"keep me", False)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "rebase-task"]
