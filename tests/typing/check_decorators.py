"""Static typing of the public API, checked by ``mypy --strict`` (``make typecheck``).

Nothing here runs under pytest: it proves that decorating keeps signatures
(``ParamSpec``) and return types, sync and async, functions and methods.
"""

from __future__ import annotations

from typing import assert_type

import resilience as rs

retry = rs.Retry(on=ConnectionError, attempts=3)
timeout = rs.Timeout(1.0)
fallback = rs.Fallback("n/a")
pipeline = rs.Pipeline(fallback, retry, timeout)


@retry
def fetch(url: str, *, attempts_hint: int = 0) -> bytes:
    return url.encode()


@timeout
async def fetch_async(url: str) -> bytes:
    return url.encode()


@pipeline
async def summarize(text: str, segments: int = 5) -> str:
    return text[:segments]


class Client:
    @retry
    def get(self, path: str) -> int:
        return len(path)

    @retry
    @classmethod
    def build(cls, name: str) -> Client:
        return cls()

    @retry
    @staticmethod
    def parse(raw: bytes) -> str:
        return raw.decode()


async def use() -> None:
    assert_type(fetch("u"), bytes)
    assert_type(fetch("u", attempts_hint=2), bytes)
    assert_type(await fetch_async("u"), bytes)
    assert_type(await summarize("text", segments=3), str)
    assert_type(Client().get("/"), int)
    assert_type(Client.build("x"), Client)
    assert_type(Client.parse(b"x"), str)
    assert_type(pipeline.call(len, "abc"), int)
    with rs.deadline(1.0) as d:
        assert_type(d, rs.Deadline)
    stats = retry.statistics()
    assert_type(stats.retries, int)


@rs.Fallback(None)
def lookup(key: str) -> int:
    return len(key)


async def answer_later(exc: Exception) -> str:
    return "later"


@rs.Fallback(answer_later)
async def count(text: str) -> int:
    return len(text)


def busy(exc: rs.RateLimited) -> str:
    return f"busy, retry in {exc.retry_after}"


async def busy_later(exc: rs.Rejected) -> bytes:
    return b"busy"


@rs.Fallback(busy, on=rs.RateLimited)
def limited(key: str) -> int:
    return len(key)


@rs.Fallback(busy_later)
async def limited_later(key: str) -> int:
    return len(key)


async def fallbacks_widen_the_return_type() -> None:
    # A handler typed for the errors it is given (narrower than Exception) is a
    # handler, not a value (it was typed as returning itself).
    assert_type(limited("k"), int | str)
    assert_type(await limited_later("k"), int | bytes)
    # The degraded value is part of what the caller gets: T | R.
    assert_type(lookup("k"), int | None)
    assert_type(await count("t"), int | str)
    assert_type(rs.Fallback(-1).call(len, "abc"), int)
    assert_type(rs.Fallback(b"").call(str, 1), str | bytes)
    # rs.decorate(Fallback, fn) widens as the decorator does (it used to keep T).
    assert_type(rs.decorate(rs.Fallback(0), str)(1), str | int)
    assert_type(await rs.decorate(rs.Fallback("n/a"), count)("t"), int | str)
    assert_type(rs.decorate(rs.Retry(on=OSError), str)(1), str)
    # DESIGN.md: Rejected(retry_after: float | None), positionally too.
    assert_type(rs.RateLimited(None).retry_after, float | None)


def misuse() -> None:
    fetch(1)  # type: ignore[arg-type]
    fetch("u", unknown=1)  # type: ignore[call-arg]


async def timeout_block_returns() -> int:
    # __aexit__ returns None: the checker knows the block's exceptions are never
    # swallowed, so a return inside it ends the function (no "missing return").
    async with rs.Timeout(1.0):
        return 1


async def timeout_block_binds() -> str:
    async with rs.Timeout(1.0):
        value = "bound"
    return value


def build_with(clock: rs.Clock | None = None) -> list[object]:
    """Every policy takes ``clock=None`` (the system clock), so one optional clock
    parameter can be passed through to all of them."""
    return [
        rs.Retry(on=OSError, clock=clock),
        rs.Timeout(1.0, clock=clock),
        rs.RetryBudget(clock=clock),
        rs.RateLimiter("1/s", clock=clock),
        rs.Bulkhead(1, clock=clock),
        rs.CircuitBreaker(clock=clock),
        rs.Fallback(None, clock=clock),
        rs.Faults(error_rate=0.1, clock=clock),
    ]
