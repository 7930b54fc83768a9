"""One conformance test that every registered scheduler passes: the API, determinism, resume,
refusal of bad input, and restores that validate the whole checkpoint before changing anything."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from envsched_jax.sched import CheckpointError, SchedulerInputError, make_scheduler, registered_schedulers
from envsched_jax.sched.checkpoint import latest_checkpoint, restore_scheduler, save_scheduler

from sched_helpers import random_graph, reward_groups

B, K = 8, 4


@pytest.fixture(scope="module")
def graph():
    return random_graph(np.random.default_rng(0), num_envs=6, per_env=10, dtype=np.float32)


def _run(sched, steps, seed, start=0):
    rng = np.random.default_rng(seed + start)
    batches = []
    for t in range(start, start + steps):
        ids = sched.select(t)
        batches.append(ids)
        sched.observe(t, ids, reward_groups(rng, len(ids), K))
    return batches


def test_registry_has_the_schedulers():
    assert {"envsched", "random"} <= set(registered_schedulers())
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        make_scheduler("nope", None)


@pytest.mark.parametrize("name", registered_schedulers())
def test_conformance(name, graph, tmp_path):
    sched = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    batches = _run(sched, 5, seed=1)
    for ids in batches:  # distinct batches of the requested size, ids from the pool
        assert len(ids) == B and len(set(ids)) == B and set(ids) <= set(graph.task_ids)
    metrics = sched.metrics()
    assert [m.step for m in metrics] == list(range(5))
    assert all(m.realised_variance is not None and len(m.phases) == B for m in metrics)

    # Determinism for a seed.
    again = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    assert _run(again, 5, seed=1) == batches

    # Save at step 5, restore into a fresh scheduler: identical continuation.
    folder = save_scheduler(sched, tmp_path / name)
    assert latest_checkpoint(tmp_path / name) == folder
    restored = restore_scheduler(make_scheduler(name, graph, batch_size=B, group_size=K, seed=3), folder)
    assert _run(restored, 4, seed=1, start=5) == _run(sched, 4, seed=1, start=5)

    # Bad rewards are rejected and change nothing.
    t = 9
    ids = sched.select(t)
    before = sched._state_arrays()
    good = np.full((B, K), 0.5)
    for bad in (np.where(np.eye(B, K, dtype=bool), np.nan, good), good + 1.0, good[:, :K - 1],
                np.where(np.eye(B, K, dtype=bool), np.inf, good)):
        with pytest.raises(SchedulerInputError):
            sched.observe(t, ids, bad)
    complex_rewards = np.where(np.eye(B, K, dtype=bool), 0.5 + 0.25j, good)
    with pytest.raises(SchedulerInputError, match=r"rewards must be real numbers, got dtype complex128 "
                                                  r"\(e.g. np.complex128\(0.5\+0.25j\)\)"):
        sched.observe(t, ids, complex_rewards)
    with pytest.raises(SchedulerInputError, match=r"got dtype <U3 \(e.g. np.str_\('0.5'\)\)"):
        sched.observe(t, ids, np.full((B, K), "0.5"))
    with pytest.raises(SchedulerInputError, match=r"got dtype object \(e.g. None\)"):
        sched.observe(t, ids, np.where(np.eye(B, K, dtype=bool), None, good.astype(object)))
    with pytest.raises(SchedulerInputError, match=r"task ids must be strings; position 0 is None \(NoneType\)"):
        sched.observe(t, [None] + ids[1:], good)
    with pytest.raises(SchedulerInputError, match=r"position 1 is 7 \(int\)"):
        sched.observe(t, ids[:1] + [7] + ids[2:], good)
    with pytest.raises(SchedulerInputError, match="task_ids must be a sequence of task id strings, got NoneType"):
        sched.observe(t, None, good)
    with pytest.raises(SchedulerInputError, match="repeated"):
        sched.observe(t, [ids[0]] * B, good)
    with pytest.raises(SchedulerInputError, match="unknown"):
        sched.observe(t, ["nope"] + ids[1:], good)
    with pytest.raises(SchedulerInputError, match="was not selected"):
        sched.observe(t + 1, ids, good)
    with pytest.raises(SchedulerInputError, match="awaits observe"):
        sched.select(t + 1)
    after = sched._state_arrays()
    assert before.keys() == after.keys()
    for key in before:  # the state is exactly as before the bad calls
        np.testing.assert_array_equal(before[key], after[key])
    sched.observe(t, ids, good)  # and the right observation is still accepted


# -- restoring validates the whole checkpoint first --------------------------------------------

def _rewrite_arrays(folder: Path, change) -> None:
    with ocp.PyTreeCheckpointer() as ckpt:
        arrays = {k: np.asarray(v) for k, v in ckpt.restore(folder / "arrays").items()}
    change(arrays)
    with ocp.PyTreeCheckpointer() as ckpt:
        ckpt.save(folder / "arrays", arrays, force=True)


def _rewrite_header(folder: Path, change) -> None:
    header = json.loads((folder / "header.json").read_text())
    change(header)
    (folder / "header.json").write_text(json.dumps(header))


def _first_float_array(arrays) -> str | None:
    return next((k for k in sorted(arrays) if np.asarray(arrays[k]).dtype.kind == "f"), None)


def _checkpoint_cases(name, graph, tmp_path):
    """(label, checkpoint folder, expected message) for every way a checkpoint can be wrong."""
    def saved(label, *, graph_=graph, batch_size=B, group_size=K, steps=3):
        sched = make_scheduler(name, graph_, batch_size=batch_size, group_size=group_size, seed=3)
        rng = np.random.default_rng(5)
        for t in range(steps):
            ids = sched.select(t)
            sched.observe(t, ids, reward_groups(rng, len(ids), group_size))
        return save_scheduler(sched, tmp_path / label)

    arrays = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3).state_dict()["arrays"]
    first = sorted(arrays)[0]
    cases = []

    folder = saved("bad-step")
    _rewrite_header(folder, lambda h: h.update(next_step="three"))
    cases.append(("header type", folder, "header field 'next_step' must be an integer, got 'three'"))

    folder = saved("bad-name")
    _rewrite_header(folder, lambda h: h.update(name=None))
    cases.append(("header name", folder, "header field 'name' must be a string, got None"))

    folder = saved("no-config")
    _rewrite_header(folder, lambda h: h.pop("config"))
    cases.append(("header field missing", folder, "header fields differ from ['config', 'graph_hash', "
                  "'name', 'next_step', 'num_nodes', 'task_ids_hash']: missing ['config'], unknown []"))

    folder = saved("shape")
    _rewrite_arrays(folder, lambda a: a.update({first: np.concatenate([a[first], a[first][:1]])}))
    shape = list(np.asarray(arrays[first]).shape)
    cases.append(("array shape", folder, f"state array {first!r} has shape {[shape[0] + 1] + shape[1:]}, "
                  f"expected {shape}"))

    folder = saved("dtype")
    _rewrite_arrays(folder, lambda a: a.update(key=np.asarray(a["key"], np.float32)))
    cases.append(("array dtype", folder, "state array 'key' has dtype float32 (float), expected uint32 "
                  "(unsigned integer)"))

    floating = _first_float_array(arrays)
    if floating is not None:   # every scheduler but random keeps float statistics
        folder = saved("nan")
        _rewrite_arrays(folder, lambda a: a[floating].reshape(-1).__setitem__(-1, np.nan))
        index = [int(i) - 1 for i in np.asarray(arrays[floating]).shape]
        cases.append(("NaN", folder, f"state array {floating!r} holds nan at index {index}; every value "
                      "must be finite"))

    cases.append(("K = 8 into K = 4", saved("k8", group_size=8),
                  "saved under a different config: group_size: 8 in the checkpoint, 4 here"))
    cases.append(("another B", saved("b6", batch_size=6),
                  "saved under a different config: batch_size: 6 in the checkpoint, 8 here"))
    other = random_graph(np.random.default_rng(1), num_envs=6, per_env=10, dtype=np.float32)
    cases.append(("another graph", saved("graph", graph_=other), "the state was saved for a different graph"))
    smaller = random_graph(np.random.default_rng(0), num_envs=6, per_env=9, dtype=np.float32)
    cases.append(("another pool", saved("pool", graph_=smaller), "saved for a different pool: 54 tasks"))

    if name == "envsched":   # its state carries the step too: the two must agree
        folder = saved("step-mismatch")
        _rewrite_header(folder, lambda h: h.update(next_step=4))
        cases.append(("step mismatch", folder, "state array 'step' is 3 but the header's next_step is 4"))
        # neighbour lists out of observe's order (the score pass reads their medians by position)
        folder = saved("nbr-order")

        def swap_first_row_with_two(a):
            row = int(np.argmax((a["nbr_cross"] >= 0).sum(1) >= 2))
            assert (a["nbr_cross"][row, :2] >= 0).all() and a["nbr_cross_sim"][row, 0] > a["nbr_cross_sim"][row, 1]
            a["nbr_cross"][row, :2] = a["nbr_cross"][row, 1::-1].copy()
            a["nbr_cross_sim"][row, :2] = a["nbr_cross_sim"][row, 1::-1].copy()
        _rewrite_arrays(folder, swap_first_row_with_two)
        cases.append(("neighbour order", folder, "state array 'nbr_cross' row "))
    return cases


@pytest.mark.parametrize("name", registered_schedulers())
def test_restore_validates_everything_and_changes_nothing(name, graph, tmp_path):
    sched = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    twin = make_scheduler(name, graph, batch_size=B, group_size=K, seed=3)
    assert _run(sched, 2, seed=7) == _run(twin, 2, seed=7)
    for label, folder, message in _checkpoint_cases(name, graph, tmp_path):
        with pytest.raises(CheckpointError) as info:
            restore_scheduler(sched, folder)
        assert str(info.value).startswith(f"{folder}: "), label
        assert message in str(info.value), (label, str(info.value))
        assert isinstance(info.value, SchedulerInputError)
    # Nothing was replaced: the next batches and every array equal the untouched twin's.
    assert sched._next_step == twin._next_step == 2
    for key, value in twin._state_arrays().items():
        np.testing.assert_array_equal(sched._state_arrays()[key], value, err_msg=key)
    assert _run(sched, 3, seed=8, start=2) == _run(twin, 3, seed=8, start=2)


def test_restore_names_a_missing_or_broken_checkpoint(graph, tmp_path):
    sched = make_scheduler("random", graph, batch_size=B, group_size=K, seed=3)
    with pytest.raises(CheckpointError, match="cannot read the header"):
        restore_scheduler(sched, tmp_path / "nowhere")
    folder = save_scheduler(sched, tmp_path / "ckpt")
    (folder / "header.json").write_text('{"name": "random",\n "next_step": }')
    with pytest.raises(CheckpointError, match=r"header.json: line 2: invalid JSON \(Expecting value\)"):
        restore_scheduler(sched, folder)
