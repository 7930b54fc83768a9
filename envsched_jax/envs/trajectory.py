"""Episode trajectories: every observation and state change, savable as JSON lines.

A :class:`Trajectory` is the complete record of one episode: the actions in order, one event per
phase (``reset`` with the first observation and the initial state; one ``step`` per action with
its observation, the state attributes it changed and whether it ended the episode; ``score``), and
the outcome (reward, per-check results and errors, end reason, error, final state). It is plain
JSON, so :func:`write_trajectories` stores one trajectory per line and :func:`read_trajectories`
gives back equal records; a bad line is reported with its file, line and field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from envsched_jax.pool.model import Action, PoolError


@dataclasses.dataclass
class Trajectory:
    task_id: str
    env_id: str
    sandbox: str
    actions: list[dict[str, Any]]
    events: list[dict[str, Any]]
    reward: float
    check_results: list[bool]
    check_errors: list[str | None]
    end_reason: str
    error: str | None
    final_state: dict[str, Any]
    wall_seconds: float = 0.0

    @property
    def initial_state(self) -> dict[str, Any]:
        return self.events[0].get("state", {}) if self.events else {}

    @property
    def observations(self) -> list[Any]:
        """Observations in order: the reset observation, then one per executed step."""
        return [e["observation"] for e in self.events if e["kind"] in ("reset", "step")]

    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "step"]

    def action_records(self) -> tuple[Action, ...]:
        return tuple(Action(a["name"], a.get("arguments", {}), a.get("turn", 0))
                     for a in self.actions)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: Mapping[str, Any], *, source: str = "<trajectory>",
                  line: int | None = None) -> Trajectory:
        names = [f.name for f in dataclasses.fields(cls)]
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING]
        for name in required:
            if name not in record:
                raise PoolError("missing trajectory field", source=source, line=line, field=name)
        unknown = sorted(set(record) - set(names))
        if unknown:
            raise PoolError(f"unknown trajectory fields {unknown}", source=source, line=line)
        if not isinstance(record["actions"], list) or not isinstance(record["events"], list):
            raise PoolError("'actions' and 'events' must be lists", source=source, line=line,
                            field="actions")
        return cls(**{k: record[k] for k in names if k in record})


def write_trajectories(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for traj in trajectories:
            f.write(json.dumps(traj.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
    return path


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PoolError(f"invalid JSON ({err.msg})", source=str(path), line=line_no) from None
            if not isinstance(record, dict):
                raise PoolError("a trajectory line must be a JSON object", source=str(path),
                                line=line_no)
            out.append(Trajectory.from_json(record, source=str(path), line=line_no))
    return out
