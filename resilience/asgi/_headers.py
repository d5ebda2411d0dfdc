"""Rate-limit response fields: IETF ``RateLimit``/``RateLimit-Policy``, legacy, Retry-After.

Follows draft-ietf-httpapi-ratelimit-headers (-09)::

    RateLimit-Policy: "default";q=100;w=60      quota q units per window w seconds
    RateLimit: "default";r=42;t=7                r units remain; t seconds to reset

Both are Structured Field lists whose items are the policy name (an sf-string).
Everything that does not depend on the decision is rendered once, at construction;
a request costs one small f-string. ``t`` is the time until the bucket is full again
(``Decision.reset_after``) when the request is admitted and the time until it would be
admitted (``Decision.retry_after``, the same instant as ``Retry-After``) when refused.
Seconds are rounded *up*: a client that waits ``t`` or ``Retry-After`` is admitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .._validate import check_choice
from ..errors import ConfigurationError

__all__ = [
    "HEADER_MODES",
    "RateLimitHeaders",
    "format_policy",
    "format_ratelimit",
    "quota_and_window",
    "retry_after_value",
    "sf_string",
]

Header = tuple[bytes, bytes]

_FIELD_CACHE = 1024

#: The rate-limit fields a response carries (``RateLimitMiddleware(headers=...)``).
HeaderMode = Literal["ietf", "legacy", "both", "none"]

#: Accepted values of ``headers=``.
HEADER_MODES: tuple[HeaderMode, ...] = ("ietf", "legacy", "both", "none")


def sf_string(value: str) -> str:
    """``value`` as a Structured Field string (RFC 8941 §3.3.3): quoted, escaped.

    Example::

        >>> sf_string('api "v2"')
        '"api \\\\"v2\\\\""'
    """
    if not isinstance(value, str) or any(not (0x20 <= ord(c) <= 0x7E) for c in value):
        raise ConfigurationError(f"a policy name must be printable ASCII, got {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ceil_seconds(seconds: float) -> int:
    return max(0, math.ceil(seconds - 1e-9))


def retry_after_value(seconds: float | None, *, minimum: int = 1) -> bytes:
    """``Retry-After`` delta-seconds: rounded up, at least ``minimum``.

    Example::

        >>> retry_after_value(0.2)
        b'1'
    """
    if seconds is None or seconds != seconds:
        return str(minimum).encode()
    return str(max(minimum, _ceil_seconds(seconds))).encode()


def quota_and_window(amount: float, period: float) -> tuple[int, int]:
    """Integers ``(q, w)`` describing ``amount`` per ``period`` seconds.

    The draft needs integer windows: a sub-second or fractional period is scaled to
    a whole number of seconds (``10 per 0.1 s`` -> ``q=100;w=1``).

    Example::

        >>> quota_and_window(100, 60)
        (100, 60)
    """
    if period <= 0 or amount <= 0:
        raise ConfigurationError(f"rate must be positive, got {amount!r} per {period!r} s")
    if float(period).is_integer():
        return max(1, math.floor(amount)), int(period)
    window = max(1, round(period))
    return max(1, math.floor(amount * window / period)), window


def format_policy(name: str, quota: int, window: int) -> str:
    """One ``RateLimit-Policy`` item: ``"name";q=..;w=..``.

    Example::

        >>> format_policy("default", 100, 60)
        '"default";q=100;w=60'
    """
    return f"{sf_string(name)};q={int(quota)};w={int(window)}"


def format_ratelimit(name: str, remaining: int, reset: float) -> str:
    """One ``RateLimit`` item: ``"name";r=..;t=..`` (``t`` rounded up).

    Example::

        >>> format_ratelimit("default", 42, 6.2)
        '"default";r=42;t=7'
    """
    return f"{sf_string(name)};r={max(0, int(remaining))};t={_ceil_seconds(reset)}"


class RateLimitHeaders:
    """Renders the rate-limit fields of one limiter; everything static is precomputed.

    ``mode`` is ``"ietf"`` (``RateLimit-Policy`` + ``RateLimit``), ``"legacy"``
    (``X-RateLimit-Limit``, ``-Remaining``, ``-Reset``), ``"both"`` or ``"none"``.

    Example::

        headers = RateLimitHeaders("default", limiter, "ietf")
        headers.admitted(decision)   # [(b"ratelimit-policy", ...), (b"ratelimit", ...)]
    """

    __slots__ = (
        "_fields",
        "_ietf",
        "_ietf_only",
        "_legacy",
        "_limit",
        "_policy",
        "_template",
        "enabled",
        "name",
    )

    def __init__(self, name: str, limiter: Any, mode: str | None) -> None:
        mode = check_choice("headers", "none" if mode is None else mode, HEADER_MODES)
        self.name = name
        self._template = sf_string(name).encode() + b";r=%d;t=%d"
        self._ietf = mode in ("ietf", "both")
        self._legacy = mode in ("legacy", "both")
        self._ietf_only = self._ietf and not self._legacy
        self.enabled = self._ietf or self._legacy
        rate = limiter.rate
        quota, window = quota_and_window(rate.amount, rate.period)
        self._policy: Header = (b"ratelimit-policy", format_policy(name, quota, window).encode())
        self._limit: Header = (b"x-ratelimit-limit", str(int(limiter.burst)).encode())
        # Rendered RateLimit fields by (remaining, seconds): few distinct values repeat.
        self._fields: dict[tuple[int, int], tuple[Header, Header]] = {}

    def admitted(self, decision: Any) -> Sequence[Header]:
        """The fields for a response to an admitted request."""
        return self.admitted_values(decision.remaining, decision.reset_after)

    def admitted_values(self, remaining: int, reset: float) -> Sequence[Header]:
        """:meth:`admitted` from a decision's ``remaining`` and ``reset_after``."""
        seconds = math.ceil(reset - 1e-9) if reset > 0 else 0
        if not self._ietf_only:
            return self._render(remaining, seconds)
        state = (remaining, seconds)
        fields = self._fields.get(state)
        if fields is None:  # the default: two fields, rendered once per distinct state
            fields = (self._policy, (b"ratelimit", self._template % state))
            if len(self._fields) >= _FIELD_CACHE:
                self._fields.clear()
            self._fields[state] = fields
        return fields

    def for_fill(self, gcra: Any) -> Callable[[int], Sequence[Header]]:
        """``fill -> admitted_values(*gcra.admitted_state(fill))`` as one function.

        ``fill`` is what :meth:`MemoryBuckets.take_one` returns on admission (ticks until
        the bucket is full). The function is the middleware's hot path with the default
        IETF fields: the state arithmetic inlined, one cache lookup.

        Example: ``fields = headers.for_fill(limiter._buckets.gcra)(fill)``
        """
        admitted_values = self.admitted_values
        if not self._ietf_only:
            admitted_state = gcra.admitted_state
            return lambda fill: admitted_values(*admitted_state(fill))
        tolerance, emission, per_second = gcra.tolerance, gcra.emission, gcra._ticks_per_s
        policy, template = self._policy, self._template
        ceil = math.ceil
        # The fields after one token from a full bucket (fill == emission), the common
        # case, rendered once.
        full = admitted_values(*gcra.admitted_state(emission))

        def fields_for_fill(fill: int) -> Sequence[Header]:
            if fill == emission:
                return full
            # A draining bucket's state changes with every request, so a cache would
            # only miss: render it (t as admitted_values rounds it; fill > 0 here).
            seconds = ceil(fill / per_second - 1e-9)
            return (policy, (b"ratelimit", template % ((tolerance - fill) // emission, seconds)))

        return fields_for_fill

    def refused(self, decision: Any) -> list[Header]:
        """The fields for a 429 (remaining 0, reset at ``retry_after``)."""
        reset = decision.retry_after
        return self._render(0, math.ceil(reset - 1e-9) if reset > 0 else 0)

    def _render(self, remaining: int, seconds: int) -> list[Header]:
        out: list[Header] = []
        if self._ietf:
            out.append(self._policy)
            out.append((b"ratelimit", self._template % (remaining, seconds)))
        if self._legacy:
            out.append(self._limit)
            out.append((b"x-ratelimit-remaining", b"%d" % remaining))
            out.append((b"x-ratelimit-reset", b"%d" % seconds))
        return out
