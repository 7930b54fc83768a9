"""The offline workspace agents: they act only through the file tools (replayable in a sandbox,
same reward), never see labels, and show the failure modes they stand for."""

from __future__ import annotations

import dataclasses

import pytest

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.rethink.agents import AGENTS, run_agent
from envsched_jax.rethink.event_log import Event, PreparedLayer, Relation, prepare
from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.pool import workspace_pool
from envsched_jax.rethink.roles import make_roles

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


def test_filename_agent_takes_the_false_final_where_only_it_claims_finality(workspaces):
    chosen = []
    for ws in workspaces:
        labels = ws.labels()
        finals = [p for p, lab in labels.items() if lab.family and "final" in p.rsplit("/", 1)[-1].lower()]
        if len(finals) == 1 and labels[finals[0]].category == "false_final_version":
            chosen.append(labels[run_agent("filename", ws).answer["source"]].category)
    assert chosen and all(c == "false_final_version" for c in chosen)
    noise = sum(run_agent("filename", ws).success for ws in workspaces)
    clean = sum(run_agent("filename", ws.clean()).success for ws in workspaces)
    assert noise < clean


def test_layer_read_through_the_tools_redirects_the_naive_agents(workspaces, tmp_path):
    """A quoted withdrawal event in the Event Log drops the record it withdraws; a task-guided
    collection (TGS) is preferred. The layer reaches the agent only through its tools."""
    ws = next(w for w in workspaces if not run_agent("filename", w).success and not run_agent("newest", w).success)
    before = run_agent("filename", ws)
    egs = prepare(ws, mode="egs", roles=make_roles("heuristic"), out_dir=tmp_path / "egs")
    withdrawal = Event("e-test", "write", "synthetic-actor", "2030-01-01T00:00:00Z", (before.answer["source"],),
                       ("notes/x.txt",), relation=Relation("withdraws", "notes/x.txt", before.answer["source"], "quoted"))
    forged = PreparedLayer(egs.collection_map, dataclasses.replace(egs.event_log, events=(withdrawal,)), {})
    after = run_agent("filename", ws, forged)
    assert after.answer["source"] != before.answer["source"]
    inferred = dataclasses.replace(withdrawal, relation=dataclasses.replace(withdrawal.relation, basis="inferred"))
    weak = PreparedLayer(egs.collection_map, dataclasses.replace(egs.event_log, events=(inferred,)), {})
    assert run_agent("filename", ws, weak).answer == before.answer          # an inferred relation is not enough
    tgs = prepare(ws, mode="tgs", roles=make_roles("heuristic"), out_dir=tmp_path / "tgs")
    assert run_agent("newest", ws, tgs).success
    actions = AGENTS["newest"](ws, tgs)
    assert {a.name for a in actions} >= {"list_collections", "file_history"}
    assert "read_card" not in {t["function"]["name"] for t in workspace_pool([ws]).environments[0].tools}
    assert "read_card" in {t["function"]["name"] for t in workspace_pool([ws], layers={ws.workspace_id: tgs}).environments[0].tools}


def test_careful_agent_applies_registers_and_text_notices(workspaces):
    assert all(run_agent("careful", ws).success for ws in workspaces)
