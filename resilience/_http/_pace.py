"""Per-host pacing from server signals: a "not before" time and a remaining quota.

A pure state machine: it takes ``now`` and returns decisions; it reads no clock and
does no I/O. The transport keeps one per host and holds a lock around its calls.
"""

from __future__ import annotations

import math

from ._signals import Signals

__all__ = ["Pace"]

_NEVER = -math.inf


class Pace:
    """What one host told us: do not send before ``not_before``; ``remaining`` sends until
    ``reset_at`` (``None``: no advertised quota).

    ``active`` is ``False`` when nothing constrains the host, so the admitted path of a
    quiet host reads one attribute and no clock.

    Example::

        pace = Pace()
        pace.observe(0.0, Signals(quota=Quota(0, 5.0)), retry_after_applies=False)
        assert pace.admit(1.0) == 4.0      # paused until the quota resets
        assert pace.admit(5.0) == 0.0
    """

    __slots__ = ("active", "not_before", "remaining", "reset_at")

    def __init__(self) -> None:
        self.active = False
        self.not_before = _NEVER
        self.remaining: int | None = None
        self.reset_at = _NEVER

    def admit(self, now: float) -> float:
        """``0.0``: send now (one quota unit is taken); otherwise seconds to wait first."""
        if now < self.not_before:
            return self.not_before - now
        remaining = self.remaining
        if remaining is not None:
            if now >= self.reset_at:
                self.remaining = None
            elif remaining > 0:
                self.remaining = remaining - 1
            else:
                return self.reset_at - now
        if self.remaining is None:
            self.active = False
        return 0.0

    def delay(self, now: float) -> float:
        """Seconds until a send could be admitted, without taking anything."""
        wait = self.not_before - now
        if self.remaining == 0 and self.reset_at - now > wait:
            wait = self.reset_at - now
        return max(wait, 0.0)

    def observe(self, now: float, signals: Signals, *, retry_after_applies: bool) -> float:
        """Take in a response's signals; returns the pause it starts (0.0 if none).

        ``Retry-After`` counts only where it means "come back later" (429, 5xx):
        ``retry_after_applies`` says whether the response is one of those.
        """
        before = self.delay(now)
        retry_after = signals.retry_after
        if retry_after is not None and retry_after_applies:
            self.not_before = max(self.not_before, now + retry_after)
            self.active = True
        quota = signals.quota
        if quota is not None:
            self.remaining = quota.remaining
            self.reset_at = now + quota.reset
            self.active = True
        after = self.delay(now)
        return after if after > before else 0.0
