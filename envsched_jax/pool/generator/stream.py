"""A cheap stream of random draws backed by a NumPy generator.

Generating 100,000 tasks needs millions of small choices (a name, a status, an index). A call into
``numpy.random.Generator`` costs microseconds, so draws are taken in blocks of uniforms and turned
into integers in plain Python. The stream is fully determined by the generator it wraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

_BLOCK = 512


class Stream:
    """Sequential random draws: ``below``, ``between``, ``choice``, ``sample``, ``chance``."""

    __slots__ = ("_rng", "_buf", "_pos")

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._buf: list[float] = []
        self._pos = 0

    def uniform(self) -> float:
        if self._pos == len(self._buf):
            self._buf = self._rng.random(_BLOCK).tolist()
            self._pos = 0
        u = self._buf[self._pos]
        self._pos += 1
        return u

    def below(self, n: int) -> int:
        """Uniform integer in ``[0, n)``; ``n`` must be positive (uniforms are below 1)."""
        if self._pos == len(self._buf):
            self._buf = self._rng.random(_BLOCK).tolist()
            self._pos = 0
        u = self._buf[self._pos]
        self._pos += 1
        return int(u * n)

    def between(self, lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]`` (both inclusive)."""
        return lo + self.below(hi - lo + 1)

    def chance(self, p: float) -> bool:
        return self.uniform() < p

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.below(len(seq))]

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        """``k`` distinct elements of ``seq`` in random order (partial Fisher-Yates)."""
        pool = list(seq)
        k = min(k, len(pool))
        for i in range(k):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]

    def shuffled(self, seq: Sequence[T]) -> list[T]:
        return self.sample(seq, len(seq))


def stream_for(seed: int, *spawn_key: int) -> Stream:
    """Stream for one named purpose, e.g. ``(env_index, 0)``; independent of every other key, so
    environment ``k`` comes out the same however many environments are generated."""
    seq = np.random.SeedSequence(entropy=seed, spawn_key=tuple(spawn_key))
    return Stream(np.random.default_rng(seq))
