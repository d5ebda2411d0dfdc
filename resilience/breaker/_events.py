"""Events specific to circuit breakers (on top of :mod:`resilience._events`)."""

from __future__ import annotations

from dataclasses import dataclass

from .._events import Event, StateChanged

__all__ = ["BreakerStateChanged", "OutcomeRecorded"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerStateChanged(StateChanged):
    """A breaker moved from ``old`` to ``new`` (a :class:`~resilience.StateChanged`).

    ``reason`` says why: ``"failure_rate"``, ``"slow_call_rate"``,
    ``"consecutive_failures"``, ``"cool_down"`` (OPEN to HALF_OPEN), ``"probes_failed"``,
    ``"probes_succeeded"``, ``"half_open_timeout"``, ``"manual"``, ``"remote"`` (another
    process, through shared state) or ``"fleet_probe"`` (another process won the
    half-open probe). ``open_for`` is the cool-down when ``new`` is ``"open"``.
    ``old`` and ``new`` are :class:`~resilience.CircuitState` members (a ``StrEnum``,
    so ``event.new == "open"`` and ``event.new is CircuitState.OPEN`` both hold); from
    :class:`~resilience.breaker.PyBreakerPolicy` they are pybreaker's state names.

    Example::

        @breaker.add_listener
        def page(event):
            if isinstance(event, BreakerStateChanged) and event.new == "open":
                alert(f"{event.policy}[{event.key}] opened: {event.reason}")
    """

    reason: str = ""
    open_for: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeRecorded(Event):
    """A breaker recorded the outcome of a call.

    ``outcome`` is ``"success"``, ``"failure"`` or ``"ignored"``; ``slow`` tells whether
    the call was slower than ``slow_call``; ``duration`` is the call's duration in
    seconds on the breaker's clock. Emitted for every call while anyone listens (a
    metrics adapter gets its call-duration histogram from it); nobody listening, the
    breaker builds no event and times no call it does not need to (``duration`` is
    then ``None`` for a call that started before the first listener came).

    Example::

        breaker.add_listener(
            lambda e: isinstance(e, OutcomeRecorded) and print(e.outcome, e.exception)
        )
    """

    outcome: str
    slow: bool = False
    duration: float | None = None
    exception: BaseException | None = None
