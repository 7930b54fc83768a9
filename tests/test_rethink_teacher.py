"""The paper's route to a learned verifier (seeds/002 section 4.1, appendix A.5-A.7, B.1-B.3):
sub-environment cuts keep the evidence chains, the heuristic teacher reads through the file tools
before judging, qualification failures are retried with revised hints and recorded, the SFT mask
covers exactly the assistant tokens, overlength examples are dropped whole, student prompts carry
no hint, a few SFT steps lower a tiny model's dev loss, and the LLM teacher's tool loop (with a
scripted client) validates and repairs replies."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from envsched_jax.graph.llm_clients import ScriptedChatClient
from envsched_jax.pool.model import Check
from envsched_jax.rethink import teacher as T
from envsched_jax.rethink.generator import GeneratorConfig, generate_benchmark
from envsched_jax.rethink.verify import EvidenceVerifier, qualify, score_split, verifier_view
from envsched_jax.rethink.workspace import FileLabel, Workspace, WorkspaceFile

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


@pytest.fixture(scope="module")
def bench():
    return generate_benchmark(GeneratorConfig(seed=3, num_parents=4, variants_per_parent=2))


def toy_workspace(k: int = 0, *, image: bool = False) -> Workspace:
    """A hand-made labelled collection the evidence rules solve: a version family (v1 superseded,
    v2 authoritative, FINAL a false final withdrawn by a notice), a register and a filler."""
    total = 100 + 10 * k
    std = lambda stage="", family="", order=None, ev=(): FileLabel("standard", "authoritative_record", stage,
                                                                   family, order, ev)
    files = [
        WorkspaceFile(f"fin/plan{k}_v1.txt", f"Plan {k} draft\nStatus: draft\nTotal: {total - 5}\n".encode(),
                      "2026-01-02T10:00:00Z", label=FileLabel("noise", "superseded_version", "draft", f"plan{k}", 0,
                                                              (f"fin/plan{k}_v2.txt",))),
        WorkspaceFile(f"fin/plan{k}_v2.txt", f"Plan {k}\nStatus: approved\nTotal: {total}\n".encode(),
                      "2026-01-05T10:00:00Z", label=std("approved", f"plan{k}", 1, ("fin/approvals_register.csv",))),
        WorkspaceFile(f"drafts/plan{k}_FINAL.txt", f"Plan {k} FINAL\nStatus: final\nTotal: {total + 50}\n".encode(),
                      "2026-01-09T10:00:00Z", label=FileLabel("noise", "false_final_version", "final", f"plan{k}", 2,
                                                              ("notes/withdrawal.txt",))),
        WorkspaceFile("fin/approvals_register.csv", f"document,status\nplan{k}_v2.txt,approved\n".encode(),
                      "2026-01-06T10:00:00Z", label=std()),
        WorkspaceFile("notes/withdrawal.txt", f"Notice: plan{k}_FINAL.txt is withdrawn.\n".encode(),
                      "2026-01-10T10:00:00Z", label=std()),
        WorkspaceFile("misc/lunch.md", b"Lunch menu: soup\n", "2026-01-01T00:00:00Z",
                      label=FileLabel("noise", "out_of_scope")),
    ]
    if image:
        files.append(WorkspaceFile("misc/photo.png", PNG, "2026-01-01T00:00:00Z",
                                   label=FileLabel("noise", "out_of_scope")))
    rubric = (Check("value", "def check_func(final_state):\n    return True\n"),)
    return Workspace(f"toy-{k}", "What is the approved total?", tuple(files), rubric,
                     {"value": total, "source": f"fin/plan{k}_v2.txt"}, f"toy-parent-{k}", "small",
                     {"sub_environment_of": f"toy-{k}"})


# ---- sub-environments ---------------------------------------------------------------------------


def test_sub_environments_keep_every_chain(bench):
    config = T.SubEnvConfig(per_workspace=3, seed=1)
    for ws in bench.train:
        subs = T.cut_sub_environments(ws, config)
        assert subs, ws.workspace_id
        labels = ws.labels()
        must = {p for p, y in labels.items() if y.category != "out_of_scope"}
        families = {}
        for p, y in labels.items():
            if y.family:
                families.setdefault(y.family, set()).add(p)
        sets = [frozenset(s.paths) for s in subs]
        assert all(sets.count(x) <= 2 for x in sets)                      # A.2: identical sets at most twice
        for sub in subs:
            kept = set(sub.paths)
            assert must <= kept                                            # records, decoys, redirects, evidence
            for path in kept:
                assert set(labels[path].evidence) <= kept                  # every label's evidence inside
                assert sub.file(path).label == labels[path]                # labels carried unchanged
            for members in families.values():
                assert members <= kept                                     # whole version families
            lo, hi = {"small": (4, 12), "medium": (8, 30), "large": (1, 80)}[sub.size_class]
            assert lo <= len(sub.files) <= hi
            assert sub.metadata["sub_environment_of"] == ws.workspace_id
            assert sub.parent_task == ws.parent_task
    again = T.cut_all(bench.train[:2], config)
    assert [s.paths for s in again] == [s.paths for s in T.cut_all(bench.train[:2], config)]


def test_core_closure_pulls_in_a_filler_named_as_evidence():
    ws = toy_workspace()
    files = list(ws.files)
    # the register's label now cites the filler: the cut must keep the filler
    files[3] = dataclasses.replace(files[3], label=FileLabel("standard", "authoritative_record",
                                                             evidence=("misc/lunch.md",)))
    ws = dataclasses.replace(ws, files=tuple(files))
    assert "misc/lunch.md" in T.core_paths(ws)
    assert "misc/lunch.md" not in T.core_paths(toy_workspace())


# ---- the heuristic teacher ----------------------------------------------------------------------


def test_heuristic_teacher_reads_each_file_before_judging(bench):
    sub = T.cut_sub_environments(bench.train[0], T.SubEnvConfig(per_workspace=1))[0]
    run = T.HeuristicTeacher().run(verifier_view(sub), T.Hint("L0"))
    steps = run.trajectory.steps
    assert steps[0].tool == "list"
    read_at = {}
    for i, s in enumerate(steps):
        if s.tool == "read":
            read_at.setdefault(s.arguments["path"], i)
    for f in sub.files:
        if f.kind == "text":
            assert f.path in read_at, f.path
            assert f.text.rstrip("\n") in steps[read_at[f.path]].observation   # observation is the file
    # the judgments are those of the evidence rules on what was read
    assert run.trajectory.predictions == EvidenceVerifier().predict(verifier_view(sub))
    q = qualify(run.trajectory, sub)
    assert not [f for f in q.failures if f.check in ("read_fidelity", "evidence_not_read", "missing_judgment")]
    # the hint changes only the recorded prompt
    other = T.HeuristicTeacher().run(verifier_view(sub), T.Hint("L2", "notes"))
    assert other.trajectory == run.trajectory and other.prompt != run.prompt and T.HINTS["L2"] in other.prompt


def test_heuristic_teacher_lists_unreadable_files_and_qualifies_on_toy():
    ws = toy_workspace(image=True)
    qt, attempts = T.qualify_with_retries(T.HeuristicTeacher(), ws)
    assert qt is not None and len(attempts) == 1 and attempts[0].passed
    assert qt.provenance.teacher == "heuristic" and qt.provenance.hint_level == "L0" and qt.provenance.attempt == 0
    assert "misc/photo.png" in qt.trajectory.steps[0].observation
    assert not any(s.tool == "read" and s.arguments["path"] == "misc/photo.png" for s in qt.trajectory.steps)


# ---- qualification and retries ------------------------------------------------------------------


def protocol_client(good_when: str | None = None, wrong_path: str = "drafts/plan0_FINAL.txt"):
    """A scripted LLM teacher on toy_workspace(0): lists, reads every text file, answers with the
    reference labels - except that, while ``good_when`` is absent from the system prompt, it calls
    ``wrong_path`` out of scope."""
    ws = toy_workspace(0)

    def respond(messages):
        reads = [json.loads(m["content"])["arguments"]["path"] for m in messages
                 if m["role"] == "assistant" and '"read_file"' in m["content"]]
        if len([m for m in messages if m["role"] == "assistant"]) == 0:
            return json.dumps({"tool": "list_files", "arguments": {"directory": ""}})
        todo = [f.path for f in ws.files if f.kind == "text" and f.path not in reads]
        if todo:
            return json.dumps({"tool": "read_file", "arguments": {"path": todo[0]}})
        rows = []
        for f in ws.files:
            row = {"path": f.path, **f.label.to_json()}
            if good_when is not None and good_when not in messages[0]["content"] and f.path == wrong_path:
                row.update(partition="noise", category="out_of_scope")
            rows.append(row)
        return json.dumps({"judgments": rows})

    return ScriptedChatClient(respond)


def test_failed_trajectory_is_retried_with_a_revised_hint_and_recorded():
    ws = toy_workspace(0)
    teacher = T.LLMTeacher(protocol_client(good_when="Notes from the review"))
    record = T.run_teachers([ws], [teacher])
    assert len(record.accepted) == 1 and record.failed == ()
    first, second = record.attempts
    assert not first.passed and any(r.startswith("strong_decoy: drafts/plan0_FINAL.txt") for r in first.reasons)
    assert second.passed and second.provenance.attempt == 1 and second.provenance.hint_level == "L1"
    assert "strong_decoy" in second.provenance.hint_notes and "false_final_version" in second.provenance.hint_notes
    accepted = record.accepted[0]
    assert accepted.provenance == second.provenance
    assert record.summary()["accepted_by_attempt"] == {"1": 1}


def test_persistent_failure_gets_two_retries_then_is_kept_for_analysis():
    ws = toy_workspace(0)
    teacher = T.LLMTeacher(protocol_client(good_when="never present"))
    record = T.run_teachers([ws], [teacher])
    assert record.accepted == () and record.failed == (("toy-0", "llm"),)
    assert [a.provenance.hint_level for a in record.attempts] == ["L0", "L1", "L2"]
    assert [a.provenance.attempt for a in record.attempts] == [0, 1, 2]
    assert all(not a.passed and a.reasons for a in record.attempts)
    with pytest.raises(ValueError):
        T.QualifyConfig(max_retries=3)


# ---- the SFT corpus -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from envsched_jax.learner.chat_tokenizer import train_chat_tokenizer

    accepted = [T.qualify_with_retries(T.HeuristicTeacher(), toy_workspace(k))[0] for k in range(3)]
    return train_chat_tokenizer(T.corpus_texts(accepted) * 2, vocab_size=1000)


def test_mask_covers_exactly_the_assistant_tokens(tokenizer):
    messages = [{"role": "system", "content": "Verify."}, {"role": "user", "content": "Collection c"},
                {"role": "assistant", "content": '{"tool":"list_files"}'},
                {"role": "user", "content": "Observation of list_files:\n1 files"},
                {"role": "assistant", "content": '{"judgments":[]}'}]
    tokens, mask = T.tokenize_chat(tokenizer, messages)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(tokens.tolist()) == full                     # nothing lost or added
    runs, current = [], []
    for t, m in zip(tokens.tolist(), mask.tolist()):
        if m:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    decoded = [tokenizer.decode(r) for r in runs]
    assert decoded == ['{"tool":"list_files"}<|im_end|>', '{"judgments":[]}<|im_end|>']
    # the masked text is exactly the assistant content plus the end token, nothing else
    assert sum(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in decoded) == int(mask.sum())


def test_overlength_examples_are_dropped_whole_and_hints_stay_out(tokenizer):
    accepted = []
    for k in range(4):
        qt, _ = T.qualify_with_retries(T.HeuristicTeacher(), toy_workspace(k))
        # give each a revised L2 hint in its provenance, as a retried trajectory would have
        accepted.append(dataclasses.replace(qt, provenance=dataclasses.replace(
            qt.provenance, hint_level="L2", hint_notes="- strong_decoy: SECRET-NOTE")))
    full = T.build_corpus(accepted, tokenizer, T.CorpusConfig(max_tokens=100_000, dev_share=0.0))
    lengths = sorted(e.length for e in full.train)
    cutoff = lengths[1]                                                   # keeps the two shortest or so
    part = T.build_corpus(accepted, tokenizer, T.CorpusConfig(max_tokens=cutoff, dev_share=0.0))
    by_id = {e.example_id: e for e in full.train}
    assert {e.example_id for e in part.train} == {i for i, e in by_id.items() if e.length <= cutoff}
    assert {i for i, _ in part.dropped} == {i for i, e in by_id.items() if e.length > cutoff}
    for e in part.train:                                                  # kept whole, not truncated
        np.testing.assert_array_equal(e.tokens, by_id[e.example_id].tokens)
    for e in full.train:
        text = tokenizer.decode(e.tokens.tolist())
        assert "SECRET-NOTE" not in text and T.HINTS["L1"] not in text and T.HINTS["L2"] not in text
        assert "Hints for this run" not in text
        assert text.startswith("<|im_start|>system\n" + T.student_prompt())


def test_rotation_among_teachers():
    ws = [toy_workspace(k) for k in range(4)]
    base = [T.qualify_with_retries(T.HeuristicTeacher(), w)[0] for w in ws]
    twins = [dataclasses.replace(q, provenance=dataclasses.replace(q.provenance, teacher="other")) for q in base]
    picked = T.rotate_teachers(base + twins, per_sub_env=1)
    assert [q.provenance.teacher for q in picked] == ["heuristic", "other", "heuristic", "other"]
    assert len(T.rotate_teachers(base + twins, per_sub_env=2)) == 8


def test_truncation_keeps_each_call_response_pair():
    qt, _ = T.qualify_with_retries(T.HeuristicTeacher(), toy_workspace(0))
    messages = T.trajectory_messages(qt.workspace, qt.trajectory, max_observation_chars=20)
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * len(qt.trajectory.steps) + ["assistant"]
    long_obs = [m for m in messages[3::2][:-1] if "truncated" in m["content"]]
    assert long_obs and all(len(m["content"]) < 120 for m in messages[3:-1:2])
    assert json.loads(messages[-1]["content"])["judgments"][0]["path"] == sorted(qt.workspace.paths)[0]


# ---- SFT through the learner --------------------------------------------------------------------


def test_a_few_sft_steps_lower_the_dev_loss_of_a_tiny_model(tokenizer):
    from envsched_jax.learner import models
    from envsched_jax.learner.optim import OptimConfig
    from envsched_jax.learner.trainer import Trainer, TrainerConfig

    accepted = [T.qualify_with_retries(T.HeuristicTeacher(), toy_workspace(k))[0] for k in range(5)]
    corpus = T.build_corpus(accepted, tokenizer, T.CorpusConfig(max_tokens=4096, dev_share=0.2, seed=0))
    assert len(corpus.dev) == 1 and len(corpus.train) == 4
    config = dict(models.tiny_llama(len(tokenizer)), max_position_embeddings=4096)
    trainer = Trainer(models.make_model(config, seed=0), models.forward,
                      TrainerConfig(objective="sft", optim=OptimConfig(learning_rate=1e-2, warmup_steps=0,
                                                                       total_steps=8)))
    pad = tokenizer.pad_token_id
    fn = T.make_lm_metrics_fn(trainer)
    before = T.lm_metrics(trainer, corpus.dev, pad, metrics_fn=fn)
    for step in range(8):
        idx = T.batch_indices(len(corpus.train), 1, seed=0, step=step)
        metrics = trainer.train(T.pad_examples([corpus.train[i] for i in idx], pad))
    after = T.lm_metrics(trainer, corpus.dev, pad, metrics_fn=fn)
    assert after["loss"] < before["loss"] - 1.0, (before, after)
    assert after["token_accuracy"] > before["token_accuracy"]
    assert before["tokens"] == float(sum(e.loss_mask[1:].sum() for e in corpus.dev))
    assert np.isfinite(metrics["loss"])


# ---- the LLM teacher's tool loop ----------------------------------------------------------------


def test_fake_llm_teacher_validates_repairs_and_qualifies():
    ws = toy_workspace(0)
    inner = protocol_client()
    script = iter(["I think I will look around.",                                 # no JSON: repair
                   '{"tool": "delete_file", "arguments": {}}'])                     # not a read tool: schema

    def respond(messages):
        nxt = next(script, None)
        if nxt is not None:
            return nxt
        reply = inner.respond([m for m in messages if not m["content"].startswith("Invalid reply")
                               and m["content"] not in ("I think I will look around.",
                                                        '{"tool": "delete_file", "arguments": {}}')])
        return reply

    run = T.LLMTeacher(ScriptedChatClient(respond)).run(verifier_view(ws), T.Hint("L0"))
    assert run.problems[0] == "no JSON object in the reply"
    assert run.problems[1].startswith("schema:")
    assert qualify(run.trajectory, ws).passed
    assert [s.tool for s in run.trajectory.steps] == ["list"] + ["read"] * 6


def test_llm_judgments_with_unknown_paths_are_rejected_and_unparsable_output_is_missing():
    value = {"judgments": [{"path": "nope.txt", "partition": "noise", "category": "out_of_scope"},
                           {"path": "misc/lunch.md", "partition": "noise", "category": "out_of_scope",
                            "evidence": ["ghost.txt"]},
                           {"path": "fin/plan0_v1.txt", "partition": "noise", "category": "superseded_version"}]}
    preds, problems = T.judgments_of(value, toy_workspace(0).paths)
    assert list(preds) == ["fin/plan0_v1.txt"] and len(problems) == 2
    assert T.parse_reply('{"judgments": [{"path": "a", "partition": "maybe", "category": "x"}]}')[0] is None
    garbage = ScriptedChatClient(lambda messages: "lorem ipsum")
    ws = toy_workspace(0)
    predictions, issues = T.student_verify(garbage, [ws], T.LoopConfig(max_repairs=1))
    assert predictions == [{}] and "gave up" in issues[0][-1]
    scores = score_split(zip(predictions, [ws]))
    assert scores.missing == len(ws.files) and scores.partition.correct == 0 and scores.joint.correct == 0
