"""A directory of task bundles as a task pool (``bundles:DIR``): the records made from the built-in
seeds and from hand-made Harbor and Terminal-Bench 1 bundles, every refusal with its message, the
JSON-lines round trip, the static graph (and the skill-based operation description that gives its
cross-environment relation a meaning), and a scheduler selecting from it. No Docker here: the
episodes are in tests/test_terminal_episode.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from envsched_jax.forge.bundle import BundleFile, TaskBundle, read_bundle, write_bundle
from envsched_jax.forge.families import builtin_seeds, write_builtin_seeds
from envsched_jax.graph.build import build_graph
from envsched_jax.pool.bundles import (REWARD_CHECK_CODE, RUN_COMMAND, TERMINAL_SEMANTICS,
                                       is_terminal_task, load_bundle_pool, reference_command,
                                       skill_extraction, skill_extractions, skill_family)
from envsched_jax.pool.jsonl import read_pool, write_pool
from envsched_jax.pool.model import PoolError, PoolValidationErrors
from envsched_jax.pool.sources import SPEC_HELP, load_pool
from envsched_jax.sched import make_scheduler

DOCKERFILE = "FROM envsched-forge-base\nWORKDIR /app\nCOPY app/ /app/\n"
LOG = "ERROR a\nINFO b\nERROR c\nERROR d\n"
COUNT_TEST = """#!/bin/bash
# tests-marker-5f1c: the agent must never see this file
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = "3" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
COUNT_SOLVE = "#!/bin/bash\n# solution-marker-9a2e\ngrep -c ERROR log.txt > out.txt\n"
TB1_RUN_TESTS = '#!/bin/bash\n[ "$(cat /app/out.txt 2>/dev/null)" = "3" ]\n'


def harbor_files(*, category: str | None = "probe", instruction: str = "Count the ERROR lines of "
                 "/app/log.txt and write the count to /app/out.txt.", solve: str = COUNT_SOLVE,
                 test: str = COUNT_TEST, toml: str | None = None, extra=None) -> dict[str, BundleFile]:
    """A small Harbor bundle: count the ERROR lines of a log (the answer is 3)."""
    if toml is None:
        meta = f'category = "{category}"\n' if category is not None else ""
        toml = (f'version = "1.0"\n\n[metadata]\nauthor_name = "test"\n{meta}'
                'skills = { required = ["log_parsing"], optional = ["csv_export"] }\n\n'
                '[verifier]\ntimeout_sec = 30.0\n\n[agent]\ntimeout_sec = 60.0\n')
    files = {"task.toml": BundleFile(toml.encode()), "instruction.md": BundleFile(instruction.encode()),
             "environment/Dockerfile": BundleFile(DOCKERFILE.encode()),
             "environment/app/log.txt": BundleFile(LOG.encode()),
             "solution/solve.sh": BundleFile(solve.encode(), executable=True),
             "tests/test.sh": BundleFile(test.encode(), executable=True)}
    files.update(extra or {})
    return files


def write_harbor(root: Path, name: str, **kw) -> Path:
    return write_bundle(TaskBundle(name, "harbor", harbor_files(**kw)), root / name)


def write_raw(root: Path, name: str, files: dict[str, str]) -> Path:
    """A folder written file by file, for bundles the bundle model itself would refuse."""
    for path, text in files.items():
        (root / name / path).parent.mkdir(parents=True, exist_ok=True)
        (root / name / path).write_text(text)
    return root / name


def write_tb1(root: Path, name: str, *, category: str = "probe-tb1") -> Path:
    """A Terminal-Bench 1 bundle of the same task: solution.yaml, graded by run-tests.sh's exit status."""
    files = {"task.yaml": BundleFile(f"instruction: |\n  Count the ERROR lines of /app/log.txt into "
                                     f"/app/out.txt.\ncategory: {category}\nmax_agent_timeout_sec: 60\n"
                                     "max_test_timeout_sec: 30\n".encode()),
             "Dockerfile": BundleFile(DOCKERFILE.encode()), "app/log.txt": BundleFile(LOG.encode()),
             "solution.yaml": BundleFile(b"- grep -c ERROR /app/log.txt > /app/out.txt\n"),
             "run-tests.sh": BundleFile(TB1_RUN_TESTS.encode(), executable=True)}
    return write_bundle(TaskBundle(name, "tb1", files), root / name)


# -- the records --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seeds")
    write_builtin_seeds(root)
    return root


@pytest.fixture(scope="module")
def seeds_pool(seeds_dir):
    return load_pool(f"bundles:{seeds_dir}")


def test_builtin_seeds_load_as_one_environment_per_family(seeds_dir, seeds_pool):
    names = sorted(name for name, _ in builtin_seeds())
    assert [t.task_id for t in seeds_pool.tasks] == names
    assert sorted(e.env_id for e in seeds_pool.environments) == ["config", "convert", "logs", "repair", "script"]
    assert all(sum(t.env_id == e.env_id for t in seeds_pool.tasks) == 5 for e in seeds_pool.environments)
    assert seeds_pool.name == f"bundles:{seeds_dir.resolve()}"
    for env in seeds_pool.environments:
        assert env.tool_names == (RUN_COMMAND,)
        schema = env.tools[0]["function"]["parameters"]
        assert schema["required"] == ["command"] and schema["properties"]["command"]["type"] == "string"
        assert [(op.name, op.kind) for op in env.operations] == [(RUN_COMMAND, "state_change")]
        assert env.metadata["semantics"] == TERMINAL_SEMANTICS
    for task in seeds_pool.tasks:
        bundle = read_bundle(seeds_dir / task.task_id)
        assert is_terminal_task(task) and task.env_id == bundle.metadata["metadata"]["category"]
        assert task.instruction == (seeds_dir / task.task_id / "instruction.md").read_text()
        assert task.metadata["bundle"] == {"path": str((seeds_dir / task.task_id).resolve()),
                                           "layout": "harbor", "content_hash": bundle.content_hash()}
        assert task.metadata["skills"] == {"required": list(bundle.skills.required),
                                           "optional": list(bundle.skills.optional)}
        assert task.metadata["timeouts"] == {"agent_sec": 900.0, "verifier_sec": 120.0}
        assert task.metadata["reward_convention"] == "reward_file"
        # the oracle as one agent action: the text of solve.sh, which runs with cwd /app
        assert [a.name for a in task.reference_actions] == [RUN_COMMAND]
        assert task.reference_actions[0].arguments == {
            "command": (seeds_dir / task.task_id / "solution/solve.sh").read_text()}
        assert len(task.checks) == 1 and task.checks[0].code == REWARD_CHECK_CODE
        assert task.checks[0].text.startswith("tests/test.sh writes reward 1 to /logs/verifier/reward.txt.")
        assert all(skill in task.checks[0].text for skill in bundle.skills.required)
        assert set(task.initial_state["files"]) == {p for p in bundle.build_context() if p != "Dockerfile"}
    # the same directory gives the same pool, byte for byte
    assert load_pool(f"bundles:{seeds_dir}").content_hash() == seeds_pool.content_hash()


def test_the_reward_check_states_the_runtimes_rule():
    namespace: dict = {}
    exec(REWARD_CHECK_CODE, namespace)  # the project's check convention: check_func(final_state)
    assert namespace["check_func"]({"reward": 1.0}) is True
    assert namespace["check_func"]({"reward": 0.5}) is False
    assert namespace["check_func"]({}) is False


def test_hand_made_harbor_and_tb1_bundles(tmp_path):
    write_harbor(tmp_path, "count-harbor")
    write_harbor(tmp_path, "no-category", category=None)
    helper = harbor_files(solve="#!/bin/bash\nbash /solution/helper.sh\n",
                          extra={"solution/helper.sh": BundleFile(b"grep -c ERROR /app/log.txt > /app/out.txt\n"),
                                 "solution/data.bin": BundleFile(bytes(range(256)))})
    write_bundle(TaskBundle("with-helper", "harbor", helper), tmp_path / "with-helper")
    write_tb1(tmp_path, "count-tb1")
    (tmp_path / ".count-harbor.x1y2.tmp").mkdir()  # write_bundle's staging folder: skipped
    pool = load_bundle_pool(tmp_path)
    assert [t.task_id for t in pool.tasks] == ["count-harbor", "count-tb1", "no-category", "with-helper"]
    by_id = {t.task_id: t for t in pool.tasks}
    assert {t.task_id: t.env_id for t in pool.tasks} == {
        "count-harbor": "probe", "count-tb1": "probe-tb1", "no-category": "no-category", "with-helper": "probe"}
    assert [t.task_id for t in pool.tasks if t.env_id == "probe"] == ["count-harbor", "with-helper"]
    assert pool.environment("probe").metadata["skills"] == ["csv_export", "log_parsing"]

    tb1 = by_id["count-tb1"]
    assert tb1.metadata["bundle"]["layout"] == "tb1"
    assert tb1.metadata["reward_convention"] == "exit_status"
    assert tb1.metadata["timeouts"] == {"agent_sec": 60.0, "verifier_sec": 30.0}
    assert tb1.instruction == "Count the ERROR lines of /app/log.txt into /app/out.txt.\n"
    assert tb1.checks[0].text.startswith("tests/run-tests.sh exits with status 0")
    command = tb1.reference_actions[0].arguments["command"]
    assert command.startswith("#!/bin/bash\n") and "grep -c ERROR /app/log.txt > /app/out.txt" in command
    assert by_id["count-harbor"].reference_actions[0].arguments["command"] == COUNT_SOLVE

    # a solution with more than solve.sh: its files are written under /solution, then it runs
    command = by_id["with-helper"].reference_actions[0].arguments["command"]
    assert command.endswith("cd /app && bash /solution/solve.sh\n")
    assert "printf '%s' AAECAwQF" in command and "/solution/data.bin" in command
    assert re.search(r"chmod \+x /solution/solve\.sh", command)


def test_reference_command_materialises_every_solution_file(tmp_path):
    """The command, run by bash with /solution moved into a scratch folder, rebuilds the files."""
    import subprocess

    bundle = TaskBundle("x", "harbor", harbor_files(
        solve="#!/bin/bash\necho solved > \"$1\"\n",
        extra={"solution/sub/data.bin": BundleFile(bytes(range(256)) + b"'\"$`\\")}))
    *writes, run = reference_command(bundle).splitlines()
    assert run == "cd /app && bash /solution/solve.sh"
    script = "\n".join(writes).replace("/solution", str(tmp_path / "solution"))
    subprocess.run(["bash", "-c", f"{script}\nbash {tmp_path}/solution/solve.sh {tmp_path}/out"],
                   check=True, cwd=tmp_path)
    assert (tmp_path / "solution/sub/data.bin").read_bytes() == bytes(range(256)) + b"'\"$`\\"
    assert os.access(tmp_path / "solution/solve.sh", os.X_OK)
    assert (tmp_path / "out").read_text() == "solved\n"


def test_a_bundles_pool_round_trips_through_json_lines(seeds_pool, tmp_path):
    write_pool(seeds_pool, tmp_path / "pool.jsonl")
    again = read_pool(tmp_path / "pool.jsonl")
    assert again.environments == seeds_pool.environments and again.tasks == seeds_pool.tasks


# -- refusals ------------------------------------------------------------------------------------

RAW = {path: entry.data.decode() for path, entry in harbor_files().items()}

def _problems(info) -> list[str]:
    err = info.value
    return [str(p) for p in err.problems] if isinstance(err, PoolValidationErrors) else [str(err)]


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", r"{root}/missing: not a directory"),
    (lambda root: root, r"{root}: holds no bundle folder \(a folder with task.toml or task.yaml\)"),
    (lambda root: (root / "README.md").write_text("hi") and root,
     r"{root}/README.md: is not a folder; every entry of a bundle directory must be a bundle folder"),
    (lambda root: (root / "notes").mkdir() or (root / "notes" / "a.txt").write_text("x") and root,
     r"{root}/notes: task.toml: missing: a bundle needs task.toml \(Harbor\) or task.yaml \(Terminal-Bench 1\)"),
    (lambda root: write_raw(root, "bad-toml", {**RAW, "task.toml": '[agent]\ntimeout_sec = "soon"\n'}) and root,
     r"{root}/bad-toml: task.toml: \[agent\].timeout_sec must be a positive number, got 'soon'"),
    (lambda root: write_raw(root, "bad-skills", {**RAW, "task.toml": '[metadata]\nskills = { required = ["a", "a"] }\n'})
     and root,
     r"{root}/bad-skills: task.toml: \[metadata\].skills.required lists 'a' twice"),
    (lambda root: write_harbor(root, "blank-category", category=" ") and root,
     r"{root}/blank-category/task.toml, field '\[metadata\].category': is empty"),
    (lambda root: write_harbor(root, "no-instruction", instruction="  \n") and root,
     r"{root}/no-instruction/instruction.md, field 'instruction': instruction must be a non-empty string"),
])
def test_bad_input_is_refused_naming_folder_file_and_field(tmp_path, make, message):
    root = make(tmp_path)
    with pytest.raises(PoolError) as info:
        load_bundle_pool(root)
    problems = _problems(info)
    assert any(re.search(message.format(root=re.escape(str(tmp_path))), p) for p in problems), problems


def test_missing_role_files_and_links_are_refused(tmp_path):
    write_raw(tmp_path, "no-tests", {path: text for path, text in RAW.items() if path != "tests/test.sh"})
    write_harbor(tmp_path, "good")
    os.symlink(tmp_path / "good", tmp_path / "linked")
    with pytest.raises(PoolValidationErrors) as info:
        load_bundle_pool(tmp_path)
    assert _problems(info) == [
        f"{tmp_path}/linked: is a symbolic link; links are refused, since bundles come from untrusted sources",
        f"{tmp_path}/no-tests: tests/test.sh: missing: a Harbor bundle needs it as its test entry"]
    # drop_invalid keeps what is valid and lists every problem it left out
    pool = load_bundle_pool(tmp_path, drop_invalid=True)
    assert [t.task_id for t in pool.tasks] == ["good"]
    assert pool.dropped == tuple(_problems(info))


def test_a_name_in_two_directories_is_refused(tmp_path):
    first, second = tmp_path / "seeds", tmp_path / "exports"
    write_harbor(first, "count")
    write_harbor(second, "count")
    write_tb1(second, "count-tb1")
    spec = f"bundles:{first}{os.pathsep}{second}"
    with pytest.raises(PoolValidationErrors) as info:
        load_pool(spec)
    assert _problems(info) == [f"{second}/count, field 'task_id': duplicate task id 'count' (first at {first}/count)"]
    pool = load_pool(spec, drop_invalid=True)
    assert [t.task_id for t in pool.tasks] == ["count", "count-tb1"]
    assert pool.tasks[0].metadata["bundle"]["path"] == str((first / "count").resolve())


def test_nothing_loadable_is_an_error_even_when_dropping(tmp_path):
    write_raw(tmp_path, "bad", {**RAW, "task.toml": "version = 1\n"})
    with pytest.raises(PoolValidationErrors) as info:
        load_bundle_pool(tmp_path, drop_invalid=True)
    problems = _problems(info)
    assert problems[0] == f"{tmp_path}/bad: task.toml: version must be a string, got 1"
    assert problems[-1].endswith("no valid task is left after leaving out the records above")


def test_spec_parsing():
    assert "bundles:DIR" in SPEC_HELP
    with pytest.raises(PoolError, match=r"cannot parse pool spec 'bundles:'; expected bundles:DIR"):
        load_pool("bundles:")


# -- the graph and a scheduler ------------------------------------------------------------------

def test_skill_families_read_the_activity_word():
    assert [skill_family(s) for s in ("log_parsing", "csv_export", "duplicate_removal", "config_repair",
                                      "manifest_reconciliation", "cross_field_constraints",
                                      "section_summary", "cli_scripting", "mystery")] == [
        "lookup", "report", "delete", "update", "link", "validate", "aggregate", "create", "other"]


def test_the_default_graph_takes_terminal_operations_from_skills_not_the_shell_call(seeds_pool):
    graph = build_graph(seeds_pool)
    assert graph.s_full.shape == graph.s_abs.shape == (25, 25)
    env_of = dict(zip(graph.task_ids, graph.env_index))
    for i, task_id in enumerate(graph.task_ids):   # within candidates: same family, best first
        same = [graph.task_ids[j] for j in graph.within_idx[i] if j >= 0]
        assert len(same) == 4 and all(env_of[t] == env_of[task_id] for t in same)
        assert list(graph.within_sim[i][:4]) == sorted(graph.within_sim[i][:4], reverse=True)
    assert graph.abstract_texts == build_graph(seeds_pool, extractions=skill_extractions(seeds_pool)).abstract_texts
    # what the static extractor would give: every bundle the same single run_command call
    from envsched_jax.graph.extract import analyse_environment, extract
    static = {extract(seeds_pool.environment(t.env_id), t, analyse_environment(seeds_pool.environment(t.env_id)))
              for t in seeds_pool.tasks}
    assert len({tuple((op.family, op.tool) for op in e.operations) for e in static}) == 1


def test_skill_extractions_give_the_cross_relation_a_meaning(seeds_pool):
    extractions = skill_extractions(seeds_pool)
    graph = build_graph(seeds_pool, extractions=extractions)
    index = {t: i for i, t in enumerate(graph.task_ids)}
    # one lookup each (log_parsing / csv_parsing): the same work in two families
    assert graph.s_abs[index["logs-severity-01"], index["convert-rows-01"]] == pytest.approx(1.0)
    # lookup vs link (manifest_reconciliation): nothing in common
    assert graph.s_abs[index["logs-severity-01"], index["repair-placement-01"]] == 0.0
    assert graph.cross_idx[index["logs-severity-01"]][0] == index["convert-rows-01"]
    skills = {s for t in seeds_pool.tasks for k in ("required", "optional") for s in t.metadata["skills"][k]}
    words = {w for s in skills for w in s.split("_")}
    assert not any(w in text.split() for text in graph.abstract_texts for w in words - {"summary"})
    deep = skill_extraction(seeds_pool.tasks[index["logs-window-04"]])
    assert [op.depends_on for op in deep.operations] == [(), ("o0",), ("o1",), ("o2",), ("o0",), ("o0",)]
    assert skill_extractions(load_pool("generated:2x3")) is None


def test_envsched_selects_from_a_bundles_pool(seeds_pool):
    graph = build_graph(seeds_pool, extractions=skill_extractions(seeds_pool))
    sched = make_scheduler("envsched", graph, batch_size=4, group_size=2, seed=0)
    rng = np.random.default_rng(0)
    for t in range(3):
        ids = sched.select(t)
        assert len(ids) == 4 == len(set(ids)) and set(ids) <= {task.task_id for task in seeds_pool.tasks}
        sched.observe(t, ids, rng.integers(0, 2, (4, 2)).astype(float))
    assert [m.step for m in sched.metrics()] == [0, 1, 2]
