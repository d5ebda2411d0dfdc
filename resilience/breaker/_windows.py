"""Sliding windows of call outcomes: the last N calls, or the last N seconds.

Both windows keep O(1) aggregates (calls, failures, slow calls, consecutive failures)
and are pure: time comes in as ``now``. They are driven by :class:`BreakerCore`, which
calls :meth:`record` and :meth:`counts` under its lock.

The happy path is lock-free. While a window holds no failure, no slow call and no
run of consecutive failures (``pending`` is false), a success cannot trip anything,
so :meth:`quick_success` only counts it: one ``next()`` on an :class:`itertools.count`,
which is atomic in CPython. Everything else goes through the breaker's lock. A
success that races with a state change may land in a window that was just replaced;
that window is discarded, so the race costs nothing.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from .._validate import check_int, check_number

__all__ = ["AtomicCounter", "CountWindow", "TimeWindow", "Window"]


class AtomicCounter:
    """A counter whose increments are lock-free; reads happen under the owner's lock.

    ``tick`` is the bound ``__next__`` of an :class:`itertools.count`: one C call that
    cannot be interrupted by another thread in CPython. Reading consumes one step,
    which is subtracted.
    """

    __slots__ = ("_counter", "_reads", "tick")

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._reads = 0
        self.tick = self._counter.__next__

    def total(self) -> int:
        """How many calls were counted so far (under the owner's lock)."""
        value = next(self._counter) - self._reads
        self._reads += 1
        return value

    def add(self) -> int:
        """Count one call (under the owner's lock); returns its zero-based index."""
        return next(self._counter) - self._reads


class CountWindow:
    """The last ``size`` recorded calls.

    Failures and slow calls are kept as the indices of the calls that had them, so a
    success costs one counter increment and old outcomes fall out of the window when
    their index is ``size`` calls behind.

    Example::

        window = CountWindow(10)
        window.record(0.0, failed=True, slow=False)
        assert window.counts(0.0) == (1, 1, 0)
    """

    __slots__ = (
        "_calls",
        "_failures",
        "_slow",
        "consecutive",
        "pending",
        "size",
        "slow_after",
        "tick",
    )

    def __init__(self, size: int, *, slow_after: float = math.inf) -> None:
        check_int("size", size, minimum=1)
        check_number("slow_after", slow_after, allow_inf=True)
        self._setup(size, slow_after)

    @classmethod
    def _unchecked(cls, size: int, slow_after: float) -> CountWindow:
        """A window of arguments a :class:`BreakerConfig` has already checked (a breaker
        makes one per key and per closing: no second validation on that path)."""
        window = cls.__new__(cls)
        window._setup(size, slow_after)
        return window

    def _setup(self, size: int, slow_after: float) -> None:
        self.size = size
        #: Calls slower than this (seconds) are slow calls.
        self.slow_after = slow_after
        self._calls = AtomicCounter()
        #: Count one success without the lock (only while ``pending`` is false).
        self.tick = self._calls.tick
        self._failures: deque[int] = deque()
        self._slow: deque[int] = deque()
        #: Failures since the last success (ignored calls do not count).
        self.consecutive = 0
        #: Whether a success may change a decision (a failure, slow call or run is held).
        self.pending = False

    def quick_success(self) -> bool:
        """Count a fast success without the lock if nothing is pending; else return False."""
        if self.pending:
            return False
        self.tick()
        return True

    def quick_success_at(self, now: float, start: float) -> bool:
        """Like :meth:`quick_success` for a call that ran from ``start`` to ``now``."""
        if self.pending or now - start > self.slow_after:
            return False
        self.tick()
        return True

    def record(self, now: float, failed: bool, slow: bool) -> tuple[int, int, int]:
        """Add one outcome; returns ``(calls, failures, slow_calls)`` in the window."""
        index = self._calls.add()
        failures, slows = self._failures, self._slow
        if failed:
            failures.append(index)
            self.consecutive += 1
        else:
            self.consecutive = 0
        if slow:
            slows.append(index)
        oldest = index - self.size
        while failures and failures[0] <= oldest:
            failures.popleft()
        while slows and slows[0] <= oldest:
            slows.popleft()
        self.pending = bool(failures or slows or self.consecutive)
        return min(index + 1, self.size), len(failures), len(slows)

    def counts(self, now: float) -> tuple[int, int, int]:
        """``(calls, failures, slow_calls)`` in the window now."""
        total = self._calls.total()
        oldest = total - 1 - self.size
        failures = sum(1 for index in self._failures if index > oldest)
        slows = sum(1 for index in self._slow if index > oldest)
        return min(total, self.size), failures, slows


class TimeWindow:
    """The calls recorded in the last ``seconds``, in ``buckets`` buckets.

    Time is cut into buckets of ``seconds / buckets``; the window is the current
    bucket and the ``buckets - 1`` before it, so it spans between
    ``seconds - seconds / buckets`` and ``seconds``. Each bucket keeps its failure and
    slow-call counts and the running total of calls at its start, so the window's
    aggregates cost O(1) per call (O(buckets) when time jumps a whole window).

    Example::

        window = TimeWindow(60.0, 60, now=0.0)
        window.record(0.5, failed=True, slow=False)
        assert window.counts(59.9) == (1, 1, 0)
        assert window.counts(60.1) == (0, 0, 0)
    """

    __slots__ = (
        "_calls",
        "_current",
        "_end",
        "_fails",
        "_slows",
        "_starts",
        "buckets",
        "consecutive",
        "failures",
        "pending",
        "seconds",
        "slow",
        "slow_after",
        "tick",
        "width",
    )

    def __init__(
        self, seconds: float, buckets: int, *, now: float, slow_after: float = math.inf
    ) -> None:
        check_number("seconds", seconds, strict=True)
        check_int("buckets", buckets, minimum=1, maximum=1_000_000)
        check_number("now", now, minimum=-math.inf)
        check_number("slow_after", slow_after, allow_inf=True)
        self._setup(seconds, buckets, now, slow_after)

    @classmethod
    def _unchecked(cls, seconds: float, buckets: int, now: float, slow_after: float) -> TimeWindow:
        """A window of arguments a :class:`BreakerConfig` has already checked (see
        :meth:`CountWindow._unchecked`)."""
        window = cls.__new__(cls)
        window._setup(seconds, buckets, now, slow_after)
        return window

    def _setup(self, seconds: float, buckets: int, now: float, slow_after: float) -> None:
        self.seconds = seconds
        self.buckets = buckets
        self.width = seconds / buckets
        self.slow_after = slow_after
        self._calls = AtomicCounter()
        #: Count one success without the lock (only while ``pending`` is false).
        self.tick = self._calls.tick
        self._starts = [0] * buckets
        self._fails = [0] * buckets
        self._slows = [0] * buckets
        self._current = int(now // self.width)
        self._end = (self._current + 1) * self.width
        #: Failures and slow calls in the live buckets.
        self.failures = 0
        self.slow = 0
        self.consecutive = 0
        self.pending = False

    def quick_success(self) -> bool:
        """A time window always needs ``now``: see :meth:`quick_success_at`."""
        return False

    def quick_success_at(self, now: float, start: float) -> bool:
        """Count a fast success without the lock if nothing is pending; else return False."""
        if self.pending or now >= self._end or now - start > self.slow_after:
            return False
        self.tick()
        return True

    def _roll(self, now: float) -> None:
        bucket = int(now // self.width)
        current = self._current
        if bucket <= current:
            return
        total = self._calls.total()
        count = self.buckets
        starts, fails, slows = self._starts, self._fails, self._slows
        if bucket - current >= count:
            for slot in range(count):
                starts[slot] = total
                fails[slot] = slows[slot] = 0
            self.failures = self.slow = 0
        else:
            for absolute in range(current + 1, bucket + 1):
                slot = absolute % count
                self.failures -= fails[slot]
                self.slow -= slows[slot]
                fails[slot] = slows[slot] = 0
                starts[slot] = total
        self._current = bucket
        self._end = (bucket + 1) * self.width
        self.pending = bool(self.failures or self.slow or self.consecutive)

    def record(self, now: float, failed: bool, slow: bool) -> tuple[int, int, int]:
        """Add one outcome at ``now``; returns ``(calls, failures, slow_calls)``."""
        self._roll(now)
        index = self._calls.add()
        slot = self._current % self.buckets
        if failed:
            self._fails[slot] += 1
            self.failures += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        if slow:
            self._slows[slot] += 1
            self.slow += 1
        self.pending = bool(self.failures or self.slow or self.consecutive)
        calls = index + 1 - self._starts[(self._current + 1) % self.buckets]
        return calls, self.failures, self.slow

    def counts(self, now: float) -> tuple[int, int, int]:
        """``(calls, failures, slow_calls)`` in the window at ``now``."""
        self._roll(now)
        calls = self._calls.total() - self._starts[(self._current + 1) % self.buckets]
        return calls, self.failures, self.slow


Window = CountWindow | TimeWindow
