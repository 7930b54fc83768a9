"""The Envs-FORGE pipeline: selection -> materialisation -> verification -> export, resumable.

Fast tests use a stand-in for the Docker checks (every executed check passes; the static checks
are real); one test runs the real engine end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsched_jax.envs.sandbox import unavailable_reason
from envsched_jax.forge.bundle import read_bundle
from envsched_jax.forge.candidates import ForgeInputError
from envsched_jax.forge.families import builtin_seeds, to_bundle
from envsched_jax.forge.materialize import ProgrammaticMaterializer
from envsched_jax.forge.pipeline import SynthesisConfig, plan, request_name, synthesize
from envsched_jax.forge.simulated_policy import SkillCompetencePolicy, write_rollout_log
from envsched_jax.forge.verify import CheckResult, DockerVerifier, VerifyConfig


class PassingChecks:
    """Stands in for DockerVerifier: the executed checks pass and are counted."""

    def __init__(self):
        self.builds = self.cache_hits = 0
        self.checked: list[str] = []
        self.config = VerifyConfig()

    def run_checks(self, bundle):
        self.builds += 1
        if bundle.name.count(".") >= 3:   # an export (seeds are preflighted too; not counted here)
            self.checked.append(bundle.name)
        return [CheckResult(n, True) for n in ("build", "oracle", "untouched")], {
            "logs": {}, "oracle_reward": 1.0, "untouched_reward": 0.0, "image": "fake", "cache_hit": False}


class Interrupt(ProgrammaticMaterializer):
    """Raises KeyboardInterrupt at the n-th request, as a user's Ctrl-C would."""

    def __init__(self, n: int):
        super().__init__()
        object.__setattr__(self, "left", n)

    def materialize(self, request, verify):
        if self.left == 0:
            raise KeyboardInterrupt
        object.__setattr__(self, "left", self.left - 1)
        return super().materialize(request, verify)


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    bundles = [to_bundle(n, p) for n, p in builtin_seeds()]
    path = tmp_path_factory.mktemp("log") / "rollouts.jsonl"
    return write_rollout_log(SkillCompetencePolicy.draw(0).rollouts(bundles, 15, 0), path)


def _config(tmp_path, log, **kw) -> SynthesisConfig:
    return SynthesisConfig(rollout_log=str(log), out=str(tmp_path / "run"), **kw)


def test_exports_the_requested_number_with_a_complete_report(tmp_path, log):
    checks = PassingChecks()
    report = synthesize(_config(tmp_path, log, num_exports=6), verifier=checks, progress=False, log=lambda _: None)
    assert report["exported"] == 6 and report["missing"] == 0 and len(checks.checked) == 6
    assert report["solver"]["status"] == "optimal" and report["solver"]["num_action_variables"] == 150
    exports = sorted(p.name for p in (tmp_path / "run" / "exports").iterdir())
    assert exports == sorted(report["exports"])
    for name in exports:
        bundle = read_bundle(tmp_path / "run" / "exports" / name)
        assert bundle.name == name and bundle.layout == "harbor"
    selection = json.loads((tmp_path / "run" / "selection.json").read_text())
    ranked = sorted((d for d in selection["decisions"]), key=lambda d: -d["frontier_score"])
    assert [n.split(".")[0] for n in report["exports"]] == [d["seed_id"] for d in ranked[:6]]
    assert report["pass_rate_sources"] == {"rollouts": 25}
    assert report["verification"]["executed"] == 6 and report["materialized"] == 6
    assert report["prompt_tokens"] == 0 and report["completion_tokens"] == 0


def test_an_interrupted_run_resumes_without_verifying_accepted_exports_again(tmp_path, log):
    cfg = _config(tmp_path, log, num_exports=5)
    first = PassingChecks()
    with pytest.raises(KeyboardInterrupt):
        synthesize(cfg, materializer=Interrupt(3), verifier=first, progress=False, log=lambda _: None)
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3 and len(first.checked) == 3
    second = PassingChecks()
    report = synthesize(cfg, verifier=second, progress=False, log=lambda _: None)
    assert report["exported"] == 5 and len(second.checked) == 2          # only the two not yet done
    assert not set(second.checked) & set(first.checked)
    again = PassingChecks()
    assert synthesize(cfg, verifier=again, progress=False, log=lambda _: None)["exported"] == 5
    assert again.checked == []


def test_a_cut_last_line_is_redone_and_a_different_config_is_refused(tmp_path, log):
    cfg = _config(tmp_path, log, num_exports=2)
    synthesize(cfg, verifier=PassingChecks(), progress=False, log=lambda _: None)
    results = tmp_path / "run" / "results.jsonl"
    lines = results.read_text().splitlines()
    results.write_text(lines[0] + "\n" + lines[1][:20])                # interrupted mid-write
    redo = PassingChecks()
    assert synthesize(cfg, verifier=redo, progress=False, log=lambda _: None)["exported"] == 2
    assert len(redo.checked) == 1
    with pytest.raises(ForgeInputError, match=r"differs in \['config.recipe', 'selection.actions"):
        synthesize(_config(tmp_path, log, num_exports=2, recipe="evol_instruct"), verifier=PassingChecks(),
                   progress=False, log=lambda _: None)


def test_rounds_replay_the_selection_with_fresh_data_until_the_target(tmp_path, log):
    report = synthesize(_config(tmp_path, log, num_exports=30, max_rounds=2), verifier=PassingChecks(),
                        progress=False, log=lambda _: None)
    assert report["exported"] == 30
    rounds = [int(n.rsplit(".r", 1)[1]) for n in report["exports"]]
    assert rounds.count(0) == 25 and rounds.count(1) == 5
    short = synthesize(_config(tmp_path / "b", log, num_exports=60, max_rounds=2), verifier=PassingChecks(),
                       progress=False, log=lambda _: None)
    assert short["exported"] == 50 and short["missing"] == 10


def test_fixed_recipes_are_masks_and_portfolio_mode_exports_a_subset(tmp_path, log):
    evol = synthesize(_config(tmp_path / "evol", log, num_exports=4, recipe="evol_instruct_depth"),
                      verifier=PassingChecks(), progress=False, log=lambda _: None)
    assert set(evol["actions_chosen"]) == {"increase_complexity/in_depth"}
    pf = synthesize(_config(tmp_path / "pf", log, num_exports=5, mode="portfolio"), verifier=PassingChecks(),
                    progress=False, log=lambda _: None)
    assert sum(pf["actions_chosen"].values()) == 5 and pf["exported"] == 5


def test_bad_inputs_are_named(tmp_path, log):
    with pytest.raises(ForgeInputError, match="needs a rollout_log or predicted"):
        SynthesisConfig()
    with pytest.raises(ForgeInputError, match="num_exports must be an int >= 1"):
        SynthesisConfig(rollout_log="x", num_exports=0)
    with pytest.raises(ForgeInputError, match="not a directory of bundle folders"):
        synthesize(_config(tmp_path, log, seeds=str(tmp_path / "nowhere")), verifier=PassingChecks(),
                   progress=False, log=lambda _: None)
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"task_id": "logs-severity-01", "reward": 1.0}\n')
    with pytest.raises(ForgeInputError, match="24 seed"):  # the other seeds have no rollouts
        synthesize(SynthesisConfig(rollout_log=str(partial), out=str(tmp_path / "p")), verifier=PassingChecks(),
                   progress=False, log=lambda _: None)
    predicted = tmp_path / "predicted.json"
    predicted.write_text(json.dumps({n: 0.5 for n, _ in builtin_seeds()}))
    report = synthesize(SynthesisConfig(rollout_log=str(partial), predicted=str(predicted), num_exports=1,
                                        out=str(tmp_path / "q")), verifier=PassingChecks(), progress=False,
                        log=lambda _: None)
    assert report["pass_rate_sources"] == {"rollouts": 1, "predicted": 24}


def test_plan_orders_by_frontier_score_and_names_are_stable():
    decisions = {"a": {"action": "increase_complexity/in_depth", "frontier_score": 0.5},
                 "b": {"action": "reduce_complexity/in_breadth", "frontier_score": 0.9},
                 "c": {"action": None}}
    assert plan(None, decisions, ["a", "b", "c"], "forge", 2) == [
        (0, "b", "b.forge.red-breadth.r0"), (0, "a", "a.forge.inc-depth.r0"),
        (1, "b", "b.forge.red-breadth.r1"), (1, "a", "a.forge.inc-depth.r1")]
    assert request_name("s", "few_shot", "diversify_frontier/in_depth", 3) == "s.few_shot.div-depth.r3"


_NO_DOCKER = unavailable_reason("docker")


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_end_to_end_in_docker_exports_a_pool_of_verified_bundles(tmp_path, log):
    verifier = DockerVerifier(VerifyConfig(oracle_timeout_s=30, test_timeout_s=30))
    report = synthesize(_config(tmp_path, log, num_exports=3), verifier=verifier, progress=False, log=lambda _: None)
    assert report["exported"] == 3 and report["verification"]["executed"] == 3
    assert report["verification"]["bundles_per_minute"] > 0
    for name in report["exports"]:
        line = next(json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()
                    if json.loads(x)["name"] == name)
        assert line["verification"]["oracle_reward"] == 1.0 and line["verification"]["untouched_reward"] == 0.0


def _seed_dir(tmp_path, broken: dict[str, dict[str, bytes | None]]) -> Path:
    """The first three built-in seeds plus broken copies (path -> new bytes, None deletes)."""
    from envsched_jax.forge.bundle import write_bundle

    folder = tmp_path / "seeds"
    seeds = builtin_seeds()[:3]
    for name, params in seeds:
        write_bundle(to_bundle(name, params), folder / name)
    base = to_bundle(*seeds[0])
    for name, changes in broken.items():
        files = dict(base.files)
        for path, data in changes.items():
            if data is not None:
                files[path] = type(files["tests/test.sh"])(data, path.endswith(".sh"))
        write_bundle(base.with_files(files), folder / name)
        for path, data in changes.items():
            if data is None:   # a bundle without it cannot even be built in memory: delete on disk
                (folder / name / path).unlink()
    return folder


def _log_for(folder: Path, tmp_path: Path) -> Path:
    names = [p.name for p in folder.iterdir() if p.is_dir()]
    return write_rollout_log([(n, float(k % 2)) for n in names for k in range(4)], tmp_path / "log.jsonl")


def test_bad_seeds_are_rejected_by_the_named_check_and_the_run_continues(tmp_path):
    folder = _seed_dir(tmp_path, {
        "net": {"solution/solve.sh": b"#!/bin/bash\ncurl http://example.com > /app/x\n"},
        "hostpath": {"tests/test.sh": b"#!/bin/bash\ncat /var/run/docker.sock\n"},
        "nodockerfile": {"environment/Dockerfile": None},
    })
    (folder / "garbage").mkdir()
    (folder / "garbage" / "notes.txt").write_text("not a bundle")
    cfg = SynthesisConfig(seeds=str(folder), rollout_log=str(_log_for(folder, tmp_path)), num_exports=3,
                          out=str(tmp_path / "run"))
    report = synthesize(cfg, verifier=PassingChecks(), progress=False, log=lambda _: None)
    rejected = {r["seed"]: r for r in report["seeds_rejected"]}
    assert set(rejected) == {"net", "hostpath", "nodockerfile", "garbage"}
    assert rejected["net"]["check"] == "safety" and "network use" in rejected["net"]["reason"]
    assert rejected["hostpath"]["check"] == "safety" and "host path" in rejected["hostpath"]["reason"]
    assert rejected["garbage"]["check"] == "read" and "garbage" in rejected["garbage"]["reason"]
    assert rejected["nodockerfile"]["check"] == "read" and "environment/Dockerfile: missing" in rejected["nodockerfile"]["reason"]
    assert report["num_seeds"] == 3 and report["exported"] == 3
    assert not any(n.startswith(("net", "hostpath", "nodockerfile", "garbage")) for n in report["exports"])
    assert json.loads((tmp_path / "run" / "seeds_rejected.json").read_text()) == report["seeds_rejected"]


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_seeds_failing_the_executed_checks_are_rejected_in_docker(tmp_path):
    folder = _seed_dir(tmp_path, {
        "badbuild": {"environment/Dockerfile": b"FROM envsched-forge-base\nCOPY missing/ /app/\n"},
        "badoracle": {"solution/solve.sh": b"#!/bin/bash\nexit 0\n"},
        "passes": {"tests/test.sh": b"#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"},
    })
    cfg = SynthesisConfig(seeds=str(folder), rollout_log=str(_log_for(folder, tmp_path)), num_exports=2,
                          out=str(tmp_path / "run"))
    verifier = DockerVerifier(VerifyConfig(oracle_timeout_s=30, test_timeout_s=30))
    report = synthesize(cfg, verifier=verifier, progress=False, log=lambda _: None)
    rejected = {r["seed"]: (r["check"], r["reason"]) for r in report["seeds_rejected"]}
    assert rejected["badbuild"][0] == "build" and "docker build failed" in rejected["badbuild"][1]
    assert rejected["badoracle"][0] == "oracle" and "gave reward 0.0" in rejected["badoracle"][1]
    assert rejected["passes"][0] == "untouched"
    assert report["exported"] == 2 and report["num_seeds"] == 3


class FlakyEngine(PassingChecks):
    """The engine refuses one container start, as a failing Docker daemon would."""

    def __init__(self, fail_on: int):
        super().__init__()
        self.calls, self.fail_on = 0, fail_on

    def run_checks(self, bundle):
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("500 Server Error: failed to start shim")
        return super().run_checks(bundle)


def test_an_engine_failure_rejects_one_attempt_by_name_and_the_run_continues(tmp_path, log):
    report = synthesize(_config(tmp_path, log, num_exports=3), verifier=FlakyEngine(fail_on=27), progress=False,
                        log=lambda _: None)
    assert report["exported"] == 3 and report["failed_attempts_by_check"] == {"infrastructure": 1}
    line = next(json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()
                if json.loads(x)["attempts"][0]["failed"])
    assert "failed to start shim" in line["attempts"][0]["reason"] and line["accepted"]   # repaired


def test_the_llm_route_counts_tokens_and_prompt_lengths_through_the_pipeline(tmp_path, log):
    """A scripted model answers the C.2 prompt with the family rewrite of the named seed and action
    (first with broken JSON once): the pipeline records the parse failure, the repair, the tokens,
    and the exact prompt lengths it fixed before solving."""
    import re

    from envsched_jax.forge.families import transform
    from envsched_jax.forge.llm_materialize import LLMMaterializer
    from envsched_jax.forge.prompts import bundle_to_reply
    from envsched_jax.graph.llm_clients import ScriptedChatClient

    params = dict(builtin_seeds())
    calls = []

    seeds = {n: to_bundle(n, p) for n, p in params.items()}

    def respond(messages):
        calls.append(messages)
        if len(calls) == 1:
            return "{not json"
        first = messages[1]["content"]
        seed = next(n for n, b in seeds.items() if b.instruction.strip() in first)
        action = re.search(r"^Action: (\S+)", first, re.M)[1]
        rewrite = transform(params[seed], action, rng_seed=len(calls)).params
        return bundle_to_reply(to_bundle("x", rewrite), include_requirements=True)

    cfg = _config(tmp_path, log, num_exports=2, materializer="llm")
    mat = LLMMaterializer(ScriptedChatClient(respond, model="scripted"))
    report = synthesize(cfg, materializer=mat, verifier=PassingChecks(), progress=False, log=lambda _: None)
    assert report["exported"] == 2 and report["failed_attempts_by_check"] == {"parse": 1}
    assert report["prompt_tokens"] > 0 and report["materialized"] == 2
    selection = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert selection["status"] == "optimal"


@pytest.mark.slow
def test_the_in_process_model_can_be_the_materialiser(tmp_path):
    """``--llm.client jax``: SmolLM2-135M in the JAX sampler answers the C.2 prompt. A model this
    small writes no bundle in 64 tokens: each request fails as parse, named, and nothing is exported."""
    from envsched_jax.forge.pipeline import LLMSpec

    from envsched_jax.forge.bundle import write_bundle

    folder = tmp_path / "seeds"
    write_bundle(to_bundle(*builtin_seeds()[0]), folder / builtin_seeds()[0][0])   # one request: ~3 min on 2 cores
    cfg = SynthesisConfig(seeds=str(folder), rollout_log=str(_log_for(folder, tmp_path)), num_exports=1,
                          max_rounds=1, materializer="llm", out=str(tmp_path / "run"),
                          llm=LLMSpec(client="jax", policy="smollm2", max_tokens=64, budget=1, max_context=8192))
    report = synthesize(cfg, verifier=PassingChecks(), progress=False, log=lambda _: None)
    assert report["exported"] == 0 and report["requests"] == 1, report
    assert set(report["failed_attempts_by_check"]) <= {"parse", "schema"}, report
    assert report["completion_tokens"] > 0 and report["prompt_tokens"] > 1000 * report["requests"], report
