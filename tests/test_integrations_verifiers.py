"""prime-rl / verifiers adapter: verifiers 0.4 tasksets (from local HF datasets), a SingleAgentEnv
over one, a tool-using taskset and a group of both become pools; the sampler runs steps whose
rewards are verifiers' own rubric scoring of scripted completions, resumes, and names bad input.

No model runs: each completion is a scripted assistant reply put on a real ``vf.Trace``, scored by
the task's ``Task.score`` (its ``@vf.reward`` functions and weights) and carried back as a
``vf.Episode`` round-tripped through the env server's wire type ``vf.WireEpisode``.
"""

from __future__ import annotations

import asyncio
import operator
import sys
import types

import numpy as np
import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers 0.4 is not installed (pip install "
                         "'envsched_jax[verifiers]')")
datasets = pytest.importorskip("datasets", reason="the test builds its tasksets from HF datasets, "
                               "which is not installed")

from verifiers.v1.graph import MessageNode  # noqa: E402
from verifiers.v1.trace import AgentInfo, TraceTask  # noqa: E402

from envsched_jax.graph.build import GraphConfig, build_graph  # noqa: E402
from envsched_jax.integrations.verifiers import (  # noqa: E402
    VerifiersSampler,
    load_verifiers_pool,
    select_configs,
)
from envsched_jax.pool.model import PoolError  # noqa: E402
from envsched_jax.sched import make_scheduler, registered_schedulers  # noqa: E402
from envsched_jax.sched.base import CheckpointError, SchedulerInputError  # noqa: E402

pytestmark = pytest.mark.trainers

B, K = 4, 4
SYSTEM = "Answer with the number only."
OPERATIONS = (("+", "add", operator.add), ("*", "mul", operator.mul), ("-", "sub", operator.sub))
ARITH_ROWS = [{"uid": f"q{i:02d}", "question": f"What is {i + 2} {sign} {i % 5 + 1}?",
               "answer": str(apply(i + 2, i % 5 + 1)), "category": name}
              for i in range(18) for sign, name, apply in [OPERATIONS[i % 3]]]
CITY_ROWS = [{"city": city, "unit": unit} for city in ("Lyon", "Oslo", "Quito", "Perth")
             for unit in ("people", "thousands")]


# -- two tasksets, as a verifiers package would write them ----------------------------------------

class ArithData(vf.TaskData):
    answer: str
    category: str


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.8)
    async def correct(self, trace) -> float:
        """Exact match of the final number."""
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.2)
    async def digits_only(self, trace) -> float:
        """The reply is a bare number."""
        return float(trace.last_reply.isdigit())


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self):
        for row in datasets.Dataset.from_list(ARITH_ROWS):
            prompt = [vf.UserMessage(content="What is 1 + 1?"), vf.AssistantMessage(content="2"),
                      vf.UserMessage(content=row["question"])]
            yield ArithTask(ArithData(id=row["uid"], prompt=prompt, system_prompt=SYSTEM, answer=row["answer"],
                                      category=row["category"]), self.config.task)


class CityToolset(vf.Toolset):
    @vf.tool
    async def lookup_population(self, city: str) -> int:
        """Population of a city."""
        return len(city)

    @vf.tool
    async def convert_units(self, value: float, unit: str) -> float:
        """Convert a count to another unit."""
        return value


class CityData(vf.TaskData):
    answer: int


class CityTask(vf.Task[CityData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [CityToolset(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        return float(len(trace.last_reply) < 8)


class CityTaskset(vf.Taskset[CityTask, vf.TasksetConfig]):
    def load(self):
        for row in datasets.Dataset.from_list(CITY_ROWS):
            yield CityTask(CityData(prompt=f"Look up the population of {row['city']} in {row['unit']}.",
                                    answer=len(row["city"])), self.config.task)


class EndlessTaskset(ArithTaskset):
    INFINITE = True


@pytest.fixture(scope="module")
def arith_env():
    """A SingleAgentEnv built the way verifiers builds one: the taskset found by its id (a module
    exporting it), the `null` chat harness as the agent's."""
    module = types.ModuleType("envsched_vf_arith")
    module.ArithTaskset, module.__all__ = ArithTaskset, ["ArithTaskset"]
    sys.modules[module.__name__] = module
    try:
        yield vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": module.__name__},
                                                        agent={"harness": {"id": "null"}}))
    finally:
        del sys.modules[module.__name__]


@pytest.fixture(scope="module")
def loaded(arith_env):
    return load_verifiers_pool(arith_env, environment_field="category")


@pytest.fixture(scope="module")
def graph(loaded):
    return build_graph(loaded.pool, GraphConfig(dense="always"))


# -- scripted rollouts, scored by verifiers -------------------------------------------------------

def _reply(task, k):
    """The k-th of K scripted completions: solves the first idx % (K + 1) of them, then answers
    with a wrong number or with words (so the rubric's two rewards both matter)."""
    if k < task.data.idx % (K + 1):
        return str(task.data.answer)
    return str(int(task.data.answer) + 1) if k % 2 else f"roughly {task.data.answer}"


def _trace(task, reply):
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig()))
    trace.nodes.append(MessageNode(message=vf.UserMessage(content=task.data.prompt_text)))
    trace.nodes.append(MessageNode(message=vf.AssistantMessage(content=reply), sampled=True, parent=0))
    return trace


def _scored(pairs):
    """Traces of (task, reply) pairs, each scored by its task's own rubric (``Task.score``)."""
    traces = [_trace(task, reply) for task, reply in pairs]

    async def score_all():
        await asyncio.gather(*(task.score(trace) for (task, _), trace in zip(pairs, traces)))

    asyncio.run(score_all())
    return traces


def _episodes(batch, step, env_id="envsched_vf_arith"):
    """K wire episodes per scheduled task, as the env server's client returns them."""
    pairs = [(item.task, _reply(item.task, k)) for item in batch for k in range(K)]
    episodes = []
    for (task, _), trace in zip(pairs, _scored(pairs)):
        episode = vf.Episode(env=vf.EnvInfo(id=env_id), ok=True, traces=[trace],
                             task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                             run=vf.TrainRunInfo(id="run", work=vf.TrainWorkInfo(step=step)))
        episodes.append(vf.WireEpisode.model_validate(episode.model_dump(mode="json")))
    return episodes


def _sampler(graph, loaded, name="envsched", **kw):
    return VerifiersSampler(make_scheduler(name, graph, batch_size=B, group_size=K, seed=0), loaded, **kw)


# -- the loader -----------------------------------------------------------------------------------

def test_a_single_agent_env_becomes_a_pool_with_its_rubric_and_prompts(arith_env, loaded, graph):
    pool = loaded.pool
    assert [t.task_id for t in pool.tasks] == [r["uid"] for r in ARITH_ROWS]
    assert {e.env_id for e in pool.environments} == {"envsched_vf_arith:add", "envsched_vf_arith:mul",
                                                      "envsched_vf_arith:sub"}
    first = pool.tasks[0]
    assert first.instruction == "What is 2 + 1?" and first.env_id == "envsched_vf_arith:add"
    assert first.checks[0].text == ("rubric: correct (reward, weight 0.8): Exact match of the final number.; "
                                    "digits_only (reward, weight 0.2): The reply is a bare number.\n"
                                    "reference answer: integer")
    assert first.initial_state["context"] == f"{SYSTEM}\nuser: What is 1 + 1?\nassistant: 2"
    assert loaded.tasks["q04"].data.idx == 4 and loaded.sources["q04"] == "envsched_vf_arith"
    assert loaded.reward_range == (0.0, 1.0)
    assert load_verifiers_pool(arith_env).pool.environments[0].env_id == "envsched_vf_arith"
    assert graph.num_nodes == 18
    picked = make_scheduler("envsched", graph, batch_size=B, group_size=K, seed=0).select(0)
    assert len(set(picked)) == B and set(picked) <= set(loaded.tasks)


def test_a_group_with_a_tool_taskset_shares_one_pool(arith_env):
    async def inside_a_running_loop():     # an async orchestrator's setup
        return load_verifiers_pool({"arith": arith_env, "city": CityTaskset(vf.TasksetConfig())}, name="group")

    loaded = asyncio.run(inside_a_running_loop())
    pool = loaded.pool
    assert pool.num_environments == 2 and pool.num_tasks == 18 + 8
    assert pool.tasks[0].task_id == "arith/q00" and pool.tasks[18].task_id == "city/0"
    city = pool.environment("city")
    assert city.class_name == "CityTask"
    assert city.tool_names == ("city_toolset_convert_units", "city_toolset_lookup_population")
    assert city.tools[1]["function"]["parameters"]["required"] == ["city"]
    assert pool.environment("arith").tools == ()
    assert pool.tasks[18].checks[0].text.endswith("reference answer: integer")
    assert loaded.reward_range == (0.0, 1.5)
    graph = build_graph(pool, GraphConfig(dense="always"))
    sched = make_scheduler("envsched", graph, batch_size=B, group_size=K, seed=0)
    assert set(sched.select(0)) <= set(loaded.tasks)


def test_loader_names_what_it_cannot_schedule(arith_env):
    cases = [
        (lambda: load_verifiers_pool(EndlessTaskset(vf.TasksetConfig())), "the taskset is infinite"),
        (lambda: load_verifiers_pool(ArithTaskset(vf.TasksetConfig()).take(0)), "yields no task"),
        (lambda: load_verifiers_pool(arith_env, environment_field="region"),
         "record 1, field 'region': environment_field 'region' must be a non-empty string"),
        (lambda: load_verifiers_pool({"a": arith_env, "b": ArithTaskset(vf.TasksetConfig())}),
         "task 'b/q00' has the verifiers task key of task 'a/q00'"),
        (lambda: load_verifiers_pool({"a/b": arith_env}), "without '/'"),
        (lambda: load_verifiers_pool([arith_env]), "expected a verifiers Env or Taskset, got list"),
    ]
    for call, message in cases:
        with pytest.raises(PoolError, match=message.replace("(", r"\(")):
            call()


# -- the sampler ----------------------------------------------------------------------------------

def test_steps_carry_the_rubrics_rewards_to_the_scheduler(arith_env, loaded, graph):
    sampler = _sampler(graph, loaded)
    twin = make_scheduler("envsched", graph, batch_size=B, group_size=K, seed=0)
    rng = np.random.default_rng(0)
    seen = set()
    for step in range(3):
        batch = sampler.next_batch(step)
        ids = [item.task_id for item in batch]
        assert ids == twin.select(step) and sampler.next_batch(step) == batch
        assert batch[0].task_data["id"] == ids[0] and batch[0].task is loaded.tasks[ids[0]]
        configs = select_configs(batch)       # the batch through verifiers' own selection
        assert sorted(t.data.id for t in arith_env.taskset.select(configs["envsched_vf_arith"])) == sorted(ids)
        episodes = _episodes(batch, step)
        order = rng.permutation(len(episodes))
        assert sampler.record([episodes[i] for i in order[:5]]) is False
        assert sampler.record([episodes[i] for i in order[5:]], trainer_step=step) is True
        rewards = np.array([[ep.traces[0].reward for ep in episodes[j * K:(j + 1) * K]] for j in range(B)])
        # the rubric by hand: 0.8 for the right number, 0.2 for digits only
        by_hand = np.array([[0.8 * (_reply(item.task, k) == item.task.data.answer)
                             + 0.2 * _reply(item.task, k).isdigit() for k in range(K)] for item in batch])
        np.testing.assert_allclose(rewards, by_hand)
        seen |= set(np.round(rewards, 6).ravel().tolist())
        arrived = {tid: [] for tid in ids}        # the feed keeps each task's rewards in arrival order
        for i in order:
            arrived[ids[i // K]].append(rewards[i // K, i % K])
        twin.observe(step, ids, np.array([arrived[tid] for tid in ids]))
        assert sampler.feed.scheduler.metrics()[step].mean_reward == pytest.approx(rewards.mean(axis=1).tolist())
    assert seen == {0.0, 0.2, 1.0} and sampler.next_trainer_step == 3
    assert [m.realised_variance for m in sampler.feed.scheduler.metrics()] == \
        [m.realised_variance for m in twin.metrics()]


@pytest.mark.parametrize("name", registered_schedulers())
def test_every_registered_scheduler_can_be_the_sampler(graph, loaded, name):
    sampler = _sampler(graph, loaded, name, step_offset=1)
    for step in (1, 2):
        batch = sampler.next_batch(step)
        assert sampler.record(_episodes(batch, step)) is True
    assert sampler.next_trainer_step == 3
    assert all(m.mean_reward is not None for m in sampler.feed.scheduler.metrics())


def test_a_restart_continues_with_the_same_batch(graph, loaded, tmp_path):
    sampler = _sampler(graph, loaded)
    for step in range(2):
        sampler.record(_episodes(sampler.next_batch(step), step))
    folder = sampler.save(tmp_path)
    batch = sampler.next_batch(2)
    episodes = _episodes(batch, 2)
    sampler.record(episodes)
    after = [item.task_id for item in sampler.next_batch(3)]
    resumed = _sampler(graph, loaded)
    resumed.restore(folder, trainer_step=2)
    assert resumed.next_batch(2) == batch
    resumed.record(episodes)
    assert [item.task_id for item in resumed.next_batch(3)] == after
    with pytest.raises(CheckpointError, match="the scheduler continues at trainer step 2, the trainer at 5"):
        _sampler(graph, loaded).restore(folder, trainer_step=5)


def test_mismatches_are_named_and_record_nothing(arith_env, loaded, graph):
    sampler = _sampler(graph, loaded)
    with pytest.raises(SchedulerInputError, match="no batch awaits rollouts"):
        sampler.record([])
    batch = sampler.next_batch(0)
    good = _episodes(batch, 0)
    ids = [item.task_id for item in batch]
    outsider = next(loaded.tasks[t] for t in loaded.tasks if t not in ids)
    unscored = _trace(batch[0].task, "7")                        # never scored
    failed = _scored([(batch[0].task, "7")])[0]
    failed.rewards["correct"] = None                             # scoring did not run for it
    failed.record_error(RuntimeError("model endpoint went away"))
    foreign = CityTaskset(vf.TasksetConfig())
    stranger = _scored([(next(iter(foreign)), "4")])[0]
    cases = [
        (_scored([(outsider, "1")]), f"task {outsider.data.id!r}, which is not in the pending batch"),
        ([unscored], f"of task {ids[0]!r} has no reward: its rubric did not run"),
        ([failed], r"reward\(s\) \['correct'\] were not scored; last error RuntimeError: model endpoint went away"),
        ([stranger], "is no task of the loaded pool"),
        (_episodes(batch[:1], 1)[:1], "was dispatched at training step 1, but the pending batch is trainer step 0"),
        ([good[0].model_copy(update={"run": vf.EvalRunInfo(id="ev")})], "is evaluation work of run 'ev'"),
        ([good[0].model_copy(update={"traces": []})], "has no trainable trace"),
        ([ids[0]], "expected a verifiers Episode or Trace, got str"),
        (good[:K] + good[:1], f"more than K = {K} rewards for task {ids[0]!r}"),
    ]
    for rollouts, message in cases:
        with pytest.raises(SchedulerInputError, match=message):
            sampler.record(good[K:K + 2] + rollouts)
        assert all(len(v) == 0 for v in sampler.feed._rewards.values())     # nothing half-recorded
    with pytest.raises(SchedulerInputError, match="the pending batch is trainer step 0"):
        sampler.record(good, trainer_step=1)
    with pytest.raises(ValueError, match="build the graph from loaded.pool"):
        VerifiersSampler(make_scheduler("random", graph, batch_size=B, group_size=K, seed=0),
                         load_verifiers_pool(ArithTaskset(vf.TasksetConfig()).take(6)))


def test_a_rubric_above_one_needs_its_declared_range(arith_env):
    city = load_verifiers_pool(CityTaskset(vf.TasksetConfig()))
    graph = build_graph(city.pool, GraphConfig(dense="always"))
    plain = VerifiersSampler(make_scheduler("envsched", graph, batch_size=2, group_size=2, seed=0), city)
    batch = plain.next_batch(0)
    right = _scored([(item.task, str(item.task.data.answer)) for item in batch for _ in range(2)])
    assert {t.reward for t in right} == {1.5}
    with pytest.raises(SchedulerInputError, match=r"is 1.5, outside \[0, 1\] \(declare the trainer's reward_range"):
        plain.record(right)
    ranged = VerifiersSampler(make_scheduler("envsched", graph, batch_size=2, group_size=2, seed=0), city,
                              reward_range=city.reward_range)
    assert [item.task_id for item in ranged.next_batch(0)] == [item.task_id for item in batch]
    assert ranged.record(right) is True
    assert ranged.feed.scheduler.metrics()[0].mean_reward == [1.0, 1.0]
