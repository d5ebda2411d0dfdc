"""Events of the ASGI middlewares (on top of the policies' own events).

They are built only when somebody listens (a middleware's ``add_listener`` or the global
:func:`resilience.add_listener`), so an unobserved middleware pays one truth test.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._events import Event

__all__ = ["RequestAdmitted", "RequestCompleted", "ShadowRejected"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShadowRejected(Event):
    """A shadow-mode middleware would have refused this request (it let it through).

    ``policy`` is the limiter's name (like its own ``CallRejected`` events), ``key``
    the hashed key.

    Example::

        middleware.add_listener(
            lambda e: isinstance(e, ShadowRejected) and print("would refuse", e.key)
        )
    """

    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAdmitted(Event):
    """A middleware admitted a request (``allowed`` is always true).

    ``policy`` is the name of the limiter or bulkhead that decided, so that admissions
    line up with the ``CallRejected`` events of that policy.
    ``waited`` is the time the request queued for a concurrency slot
    (:class:`ConcurrencyLimitMiddleware`; ``None`` for rate limits, which never queue).
    Feeds ``resilience.decisions{outcome="admitted"}`` and the wait-time histogram.

    Example::

        middleware.add_listener(
            lambda e: isinstance(e, RequestAdmitted) and print(e.policy, e.waited)
        )
    """

    allowed: bool = True
    waited: float | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCompleted(Event):
    """A request that held a concurrency slot finished, after ``duration`` seconds.

    ``outcome`` is ``"completed"``, ``"error"`` (the app raised) or ``"cancelled"``
    (a timeout, or the client left before the response was complete, even when the
    app then returned normally). Feeds the call-duration histogram.

    Example::

        middleware.add_listener(
            lambda e: isinstance(e, RequestCompleted) and print(e.duration, e.outcome)
        )
    """

    duration: float
    outcome: str
