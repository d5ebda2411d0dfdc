"""Events of :class:`resilience.httpx.ResilientTransport` (``key`` is the host)."""

from __future__ import annotations

from dataclasses import dataclass

from .._events import Event

__all__ = ["HedgeStarted", "HostPaused"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPaused(Event):
    """A server told the transport to slow down: no request goes to ``key`` for ``seconds``.

    ``reason`` is ``"retry-after"`` (a ``Retry-After`` field) or ``"quota"`` (an
    advertised rate-limit quota ran out until its reset).

    Example::

        transport.add_listener(
            lambda e: isinstance(e, HostPaused) and log.info("%s paused %.1fs", e.key, e.seconds)
        )
    """

    seconds: float
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgeStarted(Event):
    """A request to ``key`` was still unanswered after ``delay`` s: a second copy was sent.

    Example::

        transport.add_listener(
            lambda e: isinstance(e, HedgeStarted) and metrics.inc("hedges", host=e.key)
        )
    """

    delay: float
