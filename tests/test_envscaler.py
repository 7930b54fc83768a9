"""EnvScaler RL-format loader on fixtures written in exactly that format."""

from __future__ import annotations

import copy
import json

import pytest

from envsched_jax.envs.inprocess import run_episode
from envsched_jax.pool.envscaler import load_envscaler_pool
from envsched_jax.pool.model import Action, PoolError, PoolValidationErrors
from envsched_jax.pool.sources import load_pool


def test_loads_environments_and_tasks(envscaler_pool):
    assert [e.env_id for e in envscaler_pool.environments] == ["env_151_rl", "env_152_rl"]
    assert [t.task_id for t in envscaler_pool.tasks] == [
        "env_151_rl-task_0", "env_151_rl-task_1", "env_152_rl-task_0"]
    bed = envscaler_pool.environment("env_151_rl")
    # `tools` is a JSON string in the file (as on hub copies): decoded into schemas.
    assert bed.tool_names == ("get_patient_by_name", "get_bed_status", "transfer_patient")
    assert [o.kind for o in bed.operations] == ["query", "query", "state_change"]
    # state_space_definition is a JSON string for env_152_rl: decoded as well.
    assert envscaler_pool.environment("env_152_rl").state_space[1]["entity"] == "Project"
    # init_config given as a JSON string (task 0) and as an object (task 1) decode identically.
    assert envscaler_pool.tasks[0].initial_state == envscaler_pool.tasks[1].initial_state
    assert envscaler_pool.tasks[0].checks[0].text == "Ana Ruiz is in bed B3"


def test_json_lines_task_file_gives_the_same_pool(envscaler_files, envscaler_pool):
    env_file, task_file = envscaler_files
    again = load_envscaler_pool(env_file, task_file.with_suffix(".jsonl"))
    assert again == envscaler_pool


def test_loaded_environment_executes_with_envscalers_rules(envscaler_pool):
    task = envscaler_pool.tasks[0]
    env = envscaler_pool.environment(task.env_id)
    assert task.metadata["semantics"] == "envscaler"
    good = [Action("get_patient_by_name", {"name": "Ana Ruiz"}),
            Action("transfer_patient", {"patient_id": "P1", "bed_id": "B3"}),
            Action("chat_with_user", {"content": "Task Completed"})]
    assert run_episode(env, task, good).reward == 1.0
    # EnvScaler rewards only an episode that chat_with_user ended
    unended = run_episode(env, task, good[:2])
    assert unended.reward == 0.0 and unended.end_reason == "actions_exhausted"
    assert unended.check_errors[0].startswith("unscored: the episode did not end at")
    wrong = [Action("transfer_patient", {"patient_id": "P1", "bed_id": "B2"}), good[2]]
    assert run_episode(env, task, wrong).reward == pytest.approx(round(1 / 3, 4))


def _dump(tmp_path, envs, tasks):
    env_file, task_file = tmp_path / "envs.json", tmp_path / "tasks.json"
    env_file.write_text(json.dumps(envs))
    task_file.write_text(json.dumps(tasks))
    return env_file, task_file


@pytest.fixture()
def raw(envscaler_files):
    env_file, task_file = envscaler_files
    return json.loads(env_file.read_text()), json.loads(task_file.read_text())


def test_errors_name_file_record_and_envscaler_field(tmp_path, raw):
    envs, tasks = raw
    envs["env_152_rl"]["operation_list"][1]["operation_type"] = "mutation"
    del envs["env_151_rl"]["env_class_code"]
    tasks[1]["checklist_with_func"][0]["check_func"] = 7
    tasks[2]["init_config"] = "{not json"
    env_file, task_file = _dump(tmp_path, envs, tasks)
    with pytest.raises(PoolValidationErrors) as info:
        load_envscaler_pool(env_file, task_file)
    # A whole-file JSON document: json reports no line for a parsed value, so the record number.
    got = {(p.source, p.record, p.field) for p in info.value.problems}
    assert (str(env_file), 1, "env_class_code") in got
    assert (str(env_file), 2, "operation_list[1].operation_type") in got
    assert (str(task_file), 2, "checklist_with_func[0].check_func") in got
    assert (str(task_file), 3, "init_config") in got
    assert f"{task_file}, record 3, field 'init_config'" in str(info.value)


def test_empty_checklist_reported_or_dropped(tmp_path, raw):
    envs, tasks = raw
    tasks[1]["checklist_with_func"] = []
    env_file, task_file = _dump(tmp_path, envs, tasks)
    with pytest.raises(PoolValidationErrors, match="empty checklist"):
        load_envscaler_pool(env_file, task_file)
    pool = load_envscaler_pool(env_file, task_file, drop_invalid=True)
    assert [t.task_id for t in pool.tasks] == ["env_151_rl-task_0", "env_152_rl-task_0"]
    assert len(pool.dropped) == 1 and "env_151_rl-task_1" in pool.dropped[0]


def test_list_form_environment_file_and_no_input_mutation(tmp_path, raw):
    envs, tasks = raw
    before = copy.deepcopy((envs, tasks))
    env_file, task_file = _dump(tmp_path, list(envs.values()), tasks)
    pool = load_envscaler_pool(env_file, task_file)
    assert pool.num_tasks == 3
    assert (envs, tasks) == before


def test_loads_what_envscalers_runner_reads_and_nothing_more(tmp_path, raw):
    """No environment_summary, no check_item, and check_func strings that define nothing: EnvScaler's
    runner reads none of the first two and counts such a check 0, so the tasks load."""
    envs, tasks = raw
    del envs["env_151_rl"]["environment_summary"]
    del tasks[0]["checklist_with_func"][0]["check_item"]
    tasks[0]["checklist_with_func"][1]["check_func"] = ""
    tasks[0]["checklist_with_func"][2]["check_func"] = "return True"
    pool = load_envscaler_pool(*_dump(tmp_path, envs, tasks))
    task = pool.tasks[0]
    assert pool.environment("env_151_rl").summary == ""
    assert [c.text for c in task.checks][:2] == ["", "Bed B3 lists Ana Ruiz as occupant"]
    result = run_episode(pool.environment(task.env_id), task,
                         [Action("transfer_patient", {"patient_id": "P1", "bed_id": "B3"}),
                          Action("chat_with_user", {"content": "Task Completed"})])
    assert result.check_results == (True, False, False)
    assert "defines no check_func" in result.check_errors[1]
    assert result.check_errors[2].startswith("SyntaxError")


def test_a_class_name_that_differs_from_the_environments_is_an_error(tmp_path, raw):
    envs, tasks = raw
    tasks[2]["env_class_name"] = "SomethingElse"
    env_file, task_file = _dump(tmp_path, envs, tasks)
    with pytest.raises(PoolValidationErrors) as info:
        load_envscaler_pool(env_file, task_file)
    (problem,) = info.value.problems
    assert (problem.source, problem.record, problem.field) == (str(task_file), 3, "env_class_name")
    assert "names class 'SomethingElse'" in str(problem)
    pool = load_envscaler_pool(env_file, task_file, drop_invalid=True)
    assert pool.num_tasks == 2 and "SomethingElse" in pool.dropped[0]


def test_options_and_pool_spec(envscaler_files):
    env_file, task_file = envscaler_files
    pool = load_pool(f"envscaler:{env_file}:{task_file},private_methods=refuse,mode=conversational")
    task = pool.tasks[0]
    assert task.metadata["private_methods"] == "refuse"
    assert task.metadata["user_mode"] == "simulated" and task.metadata["user_brief"] == task.instruction
    assert load_pool(f"envscaler:{env_file}:{task_file}").tasks[0].metadata["private_methods"] == "allow"
    with pytest.raises(PoolError, match=r"unknown option\(s\) \['privat'\]"):
        load_pool(f"envscaler:{env_file}:{task_file},privat=refuse")
    with pytest.raises(PoolError, match="mode must be one of"):
        load_envscaler_pool(env_file, task_file, mode="chatty")
    with pytest.raises(PoolError, match="private_methods must be one of"):
        load_envscaler_pool(env_file, task_file, private_methods="sometimes")
