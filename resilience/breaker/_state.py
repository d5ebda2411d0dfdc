"""The states of a circuit breaker."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CircuitState"]


class CircuitState(StrEnum):
    """Where a circuit breaker stands; the value is the lower-case name.

    * ``CLOSED``: calls run; outcomes are recorded in the sliding window.
    * ``OPEN``: calls are rejected with :class:`~resilience.CircuitOpen` until the
      cool-down (``open_for``) ends.
    * ``HALF_OPEN``: exactly ``half_open_calls`` probe calls run; their outcomes close
      the breaker or open it again.
    * ``DISABLED``: every call runs, nothing is recorded (a kill switch for the breaker).
    * ``FORCED_OPEN``: every call is rejected until :meth:`CircuitBreaker.close`.
    * ``METRICS_ONLY``: every call runs and is recorded, the breaker never trips
      (shadow mode: watch what a configuration would do before enforcing it).

    Example::

        if breaker.state is rs.CircuitState.OPEN:
            return cached_answer()
        assert rs.CircuitState.HALF_OPEN.value == "half_open"
    """

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    DISABLED = "disabled"
    FORCED_OPEN = "forced_open"
    METRICS_ONLY = "metrics_only"
