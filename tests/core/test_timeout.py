"""Timeout: async calls are cut at the limit; sync calls are checked around the call."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.testing import FakeClock


@pytest.mark.anyio
async def test_async_call_is_cancelled_at_the_virtual_limit(fake_clock: FakeClock) -> None:
    """With a FakeClock, a call sleeping past the limit is cut exactly at it."""
    finished = False

    @rs.Timeout(1.0, clock=fake_clock)
    async def slow() -> None:
        nonlocal finished
        await fake_clock.sleep_async(5)
        finished = True

    with pytest.raises(rs.Timeout) as caught:
        await slow()
    assert isinstance(caught.value, TimeoutError)
    assert not finished
    assert fake_clock.monotonic() == 1.0


@pytest.mark.anyio
async def test_a_sleep_cut_by_the_limit_stops_the_fake_clock_there(fake_clock: FakeClock) -> None:
    """A virtual sleep that a Timeout cuts ends at the deadline, as a real one would;
    the sleeps of a second call run on from there."""
    timeout = rs.Timeout(2.0, clock=fake_clock)
    for expected in (2.0, 4.0):
        with pytest.raises(rs.Timeout):
            async with timeout:
                await fake_clock.sleep_async(30)
        assert fake_clock.monotonic() == expected
    fired: list[float] = []
    fake_clock.call_at(5.0, lambda: fired.append(fake_clock.monotonic()))
    await fake_clock.sleep_async(3)  # a timer that cancels nothing does not stop a sleep
    assert (fired, fake_clock.monotonic()) == ([5.0], 7.0)


@pytest.mark.anyio
async def test_async_call_within_limit_returns(fake_clock: FakeClock) -> None:
    """A call that finishes in time returns its value."""

    @rs.Timeout(1.0, clock=fake_clock)
    async def quick() -> int:
        await fake_clock.sleep_async(0.5)
        return 7

    assert await quick() == 7


@pytest.mark.anyio
async def test_async_call_is_cancelled_on_the_real_loop() -> None:
    """On the system clock the event loop's timer cancels a hung call."""

    @rs.Timeout(0.05)
    async def hangs() -> None:
        await anyio.sleep_forever()

    with anyio.fail_after(5):  # the test itself must not hang
        with pytest.raises(rs.Timeout):
            await hangs()


@pytest.mark.anyio
async def test_async_timeout_enters_only_a_sooner_deadline_on_the_real_clock() -> None:
    """The call sees this timeout's deadline; an outer, sooner deadline stays in force
    (and cuts the call); a spent one refuses before the call starts; nothing is left
    behind in the context."""
    seen: list[object] = []

    @rs.Timeout(5.0)
    async def probe() -> None:
        seen.append(rs.time_remaining())

    @rs.Timeout(5.0)
    async def hangs() -> None:
        seen.append(rs.current_deadline())
        await anyio.sleep_forever()

    await probe()
    assert isinstance(seen[-1], float)
    assert 4.0 < seen[-1] <= 5.0
    with rs.deadline(0.05):
        outer = rs.current_deadline()
        with anyio.fail_after(5), pytest.raises(rs.Timeout):
            await hangs()
        assert seen[-1] is outer
    with rs.deadline(0.0):
        calls = len(seen)
        with pytest.raises(rs.Timeout):
            await probe()
        assert len(seen) == calls  # never started
    assert rs.current_deadline() is None


@pytest.mark.anyio
async def test_a_call_that_gets_no_time_says_so(fake_clock: FakeClock) -> None:
    """Entered with the ambient deadline already spent, a Timeout refuses before the
    call and says the deadline had passed; its event reports the 0 seconds it gave
    (it said "timed out after 5s", a limit that was never applied), in every form."""
    timeout = rs.Timeout(5.0, clock=fake_clock)
    events: list[Any] = []
    timeout.add_listener(events.append)

    async def work() -> None:
        raise AssertionError("never started")

    with rs.deadline(1.0, clock=fake_clock):
        fake_clock.advance(1.0)
        attempts: list[Callable[[], Any]] = [
            lambda: timeout.call(lambda: None),
            lambda: timeout.__enter__(),
        ]
        for attempt in attempts:
            with pytest.raises(rs.Timeout, match="deadline had passed before the call"):
                attempt()
        with pytest.raises(rs.Timeout, match="deadline had passed before the call"):
            await timeout.call_async(work)
    assert [event.seconds for event in events] == [0.0, 0.0, 0.0]
    assert timeout.statistics().timed_out == 3


def test_a_timeout_error_keeps_its_message_when_pickled_or_copied(fake_clock: FakeClock) -> None:
    """A spent deadline's message survives pickling (a process pool) and copying; it
    came back as "timed out after 5s"."""
    import copy
    import pickle

    timeout = rs.Timeout(5.0, clock=fake_clock)
    with rs.deadline(1.0, clock=fake_clock):
        fake_clock.advance(1.0)
        with pytest.raises(rs.Timeout) as info:
            timeout.call(lambda: None)
    for again in (pickle.loads(pickle.dumps(info.value)), copy.copy(info.value)):
        assert str(again) == str(info.value)
        assert "deadline had passed" in str(again)
        assert again.seconds == 5.0
    assert str(pickle.loads(pickle.dumps(rs.Timeout(2.5)))) == "timed out after 2.5s"


def test_a_copied_timeout_policy_keeps_its_name_and_clock(fake_clock: FakeClock) -> None:
    """copy/deepcopy of a Timeout (or of a Pipeline holding one) keeps its name and its
    clock, the same virtual time (it came back named "Timeout" on the system clock, and
    a copied pipeline's timeout no longer followed the test's FakeClock); pickling keeps
    the name (the clock stays behind)."""
    import copy
    import pickle

    timeout = rs.Timeout(5.0, clock=fake_clock, name="llm")
    for again in (copy.copy(timeout), copy.deepcopy(timeout)):
        assert (again.name, again.seconds, again._clock) == ("llm", 5.0, fake_clock)
    [inner] = copy.deepcopy(rs.Pipeline(timeout)).policies
    assert isinstance(inner, rs.Timeout)
    assert inner._clock is fake_clock
    assert pickle.loads(pickle.dumps(timeout)).name == "llm"
    # A raised one's notes and the attributes a handler set go along too.
    error = rs.Timeout(2.0, name="llm")
    error.add_note("while asking the model")
    error.request_id = "r-42"  # type: ignore[attr-defined]
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert again.__notes__ == ["while asking the model"]
        assert again.request_id == "r-42"  # type: ignore[attr-defined]
        assert (again.name, str(again)) == ("llm", "timed out after 2s")


@pytest.mark.anyio
async def test_a_spent_deadline_reads_the_same_on_the_real_clock() -> None:
    """The same on the real clock, where async calls take another path."""
    timeout = rs.Timeout(5.0)
    events: list[Any] = []
    timeout.add_listener(events.append)

    async def work() -> None:
        raise AssertionError("never started")

    with rs.deadline(0.001):
        await anyio.sleep(0.01)
        with pytest.raises(rs.Timeout, match="deadline had passed before the call"):
            await timeout.call_async(work)
        with pytest.raises(rs.Timeout, match="deadline had passed before the call"):
            timeout.call(lambda: None)
    assert [event.seconds for event in events] == [0.0, 0.0]


@pytest.mark.anyio
async def test_a_call_that_takes_exactly_its_limit_times_out_sync_and_async(
    fake_clock: FakeClock,
) -> None:
    """At the limit is past it, in both shells: a FakeClock cut fires at its time, so
    the async call timed out while the same sync call returned its value."""
    timeout = rs.Timeout(1.0, clock=fake_clock)

    def sync_work() -> str:
        fake_clock.advance(1.0)
        return "value"

    async def async_work() -> str:
        await fake_clock.sleep_async(1.0)
        return "value"

    with pytest.raises(rs.Timeout):
        timeout.call(sync_work)
    with pytest.raises(rs.Timeout):
        await timeout.call_async(async_work)
    with pytest.raises(rs.Timeout), timeout:
        sync_work()


@pytest.mark.anyio
async def test_async_context_manager_cancels_its_block() -> None:
    """async with rs.Timeout(s) cuts the enclosed block."""
    timeout = rs.Timeout(0.05)
    with anyio.fail_after(5), pytest.raises(rs.Timeout) as caught:
        async with timeout:
            await anyio.sleep_forever()
    # The cancellation that cut the block is no error the timeout happened "during the
    # handling of" (the traceback showed it so; call_async did not).
    assert caught.value.__suppress_context__


@pytest.mark.anyio
async def test_outer_cancellation_is_not_turned_into_timeout() -> None:
    """A cancel from outside the policy stays a cancellation."""
    timeout = rs.Timeout(10)
    reached = False
    with anyio.move_on_after(0.05) as scope:

        @timeout
        async def hangs() -> None:
            await anyio.sleep_forever()

        await hangs()
        reached = True
    assert scope.cancelled_caught
    assert not reached
    assert timeout.statistics().timed_out == 0


@pytest.mark.anyio
@pytest.mark.parametrize("clock", ["real", "fake"])
async def test_a_call_that_swallows_the_cut_still_times_out(
    clock: str, fake_clock: FakeClock
) -> None:
    """A coroutine that catches the cancellation and returns anyway (a bare ``except:``
    around its await) returned its late value, uncounted; like the sync path, the late
    value is discarded: ``rs.Timeout``, counted once, and ``async with`` the same."""
    timeout = rs.Timeout(0.05, clock=fake_clock if clock == "fake" else None)

    async def nap() -> None:
        if clock == "fake":
            await fake_clock.sleep_async(5)
        else:
            await anyio.sleep(5)

    @timeout
    async def swallows() -> str:
        try:
            await nap()
        except BaseException:  # the user's bug this test is about
            return "late"
        return "never"

    async def block_swallows() -> None:
        async with timeout:
            try:
                await nap()
            except BaseException:
                pass

    with anyio.fail_after(5):
        with pytest.raises(rs.Timeout):
            await swallows()
        with pytest.raises(rs.Timeout):
            await block_swallows()
    assert timeout.statistics().timed_out == 2
    await anyio.sleep(0)  # no cancellation is left pending on the task


def test_a_cut_call_that_fails_otherwise_leaves_no_cancel_request_behind() -> None:
    """An inner Timeout cuts a call whose cleanup then raises another error: that error
    goes on, and the task carries no leftover cancel request (it used to, and the outer
    timeout's own expiry then escaped as a bare CancelledError, past any Fallback)."""

    async def main() -> str:
        @rs.Timeout(0.01)
        async def cleanup_fails() -> None:
            try:
                await asyncio.sleep(10)
            finally:
                raise ConnectionResetError("close failed")

        @rs.Fallback("degraded")
        @rs.Timeout(0.05)
        async def outer() -> str:
            with pytest.raises(ConnectionResetError):
                await cleanup_fails()
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            await asyncio.sleep(10)  # cut by the outer limit: rs.Timeout, so degraded
            return "never"

        return await outer()

    assert asyncio.run(main()) == "degraded"


@pytest.mark.anyio
@pytest.mark.timeout(30)  # the bug left the call hanging
async def test_a_fake_clock_advanced_from_another_thread_still_cuts_the_call() -> None:
    """A FakeClock fires its timers in the thread that advances it (a sync endpoint's
    worker thread): the cut used to run scope.cancel() there, raising RuntimeError out
    of clock.sleep() and leaving the timed call to hang. It is handed to the loop."""

    clock = FakeClock()
    timeout = rs.Timeout(1.0, clock=clock)
    errors: list[BaseException] = []

    def advance_elsewhere() -> None:
        try:
            clock.sleep(5)
        except BaseException as exc:
            errors.append(exc)

    async def hangs() -> None:
        await anyio.sleep_forever()

    async def advance_soon() -> None:
        await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(advance_elsewhere)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(advance_soon)
            with pytest.raises(rs.Timeout):
                await timeout.call_async(hangs)
    assert errors == []
    assert clock.monotonic() == 5.0


def test_task_keeps_running_normally_after_an_asyncio_timeout() -> None:
    """After a Timeout on asyncio the task has no pending cancellation left."""

    async def main() -> str:
        @rs.Timeout(0.01)
        async def hangs() -> None:
            await asyncio.sleep(10)

        with pytest.raises(rs.Timeout):
            await hangs()
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        await asyncio.sleep(0.001)  # would raise CancelledError if a cancel were pending
        return "alive"

    assert asyncio.run(main()) == "alive"


def test_sync_overrun_raises_and_discards_result(fake_clock: FakeClock) -> None:
    """A sync call that returns after its limit raises Timeout instead of returning."""

    @rs.Timeout(1.0, clock=fake_clock)
    def slow() -> int:
        fake_clock.advance(2)
        return 1

    with pytest.raises(rs.Timeout):
        slow()


def test_sync_call_is_not_started_past_the_deadline(fake_clock: FakeClock) -> None:
    """When the ambient deadline has passed, the sync call is not made."""
    calls = 0

    @rs.Timeout(1.0, clock=fake_clock)
    def work() -> None:
        nonlocal calls
        calls += 1

    with rs.deadline(0.5, clock=fake_clock):
        fake_clock.advance(0.6)
        with pytest.raises(rs.Timeout):
            work()
    assert calls == 0


def test_sync_timeout_sets_the_ambient_deadline(fake_clock: FakeClock) -> None:
    """Inside a sync Timeout the remaining time is visible to inner policies."""
    seen: list[float | None] = []

    @rs.Timeout(2.0, clock=fake_clock)
    def work() -> None:
        fake_clock.advance(0.5)
        seen.append(rs.time_remaining())

    work()
    assert seen == [pytest.approx(1.5)]


def test_inner_timeout_clamps_to_outer_deadline(fake_clock: FakeClock) -> None:
    """An inner Timeout(10) inside a 1 s deadline gives up at 1 s."""
    with rs.deadline(1.0, clock=fake_clock):

        @rs.Timeout(10, clock=fake_clock)
        def work() -> None:
            fake_clock.advance(1.5)

        with pytest.raises(rs.Timeout, match="timed out after 1s"):
            work()


def test_sync_context_manager(fake_clock: FakeClock) -> None:
    """with rs.Timeout(s): raises at exit if the block overran."""
    timeout = rs.Timeout(1.0, clock=fake_clock)
    with timeout:
        fake_clock.advance(0.5)
    with pytest.raises(rs.Timeout), timeout:
        fake_clock.advance(1.5)


def test_a_sync_call_that_fails_past_its_limit_times_out_as_async_does(
    fake_clock: FakeClock,
) -> None:
    """A sync call or block that raises at or after its limit gives rs.Timeout (its own
    error as the cause), counted and reported: async code would have been cut at the
    limit, so an outer Retry(on=rs.Timeout) or a breaker sees the same outcome."""
    timeout = rs.Timeout(1.0, clock=fake_clock)
    events: list[rs.Event] = []
    timeout.add_listener(events.append)

    def slow_then_reset() -> None:
        fake_clock.advance(2)
        raise ConnectionResetError("reset")

    with pytest.raises(rs.Timeout) as caught:
        timeout(slow_then_reset)()
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    with pytest.raises(rs.Timeout) as caught, timeout:
        slow_then_reset()
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert timeout.statistics().timed_out == 2
    assert events == [rs.TimedOut(policy="Timeout", seconds=1.0)] * 2

    attempts = 0

    def counted() -> None:
        nonlocal attempts
        attempts += 1
        slow_then_reset()

    retried = rs.Retry(on=rs.Timeout, attempts=2, backoff=[0], clock=fake_clock)
    with pytest.raises(rs.Timeout):
        retried(timeout(counted))()
    assert attempts == 2


def test_nested_sync_timeouts_on_one_deadline_time_out_once(fake_clock: FakeClock) -> None:
    """An inner Timeout clamped to an outer one's deadline raises there, counted once
    on the outer one whose limit it was (one TimedOut, named after it), whether the
    call returned or failed late, through call() or nested with blocks."""
    outer = rs.Timeout(1.0, clock=fake_clock, name="total")
    inner = rs.Timeout(5.0, clock=fake_clock, name="per_attempt")
    events: list[rs.Event] = []
    outer.add_listener(events.append)
    inner.add_listener(events.append)

    def late() -> None:
        fake_clock.advance(2)

    def fails_late() -> None:
        fake_clock.advance(2)
        raise ConnectionResetError

    for work in (late, fails_late):
        with pytest.raises(rs.Timeout) as caught:
            outer.call(inner.call, work)
        assert not isinstance(caught.value.__cause__, rs.Timeout)
        with pytest.raises(rs.Timeout) as caught, outer, inner:
            work()
        assert not isinstance(caught.value.__cause__, rs.Timeout)
    assert [event.policy for event in events] == ["total"] * 4
    assert outer.statistics().timed_out == 4
    assert inner.statistics().timed_out == 0


@pytest.mark.anyio
async def test_nested_async_timeouts_count_on_the_one_whose_limit_it_was() -> None:
    """Cut at an outer Timeout's sooner (or equal) deadline, asyncio and trio both count
    the timeout once, on the outer one, as sync code does: whichever timer fired first,
    the inner one only enforced the outer limit."""

    async def hangs() -> None:
        await anyio.sleep_forever()

    for outer_limit, inner_limit in ((0.02, 1.0), (0.02, 0.02)):
        outer = rs.Timeout(outer_limit, name="total")
        inner = rs.Timeout(inner_limit, name="per_attempt")
        events: list[rs.Event] = []
        outer.add_listener(events.append)
        inner.add_listener(events.append)
        with anyio.fail_after(5):
            with pytest.raises(rs.Timeout):
                await outer.call_async(inner.call_async, hangs)
            with pytest.raises(rs.Timeout):
                async with outer, inner:
                    await hangs()
        assert [event.policy for event in events] == ["total", "total"]
        assert (outer.statistics().timed_out, inner.statistics().timed_out) == (2, 0)


def test_a_nested_timeout_counts_once_through_a_fallback_and_alone_in_a_deadline(
    fake_clock: FakeClock,
) -> None:
    """A Fallback between two Timeouts that swallows the inner cut does not make it
    count twice: the outer one, whose deadline it was, discards the late fallback value
    uncounted. Inside ``rs.deadline`` (no Timeout's limit) the inner Timeout counts."""
    outer = rs.Timeout(1.0, clock=fake_clock, name="total")
    inner = rs.Timeout(5.0, clock=fake_clock, name="per_attempt")
    degraded = rs.Fallback(lambda: "degraded", on=rs.Timeout)
    events: list[rs.Event] = []
    for policy in (outer, inner):
        policy.add_listener(events.append)

    def slow() -> str:
        fake_clock.advance(2)
        return "late"

    with pytest.raises(rs.Timeout):
        outer.call(degraded.call, inner.call, slow)
    assert [event.policy for event in events] == ["total"]
    with rs.deadline(1.0, clock=fake_clock), pytest.raises(rs.Timeout):
        inner.call(slow)
    assert [event.policy for event in events] == ["total", "per_attempt"]


def test_a_sync_failure_before_the_limit_and_an_interrupt_pass_through(
    fake_clock: FakeClock,
) -> None:
    """Only the limit turns an error into a timeout: one raised in time is the call's
    own, and KeyboardInterrupt (not an Exception) is never replaced."""
    timeout = rs.Timeout(1.0, clock=fake_clock)

    def fails_in_time() -> None:
        fake_clock.advance(0.5)
        raise ConnectionResetError

    def interrupted_late() -> None:
        fake_clock.advance(2)
        raise KeyboardInterrupt

    with pytest.raises(ConnectionResetError):
        timeout(fails_in_time)()
    with pytest.raises(ConnectionResetError), timeout:
        fails_in_time()
    with pytest.raises(KeyboardInterrupt):
        timeout(interrupted_late)()
    with pytest.raises(KeyboardInterrupt), timeout:
        interrupted_late()
    assert timeout.statistics().timed_out == 0
    assert rs.current_deadline() is None  # every exit left the ambient deadline


def test_retry_inside_timeout_stops_before_the_deadline(fake_clock: FakeClock) -> None:
    """Retry does not start a sleep that would overrun an enclosing Timeout."""
    calls = 0

    def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError

    pipeline = rs.Pipeline(
        rs.Timeout(2.0, clock=fake_clock),
        rs.Retry(
            on=ConnectionError, attempts=100, backoff=rs.backoff.constant(0.6), clock=fake_clock
        ),
    )
    with pytest.raises(ConnectionError):
        pipeline(down)()
    assert calls == 4  # at 0, 0.6, 1.2, 1.8; the next sleep would end at 2.4


def test_timed_out_event(fake_clock: FakeClock) -> None:
    """TimedOut is emitted with the limit that was applied."""
    timeout = rs.Timeout(1.0, clock=fake_clock)
    events: list[rs.Event] = []
    timeout.add_listener(events.append)
    with pytest.raises(rs.Timeout):
        timeout(lambda: fake_clock.advance(3))()
    assert events == [rs.TimedOut(policy="Timeout", seconds=1.0)]
    assert timeout.statistics().timed_out == 1


@pytest.mark.parametrize(
    "seconds", [0, -1, float("nan"), float("inf"), None, "1", "1.5s", "200ms", "inf"]
)
def test_bad_seconds(seconds: object) -> None:
    """The limit must be a positive number: text that reads as one is refused, not
    taken for an error message."""
    with pytest.raises(rs.ConfigurationError, match="seconds"):
        rs.Timeout(seconds)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_timeout_built_without_a_limit_is_an_error_only() -> None:
    """``rs.Timeout()`` and ``rs.Timeout("message")`` build the error alone, for code
    that raises it itself: caught as ``rs.Timeout`` and ``TimeoutError``, retried by
    ``Retry(on=rs.Timeout)``, its message kept by pickling and copying. Used as a
    policy it refuses, naming the fix, instead of running without a limit."""
    for error, message in ((rs.Timeout(), "timed out"), (rs.Timeout("model too slow"), None)):
        assert isinstance(error, TimeoutError)
        assert error.seconds == float("inf")
        for twin in (error, pickle.loads(pickle.dumps(error)), copy.copy(error)):
            assert str(twin) == (message or "model too slow")
        bare = copy.copy(error)
        bare.args = ()
        assert str(bare) == "timed out"
        attempts = 0

        @rs.Retry(on=rs.Timeout, attempts=2, backoff=[0.0])
        def slow() -> None:
            nonlocal attempts
            attempts += 1
            raise error

        with pytest.raises(rs.Timeout):
            slow()
        assert attempts == 2

        async def work() -> None:
            return None

        uses: list[Callable[[], object]] = [
            lambda: error.call(int),
            lambda: error(int),
            lambda: error(work),
            lambda: rs.Pipeline(error).call(int),
            lambda: error.__enter__(),
        ]
        for use in uses:
            with pytest.raises(rs.ConfigurationError, match="without a limit"):
                use()
        with pytest.raises(rs.ConfigurationError, match="without a limit"):
            await error.call_async(work)
        with pytest.raises(rs.ConfigurationError, match="without a limit"):
            async with error:
                pass


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_shielded_section_inside_the_call_finishes_before_the_cut(
    anyio_backend: str,
) -> None:
    """On asyncio a decorated Timeout cuts with a loop timer and ``task.cancel()``,
    which went through anyio's shields: cleanup the call shielded (closing a
    connection, committing) was cut in the middle. The cut now waits for the shield to
    be left, as an anyio cancel scope does. Both timers are the loop's, so their order
    does not depend on the machine's speed: the deadline passes while the shielded
    section waits, and the section is released 30 ms later."""
    loop = asyncio.get_running_loop()
    released = asyncio.Event()
    log: list[str] = []

    @rs.Timeout(0.001)
    async def call() -> None:
        with anyio.CancelScope(shield=True):
            loop.call_later(0.03, released.set)
            await released.wait()
            log.append("shielded section finished")
        await anyio.sleep(1)
        log.append("not cut")

    with pytest.raises(rs.Timeout):
        await call()
    assert log == ["shielded section finished"]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_shield_around_the_timed_call_does_not_stop_its_cut(anyio_backend: str) -> None:
    """Only shields entered inside the call hold the cut back: a Timeout used within a
    shielded block (a cleanup bounded in time) still cuts its call."""

    @rs.Timeout(0.001)
    async def stuck() -> None:
        await asyncio.Event().wait()

    with anyio.CancelScope(shield=True), pytest.raises(rs.Timeout):
        await stuck()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_call_that_returns_from_its_shield_past_the_limit_is_late(
    anyio_backend: str,
) -> None:
    """The cut waits for a shield, but a call whose shielded section is its last step
    returns past its limit: that late value is discarded, as always (the expiry was due
    while the section ran, though it never cancelled the task)."""
    loop = asyncio.get_running_loop()
    released = asyncio.Event()

    @rs.Timeout(0.001)
    async def close_and_return() -> str:
        with anyio.CancelScope(shield=True):
            loop.call_later(0.03, released.set)
            await released.wait()
        return "late value"

    with pytest.raises(rs.Timeout):
        await close_and_return()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


def test_a_timeout_inside_a_deadline_on_another_clock_measures_on_its_own() -> None:
    """An outer, sooner deadline on another clock (a FakeClock ``Retry`` around a
    system-clock ``Timeout``, or the reverse) clamps the limit but is not compared with
    this policy's clock: an instant call used to time out, and a call that overran
    its limit by 95 s of its clock had its late value returned."""
    fake = FakeClock()
    retry = rs.Retry(on=ConnectionError, deadline=30, clock=fake)
    assert retry.call(rs.Timeout(60).call, lambda: "instant") == "instant"
    with rs.deadline(30, clock=fake), rs.Timeout(60):
        pass

    def overrun() -> str:
        fake.advance(100)
        return "late value"

    with rs.deadline(5), pytest.raises(rs.Timeout):
        rs.Timeout(10, clock=fake).call(overrun)
    with rs.deadline(5), pytest.raises(rs.Timeout), rs.Timeout(10, clock=fake):
        fake.advance(100)


@pytest.mark.anyio
async def test_async_with_inside_a_deadline_on_another_clock_is_cut_at_the_limit() -> None:
    """``async with`` on a FakeClock inside a 5 s system-clock deadline is cut at 5 s of
    its clock, as ``call_async`` is (its timer was set at the outer deadline's absolute
    time, read on the wrong clock, and never fired)."""
    fake = FakeClock()
    with rs.deadline(5):
        start = fake.monotonic()
        with pytest.raises(rs.Timeout):
            async with rs.Timeout(10, clock=fake):
                await fake.sleep_async(8)
        assert fake.monotonic() - start == pytest.approx(5.0, abs=0.05)  # 5 s less real time spent
