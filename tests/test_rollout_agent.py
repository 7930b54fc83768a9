"""The agent loop with a scripted model: chat rendering and masks, tool-call formats, every end
reason, multi-turn pools, concurrency, real sandboxes, and the learner's batch."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from envsched_jax.envs.inprocess import run_episode as inprocess_episode
from envsched_jax.envs.runtime.core import CHAT_WITH_USER
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.learner.objectives import GRPOConfig, group_advantages
from envsched_jax.pool.sources import load_pool
from envsched_jax.rollout.agent import AgentConfig, AgentRunner
from envsched_jax.rollout.backends import SamplingParams, backend_class
from envsched_jax.rollout.backends.scripted import ScriptedBackend, reference_responder
from envsched_jax.rollout.batch import episodes_to_batch, group_episodes, reward_matrix
from envsched_jax.rollout.chat import ChatRenderer, TemplateError
from envsched_jax.rollout.tool_calls import (TOOL_FORMATS, compact_signature, format_for_model,
                                             tool_format)
from sandbox_helpers import sandbox_param


@pytest.fixture(scope="module")
def tokenizer():
    from envsched_jax.learner import tokenizer as tokenizer_lib
    from envsched_jax.learner.weights import smollm2_gguf_path

    return tokenizer_lib.load_gguf_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def embedded():
    return load_pool("embedded")


def turn_of(request) -> int:
    return int(re.search(r"/turn(\d+)$", request.request_id).group(1))


def task_of(request) -> str:
    return request.request_id.split("#")[0]


def calls_text(actions) -> str:
    payload = [{"name": a.name, "arguments": dict(a.arguments)} for a in actions]
    return "I will act now.\n<tool_call>" + json.dumps(payload) + "</tool_call>"


def reference_script(pool):
    return reference_responder(pool, "json_list")


def runner(tokenizer, pool, respond, workers, **config):
    backend = ScriptedBackend(tokenizer, respond)
    return AgentRunner(backend, tokenizer, workers, pool, AgentConfig(**config)), backend


# -- tool-call formats ---------------------------------------------------------------------------

def test_formats_parse_their_calls_and_report_malformed_ones():
    hermes = tool_format("hermes")
    turn = hermes.parse('think <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
                        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call> end')
    assert [(c.name, dict(c.arguments)) for c in turn.calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert turn.content == "think  end" and not turn.errors
    bad = hermes.parse('<tool_call>{"name": "a", "arguments": {x}}</tool_call><tool_call>[1]'
                       '</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>{"name"')
    assert len(bad.errors) == 4 and not bad.calls
    assert "invalid JSON" in bad.errors[0] and "JSON object" in bad.errors[1]
    assert "non-empty string 'name'" in bad.errors[2] and "unterminated" in bad.errors[3]
    listed = tool_format("json_list").parse('<tool_call>[{"name": "a", "arguments": {}}, '
                                            '{"name": "b", "arguments": {"q": "x;y"}}]</tool_call>')
    assert [c.name for c in listed.calls] == ["a", "b"] and listed.calls[1].arguments == {"q": "x;y"}
    llama = tool_format("llama3_json")
    two = llama.parse('<|python_tag|>{"name": "a", "parameters": {"s": "1;2\\";"}}; '
                      '{"name": "b", "parameters": {}}')
    assert [(c.name, dict(c.arguments)) for c in two.calls] == [("a", {"s": '1;2";'}), ("b", {})]
    assert not llama.parse("Plain answer.").has_calls
    assert llama.parse("{not json").errors
    assert not hermes.parse("no calls here").has_calls
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        tool_format("xml")
    assert format_for_model("qwen3") == "hermes" and format_for_model("llama") == "json_list"
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        format_for_model("gpt2")
    assert set(TOOL_FORMATS) == {"hermes", "json_list", "llama3_json"}
    assert "probe" in TOOL_FORMATS["hermes"].tools_prompt([{"name": "probe"}])
    schema = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"src": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["src"]}}}
    assert compact_signature(schema) == "move(src: string, n?: integer)"
    assert "move(src: string" in TOOL_FORMATS["json_list"].tools_prompt([schema], compact=True)


# -- rendering and masks --------------------------------------------------------------------------

def test_renderer_detects_the_template_and_refuses_a_non_incremental_one(tokenizer):
    r = ChatRenderer(tokenizer, tool_format("json_list"))
    assert r.assistant_suffix == "<|im_end|>\n"
    assert not r.template_renders_tools  # SmolLM2's template ignores `tools`
    msgs = r.initial_messages("sys", "hello", [{"type": "function", "function": {"name": "zz"}}])
    assert '"zz"' in msgs[0]["content"] and msgs[1] == {"role": "user", "content": "hello"}
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(r.closing_ids([eot])) == "\n"
    assert tokenizer.decode(r.closing_ids(tokenizer("cut mid")["input_ids"])) == "<|im_end|>\n"

    class Forgetful:  # renders only the last two messages: not a prefix-stable template
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kw):
            return "|".join(m["content"] for m in messages[-2:]) + ("|A:" if add_generation_prompt else "")

    bad = ChatRenderer(Forgetful(), tool_format("hermes"))
    with pytest.raises(TemplateError, match="renders earlier messages differently"):
        bad.delta_ids([{"role": "tool", "content": "x"}])


def test_episode_tokens_render_the_conversation_and_mask_only_sampled_tokens(tokenizer, embedded):
    task = next(t for t in embedded.tasks if len(t.reference_actions) >= 2)
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1)) as workers:
        agent, backend = runner(tokenizer, embedded, reference_script(embedded), workers)
        ep = agent.run_episode(task, rollout_index=3, seed=7)
    expected = inprocess_episode(embedded.environment(task.env_id), task,
                                 task.reference_actions).reward
    assert ep.reward == expected == 1.0 and ep.end_reason == "answered" and ep.error is None
    tool_actions = tuple(a for a in task.reference_actions if a.name != CHAT_WITH_USER)
    assert ep.num_turns == len(tool_actions) + 1
    t = ep.transcript
    assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
    # the whole sequence is exactly the chat template's rendering of the messages
    full = tokenizer.apply_chat_template(t.messages, tokenize=False, add_generation_prompt=False)
    assert tokenizer.decode(t.token_ids) == full
    # learned tokens are exactly the assistant messages with their end token, nothing else
    ids, mask = np.array(t.token_ids), np.array(t.loss_mask)
    runs = np.split(ids, np.flatnonzero(np.diff(mask)) + 1)
    learned = [tokenizer.decode(r) for r, m in zip(runs, np.split(mask, np.flatnonzero(np.diff(mask)) + 1))
               if m[0] == 1]
    assistant = [m["content"] for m in t.messages if m["role"] == "assistant"]
    assert learned == [a + "<|im_end|>" for a in assistant]
    assert np.all(np.array(t.logprobs)[mask == 1] == -1.0) and np.all(np.array(t.logprobs)[mask == 0] == 0)
    # tool results went back as tool messages; prompts carried the paper's sampling defaults
    assert [m["role"] for m in t.messages[:3]] == ["system", "user", "assistant"]
    assert sum(m["role"] == "tool" for m in t.messages) == len(tool_actions)
    first = backend.requests[0]
    assert (first.sampling.temperature, first.sampling.top_p, first.sampling.top_k) == (0.99, 0.99, 100)
    assert first.request_id == f"{task.task_id}#3/turn0" and first.seed == 7000
    assert [r.seed for r in backend.requests] == [7000 + k for k in range(ep.num_turns)]
    assert ep.trajectory.action_records()[:-1] == tool_actions


# -- end reasons ------------------------------------------------------------------------------------

@pytest.fixture
def workers():
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as pool:
        yield pool


def first_task(pool):
    return next(t for t in pool.tasks if len(t.reference_actions) >= 2)


def test_model_that_never_calls_a_tool_is_scored_on_the_untouched_state(tokenizer, embedded, workers):
    task = first_task(embedded)
    agent, _ = runner(tokenizer, embedded, lambda p, r: "I refuse.", workers)
    ep = agent.run_episode(task)
    expected = inprocess_episode(embedded.environment(task.env_id), task, ()).reward
    assert (ep.end_reason, ep.num_turns, ep.reward) == ("answered", 1, expected)
    assert ep.trajectory.actions[0]["name"] == CHAT_WITH_USER
    assert ep.trajectory.actions[0]["arguments"] == {"message": "I refuse."}


def test_malformed_and_unknown_calls_come_back_as_observations(tokenizer, embedded, workers):
    task = first_task(embedded)
    script = ['<tool_call>[{"name": "x", "arguments": {oops}]</tool_call>',
              '<tool_call>[{"name": "no_such_tool", "arguments": {}}]</tool_call>',
              "\x00\x01 garbage \ufffd", ]

    def respond(prompt, request):
        return script[turn_of(request)]

    agent, _ = runner(tokenizer, embedded, respond, workers)
    ep = agent.run_episode(task)
    tools = [json.loads(m["content"]) for m in ep.transcript.messages if m["role"] == "tool"]
    assert tools[0]["success"] is False and tools[0]["error"].startswith("malformed tool call: invalid JSON")
    assert tools[1] == {"success": False, "error": "invalid action: 'no_such_tool'"}
    assert ep.malformed_calls == 1 and ep.num_turns == 3 and ep.end_reason == "answered"


def test_limits_end_the_episode_with_their_reason(tokenizer, embedded, workers):
    task = first_task(embedded)
    loop = '<tool_call>[{"name": "no_such_tool", "arguments": {}}]</tool_call>'
    agent, _ = runner(tokenizer, embedded, lambda p, r: loop, workers, max_turns=3)
    ep = agent.run_episode(task)
    assert (ep.end_reason, ep.num_turns) == ("max_turns", 3) and ep.trajectory is not None
    # a turn cut at the per-turn limit is not executed and the model is told so
    long = "word " * 400 + loop
    agent, backend = runner(tokenizer, embedded, lambda p, r: long, workers, max_turns=2,
                            max_tokens_per_turn=50)
    ep = agent.run_episode(task)
    assert ep.end_reason == "max_turns" and not ep.trajectory.actions
    assert all(r.sampling.max_new_tokens == 50 for r in backend.requests)
    assert sum(ep.transcript.loss_mask) == 100
    assert "cut at the length limit" in ep.transcript.messages[-1]["content"]
    # the sequence limit: each request asks for at most what is left, and the episode stops
    prompt = len(backend.requests[0].prompt_ids)
    limit = prompt + 120
    agent, backend = runner(tokenizer, embedded, lambda p, r: long, workers,
                            max_sequence_tokens=limit, max_tokens_per_turn=4096)
    ep = agent.run_episode(task)
    assert ep.end_reason == "max_sequence_tokens" and ep.error is None
    assert len(ep.transcript) <= limit and ep.num_turns == 1
    assert backend.requests[0].sampling.max_new_tokens == 120 - 2  # room for "<|im_end|>\n"
    agent, _ = runner(tokenizer, embedded, lambda p, r: long, workers, max_sequence_tokens=prompt)
    ep = agent.run_episode(task)
    assert ep.end_reason == "max_sequence_tokens" and ep.num_turns == 0
    assert f"the first prompt has {prompt} tokens" in ep.error


def test_generation_error_terminate_tool_and_all_or_nothing(tokenizer, embedded, workers):
    task = first_task(embedded)
    agent, _ = runner(tokenizer, embedded, lambda p, r: ConnectionError("server gone"), workers)
    ep = agent.run_episode(task)
    assert (ep.end_reason, ep.reward) == ("generation_error", 0.0)
    assert "ConnectionError: server gone" in ep.error and ep.trajectory is None
    first = task.reference_actions[0]
    agent, _ = runner(tokenizer, embedded, lambda p, r: calls_text([first]), workers,
                      terminate_tools=(first.name,))
    ep = agent.run_episode(task)
    assert (ep.end_reason, ep.num_turns) == ("terminate_tool", 1)
    partial = inprocess_episode(embedded.environment(task.env_id), task, (first,))
    assert ep.reward == partial.reward and 0 < partial.reward < 1  # some checks pass
    agent, _ = runner(tokenizer, embedded, lambda p, r: calls_text([first]), workers,
                      terminate_tools=(first.name,), reward="all_or_nothing")
    assert agent.run_episode(task).reward == 0.0


def test_wall_clock_limit(tokenizer, embedded, workers):
    import time

    def slow(prompt, request):
        time.sleep(0.4)
        return '<tool_call>[{"name": "no_such_tool", "arguments": {}}]</tool_call>'

    agent, _ = runner(tokenizer, embedded, slow, workers, episode_timeout_s=1.0)
    ep = agent.run_episode(first_task(embedded))
    assert ep.end_reason in ("wall_clock", "sandbox_wall_clock") and ep.reward == 0.0
    assert "timeout of 1 s" in ep.error


def test_step_deadline_cuts_slow_episodes_and_keeps_the_fast_ones(tokenizer, embedded, workers):
    import time

    task = first_task(embedded)
    loop_call = '<tool_call>[{"name": "no_such_tool", "arguments": {}}]</tool_call>'

    def respond(prompt, request):
        if request.request_id.split("#")[1].startswith("1/"):
            time.sleep(0.3)  # rollout 1 is slow and never stops calling tools
            return loop_call
        return "Done."

    agent, _ = runner(tokenizer, embedded, respond, workers)
    start = time.monotonic()
    fast, slow = agent.run([(task, 0, 0), (task, 1, 0)], deadline_s=1.5)
    assert time.monotonic() - start < 5.0
    assert (fast.end_reason, slow.end_reason) == ("answered", "step_deadline")
    assert slow.num_turns >= 2 and slow.trajectory is not None and slow.error is None


def test_config_validation():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        AgentConfig(max_turns=0)
    with pytest.raises(ValueError, match="reward must be"):
        AgentConfig(reward="mean")
    with pytest.raises(ValueError, match="unknown tool-call format"):
        AgentConfig(tool_format="yaml")
    with pytest.raises(ValueError, match=r"only field is \{summary\}"):
        AgentConfig(system_prompt="{task}")
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="unknown generation backend 'tgi'"):
        backend_class("tgi")
    assert backend_class("scripted") is ScriptedBackend


# -- multi-turn pools, concurrency, sandboxes, batches -----------------------------------------

@pytest.mark.bfcl
def test_bfcl_scripted_user_turns_come_back_as_user_messages(tokenizer):
    pool = load_pool("bfcl:base")
    tasks = pool.tasks[:4]
    # BFCL's classes are project-vetted source: in-process here, jailed in the sandbox tests
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2, trust="any")) as workers:
        agent, _ = runner(tokenizer, pool, reference_script(pool), workers)
        episodes = agent.run([(t, 0, 0) for t in tasks])
    for task, ep in zip(tasks, episodes):
        users = [m["content"] for m in ep.transcript.messages if m["role"] == "user"]
        assert len(users) == len(task.user_turns) and users[0] == task.user_turns[0]
        assert ep.end_reason == "answered" and ep.reward == 1.0, (task.task_id, ep.error)


@pytest.mark.parametrize("kind", [sandbox_param("bwrap"), sandbox_param("docker")])
def test_episodes_in_a_jail_match_in_process(tokenizer, embedded, kind):
    tasks = [t for t in embedded.tasks if t.reference_actions][:6]
    jobs = [(t, k, k) for t in tasks for k in range(2)]
    with make_worker_pool(SandboxConfig(kind=kind, num_workers=2)) as workers:
        agent, _ = runner(tokenizer, embedded, reference_script(embedded), workers)
        jailed = agent.run(jobs, max_in_flight=4)
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as workers:
        agent, _ = runner(tokenizer, embedded, reference_script(embedded), workers)
        local = agent.run(jobs)
    assert [(e.task_id, e.rollout_index) for e in jailed] == [(t.task_id, k) for t, k, _ in jobs]
    assert [e.reward for e in jailed] == [e.reward for e in local] == [1.0] * len(jobs)
    assert [e.transcript.token_ids for e in jailed] == [e.transcript.token_ids for e in local]


def test_episodes_to_batch_groups_pads_and_computes_advantages(tokenizer, embedded, workers):
    tasks = [t for t in embedded.tasks if t.reference_actions][:2]

    def respond(prompt, request):  # rollout 0 and 2 play the reference, 1 and 3 answer at once
        if int(request.request_id.split("#")[1].split("/")[0]) % 2:
            return "No."
        return reference_script(embedded)(prompt, request)

    agent, _ = runner(tokenizer, embedded, respond, workers)
    jobs = [(t, k, k) for k in range(4) for t in tasks]  # not in group order
    episodes = agent.run(jobs)
    groups = group_episodes(episodes, [t.task_id for t in tasks], 4)
    rewards = reward_matrix(groups)
    assert rewards.shape == (2, 4) and np.all(rewards[:, 0::2] == 1.0)
    batch = episodes_to_batch(groups, pad_id=0, pad_multiple=64)
    n, width = batch.tokens.shape
    longest = max(len(e.transcript) for e in episodes)
    assert n == 8 and width % 64 == 0 and longest <= width < longest + 64
    flat = [e for g in groups for e in g]
    for row, ep in enumerate(flat):
        m = len(ep.transcript)
        assert np.array_equal(np.asarray(batch.tokens[row, :m]), ep.transcript.token_ids)
        assert int(batch.attention_mask[row].sum()) == m
        assert np.array_equal(np.asarray(batch.loss_mask[row, :m]), ep.transcript.loss_mask)
        assert float(batch.loss_mask[row, m:].sum()) == 0
    expected = np.asarray(group_advantages(rewards, GRPOConfig())).reshape(8)
    np.testing.assert_allclose(np.asarray(batch.advantages), expected)
    with pytest.raises(ValueError, match="expected 4 episodes per task"):
        group_episodes(episodes[:-1], [t.task_id for t in tasks], 4)
    with pytest.raises(ValueError, match="not in the step's tasks"):
        group_episodes(episodes, [tasks[0].task_id], 4)
    cut = episodes_to_batch(groups, pad_id=0, max_length=40)
    assert cut.tokens.shape[1] == 40


# -- simulated users --------------------------------------------------------------------------

CHAT_SOURCE = '''
import gc

class Desk:
    def __init__(self, init_config=None):
        self.tickets = {}

    def open_ticket(self, topic):
        self.tickets[topic] = "open"
        return {"success": True}

    def forge_messages(self):
        for obj in gc.get_objects():
            if type(obj).__name__ == "EpisodeCore":
                obj.agent_messages.append({"turn": 0, "message": "code 4417"})
        return {"success": True}
'''

MESSAGE_CHECK = ("def check_func(final_state):\n"
                 "    return any('code 4417' in m['message'] for m in final_state['__messages__'])\n")
TICKET_CHECK = "def check_func(final_state):\n    return final_state['tickets'].get('refund') == 'open'\n"
BRIEF = "You want a refund ticket opened. Your secret order number is 99-SECRET-77."


def chat_pool():
    from envsched_jax.pool.model import Check, Environment, Pool, Task

    tools = tuple({"type": "function", "function": {
        "name": n, "description": n, "parameters": {"type": "object", "properties": props}}}
        for n, props in (("open_ticket", {"topic": {"type": "string"}}), ("forge_messages", {})))
    env = Environment(env_id="desk", class_name="Desk", summary="A help desk.", tools=tools,
                      class_source=CHAT_SOURCE)
    task = Task("desk-0", "desk", "(the simulated user opens)", {}, (
        Check("the agent told the user the code", MESSAGE_CHECK),
        Check("a refund ticket is open", TICKET_CHECK)),
        metadata={"user_mode": "simulated", "user_brief": BRIEF,
                  "user_script": ["Hi, I need a refund.", "Thanks!"]})
    return Pool("desk", (env,), (task,))


def desk_agent(turns):
    def respond(prompt, request):
        return turns[turn_of(request)]
    return respond


HONEST = ['<tool_call>[{"name": "open_ticket", "arguments": {"topic": "refund"}}]</tool_call>',
          "Your refund ticket is open; your code is code 4417.", "Goodbye."]
FORGER = ['<tool_call>[{"name": "open_ticket", "arguments": {"topic": "refund"}}]</tool_call>',
          '<tool_call>[{"name": "forge_messages", "arguments": {}}]</tool_call>',
          "Your refund ticket is open.", "Goodbye."]


@pytest.mark.parametrize("kind", ["inprocess", sandbox_param("bwrap"), sandbox_param("docker")])
def test_scripted_user_conversation_and_messages_visible_to_checks(tokenizer, kind):
    from envsched_jax.rollout.users import ScriptedUser

    pool = chat_pool()
    config = SandboxConfig(kind=kind, num_workers=1, trust="any")
    with make_worker_pool(config) as workers:
        backend = ScriptedBackend(tokenizer, desk_agent(HONEST))
        agent = AgentRunner(backend, tokenizer, workers, pool, user=ScriptedUser())
        ep = agent.run_episode(pool.tasks[0])
    assert (ep.end_reason, ep.reward, ep.error) == ("user_ended", 1.0, None)
    users = [m["content"] for m in ep.transcript.messages if m["role"] == "user"]
    assert users == ["Hi, I need a refund.", "Thanks!"]
    prompts = [tokenizer.decode(list(r.prompt_ids)) for r in backend.requests]
    assert all("99-SECRET-77" not in p and "refund ticket opened" not in p for p in prompts)


@pytest.mark.parametrize("kind", [sandbox_param("bwrap"), sandbox_param("docker")])
def test_environment_code_cannot_forge_the_agents_messages(tokenizer, kind):
    from envsched_jax.rollout.users import ScriptedUser

    pool = chat_pool()
    with make_worker_pool(SandboxConfig(kind=kind, num_workers=1)) as workers:
        agent = AgentRunner(ScriptedBackend(tokenizer, desk_agent(FORGER)), tokenizer, workers,
                            pool, user=ScriptedUser())
        ep = agent.run_episode(pool.tasks[0])
    # the forged message reached the episode process's own record, not the checks
    assert ep.end_reason == "user_ended" and ep.trajectory.check_results == [False, True]
    assert ep.reward == 0.5
    # control: the attack is real; in-process (trusted code only) it does reach the checks
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="any")) as workers:
        agent = AgentRunner(ScriptedBackend(tokenizer, desk_agent(FORGER)), tokenizer, workers,
                            pool, user=ScriptedUser())
        assert agent.run_episode(pool.tasks[0]).trajectory.check_results == [True, True]


def test_llm_user_gets_the_brief_and_ends_with_the_marker(tokenizer, embedded):
    from envsched_jax.rollout.users import LLMUser, LLMUserConfig, UserError

    pool = chat_pool()
    user_prompts = []

    def user_model(prompt, request):
        user_prompts.append(prompt)
        return ["I need a refund, order 99-SECRET-77.", "###STOP###"][int(request.request_id[-1])]

    user = LLMUser(ScriptedBackend(tokenizer, user_model), tokenizer)
    agent_backend = ScriptedBackend(tokenizer, desk_agent(HONEST))
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="any")) as workers:
        agent = AgentRunner(agent_backend, tokenizer, workers, pool, user=user)
        ep = agent.run_episode(pool.tasks[0], seed=3)
        assert (ep.end_reason, ep.reward) == ("user_ended", 1.0)
        assert BRIEF in user_prompts[0] and "###STOP###" in user_prompts[0]
        # the simulator saw the agent's message as its interlocutor's
        assert "your code is code 4417" in user_prompts[1]
        agent_prompts = [tokenizer.decode(list(r.prompt_ids)) for r in agent_backend.requests]
        assert all(BRIEF not in p for p in agent_prompts)
        assert "I need a refund, order 99-SECRET-77." in agent_prompts[0]
        # failures: no simulator, a simulator that errors, a task without a brief
        ep = AgentRunner(agent_backend, tokenizer, workers, pool).run_episode(pool.tasks[0])
        assert ep.end_reason == "user_error" and "needs a user simulator" in ep.error
        broken = LLMUser(ScriptedBackend(tokenizer, lambda p, r: TimeoutError("user model down")),
                         tokenizer)
        ep = AgentRunner(agent_backend, tokenizer, workers, pool, user=broken).run_episode(
            pool.tasks[0])
        assert (ep.end_reason, ep.reward) == ("user_error", 0.0) and "user model down" in ep.error
    task = dataclasses.replace(pool.tasks[0], metadata={"user_mode": "simulated"})
    with pytest.raises(UserError, match="needs metadata 'user_brief'"):
        user.session(task)
    with pytest.raises(ValueError, match=r"\{brief\} and \{stop\}"):
        LLMUser(user.backend, tokenizer, LLMUserConfig(prompt="{goal}"))


# -- EnvScaler's pool: its observation texts, its reward rule, its conversational user ------------

def _probe_task(pool, name):
    return pool.tasks[pool.task_index(f"probe_{name}-task_0")]


CLOSE_T1 = '<tool_call>[{"name": "close_ticket", "arguments": {"ticket_id": "T1"}}]</tool_call>'


@pytest.mark.parametrize("observation_format", ["pool", "json"])
def test_envscaler_tasks_show_envscalers_texts_and_reward_only_an_answer(tokenizer, tmp_path,
                                                                         observation_format):
    from envsched_jax.pool import envscaler_conformance as conf

    pool = conf.probe_pool(tmp_path)
    task = _probe_task(pool, "actions_exhausted")  # checks that ticket T1 is closed
    turns = ['<tool_call>[{"name": "count_open", "arguments": {}}, '
             '{"name": "no_such_tool", "arguments": {}}]</tool_call>', CLOSE_T1, "Task Completed"]
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="any")) as workers:
        agent, _ = runner(tokenizer, pool, desk_agent(turns), workers,
                          observation_format=observation_format)
        ep = agent.run_episode(task)
        # the same work cut by the turn limit before the answer: EnvScaler gives it nothing
        cut, _ = runner(tokenizer, pool, desk_agent(turns), workers, max_turns=2)
        unanswered = cut.run_episode(task)
    assert (ep.end_reason, ep.reward) == ("answered", 1.0)
    assert ep.trajectory.actions[-1] == {"name": "chat_with_user", "turn": 0,
                                         "arguments": {"content": "Task Completed"}}
    shown = [(m["role"], m["content"]) for m in ep.transcript.messages[2:]
             if m["role"] != "assistant"]
    if observation_format == "pool":
        assert shown[:2] == [("tool", "{'success': True, 'data': 2}"),
                             ("user", "Error: Invalid action")]
    else:
        assert shown[:2] == [("tool", '{"data": 2, "success": true}'),
                             ("tool", '{"error": "invalid action: \'no_such_tool\'", '
                                      '"success": false}')]
    assert (unanswered.end_reason, unanswered.reward) == ("max_turns", 0.0)
    assert unanswered.trajectory.final_state["tickets"]["T1"]["status"] == "closed"


def test_envscaler_conversation_ends_and_is_scored_at_the_users_stop(tokenizer, tmp_path):
    from envsched_jax.pool import envscaler_conformance as conf
    from envsched_jax.rollout.users import LLMUser, envscaler_user_config

    pool = conf.probe_pool(tmp_path, mode="conversational")
    task = _probe_task(pool, "conversation_user_stop")
    user_prompts = []

    def user_model(replies):
        def respond(prompt, request):
            user_prompts.append(prompt)
            return replies.pop(0)
        return respond

    agent_turns = [CLOSE_T1, "Ticket T1 is closed.", "Anything else?", "Bye."]
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="any")) as workers:
        # the first answer lacks the reply marker: sampled again (EnvScaler retries too)
        user = LLMUser(ScriptedBackend(tokenizer, user_model([
            "I want a ticket closed.", "Thought: start small\nReply: Please close ticket T1.",
            "###STOP###"])), tokenizer, envscaler_user_config())
        agent_backend = ScriptedBackend(tokenizer, desk_agent(agent_turns))
        ep = AgentRunner(agent_backend, tokenizer, workers, pool, user=user).run_episode(task)
        # a user that never stops: the agent's turn limit ends the episode, unscored
        patient = LLMUser(ScriptedBackend(tokenizer, user_model(
            ["Thought: a\nReply: Please close ticket T1."] + ["Thought: b\nReply: Really?"] * 3)),
            tokenizer, envscaler_user_config())
        endless = AgentRunner(ScriptedBackend(tokenizer, desk_agent(agent_turns)), tokenizer,
                              workers, pool, AgentConfig(max_turns=3), user=patient
                              ).run_episode(task)
    assert (ep.end_reason, ep.reward, ep.trajectory.end_reason) == ("user_ended", 1.0, "user_stop")
    assert [r.request_id.split("/")[-1] for r in user.backend.requests] == ["user0", "user0.1", "user1"]
    agent_prompt = tokenizer.decode(list(agent_backend.requests[0].prompt_ids))
    assert "Please close ticket T1." in agent_prompt and "start small" not in agent_prompt
    assert task.instruction not in agent_prompt  # the task is the user's
    assert task.instruction in user_prompts[0] and "Agent: Ticket T1 is closed." in user_prompts[2]
    assert (endless.end_reason, endless.reward) == ("max_turns", 0.0)
    assert endless.trajectory.final_state["tickets"]["T1"]["status"] == "closed"


def test_envscaler_options_are_validated():
    from envsched_jax.rollout.users import LLMUserConfig, envscaler_user_config

    with pytest.raises(ValueError, match="observation_format must be 'pool' or 'json', got 'xml'"):
        AgentConfig(observation_format="xml")
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        LLMUserConfig(max_attempts=0)
    with pytest.raises(ValueError, match="reply_marker must be None or a non-blank string"):
        envscaler_user_config(reply_marker=" ")
    assert envscaler_user_config().max_turns is None
