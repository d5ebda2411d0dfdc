"""The metric series every adapter exports, and the pure mapping from events to samples.

One table, two exporters: the OpenTelemetry and Prometheus adapters both turn each
event into the same ``(series, value, labels)`` samples through :func:`samples`, so
dashboards built on either agree. Labels are bounded: a policy's *name* and small
enumerations (outcome, mode, state); never the key (a client IP, a domain), which
would explode cardinality.

Events feed the series by type, and by shape for events added later: any event with
a float ``duration`` feeds the call-duration histogram, any with a float ``waited``
the wait-time histogram, any with a bool ``allowed`` the decision counter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .._events import (
    BackendFallback,
    BackendRecovered,
    CallRejected,
    Event,
    FallbackUsed,
    RetriesExhausted,
    RetryBudgetExhausted,
    RetryScheduled,
    StateChanged,
    TimedOut,
)
from ..breaker._events import OutcomeRecorded
from ..errors import ConfigurationError

__all__ = [
    "CALL_DURATION",
    "DECISIONS",
    "DEFAULT_BUCKETS",
    "EVENTS",
    "FALLBACKS",
    "RECOVERIES",
    "REJECTIONS",
    "RETRIES",
    "SERIES",
    "STATE_CHANGES",
    "TIMEOUTS",
    "WAIT_DURATION",
    "Sample",
    "Series",
    "histogram_quantile",
    "samples",
]

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Histogram bucket upper bounds in seconds: fine enough for p50/p95/p99 from 0.5 ms to 60
s."""


@dataclass(frozen=True, slots=True)
class Series:
    """One exported metric: OTel name (dotted), Prometheus name, kind, unit, labels.

    Example::

        >>> DECISIONS.prometheus_name
        'resilience_decisions'
    """

    name: str
    prometheus_name: str
    kind: str  # "counter" | "histogram"
    unit: str
    description: str
    labels: tuple[str, ...]


EVENTS = Series(
    "resilience.events",
    "resilience_events",
    "counter",
    "{event}",
    "Events emitted by resilience policies, by event type.",
    ("policy", "event"),
)
"""The ``resilience.events`` counter (Prometheus ``resilience_events``): events emitted by
resilience policies, by event type."""
DECISIONS = Series(
    "resilience.decisions",
    "resilience_decisions",
    "counter",
    "{decision}",
    "Admission decisions of limiters, bulkheads and breakers, by outcome.",
    ("policy", "outcome"),
)
"""The ``resilience.decisions`` counter (Prometheus ``resilience_decisions``): admission
decisions of limiters, bulkheads and breakers, by outcome."""
REJECTIONS = Series(
    "resilience.rejections",
    "resilience_rejections",
    "counter",
    "{call}",
    "Calls refused before they started (rate limited, bulkhead full, circuit open).",
    ("policy",),
)
"""The ``resilience.rejections`` counter (Prometheus ``resilience_rejections``): calls
refused before they started (rate limited, bulkhead full, circuit open)."""
FALLBACKS = Series(
    "resilience.fallbacks",
    "resilience_fallbacks",
    "counter",
    "{fallback}",
    "Fallbacks: backend failures handled by on_backend_error, and fallback results.",
    ("policy", "mode"),
)
"""The ``resilience.fallbacks`` counter (Prometheus ``resilience_fallbacks``): fallbacks:
backend failures handled by on_backend_error, and fallback results."""
RECOVERIES = Series(
    "resilience.backend.recoveries",
    "resilience_backend_recoveries",
    "counter",
    "{recovery}",
    "Shared backends answering again after a failure.",
    ("policy",),
)
"""The ``resilience.backend.recoveries`` counter (Prometheus
``resilience_backend_recoveries``): shared backends answering again after a failure."""
STATE_CHANGES = Series(
    "resilience.state_changes",
    "resilience_state_changes",
    "counter",
    "{transition}",
    "State transitions of stateful policies (circuit breakers).",
    ("policy", "from", "to"),
)
"""The ``resilience.state_changes`` counter (Prometheus ``resilience_state_changes``): state
transitions of stateful policies (circuit breakers)."""
RETRIES = Series(
    "resilience.retries",
    "resilience_retries",
    "counter",
    "{retry}",
    "Retries scheduled, and retry loops that gave up.",
    ("policy", "outcome"),
)
"""The ``resilience.retries`` counter (Prometheus ``resilience_retries``): retries
scheduled, and retry loops that gave up."""
TIMEOUTS = Series(
    "resilience.timeouts",
    "resilience_timeouts",
    "counter",
    "{timeout}",
    "Calls and requests cut off by a timeout.",
    ("policy",),
)
"""The ``resilience.timeouts`` counter (Prometheus ``resilience_timeouts``): calls and
requests cut off by a timeout."""
CALL_DURATION = Series(
    "resilience.call.duration",
    "resilience_call_duration_seconds",
    "histogram",
    "s",
    "Duration of calls observed by a policy.",
    ("policy", "outcome"),
)
"""The ``resilience.call.duration`` histogram (Prometheus
``resilience_call_duration_seconds``): duration of calls observed by a policy."""
WAIT_DURATION = Series(
    "resilience.wait.duration",
    "resilience_wait_duration_seconds",
    "histogram",
    "s",
    "Time spent waiting for admission (limiter tokens, bulkhead slots).",
    ("policy",),
)
"""The ``resilience.wait.duration`` histogram (Prometheus
``resilience_wait_duration_seconds``): time spent waiting for admission (limiter tokens,
bulkhead slots)."""

SERIES: tuple[Series, ...] = (
    EVENTS,
    DECISIONS,
    REJECTIONS,
    FALLBACKS,
    RECOVERIES,
    STATE_CHANGES,
    RETRIES,
    TIMEOUTS,
    CALL_DURATION,
    WAIT_DURATION,
)
"""Every series, in export order."""

Sample = tuple[Series, float, tuple[str, ...]]
"""``(series, value, label values in series.labels order)``"""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def samples(event: Event) -> list[Sample]:
    """The metric samples one event contributes (pure; no exporter involved).

    Example::

        >>> [s.name for s, _, _ in samples(rs.CallRejected(policy="api"))]
        ['resilience.events', 'resilience.decisions', 'resilience.rejections']
    """
    policy = event.policy
    out: list[Sample] = [(EVENTS, 1.0, (policy, type(event).__name__))]
    if isinstance(event, CallRejected):
        out.append((DECISIONS, 1.0, (policy, "rejected")))
        out.append((REJECTIONS, 1.0, (policy,)))
    elif isinstance(event, OutcomeRecorded):
        # A breaker's admitted call, counted when its outcome is recorded (every call
        # is, while anyone listens): the breaker's decisions have both outcomes.
        out.append((DECISIONS, 1.0, (policy, "admitted")))
    elif type(event).__name__ == "ShadowRejected":
        out.append((DECISIONS, 1.0, (policy, "shadow_rejected")))
    elif isinstance(event, BackendFallback):
        out.append((FALLBACKS, 1.0, (policy, str(event.mode))))
    elif isinstance(event, FallbackUsed):
        out.append((FALLBACKS, 1.0, (policy, "fallback")))
    elif isinstance(event, BackendRecovered):
        out.append((RECOVERIES, 1.0, (policy,)))
    elif isinstance(event, StateChanged):
        out.append((STATE_CHANGES, 1.0, (policy, str(event.old), str(event.new))))
    elif isinstance(event, RetryScheduled):
        out.append((RETRIES, 1.0, (policy, "scheduled")))
    elif isinstance(event, RetriesExhausted):
        out.append((RETRIES, 1.0, (policy, "exhausted")))
    elif isinstance(event, RetryBudgetExhausted):
        out.append((RETRIES, 1.0, (policy, "budget_exhausted")))
    elif isinstance(event, TimedOut):
        out.append((TIMEOUTS, 1.0, (policy,)))
    else:
        allowed = getattr(event, "allowed", None)
        if isinstance(allowed, bool):
            out.append((DECISIONS, 1.0, (policy, "admitted" if allowed else "rejected")))
    duration = _number(getattr(event, "duration", None))
    if duration is not None:
        outcome = getattr(event, "outcome", None)
        out.append((CALL_DURATION, duration, (policy, str(outcome) if outcome else "")))
    waited = _number(getattr(event, "waited", None))
    if waited is not None:
        out.append((WAIT_DURATION, waited, (policy,)))
    return out


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """The ``q`` quantile (0..1) of a bucketed histogram, interpolated like PromQL.

    ``bounds`` are the bucket upper bounds (ascending, without +Inf) and ``counts``
    the per-bucket counts (not cumulative; ``len(bounds) + 1`` values, the last one
    for +Inf), the layout of an OpenTelemetry histogram point. Returns ``nan`` for an
    empty histogram; observations above the last bound report that bound.

    Example::

        >>> round(histogram_quantile(0.5, [0.1, 0.2], [0, 10, 0]), 6)
        0.15
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    if len(counts) != len(bounds) + 1:
        raise ValueError("counts needs one value per bound plus one for +Inf")
    total = float(sum(counts))
    if total <= 0:
        return math.nan
    rank = q * total
    cumulative = 0.0
    for index, count in enumerate(counts):
        if count and cumulative + count >= rank:
            if index == len(bounds):
                return float(bounds[-1]) if bounds else math.nan
            lower = 0.0 if index == 0 else float(bounds[index - 1])
            upper = float(bounds[index])
            return lower + (upper - lower) * ((rank - cumulative) / count)
        cumulative += count
    return float(bounds[-1]) if bounds else math.nan


def check_buckets(buckets: object) -> tuple[float, ...]:
    """Histogram bucket bounds: finite, strictly increasing, at least one.

    Refused at construction: a bad bound would otherwise fail every histogram event
    inside the metrics library (OpenTelemetry) or with its own plain ``ValueError``.

    Example: ``check_buckets((0.005, 0.01, 0.1))``
    """
    from .._validate import check_number

    if isinstance(buckets, str | bytes) or not isinstance(buckets, Sequence) or not buckets:
        raise ConfigurationError(f"buckets must be a non-empty list of seconds, got {buckets!r}")
    bounds = tuple(check_number("bucket bound", b) for b in buckets)
    if any(later <= earlier for earlier, later in itertools.pairwise(bounds)):
        raise ConfigurationError(f"buckets must be strictly increasing, got {buckets!r}")
    return bounds
