"""MemoryBackend: bounded keyed state that never over-admits when it forgets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience.backends._memory import MemoryBuckets
from resilience.testing import FakeClock


def test_full_buckets_are_dropped(fake_clock: FakeClock) -> None:
    """Keys whose bucket has refilled are forgotten: idle keys cost no memory."""
    limiter = rs.RateLimiter("10/s", key=lambda k: k, clock=fake_clock)
    for i in range(100):
        limiter.try_acquire(f"user-{i}")
    assert limiter.statistics().keys == 100
    fake_clock.advance(0.1)  # every bucket is full again
    for i in range(60):
        limiter.try_acquire(f"new-{i}")  # each new key sweeps two full ones
    assert limiter.statistics().keys == 60
    assert limiter._buckets.expire() == 0


def test_expire_drops_only_full_buckets(fake_clock: FakeClock) -> None:
    """expire() drops refilled buckets and keeps the ones still spending tokens."""
    limiter = rs.RateLimiter("1/s", key=lambda k: k, clock=fake_clock)
    limiter.try_acquire("old")
    fake_clock.advance(0.5)
    limiter.try_acquire("young")
    fake_clock.advance(0.6)
    assert limiter._buckets.expire() == 1
    assert limiter.statistics().keys == 1
    assert not limiter.try_acquire("young").allowed  # refills at 1.5 s


def test_cap_never_over_admits(fake_clock: FakeClock) -> None:
    """Past max_keys, evicting a bucket that is not full never lets that key burst again."""
    backend = rs.backends.MemoryBackend(max_keys=3)
    limiter = rs.RateLimiter("1/min", key=lambda k: k, backend=backend, clock=fake_clock)
    assert limiter.try_acquire("victim").allowed
    for i in range(5):  # pushes "victim" out of the table
        limiter.try_acquire(f"flood-{i}")
    assert limiter.statistics().keys == 3
    assert limiter.statistics().evictions >= 1
    assert not limiter.try_acquire("victim").allowed  # still empty: not over-admitted
    fake_clock.advance(60)
    assert limiter.try_acquire("victim").allowed


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=1, max_value=4),
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 400_000)), max_size=80),
)
def test_bounded_table_keeps_every_key_within_the_bound(
    max_keys: int, seq: list[tuple[int, int]]
) -> None:
    """Whatever the cap and the key flood, each key's admissions stay within burst + rate*t."""
    clock = FakeClock()
    small = rs.RateLimiter(
        "2/s", key=lambda k: k, clock=clock, backend=rs.backends.MemoryBackend(max_keys=max_keys)
    )
    admitted: dict[int, list[int]] = {}
    t = 0
    for key, delta in seq:
        t += delta
        if delta:
            clock.set(t / 1e6)
        if small.try_acquire(key).allowed:
            admitted.setdefault(key, []).append(t)
        assert small.statistics().keys <= max_keys
    for times in admitted.values():
        for i, start in enumerate(times):
            for count, end in enumerate(times[i:], start=1):
                assert count * 1_000_000 <= 2 * 1_000_000 + 2 * (end - start)


def test_bad_backend_arguments() -> None:
    """MemoryBackend validates max_keys."""
    with pytest.raises(rs.ConfigurationError, match="max_keys"):
        rs.backends.MemoryBackend(max_keys=0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from(["3/s", "10/5s", "1000/s"]),
    burst=st.integers(1, 5),
    max_keys=st.integers(1, 4),
    steps=st.lists(
        st.tuples(st.integers(0, 800_000), st.sampled_from("abcde")), min_size=1, max_size=60
    ),
)
def test_take_one_decides_exactly_as_take(
    rate: str, burst: int, max_keys: int, steps: list[tuple[int, str]]
) -> None:
    """The middleware's lean take_one(key) and take(key, 1, 0) make the same decisions and
    leave the same state, also when the key cap evicts (two tables, one clock)."""
    clock = FakeClock()

    def buckets() -> MemoryBuckets:
        backend = rs.backends.MemoryBackend(max_keys=max_keys)
        limiter = rs.RateLimiter(rate, burst=burst, key=lambda k: k, backend=backend, clock=clock)
        return limiter._buckets  # type: ignore[no-any-return]

    lean, full = buckets(), buckets()
    for advance_us, key in steps:
        clock.advance(advance_us / 1e6)
        got, want = lean.take_one(key), full.take(key, 1, 0)
        if isinstance(got, int):
            assert want.allowed
            assert lean.gcra.admitted_state(got) == (want.remaining, want.reset_after)
        else:
            assert got == want
        assert lean._tats == full._tats
        assert lean._floor == full._floor


def test_a_clock_that_reads_negative_still_starts_buckets_full() -> None:
    """0 stood for "full", which a clock reading -100 s (a FakeClock(start=-100))
    took for 100 s ahead: every new key, the unkeyed bucket and a reset key were
    refused for 100 s."""
    clock = FakeClock(start=-100.0)
    unkeyed = rs.RateLimiter("10/s", clock=clock)
    keyed = rs.RateLimiter("10/s", key=lambda user: user, clock=clock)
    assert unkeyed.try_acquire().remaining == 9
    assert keyed.try_acquire("new").remaining == 9
    keyed.try_acquire("new", cost=9)
    keyed.reset("new")
    assert keyed.try_acquire("new").remaining == 9


def test_resets_stay_within_max_keys(fake_clock: FakeClock) -> None:
    """reset() of 10,000 distinct keys (a login recipe resetting every user) used to
    store each one, past MemoryBackend(max_keys=...); an absent key is already full."""
    limiter = rs.RateLimiter(
        "5/min",
        key=lambda user: user,
        backend=rs.backends.MemoryBackend(max_keys=100),
        clock=fake_clock,
    )
    for n in range(10_000):
        limiter.reset(f"user{n}")
    assert limiter.statistics().keys == 0
    for n in range(500):  # a flood of distinct keys, so that the cap's floor is raised
        limiter.try_acquire(f"flood{n}", cost=5)
    for n in range(10_000):  # resets while new keys start conservatively: still capped
        limiter.reset(f"user{n}")
    keys = limiter.statistics().keys
    assert keys is not None
    assert keys <= 100
    assert limiter.try_acquire("user9999").remaining == 4  # the reset key is full
