"""An existing pybreaker.CircuitBreaker used as a resilience policy."""

from __future__ import annotations

import threading

import pybreaker
import pytest

import resilience as rs
from resilience.breaker import BreakerStateChanged, CircuitState, OutcomeRecorded, PyBreakerPolicy


class Boom(Exception):
    """A failure of the protected dependency."""


def boom() -> None:
    raise Boom


def test_trips_and_rejects_like_pybreaker_with_both_error_types() -> None:
    """fail_max failures open it; rejections are CircuitOpen and CircuitBreakerError."""
    legacy = pybreaker.CircuitBreaker(fail_max=2, reset_timeout=60, name="db")
    policy = PyBreakerPolicy(legacy)
    assert policy.name == "db"
    for _ in range(2):
        with pytest.raises(Boom):  # the tripping call raises its own error
            policy.call(boom)
    assert legacy.current_state == pybreaker.STATE_OPEN
    assert policy.state is CircuitState.OPEN
    with pytest.raises(rs.CircuitOpen) as caught:
        policy.call(int)
    assert isinstance(caught.value, pybreaker.CircuitBreakerError)
    assert 0 < caught.value.retry_after <= 60


def test_excluded_and_rejected_are_not_failures() -> None:
    """pybreaker's exclude list is honoured; Rejected from inner policies is ignored."""
    legacy = pybreaker.CircuitBreaker(fail_max=1, exclude=[KeyError])
    policy = PyBreakerPolicy(legacy)

    def missing() -> None:
        raise KeyError("k")

    def limited() -> None:
        raise rs.RateLimited(retry_after=1)

    for fn, error in ((missing, KeyError), (limited, rs.RateLimited)):
        with pytest.raises(error):
            policy.call(fn)
    assert legacy.current_state == pybreaker.STATE_CLOSED


@pytest.mark.parametrize("wrappers", [1, 2], ids=["one-policy", "two-policies"])
def test_half_open_lets_one_trial_through_and_closes(wrappers: int) -> None:
    """After reset_timeout one trial runs (others are rejected); its success closes.
    The rule is the pybreaker's: with two policies wrapping it (one pybreaker for two
    functions), the second one's call is rejected too (each used to allow a trial)."""
    legacy = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=0.0)
    policy = PyBreakerPolicy(legacy)
    other = PyBreakerPolicy(legacy) if wrappers == 2 else policy
    with pytest.raises(Boom):
        policy.call(boom)
    inside = threading.Event()
    release = threading.Event()

    def trial() -> str:
        inside.set()
        release.wait(5)
        return "ok"

    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(policy.call(trial)))
    worker.start()
    assert inside.wait(5)
    with pytest.raises(rs.CircuitOpen):  # the trial is in flight: no second one
        other.call(int)
    release.set()
    worker.join(5)
    assert results == ["ok"]
    assert legacy.current_state == pybreaker.STATE_CLOSED


def test_a_listener_failing_before_the_trial_does_not_block_the_breaker() -> None:
    """A pybreaker listener's ``before_call`` raising during half-open: the trial never
    ran, so the next call may try (the policy used to reject every call after it)."""

    class Flaky(pybreaker.CircuitBreakerListener):  # type: ignore[misc]
        fail = True

        def before_call(self, cb: object, func: object, *args: object, **kwargs: object) -> None:
            if Flaky.fail:
                Flaky.fail = False
                raise RuntimeError("listener")

    legacy = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=0.0)
    policy = PyBreakerPolicy(legacy)
    Flaky.fail = False
    with pytest.raises(Boom):
        policy.call(boom)
    legacy.add_listener(Flaky())
    Flaky.fail = True
    with pytest.raises(RuntimeError):
        policy.call(int)
    assert policy.call(lambda: "ok") == "ok"
    assert legacy.current_state == pybreaker.STATE_CLOSED


def test_calls_run_concurrently_without_the_pybreaker_lock() -> None:
    """Two calls overlap: the pybreaker lock is not held while a call runs."""
    policy = PyBreakerPolicy(pybreaker.CircuitBreaker())
    barrier = threading.Barrier(2)

    def meet() -> bool:
        barrier.wait(5)  # only returns if both calls are inside at once
        return True

    threads = [threading.Thread(target=policy.call, args=(meet,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not barrier.broken


@pytest.mark.anyio
async def test_async_without_tornado() -> None:
    """async def functions work on asyncio and trio; a cancellation is not a failure."""
    import anyio

    legacy = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=60)
    policy = PyBreakerPolicy(legacy)

    @policy
    async def fetch(fail: bool) -> str:
        await anyio.lowlevel.checkpoint()
        if fail:
            raise Boom
        return "ok"

    assert await fetch(False) == "ok"

    @policy
    async def hang() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await hang()
    assert legacy.current_state == pybreaker.STATE_CLOSED
    with pytest.raises(Boom):
        await fetch(True)
    with pytest.raises(pybreaker.CircuitBreakerError):
        await fetch(False)


def test_listeners_are_bridged_to_events() -> None:
    """pybreaker's notifications reach resilience listeners as events."""
    legacy = pybreaker.CircuitBreaker(fail_max=1, name="pay")
    policy = PyBreakerPolicy(legacy)
    events: list[rs.Event] = []
    policy.add_listener(events.append)
    policy.call(int)
    with pytest.raises(Boom):
        policy.call(boom)
    changes = [e for e in events if isinstance(e, BreakerStateChanged)]
    outcomes = [e.outcome for e in events if isinstance(e, OutcomeRecorded)]
    assert outcomes == ["success", "failure"]
    assert [(e.policy, e.old, e.new, e.reason) for e in changes] == [
        ("pay", "closed", "open", "pybreaker")
    ]
    policy.close()
    assert policy._bridge not in legacy.listeners


def test_rejects_other_objects() -> None:
    """Only pybreaker.CircuitBreaker instances are accepted."""
    with pytest.raises(rs.ConfigurationError, match="pybreaker"):
        PyBreakerPolicy(object())
