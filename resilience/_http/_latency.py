"""Recent latencies of one host, and their quantiles (the hedging delay)."""

from __future__ import annotations

import math

__all__ = ["Latencies"]


class Latencies:
    """The last ``size`` latencies of a host in a ring; quantiles recomputed lazily.

    A quantile is recomputed at most every ``size // 8`` new samples (sorting 128
    floats costs microseconds), and is ``None`` until ``min_samples`` were recorded.

    Example::

        latencies = Latencies()
        for ms in range(1, 101):
            latencies.record(ms / 1000)
        assert latencies.quantile(0.95) == 0.095
    """

    __slots__ = ("_count", "_every", "_fresh", "_quantiles", "_ring", "min_samples", "size")

    def __init__(self, size: int = 128, min_samples: int = 20) -> None:
        self.size = size
        self.min_samples = min_samples
        self._ring: list[float] = []
        self._count = 0
        self._every = max(size // 8, 1)
        self._fresh = 0
        self._quantiles: dict[float, float] = {}

    def record(self, seconds: float) -> None:
        """Add one latency (seconds)."""
        ring = self._ring
        if len(ring) < self.size:
            ring.append(seconds)
        else:
            ring[self._count % self.size] = seconds
        self._count += 1
        self._fresh += 1
        if self._fresh >= self._every:
            self._quantiles.clear()
            self._fresh = 0

    def __len__(self) -> int:
        return len(self._ring)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank) of the recent latencies, or ``None``."""
        cached = self._quantiles.get(q)
        if cached is not None:
            return cached
        samples = sorted(self._ring)
        if len(samples) < self.min_samples:
            return None
        rank = max(math.ceil(q * len(samples)) - 1, 0)
        value = samples[min(rank, len(samples) - 1)]
        self._quantiles[q] = value
        return value
