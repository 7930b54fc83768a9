"""`make test` runs the fast tier in parts by file-name globs (TEST_PARTS in the Makefile): no test
file may fall outside every part, or it would silently never run, nor inside two."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _parts() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^TEST_PARTS := (.+)$", text, re.M).group(1).split()


def _test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))


def test_the_parts_of_make_test_cover_every_test_file_once():
    parts = _parts()
    files = _test_files()
    assert len(files) > 50
    for f in files:
        matched = [p for p in parts if fnmatch.fnmatchcase(f, p)]
        assert len(matched) == 1, f"{f} matches {matched} of make test's parts {parts}"


def test_the_parts_really_split_the_suite():
    parts = _parts()
    files = _test_files()
    assert len(parts) >= 4
    for p in parts:
        assert sum(fnmatch.fnmatchcase(f, p) for f in files) >= 5, p


def test_each_part_is_passed_to_pytest_as_one_glob():
    # The recipe loops over the parts; unquoted, the shell would expand each glob in the loop's
    # word list and start pytest once per file.
    text = (ROOT / "Makefile").read_text()
    assert "for part in $(foreach p,$(TEST_PARTS),'$(p)')" in text


def test_a_crashed_worker_fails_the_part_instead_of_hanging(tmp_path):
    # Under --dist loadgroup, pytest-xdist 3.8.0 hangs once it has replaced a crashed worker (see
    # the Makefile); make test's flags must end such a run, failed, within seconds.
    import shlex
    import subprocess
    import sys

    flags = shlex.split(re.search(r"^FAST_TIER := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1))
    (tmp_path / "test_crash.py").write_text(
        "import os, time, pytest\n"
        "def test_a(): pass\n"
        "@pytest.mark.xdist_group('g')\n"
        "def test_crash(): time.sleep(0.5); os.abort()\n"
        "@pytest.mark.xdist_group('g')\n"
        "def test_after(): pass\n"
        "def test_b(): time.sleep(1.5)\n"
        "def test_c(): pass\n")
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *flags,
                              "test_crash.py"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("the run with make test's flags hung after a worker crashed") from None
    assert run.returncode == 1, run.stdout[-2000:]
    assert "crashed while running 'test_crash.py::test_crash'" in run.stdout
