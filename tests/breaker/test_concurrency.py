"""Exact half-open probes and exact counts under concurrency (asyncio, trio, threads)."""

from __future__ import annotations

import threading

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
