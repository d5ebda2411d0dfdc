"""CircuitBreaker behaviour through the public API (virtual time, no real waiting)."""

from __future__ import annotations

import collections
import gc
import pickle
from typing import Any

import pytest

import resilience as rs
from resilience.breaker import (
    BreakerStateChanged,
    CircuitBreaker,
    CircuitState,
    OutcomeRecorded,
)
from resilience.testing import FakeClock


class Boom(Exception):
    """A failure of the protected dependency."""


def failing(*_: Any, **__: Any) -> Any:
    raise Boom("down")


def ok(*_: Any, **__: Any) -> str:
    return "ok"


def fail_n(breaker: CircuitBreaker, n: int, *args: Any) -> None:
    for _ in range(n):
        with pytest.raises(Boom):
            breaker.call(failing, *args)


def succeed_n(breaker: CircuitBreaker, n: int, *args: Any) -> None:
    for _ in range(n):
        assert breaker.call(ok, *args) == "ok"


# --------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"failure_rate": 0}, "failure_rate"),
        ({"failure_rate": 1.5}, "failure_rate"),
        ({"window": 0}, "window"),
        ({"window": 5, "min_calls": 6}, "min_calls"),
        ({"window_type": "sliding"}, "window_type"),
        ({"window_type": "time", "window": -1.0}, "window"),
        ({"open_for": -1}, "open_for"),
        ({"open_for": 10, "open_for_max": 5}, "open_for_max"),
        ({"open_for_jitter": 2}, "open_for_jitter"),
        ({"half_open_calls": 0}, "half_open_calls"),
        ({"max_half_open_wait": 0}, "max_half_open_wait"),
        ({"consecutive_failures": 0}, "consecutive_failures"),
        ({"slow_call": -0.1}, "slow_call"),
        ({"slow_call": 0}, "slow_call"),  # every call slow: opens on healthy calls
        ({"failure_rate": None}, "never trip"),
        ({"exclude": "oops"}, "exclude"),
        ({"record": (ValueError, 3)}, "record"),
        ({"record_result": 5}, "record_result"),
        ({"key": "host"}, "key"),
        ({"quorum": 0}, "quorum"),
        ({"initial_state": "open"}, "initial_state"),
        ({"fallback_on": ValueError}, "fallback_on"),
        ({"backend": object()}, "backend"),
        # Checked on an unkeyed breaker too, not only once key= is added.
        ({"max_keys": 0}, "max_keys"),
        ({"idle_ttl": -1}, "idle_ttl"),
        ({"clock": object()}, "clock"),
        ({"seed": [1]}, "seed"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments_raise_configuration_error(kwargs: dict[str, Any], needle: str) -> None:
    """Every bad argument fails at construction with a message naming it."""
    with pytest.raises(rs.ConfigurationError, match=needle):
        CircuitBreaker(**kwargs)


def test_min_calls_defaults_to_the_window_when_smaller() -> None:
    """A small count window does not need an explicit min_calls."""
    assert CircuitBreaker(window=4).config.min_calls == 4
    assert CircuitBreaker().config.min_calls == 10


# --------------------------------------------------------------------- tripping


def test_failure_rate_trips_only_after_min_calls(fake_clock: FakeClock) -> None:
    """Below min_calls nothing trips; at min_calls the rate decides."""
    breaker = CircuitBreaker(failure_rate=0.5, window=10, min_calls=4, clock=fake_clock)
    fail_n(breaker, 3)
    assert breaker.state is CircuitState.CLOSED
    succeed_n(breaker, 1)  # 3 of 4 failed: 75% >= 50%, decided on a success
    assert breaker.state is CircuitState.OPEN


def test_count_window_forgets_old_calls(fake_clock: FakeClock) -> None:
    """Only the last `window` calls count."""
    breaker = CircuitBreaker(failure_rate=0.5, window=4, min_calls=4, clock=fake_clock)
    fail_n(breaker, 1)
    succeed_n(breaker, 3)  # 1/4 failed
    fail_n(breaker, 1)  # window: S S S F -> 1/4
    assert breaker.state is CircuitState.CLOSED
    assert breaker.statistics().failures == 1
    fail_n(breaker, 1)  # S S F F -> 2/4
    assert breaker.state is CircuitState.OPEN


def test_time_window_forgets_old_buckets(fake_clock: FakeClock) -> None:
    """Failures older than the time window do not count."""
    breaker = CircuitBreaker(
        failure_rate=0.5, window_type="time", window=10, buckets=10, min_calls=2, clock=fake_clock
    )
    fail_n(breaker, 1)
    fake_clock.advance(10)
    fail_n(breaker, 1)
    assert breaker.statistics().calls == 1
    assert breaker.state is CircuitState.CLOSED
    succeed_n(breaker, 1)  # 1 failure of 2 in the window
    assert breaker.state is CircuitState.OPEN


def test_slow_calls_trip(fake_clock: FakeClock) -> None:
    """Calls slower than slow_call count toward the slow-call rate, even when they succeed."""
    breaker = CircuitBreaker(
        failure_rate=None,
        slow_call=1.0,
        slow_call_rate=0.5,
        window=4,
        min_calls=2,
        clock=fake_clock,
    )

    def slow() -> str:
        fake_clock.advance(1.5)
        return "late"

    assert breaker.call(slow) == "late"
    succeed_n(breaker, 1)
    assert breaker.state is CircuitState.OPEN
    assert breaker.statistics().state is CircuitState.OPEN


def test_consecutive_failures_trip_regardless_of_window(fake_clock: FakeClock) -> None:
    """N failures in a row trip; a success in between resets the run."""
    breaker = CircuitBreaker(failure_rate=None, consecutive_failures=3, clock=fake_clock)
    fail_n(breaker, 2)
    succeed_n(breaker, 1)
    fail_n(breaker, 2)
    assert breaker.state is CircuitState.CLOSED
    fail_n(breaker, 1)
    assert breaker.state is CircuitState.OPEN


# --------------------------------------------------------------------- open and half-open


def test_open_rejects_with_retry_after_until_half_open(fake_clock: FakeClock) -> None:
    """An open breaker does not call the function and says when to come back."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=30, clock=fake_clock)
    fail_n(breaker, 1)
    fake_clock.advance(10)
    calls = []
    with pytest.raises(rs.CircuitOpen) as caught:
        breaker.call(calls.append, 1)
    assert calls == []
    assert caught.value.retry_after == pytest.approx(20)
    assert isinstance(caught.value, rs.Rejected)
    assert pickle.loads(pickle.dumps(caught.value)).retry_after == pytest.approx(20)
    fake_clock.advance(20)
    assert breaker.state is CircuitState.HALF_OPEN


def test_half_open_admits_exactly_the_probes_then_closes(fake_clock: FakeClock) -> None:
    """HALF_OPEN lets half_open_calls probes in; their success closes the breaker."""
    breaker = CircuitBreaker(
        consecutive_failures=1, open_for=5, half_open_calls=2, clock=fake_clock
    )
    fail_n(breaker, 1)
    fake_clock.advance(5)
    first, second = breaker.acquire_nowait(), breaker.acquire_nowait()
    with pytest.raises(rs.CircuitOpen) as caught:
        breaker.acquire_nowait()
    assert caught.value.retry_after is None
    first.success()
    assert breaker.state is CircuitState.HALF_OPEN
    second.success()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.statistics().calls == 0  # a fresh window


def test_failed_probes_reopen_with_growing_cool_down(fake_clock: FakeClock) -> None:
    """Each consecutive trip lasts open_for x n, capped at open_for_max."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=10, open_for_max=25, clock=fake_clock)
    fail_n(breaker, 1)
    seen = []
    for _ in range(3):
        seen.append(breaker.statistics().retry_after)
        fake_clock.advance(seen[-1])
        fail_n(breaker, 1)  # the probe fails
    assert seen == [10, 20, 25]
    fake_clock.advance(25)
    succeed_n(breaker, 1)
    fail_n(breaker, 1)
    assert breaker.statistics().retry_after == 10  # closing reset the growth


def test_jitter_shortens_cool_downs_within_bounds(fake_clock: FakeClock) -> None:
    """open_for_jitter draws each cool-down in (open_for x (1 - jitter), open_for]."""
    durations = set()
    for seed in range(20):
        breaker = CircuitBreaker(
            consecutive_failures=1, open_for=10, open_for_jitter=0.5, seed=seed, clock=fake_clock
        )
        fail_n(breaker, 1)
        durations.add(breaker.statistics().retry_after)
    assert all(5 < d <= 10 for d in durations if d is not None)
    assert len(durations) > 10


def test_half_open_times_out_back_to_open(fake_clock: FakeClock) -> None:
    """With max_half_open_wait, unfinished probes send the breaker back to OPEN."""
    breaker = CircuitBreaker(
        consecutive_failures=1, open_for=5, max_half_open_wait=3, clock=fake_clock
    )
    fail_n(breaker, 1)
    fake_clock.advance(5)
    probe = breaker.acquire_nowait()
    fake_clock.advance(3)
    assert breaker.state is CircuitState.OPEN
    probe.success()  # too late: the episode is over
    assert breaker.state is CircuitState.OPEN


def test_the_fleet_s_close_wins_over_a_late_probe_noticed_only_then(
    fake_clock: FakeClock,
) -> None:
    """A shared breaker's probe is overdue, but nobody looked: when another process's
    probe succeeds and its ``close`` arrives, the breaker closes. (It used to notice the
    timeout first, reopen with ``half_open_timeout`` and broadcast that as a trip,
    reopening the fleet that the other probe had just closed.)"""
    breaker = CircuitBreaker(
        consecutive_failures=1, open_for=5, max_half_open_wait=3, clock=fake_clock
    )
    changes: list[str] = []
    breaker.add_listener(
        lambda e: changes.append(e.reason) if isinstance(e, BreakerStateChanged) else None
    )
    fail_n(breaker, 1)
    fake_clock.advance(5)
    breaker.acquire_nowait()  # this process's probe, which hangs
    fake_clock.advance(4)  # overdue: nobody has looked since
    breaker._apply_remote(None, "close", 0.0)  # the fleet's news: another probe passed
    assert breaker.state is CircuitState.CLOSED
    assert "half_open_timeout" not in changes


def test_closing_a_closed_breaker_is_no_state_change(fake_clock: FakeClock) -> None:
    """close() on a CLOSED breaker resets its window but reports no state change."""
    breaker = CircuitBreaker(consecutive_failures=2, clock=fake_clock)
    changes: list[BreakerStateChanged] = []
    breaker.add_listener(
        lambda e: changes.append(e) if isinstance(e, BreakerStateChanged) else None
    )
    fail_n(breaker, 1)
    breaker.close()
    fail_n(breaker, 1)  # a fresh window: one failure of two
    assert breaker.state is CircuitState.CLOSED
    assert changes == []


def test_state_change_events_carry_circuit_states(fake_clock: FakeClock) -> None:
    """An event's ``old`` and ``new`` are CircuitState members, which are strings too:
    ``event.new is CircuitState.OPEN`` holds (they were plain strings) as does
    ``event.new == "open"``."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=10, clock=fake_clock)
    changes: list[BreakerStateChanged] = []
    breaker.add_listener(
        lambda e: changes.append(e) if isinstance(e, BreakerStateChanged) else None
    )
    fail_n(breaker, 1)
    (opened,) = changes
    assert opened.old is CircuitState.CLOSED
    assert opened.new is CircuitState.OPEN
    assert (opened.old, opened.new) == ("closed", "open")


@pytest.mark.parametrize("polls", [(), (12,), (12, 18, 19)])
def test_half_open_waits_for_its_first_probe_whoever_looks(
    fake_clock: FakeClock, polls: tuple[float, ...]
) -> None:
    """``max_half_open_wait`` times the probes that are out, from the first one: with
    no traffic the breaker stays half-open for the next call, and reading its state
    (a health endpoint) changes nothing (a look at t=12 used to start the wait, so the
    call at t=20 was refused and counted as a second trip)."""
    breaker = CircuitBreaker(
        consecutive_failures=1,
        open_for=10,
        open_for_max=100,
        max_half_open_wait=5,
        clock=fake_clock,
    )
    fail_n(breaker, 1)
    for at in polls:
        fake_clock.advance(at - fake_clock.monotonic())
        assert breaker.state is CircuitState.HALF_OPEN
        assert breaker.states() == {None: CircuitState.HALF_OPEN}
        assert breaker.statistics().state is CircuitState.HALF_OPEN
    fake_clock.advance(20 - fake_clock.monotonic())
    probe = breaker.acquire_nowait()  # admitted: the probe
    with pytest.raises(rs.CircuitOpen) as refused:
        breaker.acquire_nowait()
    assert refused.value.retry_after == 5.0  # the probe's time left
    probe.success()
    assert breaker.state is CircuitState.CLOSED
    assert breaker.statistics().opened == 1


def test_late_outcome_of_an_old_episode_is_dropped(fake_clock: FakeClock) -> None:
    """A call admitted while CLOSED that ends in HALF_OPEN is not taken as a probe."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=5, clock=fake_clock)
    slow_permit = breaker.acquire_nowait()
    fail_n(breaker, 1)
    fake_clock.advance(5)
    assert breaker.state is CircuitState.HALF_OPEN
    slow_permit.success()
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.statistics().half_open_in_flight == 0


# --------------------------------------------------------------------- what counts


def test_excluded_and_cancelled_count_as_neither(fake_clock: FakeClock) -> None:
    """exclude= types, a predicate, and BaseExceptions are neither success nor failure."""
    breaker = CircuitBreaker(
        consecutive_failures=2,
        exclude=lambda exc: isinstance(exc, KeyError),
        clock=fake_clock,
    )
    fail_n(breaker, 1)
    for exc in (KeyError("k"), KeyboardInterrupt()):

        def raise_it(exc: BaseException = exc) -> None:
            raise exc

        with pytest.raises(type(exc)):
            breaker.call(raise_it)
    assert breaker.statistics().calls == 1
    fail_n(breaker, 1)  # the run of failures was not broken
    assert breaker.state is CircuitState.OPEN


def test_rejections_from_inner_policies_are_ignored_unless_asked(fake_clock: FakeClock) -> None:
    """RateLimited / BulkheadFull from inside do not count, unless record_rejected=True."""

    def limited() -> None:
        raise rs.RateLimited(retry_after=1.0)

    quiet = CircuitBreaker(consecutive_failures=1, clock=fake_clock)
    strict = CircuitBreaker(consecutive_failures=1, record_rejected=True, clock=fake_clock)
    for breaker in (quiet, strict):
        with pytest.raises(rs.RateLimited):
            breaker.call(limited)
    assert quiet.state is CircuitState.CLOSED
    assert strict.state is CircuitState.OPEN


def test_record_limits_failures_to_matches(fake_clock: FakeClock) -> None:
    """With record=, only matching exceptions are failures; others are successes."""
    breaker = CircuitBreaker(
        failure_rate=None, consecutive_failures=2, record=(Boom,), clock=fake_clock
    )
    fail_n(breaker, 1)
    with pytest.raises(ValueError):
        breaker.call(int, "x")  # a success: resets the run
    fail_n(breaker, 1)
    assert breaker.state is CircuitState.CLOSED
    assert breaker.statistics().calls == 3


def test_result_predicate_marks_failures(fake_clock: FakeClock) -> None:
    """record_result turns returned values (an HTTP 503) into failures; they are returned."""
    breaker = CircuitBreaker(
        consecutive_failures=2, record_result=lambda status: status >= 500, clock=fake_clock
    )

    @breaker
    def fetch(status: int) -> int:
        return status

    assert fetch(503) == 503
    assert fetch(200) == 200
    assert fetch(503) == 503
    assert breaker.state is CircuitState.CLOSED
    assert fetch(502) == 502
    assert breaker.state is CircuitState.OPEN


# --------------------------------------------------------------------- manual states


def test_manual_states(fake_clock: FakeClock) -> None:
    """force_open rejects, disable admits and records nothing, metrics_only never trips."""
    breaker = CircuitBreaker(consecutive_failures=1, clock=fake_clock)
    breaker.force_open()
    with pytest.raises(rs.CircuitOpen) as caught:
        breaker.call(ok)
    assert caught.value.retry_after is None
    fake_clock.advance(3600)
    assert breaker.state is CircuitState.FORCED_OPEN

    breaker.disable()
    fail_n(breaker, 3)
    assert breaker.state is CircuitState.DISABLED
    assert breaker.statistics().calls == 0

    breaker.metrics_only()
    fail_n(breaker, 3)
    stats = breaker.statistics()
    assert (stats.state, stats.calls, stats.failures) == (CircuitState.METRICS_ONLY, 3, 3)

    breaker.open(seconds=7)
    assert breaker.statistics().retry_after == 7
    breaker.close()
    assert breaker.state is CircuitState.CLOSED
    succeed_n(breaker, 1)


def test_initial_state_shadow_mode(fake_clock: FakeClock) -> None:
    """initial_state=METRICS_ONLY starts a breaker in shadow mode."""
    breaker = CircuitBreaker(initial_state=CircuitState.METRICS_ONLY, window=2, clock=fake_clock)
    fail_n(breaker, 5)
    assert breaker.statistics().failure_rate == 1.0
    assert breaker.state is CircuitState.METRICS_ONLY


# --------------------------------------------------------------------- events and stats


def test_events_tell_the_story(fake_clock: FakeClock) -> None:
    """Listeners see outcomes, state changes with reasons, and rejections."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=5, name="api", clock=fake_clock)
    events: list[rs.Event] = []
    breaker.add_listener(events.append)
    succeed_n(breaker, 1)  # reported too, while anyone listens (metrics need every call)
    fail_n(breaker, 1)
    with pytest.raises(rs.CircuitOpen):
        breaker.call(ok)
    fake_clock.advance(5)
    succeed_n(breaker, 1)
    kinds = [
        (type(e).__name__, getattr(e, "outcome", None) or getattr(e, "reason", None))
        for e in events
    ]
    assert kinds == [
        ("OutcomeRecorded", "success"),
        ("OutcomeRecorded", "failure"),
        ("BreakerStateChanged", "consecutive_failures"),
        ("CallRejected", None),
        ("BreakerStateChanged", "cool_down"),
        ("OutcomeRecorded", "success"),
        ("BreakerStateChanged", "probes_succeeded"),
    ]
    opened = events[2]
    assert isinstance(opened, BreakerStateChanged)
    assert isinstance(opened, rs.StateChanged)
    assert (opened.policy, opened.old, opened.new, opened.open_for) == ("api", "closed", "open", 5)
    assert isinstance(events[1], OutcomeRecorded)
    assert isinstance(events[1].exception, Boom)
    # Every reported call carries its duration (on the breaker's clock).
    assert all(e.duration == 0.0 for e in events if isinstance(e, OutcomeRecorded))


def test_observed_calls_are_timed_for_the_duration_histogram(fake_clock: FakeClock) -> None:
    """With a metrics adapter installed, every call (plain successes included) feeds the
    call-duration histogram, so p50/p95/p99 exist for a breaker that never failed."""
    from resilience.observability import samples

    breaker = CircuitBreaker(name="db", clock=fake_clock)
    durations: list[float] = []

    def listener(event: rs.Event) -> None:
        durations.extend(v for series, v, _ in samples(event) if series.name.endswith("duration"))

    breaker.add_listener(listener)

    def query(seconds: float) -> str:
        fake_clock.advance(seconds)
        return "rows"

    for seconds in (0.01, 0.02, 0.5):
        assert breaker.call(query, seconds) == "rows"
    decorated = breaker(query)
    assert decorated(0.03) == "rows"
    assert durations == pytest.approx([0.01, 0.02, 0.5, 0.03])
    breaker.remove_listener(listener)
    assert breaker.call(query, 1.0) == "rows"  # unobserved: the untimed fast path again
    assert len(durations) == 4


def test_statistics_counts(fake_clock: FakeClock) -> None:
    """statistics() reports window counts, rates (from min_calls on), and counters."""
    breaker = CircuitBreaker(failure_rate=0.9, window=10, min_calls=4, clock=fake_clock)
    fail_n(breaker, 1)
    succeed_n(breaker, 2)
    stats = breaker.statistics()
    assert (stats.calls, stats.failures, stats.failure_rate) == (3, 1, None)
    succeed_n(breaker, 1)
    assert breaker.statistics().failure_rate == 0.25
    breaker.open()
    for _ in range(3):
        with pytest.raises(rs.CircuitOpen):
            breaker.call(ok)
    stats = breaker.statistics()
    assert (stats.rejected, stats.opened, stats.calls) == (3, 1, 0)


# --------------------------------------------------------------------- keys


def test_keys_have_independent_breakers(fake_clock: FakeClock) -> None:
    """One failing domain does not open the breaker of another."""
    breaker = CircuitBreaker(key=lambda host: host, consecutive_failures=2, clock=fake_clock)
    fail_n(breaker, 2, "bad.example")
    succeed_n(breaker, 3, "good.example")
    assert breaker.state_of("bad.example") is CircuitState.OPEN
    assert breaker.state_of("good.example") is CircuitState.CLOSED
    assert breaker.state_of("never.seen") is CircuitState.CLOSED
    assert breaker.states() == {
        "bad.example": CircuitState.OPEN,
        "good.example": CircuitState.CLOSED,
    }
    with pytest.raises(TypeError, match="keyed"):
        _ = breaker.state
    with pytest.raises(TypeError, match="keyed"):
        with breaker:
            pass


def test_evicted_key_comes_back_closed_with_a_fresh_window(fake_clock: FakeClock) -> None:
    """The key map is bounded (LRU and idle expiry); an evicted key starts over."""
    breaker = CircuitBreaker(
        key=lambda host: host, consecutive_failures=2, max_keys=2, idle_ttl=60, clock=fake_clock
    )
    fail_n(breaker, 2, "a")
    fail_n(breaker, 1, "b")
    succeed_n(breaker, 1, "c")  # evicts "a", the least recently used
    assert len(breaker.states()) == 2
    assert breaker.state_of("a") is CircuitState.CLOSED
    fake_clock.advance(61)
    succeed_n(breaker, 1, "d")  # "b" idle for too long: dropped
    fail_n(breaker, 1, "b")
    assert breaker.state_of("b") is CircuitState.CLOSED  # its old failure was forgotten


def test_a_key_idle_past_idle_ttl_starts_over_even_when_used_again_first(
    fake_clock: FakeClock,
) -> None:
    """Expiry does not wait for a sweep: a key back after ``idle_ttl`` of silence gets a
    fresh window although nothing else ran meanwhile (it kept its failure before)."""
    breaker = CircuitBreaker(
        key=lambda host: host, consecutive_failures=2, idle_ttl=60, clock=fake_clock
    )
    fail_n(breaker, 1, "a")
    fake_clock.advance(3600)
    fail_n(breaker, 1, "a")
    assert breaker.state_of("a") is CircuitState.CLOSED
    fail_n(breaker, 1, "a")  # within idle_ttl: two in a row trip it
    assert breaker.state_of("a") is CircuitState.OPEN


def test_a_key_set_by_hand_outlives_idleness_and_a_full_map(fake_clock: FakeClock) -> None:
    """``force_open(key)`` lasts until ``close(key)`` and ``open(key, seconds=...)`` for
    its seconds, however long the key is idle and however many other keys come: they
    used to come back CLOSED after ``idle_ttl``, or when ``max_keys`` pushed them out
    (a flood of other keys turned the kill switch off)."""
    breaker = CircuitBreaker(
        key=lambda host: host, max_keys=3, idle_ttl=60, open_for=5, clock=fake_clock
    )
    breaker.force_open("evil")
    breaker.open("slow", seconds=3600)
    fake_clock.advance(601)
    for index in range(50):  # other keys, well past max_keys
        succeed_n(breaker, 1, f"host{index}")
    assert breaker.state_of("evil") is CircuitState.FORCED_OPEN
    assert breaker.state_of("slow") is CircuitState.OPEN
    assert len(breaker.states()) == 3  # the two held keys, and one other
    with pytest.raises(rs.CircuitOpen):
        breaker.call(lambda host: host, "evil")
    fake_clock.advance(3000)  # past the hand-set hour: "slow" goes as any key does
    succeed_n(breaker, 1, "next")
    assert breaker.state_of("slow") is CircuitState.CLOSED
    breaker.close("evil")  # closed by hand: an ordinary key again
    fake_clock.advance(61)
    succeed_n(breaker, 1, "other")
    assert "evil" not in breaker.states()


class _TickingClock(FakeClock):
    """Virtual time that moves 1 ms at every read, as real time moves between reads."""

    def monotonic(self) -> float:
        self.advance(0.001)
        return super().monotonic()


def test_opening_a_key_for_less_than_a_clock_read_returns() -> None:
    """``open(key, seconds=...)`` shorter than the time between two clock reads, with an
    idle_ttl as short: the key is gone again before its hold could be seen, and
    ``open`` fetched it again forever."""
    breaker = CircuitBreaker(key=lambda host: host, idle_ttl=1e-6, clock=_TickingClock())
    breaker.open("alice", seconds=1e-6)
    assert breaker.state_of("alice") is CircuitState.CLOSED  # its second is long over


def test_a_key_closed_by_hand_under_a_breaker_wide_force_open_stays_closed(
    fake_clock: FakeClock,
) -> None:
    """``close(key)`` after ``force_open()`` exempts one host from the kill switch; a
    dropped key comes back in the breaker-wide state, so that exemption is held too (it
    was lost after ``idle_ttl``, turning the switch back on for that host)."""
    breaker = CircuitBreaker(key=lambda host: host, max_keys=2, idle_ttl=10, clock=fake_clock)
    breaker.force_open()
    breaker.close("a")
    fake_clock.advance(11)
    for index in range(5):
        with pytest.raises(rs.CircuitOpen):
            breaker.call(lambda host: host, f"host{index}")
    assert breaker.call(lambda host: host, "a") == "a"
    breaker.close()  # every key closed: "a" is an ordinary key again
    fake_clock.advance(11)
    succeed_n(breaker, 1, "other")
    assert "a" not in breaker.states()


def test_a_key_set_by_hand_while_other_threads_add_keys_keeps_its_state() -> None:
    """``open(key)`` while other threads fill the keyed map: the key is held before it
    moves, so the new keys cannot push it out in between (about 3% of such calls were
    lost, the key back CLOSED when open() returned)."""
    import itertools
    import sys
    import threading
    import time

    breaker = CircuitBreaker(key=lambda host: host, max_keys=4, idle_ttl=600)
    stop = threading.Event()
    counter = itertools.count()

    def churn() -> None:
        while not stop.is_set():
            breaker.acquire_nowait(f"k{next(counter)}").success()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches everywhere: the window shows at once
    threads = [threading.Thread(target=churn) for _ in range(4)]
    lost = trials = 0
    try:
        for thread in threads:
            thread.start()
        ends = time.monotonic() + 1.5
        while time.monotonic() < ends:
            trials += 1
            breaker.open(f"m{trials}", seconds=600)
            lost += breaker.state_of(f"m{trials}") is not CircuitState.OPEN
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        sys.setswitchinterval(interval)
    assert trials > 100
    assert lost == 0


def test_reports_agree_with_calls_about_an_idle_key(fake_clock: FakeClock) -> None:
    """state_of(), states() and statistics() report an idle-expired key as the next call
    will find it (a fresh CLOSED breaker), not the state it had before it went idle."""
    breaker = CircuitBreaker(
        key=lambda host: host,
        consecutive_failures=1,
        open_for=100,
        idle_ttl=50,
        clock=fake_clock,
    )
    fail_n(breaker, 1, "a")
    assert breaker.state_of("a") is CircuitState.OPEN
    fake_clock.advance(60)  # idle past idle_ttl, nothing swept it
    assert breaker.state_of("a") is CircuitState.CLOSED
    assert "a" not in breaker.states()
    stats = breaker.statistics("a")
    assert (stats.state, stats.retry_after) == (CircuitState.CLOSED, None)
    succeed_n(breaker, 1, "a")  # and the call agrees
    assert breaker.states() == {"a": CircuitState.CLOSED}


def test_open_with_a_positional_number_on_an_unkeyed_breaker_says_why() -> None:
    """``open(5)`` passes 5 as the key: the error names the key and the seconds= form."""
    with pytest.raises(TypeError, match=r"got the key 5.*open\(seconds=\.\.\.\)"):
        CircuitBreaker().open(5)


def test_manual_control_of_keyed_breakers(fake_clock: FakeClock) -> None:
    """force_open() without a key covers every key, including keys seen later."""
    breaker = CircuitBreaker(key=lambda host: host, clock=fake_clock)
    succeed_n(breaker, 1, "a")
    breaker.force_open()
    for host in ("a", "b"):
        with pytest.raises(rs.CircuitOpen):
            breaker.call(ok, host)
    breaker.close()
    succeed_n(breaker, 1, "b")
    breaker.open(key="b")
    assert breaker.state_of("b") is CircuitState.OPEN
    assert breaker.statistics(key="zzz").state is CircuitState.CLOSED


def test_a_keyed_breaker_without_a_key_reports_its_totals(fake_clock: FakeClock) -> None:
    """statistics() without a key sums a keyed breaker's keys (it used to raise
    TypeError, and so did the statistics() of any Pipeline holding it): the most
    restrictive state with its shortest retry_after, rates over the summed calls."""
    breaker = CircuitBreaker(
        key=lambda host: host,
        failure_rate=None,
        consecutive_failures=2,
        min_calls=1,
        open_for=30,
        clock=fake_clock,
    )
    empty = breaker.statistics()
    assert (empty.state, empty.calls, empty.retry_after) == (CircuitState.CLOSED, 0, None)
    succeed_n(breaker, 3, "a")
    fail_n(breaker, 1, "a")
    fail_n(breaker, 2, "b")  # b opens
    fake_clock.advance(10)
    fail_n(breaker, 2, "c")  # c opens later: b half-opens first
    with pytest.raises(rs.CircuitOpen):
        breaker.call(ok, "b")
    totals = breaker.statistics()
    assert totals.state is CircuitState.OPEN
    assert totals.retry_after == pytest.approx(20.0)
    assert (totals.calls, totals.failures) == (4, 1)  # open keys hold no window
    assert totals.failure_rate == pytest.approx(0.25)
    assert (totals.opened, totals.rejected, totals.consecutive_failures) == (2, 1, 1)
    assert rs.Pipeline(rs.Fallback("x"), breaker).statistics() is not None


# --------------------------------------------------------------------- shells


def test_context_manager_records_the_block(fake_clock: FakeClock) -> None:
    """with breaker: records success or the classified exception of the block."""
    breaker = CircuitBreaker(consecutive_failures=2, clock=fake_clock)
    with breaker:
        pass
    for _ in range(2):
        with pytest.raises(Boom), breaker:
            raise Boom
    assert breaker.state is CircuitState.OPEN
    with pytest.raises(rs.CircuitOpen), breaker:
        pytest.fail("must not run")


def test_permit_reports_once(fake_clock: FakeClock) -> None:
    """Only the first report of a permit counts; the permit is a context manager too."""
    breaker = CircuitBreaker(consecutive_failures=2, clock=fake_clock)
    permit = breaker.acquire_nowait()
    permit.failure(Boom())
    permit.failure(Boom())
    permit.success()
    assert permit.done
    assert breaker.statistics().failures == 1
    with breaker.acquire_nowait() as second:
        pass
    assert second.done
    permit = breaker.acquire_nowait()
    permit.failure(KeyboardInterrupt())  # a cancellation: ignored
    assert breaker.statistics().calls == 2


def test_decorates_methods(fake_clock: FakeClock) -> None:
    """The decorator works on instance methods and keeps the name."""
    breaker = CircuitBreaker(consecutive_failures=1, clock=fake_clock)

    class Client:
        @breaker
        def get(self, path: str) -> str:
            """Fetch a path."""
            return path.upper()

    assert Client().get("x") == "X"
    assert Client.get.__name__ == "get"


def test_fallback_answers_rejections(fake_clock: FakeClock) -> None:
    """fallback= answers CircuitOpen (with the exception) and lets other errors through."""
    seen: list[BaseException] = []

    def degraded(exc: BaseException) -> str:
        seen.append(exc)
        return "cached"

    breaker = CircuitBreaker(consecutive_failures=1, fallback=degraded, clock=fake_clock)
    events: list[rs.Event] = []
    breaker.add_listener(events.append)
    fail_n(breaker, 1)  # Boom is not a rejection: it propagates
    assert breaker.call(ok) == "cached"
    assert isinstance(seen[0], rs.CircuitOpen)
    assert any(isinstance(e, rs.FallbackUsed) for e in events)

    constant = CircuitBreaker(consecutive_failures=1, fallback=None, clock=fake_clock)
    constant.open()
    with pytest.raises(rs.CircuitOpen):  # fallback=None means no fallback
        constant.call(ok)

    wide = CircuitBreaker(
        consecutive_failures=1, fallback="n/a", fallback_on=(rs.Rejected, Boom), clock=fake_clock
    )
    assert wide.call(failing) == "n/a"


@pytest.mark.anyio
async def test_async_shell_and_async_fallback(fake_clock: FakeClock) -> None:
    """async def functions, async with, and an async fallback, on asyncio and trio."""

    async def degraded(exc: BaseException) -> str:
        return f"fallback after {type(exc).__name__}"

    breaker = CircuitBreaker(consecutive_failures=2, fallback=degraded, clock=fake_clock)

    @breaker
    async def ask(fail: bool) -> str:
        if fail:
            raise Boom
        return "answer"

    assert await ask(False) == "answer"
    for _ in range(2):
        with pytest.raises(Boom):
            await ask(True)
    assert await ask(False) == "fallback after CircuitOpen"

    plain = CircuitBreaker(consecutive_failures=1, slow_call=1.0, clock=fake_clock)
    async with plain:
        await fake_clock.sleep_async(0.1)
    with pytest.raises(Boom):
        async with plain:
            raise Boom
    assert plain.state is CircuitState.OPEN
    permit_error = None
    try:
        await plain.acquire_async()
    except rs.CircuitOpen as exc:
        permit_error = exc
    assert permit_error is not None


@pytest.mark.anyio
async def test_async_cancellation_frees_the_probe(fake_clock: FakeClock) -> None:
    """A cancelled half-open probe is not a failure and gives its slot back."""
    import anyio

    breaker = CircuitBreaker(consecutive_failures=1, open_for=1, clock=fake_clock)
    breaker.open(seconds=1)
    fake_clock.advance(1)

    @breaker
    async def hang() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await hang()
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.statistics().half_open_in_flight == 0
    permit = breaker.acquire_nowait()  # the slot is free again
    permit.success()
    assert breaker.state is CircuitState.CLOSED


def test_inside_a_pipeline_records_each_attempt(fake_clock: FakeClock) -> None:
    """Pipeline(Retry, CircuitBreaker): the breaker sees every attempt and stops the retries."""
    breaker = CircuitBreaker(consecutive_failures=2, open_for=60, clock=fake_clock)
    calls = []

    @rs.Pipeline(rs.Retry(on=Boom, attempts=5, clock=fake_clock), breaker)
    def flaky() -> None:
        calls.append(1)
        raise Boom

    with rs.testing.no_wait(), pytest.raises(rs.CircuitOpen):
        flaky()
    assert len(calls) == 2
    assert breaker.state is CircuitState.OPEN


def test_breaker_is_collectable() -> None:
    """A breaker without shared state holds no global reference (no leak)."""
    import weakref

    breaker = CircuitBreaker()
    ref = weakref.ref(breaker)
    del breaker
    gc.collect()
    assert ref() is None


def test_memory_backend_means_in_process() -> None:
    """backend=MemoryBackend() is accepted and keeps the breaker in process."""
    breaker = CircuitBreaker(backend=rs.backends.MemoryBackend())
    assert breaker.shared is None
    assert breaker.call(ok) == "ok"


def test_decorated_function_trips_probes_and_closes(fake_clock: FakeClock) -> None:
    """The decorator's fast path records failures, rejects when open and probes after."""
    breaker = CircuitBreaker(
        key=lambda host, fail: host,
        failure_rate=0.5,
        window=4,
        min_calls=2,
        open_for=5,
        clock=fake_clock,
    )

    @breaker
    def fetch(host: str, fail: bool) -> str:
        if fail:
            raise Boom
        return host

    assert fetch("a", False) == "a"
    with pytest.raises(Boom):
        fetch("a", True)  # 1 of 2 failed: 50% -> open
    with pytest.raises(rs.CircuitOpen):
        fetch("a", False)
    assert fetch("b", False) == "b"
    fake_clock.advance(5)
    assert fetch("a", False) == "a"  # the probe
    assert breaker.state_of("a") is CircuitState.CLOSED


@pytest.mark.anyio
async def test_decorated_coroutine_trips_probes_and_closes(fake_clock: FakeClock) -> None:
    """Same for async def functions, on asyncio and trio."""
    breaker = CircuitBreaker(failure_rate=0.5, window=4, min_calls=2, open_for=5, clock=fake_clock)

    @breaker
    async def fetch(fail: bool) -> str:
        if fail:
            raise Boom
        return "ok"

    assert await fetch(False) == "ok"
    with pytest.raises(Boom):
        await fetch(True)
    with pytest.raises(rs.CircuitOpen):
        await fetch(False)
    fake_clock.advance(5)
    assert await fetch(False) == "ok"
    assert breaker.state is CircuitState.CLOSED
    assert fetch.__name__ == "fetch"


def _raises_key_error() -> None:
    raise KeyError(1)


@pytest.mark.parametrize(
    ("options", "probe"),
    [
        ({"record_result": lambda r: r.status_code >= 500}, lambda: None),
        ({"exclude": lambda e: e.args[0].startswith("x")}, _raises_key_error),
        (
            {"record": lambda e: isinstance(e, ZeroDivisionError) or e.args[0].startswith("x")},
            _raises_key_error,
        ),
    ],
    ids=["record_result", "exclude", "record"],
)
def test_a_predicate_that_raises_on_a_probe_frees_the_probe_slot(
    fake_clock: FakeClock, options: dict[str, Any], probe: Any
) -> None:
    """The user's predicate raising on a half-open probe's outcome propagates, and the
    probe counts for nothing: its slot comes back, so the next call probes (it used to
    stay taken: HALF_OPEN for good, every call refused with no retry_after)."""
    breaker = rs.CircuitBreaker(
        consecutive_failures=1, failure_rate=None, open_for=10, clock=fake_clock, **options
    )
    with pytest.raises(ZeroDivisionError):
        breaker.call(lambda: 1 / 0)
    fake_clock.advance(10)
    with pytest.raises((AttributeError, KeyError)):
        breaker.call(probe)
    assert breaker.state is CircuitState.HALF_OPEN
    assert breaker.statistics().half_open_in_flight == 0
    with breaker.acquire_nowait() as permit:  # the next probe is admitted
        permit.success()
    assert breaker.state is CircuitState.CLOSED


@pytest.mark.parametrize(
    "nothing",
    [(), [], set(), collections.deque(), {}.keys()],
    ids=["tuple", "list", "set", "deque", "keys"],
)
def test_an_empty_exclude_excludes_nothing(fake_clock: FakeClock, nothing: Any) -> None:
    """``exclude=[]`` means what the default ``exclude=()`` means (it was refused), for
    any empty collection the type accepts (``Sequence``, ``Set``)."""
    breaker = rs.CircuitBreaker(
        consecutive_failures=1, failure_rate=None, exclude=nothing, clock=fake_clock
    )
    with pytest.raises(KeyError):
        breaker.call(_raises_key_error)
    assert breaker.state is CircuitState.OPEN


def test_with_blocks_of_many_breakers_leave_one_context_variable_at_most() -> None:
    """``with breaker:`` keeps its permit in one module-wide ContextVar: breakers made
    per object or per test do not each leave a variable in the thread's context (5,000
    breakers used to leave 5,000), and nested or interleaved blocks still pair up."""
    import contextvars

    before = len(contextvars.copy_context())
    for _ in range(500):
        with CircuitBreaker():
            pass
    assert len(contextvars.copy_context()) <= before + 1
    outer, inner = CircuitBreaker(), CircuitBreaker()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # out of order, by hand
    inner.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="without a matching enter"):
        inner.__exit__(None, None, None)


def test_a_block_left_open_by_an_abandoned_async_generator_keeps_the_pairs_right() -> None:
    """An async generator holding ``async with breaker`` that its consumer abandons is
    exited by another task, in a copy of the consumer's context: the consumer's own
    block must still settle its own permit (it settled the generator's again, and a
    half-open probe stayed in flight for good: every later call was rejected)."""
    import asyncio
    from collections.abc import AsyncIterator

    clock = FakeClock()
    breaker = CircuitBreaker(
        failure_rate=None, consecutive_failures=1, open_for=10, half_open_calls=2, clock=clock
    )

    async def stream() -> AsyncIterator[int]:
        async with breaker:
            yield 1
            yield 2

    async def consumer() -> None:
        async with breaker:
            async for _ in stream():
                break
            await asyncio.sleep(0.01)  # the abandoned generator is closed in another task

    breaker.open()
    clock.advance(11)  # half-open: two probes
    asyncio.run(consumer())
    assert breaker.statistics().half_open_in_flight == 0  # both probes settled
    succeed_n(breaker, 3)  # admitted (the generator's probe counted as ignored)
    assert breaker.state is CircuitState.CLOSED


class _Interrupt(BaseException):
    """Stands for KeyboardInterrupt raised inside a listener (pytest would take a real
    KeyboardInterrupt for the user's Ctrl-C)."""


@pytest.mark.parametrize("on", [BreakerStateChanged, OutcomeRecorded])
def test_a_listener_interrupted_mid_probe_gives_the_probe_slot_back(
    fake_clock: FakeClock, on: type[rs.Event]
) -> None:
    """A listener that raises a BaseException while a half-open probe is admitted or
    recorded interrupts that call, but the probe slot comes back: the breaker does not
    stay half-open with a probe out forever."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=1, clock=fake_clock)
    fail_n(breaker, 1)
    fake_clock.advance(2)
    armed = [True]

    def listener(event: rs.Event) -> None:
        if isinstance(event, on) and armed[0]:
            armed[0] = False
            raise _Interrupt

    breaker.add_listener(listener)
    with pytest.raises(_Interrupt), breaker:
        pass
    assert not armed[0]  # the listener did interrupt
    assert breaker.statistics().half_open_in_flight == 0
    fake_clock.advance(3600)
    with breaker:  # a new probe is admitted and closes the breaker
        pass
    assert breaker.state is CircuitState.CLOSED


def test_changes_queued_behind_an_interrupted_listener_are_still_reported(
    fake_clock: FakeClock,
) -> None:
    """A state change whose listener raised a BaseException does not lose the changes
    queued behind it: the next report delivers them, in their order."""
    breaker = CircuitBreaker(consecutive_failures=1, open_for=1, clock=fake_clock)
    seen: list[tuple[str, str]] = []

    def listener(event: rs.Event) -> None:
        if not isinstance(event, BreakerStateChanged):
            return
        seen.append((event.new, event.reason))
        if event.reason == "consecutive_failures":
            breaker.close()  # queued behind this report, with the next one
            breaker.force_open()
        elif event.new == "closed" and len(seen) == 2:
            raise _Interrupt

    breaker.add_listener(listener)
    with pytest.raises(_Interrupt):
        breaker.call(failing)
    assert seen == [("open", "consecutive_failures"), ("closed", "manual")]
    breaker.disable()  # its report delivers the forced open first
    assert seen[2:] == [("forced_open", "manual"), ("disabled", "manual")]
