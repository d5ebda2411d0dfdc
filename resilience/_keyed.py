"""Bounded per-key state: an LRU map with idle expiry.

Keyed policies (per client IP, per domain, per model tier) keep one small state per
key. Keys can be chosen by an attacker, so the map is bounded twice: at most
``max_keys`` entries (least recently used dropped first) and entries idle longer than
``idle_ttl`` seconds dropped lazily. Callers pick ``factory`` so that a dropped entry
is re-created in a state that never over-admits (a full bucket, a closed breaker with
a fresh window). Entries a ``held`` predicate names (a breaker a person forced open)
are neither: they stay, however idle, and a full map drops others instead.
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

    __slots__ = (
        "_clock",
        "_data",
        "_factory",
        "_held",
        "_lock",
        "evictions",
        "idle_ttl",
        "max_keys",
    )

    def __init__(
        self,
        factory: Callable[[K], V],
        *,
        max_keys: int = 10_000,
        idle_ttl: float | None = 600.0,
        clock: Clock,
        held: Callable[[V, float], bool] | None = None,
    ) -> None:
        self.max_keys: int = check_int("max_keys", max_keys, minimum=1)
        self.idle_ttl: float | None = check_number(
            "idle_ttl", idle_ttl, minimum=0.0, strict=True, allow_none=True
        )
        self._factory = factory
        #: ``held(entry, now)``: the entry must not be dropped now (rare; checked only
        #: for entries about to be dropped).
        self._held = held
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
            if item is not None and self._kept(item, now):
                data.move_to_end(key)
                data[key] = (item[0], now)
                value = item[0]
            else:
                if item is not None:
                    # Idle past idle_ttl but not swept yet: it expired all the same, so
                    # the key starts afresh, as if the sweep had reached it first.
                    del data[key]
                    self.evictions += 1
                if len(data) >= self.max_keys:
                    self._drop_least_recent(now)
                value = self._factory(key)
                data[key] = (value, now)
            self._expire_one(now)
            return value

    def _kept(self, item: tuple[V, float], now: float) -> bool:
        """Whether an entry is still there for :meth:`get`: in use, or held."""
        return self._live(item[1], now) or (self._held is not None and self._held(item[0], now))

    def _drop_least_recent(self, now: float) -> None:
        """Make room: drop the least recently used entry that is not held. Held ones
        met on the way go to the back, so the next search does not meet them again; if
        every entry is held, the map grows past ``max_keys`` by those."""
        data = self._data
        held = self._held
        for _ in range(len(data)):
            oldest_key = next(iter(data))
            if held is None or not held(data[oldest_key][0], now):
                del data[oldest_key]
                self.evictions += 1
                return
            data.move_to_end(oldest_key)

    def peek(self, key: K) -> V | None:
        """The entry for ``key`` if present and not idle past ``idle_ttl`` (the one
        :meth:`get` would return), without creating it or touching its age."""
        item = self._data.get(key)
        if item is None or not self._kept(item, self._clock.monotonic()):
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

    def _expire_one(self, now: float) -> bool:
        """Drop the least recently used entry if idle; whether the sweep may go on (an
        idle entry that is held goes to the back instead, out of the sweep's way)."""
        data = self._data
        if self.idle_ttl is None or not data:
            return False
        oldest_key = next(iter(data))
        item = data[oldest_key]
        if self._live(item[1], now):
            return False
        if self._held is not None and self._held(item[0], now):
            data.move_to_end(oldest_key)
        else:
            del data[oldest_key]
            self.evictions += 1
        return True

    def expire(self) -> int:
        """Drop every idle entry now (held ones stay); returns how many were dropped."""
        if self.idle_ttl is None:
            return 0
        now = self._clock.monotonic()
        with self._lock:
            before = self.evictions
            for _ in range(len(self._data)):
                if not self._expire_one(now):
                    break
            return self.evictions - before

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the live ``(key, entry)`` pairs (idle ones left out, as
        :meth:`peek` leaves them), least recently used first."""
        now = self._clock.monotonic()
        with self._lock:
            return [(key, item[0]) for key, item in self._data.items() if self._kept(item, now)]

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
