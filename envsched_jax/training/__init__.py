"""End-to-end training: the scheduler selects, the policy acts in sandboxed environments, the
verifiers reward, the scheduler observes, the learner updates.

- :mod:`.config`: the run's typed, nested configuration.
- :mod:`.loop`: :func:`~.loop.train` (select -> rollouts -> observe -> update -> sync ->
  evaluate -> checkpoint, resumable), the pool split.
- :mod:`.warm_start`: the tiny policy and its tokenizer, masked SFT on reference trajectories.
- :mod:`.metrics`: JSON-lines and TensorBoard logs, PNG curves.
"""
