"""A remote bucket store wrapped in its failure mode (``on_backend_error``).

:class:`FailoverBuckets` asks the remote store (Redis GCRA, or a ``limits`` window on
Redis) while the backend is healthy, and otherwise applies the mode through the shared
:class:`~resilience.backends.Failover` machinery: ``"local"`` asks an in-process twin,
``"open"`` admits, ``"closed"`` raises :class:`~resilience.BackendError`. A failed call
costs at most the backend timeout, once per probe interval; other calls degrade at once.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

from ..backends._failover import Failover
from ..errors import BackendError
from ._gcra import Decision

__all__ = ["Buckets", "FailoverBuckets"]


class Buckets(Protocol):
    """What a limiter needs from a store of buckets (memory, Redis, limits windows)."""

    local: bool

    def take(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """One decision for ``cost`` tokens of ``key``, reserving up to ``max_wait_us``."""
        ...


class FailoverBuckets:
    """``primary`` (remote) buckets, degraded by ``failover`` to ``twin`` / open / closed.

    Example::

        buckets = FailoverBuckets(redis_buckets, memory_twin, Failover("local", ...), burst=10)
        decision = buckets.take("alice", 1, 0)     # never raises in "local" or "open" mode
    """

    __slots__ = ("_burst", "_failover", "_open", "_twin_burst", "primary", "twin")

    local = False

    def __init__(
        self,
        primary: Any,
        twin: Any,
        failover: Failover,
        *,
        burst: int,
        twin_burst: int | None = None,
    ) -> None:
        self.primary = primary
        self.twin = twin
        self._failover = failover
        self._burst = burst
        self._twin_burst = burst if twin_burst is None else twin_burst
        self._open = Decision(True, burst, 0.0, 0.0, burst, 0.0)

    def _degraded(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        mode = self._failover.mode
        if mode == "local":
            # A twin scaled down by ``local_rate`` holds less than the limiter's burst: a
            # cost the limiter accepts but the twin cannot hold takes the twin's whole
            # burst (admitted when its bucket is full) instead of never passing.
            cost = min(cost, self._twin_burst)
            return self.twin.take(key, cost, max_wait_us)  # type: ignore[no-any-return]
        if mode == "open":
            return self._open
        self._failover.raise_closed()
        raise AssertionError("unreachable")  # pragma: no cover

    def reset(self, key: Hashable) -> None:
        """Reset ``key`` in the twin, then on the backend (raises ``BackendError``)."""
        self.twin.reset(key)
        self.primary.reset(key)

    async def reset_async(self, key: Hashable) -> None:
        """Like :meth:`reset`, from asyncio or trio."""
        await self.twin.reset_async(key)
        await self.primary.reset_async(key)

    # While the backend is down, the call that probes it must reach it: a local answer
    # (the Redis denial cache) would report a recovery that did not happen.

    def take(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """A decision from the backend, or from the failure mode when it is down."""
        failover = self._failover
        if failover.healthy or failover.use_backend():
            primary = self.primary
            try:
                decision: Decision = (
                    primary.take(key, cost, max_wait_us)
                    if failover.healthy
                    else primary.probe(key, cost, max_wait_us)
                )
            except BackendError as exc:
                failover.failed(exc, key)
                return self._degraded(key, cost, max_wait_us)
            if not failover.healthy:
                failover.succeeded()
            return decision
        failover.fallback(key)
        return self._degraded(key, cost, max_wait_us)

    async def take_async(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Like :meth:`take`, from asyncio or trio."""
        failover = self._failover
        if failover.healthy or failover.use_backend():
            primary = self.primary
            try:
                decision: Decision = await (
                    primary.take_async(key, cost, max_wait_us)
                    if failover.healthy
                    else primary.probe_async(key, cost, max_wait_us)
                )
            except BackendError as exc:
                failover.failed(exc, key)
                return self._degraded(key, cost, max_wait_us)
            if not failover.healthy:
                failover.succeeded()
            return decision
        failover.fallback(key)
        return self._degraded(key, cost, max_wait_us)
