"""Sticky wake-up signals for distributed-bulkhead waiters, settable from any thread.

A waiter for a Redis lease sleeps until a release notification arrives (from the
pub/sub thread), the earliest lease expiry passes, or its own deadline. A notification
that arrives while the waiter is busy asking Redis must not be lost, so the signal is
sticky: ``set()`` leaves it set until the waiter ``clear()``\\ s it before its next try.

* :class:`ThreadSignal`: a :class:`threading.Event`.
* :class:`AsyncioSignal`: a flag plus a future of the waiter's loop, resolved through
  ``call_soon_threadsafe``.
* :class:`TrioSignal`: a flag plus a :class:`trio.Event` set through the run's token.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["AsyncioSignal", "ThreadSignal", "TrioSignal", "async_signal"]

_INF = float("inf")


class ThreadSignal:
    """A sticky signal a thread waits on."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Wake the waiter (now or at its next wait); safe from any thread."""
        self._event.set()

    def clear(self) -> None:
        """Forget earlier wake-ups (called by the waiter before it asks Redis)."""
        self._event.clear()

    def wait(self, timeout: float) -> None:
        """Block until set or ``timeout`` seconds passed."""
        if timeout > 0:
            self._event.wait(None if timeout >= threading.TIMEOUT_MAX else timeout)


class AsyncioSignal:
    """A sticky signal an asyncio task waits on."""

    __slots__ = ("_flag", "_future", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._flag = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        """Wake the waiter; safe from any thread (ignored once its loop is closed)."""
        try:
            self._loop.call_soon_threadsafe(self._set)
        except RuntimeError:
            pass

    def _set(self) -> None:
        self._flag = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def clear(self) -> None:
        """Forget earlier wake-ups."""
        self._flag = False

    async def wait(self, timeout: float) -> None:
        """Suspend until set or ``timeout`` seconds passed."""
        if self._flag or timeout <= 0:
            return
        self._future = future = self._loop.create_future()
        try:
            if timeout == _INF:
                await future
            else:
                async with asyncio.timeout(timeout):
                    await future
        except TimeoutError:
            pass
        finally:
            self._future = None


class TrioSignal:
    """A sticky signal a trio task waits on."""

    __slots__ = ("_event", "_flag", "_token")

    def __init__(self) -> None:
        import trio

        self._token = trio.lowlevel.current_trio_token()
        self._flag = False
        self._event: Any = None

    def set(self) -> None:
        """Wake the waiter; safe from any thread (ignored once its run is over)."""
        try:
            self._token.run_sync_soon(self._set)
        except Exception:
            pass

    def _set(self) -> None:
        self._flag = True
        if self._event is not None:
            self._event.set()

    def clear(self) -> None:
        """Forget earlier wake-ups."""
        self._flag = False

    async def wait(self, timeout: float) -> None:
        """Suspend until set or ``timeout`` seconds passed."""
        import trio

        if self._flag or timeout <= 0:
            return
        self._event = event = trio.Event()
        try:
            with trio.move_on_after(timeout):
                await event.wait()
        finally:
            self._event = None


def async_signal() -> AsyncioSignal | TrioSignal:
    """A signal for the running event loop (asyncio or trio)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return TrioSignal()
    return AsyncioSignal(loop)
