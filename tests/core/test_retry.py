"""Retry: attempts, backoff, deadlines, retry_after hints and budgets, on FakeClock."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import weakref
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience import backoff
from resilience.testing import FakeClock, no_wait

from .._clocks import OvershootingClock, StallingClock


class Flaky:
    """Fails ``failures`` times with ``error``, then returns ``"ok"``."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("boom")
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_sleeps_follow_the_backoff_schedule(fake_clock: FakeClock) -> None:
    """The delays slept are exactly the schedule's first values."""
    schedule = backoff.full_jitter(0.1, cap=5.0, seed=42)
    expected = list(itertools.islice(backoff.full_jitter(0.1, cap=5.0, seed=42), 3))
    retry = rs.Retry(on=ConnectionError, attempts=4, backoff=schedule, clock=fake_clock)
    assert retry(Flaky(3))() == "ok"
    assert fake_clock.sleeps == pytest.approx(expected)


def test_gives_up_after_attempts_and_reraises_last_error(fake_clock: FakeClock) -> None:
    """attempts counts the first call; the last original exception propagates."""
    flaky = Flaky(10)
    retry = rs.Retry(on=ConnectionError, attempts=3, clock=fake_clock)
    with pytest.raises(ConnectionError, match="boom"):
        retry(flaky)()
    assert flaky.calls == 3
    assert retry.statistics().exhausted == 1


def test_unmatched_errors_are_not_retried(fake_clock: FakeClock) -> None:
    """An exception outside on= propagates after one attempt."""
    flaky = Flaky(1, KeyError("k"))
    with pytest.raises(KeyError):
        rs.Retry(on=ConnectionError, clock=fake_clock)(flaky)()
    assert flaky.calls == 1


def test_predicate_selects_errors(fake_clock: FakeClock) -> None:
    """on= may be a predicate of the exception."""
    flaky = Flaky(2, OSError(503, "busy"))
    retry = rs.Retry(on=lambda e: getattr(e, "errno", None) == 503, clock=fake_clock)
    assert retry(flaky)() == "ok"


def test_retries_on_result_and_returns_last_result_when_exhausted(fake_clock: FakeClock) -> None:
    """on_result retries bad results; when attempts run out the last result is returned."""
    results = iter([503, 503, 200])
    retry = rs.Retry(on=OSError, on_result=lambda r: r >= 500, clock=fake_clock)
    assert retry(lambda: next(results))() == 200
    always = rs.Retry(on=OSError, on_result=lambda r: r >= 500, attempts=2, clock=fake_clock)
    assert always(lambda: 503)() == 503


def test_retry_after_hint_lengthens_the_wait(fake_clock: FakeClock) -> None:
    """A Rejected's retry_after wins over a shorter backoff delay."""
    flaky = Flaky(1, rs.RateLimited(retry_after=2.5))
    retry = rs.Retry(on=rs.Rejected, backoff=backoff.constant(0.1), clock=fake_clock)
    assert retry(flaky)() == "ok"
    assert fake_clock.sleeps == [2.5]


def test_any_exception_with_numeric_retry_after_is_honoured(fake_clock: FakeClock) -> None:
    """Duck-typed retry_after on any exception counts too."""
    error = ConnectionError("429")
    error.retry_after = 1.25  # type: ignore[attr-defined]
    retry = rs.Retry(on=ConnectionError, backoff=backoff.constant(0.0), clock=fake_clock)
    assert retry(Flaky(1, error))() == "ok"
    assert fake_clock.sleeps == [1.25]


def test_retry_after_beyond_deadline_gives_up_at_once(fake_clock: FakeClock) -> None:
    """If max(backoff, retry_after) overruns the deadline, no sleep starts."""
    flaky = Flaky(1, rs.RateLimited(retry_after=10))
    retry = rs.Retry(on=rs.Rejected, deadline=5, clock=fake_clock)
    with pytest.raises(rs.RateLimited):
        retry(flaky)()
    assert fake_clock.sleeps == []
    assert flaky.calls == 1


@pytest.mark.anyio
@pytest.mark.parametrize("result_based", [False, True])
async def test_a_backoff_that_ends_past_the_deadline_starts_no_attempt(result_based: bool) -> None:
    """A delay just under the time left, slept a little late (as real sleeps are),
    ends past the deadline: the retry is not made (not counted, its budget given back)
    and the caller gets the last failure, not an attempt that has no time to run (an
    inner rs.Timeout refused it at once: the caller saw a Timeout instead)."""
    for shell in ("sync", "async"):
        clock = OvershootingClock(0.001)
        budget = rs.RetryBudget(ratio=0.0, min_per_second=1.0, window=10.0, clock=clock)
        events: list[Any] = []
        retry = rs.Retry(
            on=ConnectionError,
            on_result=(lambda value: value == "bad") if result_based else None,
            attempts=3,
            deadline=1.0,
            backoff=[0.999],
            budget=budget,
            clock=clock,
        )
        retry.add_listener(events.append)
        calls: list[float | None] = []

        def attempt() -> str:
            calls.append(rs.time_remaining())
            if result_based:
                return "bad"
            raise ConnectionError("down")

        async def attempt_async() -> str:
            return attempt()

        with contextlib.ExitStack() as stack:
            if not result_based:
                stack.enter_context(pytest.raises(ConnectionError, match="down"))
            if shell == "sync":
                outcome = retry.call(attempt)
            else:
                outcome = await retry.call_async(attempt_async)
        if result_based:
            assert outcome == "bad"
        assert calls == [1.0], shell
        assert retry.statistics().retries == 0
        assert budget.statistics().retries == 0
        [given_up] = [e for e in events if isinstance(e, rs.RetriesExhausted)]
        assert (given_up.reason, given_up.attempts) == ("deadline", 1)


@settings(max_examples=150, deadline=None)
@given(
    attempts=st.integers(1, 8),
    deadline=st.one_of(st.none(), st.floats(0.01, 20)),
    call_cost=st.floats(0, 3),
    seed=st.integers(0, 1000),
    hints=st.lists(st.one_of(st.none(), st.floats(0, 10)), min_size=8, max_size=8),
)
def test_never_exceeds_attempts_or_sleeps_past_deadline(
    attempts: int, deadline: float | None, call_cost: float, seed: int, hints: list[float | None]
) -> None:
    """Property: attempts are bounded and no sleep ends after the deadline."""
    clock = FakeClock()
    calls = 0

    def always_fails() -> None:
        nonlocal calls
        hint = hints[calls % len(hints)]
        calls += 1
        clock.advance(call_cost)
        raise rs.RateLimited(retry_after=hint)

    retry = rs.Retry(
        on=rs.Rejected,
        attempts=attempts,
        deadline=deadline,
        backoff=backoff.full_jitter(0.5, cap=4, seed=seed),
        clock=clock,
    )
    ends: list[float] = []
    retry.add_listener(
        lambda e: (
            ends.append(clock.monotonic() + e.delay) if isinstance(e, rs.RetryScheduled) else None
        )
    )
    with pytest.raises(rs.RateLimited):
        retry(always_fails)()
    assert calls <= attempts
    if deadline is not None:
        assert all(end <= deadline + 1e-9 for end in ends)


def test_budget_caps_retries_under_total_failure(fake_clock: FakeClock) -> None:
    """1,000 failing calls with a 20% budget make <= 1.2 × 1,000 + the floor attempts."""
    budget = rs.RetryBudget(ratio=0.2, min_per_second=1.0, window=10, clock=fake_clock)
    attempts = 0

    def down() -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionError

    retry = rs.Retry(on=ConnectionError, attempts=3, budget=budget, clock=fake_clock)
    wrapped = retry(down)
    with no_wait():
        for _ in range(1000):
            with pytest.raises(ConnectionError):
                wrapped()
    floor = 1.0 * 10
    assert attempts <= 1.2 * 1000 + floor
    assert attempts >= 1000 + 0.2 * 1000 - 1  # the budget is spent, not starved
    assert retry.statistics().budget_refusals > 0


@given(
    percent=st.integers(min_value=0, max_value=100),
    calls=st.integers(min_value=0, max_value=400),
    floor=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_budget_never_lets_retries_exceed_the_formula(
    percent: int, calls: int, floor: float
) -> None:
    """Withdrawals stop exactly where ``retries + 1 <= ratio·calls + floor·window`` stops
    holding, computed exactly: never more retries than the budget, none fewer, even
    where the float product lands just under a whole number (0.29 × 100), and
    ``statistics().available`` announces exactly the retries that are then granted."""
    clock = FakeClock()
    ratio = percent / 100
    budget = rs.RetryBudget(ratio=ratio, min_per_second=floor, window=4, clock=clock)
    for _ in range(calls):
        budget.deposit()
    announced = budget.statistics().available
    granted = 0
    while budget.try_withdraw():
        granted += 1
    bound = Fraction(percent, 100) * calls + Fraction(floor) * 4
    assert granted <= bound < granted + 1
    assert announced == granted
    assert budget.statistics().available == 0


@pytest.mark.anyio
async def test_a_backoff_cancelled_gives_its_retry_back_to_the_budget() -> None:
    """The budget pays for a retry when it is scheduled; a caller cancelled during the
    backoff never sends it, so it is given back: callers that give up mid-backoff
    used to drain the budget of those that retry."""
    import anyio

    clock = StallingClock()
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.25, window=4, clock=clock)  # one
    retry = rs.Retry(on=ConnectionError, budget=budget, backoff=[1.0], clock=clock)

    @retry
    async def down() -> None:
        raise ConnectionError

    async with anyio.create_task_group() as group:
        group.start_soon(down)
        await anyio.wait_all_tasks_blocked()  # in its backoff, the retry paid for
        assert budget.statistics().retries == 1
        group.cancel_scope.cancel()
    assert budget.statistics().retries == 0
    assert retry.statistics().retries == 0
    attempts = 0

    @retry
    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError
        return "ok"

    with no_wait():
        assert await flaky() == "ok"  # the one retry in the budget is there
    assert budget.statistics().refused == 0


@pytest.mark.anyio
async def test_a_cancelled_retry_gives_back_its_own_retry_not_another() -> None:
    """A refund goes to the window the retry was taken from: a caller whose retry has
    already aged out of the window gives nothing back (it used to give back the newest
    retry, someone else's, and the budget then granted more than its cap)."""
    import anyio

    budget_clock = FakeClock()
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.1, window=10, clock=budget_clock)
    retry = rs.Retry(on=ConnectionError, budget=budget, backoff=[30.0], clock=StallingClock())

    @retry
    async def down() -> None:
        raise ConnectionError

    first = anyio.CancelScope()
    cancelled: list[bool] = []

    async def first_caller() -> None:
        with first:
            await down()
        cancelled.append(first.cancelled_caught)

    async with anyio.create_task_group() as group:
        group.start_soon(first_caller)  # its retry is taken at t=0
        await anyio.wait_all_tasks_blocked()
        budget_clock.advance(11)  # the t=0 retry has left the 10 s window
        group.start_soon(down)  # takes the window's one retry, at t=11
        await anyio.wait_all_tasks_blocked()
        assert budget.statistics().retries == 1
        first.cancel()
        await anyio.wait_all_tasks_blocked()
        assert cancelled == [True]
        assert budget.statistics().retries == 1  # the t=11 retry still counts
        assert not budget.try_withdraw()
        group.cancel_scope.cancel()


def test_a_sync_backoff_interrupted_gives_its_retry_back(fake_clock: FakeClock) -> None:
    """The same in sync code: an interrupt during the backoff's sleep."""
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.25, window=4, clock=fake_clock)

    class Interrupting(FakeClock):
        def sleep(self, seconds: float) -> None:
            raise KeyboardInterrupt

    retry = rs.Retry(on=ConnectionError, budget=budget, clock=Interrupting())
    with pytest.raises(KeyboardInterrupt):
        retry(Flaky(1))()
    assert budget.statistics().retries == 0


def test_without_budget_every_attempt_runs(fake_clock: FakeClock) -> None:
    """The same outage without a budget costs 3 attempts per call."""
    attempts = 0

    def down() -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionError

    wrapped = rs.Retry(on=ConnectionError, attempts=3, clock=fake_clock)(down)
    with no_wait():
        for _ in range(1000):
            with pytest.raises(ConnectionError):
                wrapped()
    assert attempts == 3000


def test_budget_refusal_emits_event(fake_clock: FakeClock) -> None:
    """An empty budget skips the retry with a RetryBudgetExhausted event."""
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.0, clock=fake_clock)
    retry = rs.Retry(on=ConnectionError, budget=budget, clock=fake_clock)
    events: list[rs.Event] = []
    retry.add_listener(events.append)
    with pytest.raises(ConnectionError):
        retry(Flaky(5))()
    assert any(isinstance(e, rs.RetryBudgetExhausted) for e in events)
    exhausted = [e for e in events if isinstance(e, rs.RetriesExhausted)]
    assert exhausted[0].reason == "budget"


def test_no_wait_is_scoped(fake_clock: FakeClock) -> None:
    """no_wait() zeroes sleeps inside its block only."""
    retry = rs.Retry(on=ConnectionError, backoff=backoff.constant(1.0), clock=fake_clock)
    with no_wait():
        retry(Flaky(1))()
    retry(Flaky(1))()
    assert fake_clock.sleeps == [0.0, 1.0]


@pytest.mark.parametrize("ambient", [False, True])
def test_no_wait_keeps_the_attempts_a_deadline_allows(fake_clock: FakeClock, ambient: bool) -> None:
    """Skipped sleeps still count against the deadline (Retry's own or an outer one):
    the same attempts and events as when really waiting, only faster."""

    def attempts_and_schedules(skip: bool) -> tuple[int, int]:
        retry = rs.Retry(
            on=ConnectionError,
            attempts=10,
            deadline=None if ambient else 3.0,
            backoff=backoff.constant(1.0),
            clock=fake_clock,
        )
        scheduled: list[rs.Event] = []
        retry.add_listener(
            lambda event: scheduled.append(event) if isinstance(event, rs.RetryScheduled) else None
        )
        flaky = Flaky(100)
        with contextlib.ExitStack() as stack:
            if ambient:
                stack.enter_context(rs.deadline(3.0, clock=fake_clock))
            if skip:
                stack.enter_context(no_wait())
            with pytest.raises(ConnectionError):
                retry(flaky)()
        return flaky.calls, len(scheduled)

    assert attempts_and_schedules(skip=False) == (3, 2)
    assert attempts_and_schedules(skip=True) == (3, 2)


def test_ambient_deadline_limits_retries(fake_clock: FakeClock) -> None:
    """An outer rs.deadline() stops a retry whose next sleep would overrun it."""
    retry = rs.Retry(
        on=ConnectionError, attempts=10, backoff=backoff.constant(1.0), clock=fake_clock
    )
    flaky = Flaky(100)
    with rs.deadline(2.5, clock=fake_clock), pytest.raises(ConnectionError):
        retry(flaky)()
    assert flaky.calls == 3
    assert fake_clock.monotonic() == 2.0


def test_cancellation_like_base_exceptions_pass_through(fake_clock: FakeClock) -> None:
    """KeyboardInterrupt is never retried, even with a catch-all predicate."""
    calls = 0

    def interrupted() -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rs.Retry(on=lambda e: True, clock=fake_clock)(interrupted)()
    assert calls == 1


def test_events_report_each_retry(fake_clock: FakeClock) -> None:
    """RetryScheduled is emitted per retry with its attempt number and delay."""
    retry = rs.Retry(on=ConnectionError, backoff=backoff.constant(0.5), clock=fake_clock)
    events: list[rs.Event] = []
    retry.add_listener(events.append)
    retry(Flaky(2))()
    scheduled = [e for e in events if isinstance(e, rs.RetryScheduled)]
    assert [(e.attempt, e.delay) for e in scheduled] == [(1, 0.5), (2, 0.5)]
    assert retry.statistics() == rs.RetryStatistics(
        retries=2, recovered=1, exhausted=0, budget_refusals=0
    )


class FlowControl(BaseException):
    """A user's BaseException (one that skips ``except Exception`` on purpose)."""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on": OSError, "attempts": 0}, "attempts"),
        ({"on": OSError, "deadline": 0}, "deadline must be > 0"),
        ({"on": 42}, "on must be"),
        ({"on": (OSError, "x")}, "on must be exception types"),
        ({"on": OSError, "backoff": 3}, "backoff must be an iterable"),
        ({"on": OSError, "budget": object()}, "budget must be a RetryBudget"),
        # Classes that are not exceptions: on=str once turned retries off silently.
        ({"on": str}, "not an exception"),
        ({"on": dict}, "not an exception"),
        ({"on": []}, "at least one exception type"),
        ({"on": lambda: True}, "one argument"),
        ({"on": lambda exc, more: True}, "one argument"),
        ({"on": OSError, "clock": object()}, "clock must be a resilience Clock"),
        ({"on": OSError, "name": 5}, "name must be a str"),
        # A blank name labels nothing (and a shared state named blank is everyone's).
        ({"on": OSError, "name": ""}, "name must not be blank"),
        ({"on": OSError, "name": "   "}, "name must not be blank"),
        # A generator is used up by the first call; later calls would share the rest.
        ({"on": OSError, "backoff": (d for d in (0.1, 0.2))}, "re-iterable"),
        ({"on": OSError, "backoff": iter([0.1])}, "re-iterable"),
        # An empty schedule allows no retry; attempts=1 says that plainly.
        ({"on": OSError, "backoff": []}, "backoff is empty"),
        ({"on": OSError, "backoff": ()}, "backoff is empty"),
        ({"on": OSError, "backoff": range(0)}, "backoff is empty"),
        # Never retried whatever on= says: naming them is a mistake to point out.
        ({"on": KeyboardInterrupt}, "KeyboardInterrupt is not an Exception"),
        ({"on": (OSError, SystemExit)}, "SystemExit is not an Exception"),
        ({"on": FlowControl}, "FlowControl is not an Exception"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    """Invalid configuration fails at construction with a message naming the argument."""
    with pytest.raises(rs.ConfigurationError, match=message):
        rs.Retry(**kwargs)


def test_on_a_base_class_with_exception_subclasses_is_valid() -> None:
    """A ``BaseException`` mixin base whose subclasses include ``Exception``s (the
    ``BaseExceptionGroup`` pattern) reaches the policy through them."""

    class AppSignal(BaseException):
        pass

    class Transient(AppSignal, Exception):
        pass

    with no_wait():
        assert rs.Retry(on=AppSignal)(Flaky(1, Transient()))() == "ok"


def test_on_base_exception_group_retries_exception_groups() -> None:
    """``BaseExceptionGroup`` is no Exception subclass, but its ``ExceptionGroup`` is:
    a task group's failure reaches the policy, so ``on=BaseExceptionGroup`` is valid."""
    with no_wait():
        flaky = Flaky(1, ExceptionGroup("tasks", [OSError("one")]))
        assert rs.Retry(on=BaseExceptionGroup)(flaky)() == "ok"
    assert (
        rs.Fallback("degraded", on=BaseExceptionGroup)(
            lambda: (_ for _ in ()).throw(ExceptionGroup("g", [KeyError()]))
        )()
        == "degraded"
    )


@pytest.mark.parametrize(
    "on",
    [
        [OSError, KeyError],
        {KeyError},
        collections.deque([KeyError]),
        {KeyError: "why"}.keys(),
        lambda exc, strict=False: True,
        lambda *args: True,
    ],
)
def test_on_accepts_a_list_of_types_and_any_one_argument_predicate(on: Any) -> None:
    """``on=[A, B]`` means ``(A, B)``: any sequence or set of types, as its type says
    (``Sequence``, ``Set``); predicates with defaults or ``*args`` are fine."""
    failures = [KeyError("once")]

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    assert rs.Retry(on=on, backoff=rs.backoff.constant(0))(flaky)() == "ok"


@pytest.mark.parametrize("on", ["KeyError", b"KeyError"])
def test_on_refuses_text_though_it_is_a_sequence(on: Any) -> None:
    """A string names no exception type: refused at construction, not read as letters."""
    with pytest.raises(rs.ConfigurationError, match="exception type"):
        rs.Retry(on=on)


def test_a_clock_of_none_is_the_system_clock() -> None:
    """``clock=None`` (what other policies default to) means the system clock."""
    assert rs.Retry(on=OSError, clock=None)(lambda: 1)() == 1
    assert rs.Timeout(1, clock=None)(lambda: 2)() == 2


def test_on_is_required() -> None:
    """Retry has no default for on=: retrying everything is a choice, not a default."""
    with pytest.raises(TypeError):
        rs.Retry()  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_async_retry_sleeps_on_the_clock(fake_clock: FakeClock) -> None:
    """The async shell retries with the same schedule, on asyncio and trio."""
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError
        return "ok"

    retry = rs.Retry(on=ConnectionError, backoff=backoff.constant(0.2), clock=fake_clock)
    assert await retry(flaky)() == "ok"
    assert fake_clock.sleeps == [0.2, 0.2]


@pytest.mark.anyio
async def test_async_retry_gives_up_at_deadline(fake_clock: FakeClock) -> None:
    """The async shell respects its total deadline like the sync one."""
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    retry = rs.Retry(
        on=ConnectionError,
        attempts=50,
        deadline=1.0,
        backoff=backoff.constant(0.3),
        clock=fake_clock,
    )
    with pytest.raises(ConnectionError):
        await retry(down)()
    assert calls == 4
    assert fake_clock.monotonic() <= 1.0


# -- garbage ----------------------------------------------------------------------------


class Down(ConnectionError):
    """A failure that can be weakly referenced (to see when it is freed)."""


def _always_fails() -> None:
    raise Down("down")


def _freed_without_the_collector(run: Any) -> bool:
    """Whether the exception ``run()`` raises is freed by reference counting alone.

    A reference cycle through it (exception -> traceback -> frame -> exception) would
    keep it alive until the cycle collector runs; the collector is off meanwhile.
    """
    gc.disable()
    try:
        try:
            run()
        except Down as exc:
            ref = weakref.ref(exc)
        return ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("deadline", [None, 5.0])
def test_a_retry_that_gives_up_leaves_no_reference_cycles(
    fake_clock: FakeClock, deadline: float | None
) -> None:
    """The re-raised exception's traceback does not find its way back to the exception
    through the retry's frame: a service retrying thousands of failures a second leaves
    nothing for the cycle collector, whose full passes pause it (426 ms in the demo)."""
    retry = rs.Retry(on=ConnectionError, attempts=3, deadline=deadline, clock=fake_clock)
    decorated = retry(_always_fails)
    assert _freed_without_the_collector(lambda: retry.call(_always_fails))
    assert _freed_without_the_collector(decorated)


def test_an_async_retry_that_gives_up_leaves_no_reference_cycles() -> None:
    """The same for ``call_async`` and for an ``async def`` decorated by Retry."""

    async def always_fails() -> None:
        raise Down("down")

    retry = rs.Retry(on=ConnectionError, attempts=3, backoff=backoff.constant(0.0))
    decorated = retry(always_fails)

    async def freed(run: Any) -> bool:
        gc.disable()
        try:
            try:
                await run()
            except Down as exc:
                ref = weakref.ref(exc)
            return ref() is None
        finally:
            gc.enable()

    async def main() -> list[bool]:
        return [await freed(lambda: retry.call_async(always_fails)), await freed(decorated)]

    assert asyncio.run(main()) == [True, True]


async def _to_the_end(run: Any) -> None:
    """Call ``run``; await what it returns if that is a coroutine."""
    result = run()
    if asyncio.iscoroutine(result):
        await result


class Attempt(ConnectionError):
    """The failure of one numbered attempt."""


@pytest.mark.anyio
@pytest.mark.parametrize("shell", ["call", "decorated", "deadline"])
async def test_the_last_exception_chains_every_attempt_in_order(
    fake_clock: FakeClock, shell: str
) -> None:
    """Attempt n's exception has attempt n - 1's as its context, as if raised while
    handling it, so the traceback shows every attempt in order (the third attempt's
    used to point at the first, skipping the second)."""
    deadline = 60.0 if shell == "deadline" else None
    retry = rs.Retry(on=Attempt, attempts=3, deadline=deadline, clock=fake_clock)
    count = itertools.count(1)

    def fails() -> None:
        raise Attempt(next(count))

    async def fails_async() -> None:
        raise Attempt(next(count))

    for run in (
        (lambda: retry.call(fails)) if shell != "decorated" else retry(fails),
        (lambda: retry.call_async(fails_async)) if shell != "decorated" else retry(fails_async),
    ):
        with pytest.raises(Attempt) as caught:
            await _to_the_end(run)
        chain = _attempts(caught.value)
        assert chain == sorted(chain, reverse=True)
        assert len(chain) == 3


def _attempts(error: BaseException) -> list[Any]:
    """The attempt numbers along ``error``'s chain of contexts, latest first."""
    chain = []
    exc: BaseException | None = error
    while exc is not None:
        chain.append(exc.args[0])
        exc = exc.__context__
    return chain


class _Payload:
    """What an attempt's frame holds (a response, a buffer)."""


@pytest.mark.anyio
async def test_a_long_retry_loop_keeps_only_the_latest_attempts_alive(
    fake_clock: FakeClock,
) -> None:
    """Chaining every attempt kept each one's exception, frames and locals alive until
    the call ended (1,000 attempts holding 100 KB each: 100 MB); the raised exception
    shows the last three attempts, in order, and older ones are freed as it goes."""
    retry = rs.Retry(on=Attempt, attempts=50, backoff=rs.backoff.constant(0.0), clock=fake_clock)
    refs: list[weakref.ref[_Payload]] = []
    peak = 0

    def fails() -> None:
        nonlocal peak
        payload = _Payload()
        refs.append(weakref.ref(payload))
        peak = max(peak, sum(1 for ref in refs if ref() is not None))
        raise Attempt(len(refs), payload)

    async def fails_async() -> None:
        fails()

    gc.disable()  # freed by reference counting alone, as they go
    try:
        for run in (lambda: retry.call(fails), lambda: retry.call_async(fails_async)):
            refs.clear()
            peak = 0
            with pytest.raises(Attempt) as caught:
                await _to_the_end(run)
            assert _attempts(caught.value) == [50, 49, 48]
            # The running attempt's, the three chained, and the first (the call's own
            # frame holds it until it ends): 5 of 50 at most.
            assert peak <= 5
    finally:
        gc.enable()


def test_an_exception_raised_again_by_every_attempt_makes_no_cycle(fake_clock: FakeClock) -> None:
    """A function raising the same two instances by turns: no context cycle is made."""
    error = Attempt("always the same")
    other = Attempt("the other one")
    instances = itertools.cycle([error, other])

    def fails() -> None:
        raise next(instances)

    retry = rs.Retry(on=Attempt, attempts=5, clock=fake_clock)
    with pytest.raises(Attempt) as caught:
        retry.call(fails)
    seen: list[BaseException] = []
    exc: BaseException | None = caught.value
    while exc is not None:
        assert exc not in seen
        seen.append(exc)
        exc = exc.__context__
    assert seen[0] is error  # the fifth attempt's


@pytest.mark.anyio
async def test_a_retry_cancelled_in_its_backoff_is_not_counted() -> None:
    """Cancelled while sleeping before attempt 2: ``retries`` counts attempts started,
    so it stays 0 (it used to count the retry when it was scheduled)."""
    import anyio

    clock = FakeClock()
    retry = rs.Retry(on=ConnectionError, attempts=5, backoff=backoff.constant(10), clock=clock)
    calls = 0

    async def fails_then_cancels() -> None:
        nonlocal calls
        calls += 1
        scope.cancel()
        raise ConnectionError

    with anyio.CancelScope() as scope:
        await retry.call_async(fails_then_cancels)
    assert calls == 1
    assert retry.statistics().retries == 0


def test_no_retry_starts_exactly_at_the_deadline(fake_clock: FakeClock) -> None:
    """With 0.5 s left and a 0.5 s backoff, the retry would start with nothing left: it
    is not made (it used to be, only to overrun the deadline or time out at once)."""
    retry = rs.Retry(
        on=ConnectionError,
        attempts=5,
        backoff=backoff.constant(0.5),
        deadline=1.0,
        clock=fake_clock,
    )
    flaky = Flaky(10)
    with pytest.raises(ConnectionError):
        retry(flaky)()
    assert flaky.calls == 2  # at 0 s and 0.5 s; not at 1.0 s
    assert fake_clock.monotonic() == 0.5


@pytest.mark.parametrize("broken", ["predicate", "backoff"])
def test_a_callback_that_raises_keeps_the_failure_that_led_there(broken: str) -> None:
    """An on= predicate or a backoff schedule that raises: its error carries the
    exception being judged as __context__, as an except block would (it was lost)."""

    def predicate(exc: BaseException) -> bool:
        return exc.response.status >= 500  # type: ignore[attr-defined]

    def schedule() -> Any:
        raise RuntimeError("schedule bug")
        yield 0.0  # pragma: no cover - a generator that fails at once

    class Broken(rs.backoff.Backoff):  # type: ignore[misc]
        def __iter__(self) -> Any:
            return schedule()

    retry = (
        rs.Retry(on=predicate, attempts=3)
        if broken == "predicate"
        else rs.Retry(on=ConnectionError, attempts=3, backoff=Broken())
    )

    def call() -> None:
        raise ConnectionError("the real problem")

    with pytest.raises((AttributeError, RuntimeError)) as caught:
        retry.call(call)
    assert isinstance(caught.value.__context__, ConnectionError)


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised inside a listener."""


@pytest.mark.anyio
async def test_a_retry_a_listener_interrupted_as_it_was_scheduled_is_not_paid_for() -> None:
    """A listener raising a BaseException on RetryScheduled ends the call before the
    retry is sent: the retry goes back to the budget, as a backoff cancelled does."""
    for shell in ("sync", "async"):
        clock = FakeClock()
        budget = rs.RetryBudget(ratio=0.0, min_per_second=1.0, window=10.0, clock=clock)
        retry = rs.Retry(on=ConnectionError, attempts=3, budget=budget, clock=clock)

        def interrupt(event: rs.Event) -> None:
            if isinstance(event, rs.RetryScheduled):
                raise _Interrupt

        retry.add_listener(interrupt)
        calls: list[int] = []

        def down() -> None:
            calls.append(1)
            raise ConnectionError

        async def down_async() -> None:
            down()

        if shell == "sync":
            with pytest.raises(_Interrupt):
                retry.call(down)
        else:
            with pytest.raises(_Interrupt):
                await retry.call_async(down_async)
        assert len(calls) == 1
        assert budget.statistics().retries == 0
        assert retry.statistics().retries == 0
