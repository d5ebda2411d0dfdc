"""Key functions, one rule for every keyed policy: a plain function returning the key."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import resilience as rs
from resilience.asgi import RateLimitMiddleware, digest
from resilience.httpx import ResilientTransport

from ..asgi._support import call, http_scope, ok_app


async def host_of(url: str) -> str:
    return url.split("/")[2]


def hosts_of(url: str) -> Iterator[str]:
    yield url.split("/")[2]


class AsyncKey:
    async def __call__(self, url: str) -> str:
        return url


BUILDS: dict[str, Callable[[Any], object]] = {
    "RateLimiter": lambda key: rs.RateLimiter("1/min", key=key),
    "Bulkhead": lambda key: rs.Bulkhead(1, key=key),
    "CircuitBreaker": lambda key: rs.CircuitBreaker(key=key),
    "Faults": lambda key: rs.Faults(key=key, error_rate=0.1),
    "ResilientTransport": lambda key: ResilientTransport(key=key),
    "RateLimitMiddleware": lambda key: RateLimitMiddleware(
        ok_app, limiter=rs.RateLimiter("1/min"), key=key
    ),
}


@pytest.mark.parametrize("policy", sorted(BUILDS))
@pytest.mark.parametrize(
    "key",
    [host_of, functools.partial(host_of), AsyncKey(), hosts_of],
    ids=["async-def", "async-partial", "async-callable-object", "generator"],
)
def test_an_async_or_generator_key_function_is_refused(policy: str, key: Any) -> None:
    """An ``async def`` key function returns a new coroutine per call: every call got
    a key, a bucket, a slot group or a breaker of its own, and nothing was limited
    (five of five calls through a "1/min" limiter). Refused when the policy is built."""
    with pytest.raises(rs.ConfigurationError, match="plain function returning the key"):
        BUILDS[policy](key)


@pytest.mark.anyio
async def test_a_key_with_a_lone_surrogate_is_limited_not_a_500() -> None:
    """A key function may return text with a lone surrogate (``"\\ud800"`` from a JSON
    claim): it is hashed like any key. (The digest raised UnicodeEncodeError, a 500.)
    Keys that ``surrogateescape`` encodes keep their digests."""
    claim = "user\ud800"
    middleware = RateLimitMiddleware(
        ok_app, limiter=rs.RateLimiter("1/min"), key=lambda scope: claim
    )
    statuses = [(await call(middleware, http_scope())).status for _ in range(2)]
    assert statuses == [200, 429]
    assert digest(claim) != digest("user")
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert digest(undecodable) == hashlib.blake2b(b"caf\xe9", digest_size=16).hexdigest()


class LazyKey:
    """A sync key object whose attributes are looked up lazily (a LocalProxy)."""

    def __call__(self, request: dict[str, str]) -> str:
        return request["user"]

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"not bound yet ({name})")


def test_a_sync_key_object_with_misbehaving_attributes_is_accepted() -> None:
    """The async check must not judge an object whose attribute lookups raise: a lazy
    proxy is a plain key function (it raised its own RuntimeError when the policy was
    built)."""
    limiter = rs.RateLimiter("1/min", key=LazyKey())

    @limiter
    def handle(request: dict[str, str]) -> str:
        return request["user"]

    assert handle({"user": "u"}) == "u"
    rs.Bulkhead(1, key=LazyKey())
    rs.CircuitBreaker(key=LazyKey())


async def cost_of(scope: Any) -> int:
    return 1


def test_async_cost_and_priority_functions_are_refused() -> None:
    """An ``async def`` cost or priority function gave a coroutine per request: every
    request failed (a 500). Refused when the middleware is built."""
    from resilience.asgi import ConcurrencyLimitMiddleware

    with pytest.raises(rs.ConfigurationError, match="returning the cost"):
        RateLimitMiddleware(ok_app, limiter=rs.RateLimiter("1/min"), cost=cost_of)
    with pytest.raises(rs.ConfigurationError, match="returning the priority"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=rs.Bulkhead(1), priority=cost_of)


def test_a_lone_surrogate_shares_no_digest_with_another_key() -> None:
    """``"\\ud800"`` in ``surrogatepass`` is ``ED A0 80``, the bytes ``surrogateescape``
    gives ``"\\udced\\udca0\\udc80"``: the two keys must still not share a bucket."""
    assert digest("\ud800") != digest("\udced\udca0\udc80")
