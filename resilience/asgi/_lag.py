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
import weakref

__all__ = ["LoopLags"]

#: Bounds of the probe's period (seconds): often enough to see a stall within a fraction
#: of the bound, seldom enough to cost nothing (a timer callback, a few times a second).
_MIN_PERIOD = 0.005
_MAX_PERIOD = 0.1
#: Ticks without a request after which the probe stops: a request in flight that waits
#: (on a database, say) and then holds the loop is still measured; an idle server is
#: woken for about a second at most.
_IDLE_TICKS = 20


class _Probe:
    """The lag of one event loop, from a timer that runs every ``period``.

    The lag is how late the last tick ran after it was due or, if the next tick is
    overdue now (the loop is busy this moment), how overdue it is: a request served
    right after a stall sees it before the tick does. The timer stops when
    :data:`_IDLE_TICKS` ticks in a row ran on time with no request (an idle server is
    not woken), and starts again at the next request, which cannot see a stall from
    before it started. It holds no reference to its loop (the loop's timer holds the
    probe), so a closed loop is not kept alive by it.
    """

    __slots__ = ("_asked", "_bound", "_due", "_period", "_quiet", "lag", "running")

    def __init__(self, bound: float) -> None:
        self._bound = bound
        self._period = min(max(bound / 2, _MIN_PERIOD), _MAX_PERIOD)
        #: How late the last tick ran (seconds).
        self.lag = 0.0
        self.running = False
        self._asked = False
        self._quiet = 0  # ticks in a row without a request
        self._due = 0.0

    def current(self, loop: asyncio.AbstractEventLoop) -> float:
        """The lag of ``loop`` now (seconds, ``>= 0``)."""
        self._asked = True
        now = loop.time()
        if not self.running:  # idle until now: start measuring
            self._arm(loop, now)
            return 0.0
        overdue = now - self._due
        return overdue if overdue > self.lag else self.lag

    def _arm(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        self.running = True
        self._due = now + self._period
        loop.call_at(self._due, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self.lag = max(0.0, now - self._due)
        self._quiet = 0 if self._asked else self._quiet + 1
        self._asked = False
        # A late tick keeps measuring whoever asked: the stall it saw may have held back
        # requests that are about to be served.
        if self._quiet < _IDLE_TICKS or self.lag > self._bound:
            self._arm(loop, now)
        else:  # on time, and nobody asked for a while: stop until someone does
            self.running = False
            self._quiet = 0
            self.lag = 0.0


class LoopLags:
    """One lag probe per event loop the middleware serves requests on."""

    __slots__ = ("_bound", "_last", "_probes")

    def __init__(self, bound: float) -> None:
        self._bound = bound
        self._probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Probe] = (
            weakref.WeakKeyDictionary()
        )
        # The last loop and its probe, weakly: the usual server has one loop.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Probe] | None = None

    def lagging(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether ``loop`` runs what is due more than the bound late now."""
        last = self._last
        probe: _Probe | None
        if last is not None and last[0]() is loop:
            probe = last[1]
        else:
            probe = self._probes.get(loop)
            if probe is None:
                probe = self._probes[loop] = _Probe(self._bound)
            self._last = (weakref.ref(loop), probe)
        return probe.current(loop) > self._bound
