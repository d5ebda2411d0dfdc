"""Argument checks shared by every policy's constructor.

Each raises :class:`ConfigurationError` naming the argument and the accepted range, so
a bad configuration fails at construction with a message that says how to fix it.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable, Sized
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ConfigurationError

if TYPE_CHECKING:
    from ._clock import Clock

T = TypeVar("T")

_FLOAT_MAX = int(sys.float_info.max)

__all__ = [
    "check_backoff",
    "check_choice",
    "check_clock",
    "check_int",
    "check_number",
    "check_predicate",
    "check_probability",
]


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, shortened; an int too long to print
    (Python refuses past 4,300 digits) as its order of magnitude."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of about 10**{int(abs(value).bit_length() * math.log10(2))}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    allow_none: bool = False,
    allow_inf: bool = False,
) -> Any:
    """Return ``value`` as a float if it is a real number above ``minimum``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {shown(value)}")
    given = value
    if isinstance(value, int) and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
        # an int beyond any float (10**400): infinite, where that is allowed
        value = math.inf if value > 0 else -math.inf
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ConfigurationError(f"{name} must be a finite number, got {shown(given)}")
    if (strict and value <= minimum) or (not strict and value < minimum):
        op = ">" if strict else ">="
        raise ConfigurationError(f"{name} must be {op} {minimum:g}, got {shown(given)}")
    return float(value)


def check_int(
    name: str, value: Any, *, minimum: int = 0, maximum: int | None = None, allow_none: bool = False
) -> Any:
    """Return ``value`` if it is an integer within ``[minimum, maximum]``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {shown(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigurationError(f"{name} must be an integer {bound}, got {shown(value)}")
    return value


def check_probability(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is within ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigurationError(f"{name} must be a number in [0, 1], got {shown(value)}")
    return float(value)


def check_choice(name: str, value: T, choices: tuple[T, ...]) -> T:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigurationError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_callable(name: str, value: Any, *, allow_none: bool = True) -> Callable[..., Any] | None:
    """Return ``value`` if it is callable (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    if not callable(value):
        raise ConfigurationError(f"{name} must be callable, got {value!r}")
    return value  # type: ignore[no-any-return]


def check_key_function(
    name: str, value: Any, *, allow_none: bool = True, gives: str = "the key"
) -> Callable[..., Any] | None:
    """Return ``value`` if it is a plain (synchronous) callable.

    A key (a request's cost, its priority) is computed on every call before anything
    is awaited: an ``async def`` key function would return a new coroutine each time,
    a key of its own, and the policy would silently key nothing (every call its own
    bucket, slot group or breaker).
    """
    fn = check_callable(name, value, allow_none=allow_none)
    if fn is not None:
        from ._policy import is_async_callable, is_generator_function

        try:
            refused = is_async_callable(fn) or is_generator_function(fn)
        except Exception:  # a proxy whose attributes misbehave: not ours to judge
            refused = False
        if refused:
            raise ConfigurationError(
                f"{name} must be a plain function returning {gives}, got {fn!r}: an async "
                f"or generator function gives a new object per call, not {gives}"
            )
    return fn


def check_predicate(
    name: str,
    value: Any,
    *,
    arguments: int = 1,
    allow_none: bool = True,
    gives: str = "its answer",
) -> Callable[..., Any] | None:
    """Return ``value`` if it is a plain (synchronous) callable that takes ``arguments``
    positional arguments (or ``None`` when allowed).

    A predicate's answer is read at once: an ``async def`` one returns a coroutine,
    always truthy, so its answer would be ignored (every request exempt, every error
    retried); a wrong arity would only fail at the first call.
    """
    fn = check_key_function(name, value, allow_none=allow_none, gives=gives)
    if fn is not None and not accepts(fn, (None,) * arguments):
        takes = "no argument" if arguments == 0 else f"{arguments} positional argument"
        plural = "s" if arguments > 1 else ""
        raise ConfigurationError(f"{name} must take {takes}{plural}, got {fn!r}")
    return fn


def accepts(fn: Callable[..., Any], arguments: tuple[Any, ...]) -> bool:
    """Whether ``fn`` can be called with ``arguments``, as far as its signature says.

    Both the signature ``inspect`` reports (which follows ``__wrapped__`` to the
    decorated function) and the wrapper's own are tried: a ``functools.wraps``
    decorator or ``update_wrapper(partial(f, 500), f)`` that supplies an argument
    takes fewer than the function it names. A callable with no signature to read
    (some builtins, proxies) is trusted.
    """
    import inspect

    for follow_wrapped in (True, False):
        try:
            inspect.signature(fn, follow_wrapped=follow_wrapped).bind(*arguments)
        except TypeError:
            continue
        except Exception:  # no signature to read: trust it
            return True
        return True
    return False


def check_clock(name: str, value: Any) -> Clock:
    """Return ``value`` if it can serve as a :class:`~resilience.Clock` (``None``: the
    system clock). Only ``monotonic()`` is required here; a policy that sleeps calls
    ``sleep()`` or ``sleep_async()`` too."""
    if value is None:
        from ._clock import SYSTEM_CLOCK

        return SYSTEM_CLOCK
    if not callable(getattr(value, "monotonic", None)):
        raise ConfigurationError(
            f"{name} must be a resilience Clock (with monotonic(), sleep() and "
            f"sleep_async(), e.g. rs.testing.FakeClock()), got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def check_backoff(value: Any) -> Any:
    """Return ``value`` if it can serve as a backoff schedule (``None``: the default,
    ``full_jitter(0.1, cap=10.0)``): an iterable of delays that every call can iterate
    afresh. A generator or iterator is refused: the first call would use it up and
    later calls would share what is left."""
    if value is None:
        from .backoff import full_jitter

        return full_jitter(0.1, cap=10.0)
    if not isinstance(value, Iterable):
        raise ConfigurationError(
            f"backoff must be an iterable of delays (see resilience.backoff), got {value!r}"
        )
    if isinstance(value, str | bytes):
        raise ConfigurationError(f"backoff must be delays in seconds, not a string: {value!r}")
    if iter(value) is value:
        raise ConfigurationError(
            "backoff must be re-iterable (a list, a tuple or a resilience.backoff "
            f"schedule), not a one-shot iterator or generator: got {value!r}"
        )
    if isinstance(value, Sized) and len(value) == 0:
        raise ConfigurationError(
            "backoff is empty: no retry could ever happen (a finite schedule caps "
            "the attempts; for no retries at all use attempts=1)"
        )
    if isinstance(value, list | tuple):  # known up front: check every delay now
        for delay in value:
            check_number("backoff delay", delay, minimum=0.0)
    return value


#: An HTTP field name or auth scheme (an RFC 9110 token).
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def check_header_name(name: str, value: Any) -> str:
    """``value`` lowered, if it is an HTTP field name (a token); a name no request can
    carry would silently match nothing, and one httpx refuses fails every request."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise ConfigurationError(f"{name} must be an HTTP header name (a token), got {value!r}")
    return value.lower()


def check_name(value: Any, default: str) -> str:
    """``value`` (or ``default`` for ``None``) if it is a str: a policy's name labels its
    events and metrics, where a number or a tuple would break exporters much later."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigurationError(f"name must be a str (or None), got {value!r}")
    if not value.strip():
        # A blank name labels nothing, and shared state keyed by it would be shared by
        # every other policy named blank.
        raise ConfigurationError(f"name must not be blank, got {value!r} (None: the default)")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``: a flag given ``"no"`` or ``0`` is a
    mistake that ``bool()`` would turn into the opposite of what was meant."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value
