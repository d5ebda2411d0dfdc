"""Turning ``on=`` arguments (exception types or a predicate) into one fast test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

__all__ = ["ExceptionFilter", "exception_filter"]

#: What ``on=`` accepts: an exception type, a tuple of them, or a predicate.
ExceptionFilter = (
    type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
)


def exception_filter(
    name: str, on: Any
) -> tuple[tuple[type[BaseException], ...] | None, Callable[[BaseException], bool] | None]:
    """Split ``on`` into ``(types, predicate)``: exactly one of them is not ``None``."""
    if isinstance(on, type) and issubclass(on, BaseException):
        return (on,), None
    if isinstance(on, tuple):
        if not on:
            raise ConfigurationError(f"{name} must name at least one exception type, got ()")
        for item in on:
            if not (isinstance(item, type) and issubclass(item, BaseException)):
                raise ConfigurationError(
                    f"{name} must be exception types or a predicate, got {item!r} in the tuple"
                )
        return on, None
    if callable(on):
        return None, on
    raise ConfigurationError(
        f"{name} must be an exception type, a tuple of them, or a predicate, got {on!r}"
    )


def may_match(types: tuple[type[BaseException], ...] | None, target: type[BaseException]) -> bool:
    """Whether the filter can catch ``target`` (or a subclass of it); predicates may."""
    if types is None:
        return True
    return any(issubclass(target, t) or issubclass(t, target) for t in types)
