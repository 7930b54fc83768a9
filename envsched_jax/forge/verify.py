"""Gold verification of task bundles in a local Docker engine (seeds/001 section 3, appendix A.3).

A bundle is exported only when every check below passes, in this order; the first failure
rejects it with the check's name and cause, and the later checks are not run:

1. ``schema``: a Harbor-layout bundle (Terminal-Bench 1 bundles are converted first) whose
   metadata parses, including its skill subgraph and timeouts.
2. ``safety`` (static; the run-time isolation below is the real guarantee):
   - the Dockerfile uses only FROM (an allowed local base image: no registry pulls), WORKDIR,
     COPY (relative sources inside the build context), ENV, LABEL and CMD; RUN and ADD are
     refused (a build has no network and the base image no toolchain, and ADD fetches URLs);
   - no network use in the oracle or the tests (curl, wget, pip install, sockets, URLs ...);
   - no host paths (the Docker socket, /home, /root, /mnt ...);
   - no secrets in any file (private keys, cloud and API tokens).
3. ``length``: instruction, file count and total size within :class:`VerifyConfig`'s limits.
4. ``overlap``: the bundle is not a copy of the seed or of an earlier export: its workspace and
   tests are not byte-identical to theirs, and its instruction is not a near copy (TF-IDF cosine
   >= ``max_similarity``) of theirs *with the same tests*. *Decision*: a near-copy instruction
   alone is not an overlap. A rewrite that adds one requirement bullet to a long instruction
   scores above 0.95 (measured on the built-in families: 0.959), and a diversification in depth
   keeps the requirements and changes the data and expected values (the paper's case V changes
   one move of a PGN file); both are new tasks because their verifier differs. What stays refused
   is the same verifier behind (nearly) the same words.
5. ``sync`` (the synchronization contract, for bundles that declare their requirements in
   ``[metadata.forge] requirements = [{id, text}, ...]`` and whose parent did too): a requirement
   the rewrite added appears in the instruction (its text) and in the tests (its id); a removed
   one appears in neither the oracle nor the tests.
6. ``build``: ``docker build`` of ``environment/`` with ``--network none`` and no pull. Images
   are tagged by the SHA-256 of the build context, so an unchanged environment is a cache hit.
7. ``oracle``: the oracle runs in a container of the image with only ``/solution`` mounted; the
   container's file system is committed, and the tests run in a second container from it with
   only ``/tests`` and ``/logs`` mounted. The oracle never sees the tests or the reward file, so
   it cannot write its own reward. The reward file must say exactly 1.
8. ``untouched``: the tests, run the same way on the unmodified image, must not give reward 1.

Containers: ``--network none``, all capabilities dropped, ``no-new-privileges``, memory, CPU and
pid limits, a private ``/tmp``, the host's ``/usr`` mounted read-only as the toolchain (bash,
coreutils, python3). That is how the project's sandboxes run without a registry
(:mod:`envsched_jax.envs.sandbox.docker_backend`). The base image ``envsched-forge-base`` is
that sandbox's root file system, imported locally.

The residual risk: the tests run in a workspace the oracle left behind. This is inherent to the
Harbor contract, where tests inspect what the agent produced. A workspace can therefore plant
files the tests read, but it cannot replace the toolchain (``/usr`` is read-only from the host)
or the tests (mounted read-only).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envsched_jax.forge.bundle import BundleError, TaskBundle, convert

BASE_IMAGE = "envsched-forge-base"
TASK_REPOSITORY = "envsched-forge-task"
LABEL = "envsched.forge"
CHECKS = ("schema", "safety", "length", "overlap", "sync", "build", "oracle", "untouched")


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    allowed_base_images: tuple[str, ...] = (BASE_IMAGE,)
    max_instruction_chars: int = 20_000
    max_files: int = 500
    max_total_bytes: int = 16 * 2**20
    max_similarity: float = 0.95
    memory_bytes: int = 512 * 2**20
    cpus: float = 1.0
    max_processes: int = 128
    oracle_timeout_s: float = 300.0
    """Upper bound; a bundle's own [agent].timeout_sec applies when lower."""
    test_timeout_s: float = 120.0
    """Upper bound; a bundle's own [verifier].timeout_sec applies when lower."""
    max_log_bytes: int = 64 * 1024


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    reason: str = ""
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Verification:
    name: str
    accepted: bool
    checks: tuple[CheckResult, ...]
    oracle_reward: float | None = None
    untouched_reward: float | None = None
    image: str | None = None
    cache_hit: bool | None = None
    logs: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def failed_check(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed), None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Static checks


def _harbor(bundle: TaskBundle) -> TaskBundle:
    return bundle if bundle.layout == "harbor" else convert(bundle, "harbor")


def check_schema(bundle: TaskBundle) -> str:
    try:
        bundle = _harbor(bundle)
        _ = (bundle.skills, bundle.timeouts)   # parsing them is the check
    except BundleError as err:
        return str(err)
    return ""


def _dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        word, _, rest = pending.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        pending = ""
    if pending:
        word, _, rest = pending.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


_NETWORK = re.compile(r"\b(curl|wget|ncat|netcat|telnet|ssh|scp|rsync|ftp|pip3? install|apt(-get)? install|"
                      r"npm install|git clone|import socket|urllib\.request|http\.client|import requests)\b"
                      r"|\bnc\s+-|https?://|/dev/tcp/")
_HOST_PATHS = re.compile(r"(/var/run/docker\.sock|/run/docker\.sock|(?<![\w.])/(home|root|mnt|media|srv|boot)/"
                         r"|/proc/1/|/sys/fs/cgroup)")
_SECRETS = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----|AKIA[0-9A-Z]{16}|ghp_[A-Za-z0-9]{36}|"
                      rb"xox[baprs]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9]{32,}")


def check_safety(bundle: TaskBundle, config: VerifyConfig) -> str:
    bundle = _harbor(bundle)
    dockerfile = bundle.files[bundle.dockerfile_path].data.decode("utf-8", "replace")
    froms = 0
    for number, word, args in _dockerfile_instructions(dockerfile):
        where = f"{bundle.dockerfile_path}:{number}"
        if word == "FROM":
            froms += 1
            image = args.split()[0] if args else ""
            if image.split(":")[0] not in config.allowed_base_images:
                return (f"{where}: FROM {image!r} is not a local base image (allowed: "
                        f"{list(config.allowed_base_images)}); registry pulls are refused")
        elif word == "COPY":
            parts = [p for p in args.split() if not p.startswith("--")]
            if any(p.startswith("--from") for p in args.split()):
                return f"{where}: COPY --from is refused"
            for src in parts[:-1]:
                if src.startswith("/") or ".." in Path(src).parts or "://" in src:
                    return f"{where}: COPY source {src!r} leaves the build context"
        elif word in ("RUN", "ADD"):
            return (f"{where}: {word} is refused (builds have no network and the base image no "
                    "toolchain; ADD can fetch URLs)")
        elif word not in ("WORKDIR", "ENV", "LABEL", "CMD"):
            return f"{where}: instruction {word} is not allowed"
    if froms != 1:
        return f"{bundle.dockerfile_path}: needs exactly one FROM, found {froms}"
    for path, entry in sorted(bundle.files.items()):
        if _SECRETS.search(entry.data):
            return f"{path}: contains what looks like a secret (private key or access token)"
        if not (path.startswith(("solution/", "tests/"))):
            continue
        text = entry.data.decode("utf-8", "replace")
        for pattern, what in ((_NETWORK, "network use"), (_HOST_PATHS, "a host path")):
            match = pattern.search(text)
            if match:
                line = text.count("\n", 0, match.start()) + 1
                return f"{path}:{line}: {what} ({match.group(0).strip()!r})"
    return ""


def check_length(bundle: TaskBundle, config: VerifyConfig) -> str:
    if len(bundle.instruction) > config.max_instruction_chars:
        return f"instruction has {len(bundle.instruction)} characters, more than {config.max_instruction_chars}"
    if len(bundle.files) > config.max_files:
        return f"{len(bundle.files)} files, more than {config.max_files}"
    total = sum(len(f.data) for f in bundle.files.values())
    if total > config.max_total_bytes:
        return f"{total} bytes in all, more than {config.max_total_bytes}"
    return ""


def workspace_hash(bundle: TaskBundle) -> str:
    bundle = _harbor(bundle)
    digest = hashlib.sha256()
    for path, entry in sorted(bundle.files.items()):
        if path.startswith(("environment/", "tests/")):
            digest.update(path.encode() + b"\0" + hashlib.sha256(entry.data).digest())
    return digest.hexdigest()


def instruction_similarity(a: str, b: str) -> float:
    """TF-IDF cosine of two instructions over word 1-2-grams (scikit-learn)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not a.strip() or not b.strip():
        return 1.0 if a.strip() == b.strip() else 0.0
    matrix = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).fit_transform([a, b])
    return float((matrix[0] @ matrix[1].T).toarray()[0, 0])


def tests_hash(bundle: TaskBundle) -> str:
    bundle = _harbor(bundle)
    digest = hashlib.sha256()
    for path, entry in sorted(bundle.files.items()):
        if path.startswith("tests/"):
            digest.update(path.encode() + b"\0" + hashlib.sha256(entry.data).digest())
    return digest.hexdigest()


def check_overlap(bundle: TaskBundle, others: Sequence[TaskBundle], config: VerifyConfig) -> str:
    mine, my_tests = workspace_hash(bundle), tests_hash(bundle)
    for other in others:
        if workspace_hash(other) == mine:
            return f"workspace and tests are byte-identical to {other.name!r}"
        if tests_hash(other) != my_tests:
            continue
        similarity = instruction_similarity(bundle.instruction, other.instruction)
        if similarity >= config.max_similarity:
            return (f"instruction is a near copy of {other.name!r} (TF-IDF cosine {similarity:.3f} >= "
                    f"{config.max_similarity}) and the tests are the same")
    return ""


def declared_requirements(bundle: TaskBundle) -> dict[str, str] | None:
    """``[metadata.forge] requirements`` as id -> text, or None when the bundle declares none."""
    meta = bundle.metadata.get("metadata", bundle.metadata) if bundle.layout == "harbor" else bundle.metadata
    forge = meta.get("forge") if isinstance(meta, dict) else None
    if not isinstance(forge, dict) or "requirements" not in forge:
        return None
    if not isinstance(forge["requirements"], list):
        raise BundleError(f"bundle {bundle.name}: metadata: forge.requirements must be an array of tables, got "
                          f"{type(forge['requirements']).__name__}")
    out = {}
    for k, item in enumerate(forge["requirements"]):
        if not (isinstance(item, dict) and isinstance(item.get("id"), str) and isinstance(item.get("text"), str)):
            raise BundleError(f"bundle {bundle.name}: metadata: forge.requirements[{k}] must be a table with "
                              "string 'id' and 'text'")
        if item["id"] in out:
            raise BundleError(f"bundle {bundle.name}: metadata: forge.requirements[{k}]: id {item['id']!r} is "
                              "declared twice")
        out[item["id"]] = item["text"]
    return out


def check_sync(bundle: TaskBundle, parent: TaskBundle | None) -> str:
    if parent is None:
        return ""
    try:
        mine, theirs = declared_requirements(bundle), declared_requirements(parent)
    except BundleError as err:
        return str(err)
    if mine is None or theirs is None:
        return ""
    bundle = _harbor(bundle)

    def text_of(prefix: str) -> str:
        return "\n".join(e.data.decode("utf-8", "replace") for p, e in bundle.files.items() if p.startswith(prefix))

    tests, oracle = text_of("tests/"), text_of("solution/")
    for rid in sorted(set(mine) - set(theirs)):
        if mine[rid] not in bundle.instruction:
            return f"added requirement {rid!r} is not stated in the instruction ({mine[rid]!r})"
        if rid not in tests:
            return f"added requirement {rid!r} is not checked by the tests"
    for rid in sorted(set(theirs) - set(mine)):
        if rid in tests or rid in oracle:
            return f"removed requirement {rid!r} is still in the {'tests' if rid in tests else 'oracle'}"
    return ""


# ---------------------------------------------------------------------------------------------
# Docker


def ensure_base_image(client) -> str:
    """Import the base image (the sandbox's root file system) unless the engine has it."""
    import docker

    from envsched_jax.envs.sandbox.docker_backend import rootfs_tarball

    tarball = rootfs_tarball()
    version = hashlib.sha256(tarball).hexdigest()[:16]
    try:
        client.images.get(f"{BASE_IMAGE}:{version}")
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(tarball, repository=BASE_IMAGE, tag=version)
    client.images.get(f"{BASE_IMAGE}:{version}").tag(BASE_IMAGE, "latest")
    return f"{BASE_IMAGE}:{version}"


def _context_tar(bundle: TaskBundle) -> tuple[bytes, str]:
    """The build context as a deterministic tar, and its SHA-256."""
    buf = io.BytesIO()
    context = bundle.build_context()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, entry in sorted(context.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(entry.data), 0
            info.mode = 0o755 if entry.executable else 0o644
            tar.addfile(info, io.BytesIO(entry.data))
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


CONTAINER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
"""The environment of every task container: the toolchain is the host's ``/usr``, mounted read-only."""


@dataclasses.dataclass(frozen=True)
class ContainerLimits:
    """The cgroup limits of one task container (memory and swap, CPUs, processes)."""

    memory_bytes: int
    cpus: float
    max_processes: int


def create_task_container(client, image: str, command: Sequence[str], *, limits: ContainerLimits,
                          volumes: dict[str, dict[str, str]], labels: dict[str, str],
                          tmp_options: str | None = "size=64m,mode=1777", **options: Any):
    """Create (not start) a container of ``image`` as every task container is made here: no
    network, every capability dropped, ``no-new-privileges``, the ``limits``, the host's ``/usr``
    read-only plus ``volumes`` (the SDK's form: host path -> ``{"bind", "mode"}``), a private
    ``/tmp`` tmpfs (``tmp_options``; None: none), cwd ``/app``. ``options`` go to the SDK as they
    are (e.g. ``mounts``, ``ulimits``); the terminal episodes of :mod:`envsched_jax.envs.terminal`
    share this with gold verification, so both isolate the same way."""
    volumes = {"/usr": {"bind": "/usr", "mode": "ro"}, **volumes}
    settings: dict[str, Any] = dict(
        working_dir="/app", network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
        mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes,
        nano_cpus=int(limits.cpus * 1e9), pids_limit=limits.max_processes, volumes=volumes,
        labels=labels, environment=dict(CONTAINER_ENV))
    if tmp_options is not None:
        settings["tmpfs"] = {"/tmp": tmp_options}
    settings.update(options)
    return client.containers.create(image, list(command), **settings)


def build_task_image(client, bundle: TaskBundle) -> tuple[str, bool]:
    """The image of ``bundle``'s environment, built with ``--network none`` and no pull, tagged
    by the SHA-256 of its build context; (tag, whether the engine already had it). A failed
    build raises RuntimeError with the tail of the build log."""
    import docker

    context, digest = _context_tar(bundle)
    tag = f"{TASK_REPOSITORY}:{digest[:16]}"
    try:
        client.images.get(tag)
        return tag, True
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag, pull=False,
                            network_mode="none", rm=True, forcerm=True, labels={LABEL: "1"},
                            dockerfile=Path(bundle.dockerfile_path).relative_to(bundle.build_context_dir).as_posix())
    except docker.errors.BuildError as err:
        tail = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in err.build_log)[-600:]
        raise RuntimeError(f"docker build failed: {err.msg}; log tail: {tail.strip()}") from None
    return tag, False


class DockerVerifier:
    """Runs the build and execution checks; one engine client, images cached by context hash."""

    def __init__(self, config: VerifyConfig = VerifyConfig(), client=None):
        import docker

        self.config = config
        self.client = client or docker.from_env(timeout=600)
        self.base = ensure_base_image(self.client)
        self.builds = 0
        self.cache_hits = 0

    def build(self, bundle: TaskBundle) -> tuple[str, bool]:
        tag, hit = build_task_image(self.client, bundle)
        if hit:
            self.cache_hits += 1
        else:
            self.builds += 1
        return tag, hit

    def _run(self, image: str, script: str, mounts: dict[str, dict[str, str]], timeout_s: float,
             commit: bool = False) -> tuple[int | None, str, str | None]:
        """Run ``bash -c script`` in /app; (exit status or None on timeout, output tail, committed
        image or None)."""
        cfg = self.config
        container = create_task_container(
            self.client, image, ["bash", "-c", script],
            limits=ContainerLimits(cfg.memory_bytes, cfg.cpus, cfg.max_processes), volumes=mounts,
            labels={LABEL: "1"})
        committed = None
        try:
            container.start()
            try:
                status = container.wait(timeout=timeout_s)["StatusCode"]
            except Exception:  # the SDK raises a requests timeout type
                container.kill()
                status = None
            output = container.logs(tail=200).decode("utf-8", "replace")[-cfg.max_log_bytes:]
            if commit and status is not None:
                committed = container.commit(repository=f"{TASK_REPOSITORY}-work",
                                             tag=hashlib.sha256(container.id.encode()).hexdigest()[:12]).id
        finally:
            container.remove(force=True)
        return status, output, committed

    def _tests(self, image: str, bundle: TaskBundle, logs_dir: Path, timeout_s: float) -> tuple[float | None, str]:
        tests_dir = logs_dir.parent / "tests"
        _materialise(bundle, "tests/", tests_dir)
        (logs_dir / "verifier").mkdir(parents=True, exist_ok=True)
        (logs_dir / "verifier").chmod(0o777)
        status, output, _ = self._run(image, "bash /tests/test.sh",
                                      {str(tests_dir): {"bind": "/tests", "mode": "ro"},
                                       str(logs_dir): {"bind": "/logs", "mode": "rw"}}, timeout_s)
        from envsched_jax.envs.terminal import parse_reward, read_reward_file

        if status is None:
            return None, f"tests timed out after {timeout_s:g} s\n{output}"
        try:  # never following a link the tests planted (it could point at a host file)
            text = read_reward_file(logs_dir)
            if text is None:
                return None, f"tests exited with {status} and wrote no /logs/verifier/reward.txt\n{output}"
            return parse_reward(text), output
        except ValueError as err:
            return None, f"{err}\n{output}"

    def run_checks(self, bundle: TaskBundle) -> tuple[list[CheckResult], dict[str, Any]]:
        """The build, oracle and untouched checks (stopping at the first failure)."""
        bundle = _harbor(bundle)
        results, extra = [], {"logs": {}}
        timeouts = bundle.timeouts
        oracle_s = min(self.config.oracle_timeout_s, timeouts.agent_sec or self.config.oracle_timeout_s)
        test_s = min(self.config.test_timeout_s, timeouts.verifier_sec or self.config.test_timeout_s)
        start = time.perf_counter()
        try:
            image, hit = self.build(bundle)
        except RuntimeError as err:
            return [CheckResult("build", False, str(err), time.perf_counter() - start)], extra
        extra.update(image=image, cache_hit=hit)
        results.append(CheckResult("build", True, "cache hit" if hit else "", time.perf_counter() - start))

        with tempfile.TemporaryDirectory(prefix="forge-verify-") as tmp:
            tmp = Path(tmp)
            start = time.perf_counter()
            _materialise(bundle, "solution/", tmp / "solution")
            status, output, solved = self._run(image, f"bash /solution/{Path(bundle.solution_entry).name}",
                                               {str(tmp / "solution"): {"bind": "/solution", "mode": "ro"}},
                                               oracle_s, commit=True)
            extra["logs"]["oracle"] = output
            try:
                if status is None:
                    reason = f"oracle timed out after {oracle_s:g} s"
                    reward = None
                else:
                    reward, test_output = self._tests(solved, bundle, tmp / "logs-oracle", test_s)
                    extra["logs"]["oracle_tests"] = test_output
                    reason = "" if reward == 1.0 else (f"oracle (exit {status}) then tests gave reward {reward}"
                                                       if reward is not None else test_output.splitlines()[0])
            finally:
                if solved:
                    self.client.images.remove(solved, force=True)
            extra["oracle_reward"] = reward
            results.append(CheckResult("oracle", reason == "", reason, time.perf_counter() - start))
            if reason:
                return results, extra

            start = time.perf_counter()
            reward, test_output = self._tests(image, bundle, tmp / "logs-untouched", test_s)
            extra["logs"]["untouched_tests"] = test_output
            extra["untouched_reward"] = reward
            reason = ("tests pass (reward 1) on the untouched workspace: they do not test the task"
                      if reward == 1.0 else "")
            results.append(CheckResult("untouched", reason == "", reason, time.perf_counter() - start))
        return results, extra


def _materialise(bundle: TaskBundle, prefix: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path, entry in bundle.files.items():
        if path.startswith(prefix):
            target = out / path[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(entry.data)
            target.chmod(0o755 if entry.executable else 0o644)


def verify_bundle(bundle: TaskBundle, verifier: DockerVerifier | None, *, parent: TaskBundle | None = None,
                  others: Sequence[TaskBundle] = (), config: VerifyConfig | None = None) -> Verification:
    """All checks of the module docstring, stopping at the first failure. ``parent`` is the seed
    the bundle was rewritten from (overlap and sync); ``others`` are earlier exports (overlap).
    With ``verifier=None`` only the static checks run, and the result is never accepted."""
    config = config or (verifier.config if verifier else VerifyConfig())
    results: list[CheckResult] = []
    static = [("schema", lambda: check_schema(bundle)), ("safety", lambda: check_safety(bundle, config)),
              ("length", lambda: check_length(bundle, config)),
              ("overlap", lambda: check_overlap(bundle, ([parent] if parent else []) + list(others), config)),
              ("sync", lambda: check_sync(bundle, parent))]
    for name, fn in static:
        start = time.perf_counter()
        reason = fn()
        results.append(CheckResult(name, reason == "", reason, time.perf_counter() - start))
        if reason:
            return Verification(bundle.name, False, tuple(results))
    if verifier is None:
        return Verification(bundle.name, False, tuple(results))
    executed, extra = verifier.run_checks(bundle)
    results.extend(executed)
    accepted = len(results) == len(CHECKS) and all(r.passed for r in results)
    return Verification(bundle.name, accepted, tuple(results), extra.get("oracle_reward"),
                        extra.get("untouched_reward"), extra.get("image"), extra.get("cache_hit"), extra["logs"])


def remove_task_images(client) -> int:
    """Remove the task images this module built (the cache); returns how many."""
    images = client.images.list(filters={"label": f"{LABEL}=1"})
    for image in images:
        client.images.remove(image.id, force=True)
    return len(images)

