"""Load shedding by event-loop lag (``ConcurrencyLimitMiddleware(max_loop_lag=...)``).

A uvicorn server whose handler runs 4 ms of CPU, behind ``ConcurrencyLimitMiddleware``
with ``rs.Bulkhead(64, max_wait=0.5)``, is overloaded by keep-alive clients on
loopback, once without ``max_loop_lag`` and once with 0.1 s, back to back in one run:

* closed loop: 200 connections, each sending its next request as soon as the last is
  answered (a 503 included, so refused clients retry at once);
* open loop: 400 requests a second arriving on 256 connections, each request's latency
  counted from when it was due (a wait for a free connection included).

Reported: the clients' p50 and p99 latency of admitted (200) requests, the 200
responses served and the requests refused per second. Skipped when uvicorn is not installed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ._harness import Report

#: CPU each request costs the server (seconds), and the shedding bound under test.
HANDLER_CPU = 0.004
BOUND = 0.1
_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def _cpu_handler(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    end = time.perf_counter() + HANDLER_CPU
    while time.perf_counter() < end:
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})


def _app(max_loop_lag: float | None) -> Any:
    import resilience as rs
    from resilience.asgi import ConcurrencyLimitMiddleware

    return ConcurrencyLimitMiddleware(
        _cpu_handler, bulkhead=rs.Bulkhead(64, max_wait=0.5), max_loop_lag=max_loop_lag
    )


def count_only() -> Any:
    """The server without lag shedding (a uvicorn ``--factory``)."""
    return _app(None)


def with_lag_shedding() -> Any:
    """The server with ``max_loop_lag=0.1`` (a uvicorn ``--factory``)."""
    return _app(BOUND)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """One request on a keep-alive connection; its status."""
    writer.write(_REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return int(head[9:12])


async def _load(
    port: int, mode: str, connections: int, duration: float, warmup: float
) -> tuple[list[float], int, int, float]:
    """Latencies of the admitted requests due in the window, responses served within
    it, refusals, and the window's length (seconds)."""
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    clock = time.perf_counter
    start = clock()
    stop = start + duration
    admitted: list[float] = []
    refused = 0
    served = 0  # responses (200) completed within the measured window

    def record(due: float, status: int) -> None:
        nonlocal refused, served
        now = clock()
        if status == 200 and start + warmup <= now <= stop:
            served += 1
        if due - start < warmup:
            return
        if status == 200:
            admitted.append(now - due)
        else:
            refused += 1

    if mode == "closed":

        async def client() -> None:
            reader, writer = await pool.get()
            while clock() < stop:
                sent = clock()
                record(sent, await _exchange(reader, writer))

        await asyncio.gather(*(client() for _ in range(connections)))
    else:
        rate = float(mode)

        async def request(due: float) -> None:
            reader, writer = await pool.get()  # a wait for a connection is latency too
            record(due, await _exchange(reader, writer))
            pool.put_nowait((reader, writer))

        tasks = []
        for n in range(int(rate * duration)):
            due = start + n / rate
            if due > clock():
                await asyncio.sleep(due - clock())
            tasks.append(asyncio.ensure_future(request(due)))
        await asyncio.wait(tasks, timeout=30)
    while not pool.empty():
        pool.get_nowait()[1].close()
    return admitted, served, refused, duration - warmup


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def run(report: Report, quick: bool) -> None:
    """Entry point for ``python -m benchmarks``."""
    section = report.section(
        "ASGI load shedding by event-loop lag, uvicorn overloaded (issue 6)",
        "the same server without max_loop_lag, same run",
        unit="ms, admitted p50",
    )
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        section.notes.append("Skipped: uvicorn is not installed.")
        return
    from .bench_asgi import _start_uvicorn

    duration, warmup = (5.0, 1.0) if quick else (12.0, 3.0)
    loads = {
        "200 connections, closed loop": ("closed", 200),
        "400 requests/s arriving, 256 connections": ("400", 256),
    }
    for load, (mode, connections) in loads.items():
        baseline: float | None = None
        for factory, label in (
            ("count_only", "in-flight cap only"),
            ("with_lag_shedding", f"+ max_loop_lag={BOUND:g}"),
        ):
            process, port = _start_uvicorn(factory, module="benchmarks.bench_shedding")
            try:
                admitted, served, refused, window = asyncio.run(
                    _load(port, mode, connections, duration, warmup)
                )
            finally:
                process.terminate()
                process.wait(30)
            p50 = _percentile(admitted, 0.50) * 1000
            p99 = _percentile(admitted, 0.99) * 1000
            section.add_count(
                f"{load}: {label}",
                p50,
                baseline=baseline,
                ours=True,
                note=(
                    f"p99 {p99:,.0f} ms; {served / window:,.0f} served/s, "
                    f"{refused / window:,.0f} refused/s"
                ),
            )
            if baseline is None:
                baseline = p50
    section.notes.append(
        f"A handler that runs {HANDLER_CPU * 1000:g} ms of CPU behind "
        "`ConcurrencyLimitMiddleware(bulkhead=rs.Bulkhead(64, max_wait=0.5))`, one uvicorn "
        f"worker, {duration - warmup:g} s measured after {warmup:g} s of warm-up; "
        "keep-alive clients on loopback in this process. Latency is the clients': from "
        "sending (closed loop) or from when the request was due (open loop) to the end of "
        "its response; without shedding, the open loop's latency grows for as long as the "
        "overload lasts. 'served/s': 200 responses completed within the window. "
        "The in-flight cap alone cannot see this overload: the requests "
        "wait before they reach the middleware, in the server's event loop. Shedding trades "
        "throughput for latency (refused clients of the closed loop retry at once, and "
        "their refusals take a share of the loop)."
    )
