"""A clock that only moves when told to, for tests that never wait for real."""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio.lowlevel

from .._validate import check_number

__all__ = ["FakeClock", "TimerHandle"]


def _finite(method: str, value: object) -> float:
    """``value`` as a float, if a finite real number: NaN would freeze virtual time
    silently, infinity would end it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{method}() needs a finite number of seconds, got {value!r}")
    return float(value)


@dataclass(order=True)
class TimerHandle:
    """A callback registered with :meth:`FakeClock.call_at`; ``cancel()`` removes it.

    Example::

        handle = clock.call_at(5.0, lambda: print("five"))
        handle.cancel()
    """

    when: float
    seq: int
    callback: Callable[[], object] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        """Do not run the callback."""
        self.cancelled = True


class FakeClock:
    """Virtual time: ``monotonic()`` moves only through ``advance()`` and sleeps.

    Sleeps advance the clock at once, both ``sleep()`` (threads) and ``await
    sleep_async()`` (asyncio and trio tasks, which still yield to the event loop once),
    so a test of a 30-second cool-down runs in microseconds. ``call_at()`` registers
    timers fired by ``advance()``; :class:`resilience.Timeout` uses them to cut async
    calls at a virtual deadline.

    Example::

        clock = FakeClock()
        breaker = rs.CircuitBreaker(open_for=30, clock=clock)
        ...
        clock.advance(30)        # the breaker is now half-open
        assert clock.monotonic() == 30.0
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(check_number("start", start, minimum=float("-inf")))
        self._lock = threading.RLock()
        self._timers: list[TimerHandle] = []
        self._seq = itertools.count()
        #: Every duration passed to ``sleep``/``sleep_async``, in order (for assertions).
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def time(self) -> float:
        """Alias of :meth:`monotonic`."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing due timers in order.

        Example: ``clock.advance(1.5)``
        """
        seconds = _finite("advance", seconds)
        if seconds < 0:
            raise ValueError(f"time never goes back: advance({seconds!r})")
        with self._lock:
            self._run_to(self._now + seconds)

    def set(self, now: float) -> None:
        """Jump to absolute time ``now`` (which must not be in the past), firing due timers.

        Afterwards ``monotonic() == now`` exactly (no rounding from adding differences).
        """
        now = _finite("set", now)
        with self._lock:
            if now < self._now:
                raise ValueError(f"time never goes back: set({now!r}) at {self._now!r}")
            self._run_to(float(now))

    def _run_to(self, target: float) -> None:
        while self._timers and self._timers[0].when <= target:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback()
        self._now = max(self._now, target)

    def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` at once and return."""
        seconds = max(_finite("sleep", seconds), 0.0)
        self.sleeps.append(seconds)
        self.advance(seconds)

    async def sleep_async(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` at once, then yield to the event loop once.

        A sleep cut short ends where a real one would: when a timer fired on the way
        (a :class:`resilience.Timeout`'s deadline) cancels the sleeping task, the clock
        stops at that timer's time and the cancellation is raised there.
        """
        seconds = max(_finite("sleep_async", seconds), 0.0)
        self.sleeps.append(seconds)
        target = self._now + seconds
        while True:
            with self._lock:
                timers = self._timers
                if not timers or timers[0].when > target:
                    self._run_to(target)
                    break
                self._run_to(timers[0].when)
            await anyio.lowlevel.checkpoint_if_cancelled()
        await anyio.lowlevel.checkpoint()

    def call_at(self, when: float, callback: Callable[[], object]) -> TimerHandle:
        """Run ``callback()`` when virtual time reaches ``when``; returns a cancellable handle.

        Example: ``handle = clock.call_at(clock.monotonic() + 5, scope.cancel)``
        """
        when = _finite("call_at", when)
        with self._lock:
            handle = TimerHandle(when, next(self._seq), callback)
            heapq.heappush(self._timers, handle)
            return handle

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"
