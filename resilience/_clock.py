"""Time, injected.

Every policy takes ``clock=``: an object with ``monotonic()``, ``sleep()`` and
``sleep_async()``. Policies never call :mod:`time` themselves, so tests drive them
with :class:`resilience.testing.FakeClock` and never wait for real.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Where a policy gets its time from.

    ``monotonic()`` returns seconds from an arbitrary origin that never goes back;
    ``sleep()`` blocks the calling thread, ``sleep_async()`` suspends the calling task.

    Example::

        class SlowClock:
            def monotonic(self) -> float: return time.monotonic() / 2
            def sleep(self, seconds: float) -> None: time.sleep(seconds * 2)
            async def sleep_async(self, seconds: float) -> None: await anyio.sleep(seconds * 2)

        rs.Retry(on=OSError, clock=SlowClock())
    """

    def monotonic(self) -> float:
        """Seconds since an arbitrary origin; never decreases."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def sleep_async(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` (asyncio or trio)."""
        ...


#: The longest single time.sleep() (seconds, about three years); longer sleeps loop.
_LONGEST_SLEEP = 1e8


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.sleep` and :func:`anyio.sleep`.

    Example::

        from resilience import SYSTEM_CLOCK
        start = SYSTEM_CLOCK.monotonic()
    """

    __slots__ = ()

    def monotonic(self) -> float:
        """Return :func:`time.monotonic`."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block the calling thread with :func:`time.sleep`."""
        while seconds > 0:  # in parts: the OS call refuses waits of centuries
            part = min(seconds, _LONGEST_SLEEP)
            time.sleep(part)
            seconds -= part

    async def sleep_async(self, seconds: float) -> None:
        """Suspend the calling task with :func:`anyio.sleep` (works on asyncio and trio)."""
        await anyio.sleep(max(seconds, 0.0))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
"""The process-wide system clock, the default of every policy's ``clock=``
(``clock=None`` means it too). Example: ``rs.SYSTEM_CLOCK.monotonic()``."""
