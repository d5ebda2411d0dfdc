"""Server signals: Retry-After and the rate-limit fields, parsed leniently and capped."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilience._http._signals import (
    Quota,
    Signals,
    parse_http_date,
    parse_ratelimit,
    parse_retry_after,
    read_signals,
)

CAP = 60.0
NOW = 1_700_000_000.0  # a Unix time


def _date(unix: float) -> str:
    return email.utils.formatdate(unix, usegmt=True)


def signals(*headers: tuple[str, str], wall: float = NOW) -> Signals | None:
    raw = [(name.encode(), value.encode()) for name, value in headers]
    return read_signals(raw, cap=CAP, wall=lambda: wall)


# -- Retry-After ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0.0),
        ("2", 2.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("120", CAP),
        ("59", 59.0),
        ("9" * 40, CAP),
    ],
)
def test_retry_after_seconds(text: str, expected: float) -> None:
    """Delay-seconds are read as such (decimals tolerated) and capped: RFC 9110's
    ``1*DIGIT`` has no upper bound, so a huge value means the cap (it used to be
    ignored as malformed, as if the server had sent no hint at all)."""
    assert parse_retry_after(text, now=None, cap=CAP) == expected


@pytest.mark.parametrize(
    "text", ["", "-1", "abc", "1e3", "inf", "nan", "1_000", "+5", "0x10", "5s", "1,2", "9" * 600]
)
def test_malformed_retry_after_is_ignored(text: str) -> None:
    """Anything that is neither delay-seconds nor an HTTP-date gives None, never an error."""
    assert parse_retry_after(text, now=NOW, cap=CAP) is None


@pytest.mark.parametrize(
    "form",
    [
        "Tue, 14 Nov 2023 22:13:50 GMT",  # IMF-fixdate
        "Tuesday, 14-Nov-23 22:13:50 GMT",  # RFC 850
        "Tue Nov 14 22:13:50 2023",  # asctime
    ],
)
def test_retry_after_http_date_forms(form: str) -> None:
    """The three HTTP-date forms of RFC 9110 give the same delay."""
    base = parse_http_date("Tue, 14 Nov 2023 22:13:20 GMT")
    assert base is not None
    assert parse_retry_after(form, now=base, cap=CAP) == pytest.approx(30.0)


def test_retry_after_date_in_the_past_is_zero() -> None:
    """A date already passed means "now", not a negative wait."""
    assert parse_retry_after(_date(NOW - 100), now=NOW, cap=CAP) == 0.0


def test_retry_after_date_is_measured_from_the_response_date() -> None:
    """The response's Date field is the reference, so a skewed client clock does not matter."""
    server_now = NOW + 3600  # the client's wall clock is an hour behind
    found = signals(("Date", _date(server_now)), ("Retry-After", _date(server_now + 10)))
    assert found == Signals(retry_after=10.0)


def test_retry_after_date_without_date_field_uses_the_wall_clock() -> None:
    """Without a Date field the wall clock passed in is the reference."""
    assert signals(("Retry-After", _date(NOW + 20))) == Signals(retry_after=20.0)


def test_a_far_future_date_is_capped() -> None:
    """A server cannot park the client beyond the cap."""
    assert signals(("Retry-After", _date(NOW + 86400 * 365))) == Signals(retry_after=CAP)


@given(st.text(max_size=80))
def test_retry_after_never_raises_and_stays_in_bounds(text: str) -> None:
    """Whatever the text, the result is None or a delay in [0, cap]."""
    result = parse_retry_after(text, now=NOW, cap=CAP)
    assert result is None or 0.0 <= result <= CAP


@given(st.integers(min_value=0, max_value=10**12))
def test_retry_after_integers_round_trip_up_to_the_cap(seconds: int) -> None:
    """An integer delay comes back exactly, or as the cap."""
    assert parse_retry_after(str(seconds), now=None, cap=CAP) == min(float(seconds), CAP)


@given(st.integers(min_value=0, max_value=10_000))
def test_retry_after_dates_round_trip(seconds: int) -> None:
    """An HTTP-date n seconds after the response's Date means a delay of n (capped)."""
    found = signals(("Date", _date(NOW)), ("Retry-After", _date(NOW + seconds)))
    assert found is not None
    assert found.retry_after == min(float(seconds), CAP)


# -- RateLimit (IETF drafts) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy", "expected"),
    [
        ("r=0;t=5", None, Quota(0, 5.0)),  # the short form of the issue
        ('"default";r=50;t=30', None, Quota(50, 30.0)),  # draft-08+
        ('"burst";r=3;t=1, "day";r=0;t=50', None, Quota(0, 50.0)),  # the binding one
        ('"a";r=2;t=1, "b";r=2;t=9', None, Quota(2, 9.0)),  # tie: the later reset
        ('"default";r=1', '"default";q=10;w=30', Quota(1, 30.0)),  # window from the policy
        ('"x";r=1', '"a";q=10;w=30, "b";q=1;w=5', None),  # unknown policy name: no reset
        ("r=4", '"a";q=10;w=30, "b";q=1;w=5', Quota(4, 30.0)),  # unnamed: the widest window
        ("limit=100, remaining=0, reset=7", None, Quota(0, 7.0)),  # drafts 06-07
        ("r=0;t=600", None, Quota(0, CAP)),  # capped
        ('"d";r=1;t=2, garbage', None, Quota(1, 2.0)),  # malformed members skipped
        ('"a,b";r=1;t=2', None, Quota(1, 2.0)),  # commas inside quoted names
    ],
)
def test_ratelimit_field(text: str, policy: str | None, expected: Quota | None) -> None:
    """The RateLimit field of every draft gives the most restrictive quota."""
    assert parse_ratelimit(text, policy, cap=CAP) == expected


@pytest.mark.parametrize(
    "text", ["", "r=-1;t=5", "r=x;t=5", "r=1;t=-5", "r=1;t=abc", "remaining=1", ";;;", "r=1e9;t=1"]
)
def test_malformed_ratelimit_is_ignored(text: str) -> None:
    """Unusable RateLimit values give no quota, never an error."""
    assert parse_ratelimit(text, None, cap=CAP) is None


def test_ratelimit_and_policy_fields_together() -> None:
    """read_signals combines RateLimit with RateLimit-Policy."""
    found = signals(("RateLimit", '"q";r=0'), ("RateLimit-Policy", '"q";q=100;w=12'))
    assert found == Signals(quota=Quota(0, 12.0))


def test_repeated_fields_are_combined() -> None:
    """Two RateLimit fields are one list (RFC 9110 §5.3); the binding member wins."""
    found = signals(("RateLimit", '"a";r=5;t=1'), ("ratelimit", '"b";r=0;t=3'))
    assert found == Signals(quota=Quota(0, 3.0))


# -- RateLimit-* and X-RateLimit-* ------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ((("RateLimit-Remaining", "0"), ("RateLimit-Reset", "9")), Quota(0, 9.0)),
        ((("X-RateLimit-Remaining", "3"), ("X-RateLimit-Reset", "20")), Quota(3, 20.0)),
        (
            (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(NOW) + 15))),
            Quota(0, 15.0),
        ),
        (
            (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(NOW + 15) * 1000))),
            Quota(0, 15.0),
        ),
        (
            (("X-RateLimit-Remaining", "1"), ("X-RateLimit-Reset-After", "2.5")),
            Quota(1, 2.5),
        ),
        (
            (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(NOW) + 9999))),
            Quota(0, CAP),
        ),
        ((("X-RateLimit-Remaining", "0"),), None),  # no reset: nothing to pace on
        ((("X-RateLimit-Remaining", "lots"), ("X-RateLimit-Reset", "2")), None),
        ((("X-RateLimit-Limit", "100"),), None),
    ],
)
def test_legacy_fields(headers: tuple[tuple[str, str], ...], expected: Quota | None) -> None:
    """Legacy fields: delta seconds, Unix times (s or ms) and reset-after are understood."""
    found = signals(*headers)
    assert (found.quota if found is not None else None) == expected


def test_unix_reset_uses_the_response_date() -> None:
    """A Unix-time reset is measured from the response's Date when there is one."""
    found = signals(
        ("Date", _date(NOW + 1000)),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", str(int(NOW) + 1010)),
        wall=NOW,
    )
    assert found == Signals(quota=Quota(0, 10.0))


def test_both_families_the_most_restrictive_wins() -> None:
    """When IETF and legacy fields disagree, the tighter quota wins."""
    found = signals(
        ("RateLimit", "r=10;t=5"), ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "3")
    )
    assert found == Signals(quota=Quota(0, 3.0))


def test_responses_without_signals_give_none() -> None:
    """Ordinary headers are skipped."""
    assert signals(("Content-Type", "text/plain"), ("Date", _date(NOW))) is None


def test_overlong_values_are_ignored() -> None:
    """A huge header value is not parsed at all."""
    assert signals(("RateLimit", "r=0;t=5," + "x" * 10_000)) is None
    assert signals(("Retry-After", "1" + " " * 10_000)) is None


_NAMES = st.sampled_from(
    [
        "Retry-After",
        "RateLimit",
        "RateLimit-Policy",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "X-RateLimit-Reset-After",
        "Date",
    ]
)
_VALUES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    st.integers(min_value=-(10**13), max_value=10**13).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.builds(
        lambda r, t, name: f'"{name}";r={r};t={t}',
        st.integers(-5, 10**6),
        st.integers(-5, 10**6),
        st.text(alphabet="abc,; =", max_size=5),
    ),
)


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=6), st.floats(0, 2e9))
def test_read_signals_never_raises_and_is_bounded(
    headers: list[tuple[str, str]], wall: float
) -> None:
    """Any mix of fields and values: no error, every delay in [0, cap], quotas non-negative."""
    found = signals(*headers, wall=wall)
    if found is None:
        return
    assert found.retry_after is not None or found.quota is not None
    if found.retry_after is not None:
        assert 0.0 <= found.retry_after <= CAP
    if found.quota is not None:
        assert found.quota.remaining >= 0
        assert 0.0 <= found.quota.reset <= CAP


@given(st.integers(0, 10**9), st.integers(0, 10**6))
def test_ratelimit_round_trip(remaining: int, reset: int) -> None:
    """r and t come back as advertised (reset capped)."""
    assert parse_ratelimit(f'"p";r={remaining};t={reset}', cap=CAP) == Quota(
        remaining, min(float(reset), CAP)
    )
