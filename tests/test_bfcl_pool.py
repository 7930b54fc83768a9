"""The BFCL-v3 multi-turn pool loaded from the installed bfcl-eval package."""

from __future__ import annotations

import collections
import copy
import dataclasses
import importlib
import inspect
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (make installs it)")

from envsched_jax.envs.inprocess import load_class, run_episode  # noqa: E402
from envsched_jax.pool.bfcl import (  # noqa: E402
    BFCL_CATEGORIES,
    CALL_LOG,
    ERROR_PREFIX,
    INSTALL_HINT,
    default_data_dir,
    env_id_for,
    load_bfcl_pool,
)
from envsched_jax.pool.jsonl import read_pool, write_pool  # noqa: E402
from envsched_jax.pool.model import Action, PoolError  # noqa: E402

pytestmark = pytest.mark.bfcl

JSON_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean"}


@pytest.fixture(scope="module")
def pool():
    return load_bfcl_pool()


@pytest.fixture(scope="module")
def bfcl_classes():
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import CLASS_FILE_PATH_MAPPING

    return {name: getattr(importlib.import_module(module), name)
            for name, module in CLASS_FILE_PATH_MAPPING.items()}


def _task(pool, task_id):
    return pool.tasks[pool.task_index(task_id)]


def test_all_800_tasks_load_with_200_per_category(pool):
    assert pool.num_tasks == 800
    counts = collections.Counter(t.metadata["category"] for t in pool.tasks)
    assert counts == {c: 200 for c in BFCL_CATEGORIES}
    assert all(t.checks for t in pool.tasks)
    assert all(t.reference_actions for t in pool.tasks)
    assert all(len(t.user_turns) == t.metadata["num_turns"] for t in pool.tasks)
    assert all(max(a.turn for a in t.reference_actions) < len(t.user_turns) for t in pool.tasks)


def test_environment_ids_are_the_class_sets(pool):
    class_sets = {tuple(sorted(t.metadata["involved_classes"])) for t in pool.tasks}
    assert {e.env_id for e in pool.environments} == {env_id_for(s) for s in class_sets}
    for task in pool.tasks:
        assert task.env_id == "bfcl:" + "+".join(sorted(task.metadata["involved_classes"]))
        env = pool.environment(task.env_id)
        assert env.metadata["involved_classes"] == sorted(task.metadata["involved_classes"])
    assert "bfcl:GorillaFileSystem+TwitterAPI" in {e.env_id for e in pool.environments}


def _assert_json_schema(schema, where):
    assert schema["type"] in JSON_SCHEMA_TYPES, where
    for key, sub in schema.get("properties", {}).items():
        _assert_json_schema(sub, f"{where}.{key}")
    if "items" in schema:
        _assert_json_schema(schema["items"], f"{where}[]")


def test_tool_schemas_are_valid_and_match_the_methods(pool, bfcl_classes):
    quirks = set()
    for env in pool.environments:
        quirks.update(env.metadata["doc_quirks"])
        owner = env.metadata["tool_owner"]
        # every public method of every involved class is a tool, and nothing else is
        expected = {n for c in env.metadata["involved_classes"]
                    for n, _ in inspect.getmembers(bfcl_classes[c], inspect.isfunction)
                    if not n.startswith("_")}
        assert set(env.tool_names) == expected
        composite = load_class(env)
        assert {n for n in dir(composite) if not n.startswith("_")} == expected
        for tool in env.tools:
            assert tool["type"] == "function"
            fn = tool["function"]
            params = fn["parameters"]
            assert params["type"] == "object"
            _assert_json_schema(params, fn["name"])
            sig = inspect.signature(getattr(bfcl_classes[owner[fn["name"]]], fn["name"]))
            method_params = {p.name: p for p in list(sig.parameters.values())[1:]}
            required = {n for n, p in method_params.items() if p.default is p.empty}
            assert set(params.get("required", [])) == required, fn["name"]
            extra = set(params["properties"]) - set(method_params)
            if fn["name"] == "delete_message":
                assert extra == {"message_id"}  # a BFCL doc quirk, kept and reported
            else:
                assert not extra, fn["name"]
    assert any("delete_message" in q for q in quirks)
    assert any("purchase_insurance" in q for q in quirks)
    cat = pool.environment("bfcl:GorillaFileSystem+TwitterAPI").tools[0]["function"]
    assert cat["name"] == "cat" and cat["parameters"]["required"] == ["file_name"]
    fuel = next(t["function"] for t in pool.environment("bfcl:TicketAPI+VehicleControlAPI").tools
                if t["function"]["name"] == "fillFuelTank")
    assert fuel["parameters"]["properties"]["fuelAmount"]["type"] == "number"


def test_reference_actions_on_hand_checked_examples(pool):
    base0 = _task(pool, "multi_turn_base_0")
    assert [a for a in base0.reference_actions if a.turn == 0] == [
        Action("cd", {"folder": "document"}, 0),
        Action("mkdir", {"dir_name": "temp"}, 0),
        Action("mv", {"source": "final_report.pdf", "destination": "temp"}, 0),
    ]
    # positional arguments are bound to the parameter names
    assert [a for a in base0.reference_actions if a.turn == 2] == [
        Action("sort", {"file_name": "final_report.pdf"}, 2)]
    base31 = _task(pool, "multi_turn_base_31")
    assert Action("mean", {"numbers": [37]}, 1) in base31.reference_actions
    post = _task(pool, "multi_turn_base_52").reference_actions[4]
    assert post == Action("post_tweet", {"content": "Tires checked and engine purring smoothly!",
                                         "tags": ["#RoadTrip"], "mentions": ["@AutoUpdates"]}, 2)
    assert Action("fillFuelTank", {"fuelAmount": 15.0}, 0) in _task(
        pool, "multi_turn_base_55").reference_actions
    assert base0.user_turns[0].startswith("Move 'final_report.pdf' within document directory")
    assert base0.instruction == "\n".join(base0.user_turns)
    assert base0.initial_state["long_context"] is False
    assert set(base0.initial_state["initial_config"]) == {"GorillaFileSystem", "TwitterAPI"}
    assert _task(pool, "multi_turn_long_context_0").initial_state["long_context"] is True


def test_missing_function_and_turn_metadata(pool):
    task = _task(pool, "multi_turn_miss_func_0")
    assert task.metadata["missed_function"] == {"3": ["sort"]}
    assert task.metadata["withheld_tools"] == {"sort": 3}
    assert task.metadata["holdout_prompt"]
    assert task.user_turns[3] == "" and len(task.user_turns) == 5
    assert "\n\n" not in task.instruction
    assert [a.name for a in task.reference_actions if a.turn == 3] == ["sort"]
    assert task.metadata["turns_without_ground_truth"] == [2]
    assert "missed_function" not in _task(pool, "multi_turn_base_0").metadata
    assert _task(pool, "multi_turn_miss_param_0").metadata["turns_without_ground_truth"] == [3]
    mismatch = _task(pool, "multi_turn_base_154")
    assert mismatch.metadata["turn_count_mismatch"] == {"question_turns": 5,
                                                        "ground_truth_turns": 6}
    assert mismatch.user_turns[5] == ""


def test_reference_actions_score_one_and_empty_sequences_do_not(pool):
    base = [t for t in pool.tasks if t.metadata["category"] == "base"]
    others = [t for t in pool.tasks if t.metadata["category"] != "base"][::10]
    for task in base + others:
        env = pool.environment(task.env_id)
        result = run_episode(env, task, task.reference_actions)
        assert result.reward == 1.0, (task.task_id, result.check_errors)
        assert result.end_reason == "actions_exhausted"
    # Doing nothing fails every turn that has ground truth (BFCL: an empty turn is an error).
    for task in base:
        result = run_episode(pool.environment(task.env_id), task, [])
        responses = [ok for c, ok in zip(task.checks, result.check_results) if "calls a tool" in c.text]
        assert responses and not any(responses), task.task_id
        assert result.reward < 1.0, task.task_id


def test_state_checks_agree_with_bfcls_state_checker(pool):
    """Dropping one reference call: each per-class state check of the last turn with ground truth
    passes exactly when BFCL's own instance comparison (executing both call lists with BFCL's
    executor) says equal."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import _compare_instances
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    def call(a):
        return f"{a.name}(" + ",".join(f"{k}={v!r}" for k, v in a.arguments.items()) + ")"

    compared = differed = 0
    for n, task in enumerate(pool.tasks[::16]):
        env = pool.environment(task.env_id)
        acts = list(task.reference_actions)
        args = (task.initial_state["initial_config"], task.metadata["involved_classes"])
        lc = task.initial_state["long_context"]
        _, truth = execute_multi_turn_func_call([call(a) for a in acts], *args, f"envsched_gt{n}",
                                                task.task_id, long_context=lc)
        for drop in range(len(acts)):
            variant = acts[:drop] + acts[drop + 1:]
            _, model = execute_multi_turn_func_call([call(a) for a in variant], *args,
                                                    f"envsched_m{n}_{drop}", task.task_id,
                                                    long_context=lc)
            result = run_episode(env, task, variant)
            # The state checks of the last turn with ground truth see the final state.
            last = max(a.turn for a in acts)
            for check, ok in zip(task.checks, result.check_results):
                if check.text.startswith(f"Turn {last}: the state of "):
                    cls = check.text.split()[5]
                    same = _compare_instances(model[cls], truth[cls])[0]
                    assert ok == same, (task.task_id, drop, cls)
                    compared += 1
                    differed += not same
    assert compared > 300 and differed > 50


def test_tool_errors_are_reported_like_bfcl_and_logged(pool):
    task = _task(pool, "multi_turn_base_0")
    env = pool.environment(task.env_id)
    actions = [Action("cd", {"folder": "no_such_dir"}), Action("cd", {"bogus": 1}),
               Action("cd", {"folder": "document"})]
    result = run_episode(env, task, actions)
    assert result.end_reason == "actions_exhausted"
    assert result.observations[1].startswith(ERROR_PREFIX)
    assert [e["name"] for e in result.final_state[CALL_LOG]] == ["cd", "cd", "cd"]
    assert result.final_state[CALL_LOG][2]["result"] == result.observations[2]
    assert result.final_state["GorillaFileSystem"]["root"]["__class__"] == "Directory"


def test_malformed_and_missing_files_name_the_file_and_line(tmp_path):
    src = default_data_dir()
    data = tmp_path / "data"
    shutil.copytree(src / "multi_turn_func_doc", data / "multi_turn_func_doc")
    (data / "possible_answer").mkdir()
    name = "BFCL_v3_multi_turn_base.json"
    shutil.copy(src / "possible_answer" / name, data / "possible_answer" / name)
    lines = (src / name).read_text(encoding="utf-8").splitlines(keepends=True)
    (data / name).write_text("".join(lines[:2] + ['{"id": "broken",\n'] + lines[3:5]),
                             encoding="utf-8")
    with pytest.raises(PoolError) as err:
        load_bfcl_pool(("base",), data_dir=data)
    assert f"{data / name}, line 3" in str(err.value)
    assert "multi_turn_base_3" not in str(err.value)

    (data / name).write_text("".join(lines[:3]), encoding="utf-8")
    answers = (src / "possible_answer" / name).read_text(encoding="utf-8").splitlines(True)
    answers[1] = answers[1].replace("ls(a=True)", "ls(a=__import__('os'))")
    (data / "possible_answer" / name).write_text("".join(answers), encoding="utf-8")
    with pytest.raises(PoolError) as err:
        load_bfcl_pool(("base",), data_dir=data)
    assert f"{data / 'possible_answer' / name}, line 2" in str(err.value)
    assert "arguments must be literals" in str(err.value)

    (data / name).unlink()
    with pytest.raises(PoolError, match="missing BFCL data file") as err:
        load_bfcl_pool(("base",), data_dir=data)
    assert str(data / name) in str(err.value)

    with pytest.raises(PoolError, match="categories"):
        load_bfcl_pool(("base", "live"))


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(PoolError) as err:
        load_bfcl_pool(("base",))
    assert INSTALL_HINT in str(err.value) and "bfcl_eval" in str(err.value)


def test_loading_is_deterministic_and_leaves_bfcl_data_alone(pool, tmp_path):
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import long_context

    constants = {k: copy.deepcopy(v) for k, v in vars(long_context).items()
                 if k.isupper()}
    files = {p: p.read_bytes() for p in Path(default_data_dir()).glob("BFCL_v3_multi_turn_*.json")}
    for task in pool.tasks[600::20]:  # long-context episodes touch the shared extensions
        run_episode(pool.environment(task.env_id), task, task.reference_actions)
    again = load_bfcl_pool()
    assert again == pool
    assert again.content_hash() == pool.content_hash()
    assert {k: v for k, v in vars(long_context).items() if k.isupper()} == constants
    assert {p: p.read_bytes() for p in files} == files
    # the canonical JSON-lines form holds the whole pool
    written = write_pool(pool, tmp_path / "bfcl.jsonl")
    assert read_pool(written).content_hash() == pool.content_hash()


def test_episodes_do_not_leak_through_bfcl_module_constants(pool):
    """Long-context TravelAPI scenarios share the extension cards of ``bfcl_eval``'s
    ``long_context`` module; cancelling an extension booking refunds such a card. The change
    must stay inside the episode."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import long_context

    task = next(t for t in pool.tasks if t.metadata["category"] == "long_context"
                and "TravelAPI" in t.metadata["involved_classes"])
    env = pool.environment(task.env_id)
    token = task.initial_state["initial_config"]["TravelAPI"]["access_token"]
    cancel = [Action("cancel_booking", {"access_token": token, "booking_id": "booking_901"})]
    before = copy.deepcopy(long_context.CREDIT_CARD_EXTENSION)
    first = run_episode(env, task, cancel)
    assert first.observations == ('{"cancel_status": true}',)
    second = run_episode(env, task, cancel)
    assert second.final_state["TravelAPI"] == first.final_state["TravelAPI"]
    assert long_context.CREDIT_CARD_EXTENSION == before


def test_checks_are_made_turn_by_turn(pool):
    """Doing turn 0's calls one turn late reaches the same final state, but BFCL checks every turn:
    turn 0 fails (no call, and the state at its end differs), the later turns still pass."""
    task = _task(pool, "multi_turn_base_0")
    env = pool.environment(task.env_id)
    late = [dataclasses.replace(a, turn=max(a.turn, 1)) for a in task.reference_actions]
    on_time = run_episode(env, task, task.reference_actions)
    shifted = run_episode(env, task, late)
    assert on_time.reward == 1.0
    assert shifted.final_state == on_time.final_state
    failed = [c.text for c, ok in zip(task.checks, shifted.check_results) if not ok]
    assert failed and all(t.startswith("Turn 0:") for t in failed), failed
    assert any("calls a tool" in t for t in failed) and any("the state of" in t for t in failed)
