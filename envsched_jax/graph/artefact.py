"""Saving and loading a built graph as a directory with a manifest.

Layout of ``DIR``::

    manifest.json        format version, pool name and content hash, config, N, files, timings
    candidates.npz       env_index, within_idx, within_sim, cross_idx, cross_sim
    s_full.npy, s_abs.npy  dense similarities (only when built)
    features_<view>.{data,indices,indptr}.npy
                         sparse TF-IDF matrices (CSR) of the concrete views and the abstract view,
                         exactly as built (storage order kept); memory-mapped on load by default
                         (shapes in the manifest's "features"). Artefacts written before this
                         layout hold ``features_<view>.npz`` (scipy's ``save_npz``) and still load.
    abstract.txt         one abstract operation description per node (for inspection)
    task_ids.txt, env_ids.txt

The manifest records the pool's content hash: loading against a different pool is an error that
names both hashes, so a graph can never be silently paired with the wrong pool. Files are written
into a temporary sibling directory and moved into place at the end, so an interrupted write never
leaves a half-written artefact at ``DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from envsched_jax.graph.build import GraphConfig, PoolGraph
from envsched_jax.pool.model import Pool

FORMAT_VERSION = 1
_CSR_PARTS = ("data", "indices", "indptr")


class GraphArtefactError(ValueError):
    """A graph directory is missing, incomplete, or does not belong to the given pool."""


def save_graph(graph: PoolGraph, directory: str | os.PathLike, *, overwrite: bool = False) -> Path:
    directory = Path(directory)
    if directory.exists() and not overwrite:
        raise GraphArtefactError(f"{directory} already exists (pass overwrite=True / --overwrite)")
    tmp = directory.with_name(directory.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    np.savez(tmp / "candidates.npz", env_index=graph.env_index, within_idx=graph.within_idx,
             within_sim=graph.within_sim, cross_idx=graph.cross_idx, cross_sim=graph.cross_sim)
    files = ["candidates.npz"]
    for name, matrix in (("s_full", graph.s_full), ("s_abs", graph.s_abs)):
        if matrix is not None:
            np.save(tmp / f"{name}.npy", matrix)
            files.append(f"{name}.npy")
    feature_shapes = {}
    for view, matrix in graph.features.items():
        matrix = sp.csr_matrix(matrix) if not sp.isspmatrix_csr(matrix) else matrix
        for part in _CSR_PARTS:
            np.save(tmp / f"features_{view}.{part}.npy", getattr(matrix, part))
            files.append(f"features_{view}.{part}.npy")
        feature_shapes[view] = list(matrix.shape)
    (tmp / "abstract.txt").write_text("\n".join(t.replace("\n", " ") for t in graph.abstract_texts) + "\n")
    (tmp / "task_ids.txt").write_text("\n".join(graph.task_ids) + "\n")
    (tmp / "env_ids.txt").write_text("\n".join(graph.env_ids) + "\n")
    manifest = {
        "format_version": FORMAT_VERSION,
        "pool_name": graph.pool_name,
        "pool_content_hash": graph.pool_hash,
        "num_nodes": graph.num_nodes,
        "num_environments": len(graph.env_ids),
        "config": dataclasses.asdict(graph.config),
        "dense": graph.s_full is not None,
        "features": feature_shapes,
        "files": files + ["abstract.txt", "task_ids.txt", "env_ids.txt"],
        "bytes": {"sparse_features": graph.feature_bytes(), "dense_matrices": graph.dense_bytes(),
                  "candidates": graph.candidate_bytes()},
        "timings_s": graph.timings,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def read_manifest(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise GraphArtefactError(f"{path}: no graph manifest (build one with `envsched graph build`)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GraphArtefactError(f"{path}: invalid JSON ({err.msg})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GraphArtefactError(f"{path}: format_version {manifest.get('format_version')!r} is not "
                                 f"{FORMAT_VERSION}; rebuild the graph")
    return manifest


def load_graph(directory: str | os.PathLike, pool: Pool | None = None, *, mmap: bool = True) -> PoolGraph:
    """Load a graph directory; with ``pool``, check that it was built from exactly that pool.

    Dense matrices and the feature matrices' arrays are memory-mapped by default (``mmap=False``
    reads them into memory); memory-mapped arrays are read-only."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if pool is not None and pool.content_hash() != manifest["pool_content_hash"]:
        raise GraphArtefactError(
            f"{directory}: graph was built from pool {manifest['pool_name']!r} with content hash "
            f"{manifest['pool_content_hash'][:16]}..., but the given pool {pool.name!r} hashes to "
            f"{pool.content_hash()[:16]}...; rebuild the graph")
    missing = [f for f in manifest["files"] if not (directory / f).is_file()]
    if missing:
        raise GraphArtefactError(f"{directory}: missing file(s) {missing}")
    cand = np.load(directory / "candidates.npz")
    dense = {}
    for name in ("s_full", "s_abs"):
        path = directory / f"{name}.npy"
        dense[name] = np.load(path, mmap_mode="r" if mmap else None) if path.is_file() else None
    features = {f[len("features_"):-len(".npz")]: sp.load_npz(directory / f).tocsr()
                for f in manifest["files"] if f.startswith("features_") and f.endswith(".npz")}
    for view, shape in manifest.get("features", {}).items():
        data, indices, indptr = (np.load(directory / f"features_{view}.{part}.npy", mmap_mode="r" if mmap else None)
                                 for part in _CSR_PARTS)
        features[view] = _csr_without_copy(data, indices, indptr, tuple(shape))
    shared: dict[str, str] = {}
    return PoolGraph(
        task_ids=tuple((directory / "task_ids.txt").read_text().split("\n")[:-1]),
        env_ids=tuple((directory / "env_ids.txt").read_text().split("\n")[:-1]),
        env_index=cand["env_index"], within_idx=cand["within_idx"], within_sim=cand["within_sim"],
        cross_idx=cand["cross_idx"], cross_sim=cand["cross_sim"],
        s_full=dense["s_full"], s_abs=dense["s_abs"], features=features,
        abstract_texts=tuple(shared.setdefault(t, t) for t in (directory / "abstract.txt").read_text().split("\n")[:-1]),
        config=GraphConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in manifest["config"].items()}),
        pool_name=manifest["pool_name"], pool_hash=manifest["pool_content_hash"],
        timings=manifest.get("timings_s", {}))


def _csr_without_copy(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                      shape: tuple[int, int]) -> sp.csr_matrix:
    """A CSR matrix over exactly these arrays (memory maps stay memory maps): no copy, no
    re-sorting of the indices, no index-dtype change."""
    matrix = sp.csr_matrix(shape, dtype=data.dtype)
    matrix.data, matrix.indices, matrix.indptr = data, indices, indptr
    matrix.check_format(full_check=False)
    return matrix
