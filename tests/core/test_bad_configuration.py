"""Bad configuration fails at construction with ConfigurationError, naming the argument:
predicates that could only misbehave later, numbers beyond any float."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience import asgi, chaos
from resilience.breaker import CountWindow, TimeWindow
from resilience.testing import FakeClock, FaultsFixture, RedisServer


async def _never(*args: Any) -> bool:
    return False


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


ASYNC_PREDICATES: dict[str, Callable[[], object]] = {
    "exempt_when": lambda: asgi.RateLimitMiddleware(
        _app, limiter=rs.RateLimiter("1/h"), exempt_when=_never
    ),
    "exempt_when ": lambda: asgi.ConcurrencyLimitMiddleware(
        _app, bulkhead=rs.Bulkhead(1), exempt_when=_never
    ),
    "on": lambda: rs.Retry(on=_never),
    "on_result": lambda: rs.Retry(on=OSError, on_result=_never),
    "on ": lambda: rs.Fallback(2, on=_never),
    "record": lambda: rs.CircuitBreaker(record=_never),
    "exclude": lambda: rs.CircuitBreaker(exclude=_never),
    "record_result": lambda: rs.CircuitBreaker(record_result=_never),
    "when": lambda: rs.Faults(error_rate=1.0, when=_never),
    "when ": lambda: chaos.Error(when=_never),
    "exception": lambda: chaos.Error(_never),  # type: ignore[arg-type]
    "Latency seconds": lambda: chaos.Latency(_never),  # type: ignore[arg-type]
    "priority": lambda: rs.Bulkhead(1, priority=_never),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", list(ASYNC_PREDICATES))
def test_an_async_predicate_is_refused(name: str) -> None:
    """An ``async def`` predicate returns a coroutine, always truthy: its answer would
    be ignored (``exempt_when`` exempting every request, ``on`` retrying everything),
    so it is refused where it is given."""
    with pytest.raises(rs.ConfigurationError, match=f"^{name.strip()} must be a plain function"):
        ASYNC_PREDICATES[name]()


WRONG_ARITY: dict[str, Callable[[], object]] = {
    "on_result": lambda: rs.Retry(on=OSError, on_result=lambda a, b: False),
    "record_result": lambda: rs.CircuitBreaker(record_result=lambda a, b: False),
    "exception": lambda: chaos.Error(lambda a, b: ValueError()),  # type: ignore[arg-type,misc]
    "Latency seconds": lambda: rs.Faults(latency=lambda: 0.01, latency_rate=1.0),
    "exempt_when": lambda: asgi.RateLimitMiddleware(
        _app, limiter=rs.RateLimiter("1/h"), exempt_when=lambda: False
    ),
    "key": lambda: asgi.RateLimitMiddleware(_app, limiter=rs.RateLimiter("1/h"), key=lambda: "k"),
}


@pytest.mark.parametrize("name", list(WRONG_ARITY))
def test_a_callable_that_cannot_take_its_arguments_is_refused(name: str) -> None:
    """A predicate, factory or distribution whose signature cannot take what it will
    be given failed with TypeError at its first call (every request, every call)."""
    with pytest.raises(rs.ConfigurationError, match=f"^{name} must take"):
        WRONG_ARITY[name]()


def test_well_formed_callables_are_accepted() -> None:
    """The checks refuse only what cannot work: the usual shapes pass."""
    rs.Retry(on=OSError, on_result=lambda result: result is None)
    rs.CircuitBreaker(record_result=lambda result, *rest: False)
    rs.Faults(chaos.Error(lambda: ValueError("x")), chaos.Latency(chaos.exponential(0.1)))
    rs.Faults(error_rate=1.0, when=lambda *args, **kwargs: True)
    asgi.RateLimitMiddleware(_app, limiter=rs.RateLimiter("1/h"), key=lambda scope: "k")


async def _app_ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _status_of(app: Any, path: str) -> int:
    """The status ``app`` answers a GET of ``path`` from one client with."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [], "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return int(sent[0]["status"])


class _StatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def test_a_wrapper_that_supplies_an_argument_is_accepted(fake_clock: FakeClock) -> None:
    """``inspect.signature`` reports the signature of the function a ``functools.wraps``
    wrapper names, not the wrapper's own: a decorator or an ``update_wrapper``-ed
    ``partial`` that supplies an argument was refused as taking too many. Both kinds
    are accepted and called with what the policy gives."""

    def has_status(status: int, exc: BaseException) -> bool:
        return getattr(exc, "status", None) == status

    is_server_error = functools.update_wrapper(functools.partial(has_status, 500), has_status)
    attempts: list[int] = []

    @rs.Retry(on=is_server_error, attempts=3, backoff=[0.0, 0.0], clock=fake_clock)
    def fetch(status: int) -> None:
        attempts.append(status)
        raise _StatusError(status)

    with pytest.raises(_StatusError):
        fetch(500)
    with pytest.raises(_StatusError):
        fetch(404)
    assert attempts == [500, 500, 500, 404]

    def with_prefix(fn: Callable[[dict[str, Any], str], bool]) -> Callable[..., bool]:
        @functools.wraps(fn)
        def wrapper(scope: dict[str, Any]) -> bool:
            return fn(scope, "/health")

        return wrapper

    @with_prefix
    def is_exempt(scope: dict[str, Any], prefix: str) -> bool:
        return str(scope["path"]).startswith(prefix)

    middleware = asgi.RateLimitMiddleware(
        _app_ok, limiter=rs.RateLimiter("1/h"), exempt_when=is_exempt
    )
    statuses = [anyio.run(_status_of, middleware, path) for path in ["/health"] * 3 + ["/a"] * 2]
    assert statuses == [200, 200, 200, 200, 429]
    refused = functools.update_wrapper(lambda: False, has_status)  # takes nothing at all
    with pytest.raises(rs.ConfigurationError, match="must take"):
        rs.Retry(on=OSError, on_result=refused)


@pytest.mark.parametrize("huge", [10**400, -(10**5000)], ids=["1e400", "-1e5000"])
def test_an_integer_beyond_any_float_is_a_configuration_error(huge: int) -> None:
    """``int`` arguments past float range raised OverflowError from the check itself
    (where infinity is allowed, such as a bulkhead's ``max_wait``, a huge positive
    one means it)."""
    assert rs.Bulkhead(1, max_wait=10**400).max_wait == float("inf")
    for make in (
        lambda: rs.Timeout(huge),
        lambda: rs.Bulkhead(1, max_wait=-abs(huge)),
        lambda: rs.RateLimiter("1/s", max_wait=huge),
        lambda: rs.backoff.constant(huge),
        lambda: rs.Rate(10, huge),
    ):
        with pytest.raises(rs.ConfigurationError, match="10\\*\\*"):
            make()


def test_a_rate_period_too_long_to_count_in_microseconds_is_refused() -> None:
    """``Rate(10, 1e308)`` passed the finite check, then overflowed converting to µs."""
    with pytest.raises(rs.ConfigurationError, match="rate period"):
        rs.Rate(10, 1e308)
    assert rs.Rate(1, 1e12).period == 1e12


def test_a_retry_budget_too_large_to_count_grants_every_retry() -> None:
    """``min_per_second=1e308`` made the allowance infinite, and the budget raised
    OverflowError inside the user's call and from statistics()."""
    clock = FakeClock()
    budget = rs.RetryBudget(ratio=1e308, min_per_second=1e308, clock=clock)
    failures = [OSError(), OSError()]

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    retry = rs.Retry(on=OSError, attempts=3, budget=budget, backoff=[0, 0], clock=clock)
    assert retry(flaky)() == "ok"
    assert budget.statistics().available > 10**18


NOT_COLLECTIONS: dict[str, Callable[[], object]] = {
    "Rule methods": lambda: asgi.Rule("/x", methods=True),  # type: ignore[arg-type]
    "Rule scopes": lambda: asgi.Rule("/x", scopes=None),  # type: ignore[arg-type]
    "Rule scopes ": lambda: asgi.Rule("/x", scopes=[[1]]),  # type: ignore[list-item]
    "trusted_proxies": lambda: asgi.client_ip(trusted_proxies=1),  # type: ignore[arg-type]
    "extra_args": lambda: RedisServer(extra_args=None),  # type: ignore[arg-type]
    "seconds": lambda: TimeWindow(0, 10, now=0.0),
    "buckets": lambda: TimeWindow(1.0, 2**64, now=0.0),
    "size": lambda: CountWindow("10"),  # type: ignore[arg-type]
    "seed": lambda: FaultsFixture(seed=[]),  # type: ignore[arg-type]
    "Window end": lambda: chaos.Window(0, True),
}


@pytest.mark.parametrize("name", list(NOT_COLLECTIONS))
def test_wrong_kinds_of_value_are_configuration_errors(name: str) -> None:
    """Values of the wrong kind (a bool for a list, a zero-width window) raised bare
    TypeError or ZeroDivisionError, or were accepted and failed later."""
    with pytest.raises(rs.ConfigurationError, match=f"^{name.strip()}"):
        NOT_COLLECTIONS[name]()
