"""Workspace pools on disk: one folder per workspace (:func:`~.workspace.save_workspace`) under
``<root>/<split>/``, and ``<root>/index.json`` listing them. Writes are resumable and atomic per
workspace: a workspace is written to a temporary sibling folder and renamed into place, so an
interrupted run leaves either a complete workspace or none, and a rerun skips what is complete
(the same record, labels included) and rewrites what differs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from envsched_jax.rethink.workspace import MANIFEST, Workspace, WorkspaceError, load_workspace, save_workspace

INDEX = "index.json"


def _safe_name(workspace_id: str) -> str:
    bad = set('/\\\x00') | {":"}
    name = "".join("_" if ch in bad else ch for ch in workspace_id)
    if name in ("", ".", ".."):
        raise WorkspaceError(f"workspace id {workspace_id!r} cannot name a folder", field="workspace_id")
    return name


def write_pool(root: str | Path, splits: Mapping[str, Sequence[Workspace]], *,
               progress: Callable[[Iterable, int], Iterable] | None = None) -> dict[str, int]:
    """Write ``splits`` (split name -> workspaces) under ``root``; returns counts of ``written``
    and ``skipped`` (already there as the same record)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    items = [(split, ws) for split, workspaces in splits.items() for ws in workspaces]
    counts = {"written": 0, "skipped": 0}
    index = {split: [] for split in splits}
    for split, ws in (progress(items, len(items)) if progress else items):
        folder = root / split / _safe_name(ws.workspace_id)
        index[split].append({"workspace_id": ws.workspace_id, "folder": f"{split}/{folder.name}",
                             "parent_task": ws.parent_task, "size_class": ws.size_class,
                             "content_hash": ws.content_hash()})
        if (folder / MANIFEST).exists():
            try:
                # the whole record, labels, reference and metadata included (the content hash
                # leaves those out: a relabelled workspace must be rewritten)
                if load_workspace(folder) == ws:
                    counts["skipped"] += 1
                    continue
            except WorkspaceError:
                pass
        tmp = folder.with_name(folder.name + ".partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        save_workspace(ws, tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        counts["written"] += 1
    (root / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return counts


def read_pool(root: str | Path) -> dict[str, list[Workspace]]:
    """The splits written by :func:`write_pool` (every workspace's bytes checked against its
    manifest)."""
    root = Path(root)
    try:
        index = json.loads((root / INDEX).read_text())
    except FileNotFoundError:
        raise WorkspaceError(f"no {INDEX}: not a workspace pool folder (write one with "
                             "experiments/rethink_generate.py)", source=str(root)) from None
    except json.JSONDecodeError as err:
        raise WorkspaceError(f"{INDEX} is not valid JSON: {err}", source=str(root)) from None
    out = {}
    for split, rows in index.items():
        out[split] = []
        for row in rows:
            ws = load_workspace(root / row["folder"])
            if ws.content_hash() != row["content_hash"]:
                raise WorkspaceError("content hash differs from the index", source=str(root / row["folder"]))
            out[split].append(ws)
    return out
