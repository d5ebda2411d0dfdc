"""How late an event loop runs what is due: the signal of shedding by loop lag.

A cap on requests in flight bounds the work a server has taken on, not how long that
work takes: on a slower machine, or when each request costs more CPU than it used to,
requests within the cap still queue behind each other on the one event loop, and every
response is late. The loop's lag (how late a timer runs after it was due) measures that
directly, as Envoy's overload manager measures resource pressure: when it is above a
bound, new requests are refused at once (a cheap 503) rather than added to the backlog.
"""

from __future__ import annotations

import asyncio

__all__ = ["LoopLag"]

#: Bounds of the probe's period (seconds): often enough to see a stall within a fraction
#: of the bound, seldom enough to cost nothing (a timer callback, a few times a second).
_MIN_PERIOD = 0.005
_MAX_PERIOD = 0.1


class LoopLag:
    """The lag of one asyncio event loop, from a timer that runs every ``period``.

    The lag is how late the last tick ran after it was due or, if the next tick is
    overdue now (the loop is busy this moment), how overdue it is: a request served
    right after a stall sees it before the tick does. The timer stops when no request
    asked for the lag during a whole period (an idle server is not woken), and starts
    again at the next question.
    """

    __slots__ = ("_asked", "_due", "_handle", "_loop", "_period", "lag")

    def __init__(self, loop: asyncio.AbstractEventLoop, bound: float) -> None:
        self._loop = loop
        self._period = min(max(bound / 2, _MIN_PERIOD), _MAX_PERIOD)
        #: How late the last tick ran (seconds).
        self.lag = 0.0
        self._asked = False
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def current(self) -> float:
        """The lag now (seconds, ``>= 0``)."""
        self._asked = True
        if self._handle is None:  # idle until now: start measuring
            self._arm(self._loop.time())
            return 0.0
        overdue = self._loop.time() - self._due
        return overdue if overdue > self.lag else self.lag

    def _arm(self, now: float) -> None:
        self._due = now + self._period
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self.lag = max(0.0, now - self._due)
        if self._asked:
            self._asked = False
            self._arm(now)
        else:  # nobody asked for a whole period: stop until someone does
            self._handle = None
            self.lag = 0.0
