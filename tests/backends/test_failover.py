"""The shared on_backend_error machinery: health, probing with backoff, events, counters."""

from __future__ import annotations

import itertools

import pytest

import resilience as rs
from resilience.backends import Failover
from resilience.testing import FakeClock


def _failover(mode: str = "local") -> tuple[Failover, FakeClock, list[rs.Event]]:
    clock = FakeClock()
    owner = rs.PolicyBase(name="owner")
    events: list[rs.Event] = []
    owner.add_listener(events.append)
    return Failover(mode, owner=owner, clock=clock), clock, events


def test_probes_with_doubling_backoff_capped_at_one_second() -> None:
    """After a failure one caller per interval may try again: 50 ms, 100 ms, ... 1 s."""
    failover, clock, _ = _failover()
    assert failover.use_backend()
    failover.failed(rs.BackendError("down"), key="k")
    probes = []
    for _ in range(40_000):  # 40 s of 1 ms steps
        clock.advance(0.001)
        if failover.use_backend():
            probes.append(round(clock.monotonic(), 3))
            failover.failed(rs.BackendError("still down"))
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(probes)]
    assert probes[0] == pytest.approx(0.05, abs=0.0015)
    assert gaps[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0], abs=0.0015)
    assert gaps[5:] == pytest.approx([1.0] * len(gaps[5:]), abs=0.0015)


def test_recovery_emits_and_resets_the_backoff() -> None:
    """A successful probe ends the episode: BackendRecovered, counters, fast probing again."""
    failover, clock, events = _failover()
    failover.failed(rs.BackendError("down"), key="k")
    assert not failover.use_backend()
    failover.fallback("k")
    clock.advance(0.05)
    assert failover.use_backend()
    failover.succeeded()
    assert failover.healthy
    assert failover.use_backend()
    assert [type(e).__name__ for e in events] == [
        "BackendFallback",
        "BackendFallback",
        "BackendRecovered",
    ]
    assert events[0].mode == "local"
    assert events[0].key == "k"
    assert isinstance(events[1].error, rs.BackendError)
    stats = failover.statistics()
    assert stats == {
        "on_backend_error": "local",
        "backend_healthy": True,
        "backend_errors": 1,
        "fallback_decisions": 2,
        "backend_recoveries": 1,
    }
    failover.failed(rs.BackendError("again"))
    clock.advance(0.05)
    assert failover.use_backend()  # backoff restarted at 50 ms


def test_closed_mode_raises_backend_error_with_cause() -> None:
    """raise_closed() raises the documented BackendError, chaining the backend's own error."""
    failover, _, _ = _failover("closed")
    original = ConnectionError("refused")
    try:
        raise rs.BackendError("redis script failed") from original
    except rs.BackendError as exc:
        failover.failed(exc)
    with pytest.raises(rs.BackendError) as info:
        failover.raise_closed()
    assert info.value.__cause__ is original


def test_mode_is_validated() -> None:
    """Unknown modes are configuration errors naming on_backend_error."""
    with pytest.raises(rs.ConfigurationError, match="on_backend_error"):
        Failover("sometimes", owner=rs.PolicyBase(), clock=FakeClock())
