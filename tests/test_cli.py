"""Smoke tests of the `envsched` command line and the experiment scripts (as subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def _envscaler_spec(files) -> str:
    return f"envscaler:{files[0]}:{files[1]}"


def test_pool_inspect(envscaler_files):
    res = _run("-m", "envsched_jax.cli", "pool", "inspect", _envscaler_spec(envscaler_files))
    assert res.returncode == 0, res.stderr
    assert "2 environments, 3 tasks, 5 tools" in res.stdout
    assert "validation problems: none" in res.stdout


def test_pool_inspect_reports_problems(tmp_path, envscaler_files):
    tasks = json.loads(envscaler_files[1].read_text())
    tasks[0]["checklist_with_func"] = []
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps(tasks))
    spec = f"envscaler:{envscaler_files[0]}:{bad}"
    res = _run("-m", "envsched_jax.cli", "pool", "inspect", spec)
    assert res.returncode == 1 and "empty checklist" in res.stdout
    res = _run("-m", "envsched_jax.cli", "pool", "inspect", spec, "--drop-invalid")
    assert res.returncode == 0 and "1 validation problem(s)" in res.stdout and "env_151_rl-task_0" in res.stdout


def test_graph_build_writes_manifest(tmp_path, envscaler_files, envscaler_pool):
    out = tmp_path / "graph"
    res = _run("-m", "envsched_jax.cli", "graph", "build", _envscaler_spec(envscaler_files), "--out", str(out),
               "--config.num-candidates", "4")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pool_content_hash"] == envscaler_pool.content_hash()
    assert manifest["config"]["num_candidates"] == 4 and manifest["num_nodes"] == 3
    res = _run("-m", "envsched_jax.cli", "graph", "build", _envscaler_spec(envscaler_files), "--out", str(out))
    assert res.returncode == 1 and "--overwrite" in res.stdout


def test_unknown_pool_spec_is_a_clear_error():
    res = _run("-m", "envsched_jax.cli", "pool", "inspect", "no-such-pool")
    assert res.returncode == 1 and "unknown pool spec 'no-such-pool'" in res.stdout
