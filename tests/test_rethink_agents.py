"""The offline workspace agents: they act only through the file tools (replayable in a sandbox,
same reward), never see labels, and show the failure modes they stand for."""

from __future__ import annotations

import dataclasses

import pytest

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.rethink.agents import AGENTS, Context, run_agent
from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.pool import workspace_pool

from sandbox_helpers import sandbox_param


@pytest.fixture(scope="module")
def workspaces():
    bench = generate_benchmark(GeneratorConfig(seed=11, num_parents=8, variants_per_parent=2))
    return list(bench.train) + list(bench.held_out)


@pytest.mark.parametrize("kind", [sandbox_param("bwrap")])
def test_actions_replay_in_the_sandbox_with_the_same_reward(workspaces, kind):
    ws = workspaces[0]
    pool = workspace_pool([ws])
    workers = make_worker_pool(SandboxConfig(kind=kind, num_workers=1, trust="any"))
    try:
        for name in AGENTS:
            actions = AGENTS[name](ws, None)
            jailed = run_actions(workers, pool.environments[0], pool.tasks[0], actions)
            assert jailed.reward == run_agent(name, ws).reward, name
    finally:
        workers.close()


def test_agents_never_read_labels(workspaces):
    for ws in workspaces[:6]:
        for name, agent in AGENTS.items():
            assert agent(ws, None) == agent(ws.public(), None)


def test_clean_condition_is_solved_by_every_agent(workspaces):
    for ws in workspaces:
        for name in AGENTS:
            run = run_agent(name, ws.clean())
            assert run.success, (name, ws.workspace_id, run.answer, ws.reference)


def test_filename_agent_takes_the_false_final_in_noise(workspaces):
    chosen = []
    for ws in workspaces:
        run = run_agent("filename", ws)
        labels = ws.labels()
        false_finals = [p for p, lab in labels.items() if lab.category == "false_final_version"]
        if any("final" in p.rsplit("/", 1)[-1].lower() for p in false_finals):
            chosen.append(labels[run.answer["source"]].category)
    assert chosen and all(c == "false_final_version" for c in chosen)


def test_context_marking_a_record_out_redirects_the_naive_agents(workspaces):
    ws = workspaces[0]
    before = run_agent("filename", ws)
    assert not before.success
    context = Context(out={before.answer["source"]: "withdrawn (quoted notice)"})
    after = run_agent("filename", ws, context)
    assert after.answer["source"] != before.answer["source"]
    authoritative = [p for p, lab in ws.labels().items()
                     if lab.category == "authoritative_record" and lab.family]
    in_force = run_agent("newest", ws, Context(in_force=authoritative))
    assert in_force.success


def test_careful_agent_applies_registers_and_text_notices(workspaces):
    assert all(run_agent("careful", ws).success for ws in workspaces)
