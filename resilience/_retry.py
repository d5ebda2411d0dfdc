"""Retry: attempts, a total deadline, jittered backoff, budgets and ``retry_after`` hints."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from . import _deadline
from ._budget import RetryBudget
from ._clock import Clock
from ._events import RetriesExhausted, RetryBudgetExhausted, RetryScheduled
from ._matching import ExceptionFilter, ExceptionMatcher
from ._policy import PolicyBase, refuse_async, refuse_generator_async
from ._validate import (
    check_backoff,
    check_bool,
    check_clock,
    check_int,
    check_number,
    check_predicate,
)
from .errors import ConfigurationError, Rejected
from .testing._no_wait import NO_WAIT

__all__ = ["Retry", "RetryStatistics"]

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class RetryStatistics:
    """Counters of a :class:`Retry` since it was built.

    ``retries`` is the number of extra attempts started; ``recovered`` the calls that
    succeeded after at least one retry; ``exhausted`` the calls that gave up (by
    attempts, deadline or budget); ``budget_refusals`` the retries the budget refused.

    Example: ``assert retry.statistics().exhausted == 0``
    """

    retries: int
    recovered: int
    exhausted: int
    budget_refusals: int


class _Run:
    """The mutable state of one call's retries; created only after a first failure."""

    __slots__ = ("attempt", "delays", "skipped", "ticket")

    def __init__(self, delays: Iterator[float]) -> None:
        self.attempt = 1
        self.delays = delays
        #: The budget's ticket of the retry scheduled last (given back if it is not sent).
        self.ticket: int | None = None
        #: Seconds of backoff skipped under ``testing.no_wait()``: they still count
        #: against the deadlines, so the attempts are those a real wait would give.
        self.skipped = 0.0


class Retry(PolicyBase):
    """Run a call again when it fails, with backoff, within attempts, deadline and budget.

    Before retry ``n`` (after ``n + 1`` failed attempts) the policy waits::

        delay = max(next(backoff), exc.retry_after)    # retry_after if the error has one

    and gives up, re-raising the last exception, when any of these holds:

    * ``attempts`` (the total, including the first) have been made;
    * ``delay`` would overrun the ``deadline`` (total seconds since the first attempt)
      or the ambient deadline (:func:`resilience.deadline`, an outer Timeout): it never
      starts a sleep it cannot finish;
    * the shared :class:`RetryBudget` is empty;
    * a finite ``backoff`` schedule has no delay left (``reason="attempts"``).

    The deadline stops attempts and sleeps from starting; it cancels nothing. An
    attempt still running at the deadline is cut only by a :class:`Timeout` (inside
    the retry, it clamps to the deadline).

    ``on=`` is required: exception types, or a predicate of the exception. Only
    :class:`Exception` subclasses are ever retried; cancellation and ``KeyboardInterrupt``
    pass through. ``on_result=`` retries on results too (e.g. a 503 response); when
    retries run out on a result, that last result is returned.

    Example::

        @rs.Retry(on=(ConnectionError, TimeoutError), attempts=4, deadline=5.0,
                  backoff=rs.backoff.full_jitter(0.1, cap=2.0))
        async def fetch(url: str) -> bytes: ...
    """

    def __init__(
        self,
        *,
        on: ExceptionFilter,
        on_result: Callable[[Any], bool] | None = None,
        attempts: int = 3,
        deadline: float | None = None,
        backoff: Iterable[float] | None = None,
        budget: RetryBudget | None = None,
        respect_retry_after: bool = True,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self._matches = ExceptionMatcher("on", on, exceptions_only=True)
        self._on_result = check_predicate("on_result", on_result)
        self.attempts: int = check_int("attempts", attempts, minimum=1)
        self.deadline: float | None = check_number(
            "deadline", deadline, strict=True, allow_none=True
        )
        self.backoff: Iterable[float] = check_backoff(backoff)
        if budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigurationError(f"budget must be a RetryBudget, got {budget!r}")
        self.budget = budget
        self.respect_retry_after = check_bool("respect_retry_after", respect_retry_after)
        self._clock = check_clock("clock", clock)
        self._retries = self._recovered = self._exhausted = self._budget_refusals = 0

    @property
    def retries_rejections(self) -> bool:
        """Whether this retry may retry :class:`Rejected` errors (used by Pipeline checks)."""
        return self._may_retry(Rejected)

    def _may_retry(self, error: type[BaseException]) -> bool:
        """Whether this retry may retry ``error`` (or a subclass): Pipeline's checks."""
        return self._matches.may_match(error)

    # -- the core: pure decisions, shared by both shells ----------------------------

    def _judge(self, run: _Run, exc: Exception) -> float | None:
        """The delay before retrying ``exc``, or ``None`` to raise it. An ``on=``
        predicate or a backoff schedule that raises gets ``exc`` as its context, as in
        an except block: the failure that led there is not lost from the traceback."""
        try:
            if not self._matches(exc):
                return None
            return self._plan(run, exc)
        except BaseException as bug:
            if bug is not exc and bug.__context__ is None:
                bug.__context__ = exc
            raise

    def _plan(self, run: _Run, exc: BaseException | None) -> float | None:
        """The delay before the next attempt, or ``None`` to give up now."""
        attempt = run.attempt
        if attempt >= self.attempts:
            return self._give_up(attempt, "attempts", exc)
        try:
            delay = float(next(run.delays))
        except StopIteration:
            return self._give_up(attempt, "attempts", exc)
        if self.respect_retry_after and exc is not None:
            hint = getattr(exc, "retry_after", None)
            if isinstance(hint, int | float) and math.isfinite(hint) and hint > delay:
                delay = float(hint)
        remaining = _deadline.time_remaining()
        if remaining is not None:
            remaining -= run.skipped
        # A retry that would start with no time left only overruns the deadline.
        if remaining is not None and delay >= remaining:
            return self._give_up(attempt, "deadline", exc)
        budget = self.budget
        if budget is not None and (ticket := budget._take()) is None:
            self._budget_refusals += 1
            if self._observed:
                self._emit(RetryBudgetExhausted(policy=self.name, attempt=attempt))
            return self._give_up(attempt, "budget", exc)
        if budget is not None:
            run.ticket = ticket
        run.attempt = attempt + 1
        if self._observed:
            try:
                self._emit(
                    RetryScheduled(policy=self.name, attempt=attempt, delay=delay, exception=exc)
                )
            except BaseException:  # a listener's KeyboardInterrupt: this retry is not made
                self._refund(run)
                raise
        if NO_WAIT.get():
            run.skipped += delay
            return 0.0
        return delay

    def __repr__(self) -> str:
        deadline = "" if self.deadline is None else f" deadline={self.deadline:g}"
        on = self._matches.describe()
        return f"<Retry {self.name!r} on={on} attempts={self.attempts}{deadline}>"

    def _refund(self, run: _Run) -> None:
        """The backoff was cancelled: the retry it led to is not sent."""
        if self.budget is not None and run.ticket is not None:
            self.budget._refund(run.ticket)

    def _late(self, run: _Run, exc: BaseException | None) -> bool:
        """Whether the backoff just slept ended at or past the deadline (a real sleep
        overshoots; a delay just under the time left lands past it): then the retry is
        not made (not counted, its budget given back) and the run gives up."""
        remaining = _deadline.time_remaining()
        if remaining is None or remaining - run.skipped > 0:
            return False
        self._refund(run)
        self._give_up(run.attempt - 1, "deadline", exc)
        return True

    def _give_up(self, attempts: int, reason: str, exc: BaseException | None) -> float | None:
        self._exhausted += 1
        if self._observed:
            self._emit(
                RetriesExhausted(policy=self.name, attempts=attempts, reason=reason, exception=exc)
            )
        return None

    def _start(self) -> _Run:
        return _Run(iter(self.backoff))

    # -- the shells -----------------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)``, retrying as configured."""
        refuse_async(self, fn)
        if self.budget is not None:
            self.budget.deposit()
        if self.deadline is None:
            return self._call(fn, args, kwargs)
        _, token = _deadline.push(self.deadline, self._clock)
        try:
            return self._call(fn, args, kwargs)
        finally:
            _deadline.pop(token)

    def _call(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            if self._on_result is None or not self._on_result(result):
                return result
            return self._resume(fn, args, kwargs, None, result)
        # Resumed outside the except block: later attempts must not read as raised
        # while handling the first (see _chain).
        try:
            return self._resume(fn, args, kwargs, failure, None)
        finally:
            failure = None  # no exception <-> frame cycle

    def _resume(
        self,
        fn: Callable[..., T],
        args: Any,
        kwargs: Any,
        exc: Exception | None,
        result: Any,
    ) -> T:
        """Carry on after a failed first attempt (the happy path never gets here)."""
        run = self._start()
        links: list[BaseException] = []  # errors whose context _chain set, oldest first
        try:
            while True:
                delay = self._plan(run, None) if exc is None else self._judge(run, exc)
                if delay is not None:
                    try:
                        self._clock.sleep(delay)
                    except BaseException:
                        self._refund(run)
                        raise
                    if self._late(run, exc):
                        delay = None
                if delay is None:
                    if exc is None:
                        return result  # type: ignore[no-any-return]
                    try:
                        raise exc
                    finally:
                        # Not kept by this frame, which the traceback references: no
                        # exception <-> frame cycle left for the garbage collector.
                        exc = None
                self._retries += 1  # counted once started: a cancelled backoff is no retry
                try:
                    result = fn(*args, **kwargs)
                except Exception as error:
                    _chain(error, exc, links)
                    exc = error
                    continue
                exc = None
                if self._on_result is None or not self._on_result(result):
                    self._recovered += 1
                    return result  # type: ignore[no-any-return]
        finally:
            # The errors' tracebacks reference this frame: no exception <-> frame
            # cycle left behind for the garbage collector.
            links.clear()

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)``, retrying as configured."""
        refuse_generator_async(fn)
        if self.budget is not None:
            self.budget.deposit()
        if self.deadline is None:
            return await self._call_async(fn, args, kwargs)
        _, token = _deadline.push(self.deadline, self._clock)
        try:
            return await self._call_async(fn, args, kwargs)
        finally:
            _deadline.pop(token)

    async def _call_async(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any) -> T:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            if self._on_result is None or not self._on_result(result):
                return result
            return await self._resume_async(fn, args, kwargs, None, result)
        try:  # outside the except block (see _call)
            return await self._resume_async(fn, args, kwargs, failure, None)
        finally:
            failure = None

    async def _resume_async(
        self,
        fn: Callable[..., Awaitable[T]],
        args: Any,
        kwargs: Any,
        exc: Exception | None,
        result: Any,
    ) -> T:
        """Carry on after a failed first attempt (the happy path never gets here)."""
        run = self._start()
        links: list[BaseException] = []  # errors whose context _chain set, oldest first
        try:
            while True:
                delay = self._plan(run, None) if exc is None else self._judge(run, exc)
                if delay is not None:
                    try:
                        await self._clock.sleep_async(delay)
                    except BaseException:
                        self._refund(run)
                        raise
                    if self._late(run, exc):
                        delay = None
                if delay is None:
                    if exc is None:
                        return result  # type: ignore[no-any-return]
                    try:
                        raise exc
                    finally:
                        exc = None  # no exception <-> frame cycle (see _resume)
                self._retries += 1  # counted once started (see _resume)
                try:
                    result = await fn(*args, **kwargs)
                except Exception as error:
                    _chain(error, exc, links)
                    exc = error
                    continue
                exc = None
                if self._on_result is None or not self._on_result(result):
                    self._recovered += 1
                    return result  # type: ignore[no-any-return]
        finally:
            # The errors' tracebacks reference this frame: no exception <-> frame
            # cycle left behind for the garbage collector.
            links.clear()

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any] | None:
        """A leaner decorator body for the common configuration (see ``decorate``).

        Without budget, deadline or result predicate, the first attempt needs no
        bookkeeping at all: the wrapper is one ``try`` around the call, and the retry
        machinery is entered only after a failure.
        """
        if self.budget is not None or self.deadline is not None or self._on_result is not None:
            return None
        if is_async:
            resume_async = self._resume_async

            async def retry_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    failure: Exception | None = exc
                try:  # outside the except block (see _call)
                    return await resume_async(fn, args, kwargs, failure, None)
                finally:
                    failure = None

            return retry_async
        resume = self._resume

        def retry_sync(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                failure: Exception | None = exc
            try:  # outside the except block (see _call)
                return resume(fn, args, kwargs, failure, None)
            finally:
                failure = None

        return retry_sync

    def statistics(self) -> RetryStatistics:
        """Retries started, calls recovered, calls exhausted, budget refusals.

        Example: ``print(retry.statistics())``
        """
        return RetryStatistics(
            self._retries, self._recovered, self._exhausted, self._budget_refusals
        )


#: Attempts the exception Retry raises shows in its traceback (the latest ones).
_CHAINED = 3


def _chain(
    error: BaseException, previous: BaseException | None, links: list[BaseException]
) -> None:
    """Record that attempt ``n`` (``error``) followed the failure of attempt ``n - 1``,
    as Python would for an exception raised while handling another: the traceback of
    the exception Retry finally raises shows the last :data:`_CHAINED` attempts, in
    order. ``links``, the call's own list of the errors this function linked, lets the
    older links go, so that a long retry loop does not keep every attempt's exception
    and frames alive until it ends. An error that already has a context of its own
    keeps it, and no cycle is made (a function that raises the same instances again).
    """
    if previous is None or error.__context__ is not None:
        return
    seen: BaseException | None = previous
    for _ in range(1000):
        if seen is None:
            break
        if seen is error:
            return
        seen = seen.__context__
    error.__context__ = previous
    links.append(error)
    if len(links) >= _CHAINED:
        links.pop(0).__context__ = None
