"""The Envs-FORGE pipeline: seeds + rollout log -> N gold-verified exported bundles, resumable.

seeds/001 section 3 end to end, as one function (:func:`synthesize`, driven by
``experiments/forge_synthesize.py``):

1. **Seeds and their preflight** (appendix A.4: representative containers are built and the
   oracle-plus-test path run before anything else): every bundle folder of ``seeds`` (``builtin``
   writes the 25 built-in seeds of :mod:`~envsched_jax.forge.families` into the run folder first)
   goes through gold verification itself. A seed that cannot be read, or fails a check (a broken
   Dockerfile, an oracle that fails, tests that pass on the untouched workspace, network use, host
   paths...), is left out with the check and its cause in ``seeds_rejected.json`` and the report;
   the run continues with the others. Results are kept by content hash, so a resumed run does not
   verify a seed again.
2. **Pass rates** (:mod:`~envsched_jax.forge.passrate`): passes / rollouts of each seed in the
   rollout log, with a Jeffreys interval; seeds with no rollouts take ``predicted`` (a JSON file
   task_id -> mean reward, e.g. EnvSched's posterior, ``passrate.predicted_mean_rewards``),
   labelled ``predicted``; with neither it is an error naming them.
3. **Candidates and selection** (:mod:`~envsched_jax.forge.candidates`, :mod:`~envsched_jax.forge.milp`):
   six candidates per seed under the recipe's action mask (fixed recipes are masks of the same
   model), prompt lengths fixed before solving, then the MILP (SCIP, or its fallbacks), per seed or
   as a portfolio.
4. **Materialisation and gold verification** (:mod:`~envsched_jax.forge.materialize`,
   :mod:`~envsched_jax.forge.verify`): each selected seed is rewritten, verified against its seed
   and every earlier export (overlap), and repaired within the materialiser's budget. Accepted
   bundles are written to ``exports/``; the last rejected bundle of a request to ``rejected/`` with
   its reasons.

**Rounds** (*our choice*; the paper's run exports exactly one bundle per seed, 100 of 100). When
``num_exports`` exceeds the seeds selected, the selection is replayed in rounds: round r rewrites
every selected seed again with ``attempt_seed = r``, so its data differ, and the overlap check
keeps every export distinct. Within a round, seeds go in descending order of their chosen
candidate's frontier score (ties by seed order), so ``num_exports`` below the seed count keeps the
seeds the selection values most. The run stops at ``num_exports`` accepted bundles or after
``max_rounds`` rounds (the report then says how many were missing).

**Resuming.** ``run.json`` holds the configuration and the selection; ``results.jsonl`` one line
per finished request. A second call with the same folder re-reads them, refuses a different
configuration or selection (naming the differing fields), reads accepted exports back from disk
without verifying them again, and continues with the first request that has no line.

**Counting** as section 4 counts synthesis cost: LLM tokens (prompt and completion, from the
client's reports; 0 for the programmatic materialiser), materialised task directories (every
attempt that produced a bundle), and wall-clock time per stage; acceptance by failure reason;
verification throughput (bundles through the executed checks per minute) and the image cache's
hit rate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.forge.actions import RECIPES, frontier_band
from envsched_jax.forge.bundle import BundleError, TaskBundle, convert, read_bundle, write_bundle
from envsched_jax.forge.candidates import ForgeConfig, ForgeInputError, SeedSpec, SkillGraph, build_candidates
from envsched_jax.forge.materialize import MaterializeRequest, MaterializeResult, Materializer
from envsched_jax.forge.milp import Selection, make_problem, select_actions
from envsched_jax.forge.passrate import PassRate, estimate_pass_rates, read_rollout_log
from envsched_jax.forge.verify import CheckResult, DockerVerifier, Verification, VerifyConfig, verify_bundle

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
REPORT_FILE = "report.json"


@dataclasses.dataclass(frozen=True)
class LLMSpec:
    """The model for ``materializer = "llm"``: an OpenAI-compatible server (vLLM or a hosted API),
    or the in-process JAX sampler (``client = "jax"``) running ``policy``."""

    client: Literal["openai", "jax"] = "openai"
    base_url: str = "http://127.0.0.1:8000"
    model: str = ""
    """The served model's name (``openai``)."""
    policy: str = "smollm2"
    """What ``learner.models.load_policy`` takes (``jax``): a name or a policy folder."""
    max_context: int = 16384
    """Context of the in-process sampler (``jax``): the C.2 prompt plus a whole bundle."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the key (the key itself is never stored)."""
    timeout_s: float = 600.0
    max_tokens: int = 8192
    budget: int = 3
    """Calls per request: one generation and ``budget - 1`` repairs."""


@dataclasses.dataclass(frozen=True)
class SynthesisConfig:
    """One synthesis run (module docstring)."""

    seeds: str = "builtin"
    """``builtin`` (the 25 built-in seeds) or a directory of bundle folders (Harbor or TB1)."""
    rollout_log: str | None = None
    """JSON-lines rollout log with ``task_id`` and ``reward`` (any log the project writes)."""
    predicted: str | None = None
    """JSON file task_id -> predicted mean reward, for seeds the log does not cover (labelled)."""
    recipe: Literal["forge", "few_shot", "self_instruct", "evol_instruct", "evol_instruct_depth",
                    "evol_instruct_breadth"] = "forge"
    mode: Literal["per_seed", "portfolio"] = "per_seed"
    num_exports: int = 25
    max_rounds: int = 4
    materializer: Literal["programmatic", "llm"] = "programmatic"
    programmatic_budget: int = 3
    """Attempts per request of the programmatic materialiser (fresh data draws)."""
    llm: LLMSpec = dataclasses.field(default_factory=LLMSpec)
    forge: ForgeConfig = dataclasses.field(default_factory=ForgeConfig)
    verify: VerifyConfig = dataclasses.field(default_factory=VerifyConfig)
    skill_graph: str | None = None
    """JSON ``{"deeper": {skill: [...]}, "neighbours": {...}}``; default: the built-in families' graph."""
    backend: Literal["auto", "scip", "enumeration", "greedy"] = "auto"
    min_rollouts: int = 1
    out: str = "runs/forge"

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ForgeInputError(f"recipe must be one of {list(RECIPES)}, got {self.recipe!r}")
        for name in ("num_exports", "max_rounds", "programmatic_budget", "min_rollouts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ForgeInputError(f"SynthesisConfig.{name} must be an int >= 1, got {value!r}")
        if self.rollout_log is None and self.predicted is None:
            raise ForgeInputError("SynthesisConfig needs a rollout_log or predicted rewards (or both): "
                                  "FORGE selects from the current policy's pass rates")


# ---------------------------------------------------------------------------------------------
# Inputs


def load_seeds(spec: str, run_dir: Path) -> tuple[list[TaskBundle], list[dict[str, str]]]:
    """The readable seed bundles named by ``spec`` in Harbor layout, sorted by name, and one
    ``{seed, check: "read", reason}`` per folder that is not a readable bundle."""
    if spec == "builtin":
        from envsched_jax.forge.families import write_builtin_seeds

        folder = run_dir / "seeds"
        if not folder.is_dir():
            write_builtin_seeds(folder)
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise ForgeInputError(f"seeds {spec!r}: not a directory of bundle folders")
    bundles, rejected = [], []
    for child in sorted(folder.iterdir()):
        if child.is_dir():
            try:
                bundle = read_bundle(child)
                bundles.append(bundle if bundle.layout == "harbor" else convert(bundle, "harbor"))
            except BundleError as err:
                rejected.append({"seed": child.name, "check": "read", "reason": str(err)})
    if not bundles and not rejected:
        raise ForgeInputError(f"seeds {str(folder)!r}: no bundle folders in it")
    return bundles, rejected


def guarded_verify(bundle: TaskBundle, verifier, **kw) -> Verification:
    """:func:`~envsched_jax.forge.verify.verify_bundle`, with an engine failure (the Docker API
    refusing a build or a container start, a lost connection) turned into a rejection by the
    ``infrastructure`` check that names it, so one failure never ends a run of many bundles."""
    try:
        return verify_bundle(bundle, verifier, **kw)
    except Exception as err:  # noqa: BLE001 - any engine error; the bundle is rejected, named
        return Verification(bundle.name, False, (CheckResult("infrastructure", False, f"{type(err).__name__}: {err}"),))


def preflight(seeds: Sequence[TaskBundle], verifier, config: VerifyConfig, cache_file: Path
              ) -> tuple[list[TaskBundle], list[dict[str, str]]]:
    """Gold verification of every seed (module docstring, step 1): the seeds that pass, and one
    ``{seed, check, reason}`` per seed that fails. Verdicts are cached in ``cache_file`` by the
    bundle's content hash."""
    cache = json.loads(cache_file.read_text(encoding="utf-8")) if cache_file.exists() else {}
    good, rejected = [], []
    for bundle in seeds:
        key = bundle.content_hash()
        if key not in cache:
            result = guarded_verify(bundle, verifier, config=config)
            failed = result.failed_check
            cache[key] = {"seed": bundle.name, "accepted": result.accepted,
                          "check": failed.name if failed else ("build" if not result.accepted else ""),
                          "reason": failed.reason if failed else ("" if result.accepted else "not executed")}
            _write_json(cache_file, cache)
        verdict = cache[key]
        if verdict["accepted"]:
            good.append(bundle)
        else:
            rejected.append({"seed": bundle.name, "check": verdict["check"], "reason": verdict["reason"]})
    return good, rejected


def load_skill_graph(path: str | None) -> SkillGraph:
    if path is None:
        from envsched_jax.forge.families import SKILL_GRAPH

        return SKILL_GRAPH
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ForgeInputError(f"skill graph {path}: {err}") from None
    if not isinstance(doc, dict) or set(doc) - {"deeper", "neighbours"}:
        raise ForgeInputError(f"skill graph {path}: expected an object with 'deeper' and 'neighbours', got keys "
                              f"{sorted(doc) if isinstance(doc, dict) else type(doc).__name__}")
    return SkillGraph(deeper=doc.get("deeper", {}), neighbours=doc.get("neighbours", {}))


def seed_spec(bundle: TaskBundle, rate: PassRate, prompt_tokens: int | tuple[int, ...] = 0) -> SeedSpec:
    """The selector's view of a seed: its pass rate, skill subgraph and split
    (``[metadata] split``; ``train`` when absent)."""
    meta = bundle.metadata.get("metadata", {})
    split = meta.get("split", "train") if isinstance(meta, dict) else "train"
    skills = bundle.skills
    return SeedSpec(bundle.name, rate.rate, skills.required, skills.optional, split=str(split),
                    prompt_tokens=prompt_tokens)


def _prompt_tokens(config: SynthesisConfig, bundle: TaskBundle, spec: SeedSpec, graph: SkillGraph,
                   rate: PassRate) -> int | tuple[int, ...]:
    """Prompt length per candidate, a constant fixed before solving (appendix A.2): the exact first
    prompt each candidate would send. The programmatic materialiser sends no prompt (0)."""
    if config.materializer != "llm":
        return 0
    from envsched_jax.forge import prompts

    return prompts.candidate_prompt_tokens(bundle, spec, config.recipe, graph=graph, pass_rate_source=rate.source,
                                           rollouts=rate.rollouts, config=prompt_config(config))


def prompt_config(config: SynthesisConfig):
    """The prompts' settings: the selection's ForgeConfig (its priors give the C.2 projections)
    and the verification limits the contract states."""
    from envsched_jax.forge.prompts import PromptConfig

    return PromptConfig(forge=config.forge, verify=config.verify)


# ---------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass
class _Run:
    config: SynthesisConfig
    out: Path
    seeds: dict[str, TaskBundle]
    rates: dict[str, PassRate]
    selection: Selection
    decisions: dict[str, dict[str, Any]]
    seeds_rejected: list[dict[str, str]]
    exports: list[TaskBundle] = dataclasses.field(default_factory=list)
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _config_record(config: SynthesisConfig) -> dict[str, Any]:
    record = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    record.pop("out")
    return record


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def request_name(seed_id: str, recipe: str, action: str, round_index: int) -> str:
    projection, direction = action.split("/")
    short = f"{projection.split('_')[0][:3]}-{direction.removeprefix('in_')}"
    return f"{seed_id}.{recipe}.{short}.r{round_index}"


def plan(selection: Selection, decisions: Mapping[str, Mapping[str, Any]], seed_order: Sequence[str],
         recipe: str, max_rounds: int) -> list[tuple[int, str, str]]:
    """(round, seed id, request name) in processing order (module docstring: rounds)."""
    chosen = [s for s in seed_order if decisions[s]["action"] is not None]
    ranked = sorted(chosen, key=lambda s: (-decisions[s]["frontier_score"], seed_order.index(s)))
    return [(r, s, request_name(s, recipe, decisions[s]["action"], r)) for r in range(max_rounds) for s in ranked]


def make_materializer(config: SynthesisConfig) -> tuple[Materializer, Callable[[], None]]:
    """The configured materialiser and what closes it (the in-process sampler's threads)."""
    if config.materializer == "programmatic":
        from envsched_jax.forge.materialize import ProgrammaticMaterializer

        return ProgrammaticMaterializer(budget=config.programmatic_budget), lambda: None
    from envsched_jax.forge.llm_materialize import LLMMaterializer
    from envsched_jax.graph.llm_clients import BackendChatClient, OpenAIChatClient

    close: Callable[[], None] = lambda: None
    if config.llm.client == "jax":
        from envsched_jax.learner import models
        from envsched_jax.rollout.backends.jax_sampler import JaxSamplerBackend

        policy = models.load_policy(config.llm.policy)
        backend = JaxSamplerBackend(policy, max_batch=1, max_context=config.llm.max_context)
        client = BackendChatClient(backend, policy.tokenizer, f"jax:{config.llm.policy}", timeout_s=config.llm.timeout_s)
        close = backend.close
    else:
        if not config.llm.model:
            raise ForgeInputError("materializer 'llm' needs --llm.model (the served model's name)")
        client = OpenAIChatClient(config.llm.base_url, config.llm.model,
                                  api_key=os.environ.get(config.llm.api_key_env), timeout_s=config.llm.timeout_s)
    return LLMMaterializer(client, budget=config.llm.budget, max_tokens=config.llm.max_tokens,
                           prompts=prompt_config(config)), close


def prepare(config: SynthesisConfig, verifier) -> _Run:
    """Steps 1-3 of the module docstring, and the resume checks."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    readable, unreadable = load_seeds(config.seeds, out)
    seeds, failed = preflight(readable, verifier, config.verify, out / "seed_preflight.json")
    rejected = unreadable + failed
    _write_json(out / "seeds_rejected.json", rejected)
    if not seeds:
        raise ForgeInputError(f"no seed passed the preflight ({len(rejected)} rejected; see "
                              f"{out / 'seeds_rejected.json'}): {rejected[:3]}")
    ids = [b.name for b in seeds]
    records = read_rollout_log(config.rollout_log) if config.rollout_log else []
    predicted = None
    if config.predicted is not None:
        try:
            predicted = json.loads(Path(config.predicted).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ForgeInputError(f"predicted rewards {config.predicted}: {err}") from None
        if not isinstance(predicted, dict):
            raise ForgeInputError(f"predicted rewards {config.predicted}: expected an object task_id -> reward")
    rates = estimate_pass_rates(records, ids, predicted=predicted, min_rollouts=config.min_rollouts)
    graph = load_skill_graph(config.skill_graph)
    specs = [seed_spec(b, rates[b.name]) for b in seeds]
    specs = [dataclasses.replace(spec, prompt_tokens=_prompt_tokens(config, b, spec, graph, rates[b.name]))
             for b, spec in zip(seeds, specs)]
    cands = build_candidates(specs, graph, config.forge, recipe=config.recipe)
    num_exports = min(config.num_exports, len(seeds)) if config.mode == "portfolio" else None
    selection = select_actions(cands, config.forge, mode=config.mode, num_exports=num_exports, backend=config.backend)
    problem = make_problem(cands, config.forge, mode=config.mode, num_exports=num_exports)
    report = selection.report(problem)
    decisions = {d["seed_id"]: d for d in report["decisions"]}

    record = {"config": _config_record(config),
              "selection": {"objective": round(selection.objective, 9),
                            "actions": {s: d["action"] for s, d in decisions.items()}}}
    run_file = out / RUN_FILE
    if run_file.exists():
        saved = json.loads(run_file.read_text(encoding="utf-8"))
        differs = _differences(saved, record)
        if differs:
            raise ForgeInputError(f"{run_file}: the folder holds another synthesis run (differs in {differs}); "
                                  "use a new --out")
    else:
        _write_json(run_file, record)
    (out / "selection.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    run = _Run(config, out, {b.name: b for b in seeds}, rates, selection, decisions, rejected)
    _reload(run)
    return run


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _reload(run: _Run) -> None:
    """Read finished requests back (resume): accepted exports from disk, not verified again."""
    path = run.out / RESULTS_FILE
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    for k, line in enumerate(lines, 1):
        try:
            result = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines):   # a line cut by an interruption: that request runs again
                break
            raise ForgeInputError(f"{path}: line {k} is not JSON") from None
        if result["accepted"]:
            folder = run.out / "exports" / result["name"]
            try:
                run.exports.append(read_bundle(folder))
            except BundleError as err:
                raise ForgeInputError(f"{path}: line {k}: the accepted export {result['name']!r} cannot be read "
                                      f"back ({err}); remove the line to redo it") from None
        run.results.append(result)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in run.results), encoding="utf-8")


def _record(run: _Run, result: MaterializeResult, round_index: int, seconds: float,
            verify_seconds: float, executed: int) -> dict[str, Any]:
    decision = run.decisions[result.seed]
    rate = run.rates[result.seed]
    return {**result.to_json(), "round": round_index, "seconds": seconds, "verify_seconds": verify_seconds,
            "executed_verifications": executed, "seed_pass_rate": rate.rate, "pass_rate_source": rate.source,
            "projected_pass_rate": decision["projected_pass_rate"], "frontier_score": decision["frontier_score"]}


def synthesize(config: SynthesisConfig, *, materializer: Materializer | None = None,
               verifier: DockerVerifier | None = None, progress: bool = True,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) the pipeline; returns the report (also written to ``report.json``).

    ``materializer`` and ``verifier`` override what the configuration would make (tests pass
    scripted ones); a verifier is always needed, since nothing is exported unverified."""
    start = time.perf_counter()
    verifier = verifier or DockerVerifier(config.verify)
    run = prepare(config, verifier)
    for r in run.seeds_rejected:
        log(f"seed {r['seed']} rejected by the preflight ({r['check']}): {r['reason']}")
    log(f"{len(run.seeds)} seeds; selection: {run.selection.backend} ({run.selection.status}), objective "
        f"{run.selection.objective:.4f} in {run.selection.solve_seconds:.3f} s")
    close_materializer: Callable[[], None] = lambda: None
    if materializer is None:
        materializer, close_materializer = make_materializer(config)
    done = {r["name"] for r in run.results}
    accepted = sum(r["accepted"] for r in run.results)
    todo = [item for item in plan(run.selection, run.decisions, list(run.seeds), config.recipe, config.max_rounds)
            if item[2] not in done]
    builds0, hits0 = verifier.builds, verifier.cache_hits
    results_file = open(run.out / RESULTS_FILE, "a", encoding="utf-8")
    bar = _progress(progress, config.num_exports, accepted)
    try:
        for round_index, seed_id, name in todo:
            if accepted >= config.num_exports:
                break
            seed = run.seeds[seed_id]
            timing = {"seconds": 0.0, "executed": 0}

            def verify(bundle: TaskBundle, seed=seed, timing=timing):
                t0 = time.perf_counter()
                result = guarded_verify(bundle, verifier, parent=seed, others=run.exports, config=config.verify)
                timing["seconds"] += time.perf_counter() - t0
                timing["executed"] += any(c.name == "build" for c in result.checks)
                return result

            request = MaterializeRequest(seed, run.decisions[seed_id], config.recipe, name, round_index,
                                         run.rates[seed_id].source, run.rates[seed_id].rollouts)
            t0 = time.perf_counter()
            result = materializer.materialize(request, verify)
            record = _record(run, result, round_index, time.perf_counter() - t0, timing["seconds"],
                             timing["executed"])
            if result.accepted:
                write_bundle(result.bundle, run.out / "exports" / name, overwrite=True)
                run.exports.append(result.bundle)
                accepted += 1
            elif result.last_bundle is not None:
                write_bundle(result.last_bundle, run.out / "rejected" / name, overwrite=True)
                _write_json(run.out / "rejected" / f"{name}.reasons.json", record)
            results_file.write(json.dumps(record, sort_keys=True) + "\n")
            results_file.flush()
            run.results.append(record)
            bar.update(accepted, f"{name}: {'accepted' if result.accepted else result.failure}")
    finally:
        results_file.close()
        bar.close()
        close_materializer()
    report = build_report(run, time.perf_counter() - start, verifier.builds - builds0, verifier.cache_hits - hits0)
    _write_json(run.out / REPORT_FILE, report)
    log(f"exported {report['exported']} of {config.num_exports} bundles to {run.out / 'exports'} "
        f"({report['requests']} requests, {report['materialized']} materialised directories)")
    return report


def build_report(run: _Run, seconds: float, builds: int, cache_hits: int) -> dict[str, Any]:
    """The run's report (module docstring: counting); figures cover every request of the folder,
    except the cache counts and wall time, which are this call's."""
    results = run.results
    failures = Counter(r["failure"] for r in results if not r["accepted"])
    attempt_failures = Counter(a["failed"] for r in results for a in r["attempts"] if a["failed"])
    verify_seconds = sum(r["verify_seconds"] for r in results)
    executed = sum(r["executed_verifications"] for r in results)
    exported = [r for r in results if r["accepted"]]
    actions = Counter(d["action"] for d in run.decisions.values() if d["action"])
    lookups = builds + cache_hits
    low, high = frontier_band(run.config.forge.frontier)
    return {
        "recipe": run.config.recipe, "mode": run.config.mode, "materializer": run.config.materializer,
        "num_seeds": len(run.seeds), "seeds_rejected": run.seeds_rejected, "num_exports_target": run.config.num_exports,
        "exported": len(exported), "requests": len(results),
        "missing": max(run.config.num_exports - len(exported), 0),
        "solver": {"backend": run.selection.backend, "status": run.selection.status,
                   "scip_status": run.selection.scip_status, "objective": run.selection.objective,
                   "fallback_reason": run.selection.fallback_reason, "solve_seconds": run.selection.solve_seconds,
                   "num_action_variables": run.selection.num_action_variables},
        "actions_chosen": dict(sorted(actions.items())),
        "actions_exported": dict(sorted(Counter(r["action"] for r in exported).items())),
        "rejected_requests_by_failure": dict(sorted(failures.items())),
        "failed_attempts_by_check": dict(sorted(attempt_failures.items())),
        "prompt_tokens": sum(r["prompt_tokens"] for r in results),
        "completion_tokens": sum(r["completion_tokens"] for r in results),
        "materialized": sum(r["materialized"] for r in results),
        "verification": {"seconds": verify_seconds, "executed": executed,
                         "bundles_per_minute": 60.0 * executed / verify_seconds if verify_seconds else None,
                         "builds": builds, "cache_hits": cache_hits,
                         "cache_hit_rate": cache_hits / lookups if lookups else None},
        "seconds": seconds,
        "projected_pass_rates": {"mean": _mean([r["projected_pass_rate"] for r in exported]),
                                 "in_band": _share([low <= r["projected_pass_rate"] <= high for r in exported])},
        "pass_rate_sources": dict(Counter(r.source for r in run.rates.values())),
        "exports": [r["name"] for r in exported],
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


class _progress:
    """A rich progress bar over accepted exports (a no-op when ``enabled`` is False)."""

    def __init__(self, enabled: bool, total: int, completed: int):
        self._bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("exports"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"))
            self._bar.start()
            self._task = self._bar.add_task("", total=total, completed=completed)

    def update(self, completed: int, description: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, description=description)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()

