"""RateLimitMiddleware: per-client (or per-anything) rate limits for any ASGI app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from re import Pattern
from typing import Any

from .._events import GLOBAL_LISTENERS, CallRejected, Listener
from .._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_name,
    check_predicate,
)
from ..backends._memory import MemoryBuckets
from ..errors import BackendError, ConfigurationError
from ..ratelimit import RateLimiter
from ..ratelimit._gcra import CostAboveBurst
from ._base import Observed
from ._events import RequestAdmitted, ShadowRejected
from ._headers import HEADER_MODES, HeaderMode, RateLimitHeaders, retry_after_value
from ._keys import (
    _DIGESTS,
    KeyFunction,
    _as_key,
    cached_digest,
    client_ip,
    keyed_scope,
    scope_app_of,
)
from ._problem import QUOTA_EXCEEDED, REDUCED_CAPACITY, Problem
from ._rules import UNSET, Matcher, Rule, path_predicate, route_path
from ._types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RateLimitMiddleware"]

_ALLOWED = ("limiter", "cost", "key", "policy_name")


def _policy_name(limiter: Any, explicit: str | None, fallback: str) -> str:
    if explicit is not None:
        return explicit
    name = getattr(limiter, "name", None)
    if isinstance(name, str) and name and name != type(limiter).__name__:
        return name
    return fallback


def _no_count(decision: Any, key: str) -> Any:
    return decision


def _no_fields(fill: int) -> Sequence[tuple[bytes, bytes]]:
    raise AssertionError("admitted_fields is only used with take_one")


class _Plan:
    """Everything one rule (or the default) needs per request, resolved at construction."""

    __slots__ = (
        "acquire",
        "admitted_fields",
        "cost",
        "cost_fn",
        "count",
        "decide",
        "full_fields",
        "full_fill",
        "headers",
        "key",
        "limiter",
        "name",
        "policy",
        "problem",
        "rehash",
        "take_one",
    )

    def __init__(
        self,
        limiter: Any,
        key: KeyFunction,
        cost: int | Callable[[Scope], int],
        name: str,
        headers: str | None,
        hash_keys: bool,
    ) -> None:
        if not callable(getattr(limiter, "try_acquire_async", None)):
            raise ConfigurationError(
                f"limiter must be a rs.RateLimiter (with try_acquire_async), got {limiter!r}"
            )
        self.limiter = limiter
        #: The limiter's own name: events carry it, so that they line up with its own.
        self.policy = str(getattr(limiter, "name", name))
        # A RateLimiter's decisions without its own admission events: the middleware
        # reports admissions itself (RequestAdmitted), once per request. A subclass that
        # overrides try_acquire(_async), or another limiter, is called through its
        # public methods (its overrides, and the events they emit, included).
        base = isinstance(limiter, RateLimiter)
        own_sync = base and type(limiter).try_acquire is RateLimiter.try_acquire
        own_async = base and type(limiter).try_acquire_async is RateLimiter.try_acquire_async
        exact = own_sync and own_async
        self.acquire = limiter._decide_async if exact else limiter.try_acquire_async
        # An in-process limiter decides without I/O: call its sync twin and save the
        # coroutine (the limiter's own async shell does the same for local buckets),
        # unless the async method is overridden: then the override is what to call.
        local = getattr(getattr(limiter, "_buckets", None), "local", False) is True
        self.decide: Callable[[str, int], Any] | None = None
        if local and own_async:
            self.decide = limiter._decide if own_sync else limiter.try_acquire
        # With hashing on, ``key`` returns the digest itself where the key function knows
        # a shorter way to it (the default client_ip(): one lookup by peer address);
        # ``rehash`` says whether what ``key`` returns still has to be hashed.
        as_key = _as_key(key)
        fused = as_key._digest if hash_keys else None
        self.key: KeyFunction = as_key.func if fused is None else fused
        self.rehash = hash_keys and fused is None
        if callable(cost):
            self.cost_fn: Callable[[Scope], int] | None = check_predicate(
                "cost", cost, gives="the cost"
            )
            self.cost = 1
        else:
            self.cost_fn = None
            self.cost = check_int("cost", cost, minimum=0)
            burst = getattr(limiter, "burst", None)
            if isinstance(burst, int | float) and self.cost > burst:
                raise ConfigurationError(
                    f"cost {self.cost} exceeds the burst {burst:g} of {limiter!r}: "
                    "no request could ever be admitted"
                )
        self.name = name
        self.headers = RateLimitHeaders(name, limiter, headers)
        # The leanest path: an in-memory token bucket taking one token. The buckets'
        # take_one() returns the ticks until full when admitted (no Decision built), or
        # the refusal's Decision, which the limiter then counts as try_acquire would.
        buckets = getattr(limiter, "_buckets", None)
        self.take_one: Callable[[str], Any] | None = None
        self.count: Callable[[Any, str], Any] = _no_count
        self.admitted_fields: Callable[[int], Sequence[tuple[bytes, bytes]]] = _no_fields
        # The fill after one token from a full bucket (most requests) and its fields,
        # rendered once; -1: no take_one, never a fill.
        self.full_fill = -1
        self.full_fields: Sequence[tuple[bytes, bytes]] = ()
        if exact and type(buckets) is MemoryBuckets and self.cost_fn is None and self.cost == 1:
            self.take_one = buckets.take_one
            self.count = limiter._count
            self.admitted_fields = self.headers.for_fill(buckets.gcra)
            self.full_fill = buckets.gcra.emission
            self.full_fields = self.admitted_fields(self.full_fill)
        self.problem = Problem(
            429,
            QUOTA_EXCEEDED,
            "Request cannot be satisfied as assigned quota has been exceeded",
            extra={"violated-policies": [name]},
        )


class RateLimitMiddleware(Observed):
    """Rate-limit requests per key, answering 429 with standard headers when over.

    A pure ASGI middleware: it works with Starlette, FastAPI and any ASGI app, needs no
    parameter on endpoints, never reads request bodies and never buffers responses
    (the headers are added to ``http.response.start`` as it goes by).

    * ``limiter``: a :class:`resilience.RateLimiter` (in memory or on Redis); ``key``
      picks the bucket (default :func:`client_ip`, the socket peer); ``cost`` the
      tokens a request takes (an int or ``scope -> int``).
    * Admitted responses carry ``RateLimit-Policy`` and ``RateLimit``
      (``headers="ietf"``), the ``X-RateLimit-*`` trio (``"legacy"``), both, or
      nothing (``"none"``), computed from the limiter's decision: no extra backend call.
    * Refused requests get ``429`` with ``Retry-After``, the same fields and an
      ``application/problem+json`` body of type ``quota-exceeded``.
    * ``rules``: per-route :class:`Rule` objects with their own ``limiter``, ``cost``,
      ``key`` and ``policy_name`` (first match wins); ``Rule(..., exempt=True)``,
      ``exempt=`` path patterns and the ``exempt_when(scope)`` predicate skip limiting.
    * ``shadow=True`` evaluates and counts (``statistics()``, :class:`ShadowRejected`
      events) but never refuses and adds no headers: deploy, watch, then enforce.
    * Keys are hashed (BLAKE2b) before they reach the limiter (``hash_keys=False`` to
      keep them readable); a key function returning ``None`` leaves the request
      unlimited. When the limiter's backend fails, its ``on_backend_error`` decides;
      with ``"closed"`` the middleware answers 503.
    * Websocket and lifespan scopes pass through untouched, unless a rule with
      ``scopes=("websocket",)`` names them; refused handshakes get a 429 response
      where the server supports it, else close code 1013 (try again later).

    Example::

        limiter = rs.RateLimiter("100/minute", burst=20)
        app.add_middleware(
            RateLimitMiddleware,
            limiter=limiter,
            key=rs.asgi.client_ip(trusted_proxies=["10.0.0.0/8"]),
            exempt=["/healthz", "/metrics"],
            rules=[Rule("/login", methods=["POST"], limiter=rs.RateLimiter("5/minute"))],
        )
    """

    __slots__ = (
        "_default",
        "_exempt_path",
        "_exempt_when",
        "_hash",
        "_listeners",
        "_match",
        "_plans",
        "_quiet",
        "_scope_app",
        "_scope_types",
        "_simple",
        "_unavailable",
        "app",
        "backend_errors",
        "name",
        "rejected",
        "shadow",
        "shadow_rejected",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: RateLimiter | None = None,
        key: KeyFunction | None = None,
        cost: int | Callable[[Scope], int] = 1,
        headers: HeaderMode | None = "ietf",
        policy_name: str | None = None,
        exempt: Sequence[str | Pattern[str]] = (),
        exempt_when: Callable[[Scope], bool] | None = None,
        shadow: bool = False,
        rules: Iterable[Rule] = (),
        hash_keys: bool = True,
        name: str = "RateLimitMiddleware",
    ) -> None:
        check_callable("app", app, allow_none=False)
        self.app = app
        self._scope_app = scope_app_of(app)
        self.name = check_name(name, "RateLimitMiddleware")
        self._listeners: list[Listener] = []
        self.shadow = check_bool("shadow", shadow)
        self._hash = check_bool("hash_keys", hash_keys)
        headers = check_choice("headers", "none" if headers is None else headers, HEADER_MODES)
        default_key: KeyFunction = client_ip() if key is None else key
        self._exempt_path = path_predicate(exempt)
        self._exempt_when = check_predicate("exempt_when", exempt_when)
        matcher = Matcher(rules, allowed=_ALLOWED, owner="RateLimitMiddleware")
        if limiter is None and not matcher.rules:
            raise ConfigurationError(
                "RateLimitMiddleware needs a limiter= (or rules= with limiters)"
            )
        self._default: _Plan | None = (
            None
            if limiter is None
            else _Plan(
                limiter,
                default_key,
                cost,
                _policy_name(limiter, policy_name, "default"),
                headers,
                self._hash,
            )
        )
        plans: list[_Plan | None] = []
        for index, rule in enumerate(matcher.rules):
            if rule.exempt:
                plans.append(None)
                continue
            rule_limiter = limiter if rule.limiter is UNSET else rule.limiter
            if rule_limiter is None:
                raise ConfigurationError(f"{rule!r} needs a limiter (the middleware has none)")
            rule_name = (
                rule.policy_name
                if rule.policy_name is not UNSET
                else _policy_name(
                    rule_limiter,
                    policy_name if rule_limiter is limiter else None,
                    "default" if rule_limiter is limiter else f"rule{index}",
                )
            )
            plans.append(
                _Plan(
                    rule_limiter,
                    default_key if rule.key is UNSET else rule.key,
                    cost if rule.cost is UNSET else rule.cost,
                    rule_name,
                    headers,
                    self._hash,
                )
            )
        self._plans = plans
        self._match = matcher if matcher.rules else None
        self._scope_types = matcher.scope_types - {"http"}
        # No rules, exemptions or predicate: the default plan applies to every request.
        self._simple = (
            self._match is None and self._exempt_path is None and self._exempt_when is None
        )
        # Shadow mode and headers="none" add nothing to responses.
        self._quiet = self.shadow or headers == "none"
        self._unavailable = Problem(
            503,
            REDUCED_CAPACITY,
            "Service capacity temporarily reduced",
            detail="the rate limiter's backend is unavailable",
        )
        #: Requests refused with 429 so far.
        self.rejected = 0
        #: Requests shadow mode would have refused so far.
        self.shadow_rejected = 0
        #: Backend errors (``on_backend_error="closed"``) met so far.
        self.backend_errors = 0

    def _configured(self) -> list[str]:
        parts = [f"limiter={None if self._default is None else self._default.limiter!r}"]
        if self._match is not None:
            parts.append(f"rules={len(self._plans)}")
        if self.shadow:
            parts.append("shadow")
        return parts

    def statistics(self) -> dict[str, int]:
        """Counters since construction.

        Example::

            middleware.statistics()   # {"rejected": 3, "shadow_rejected": 0, "backend_errors": 0}
        """
        return {
            "rejected": self.rejected,
            "shadow_rejected": self.shadow_rejected,
            "backend_errors": self.backend_errors,
        }

    def _plan_for(self, scope: Scope) -> _Plan | None:
        """The plan of a request (``None``: not limited), for the non-trivial setups."""
        plan = self._default
        if self._match is not None:
            found = self._match.match(scope)
            if found is not None:
                plan = self._plans[found[0]]
            elif scope["type"] != "http":
                return None
        if plan is None:
            return None
        if self._exempt_path is not None and self._exempt_path(route_path(scope)):
            return None
        if self._exempt_when is not None and self._exempt_when(scope):
            return None
        return plan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind not in self._scope_types:
            await self.app(scope, receive, send)
            return
        plan = self._default if self._simple else self._plan_for(scope)
        if plan is None:
            await self.app(scope, receive, send)
            return
        # route() reads the wrapped app's routes from scope["app"] (see keyed_scope).
        keyed = scope if self._scope_app is None else keyed_scope(scope, self._scope_app)
        key = plan.key(keyed)
        if key is None:
            await self.app(scope, receive, send)
            return
        if plan.rehash:
            key = _DIGESTS.get(key) or cached_digest(key)
        take_one = plan.take_one
        if take_one is not None:
            fill = take_one(key)
            if fill.__class__ is not int:  # refused: the Decision, counted by the limiter
                await self._refused(scope, receive, send, plan, key, plan.count(fill, key))
                return
            if GLOBAL_LISTENERS or self._listeners:
                self._emit(RequestAdmitted(policy=plan.policy, key=key))
            if self._quiet or kind != "http":
                await self.app(scope, receive, send)
                return
            # The fields of Decision.remaining and .reset_after, from the ticks until full.
            extra = plan.full_fields if fill == plan.full_fill else plan.admitted_fields(fill)
        else:
            cost = plan.cost if plan.cost_fn is None else plan.cost_fn(keyed)
            try:
                if plan.decide is not None:
                    decision = plan.decide(key, cost)
                else:
                    decision = await plan.acquire(key, cost)
            except BackendError:
                self.backend_errors += 1
                if self.shadow:
                    await self.app(scope, receive, send)
                    return
                await self._refuse(
                    scope, receive, send, self._unavailable, [(b"retry-after", b"1")], 1011
                )
                return
            except CostAboveBurst:
                # A request's own cost above the burst can never be admitted: a refusal
                # without Retry-After, not a 500 a client could trigger at will (an
                # invalid cost, a float or a negative one, still fails loudly).
                await self._too_costly(scope, receive, send, plan, key, cost)
                return
            if not decision.allowed:
                await self._refused(scope, receive, send, plan, key, decision)
                return
            if GLOBAL_LISTENERS or self._listeners:
                self._emit(RequestAdmitted(policy=plan.policy, key=key))
            if self._quiet or kind != "http":
                await self.app(scope, receive, send)
                return
            extra = plan.headers.admitted(decision)

        # A plain function returning the server's own awaitable: no extra coroutine per
        # message; only http.response.start is touched, the body streams through as is.
        # A copy: an app may send one start message (and header list) on every request.
        def send_with_headers(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            return send(message)

        await self.app(scope, receive, send_with_headers)

    async def _refused(
        self, scope: Scope, receive: Receive, send: Send, plan: _Plan, key: str, decision: Any
    ) -> None:
        """A refused decision: 429 (or, in shadow mode, count it and let the request in)."""
        if await self._shadowed(scope, receive, send, plan, key, decision.retry_after):
            return
        headers = [(b"retry-after", retry_after_value(decision.retry_after))]
        headers.extend(plan.headers.refused(decision))
        await self._refuse(scope, receive, send, plan.problem, headers, 1013)

    async def _too_costly(
        self, scope: Scope, receive: Receive, send: Send, plan: _Plan, key: str, cost: int
    ) -> None:
        """A request that costs more than the burst: 429 without Retry-After."""
        # The limiter raised rather than deciding, so it reported nothing: report the
        # refusal as it would have (a CallRejected, also in shadow mode).
        if self._observed:
            self._emit(CallRejected(policy=plan.policy, key=key, retry_after=None))
        if await self._shadowed(scope, receive, send, plan, key, None):
            return
        problem = Problem(
            429,
            QUOTA_EXCEEDED,
            "Request cannot be satisfied as assigned quota has been exceeded",
            detail=f"the request costs {cost}, more than the policy's burst allows",
            extra={"violated-policies": [plan.name]},
        )
        await self._refuse(scope, receive, send, problem, [], 1013)

    async def _shadowed(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        plan: _Plan,
        key: str,
        retry_after: float | None,
    ) -> bool:
        """Count a refusal; in shadow mode also let the request in (``True``: done)."""
        if not self.shadow:
            self.rejected += 1
            return False
        self.shadow_rejected += 1
        if self._observed:
            self._emit(ShadowRejected(policy=plan.policy, key=key, retry_after=retry_after))
        await self.app(scope, receive, send)
        return True

    @staticmethod
    async def _refuse(
        scope: Scope,
        receive: Receive,
        send: Send,
        problem: Problem,
        headers: list[tuple[bytes, bytes]],
        code: int,
    ) -> None:
        if scope["type"] == "http":
            await problem.send(send, headers)
        else:
            await problem.send_websocket(send, scope, code, headers, receive)
