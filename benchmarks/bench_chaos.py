"""Chaos (issue 7): what a *disabled* ``rs.Faults`` costs in a pipeline.

Fault injection is meant to stay in production code paths, switched off. The question
is whether leaving ``rs.Faults`` innermost in a ``Pipeline`` costs anything when chaos
is off. Each table compares the same pipeline with and without a disabled ``Faults``,
in the same run, with interleaved rounds, next to a second, identical pipeline without
``Faults`` (a control that must pass) and a pipeline with a no-op policy in place of
``Faults`` (what one extra layer costs).

"Within noise" is decided on the paired rounds (every round runs each case back to
back, so machine drift cancels in the differences): the median over rounds of the
difference to the baseline must be less than half of what the no-op layer costs in the
same run: a cost nearer to no layer than to one. The rule is one-sided, since the
question is cost: code left out of the chain cannot make a call faster, and "faster"
differences are layout noise (identical pipelines show up to 0.05 µs either way). A
``Faults`` left out of the chain passes; one in the chain costs at least a layer and
cannot, so the last tables, where it is in the chain, are the control that must fail.
A run too noisy to resolve the no-op layer itself (the 90% interval of its paired cost
reaches zero), or whose identical pipeline fails the rule, gives no verdict. A plain
"is there any difference" test cannot serve: over 25 rounds it can flag two identical
pipelines that differ systematically by a hundredth of a microsecond (seen here: one
slower in 20 of 25 rounds), so the rows show the sign test and the 90% interval of the
median difference for reference only. No peer library ships fault injection, so there
is no peer row.

Until chaos is first switched on in the process, a decorated pipeline leaves a
disabled ``Faults`` out of its chain entirely; switching chaos on splices it in. The
last tables measure the same decorated functions after that moment, when the layer
is in the chain and checks the switch on every call.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import resilience as rs
from resilience import chaos
from resilience._deferred import armed

from ._harness import (
    Report,
    measure,
    measure_async_rounds,
    measure_rounds,
    median_difference_interval,
    sign_test,
)

T = TypeVar("T")


class _NoOp(rs.PolicyBase):
    """The cheapest possible policy layer: what any extra step of a pipeline costs."""

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    async def call_async(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        return await fn(*args, **kwargs)


def _pipelines() -> list[rs.Pipeline]:
    def policies() -> list[rs.Policy]:
        return [rs.Retry(on=OSError, attempts=3, deadline=5.0), rs.Timeout(1.0)]

    faults = rs.Faults(chaos.Latency(0.1, rate=0.1), chaos.Error(ConnectionError, rate=0.1), seed=1)
    return [
        rs.Pipeline(*policies()),
        rs.Pipeline(*policies()),
        rs.Pipeline(*policies(), _NoOp()),
        rs.Pipeline(*policies(), faults),
    ]


def _bare(x: int) -> int:
    return x


async def _abare(x: int) -> int:
    return x


def _difference(samples: dict[str, list[float]], case: str, base: str) -> float:
    """The median over rounds of ``case - base`` (seconds): the paired cost of ``case``."""
    return statistics.median(c - b for c, b in zip(samples[case], samples[base], strict=True))


def _paired(samples: dict[str, list[float]], case: str, base: str) -> str:
    """The paired comparison of ``case`` with ``base``, as the rows' notes show it."""
    slower, n, p = sign_test(samples[case], samples[base])
    low, high = median_difference_interval(samples[case], samples[base])
    return (
        f"paired difference {_difference(samples, case, base) * 1e6:+.3f} µs "
        f"(90% interval {low * 1e6:+.3f} to {high * 1e6:+.3f}); "
        f"slower in {slower}/{n} rounds (sign test p={p:.2f})"
    )


def _rows(
    report: Report,
    title: str,
    samples: dict[str, list[float]],
    names: tuple[str, ...],
    *,
    layer_in: bool,
) -> None:
    results = {name: statistics.median(values) for name, values in samples.items()}
    bare, without, again, noop, with_faults = names
    sec = report.section(title, f"{without!r}, same run")
    base = results[without]
    # The margin is half of what one extra layer costs in this run: a paired cost inside
    # it is nearer to no layer than to one. A run too noisy to resolve the no-op layer
    # itself (its 90% interval reaches zero) cannot tell a layer from none: no verdict.
    layer_low, _ = median_difference_interval(samples[noop], samples[without])
    resolved = layer_low > 0
    margin = _difference(samples, noop, without) / 2

    def within(case: str) -> bool:
        # One-sided: the question is cost. Code left out of the chain cannot make a call
        # faster; "faster" differences are layout noise, like the identical pipeline's.
        return _difference(samples, case, without) < margin

    def verdict(case: str) -> str:
        if not resolved:
            return "no verdict: this run did not resolve one layer"
        return f"{'under' if within(case) else 'not under'} +{margin * 1e6:.3f} µs"

    sec.add(bare, results[bare], baseline_s=base, ours=False, note="the call alone")
    sec.add(without, base, baseline_s=base, note="baseline")
    sec.add(
        again,
        results[again],
        baseline_s=base,
        note=f"identical pipeline (must pass): {verdict(again)}; "
        f"{_paired(samples, again, without)}",
    )
    sec.add(
        noop,
        results[noop],
        baseline_s=base,
        note=f"one extra layer (half its paired cost is the margin): "
        f"{_paired(samples, noop, without)}",
    )
    versus_noop = (results[with_faults] - results[noop]) * 1e6
    paired = _paired(samples, with_faults, without)
    if layer_in:
        sec.add(
            with_faults,
            results[with_faults],
            baseline_s=base,
            note=f"after chaos was on once, the layer is in the chain (must fail): "
            f"{verdict(with_faults)}; "
            f"{paired}; {versus_noop:+.2f} µs vs a no-op layer (difference of medians)",
        )
        return
    sec.add(
        with_faults,
        results[with_faults],
        baseline_s=base,
        target_text="within noise: paired difference under half a no-op layer",
        # The identical pipeline failing its own check means the rule cannot be trusted
        # in this run either way: no verdict.
        met=within(with_faults) if resolved and within(again) else None,
        note=f"chaos never on in this process, the layer is left out: {verdict(with_faults)}"
        + ("" if not resolved or within(again) else " (no verdict: the control failed)")
        + f"; {paired}",
    )


def _measure_both(
    report: Report, pipelines: list[rs.Pipeline], number: int, *, layer_in: bool
) -> None:
    names = (
        "bare call",
        "Pipeline(Retry, Timeout)",
        "Pipeline(Retry, Timeout) again",
        "Pipeline(Retry, Timeout, no-op policy)",
        "Pipeline(Retry, Timeout, Faults) (chaos off)",
    )
    when = " after chaos was on once" if layer_in else ""
    sync_fns = [pipeline(_bare) for pipeline in pipelines]
    cases: dict[str, Callable[[], object]] = {
        names[0]: lambda: _bare(1),
        names[1]: lambda: sync_fns[0](1),
        names[2]: lambda: sync_fns[1](1),
        names[3]: lambda: sync_fns[2](1),
        names[4]: lambda: sync_fns[3](1),
    }
    samples = measure_rounds(cases, number=number, rounds=report.rounds)
    title = f"Chaos: disabled rs.Faults in a sync pipeline{when}"
    _rows(report, title, samples, names, layer_in=layer_in)

    async_fns = [pipeline(_abare) for pipeline in pipelines]
    acases: dict[str, Callable[[], Awaitable[object]]] = {
        names[0]: lambda: _abare(1),
        names[1]: lambda: async_fns[0](1),
        names[2]: lambda: async_fns[1](1),
        names[3]: lambda: async_fns[2](1),
        names[4]: lambda: async_fns[3](1),
    }
    asamples = measure_async_rounds(acases, number=number // 2, rounds=report.rounds)
    title = f"Chaos: disabled rs.Faults in an async pipeline (asyncio){when}"
    _rows(report, title, asamples, names, layer_in=layer_in)


def run(report: Report, quick: bool) -> None:
    number = 5_000 if quick else 20_000
    pipelines = _pipelines()
    assert not armed(), "chaos was switched on earlier in this process"
    _measure_both(report, pipelines, number, layer_in=False)
    with chaos.enabled():  # switch chaos on once: from now on the layer is in the chain
        pass
    _measure_both(report, pipelines, number, layer_in=True)

    # Faults on its own: the whole cost of the layer over a bare call.
    faults = pipelines[-1].policies[-1]
    assert isinstance(faults, rs.Faults)
    alone = faults(_bare)
    lone = measure(
        {"bare call": lambda: _bare(1), "@rs.Faults (chaos off)": lambda: alone(1)},
        number=number,
        rounds=report.rounds,
    )
    sec = report.section("Chaos: a disabled rs.Faults decorator alone", "'bare call'")
    sec.add("bare call", lone["bare call"], baseline_s=lone["bare call"], ours=False)
    sec.add(
        "@rs.Faults (chaos off)",
        lone["@rs.Faults (chaos off)"],
        baseline_s=lone["bare call"],
        note="one wrapper frame + the switch check (a ContextVar.get)",
    )
