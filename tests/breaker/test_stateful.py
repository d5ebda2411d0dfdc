"""The breaker against a reference model: random outcomes, durations and clock advances."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

import resilience as rs
from resilience.breaker import CircuitBreaker, CircuitState, Permit
from resilience.testing import FakeClock

from ._model import Admitted, Model, ModelConfig

LONG = os.environ.get("RESILIENCE_CHAOS_LONG") == "1"
# Times are multiples of 1/4 and bucket widths powers of two: all exact in binary.
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.75, 3.0])


@st.composite
def configs(draw: st.DrawFn, window_type: str) -> ModelConfig:
    if window_type == "count":
        window: float = draw(st.integers(1, 8))
        buckets = 10
        min_calls = draw(st.integers(1, int(window)))
    else:
        window = draw(st.sampled_from([1.0, 2.0, 4.0]))
        buckets = draw(st.sampled_from([1, 2, 4]))
        min_calls = draw(st.integers(1, 5))
    failure_rate = draw(st.sampled_from([None, 0.25, 0.5, 1.0]))
    slow_call = draw(st.sampled_from([None, 0.5]))
    consecutive = draw(st.sampled_from([None, 1, 2, 3]))
    if failure_rate is None and slow_call is None and consecutive is None:
        failure_rate = 0.5
    open_for = draw(st.sampled_from([1.0, 2.0]))
    return ModelConfig(
        failure_rate=failure_rate,
        window=window,
        window_type=window_type,
        buckets=buckets,
        min_calls=min_calls,
        slow_call=slow_call,
        slow_call_rate=draw(st.sampled_from([0.5, 1.0])),
        consecutive_failures=consecutive,
        open_for=open_for,
        open_for_max=draw(st.sampled_from([None, open_for * 3])),
        half_open_calls=draw(st.integers(1, 3)),
        max_half_open_wait=draw(st.sampled_from([None, 2.0])),
    )


class BreakerMachine(RuleBasedStateMachine):
    """Drive a real breaker and the model side by side; they must always agree."""

    window_type = "count"
    permits = Bundle("permits")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.model: Model
        self.breaker: CircuitBreaker

    @initialize(data=st.data())
    def build(self, data: st.DataObject) -> None:
        config = data.draw(configs(self.window_type))
        self.model = Model(config)
        self.breaker = CircuitBreaker(clock=self.clock, name="model", **config.kwargs())  # type: ignore[arg-type]

    @rule(target=permits)
    def acquire(self) -> object:
        now = self.clock.monotonic()
        expected = self.model.acquire(now)
        if isinstance(expected, Admitted):
            permit = self.breaker.acquire_nowait()
            return (permit, expected)
        with pytest.raises(rs.CircuitOpen) as caught:
            self.breaker.acquire_nowait()
        assert caught.value.retry_after == expected
        return multiple()

    @rule(
        entry=consumes(permits),
        outcome=st.sampled_from(["success", "failure", "ignored"]),
        duration=STEPS,
    )
    def complete(self, entry: tuple[Permit, Admitted], outcome: str, duration: float) -> None:
        permit, admitted = entry
        self.clock.advance(duration)
        self.model.settle(admitted, outcome, self.clock.monotonic())
        if outcome == "success":
            permit.success()
        elif outcome == "failure":
            permit.failure()
        else:
            permit.ignore()

    @rule(dt=STEPS)
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule(
        target_state=st.sampled_from(["closed", "open", "forced_open", "disabled", "metrics_only"])
    )
    def manual(self, target_state: str) -> None:
        self.model.manual(target_state, self.clock.monotonic())
        {
            "closed": self.breaker.close,
            "open": self.breaker.open,
            "forced_open": self.breaker.force_open,
            "disabled": self.breaker.disable,
            "metrics_only": self.breaker.metrics_only,
        }[target_state]()

    @invariant()
    def agrees_with_model(self) -> None:
        now = self.clock.monotonic()
        self.model.poll(now)
        assert self.breaker.state is CircuitState(self.model.state)
        stats = self.breaker.statistics()
        assert (stats.calls, stats.failures, stats.slow_calls) == self.model.counts(now)
        if self.model.state in ("closed", "metrics_only"):
            assert stats.consecutive_failures == self.model.consecutive


class TimeWindowMachine(BreakerMachine):
    window_type = "time"


SETTINGS = settings(
    max_examples=400 if LONG else 60,
    stateful_step_count=60 if LONG else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestCountWindowAgainstModel = BreakerMachine.TestCase
TestCountWindowAgainstModel.settings = SETTINGS
TestCountWindowAgainstModel.__doc__ = "Count windows follow the reference model step by step."
TestTimeWindowAgainstModel = TimeWindowMachine.TestCase
TestTimeWindowAgainstModel.settings = SETTINGS
TestTimeWindowAgainstModel.__doc__ = "Time windows follow the reference model step by step."
