"""Prometheus adapter: the resilience series as prometheus_client metrics + /metrics."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._events import Event, add_listener, remove_listener
from ..errors import ConfigurationError
from ._require import require

if TYPE_CHECKING:
    from ..asgi import ASGIApp
from ._series import (
    CALL_DURATION,
    DEFAULT_BUCKETS,
    SERIES,
    WAIT_DURATION,
    Series,
    check_buckets,
    histogram_quantile,
    samples,
)

__all__ = ["PrometheusMetrics"]

#: Prometheus's metric-name syntax, which the namespace starts every name with.
_NAMESPACE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class PrometheusMetrics:
    """Export every policy's events as Prometheus metrics (a listener).

    Series (see :mod:`resilience.observability`): ``resilience_events_total``,
    ``resilience_decisions_total``, ``resilience_rejections_total``,
    ``resilience_fallbacks_total``, ``resilience_backend_recoveries_total``,
    ``resilience_state_changes_total``, ``resilience_retries_total``,
    ``resilience_timeouts_total`` and the histograms
    ``resilience_call_duration_seconds`` and ``resilience_wait_duration_seconds``
    (``histogram_quantile(0.99, ...)`` gives p99). The metrics live in ``registry``
    (default: a private ``CollectorRegistry``; pass ``prometheus_client.REGISTRY`` to
    share the global one). :meth:`asgi_app` serves them at ``/metrics``.

    Needs ``pip install 'resilience[prometheus]'``.

    Example::

        metrics = PrometheusMetrics().install()        # listens to every policy
        app.router.routes.append(Route("/metrics", metrics.asgi_app()))  # Starlette/FastAPI
    """

    def __init__(
        self,
        *,
        registry: Any = None,
        namespace: str = "",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        if not isinstance(namespace, str) or not (
            namespace == "" or _NAMESPACE.fullmatch(namespace)
        ):
            raise ConfigurationError(
                "namespace must be empty or a Prometheus metric-name prefix "
                f"([a-zA-Z_:][a-zA-Z0-9_:]*), got {namespace!r}"
            )
        client = require("prometheus_client", "prometheus")
        self._client = client
        if registry is not None and not callable(getattr(registry, "register", None)):
            raise ConfigurationError(
                f"registry must be a prometheus_client CollectorRegistry, got {registry!r}"
            )
        self.registry: Any = client.CollectorRegistry() if registry is None else registry
        self.buckets = check_buckets(buckets)
        prefix = f"{namespace}_" if namespace else ""
        self._metrics: dict[Series, Any] = {}
        for series in SERIES:
            name = prefix + series.prometheus_name
            if series.kind == "counter":
                metric = client.Counter(
                    name, series.description, list(series.labels), registry=self.registry
                )
            else:
                metric = client.Histogram(
                    name,
                    series.description,
                    list(series.labels),
                    registry=self.registry,
                    buckets=self.buckets,
                )
            self._metrics[series] = metric
        self._children: dict[tuple[Series, tuple[str, ...]], Any] = {}
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        """Record ``event`` (this is what makes the adapter a listener)."""
        for series, value, labels in samples(event):
            child = self._children.get((series, labels))
            if child is None:
                with self._lock:
                    child = self._metrics[series].labels(*labels)
                    self._children[(series, labels)] = child
            if series.kind == "counter":
                child.inc(value)
            else:
                child.observe(value)

    def install(self) -> PrometheusMetrics:
        """Listen to the events of every policy (:func:`resilience.add_listener`).

        Example: ``metrics = PrometheusMetrics().install()``
        """
        add_listener(self)
        return self

    def uninstall(self) -> None:
        """Stop listening (the metrics keep their values)."""
        remove_listener(self)

    def asgi_app(self) -> ASGIApp:
        """An ASGI app serving this registry in the Prometheus text format (``/metrics``).

        An object rather than a function, so that a router takes it for an ASGI app:
        ``Route("/metrics", metrics.asgi_app())`` serves exactly ``/metrics`` (a mount
        answers ``/metrics`` with a redirect to ``/metrics/``).

        Example: ``Starlette(routes=[Route("/metrics", metrics.asgi_app())])``
        """
        return _ExpositionApp(self._client.make_asgi_app(registry=self.registry))

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` returns)."""
        return bytes(self._client.generate_latest(self.registry))

    def percentiles(
        self,
        policy: str,
        *,
        histogram: str = "call",
        quantiles: Sequence[float] = (0.5, 0.95, 0.99),
    ) -> dict[float, float]:
        """Quantiles of a policy's ``"call"`` duration or ``"wait"`` histogram, from buckets.

        Summed over the other labels; ``nan`` when nothing was observed.

        Example::

            metrics.percentiles("downloads")   # {0.5: 0.012, 0.95: 0.19, 0.99: 0.41}
        """
        series = {"call": CALL_DURATION, "wait": WAIT_DURATION}.get(histogram)
        if series is None:
            raise ConfigurationError(f"histogram must be 'call' or 'wait', got {histogram!r}")
        metric = self._metrics[series]
        cumulative: dict[float, float] = {}
        for family in metric.collect():
            for sample in family.samples:
                if not sample.name.endswith("_bucket") or sample.labels.get("policy") != policy:
                    continue
                bound = float(sample.labels["le"])
                cumulative[bound] = cumulative.get(bound, 0.0) + sample.value
        if not cumulative:
            return {q: math.nan for q in quantiles}
        bounds = sorted(b for b in cumulative if not math.isinf(b))
        running = [cumulative[b] for b in bounds] + [cumulative.get(math.inf, 0.0)]
        counts = [running[0]] + [running[i] - running[i - 1] for i in range(1, len(running))]
        return {q: histogram_quantile(q, bounds, counts) for q in quantiles}


class _ExpositionApp:
    """prometheus_client's ASGI function as an object (see :meth:`PrometheusMetrics.asgi_app`)."""

    __slots__ = ("_app",)

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)
