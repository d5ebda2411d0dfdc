"""How a waiting thread or task sleeps, and how any thread wakes it.

One bulkhead serves worker threads, asyncio tasks and trio tasks at once, so a slot
released in one world may have to wake a waiter in another:

* :class:`ThreadWaiter` blocks on a pre-acquired :class:`threading.Lock`;
  ``wake()`` releases it.
* :class:`AsyncioWaiter` awaits a future of its loop; ``wake()`` resolves it directly
  from the loop's own thread and through ``loop.call_soon_threadsafe`` from others.
* :class:`TrioWaiter` awaits a :class:`trio.Event`; ``wake()`` sets it directly from the
  trio thread and through the run's ``TrioToken`` from others.

``wait(timeout)`` returns when woken or after ``timeout`` real seconds (``None``: no
limit, used when a virtual clock's timer expires the waiter); cancellation of the
waiting task propagates.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable

from ._slots import Waiter

__all__ = ["AsyncioWaiter", "ThreadWaiter", "TrioWaiter", "async_waiter"]

_get_ident = threading.get_ident
_INF = float("inf")


class ThreadWaiter(Waiter):
    """A thread blocked until a slot is handed to it."""

    __slots__ = ("_parked",)

    def __init__(self, key: Hashable) -> None:
        super().__init__(key)
        self._parked = threading.Lock()
        self._parked.acquire()

    def wake(self) -> None:
        """Unblock the waiting thread."""
        self._parked.release()

    def wait(self, timeout: float | None) -> None:
        """Block until woken or ``timeout`` seconds passed."""
        if timeout is None or timeout >= threading.TIMEOUT_MAX:  # the OS call overflows
            self._parked.acquire()
        else:
            self._parked.acquire(timeout=max(timeout, 0.0))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncioWaiter(Waiter):
    """An asyncio task suspended until a slot is handed to it."""

    __slots__ = ("_future", "_loop", "_thread")

    def __init__(self, key: Hashable, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(key)
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()
        self._thread = _get_ident()

    def wake(self) -> None:
        """Resume the task (raises RuntimeError if its loop is closed)."""
        if _get_ident() == self._thread:
            _resolve(self._future)
        else:
            self._loop.call_soon_threadsafe(_resolve, self._future)

    async def wait(self, timeout: float | None) -> None:
        """Suspend until woken or ``timeout`` seconds passed."""
        if timeout is None or timeout == _INF:
            await self._future
            return
        try:
            async with asyncio.timeout(timeout):
                await self._future
        except TimeoutError:
            return


class TrioWaiter(Waiter):
    """A trio task suspended until a slot is handed to it."""

    __slots__ = ("_event", "_thread", "_token")

    def __init__(self, key: Hashable) -> None:
        import trio

        super().__init__(key)
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = _get_ident()

    def wake(self) -> None:
        """Resume the task (raises trio.RunFinishedError if its run is over)."""
        if _get_ident() == self._thread:
            self._event.set()
        else:
            self._token.run_sync_soon(self._event.set)

    async def wait(self, timeout: float | None) -> None:
        """Suspend until woken or ``timeout`` seconds passed."""
        import trio

        if timeout is None or timeout == _INF:
            await self._event.wait()
            return
        with trio.move_on_after(timeout):
            await self._event.wait()


def async_waiter(key: Hashable) -> AsyncioWaiter | TrioWaiter:
    """A waiter for the running event loop (asyncio or trio)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return TrioWaiter(key)
    return AsyncioWaiter(key, loop)
