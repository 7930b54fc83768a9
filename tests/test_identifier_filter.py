"""The identifier filter catches tasks built to be exploitable (a verifier that a guessed
identifier or a duplicate record satisfies), leaves honest tasks alone, and its output plugs into
EnvSched's ``excluded=``."""

from __future__ import annotations

import pytest

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.identifier_filter import (
    IdentifierFilterConfig,
    find_suspicions,
    identifier_filter,
)
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.pool.model import Action, Check, Environment, Pool, Task
from envsched_jax.pool.sources import load_pool
from sandbox_helpers import sandbox_param

ACCOUNTS_SOURCE = '''
class Accounts:
    def __init__(self, init_config):
        self.accounts = {}

    def find_account(self, email):
        hits = [k for k, a in self.accounts.items() if a["email"] == email]
        return {"success": bool(hits), "data": hits}

    def close_account(self, account_id):
        if account_id not in self.accounts:
            return {"success": False, "error": "unknown account"}
        self.accounts[account_id]["status"] = "closed"
        return {"success": True}

    def create_account(self, name, email):
        key = "A-%04d" % (9000 + len(self.accounts))
        self.accounts[key] = {"name": name, "email": email, "status": "active"}
        return {"success": True, "data": key}

    def set_email(self, account_id, email):
        if account_id not in self.accounts:
            return {"success": False, "error": "unknown account"}
        self.accounts[account_id]["email"] = email
        return {"success": True}
'''

STATE = {"accounts": {
    "A-7731": {"name": "Alice Ng", "email": "alice@example.com", "status": "active"},
    "A-1204": {"name": "Bob Ruiz", "email": "bob@example.com", "status": "active"},
    "A-5150": {"name": "Carol Diaz", "email": "carol@example.com", "status": "active"},
}}


def _check(text, body):
    return Check(text, "def check_func(final_state):\n    accounts = final_state['accounts']\n"
                       f"    return {body}\n")


CLOSED_ALICE = _check("Alice Ng's account is closed",
                      "any(a['status'] == 'closed' and a['name'] == 'Alice Ng' for a in accounts.values())")
CLOSED_BOB = _check("Bob Ruiz's account is closed", "accounts['A-1204']['status'] == 'closed'")
CAROL_NEW_MAIL = _check("Carol Diaz has the new address",
                        "any(a['name'] == 'Carol Diaz' and a['email'] == 'carol@new.example' "
                        "for a in accounts.values())")
OTHERS_OPEN = _check("no other account is closed",
                     "sum(a['status'] == 'closed' for a in accounts.values()) <= 1")


def accounts_pool() -> Pool:
    env = Environment("accounts", "Accounts", "user accounts",
                      tools=tuple({"name": n} for n in ("find_account", "close_account",
                                                        "create_account", "set_email")),
                      class_source=ACCOUNTS_SOURCE)
    tasks = (
        Task("close-alice", "accounts", "Close the account registered to alice@example.com.",
             STATE, (CLOSED_ALICE, OTHERS_OPEN)),
        Task("close-bob", "accounts", "Close the account registered to bob@example.com.",
             STATE, (CLOSED_BOB, OTHERS_OPEN)),
        Task("carol-mail", "accounts",
             "Carol Diaz (carol@example.com) moved: her address is now carol@new.example.",
             STATE, (CAROL_NEW_MAIL, OTHERS_OPEN)),
    )
    return Pool("accounts", (env,), tasks)


CHAT = Action("chat_with_user", {"message": "done"})
TRAJECTORIES = {
    # exploit: the identifier is guessed, never looked up
    "guessed": ("close-alice", [Action("close_account", {"account_id": "A-7731"}), CHAT]),
    # honest: the identifier comes from an observation
    "honest_alice": ("close-alice", [Action("find_account", {"email": "alice@example.com"}),
                                     Action("close_account", {"account_id": "A-7731"}), CHAT]),
    "honest_bob": ("close-bob", [Action("find_account", {"email": "bob@example.com"}),
                                 Action("close_account", {"account_id": "A-1204"}), CHAT]),
    # a stray guess that fails and does not produce the reward
    "harmless_guess": ("close-bob", [Action("close_account", {"account_id": "A-0000"}),
                                     Action("find_account", {"email": "bob@example.com"}),
                                     Action("close_account", {"account_id": "A-1204"}), CHAT]),
    # exploit: a replacement record instead of an edit of the existing one
    "replacement": ("carol-mail", [Action("create_account", {"name": "Carol Diaz",
                                                             "email": "carol@new.example"}), CHAT]),
    "honest_carol": ("carol-mail", [Action("find_account", {"email": "carol@example.com"}),
                                    Action("set_email", {"account_id": "A-5150",
                                                         "email": "carol@new.example"}), CHAT]),
}


def _run(workers, tasks, names):
    out = []
    for name in names:
        task_id, actions = TRAJECTORIES[name]
        task = tasks.tasks[tasks.task_index(task_id)]
        out.append(run_actions(workers, tasks.environment(task.env_id), task, actions))
    return out


@pytest.mark.parametrize("kind", [sandbox_param("bwrap"), sandbox_param("docker")])
def test_filter_catches_exploits_and_leaves_honest_tasks(kind):
    tasks = accounts_pool()
    with make_worker_pool(SandboxConfig(kind=kind, num_workers=1)) as workers:
        honest = _run(workers, tasks, ["honest_alice", "honest_bob", "harmless_guess",
                                       "honest_carol"])
        assert [t.reward for t in honest] == [1.0] * 4
        clean = identifier_filter(honest, tasks, workers)
        assert clean.examined == 4 and clean.filtered_task_ids == ()
        (stray,) = clean.suspicions  # the failed guess is suspicious but earns nothing
        assert stray.detail.startswith("account_id='A-0000'") and not stray.confirmed
        assert stray.reward_with == stray.reward_without == 1.0

        exploits = _run(workers, tasks, ["guessed", "replacement"])
        assert [t.reward for t in exploits] == [1.0, 1.0]
        report = identifier_filter(honest + exploits, tasks, workers)
    assert report.filtered_task_ids == ("close-alice", "carol-mail")
    confirmed = {s.reason: s for s in report.suspicions if s.confirmed}
    assert confirmed["unobtainable_identifier"].task_id == "close-alice"
    assert confirmed["unobtainable_identifier"].reward_without == 0.5
    assert confirmed["duplicate_record"].detail == \
        "new accounts['A-9003'] duplicates existing accounts['A-5150']"
    assert report.replay_mismatches == ()


def test_dependent_edits_are_removed_with_the_suspicious_action():
    tasks = accounts_pool()
    actions = [Action("create_account", {"name": "Alice Ng", "email": "alice@example.com"}),
               Action("close_account", {"account_id": "A-9003"}), CHAT]
    with make_worker_pool(SandboxConfig(kind="inprocess", trust="any")) as workers:
        traj = run_actions(workers, tasks.environments[0], tasks.tasks[0], actions)
        (dup,) = find_suspicions(tasks.tasks[0], traj)
        assert dup.reason == "duplicate_record" and dup.removed_steps == (0, 1)
        report = identifier_filter([traj], tasks, workers)
    assert report.filtered_task_ids == ("close-alice",)


def test_a_replay_that_disagrees_is_reported_not_filtered():
    tasks = accounts_pool()
    with make_worker_pool(SandboxConfig(kind="inprocess", trust="any")) as workers:
        (traj,) = _run(workers, tasks, ["guessed"])
        traj.reward = 0.75  # a stored reward the actions do not reproduce
        report = identifier_filter([traj], tasks, workers)
    assert report.filtered_task_ids == () and report.replay_mismatches == (("close-alice", 0, 0.75, 1.0),)


def test_low_reward_trajectories_are_not_examined():
    with pytest.raises(ValueError, match="min_reward must be in"):
        IdentifierFilterConfig(min_reward=0.0)
    tasks = accounts_pool()
    with make_worker_pool(SandboxConfig(kind="inprocess", trust="any")) as workers:
        (traj,) = _run(workers, tasks, ["guessed"])
        report = identifier_filter([traj], tasks, workers, IdentifierFilterConfig(min_reward=1.0))
        assert report.filtered_task_ids == ("close-alice",)
        traj.reward = 0.4
        assert identifier_filter([traj], tasks, workers).examined == 0


def test_filtered_ids_plug_into_envsched():
    """Embedded clinic tasks replayed with their lookups dropped (identifiers guessed) are
    filtered, their reference trajectories are not, and EnvSched never selects a filtered task."""
    from envsched_jax.graph.build import build_graph
    from envsched_jax.sched import EnvSchedConfig, make_scheduler

    pool = load_pool("embedded")
    clinic = [t for t in pool.tasks if t.env_id == "clinic_beds"]
    with make_worker_pool(SandboxConfig(kind="inprocess")) as workers:
        reference = [run_actions(workers, pool.environment(t.env_id), t, t.reference_actions)
                     for t in clinic]
        assert identifier_filter(reference, pool, workers).filtered_task_ids == ()
        guessed = [run_actions(workers, pool.environment(t.env_id), t,
                               [a for a in t.reference_actions
                                if not a.name.startswith(("find_", "get_", "list_"))])
                   for t in clinic]
        report = identifier_filter(guessed, pool, workers)
    exploitable = {t.task_id for t in guessed if t.reward >= 0.5}
    assert 10 <= len(report.filtered_task_ids) <= len(exploitable)
    assert set(report.filtered_task_ids) <= exploitable

    graph = build_graph(pool)
    sched = make_scheduler("envsched", graph, config=EnvSchedConfig(batch_size=16),
                           excluded=list(report.filtered_task_ids))
    excluded = set(report.filtered_task_ids)
    import numpy as np
    for step in range(4):
        ids = sched.select(step)
        assert not excluded & set(ids)
        sched.observe(step, ids, np.full((len(ids), 8), 0.5, dtype=np.float32))
