"""`make test` runs the fast tier in two halves by file-name globs (see the Makefile): no test
file may fall outside both, or it would silently never run."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _halves() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return [re.search(rf"^{name} := (\S+)$", text, re.M).group(1) for name in ("FIRST_HALF", "SECOND_HALF")]


def test_the_two_halves_of_make_test_cover_every_test_file_once():
    halves = _halves()
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    assert len(files) > 50
    for f in files:
        matched = [h for h in halves if fnmatch.fnmatchcase(f, h)]
        assert len(matched) == 1, f"{f} matches {matched} of make test's halves {halves}"


def test_the_halves_really_split_the_suite():
    first, second = _halves()
    files = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")]
    assert sum(fnmatch.fnmatchcase(f, first) for f in files) > 20
    assert sum(fnmatch.fnmatchcase(f, second) for f in files) > 20
