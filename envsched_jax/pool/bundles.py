"""Any directory of executable task bundles as a task pool (spec ``bundles:DIR``).

Every folder directly under ``DIR`` is one bundle in the Harbor / Terminal-Bench 2 layout or the
Terminal-Bench 1 layout (:func:`envsched_jax.forge.bundle.read_bundle`; TB1 bundles are converted
with :func:`~envsched_jax.forge.bundle.convert`, so the runtime sees one layout). Its tasks are
played by the terminal-episode runtime (:mod:`envsched_jax.envs.terminal`): a bash shell in a
container of the bundle's own image, scored by the bundle's tests. Several directories may be
given, separated by ``os.pathsep`` (``bundles:seeds:exports``).

How a bundle becomes pool records (decisions; the paper's pools are Python environments, so each
of these is ours):

- **One** :class:`~envsched_jax.pool.model.Environment` **per category** (``[metadata] category``
  of task.toml, ``category`` of task.yaml; the bundle's folder name when it has none). The graph's
  within-environment relation then links several tasks per environment (the built-in families
  give five: logs, convert, repair, script, config), and tasks of one category share a tool set
  and a kind of workspace, which is what an environment stands for in EnvSched. Its tools are one
  terminal tool, ``run_command(command: str)`` (:func:`run_command_schema`); no submit tool: the
  agent loop's plain answer (``chat_with_user``) ends the episode, as it does for the project's
  own pools. Its ``operations`` declare that tool ``state_change`` (a command changes the
  workspace), which is all the static extractor reads from them. ``class_source`` is empty: the
  environment is each task's container, not Python, and the Python sandboxes refuse the
  ``terminal`` semantics by name.
- **One** :class:`~envsched_jax.pool.model.Task` **per bundle**: ``task_id`` the folder name,
  ``instruction`` instruction.md (TB1: task.yaml's), ``initial_state`` the workspace's files as
  the bundle ships them (build-context path -> bytes, Dockerfile excluded; at most
  :data:`MAX_LISTED_FILES`), one :class:`~envsched_jax.pool.model.Check` stating the reward rule
  (its code, :data:`REWARD_CHECK_CODE`, reads the ``reward`` the runtime puts in the final state;
  the runtime applies the same rule itself, the code is never executed), and ``metadata`` with
  ``semantics = "terminal"``, the bundle's absolute path, layout and content hash (the runtime
  refuses a bundle changed on disk since loading), its category, tags, skills, timeouts and
  reward convention (``reward_file``: Harbor's ``/logs/verifier/reward.txt``; ``exit_status``:
  TB1's run-tests.sh, whose exit status the converted test.sh writes as the reward).
- **Reference actions**: the oracle as agent actions, one ``run_command``
  (:func:`reference_command`): the text of ``solution/solve.sh`` when that is the solution's only
  file and valid UTF-8 (the oracle runs it with cwd /app, and so does every command); otherwise a
  command that writes the solution's files under ``/solution`` (base64, so any bytes survive) and
  runs ``bash /solution/solve.sh`` in /app. The agent's own container may hold a /solution it wrote; the
  tests never see the agent's container, only a snapshot of its file system.

**The graph.** The static extractor (:mod:`envsched_jax.graph.extract`) takes a task's operations
from its reference actions' tool names and its environment's class source. Every bundle task has
the same single ``run_command`` call and no Python class, so under it all terminal tasks get the
same abstract description (``op_update type_entity_field <string>``, plus a temporal gate when
the instruction has dates) and ``S_abs`` cannot tell them apart: the cross-environment relation
would be arbitrary. :func:`skill_extractions` gives the counterpart for terminal tasks, derived
from each bundle's skill subgraph: one operation per skill, its appendix-E family chosen by the
skill's activity word (:data:`ACTIVITY_FAMILIES`: ``log_parsing`` -> lookup, ``csv_export`` ->
report, ``duplicate_removal`` -> delete ...; ``other`` when no word is known); required skills in
order, each depending on the one before (FORGE's skill chain), optional skills depending on the
first required one; no gates, and no reward groups (every bundle has the same single reward
check, which would only add one shared term to all). Its abstraction drops the skill names
(domain words), as appendix E drops tool names, so two tasks of different categories are close
when they need the same kinds of work in the same structure. ``build_graph`` uses it for every
terminal task by default (:func:`envsched_jax.graph.build.pool_views`), so the CLI, the training
loop and the experiments all build the same graph of a bundles pool.

Bad input is a :class:`~envsched_jax.pool.model.PoolError` naming the folder, the file and the
field: a path that is not a directory, a directory with no bundle folder, an entry that is a file
or a link (hidden entries, names starting with ``.``, are skipped:
:func:`~envsched_jax.forge.bundle.write_bundle` stages its writes there), a folder that is not a
bundle or a malformed one (the bundle reader's message), an empty category, and a name that two
directories both hold. All problems are
reported together; with ``drop_invalid`` the broken bundles are left out and listed in
``Pool.dropped``, as the JSON-lines loader does.
"""

from __future__ import annotations

import base64
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envsched_jax.forge.bundle import BundleError, TaskBundle, convert, read_bundle
from envsched_jax.graph.extract import (Extraction, OperationRecord, analyse_environment, extract,
                                        split_identifier)
from envsched_jax.pool.model import (Action, Check, Environment, Operation, Pool, PoolError, Task,
                                     assemble_pool)

TERMINAL_SEMANTICS = "terminal"
"""``Task.metadata["semantics"]`` of bundle tasks: the agent loop plays them in
:mod:`envsched_jax.envs.terminal`."""
RUN_COMMAND = "run_command"
TERMINAL_CLASS_NAME = "TerminalWorkspace"
MAX_LISTED_FILES = 200
"""Workspace files listed in a task's ``initial_state`` (the graph's initial-context view)."""
SPEC_PREFIX = "bundles:"

REWARD_CHECK_CODE = ('def check_func(final_state):\n'
                     '    return final_state.get("reward") == 1.0\n')
"""The check of every bundle task: the reward the tests gave (in the final state the terminal
runtime records) is 1."""

ACTIVITY_FAMILIES: dict[str, str] = {
    word: family for family, words in {
        "lookup": "parsing parse reading read search searching extraction filtering filter lookup "
                  "navigation inspection",
        "validate": "validation verification checking check detection constraints testing linting",
        "aggregate": "aggregation ranking grouping counting count summary statistics indexing "
                     "sorting tally",
        "report": "export output reporting report formatting listing logging printing",
        "update": "repair fixing fix normalization coercion mapping quoting folding handling "
                  "editing conversion transformation patching configuration",
        "create": "scripting generation creation writing building compilation",
        "link": "merging merge reconciliation linking joining migration",
        "delete": "removal deletion cleanup pruning",
    }.items() for word in words.split()}
"""A skill's activity word (read from the end of its name) -> its appendix-E operation family."""
_STATE_CHANGING_FAMILIES = frozenset({"update", "create", "link", "delete"})


def run_command_schema() -> dict[str, Any]:
    """The terminal tool as an OpenAI function schema (a fresh dict each call)."""
    return {"type": "function", "function": {
        "name": RUN_COMMAND,
        "description": ("Run a bash command in the task's Linux container, in /app, and return its "
                        "output (stdout and stderr together) and exit status. Each command has a "
                        "time limit and an output limit; the result says when either cut it. "
                        "There is no network. Answer in plain text, without a tool call, when "
                        "the task is done."),
        "parameters": {"type": "object",
                       "properties": {"command": {"type": "string",
                                                  "description": "The bash command line to run."}},
                       "required": ["command"]}}}


def is_terminal_task(task: Task) -> bool:
    return task.metadata.get("semantics") == TERMINAL_SEMANTICS


def task_bundle_path(task: Task) -> tuple[Path, str]:
    """(bundle folder, content hash at load time) of a bundle task; PoolError if the task is not one."""
    ref = task.metadata.get("bundle")
    if not (isinstance(ref, Mapping) and isinstance(ref.get("path"), str)
            and isinstance(ref.get("content_hash"), str)):
        raise PoolError(f"task {task.task_id!r} is not a bundle task (metadata 'bundle' needs a "
                        "string 'path' and 'content_hash')", field="metadata.bundle")
    return Path(ref["path"]), ref["content_hash"]


# ---------------------------------------------------------------------------------------------
# Loading


def _bundle_error(folder: Path, err: BundleError) -> PoolError:
    """The bundle reader's message, naming file and field, placed at the bundle's folder."""
    text = str(err)
    prefix = f"bundle {os.path.abspath(folder)}: "
    return PoolError(text[len(prefix):] if text.startswith(prefix) else text, source=str(folder))


def _bundle_folders(root: Path, problems: list[PoolError]) -> list[Path]:
    """The candidate bundle folders directly under ``root`` (sorted by name); anything else
    goes to ``problems``."""
    if not root.is_dir():
        problems.append(PoolError("not a directory (a bundle pool is a directory of bundle folders)",
                                  source=str(root)))
        return []
    folders = []
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            problems.append(PoolError("is a symbolic link; links are refused, since bundles come "
                                      "from untrusted sources", source=str(entry)))
        elif not entry.is_dir():
            problems.append(PoolError("is not a folder; every entry of a bundle directory must be "
                                      "a bundle folder", source=str(entry)))
        else:
            folders.append(entry)
    if not folders and not problems:
        problems.append(PoolError("holds no bundle folder (a folder with task.toml or task.yaml)",
                                  source=str(root)))
    return folders


def reference_command(bundle: TaskBundle) -> str:
    """The oracle of a Harbor-layout ``bundle`` as one shell command run in /app (module docstring)."""
    solution = {path: entry for path, entry in bundle.files.items() if path.startswith("solution/")}
    entry = bundle.files[bundle.solution_entry]
    if set(solution) == {bundle.solution_entry}:
        try:
            return entry.data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    lines = ["set -e"]
    for path in sorted(solution):
        target = "/" + path
        data = base64.b64encode(solution[path].data).decode("ascii")
        lines.append(f"mkdir -p {shlex.quote(os.path.dirname(target))}")
        lines.append(f"printf '%s' {shlex.quote(data)} | base64 -d > {shlex.quote(target)}")
        if solution[path].executable:
            lines.append(f"chmod +x {shlex.quote(target)}")
    lines.append(f"cd /app && bash {shlex.quote('/' + bundle.solution_entry)}")
    return "\n".join(lines) + "\n"


def _workspace_files(bundle: TaskBundle) -> dict[str, int]:
    dockerfile = bundle.dockerfile_path.removeprefix(bundle.build_context_dir + "/")
    sizes = {path: len(entry.data) for path, entry in sorted(bundle.build_context().items())
             if path != dockerfile}
    return dict(list(sizes.items())[:MAX_LISTED_FILES])


def _reward_check(bundle: TaskBundle, convention: str) -> Check:
    skills = bundle.skills
    rule = ("tests/run-tests.sh exits with status 0 (Terminal-Bench 1; the reward is 1 then)"
            if convention == "exit_status" else
            "tests/test.sh writes reward 1 to /logs/verifier/reward.txt")
    parts = [rule + "."]
    if skills.required:
        parts.append("Required skills: " + ", ".join(skills.required) + ".")
    if skills.optional:
        parts.append("Optional skills: " + ", ".join(skills.optional) + ".")
    return Check(" ".join(parts), REWARD_CHECK_CODE)


def _task_from_folder(folder: Path) -> Task:
    try:
        bundle = read_bundle(folder)
        harbor = convert(bundle, "harbor")
        skills, timeouts = harbor.skills, harbor.timeouts
    except BundleError as err:
        raise _bundle_error(folder, err) from None
    meta = harbor.metadata.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    category = meta.get("category")
    if category is not None and not category.strip():
        harbor_layout = bundle.layout == "harbor"
        raise PoolError("is empty; a category names the task's environment",
                        source=str(folder / ("task.toml" if harbor_layout else "task.yaml")),
                        field="[metadata].category" if harbor_layout else "category")
    convention = "exit_status" if bundle.layout == "tb1" else "reward_file"
    metadata: dict[str, Any] = {
        "semantics": TERMINAL_SEMANTICS,
        "bundle": {"path": str(folder.resolve()), "layout": bundle.layout,
                   "content_hash": bundle.content_hash()},
        "category": category or folder.name,
        "skills": {"required": list(skills.required), "optional": list(skills.optional)},
        "timeouts": {"agent_sec": timeouts.agent_sec, "verifier_sec": timeouts.verifier_sec},
        "reward_convention": convention,
        "tags": list(meta.get("tags", [])),
    }
    if "difficulty" in meta:
        metadata["difficulty"] = meta["difficulty"]
    try:
        return Task(task_id=bundle.name, env_id=metadata["category"], instruction=bundle.instruction,
                    initial_state={"files": _workspace_files(harbor)},
                    checks=(_reward_check(harbor, convention),),
                    reference_actions=(Action(RUN_COMMAND, {"command": reference_command(harbor)}),),
                    metadata=metadata)
    except PoolError as err:
        where = "instruction.md" if bundle.layout == "harbor" else "task.yaml"
        raise PoolError(err.reason, source=str(folder / where) if err.field == "instruction"
                        else str(folder), field=err.field) from None


def _environment(category: str, tasks: Sequence[Task]) -> Environment:
    skills = sorted({skill for t in tasks for key in ("required", "optional")
                     for skill in t.metadata["skills"][key]})
    return Environment(
        env_id=category, class_name=TERMINAL_CLASS_NAME,
        summary=(f"A bash shell in a Linux container built for the task (category {category!r}); "
                 "the workspace is /app and there is no network."),
        tools=(run_command_schema(),),
        operations=(Operation(RUN_COMMAND, "Run a bash command in the task's container.",
                              "state_change"),),
        class_source="",
        metadata={"semantics": TERMINAL_SEMANTICS, "category": category, "skills": skills})


def load_bundle_pool(directories: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                     drop_invalid: bool = False) -> Pool:
    """The pool of every bundle folder directly under ``directories`` (one path or several);
    see the module docstring for the records and for what is refused."""
    roots = ([Path(directories)] if isinstance(directories, (str, os.PathLike))
             else [Path(d) for d in directories])
    if not roots:
        raise PoolError("no bundle directory given", source=SPEC_PREFIX)
    problems: list[PoolError] = []
    tasks: list[Task] = []
    locations: list[dict[str, Any]] = []
    for root in roots:
        for folder in _bundle_folders(root, problems):
            try:
                tasks.append(_task_from_folder(folder))
            except PoolError as err:
                problems.append(err)
                continue
            locations.append({"source": str(folder)})
    categories = list(dict.fromkeys(t.env_id for t in tasks))
    environments = [_environment(c, [t for t in tasks if t.env_id == c]) for c in categories]
    name = SPEC_PREFIX + os.pathsep.join(str(r.resolve()) for r in roots)
    return assemble_pool(name, environments, tasks,
                         env_locations=[{"source": f"category {c!r}"} for c in categories],
                         task_locations=locations, problems=problems, drop_invalid=drop_invalid)


def load_bundle_spec(spec: str, *, drop_invalid: bool = False) -> Pool:
    """The pool of a ``bundles:DIR[:DIR...]`` spec."""
    paths = [p for p in spec[len(SPEC_PREFIX):].split(os.pathsep) if p]
    if not spec.startswith(SPEC_PREFIX) or not paths:
        raise PoolError(f"cannot parse pool spec {spec!r}; expected bundles:DIR (several "
                        f"directories separated by {os.pathsep!r})")
    return load_bundle_pool(paths, drop_invalid=drop_invalid)


# ---------------------------------------------------------------------------------------------
# The graph's operation description of terminal tasks


def skill_family(skill: str) -> str:
    """The appendix-E family of a skill: that of the last word of its name found in
    :data:`ACTIVITY_FAMILIES`, else ``other``."""
    for word in reversed(split_identifier(skill)):
        if word in ACTIVITY_FAMILIES:
            return ACTIVITY_FAMILIES[word]
    return "other"


def skill_extraction(task: Task) -> Extraction:
    """The operation description of a bundle task from its skill subgraph (module docstring)."""
    skills = task.metadata.get("skills") or {}
    required = list(skills.get("required", ()))
    optional = list(skills.get("optional", ()))
    operations = []
    for k, skill in enumerate(required + optional):
        family = skill_family(skill)
        if k < len(required):
            depends = (f"o{k - 1}",) if k else ()
        else:
            depends = ("o0",) if required else ()
        operations.append(OperationRecord(
            id=f"o{k}", family=family, tool=skill,
            lookup_kind="entity_list" if family == "lookup" else "none", arg_names=(), arg_types=(),
            depends_on=depends, state_changing=family in _STATE_CHANGING_FAMILIES))
    return Extraction(tuple(operations), (), (), ())


def skill_extractions(pool: Pool) -> list[Extraction] | None:
    """One extraction per task of ``pool`` for ``build_graph(..., extractions=...)``: the skill
    description for terminal tasks and the static extractor's for the others; None when the pool
    has no terminal task (the static extractor alone then gives the same graph)."""
    if not any(is_terminal_task(t) for t in pool.tasks):
        return None
    tools = {env.env_id: analyse_environment(env) for env in pool.environments}
    return [skill_extraction(t) if is_terminal_task(t)
            else extract(pool.environment(t.env_id), t, tools[t.env_id]) for t in pool.tasks]

