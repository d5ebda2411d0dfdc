"""The :class:`RateLimiter` policy: a thin shell around bucket stores.

The decision logic lives in the pure GCRA core (:mod:`._gcra`) and in the stores
(memory, Redis, limits windows); this shell resolves keys, waits for reservations
(clamped by the ambient deadline), raises :class:`~resilience.RateLimited`, counts and
emits events. The sync and async shells differ only by ``await``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, ParamSpec, TypeVar, cast

from .._clock import Clock
from .._deadline import clamp
from .._events import GLOBAL_LISTENERS, CallRejected
from .._policy import (
    PolicyBase,
    decorate,
    is_async_callable,
    is_generator_function,
    refuse_async,
    refuse_generator_async,
)
from .._validate import (
    check_choice,
    check_clock,
    check_int,
    check_key_function,
    check_number,
)
from ..backends._failover import MODES, Failover, FailureMode
from ..backends._memory import MemoryBackend
from ..errors import ConfigurationError, RateLimited
from ._failover import FailoverBuckets
from ._gcra import GCRA, Decision
from ._rate import Rate, as_rate

if TYPE_CHECKING:
    from ..backends._redis import RedisBackend

__all__ = ["ALGORITHMS", "RateLimiter", "RateLimiterStatistics"]

#: The common cost, compared by identity: only the int 1 skips the cost check.
_ONE: Final = 1

P = ParamSpec("P")
T = TypeVar("T")

ALGORITHMS: Final[tuple[str, ...]] = (
    "token-bucket",
    "fixed-window",
    "moving-window",
    "sliding-window",
)
"""The accepted values of :class:`~resilience.RateLimiter`'s ``algorithm=``: the exact
token bucket (GCRA, the default) and the ``limits`` library's three window algorithms."""

_MAX_WAIT_LIMIT = 86_400.0 * 365


def _wait_us(seconds: float) -> int:
    return round(seconds * 1_000_000) if seconds > 0 else 0


@dataclass(frozen=True, slots=True)
class RateLimiterStatistics:
    """A snapshot of a :class:`RateLimiter`'s counters.

    ``waited`` counts the admissions that had to wait (a reservation, or a window
    algorithm's sleep before asking again). ``keys`` is the number of buckets held in
    process (``None`` when the state lives only in a shared backend). The backend
    fields stay at their defaults for a limiter without a shared backend.

    Example::

        stats = limiter.statistics()
        print(stats.admitted, stats.rejected, stats.backend_healthy)
    """

    name: str
    rate: str
    burst: int
    algorithm: str
    admitted: int
    rejected: int
    waited: int
    keys: int | None = None
    evictions: int = 0
    round_trips: int = 0
    denial_cache_hits: int = 0
    on_backend_error: str | None = None
    backend_healthy: bool = True
    backend_errors: int = 0
    fallback_decisions: int = 0
    backend_recoveries: int = 0


class RateLimiter(PolicyBase):
    """Limit how often calls happen: an exact token bucket (GCRA), per key, local or shared.

    ``rate`` is a :class:`Rate` or text (``"100/s"``, ``"5 per minute"``, ``"10/5s"``);
    ``burst`` (default: the rate's amount) is the bucket size: how many calls may happen
    at once after a quiet period. ``key`` makes one bucket per key: a constant, or a
    function of the decorated function's arguments (per domain, per user). ``cost``
    takes several tokens at once.

    Refusals raise :class:`~resilience.RateLimited` with ``retry_after``. With
    ``max_wait > 0`` a call instead *reserves* the next free slot within ``max_wait``
    seconds and sleeps exactly until it (clamped by the ambient deadline): no polling.

    ``backend``: :class:`~resilience.backends.MemoryBackend` (default, per process) or
    :class:`~resilience.backends.RedisBackend` (shared by every process, one round trip
    per decision, time from Redis). When the backend fails, ``on_backend_error`` decides:
    ``"local"`` (default) uses an in-process twin at ``local_rate`` (default: the full
    rate) and returns to the backend automatically, ``"open"`` admits, ``"closed"``
    raises :class:`~resilience.BackendError`. Every such decision emits
    :class:`~resilience.BackendFallback` and is counted in :meth:`statistics`.

    ``algorithm``: ``"token-bucket"`` (default) or the window algorithms of the
    ``limits`` library, ``"fixed-window"``, ``"moving-window"``, ``"sliding-window"``
    (whole-second periods; no reservation, ``max_wait`` polls at ``retry_after``; they
    read limits' own wall clock, not ``clock=``).

    Example::

        per_domain = rs.RateLimiter("2/s", key=lambda url: urlsplit(url).hostname, max_wait=5)

        @per_domain
        async def download(url: str) -> bytes: ...

        api = rs.RateLimiter("100/min", burst=20)
        decision = api.try_acquire(key=user_id)
        if not decision:
            return 429, {"Retry-After": math.ceil(decision.retry_after)}
    """

    __slots__ = (
        "_admit",
        "_admit_one",
        "_admitted",
        "_algorithm",
        "_buckets",
        "_clock",
        "_failover",
        "_gcra",
        "_key",
        "_key_fn",
        "_max_wait_us",
        "_rejected",
        "_waited",
        "burst",
        "max_wait",
        "rate",
    )

    raises_rejected = True
    rejection = RateLimited

    def __init__(
        self,
        rate: Rate | str,
        *,
        burst: int | None = None,
        key: Hashable | Callable[..., Hashable] | None = None,
        backend: MemoryBackend | RedisBackend | None = None,
        on_backend_error: FailureMode = "local",
        max_wait: float = 0.0,
        algorithm: Literal["token-bucket", "fixed-window", "moving-window", "sliding-window"] = (
            "token-bucket"
        ),
        local_rate: Rate | str | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.rate: Rate = as_rate(rate)
        self.burst: int = check_int(
            "burst", self.rate.amount if burst is None else burst, minimum=1
        )
        self.max_wait: float = check_number("max_wait", max_wait, minimum=0.0)
        if self.max_wait > _MAX_WAIT_LIMIT:
            raise ConfigurationError(f"max_wait must be <= {_MAX_WAIT_LIMIT:g}, got {max_wait!r}")
        self._max_wait_us = _wait_us(self.max_wait)
        self._algorithm = check_choice("algorithm", algorithm, ALGORITHMS)
        on_backend_error = check_choice("on_backend_error", on_backend_error, MODES)
        self._clock: Clock = check_clock("clock", clock)
        if callable(key) and not isinstance(key, str | bytes):
            self._key_fn: Callable[..., Hashable] | None = check_key_function("key", key)
            self._key: Hashable = None
        else:
            try:
                hash(key)
            except TypeError:
                raise ConfigurationError(
                    f"key must be hashable (one bucket for every call) or a function of "
                    f"the call's arguments, got {key!r}"
                ) from None
            self._key_fn = None
            self._key = key
        self._gcra = GCRA(self.rate, self.burst)
        self._admitted = 0
        self._rejected = 0
        self._waited = 0
        self._failover: Failover | None = None
        if backend is None:
            backend = MemoryBackend()
        self._buckets = self._make_buckets(backend, on_backend_error, local_rate)
        #: The memory GCRA lean paths (None for other stores).
        self._admit: Callable[[Hashable, int, int], float] | None = getattr(
            self._buckets, "admit", None
        )
        self._admit_one: Callable[[], float] | None = None
        if self._admit is not None and key is None and not self._max_wait_us:
            self._admit_one = self._buckets.admit_one

    # ------------------------------------------------------------------ construction

    def _make_buckets(self, backend: Any, mode: str, local_rate: Rate | str | None) -> Any:
        from ..backends._redis import RedisBackend

        windowed = self._algorithm != "token-bucket"
        if local_rate is not None:  # checked whatever the backend: a typo fails here
            as_rate(local_rate, "local_rate")
        if windowed and self.burst != self.rate.amount:
            raise ConfigurationError(
                f"burst applies to algorithm='token-bucket' only; {self._algorithm!r} "
                f"admits rate.amount ({self.rate.amount}) per window"
            )
        if isinstance(backend, MemoryBackend):
            if windowed:
                from ._windows import WindowBuckets

                return WindowBuckets.in_memory(
                    self._algorithm, self.rate, name=self.name, max_keys=backend.max_keys
                )
            return backend.gcra_buckets(self._gcra, self._clock)
        if not isinstance(backend, RedisBackend):
            raise ConfigurationError(
                f"backend must be a MemoryBackend or a RedisBackend, got {backend!r}"
            )
        twin_rate = self.rate if local_rate is None else as_rate(local_rate, "local_rate")
        if windowed:
            from ._windows import WindowBuckets

            primary: Any = WindowBuckets.on_redis(
                self._algorithm, self.rate, backend, name=self.name
            )
            twin: Any = WindowBuckets.in_memory(self._algorithm, twin_rate, name=self.name)
            twin_burst = twin_rate.amount
        else:
            from ._redis import RedisBuckets

            primary = RedisBuckets(backend, self._gcra, namespace=self.name)
            twin_burst = self.burst
            if local_rate is not None:
                ratio = twin_rate.per_second / self.rate.per_second
                twin_burst = max(1, min(self.burst, math.floor(self.burst * ratio)))
            twin = MemoryBackend().gcra_buckets(GCRA(twin_rate, twin_burst), self._clock)
        self._failover = Failover(mode, owner=self, clock=self._clock)
        return FailoverBuckets(
            primary, twin, self._failover, burst=self.burst, twin_burst=twin_burst
        )

    # ------------------------------------------------------------------ helpers

    def _budget_us(self, max_wait: float | None) -> int:
        """The reservation budget in µs: ``max_wait`` (or the default) cut to the deadline."""
        if max_wait is None:
            if not self._max_wait_us:
                return 0
            return _wait_us(clamp(self.max_wait))
        seconds = check_number("max_wait", max_wait, minimum=0.0)
        return _wait_us(clamp(min(seconds, _MAX_WAIT_LIMIT)))

    def _check_cost(self, cost: int) -> None:
        self._gcra.check_cost(cost)

    def _note_refusal(self, key: Hashable, retry_after: float) -> None:
        self._rejected += 1
        if self._observed:
            self._emit(
                CallRejected(
                    policy=self.name, key=None if key is None else str(key), retry_after=retry_after
                )
            )

    def _refused(self, key: Hashable, retry_after: float) -> RateLimited:
        """Count and report a refusal; the error to raise for it."""
        self._note_refusal(key, retry_after)
        where = "" if key is None else f" for {key!r}"
        return RateLimited(
            f"{self.name}: rate limited{where}, retry after {retry_after:.3f}s",
            retry_after=retry_after,
        )

    def _count(self, decision: Decision, key: Hashable) -> Decision:
        if decision.allowed:
            self._admitted += 1
        else:
            self._note_refusal(key, decision.retry_after)  # no error built: none raised
        return decision

    def _polling_delay(self, decision: Decision, budget_us: int) -> float | None:
        # Window algorithms cannot reserve: when the refusal will lift within the budget,
        # the shell sleeps retry_after and asks again. GCRA decisions never get here.
        if self._algorithm == "token-bucket":
            return None
        if decision.retry_after * 1_000_000 > budget_us:
            return None
        return max(decision.retry_after, 1e-6)

    # ------------------------------------------------------------------ direct use

    def try_acquire(self, key: Hashable = None, cost: int = 1) -> Decision:
        """Take ``cost`` tokens for ``key`` now, without waiting; ``cost=0`` only peeks.

        ``key=None`` means the limiter's constant ``key`` (or its single bucket). Never
        raises for a refusal (check ``decision.allowed``, or
        ``decision.raise_for_refusal()``); a ``cost`` above the burst raises
        :class:`~resilience.ConfigurationError` at once.

        Example::

            d = limiter.try_acquire(key="alice")
            print(d.allowed, d.remaining, d.retry_after, d.reset_after, d.limit)
        """
        decision = self._decide(key, cost)
        if decision.allowed and cost and (self._listeners or GLOBAL_LISTENERS):
            self._report_admission(self._key if key is None else key, 0.0)
        return decision

    async def try_acquire_async(self, key: Hashable = None, cost: int = 1) -> Decision:
        """Async :meth:`try_acquire` (asyncio or trio; Redis I/O does not block the loop).

        Example: ``d = await limiter.try_acquire_async(key="alice")``
        """
        decision = await self._decide_async(key, cost)
        if decision.allowed and cost and (self._listeners or GLOBAL_LISTENERS):
            self._report_admission(self._key if key is None else key, 0.0)
        return decision

    def reset(self, key: Hashable = None) -> None:
        """Forget ``key``'s bucket: its next request finds the full burst again.

        For unblocking a client, or clearing failed-login attempts after a success
        (limits' ``clear``, slowapi's ``reset``). On Redis it deletes the shared bucket,
        so every process sees it full; another process that refused the key may still
        refuse it from its denial cache until that refusal's ``retry_after``. Raises
        :class:`~resilience.BackendError` if Redis fails (the local twin is reset
        first). Keys the ASGI middleware limits are digests: reset
        ``rs.asgi.digest("ip:203.0.113.7")``.

        Example::

            if password_ok:
                login_limiter.reset(key=username)
        """
        self._buckets.reset(self._key if key is None else key)

    async def reset_async(self, key: Hashable = None) -> None:
        """Async :meth:`reset` (asyncio or trio; Redis I/O does not block the loop).

        Example: ``await limiter.reset_async(key="alice")``
        """
        await self._buckets.reset_async(self._key if key is None else key)

    # The decisions themselves, counted, refusals reported: what try_acquire() and the
    # ASGI middleware share (the middleware reports its own admissions).

    def _decide(self, key: Hashable, cost: int) -> Decision:
        if key is None:
            key = self._key  # the limiter's constant key, if it has one
        if cost is not _ONE:  # True and 1.0 equal 1 but are no cost: checked
            self._check_cost(cost)
        decision = self._buckets.take(key, cost, 0)
        # A peek (cost 0) takes nothing: neither an admission nor a refusal.
        return decision if cost == 0 else self._count(decision, key)

    async def _decide_async(self, key: Hashable, cost: int) -> Decision:
        if key is None:
            key = self._key
        if cost is not _ONE:  # True and 1.0 equal 1 but are no cost: checked
            self._check_cost(cost)
        buckets = self._buckets
        if buckets.local:
            decision = buckets.take(key, cost, 0)
        else:
            decision = await buckets.take_async(key, cost, 0)
        # A peek (cost 0) takes nothing: neither an admission nor a refusal.
        return decision if cost == 0 else self._count(decision, key)

    def acquire(
        self, key: Hashable = None, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """Take ``cost`` tokens, waiting up to ``max_wait`` (default: the limiter's) for them.

        The wait is a reservation: the slot is booked at once and the thread sleeps
        exactly until it, clamped by the ambient deadline. Raises
        :class:`~resilience.RateLimited` (with ``retry_after``) when the tokens cannot be
        had within that time.

        Example::

            limiter.acquire(key="example.com", max_wait=2.0)
            download("https://example.com/a")
        """
        if key is None:
            key = self._key  # the limiter's constant key, if it has one
        if cost is not _ONE:  # True and 1.0 equal 1 but are no cost: checked
            self._check_cost(cost)
        budget = self._budget_us(max_wait)
        polled = 0.0  # slept asking again (window algorithms, which cannot reserve)
        while True:
            decision: Decision = self._buckets.take(key, cost, budget)
            if decision.allowed:
                break
            delay = self._polling_delay(decision, budget)
            if delay is None:
                raise self._refused(key, decision.retry_after)
            self._clock.sleep(delay)
            polled += delay
            budget -= _wait_us(delay)
        self._admitted += 1
        if polled or decision.wait > 0:
            self._waited += 1  # (counted before a listener can interrupt the call)
        if self._listeners or GLOBAL_LISTENERS:
            self._report_admission(key, polled + decision.wait)
        if decision.wait > 0:
            self._clock.sleep(decision.wait)
        return decision

    async def acquire_async(
        self, key: Hashable = None, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """Async :meth:`acquire`: the task sleeps for its reservation (asyncio or trio).

        Example: ``await limiter.acquire_async(key="example.com", max_wait=2.0)``
        """
        if key is None:
            key = self._key  # the limiter's constant key, if it has one
        if cost is not _ONE:  # True and 1.0 equal 1 but are no cost: checked
            self._check_cost(cost)
        budget = self._budget_us(max_wait)
        buckets = self._buckets
        decision: Decision
        polled = 0.0  # see acquire()
        while True:
            if buckets.local:
                decision = buckets.take(key, cost, budget)
            else:
                decision = await buckets.take_async(key, cost, budget)
            if decision.allowed:
                break
            delay = self._polling_delay(decision, budget)
            if delay is None:
                raise self._refused(key, decision.retry_after)
            await self._clock.sleep_async(delay)
            polled += delay
            budget -= _wait_us(delay)
        self._admitted += 1
        if polled or decision.wait > 0:
            self._waited += 1  # (counted before a listener can interrupt the call)
        if self._listeners or GLOBAL_LISTENERS:
            self._report_admission(key, polled + decision.wait)
        if decision.wait > 0:
            await self._clock.sleep_async(decision.wait)
        return decision

    # ------------------------------------------------------------------ policy

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` once a token for its key is available.

        The key is ``key(*args, **kwargs)`` when the limiter's ``key`` is a function.
        Raises :class:`~resilience.RateLimited` if none is available within ``max_wait``.
        """
        refuse_async(self, fn)
        admit_one = self._admit_one
        if admit_one is not None:
            wait = admit_one()
            if wait:
                raise self._refused(None, -wait)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_admission(None, 0.0)
            return fn(*args, **kwargs)
        key_fn = self._key_fn
        key = self._key if key_fn is None else key_fn(*args, **kwargs)
        admit = self._admit
        if admit is not None:
            wait = admit(key, 1, self._max_wait_us and self._budget_us(None))
            if wait < 0:
                raise self._refused(key, -wait)
            if wait:
                self._waited += 1  # (counted before a listener can interrupt the call)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_admission(key, wait)
            if wait:
                self._clock.sleep(wait)
            return fn(*args, **kwargs)
        self.acquire(key)
        return fn(*args, **kwargs)

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` once a token for its key is available."""
        refuse_generator_async(fn)
        admit_one = self._admit_one
        if admit_one is not None:
            wait = admit_one()
            if wait:
                raise self._refused(None, -wait)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_admission(None, 0.0)
            return await fn(*args, **kwargs)
        key_fn = self._key_fn
        key = self._key if key_fn is None else key_fn(*args, **kwargs)
        admit = self._admit
        if admit is not None:
            wait = admit(key, 1, self._max_wait_us and self._budget_us(None))
            if wait < 0:
                raise self._refused(key, -wait)
            if wait:
                self._waited += 1  # (counted before a listener can interrupt the call)
            if self._listeners or GLOBAL_LISTENERS:
                self._report_admission(key, wait)
            if wait:
                await self._clock.sleep_async(wait)
            return await fn(*args, **kwargs)
        await self.acquire_async(key)
        return await fn(*args, **kwargs)

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate ``fn`` (``def`` or ``async def``, function or method).

        An in-memory token-bucket limiter without ``max_wait`` gets a wrapper that takes
        its token inline (the cheapest possible admitted call); everything else goes
        through :meth:`call` / :meth:`call_async`, which behave the same.

        Example::

            @rs.RateLimiter("10/s")
            def ping() -> None: ...
        """
        admit = self._admit
        if (
            admit is None
            or self._max_wait_us
            or isinstance(fn, classmethod | staticmethod)
            or not callable(fn)
            or is_generator_function(fn)
        ):
            return decorate(self, fn)
        if self._admit_one is not None:
            return cast(Callable[P, T], self._decorate_unkeyed(fn, self._admit_one))
        return cast(Callable[P, T], self._decorate_keyed(fn, admit))

    def _decorate_unkeyed(self, fn: Callable[P, T], admit_one: Callable[[], float]) -> Any:
        refused, admitted = self._refused, self._report_admission
        listeners = self._listeners  # mutated in place, never rebound
        if is_async_callable(fn):
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                wait = admit_one()
                if wait:
                    raise refused(None, -wait)
                if listeners or GLOBAL_LISTENERS:
                    admitted(None, 0.0)
                return await afn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wait = admit_one()
            if wait:
                raise refused(None, -wait)
            if listeners or GLOBAL_LISTENERS:
                admitted(None, 0.0)
            return fn(*args, **kwargs)

        return wrapper

    def _decorate_keyed(
        self, fn: Callable[P, T], admit: Callable[[Hashable, int, int], float]
    ) -> Any:
        refused, admitted = self._refused, self._report_admission
        listeners = self._listeners  # mutated in place, never rebound
        key_fn = self._key_fn
        if key_fn is None:
            constant = self._key

            def key_fn(*args: Any, **kwargs: Any) -> Hashable:
                return constant

        if is_async_callable(fn):
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                key = key_fn(*args, **kwargs)
                wait = admit(key, 1, 0)
                if wait:
                    raise refused(key, -wait)
                if listeners or GLOBAL_LISTENERS:
                    admitted(key, 0.0)
                return await afn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = key_fn(*args, **kwargs)
            wait = admit(key, 1, 0)
            if wait:
                raise refused(key, -wait)
            if listeners or GLOBAL_LISTENERS:
                admitted(key, 0.0)
            return fn(*args, **kwargs)

        return wrapper

    def __enter__(self) -> Decision:
        """``with limiter:`` takes one token of the limiter's constant key (or waits for it)."""
        return self.acquire(self._key)

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> Decision:
        """``async with limiter:`` takes one token of the limiter's constant key."""
        return await self.acquire_async(self._key)

    async def __aexit__(self, *exc: object) -> None:
        return None

    # ------------------------------------------------------------------ introspection

    def statistics(self) -> RateLimiterStatistics:
        """Counters: admitted, rejected, waited (reservations), keys and backend health.

        With a shared backend it also counts ``round_trips``, ``denial_cache_hits`` and
        the failure-mode counters ``backend_errors``, ``fallback_decisions``,
        ``backend_recoveries`` and ``backend_healthy``.

        Example::

            limiter = rs.RateLimiter("1/min")
            [limiter.try_acquire() for _ in range(4)]
            limiter.statistics().rejected   # 3
        """
        fields: dict[str, Any] = {
            "name": self.name,
            "rate": str(self.rate),
            "burst": self.burst,
            "algorithm": self._algorithm,
            "admitted": self._admitted + getattr(self._buckets, "admitted", 0),
            "rejected": self._rejected,
            "waited": self._waited,
        }
        buckets = self._buckets
        primary = buckets.primary if isinstance(buckets, FailoverBuckets) else buckets
        if hasattr(primary, "statistics"):
            fields.update(primary.statistics())
        fields.pop("lean_admitted", None)
        if hasattr(primary, "__len__"):
            fields["keys"] = len(primary)
        if self._failover is not None:
            fields.update(self._failover.statistics())
        known = RateLimiterStatistics.__dataclass_fields__
        return RateLimiterStatistics(**{k: v for k, v in fields.items() if k in known})

    def __repr__(self) -> str:
        parts = [f"<RateLimiter {self.name!r} {self.rate} burst={self.burst}"]
        if self._algorithm != "token-bucket":
            parts.append(f"algorithm={self._algorithm}")
        if self.max_wait:
            parts.append(f"max_wait={self.max_wait:g}")
        if self._key_fn is not None:
            parts.append("keyed")
        if self._failover is not None:
            parts.append(f"shared on_backend_error={self._failover.mode}")
        return " ".join(parts) + ">"
