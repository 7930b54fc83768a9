"""User simulators for conversational tasks (tau-bench style).

A task with ``metadata["user_mode"] == "simulated"`` has no scripted user turns: a simulator plays
the user from a private brief (``metadata["user_brief"]``) that the agent never sees. The agent
loop asks the simulator for the opening message, gives it every message the agent writes to the
user (the agent's ``chat_with_user``), and puts its replies in front of the agent as ``user``
messages, until the simulator ends the conversation; then the episode is scored (checks see the
agent's messages under ``final_state["__messages__"]``).

Two simulators behind one interface (:class:`UserSimulator`):

- :class:`ScriptedUser`: replies from a list (the task's ``metadata["user_script"]`` or one given
  to it), then ends. Deterministic, for tests and for pools that script their users.
- :class:`LLMUser`: a language model through any generation backend (the policy's own, or a
  separate vLLM server), prompted with the brief; it ends the conversation by writing the stop
  marker (``###STOP###``, as tau-bench's and EnvScaler's simulators do). Its tokens are never part
  of the agent's learned sequence. :func:`envscaler_user_config` sets it up as EnvScaler's
  conversational RL environment sets up its user (``rl_conv_env.py`` and ``utils/user_agent.py``
  of its RL environment): the brief is the task, the agent's opening line and messages are
  marked as the agent's, the user writes a private thought before its reply (only the reply
  reaches the agent; an answer without the reply marker is sampled again, up to five times, then
  the reply is empty), samples at temperature 0.7, and has no turn limit of its own. The prompt is
  the project's own wording of the rules EnvScaler's prompt gives (reveal the goal a piece at a
  time, keep names exact, invent nothing, stop when the goal is met).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from envsched_jax.pool.model import Task
from envsched_jax.rollout.backends.base import GenerationBackend, GenerationRequest, SamplingParams

DEFAULT_USER_PROMPT = (
    "You are playing a user who talks to a customer-service agent. Your goal and everything you "
    "know are below; reveal them only as the conversation needs them, in your own words, one "
    "message at a time. Never invent information that is not in your brief. When your goal is "
    "met, or it cannot be met, write {stop} and nothing else.\n\nYour brief:\n{brief}")


class UserError(RuntimeError):
    """The simulator could not produce a message (a generation failure, a missing brief)."""


class UserSession(Protocol):
    def opening(self) -> str:
        """The user's first message."""
        ...

    def reply(self, agent_message: str) -> str | None:
        """The user's answer to the agent's message; None ends the conversation."""
        ...


class UserSimulator(Protocol):
    def session(self, task: Task, seed: int) -> UserSession:
        """A fresh conversation for one episode of ``task``."""
        ...


# -- scripted ----------------------------------------------------------------------------------


@dataclasses.dataclass
class _ScriptedSession:
    lines: list[str]
    position: int = 0

    def opening(self) -> str:
        if not self.lines:
            raise UserError("the user script is empty")
        self.position = 1
        return self.lines[0]

    def reply(self, agent_message: str) -> str | None:
        if self.position >= len(self.lines):
            return None
        self.position += 1
        return self.lines[self.position - 1]


@dataclasses.dataclass(frozen=True)
class ScriptedUser:
    """Replies from ``script`` (or the task's ``metadata["user_script"]``), in order, then ends."""

    script: Sequence[str] | None = None

    def session(self, task: Task, seed: int = 0) -> UserSession:
        lines = self.script if self.script is not None else task.metadata.get("user_script")
        if not isinstance(lines, (list, tuple)) or not all(isinstance(x, str) for x in lines):
            raise UserError(f"task {task.task_id!r}: no user script (metadata 'user_script' must "
                            "be a list of strings)")
        return _ScriptedSession(list(lines))


# -- a language model --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LLMUserConfig:
    """Attributes:
      prompt: the simulator's system prompt, a format string with ``{brief}`` and ``{stop}``.
      stop_marker: the text that ends the conversation.
      sampling: how the simulator samples (tau-bench samples its user at temperature 0 by
        default; CHOICE: 0.7 here, so the K rollouts of a task meet different users).
      max_turns: simulator messages at most, then the conversation ends; None for no limit
        (the agent's own turn limit bounds it).
      timeout_s: the longest wait for one simulator message.
      greeting: the agent's opening line, as the simulator sees it before its first message.
      agent_prefix: put before every agent message the simulator sees.
      reply_marker: None (the simulator's whole message is its reply) or the text after which
        its reply starts (what comes before is a thought the agent never sees); a message
        without it is sampled again, ``max_attempts`` times in all, then the reply is empty.
      max_attempts: see ``reply_marker``.
    """

    prompt: str = DEFAULT_USER_PROMPT
    stop_marker: str = "###STOP###"
    sampling: SamplingParams = dataclasses.field(
        default_factory=lambda: SamplingParams(temperature=0.7, top_p=1.0, top_k=0,
                                               max_new_tokens=512))
    max_turns: int | None = 20
    timeout_s: float = 300.0
    greeting: str = "Hello, how can I help you today?"
    agent_prefix: str = ""
    reply_marker: str | None = None
    max_attempts: int = 1

    def __post_init__(self):
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"LLMUserConfig.max_turns must be >= 1 or None, got {self.max_turns!r}")
        if self.max_attempts < 1:
            raise ValueError(f"LLMUserConfig.max_attempts must be >= 1, got {self.max_attempts!r}")
        if self.reply_marker is not None and not self.reply_marker.strip():
            raise ValueError("LLMUserConfig.reply_marker must be None or a non-blank string")


ENVSCALER_USER_PROMPT = (
    "You are a person using an assistant that works in a software environment for you. You "
    "want the assistant to reach the goal below.\n\nGoal:\n{brief}\n\n"
    "How to talk:\n"
    "- Do not paste the goal. Give it a piece at a time: the first request, then further details "
    "and sub-requests only when the assistant asks or needs them.\n"
    "- Keep every name, identifier and keyword exactly as the goal writes it.\n"
    "- Ask for nothing the goal does not contain and invent no facts. If the assistant offers "
    "choices, take only one the goal allows; if none fits, say so and repeat what you need.\n"
    "- Do not repeat what you already said unless asked. Sound like a person, not a form.\n"
    "- When the goal is reached, answer with {stop} alone.\n\n"
    "Answer in this form every time:\nThought: <your private reasoning, never shown to the "
    "assistant>\nReply: <the message the assistant receives>")
"""The simulated user's prompt for EnvScaler's conversational mode (the project's own wording)."""


def envscaler_user_config(**overrides) -> LLMUserConfig:
    """An :class:`LLMUserConfig` that plays the user as EnvScaler's conversational RL environment
    does (see the module docstring); ``overrides`` replace fields."""
    fields = dict(prompt=ENVSCALER_USER_PROMPT, greeting="Agent: Hi! What can I do for you?",
                  agent_prefix="Agent: ", reply_marker="Reply:", max_attempts=5, max_turns=None,
                  sampling=SamplingParams(temperature=0.7, top_p=1.0, top_k=0,
                                          max_new_tokens=1024))
    return LLMUserConfig(**{**fields, **overrides})


class _LLMSession:
    def __init__(self, user: LLMUser, brief: str, seed: int, label: str):
        self.user = user
        self.seed = seed
        self.label = label
        cfg = user.config
        self.messages = [{"role": "system",
                          "content": cfg.prompt.format(brief=brief, stop=cfg.stop_marker)}]
        self.turns = 0

    def _sample(self, attempt: int) -> str:
        cfg = self.user.config
        text = self.user.tokenizer.apply_chat_template(self.messages, tokenize=False,
                                                       add_generation_prompt=True)
        ids = tuple(self.user.tokenizer(text, add_special_tokens=False)["input_ids"])
        suffix = f".{attempt}" if attempt else ""
        request = GenerationRequest(ids, cfg.sampling, self.user.stop_token_ids,
                                    seed=self.seed * 1_000 + self.turns + 100_000 * attempt,
                                    request_id=f"{self.label}/user{self.turns}{suffix}")
        completion = self.user.backend.submit(request).result(timeout=cfg.timeout_s)
        if completion.finish_reason == "error":
            raise UserError(f"the user simulator failed: {completion.error}")
        return self.user.tokenizer.decode(list(completion.token_ids),
                                          skip_special_tokens=True).strip()

    def _say(self) -> str | None:
        """The simulator's next reply, or None when it ends the conversation: it wrote the stop
        marker anywhere in its message, or reached ``max_turns``."""
        cfg = self.user.config
        if cfg.max_turns is not None and self.turns >= cfg.max_turns:
            return None
        for attempt in range(cfg.max_attempts):
            message = self._sample(attempt)
            if cfg.stop_marker in message:
                self.turns += 1
                return None
            reply = _reply_part(message, cfg.reply_marker)
            if reply is not None:
                break
        self.turns += 1
        self.messages.append({"role": "assistant", "content": message})
        return reply or ""

    def opening(self) -> str:
        # The simulator speaks first: the agent's side of the conversation is the "user" role of
        # the simulator's own chat, so it is prompted with a greeting from the agent.
        self.messages.append({"role": "user", "content": self.user.config.greeting})
        message = self._say()
        if message is None:
            raise UserError("the user simulator ended the conversation before it began")
        return message

    def reply(self, agent_message: str) -> str | None:
        self.messages.append({"role": "user",
                              "content": self.user.config.agent_prefix + agent_message})
        return self._say()


def _reply_part(message: str, marker: str | None) -> str | None:
    """The part of a simulator message the agent sees: all of it without a ``marker``, else what
    follows the marker's first occurrence (None when it is missing)."""
    if marker is None:
        return message
    if marker not in message:
        return None
    return message.split(marker, 1)[1].strip()


class LLMUser:
    """A language-model user simulator (see the module docstring).

    Args:
      backend: any generation backend.
      tokenizer: the simulator model's tokenizer (chat template included).
      config: prompt, stop marker, sampling, limits.
      stop_token_ids: end-of-message tokens (the tokenizer's end token by default).
    """

    def __init__(self, backend: GenerationBackend, tokenizer, config: LLMUserConfig | None = None,
                 *, stop_token_ids: Sequence[int] = ()):
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config or LLMUserConfig()
        stops = tuple(int(t) for t in stop_token_ids) or (
            (int(tokenizer.eos_token_id),) if tokenizer.eos_token_id is not None else ())
        if not stops:
            raise ValueError("LLMUser needs stop_token_ids (the tokenizer has no end token)")
        self.stop_token_ids = stops
        try:
            self.config.prompt.format(brief="", stop="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"LLMUserConfig.prompt must be a format string with {{brief}} and "
                             f"{{stop}} only: {err}") from None

    def session(self, task: Task, seed: int = 0) -> UserSession:
        brief = task.metadata.get("user_brief")
        if not isinstance(brief, str) or not brief.strip():
            raise UserError(f"task {task.task_id!r}: a simulated user needs metadata 'user_brief' "
                            "(a non-empty string)")
        return _LLMSession(self, brief, seed, task.task_id)
