"""Fallback: a degraded result instead of an error."""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Never, ParamSpec, TypeVar, overload

from ._clock import Clock
from ._events import FallbackUsed
from ._matching import ExceptionFilter, ExceptionMatcher
from ._policy import PolicyBase, decorate, is_async_callable, refuse_async, refuse_generator_async
from ._timeout import Timeout
from ._validate import check_clock
from .errors import Rejected

__all__ = ["Fallback", "FallbackStatistics"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class FallbackStatistics:
    """How many calls a :class:`Fallback` answered with its degraded result.

    Example: ``fallback.statistics().used``
    """

    used: int


class Fallback(PolicyBase, Generic[R]):
    """Return a degraded result when the call fails with one of the ``on`` errors.

    ``value_or_callable`` is either the value to return, or a callable that receives
    the exception (or takes no argument) and returns it. For ``async def`` functions
    the callable may be ``async`` too; it is awaited. A plain value that happens to be
    callable must be wrapped: ``Fallback(lambda: my_function)``.

    ``on`` defaults to ``(Rejected, Timeout)``: the call was refused by a limiter, a
    bulkhead or an open breaker, or ran out of time. Pass exception types or a
    predicate to widen it. Errors not matched propagate unchanged.

    ``clock=`` is accepted like on every policy and checked; a fallback reads no time.

    Typed: ``Fallback[R]`` turns a function returning ``T`` into one returning
    ``T | R`` (``R`` is the value's type, or what the callable returns or its
    coroutine gives; a handler may type its argument as narrowly as ``on`` allows,
    ``def degraded(exc: rs.RateLimited) -> str``). Inside a :class:`Pipeline` the
    return type stays ``T``.

    Example::

        @rs.Fallback(lambda exc: {"summary": None, "degraded": True})
        @rs.CircuitBreaker()
        async def summarize(text: str) -> dict: ...
    """

    @overload
    def __init__(
        self: Fallback[R],
        value_or_callable: Callable[[Never], Awaitable[R]],
        *,
        on: ExceptionFilter = ...,
        clock: Clock | None = ...,
        name: str | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Fallback[R],
        value_or_callable: Callable[[], Awaitable[R]],
        *,
        on: ExceptionFilter = ...,
        clock: Clock | None = ...,
        name: str | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Fallback[R],
        value_or_callable: Callable[[Never], R],
        *,
        on: ExceptionFilter = ...,
        clock: Clock | None = ...,
        name: str | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Fallback[R],
        value_or_callable: Callable[[], R],
        *,
        on: ExceptionFilter = ...,
        clock: Clock | None = ...,
        name: str | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: Fallback[R],
        value_or_callable: R,
        *,
        on: ExceptionFilter = ...,
        clock: Clock | None = ...,
        name: str | None = ...,
    ) -> None: ...
    def __init__(
        self,
        value_or_callable: Any,
        *,
        on: ExceptionFilter = (Rejected, Timeout),
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self._clock: Clock = check_clock("clock", clock)
        self._matches = ExceptionMatcher("on", on, exceptions_only=True)
        self._callable = callable(value_or_callable)
        self._value = value_or_callable
        self._takes_error = self._callable and _accepts_argument(value_or_callable)
        #: An ``async def`` fallback: it can answer async calls only.
        self._async_only = self._callable and is_async_callable(value_or_callable)
        self._used = 0

    def __repr__(self) -> str:
        value = self._value
        if callable(value):
            gives = f"from {getattr(value, '__qualname__', None) or type(value).__name__}"
        else:
            gives = reprlib.repr(value)
        return f"<Fallback {self.name!r} on={self._matches.describe()} returns {gives}>"

    def _absorbs(self, error: type[BaseException]) -> bool:
        """Whether every ``error`` (a Rejected type) is answered with the degraded
        result: the ``on=`` types cover it (a predicate may not). Pipeline's checks."""
        types = self._matches.types
        return types is not None and any(issubclass(error, t) for t in types)

    def _degraded(self, exc: Exception) -> Any:
        self._used += 1
        if self._observed:
            self._emit(FallbackUsed(policy=self.name, exception=exc))
        if not self._callable:
            return self._value
        return self._value(exc) if self._takes_error else self._value()

    @overload  # type: ignore[override]  # the fallback widens the return type: T | R
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, T | R]]: ...
    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T | R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate ``fn``: its return type becomes ``T | R``.

        Example::

            @rs.Fallback(None)
            def lookup(key: str) -> int: ...   # now (key: str) -> int | None
        """
        return decorate(self, fn)

    def call(  # type: ignore[override]  # T | R, see __call__
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T | R:
        """Run ``fn(*args, **kwargs)``; on a matching error return the fallback."""
        refuse_async(self, fn)
        self._refuse_sync()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            return self._degraded_sync(exc)  # type: ignore[no-any-return]

    async def call_async(  # type: ignore[override]  # T | R, see __call__
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T | R:
        """Run ``await fn(*args, **kwargs)``; on a matching error return the fallback."""
        refuse_generator_async(fn)
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            return await self._degraded_async(exc)  # type: ignore[no-any-return]

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any] | None:
        """The decorator body: one ``try`` around the call (see ``decorate``)."""
        matches = self._matches
        if is_async:
            degraded_async = self._degraded_async

            async def fallback_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    if not matches(exc):
                        raise
                    return await degraded_async(exc)

            return fallback_async
        self._refuse_sync()
        degraded = self._degraded_sync

        def fallback_sync(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not matches(exc):
                    raise
                return degraded(exc)

        return fallback_sync

    async def _degraded_async(self, exc: Exception) -> Any:
        result = self._degraded(exc)
        if inspect.isawaitable(result):
            result = await result
        return result

    def _refuse_sync(self) -> None:
        """An async fallback for a sync function fails when it is set up, not first in
        the outage it was meant for."""
        if self._async_only:
            raise TypeError(
                f"{self!r} is async and cannot serve a sync function; give a sync "
                "callable (or decorate an async def function)"
            )

    def _degraded_sync(self, exc: Exception) -> Any:
        result = self._degraded(exc)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise TypeError(
                "an async fallback cannot serve a sync function; give a sync callable"
            ) from exc
        return result

    def statistics(self) -> FallbackStatistics:
        """How many times the fallback was used.

        Example: ``assert fallback.statistics().used == 1``
        """
        return FallbackStatistics(self._used)


def _accepts_argument(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is called with the exception.

    A class is a factory (``rs.Fallback(list)`` answers ``[]``): it gets the exception
    only if it requires a positional argument. Builtin classes without a signature
    (``dict``) are factories too.
    """
    factory = isinstance(fn, type)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return not factory
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL,):
            return not factory
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            return not factory or parameter.default is parameter.empty
    return False
