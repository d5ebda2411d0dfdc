"""What a bulkhead tells the world beyond the shared events, and the error of a lost lease."""

from __future__ import annotations

from dataclasses import dataclass

from .._events import Event
from ..errors import ResilienceError, _restored

__all__ = ["BulkheadLeaseLost", "LeaseLost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkheadLeaseLost(Event):
    """A distributed bulkhead lease expired or was taken away while its holder still ran.

    ``reason`` is ``"expired"`` (Redis no longer had the lease at renewal) or
    ``"unreachable"`` (no renewal succeeded before the lease ran out). From that moment
    another holder may use the slot, so the limit may be exceeded by this call.

    Example::

        bulkhead.add_listener(
            lambda e: isinstance(e, rs.BulkheadLeaseLost) and log.warning("lost %s", e.key)
        )
    """

    reason: str


class LeaseLost(ResilienceError):
    """Raised by ``Permit.release()`` when the permit's Redis lease was lost while held.

    The call itself already ran (it is not rejected); this tells the holder that for
    part of its run the distributed limit did not count it. Raised at most once per
    permit, and only when the ``with`` body did not raise an error of its own.

    Example::

        try:
            with bulkhead.acquire(key="example.com"):
                download()
        except rs.LeaseLost:
            metrics.incr("bulkhead.lease_lost")
    """

    def __init__(self, message: str = "", *, key: str | None = None, reason: str = "") -> None:
        super().__init__(message or f"bulkhead lease lost ({reason or 'unknown'}) for {key!r}")
        self.key = key
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (_restored, (type(self), self.args), self.__dict__)
