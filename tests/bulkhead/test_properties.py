"""Invariants of the in-process Bulkhead under random workloads (hypothesis).

Real tasks (asyncio and trio) and real threads drive the bulkhead through every entry
point (``acquire``, ``acquire_nowait``, the decorator, ``with``); time is a FakeClock, so
timeouts and holds happen in virtual time. Checked on every example:

* the number of holders of a key never exceeds max_concurrent;
* every admitted call releases, and all counts and per-key state return to zero;
* waiters are served by priority, FIFO within a priority, skipping those who left.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience.testing import FakeClock

pytestmark = pytest.mark.timeout(60)

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

requests = st.lists(
    st.tuples(
        st.sampled_from("abc"),  # key
        st.integers(0, 2),  # priority
        st.sampled_from([0.0, 0.5, 2.0, math.inf]),  # max_wait
        st.integers(0, 3),  # hold: virtual sleeps of 0.25 s while holding
        st.one_of(st.none(), st.sampled_from([0.1, 0.6, 1.5])),  # cancel after (tasks)
        st.sampled_from(["permit", "nowait", "decorated", "with"]),  # how the slot is taken
    ),
    min_size=1,
    max_size=24,
)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Spin until other threads reached a state (never a wait on policy timing)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached within 5 s")
        time.sleep(0.0005)


def assert_settled(bulkhead: rs.Bulkhead) -> None:
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.waiting, stats.keys) == (0, 0, 0)


def make_bulkhead(limit: int, clock: FakeClock) -> rs.Bulkhead:
    """Decorated calls are ``(key, priority, hold)``; they wait up to 0.5 s."""
    return rs.Bulkhead(
        limit,
        key=lambda key, *_: key,
        priority=lambda _key, priority, *_: priority,
        max_wait=0.5,
        clock=clock,
    )


class Tracker:
    """Counts holders per key (thread-safe) and remembers the peak."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.active: Counter[str] = Counter()
        self.peak = 0
        self.admitted = 0
        self.released = 0

    def enter(self, key: str) -> None:
        with self.lock:
            self.admitted += 1
            self.active[key] += 1
            self.peak = max(self.peak, self.active[key])
            assert self.active[key] <= self.limit, f"{key}: {self.active[key]} > {self.limit}"

    def leave(self, key: str) -> None:
        with self.lock:
            self.active[key] -= 1
            self.released += 1


@pytest.mark.anyio
@SETTINGS
@given(limit=st.integers(1, 3), work=requests)
async def test_tasks_never_exceed_the_limit_and_always_release(
    anyio_backend: str, limit: int, work: list[tuple[str, int, float, int, float | None, str]]
) -> None:
    """Random acquire/hold/timeout/cancel mixes of tasks keep every invariant."""
    clock = FakeClock()
    bulkhead = make_bulkhead(limit, clock)
    tracker = Tracker(limit)

    async def hold_slot(key: str | None, priority: int, hold: int) -> None:
        tracker.enter(str(key))
        try:
            for _ in range(hold):
                await clock.sleep_async(0.25)
        finally:
            tracker.leave(str(key))

    async def worker(
        key: str, priority: int, max_wait: float, hold: int, cancel: float | None, mode: str
    ) -> None:
        with anyio.CancelScope() as scope:
            if cancel is not None:
                clock.call_at(clock.monotonic() + cancel, scope.cancel)
            try:
                if mode == "decorated":
                    await bulkhead.call_async(hold_slot, key, priority, hold)
                    return
                if mode == "with":
                    async with bulkhead:
                        await hold_slot(None, priority, hold)
                    return
                if mode == "nowait":
                    permit = bulkhead.acquire_nowait(key)
                else:
                    permit = await bulkhead.acquire_async(key, priority=priority, max_wait=max_wait)
            except rs.BulkheadFull:
                return
            async with permit:
                await hold_slot(key, priority, hold)

    async with anyio.create_task_group() as tg:
        for item in work:
            tg.start_soon(worker, *item)
    assert tracker.admitted == tracker.released
    assert tracker.peak <= limit
    assert_settled(bulkhead)


@SETTINGS
@given(limit=st.integers(1, 3), work=requests)
def test_threads_never_exceed_the_limit_and_always_release(
    limit: int, work: list[tuple[str, int, float, int, float | None, str]]
) -> None:
    """Random acquire/hold/timeout mixes of threads keep every invariant."""
    clock = FakeClock()
    bulkhead = make_bulkhead(limit, clock)
    tracker = Tracker(limit)
    failures: list[BaseException] = []

    def hold_slot(key: str | None, priority: int, hold: int) -> None:
        tracker.enter(str(key))
        try:
            for _ in range(hold):
                clock.sleep(0.25)  # fires the timers of timed-out waiters
                time.sleep(0)
        finally:
            tracker.leave(str(key))

    def worker(key: str, priority: int, max_wait: float, hold: int, _: object, mode: str) -> None:
        try:
            try:
                if mode == "decorated":
                    bulkhead.call(hold_slot, key, priority, hold)
                    return
                if mode == "with":
                    with bulkhead:
                        hold_slot(None, priority, hold)
                    return
                if mode == "nowait":
                    permit = bulkhead.acquire_nowait(key)
                else:
                    permit = bulkhead.acquire(key, priority=priority, max_wait=max_wait)
            except rs.BulkheadFull:
                return
            with permit:
                hold_slot(key, priority, hold)
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=item) for item in work]
    for thread in threads:
        thread.start()
    # Waiters with a finite max_wait time out when virtual time passes it: holders
    # advance time while they hold; advance it here too in case nobody holds any more.
    end = time.monotonic() + 20
    while any(thread.is_alive() for thread in threads):
        assert time.monotonic() < end, "threads did not finish"
        clock.advance(0.5)
        time.sleep(0.001)
    assert not failures
    assert tracker.admitted == tracker.released
    assert_settled(bulkhead)


waiters = st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=12)


def expected_order(spec: list[tuple[int, bool]]) -> list[int]:
    """Indices of the waiters that stay, by (priority, arrival)."""
    staying = [(priority, index) for index, (priority, leaves) in enumerate(spec) if not leaves]
    return [index for _, index in sorted(staying)]


@pytest.mark.anyio
@SETTINGS
@given(limit=st.integers(1, 3), spec=waiters)
async def test_tasks_are_served_by_priority_then_fifo(
    anyio_backend: str, limit: int, spec: list[tuple[int, bool]]
) -> None:
    """Queued tasks get slots in (priority, arrival) order; cancelled ones are skipped."""
    bulkhead = rs.Bulkhead(limit, max_wait=math.inf)
    held = [await bulkhead.acquire_async("k") for _ in range(limit)]
    order: list[int] = []
    scopes = [anyio.CancelScope() for _ in spec]

    async def waiter(index: int, priority: int) -> None:
        with scopes[index]:
            permit = await bulkhead.acquire_async("k", priority=priority)
            order.append(index)
            permit.release()  # hands the one circulating slot to the next waiter

    async with anyio.create_task_group() as tg:
        for index, (priority, _) in enumerate(spec):
            tg.start_soon(waiter, index, priority)
            await anyio.wait_all_tasks_blocked()  # fixes the arrival order
        for index, (_, leaves) in enumerate(spec):
            if leaves:
                scopes[index].cancel()
        await anyio.wait_all_tasks_blocked()
        held[0].release()
    assert order == expected_order(spec)
    for permit in held[1:]:
        permit.release()
    assert_settled(bulkhead)


@settings(max_examples=25, deadline=None)
@given(limit=st.integers(1, 2), spec=waiters)
def test_threads_are_served_by_priority_then_fifo(limit: int, spec: list[tuple[int, bool]]) -> None:
    """Queued threads get slots in (priority, arrival) order; timed-out ones are skipped."""
    clock = FakeClock()
    bulkhead = rs.Bulkhead(limit, clock=clock)
    held = [bulkhead.acquire("k") for _ in range(limit)]
    order: list[int] = []

    def waiter(index: int, priority: int, leaves: bool) -> None:
        try:
            permit = bulkhead.acquire("k", priority=priority, max_wait=1.0 if leaves else 1e9)
        except rs.BulkheadFull:
            return
        order.append(index)
        permit.release()

    threads = []
    for index, (priority, leaves) in enumerate(spec):
        thread = threading.Thread(target=waiter, args=(index, priority, leaves))
        thread.start()
        threads.append(thread)
        count = len(threads)
        wait_until(lambda count=count: bulkhead.statistics().waiting == count)
    clock.advance(1.0)  # the leavers time out
    staying = len(expected_order(spec))
    wait_until(lambda: bulkhead.statistics().waiting == staying)
    held[0].release()
    for thread in threads:
        thread.join(5)
    assert order == expected_order(spec)
    for permit in held[1:]:
        permit.release()
    assert_settled(bulkhead)
