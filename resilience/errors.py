"""The exceptions raised by resilience.

The tree::

    Exception
    ├── ResilienceError                 base of everything raised here
    │   ├── Rejected(retry_after)       the call was not attempted
    │   │   ├── RateLimited             a rate limiter refused it
    │   │   ├── CircuitOpen             an open circuit breaker refused it
    │   │   └── BulkheadFull            no concurrency slot was free in time
    │   ├── Timeout                     the call ran out of time (also a TimeoutError)
    │   ├── BackendError                a shared-state backend failed (its error is __cause__)
    │   ├── InjectedFault               raised on purpose by fault injection (chaos)
    │   └── ConfigurationError          bad arguments at construction (also a ValueError)
    └── TimeoutError (builtin)
        └── Timeout

``Retry`` does not wrap errors: when attempts or the deadline run out it re-raises the
last exception the call raised. ``Timeout`` is defined in :mod:`resilience._timeout`
because it is both the policy and the exception it raises (``except rs.Timeout``
catches what ``@rs.Timeout(1)`` raises); it is re-exported here.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BulkheadFull",
    "CircuitOpen",
    "ConfigurationError",
    "InjectedFault",
    "RateLimited",
    "Rejected",
    "ResilienceError",
    "Timeout",
]


class ResilienceError(Exception):
    """Base class of every exception raised by resilience.

    Example::

        try:
            fetch(url)
        except rs.ResilienceError as exc:
            log.warning("degraded: %s", exc)
    """


class Rejected(ResilienceError):
    """The call was refused before it started, so it had no side effects.

    ``retry_after`` is the number of seconds after which the same call may be admitted,
    or ``None`` when unknown; it may also be passed alone, positionally
    (``rs.RateLimited(2.0)``). :class:`resilience.Retry` waits at least that long before
    retrying a rejected call.

    Example::

        try:
            limited()
        except rs.Rejected as exc:
            print("come back in", exc.retry_after)
    """

    def __init__(
        self, message: str | float | None = "", *, retry_after: float | None = None
    ) -> None:
        if isinstance(message, int | float) and not isinstance(message, bool):
            # rs.RateLimited(2.0): a lone number is the retry_after, not a message.
            if retry_after is not None:
                raise TypeError("retry_after given both positionally and by keyword")
            message, retry_after = "", float(message)
        super().__init__(message or self._default_message(retry_after))
        self.retry_after = retry_after

    def _default_message(self, retry_after: float | None) -> str:
        name = type(self).__name__
        if retry_after is None:
            return f"{name}: call rejected"
        return f"{name}: call rejected, retry after {retry_after:.3f}s"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restored, (type(self), self.args), self.__dict__)


def _restored(cls: type[BaseException], args: tuple[object, ...]) -> BaseException:
    """An exception as pickle or copy rebuilds it: its args, without running its
    ``__init__`` (a subclass's own would take the message for its own arguments), its
    attributes (``retry_after``, notes, a subclass's own) restored by pickle as state."""
    error = cls.__new__(cls, *args)
    error.args = args
    return error


class RateLimited(Rejected):
    """A rate limiter refused the call; ``retry_after`` says when a token will be free.

    Example::

        try:
            limiter.try_acquire(key="alice").raise_for_refusal()
        except rs.RateLimited as exc:
            response.headers["Retry-After"] = str(math.ceil(exc.retry_after or 1))
    """


class CircuitOpen(Rejected):
    """An open circuit breaker refused the call; ``retry_after`` is the time to half-open.

    Example::

        @rs.CircuitBreaker(fallback=lambda exc: "cached answer")
        def ask(): ...
    """


class BulkheadFull(Rejected):
    """No concurrency slot became free within ``max_wait``.

    Example::

        try:
            with bulkhead:
                download()
        except rs.BulkheadFull:
            return 503
    """


class BackendError(ResilienceError):
    """A shared-state backend (Redis) failed or was too slow.

    The backend's own exception is attached as ``__cause__``. Raised only where a
    policy's ``on_backend_error`` is ``"closed"``; the other modes degrade instead.

    Example::

        limiter = rs.RateLimiter("10/s", backend=redis, on_backend_error="closed")
        try:
            limiter.try_acquire(key="k")
        except rs.BackendError as exc:
            print("redis is down:", exc.__cause__)
    """


class InjectedFault(ResilienceError):
    """Raised on purpose by fault injection (:class:`resilience.Faults`).

    Example::

        faults = rs.Faults(error_rate=0.1, seed=1)   # raises InjectedFault 10% of the time
    """


class ConfigurationError(ResilienceError, ValueError):
    """A policy was built with bad arguments; the message names the argument and its range.

    Raised at construction, never at call time. Also a :class:`ValueError`.

    Example::

        >>> rs.Retry(on=OSError, attempts=0)
        Traceback (most recent call last):
        resilience.errors.ConfigurationError: attempts must be an integer >= 1, got 0
    """


# Timeout is the policy and its exception at once; it lives with the policy. Imported
# last, once every class it needs from this module exists.
from ._timeout import Timeout  # noqa: E402
