"""Window algorithms from limits, in memory, behind the RateLimiter API."""

from __future__ import annotations

import pytest

import resilience as rs


@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window", "sliding-window"])
def test_window_algorithms_in_memory(algorithm: str) -> None:
    """Each window admits the rate's amount, then refuses with retry_after within the window."""
    limiter = rs.RateLimiter("3/min", algorithm=algorithm, key=lambda user: user)
    guarded = limiter(lambda user: user)
    assert [guarded("a") for _ in range(3)] == ["a", "a", "a"]
    with pytest.raises(rs.RateLimited) as info:
        guarded("a")
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 60
    assert guarded("b") == "b"
    assert limiter.try_acquire("c", cost=3).remaining == 0
    assert limiter.statistics().algorithm == algorithm


def test_window_peek_and_cost() -> None:
    """cost=0 tests without hitting; cost above the amount is refused at once."""
    limiter = rs.RateLimiter("2/s", algorithm="moving-window")
    assert limiter.try_acquire(cost=0).remaining == 2
    assert limiter.try_acquire(cost=2).allowed
    assert not limiter.try_acquire(cost=0).allowed
    with pytest.raises(rs.ConfigurationError):
        limiter.try_acquire(cost=3)


@pytest.mark.parametrize(
    "algorithm", ["token-bucket", "fixed-window", "moving-window", "sliding-window"]
)
def test_an_unused_window_is_full_now(algorithm: str) -> None:
    """A key with nothing counted is full: ``reset_after`` 0 for every algorithm (the
    moving window said a whole period, so a peek's ``RateLimit`` field said ``t=60``)."""
    limiter = rs.RateLimiter("5/min", algorithm=algorithm)
    peek = limiter.try_acquire("fresh", cost=0)
    assert (peek.allowed, peek.remaining, peek.reset_after) == (True, 5, 0.0)
    taken = limiter.try_acquire("used", cost=1)
    assert taken.remaining == 4
    assert 0 < taken.reset_after <= 60


def test_window_configuration_errors() -> None:
    """Windows need whole-second periods and take no separate burst."""
    with pytest.raises(rs.ConfigurationError, match="whole number of seconds"):
        rs.RateLimiter("5/250ms", algorithm="fixed-window")
    with pytest.raises(rs.ConfigurationError, match="burst"):
        rs.RateLimiter("5/s", burst=10, algorithm="fixed-window")


@pytest.mark.anyio
async def test_window_async_in_memory() -> None:
    """The async API works with in-memory windows on asyncio and trio."""
    limiter = rs.RateLimiter("1/min", algorithm="fixed-window")
    async with limiter:
        pass
    with pytest.raises(rs.RateLimited):
        await limiter.acquire_async()


def test_a_moving_window_never_sends_a_costly_request_back_too_early() -> None:
    """Three hits fill a "3/min" moving window; a cost-2 request needs two of them to
    expire, so its ``retry_after`` is the window (an upper bound), not the time until
    the oldest hit expires (which it used to be: waiting that long was refused again).
    A cost-1 request needs just the oldest one: its wait is exact."""
    limiter = rs.RateLimiter("3/min", algorithm="moving-window")
    assert limiter.try_acquire(cost=3)
    refused_two = limiter.try_acquire(cost=2)
    refused_one = limiter.try_acquire(cost=1)
    assert not refused_two
    assert not refused_one
    assert refused_two.retry_after == 60
    assert 59 < refused_one.retry_after <= 60


def test_a_sliding_window_never_sends_a_costly_request_back_too_early() -> None:
    """A full "4/2s" sliding window and a cost-2 request: limits tells when one slot
    frees, and waiting that long was refused again. Its retry_after is now the bound
    period * (1 + cost/amount): the current count turns into the previous one within a
    period, which then decays by cost/amount of itself in period * cost/amount."""
    limiter = rs.RateLimiter("4/2s", algorithm="sliding-window")
    assert limiter.try_acquire(cost=4)
    refused_two = limiter.try_acquire(cost=2)
    refused_one = limiter.try_acquire(cost=1)
    assert not refused_two
    assert not refused_one
    assert refused_two.retry_after == pytest.approx(3.0)
    assert 0 < refused_one.retry_after <= 2.0


def test_names_and_keys_with_separators_never_share_a_window() -> None:
    """limits joins name and key with "/": limiter "api" with key "v2/alice" and limiter
    "api/v2" with key "alice" used to count in one window."""
    from limits.storage import MemoryStorage

    from resilience.ratelimit._rate import Rate
    from resilience.ratelimit._windows import WindowBuckets

    storage = MemoryStorage()
    first = WindowBuckets("fixed-window", Rate.parse("1/min"), storage, name="api", local=True)
    second = WindowBuckets("fixed-window", Rate.parse("1/min"), storage, name="api/v2", local=True)
    assert first.take("v2/alice", 1, 0).allowed
    assert second.take("alice", 1, 0).allowed


def test_the_unkeyed_window_is_no_key_s_window() -> None:
    """The key ``None`` (the limiter's one unkeyed window) used to be stored as "-", so
    a client keyed "-" spent the unkeyed window's quota."""
    limiter = rs.RateLimiter("1/min", algorithm="fixed-window")
    assert limiter.try_acquire("-")
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert not limiter.try_acquire("-")


@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window", "sliding-window"])
def test_in_memory_windows_keep_at_most_max_keys(algorithm: str) -> None:
    """MemoryBackend(max_keys=...) caps windows too: 5,000 distinct keys within one
    window leave at most the cap in limits' storage (least recently used cleared
    first), and a key in use keeps its count."""
    limiter = rs.RateLimiter(
        "2/hour", algorithm=algorithm, backend=rs.backends.MemoryBackend(max_keys=100)
    )
    storage = limiter._buckets._strategy.storage  # type: ignore[attr-defined]
    assert limiter.try_acquire("hot", cost=2)
    for n in range(5_000):
        assert limiter.try_acquire(f"client-{n}")
        assert not limiter.try_acquire("hot")  # used every round: never the one cleared
    held = {*storage.storage, *storage.events}
    per_key = 2 if algorithm == "sliding-window" else 1  # this and the previous window
    assert 90 <= len(held) <= 100 * per_key


@pytest.mark.parametrize("algorithm", ["fixed-window", "moving-window", "sliding-window"])
def test_reset_clears_a_window(algorithm: str) -> None:
    """``reset(key)`` clears that key's window (limits' ``clear``) and no other."""
    limiter = rs.RateLimiter("2/min", algorithm=algorithm)
    for key in ("a", "b"):
        assert limiter.try_acquire(key, cost=2)
    limiter.reset("a")
    assert limiter.try_acquire("a", cost=2)
    assert not limiter.try_acquire("b")


def test_a_fixed_window_in_memory_holds_under_threads() -> None:
    """16 threads on a "3/s" fixed window for 1.5 s: at most 3 per window, so at most 6
    admissions in a span under 2 s. limits' MemoryStorage checks a window's expiry
    outside the lock it counts under, and threads used to wipe windows others had just
    started (15 admissions in 3.05 s, where 12 fit); decisions are now serialised."""
    import threading
    import time

    limiter = rs.RateLimiter("3/s", algorithm="fixed-window")
    admitted: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.5

    def hammer() -> None:
        mine: list[float] = []
        while time.monotonic() < stop:
            if limiter.try_acquire("k"):
                mine.append(time.monotonic())
        with lock:
            admitted.extend(mine)

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    span = max(admitted) - min(admitted)
    assert span < 2.0
    assert len(admitted) <= 6


def test_a_window_wait_is_reported_as_waited() -> None:
    """A window cannot reserve: ``acquire(max_wait=...)`` sleeps and asks again. That
    time is the call's wait, in ``CallAdmitted.waited`` and ``statistics().waited``
    (it used to be reported as 0: the wait-time histogram never saw it)."""
    import time

    limiter = rs.RateLimiter("2/s", algorithm="fixed-window", max_wait=3)
    waits: list[float] = []
    limiter.add_listener(
        lambda e: waits.append(e.waited) if isinstance(e, rs.CallAdmitted) else None
    )
    started = time.monotonic()
    for _ in range(3):
        limiter.acquire("k")
    blocked = time.monotonic() - started
    assert waits[:2] == [0.0, 0.0]
    assert 0.5 < waits[2] <= blocked + 0.01
    assert limiter.statistics().waited == 1


def test_a_key_flood_leaves_the_window_sweep_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """limits' in-memory storage sweeps expired windows on a timer thread that reads
    keys without a lock; the max_keys cap (and limits' own reads) remove keys under it.
    A flood of distinct keys used to crash that thread ("Exception in thread ...
    KeyError", over a dozen tracebacks in 3 s here); the sweep now lets such keys go."""
    import sys
    import threading
    import time

    crashes: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashes.append(repr(args.exc_value)))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # many more thread switches: the race shows at once
    try:
        limiter = rs.RateLimiter(
            "5/s", algorithm="moving-window", backend=rs.backends.MemoryBackend(max_keys=1000)
        )
        ends = time.monotonic() + 3.0
        n = 0
        while time.monotonic() < ends:
            limiter.try_acquire(key=f"k{n}")
            n += 1
    finally:
        sys.setswitchinterval(interval)
    assert n > 10_000
    assert crashes == []
    keys = limiter.statistics().keys
    assert keys is not None
    assert keys <= 1000
