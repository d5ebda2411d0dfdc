"""Repeats: at most one pass per key and interval, the others counted.

What keeps a log readable when the same thing happens thousands of times a second:
the first occurrence of a key passes, the ones within ``interval`` seconds after it
are counted, and the next one to pass carries that count. Time is given by the
caller (``now``), so the logic is pure and tests need no clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Repeats"]

K = TypeVar("K", bound=Hashable)


class Repeats(Generic[K]):
    """Per key: the time of its last pass and the occurrences counted since (thread-safe).

    At most ``max_keys`` keys are remembered; beyond that the table starts afresh
    (the next occurrence of every key passes).

    Example::

        repeats = Repeats(10.0, max_keys=1_000)
        left_out = repeats.admit("disk full", now)
        if left_out is not None:
            log.warning("disk full (%d more since the last record)", left_out)
    """

    __slots__ = ("_entries", "_lock", "interval", "max_keys")

    def __init__(self, interval: float, *, max_keys: int) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._entries: dict[K, list[float]] = {}  # key -> [time of last pass, counted since]
        self._lock = threading.Lock()

    def admit(self, key: K, now: float) -> int | None:
        """``None`` if ``key`` passed less than ``interval`` ago (this one is counted);
        otherwise the occurrences counted since its previous pass (0 the first time),
        and ``now`` becomes its last pass."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now - entry[0] < self.interval:
                entry[1] += 1
                return None
            if entry is None and len(self._entries) >= self.max_keys:
                self._entries.clear()
            self._entries[key] = [now, 0]
            return 0 if entry is None else int(entry[1])

    def forget(self, where: Callable[[K], bool]) -> dict[K, int]:
        """Drop the keys ``where`` accepts; returns the counts they had pending (> 0)."""
        with self._lock:
            dropped = [key for key in self._entries if where(key)]
            pending = {key: int(self._entries.pop(key)[1]) for key in dropped}
        return {key: count for key, count in pending.items() if count}

    def __len__(self) -> int:
        return len(self._entries)
