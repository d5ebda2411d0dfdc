"""Outbound HTTP (issue 8): ResilientTransport's overhead over the bare inner transport.

The inner transport is an ``httpx.MockTransport`` answering a prebuilt 200 with the
headers of a typical API response, so the numbers are the transport's own cost per
request: the host lookup, the retry budget's bookkeeping, the deadline check, the scan
of the response for server signals and, when configured, the per-host policies. Each
case calls ``transport.handle_request(request)`` (or ``handle_async_request``) directly.

Peer: what people glue by hand today around the same inner transport: sync, tenacity +
a per-host semaphore dict + a per-host pybreaker; async, tenacity + a per-host
asyncio.Semaphore dict (pybreaker's async support needs tornado).
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable

import httpx
import pybreaker
import tenacity

from resilience.breaker import CircuitBreaker
from resilience.bulkhead import Bulkhead
from resilience.httpx import ResilientTransport, host_key
from resilience.ratelimit import RateLimiter

from ._harness import Report, measure, measure_async

TARGET_US = 5.0

_HEADERS = {
    "content-type": "application/json",
    "content-length": "2",
    "date": "Tue, 14 Nov 2023 22:13:20 GMT",
    "server": "nginx",
    "cache-control": "no-store",
}


def _inner() -> httpx.MockTransport:
    response = httpx.Response(200, headers=_HEADERS, content=b"{}")
    return httpx.MockTransport(lambda request: response)


def _policies() -> dict[str, object]:
    return {
        "bulkhead": Bulkhead(100),
        "limiter": RateLimiter("1000000000/s"),
        "breaker": CircuitBreaker(key=host_key),
    }


def _glue_sync(inner: httpx.MockTransport) -> Callable[[httpx.Request], httpx.Response]:
    semaphores: defaultdict[str, threading.BoundedSemaphore] = defaultdict(
        lambda: threading.BoundedSemaphore(100)
    )
    breakers: defaultdict[str, pybreaker.CircuitBreaker] = defaultdict(pybreaker.CircuitBreaker)

    @tenacity.retry(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_random_exponential(),
        retry=tenacity.retry_if_exception_type(httpx.TransportError),
        reraise=True,
    )
    def send(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        with semaphores[host]:
            return breakers[host].call(inner.handle_request, request)  # type: ignore[no-any-return]

    return send


def _glue_async(
    inner: httpx.MockTransport,
) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    semaphores: defaultdict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(100))

    @tenacity.retry(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_random_exponential(),
        retry=tenacity.retry_if_exception_type(httpx.TransportError),
        reraise=True,
    )
    async def send(request: httpx.Request) -> httpx.Response:
        async with semaphores[request.url.host]:
            return await inner.handle_async_request(request)

    return send


def run(report: Report, quick: bool) -> None:
    """Sync and async overhead per request, ours and the hand-glued peer, one run."""
    number = 3_000 if quick else 10_000
    request = httpx.Request("GET", "https://api.example.com/v1/items")

    bare = _inner()
    default = ResilientTransport(_inner())
    full = ResilientTransport(_inner(), **_policies())  # type: ignore[arg-type]
    glued = _glue_sync(_inner())
    sync_cases: dict[str, Callable[[], object]] = {
        "bare MockTransport.handle_request": lambda: bare.handle_request(request),
        "ResilientTransport() (retries, budget, server signals, deadline)": (
            lambda: default.handle_request(request)
        ),
        "ResilientTransport(bulkhead=, limiter=, breaker=)": lambda: full.handle_request(request),
        "tenacity.retry + semaphore dict + pybreaker dict (hand glue)": lambda: glued(request),
    }
    results = measure(sync_cases, number=number, rounds=report.rounds)
    baseline = results["bare MockTransport.handle_request"]
    section = report.section(
        "Outbound HTTP transport, sync (issue 8)", "`MockTransport.handle_request` of a 200"
    )
    for name, value in results.items():
        ours = name.startswith("ResilientTransport")
        section.add(
            name,
            value,
            baseline_s=baseline,
            target_us=TARGET_US if name.startswith("ResilientTransport()") else None,
            ours=ours or name.startswith("bare"),
            note="includes the policies' own cost" if "bulkhead=" in name else "",
        )

    abare = _inner()
    adefault = ResilientTransport(_inner())
    afull = ResilientTransport(_inner(), **_policies())  # type: ignore[arg-type]
    ahedged = ResilientTransport(_inner(), hedge=1.0)
    aglued = _glue_async(_inner())
    async_cases: dict[str, Callable[[], Awaitable[object]]] = {
        "bare MockTransport.handle_async_request": lambda: abare.handle_async_request(request),
        "ResilientTransport() (retries, budget, server signals, deadline)": (
            lambda: adefault.handle_async_request(request)
        ),
        "ResilientTransport(bulkhead=, limiter=, breaker=)": (
            lambda: afull.handle_async_request(request)
        ),
        "ResilientTransport(hedge=1.0), answer before the hedge": (
            lambda: ahedged.handle_async_request(request)
        ),
        "tenacity.retry + asyncio.Semaphore dict (hand glue)": lambda: aglued(request),
    }
    results = measure_async(async_cases, number=number, rounds=report.rounds)
    baseline = results["bare MockTransport.handle_async_request"]
    section = report.section(
        "Outbound HTTP transport, async on asyncio (issue 8)",
        "`await MockTransport.handle_async_request` of a 200",
    )
    notes = {
        "ResilientTransport(bulkhead=, limiter=, breaker=)": "includes the policies' own cost",
        "ResilientTransport(hedge=1.0), answer before the hedge": "a task group per request",
    }
    for name, value in results.items():
        ours = name.startswith("ResilientTransport")
        section.add(
            name,
            value,
            baseline_s=baseline,
            target_us=TARGET_US if name.startswith("ResilientTransport()") else None,
            ours=ours or name.startswith("bare"),
            note=notes.get(name, ""),
        )
    section.notes.append(
        "Target (issue 8): <= 5 µs per request over the bare inner transport, sync and async, "
        "for the transport itself (default configuration). Rows with per-host policies add "
        "the bulkhead's, limiter's and breaker's own admitted-path costs (see their sections)."
    )
