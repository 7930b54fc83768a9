"""The project's BFCL-v3 rewards against BFCL's own multi-turn checker, on the same action sequences.

For one task and one action sequence (turn-tagged :class:`~envsched_jax.pool.model.Action` s):

- :func:`official_valid` does what the installed ``bfcl_eval`` evaluation runner does with a
  function-calling model's multi-turn result (``eval_runner.multi_turn_runner``): a result whose
  number of turns differs from the ground truth's is force-terminated (invalid); each call is
  decoded as BFCL decodes a function-calling model's output (``convert_to_function_call``, one
  call per step) and the turns go to ``multi_turn_checker``, whose ``valid`` is the verdict.
  ``convert_to_function_call`` is taken from the installed ``bfcl_eval/model_handler/utils.py``
  by parsing that file and compiling just that function: the module itself cannot be imported
  without ``tree_sitter``, which the project does not install.
- :func:`project_reward` plays the same sequence through the episode runtime every sandbox runs
  (:func:`envsched_jax.envs.runtime.core.run_actions`, each user turn closed by
  ``chat_with_user`` as :func:`~envsched_jax.envs.episode.with_turn_ends` does).

They agree when ``valid == (reward == 1.0)``. Each comparison runs in a fresh process forked from
a server process that has imported ``bfcl_eval`` (and nothing of JAX): BFCL caches its instances
in module globals, and its long-context scenarios share module-level dicts that calls mutate, so a
comparison must not see what an earlier one did.

Action sequences (:data:`VARIANTS`; the choices inside one are drawn from a generator seeded by
the task id and variant name, so every run compares the same sequences): the ground truth; one
call removed; one argument of one call changed; an extra call of a query tool without required
parameters; the calls of two turns swapped; no call at all; an integral float argument sent as an
integer (``200.0`` -> ``200``: tool-calling models do this all the time); and, for ``miss_func``
tasks, a withheld tool called one turn before it is offered.

:data:`DOCUMENTED_DIFFERENCES` lists where the project disagrees with BFCL on purpose, by task id
and reason; anything else that disagrees is a conformance failure.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import multiprocessing
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envsched_jax.pool.model import Action, Environment, Pool, Task

MODEL_NAME = "envsched_conformance"
"""The model name the official checker's instances are cached under (one per process)."""

DOCUMENTED_DIFFERENCES: Mapping[str, str] = {
    "multi_turn_base_154": (
        "BFCL's data has 5 question turns and 6 ground-truth turns; BFCL's runner scores every "
        "result of it as force-terminated (invalid). The project pads the question with an empty "
        "turn so that the task is scoreable, and its ground truth scores 1.0."),
}
"""Task id -> why the project's verdict may differ from BFCL's on that task (any variant)."""


# --------------------------------------------------------------------------------------------
# Action sequences


def _tools(env: Environment) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in env.tools}


def _by_turn(actions: Iterable[Action]) -> tuple[Action, ...]:
    return tuple(sorted(actions, key=lambda a: a.turn))  # stable: order within a turn kept


def _drop_call(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    acts = list(task.reference_actions)
    if not acts:
        return None
    del acts[rng.randrange(len(acts))]
    return tuple(acts)


def _perturbed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "_x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {} if value else {"x": 1}
    return "x"


def _wrong_argument(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    acts = list(task.reference_actions)
    candidates = [i for i, a in enumerate(acts) if a.arguments]
    if not candidates:
        return None
    i = rng.choice(candidates)
    key = rng.choice(sorted(acts[i].arguments))
    args = dict(acts[i].arguments)
    args[key] = _perturbed(args[key])
    acts[i] = dataclasses.replace(acts[i], arguments=args)
    return tuple(acts)


_QUERY_PREFIXES = ("get_", "list_", "view_", "check_", "display_", "pwd", "ls", "show_")


def _extra_call(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    acts = list(task.reference_actions)
    turns = sorted({a.turn for a in acts})
    if not turns:
        return None
    withheld = task.metadata.get("withheld_tools", {})
    queries = sorted(name for name, fn in _tools(env).items()
                     if not fn["parameters"].get("required") and name.startswith(_QUERY_PREFIXES)
                     and name not in withheld)
    if not queries:
        return None
    turn = rng.choice(turns)
    position = rng.randrange(sum(a.turn <= turn for a in acts) + 1)
    position = max(position, sum(a.turn < turn for a in acts))  # inside that turn
    acts.insert(position, Action(rng.choice(queries), {}, turn=turn))
    return tuple(acts)


def _swap_turns(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    turns = sorted({a.turn for a in task.reference_actions})
    if len(turns) < 2:
        return None
    a, b = rng.sample(turns, 2)
    swap = {a: b, b: a}
    return _by_turn(dataclasses.replace(x, turn=swap.get(x.turn, x.turn))
                    for x in task.reference_actions)


def _nothing(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...]:
    return ()


def _int_for_float(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    acts = list(task.reference_actions)
    spots = [(i, k) for i, a in enumerate(acts) for k, v in sorted(a.arguments.items())
             if isinstance(v, float) and v.is_integer()]
    if not spots:
        return None
    i, key = rng.choice(spots)
    acts[i] = dataclasses.replace(acts[i], arguments={**acts[i].arguments,
                                                      key: int(acts[i].arguments[key])})
    return tuple(acts)


def _early_withheld(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...] | None:
    withheld = task.metadata.get("withheld_tools", {})
    acts = list(task.reference_actions)
    spots = [i for i, a in enumerate(acts) if withheld.get(a.name, 0) > 0]
    if not spots:
        return None
    i = spots[0]
    early = dataclasses.replace(acts[i], turn=withheld[acts[i].name] - 1)
    return _by_turn(acts[:i] + acts[i + 1:] + [early])


def _ground_truth(task: Task, env: Environment, rng: random.Random) -> tuple[Action, ...]:
    return tuple(task.reference_actions)


Variant = Callable[[Task, Environment, random.Random], "tuple[Action, ...] | None"]
VARIANTS: Mapping[str, Variant] = {
    "ground_truth": _ground_truth,
    "drop_call": _drop_call,
    "wrong_argument": _wrong_argument,
    "extra_call": _extra_call,
    "swap_turns": _swap_turns,
    "nothing": _nothing,
    "int_for_float": _int_for_float,
    "early_withheld": _early_withheld,
}
"""Variant name -> the action sequence it makes of a task (None: does not apply to the task)."""


def variant_actions(task: Task, env: Environment, variant: str) -> tuple[Action, ...] | None:
    return VARIANTS[variant](task, env, random.Random(f"{task.task_id}:{variant}"))


# --------------------------------------------------------------------------------------------
# The two verdicts


def raw_records(data_dir: Path, category: str) -> dict[str, tuple[dict, list]]:
    """Task id -> (BFCL's question record, BFCL's ground truth) as the files hold them."""
    from envsched_jax.pool.jsonl import read_json_objects
    from envsched_jax.pool.model import PoolValidationErrors

    def read(path: Path) -> list[dict]:
        problems: list = []
        records = [r for _, r in read_json_objects(path, problems)]
        if problems:
            raise PoolValidationErrors(problems)
        return records
    name = f"BFCL_v3_multi_turn_{category}.json"
    answers = {r["id"]: r["ground_truth"] for r in read(data_dir / "possible_answer" / name)}
    return {r["id"]: (r, answers[r["id"]]) for r in read(data_dir / name)}


def _official_decoder() -> Callable[[Any], list[str]]:
    """``convert_to_function_call`` of the installed ``bfcl_eval`` (see the module docstring)."""
    import bfcl_eval

    path = Path(bfcl_eval.__file__).parent / "model_handler" / "utils.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    [node] = [n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "convert_to_function_call"]
    namespace: dict[str, Any] = {"json": json}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["convert_to_function_call"]


def official_valid(entry: Mapping[str, Any], ground_truth: Sequence[Sequence[str]],
                   actions: Sequence[Action]) -> tuple[bool, str | None]:
    """BFCL's verdict on ``actions`` for the task of ``entry`` (its question record): ``(valid,
    error_type)``. Call it once per process (see the module docstring)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    decode = _official_decoder()
    turns: list[list[list[str]]] = [[] for _ in entry["question"]]
    for action in actions:
        if action.turn < len(turns):  # a turn the question lacks cannot hold a model response
            turns[action.turn].append(decode([{action.name: dict(action.arguments)}]))
    if len(turns) != len(ground_truth):
        return False, "multi_turn:force_terminated"
    category = entry["id"].rsplit("_", 1)[0]
    result = multi_turn_checker(turns, [list(t) for t in ground_truth], dict(entry), category,
                                MODEL_NAME)
    return bool(result["valid"]), result.get("error_type")


def project_reward(env: Environment, task: Task, actions: Sequence[Action]) -> float:
    """The reward the episode runtime gives ``actions``."""
    from envsched_jax.pool.bfcl import run_in_runtime

    return float(run_in_runtime(env, task, actions)["score"]["reward"])


@dataclasses.dataclass(frozen=True)
class Comparison:
    task_id: str
    category: str
    variant: str
    official_valid: bool
    official_error: str | None
    project_reward: float

    @property
    def agree(self) -> bool:
        return self.official_valid == (self.project_reward == 1.0)

    @property
    def documented(self) -> str | None:
        return DOCUMENTED_DIFFERENCES.get(self.task_id)


def _compare(job: tuple) -> Comparison:
    env, task, variant, actions, entry, ground_truth = job
    valid, error = official_valid(entry, ground_truth, actions)
    return Comparison(task.task_id, task.metadata["category"], variant, valid, error,
                      project_reward(env, task, actions))


_PRELOAD = [
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
    *(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{m}" for m in (
        "gorilla_file_system", "math_api", "message_api", "posting_api", "ticket_api",
        "trading_bot", "travel_booking", "vehicle_control", "long_context")),
    "envsched_jax.envs.runtime.core",
    "envsched_jax.envs.episode",
    "envsched_jax.pool.bfcl_conformance",
]


def compare(pool: Pool, task_ids: Sequence[str] | None = None,
            variants: Sequence[str] = tuple(VARIANTS), *, processes: int = 2,
            data_dir: str | Path | None = None,
            progress: Callable[[Iterable, int], Iterable] | None = None) -> list[Comparison]:
    """Every applicable (task, variant) of ``pool`` (``task_ids``: a subset), each compared in a
    fresh process; results in task, then variant order. ``progress(results, total)`` wraps the
    iterator of results (e.g. ``rich.progress.track``)."""
    from envsched_jax.pool.bfcl import default_data_dir

    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    tasks = [pool.tasks[pool.task_index(t)] for t in task_ids] if task_ids else list(pool.tasks)
    raw: dict[str, tuple[dict, list]] = {}
    for category in sorted({t.metadata["category"] for t in tasks}):
        raw.update(raw_records(data_dir, category))
    jobs = []
    for task in tasks:
        env = pool.environment(task.env_id)
        for variant in variants:
            actions = variant_actions(task, env, variant)
            if actions is not None:
                jobs.append((env, task, variant, actions, *raw[task.task_id]))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    with ctx.Pool(processes, maxtasksperchild=1) as workers:
        results = workers.imap(_compare, jobs, chunksize=1)
        return list(progress(results, len(jobs)) if progress else results)


def summary(results: Sequence[Comparison]) -> dict[str, Any]:
    """Agreement counts: overall, per variant, and the disagreements (documented or not)."""
    per_variant: dict[str, dict[str, int]] = {}
    for r in results:
        v = per_variant.setdefault(r.variant, {"runs": 0, "agree": 0})
        v["runs"] += 1
        v["agree"] += r.agree
    disagree = [r for r in results if not r.agree]
    return {
        "runs": len(results),
        "agree": sum(r.agree for r in results),
        "per_variant": per_variant,
        "documented": [dataclasses.asdict(r) for r in disagree if r.documented],
        "undocumented": [dataclasses.asdict(r) for r in disagree if not r.documented],
    }
