"""Exact half-open probes and exact counts under concurrency (asyncio, trio, threads)."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time

import anyio
import pytest

import resilience as rs
from resilience.breaker import CircuitBreaker, CircuitState
from resilience.testing import FakeClock

PROBES = 3


def half_open_breaker(clock: FakeClock) -> CircuitBreaker:
    breaker = CircuitBreaker(
        consecutive_failures=1, open_for=10, half_open_calls=PROBES, clock=clock
    )
    breaker.open()
    clock.advance(10)
    assert breaker.state is CircuitState.HALF_OPEN
    return breaker


@pytest.mark.anyio
async def test_200_tasks_get_exactly_the_probes(fake_clock: FakeClock) -> None:
    """200 concurrent tasks hit a HALF_OPEN breaker: exactly half_open_calls run."""
    breaker = half_open_breaker(fake_clock)
    admitted = 0
    rejected = 0
    release = anyio.Event()

    async def probe() -> str:
        nonlocal admitted
        admitted += 1
        await release.wait()  # keep every probe in flight while the others try
        return "ok"

    async def caller() -> None:
        nonlocal rejected
        try:
            await breaker.call_async(probe)
        except rs.CircuitOpen:
            rejected += 1
        if admitted + rejected == 200:
            release.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(caller)
    assert (admitted, rejected) == (PROBES, 200 - PROBES)
    assert breaker.state is CircuitState.CLOSED


def test_32_threads_get_exactly_the_probes(fake_clock: FakeClock) -> None:
    """32 threads hit a HALF_OPEN breaker at once: exactly half_open_calls run."""
    breaker = half_open_breaker(fake_clock)
    start = threading.Barrier(32)
    release = threading.Event()
    lock = threading.Lock()
    tally = {"admitted": 0, "rejected": 0}

    def probe() -> str:
        with lock:
            tally["admitted"] += 1
        release.wait(5)
        return "ok"

    def caller() -> None:
        start.wait(5)
        try:
            breaker.call(probe)
        except rs.CircuitOpen:
            with lock:
                tally["rejected"] += 1
        with lock:
            if tally["admitted"] + tally["rejected"] == 32:
                release.set()

    threads = [threading.Thread(target=caller) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert tally == {"admitted": PROBES, "rejected": 32 - PROBES}
    assert breaker.state is CircuitState.CLOSED


@pytest.mark.parametrize(
    "window",
    [{"window": 1_000_000}, {"window_type": "time", "window": 60.0}],
    ids=["count", "time"],
)
def test_lock_free_counting_is_exact_under_threads(
    fake_clock: FakeClock, window: dict[str, object]
) -> None:
    """8 threads of mixed outcomes: the window counts every call exactly once."""
    breaker = CircuitBreaker(failure_rate=1.0, min_calls=100, clock=fake_clock, **window)  # type: ignore[arg-type]
    per_thread, failures_every = 5_000, 50

    def worker() -> None:
        for index in range(per_thread):
            if index % failures_every == 0:
                permit = breaker.acquire_nowait()
                permit.failure()
            else:
                breaker.call(int)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats = breaker.statistics()
    assert stats.state is CircuitState.CLOSED
    assert stats.calls == 8 * per_thread
    assert stats.failures == 8 * per_thread // failures_every


def test_transitions_reach_listeners_in_the_order_they_happened() -> None:
    """A trip's report waits on a slow listener (a log handler on a slow sink); an
    operator closes the breaker meanwhile. Listeners hear the trip, then the close:
    the last event they get is the breaker's state (they used to hear the close first
    and the trip last, and a state view built from events showed OPEN for good)."""
    breaker = CircuitBreaker(consecutive_failures=1, failure_rate=None, open_for=30)
    reporting_the_trip = threading.Event()
    operator_done = threading.Event()
    heard: list[tuple[str, str]] = []

    def slow_listener(event: object) -> None:
        if isinstance(event, rs.BreakerStateChanged) and event.new == "open":
            reporting_the_trip.set()
            operator_done.wait(5)

    def record(event: object) -> None:
        if isinstance(event, rs.BreakerStateChanged):
            heard.append((event.old, event.new))

    breaker.add_listener(slow_listener)
    breaker.add_listener(record)

    def trip() -> None:
        with pytest.raises(ZeroDivisionError):
            breaker.call(lambda: 1 / 0)

    tripping = threading.Thread(target=trip)
    tripping.start()
    assert reporting_the_trip.wait(5)
    breaker.close()  # after the trip, while its report is still being delivered
    operator_done.set()
    tripping.join(5)
    assert breaker.state is rs.CircuitState.CLOSED
    assert heard == [("closed", "open"), ("open", "closed")]


def test_events_form_a_chain_under_threads() -> None:
    """Six threads trip, probe and close one breaker thousands of times: every
    state-change event starts where the previous one ended."""
    breaker = CircuitBreaker(consecutive_failures=1, failure_rate=None, open_for=0.0005)
    heard: list[tuple[str, str]] = []
    breaker.add_listener(
        lambda e: heard.append((e.old, e.new)) if isinstance(e, rs.BreakerStateChanged) else None
    )
    stop = time.monotonic() + 0.5

    def hammer() -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            with contextlib.suppress(ZeroDivisionError, rs.CircuitOpen):
                breaker.call(lambda: 1 / 0 if n % 3 == 0 else 1)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=hammer) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    state = breaker.state.value  # may report an elapsed cool-down first
    assert len(heard) > 10
    assert all(prev[1] == this[0] for prev, this in itertools.pairwise(heard))
    assert heard[-1][1] == state


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_listener_runs_still_reports_its_changes() -> None:
    """A prefork server forks while another thread is inside a breaker's listener: in
    the child that thread does not exist, and the breaker must report its changes
    there all the same (it fell silent for good: no events, no fleet reports)."""
    breaker = CircuitBreaker(consecutive_failures=1, failure_rate=None, open_for=60)
    inside, release = threading.Event(), threading.Event()
    parent = os.getpid()

    def slow_listener(event: object) -> None:
        if isinstance(event, rs.BreakerStateChanged) and os.getpid() == parent:
            inside.set()
            release.wait(5)

    heard: list[str] = []
    breaker.add_listener(slow_listener)
    breaker.add_listener(
        lambda e: heard.append(e.new) if isinstance(e, rs.BreakerStateChanged) else None
    )
    opening = threading.Thread(target=breaker.open)
    opening.start()
    assert inside.wait(5)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what its listeners hear, then leave at once
        try:
            heard.clear()
            breaker.close()
            with contextlib.suppress(ZeroDivisionError):
                breaker.call(lambda: 1 / 0)
            os.write(write_end, ",".join(heard).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    release.set()
    opening.join(5)
    os.waitpid(pid, 0)
    with os.fdopen(read_end) as pipe:
        assert pipe.read() == "closed,open"
