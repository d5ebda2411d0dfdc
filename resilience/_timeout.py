"""Timeout: bound a call in time; the policy and the exception it raises are one class."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import anyio

from . import (
    _deadline,
    _validate,  # a module import: errors.py imports this module mid-way
)
from ._clock import SYSTEM_CLOCK, Clock
from ._deadline import _DEADLINE, REPORTED, Deadline
from ._events import TimedOut
from ._policy import PolicyBase, refuse_async, refuse_generator_async
from .errors import ConfigurationError, ResilienceError

__all__ = ["Timeout", "TimeoutStatistics"]

T = TypeVar("T")
P = ParamSpec("P")

_get_running_loop = asyncio._get_running_loop


@dataclass(frozen=True, slots=True)
class TimeoutStatistics:
    """Counters of a :class:`Timeout`: how many calls it cut off or found overrun.

    Example: ``timeout.statistics().timed_out``
    """

    timed_out: int


class _Expiry:
    """Fires once at the deadline: marks itself and cancels the task (asyncio path).

    A task inside an anyio scope shielded since the call began (a cleanup that must
    finish) is not cancelled there: ``task.cancel()`` would cut through the shield,
    which anyio cannot stop on asyncio. The expiry is ``due`` then, and looks again
    (after 1 ms, doubling up to 20 ms) to cancel once the shield is left, as an anyio
    cancel scope would; a call that returns from the shield is past its limit all the
    same.
    """

    __slots__ = ("due", "entry", "fired", "handle", "loop", "poll", "task")

    def __init__(self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.task = task
        self.loop = loop
        self.due = False  # the limit has passed
        self.fired = False  # and the task was cancelled for it
        self.entry = _innermost_scope(task)
        self.handle: asyncio.TimerHandle | None = None
        self.poll = _SHIELD_POLL

    def arm(self, when: float) -> None:
        self.handle = self.loop.call_at(when, self)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()

    def __call__(self) -> None:
        self.due = True
        if self.entry is not _NO_ANYIO and _shielded(self.task, self.entry):
            self.handle = self.loop.call_later(self.poll, self)
            self.poll = min(self.poll * 2, _SHIELD_POLL_MAX)
            return
        self.fired = True
        self.task.cancel()


#: Seconds before the first look again at a task shielded when its timeout expired,
#: and the longest wait between looks (each doubles the last).
_SHIELD_POLL = 0.001
_SHIELD_POLL_MAX = 0.02

_NO_ANYIO: Any = object()  # anyio's task states cannot be read (another anyio version)
_anyio_tasks: Any = None


def _innermost_scope(task: asyncio.Task[Any]) -> Any:
    """The task's innermost anyio cancel scope now (``None``: none), read from anyio's
    asyncio backend; :data:`_NO_ANYIO` if that cannot be read."""
    global _anyio_tasks
    if _anyio_tasks is None:
        try:
            from anyio._backends._asyncio import _task_states
        except Exception:  # pragma: no cover - a layout this code does not know
            _anyio_tasks = _NO_ANYIO
        else:
            _anyio_tasks = _task_states
    if _anyio_tasks is _NO_ANYIO:
        return _NO_ANYIO
    try:
        state = _anyio_tasks.get(task)
        return None if state is None else state.cancel_scope
    except Exception:  # pragma: no cover
        return _NO_ANYIO


def _shielded(task: asyncio.Task[Any], entry: Any) -> bool:
    """Whether ``task`` is inside a shielded anyio scope entered after ``entry``."""
    scope = _innermost_scope(task)
    try:
        while scope is not None and scope is not entry and scope is not _NO_ANYIO:
            if scope._shield:
                return True
            scope = scope._parent_scope
    except AttributeError:  # pragma: no cover - another anyio version
        return False
    return False


def from_any_thread(callback: Callable[[], object]) -> Callable[[], None]:
    """``callback`` (a cancel scope's ``cancel``) as a virtual-clock timer callback: a
    FakeClock fires its timers in whatever thread advances it (a sync endpoint's worker
    thread, say). On the event loop's own thread it runs at once, as before; from
    another it is handed to that loop, where cancel scopes must be cancelled."""
    owner = threading.get_ident()
    loop = _get_running_loop()
    if loop is not None:

        def run() -> None:
            if threading.get_ident() == owner:
                callback()
            else:
                with contextlib.suppress(RuntimeError):  # that loop has closed
                    loop.call_soon_threadsafe(callback)

        return run
    import trio  # anyio's other backend

    token = trio.lowlevel.current_trio_token()

    def run_trio() -> None:
        if threading.get_ident() == owner:
            callback()
        else:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(callback)

    return run_trio


class _AsError:
    """The default of ``Timeout(seconds)``: built without a limit, a Timeout is an
    error only (``raise rs.Timeout()``)."""

    def __repr__(self) -> str:
        return "<none: an error only>"


_AS_ERROR: Any = _AsError()
#: Text that reads as a limit ("5", "1.5s", "200ms"), refused rather than taken for a
#: message: the caller meant seconds.
_LOOKS_LIKE_A_LIMIT = re.compile(
    r"\s*[-+]?((\d+\.?\d*|\.\d+)(e[-+]?\d+)?|inf|infinity|nan)\s*(ms|s|sec|secs|seconds?|m|min|h)?\s*",
    re.I,
).fullmatch

# Per-task state of ``async with timeout:`` blocks (the policy object is shared).
_ENTERED: ContextVar[list[Any] | None] = ContextVar("resilience_timeout_entered", default=None)


class Timeout(PolicyBase, ResilienceError, TimeoutError):
    """Bound a call to ``seconds``; raise ``Timeout`` (also a ``TimeoutError``) if it overruns.

    ``Timeout`` is both the policy and the exception it raises, so
    ``except rs.Timeout`` catches what ``@rs.Timeout(1)`` raises. The limit is clamped
    to the ambient deadline, and the call runs with the shorter of the two as its own
    ambient deadline, so inner retries and waits stop in time.

    **Async** (``async def``, ``async with``): the call is cancelled at the deadline,
    on asyncio (with a single timer handle: cheaper than ``asyncio.timeout``) and on
    trio (an anyio cancel scope).

    **Sync** (``def``, ``with``): a running Python function cannot be preempted, so:

    1. if the deadline has already passed when the call would start, ``Timeout`` is
       raised and the call is not made;
    2. the call runs with the deadline set, so cooperating code inside (``Retry``
       sleeps, limiter and bulkhead waits, inner ``Timeout`` checks) stops at it;
    3. if the call returns after the deadline, its result is discarded and
       ``Timeout`` is raised: a timed-out call never returns a value late.

    Built without ``seconds`` (``rs.Timeout()``, or with a message:
    ``rs.Timeout("model too slow")``) it is the error alone, for code that raises it
    itself; ``seconds`` is then ``inf``, and using it as a policy raises
    :class:`ConfigurationError`. Text that reads as a limit (``"5"``, ``"200ms"``) is
    refused: the limit is a number of seconds.

    Example::

        @rs.Timeout(0.5)
        async def ask_model(prompt: str) -> str: ...

        try:
            await ask_model("hi")
        except rs.Timeout:
            ...
    """

    def __init__(
        self,
        seconds: float | str = _AS_ERROR,
        *,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        PolicyBase.__init__(self, name=name)
        if seconds is _AS_ERROR or (isinstance(seconds, str) and not _LOOKS_LIKE_A_LIMIT(seconds)):
            # Built as a plain exception (``raise rs.Timeout("model too slow")``): no
            # limit was given, so ``seconds`` is infinite and the policy side refuses
            # to run (its budget is never positive: every use lands in _spent()).
            message = "timed out" if seconds is _AS_ERROR else str(seconds)
            #: The limit in seconds (``inf`` for an error built without one).
            self.seconds: float = math.inf
            self._limit = -math.inf
        else:
            self.seconds = self._limit = _validate.check_number("seconds", seconds, strict=True)
            message = f"timed out after {self.seconds:g}s"
        self._clock = _validate.check_clock("clock", clock)
        self._timed_out = 0
        self._fake_timers = hasattr(self._clock, "call_at") and self._clock is not SYSTEM_CLOCK
        ResilienceError.__init__(self, message)

    # -- the error --------------------------------------------------------------------

    def _error(self, seconds: float, *, spent: bool = False, counted: bool = True) -> Timeout:
        """The error to raise after ``seconds`` (the limit applied); ``spent``: the
        call got no time at all (the ambient deadline had passed before it started),
        which its message says and its event reports as 0 seconds; ``counted``: this
        timeout counts and reports it (see :meth:`_cut`)."""
        if counted:
            self._timed_out += 1
            if self._observed:
                self._emit(TimedOut(policy=self.name, seconds=0.0 if spent else seconds))
        # The raised error is a fresh instance (``seconds`` is positive here),
        # never the shared policy object.
        error = Timeout(seconds, clock=self._clock, name=self.name)
        if spent:
            error.args = ("timed out: the deadline had passed before the call started",)
        return error

    def _cut(self, at: Deadline | None, seconds: float, *, spent: bool = False) -> Timeout:
        """The error for a call cut at the deadline ``at`` after ``seconds`` (this call's
        limit), counted once, on the timeout whose own limit it was.

        Clamped to an outer ``Timeout``'s sooner deadline, this one only enforces that
        limit: the outer one counts and reports it (as when its own timer cuts first, so
        sync and async code agree), and lets this error through, once; a deadline of
        ``rs.deadline``, a ``Retry`` or the ASGI middleware is this timeout's to count.
        """
        owner = None if at is None else at._owner
        if owner is None or owner is self:
            return self._error(seconds, spent=spent)
        if owner is REPORTED:  # counted already (a layer between swallowed that error)
            return self._error(seconds, spent=spent, counted=False)
        assert at is not None
        assert isinstance(owner, Timeout)
        at._owner = REPORTED
        error = owner._error(owner.seconds)
        if spent:
            error.args = ("timed out: the deadline had passed before the call started",)
        return error

    def _spent(self) -> Timeout:
        """The error for a call that would start past the ambient deadline."""
        self._refuse_without_limit()
        return self._cut(_deadline.current_deadline(), self.seconds, spent=True)

    def _refuse_without_limit(self) -> None:
        if self._limit < 0:
            raise ConfigurationError(
                f"{self!r} was built as an error, without a limit: give it seconds to "
                "use it as a policy, e.g. rs.Timeout(5.0)"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a raised error crossing processes): seconds, message and name; the
        # clock stays behind (a test clock's timers need not pickle), the copy runs on
        # the system clock.
        return (_restore_timeout, (self._given(), self.args, self.name), self._extra())

    def __copy__(self) -> Timeout:
        return self._twin()

    def __deepcopy__(self, memo: dict[int, Any]) -> Timeout:
        # The clock is shared, not copied: a copied policy (or a pipeline holding one)
        # keeps running on the same virtual time in tests.
        return self._twin()

    def _twin(self) -> Timeout:
        given = self._given()
        twin = Timeout(_AS_ERROR if given is None else given, clock=self._clock, name=self.name)
        twin.args = self.args
        twin.__dict__.update(self._extra())
        return twin

    def _given(self) -> float | None:
        """The ``seconds`` this was built with (``None``: built as an error only)."""
        return self.seconds if self._limit >= 0 else None

    def _extra(self) -> dict[str, Any]:
        """What was added to this instance beyond the policy's own state: a raised
        error's notes, attributes a handler set; kept by copies and pickles."""
        own = _POLICY_ATTRIBUTES or _policy_attributes()
        return {k: v for k, v in self.__dict__.items() if k not in own}

    def __str__(self) -> str:
        if self.args:
            return str(self.args[0])
        return "timed out" if self._limit < 0 else f"timed out after {self.seconds:g}s"

    def __repr__(self) -> str:
        if self._limit < 0:
            return f"Timeout({self.args[0]!r})" if self.args else "Timeout()"
        return f"Timeout({self.seconds:g})"

    def _budget(self) -> float:
        """This call's limit: ``seconds`` clamped to the ambient deadline (negative
        for an error built without a limit)."""
        current = _deadline.current_deadline()
        if current is None:
            return self._limit
        return min(self._limit, current.remaining())

    # -- sync -------------------------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)``; raise Timeout if it starts past the limit or ends
        at or past it."""
        refuse_async(self, fn)
        seconds = self._budget()
        if seconds <= 0:
            raise self._spent()
        clock = self._clock
        entered, token = _deadline.push(seconds, clock, self)
        # The limit on this policy's own clock: the deadline entered may be an outer,
        # sooner one on another clock (a FakeClock Retry around a system-clock Timeout).
        same = entered.clock is clock
        ends = entered.at if same else clock.monotonic() + seconds
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._leave(entered, token)
            # (An inner Timeout on the same deadline has already timed the call out.)
            if not isinstance(exc, Timeout) and (
                clock.monotonic() >= ends or (not same and entered.remaining() <= 0)
            ):
                # Failed at or past the limit: async code would have been cut there,
                # so the outcome is the timeout, whatever the call ended with.
                raise self._cut(entered, seconds) from exc
            raise
        except BaseException:
            self._leave(entered, token)
            raise
        _deadline.pop(token)  # self._leave(), inlined on the hot path
        if entered._owner is self:
            entered._owner = None
        if clock.monotonic() >= ends or (not same and entered.remaining() <= 0):
            raise self._cut(entered, seconds)  # at the limit: cut, as async is
        return result

    def _leave(self, entered: Deadline, token: object) -> None:
        """Leave the deadline entered; this timeout's own one no longer reports to it
        (a context copied into work that outlives the call still holds the object)."""
        _deadline.pop(token)
        if entered._owner is self:
            entered._owner = None

    def __enter__(self) -> Timeout:
        seconds = self._budget()
        if seconds <= 0:
            raise self._spent()
        entered, token = _deadline.push(seconds, self._clock, self)
        same = entered.clock is self._clock  # else ends on this clock, as in call()
        ends = entered.at if same else self._clock.monotonic() + seconds
        state = [entered, token, seconds, ends]
        state.append(_ENTERED.set(state))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = _ENTERED.get()
        assert state is not None, "Timeout.__exit__ without __enter__"
        entered, token, seconds, ends, own = state
        _ENTERED.reset(own)
        self._leave(entered, token)
        if (exc_type is None or (isinstance(exc, Exception) and not isinstance(exc, Timeout))) and (
            self._clock.monotonic() >= ends
            or (entered.clock is not self._clock and entered.remaining() <= 0)
        ):
            # At or past the limit, returned or failed: the timeout (see call()).
            raise self._cut(entered, seconds) from exc

    # -- async ------------------------------------------------------------------------

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)``, cancelling it at the limit."""
        refuse_generator_async(fn)
        if not self._fake_timers:
            return await self._runner(fn)(*args, **kwargs)  # type: ignore[no-any-return]
        seconds = self._budget()
        if seconds <= 0:
            raise self._spent()
        entered, token = _deadline.push(seconds, self._clock, self)
        try:
            return await self._call_fake(entered, seconds, fn, args, kwargs)
        finally:
            self._leave(entered, token)

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any] | None:
        """The decorator (and Pipeline) body of a coroutine function: :meth:`_runner`."""
        self._refuse_without_limit()  # at decoration, not at the first call
        if not is_async or self._fake_timers:
            return None
        return self._runner(fn)

    def _runner(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``fn`` bounded by this timeout, on a real clock: asyncio, or anyio (trio).

        The ambient deadline is read once and entered only if this limit is sooner (an
        outer, sooner deadline stays as it is). On asyncio the task is cancelled by a
        loop timer at the limit, and the cancellation is turned into :class:`Timeout`
        only if it was ours (``Task.uncancel`` tells), as ``asyncio.timeout`` does.
        """
        self._refuse_without_limit()
        limit = self.seconds
        clock = self._clock
        monotonic = clock.monotonic
        current_deadline, enter, leave = _DEADLINE.get, _DEADLINE.set, _DEADLINE.reset
        cut = self._cut
        call_anyio = self._call_anyio

        async def timeout_async(*args: Any, **kwargs: Any) -> Any:
            seconds = limit
            token = None
            at = current_deadline()
            if at is not None and (left := at.remaining()) <= limit:
                if left <= 0:
                    raise cut(at, limit, spent=True)
                seconds = left  # the sooner, outer deadline stays in force
            else:
                at = Deadline(monotonic() + limit, clock, self)
                token = enter(at)
            try:
                loop = _get_running_loop()
                if loop is None:  # trio (or another anyio backend)
                    return await call_anyio(at, seconds, fn, args, kwargs)
                task = asyncio.current_task(loop)
                assert task is not None
                expiry = _Expiry(task, loop)
                expiry.arm(loop.time() + seconds)
                cancelling = task.cancelling()
                try:
                    result = await fn(*args, **kwargs)
                except asyncio.CancelledError:
                    if expiry.fired and task.uncancel() <= cancelling:
                        raise cut(at, seconds) from None
                    raise
                except BaseException:
                    if expiry.fired:
                        # Cut, then the call failed otherwise while unwinding (a cleanup
                        # that raised): its error goes on, but our cancel request must
                        # not stay on the task, or an outer timeout would not fire right.
                        task.uncancel()
                    raise
                finally:
                    expiry.cancel()
                if expiry.fired:
                    # The call caught our cancellation and returned anyway: take back the
                    # cancel request, and discard the late value as the sync path does.
                    task.uncancel()
                    raise cut(at, seconds)
                if expiry.due:  # returned from a shield it was in at the limit: late
                    raise cut(at, seconds)
                return result
            finally:
                if token is not None:
                    leave(token)
                    at._owner = None  # see _leave()

        return timeout_async

    async def _call_anyio(
        self,
        at: Deadline,
        seconds: float,
        fn: Callable[..., Awaitable[T]],
        args: Any,
        kwargs: Any,
    ) -> T:
        with anyio.CancelScope(deadline=anyio.current_time() + seconds) as scope:
            result = await fn(*args, **kwargs)
        if scope.cancel_called:  # cut at the limit, or a late value the call returned anyway
            raise self._cut(at, seconds)
        return result

    async def _call_fake(
        self,
        at: Deadline,
        seconds: float,
        fn: Callable[..., Awaitable[T]],
        args: Any,
        kwargs: Any,
    ) -> T:
        # The clock's timers fire when virtual time passes the deadline.
        with anyio.CancelScope() as scope:
            handle = self._clock.call_at(  # type: ignore[attr-defined]
                self._clock.monotonic() + seconds, from_any_thread(scope.cancel)
            )
            try:
                result = await fn(*args, **kwargs)
            finally:
                handle.cancel()
        if scope.cancel_called:  # cut at the limit, or a late value the call returned anyway
            raise self._cut(at, seconds)
        return result

    async def __aenter__(self) -> Timeout:
        seconds = self._budget()
        if seconds <= 0:
            raise self._spent()
        entered, token = _deadline.push(seconds, self._clock, self)
        if self._fake_timers:
            scope = anyio.CancelScope()
            handle = self._clock.call_at(  # type: ignore[attr-defined]
                self._clock.monotonic() + seconds, from_any_thread(scope.cancel)
            )
        else:
            scope = anyio.CancelScope(deadline=anyio.current_time() + seconds)
            handle = None
        scope.__enter__()
        state = [scope, handle, entered, token, seconds]
        state.append(_ENTERED.set(state))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = _ENTERED.get()
        assert state is not None, "Timeout.__aexit__ without __aenter__"
        scope, handle, entered, token, seconds, own = state
        _ENTERED.reset(own)
        self._leave(entered, token)
        if handle is not None:
            handle.cancel()
        # The scope swallows only the cancellation it caused itself, which becomes
        # rs.Timeout here: nothing the block raised is ever suppressed.
        scope.__exit__(exc_type, exc, tb)
        # Also a block that caught the cancellation and went on: it ended past the limit,
        # which the sync ``with`` reports as Timeout too.
        if scope.cancelled_caught or (exc_type is None and scope.cancel_called):
            # From None: the cancellation that cut the block is this error's own doing,
            # not an error it happened "during the handling of" (call_async says so too).
            raise self._cut(entered, seconds) from None

    def statistics(self) -> TimeoutStatistics:
        """How many calls this policy timed out.

        Example: ``rs.Timeout(1).statistics().timed_out == 0``
        """
        return TimeoutStatistics(self._timed_out)


_POLICY_ATTRIBUTES: frozenset[str] = frozenset()


def _policy_attributes() -> frozenset[str]:
    """The instance attributes a Timeout has of its own (found once, on a fresh one;
    not at import: building one needs modules that import this one)."""
    global _POLICY_ATTRIBUTES
    _POLICY_ATTRIBUTES = frozenset(Timeout(1.0).__dict__)
    return _POLICY_ATTRIBUTES


def _restore_timeout(
    seconds: float | None, args: tuple[Any, ...], name: str | None = None
) -> Timeout:
    """A pickled :class:`Timeout`, its message and name included (a spent deadline's
    message says so; it came back as "timed out after ...")."""
    error = Timeout(_AS_ERROR if seconds is None else seconds, name=name)
    error.args = args
    return error
