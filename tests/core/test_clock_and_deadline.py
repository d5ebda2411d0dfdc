"""FakeClock and the ambient deadline."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import resilience as rs
from resilience.testing import FakeClock


def test_fake_clock_moves_only_when_told() -> None:
    """monotonic() changes through advance() and sleeps only."""
    clock = FakeClock(start=10)
    assert clock.monotonic() == 10
    clock.advance(2.5)
    clock.sleep(0.5)
    assert clock.monotonic() == 13
    assert clock.sleeps == [0.5]
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-1)


def test_fake_clock_fires_timers_in_order() -> None:
    """call_at callbacks run in time order when advance() passes them; cancelled ones don't."""
    clock = FakeClock()
    fired: list[tuple[str, float]] = []
    clock.call_at(2, lambda: fired.append(("b", clock.monotonic())))
    clock.call_at(1, lambda: fired.append(("a", clock.monotonic())))
    clock.call_at(1.5, lambda: fired.append(("x", 0))).cancel()
    clock.advance(3)
    assert fired == [("a", 1.0), ("b", 2.0)]


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=20))
@example([0.237, 1.26])  # 0.237 + (1.26 - 0.237) == 1.2600000000000002
def test_fake_clock_set_is_absolute(times: list[float]) -> None:
    """set(t) leaves the clock at exactly t (no drift from adding differences), may
    repeat the present, fires the timers due by then, and refuses the past."""
    clock = FakeClock()
    fired: list[float] = []
    for when in times:
        clock.call_at(when, lambda when=when: fired.append(when))
    for now in sorted(times):
        clock.set(now)
        clock.set(now)
        assert clock.monotonic() == now
    assert fired == sorted(times)
    if times and max(times) > 0:
        with pytest.raises(ValueError, match="never goes back"):
            clock.set(max(times) / 2)


@pytest.mark.anyio
async def test_fake_clock_async_sleep_is_instant() -> None:
    """sleep_async advances virtual time and returns at once (asyncio and trio)."""
    clock = FakeClock()
    await clock.sleep_async(3600)
    assert clock.monotonic() == 3600


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", True])
def test_fake_clock_refuses_time_that_is_not_a_finite_number(bad: object) -> None:
    """advance/set/sleep/call_at with NaN (a silent no-op that froze time), infinity (the
    end of time) or a non-number raise instead; the clock is left as it was."""
    clock = FakeClock(start=5.0)
    for method in (clock.advance, clock.set, clock.sleep):
        with pytest.raises(ValueError, match="finite"):
            method(bad)  # type: ignore[operator]
    with pytest.raises(ValueError, match="finite"):
        clock.call_at(bad, lambda: None)  # type: ignore[arg-type]
    assert clock.monotonic() == 5.0
    assert clock.sleeps == []


def test_deadlines_only_shrink(fake_clock: FakeClock) -> None:
    """A longer deadline inside a shorter one keeps the shorter."""
    assert rs.time_remaining() is None
    with rs.deadline(1.0, clock=fake_clock):
        with rs.deadline(5.0, clock=fake_clock):
            assert rs.time_remaining() == 1.0
        with rs.deadline(0.25, clock=fake_clock):
            assert rs.time_remaining() == 0.25
        fake_clock.advance(0.5)
        assert rs.time_remaining() == 0.5
    assert rs.current_deadline() is None


def test_negative_deadline_is_refused() -> None:
    """rs.deadline() needs a non-negative number of seconds."""
    with pytest.raises(rs.ConfigurationError), rs.deadline(-1):
        pass


@pytest.mark.parametrize("bad", [float("nan"), "1", None, True])
def test_a_deadline_that_is_not_a_number_is_refused(bad: object) -> None:
    """NaN used to be accepted: a deadline whose comparisons are all false, which never
    clamps anything and made ``time_remaining()`` NaN. Infinity stays allowed: no
    deadline at all."""
    with pytest.raises(rs.ConfigurationError), rs.deadline(bad):  # type: ignore[arg-type]
        pass
    with rs.deadline(float("inf")):
        assert rs.time_remaining() is None


@pytest.mark.parametrize(
    "build",
    [
        lambda clock: rs.Retry(on=OSError, clock=clock),
        lambda clock: rs.Timeout(1, clock=clock),
        lambda clock: rs.RateLimiter("1/s", clock=clock),
        lambda clock: rs.Bulkhead(1, clock=clock),
        lambda clock: rs.CircuitBreaker(clock=clock),
        lambda clock: rs.RetryBudget(clock=clock),
        lambda clock: rs.Faults(latency=0.01, latency_rate=0.5, clock=clock),
        lambda clock: rs.Fallback(None, clock=clock),
        lambda clock: rs.Pipeline(rs.Timeout(1), clock=clock),
    ],
)
def test_every_policy_refuses_a_clock_that_is_not_one(build: object) -> None:
    """A wrong ``clock=`` fails at construction, not at the first call."""
    assert callable(build)
    with pytest.raises(rs.ConfigurationError, match="clock must be a resilience Clock"):
        build("x")
    assert build(None) is not None
    assert build(FakeClock()) is not None


def test_system_clock_sleeps_of_centuries_go_to_the_os_in_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``time.sleep`` refuses waits of centuries (OverflowError, OSError): a Retry with
    ``backoff.constant(1e10)`` or a 1e10 s latency fault failed at their first sleep.
    Long sleeps are made of parts the OS takes, adding up to the whole."""
    import time

    from resilience._clock import SYSTEM_CLOCK

    parts: list[float] = []
    monkeypatch.setattr(time, "sleep", parts.append)
    SYSTEM_CLOCK.sleep(1e10)
    assert sum(parts) == pytest.approx(1e10)
    assert max(parts) <= 1e8
    parts.clear()
    SYSTEM_CLOCK.sleep(0.25)
    assert parts == [0.25]
