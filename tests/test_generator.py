"""Tests of the synthetic pool generator (envsched_jax.pool.generator).

Every environment class is compiled once per test session (``_classes``) and attached as the
trusted class of a copy of the environment, so replaying thousands of episodes does not re-exec
the source each time.
"""

from __future__ import annotations

import dataclasses
import inspect
import types

import numpy as np
import pytest

from envsched_jax.envs.inprocess import instantiate, load_class, run_episode
from envsched_jax.pool.generator import (
    DOMAINS,
    FAMILIES,
    generate_environment,
    generate_pool,
    generate_pool_of_size,
)
from envsched_jax.pool.jsonl import read_pool, write_pool
from envsched_jax.pool.model import Environment, tool_function

_CLASSES: dict[tuple[str, str], type] = {}


def _compiled(env: Environment) -> Environment:
    """``env`` with its class source compiled once (keyed by id and source) as trusted class."""
    key = (env.env_id, env.class_source)
    if key not in _CLASSES:
        _CLASSES[key] = load_class(env)
    return dataclasses.replace(env, trusted_class=_CLASSES[key])


@pytest.fixture(scope="module")
def small_pool():
    return generate_pool(6, 12, seed=7)


@pytest.fixture(scope="module")
def paper_pool():
    return generate_pool(51, 50, seed=0)


def _envs(pool) -> dict[str, Environment]:
    return {e.env_id: _compiled(e) for e in pool.environments}


# ---- determinism and sizes ----------------------------------------------------------------------

def test_same_seed_gives_identical_pool():
    a, b = generate_pool(6, 12, seed=3), generate_pool(6, 12, seed=3)
    assert a.content_hash() == b.content_hash()
    assert a == b


def test_different_seeds_differ():
    a, b = generate_pool(6, 12, seed=3), generate_pool(6, 12, seed=4)
    assert a.content_hash() != b.content_hash()
    assert [e.class_source for e in a.environments] != [e.class_source for e in b.environments]


def test_environment_k_independent_of_pool_size():
    five, ten = generate_pool(5, 8, seed=11), generate_pool(10, 8, seed=11)
    assert five.environments == ten.environments[:5]
    assert five.tasks == ten.tasks[:40]
    # The first n tasks of an environment do not depend on how many are requested either.
    env_a, tasks_a = generate_environment(11, 2, 5)
    env_b, tasks_b = generate_environment(11, 2, 20)
    assert env_a == env_b and tasks_a == tasks_b[:5]


def test_sizes():
    pool = generate_pool_of_size(137)
    assert pool.num_tasks == 137
    assert pool.num_environments == 3
    per_env = [sum(1 for t in pool.tasks if t.env_id == e.env_id) for e in pool.environments]
    assert per_env == [50, 50, 37]
    assert generate_pool_of_size(24, tasks_per_environment=12).num_environments == 2
    pool = generate_pool(4, 3)
    assert (pool.num_environments, pool.num_tasks) == (4, 12)
    with pytest.raises(ValueError):
        generate_pool(0, 5)
    with pytest.raises(ValueError):
        generate_pool_of_size(0)


# ---- executability --------------------------------------------------------------------------------

def test_every_reference_scores_one_and_doing_nothing_does_not(small_pool):
    envs = _envs(small_pool)
    for task in small_pool.tasks:
        env = envs[task.env_id]
        assert task.reference_actions[-1].name == "chat_with_user"
        result = run_episode(env, task, task.reference_actions)
        assert result.reward == 1.0, (task.task_id, task.instruction, result.check_errors,
                                      result.check_results, result.observations)
        assert result.end_reason == "chat_with_user"
        assert run_episode(env, task, []).reward < 1.0, task.task_id


def test_reference_actions_on_paper_sized_pool(paper_pool):
    assert (paper_pool.num_environments, paper_pool.num_tasks) == (51, 2550)
    envs = {e.env_id: e for e in paper_pool.environments}
    rng = np.random.default_rng(0)
    for k in rng.choice(paper_pool.num_tasks, size=200, replace=False):
        task = paper_pool.tasks[int(k)]
        result = run_episode(_compiled(envs[task.env_id]), task, task.reference_actions)
        assert result.reward == 1.0, (task.task_id, result.check_errors, result.observations)


def test_checks_and_states_are_well_formed(paper_pool):
    for task in paper_pool.tasks:
        assert len(task.checks) >= 3
        assert all(c.code.startswith("def check_func(final_state):") for c in task.checks)
        records = sum(len(v) for v in task.initial_state.values() if isinstance(v, dict))
        assert 5 <= records <= 20, (task.task_id, records)


def test_tools_never_raise_on_bad_input(small_pool):
    bad_values = [None, 12345, "no-such-id", ["x"], {"a": 1}, True, ""]
    for env in small_pool.environments:
        task = next(t for t in small_pool.tasks if t.env_id == env.env_id)
        instance = instantiate(_compiled(env).trusted_class, task.initial_state)
        for schema in env.tools:
            fn = tool_function(schema)
            params = list(fn["parameters"]["properties"])
            for value in bad_values:
                out = getattr(instance, fn["name"])(**{p: value for p in params})
                assert isinstance(out, dict) and isinstance(out.get("success"), bool)
                assert ("data" in out) if out["success"] else ("error" in out), (fn["name"], out)


# ---- structure ------------------------------------------------------------------------------------

def test_tool_schemas_match_method_signatures(paper_pool):
    for env in paper_pool.environments:
        module = types.ModuleType("generated")
        exec(compile(env.class_source, env.env_id, "exec"), module.__dict__)
        cls = module.__dict__[env.class_name]
        public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        assert public == set(env.tool_names), env.env_id
        assert [o.name for o in env.operations] == list(env.tool_names)
        for schema in env.tools:
            fn = tool_function(schema)
            sig = inspect.signature(getattr(cls, fn["name"]))
            params = [p for p in sig.parameters.values() if p.name != "self"]
            assert [p.name for p in params] == list(fn["parameters"]["properties"]), fn["name"]
            required = [p.name for p in params if p.default is inspect.Parameter.empty]
            assert required == fn["parameters"]["required"], fn["name"]
            json_type = {"int": "integer", "str": "string"}
            for p in params:
                annotation = getattr(p.annotation, "__name__", p.annotation)
                assert fn["parameters"]["properties"][p.name]["type"] == json_type[annotation]


def test_domains_families_and_templates(paper_pool):
    domains = {e.metadata["domain"] for e in paper_pool.environments}
    assert len(DOMAINS) >= 40 and len(domains) >= 40
    assert len({e.class_name for e in paper_pool.environments}) == 51
    assert len({e.summary for e in paper_pool.environments}) == 51
    for env in paper_pool.environments:
        fams = env.metadata["families"]
        assert 5 <= len(fams) <= 9 and set(fams) <= set(FAMILIES)
        tasks = [t for t in paper_pool.tasks if t.env_id == env.env_id]
        assert len({t.metadata["template"] for t in tasks}) >= 3
        assert all(set(t.metadata["families"]) <= set(fams) for t in tasks)
        assert len({t.instruction for t in tasks}) >= 0.9 * len(tasks)  # few short templates repeat
        assert len({repr(t.to_json() | {"task_id": ""}) for t in tasks}) == len(tasks)
    # The same template recurs across domains: that is the cross-environment structure.
    by_template: dict[str, set[str]] = {}
    for task in paper_pool.tasks:
        by_template.setdefault(task.metadata["template"], set()).add(task.metadata["domain"])
    assert max(len(v) for v in by_template.values()) >= 40
    assert len(by_template) >= 12


def test_more_environments_than_domains_stay_distinct():
    n = len(DOMAINS) + 3
    pool = generate_pool(n, 1, seed=5)
    assert len({e.class_name for e in pool.environments}) == n
    assert len({e.class_source for e in pool.environments}) == n
    for env in pool.environments[len(DOMAINS):]:
        assert env.metadata["region"]


def test_jsonl_round_trip(paper_pool, tmp_path):
    path = write_pool(paper_pool, tmp_path / "pool.jsonl")
    back = read_pool(path, name=paper_pool.name)
    assert back == paper_pool
    assert back.content_hash() == paper_pool.content_hash()
