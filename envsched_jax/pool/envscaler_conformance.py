"""EnvScaler's own runner as the oracle for the ``envscaler`` episode semantics: probe tasks, one
per rule, and a driver that plays them through EnvScaler's code.

Each :class:`Probe` is a tiny environment, one task and a fixed sequence of agent actions that
isolates one rule of EnvScaler's RL environment (``rl/roll/pipeline/agentic/env/envscaler_env`` in
the RUC-NLPIR/EnvScaler repository, commit ``87e6673``), with

- ``envscaler``: the reward EnvScaler's runner gives it, and ``how`` it was established: ``ran``
  (:func:`envscaler_rewards` on that commit: ``python experiments/envscaler_conformance.py
  --checkout PATH``) or ``read`` (from the code alone);
- ``where``: the file and function of EnvScaler's code the rule lives in;
- ``before``: the project's reward before the ``envscaler`` semantics existed (commit
  ``a077c21``, the same probe files through its loader and runtime, in-process and in bubblewrap
  alike; None where that loader refused the task). That loader had no conversational mode: a
  conversational probe's ``before`` is its task marked as a simulated-user task, whose episode
  the project scored when the actions ran out.

:func:`write_probe_files` writes the probes in EnvScaler's file format as its repository encodes
it (JSON objects, not strings), one pair of files per mode, so that the project's loader reads
exactly what EnvScaler's runner reads. :func:`project_trajectory` plays a probe in any sandbox.

:func:`envscaler_rewards` runs EnvScaler's runner on a checkout of its repository, looped as its
training manager loops it (``env_manager/traj_env_manager_for_env_scaler.py``,
``TrajEnvManager``): one ``env.step`` per agent message, given as the text a model writes (a
``<tool_call>`` block, or plain text for a ``chat_with_user`` with ``content``), the step rewards
summed, the episode over when the environment says ``terminated`` or after ``max_steps`` steps
(the recipe's ``max_actions_per_traj``, 40). Nothing of EnvScaler is copied here: its modules are
imported from the checkout. Two of their imports are not needed by the runner and are replaced
while it runs: the ``gem`` package (only its ``Env`` base class is used: ``reset(seed)``) when it
is not installed, and the conversational user's model client, whose replies come from the probe's
``user_replies`` instead of an LLM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from envsched_jax.pool.model import Action, Pool

PACKAGE = "rl/roll/pipeline/agentic/env/envscaler_env"
"""EnvScaler's RL environment package, relative to a checkout of its repository."""
ENVSCALER_COMMIT = "87e667397abacf274858c0964796beb8f984aafe"
"""The EnvScaler commit whose runner gave the probes' ``envscaler`` rewards."""
STOP = "###STOP###"
TASK_DONE = "Task Completed"
"""What EnvScaler's system prompt tells the agent to answer when done (its runner warns on any
other ``chat_with_user`` text, and ends the episode all the same)."""
MAX_STEPS = 40
"""EnvScaler's RL recipe: at most 40 actions per trajectory
(``rl/example/env_scaler/only_non_conv_qwen3_8gpu.yaml``, ``max_actions_per_traj``)."""

_BASE = "rl/roll/pipeline/agentic/env/envscaler_env/base_env.py"
_UTIL = "rl/roll/pipeline/agentic/env/envscaler_env/utils/env_util.py"
_MANAGER = "rl/roll/pipeline/agentic/env_manager/traj_env_manager_for_env_scaler.py"

DESK_SOURCE = '''
class Desk:
    """A help desk: tickets by id, and an index of the same ticket dicts by owner."""

    def __init__(self, init_config):
        self.tickets = init_config.get("tickets", {})
        self.by_owner = {}
        for ticket in self.tickets.values():
            self.by_owner.setdefault(ticket["owner"], []).append(ticket)
        self.log = []

    def count_open(self):
        return {"success": True, "data": sum(t["status"] == "open" for t in self.tickets.values())}

    def close_ticket(self, ticket_id):
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            return {"success": False, "error": f"no ticket {ticket_id}"}
        ticket["status"] = "closed"
        self.log.append(ticket_id)
        return {"success": True, "data": ticket}

    def close_tickets_of(self, owner):
        tickets = self.by_owner.get(owner, [])
        for ticket in tickets:
            ticket["status"] = "closed"
        return {"success": True, "data": len(tickets)}

    def _force_close(self, ticket_id):
        self.tickets[ticket_id]["status"] = "closed"
        return {"success": True}

    def explode(self):
        raise RuntimeError("the desk is on fire")
'''
"""The probes' environment class (EnvScaler's convention: ``__init__(self, init_config)``)."""

DESK_TOOLS = tuple(
    {"type": "function", "function": {"name": name, "description": text,
                                      "parameters": {"type": "object", "properties": props,
                                                     "required": list(props)}}}
    for name, text, props in (
        ("count_open", "Count open tickets.", {}),
        ("close_ticket", "Close one ticket.", {"ticket_id": {"type": "string"}}),
        ("close_tickets_of", "Close every ticket of an owner.", {"owner": {"type": "string"}}),
        ("explode", "Break the desk.", {})))
DESK_STATE = {"tickets": {"T1": {"owner": "ana", "status": "open"},
                          "T2": {"owner": "bo", "status": "open"}}}

T1_CLOSED = "def check_func(final_state):\n    return final_state['tickets']['T1']['status'] == 'closed'\n"


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    """A tool-call action."""
    return {"name": name, "arguments": arguments}


def chat(**arguments: Any) -> dict[str, Any]:
    """A ``chat_with_user`` action (``content=...`` is the form EnvScaler accepts)."""
    return {"name": "chat_with_user", "arguments": arguments}


DONE = chat(content=TASK_DONE)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe task (see the module docstring). ``env_overrides`` changes the environment
    record (a value of None removes the field); ``user_replies``: conversational probes, the
    simulated user's raw replies in order (its opening, then one per ``chat_with_user``)."""

    name: str
    rule: str
    where: str
    actions: tuple[dict[str, Any], ...]
    checks: tuple[str, ...]
    envscaler: float
    how: Literal["ran", "read"]
    before: float | None
    init_config: Mapping[str, Any] = dataclasses.field(default_factory=lambda: DESK_STATE)
    max_steps: int = MAX_STEPS
    mode: Literal["non_conversational", "conversational"] = "non_conversational"
    user_replies: tuple[str, ...] = ()
    env_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        stops = [k for k, r in enumerate(self.user_replies) if STOP in r]
        if stops and stops != [len(self.user_replies) - 1]:
            raise ValueError(f"probe {self.name!r}: the user may stop only in its last reply")
        if self.mode == "conversational" and len(self.user_replies) != 1 + sum(
                a["name"] == "chat_with_user" for a in self.actions):
            raise ValueError(f"probe {self.name!r}: a conversational probe needs one user reply "
                             "to open and one per chat_with_user")

    @property
    def env_id(self) -> str:
        return f"probe_{self.name}"

    @property
    def task_id(self) -> str:
        return f"probe_{self.name}-task_0"

    @property
    def user_stops(self) -> bool:
        """Whether the simulated user ends the conversation after the last action."""
        return bool(self.user_replies) and STOP in self.user_replies[-1]


def _steps_to_limit(last: Sequence[dict[str, Any]], total: int) -> tuple[dict[str, Any], ...]:
    """``total`` actions: queries, then ``last``."""
    return (tool("count_open"),) * (total - len(last)) + tuple(last)


PROBES: tuple[Probe, ...] = (
    Probe("setup_identity",
          "set-up: the attributes are the objects the constructor indexed, so a tool working "
          "through that index changes the state",
          f"{_UTIL}: init_env_instance", (tool("close_tickets_of", owner="ana"), DONE),
          (T1_CLOSED,), envscaler=1.0, how="ran", before=0.0),
    Probe("private_method",
          "action validity: any attribute name is an action (hasattr), a private method too",
          f"{_BASE}: EnvScalerBaseEnv.check_vaild_action", (tool("_force_close", ticket_id="T1"), DONE),
          (T1_CLOSED,), envscaler=1.0, how="ran", before=0.0),
    Probe("plain_attribute",
          "action validity: a plain attribute is a valid name; calling it raises, which ends the "
          "episode with reward 0",
          f"{_BASE}: EnvScalerBaseEnv.check_vaild_action and EnvScalerBaseEnv.step",
          (tool("tickets"), tool("close_ticket", ticket_id="T1"), DONE),
          (T1_CLOSED,), envscaler=0.0, how="ran", before=1.0),
    Probe("chat_needs_content",
          "action validity: chat_with_user without a 'content' argument is an invalid action and "
          "does not end the episode",
          f"{_BASE}: EnvScalerBaseEnv.check_vaild_action",
          (chat(message="done"), tool("close_ticket", ticket_id="T1"), DONE),
          (T1_CLOSED,), envscaler=1.0, how="ran", before=0.0),
    Probe("check_returns_non_bool",
          "checks: a check that returns anything but a bool fails",
          f"{_UTIL}: run_check_function",
          (tool("close_ticket", ticket_id="T1"), DONE),
          (T1_CLOSED, "def check_func(final_state):\n"
                      "    return int(final_state['tickets']['T1']['status'] == 'closed')\n"),
          envscaler=0.5, how="ran", before=1.0),
    Probe("shared_final_state",
          "checks: every check gets the same final_state object, so one check's change is seen "
          "by the next",
          f"{_BASE}: EnvScalerBaseEnv.calculate_reward",
          (tool("close_ticket", ticket_id="T1"), DONE),
          ("def check_func(final_state):\n    final_state['log'].append('T2')\n"
           "    return final_state['tickets']['T1']['status'] == 'closed'\n",
           "def check_func(final_state):\n    return 'T2' in final_state['log']\n"),
          envscaler=1.0, how="ran", before=0.5),
    Probe("step_limit",
          "reward: the step limit (40) ends the episode unscored, whatever the state",
          f"{_MANAGER}: TrajEnvManager.step and formulate_rollouts; {_BASE}: EnvScalerBaseEnv.step",
          _steps_to_limit([tool("close_ticket", ticket_id="T1"), DONE], MAX_STEPS + 1),
          (T1_CLOSED,), envscaler=0.0, how="ran", before=1.0),
    Probe("chat_at_step_limit",
          "reward (control): a chat_with_user at the 40th step still ends and scores the episode",
          f"{_MANAGER}: TrajEnvManager.step",
          _steps_to_limit([tool("close_ticket", ticket_id="T1"), DONE], MAX_STEPS),
          (T1_CLOSED,), envscaler=1.0, how="ran", before=1.0),
    Probe("actions_exhausted",
          "reward: an episode the agent stops acting in, without chat_with_user, is unscored",
          f"{_BASE}: EnvScalerBaseEnv.step; {_MANAGER}: TrajEnvManager.formulate_rollouts",
          (tool("close_ticket", ticket_id="T1"),), (T1_CLOSED,), envscaler=0.0, how="ran",
          before=1.0),
    Probe("tool_error",
          "reward (control): a tool that raises ends the episode with reward 0",
          f"{_BASE}: EnvScalerBaseEnv.step",
          (tool("close_ticket", ticket_id="T1"), tool("explode"), DONE), (T1_CLOSED,),
          envscaler=0.0, how="ran", before=0.0),
    Probe("empty_check_func",
          "loader: an empty check_func (EnvScaler's generator writes one when it gives up) "
          "counts 0; the task is kept",
          f"{_UTIL}: run_check_function; scen_generator/task_check_util/gen_check_func.py: "
          "gen_check_func", (tool("close_ticket", ticket_id="T1"), DONE), (T1_CLOSED, ""),
          envscaler=0.5, how="ran", before=None),
    Probe("no_environment_summary",
          "loader: environment_summary is never read by the runner, so a record without it runs",
          f"{_BASE}: EnvScalerBaseEnv.reset and construct_env_introduction",
          (tool("close_ticket", ticket_id="T1"), DONE), (T1_CLOSED,), envscaler=1.0, how="ran",
          before=None, env_overrides={"environment_summary": None}),
    Probe("snapshot_keys",
          "state: only keys that start and end with '__' are left out of the snapshot",
          f"{_UTIL}: get_state_info", (tool("close_ticket", ticket_id="T1"), DONE),
          ("def check_func(final_state):\n    return final_state['__audit'] == ['seed']\n",
           "def check_func(final_state):\n    return '__meta__' not in final_state\n"),
          envscaler=1.0, how="ran", before=0.5,
          init_config={**DESK_STATE, "__audit": ["seed"], "__meta__": {"v": 1}}),
    Probe("conversation_user_stop",
          "conversational: the user's ###STOP### after a chat_with_user ends and scores the "
          "episode",
          "rl/roll/pipeline/agentic/env/envscaler_env/rl_conv_env.py: "
          "EnvScalerConvRLEnv.is_observation_terminated",
          (tool("close_ticket", ticket_id="T1"), chat(content="Ticket T1 is closed.")),
          (T1_CLOSED,), envscaler=1.0, how="ran", before=1.0, mode="conversational",
          user_replies=("# Thought: ask for it\n# Reply: Please close ticket T1.", STOP)),
    Probe("conversation_no_stop",
          "conversational: without the user's stop the episode is unscored",
          "rl/roll/pipeline/agentic/env/envscaler_env/rl_conv_env.py: "
          "EnvScalerConvRLEnv.is_observation_terminated",
          (tool("close_ticket", ticket_id="T1"), chat(content="Ticket T1 is closed.")),
          (T1_CLOSED,), envscaler=0.0, how="ran", before=1.0, mode="conversational",
          user_replies=("# Thought: ask for it\n# Reply: Please close ticket T1.",
                        "# Thought: check\n# Reply: Is it really closed?")),
)
"""The probe tasks, one per rule of the ``envscaler`` semantics."""


# --------------------------------------------------------------------------------------------
# EnvScaler's file format


def environment_record(probe: Probe) -> dict[str, Any]:
    """The probe's environment record, as EnvScaler's environment file holds it."""
    record = {"env_id": probe.env_id, "environment_summary": "A help desk.",
              "environment_introduction": "A help desk with tickets.",
              "state_space_definition": [{"entity": "Ticket", "attributes": "owner, status",
                                          "description": "a ticket"}],
              "constraints_rules": ["Only existing tickets can be closed."],
              "operation_list": [{"operation_name": t["function"]["name"],
                                  "operation_description": t["function"]["description"],
                                  "operation_type": "query" if t["function"]["name"] == "count_open"
                                  else "state_change"} for t in DESK_TOOLS],
              "env_class_name": "Desk", "env_class_code": DESK_SOURCE,
              "env_class_def": "class Desk: ...", "env_func_details": {},
              "tools": [dict(t) for t in DESK_TOOLS]}
    for key, value in probe.env_overrides.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def task_record(probe: Probe) -> dict[str, Any]:
    """The probe's task record, as EnvScaler's scenario file holds it."""
    return {"env_id": probe.env_id, "env_class_name": "Desk", "task_id": probe.task_id,
            "init_config": json.loads(json.dumps(probe.init_config)),
            "task": "Close ticket T1 of Ana.",
            "checklist_with_func": [{"check_item": f"check {k}", "check_func": code}
                                    for k, code in enumerate(probe.checks)]}


def write_probe_files(folder: str | Path, probes: Sequence[Probe] = PROBES,
                      mode: str = "non_conversational") -> tuple[Path, Path]:
    """Write the probes of ``mode`` as EnvScaler's environment file (a JSON object keyed by
    ``env_id``) and scenario file (a JSON list); returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in probes if p.mode == mode]
    env_file, task_file = folder / f"{mode}_env_metadata.json", folder / f"{mode}_scenarios.json"
    env_file.write_text(json.dumps({p.env_id: environment_record(p) for p in chosen}, indent=1))
    task_file.write_text(json.dumps([task_record(p) for p in chosen], indent=1))
    return env_file, task_file


def probe_pool(folder: str | Path, probes: Sequence[Probe] = PROBES,
               mode: str = "non_conversational", **options: Any) -> Pool:
    """The probes of ``mode`` through the project's loader (``options``:
    :func:`~envsched_jax.pool.envscaler.load_envscaler_pool`'s)."""
    from envsched_jax.pool.envscaler import load_envscaler_pool

    return load_envscaler_pool(*write_probe_files(folder, probes, mode), mode=mode, **options)


def project_trajectory(workers, pool: Pool, probe: Probe):
    """Play ``probe`` through the project's runtime in ``workers``' sandbox (its actions, its
    step limit, and the simulated user's stop where it stops)."""
    from envsched_jax.envs.episode import run_actions

    task = pool.tasks[pool.task_index(probe.task_id)]
    return run_actions(workers, pool.environment(task.env_id), task,
                       [Action(a["name"], a["arguments"]) for a in probe.actions],
                       max_steps=probe.max_steps, user_stop=probe.user_stops)


# --------------------------------------------------------------------------------------------
# EnvScaler's runner


def model_text(action: Mapping[str, Any]) -> str:
    """What a model writes for ``action`` in EnvScaler's prompt format: plain text for a
    ``chat_with_user`` whose only argument is ``content``, else a ``<tool_call>`` block."""
    if action["name"] == "chat_with_user" and set(action["arguments"]) == {"content"}:
        return action["arguments"]["content"]
    call = {"name": action["name"], "arguments": action["arguments"]}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@dataclasses.dataclass(frozen=True)
class RunnerResult:
    """EnvScaler's outcome of one probe: the summed reward and the observations it showed."""

    reward: float
    observations: tuple[Mapping[str, str], ...]
    terminated: bool


@contextlib.contextmanager
def _envscaler_modules(checkout: Path, replies: list[str]) -> Iterator[types.ModuleType]:
    """EnvScaler's environment package imported from ``checkout`` (its ``__init__`` is not run:
    it imports the conversational user's model client), with the stand-ins the module docstring
    names; everything is removed from ``sys.modules`` afterwards."""
    package_dir = checkout / PACKAGE
    if not (package_dir / "base_env.py").is_file():
        raise FileNotFoundError(f"{checkout} is not a checkout of EnvScaler: no {PACKAGE}/base_env.py")
    added = []

    def register(name: str, module: types.ModuleType) -> None:
        sys.modules[name] = module
        added.append(name)

    try:
        importlib.import_module("gem")
    except ImportError:
        gem = types.ModuleType("gem")

        class Env:
            def reset(self, seed=None):
                return None

        gem.Env = Env
        register("gem", gem)
    package = types.ModuleType("envscaler_env")
    package.__path__ = [str(package_dir)]
    register("envscaler_env", package)
    utils = types.ModuleType("envscaler_env.utils")
    utils.__path__ = [str(package_dir / "utils")]
    register("envscaler_env.utils", utils)
    client = types.ModuleType("envscaler_env.utils.user_llm_inference")
    client.llm_inference = lambda model, messages, provider: replies.pop(0)
    register("envscaler_env.utils.user_llm_inference", client)
    try:
        for name in ("envscaler_env.base_env", "envscaler_env.rl_non_conv_env",
                     "envscaler_env.rl_conv_env"):
            register(name, importlib.import_module(name))
        yield package
    finally:
        for name in [n for n in sys.modules if n == "envscaler_env" or n.startswith("envscaler_env.")]:
            sys.modules.pop(name, None)
        for name in added:
            sys.modules.pop(name, None)


def run_envscaler_probe(checkout: str | Path, probe: Probe, folder: str | Path) -> RunnerResult:
    """Play ``probe`` through EnvScaler's runner from ``checkout`` (files written to ``folder``),
    looped as its training manager loops it (see the module docstring)."""
    env_file, task_file = write_probe_files(folder, [probe], probe.mode)
    replies = list(probe.user_replies)
    with _envscaler_modules(Path(checkout), replies), contextlib.redirect_stdout(io.StringIO()):
        if probe.mode == "conversational":
            cls = sys.modules["envscaler_env.rl_conv_env"].EnvScalerConvRLEnv
            env = cls(mode="train", user_model="scripted", provider="scripted",
                      env_items_path=str(env_file), task_items_path=str(task_file))
        else:
            cls = sys.modules["envscaler_env.rl_non_conv_env"].EnvScalerNonConvRLEnv
            env = cls(mode="train", env_items_path=str(env_file), task_items_path=str(task_file))
        env.reset(task_index=0)
        total, steps, terminated, observations = 0.0, 0, False, []
        for action in probe.actions:
            observation, reward, terminated, _, _ = env.step(action=model_text(action))
            observations.append({"role": observation["type"], "content": observation["content"]})
            total += reward
            steps += 1
            if terminated or steps >= probe.max_steps:
                break
    return RunnerResult(total, tuple(observations), bool(terminated))


def envscaler_rewards(checkout: str | Path, folder: str | Path,
                      probes: Sequence[Probe] = PROBES) -> dict[str, RunnerResult]:
    """EnvScaler's outcome of every probe (by name), each in a fresh environment object."""
    return {p.name: run_envscaler_probe(checkout, p, Path(folder) / p.name) for p in probes}


def same_text(envscaler: Mapping[str, str], project: Mapping[str, str] | None) -> bool:
    """Whether the project's message for a step is EnvScaler's observation: equal role and text,
    except that of a traceback only the first line and the exception (the last line) are
    compared (EnvScaler's also shows its runner's own frame and file paths)."""
    if project is None or envscaler["role"] != project["role"]:
        return False
    a, b = envscaler["content"], project["content"]
    if a.startswith("Error: <Exception>\n") and b.startswith("Error: <Exception>\n"):
        return a.strip().splitlines()[-1] == b.strip().splitlines()[-1]
    return a == b


def texts_agree(probe: Probe, envscaler: Sequence[Mapping[str, str]],
                shown: Sequence[Mapping[str, str] | None]) -> bool:
    """Whether the project showed the policy EnvScaler's observation at every step
    (:func:`same_text`). In a conversational probe the observation of a ``chat_with_user`` is the
    simulated user's reply, which the agent loop shows (not the runtime): those steps are left
    out."""
    if len(envscaler) != len(shown):
        return False
    return all(same_text(e, s) for a, e, s in zip(probe.actions, envscaler, shown)
               if not (probe.mode == "conversational" and a["name"] == "chat_with_user"))
