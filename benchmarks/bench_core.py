"""Core policies (issue 2): Retry, Fallback, Pipeline and Timeout against their peers.

Every wrapped function returns at once, so the numbers are pure policy overhead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import backoff as backoff_lib
import stamina
import tenacity

import resilience as rs

from ._harness import Report, measure, measure_async


def _bare() -> int:
    return 1


async def _abare() -> int:
    return 1


def run(report: Report, quick: bool) -> None:
    """Measure sync and async happy paths, ours and the peers, interleaved in one run."""
    number = 5_000 if quick else 20_000
    stamina.set_active(True)

    sync_cases: dict[str, Callable[[], object]] = {
        "bare call": _bare,
        "rs.Retry(on=..., attempts=3, full jitter)": rs.Retry(
            on=ConnectionError, attempts=3, backoff=rs.backoff.full_jitter()
        )(_bare),
        "rs.Fallback": rs.Fallback(0)(_bare),
        "rs.Pipeline(Fallback, Retry)": rs.Pipeline(
            rs.Fallback(0), rs.Retry(on=ConnectionError, attempts=3)
        )(_bare),
        "tenacity @retry(stop_after_attempt(3), wait_random_exponential())": tenacity.retry(
            stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_random_exponential()
        )(_bare),
        "stamina.retry(on=Exception, attempts=3)": stamina.retry(on=Exception, attempts=3)(_bare),
        "backoff.on_exception(expo, Exception, max_tries=3)": backoff_lib.on_exception(
            backoff_lib.expo, Exception, max_tries=3
        )(_bare),
    }
    results = measure(sync_cases, number=number, rounds=report.rounds)
    bare = results["bare call"]
    section = report.section("Core policies, sync (issue 2)", "a bare call of a function")
    targets = {"rs.Retry(on=..., attempts=3, full jitter)": 0.5}
    for name, value in results.items():
        ours = name.startswith("rs.")
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=targets.get(name),
            ours=ours or name == "bare call",
        )
    retry_overhead = results["rs.Retry(on=..., attempts=3, full jitter)"] - bare
    section.notes.append(
        "Retry overhead ratios (peer overhead / ours): "
        + ", ".join(
            f"{peer.split(' ')[0].split('(')[0]} {(results[peer] - bare) / retry_overhead:.1f}x"
            for peer in results
            if not peer.startswith("rs.") and peer != "bare call"
        )
    )

    async def asyncio_timeout() -> int:
        async with asyncio.timeout(10):
            return await _abare()

    async def anyio_fail_after() -> int:
        with anyio.fail_after(10):
            return await _abare()

    async_cases: dict[str, Callable[[], Awaitable[object]]] = {
        "bare call": _abare,
        "rs.Retry(on=..., attempts=3, full jitter)": rs.Retry(
            on=ConnectionError, attempts=3, backoff=rs.backoff.full_jitter()
        )(_abare),
        "rs.Timeout(10)": rs.Timeout(10)(_abare),
        "rs.Fallback": rs.Fallback(0)(_abare),
        "asyncio.timeout(10)": asyncio_timeout,
        "anyio.fail_after(10)": anyio_fail_after,
        "tenacity @retry(stop_after_attempt(3), wait_random_exponential())": tenacity.retry(
            stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_random_exponential()
        )(_abare),
        "stamina.retry(on=Exception, attempts=3)": stamina.retry(on=Exception, attempts=3)(_abare),
        "backoff.on_exception(expo, Exception, max_tries=3)": backoff_lib.on_exception(
            backoff_lib.expo, Exception, max_tries=3
        )(_abare),
    }
    results = measure_async(async_cases, number=number // 2, rounds=report.rounds)
    bare = results["bare call"]
    timeout_peer = results["asyncio.timeout(10)"] - bare
    section = report.section(
        "Core policies, async on asyncio (issue 2)", "a bare `await` of a coroutine function"
    )
    for name, value in results.items():
        ours = name.startswith("rs.")
        target_us = 0.8 if name.startswith("rs.Retry") else None
        kwargs: dict[str, object] = {}
        if name == "rs.Timeout(10)":
            kwargs = {
                "target_text": "<= asyncio.timeout",
                "met": value - bare <= timeout_peer,
            }
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=target_us,
            ours=ours or name == "bare call",
            **kwargs,  # type: ignore[arg-type]
        )
    retry_overhead = results["rs.Retry(on=..., attempts=3, full jitter)"] - bare
    section.notes.append(
        "Retry overhead ratios (peer overhead / ours): "
        + ", ".join(
            f"{peer.split(' ')[0].split('(')[0]} {(results[peer] - bare) / retry_overhead:.1f}x"
            for peer in (
                "tenacity @retry(stop_after_attempt(3), wait_random_exponential())",
                "stamina.retry(on=Exception, attempts=3)",
                "backoff.on_exception(expo, Exception, max_tries=3)",
            )
        )
        + f". Timeout overhead: rs.Timeout {(results['rs.Timeout(10)'] - bare) * 1e6:.2f} µs vs "
        f"asyncio.timeout {timeout_peer * 1e6:.2f} µs vs anyio.fail_after "
        f"{(results['anyio.fail_after(10)'] - bare) * 1e6:.2f} µs."
    )
