"""A decision whose reply Redis sent in time is Redis's, though the event loop was busy.

``asyncio.timeout`` is wall-clock time on the loop: when a burst holds the loop past
the deadline, the reply sits unread in the socket, and the due timer used to cancel
the call before the reply was read (every such decision fell back). The lane's
timeouts let what already arrived be read first, on asyncio and on uvloop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

pytestmark = pytest.mark.redis


def _limiter(backend: RedisBackend, mode: Literal["local", "closed"]) -> rs.RateLimiter:
    return rs.RateLimiter(
        "100000/s", key=lambda k: k, backend=backend, name="stall", on_backend_error=mode
    )


def _stall_loop(seconds: float) -> None:
    """Hold the event loop as a burst of CPU-bound requests would (not a wait)."""
    time.sleep(seconds)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_reply_that_arrived_during_a_stalled_loop_is_not_a_timeout(
    redis_server: RedisServer, loop_kind: str
) -> None:
    """Redis answers within a millisecond, but the loop is busy for 0.15 s past the 50 ms
    timeout: the decision is still Redis's, not a fallback (``asyncio.timeout`` fired
    before the unread reply was delivered: every such decision fell back), on asyncio
    and on uvloop."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()

    async def main() -> rs.RateLimiterStatistics:
        backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
        limiter = _limiter(backend, "local")
        assert await limiter.try_acquire_async("warm")  # a connection, its handshake done
        for i in range(5):
            decision = asyncio.ensure_future(limiter.try_acquire_async(f"k{i}"))
            for _ in range(3):  # the command goes out; its reply is on its way
                await asyncio.sleep(0)
            _stall_loop(0.15)
            assert await decision
        stats = limiter.statistics()
        await backend.aclose()
        backend.close()
        return stats

    with runner:
        stats = runner.run(main())
    assert (stats.round_trips, stats.backend_errors) == (6, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_command_without_reply_still_times_out(redis_server: RedisServer) -> None:
    """A paused Redis never answers: the decision falls back after the timeout and the
    few loop passes the stalled-loop allowance adds, within the round-trip bound."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    limiter = _limiter(backend, "local")
    assert await limiter.try_acquire_async("warm")
    redis_server.pause()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await limiter.try_acquire_async("k")  # the local twin's answer
        elapsed = loop.time() - started
    finally:
        redis_server.resume()
    assert elapsed < backend.round_trip_bound + 0.25  # slack for a loaded machine
    assert limiter.statistics().backend_errors == 1
    await backend.aclose()
    backend.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_decision_cancelled_while_its_command_is_out_stays_cancelled(
    redis_server: RedisServer,
) -> None:
    """Cancelling a decision whose command Redis has not answered (paused) cancels it:
    no fallback is counted and no TimeoutError replaces the cancellation, and the next
    decision, Redis resumed, is Redis's again."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.5)
    limiter = _limiter(backend, "local")
    assert await limiter.try_acquire_async("warm")
    redis_server.pause()
    try:
        decision = asyncio.ensure_future(limiter.try_acquire_async("k"))
        await asyncio.sleep(0.05)  # the command is out, unanswered
        decision.cancel()
        with pytest.raises(asyncio.CancelledError):
            await decision
    finally:
        redis_server.resume()
    assert await limiter.try_acquire_async("k2")
    assert limiter.statistics().backend_errors == 0
    await backend.aclose()
    backend.close()
