"""The labelled workspace generator (envsched_jax/rethink/generator.py; seeds/002 appendix A.5)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter, defaultdict

import numpy as np
import pytest

from envsched_jax.envs.runtime.core import run_checks
from envsched_jax.rethink import generator as gen
from envsched_jax.rethink.workspace import CATEGORIES, SIZE_CLASSES, SIZE_MIX, WorkspaceError

CONFIG = gen.GeneratorConfig(seed=11, num_parents=8, variants_per_parent=3, image_only_share=0.5,
                             held_out_share=0.25)


@pytest.fixture(scope="module")
def bench():
    return gen.generate_benchmark(CONFIG)


def scenario_of(ws) -> gen.Scenario:
    return gen.Scenario.from_json(ws.metadata["scenario"])


def reward(ws, answer):
    r, results, errors = run_checks(ws.workspace_id, [c.code for c in ws.rubric], {"answer": answer}, {})
    assert errors == [None] * len(results), errors  # checks return False, they never raise
    return r, results


def register_rows(text: str) -> list[dict] | None:
    """The rows of an approvals register (comment lines first, the first naming the register;
    then the CSV with header ``ref,date,subject,document,status,approved_by``), else None."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#") or "approvals register" not in lines[0].lower():
        return None
    body = [line for line in lines if not line.startswith("#")]
    assert body[0] == "ref,date,subject,document,status,approved_by", body[0]
    return list(csv.DictReader(io.StringIO("\n".join(body))))


def solve_from_text(ws, subject: str, kind: str) -> dict:
    """An independent solver that reads only text files: the approvals register's row for the
    subject names the document; the value is parsed from that document."""
    row = None
    for f in ws.files:
        rows = register_rows(f.text) if f.text is not None else None
        for r in rows or ():
            if r["subject"] == f"{subject} {gen.KIND_SPECS[kind].record_name}" and r["status"] == "approved":
                assert row is None, ws.workspace_id  # exactly one approved row for the subject
                row = r
    assert row is not None, ws.workspace_id
    text = ws.file(row["document"]).text
    pattern = {"budget": r"^Total,(\d+)$", "policy_rate": r"^Rate: ([\d.]+) %$",
               "reference_list": r"^Entries: (\d+)$", "employee_profile": r"^Department: (.+)$"}[kind]
    raw = re.search(pattern, text, re.M).group(1)
    value = raw if kind == "employee_profile" else float(raw)
    answer = {"value": value, "source": row["document"]}
    if kind == "policy_rate":
        answer["effective_date"] = re.search(r"^Effective from: (\S+)$", text, re.M).group(1)
    return answer


def test_determinism_and_seed_matters():
    a = gen.generate_benchmark(CONFIG)
    b = gen.generate_benchmark(CONFIG)
    assert [w.content_hash() for w in a.workspaces] == [w.content_hash() for w in b.workspaces]
    assert [w.manifest() for w in a.workspaces] == [w.manifest() for w in b.workspaces]
    other = gen.generate_benchmark(gen.GeneratorConfig(seed=12, num_parents=8, variants_per_parent=3))
    assert {w.content_hash() for w in a.workspaces}.isdisjoint({w.content_hash() for w in other.workspaces})


def test_render_is_pure_through_json(bench):
    for ws in bench.workspaces:
        scenario = gen.Scenario.from_json(json.loads(json.dumps(ws.metadata["scenario"])))
        again = gen.render(scenario, workspace_id=ws.workspace_id, parent_task=ws.parent_task,
                           size_class=ws.size_class)
        assert again.content_hash() == ws.content_hash()
        assert again.manifest() == ws.manifest()
        assert [f.data for f in again.files] == [f.data for f in ws.files]
        assert gen.rerender(ws).manifest() == ws.manifest()


def test_labels_consistent(bench):
    for ws in bench.workspaces:
        assert ws.labelled
        paths = set(ws.paths)
        families = defaultdict(list)
        for f in ws.files:
            lab = f.label
            assert lab.category in CATEGORIES
            assert lab.partition == ("standard" if lab.category == "authoritative_record" else "noise")
            assert set(lab.evidence) <= paths
            if lab.category != "out_of_scope":
                assert lab.evidence or lab.category == "authoritative_record", f.path
            if lab.family:
                families[lab.family].append(f)
        assert len(families) == 1, ws.workspace_id
        for members in families.values():
            orders = sorted(m.label.order for m in members)
            assert orders == list(range(len(members)))
            cats = Counter(m.label.category for m in members)
            assert cats["authoritative_record"] == 1 and cats["false_final_version"] == 1
            assert cats["superseded_version"] == len(members) - 2 >= 1
            by_order = sorted(members, key=lambda m: m.label.order)
            auth = next(m for m in members if m.label.category == "authoritative_record")
            ff = next(m for m in members if m.label.category == "false_final_version")
            assert auth.path == ws.reference["source"]
            timing = scenario_of(ws).timing
            # order is the true version order; modification time follows it except for the one
            # re-saved earlier member of a "resaved" workspace, which is the newest file
            newest = max(members, key=lambda m: m.modified)
            if timing == "resaved":
                assert newest.label.category == "superseded_version"
                rest = [m for m in by_order if m is not newest]
                assert [m.modified for m in rest] == sorted(m.modified for m in rest)
            else:
                assert [m.modified for m in by_order] == sorted(m.modified for m in by_order)
                assert newest is (auth if timing == "premature" else ff)
            assert (auth.label.order > ff.label.order) == (timing == "premature")
            for m in members:
                if m.label.category == "superseded_version":
                    assert m.label.order < auth.label.order


def test_size_ranges_and_mix_fields(bench):
    for ws in bench.workspaces:
        lo, hi = SIZE_CLASSES[ws.size_class]
        flo, fhi = gen.FILE_COUNTS[ws.size_class]
        assert lo <= flo <= len(ws.files) <= fhi <= hi
    assert {ws.size_class for ws in bench.workspaces} == set(SIZE_MIX)


def test_size_mix_over_a_large_benchmark():
    config = gen.GeneratorConfig(seed=5, num_parents=100, variants_per_parent=4)
    classes = []
    for p, parent in enumerate(gen.draw_parents(config)):
        for v in range(config.variants_per_parent):
            classes.append(gen.generate_workspace(config, parent, p, v).size_class)
    n = len(classes)
    counts = Counter(classes)
    for size, share in SIZE_MIX.items():
        bound = 4 * math.sqrt(share * (1 - share) / n)  # four binomial standard deviations
        assert abs(counts[size] / n - share) <= bound, (size, counts)


def test_split_by_parent(bench):
    train = {w.parent_task for w in bench.train}
    held = {w.parent_task for w in bench.held_out}
    assert train and held and not train & held
    assert held == set(bench.held_out_parents)
    assert len(train | held) == CONFIG.num_parents
    assert len(held) == round(CONFIG.held_out_share * CONFIG.num_parents)
    per_parent = Counter(w.parent_task for w in bench.workspaces)
    assert set(per_parent.values()) == {CONFIG.variants_per_parent}
    for parent in train | held:  # variants share kind and subject
        scenarios = [scenario_of(w) for w in bench.workspaces if w.parent_task == parent]
        assert len({(s.kind, s.subject) for s in scenarios}) == 1
        assert len({w.content_hash() for w in bench.workspaces if w.parent_task == parent}) == 3
    assert {scenario_of(w).kind for w in bench.workspaces} == set(gen.SCENARIOS)


def test_reference_passes_and_every_decoy_answer_fails(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        assert len(ws.rubric) >= 3
        assert reward(ws, ws.reference)[0] == 1.0
        auth = sc.authoritative
        wrong = [(m.value, m.path) for m in sc.family if m.role != "authoritative"]
        wrong += [(d.value, d.path) for d in sc.decoys]
        wrong += [(f.value, f.path) for f in sc.fillers if f.topic == "other_subject"]
        assert wrong
        for value, path in wrong:
            for source in (path, auth.path):
                answer = dict(ws.reference, value=value, source=source)
                r, results = reward(ws, answer)
                assert not all(results) and r < 1.0, (ws.workspace_id, value, source)
        # the purported final's own value is rejected by a dedicated check as well as the value check
        r, results = reward(ws, dict(ws.reference, value=sc.false_final.value, source=sc.false_final.path))
        assert results.count(False) >= 3
        # the right value credited to the wrong file is not full marks
        assert reward(ws, dict(ws.reference, source=sc.false_final.path))[0] < 1.0


@pytest.fixture(scope="module")
def big():
    """A 200-workspace benchmark (50 parents x 4 variants)."""
    return gen.generate_benchmark(gen.GeneratorConfig(seed=3, num_parents=50, variants_per_parent=4)).workspaces


def family_files(ws):
    return [f for f in ws.files if f.label.family]


_CLAIMS = {"final", "approved", "latest", "signed", "current", "official"}


def filename_pick(members):
    """Trust the filename: a claim word in the name first, then the highest version number."""
    def key(f):
        tokens = re.findall(r"[a-z0-9]+", f.name.lower().rsplit(".", 1)[0])
        versions = [int(m.group(1)) for t in tokens for m in [re.fullmatch(r"(?:v|rev)(\d+)", t)] if m]
        return (bool(_CLAIMS & set(tokens)), max(versions, default=-1), f.path)
    return max(members, key=key)


def newest_pick(members):
    return max(members, key=lambda f: (f.modified, f.path))


def test_purported_final_is_newest_in_a_bounded_share(big):
    """The purported final is the newest family member only in the "ordered" timing, drawn with
    probability 0.65: over 200 workspaces the share lies well inside (0.5, 0.8) (both bounds are
    more than four binomial standard deviations, 0.034, away from 0.65)."""
    assert len(big) == 200
    newest = 0
    for ws in big:
        members = family_files(ws)
        ff = next(f for f in members if f.label.category == "false_final_version")
        newest += all(ff.modified > f.modified for f in members if f is not ff)
    assert 0.5 < newest / len(big) < 0.8, newest
    timings = Counter(scenario_of(ws).timing for ws in big)
    assert set(timings) == set(gen.TIMINGS)


def test_names_do_not_give_authority_away(big):
    """Finality words appear on some authoritative records, some purported finals have neutral
    names, some superseded members are named final; filename- and newest-trusting choices differ."""
    def says_final(f):
        return "final" in re.findall(r"[a-z0-9]+", f.name.lower())

    def claims(f):
        return bool({"final", "approved"} & set(re.findall(r"[a-z0-9]+", f.name.lower())))

    auth_final = ff_neutral = old_final = differ = 0
    right = Counter()
    for ws in big:
        members = family_files(ws)
        by_cat = defaultdict(list)
        for f in members:
            by_cat[f.label.category].append(f)
        auth_final += says_final(by_cat["authoritative_record"][0])
        ff = by_cat["false_final_version"][0]
        if not claims(ff):
            ff_neutral += 1
            # a neutrally named purported final claims finality in its own content
            assert scenario_of(ws).contradiction != "self_declared"
            assert "final" in ff.text.lower()
        old_final += any(says_final(f) for f in by_cat["superseded_version"])
        picks = {"filename": filename_pick(members), "newest": newest_pick(members)}
        differ += picks["filename"] is not picks["newest"]
        for name, pick in picks.items():
            right[name] += pick.label.category == "authoritative_record"
    assert auth_final > 0 and ff_neutral > 0 and old_final > 0
    assert differ > 0
    for name in ("filename", "newest"):  # each surface cue is right sometimes and wrong sometimes
        assert 0 < right[name] < len(big), (name, right)


def test_former_finals_are_listed_as_superseded(big):
    seen = 0
    for ws in big:
        sc = scenario_of(ws)
        register = register_rows(ws.file(sc.evidence_of("register").path).text)
        for m in sc.family:
            rows = [r for r in register if r["document"] == m.path]
            if m.former_final:
                seen += 1
                assert ws.file(m.path).label.category == "superseded_version" and m.stage == "final"
                assert [r["status"] for r in rows] == ["superseded"]
            elif m.role == "authoritative":
                assert [r["status"] for r in rows] == ["approved"]
            else:
                assert rows == []
    assert seen > 0


def test_wording_and_directories_vary(big):
    """Every template of every role is drawn somewhere, and every role's directory varies."""
    styles = [scenario_of(ws).style for ws in big]
    for name, n in gen.STYLE_CHOICES.items():
        assert {getattr(s, name) for s in styles} == set(range(n)), name
    auth_dirs, register_dirs = defaultdict(set), set()
    for ws in big:
        sc = scenario_of(ws)
        auth_dirs[sc.kind].add(ws.file(sc.authoritative.path).directory)
        register_dirs.add(ws.file(sc.evidence_of("register").path).directory)
    assert all(len(d) >= 3 for d in auth_dirs.values()), auth_dirs
    assert len(register_dirs) >= 5
    # status lines of the authoritative record differ across workspaces of one kind
    status = {re.search(r"^.*(?:[Ss]tatus|Stage): .*$", ws.file(scenario_of(ws).authoritative.path).text, re.M)
              .group(0).split(": ", 1)[0] for ws in big}
    assert len(status) >= 3


_SHARED_HEADING_WORDS = {"project", "budget", "rate", "schedule", "references", "record", "employee"}
"""Words a request may share with every record heading of its kind (not only its subject's)."""


def test_headings_add_no_request_words(big):
    """Besides the subject, a record heading shares with the request only words that every record
    of the kind carries, so matching headings to the request selects the subject's records."""
    def words(text):
        return set(re.findall(r"[a-z0-9][a-z0-9\-]{2,}", text.lower()))

    for ws in big:
        sc = scenario_of(ws)
        for m in sc.family:
            first = next(line for line in ws.file(m.path).text.splitlines() if line.strip())
            extra = words(first) - words(sc.subject)
            assert extra & words(ws.request) <= _SHARED_HEADING_WORDS, (m.path, first)


def test_fixed_line_formats(bench):
    """The formats the offline agents and verifiers parse (see the module docstring)."""
    patterns = {"budget": r"^Total,\d+$", "policy_rate": r"^Rate: \d+\.\d\d %$",
                "reference_list": r"^Entries: \d+$", "employee_profile": r"^Department: \S.*$"}
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        records = [(m.path, sc.subject) for m in sc.family]
        records += [(f.path, f.subject) for f in sc.fillers if f.topic == "other_subject"]
        for path, subject in records:
            text = ws.file(path).text
            first = next(line for line in text.splitlines() if line.strip())
            assert subject.casefold() in first.casefold(), (path, first)
            assert len(re.findall(patterns[sc.kind], text, re.M)) == 1, path
            if sc.kind == "policy_rate":
                assert re.search(r"^Effective from: \d{4}-\d{2}-\d{2}$", text, re.M)
        signoff = sc.evidence_of("signoff")
        if signoff:
            text = ws.file(signoff.path).text
            assert text.startswith("# Sign-off record")
            assert re.findall(r"^Document: (\S+)$", text, re.M) == [sc.authoritative.path]
        notice = sc.evidence_of("withdrawal")
        if notice and not notice.image:
            text = ws.file(notice.path).text
            assert "withdrawal notice" in text.lower()
            assert re.findall(r"^Re: (\S+)$", text, re.M) == [sc.false_final.path]
        assert register_rows(ws.file(sc.evidence_of("register").path).text)


def test_checks_tolerate_bad_answers_and_accept_equivalent_forms(bench):
    ws = next(w for w in bench.workspaces if scenario_of(w).kind == "budget")
    bad = [None, "412500", [], {}, {"value": None}, {"value": [1], "source": 3}, {"value": float("nan")},
           {"value": True, "source": None}, {"value": {"x": 1}, "source": ["a"]}]
    for answer in bad:
        r, results = reward(ws, answer)
        assert results[:2] == [False, False] and r < 1.0
    for state in ({}, None, "answer", {"answer": 5}):
        r, results, errors = run_checks(ws.workspace_id, [c.code for c in ws.rubric], state, {})
        assert r == 0.0 and errors == [None] * len(results)
    value, source = ws.reference["value"], ws.reference["source"]
    for form in (f"{value:,}", str(value), float(value) + 1e-7, f"EUR {value}"):
        assert reward(ws, {"value": form, "source": f"./{source} "})[0] == 1.0, form
    assert reward(ws, {"value": value + 1, "source": source})[0] < 1.0

    ws = next(w for w in bench.workspaces if scenario_of(w).kind == "employee_profile")
    assert reward(ws, dict(ws.reference, value=f"  {ws.reference['value'].upper()} "))[0] == 1.0
    ws = next(w for w in bench.workspaces if scenario_of(w).kind == "policy_rate")
    assert reward(ws, dict(ws.reference, value=f"{ws.reference['value']:.2f} %"))[0] == 1.0
    assert reward(ws, {k: v for k, v in ws.reference.items() if k != "effective_date"})[0] < 1.0


def test_solvable_from_text_in_noise_and_clean(bench):
    """An independent text-only solver (register -> document -> value) earns full marks on the full
    workspace and on the Clean condition, image-only withdrawals included."""
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        for view in (ws, ws.clean()):
            answer = solve_from_text(view, sc.subject, sc.kind)
            assert reward(ws, answer)[0] == 1.0, ws.workspace_id


def test_clean_condition_keeps_what_is_needed(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        clean = ws.clean()
        kept = set(clean.paths)
        assert sc.authoritative.path in kept and sc.evidence_of("register").path in kept
        assert kept == {e.path for e in sc.evidence} | {sc.authoritative.path}
        assert all(f.label.partition == "standard" for f in clean.files)
        assert clean.rubric == ws.rubric and clean.request == ws.request


def test_image_only_withdrawals(bench):
    images = 0
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        notice = sc.evidence_of("withdrawal")
        if notice is None:
            assert sc.contradiction != "withdrawn"
            continue
        f = ws.file(notice.path)
        assert f.label.category == "authoritative_record"
        register = ws.file(sc.evidence_of("register").path).text
        assert sc.authoritative.path in register and sc.false_final.path not in register
        if notice.image:
            images += 1
            assert f.kind == "image" and f.text is None and f.data.startswith(b"\x89PNG")
            assert f.path.endswith(".png")
            from PIL import Image

            with Image.open(io.BytesIO(f.data)) as img:
                pixels = np.asarray(img.convert("L"))
            assert pixels.min() < 128 < pixels.max()  # text was drawn
        else:
            assert f.kind == "text" and sc.false_final.path in f.text and sc.register_ref in f.text
        assert notice.path in ws.file(sc.false_final.path).label.evidence
    assert images >= 1


def test_request_leaks_nothing(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        request = ws.request
        lowered = request.lower()
        values = [m.value for m in sc.family] + [d.value for d in sc.decoys]
        for v in values:
            assert gen.format_value(sc.kind, v) not in request, (ws.workspace_id, v)
        assert not re.search(r"\d", request)
        for path in ws.paths:
            assert path not in request
        for category in CATEGORIES:
            assert category not in lowered and category.replace("_", " ") not in lowered
        for word in ("final", "withdraw", "register", "superseded", "decoy", "fabricated", "redirect"):
            assert word not in lowered, word
        assert sc.subject in request


def test_files_state_values_and_evidence_refs(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        for m in sc.family:
            text = ws.file(m.path).text
            assert gen.format_value(sc.kind, m.value) in text
            if sc.kind == "policy_rate":
                assert f"Effective from: {m.effective}" in text
        ff_text = ws.file(sc.false_final.path).text
        assert ("not approved" in ff_text.lower()) == (sc.contradiction == "self_declared")
        register = ws.file(sc.evidence_of("register").path).text
        assert sc.register_ref in register and sc.fake_ref not in register
        for d in sc.decoys:
            text = ws.file(d.path).text
            if d.kind != "redirect":  # a redirect names its target; its value is the target's
                assert gen.format_value(sc.kind, d.value) in text
            if d.kind == "fabricated":
                assert sc.fake_ref in text and d.target == sc.false_final.path
            if d.kind == "redirect":
                assert d.target in text and d.value == next(m.value for m in sc.family if m.path == d.target)
        confirmations = [d for d in sc.decoys if d.kind == "confirmation"]
        assert len({d.value for d in confirmations}) <= 1
        assert all(sc.quoted_source in ws.file(d.path).text for d in confirmations)
        if sc.kind == "policy_rate":
            effective = [m.effective for m in sorted(sc.family, key=lambda m: m.order)]
            assert effective == sorted(set(effective))


def test_budget_line_items_sum_to_total(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        if sc.kind != "budget":
            continue
        for m in sc.family:
            rows = [line.split(",") for line in ws.file(m.path).text.splitlines()
                    if line and not line.startswith("#")][1:]
            items = {k: int(v) for k, v in rows}
            total = items.pop("Total")
            assert total == m.value == sum(items.values()) and min(items.values()) >= 0


def test_directories_spread(bench):
    for ws in bench.workspaces:
        sc = scenario_of(ws)
        fam_dirs = {ws.file(m.path).directory for m in sc.family}
        assert len(fam_dirs) >= 2, ws.workspace_id  # grouping by directory alone cannot recover the family


@pytest.mark.parametrize("kind", sorted(gen.SCENARIOS))
def test_every_kind_produces_every_relationship(kind):
    seen_categories, contradictions, image_notice, text_notice = set(), set(), False, False
    for i in range(24):
        rng = np.random.default_rng([99, i])
        size = ("small", "medium", "large")[i % 3]
        subject, org = gen.draw_subject(kind, rng)
        sc = gen.SCENARIOS[kind](rng, subject=subject, org=org, size_class=size, image_only_share=0.5, seed=(99, i))
        ws = gen.render(sc, workspace_id=f"w{i}", parent_task="p", size_class=size)
        assert gen.FILE_COUNTS[size][0] <= len(ws.files) <= gen.FILE_COUNTS[size][1]
        assert reward(ws, ws.reference)[0] == 1.0
        seen_categories |= {f.label.category for f in ws.files}
        contradictions.add(sc.contradiction)
        notice = sc.evidence_of("withdrawal")
        image_notice |= bool(notice and notice.image)
        text_notice |= bool(notice and not notice.image)
        decoy_kinds = {d.kind for d in sc.decoys}
        if size == "large":
            assert decoy_kinds == set(gen.DECOY_KINDS) and sc.evidence_of("signoff") is not None
    assert seen_categories == set(CATEGORIES)
    assert contradictions == set(gen.CONTRADICTIONS)
    assert image_notice and text_notice


def test_errors_name_the_problem(bench):
    ws = bench.workspaces[0]
    record = ws.metadata["scenario"]
    with pytest.raises(WorkspaceError, match="size_class"):
        gen.render(scenario_of(ws), workspace_id="x", parent_task="p",
                   size_class="large" if ws.size_class != "large" else "small")
    with pytest.raises(WorkspaceError, match="scenario"):
        gen.Scenario.from_json({k: v for k, v in record.items() if k != "family"})
    broken = dict(record, family=[dict(m, order=m["order"] * 2) for m in record["family"]])
    with pytest.raises(WorkspaceError, match="orders"):
        gen.Scenario.from_json(broken)
    with pytest.raises(WorkspaceError, match="kinds"):
        gen.GeneratorConfig(kinds=("budget", "weather"))
    with pytest.raises(WorkspaceError, match="image_only_share"):
        gen.GeneratorConfig(image_only_share=1.5)
    with pytest.raises(WorkspaceError, match="size_class"):
        gen.draw_scenario("budget", np.random.default_rng(0), subject="S", org="O", size_class="huge")
