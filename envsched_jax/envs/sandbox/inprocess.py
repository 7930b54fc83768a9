"""In-process "sandbox": runs episodes in the calling interpreter, for TRUSTED code only.

It isolates nothing and enforces no limit (a loop in environment code hangs the caller), so it
admits only environments that carry a Python class object (``Environment.trusted_class``): such an
object is attached by project code (the embedded pool, the generator) and can never come from a
pool file. A pool whose source strings you trust for another reason (BFCL's generated composite
over the installed ``bfcl_eval``) can be admitted explicitly with ``trust="any"``; the default
refuses it with :class:`UntrustedEnvironment`. The worker speaks the same request/reply protocol
as the jailed workers, without serialising, and uses the same episode state machine.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from envsched_jax.envs.runtime import core
from envsched_jax.envs.sandbox.base import SandboxError, SandboxLimits
from envsched_jax.pool.model import Environment

Trust = Literal["trusted_class", "any"]


class UntrustedEnvironment(PermissionError):
    """An environment without a trusted class was sent to the in-process sandbox."""


class InProcessWorker:
    def __init__(self, backend: InProcessBackend):
        self.backend = backend
        self.episode: core.EpisodeCore | None = None
        self.startup_seconds = 0.0

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        op = message.get("op")
        try:
            if op == "hello":
                return {"ok": True, "pid": 0, "uid": -1, "python": "in-process"}
            if op == "abort":
                self.episode = None
                return {"ok": True}
            if op in ("reset", "run"):
                spec = message["spec"]
                cls = self.backend.trusted_class(spec["env_id"])
                if op == "run":
                    return {"ok": True, "record": core.run_actions(
                        spec, message["actions"], cls, bool(message.get("user_stop")))}
                self.episode = core.EpisodeCore(spec, cls)
                return {"ok": True, **self.episode.reset()}
            if self.episode is None:
                raise SandboxError("state", f"{op!r} before reset")
            if op == "step":
                return {"ok": True, **self.episode.step(message["action"])}
            if op == "user_stop":
                return {"ok": True, **self.episode.user_stop()}
            if op == "score":
                return {"ok": True, **self.episode.score()}
        except core.EpisodeStateError as err:
            raise SandboxError("state", str(err)) from None
        except (SandboxError, UntrustedEnvironment):
            raise
        except Exception as err:
            raise SandboxError("setup", f"{type(err).__name__}: {err}") from None
        raise SandboxError("protocol", f"unknown op {op!r}")

    def close(self) -> None:
        self.episode = None


class InProcessBackend:
    name = "inprocess"

    def __init__(self, limits: SandboxLimits, trust: Trust = "trusted_class"):
        if trust not in ("trusted_class", "any"):
            raise ValueError(f"trust must be 'trusted_class' or 'any', got {trust!r}")
        self.limits = limits
        self.trust = trust
        self._classes: dict[str, type | None] = {}

    def admit(self, env: Environment) -> None:
        """Register ``env`` for in-process runs; refuse it unless it is trusted."""
        if env.trusted_class is None and self.trust != "any":
            raise UntrustedEnvironment(
                f"environment {env.env_id!r} has no trusted in-process class (its code comes "
                "from a pool file): run it in the 'bwrap' or 'docker' sandbox, or pass "
                "trust='any' if you vouch for its source")
        self._classes[env.env_id] = env.trusted_class

    def trusted_class(self, env_id: str) -> type | None:
        if env_id not in self._classes:
            raise UntrustedEnvironment(f"environment {env_id!r} was not admitted to the "
                                       "in-process sandbox")
        return self._classes[env_id]

    def start_worker(self) -> InProcessWorker:
        start = time.perf_counter()
        worker = InProcessWorker(self)
        worker.startup_seconds = time.perf_counter() - start
        return worker

    def close(self) -> None:
        pass
