"""Built-in seed families and the programmatic materializer: every seed and every action's rewrite
is a readable Harbor bundle whose oracle earns reward 1 and whose untouched workspace earns 0 (run
under bubblewrap with the Harbor paths), whose tests reject an oracle missing any one requirement,
and whose requirements move the way the action says (appendix A.3's contract)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from envsched_jax.forge import families
from envsched_jax.forge.actions import ACTIONS, ACTION_INDEX, Action
from envsched_jax.forge.bundle import TaskBundle, read_bundle, write_bundle
from envsched_jax.forge.candidates import SeedSpec, candidate_skills
from envsched_jax.forge.families import (DOCKERFILE, FAMILIES, REQUIREMENTS, SKILL_GRAPH, ConfigParams, LogsParams,
                                         builtin_seeds, describe_requirements, family_of, oracle_without,
                                         params_from_metadata, realize, skills_of, to_bundle, transform,
                                         write_builtin_seeds)

SEEDS = builtin_seeds()
SEED_BY_NAME = dict(SEEDS)
SAMPLES = [name for name in SEED_BY_NAME if name.endswith(("-02", "-05"))]
"""Two seeds per family whose rewrites are run: one mid-chain, one with extras."""

_SANDBOX = ["bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]


def _bwrap_problem() -> str:
    if shutil.which("bwrap") is None:
        return "no bwrap binary on PATH"
    probe = subprocess.run([*_SANDBOX, "true"], capture_output=True, text=True, timeout=30)
    return "" if probe.returncode == 0 else f"bwrap cannot start a sandbox here: {probe.stderr.strip()[:200]}"


@pytest.fixture(scope="module")
def sandbox():
    problem = _bwrap_problem()
    if problem:
        pytest.skip(problem)
    return _run_in_harbor_paths


def _run_in_harbor_paths(script: str, app: Path, logs: Path, *, solution: Path | None = None,
                         tests: Path | None = None) -> subprocess.CompletedProcess:
    """``bash SCRIPT`` with cwd /app, the workspace bound read-write at /app, /logs writable, and
    /solution or /tests read-only where given (the oracle never sees /tests, as in Harbor)."""
    mounts = ["--bind", str(app), "/app", "--bind", str(logs), "/logs"]
    if solution is not None:
        mounts += ["--ro-bind", str(solution), "/solution"]
    if tests is not None:
        mounts += ["--ro-bind", str(tests), "/tests"]
    return subprocess.run([*_SANDBOX, *mounts, "--chdir", "/app", "bash", script],
                          capture_output=True, text=True, timeout=120)


def _reward(run, bundle_dir: Path, work: Path, *, solution: Path | None) -> tuple[str, str]:
    """Copy the bundle's workspace, run ``solution`` (a folder holding solve.sh) if given, then the
    tests; returns the reward file's text and the verifier's output."""
    app, logs = work / "app", work / "logs"
    shutil.copytree(bundle_dir / "environment" / "app", app)
    logs.mkdir()
    if solution is not None:
        run("/solution/solve.sh", app, logs, solution=solution)
    result = run("/tests/test.sh", app, logs, tests=bundle_dir / "tests")
    assert result.returncode == 0, f"test.sh must exit 0, got {result.returncode}: {result.stderr[-500:]}"
    return (logs / "verifier" / "reward.txt").read_text().strip(), result.stdout + result.stderr


def _written(params, tmp_path: Path, name: str = "task") -> Path:
    return write_bundle(to_bundle(name, params), tmp_path / name)


def _expect_gold(run, params, tmp_path: Path) -> None:
    """Reward 0 on the untouched workspace, 1 after the oracle."""
    bundle_dir = _written(params, tmp_path)
    read_bundle(bundle_dir)
    untouched, log = _reward(run, bundle_dir, tmp_path / "untouched", solution=None)
    assert untouched == "0", f"the untouched workspace must fail the tests:\n{log}"
    solved, log = _reward(run, bundle_dir, tmp_path / "solved", solution=bundle_dir / "solution")
    assert solved == "1", f"the oracle must pass the tests:\n{log}"


def _rewrites():
    return [(name, action) for name in SAMPLES for action in ACTIONS]


# ------------------------------------------------------------------ seeds and bundles


def test_builtin_seeds_cover_every_family_with_varied_difficulty():
    assert len(SEEDS) >= 24 and len(SEED_BY_NAME) == len(SEEDS)
    for name, params in SEEDS:
        assert re.fullmatch(r"[a-z]+-[a-z]+-\d{2}", name) and name.startswith(family_of(params) + "-"), name
    for family in FAMILIES:
        members = [params for _, params in SEEDS if family_of(params) == family]
        assert len(members) >= 4, family
        labels = {tomllib.loads(realize(p)["task.toml"][0].decode())["metadata"]["difficulty"] for p in members}
        assert len(labels) >= 2, (family, labels)
        assert len({p.depth for p in members}) >= 3 and any(p.extras for p in members), family


def test_write_builtin_seeds_reads_back_as_the_realised_files(tmp_path):
    folders = write_builtin_seeds(tmp_path)
    assert [folder.name for folder in folders] == [name for name, _ in SEEDS]
    for folder, (name, params) in zip(folders, SEEDS):
        bundle = read_bundle(folder)
        expected = realize(params)
        assert {path: (entry.data, entry.executable) for path, entry in bundle.files.items()} == expected
        assert bundle.layout == "harbor" and bundle.files["environment/Dockerfile"].data == DOCKERFILE
        assert bundle.solution_entry == "solution/solve.sh" and bundle.files["tests/test.sh"].executable
        assert any(path.startswith("app/") for path in bundle.build_context())
        meta = bundle.metadata["metadata"]
        assert meta["author_name"] == "envsched_jax" and meta["category"] == family_of(params)
        assert bundle.skills == skills_of(params)
        assert bundle.timeouts.verifier_sec and bundle.timeouts.agent_sec
        assert params_from_metadata(bundle.metadata) == params
    with pytest.raises(Exception, match="not empty"):
        write_builtin_seeds(tmp_path)


def test_dockerfile_is_exact_and_has_no_run_step():
    assert DOCKERFILE == b"FROM envsched-forge-base\nWORKDIR /app\nCOPY app/ /app/\n"
    assert b"RUN" not in DOCKERFILE


@pytest.mark.parametrize("name", list(SEED_BY_NAME))
def test_seed_oracle_earns_1_and_untouched_workspace_0(sandbox, name, tmp_path):
    _expect_gold(sandbox, SEED_BY_NAME[name], tmp_path)


@pytest.mark.parametrize(("name", "action"), _rewrites(), ids=[f"{n}-{a.name}" for n, a in _rewrites()])
def test_rewrite_oracle_earns_1_and_untouched_workspace_0(sandbox, name, action, tmp_path):
    _expect_gold(sandbox, transform(SEED_BY_NAME[name], action, rng_seed=7).params, tmp_path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tests_reject_an_oracle_missing_any_one_requirement(sandbox, family, tmp_path):
    """Appendix A.3: every requirement of the instruction is really checked by the verifier."""
    name, params = max(((n, p) for n, p in SEEDS if family_of(p) == family),
                       key=lambda item: len(describe_requirements(item[1])))
    bundle_dir = _written(params, tmp_path)
    for requirement in describe_requirements(params):
        mutant = tmp_path / f"mutant-{requirement}"
        mutant.mkdir()
        (mutant / "solve.sh").write_bytes(oracle_without(params, requirement))
        reward, log = _reward(sandbox, bundle_dir, tmp_path / f"run-{requirement}", solution=mutant)
        assert reward == "0", f"{name}: the tests pass an oracle without {requirement}:\n{log}"


def test_verifier_writes_0_when_the_checks_crash(sandbox, tmp_path):
    bundle_dir = _written(LogsParams(), tmp_path)
    (bundle_dir / "tests" / "check.py").write_text("raise SystemExit('boom')\n")
    (bundle_dir / "tests" / "expected.json").unlink()
    reward, _ = _reward(sandbox, bundle_dir, tmp_path / "crash", solution=bundle_dir / "solution")
    assert reward == "0"


# ------------------------------------------------------------------ the contract, statically


def _all_variants():
    for name, params in SEEDS:
        yield name, params
        for action in ACTIONS:
            yield f"{name}:{action.name}", transform(params, action, rng_seed=3).params


def _markers(text: str) -> set[str]:
    return set(re.findall(r"# requirement: (\S+)", text))


def test_instruction_oracle_and_tests_name_exactly_the_active_requirements():
    for label, params in _all_variants():
        files = realize(params)
        instruction = files["instruction.md"][0].decode()
        active = describe_requirements(params)
        family = FAMILIES[family_of(params)]
        for requirement in family.requirements:
            shown = f"**{requirement.title}.**" in instruction
            assert shown == (requirement.id in active), (label, requirement.id)
        assert _markers(files["solution/solve.sh"][0].decode()) == set(active), label
        check_py = files["tests/check.py"][0].decode()
        assert set(re.findall(r"def check_(\w+)\(", check_py)) == {r.replace(".", "_") for r in active}, label
        assert "/tests" not in files["solution/solve.sh"][0].decode(), label


def test_metadata_skills_are_the_chain_prefix_and_the_extras():
    for _, params in SEEDS:
        meta = tomllib.loads(realize(params)["task.toml"][0].decode())["metadata"]
        assert tuple(meta["skills"]["required"]) == skills_of(params).required
        assert tuple(meta["skills"]["optional"]) == skills_of(params).optional


def _spec(params) -> SeedSpec:
    skills = skills_of(params)
    return SeedSpec("s", 0.5, skills.required, skills.optional)


@pytest.mark.parametrize("action", ACTIONS, ids=[a.name for a in ACTIONS])
def test_each_action_moves_the_requirements_as_named(action):
    for name, params in SEEDS:
        rewrite = transform(params, action, rng_seed=5)
        before, after = describe_requirements(params), describe_requirements(rewrite.params)
        family = FAMILIES[family_of(params)]
        assert rewrite.params.variant != params.variant, name
        assert type(rewrite.params) is type(params)
        knobs_before = [getattr(params, k.name) for k in family.knobs]
        knobs_after = [getattr(rewrite.params, k.name) for k in family.knobs]
        if action.projection == "increase_complexity":
            assert set(before) <= set(after) and len(after) <= len(before) + 1, name
            if action.direction == "in_depth" and params.depth < len(family.chain):
                assert after == before[: params.depth] + [family.chain[params.depth].id] + list(params.extras), name
            if after == before:
                assert rewrite.note and all(a >= b for a, b in zip(knobs_after, knobs_before)), name
            else:
                assert not rewrite.note and len(after) == len(before) + 1, name
        elif action.projection == "reduce_complexity":
            assert after == [r.id for r in family.chain[: params.depth]], name
            assert all(a <= b for a, b in zip(knobs_after, knobs_before)), name
            if action.direction == "in_depth":
                assert knobs_after != knobs_before or all(k.values[0] == v for k, v in zip(family.knobs, knobs_before))
            if after == before and knobs_after == knobs_before:
                assert "only the data changed" in rewrite.note, name
        elif action.direction == "in_depth":
            assert after == before and knobs_after == knobs_before and not rewrite.note, name
        else:
            assert after[: params.depth] == before[: params.depth], name
            if params.extras and after != before:
                assert len(after) == len(before) and set(before) - set(after) == {params.extras[-1]}, name
            elif not params.extras and after != before:
                assert len(after) == len(before) + 1, name
            else:
                assert "only the data changed" in rewrite.note, name
        predicted = candidate_skills(_spec(params), SKILL_GRAPH)[ACTION_INDEX[action.name]]
        got = skills_of(rewrite.params)
        # the same skill nodes; the order differs where a deeper skill joins the required prefix
        assert sorted(got.required + got.optional) == sorted(predicted), (name, action.name)
        assert len(set(predicted)) == len(predicted), (name, action.name)


def test_transform_accepts_action_names_and_rejects_bad_input():
    params = SEED_BY_NAME["logs-malformed-02"]
    assert transform(params, "increase_complexity/in_depth", 1) == transform(params, ACTIONS[0], 1)
    with pytest.raises(ValueError, match="unknown action"):
        transform(params, "grow/sideways", 1)
    with pytest.raises(TypeError, match="rng_seed"):
        transform(params, ACTIONS[0], "1")


def test_inapplicable_actions_return_a_data_only_variant_with_a_note():
    minimal = ConfigParams(num_rules=4, num_invalid=1)
    for action in ("reduce_complexity/in_depth", "reduce_complexity/in_breadth"):
        rewrite = transform(minimal, action, 2)
        assert "only the data changed" in rewrite.note
        assert rewrite.params == ConfigParams(variant=rewrite.params.variant, num_rules=4, num_invalid=1)
    maximal = LogsParams(depth=4, extras=("logs.hosts", "logs.csv", "logs.messages"), size=320, num_components=8)
    for action in ("increase_complexity/in_depth", "increase_complexity/in_breadth"):
        rewrite = transform(maximal, action, 2)
        assert "every knob at its maximum" in rewrite.note
        assert describe_requirements(rewrite.params) == describe_requirements(maximal)
    bumped = transform(LogsParams(depth=4), "increase_complexity/in_depth", 2)
    assert bumped.params.size == 80 and bumped.params.num_components == 5 and "raised" in bumped.note


def test_realize_and_transform_are_deterministic():
    for _, params in SEEDS:
        assert realize(params) == realize(params)
        for action in ACTIONS:
            first, second = transform(params, action, 11), transform(params, action, 11)
            assert first == second and realize(first.params) == realize(second.params)
        assert transform(params, ACTIONS[4], 11).params != transform(params, ACTIONS[4], 12).params
        assert realize(params) != realize(transform(params, ACTIONS[4], 11).params)


def test_skill_graph_covers_every_metadata_skill_and_families_share_none():
    graph_skills = set(SKILL_GRAPH.deeper) | set(SKILL_GRAPH.neighbours)
    graph_skills |= {s for targets in [*SKILL_GRAPH.deeper.values(), *SKILL_GRAPH.neighbours.values()] for s in targets}
    for _, params in _all_variants():
        skills = skills_of(params)
        assert set(skills.required + skills.optional) <= graph_skills
    owners: dict[str, str] = {}
    for family in FAMILIES.values():
        for requirement in family.requirements:
            assert owners.setdefault(requirement.skill, family.name) == family.name, requirement.skill
        assert {s for targets in family.neighbours.values() for s in targets} == {r.skill for r in family.pool}
    assert set(owners) == graph_skills and len(REQUIREMENTS) == len(owners)


def test_params_validation_names_the_bad_value():
    with pytest.raises(ValueError, match="depth must be an int from 1 to 4"):
        LogsParams(depth=5)
    with pytest.raises(ValueError, match="'logs.nope' is not an optional requirement"):
        LogsParams(extras=("logs.nope",))
    with pytest.raises(ValueError, match="lists a requirement twice"):
        LogsParams(extras=("logs.hosts", "logs.hosts"))
    with pytest.raises(ValueError, match="size must be one of"):
        LogsParams(size=41)
    with pytest.raises(ValueError, match="extras must be a sequence"):
        LogsParams(extras="logs.hosts")
    with pytest.raises(TypeError, match="not a family's parameter class"):
        families.FamilyParams()
    with pytest.raises(ValueError, match="not an active requirement"):
        oracle_without(LogsParams(), "logs.hosts")
    with pytest.raises(ValueError, match=r"\[metadata.forge\]"):
        params_from_metadata({"metadata": {}})
    assert isinstance(to_bundle("x", LogsParams()), TaskBundle) and isinstance(ACTIONS[0], Action)


def test_every_rewrite_passes_the_sync_check_and_a_broken_one_fails():
    from envsched_jax.forge.verify import check_sync, declared_requirements

    for name, params in SEEDS:
        seed = to_bundle(name, params)
        assert list(declared_requirements(seed)) == describe_requirements(params), name
        for action in ACTIONS:
            rewrite = transform(params, action, rng_seed=7).params
            bundle = to_bundle(f"{name}-x", rewrite)
            assert check_sync(bundle, seed) == "", (name, action.name)
            added = set(describe_requirements(rewrite)) - set(describe_requirements(params))
            if added:  # an instruction-only edit: the seed's tests kept
                broken = bundle.with_files({**bundle.files, **{p: e for p, e in seed.files.items()
                                                               if p.startswith("tests/")}})
                assert "is not checked by the tests" in check_sync(broken, seed), (name, action.name)
            removed = set(describe_requirements(params)) - set(describe_requirements(rewrite))
            if removed:  # the seed's oracle kept: it still implements the removed requirement
                broken = bundle.with_files({**bundle.files, "solution/solve.sh": seed.files["solution/solve.sh"]})
                assert "is still in the oracle" in check_sync(broken, seed), (name, action.name)
