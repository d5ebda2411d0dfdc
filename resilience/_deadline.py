"""The ambient deadline: how much time the current call has left, across policies.

An outer :class:`Timeout`, a :class:`Retry` with ``deadline=``, the ASGI
``TimeoutMiddleware`` or :func:`deadline` set it in a ContextVar; inner timeouts,
retry sleeps and limiter or bulkhead waits clamp to what is left. Deadlines only ever
shrink: entering a longer one inside a shorter one keeps the shorter one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ._clock import Clock

__all__ = ["Deadline", "current_deadline", "deadline", "time_remaining"]


class Deadline:
    """An absolute point in time (``at``) on a given clock.

    Example::

        d = rs.current_deadline()
        if d is not None and d.remaining() < 0.1:
            return cached()
    """

    # A plain slotted class: entering a deadline is on the hot path of every Timeout,
    # and a frozen dataclass's __init__ costs several times more.
    __slots__ = ("_owner", "at", "clock")

    def __init__(self, at: float, clock: Clock, _owner: object = None) -> None:
        self.at = at
        self.clock = clock
        # The Timeout whose own limit set this deadline (None: rs.deadline, a Retry's
        # deadline, the ASGI middleware), to which an inner Timeout cut here reports;
        # REPORTED once one has.
        self._owner = _owner

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r}, clock={self.clock!r})"

    def remaining(self) -> float:
        """Seconds left until the deadline (negative once it has passed)."""
        return self.at - self.clock.monotonic()


_DEADLINE: ContextVar[Deadline | None] = ContextVar("resilience_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadline of the current context, or ``None`` when there is none.

    Example::

        with rs.deadline(2.0):
            assert rs.current_deadline() is not None
    """
    current = _DEADLINE.get()
    return None if current is None or current.at == math.inf else current


def time_remaining() -> float | None:
    """Seconds left before the ambient deadline, or ``None`` when there is none.

    Example::

        with rs.deadline(2.0):
            left = rs.time_remaining()   # about 2.0
    """
    current = current_deadline()
    return None if current is None else current.remaining()


def clamp(seconds: float) -> float:
    """``seconds`` cut to the time left before the ambient deadline (never below 0)."""
    current = _DEADLINE.get()
    if current is None:
        return seconds
    return max(0.0, min(seconds, current.remaining()))


#: A deadline's owner once a timeout at that deadline has been counted (on the owner).
REPORTED = object()


def push(seconds: float, clock: Clock, owner: object = None) -> tuple[Deadline, object]:
    """Enter a deadline ``seconds`` from now (set by ``owner``, a Timeout, if given);
    returns the deadline in force (an outer, sooner one stays) and a token for
    :func:`pop`."""
    new = Deadline(clock.monotonic() + seconds, clock, owner)
    current = _DEADLINE.get()
    if current is not None and current.remaining() <= seconds:
        new = current
    return new, _DEADLINE.set(new)


def lift(entered: Deadline) -> None:
    """End ``entered`` early, in every context that holds it: from now on it is as if
    there were no deadline (``TimeoutMiddleware`` once the response is complete, so
    work after it, such as background tasks, is not cut; tasks the request started
    hold the same object in their copies of the context)."""
    entered.at = math.inf


def pop(token: object) -> None:
    """Leave the deadline entered by :func:`push`."""
    _DEADLINE.reset(token)  # type: ignore[arg-type]


@contextmanager
def deadline(seconds: float, *, clock: Clock | None = None) -> Iterator[Deadline]:
    """Give the enclosed code at most ``seconds``: inner policies clamp their waits to it.

    The deadline is cooperative: it does not cancel anything by itself. Inner
    :class:`Timeout` policies cut their calls at it, :class:`Retry` will not start a
    sleep that overruns it, and limiter or bulkhead waits give up at it.

    Example::

        with rs.deadline(1.5):
            fetch_with_retries()   # its retries stop before 1.5 s are spent
    """
    from ._validate import check_clock, check_number

    clock = check_clock("clock", clock)
    # NaN would compare false everywhere: a deadline that never clamps nor expires.
    seconds = check_number("seconds", seconds, allow_inf=True)
    entered, token = push(seconds, clock)
    try:
        yield entered
    finally:
        pop(token)
