"""Observability: logging, OpenTelemetry and Prometheus adapters fed by policy events.

Each adapter is an event listener: ``adapter.install()`` (or
``rs.add_listener(adapter)``) makes it receive the events of every policy and
middleware; ``policy.add_listener(adapter)`` limits it to one. Both metric adapters
export the same series (see :data:`SERIES`), computed by the pure :func:`samples`:

=================================  =========  ===================================
series (OTel / Prometheus)          kind       labels
=================================  =========  ===================================
resilience.events                   counter    policy, event (type name)
resilience.decisions                counter    policy, outcome
resilience.rejections               counter    policy
resilience.fallbacks                counter    policy, mode
resilience.backend.recoveries       counter    policy
resilience.state_changes            counter    policy, from, to
resilience.retries                  counter    policy, outcome
resilience.timeouts                 counter    policy
resilience.call.duration            histogram  policy, outcome (seconds)
resilience.wait.duration            histogram  policy (seconds)
=================================  =========  ===================================

Neither ``opentelemetry`` nor ``prometheus_client`` is imported until an adapter is
built; a missing one raises ImportError naming the extra to install.

Example::

    from resilience.observability import LoggingListener, PrometheusMetrics

    LoggingListener().install()
    metrics = PrometheusMetrics().install()
    app.router.routes.append(Route("/metrics", metrics.asgi_app()))  # Starlette/FastAPI
"""

from ._logging import DEFAULT_LEVELS, TRANSITIONS, LoggingListener
from ._otel import OpenTelemetryMetrics
from ._prometheus import PrometheusMetrics
from ._series import (
    CALL_DURATION,
    DECISIONS,
    DEFAULT_BUCKETS,
    EVENTS,
    FALLBACKS,
    RECOVERIES,
    REJECTIONS,
    RETRIES,
    SERIES,
    STATE_CHANGES,
    TIMEOUTS,
    WAIT_DURATION,
    Sample,
    Series,
    histogram_quantile,
    samples,
)

__all__ = [
    "CALL_DURATION",
    "DECISIONS",
    "DEFAULT_BUCKETS",
    "DEFAULT_LEVELS",
    "EVENTS",
    "FALLBACKS",
    "RECOVERIES",
    "REJECTIONS",
    "RETRIES",
    "SERIES",
    "STATE_CHANGES",
    "TIMEOUTS",
    "TRANSITIONS",
    "WAIT_DURATION",
    "LoggingListener",
    "OpenTelemetryMetrics",
    "PrometheusMetrics",
    "Sample",
    "Series",
    "histogram_quantile",
    "samples",
]
