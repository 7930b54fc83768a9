"""The embedded default pool: shape, executability of every task, and the canonical JSONL form."""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json

import pytest

from envsched_jax.envs.inprocess import instantiate, load_class, run_episode, snapshot_state
from envsched_jax.pool.embedded import EMBEDDED_ENV_IDS, load_embedded_pool, write_embedded_jsonl, wrong_action_sequences
from envsched_jax.pool.jsonl import read_pool
from envsched_jax.pool.model import Action, tool_function

SHAPES = {"lookup_update", "reassign_gated", "create_gated", "authorized_delete", "multi_step", "filter_bulk_update"}


@pytest.fixture(scope="module")
def pool():
    return load_embedded_pool()


def _by_env(pool):
    out = collections.defaultdict(list)
    for t in pool.tasks:
        out[t.env_id].append(t)
    return out


def test_pool_shape(pool):
    assert pool.name == "embedded"
    assert tuple(e.env_id for e in pool.environments) == EMBEDDED_ENV_IDS
    assert len(EMBEDDED_ENV_IDS) >= 8 and len(set(EMBEDDED_ENV_IDS)) == len(EMBEDDED_ENV_IDS)
    tasks = _by_env(pool)
    # tasks are grouped by environment, in environment order, with ids <env>-task_<k>
    assert [t.env_id for t in pool.tasks] == [e for e in EMBEDDED_ENV_IDS for _ in tasks[e]]
    for env in pool.environments:
        assert len(tasks[env.env_id]) >= 20
        assert [t.task_id for t in tasks[env.env_id]] == [f"{env.env_id}-task_{k}" for k in range(len(tasks[env.env_id]))]
        assert 6 <= len(env.tools) <= 10
        assert env.trusted_class is not None and env.class_source
        assert env.summary and env.state_space and env.constraints
        assert {o.name for o in env.operations} == set(env.tool_names)
        assert {o.kind for o in env.operations} == {"query", "state_change"}
        assert {t.metadata["shape"] for t in tasks[env.env_id]} == SHAPES
        assert any(t.metadata["gate"] == "fail" for t in tasks[env.env_id])
    for t in pool.tasks:
        assert len(t.checks) >= 3
        assert all(c.code.startswith("def check_func(final_state):") for c in t.checks)
        assert t.reference_actions and t.reference_actions[-1].name == "chat_with_user"


def test_every_reference_sequence_scores_one(pool):
    for t in pool.tasks:
        env = pool.environment(t.env_id)
        result = run_episode(env, t, t.reference_actions)
        assert result.reward == 1.0, (t.task_id, result.check_results, result.check_errors)
        assert result.end_reason == "chat_with_user"
        # every reference tool call succeeds
        assert all(o.get("success") for o in result.observations), (t.task_id, result.observations)


def test_no_actions_scores_below_one(pool):
    for t in pool.tasks:
        result = run_episode(pool.environment(t.env_id), t, [])
        assert result.reward < 1.0, t.task_id


def test_wrong_sequences_score_below_one(pool):
    wrong = wrong_action_sequences()
    per_env = collections.Counter(task_id.split("-task_")[0] for task_id in wrong)
    assert all(per_env[e] >= 1 for e in EMBEDDED_ENV_IDS), per_env
    for task_id, sequences in wrong.items():
        t = pool.tasks[pool.task_index(task_id)]
        for seq in sequences:
            result = run_episode(pool.environment(t.env_id), t, seq)
            assert result.reward < 1.0, (task_id, seq)


def test_operation_mixes_vary_within_env(pool):
    for env_id, tasks in _by_env(pool).items():
        mixes = {frozenset(a.name for a in t.reference_actions) for t in tasks}
        assert len(mixes) >= 4, env_id
        instructions = [t.instruction for t in tasks]
        assert len(set(instructions)) == len(instructions), env_id


def test_shapes_shared_across_envs(pool):
    shapes = collections.defaultdict(set)
    for t in pool.tasks:
        shapes[t.metadata["shape"]].add(t.env_id)
    assert all(shapes[s] == set(EMBEDDED_ENV_IDS) for s in SHAPES)


def test_tool_schemas_match_signatures(pool):
    for env in pool.environments:
        cls = env.trusted_class
        public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        assert set(env.tool_names) == public, env.env_id
        for schema in env.tools:
            assert schema["type"] == "function"
            fn = tool_function(schema)
            assert fn["description"]
            params = dict(inspect.signature(getattr(cls, fn["name"])).parameters)
            params.pop("self")
            props, required = fn["parameters"]["properties"], fn["parameters"]["required"]
            assert fn["parameters"]["type"] == "object"
            assert set(props) == set(params), (env.env_id, fn["name"])
            assert set(required) <= set(props)
            for name in required:
                assert params[name].default is inspect.Parameter.empty, (env.env_id, fn["name"], name)
            for name, p in params.items():
                assert (p.default is inspect.Parameter.empty) == (name in required), (env.env_id, fn["name"], name)
                assert props[name]["description"] and props[name]["type"] in {"string", "integer", "number", "boolean"}


def test_reference_actions_name_real_tools(pool):
    for t in pool.tasks:
        names = set(pool.environment(t.env_id).tool_names)
        assert all(a.name in names for a in t.reference_actions[:-1]), t.task_id


@pytest.mark.parametrize("bad", [None, 7, "", "ZZZ-unknown", ["x"], {"a": 1}, -5, True])
def test_tools_never_raise_on_bad_input(pool, bad):
    """Every tool answers malformed or unknown arguments with an error dict; state-changing tools
    then change nothing."""
    for env in pool.environments:
        first = next(t for t in pool.tasks if t.env_id == env.env_id)
        instance = instantiate(env.trusted_class, first.initial_state)
        kinds = {o.name: o.kind for o in env.operations}
        for schema in env.tools:
            fn = tool_function(schema)
            before = snapshot_state(instance)
            out = getattr(instance, fn["name"])(**{name: bad for name in fn["parameters"]["properties"]})
            assert isinstance(out, dict) and isinstance(out.get("success"), bool), (env.env_id, fn["name"], bad)
            if kinds[fn["name"]] == "state_change":
                assert out["success"] is False and "error" in out, (env.env_id, fn["name"], bad, out)
                assert snapshot_state(instance) == before, (env.env_id, fn["name"], bad)


def test_class_source_runs_standalone(pool):
    for env in pool.environments:
        untrusted = dataclasses.replace(env, trusted_class=None)
        cls = load_class(untrusted)
        assert cls.__name__ == env.class_name and cls is not env.trusted_class


def test_jsonl_round_trip(pool, tmp_path):
    path = write_embedded_jsonl(tmp_path / "embedded.jsonl")
    loaded = read_pool(path, name="embedded")
    assert loaded == pool
    assert loaded.content_hash() == pool.content_hash()
    assert all(e.trusted_class is None for e in loaded.environments)
    # the on-disk form executes the same way from class_source alone
    for t in loaded.tasks[::5]:
        assert run_episode(loaded.environment(t.env_id), t, t.reference_actions).reward == 1.0, t.task_id


def test_load_is_deterministic(pool):
    again = load_embedded_pool()
    assert again == pool
    assert again.content_hash() == pool.content_hash()
    assert [t.to_json() for t in again.tasks] == [t.to_json() for t in pool.tasks]


def test_initial_states_vary(pool):
    for env_id, tasks in _by_env(pool).items():
        distinct = {json.dumps(t.initial_state, sort_keys=True) for t in tasks}
        assert len(distinct) >= 4, env_id


def test_actions_are_json_records(pool):
    for t in pool.tasks:
        assert all(isinstance(a, Action) and a.turn == 0 for a in t.reference_actions)


def test_identifier_filter_finds_nothing_in_reference_actions(pool):
    """Every identifier a reference sequence uses is in the instruction or an earlier observation:
    the identifier filter raises no suspicion and filters none of the tasks. A copy of a reference
    sequence with its revealing lookup dropped is still caught, so the check can fail."""
    from envsched_jax.envs.episode import run_actions
    from envsched_jax.envs.identifier_filter import identifier_filter
    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool

    with make_worker_pool(SandboxConfig(kind="inprocess")) as workers:
        reference = [run_actions(workers, pool.environment(t.env_id), t, t.reference_actions)
                     for t in pool.tasks]
        report = identifier_filter(reference, pool, workers)
        assert report.examined == len(pool.tasks)
        assert not report.replay_mismatches
        assert report.suspicions == (), [s.detail for s in report.suspicions]
        assert report.filtered_task_ids == ()

        # broken copies: the fallback member's lookup, and the listing that shows the old booking, dropped
        broken = []
        for task_id, drop in [("library_lending-task_6", ("find_member_by_name", {"name": "Farid Aziz"})),
                              ("room_booking-task_16", ("list_bookings", {}))]:
            t = pool.tasks[pool.task_index(task_id)]
            actions = [a for a in t.reference_actions if (a.name, a.arguments) != drop]
            assert len(actions) == len(t.reference_actions) - 1, task_id
            broken.append(run_actions(workers, pool.environment(t.env_id), t, actions))
        assert all(tr.reward == 1.0 for tr in broken)
        caught = identifier_filter(broken, pool, workers)
    assert caught.filtered_task_ids == ("library_lending-task_6", "room_booking-task_16")
    assert {s.action for s in caught.suspicions if s.confirmed} == {"transfer_loan", "cancel_booking"}
