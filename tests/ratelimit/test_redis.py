"""RateLimiter on a real Redis: one EVALSHA per decision, Redis time, denial cache."""

from __future__ import annotations

import time
from typing import Any

import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import FakeClock, RedisServer

pytestmark = pytest.mark.redis


def test_burst_then_refusal_in_one_round_trip_each(redis_server: RedisServer) -> None:
    """Each decision is exactly one EVALSHA; Redis' TIME drives the bucket."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    limiter = rs.RateLimiter("3/min", backend=backend, name="api")
    limiter.try_acquire("warm-up")  # loads the script (one EVAL after NOSCRIPT)
    redis_server.reset_stats()
    decisions = [limiter.try_acquire("alice") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[3].retry_after == pytest.approx(20.0, abs=0.5)
    assert decisions[2].reset_after == pytest.approx(60.0, abs=0.5)
    stats = redis_server.commandstats()
    assert stats["evalsha"] == 4
    assert "eval" not in stats
    assert limiter.statistics().round_trips == 5


def test_keys_are_hash_tagged_and_expire_when_full(redis_server: RedisServer) -> None:
    """Keys carry one hash tag, hash unsafe user keys, and expire (PX) when the bucket refills."""
    backend = RedisBackend.from_url(redis_server.url, prefix="app", timeout=1.0)
    limiter = rs.RateLimiter("2/10s", backend=backend, name="dl")
    limiter.try_acquire("example.com")
    limiter.try_acquire(b"\x00binary\xff")
    keys = sorted(redis_server.command("KEYS", "*"))
    assert keys[0].startswith("app:{rl:dl:2/10000000/2:#")
    assert keys[1] == "app:{rl:dl:2/10000000/2:example.com}"
    assert 4_900 <= redis_server.command("PTTL", keys[1]) <= 5_000  # one token = 5 s to full


def test_matches_the_memory_semantics(redis_server: RedisServer) -> None:
    """cost, peek (cost 0) and cost above burst behave as in memory."""
    limiter = rs.RateLimiter(
        "10/s", burst=5, backend=RedisBackend.from_url(redis_server.url, timeout=1.0)
    )
    assert limiter.try_acquire("k", cost=4).remaining == 1
    assert limiter.try_acquire("k", cost=0).remaining == 1
    refused = limiter.try_acquire("k", cost=3)
    assert not refused
    assert refused.retry_after == pytest.approx(0.2, abs=0.01)
    with pytest.raises(rs.ConfigurationError):
        limiter.try_acquire("k", cost=6)


def test_odd_rates_stay_exact(redis_server: RedisServer) -> None:
    """Emission intervals that are not whole microseconds (3/s) are exact in Lua too."""
    limiter = rs.RateLimiter(
        "3/s", burst=1, backend=RedisBackend.from_url(redis_server.url, timeout=1.0)
    )
    started = time.perf_counter()
    limiter.try_acquire("k")
    refused = limiter.try_acquire("k", cost=1)
    # Redis's clock runs between the two decisions: a loaded machine spends ms there.
    elapsed = time.perf_counter() - started
    for seconds in (refused.retry_after, refused.reset_after):
        assert 1 / 3 - elapsed - 0.002 <= seconds <= 1 / 3 + 0.002


@pytest.mark.parametrize(("rate", "burst"), [("1/year", 4), ("3/year", 12)])
def test_a_refill_of_years_is_answered_like_in_memory(
    redis_server: RedisServer, rate: str, burst: int
) -> None:
    """A bucket that refills over more than 10^14 us (about 3.2 years): Lua printed such
    numbers as 1.26144e+14 and the reply failed to parse (a ValueError after the tokens
    were taken); Redis now answers as memory does."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    on_redis = rs.RateLimiter(rate, burst=burst, backend=backend, on_backend_error="closed")
    in_memory = rs.RateLimiter(rate, burst=burst)
    for limiter in (on_redis, in_memory):
        assert limiter.try_acquire("k", cost=burst).allowed
        refused = limiter.try_acquire("k")
        assert not refused
        assert refused.reset_after == pytest.approx(126_144_000, abs=1)


@pytest.mark.parametrize(
    ("rate", "burst", "fits"),
    [
        ("1/hour", 1_000_000, True),  # 3.6e15 us to refill: exact in Lua
        ("1/year", 100, True),
        ("3/s", 10**8, True),  # a fractional interval (1/3 s)
        ("70000/day", 70_000, True),  # fractional, a day to refill: an everyday quota
        ("700000/day", 700_000, True),
        ("1/hour", 10_000_000, False),  # 3.6e16 us: past 2**52
        ("1/year", 200, False),
        ("3/s", 10**12, False),
    ],
)
def test_a_burst_too_long_to_refill_for_lua_is_refused_at_construction(
    redis_server: RedisServer, rate: str, burst: int, fits: bool
) -> None:
    """The script's state is a Lua double, exact below 2**53: a burst that takes
    centuries to refill was accepted, then decided wrongly (a full bucket refusing its
    burst, then admitting more; ``remaining`` above the burst) or failed in Redis. It
    is refused when the limiter is built; a burst that fits answers as in memory."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    if not fits:
        with pytest.raises(rs.ConfigurationError, match="too long to refill"):
            rs.RateLimiter(rate, burst=burst, backend=backend)
        return
    on_redis = rs.RateLimiter(rate, burst=burst, backend=backend, on_backend_error="closed")
    in_memory = rs.RateLimiter(rate, burst=burst)
    for limiter in (on_redis, in_memory):
        taken = limiter.try_acquire("k", cost=burst)
        assert (taken.allowed, taken.remaining) == (True, 0)
        assert not limiter.try_acquire("k")


def test_numeric_keys_keep_their_own_bucket_whatever_the_call_history(
    redis_server: RedisServer,
) -> None:
    """1, 1.0 and True are equal as dict keys but name different Redis buckets: the
    client-side caches used to serve a cost-1 call of one with the bucket of whichever
    came first, while other costs used its own."""
    limiter = rs.RateLimiter(
        "5/minute", backend=RedisBackend.from_url(redis_server.url, timeout=1.0)
    )
    assert limiter.try_acquire(1.0, cost=2).remaining == 3
    assert limiter.try_acquire(1).remaining == 4
    assert limiter.try_acquire(1, cost=2).remaining == 2
    assert limiter.try_acquire(True).remaining == 4
    assert limiter.try_acquire(1.0, cost=0).remaining == 3


def test_reservations_book_exact_slots(redis_server: RedisServer) -> None:
    """With max_wait, successive callers get waits one emission interval apart."""
    clock = FakeClock()  # sleeps are virtual; Redis time is real
    limiter = rs.RateLimiter(
        "10/s",
        burst=1,
        max_wait=1.0,
        backend=RedisBackend.from_url(redis_server.url, timeout=1.0),
        clock=clock,
    )
    waits = [limiter.acquire("k").wait for _ in range(4)]
    assert waits[0] == 0.0
    for index, wait in enumerate(waits[1:], start=1):
        assert wait == pytest.approx(0.1 * index, abs=0.01)
    with pytest.raises(rs.RateLimited):
        limiter.acquire("k", max_wait=0.2)


def test_denial_cache_answers_repeat_refusals_locally(redis_server: RedisServer) -> None:
    """After a refusal, repeats are refused with no Redis round trip until retry_after."""
    clock = FakeClock()
    limiter = rs.RateLimiter(
        "1/min",
        backend=RedisBackend.from_url(redis_server.url, timeout=1.0),
        clock=clock,
        name="dc",
    )
    assert limiter.try_acquire("bob").allowed
    first_refusal = limiter.try_acquire("bob")
    assert not first_refusal
    redis_server.reset_stats()
    repeats = [limiter.try_acquire("bob") for _ in range(50)]
    assert not any(repeats)
    assert redis_server.commandstats().get("evalsha", 0) == 0
    assert limiter.statistics().denial_cache_hits == 50
    assert repeats[-1].retry_after <= first_refusal.retry_after
    assert limiter.try_acquire("bob", cost=0).allowed  # a peek still asks Redis
    assert limiter.try_acquire("carol").allowed  # other keys are unaffected
    clock.advance(first_refusal.retry_after)  # Redis counts real time, and so does the cache
    assert not limiter.try_acquire("bob")
    assert redis_server.commandstats()["evalsha"] == 2


def test_denial_cache_answers_each_cost_with_its_own_wait(redis_server: RedisServer) -> None:
    """Cached refusals carry the numbers Redis (and the memory backend) would give: a
    cost-2 request after a cost-1 refusal waits 40 s, not the cached 20 s, and
    ``reset_after`` is the time until full (both used to be the cost-1 refusal's
    ``retry_after``: a client that waited its Retry-After was refused again)."""
    redis_limiter = rs.RateLimiter(
        "3/min", backend=RedisBackend.from_url(redis_server.url, timeout=1.0), name="costs"
    )
    memory_limiter = rs.RateLimiter("3/min")
    for limiter in (redis_limiter, memory_limiter):
        for _ in range(3):
            assert limiter.try_acquire("u")
    costs = [1, 2, 3, 1, 0]
    redis_decisions = [redis_limiter.try_acquire("u", cost=c) for c in costs]
    memory_decisions = [memory_limiter.try_acquire("u", cost=c) for c in costs]
    assert redis_limiter.statistics().denial_cache_hits == 3  # costs 2, 3 and 1 again
    for cost, on_redis, in_memory in zip(costs, redis_decisions, memory_decisions, strict=True):
        assert on_redis.allowed == in_memory.allowed, cost
        assert on_redis.remaining == in_memory.remaining, cost
        assert on_redis.retry_after == pytest.approx(in_memory.retry_after, abs=0.5), cost
        assert on_redis.reset_after == pytest.approx(in_memory.reset_after, abs=0.5), cost
    assert [d.retry_after for d in redis_decisions[:3]] == pytest.approx([20, 40, 60], abs=0.5)


def test_denial_cache_follows_the_admissions_after_a_refusal(redis_server: RedisServer) -> None:
    """A cheaper request admitted after a cached refusal moves the bucket's refill time:
    the next cached refusal tells the time Redis would (it used to keep the older time,
    so a client that waited its Retry-After was refused again)."""
    redis_limiter = rs.RateLimiter(
        "10/min", burst=5, backend=RedisBackend.from_url(redis_server.url, timeout=1.0)
    )
    memory_limiter = rs.RateLimiter("10/min", burst=5)
    costs = [3, 3, 1, 3]  # admitted, refused (cached), admitted, refused from the cache
    redis_decisions = [redis_limiter.try_acquire("u", cost=c) for c in costs]
    memory_decisions = [memory_limiter.try_acquire("u", cost=c) for c in costs]
    assert [d.allowed for d in redis_decisions] == [True, False, True, False]
    assert redis_limiter.statistics().denial_cache_hits == 1
    for on_redis, in_memory in zip(redis_decisions, memory_decisions, strict=True):
        assert on_redis.allowed == in_memory.allowed
        assert on_redis.remaining == in_memory.remaining
        assert on_redis.retry_after == pytest.approx(in_memory.retry_after, abs=0.5)
        assert on_redis.reset_after == pytest.approx(in_memory.reset_after, abs=0.5)
    assert redis_decisions[-1].retry_after == pytest.approx(12, abs=0.5)  # not 6


def test_a_reset_during_a_refusal_in_flight_leaves_no_cached_refusal(
    redis_server: RedisServer,
) -> None:
    """A reset() that runs while a refusal is on its way into the denial cache (here:
    from inside the cache's own clock read, the last step before it writes) wins: the
    next request finds the full burst (that refusal used to be cached after the reset,
    and the key refused locally for its whole refill)."""
    limiter = rs.RateLimiter(
        "5/15min", backend=RedisBackend.from_url(redis_server.url, timeout=1.0), name="login"
    )
    for _ in range(5):
        assert limiter.try_acquire("alice")
    buckets: Any = limiter._buckets.primary  # type: ignore[union-attr]
    clock = buckets._monotonic
    raced: list[bool] = []

    def reading_the_clock() -> float:
        if not raced:
            raced.append(True)
            limiter.reset("alice")  # "another thread", just before the cache write
        return clock()

    buckets._monotonic = reading_the_clock
    try:
        assert not limiter.try_acquire("alice")  # refused by Redis, before the reset
    finally:
        buckets._monotonic = clock
    assert raced == [True]
    decision = limiter.try_acquire("alice")
    assert decision.allowed
    assert decision.remaining == 4


def test_denial_cache_expires_in_real_time_like_redis(redis_server: RedisServer) -> None:
    """A refusal really waited out is not refused again from the cache, even when the
    limiter runs on a FakeClock (Redis' TIME is real, whatever the limiter's clock)."""
    limiter = rs.RateLimiter(
        "20/s",
        burst=1,
        backend=RedisBackend.from_url(redis_server.url, timeout=1.0),
        clock=FakeClock(),
    )
    assert limiter.try_acquire("k")
    refusal = limiter.try_acquire("k")
    assert not refusal
    assert not limiter.try_acquire("k")
    assert limiter.statistics().denial_cache_hits == 1
    time.sleep(refusal.retry_after + 0.01)  # Redis time cannot be faked: wait it out
    assert limiter.try_acquire("k")


@pytest.mark.anyio
async def test_async_on_asyncio_and_trio(redis_server: RedisServer) -> None:
    """try_acquire_async, the async decorator and `async with` work on both loops."""
    limiter = rs.RateLimiter("2/min", backend=RedisBackend.from_url(redis_server.url, timeout=1.0))

    @limiter
    async def work() -> str:
        return "ok"

    assert await work() == "ok"
    async with limiter as decision:
        assert decision.remaining == 0
    with pytest.raises(rs.RateLimited):
        await work()
    assert not await limiter.try_acquire_async()


@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window", "sliding-window"])
def test_window_algorithms_on_redis(redis_server: RedisServer, algorithm: str) -> None:
    """limits' window strategies serve the same API on the same Redis."""
    limiter = rs.RateLimiter(
        "3/min", backend=RedisBackend.from_url(redis_server.url, timeout=1.0), algorithm=algorithm
    )
    decisions = [limiter.try_acquire("k") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[1].remaining == 1
    assert decisions[3].limit == 3
    assert 0 < decisions[3].retry_after <= 60
    assert limiter.try_acquire("other").allowed
    # Two storage operations per decision (hit or test, then the window's statistics);
    # statistics() used to say 0.
    assert limiter.statistics().round_trips == 2 * 5


@pytest.mark.anyio
@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window"])
async def test_window_algorithms_async(redis_server: RedisServer, algorithm: str) -> None:
    """Async window decisions go through limits.aio's redis-py bridge (or a thread on trio)."""
    limiter = rs.RateLimiter(
        "2/min", backend=RedisBackend.from_url(redis_server.url, timeout=1.0), algorithm=algorithm
    )
    results = [(await limiter.try_acquire_async("k")).allowed for _ in range(3)]
    assert results == [True, True, False]


@pytest.mark.anyio
@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window", "sliding-window"])
async def test_a_fresh_key_s_first_hit_is_not_reported_full(
    redis_server: RedisServer, algorithm: str
) -> None:
    """A key's first request uses one of five: its window is full again later, not now
    (a sliding window on Redis said reset_after 0, ``RateLimit: r=4;t=0``, on most fresh
    keys: limits reads a fresh key's expiry modulo its period)."""
    limiter = rs.RateLimiter(
        "5/10s", backend=RedisBackend.from_url(redis_server.url, timeout=1.0), algorithm=algorithm
    )
    decisions = [await limiter.try_acquire_async(f"fresh{i}") for i in range(20)]
    decisions += [limiter.try_acquire(f"sync{i}") for i in range(20)]
    assert {d.remaining for d in decisions} == {4}
    assert all(0 < d.reset_after <= 20 for d in decisions), [d.reset_after for d in decisions]


def test_a_fixed_window_refusal_at_its_end_waits_for_its_end(redis_server: RedisServer) -> None:
    """Refused under half a second before a fixed window ends (Redis' TTL reads 0 then):
    told to come back at about its end (the slack), not a whole period later."""
    limiter = rs.RateLimiter(
        "3/2s",
        backend=RedisBackend.from_url(redis_server.url, timeout=1.0),
        algorithm="fixed-window",
        name="edge",
    )
    assert all(limiter.try_acquire("k").allowed for _ in range(3))
    [window] = [k for k in redis_server.command("KEYS", "*") if "edge" in str(k)]
    deadline = time.monotonic() + 5
    while redis_server.command("PTTL", window) > 300:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    refused = limiter.try_acquire("k")
    assert not refused.allowed
    assert refused.reset_after < 0.5
    assert refused.retry_after <= 0.6


def test_window_keys_are_hashed_unless_short_and_plain(redis_server: RedisServer) -> None:
    """A long key with a newline reaches Redis hashed, like the token bucket's (window
    algorithms used to paste it raw into the Redis key); a plain short key stays
    readable."""
    import redis

    backend = RedisBackend.from_url(redis_server.url, timeout=1.0, prefix="wk")
    limiter = rs.RateLimiter("5/hour", backend=backend, algorithm="fixed-window", name="win")
    evil = "evil key\n" + "x" * 5000
    assert limiter.try_acquire(evil)
    assert limiter.try_acquire("alice")
    keys = sorted(redis.Redis.from_url(redis_server.url).keys("wk*"))
    assert len(keys) == 2
    assert all(len(key) < 100 and b"\n" not in key for key in keys)
    assert any(b"/alice/" in key for key in keys)


@pytest.mark.parametrize("algorithm", ["token-bucket", "fixed-window", "moving-window"])
def test_reset_on_redis_is_seen_by_every_process(redis_server: RedisServer, algorithm: str) -> None:
    """Two limiters on two backends (two processes) share a key; ``reset`` on one makes
    the bucket full for both, and forgets the key in its own denial cache. (A process
    that had refused the key itself may refuse it from its cache until that refusal's
    ``retry_after``: documented.)"""

    def limiter() -> rs.RateLimiter:
        backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
        return rs.RateLimiter("2/min", backend=backend, name="reset", algorithm=algorithm)

    first, second = limiter(), limiter()
    assert first.try_acquire("k", cost=2)
    assert not first.try_acquire("k")
    assert second.try_acquire("k", cost=0).remaining == 0
    first.reset("k")
    assert first.try_acquire("k")
    assert second.try_acquire("k")
    assert not second.try_acquire("k")


@pytest.mark.anyio
async def test_reset_async_on_redis(redis_server: RedisServer) -> None:
    """``reset_async`` deletes the shared bucket from asyncio and trio."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    limiter = rs.RateLimiter("1/min", backend=backend, name="reset-async")
    assert await limiter.try_acquire_async("k")
    assert not await limiter.try_acquire_async("k")
    await limiter.reset_async("k")
    assert await limiter.try_acquire_async("k")


def test_reset_raises_when_redis_is_down(redis_server: RedisServer) -> None:
    """An administrative reset that cannot reach Redis says so (BackendError) rather than
    pretending; the local twin is reset all the same."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    limiter = rs.RateLimiter("1/min", backend=backend, name="reset-down")
    redis_server.kill()
    with pytest.raises(rs.BackendError):
        limiter.reset("k")


def test_a_refusal_in_flight_during_a_reset_is_not_cached(redis_server: RedisServer) -> None:
    """A refusal Redis computed before reset() deleted the bucket, arriving after it,
    used to land in the denial cache: this process then refused the key for the whole
    refill period (an hour at "1/h") while Redis held it full."""
    limiter = rs.RateLimiter(
        "1/h", key=lambda k: k, backend=RedisBackend.from_url(redis_server.url, timeout=1.0)
    )
    assert limiter.try_acquire("k")
    primary = limiter._buckets.primary  # type: ignore[attr-defined]
    run = primary._run

    def reply_after_a_reset(call: object) -> object:
        reply = run(call)  # the refusal, computed now
        primary._run = run
        limiter.reset("k")  # another thread's reset lands before the reply is read
        return reply

    primary._run = reply_after_a_reset
    assert not limiter.try_acquire("k")
    assert limiter.try_acquire("k")  # Redis holds it full: no stale cached refusal


def test_an_unhashable_key_spends_no_token(redis_server: RedisServer) -> None:
    """A list as the key fails with TypeError before the round trip, whatever the cost
    (with a cost above 1 the script ran, spending the token, and the caller got a
    TypeError from the denial cache instead of a decision)."""
    backend = rs.backends.RedisBackend.from_url(redis_server.url, prefix="unhashable")
    limiter = rs.RateLimiter("1/min", backend=backend, burst=2, name="u")
    for cost in (1, 2):
        with pytest.raises(TypeError, match="unhashable"):
            limiter.try_acquire(["example.com"], cost=cost)  # type: ignore[arg-type]
    assert limiter.statistics().round_trips == 0
    assert limiter.try_acquire("['example.com']", cost=2).allowed
