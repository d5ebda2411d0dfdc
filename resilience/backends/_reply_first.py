"""Timeouts for a reply from Redis that let a reply already received win.

``asyncio.timeout`` measures wall-clock time on the event loop. When the loop is busy
past the deadline (a burst of requests parsing at once, a hundred callers' coroutines),
a reply that Redis sent in a fraction of a millisecond can sit unread in the socket
while the deadline passes: the next pass of the loop sees both the readable socket
and the due timer, and the timer cancels the call before the reply is read. The call
then counts as a Redis failure although Redis answered in time.

:func:`wait_until` is ``asyncio.timeout_at`` around one await with that case taken
out. An asyncio pass runs the callbacks of the sockets it found readable before the
due timers, so by the time the deadline's timer runs, a reply that had arrived has
already resolved what the call waits for, and the call is due to resume: the timer
then lets the loop make one more pass, in which the call returns first. A call that
is not about to resume (no reply) is cancelled at once, as by ``asyncio.timeout_at``.
:func:`fail_at` does the same for a future another call resolves (a connection
handed over by a caller whose reply came in), waiting one pass in any case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["fail_at", "wait_until"]

T = TypeVar("T")

#: Passes of the loop a timer waits past its deadline for a call about to resume (see
#: the module docstring): one is enough on asyncio and, as tested, on uvloop.
_PASSES = 1


class _Expiry:
    """The timer of :func:`wait_until`: at the deadline it cancels the task, unless what
    the task waits for is done (a reply came in, the task resumes next): it then looks
    again after a pass of the loop (at most :data:`_PASSES` times)."""

    __slots__ = ("fired", "handle", "left", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], when: float):
        self.loop = loop
        self.task = task
        self.left = _PASSES
        self.fired = False
        self.handle: asyncio.Handle = loop.call_at(when, self)

    def __call__(self) -> None:
        # The future the task is suspended on (asyncio's Task, C or Python, and so
        # uvloop's): done means the task's next step is queued.
        waiting_on = getattr(self.task, "_fut_waiter", None)
        if self.left > 0 and waiting_on is not None and waiting_on.done():
            self.left -= 1
            self.handle = self.loop.call_soon(self)
        else:
            self.fired = True
            self.task.cancel()


async def wait_until(awaitable: Awaitable[T], when: float) -> T:
    """``await awaitable`` bounded by ``when`` (loop time), letting a reply that arrived
    by then be read though the loop was busy (see the module); :class:`TimeoutError`
    past it. A cancellation from elsewhere stays a cancellation, as with
    ``asyncio.timeout_at`` (told apart by ``Task.uncancel``); one timer handle and no
    scope object, as this runs for every command."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    assert task is not None
    cancelling = task.cancelling()
    expiry = _Expiry(loop, task, when)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expiry.fired:
            expiry.fired = False  # (uncancelled here: not again below)
            if task.uncancel() <= cancelling:
                raise TimeoutError("Redis did not answer in time") from None
        raise
    finally:
        expiry.handle.cancel()
        if expiry.fired:  # cancelled, but the call ended anyway: take our request back
            task.uncancel()


def fail_at(
    loop: asyncio.AbstractEventLoop, when: float, waiter: asyncio.Future[object]
) -> asyncio.TimerHandle:
    """Fail ``waiter`` with :class:`TimeoutError` at ``when`` (loop time), unless it is
    resolved by then or by what the loop had already received (see the module): for a
    wait on a future that a call reading a reply resolves. Cancelling the handle before
    ``when`` stops it; after, a resolved waiter is left as it is."""
    return loop.call_at(when, _fail, loop, waiter, _PASSES)


def _fail(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[object], left: int) -> None:
    if waiter.done():
        return
    if left > 0:
        loop.call_soon(_fail, loop, waiter, left - 1)
    else:
        waiter.set_exception(TimeoutError("no Redis connection within the handshake budget"))
