"""In-process state: the default backend of every policy.

For rate limiting, each limiter gets its own table of GCRA buckets (see
:mod:`resilience.ratelimit._gcra`): one integer per key, the time at which that key's
bucket is full again. The table is bounded twice:

* **Expiry when full.** A key whose bucket is full is indistinguishable from an absent
  key, so it is dropped (lazily, a couple of entries per new key, oldest first). Idle
  keys therefore cost nothing once their bucket has refilled, and expiring them can
  never over-admit.
* **A hard cap** (``max_keys``, least recently used dropped first). Dropping a bucket
  that is *not* yet full would forget tokens already spent, so the table remembers the
  latest refill time of such evictions and starts new keys no fuller than that: under a
  flood of distinct keys new keys are admitted conservatively for at most one refill
  period, and the cap never over-admits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from .._clock import SYSTEM_CLOCK, Clock
from .._validate import check_int

if TYPE_CHECKING:
    from ..ratelimit._gcra import GCRA, Decision

__all__ = ["MemoryBackend", "MemoryBuckets"]

_SWEEP = 2  # full buckets dropped per newly inserted key
#: A bucket's refill time when it is full whatever the clock reads (0 is not: a clock
#: may read negative, a FakeClock(start=-100) say, and 0 would then be 100 s ahead).
_FULL = -(1 << 62)


class MemoryBackend:
    """Keep policy state in this process (thread-safe and task-safe). The default backend.

    ``max_keys`` caps the keyed state of each policy using this backend (per client IP,
    per domain...). Full token buckets are dropped as soon as they refill, so the cap is
    only reached under a flood of distinct active keys; see the module docstring for why
    that never over-admits.

    Example::

        limiter = rs.RateLimiter(
            "10/s", key=lambda url: urlsplit(url).hostname,
            backend=rs.backends.MemoryBackend(max_keys=50_000),
        )
    """

    __slots__ = ("max_keys",)

    def __init__(self, *, max_keys: int = 100_000) -> None:
        self.max_keys: int = check_int("max_keys", max_keys, minimum=1)

    def gcra_buckets(self, gcra: GCRA, clock: Clock) -> MemoryBuckets:
        """A new table of GCRA buckets for one limiter (used by :class:`~resilience.RateLimiter`).

        Example: ``buckets = MemoryBackend().gcra_buckets(GCRA(Rate(5, 1), 5), rs.SYSTEM_CLOCK)``
        """
        return MemoryBuckets(gcra, clock, max_keys=self.max_keys)

    def __repr__(self) -> str:
        return f"MemoryBackend(max_keys={self.max_keys})"


class MemoryBuckets:
    """The GCRA buckets of one limiter in memory: a thin, locked shell around the pure core.

    ``admit()`` is the lean path used by decorators and ``with``: it returns the seconds
    to wait (``>= 0``) when admitted, or ``-retry_after`` (``< 0``) when refused, and
    builds no :class:`Decision`. ``take()`` returns the full :class:`Decision`. The key
    ``None`` is the limiter's single unkeyed bucket, held outside the table.

    Example::

        buckets = MemoryBackend().gcra_buckets(gcra, clock)
        assert buckets.admit(None, 1, 0) == 0.0      # admitted, no wait
    """

    __slots__ = (
        "_acquire",
        "_emission",
        "_floor",
        "_lock",
        "_monotonic",
        "_monotonic_ns",
        "_release",
        "_tat",
        "_tats",
        "_tolerance",
        "_us_ticks",
        "admitted",
        "evictions",
        "gcra",
        "max_keys",
    )

    local = True

    def __init__(self, gcra: GCRA, clock: Clock, *, max_keys: int = 100_000) -> None:
        self.gcra = gcra
        self.max_keys = max_keys
        self._monotonic = clock.monotonic
        # The system clock in integer nanoseconds: no float rounding on the hot path.
        self._monotonic_ns = time.monotonic_ns if clock is SYSTEM_CLOCK else None
        self._lock = threading.Lock()
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        self._tat = _FULL  # the unkeyed bucket
        self._tats: dict[Hashable, int] = {}
        self._floor = _FULL  # refill time of the latest non-full bucket evicted by the cap
        self._emission = gcra.emission
        self._tolerance = gcra.tolerance
        self._us_ticks = gcra.denominator
        #: Buckets dropped by the ``max_keys`` cap before they were full.
        self.evictions = 0
        #: Calls admitted through :meth:`admit` / :meth:`admit_one`.
        self.admitted = 0

    def _now(self) -> int:
        """The clock in ticks (whole microseconds times the rate's amount)."""
        monotonic_ns = self._monotonic_ns
        if monotonic_ns is not None:
            return monotonic_ns() // 1000 * self._us_ticks
        return round(self._monotonic() * 1_000_000) * self._us_ticks

    def admit_one(self) -> float:
        """Take one token of the unkeyed bucket, no waiting: 0.0 or ``-retry_after``.

        The hot path of an unkeyed limiter's decorator; the core's transition
        (:meth:`GCRA.take`) inlined, under the lock.
        """
        monotonic_ns = self._monotonic_ns
        if monotonic_ns is not None:
            now = monotonic_ns() // 1000 * self._us_ticks
        else:
            now = round(self._monotonic() * 1_000_000) * self._us_ticks
        self._acquire()
        try:
            tat = self._tat
            if tat < now:
                tat = now
            tat += self._emission
            wait = tat - self._tolerance - now
            if wait <= 0:
                self._tat = tat
                self.admitted += 1
                return 0.0
        finally:
            self._release()
        return -self.gcra.seconds(wait)

    def admit(self, key: Hashable, cost: int, max_wait_us: int) -> float:
        """Take ``cost`` tokens for ``key``: wait seconds (``>= 0``) or ``-retry_after``.

        ``max_wait_us`` (microseconds) is how long a reservation may wait; 0: no waiting.
        """
        max_wait = max_wait_us * self._us_ticks
        self._acquire()
        try:
            # Read under the lock: a thread acting on an older time than one that already
            # ran could find a key swept as full that was not full yet at its time.
            now = self._now()
            if key is None:
                allowed, tat, wait = self.gcra.take(self._tat, now, cost, max_wait)
                if allowed:
                    self._tat = tat
            else:
                allowed, tat, wait = self._take_keyed(key, now, cost, max_wait)
            if allowed:
                self.admitted += 1
        finally:
            self._release()
        if allowed:
            return 0.0 if wait <= 0 else self.gcra.seconds(wait)
        return -self.gcra.seconds(wait)

    def take_one(self, key: Hashable) -> int | Decision:
        """``take(key, 1, 0)`` for a keyed bucket, lean when admitted.

        Admitted: the ticks until the bucket is full again (an ``int >= 0``; counted in
        :attr:`admitted`), from which ``remaining`` and ``reset_after`` follow exactly
        as in the :class:`Decision`. Refused: the refusal's :class:`Decision` (not
        counted). The hot path of the ASGI rate-limit middleware: :meth:`_now`,
        :meth:`_take_keyed` and :meth:`GCRA.take` inlined (a server runs this code
        cold, where every call layer costs several times what it costs in a loop).
        """
        tats = self._tats
        emission = self._emission
        self._acquire()
        try:
            monotonic_ns = self._monotonic_ns  # the time under the lock (see admit)
            if monotonic_ns is not None:
                now = monotonic_ns() // 1000 * self._us_ticks
            else:
                now = round(self._monotonic() * 1_000_000) * self._us_ticks
            stored = tats.pop(key, None)
            if stored is None:
                stored = self._floor
                if tats:
                    self._sweep(now)
            if stored <= now:
                # A full bucket, the common case (most clients stay under their limit):
                # one token always conforms (burst >= 1), no GCRA arithmetic needed.
                tat = now + emission
                wait = 0
                self.admitted += 1
            else:
                tat = stored
                wait = tat + emission - self._tolerance - now
                if wait <= 0:
                    tat += emission
                    self.admitted += 1
            tats[key] = tat  # not full (tat > now): keep it, as the most recently used key
            if len(tats) > self.max_keys:
                self._evict_oldest(now)
        finally:
            self._release()
        if wait <= 0:
            return tat - now
        return self.gcra.decision(False, tat, wait, now)

    def take(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Take ``cost`` tokens for ``key`` (0 peeks) and return the full :class:`Decision`."""
        max_wait = max_wait_us * self._us_ticks
        with self._lock:
            now = self._now()  # under the lock (see admit)
            if key is None:
                allowed, tat, wait = self.gcra.take(self._tat, now, cost, max_wait)
                if allowed:
                    self._tat = tat
            else:
                allowed, tat, wait = self._take_keyed(key, now, cost, max_wait)
        return self.gcra.decision(allowed, tat, wait, now)

    def _take_keyed(
        self, key: Hashable, now: int, cost: int, max_wait: int
    ) -> tuple[bool, int, int]:
        tats = self._tats
        stored = tats.pop(key, None)
        if stored is None:
            stored = self._floor
            self._sweep(now)
        allowed, tat, wait = self.gcra.take(stored, now, cost, max_wait)
        if tat > now:  # not full: keep it, as the most recently used key
            tats[key] = tat
            if len(tats) > self.max_keys:
                self._evict_oldest(now)
        return allowed, tat, wait

    def _sweep(self, now: int) -> None:
        tats = self._tats
        for _ in range(_SWEEP):
            if not tats:
                return
            oldest = next(iter(tats))
            if tats[oldest] > now:
                return
            del tats[oldest]

    def _evict_oldest(self, now: int) -> None:
        oldest = next(iter(self._tats))
        tat = self._tats.pop(oldest)
        if tat > now:
            self.evictions += 1
            if tat > self._floor:
                self._floor = tat

    def expire(self) -> int:
        """Drop every full bucket now; returns how many were dropped.

        Example: ``limiter.expire()`` from a maintenance task (never required).
        """
        now = self._now()
        with self._lock:
            full = [key for key, tat in self._tats.items() if tat <= now]
            for key in full:
                del self._tats[key]
        return len(full)

    def reset(self, key: Hashable) -> None:
        """Make ``key``'s bucket full again (``None``: the unkeyed bucket)."""
        now = self._now()
        with self._lock:
            if key is None:
                self._tat = _FULL
                return
            tats = self._tats
            tats.pop(key, None)
            if self._floor > now:
                # An absent key would start at the eviction floor, which is not full
                # yet: stored as full, under the same cap as any other key.
                tats[key] = _FULL
                if len(tats) > self.max_keys:
                    self._evict_oldest(now)

    async def reset_async(self, key: Hashable) -> None:
        """:meth:`reset` (no I/O)."""
        self.reset(key)

    def statistics(self) -> dict[str, int]:
        """``evictions``: buckets dropped by the ``max_keys`` cap before they were full."""
        return {"evictions": self.evictions, "lean_admitted": self.admitted}

    def __len__(self) -> int:
        return len(self._tats)
