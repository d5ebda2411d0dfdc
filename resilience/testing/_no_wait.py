"""Scoped switch that makes retry sleeps zero, for tests of code that uses Retry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["NO_WAIT", "no_wait"]

NO_WAIT: ContextVar[bool] = ContextVar("resilience_no_wait", default=False)


@contextmanager
def no_wait() -> Iterator[None]:
    """Inside this block, :class:`resilience.Retry` sleeps for zero seconds.

    Scoped by a ContextVar, not a global: other threads and tasks keep their delays.
    Attempts, budgets and events are unchanged; only the waiting is skipped. A skipped
    sleep still counts against the deadlines that retry run sees (its own ``deadline=``
    and the ambient one) as if it had been waited, so a deadline-bounded retry makes the
    same attempts as without ``no_wait()``. Other code does not see that skipped time:
    an outer retry, or a second call under the same ``rs.deadline()``, reads the clock.

    Example::

        with resilience.testing.no_wait():
            assert flaky_download() == b"ok"   # three attempts, no waiting
    """
    token = NO_WAIT.set(True)
    try:
        yield
    finally:
        NO_WAIT.reset(token)
