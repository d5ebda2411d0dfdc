"""Rates: ``amount`` events per ``period`` seconds, and their text form ``"100/s"``."""

from __future__ import annotations

import math
import re
from typing import Final

from .._validate import shown
from ..errors import ConfigurationError

__all__ = ["Rate", "as_rate"]

_UNITS: Final[dict[str, float]] = {
    "us": 1e-6,
    "ms": 1e-3,
    "millisecond": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    # limits' unit names, accepted for its rate strings; limits' year is 360 days
    # (12 x 30), ours a calendar year
    "month": 30 * 86400.0,
    "year": 365 * 86400.0,
}

#: The longest period a rate may have (about 31,700 years): beyond it, its microseconds
#: overflow the arithmetic of a bucket.
_MAX_PERIOD: Final = 1e12

_PATTERN: Final = re.compile(
    r"""^\s*(?P<amount>\d+)\s*(?:/|\bper\b)\s*
        (?P<multiple>\d+(?:\.\d*)?|\.\d+)?\s*
        (?P<unit>[a-z]+)\s*$""",
    re.IGNORECASE | re.VERBOSE,
)


class Rate:
    """``amount`` events per ``period`` seconds, e.g. ``Rate(100, 1.0)`` or ``Rate.parse("100/s")``.

    Every ``rate=`` argument also accepts the text form (see :meth:`parse`). The period is
    kept to the microsecond, so ``"10/0.5s"`` or ``"3/250ms"`` lose nothing.

    Example::

        >>> rs.Rate.parse("5 per minute")
        Rate(5, 60.0)
        >>> rs.Rate(10, 5).per_second
        2.0
    """

    __slots__ = ("amount", "period", "period_us")

    amount: int
    period: float
    period_us: int

    def __init__(self, amount: int, period: float = 1.0) -> None:
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise ConfigurationError(f"rate amount must be an integer >= 1, got {amount!r}")
        if (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or period <= 0
            or period > _MAX_PERIOD
            or not math.isfinite(period)
        ):
            raise ConfigurationError(
                f"rate period must be a number of seconds in (0, {_MAX_PERIOD:g}], "
                f"got {shown(period)}"
            )
        period_us = round(period * 1_000_000)
        if period_us < 1:
            raise ConfigurationError(f"rate period must be at least 1 µs, got {period!r}")
        object.__setattr__(self, "amount", amount)
        object.__setattr__(self, "period", float(period))
        #: The period in whole microseconds (what the limiters compute with).
        object.__setattr__(self, "period_us", period_us)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Rate is immutable")

    @property
    def per_second(self) -> float:
        """Events per second (``amount / period``).

        Example: ``rs.Rate.parse("120/min").per_second == 2.0``
        """
        return self.amount / self.period

    @classmethod
    def parse(cls, text: str) -> Rate:
        """Parse ``"100/s"``, ``"100/second"``, ``"5 per minute"``, ``"10/5s"``, ``"3/250ms"``.

        Units: ``us``, ``ms``/``millisecond``, ``s``/``sec``/``second``, ``m``/``min``/
        ``minute``, ``h``/``hr``/``hour``, ``d``/``day`` (plural ``s`` allowed), and
        ``month`` (30 days) and ``year`` (365 days; limits counts 360). A multiple may be fractional
        (``"1/0.5s"``). Anything else raises :class:`~resilience.ConfigurationError`.

        Example::

            >>> rs.Rate.parse("10/5s")
            Rate(10, 5.0)
        """
        if not isinstance(text, str):
            raise ConfigurationError(f"rate must be a Rate or a string like '100/s', got {text!r}")
        match = _PATTERN.match(text)
        unit = None
        if match is not None:
            name = match.group("unit").lower()
            unit = _UNITS.get(name)
            if unit is None and name.endswith("s"):
                unit = _UNITS.get(name[:-1])  # plural: "seconds", "mins"
        if match is None or unit is None:
            if _several_rates(text):
                # limits' and slowapi's "10/second;1000/day" names several limits
                raise ConfigurationError(
                    f"a rate is one limit, got {text!r}: make one RateLimiter per rate and "
                    "chain them, the shorter period first: rs.Pipeline(per_second, per_day)"
                )
            raise ConfigurationError(
                f"cannot parse rate {text!r}: expected e.g. '100/s', '5 per minute', '10/5s'"
            )
        multiple = float(match.group("multiple")) if match.group("multiple") else 1.0
        if multiple <= 0:
            raise ConfigurationError(f"rate period must be > 0 in {text!r}")
        return cls(int(match.group("amount")), multiple * unit)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rate):
            return NotImplemented
        return self.amount * other.period_us == other.amount * self.period_us

    def __hash__(self) -> int:
        g = math.gcd(self.amount, self.period_us)
        return hash((self.amount // g, self.period_us // g))

    def __repr__(self) -> str:
        return f"Rate({self.amount}, {self.period!r})"

    def __str__(self) -> str:
        # The shortest text that parses back to this rate (repr is the shortest round
        # trip of a float; "2592000s" rather than "2.592e+06s", which no parser reads).
        period = repr(self.period)
        if "e" in period or "E" in period:
            period = f"{self.period:f}".rstrip("0").rstrip(".")
        elif period.endswith(".0"):
            period = period[:-2]
        return f"{self.amount}/{period}s"

    def __reduce__(self) -> tuple[object, ...]:
        return (Rate, (self.amount, self.period))


def _several_rates(text: str) -> bool:
    """Whether ``text`` lists several rates (``"10/s;1000/day"``, ``"5/min, 100/day"``),
    rather than being one rate that does not parse (``"1,000/day"``)."""
    parts = re.split(r"[;,]", text)
    return len(parts) > 1 and all(_PATTERN.match(part) for part in parts)


def as_rate(value: Rate | str, name: str = "rate") -> Rate:
    """``value`` as a :class:`Rate` (parsing strings); raises ConfigurationError otherwise."""
    if isinstance(value, Rate):
        return value
    if isinstance(value, str):
        return Rate.parse(value)
    raise ConfigurationError(f"{name} must be a Rate or a string like '100/s', got {value!r}")
