"""ConcurrencyLimitMiddleware: load shedding with a bounded, prioritised queue."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from re import Pattern
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from .._clock import Clock
from .._events import GLOBAL_LISTENERS, CallRejected, Listener
from .._validate import (
    check_bool,
    check_callable,
    check_clock,
    check_header_name,
    check_int,
    check_name,
    check_number,
    check_predicate,
)
from ..bulkhead._bulkhead import Bulkhead, _check_priority
from ..bulkhead._permit import Permit
from ..errors import BackendError, BulkheadFull, ConfigurationError, ResilienceError, Timeout
from ._base import Observed
from ._events import RequestAdmitted, RequestCompleted
from ._headers import retry_after_value
from ._keys import KeyFunction, _as_key, cached_digest, keyed_scope, scope_app_of
from ._lag import LoopLags
from ._problem import REDUCED_CAPACITY, Problem
from ._rules import UNSET, Matcher, Rule, path_predicate, route_path
from ._types import (
    DEADLINE,
    DEADLINE_ECHO,
    TIMED_OUT,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    ends_response,
)

__all__ = ["ConcurrencyLimitMiddleware", "header_priority"]

_ALLOWED = ("bulkhead", "priority", "key", "max_wait")
#: An RFC 8941 dictionary key, and an integer value (RFC 9218 urgencies are 0..7).
_SF_KEY = re.compile(r"[a-z*][a-z0-9_.*-]*")
_SF_INTEGER = re.compile(r"-?[0-9]{1,15}")
#: A priority given as a number: ASCII digits, and few (str.isdigit() takes "²", which
#: int() refuses, and int() refuses thousands of digits): a client must not get a 500.
_INTEGER = re.compile(r"-?[0-9]{1,9}")
#: RFC 9218: a Priority field without ``u`` has urgency 3.
_RFC9218_DEFAULT_URGENCY = 3


def _urgency(field: str) -> int | None:
    """The urgency of an RFC 9218 ``Priority`` field (a structured-field dictionary
    with a ``u`` or ``i`` member: ``u=1, i``), or ``None`` if ``field`` is not one. The
    last ``u`` wins (RFC 8941); one that is not an integer in 0..7 is ignored, as are
    other members, and the urgency is then the default, 3."""
    urgency = _RFC9218_DEFAULT_URGENCY
    known = False
    for member in field.split(","):
        item = member.split(";", 1)[0].strip()  # parameters say nothing of urgency
        key, equals, value = item.partition("=")
        if not _SF_KEY.fullmatch(key):
            return None
        known = known or key in ("u", "i")
        if key == "u":
            value = value.strip()
            if equals and _SF_INTEGER.fullmatch(value) and 0 <= int(value) <= 7:
                urgency = int(value)
            else:
                urgency = _RFC9218_DEFAULT_URGENCY  # an invalid last u: ignored
    return urgency if known else None


PRIORITY_CLASSES: Mapping[str, int] = {"interactive": 0, "default": 5, "batch": 10}
"""Named priority classes understood by :func:`header_priority` (lower = more urgent)."""


def header_priority(
    name: str = "priority",
    *,
    default: int = 5,
    classes: Mapping[str, int] = PRIORITY_CLASSES,
    minimum: int = 0,
    maximum: int = 10,
) -> Callable[[Scope], int]:
    """Read a request's priority (lower = served first) from a header.

    Understands an integer (``X-Priority: 2``), a class name from ``classes``
    (``interactive`` 0, ``default`` 5, ``batch`` 10) and the RFC 9218 ``Priority``
    field's urgency (``u=1``; 3 when the field has none, as RFC 9218 says). Values are
    clamped to ``[minimum, maximum]`` and a missing or unreadable header means
    ``default``. Clients can claim any priority: only trust this header when it is set
    by your own gateway or first-party clients.

    Example::

        ConcurrencyLimitMiddleware(app, bulkhead=bulkhead,
                                   priority=header_priority("x-priority", default=5))
    """
    _check_priority("minimum", minimum)  # the bulkhead's own range
    if _check_priority("maximum", maximum) < minimum:
        raise ConfigurationError(f"maximum {maximum} is below minimum {minimum}")
    check_int("default", default, minimum=minimum, maximum=maximum)
    header_bytes = check_header_name("name", name).encode("latin-1")
    if not isinstance(classes, Mapping):
        raise ConfigurationError(f"classes must map class names to priorities, got {classes!r}")
    lowered: dict[str, int] = {
        str(k).lower(): check_int(f"classes[{k!r}]", v, minimum=minimum, maximum=maximum)
        for k, v in classes.items()
    }

    def priority(scope: Scope) -> int:
        lines = [raw for key, raw in scope.get("headers", ()) if key == header_bytes]
        if not lines:
            return default
        # Several field lines are one field, their values joined by commas (RFC 9110).
        value = b", ".join(lines).decode("latin-1").strip().lower()
        number: int | None
        if value in lowered:
            number = lowered[value]
        elif _INTEGER.fullmatch(value):
            number = int(value)
        else:
            number = _urgency(value)
            if number is None:
                return default
        return min(maximum, max(minimum, number))

    return priority


AUTO_QUEUE = 64
"""``max_queue="auto"``: at least this many may wait (more if the bulkhead has more
slots)."""


class _Waiter:
    """A request waiting in a bounded queue (see ``_acquire_queued``)."""

    __slots__ = ("evicted", "rank", "scope", "seq")

    def __init__(self, rank: int, seq: int) -> None:
        self.rank = rank
        self.seq = seq
        self.evicted = False
        self.scope = anyio.CancelScope()

    def order(self) -> tuple[int, int]:
        """Least urgent last, newest last among equals: ``max()`` picks the one to shed."""
        return self.rank, self.seq


class _Queue:
    """The requests waiting for one bulkhead's slots, per key, shared by every rule
    that uses that bulkhead (the bound and the displacement span all of them)."""

    __slots__ = ("arrivals", "max_queue", "waiting")

    def __init__(self, bulkhead: Any, max_queue: int | Literal["auto"] | None) -> None:
        if max_queue == "auto":
            limit = getattr(bulkhead, "max_concurrent", None)
            max_queue = max(AUTO_QUEUE, limit) if isinstance(limit, int) else AUTO_QUEUE
        elif isinstance(max_queue, str):
            raise ConfigurationError(f"max_queue must be an int, 'auto' or None, got {max_queue!r}")
        self.max_queue: int | None = check_int("max_queue", max_queue, allow_none=True)
        #: Requests now waiting for a slot, per key (absent: none).
        self.waiting: dict[str | None, list[_Waiter]] = {}
        self.arrivals = 0


class _Plan:
    __slots__ = (
        "acquire",
        "default_rank",
        "key",
        "max_wait",
        "policy",
        "priority",
        "priority_fn",
        "queue",
        "queued",
        "rejected",
        "take_now",
    )

    def __init__(
        self,
        bulkhead: Any,
        key: KeyFunction | None,
        priority: int | Callable[[Scope], int] | None,
        max_wait: float | None,
        queue: _Queue,
    ) -> None:
        if not isinstance(bulkhead, Bulkhead):
            raise ConfigurationError(f"bulkhead must be a rs.Bulkhead, got {bulkhead!r}")
        # The acquisition without the bulkhead's own admission event: the middleware
        # reports each request once (RequestAdmitted, with the time it queued).
        # (A subclass that overrides acquire_async keeps its override.)
        #: ``queued(key, priority, max_wait, may_wait)``: the quiet acquisition that asks
        #: ``may_wait()`` just before it queues (None for other bulkheads: they are
        #: counted as waiting from their arrival).
        self.queued: Callable[..., Any] | None = None
        #: Counts and reports a refusal as the bulkhead's own (``CallRejected``).
        self.rejected: Callable[[Any], BulkheadFull] | None = None
        self.acquire: Callable[..., Any] = bulkhead.acquire_async
        #: ``take_now(key)``: a free slot at once or ``None``, quietly (the first step
        #: of ``queued``), for an in-process bulkhead: the common case costs no more.
        self.take_now: Callable[[Any], Permit | None] | None = None
        if (
            isinstance(bulkhead, Bulkhead)
            and type(bulkhead).acquire_async is Bulkhead.acquire_async
        ):
            quiet = bulkhead._acquire_quietly_async
            self.acquire = lambda key, *, priority=None, max_wait=None: quiet(
                key, priority, max_wait
            )
            self.queued = quiet
            self.rejected = bulkhead._rejected
            if bulkhead._remote is None:
                self.take_now = bulkhead._take_quietly
        self.policy = str(getattr(bulkhead, "name", "Bulkhead"))
        self.key = None if key is None else _as_key(key).func
        if callable(priority):
            self.priority_fn: Callable[[Scope], int] | None = check_predicate(
                "priority", priority, gives="the priority"
            )
            self.priority: int | None = None
        else:
            self.priority_fn = None
            # The bulkhead's own range: a value it refuses must fail here, not per request.
            self.priority = None if priority is None else _check_priority("priority", priority)
        self.max_wait: float | None = check_number(
            "max_wait", max_wait, allow_none=True, allow_inf=True
        )
        self.queue = queue
        #: The rank in the bounded queue of a request without a priority: the one the
        #: bulkhead serves it at (its default).
        self.default_rank: int = bulkhead._default_priority


class ConcurrencyLimitMiddleware(Observed):
    """Shed load: cap requests in flight, queue a few briefly, refuse the rest with 503.

    Each request takes a permit from ``bulkhead`` (a :class:`resilience.Bulkhead`) for
    its whole duration, streaming included. When none is free it waits in the
    bulkhead's queue for at most ``max_wait`` (default: the bulkhead's), served by
    ``priority`` (lower first: ``0`` interactive before ``10`` batch; an int, a
    ``scope -> int`` such as :func:`header_priority`, or per-route via ``rules``), and
    FIFO within a priority. The queue is short: bounded in time by ``max_wait``
    (``math.inf`` as for the bulkhead: by length alone) and in length by ``max_queue``
    per key (default ``"auto"``: the bulkhead's ``max_concurrent``, at least 64;
    ``None``: no length bound). When that many wait, a newcomer more urgent than the
    least urgent waiter takes its place (the newest of the least urgent class is
    refused), any other newcomer gets a free slot or is refused at once. A request that
    does not get in is refused with ``503``, ``Retry-After`` and an
    ``application/problem+json`` body of type ``temporary-reduced-capacity``. ``key``
    makes the cap per key (per client, per tenant); keys are hashed first. A request
    whose client hangs up while it waits leaves the queue and never runs (counted in
    :attr:`abandoned`). Websocket and lifespan scopes pass through unless a rule names
    them.

    ``max_loop_lag`` (seconds, default ``None``: off) also sheds by time: while the
    event loop runs what is due more than that late (the server is behind on the
    requests it already has: a slower machine, costlier requests), every request that
    is not exempt is refused at once with the same 503, counted in :attr:`shed` and
    :attr:`shed_by_lag`. The lag is measured per event loop by a timer every
    ``max_loop_lag / 2`` (5 to 100 ms), and by how overdue that timer is, so a request
    served right after a stall sees it; the timer stops after twenty periods without a
    request. asyncio (uvloop included) only; on trio it is not measured.

    Example::

        bulkhead = rs.Bulkhead(64, max_wait=0.5)
        app.add_middleware(
            ConcurrencyLimitMiddleware,
            bulkhead=bulkhead,
            priority=header_priority("x-priority"),
            rules=[Rule("/batch/*", priority=10), Rule("/healthz", exempt=True)],
        )
    """

    __slots__ = (
        "_clock",
        "_default",
        "_exempt_path",
        "_exempt_when",
        "_hash",
        "_lagging_problem",
        "_lags",
        "_listeners",
        "_match",
        "_max_loop_lag",
        "_plans",
        "_problem",
        "_scope_app",
        "_scope_types",
        "abandoned",
        "app",
        "name",
        "retry_after",
        "shed",
        "shed_by_lag",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        bulkhead: Bulkhead,
        key: KeyFunction | None = None,
        priority: int | Callable[[Scope], int] | None = None,
        max_wait: float | None = None,
        max_queue: int | Literal["auto"] | None = "auto",
        retry_after: float = 1.0,
        exempt: Sequence[str | Pattern[str]] = (),
        exempt_when: Callable[[Scope], bool] | None = None,
        rules: Iterable[Rule] = (),
        hash_keys: bool = True,
        max_loop_lag: float | None = None,
        clock: Clock | None = None,
        name: str = "ConcurrencyLimitMiddleware",
    ) -> None:
        check_callable("app", app, allow_none=False)
        self.app = app
        self._scope_app = scope_app_of(app)
        self._clock: Clock = check_clock("clock", clock)
        self.name = check_name(name, "ConcurrencyLimitMiddleware")
        self._listeners: list[Listener] = []
        self._hash = check_bool("hash_keys", hash_keys)
        self.retry_after: float = check_number("retry_after", retry_after)
        self._exempt_path = path_predicate(exempt)
        self._exempt_when = check_predicate("exempt_when", exempt_when)
        self._max_loop_lag: float | None = check_number(
            "max_loop_lag", max_loop_lag, strict=True, allow_none=True
        )
        self._lags = None if self._max_loop_lag is None else LoopLags(self._max_loop_lag)
        # One queue per bulkhead, whichever rules share it.
        queues: dict[int, tuple[Any, _Queue]] = {}

        def queue_of(bulkhead: Any) -> _Queue:
            entry = queues.get(id(bulkhead))
            if entry is None:
                entry = queues[id(bulkhead)] = (bulkhead, _Queue(bulkhead, max_queue))
            return entry[1]

        self._default = _Plan(bulkhead, key, priority, max_wait, queue_of(bulkhead))
        matcher = Matcher(rules, allowed=_ALLOWED, owner="ConcurrencyLimitMiddleware")
        plans: list[_Plan | None] = []
        for rule in matcher.rules:
            if rule.exempt:
                plans.append(None)
                continue
            rule_bulkhead = bulkhead if rule.bulkhead is UNSET else rule.bulkhead
            plans.append(
                _Plan(
                    rule_bulkhead,
                    key if rule.key is UNSET else rule.key,
                    priority if rule.priority is UNSET else rule.priority,
                    max_wait if rule.max_wait is UNSET else rule.max_wait,
                    queue_of(rule_bulkhead),
                )
            )
        self._plans = plans
        self._match = matcher if matcher.rules else None
        self._scope_types = matcher.scope_types - {"http"}
        self._problem = Problem(
            503,
            REDUCED_CAPACITY,
            "Service capacity temporarily reduced",
            detail="too many requests in flight; retry later",
        )
        self._lagging_problem = Problem(
            503,
            REDUCED_CAPACITY,
            "Service capacity temporarily reduced",
            detail="the server is behind on the requests it has; retry later",
        )
        #: Requests refused with 503 so far (those of :attr:`shed_by_lag` included).
        self.shed = 0
        #: Requests refused with 503 because the event loop lagged (``max_loop_lag``).
        self.shed_by_lag = 0
        #: Requests whose client left while they waited in the queue (never run).
        self.abandoned = 0

    def statistics(self) -> dict[str, int]:
        """Counters since construction.

        Example: ``middleware.statistics()   # {"shed": 12}`` (see also :attr:`abandoned`
        and :attr:`shed_by_lag`)
        """
        return {"shed": self.shed}

    def _configured(self) -> list[str]:
        parts = [f"bulkhead={self._default.policy!r}"]
        if self._match is not None:
            parts.append(f"rules={len(self._plans)}")
        if self._max_loop_lag is not None:
            parts.append(f"max_loop_lag={self._max_loop_lag!r}")
        return parts

    @staticmethod
    async def _refuse(
        scope: Scope, receive: Receive, send: Send, retry_after: float, problem: Problem
    ) -> None:
        """Refuse a request: 503 (a websocket: close 1013), ``Retry-After``, problem body."""
        headers = [(b"retry-after", retry_after_value(retry_after))]
        if scope["type"] == "http":
            await problem.send(send, headers)
        else:
            await problem.send_websocket(send, scope, 1013, headers, receive)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind not in self._scope_types:
            await self.app(scope, receive, send)
            return
        plan: _Plan | None = self._default
        if self._match is not None:
            found = self._match.match(scope)
            if found is not None:
                plan = self._plans[found[0]]
            elif kind != "http":
                plan = None
        if (
            plan is None
            or (self._exempt_path is not None and self._exempt_path(route_path(scope)))
            or (self._exempt_when is not None and self._exempt_when(scope))
        ):
            await self.app(scope, receive, send)
            return
        # route() reads the wrapped app's routes from scope["app"] (see keyed_scope).
        keyed = scope if self._scope_app is None else keyed_scope(scope, self._scope_app)
        key: str | None = None
        if plan.key is not None:
            key = plan.key(keyed)
            if key is None:
                await self.app(scope, receive, send)
                return
            if self._hash:
                key = cached_digest(key)
        priority = (
            plan.priority
            if plan.priority_fn is None
            else _check_priority("priority", plan.priority_fn(keyed))
        )
        observed = bool(GLOBAL_LISTENERS or self._listeners)
        if self._lags is not None:
            loop = asyncio._get_running_loop()  # (None on trio: nothing to measure)
            if loop is not None and self._lags.lagging(loop):
                if _at_deadline(scope):
                    # The request's deadline (a TimeoutMiddleware outside) ends now: that
                    # middleware answers 504 for it, as for a wait for a slot cut there.
                    raise _deadline_timeout(scope, "the request's deadline ran out")
                self.shed += 1
                self.shed_by_lag += 1
                if observed:
                    self._emit(
                        CallRejected(policy=self.name, key=key, retry_after=self.retry_after)
                    )
                await self._refuse(scope, receive, send, self.retry_after, self._lagging_problem)
                return
        started = self._clock.monotonic() if observed else 0.0
        try:
            watch = kind == "http" and not _expects_continue(scope)
            admission = await _admit(plan, key, priority, receive if watch else None)
        except (BulkheadFull, BackendError) as exc:
            if isinstance(exc, BulkheadFull) and _at_deadline(scope):
                # Refused at the deadline of a TimeoutMiddleware outside (a wait clamped
                # to it ends on its own timer, which may run before the deadline's): it
                # would drop a 503 this close to its deadline for its 504. A Timeout is
                # what it answers as its deadline's own: no 503, nothing counted shed.
                raise _deadline_timeout(
                    scope, "the request's deadline ran out while it waited for a slot"
                ) from exc
            self.shed += 1
            hint = getattr(exc, "retry_after", None)
            retry_after = self.retry_after if hint is None else hint
            await self._refuse(scope, receive, send, retry_after, self._problem)
            return
        if admission is None:  # the client left while its request waited: nobody to answer
            self.abandoned += 1
            return
        permit, watched = admission
        if watched is not None:
            receive = watched
        if not observed:
            try:
                await self.app(scope, receive, send)
            finally:
                if permit.__class__ is Permit:
                    permit.release()  # in process: no I/O, no coroutine needed
                else:
                    await _release_async(permit)
            return
        admitted = self._clock.monotonic()
        outcome = "completed"
        # Observed HTTP requests are watched for a client that leaves before the response
        # is complete: frameworks end such a response quietly (Starlette's stream stops
        # and returns), which is no completed request.
        answered = gone = False

        async def receive_watched() -> Message:
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect" and not answered:
                gone = True
            return message

        async def send_watched(message: Message) -> None:
            nonlocal answered
            if ends_response(message):
                answered = True
            await send(message)

        try:
            # Inside: a listener that raises (even a BaseException) must not keep the slot.
            self._emit(
                RequestAdmitted(
                    policy=plan.policy, key=key, waited=admitted - started, priority=priority
                )
            )
            if kind == "http":
                await self.app(scope, receive_watched, send_watched)
                if gone or scope.get(TIMED_OUT):  # a client that left, a timeout inside
                    outcome = "cancelled"
            else:
                await self.app(scope, receive, send)
        except BaseException as exc:
            outcome = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else "error"
            raise
        finally:
            try:
                await _release_async(permit)
            finally:
                self._emit(
                    RequestCompleted(
                        policy=plan.policy,
                        key=key,
                        duration=self._clock.monotonic() - admitted,
                        outcome=outcome,
                    )
                )


def _at_deadline(scope: Scope) -> bool:
    """Whether the request's deadline, set by a TimeoutMiddleware outside, ends now."""
    cut = scope.get(DEADLINE)
    return cut is not None and cut[0].remaining() <= DEADLINE_ECHO


def _deadline_timeout(scope: Scope, message: str) -> Timeout:
    """The error that TimeoutMiddleware outside answers as its own deadline's (504)."""
    limit = scope[DEADLINE][1]
    error = Timeout(limit)
    error.args = (message,)
    return error


async def _admit(
    plan: _Plan, key: str | None, priority: int | None, receive: Receive | None
) -> tuple[Any, Receive | None] | None:
    """A permit of the plan's bulkhead for one request, with the ``receive`` the app
    must use (``None``: its own); ``None`` if the client left while it waited.

    The queue is bounded by ``max_queue`` per key: when a request would queue (no slot
    free) and the queue is full, a newcomer more urgent than the least urgent waiter
    takes that waiter's place (the newest of the least urgent class is refused, so
    interactive requests are not shed while batch ones wait); otherwise it is refused.
    Raises :class:`BulkheadFull` when refused or displaced.

    While a request waits, ``receive`` (if given) is watched for the client leaving
    (``http.disconnect``): a request nobody will read leaves the queue and never runs.
    At most two messages are read meanwhile (a body of one message, then the one after
    it); they, or what ``receive`` raised, reach the app first, in order. A body of
    several messages is left unread, for the app.
    """
    take_now = plan.take_now
    if take_now is not None:
        free = take_now(key)
        if free is not None:
            return free, None
    queue = plan.queue
    rank = plan.default_rank if priority is None else priority
    queue.arrivals += 1
    waiter = _Waiter(rank, queue.arrivals)
    line: list[_Waiter] | None = None
    # The watcher: on asyncio a task of its own, started once the request has waited
    # _WATCH_AFTER (a queue that drains fast costs no task), cancelled and never
    # awaited (nothing waits after the permit is granted); elsewhere (trio) a task
    # group's, from the start.
    loop = asyncio._get_running_loop() if receive is not None else None
    group: TaskGroup | None = None
    task: Any = None
    timer: Any = None

    def start_watching() -> None:
        nonlocal task
        assert loop is not None
        task = loop.create_task(watch())

    watcher = anyio.CancelScope()
    buffered: list[Message] = []
    failed: list[Exception] = []
    gone = False

    def may_wait() -> bool:
        nonlocal line, group, timer
        if line is not None:
            # Asked again for the same request (a distributed bulkhead whose Redis
            # failed while it waited moves it to its local twin): it is in line.
            return True
        line = queue.waiting.get(key)
        if line is None:
            line = queue.waiting[key] = []
        if queue.max_queue is not None and len(line) >= queue.max_queue:
            victim = max(line, key=_Waiter.order, default=None)
            if victim is None or victim.rank <= rank:
                if not line:
                    del queue.waiting[key]
                line = None
                return False
            line.remove(victim)
            victim.evicted = True
            victim.scope.cancel()
        line.append(waiter)
        if loop is not None:
            timer = loop.call_later(_WATCH_AFTER, start_watching)
        elif group is not None:
            group.start_soon(watch)
            group = None  # one watcher
        return True

    async def watch() -> None:
        nonlocal gone
        assert receive is not None
        with watcher:
            for _ in range(2):  # a body's one message, then the next: a disconnect
                try:
                    message = await receive()
                except Exception as exc:  # the app's to meet, where it reads
                    failed.append(exc)
                    return
                if message["type"] == "http.disconnect":
                    gone = True
                    waiter.scope.cancel()
                    return
                buffered.append(message)
                if message.get("more_body", False):
                    return  # a body of several messages: the app's to read

    async def wait_in_line() -> Any:
        with waiter.scope:
            if plan.queued is not None:
                return await plan.queued(key, priority, plan.max_wait, may_wait)
            # A bulkhead of another kind: counted as waiting from its arrival.
            if not may_wait():
                return await plan.acquire(key, priority=priority, max_wait=0.0)
            return await plan.acquire(key, priority=priority, max_wait=plan.max_wait)
        return None  # our own scope was cancelled: displaced, or the client left

    permit: Any = None
    failure: Exception | None = None
    try:
        if receive is None or loop is not None:
            try:
                permit = await wait_in_line()
            finally:
                if timer is not None:
                    timer.cancel()
                if task is not None:
                    task.cancel()
        else:
            async with anyio.create_task_group() as tasks:
                group = tasks
                try:
                    permit = await wait_in_line()
                except Exception as exc:  # raised below, not in the task group's group
                    failure = exc
                finally:
                    watcher.cancel()
    except BaseException:
        if permit is not None:  # granted, then cancelled while the watcher ended
            with anyio.CancelScope(shield=True):
                await _release_async(permit)
        raise
    finally:
        if line is not None:
            if not waiter.evicted:
                line.remove(waiter)
            if not line and queue.waiting.get(key) is line:
                del queue.waiting[key]
    if task is not None and not task.done():
        # The cancelled watcher unwinds before the app reads: a receive of its still in
        # progress (a TimeoutMiddleware outside tells a slow client by it: 408) must not
        # end after the app's own began. One loop turn, for requests that waited 50 ms.
        with anyio.CancelScope(shield=True):
            await asyncio.wait([task])
    if gone:
        if permit is not None:  # admitted as the client left: the slot goes back at once
            await _release_async(permit)
        return None
    if failure is not None:
        raise failure
    if permit is None:
        # A more urgent newcomer displaced this request. The bulkhead counts and
        # reports it.
        if plan.rejected is not None:
            raise plan.rejected(key)
        raise BulkheadFull("displaced from the full queue by a more urgent request")
    if not (buffered or failed):
        return permit, None
    assert receive is not None
    own_receive = receive

    async def replay() -> Message:
        if buffered:
            return buffered.pop(0)
        if failed:
            raise failed.pop()
        return await own_receive()

    return permit, replay


#: Seconds a request waits in the queue (on asyncio) before its client is watched for
#: leaving: a client hangs up after seconds, not milliseconds, and a queue that drains
#: faster costs no watcher task.
_WATCH_AFTER = 0.05


def _expects_continue(scope: Scope) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body: reading
    ``receive`` would ask for the body (uvicorn answers 100 then), which a request that
    may yet be shed must not do."""
    return any(
        name == b"expect" and value.lower() == b"100-continue"
        for name, value in scope.get("headers", ())
    )


async def _release_async(permit: Any) -> None:
    # Released even when the request was cancelled (timeout, client gone), without
    # blocking the loop on a Redis round trip (a cancelled release of a distributed
    # lease finishes in the background); a lost lease was already reported by the
    # bulkhead's own event.
    try:
        await permit.release_async()
    except ResilienceError:
        pass
