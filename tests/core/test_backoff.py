"""The pure backoff schedules follow their formulas and are reproducible by seed."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import resilience as rs
from resilience import backoff


def take(schedule: backoff.Backoff, n: int) -> list[float]:
    return list(itertools.islice(schedule, n))


def test_constant_repeats_its_delay() -> None:
    """constant(d) yields d forever."""
    assert take(backoff.constant(0.25), 4) == [0.25] * 4


def test_linear_grows_by_step_up_to_cap() -> None:
    """linear(base, step, cap) = min(cap, base + step·n)."""
    assert take(backoff.linear(0.1, 0.2, cap=0.6), 5) == pytest.approx([0.1, 0.3, 0.5, 0.6, 0.6])


def test_exponential_doubles_up_to_cap() -> None:
    """exponential(base, cap) = min(cap, base·2ⁿ)."""
    assert take(backoff.exponential(0.1, cap=1.0), 6) == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )


@given(st.integers(min_value=0, max_value=2**32), st.floats(0.001, 1.0), st.floats(0.01, 30.0))
def test_full_jitter_stays_within_its_envelope(seed: int, base: float, cap: float) -> None:
    """Every full-jitter delay lies in [0, min(cap, base·2ⁿ)]."""
    for n, delay in enumerate(take(backoff.full_jitter(base, cap, seed=seed), 12)):
        assert 0.0 <= delay <= min(cap, base * 2**n) + 1e-12


@given(st.integers(min_value=0, max_value=2**32), st.floats(0.001, 1.0), st.floats(0.01, 30.0))
def test_equal_jitter_never_waits_less_than_half(seed: int, base: float, cap: float) -> None:
    """Equal jitter lies in [t/2, t] with t = min(cap, base·2ⁿ)."""
    for n, delay in enumerate(take(backoff.equal_jitter(base, cap, seed=seed), 12)):
        ceiling = min(cap, base * 2**n)
        assert ceiling / 2 - 1e-12 <= delay <= ceiling + 1e-12


@given(st.integers(min_value=0, max_value=2**32), st.floats(0.001, 1.0), st.floats(0.01, 30.0))
def test_decorrelated_jitter_is_bounded_by_three_times_previous(
    seed: int, base: float, cap: float
) -> None:
    """Decorrelated jitter: sₙ ∈ [min(cap, base), min(cap, 3·sₙ₋₁)]."""
    previous = base
    for delay in take(backoff.decorrelated_jitter(base, cap, seed=seed), 12):
        assert min(cap, base) - 1e-12 <= delay <= min(cap, 3 * previous) + 1e-12
        previous = delay


def test_same_seed_same_delays() -> None:
    """Two schedules with one seed produce one sequence; another seed differs."""
    assert take(backoff.full_jitter(0.1, 5, seed=3), 8) == take(
        backoff.full_jitter(0.1, 5, seed=3), 8
    )
    assert take(backoff.full_jitter(0.1, 5, seed=3), 8) != take(
        backoff.full_jitter(0.1, 5, seed=4), 8
    )


def test_seed_may_be_a_random_instance() -> None:
    """A random.Random is used as the generator itself."""
    assert take(backoff.full_jitter(1.0, 8, seed=random.Random(1)), 3) == take(
        backoff.full_jitter(1.0, 8, seed=random.Random(1)), 3
    )


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: backoff.constant(-1), "delay must be >= 0"),
        (lambda: backoff.exponential(0), "base must be > 0"),
        (lambda: backoff.exponential(0.1, multiplier=0.5), "multiplier must be >= 1"),
        (lambda: backoff.full_jitter(0.1, cap=-2), "cap must be >= 0"),
        # random.Random took a list only to fail with TypeError; a str or a float too.
        (lambda: backoff.full_jitter(0.1, seed=[1]), "seed must be an int"),
        (lambda: backoff.equal_jitter(0.1, seed="abc"), "seed must be an int"),
    ],
)
def test_bad_arguments_raise_configuration_error(factory: object, message: str) -> None:
    """Bad schedule parameters fail at construction, naming the argument."""
    with pytest.raises(rs.ConfigurationError, match=message):
        factory()  # type: ignore[operator]
