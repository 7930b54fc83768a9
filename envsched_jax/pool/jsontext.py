"""Strict JSON reading for pool files: every failure is a :class:`PoolError` naming file and line.

Python's :mod:`json` accepts inputs a pool must not contain, and fails on others with exceptions
that carry no location:

- duplicate keys: json silently keeps the last value; here they are an error naming the key;
- nesting: json raises ``RecursionError`` near 1,000 levels, and ``copy.deepcopy`` of a loaded
  record already fails near 500 (when the pool is later hashed or written); documents nested
  deeper than :data:`MAX_DEPTH` are refused at load time;
- integers longer than ``sys.get_int_max_str_digits()`` raise a bare ``ValueError``;
- bytes that are not UTF-8 raise ``UnicodeDecodeError`` with a byte offset.

Locations are 1-based lines of the file. For a whole-file document the line comes from json's
own error where it gives one; otherwise (deep nesting, long integers, duplicate keys) it is found
by a second look at the text, which runs only when something is already wrong.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from envsched_jax.pool.model import MAX_DEPTH, PoolError, json_depth_exceeds

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


class _DuplicateKey(Exception):
    def __init__(self, key: str, pos: int | None = None):
        self.key, self.pos = key, pos


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def read_bytes(path: Path) -> bytes:
    """The file's bytes; a missing or unreadable file is a :class:`PoolError` naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PoolError("no such file", source=str(path)) from None
    except OSError as err:
        raise PoolError(f"cannot read the file ({err.strerror or err})", source=str(path)) from None


def decode_utf8(data: bytes, *, source: str, first_line: int = 1) -> str:
    """``data`` as text; invalid UTF-8 is an error naming the line and column of the first bad
    byte (the bytes themselves are shown escaped, never echoed raw)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start)
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        bad = data[err.start:err.end]
        raise PoolError(f"not valid UTF-8: byte 0x{bad[0]:02x} at column {column} ({err.reason})",
                        source=source, line=first_line + line) from None


def parse_json(text: str, *, source: str, first_line: int = 1, field: str | None = None) -> Any:
    """Parse one JSON document strictly (see the module docstring). ``first_line`` is the file
    line ``text`` starts on; ``field`` names the record field it came from, if any."""
    where = {"source": source, "field": field}
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise PoolError(f"invalid JSON ({err.msg} at column {err.colno})",
                        line=first_line + err.lineno - 1, **where) from None
    except _DuplicateKey as err:
        pos = _duplicate_position(text)
        at = "" if pos is None else f" in the object that starts at column {_column(text, pos)}"
        raise PoolError(f"duplicate key {err.key!r}{at}",
                        line=first_line + (0 if pos is None else text.count("\n", 0, pos)),
                        **where) from None
    except RecursionError:
        raise _too_deep(text, where, first_line) from None
    except ValueError:  # json raises a bare ValueError for an integer over Python's digit limit
        digits = sys.get_int_max_str_digits()
        pos = _long_integer_position(text, digits)
        at = "" if pos is None else f" at column {_column(text, pos)}"
        line = first_line + (0 if pos is None else text.count("\n", 0, pos))
        raise PoolError(f"an integer has more than {digits} digits (Python's limit for reading "
                        f"integers){at}", line=line, **where) from None
    if json_depth_exceeds(value, MAX_DEPTH):
        raise _too_deep(text, where, first_line)
    return value


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any | PoolError]]:
    """(1-based line, parsed value or the :class:`PoolError` for that line) for every non-blank
    line of a JSON-lines file. Lines are split on ``\\n`` only (a JSON string may hold U+2028).
    A file without any non-blank line raises :class:`PoolError` ("no records")."""
    data = read_bytes(path)
    source = str(path)
    if not data.strip():
        raise no_records_error(path, data)
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield line_no, parse_json(decode_utf8(raw, source=source, first_line=line_no),
                                      source=source, first_line=line_no)
        except PoolError as err:
            yield line_no, err


def no_records_error(path: Path, data: bytes) -> PoolError:
    """The error for a file without any record: empty, or only blank lines."""
    if not data:
        return PoolError("no records: the file is empty", source=str(path))
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    return PoolError(f"no records: the file has {lines} line(s), all blank", source=str(path))


def _column(text: str, pos: int) -> int:
    return pos - (text.rfind("\n", 0, pos) + 1) + 1


def _too_deep(text: str, where: dict, first_line: int) -> PoolError:
    depth, pos = _deepest(text)
    return PoolError(f"nested deeper than {MAX_DEPTH} levels ({depth} levels at column "
                     f"{_column(text, pos)})", line=first_line + text.count("\n", 0, pos), **where)


def _blank_strings(text: str) -> str:
    """``text`` with the inside of every JSON string blanked (same length, same lines), so that
    brackets and digits in strings are not counted."""
    return _STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)


def _deepest(text: str) -> tuple[int, int]:
    """(maximum bracket depth outside strings, position where it is first reached)."""
    blanked = _blank_strings(text)
    codes = np.frombuffer(blanked.encode("utf-32-le"), np.uint32)
    step = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(codes, (ord("]"), ord("}"))).astype(np.int64))
    depth = np.cumsum(step)
    pos = int(np.argmax(depth)) if len(depth) else 0
    return (int(depth[pos]) if len(depth) else 0), pos


def _long_integer_position(text: str, digits: int) -> int | None:
    match = re.search(r"\d{%d,}" % (digits + 1), _blank_strings(text))
    return None if match is None else match.start()


def _duplicate_position(text: str) -> int | None:
    """Position of the ``{`` of the first object (in completion order) with a duplicate key,
    found by re-parsing with json's pure-Python scanner, whose object parser can be wrapped."""
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        start = s_and_end[1] - 1

        def hook(pairs):
            try:
                return _no_duplicates(pairs)
            except _DuplicateKey as err:
                raise _DuplicateKey(err.key, start) from None

        return json.decoder.JSONObject(s_and_end, strict, scan_once, object_hook, hook, memo)

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except _DuplicateKey as err:
        return err.pos
    except (ValueError, RecursionError):
        return None
    return None
