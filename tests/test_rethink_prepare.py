"""Env-Rethink reorganisation (seeds/002, section 4.1): roles, Collection Map, Event Log, prepare.

Fixtures are built by hand: a labelled workspace over four directories (plus a nested one and the
root) with a travel-budget version family (v1, v2 and a false FINAL copy in drafts/), a register,
a reference-list pair with a withdrawal notice, an image-only memo, a redirect note and fillers
(empty, binary, non-UTF-8). Expectations are derived from the documented rules by hand.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from envsched_jax.graph.llm_clients import ScriptedChatClient
from envsched_jax.pool.model import Check
from envsched_jax.rethink.collection_map import (APPLIERS, Card, Collection, CollectionConfig, CollectionMap, Proposal,
                                                 build_collection_map, coordinate, coverage_problems, initial_grouping,
                                                 summarize_collection, support_problem)
from envsched_jax.rethink.event_log import (Event, EventConfig, EventLog, PrepareConfig, Relation, _synthesis_task,
                                            build_event_log, cycle_members, find_leaks, integrate, prepare,
                                            review_event, review_with_repairs, structure_problems, synthesize_events)
from envsched_jax.rethink.roles import (ROLE_NAMES, Excerpt, HeuristicRole, LLMRoleRunner, RoleError, WorkspaceIndex,
                                        make_roles, names_file, readable_text, text_index, unique_names,
                                        validate_output, words_of)
from envsched_jax.rethink.workspace import (FileLabel, Workspace, WorkspaceError, WorkspaceFile, load_workspace,
                                            save_workspace, tree_digest)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR fake image: travel budget FINAL withdrawn"

def L(cat, stage="", family="", order=None, evidence=()):
    return FileLabel("standard" if cat == "authoritative_record" else "noise", cat, stage, family, order, tuple(evidence))

def fixture():
    files = [
        ("README.md", "Team share for the finance group.\n", "2026-01-02T08:00:00Z", L("out_of_scope")),
        ("budget/travel_budget_v1.md", "# Travel budget 2026 (draft v1)\nStatus: draft\nTotal travel budget: 41000 EUR\nFlights and trains: 25000 EUR\nHotels: 16000 EUR\n",
         "2026-01-10T09:00:00Z", L("superseded_version", "draft", "travel_budget", 0)),
        ("budget/travel_budget_v2.md", "# Travel budget 2026 (v2)\nStatus: approved\nThis version supersedes travel_budget_v1.md.\nTotal travel budget: 43500 EUR\nFlights and trains: 25000 EUR\nHotels: 18500 EUR\n",
         "2026-02-01T09:00:00Z", L("authoritative_record", "approved", "travel_budget", 1, ["budget/budget_register.csv"])),
        ("budget/budget_register.csv", "file,status,approved_on\ntravel_budget_v2.md,approved,2026-02-01\ntravel_budget_v1.md,draft,2026-01-10\n",
         "2026-02-02T09:00:00Z", L("authoritative_record")),
        ("budget/archive/old_note.txt", "Old travel budget note: hotels were cheaper last year.\n", "2025-12-01T09:00:00Z", L("out_of_scope")),
        ("drafts/travel_budget_FINAL.md", "# Travel budget 2026 FINAL\nStatus: final\nTotal travel budget: 52000 EUR\nFlights and trains: 25000 EUR\nHotels: 27000 EUR\n",
         "2026-03-05T09:00:00Z", L("false_final_version", "final", "travel_budget", None, ["notices/budget_memo.png"])),
        ("drafts/references_final.bib", "@article{lee2023,\n  title = {Survey of rail networks},\n  journal = {Rail Review},\n  year = {2023}\n}\n",
         "2026-03-01T09:00:00Z", L("false_final_version", "withdrawn", "references", None, ["notices/withdrawal_notice.md"])),
        ("drafts/references_v2.bib", "@article{kim2022,\n  title = {Rail network maintenance},\n  journal = {Rail Review},\n  year = {2022}\n}\n",
         "2026-02-20T09:00:00Z", L("authoritative_record", "approved", "references", 0, ["notices/withdrawal_notice.md"])),
        ("notices/withdrawal_notice.md", "Notice, 2 March 2026\nThe list drafts/references_final.bib is withdrawn.\nPlease use references_v2.bib instead.\n",
         "2026-03-02T09:00:00Z", L("authoritative_record")),
        ("notices/budget_memo.png", PNG, "2026-03-06T09:00:00Z", L("authoritative_record")),
        ("misc/redirect.txt", "The current travel budget moved to drafts/travel_budget_FINAL.md\n", "2026-03-06T10:00:00Z", L("misleading_redirection")),
        ("misc/cafeteria_menu.txt", "Monday: soup and bread\nTuesday: pasta\nWednesday: curry\n", "2026-01-05T09:00:00Z", L("out_of_scope")),
        ("misc/parking_rules.txt", "Parking permits renew every January.\nVisitors park on level two.\n", "2026-01-06T09:00:00Z", L("out_of_scope")),
        ("misc/empty.txt", "", "2026-01-07T09:00:00Z", L("out_of_scope")),
        ("misc/blob.bin", b"\x00\x01\x02\xff", "2026-01-08T09:00:00Z", L("out_of_scope")),
        ("misc/latin1.txt", "caf\xe9 receipt 12 EUR".encode("latin-1"), "2026-01-09T09:00:00Z", L("out_of_scope")),
    ]
    wf = [WorkspaceFile(p, d if isinstance(d, bytes) else d.encode(), t, None, lab) for p, d, t, lab in files]
    rubric = (Check("The reported travel budget total is 43500 EUR from the approved version",
                    "def check_func(final_state):\n    return final_state['answer']['value'] == 43500\n"),
              Check("The source is budget/travel_budget_v2.md",
                    "def check_func(final_state):\n    return final_state['answer']['source'] == 'budget/travel_budget_v2.md'\n"))
    return Workspace("ws-fixture", "Report the approved 2026 travel budget total in EUR and the file it comes from.",
                     tuple(wf), rubric, {"value": 43500, "source": "budget/travel_budget_v2.md"}, "task-1", "medium")


SMALL = CollectionConfig(max_files=5, min_files=2)
CFG = PrepareConfig(SMALL, EventConfig())


@pytest.fixture(scope="module")
def ws():
    return fixture()


@pytest.fixture(scope="module")
def roles():
    return make_roles("heuristic")


@pytest.fixture(scope="module")
def egs_map(ws, roles):
    return build_collection_map(ws, roles, mode="egs", config=SMALL)


@pytest.fixture(scope="module")
def egs_log(ws, roles, egs_map):
    return build_event_log(ws, egs_map, roles, mode="egs")


# ---- Collection Map ---------------------------------------------------------------------------

def test_initial_grouping_by_directory_and_count(ws):
    groups = initial_grouping(ws, max_files=5, min_files=2)
    # budget/archive (1 file < 2) folds into budget; misc (6 > 5) is cut into 2 chunks of 3.
    assert [(c.collection_id, c.name, c.members) for c in groups] == [
        ("c00", "(root)", ("README.md",)),
        ("c01", "budget", ("budget/archive/old_note.txt", "budget/budget_register.csv",
                           "budget/travel_budget_v1.md", "budget/travel_budget_v2.md")),
        ("c02", "drafts", ("drafts/references_final.bib", "drafts/references_v2.bib", "drafts/travel_budget_FINAL.md")),
        ("c03", "misc (1/2)", ("misc/blob.bin", "misc/cafeteria_menu.txt", "misc/empty.txt")),
        ("c04", "misc (2/2)", ("misc/latin1.txt", "misc/parking_rules.txt", "misc/redirect.txt")),
        ("c05", "notices", ("notices/budget_memo.png", "notices/withdrawal_notice.md")),
    ]
    assert coverage_problems(ws, groups) == []
    # 7 files with max 3: chunks 3, 2, 2 (earlier chunks larger).
    seven = dataclasses.replace(ws, files=tuple(WorkspaceFile(f"d/f{k}.txt", b"x", "2026-01-01T00:00:00Z") for k in range(7)))
    assert [len(c.members) for c in initial_grouping(seven, max_files=3, min_files=1)] == [3, 2, 2]


def test_coverage_check_names_every_problem(ws):
    good = initial_grouping(ws, max_files=5, min_files=2)
    dropped = (dataclasses.replace(good[0], members=()),) + good[1:]
    problems = coverage_problems(ws, dropped)
    assert "collection 'c00' is empty" in problems and "file 'README.md' is in no collection" in problems
    ghost = good + (Collection("c09", "ghost", ("nope.txt",)),)
    assert coverage_problems(ws, ghost) == ["collection 'c09' names 'nope.txt', which is not a file of the workspace"]


def test_cards_match_membership_and_quote_verbatim(ws, egs_map):
    for c in egs_map.collections:
        assert [e.path for e in c.card.contents] == sorted(c.members)
        assert set(c.card.source_paths) <= set(c.members)
        for e in c.card.evidence:
            assert e.path in c.members and e.quote in ws.file(e.path).text
    notices = egs_map.collection("c05").card
    png = next(e for e in notices.contents if e.path == "notices/budget_memo.png")
    assert png.kind == "image" and "not readable" in png.gist
    assert all(e.path != "notices/budget_memo.png" for e in notices.evidence)
    assert {"travel", "budget"} <= set(egs_map.collection("c01").card.themes)
    assert "rail" in egs_map.collection("c02").card.themes


def test_coordinator_history_on_fixture(egs_map):
    applied = [(h.round, h.proposal.kind, h.proposal.collections, h.proposal.paths) for h in egs_map.history
               if h.status == "applied"]
    # The FINAL budget copy reads like the budget files, not like the .bib files of drafts/;
    # the withdrawal notice names a file of drafts/; the redirect names the FINAL copy, which
    # lives in c01 only after the transfer, so its overlap succeeds in round 2.
    assert applied == [
        (1, "transfer", ("c02", "c01"), ("drafts/travel_budget_FINAL.md",)),
        (1, "overlap", ("c05", "c02"), ("notices/withdrawal_notice.md",)),
        (2, "overlap", ("c04", "c01"), ("misc/redirect.txt",)),
    ]
    stale = [h for h in egs_map.history if h.round == 1 and h.proposal.paths == ("misc/redirect.txt",)
             and h.proposal.kind == "overlap"]
    assert stale and stale[0].status == "rejected" and "not a member of c02" in stale[0].reason
    assert egs_map.collections_of("notices/withdrawal_notice.md") == ("c02", "c05")


def test_coverage_after_every_applied_change(ws, egs_map):
    collections = initial_grouping(ws, max_files=5, min_files=2)
    for h in egs_map.history:
        if h.status == "applied":
            collections, _ = APPLIERS[h.proposal.kind](collections, h.proposal, "c99")
            assert coverage_problems(ws, collections) == []
    assert [c.members for c in collections] == [c.members for c in egs_map.collections]


def test_change_breaking_coverage_is_rejected(ws, roles, monkeypatch):
    def lossy_transfer(collections, proposal, new_id):
        a, _ = proposal.collections
        return tuple(dataclasses.replace(c, members=tuple(p for p in c.members if p not in proposal.paths))
                     for c in collections), (a,)

    monkeypatch.setitem(APPLIERS, "transfer", lossy_transfer)
    cmap = build_collection_map(ws, roles, config=SMALL)
    transfer = [h for h in cmap.history if h.proposal.kind == "transfer"]
    assert transfer and all(h.status == "rejected" and "coverage check failed" in h.reason for h in transfer)
    assert coverage_problems(ws, cmap.collections) == []
    assert "drafts/travel_budget_FINAL.md" in cmap.collection("c02").members


def test_unsupported_proposals_are_rejected_with_reason(ws):
    collections = tuple(dataclasses.replace(c, card=Card.from_json(summarize_collection(
        ws, {"collection_id": c.collection_id, "members": list(c.members), "settings": SMALL.settings()})))
        for c in initial_grouping(ws, max_files=5, min_files=2))
    assert "not a theme of both cards" in support_problem(ws, collections, Proposal("merge", ("c01", "c02"), (), ("rail",)))
    assert support_problem(ws, collections, Proposal("merge", ("c01", "c02"))) == "no support given"
    assert "do not exist" in support_problem(ws, collections, Proposal("merge", ("c01", "c77"), (), ("x",)))
    bad_overlap = Proposal("overlap", ("c03", "c02"), ("misc/cafeteria_menu.txt",), ("drafts/references_v2.bib",))
    assert "named in the text" in support_problem(ws, collections, bad_overlap)
    good_overlap = Proposal("overlap", ("c05", "c02"), ("notices/withdrawal_notice.md",), ("references_v2.bib",))
    assert support_problem(ws, collections, good_overlap) is None
    split = Proposal("split", ("c01",), ("budget/archive/old_note.txt",), ("old",))
    assert support_problem(ws, collections, split) is None
    assert "every file split off" in support_problem(ws, collections, dataclasses.replace(split, support=("rail",)))


def test_scripted_coordinator_proposals_go_through_the_checks(ws, roles):
    def propose(workspace, task):
        return {"proposals": [
            {"kind": "merge", "collections": ["c03", "c04"], "paths": [], "support": ["curry"], "rationale": "x"},
            {"kind": "split", "collections": ["c01"], "paths": ["budget/archive/old_note.txt"], "support": ["old"],
             "rationale": "y"}]}

    custom = dataclasses.replace(roles, coordinator=HeuristicRole("semantic_coordinator", propose))
    cmap = build_collection_map(ws, custom, config=dataclasses.replace(SMALL, rounds=1))
    merge, split = cmap.history
    assert merge.status == "rejected" and "not a theme of both cards" in merge.reason
    assert split.status == "applied"
    new = cmap.collection("c06")
    assert new.members == ("budget/archive/old_note.txt",) and new.origin == "split"
    assert new.card.contents[0].path == "budget/archive/old_note.txt"  # refiner rewrote the card
    assert "budget/archive/old_note.txt" not in cmap.collection("c01").members


def test_heuristic_merge_then_split_then_transfer(roles):
    texts = {"mixed/rail_a.txt": "Rail network timetable for the northern rail line.",
             "mixed/rail_b.txt": "Rail line timetable changes on the northern network.",
             "mixed/menu_a.txt": "Cafeteria menu: soup, bread and curry.",
             "mixed/menu_b.txt": "Cafeteria lunch menu with curry and soup.",
             "other/rail_c.txt": "Northern rail network timetable summary."}
    w = Workspace("w-mixed", "q", tuple(WorkspaceFile(p, t.encode(), "2026-01-01T00:00:00Z") for p, t in texts.items()),
                  (Check("t", "x"),), {})
    cmap = build_collection_map(w, roles, config=CollectionConfig(max_files=6, min_files=1))
    # mixed/ is half about rail, so it merges with other/ (shared theme "rail"); the merged group
    # then splits into its two clear clusters (the split was proposed on mixed/ and still holds);
    # round 2 moves rail_c next to the other rail files.
    applied = [(h.round, h.proposal.kind, h.proposal.collections) for h in cmap.history if h.status == "applied"]
    assert applied == [(1, "merge", ("c00", "c01")), (1, "split", ("c00",)), (2, "transfer", ("c00", "c02"))]
    assert {c.collection_id: c.members for c in cmap.collections} == {
        "c00": ("mixed/menu_a.txt", "mixed/menu_b.txt"),
        "c02": ("mixed/rail_a.txt", "mixed/rail_b.txt", "other/rail_c.txt")}


def test_collection_map_json_round_trip_and_determinism(ws, roles, egs_map):
    again = CollectionMap.from_json(json.loads(egs_map.dumps()))
    assert again == egs_map
    assert build_collection_map(ws, roles, config=SMALL).dumps() == egs_map.dumps()


def test_tgs_groups_standard_family_files_with_their_evidence(ws, roles):
    cmap = build_collection_map(ws, roles, mode="tgs", config=SMALL)
    guided = {c.members for c in cmap.collections if c.origin == "task_guided"}
    assert guided == {("budget/budget_register.csv", "budget/travel_budget_v2.md"),
                      ("drafts/references_v2.bib", "notices/withdrawal_notice.md")}
    assert coverage_problems(ws, cmap.collections) == []
    card_text = json.dumps([c.card.to_json() for c in cmap.collections])
    assert "authoritative" not in card_text and "false_final" not in card_text


# ---- Event Log --------------------------------------------------------------------------------

def _relations(log):
    return {(e.relation.kind, e.relation.source, e.relation.target, e.relation.basis)
            for e in log.events if e.relation is not None}


def test_egs_events_on_fixture(egs_log):
    log, report = egs_log
    assert _relations(log) == {
        ("supersedes", "budget/travel_budget_v2.md", "budget/travel_budget_v1.md", "quoted"),
        ("copies", "budget/travel_budget_v2.md", "budget/travel_budget_v1.md", "inferred"),
        ("copies", "drafts/travel_budget_FINAL.md", "budget/travel_budget_v2.md", "inferred"),
        ("cites", "budget/budget_register.csv", "budget/travel_budget_v1.md", "quoted"),
        ("cites", "budget/budget_register.csv", "budget/travel_budget_v2.md", "quoted"),
        ("withdraws", "notices/withdrawal_notice.md", "drafts/references_final.bib", "quoted"),
        ("redirects", "notices/withdrawal_notice.md", "drafts/references_v2.bib", "quoted"),
        ("redirects", "misc/redirect.txt", "drafts/travel_budget_FINAL.md", "quoted"),
    }
    # The FINAL copy's withdrawal is image-only: nothing readable withdraws it, and its being the
    # newest budget file establishes nothing either.
    assert not any(r[0] in ("withdraws", "supersedes") and r[2] == "drafts/travel_budget_FINAL.md"
                   for r in _relations(log))
    assert report.discarded == () and log.synthetic and all(e.synthetic for e in log.events)
    for e in log.events:
        assert structure_problems(fixture(), e) == []


def test_causal_order_and_increasing_timestamps(egs_log):
    log, _ = egs_log
    position = {e.event_id: k for k, e in enumerate(log.events)}
    for a in log.events:
        for b in log.events:
            if a is not b and set(a.outputs) & set(b.inputs):
                assert position[a.event_id] < position[b.event_id]
    stamps = [e.timestamp for e in log.events]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def _later_note_ws(ws):
    later = WorkspaceFile("notes/meeting.md", b"Meeting notes, 9 March 2026\nWe discussed rail travel.\n",
                          "2026-03-09T09:00:00Z")
    return dataclasses.replace(ws, files=ws.files + (later,))


def test_later_timestamp_alone_never_establishes_withdrawal(ws, roles):
    w = _later_note_ws(ws)
    claim = Event("ev1", "write", "synthetic-actor", "2026-03-09T09:00:00Z", ("drafts/references_final.bib",),
                  ("notes/meeting.md",), (Excerpt("notes/meeting.md", "Meeting notes, 9 March 2026"),),
                  Relation("withdraws", "notes/meeting.md", "drafts/references_final.bib", "inferred"),
                  "the note is newer than the list")
    verdict = review_event(w, {"event": claim.to_json()})
    codes = {p["code"] for p in verdict["problems"]}
    assert verdict["verdict"] == "reject" and codes == {"relation_needs_quote", "relation_unsupported"}
    assert any("timestamp alone" in p["detail"] for p in verdict["problems"])
    # Even marked "quoted", a quote without withdrawal language naming the file does not do.
    quoted = dataclasses.replace(claim, relation=dataclasses.replace(claim.relation, basis="quoted"))
    assert review_event(w, {"event": quoted.to_json()})["verdict"] == "reject"
    kept, _ = review_with_repairs(w, claim, roles.reviewer, max_repairs=1)
    assert kept is not None and kept.relation is None and "relation dropped" in kept.note
    gone, reasons = review_with_repairs(w, claim, roles.reviewer, max_repairs=0)
    assert gone is None and any("relation_unsupported" in r for r in reasons) and "repair budget of 0 spent" in reasons
    # The pipeline never proposes it: the newer note names no file.
    log, _ = build_event_log(w, build_collection_map(w, roles, config=SMALL), roles)
    assert not any(e.relation and e.relation.source == "notes/meeting.md" for e in log.events)


def test_a_withdrawal_wrapped_over_lines_is_read_as_one_sentence(ws, roles):
    """A notice naming the file on a header line and withdrawing it in a sentence wrapped over
    two lines: the quote is the verbatim sentence (wrapped lines joined, a header block counts as
    one sentence), and the reviewer accepts it; without withdrawal words it only cites."""
    body = (b"Re: drafts/references_final.bib\n\nThe list references_final.bib circulated on 1 March\n"
            b"as the final list is withdrawn.\nUse the register.\n")
    public = ws.public()      # EGS needs no labels (and the removed notice is label evidence)
    target = "drafts/references_final.bib"

    def relations(data: bytes):
        notice = WorkspaceFile("notices/wrapped.txt", data, "2026-03-03T09:00:00Z")
        w = dataclasses.replace(public, files=tuple(f for f in public.files if f.path != "notices/withdrawal_notice.md")
                                + (notice,))
        log, _ = build_event_log(w, build_collection_map(w, roles, config=SMALL), roles)
        return [(e.relation.kind, e.excerpts[0].quote) for e in log.events
                if e.relation and e.relation.source == "notices/wrapped.txt" and e.relation.target == target]

    assert relations(b"NOTICE\n" + body) == [
        ("withdraws", "The list references_final.bib circulated on 1 March\nas the final list is withdrawn.")]
    assert relations(b"WITHDRAWAL NOTICE\n" + body) == [("withdraws", "WITHDRAWAL NOTICE\nRe: drafts/references_final.bib")]
    assert [k for k, _ in relations(b"NOTICE\n" + body.replace(b"is withdrawn", b"is attached"))] == ["cites"]


def test_deterministic_checks_and_unrepairable_discard(ws, roles):
    base = Event("ev9", "read", "synthetic-actor", "2026-03-01T00:00:00Z", ("drafts/references_v2.bib",), (),
                 (Excerpt("drafts/references_v2.bib", "title = {Rail network maintenance},"),))
    assert structure_problems(ws, base) == []
    codes = lambda e: {c for c, _ in structure_problems(ws, e)}  # noqa: E731
    assert codes(dataclasses.replace(base, inputs=("ghost.txt",))) == {"missing_path"}
    assert codes(dataclasses.replace(base, timestamp="yesterday")) == {"bad_timestamp"}
    assert codes(dataclasses.replace(base, excerpts=(Excerpt("notices/budget_memo.png", "x"),))) == {"excerpt_not_text"}
    fake = dataclasses.replace(base, excerpts=(Excerpt("drafts/references_v2.bib", "title = {Invented}"),))
    assert codes(fake) == {"excerpt_not_verbatim"}
    fixed, _ = review_with_repairs(ws, fake, roles.reviewer, max_repairs=1)
    assert fixed is not None and fixed.excerpts == ()
    gone, reasons = review_with_repairs(ws, dataclasses.replace(base, inputs=("ghost.txt",)), roles.reviewer, 3)
    assert gone is None and reasons[-1] == "not repairable"
    bad_copy = Event("ev8", "copy", "synthetic-actor", "2026-03-01T00:00:00Z", ("misc/parking_rules.txt",),
                     ("misc/cafeteria_menu.txt",), (Excerpt("misc/parking_rules.txt", "Visitors park on level two."),))
    verdict = review_event(ws, {"event": bad_copy.to_json()})
    assert verdict["verdict"] == "reject" and verdict["problems"][0]["code"] == "action_mismatch"


def test_cycles_are_discarded_and_order_is_causal(ws, roles):
    mk = lambda i, a, ins, outs, t: Event(i, a, "synthetic-actor", t, ins, outs)  # noqa: E731
    e1 = mk("a", "export", ("misc/parking_rules.txt",), ("misc/empty.txt",), "2026-01-01T00:00:00Z")
    e2 = mk("b", "export", ("misc/empty.txt",), ("misc/parking_rules.txt",), "2026-01-02T00:00:00Z")
    e3 = mk("c", "read", ("misc/empty.txt",), (), "2025-01-01T00:00:00Z")
    e4 = mk("d", "export", ("misc/cafeteria_menu.txt",), ("misc/latin1.txt",), "2026-05-01T00:00:00Z")
    e5 = mk("e", "read", ("misc/latin1.txt",), (), "2026-01-01T00:00:00Z")
    assert cycle_members([e1, e2, e3, e4, e5]) == {"a", "b"}
    events, discards, notes = integrate(ws, [e1, e2, e3, e4, e5], roles.integrator, 60)
    assert {d.event.event_id for d in discards} == {"a", "b"} and notes == []
    # e5 reads the file e4 writes: it follows e4 although its proposed time is earlier, and is re-timed.
    assert [e.event_id for e in events] == ["c", "d", "e"]
    assert [e.timestamp for e in events] == ["2025-01-01T00:00:00Z", "2026-05-01T00:00:00Z", "2026-05-01T00:01:00Z"]


def test_event_log_round_trip_and_events_for(egs_log):
    log, _ = egs_log
    assert EventLog.from_json(json.loads(log.dumps())) == log
    touching = log.events_for("drafts/references_final.bib")
    assert {e.relation.kind for e in touching} == {"withdraws"}
    record = json.loads(log.dumps())
    record["synthetic"] = False
    with pytest.raises(WorkspaceError, match="synthetic"):
        EventLog.from_json(record)


def test_tgs_log_passes_the_leak_audit_and_leaks_are_caught(ws, roles, tmp_path):
    layer = prepare(ws, mode="tgs", roles=roles, out_dir=tmp_path, config=CFG)
    public = json.loads((tmp_path / "event_log.json").read_text())
    assert find_leaks(public, ws) == []
    # TGS adds the family lineage (v1 -> v2 by labelled order) and request reads.
    assert any(e.action == "write" and e.inputs == ("budget/travel_budget_v1.md",) and e.relation is None
               for e in layer.event_log.events)
    assert any(e.action == "read" and e.relation is None for e in layer.event_log.events)
    leaky = json.loads(json.dumps(public))
    leaky["events"][0]["note"] = "the reported travel budget total is 43500 EUR"
    assert any("rubric check 0 text" in x for x in find_leaks(leaky, ws))
    labelled = json.loads(json.dumps(public))
    labelled["events"][0]["note"] = "this is a false final version"
    labelled["events"][1]["category"] = "noise"
    found = find_leaks(labelled, ws)
    assert "category phrase 'false final version' outside quotes" in found and "label field 'category' in the log" in found
    # A file that itself says "superseded version" may be quoted.
    quoted = json.loads(json.dumps(public))
    quoted["events"][0]["excerpts"] = [{"path": "x", "quote": "an old superseded version"}]
    assert find_leaks(quoted, ws) == []


def test_prepare_writes_only_under_out_dir_and_keeps_sources(ws, roles, tmp_path):
    src = save_workspace(ws, tmp_path / "src")
    before = tree_digest(src)
    loaded = load_workspace(src)
    out = tmp_path / "layer"
    layer = prepare(loaded, mode="egs", roles=roles, out_dir=out, config=CFG)
    assert tree_digest(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer", "src"]
    assert sorted(p.name for p in out.iterdir()) == ["collection_map.json", "event_log.json", "prepare_report.json"]
    assert CollectionMap.from_json(json.loads((out / "collection_map.json").read_text())) == layer.collection_map
    assert EventLog.from_json(json.loads((out / "event_log.json").read_text())) == layer.event_log
    again = prepare(loaded, mode="egs", roles=roles, out_dir=tmp_path / "again", config=CFG)
    assert again.event_log.dumps() == layer.event_log.dumps()
    assert (tmp_path / "again" / "collection_map.json").read_text() == (out / "collection_map.json").read_text()
    with pytest.raises(WorkspaceError, match="mode"):
        prepare(ws, mode="both", roles=roles, out_dir=tmp_path / "x")
    with pytest.raises(WorkspaceError, match="TGS needs file labels"):
        prepare(ws.public(), mode="tgs", roles=roles, out_dir=tmp_path / "y")


def test_prepare_on_unreadable_only_workspace(roles, tmp_path):
    files = (WorkspaceFile("a/empty.txt", b"", "2026-01-01T00:00:00Z"),
             WorkspaceFile("a/blob.bin", b"\x00\xff", "2026-01-01T00:00:00Z"),
             WorkspaceFile("b/pic.png", b"\x89PNG\r\n\x1a\nxx", "2026-01-01T00:00:00Z"),
             WorkspaceFile("b/old.txt", "na\xefve".encode("latin-1"), "2026-01-01T00:00:00Z"))
    w = Workspace("ws-bad", "Do something.", files, (Check("t", "def check_func(s):\n    return True\n"),), {})
    layer = prepare(w, roles=roles, out_dir=tmp_path, config=CFG)
    assert coverage_problems(w, layer.collection_map.collections) == []
    assert layer.event_log.events == ()


# ---- roles ------------------------------------------------------------------------------------

def _card_for(ws, cid, members):
    return summarize_collection(ws, {"collection_id": cid, "members": members, "settings": SMALL.settings()})


NOTICE_TASK = {"collection_id": "c05", "members": ["notices/budget_memo.png", "notices/withdrawal_notice.md"]}


def test_llm_runner_valid_reply(ws):
    good = json.dumps(_card_for(ws, "c05", NOTICE_TASK["members"]))
    client = ScriptedChatClient(lambda m: good)
    outcome = LLMRoleRunner("collection_summarizer", client)(ws, NOTICE_TASK)
    assert outcome.ok and outcome.attempts == 1 and outcome.value == json.loads(good)
    prompt = client.calls[0][1]["content"]
    assert "The list drafts/references_final.bib is withdrawn." in prompt and "not readable by the text tools" in prompt


def test_llm_runner_invalid_then_fixed(ws):
    good = _card_for(ws, "c05", NOTICE_TASK["members"])
    bad = dict(good, evidence=[{"path": "notices/withdrawal_notice.md", "quote": "The notice was invented."}])
    replies = iter([json.dumps(bad), "```json\n" + json.dumps(good) + "\n```"])
    client = ScriptedChatClient(lambda m: next(replies))
    outcome = LLMRoleRunner("collection_summarizer", client, max_repairs=2)(ws, NOTICE_TASK)
    assert outcome.ok and outcome.attempts == 2
    assert "does not occur verbatim" in client.calls[1][-1]["content"]


@pytest.mark.parametrize("reply, expected", [
    ("not json at all", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"collection_id": "c05", "themes": [], "contents": [], "evidence": []}), "schema"),
    ("MISSING", "not a file of the workspace"),
    ("KIND", "kind"),
    (RuntimeError("server down"), "the call failed"),
])
def test_llm_runner_always_invalid_is_rejected(ws, reply, expected):
    good = _card_for(ws, "c05", NOTICE_TASK["members"])
    if reply == "MISSING":
        reply = json.dumps(dict(good, source_paths=["notices/ghost.md"]))
    elif reply == "KIND":
        reply = json.dumps(dict(good, contents=[dict(c, kind="text") for c in good["contents"]]))
    client = ScriptedChatClient(lambda m: reply)
    outcome = LLMRoleRunner("collection_summarizer", client, max_repairs=1)(ws, NOTICE_TASK)
    assert not outcome.ok and outcome.attempts == 2 and len(client.calls) == 2
    assert expected in outcome.reason and outcome.value is None


def test_llm_integrator_order_must_respect_causality(ws):
    events = [Event("a", "export", "s", "2026-01-01T00:00:00Z", ("misc/cafeteria_menu.txt",), ("misc/latin1.txt",)).to_json(),
              Event("b", "read", "s", "2026-01-01T00:00:00Z", ("misc/latin1.txt",), ()).to_json()]
    replies = iter([json.dumps({"order": ["b", "a"]}), json.dumps({"order": ["a", "b"]})])
    client = ScriptedChatClient(lambda m: next(replies))
    outcome = LLMRoleRunner("timeline_integrator", client)(ws, {"events": events})
    assert outcome.ok and outcome.attempts == 2 and "must come first" in client.calls[1][-1]["content"]


def test_prepare_with_failing_llm_falls_back_and_records(ws, tmp_path):
    roles = make_roles("llm", ScriptedChatClient(lambda m: "no"), max_repairs=0)
    layer = prepare(ws, roles=roles, out_dir=tmp_path, config=CFG)
    assert coverage_problems(ws, layer.collection_map.collections) == []
    assert any("heuristic card used" in n for n in layer.collection_map.notes)
    assert layer.event_log.events == () and any("history_synthesizer failed" in n for n in layer.report["notes"])


def test_role_registry_and_heuristic_conformance(ws, egs_map, egs_log):
    roles = make_roles("heuristic")
    assert roles.backend == "heuristic" and tuple(roles.by_name()) == ROLE_NAMES
    with pytest.raises(RoleError, match="unknown role backend"):
        make_roles("oracle")
    with pytest.raises(RoleError, match="ChatClient"):
        make_roles("llm")
    card = egs_map.collection("c01").card.to_json()
    task = {"collection_id": "c01", "members": list(egs_map.collection("c01").members)}
    assert validate_output("collection_summarizer", ws, task, card) == []
    event = egs_log[0].events[0].to_json()
    assert validate_output("history_synthesizer", ws, {}, {"events": [event]}) == []
    assert validate_output("evidence_reviewer", ws, {"event": event}, review_event(ws, {"event": event})) == []
    broken = dict(event, synthetic=False)
    assert validate_output("history_synthesizer", ws, {}, {"events": [broken]})


# ---- precomputed workspace index ----------------------------------------------------------------

def _names_file_by_rule(line, path, w, allow_stem=False):
    """The documented naming rule written out independently of roles.names_file: the path; else
    the file name when no other file has it; else (allow_stem) a distinctive stem; each a whole token."""
    def mentions(token):
        return len(token) >= 3 and re.search(r"(?<![\w/.\-])" + re.escape(token) + r"(?![\w/\-]|\.\w)", line) is not None
    name = path.rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    unique = [f.name for f in w.files].count(name) == 1
    return (mentions(path) or (unique and mentions(name))
            or (unique and allow_stem and stem != name and re.search(r"[_\-0-9]", stem) is not None and mentions(stem)))


def _naming_ws(ws):
    extra = (WorkspaceFile("budget/archive/README.md", b"Archive readme; see README.md and travel_budget_v1 for the draft.\n",
                           "2026-01-03T08:00:00Z"),
             WorkspaceFile("notes/naming.md", "\n".join([
                 "Superseded by budget/travel_budget_v2.md today.",
                 "Refer to travel_budget_v1 and references_v2 for the older drafts.",
                 "An old copy, drafts/references_v2.bib.old, is not the list.",
                 "x/travel_budget_FINAL.md moved; README.md is ambiguous here.",
                 "budget_register.csv, approved; see redirect.txt",
                 "Total travel budget: 43500 EUR"]).encode() + b"\n", "2026-03-07T09:00:00Z"))
    mixed = {"mixed/rail_a.txt": "Rail network timetable for the northern rail line.",
             "mixed/rail_b.txt": "Rail line timetable changes on the northern network.",
             "mixed/menu_a.txt": "Cafeteria menu: soup, bread and curry.",
             "mixed/menu_b.txt": "Cafeteria lunch menu with curry and soup."}
    extra += tuple(WorkspaceFile(p, t.encode(), "2026-01-04T08:00:00Z") for p, t in mixed.items())
    extra += (WorkspaceFile("notes/travel_budget_v2.txt", b"Travel budget v2, exported.\n", "2026-02-03T09:00:00Z"),)
    return dataclasses.replace(ws, files=ws.files + extra)


def test_precomputed_index_gives_the_direct_results(ws, roles):
    """A WorkspaceIndex shared by many calls (as prepare shares one), already holding earlier
    answers, returns what the direct computation returns: lookups, naming, and every heuristic
    role compared with a fresh computation per call."""
    w = _naming_ws(ws)
    shared = WorkspaceIndex(w)
    cap = 40  # cuts several files, so prefixes differ from the full texts
    # Lookups, asked at two caps on the same index (the cap is part of every cached key).
    assert shared.unique == unique_names(w) and "README.md" not in shared.unique
    for f in w.files:
        assert shared.text(f.path) == f.text
        for c in (cap, None):
            assert shared.readable(f.path, c) == readable_text(f, c)
            assert shared.words(f.path, c) == words_of(f, c)
    assert shared.words("notes/naming.md", cap) != shared.words("notes/naming.md")
    for c in (cap, 100_000):
        cached, direct = shared.text_index(c), text_index(w, c)
        assert cached.terms == direct.terms and (cached.matrix == direct.matrix).all()
    assert shared.text_index(cap).terms != shared.text_index(100_000).terms
    # Naming: the index (precomputed unique names, token pre-filter) against the rule itself.
    hits = set()
    for f in w.files:
        if not f.text:
            continue
        lines = [ln.strip() for ln in f.text.splitlines() if ln.strip()]
        for g in w.files:
            for stem in (False, True):
                expected = [ln for ln in lines if _names_file_by_rule(ln, g.path, w, stem)]
                assert [ln for ln in lines if shared.names_file(ln, g.path, allow_stem=stem)] == expected
                assert [ln for ln in lines if names_file(ln, g.path, w, allow_stem=stem)] == expected
                assert shared.first_naming_line(lines, g.path, allow_stem=stem, within=f.text) == (expected or [None])[0]
                hits |= {(f.path, g.path, stem) for _ in expected}
    assert ("notes/naming.md", "budget/travel_budget_v1.md", True) in hits  # by stem only
    assert ("notes/naming.md", "budget/travel_budget_v1.md", False) not in hits
    assert ("notes/naming.md", "budget/archive/README.md", True) not in hits  # its name is not unique
    assert ("notes/naming.md", "README.md", False) in hits  # ... but this one's path is "README.md"
    assert ("notes/naming.md", "drafts/references_v2.bib", False) not in hits  # ".bib.old" is another file
    assert ("notes/naming.md", "misc/redirect.txt", False) in hits
    # Roles: the warm shared index against a fresh computation (index None) per call.
    groups = initial_grouping(w, max_files=5, min_files=2)
    with_cards = []
    for c in groups:
        task = {"collection_id": c.collection_id, "members": list(c.members), "settings": SMALL.settings()}
        card = summarize_collection(w, task, shared)
        assert card == summarize_collection(w, task)
        with_cards.append({"collection_id": c.collection_id, "origin": c.origin, "members": list(c.members),
                           "card": card})
    proposals = {}
    for silhouette in (0.99, SMALL.split_silhouette):  # the second must not reuse the first's "no split"
        settings = dataclasses.replace(SMALL, split_silhouette=silhouette).settings()
        task = {"collections": with_cards, "settings": settings}
        proposals[silhouette] = coordinate(w, task, shared)["proposals"]
        assert proposals[silhouette] == coordinate(w, task)["proposals"]
    assert not any(p["kind"] == "split" for p in proposals[0.99])
    assert any(p["kind"] == "split" and p["collections"] == ["c06"] for p in proposals[SMALL.split_silhouette])
    collections = tuple(Collection(c["collection_id"], "", tuple(c["members"]), Card.from_json(c["card"]))
                        for c in with_cards)
    for record in proposals[SMALL.split_silhouette]:
        proposal = Proposal.from_json(record)
        assert (support_problem(w, collections, proposal, index=shared)
                == support_problem(w, collections, proposal))
    events = []
    for mode in ("egs", "tgs"):
        for c in groups:
            task = _synthesis_task(w, c.members, mode, EventConfig())
            out = synthesize_events(w, task, shared)
            assert out == synthesize_events(w, task)
            events += out["events"]
    assert {e["action"] for e in events} == {"read", "write", "copy", "export"}
    for e in events:
        assert review_event(w, {"event": e}, shared) == review_event(w, {"event": e})
        assert structure_problems(w, Event.from_json(e), shared) == structure_problems(w, Event.from_json(e))
    # An index answers for its own workspace only.
    with pytest.raises(WorkspaceError, match="index"):
        summarize_collection(ws, {"collection_id": "c00", "members": ["README.md"]}, shared)

