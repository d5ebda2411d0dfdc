"""resilience: composable resilience policies for sync and async Python.

Rate limiters (GCRA, in memory or on Redis), keyed bulkheads, circuit breakers,
retries with jittered backoff and budgets, timeouts and deadlines, fallbacks and fault
injection; each one a decorator, a context manager where that makes sense, and a step
of a :class:`Pipeline`.

Example::

    import resilience as rs

    @rs.Pipeline(
        rs.Fallback(b"", on=(rs.Rejected, rs.Timeout, OSError)),
        rs.Retry(on=OSError, attempts=3, deadline=2.0),
        rs.Timeout(0.5),
    )
    async def fetch(url: str) -> bytes: ...
"""

# Submodules whose optional dependencies (redis, starlette, httpx, prometheus_client,
# opentelemetry) load lazily, on first use.
from . import asgi, backends, backoff, breaker, chaos, errors, observability, testing
from ._budget import RetryBudget, RetryBudgetStatistics
from ._clock import SYSTEM_CLOCK, Clock, SystemClock
from ._deadline import Deadline, current_deadline, deadline, time_remaining
from ._events import (
    BackendFallback,
    BackendRecovered,
    CallAdmitted,
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
from ._policy import (
    Pipeline,
    PipelineOrderWarning,
    PipelineStatistics,
    Policy,
    PolicyBase,
    decorate,
)
from ._retry import Retry, RetryStatistics
from ._timeout import Timeout, TimeoutStatistics
from .breaker import BreakerStateChanged, BreakerStatistics, CircuitBreaker, CircuitState
from .bulkhead import Bulkhead, BulkheadLeaseLost, BulkheadStatistics, LeaseLost
from .chaos import FaultInjected, Faults, FaultStatistics
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
from .ratelimit import Decision, Rate, RateLimiter, RateLimiterStatistics

__all__ = [
    "BackendError",
    "BackendFallback",
    "BackendRecovered",
    "BreakerStateChanged",
    "BreakerStatistics",
    "Bulkhead",
    "BulkheadFull",
    "BulkheadLeaseLost",
    "BulkheadStatistics",
    "CallAdmitted",
    "CallRejected",
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitState",
    "Clock",
    "ConfigurationError",
    "Deadline",
    "Decision",
    "Event",
    "Fallback",
    "FallbackStatistics",
    "FallbackUsed",
    "FaultInjected",
    "FaultStatistics",
    "Faults",
    "InjectedFault",
    "LeaseLost",
    "Listener",
    "Pipeline",
    "PipelineOrderWarning",
    "PipelineStatistics",
    "Policy",
    "PolicyBase",
    "Rate",
    "RateLimited",
    "RateLimiter",
    "RateLimiterStatistics",
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
    "asgi",
    "backends",
    "backoff",
    "breaker",
    "chaos",
    "current_deadline",
    "deadline",
    "decorate",
    "errors",
    "observability",
    "remove_listener",
    "testing",
    "time_remaining",
]
