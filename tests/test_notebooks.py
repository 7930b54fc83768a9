"""Every notebook runs top to bottom (nbclient) and is stored without outputs.

Notebooks with size knobs keep them in their first code cell, tagged ``parameters``. The test runs
such notebooks in a tiny configuration: it inserts a cell right after the ``parameters`` cell that
overrides the knobs listed in :data:`TINY` (papermill's convention), so the defaults stay in the
notebook and the override must name knobs that exist. It then checks what the notebook printed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

TINY_SETUP = "SetupConfig(train_envs=6, heldout_envs=2, tasks_per_env=10)"
"""6 training environments: B = 8 stays feasible under EnvSched's caps (4 per environment per
batch, 2 at cold start)."""

TINY_SCHEDULERS = ["envsched", "random", "dps", "mopps", "leeps_reconstruction"]
TINY_RHOS, TINY_LAMBDAS = [0.25, 0.5], [0.0, 0.08]
TINY_NOISES, TINY_DMEANS = [0.4, 0.8], [-0.25]

TINY: dict[str, dict[str, str]] = {
    "sweep.ipynb": {"STEPS": "4", "SEEDS": "[0]", "SETUP": TINY_SETUP, "BATCH_SIZE": "8", "GROUP_SIZE": "4",
                    "RHOS": repr(TINY_RHOS), "LAMBDA_SIMS": repr(TINY_LAMBDAS),
                    "ROLLOUT_NOISES": repr(TINY_NOISES), "DIFFICULTY_MEANS": repr(TINY_DMEANS)},
    "compare_schedulers.ipynb": {"STEPS": "5", "SEEDS": "[0, 1]", "SETUP": TINY_SETUP, "BATCH_SIZE": "8",
                                 "GROUP_SIZE": "4", "SCHEDULERS": repr(TINY_SCHEDULERS), "SMOOTH": "2"},
    "forge.ipynb": {"K": "8", "POLICY_SEED": "1"},
    "rethink.ipynb": {"NUM_PARENTS": "4", "VARIANTS": "1"},
}
"""Knob overrides per notebook (Python source of each value). Notebooks not listed run as saved."""


def _row(*cells) -> re.Pattern:
    """A printed table row that starts with ``cells`` (separated by blanks)."""
    return re.compile(r"^\s*" + r"\s+".join(re.escape(str(c)) for c in cells) + r"\s", re.M)


EXPECTED: dict[str, list[re.Pattern]] = {
    "sweep.ipynb": (
        [_row(r, lam) for r in TINY_RHOS for lam in TINY_LAMBDAS]          # EnvSched grid table
        + [_row("random", "-")]                                               # Random reference row
        + [_row(n, d) for n in TINY_NOISES for d in TINY_DMEANS]              # testbed tables
        + [re.compile(r"highest final held-out: rho = ")]),
    "compare_schedulers.ipynb": (
        [_row(name) for name in TINY_SCHEDULERS]
        + [re.compile(r"ranked by mean final held-out score: " + r" > ".join([r"\w+"] * len(TINY_SCHEDULERS)))]),
    "forge.ipynb": [re.compile(r"backend scip, status optimal, objective \S+, 150 action variables"),
                    re.compile(r"requirements after: .*\n(.|\n)*  sync       pass"),
                    re.compile(r"accepted: (True|False \(no Docker engine)")],
    "rethink.ipynb": [re.compile(r"egs: \d+ collections, coverage ok: True"),
                      re.compile(r"tgs: \d+ collections, coverage ok: True"),
                      re.compile(r"learned\s+held-out: partition \d+/\d+"),
                      re.compile(r"validation passed: True"),
                      _row("careful", "clean")],
}
"""What each notebook must print in the tiny configuration."""

NUMBERS: dict[str, list[tuple[str, float]]] = {
    "sweep.ipynb": [(r"vmapped vs point-by-point initial held-out score: max difference (\S+)", 1e-3)],
    "compare_schedulers.ipynb": [(r"max \|variance diff\| ([^,]+),", 1e-5), (r"max \|held-out diff\| ([^,]+),", 1e-3),
                                 (r"max \|environments diff\| (\S+)", 0.0)],
}
"""Printed consistency checks: (pattern capturing a number, largest allowed value)."""

FIGURES = {"sweep.ipynb": 2, "compare_schedulers.ipynb": 1, "forge.ipynb": 1, "rethink.ipynb": 1}
"""Minimum number of figures (image/png outputs)."""


def _first_code_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


def _assigned_names(source: str) -> set[str]:
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def _inject_tiny(nb, overrides: dict[str, str]) -> None:
    params = [k for k, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell must be tagged 'parameters'"
    cell = nb.cells[params[0]]
    assert cell is _first_code_cell(nb), "the parameters cell must be the first code cell"
    unknown = set(overrides) - _assigned_names(cell.source)
    assert not unknown, f"overrides of knobs the parameters cell does not define: {sorted(unknown)}"
    source = "\n".join(f"{k} = {v}" for k, v in overrides.items())
    nb.cells.insert(params[0] + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))


def _printed(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_is_saved_clean(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{path.name} is saved with outputs"
    if path.name in TINY:
        _inject_tiny(nb, TINY[path.name])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = _printed(nb)
    assert "Traceback" not in printed
    for pattern in EXPECTED.get(path.name, []):
        assert pattern.search(printed), f"{path.name} did not print {pattern.pattern!r}:\n{printed}"
    for pattern, limit in NUMBERS.get(path.name, []):
        m = re.search(pattern, printed)
        assert m, f"{path.name} did not print {pattern!r}:\n{printed}"
        assert abs(float(m.group(1))) <= limit, f"{path.name}: {m.group(0)} (allowed {limit})"
    assert not re.search(r"\bnan\b", printed, re.I), f"{path.name} printed NaN:\n{printed}"
    assert _figures(nb) >= FIGURES.get(path.name, 0), f"{path.name} drew fewer figures than expected"


def test_there_are_notebooks():
    assert NOTEBOOKS
    names = {p.name for p in NOTEBOOKS}
    assert {"sweep.ipynb", "compare_schedulers.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_sized_notebooks_have_a_tiny_configuration(path):
    """A notebook with a ``parameters`` cell is run by the tests in a tiny configuration."""
    nb = nbformat.read(path, as_version=4)
    tagged = any("parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert tagged == (path.name in TINY)
