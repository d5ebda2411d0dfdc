"""The :class:`CircuitBreaker` policy: thin sync and async shells around :class:`BreakerCore`."""

from __future__ import annotations

import functools
import inspect
import math
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, cast

from .._blocks import pop_innermost
from .._clock import SYSTEM_CLOCK, Clock
from .._events import GLOBAL_LISTENERS, CallRejected
from .._keyed import BoundedMap
from .._matching import ExceptionFilter
from .._policy import (
    PolicyBase,
    is_async_callable,
    is_generator_function,
    refuse_async,
    refuse_generator_async,
)
from .._validate import check_clock, check_int, check_key_function, check_number
from ..errors import CircuitOpen, ConfigurationError, Rejected
from ._config import FAILURE, IGNORE, SUCCESS, BreakerConfig, Outcome
from ._core import BreakerCore, BreakerStatistics, Election, Ticket, _Change
from ._events import BreakerStateChanged, OutcomeRecorded
from ._state import CircuitState

#: How much of the traffic a state turns away: a keyed breaker's totals report the most.
_RESTRICTIVENESS = {
    CircuitState.FORCED_OPEN: 3,
    CircuitState.OPEN: 2,
    CircuitState.HALF_OPEN: 1,
    CircuitState.CLOSED: 0,
    CircuitState.METRICS_ONLY: 0,
    CircuitState.DISABLED: 0,
}

if TYPE_CHECKING:
    from ..backends._memory import MemoryBackend
    from ..backends._redis import RedisBackend
    from ._shared import SharedState

__all__ = ["CircuitBreaker", "Permit"]

P = ParamSpec("P")
T = TypeVar("T")


def _default_fallback_on() -> tuple[type[BaseException], ...]:
    from .._timeout import Timeout

    return (Rejected, Timeout)


class Permit:
    """The right to make one call through a breaker: report its outcome exactly once.

    Got from :meth:`CircuitBreaker.acquire_nowait` (or :meth:`~CircuitBreaker.acquire_async`);
    the low-level seam for transports and middleware that cannot wrap a function.
    Call exactly one of :meth:`success`, :meth:`failure` or :meth:`ignore`; later calls
    are no-ops. Durations (for ``slow_call``) run from the acquire, on the breaker's
    clock. As a context manager it reports the block's outcome on exit: success, or
    the exception classified like a wrapped call's.

    Example::

        permit = breaker.acquire_nowait(key=host)      # raises rs.CircuitOpen
        try:
            response = send(request)
        except OSError as exc:
            permit.failure(exc)
            raise
        if response.status_code >= 500:
            permit.failure()
        else:
            permit.success()
    """

    __slots__ = ("_breaker", "_core", "_done", "_start", "_ticket")

    def __init__(
        self, breaker: CircuitBreaker, core: BreakerCore, ticket: Ticket, start: float | None
    ) -> None:
        self._breaker = breaker
        self._core = core
        self._ticket = ticket
        self._start = start
        self._done = False

    @property
    def done(self) -> bool:
        """Whether the outcome was reported."""
        return self._done

    def success(self) -> None:
        """The call succeeded."""
        if not self._done:
            self._done = True
            self._breaker._settle(self._core, self._ticket, SUCCESS, self._start, None)

    def failure(self, exc: BaseException | None = None) -> None:
        """The call failed (``exc`` matching ``exclude``, or a cancellation, is ignored)."""
        if not self._done:
            self._done = True
            outcome = FAILURE
            if exc is not None:
                outcome = self._classified(exc, explicit=True)
            self._breaker._settle(self._core, self._ticket, outcome, self._start, exc)

    def ignore(self) -> None:
        """The call counts as neither success nor failure (a half-open probe slot is freed)."""
        if not self._done:
            self._done = True
            self._breaker._settle(self._core, self._ticket, IGNORE, self._start, None)

    def _exit(self, exc: BaseException | None) -> None:
        if self._done:
            return
        if exc is None:
            self.success()
            return
        self._done = True
        outcome = self._classified(exc, explicit=False)
        self._breaker._settle(self._core, self._ticket, outcome, self._start, exc)

    def _classified(self, exc: BaseException, *, explicit: bool) -> Outcome:
        """What ``exc`` counts as; if the user's predicate raises, the ticket is settled
        as ignored (a half-open probe slot must come back) and the error propagates."""
        try:
            return self._breaker._config.classify(exc, explicit=explicit)
        except BaseException:
            self._breaker._settle(self._core, self._ticket, IGNORE, self._start, exc)
            raise

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    def __repr__(self) -> str:
        return f"<Permit {self._breaker.name!r} key={self._core.key!r} done={self._done}>"


# The permits of ``with breaker:`` blocks, innermost last: one variable for every breaker
# (one per breaker would stay in each context it was ever entered in).
_ENTERED: ContextVar[tuple[tuple[CircuitBreaker, Permit], ...]] = ContextVar(
    "resilience_breaker_entered", default=()
)


class CircuitBreaker(PolicyBase):
    """Stop calling a failing dependency; probe it after a cool-down; degrade meanwhile.

    **Tripping** (any combination; the first condition met opens the breaker):

    * ``failure_rate`` (default 0.5): the share of failures in the sliding window, once
      it holds ``min_calls`` calls (default ``min(10, window)``). ``None`` disables it.
    * ``slow_call`` (seconds) with ``slow_call_rate`` (default 1.0): the share of calls
      slower than ``slow_call``, with the same window and ``min_calls``.
    * ``consecutive_failures``: that many failures in a row (ignoring the window).

    **Windows**: ``window_type="count"`` (default): the last ``window`` calls (default
    100); ``window_type="time"``: the calls of the last ``window`` seconds, kept in
    ``buckets`` buckets (default 10) with O(1) aggregates.

    **Cool-down**: OPEN lasts ``open_for`` seconds (default 30), then the breaker is
    HALF_OPEN and admits exactly ``half_open_calls`` probes (default 1); it closes if
    their failure rate (and slow-call rate) stay below the thresholds, else opens
    again. With ``open_for_max`` each consecutive trip lasts ``open_for × n`` (capped
    at ``open_for_max``); ``open_for_jitter`` (0..1) shortens each cool-down by a
    random share of up to that fraction, so a fleet does not probe in lockstep.
    ``max_half_open_wait``: go back to OPEN if the probes do not finish in time (counted
    from the first probe out).

    **What counts**: exceptions are failures, except: anything that is not an
    ``Exception`` (cancellation); ``exclude`` (types or a predicate) counts as neither;
    :class:`~resilience.Rejected` errors from policies inside this one (rate limits,
    bulkheads, inner breakers) count as neither unless ``record_rejected=True``; with
    ``record`` (types or a predicate), only matches are failures, other exceptions are
    successes. ``record_result`` marks returned values as failures (e.g. HTTP 5xx).

    **Rejecting**: an open breaker raises :class:`~resilience.CircuitOpen` with
    ``retry_after`` = time until half-open. ``fallback`` (a value, or a callable that
    receives the exception; sync or async to match the wrapped function) answers
    instead, with the semantics of :class:`~resilience.Fallback`: on ``fallback_on``
    (default ``(Rejected, Timeout)``).

    **Keys**: ``key`` (a callable of the call's arguments) gives each key (domain, model
    tier, tenant) its own breaker in a bounded map: ``max_keys`` (LRU) and ``idle_ttl``
    seconds (an evicted key comes back CLOSED with a fresh window).

    **Shared state**: ``backend=RedisBackend(...)`` (and a ``name``) shares trips
    across processes; see :mod:`resilience.breaker` and the guide. ``quorum``: open
    the fleet only when that many processes report open.

    The breaker never holds a lock while the call runs; in CLOSED the bookkeeping of a
    success is one atomic counter increment.

    Example::

        breaker = rs.CircuitBreaker(failure_rate=0.5, window=50, open_for=30,
                                    fallback=lambda exc: "service busy, try later")

        @breaker
        async def ask(question: str) -> str: ...

        per_host = rs.CircuitBreaker(key=lambda url: urlsplit(url).hostname,
                                     consecutive_failures=5, failure_rate=None)
    """

    raises_rejected = True
    rejection = CircuitOpen

    def __init__(
        self,
        *,
        failure_rate: float | None = 0.5,
        window: float = 100,
        window_type: Literal["count", "time"] = "count",
        buckets: int = 10,
        min_calls: int | None = None,
        slow_call: float | None = None,
        slow_call_rate: float = 1.0,
        consecutive_failures: int | None = None,
        open_for: float = 30.0,
        open_for_max: float | None = None,
        open_for_jitter: float = 0.0,
        half_open_calls: int = 1,
        max_half_open_wait: float | None = None,
        record: ExceptionFilter | None = None,
        exclude: ExceptionFilter = (),
        record_result: Callable[[Any], bool] | None = None,
        record_rejected: bool = False,
        key: Callable[..., Hashable] | None = None,
        max_keys: int = 10_000,
        idle_ttl: float | None = 600.0,
        backend: MemoryBackend | RedisBackend | None = None,
        quorum: int = 1,
        sync_interval: float = 1.0,
        fallback: Any = None,
        fallback_on: Any = None,
        initial_state: CircuitState = CircuitState.CLOSED,
        seed: int | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self._config = BreakerConfig.build(
            failure_rate=failure_rate,
            window=window,
            window_type=window_type,
            buckets=buckets,
            min_calls=min_calls,
            slow_call=slow_call,
            slow_call_rate=slow_call_rate,
            consecutive_failures=consecutive_failures,
            open_for=open_for,
            open_for_max=open_for_max,
            open_for_jitter=open_for_jitter,
            half_open_calls=half_open_calls,
            max_half_open_wait=max_half_open_wait,
            record=record,
            exclude=exclude,
            record_result=record_result,
            record_rejected=record_rejected,
        )
        if not isinstance(initial_state, CircuitState):
            raise ConfigurationError(f"initial_state must be a CircuitState, got {initial_state!r}")
        check_int("quorum", quorum, minimum=1)
        check_number("sync_interval", sync_interval, minimum=0.0, strict=True)
        self._clock: Clock = check_clock("clock", clock)
        # The system clock's monotonic() is time.monotonic: call the C function directly.
        self._now = time.monotonic if self._clock is SYSTEM_CLOCK else self._clock.monotonic
        self._timed = self._config.timed
        self._judge = self._config.record_result
        # Untimed and no result predicate: a success is one counter tick (see call()).
        self._plain = not self._timed and self._judge is None
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigurationError(f"seed must be an int or None, got {seed!r}")
        self._draw = random.Random(seed).random if seed is not None else random.random
        self._default_state = initial_state

        from ..backends import MemoryBackend  # no redis import: that is lazy too

        self._shared: SharedState | None = None
        if backend is not None and _is_redis_backend(backend):
            from ._shared import SharedState, default_identity

            self._shared = SharedState(
                backend,
                self,
                quorum=quorum,
                sync_interval=sync_interval,
                identity=name if name is not None else default_identity(self.name, self._config),
            )
        elif backend is not None and not isinstance(backend, MemoryBackend):
            raise ConfigurationError(
                f"backend must be a RedisBackend, a MemoryBackend or None, got {backend!r}"
            )

        user_key = check_key_function("key", key)
        # Checked with or without key=, so a typo fails now rather than when a key is added.
        max_keys = check_int("max_keys", max_keys, minimum=1)
        idle_ttl = check_number("idle_ttl", idle_ttl, minimum=0.0, strict=True, allow_none=True)
        self._keyfn: Callable[..., Hashable] | None = None
        self._cores: BoundedMap[Hashable, BreakerCore] | None = None
        self._core: BreakerCore | None = None
        if user_key is None:
            self._core = self._new_core(None)
        else:
            if self._shared is not None:
                self._keyfn = lambda *args, **kwargs: str(user_key(*args, **kwargs))
            else:
                self._keyfn = user_key
            self._cores = BoundedMap(
                self._new_core,
                max_keys=max_keys,
                idle_ttl=idle_ttl,
                clock=self._clock,
                held=_held,
            )

        self._fallback: Any = None
        if fallback is not None:
            from .._fallback import Fallback

            on = fallback_on if fallback_on is not None else _default_fallback_on()
            self._fallback = Fallback(fallback, on=on, name=self.name)
            self._fallback._listeners = self._listeners  # one list: our listeners see it
            self.call = self._call_with_fallback  # type: ignore[method-assign]
            self.call_async = self._call_async_with_fallback  # type: ignore[method-assign]
        elif fallback_on is not None:
            raise ConfigurationError("fallback_on needs a fallback=")
        if self._shared is not None:
            self._shared.start()

    # ----------------------------------------------------------------- cores

    def _new_core(self, key: Hashable) -> BreakerCore:
        label = repr(self.name) if key is None else f"{self.name!r}[{key!r}]"
        return BreakerCore(
            self._config,
            key=key,
            owner=self,
            now=self._now(),
            state=self._default_state,
            draw=self._draw,
            label=label,
            elect=None if self._shared is None else self._shared.reachable,
        )

    def _core_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BreakerCore:
        assert self._cores is not None
        assert self._keyfn is not None
        return self._cores.get(self._keyfn(*args, **kwargs))

    def _core_of(self, key: Hashable) -> BreakerCore:
        if self._cores is None:
            if key is not None:
                raise TypeError(
                    f"{self!r} is not keyed, but got the key {key!r} (the first positional "
                    "argument of open(), state_of(), statistics(), ...; a duration is "
                    "open(seconds=...))"
                )
            assert self._core is not None
            return self._core
        if key is None:
            raise TypeError(f"{self!r} is keyed: pass key=")
        if self._shared is not None:
            key = str(key)
        return self._cores.get(key)

    def _peek(self, key: Hashable) -> BreakerCore | None:
        if self._cores is None:
            return self._core_of(key)
        if key is None:
            raise TypeError(f"{self!r} is keyed: pass key=")
        return self._cores.peek(str(key) if self._shared is not None else key)

    # ----------------------------------------------------------------- reports from cores

    def _transitioned(self, core: BreakerCore, change: _Change, now: float) -> None:
        old, new, reason, open_for = change
        try:
            if self._observed and not (old is new is CircuitState.CLOSED):  # a window reset
                self._emit(
                    BreakerStateChanged(
                        policy=self.name,
                        key=None if core.key is None else str(core.key),
                        old=old,  # CircuitState: a str, so == "open" holds too
                        new=new,
                        reason=reason,
                        open_for=open_for,
                    )
                )
        finally:  # a listener's BaseException must not keep the change from the fleet
            if self._shared is not None:
                self._shared.local_change(core.key, new, reason, open_for, core.trips)

    def _rejected(self, core: BreakerCore, retry_after: float | None) -> None:
        if self._observed:
            key = None if core.key is None else str(core.key)
            self._emit(CallRejected(policy=self.name, key=key, retry_after=retry_after))

    # ----------------------------------------------------------------- outcomes

    def _start_time(self) -> float | None:
        """When a call starts, if anything needs its duration (the configuration, or a
        listener: while anyone listens every call is timed and reported)."""
        if self._timed or self._listeners or GLOBAL_LISTENERS:
            return self._now()
        return None

    def _settle(
        self,
        core: BreakerCore,
        ticket: Ticket,
        outcome: Outcome,
        start: float | None,
        exc: BaseException | None,
    ) -> None:
        now = self._now()
        duration = None if start is None else now - start
        timed = self._timed
        quick = outcome is SUCCESS and (
            ticket.quick_success_at(now, start)  # type: ignore[arg-type] # timed: a start
            if timed
            else ticket.quick_success()
        )
        try:
            if self._observed and core.state is not CircuitState.DISABLED:
                self._emit(
                    OutcomeRecorded(
                        policy=self.name,
                        key=None if core.key is None else str(core.key),
                        outcome=outcome,
                        slow=duration is not None and duration > self._config.slow_after,
                        duration=duration,
                        exception=exc,
                    )
                )
        finally:  # a listener's BaseException must not keep a probe slot taken
            if not quick:
                core.settle(ticket, outcome, now, duration if timed else None)

    def _failed(
        self, core: BreakerCore, ticket: Ticket, exc: BaseException, start: float | None
    ) -> None:
        try:
            outcome = self._config.classify(exc)
        except BaseException:
            # The user's record=/exclude= raised: the call counts for nothing, but its
            # ticket is settled all the same (a half-open probe slot must come back).
            self._settle(core, ticket, IGNORE, start, exc)
            raise
        self._settle(core, ticket, outcome, start, exc)

    def _succeeded(
        self, core: BreakerCore, ticket: Ticket, result: object, start: float | None
    ) -> None:
        if self._judge is None:
            outcome = SUCCESS
        else:
            try:
                outcome = self._config.judge(result)
            except BaseException:  # the user's record_result= raised (see _failed)
                self._settle(core, ticket, IGNORE, start, None)
                raise
        self._settle(core, ticket, outcome, start, None)

    # ----------------------------------------------------------------- admission

    def _elect(self, core: BreakerCore, election: Election) -> Ticket:
        shared = self._shared
        assert shared is not None
        ticket: Ticket | Election = election
        while isinstance(ticket, Election):  # again only if the breaker moved on meanwhile
            try:
                won, wait = shared.elect(core.key)
            except BaseException:  # interrupted: the probe slot must not stay taken
                core.election_abandoned(ticket)
                raise
            ticket = core.elected(ticket, self._now(), won, wait)
        return ticket

    async def _elect_async(self, core: BreakerCore, election: Election) -> Ticket:
        shared = self._shared
        assert shared is not None
        ticket: Ticket | Election = election
        while isinstance(ticket, Election):
            try:
                won, wait = await shared.elect_async(core.key)
            except BaseException:  # cancelled mid round trip: free the probe slot
                core.election_abandoned(ticket)
                raise
            ticket = core.elected(ticket, self._now(), won, wait)
        return ticket

    def acquire_nowait(self, key: Hashable = None) -> Permit:
        """Admit one call now, or raise :class:`~resilience.CircuitOpen`; see :class:`Permit`.

        For a shared breaker the first half-open probe may take one Redis round trip
        (bounded by the backend timeout) to win the fleet-wide probe.

        Example::

            with breaker.acquire_nowait(key="api.example.com"):
                send(request)          # an exception is classified and recorded
        """
        core = self._core_of(key)
        ticket = core.acquire(self._now())
        if isinstance(ticket, Election):
            ticket = self._elect(core, ticket)
        return Permit(self, core, ticket, self._start_time())

    async def acquire_async(self, key: Hashable = None) -> Permit:
        """Like :meth:`acquire_nowait`, awaiting the fleet election (if any) without blocking.

        Example::

            async with await breaker.acquire_async(key=host):
                await send(request)
        """
        core = self._core_of(key)
        ticket = core.acquire(self._now())
        if isinstance(ticket, Election):
            ticket = await self._elect_async(core, ticket)
        return Permit(self, core, ticket, self._start_time())

    # ----------------------------------------------------------------- the shells

    # The happy path (an admitting breaker, no clock needed) is written out in call(),
    # call_async() and the two wrappers of __call__(), which saves a Python frame (a
    # coroutine, for async) per call; everything else goes through _guarded().

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` through the breaker (raises CircuitOpen when open)."""
        refuse_async(self, fn)
        core = self._core or self._core_for(args, kwargs)
        ticket = core.fast
        if ticket is None or not self._plain or self._listeners or GLOBAL_LISTENERS:
            return self._guarded(core, fn, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(core, ticket, exc, None)
            raise
        if ticket.pending:
            self._succeeded(core, ticket, result, None)
        else:
            ticket.tick()
        return result

    def _guarded(
        self, core: BreakerCore, fn: Callable[..., T], args: tuple[Any, ...], kwargs: Any
    ) -> T:
        ticket = core.fast or core.acquire(self._now())
        if isinstance(ticket, Election):
            ticket = self._elect(core, ticket)
        start = self._start_time()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(core, ticket, exc, start)
            raise
        self._succeeded(core, ticket, result, start)
        return result

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` through the breaker (asyncio or trio)."""
        refuse_generator_async(fn)
        core = self._core or self._core_for(args, kwargs)
        ticket = core.fast
        if ticket is None or not self._plain or self._listeners or GLOBAL_LISTENERS:
            return await self._guarded_async(core, fn, args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(core, ticket, exc, None)
            raise
        if ticket.pending:
            self._succeeded(core, ticket, result, None)
        else:
            ticket.tick()
        return result

    async def _guarded_async(
        self,
        core: BreakerCore,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: Any,
    ) -> T:
        ticket = core.fast or core.acquire(self._now())
        if isinstance(ticket, Election):
            ticket = await self._elect_async(core, ticket)
        start = self._start_time()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(core, ticket, exc, start)
            raise
        self._succeeded(core, ticket, result, start)
        return result

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate ``fn`` (``def`` or ``async def``, function or method).

        Example::

            @rs.CircuitBreaker(failure_rate=0.5, open_for=30)
            async def fetch(url: str) -> bytes: ...
        """
        if self._fallback is not None:
            target = fn.__func__ if isinstance(fn, classmethod | staticmethod) else fn
            if not is_async_callable(target):
                self._fallback._refuse_sync()  # an async fallback= for a sync function
        if (
            not self._plain
            or self._fallback is not None
            or not inspect.isfunction(fn)
            or is_generator_function(fn)
        ):
            return super().__call__(fn)
        fixed, core_for = self._core, self._core_for
        failed, succeeded = self._failed, self._succeeded
        listeners = self._listeners  # mutated in place, never rebound

        if is_async_callable(fn):
            guarded_async = self._guarded_async

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                core = fixed or core_for(args, kwargs)
                ticket = core.fast
                if ticket is None or listeners or GLOBAL_LISTENERS:
                    return await guarded_async(core, fn, args, kwargs)
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as exc:
                    failed(core, ticket, exc, None)
                    raise
                if ticket.pending:
                    succeeded(core, ticket, result, None)
                else:
                    ticket.tick()
                return result

            return cast(Callable[P, T], async_wrapper)

        guarded = self._guarded

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            core = fixed or core_for(args, kwargs)
            ticket = core.fast
            if ticket is None or listeners or GLOBAL_LISTENERS:
                return guarded(core, fn, args, kwargs)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                failed(core, ticket, exc, None)
                raise
            if ticket.pending:
                succeeded(core, ticket, result, None)
            else:
                ticket.tick()
            return result

        return cast(Callable[P, T], wrapper)

    def _call_with_fallback(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._fallback.call(CircuitBreaker.call, self, fn, *args, **kwargs)  # type: ignore[no-any-return]

    async def _call_async_with_fallback(
        self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any
    ) -> T:
        return await self._fallback.call_async(  # type: ignore[no-any-return]
            CircuitBreaker.call_async, self, fn, *args, **kwargs
        )

    # ----------------------------------------------------------------- with / async with

    def _enter(self, permit: Permit) -> None:
        _ENTERED.set((*_ENTERED.get(), (self, permit)))

    def _leave(self) -> Permit:
        # The innermost block of this breaker still open (see pop_innermost).
        found = pop_innermost(
            _ENTERED.get(), mine=lambda entry: entry[0] is self, settled=lambda entry: entry[1].done
        )
        if found is None:
            raise RuntimeError(f"{self!r}: exit without a matching enter")
        (_, permit), rest = found
        _ENTERED.set(rest)
        return permit

    def __enter__(self) -> CircuitBreaker:
        self._enter(self.acquire_nowait())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()._exit(exc)

    async def __aenter__(self) -> CircuitBreaker:
        self._enter(await self.acquire_async())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()._exit(exc)

    # ----------------------------------------------------------------- state and control

    @property
    def keyed(self) -> bool:
        """Whether this breaker keeps one state per key."""
        return self._cores is not None

    @property
    def config(self) -> BreakerConfig:
        """The validated configuration (shared by every key)."""
        return self._config

    @property
    def state(self) -> CircuitState:
        """The state of an unkeyed breaker now (use :meth:`state_of` for a keyed one).

        Example: ``if breaker.state is rs.CircuitState.OPEN: ...``
        """
        if self._core is None:
            raise TypeError(f"{self!r} is keyed: use state_of(key) or states()")
        return self._core.state_at(self._now())

    def state_of(self, key: Hashable = None) -> CircuitState:
        """The state of ``key``'s breaker (CLOSED for a key never seen or evicted).

        Example: ``breaker.state_of("api.example.com")``
        """
        core = self._peek(key)
        if core is None:
            return self._default_state
        return core.state_at(self._now())

    def states(self) -> dict[Hashable, CircuitState]:
        """Every key's state (``{None: state}`` when unkeyed), for health checks.

        Example::

            unhealthy = [k for k, s in breaker.states().items() if s is not rs.CircuitState.CLOSED]
        """
        now = self._now()
        if self._cores is None:
            assert self._core is not None
            return {None: self._core.state_at(now)}
        return {key: core.state_at(now) for key, core in self._cores.items()}

    def statistics(self, key: Hashable = None) -> BreakerStatistics:
        """A snapshot of ``key``'s breaker (window counts, rates, counters).

        On a keyed breaker without ``key``: the totals over the keys it holds now (as a
        keyed bulkhead's), so that every policy and a :class:`~resilience.Pipeline`
        answer ``statistics()``. Counts and counters are summed, the rates are the
        summed failures (slow calls) over the summed calls (``None`` below
        ``min_calls``), ``consecutive_failures`` is the largest, ``state`` is the most
        restrictive of the keys' states (forced open, open, half-open, then the
        others; the breaker's default state when it holds no key), and ``retry_after``
        is the shortest among the keys in that state.

        Example::

            stats = breaker.statistics()
            print(stats.state, stats.failure_rate, stats.rejected)
        """
        now = self._now()
        if self._cores is not None and key is None:
            return self._totals([core.statistics(now) for _, core in self._cores.items()])
        core = self._peek(key)
        if core is None:
            core = self._new_core(key)  # what a fresh key looks like; not stored
        return core.statistics(now)

    def _totals(self, each: list[BreakerStatistics]) -> BreakerStatistics:
        if not each:
            return self._new_core(None).statistics(self._now())
        state = max((s.state for s in each), key=_RESTRICTIVENESS.__getitem__)
        calls = sum(s.calls for s in each)
        failures = sum(s.failures for s in each)
        slow = sum(s.slow_calls for s in each)
        enough = calls >= self._config.min_calls and calls > 0
        waits = [s.retry_after for s in each if s.state is state and s.retry_after is not None]
        return BreakerStatistics(
            state=state,
            calls=calls,
            failures=failures,
            slow_calls=slow,
            failure_rate=failures / calls if enough else None,
            slow_call_rate=slow / calls if enough else None,
            consecutive_failures=max(s.consecutive_failures for s in each),
            rejected=sum(s.rejected for s in each),
            opened=sum(s.opened for s in each),
            retry_after=min(waits) if waits else None,
            half_open_in_flight=sum(s.half_open_in_flight for s in each),
        )

    def _targets(self, key: Hashable, *, sticky: CircuitState | None) -> list[BreakerCore]:
        if self._cores is None or key is not None:
            return [self._core_of(key)]
        if sticky is not None:
            self._default_state = sticky
        return [core for _, core in self._cores.items()]

    def open(self, key: Hashable = None, *, seconds: float | None = None) -> None:
        """Open the breaker now for ``seconds`` (default ``open_for``); then half-open.

        On a keyed breaker without ``key``: every current key.

        Example: ``breaker.open(seconds=60)``
        """
        if seconds is not None:
            seconds = check_number("seconds", seconds, minimum=0.0)
        now = self._now()
        # Held for its whole cool-down: a key idle past idle_ttl, or pushed out by
        # max_keys, must not come back CLOSED before the time it was opened for.
        until = now + (self._config.open_for if seconds is None else seconds)
        for core in self._held_targets(key, None, until, now):
            core.transition(CircuitState.OPEN, now, seconds=seconds)

    def close(self, key: Hashable = None) -> None:
        """Close the breaker with a fresh window (also ends FORCED_OPEN, DISABLED, ...).

        On a keyed breaker without ``key``: every key, and new keys start CLOSED.

        Example: ``breaker.close()``
        """
        self._set(CircuitState.CLOSED, key)

    def force_open(self, key: Hashable = None) -> None:
        """Reject every call until :meth:`close` (a manual kill switch).

        On a keyed breaker without ``key``: every key, including new ones.

        Example: ``breaker.force_open()``
        """
        self._set(CircuitState.FORCED_OPEN, key)

    def disable(self, key: Hashable = None) -> None:
        """Let every call through and record nothing, until :meth:`close`.

        Example: ``breaker.disable()``
        """
        self._set(CircuitState.DISABLED, key)

    def metrics_only(self, key: Hashable = None) -> None:
        """Record every call but never trip (shadow mode), until :meth:`close`.

        Example: ``breaker.metrics_only(); ...; print(breaker.statistics().failure_rate)``
        """
        self._set(CircuitState.METRICS_ONLY, key)

    def _set(self, target: CircuitState, key: Hashable) -> None:
        now = self._now()
        # A key set by hand keeps its state, however idle, while it differs from the
        # state a new key starts in (which is what a dropped key would come back as):
        # force_open(key) until close(key), close(key) under a breaker-wide force_open().
        # Set for every key, the state is the new keys' too: nothing to hold.
        until = 0.0 if key is None or target is self._default_state else math.inf
        for core in self._held_targets(key, target, until, now):
            core.transition(target, now)

    def _held_targets(
        self, key: Hashable, sticky: CircuitState | None, until: float, now: float
    ) -> list[BreakerCore]:
        """:meth:`_targets`, each held in the keyed map until ``until`` before it moves:
        held only after, a key could be dropped by another thread's new keys in between,
        and the state set by hand lost with it (then it is fetched again)."""
        cores = self._targets(key, sticky=sticky)
        for core in cores:
            core.held_until = until
        if self._cores is not None and key is not None and until > now:
            # Dropped before the hold took: fetch it again, unless the hold is over by now
            # (a hold shorter than the time one fetch takes would never take).
            while self._peek(key) is not cores[0] and until > self._now():
                cores = [self._core_of(key)]
                cores[0].held_until = until
        return cores

    # ----------------------------------------------------------------- shared state hooks

    def _apply_remote(self, key: str | None, op: str, seconds: float, trips: int = 0) -> None:
        """Apply a signal from another process (called by the shared-state thread)."""
        now = self._now()
        if self._cores is None:
            core = self._core
        elif key is None:
            return
        elif op == "open":
            core = self._cores.get(key)
        else:
            core = self._cores.peek(key)
        if core is None:
            return
        if op == "open":
            core.remote_open(now, seconds, trips)
        elif op in ("close", "reset"):
            core.remote_close(now, manual=op == "reset")

    def _local_keys(self) -> list[Hashable]:
        if self._cores is None:
            return [None]
        return [key for key, _ in self._cores.items()]

    @property
    def shared(self) -> SharedState | None:
        """The shared state (Redis) of this breaker, or ``None``."""
        return self._shared

    def __repr__(self) -> str:
        config = self._config
        trips = []
        if config.failure_rate is not None:
            unit = "" if config.window_type == "count" else "s"
            trips.append(f"failure_rate={config.failure_rate:g} window={config.window:g}{unit}")
        if config.consecutive_failures is not None:
            trips.append(f"consecutive_failures={config.consecutive_failures}")
        if config.slow_call is not None:
            trips.append(f"slow_call={config.slow_call:g}")
        keyed = " keyed" if self._cores is not None else ""
        return (
            f"<CircuitBreaker {self.name!r}{keyed} {' '.join(trips)} open_for={config.open_for:g}>"
        )


def _is_redis_backend(backend: Any) -> bool:
    return (
        hasattr(backend, "script") and hasattr(backend, "key") and hasattr(backend, "sync_client")
    )


def _held(core: BreakerCore, now: float) -> bool:
    """Whether a key's breaker must stay in the keyed map (a state set by hand)."""
    return core.held_until > now
