"""Generated pages of the documentation site (run by mkdocs-gen-files at every build).

* ``reference/``: one API page per public module of ``envsched_jax`` (a module is private when a
  component of its dotted name starts with an underscore; package ``__init__`` files document the
  package), rendered by mkdocstrings from the docstrings, and ``reference/SUMMARY.md``, the
  section's navigation for mkdocs-literate-nav. Pool data shipped inside the package (the
  embedded pool's environment classes under ``pool/embedded/envs``) is task-pool content, not API,
  and is left out.
* ``notebooks/``: the project's notebooks, copied in for mkdocs-jupyter to render (not executed:
  ``tests/test_notebooks.py`` executes them).
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "envsched_jax"
DATA_DIRS = {("pool", "embedded", "envs"), ("pool", "embedded", "tasks")}


def public_modules() -> list[tuple[str, ...]]:
    """Dotted-name parts of every public module, packages first within their folder, sorted."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts
        if any(parts[1:1 + len(d)] == d for d in DATA_DIRS):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        modules.append(parts)
    return sorted(modules)


def write_reference() -> None:
    nav = mkdocs_gen_files.Nav()
    for parts in public_modules():
        is_package = PACKAGE.joinpath(*parts[1:]).is_dir()
        doc_path = Path(*parts[1:], "index.md") if is_package else Path(*parts[1:]).with_suffix(".md")
        nav[parts] = doc_path.as_posix()
        with mkdocs_gen_files.open(Path("reference", doc_path), "w") as fh:
            fh.write(f"::: {'.'.join(parts)}\n")
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as fh:
        fh.writelines(nav.build_literate_nav())


def copy_notebooks() -> None:
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        with mkdocs_gen_files.open(Path("notebooks", nb.name), "w") as fh:
            fh.write(nb.read_text(encoding="utf-8"))


write_reference()
copy_notebooks()
