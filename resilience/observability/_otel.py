"""OpenTelemetry adapter: the resilience series as OTel metric instruments."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .._events import Event, add_listener, remove_listener
from ..errors import ConfigurationError
from ._require import require
from ._series import DEFAULT_BUCKETS, SERIES, Series, check_buckets, samples

__all__ = ["OpenTelemetryMetrics"]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("resilience")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "0"


class OpenTelemetryMetrics:
    """Export every policy's events as OpenTelemetry metrics (a listener).

    Instruments, on the meter ``"resilience"``: counters ``resilience.events``,
    ``resilience.decisions``, ``resilience.rejections``, ``resilience.fallbacks``,
    ``resilience.backend.recoveries``, ``resilience.state_changes``,
    ``resilience.retries``, ``resilience.timeouts``, and histograms
    ``resilience.call.duration`` and ``resilience.wait.duration`` (unit ``s``, with
    bucket boundaries advised for p50/p95/p99 from 0.5 ms to 60 s). Attributes are
    ``resilience.policy`` plus the series' small enumerations
    (``resilience.outcome``, ``resilience.mode``, ``resilience.state.from``/``.to``,
    ``resilience.event``).

    Uses ``meter_provider`` (default: the global one set by the OTel SDK). Needs
    ``pip install 'resilience[otel]'``.

    Example::

        from opentelemetry.sdk.metrics import MeterProvider
        metrics = OpenTelemetryMetrics(meter_provider=MeterProvider(...)).install()
    """

    def __init__(
        self, *, meter_provider: Any = None, buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> None:
        bounds = check_buckets(buckets)
        metrics_api = require("opentelemetry.metrics", "otel")
        if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
            raise ConfigurationError(
                f"meter_provider must be an OpenTelemetry MeterProvider, got {meter_provider!r}"
            )
        provider = metrics_api.get_meter_provider() if meter_provider is None else meter_provider
        self.meter: Any = provider.get_meter("resilience", _version())
        self._instruments: dict[Series, Any] = {}
        for series in SERIES:
            if series.kind == "counter":
                instrument = self.meter.create_counter(
                    series.name, unit=series.unit, description=series.description
                )
            else:
                instrument = self.meter.create_histogram(
                    series.name,
                    unit=series.unit,
                    description=series.description,
                    explicit_bucket_boundaries_advisory=list(bounds),
                )
            self._instruments[series] = instrument
        self._attributes: dict[tuple[Series, tuple[str, ...]], dict[str, str]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _attribute_name(label: str) -> str:
        if label == "from":
            return "resilience.state.from"
        if label == "to":
            return "resilience.state.to"
        return f"resilience.{label}"

    def __call__(self, event: Event) -> None:
        """Record ``event`` (this is what makes the adapter a listener)."""
        for series, value, labels in samples(event):
            attributes = self._attributes.get((series, labels))
            if attributes is None:
                attributes = {
                    self._attribute_name(name): value_
                    for name, value_ in zip(series.labels, labels, strict=True)
                }
                with self._lock:
                    self._attributes[(series, labels)] = attributes
            instrument = self._instruments[series]
            if series.kind == "counter":
                instrument.add(value, attributes)
            else:
                instrument.record(value, attributes)

    def install(self) -> OpenTelemetryMetrics:
        """Listen to the events of every policy (:func:`resilience.add_listener`).

        Example: ``metrics = OpenTelemetryMetrics().install()``
        """
        add_listener(self)
        return self

    def uninstall(self) -> None:
        """Stop listening."""
        remove_listener(self)
