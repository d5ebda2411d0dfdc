"""resilience: composable resilience policies for sync and async Python.

Rate limiters (GCRA, in memory or on Redis), keyed bulkheads, circuit breakers,
retries with jittered backoff and budgets, timeouts and deadlines, fallbacks and fault
injection; each one a decorator, a context manager where that makes sense, and a step
of a :class:`Pipeline`.

Example::

    import resilience as rs

    @rs.Pipeline(rs.Fallback(b""), rs.Retry(on=OSError, attempts=3, deadline=2.0), rs.Timeout(0.5))
    async def fetch(url: str) -> bytes: ...
"""

from . import backoff, errors, testing
from ._budget import RetryBudget, RetryBudgetStatistics
from ._clock import SYSTEM_CLOCK, Clock, SystemClock
from ._deadline import Deadline, current_deadline, deadline, time_remaining
from ._events import (
    BackendFallback,
    BackendRecovered,
    CallRejected,
    Event,
    FallbackUsed,
    Listener,
    RetriesExhausted,
    RetryBudgetExhausted,
    RetryScheduled,
    StateChanged,
    TimedOut,
    add_listener,
    remove_listener,
)
from ._fallback import Fallback, FallbackStatistics
from ._policy import Pipeline, PipelineOrderWarning, Policy, PolicyBase, decorate
from ._retry import Retry, RetryStatistics
from ._timeout import Timeout, TimeoutStatistics
from .errors import (
    BackendError,
    BulkheadFull,
    CircuitOpen,
    ConfigurationError,
    InjectedFault,
    RateLimited,
    Rejected,
    ResilienceError,
)

# -- exports added per area below (keep each block self-contained) --

__all__ = [
    "BackendError",
    "BackendFallback",
    "BackendRecovered",
    "BulkheadFull",
    "CallRejected",
    "CircuitOpen",
    "Clock",
    "ConfigurationError",
    "Deadline",
    "Event",
    "Fallback",
    "FallbackStatistics",
    "FallbackUsed",
    "InjectedFault",
    "Listener",
    "Pipeline",
    "PipelineOrderWarning",
    "Policy",
    "PolicyBase",
    "RateLimited",
    "Rejected",
    "ResilienceError",
    "RetriesExhausted",
    "Retry",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryBudgetStatistics",
    "RetryScheduled",
    "RetryStatistics",
    "SYSTEM_CLOCK",
    "StateChanged",
    "SystemClock",
    "TimedOut",
    "Timeout",
    "TimeoutStatistics",
    "add_listener",
    "backoff",
    "current_deadline",
    "deadline",
    "decorate",
    "errors",
    "remove_listener",
    "testing",
    "time_remaining",
]
