"""Observability adapters: the shared series, Prometheus, OpenTelemetry, logging, laziness."""

from __future__ import annotations

import contextlib
import logging
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import resilience as rs
from resilience.asgi import ShadowRejected
from resilience.observability import (
    CALL_DURATION,
    DECISIONS,
    DEFAULT_BUCKETS,
    FALLBACKS,
    REJECTIONS,
    STATE_CHANGES,
    WAIT_DURATION,
    LoggingListener,
    OpenTelemetryMetrics,
    PrometheusMetrics,
    histogram_quantile,
    samples,
)
from resilience.testing import FakeClock


@dataclass(frozen=True, slots=True, kw_only=True)
class Timed(rs.Event):
    """An event shaped like a future policy's: duration, wait and an allow bit."""

    allowed: bool
    duration: float
    waited: float
    outcome: str = "success"


def names(event: rs.Event) -> dict[str, tuple[float, tuple[str, ...]]]:
    return {series.name: (value, labels) for series, value, labels in samples(event)}


def test_samples_map_each_event_type() -> None:
    """Every event is counted; known types feed their series with bounded labels."""
    rejected = names(rs.CallRejected(policy="api", key="203.0.113.7", retry_after=1.0))
    assert rejected["resilience.events"] == (1.0, ("api", "CallRejected"))
    assert rejected[DECISIONS.name] == (1.0, ("api", "rejected"))
    assert rejected[REJECTIONS.name] == (1.0, ("api",))
    assert all("203.0.113.7" not in labels for _, labels in rejected.values()), "never the key"
    assert names(ShadowRejected(policy="api"))[DECISIONS.name] == (1.0, ("api", "shadow_rejected"))
    assert names(rs.StateChanged(policy="b", old="closed", new="open"))[STATE_CHANGES.name] == (
        1.0,
        ("b", "closed", "open"),
    )
    assert names(rs.BackendFallback(policy="l", mode="local"))[FALLBACKS.name] == (
        1.0,
        ("l", "local"),
    )
    assert names(rs.FallbackUsed(policy="f", exception=ValueError()))[FALLBACKS.name][1] == (
        "f",
        "fallback",
    )
    assert "resilience.backend.recoveries" in names(rs.BackendRecovered(policy="l"))
    assert names(rs.RetryScheduled(policy="r", attempt=1, delay=0.1))["resilience.retries"][1] == (
        "r",
        "scheduled",
    )
    assert names(rs.RetriesExhausted(policy="r", attempts=3, reason="attempts"))[
        "resilience.retries"
    ][1] == ("r", "exhausted")
    assert "resilience.timeouts" in names(rs.TimedOut(policy="t", seconds=1.0))
    timed = names(Timed(policy="p", allowed=True, duration=0.25, waited=0.5))
    assert timed[CALL_DURATION.name] == (0.25, ("p", "success"))
    assert timed[WAIT_DURATION.name] == (0.5, ("p",))
    assert timed[DECISIONS.name] == (1.0, ("p", "admitted"))


def test_histogram_quantile_interpolates() -> None:
    """Linear interpolation inside the bucket, like PromQL's histogram_quantile."""
    bounds = [0.1, 0.2, 0.5]
    assert histogram_quantile(0.5, bounds, [0, 10, 0, 0]) == pytest.approx(0.15)
    assert histogram_quantile(0.99, bounds, [50, 0, 50, 0]) == pytest.approx(0.494)
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 5]) == 0.5
    assert math.isnan(histogram_quantile(0.5, bounds, [0, 0, 0, 0]))
    with pytest.raises(ValueError):
        histogram_quantile(1.5, bounds, [0, 0, 0, 0])


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=200))
def test_quantiles_are_ordered_and_bracket_the_data(values: list[float]) -> None:
    """p50 <= p95 <= p99, and each lies in the bucket range of the observations."""
    counts = [0] * (len(DEFAULT_BUCKETS) + 1)
    for value in values:
        index = next((i for i, b in enumerate(DEFAULT_BUCKETS) if value <= b), len(DEFAULT_BUCKETS))
        counts[index] += 1
    p50, p95, p99 = (histogram_quantile(q, DEFAULT_BUCKETS, counts) for q in (0.5, 0.95, 0.99))
    assert p50 <= p95 <= p99 <= DEFAULT_BUCKETS[-1]
    true_p99 = sorted(values)[max(0, math.ceil(0.99 * len(values)) - 1)]
    bucket = next((i for i, b in enumerate(DEFAULT_BUCKETS) if true_p99 <= b), None)
    if bucket is not None:  # the estimate stays within the true value's bucket
        lower = DEFAULT_BUCKETS[bucket - 1] if bucket else 0.0
        assert lower <= p99 <= DEFAULT_BUCKETS[bucket]


@pytest.fixture
def prometheus() -> Iterator[PrometheusMetrics]:
    metrics = PrometheusMetrics().install()
    try:
        yield metrics
    finally:
        metrics.uninstall()


def feed(listener: Any) -> None:
    listener(rs.CallRejected(policy="api", key="k", retry_after=1.0))
    listener(rs.CallRejected(policy="api", key="k2", retry_after=1.0))
    listener(rs.StateChanged(policy="payments", old="closed", new="open"))
    listener(rs.BackendFallback(policy="api", mode="local"))
    for i in range(100):
        listener(Timed(policy="downloads", allowed=True, duration=0.001 * (i + 1), waited=0.0))


def test_prometheus_series_and_percentiles(prometheus: PrometheusMetrics) -> None:
    """Counters and histograms appear with their labels; p50/p95/p99 come from buckets."""
    feed(prometheus)
    text = prometheus.exposition().decode()
    assert 'resilience_decisions_total{outcome="rejected",policy="api"} 2.0' in text
    assert 'resilience_rejections_total{policy="api"} 2.0' in text
    assert 'resilience_state_changes_total{from="closed",policy="payments",to="open"} 1.0' in text
    assert 'resilience_fallbacks_total{mode="local",policy="api"} 1.0' in text
    assert (
        'resilience_call_duration_seconds_count{outcome="success",policy="downloads"} 100.0' in text
    )
    p = prometheus.percentiles("downloads")
    # True values: p50 = 0.050, p95 = 0.095, p99 = 0.099 (bucket resolution: 0.05-0.1).
    assert 0.025 <= p[0.5] <= 0.05
    assert 0.05 <= p[0.95] <= 0.1
    assert 0.05 <= p[0.99] <= 0.1
    assert all(math.isnan(v) for v in prometheus.percentiles("nobody").values())
    # An unknown histogram name is an error (it used to read the wait histogram).
    with pytest.raises(rs.ConfigurationError, match="histogram"):
        prometheus.percentiles("downloads", histogram="calls")


def test_prometheus_receives_global_events(prometheus: PrometheusMetrics) -> None:
    """Installed, it hears every policy through rs.add_listener."""
    from resilience._events import GLOBAL_LISTENERS, emit

    assert prometheus in GLOBAL_LISTENERS
    emit([], rs.TimedOut(policy="slow", seconds=1.0))
    assert 'resilience_timeouts_total{policy="slow"} 1.0' in prometheus.exposition().decode()
    prometheus.uninstall()
    assert prometheus not in GLOBAL_LISTENERS


@pytest.mark.anyio
async def test_prometheus_metrics_asgi_app(prometheus: PrometheusMetrics) -> None:
    """``asgi_app()`` serves the registry at /metrics."""
    feed(prometheus)
    transport = httpx.ASGITransport(app=prometheus.asgi_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert "resilience_rejections_total" in response.text


@pytest.mark.anyio
async def test_prometheus_asgi_app_is_a_route_at_exactly_metrics(
    prometheus: PrometheusMetrics,
) -> None:
    """As a Starlette route, ``asgi_app()`` answers /metrics itself (no redirect)."""
    from starlette.applications import Starlette

    feed(prometheus)
    app = Starlette()
    app.add_route("/metrics", prometheus.asgi_app())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert "resilience_rejections_total" in response.text


def test_installing_twice_counts_every_event_once() -> None:
    """install() twice (an app factory run twice) used to register the adapter twice,
    so every decision counted double; one uninstall() then left one copy listening."""
    metrics = PrometheusMetrics()
    metrics.install()
    metrics.install()
    try:
        rs.RateLimiter("100/s", name="twice").try_acquire("a")
        text = metrics.exposition().decode()
        assert 'resilience_decisions_total{outcome="admitted",policy="twice"} 1.0' in text
    finally:
        metrics.uninstall()
    assert metrics not in rs._events.GLOBAL_LISTENERS


def test_prometheus_namespace_and_shared_registry() -> None:
    """Two adapters on separate registries do not collide; namespace prefixes names."""
    a, b = PrometheusMetrics(), PrometheusMetrics(namespace="svc")
    b(rs.TimedOut(policy="x", seconds=1.0))
    assert "svc_resilience_timeouts_total" in b.exposition().decode()
    assert "svc_" not in a.exposition().decode()


@pytest.mark.parametrize("namespace", ["my-app", "9svc", "svc ", 5, None])
def test_a_namespace_prometheus_would_refuse_fails_as_a_configuration_error(
    namespace: object,
) -> None:
    """A namespace that cannot start a Prometheus metric name is refused by name, before
    any metric reaches the registry."""
    with pytest.raises(rs.ConfigurationError, match="namespace"):
        PrometheusMetrics(namespace=namespace)  # type: ignore[arg-type]


def test_opentelemetry_instruments() -> None:
    """Same series as OTel instruments with namespaced attributes and advised buckets."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    feed(metrics)
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, Any] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == "resilience"
            for metric in scope_metrics.metrics:
                found[metric.name] = metric
    decisions = found["resilience.decisions"].data.data_points
    assert sorted((tuple(sorted(p.attributes.items())), p.value) for p in decisions) == [
        ((("resilience.outcome", "admitted"), ("resilience.policy", "downloads")), 100),
        ((("resilience.outcome", "rejected"), ("resilience.policy", "api")), 2),
    ]
    changes = found["resilience.state_changes"].data.data_points[0]
    assert dict(changes.attributes) == {
        "resilience.policy": "payments",
        "resilience.state.from": "closed",
        "resilience.state.to": "open",
    }
    duration = found["resilience.call.duration"]
    assert duration.unit == "s"
    point = duration.data.data_points[0]
    assert list(point.explicit_bounds) == list(DEFAULT_BUCKETS)
    p99 = histogram_quantile(0.99, point.explicit_bounds, point.bucket_counts)
    assert 0.05 <= p99 <= 0.1


def test_logging_listener_levels(caplog: pytest.LogCaptureFixture) -> None:
    """State changes log at WARNING, rejections at DEBUG; the event rides on the record."""
    listener = LoggingListener()
    with caplog.at_level(logging.INFO, logger="resilience.events"):
        listener(rs.StateChanged(policy="payments", old="closed", new="open"))
        listener(rs.CallRejected(policy="api", key="k"))
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.WARNING
    assert "StateChanged policy=payments" in record.getMessage()
    assert "old='closed'" in record.getMessage()
    assert getattr(record, "resilience_event") == rs.StateChanged(
        policy="payments", old="closed", new="open"
    )
    with caplog.at_level(logging.DEBUG, logger="resilience.events"):
        listener(rs.CallRejected(policy="api", key="k"))
    assert caplog.records[-1].levelno == logging.DEBUG


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus_client / opentelemetry the error says which extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"resilience\[prometheus\]"):
        PrometheusMetrics()
    monkeypatch.setitem(sys.modules, "opentelemetry.metrics", None)
    with pytest.raises(ImportError, match=r"resilience\[otel\]"):
        OpenTelemetryMetrics()


def test_imports_are_lazy() -> None:
    """Importing resilience, resilience.asgi and resilience.observability loads no extra."""
    code = (
        "import sys, resilience, resilience.asgi, resilience.observability\n"
        "heavy = [m for m in ('prometheus_client', 'opentelemetry', 'starlette', 'httpx')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_registry_or_meter_provider_of_another_kind_is_refused() -> None:
    """registry="default" or meter_provider="x" failed with an AttributeError from
    inside the adapter; they are refused naming the argument."""
    from resilience.observability import OpenTelemetryMetrics, PrometheusMetrics

    with pytest.raises(rs.ConfigurationError, match="registry must be"):
        PrometheusMetrics(registry="default")
    with pytest.raises(rs.ConfigurationError, match="meter_provider must be"):
        OpenTelemetryMetrics(meter_provider="x")


@pytest.mark.parametrize("buckets", [[1, 0.5], [float("nan")], [float("inf")], [], "12", 5])
def test_bad_histogram_buckets_are_refused_by_both_adapters(buckets: Any) -> None:
    """Unsorted, non-finite or empty bounds: a ConfigurationError when the adapter is
    built (OpenTelemetry used to fail every histogram event inside the listener)."""
    from resilience.observability import OpenTelemetryMetrics, PrometheusMetrics

    with pytest.raises(rs.ConfigurationError, match="bucket"):
        PrometheusMetrics(buckets=buckets)
    with pytest.raises(rs.ConfigurationError, match="bucket"):
        OpenTelemetryMetrics(buckets=buckets)


def _series(metrics: PrometheusMetrics, policy: str) -> set[str]:
    return {
        line
        for line in metrics.exposition().decode().splitlines()
        if line.startswith(("resilience_decisions_total", "resilience_rejections_total"))
        and f'policy="{policy}"' in line
    }


def test_a_breaker_counts_its_admitted_calls_as_decisions(prometheus: PrometheusMetrics) -> None:
    """Every call a breaker lets through is an admitted decision (when its outcome is
    recorded), beside the rejected ones: admitted / (admitted + rejected) is its pass rate."""
    breaker = rs.CircuitBreaker(name="cb", clock=FakeClock())

    def work(fail: bool) -> None:
        if fail:
            raise OSError("down")

    for fail in [False] * 8 + [True] * 2:
        with contextlib.suppress(OSError):
            breaker.call(work, fail)
    breaker.open()
    with pytest.raises(rs.CircuitOpen):
        breaker.call(work, False)
    assert _series(prometheus, "cb") == {
        'resilience_decisions_total{outcome="admitted",policy="cb"} 10.0',
        'resilience_decisions_total{outcome="rejected",policy="cb"} 1.0',
        'resilience_rejections_total{policy="cb"} 1.0',
    }


@pytest.mark.anyio
async def test_a_request_costing_more_than_the_burst_is_a_counted_rejection(
    prometheus: PrometheusMetrics,
) -> None:
    """The 429 for a request whose own cost exceeds the burst reaches the metrics."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = rs.asgi.RateLimitMiddleware(
        app,
        limiter=rs.RateLimiter("5/s", burst=5, name="costly"),
        cost=lambda scope: 10 if scope["path"] == "/export" else 1,
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://t")
    async with client:
        statuses = [(await client.get(path)).status_code for path in ("/export", "/export", "/")]
    assert statuses == [429, 429, 200]
    assert _series(prometheus, "costly") == {
        'resilience_decisions_total{outcome="admitted",policy="costly"} 1.0',
        'resilience_decisions_total{outcome="rejected",policy="costly"} 2.0',
        'resilience_rejections_total{policy="costly"} 2.0',
    }


def test_requests_refused_for_a_paused_host_are_counted_rejections(
    prometheus: PrometheusMetrics,
) -> None:
    """A host that asked for 30 s of quiet: the transport's refusals reach the metrics."""
    from resilience.httpx import ResilientTransport

    transport = ResilientTransport(
        httpx.MockTransport(lambda request: httpx.Response(429, headers={"Retry-After": "30"})),
        attempts=1,
        max_wait=0.0,
        name="tp",
    )
    with httpx.Client(transport=transport, base_url="http://h.example") as client:
        assert client.get("/").status_code == 429
        for _ in range(2):
            with pytest.raises(rs.RateLimited):
                client.get("/")
    assert transport.statistics().rejected == 2
    assert _series(prometheus, "tp") == {
        'resilience_decisions_total{outcome="rejected",policy="tp"} 2.0',
        'resilience_rejections_total{policy="tp"} 2.0',
    }
