"""Terminal episodes of task bundles: the command stream, the reward file and the episode API
without Docker; then, in a real engine, the oracle replayed to reward 1 and nothing to 0, a wrong
answer, a command that runs out of time, capped output, hostile commands that try to forge the
reward, what the agent can and cannot see, failures that are named and leave nothing behind, and
whole agent episodes through AgentRunner with a scripted model."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from envsched_jax.envs.episode import EpisodeError
from envsched_jax.envs.replay import replay_actions
from envsched_jax.envs.runtime.core import CHAT_WITH_USER
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool, unavailable_reason
from envsched_jax.envs.terminal import (RUN_LABEL, TerminalConfig, TerminalEpisode, TerminalRuntime,
                                        _CommandStream, read_reward_file, answer_action,
                                        parse_reward, run_terminal_actions)
from envsched_jax.forge.bundle import BundleFile, TaskBundle, write_bundle
from envsched_jax.forge.families import builtin_seeds, to_bundle
from envsched_jax.pool.bundles import load_bundle_pool
from envsched_jax.pool.model import Action
from envsched_jax.pool.sources import load_pool
from envsched_jax.rollout.agent import AgentConfig, AgentRunner
from envsched_jax.rollout.backends.scripted import ScriptedBackend, reference_responder
from test_bundle_pool import COUNT_SOLVE, harbor_files, write_harbor, write_tb1

_NO_DOCKER = unavailable_reason("docker")


def run(command: str) -> Action:
    return Action("run_command", {"command": command})


# -- without Docker ------------------------------------------------------------------------------

NONCE = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("cut", range(0, 60, 7))
def test_the_end_marker_is_found_across_chunk_boundaries(cut):
    stream = b"line one\nline two" + f"\n{NONCE} 7\n".encode() + b"late background output\n"
    collected = _CommandStream(1024, NONCE)
    done = [collected.feed(stream[i:i + max(cut, 1)]) for i in range(0, len(stream), max(cut, 1))]
    assert any(done)
    result = collected.result(0.1, 5.0, True)
    assert (result.output, result.exit_status, result.timed_out) == ("line one\nline two", 7, False)
    assert result.text() == "line one\nline two\n[exit status 7]"


def test_output_keeps_first_and_last_halves_and_a_foreign_marker_is_output():
    collected = _CommandStream(20, NONCE)
    collected.feed(b"0123456789" + b"x" * 100 + f"\n{'f' * 32} 0\n".encode() + b"ABCDEFGHIJ")
    assert not collected.feed(b"")
    result = collected.result(0.2, 5.0, True)       # no marker: the shell was killed
    assert result.exit_status is None and result.truncated
    assert result.total_bytes == 10 + 100 + 36 + 10 and result.shown_bytes == 20
    assert result.output == "0123456789\n[...]\nABCDEFGHIJ"
    assert "[output truncated: 156 bytes in all, 20 shown" in result.text()
    assert result.text().endswith("[the command's shell ended without reporting an exit status]")


@pytest.mark.parametrize("seconds, finished, timed_out", [(5.1, True, True), (0.1, True, False),
                                                         (12.0, False, True)])
def test_a_timeout_status_counts_only_when_the_time_is_up(seconds, finished, timed_out):
    collected = _CommandStream(64, NONCE)
    collected.feed(f"\n{NONCE} 124\n".encode() if finished else b"still running")
    result = collected.result(seconds, 5.0, finished)
    assert result.timed_out is timed_out
    assert ("[the command ran past its time limit of 5 s and was stopped]" in result.text()) is timed_out


@pytest.mark.parametrize("text, reward, error", [
    ("1", 1.0, None), (" 0.25\n", 0.25, None), ("0", 0.0, None),
    ("nan", None, "not a finite number in [0, 1]"), ("1.5", None, "not a finite number in [0, 1]"),
    ("-0.1", None, "not a finite number in [0, 1]"), ("yes", None, "says 'yes', not a number"),
    ("", None, "says '', not a number"),
])
def test_reward_file_must_state_one_finite_number_in_the_unit_interval(text, reward, error):
    if error is None:
        assert parse_reward(text) == reward
    else:
        with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
            parse_reward(text)


def test_the_reward_file_is_read_without_following_links(tmp_path):
    logs = tmp_path / "logs"
    assert read_reward_file(logs) is None
    (logs / "verifier").mkdir(parents=True)
    assert read_reward_file(logs) is None
    secret = tmp_path / "host-secret"
    secret.write_text("1\n")
    (logs / "verifier" / "reward.txt").symlink_to(secret)
    with pytest.raises(ValueError, match="cannot be opened as a plain file"):
        read_reward_file(logs)
    shutil.rmtree(logs / "verifier")
    (logs / "verifier").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="/logs/verifier is not a plain folder"):
        read_reward_file(logs)
    (logs / "verifier").unlink()
    (logs / "verifier").mkdir()
    (logs / "verifier" / "reward.txt").write_text("1" * 2000)
    with pytest.raises(ValueError, match="over 1024 bytes"):
        read_reward_file(logs)
    (logs / "verifier" / "reward.txt").write_text("1\n")
    assert read_reward_file(logs) == "1\n"


def test_config_is_validated():
    with pytest.raises(ValueError, match=r"TerminalConfig.command_timeout_s must be a positive number, got 0"):
        TerminalConfig(command_timeout_s=0)
    with pytest.raises(ValueError, match=r"TerminalConfig.max_output_bytes must be an integer >= 2, got 1.5"):
        TerminalConfig(max_output_bytes=1.5)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    write_harbor(root, "count")
    write_tb1(root, "count-tb1")
    write_bundle(TaskBundle("with-helper", "harbor", harbor_files(
        solve="#!/bin/bash\nset -e\nbash /solution/helper.sh\n",
        extra={"solution/helper.sh": BundleFile(b"grep -c ERROR /app/log.txt > /app/out.txt\n")})),
        root / "with-helper")
    name, params = next((n, p) for n, p in builtin_seeds() if n == "logs-severity-01")
    write_bundle(to_bundle(name, params), root / name)
    return load_bundle_pool(root)


def _task(pool, task_id):
    return pool.tasks[pool.task_index(task_id)]


def test_an_engine_that_cannot_start_fails_the_episode_with_its_name(pool):
    task = _task(pool, "count")

    def no_engine() -> TerminalRuntime:
        raise RuntimeError("no Docker engine answers")

    episode = TerminalEpisode(no_engine, pool.environment(task.env_id))
    with pytest.raises(EpisodeError, match="step before reset"):
        episode.step(run("true"))
    assert episode.reset(task) is None and episode.done
    with pytest.raises(EpisodeError, match="step after the end of the episode"):
        episode.step(run("true"))
    score = episode.score()
    assert (score.reward, score.check_results, score.end_reason) == (0.0, (False,), "sandbox_docker")
    assert score.error == "docker: RuntimeError: no Docker engine answers"
    with pytest.raises(EpisodeError, match="score called twice"):
        episode.score()
    with pytest.raises(ValueError, match="is not a terminal task"):
        TerminalEpisode(no_engine, pool.environment(task.env_id)).reset(load_pool("generated:1x1").tasks[0])


def test_the_answer_action_follows_the_task(pool):
    assert answer_action(_task(pool, "count"), "done") == Action(CHAT_WITH_USER, {"message": "done"})
    project = load_pool("generated:1x1").tasks[0]
    assert answer_action(project, "ok") == Action(CHAT_WITH_USER, {"message": "ok"})


# -- in Docker -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runtime():
    if _NO_DOCKER is not None:
        pytest.skip(f"no Docker engine here: {_NO_DOCKER}")
    with TerminalRuntime(TerminalConfig(command_timeout_s=3, max_output_bytes=1024, max_test_s=30)) as rt:
        yield rt


def leftovers(rt: TerminalRuntime) -> tuple[list, list]:
    """The runtime's containers (any state) and snapshot images still in the engine."""
    label = f"{RUN_LABEL}={rt.run_id}"
    return (rt.client.containers.list(all=True, filters={"label": label}),
            rt.client.images.list(filters={"label": label}))


@pytest.fixture()
def rt(runtime):
    """The module's runtime; after the test, none of its containers or snapshots may be left."""
    assert leftovers(runtime) == ([], [])
    yield runtime
    assert leftovers(runtime) == ([], []), "a container or snapshot image was left behind"


def play(rt, pool, task_id, commands, answer=True):
    """One episode: the commands, then (when ``answer``) the agent's plain answer; scored."""
    task = _task(pool, task_id)
    actions = [run(c) for c in commands] + ([Action(CHAT_WITH_USER, {"message": "done"})] if answer else [])
    return run_terminal_actions(rt, pool.environment(task.env_id), task, actions)


@pytest.mark.parametrize("task_id", ["count", "count-tb1", "with-helper", "logs-severity-01"])
@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_replaying_the_reference_gives_1_and_doing_nothing_gives_0(rt, pool, task_id):
    task = _task(pool, task_id)
    solved = replay_actions(None, pool, task_id, task.reference_actions, 1.0, terminal=rt)
    assert solved.reward_matches, solved.replayed.events[-1]
    trajectory = solved.replayed
    assert (trajectory.reward, trajectory.check_results, trajectory.error) == (1.0, [True], None)
    assert trajectory.final_state == {"reward": 1.0, "test_exit_status": 0, "reward_text": "1"}
    assert trajectory.sandbox == "docker" and trajectory.end_reason == "stopped"
    untouched = replay_actions(None, pool, task_id, (), 0.0, terminal=rt).replayed
    assert (untouched.reward, untouched.check_results, untouched.error) == (0.0, [False], None)
    assert untouched.final_state["reward_text"] == "0"
    if task_id == "count-tb1":  # Terminal-Bench 1: the exit status of run-tests.sh is the grade
        assert untouched.final_state["test_exit_status"] == 1


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_a_wrong_answer_gives_0(rt, pool):
    trajectory = play(rt, pool, "count", ["echo 2 > /app/out.txt", "cat /app/out.txt"])
    assert (trajectory.reward, trajectory.end_reason, trajectory.error) == (0.0, "answered", None)
    assert trajectory.steps()[1]["observation"]["output"] == "2\n"


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_a_command_that_runs_out_of_time_is_reported_and_the_episode_goes_on(rt, pool):
    task = _task(pool, "count")
    episode = TerminalEpisode(rt, pool.environment(task.env_id))
    first = episode.reset(task)
    assert first == {"content": task.instruction, "tools": ["run_command"]}
    t0 = time.monotonic()
    slow = episode.step(run("echo before; sleep 30; echo after"))
    assert time.monotonic() - t0 < 3 + 2 + 2
    assert slow.observation["timed_out"] and slow.observation["output"] == "before\n"
    assert not slow.done and "[the command ran past its time limit of 3 s and was stopped]" in slow.message["content"]
    assert episode.step(run("echo alive")).observation["output"] == "alive\n"
    episode.step(task.reference_actions[0])
    assert episode.score().reward == 1.0


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_output_is_capped_and_the_message_says_so(rt, pool):
    task = _task(pool, "count")
    episode = TerminalEpisode(rt, pool.environment(task.env_id), max_steps=3)
    episode.reset(task)
    big = episode.step(run("seq 1 100000"))
    assert big.observation["output_bytes"] == sum(len(f"{i}\n") for i in range(1, 100001))
    assert big.observation["truncated"] and big.observation["exit_status"] == 0
    assert big.observation["output"].startswith("1\n2\n3\n") and big.observation["output"].endswith("99999\n100000\n")
    assert len(big.observation["output"]) == 1024 + len("\n[...]\n")
    assert "[output truncated: 588895 bytes in all, 1024 shown" in big.message["content"]
    both = episode.step(run("echo to-stdout; echo to-stderr >&2; exit 3"))
    assert both.observation["output"] == "to-stdout\nto-stderr\n" and both.message["content"].endswith("[exit status 3]")
    last = episode.step({"name": "run_command", "arguments": {"cmd": "ls"}})
    assert "run_command takes exactly one argument, 'command'" in last.message["content"]
    assert last.done and episode.score().end_reason == "max_steps"


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_hostile_commands_cannot_forge_the_reward(rt, pool):
    trajectory = play(rt, pool, "count", [
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo planted",
        "touch /usr/bin/evil; echo x > /etc/ld.so.preload; for d in /etc/python3*; do echo 'x' > $d/sitecustomize.py; done",
        "python3 -c \"import socket; socket.create_connection(('10.255.255.53', 53), timeout=2)\"; ls /sys/class/net",
        # the right answer, written 6 s after the agent has finished: only a process that
        # outlived the episode could write it
        "setsid bash -c 'sleep 6; grep -c ERROR /app/log.txt > /app/out.txt' > /dev/null 2>&1 < /dev/null &",
    ])
    outputs = [step["observation"]["output"] for step in trajectory.steps()[:3]]
    assert outputs[0] == "planted\n"
    assert "touch: cannot touch '/usr/bin/evil': Read-only file system" in outputs[1]
    assert "/etc/ld.so.preload: Read-only file system" in outputs[1]
    assert "Network is unreachable" in outputs[2] and outputs[2].endswith("\nlo\n")
    assert (trajectory.reward, trajectory.final_state["reward_text"]) == (0.0, "0")
    # control: the same background writer, given the time within the episode, does earn 1
    control = play(rt, pool, "count", [
        "setsid bash -c 'sleep 1; grep -c ERROR /app/log.txt > /app/out.txt' > /dev/null 2>&1 < /dev/null &",
        "sleep 2"])
    assert control.reward == 1.0


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler (gcc) here to build the probe library")
def test_the_tests_never_load_a_preload_library_from_the_workspace(rt, tmp_path):
    """An image whose /etc/ld.so.preload names a library that writes the right answer: every
    program of the tests would run it; the runtime's masks keep it out of both containers."""
    (tmp_path / "forge.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void forge(void) '
                                      '{ FILE *f = fopen("/app/out.txt", "w"); if (f) { fputs("3\\n", f); fclose(f); } }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "forge.so", tmp_path / "forge.c"], check=True)
    files = harbor_files(extra={"environment/app/forge.so": BundleFile((tmp_path / "forge.so").read_bytes()),
                                "environment/etc/ld.so.preload": BundleFile(b"/app/forge.so\n")})
    files["environment/Dockerfile"] = BundleFile(b"FROM envsched-forge-base\nWORKDIR /app\nCOPY app/ /app/\n"
                                                 b"COPY etc/ /etc/\n")
    write_bundle(TaskBundle("preload", "harbor", files), tmp_path / "bundles" / "preload")
    pool = load_bundle_pool(tmp_path / "bundles")
    trajectory = play(rt, pool, "preload", [
        "cat /etc/ld.so.preload | wc -c; true; ls out.txt 2>&1",
        "LD_PRELOAD=/app/forge.so /usr/bin/true; cat /app/out.txt; rm /app/out.txt"])  # it works
    outputs = [step["observation"]["output"] for step in trajectory.steps()[:2]]
    assert outputs[0] == "0\nls: cannot access 'out.txt': No such file or directory\n"
    assert outputs[1] == "3\n"
    assert (trajectory.reward, trajectory.final_state["reward_text"]) == (0.0, "0")


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_the_agent_sees_neither_tests_nor_solution_nor_logs(rt, pool):
    task = _task(pool, "count")
    episode = TerminalEpisode(rt, pool.environment(task.env_id))
    episode.reset(task)
    listing = episode.step(run("ls /tests /solution /logs")).observation["output"]
    assert all(f"ls: cannot access '{p}': No such file or directory" in listing for p in ("/tests", "/solution", "/logs"))
    found = episode.step(run("grep -rlsE 'tests-marker-5f1c|solution-marker-9a2e' / --exclude-dir=proc "
                             "--exclude-dir=sys --exclude-dir=usr --exclude-dir=dev; echo searched"))
    assert found.observation["output"] == "searched\n"
    assert "solution-marker-9a2e" in COUNT_SOLVE   # the search would have found it
    episode.step(run("sleep 100 &"))
    episode.close()                                # not scored: the workspace is removed anyway
    with pytest.raises(EpisodeError, match="score after close"):
        episode.score()


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_failures_are_named_and_leave_nothing_behind(rt, tmp_path):
    write_harbor(tmp_path, "changed")
    bad = harbor_files()
    bad["environment/Dockerfile"] = BundleFile(b"FROM envsched-forge-base\nCOPY missing/ /app/\n")
    write_bundle(TaskBundle("unbuildable", "harbor", bad), tmp_path / "unbuildable")
    pool = load_bundle_pool(tmp_path)
    (tmp_path / "changed" / "instruction.md").write_text("Something else.")
    changed = play(rt, pool, "changed", ["true"])
    assert (changed.reward, changed.end_reason) == (0.0, "sandbox_bundle")
    assert changed.error == (f"bundle: task 'changed': the bundle at {tmp_path / 'changed'} changed since the pool "
                             "was loaded (content hash differs); load the pool again")
    unbuildable = play(rt, pool, "unbuildable", ["true"])
    assert (unbuildable.reward, unbuildable.end_reason) == (0.0, "sandbox_build")
    assert unbuildable.error.startswith("build: bundle 'unbuildable': docker build failed")
    assert unbuildable.check_errors == [unbuildable.error]


@pytest.fixture(scope="module")
def tokenizer():
    from envsched_jax.learner import tokenizer as tokenizer_lib
    from envsched_jax.learner.weights import smollm2_gguf_path

    return tokenizer_lib.load_gguf_tokenizer(smollm2_gguf_path())


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_agent_episodes_through_the_agent_runner(rt, pool, tokenizer):
    task = _task(pool, "count")
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1)) as workers:
        backend = ScriptedBackend(tokenizer, reference_responder(pool, "json_list"))
        runner = AgentRunner(backend, tokenizer, workers, pool, AgentConfig(max_turns=4), terminal=rt)
        solved = runner.run_episode(task)
        assert (solved.reward, solved.end_reason, solved.error, solved.num_turns) == (1.0, "answered", None, 2)
        assert solved.trajectory.sandbox == "docker" and solved.trajectory.actions[0]["name"] == "run_command"
        tool_messages = [m for m in solved.transcript.messages if m["role"] == "tool"]
        assert [m["content"] for m in tool_messages] == ["[exit status 0]"]
        assert '"run_command"' in solved.transcript.messages[0]["content"]   # the catalog in the prompt
        together = runner.run([(_task(pool, t), 0, 0) for t in ("count-tb1", "with-helper", "count")],
                              max_in_flight=3)   # episodes at once share the runtime
        assert [(ep.task_id, ep.reward) for ep in together] == [
            ("count-tb1", 1.0), ("with-helper", 1.0), ("count", 1.0)]

        # a model whose tool call is wrong, in a runner that makes its own runtime when needed
        wrong = json.dumps([{"name": "run_command", "arguments": {"command": "echo 2 > /app/out.txt"}}])
        replies = iter([f"<tool_call>{wrong}</tool_call>", "Done."])
        lazy = AgentRunner(ScriptedBackend(tokenizer, lambda prompt, request: next(replies)), tokenizer,
                           workers, pool, AgentConfig(max_turns=4))
        assert lazy.terminal is None
        episode = lazy.run_episode(task)
        try:
            assert (episode.reward, episode.end_reason, episode.num_turns) == (0.0, "answered", 2)
            assert leftovers(lazy.terminal) == ([], [])
        finally:
            lazy.terminal.close()
