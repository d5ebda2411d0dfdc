"""What a server says about its limits: ``Retry-After`` and the rate-limit fields.

Parsed leniently and distrustfully: a malformed value is ignored (never an error), and
every delay is capped, so a server cannot park a client for a day with one header.

Understood fields (names are case-insensitive):

* ``Retry-After``: delay-seconds (``120``; decimals tolerated) or an HTTP-date
  (IMF-fixdate, RFC 850 or asctime), RFC 9110 §10.2.3.
* ``RateLimit`` of draft-ietf-httpapi-ratelimit-headers-08 and later:
  ``"default";r=0;t=5`` (``r`` remaining quota units, ``t`` seconds to reset), one list
  member per policy; ``RateLimit-Policy: "default";q=100;w=60`` supplies the window
  (``w``) as the reset when a member has no ``t``.
* ``RateLimit`` of drafts 06-07: ``limit=100, remaining=0, reset=5``.
* ``RateLimit-Remaining`` / ``RateLimit-Reset`` / ``RateLimit-Limit`` (drafts 00-05).
* ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` / ``X-RateLimit-Reset-After`` /
  ``X-RateLimit-Limit`` (GitHub, Twitter, Discord and many others);
  ``X-RateLimit-Reset`` is taken as a Unix time when it looks like one (>= 10⁹).

HTTP-dates and Unix times are converted to delays against the response's own ``Date``
field when it has one (so client clock skew does not matter), otherwise against the
wall clock passed in. When several quotas are advertised, the most restrictive one wins
(fewest remaining units; the later reset on a tie).
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "SIGNAL_FIELDS",
    "Quota",
    "Signals",
    "parse_http_date",
    "parse_ratelimit",
    "parse_retry_after",
    "read_signals",
]

#: Header values longer than this are ignored without being parsed.
MAX_VALUE_LENGTH = 512

_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")
_HUGE_DECIMAL = re.compile(r"[0-9]{16,}(?:\.[0-9]*)?")
_INTEGER = re.compile(r"[0-9]{1,18}")
# A Unix time in seconds (>= 2001-09-09) or in milliseconds.
_EPOCH_SECONDS = 1e9
_EPOCH_MILLISECONDS = 1e12

#: The (lower-case, bytes) field names :func:`read_signals` looks at.
SIGNAL_FIELDS = frozenset(
    {
        b"retry-after",
        b"ratelimit",
        b"ratelimit-policy",
        b"ratelimit-remaining",
        b"ratelimit-reset",
        b"x-ratelimit-remaining",
        b"x-ratelimit-reset",
        b"x-ratelimit-reset-after",
    }
)


@dataclass(frozen=True, slots=True)
class Quota:
    """One advertised quota: ``remaining`` units until the window resets in ``reset`` s."""

    remaining: int
    reset: float


@dataclass(frozen=True, slots=True)
class Signals:
    """The server's signals of one response, delays in seconds from now, all capped.

    ``retry_after``: do not send before this delay (``Retry-After``); ``quota``: the
    binding advertised quota, if any.
    """

    retry_after: float | None = None
    quota: Quota | None = None


def _decimal(text: str) -> float | None:
    text = text.strip()
    if _DECIMAL.fullmatch(text) is None:
        return None
    return float(text)


def _integer(text: str) -> int | None:
    text = text.strip().strip('"')
    if _INTEGER.fullmatch(text) is None:
        return None
    return int(text)


def parse_http_date(text: str) -> float | None:
    """An HTTP-date as a Unix time, or ``None`` if it is not one.

    Example: ``parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT") == 784111777.0``
    """
    text = text.strip()
    if not text or len(text) > 64 or not any(ch.isalpha() for ch in text):
        return None
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:
        import datetime

        moment = moment.replace(tzinfo=datetime.UTC)
    try:
        return moment.timestamp()
    except (OverflowError, OSError, ValueError):  # pragma: no cover - platform limits
        return None


def _bounded(seconds: float, cap: float) -> float:
    return min(max(seconds, 0.0), cap)


def parse_retry_after(text: str, *, now: float | None, cap: float) -> float | None:
    """The delay of a ``Retry-After`` value in seconds, in ``[0, cap]``; ``None`` if malformed.

    ``now`` is the Unix time an HTTP-date is measured from (the response's ``Date``, or
    the wall clock); an HTTP-date is ignored when ``now`` is ``None``.

    Example: ``parse_retry_after("120", now=None, cap=60.0) == 60.0``
    """
    return _retry_after(text, cap, None if now is None else lambda: now)


def _retry_after(text: str, cap: float, reference: Callable[[], float] | None) -> float | None:
    """:func:`parse_retry_after`, the HTTP-date measured from ``reference()`` (called
    only for a date; ``None``: dates are ignored)."""
    if len(text) > MAX_VALUE_LENGTH:
        return None
    seconds = _decimal(text)
    if seconds is None and _HUGE_DECIMAL.fullmatch(text.strip()):
        seconds = math.inf  # "come back much later": the cap, not "no hint"
    if seconds is not None:
        return _bounded(seconds, cap)
    if reference is None:
        return None
    when = parse_http_date(text)
    if when is None:
        return None
    return _bounded(when - reference(), cap)


def _split(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside double-quoted strings (structured-field lists)."""
    if '"' not in text:
        return text.split(separator)
    parts: list[str] = []
    start = 0
    quoted = escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _members(text: str) -> list[tuple[str | None, dict[str, str]]]:
    """``name;k=v;k=v, ...`` as ``(name, params)`` pairs; a bare ``k=v`` has no name."""
    members: list[tuple[str | None, dict[str, str]]] = []
    for member in _split(text, ","):
        name: str | None = None
        params: dict[str, str] = {}
        for index, part in enumerate(_split(member, ";")):
            part = part.strip()
            if not part:
                continue
            key, eq, value = part.partition("=")
            if eq:
                params[key.strip().lower()] = value.strip()
            elif index == 0:
                name = part.strip('"')
        members.append((name, params))
    return members


def _windows(policy: str | None) -> dict[str | None, float]:
    """``RateLimit-Policy`` windows (``w``) by policy name."""
    windows: dict[str | None, float] = {}
    if not policy or len(policy) > MAX_VALUE_LENGTH:
        return windows
    for name, params in _members(policy):
        window = _decimal(params.get("w", ""))
        if window is not None:
            windows[name] = window
    return windows


def _binding(quotas: Iterable[Quota]) -> Quota | None:
    best: Quota | None = None
    for quota in quotas:
        if (
            best is None
            or quota.remaining < best.remaining
            or (quota.remaining == best.remaining and quota.reset > best.reset)
        ):
            best = quota
    return best


def parse_ratelimit(text: str, policy: str | None = None, *, cap: float) -> Quota | None:
    """The binding quota of a ``RateLimit`` field (any draft), or ``None`` if malformed.

    ``policy`` is the ``RateLimit-Policy`` field, used for the reset of members that
    have no ``t``. Resets are capped at ``cap`` seconds.

    Example: ``parse_ratelimit('"default";r=0;t=5', cap=60.0) == Quota(0, 5.0)``
    """
    if len(text) > MAX_VALUE_LENGTH:
        return None
    quotas: list[Quota] = []
    legacy: dict[str, str] = {}
    windows: dict[str | None, float] | None = None
    for name, params in _members(text):
        if "r" not in params:
            legacy.update(params)
            continue
        remaining = _integer(params["r"])
        if remaining is None:
            continue
        reset = _decimal(params["t"]) if "t" in params else None
        if reset is None:
            if windows is None:
                windows = _windows(policy)
            reset = windows.get(name)
            if reset is None and windows and name is None:
                reset = max(windows.values())
        if reset is not None:
            quotas.append(Quota(remaining, _bounded(reset, cap)))
    if not quotas and "remaining" in legacy:
        remaining = _integer(legacy["remaining"])
        reset = _decimal(legacy.get("reset", ""))
        if remaining is not None and reset is not None:
            quotas.append(Quota(remaining, _bounded(reset, cap)))
    return _binding(quotas)


def _reset_delay(text: str, reference: Callable[[], float], cap: float) -> float | None:
    """A reset given as delta seconds or as a Unix time (seconds or milliseconds)."""
    value = _decimal(text)
    if value is None:
        return None
    if value >= _EPOCH_SECONDS:
        if value >= _EPOCH_MILLISECONDS:
            value /= 1000.0
        value -= reference()
    return _bounded(value, cap)


def read_signals(
    raw: Iterable[tuple[bytes, bytes]], *, cap: float, wall: Callable[[], float]
) -> Signals | None:
    """The server's signals in a response's raw headers, or ``None`` if it sent none.

    ``raw`` is ``response.headers.raw``; ``wall()`` gives the Unix time, read only if a
    date must be converted and the response has no usable ``Date`` field. Every delay
    is in ``[0, cap]``.

    Example::

        signals = read_signals([(b"Retry-After", b"2")], cap=60.0, wall=time.time)
        assert signals.retry_after == 2.0
    """
    found: dict[bytes, str] | None = None
    date: bytes | None = None
    for name, value in raw:
        name = name.lower()
        if name in SIGNAL_FIELDS:
            if found is None:
                found = {}
            text = value.decode("latin-1")
            previous = found.get(name)
            # Repeated fields combine into one list, as RFC 9110 §5.3 says.
            found[name] = text if previous is None else f"{previous}, {text}"
        elif name == b"date":
            date = value
    if found is None:
        return None

    server_now: list[float] = []

    def reference() -> float:
        if not server_now:
            parsed = parse_http_date(date.decode("latin-1")) if date is not None else None
            server_now.append(parsed if parsed is not None else wall())
        return server_now[0]

    field = found.get(b"retry-after")
    retry_after = None if field is None else _retry_after(field, cap, reference)
    quota = _quota(found, reference, cap)
    if retry_after is None and quota is None:
        return None
    return Signals(retry_after, quota)


def _quota(found: dict[bytes, str], reference: Callable[[], float], cap: float) -> Quota | None:
    quotas: list[Quota] = []
    text = found.get(b"ratelimit")
    if text is not None:
        quota = parse_ratelimit(text, found.get(b"ratelimit-policy"), cap=cap)
        if quota is not None:
            quotas.append(quota)
    for prefix in (b"ratelimit-", b"x-ratelimit-"):
        remaining_text = found.get(prefix + b"remaining")
        if remaining_text is None or len(remaining_text) > MAX_VALUE_LENGTH:
            continue
        remaining = _integer(remaining_text)
        if remaining is None:
            continue
        reset: float | None = None
        after = found.get(prefix + b"reset-after")
        if after is not None and len(after) <= MAX_VALUE_LENGTH:
            seconds = _decimal(after)
            reset = None if seconds is None else _bounded(seconds, cap)
        if reset is None:
            at = found.get(prefix + b"reset")
            if at is not None and len(at) <= MAX_VALUE_LENGTH:
                reset = _reset_delay(at, reference, cap)
        if reset is not None:
            quotas.append(Quota(remaining, reset))
    return _binding(quotas)
