"""The statistics the benchmark verdicts rest on (``benchmarks/_harness.py``)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from benchmarks._harness import (
    Report,
    _rotated,
    median_difference_interval,
    median_interval,
    sign_test,
)
from benchmarks.bench_asgi import ratio_verdict


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


def test_median_interval_of_eight_rounds_drops_one_value_at_each_end() -> None:
    """8 rounds at 90%: the 2nd and 7th smallest (coverage 93%), whatever their order."""
    rounds = [0.899, 0.831, 0.931, 0.871, 0.886, 0.851, 0.894, 0.899]
    assert median_interval(rounds) == (0.851, 0.899)
    assert median_interval(rounds) == median_difference_interval(rounds, [0.0] * 8)


def test_ratio_verdict_needs_the_whole_interval_on_one_side() -> None:
    """Met above, missed below, no verdict when the interval straddles the target."""
    assert ratio_verdict([0.93, 0.91, 0.95, 0.92, 0.94, 0.90, 0.96, 0.93], 0.9) is True
    # A run measured here: median 0.89, interval 0.851-0.899, so the target is missed.
    assert ratio_verdict([0.899, 0.831, 0.931, 0.871, 0.886, 0.851, 0.894, 0.899], 0.9) is False
    assert ratio_verdict([0.88, 0.95, 0.91, 0.87, 0.93, 0.89, 0.92, 0.90], 0.9) is None


def test_too_few_rounds_never_give_a_verdict() -> None:
    """Four rounds (the quick run) cannot bound the median at 90%, however clear they look."""
    assert ratio_verdict([0.99, 0.98, 0.99, 0.97], 0.9) is None
    assert ratio_verdict([0.5, 0.4, 0.5, 0.6], 0.9) is None


def test_rows_without_a_verdict_say_so() -> None:
    """A row with a target and no verdict renders "no verdict", not an empty cell."""
    report = Report(quick=True)
    section = report.section("t", "b")
    section.add("undecided", 1e-6, target_text=">= 0.9x bare", met=None)
    section.add("missed", 1e-6, target_text=">= 0.9x bare", met=False)
    section.add("untargeted", 1e-6)
    lines = report.render("# r").splitlines()
    assert any(line.startswith("| **undecided** ") and "| no verdict |" in line for line in lines)
    assert any(line.startswith("| **missed** ") and "| **no** |" in line for line in lines)
    untargeted = next(line for line in lines if line.startswith("| **untargeted** "))
    assert "verdict" not in untargeted
    assert "yes" not in untargeted
