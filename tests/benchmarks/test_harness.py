"""The statistics the benchmark verdicts rest on (``benchmarks/_harness.py``)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from benchmarks._harness import _rotated, median_difference_interval, sign_test


def test_interval_is_the_sign_test_order_statistics() -> None:
    """25 rounds at 90%: the 8th and 18th smallest differences; 7 rounds: min and max."""
    baseline = [0.0] * 25
    assert median_difference_interval([float(i) for i in range(25)], baseline) == (7.0, 17.0)
    assert median_difference_interval([float(i) for i in range(7)], [0.0] * 7) == (0.0, 6.0)


def test_too_few_rounds_give_an_unbounded_interval() -> None:
    """Two rounds cannot hold the median with 90% confidence: nothing is claimed."""
    assert median_difference_interval([1.0, 2.0], [0.0, 0.0]) == (-math.inf, math.inf)


def test_interval_covers_the_median_at_least_as_often_as_promised() -> None:
    """Simulated rounds with a known median difference: coverage >= 90% (95.7% exact)."""
    rng = random.Random(7)
    trials = 2_000
    covered = 0
    for _ in range(trials):
        case = [0.3 + rng.gauss(0, 1) for _ in range(25)]
        low, high = median_difference_interval(case, [0.0] * 25)
        covered += low <= 0.3 <= high
    assert covered / trials >= 0.93


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=60), st.floats(-10, 10))
def test_interval_moves_with_a_shift(values: list[float], shift: float) -> None:
    """Adding a constant to every case shifts the interval by that constant."""
    baseline = [0.0] * len(values)
    low, high = median_difference_interval(values, baseline)
    shifted_low, shifted_high = median_difference_interval([v + shift for v in values], baseline)
    if math.isinf(low):
        assert (shifted_low, shifted_high) == (low, high)
    else:
        assert math.isclose(shifted_low, low + shift, abs_tol=1e-9)
        assert math.isclose(shifted_high, high + shift, abs_tol=1e-9)
        assert low <= high


def test_sign_test_flags_a_case_slower_in_every_round() -> None:
    """25 of 25 rounds slower: p = 2 / 2**25; a tie-free even split: p = 1."""
    slower, n, p = sign_test([1.0] * 25, [0.0] * 25)
    assert (slower, n) == (25, 25)
    assert p == 2 / 2**25
    assert sign_test([1.0, 0.0], [0.0, 1.0])[2] == 1.0


@given(st.integers(0, 40), st.integers(1, 8))
def test_rotation_runs_every_case_once_per_round(index: int, size: int) -> None:
    """Each round runs every case exactly once; round i starts with case i mod n."""
    cases = {f"case{i}": i for i in range(size)}
    order = _rotated(cases, index)
    assert sorted(order) == sorted(cases.items())
    assert order[0][1] == index % size
