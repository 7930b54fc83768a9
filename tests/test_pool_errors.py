"""Broken pool files give one PoolError naming the file and the line, through every loader and
through `envsched pool inspect` (message, exit status 1, no traceback); an empty pool is an error.

The cases: bytes that are not UTF-8, nesting deeper than MAX_DEPTH (both below and above the
depth where json itself raises RecursionError), integers over Python's digit limit, duplicate
keys, and files without records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envsched_jax.pool import load_pool
from envsched_jax.pool.envscaler import load_envscaler_pool
from envsched_jax.pool.jsonl import read_pool, write_pool
from envsched_jax.pool.model import MAX_DEPTH, Pool, PoolError, PoolValidationErrors

ROOT = Path(__file__).resolve().parents[1]
LONG_INT = "7" * (sys.get_int_max_str_digits() + 1)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _canonical_lines(pool) -> list[str]:
    return ([json.dumps(e.to_json()) for e in pool.environments]
            + [json.dumps(t.to_json()) for t in pool.tasks])


def _with_initial_state(line: str, state_json: str) -> str:
    """A canonical task line whose initial_state is replaced by raw JSON text."""
    record = json.loads(line)
    record["initial_state"] = {"x": "PLACEHOLDER"}
    return json.dumps(record).replace('"PLACEHOLDER"', state_json)


def _problem(info) -> PoolError:
    """The single problem behind a loader's error."""
    err = info.value
    if isinstance(err, PoolValidationErrors):
        assert len(err.problems) == 1, err
        return err.problems[0]
    return err


# -- canonical JSON lines ----------------------------------------------------------------------

@pytest.fixture()
def lines(envscaler_pool) -> list[str]:
    return _canonical_lines(envscaler_pool)   # lines 1-2 environments, 3-5 tasks


def _write_lines(tmp_path, lines: list[str], raw: dict[int, bytes] | None = None) -> Path:
    data = [ln.encode() for ln in lines]
    for line_no, content in (raw or {}).items():
        data[line_no - 1] = content
    path = tmp_path / "pool.jsonl"
    path.write_bytes(b"\n".join(data) + b"\n")
    return path


def test_non_utf8_line_is_named(tmp_path, lines):
    path = _write_lines(tmp_path, lines, {4: lines[3].encode().replace(b"Tom", b"T\xffm", 1)})
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    problem = _problem(info)
    assert (problem.source, problem.line) == (str(path), 4)
    assert "not valid UTF-8: byte 0xff at column" in str(problem)
    assert str(info.value).startswith("1 problem(s) in the task pool:")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])   # our limit; json's RecursionError
def test_deep_nesting_is_named(tmp_path, lines, depth):
    path = _write_lines(tmp_path, lines[:3] + [_with_initial_state(lines[3], _nested(depth))] + lines[4:])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    problem = _problem(info)
    assert problem.line == 4
    assert f"nested deeper than {MAX_DEPTH} levels ({depth + 2} levels at column" in str(problem)


def test_over_long_integer_is_named(tmp_path, lines):
    path = _write_lines(tmp_path, lines[:4] + [_with_initial_state(lines[4], LONG_INT)])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    problem = _problem(info)
    assert problem.line == 5
    assert f"an integer has more than {sys.get_int_max_str_digits()} digits" in str(problem)


def test_duplicate_key_is_named(tmp_path, lines):
    dup = lines[2][:-1] + ', "task_id": "shadow"}'
    path = _write_lines(tmp_path, lines[:2] + [dup] + lines[3:])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    problem = _problem(info)
    assert problem.line == 3
    assert "duplicate key 'task_id' in the object that starts at column 1" in str(problem)


def test_nested_duplicate_key_is_named(tmp_path, lines):
    path = _write_lines(tmp_path, lines[:3] + [_with_initial_state(lines[3], '{"a": 1, "a": 2}')] + lines[4:])
    with pytest.raises(PoolValidationErrors, match="line 4: duplicate key 'a'"):
        read_pool(path)


@pytest.mark.parametrize("content, message", [
    (b"", "no records: the file is empty"),
    (b"\n  \n\n", "no records: the file has 3 line(s), all blank"),
])
def test_file_without_records_is_an_error(tmp_path, content, message):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(PoolError) as info:
        read_pool(path)
    assert str(info.value) == f"{path}: {message}"


def test_pool_without_tasks_or_environments_is_an_error(tmp_path, lines):
    path = _write_lines(tmp_path, lines[:2])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    assert f"{path}: no task record (no line has \"kind\": \"task\")" in str(info.value)
    path = _write_lines(tmp_path, lines[2:])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    assert f"{path}: no environment record" in str(info.value)


def test_dropping_every_task_leaves_an_error_not_an_empty_pool(tmp_path, lines):
    tasks = [json.loads(ln) | {"checks": []} for ln in lines[2:]]
    path = _write_lines(tmp_path, lines[:2] + [json.dumps(t) for t in tasks])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path, drop_invalid=True)
    text = str(info.value)
    assert text.count("empty checklist") == 3
    assert "no valid task is left after leaving out the records above" in text


def test_hand_built_empty_pool_is_refused(envscaler_pool):
    with pytest.raises(PoolError, match=r"pool 'none' has 2 environment\(s\) and 0 task\(s\)"):
        Pool("none", envscaler_pool.environments, ())
    with pytest.raises(PoolError, match="has 0 environment"):
        Pool("none", (), ())


def test_a_good_pool_still_round_trips(tmp_path, envscaler_pool):
    path = write_pool(envscaler_pool, tmp_path / "pool.jsonl")
    assert read_pool(path, name=envscaler_pool.name) == envscaler_pool


# -- EnvScaler files (whole-file JSON documents and JSON lines) -------------------------------

@pytest.fixture()
def envscaler_text(envscaler_files) -> tuple[Path, str]:
    """The environment file and the task file's text, pretty-printed one key per line."""
    env_file, task_file = envscaler_files
    return env_file, json.dumps(json.loads(task_file.read_text()), indent=1)


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


def test_envscaler_non_utf8_names_the_line(tmp_path, envscaler_text):
    env_file, text = envscaler_text
    bad = tmp_path / "tasks.json"
    bad.write_bytes(text.encode().replace(b"Move patient", b"Move \xc3(patient", 1))
    with pytest.raises(PoolError) as info:
        load_envscaler_pool(env_file, bad)
    assert info.value.line == _line_of(text, "Move patient")
    assert f"{bad}, line {info.value.line}: not valid UTF-8: byte 0xc3" in str(info.value)


def test_envscaler_deep_nesting_names_the_line(tmp_path, envscaler_text):
    env_file, text = envscaler_text
    bad = tmp_path / "tasks.json"
    bad.write_text(text.replace('"task": "Move patient', f'"deep": {_nested(5000)},\n  "task": "Move patient', 1))
    with pytest.raises(PoolError) as info:
        load_envscaler_pool(env_file, bad)
    assert info.value.line == _line_of(text, "Move patient")
    assert f"nested deeper than {MAX_DEPTH} levels (5002 levels" in str(info.value)


def test_envscaler_over_long_integer_names_the_line(tmp_path, envscaler_text):
    env_file, text = envscaler_text
    bad = tmp_path / "tasks.json"
    bad.write_text(text.replace('"task": "Move patient', f'"big": {LONG_INT},\n  "task": "Move patient', 1))
    with pytest.raises(PoolError) as info:
        load_envscaler_pool(env_file, bad)
    assert info.value.line == _line_of(text, "Move patient")
    assert "an integer has more than" in str(info.value)


def test_envscaler_duplicate_key_names_the_object_line(tmp_path, envscaler_files):
    env_file, task_file = envscaler_files
    pieces = [json.dumps(r, indent=1) for r in json.loads(task_file.read_text())]
    pieces[1] = pieces[1].replace('"task_id":', '"task_id": "shadow",\n "task_id":', 1)
    bad = tmp_path / "tasks.json"
    bad.write_text("[\n" + ",\n".join(pieces) + "\n]\n")
    with pytest.raises(PoolError) as info:
        load_envscaler_pool(env_file, bad)
    second_record_line = 2 + pieces[0].count("\n") + 1     # "[" is line 1, record 1 starts on 2
    assert info.value.line == second_record_line
    assert "duplicate key 'task_id' in the object that starts at column 1" in str(info.value)


def test_envscaler_duplicate_key_inside_a_json_string_field(tmp_path, envscaler_files):
    env_file, task_file = envscaler_files
    tasks = json.loads(task_file.read_text())
    tasks[1]["init_config"] = '{"patients": {}, "patients": {}}'
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps(tasks))
    with pytest.raises(PoolValidationErrors) as info:
        load_envscaler_pool(env_file, bad)
    assert (f"{bad}, record 2, field 'init_config': string is not valid JSON: duplicate key "
            "'patients'") in str(info.value)


@pytest.mark.parametrize("content, message", [
    ("", "no records: the file is empty"),
    ("[]", "line 1: no records: the file holds an empty JSON list"),
    ("{}\n", "line 1: no records: the file holds an empty JSON object"),
])
def test_envscaler_file_without_records(tmp_path, envscaler_files, content, message):
    env_file, _ = envscaler_files
    empty = tmp_path / "tasks.json"
    empty.write_text(content)
    with pytest.raises(PoolError) as info:
        load_envscaler_pool(env_file, empty)
    assert str(info.value) == f"{empty}: {message}" or str(info.value) == f"{empty}, {message}"


def test_envscaler_json_lines_name_the_line(tmp_path, envscaler_files):
    env_file, task_file = envscaler_files
    lines = task_file.with_suffix(".jsonl").read_text().splitlines()
    lines[1] = lines[1][:-1] + ', "task": "again"}'
    bad = tmp_path / "tasks.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(PoolValidationErrors) as info:
        load_envscaler_pool(env_file, bad)
    assert f"{bad}, line 2: duplicate key 'task'" in str(info.value)


# -- the command line --------------------------------------------------------------------------

def _inspect(spec: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envsched_jax.cli", "pool", "inspect", spec],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_reports_each_broken_file_without_a_traceback(tmp_path, lines):
    cases = {
        "empty.jsonl": (b"", "no records: the file is empty"),
        "bytes.jsonl": (b"\n".join([ln.encode() for ln in lines[:2]] + [b'{"kind": "t\xffsk"}']),
                        "line 3: not valid UTF-8: byte 0xff at column 12"),
        "deep.jsonl": (_nested(5000).encode(), "line 1: nested deeper than 100 levels"),
        "big.jsonl": (f'{{"kind": {LONG_INT}}}'.encode(), "line 1: an integer has more than"),
        "dup.jsonl": (b'{"kind": "task", "kind": "task"}', "line 1: duplicate key 'kind'"),
        "envs-only.jsonl": ("\n".join(lines[:2]).encode(), 'no task record (no line has "kind": "task")'),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        res = _inspect(str(path))
        assert res.returncode == 1, (name, res.stdout, res.stderr)
        assert "Traceback" not in res.stdout + res.stderr, name
        assert f"cannot load pool '{path}':" in res.stdout, name
        assert f"{path}" in res.stdout and message in res.stdout, (name, res.stdout)


def test_cli_reports_an_empty_envscaler_file(tmp_path, envscaler_files):
    empty = tmp_path / "tasks.json"
    empty.write_text("[]")
    res = _inspect(f"envscaler:{envscaler_files[0]}:{empty}")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"{empty}, line 1: no records: the file holds an empty JSON list" in res.stdout


def test_load_pool_spec_reaches_the_same_errors(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n")
    with pytest.raises(PoolError, match="no records: the file has 2 line"):
        load_pool(str(path))
