"""How async callers on one event loop share a backend's connections (the lane).

A burst of callers on a cold backend must not open a connection each: every handshake
shares the event loop, so a hundred of them finish together, late (past a 50 ms
backend timeout on this 2-core machine: 86 of 100 cold decisions fell back before).
"""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from typing import Literal

import pytest
import redis

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

#: Connections a lane opens at once (resilience.backends._redis._MAX_OPENING).
MAX_OPENING = 4


def _connections(server: RedisServer, name: str) -> int:
    """Connections to ``server`` whose client name is ``name``."""
    with redis.Redis.from_url(server.url) as admin:
        return sum(1 for client in admin.client_list() if client["name"] == name)


def _limiter(
    backend: RedisBackend, name: str, mode: Literal["local", "open", "closed"]
) -> rs.RateLimiter:
    return rs.RateLimiter(
        "100000/s", key=lambda k: k, backend=backend, name=name, on_backend_error=mode
    )


def _backend(server: RedisServer, name: str, timeout: float) -> RedisBackend:
    return RedisBackend.from_url(server.url, timeout=timeout, client_name=name)


@pytest.mark.anyio
async def test_a_burst_on_a_cold_backend_shares_a_few_connections(
    redis_server: RedisServer,
) -> None:
    """200 concurrent first decisions open at most four connections, and every one of
    them is decided by Redis (a generous timeout: the count is under test, not speed)."""
    limiter = _limiter(_backend(redis_server, "lane-burst", 1.0), "burst", "closed")
    decisions = await asyncio.gather(*(limiter.try_acquire_async(f"k{i}") for i in range(200)))
    assert all(decisions)
    stats = limiter.statistics()
    assert (stats.round_trips, stats.backend_errors) == (200, 0)
    assert 1 <= _connections(redis_server, "lane-burst") <= MAX_OPENING


@pytest.mark.anyio
async def test_callers_cancelled_while_waiting_for_a_connection_lose_none(
    redis_server: RedisServer,
) -> None:
    """Callers cancelled while they open or wait for a connection (or just as one is
    handed to them) pass it on: the survivors are all decided by Redis, and a later
    burst finds the lane's connections (its first callers take the idle ones, the next
    few open more while the rest wait)."""
    limiter = _limiter(_backend(redis_server, "lane-cancel", 1.0), "cancel", "closed")
    tasks = [asyncio.ensure_future(limiter.try_acquire_async(f"k{i}")) for i in range(100)]
    for _ in range(3):
        await asyncio.sleep(0)
    for task in tasks[1::2]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    survivors = results[0::2]
    assert all(isinstance(r, rs.Decision) and r.allowed for r in survivors)
    assert all(isinstance(r, asyncio.CancelledError | rs.Decision) for r in results[1::2])
    assert limiter.statistics().backend_errors == 0
    later = await asyncio.gather(*(limiter.try_acquire_async(f"j{i}") for i in range(100)))
    assert all(later)
    assert limiter.statistics().backend_errors == 0
    assert 1 <= _connections(redis_server, "lane-cancel") <= 2 * MAX_OPENING


@pytest.mark.anyio
async def test_a_burst_on_a_paused_redis_ends_within_the_round_trip_bound(
    redis_server: RedisServer,
) -> None:
    """Waiting for a connection shares the handshake's budget: a cold burst on a paused
    Redis (its kernel still accepts connections) is over, every caller refused with
    BackendError ("closed" mode), within one round-trip bound, not one per queued
    opening."""
    backend = _backend(redis_server, "lane-paused", 0.05)
    limiter = _limiter(backend, "paused", "closed")
    redis_server.pause()
    try:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(limiter.try_acquire_async(f"k{i}") for i in range(50)), return_exceptions=True
        )
        elapsed = time.perf_counter() - started
    finally:
        redis_server.resume()
    assert all(isinstance(r, rs.BackendError) for r in results)
    assert elapsed < backend.round_trip_bound + 0.25  # slack for a loaded machine


@pytest.mark.anyio
async def test_connections_the_server_closed_are_replaced_a_few_at_a_time(
    redis_server: RedisServer,
) -> None:
    """After the server closed the lane's idle connections (a restart, CLIENT KILL, its
    idle timeout), the next burst does not reconnect each of them at once: the first
    caller to find one closed drops the others, and the burst reconnects as a cold one
    does, every decision still Redis'."""
    backend = _backend(redis_server, "lane-killed", 1.0)
    limiter = _limiter(backend, "killed", "closed")
    for wave in range(16):  # each burst leaves a few more idle connections behind
        await asyncio.gather(*(limiter.try_acquire_async(f"w{wave}-{i}") for i in range(100)))
    idle = _connections(redis_server, "lane-killed")
    assert idle > 2 * MAX_OPENING
    with redis.Redis.from_url(redis_server.url) as admin:
        for client in admin.client_list():
            if client["name"] == "lane-killed":
                admin.client_kill_filter(_id=client["id"])
    decisions = await asyncio.gather(*(limiter.try_acquire_async(f"k{i}") for i in range(200)))
    assert all(decisions)
    assert limiter.statistics().backend_errors == 0
    assert 1 <= _connections(redis_server, "lane-killed") <= 2 * MAX_OPENING


class _StrictConnection(redis.asyncio.Connection):
    """A user's connection class that takes only the options it names (no
    ``driver_info``, which redis-py 8's own classes take)."""

    def __init__(self, *, host: str, port: int, **options: object) -> None:
        options.pop("driver_info", "absent")  # what a stricter class would refuse
        assert "driver_info" not in options
        super().__init__(host=host, port=port, **options)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_users_connection_class_gets_only_its_own_options(
    redis_server: RedisServer,
) -> None:
    """The lane builds connections of the client's own class with the client's own
    options: a user's class is not handed the ``driver_info`` that saves redis-py's
    classes a version lookup per connection."""
    built: list[dict[str, object]] = []

    class Recording(_StrictConnection):
        def __init__(self, **options: object) -> None:
            built.append(options)
            super().__init__(**options)  # type: ignore[arg-type]

    pool = redis.asyncio.ConnectionPool(
        connection_class=Recording, host="127.0.0.1", port=redis_server.port
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    limiter = _limiter(RedisBackend(async_client=client, timeout=1.0), "strict", "closed")
    assert await limiter.try_acquire_async("k")
    assert built
    assert all("driver_info" not in options for options in built)
    await client.aclose()


@pytest.mark.anyio
async def test_aclose_closes_even_a_connection_in_use(redis_server: RedisServer) -> None:
    """``await backend.aclose()`` while a decision is on its way: that decision still
    gets its answer, and its connection is closed as it ends, not left to the garbage
    collector by the closed lane (redis-py then warned "unclosed Connection")."""
    from resilience.testing import FaultProxy

    with FaultProxy(redis_server.port) as proxy, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        backend = RedisBackend.from_url(
            proxy.url("redis", "/0"), timeout=1.0, client_name="lane-aclose"
        )
        limiter = _limiter(backend, "aclose", "closed")
        assert await limiter.try_acquire_async("warm")
        proxy.latency = 0.2
        pending = asyncio.ensure_future(limiter.try_acquire_async("k"))
        await asyncio.sleep(0.05)  # the command is out, its answer on its way
        await backend.aclose()
        assert await pending
        del pending
        gc.collect()
    # (other tests' unclosed backends may be collected here too: only ours counts)
    assert [w for w in caught if "lane-aclose" in str(w.message)] == []
    for _ in range(100):  # the server notices a closed socket shortly after
        if _connections(redis_server, "lane-aclose") == 0:
            break
        await asyncio.sleep(0.01)
    assert _connections(redis_server, "lane-aclose") == 0


@pytest.mark.anyio
async def test_a_connection_handed_to_a_caller_giving_up_after_aclose_is_closed(
    redis_server: RedisServer,
) -> None:
    """A connection handed to a waiting caller in the same loop step as the backend is
    closed and that caller is cancelled is closed, not parked in the closed lane's idle
    list (nobody would close it: redis-py warned "unclosed Connection" at collection).

    White-box: the three events must land in one loop step, which no public call can
    arrange on purpose, so the lane is driven directly."""
    from resilience.backends._redis import _MAX_OPENING, _Lane

    client = redis.asyncio.Redis.from_url(redis_server.url)
    lane = _Lane.for_client(client, 1.0)
    assert lane is not None
    lane._opening = _MAX_OPENING  # four openings under way: the next caller waits
    waiting = asyncio.ensure_future(lane._connection(asyncio.get_running_loop().time() + 1.0))
    await asyncio.sleep(0)
    conn = lane._make()
    await conn.connect()
    lane._hand_over(conn)  # the waiter's future holds conn now
    await lane.close()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert lane._idle == []
    assert not conn.is_connected
    await client.aclose()
