"""Workspaces as a pool type: file tools, episodes in every sandbox, rubric checks as verifiers,
and the data model's bad-input handling (binary, empty, non-UTF-8, huge files, symlinks out of the
tree, duplicate paths)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from envsched_jax.envs.episode import run_actions
from envsched_jax.envs.inprocess import run_episode
from envsched_jax.envs.sandbox import SandboxConfig, make_worker_pool
from envsched_jax.pool.model import Action, Check
from envsched_jax.rethink.file_tools import FileWorkspace
from envsched_jax.rethink.pool import initial_state, workspace_pool
from envsched_jax.rethink.workspace import (
    FileLabel,
    Workspace,
    WorkspaceError,
    WorkspaceFile,
    load_workspace,
    save_workspace,
    scan_directory,
    tree_digest,
    workspace_from_directory,
)

from sandbox_helpers import sandbox_param

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16

RUBRIC = (
    Check("the value is 120", "def check_func(final_state):\n    a = final_state.get('answer') or {}\n"
          "    return a.get('value') == 120\n"),
    Check("the source is the approved record", "def check_func(final_state):\n"
          "    return (final_state.get('answer') or {}).get('source') == 'finance/budget_v2.txt'\n"),
    Check("a check that crashes", "def check_func(final_state):\n    return 1 / 0\n"),
)


def tiny_workspace(workspace_id: str = "ws-1", parent: str = "p-1") -> Workspace:
    std = lambda stage="", family="", order=None: FileLabel("standard", "authoritative_record", stage, family, order)
    files = (
        WorkspaceFile("finance/budget_v1.txt", b"Budget draft\nTotal: 100\n", "2026-01-02T10:00:00Z",
                      label=FileLabel("noise", "superseded_version", "draft", "budget", 0)),
        WorkspaceFile("finance/budget_v2.txt", b"Budget approved\nTotal: 120\n", "2026-01-05T10:00:00Z",
                      label=std("approved", "budget", 1)),
        WorkspaceFile("drafts/budget_FINAL.txt", b"Budget FINAL\nTotal: 150\n", "2026-01-09T10:00:00Z",
                      label=FileLabel("noise", "false_final_version", "final", "budget", 2,
                                      evidence=("mail/withdrawal.png",))),
        WorkspaceFile("mail/withdrawal.png", PNG, "2026-01-10T10:00:00Z", label=std("withdrawn")),
        WorkspaceFile("misc/empty.txt", b"", "2026-01-01T00:00:00Z", label=FileLabel("noise", "out_of_scope")),
    )
    return Workspace(workspace_id, "What is the approved total of the budget, and which file states it?",
                     files, RUBRIC, {"value": 120, "source": "finance/budget_v2.txt"}, parent, "small")


def test_tools_list_read_search_write_submit():
    ws = FileWorkspace()
    for key, value in initial_state(tiny_workspace()).items():
        setattr(ws, key, value)
    listing = ws.list_files("finance")
    assert [r["path"] for r in listing["files"]] == ["finance/budget_v1.txt", "finance/budget_v2.txt"]
    assert ws.read_file("finance/budget_v2.txt")["text"] == "Budget approved\nTotal: 120\n"
    assert ws.read_file("finance/budget_v2.txt", start_line=2)["text"] == "Total: 120\n"
    ws.files["crlf.txt"] = {"text": "a\r\nb\r\n", "kind": "text", "modified": "", "size": 6}
    assert ws.read_file("crlf.txt")["text"] == "a\r\nb\r\n"              # verbatim, line breaks kept
    ws.files["output/x.md"] = {"text": "source", "kind": "text", "modified": "", "size": 6}
    assert ws.write_file("output/x.md", "y")["success"] is False        # a source under output/ is a source
    del ws.files["crlf.txt"], ws.files["output/x.md"]
    image = ws.read_file("mail/withdrawal.png")
    assert not image["success"] and "image file" in image["error"]
    assert ws.read_file("nope.txt")["success"] is False
    hits = ws.search_files("total")["hits"]
    assert [h["path"] for h in hits] == ["drafts/budget_FINAL.txt", "finance/budget_v1.txt", "finance/budget_v2.txt"]
    assert ws.write_file("finance/budget_v2.txt", "x")["success"] is False      # sources stay as they are
    assert ws.write_file("output/../finance/x", "x")["success"] is False
    assert ws.write_file("output/notes.md", "checked")["success"] is True
    assert ws.submit_answer([1])["success"] is False
    assert ws.submit_answer({"value": 1})["success"] is True and ws.answer == {"value": 1}
    assert ws.reads == ["finance/budget_v2.txt", "finance/budget_v2.txt", "crlf.txt", "mail/withdrawal.png"]


def _actions(value, source):
    return [Action("list_files", {}), Action("read_file", {"path": source}),
            Action("submit_answer", {"answer": {"value": value, "source": source}}),
            Action("chat_with_user", {"message": "done"})]


def test_pool_maps_parents_to_environments_and_keeps_labels_out():
    pool = workspace_pool([tiny_workspace("a", "p-1"), tiny_workspace("b", "p-1"), tiny_workspace("c", "p-2")])
    assert [e.env_id for e in pool.environments] == ["workspace:p-1", "workspace:p-2"]
    assert pool.env_index() == [0, 0, 1]
    assert "label" not in str(pool.tasks[0].initial_state) and "authoritative" not in str(pool.tasks[0].to_json())
    with pytest.raises(WorkspaceError, match="duplicate workspace id"):
        workspace_pool([tiny_workspace("a"), tiny_workspace("a")])


@pytest.mark.parametrize("kind", [sandbox_param("inprocess"), sandbox_param("bwrap")])
def test_episodes_score_the_rubric_in_the_sandbox(kind):
    pool = workspace_pool([tiny_workspace()])
    env, task = pool.environments[0], pool.tasks[0]
    workers = make_worker_pool(SandboxConfig(kind=kind, num_workers=1, trust="any"))
    try:
        right = run_actions(workers, env, task, _actions(120, "finance/budget_v2.txt"))
        wrong = run_actions(workers, env, task, _actions(150, "drafts/budget_FINAL.txt"))
    finally:
        workers.close()
    assert right.reward == round(2 / 3, 4) and right.check_results == [True, True, False]
    assert "ZeroDivisionError" in right.check_errors[2]             # the crashing check is named, counts 0
    assert wrong.reward == 0.0
    trusted = run_episode(env, task, _actions(120, "finance/budget_v2.txt"))
    assert trusted.reward == right.reward


def test_save_load_round_trip_and_tamper_detection(tmp_path):
    ws = tiny_workspace()
    save_workspace(ws, tmp_path / "ws")
    back = load_workspace(tmp_path / "ws")
    assert back == ws and back.content_hash() == ws.content_hash()
    with pytest.raises(WorkspaceError, match="not empty"):
        save_workspace(ws, tmp_path / "ws")
    (tmp_path / "ws" / "files" / "finance" / "budget_v2.txt").write_bytes(b"Total: 999\n")
    with pytest.raises(WorkspaceError, match=r"ws.*budget_v2.txt.*sha256"):
        load_workspace(tmp_path / "ws")


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(files=None), "'files' must be a list"),
    (lambda m: m.update(files=[5]), r"files\[0\] must be an object"),
    (lambda m: m["files"][1]["label"].pop("category"), "finance/budget_v2.txt.*lacks the field 'category'"),
    (lambda m: m.update(rubric=[{"text": "x"}]), "lacks the field 'code'"),
    (lambda m: m.update(rubric=7), "malformed"),
])
def test_a_malformed_manifest_names_what_is_wrong(tmp_path, edit, message):
    import json

    save_workspace(tiny_workspace(), tmp_path / "ws")
    manifest = json.loads((tmp_path / "ws" / "workspace.json").read_text())
    edit(manifest)
    (tmp_path / "ws" / "workspace.json").write_text(json.dumps(manifest))
    with pytest.raises(WorkspaceError, match=message):
        load_workspace(tmp_path / "ws")


def test_load_refuses_a_symlinked_file(tmp_path):
    save_workspace(tiny_workspace(), tmp_path / "ws")
    secret = tmp_path / "secret.txt"
    secret.write_text("Budget approved\nTotal: 120\n")
    target = tmp_path / "ws" / "files" / "finance" / "budget_v2.txt"
    target.unlink()
    os.symlink(secret, target)
    with pytest.raises(WorkspaceError, match="symlink"):
        load_workspace(tmp_path / "ws")


def test_scan_names_every_bad_input(tmp_path):
    root = tmp_path / "raw"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "ok.txt").write_text("hello\n")
    (root / "docs" / "empty.txt").write_bytes(b"")
    (root / "docs" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "docs" / "blob.bin").write_bytes(b"\x00\x01\x02")
    (root / "docs" / "scan.png").write_bytes(PNG)
    with open(root / "docs" / "huge.log", "wb") as fh:      # sparse: 100 MB on paper, never read
        fh.truncate(100 * 1024 * 1024)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, root / "docs" / "escape.txt")
    os.symlink(root / "docs" / "ok.txt", root / "docs" / "alias.txt")
    before = tree_digest(root)
    result = scan_directory(root)
    assert tree_digest(root) == before                         # reading changed nothing
    kinds = {f.path: f.kind for f in result.files}
    assert kinds == {"docs/blob.bin": "binary", "docs/empty.txt": "text", "docs/latin1.txt": "binary",
                     "docs/ok.txt": "text", "docs/scan.png": "image"}
    assert {(s.path, s.reason) for s in result.skipped} == {
        ("docs/escape.txt", "symlink_outside"), ("docs/alias.txt", "symlink"), ("docs/huge.log", "too_large")}
    assert {(s.path, s.reason) for s in result.notes} == {("docs/empty.txt", "empty"), ("docs/latin1.txt", "not_utf8")}


def test_a_raw_directory_becomes_a_workspace_and_runs(tmp_path):
    root = tmp_path / "mine"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "plan.txt").write_text("Plan approved\nTotal: 120\n")
    (root / "docs" / "scan.png").write_bytes(PNG)
    os.symlink(tmp_path, root / "docs" / "up")                 # a directory link out of the tree
    before = tree_digest(root)
    ws, scan = workspace_from_directory(root, workspace_id="mine-1", request="What is the approved total?",
                                        rubric=RUBRIC[:1], reference={"value": 120})
    assert tree_digest(root) == before
    assert ws.paths == ("docs/plan.txt", "docs/scan.png") and [s.reason for s in scan.skipped] == ["symlink_outside"]
    pool = workspace_pool([ws])
    run = run_episode(pool.environments[0], pool.tasks[0],
                      [Action("read_file", {"path": "docs/plan.txt"}), Action("submit_answer", {"answer": {"value": 120}}),
                       Action("chat_with_user", {"message": "done"})])
    assert run.reward == 1.0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WorkspaceError, match="no readable file"):
        workspace_from_directory(empty, workspace_id="e", request="x", rubric=RUBRIC[:1])


def test_bad_records_are_named():
    ws = tiny_workspace()
    with pytest.raises(WorkspaceError, match="budget_v1.txt.*duplicate path"):
        dataclasses.replace(ws, files=ws.files + (ws.files[0],))
    with pytest.raises(WorkspaceError, match=r"'\.\.' components"):
        WorkspaceFile("a/../b.txt", b"", "2026-01-01T00:00:00Z")
    with pytest.raises(WorkspaceError, match="modified"):
        WorkspaceFile("a.txt", b"", "yesterday")
    with pytest.raises(WorkspaceError, match="not NUL-free UTF-8"):
        WorkspaceFile("a.txt", b"\xff", "2026-01-01T00:00:00Z", kind="text")
    with pytest.raises(WorkspaceError, match="disagrees with category"):
        FileLabel("standard", "superseded_version")
    with pytest.raises(WorkspaceError, match="evidence names 'nowhere.txt'"):
        dataclasses.replace(ws, files=(dataclasses.replace(
            ws.files[0], label=FileLabel("noise", "out_of_scope", evidence=("nowhere.txt",))),))
    with pytest.raises(WorkspaceError, match="rubric"):
        dataclasses.replace(ws, rubric=())


def test_clean_and_public_views():
    ws = tiny_workspace()
    assert ws.clean().paths == ("finance/budget_v2.txt", "mail/withdrawal.png")
    assert all(f.label is None for f in ws.public().files)
    assert ws.public().content_hash() == ws.content_hash()
    with pytest.raises(WorkspaceError, match="labelled"):
        ws.public().clean()


def test_pool_folders_rewrite_a_relabelled_workspace(tmp_path):
    from envsched_jax.rethink.store import read_pool, write_pool

    ws = tiny_workspace()
    assert write_pool(tmp_path, {"train": [ws]}) == {"written": 1, "skipped": 0}
    assert write_pool(tmp_path, {"train": [ws]}) == {"written": 0, "skipped": 1}
    relabelled = dataclasses.replace(ws, files=(dataclasses.replace(
        ws.files[0], label=FileLabel("noise", "out_of_scope")),) + ws.files[1:])
    assert relabelled.content_hash() == ws.content_hash()          # labels are not content
    assert write_pool(tmp_path, {"train": [relabelled]}) == {"written": 1, "skipped": 0}
    assert read_pool(tmp_path)["train"] == [relabelled]
