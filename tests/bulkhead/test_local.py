"""The in-process Bulkhead through its public API: slots, waiting, priorities, errors."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.testing import FakeClock

pytestmark = pytest.mark.timeout(30)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Spin until another thread reached a state (not a wait on the policy's timing)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached within 5 s")
        time.sleep(0.001)


def settled(bulkhead: rs.Bulkhead) -> bool:
    """Nothing held, nothing waiting, no per-key state left."""
    stats = bulkhead.statistics()
    return stats.in_flight == 0 and stats.waiting == 0 and stats.keys == 0


# ---------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": 1.5}, "max_concurrent"),
        ({"max_concurrent": 2, "max_wait": -1}, "max_wait"),
        ({"max_concurrent": 2, "max_wait": math.nan}, "max_wait"),
        ({"max_concurrent": 2, "lease": 0}, "lease"),
        ({"max_concurrent": 2, "key": "host"}, "key"),
        ({"max_concurrent": 2, "priority": "high"}, "priority"),
        ({"max_concurrent": 2, "on_backend_error": "maybe"}, "on_backend_error"),
        ({"max_concurrent": 2, "on_lease_lost": "shrug"}, "on_lease_lost"),
        ({"max_concurrent": 2, "local_limit": 0}, "local_limit"),
        ({"max_concurrent": 2, "local_limit": 3}, "local_limit"),
        ({"max_concurrent": 2, "clock": object()}, "clock"),
        ({"max_concurrent": 2, "backend": object()}, "backend"),
    ],
)
def test_bad_arguments_raise_configuration_error(kwargs: dict, message: str) -> None:
    """Every bad constructor argument fails at construction, naming the argument."""
    with pytest.raises(rs.ConfigurationError, match=message):
        rs.Bulkhead(**kwargs)


def test_per_call_arguments_are_checked() -> None:
    """A bad per-call max_wait or priority is a ConfigurationError too."""
    bulkhead = rs.Bulkhead(1)
    with pytest.raises(rs.ConfigurationError, match="max_wait"):
        bulkhead.acquire(max_wait=-1)
    with pytest.raises(rs.ConfigurationError, match="priority"):
        bulkhead.acquire(priority=1.5)  # type: ignore[arg-type]
    assert settled(bulkhead)


# ---------------------------------------------------------------------- admission


def test_acquire_nowait_admits_up_to_the_limit_then_raises() -> None:
    """max_concurrent permits are granted; the next one is BulkheadFull at once."""
    bulkhead = rs.Bulkhead(2)
    first, second = bulkhead.acquire_nowait(), bulkhead.acquire_nowait()
    with pytest.raises(rs.BulkheadFull) as info:
        bulkhead.acquire_nowait()
    assert isinstance(info.value, rs.Rejected)
    assert bulkhead.statistics().in_flight == 2
    first.release()
    third = bulkhead.acquire_nowait()
    second.release()
    third.release()
    assert settled(bulkhead)


def test_release_is_idempotent() -> None:
    """Releasing a permit twice gives back one slot, not two."""
    bulkhead = rs.Bulkhead(1)
    permit = bulkhead.acquire_nowait()
    permit.release()
    permit.release()
    assert permit.released
    assert not permit.lost
    held = bulkhead.acquire_nowait()
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait()
    held.release()
    assert settled(bulkhead)


def test_concurrent_double_release_from_threads_frees_one_slot() -> None:
    """Two threads releasing the same permit at once still free exactly one slot."""
    bulkhead = rs.Bulkhead(2)
    for _ in range(200):
        other = bulkhead.acquire_nowait()
        permit = bulkhead.acquire_nowait()
        barrier = threading.Barrier(2)

        def release(p: rs.Permit = permit, b: threading.Barrier = barrier) -> None:
            b.wait()
            p.release()

        threads = [threading.Thread(target=release) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert bulkhead.statistics().in_flight == 1
        other.release()
    assert settled(bulkhead)


def test_keys_are_independent() -> None:
    """Each key has its own max_concurrent slots."""
    bulkhead = rs.Bulkhead(1)
    a = bulkhead.acquire_nowait("a")
    b = bulkhead.acquire_nowait("b")
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait("a")
    assert bulkhead.statistics("a").in_flight == 1
    assert bulkhead.statistics().keys == 2
    a.release()
    b.release()
    assert settled(bulkhead)


def test_with_bulkhead_and_permit_context_managers_release_on_error() -> None:
    """``with bulkhead`` and ``with permit`` give the slot back when the body raises."""
    bulkhead = rs.Bulkhead(1)
    with pytest.raises(ZeroDivisionError), bulkhead:
        1 / 0
    with pytest.raises(KeyError), bulkhead.acquire("k"):
        raise KeyError("x")
    assert settled(bulkhead)


def test_decorator_uses_key_function_and_releases_on_exception() -> None:
    """A decorated function holds a slot of key(args) while it runs, even when it raises."""
    bulkhead = rs.Bulkhead(1, key=lambda host, **_: host)
    seen: list[int] = []

    @bulkhead
    def fetch(host: str, *, fail: bool = False) -> str:
        seen.append(bulkhead.statistics(host).in_flight)
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait(host)
        if fail:
            raise OSError("boom")
        return host

    assert fetch("a") == "a"
    with pytest.raises(OSError):
        fetch("b", fail=True)
    assert seen == [1, 1]
    assert fetch.__name__ == "fetch"
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_async_decorator_and_async_with() -> None:
    """``async with`` and ``async def`` decoration hold and release a slot."""
    bulkhead = rs.Bulkhead(1, key=lambda host: host)

    @bulkhead
    async def fetch(host: str) -> int:
        await anyio.lowlevel.checkpoint()
        return bulkhead.statistics(host).in_flight

    assert await fetch("a") == 1
    async with bulkhead:
        assert bulkhead.statistics().in_flight == 1
    permit = await bulkhead.acquire_async("x")
    async with permit:
        assert bulkhead.statistics("x").in_flight == 1
    assert settled(bulkhead)


def test_rejection_emits_call_rejected_event() -> None:
    """An admission emits CallAdmitted and a refusal CallRejected, with the key; both
    count in statistics()."""
    bulkhead = rs.Bulkhead(1, name="downloads")
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    held = bulkhead.acquire_nowait("example.com")
    with pytest.raises(rs.BulkheadFull, match="downloads"):
        bulkhead.acquire_nowait("example.com")
    assert [type(e) for e in events] == [rs.CallAdmitted, rs.CallRejected]
    assert [e.key for e in events] == ["example.com", "example.com"]
    assert {e.policy for e in events} == {"downloads"}
    assert bulkhead.statistics().rejected == 1
    assert bulkhead.statistics("example.com").rejected == 1
    assert bulkhead.statistics("other").rejected == 0
    held.release()


def test_retry_after_estimates_from_observed_hold_times(fake_clock: FakeClock) -> None:
    """Once holds were observed under contention, BulkheadFull carries an estimate."""
    bulkhead = rs.Bulkhead(2, clock=fake_clock)
    a = bulkhead.acquire_nowait()
    b = bulkhead.acquire_nowait()
    with pytest.raises(rs.BulkheadFull) as first:
        bulkhead.acquire_nowait()
    assert first.value.retry_after is None  # nothing observed yet
    for _ in range(20):  # calls that fill the last slot are timed (4 s each)
        a.release()
        a = bulkhead.acquire_nowait()
        fake_clock.advance(4.0)
    with pytest.raises(rs.BulkheadFull) as second:
        bulkhead.acquire_nowait()
    assert second.value.retry_after is not None
    assert 1.0 <= second.value.retry_after <= 3.0  # about hold / max_concurrent
    a.release()
    b.release()


def test_with_blocks_feed_the_retry_after_estimate(fake_clock: FakeClock) -> None:
    """``with bulkhead:`` blocks that fill the last slot are timed too (they used to be
    skipped, so a bulkhead used only that way never gave an estimate)."""
    bulkhead = rs.Bulkhead(2, clock=fake_clock)
    held = bulkhead.acquire_nowait()
    with bulkhead, pytest.raises(rs.BulkheadFull) as first, bulkhead:
        pass
    assert first.value.retry_after is None  # nothing observed yet
    for _ in range(20):
        with bulkhead:  # fills the last slot: timed (4 s each)
            fake_clock.advance(4.0)
    with bulkhead, pytest.raises(rs.BulkheadFull) as second, bulkhead:
        pass
    assert second.value.retry_after == pytest.approx(2.0, rel=0.25)  # hold / max_concurrent
    held.release()
    assert bulkhead.statistics().in_flight == 0


@pytest.mark.anyio
async def test_async_with_blocks_feed_the_retry_after_estimate() -> None:
    """The same for ``async with bulkhead:``, with the sample kept per task."""
    clock = FakeClock()
    bulkhead = rs.Bulkhead(2, clock=clock)
    held = bulkhead.acquire_nowait()
    async with bulkhead:
        with pytest.raises(rs.BulkheadFull):
            async with bulkhead:
                pass
    for _ in range(20):
        async with bulkhead:
            clock.advance(4.0)
    async with bulkhead:
        with pytest.raises(rs.BulkheadFull) as refused:
            async with bulkhead:
                pass
    assert refused.value.retry_after == pytest.approx(2.0, rel=0.25)
    held.release()
    assert bulkhead.statistics().in_flight == 0


@pytest.mark.anyio
async def test_a_task_started_in_a_sampled_block_does_not_take_its_sample() -> None:
    """A task started inside a sampled ``async with`` block inherits the block's sample
    with its context; its own unsampled block must not take it for its own (that
    recorded a hold as long as the task's whole life, and lost another block's sample)."""
    clock = FakeClock()
    bulkhead = rs.Bulkhead(3, clock=clock)
    held = [bulkhead.acquire_nowait(), bulkhead.acquire_nowait()]
    async with bulkhead:  # fills the last slot: starts sampling, nothing observed yet
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait()
    child_in, child_out, other_in, other_out = (anyio.Event() for _ in range(4))

    async def child() -> None:
        async with bulkhead:  # unsampled: two slots free when it enters
            child_in.set()
            await child_out.wait()

    async def other() -> None:
        async with bulkhead:  # fills the last slot: sampled, from t=99
            other_in.set()
            await other_out.wait()

    async with anyio.create_task_group() as tasks:
        async with bulkhead:  # fills the last slot again: sampled, at t=0
            tasks.start_soon(child)  # inherits this block's sample
        held.pop().release()
        await child_in.wait()  # the child and one held slot: one free
        clock.advance(99)
        tasks.start_soon(other)
        await other_in.wait()
        clock.advance(1)
        child_out.set()  # its exit must leave the inherited sample alone
        await anyio.sleep(0)
        other_out.set()  # held 1 s: the only hold observed under contention
    held.pop().release()
    permits = [bulkhead.acquire_nowait() for _ in range(3)]
    with pytest.raises(rs.BulkheadFull) as refused:
        bulkhead.acquire_nowait()
    assert refused.value.retry_after is not None
    assert refused.value.retry_after < 1.0  # from the 1 s hold, not the child's 100 s
    for permit in permits:
        permit.release()


def test_a_block_left_open_by_an_abandoned_async_generator_is_no_sample() -> None:
    """An async generator holding ``async with bulkhead`` that its consumer abandons is
    closed later by another task (asyncio's generator finalizer): its mark stays behind
    in the consumer's context. The consumer's later blocks must not take it for their
    own (that recorded an hour of idle time as a hold, and retry_after said 1800 s)."""
    clock = FakeClock()
    bulkhead = rs.Bulkhead(2, clock=clock)

    async def stream() -> AsyncIterator[int]:
        async with bulkhead:
            for item in range(10):
                yield item

    async def consumer() -> float | None:
        other = bulkhead.acquire_nowait()
        with pytest.raises(rs.BulkheadFull):
            async with bulkhead, bulkhead:
                pass  # contention: sampling on
        async for _ in stream():  # fills the last slot: sampled
            break
        await asyncio.sleep(0.01)  # the abandoned generator is closed in another task
        other.release()
        clock.advance(3600)
        async with bulkhead:  # a 0-s block
            pass
        permits = [bulkhead.acquire_nowait(), bulkhead.acquire_nowait()]
        with pytest.raises(rs.BulkheadFull) as refused:
            bulkhead.acquire_nowait()
        for permit in permits:
            permit.release()
        return refused.value.retry_after

    retry_after = asyncio.run(consumer())
    assert retry_after is None or retry_after < 1.0
    assert bulkhead.statistics().in_flight == 0


# ---------------------------------------------------------------------- waiting (threads)


def test_thread_waits_and_gets_the_released_slot(fake_clock: FakeClock) -> None:
    """A thread waiting with max_wait receives the slot released by another thread."""
    bulkhead = rs.Bulkhead(1, max_wait=10.0, clock=fake_clock)
    held = bulkhead.acquire()
    got: list[rs.Permit] = []
    thread = threading.Thread(target=lambda: got.append(bulkhead.acquire()))
    thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    held.release()
    thread.join(5)
    assert got
    assert bulkhead.statistics().in_flight == 1
    got[0].release()
    assert settled(bulkhead)


def test_thread_wait_times_out_in_virtual_time(fake_clock: FakeClock) -> None:
    """A waiting thread gives up when the FakeClock passes max_wait; no slot leaks."""
    bulkhead = rs.Bulkhead(1, clock=fake_clock)
    held = bulkhead.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            bulkhead.acquire(max_wait=5.0)
        except rs.BulkheadFull as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    fake_clock.advance(4.9)
    assert bulkhead.statistics().waiting == 1
    fake_clock.advance(0.2)
    thread.join(5)
    assert len(errors) == 1
    assert bulkhead.statistics().waiting == 0
    held.release()
    assert settled(bulkhead)


def test_thread_wait_with_real_clock_times_out() -> None:
    """With the system clock the thread's own wait times out (short real bound)."""
    bulkhead = rs.Bulkhead(1)
    held = bulkhead.acquire()
    started = time.monotonic()
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire(max_wait=0.05)
    assert time.monotonic() - started < 5.0
    held.release()
    assert settled(bulkhead)


def test_wait_is_clamped_by_the_ambient_deadline(fake_clock: FakeClock) -> None:
    """Inside rs.deadline(), max_wait is cut to the time left."""
    bulkhead = rs.Bulkhead(1, max_wait=60.0, clock=fake_clock)
    held = bulkhead.acquire()
    with rs.deadline(0.0, clock=fake_clock), pytest.raises(rs.BulkheadFull):
        bulkhead.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        with rs.deadline(2.0, clock=fake_clock):
            try:
                bulkhead.acquire()
            except rs.BulkheadFull as exc:
                errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    fake_clock.advance(2.0)
    thread.join(5)
    assert len(errors) == 1
    held.release()
    assert settled(bulkhead)


def test_priorities_then_fifo_for_threads() -> None:
    """Released slots go to the lowest priority number first, FIFO within a priority."""
    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = bulkhead.acquire()
    order: list[str] = []
    threads = []
    for name, priority in [("b1", 10), ("i1", 0), ("b2", 10), ("i2", 0), ("m1", 5)]:

        def run(name: str = name, priority: int = priority) -> None:
            with bulkhead.acquire(priority=priority):
                order.append(name)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        count = len(threads)
        wait_until(lambda count=count: bulkhead.statistics().waiting == count)
    held.release()
    for thread in threads:
        thread.join(5)
    assert order == ["i1", "i2", "m1", "b1", "b2"]
    assert settled(bulkhead)


def test_priority_callable_applies_to_decorated_calls() -> None:
    """``priority=callable`` ranks decorated calls by their arguments."""
    bulkhead = rs.Bulkhead(1, max_wait=math.inf, priority=lambda job, urgent: 0 if urgent else 9)
    held = bulkhead.acquire()
    order: list[str] = []

    @bulkhead
    def work(job: str, urgent: bool) -> None:
        order.append(job)

    threads = []
    for job, urgent in [("batch", False), ("click", True)]:
        thread = threading.Thread(target=work, args=(job, urgent))
        thread.start()
        threads.append(thread)
        count = len(threads)
        wait_until(lambda count=count: bulkhead.statistics().waiting == count)
    held.release()
    for thread in threads:
        thread.join(5)
    assert order == ["click", "batch"]


def test_bad_priority_from_callable_is_rejected_before_waiting() -> None:
    """A priority function returning a non-int raises ConfigurationError, no slot leaks."""
    bulkhead = rs.Bulkhead(1, max_wait=1.0, priority=lambda: "high")
    held = bulkhead.acquire()
    with pytest.raises(rs.ConfigurationError):
        bulkhead(lambda: None)()
    held.release()
    assert settled(bulkhead)


# ---------------------------------------------------------------------- waiting (tasks)


@pytest.mark.anyio
async def test_task_waits_and_gets_the_released_slot(fake_clock: FakeClock) -> None:
    """A task waiting with max_wait receives the slot when the holder releases."""
    bulkhead = rs.Bulkhead(1, max_wait=10.0, clock=fake_clock)
    held = await bulkhead.acquire_async()
    got: list[rs.Permit] = []

    async def waiter() -> None:
        got.append(await bulkhead.acquire_async())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert bulkhead.statistics().waiting == 1
        held.release()
    assert len(got) == 1
    got[0].release()
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_task_wait_times_out_in_virtual_time(fake_clock: FakeClock) -> None:
    """A waiting task gives up when the FakeClock passes max_wait."""
    bulkhead = rs.Bulkhead(1, clock=fake_clock)
    held = await bulkhead.acquire_async()
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await bulkhead.acquire_async(max_wait=3.0)
        except rs.BulkheadFull as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(2.9)
        await anyio.wait_all_tasks_blocked()
        assert not errors
        fake_clock.advance(0.2)
    assert len(errors) == 1
    held.release()
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_task_wait_with_real_clock_times_out() -> None:
    """With the system clock the task's own wait times out (short real bound)."""
    bulkhead = rs.Bulkhead(1)
    held = await bulkhead.acquire_async()
    with anyio.fail_after(5), pytest.raises(rs.BulkheadFull):
        await bulkhead.acquire_async(max_wait=0.02)
    held.release()
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_cancelled_waiting_task_leaves_no_trace() -> None:
    """Cancelling a waiting task removes it from the queue; counts return to zero."""
    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = await bulkhead.acquire_async("k")
    async with anyio.create_task_group() as tg:
        tg.start_soon(bulkhead.acquire_async, "k")
        await anyio.wait_all_tasks_blocked()
        assert bulkhead.statistics("k").waiting == 1
        tg.cancel_scope.cancel()
    assert bulkhead.statistics("k").waiting == 0
    held.release()
    assert settled(bulkhead)


def test_cancelled_task_that_was_already_handed_a_slot_passes_it_on() -> None:
    """An asyncio task cancelled after the hand-off, before it resumed, gives the slot on."""
    import asyncio

    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    order: list[str] = []

    async def waiter(name: str) -> None:
        async with await bulkhead.acquire_async():
            order.append(name)

    async def main() -> None:
        held = await bulkhead.acquire_async()
        first = asyncio.create_task(waiter("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        held.release()  # handed to ``first`` ...
        first.cancel()  # ... which is cancelled before it resumes
        await asyncio.gather(first, second, return_exceptions=True)
        assert first.cancelled()

    asyncio.run(main())
    assert order == ["second"]
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_priorities_then_fifo_for_tasks() -> None:
    """Tasks are served by priority, FIFO within a priority."""
    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = await bulkhead.acquire_async()
    order: list[str] = []

    async def run(name: str, priority: int) -> None:
        async with await bulkhead.acquire_async(priority=priority):
            order.append(name)

    async with anyio.create_task_group() as tg:
        for name, priority in [("b1", 10), ("i1", 0), ("b2", 10), ("i2", 0)]:
            tg.start_soon(run, name, priority)
            await anyio.wait_all_tasks_blocked()
        held.release()
    assert order == ["i1", "i2", "b1", "b2"]
    assert settled(bulkhead)


@pytest.mark.anyio
async def test_exception_while_holding_releases(fake_clock: FakeClock) -> None:
    """A holder that raises gives its slot to the next waiter."""
    bulkhead = rs.Bulkhead(1, max_wait=10.0, clock=fake_clock)

    @bulkhead
    async def fail() -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("boom")

    @bulkhead
    async def succeed() -> str:
        return "ok"

    results: list[str] = []

    async def call_fail() -> None:
        with pytest.raises(RuntimeError):
            await fail()

    async def call_succeed() -> None:
        results.append(await succeed())

    async with anyio.create_task_group() as tg:
        tg.start_soon(call_fail)
        tg.start_soon(call_succeed)
    assert results == ["ok"]
    assert settled(bulkhead)


# ---------------------------------------------------------------------- threads and loops


def test_thread_release_wakes_an_asyncio_task_and_vice_versa() -> None:
    """A slot released by a thread reaches a task of an asyncio loop in another thread."""
    import asyncio

    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = bulkhead.acquire()
    result: list[str] = []

    async def task() -> None:
        async with await bulkhead.acquire_async():
            result.append("task")

    loop_thread = threading.Thread(target=lambda: asyncio.run(task()))
    loop_thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    held.release()
    loop_thread.join(5)
    assert result == ["task"]
    assert settled(bulkhead)


def test_thread_release_wakes_a_trio_task() -> None:
    """A slot released by a thread reaches a task of a trio run in another thread."""
    import trio

    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = bulkhead.acquire()
    result: list[str] = []

    async def task() -> None:
        async with await bulkhead.acquire_async():
            result.append("task")

    run_thread = threading.Thread(target=lambda: trio.run(task))
    run_thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    held.release()
    run_thread.join(5)
    assert result == ["task"]
    assert settled(bulkhead)


def test_slot_handed_to_a_finished_loop_is_passed_on() -> None:
    """A waiter whose event loop is gone cannot take the slot: the next waiter gets it."""
    import asyncio

    bulkhead = rs.Bulkhead(1, max_wait=math.inf)
    held = bulkhead.acquire()
    loop = asyncio.new_event_loop()

    async def enqueue_then_abandon() -> None:
        # Queue a waiter, then let the loop close under it without cancelling it.
        task = asyncio.ensure_future(bulkhead.acquire_async())
        await asyncio.sleep(0)
        task._log_destroy_pending = False  # type: ignore[attr-defined]

    loop.run_until_complete(enqueue_then_abandon())
    loop.close()
    assert bulkhead.statistics().waiting == 1
    got: list[rs.Permit] = []
    thread = threading.Thread(target=lambda: got.append(bulkhead.acquire()))
    thread.start()
    wait_until(lambda: bulkhead.statistics().waiting == 2)
    held.release()  # the dead loop's waiter is first; its wake fails; the thread gets it
    thread.join(5)
    assert got
    got[0].release()
    assert settled(bulkhead)


def test_memory_backend_means_in_process() -> None:
    """backend=MemoryBackend() is the in-process bulkhead."""
    bulkhead = rs.Bulkhead(1, backend=rs.backends.MemoryBackend())
    with bulkhead:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait()
    assert repr(bulkhead) == "<Bulkhead 'Bulkhead' max_concurrent=1>"
    bulkhead.close()


def test_exit_without_enter_is_an_error_for_permits_only_once() -> None:
    """``repr`` of a permit says whether it is held; releasing twice is harmless."""
    bulkhead = rs.Bulkhead(1)
    permit = bulkhead.acquire_nowait("k")
    assert "held" in repr(permit)
    permit.release()
    assert "released" in repr(permit)


@pytest.mark.anyio
async def test_every_admission_reports_how_long_it_waited() -> None:
    """While anyone listens, each admission (``with``, ``call``, ``acquire``, async too)
    reports its wait: 0.0 for a free slot, the queueing time otherwise."""
    clock = FakeClock()
    bulkhead = rs.Bulkhead(1, max_wait=10, clock=clock, name="db")
    waits: list[float] = []

    def on_event(event: rs.Event) -> None:
        if isinstance(event, rs.CallAdmitted):
            waits.append(event.waited)

    bulkhead.add_listener(on_event)
    with bulkhead:
        pass
    bulkhead.call(lambda: None)
    async with bulkhead:
        pass
    await bulkhead.call_async(anyio.sleep, 0)
    (await bulkhead.acquire_async()).release()
    bulkhead.acquire().release()
    assert waits == [0.0] * 6
    holder = bulkhead.acquire()

    async def release_later() -> None:
        await anyio.sleep(0)
        clock.advance(2.5)
        holder.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        async with bulkhead:  # waits for the holder: 2.5 s of virtual time
            pass
    assert waits[-1] == pytest.approx(2.5)


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised inside a listener."""


@pytest.mark.parametrize("entry", ["call", "acquire", "acquire_nowait", "with"])
def test_a_listener_interrupted_at_admission_does_not_keep_the_slot(entry: str) -> None:
    """A BaseException from a listener of CallAdmitted (Ctrl-C in a slow listener)
    passes through, and the slot taken just before goes back."""
    bulkhead = rs.Bulkhead(1)

    def interrupt(event: object) -> None:
        if isinstance(event, rs.CallAdmitted):
            raise _Interrupt

    def enter() -> None:
        with bulkhead:
            pass

    entries: dict[str, Callable[[], object]] = {
        "call": lambda: bulkhead.call(lambda: None),
        "acquire": bulkhead.acquire,
        "acquire_nowait": bulkhead.acquire_nowait,
        "with": enter,
    }
    bulkhead.add_listener(interrupt)
    with pytest.raises(_Interrupt):
        entries[entry]()
    assert bulkhead.statistics().in_flight == 0


def test_a_wait_of_centuries_is_a_wait_for_a_slot() -> None:
    """``max_wait=1e10`` (past ``threading.TIMEOUT_MAX``) passed construction, then the
    first caller that had to wait failed with OverflowError; it waits like
    ``max_wait=inf``."""
    bulkhead = rs.Bulkhead(1, max_wait=1e10)
    holder = bulkhead.acquire_nowait()
    results: list[str] = []
    waiter = threading.Thread(target=lambda: results.append(bulkhead.call(lambda: "ran")))
    waiter.start()
    wait_until(lambda: bulkhead.statistics().waiting == 1)
    holder.release()
    waiter.join(5)
    assert results == ["ran"]


@pytest.mark.anyio
async def test_call_async_runs_a_mock_specced_from_a_plain_function() -> None:
    """``Mock(spec=fetch)`` of a plain ``def`` claims to be a function (its
    ``__class__``) with a mock for code flags: the generator check must not do
    arithmetic on them (it raised ``TypeError: unsupported operand type(s) for &``)."""
    from unittest.mock import Mock

    async def stub(url: str) -> str:
        return "stub"

    def fetch(url: str) -> Any:  # a plain def returning an awaitable
        return stub(url)

    bulkhead = rs.Bulkhead(1)
    fake = Mock(spec=fetch, side_effect=fetch)
    assert await bulkhead.call_async(fake, "u") == "stub"
    assert bulkhead.statistics().in_flight == 0
