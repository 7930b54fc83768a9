"""Hostile environment and check code in the jailed sandboxes (bubblewrap, Docker): escapes and
resource exhaustion.

Each case runs code that tries to escape or exhaust the sandbox. It must be contained within its
limit, the episode must end with reward 0 and an error naming the cause, the worker pool must
serve the next (honest) episode, and the host must be unchanged. Attacks on the reward itself and
on later episodes are in ``test_sandbox_integrity.py``. (The in-process sandbox runs trusted
code only; it is tested for refusing everything else.)
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from envsched_jax.envs.episode import Episode, run_actions
from envsched_jax.envs.sandbox import (
    SandboxConfig,
    SandboxLimits,
    UntrustedEnvironment,
    make_worker_pool,
)
from envsched_jax.pool.model import Action, Check, Environment, Pool, Task

from sandbox_helpers import sandbox_param

MiB = 2**20
PROJECT_README = Path(__file__).resolve().parent.parent / "README.md"


JAILS = [sandbox_param("bwrap"), sandbox_param("docker")]

HOSTILE_SOURCE = '''
import os, socket, sys, time


class Hostile:
    def __init__(self, init_config):
        self.items = dict((init_config or {}).get("items", {}))

    def mark(self, key):
        self.items[key] = "done"
        return {"success": True}

    def spin(self):
        while True:
            pass

    def eat_memory(self):
        hoard = []
        while True:
            hoard.append(bytearray(16 * 2**20))

    def fork_bomb(self):
        while True:
            os.fork()

    def connect(self, port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        sock.sendall(b"escaped")
        return {"success": True}

    def write_file(self, path):
        with open(path, "w") as f:
            f.write("escaped")
        return {"success": True}

    def read_file(self, path):
        with open(path) as f:
            return {"success": True, "data": f.read()}

    def flood(self):
        sys.stdout.write("x" * (20 * 2**20))
        sys.stderr.write("y" * (20 * 2**20))
        return {"success": True, "data": "z" * (20 * 2**20)}

    def big_file(self):
        with open("/tmp/big", "wb") as f:
            for _ in range(64):
                f.write(b"\\0" * 2**20)
        return {"success": True}

    def nap(self):
        time.sleep(600)
'''

GOOD_CHECK = Check("item a is done", "def check_func(final_state):\n"
                                     "    return final_state['items'].get('a') == 'done'\n")
SPIN_CHECK = Check("a check that never returns",
                   "def check_func(final_state):\n    while True:\n        pass\n")


def hostile_pool() -> Pool:
    env = Environment(env_id="hostile", class_name="Hostile", summary="hostile code",
                      tools=tuple({"name": n, "parameters": {"type": "object", "properties": {}}}
                                  for n in ("mark", "spin", "eat_memory", "fork_bomb", "connect",
                                            "write_file", "read_file", "flood", "big_file", "nap")),
                      class_source=HOSTILE_SOURCE)
    tasks = (Task("hostile-0", "hostile", "Mark item a.", {"items": {}}, (GOOD_CHECK,)),
             Task("hostile-check", "hostile", "Mark item a.", {"items": {}},
                  (GOOD_CHECK, SPIN_CHECK)))
    return Pool("hostile", (env,), tasks)


LIMITS = SandboxLimits(cpu_seconds=1.0, wall_seconds=6.0, memory_bytes=256 * MiB,
                       max_processes=16, max_file_bytes=4 * MiB, tmp_bytes=8 * MiB,
                       max_message_bytes=4 * MiB)


@pytest.fixture(scope="module", params=JAILS)
def jail(request):
    pool = make_worker_pool(SandboxConfig(kind=request.param, limits=LIMITS, num_workers=1))
    yield pool
    pool.close()


def _episode(pool, tasks, task_id, actions, timeout=None):
    task = tasks.tasks[tasks.task_index(task_id)]
    return run_actions(pool, tasks.environment(task.env_id), task, actions, timeout=timeout)


def _still_serves(pool, tasks):
    honest = _episode(pool, tasks, "hostile-0", [Action("mark", {"key": "a"})])
    assert honest.reward == 1.0 and honest.error is None, honest.error


@pytest.mark.parametrize("tool, arguments, cause", [
    ("spin", {}, "cpu: CPU time limit"),
    ("eat_memory", {}, "memory: memory limit"),
    ("fork_bomb", {}, "process"),
    ("flood", {}, "output: output limit"),
])
def test_resource_attack_is_contained(jail, tool, arguments, cause):
    tasks = hostile_pool()
    replaced = jail.num_replaced
    traj = _episode(jail, tasks, "hostile-0", [Action("mark", {"key": "a"}), Action(tool, arguments)])
    assert traj.reward == 0.0
    assert traj.error is not None and cause in traj.error, traj.error
    assert all(cause in e for e in traj.check_errors)
    _still_serves(jail, tasks)
    # the episode's processes were killed and cleaned up; the jail itself serves on
    assert jail.num_replaced == replaced


def test_fork_bomb_error_names_the_process_limit(jail):
    traj = _episode(jail, hostile_pool(), "hostile-0", [Action("fork_bomb")])
    assert "processes" in traj.end_reason or "BlockingIOError" in (traj.error or ""), traj.error


def test_infinite_loop_in_a_check_ends_the_episode(jail):
    tasks = hostile_pool()
    traj = _episode(jail, tasks, "hostile-check", [Action("mark", {"key": "a"})])
    assert traj.reward == 0.0 and "cpu: CPU time limit" in traj.error
    _still_serves(jail, tasks)


def test_sleeping_code_hits_the_wall_clock(jail):
    tasks = hostile_pool()
    traj = _episode(jail, tasks, "hostile-0", [Action("nap")], timeout=1.5)
    assert traj.reward == 0.0 and traj.error.startswith("wall_clock: episode timeout of 1.5 s")
    _still_serves(jail, tasks)


def test_network_is_unreachable(jail):
    tasks = hostile_pool()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted = []

    def accept():
        for _ in range(30):
            try:
                accepted.append(server.accept())
            except (TimeoutError, OSError):
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        traj = _episode(jail, tasks, "hostile-0",
                        [Action("connect", {"port": server.getsockname()[1]})])
    finally:
        thread.join()
        server.close()
    assert accepted == []
    assert traj.reward == 0.0 and "tool 'connect' raised" in traj.error, traj.error
    assert "Network is unreachable" in traj.error or "Connection refused" in traj.error
    _still_serves(jail, tasks)


def test_writes_outside_the_sandbox_do_not_reach_the_host(jail, tmp_path):
    tasks = hostile_pool()
    targets = [tmp_path / "escaped.txt", PROJECT_README.parent / "escaped_by_sandbox.txt",
               Path("/root/escaped_by_sandbox.txt")]
    for target in targets:
        traj = _episode(jail, tasks, "hostile-0", [Action("write_file", {"path": str(target)})])
        assert traj.reward == 0.0 and "tool 'write_file' raised" in traj.error, traj.error
        assert not target.exists()
    _still_serves(jail, tasks)


def test_host_files_cannot_be_read(jail):
    tasks = hostile_pool()
    for path in (PROJECT_README, Path("/etc/shadow"), Path(__file__)):
        assert path.exists()
        traj = _episode(jail, tasks, "hostile-0", [Action("read_file", {"path": str(path)})])
        assert traj.reward == 0.0 and "FileNotFoundError" in traj.error, traj.error
    _still_serves(jail, tasks)


def test_file_size_and_tmp_are_limited(jail):
    tasks = hostile_pool()
    traj = _episode(jail, tasks, "hostile-0", [Action("big_file")])
    assert traj.reward == 0.0 and "tool 'big_file' raised OSError" in traj.error, traj.error
    assert "File too large" in traj.error or "No space left" in traj.error
    _still_serves(jail, tasks)


def test_inprocess_refuses_untrusted_code():
    tasks = hostile_pool()
    with make_worker_pool(SandboxConfig(kind="inprocess")) as pool:
        with pytest.raises(UntrustedEnvironment, match="'hostile' has no trusted in-process class"):
            Episode(pool, tasks.environments[0])
        with pytest.raises(UntrustedEnvironment, match="bwrap"):
            _episode(pool, tasks, "hostile-0", [Action("mark", {"key": "a"})])
