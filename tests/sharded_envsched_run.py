"""One EnvSched run with the node axis sharded over D fake CPU devices (``tests/test_sharding.py``).

Usage: ``python tests/sharded_envsched_run.py D`` (D = 1 runs unsharded). The XLA flag that
creates D host devices must be set before JAX starts, hence a process per device count. Prints
one JSON object: the batch of every step, the final q, how the state is placed, and the
collectives of both compiled programs (``envsched_jax.sched.sharding.compiled_collectives``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NUM_DEVICES = int(sys.argv[1])
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={NUM_DEVICES}").strip()
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from envsched_jax.sched import EnvSched, EnvSchedConfig  # noqa: E402
from envsched_jax.sched.sharding import compiled_collectives, node_mesh, shard_scheduler  # noqa: E402

from sched_helpers import random_graph, reward_groups  # noqa: E402

STEPS, RELOAD_AT = 22, 11
B, K = 8, 4


def main() -> None:
    assert len(jax.devices()) == NUM_DEVICES, jax.devices()
    # N = 80 divides over 1, 4 and 8 devices, and one device's S_full shard (80 x 10 at 8 devices) is
    # larger than the per-node tables the score pass gathers (80 x 8): the collectives test tells
    # them apart. Tasks 3 and 17 are identifier-filtered.
    graph = random_graph(np.random.default_rng(4), num_envs=5, per_env=16, dtype=np.float32)
    sched = EnvSched(graph, EnvSchedConfig(batch_size=B, group_size=K, step_capacity=16),
                     excluded=("t3", "t17"))
    if NUM_DEVICES > 1:
        shard_scheduler(sched, node_mesh(graph.num_nodes))
    rng = np.random.default_rng(0)
    batches, placements = [], {}
    for t in range(STEPS):
        if t == RELOAD_AT:   # a snapshot loaded mid-run goes back on the mesh and continues alike
            sched.load_state_dict(sched.state_dict())
            placements["after_load"] = len(sched.state.num_obs.sharding.device_set)
        ids = sched.select(t)
        batches.append(ids)
        sched.observe(t, ids, reward_groups(rng, B, K))
    state = sched.state
    placements.update(
        num_obs=len(state.num_obs.sharding.device_set),
        nbr_in_shard_rows=[s.data.shape[0] for s in state.nbr_in.addressable_shards],
        obs_node_shard_shape=[list(s.data.shape) for s in state.obs_node.addressable_shards],
        s_full_shard_shape=[list(s.data.shape) for s in sched._s_full.addressable_shards],
        q=len(sched.last_scores.q.sharding.device_set),
        q_spec=[str(a) for a in getattr(sched.last_scores.q.sharding, "spec", ())])
    out = {"devices": NUM_DEVICES, "num_nodes": graph.num_nodes, "batches": batches,
           "q": np.asarray(sched.last_scores.q).tolist(), "placements": placements}
    if NUM_DEVICES > 1:
        out["collectives"] = compiled_collectives(sched)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
