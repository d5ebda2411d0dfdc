"""resilience.testing.strategies: valid fault schedules, shrinkable and replayable."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience import chaos
from resilience.testing import FakeClock, FaultProxy
from resilience.testing import strategies as rst

CLOCK = FakeClock()


@given(window=rst.windows(horizon=10.0, periodic=True))
def test_windows_are_valid_and_start_within_the_horizon(window: chaos.Window) -> None:
    """Every drawn window starts in [0, horizon) and contains its own start."""
    assert 0.0 <= window.start < 10.0
    assert window.contains(window.start)
    assert not window.contains(window.start - 1e-6)


@given(schedule=rst.schedules(max_windows=2, always=False))
def test_schedules_without_always_have_windows(schedule: tuple[chaos.Window, ...] | None) -> None:
    """always=False never draws None."""
    assert schedule is not None
    assert 1 <= len(schedule) <= 2


@given(fault=rst.fault_specs(kinds=("latency", "error")))
def test_fault_specs_of_the_requested_kinds(fault: chaos.Fault) -> None:
    """kinds= restricts what is drawn."""
    assert isinstance(fault, chaos.Latency | chaos.Error)
    assert 0.0 <= fault.rate <= 1.0


@settings(max_examples=50)
@given(injector=rst.faults(clock=CLOCK, max_faults=2, max_latency=0.5), data=st.data())
def test_drawn_injectors_only_raise_their_exceptions(injector: rs.Faults, data: Any) -> None:
    """A drawn injector returns, replaces, sleeps or raises InjectedFault; nothing else."""
    assert 1 <= len(injector.faults) <= 2
    with chaos.enabled():
        for _ in range(5):
            CLOCK.advance(data.draw(st.floats(min_value=0, max_value=30)))
            try:
                injector.call(lambda: "ok")
            except rs.InjectedFault:
                pass


@given(fault=rst.http_faults())
def test_http_faults_are_accepted_by_the_transport(fault: chaos.Fault) -> None:
    """Every drawn HTTP fault builds a FaultyTransport."""
    chaos.FaultyTransport(faults=fault, seed=1)


def test_proxy_faults_apply_to_a_proxy() -> None:
    """Each proxy condition is valid keyword arguments of FaultProxy.set."""
    with FaultProxy(1) as proxy:

        @settings(max_examples=30)
        @given(condition=rst.proxy_faults())
        def apply(condition: dict[str, Any]) -> None:
            proxy.heal()
            proxy.set(**condition)

        apply()


@given(phases=rst.network_phases(kinds=("latency", "blackhole"), max_phases=3))
def test_network_phases_are_bounded_timelines(phases: list[tuple[float, dict[str, Any]]]) -> None:
    """network_phases draws 1..max_phases (duration, condition) pairs."""
    assert 1 <= len(phases) <= 3
    for seconds, condition in phases:
        assert 0.05 <= seconds <= 1.0
        assert set(condition) <= {"latency", "blackhole"}


def test_unknown_kinds_are_rejected() -> None:
    """Typos in kinds fail loudly."""
    with pytest.raises(ValueError, match="unknown proxy fault kinds"):
        rst.proxy_faults(kinds=("latncy",))
    with pytest.raises(ValueError, match="kinds must name"):
        rst.fault_specs(kinds=())
