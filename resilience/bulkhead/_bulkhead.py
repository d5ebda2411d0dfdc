"""The Bulkhead policy: per-key concurrency limits for threads and tasks alike.

The shells here do the waiting; :class:`~._slots.Slots` does the bookkeeping. The
admitted path is one lock round trip to take a slot and one to give it back; nothing
is allocated for ``with bulkhead:`` and the decorator. Only a caller that must wait
builds a waiter (thread, asyncio or trio flavour) and parks on it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from types import FunctionType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from .. import _deadline
from .._blocks import pop_innermost
from .._clock import SYSTEM_CLOCK, Clock
from .._events import GLOBAL_LISTENERS, CallRejected
from .._policy import GENERATOR_FLAGS, PolicyBase, refuse_async, refuse_generator_async
from .._validate import (
    check_choice,
    check_clock,
    check_int,
    check_key_function,
    check_number,
)
from ..errors import BulkheadFull
from ._permit import Permit
from ._slots import GRANTED, Slots, Waiter
from ._waiters import ThreadWaiter, async_waiter

if TYPE_CHECKING:
    from ..backends._failover import FailureMode
    from ..backends._memory import MemoryBackend
    from ..backends._redis import RedisBackend
    from ._distributed import Distributed

__all__ = ["Bulkhead", "BulkheadStatistics"]

T = TypeVar("T")
P = ParamSpec("P")

#: Priority of calls that name none: lower numbers are served first.
DEFAULT_PRIORITY = 0

_MIN_INT = -(2**63)
_MAX_INT = 2**63 - 1

# ``with bulkhead:`` on a distributed bulkhead keeps its permits here, per task/thread.
_HELD: ContextVar[tuple[Permit, ...]] = ContextVar("resilience_bulkhead_held", default=())
# Hold-time samples of ``with bulkhead:`` blocks (bulkhead, start), innermost last: the
# block's exit finds its own start here (only while sampling, after contention).
# Each entry names the task or thread whose block it is: a task started inside a sampled
# block inherits the entry with its context, and must not take it for its own.
_SAMPLED: ContextVar[tuple[tuple[Bulkhead, float | None, object], ...]] = ContextVar(
    "resilience_bulkhead_sampled", default=()
)


def _runner() -> object:
    """The asyncio or trio task running now, else the thread."""
    try:
        task: object = asyncio.current_task()
    except RuntimeError:  # no asyncio loop in this thread
        task = None
    if task is None and (trio := sys.modules.get("trio")) is not None:
        try:
            task = trio.lowlevel.current_task()
        except RuntimeError:  # not in trio either
            task = None
    return threading.get_ident() if task is None else task


@dataclass(frozen=True, slots=True)
class BulkheadStatistics:
    """A snapshot of a :class:`Bulkhead`, for the whole bulkhead or one key.

    ``in_flight`` and ``waiting`` count this process; ``rejected`` counts calls refused
    (at once or after waiting) since construction. For a distributed bulkhead,
    ``backend`` holds the failover counters and, per key, ``shared_in_flight`` the
    number of live leases in Redis (all processes).

    Example::

        stats = bulkhead.statistics(key="example.com")
        print(stats.in_flight, stats.waiting, stats.rejected)
    """

    max_concurrent: int
    in_flight: int
    waiting: int
    rejected: int
    keys: int
    key: Hashable | None = None
    shared_in_flight: int | None = None
    backend: dict[str, Any] | None = None


class Bulkhead(PolicyBase):
    """Limit how many calls run at once, per key, in this process or across processes.

    A call takes one of ``max_concurrent`` slots of its key for as long as it runs.
    When all slots are held it waits up to ``max_wait`` seconds (clamped to the ambient
    deadline) for one, then raises :class:`~resilience.BulkheadFull`. Waiters are served
    by ``priority`` (lower numbers first: 0 interactive, 10 batch), FIFO within a
    priority; a released slot is handed straight to the next waiter, so nobody barges.

    One instance is safe to share between worker threads and asyncio or trio tasks at
    the same time. Per-key state exists only while a key has holders or waiters, so a
    million distinct keys leave nothing behind.

    Arguments:
        max_concurrent: slots per key (>= 1).
        key: ``key(*args, **kwargs) -> hashable`` computing the key of a decorated call
            (e.g. the URL's host); ``None``: one shared group.
        max_wait: default seconds to wait for a slot (0: reject at once; ``math.inf``:
            wait as long as the ambient deadline allows).
        priority: default priority, an ``int`` or ``priority(*args, **kwargs) -> int``
            for decorated calls. Direct ``acquire()`` calls take ``priority=``.
        backend: ``None`` (in process) or a
            :class:`~resilience.backends.RedisBackend`: slots become Redis leases shared
            by every process using the same bulkhead ``name`` (see ``lease``).
        lease: seconds a Redis lease lives without renewal; holders renew it every
            ``lease / 3`` in the background, and a crashed holder's slot frees at most
            ``lease`` seconds after its last renewal.
        on_backend_error: while Redis fails: ``"local"`` (an in-process bulkhead of
            ``local_limit`` slots per key), ``"open"`` (admit) or ``"closed"`` (raise
            :class:`~resilience.BackendError`). Redis is probed again after 50 ms,
            doubling up to 1 s, and used again as soon as it answers.
        local_limit: slots per key this process may use on its own in ``"local"`` mode
            (default ``max_concurrent``); ``max_concurrent // processes`` keeps the
            global limit while Redis is down.
        on_lease_lost: ``"raise"`` (release raises :class:`LeaseLost`) or ``"event"``
            (only the :class:`BulkheadLeaseLost` event).
        clock: time source (tests pass a FakeClock: its timers expire waiters).
        name: the policy's name; for a distributed bulkhead also its identity in Redis.

    Example::

        per_domain = rs.Bulkhead(4, key=lambda url: urlsplit(url).hostname, max_wait=10.0)

        @per_domain
        async def download(url: str) -> bytes: ...

        with per_domain.acquire(key="example.com"):     # direct use
            ...
    """

    __slots__ = (
        "_clock",
        "_default_priority",
        "_in_use",
        "_key",
        "_limit",
        "_lock",
        "_now",
        "_priority",
        "_queues",
        "_remote",
        "_samples_out",
        "_slots",
        "_timers",
        "max_concurrent",
        "max_wait",
    )

    raises_rejected = True
    rejection = BulkheadFull

    def __init__(
        self,
        max_concurrent: int,
        *,
        key: Callable[..., Hashable] | None = None,
        max_wait: float = 0.0,
        backend: MemoryBackend | RedisBackend | None = None,
        lease: float = 30.0,
        priority: int | Callable[..., int] | None = None,
        on_backend_error: FailureMode = "local",
        local_limit: int | None = None,
        on_lease_lost: Literal["raise", "event"] = "raise",
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.max_concurrent: int = check_int("max_concurrent", max_concurrent, minimum=1)
        self._limit = self.max_concurrent
        self._key = check_key_function("key", key)
        self.max_wait: float = check_number("max_wait", max_wait, allow_inf=True)
        lease = check_number("lease", lease, minimum=0.0, strict=True)
        check_choice("on_lease_lost", on_lease_lost, ("raise", "event"))
        local_limit = check_int(
            "local_limit", local_limit, minimum=1, maximum=self.max_concurrent, allow_none=True
        )
        if priority is None or callable(priority):
            self._priority: Callable[..., int] | None = check_key_function(
                "priority", priority, gives="the priority"
            )
            self._default_priority = DEFAULT_PRIORITY
        else:
            self._priority = None
            self._default_priority = _check_priority("priority", priority)
        self._clock: Clock = check_clock("clock", clock)
        self._now = self._clock.monotonic
        # Clocks with timers (FakeClock) expire waiters in virtual time.
        self._timers = hasattr(self._clock, "call_at") and self._clock is not SYSTEM_CLOCK
        self._slots = Slots(self.max_concurrent)
        self._samples_out = 0  # _SAMPLED entries of this bulkhead not yet exited
        self._lock = self._slots.lock
        self._in_use = self._slots.in_use
        self._queues = self._slots.queues
        self._remote: Distributed | None = None
        if backend is not None and not _is_memory(backend):
            from ._distributed import Distributed

            self._remote = Distributed(
                self,
                backend,
                lease=lease,
                on_backend_error=on_backend_error,
                local_limit=self.max_concurrent if local_limit is None else local_limit,
                on_lease_lost=on_lease_lost,
                named=name is not None,
            )
        else:
            from ..backends._failover import MODES

            check_choice("on_backend_error", on_backend_error, MODES)

    # ------------------------------------------------------------------ direct use

    def acquire_nowait(self, key: Hashable = None) -> Permit:
        """Take a slot of ``key`` now or raise :class:`~resilience.BulkheadFull`.

        Example::

            try:
                permit = bulkhead.acquire_nowait(key="example.com")
            except rs.BulkheadFull:
                return "busy"
            with permit:
                ...
        """
        if self._remote is None:
            permit = self._try_quietly(key)
            if permit is None:
                raise self._rejected(key)
            return permit
        permit = self._remote.acquire(key, self._default_priority, 0.0)
        if self._listeners or GLOBAL_LISTENERS:
            self._report_held(key, 0.0, permit.release)
        return permit

    def _take_quietly(self, key: Hashable) -> Permit | None:
        """A free slot of ``key`` now, or ``None``: no event, no rejection counted (the
        first step of every in-process acquisition)."""
        n = self._slots.try_acquire(key)
        return Permit(self, key, self._sample_start(n)) if n else None

    def _try_quietly(self, key: Hashable) -> Permit | None:
        """A slot of ``key`` if one is free now, else ``None`` without counting a
        rejection (for optional work that is just not done, like a hedge); an admission
        is reported as usual. A distributed bulkhead asks Redis, where a refusal counts."""
        if self._remote is not None:
            try:
                return self.acquire_nowait(key)
            except BulkheadFull:
                return None
        permit = self._take_quietly(key)
        if permit is not None and (self._listeners or GLOBAL_LISTENERS):
            self._report_held(key, 0.0, permit.release)
        return permit

    def acquire(
        self, key: Hashable = None, *, priority: int | None = None, max_wait: float | None = None
    ) -> Permit:
        """Take a slot of ``key``, blocking the thread up to ``max_wait`` seconds.

        ``max_wait`` defaults to the bulkhead's and is clamped to the ambient deadline;
        ``priority`` defaults to the bulkhead's (lower numbers are served first).

        Example::

            with bulkhead.acquire(key="example.com", max_wait=5.0):
                download()
        """
        if not (self._listeners or GLOBAL_LISTENERS):
            return self._acquire_quietly(key, priority, max_wait)
        started = self._now()
        permit = self._acquire_quietly(key, priority, max_wait)
        self._report_held(key, self._now() - started, permit.release)
        return permit

    def _acquire_quietly(
        self, key: Hashable, priority: int | None, max_wait: float | None
    ) -> Permit:
        """:meth:`acquire` without the admission event."""
        priority = self._direct_priority(priority)
        wait = self.max_wait if max_wait is None else _check_wait(max_wait)
        if self._remote is not None:
            return self._remote.acquire(key, priority, wait)
        permit = self._take_quietly(key)
        if permit is None:
            self._wait(key, priority, wait)
            permit = Permit(self, key, self._sample_start(self._limit))
        return permit

    async def acquire_async(
        self, key: Hashable = None, *, priority: int | None = None, max_wait: float | None = None
    ) -> Permit:
        """Take a slot of ``key``, suspending the task up to ``max_wait`` seconds.

        Works on asyncio and trio. Cancelling the waiting task never leaks a slot.

        Example::

            async with await bulkhead.acquire_async(key="example.com", priority=0):
                await download()
        """
        if not (self._listeners or GLOBAL_LISTENERS):
            return await self._acquire_quietly_async(key, priority, max_wait)
        started = self._now()
        permit = await self._acquire_quietly_async(key, priority, max_wait)
        self._report_held(key, self._now() - started, permit.release)
        return permit

    async def _acquire_quietly_async(
        self,
        key: Hashable,
        priority: int | None,
        max_wait: float | None,
        may_wait: Callable[[], bool] | None = None,
    ) -> Permit:
        """:meth:`acquire_async` without the admission event (the ASGI middleware
        reports its own, once per request).

        ``may_wait`` is asked once, when no slot is free and the caller is about to
        queue (not while a Redis round trip is still deciding); ``False`` refuses the
        call as a full bulkhead would (counted, ``CallRejected``).
        """
        priority = self._direct_priority(priority)
        wait = self.max_wait if max_wait is None else _check_wait(max_wait)
        if self._remote is not None:
            return await self._remote.acquire_async(key, priority, wait, may_wait)
        permit = self._take_quietly(key)
        if permit is None:
            await self._wait_async(key, priority, wait, may_wait)
            permit = Permit(self, key, self._sample_start(self._limit))
        return permit

    # ------------------------------------------------------------------ policy

    # ``with bulkhead`` / ``async with bulkhead`` (below call/call_async) inline
    # Slots.try_acquire / Slots.release (uncontended branch only): one lock round trip
    # each way, no call layers, no allocation. Any other case (full, waiters present,
    # distributed) goes through the Slots methods. Explicit acquire()/try/finally/
    # release() costs half of ``with lock:`` on 3.11.

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` holding a slot of its key (waits up to ``max_wait``).

        Example: ``data = bulkhead.call(fetch, "https://example.com/a")``
        """
        refuse_async(self, fn)
        key = None if self._key is None else self._key(*args, **kwargs)
        if self._remote is not None:
            priority = self._call_priority(args, kwargs)
            if self._listeners or GLOBAL_LISTENERS:
                with self.acquire(key, priority=priority):
                    return fn(*args, **kwargs)
            return self._remote.call(fn, key, priority, args, kwargs)
        n = self._slots.try_acquire(key)
        waited = None
        if not n:
            started = self._now()
            self._wait(key, self._call_priority(args, kwargs), self.max_wait)
            n = self._limit
            if self._listeners or GLOBAL_LISTENERS:
                waited = self._now() - started
        elif self._listeners or GLOBAL_LISTENERS:
            waited = 0.0
        t0 = self._sample_start(n)
        try:
            if waited is not None:  # a listener's KeyboardInterrupt still frees the slot
                self._report_admission(key, waited)
            return fn(*args, **kwargs)
        finally:
            self._give_back(key, t0)

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` holding a slot of its key (asyncio or trio).

        Example: ``data = await bulkhead.call_async(fetch, "https://example.com/a")``
        """
        if type(fn) is not FunctionType or fn.__code__.co_flags & GENERATOR_FLAGS:
            refuse_generator_async(fn)  # inline for a plain coroutine function: decorated
        key = None if self._key is None else self._key(*args, **kwargs)
        if self._remote is not None:
            priority = self._call_priority(args, kwargs)
            if self._listeners or GLOBAL_LISTENERS:
                async with await self.acquire_async(key, priority=priority):
                    return await fn(*args, **kwargs)
            return await self._remote.call_async(fn, key, priority, args, kwargs)
        n = self._slots.try_acquire(key)
        waited = None
        if not n:
            started = self._now()
            await self._wait_async(key, self._call_priority(args, kwargs), self.max_wait)
            n = self._limit
            if self._listeners or GLOBAL_LISTENERS:
                waited = self._now() - started
        elif self._listeners or GLOBAL_LISTENERS:
            waited = 0.0
        t0 = self._sample_start(n)
        try:
            if waited is not None:
                self._report_admission(key, waited)
            return await fn(*args, **kwargs)
        finally:
            self._give_back(key, t0)

    def __enter__(self) -> Bulkhead:
        if self._remote is None:
            self._lock.acquire()
            try:
                n = self._in_use.get(None, 0)
                free = n < self._limit
                if free:
                    self._in_use[None] = n + 1
            finally:
                self._lock.release()
            if free:
                if self._slots.sampling or self._samples_out:
                    self._push_sample(n + 1 == self._limit)
                if self._listeners or GLOBAL_LISTENERS:
                    self._report_held(None, 0.0, self._exit_local)
                return self
            started = self._now()
            self._wait(None, self._default_priority, self.max_wait)
            if self._slots.sampling or self._samples_out:
                self._push_sample(True)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_held(None, self._now() - started, self._exit_local)
            return self
        permit = self.acquire(None)
        _HELD.set((*_HELD.get(), permit))
        return self

    def _push_sample(self, filled: bool) -> None:
        """Mark the ``with`` block just entered: with its start when it filled the last
        slot (a hold-time sample), else with ``None``.

        While samples are out every block is marked, so that an exit only ever takes
        its own block's mark: a mark left behind (an async generator closed by another
        task) then stays under the others instead of passing as a sample.
        """
        start = self._now() if filled and self._slots.sampling else None
        _SAMPLED.set((*_SAMPLED.get(), (self, start, _runner())))
        with self._lock:
            self._samples_out += 1

    def _pop_sample(self) -> float | None:
        """The start of the exiting ``with`` block's sample, if it has one."""
        sampled = _SAMPLED.get()
        if not sampled or sampled[-1][0] is not self or sampled[-1][2] != _runner():
            return None
        _SAMPLED.set(sampled[:-1])
        with self._lock:
            self._samples_out -= 1
        return sampled[-1][1]

    def _report_held(self, key: Hashable, waited: float, give_back: Callable[[], Any]) -> None:
        """Report an admission whose slot is already held: if a listener raises past
        the event plumbing (``KeyboardInterrupt``), the slot goes back first."""
        try:
            self._report_admission(key, waited)
        except BaseException:
            give_back()
            raise

    def _exit_local(self) -> None:
        self.__exit__(None, None, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._remote is None:
            if self._samples_out and (t0 := self._pop_sample()) is not None:
                self._give_back(None, t0)  # a timed block: record its hold, release
                return
            self._lock.acquire()
            try:
                if not self._queues:
                    in_use = self._in_use
                    n = in_use[None] - 1
                    if n:
                        in_use[None] = n
                    else:
                        del in_use[None]
                        if not in_use:
                            in_use.clear()
                    return
            finally:
                self._lock.release()
            self._give_back(None, None)
            return
        self._pop_held().__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Bulkhead:
        if self._remote is None:
            self._lock.acquire()
            try:
                n = self._in_use.get(None, 0)
                free = n < self._limit
                if free:
                    self._in_use[None] = n + 1
            finally:
                self._lock.release()
            if free:
                if self._slots.sampling or self._samples_out:
                    self._push_sample(n + 1 == self._limit)
                if self._listeners or GLOBAL_LISTENERS:
                    self._report_held(None, 0.0, self._exit_local)
                return self
            started = self._now()
            await self._wait_async(None, self._default_priority, self.max_wait)
            if self._slots.sampling or self._samples_out:
                self._push_sample(True)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_held(None, self._now() - started, self._exit_local)
            return self
        permit = await self.acquire_async(None)
        _HELD.set((*_HELD.get(), permit))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._remote is None:
            if self._samples_out and (t0 := self._pop_sample()) is not None:
                self._give_back(None, t0)  # a timed block: record its hold, release
                return
            self._lock.acquire()
            try:
                if not self._queues:
                    in_use = self._in_use
                    n = in_use[None] - 1
                    if n:
                        in_use[None] = n
                    else:
                        del in_use[None]
                        if not in_use:
                            in_use.clear()
                    return
            finally:
                self._lock.release()
            self._give_back(None, None)
            return
        await self._pop_held().__aexit__(exc_type, exc, tb)

    # ------------------------------------------------------------------ introspection

    def statistics(self, key: Hashable = None) -> BulkheadStatistics:
        """Counters for the whole bulkhead, or for ``key`` when given.

        Example::

            stats = bulkhead.statistics()
            print(f"{stats.in_flight}/{stats.max_concurrent} busy, {stats.waiting} waiting")
        """
        slots = self._slots
        if key is None:
            in_flight, waiting, keys = slots.totals()
        else:
            in_flight, waiting = slots.counts(key)
            keys = 1 if in_flight else 0
        rejected = slots.rejected if key is None else slots.rejected_for(key)
        shared = backend = None
        if self._remote is not None:
            shared, backend, (r_in, r_wait, r_keys, r_rejected) = self._remote.statistics(key)
            in_flight += r_in
            waiting += r_wait
            keys += r_keys
            rejected += r_rejected
        return BulkheadStatistics(
            max_concurrent=self.max_concurrent,
            in_flight=in_flight,
            waiting=waiting,
            rejected=rejected,
            keys=keys,
            key=key,
            shared_in_flight=shared,
            backend=backend,
        )

    def close(self) -> None:
        """Stop the background Redis listener of a distributed bulkhead (no-op in process).

        Held leases stay valid until released. Example: ``bulkhead.close()``
        """
        if self._remote is not None:
            self._remote.close()

    def __repr__(self) -> str:
        parts = [f"<Bulkhead {self.name!r} max_concurrent={self.max_concurrent}"]
        if self.max_wait:
            parts.append(f"max_wait={self.max_wait:g}")
        if self._key is not None:
            parts.append("keyed")
        if self._remote is not None:
            parts.append("redis")
        return " ".join(parts) + ">"

    # ------------------------------------------------------------------ waiting

    def _wait(self, key: Hashable, priority: int, max_wait: float) -> None:
        """Block until a slot of ``key`` is handed over, or raise BulkheadFull."""
        waiter = self._begin_wait(ThreadWaiter(key), priority, max_wait)
        if waiter is None:
            return
        timer = self._arm(waiter, max_wait)
        try:
            waiter.wait(None if timer is not None else _deadline.clamp(max_wait))
        except BaseException:
            self._give_up(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._end_wait(waiter)

    async def _wait_async(
        self,
        key: Hashable,
        priority: int,
        max_wait: float,
        may_wait: Callable[[], bool] | None = None,
    ) -> None:
        """Suspend until a slot of ``key`` is handed over, or raise BulkheadFull."""
        waiter = self._begin_wait(async_waiter(key), priority, max_wait, may_wait)
        if waiter is None:
            return
        timer = self._arm(waiter, max_wait)
        try:
            await waiter.wait(None if timer is not None else _deadline.clamp(max_wait))
        except BaseException:
            self._give_up(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._end_wait(waiter)

    def _begin_wait(
        self,
        waiter: Any,
        priority: int,
        max_wait: float,
        may_wait: Callable[[], bool] | None = None,
    ) -> Any:
        """Queue ``waiter``; None if a slot was taken on the way, raises if no wait allowed."""
        key = waiter.key
        if _deadline.clamp(max_wait) <= 0 or (may_wait is not None and not may_wait()):
            raise self._rejected(key)
        if self._slots.enqueue(waiter, priority):
            return None
        return waiter

    def _arm(self, waiter: Waiter, max_wait: float) -> Any:
        """A virtual-clock timer expiring ``waiter`` (None: the wait itself times out)."""
        if not self._timers:
            return None
        seconds = _deadline.clamp(max_wait)
        if seconds == float("inf"):
            return _NO_TIMER
        return self._clock.call_at(  # type: ignore[attr-defined]
            self._now() + seconds, lambda: self._expire(waiter)
        )

    def _expire(self, waiter: Waiter) -> None:
        if self._slots.expire(waiter):
            try:
                waiter.wake()
            except Exception:
                pass  # its loop is gone; nothing to hand over either

    def _end_wait(self, waiter: Waiter) -> None:
        """After the wait: keep the handed-over slot, or give up and raise BulkheadFull."""
        if waiter.state == GRANTED:
            return
        self._give_up(waiter)
        raise self._rejected(waiter.key)

    def _give_up(self, waiter: Waiter) -> None:
        """Leave the queue; a slot handed over meanwhile goes to the next waiter."""
        next_waiter = self._slots.withdraw(waiter)
        if next_waiter is not None:
            self._wake(next_waiter)

    def _wake(self, waiter: Waiter) -> None:
        """Wake a waiter that was handed a slot; if it cannot run, hand the slot on."""
        while True:
            try:
                waiter.wake()
                return
            except Exception:
                next_waiter = self._slots.abandon(waiter)
                if next_waiter is None:
                    return
                waiter = next_waiter

    # ------------------------------------------------------------------ helpers

    def _give_back(self, key: Hashable, t0: float | None) -> None:
        """Release one slot of ``key`` held since ``t0`` (a sampled start, or None)."""
        slots = self._slots
        if t0 is not None:
            slots.record_hold(self._now() - t0)
        waiter = slots.release(key)
        if waiter is not None:
            self._wake(waiter)

    def _sample_start(self, n: int) -> float | None:
        """Start a hold-time sample when this acquisition filled the last slot."""
        return self._now() if n == self._limit and self._slots.sampling else None

    def _rejected(self, key: Hashable) -> BulkheadFull:
        slots = self._slots
        slots.reject(key)
        remote = self._remote
        retry_after = slots.retry_after(key, None if remote is None else remote.waiting(key))
        if self._observed:
            self._emit(
                CallRejected(
                    policy=self.name,
                    key=None if key is None else str(key),
                    retry_after=retry_after,
                )
            )
        return BulkheadFull(
            f"bulkhead {self.name!r} is full (max_concurrent={self.max_concurrent}"
            + ("" if key is None else f", key={key!r}")
            + ")",
            retry_after=retry_after,
        )

    def _call_priority(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        if self._priority is None:
            return self._default_priority
        return _check_priority("priority()", self._priority(*args, **kwargs))

    def _direct_priority(self, priority: int | None) -> int:
        if priority is None:
            return self._default_priority
        return _check_priority("priority", priority)

    def _pop_held(self) -> Permit:
        """The permit of the innermost ``with`` block of this bulkhead still held (see
        :func:`~resilience._blocks.pop_innermost`)."""
        found = pop_innermost(
            _HELD.get(),
            mine=lambda permit: permit._bulkhead is self,
            settled=lambda permit: permit.released,
        )
        if found is None:
            raise RuntimeError("Bulkhead.__exit__ without a matching __enter__")
        permit, rest = found
        _HELD.set(rest)
        return permit


class _NoTimer:
    """Stands for the timer of an unbounded wait on a virtual clock."""

    __slots__ = ()

    def cancel(self) -> None:
        """Nothing to cancel."""


_NO_TIMER = _NoTimer()


def _check_priority(name: str, value: Any) -> int:
    return int(check_int(name, value, minimum=_MIN_INT, maximum=_MAX_INT))


def _check_wait(value: Any) -> float:
    return float(check_number("max_wait", value, allow_inf=True))


def _is_memory(backend: Any) -> bool:
    from ..backends import MemoryBackend

    return isinstance(backend, MemoryBackend)
