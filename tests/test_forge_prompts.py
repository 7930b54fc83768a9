"""Appendix C's prompts: the C.2 solver-conditioned prompt and its order, the C.1 template shared by
the fixed recipes, repair prompts, the bundle reply parser, and prompt lengths before solving."""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re

import pytest

from envsched_jax.forge import families
from envsched_jax.forge import prompts as P
from envsched_jax.forge.actions import (ACTION_INDEX, ACTIONS, ARTIFACTS, FrontierConfig, TransferPriors,
                                        edit_mask, frontier_score, projected_pass_rate)
from envsched_jax.forge.bundle import BundleFile, convert
from envsched_jax.forge.candidates import ForgeConfig, SeedSpec, build_candidates
from envsched_jax.forge.milp import make_problem, select_actions
from envsched_jax.forge.verify import VerifyConfig, check_safety, declared_requirements

NAME, PARAMS = families.builtin_seeds()[2]          # logs-ranking-03: required and optional skills
SEED = families.to_bundle(NAME, PARAMS)
SKILLS = families.skills_of(PARAMS)
FIXED = ("few_shot", "self_instruct", "evol_instruct", "evol_instruct_depth", "evol_instruct_breadth")


def _spec(pass_rate: float) -> SeedSpec:
    return SeedSpec(NAME, pass_rate, SKILLS.required, SKILLS.optional)


def _selected(pass_rate: float) -> dict:
    """The MILP's decision record for the seed (the record the pipeline hands to materialisation)."""
    cands = build_candidates([_spec(pass_rate)], families.SKILL_GRAPH)
    (decision,) = select_actions(cands).decisions(make_problem(cands))
    return decision


def _user(messages) -> str:
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


# ---------------------------------------------------------------------------------------------
# C.2


def test_c2_prompt_states_the_decision_then_the_seed_files_in_the_papers_order():
    decision = _selected(8 / 15)                        # case V: near the frontier
    chosen = decision["action"]
    text = _user(P.request_messages(SEED, decision, "forge", rollouts=15))
    names = decision["skill_names"]
    kept = [names[i] for i in decision["skills_preserved"]]
    added = [names[i] for i in decision["skills_added"]]
    removed = [names[i] for i in decision["skills_removed"]]
    assert chosen.startswith("diversify_frontier") and kept and (added or chosen.endswith("in_depth"))
    rows = []
    for act in ACTIONS:
        q = projected_pass_rate(8 / 15, act)
        rows.append(f"- {act.name}: projected pass rate {q:.3f}, frontier score {frontier_score(q):.4f}")
    marks = [f"Action: {chosen}",
             "Pass rate of the seed under the current policy: 0.533",
             "Source: verifier rewards of 15 rollouts",
             "The seed lies in the frontier band",
             *rows,
             f"Projected pass rate of the rewritten task: {decision['projected_pass_rate']:.3f} (frontier band)",
             *[f"- must change: {a}:" for a in ARTIFACTS if decision["edit_mask"][a]],
             f"Preserved skills (keep exercising them): {', '.join(kept)}",
             f"Added skills (new requirements must exercise them): {', '.join(added) or '(none)'}",
             f"Removed skills (no requirement may still need them): {', '.join(removed) or '(none)'}",
             "No instruction-only edit",
             "No hidden requirement",
             "<<<FILE instruction.md",
             SEED.instruction.splitlines()[0],
             "<<<FILE task.toml",
             "<<<FILE solution/solve.sh"]
    positions = [text.find(mark) for mark in marks]
    assert -1 not in positions, [m for m, p in zip(marks, positions) if p < 0]
    assert positions == sorted(positions)
    assert "frontier score 0.9862" in text                           # the paper's case V value
    assert text.count("<- selected") == 1 and f"{chosen}: projected" in text.split("<- selected")[0].splitlines()[-1]
    for artifact in ARTIFACTS:
        if not decision["edit_mask"][artifact]:
            assert f"may stay as it is when the rewrite does not need it changed: {artifact}:" in text


def test_c2_bands_and_sources_for_saturated_and_overmatched_seeds():
    saturated = _selected(1.0)                            # case II: hardened in depth to 0.750
    text = _user(P.request_messages(SEED, saturated, "forge", pass_rate_source="predicted"))
    assert saturated["action"] == "increase_complexity/in_depth"
    assert "The seed lies in the saturated band (pass rate 1.000)" in text
    assert "predicted for a seed the current policy has not been rolled out on (0 rollouts)" in text
    assert "Projected pass rate of the rewritten task: 0.750 (frontier band)" in text
    overmatched = _user(P.request_messages(SEED, _selected(0.0), "forge", rollouts=8))
    assert "The seed lies in the overmatched band (pass rate 0.000)" in overmatched
    assert "Action: reduce_complexity/" in overmatched


@pytest.mark.parametrize("p, band", [(0.0, "overmatched"), (0.19, "overmatched"), (0.2, "frontier"),
                                     (0.5, "frontier"), (0.8, "frontier"), (0.81, "saturated"), (1.0, "saturated")])
def test_reward_band_edges_are_the_frontier_centre_plus_minus_one_and_a_half_widths(p, band):
    assert P.reward_band(p) == band
    narrow = FrontierConfig(center=0.3, width=0.1)        # edges 0.15 and 0.45
    assert P.reward_band(0.14, narrow) == "overmatched" and P.reward_band(0.46, narrow) == "saturated"
    assert P.reward_band(0.3, narrow) == "frontier"


def test_c2_matches_the_priors_the_selection_used_and_refuses_others():
    config = ForgeConfig(priors=TransferPriors(diversify_in_breadth=0.5))
    cands = build_candidates([_spec(0.9)], families.SKILL_GRAPH, config)
    (decision,) = select_actions(cands, config).decisions(make_problem(cands, config))
    text = _user(P.request_messages(SEED, decision, "forge", rollouts=10, config=P.PromptConfig(forge=config)))
    assert "diversify_frontier/in_breadth: projected pass rate 0.700" in text
    forced = {**decision, **P.candidate_decisions(_spec(0.9), families.SKILL_GRAPH, config)[5]}
    with pytest.raises(P.PromptError, match=r"projected_pass_rate'\] is 0.7, but the prompt's transfer priors "
                                            r"project 0.9 for diversify_frontier/in_breadth"):
        P.request_messages(SEED, forced, "forge", rollouts=10)


@pytest.mark.parametrize("change, kwargs, message", [
    ({"pass_rate": None}, {}, r"decision\['pass_rate'\] must be a number in \[0, 1\], got None"),
    ({"pass_rate": 1.5}, {}, r"decision\['pass_rate'\] must be a number in \[0, 1\], got 1.5"),
    ({"action": "grow/sideways"}, {}, r"decision\['action'\]: unknown action 'grow/sideways'"),
    ({"skills_added": [99]}, {}, r"decision\['skills_added'\] lists skill 99, which decision\['skill_names'\]"),
    ({"edit_mask": {"instruction": True}}, {}, r"decision\['edit_mask'\] must map each of"),
    ({}, {"rollouts": 0}, r"a pass rate from rollouts needs rollouts >= 1, got 0"),
    ({}, {"pass_rate_source": "guess", "rollouts": 3}, r"pass_rate_source must be 'rollouts' or 'predicted'"),
])
def test_c2_refuses_incomplete_decisions_naming_the_field(change, kwargs, message):
    decision = {**_selected(8 / 15), **change}
    with pytest.raises(P.PromptError, match=message):
        P.request_messages(SEED, decision, "forge", **({"rollouts": 15} | kwargs))


# ---------------------------------------------------------------------------------------------
# C.1


def _baseline_decision(recipe: str) -> dict:
    allowed = {"few_shot": "diversify_frontier/in_depth", "self_instruct": "diversify_frontier/in_breadth",
               "evol_instruct": "increase_complexity/in_breadth", "evol_instruct_depth": "increase_complexity/in_depth",
               "evol_instruct_breadth": "increase_complexity/in_breadth"}
    return {"action": allowed[recipe]}


@pytest.mark.parametrize("a, b", list(itertools.combinations(FIXED, 2)))
def test_fixed_recipes_differ_only_in_the_strategy_and_direction_fields(a, b):
    first, second = (P.request_messages(SEED, _baseline_decision(r), r) for r in (a, b))
    assert first[0] == second[0]                                          # one shared contract
    lines_a, lines_b = _user(first).splitlines(), _user(second).splitlines()
    assert len(lines_a) == len(lines_b)
    changed = [(x, y) for x, y in zip(lines_a, lines_b) if x != y]
    # evol_instruct alternates depth and breadth; on a breadth seed it is evol_instruct_breadth
    assert bool(changed) != ({a, b} == {"evol_instruct", "evol_instruct_breadth"}), (a, b)
    for x, y in changed:
        field = x.split(":")[0]
        assert field in ("Strategy", "Evolution direction") and y.startswith(field + ":"), (x, y)
    diff = [line for line in difflib.unified_diff(lines_a, lines_b, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert all(line[1:].startswith(("Strategy:", "Evolution direction:")) for line in diff)


def test_baseline_prompt_injects_the_recipe_and_direction_and_nothing_policy_relative():
    depth = _user(P.request_messages(SEED, _baseline_decision("evol_instruct_depth"), "evol_instruct_depth"))
    breadth = _user(P.request_messages(SEED, _baseline_decision("evol_instruct_breadth"), "evol_instruct_breadth"))
    assert "Strategy: evol_instruct - " in depth and "Evolution direction: in_depth - " in depth
    assert "Evolution direction: in_breadth - " in breadth
    few = _user(P.request_messages(SEED, _baseline_decision("few_shot"), "few_shot"))
    assert "Strategy: few_shot - " in few and "<<<FILE instruction.md" in few
    for text in (depth, breadth, few):
        assert "pass rate" not in text.lower() and "frontier score" not in text and "band" not in text
    # evol_instruct alternates the direction seed by seed: either direction of an increase is allowed
    alt = _user(P.request_messages(SEED, {"action": "increase_complexity/in_depth"}, "evol_instruct"))
    assert "Evolution direction: in_depth - " in alt


def test_requests_that_do_not_fit_their_recipe_are_refused():
    with pytest.raises(P.PromptError, match=r"recipe 'few_shot' allows only \['diversify_frontier/in_depth'\], but "
                                            r"the decision selects 'increase_complexity/in_depth'"):
        P.request_messages(SEED, {"action": "increase_complexity/in_depth"}, "few_shot")
    with pytest.raises(P.PromptError, match=r"recipe must be one of .* got 'wizard'"):
        P.request_messages(SEED, {"action": "increase_complexity/in_depth"}, "wizard")
    with pytest.raises(P.PromptError, match=r"recipe 'forge' gets the solver-conditioned prompt"):
        P.baseline_prompt(SEED, "forge", "in_depth")
    with pytest.raises(P.PromptError, match=r"direction must be one of \['in_breadth', 'in_depth'\], got 'up'"):
        P.baseline_prompt(SEED, "few_shot", "up")


def test_the_contract_states_every_rule_the_safety_check_enforces():
    """Each forbidden token the system message names is really refused by verify.check_safety, and
    its limits are VerifyConfig's."""
    config = P.PromptConfig(verify=VerifyConfig(max_instruction_chars=1234))
    system = P.system_prompt(config)
    assert "`FROM envsched-forge-base`" in system and "1234 characters" in system
    for word in ("WORKDIR", "COPY", "ENV", "LABEL", "CMD", "RUN and ADD are refused", "/logs/verifier/reward.txt",
                 "write 0 first", "exit 0", "no network"):
        assert word in system, word
    network = ["curl", "wget", "ssh", "scp", "rsync", "ftp", "telnet", "pip install", "apt install", "npm install",
               "git clone", "import socket", "urllib.request", "http.client", "import requests", "/dev/tcp/",
               "http://", "https://", "nc -"]
    hosts = ["/home/", "/root/", "/mnt/", "/media/", "/srv/", "/boot/", "/proc/1/", "/sys/fs/cgroup"]
    for token in network + hosts:
        assert token in system, token
        bad = SEED.with_file("solution/solve.sh", f"#!/bin/bash\n# {token} y\n".encode(), True)
        assert check_safety(bad, VerifyConfig()), f"the contract forbids {token!r} but check_safety accepts it"
    for line in ("RUN echo hi", "ADD a.txt /app/", "FROM ubuntu"):
        bad = SEED.with_file("environment/Dockerfile", f"FROM envsched-forge-base\n{line}\n".encode())
        assert check_safety(bad, VerifyConfig()), line


# ---------------------------------------------------------------------------------------------
# Repairs


@pytest.mark.parametrize("kind", P.REPAIR_KINDS)
def test_repair_prompts_quote_the_reason_and_keep_the_policy(kind):
    reason = f"the {kind} check says: something specific #{len(kind)}"
    failure = P.Failure(kind, reason)
    baseline = P.repair_prompt(SEED, _baseline_decision("self_instruct"), "self_instruct", failure)
    first = _user(P.request_messages(SEED, _baseline_decision("self_instruct"), "self_instruct"))
    assert f"failed the `{kind}` check" in baseline and f"Reason: {reason}" in baseline
    for field in ("Strategy:", "Evolution direction:"):
        line = next(x for x in first.splitlines() if x.startswith(field))
        assert line in baseline.splitlines()
    assert "Return the complete corrected bundle, every file, as one JSON object" in baseline
    decision = _selected(8 / 15)
    forge = P.repair_prompt(SEED, decision, "forge", failure)
    assert f"Reason: {reason}" in forge and f"Action: {decision['action']}; target pass rate 0.533." in forge
    assert "consistency contract" in forge
    guidance = {k: P.repair_prompt(SEED, decision, "forge", P.Failure(k, "r")).split("\n\n")[2] for k in P.REPAIR_KINDS}
    assert len(set(guidance.values())) == len(P.REPAIR_KINDS)          # each kind has its own guidance


def test_repair_prompt_quotes_a_bounded_tail_of_the_relevant_logs():
    config = P.PromptConfig(max_log_chars=300)
    log = "\n".join(f"line {k:04d} FAIL check_{k}" for k in range(200))
    failure = P.Failure("oracle", "oracle (exit 0) then tests gave reward 0.0",
                        {"oracle": "solve ran\n", "oracle_tests": log, "untouched_tests": "NOT QUOTED"})
    text = P.repair_prompt(SEED, {"action": "diversify_frontier/in_depth"}, "few_shot", failure, config)
    assert "Reason: oracle (exit 0) then tests gave reward 0.0" in text
    assert "line 0199 FAIL check_199" in text and "line 0000" not in text and "earlier characters not shown" in text
    quoted = text.split("Log `oracle_tests`")[1].split("```")[1]
    assert len(quoted) <= 300 + 80
    assert "Log `oracle`" in text and "solve ran" in text and "NOT QUOTED" not in text
    other = P.repair_prompt(SEED, {"action": "diversify_frontier/in_depth"}, "few_shot", P.Failure("inapplicable", "x"))
    assert "Correct the cause quoted above" in other


def test_repair_messages_keep_the_first_prompt_and_the_previous_reply():
    first = P.request_messages(SEED, {"action": "diversify_frontier/in_depth"}, "few_shot")
    config = P.PromptConfig(max_previous_reply_chars=50)
    messages = P.repair_messages(first, "x" * 120, SEED, {"action": "diversify_frontier/in_depth"}, "few_shot",
                                 P.Failure("parse", "reply: not valid JSON"), config)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[:2] == first
    kept = messages[2]["content"]
    assert kept.startswith("x" * 50 + "\n[... 70 more characters") and "x" * 51 not in kept
    assert "Reason: reply: not valid JSON" in messages[3]["content"]


# ---------------------------------------------------------------------------------------------
# The reply format


@pytest.mark.parametrize("index", [0, 7, 13, 17, 24])
def test_bundles_round_trip_through_the_reply_format(index):
    name, params = families.builtin_seeds()[index]
    bundle = families.to_bundle(name, params)
    assert P.parse_bundle_reply(P.bundle_to_reply(bundle), name) == bundle
    assert P.parse_bundle_reply(P.bundle_to_reply(bundle, include_requirements=True, indent=1), name) == bundle


def test_binary_files_fences_and_the_requirements_field():
    blob = bytes(range(256))
    bundle = SEED.with_file("environment/app/blob.bin", blob)
    text = P.bundle_to_reply(bundle)
    assert '"encoding": "base64"' in text
    assert P.parse_bundle_reply(f"Here is the bundle:\n```json\n{text}\n```\nDone.", NAME) == bundle
    assert P.parse_bundle_reply(f"```\n{text}\n```", NAME) == bundle
    doc = json.loads(text)
    doc["requirements"] = [{"id": "R9", "text": "**New thing.**"}]
    parsed = P.parse_bundle_reply(json.dumps(doc), NAME)
    assert declared_requirements(parsed) == {"R9": "**New thing.**"}
    assert parsed.skills == SEED.skills and parsed.files["environment/app/blob.bin"].data == blob
    assert parsed.metadata["metadata"]["forge"]["family"] == "logs"   # the rest of task.toml is kept


def _reply(**change) -> str:
    """A valid reply with one part changed: ``files`` entries by path (None deletes), or top keys."""
    doc = json.loads(P.bundle_to_reply(SEED))
    by_path = {f["path"]: f for f in doc["files"]}
    for path, entry in change.pop("files", {}).items():
        if entry is None:
            by_path.pop(path)
        else:
            by_path[path] = entry
    doc["files"] = list(by_path.values())
    doc.update(change)
    return json.dumps(doc)


GOOD_FILE = {"path": "tests/extra.txt", "content": "x"}


@pytest.mark.parametrize("text, kind, message", [
    ("", "parse", r"neither starts with '\{' nor holds a ```json fenced block \(the reply is empty\)"),
    ("Sure! I will write it.", "parse", r"neither starts with '\{'"),
    ('{"files": [', "parse", r"not valid JSON: Expecting value at line 1, column 12"),
    ("[1, 2]", "parse", r"neither starts with"),
    ('{"files": [], "files": []}', "parse", r"key 'files' appears twice in one JSON object"),
    ('{"files": []}', "parse", r"files must be a non-empty list"),
    ('{"files": {"a": 1}}', "parse", r"files must be a non-empty list"),
    (_reply(extra=1), "parse", r"unknown key 'extra' \(the keys are 'files' and 'requirements'\)"),
    (_reply(files={"x": "just a string"}), "parse", r"files\[\d+\] must be an object with 'path' and 'content', got str"),
    (_reply(files={"x": {"content": "y"}}), "parse", r"files\[\d+\]\.path must be a non-empty string, got None"),
    (_reply(files={"x": {"path": "/etc/passwd", "content": "y"}}), "parse", r"path '/etc/passwd' must be relative"),
    (_reply(files={"x": {"path": "tests/../../x", "content": "y"}}), "parse", r"'tests/../../x' must stay inside"),
    (_reply(files={"x": {"path": "tests//x", "content": "y"}}), "parse", r"'tests//x' must be normalised"),
    (_reply(files={"x": {"path": "tests/./x", "content": "y"}}), "parse", r"'tests/./x' must be normalised"),
    (_reply(files={"x": {"path": "tests\\x", "content": "y"}}), "parse", r"must be a POSIX path without backslashes"),
    (_reply(files={"x": {"path": "tests/a\nb", "content": "y"}}), "parse", r"without backslashes or control characters"),
    (_reply(files={"x": {"path": "README.md", "content": "y"}}), "parse", r"'README.md' is not part of a Harbor bundle"),
    (_reply(files={"x": {"path": "task.yaml", "content": "y"}}), "parse", r"'task.yaml' is not part of a Harbor bundle"),
    (_reply(files={"x": {"path": "tests/" + "a" * 300, "content": "y"}}), "parse", r"is longer than 200 characters"),
    (_reply(files={"x": {"path": "tests/x", "content": 3}}), "parse", r"files\[\d+\] \(tests/x\)\.content must be a string, got 3"),
    (_reply(files={"x": {"path": "tests/x", "content": "y", "executable": "yes"}}), "parse",
     r"\(tests/x\)\.executable must be true or false, got 'yes'"),
    (_reply(files={"x": {"path": "tests/x", "content": "y", "encoding": "latin-1"}}), "parse",
     r"\(tests/x\)\.encoding must be 'utf-8' or 'base64', got 'latin-1'"),
    (_reply(files={"x": {"path": "tests/x", "content": "not base64!", "encoding": "base64"}}), "parse",
     r"\(tests/x\)\.content is not valid base64"),
    (_reply(files={"x": {"path": "tests/x", "content": "y", "mode": 493}}), "parse", r"has unknown key 'mode'"),
    ('{"files": [{"path": "tests/x", "content": "\\ud800"}]}', "parse", r"\(tests/x\)\.content is not encodable as UTF-8"),
    (_reply(requirements={"R1": "x"}), "parse", r"requirements must be a list of \{'id', 'text'\} objects, got dict"),
    (_reply(requirements=[{"id": "R1"}]), "parse", r"requirements\[0\] must be an object with exactly 'id' and 'text'"),
    (_reply(requirements=[{"id": "R 1", "text": "x"}]), "parse", r"requirements\[0\]\.id must be 1-64 letters"),
    (_reply(requirements=[{"id": "R1", "text": " "}]), "parse", r"requirements\[0\]\.text must be a non-empty string"),
    (_reply(requirements=[{"id": "R1", "text": "a"}, {"id": "R1", "text": "b"}]), "parse",
     r"requirements\[1\]\.id 'R1' is declared twice"),
    (_reply(files={"tests/test.sh": None}), "schema", r"the files do not form a Harbor bundle: .*tests/test.sh: missing"),
    (_reply(files={"task.toml": {"path": "task.toml", "content": "version = "}}), "schema", r"task.toml: not valid TOML"),
    (_reply(files={"task.toml": {"path": "task.toml", "content": 'version = "1.0"\n[metadata]\nforge = 3\n'}},
            requirements=[{"id": "R1", "text": "x"}]), "schema", r"\[metadata.forge\] must be a table"),
    (_reply(files={"task.toml": {"path": "task.toml", "content": '[metadata.forge]\nrequirements = 3\n'}}),
     "schema", r"task.toml: \[metadata.forge\]\.requirements must be a list of \{'id', 'text'\} objects, got int"),
    (_reply(files={"task.toml": {"path": "task.toml", "content": '[metadata.forge]\nrequirements = [{id = "R1"}]\n'}}),
     "schema", r"task.toml: \[metadata.forge\]\.requirements\[0\] must be an object with exactly 'id' and 'text'"),
    (_reply(files={"tests/x": {"path": "tests/x", "content": "y"}, "tests/x/y": {"path": "tests/x/y", "content": "z"}}),
     "schema", r"tests/x: is both a file and a folder"),
])
def test_the_parser_rejects_bad_replies_naming_the_field_or_path(text, kind, message):
    with pytest.raises(P.BundleReplyError, match=message) as info:
        P.parse_bundle_reply(text, "out")
    assert info.value.kind == kind and str(info.value).startswith("reply:")


def test_the_parser_enforces_its_size_limits():
    text = _reply()
    total = sum(len(f.data) for f in SEED.files.values())
    cases = [(P.ReplyLimits(max_reply_chars=100), r"reply: is \d+ characters, over the limit of 100"),
             (P.ReplyLimits(max_files=3), rf"files lists {len(SEED.files)} files, over the limit of 3"),
             (P.ReplyLimits(max_file_bytes=1000), r"files\[\d+\] \([^)]+\) is \d+ bytes, over the limit of 1000"),
             (P.ReplyLimits(max_total_bytes=total - 1), rf"the files hold {total} bytes in all, over the limit"),
             (P.ReplyLimits(max_requirements=1), None)]
    for limits, message in cases[:-1]:
        with pytest.raises(P.BundleReplyError, match=message):
            P.parse_bundle_reply(text, "out", limits)
    two = _reply(requirements=[{"id": "a", "text": "x"}, {"id": "b", "text": "y"}])
    with pytest.raises(P.BundleReplyError, match=r"requirements lists 2 items, over the limit of 1"):
        P.parse_bundle_reply(two, "out", cases[-1][0])
    with pytest.raises(ValueError, match=r"ReplyLimits.max_files must be a positive int, got 0"):
        P.ReplyLimits(max_files=0)
    with pytest.raises(ValueError, match=r"PromptConfig.max_log_chars must be a positive int, got -1"):
        P.PromptConfig(max_log_chars=-1)


# ---------------------------------------------------------------------------------------------
# Seed files and prompt length


def test_long_binary_and_overflowing_seed_files_are_marked():
    long_log = "".join(f"2024-01-01T00:00:{k % 60:02d}Z web-1 INFO db: event {k}\n" for k in range(400))
    bundle = SEED.with_file("environment/app/logs/app.log", long_log.encode()).with_file(
        "environment/app/zz.bin", b"\xff\xfe\x00\x01")
    text = P.render_seed_files(bundle, P.PromptConfig(max_file_chars=500))
    block = text.split("<<<FILE environment/app/logs/app.log")[1].split("<<<END FILE>>>")[0]
    assert f"environment/app/logs/app.log is cut here: {len(long_log) - 500} more characters not shown" in block
    assert len(block) < 500 + 300
    assert "<<<FILE environment/app/zz.bin (binary, shown as base64, 4 bytes)>>>\n//4AAQ==" in text
    assert "<<<FILE solution/solve.sh (executable," in text and "Not shown" not in text
    # the task-defining files first (instruction, metadata, Dockerfile, oracle, tests), fixtures last
    order = re.findall(r"<<<FILE (\S+)", text)
    assert order[:3] == ["instruction.md", "task.toml", "environment/Dockerfile"]
    assert [p.split("/")[0] for p in order[3:]] == sorted((p.split("/")[0] for p in order[3:]),
                                                         key=["solution", "tests", "environment"].index)
    assert order == order[:3] + sorted(order[3:], key=lambda p: (["solution", "tests", "environment"].index(
        p.split("/")[0]), p))
    # a tight budget cuts, then lists what it cannot show; the section stays within it
    budget = 4000
    tight = P.render_seed_files(bundle, P.PromptConfig(max_file_chars=2000, max_seed_chars=budget))
    shown, _, listing = tight.partition("Not shown (the prompt's room for seed files is used up): ")
    assert listing and len(shown) <= budget
    names = re.findall(r"<<<FILE (\S+)", shown) + re.findall(r"(?:^|; )(\S+) \(\d+ bytes\)", listing)
    assert sorted(names) == sorted(bundle.files)                       # every file is shown or listed
    assert "environment/app/logs/app.log (" in listing and "<<<FILE instruction.md" in shown
    many = bundle.with_files({**bundle.files, **{f"environment/app/extra/{k:03d}.txt": BundleFile(b"x" * 300)
                                                  for k in range(60)}})
    crowded = P.render_seed_files(many, P.PromptConfig(max_seed_chars=budget))
    assert re.search(r"; and \d+ more files\.$", crowded) and crowded.count(" bytes);") + 1 <= 30 + 1


def test_a_terminal_bench_1_seed_is_shown_in_its_harbor_form():
    tb1 = convert(SEED, "tb1")
    text = _user(P.request_messages(tb1, {"action": "diversify_frontier/in_depth"}, "few_shot"))
    assert "<<<FILE solution/solve.sh" in text and "<<<FILE environment/Dockerfile" in text


def test_candidate_prompt_sizes_fill_seed_spec_prompt_tokens_before_solving():
    spec = _spec(8 / 15)
    sizes = P.candidate_prompt_sizes(SEED, spec, "forge", graph=families.SKILL_GRAPH, rollouts=15)
    decisions = P.candidate_decisions(spec, families.SKILL_GRAPH)
    assert len(sizes) == len(ACTIONS) == len(decisions)
    for size, decision in zip(sizes, decisions):
        messages = P.request_messages(SEED, decision, "forge", rollouts=15)
        assert size.chars == sum(len(m["content"]) for m in messages)
        assert size.tokens == sum(math.ceil(len(m["content"]) / 2.75) for m in messages)
    assert len({s.chars for s in sizes}) > 1                              # the candidates' prompts differ
    # the record a candidate would have matches the MILP's record of the same action, by skill names
    chosen = _selected(8 / 15)
    mine = decisions[ACTION_INDEX[chosen["action"]]]
    for key in ("skills_preserved", "skills_added", "skills_removed"):
        assert (sorted(mine["skill_names"][i] for i in mine[key])
                == sorted(chosen["skill_names"][i] for i in chosen[key]))
    index = ACTION_INDEX[chosen["action"]]
    assert mine["projected_pass_rate"] == chosen["projected_pass_rate"]
    assert mine["edit_mask"] == chosen["edit_mask"] == edit_mask(ACTIONS[index])
    assert sizes[index] == P.prompt_size(P.request_messages(SEED, chosen, "forge", rollouts=15))
    # filled in, the lengths are the constants the eligibility rule reads
    filled = SeedSpec(NAME, spec.pass_rate, spec.required, spec.optional, prompt_tokens=tuple(s.tokens for s in sizes))
    cap = sorted(s.tokens for s in sizes)[2]
    cands = build_candidates([filled], families.SKILL_GRAPH, ForgeConfig(max_prompt_tokens=cap))
    assert cands.eligible[0].tolist() == [s.tokens <= cap for s in sizes]
    # a fixed recipe's prompt depends on the direction only; a real tokenizer's counter can replace the estimate
    few = P.candidate_prompt_sizes(SEED, spec, "few_shot", graph=families.SKILL_GRAPH,
                                   count_tokens=lambda text: len(text.split()))
    assert len(set(few)) == 2 and few[0] == few[2] == few[4] and few[1] == few[3] == few[5]
    assert few[0].tokens == sum(len(m["content"].split()) for m in P.request_messages(
        SEED, {"action": "diversify_frontier/in_depth"}, "few_shot"))


def test_candidate_prompt_tokens_from_the_seed_alone_are_close_to_the_exact_counts():
    rough = P.candidate_prompt_tokens(SEED)
    assert len(rough) == len(ACTIONS) and all(isinstance(t, int) and t > 3000 for t in rough)
    for pass_rate, kwargs in ((0.0, {"pass_rate_source": "predicted"}), (8 / 15, {"rollouts": 15}),
                              (1.0, {"rollouts": 2048})):
        exact = P.candidate_prompt_tokens(SEED, _spec(pass_rate), **kwargs)
        assert exact == tuple(s.tokens for s in P.candidate_prompt_sizes(SEED, _spec(pass_rate), "forge", **kwargs))
        # the band names differ by a few characters; the predicted source line is the longer one
        assert all(-3 <= r - e <= 12 for r, e in zip(rough, exact)), (pass_rate, rough, exact)
    graph = P.candidate_prompt_tokens(SEED, _spec(8 / 15), graph=families.SKILL_GRAPH, rollouts=15)
    assert graph == tuple(s.tokens for s in P.candidate_prompt_sizes(SEED, _spec(8 / 15), "forge",
                                                                       graph=families.SKILL_GRAPH, rollouts=15))
    for recipe in FIXED:                                 # C.2 bounds every fixed recipe's prompt
        fixed = P.candidate_prompt_tokens(SEED, recipe=recipe)
        assert all(f < r for f, r in zip(fixed, rough)), recipe


def test_every_builtin_seeds_prompts_fit_the_selections_prompt_limit():
    limit = ForgeConfig().max_prompt_tokens
    for name, params in families.builtin_seeds():
        tokens = P.candidate_prompt_tokens(families.to_bundle(name, params))
        assert max(tokens) <= limit, (name, tokens)
