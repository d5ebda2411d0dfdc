"""Fallback: degraded results for the errors it is told to absorb."""

from __future__ import annotations

import pytest

import resilience as rs


def test_value_replaces_rejection() -> None:
    """The default on= covers Rejected errors."""

    @rs.Fallback("cached")
    def refused() -> str:
        raise rs.CircuitOpen(retry_after=3)

    assert refused() == "cached"


def test_callable_receives_the_exception() -> None:
    """A one-argument callable gets the error that triggered it."""

    @rs.Fallback(lambda exc: f"degraded: {type(exc).__name__}")
    def slow() -> str:
        raise rs.Timeout(1)

    assert slow() == "degraded: Timeout"


def test_zero_argument_callable() -> None:
    """A callable taking nothing is called without the error."""
    assert rs.Fallback(lambda: 0)(lambda: (_ for _ in ()).throw(rs.BulkheadFull()))() == 0


def test_unmatched_errors_propagate() -> None:
    """Errors outside on= are not absorbed."""

    @rs.Fallback("x")
    def broken() -> str:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        broken()


def test_on_accepts_types_and_predicates() -> None:
    """on= widens or narrows what is absorbed."""
    assert rs.Fallback(1, on=KeyError)(lambda: {}["k"])() == 1
    assert (
        rs.Fallback(2, on=lambda e: "transient" in str(e))(
            lambda: (_ for _ in ()).throw(OSError("transient"))
        )()
        == 2
    )


def test_emits_fallback_used_and_counts() -> None:
    """FallbackUsed carries the exception; statistics count uses."""
    fallback = rs.Fallback(None)
    events: list[rs.Event] = []
    fallback.add_listener(events.append)
    error = rs.RateLimited(retry_after=1)

    def refused() -> None:
        raise error

    fallback(refused)()
    assert events == [rs.FallbackUsed(policy="Fallback", exception=error)]
    assert fallback.statistics().used == 1


@pytest.mark.anyio
async def test_async_callable_is_awaited() -> None:
    """For async functions the fallback may be async too."""

    async def degraded(exc: BaseException) -> str:
        return "cheap model"

    @rs.Fallback(degraded)
    async def strong_model() -> str:
        raise rs.CircuitOpen()

    assert await strong_model() == "cheap model"


def test_async_fallback_for_sync_function_is_an_error_when_set_up() -> None:
    """An async fallback cannot answer a sync call; the error comes when the function is
    decorated or called, not first in the outage the fallback was meant for (the call
    succeeded until the dependency failed)."""

    async def degraded() -> str:
        return "x"

    ran: list[str] = []

    def works() -> str:
        ran.append("works")
        return "fresh"

    with pytest.raises(TypeError, match="is async and cannot serve a sync function"):
        rs.Fallback(degraded)(works)
    with pytest.raises(TypeError, match="is async and cannot serve a sync function"):
        rs.Fallback(degraded).call(works)
    with pytest.raises(TypeError, match="is async and cannot serve a sync function"):
        rs.CircuitBreaker(fallback=degraded)(works)
    with pytest.raises(TypeError, match="is async and cannot serve a sync function"):
        rs.CircuitBreaker(fallback=degraded).call(works)
    with pytest.raises(TypeError, match="is async and cannot serve a sync function"):
        rs.Pipeline(rs.Fallback(degraded), rs.Retry(on=OSError))(works)
    assert ran == []


@pytest.mark.anyio
async def test_async_fallback_serves_async_functions_and_methods() -> None:
    """The same fallbacks are fine on async functions, static methods included."""

    async def degraded() -> str:
        return "x"

    class Client:
        @rs.CircuitBreaker(fallback=degraded)
        @staticmethod
        async def fetch() -> str:
            raise rs.CircuitOpen()

    @rs.Fallback(degraded)
    async def fetch() -> str:
        raise rs.CircuitOpen()

    assert await fetch() == "x"
    assert await Client.fetch() == "x"


@pytest.mark.parametrize(("factory", "expected"), [(dict, {}), (list, []), (set, set())])
def test_a_class_is_a_factory(factory: type, expected: object) -> None:
    """``rs.Fallback(list)`` answers ``[]``: a class without a required argument is called
    with none (``dict`` has no signature and was called with the exception: TypeError)."""

    def down() -> object:
        raise rs.CircuitOpen("down")

    assert rs.Fallback(factory)(down)() == expected
