"""The invariants every chaos scenario checks, and the helpers to drive calls.

1. **Nothing lost**: every call ends in a result (real or injected), a fallback, or a
   documented error (:data:`DOCUMENTED`); never another exception, never silence.
2. **Nothing hangs**: every call returns within a bound derived from the configured
   timeouts and deadlines (virtual time on FakeClock, real time against Redis).
3. **Recovery**: once the faults clear, calls are served normally again within a bound
   (the breaker's cool-down; the backend's probe interval).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import resilience as rs

#: The errors a resilient call may end with, by the library's contract.
DOCUMENTED: tuple[type[BaseException], ...] = (
    rs.Rejected,
    rs.Timeout,
    rs.InjectedFault,
    rs.BackendError,
)

REAL = "result"
REPLACED = "replaced"
FALLBACK = "fallback"


class Lost(AssertionError):
    """A call ended in neither a result, a fallback nor a documented error."""


def classify_value(value: Any) -> str:
    if value == REAL:
        return REAL
    if value == FALLBACK:
        return FALLBACK
    return REPLACED


def classify_error(exc: BaseException, allowed: tuple[type[BaseException], ...]) -> str:
    if isinstance(exc, allowed):
        return type(exc).__name__
    raise Lost(f"call ended in an undocumented error: {exc!r}") from exc


def run_sync(
    fn: Callable[[], Any],
    now: Callable[[], float],
    allowed: tuple[type[BaseException], ...] = DOCUMENTED,
) -> tuple[str, float]:
    """Call ``fn`` and return ``(outcome, elapsed on now())``; undocumented errors fail."""
    start = now()
    try:
        outcome = classify_value(fn())
    except Exception as exc:
        outcome = classify_error(exc, allowed)
    return outcome, now() - start


async def run_async(
    fn: Callable[[], Awaitable[Any]],
    now: Callable[[], float],
    allowed: tuple[type[BaseException], ...] = DOCUMENTED,
) -> tuple[str, float]:
    """Async twin of :func:`run_sync`."""
    start = now()
    try:
        outcome = classify_value(await fn())
    except Exception as exc:
        outcome = classify_error(exc, allowed)
    return outcome, now() - start


def wall() -> float:
    return time.monotonic()
