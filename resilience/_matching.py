"""Turning ``on=`` arguments (exception types or a predicate) into one fast test."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from ._validate import accepts, check_key_function
from .errors import ConfigurationError

__all__ = ["ExceptionFilter", "ExceptionMatcher", "exception_filter"]

#: What ``on=`` accepts: an exception type, a tuple (list, set) of them, or a predicate
#: (called with :class:`Exception` instances only: cancellation and ``KeyboardInterrupt``
#: are never retried, caught or recorded). The collections are the read-only, covariant
#: ABCs, so a ``TRANSIENT = [ConnectionError, TimeoutError]`` (a ``list[type[OSError]]``
#: to a type checker) is accepted like the literal.
ExceptionFilter = (
    type[BaseException]
    | Sequence[type[BaseException]]
    | AbstractSet[type[BaseException]]
    | Callable[[Exception], bool]
)


def _passes_through(kind: type[BaseException]) -> bool:
    """Whether no exception a policy handles (an :class:`Exception`) is a ``kind``:
    ``KeyboardInterrupt``, cancellation (asyncio's, trio's), a flow-control
    ``BaseException`` of the user's. ``BaseException``, ``BaseExceptionGroup`` (an
    ``ExceptionGroup`` is an ``Exception``) and a base with ``Exception`` subclasses
    catch some."""
    if issubclass(kind, Exception) or issubclass(ExceptionGroup, kind):
        return False
    # A mixin base (class Transient(AppSignal, Exception)): its Exception subclasses
    # reach the policy. Those defined so far are looked for.
    todo, seen = [kind], {kind}
    while todo:
        for sub in todo.pop().__subclasses__():
            if issubclass(sub, Exception):
                return False
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return True


def _never_seen(name: str, kind: type[BaseException]) -> ConfigurationError:
    return ConfigurationError(
        f"{name}: {kind.__name__} is not an Exception subclass, so it never reaches this "
        "policy (cancellation, KeyboardInterrupt and SystemExit always pass through)"
    )


def exception_filter(
    name: str, on: Any, *, exceptions_only: bool = False
) -> tuple[tuple[type[BaseException], ...] | None, Callable[[BaseException], bool] | None]:
    """Split ``on`` into ``(types, predicate)``: exactly one of them is not ``None``.

    ``exceptions_only``: the policy handles :class:`Exception` instances only, so the
    types no such instance can be (``KeyboardInterrupt``, ``SystemExit``, cancellation,
    other ``BaseException`` subclasses) are refused as a mistake.
    """
    if isinstance(on, type):
        if issubclass(on, BaseException):
            if exceptions_only and _passes_through(on):
                raise _never_seen(name, on)
            return (on,), None
        raise ConfigurationError(
            f"{name} must be exception types or a predicate, got the class {on!r}, "
            "which is not an exception"
        )
    if isinstance(on, Sequence | AbstractSet) and not isinstance(on, str | bytes | bytearray):
        if not on:
            raise ConfigurationError(f"{name} must name at least one exception type, got {on!r}")
        for item in on:
            if not (isinstance(item, type) and issubclass(item, BaseException)):
                raise ConfigurationError(
                    f"{name} must be exception types or a predicate, got {item!r} in {on!r}"
                )
            if exceptions_only and _passes_through(item):
                raise _never_seen(name, item)
        return tuple(on), None
    if callable(on):
        # An async predicate's coroutine is always truthy: every error would match.
        check_key_function(name, on, gives="its answer")
        if not accepts(on, (BaseException(),)):
            raise ConfigurationError(
                f"{name}: a predicate must take the exception as its one argument, got {on!r}"
            )
        return None, on
    raise ConfigurationError(
        f"{name} must be an exception type, a tuple of them, or a predicate, got {on!r}"
    )


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def awaited_a_sync_call(exc: BaseException) -> bool:
    """Whether ``exc`` is the ``TypeError`` of a policy's own ``await`` on what a sync
    function returned (``await policy.call_async(sync_fn)``): a bug in the caller, not
    a failure of the dependency, so policies neither retry it, count it against a
    breaker, nor answer it with a fallback. Only exception paths call this.
    """
    if exc.__class__ is not TypeError:
        return False
    message = str(exc)
    if "can't be used in 'await' expression" not in message and "can't be awaited" not in message:
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_PACKAGE)


class ExceptionMatcher:
    """One ``on=`` argument, validated once: ``matcher(exc)`` tells whether it applies.

    ``types`` holds the exception types when ``on`` named types (``None`` for a
    predicate), for checks made at construction such as :meth:`may_match`.
    """

    __slots__ = ("predicate", "types")

    def __init__(self, name: str, on: Any, *, exceptions_only: bool = False) -> None:
        self.types, self.predicate = exception_filter(name, on, exceptions_only=exceptions_only)

    def __call__(self, exc: BaseException) -> bool:
        if self.types is not None:
            matched = isinstance(exc, self.types)
        else:
            assert self.predicate is not None
            matched = bool(self.predicate(exc))
        return matched and not awaited_a_sync_call(exc)

    def may_match(self, target: type[BaseException]) -> bool:
        """Whether this can match ``target`` (or a subclass of it); a predicate may."""
        return may_match(self.types, target)

    def describe(self) -> str:
        """What ``on`` names, for reprs: ``(ConnectionError, TimeoutError)`` or
        ``a predicate``."""
        if self.types is None:
            return "a predicate"
        return "(" + ", ".join(t.__name__ for t in self.types) + ")"


def may_match(types: tuple[type[BaseException], ...] | None, target: type[BaseException]) -> bool:
    """Whether the filter can catch ``target`` (or a subclass of it); predicates may."""
    if types is None:
        return True
    return any(issubclass(target, t) or issubclass(t, target) for t in types)
