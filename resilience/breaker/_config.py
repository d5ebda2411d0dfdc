"""A breaker's validated configuration and its outcome classification."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal

from .._matching import ExceptionMatcher, awaited_a_sync_call
from .._validate import (
    check_choice,
    check_int,
    check_number,
    check_predicate,
    check_probability,
)
from ..errors import ConfigurationError, Rejected

__all__ = ["FAILURE", "IGNORE", "SUCCESS", "BreakerConfig", "Outcome"]

Outcome = Literal["success", "failure", "ignored"]
SUCCESS: Outcome = "success"
FAILURE: Outcome = "failure"
IGNORE: Outcome = "ignored"


def _filter(name: str, value: Any) -> ExceptionMatcher | None:
    if value is None or (
        isinstance(value, Sequence | AbstractSet) and not isinstance(value, str) and not value
    ):
        return None  # "nothing": (), [] and set() alike, any empty collection
    return ExceptionMatcher(name, value)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Everything a :class:`BreakerCore` needs to decide, validated once.

    Built by :class:`~resilience.CircuitBreaker` from its keyword arguments (see there
    for their meaning); shared by every key of a keyed breaker.

    Example::

        config = BreakerConfig.build(failure_rate=0.5, window=20, min_calls=5)
        core = BreakerCore(config)
    """

    failure_rate: float | None
    window: float
    window_type: str
    buckets: int
    min_calls: int
    slow_call: float | None
    slow_call_rate: float
    consecutive_failures: int | None
    open_for: float
    open_for_max: float | None
    open_for_jitter: float
    half_open_calls: int
    max_half_open_wait: float | None
    record: ExceptionMatcher | None
    exclude: ExceptionMatcher | None
    record_result: Callable[[Any], bool] | None
    record_rejected: bool

    @classmethod
    def build(
        cls,
        *,
        failure_rate: float | None = 0.5,
        window: float = 100,
        window_type: str = "count",
        buckets: int = 10,
        min_calls: int | None = None,
        slow_call: float | None = None,
        slow_call_rate: float = 1.0,
        consecutive_failures: int | None = None,
        open_for: float = 30.0,
        open_for_max: float | None = None,
        open_for_jitter: float = 0.0,
        half_open_calls: int = 1,
        max_half_open_wait: float | None = None,
        record: Any = None,
        exclude: Any = (),
        record_result: Callable[[Any], bool] | None = None,
        record_rejected: bool = False,
    ) -> BreakerConfig:
        """Validate the arguments; raise :class:`ConfigurationError` naming the bad one."""
        if failure_rate is not None:
            failure_rate = check_probability("failure_rate", failure_rate)
            if failure_rate == 0:
                raise ConfigurationError(
                    "failure_rate must be a number in (0, 1] or None, got 0 "
                    "(0 would trip on the first call)"
                )
        window_type = check_choice("window_type", window_type, ("count", "time"))
        if window_type == "count":
            window = check_int("window", window, minimum=1)
        else:
            window = check_number("window", window, minimum=0.0, strict=True)
        buckets = check_int("buckets", buckets, minimum=1, maximum=10_000)
        if min_calls is None:
            min_calls = min(10, int(window)) if window_type == "count" else 10
        min_calls = check_int("min_calls", min_calls, minimum=1)
        if window_type == "count" and min_calls > window:
            raise ConfigurationError(
                f"min_calls must be <= window ({window}) for a count window, got {min_calls}"
            )
        slow_call = check_number("slow_call", slow_call, minimum=0.0, strict=True, allow_none=True)
        slow_call_rate = check_probability("slow_call_rate", slow_call_rate)
        if slow_call is not None and slow_call_rate == 0:
            raise ConfigurationError("slow_call_rate must be a number in (0, 1], got 0")
        consecutive_failures = check_int(
            "consecutive_failures", consecutive_failures, minimum=1, allow_none=True
        )
        if failure_rate is None and slow_call is None and consecutive_failures is None:
            raise ConfigurationError(
                "the breaker can never trip: give failure_rate, slow_call or "
                "consecutive_failures (or use metrics_only() for a shadow breaker)"
            )
        open_for = check_number("open_for", open_for, minimum=0.0)
        open_for_max = check_number("open_for_max", open_for_max, minimum=0.0, allow_none=True)
        if open_for_max is not None and open_for_max < open_for:
            raise ConfigurationError(
                f"open_for_max must be >= open_for ({open_for:g}), got {open_for_max!r}"
            )
        open_for_jitter = check_probability("open_for_jitter", open_for_jitter)
        half_open_calls = check_int("half_open_calls", half_open_calls, minimum=1)
        max_half_open_wait = check_number(
            "max_half_open_wait", max_half_open_wait, minimum=0.0, strict=True, allow_none=True
        )
        check_predicate("record_result", record_result)
        if not isinstance(record_rejected, bool):
            raise ConfigurationError(f"record_rejected must be a bool, got {record_rejected!r}")
        return cls(
            failure_rate=failure_rate,
            window=window,
            window_type=window_type,
            buckets=buckets,
            min_calls=min_calls,
            slow_call=slow_call,
            slow_call_rate=slow_call_rate,
            consecutive_failures=consecutive_failures,
            open_for=open_for,
            open_for_max=open_for_max,
            open_for_jitter=open_for_jitter,
            half_open_calls=half_open_calls,
            max_half_open_wait=max_half_open_wait,
            record=_filter("record", record),
            exclude=_filter("exclude", exclude),
            record_result=record_result,
            record_rejected=record_rejected,
        )

    @property
    def slow_after(self) -> float:
        """The slow-call threshold in seconds (infinity when slow calls are not tracked)."""
        return math.inf if self.slow_call is None else self.slow_call

    @property
    def timed(self) -> bool:
        """Whether calls must be timed (slow calls, or a time window needing ``now``)."""
        return self.slow_call is not None or self.window_type == "time"

    def classify(self, exc: BaseException, *, explicit: bool = False) -> Outcome:
        """What an exception counts as.

        In order: anything that is not an :class:`Exception` (cancellation,
        ``KeyboardInterrupt``) is ignored, as is a sync function given to ``call_async``
        (see :func:`~resilience._matching.awaited_a_sync_call`); ``exclude`` matches are ignored;
        :class:`~resilience.Rejected` errors (a limiter, bulkhead or breaker inside this
        one refused the call) are ignored unless ``record_rejected``; with ``record``,
        matches are failures and everything else successes; otherwise every exception
        is a failure. ``explicit`` (a caller said "failure") skips the ``record`` test.
        """
        if not isinstance(exc, Exception) or awaited_a_sync_call(exc):
            return IGNORE
        if self.exclude is not None and self.exclude(exc):
            return IGNORE
        if isinstance(exc, Rejected) and not self.record_rejected:
            return IGNORE
        if self.record is not None and not explicit:
            return FAILURE if self.record(exc) else SUCCESS
        return FAILURE

    def judge(self, result: object) -> Outcome:
        """What a returned value counts as (``record_result`` marks failures)."""
        if self.record_result is not None and self.record_result(result):
            return FAILURE
        return SUCCESS

    def open_duration(self, trips: int, draw: float) -> float:
        """The cool-down after the ``trips``-th consecutive trip; ``draw`` in [0, 1)."""
        duration = self.open_for
        if self.open_for_max is not None:
            duration = min(self.open_for * max(trips, 1), self.open_for_max)
        if self.open_for_jitter:
            duration *= 1.0 - self.open_for_jitter * draw
        return duration

    def trip_reason(self, calls: int, failures: int, slow: int, consecutive: int) -> str | None:
        """Why a CLOSED breaker with these window counts must open, or ``None``."""
        limit = self.consecutive_failures
        if limit is not None and consecutive >= limit:
            return "consecutive_failures"
        if calls >= self.min_calls:
            rate = self.failure_rate
            if rate is not None and failures / calls >= rate:
                return "failure_rate"
            if self.slow_call is not None and slow / calls >= self.slow_call_rate:
                return "slow_call_rate"
        return None

    def probes_failed(self, probes: int, failures: int, slow: int) -> bool:
        """Whether the outcomes of ``probes`` half-open probes open the breaker again."""
        rate = self.failure_rate
        if rate is None:
            if failures:
                return True
        elif failures / probes >= rate:
            return True
        return self.slow_call is not None and slow / probes >= self.slow_call_rate
