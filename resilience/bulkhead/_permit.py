"""A held bulkhead slot: release it once, by hand or by leaving a ``with`` block."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._bulkhead import Bulkhead

__all__ = ["Permit"]


class Permit:
    """One slot of a :class:`~resilience.Bulkhead`, held until :meth:`release`.

    Returned by ``acquire_nowait()``, ``acquire()`` and ``await acquire_async()``.
    :meth:`release` is idempotent and thread-safe: the slot is given back exactly once,
    to the next waiter if anybody waits. A permit is also a context manager (``with``
    and ``async with``) that releases on exit, whatever the block raised.

    Permits of a distributed bulkhead hold a Redis lease that is renewed in the
    background; ``lost`` tells whether it was lost while held, :meth:`on_lost` registers
    a hook called when that happens, and release raises :class:`LeaseLost` (once).

    Example::

        permit = bulkhead.acquire(key="example.com", max_wait=2.0)
        try:
            download("https://example.com/a.mp4")
        finally:
            permit.release()

        async with await bulkhead.acquire_async(key="example.com"):
            await download_async(...)
    """

    __slots__ = ("_bulkhead", "_released", "_t0", "key")

    def __init__(self, bulkhead: Bulkhead, key: Hashable, t0: float | None = None) -> None:
        self._bulkhead = bulkhead
        #: The key whose slot this permit holds (``None`` for the unkeyed group).
        self.key = key
        self._t0 = t0
        self._released = False

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called. Example: ``assert not permit.released``"""
        return self._released

    @property
    def lost(self) -> bool:
        """Whether the slot was lost while held (only distributed leases can be lost).

        Example: ``if permit.lost: log.warning("ran without a lease")``
        """
        return False

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from a background thread) if the lease is lost while held.

        In-process slots cannot be lost, so this never calls it. Typical use: cancel
        the work (``permit.on_lost(scope.cancel)``) when exclusivity matters.

        Example: ``permit.on_lost(lambda: log.warning("lease lost"))``
        """

    def release(self) -> None:
        """Give the slot back (to the next waiter, if any); later calls do nothing.

        Example: ``permit.release()``
        """
        bulkhead = self._bulkhead
        lock = bulkhead._lock
        lock.acquire()
        try:
            if self._released:
                return
            self._released = True
            if self._t0 is None and not bulkhead._queues:
                # Uncontended: Slots.release inlined (see Bulkhead.__exit__).
                in_use = bulkhead._in_use
                key = self.key
                n = in_use[key] - 1
                if n:
                    in_use[key] = n
                else:
                    del in_use[key]
                    if not in_use:
                        in_use.clear()
                return
        finally:
            lock.release()
        bulkhead._give_back(self.key, self._t0)

    async def release_async(self) -> None:
        """:meth:`release` for async code (a distributed lease is released without blocking).

        Example: ``await permit.release_async()``
        """
        self.release()

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release_async()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Permit {self._bulkhead.name!r} key={self.key!r} {state}>"
