"""Bounded per-key state: an LRU map with idle expiry.

Keyed policies (per client IP, per domain, per model tier) keep one small state per
key. Keys can be chosen by an attacker, so the map is bounded twice: at most
``max_keys`` entries (least recently used dropped first) and entries idle longer than
``idle_ttl`` seconds dropped lazily. Callers pick ``factory`` so that a dropped entry
is re-created in a state that never over-admits (a full bucket, a closed breaker with
a fresh window).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ._clock import Clock
from ._validate import check_int, check_number

__all__ = ["BoundedMap"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(Generic[K, V]):
    """A thread-safe map of at most ``max_keys`` entries, dropping idle ones.

    ``get(key)`` returns the entry, creating it with ``factory(key)`` if absent or idle
    longer than ``idle_ttl``, and marks it as used now. Expiry is lazy: every ``get``
    also examines the least recently used entry and drops it if idle, so cleanup is O(1)
    per call, with no timer thread.

    Example::

        buckets = BoundedMap(lambda key: Bucket(), max_keys=10_000, idle_ttl=600, clock=clock)
        bucket = buckets.get("203.0.113.7")
    """

    __slots__ = ("_clock", "_data", "_factory", "_lock", "evictions", "idle_ttl", "max_keys")

    def __init__(
        self,
        factory: Callable[[K], V],
        *,
        max_keys: int = 10_000,
        idle_ttl: float | None = 600.0,
        clock: Clock,
    ) -> None:
        self.max_keys: int = check_int("max_keys", max_keys, minimum=1)
        self.idle_ttl: float | None = check_number(
            "idle_ttl", idle_ttl, minimum=0.0, strict=True, allow_none=True
        )
        self._factory = factory
        self._clock = clock
        self._data: OrderedDict[K, tuple[V, float]] = OrderedDict()
        self._lock = threading.Lock()
        #: How many entries were dropped (capacity or idleness) so far.
        self.evictions = 0

    def get(self, key: K) -> V:
        """The entry for ``key``, created if needed, marked as used now."""
        now = self._clock.monotonic()
        data = self._data
        with self._lock:
            item = data.get(key)
            if item is not None and self._live(item[1], now):
                data.move_to_end(key)
                data[key] = (item[0], now)
                value = item[0]
            else:
                if item is not None:
                    # Idle past idle_ttl but not swept yet: it expired all the same, so
                    # the key starts afresh, as if the sweep had reached it first.
                    del data[key]
                    self.evictions += 1
                value = self._factory(key)
                data[key] = (value, now)
                if len(data) > self.max_keys:
                    data.popitem(last=False)
                    self.evictions += 1
            self._expire_one(now)
            return value

    def peek(self, key: K) -> V | None:
        """The entry for ``key`` if present and not idle past ``idle_ttl`` (the one
        :meth:`get` would return), without creating it or touching its age."""
        item = self._data.get(key)
        if item is None or not self._live(item[1], self._clock.monotonic()):
            return None
        return item[0]

    def _live(self, used: float, now: float) -> bool:
        """Whether an entry last used at ``used`` is still in use at ``now``: an idle
        one has expired even before the sweep reaches it (see :meth:`get`)."""
        return self.idle_ttl is None or now - used <= self.idle_ttl

    def pop(self, key: K) -> V | None:
        """Remove and return the entry for ``key`` (``None`` if absent)."""
        with self._lock:
            item = self._data.pop(key, None)
        return None if item is None else item[0]

    def _expire_one(self, now: float) -> None:
        if self.idle_ttl is None or not self._data:
            return
        oldest_key = next(iter(self._data))
        if not self._live(self._data[oldest_key][1], now):
            del self._data[oldest_key]
            self.evictions += 1

    def expire(self) -> int:
        """Drop every idle entry now; returns how many were dropped."""
        if self.idle_ttl is None:
            return 0
        now = self._clock.monotonic()
        dropped = 0
        with self._lock:
            while self._data:
                oldest_key = next(iter(self._data))
                if now - self._data[oldest_key][1] <= self.idle_ttl:
                    break
                del self._data[oldest_key]
                dropped += 1
            self.evictions += dropped
        return dropped

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the live ``(key, entry)`` pairs (idle ones left out, as
        :meth:`peek` leaves them), least recently used first."""
        now = self._clock.monotonic()
        with self._lock:
            return [
                (key, value) for key, (value, used) in self._data.items() if self._live(used, now)
            ]

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        # Entries held in memory: idle ones not swept yet count (the memory bound).
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return self.peek(key) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return iter([key for key, _ in self.items()])
