"""Rate parsing and arithmetic."""

from __future__ import annotations

import pytest

import resilience as rs


@pytest.mark.parametrize(
    ("text", "amount", "period"),
    [
        ("100/s", 100, 1.0),
        ("100/second", 100, 1.0),
        ("100 / seconds", 100, 1.0),
        ("5 per minute", 5, 60.0),
        ("10/5s", 10, 5.0),
        ("10 per 5 seconds", 10, 5.0),
        ("3/250ms", 3, 0.25),
        ("1/0.5s", 1, 0.5),
        ("2/hour", 2, 3600.0),
        ("1/day", 1, 86400.0),
        ("7/2min", 7, 120.0),
    ],
)
def test_parse(text: str, amount: int, period: float) -> None:
    """Text forms from the issue and limits' syntax parse, keeping sub-second periods."""
    rate = rs.Rate.parse(text)
    assert (rate.amount, rate.period) == (amount, period)


@pytest.mark.parametrize(
    "text", ["", "fast", "10", "0/s", "10/0s", "10/5 parsecs", "-1/s", "1.5/s", "1,000/day"]
)
def test_parse_errors(text: str) -> None:
    """Unparseable or empty rates raise ConfigurationError (one rate that does not
    parse, "1,000/day" too, is not taken for a list of several)."""
    with pytest.raises(rs.ConfigurationError) as info:
        rs.Rate.parse(text)
    assert "one limit" not in str(info.value)


@pytest.mark.parametrize("text", ["10/second;1000/day", "5/minute, 100/day"])
def test_several_limits_in_one_text_are_refused_with_the_way_to_chain_them(text: str) -> None:
    """limits' and slowapi's "a;b" lists are several limiters here: the error says so
    and names the Pipeline that chains them, rather than "cannot parse"."""
    with pytest.raises(rs.ConfigurationError, match="one RateLimiter per rate") as info:
        rs.RateLimiter(text)
    assert "rs.Pipeline(per_second, per_day)" in str(info.value)


def test_rate_value_semantics() -> None:
    """Rates compare by value (60/min == 1/s), are immutable and know their per-second rate."""
    assert rs.Rate.parse("60/min") == rs.Rate(1, 1)
    assert hash(rs.Rate.parse("60/min")) == hash(rs.Rate(1, 1))
    assert rs.Rate(10, 5).per_second == 2.0
    assert str(rs.Rate(3, 0.25)) == "3/0.25s"
    assert rs.Rate(3, 0.25).period_us == 250_000
    with pytest.raises(AttributeError):
        rs.Rate(1, 1).amount = 2  # type: ignore[misc]
    with pytest.raises(rs.ConfigurationError):
        rs.Rate(1, 0)
    with pytest.raises(rs.ConfigurationError):
        rs.Rate(1, 1e-9)


@pytest.mark.parametrize("text", ["10/1.23456789s", "1/month", "1/15day", "3/250ms", "1/us"])
def test_a_rate_prints_as_text_that_parses_back_to_it(text: str) -> None:
    """str(rate) (statistics().rate, repr(limiter)) used ``:g``: "10/1.23457s" was
    another rate, and "1/2.592e+06s" did not parse at all."""
    rate = rs.ratelimit.Rate.parse(text)
    assert rs.ratelimit.Rate.parse(str(rate)) == rate
