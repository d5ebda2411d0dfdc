"""The pure core of the in-process bulkhead: per-key slot counts and waiter queues.

:class:`Slots` is bookkeeping only: it never blocks, sleeps, reads a clock or wakes
anybody. Each method takes the lock for O(1) or O(log n) work and returns a decision;
the shells (:mod:`._bulkhead`) do the waiting and call :meth:`Waiter.wake` on the
waiter a method returned, outside the lock.

Layout, chosen so that the uncontended path touches one dict entry:

* ``in_use``: key -> number of slots held. A key whose count drops to zero is deleted,
  so a million distinct keys leave nothing behind.
* ``queues``: key -> :class:`_Queue` of waiters, present only while somebody waits.
  Invariant: a key has live waiters only while all of its slots are held (a released
  slot is handed straight to the first waiter, never returned to the pool while anyone
  waits), so ``in_use[key] < limit`` alone proves that nobody waits for ``key``.

Waiters are served in ``(priority, arrival)`` order: lower priority numbers first,
FIFO within a priority. A waiter that gives up is marked and left in the heap (lazy
deletion); the heap is compacted when dead entries outnumber live ones, so churn of
timed-out waiters cannot grow it without bound.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable
from typing import Final

__all__ = ["DONE", "GRANTED", "TIMED_OUT", "WAITING", "Slots", "Waiter"]

#: Waiter states.
WAITING: Final = 0
GRANTED: Final = 1
TIMED_OUT: Final = 2
DONE: Final = 3

# How much a new hold-time sample weighs in the moving average behind retry_after.
_EWMA_WEIGHT: Final = 0.2
# Hold times are sampled only after contention (a wait or a rejection): this many.
_SAMPLES: Final = 16
# Per-key rejection counters kept for statistics(key) (oldest dropped first).
_REJECTED_KEYS: Final = 1024


class Waiter:
    """One caller waiting for a slot of ``key``; subclasses know how to wake it.

    ``state`` moves from ``WAITING`` to exactly one of ``GRANTED`` (a slot was handed
    to it), ``TIMED_OUT`` (its virtual-clock timer fired) or ``DONE`` (it gave up).
    All transitions happen under the :class:`Slots` lock.
    """

    __slots__ = ("key", "state")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.state: int = WAITING

    def wake(self) -> None:
        """Make the waiting thread or task return from its wait (any thread may call it).

        Raises if the waiter can never run again (its event loop is closed); the caller
        then hands the slot on with :meth:`Slots.abandon`.
        """


class _Queue:
    """The waiters of one key: a heap of ``(priority, seq, waiter)`` plus a live count."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, Waiter]] = []
        self.live = 0


class Slots:
    """Per-key concurrency accounting with prioritised FIFO hand-off.

    Example::

        slots = Slots(2)
        assert slots.try_acquire("a") == 1          # new count, 0 would mean refused
        waiter = Waiter("a")
        ...
        to_wake = slots.release("a")                 # a waiter to wake, or None
    """

    __slots__ = (
        "_hold",
        "_rejected_keys",
        "_seq",
        "in_use",
        "limit",
        "lock",
        "queues",
        "rejected",
        "sampling",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.in_use: dict[Hashable, int] = {}
        self.queues: dict[Hashable, _Queue] = {}
        self._seq = itertools.count()
        self._hold: float | None = None
        #: How many more hold times the shells should sample (set by contention).
        self.sampling = 0
        #: Rejections so far (refused at once or timed out while waiting).
        self.rejected = 0
        self._rejected_keys: dict[Hashable, int] = {}

    # ------------------------------------------------------------------ admitted path

    def try_acquire(self, key: Hashable) -> int:
        """Take a slot of ``key`` if one is free and nobody waits for one: the new
        count, or 0."""
        with self.lock:
            n = self.in_use.get(key, 0)
            # Waiters while a slot is free: a twin's slots taken back (see retract)
            # until fill() hands them out; nobody barges past them meanwhile.
            if n < self.limit and not (self.queues and key in self.queues):
                self.in_use[key] = n + 1
                return n + 1
        return 0

    def occupy(self, key: Hashable) -> None:
        """Count a slot of ``key`` taken elsewhere, even past the limit.

        A distributed bulkhead's local twin counts the Redis leases of its process this
        way, so that while Redis fails the process's total stays within ``local_limit``.
        A release while the count is above the limit only lowers it.
        """
        with self.lock:
            self.in_use[key] = self.in_use.get(key, 0) + 1

    def admit_next(self, key: Hashable) -> Waiter | None:
        """Hand a slot of ``key`` to its first waiter even past the limit; returns it.

        A distributed bulkhead's twin lets its waiters go this way, one at a time, once
        Redis answers again: each then asks Redis for its lease, within the fleet's
        limit (the twin's count, inflated by the leases granted since, would keep them).
        """
        with self.lock:
            queue = self.queues.get(key)
            if queue is None:
                return None
            self.in_use[key] = self.in_use.get(key, 0) + 1
            return self._hand_off(key, queue)

    def retract(self, key: Hashable) -> None:
        """Take back a slot of ``key`` without handing it to a waiter (a distributed
        bulkhead's twin, for a waiter let go to ask Redis instead).

        Waiters may then queue while a slot is free: newcomers queue behind them, and
        :meth:`fill` hands the free slots out when the twin is used again.
        """
        with self.lock:
            self._count_down(key)

    def fill(self, key: Hashable) -> list[Waiter]:
        """Hand the free slots of ``key`` to its first waiters; returns them (to wake)."""
        granted: list[Waiter] = []
        with self.lock:
            queue = self.queues.get(key)
            while queue is not None and self.in_use.get(key, 0) < self.limit:
                self.in_use[key] = self.in_use.get(key, 0) + 1
                waiter = self._hand_off(key, queue)
                if waiter is None:  # pragma: no cover - live counts are right
                    break
                granted.append(waiter)
                queue = self.queues.get(key)
        return granted

    def over_limit(self, key: Hashable) -> bool:
        """Whether more slots of ``key`` are counted than the limit allows."""
        with self.lock:
            return self.in_use.get(key, 0) > self.limit

    def release(self, key: Hashable) -> Waiter | None:
        """Give back a slot of ``key``; returns the waiter it was handed to (to wake)."""
        with self.lock:
            if self.queues:
                queue = self.queues.get(key)
                if queue is not None and self.in_use[key] <= self.limit:
                    return self._hand_off(key, queue)
            self._count_down(key)
        return None

    # ------------------------------------------------------------------ waiting path

    def enqueue(self, waiter: Waiter, priority: int) -> bool:
        """Queue ``waiter``; returns True (and takes the slot) if a slot was free after all."""
        key = waiter.key
        with self.lock:
            n = self.in_use.get(key, 0)
            if n < self.limit and key not in self.queues:  # (see try_acquire)
                self.in_use[key] = n + 1
                waiter.state = GRANTED
                return True
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = _Queue()
            heapq.heappush(queue.heap, (priority, next(self._seq), waiter))
            queue.live += 1
            self.sampling = _SAMPLES
            return False

    def withdraw(self, waiter: Waiter) -> Waiter | None:
        """``waiter`` gives up (timeout, cancellation, error).

        A waiter still queued leaves the queue. A waiter that was already handed a slot
        passes that slot on: the returned waiter (if any) must be woken.
        """
        with self.lock:
            state = waiter.state
            waiter.state = DONE
            if state == WAITING:
                self._forget(waiter)
            elif state == GRANTED:
                return self._release_locked(waiter.key)
        return None

    def expire(self, waiter: Waiter) -> bool:
        """A virtual-clock timer fired: True if ``waiter`` was still waiting (wake it)."""
        with self.lock:
            if waiter.state != WAITING:
                return False
            waiter.state = TIMED_OUT
            self._forget(waiter)
            return True

    def abandon(self, waiter: Waiter) -> Waiter | None:
        """``waiter`` can never run (its loop closed): pass its slot on, if it got one."""
        return self.withdraw(waiter)

    # ------------------------------------------------------------------ estimates

    def record_hold(self, seconds: float) -> None:
        """Feed one observed hold time (of a call that filled the last slot)."""
        with self.lock:
            hold = self._hold
            self._hold = seconds if hold is None else hold + _EWMA_WEIGHT * (seconds - hold)
            if self.sampling:
                self.sampling -= 1

    def retry_after(self, key: Hashable, waiting: int | None = None) -> float | None:
        """Estimated seconds until a slot of ``key`` is free for a newcomer, or None.

        ``waiting``: the waiters ahead, when they queue elsewhere (a distributed
        bulkhead's own queues); by default this table's queue of ``key``.
        """
        hold = self._hold
        if hold is None:
            return None
        if waiting is None:
            queue = self.queues.get(key)
            waiting = 0 if queue is None else queue.live
        return hold * (waiting + 1) / self.limit

    def reject(self, key: Hashable) -> None:
        """Count one rejection of ``key`` (and start sampling hold times)."""
        with self.lock:
            self.rejected += 1
            self.sampling = _SAMPLES
            per_key = self._rejected_keys
            per_key[key] = per_key.pop(key, 0) + 1
            if len(per_key) > _REJECTED_KEYS:
                del per_key[next(iter(per_key))]

    def rejected_for(self, key: Hashable) -> int:
        """Rejections of ``key`` (0 once the key fell out of the recent-keys window)."""
        return self._rejected_keys.get(key, 0)

    # ------------------------------------------------------------------ introspection

    def counts(self, key: Hashable) -> tuple[int, int]:
        """``(in_use, waiting)`` for ``key``."""
        with self.lock:
            queue = self.queues.get(key)
            return self.in_use.get(key, 0), 0 if queue is None else queue.live

    def totals(self) -> tuple[int, int, int]:
        """``(in_use, waiting, keys)`` over every key."""
        with self.lock:
            return (
                sum(self.in_use.values()),
                sum(q.live for q in self.queues.values()),
                len(self.in_use),
            )

    # ------------------------------------------------------------------ internals

    def _release_locked(self, key: Hashable) -> Waiter | None:
        queue = self.queues.get(key)
        if queue is not None and self.in_use[key] <= self.limit:
            return self._hand_off(key, queue)
        self._count_down(key)
        return None

    def _count_down(self, key: Hashable) -> None:
        """One slot of ``key`` fewer in use (under the lock)."""
        in_use = self.in_use
        n = in_use[key] - 1
        if n:
            in_use[key] = n
        else:
            del in_use[key]
            if not in_use:
                in_use.clear()  # give a grown table back to the allocator

    def _hand_off(self, key: Hashable, queue: _Queue) -> Waiter | None:
        # The slot goes straight to the first live waiter: the count does not change.
        heap = queue.heap
        while heap:
            waiter = heapq.heappop(heap)[2]
            if waiter.state == WAITING:
                waiter.state = GRANTED
                queue.live -= 1
                if not queue.live:
                    del self.queues[key]
                return waiter
        # Only dead entries were left (cannot happen while live counts are right).
        del self.queues[key]  # pragma: no cover
        return self._release_locked(key)  # pragma: no cover

    def _forget(self, waiter: Waiter) -> None:
        key = waiter.key
        queue = self.queues[key]
        queue.live -= 1
        if not queue.live:
            del self.queues[key]
        elif len(queue.heap) > 2 * queue.live + 8:
            queue.heap = [entry for entry in queue.heap if entry[2].state == WAITING]
            heapq.heapify(queue.heap)
