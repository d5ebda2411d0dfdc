"""The pure per-host state: pacing from server signals, and latency quantiles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilience._http._latency import Latencies
from resilience._http._pace import Pace
from resilience._http._signals import Quota, Signals


def test_a_quiet_host_is_inactive_and_admits() -> None:
    """Nothing observed: no constraint and no clock needed on the fast path."""
    pace = Pace()
    assert not pace.active
    assert pace.admit(0.0) == 0.0


def test_quota_exhausted_pauses_until_reset() -> None:
    """r=0;t=5 pauses the host for 5 s, then it is free again."""
    pace = Pace()
    assert pace.observe(10.0, Signals(quota=Quota(0, 5.0)), retry_after_applies=False) == 5.0
    assert pace.admit(12.0) == 3.0
    assert pace.admit(15.0) == 0.0
    assert not pace.active


def test_remaining_quota_is_spent_then_waits() -> None:
    """r=2 admits two sends before the reset, then waits for it."""
    pace = Pace()
    pace.observe(0.0, Signals(quota=Quota(2, 10.0)), retry_after_applies=False)
    assert [pace.admit(1.0) for _ in range(3)] == [0.0, 0.0, 9.0]


def test_retry_after_applies_only_where_it_means_come_back_later() -> None:
    """Retry-After on a 200 (retry_after_applies=False) changes nothing."""
    pace = Pace()
    assert pace.observe(0.0, Signals(retry_after=3.0), retry_after_applies=False) == 0.0
    assert pace.admit(0.0) == 0.0
    assert pace.observe(0.0, Signals(retry_after=3.0), retry_after_applies=True) == 3.0
    assert pace.admit(1.0) == 2.0


def test_a_shorter_retry_after_does_not_shorten_a_pause() -> None:
    """Pauses only extend: a later, shorter Retry-After keeps the longer one."""
    pace = Pace()
    pace.observe(0.0, Signals(retry_after=10.0), retry_after_applies=True)
    assert pace.observe(1.0, Signals(retry_after=1.0), retry_after_applies=True) == 0.0
    assert pace.delay(1.0) == 9.0


@given(
    st.integers(0, 20),
    st.floats(0.1, 60.0),
    st.lists(st.floats(0.0, 100.0), max_size=60),
)
def test_quota_is_never_overspent(remaining: int, reset: float, times: list[float]) -> None:
    """Before the reset, at most ``remaining`` sends are admitted, whatever the timing."""
    pace = Pace()
    pace.observe(0.0, Signals(quota=Quota(remaining, reset)), retry_after_applies=False)
    admitted_early = 0
    for now in sorted(times):
        wait = pace.admit(now)
        assert wait >= 0.0
        if wait == 0.0 and now < reset:
            admitted_early += 1
        if wait > 0.0:
            assert now + wait == pytest.approx(reset)  # wait for the reset, no longer
    assert admitted_early <= remaining


def test_latency_quantiles_need_enough_samples() -> None:
    """No quantile (no hedging) until min_samples answers were timed."""
    latencies = Latencies(min_samples=20)
    for _ in range(19):
        latencies.record(0.01)
    assert latencies.quantile(0.95) is None
    latencies.record(0.01)
    assert latencies.quantile(0.95) == 0.01


@given(st.lists(st.floats(0.0, 10.0), min_size=20, max_size=300), st.floats(0.01, 0.99))
def test_latency_quantile_is_an_observed_sample(samples: list[float], q: float) -> None:
    """The quantile is one of the samples recorded, within their range; the ring is bounded."""
    latencies = Latencies(size=128, min_samples=20)
    for sample in samples:
        latencies.record(sample)
    value = latencies.quantile(q)
    assert value in samples
    assert len(latencies) == min(len(samples), 128)


def test_latency_quantile_follows_recent_samples() -> None:
    """Old samples age out: after a slow period, fast answers bring the quantile down."""
    latencies = Latencies(size=128, min_samples=20)
    for _ in range(128):
        latencies.record(1.0)
    assert latencies.quantile(0.5) == 1.0
    for _ in range(128):
        latencies.record(0.01)
    assert latencies.quantile(0.5) == 0.01
