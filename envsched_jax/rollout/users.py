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
  marker (``###STOP###``, as tau-bench's simulator does). Its tokens are never part of the agent's
  learned sequence.
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
      max_turns: simulator messages at most; then the conversation ends.
      timeout_s: the longest wait for one simulator message.
    """

    prompt: str = DEFAULT_USER_PROMPT
    stop_marker: str = "###STOP###"
    sampling: SamplingParams = dataclasses.field(
        default_factory=lambda: SamplingParams(temperature=0.7, top_p=1.0, top_k=0,
                                               max_new_tokens=512))
    max_turns: int = 20
    timeout_s: float = 300.0


class _LLMSession:
    def __init__(self, user: LLMUser, brief: str, seed: int, label: str):
        self.user = user
        self.seed = seed
        self.label = label
        cfg = user.config
        self.messages = [{"role": "system",
                          "content": cfg.prompt.format(brief=brief, stop=cfg.stop_marker)}]
        self.turns = 0

    def _say(self) -> str | None:
        cfg = self.user.config
        if self.turns >= cfg.max_turns:
            return None
        text = self.user.tokenizer.apply_chat_template(self.messages, tokenize=False,
                                                       add_generation_prompt=True)
        ids = tuple(self.user.tokenizer(text, add_special_tokens=False)["input_ids"])
        request = GenerationRequest(ids, cfg.sampling, self.user.stop_token_ids,
                                    seed=self.seed * 1_000 + self.turns,
                                    request_id=f"{self.label}/user{self.turns}")
        completion = self.user.backend.submit(request).result(timeout=cfg.timeout_s)
        if completion.finish_reason == "error":
            raise UserError(f"the user simulator failed: {completion.error}")
        self.turns += 1
        message = self.user.tokenizer.decode(list(completion.token_ids),
                                             skip_special_tokens=True).strip()
        if cfg.stop_marker in message:
            return None
        self.messages.append({"role": "assistant", "content": message})
        return message

    def opening(self) -> str:
        # The simulator speaks first: the agent's side of the conversation is the "user" role of
        # the simulator's own chat, so it is prompted with an empty greeting from the agent.
        self.messages.append({"role": "user", "content": "Hello, how can I help you today?"})
        message = self._say()
        if message is None:
            raise UserError("the user simulator ended the conversation before it began")
        return message

    def reply(self, agent_message: str) -> str | None:
        self.messages.append({"role": "user", "content": agent_message})
        return self._say()


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
