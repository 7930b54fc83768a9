"""EnvSched with its node axis sharded over 4 and 8 fake CPU devices selects exactly what one
device selects (``envsched_jax/sched/sharding.py``).

``--xla_force_host_platform_device_count`` must be set before JAX starts, so each device count
runs in its own process (``tests/sharded_envsched_run.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from envsched_jax.sched import EnvSched, EnvSchedConfig
from envsched_jax.sched.sharding import hlo_collectives, node_mesh, node_mesh_size, shard_scheduler

from sched_helpers import random_graph

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "sharded_envsched_run.py"


def _run(num_devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(num_devices)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict[int, dict]:
    return {d: _run(d) for d in (1, 4, 8)}


@pytest.mark.parametrize("devices", [4, 8])
def test_sharded_batches_identical_to_one_device(runs, devices):
    one, sharded = runs[1], runs[devices]
    assert sharded["devices"] == devices
    assert len(one["batches"]) == 22
    for t, (a, b) in enumerate(zip(one["batches"], sharded["batches"])):
        assert a == b, f"step {t}: {devices} devices picked {b}, one device {a}"
    np.testing.assert_array_equal(np.asarray(sharded["q"]), np.asarray(one["q"]))


@pytest.mark.parametrize("devices", [4, 8])
def test_node_axis_really_sharded(runs, devices):
    n = runs[devices]["num_nodes"]
    p = runs[devices]["placements"]
    assert p["num_obs"] == devices and p["after_load"] == devices
    assert p["nbr_in_shard_rows"] == [n // devices] * devices          # [N, Kw] split by rows
    assert p["obs_node_shard_shape"] == [[16, 8]] * devices             # the [S, B] ring replicated
    assert p["s_full_shard_shape"] == [[n, n // devices]] * devices     # S_full split by columns
    assert p["q"] == devices and p["q_spec"] == ["nodes"]   # scores come back sharded
    assert runs[1]["placements"]["num_obs"] == 1


@pytest.mark.parametrize("devices", [4, 8])
def test_no_collective_moves_the_similarity_matrix(runs, devices):
    n = runs[devices]["num_nodes"]
    collectives = runs[devices]["collectives"]
    select, observe = collectives["score_and_select"], collectives["observe"]
    # The partitioner did split the program (otherwise the check below says nothing): the greedy
    # picks reduce across devices.
    assert any(op == "all-reduce" for op, _ in select)
    # Per-node tables do move (the score pass gathers the neighbours' (W, ybar) for both
    # half-lives: 8 values per node); nothing as large as one device's shard of S_full does.
    largest = max(size for _, size in select + observe)
    assert largest <= 8 * n < n * n // devices, (largest, select, observe)


def test_node_count_must_divide_over_the_mesh():
    graph = random_graph(np.random.default_rng(0), num_envs=3, per_env=5, dtype=np.float32)   # N = 15
    sched = EnvSched(graph, EnvSchedConfig(batch_size=4, group_size=2))
    devices = jax.devices()[:1] * 2   # a 2-device mesh only has to be described, not run
    mesh = jax.sharding.Mesh(np.array(devices), ("nodes",))
    with pytest.raises(ValueError, match="15 nodes do not divide over 2 devices.*picks 1 of these 2"):
        shard_scheduler(sched, mesh)
    explicit = jax.make_mesh((1,), ("nodes",), axis_types=(jax.sharding.AxisType.Explicit,))
    with pytest.raises(ValueError, match="axis 'nodes' is .*Explicit"):
        shard_scheduler(sched, explicit)
    with pytest.raises(ValueError, match="no axis 'nodes'"):
        shard_scheduler(sched, jax.sharding.Mesh(np.array(jax.devices()[:1]), ("rows",)))


def test_node_mesh_takes_the_largest_dividing_device_count():
    assert {n: node_mesh_size(n, 8) for n in (40, 42, 15, 13, 3)} == {40: 8, 42: 7, 15: 5, 13: 1, 3: 3}
    mesh = node_mesh(40, jax.devices()[:1])
    assert mesh.shape["nodes"] == 1 and mesh.axis_names == ("nodes",)


def test_hlo_collectives_parses_results():
    text = """
  %all-gather.3 = f32[40]{0} all-gather(%p), channel_id=1, dimensions={0}
  %all-reduce.2 = (f32[], s32[8,2]) all-reduce(%a, %b), channel_id=2
  %all-reduce-start.1 = f32[4,5]{1,0} all-reduce-start(%c), channel_id=3
  %add.1 = f32[] add(%x, %y)
"""
    assert hlo_collectives(text) == [("all-gather", 40), ("all-reduce", 17), ("all-reduce", 20)]
