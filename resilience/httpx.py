"""Outbound HTTP: a resilient httpx transport with per-host policies, paced by the server.

Install the extra: ``pip install 'resilience[httpx]'``.

* :class:`ResilientTransport`: wraps any httpx transport (sync and async) with per-host
  bulkheads, rate limiters and circuit breakers, retries with jittered backoff and a
  retry budget, deadline propagation and opt-in hedging; it obeys ``Retry-After`` and
  the ``RateLimit`` / ``X-RateLimit-*`` fields of each host.
* :class:`HostPolicy`: other limits for some hosts (``hosts={"api.example.com": ...}``).
* :func:`host_key`: the default key (host, with a non-default port).
* :class:`TransportStatistics`, and the events :class:`HostPaused`,
  :class:`HedgeStarted` (plus the core :class:`~resilience.RetryScheduled` and
  :class:`~resilience.RetriesExhausted`).

Example::

    import httpx
    import resilience as rs
    from resilience.httpx import HostPolicy, ResilientTransport

    transport = ResilientTransport(
        bulkhead=4, limiter="10/s", breaker=True,
        hosts={"slow.example.com": HostPolicy(bulkhead=1)},
    )
    with httpx.Client(transport=transport) as client:
        response = client.get("https://example.com/")
"""

from __future__ import annotations

try:
    import httpx as _httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("resilience.httpx needs httpx: pip install 'resilience[httpx]'") from exc

from ._http._config import (
    IDEMPOTENT_METHODS,
    PRIORITY,
    RETRY_ON,
    RETRY_STATUSES,
    HostPolicy,
    TransportStatistics,
)
from ._http._events import HedgeStarted, HostPaused
from ._http._hosts import host_key
from ._http._transport import ResilientTransport

__all__ = [
    "IDEMPOTENT_METHODS",
    "PRIORITY",
    "RETRY_ON",
    "RETRY_STATUSES",
    "HedgeStarted",
    "HostPaused",
    "HostPolicy",
    "ResilientTransport",
    "TransportStatistics",
    "host_key",
]
