"""The agent loop (EnvSched section 3.1): a language model acting in a sandboxed environment.

One episode:

1. The system prompt (the environment's summary and the tool catalog) and the task's first user
   message are rendered with the model family's chat template (:mod:`.chat`).
2. The backend samples an assistant message from the token ids (:mod:`.backends.base`).
3. The message is parsed in the family's tool-call format (:mod:`.tool_calls`):
   - each well-formed call is executed as an environment step in the episode's sandbox worker
     (bubblewrap, Docker, or in-process for trusted environments; for a task bundle,
     ``metadata["semantics"] == "terminal"``, a shell command in the task's own container,
     :mod:`envsched_jax.envs.terminal`), and its observation comes
     back as a message: in the pool's own words where the pool has them (EnvScaler's pool: the
     text of the tool's return value as a ``tool`` message, ``Error: Invalid action`` and
     tracebacks as ``user`` messages, as EnvScaler's runner shows them), else as JSON in a
     ``tool`` message (:attr:`AgentConfig.observation_format`);
   - a malformed call comes back as a ``tool`` message saying what is wrong (the episode goes
     on);
   - a message without calls is a message to the user: the ``chat_with_user`` action. It ends a
     single-turn episode; in a multi-turn pool (BFCL) it closes the user turn and the pool's next
     scripted user turn comes back as a ``user`` message. Tools that become available at a
     later turn (BFCL's missing-function category) are announced in that user message.
4. Repeat until the environment ends the episode, a terminate tool ran, or a limit is reached;
   then the verifier scores the final state outside environment code (the runtime's supervisor)
   and the reward is the fraction of passed checks, or all-or-nothing when configured.

Limits (the paper's, as :class:`AgentConfig` defaults): 40 assistant turns, 4,096 tokens per
turn, 32,000 tokens per sequence. Sampling: temperature 0.99, top-p 0.99, top-k 100.

Conversational tasks with a simulated user (``metadata["user_mode"] == "simulated"``, tau-bench
style and EnvScaler's conversational mode) get their user messages from a :mod:`.users` simulator
that holds the task's private brief; the agent's messages to the user go to it, and its replies
come back as ``user`` messages. When it ends the conversation the episode ends there
(:meth:`~envsched_jax.envs.episode.Episode.user_stop`: for EnvScaler's pool, the step that is
scored).

Every way an episode can end has a named ``end_reason``: ``answered`` (the model answered the
user and the environment ended the episode), ``user_ended`` (the simulated user ended the
conversation), ``user_error`` (the simulator failed: reward 0), ``agent_error`` (a bug in this
loop or the chat template, named: reward 0), ``env_done`` (the environment ended it after a tool
call: its own step limit, a tool error, the last turn), ``terminate_tool``, ``max_turns``,
``max_sequence_tokens`` (the next turn would not fit; the episode is scored as it stands),
``step_deadline`` (the step's rollout budget ran out, :meth:`AgentRunner.run`'s ``deadline_s``:
scored as it stands, so a step's slowest episodes cannot hold up the step and groups stay whole),
``generation_error`` (the backend failed a request: reward 0, the error kept), ``wall_clock``
(the episode's time ran out), or ``sandbox_<kind>`` (the sandbox failed: reward 0). Every episode
that did not fail is scored by its task's semantics (:mod:`envsched_jax.envs.runtime.core`): an
EnvScaler task only when the environment ended it (the model answered the user, or the simulated
user stopped), so one cut by a limit (``max_turns``, ``max_sequence_tokens``, ``step_deadline``,
``terminate_tool``) is worth 0, as in EnvScaler's runner; a task of the project's own pools is
scored on the state it reached (CHOICE: the paper is silent).

Concurrency: :class:`AgentRunner` runs many episodes at once, one thread each; a thread waits on
its generation future or on its sandbox worker, so generation and environment execution of
different episodes overlap, and a slow episode blocks no other.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from envsched_jax.envs.episode import Episode, StepResult
from envsched_jax.envs.sandbox.base import WorkerPool
from envsched_jax.envs.terminal import TerminalEpisode, TerminalRuntime, answer_action
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.bundles import is_terminal_task
from envsched_jax.pool.model import Action, Environment, Pool, Task
from envsched_jax.rollout.backends.base import (Completion, GenerationBackend, GenerationRequest,
                                                SamplingParams)
from envsched_jax.rollout.chat import ChatRenderer, Transcript, observation_text
from envsched_jax.rollout.tool_calls import tool_format
from envsched_jax.rollout.users import UserError, UserSession, UserSimulator

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent acting in a software environment through its tools.\n"
    "Environment: {summary}\n"
    "Complete the user's request by calling tools. When you are done, answer the user in plain "
    "text without a tool call.")
"""CHOICE: the paper does not print its system prompt; this one states the environment and the
protocol (tools, then a plain answer) and nothing task-specific."""



@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """How an agent acts; defaults are EnvSched section 3.1's.

    Attributes:
      max_turns: assistant messages per episode (the paper: 40).
      max_tokens_per_turn: tokens one assistant message may have (the paper: 4,096).
      max_sequence_tokens: tokens of the whole episode, prompt included (the paper: 32,000).
      sampling: temperature / top-p / top-k (the paper: 0.99 / 0.99 / 100); its
        ``max_new_tokens`` is replaced by what the turn and sequence limits leave.
      tool_format: the family's tool-call format (``hermes``, ``json_list``, ``llama3_json``).
      observation_format: ``pool`` (an observation as the pool's own runner words it where the
        runtime gives that text: EnvScaler's pool; JSON in a ``tool`` message otherwise) or
        ``json`` (always JSON in a ``tool`` message).
      tool_catalog: ``full`` (the OpenAI function schemas, descriptions included) or ``compact``
        (one ``name(arg: type)`` line per tool: for tiny models with short contexts).
      system_prompt: a format string with ``{summary}`` (the environment's summary).
      reward: ``fraction`` (passed checks / checks, the paper's) or ``all_or_nothing``
        (1 only when every check passes, as tau-bench scores).
      terminate_tools: tool names that end the episode once executed (a pool's "submit" or
        "transfer_to_human"); tasks may add their own under ``metadata["terminate_tools"]``.
      episode_timeout_s: wall-clock limit of one episode, generation included.
      generation_timeout_s: the longest wait for one completion.
    """

    max_turns: int = 40
    max_tokens_per_turn: int = 4096
    max_sequence_tokens: int = 32_000
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    tool_format: str = "json_list"
    observation_format: Literal["pool", "json"] = "pool"
    tool_catalog: Literal["full", "compact"] = "full"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    reward: Literal["fraction", "all_or_nothing"] = "fraction"
    terminate_tools: tuple[str, ...] = ()
    episode_timeout_s: float = 1800.0
    generation_timeout_s: float = 600.0

    def __post_init__(self):
        for name in ("max_turns", "max_tokens_per_turn", "max_sequence_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.tool_catalog not in ("full", "compact"):
            raise ValueError(f"AgentConfig.tool_catalog must be 'full' or 'compact', "
                             f"got {self.tool_catalog!r}")
        if self.observation_format not in ("pool", "json"):
            raise ValueError(f"AgentConfig.observation_format must be 'pool' or 'json', "
                             f"got {self.observation_format!r}")
        if self.reward not in ("fraction", "all_or_nothing"):
            raise ValueError(f"AgentConfig.reward must be 'fraction' or 'all_or_nothing', "
                             f"got {self.reward!r}")
        tool_format(self.tool_format)  # raises on an unknown name
        for name in ("episode_timeout_s", "generation_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"AgentConfig.{name} must be > 0, got {getattr(self, name)!r}")
        try:
            self.system_prompt.format(summary="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"AgentConfig.system_prompt must be a format string whose only "
                             f"field is {{summary}}: {err}") from None


@dataclasses.dataclass
class AgentEpisode:
    """One episode's record: what the learner needs and what a researcher inspects.

    Attributes:
      task_id, env_id: the node.
      rollout_index: which of the task's K rollouts.
      transcript: token ids, loss mask, sampler log-probs, chat messages.
      trajectory: the environment's record (actions, observations, state changes, checks).
      reward: the reward used for learning (all-or-nothing applied when configured).
      end_reason: see the module docstring.
      error: what went wrong, if anything.
      num_turns: assistant messages generated.
      malformed_calls: tool calls that could not be parsed.
      generation_seconds, environment_seconds, user_seconds: time spent waiting on the
        backend, the sandbox and the user simulator.
    """

    task_id: str
    env_id: str
    rollout_index: int
    transcript: Transcript
    trajectory: Trajectory | None
    reward: float
    end_reason: str
    error: str | None
    num_turns: int
    malformed_calls: int = 0
    generation_seconds: float = 0.0
    environment_seconds: float = 0.0
    user_seconds: float = 0.0
    wall_seconds: float = 0.0


def _new_tools_note(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
    return f"\n\nNew tools are available now:\n{lines}"


class AgentRunner:
    """Runs agent episodes of a pool's tasks with one generation backend and one sandbox.

    Args:
      backend: the generator (:mod:`.backends`).
      tokenizer: the policy's transformers tokenizer (chat template included).
      workers: the sandbox workers the environments run in; at most ``workers.size`` episodes
        hold a worker at once (an episode keeps its worker from reset to score, since the
        environment's state lives in it).
      pool: the tasks and environments.
      config: limits, sampling, formats.
      stop_token_ids: tokens that end an assistant message (the tokenizer's end of turn).
      user: the user simulator for tasks whose ``metadata["user_mode"]`` is ``simulated``
        (:mod:`.users`); their private brief goes to it, never to the agent.
      terminal: the Docker runtime of terminal tasks (task bundles); None: one is made with the
        default :class:`~envsched_jax.envs.terminal.TerminalConfig` at the first such episode
        (a pool without them never touches Docker), and its failure to start fails that
        episode with a named error.
    """

    def __init__(self, backend: GenerationBackend, tokenizer, workers: WorkerPool, pool: Pool,
                 config: AgentConfig | None = None, *, stop_token_ids: Sequence[int] = (),
                 user: UserSimulator | None = None, terminal: TerminalRuntime | None = None):
        self.backend = backend
        self.user = user
        self.terminal = terminal
        self._terminal_lock = threading.Lock()
        self.workers = workers
        self.pool = pool
        self.config = config or AgentConfig()
        self.format = tool_format(self.config.tool_format)
        self.renderer = ChatRenderer(tokenizer, self.format,
                                     compact_tools=self.config.tool_catalog == "compact")
        stops = tuple(int(t) for t in stop_token_ids)
        if not stops and tokenizer.eos_token_id is not None:
            stops = (int(tokenizer.eos_token_id),)
        if not stops:
            raise ValueError("AgentRunner needs stop_token_ids (the tokenizer has no end token)")
        self.stop_token_ids = stops
        self._closing_reserve = len(self.renderer.encode(self.renderer.assistant_suffix))

    # -- one episode ------------------------------------------------------------------------
    def _terminal_runtime(self) -> TerminalRuntime:
        with self._terminal_lock:
            if self.terminal is None:
                self.terminal = TerminalRuntime()
            return self.terminal

    def _new_episode(self, env: Environment, task: Task) -> Episode | TerminalEpisode:
        """A terminal episode for a task bundle, a sandbox-worker episode for anything else."""
        if is_terminal_task(task):
            return TerminalEpisode(self._terminal_runtime, env,
                                   timeout=self.config.episode_timeout_s)
        return Episode(self.workers, env, max_steps=None, timeout=self.config.episode_timeout_s)

    def run_episode(self, task: Task, rollout_index: int = 0, seed: int = 0, *,
                    deadline: float | None = None) -> AgentEpisode:
        """Run one episode; always returns (every failure is an end reason with reward 0 or the
        score of the state reached). ``deadline`` (``time.monotonic()`` value): no generation
        waits past it; an episode still acting then ends as ``step_deadline`` and is scored on
        the state it reached."""
        env = self.pool.environment(task.env_id)
        start = time.monotonic()
        transcript = Transcript()
        record = AgentEpisode(task.task_id, env.env_id, rollout_index, transcript, None, 0.0,
                              "", None, 0)
        episode = self._new_episode(env, task)
        t0 = time.monotonic()
        first = episode.reset(task)
        record.environment_seconds += time.monotonic() - t0
        if first is None:  # the sandbox failed at reset
            return self._finish(record, episode, task, start)
        session = None
        opening = str(first.get("content", ""))
        if task.metadata.get("user_mode") == "simulated":
            try:
                if self.user is None:
                    raise UserError(f"task {task.task_id!r} needs a user simulator "
                                    "(AgentRunner(user=...))")
                session = self.user.session(task, seed)
                t0 = time.monotonic()
                opening = session.opening()
                record.user_seconds += time.monotonic() - t0
            except Exception as err:
                record.end_reason, record.error = "user_error", f"{type(err).__name__}: {err}"
                episode.close()
                return self._finish(record, episode, task, start)
        offered = list(first.get("tools") or [])
        tools = [t for t in env.tools if t["function"]["name"] in set(offered)]
        system = self.config.system_prompt.format(summary=env.summary or env.introduction)
        messages = self.renderer.initial_messages(system, opening, tools)
        transcript.messages.extend(messages)
        transcript.add_context(self.renderer.prompt_ids(messages, tools))
        terminate = set(self.config.terminate_tools) | set(task.metadata.get("terminate_tools", ()))
        try:
            self._loop(record, episode, env, task, seed, offered, terminate, session, deadline)
        except Exception as err:  # a bug or a template problem: name it, never lose the episode
            record.end_reason = record.end_reason or "agent_error"
            record.error = f"{type(err).__name__}: {err}"
            episode.close()
        return self._finish(record, episode, task, start)

    def _loop(self, record: AgentEpisode, episode: Episode | TerminalEpisode, env: Environment,
              task: Task, seed: int, offered: list[str], terminate: set[str],
              session: UserSession | None, deadline: float | None = None) -> None:
        cfg = self.config
        transcript = record.transcript
        while True:
            if record.num_turns >= cfg.max_turns:
                record.end_reason = "max_turns"
                return
            # room for the turn and for the closing markup a cut message gets
            room = cfg.max_sequence_tokens - len(transcript) - self._closing_reserve
            if room < 1:
                record.end_reason = "max_sequence_tokens"
                if record.num_turns == 0:
                    record.error = (f"the first prompt has {len(transcript)} tokens, which leaves "
                                    f"no room under max_sequence_tokens = {cfg.max_sequence_tokens}")
                return
            remaining = episode.remaining_seconds()
            if remaining <= 0:
                record.end_reason = "wall_clock"
                record.error = f"episode timeout of {cfg.episode_timeout_s:g} s exceeded"
                return
            step_left = float("inf") if deadline is None else deadline - time.monotonic()
            if step_left <= 0:
                record.end_reason = "step_deadline"
                return
            completion = self._generate(transcript, record, task, seed,
                                        min(cfg.max_tokens_per_turn, room),
                                        min(remaining, cfg.generation_timeout_s, step_left))
            record.num_turns += 1
            if completion.finish_reason == "error" and deadline is not None \
                    and time.monotonic() >= deadline:
                record.end_reason = "step_deadline"  # the generation was cut by the deadline
                return
            if completion.finish_reason == "error":
                transcript.add_sampled(completion.token_ids, completion.logprobs)
                record.end_reason = "generation_error"
                record.error = completion.error
                return
            transcript.add_sampled(completion.token_ids, completion.logprobs)
            text = self.renderer.decode(completion.token_ids, skip_special_tokens=True)
            if completion.finish_reason == "length":
                # a cut message is not executed: its calls may be half written
                closing = self.renderer.closing_ids(completion.token_ids)
                transcript.add_context(closing)
                transcript.messages.append({"role": "assistant", "content": text})
                new = [{"role": "user", "content": "Your message was cut at the length limit; "
                        "its tool calls were not run. Write shorter messages."}]
                if not self._append(transcript, new):
                    record.end_reason = "max_sequence_tokens"
                    return
                continue
            transcript.add_context(self.renderer.closing_ids(completion.token_ids))
            transcript.messages.append({"role": "assistant", "content": text})
            parsed = self.format.parse(text)
            new_messages: list[dict[str, Any]] = []
            if not parsed.has_calls:
                reply = self._step(record, episode, answer_action(task, parsed.content)).observation
                if reply is None or episode.done:
                    record.end_reason = record.end_reason or "answered"
                    return
                content = str(reply.get("content", "")) if isinstance(reply, dict) else str(reply)
                if session is not None:
                    t0 = time.monotonic()
                    try:
                        answer = session.reply(parsed.content)
                    except Exception as err:
                        record.end_reason = "user_error"
                        record.error = f"{type(err).__name__}: {err}"
                        return
                    finally:
                        record.user_seconds += time.monotonic() - t0
                    if answer is None:
                        record.end_reason = "user_ended"
                        episode.user_stop()
                        return
                    content = answer
                now = list(reply.get("tools") or []) if isinstance(reply, dict) else offered
                added = [n for n in now if n not in offered]
                if added:
                    offered.extend(added)
                    content += _new_tools_note([t for t in env.tools
                                                if t["function"]["name"] in set(added)])
                new_messages.append({"role": "user", "content": content})
            else:
                for error in parsed.errors:
                    record.malformed_calls += 1
                    new_messages.append({"role": "tool", "content": observation_text(
                        {"success": False, "error": f"malformed tool call: {error}"})})
                for call in parsed.calls:
                    result = self._step(record, episode, Action(call.name, dict(call.arguments)))
                    new_messages.append(self._observation_message(result))
                    if call.name in terminate:
                        record.end_reason = "terminate_tool"
                        return
                    if episode.done:
                        record.end_reason = "env_done"
                        return
            if not self._append(transcript, new_messages):
                record.end_reason = "max_sequence_tokens"
                return

    def _append(self, transcript: Transcript, messages: list[dict[str, Any]]) -> bool:
        """Append rendered messages; False (nothing appended) when they would not fit."""
        ids = self.renderer.delta_ids(messages)
        if len(transcript) + len(ids) >= self.config.max_sequence_tokens:
            return False
        transcript.add_context(ids)
        transcript.messages.extend(messages)
        return True

    def _generate(self, transcript: Transcript, record: AgentEpisode, task: Task, seed: int,
                  max_new: int, timeout: float) -> Completion:
        sampling = dataclasses.replace(self.config.sampling, max_new_tokens=max_new)
        request = GenerationRequest(tuple(transcript.token_ids), sampling, self.stop_token_ids,
                                    seed=seed * 1_000 + record.num_turns,
                                    request_id=f"{task.task_id}#{record.rollout_index}"
                                               f"/turn{record.num_turns}")
        t0 = time.monotonic()
        future = self.backend.submit(request)
        try:
            completion = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            completion = Completion.failed(f"no completion within {timeout:g} s")
        record.generation_seconds += time.monotonic() - t0
        return completion

    def _step(self, record: AgentEpisode, episode: Episode | TerminalEpisode,
              action: Action) -> StepResult:
        """One environment step. A sandbox failure ends the episode (``episode.done``); scoring
        then reports it as ``sandbox_<kind>``."""
        t0 = time.monotonic()
        result = episode.step(action)
        record.environment_seconds += time.monotonic() - t0
        return result

    def _observation_message(self, result: StepResult) -> dict[str, Any]:
        """The chat message that shows a tool call's observation (see ``observation_format``)."""
        if self.config.observation_format == "pool" and result.message is not None:
            return {"role": result.message["role"], "content": result.message["content"]}
        return {"role": "tool", "content": observation_text(result.observation)}

    def _finish(self, record: AgentEpisode, episode: Episode | TerminalEpisode, task: Task,
                start: float) -> AgentEpisode:
        if episode.trajectory is None:
            if record.end_reason in ("generation_error", "agent_error", "user_error"):
                episode.close()  # the model failed, not the environment: reward 0
            else:
                t0 = time.monotonic()
                episode.score()
                record.environment_seconds += time.monotonic() - t0
        trajectory = episode.trajectory
        record.trajectory = trajectory
        if trajectory is not None:
            if trajectory.error and trajectory.end_reason.startswith("sandbox_"):
                record.end_reason = trajectory.end_reason
                record.error = trajectory.error
            elif not record.end_reason:
                record.end_reason = "env_done"
            passed = trajectory.check_results
            if self.config.reward == "all_or_nothing":
                record.reward = 1.0 if passed and all(passed) else 0.0
            else:
                record.reward = float(trajectory.reward)
        else:
            record.reward = 0.0
        record.wall_seconds = time.monotonic() - start
        return record

    # -- many episodes ------------------------------------------------------------------------
    def run(self, jobs: Sequence[tuple[Task, int, int]], max_in_flight: int | None = None,
            *, deadline_s: float | None = None) -> list[AgentEpisode]:
        """Run ``(task, rollout_index, seed)`` jobs concurrently (``max_in_flight`` threads, by
        default the sandbox's worker count); results in job order. ``deadline_s``: a step's
        budget from now; episodes still acting when it passes end as ``step_deadline`` (scored
        on the state reached, so every group stays whole), and jobs not yet started then run
        no turn."""
        threads = max_in_flight or self.workers.size
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as executor:
            return list(executor.map(lambda job: self.run_episode(*job, deadline=deadline), jobs))
