"""One bulkhead shared by worker threads, asyncio tasks and trio tasks at the same time."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter

import pytest
import trio

import resilience as rs

pytestmark = pytest.mark.timeout(60)

LIMIT = 3
ROUNDS = 150
KEYS = ("a", "b")


def test_threads_asyncio_and_trio_share_one_bulkhead() -> None:
    """Concurrency per key stays <= the limit across worlds; everything is released."""
    bulkhead = rs.Bulkhead(LIMIT, max_wait=math.inf, key=lambda key, *_: key)
    lock = threading.Lock()
    active: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    done: Counter[str] = Counter()
    errors: list[BaseException] = []

    def enter(key: str) -> None:
        with lock:
            active[key] += 1
            peak[key] = max(peak[key], active[key])

    def leave(key: str, world: str) -> None:
        with lock:
            active[key] -= 1
            done[world] += 1

    def thread_worker(index: int) -> None:
        try:
            for i in range(ROUNDS):
                key = KEYS[(index + i) % 2]
                with bulkhead.acquire(key, priority=i % 3):
                    enter(key)
                    leave(key, "thread")
        except BaseException as exc:
            errors.append(exc)

    async def asyncio_worker(index: int) -> None:
        @bulkhead
        async def work(key: str, i: int) -> None:
            enter(key)
            await asyncio.sleep(0)
            leave(key, "asyncio")

        for i in range(ROUNDS):
            await work(KEYS[(index + i) % 2], i)

    async def trio_worker(index: int) -> None:
        for i in range(ROUNDS):
            key = KEYS[(index + i) % 2]
            async with await bulkhead.acquire_async(key):
                enter(key)
                await trio.sleep(0)
                leave(key, "trio")

    async def asyncio_main() -> None:
        await asyncio.gather(*(asyncio_worker(i) for i in range(4)))

    async def trio_main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(trio_worker, i)

    def run(target: object) -> None:
        try:
            target()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_worker, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=run, args=(lambda: asyncio.run(asyncio_main()),)))
    threads.append(threading.Thread(target=run, args=(lambda: trio.run(trio_main),)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(50)
    assert not errors
    assert all(not thread.is_alive() for thread in threads)
    assert done == {"thread": 4 * ROUNDS, "asyncio": 4 * ROUNDS, "trio": 4 * ROUNDS}
    assert max(peak.values()) <= LIMIT
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.waiting, stats.keys) == (0, 0, 0)
