"""Many processes and threads hammer one key: the admitted count is exact.

Redis ``TIME`` is the host's wall clock, which the workers also read: each admitted
decision is bracketed by ``time.time_ns()`` before and after the call, so the Redis
times of the first and last admission are known to within one round trip. The count
must lie within ``[bound - 1, bound]`` of ``burst + rate * elapsed``, and never above
the bound computed with the widest bracket (zero over-admission).

Default: 4 processes x 2 threads for 1.5 s. ``RESILIENCE_CHAOS_LONG=1``: 8 x 4 for 5 s.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from resilience.testing import RedisServer

pytestmark = pytest.mark.redis

LONG = os.environ.get("RESILIENCE_CHAOS_LONG", "") not in ("", "0")
PROCESSES, THREADS, SECONDS = (8, 4, 5.0) if LONG else (4, 2, 1.5)
AMOUNT, BURST = 50, 5  # 50/s: one round trip of timing slack is far below one token


def _worker(url: str, start_ns: int, end_ns: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import resilience as rs
    from resilience.backends import RedisBackend

    limiter = rs.RateLimiter(
        rs.Rate(AMOUNT, 1.0),
        burst=BURST,
        backend=RedisBackend.from_url(url, timeout=1.0),
        on_backend_error="closed",
        name="hammer",
    )
    limiter.try_acquire("warm-up", cost=0)
    lock = threading.Lock()
    brackets: list[tuple[int, int]] = []

    def hammer() -> None:
        mine = []
        while time.time_ns() < start_ns:
            time.sleep(0.0005)
        while True:
            before = time.time_ns()
            if before >= end_ns:
                break
            decision = limiter.try_acquire("the-key")
            if decision.allowed:
                mine.append((before, time.time_ns()))
            else:
                time.sleep(min(decision.retry_after, 0.002))
        with lock:
            brackets.extend(mine)

    threads = [threading.Thread(target=hammer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = limiter.statistics()
    results.put((brackets, stats.round_trips, stats.denial_cache_hits))


def test_processes_and_threads_hammering_one_key(redis_server: RedisServer) -> None:
    """Zero over-admission and no lost tokens across processes, measured on Redis' clock."""
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    start_ns = time.time_ns() + 700_000_000  # time for every worker to connect
    end_ns = start_ns + int(SECONDS * 1e9)
    workers = [
        context.Process(target=_worker, args=(redis_server.url, start_ns, end_ns, results))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=SECONDS + 30) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
        assert worker.exitcode == 0
    brackets = [bracket for found, _, _ in collected for bracket in found]
    admitted = len(brackets)
    first_lo, first_hi = min(b for b, _ in brackets), min(a for _, a in brackets)
    last_lo, last_hi = max(b for b, _ in brackets), max(a for _, a in brackets)
    widest = BURST + AMOUNT * (last_hi - first_lo) / 1e9
    narrowest = BURST + AMOUNT * (last_lo - first_hi) / 1e9
    assert admitted <= widest, (admitted, widest)  # zero over-admission
    assert admitted >= narrowest - 1, (admitted, narrowest)  # and nothing lost
    print(f"admitted {admitted}, bound in [{narrowest:.2f}, {widest:.2f}]")
    assert sum(hits for _, _, hits in collected) > 0  # the denial cache did its job
