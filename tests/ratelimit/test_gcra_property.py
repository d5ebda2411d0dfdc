"""The token bucket is exact: it admits everything the bound allows and nothing more.

For any arrival sequence, admitted cost in any closed interval of length t is at most
``burst + rate * t`` (safety), and a refused request would have broken that bound for
some interval ending at its arrival (exactness). Times are whole microseconds driven by
a FakeClock; the bound is checked in exact integer arithmetic.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience.testing import FakeClock

configs = st.tuples(
    st.integers(min_value=1, max_value=12),  # amount
    st.integers(min_value=1, max_value=3_000_000),  # period in µs
    st.integers(min_value=1, max_value=12),  # burst
)
arrivals = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=400_000),  # µs since the previous arrival
        st.integers(min_value=1, max_value=12),  # cost (clipped to the burst)
    ),
    min_size=1,
    max_size=60,
)


def _violates(
    admitted: list[tuple[int, int]], t: int, cost: int, amount: int, period: int, burst: int
) -> bool:
    """Whether adding ``cost`` at ``t`` breaks the bound for some interval ending at ``t``."""
    total = cost
    for s, c in reversed(admitted):  # admitted is in time order; s <= t
        total += c
        if total * period > burst * period + amount * (t - s):
            return True
    return cost * period > burst * period  # the interval [t, t]


@settings(max_examples=300, deadline=None)
@given(configs, arrivals)
def test_admits_exactly_what_the_bound_allows(
    config: tuple[int, int, int], seq: list[tuple[int, int]]
) -> None:
    """Every admission keeps every interval within the bound; every refusal would break it."""
    amount, period_us, burst = config
    clock = FakeClock()
    limiter = rs.RateLimiter(rs.Rate(amount, period_us / 1e6), burst=burst, clock=clock)
    assert limiter.rate.period_us == period_us
    admitted: list[tuple[int, int]] = []
    t = 0
    for delta, raw_cost in seq:
        t += delta
        if delta:
            clock.set(t / 1e6)
        cost = min(raw_cost, burst)
        decision = limiter.try_acquire(cost=cost)
        would_violate = _violates(admitted, t, cost, amount, period_us, burst)
        assert decision.allowed is not would_violate, (t, cost, admitted)
        if decision.allowed:
            admitted.append((t, cost))


class _OverlappingClock(FakeClock):
    """A FakeClock whose sleeps do not advance it: reservations of many callers overlap."""

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


@settings(max_examples=150, deadline=None)
@given(configs, arrivals, st.integers(min_value=0, max_value=2_000_000))
def test_reservations_never_exceed_the_bound(
    config: tuple[int, int, int], seq: list[tuple[int, int]], max_wait_us: int
) -> None:
    """With max_wait, the *execution* times of admitted reservations respect the bound.

    Each arrival is another caller (sleeps do not move the clock), so reservations
    overlap. Waits are rounded up to whole microseconds, so execution times are
    compared with the bound of the interval widened by that 1 µs of quantization.
    """
    amount, period_us, burst = config
    clock = _OverlappingClock()
    limiter = rs.RateLimiter(rs.Rate(amount, period_us / 1e6), burst=burst, clock=clock)
    executed: list[tuple[int, int]] = []
    t = 0
    for delta, raw_cost in seq:
        t += delta
        if delta:
            clock.set(t / 1e6)
        cost = min(raw_cost, burst)
        before = len(clock.sleeps)
        try:
            decision = limiter.acquire(cost=cost, max_wait=max_wait_us / 1e6)
        except rs.RateLimited as refused:
            retry_after = refused.retry_after
        else:
            retry_after = None
        if retry_after is not None:  # refused: the slot is further away than max_wait
            assert retry_after > max_wait_us / 1e6
            continue
        waited = sum(clock.sleeps[before:])
        assert waited == decision.wait <= max_wait_us / 1e6
        executed.append((t + round(waited * 1e6), cost))
    executed.sort()
    for i, (s, _) in enumerate(executed):
        total = 0
        for e, c in executed[i:]:
            total += c
            assert total * period_us <= burst * period_us + amount * (e - s + 1)


@settings(max_examples=100, deadline=None)
@given(configs, st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 300_000)), max_size=60))
def test_keys_are_independent_buckets(
    config: tuple[int, int, int], seq: list[tuple[str, int]]
) -> None:
    """A keyed limiter decides each key exactly as a dedicated unkeyed limiter would."""
    amount, period_us, burst = config
    clock = FakeClock()
    rate = rs.Rate(amount, period_us / 1e6)
    keyed = rs.RateLimiter(rate, burst=burst, key=lambda k: k, clock=clock)
    single = {k: rs.RateLimiter(rate, burst=burst, clock=clock) for k in "abc"}
    for key, delta in seq:
        clock.advance(delta / 1e6)
        assert keyed.try_acquire(key).allowed == single[key].try_acquire().allowed
