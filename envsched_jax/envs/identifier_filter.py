"""The identifier filter (EnvSched, appendix C): tasks whose reward can be had by guessing.

The paper: the filter "examines high-reward trajectories for identifiers that cannot be obtained
from the permitted context or for replacement objects that duplicate existing records. It first
replays the saved fixed action sequence and checks that the replayed reward agrees with the stored
reward within 1e-4. It then removes the suspicious action and dependent edits and replays the
sequence again. A task is filtered only when the removal lowers the reward." Filtered tasks leave
both scheduler phases (``make_scheduler("envsched", graph, excluded=report.filtered_task_ids)``).

What this implementation takes each phrase to mean (the paper leaves it open):

*High-reward trajectory*: reward >= ``min_reward`` (default 0.5).

*Identifier argument*: a string or integer argument whose parameter name says identifier
(``id``, ``*_id``, ``*_ids``, ``key``, ``code``, ``*_number``, ``*_no``) or whose value is the key
of a record in a table of the initial state (a top-level attribute that maps keys to objects).

*Permitted context*: the instruction (every scripted user turn for multi-turn tasks) and every
observation before the action (the reset observation included). An identifier is *unobtainable*
when its text does not occur there as a whole token. The initial state is not permitted context:
the agent never sees it.

*Replacement object*: an action that adds a record to a table (a top-level attribute mapping keys
to objects) whose natural key (a non-empty ``name``, ``title``, ``email``, ``username``,
``subject`` or ``label`` field, compared without case) equals that of a record already in the
table: a second "Maria Lopez" created with the new phone number instead of an edit of the first.
Records without such a field (orders, loans) are never called duplicates, since two identical
orders can both be legitimate.

*Dependent edits*: later actions that use, as an argument value, the suspicious identifier, a key
the suspicious action created, or an identifier first shown in its observation; transitively.
``chat_with_user`` is never removed.

Every suspicion is replayed (the stored reward must be reproduced within the tolerance first, or
the trajectory is reported as a replay mismatch and not used); a task is filtered when some
suspicion's removal lowers the reward by more than the tolerance. Replays run in whatever
sandbox the given worker pool uses and never sample new actions.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from envsched_jax.envs.replay import REPLAY_TOLERANCE, replay_actions
from envsched_jax.envs.runtime.core import CHAT_WITH_USER, USER_STOP
from envsched_jax.envs.sandbox.base import WorkerPool
from envsched_jax.envs.trajectory import Trajectory
from envsched_jax.pool.model import Pool, Task

_ID_PARAM = re.compile(r"(^|_)(id|ids|key|code|number|no)$", re.IGNORECASE)
_NATURAL_KEY = re.compile(r"(^|_)(name|title|email|username|subject|label)$", re.IGNORECASE)
Reason = Literal["unobtainable_identifier", "duplicate_record"]


@dataclasses.dataclass(frozen=True)
class IdentifierFilterConfig:
    """Attributes:
      min_reward: trajectories with at least this reward are examined.
      tolerance: replay agreement and reward-drop threshold (the paper's 1e-4).
      timeout_s: wall-clock limit of each replay.
    """

    min_reward: float = 0.5
    tolerance: float = REPLAY_TOLERANCE
    timeout_s: float = 30.0

    def __post_init__(self):
        if not 0.0 < self.min_reward <= 1.0:
            raise ValueError(f"min_reward must be in (0, 1], got {self.min_reward!r}")
        if not self.tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance!r}")


@dataclasses.dataclass(frozen=True)
class Suspicion:
    """One suspicious action of one trajectory (``step`` indexes the trajectory's actions)."""

    task_id: str
    trajectory_index: int
    step: int
    action: str
    reason: Reason
    detail: str
    removed_steps: tuple[int, ...]
    reward_with: float | None = None
    reward_without: float | None = None
    confirmed: bool = False


@dataclasses.dataclass(frozen=True)
class FilterReport:
    examined: int
    suspicions: tuple[Suspicion, ...]
    replay_mismatches: tuple[tuple[str, int, float, float], ...]  # task, index, stored, replayed
    filtered_task_ids: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Pure detection


def _tables(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Top-level attributes that map keys to record objects."""
    return {name: value for name, value in state.items()
            if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values())}


def _record_keys(state: Mapping[str, Any]) -> set[str]:
    return {str(k) for table in _tables(state).values() for k in table}


def _occurs(text: str, value: str) -> bool:
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(value) + r"(?![A-Za-z0-9])", text) is not None


def _identifier_arguments(action: Mapping[str, Any], known_keys: set[str]) -> list[tuple[str, str]]:
    out = []
    for name, value in (action.get("arguments") or {}).items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                continue
            text = str(v).strip()
            if text and (_ID_PARAM.search(name) or text in known_keys):
                out.append((name, text))
    return out


def _apply(state: dict[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    new = dict(state)
    new.update(change.get("set", {}))
    for key in change.get("removed", []):
        new.pop(key, None)
    return new


def _duplicates(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(table, new key, duplicated key) for every record added that repeats the natural key
    (name, title, e-mail, ...) of a record that existed before."""
    out = []
    old_tables = _tables(before)
    for name, table in _tables(after).items():
        old = old_tables.get(name, {})
        for key in sorted(set(table) - set(old), key=str):
            new = table[key]
            fields = [f for f in new if _NATURAL_KEY.search(f) and isinstance(new[f], str)
                      and new[f].strip()]
            for old_key, record in old.items():
                if any(_norm(record.get(f)) == _norm(new[f]) for f in fields):
                    out.append((name, str(key), str(old_key)))
                    break
    return out


def _norm(value: Any) -> Any:
    return value.strip().casefold() if isinstance(value, str) else value


def _context_texts(task: Task, trajectory: Trajectory) -> list[str]:
    """Permitted context before each action: texts[i] is what the agent had seen before step i."""
    base = "\n".join([task.instruction, *task.user_turns])
    texts, seen = [], [base]
    observations = trajectory.observations
    steps = trajectory.steps()
    if observations:
        seen.append(json.dumps(observations[0], ensure_ascii=False))
    for k in range(len(trajectory.actions)):
        texts.append("\n".join(seen))
        if k < len(steps):
            seen.append(json.dumps(steps[k]["observation"], ensure_ascii=False))
    return texts


def _dependents(trajectory: Trajectory, step: int, taint: set[str],
                states: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
    removed = [step]
    taint = set(taint)
    for k in range(step + 1, len(trajectory.actions)):
        action = trajectory.actions[k]
        if action["name"] == CHAT_WITH_USER:
            continue
        values = {str(v) for v in _flat_values(action.get("arguments") or {})}
        if values & taint:
            removed.append(k)
            taint |= _record_keys(states[k + 1]) - _record_keys(states[k])
    return tuple(removed)


def _flat_values(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _flat_values(v)
    elif isinstance(value, list):
        for v in value:
            yield from _flat_values(v)
    elif isinstance(value, (str, int)) and not isinstance(value, bool):
        yield value


def find_suspicions(task: Task, trajectory: Trajectory, index: int = 0) -> list[Suspicion]:
    """Suspicious actions of one trajectory (no replay): unobtainable identifiers and replacement
    objects, each with the steps its removal takes out (itself and its dependent edits)."""
    steps = trajectory.steps()
    states = [dict(trajectory.initial_state)]
    for s in steps:
        states.append(_apply(states[-1], s.get("state_change", {})))
    while len(states) < len(trajectory.actions) + 1:
        states.append(states[-1])
    known_keys = _record_keys(states[0])
    contexts = _context_texts(task, trajectory)
    out = []
    for k, action in enumerate(trajectory.actions[:len(steps)]):
        if action["name"] == CHAT_WITH_USER:
            continue
        created = _record_keys(states[k + 1]) - _record_keys(states[k])
        shown = {m for m in re.findall(r"[A-Za-z0-9][A-Za-z0-9_\-]*",
                                       json.dumps(steps[k]["observation"]))
                 if not _occurs(contexts[k], m)}
        for name, value in _identifier_arguments(action, known_keys | _record_keys(states[k])):
            if _occurs(contexts[k], value):
                continue
            taint = {value} | created | shown
            out.append(Suspicion(task.task_id, index, k, action["name"], "unobtainable_identifier",
                                 f"{name}={value!r} is in neither the instruction nor any earlier "
                                 "observation", _dependents(trajectory, k, taint, states)))
        for table, new_key, old_key in _duplicates(states[k], states[k + 1]):
            taint = {new_key} | created | shown
            out.append(Suspicion(task.task_id, index, k, action["name"], "duplicate_record",
                                 f"new {table}[{new_key!r}] duplicates existing "
                                 f"{table}[{old_key!r}]", _dependents(trajectory, k, taint, states)))
    return out


# ---------------------------------------------------------------------------------------------
# Confirmation by replay


def identifier_filter(trajectories: Sequence[Trajectory], tasks: Pool, workers: WorkerPool,
                      config: IdentifierFilterConfig | None = None) -> FilterReport:
    """Examine ``trajectories`` (of tasks in ``tasks``), confirm each suspicion by replay in
    ``workers``' sandbox, and list the tasks to exclude."""
    config = config or IdentifierFilterConfig()
    suspicions: list[Suspicion] = []
    mismatches: list[tuple[str, int, float, float]] = []
    filtered: set[str] = set()
    examined = 0
    for index, traj in enumerate(trajectories):
        if traj.reward < config.min_reward or traj.error is not None:
            continue
        examined += 1
        task = tasks.tasks[tasks.task_index(traj.task_id)]
        found = find_suspicions(task, traj, index)
        if not found:
            continue
        actions = traj.action_records()
        stop = traj.end_reason == USER_STOP
        again = replay_actions(workers, tasks, traj.task_id, actions, traj.reward,
                               tolerance=config.tolerance, timeout=config.timeout_s,
                               user_stop=stop)
        if not again.reward_matches:
            mismatches.append((traj.task_id, index, traj.reward, again.reward))
            suspicions.extend(found)
            continue
        for s in found:
            kept = tuple(a for k, a in enumerate(actions) if k not in s.removed_steps)
            without = replay_actions(workers, tasks, traj.task_id, kept, again.reward,
                                     tolerance=config.tolerance, timeout=config.timeout_s,
                                     user_stop=stop)
            confirmed = without.reward < again.reward - config.tolerance
            suspicions.append(dataclasses.replace(s, reward_with=again.reward,
                                                  reward_without=without.reward,
                                                  confirmed=confirmed))
            if confirmed:
                filtered.add(traj.task_id)
    order = {t.task_id: k for k, t in enumerate(tasks.tasks)}
    return FilterReport(examined, tuple(suspicions), tuple(mismatches),
                        tuple(sorted(filtered, key=order.__getitem__)))
