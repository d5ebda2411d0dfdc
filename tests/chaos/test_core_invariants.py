"""Chaos over the in-process policies, in virtual time: hypothesis draws the fault schedules.

Each example builds a fresh FakeClock and a pipeline ending in ``rs.Faults`` whose
faults (latency, errors, replaced results, hangs; each with a rate and time windows)
are drawn by :mod:`resilience.testing.strategies` and all clear at ``HORIZON``. It
makes calls spread over the faulty period, then checks the invariants of
:mod:`tests.chaos._invariants`: nothing lost, nothing hangs (each call within the
pipeline's deadline, in virtual time, and within seconds in real time), and recovery
after the faults clear. Bounded by default; ``RESILIENCE_CHAOS_LONG=1`` draws many more
and longer schedules.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience import backoff, chaos
from resilience.breaker import CircuitBreaker, CircuitState
from resilience.bulkhead import Bulkhead
from resilience.ratelimit import RateLimiter
from resilience.testing import FakeClock
from resilience.testing import strategies as rst
from tests.chaos._invariants import (
    DOCUMENTED,
    FALLBACK,
    REAL,
    run_async,
    run_sync,
    wall,
)
from tests.chaos._report import LONG, RECORD, scaled

HORIZON = 20.0  # every drawn fault is over by then (virtual seconds)
DEADLINE = 3.0  # the retry's total deadline: the bound of every call
PER_ATTEMPT = 1.0  # the per-attempt timeout
MAX_LATENCY = 2.0  # injected latencies go beyond the per-attempt timeout
HANG_BLOCK = 1.5  # how long a sync hang blocks
OPEN_FOR = 2.0  # the breaker's cool-down
BREAKER_WINDOW = 10  # calls in the breaker's count window
AFTER_GAP = 0.2  # virtual seconds between the calls made after the faults clear
# The breaker's window still holds failures from the faulty period, and its rule is
# evaluated after every outcome, successes included (docs/breaker.md): it may trip once
# more while successes refill the window, then serves again after one cool-down.
RECOVERY_BOUND = (BREAKER_WINDOW + 1) * AFTER_GAP + OPEN_FOR + AFTER_GAP

CHAOS_SETTINGS = settings(
    max_examples=scaled(12, 250),
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

specs = st.lists(
    rst.fault_specs(
        kinds=("latency", "error", "result", "hang"),
        max_latency=MAX_LATENCY,
        horizon=HORIZON,
        results=st.just("replaced"),
        hang_block=HANG_BLOCK,
    ),
    min_size=1,
    max_size=4,
)


def build_faults(items: list[chaos.Fault], seed: int, clock: FakeClock) -> rs.Faults:
    # The global schedule ends every fault at HORIZON: recovery is measured after it.
    return rs.Faults(*items, schedule=[(0.0, HORIZON)], seed=seed, clock=clock, name="chaos")


def retry(clock: FakeClock, seed: int) -> rs.Retry:
    return rs.Retry(
        on=(rs.InjectedFault, rs.Timeout),
        attempts=3,
        deadline=DEADLINE,
        backoff=backoff.full_jitter(0.05, cap=0.5, seed=seed),
        clock=clock,
    )


def full_pipeline(clock: FakeClock, seed: int, faults: rs.Faults, *, fallback: bool) -> rs.Pipeline:
    """Fallback -> Retry -> CircuitBreaker -> RateLimiter -> Bulkhead -> Timeout -> Faults."""
    policies: list[Any] = []
    if fallback:
        policies.append(rs.Fallback(FALLBACK, on=DOCUMENTED))
    policies += [
        retry(clock, seed),
        CircuitBreaker(
            failure_rate=0.5, window=BREAKER_WINDOW, min_calls=5, open_for=OPEN_FOR, clock=clock
        ),
        RateLimiter("50/s", clock=clock),
        Bulkhead(4, clock=clock),
        rs.Timeout(PER_ATTEMPT, clock=clock),
        faults,
    ]
    return rs.Pipeline(*policies)


def sync_bound(faults: rs.Faults) -> float:
    """A sync attempt cannot be preempted: it may overrun by its own injected stall."""
    stall = sum(
        MAX_LATENCY
        if isinstance(f, chaos.Latency)
        else HANG_BLOCK
        if isinstance(f, chaos.Hang)
        else 0
        for f in faults.faults
    )
    return DEADLINE + stall


def gaps(seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0.0, 2 * HORIZON / count) for _ in range(count)]


def check_recovery(outcomes_after: list[str], clock_times: list[float], start: float) -> float:
    """Virtual seconds from HORIZON until every call is served normally, within
    RECOVERY_BOUND (window refill + one cool-down), with normal calls after it."""
    bad = [i for i, outcome in enumerate(outcomes_after) if outcome != REAL]
    first = bad[-1] + 1 if bad else 0
    assert first < len(outcomes_after), f"no recovery after the faults cleared: {outcomes_after}"
    recovery = clock_times[first] - start
    assert recovery <= RECOVERY_BOUND + 1e-9, (recovery, outcomes_after)
    return recovery


# -- sync -------------------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "raw"])
@CHAOS_SETTINGS
@given(items=specs, seed=rst.seeds())
def test_sync_pipeline_invariants(fallback: bool, items: list[chaos.Fault], seed: int) -> None:
    """Sync: every call ends documented, within deadline + one attempt's stall; recovers."""
    scenario = RECORD.scenario(f"core sync pipeline ({'fallback' if fallback else 'raw'})")
    scenario.schedules += 1
    clock = FakeClock()
    faults = build_faults(items, seed, clock)
    pipeline = full_pipeline(clock, seed, faults, fallback=fallback)
    call = pipeline(lambda: REAL)
    bound = sync_bound(faults)
    calls = scaled(30, 200)
    real_start = wall()
    with chaos.enabled():
        for gap in gaps(seed, calls):
            clock.advance(gap)
            outcome, elapsed = run_sync(call, clock.monotonic)
            assert not (fallback and outcome not in (REAL, FALLBACK, "replaced")), outcome
            assert elapsed <= bound + 1e-9, (outcome, elapsed, bound)
            scenario.call(outcome, elapsed)
        clock.set(max(clock.monotonic(), HORIZON))
        cleared = clock.monotonic()
        after, times = [], []
        for _ in range(round(RECOVERY_BOUND / AFTER_GAP) + 10):
            clock.advance(AFTER_GAP)
            times.append(clock.monotonic())
            after.append(run_sync(call, clock.monotonic)[0])
    scenario.recoveries.append(check_recovery(after, times, cleared))
    assert wall() - real_start < 10.0, "a sync chaos example took too long in real time"


# -- async (asyncio and trio) ----------------------------------------------------------------


async def async_example(
    backend_name: str, items: list[chaos.Fault], seed: int, fallback: bool
) -> None:
    scenario = RECORD.scenario(
        f"core async pipeline ({'fallback' if fallback else 'raw'}, {backend_name})"
    )
    scenario.schedules += 1
    clock = FakeClock()
    faults = build_faults(items, seed, clock)
    pipeline = full_pipeline(clock, seed, faults, fallback=fallback)

    @pipeline
    async def call() -> str:
        return REAL

    calls = scaled(30, 200)
    with anyio.fail_after(10):  # real seconds: nothing hangs
        with chaos.enabled():
            for gap in gaps(seed, calls):
                clock.advance(gap)
                outcome, elapsed = await run_async(call, clock.monotonic)
                assert not (fallback and outcome not in (REAL, FALLBACK, "replaced")), outcome
                # Async attempts are cancelled at the deadline: no overrun at all.
                assert elapsed <= DEADLINE + 1e-9, (outcome, elapsed)
                scenario.call(outcome, elapsed)
            clock.set(max(clock.monotonic(), HORIZON))
            cleared = clock.monotonic()
            after, times = [], []
            for _ in range(round(RECOVERY_BOUND / AFTER_GAP) + 10):
                clock.advance(AFTER_GAP)
                times.append(clock.monotonic())
                after.append((await run_async(call, clock.monotonic))[0])
    scenario.recoveries.append(check_recovery(after, times, cleared))


@pytest.mark.parametrize("backend_name", ["asyncio", "trio"])
@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "raw"])
@CHAOS_SETTINGS
@given(items=specs, seed=rst.seeds())
def test_async_pipeline_invariants(
    backend_name: str, fallback: bool, items: list[chaos.Fault], seed: int
) -> None:
    """Async: every call ends documented within the retry deadline exactly; recovers."""
    anyio.run(async_example, backend_name, items, seed, fallback, backend=backend_name)


# -- targeted scenarios ----------------------------------------------------------------------


def test_hang_inside_timeout_is_cut_at_the_deadline_every_time() -> None:
    """A dependency that always hangs: each async call ends at the deadline, as rs.Timeout."""
    scenario = RECORD.scenario("core async: permanent hang")
    scenario.schedules += 1
    clock = FakeClock()
    faults = rs.Faults(hang_rate=1.0, seed=1, clock=clock)
    pipeline = rs.Pipeline(retry(clock, 1), rs.Timeout(PER_ATTEMPT, clock=clock), faults)

    async def main() -> None:
        @pipeline
        async def call() -> str:
            return REAL

        with chaos.enabled():
            for _ in range(scaled(10, 100)):
                outcome, elapsed = await run_async(call, clock.monotonic)
                assert outcome == "Timeout"
                assert elapsed <= DEADLINE + 1e-9
                scenario.call(outcome, elapsed)

    anyio.run(main)


def test_breaker_recovers_within_its_cool_down_after_an_outage() -> None:
    """Errors for 10 s open the breaker; after they clear, it serves again within open_for."""
    scenario = RECORD.scenario("core sync: outage then recovery (breaker)")
    scenario.schedules += 1
    clock = FakeClock()
    faults = rs.Faults(error_rate=1.0, schedule=[(0, 10)], seed=2, clock=clock)
    breaker = CircuitBreaker(
        failure_rate=0.5, window=10, min_calls=5, open_for=OPEN_FOR, clock=clock
    )
    call = rs.Pipeline(rs.Fallback(FALLBACK, on=DOCUMENTED), breaker, faults)(lambda: REAL)
    with chaos.enabled():
        while clock.monotonic() < 10:
            outcome, elapsed = run_sync(call, clock.monotonic)
            assert outcome == FALLBACK
            scenario.call(outcome, elapsed)
            clock.advance(0.1)
        assert breaker.state is CircuitState.OPEN
        cleared = clock.monotonic()
        while True:
            outcome, elapsed = run_sync(call, clock.monotonic)
            scenario.call(outcome, elapsed)
            if outcome == REAL:
                break
            clock.advance(0.1)
            assert clock.monotonic() - cleared <= OPEN_FOR + 0.2, "no recovery"
    scenario.recoveries.append(clock.monotonic() - cleared)
    assert breaker.state is CircuitState.CLOSED
