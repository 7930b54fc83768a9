"""Reward integrity and episode isolation in the jails (bubblewrap, Docker), written from the
classes of attack in issue 10 rather than from any one exploit.

Every attack runs as environment code of one task; each test asserts that the attack failed and
that the next honest episodes, of another environment and served by the same jail, score their
true rewards (1.0, 0.5 and a probe of a clean process state). Both the whole-episode path
(``run_actions``) and the step-by-step path (``Episode``) are attacked.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from envsched_jax.envs.episode import Episode, run_actions, validate_score
from envsched_jax.envs.rollout import RolloutConfig, RolloutJob, RolloutPool, group_rewards
from envsched_jax.envs.sandbox import SandboxConfig, SandboxLimits, make_worker_pool
from envsched_jax.envs.sandbox.base import SandboxError, WorkerPool
from envsched_jax.pool.model import Action, Check, Environment, Pool, Task

from sandbox_helpers import sandbox_param

MiB = 2**20
PROJECT_ROOT = Path(__file__).resolve().parent.parent
JAILS = [sandbox_param("bwrap"), sandbox_param("docker")]

ATTACKER_SOURCE = '''
import builtins, copy, ctypes, json, os, signal, sys, threading, time


def _forged_score(*args, **kwargs):
    return {"reward": 1.0, "check_results": [True], "check_errors": [None],
            "final_state": {}, "end_reason": "chat_with_user", "error": None,
            "turn_states": [], "num_steps": 1}


class Attacker:
    def __init__(self, init_config):
        self.items = {}
        self.reached = []
        self.report = {}

    def mark(self, key):
        self.items[key] = "done"
        return {"success": True}

    def patch_checker(self):
        """Replace the scoring code wherever this process can reach it."""
        for module in list(sys.modules.values()):
            for name in ("run_checks", "check_payload", "reward_of", "assemble_score",
                         "validate_score"):
                if hasattr(module, name):
                    setattr(module, name, _forged_score)
        builtins.round = lambda *a, **k: 1.0
        builtins.bool = lambda *a: True
        builtins.sum = lambda *a, **k: 10**6
        return {"success": True}

    def forge_frames(self):
        """Write well-formed reply frames for the next requests on every descriptor, and try the
        supervisor's descriptors and memory through /proc."""
        frames = b""
        for seq in range(1, 200):
            body = json.dumps({**_forged_score(), "ok": True, "seq": seq, "nonce": None,
                               "record": None}).encode()
            frames += len(body).to_bytes(4, "big") + body
        for fd in range(0, 256):
            try:
                os.write(fd, frames)
            except OSError:
                pass
        for fd in range(0, 64):
            try:
                with open(f"/proc/1/fd/{fd}", "wb") as f:
                    f.write(frames)
                self.reached.append(f"/proc/1/fd/{fd}")
            except OSError:
                pass
        try:
            with open("/proc/1/mem", "r+b") as f:
                f.seek(4096)
                f.write(b"x")
            self.reached.append("/proc/1/mem")
        except (OSError, ValueError, OverflowError):
            pass
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.ptrace(16, 1, 0, 0) == 0:  # PTRACE_ATTACH to the supervisor
            self.reached.append("ptrace")
        return {"success": True}

    def forge_end(self):
        """Reach the goal, then make the episode look ended by the agent's chat_with_user (and by a
        simulated user's stop), so that an episode EnvScaler leaves unscored would be scored."""
        import gc
        self.items["a"] = "done"
        for obj in gc.get_objects():
            if type(obj).__name__ == "EpisodeCore":
                obj.actions.append({"name": "chat_with_user", "arguments": {"content": "done"}})
                obj.user_stopped = True
                obj.done, obj.end_reason = True, "chat_with_user"
        return {"success": True}

    def signal_supervisor(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(1, sig)
            except OSError:
                pass
        time.sleep(0.2)
        return {"success": True}

    def poison(self):
        """Leave everything behind that could reach a later episode of this worker."""
        n = 0
        try:
            while True:
                with open(f"/tmp/fill-{n}", "wb") as f:
                    f.write(b"x" * 2**20)
                n += 1
        except OSError:
            pass
        try:
            with open("/dev/shm/left", "wb") as f:
                f.write(b"x" * 1024)
        except OSError:
            pass
        os.makedirs("/tmp/locked/deeper", exist_ok=True)
        os.chmod("/tmp/locked", 0)
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        self._held = held
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
        builtins.open = lambda *a, **k: (_ for _ in ()).throw(OSError("poisoned open"))
        builtins.round = lambda *a, **k: 0
        builtins.sorted = lambda *a, **k: []
        copy.deepcopy = lambda value, memo=None: {}
        json.loads = lambda *a, **k: {}
        os.umask(0o777)
        os.environ["POISON"] = "1"
        return {"success": True}

    def background(self):
        """A hidden background process that keeps writing into /tmp."""
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                n = 0
                while True:
                    try:
                        with open(f"/tmp/bg-{n % 50}", "w") as f:
                            f.write("still here")
                    except OSError:
                        pass
                    n += 1
                    time.sleep(0.01)
            os._exit(0)
        time.sleep(0.05)
        return {"success": True}

    def deep(self):
        nested = []
        for _ in range(50_000):
            nested = [nested]
        self.items["deep"] = nested
        return {"success": True}

    def exposure(self):
        import glob
        found = {}
        for name in ("numpy", "jax", "pytest", "docker", "sklearn", "envsched_jax", "pip",
                     "setuptools", "IPython"):
            extra = sorted({p for root in ("/usr", "/usr/local", sys.prefix)
                            for pattern in ("/lib/python3*/*-packages", "/lib/python3/*-packages",
                                            "/lib/python3*/ensurepip/_bundled/*.whl",
                                            "/share/python-wheels/*.whl")
                            for p in glob.glob(root + pattern)})
            sys.path[:0] = extra
            try:
                __import__(name)
                found[name] = True
            except ImportError:
                found[name] = False
            finally:
                del sys.path[:len(extra)]
        self.report["third_party"] = found
        self.report["site_dirs"] = {d: os.listdir(d) for d in extra if os.path.isdir(d)}
        self.report["wheels"] = [p for p in extra if p.endswith(".whl")]
        import bfcl_eval, mpmath  # the allowed packages stay importable
        self.report["allowed"] = True
        libc = ctypes.CDLL(None, use_errno=True)
        self.report["unshare_user"] = [libc.unshare(0x10000000), ctypes.get_errno()]
        with open("/proc/self/mountinfo") as f:
            self.report["mountinfo"] = f.read()
        return {"success": True}
'''

HONEST_SOURCE = '''
import io, json, os


class Honest:
    def __init__(self, init_config):
        self.items = {}
        self.probe = {}

    def mark(self, key):
        self.items[key] = "done"
        return {"success": True}

    def probe_process(self):
        """What a fresh, clean episode process should see. The jail's own processes (the
        supervisor, an idle spare) are non-dumpable, so their descriptors cannot be listed: the
        probe counts only processes that pool code could have started."""
        others = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, os.getpid()):
                try:
                    os.listdir(f"/proc/{name}/fd")
                except PermissionError:
                    continue
                except OSError:
                    pass
                try:
                    with open(f"/proc/{name}/stat") as f:
                        if f.read().rsplit(")", 1)[-1].split()[0] != "Z":
                            others.append(name)
                except OSError:
                    pass
        p = {"tmp": sorted(os.listdir("/tmp")), "shm": sorted(os.listdir("/dev/shm")),
             "others": others, "fds": len(os.listdir("/proc/self/fd")),
             "round": round(0.75, 1), "open_is_io": open is io.open,
             "sorted": sorted([2, 1]), "json": json.loads("[1]"), "env": "POISON" in os.environ}
        with open("/tmp/probe", "w") as f:
            f.write("written")
        with open("/tmp/probe") as f:
            p["tmp_rw"] = f.read()
        self.probe = p
        return {"success": True}
'''


def _check(text: str, expression: str) -> Check:
    return Check(text, f"def check_func(final_state):\n    return {expression}\n")


A_DONE = _check("a is done", "final_state['items'].get('a') == 'done'")
B_DONE = _check("b is done", "final_state['items'].get('b') == 'done'")
PROBE_CHECKS = (
    _check("/tmp and /dev/shm start empty", "final_state['probe']['tmp'] == [] and "
                                            "final_state['probe']['shm'] == []"),
    _check("no other process", "final_state['probe']['others'] == []"),
    _check("few descriptors", "final_state['probe']['fds'] < 16"),
    _check("builtins intact", "final_state['probe']['round'] == 0.8 and "
                              "final_state['probe']['open_is_io'] and "
                              "final_state['probe']['sorted'] == [1, 2]"),
    _check("modules intact", "final_state['probe']['json'] == [1] and "
                             "not final_state['probe']['env']"),
    _check("/tmp writable", "final_state['probe']['tmp_rw'] == 'written'"),
)


def integrity_pool() -> Pool:
    def tools(names):
        return tuple({"name": n, "parameters": {"type": "object", "properties": {}}} for n in names)

    attacker = Environment("attacker", "Attacker", "hostile code",
                           tools=tools(("mark", "patch_checker", "forge_frames",
                                        "signal_supervisor", "poison", "background", "deep",
                                        "exposure", "forge_end")),
                           class_source=ATTACKER_SOURCE)
    honest = Environment("honest", "Honest", "honest code", tools=tools(("mark", "probe_process")),
                         class_source=HONEST_SOURCE)
    tasks = (Task("attack", "attacker", "Mark b.", {}, (A_DONE,)),
             Task("attack-envscaler", "attacker", "Mark a, then say so.", {}, (A_DONE,),
                  metadata={"semantics": "envscaler"}),
             Task("honest-full", "honest", "Mark a.", {}, (A_DONE,)),
             Task("honest-half", "honest", "Mark a and b.", {}, (A_DONE, B_DONE)),
             Task("honest-probe", "honest", "Probe.", {}, PROBE_CHECKS))
    return Pool("integrity", (attacker, honest), tasks)


LIMITS = SandboxLimits(cpu_seconds=2.0, wall_seconds=10.0, memory_bytes=256 * MiB,
                       max_processes=32, max_file_bytes=4 * MiB, tmp_bytes=8 * MiB,
                       max_message_bytes=4 * MiB)
HONEST_RUNS = {"honest-full": ([Action("mark", {"key": "a"})], 1.0),
               "honest-half": ([Action("mark", {"key": "a"})], 0.5),
               "honest-probe": ([Action("probe_process")], 1.0)}


@pytest.fixture(scope="module", params=JAILS)
def jail(request):
    pool = make_worker_pool(SandboxConfig(kind=request.param, limits=LIMITS, num_workers=1))
    yield pool
    pool.close()


def _task(tasks: Pool, task_id: str) -> Task:
    return tasks.tasks[tasks.task_index(task_id)]


def _play(pool: WorkerPool, tasks: Pool, task_id: str, actions, mode: str):
    task = _task(tasks, task_id)
    env = tasks.environment(task.env_id)
    if mode == "run":
        return run_actions(pool, env, task, actions, timeout=20.0)
    episode = Episode(pool, env, timeout=20.0)
    episode.reset(task)
    for action in actions:
        if episode.done:
            break
        episode.step(action)
    episode.score()
    return episode.trajectory


def _honest_episodes_score_true_rewards(pool: WorkerPool, tasks: Pool, mode: str) -> None:
    for task_id, (actions, reward) in HONEST_RUNS.items():
        traj = _play(pool, tasks, task_id, actions, mode)
        assert (traj.reward, traj.error) == (reward, None), (task_id, traj.check_results,
                                                             traj.check_errors, traj.error)
        assert traj.check_errors == [None] * len(traj.check_results)


@pytest.mark.parametrize("mode", ["run", "steps"])
@pytest.mark.parametrize("attack", ["patch_checker", "forge_frames", "signal_supervisor"])
def test_environment_code_cannot_forge_rewards(jail, attack, mode):
    tasks = integrity_pool()
    replaced = jail.num_replaced
    # the task checks 'a', which the attacker never marks: its true reward is 0
    traj = _play(jail, tasks, "attack", [Action("mark", {"key": "b"}), Action(attack),
                                         Action("mark", {"key": "b"})], mode)
    assert traj.reward == 0.0, (traj.check_results, traj.error)
    assert traj.final_state.get("reached", []) == [], traj.final_state
    _honest_episodes_score_true_rewards(jail, tasks, mode)
    assert jail.num_replaced == replaced  # the jail itself was never compromised


@pytest.mark.parametrize("mode", ["run", "steps"])
def test_environment_code_cannot_make_an_unscored_episode_scored(jail, mode):
    """EnvScaler's rule: no chat_with_user, no reward. The supervisor decides that from the
    actions it relayed, so an episode process that rewrites its own record of them gains nothing."""
    tasks = integrity_pool()
    traj = _play(jail, tasks, "attack-envscaler", [Action("forge_end")], mode)
    assert traj.final_state["items"] == {"a": "done"}  # the goal was reached ...
    assert traj.reward == 0.0 and traj.check_errors[0].startswith("unscored"), traj.check_errors
    _honest_episodes_score_true_rewards(jail, tasks, mode)
    # control: the attack is real; in-process (trusted code only) the record it rewrote decides
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=1, trust="any")) as pool:
        assert _play(pool, tasks, "attack-envscaler", [Action("forge_end")], mode).reward == 1.0


@pytest.mark.parametrize("mode", ["run", "steps"])
@pytest.mark.parametrize("attack", ["poison", "background"])
def test_nothing_of_an_episode_reaches_the_next(jail, attack, mode):
    tasks = integrity_pool()
    traj = _play(jail, tasks, "attack", [Action(attack), Action("mark", {"key": "a"})], mode)
    if attack == "background":
        assert traj.reward == 0.0 and "process(es) running" in traj.error, traj.error
    _honest_episodes_score_true_rewards(jail, tasks, mode)
    _honest_episodes_score_true_rewards(jail, tasks, mode)


def test_the_jail_exposes_only_the_stdlib_and_allowed_packages(jail):
    tasks = integrity_pool()
    traj = _play(jail, tasks, "attack", [Action("exposure")], "run")
    report = traj.final_state["report"]
    assert report["allowed"] is True
    assert not any(report["third_party"].values()), report["third_party"]
    assert report["site_dirs"] and all(entries == [] for entries in report["site_dirs"].values())
    assert report["wheels"] == []
    assert report["unshare_user"] == [-1, 1]  # EPERM: no user namespace inside the jail
    assert str(PROJECT_ROOT) not in report["mountinfo"]
    assert str(Path(sys.prefix).resolve()) not in report["mountinfo"]  # the venv
    _honest_episodes_score_true_rewards(jail, tasks, "run")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", [sandbox_param("inprocess"), *JAILS])
def test_rollout_pool_always_returns_and_workers_survive_runs(kind):
    pool = integrity_pool()
    honest = pool.tasks[pool.task_index("honest-half")]
    attacker = pool.tasks[pool.task_index("attack")]
    huge = Task("honest-huge", "honest", "x" * (10 * MiB), {}, (A_DONE,))
    tasks = Pool("integrity+huge", pool.environments, pool.tasks + (huge,))

    def policy(task, observations):
        return Action("mark", {"key": "a"}) if len(observations) == 1 else None

    jobs = [RolloutJob(huge, policy=policy), RolloutJob(honest, policy=policy),
            RolloutJob(huge, actions=(Action("mark", {"key": "a"}),)),
            RolloutJob(honest, actions=(Action("mark", {"key": "a"}),))]
    if kind != "inprocess":
        jobs += [RolloutJob(attacker, actions=(Action("deep"),)),
                 RolloutJob(attacker, policy=lambda t, o: Action("deep") if len(o) == 1 else None)]
    config = SandboxConfig(kind=kind, limits=LIMITS, num_workers=2, trust="any")
    with make_worker_pool(config) as workers:
        runner = RolloutPool(workers, tasks, RolloutConfig(episode_timeout_s=20.0))
        for _ in range(2):  # a second run on the same pool loses nothing
            results = runner.run(jobs)
            if kind == "inprocess":  # nothing is serialised: a huge instruction is no problem
                assert [(r.reward, r.error) for r in results] == [(1.0, None), (0.5, None)] * 2
                continue
            assert [r.reward for r in results[:4]] == [0.0, 0.5, 0.0, 0.5]
            assert results[0].error.startswith("input: the request is too large"), results[0].error
            assert results[2].error.startswith("input: the request is too large"), results[2].error
            assert results[1].error is None and results[3].error is None
            for r in results[4:]:
                assert r.reward == 0.0 and r.error.startswith("state: "), r.error
                assert "RecursionError" in r.error or "deeper than" in r.error
        assert workers.num_started <= 2 and workers.num_replaced == 0


# -- rewards are validated where they enter the parent ------------------------------------------

class _ScriptedWorker:
    startup_seconds = 0.0

    def __init__(self, score):
        self.score = score

    def request(self, message, timeout):
        if message["op"] == "reset":
            return {"ok": True, "observation": {"content": "hi"}, "state": {}}
        if message["op"] == "score":
            return {"ok": True, **self.score}
        if message["op"] == "run":
            return {"ok": True, "record": {"reset": {"observation": None, "state": {}},
                                           "steps": [], "score": self.score}}
        return {"ok": True}

    def close(self):
        pass


class _ScriptedBackend:
    name = "scripted"
    limits = SandboxLimits()

    def __init__(self, score):
        self.score = score

    def start_worker(self):
        return _ScriptedWorker(self.score)

    def close(self):
        pass


GOOD_SCORE = {"reward": 0.5, "check_results": [True, False], "check_errors": [None, None],
              "final_state": {}, "end_reason": "chat_with_user", "error": None}


@pytest.mark.parametrize("change, message", [
    ({"reward": float("nan")}, "reward nan is not a finite number in [0, 1]"),
    ({"reward": 5.0}, "reward 5.0 is not a finite number in [0, 1]"),
    ({"reward": -0.5}, "reward -0.5 is not a finite number in [0, 1]"),
    ({"reward": "1.0"}, "reward '1.0' is not a number"),
    ({"reward": True}, "reward True is not a number"),
    ({"reward": 1.0}, "reward 1.0 is not the fraction of passed checks (1 of 2)"),
    ({"check_results": [True]}, "check_results has 1 entries for 2 declared checks"),
    ({"check_results": [1, 0]}, "check_results holds a value that is not a boolean"),
    ({"check_errors": [None]}, "check_errors is not one string or null per check (2)"),
    ({"end_reason": None}, "end_reason None is not a string"),
])
@pytest.mark.parametrize("mode", ["run", "steps"])
def test_invalid_scores_end_only_their_episode(change, message, mode):
    task = Task("t", "honest", "Mark a and b.", {}, (A_DONE, B_DONE))
    pool = Pool("p", (integrity_pool().environment("honest"),), (task,))
    bad = WorkerPool(_ScriptedBackend({**GOOD_SCORE, **change}), size=1)
    traj = _play(bad, pool, "t", [], mode)
    assert traj.reward == 0.0 and traj.error == f"invalid_score: {message}"
    assert bad.num_replaced == 1
    good = WorkerPool(_ScriptedBackend(GOOD_SCORE), size=1)
    results = RolloutPool(good, pool).run([RolloutJob(task, actions=())] * 3)
    rewards = group_rewards(results, ["t"], 3)
    assert np.isfinite(rewards).all() and (rewards == 0.5).all()
    with pytest.raises(SandboxError, match="invalid_score"):
        validate_score({**GOOD_SCORE, **change}, 2)


# -- Docker containers do not outlive their owner ----------------------------------------------

OWNER_SCRIPT = textwrap.dedent('''
    import sys, time
    from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
    from envsched_jax.envs.sandbox.docker_backend import owner_label
    pool = make_worker_pool(SandboxConfig(kind="docker", num_workers=2))
    held = [pool.lease(), pool.lease()]
    print(owner_label(), flush=True)
    time.sleep(600)
''')


def _containers(label: str) -> list:
    import docker

    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": label})
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.parametrize("kind", [sandbox_param("docker")])
def test_docker_workers_are_removed_when_their_owner_is_killed(kind):
    owner = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT], stdout=subprocess.PIPE,
                             text=True, cwd=PROJECT_ROOT)
    try:
        label = owner.stdout.readline().strip()
        assert label, "the owner process did not start its workers"
        assert len(_containers(f"envsched.owner={label}")) == 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 30
    while _containers(f"envsched.owner={label}") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _containers(f"envsched.owner={label}") == []


@pytest.mark.docker
@pytest.mark.parametrize("kind", [sandbox_param("docker")])
def test_stale_docker_workers_are_removed_at_start_up(kind):
    import docker

    from envsched_jax.envs.sandbox.docker_backend import (
        LABEL,
        OWNER_LABEL,
        ensure_image,
        owner_label,
    )

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
    dead_owner = owner_label(int(finished.stdout))  # a pid whose process is gone
    client = docker.from_env()
    try:
        stale = client.containers.create(ensure_image(client), command=["/bin/true"],
                                         labels={LABEL: "1", OWNER_LABEL: dead_owner},
                                         network_mode="none")
        with make_worker_pool(SandboxConfig(kind="docker", num_workers=1)) as pool:
            assert pool.backend.stale_removed >= 1
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(stale.id)
    finally:
        client.close()


def test_scores_are_computed_from_checks_outside_the_environment_process():
    """In-process the same split holds: the reward is the fraction of passed checks on the
    state as data, whatever the environment object does after the episode."""
    from envsched_jax.envs.runtime import core

    spec = {"env_id": "honest", "class_name": "Honest", "class_source": HONEST_SOURCE,
            "task_id": "t", "instruction": "", "initial_state": {},
            "checks": [A_DONE.code, B_DONE.code], "tool_names": ["mark"]}
    episode = core.EpisodeCore(spec)
    episode.reset()
    episode.step({"name": "mark", "arguments": {"key": "a"}})
    payload = json.loads(json.dumps(episode.final_payload()))
    episode.instance.items["b"] = "done"  # too late: the payload is data
    checked = core.check_payload(spec, payload)
    score = core.assemble_score(payload, checked)
    assert score["reward"] == 0.5 and score["check_results"] == [True, False]
    assert math.isfinite(score["reward"])
