"""A worker reached over a byte stream: frames out, frames in, each read under a deadline.

The transports differ only in how bytes move (a pipe pair for bubblewrap, Docker's multiplexed
attach socket) and how the jail is killed; :class:`StreamWorker` holds the shared logic and turns
every transport failure into a :class:`SandboxError` that names the cause.

Every request carries a sequence number, a random nonce and its time allowance (``time_limit``);
the supervisor echoes the first two, and a reply that does not match its request (a forged or
stale frame) is a ``protocol`` error that retires the worker. The supervisor enforces the
allowance itself (and answers ``wall_clock``); the parent waits :data:`GRACE_SECONDS` longer
before it declares the supervisor hung and kills the jail.
"""

from __future__ import annotations

import abc
import itertools
import secrets
import time
from typing import Any

from envsched_jax.envs.runtime import frames
from envsched_jax.envs.sandbox.base import SandboxError, SandboxLimits, checked_reply

GRACE_SECONDS = 5.0
"""How much longer than a request's allowance the parent waits for the supervisor's answer."""


class StreamWorker(abc.ABC):
    """The shared framing logic; a transport implements the four abstract methods below."""

    startup_seconds: float = 0.0

    def __init__(self, limits: SandboxLimits):
        self.limits = limits
        self.closed = False
        self._seq = itertools.count(1)

    @abc.abstractmethod
    def _send(self, data: bytes) -> None:
        """Write all of ``data`` to the worker."""

    @abc.abstractmethod
    def _recv(self, n: int, deadline: float) -> bytes:
        """Up to ``n`` bytes from the worker, waiting at most until ``deadline``; b"" on EOF."""

    @abc.abstractmethod
    def _kill(self) -> None:
        """Kill the jail (process group or container)."""

    @abc.abstractmethod
    def _exit_cause(self) -> str:
        """Why the worker died, for the error message."""

    def _recv_exact(self, n: int, deadline: float, timeout: float) -> bytes:
        chunks, remaining = [], n
        while remaining:
            if time.monotonic() >= deadline:
                self.close()
                raise SandboxError("wall_clock", f"wall-clock limit of {timeout:g} s exceeded; "
                                   "the sandbox was killed", retire=True)
            chunk = self._recv(remaining, deadline)
            if not chunk:
                if time.monotonic() >= deadline:
                    continue
                cause = self._exit_cause()
                self.close()
                raise SandboxError("crashed", f"the worker died ({cause})", retire=True)
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.closed:
            raise SandboxError("crashed", "the worker was already closed", retire=True)
        seq, nonce = next(self._seq), secrets.token_hex(8)
        try:
            data = frames.pack({**message, "seq": seq, "nonce": nonce, "time_limit": timeout},
                               self.limits.max_message_bytes)
        except frames.FrameTooLarge as err:
            raise SandboxError("input", f"the request is too large for the sandbox ({err}; "
                               "SandboxLimits.max_message_bytes)") from None
        except (TypeError, ValueError) as err:
            raise SandboxError("input", f"the request cannot be encoded as JSON ({err})") from None
        wait = timeout + GRACE_SECONDS
        deadline = time.monotonic() + wait
        try:
            self._send(data)
        except (BrokenPipeError, ConnectionError, OSError) as err:
            cause = self._exit_cause()
            self.close()
            raise SandboxError("crashed", f"cannot write to the worker ({err}; {cause})",
                               retire=True) from None
        header = self._recv_exact(frames.HEADER.size, deadline, wait)
        try:
            length = frames.frame_length(header, self.limits.max_message_bytes)
            reply = frames.unpack(self._recv_exact(length, deadline, wait))
        except (frames.FrameTooLarge, ValueError, RecursionError) as err:
            self.close()
            raise SandboxError("protocol", f"bad reply from the worker ({type(err).__name__}: "
                               f"{err})", retire=True) from None
        if reply.get("seq") != seq or reply.get("nonce") != nonce:
            self.close()
            raise SandboxError("protocol", f"a reply that does not match its request (sequence "
                               f"{reply.get('seq')!r}, expected {seq}): a forged or stale frame",
                               retire=True)
        return checked_reply(reply)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._kill()
