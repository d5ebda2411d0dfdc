"""Circuit breakers (issue 5): CLOSED overhead, OPEN rejection cost, a composed pipeline.

Every wrapped function returns at once, so the numbers are pure policy overhead. The
peers (pybreaker, circuitbreaker, aiobreaker, purgatory; tenacity + pybreaker + limits
for the pipeline) run in the same process, interleaved with ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import aiobreaker
import circuitbreaker
import pybreaker

import resilience as rs
from resilience.breaker import CircuitBreaker, PyBreakerPolicy

from ._harness import Report, measure, measure_async


def _bare() -> int:
    return 1


async def _abare() -> int:
    return 1


def _boom() -> int:
    raise OSError("down")


def _sync_closed(report: Report, number: int) -> None:
    cases: dict[str, Callable[[], object]] = {
        "bare call": _bare,
        "rs.CircuitBreaker() (count window)": CircuitBreaker()(_bare),
        "rs.CircuitBreaker(window_type='time', window=60)": CircuitBreaker(
            window_type="time", window=60
        )(_bare),
        "rs.CircuitBreaker(slow_call=1.0)": CircuitBreaker(slow_call=1.0)(_bare),
        "rs.CircuitBreaker(key=...) per key": _keyed_sync(),
        "rs.breaker.PyBreakerPolicy(pybreaker)": PyBreakerPolicy(pybreaker.CircuitBreaker())(_bare),
        "pybreaker.CircuitBreaker()": pybreaker.CircuitBreaker()(_bare),
        "circuitbreaker.CircuitBreaker()": circuitbreaker.CircuitBreaker()(_bare),
    }
    results = measure(cases, number=number, rounds=report.rounds)
    bare = results["bare call"]
    section = report.section("Circuit breaker, CLOSED state, sync (issue 5)", "a bare call")
    main = "rs.CircuitBreaker() (count window)"
    for name, value in results.items():
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=0.4 if name == main else None,
            ours=name.startswith("rs.") or name == "bare call",
        )
    ours = results[main] - bare
    section.notes.append(
        "CLOSED overhead ratios (peer overhead / ours): "
        + ", ".join(
            f"{name.split('.')[0]} {(results[name] - bare) / ours:.1f}x"
            for name in ("pybreaker.CircuitBreaker()", "circuitbreaker.CircuitBreaker()")
        )
        + ". The CLOSED success path takes no lock: one atomic counter increment."
    )


def _keyed_sync() -> Callable[[], object]:
    breaker = CircuitBreaker(key=lambda host: host)

    @breaker
    def fetch(host: str) -> int:
        return 1

    return lambda: fetch("example.com")


def _async_closed(report: Report, number: int) -> None:
    purgatory_fn = _purgatory_case()
    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "bare call": _abare,
        "rs.CircuitBreaker() (count window)": CircuitBreaker()(_abare),
        "rs.CircuitBreaker(window_type='time', window=60)": CircuitBreaker(
            window_type="time", window=60
        )(_abare),
        "rs.breaker.PyBreakerPolicy(pybreaker) (no tornado)": PyBreakerPolicy(
            pybreaker.CircuitBreaker()
        )(_abare),
        "aiobreaker.CircuitBreaker()": aiobreaker.CircuitBreaker(
            timeout_duration=timedelta(seconds=60)
        )(_abare),
        "circuitbreaker.CircuitBreaker()": circuitbreaker.CircuitBreaker()(_abare),
    }
    if purgatory_fn is not None:
        cases["purgatory AsyncCircuitBreakerFactory"] = purgatory_fn
    results = measure_async(cases, number=number, rounds=report.rounds)
    bare = results["bare call"]
    section = report.section(
        "Circuit breaker, CLOSED state, async on asyncio (issue 5)", "a bare `await`"
    )
    main = "rs.CircuitBreaker() (count window)"
    for name, value in results.items():
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=0.6 if name == main else None,
            ours=name.startswith("rs.") or name == "bare call",
        )
    ours = results[main] - bare
    section.notes.append(
        "CLOSED overhead ratios (peer overhead / ours): "
        + ", ".join(
            f"{name.split(' ')[0].split('.')[0]} {(results[name] - bare) / ours:.1f}x"
            for name in results
            if not name.startswith("rs.") and name != "bare call"
        )
    )


def _purgatory_case() -> Callable[[], Awaitable[object]] | None:
    try:
        import purgatory
    except ImportError:  # pragma: no cover - bench extra missing
        return None
    factory = purgatory.AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=30)
    initialized = False

    @factory("bench")
    async def guarded() -> int:
        return 1

    async def call() -> Any:
        nonlocal initialized
        if not initialized:
            await factory.initialize()
            initialized = True
        return await guarded()

    return call


def _open_rejection(report: Report, number: int) -> None:
    ours = CircuitBreaker(open_for=3600)
    ours.open(seconds=3600)
    ours_fn = ours(_bare)
    py = pybreaker.CircuitBreaker(reset_timeout=3600)
    py.open()
    py_fn = py(_bare)
    cb = circuitbreaker.CircuitBreaker(failure_threshold=1, recovery_timeout=3600)
    cb_fn = cb(_boom)
    try:
        cb_fn()
    except OSError:
        pass

    def caught(fn: Callable[[], object], errors: Any) -> Callable[[], object]:
        def run() -> object:
            try:
                return fn()
            except errors:
                return None

        return run

    cases: dict[str, Callable[[], object]] = {
        "bare raise + except": caught(_boom, OSError),
        "rs.CircuitBreaker (OPEN) raise CircuitOpen": caught(ours_fn, rs.CircuitOpen),
        "pybreaker (open) raise CircuitBreakerError": caught(py_fn, pybreaker.CircuitBreakerError),
        "circuitbreaker (open) raise CircuitBreakerError": caught(
            cb_fn, circuitbreaker.CircuitBreakerError
        ),
    }
    fallback = CircuitBreaker(open_for=3600, fallback="cached")
    fallback.open(seconds=3600)
    cases["rs.CircuitBreaker(fallback=...) (OPEN) returns fallback"] = fallback(_bare)
    results = measure(cases, number=max(number // 4, 1000), rounds=report.rounds)
    base = results["bare raise + except"]
    section = report.section(
        "Circuit breaker, OPEN state: cost of a rejection, sync (issue 5)",
        "a function that raises, caught",
    )
    for name, value in results.items():
        section.add(
            name, value, baseline_s=base, ours=name.startswith("rs.") or name.startswith("bare")
        )
    section.notes.append(
        "A rejection is a raise: it costs what Python charges for raising and catching an "
        "exception, plus the state check. With fallback= the caller gets the degraded value."
    )


def _pipeline(report: Report, number: int) -> None:
    section = report.section(
        "Composed: Pipeline(Retry, CircuitBreaker, RateLimiter), memory, sync (issue 5)",
        "a bare call",
    )
    try:
        from limits import RateLimitItemPerSecond, storage, strategies
        from tenacity import retry, retry_if_exception_type, stop_after_attempt

        ours = rs.Pipeline(
            rs.Retry(on=OSError, attempts=3),
            CircuitBreaker(),
            rs.RateLimiter("1000000000/s"),
        )(_bare)
    except Exception as exc:  # the Retry or RateLimiter area has not landed yet
        section.notes.append(f"Row skipped: the pipeline could not be built ({exc!r}).")
        return

    limiter = strategies.FixedWindowRateLimiter(storage.MemoryStorage())
    item = RateLimitItemPerSecond(1_000_000_000)
    breaker = pybreaker.CircuitBreaker()

    def limited() -> int:
        if not limiter.hit(item, "bench"):
            raise RuntimeError("rate limited")
        return _bare()

    peers = retry(stop=stop_after_attempt(3), retry=retry_if_exception_type(OSError))(
        breaker(limited)
    )
    cases: dict[str, Callable[[], object]] = {
        "bare call": _bare,
        "rs.Pipeline(Retry, CircuitBreaker, RateLimiter)": ours,
        "tenacity + pybreaker + limits (fixed window)": peers,
    }
    results = measure(cases, number=max(number // 4, 1000), rounds=report.rounds)
    bare = results["bare call"]
    for name, value in results.items():
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=2.0 if name.startswith("rs.") else None,
            ours=name.startswith("rs.") or name == "bare call",
        )
    ours_cost = results["rs.Pipeline(Retry, CircuitBreaker, RateLimiter)"] - bare
    peer_cost = results["tenacity + pybreaker + limits (fixed window)"] - bare
    section.notes.append(f"Peer combination overhead / ours: {peer_cost / ours_cost:.1f}x.")


def run(report: Report, quick: bool) -> None:
    """CLOSED overhead (sync, async), OPEN rejection cost and the composed pipeline."""
    number = 5_000 if quick else 20_000
    asyncio.set_event_loop_policy(None)
    _sync_closed(report, number)
    _async_closed(report, number // 2)
    _open_rejection(report, number)
    _pipeline(report, number)
