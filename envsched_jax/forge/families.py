"""Built-in seed families of Envs-FORGE and the deterministic programmatic materializer.

The paper rewrites a seed bundle with an LLM told the selected action (seeds/001 appendix C.2) and
accepts the rewrite only when instruction, fixtures, oracle, tests and container agree and the
oracle earns reward 1 (appendix A.3). Offline we replace the LLM by parameterised generators: a
*family* is a frozen dataclass of parameters plus :func:`realize`, a pure function from parameters
to a complete Harbor bundle, and an action is realised by :func:`transform` as a change of those
parameters. Instruction, fixtures, oracle and tests are all regenerated from the same parameters,
so appendix A.3's contract holds by construction: an added requirement appears in the instruction
(a bullet with its title), in the tests (its check function) and in the oracle (its code, marked
``# requirement: ID``); a removed one disappears from all three.

**Families.** Five skill families (``logs``, ``convert``, ``repair``, ``script``, ``config``); each
has a *chain* of requirements (its core skill, then deeper skills along it) and a *pool* of
optional requirements from neighbouring skills. A task holds a prefix of the chain (``depth``: its
required skills) and any subset of the pool (``extras``: its optional skills, in the order they
were added), plus integer knobs (data size, number of fields or constraints) and a data
``variant``. Every requirement exercises exactly one skill and skill names are unique across
families, so :data:`SKILL_GRAPH` is the disjoint union of the families' graphs: ``deeper`` links
chain[k] -> chain[k + 1] and ``neighbours`` links chain skills to pool skills, nothing else.

**Actions** (:func:`transform`). The skills of the rewritten task are exactly
:func:`~envsched_jax.forge.candidates.candidate_skills` of the seed under :data:`SKILL_GRAPH`, so
the MILP's model of each candidate and the materialised bundle agree. On top of that rule:

- increase / in_depth: the next chain requirement (more constraints, harder edge cases);
  increase / in_breadth: the first neighbouring pool requirement not yet active. When there is
  no such skill left, every knob moves one step up instead;
- reduce / in_depth: drops every optional requirement and moves every knob one step down (the
  bridge task keeps the core reasoning on less data); reduce / in_breadth: drops every optional
  requirement, or, when there is none, moves the knobs down;
- diversify / in_depth: the same requirements and knobs on new data and concrete values;
  diversify / in_breadth: the last optional requirement swapped for the first outside neighbour
  (added when there is none).

Every rewrite draws a fresh ``variant`` from ``rng_seed``, so its data always differs from the
seed's. *Decision*: an action that cannot apply (reduce on a task already minimal, increase with
the chain, pool and knobs exhausted, a swap with no neighbour left) does not raise; it returns a
:class:`Rewrite` whose ``params`` differ by data only and whose ``note`` says why, so a selected
action always materialises and the caller decides whether to keep a data-only variant.

**Runtime contract of every bundle.** ``environment/Dockerfile`` is exactly :data:`DOCKERFILE`
(no RUN, no network); the workspace is ``environment/app``; the toolchain is the host's ``/usr``
(bash, coreutils and ``python3`` with its standard library). ``solution/solve.sh`` runs with cwd
``/app``; ``tests/test.sh`` runs ``tests/check.py`` (one check per active requirement, against
``tests/expected.json``) and always writes ``1`` or ``0`` to ``/logs/verifier/reward.txt`` and
exits 0. The tests fail on the untouched workspace and pass after the oracle.

**Determinism.** Data come from :class:`random.Random` seeded with strings (SHA-512 seeding, not
hash randomisation), one stream per purpose, so equal parameters give byte-identical bundles on
one Python version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from envsched_jax.forge.actions import ACTION_INDEX, Action
from envsched_jax.forge.actions import action as action_named
from envsched_jax.forge.bundle import BundleFile, SkillSubgraph, TaskBundle, write_bundle
from envsched_jax.forge.candidates import SeedSpec, SkillGraph, candidate_skills

DOCKERFILE = b"FROM envsched-forge-base\nWORKDIR /app\nCOPY app/ /app/\n"
"""Every generated bundle's Dockerfile: the base image is built locally by another module."""

AUTHOR_NAME = "envsched_jax"
VERIFIER_TIMEOUT_SEC = 120.0
AGENT_TIMEOUT_SEC = 900.0
"""The paper's per-trajectory timeout (appendix D)."""

Files = dict[str, tuple[bytes, bool]]
"""A realised bundle: relative path -> (content, executable)."""


# ---------------------------------------------------------------------------------------------
# The common model


@dataclass(frozen=True)
class Requirement:
    """One checkable requirement: its id, the one skill it exercises, and the title that heads its
    bullet in the instruction (``- **TITLE.** ...``)."""

    id: str
    skill: str
    title: str


@dataclass(frozen=True)
class Knob:
    """An integer difficulty knob of a family and the values it may take, easiest first."""

    name: str
    values: tuple[int, ...]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class FamilyParams:
    """The parameters every family shares; each family subclasses it with its knobs.

    ``depth`` is how many requirements of the family's chain are active (at least the core one);
    ``extras`` are the active optional requirement ids, in the order they were added (the last is
    the one diversify / in_breadth swaps); ``variant`` seeds the data and concrete values.
    """

    FAMILY: ClassVar[str] = ""
    variant: int = 0
    depth: int = 1
    extras: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = type(self).__name__
        if self.FAMILY not in FAMILIES:
            raise TypeError(f"{where} is not a family's parameter class; use e.g. LogsParams")
        if isinstance(self.extras, str) or not isinstance(self.extras, Iterable):
            raise ValueError(f"{where}.extras must be a sequence of requirement ids, got {self.extras!r}")
        object.__setattr__(self, "extras", tuple(self.extras))
        family = FAMILIES[self.FAMILY]
        if not _is_int(self.variant) or self.variant < 0:
            raise ValueError(f"{where}.variant must be an int >= 0, got {self.variant!r}")
        if not _is_int(self.depth) or not 1 <= self.depth <= len(family.chain):
            raise ValueError(f"{where}.depth must be an int from 1 to {len(family.chain)} (the length of "
                             f"the {family.name} chain), got {self.depth!r}")
        pool = [r.id for r in family.pool]
        for extra in self.extras:
            if extra not in pool:
                raise ValueError(f"{where}.extras: {extra!r} is not an optional requirement of "
                                 f"{family.name}; those are {pool}")
        if len(set(self.extras)) != len(self.extras):
            raise ValueError(f"{where}.extras lists a requirement twice: {list(self.extras)}")
        for knob in family.knobs:
            value = getattr(self, knob.name)
            if not _is_int(value) or value not in knob.values:
                raise ValueError(f"{where}.{knob.name} must be one of {list(knob.values)}, got {value!r}")


@dataclass(frozen=True)
class _Rendered:
    """What a family's generator decides for one parameter set; the rest is assembled commonly.

    ``details`` maps each active requirement id to its bullet text; ``expected`` is the hidden
    answer the checks compare against; ``constants`` are the task's concrete values that the
    oracle is written with (as an agent would copy them from the instruction)."""

    app: dict[str, bytes]
    intro: str
    details: dict[str, str]
    expected: dict[str, Any]
    constants: dict[str, Any] = field(default_factory=dict)


Parts = tuple[tuple[str | None, str], ...]
"""Code pieces in execution order; a piece with a requirement id is kept only while it is active."""


def _parts(*items: tuple[str | None, str]) -> Parts:
    return tuple((req, textwrap.dedent(code).strip("\n") + "\n") for req, code in items)


_PYTHON_SOLVE = """#!/bin/bash
# Oracle solution, generated by envsched_jax.forge.families; run with cwd /app.
set -euo pipefail
cd /app
python3 - <<'ORACLE'
{program}ORACLE
"""


@dataclass(frozen=True)
class Family:
    """One seed family: its requirements, skill graph, knobs, generator and code templates."""

    name: str
    title: str
    params_type: type[FamilyParams]
    chain: tuple[Requirement, ...]
    pool: tuple[Requirement, ...]
    neighbours: Mapping[str, tuple[str, ...]]
    """Chain skill -> the pool skills next to it, in the order breadth actions take them."""
    knobs: tuple[Knob, ...]
    tags: tuple[str, ...]
    render: Callable[[Any], _Rendered] = field(repr=False)
    oracle: Parts = field(repr=False)
    checks: Parts = field(repr=False)
    solve_template: str = field(default=_PYTHON_SOLVE, repr=False)

    @property
    def requirements(self) -> tuple[Requirement, ...]:
        return self.chain + self.pool


_CHECK_HEAD = r'''"""Verifier of a generated Envs-FORGE task: one check per requirement of its instruction."""
import json
import os
import sys

EXPECTED = json.load(open("/tests/expected.json", encoding="utf-8"))
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def same(got, want):
    """Equality that also compares JSON types: 1 is not 1.0 is not true."""
    if isinstance(want, bool) or want is None:
        return got is want
    if isinstance(want, int):
        return type(got) is int and got == want
    if isinstance(want, float):
        return type(got) in (int, float) and got == want
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def expect_equal(got, want, what):
    assert same(got, want), f"{what}: got {json.dumps(got)[:300]}, expected {json.dumps(want)[:300]}"


def load_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def text_lines(path):
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle.read().splitlines() if line.strip()]
'''

_CHECK_TAIL = r'''
failures = 0
for fn in CHECKS:
    try:
        fn(EXPECTED)
        print("PASS", fn.__name__)
    except Exception as exc:
        failures += 1
        print("FAIL", fn.__name__, type(exc).__name__, str(exc)[:500])
sys.exit(1 if failures or not CHECKS else 0)
'''

TEST_SH = b"""#!/bin/bash
# Verifier entry, generated by envsched_jax.forge.families: the reward is 1 only when every check
# of tests/check.py passes. 0 is written first, so that a crash still leaves a reward. The script
# tasks' checks run the agent's program, which can write to /logs: so once the checks are done,
# every other process is killed (this script is PID 1 of the test container) and the verdict
# replaces whatever the reward path then holds.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
verdict=0
if timeout 100 python3 /tests/check.py; then
  verdict=1
fi
kill -9 -1 2>/dev/null
rm -rf /logs/verifier && mkdir /logs/verifier
echo "$verdict" > /logs/verifier/reward.txt
exit 0
"""


def _rng(params: FamilyParams, purpose: str) -> random.Random:
    """A stream per purpose, so e.g. the time window does not move when a requirement is added."""
    return random.Random(f"{params.FAMILY}:{params.variant}:{purpose}")


def _family(params: FamilyParams) -> Family:
    if not isinstance(params, FamilyParams) or params.FAMILY not in FAMILIES:
        raise TypeError(f"expected a family's parameters (e.g. LogsParams), got {type(params).__name__}")
    return FAMILIES[params.FAMILY]


# ---------------------------------------------------------------------------------------------
# logs: text / log processing


@dataclass(frozen=True)
class LogsParams(FamilyParams):
    """Summarise an application log into a JSON report."""

    FAMILY: ClassVar[str] = "logs"
    size: int = 40
    """Number of well-formed records (malformed lines come on top)."""
    num_components: int = 4
    """Number of distinct components, the candidates of the error ranking."""


_LEVELS = ("DEBUG", "INFO", "WARN", "ERROR")
_LOG_HOSTS = ("web-1", "web-2", "web-3", "api-1", "api-2", "batch-1", "edge-4", "db-1")
_LOG_COMPONENTS = ("auth", "billing", "cache", "db", "mailer", "queue", "scheduler", "storage")
_LOG_MESSAGES = {
    "DEBUG": ("cache lookup took {n} ms", "polling shard {n}", "loaded {n} feature flags"),
    "INFO": ("request served in {n} ms", "user {n} signed in", "job {n} finished", "config reloaded, {n} keys"),
    "WARN": ("slow response, {n} ms over budget", "retry {n} scheduled", "disk usage at {n} percent"),
    "ERROR": ("connection reset after {n} retries", "timeout, gave up after {n} s", "payment {n} declined",
              'unexpected token "{n}" in payload', "worker {n} crashed"),
}


@dataclass(frozen=True)
class _LogRecord:
    timestamp: str
    host: str
    level: str
    component: str
    message: str

    def line(self) -> str:
        return f"{self.timestamp} {self.host} {self.level} {self.component}: {self.message}"


def _malformed_line(rng: random.Random, r: _LogRecord) -> str:
    """A line that looks like a record but breaks exactly one rule of the stated format."""
    forms = (f"{r.host} {r.level} {r.component}: {r.message}",
             f"{r.timestamp} {r.host} FATAL {r.component}: {r.message}",
             f"{r.timestamp} {r.host} {r.level.lower()} {r.component}: {r.message}",
             f"{r.timestamp.replace('T', ' ')} {r.host} {r.level} {r.component}: {r.message}",
             f"{r.timestamp} {r.host} {r.level} {r.component} {r.message}",
             f"{r.timestamp} {r.host} {r.level}")
    return rng.choice(forms)


def _render_logs(p: LogsParams) -> _Rendered:
    active = set(describe_requirements(p))
    rng = _rng(p, "records")
    hosts = rng.sample(_LOG_HOSTS, 3)
    components = rng.sample(_LOG_COMPONENTS, p.num_components)
    clock = datetime(2024, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59))
    records = []
    for _ in range(p.size):
        clock += timedelta(seconds=rng.randint(1, 90))
        level = rng.choices(_LEVELS, weights=(2, 5, 3, 3))[0]
        message = rng.choice(_LOG_MESSAGES[level]).format(n=rng.randint(1, 499))
        records.append(_LogRecord(clock.strftime("%Y-%m-%dT%H:%M:%SZ"), rng.choice(hosts), level,
                                  rng.choice(components), message))
    entries = [(r.line(), False) for r in records]
    if "logs.malformed" in active:
        bad_rng = _rng(p, "malformed")
        for _ in range(max(2, p.size // 8)):
            entries.insert(bad_rng.randint(0, len(entries)), (_malformed_line(bad_rng, bad_rng.choice(records)), True))
    const_rng = _rng(p, "constants")
    top = const_rng.randint(2, 4)
    first, last = const_rng.randint(p.size // 5, p.size // 3), const_rng.randint(2 * p.size // 3, 4 * p.size // 5)
    counted = records[first:last] if "logs.window" in active else records
    errors = [r for r in counted if r.level == "ERROR"]

    ranked = sorted(Counter(r.component for r in errors).items(), key=lambda item: (-item[1], item[0]))
    expected: dict[str, Any] = {
        "logs.counts": {level: sum(r.level == level for r in counted) for level in _LEVELS},
        "logs.malformed": [n for n, (_, bad) in enumerate(entries, start=1) if bad],
        "logs.ranking": [[name, number] for name, number in ranked[:top]],
        "logs.window": len(counted),
        "logs.hosts": dict(Counter(r.host for r in counted)),
        "logs.messages": len({re.sub(r"[0-9]+", "N", r.message) for r in errors}),
        "logs.csv": [[r.timestamp, r.host, r.component, r.message] for r in errors],
    }
    start, end = records[first].timestamp, records[last].timestamp
    constants = {"top": top} if "logs.ranking" in active else {}
    if "logs.window" in active:
        constants.update(start=start, end=end)
        counted_text = "The *counted records* are the well-formed records inside the time window (see **Time window**)."
    else:
        counted_text = "Every well-formed record is a *counted record*."
    intro = (
        "The file `/app/logs/app.log` is an application log, one entry per line. A *well-formed record* "
        "is a line of exactly the form `TIMESTAMP HOST LEVEL COMPONENT: MESSAGE`, fields separated by single "
        "spaces: TIMESTAMP is `YYYY-MM-DDTHH:MM:SSZ` (digits where the pattern has letters other than the "
        "literal `T` and `Z`), HOST is a non-empty word without spaces, LEVEL is one of `DEBUG`, `INFO`, "
        "`WARN`, `ERROR` (uppercase), COMPONENT is one or more lowercase letters `a`-`z` followed directly "
        f"by a colon, and MESSAGE is the non-empty rest of the line. {counted_text}\n\n"
        "Write your results to `/app/report.json` as one JSON object; the requirements below name its keys "
        "(other keys are ignored).")
    details = {
        "logs.counts": "Key `counts`: an object with exactly the keys `DEBUG`, `INFO`, `WARN` and `ERROR`, each "
                       "mapped to the number of counted records of that level (0 if there are none).",
        "logs.malformed": "Some lines are not well-formed records. Key `malformed`: the 1-based line numbers of "
                          "all such lines, in increasing order. They are never counted records.",
        "logs.ranking": "Key `top_error_components`: the components that have at least one counted `ERROR` "
                        "record, as `[COMPONENT, NUMBER]` pairs (NUMBER: its counted `ERROR` records), sorted by "
                        "NUMBER from highest to lowest and then by COMPONENT in byte order, keeping only the "
                        f"first {top} pairs.",
        "logs.window": f"The time window runs from START = `{start}` (included) to END = `{end}` (excluded): a "
                       "well-formed record is counted only if START <= TIMESTAMP < END (the timestamps compare "
                       "as strings). Every key except `malformed` considers counted records only.",
        "logs.hosts": "Key `hosts`: an object mapping each HOST that has at least one counted record to its "
                      "number of counted records.",
        "logs.messages": "Key `distinct_error_messages`: the number of distinct MESSAGE texts among the counted "
                         "`ERROR` records once every maximal run of decimal digits in them is replaced by the "
                         "single letter `N`.",
        "logs.csv": "Also write `/app/errors.csv`: the header row `timestamp,host,component,message`, then one "
                    "row per counted `ERROR` record in log order, with standard CSV quoting (a field holding "
                    "a comma or a double quote is enclosed in double quotes, inner quotes doubled).",
    }
    log_text = "".join(text + "\n" for text, _ in entries)
    return _Rendered(app={"logs/app.log": log_text.encode()}, intro=intro,
                     details={k: v for k, v in details.items() if k in active},
                     expected={k: v for k, v in expected.items() if k in active}, constants=constants)


_LOGS_ORACLE = _parts(
    (None, r'''
        import csv
        import json
        import re

        LINE = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) (\S+) (DEBUG|INFO|WARN|ERROR) ([a-z]+): (.+)")
        records, malformed = [], []
        with open("/app/logs/app.log", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                match = LINE.fullmatch(line.rstrip("\n"))
                if match:
                    records.append(match.groups())
                else:
                    malformed.append(number)
        report = {}
    '''),
    ("logs.malformed", r'''
        report["malformed"] = malformed
    '''),
    ("logs.window", r'''
        records = [r for r in records if P["start"] <= r[0] < P["end"]]
    '''),
    ("logs.counts", r'''
        report["counts"] = {level: sum(r[2] == level for r in records) for level in ("DEBUG", "INFO", "WARN", "ERROR")}
    '''),
    ("logs.ranking", r'''
        per_component = {}
        for r in records:
            if r[2] == "ERROR":
                per_component[r[3]] = per_component.get(r[3], 0) + 1
        ranked = sorted(per_component.items(), key=lambda item: (-item[1], item[0]))
        report["top_error_components"] = [[name, number] for name, number in ranked[: P["top"]]]
    '''),
    ("logs.hosts", r'''
        report["hosts"] = {}
        for r in records:
            report["hosts"][r[1]] = report["hosts"].get(r[1], 0) + 1
    '''),
    ("logs.messages", r'''
        report["distinct_error_messages"] = len({re.sub(r"[0-9]+", "N", r[4]) for r in records if r[2] == "ERROR"})
    '''),
    ("logs.csv", r'''
        with open("/app/errors.csv", "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["timestamp", "host", "component", "message"])
            writer.writerows([r[0], r[1], r[3], r[4]] for r in records if r[2] == "ERROR")
    '''),
    (None, r'''
        with open("/app/report.json", "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    '''),
)

_LOGS_CHECKS = _parts(
    (None, r'''
        import csv


        def report():
            data = load_json("/app/report.json")
            assert isinstance(data, dict), "/app/report.json must hold a JSON object"
            return data
    '''),
    ("logs.counts", r'''
        @check
        def check_logs_counts(exp):
            expect_equal(report().get("counts"), exp["logs.counts"], "counts")
    '''),
    ("logs.malformed", r'''
        @check
        def check_logs_malformed(exp):
            expect_equal(report().get("malformed"), exp["logs.malformed"], "malformed")
    '''),
    ("logs.ranking", r'''
        @check
        def check_logs_ranking(exp):
            expect_equal(report().get("top_error_components"), exp["logs.ranking"], "top_error_components")
    '''),
    ("logs.window", r'''
        @check
        def check_logs_window(exp):
            counts = report().get("counts")
            assert isinstance(counts, dict), "counts must be an object"
            expect_equal(sum(counts.values()), exp["logs.window"], "records inside the time window")
    '''),
    ("logs.hosts", r'''
        @check
        def check_logs_hosts(exp):
            expect_equal(report().get("hosts"), exp["logs.hosts"], "hosts")
    '''),
    ("logs.messages", r'''
        @check
        def check_logs_messages(exp):
            expect_equal(report().get("distinct_error_messages"), exp["logs.messages"], "distinct_error_messages")
    '''),
    ("logs.csv", r'''
        @check
        def check_logs_csv(exp):
            with open("/app/errors.csv", encoding="utf-8", newline="") as handle:
                rows = list(csv.reader(handle))
            expect_equal(rows, [["timestamp", "host", "component", "message"]] + exp["logs.csv"], "errors.csv rows")
    '''),
)


# ---------------------------------------------------------------------------------------------
# convert: data-format conversion (CSV -> JSON, with INI and JSON side files)


@dataclass(frozen=True)
class ConvertParams(FamilyParams):
    """Convert a CSV file of inventory records to JSON."""

    FAMILY: ClassVar[str] = "convert"
    size: int = 16
    """Number of data rows."""
    num_columns: int = 5
    """Number of CSV columns (``sku``, ``name``, ``category`` and ``qty`` always among them)."""


_CONVERT_CORE = ("sku", "name", "category", "qty")
_CONVERT_EXTRA = ("price", "active", "weight_kg", "rating", "supplier", "bin")
_CONVERT_TYPES = {"qty": "int", "rating": "int", "price": "float", "weight_kg": "float", "active": "bool"}
_CONVERT_RENAMES = {"name": "title", "category": "group", "qty": "quantity", "price": "unit_price",
                    "active": "enabled", "weight_kg": "weight", "rating": "stars", "supplier": "vendor",
                    "bin": "location"}
_CONVERT_DEFAULTS = {"currency": ("EUR", "USD", "GBP"), "source": ("batch-7", "batch-19", "import-3"),
                     "region": ("north", "south", "east"), "owner": ("ops", "sales", "stores")}
_ADJECTIVES = ("steel", "brass", "compact", "heavy", "folding", "spare", "blue", "round")
_NOUNS = ("bracket", "hinge", "lamp", "shelf", "bolt", "valve", "crate", "hose")
_CATEGORIES = ("tools", "garden", "kitchen", "office", "outdoor", "storage")
_SUPPLIERS = ("Acme", "Borealis", "Cobalt Works", "Dunmore")
_SUPPLIERS_QUOTED = ("Fenwick & Sons, Ltd.", 'Gale "North" Supply', "Harrow, Inc.")


def _convert_cell(rng: random.Random, column: str, sku: int, categories: list[str], quoted: bool) -> str:
    if column == "sku":
        return f"SKU-{sku}"
    if column == "name":
        name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        if quoted and rng.random() < 0.4:
            return rng.choice((f"{name}, large", f'{name} "pro"', f"{name}\nspare part"))
        return name
    if column == "supplier":
        return rng.choice(_SUPPLIERS + _SUPPLIERS_QUOTED if quoted else _SUPPLIERS)
    makers: dict[str, Callable[[], str]] = {
        "category": lambda: rng.choice(categories),
        "qty": lambda: str(rng.randint(0, 500)),
        "rating": lambda: str(rng.randint(1, 5)),
        "price": lambda: f"{rng.randint(50, 99999) / 100:.2f}",
        "weight_kg": lambda: f"{rng.randint(1, 50000) / 1000:.3f}",
        "active": lambda: rng.choice(("true", "false")),
        "bin": lambda: f"{rng.randint(1, 999):04d}",
    }
    return makers[column]()


def _needs_quotes(text: str) -> bool:
    return any(char in text for char in ',"\n')


def _csv_text(rows: list[list[str]], force: random.Random | None) -> str:
    """CSV with the minimal quoting, plus (with ``force``) some needlessly quoted fields: a
    parser that only splits on commas must fail on them."""
    def cell(text: str) -> str:
        quote = _needs_quotes(text) or (force is not None and text != "" and force.random() < 0.2)
        return '"' + text.replace('"', '""') + '"' if quote else text
    return "".join(",".join(cell(text) for text in row) + "\n" for row in rows)


def _typed(column: str, text: str, *, types: bool, missing: bool) -> Any:
    if missing and text == "":
        return None
    kind = _CONVERT_TYPES.get(column) if types else None
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text == "true"
    return text


def _render_convert(p: ConvertParams) -> _Rendered:
    active = set(describe_requirements(p))
    quoted, types, missing = ("convert.quoting" in active, "convert.types" in active, "convert.missing" in active)
    rng = _rng(p, "columns")
    others = [*_CONVERT_CORE[1:], *rng.sample(_CONVERT_EXTRA, p.num_columns - len(_CONVERT_CORE))]
    columns = ["sku", *rng.sample(others, len(others))]
    data_rng = _rng(p, "rows")
    categories = data_rng.sample(_CATEGORIES, 3)
    rows = [[_convert_cell(data_rng, c, sku, categories, quoted) for c in columns]
            for sku in data_rng.sample(range(10000, 100000), p.size)]
    name_at = columns.index("name")
    if quoted and not any(_needs_quotes(text) for row in rows for text in row):
        rows[0][name_at] += ", large"
    if missing:
        miss_rng = _rng(p, "missing")
        nullable = [i for i, c in enumerate(columns) if c not in ("sku", "category")]
        for row in rows:
            for i in nullable:
                if miss_rng.random() < 0.12:
                    row[i] = ""
        if not any(row[i] == "" for row in rows for i in nullable):
            rows[0][nullable[0]] = ""
    side_rng = _rng(p, "side-files")
    rename = {c: _CONVERT_RENAMES[c] for c in side_rng.sample(columns[1:], 2)}
    defaults = {key: side_rng.choice(values) for key, values in
                sorted(side_rng.sample(sorted(_CONVERT_DEFAULTS.items()), 2))}
    use_rename = "convert.rename" in active
    use_defaults = "convert.defaults" in active
    records = [{(rename.get(c, c) if use_rename else c): _typed(c, text, types=types, missing=missing)
                for c, text in zip(columns, row)} | (defaults if use_defaults else {}) for row in rows]

    app = {"data/records.csv": _csv_text([columns, *rows], _rng(p, "quoting") if quoted else None).encode()}
    if use_rename:
        app["data/rename.json"] = (json.dumps(rename, indent=2) + "\n").encode()
    if use_defaults:
        key_a, key_b = defaults
        app["data/defaults.ini"] = (f"; Values added to every converted record.\n[defaults]\n"
                                    f"{key_a} = {defaults[key_a]}\n# spacing around '=' varies\n"
                                    f"{key_b}   =   {defaults[key_b]}\n").encode()
    out_key = {c: (rename.get(c, c) if use_rename else c) for c in columns}
    typed_columns = [c for c in columns if c in _CONVERT_TYPES]
    expected: dict[str, Any] = {
        "records": records,
        "convert.quoting": [i for i, row in enumerate(rows) if any(_needs_quotes(text) for text in row)],
        "convert.types": [out_key[c] for c in typed_columns],
        "convert.missing": [[i, out_key[c]] for i, row in enumerate(rows) for c, text in zip(columns, row) if text == ""],
        "convert.rename": sorted(records[0]),
        "convert.defaults": defaults,
        "convert.summary": dict(Counter(row[columns.index("category")] for row in rows)),
    }

    def names(kind: str) -> str:
        return ", ".join(f"`{c}`" for c in typed_columns if _CONVERT_TYPES[c] == kind)
    kinds = [("int", "become JSON integers"), ("float", "hold decimals and become JSON numbers"),
             ("bool", "hold `true` or `false` and become JSON booleans")]
    typed_text = "; ".join(f"the column(s) {names(kind)} {what}" for kind, what in kinds if names(kind))
    overridden = bool(active & {"convert.types", "convert.missing", "convert.rename", "convert.defaults"})
    details = {
        "convert.rows": "Write `/app/out/records.json` (create `/app/out`): a JSON array with one object per data "
                        "row of the CSV, in file order, mapping each header name to the row's cell in that column "
                        "as a JSON string" + (", except where a requirement below says otherwise" if overridden
                                              else "") + ".",
        "convert.quoting": "Some fields are enclosed in double quotes, needed or not: they may contain commas, "
                           "double quotes (written twice, `\"\"`) and line breaks. A field's value is the text "
                           "between its quotes, with `\"\"` read as `\"`.",
        "convert.types": f"Typed values: {typed_text}. Every other column stays a JSON string, even when it looks "
                         "like a number (e.g. `0042`). Columns are named by their CSV header here.",
        "convert.missing": "Some cells are empty (never in the `sku` or `category` column); their value is JSON "
                           "`null`" + (", whatever the column's type" if types else "") + ".",
        "convert.rename": "`/app/data/rename.json` maps some CSV column names to the key to use for them in the "
                          "output objects; the other columns keep their header name.",
        "convert.defaults": "`/app/data/defaults.ini` has a `[defaults]` section: add each of its keys to every "
                            "object, with its value as a JSON string (spaces around `=` belong to neither).",
        "convert.jsonl": "Also write `/app/out/records.jsonl`: the same objects in the same order, one JSON "
                         "object per line.",
        "convert.summary": "Also write `/app/out/summary.json`: an object mapping each value of the CSV column "
                           "`category` to the number of data rows that have it.",
    }
    constants = {"types": {c: _CONVERT_TYPES[c] for c in typed_columns}} if types else {}
    intro = ("`/app/data/records.csv` is a CSV file of inventory records: comma-separated, the first line is "
             "the header and every record after it is one data row. Convert it to JSON.")
    return _Rendered(app=app, intro=intro, details={k: v for k, v in details.items() if k in active},
                     expected={k: v for k, v in expected.items() if k in active or k == "records"},
                     constants=constants)


_CONVERT_ORACLE = _parts(
    (None, r'''
        import configparser
        import csv
        import io
        import json
        import os

        with open("/app/data/records.csv", encoding="utf-8", newline="") as handle:
            text = handle.read()
        rows = [line.split(",") for line in text.splitlines()]
    '''),
    ("convert.quoting", r'''
        rows = list(csv.reader(io.StringIO(text)))
    '''),
    (None, r'''
        header, body = rows[0], rows[1:]
        records = [dict(zip(header, row)) for row in body]
        os.makedirs("/app/out", exist_ok=True)
    '''),
    ("convert.missing", r'''
        records = [{key: (None if value == "" else value) for key, value in record.items()} for record in records]
    '''),
    ("convert.types", r'''
        def typed(column, value):
            kind = P["types"].get(column)
            if value is None or kind is None:
                return value
            if kind == "int":
                return int(value)
            if kind == "float":
                return float(value)
            return value == "true"


        records = [{key: typed(key, value) for key, value in record.items()} for record in records]
    '''),
    ("convert.summary", r'''
        summary = {}
        for record in records:
            summary[record["category"]] = summary.get(record["category"], 0) + 1
        with open("/app/out/summary.json", "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
    '''),
    ("convert.rename", r'''
        with open("/app/data/rename.json", encoding="utf-8") as handle:
            mapping = json.load(handle)
        records = [{mapping.get(key, key): value for key, value in record.items()} for record in records]
    '''),
    ("convert.defaults", r'''
        parser = configparser.ConfigParser(interpolation=None)
        with open("/app/data/defaults.ini", encoding="utf-8") as handle:
            parser.read_file(handle)
        for record in records:
            record.update(parser["defaults"])
    '''),
    ("convert.rows", r'''
        with open("/app/out/records.json", "w", encoding="utf-8") as handle:
            json.dump(records, handle, indent=2)
    '''),
    ("convert.jsonl", r'''
        with open("/app/out/records.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
    '''),
)

_CONVERT_CHECKS = _parts(
    (None, r'''
        def records(path="/app/out/records.json"):
            data = load_json(path)
            assert isinstance(data, list), f"{path} must hold a JSON array"
            assert len(data) == len(EXPECTED["records"]), f"{path} must hold one object per data row"
            assert all(isinstance(item, dict) for item in data), f"{path} must hold objects"
            return data
    '''),
    ("convert.rows", r'''
        @check
        def check_convert_rows(exp):
            expect_equal(records(), exp["records"], "records.json")
    '''),
    ("convert.quoting", r'''
        @check
        def check_convert_quoting(exp):
            got = records()
            for index in exp["convert.quoting"]:
                expect_equal(got[index], exp["records"][index], f"record {index} (it has quoted fields)")
    '''),
    ("convert.types", r'''
        @check
        def check_convert_types(exp):
            for index, (got, want) in enumerate(zip(records(), exp["records"])):
                for key in exp["convert.types"]:
                    expect_equal(got.get(key), want[key], f"record {index} key {key}")
    '''),
    ("convert.missing", r'''
        @check
        def check_convert_missing(exp):
            got = records()
            for index, key in exp["convert.missing"]:
                assert key in got[index] and got[index][key] is None, f"record {index} key {key} must be null"
    '''),
    ("convert.rename", r'''
        @check
        def check_convert_rename(exp):
            for index, got in enumerate(records()):
                expect_equal(sorted(got), exp["convert.rename"], f"keys of record {index}")
    '''),
    ("convert.defaults", r'''
        @check
        def check_convert_defaults(exp):
            for index, got in enumerate(records()):
                for key, value in exp["convert.defaults"].items():
                    expect_equal(got.get(key), value, f"record {index} key {key}")
    '''),
    ("convert.jsonl", r'''
        @check
        def check_convert_jsonl(exp):
            with open("/app/out/records.jsonl", encoding="utf-8") as handle:
                got = [json.loads(line) for line in handle.read().splitlines() if line.strip()]
            expect_equal(got, exp["records"], "records.jsonl")
    '''),
    ("convert.summary", r'''
        @check
        def check_convert_summary(exp):
            expect_equal(load_json("/app/out/summary.json"), exp["convert.summary"], "summary.json")
    '''),
)


# ---------------------------------------------------------------------------------------------
# repair: file-system repair against a manifest


@dataclass(frozen=True)
class RepairParams(FamilyParams):
    """Put a disordered site tree back into the layout its manifest describes."""

    FAMILY: ClassVar[str] = "repair"
    size: int = 10
    """Number of files the manifest lists."""
    num_broken: int = 2
    """Number of misplaced files (at most half of ``size``); damaged files are half as many."""


_SITE_DIRS = {"docs": "md", "docs/guide": "md", "assets/css": "css", "assets/img": "svg", "data/2023": "csv",
              "data/2024": "csv", "config": "toml", "scripts": "sh"}
_SITE_STEMS = ("intro", "setup", "faq", "main", "theme", "logo", "q1", "q2", "report", "deploy", "notes",
               "usage", "index", "changes", "summary", "budget")
_SITE_STRAYS = ("notes.tmp", "docs/.DS_Store", "assets/Thumbs.db", "scratch/todo.txt", "docs/guide/draft~")
_PROSE = ("alpha", "delta", "ledger", "orbit", "prism", "quartz", "signal", "tundra", "vector", "willow")


def _site_content(rng: random.Random) -> bytes:
    lines = [" ".join(rng.choice(_PROSE) for _ in range(rng.randint(3, 8))) for _ in range(rng.randint(2, 5))]
    return ("\n".join(lines) + f"\nid {rng.getrandbits(48):012x}\n").encode()


def _wrong_path(rng: random.Random, path: str, taken: set[str]) -> str:
    """A plausible wrong place for ``path`` (wrong folder, case, suffix or copy name) not yet used."""
    folder, name = path.rsplit("/", 1)
    stem, ext = name.rsplit(".", 1)
    other = rng.choice(sorted(set(_SITE_DIRS) - {folder}))
    options = [name, f"{folder}/{stem.capitalize()}.{ext.upper()}", f"{folder}/{name}.bak",
               f"misc/{stem}-old.{ext}", f"{other}/{name}", f"{folder}/{stem} (1).{ext}"]
    rng.shuffle(options)
    choice = next((option for option in options if option not in taken), None)
    number = 2
    while choice is None or choice in taken:
        choice, number = f"misc/{stem}-{number}.{ext}", number + 1
    taken.add(choice)
    return choice


def _render_repair(p: RepairParams) -> _Rendered:
    active = set(describe_requirements(p))
    rng = _rng(p, "layout")
    paths = sorted(rng.sample([f"{d}/{s}.{e}" for d, e in _SITE_DIRS.items() for s in _SITE_STEMS], p.size))
    contents = {path: _site_content(rng) for path in paths}
    digests = {path: hashlib.sha256(data).hexdigest() for path, data in contents.items()}
    broken_rng = _rng(p, "broken")
    misplaced = broken_rng.sample(paths, min(p.num_broken, p.size // 2))
    taken = set(paths)
    site = {path: contents[path] for path in paths if path not in misplaced}
    for path in misplaced:
        site[_wrong_path(broken_rng, path, taken)] = contents[path]
    if "repair.extras" in active:
        for path in broken_rng.sample(paths, len(misplaced) // 2 + 1):
            site[_wrong_path(broken_rng, path, taken)] = contents[path]
        for stray in broken_rng.sample(_SITE_STRAYS, 2):
            site[stray] = f"scratch {broken_rng.getrandbits(32):08x}\n".encode()
    damaged: list[str] = []
    backup: dict[str, bytes] = {}
    if "repair.backup" in active:
        damaged = sorted(broken_rng.sample([path for path in paths if path not in misplaced], max(1, len(misplaced) // 2)))
        for path in damaged:
            site[path] = contents[path][: len(contents[path]) // 2]
        spares = [contents[path] for path in damaged] + [_site_content(broken_rng) for _ in range(2)]
        broken_rng.shuffle(spares)
        backup = {f"backup/restore-{number:03d}.dat": data for number, data in enumerate(spares, start=1)}

    app = {"manifest.tsv": "".join(f"{path}\t{digests[path]}\n" for path in paths).encode(),
           **{f"site/{path}": data for path, data in site.items()}, **backup}
    expected = {
        "manifest": [[path, digests[path]] for path in paths],
        "repair.backup": [[path, digests[path]] for path in damaged],
        "repair.report": sorted(misplaced + damaged),
        "repair.index": [f"{path}\t{len(contents[path])}" for path in paths],
        "repair.checksums": [f"{digests[path]}  {path}" for path in paths],
    }
    backup_note = " `/app/backup/` holds spare copies of some files." if backup else ""
    intro = ("`/app/site` is a small web site whose files are in disarray. `/app/manifest.tsv` lists the layout "
             "it must have: one line `PATH<TAB>SHA256` per file, where PATH is relative to `/app/site` and SHA256 "
             f"is the lowercase hex SHA-256 digest of the file's content.{backup_note} Work in place: move, copy, "
             "rename or delete files as you need (file names may contain spaces and parentheses).")
    details = {
        "repair.placement": "Every PATH of the manifest must exist under `/app/site` as a regular file (not a "
                            "link) whose content has the listed digest. Some of these files now sit under a wrong "
                            "name or in a wrong folder of `/app/site`, with their content intact"
                            + ("; others are damaged (see **Damaged files**)" if damaged else "") + ".",
        "repair.extras": "`/app/site` also holds duplicate copies of manifest files and stray files the manifest "
                         "does not list. When you are done it must contain exactly the files of the manifest: no "
                         "other file (hidden files included) and no empty folder.",
        "repair.backup": "Some files at their manifest PATH have damaged content (their digest differs from the "
                         "manifest's). An intact copy of each is in `/app/backup/` under another name, next to "
                         "files that match no manifest digest; restore every damaged file from its intact copy.",
        "repair.report": "Write `/app/repair_report.txt`: the manifest PATHs that did not already hold a file "
                         "with the listed digest when you started, one per line, sorted in byte order.",
        "repair.index": "Write `/app/index.tsv`: one line `PATH<TAB>SIZE` per manifest PATH, sorted by PATH in "
                        "byte order, where SIZE is the file's size in bytes.",
        "repair.checksums": "Write `/app/SHA256SUMS` in the format `sha256sum` prints: one line `SHA256  PATH` "
                            "(two spaces) per manifest PATH, sorted by PATH in byte order.",
    }
    return _Rendered(app=app, intro=intro, details={k: v for k, v in details.items() if k in active},
                     expected={k: v for k, v in expected.items() if k in active or k == "manifest"})


_REPAIR_ORACLE = _parts(
    (None, r'''
        import hashlib
        import os

        SITE = "/app/site"


        def read(path):
            with open(path, "rb") as handle:
                return handle.read()


        def digest(data):
            return hashlib.sha256(data).hexdigest()


        def files_under(root):
            return sorted(os.path.relpath(os.path.join(folder, name), root)
                          for folder, _, names in os.walk(root) for name in names)


        def holds(path, want):
            full = os.path.join(SITE, path)
            return os.path.isfile(full) and digest(read(full)) == want


        with open("/app/manifest.tsv", encoding="utf-8") as handle:
            manifest = [line.split("\t") for line in handle.read().splitlines() if line]
        wanted = dict(manifest)
        initially_bad = sorted(path for path, want in manifest if not holds(path, want))
        store = {}
        for rel in files_under(SITE):
            data = read(os.path.join(SITE, rel))
            store.setdefault(digest(data), data)
    '''),
    ("repair.backup", r'''
        for rel in files_under("/app/backup"):
            data = read(os.path.join("/app/backup", rel))
            store.setdefault(digest(data), data)
    '''),
    ("repair.placement", r'''
        for path, want in manifest:
            if not holds(path, want):
                full = os.path.join(SITE, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as handle:
                    handle.write(store[want])
        for rel in files_under(SITE):
            if rel not in wanted and digest(read(os.path.join(SITE, rel))) in set(wanted.values()):
                os.remove(os.path.join(SITE, rel))
    '''),
    ("repair.extras", r'''
        for rel in files_under(SITE):
            if rel not in wanted:
                os.remove(os.path.join(SITE, rel))
        for folder, _, _ in os.walk(SITE, topdown=False):
            if folder != SITE and not os.listdir(folder):
                os.rmdir(folder)
    '''),
    ("repair.report", r'''
        with open("/app/repair_report.txt", "w", encoding="utf-8") as handle:
            handle.writelines(path + "\n" for path in initially_bad)
    '''),
    ("repair.index", r'''
        with open("/app/index.tsv", "w", encoding="utf-8") as handle:
            handle.writelines(f"{path}\t{len(read(os.path.join(SITE, path)))}\n" for path in sorted(wanted))
    '''),
    ("repair.checksums", r'''
        with open("/app/SHA256SUMS", "w", encoding="utf-8") as handle:
            handle.writelines(f"{wanted[path]}  {path}\n" for path in sorted(wanted))
    '''),
)

_REPAIR_CHECKS = _parts(
    (None, r'''
        import hashlib

        SITE = "/app/site"


        def expect_files(entries, what):
            for path, want in entries:
                full = os.path.join(SITE, path)
                assert os.path.isfile(full) and not os.path.islink(full), f"{what}: {path} is missing or not a regular file"
                with open(full, "rb") as handle:
                    assert hashlib.sha256(handle.read()).hexdigest() == want, f"{what}: {path} has the wrong content"
    '''),
    ("repair.placement", r'''
        @check
        def check_repair_placement(exp):
            expect_files(exp["manifest"], "manifest placement")
    '''),
    ("repair.extras", r'''
        @check
        def check_repair_extras(exp):
            found = []
            for folder, subfolders, names in os.walk(SITE):
                assert subfolders or names, f"empty folder {folder}"
                found += [os.path.relpath(os.path.join(folder, name), SITE) for name in names]
                found += [os.path.relpath(os.path.join(folder, name), SITE) for name in subfolders
                          if os.path.islink(os.path.join(folder, name))]
            expect_equal(sorted(found), sorted(path for path, _ in exp["manifest"]), "files under /app/site")
    '''),
    ("repair.backup", r'''
        @check
        def check_repair_backup(exp):
            expect_files(exp["repair.backup"], "damaged files")
    '''),
    ("repair.report", r'''
        @check
        def check_repair_report(exp):
            expect_equal(text_lines("/app/repair_report.txt"), exp["repair.report"], "repair_report.txt")
    '''),
    ("repair.index", r'''
        @check
        def check_repair_index(exp):
            expect_equal(text_lines("/app/index.tsv"), exp["repair.index"], "index.tsv")
    '''),
    ("repair.checksums", r'''
        @check
        def check_repair_checksums(exp):
            expect_equal(text_lines("/app/SHA256SUMS"), exp["repair.checksums"], "SHA256SUMS")
    '''),
)


# ---------------------------------------------------------------------------------------------
# script: write a small command-line tool with a given behaviour


@dataclass(frozen=True)
class ScriptParams(FamilyParams):
    """Write ``/app/bin/tally``, a word-frequency tool, to a behaviour the hidden cases probe."""

    FAMILY: ClassVar[str] = "script"
    size: int = 60
    """Words per generated input text."""
    num_cases: int = 3
    """Number of hidden cases of the core behaviour (each other requirement adds its own)."""


_TALLY_WORDS = ("the", "a", "of", "to", "in", "river", "stone", "light", "north", "ember", "quiet", "lantern",
                "harbor", "meadow", "signal", "orbit", "copper", "willow")
_TALLY_SEPARATORS = (" ", " ", " ", ", ", ". ", "\n", " - ", "; ")
_NO_WORDS = "1234 -- 5678 !!\n"
_TALLY_VALUED = ("--top", "--min-length")
_TALLY_FLAGS = {"script.top": "--top", "script.fold": "-i", "script.minlen": "--min-length", "script.json": "--json"}


def _tally_text(rng: random.Random, num_words: int) -> str:
    """Text with capitalised, uppercase, possessive and digit-suffixed words, so that the word
    definition, case and tie rules all matter."""
    pieces = []
    for _ in range(num_words):
        word, shape = rng.choice(_TALLY_WORDS), rng.random()
        if shape < 0.15:
            word = word.capitalize()
        elif shape < 0.2:
            word = word.upper()
        elif shape < 0.25:
            word += "'s"
        elif shape < 0.3:
            word += str(rng.randint(1, 99))
        pieces.append(word + rng.choice(_TALLY_SEPARATORS))
    return "".join(pieces)


def _tally_output(texts: list[str], options: dict[str, str | bool]) -> str:
    """The reference behaviour the instruction specifies (the oracle is written separately)."""
    fold, min_length = "-i" in options, int(options.get("--min-length", 1))
    counts: Counter[str] = Counter()
    for text in texts:
        words = re.findall(r"[A-Za-z]+", text)
        counts.update(word.lower() if fold else word for word in words if len(word) >= min_length)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if "--top" in options:
        ranked = ranked[: int(options["--top"])]
    if "--json" in options:
        return json.dumps([{"word": word, "count": count} for word, count in ranked]) + "\n"
    return "".join(f"{count}\t{word}\n" for word, count in ranked)


def _tally_case(flags: list[str], files: dict[str, str], sources: list[str], stdin: str | None = None) -> dict:
    options: dict[str, str | bool] = {}
    tokens = list(flags)
    while tokens:
        flag = tokens.pop(0)
        options[flag] = tokens.pop(0) if flag in _TALLY_VALUED else True
    texts = [(stdin or "") if name == "-" else files[name] for name in (sources or ["-"])]
    return {"args": flags + sources, "files": files, "stdin": stdin, "code": 0,
            "stdout": _tally_output(texts, options), "json": "--json" in options}


def _tally_error(args: list[str], files: dict[str, str]) -> dict:
    return {"args": args, "files": files, "stdin": None, "code": 2, "stdout": "", "json": False}


def _render_script(p: ScriptParams) -> _Rendered:
    active = set(describe_requirements(p))
    rng = _rng(p, "cases")

    def one_file(flags: list[str]) -> dict:
        return _tally_case(flags, {"input.txt": _tally_text(rng, p.size)}, ["input.txt"])

    groups = {"script.top": ["--top", str(rng.randint(2, 5))], "script.fold": ["-i"],
              "script.minlen": ["--min-length", str(rng.randint(3, 5))], "script.json": ["--json"]}
    options = [req for req in groups if req in active]
    cases = {"script.count": [one_file([]) for _ in range(p.num_cases - 1)]
             + [_tally_case([], {"empty.txt": _NO_WORDS}, ["empty.txt"])]}
    if len(options) >= 2:
        chosen = rng.sample(options, len(options))
        cases["script.count"].append(one_file([token for req in chosen for token in groups[req]]))
    texts = [_tally_text(rng, p.size) for _ in range(4)]
    error_files = {"input.txt": texts[0]}
    cases.update({
        "script.top": [one_file(["--top", "1"]), one_file(["--top", str(rng.randint(2, 5))]), one_file(["--top", "1000"])],
        "script.errors": [_tally_error(["missing.txt"], error_files)]
        + ([_tally_error(["--top", "0", "input.txt"], error_files), _tally_error(["--top", "many", "input.txt"], error_files)]
           if "script.top" in active else [])
        + ([_tally_error(["--min-length", "-1", "input.txt"], error_files)] if "script.minlen" in active else []),
        "script.stdin": [_tally_case([], {"a.txt": texts[0], "b.txt": texts[1]}, ["a.txt", "-", "b.txt"], texts[2]),
                         _tally_case([], {}, [], texts[3])],
        "script.fold": [one_file(["-i"]), one_file(["-i", *groups["script.top"]] if "script.top" in active else ["-i"])],
        "script.minlen": [one_file(groups["script.minlen"]), one_file(["--min-length", "2"])],
        "script.json": [one_file(["--json"]), _tally_case(["--json"], {"empty.txt": _NO_WORDS}, ["empty.txt"])],
    })
    sample = _tally_text(_rng(p, "sample"), 24)
    app = {"examples/sample.txt": sample.encode(), "examples/sample.out": _tally_output([sample], {}).encode()}
    usage = "`/app/bin/tally " + ("[OPTIONS] " if options else "") + (
        "[FILE...]`" if "script.stdin" in active else "FILE`")
    intro = ("Write an executable script `/app/bin/tally` (create `/app/bin`; use bash, or Python 3 with its "
             "standard library and a `#!/usr/bin/env python3` first line). It is run from any working directory "
             f"as {usage}. `/app/examples/sample.txt` is a sample input and `/app/examples/sample.out` what "
             "`tally` prints for it. Hidden cases run your script on other inputs.")
    invalid_values = [f"the value of `{groups[req][0]}`" for req in ("script.top", "script.minlen") if req in active]
    details = {
        "script.count": "`tally FILE` reads the text file FILE. A word is a maximal run of ASCII letters "
                        "(`A`-`Z`, `a`-`z`); every other character separates words, and words are case-sensitive. "
                        "Print one line `COUNT<TAB>WORD` per distinct word, COUNT being how often it occurs, sorted "
                        "by COUNT from highest to lowest and then by WORD in byte order (uppercase before "
                        "lowercase), every line ending with a newline; print nothing when there is no word; exit "
                        "with status 0." + (" Options come before the file arguments, in any order, and may be "
                                            "combined." if options else ""),
        "script.top": "Option `--top N` (N a positive integer, the next argument) prints only the first N lines of "
                      "the result (all of them when there are fewer).",
        "script.errors": "If a FILE does not exist or is not a readable file"
                         + "".join(f", or {text} is not a positive decimal integer (e.g. `0`, `-1` or `many`)"
                                   for text in invalid_values)
                         + ": print a message starting with `tally: ` to standard error, print nothing to standard "
                           "output, and exit with status 2.",
        "script.stdin": "`tally` accepts any number of FILE arguments and counts the words of all of them together "
                        "(a word never spans two inputs); the argument `-` stands for standard input, and with no "
                        "FILE argument at all it reads standard input.",
        "script.fold": "Option `-i` counts case-insensitively: words are lowercased before they are counted and "
                       "printed lowercased.",
        "script.minlen": "Option `--min-length L` (L a positive integer, the next argument) counts only words of "
                         "at least L letters.",
        "script.json": "Option `--json` prints, instead of the lines, one JSON array of objects "
                       "`{\"word\": WORD, \"count\": COUNT}` in the same order, followed by a newline; the other "
                       "options apply to it as to the lines.",
    }
    return _Rendered(app=app, intro=intro, details={k: v for k, v in details.items() if k in active},
                     expected={k: v for k, v in cases.items() if k in active})


_SCRIPT_SOLVE = """#!/bin/bash
# Oracle solution, generated by envsched_jax.forge.families: writes the tool the task asks for.
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/tally <<'ORACLE'
#!/usr/bin/env python3
{program}ORACLE
chmod +x /app/bin/tally
"""

_SCRIPT_ORACLE = _parts(
    (None, r'''
        import json
        import os
        import re
        import sys

        OPTIONS = {}
    '''),
    ("script.top", r'''
        OPTIONS["--top"] = True
    '''),
    ("script.fold", r'''
        OPTIONS["-i"] = False
    '''),
    ("script.minlen", r'''
        OPTIONS["--min-length"] = True
    '''),
    ("script.json", r'''
        OPTIONS["--json"] = False
    '''),
    ("script.count", r'''
        def fail(message):
            sys.stderr.write("tally: " + message + "\n")
            sys.exit(2)


        args, opts = sys.argv[1:], {}
        while args and args[0] in OPTIONS:
            flag = args.pop(0)
            if OPTIONS[flag]:
                if not args:
                    fail(flag + " needs a value")
                opts[flag] = args.pop(0)
            else:
                opts[flag] = True


        def read(name):
            with open(name, encoding="utf-8") as handle:
                return handle.read()


        sources = args[:1]
    '''),
    ("script.stdin", r'''
        def read(name, read_file=read):
            return sys.stdin.read() if name == "-" else read_file(name)


        sources = args or ["-"]
    '''),
    ("script.errors", r'''
        for flag in ("--top", "--min-length"):
            if flag in opts and not (opts[flag].isdigit() and int(opts[flag]) > 0):
                fail(flag + " needs a positive integer, got " + repr(opts[flag]))
        for name in sources:
            if name != "-" and not (os.path.isfile(name) and os.access(name, os.R_OK)):
                fail("cannot read " + name)
    '''),
    ("script.count", r'''
        words = []
        for name in sources:
            words += re.findall(r"[A-Za-z]+", read(name))
    '''),
    ("script.fold", r'''
        if "-i" in opts:
            words = [word.lower() for word in words]
    '''),
    ("script.minlen", r'''
        if "--min-length" in opts:
            words = [word for word in words if len(word) >= int(opts["--min-length"])]
    '''),
    ("script.count", r'''
        counts = {}
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    '''),
    ("script.top", r'''
        if "--top" in opts:
            ranked = ranked[: int(opts["--top"])]
    '''),
    ("script.count", r'''
        output = "".join(f"{count}\t{word}\n" for word, count in ranked)
    '''),
    ("script.json", r'''
        if "--json" in opts:
            output = json.dumps([{"word": word, "count": count} for word, count in ranked]) + "\n"
    '''),
    ("script.count", r'''
        sys.stdout.write(output)
    '''),
)

_SCRIPT_CHECKS = _parts(
    (None, r'''
        import subprocess
        import tempfile

        TALLY = "/app/bin/tally"


        def run_cases(cases):
            assert os.path.isfile(TALLY) and os.access(TALLY, os.X_OK), f"{TALLY} is missing or not executable"
            for number, case in enumerate(cases):
                with tempfile.TemporaryDirectory() as work:
                    for name, text in case["files"].items():
                        with open(os.path.join(work, name), "w", encoding="utf-8") as handle:
                            handle.write(text)
                    proc = subprocess.run([TALLY, *case["args"]], cwd=work, input=case["stdin"] or "",
                                          capture_output=True, text=True, encoding="utf-8", timeout=30)
                where = f"case {number} (tally {' '.join(case['args'])})"
                assert proc.returncode == case["code"], (
                    f"{where}: exit status {proc.returncode}, expected {case['code']}; stderr {proc.stderr[-300:]!r}")
                if case["code"] != 0:
                    assert proc.stdout == "", f"{where}: standard output must be empty, got {proc.stdout[:200]!r}"
                    assert proc.stderr.startswith("tally: "), f"{where}: stderr must start with 'tally: '"
                elif case["json"]:
                    expect_equal(json.loads(proc.stdout), json.loads(case["stdout"]), where)
                else:
                    assert proc.stdout == case["stdout"], (
                        f"{where}: printed {proc.stdout[:300]!r}, expected {case['stdout'][:300]!r}")
    '''),
    ("script.count", r'''
        @check
        def check_script_count(exp):
            run_cases(exp["script.count"])
    '''),
    ("script.top", r'''
        @check
        def check_script_top(exp):
            run_cases(exp["script.top"])
    '''),
    ("script.errors", r'''
        @check
        def check_script_errors(exp):
            run_cases(exp["script.errors"])
    '''),
    ("script.stdin", r'''
        @check
        def check_script_stdin(exp):
            run_cases(exp["script.stdin"])
    '''),
    ("script.fold", r'''
        @check
        def check_script_fold(exp):
            run_cases(exp["script.fold"])
    '''),
    ("script.minlen", r'''
        @check
        def check_script_minlen(exp):
            run_cases(exp["script.minlen"])
    '''),
    ("script.json", r'''
        @check
        def check_script_json(exp):
            run_cases(exp["script.json"])
    '''),
)


# ---------------------------------------------------------------------------------------------
# config: configuration validation and repair


@dataclass(frozen=True)
class ConfigParams(FamilyParams):
    """Find (and fix) the invalid entries of an INI file against a table of rules."""

    FAMILY: ClassVar[str] = "config"
    num_rules: int = 6
    """Number of table entries present in the file (each with its rule)."""
    num_invalid: int = 2
    """Number of entries that break their own rule (capped by the entries available)."""


@dataclass(frozen=True)
class _ConfigRule:
    name: str
    kind: str
    """``int`` (arg: low, high), ``host``, ``bool``, ``prefix`` (arg: prefix), ``number``,
    ``choice`` (arg: options) or ``path``."""
    arg: tuple[Any, ...]
    default: str
    valid: tuple[str, ...]
    invalid: tuple[str, ...]

    def describe(self) -> str:
        if self.kind == "int":
            return f"a decimal integer from {self.arg[0]} to {self.arg[1]}"
        if self.kind in ("choice", "bool"):
            return "one of " + ", ".join(f"`{option}`" for option in self.arg)
        if self.kind == "prefix":
            return f"starts with `{self.arg[0]}`, followed by at least one more character"
        return {"host": "a host name: lowercase letters, digits, `.` and `-`, starting and ending with a letter "
                        "or digit",
                "number": "a decimal number greater than 0 (digits, optionally `.` and more digits)",
                "path": "an absolute path: starts with `/`, no whitespace"}[self.kind]


_CONFIG_RULES = (
    _ConfigRule("server.host", "host", (), "localhost", ("api.internal", "web-01", "10.0.0.12", "edge3.example.org"),
                ("web_01", "-edge", "Web.Local", "node.")),
    _ConfigRule("server.port", "int", (1024, 65535), "8080", (), ("80", "70000", "80a", "")),
    _ConfigRule("server.workers", "int", (1, 64), "4", (), ("0", "65", "four", "-2")),
    _ConfigRule("server.tls", "bool", ("true", "false"), "false", ("true", "false"), ("yes", "True", "1", "on")),
    _ConfigRule("database.url", "prefix", ("postgres://",), "postgres://localhost/app",
                ("postgres://db.internal/orders", "postgres://10.0.0.5:5432/app"),
                ("mysql://db/app", "postgres:/db/app", "db.internal/app", "postgres://")),
    _ConfigRule("database.pool_size", "int", (1, 100), "10", (), ("0", "101", "ten")),
    _ConfigRule("database.timeout_sec", "number", (), "30", ("5", "2.5", "30", "0.75"), ("0", "-5", "fast", "1e3")),
    _ConfigRule("cache.backend", "choice", ("memory", "redis", "memcached"), "memory", ("memory", "redis", "memcached"),
                ("Redis", "disk", "memcache")),
    _ConfigRule("cache.ttl_sec", "int", (0, 86400), "300", (), ("-1", "90000", "5m")),
    _ConfigRule("logging.level", "choice", ("debug", "info", "warning", "error"), "info",
                ("debug", "info", "warning", "error"), ("verbose", "WARN", "warn")),
    _ConfigRule("logging.file", "path", (), "/var/log/app.log", ("/var/log/service.log", "/tmp/app.log"),
                ("logs/app.log", "~/app.log", "var/log/x")),
)
_CONFIG_SECTIONS = ("server", "database", "cache", "logging")
_CONFIG_TYPOS = {"server": ("prot", "wokers"), "database": ("retries", "pool"), "cache": ("tll_sec",),
                 "logging": ("colour",)}
_CROSS_PAIR = ("server.workers", "database.pool_size")


def _valid_value(rng: random.Random, rule: _ConfigRule) -> str:
    return str(rng.randint(*rule.arg)) if rule.kind == "int" else rng.choice(rule.valid)


def _render_config(p: ConfigParams) -> _Rendered:
    active = set(describe_requirements(p))
    cross, fix = "config.cross" in active, "config.fix" in active
    rng = _rng(p, "rules")
    pinned = [r for r in _CONFIG_RULES if cross and r.name in _CROSS_PAIR]
    chosen_names = {r.name for r in pinned + rng.sample([r for r in _CONFIG_RULES if r not in pinned],
                                                        p.num_rules - len(pinned))}
    chosen = [r for r in _CONFIG_RULES if r.name in chosen_names]
    value_rng = _rng(p, "values")
    breakable = [r for r in chosen if r not in pinned]
    broken = {r.name for r in value_rng.sample(breakable, min(p.num_invalid, len(breakable)))}
    values = {r.name: value_rng.choice(r.invalid) if r.name in broken else _valid_value(value_rng, r) for r in chosen}
    if cross:
        workers = value_rng.randint(8, 64)
        values.update({"server.workers": str(workers), "database.pool_size": str(value_rng.randint(1, workers - 1))})
    unknown: dict[str, str] = {}
    if "config.unknown" in active:
        sections = sorted({name.split(".")[0] for name in values})
        typos = [f"{section}.{key}" for section in sections for key in _CONFIG_TYPOS[section]]
        unknown = {name: value_rng.choice(("yes", "3", "blue", "on")) for name in value_rng.sample(typos, 2)}
    entries = {**values, **unknown}

    layout_rng = _rng(p, "layout")
    lines = ["# Service configuration.", ""]
    present = [s for s in _CONFIG_SECTIONS if any(name.split(".")[0] == s for name in entries)]
    for section in present:
        lines.append(f"[{section}]")
        if layout_rng.random() < 0.5:
            lines.append(f"; {section} settings")
        keys = [name for name in entries if name.split(".")[0] == section]
        for name in layout_rng.sample(keys, len(keys)):
            form = layout_rng.choice(("{k} = {v}", "{k}={v}", "{k}  =  {v}"))
            lines.append(form.format(k=name.split(".", 1)[1], v=entries[name]).rstrip())
        lines.append("")

    invalid = sorted(broken | ({"database.pool_size"} if cross else set()))
    repaired = {**entries, **{name: next(r.default for r in chosen if r.name == name) for name in broken}}
    if cross:
        repaired["database.pool_size"] = values["server.workers"]
    expected = {
        "config.report": invalid,
        "config.fix": {s: {n.split(".", 1)[1]: v for n, v in repaired.items() if n.split(".")[0] == s} for s in present},
        "config.cross": {"name": "database.pool_size", "value": values.get("server.workers")},
        "config.json_report": {name: values[name] for name in invalid},
        "config.unknown": sorted(unknown),
        "config.summary": [f"{s} {sum(n.split('.')[0] == s for n in entries)}" for s in sorted(present)],
    }
    header = "| entry | rule |" + (" default |" if fix else "") + "\n| --- | --- |" + (" --- |" if fix else "")
    table = "\n".join(f"| `{r.name}` | {r.describe()} |" + (f" `{r.default}` |" if fix else "") for r in chosen)
    intro = ("`/app/config/service.ini` configures a service. It is an INI file: sections `[NAME]`, entries "
             "`KEY = VALUE` (spaces around `=` belong to neither), comment lines starting with `#` or `;`. An "
             "entry is named `SECTION.KEY`. Each entry of the table below must satisfy its rule; an entry whose "
             f"value breaks its rule is *invalid*.\n\n{header}\n{table}")
    details = {
        "config.report": "Write `/app/invalid.txt`: the name `SECTION.KEY` of every invalid entry, one per line, "
                         "sorted in byte order.",
        "config.fix": "Repair `/app/config/service.ini` in place: set every invalid entry to its default from the "
                      "table and keep every other entry with its value unchanged (comments, spacing and order may "
                      "change; the file must stay readable by Python's `configparser`).",
        "config.cross": "`server.workers` must not be greater than `database.pool_size`. This is checked only when "
                        "both entries satisfy their own rules; when it fails, `database.pool_size` is invalid too, "
                        "and its repair sets it to the value of `server.workers` instead of the default.",
        "config.json_report": "Also write `/app/invalid.json`: a JSON object mapping the name of each invalid entry "
                              "to its value in the original file (a string).",
        "config.unknown": "The file also has keys that are not in the table. Write `/app/unknown.txt`: their names "
                          "`SECTION.KEY`, one per line, sorted in byte order. They are not invalid entries"
                          + ("; keep them in the file, unchanged, when you repair it" if fix else "") + ".",
        "config.summary": "Write `/app/sections.txt`: one line `SECTION COUNT` per section of the original file, "
                          "sorted by section name, where COUNT is the number of keys in that section (keys that "
                          "are not in the table included).",
    }
    rules = {r.name: {"kind": r.kind, "arg": list(r.arg)} | ({"default": r.default} if fix else {}) for r in chosen}
    return _Rendered(app={"config/service.ini": ("\n".join(lines) + "\n").encode()}, intro=intro,
                     details={k: v for k, v in details.items() if k in active},
                     expected={k: v for k, v in expected.items() if k in active}, constants={"rules": rules})


_CONFIG_ORACLE = _parts(
    (None, r'''
        import configparser
        import json
        import re

        parser = configparser.ConfigParser(interpolation=None)
        with open("/app/config/service.ini", encoding="utf-8") as handle:
            parser.read_file(handle)


        def valid(rule, value):
            kind, arg = rule["kind"], rule["arg"]
            if kind == "int":
                return re.fullmatch(r"-?[0-9]+", value) is not None and arg[0] <= int(value) <= arg[1]
            if kind == "host":
                return re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?", value) is not None
            if kind == "number":
                return re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) is not None and float(value) > 0
            if kind == "prefix":
                return value.startswith(arg[0]) and len(value) > len(arg[0])
            if kind == "path":
                return re.fullmatch(r"/\S*", value) is not None
            return value in arg


        entries = {f"{section}.{key}": value for section in parser.sections() for key, value in parser[section].items()}
        invalid = {name: value for name, value in entries.items() if name in P["rules"] and not valid(P["rules"][name], value)}
    '''),
    ("config.cross", r'''
        pair = {"server.workers", "database.pool_size"}
        cross_broken = (pair <= set(entries) and not pair & set(invalid)
                        and int(entries["server.workers"]) > int(entries["database.pool_size"]))
        if cross_broken:
            invalid["database.pool_size"] = entries["database.pool_size"]
    '''),
    ("config.report", r'''
        with open("/app/invalid.txt", "w", encoding="utf-8") as handle:
            handle.writelines(name + "\n" for name in sorted(invalid))
    '''),
    ("config.json_report", r'''
        with open("/app/invalid.json", "w", encoding="utf-8") as handle:
            json.dump(invalid, handle, indent=2)
    '''),
    ("config.unknown", r'''
        with open("/app/unknown.txt", "w", encoding="utf-8") as handle:
            handle.writelines(name + "\n" for name in sorted(entries) if name not in P["rules"])
    '''),
    ("config.summary", r'''
        with open("/app/sections.txt", "w", encoding="utf-8") as handle:
            handle.writelines(f"{section} {len(parser[section])}\n" for section in sorted(parser.sections()))
    '''),
    ("config.fix", r'''
        repairs = {name: P["rules"][name]["default"] for name in invalid}
    '''),
    ("config.cross", r'''
        if cross_broken:
            repairs["database.pool_size"] = entries["server.workers"]
    '''),
    ("config.fix", r'''
        for name, value in repairs.items():
            section, key = name.split(".", 1)
            parser[section][key] = value
        with open("/app/config/service.ini", "w", encoding="utf-8") as handle:
            parser.write(handle)
    '''),
)

_CONFIG_CHECKS = _parts(
    (None, r'''
        import configparser


        def final_config():
            parser = configparser.ConfigParser(interpolation=None)
            with open("/app/config/service.ini", encoding="utf-8") as handle:
                parser.read_file(handle)
            return {section: dict(parser[section]) for section in parser.sections()}
    '''),
    ("config.report", r'''
        @check
        def check_config_report(exp):
            expect_equal(text_lines("/app/invalid.txt"), exp["config.report"], "invalid.txt")
    '''),
    ("config.fix", r'''
        @check
        def check_config_fix(exp):
            expect_equal(final_config(), exp["config.fix"], "entries of the repaired service.ini")
    '''),
    ("config.cross", r'''
        @check
        def check_config_cross(exp):
            name, value = exp["config.cross"]["name"], exp["config.cross"]["value"]
            assert name in text_lines("/app/invalid.txt"), f"{name} breaks the cross-field rule and must be reported"
            expect_equal(final_config()["database"].get("pool_size"), value, "repaired database.pool_size")
    '''),
    ("config.json_report", r'''
        @check
        def check_config_json_report(exp):
            expect_equal(load_json("/app/invalid.json"), exp["config.json_report"], "invalid.json")
    '''),
    ("config.unknown", r'''
        @check
        def check_config_unknown(exp):
            expect_equal(text_lines("/app/unknown.txt"), exp["config.unknown"], "unknown.txt")
    '''),
    ("config.summary", r'''
        @check
        def check_config_summary(exp):
            expect_equal(text_lines("/app/sections.txt"), exp["config.summary"], "sections.txt")
    '''),
)


# ---------------------------------------------------------------------------------------------
# Registry and skill graph


def _requirements(*rows: tuple[str, str, str]) -> tuple[Requirement, ...]:
    return tuple(Requirement(*row) for row in rows)


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family(
        name="logs", title="Summarise an application log", params_type=LogsParams,
        chain=_requirements(("logs.counts", "log_parsing", "Severity counts"),
                            ("logs.malformed", "record_validation", "Malformed lines"),
                            ("logs.ranking", "error_ranking", "Error ranking"),
                            ("logs.window", "time_window_filtering", "Time window")),
        pool=_requirements(("logs.hosts", "host_grouping", "Per-host counts"),
                           ("logs.messages", "message_normalization", "Distinct error messages"),
                           ("logs.csv", "csv_export", "CSV export")),
        neighbours={"log_parsing": ("host_grouping", "csv_export"), "error_ranking": ("message_normalization",)},
        knobs=(Knob("size", (20, 40, 80, 160, 320)), Knob("num_components", (3, 4, 5, 6, 8))),
        tags=("text-processing", "logs", "json"),
        render=_render_logs, oracle=_LOGS_ORACLE, checks=_LOGS_CHECKS),
    Family(
        name="convert", title="Convert inventory records from CSV to JSON", params_type=ConvertParams,
        chain=_requirements(("convert.rows", "csv_parsing", "Row conversion"),
                            ("convert.quoting", "csv_quoting", "Quoted fields"),
                            ("convert.types", "type_coercion", "Typed values"),
                            ("convert.missing", "null_handling", "Missing values")),
        pool=_requirements(("convert.jsonl", "jsonl_output", "JSON Lines copy"),
                           ("convert.rename", "key_mapping", "Key renaming"),
                           ("convert.summary", "aggregation", "Category summary"),
                           ("convert.defaults", "ini_merging", "Defaults file")),
        neighbours={"csv_parsing": ("jsonl_output", "key_mapping"), "type_coercion": ("aggregation", "ini_merging")},
        knobs=(Knob("size", (8, 16, 32, 64, 128)), Knob("num_columns", (4, 5, 6, 8, 10))),
        tags=("data-conversion", "csv", "json"),
        render=_render_convert, oracle=_CONVERT_ORACLE, checks=_CONVERT_CHECKS),
    Family(
        name="repair", title="Repair a site tree against its manifest", params_type=RepairParams,
        chain=_requirements(("repair.placement", "manifest_reconciliation", "Manifest placement"),
                            ("repair.extras", "duplicate_removal", "No stray files"),
                            ("repair.backup", "checksum_verification", "Damaged files")),
        pool=_requirements(("repair.report", "change_reporting", "Repair report"),
                           ("repair.index", "size_indexing", "Size index"),
                           ("repair.checksums", "checksum_listing", "Checksum listing")),
        neighbours={"manifest_reconciliation": ("change_reporting", "size_indexing"),
                    "checksum_verification": ("checksum_listing",)},
        knobs=(Knob("size", (6, 10, 16, 24, 40)), Knob("num_broken", (1, 2, 3, 4, 6))),
        tags=("file-system", "repair", "manifest"),
        render=_render_repair, oracle=_REPAIR_ORACLE, checks=_REPAIR_CHECKS),
    Family(
        name="script", title="Write a word-tally command", params_type=ScriptParams,
        chain=_requirements(("script.count", "cli_scripting", "Word tally"),
                            ("script.top", "argument_parsing", "Top option"),
                            ("script.errors", "input_validation", "Error handling"),
                            ("script.stdin", "stream_handling", "Multiple inputs")),
        pool=_requirements(("script.fold", "case_folding", "Ignore case"),
                           ("script.minlen", "length_filtering", "Minimum length"),
                           ("script.json", "json_output", "JSON output")),
        neighbours={"cli_scripting": ("case_folding", "json_output"), "argument_parsing": ("length_filtering",)},
        knobs=(Knob("size", (30, 60, 120, 240, 480)), Knob("num_cases", (2, 3, 4, 6))),
        tags=("scripting", "cli", "text-processing"),
        render=_render_script, oracle=_SCRIPT_ORACLE, checks=_SCRIPT_CHECKS, solve_template=_SCRIPT_SOLVE),
    Family(
        name="config", title="Validate and repair a service configuration", params_type=ConfigParams,
        chain=_requirements(("config.report", "config_validation", "Invalid entries"),
                            ("config.fix", "config_repair", "Repair in place"),
                            ("config.cross", "cross_field_constraints", "Cross-field rule")),
        pool=_requirements(("config.json_report", "report_formatting", "JSON report"),
                           ("config.unknown", "unknown_key_detection", "Unknown keys"),
                           ("config.summary", "section_summary", "Section summary")),
        neighbours={"config_validation": ("report_formatting", "unknown_key_detection"),
                    "config_repair": ("section_summary",)},
        knobs=(Knob("num_rules", (4, 6, 8, 10, 11)), Knob("num_invalid", (1, 2, 3, 4, 5))),
        tags=("configuration", "ini", "validation"),
        render=_render_config, oracle=_CONFIG_ORACLE, checks=_CONFIG_CHECKS),
)}
"""The five built-in families by name (the bundles' ``category``)."""

REQUIREMENTS: dict[str, Requirement] = {r.id: r for family in FAMILIES.values() for r in family.requirements}
"""Every requirement of every family by id."""

SKILL_GRAPH = SkillGraph(
    deeper={a.skill: (b.skill,) for family in FAMILIES.values() for a, b in zip(family.chain, family.chain[1:])},
    neighbours={skill: targets for family in FAMILIES.values() for skill, targets in family.neighbours.items()},
)
"""Chains and neighbours of the families' skills: the graph under which
:func:`~envsched_jax.forge.candidates.candidate_skills` predicts exactly what :func:`transform` does."""


# ---------------------------------------------------------------------------------------------
# Public functions


def family_of(params: FamilyParams) -> str:
    """The name of the family ``params`` belong to."""
    return _family(params).name


def describe_requirements(params: FamilyParams) -> list[str]:
    """The active requirement ids: the chain prefix, then the optional ones in the order added."""
    return [r.id for r in _family(params).chain[: params.depth]] + list(params.extras)


def skills_of(params: FamilyParams) -> SkillSubgraph:
    """Required skills (the chain prefix) and optional skills (the extras), as the metadata stores them."""
    family = _family(params)
    return SkillSubgraph(tuple(r.skill for r in family.chain[: params.depth]),
                         tuple(REQUIREMENTS[extra].skill for extra in params.extras))


def _difficulty(params: FamilyParams) -> str:
    family = _family(params)
    steps = sum(knob.values.index(getattr(params, knob.name)) for knob in family.knobs)
    score = params.depth - 1 + len(params.extras) + steps // 2
    return "easy" if score <= 1 else "medium" if score <= 3 else "hard"


def _assemble(parts: Parts, active: set[str]) -> str:
    return "".join(code if req is None else f"# requirement: {req}\n{code}"
                   for req, code in parts if req is None or req in active)


def _solve_script(params: FamilyParams, rendered: _Rendered, omit: frozenset[str] = frozenset()) -> bytes:
    family = _family(params)
    program = f"P = {rendered.constants!r}\n" + _assemble(family.oracle, set(describe_requirements(params)) - omit)
    return family.solve_template.replace("{program}", program).encode()


def _task_toml(params: FamilyParams) -> bytes:
    family, skills = _family(params), skills_of(params)
    knobs = {knob.name: getattr(params, knob.name) for knob in family.knobs}
    doc = {
        "version": "1.0",
        "metadata": {
            "author_name": AUTHOR_NAME, "difficulty": _difficulty(params), "category": family.name,
            "tags": ["envs-forge", *family.tags],
            "skills": {"required": list(skills.required), "optional": list(skills.optional)},
            "forge": {"family": family.name, "variant": params.variant, "depth": params.depth,
                      "extras": list(params.extras), **knobs,
                      # the declaration gold verification's sync check reads (forge/verify.py)
                      "requirements": [{"id": r, "text": f"**{REQUIREMENTS[r].title}.**"}
                                       for r in describe_requirements(params)]},
        },
        "verifier": {"timeout_sec": VERIFIER_TIMEOUT_SEC},
        "agent": {"timeout_sec": AGENT_TIMEOUT_SEC},
    }
    return tomli_w.dumps(doc).encode()


def realize(params: FamilyParams) -> Files:
    """The complete Harbor bundle of ``params``: relative path -> (content, executable).

    Pure and deterministic; instruction, fixtures, oracle, tests and metadata all come from the
    same :class:`_Rendered`, which is what keeps them consistent (module docstring)."""
    family = _family(params)
    rendered = family.render(params)
    active = describe_requirements(params)
    bullets = "".join(f"- **{REQUIREMENTS[r].title}.** {rendered.details[r]}\n" for r in active)
    instruction = (f"# {family.title}\n\nYou work in `/app`. {rendered.intro}\n\n## Requirements\n\n{bullets}\n"
                   "The verifier checks exactly these requirements, with the values stated here, and nothing else.\n")
    files: Files = {f"environment/app/{path}": (data, False) for path, data in rendered.app.items()}
    files.update({
        "environment/Dockerfile": (DOCKERFILE, False),
        "instruction.md": (instruction.encode(), False),
        "task.toml": (_task_toml(params), False),
        "solution/solve.sh": (_solve_script(params, rendered), True),
        "tests/test.sh": (TEST_SH, True),
        "tests/check.py": ((_CHECK_HEAD + "\n\n" + _assemble(family.checks, set(active)) + _CHECK_TAIL).encode(), False),
        "tests/expected.json": ((json.dumps(rendered.expected, indent=1, sort_keys=True) + "\n").encode(), False),
    })
    return dict(sorted(files.items()))


def oracle_without(params: FamilyParams, requirement_id: str) -> bytes:
    """The oracle of ``params`` with one active requirement's code left out: a mutant that the
    bundle's tests must reject, which is how a verifier shows it really checks that requirement."""
    if requirement_id not in describe_requirements(params):
        raise ValueError(f"{requirement_id!r} is not an active requirement of these parameters; "
                         f"they are {describe_requirements(params)}")
    return _solve_script(params, _family(params).render(params), frozenset({requirement_id}))


def to_bundle(name: str, params: FamilyParams) -> TaskBundle:
    """``realize(params)`` as a :class:`~envsched_jax.forge.bundle.TaskBundle` called ``name``."""
    return TaskBundle(name, "harbor", {path: BundleFile(data, executable)
                                       for path, (data, executable) in realize(params).items()})


def params_from_metadata(metadata: Mapping[str, Any]) -> FamilyParams:
    """The parameters a generated bundle was realised from (its task.toml ``[metadata.forge]``)."""
    try:
        stored = dict(metadata["metadata"]["forge"])
        family = FAMILIES[stored.pop("family")]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a bundle generated by envsched_jax.forge.families: no [metadata.forge] "
                         f"with a known family ({exc!r})") from None
    stored.pop("requirements", None)   # derived from the parameters, not one of them
    stored["extras"] = tuple(stored.get("extras", ()))
    return family.params_type(**stored)


# ---------------------------------------------------------------------------------------------
# The programmatic materializer


@dataclass(frozen=True)
class Rewrite:
    """The result of :func:`transform`: the rewritten parameters, and a note that is empty when the
    action applied as named and otherwise says what was done instead (e.g. a data-only variant)."""

    params: FamilyParams
    note: str = ""


def _fresh_variant(params: FamilyParams, act: Action, rng_seed: int) -> int:
    digest = hashlib.sha256(f"{params.FAMILY}|{params.variant}|{act.name}|{rng_seed}".encode()).hexdigest()
    variant = int(digest[:12], 16) % 1_000_000
    return variant + 1 if variant == params.variant else variant


def _step_knobs(params: FamilyParams, step: int) -> tuple[dict[str, int], list[str]]:
    """Every knob one position up (+1) or down (-1) its value list, where it can move."""
    changes, notes = {}, []
    for knob in _family(params).knobs:
        value = getattr(params, knob.name)
        index = min(max(knob.values.index(value) + step, 0), len(knob.values) - 1)
        if knob.values[index] != value:
            changes[knob.name] = knob.values[index]
            notes.append(f"{knob.name} {value} -> {knob.values[index]}")
    return changes, notes


def transform(params: FamilyParams, action: Action | str, rng_seed: int) -> Rewrite:
    """Realise ``action`` on ``params`` (module docstring: the table, and what an action that
    cannot apply returns). The skills of the result are exactly those
    :func:`~envsched_jax.forge.candidates.candidate_skills` predicts under :data:`SKILL_GRAPH`."""
    act = action_named(action) if isinstance(action, str) else action
    if not isinstance(act, Action):
        raise TypeError(f"action must be an Action or its name, got {action!r}")
    if not _is_int(rng_seed):
        raise TypeError(f"rng_seed must be an int, got {rng_seed!r}")
    family, skills = _family(params), skills_of(params)
    seed = SeedSpec(seed_id=family.name, pass_rate=0.5, required=skills.required, optional=skills.optional)
    target = candidate_skills(seed, SKILL_GRAPH)[ACTION_INDEX[act.name]]
    chain_skills = [r.skill for r in family.chain]
    by_skill = {r.skill: r.id for r in family.pool}
    depth = sum(skill in chain_skills for skill in target)
    extras = tuple(by_skill[skill] for skill in target if skill in by_skill)
    changes: dict[str, Any] = {"variant": _fresh_variant(params, act, rng_seed), "depth": depth, "extras": extras}
    note = ""
    unchanged = depth == params.depth and extras == params.extras
    if act.projection == "increase_complexity" and unchanged:
        knobs, moved = _step_knobs(params, +1)
        changes.update(knobs)
        what = "deeper" if act.direction == "in_depth" else "neighbouring"
        note = (f"no {what} skill left to add; raised {', '.join(moved)}" if moved
                else f"no {what} skill left to add and every knob at its maximum: only the data changed")
    elif act.projection == "reduce_complexity" and (act.direction == "in_depth" or unchanged):
        knobs, moved = _step_knobs(params, -1)
        changes.update(knobs)
        if unchanged and not moved:
            note = "nothing optional to remove and every knob at its minimum: only the data changed"
    elif act.name == "diversify_frontier/in_breadth" and unchanged:
        note = "no neighbouring skill outside the task to swap in: only the data changed"
    return Rewrite(dataclasses.replace(params, **changes), note)


# ---------------------------------------------------------------------------------------------
# Built-in seeds


def builtin_seeds() -> list[tuple[str, FamilyParams]]:
    """The 25 built-in seeds, five per family, from a bare core task to a deep one with extras."""
    return [
        ("logs-severity-01", LogsParams(variant=11, size=20, num_components=3)),
        ("logs-malformed-02", LogsParams(variant=12, depth=2, size=40)),
        ("logs-ranking-03", LogsParams(variant=13, depth=3, extras=("logs.hosts",), size=80)),
        ("logs-window-04", LogsParams(variant=14, depth=4, extras=("logs.messages", "logs.csv"), size=160,
                                      num_components=6)),
        ("logs-hosts-05", LogsParams(variant=15, extras=("logs.hosts", "logs.csv"), size=40)),
        ("convert-rows-01", ConvertParams(variant=21, size=8, num_columns=4)),
        ("convert-quoting-02", ConvertParams(variant=22, depth=2, extras=("convert.jsonl",))),
        ("convert-types-03", ConvertParams(variant=23, depth=3, extras=("convert.summary",), size=32, num_columns=6)),
        ("convert-missing-04", ConvertParams(variant=24, depth=4, extras=("convert.rename", "convert.defaults"),
                                             size=64, num_columns=8)),
        ("convert-rename-05", ConvertParams(variant=25, extras=("convert.rename",))),
        ("repair-placement-01", RepairParams(variant=31, size=6, num_broken=1)),
        ("repair-strays-02", RepairParams(variant=32, depth=2, extras=("repair.report",))),
        ("repair-backup-03", RepairParams(variant=33, depth=3, size=16, num_broken=3)),
        ("repair-index-04", RepairParams(variant=34, extras=("repair.index", "repair.checksums"))),
        ("repair-full-05", RepairParams(variant=35, depth=3, extras=("repair.report", "repair.index"), size=24,
                                        num_broken=4)),
        ("script-tally-01", ScriptParams(variant=41, size=30, num_cases=2)),
        ("script-top-02", ScriptParams(variant=42, depth=2, extras=("script.fold",))),
        ("script-errors-03", ScriptParams(variant=43, depth=3, size=120)),
        ("script-stdin-04", ScriptParams(variant=44, depth=4, extras=("script.json", "script.minlen"), num_cases=4)),
        ("script-json-05", ScriptParams(variant=45, extras=("script.json",))),
        ("config-report-01", ConfigParams(variant=51, num_rules=4, num_invalid=1)),
        ("config-fix-02", ConfigParams(variant=52, depth=2, extras=("config.json_report",))),
        ("config-cross-03", ConfigParams(variant=53, depth=3, num_rules=8, num_invalid=3)),
        ("config-unknown-04", ConfigParams(variant=54, extras=("config.unknown", "config.summary"))),
        ("config-full-05", ConfigParams(variant=55, depth=3, extras=("config.unknown", "config.json_report"),
                                        num_rules=11, num_invalid=4)),
    ]


def write_builtin_seeds(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> list[Path]:
    """Write every built-in seed as a Harbor bundle folder ``out_dir/NAME`` and return the folders.

    A non-empty seed folder is refused unless ``overwrite`` (as :func:`~envsched_jax.forge.bundle.write_bundle`)."""
    root = Path(out_dir)
    return [write_bundle(to_bundle(name, params), root / name, overwrite=overwrite) for name, params in builtin_seeds()]
