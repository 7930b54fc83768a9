"""EnvSched with the node axis sharded over a device mesh (GSPMD sharding annotations).

``shard_scheduler(sched, mesh)`` places an :class:`~envsched_jax.sched.envsched.EnvSched`'s
arrays on a 1-D mesh axis (``"nodes"`` by default) and swaps its two compiled functions for the
same jitted ``_score_and_select`` / ``_observe_update`` compiled with explicit input and output
shardings. Nothing in the kernels changes: XLA's SPMD partitioner splits every [N]-shaped
computation over the devices and inserts the collectives; the greedy argmax over a sharded [N]
vector becomes a per-device (max, index) pair and a cross-device reduction of the D pairs (XLA
on CPU emits it as an all-gather of D values and indices followed by the same reduction on every
device), ties still going to the lower index. The selections are those of one device (tested on
1, 4 and 8 fake CPU devices, ``tests/test_sharding.py``).

What is sharded along the node axis (N / D rows per device):

- every [N, ...] field of :class:`~envsched_jax.sched.kernels.EnvSchedState` (:data:`NODE_FIELDS`:
  last observation pointers, observation counts, both neighbour lists and their similarities,
  selection counts, runs, the identifier filter's mask);
- ``env_index`` [N];
- ``S_full`` [N, N] by *columns* (``P(None, "nodes")``): each device holds an [N, N / D] slab.
  The kernels only ever read S_full as rows of given nodes (the selection penalty
  ``s_full[i]`` per pick, the batch's rows in the observation update); a row of a column-sharded
  matrix is a local slice whose result is already an [N] vector sharded like every other node
  vector, so no step moves S_full between devices (with rows sharded the partitioner moved the
  whole matrix to this layout with an all-to-all at every select). S_full is symmetric, so its
  columns are its rows: the memory per device is N^2 / D either way;
- the batch's S_abs rows [B, N] handed to the observation update, by columns.

What is replicated: the step-major history ring ([S, B] and [S, B, 3] arrays, [S] step ids and
means), the per-environment counts ([E], [2, E]), the step counter, the PRNG key, the
hyper-parameters, and the [B] outputs of the selection.

CHOICE (N divisible by the device count): JAX places an array on a sharding only when the mesh
axis divides its dimension, and padding the node axis would change real nodes' quantities: the
percentile ranks and the quantile map of eq. 12-13 run over all N entries (``(rank - 0.5) / N``,
position ``p (N - 1)``), so extra nodes would shift every real node's u and q. Rather than add a
masked variant of those kernels, :func:`shard_scheduler` refuses a mesh whose node axis does not
divide N, and :func:`node_mesh` builds the largest 1-D mesh (over the first D available devices)
whose size divides N. Padding correctly would need ``percentile_rank`` / ``quantile_map`` and the
calibration's ``2 (a + b) N`` denominator to count only real nodes, with padding values sorted
last.

What does not shard: the B greedy picks are sequential (each is a per-shard max plus a
cross-device reduction and three scalar all-reduces for the eligibility test and the coverage
keys; the in-batch mask is updated elementwise (``in_batch | (ids == i)``), so it is not gathered,
and the chosen row of S_full is read locally); the ranks and the quantile map sort
the whole [N] vector (the partitioner gathers it: O(N) traffic, O(N log N) work per device); the
neighbour-list gathers (``W[j]``, ``ybar[j]`` for j in a node's neighbours) read arbitrary nodes
and gather the [N]-sized vectors they index; the history ring and the progress filter's fits are
O(S B + S E) and replicated. The step-0 cold start is its own jitted kernel
(:mod:`envsched_jax.sched.cold_start`); it is not sharded: it reads whole rows of S_full once,
at step 0 only. Nothing ever gathers an [N, N] array: :func:`compiled_collectives`
lists the collectives of both compiled programs and ``tests/test_sharding.py`` checks that none
of them returns N^2 / D elements or more per device (the all-to-all that row-sharded S_full
caused returned exactly that many, so the check catches it).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from envsched_jax.sched import envsched as envsched_module
from envsched_jax.sched.envsched import EnvSched
from envsched_jax.sched.kernels import EnvSchedState

# EnvSchedState fields whose leading axis is the node axis N.
NODE_FIELDS = ("last_step", "last_pos", "num_obs", "nbr_in", "nbr_in_sim", "nbr_cross", "nbr_cross_sim",
               "sel_count", "run", "excluded")

_COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter",
                "collective-broadcast")


def node_mesh(num_nodes: int, devices: Sequence[jax.Device] | None = None, axis: str = "nodes") -> Mesh:
    """A 1-D mesh named ``axis`` over the largest number D of ``devices`` (default: all of
    ``jax.devices()``, in order) that divides ``num_nodes``; D = 1 when none larger does."""
    devices = list(jax.devices() if devices is None else devices)
    size = node_mesh_size(num_nodes, len(devices))
    return Mesh(np.array(devices[:size]), (axis,), axis_types=(AxisType.Auto,))


def node_mesh_size(num_nodes: int, num_devices: int) -> int:
    """The largest D <= ``num_devices`` that divides ``num_nodes`` (1 if no larger one does)."""
    if num_devices < 1 or num_nodes < 1:
        raise ValueError(f"node_mesh_size: need at least one node and one device, got {num_nodes}, {num_devices}")
    return max(d for d in range(1, num_devices + 1) if num_nodes % d == 0)


def state_shardings(state: EnvSchedState, mesh: Mesh, axis: str = "nodes") -> EnvSchedState:
    """The state's pytree of shardings: :data:`NODE_FIELDS` split along ``axis`` on their leading
    dimension, every other field replicated."""
    node = NamedSharding(mesh, P(axis))
    replicated = NamedSharding(mesh, P())
    return state.replace(**{f.name: node if f.name in NODE_FIELDS else replicated
                            for f in dataclasses.fields(state)})


@dataclasses.dataclass(frozen=True)
class NodeShardings:
    """The shardings :func:`shard_scheduler` puts on a scheduler's arrays."""

    mesh: Mesh
    axis: str
    state: EnvSchedState          # per-field shardings (:func:`state_shardings`)
    node: NamedSharding           # [N] vectors (env_index)
    columns: NamedSharding        # [*, N] matrices split by columns (S_full, the batch's S_abs rows)
    replicated: NamedSharding

    @property
    def num_devices(self) -> int:
        return int(self.mesh.shape[self.axis])


def shard_scheduler(sched: EnvSched, mesh: Mesh, axis: str = "nodes") -> EnvSched:
    """Shard ``sched``'s node axis over ``mesh``'s axis ``axis`` in place and return it.

    ``mesh.shape[axis]`` must divide the number of nodes (module docstring: padding would change
    the ranks; :func:`node_mesh` picks a size that divides). The axis must be an ``Auto`` mesh axis
    (``jax.sharding.Mesh``'s default; explicit-sharding axes would make the kernels' reductions
    over N type errors). Other mesh axes, if any, hold replicas.

    After this call ``sched.state``, ``sched._s_full`` and ``sched._env`` live on the mesh, and
    each ``select`` / ``observe`` runs the same jitted kernels compiled for that placement; the
    state stays sharded from step to step (the observation update's outputs are pinned to it),
    and a snapshot loaded with ``load_state_dict`` is placed back on the mesh. The selections are
    identical to the unsharded scheduler's."""
    if not isinstance(sched, EnvSched):
        raise TypeError(f"shard_scheduler needs an EnvSched, got {type(sched).__name__}")
    if not sched.dense:
        raise ValueError("shard_scheduler shards the dense path (S_full's columns over the mesh); this "
                         "EnvSched computes similarities from feature rows (similarity='features'), "
                         "which is not sharded yet")
    if axis not in mesh.axis_names:
        raise ValueError(f"shard_scheduler: mesh has no axis {axis!r} (axes {mesh.axis_names})")
    axis_type = dict(zip(mesh.axis_names, mesh.axis_types))[axis]
    if axis_type != AxisType.Auto:
        raise ValueError(f"shard_scheduler: mesh axis {axis!r} is {axis_type}; build the mesh with "
                         "axis_types=(AxisType.Auto, ...) (jax.sharding.Mesh's default; node_mesh builds one)")
    size = int(mesh.shape[axis])
    if sched.num_nodes % size:
        raise ValueError(f"shard_scheduler: the pool's {sched.num_nodes} nodes do not divide over {size} devices "
                         f"on mesh axis {axis!r}; padding would change the percentile ranks over N. Use a "
                         f"mesh whose size divides N (node_mesh({sched.num_nodes}) picks "
                         f"{node_mesh_size(sched.num_nodes, size)} of these {size})")
    sh = NodeShardings(mesh=mesh, axis=axis, state=state_shardings(sched.state, mesh, axis),
                       node=NamedSharding(mesh, P(axis)), columns=NamedSharding(mesh, P(None, axis)),
                       replicated=NamedSharding(mesh, P()))
    rep = sh.replicated
    sched.state = jax.device_put(sched.state, sh.state)
    sched._s_full = jax.device_put(sched._s_full, sh.columns)
    sched._env = jax.device_put(sched._env, sh.node)
    sched._env_members = jax.device_put(sched._env_members, sh.replicated)
    sched._hyper = jax.device_put(sched._hyper, rep)
    static = sched.config.static()
    # The module's jitted functions, compiled once more for this placement (called inside an outer
    # jit they are inlined into its program). Outputs of the selection are left to the
    # partitioner: its [N] scores come back sharded, the [B] batch replicated.
    sched._step_fn = jax.jit(
        functools.partial(envsched_module._score_and_select, static=static, num_envs=sched._num_envs),
        in_shardings=(sh.state, rep, sh.columns, sh.node))
    sched._observe_fn = jax.jit(
        functools.partial(envsched_module._observe_update, config=static),
        in_shardings=(sh.state, rep, rep, sh.columns, sh.columns, sh.node, rep), out_shardings=sh.state)
    unsharded_load = sched._load_state_arrays

    def load_state_arrays(arrays):
        unsharded_load(arrays)
        sched.state = jax.device_put(sched.state, sh.state)

    sched._load_state_arrays = load_state_arrays   # instance attribute: this scheduler only
    sched.node_shardings = sh
    return sched


def compiled_collectives(sched: EnvSched, batch: np.ndarray | None = None) -> dict[str, list[tuple[str, int]]]:
    """The cross-device collectives in the compiled programs of a sharded scheduler: for
    ``"score_and_select"`` and ``"observe"``, a list of (op name, elements of its result).

    Compiles (from the cache if already compiled) for the scheduler's current state; ``batch``
    (default: the first B nodes) only shapes the observation update's inputs. A check that the
    node axis stays sharded: no collective's result should have N^2 elements."""
    B, K = sched.config.batch_size, sched.config.group_size
    batch = np.arange(B, dtype=np.int32) if batch is None else np.sort(np.asarray(batch, np.int32))
    dtype = jnp.dtype(sched.config.dtype)
    select_text = sched._step_fn.lower(sched.state, sched._hyper, sched._s_full, sched._env).compile().as_text()
    observe_text = sched._observe_fn.lower(
        sched.state, batch, np.zeros((B, K), dtype), sched._s_full,
        np.asarray(sched._s_abs[batch], dtype), sched._env, sched._env_members).compile().as_text()
    return {"score_and_select": hlo_collectives(select_text), "observe": hlo_collectives(observe_text)}


def hlo_collectives(hlo_text: str) -> list[tuple[str, int]]:
    """(op, result elements) for every collective instruction in an HLO module's text (a tuple
    result counts the elements of all its parts)."""
    out = []
    pattern = re.compile(r"=\s*(.*?)\s+(" + "|".join(_COLLECTIVES) + r")(?:-start)?\(")
    for line in hlo_text.splitlines():
        m = pattern.search(line)
        if m is None:
            continue
        elements = 0
        for dims in re.findall(r"[a-z]+[0-9]*\[([0-9,]*)\]", m.group(1)):
            elements += int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        out.append((m.group(2), elements))
    return out
