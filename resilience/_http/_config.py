"""The transport's configuration: defaults, per-host policies, argument checks."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import httpx

from .._clock import Clock
from .._validate import check_int, check_number
from ..breaker import CircuitBreaker
from ..bulkhead import Bulkhead
from ..errors import ConfigurationError
from ..ratelimit import Rate, RateLimiter
from ._hosts import host_key

__all__ = [
    "IDEMPOTENT_METHODS",
    "PRIORITY",
    "RETRY_ON",
    "RETRY_STATUSES",
    "HostPolicy",
    "Policies",
    "TransportStatistics",
    "check_exceptions",
    "check_hedge",
    "check_methods",
    "check_statuses",
    "resolve",
]

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""Methods RFC 9110 §9.2.2 calls idempotent: the only ones retried or hedged by default."""
PRIORITY = "resilience.priority"
"""The request extension holding a bulkhead priority (lower is served first):
``client.get(url, extensions={PRIORITY: 0})``."""
RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Response statuses retried by default."""
RETRY_ON: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
"""Exceptions retried by default: timeouts, network errors, a connection closed early."""

BulkheadSpec: TypeAlias = "Bulkhead | int | Literal[False] | None"
LimiterSpec: TypeAlias = "RateLimiter | Rate | str | Literal[False] | None"
BreakerSpec: TypeAlias = "CircuitBreaker | bool | None"
Policies: TypeAlias = "tuple[Bulkhead | None, RateLimiter | None, CircuitBreaker | None]"
"""The policies of a host, resolved: (bulkhead, limiter, breaker)."""


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Limits for some hosts, overriding the transport-wide ones (see ``hosts=``).

    Each field takes the same values as the transport's argument of the same name;
    ``None`` (the default) inherits the transport's, ``False`` means none for these
    hosts.

    Example::

        ResilientTransport(bulkhead=8, limiter="20/s", hosts={
            "slow.example.com": HostPolicy(bulkhead=2, limiter="2/s"),
            "*.internal": HostPolicy(limiter=False),
        })
    """

    bulkhead: BulkheadSpec = None
    limiter: LimiterSpec = None
    breaker: BreakerSpec = None


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """Counters of a :class:`ResilientTransport` since it was built.

    ``requests``: requests handled; ``retries``: extra attempts started; ``recovered``:
    requests that succeeded after a retry; ``exhausted``: requests that gave up retrying;
    ``hedges``: hedged copies sent; ``hedge_wins``: hedges that answered first;
    ``pauses``: pauses a server imposed on a host; ``rejected``: requests refused
    because a host stayed paused beyond ``max_wait``; ``hosts``: hosts tracked now.

    Example: ``assert transport.statistics().exhausted == 0``
    """

    requests: int
    retries: int
    recovered: int
    exhausted: int
    hedges: int
    hedge_wins: int
    pauses: int
    rejected: int
    hosts: int


def resolve(
    where: str,
    policy: HostPolicy,
    inherit: Policies,
    *,
    max_wait: float,
    clock: Clock,
    name: str,
    max_hosts: int = 10_000,
    idle_ttl: float = 600.0,
) -> Policies:
    """Turn a :class:`HostPolicy` (shorthands, ``None``, ``False``) into policy objects.

    Shorthands build policies on ``clock`` that wait up to ``max_wait``; a per-host
    breaker keeps at most ``max_hosts`` hosts, each for ``idle_ttl`` seconds of silence.
    """
    bulkhead: Any = policy.bulkhead
    if bulkhead is None:
        bulkhead = inherit[0]
    elif bulkhead is False:
        bulkhead = None
    elif isinstance(bulkhead, int) and not isinstance(bulkhead, bool):
        bulkhead = Bulkhead(
            check_int(f"{where}bulkhead", bulkhead, minimum=1),
            max_wait=max_wait,
            clock=clock,
            name=f"{name}.bulkhead",
        )
    elif not isinstance(bulkhead, Bulkhead):
        raise ConfigurationError(
            f"{where}bulkhead must be a Bulkhead or a number of slots, got {bulkhead!r}"
        )
    limiter: Any = policy.limiter
    if limiter is None:
        limiter = inherit[1]
    elif limiter is False:
        limiter = None
    elif isinstance(limiter, str | Rate):
        limiter = RateLimiter(limiter, max_wait=max_wait, clock=clock, name=f"{name}.limiter")
    elif not isinstance(limiter, RateLimiter):
        raise ConfigurationError(
            f"{where}limiter must be a RateLimiter or a rate such as '10/s', got {limiter!r}"
        )
    breaker: Any = policy.breaker
    if breaker is None:
        breaker = inherit[2]
    elif breaker is False:
        breaker = None
    elif breaker is True:
        breaker = CircuitBreaker(
            key=host_key,
            max_keys=max_hosts,
            idle_ttl=idle_ttl,
            clock=clock,
            name=f"{name}.breaker",
        )
    elif not isinstance(breaker, CircuitBreaker):
        raise ConfigurationError(
            f"{where}breaker must be a CircuitBreaker or True, got {breaker!r}"
        )
    return bulkhead, limiter, breaker


def check_hedge(value: Any) -> tuple[float | None, float | None]:
    """``hedge=`` as (fixed delay, quantile); both None when hedging is off."""
    if value is None:
        return None, None
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            percent = float(text[1:]) if text.startswith("p") else math.nan
        except ValueError:
            percent = math.nan
        if not 0 < percent < 100:
            raise ConfigurationError(
                f"hedge must be seconds > 0 or a percentile such as 'p95', got {value!r}"
            )
        return None, percent / 100
    return check_number("hedge", value, strict=True), None


def check_statuses(value: Any) -> frozenset[int]:
    """``retry_statuses=`` as a frozenset of HTTP status codes."""
    try:
        statuses = frozenset(value)
    except TypeError:
        statuses = frozenset({None})
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigurationError(f"retry_statuses must be HTTP status codes, got {value!r}")
    return statuses


def check_methods(value: Any) -> frozenset[str]:
    """``idempotent=`` as a frozenset of upper-case method names."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigurationError(f"idempotent must be a collection of methods, got {value!r}")
    methods = []
    for method in value:
        if not isinstance(method, str) or not method.isalpha():
            raise ConfigurationError(f"idempotent must contain HTTP methods, got {method!r}")
        methods.append(method.upper())
    return frozenset(methods)


def check_exceptions(value: Any) -> tuple[type[Exception], ...]:
    """``retry_on=`` as a tuple of exception types."""
    try:
        types = (value,) if isinstance(value, type) else tuple(value)
    except TypeError:
        types = (value,)
    for item in types:
        if not (isinstance(item, type) and issubclass(item, Exception)):
            raise ConfigurationError(f"retry_on must be exception types, got {value!r}")
    return types
