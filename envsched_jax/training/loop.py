"""End-to-end GRPO training with the scheduler in the loop.

One step (EnvSched section 3.1, one epoch per batch):

1. the scheduler selects B tasks;
2. the agent loop runs K episodes of each with the current policy (sandboxed environments; the
   generation backend shares or receives the learner's weights);
3. the verifiers' rewards ([B, K]) go to the scheduler (``observe``);
4. the learner takes one GRPO step on the B x K token sequences;
5. the new weights go to the generation backend (in memory for the in-process sampler; exported
   and reloaded for a vLLM server), so the next step's rollouts are on-policy (staleness 0: the
   loop is synchronous, and the ratio's denominator is the sampler's log-prob of the same
   weights); ``RolloutSpec.sync_every`` = S > 1 syncs every S steps instead (staleness up to
   S - 1 updates, logged as ``policy_lag``);
6. every ``eval_every`` steps the held-out tasks are played (greedy) for the held-out reward;
   every ``checkpoint_every`` steps the learner and the scheduler are saved together.

Before the first step the policy is warm-started by masked SFT on reference trajectories of a
separate part of the pool (:mod:`.warm_start`); GRPO then trains on tasks it has not seen, and
the held-out tasks are seen by neither.

A killed run resumes from its newest checkpoint (``resume``): the learner's state, the
scheduler's state and the step counter are restored; the run's split, tokenizer and config are
read back from the run folder and must match.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.envs.terminal import TerminalRuntime
from envsched_jax.graph.build import build_graph
from envsched_jax.learner import models
from envsched_jax.learner.checkpoint import restore_checkpoint, save_checkpoint
from envsched_jax.learner.trainer import Trainer, TrainerConfig
from envsched_jax.pool.bundles import is_terminal_task
from envsched_jax.pool.model import Pool
from envsched_jax.pool.sources import load_pool
from envsched_jax.rollout.agent import AgentEpisode, AgentRunner
from envsched_jax.rollout.batch import episodes_to_batch, group_episodes, reward_matrix
from envsched_jax.sched import EnvSchedConfig, make_scheduler
from envsched_jax.training import warm_start
from envsched_jax.training.config import TrainConfig
from envsched_jax.training.metrics import DEFAULT_PANELS, MetricsLog, plot_curves

INFRASTRUCTURE_FAILURES = ("generation_error", "user_error", "agent_error")


def _is_infrastructure_failure(ep: AgentEpisode) -> bool:
    return ep.end_reason in INFRASTRUCTURE_FAILURES or ep.end_reason.startswith("sandbox_")


# -- the pool split --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Split:
    """The run's three parts; ``sft`` and ``heldout`` are None when they take no task
    (``sft_per_env`` or ``heldout_per_env`` 0: no warm-start data, no held-out evaluation)."""

    sft: Pool | None
    train: Pool
    heldout: Pool | None

    def ids(self) -> dict[str, list[str]]:
        return {name: [t.task_id for t in part.tasks] if (part := getattr(self, name)) else []
                for name in ("sft", "train", "heldout")}


def _sub_pool(pool: Pool, name: str, tasks) -> Pool | None:
    if not tasks:
        return None
    env_ids = {t.env_id for t in tasks}
    return Pool(f"{pool.name}:{name}", tuple(e for e in pool.environments if e.env_id in env_ids),
                tuple(tasks))


def split_pool(pool: Pool, sft_per_env: int, heldout_per_env: int, seed: int) -> Split:
    """Per environment (tasks shuffled by ``seed``): ``sft_per_env`` tasks with reference
    actions for the warm start, ``heldout_per_env`` for evaluation, the rest for GRPO.

    Raises:
      ValueError: no task is left for GRPO.
    """
    rng = random.Random(seed)
    sft, heldout, train = [], [], []
    for env in pool.environments:
        tasks = [t for t in pool.tasks if t.env_id == env.env_id]
        rng.shuffle(tasks)
        with_ref = [t for t in tasks if t.reference_actions]
        chosen = with_ref[:sft_per_env]
        rest = [t for t in tasks if t not in chosen]
        sft += chosen
        heldout += rest[:heldout_per_env]
        train += rest[heldout_per_env:]
    if not train:
        raise ValueError(f"pool {pool.name!r}: no task left for GRPO after taking {sft_per_env} "
                         f"SFT and {heldout_per_env} held-out tasks per environment")
    return Split(_sub_pool(pool, "sft", sft), _sub_pool(pool, "train", train),
                 _sub_pool(pool, "heldout", heldout))


# -- the pieces of a run -------------------------------------------------------------------------

def _trainer_config(cfg: TrainConfig, objective: str) -> TrainerConfig:
    learner = cfg.learner
    grouping = learner.length_grouping and learner.micro_batch_size is not None
    if objective == "sft":
        return TrainerConfig(objective="sft", micro_batch_size=learner.micro_batch_size,
                             remat=learner.remat, optim=learner.sft_optim, seed=cfg.seed,
                             length_grouping=grouping, pad_multiple=learner.pad_multiple)
    return TrainerConfig(objective="grpo", micro_batch_size=learner.micro_batch_size,
                         remat=learner.remat, grpo=learner.grpo, optim=learner.optim,
                         seed=cfg.seed, length_grouping=grouping,
                         pad_multiple=learner.pad_multiple)


def make_scheduler_for(cfg: TrainConfig, train_pool: Pool):
    graph = build_graph(train_pool)   # task bundles' operations come from their skills (pool_views)
    tools = [train_pool.environment(e).tool_names for e in graph.env_ids]
    spec = cfg.scheduler
    if spec.name == "envsched":
        return make_scheduler("envsched", graph, config=EnvSchedConfig(
            batch_size=spec.batch_size, group_size=spec.group_size), tools_per_env=tools,
            seed=cfg.seed)
    return make_scheduler(spec.name, graph, batch_size=spec.batch_size,
                          group_size=spec.group_size, tools_per_env=tools, seed=cfg.seed)


def make_backend(cfg: TrainConfig, policy: models.Policy, params, export_dir: Path):
    """The generation backend serving ``params`` (the learner's current parameters): the
    in-process sampler, or a vLLM server this run starts on an export of them (stopped when the
    backend closes)."""
    if cfg.rollout.backend == "jax":
        from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

        backend = JaxSamplerBackend(policy, max_batch=cfg.rollout.max_batch,
                                    max_context=cfg.rollout.max_context)
        backend.set_params(params)
        return backend
    from flax import nnx

    from envsched_jax.learner.export import export_policy
    from envsched_jax.rollout.backends.openai_client import OpenAIBackend
    from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig

    graphdef, _ = nnx.split(policy.model, nnx.Param)
    export_policy(policy, export_dir, model=nnx.merge(graphdef, params))
    server = VllmServer(VllmServerConfig(model_dir=str(export_dir),
                                         max_model_len=cfg.rollout.max_context,
                                         dtype="float32")).start()
    return OpenAIBackend(server.base_url, "policy", cfg.rollout.max_context,
                         max_concurrency=cfg.rollout.max_batch, server=server)


def sync_weights(backend, trainer: Trainer, hf_config: dict, export_dir: Path) -> float:
    """Give the backend the learner's current weights; seconds taken."""
    start = time.perf_counter()
    if hasattr(backend, "set_params"):
        backend.set_params(trainer.state.params)
        return time.perf_counter() - start
    from envsched_jax.learner.export import export_model

    export_model(trainer.model_with_params(), hf_config, export_dir)
    backend.update_weights(str(export_dir))
    return time.perf_counter() - start


def evaluate(runner: AgentRunner, tasks, seed: int) -> dict[str, Any]:
    """Play each held-out task once; mean reward, end reasons, and each task's reward (for
    paired comparisons between evaluations of the same tasks)."""
    episodes = runner.run([(t, 0, seed) for t in tasks])
    return {"heldout_reward": float(np.mean([ep.reward for ep in episodes])) if episodes else 0.0,
            "heldout_solved": float(np.mean([ep.reward == 1.0 for ep in episodes])) if episodes else 0.0,
            "heldout_end_reasons": _count_reasons(episodes),
            "heldout_task_rewards": {t.task_id: float(ep.reward) for t, ep in zip(tasks, episodes)}}


PROBE_SEED = 7_919_000_000
"""Sampling seeds of probe episodes start here: fixed, so that two evaluations of the same probe
tasks differ only by the weights."""


def choose_probe_tasks(train: Pool, count: int, seed: int) -> list:
    """``count`` GRPO-training tasks, round-robin over the environments (each environment's tasks
    shuffled by ``seed``), so that the probe covers every environment as evenly as it can."""
    rng = random.Random(seed)
    queues = []
    for env in train.environments:
        tasks = [t for t in train.tasks if t.env_id == env.env_id]
        rng.shuffle(tasks)
        queues.append(tasks)
    chosen: list = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def probe(runner: AgentRunner, tasks, samples: int) -> dict[str, Any]:
    """Play each probe task ``samples`` times with the runner's (training) sampling and the fixed
    seeds :data:`PROBE_SEED` + ...; mean reward, share of solved episodes, and each task's mean
    reward over its samples (for paired comparisons)."""
    episodes = runner.run([(t, k, PROBE_SEED + i * samples + k)
                           for i, t in enumerate(tasks) for k in range(samples)])
    rewards = np.asarray([ep.reward for ep in episodes], np.float64).reshape(len(tasks), samples)
    return {"probe_reward": float(rewards.mean()), "probe_solved": float(np.mean(rewards == 1.0)),
            "probe_end_reasons": _count_reasons(episodes),
            "probe_task_rewards": {t.task_id: float(r) for t, r in zip(tasks, rewards.mean(1))}}


def _count_reasons(episodes) -> dict[str, int]:
    return dict(collections.Counter(ep.end_reason for ep in episodes))


def step_statistics(groups, rewards: np.ndarray) -> dict[str, Any]:
    """The paper's per-step statistics and the step's timing of episodes."""
    flat = [ep for g in groups for ep in g]
    walls = sorted(ep.wall_seconds for ep in flat)
    return {
        "mean_reward": float(rewards.mean()),
        "group_variance": float(rewards.var(axis=1).mean()),
        "informative_groups": float(np.mean(rewards.max(axis=1) > rewards.min(axis=1))),
        "environments": len({g[0].env_id for g in groups}),
        "turns": float(np.mean([ep.num_turns for ep in flat])),
        "sampled_tokens": int(sum(ep.transcript.num_sampled for ep in flat)),
        "sequence_tokens": float(np.mean([len(ep.transcript) for ep in flat])),
        "malformed_calls": int(sum(ep.malformed_calls for ep in flat)),
        "episode_seconds_median": statistics.median(walls),
        "episode_seconds_max": walls[-1],
        "generation_seconds": float(sum(ep.generation_seconds for ep in flat)),
        "environment_seconds": float(sum(ep.environment_seconds for ep in flat)),
        "end_reasons": _count_reasons(flat),
    }


def _warm_start_record(cfg: TrainConfig, split: Split) -> dict[str, Any]:
    """What a cached warm start depends on. The seed (model initialisation, SFT batch order) is
    recorded but not compared: sharing one warm start across run seeds is allowed on purpose
    (``compare_schedulers.py --shared-warm-start``)."""
    agent = dataclasses.asdict(cfg.rollout.agent)
    agent.pop("sampling", None)  # the warm start samples nothing
    agent.pop("episode_timeout_s", None)
    agent.pop("reward", None)  # it keeps only reference episodes of full reward under either rule
    learner = cfg.learner
    return json.loads(json.dumps({
        "sft_tasks": split.ids()["sft"], "policy": dataclasses.asdict(cfg.policy),
        "sft_steps": learner.sft_steps, "sft_batch_size": learner.sft_batch_size,
        "sft_optim": dataclasses.asdict(learner.sft_optim), "max_length": learner.max_length,
        "pad_multiple": learner.pad_multiple, "agent": agent, "pool": cfg.pool.spec,
        "sft_init": _read_record(Path(learner.sft_init)) if learner.sft_init else None},
        default=str))


def _read_record(folder: Path) -> dict[str, Any]:
    path = folder / "warm_start.json"
    if not path.is_file():
        raise ValueError(f"{folder}: not a warm-started policy folder (no warm_start.json); "
                         "--learner.sft-init takes a folder written through --learner.sft-cache")
    return json.loads(path.read_text())


def _check_warm_start_record(cache: Path, record: dict[str, Any]) -> None:
    path = cache / "warm_start.json"
    if not path.is_file():
        raise ValueError(f"{cache}: a cached policy without warm_start.json (what it was trained "
                         "on is unknown); remove the folder or choose another --learner.sft-cache")
    saved = json.loads(path.read_text())
    saved.pop("seed", None)
    if saved != record:
        raise ValueError(f"{path}: the cached warm start was made for another configuration "
                         f"(differs in {sorted(_differences(saved, record))}); remove the folder "
                         "or choose another --learner.sft-cache")


def _shared_eval_key(cfg: TrainConfig, split: Split) -> dict[str, Any]:
    return json.loads(json.dumps({
        "heldout": split.ids()["heldout"], "agent": dataclasses.asdict(cfg.rollout.agent),
        "eval_sampling": dataclasses.asdict(cfg.rollout.eval_sampling),
        "sandbox": cfg.rollout.sandbox, "backend": cfg.rollout.backend}, default=str))


def _shared_eval_path(cfg: TrainConfig, split: Split) -> Path | None:
    """Where the step-0 held-out evaluation of a cached warm start is shared (None: no cache,
    or sampled evaluation, which depends on the run's seed)."""
    if cfg.learner.sft_cache is None or not cfg.rollout.eval_sampling.greedy:
        return None
    return Path(cfg.learner.sft_cache) / "eval_step0.json"


def _shared_probe_key(cfg: TrainConfig, tasks) -> dict[str, Any]:
    return json.loads(json.dumps({
        "tasks": [t.task_id for t in tasks], "samples": cfg.probe_samples,
        "agent": dataclasses.asdict(cfg.rollout.agent), "sandbox": cfg.rollout.sandbox,
        "backend": cfg.rollout.backend}, default=str))


def _shared_step0(path: Path | None, key: dict[str, Any], compute) -> tuple[dict[str, Any], bool]:
    """(result, read from the cache): the step-0 evaluation of a cached warm start stored at
    ``path`` under ``key``, or ``compute()``, stored there (when ``path`` is not None). Every
    run that reads the same warm start has the same weights, tasks and seeds, so the first one
    computes it and the others read it."""
    if path is not None and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["result"], True
    result = compute()
    if path is not None:
        path.write_text(json.dumps({"key": key, "result": result}, indent=2, sort_keys=True) + "\n")
    return result, False


def _latest_checkpoint(folder: Path) -> Path | None:
    steps = sorted(folder.glob("step_*"))
    return steps[-1] if steps else None


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".") or "<root>"]


def _check_run_record(out: Path, record: dict[str, Any]) -> None:
    """A resumed run must be the same run: same config and split."""
    path = out / "run.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != record:
            differs = sorted(_differences(saved, record))
            raise ValueError(f"{path}: the run folder holds another run (differs in {differs}); "
                             "use a new --out or --no-resume with an empty folder")
    else:
        path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


# -- the run -------------------------------------------------------------------------------------

def train(cfg: TrainConfig, *, progress=print) -> dict[str, Any]:
    """Run (or resume) the whole recipe; returns the final summary (also in ``summary.json``)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = load_pool(cfg.pool.spec)
    split = split_pool(pool, cfg.pool.sft_per_env, cfg.pool.heldout_per_env, cfg.pool.seed)
    record = {"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
              "split": split.ids()}
    for key in ("resume", "steps", "out"):  # may differ on resume (longer, or a moved folder)
        record["config"].pop(key, None)
    latest = _latest_checkpoint(out / "checkpoints") if cfg.resume else None
    if not cfg.resume and (out / "run.json").exists():
        raise ValueError(f"{out} already holds a run; pass --resume or choose another --out")
    _check_run_record(out, record)

    sandbox = SandboxConfig(kind=cfg.rollout.sandbox, num_workers=cfg.rollout.workers)
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        workers = stack.enter_context(make_worker_pool(sandbox))
        log = stack.enter_context(MetricsLog(out))
        t0 = time.perf_counter()
        cache = cfg.learner.sft_cache
        if cache is not None and (Path(cache) / "model.safetensors").is_file():
            _check_warm_start_record(Path(cache), _warm_start_record(cfg, split))
            policy = models.load_policy(cache)
            tokenizer = policy.tokenizer
            progress(f"warm-started policy read from {cache}")
        else:
            if cfg.learner.sft_init is not None:
                _read_record(Path(cfg.learner.sft_init))  # refuse a folder that is not one
                policy = warm_start.initial_policy(cfg, Path(cfg.learner.sft_init))
                tokenizer = policy.tokenizer
            else:
                policy, tokenizer = warm_start.policy_and_tokenizer(cfg, split, workers,
                                                                    out / "tokenizer")
            if latest is None and cfg.learner.sft_steps > 0:
                model = warm_start.warm_start(cfg, policy, tokenizer, split, workers,
                                              _trainer_config(cfg, "sft"), log, progress)
                policy = dataclasses.replace(policy, model=model)
                if cache is not None:
                    from envsched_jax.learner.export import export_policy

                    export_policy(policy, cache)
                    (Path(cache) / "warm_start.json").write_text(json.dumps(
                        {**_warm_start_record(cfg, split), "seed": cfg.seed}, indent=2,
                        sort_keys=True) + "\n")
        timings["policy_seconds"] = time.perf_counter() - t0
        trainer = Trainer(policy.model, models.forward, _trainer_config(cfg, "grpo"))
        scheduler = make_scheduler_for(cfg, split.train)
        start_step = 0
        if latest is not None:
            trainer.state = restore_checkpoint(latest, trainer.state, trainer.config,
                                               scheduler=scheduler)
            start_step = int(trainer.state.step)
            progress(f"resumed from {latest} at step {start_step}")
        backend = make_backend(cfg, policy, trainer.state.params, out / "export")
        stack.callback(backend.close)
        terminal = None
        if any(is_terminal_task(t) for t in pool.tasks):  # task bundles: one Docker runtime
            terminal = TerminalRuntime()
            stack.callback(terminal.close)
        agent = AgentRunner(backend, tokenizer, workers, pool, cfg.rollout.agent,
                            stop_token_ids=policy.eos_token_ids, terminal=terminal)
        eval_agent = AgentRunner(backend, tokenizer, workers, pool, dataclasses.replace(
            cfg.rollout.agent, sampling=cfg.rollout.eval_sampling),
            stop_token_ids=policy.eos_token_ids, terminal=terminal)
        in_flight = max(cfg.rollout.workers, 1)

        probe_set = (choose_probe_tasks(split.train, cfg.probe_tasks, cfg.pool.seed)
                     if cfg.probe_tasks else [])

        def timed(compute):
            def run() -> dict[str, Any]:
                t0 = time.perf_counter()
                result = compute()
                result["eval_seconds"] = time.perf_counter() - t0
                return result
            return run

        def run_eval(step: int) -> None:
            if not cfg.eval_every:
                return
            cache = Path(cfg.learner.sft_cache) if cfg.learner.sft_cache is not None else None
            if split.heldout is not None:
                result, cached = _shared_step0(
                    _shared_eval_path(cfg, split) if step == 0 else None,
                    _shared_eval_key(cfg, split),
                    timed(lambda: evaluate(eval_agent, split.heldout.tasks, cfg.seed)))
                log.log("eval", step, dict(result, eval_cached=True) if cached else result)
                progress(f"step {step:4d} eval: held-out reward {result['heldout_reward']:.3f} "
                         f"(solved {result['heldout_solved']:.2f})"
                         + (" [step 0 of the cached warm start]" if cached else ""))
            if probe_set:
                result, cached = _shared_step0(
                    cache / "probe_step0.json" if cache is not None and step == 0 else None,
                    _shared_probe_key(cfg, probe_set),
                    timed(lambda: probe(agent, probe_set, cfg.probe_samples)))
                log.log("probe", step, dict(result, eval_cached=True) if cached else result)
                progress(f"step {step:4d} probe: training-task reward {result['probe_reward']:.3f} "
                         f"(solved {result['probe_solved']:.2f}; {len(probe_set)} tasks x "
                         f"{cfg.probe_samples})" + (" [step 0 of the cached warm start]"
                                                    if cached else ""))

        if start_step == 0:
            run_eval(0)
        B, K = cfg.scheduler.batch_size, cfg.scheduler.group_size
        lag = 0  # learner updates the serving weights are behind (RolloutSpec.sync_every)
        for t in range(start_step, cfg.steps):
            t_step = time.perf_counter()
            ids = scheduler.select(t)
            tasks = [pool.tasks[pool.task_index(i)] for i in ids]
            jobs = [(task, k, cfg.seed * 1_000_003 + t * B * K + i * K + k)
                    for i, task in enumerate(tasks) for k in range(K)]
            t0 = time.perf_counter()
            episodes = agent.run(jobs, max_in_flight=in_flight,
                                 deadline_s=cfg.rollout.step_deadline_s)
            rollout_s = time.perf_counter() - t0
            groups = group_episodes(episodes, ids, K)
            rewards = reward_matrix(groups)
            scheduler.observe(t, ids, rewards)
            if cfg.learner.mask_infrastructure_failures:
                for ep in episodes:
                    if _is_infrastructure_failure(ep):
                        ep.transcript.loss_mask = [0] * len(ep.transcript.loss_mask)
            batch = episodes_to_batch(groups, pad_id=policy.pad_token_id, grpo=cfg.learner.grpo,
                                      max_length=cfg.learner.max_length,
                                      pad_multiple=cfg.learner.pad_multiple)
            learner = trainer.train(batch)
            lag_at_rollout = lag
            lag += 1
            sync_s = 0.0
            if lag >= cfg.rollout.sync_every:
                sync_s = sync_weights(backend, trainer, policy.hf_config, out / "export")
                lag = 0
            stats = step_statistics(groups, rewards)
            stats.update({f"learner_{k}": v for k, v in learner.items()})
            stats.update(rollout_seconds=rollout_s, learner_seconds=learner["step_seconds"],
                         sync_seconds=sync_s, policy_lag=lag_at_rollout,
                         step_seconds=time.perf_counter() - t_step,
                         scheduler=cfg.scheduler.name)
            log.log("step", t + 1, stats)
            progress(f"step {t + 1:4d}: reward {stats['mean_reward']:.3f}, var "
                     f"{stats['group_variance']:.4f}, envs {stats['environments']}, loss "
                     f"{learner['loss']:+.4f}, {stats['step_seconds']:.1f} s (rollouts "
                     f"{rollout_s:.1f}, learner {learner['step_seconds']:.1f})")
            done = t + 1
            if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
                run_eval(done)
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                save_checkpoint(out / "checkpoints", trainer.state, trainer.config,
                                scheduler=scheduler, extra={"run": "run.json"})
    summary = summarize(out)
    summary.update(timings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    panels = DEFAULT_PANELS + ((("probe", "probe_reward", "training-task probe reward"),)
                               if cfg.probe_tasks else ())
    plot_curves({cfg.scheduler.name: out / "metrics.jsonl"}, out / "curves.png", panels)
    return summary


def summarize(out: Path) -> dict[str, Any]:
    """The run's headline figures from its ``metrics.jsonl``."""
    from envsched_jax.training.metrics import read_metrics

    steps = read_metrics(out / "metrics.jsonl", "step")
    evals = read_metrics(out / "metrics.jsonl", "eval")
    summary: dict[str, Any] = {"steps": len(steps)}
    if steps:
        summary.update(
            mean_reward=float(np.mean([s["mean_reward"] for s in steps])),
            first_reward=steps[0]["mean_reward"], last_reward=steps[-1]["mean_reward"],
            group_variance=float(np.mean([s["group_variance"] for s in steps])),
            environments=float(np.mean([s["environments"] for s in steps])),
            step_seconds=float(np.mean([s["step_seconds"] for s in steps])),
            rollout_share=float(np.sum([s["rollout_seconds"] for s in steps])
                                / np.sum([s["step_seconds"] for s in steps])),
            learner_share=float(np.sum([s["learner_seconds"] for s in steps])
                                / np.sum([s["step_seconds"] for s in steps])))
    if evals:
        summary.update(heldout_first=evals[0]["heldout_reward"],
                       heldout_last=evals[-1]["heldout_reward"],
                       heldout_best=max(e["heldout_reward"] for e in evals))
    probes = read_metrics(out / "metrics.jsonl", "probe")
    if probes:
        summary.update(probe_first=probes[0]["probe_reward"], probe_last=probes[-1]["probe_reward"])
    return summary
