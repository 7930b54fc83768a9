"""Workspaces as a pool type: episodes with file tools, rubric checks as verifiers.

:func:`workspace_pool` turns :class:`~envsched_jax.rethink.workspace.Workspace` records into a
:class:`~envsched_jax.pool.model.Pool`, so the scheduler (its graph reads the request, the tools,
the checks), the sandboxes and the learner take workspaces like any other pool.

Choices (the paper does not map its environments onto a scheduler's nodes):

- **One environment per parent task**, one task per workspace. Variants of a parent (different
  draws, evolved versions) share an environment: EnvSched's within-environment relation then
  links the variants of a task, and its coverage half spreads a batch over parents.
- The environment's class is :class:`~envsched_jax.rethink.file_tools.FileWorkspace` (its module
  source is the ``class_source``; the same class object is the ``trusted_class`` for the
  in-process sandbox, since the project wrote it). The files enter through the task's
  ``initial_state`` (text, or ``None`` for images and binary files, which the tools report but
  cannot read).
- The rubric checks are the task's checks, run by the sandbox's check runner like every pool's
  (a check that raises counts 0 with its error recorded); the reward is the rubric pass rate.
- An episode ends when the agent calls ``chat_with_user`` (the project's convention) or runs out
  of actions; the answer is whatever ``submit_answer`` recorded last.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from envsched_jax.pool.model import Environment, Pool, Task
from envsched_jax.rethink import file_tools
from envsched_jax.rethink.workspace import Workspace, WorkspaceError

_STRING = {"type": "string"}
_INT = {"type": "integer"}


def _tool(name: str, description: str, properties: dict, required: Sequence[str] = ()) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(required)}}}


TOOLS = (
    _tool("list_files", "List the workspace's files (path, kind, modification time, size) under a directory.",
          {"directory": {**_STRING, "description": "a directory prefix; empty for every file"}}),
    _tool("read_file", "Read lines of a text file (images and binary files cannot be read).",
          {"path": _STRING, "start_line": _INT, "max_lines": _INT}, ("path",)),
    _tool("search_files", "Case-insensitive substring search over the text files.",
          {"query": _STRING, "max_results": _INT}, ("query",)),
    _tool("write_file", "Write an output file under output/ (source files cannot be changed).",
          {"path": _STRING, "content": _STRING}, ("path", "content")),
    _tool("submit_answer", "Submit the task's outcome as a JSON object; a later call replaces it.",
          {"answer": {"type": "object"}}, ("answer",)),
)
LAYER_TOOLS = (
    _tool("list_collections", "List the Collection Map: collections with their themes and member paths.", {}),
    _tool("read_card", "Read a collection's card (themes, contents, representative evidence, sources).",
          {"collection_id": _STRING}, ("collection_id",)),
    _tool("file_history", "The Event Log's synthetic sessions touching a file (quotes are verbatim).",
          {"path": _STRING}, ("path",)),
)
"""The tools of a prepared environment (its Collection Map and Event Log), added to :data:`TOOLS`."""


def environment_id(workspace: Workspace, prepared: bool = False) -> str:
    """The environment of a workspace: its parent task (the workspace id when it has none);
    prepared workspaces (with a Collection Map and Event Log) are a separate environment, since
    they have more tools."""
    return f"workspace{'+prepared' if prepared else ''}:{workspace.parent_task or workspace.workspace_id}"


def workspace_environment(env_id: str, summary: str, prepared: bool = False) -> Environment:
    return Environment(
        env_id=env_id, class_name="FileWorkspace", summary=summary, tools=TOOLS + (LAYER_TOOLS if prepared else ()),
        class_source=inspect.getsource(file_tools), trusted_class=file_tools.FileWorkspace,
        introduction="A folder of documents, records and notes; some are outdated, withdrawn or misleading.",
        metadata={"kind": "rethink_workspace"})


def initial_state(workspace: Workspace, layer=None) -> dict:
    """The episode's initial state (:mod:`.file_tools`): files with their text (None when
    unreadable), kind, time and size; no answer, nothing written, nothing read; with ``layer``
    (a :class:`~envsched_jax.rethink.event_log.PreparedLayer` of this workspace) its collections
    and public events."""
    if layer is not None and layer.event_log.workspace_id != workspace.workspace_id:
        raise WorkspaceError(f"the prepared layer belongs to {layer.event_log.workspace_id!r}",
                             source=f"workspace {workspace.workspace_id!r}")
    return {
        "files": {f.path: {"text": f.text, "kind": f.kind, "modified": f.modified, "size": len(f.data)}
                  for f in workspace.files},
        "written": {}, "answer": None, "reads": [],
        "collections": None if layer is None else layer.collection_map.to_json()["collections"],
        "events": None if layer is None else layer.event_log.to_json()["events"],
    }


def workspace_task(workspace: Workspace, layer=None) -> Task:
    """The task of one workspace (with its prepared ``layer``, if given): its request, files,
    rubric; labels stay out of the task (the agent must not see them) and only ``workspace_id``,
    parent and size class go to metadata."""
    return Task(task_id=workspace.workspace_id, env_id=environment_id(workspace, layer is not None),
                instruction=workspace.request, initial_state=initial_state(workspace, layer), checks=workspace.rubric,
                metadata={"semantics": "project", "parent_task": workspace.parent_task,
                          "size_class": workspace.size_class, "content_hash": workspace.content_hash()})


def workspace_pool(workspaces: Sequence[Workspace], *, name: str = "rethink-workspaces",
                   layers: Mapping | None = None) -> Pool:
    """A pool of workspaces (module docstring); ``layers`` maps workspace ids to their prepared
    layers (those workspaces get the layer tools). Duplicate workspace ids are an error naming
    the id."""
    if not workspaces:
        raise WorkspaceError("no workspaces to make a pool of", source=name)
    seen = set()
    envs: dict[str, Environment] = {}
    tasks = []
    for ws in workspaces:
        if ws.workspace_id in seen:
            raise WorkspaceError("duplicate workspace id in the pool", source=f"workspace {ws.workspace_id!r}")
        seen.add(ws.workspace_id)
        layer = (layers or {}).get(ws.workspace_id)
        env_id = environment_id(ws, layer is not None)
        envs.setdefault(env_id, workspace_environment(
            env_id, f"File workspace of task {ws.parent_task or ws.workspace_id!r}: {ws.request[:200]}",
            prepared=layer is not None))
        tasks.append(workspace_task(ws, layer))
    return Pool(name=name, environments=tuple(envs.values()), tasks=tuple(tasks))
