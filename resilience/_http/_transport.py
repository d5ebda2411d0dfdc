"""The resilient httpx transport: per-host limits, retries, hedging, server-paced hosts.

Layout: the decisions (which host, may it send, retry or not and after how long, which
hedge answer wins, what a response tells us) are methods shared by both shells; the
sync shell (``handle_request``) and the async shell (``handle_async_request``) differ
only in how they wait and send.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import fnmatch
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, TypeAlias

import anyio
import httpx

from .. import _deadline
from .._budget import RetryBudget
from .._clock import SYSTEM_CLOCK, Clock
from .._events import (
    CallRejected,
    Listener,
    Observable,
    RetriesExhausted,
    RetryScheduled,
)
from .._retry import _chain
from .._validate import (
    check_backoff,
    check_bool,
    check_clock,
    check_header_name,
    check_int,
    check_key_function,
    check_name,
    check_number,
)
from ..breaker import CircuitBreaker, CircuitState
from ..bulkhead import Bulkhead
from ..errors import ConfigurationError, RateLimited, Rejected
from ..ratelimit import Rate, RateLimiter
from ..testing._no_wait import NO_WAIT
from ._config import (
    IDEMPOTENT_METHODS,
    PRIORITY,
    RETRY_ON,
    RETRY_STATUSES,
    HostPolicy,
    Policies,
    TransportStatistics,
    check_exceptions,
    check_hedge,
    check_methods,
    check_statuses,
    resolve,
)
from ._events import HedgeStarted, HostPaused
from ._hosts import Host, HostTable, check_host_patterns, host_key, split_port
from ._latency import Latencies
from ._responses import (
    DeadlineStream,
    HeldStream,
    aclose_quietly,
    discard,
    mentions_signals,
    release_slot,
    release_slot_async,
)
from ._signals import read_signals

__all__ = ["ResilientTransport"]

Outcome: TypeAlias = "tuple[httpx.Response, None] | tuple[None, Exception]"

# The least time a retry must have left before the deadline, once its delay is slept,
# to be worth starting. Less cannot connect, send and read an answer over a real network,
# and a sleep may overshoot by a millisecond or so on a busy machine: such a retry would
# only trade the answer in hand for a TimeoutException raised before sending.
_MIN_ATTEMPT_TIME = 0.01


def _replayable(body: Any, *, at_once: bool) -> bool:
    """Can this request body be sent again with the same bytes (``at_once``: by two
    attempts at the same time, as hedging does)?

    Bytes are. So is httpx's multipart body, which renders anew on every iteration: bytes
    fields as they are, files from their start (it seeks them to 0), which works only
    for a seekable file, and never for two readers of one file at once. A generator, or
    any other stream, can be read once only.
    """
    if isinstance(body, httpx.ByteStream):
        return True
    try:  # httpx's own module, private: if it moves, uploads are simply sent once
        from httpx._multipart import FileField, MultipartStream
    except ImportError:  # pragma: no cover - depends on the httpx version
        return False
    if not isinstance(body, MultipartStream):
        return False
    for field in body.fields:
        if isinstance(field, FileField) and not isinstance(field.file, bytes | str):
            if at_once:
                return False
            try:
                if not field.file.seekable():
                    return False
            except (AttributeError, ValueError):  # not a full file object, or closed
                return False
    return True


class _Run:
    """The retry state of one request; created only after a first failure."""

    __slots__ = ("attempt", "delays", "repeatable", "ticket")

    def __init__(self, delays: Iterator[float], repeatable: bool) -> None:
        self.attempt = 1
        self.delays = delays
        self.repeatable = repeatable
        #: The budget's ticket of the retry scheduled last (given back if it is not sent).
        self.ticket: int | None = None


class ResilientTransport(httpx.BaseTransport, httpx.AsyncBaseTransport, Observable):
    """An httpx transport (sync and async) that is careful with every host it talks to.

    Wraps an inner transport (default: ``httpx.HTTPTransport()`` for ``httpx.Client``,
    ``httpx.AsyncHTTPTransport()`` for ``httpx.AsyncClient``) and, per host (or per
    ``key(request)``):

    * limits concurrency (``bulkhead=``), rate (``limiter=``) and stops calling a failing
      host (``breaker=``); a 5xx counts as a breaker failure, a 429 does not; the
      bulkhead slot is held until the response body is closed, and waiters are served
      by the request's ``extensions={PRIORITY: n}`` (lower first);
    * retries idempotent requests (``idempotent=``, or a request with an
      ``Idempotency-Key`` field) whose body can be read again (not a generator, nor an
      upload of an unseekable file) on connection errors, timeouts and 429/502/503/504,
      with jittered backoff, up to ``attempts``, within a :class:`~resilience.RetryBudget`;
      responses of failed attempts are closed;
    * listens to the server: ``Retry-After`` (seconds or HTTP-date), the IETF
      ``RateLimit``/``RateLimit-Policy`` fields and the legacy ``X-RateLimit-*`` ones
      pause that host (only that host) until the advertised reset, or spread its
      remaining quota until then; a retry waits at least ``Retry-After``; server delays
      are capped at ``max_server_delay``;
    * clamps each attempt's timeouts to the ambient deadline (:func:`resilience.deadline`,
      an outer :class:`~resilience.Timeout`) and, with ``deadline_header=``, tells the
      server how many seconds are left; a retry whose delay would leave it under 10 ms
      is not started (the last answer is returned);
    * optionally hedges (``hedge=``): when an idempotent request is still unanswered after
      a fixed delay or the host's observed percentile (``"p95"``), sends a second copy,
      takes the first good answer and cancels (async) or discards (sync) the other;
      hedges draw from the retry budget.

    Waits before sending (a server-imposed pause, and the limiter and bulkhead built
    from shorthand arguments) last at most ``max_wait`` seconds, clamped to the ambient
    deadline; past that the request fails, unsent, with the policy's
    :class:`~resilience.Rejected` error (:class:`~resilience.RateLimited` for a paused
    host, with ``retry_after``). A retry that a pause would hold beyond ``max_wait`` is
    not started: the last answer is returned.

    Arguments:
        inner: the transport that sends (sync, async, or both like ``MockTransport``).
        key: ``key(request) -> hashable``; default :func:`host_key` (host[:port]).
        bulkhead: a :class:`~resilience.Bulkhead` used per key, or an ``int``
            (slots per host).
        limiter: a :class:`~resilience.RateLimiter` used per key, or a rate (``"5/s"``).
        breaker: a :class:`~resilience.CircuitBreaker` (keyed: one circuit per host;
            unkeyed: shared), or ``True`` for a default one per host.
        hosts: ``{host or glob: HostPolicy(...)}``, overrides for some keys.
        attempts: total attempts of a retried request, the first included.
        backoff: delays between attempts (:mod:`resilience.backoff`).
        budget: the :class:`~resilience.RetryBudget` for retries and hedges (default:
            a private ``RetryBudget()``).
        idempotent: methods that may be sent more than once (retried or hedged).
        retry_statuses: statuses that are retried.
        retry_on: exception types that are retried.
        hedge: ``None`` (off), seconds, or a percentile of the host's latency (``"p95"``;
            no hedging until 20 answers were timed).
        hedge_threads: worker threads for sync hedging (async hedging uses tasks). Sync
            hedging waits for the hedge delay in real time, whatever the clock.
        server_signals: obey ``Retry-After`` and rate-limit fields (default ``True``).
        max_server_delay: the longest a server may make us wait (seconds).
        max_wait: the longest a request waits before being sent (seconds).
        deadline_header: a request header that receives the seconds left before the
            ambient deadline (e.g. ``"Request-Timeout"``), if any.
        max_hosts / idle_ttl: bounds of the per-host state.
        clock: time source (tests pass a FakeClock).
        name: the name in events.

    Example::

        import httpx
        import resilience as rs
        from resilience.httpx import ResilientTransport

        transport = ResilientTransport(bulkhead=4, limiter="10/s", breaker=True, hedge="p95")
        async with httpx.AsyncClient(transport=transport) as client:
            with rs.deadline(10.0):
                response = await client.get("https://example.com/video.mp4")
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        *,
        key: Callable[[httpx.Request], Hashable] | None = None,
        bulkhead: Bulkhead | int | None = None,
        limiter: RateLimiter | Rate | str | None = None,
        breaker: CircuitBreaker | bool | None = None,
        hosts: Mapping[str, HostPolicy] | None = None,
        attempts: int = 3,
        backoff: Iterable[float] | None = None,
        budget: RetryBudget | None = None,
        idempotent: Iterable[str] = IDEMPOTENT_METHODS,
        retry_statuses: Iterable[int] = RETRY_STATUSES,
        retry_on: type[Exception] | Iterable[type[Exception]] = RETRY_ON,
        hedge: float | str | None = None,
        hedge_threads: int = 64,
        server_signals: bool = True,
        max_server_delay: float = 60.0,
        max_wait: float = 30.0,
        deadline_header: str | None = None,
        max_hosts: int = 10_000,
        idle_ttl: float = 600.0,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        if inner is not None and not isinstance(
            inner, httpx.BaseTransport | httpx.AsyncBaseTransport
        ):
            raise ConfigurationError(f"inner must be an httpx transport, got {inner!r}")
        self.name: str = check_name(name, "ResilientTransport")
        self._listeners: list[Listener] = []
        self._clock: Clock = check_clock("clock", clock)
        self._now = self._clock.monotonic
        self._inner = inner
        self._sync_inner = inner if isinstance(inner, httpx.BaseTransport) else None
        self._async_inner = inner if isinstance(inner, httpx.AsyncBaseTransport) else None
        self._key = check_key_function("key", key)
        self.attempts: int = check_int("attempts", attempts, minimum=1)
        self._backoff: Iterable[float] = check_backoff(backoff)
        if budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigurationError(f"budget must be a RetryBudget, got {budget!r}")
        self.budget: RetryBudget = RetryBudget(clock=self._clock) if budget is None else budget
        self._idempotent = check_methods(idempotent)
        self._retry_statuses = check_statuses(retry_statuses)
        self._retry_on = check_exceptions(retry_on)
        self._hedge_fixed, self._hedge_quantile = check_hedge(hedge)
        self._hedging = hedge is not None
        self._hedge_threads: int = check_int("hedge_threads", hedge_threads, minimum=1)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._signals = check_bool("server_signals", server_signals)
        self.max_server_delay: float = check_number(
            "max_server_delay", max_server_delay, strict=True
        )
        self.max_wait: float = check_number("max_wait", max_wait, allow_inf=True)
        if deadline_header is not None:
            check_header_name("deadline_header", deadline_header)
        self._deadline_header = deadline_header
        # Before the policies: a breaker=True keeps its per-host state within these bounds.
        self._hosts: HostTable[Host] = HostTable(
            self._new_host, max_keys=max_hosts, idle_ttl=idle_ttl, clock=self._clock
        )
        self._default = self._resolve("", HostPolicy(bulkhead, limiter, breaker), (None,) * 3)
        self._overrides: list[tuple[str, Policies]] = []
        for pattern, policy in check_host_patterns("hosts", hosts):
            if not isinstance(policy, HostPolicy):
                raise ConfigurationError(f"hosts[{pattern!r}] must be a HostPolicy, got {policy!r}")
            self._overrides.append(
                (pattern.lower(), self._resolve(f"hosts[{pattern!r}].", policy, self._default))
            )
        self._lock = threading.Lock()
        self._requests = self._retries = self._recovered = self._exhausted = 0
        self._hedges = self._hedge_wins = self._pauses = self._rejected = 0

    # -- construction helpers -----------------------------------------------------------

    def _resolve(self, where: str, policy: HostPolicy, inherit: Any) -> Policies:
        return resolve(
            where,
            policy,
            inherit,
            max_wait=self.max_wait,
            clock=self._clock,
            name=self.name,
            max_hosts=self._hosts.max_keys,
            idle_ttl=self._hosts.idle_ttl,
        )

    def _new_host(self, key: Hashable) -> Host:
        policies = self._default
        if self._overrides:
            text = str(key).lower()
            # "slow.example.com" also names slow.example.com:8080 (a pattern with a
            # port names that port only); IPv6 keys are left whole (ambiguous colons).
            name, port = split_port(text)
            texts = (text, name) if port is not None else (text,)
            override = self._override_for(texts)
            if override is not None:
                policies = override
        latencies = Latencies() if self._hedge_quantile is not None else None
        return Host(key, *policies, latencies)

    def _override_for(self, texts: tuple[str, ...]) -> Policies | None:
        """The first override naming one of ``texts`` exactly, else the first glob."""
        for text in texts:
            for pattern, override in self._overrides:
                if pattern == text:
                    return override
        for text in texts:
            for pattern, override in self._overrides:
                if fnmatch.fnmatchcase(text, pattern):
                    return override
        return None

    # -- events and statistics ----------------------------------------------------------

    def statistics(self) -> TransportStatistics:
        """Requests, retries, hedges, pauses and hosts so far.

        Example: ``print(transport.statistics())``
        """
        return TransportStatistics(
            self._requests,
            self._retries,
            self._recovered,
            self._exhausted,
            self._hedges,
            self._hedge_wins,
            self._pauses,
            self._rejected,
            len(self._hosts),
        )

    def __repr__(self) -> str:
        inner = "default" if self._inner is None else type(self._inner).__name__
        parts = [f"<ResilientTransport {self.name!r} inner={inner} attempts={self.attempts}"]
        for label, policy in zip(("bulkhead", "limiter", "breaker"), self._default, strict=True):
            if policy is not None:
                parts.append(f"{label}={policy!r}")
        if self._hedging:
            parts.append("hedging")
        if self._overrides:
            parts.append(f"hosts={len(self._overrides)}")
        return " ".join(parts) + ">"

    # -- the core: decisions shared by both shells ---------------------------------------

    def _host_of(self, request: httpx.Request) -> Host:
        key = host_key(request) if self._key is None else self._key(request)
        return self._hosts.get(key)

    def _pause_step(self, host: Host) -> float:
        """0.0: the host may be sent to now; else seconds to wait and ask again."""
        now = self._now()
        with self._lock:
            wait = host.pace.admit(now)
        if wait <= 0:
            return 0.0
        if wait > _deadline.clamp(self.max_wait):
            self._rejected += 1
            if self._observed:
                self._emit(CallRejected(policy=self.name, key=str(host.key), retry_after=wait))
            raise RateLimited(
                f"{host.key} asked us to wait {wait:.3f}s, beyond max_wait or the deadline",
                retry_after=wait,
            )
        return wait

    def _prepare(self, request: httpx.Request) -> httpx.Request:
        """The request this attempt sends: ``request`` itself, or within a deadline a copy
        whose timeouts are clamped to it (and which forwards it). The caller's request is
        never changed: it may be sent again, with no deadline or another one."""
        remaining = _deadline.time_remaining()
        if remaining is None:
            return request
        if remaining <= 0:
            raise _NotSentInTime("the deadline passed before the request was sent", request=request)
        timeouts = request.extensions.get("timeout")
        if isinstance(timeouts, dict):
            clamped = {
                phase: remaining if value is None or value > remaining else value
                for phase, value in timeouts.items()
            }
        else:
            clamped = dict.fromkeys(("connect", "read", "write", "pool"), remaining)
        attempt = httpx.Request(
            request.method,
            request.url,
            headers=request.headers,  # copied by httpx
            stream=request.stream,
            extensions={**request.extensions, "timeout": clamped},
        )
        if hasattr(request, "_content"):
            # The caller's request was read (its body is bytes): so is the copy, for an
            # inner transport that reads request.content (httpx leaves a copy built from
            # a stream unread).
            attempt.read()
        if self._deadline_header is not None:
            attempt.headers[self._deadline_header] = f"{remaining:.3f}"
        return attempt

    @staticmethod
    def _failed(ticket: Any, exc: BaseException) -> None:
        """An attempt raised: tell the breaker (a cancellation counts for nothing)."""
        if ticket is not None:
            if isinstance(exc, httpx.TransportError):
                ticket.failure(exc)
            else:
                ticket.ignore()

    def _received(
        self,
        request: httpx.Request,
        host: Host,
        slot: Any,
        ticket: Any,
        response: httpx.Response,
        start: float,
    ) -> httpx.Response:
        """An attempt answered: record its outcome and what the server said."""
        status = response.status_code
        if ticket is not None:
            if status >= 500:
                ticket.failure()
            elif status == 429:
                ticket.ignore()
            else:
                ticket.success()
        latencies = host.latencies
        if latencies is not None and status < 500 and status != 429:
            latencies.record(self._now() - start)
        if self._signals and mentions_signals(response.headers):
            signals = read_signals(response.headers.raw, cap=self.max_server_delay, wall=time.time)
            if signals is not None:
                now = self._now()
                with self._lock:
                    pause = host.pace.observe(
                        now, signals, retry_after_applies=status == 429 or status >= 500
                    )
                    # Which signal sets the pause: a Retry-After as long as it, or the quota.
                    told = host.pace.not_before - now >= pause
                if pause > 0:
                    self._pauses += 1
                    if self._observed:
                        reason = "retry-after" if told else "quota"
                        self._emit(
                            HostPaused(
                                policy=self.name, key=str(host.key), seconds=pause, reason=reason
                            )
                        )
        if not response.is_closed and _deadline.current_deadline() is not None:
            response.stream = DeadlineStream(response.stream, request)
        if slot is not None:
            if response.is_closed:  # already read (a canned response): nothing to stream
                release_slot(slot)
            else:
                response.stream = HeldStream(response.stream, slot)
        return response

    def _repeatable(self, request: httpx.Request, body: Any, *, at_once: bool = False) -> bool:
        """May this request (whose body stream was ``body`` before sending) be repeated
        (``at_once``: by a hedge, while the first attempt may still be sending)?"""
        if request.method not in self._idempotent and "idempotency-key" not in request.headers:
            return False
        return _replayable(body, at_once=at_once)

    def _start(self, request: httpx.Request, body: Any) -> _Run:
        return _Run(iter(self._backoff), self._repeatable(request, body))

    def _plan(
        self, run: _Run, host: Host, response: httpx.Response | None, exc: Exception | None
    ) -> float | None:
        """The delay before the next attempt, or ``None`` to stop here."""
        if exc is not None and not isinstance(exc, self._retry_on):
            return None
        if not run.repeatable:
            return None
        attempt = run.attempt
        if attempt >= self.attempts:
            return self._give_up(host, attempt, "attempts", exc)
        try:
            delay = float(next(run.delays))
        except StopIteration:
            return self._give_up(host, attempt, "attempts", exc)
        if self._signals and host.pace.active:
            pause = host.pace.delay(self._now())
            # A retry waits for the host's pause like a fresh request (_pause_step), so
            # within max_wait too; past it, the answer in hand beats waiting.
            if pause > self.max_wait:
                return self._give_up(host, attempt, "max_wait", exc)
            delay = max(delay, pause)
        remaining = _deadline.time_remaining()
        if remaining is not None and remaining - delay < _MIN_ATTEMPT_TIME:
            return self._give_up(host, attempt, "deadline", exc)
        ticket = self.budget._take()
        if ticket is None:
            return self._give_up(host, attempt, "budget", exc)
        run.ticket = ticket
        run.attempt = attempt + 1
        self._retries += 1
        if self._observed:
            try:
                self._emit(
                    RetryScheduled(
                        policy=self.name,
                        key=str(host.key),
                        attempt=attempt,
                        delay=delay,
                        exception=exc,
                    )
                )
            except BaseException:  # a listener's KeyboardInterrupt: this retry is not sent
                self._unschedule(run)
                raise
        return 0.0 if NO_WAIT.get() else delay

    def _give_up(
        self, host: Host, attempts: int, reason: str, exc: Exception | None
    ) -> float | None:
        self._exhausted += 1
        if self._observed:
            self._emit(
                RetriesExhausted(
                    policy=self.name,
                    key=str(host.key),
                    attempts=attempts,
                    reason=reason,
                    exception=exc,
                )
            )
        return None

    def _good(self, outcome: httpx.Response | Exception) -> bool:
        return isinstance(outcome, httpx.Response) and (
            outcome.status_code not in self._retry_statuses
        )

    def _hedge_delay(self, host: Host, request: httpx.Request, body: Any) -> float | None:
        """How long to wait before hedging this request; ``None``: do not hedge it."""
        if not self._repeatable(request, body, at_once=True):
            return None
        if self._hedge_quantile is None:
            return self._hedge_fixed
        assert host.latencies is not None
        return host.latencies.quantile(self._hedge_quantile)

    def _may_hedge(self, host: Host) -> bool:
        """What a hedge needs besides slots, looked at without taking anything: an
        unpaused host, room in the retry budget and a closed circuit. A hedge that is
        not sent must cost nothing: the budget is drawn only when it starts."""
        if host.pace.active:
            now = self._now()
            with self._lock:
                if host.pace.delay(now) > 0:
                    return False
        if self.budget.statistics().available < 1:
            return False
        breaker = host.breaker
        return breaker is None or breaker.state_of(host.breaker_key) in _HEDGEABLE

    def _unschedule(self, run: _Run) -> None:
        """A retry was not sent (cancelled while the answer in hand was read or in its
        backoff, or refused by the host's policies): neither counted nor paid for."""
        self._retries -= 1
        if run.ticket is not None:
            self.budget._refund(run.ticket)

    def _commit_hedge(self, host: Host, admitted: _Hedge) -> bool:
        """Take the hedge's quota unit (a paced host) and its retry from the budget as it
        starts; if another caller took the last one meanwhile, give its slot and probe
        back: it is not sent."""
        if host.pace.active:
            with self._lock:
                if host.pace.admit(self._now()) > 0:
                    self._drop_hedge(admitted)
                    return False
        if self.budget.try_withdraw():
            return True
        self._drop_hedge(admitted)
        return False

    @staticmethod
    def _drop_hedge(admitted: _Hedge) -> None:
        _, slot, ticket = admitted
        if slot is not None:
            release_slot(slot)
        if ticket is not None:
            ticket.ignore()

    def _hedge_started(self, host: Host, delay: float) -> None:
        self._hedges += 1
        if self._observed:
            self._emit(HedgeStarted(policy=self.name, key=str(host.key), delay=delay))

    def _pick(self, outcomes: list[tuple[bool, httpx.Response | Exception]]) -> tuple[int, Outcome]:
        """The winner of a hedged round (first good answer, else the first answer)."""
        index = next((i for i, (_, out) in enumerate(outcomes) if self._good(out)), 0)
        hedged, winner = outcomes[index]
        if hedged and self._good(winner):
            self._hedge_wins += 1
        if isinstance(winner, httpx.Response):
            return index, (winner, None)
        return index, (None, winner)

    # -- the sync shell -----------------------------------------------------------------

    def _sync(self) -> httpx.BaseTransport:
        # Under the lock: threads sharing a client make their first requests together,
        # and each inner transport built and dropped would keep its pool's sockets open.
        with self._lock:
            if self._sync_inner is None:
                if self._inner is not None:
                    raise TypeError(f"{self._inner!r} is async-only: use it with httpx.AsyncClient")
                self._sync_inner = httpx.HTTPTransport()
            return self._sync_inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the inner transport, with this transport's policies.

        Called by ``httpx.Client``; direct use: ``transport.handle_request(request)``.
        """
        host = self._host_of(request)
        self._requests += 1
        self.budget.deposit()
        inner = self._sync_inner or self._sync()
        body = request.stream
        if self._hedging:
            response, exc = self._round(request, body, host, inner)
            if response is not None and response.status_code not in self._retry_statuses:
                return response
            return self._resume(request, body, host, inner, response, exc)
        try:
            response = self._send(request, host, inner)
        except Exception as error:
            failure: Exception | None = error
        else:
            if response.status_code in self._retry_statuses:
                return self._resume(request, body, host, inner, response, None)
            return response
        try:
            # Resumed outside the except block: a later attempt's error would have this
            # first one as its context, whatever failed in between (see _chain).
            return self._resume(request, body, host, inner, None, failure)
        finally:
            failure = None  # no exception <-> frame cycle

    def _resume(
        self,
        request: httpx.Request,
        body: Any,
        host: Host,
        inner: httpx.BaseTransport,
        response: httpx.Response | None,
        exc: Exception | None,
    ) -> httpx.Response:
        """Carry on after a failed first attempt (the happy path never gets here)."""
        run = self._start(request, body)
        links: list[BaseException] = []  # errors whose context _chain set
        previous: Exception | None = None
        try:
            while True:
                delay = self._plan(run, host, response, exc)
                if delay is None:
                    if exc is not None:
                        try:
                            raise exc
                        finally:
                            # Not kept by this frame, which the traceback references: no
                            # exception <-> frame cycle left for the garbage collector.
                            exc = None
                    assert response is not None
                    return response
                try:
                    kept = _kept(response)
                    self._clock.sleep(delay)
                except BaseException:
                    self._unschedule(run)
                    raise
                previous = exc
                response, exc = self._round(request, body, host, inner, run)
                if exc is not None:
                    _chain(exc, previous, links)  # attempt n follows n - 1, as in Retry
                final = self._settled(host, run, response, exc, kept, previous)
                if final is not None:
                    return final
        finally:
            # The errors' tracebacks reference this frame: none is kept by it.
            links.clear()
            previous = exc = None

    def _settled(
        self,
        host: Host,
        run: _Run,
        response: httpx.Response | None,
        exc: Exception | None,
        kept: httpx.Response | None,
        previous: Exception | None,
    ) -> httpx.Response | None:
        """The answer a retry round settles the run with, or ``None`` to go on."""
        if isinstance(exc, Rejected | _NotSentInTime):
            # Refused (a limiter, a bulkhead or the breaker), or out of time while it
            # waited: nothing was sent, so the retry is neither counted nor paid for,
            # and the caller gets the answer in hand, not an error for a call that was
            # made (an unsized answer could not be kept: then the error).
            self._unschedule(run)
            reason = "rejected" if isinstance(exc, Rejected) else "deadline"
            self._give_up(host, run.attempt, reason, exc)
            if kept is not None:
                return kept
            try:
                raise previous if previous is not None else exc
            finally:
                previous = exc = None  # not kept by this frame: no exception <-> frame cycle
        if response is not None and response.status_code not in self._retry_statuses:
            if response.status_code < 500:
                self._recovered += 1
            return response
        return None

    def _round(
        self,
        request: httpx.Request,
        body: Any,
        host: Host,
        inner: httpx.BaseTransport,
        run: _Run | None = None,
    ) -> Outcome:
        delay = self._hedge_delay(host, request, body) if self._hedging else None
        if delay is not None:
            return self._hedged(request, host, inner, delay)
        try:
            return self._send(request, host, inner, run), None
        except Exception as exc:
            return None, exc

    def _send(
        self,
        request: httpx.Request,
        host: Host,
        inner: httpx.BaseTransport,
        run: _Run | None = None,
    ) -> httpx.Response:
        """One attempt: wait for the host, its limiter and bulkhead; then send.

        ``run``: the retry this attempt is, given back if it is interrupted before it
        is sent (refusals come back as ``Rejected`` outcomes and are settled there).
        """
        slot = None
        ticket = None
        try:
            if host.breaker is not None:
                _refuse_if_open(host)
            if host.pace.active:
                while wait := self._pause_step(host):
                    self._clock.sleep(wait)
            if host.limiter is not None:
                host.limiter.acquire(host.key)
            if host.bulkhead is not None:
                slot = host.bulkhead.acquire(host.key, priority=request.extensions.get(PRIORITY))
            request = self._prepare(request)
            if host.breaker is not None:
                ticket = host.breaker.acquire_nowait(host.breaker_key)
        except BaseException as exc:
            if slot is not None:
                release_slot(slot)
            self._not_sent(run, exc)
            raise
        return self._exchange(request, host, inner, slot, ticket)

    def _not_sent(self, run: _Run | None, exc: BaseException) -> None:
        """An attempt that ends before it is sent (its slot given back by the shell): a
        retry interrupted while it waited (cancelled, not refused) is not made."""
        if run is not None and not isinstance(exc, Exception):
            self._unschedule(run)

    def _exchange(
        self,
        request: httpx.Request,
        host: Host,
        inner: httpx.BaseTransport,
        slot: Any,
        ticket: Any,
    ) -> httpx.Response:
        start = self._now() if host.latencies is not None else 0.0
        try:
            response = inner.handle_request(request)
        except BaseException as exc:
            if slot is not None:
                release_slot(slot)
            self._failed(ticket, exc)
            raise
        return self._received(request, host, slot, ticket, response, start)

    def _admit_hedge(self, request: httpx.Request, host: Host) -> _Hedge | None:
        """Admission of a hedge: everything or nothing, never waiting. A full bulkhead
        is not asked for a slot it would refuse (a hedge not sent is no rejection); the
        limiter's token is taken last but one, the budget's retry at the start."""
        if not self._may_hedge(host):
            return None
        slot = None
        if host.bulkhead is not None:
            slot = host.bulkhead._try_quietly(host.key)
            if slot is None:
                return None
        try:
            if host.limiter is not None and not host.limiter.try_acquire(host.key).allowed:
                raise _NotNow
            prepared = self._prepare(request)
            ticket = None
            if host.breaker is not None:
                ticket = host.breaker.acquire_nowait(host.breaker_key)
        except BaseException as exc:
            if slot is not None:
                release_slot(slot)
            if isinstance(exc, _NotNow | Rejected | httpx.TimeoutException):
                return None
            raise
        return prepared, slot, ticket

    def _hedged(
        self, request: httpx.Request, host: Host, inner: httpx.BaseTransport, delay: float
    ) -> Outcome:
        """A round with a hedge: two attempts in worker threads, the first good one wins.

        The hedge's delay counts from when the first attempt starts in its worker (not
        from when it was queued behind other rounds), and the hedge is admitted only as
        it starts in its own worker: a hedge waiting for a thread holds no slot, no
        token and no retry, and one still waiting when the round is decided is never
        sent. A sync send cannot be cancelled: a loser that started runs to completion
        in its thread and its response is closed there.
        """
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        self._hedge_threads, thread_name_prefix="resilience-hedge"
                    )
                pool = self._pool
        started = threading.Event()
        decided = threading.Event()

        def first_attempt() -> httpx.Response | None:
            started.set()
            return self._send(request, host, inner)

        def hedge() -> httpx.Response | None:
            # A thread freed by the first attempt's end may pick the hedge up before the
            # caller has seen that end: the answer in hand decides, no copy goes out.
            if decided.is_set() or first.done():
                return None
            admitted = self._admit_hedge(request, host)
            if admitted is None or not self._commit_hedge(host, admitted):
                return None
            prepared, slot, ticket = admitted
            self._hedge_started(host, delay)
            return self._exchange(prepared, host, inner, slot, ticket)

        futures: dict[concurrent.futures.Future[httpx.Response | None], bool] = {}
        outcomes: list[tuple[bool, httpx.Response | Exception]] = []
        order: list[concurrent.futures.Future[httpx.Response | None]] = []
        winner: concurrent.futures.Future[httpx.Response | None] | None = None
        try:
            first = pool.submit(contextvars.copy_context().run, first_attempt)
            futures[first] = False
            while not started.wait(0.05) and not first.done():
                pass  # the pool is busy with other rounds: the delay starts with the send
            done, pending = concurrent.futures.wait([first], timeout=delay)
            if not done:
                futures[pool.submit(contextvars.copy_context().run, hedge)] = True
            pending = set(futures)
            while pending:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    error = future.exception()
                    outcome = future.result() if error is None else error
                    if outcome is None:
                        continue  # a hedge that was not sent
                    if not isinstance(outcome, httpx.Response | Exception):
                        raise outcome  # KeyboardInterrupt and friends in a worker
                    order.append(future)
                    outcomes.append((futures[future], outcome))
                if any(self._good(out) for _, out in outcomes):
                    break
            index, result = self._pick(outcomes)
            winner = order[index]
            return result
        finally:
            decided.set()
            for future in futures:
                if future is not winner:
                    future.cancel()  # still queued: never sent, nothing held
                    future.add_done_callback(discard)

    def close(self) -> None:
        """Close the inner sync transport and stop the hedging threads.

        ``httpx.Client`` calls it on exit: ``with httpx.Client(transport=t): ...``
        """
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        if self._sync_inner is not None:
            self._sync_inner.close()

    # -- the async shell ----------------------------------------------------------------

    def _async(self) -> httpx.AsyncBaseTransport:
        with self._lock:  # event loops in several threads may share the transport too
            if self._async_inner is None:
                if self._inner is not None:
                    raise TypeError(f"{self._inner!r} is sync-only: use it with httpx.Client")
                self._async_inner = httpx.AsyncHTTPTransport()
            return self._async_inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the inner transport, with this transport's policies.

        Called by ``httpx.AsyncClient``; direct use:
        ``await transport.handle_async_request(request)``.
        """
        host = self._host_of(request)
        self._requests += 1
        self.budget.deposit()
        inner = self._async_inner or self._async()
        body = request.stream
        if self._hedging:
            response, exc = await self._round_async(request, body, host, inner)
            if response is not None and response.status_code not in self._retry_statuses:
                return response
            return await self._resume_async(request, body, host, inner, response, exc)
        try:
            response = await self._send_async(request, host, inner)
        except Exception as error:
            failure: Exception | None = error
        else:
            if response.status_code in self._retry_statuses:
                return await self._resume_async(request, body, host, inner, response, None)
            return response
        try:
            # Outside the except block (see handle_request).
            return await self._resume_async(request, body, host, inner, None, failure)
        finally:
            failure = None  # no exception <-> frame cycle

    async def _resume_async(
        self,
        request: httpx.Request,
        body: Any,
        host: Host,
        inner: httpx.AsyncBaseTransport,
        response: httpx.Response | None,
        exc: Exception | None,
    ) -> httpx.Response:
        """Carry on after a failed first attempt (the happy path never gets here)."""
        run = self._start(request, body)
        links: list[BaseException] = []  # errors whose context _chain set
        previous: Exception | None = None
        try:
            while True:
                delay = self._plan(run, host, response, exc)
                if delay is None:
                    if exc is not None:
                        try:
                            raise exc
                        finally:
                            # Not kept by this frame, which the traceback references: no
                            # exception <-> frame cycle left for the garbage collector.
                            exc = None
                    assert response is not None
                    return response
                try:
                    kept = await _kept_async(response)
                    await self._clock.sleep_async(delay)
                except BaseException:
                    self._unschedule(run)
                    raise
                previous = exc
                response, exc = await self._round_async(request, body, host, inner, run)
                if exc is not None:
                    _chain(exc, previous, links)  # attempt n follows n - 1, as in Retry
                final = self._settled(host, run, response, exc, kept, previous)
                if final is not None:
                    return final
        finally:
            # The errors' tracebacks reference this frame: none is kept by it.
            links.clear()
            previous = exc = None

    async def _round_async(
        self,
        request: httpx.Request,
        body: Any,
        host: Host,
        inner: httpx.AsyncBaseTransport,
        run: _Run | None = None,
    ) -> Outcome:
        delay = self._hedge_delay(host, request, body) if self._hedging else None
        if delay is not None:
            return await self._hedged_async(request, host, inner, delay, run)
        try:
            return await self._send_async(request, host, inner, run), None
        except Exception as exc:
            return None, exc

    async def _send_async(
        self,
        request: httpx.Request,
        host: Host,
        inner: httpx.AsyncBaseTransport,
        run: _Run | None = None,
    ) -> httpx.Response:
        """One attempt: wait for the host, its limiter and bulkhead; then send (see _send)."""
        slot = None
        ticket = None
        try:
            if host.breaker is not None:
                _refuse_if_open(host)
            if host.pace.active:
                while wait := self._pause_step(host):
                    await self._clock.sleep_async(wait)
            if host.limiter is not None:
                await host.limiter.acquire_async(host.key)
            if host.bulkhead is not None:
                slot = await host.bulkhead.acquire_async(
                    host.key, priority=request.extensions.get(PRIORITY)
                )
            request = self._prepare(request)
            if host.breaker is not None:
                ticket = await host.breaker.acquire_async(host.breaker_key)
        except BaseException as exc:
            if slot is not None:
                await release_slot_async(slot)
            self._not_sent(run, exc)
            raise
        return await self._exchange_async(request, host, inner, slot, ticket)

    async def _exchange_async(
        self,
        request: httpx.Request,
        host: Host,
        inner: httpx.AsyncBaseTransport,
        slot: Any,
        ticket: Any,
    ) -> httpx.Response:
        start = self._now() if host.latencies is not None else 0.0
        try:
            response = await inner.handle_async_request(request)
        except BaseException as exc:
            if slot is not None:
                await release_slot_async(slot)
            self._failed(ticket, exc)
            raise
        return self._received(request, host, slot, ticket, response, start)

    async def _admit_hedge_async(self, request: httpx.Request, host: Host) -> _Hedge | None:
        """Admission of a hedge: everything or nothing, never waiting (see _admit_hedge)."""
        if not self._may_hedge(host):
            return None
        slot = None
        if host.bulkhead is not None:
            slot = host.bulkhead._try_quietly(host.key)
            if slot is None:
                return None
        try:
            if host.limiter is not None:
                decision = await host.limiter.try_acquire_async(host.key)
                if not decision.allowed:
                    raise _NotNow
            prepared = self._prepare(request)
            ticket = None
            if host.breaker is not None:
                ticket = await host.breaker.acquire_async(host.breaker_key)
        except BaseException as exc:
            if slot is not None:
                await release_slot_async(slot)
            if isinstance(exc, _NotNow | Rejected | httpx.TimeoutException):
                return None
            raise
        return prepared, slot, ticket

    async def _hedged_async(
        self,
        request: httpx.Request,
        host: Host,
        inner: httpx.AsyncBaseTransport,
        delay: float,
        run: _Run | None = None,
    ) -> Outcome:
        """A round with a hedge: the first good answer wins, the other is cancelled.

        ``run``: the retry the first attempt is (see _send), when the round is one."""
        outcomes: list[tuple[bool, httpx.Response | Exception]] = []
        started = [1]
        first_event = anyio.Event()
        settled = anyio.Event()

        async def attempt(admitted: _Hedge | None) -> None:
            outcome: httpx.Response | Exception
            try:
                if admitted is None:
                    outcome = await self._send_async(request, host, inner, run)
                else:
                    prepared, slot, ticket = admitted
                    outcome = await self._exchange_async(prepared, host, inner, slot, ticket)
            except Exception as exc:
                outcome = exc
            outcomes.append((admitted is not None, outcome))
            good = self._good(outcome)
            outcome = None  # type: ignore[assignment] # not kept by this frame (no cycle)
            first_event.set()
            if good or len(outcomes) >= started[0]:
                settled.set()

        # Virtual clocks (FakeClock) time the hedge with a sleeping task, so that the
        # delay passes in virtual time; the system clock uses a cheaper cancel scope.
        virtual = self._clock is not SYSTEM_CLOCK

        async def ring() -> None:
            await self._clock.sleep_async(delay)
            first_event.set()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(attempt, None)
                if virtual:
                    group.start_soon(ring)
                    await first_event.wait()
                else:
                    with anyio.move_on_after(delay):
                        await first_event.wait()
                if not outcomes:
                    admitted = await self._admit_hedge_async(request, host)
                    if admitted is not None:
                        if outcomes:  # the first answered meanwhile: keep the hedge unsent
                            self._drop_hedge(admitted)
                        elif self._commit_hedge(host, admitted):
                            started[0] = 2
                            self._hedge_started(host, delay)
                            group.start_soon(attempt, admitted)
                await settled.wait()
                if virtual or len(outcomes) < started[0]:
                    group.cancel_scope.cancel()
            index, result = self._pick(outcomes)
        except BaseException:
            for _, outcome in outcomes:
                if isinstance(outcome, httpx.Response):
                    await aclose_quietly(outcome)
            raise
        for i, (_, outcome) in enumerate(outcomes):
            if i != index and isinstance(outcome, httpx.Response):
                await aclose_quietly(outcome)
        outcome = None  # type: ignore[assignment]
        outcomes.clear()  # the attempts' errors reference frames of this round: no cycle
        return result

    async def aclose(self) -> None:
        """Close the inner async transport.

        ``httpx.AsyncClient`` calls it on exit: ``async with httpx.AsyncClient(transport=t): ...``
        """
        if self._async_inner is not None:
            await self._async_inner.aclose()


#: A hedge admitted but not yet sent: the request it sends, its slot and its probe.
_Hedge: TypeAlias = tuple[httpx.Request, Any, Any]

#: Breaker states under which a hedge may go: not a probe of a recovering host.
_HEDGEABLE = frozenset({CircuitState.CLOSED, CircuitState.METRICS_ONLY, CircuitState.DISABLED})
_REFUSING = frozenset({CircuitState.OPEN, CircuitState.FORCED_OPEN})


def _refuse_if_open(host: Host) -> None:
    """An open breaker refuses an attempt before it waits for the host's pause, token
    or slot (its ticket is taken last, just before sending): no wait, no token spent.

    Raises the breaker's :class:`~resilience.CircuitOpen`; a probe admitted because
    the cool-down ended just now is given back (the attempt takes it later).
    """
    breaker = host.breaker
    assert breaker is not None
    if breaker.state_of(host.breaker_key) in _REFUSING:
        breaker.acquire_nowait(host.breaker_key).ignore()


class _NotNow(Exception):
    """A hedge's admission stopped short (no token): give back what it holds."""


class _NotSentInTime(httpx.TimeoutException):
    """The deadline passed while an attempt waited to be sent (a pause, the limiter's
    token, a bulkhead slot): nothing was sent. To the caller, an ``httpx.TimeoutException``."""


#: The largest answer kept (read) while its retry runs, to return if the retry is
#: refused before it is sent; a larger or unsized one is closed unread, as before.
_KEEP_BYTES = 64 * 1024


def _keepable(response: httpx.Response | None) -> bool:
    if response is None:
        return False
    length = response.headers.get("content-length", "")
    return length.isdigit() and int(length) <= _KEEP_BYTES


def _kept(response: httpx.Response | None) -> httpx.Response | None:
    """``response`` read (so returnable after its connection is freed), or None; closed
    either way: the retry must not wait for this answer's connection or slot."""
    if response is None:
        return None
    if _keepable(response):
        try:
            response.read()
            return response
        except httpx.HTTPError:
            pass
        except BaseException:  # interrupted mid-read: its connection and slot go back
            response.close()
            raise
    response.close()
    return None


async def _kept_async(response: httpx.Response | None) -> httpx.Response | None:
    """:func:`_kept` for async responses."""
    if response is None:
        return None
    if _keepable(response):
        try:
            await response.aread()
            return response
        except httpx.HTTPError:
            pass
        except BaseException:  # cancelled mid-read: its connection and slot go back
            await aclose_quietly(response)
            raise
    await response.aclose()
    return None
