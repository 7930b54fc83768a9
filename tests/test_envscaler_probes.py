"""EnvScaler's pool scored as EnvScaler's own runner scores it: the probe tasks of
:mod:`envsched_jax.pool.envscaler_conformance`, one per rule, in every sandbox.

Each probe carries the reward EnvScaler's runner gave it (``how="ran"``: its RL environment at
commit 87e6673 looped as its training manager loops it, ``experiments/envscaler_conformance.py``)
and the file and function of EnvScaler's code the rule lives in; the table is in docs/guides/pools.md
("EnvScaler's 2,550-task RL pool").
"""

from __future__ import annotations

import dataclasses

import pytest

from envsched_jax.envs.episode import Episode
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.pool import envscaler_conformance as conf
from envsched_jax.pool.model import Action

from sandbox_helpers import sandbox_param

ALL = [sandbox_param("inprocess"), sandbox_param("bwrap"), sandbox_param("docker")]
PROBES = {p.name: p for p in conf.PROBES}

# EnvScaler's observations of some probes, as its runner showed them (ran, commit 87e6673): the
# policy's prompt. Tracebacks are compared by their first and last lines (conf.same_text).
ENVSCALER_TEXTS = {
    "chat_needs_content": [
        {"role": "user", "content": "Error: Invalid action"},
        {"role": "tool", "content": "{'success': True, 'data': {'owner': 'ana', 'status': 'closed'}}"},
        {"role": "user", "content": "Task finished"}],
    "private_method": [{"role": "tool", "content": "{'success': True}"},
                       {"role": "user", "content": "Task finished"}],
    "plain_attribute": [{"role": "user", "content": "Error: <Exception>\nTraceback (most recent "
                         "call last):\n  ...\nTypeError: 'dict' object is not callable\n"}],
    "tool_error": [
        {"role": "tool", "content": "{'success': True, 'data': {'owner': 'ana', 'status': 'closed'}}"},
        {"role": "user", "content": "Error: <Exception>\nTraceback (most recent call last):\n"
         "  ...\nRuntimeError: the desk is on fire\n"}],
    "setup_identity": [{"role": "tool", "content": "{'success': True, 'data': 1}"},
                       {"role": "user", "content": "Task finished"}],
}


@pytest.fixture(scope="module", params=ALL)
def workers(request):
    with make_worker_pool(SandboxConfig(kind=request.param, num_workers=1, trust="any")) as pool:
        yield pool


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probes")
    return {(mode, private): conf.probe_pool(folder / f"{mode}-{private}", mode=mode,
                                             private_methods=private)
            for mode in ("non_conversational", "conversational")
            for private in ("allow", "refuse")}


def test_the_probes_are_one_per_rule_and_each_names_its_source():
    assert len(PROBES) == len(conf.PROBES) == 15
    assert all(p.how == "ran" and ".py: " in p.where for p in conf.PROBES)
    # the semantics changed the reward of 12 of them; three agreed before (two controls, and the
    # user's stop, which the project scored as it scored every simulated-user episode)
    unchanged = sorted(p.name for p in conf.PROBES if p.before == p.envscaler)
    assert unchanged == ["chat_at_step_limit", "conversation_user_stop", "tool_error"]


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_scores_as_envscalers_runner(workers, pools, name):
    probe = PROBES[name]
    traj = conf.project_trajectory(workers, pools[(probe.mode, "allow")], probe)
    assert traj.error is None or traj.end_reason == "tool_error", traj.error
    assert traj.reward == probe.envscaler, (name, traj.end_reason, traj.check_errors)


@pytest.mark.parametrize("name", sorted(ENVSCALER_TEXTS))
def test_the_policy_sees_envscalers_observation_texts(workers, pools, name):
    probe = PROBES[name]
    traj = conf.project_trajectory(workers, pools[(probe.mode, "allow")], probe)
    shown = [step.get("message") for step in traj.steps()]
    assert conf.texts_agree(probe, ENVSCALER_TEXTS[name], shown), shown


def test_private_methods_refuse_makes_them_invalid_actions(workers, pools):
    """The option: a private name is an invalid action (the episode goes on); EnvScaler's
    default lets the policy call it."""
    probe = PROBES["private_method"]
    allowed = conf.project_trajectory(workers, pools[("non_conversational", "allow")], probe)
    refused = conf.project_trajectory(workers, pools[("non_conversational", "refuse")], probe)
    assert (allowed.reward, refused.reward) == (1.0, 0.0)
    assert refused.steps()[0]["message"] == {"role": "user", "content": "Error: Invalid action"}
    assert refused.end_reason == "chat_with_user"
    # __init__ is private too: under "allow" the policy can re-run it with a state of its choosing
    rerun = dataclasses.replace(probe, actions=(
        conf.tool("__init__", init_config={"tickets": {"T1": {"owner": "ana", "status": "closed"}}}),
        conf.DONE))
    rewards = [conf.project_trajectory(workers, pools[("non_conversational", private)],
                                       rerun).reward for private in ("allow", "refuse")]
    assert rewards == [1.0, 0.0]


def test_step_by_step_episode_matches_the_fixed_sequence(workers, pools):
    """The same rules through reset/step/score: the policy's messages, then the reward only at
    the environment's end."""
    probe = PROBES["chat_needs_content"]
    pool = pools[("non_conversational", "allow")]
    task = pool.tasks[pool.task_index(probe.task_id)]
    episode = Episode(workers, pool.environment(task.env_id), max_steps=probe.max_steps)
    assert episode.reset(task)["content"] == "Close ticket T1 of Ana."
    results = [episode.step(Action(a["name"], a["arguments"])) for a in probe.actions]
    assert [r.done for r in results] == [False, False, True]
    assert [r.message for r in results] == ENVSCALER_TEXTS["chat_needs_content"]
    assert results[0].observation == {"success": False, "error": "invalid action: 'chat_with_user'"}
    assert episode.score().reward == 1.0


def test_a_conversational_episode_is_scored_at_the_users_stop(workers, pools):
    probe = PROBES["conversation_user_stop"]
    pool = pools[("conversational", "allow")]
    task = pool.tasks[pool.task_index(probe.task_id)]
    assert task.metadata["user_mode"] == "simulated" and task.metadata["user_brief"] == task.instruction
    episode = Episode(workers, pool.environment(task.env_id))
    assert episode.reset(task)["content"] is None  # the task is the simulated user's, not shown
    for action in probe.actions:
        assert not episode.step(Action(action["name"], action["arguments"])).done
    episode.user_stop()
    score = episode.score()
    assert (score.reward, score.end_reason) == (1.0, "user_stop")
    # the stop counts only right after a chat_with_user: after a tool call it is unscored
    episode = Episode(workers, pool.environment(task.env_id))
    episode.reset(task)
    episode.step(Action("close_ticket", {"ticket_id": "T1"}))
    episode.user_stop()
    score = episode.score()
    assert score.reward == 0.0 and "unscored" in score.check_errors[0]


def test_the_envscaler_driver_needs_a_checkout_of_envscaler(tmp_path):
    """The driver (experiments/envscaler_conformance.py) reads EnvScaler's runner from a
    checkout; this machine has none, so only its refusal of a wrong folder is tested here."""
    with pytest.raises(FileNotFoundError, match="is not a checkout of EnvScaler"):
        conf.run_envscaler_probe(tmp_path, PROBES["setup_identity"], tmp_path / "files")


def test_model_text_is_what_envscalers_parser_turns_into_the_action():
    assert conf.model_text(conf.DONE) == "Task Completed"
    assert conf.model_text(conf.chat(message="done")) == (
        '<tool_call>\n{"name": "chat_with_user", "arguments": {"message": "done"}}\n</tool_call>')


def test_a_user_stopped_episode_replays_to_its_reward(workers, pools):
    from envsched_jax.envs.replay import replay

    probe = PROBES["conversation_user_stop"]
    pool = pools[("conversational", "allow")]
    traj = conf.project_trajectory(workers, pool, probe)
    assert traj.end_reason == "user_stop" and traj.events[-2] == {"kind": "user_stop"}
    again = replay(workers, pool, traj)
    assert again.reward_matches and again.reward == 1.0
