"""The same limiter on a Redis Cluster of 3 masters started by the test.

Every decision touches one key with one hash tag, so it runs on one slot; keys of
different users spread over the masters. Skipped (loudly) without redis-server or
redis-cli, failing instead under RESILIENCE_REQUIRE_REDIS=1.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import FakeClock, RedisServer, RedisUnavailable, free_port
from resilience.testing._plugin import redis_required

pytestmark = pytest.mark.redis


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(200):
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RedisUnavailable("no free port pair for a cluster node")


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServer]]:
    """Three cluster-enabled masters joined with ``redis-cli --cluster create``."""
    cli = shutil.which("redis-cli")
    nodes: list[RedisServer] = []
    try:
        if cli is None:
            raise RedisUnavailable("redis-cli is not on PATH")
        for _ in range(3):
            node = RedisServer(port=_cluster_port(), extra_args=("--cluster-enabled", "yes"))
            nodes.append(node.start())
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        while not all("cluster_state:ok" in str(n.command("CLUSTER", "INFO")) for n in nodes):
            if time.monotonic() > deadline:
                raise RedisUnavailable("the cluster did not converge")
            time.sleep(0.05)
    except (RedisUnavailable, subprocess.SubprocessError) as exc:
        for node in nodes:
            node.stop()
        message = f"REDIS CLUSTER UNAVAILABLE: {exc}"
        if redis_required():
            pytest.fail(message)
        pytest.skip(message)
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
def backend(cluster: list[RedisServer]) -> RedisBackend:
    """A cluster backend on a fresh prefix (tests share the module's cluster)."""
    return RedisBackend.from_url(
        cluster[0].url, cluster=True, prefix=f"t{time.monotonic_ns()}", timeout=1.0
    )


def test_decisions_on_the_cluster(backend: RedisBackend, cluster: list[RedisServer]) -> None:
    """Burst, refusal and keys spread over the masters, one hash tag per key."""
    limiter = rs.RateLimiter("3/min", key=lambda user: user, backend=backend)
    users = [f"user-{i}" for i in range(30)]
    for user in users:
        assert [limiter.try_acquire(user).allowed for _ in range(4)] == [True, True, True, False]
    holders = [node for node in cluster if int(node.command("DBSIZE")) > 0]
    assert len(holders) >= 2  # the keys really live on several masters
    stats = limiter.statistics()
    assert stats.backend_errors == 0
    assert stats.admitted == 90


def test_script_flush_on_one_master_is_transparent(
    backend: RedisBackend, cluster: list[RedisServer]
) -> None:
    """NOSCRIPT from any master is handled by reloading on that master."""
    limiter = rs.RateLimiter("100/s", key=lambda user: user, backend=backend)
    for i in range(10):
        limiter.try_acquire(f"k{i}")
    for node in cluster:
        node.flush_scripts()
    assert all(limiter.try_acquire(f"k{i}").allowed for i in range(10))
    assert limiter.statistics().backend_errors == 0


def test_denial_cache_and_reservation_on_the_cluster(backend: RedisBackend) -> None:
    """The denial cache and reservations work unchanged."""
    clock = FakeClock()
    limiter = rs.RateLimiter("10/s", burst=1, backend=backend, clock=clock, max_wait=1)
    assert limiter.acquire("k").wait == 0.0
    assert limiter.acquire("k").wait == pytest.approx(0.1, abs=0.02)
    assert not limiter.try_acquire("k")
    assert not limiter.try_acquire("k")
    assert limiter.statistics().denial_cache_hits == 1


@pytest.mark.anyio
async def test_async_on_the_cluster(backend: RedisBackend) -> None:
    """Async decisions (redis.asyncio cluster client, or a thread on trio)."""
    limiter = rs.RateLimiter("2/min", backend=backend)
    results = [(await limiter.try_acquire_async("k")).allowed for _ in range(3)]
    assert results == [True, True, False]


@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window"])
def test_window_algorithms_on_the_cluster(backend: RedisBackend, algorithm: str) -> None:
    """limits' cluster storage serves the window algorithms."""
    limiter = rs.RateLimiter("2/min", backend=backend, algorithm=algorithm, name=algorithm)
    assert [limiter.try_acquire("k").allowed for _ in range(3)] == [True, True, False]


def _probes_with_its_master_paused(
    cluster: list[RedisServer], prefix: str, **options: Any
) -> tuple[RedisBackend, rs.RateLimiter, list[float]]:
    """A limiter on the cluster; the master holding its key paused: three decisions,
    each a probe of Redis (the FakeClock passes the probe backoff), and their times."""
    backend = RedisBackend.from_url(cluster[0].url, cluster=True, prefix=prefix, timeout=0.05)
    clock = FakeClock()
    limiter = rs.RateLimiter("100/s", backend=backend, clock=clock, **options)
    assert limiter.try_acquire("k").allowed
    (holder,) = [node for node in cluster if node.command("KEYS", f"{prefix}*")]
    holder.pause()
    probes = []
    try:
        for _ in range(3):
            started = time.perf_counter()
            assert limiter.try_acquire("k").allowed  # on_backend_error="local"
            probes.append(time.perf_counter() - started)
            clock.advance(1.0)  # the next call is a probe again
    finally:
        holder.resume()
    assert limiter.statistics().backend_errors == 3
    return backend, limiter, probes


def test_a_paused_master_costs_a_call_one_timeout(cluster: list[RedisServer]) -> None:
    """A decision for a key on a paused master fails after one backend timeout, then the
    failure mode answers: redis-py's default cluster retries (each waiting out the timeout
    again and re-reading the slot map) used to make it about 12 timeouts."""
    backend, _, probes = _probes_with_its_master_paused(cluster, f"p{time.monotonic_ns()}")
    # the best case shows the mechanism; the worst only has to show no hang
    assert min(probes) <= backend.timeout + 0.02
    assert max(probes) <= backend.timeout + 0.25


def test_a_paused_master_costs_a_window_decision_no_retries(cluster: list[RedisServer]) -> None:
    """The window algorithms' own cluster client (limits' storage) makes no retries
    either: a decision on a paused master used to take about 0.6 s (redis-py's default
    retries, each waiting out the timeout) where the token bucket took 50 ms."""
    backend, _, probes = _probes_with_its_master_paused(
        cluster, f"w{time.monotonic_ns()}", algorithm="fixed-window"
    )
    assert max(probes) <= backend.round_trip_bound + 0.1


def test_window_algorithms_use_the_backends_client_options(cluster: list[RedisServer]) -> None:
    """A password given to ``from_url`` reaches the window algorithms' cluster client
    too (it was dropped: building the limiter raised an authentication error while the
    token bucket on the same backend worked)."""
    for node in cluster:
        node.command("CONFIG", "SET", "requirepass", "s3cret")
    try:
        backend = RedisBackend.from_url(
            cluster[0].url, cluster=True, password="s3cret", prefix=f"a{time.monotonic_ns()}"
        )
        limiter = rs.RateLimiter("2/min", backend=backend, algorithm="moving-window", name="pw")
        assert [limiter.try_acquire("k").allowed for _ in range(3)] == [True, True, False]
        assert limiter.statistics().backend_errors == 0
    finally:
        for node in cluster:
            redis.Redis(port=node.port, password="s3cret").config_set("requirepass", "")


def test_the_first_async_decisions_on_a_new_loop_reach_the_cluster(
    cluster: list[RedisServer],
) -> None:
    """A new event loop gets a new async cluster client, which must first read the slot
    map and command table (tens of milliseconds, more on a busy host). That happens in
    the background while the sync client decides: no decision falls back to the local
    twin for it, even at a 50 ms timeout (they used to, on a busy host)."""
    import asyncio

    backend = RedisBackend.from_url(
        cluster[0].url, cluster=True, prefix=f"i{time.monotonic_ns()}", timeout=0.05
    )
    limiter = rs.RateLimiter("3/min", backend=backend)

    async def two_decisions() -> list[bool]:
        return [(await limiter.try_acquire_async("k")).allowed for _ in range(2)]

    outcomes = [allowed for _ in range(3) for allowed in asyncio.run(two_decisions())]
    assert outcomes == [True, True, True, False, False, False]  # one shared bucket
    assert limiter.statistics().backend_errors == 0


def test_a_tls_cluster_url_gives_the_window_client_tls(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rediss://`` means TLS to the backend's own cluster client (redis-py reads the
    scheme); limits' cluster storage does not, so the window client is told so (it
    connected in plain text, sending the password with it)."""
    import limits.storage

    seen: dict[str, Any] = {}

    class Built(Exception):
        pass

    def storage(uri: str, **options: Any) -> None:
        seen.update(options, uri=uri)
        raise Built

    monkeypatch.setattr(limits.storage, "RedisClusterStorage", storage)
    assert backend._url is not None
    monkeypatch.setattr(backend, "_url", backend._url.replace("redis://", "rediss://", 1))
    with pytest.raises(Built):
        rs.RateLimiter("2/min", backend=backend, algorithm="fixed-window", name="tls")
    assert seen["ssl"] is True
    assert seen["uri"].startswith("redis+cluster://")
