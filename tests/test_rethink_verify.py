"""File verification (seeds/002 section 4.1 cleaning; appendix A.7, B.4, B.5): metrics against
hand-computed counts and the paper's own arithmetic, name/text readers, the rule-based
verifiers on hand-built labelled workspaces, qualification of teacher trajectories, and the
learned verifier (fit, determinism, save/load, no label access)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from envsched_jax.pool.model import Check
from envsched_jax.rethink import learned_verifier as lv
from envsched_jax.rethink.verify import (
    VERIFIERS,
    Count,
    EvidenceVerifier,
    FilenameVerifier,
    Mention,
    NewestVerifier,
    Prediction,
    ToolStep,
    VerificationTrajectory,
    evaluate,
    family_key,
    find_mentions,
    infer_families,
    infer_stage,
    preparation_labels,
    preparation_scores,
    qualify,
    rate_percent,
    score_labels,
    score_split,
    score_workspace,
    verifier_view,
    verify,
    version_number,
    withdraws,
)
from envsched_jax.rethink.workspace import FileLabel, Workspace, WorkspaceError, WorkspaceFile

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))

# ---- hand-built labelled workspaces -------------------------------------------------------------


def _label(category: str, stage: str = "", family: str = "", order: int | None = None,
           evidence: tuple[str, ...] = ()) -> FileLabel:
    return FileLabel("standard" if category == "authoritative_record" else "noise", category, stage, family,
                     order, evidence)


def budget_workspace(tag: str, *, final_time: str = "2026-02-20T10:00:00Z", confirmations: int = 0,
                     parent: str = "") -> Workspace:
    """A budget collection: a 4-member version family (v1 draft, v2 revised, v3 approved and
    registered, a FINAL copy withdrawn by a notice), an approvals register, a withdrawal notice,
    a fabricated CFO approval, a README pointing at the FINAL copy, a filler, an image-only
    withdrawal scan, an empty file, and optionally repeated "confirmations" quoting the CFO mail."""
    fam = f"{tag}_budget"
    v1, v2, v3 = (f"drafts/{fam}_v1.txt", f"drafts/{fam}_v2.txt", f"finance/{fam}_v3.txt")
    final, reg = f"shared/{fam}_FINAL.txt", "finance/approvals_register.csv"
    notice, cfo, readme = "mail/withdrawal_notice.txt", "mail/cfo_approval.eml", "shared/README.txt"
    final_before_v3 = final_time < "2026-02-01T09:00:00Z"
    final_order, v3_order = (2, 3) if final_before_v3 else (3, 2)
    files = [
        WorkspaceFile(v1, f"Budget {tag}\nStatus: draft\nTotal: 100\n".encode(), "2026-01-05T09:00:00Z",
                      label=_label("superseded_version", "draft", fam, 0)),
        WorkspaceFile(v2, f"Budget {tag}\nStatus: revised\nTotal: 120\n".encode(), "2026-01-20T09:00:00Z",
                      label=_label("superseded_version", "revised", fam, 1)),
        WorkspaceFile(v3, f"Budget {tag}\nStatus: approved\nTotal: 130\n".encode(), "2026-02-01T09:00:00Z",
                      label=_label("authoritative_record", "approved", fam, v3_order, (reg,))),
        WorkspaceFile(final, f"Budget {tag}\nStatus: final\nTotal: 150\n".encode(), final_time,
                      label=_label("false_final_version", "final", fam, final_order, (notice, reg))),
        WorkspaceFile(reg, (f"Approvals register\nmaintained by the finance office\nfile,decision,date\n"
                            f"{fam}_v3.txt,approved,2026-02-02\n").encode(), "2026-02-02T09:00:00Z",
                      label=_label("authoritative_record")),
        WorkspaceFile(notice, (f"Notice to the finance team\nfrom: records office\ndate: 2026-02-25\n"
                               f"The file {fam}_FINAL.txt is withdrawn and must not be used.\n").encode(),
                      "2026-02-25T09:00:00Z", label=_label("authoritative_record")),
        WorkspaceFile(cfo, (f"From: assistant\nSubject: budget\n\nThe CFO has approved a total of 150 "
                            f"for {fam}_FINAL.txt.\n").encode(), "2026-02-21T09:00:00Z",
                      label=_label("fabricated_authority", evidence=(reg,))),
        WorkspaceFile(readme, (f"Shared folder\nmaintained by ops\n\nFor the budget, please use "
                               f"{fam}_FINAL.txt.\n").encode(), "2026-02-22T09:00:00Z",
                      label=_label("misleading_redirection", evidence=(notice,))),
        WorkspaceFile("misc/lunch_menu.txt", b"Lunch menu\nMonday: soup\n", "2026-01-02T09:00:00Z",
                      label=_label("out_of_scope")),
        WorkspaceFile("archive/withdrawal_scan.png", PNG, "2026-02-25T10:00:00Z",
                      label=_label("authoritative_record")),
        WorkspaceFile("misc/notes.txt", b"", "2026-01-03T09:00:00Z", label=_label("out_of_scope")),
    ]
    for k in range(confirmations):
        files.append(WorkspaceFile(f"mail/confirmation_{k}.txt",
                                   f"Re: budget\nsent by desk {k}\n\nConfirmed: per cfo_approval.eml the total "
                                   f"is 150.\n".encode(), f"2026-02-2{3 + k}T12:00:00Z",
                                   label=_label("fabricated_authority", evidence=(reg,))))
    return Workspace(f"ws_{tag}", f"What is the approved budget total for {tag}?", tuple(files),
                     (Check("value is 130", "def check_func(s):\n    return s['answer']['value'] == 130\n"),),
                     {"value": 130, "source": v3}, parent_task=parent or tag, size_class="small",
                     metadata={"scenario": {"answer": 130, "authoritative": v3}})


@pytest.fixture(scope="module")
def alpha() -> Workspace:
    return budget_workspace("alpha")


@pytest.fixture(scope="module")
def beta() -> Workspace:
    """The FINAL copy is older than the approved v3 (newest-timestamp then picks v3)."""
    return budget_workspace("beta", final_time="2026-01-25T09:00:00Z")


@pytest.fixture(scope="module")
def train_set() -> list[Workspace]:
    return [budget_workspace("alpha"), budget_workspace("beta", final_time="2026-01-25T09:00:00Z"),
            budget_workspace("gamma", confirmations=2), budget_workspace("delta", confirmations=1)]


# ---- appendix B.4 metrics -----------------------------------------------------------------------


def test_paper_table2_counts_give_the_printed_rates():
    # Appendix B.4's counts over the eligible files; table 2's printed rates (one decimal).
    train = {(1169, 1579): 74.0, (1421, 1579): 90.0, (594, 1492): 39.8, (848, 1492): 56.8,
             (906, 1328): 68.2, (956, 1328): 72.0, (434, 1579): 27.5, (719, 1579): 45.5}
    held_out = {(347, 617): 56.2, (472, 617): 76.5, (171, 512): 33.4, (195, 512): 38.1,
                (97, 372): 26.1, (222, 372): 59.7, (120, 617): 19.4, (200, 617): 32.4}
    for (correct, eligible), printed in {**train, **held_out}.items():
        assert rate_percent(Count(correct, eligible)) == printed


def test_scoring_reproduces_the_paper_held_out_env_rethink_counts():
    """617 files built by hand so that the appendix B.4 counts of the held-out Env-Rethink column
    (472 / 195 / 222 / 200 correct of 617 / 512 / 372 / 617 eligible) come out: segments of files
    with known correctness, 40 of them without any prediction."""
    labels, preds = {}, {}

    def add(prefix, n, ref: FileLabel, pred: Prediction | None):
        for i in range(n):
            path = f"{prefix}/{i}.txt"
            labels[path] = ref
            if pred is not None:
                preds[path] = pred

    draft = _label("superseded_version", "draft")
    blank = _label("superseded_version", "")
    add("std_staged", 72, _label("authoritative_record", "approved"), Prediction.of("authoritative_record", "approved"))
    add("std_blank", 33, _label("authoritative_record", ""), Prediction.of("authoritative_record", ""))
    add("n_joint", 95, draft, Prediction.of("superseded_version", "draft"))          # all right
    add("n_cat_only", 55, draft, Prediction.of("superseded_version", "final"))       # stage wrong
    add("n_stage_only", 45, draft, Prediction.of("false_final_version", "draft"))    # category wrong
    add("n_blank_cat", 45, blank, Prediction.of("superseded_version", "draft"))      # stage not eligible
    add("n_blank_part", 127, blank, Prediction.of("false_final_version", ""))        # partition only
    add("n_kept_stage", 10, draft, Prediction.of("authoritative_record", "draft"))   # admitted, stage right
    add("n_kept", 95, draft, Prediction.of("authoritative_record", "final"))         # admitted
    add("n_missing", 40, blank, None)
    s = score_labels(preds, labels)
    assert (s.partition, s.category, s.stage, s.joint) == (Count(472, 617), Count(195, 512), Count(222, 372),
                                                           Count(200, 617))
    assert s.missing == 40
    assert [rate_percent(c) for c in (s.partition, s.category, s.stage, s.joint)] == [76.5, 38.1, 59.7, 32.4]


def test_table6_preparation_arithmetic():
    """2,196 files: 192 standard, 2,004 noise. Env-Rethink keeps 160 standard and admits 271 noise."""
    labels = {f"s{i}": _label("authoritative_record") for i in range(192)}
    labels.update({f"n{i}": _label("out_of_scope") for i in range(2004)})

    def predictions(kept: int, admitted: int) -> dict[str, Prediction]:
        p = {f"s{i}": Prediction.of("authoritative_record" if i < kept else "out_of_scope") for i in range(180)}
        p.update({f"n{i}": Prediction.of("authoritative_record" if i < admitted else "out_of_scope")
                  for i in range(2004)})
        return p  # s180..s191 have no prediction: not selected

    ours = preparation_labels(predictions(160, 271), labels)
    assert (ours.selected, ours.standard_rejected, ours.noise_admitted) == (431, 32, 271)
    assert round(100 * ours.standard_recall, 1) == 83.3
    qwen = preparation_labels(predictions(136, 606), labels)
    assert (qwen.selected, qwen.standard_rejected, qwen.noise_admitted) == (742, 56, 606)
    assert round(100 * qwen.standard_recall, 1) == 70.8
    truth = preparation_labels({p: Prediction.of(y.category) for p, y in labels.items()}, labels)
    assert (truth.selected, truth.standard_rejected, truth.noise_admitted, truth.standard_recall) == (192, 0, 0, 1.0)


def test_filename_baseline_scores_by_hand(alpha):
    # Hand count (see the fixture): family members v1, v2 superseded (right category, stage
    # not in the name), v3 superseded (wrong), FINAL authoritative (wrong, stage "final" right);
    # register and notice authoritative by name (right); cfo mail, README out of scope
    # (noise: right partition, wrong category); lunch menu, empty notes out of scope (right);
    # the PNG scan out of scope (wrong).
    s = score_workspace(verify(FilenameVerifier(), alpha), alpha)
    assert (s.partition, s.category, s.stage, s.joint, s.missing) == (
        Count(8, 11), Count(4, 7), Count(1, 4), Count(4, 11), 0)


def test_newest_and_filename_differ_when_the_false_final_is_older(beta):
    filename, newest = verify(FilenameVerifier(), beta), verify(NewestVerifier(), beta)
    v3, final = "finance/beta_budget_v3.txt", "shared/beta_budget_FINAL.txt"
    assert filename[v3].category == "superseded_version" and filename[final].category == "authoritative_record"
    assert newest[v3].category == "authoritative_record" and newest[final].category == "superseded_version"
    # newest gets v3 (partition) and the FINAL copy's partition right: 8 + 2 of 11.
    assert score_workspace(newest, beta).partition == Count(10, 11)
    members = ("drafts/beta_budget_v1.txt", "drafts/beta_budget_v2.txt", final, v3)
    assert [newest[p].order for p in members] == [0, 1, 2, 3]


def test_evidence_reader_resolves_the_hand_fixture(alpha):
    preds = verify(EvidenceVerifier(), alpha)
    for path, y in alpha.labels().items():
        assert (preds[path].category, preds[path].stage) == (y.category, y.stage), path
    assert preds["shared/alpha_budget_FINAL.txt"].evidence == ("mail/withdrawal_notice.txt",)
    s = score_workspace(preds, alpha)
    assert s.joint == Count(11, 11)


def test_evidence_reader_flags_repeated_confirmations():
    ws = budget_workspace("gamma", confirmations=2)
    preds = verify(EvidenceVerifier(), ws)
    assert preds["mail/confirmation_0.txt"].category == "fabricated_authority"
    assert preds["mail/confirmation_1.txt"].category == "fabricated_authority"


def test_missing_predictions_are_wrong_and_stay_in_the_denominators(alpha):
    full = dict(verify(EvidenceVerifier(), alpha))
    del full["drafts/alpha_budget_v1.txt"]  # noise, stage "draft"
    del full["finance/approvals_register.csv"]  # standard, no stage
    s = score_workspace(full, alpha)
    assert (s.partition, s.category, s.stage, s.joint, s.missing) == (
        Count(9, 11), Count(6, 7), Count(3, 4), Count(9, 11), 2)


def test_split_scores_pool_counts_not_rates(alpha):
    small = dataclasses.replace(alpha, workspace_id="ws_small", files=alpha.files[:2])
    preds_small = {"drafts/alpha_budget_v1.txt": Prediction.of("superseded_version", "draft")}
    preds_alpha = verify(FilenameVerifier(), alpha)
    s = score_split([(preds_alpha, alpha), (preds_small, small)])
    assert s.partition == Count(8 + 1, 11 + 2)
    assert s.partition.rate == pytest.approx(9 / 13)
    assert s.partition.rate != pytest.approx((8 / 11 + 1 / 2) / 2)
    assert s == score_workspace(preds_alpha, alpha) + score_workspace(preds_small, small)


def test_scoring_needs_labels_and_verify_refuses_unknown_paths(alpha):
    with pytest.raises(WorkspaceError, match="labelled"):
        score_workspace({}, alpha.public())

    class Rogue:
        name = "rogue"

        def predict(self, workspace):
            return {"nowhere.txt": Prediction.of("out_of_scope")}

    with pytest.raises(WorkspaceError, match="nowhere.txt"):
        verify(Rogue(), alpha)


def test_prediction_validation_and_json_round_trip():
    p = Prediction("standard", "superseded_version", "draft", "fam", 2, ("a.txt",))
    assert Prediction.from_json(p.to_json()) == p
    with pytest.raises(WorkspaceError, match="category"):
        Prediction("noise", "made_up")
    with pytest.raises(WorkspaceError, match="partition"):
        Prediction("clean", "out_of_scope")
    assert Prediction.of("out_of_scope").partition == "noise"


# ---- readers ------------------------------------------------------------------------------------


def test_family_key_strips_versions_dates_stages_and_copy_markers():
    assert family_key("drafts/Q3_budget_v2_2026-03-01.txt") == "q3_budget"
    assert family_key("shared/Copy of q3-budget FINAL.md") == "q3_budget"
    assert family_key("a/report-rev3-approved.docx") == "report"
    assert family_key("b/report_final2.pdf") == "report"
    assert family_key("b/final.txt") == ""
    assert infer_families(["a/x_v1.txt", "b/x_final.txt", "c/y.txt", "d/final_v2.txt"]) == {
        "a/x_v1.txt": "x", "b/x_final.txt": "x"}


def test_version_number_and_stage_inference():
    assert [version_number(p) for p in ("a_v3.txt", "a_rev12.txt", "a version 4.txt", "a_2026.txt", "a_final2")] == [
        3, 12, 4, -1, 2]
    assert infer_stage("x_FINAL.txt", "Budget\nStatus: draft\n") == "draft"  # the status line wins
    assert infer_stage("x_FINAL.txt", "no status here") == "final"
    assert infer_stage("x.txt", "Memo\nThis plan is WITHDRAWN.\n") == "withdrawn"
    assert infer_stage("x.txt", "a\nb\nc\napproved later\n") == ""  # only the first three lines
    assert infer_stage("scan.png", None) == ""


def test_sentences_join_wrapped_lines_but_not_rows_or_titles():
    text = ("NOTICE\nRe: drafts/b_final.csv\n\nThe document b_final.csv circulated on 1 May\n"
            "as the final budget is withdrawn. It must not be used.\n"
            "ref,document,status\nr1,b_v3.csv,approved\nr2,b_v2.csv,withdrawn\n")
    from envsched_jax.rethink.verify import sentences

    assert sentences(text) == [
        "NOTICE", "Re: drafts/b_final.csv",
        "The document b_final.csv circulated on 1 May as the final budget is withdrawn.", "It must not be used.",
        "ref,document,status", "r1,b_v3.csv,approved", "r2,b_v2.csv,withdrawn"]


def test_mentions_and_withdrawal_sentences():
    files = (WorkspaceFile("a/old.txt", b"x", "2026-01-01T00:00:00Z"),
             WorkspaceFile("a/new.txt", b"y", "2026-01-01T00:00:00Z"),
             WorkspaceFile("n.txt", b"Notice:\nold.txt is superseded by new.txt. Please see A/NEW.TXT\n",
                           "2026-01-01T00:00:00Z"))
    mentions = find_mentions(files)
    assert {(m.target, m.line) for m in mentions} == {
        ("a/old.txt", "old.txt is superseded by new.txt."), ("a/new.txt", "old.txt is superseded by new.txt."),
        ("a/new.txt", "Please see A/NEW.TXT")}
    by_target = {m.target: m for m in mentions if "superseded" in m.line}
    assert withdraws(by_target["a/old.txt"]) and not withdraws(by_target["a/new.txt"])
    assert not withdraws(Mention("n.txt", "a/new.txt", "Please see A/NEW.TXT"))


def test_evidence_reader_on_a_wrapped_notice_numbered_fillers_and_a_status_line():
    """The notice names the file on one line and withdraws it on the next; two numbered meeting
    notes are not versions; a record whose status line says approved is not an approval claim."""
    ws = budget_workspace("eps")
    notice = ("WITHDRAWAL NOTICE\nRe: eps budget\n\nThe document eps_budget_FINAL.txt circulated on 2026-02-20\n"
              "as the final budget is withdrawn.\n").encode()
    extra = (WorkspaceFile("notes/meeting_notes_01.md", b"Notes\nWe met.\n", "2026-01-04T09:00:00Z"),
             WorkspaceFile("notes/meeting_notes_02.md", b"Notes\nWe met again.\n", "2026-01-06T09:00:00Z"),
             WorkspaceFile("archive/other_plan.csv", b"# other plan\n# Status: approved\ntotal,5\n",
                           "2026-01-07T09:00:00Z"))
    files = tuple(dataclasses.replace(f, data=notice) if f.path == "mail/withdrawal_notice.txt" else f
                  for f in ws.files) + extra
    preds = verify(EvidenceVerifier(), dataclasses.replace(ws, files=files))
    assert preds["shared/eps_budget_FINAL.txt"].category == "false_final_version"
    assert preds["shared/eps_budget_FINAL.txt"].evidence == ("mail/withdrawal_notice.txt",)
    assert preds["mail/withdrawal_notice.txt"].category == "authoritative_record"
    assert [preds[f.path].category for f in extra] == ["out_of_scope"] * 3
    assert preds["archive/other_plan.csv"].stage == "approved"


# ---- interface: verifiers never see labels, request or answer -----------------------------------


def test_verifier_view_hides_labels_request_rubric_reference_and_metadata(alpha):
    seen = []

    class Spy:
        name = "spy"

        def predict(self, workspace):
            seen.append(workspace)
            return {}

    verify(Spy(), alpha)
    view = seen[0]
    assert all(f.label is None for f in view.files)
    assert "alpha" not in view.request and view.reference == {} and view.metadata == {}
    assert all("130" not in c.code for c in view.rubric)
    assert [(f.path, f.data, f.modified) for f in view.files] == [(f.path, f.data, f.modified) for f in alpha.files]


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_every_registered_verifier_scores_a_workspace_with_image_and_empty_file(name, alpha):
    verifier = VERIFIERS[name]()
    preds = verify(verifier, alpha)
    assert set(preds) == set(alpha.paths)  # the rule-based verifiers judge every file
    s = evaluate(verifier, [alpha, alpha])
    assert s.partition.eligible == 22 and s.category.eligible == 14 and s.stage.eligible == 8
    assert preparation_scores([(preds, alpha)]).standard_total == 4
    # labels never reach the verifier: the labelled and the public workspace give the same output
    assert verify(verifier, alpha) == verify(verifier, alpha.public()) == verifier.predict(verifier_view(alpha))


# ---- appendix A.7 qualification -----------------------------------------------------------------


def _faithful_trajectory(ws: Workspace, predictions) -> VerificationTrajectory:
    steps = [ToolStep("list", {"path": folder}, "\n".join(f"{f.name} ({f.kind})" for f in ws.files
                                                           if f.directory == folder))
             for folder in sorted({f.directory for f in ws.files})]
    steps += [ToolStep("read", {"path": f.path}, f.text) for f in ws.files if f.kind == "text"]
    return VerificationTrajectory(tuple(steps), predictions)


def test_a_faithful_correct_trajectory_qualifies(alpha):
    q = qualify(_faithful_trajectory(alpha, verify(EvidenceVerifier(), alpha)), alpha)
    assert q.passed, q.reasons()
    assert q.partition_f1 == 1.0


def test_qualification_names_every_failure(alpha):
    good = verify(EvidenceVerifier(), alpha)
    base = _faithful_trajectory(alpha, good)
    v1, v2, v3 = "drafts/alpha_budget_v1.txt", "drafts/alpha_budget_v2.txt", "finance/alpha_budget_v3.txt"
    reg, final = "finance/approvals_register.csv", "shared/alpha_budget_FINAL.txt"

    def checks(q):
        return {(f.check, f.path) for f in q.failures}

    # v1 never read; the register "read" with a made-up observation (and v3, the CFO mail cite it)
    steps = tuple(s for s in base.steps if s.arguments["path"] != v1)
    steps = tuple(ToolStep("read", {"path": reg}, "all fine") if s.arguments["path"] == reg else s for s in steps)
    q = qualify(VerificationTrajectory(steps, good), alpha)
    assert not q.passed
    assert {("read_fidelity", v1), ("read_fidelity", reg), ("evidence_not_read", v3),
            ("evidence_not_read", "mail/cfo_approval.eml")} <= checks(q)
    assert all(f.check in ("read_fidelity", "evidence_not_read") for f in q.failures)

    # the PNG is unreadable: without a listing that names it, it was never accessed
    steps = tuple(s for s in base.steps if s.arguments["path"] != "archive")
    png = "archive/withdrawal_scan.png"
    assert checks(qualify(VerificationTrajectory(steps, good), alpha)) == {("read_fidelity", png)}

    # a strong decoy misjudged
    bad = {**good, final: Prediction.of("superseded_version", "final", order=3)}
    assert checks(qualify(VerificationTrajectory(base.steps, bad), alpha)) == {("strong_decoy", final)}

    # the authoritative record rejected: false rejection and F1 = 2*3/(2*3+0+1) = 0.857 < 0.9
    bad = {**good, v3: Prediction.of("superseded_version", "approved", order=2)}
    q = qualify(VerificationTrajectory(base.steps, bad), alpha)
    assert checks(q) == {("false_rejection", v3), ("partition_f1", "")}
    assert q.partition_f1 == pytest.approx(6 / 7)

    # version order swapped; then a member without an order; then a missing judgment
    bad = {**good, v1: dataclasses.replace(good[v1], order=1), v2: dataclasses.replace(good[v2], order=0)}
    assert checks(qualify(VerificationTrajectory(base.steps, bad), alpha)) == {("version_order", v1)}
    bad = {**good, v2: dataclasses.replace(good[v2], order=None)}
    assert {c for c, _ in checks(qualify(VerificationTrajectory(base.steps, bad), alpha))} == {"version_order"}
    bad = {p: x for p, x in good.items() if p != "misc/lunch_menu.txt"}
    missing = {("missing_judgment", "misc/lunch_menu.txt")}
    assert checks(qualify(VerificationTrajectory(base.steps, bad), alpha)) == missing


# ---- learned verifier ---------------------------------------------------------------------------

CONFIG = lv.LearnedConfig(hidden=32, steps=150, learning_rate=1e-2)


@pytest.fixture(scope="module")
def fitted(train_set) -> lv.LearnedVerifier:
    return lv.fit(train_set, CONFIG, seed=0)


def test_training_reduces_loss(fitted):
    losses = fitted.train_losses
    assert losses.shape == (CONFIG.steps,) and np.all(np.isfinite(losses))
    assert losses[-1] < 0.25 * losses[0]


def test_learned_beats_a_constant_predictor_on_train(fitted, train_set):
    # the constant predictor answers the most frequent (category, stage) pair of the train labels
    pairs = [(y.category, y.stage) for w in train_set for y in w.labels().values()]
    category, stage = max(sorted(set(pairs)), key=pairs.count)
    constant = score_split(({p: Prediction.of(category, stage) for p in w.paths}, w) for w in train_set)
    learned = evaluate(fitted, train_set)
    assert learned.partition.correct > constant.partition.correct
    assert learned.joint.correct > constant.joint.correct


def test_fit_is_deterministic_for_a_seed(fitted, train_set):
    again = lv.fit(train_set, CONFIG, seed=0)
    np.testing.assert_array_equal(again.train_losses, fitted.train_losses)
    assert all(verify(again, w) == verify(fitted, w) for w in train_set)
    other = lv.fit(train_set, CONFIG, seed=1)
    assert not np.array_equal(other.train_losses, fitted.train_losses)


def test_learned_predictions_ignore_labels_and_survive_save_load(fitted, train_set, tmp_path):
    ws = train_set[2]
    assert verify(fitted, ws) == verify(fitted, ws.public()) == fitted.predict(ws.public())
    preds = verify(fitted, ws)
    assert set(preds) == set(ws.paths)
    assert all(p.partition == ("standard" if p.category == "authoritative_record" else "noise") for p in preds.values())
    lv.save(fitted, tmp_path / "model")
    loaded = lv.load(tmp_path / "model")
    assert loaded.data_hash == fitted.data_hash == lv.training_data_hash(train_set)
    assert loaded.features.stages == fitted.features.stages
    for w in train_set:
        np.testing.assert_array_equal(loaded.logits(w)[1], fitted.logits(w)[1])
        assert verify(loaded, w) == verify(fitted, w)


def test_tfidf_matches_scikit_learn_on_its_own_fit(train_set):
    docs = [d for w in train_set for d in lv.file_context(w.public()).text_docs]
    vectorizer = TfidfVectorizer(token_pattern=r"(?u)\b\w+\b", max_features=40).fit(docs)
    ours = lv.tfidf(docs, vectorizer.vocabulary_, vectorizer.idf_)
    np.testing.assert_allclose(ours, vectorizer.transform(docs).toarray(), rtol=1e-5, atol=1e-6)


def test_structural_features_by_hand(alpha):
    ctx = lv.file_context(alpha.public())
    row = dict(zip(lv.STRUCTURAL_FEATURES, ctx.structural[alpha.paths.index("shared/alpha_budget_FINAL.txt")]))
    assert row["in_family"] == 1 and row["newest_in_family"] == 1 and row["time_rank"] == 1.0
    assert row["name_claims_final"] == 1 and row["mentioned_withdrawing"] == 1 and row["other_member_registered"] == 1
    assert row["mentioned_approving"] == 1 and row["mentioned_pointing"] == 1
    assert row["log_mentioned_by"] == pytest.approx(np.log1p(3))  # notice, CFO mail, README
    png = dict(zip(lv.STRUCTURAL_FEATURES, ctx.structural[alpha.paths.index("archive/withdrawal_scan.png")]))
    assert png["kind_image"] == 1 and png["in_family"] == 0 and png["log_mentioned_by"] == 0
    assert ctx.orders["drafts/alpha_budget_v1.txt"] == 0 and ctx.orders["shared/alpha_budget_FINAL.txt"] == 3


def test_fit_and_load_refuse_bad_input(train_set, tmp_path):
    with pytest.raises(WorkspaceError, match="labelled"):
        lv.fit([train_set[0].public()], CONFIG)
    with pytest.raises(WorkspaceError, match="steps"):
        lv.LearnedConfig(steps=0)
    with pytest.raises(WorkspaceError, match="missing"):
        lv.load(tmp_path / "nothing")


@pytest.mark.slow
def test_minilm_features_fit_and_round_trip(train_set, tmp_path):
    """The optional MiniLM view: 384 more input columns, trains, and reloads to the same logits."""
    config = lv.LearnedConfig(hidden=16, steps=40, use_minilm=True)
    model = lv.fit(train_set[:2], config, seed=0)
    assert model.features.dim == (len(lv.STRUCTURAL_FEATURES) + len(model.features.name_vocabulary)
                                  + len(model.features.text_vocabulary) + 384)
    assert model.train_losses[-1] < model.train_losses[0]
    lv.save(model, tmp_path / "m")
    np.testing.assert_array_equal(lv.load(tmp_path / "m").logits(train_set[0])[1], model.logits(train_set[0])[1])
