"""Agentic rollouts: a language model acting in sandboxed environments.

- :mod:`.agent`: the agent loop (:class:`~.agent.AgentRunner`, :class:`~.agent.AgentConfig`).
- :mod:`.chat`: chat-template rendering into one token sequence with a per-token loss mask.
- :mod:`.tool_calls`: each model family's tool-call format.
- :mod:`.backends`: generation backends (in-process JAX sampler, vLLM over HTTP, scripted).
- :mod:`.batch`: finished episodes to the learner's :class:`~envsched_jax.learner.trainer.PolicyBatch`.
"""
