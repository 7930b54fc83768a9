"""The tutorials (docs/tutorials/*.md) run: every checked code block of every page is executed.

The "runnable page" convention. A fenced code block whose opening fence comes on the line right
after the HTML comment ``<!-- tutorial-check -->`` is checked; the comment may carry attributes,
``<!-- tutorial-check timeout=300 -->`` (seconds for that block; default 240). Blocks without the
comment are only shown (the full-size commands, too slow for CI); each page says which smaller
command of it is the checked one.

How a page runs (one pytest test per page, so pytest-xdist spreads the pages over workers):

- blocks run in page order, in the repository root, with ``.venv/bin`` first on ``PATH`` and
  ``TUTORIAL_TMP`` naming a fresh temporary folder of the test (the pages write their outputs
  under ``${TUTORIAL_TMP:-runs/tutorials}``, so a reader's copy goes to ``runs/tutorials/``);
- a ```` ```bash ```` block runs in its own ``bash -euo pipefail`` process;
- the ```` ```python ```` blocks of a page run in ONE ``.venv/bin/python`` process, started at
  the page's first python block: each block is executed in the same namespace when its turn comes
  (bash blocks in between run before it), so later blocks use the names earlier ones defined, as
  in a notebook, and nothing is executed twice;
- a block that exits non-zero (bash) or raises (python), or runs past its timeout, fails the test
  with the page, the block's number and first line, and the tail of its output.

The blocks check their own results (python blocks ``assert``, bash blocks ``grep`` the output or
test the files written). A tutorial page without any checked block fails, and so does a marker that
is not followed directly by a bash or python fence, or that has an unknown attribute.
"""

from __future__ import annotations

import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
PAGES = sorted(p.name for p in TUTORIALS.glob("*.md") if p.name != "index.md")
VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = VENV_BIN / "python" if (VENV_BIN / "python").exists() else Path(sys.executable)
DEFAULT_TIMEOUT = 240.0
LANGUAGES = ("bash", "python")
MARKER = re.compile(r"^\s*<!--\s*tutorial-check(?P<attrs>(?:\s+[A-Za-z_]+=\S+)*)\s*-->\s*$")
LOOSE_MARKER = re.compile(r"<!--\s*tutorial-check")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
ATTRIBUTES = {"timeout": float}


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    number: int          # 1-based among the page's checked blocks
    line: int            # 1-based line of the opening fence
    language: str
    code: str
    timeout: float

    @property
    def first_line(self) -> str:
        lines = [s for s in self.code.splitlines() if s.strip()]
        return lines[0].strip() if lines else "<empty>"

    def describe(self) -> str:
        return f"{self.page}, checked block {self.number} ({self.language}, line {self.line}): {self.first_line!r}"


def parse_checked_blocks(text: str, page: str) -> list[Block]:
    """The checked blocks of a page, in order; a malformed marker raises ValueError naming it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if not LOOSE_MARKER.search(line):
            k += 1
            continue
        where = f"{page}, line {k + 1}"
        match = MARKER.match(line)
        if match is None:
            raise ValueError(f"{where}: malformed tutorial-check marker {line.strip()!r} "
                             "(expected '<!-- tutorial-check -->' or '<!-- tutorial-check timeout=N -->' "
                             "alone on its line)")
        attrs = {}
        for item in match.group("attrs").split():
            name, _, value = item.partition("=")
            if name not in ATTRIBUTES:
                raise ValueError(f"{where}: unknown tutorial-check attribute {name!r} (known: {sorted(ATTRIBUTES)})")
            try:
                attrs[name] = ATTRIBUTES[name](value)
            except ValueError:
                raise ValueError(f"{where}: attribute {name}={value!r} is not a number") from None
        fence = FENCE.match(lines[k + 1]) if k + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{where}: a tutorial-check marker must be followed directly (on the next line) "
                             "by a code fence")
        language = fence.group("lang")
        if language not in LANGUAGES:
            raise ValueError(f"{where}: checked blocks must be {' or '.join(LANGUAGES)}, got {language!r}")
        indent, marks = fence.group("indent"), fence.group("fence")
        body, j = [], k + 2
        while j < len(lines) and not (lines[j].strip().startswith(marks) and lines[j].strip().strip(marks[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{where}: the code fence opened on line {k + 2} is never closed")
        blocks.append(Block(page, len(blocks) + 1, k + 2, language, "\n".join(body) + "\n",
                            attrs.get("timeout", DEFAULT_TIMEOUT)))
        k = j + 1
    return blocks


# The page's python process: it reads blocks from the control pipe (a length line, then the
# source), executes each in one namespace, and writes "ok" or "fail" to the status pipe. Output
# goes to the process's stdout/stderr (a file the test reads back per block).
RUNNER = r"""
import os, sys, traceback
ctrl = os.fdopen(int(sys.argv[1]), "rb")
status = os.fdopen(int(sys.argv[2]), "w")
namespace = {"__name__": "__main__"}
while True:
    header = ctrl.readline()
    if not header:
        break
    name, size = header.decode().rsplit(" ", 1)
    source = ctrl.read(int(size)).decode()
    try:
        exec(compile(source, name, "exec"), namespace)
        ok = "ok"
    except BaseException:
        traceback.print_exc()
        ok = "fail"
    sys.stdout.flush()
    sys.stderr.flush()
    status.write(ok + "\n")
    status.flush()
"""


class PythonSession:
    """One python process for a page's python blocks (module docstring)."""

    def __init__(self, env: dict[str, str], log: Path):
        ctrl_read, self._ctrl = os.pipe()
        self._status, status_write = os.pipe()
        self._log = log.open("ab")
        self.proc = subprocess.Popen([str(PYTHON), "-u", "-c", RUNNER, str(ctrl_read), str(status_write)],
                                     cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, pass_fds=(ctrl_read, status_write),
                                     start_new_session=True)
        os.close(ctrl_read)
        os.close(status_write)
        self._buffer = b""

    def run(self, block: Block) -> tuple[bool, str]:
        data = block.code.encode()
        name = f"<{block.page} block {block.number}>"
        message = memoryview(f"{name} {len(data)}\n".encode() + data)
        while message:
            message = message[os.write(self._ctrl, message):]
        deadline = time.monotonic() + block.timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(self.proc)
                return False, f"timed out after {block.timeout:g} s"
            ready, _, _ = select.select([self._status], [], [], left)
            if ready:
                chunk = os.read(self._status, 64)
                if not chunk:
                    return False, f"the python process died (exit status {self.proc.wait()})"
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line == b"ok", "raised (traceback above)"

    def close(self) -> None:
        for fd in (self._ctrl, self._status):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=30)   # the runner ends when its control pipe closes
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
        self._log.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a block's process and everything it started (sandbox workers, scripts)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_bash(block: Block, env: dict[str, str], log: Path) -> tuple[bool, str]:
    with log.open("ab") as out:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.code], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=block.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return False, f"timed out after {block.timeout:g} s"
    return rc == 0, f"exited with status {rc}"


def _tail(path: Path, start: int, chars: int = 6000) -> str:
    with path.open("rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    return text if len(text) <= chars else "...\n" + text[-chars:]


def run_page(page: str, tmp: Path) -> list[tuple[Block, float]]:
    """Run every checked block of ``page``; fails the test at the first failing block."""
    blocks = parse_checked_blocks((TUTORIALS / page).read_text(encoding="utf-8"), page)
    assert blocks, f"{page} has no checked block: mark at least one bash or python block with <!-- tutorial-check -->"
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TUTORIAL_TMP"] = str(tmp)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("PYTHONPATH", None)
    log = tmp / f"{Path(page).stem}.log"
    log.touch()
    session: PythonSession | None = None
    timings = []
    try:
        for block in blocks:
            start = log.stat().st_size
            t0 = time.monotonic()
            if block.language == "bash":
                ok, why = run_bash(block, env, log)
            else:
                if session is None:
                    session = PythonSession(env, log)
                ok, why = session.run(block)
            timings.append((block, time.monotonic() - t0))
            if not ok:
                pytest.fail(f"{block.describe()} {why}; its output:\n{_tail(log, start)}", pytrace=False)
    finally:
        if session is not None:
            session.close()
    return timings


@pytest.mark.parametrize("page", PAGES)
def test_tutorial_page_runs(page, tmp_path):
    timings = run_page(page, tmp_path)
    for block, seconds in timings:   # shown with -rP / on failure of a later page
        print(f"{seconds:6.1f} s  {block.describe()}")


def test_every_tutorial_page_is_checked_and_linked_from_the_index():
    assert len(PAGES) >= 5, PAGES
    index = (TUTORIALS / "index.md").read_text(encoding="utf-8")
    for page in PAGES:
        blocks = parse_checked_blocks((TUTORIALS / page).read_text(encoding="utf-8"), page)
        assert blocks, f"{page} has no checked block"
        assert f"({page})" in index, f"docs/tutorials/index.md does not link {page}"


def test_the_marker_convention_is_parsed_strictly():
    text = ("intro\n<!-- tutorial-check -->\n```bash\necho hi\n```\n\n```bash\nshown only\n```\n"
            "<!-- tutorial-check timeout=12 -->\n```python\nx = 1\n\nassert x\n```\n")
    blocks = parse_checked_blocks(text, "t.md")
    assert [(b.language, b.code, b.timeout, b.line) for b in blocks] == [
        ("bash", "echo hi\n", DEFAULT_TIMEOUT, 3), ("python", "x = 1\n\nassert x\n", 12.0, 11)]
    assert blocks[1].first_line == "x = 1"
    for bad, message in [("<!-- tutorial-check -->\n\n```bash\nx\n```\n", "followed directly"),
                         ("<!-- tutorial-check -->\n```sh\nx\n```\n", "bash or python"),
                         ("<!-- tutorial-check wait=3 -->\n```bash\nx\n```\n", "unknown tutorial-check attribute"),
                         ("<!-- tutorial-check timeout=soon -->\n```bash\nx\n```\n", "not a number"),
                         ("text <!-- tutorial-check -->\n```bash\nx\n```\n", "malformed"),
                         ("<!-- tutorial-check -->\n```bash\nx\n", "never closed")]:
        with pytest.raises(ValueError, match=message):
            parse_checked_blocks(bad, "t.md")


def test_a_failing_block_names_the_page_and_its_first_line(tmp_path, monkeypatch):
    """The runner itself: python blocks share one process, bash blocks see TUTORIAL_TMP, and a
    failing block fails the test with its page, number and first line."""
    page = tmp_path / "pages"
    page.mkdir()
    (page / "demo.md").write_text(
        "<!-- tutorial-check -->\n```python\nvalue = 41\n```\n"
        "<!-- tutorial-check -->\n```bash\ntest -d \"$TUTORIAL_TMP\" && echo 7 > \"$TUTORIAL_TMP/x\"\n```\n"
        "<!-- tutorial-check -->\n```python\nimport os\nvalue += int(open(os.environ['TUTORIAL_TMP'] + '/x').read())\n"
        "assert value == 48, value\n```\n"
        "<!-- tutorial-check timeout=60 -->\n```python\nprint('about to fail')\nassert value == 0, 'wrong on purpose'\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "TUTORIALS", page)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_page("demo.md", run_dir)
    message = str(failure.value)
    assert "demo.md, checked block 4 (python, line 16): \"print('about to fail')\"" in message, message
    assert "about to fail" in message and "wrong on purpose" in message


@pytest.mark.parametrize("language, code", [("bash", "sleep 60"), ("python", "import time\ntime.sleep(60)")])
def test_a_block_past_its_timeout_fails_and_is_killed(tmp_path, monkeypatch, language, code):
    page = tmp_path / "pages"
    page.mkdir()
    (page / "slow.md").write_text(f"<!-- tutorial-check timeout=1 -->\n```{language}\n{code}\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "TUTORIALS", page)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="slow.md, checked block 1 .* timed out after 1 s"):
        run_page("slow.md", run_dir)
    assert time.monotonic() - t0 < 20
