"""Hypothesis strategies for fault schedules: let hypothesis search for the failure.

Needs ``hypothesis`` (a test dependency, not a runtime one). Every strategy draws
plain fault descriptions or seeded injectors, so a failing example shrinks to a small
schedule and replays exactly.

Example::

    from hypothesis import given
    from resilience.testing import FakeClock, strategies as rst

    clock = FakeClock()

    @given(faults=rst.faults(clock=clock))
    def test_never_loses_a_call(faults):
        timeout = rs.Timeout(1, clock=clock)
        lookup = rs.Pipeline(rs.Fallback(None, on=Exception), timeout, faults)(real)
        with chaos.enabled():
            lookup("k")                      # a result or None, never an exception
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised without hypothesis
    raise ImportError(
        "resilience.testing.strategies needs hypothesis: pip install hypothesis"
    ) from exc

from .._clock import Clock
from ..chaos import (
    ConnectFailure,
    Error,
    Fault,
    Faults,
    Hang,
    Latency,
    RequestTimeout,
    Result,
    Status,
    Truncate,
    Window,
    exponential,
    uniform,
)
from ..errors import InjectedFault

__all__ = [
    "PROXY_FAULTS",
    "errors",
    "fault_specs",
    "faults",
    "http_faults",
    "latencies",
    "network_phases",
    "proxy_faults",
    "rates",
    "schedules",
    "seeds",
    "windows",
]

#: The kinds of :class:`~resilience.testing.FaultProxy` faults :func:`proxy_faults` draws.
PROXY_FAULTS = ("healthy", "latency", "bandwidth", "blackhole", "refuse", "reset_new")


def seeds() -> st.SearchStrategy[int]:
    """Seeds for injectors (32-bit, like the ones chosen at random).

    Example: ``@given(seed=rst.seeds())``
    """
    return st.integers(min_value=0, max_value=2**32 - 1)


def rates(*, low: float = 0.0, high: float = 1.0) -> st.SearchStrategy[float]:
    """Injection rates in ``[low, high]``, edge values included.

    Example: ``rst.rates(high=0.5)``
    """
    return st.one_of(
        st.sampled_from([x for x in (low, high) if low <= x <= high]),
        st.floats(min_value=low, max_value=high, allow_nan=False),
    )


def windows(
    *,
    horizon: float = 60.0,
    min_length: float = 0.1,
    max_length: float | None = None,
    periodic: bool = False,
) -> st.SearchStrategy[Window]:
    """Time windows starting within ``[0, horizon)``.

    With ``periodic=True`` some windows repeat (``every=``).

    Example: ``@given(window=rst.windows(horizon=10))``
    """
    longest = horizon if max_length is None else max_length

    @st.composite
    def build(draw: st.DrawFn) -> Window:
        start = draw(st.floats(min_value=0.0, max_value=horizon, exclude_max=True))
        length = draw(st.floats(min_value=min_length, max_value=max(min_length, longest)))
        end = start + length
        every = None
        if periodic and draw(st.booleans()):
            span = end - start  # not always == length in floating point
            every = draw(st.floats(min_value=span, max_value=max(span, horizon)))
        return Window(start, end, every)

    return build()


def schedules(
    *, horizon: float = 60.0, max_windows: int = 3, always: bool = True
) -> st.SearchStrategy[tuple[Window, ...] | None]:
    """Schedules: ``None`` (always on, if ``always``) or up to ``max_windows`` windows.

    Example: ``chaos.Error(rate=1.0, schedule=data.draw(rst.schedules()))``
    """
    some = st.lists(windows(horizon=horizon), min_size=1, max_size=max_windows).map(tuple)
    return st.one_of(st.none(), some) if always else some


def latencies(
    *, max_seconds: float = 1.0, rate: st.SearchStrategy[float] | None = None
) -> st.SearchStrategy[Latency]:
    """Latency faults: fixed delays or uniform/exponential distributions up to ``max_seconds``.

    Example: ``rst.latencies(max_seconds=0.3)``
    """
    fixed = st.floats(min_value=0.0, max_value=max_seconds)
    spread = st.builds(
        lambda a, b: uniform(min(a, b), max(a, b)),
        st.floats(min_value=0.0, max_value=max_seconds),
        st.floats(min_value=0.0, max_value=max_seconds),
    )
    tail = st.floats(min_value=0.001, max_value=max(0.001, max_seconds / 2)).map(
        lambda mean: exponential(mean, cap=max_seconds)
    )
    return st.builds(
        lambda seconds, r: Latency(seconds, rate=r),
        st.one_of(fixed, spread, tail),
        rate if rate is not None else rates(),
    )


def errors(
    exceptions: Sequence[type[BaseException]] = (InjectedFault,),
    *,
    rate: st.SearchStrategy[float] | None = None,
) -> st.SearchStrategy[Error]:
    """Error faults raising one of ``exceptions``.

    Example: ``rst.errors([ConnectionError, TimeoutError])``
    """
    return st.builds(
        lambda exc, r: Error(exc, rate=r),
        st.sampled_from(list(exceptions)),
        rate if rate is not None else rates(),
    )


def fault_specs(
    *,
    kinds: Sequence[str] = ("latency", "error", "result", "hang"),
    max_latency: float = 1.0,
    exceptions: Sequence[type[BaseException]] = (InjectedFault,),
    results: st.SearchStrategy[Any] | None = None,
    horizon: float = 60.0,
    hang_block: float = 1.0,
) -> st.SearchStrategy[Fault]:
    """One fault of :class:`resilience.Faults`, of one of ``kinds``, with a schedule.

    Example: ``rst.fault_specs(kinds=("latency", "error"))``
    """
    options: list[st.SearchStrategy[Fault]] = []
    if "latency" in kinds:
        options.append(latencies(max_seconds=max_latency))
    if "error" in kinds:
        options.append(errors(exceptions))
    if "result" in kinds:
        options.append(
            st.builds(
                lambda value, r: Result(value, rate=r),
                results if results is not None else st.none(),
                rates(),
            )
        )
    if "hang" in kinds:
        options.append(st.builds(lambda r: Hang(rate=r, block=hang_block), rates()))
    if not options:
        raise ValueError(f"kinds must name at least one of latency, error, result, hang: {kinds}")
    schedule = schedules(horizon=horizon)
    return st.builds(_with_schedule, st.one_of(options), schedule)


def _with_schedule(fault: Fault, schedule: tuple[Window, ...] | None) -> Fault:
    if schedule is None:
        return fault
    import dataclasses

    return dataclasses.replace(fault, schedule=schedule)


def faults(
    *,
    clock: Clock | None = None,
    kinds: Sequence[str] = ("latency", "error", "result", "hang"),
    max_faults: int = 3,
    max_latency: float = 1.0,
    exceptions: Sequence[type[BaseException]] = (InjectedFault,),
    results: st.SearchStrategy[Any] | None = None,
    horizon: float = 60.0,
    enabled: bool | None = None,
) -> st.SearchStrategy[Faults]:
    """Seeded :class:`resilience.Faults` injectors of 1..``max_faults`` faults on ``clock``.

    Example::

        @given(injector=rst.faults(clock=clock, kinds=("latency", "error")))
        def test_bounded(injector): ...
    """
    specs = st.lists(
        fault_specs(
            kinds=kinds,
            max_latency=max_latency,
            exceptions=exceptions,
            results=results,
            horizon=horizon,
        ),
        min_size=1,
        max_size=max_faults,
    )
    return st.builds(
        lambda items, seed: Faults(*items, seed=seed, clock=clock, enabled=enabled),
        specs,
        seeds(),
    )


def http_faults(
    *, max_latency: float = 1.0, statuses: Sequence[int] = (429, 500, 502, 503, 504)
) -> st.SearchStrategy[Fault]:
    """One fault of :class:`resilience.chaos.FaultyTransport`.

    Example: ``rst.http_faults(statuses=(503,))``
    """
    status = st.builds(
        lambda code, retry_after, r: Status(code, retry_after=retry_after, rate=r),
        st.sampled_from(list(statuses)),
        st.one_of(st.none(), st.integers(min_value=0, max_value=5).map(float)),
        rates(),
    )
    return st.one_of(
        latencies(max_seconds=max_latency),
        status,
        st.builds(lambda r: ConnectFailure(rate=r), rates()),
        st.builds(
            lambda phase, r: RequestTimeout(phase=phase, wait=0.0, rate=r),
            st.sampled_from(["connect", "read", "write", "pool"]),
            rates(),
        ),
        st.builds(
            lambda keep, r: Truncate(keep=keep, rate=r),
            st.floats(min_value=0.0, max_value=0.99),
            rates(),
        ),
    )


def proxy_faults(
    *, kinds: Sequence[str] = PROXY_FAULTS, max_latency: float = 0.5
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for :meth:`FaultProxy.set` describing one network condition.

    Example::

        @given(condition=rst.proxy_faults(kinds=("latency", "blackhole")))
        def test_x(condition): proxy.set(**condition)
    """
    options: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "healthy": st.just({}),
        "latency": st.floats(min_value=0.0, max_value=max_latency).map(lambda s: {"latency": s}),
        "bandwidth": st.integers(min_value=1_000, max_value=1_000_000).map(
            lambda b: {"bandwidth": float(b)}
        ),
        "blackhole": st.just({"blackhole": True}),
        "refuse": st.just({"refuse": True}),
        "reset_new": st.just({"reset_new": True}),
    }
    unknown = set(kinds) - set(options)
    if unknown:
        raise ValueError(f"unknown proxy fault kinds {sorted(unknown)}; use {PROXY_FAULTS}")
    return st.one_of([options[kind] for kind in kinds])


def network_phases(
    *,
    kinds: Sequence[str] = PROXY_FAULTS,
    max_phases: int = 4,
    max_duration: float = 1.0,
    max_latency: float = 0.5,
) -> st.SearchStrategy[list[tuple[float, dict[str, Any]]]]:
    """A network timeline: ``[(seconds, proxy_faults), ...]`` to play on a FaultProxy.

    Play it with ``for seconds, condition in phases: proxy.heal(); proxy.set(**condition);
    drive_calls_for(seconds)``.

    Example: ``@given(phases=rst.network_phases(max_phases=3))``
    """
    phase = st.tuples(
        st.floats(min_value=0.05, max_value=max_duration),
        proxy_faults(kinds=kinds, max_latency=max_latency),
    )
    return st.lists(phase, min_size=1, max_size=max_phases)
