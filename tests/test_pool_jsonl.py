"""Canonical JSON-lines form: validation errors name file, line and field; nothing is mutated."""

from __future__ import annotations

import copy
import json

import pytest

from envsched_jax.pool.jsonl import read_pool, task_from_json, write_pool
from envsched_jax.pool.model import PoolError, PoolValidationErrors


def _records(pool):
    return [e.to_json() for e in pool.environments] + [t.to_json() for t in pool.tasks]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_round_trip_is_identity(envscaler_pool, tmp_path):
    path = write_pool(envscaler_pool, tmp_path / "pool.jsonl")
    again = read_pool(path, name=envscaler_pool.name)
    assert again == envscaler_pool
    assert again.content_hash() == envscaler_pool.content_hash()


@pytest.mark.parametrize(
    "mutate, line_of, field",
    [
        (lambda recs: recs[2].pop("instruction"), 3, "instruction"),
        (lambda recs: recs[3].__setitem__("checks", "not a list"), 4, "checks"),
        (lambda recs: recs[2]["checks"][0].pop("code"), 3, "checks[0].code"),
        (lambda recs: recs[2].__setitem__("instrucion", "typo"), 3, "instrucion"),
        (lambda recs: recs[0]["tools"][1]["function"].pop("name"), 1, "tools[1].name"),
        (lambda recs: recs[2].__setitem__("reference_actions", [{"name": "", "arguments": {}}]), 3,
         "reference_actions[0].name"),
        (lambda recs: recs[0].__setitem__("kind", "environmnt"), 1, "kind"),
    ],
)
def test_malformed_record_names_file_line_field(envscaler_pool, tmp_path, mutate, line_of, field):
    recs = _records(envscaler_pool)
    mutate(recs)
    path = _write(tmp_path / "bad.jsonl", recs)
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    problem = next(p for p in info.value.problems if p.line == line_of)
    assert problem.source == str(path)
    assert problem.field == field
    assert str(path) in str(info.value) and f"line {line_of}" in str(info.value)


def test_invalid_json_line(envscaler_pool, tmp_path):
    path = tmp_path / "broken.jsonl"
    lines = [json.dumps(r) for r in _records(envscaler_pool)]
    lines[3] = lines[3][:-5]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    assert [p.line for p in info.value.problems] == [4]
    assert "invalid JSON" in str(info.value)


def test_cross_record_problems_are_all_reported(envscaler_pool, tmp_path):
    recs = _records(envscaler_pool)
    dup_task = copy.deepcopy(recs[2])                       # duplicate task id
    orphan = copy.deepcopy(recs[3]) | {"task_id": "x-1", "env_id": "env_999"}
    empty = copy.deepcopy(recs[4]) | {"task_id": "x-2", "checks": []}
    dup_env = copy.deepcopy(recs[1])
    path = _write(tmp_path / "p.jsonl", recs[:2] + [dup_env] + recs[2:] + [dup_task, orphan, empty])
    with pytest.raises(PoolValidationErrors) as info:
        read_pool(path)
    reasons = sorted((p.line, p.field) for p in info.value.problems)
    assert reasons == [(3, "env_id"), (7, "task_id"), (8, "env_id"), (9, "checks")]
    text = str(info.value)
    assert "duplicate environment id 'env_152_rl'" in text and "duplicate task id" in text
    assert "unknown environment 'env_999'" in text and "empty checklist" in text


def test_drop_invalid_keeps_the_rest_and_lists_problems(envscaler_pool, tmp_path):
    recs = _records(envscaler_pool)
    empty = copy.deepcopy(recs[4]) | {"task_id": "x-2", "checks": []}
    path = _write(tmp_path / "p.jsonl", recs + [empty])
    pool = read_pool(path, drop_invalid=True, name=envscaler_pool.name)
    assert pool == envscaler_pool
    assert len(pool.dropped) == 1 and "x-2" in pool.dropped[0] and "line 6" in pool.dropped[0]


def test_parsing_does_not_mutate_or_alias_input(envscaler_pool):
    record = envscaler_pool.tasks[0].to_json()
    before = copy.deepcopy(record)
    task = task_from_json(record)
    assert record == before
    record["initial_state"]["patients"]["P1"]["name"] = "changed"
    assert task.initial_state["patients"]["P1"]["name"] == "Ana Ruiz"


def test_missing_file_is_named(tmp_path):
    with pytest.raises(PoolError, match="no such pool file") as info:
        read_pool(tmp_path / "nope.jsonl")
    assert str(tmp_path / "nope.jsonl") in str(info.value)
