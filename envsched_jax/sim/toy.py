"""A small, openly synthetic reward model for the demo and smoke tests.

It is NOT a model of LLM training and no result from it says anything about the paper's claims;
it only gives schedulers rewards with the right shape: K rollouts per task in [0, 1], partial
credit over the task's verifier checks, a gate that sends a rollout to 0 (so groups are often
bimodal), and competence that grows only from groups whose rewards differ (as GRPO learns nothing
from identical rewards).

Per task i in environment e: skill logit ``z_i = a_e + b_i`` (``a_e ~ N(-0.5, 1)``,
``b_i ~ N(0, 1)``), check pass probability ``p_i = sigmoid(z_i)``, gate pass probability
``g_i = sigmoid(z_i + 1)``. A rollout passes the gate with probability ``g_i``; if it does, each of
the task's ``n_i`` checks passes with probability ``p_i`` and the reward is the passed fraction,
else 0. After a step, every selected task with group variance ``v`` raises ``a_e`` by
``lr_env * v`` and ``b_i`` by ``lr_task * v``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class ToyRewardModel:
    env_index: np.ndarray        # [N] int
    num_checks: np.ndarray       # [N] int
    env_skill: np.ndarray        # [E] float
    task_skill: np.ndarray       # [N] float
    lr_env: float = 0.5
    lr_task: float = 2.0

    @classmethod
    def create(cls, env_index, num_checks, seed: int = 0, **kwargs) -> "ToyRewardModel":
        rng = np.random.default_rng(seed)
        env_index = np.asarray(env_index)
        return cls(env_index, np.asarray(num_checks), rng.normal(-0.5, 1.0, env_index.max() + 1),
                   rng.normal(0.0, 1.0, len(env_index)), **kwargs)

    def rewards(self, nodes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """[B, K] rewards for the given nodes (does not change the model)."""
        z = self.env_skill[self.env_index[nodes]] + self.task_skill[nodes]
        p = 1 / (1 + np.exp(-z))
        g = 1 / (1 + np.exp(-(z + 1)))
        n = self.num_checks[nodes]
        gate = rng.random((len(nodes), k)) < g[:, None]
        passed = rng.binomial(n[:, None], p[:, None], size=(len(nodes), k))
        return np.where(gate, passed / n[:, None], 0.0)

    def learn(self, nodes: np.ndarray, rewards: np.ndarray) -> None:
        """Competence grows with the reward variance of each trained group."""
        v = rewards.var(axis=1)
        np.add.at(self.env_skill, self.env_index[nodes], self.lr_env * v)
        self.task_skill[nodes] += self.lr_task * v
