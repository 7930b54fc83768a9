"""The episode API in every sandbox: EnvScaler and BFCL-v3 multi-turn semantics, trajectories,
agreement with the trusted in-process executor, and deterministic replay."""

from __future__ import annotations

import importlib.util
import json

import pytest

from envsched_jax.envs.episode import Episode, EpisodeError, run_actions, with_turn_ends
from envsched_jax.envs.inprocess import load_class, run_episode
from envsched_jax.envs.replay import replay, same_state
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.envs.trajectory import read_trajectories, write_trajectories
from envsched_jax.pool.model import Action, Check, Environment, Pool, PoolError, Task
from envsched_jax.pool.sources import load_pool

from sandbox_helpers import sandbox_param


ALL = [sandbox_param("inprocess"), sandbox_param("bwrap"), sandbox_param("docker")]
HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None

COUNTER_SOURCE = '''
class Counter:
    def __init__(self, init_config):
        self.value = 0
        self.log = []

    def add(self, amount):
        self.value += amount
        self.log.append(amount)
        return {"success": True, "data": self.value}

    def read(self):
        return {"success": True, "data": self.value}

    def explode(self):
        raise RuntimeError("boom")
'''


def counter_pool() -> Pool:
    env = Environment("counter", "Counter", "a counter",
                      tools=({"name": "add"}, {"name": "read"}, {"name": "explode"}),
                      class_source=COUNTER_SOURCE,
                      trusted_class=load_class(Environment("c", "Counter", "", (),
                                                           class_source=COUNTER_SOURCE)))
    checks = (Check("value is 5", "def check_func(final_state):\n    return final_state['value'] == 5\n"),
              Check("grew from the start", "def check_func(final_state):\n"
                    "    return final_state['value'] > initial_state['value']\n"),
              Check("a broken check", "def check_func(final_state):\n    return 1 / 0\n"))
    task = Task("counter-0", "counter", "Make the counter 5.", {"value": 2}, checks)
    return Pool("counter", (env,), (task,))


@pytest.fixture(scope="module", params=ALL)
def workers(request):
    pool = make_worker_pool(SandboxConfig(kind=request.param, num_workers=1, trust="any"))
    yield pool
    pool.close()


def test_envscaler_semantics_step_by_step(workers):
    tasks = counter_pool()
    env, task = tasks.environments[0], tasks.tasks[0]
    episode = Episode(workers, env)
    first = episode.reset(task)
    assert first["content"] == "Make the counter 5." and first["tools"] == ["add", "read", "explode"]
    invalid = episode.step(Action("_private"))
    assert not invalid.done and invalid.observation == {"success": False,
                                                        "error": "invalid action: '_private'"}
    assert episode.step(Action("nope")).observation["error"] == "invalid action: 'nope'"
    assert episode.step(Action("add", {"amount": 3})).observation == {"success": True, "data": 5}
    end = episode.step(Action("chat_with_user", {"message": "done"}))
    assert end.done and end.observation is None
    with pytest.raises(EpisodeError, match="after the end"):
        episode.step(Action("read"))
    score = episode.score()
    # init_config set as attributes (value 2, then +3); the check reading initial_state passes;
    # the raising check counts 0; reward rounded to 4 decimals
    assert score.reward == round(2 / 3, 4) == 0.6667
    assert score.check_results == (True, True, False)
    assert score.check_errors[2] == "ZeroDivisionError: division by zero"
    traj = episode.trajectory
    assert [e["kind"] for e in traj.events] == ["reset", "step", "step", "step", "step", "score"]
    assert traj.initial_state == {"value": 2, "log": []}
    assert traj.events[3]["state_change"] == {"set": {"value": 5, "log": [3]}}
    assert traj.events[1]["state_change"] == {}
    assert traj.final_state == {"value": 5, "log": [3]} and traj.end_reason == "chat_with_user"


def test_a_raising_tool_ends_the_episode_with_reward_zero(workers):
    tasks = counter_pool()
    traj = run_actions(workers, tasks.environments[0], tasks.tasks[0],
                       [Action("add", {"amount": 3}), Action("explode"), Action("add", {"amount": 1})])
    assert traj.reward == 0.0 and traj.end_reason == "tool_error"
    assert traj.error == "tool 'explode' raised RuntimeError: boom"
    assert len(traj.steps()) == 2 and traj.final_state["value"] == 5


def test_max_steps_ends_the_episode(workers):
    tasks = counter_pool()
    traj = run_actions(workers, tasks.environments[0], tasks.tasks[0],
                       [Action("add", {"amount": 1})] * 5, max_steps=2)
    assert traj.end_reason == "max_steps" and traj.final_state["value"] == 4


def test_trajectories_round_trip_through_json_lines(workers, tmp_path):
    tasks = counter_pool()
    trajs = [run_actions(workers, tasks.environments[0], tasks.tasks[0],
                         [Action("add", {"amount": k})]) for k in range(3)]
    path = write_trajectories(tmp_path / "t.jsonl", trajs)
    assert read_trajectories(path) == trajs
    first, *rest = path.read_text().splitlines()
    record = json.loads(first)
    del record["reward"]
    path.write_text("\n".join([json.dumps(record), *rest]) + "\n")
    with pytest.raises(PoolError, match=r"t.jsonl, line 1, field 'reward': missing trajectory field"):
        read_trajectories(path)


def test_embedded_pool_agrees_with_the_trusted_executor_and_replays(workers, tmp_path):
    """Every embedded task, reference and wrong sequences: same reward and final state as
    ``inprocess.run_episode``; saved trajectories replay to the same state and reward."""
    from envsched_jax.pool.embedded import wrong_action_sequences

    pool = load_pool("embedded")
    wrong = wrong_action_sequences()
    trajs = []
    for task in pool.tasks:
        env = pool.environment(task.env_id)
        for actions in (task.reference_actions, *wrong.get(task.task_id, [])[:1]):
            traj = run_actions(workers, env, task, actions)
            expected = run_episode(env, task, actions)
            assert traj.reward == expected.reward, task.task_id
            assert same_state(traj.final_state, dict(expected.final_state)), task.task_id
            trajs.append(traj)
    assert sum(t.reward == 1.0 for t in trajs) == len(pool.tasks)
    stored = read_trajectories(write_trajectories(tmp_path / "emb.jsonl", trajs))
    for traj in stored:
        again = replay(workers, pool, traj)
        assert again.reward_matches and abs(again.reward - traj.reward) <= 1e-4
        assert same_state(again.replayed.final_state, traj.final_state)


@pytest.mark.bfcl
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed (make install adds it)")
def test_bfcl_multi_turn_semantics(workers):
    pool = load_pool("bfcl:miss_func")
    task = next(t for t in pool.tasks if t.task_id == "multi_turn_miss_func_0")
    env = pool.environment(task.env_id)
    withheld = task.metadata["withheld_tools"]            # {'sort': 3}
    (tool, turn), = withheld.items()
    # withheld_calls="refuse": a withheld tool called before its turn is an invalid action
    strict_pool = load_pool("bfcl:miss_func,withheld_calls=refuse")
    strict = strict_pool.tasks[strict_pool.task_index(task.task_id)]
    episode = Episode(workers, strict_pool.environment(strict.env_id))
    episode.reset(strict)
    assert episode.step(Action(tool, {"file_name": "x"})).observation["error"] == \
        f"invalid action: {tool!r}"
    episode.close()
    # the default, as BFCL's executor: the call runs, though the tool is not offered yet
    episode = Episode(workers, env)
    obs = episode.reset(task)
    assert obs["turn"] == 0 and obs["content"] == task.user_turns[0] and tool not in obs["tools"]
    early = episode.step(Action(tool, {"file_name": "x"})).observation
    assert isinstance(early, str) and "invalid action" not in early, early
    for k in range(1, turn + 1):
        obs = episode.step(Action("chat_with_user", {"message": "ok"})).observation
        assert obs["turn"] == k
    assert task.user_turns[turn] == "" and obs["content"] == task.metadata["holdout_prompt"]
    assert tool in obs["tools"]
    for _ in range(turn + 1, len(task.user_turns)):
        assert not episode.step(Action("chat_with_user", {"message": "ok"})).done
    assert episode.step(Action("chat_with_user", {"message": "ok"})).done
    assert episode.score().reward < 1.0
    assert len(episode.trajectory.events[-1]["turn_states"]) == len(task.user_turns)


@pytest.mark.bfcl
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed (make install adds it)")
def test_bfcl_reference_replays(workers):
    """Base, missing-function and missing-parameter reference actions, turn by turn, score 1.0,
    including the miss_func task whose ground truth calls a tool before BFCL offers it (the call
    runs, as in BFCL's executor)."""
    pool = load_pool("bfcl:base,miss_func,miss_param")
    ids = [t.task_id for t in pool.tasks[::8]] + ["multi_turn_miss_func_49"]
    for task_id in ids:
        task = pool.tasks[pool.task_index(task_id)]
        traj = run_actions(workers, pool.environment(task.env_id), task,
                           with_turn_ends(task, task.reference_actions))
        assert traj.error is None, (task.task_id, traj.error)
        assert traj.reward == 1.0, (task.task_id, traj.check_results)
    task = pool.tasks[pool.task_index("multi_turn_miss_func_49")]
    early = [a for a in task.reference_actions
             if task.metadata["withheld_tools"].get(a.name, 0) > a.turn]
    assert [(a.name, a.turn) for a in early] == [("tail", 1)]
    assert not any(isinstance(o, dict) and "invalid action" in str(o.get("error"))
                   for o in traj.observations)
