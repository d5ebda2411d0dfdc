"""The generic Redis seam: RedisBackend.key/script, NOSCRIPT, timeouts, BackendError."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

pytestmark = pytest.mark.redis

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def test_script_runs_and_survives_script_flush(redis_server: RedisServer) -> None:
    """run() is one EVALSHA; after SCRIPT FLUSH the script is re-sent transparently."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    script = backend.script(INCR)
    key = backend.key("counter")
    assert script.run([key], [5]) == 5
    redis_server.flush_scripts()
    assert script.run([key], [1]) == 6
    redis_server.reset_stats()
    assert script.run([key], [1]) == 7
    stats = redis_server.commandstats()
    assert stats["evalsha"] == 1
    assert "eval" not in stats
    assert "script|load" not in stats


@pytest.mark.anyio
async def test_run_async_on_asyncio_and_trio(redis_server: RedisServer) -> None:
    """run_async works on both event loops and also reloads flushed scripts."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    script = backend.script(INCR)
    key = backend.key("async-counter")
    assert await script.run_async([key], [2]) == 2
    redis_server.flush_scripts()
    assert await script.run_async([key], [3]) == 5


@pytest.mark.anyio
async def test_a_given_async_client_is_left_alone_on_trio(redis_server: RedisServer) -> None:
    """A backend built with both clients serves async policies on trio through the sync
    client in a worker thread (a redis.asyncio client cannot run there), as one built
    from a URL does; on asyncio it uses the given async client."""
    sync_client = redis.Redis.from_url(redis_server.url)
    async_client = redis.asyncio.Redis.from_url(redis_server.url)
    backend = RedisBackend(sync_client=sync_client, async_client=async_client, prefix="both")
    try:
        on_asyncio = asyncio._get_running_loop() is not None
        assert (backend.async_client() is async_client) is on_asyncio
        limiter = rs.RateLimiter("2/s", backend=backend)
        assert (await limiter.try_acquire_async(key="alice")).allowed
        windows = rs.RateLimiter("2/s", algorithm="sliding-window", backend=backend)
        assert (await windows.try_acquire_async(key="alice")).allowed
        bulkhead = rs.Bulkhead(1, backend=backend)
        async with bulkhead:
            assert bulkhead.statistics().shared_in_flight == 1
        assert bulkhead.statistics().shared_in_flight == 0
        statistics = limiter.statistics()
        assert (statistics.round_trips, statistics.fallback_decisions) == (1, 0)
    finally:
        if on_asyncio:
            await async_client.aclose()
        sync_client.close()


def test_async_clients_are_cached_per_event_loop(redis_server: RedisServer) -> None:
    """One redis.asyncio client per running loop: two asyncio.run() calls both work."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    script = backend.script(INCR)

    async def main() -> tuple[object, object]:
        client = backend.async_client()
        assert client is backend.async_client()
        await script.run_async([backend.key("c")], [1])
        return client, await script.run_async([backend.key("c")], [1])

    first_client, first = asyncio.run(main())
    second_client, second = asyncio.run(main())
    assert (first, second) == (2, 4)
    assert first_client is not second_client
    assert backend.async_client() is None  # no running loop


def test_keys_share_one_hash_tag_and_hash_unsafe_parts(redis_server: RedisServer) -> None:
    """key() wraps all parts in one hash tag; long, binary or odd parts are hashed."""
    backend = RedisBackend.from_url(redis_server.url, prefix="app")
    assert backend.key("rl", "api", "alice") == "app:{rl:api:alice}"
    long_key = backend.key("rl", "x" * 500)
    binary = backend.key("rl", b"\x00\xff{}")
    spaced = backend.key("rl", "evil key}{")
    for key in (long_key, binary, spaced):
        assert key.startswith("app:{rl:#")
        assert key.count("{") == 1
        assert key.count("}") == 1
        assert len(key) < 60
    assert backend.key("rl", "x" * 500) == long_key  # stable
    assert backend.key("rl", 7) == "app:{rl:7}"
    # bytes(True) is b"\x00": bools were hashed as those bytes, sharing their buckets
    assert backend.key("rl", True) == "app:{rl:True}"
    assert backend.key("rl", False) != backend.key("rl", b"")
    assert backend.key("rl", True) != backend.key("rl", b"\x00")
    with pytest.raises(rs.ConfigurationError):
        RedisBackend.from_url(redis_server.url, prefix="a{b}")
    with pytest.raises(rs.ConfigurationError):
        RedisBackend.from_url(redis_server.url, timeout=0)
    # Centuries overflowed the socket calls (OverflowError at the first decision, not
    # even a BackendError); a round-trip bound past an hour is a mistake.
    with pytest.raises(rs.ConfigurationError, match="<= 3600"):
        RedisBackend.from_url(redis_server.url, timeout=1e10)


def test_errors_are_backend_errors_with_cause(redis_server: RedisServer) -> None:
    """A dead server and a Lua error both surface as BackendError with the cause attached."""
    backend = RedisBackend.from_url(redis_server.url)
    broken = backend.script("return redis.call('NOPE')")
    with pytest.raises(rs.BackendError) as info:
        broken.run([backend.key("k")])
    assert isinstance(info.value.__cause__, redis.ResponseError)
    script = backend.script(INCR)
    redis_server.kill()
    with pytest.raises(rs.BackendError) as info:
        script.run([backend.key("k")], [1])
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_paused_server_costs_at_most_the_timeout_sync(redis_server: RedisServer) -> None:
    """SIGSTOP: every sync run fails after about the timeout, never hangs."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    script = backend.script(INCR)
    script.run([backend.key("k")], [1])
    redis_server.pause()
    try:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(rs.BackendError):
                script.run([backend.key("k")], [1])
            assert time.monotonic() - started < 1.0  # generous: "did not hang"
    finally:
        redis_server.resume()
    assert script.run([backend.key("k")], [1]) >= 2


@pytest.mark.anyio
async def test_paused_server_costs_at_most_the_timeout_async(redis_server: RedisServer) -> None:
    """SIGSTOP: async runs (asyncio client or trio worker thread) are cut at the timeout."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    script = backend.script(INCR)
    await script.run_async([backend.key("k")], [1])
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(rs.BackendError):
            await script.run_async([backend.key("k")], [1])
        assert time.monotonic() - started < 1.0
    finally:
        redis_server.resume()


def test_existing_clients_are_used(redis_server: RedisServer) -> None:
    """A backend built from your clients uses them (and the sync one for async via a thread)."""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.1)
    backend = RedisBackend(sync_client=client, prefix="mine")
    script = backend.script(INCR)
    assert script.run([backend.key("k")], [1]) == 1

    async def main() -> object:
        assert backend.async_client() is None
        return await script.run_async([backend.key("k")], [1])

    assert asyncio.run(main()) == 2
    assert client.get("mine:{k}") == b"2"
    with pytest.raises(rs.ConfigurationError):
        RedisBackend(prefix="x").sync_client


@pytest.mark.anyio
async def test_restart_is_transparent(redis_server: RedisServer) -> None:
    """After a restart (empty, no scripts) idle connections reconnect and the script reloads."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    script = backend.script(INCR)
    assert script.run([backend.key("k")], [1]) == 1
    assert await script.run_async([backend.key("k")], [1]) == 2
    redis_server.restart()
    assert script.run([backend.key("k")], [1]) == 1
    assert await script.run_async([backend.key("k")], [1]) == 2


def test_lua_errors_do_not_poison_connections(redis_server: RedisServer) -> None:
    """A script error leaves the connection usable; the next run answers correctly."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    broken = backend.script("return redis.error_reply('nope')")
    script = backend.script(INCR)
    for expected in (1, 2, 3):
        with pytest.raises(rs.BackendError):
            broken.run([backend.key("k")])
        assert script.run([backend.key("k")], [1]) == expected


def _child_runs(url_and_backend: tuple[RedisBackend, str], results: object) -> None:
    backend, key = url_and_backend
    script = backend.script(INCR)
    results.put([script.run([key], [1]) for _ in range(50)])  # type: ignore[attr-defined]


def test_forked_children_do_not_share_connections(redis_server: RedisServer) -> None:
    """A backend used before fork() works in the children without crossing replies."""
    import multiprocessing

    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    script = backend.script(INCR)
    key = backend.key("forked")
    script.run([key], [1])  # the parent now holds an idle connection
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [
        context.Process(target=_child_runs, args=((backend, key), results)) for _ in range(3)
    ]
    for child in children:
        child.start()
    parent = [script.run([key], [1]) for _ in range(50)]
    seen = parent + [value for _ in children for value in results.get(timeout=30)]
    for child in children:
        child.join(timeout=10)
    assert sorted(seen) == list(range(2, 2 + 200))  # every increment answered exactly once


def test_a_url_that_is_not_a_redis_url_is_a_configuration_error() -> None:
    """``from_url`` names the bad URL in a ConfigurationError (still a ValueError)."""
    with pytest.raises(rs.ConfigurationError, match="foo://x"):
        RedisBackend.from_url("foo://x")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6390/cache", "rediss://h:6390/1x"])
def test_a_url_path_that_is_not_a_database_number_is_refused(url: str) -> None:
    """redis-py would ignore such a path and use database 0 (perhaps another service's
    data): from_url refuses it by name instead."""
    with pytest.raises(rs.ConfigurationError, match="database number"):
        RedisBackend.from_url(url)
    assert RedisBackend.from_url("redis://127.0.0.1:6390/3")._url is not None


def test_finished_event_loops_leave_no_connection_behind(redis_server: RedisServer) -> None:
    """``asyncio.run()`` per job, 30 jobs: the clients of closed loops are dropped when
    a new loop needs one, so the process holds one connection, not one per job (each
    loop's client used to live for good, until Redis' maxclients refused everyone)."""
    import gc

    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    limiter = rs.RateLimiter("100000/s", backend=backend, name="loops", on_backend_error="closed")

    async def job() -> bool:
        return (await limiter.try_acquire_async("user")).allowed

    for _ in range(30):
        assert asyncio.run(job())
    gc.collect()
    assert len(backend._loop_clients) == 1
    deadline = time.monotonic() + 5
    while True:
        ours = len(redis.Redis.from_url(redis_server.url).client_list()) - 1
        if ours <= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ours <= 2


@pytest.mark.parametrize(
    "build",
    [
        lambda: RedisBackend(sync_client=5),
        lambda: RedisBackend(async_client="redis://localhost"),
        lambda: RedisBackend.from_url(None),  # type: ignore[arg-type]
        lambda: RedisBackend.from_url("redis://127.0.0.1:6390/0", foo=1),
    ],
)
def test_clients_and_options_are_checked_at_construction(build: Any) -> None:
    """Not a redis-py client, no URL, or an option redis-py refuses: a ConfigurationError
    when the backend is built (an AttributeError or TypeError at the first decision
    used to bypass on_backend_error)."""
    with pytest.raises(rs.ConfigurationError):
        build()
