"""The measuring harness shared by every benchmark module.

Each ``benchmarks/bench_*.py`` module defines ``run(report: Report, quick: bool)``.
It measures ours and the peers *in the same process run*, with interleaved rounds
(case A, case B, ... then again), so that machine noise hits every case alike, and
adds rows to the report. Per-call time is the median over rounds of (round time /
calls per round); overhead is that minus the bare call's median from the same run.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "Report",
    "Row",
    "Section",
    "measure",
    "measure_async",
    "measure_async_rounds",
    "measure_rounds",
    "median_difference_interval",
    "sign_test",
]


T = TypeVar("T")


def _rounds(quick: bool) -> int:
    return 7 if quick else 25


def measure(
    cases: dict[str, Callable[[], object]], *, number: int = 20_000, rounds: int = 25
) -> dict[str, float]:
    """Median seconds per call of each zero-argument callable, interleaved rounds."""
    samples = measure_rounds(cases, number=number, rounds=rounds)
    return {name: statistics.median(values) for name, values in samples.items()}


def _rotated(cases: dict[str, T], index: int) -> list[tuple[str, T]]:
    """The cases in round ``index``'s order: the list rotated by ``index`` places."""
    items = list(cases.items())
    shift = index % len(items) if items else 0
    return items[shift:] + items[:shift]


def measure_rounds(
    cases: dict[str, Callable[[], object]], *, number: int = 20_000, rounds: int = 25
) -> dict[str, list[float]]:
    """Seconds per call of each case in every round (round ``i`` of every case ran
    back to back, so rounds pair up across cases).

    The order of the cases rotates from round to round, so that no case always runs
    first, or always right after the same other case."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm up
        for _ in range(min(number, 1000)):
            fn()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for index in range(rounds):
            for name, fn in _rotated(cases, index):
                start = time.perf_counter_ns()
                for _ in range(number):
                    fn()
                samples[name].append((time.perf_counter_ns() - start) / number / 1e9)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def measure_async(
    cases: dict[str, Callable[[], Awaitable[object]]],
    *,
    number: int = 10_000,
    rounds: int = 25,
    backend: str = "asyncio",
) -> dict[str, float]:
    """Like :func:`measure` for coroutine functions, all cases in one event loop."""
    samples = measure_async_rounds(cases, number=number, rounds=rounds, backend=backend)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_async_rounds(
    cases: dict[str, Callable[[], Awaitable[object]]],
    *,
    number: int = 10_000,
    rounds: int = 25,
    backend: str = "asyncio",
) -> dict[str, list[float]]:
    """Like :func:`measure_rounds` (rotating order included) for coroutine functions,
    all cases in one event loop."""

    async def main() -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():
            for _ in range(min(number, 500)):
                await fn()
        gc.disable()
        try:
            for index in range(rounds):
                for name, fn in _rotated(cases, index):
                    start = time.perf_counter_ns()
                    for _ in range(number):
                        await fn()
                    samples[name].append((time.perf_counter_ns() - start) / number / 1e9)
        finally:
            gc.enable()
        return samples

    if backend == "trio":
        import trio

        return trio.run(main)
    return asyncio.run(main())


def sign_test(case: list[float], baseline: list[float]) -> tuple[int, int, float]:
    """Paired rounds: ``(rounds where case was slower, rounds compared, two-sided p)``.

    Under "no difference" each paired round is a coin flip, so the count of slower
    rounds is Binomial(n, 1/2); ``p`` is the chance of a count at least this far from
    n/2. Drift of the machine hits both cases of a round alike and cancels out.
    """
    pairs = [(c, b) for c, b in zip(case, baseline, strict=True) if c != b]
    n = len(pairs)
    slower = sum(c > b for c, b in pairs)
    if n == 0:
        return 0, 0, 1.0
    extreme = max(slower, n - slower)
    tail = sum(math.comb(n, k) for k in range(extreme, n + 1)) / 2**n
    return slower, n, min(1.0, 2 * tail)


def median_interval(values: list[float], *, confidence: float = 0.90) -> tuple[float, float]:
    """An interval that holds the median of the distribution ``values`` were drawn from
    with at least ``confidence``, assuming nothing about that distribution.

    Of the ``n`` sorted values ``v(1) <= ... <= v(n)``, the interval is ``[v(k), v(n + 1
    - k)]`` with the largest ``k`` such that ``P(Binomial(n, 1/2) <= k - 1) <= (1 -
    confidence) / 2`` (each value falls below the median with chance 1/2). For 25 values
    at 90% that is ``[v(8), v(18)]`` (coverage 95.7%); for 8, ``[v(2), v(7)]``; for 7,
    ``[v(1), v(7)]``. With too few values for the confidence asked, it is unbounded.
    """
    ordered = sorted(values)
    n = len(ordered)
    alpha = (1 - confidence) / 2
    k = 0  # P(X <= k) is the chance that k or fewer values fall below the median
    while k < n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= alpha:
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return ordered[k - 1], ordered[n - k]


def median_difference_interval(
    case: list[float], baseline: list[float], *, confidence: float = 0.90
) -> tuple[float, float]:
    """Paired rounds: :func:`median_interval` of the differences ``case - baseline`` (the
    sign test inverted)."""
    return median_interval(
        [c - b for c, b in zip(case, baseline, strict=True)], confidence=confidence
    )


@dataclass
class Row:
    """One measured case: its per-call median and overhead over the baseline."""

    name: str
    per_call_us: float
    overhead_us: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    ours: bool = True


@dataclass
class Section:
    """A table of rows measured together, with the baseline they are compared to."""

    title: str
    baseline: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What the "per call" and "overhead" columns count (µs unless a section says).
    unit: str = "µs"

    def add(
        self,
        name: str,
        per_call_s: float,
        *,
        baseline_s: float | None = None,
        target_us: float | None = None,
        ours: bool = True,
        note: str = "",
        target_text: str | None = None,
        met: bool | None = None,
    ) -> Row:
        """Add a row; overhead and target check are computed from ``baseline_s``."""
        overhead = None if baseline_s is None else (per_call_s - baseline_s) * 1e6
        if met is None and target_us is not None and overhead is not None:
            met = overhead <= target_us
        target = target_text or (f"<= {target_us:g} µs" if target_us is not None else "")
        row = Row(name, per_call_s * 1e6, overhead, target, met, note, ours)
        self.rows.append(row)
        return row

    def add_count(
        self,
        name: str,
        value: float,
        *,
        baseline: float | None = None,
        ours: bool = True,
        note: str = "",
    ) -> Row:
        """Add a row already in the section's ``unit`` (a count, not a time)."""
        overhead = None if baseline is None else value - baseline
        row = Row(name, value, overhead, "", None, note, ours)
        self.rows.append(row)
        return row


class Report:
    """Collects sections from every benchmark module and renders RESULTS.md."""

    def __init__(self, quick: bool = False) -> None:
        self.quick = quick
        self.rounds = _rounds(quick)
        self.sections: list[Section] = []

    def section(self, title: str, baseline: str, *, unit: str = "µs") -> Section:
        """Start a new table (``unit``: what its per-call column counts)."""
        section = Section(title, baseline, unit=unit)
        self.sections.append(section)
        return section

    def render(self, header: str) -> str:
        """The markdown document."""
        out = [header]
        for section in self.sections:
            out.append(f"\n## {section.title}\n")
            out.append(f"Baseline: {section.baseline}. Overhead = case − baseline, same run.\n")
            unit = section.unit
            out.append(f"| case | per call ({unit}) | overhead ({unit}) | target | met | note |")
            out.append("|---|---:|---:|---|:-:|---|")
            for row in section.rows:
                # Baselines ("bare call", "bare Starlette app") are nobody's: plain.
                bold = row.ours and not row.name.startswith("bare ")
                name = f"**{row.name}**" if bold else row.name
                overhead = "" if row.overhead_us is None else f"{row.overhead_us:+.2f}"
                met = (
                    ("no verdict" if row.target else "")
                    if row.met is None
                    else ("yes" if row.met else "**no**")
                )
                out.append(
                    f"| {name} | {row.per_call_us:.2f} | {overhead} | {row.target} | {met} "
                    f"| {row.note} |"
                )
            for note in section.notes:
                out.append(f"\n{note}")
        return "\n".join(out) + "\n"
