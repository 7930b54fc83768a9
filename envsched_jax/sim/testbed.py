"""Learning-dynamics testbed: a SIMULATED GRPO learner on an environment-task pool.

This is a simulation, stated openly. It is not an LLM and no number it produces is a training
result; it lets schedulers be compared in minutes under dynamics with the qualitative shape of
agentic GRPO training: bimodal, partially credited rewards; learning only from groups whose
rewards differ; transfer between tasks that share environment or skills; slight forgetting.

Policy. Latent competences: one per environment, ``c_env[e]``, and one per abstract skill,
``c_skill[s]``. A task's skills are what the graph extractor finds in it (its operation families,
e.g. ``lookup`` / ``update`` / ``authorize``, and its gate types, e.g. ``existence`` /
``permission``), so skills are shared across environments exactly as the cross-environment
relation suggests. Per task i (environment e, skill weights w_is summing to 1, static difficulty
d_i)::

    z_i = c_env[e] + sum_s w_is c_skill[s] - d_i

A rollout draws its own quality ``eps ~ N(0, rollout_noise^2)`` (one per rollout, shared by its
checks, which makes rollouts succeed or fail together); it passes the task's gate with probability
``sigmoid(gate_scale (z_i + eps) + gate_offset)`` (tasks without an extracted gate always pass it);
a rollout that fails the gate scores 0 (the gate blocks the dependent checks); otherwise each of the
task's n_i verifier checks passes independently with probability
``sigmoid(check_scale (z_i + eps))`` and the
reward is the passed fraction. Difficulty: ``d_i = difficulty_mean + difficulty_per_op (ops_i -
mean ops) + difficulty_noise * N(0, 1)`` with ops_i the number of extracted operations (a fixed
draw per pool, shared by all seeds and schedulers).

Learning (one GRPO step on the selected batch). The gradient GRPO gets from a group is zero when
its rewards are identical and grows with their spread; the testbed uses the group's reward
standard deviation ``sd_i`` as the signal. Averaged over the batch::

    c_env[e]   += lr_env   * sum_{i in batch, env i = e} sd_i / B
    c_skill[s] += lr_skill * sum_{i in batch} w_is sd_i / B
    c_skill[s] -= forget * (c_skill[s] - c_skill0[s])   for skills with no signal this step

Environment competence transfers to every task of the environment, skill competence to every
task (in any environment, held-out ones included) that uses the skill.

Held-out environments are never selectable; the downstream score is their mean expected reward
(Monte Carlo over a fixed set of rollout qualities, common to all schedulers and steps), in %.

Everything is a pure jitted function of (static structure, state, key) and ``jax.vmap`` runs it
over seeds; the parameters live in :class:`TestbedParams` (calibrated once against Random, see
:mod:`envsched_jax.sim.calibration`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envsched_jax.graph.extract import analyse_environment, extract
from envsched_jax.pool.model import Pool


@struct.dataclass
class TestbedParams:
    """Testbed parameters (a pytree: sweeps can ``vmap`` over them). The defaults are the frozen
    calibration (see :mod:`envsched_jax.sim.calibration`)."""

    __test__ = False  # not a pytest class

    difficulty_mean: float = -0.25
    """Mean task difficulty (logit units); the main knob for the median reward."""
    difficulty_per_op: float = 0.15
    """Extra difficulty per extracted operation above the pool's mean."""
    difficulty_noise: float = 2.5
    """Spread of task difficulty."""
    env_spread: float = 0.5
    """Spread of the initial environment competences."""
    rollout_noise: float = 0.4
    """Per-rollout quality noise (logit units); the main knob for within-group variance."""
    check_scale: float = 1.0
    """Sharpness of a check given the rollout's quality (large: a rollout's checks pass or fail
    together)."""
    gate_scale: float = 2.0
    """Sharpness of the gate."""
    gate_offset: float = 1.0
    """Gate pass logit at z = 0 (gates are easier than the checks behind them)."""
    lr_env: float = 0.3
    """Environment competence step per unit of batch-mean reward spread."""
    lr_skill: float = 0.15
    """Skill competence step per unit of batch-mean reward spread."""
    forget: float = 0.002
    """Per-step decay of untrained skills toward their initial competence."""
    eval_samples: int = struct.field(pytree_node=False, default=16)
    """Rollout qualities per held-out task in the downstream score."""


@struct.dataclass
class TestbedStructure:
    """Static arrays of a pool: training nodes first, then held-out nodes."""

    env: jax.Array           # [N_all] int32 environment index
    skills: jax.Array        # [N_all, S] float32 skill weights (rows sum to 1, or 0 if none)
    num_checks: jax.Array    # [N_all] int32
    has_gate: jax.Array      # [N_all] bool
    num_ops: jax.Array       # [N_all] float32 extracted operations
    heldout: jax.Array       # [N_all] bool
    noise: jax.Array         # [N_all] float32 fixed N(0, 1) draw of the difficulty
    env_noise: jax.Array     # [E] float32 fixed N(0, 1) draw of the initial competence
    num_train: int = struct.field(pytree_node=False)
    skill_names: tuple[str, ...] = struct.field(pytree_node=False)


@struct.dataclass
class TestbedState:
    c_env: jax.Array      # [E]
    c_skill: jax.Array    # [S]
    c_skill0: jax.Array   # [S] initial skill competence (forgetting target)


def task_skills(pool: Pool) -> tuple[list[list[str]], list[int], list[bool]]:
    """Per task: skill names (operation families and gate types), operation count, has a gate."""
    tools = {env.env_id: analyse_environment(env) for env in pool.environments}
    names, ops, gates = [], [], []
    for task in pool.tasks:
        ex = extract(pool.environment(task.env_id), task, tools[task.env_id])
        names.append([f"op:{op.family}" for op in ex.operations] + [f"gate:{g.type}" for g in ex.gates])
        ops.append(len(ex.operations))
        gates.append(bool(ex.gates))
    return names, ops, gates


def build_structure(pool: Pool, heldout_envs: Sequence[str] = (), seed: int = 0) -> TestbedStructure:
    """Static testbed arrays for ``pool``; tasks of ``heldout_envs`` go last and are never
    selectable. ``seed`` fixes the difficulty draw (keep it fixed across compared runs)."""
    held = set(heldout_envs)
    unknown = held - {e.env_id for e in pool.environments}
    if unknown:
        raise ValueError(f"held-out environments {sorted(unknown)} are not in pool {pool.name!r}")
    order = [k for k, t in enumerate(pool.tasks) if t.env_id not in held] + \
            [k for k, t in enumerate(pool.tasks) if t.env_id in held]
    names, ops, gates = task_skills(pool)
    vocab = sorted({s for row in names for s in row})
    col = {s: j for j, s in enumerate(vocab)}
    skills = np.zeros((len(pool.tasks), len(vocab)), np.float32)
    for k, row in enumerate(names):
        for s in row:
            skills[k, col[s]] += 1.0
    skills /= np.maximum(skills.sum(axis=1, keepdims=True), 1.0)
    env_ids = [e.env_id for e in pool.environments]
    env_of = {e: j for j, e in enumerate(env_ids)}
    env = np.array([env_of[t.env_id] for t in pool.tasks], np.int32)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(len(pool.tasks)).astype(np.float32)
    env_noise = rng.standard_normal(len(env_ids)).astype(np.float32)
    idx = np.array(order)
    return TestbedStructure(
        env=jnp.asarray(env[idx]), skills=jnp.asarray(skills[idx]),
        num_checks=jnp.asarray(np.array([max(len(t.checks), 1) for t in pool.tasks], np.int32)[idx]),
        has_gate=jnp.asarray(np.array(gates)[idx]), num_ops=jnp.asarray(np.array(ops, np.float32)[idx]),
        heldout=jnp.asarray(np.array([pool.tasks[k].env_id in held for k in order])),
        noise=jnp.asarray(noise[idx]), env_noise=jnp.asarray(env_noise),
        num_train=sum(1 for t in pool.tasks if t.env_id not in held), skill_names=tuple(vocab))


def train_order(pool: Pool, heldout_envs: Sequence[str] = ()) -> list[str]:
    """Task ids of the training nodes in testbed order (the order of :func:`build_structure`)."""
    held = set(heldout_envs)
    return [t.task_id for t in pool.tasks if t.env_id not in held]


def float32(params: TestbedParams) -> TestbedParams:
    """The parameters as float32 arrays. Every function below starts with this, so the testbed
    computes in float32 even when a caller has enabled ``jax_enable_x64`` (where Python floats
    passed through jit would otherwise become float64 and change the state's dtype)."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def init_state(structure: TestbedStructure, params: TestbedParams) -> TestbedState:
    params = float32(params)
    c_env = params.env_spread * structure.env_noise
    c_skill = jnp.zeros(structure.skills.shape[1], jnp.float32)
    return TestbedState(c_env=c_env, c_skill=c_skill, c_skill0=c_skill)


def difficulty(structure: TestbedStructure, params: TestbedParams) -> jax.Array:
    ops = structure.num_ops - structure.num_ops.mean()
    return params.difficulty_mean + params.difficulty_per_op * ops + params.difficulty_noise * structure.noise


def logits(structure: TestbedStructure, state: TestbedState, params: TestbedParams) -> jax.Array:
    """z_i for every node [N_all]."""
    params = float32(params)
    return state.c_env[structure.env] + structure.skills @ state.c_skill - difficulty(structure, params)


def _rollout_rewards(z: jax.Array, n: jax.Array, has_gate: jax.Array, eps: jax.Array, u_gate: jax.Array,
                     u_checks: jax.Array, params: TestbedParams) -> jax.Array:
    """Rewards for logits z [B] given rollout qualities eps [B, K] and uniforms."""
    zk = z[:, None] + eps
    gate = jnp.where(has_gate[:, None], u_gate < jax.nn.sigmoid(params.gate_scale * zk + params.gate_offset), True)
    p = jax.nn.sigmoid(params.check_scale * zk)
    max_checks = u_checks.shape[-1]
    valid = jnp.arange(max_checks)[None, None, :] < n[:, None, None]
    passed = ((u_checks < p[..., None]) & valid).sum(-1)
    return jnp.where(gate, passed / n[:, None], 0.0)


@functools.partial(jax.jit, static_argnames=("group_size", "max_checks"))
def rollout(structure: TestbedStructure, state: TestbedState, params: TestbedParams, nodes: jax.Array,
            key: jax.Array, *, group_size: int, max_checks: int) -> jax.Array:
    """K rewards for each of ``nodes`` [B] (training indices): [B, K] in [0, 1]."""
    params = float32(params)
    z = logits(structure, state, params)[nodes]
    k_eps, k_gate, k_checks = jax.random.split(key, 3)
    b = nodes.shape[0]
    # float32 draws whatever jax_enable_x64 says: under x64 the default dtype is float64, whose
    # draws from the same key are different numbers (not just wider ones).
    eps = params.rollout_noise * jax.random.normal(k_eps, (b, group_size), jnp.float32)
    u_gate = jax.random.uniform(k_gate, (b, group_size), jnp.float32)
    u_checks = jax.random.uniform(k_checks, (b, group_size, max_checks), jnp.float32)
    return _rollout_rewards(z, structure.num_checks[nodes], structure.has_gate[nodes], eps, u_gate,
                            u_checks, params)


@jax.jit
def learn(structure: TestbedStructure, state: TestbedState, params: TestbedParams, nodes: jax.Array,
          rewards: jax.Array) -> TestbedState:
    """One simulated GRPO step on the groups ``rewards`` [B, K] of ``nodes`` [B]."""
    params = float32(params)
    rewards = rewards.astype(jnp.float32)
    sd = rewards.std(axis=1)
    b = nodes.shape[0]
    c_env = state.c_env.at[structure.env[nodes]].add(params.lr_env * sd / b)
    skill_signal = (structure.skills[nodes] * sd[:, None]).sum(0)
    c_skill = state.c_skill + params.lr_skill * skill_signal / b
    idle = skill_signal <= 0
    c_skill = jnp.where(idle, c_skill - params.forget * (c_skill - state.c_skill0), c_skill)
    return state.replace(c_env=c_env, c_skill=c_skill)


def expected_reward(structure: TestbedStructure, state: TestbedState, params: TestbedParams,
                    nodes: jax.Array) -> jax.Array:
    """Expected reward of ``nodes`` under a fixed quadrature of rollout qualities (no sampling of
    gates or checks: their expectations are exact given eps). [len(nodes)]."""
    params = float32(params)
    eps = _quadrature(params)
    z = logits(structure, state, params)[nodes][:, None] + eps[None, :]
    gate = jnp.where(structure.has_gate[nodes][:, None],
                     jax.nn.sigmoid(params.gate_scale * z + params.gate_offset), 1.0)
    return (gate * jax.nn.sigmoid(params.check_scale * z)).mean(axis=1)


def _quadrature(params: TestbedParams) -> jax.Array:
    """Fixed quantiles of N(0, rollout_noise^2): the same points for every call."""
    params = float32(params)
    q = (jnp.arange(params.eval_samples) + 0.5) / params.eval_samples
    return params.rollout_noise * jnp.sqrt(2.0) * jax.scipy.special.erfinv(2 * q - 1)


@functools.partial(jax.jit, static_argnames=("group_size",))
def expected_group_variance(structure: TestbedStructure, state: TestbedState, params: TestbedParams,
                            *, group_size: int) -> jax.Array:
    """Expected population variance of a group of K rewards, for every training node [num_train].

    Given a rollout quality eps, the reward is G X / n with G ~ Bernoulli(g), X ~ Binomial(n, p),
    so E[r | eps] = g p and E[r^2 | eps] = g (p^2 + p (1 - p) / n); the variance over rollouts
    comes from the quadrature over eps, and a group's population variance has expectation
    (K - 1) / K times it."""
    params = float32(params)
    nodes = jnp.arange(structure.num_train)
    z = logits(structure, state, params)[nodes][:, None] + _quadrature(params)[None, :]
    g = jnp.where(structure.has_gate[nodes][:, None], jax.nn.sigmoid(params.gate_scale * z + params.gate_offset), 1.0)
    p = jax.nn.sigmoid(params.check_scale * z)
    n = structure.num_checks[nodes][:, None]
    mean = (g * p).mean(axis=1)
    second = (g * (p ** 2 + p * (1 - p) / n)).mean(axis=1)
    return (group_size - 1) / group_size * jnp.maximum(second - mean ** 2, 0.0)


@jax.jit
def heldout_score(structure: TestbedStructure, state: TestbedState, params: TestbedParams) -> jax.Array:
    """Downstream score: mean expected reward over the held-out tasks, in %."""
    z_all = expected_reward(structure, state, params, jnp.arange(structure.env.shape[0]))
    held = structure.heldout
    return 100.0 * jnp.where(held, z_all, 0.0).sum() / jnp.maximum(held.sum(), 1)


@jax.jit
def train_expected_reward(structure: TestbedStructure, state: TestbedState, params: TestbedParams) -> jax.Array:
    """Expected reward of every training node [num_train]."""
    return expected_reward(structure, state, params, jnp.arange(structure.num_train))
