"""Retry budgets: cap retries at a fraction of recent traffic, fleet-wide per process."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from ._clock import Clock
from ._validate import check_clock, check_number

#: Retries left reported by a budget whose allowance exceeds every count (or overflows
#: to infinity): more than any process makes.
_UNBOUNDED = 2**62

__all__ = ["RetryBudget", "RetryBudgetStatistics"]


@dataclass(frozen=True, slots=True)
class RetryBudgetStatistics:
    """A snapshot of a :class:`RetryBudget`.

    ``calls``, ``retries`` and ``available`` (whole retries the budget would still
    grant) cover the current window; ``refused`` counts every refusal since the budget was
    made.

    Example: ``budget.statistics().available``
    """

    calls: int
    retries: int
    refused: int
    available: int


class RetryBudget:
    """Allow retries up to ``ratio`` of recent calls plus ``min_per_second``.

    Over a sliding ``window`` of seconds (kept as one-second buckets), a retry is
    allowed only if, with it, the window stays within the budget::

        retries_in_window + 1 <= ratio · calls_in_window + min_per_second · window

    so under a total outage the retries add at most ``ratio`` to the load, plus a
    small floor so that low-traffic callers can still retry. Share one budget
    between the policies that call the same dependency. (Finagle's RetryBudget.)

    Example::

        budget = rs.RetryBudget(ratio=0.2, min_per_second=1.0)
        fetch_meta = rs.Retry(on=OSError, budget=budget)(fetch_meta)
        fetch_video = rs.Retry(on=OSError, budget=budget)(fetch_video)
    """

    __slots__ = (
        "_buckets",
        "_clock",
        "_lock",
        "_refused",
        "min_per_second",
        "ratio",
        "window",
    )

    def __init__(
        self,
        ratio: float = 0.2,
        min_per_second: float = 10.0,
        window: float = 10.0,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.ratio: float = check_number("ratio", ratio)
        self.min_per_second: float = check_number("min_per_second", min_per_second)
        self.window: float = check_number("window", window, minimum=1.0)
        self._clock = check_clock("clock", clock)
        # bucket index (whole seconds) -> [calls, retries]
        self._buckets: dict[int, list[int]] = {}
        self._lock = threading.Lock()
        self._refused = 0

    def _bucket(self, now: float) -> list[int]:
        index = math.floor(now)
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = [0, 0]
            oldest = index - math.ceil(self.window)
            for stale in [k for k in self._buckets if k <= oldest]:
                del self._buckets[stale]
        return bucket

    def deposit(self) -> None:
        """Record one call (a first attempt); every call earns ``ratio`` of a retry."""
        now = self._clock.monotonic()
        with self._lock:
            self._bucket(now)[0] += 1

    def _totals(self) -> tuple[int, int]:
        calls = retries = 0
        for bucket_calls, bucket_retries in self._buckets.values():
            calls += bucket_calls
            retries += bucket_retries
        return calls, retries

    def _grantable(self, calls: int, retries: int) -> int:
        """Whole retries left: ``floor(ratio·calls + min_per_second·window) - retries``.

        The allowance is rounded with a relative tolerance because binary floats land
        just under the whole number they mean (``0.29 * 100 == 28.999999999999996``),
        which would withhold a retry the formula grants."""
        allowance = self.ratio * calls + self.min_per_second * self.window
        if allowance >= _UNBOUNDED:  # huge settings (1e308 per second): no limit
            return _UNBOUNDED
        return max(math.floor(allowance * (1 + 1e-12) + 1e-12) - retries, 0)

    def try_withdraw(self) -> bool:
        """Take one retry from the budget; ``False`` (and nothing taken) when it is empty."""
        return self._take() is not None

    def _take(self) -> int | None:
        """:meth:`try_withdraw`, returning the bucket the retry was taken from (a ticket
        for :meth:`_refund`), or ``None``."""
        now = self._clock.monotonic()
        with self._lock:
            bucket = self._bucket(now)
            calls, retries = self._totals()
            if self._grantable(calls, retries) < 1:
                self._refused += 1
                return None
            bucket[1] += 1
            return math.floor(now)

    def _refund(self, ticket: int) -> None:
        """Give back the retry taken under ``ticket`` that was never sent (its backoff
        was cancelled), if it still counts in the window: callers that give up
        mid-backoff must not drain the budget of those that retry."""
        with self._lock:
            bucket = self._buckets.get(ticket)
            if bucket is not None and bucket[1] > 0:
                bucket[1] -= 1

    def statistics(self) -> RetryBudgetStatistics:
        """Calls and retries in the current window, retries still available, and
        refusals since the budget was made."""
        with self._lock:
            self._bucket(self._clock.monotonic())
            calls, retries = self._totals()
            available = self._grantable(calls, retries)
            return RetryBudgetStatistics(calls, retries, self._refused, available)

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio}, min_per_second={self.min_per_second}, "
            f"window={self.window})"
        )
