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
