"""Fault injection: prove that your code degrades instead of failing.

Everything here is **off by default** and turns on only where you say so::

    with resilience.chaos.enabled():      # this block (ContextVar: thread/task scoped)
        ...
    RESILIENCE_CHAOS=1 python -m myapp     # the whole process (read at import)

The injectors:

* :class:`resilience.Faults` (also ``chaos.Faults``): a policy that injects latency,
  exceptions, replaced results and hangs into calls; put it innermost in a
  :class:`~resilience.Pipeline`, inside the real policies.
* :class:`FaultyTransport`: an httpx transport (sync and async) that injects, per host,
  latency, error statuses with ``Retry-After``, connection errors, timeouts and
  truncated bodies into outgoing requests (needs ``resilience[httpx]``).
* :class:`FaultMiddleware`: pure ASGI middleware that delays or aborts incoming requests
  by rate or by request header, like Envoy's fault filter; it refuses to start unless
  explicitly enabled.
* :class:`resilience.testing.FaultProxy`: a TCP proxy that slows, throttles, blackholes,
  resets or refuses connections to Redis or any TCP service.

What to inject is described by fault objects (:class:`Latency`, :class:`Error`,
:class:`Result`, :class:`Hang`, and for HTTP :class:`Status`, :class:`ConnectFailure`,
:class:`RequestTimeout`, :class:`Truncate`), each firing by ``rate``, ``schedule``
(:class:`Window`) and ``when`` predicate, from a seeded RNG so a failing run replays.

Example::

    import resilience as rs
    from resilience import chaos

    faults = rs.Faults(chaos.Error(ConnectionError, rate=0.3), seed=1)
    lookup = rs.Pipeline(rs.Fallback(None, on=ConnectionError), faults)(real_lookup)

    with chaos.enabled():
        results = [lookup(k) for k in keys]     # ~30% None, the same 30% on every run
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._chaos._asgi import FaultMiddleware
from ._chaos._faults import Faults
from ._chaos._shell import FaultInjected, FaultStatistics
from ._chaos._specs import (
    ConnectFailure,
    Distribution,
    Error,
    Fault,
    Hang,
    Latency,
    RequestTimeout,
    Result,
    Status,
    Truncate,
    Window,
    exponential,
    lognormal,
    uniform,
)
from ._chaos._switch import ENV_VAR, disabled, enabled, is_enabled

if TYPE_CHECKING:
    from ._chaos._httpx import FaultyTransport

__all__ = [
    "ENV_VAR",
    "ConnectFailure",
    "Distribution",
    "Error",
    "Fault",
    "FaultInjected",
    "FaultMiddleware",
    "FaultStatistics",
    "Faults",
    "FaultyTransport",
    "Hang",
    "Latency",
    "RequestTimeout",
    "Result",
    "Status",
    "Truncate",
    "Window",
    "disabled",
    "enabled",
    "exponential",
    "is_enabled",
    "lognormal",
    "uniform",
]


if not TYPE_CHECKING:  # checkers see FaultyTransport's import above, and no catch-all

    def __getattr__(name: str) -> Any:
        # httpx is optional: import the transport only when it is asked for.
        if name == "FaultyTransport":
            from ._chaos._httpx import FaultyTransport

            return FaultyTransport
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
