"""The pure GCRA core: a token bucket as one integer, the theoretical arrival time.

GCRA (the generic cell rate algorithm) is an exact token bucket that stores a single
number per key, the *theoretical arrival time* ``tat``: the time at which the bucket
will be full again. With emission interval ``E`` (time per token) and tolerance
``T = burst * E``, a request of ``cost`` tokens at time ``now`` is conforming when::

    max(tat, now) + cost * E - T <= now

and then ``tat`` becomes ``max(tat, now) + cost * E``. An absent key (``tat <= now``)
is a full bucket, which is why expired or evicted state never over-admits.

**Integer time.** Times are integer *ticks* of ``1 / amount`` microseconds, so the
emission interval of ``amount`` tokens per ``period_us`` microseconds is exactly
``period_us`` ticks: no rounding, even for ``"3/s"``. Nothing here reads a clock or
does I/O: callers pass ``now`` in ticks (see :meth:`GCRA.ticks`).

**Reservation.** With ``max_wait > 0`` a request that conforms within ``max_wait``
books its slot now and learns the exact ``wait``: no polling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from ..errors import ConfigurationError, RateLimited
from ._rate import Rate

__all__ = ["GCRA", "CostAboveBurst", "Decision", "make_decision"]


class Decision(NamedTuple):
    """What a rate limiter decided; immutable. Truthy when the request was admitted.

    * ``allowed``: the tokens were taken (or, for a reservation, booked).
    * ``remaining``: whole tokens still available right after this decision.
    * ``retry_after``: seconds until the same request could be admitted (0 if allowed).
    * ``reset_after``: seconds until the bucket is full again.
    * ``limit``: the burst, the most tokens the bucket holds.
    * ``wait``: for an admitted *reservation*, the seconds the caller must wait before
      acting (``acquire()`` already waited it); 0 otherwise.

    Example::

        d = limiter.try_acquire(key="alice")
        if not d:
            return Response(status_code=429, headers={"Retry-After": str(math.ceil(d.retry_after))})
    """

    allowed: bool
    remaining: int
    retry_after: float
    reset_after: float
    limit: int
    wait: float = 0.0

    def __bool__(self) -> bool:
        return self.allowed

    def raise_for_refusal(self) -> Decision:
        """Raise :class:`~resilience.RateLimited` if refused; return ``self`` otherwise.

        Example: ``limiter.try_acquire(key="alice").raise_for_refusal()``
        """
        if not self.allowed:
            raise RateLimited(retry_after=self.retry_after)
        return self


def _make_decision_factory() -> Callable[[tuple[bool, int, float, float, int, float]], Decision]:
    return functools.partial(tuple.__new__, Decision)


#: ``make_decision((allowed, remaining, retry_after, reset_after, limit, wait))``: builds a
#: :class:`Decision` without the Python-level ``NamedTuple.__new__`` (hot paths).
make_decision = _make_decision_factory()


class CostAboveBurst(ConfigurationError):
    """A valid cost that the burst can never cover (not a malformed one): a request
    whose own cost is that high can only ever be refused."""


class GCRA:
    """The parameters of a GCRA bucket and its pure transition function.

    Example::

        gcra = GCRA(Rate(10, 1.0), burst=10)
        now = gcra.ticks(0.0)
        allowed, tat, wait = gcra.take(tat=0, now=now, cost=1, max_wait=0)
        decision = gcra.decision(allowed, tat, wait, now)
        assert decision.allowed and decision.remaining == 9
    """

    __slots__ = ("_ticks_per_s", "burst", "denominator", "emission", "rate", "tolerance")

    def __init__(self, rate: Rate, burst: int) -> None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigurationError(f"burst must be an integer >= 1, got {burst!r}")
        self.rate = rate
        self.burst = burst
        #: Ticks per microsecond.
        self.denominator = rate.amount
        #: Ticks per token (exact).
        self.emission = rate.period_us
        #: Ticks of credit a full bucket holds.
        self.tolerance = burst * rate.period_us
        self._ticks_per_s = rate.amount * 1_000_000

    def ticks(self, seconds: float) -> int:
        """``seconds`` (a clock reading or a duration) in whole-microsecond ticks."""
        return round(seconds * 1_000_000) * self.denominator

    def seconds(self, ticks: int) -> float:
        """``ticks`` as seconds, rounded *up* to the microsecond (a safe wait)."""
        return -(-ticks // self.denominator) / 1_000_000

    def check_cost(self, cost: int) -> None:
        """Raise :class:`ConfigurationError` unless ``0 <= cost <= burst``.

        A cost above the burst could never be admitted; refusing it at once is better
        than a caller that waits forever.
        """
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
            raise ConfigurationError(f"cost must be an integer >= 0, got {cost!r}")
        if cost > self.burst:
            raise CostAboveBurst(
                f"cost {cost} exceeds the burst {self.burst}: it can never be admitted"
            )

    def take(self, tat: int, now: int, cost: int, max_wait: int) -> tuple[bool, int, int]:
        """One decision: ``(allowed, tat_after, wait)`` for ``cost`` tokens at ``now``.

        ``tat`` is the stored theoretical arrival time (any value ``<= now``, e.g. 0,
        means a full bucket). ``wait`` is how many ticks from ``now`` the request
        conforms (``<= 0``: now). It is admitted when ``wait <= max_wait``; then
        ``tat_after`` is the new state to store. Refused, ``tat_after`` is the
        unchanged state (at least ``now``). Cost 0 peeks.
        """
        if tat < now:
            tat = now
        new_tat = tat + cost * self.emission
        wait = new_tat - self.tolerance - now
        if wait > max_wait:
            return False, tat, wait
        return True, new_tat, wait

    def admitted_state(self, fill: int) -> tuple[int, float]:
        """``(remaining, reset_after)`` of an admission whose bucket is ``fill`` ticks from full.

        ``fill`` is ``tat_after - now``; the values equal the admitted :class:`Decision`'s
        (for callers that need the two numbers without building a Decision).
        """
        return (self.tolerance - fill) // self.emission, fill / self._ticks_per_s

    def decision(self, allowed: bool, tat: int, wait: int, now: int) -> Decision:
        """The :class:`Decision` for the outcome ``(allowed, tat, wait)`` of :meth:`take`."""
        remaining = (now + self.tolerance - tat) // self.emission
        if remaining < 0:
            remaining = 0
        if allowed:
            return make_decision(
                (
                    True,
                    remaining,
                    0.0,
                    (tat - now) / self._ticks_per_s,
                    self.burst,
                    self.seconds(wait) if wait > 0 else 0.0,
                )
            )
        return make_decision(
            (False, remaining, self.seconds(wait), (tat - now) / self._ticks_per_s, self.burst, 0.0)
        )

    def __repr__(self) -> str:
        return f"GCRA(rate={self.rate!r}, burst={self.burst})"
