"""ASGI middleware (issue 6): per-request overhead in process, and req/s under uvicorn + wrk.

In process (no socket): each case calls an ASGI app directly with a fresh scope and
no-op ``receive``/``send``, so the difference to the bare app is the middleware's
own cost. Ours: :class:`RateLimitMiddleware` with an in-memory ``RateLimiter`` (never
refusing) and IETF headers on. Peers, in the same run: slowapi's decorator (needs a
``request`` parameter on the endpoint), its ``SlowAPIASGIMiddleware`` and its
``SlowAPIMiddleware`` (a Starlette ``BaseHTTPMiddleware``), all with headers enabled.

Under uvicorn (loopback, one worker per app, httptools when installed): ``wrk`` for a
few seconds per app after a one-second warm-up, apps interleaved round by round; the
median of each app's req/s and of its per-round ratio to the bare app, plus the
server's CPU time per request. Skipped with a note when ``wrk`` is missing (Debian:
``apt-get install wrk``).

Under uvicorn and callgrind: the instructions the server executes per request, a count
that machine noise cannot move, so it resolves differences the req/s table cannot.

Every table has a floor row, :class:`ConstantFields`: the same two response fields,
precomputed, with no limiter at all. What it costs, any limiter that sends the fields
costs too.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import Report, measure_async, median_interval

#: Never refuses, and every request finds its bucket full again: the lean path.
HUGE = "1000000000/second"
SLOWAPI_HUGE = "1000000000/second"
#: Never refuses within a run either, but each request takes a token from a bucket that
#: refills slowly: the path of a client that is using its quota (state changes, fields
#: rendered per request). Slowly enough for a server under callgrind too (a few hundred
#: requests a second there): at 10,000,000/hour it refilled faster than that and every
#: request found its bucket full, the lean path, in the instruction-count table.
DRAINING = "10000000/day"


# -- the apps ------------------------------------------------------------------------------


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI app: the floor every case is compared to."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})


def ours_raw() -> Any:
    from resilience.asgi import RateLimitMiddleware
    from resilience.ratelimit import RateLimiter

    return RateLimitMiddleware(raw_app, limiter=RateLimiter(HUGE))


class ConstantFields:
    """The floor of any limiter that answers with rate-limit fields: a pure ASGI
    middleware adding the two IETF fields RateLimitMiddleware sends here, precomputed
    (no key, no limiter, no arithmetic). What it costs is the price of the fields
    themselves: wrapping ``send`` and the server writing two more header lines."""

    def __init__(self, app: Any) -> None:
        from resilience.asgi._headers import RateLimitHeaders
        from resilience.ratelimit import RateLimiter

        limiter = RateLimiter(HUGE)
        self.app = app
        self.fields = RateLimitHeaders("default", limiter, "ietf").admitted_values(
            int(limiter.burst) - 1, 1e-6
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        fields = self.fields

        def send_with_fields(message: dict[str, Any]) -> Any:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *fields]
            return send(message)

        await self.app(scope, receive, send_with_fields)


def starlette_app(middleware: list[Any] | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", home)], middleware=middleware or [])


def constant_fields_starlette() -> Any:
    from starlette.middleware import Middleware

    return starlette_app([Middleware(ConstantFields)])


def _ours(build: Callable[[list[Any]], Any], headers: str = "ietf", rate: str = HUGE) -> Any:
    """The app ``build`` makes, with RateLimitMiddleware (memory backend) in front."""
    from starlette.middleware import Middleware

    from resilience.asgi import RateLimitMiddleware
    from resilience.ratelimit import RateLimiter

    return build([Middleware(RateLimitMiddleware, limiter=RateLimiter(rate), headers=headers)])


def ours_starlette(headers: str = "ietf") -> Any:
    return _ours(starlette_app, headers)


def ours_starlette_no_fields() -> Any:
    return ours_starlette(headers="none")


def ours_starlette_draining() -> Any:
    return _ours(starlette_app, rate=DRAINING)


def _slowapi_limiter(**kwargs: Any) -> Any:
    from slowapi import Limiter
    from slowapi.util import get_remote_address

    return Limiter(key_func=get_remote_address, headers_enabled=True, **kwargs)


def slowapi_decorator() -> Any:
    from slowapi import _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    limiter = _slowapi_limiter()

    @limiter.limit(SLOWAPI_HUGE)
    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", home)])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    return app


def _slowapi_middleware(kind: str, build: Callable[[list[Any]], Any] | None = None) -> Any:
    """The app ``build`` makes (default: the Starlette one), with slowapi's middleware."""
    from slowapi import _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware, SlowAPIMiddleware
    from starlette.middleware import Middleware

    limiter = _slowapi_limiter(default_limits=[SLOWAPI_HUGE])
    cls = SlowAPIASGIMiddleware if kind == "asgi" else SlowAPIMiddleware
    app = (starlette_app if build is None else build)([Middleware(cls)])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    return app


def slowapi_asgi() -> Any:
    return _slowapi_middleware("asgi")


def slowapi_base_http() -> Any:
    return _slowapi_middleware("base")


def bare_starlette() -> Any:
    return starlette_app()


def fastapi_app(middleware: list[Any] | None = None) -> Any:
    """A FastAPI app with one JSON endpoint: the common deployment of a rate limiter."""
    from fastapi import FastAPI

    app = FastAPI(middleware=middleware or [])

    @app.get("/")
    async def home() -> dict[str, bool]:
        return {"ok": True}

    return app


def bare_fastapi() -> Any:
    return fastapi_app()


def ours_fastapi() -> Any:
    return _ours(fastapi_app)


def slowapi_asgi_fastapi() -> Any:
    return _slowapi_middleware("asgi", fastapi_app)


# -- in process ----------------------------------------------------------------------------

_SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/",
    "raw_path": b"/",
    "root_path": "",
    "query_string": b"",
    "headers": [(b"host", b"127.0.0.1"), (b"user-agent", b"bench")],
    "client": ("127.0.0.1", 40000),
    "server": ("127.0.0.1", 8000),
}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Any) -> None:
    return None


def _case(app: Any) -> Callable[[], Any]:
    scope = _SCOPE

    def run() -> Any:
        return app(dict(scope), _receive, _send)

    return run


#: Distinct client addresses of the many-clients rows: more than the key-digest memo
#: holds (8192), so every request hashes its client's address, as on a busy server.
CLIENTS = 10_000


def _clients_case(app: Any) -> Callable[[], Any]:
    """Like :func:`_case`, each request from the next of :data:`CLIENTS` addresses."""
    scopes = [
        {**_SCOPE, "client": (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 40000)}
        for i in range(CLIENTS)
    ]
    turn = itertools.cycle(scopes).__next__

    def run() -> Any:
        return app(dict(turn()), _receive, _send)

    return run


def _check(app: Any) -> None:
    """Make sure every case answers 200 with its rate-limit headers (fair comparison)."""
    import asyncio

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(app(dict(_SCOPE), _receive, send))
    start = sent[0]
    assert start["status"] == 200, start
    names = {k.lower() for k, _ in start["headers"]}
    assert names & {b"ratelimit", b"x-ratelimit-limit", b"x-ratelimit-remaining"}, names


def _in_process(report: Report, quick: bool) -> None:
    apps = {
        "bare ASGI app": raw_app,
        "RateLimitMiddleware(bare ASGI app)": ours_raw(),
        "bare Starlette app": bare_starlette(),
        "Starlette + the two fields, constant (no limiter)": constant_fields_starlette(),
        "Starlette + RateLimitMiddleware": ours_starlette(),
        "Starlette + RateLimitMiddleware, draining bucket": ours_starlette_draining(),
        "Starlette + slowapi @limiter.limit decorator": slowapi_decorator(),
        "Starlette + slowapi SlowAPIASGIMiddleware": slowapi_asgi(),
        "Starlette + slowapi SlowAPIMiddleware (BaseHTTPMiddleware)": slowapi_base_http(),
    }
    for name, app in apps.items():
        if name.startswith("bare"):
            continue
        _check(app)
    many = f", {CLIENTS:,} clients"
    cases = {name: _case(app) for name, app in apps.items()}
    # The same apps (their state included) with requests from many distinct clients.
    for name in (
        "bare Starlette app",
        "Starlette + RateLimitMiddleware",
        "Starlette + slowapi @limiter.limit decorator",
    ):
        cases[name + many] = _clients_case(apps[name])
    number = 2_000 if quick else 10_000
    results = measure_async(cases, number=number, rounds=report.rounds)
    raw = results["bare ASGI app"]
    starlette = results["bare Starlette app"]
    section = report.section(
        "ASGI rate limiting, in-process overhead per request (issue 6)",
        "the same app without rate limiting (bare ASGI app / bare Starlette app)",
    )
    section.add("bare ASGI app", raw, ours=True)
    section.add(
        "RateLimitMiddleware(bare ASGI app)",
        results["RateLimitMiddleware(bare ASGI app)"],
        baseline_s=raw,
        target_us=3.0,
        note="memory backend, IETF headers on",
    )
    section.add("bare Starlette app", starlette, ours=True)
    section.add(
        "Starlette + the two fields, constant (no limiter)",
        results["Starlette + the two fields, constant (no limiter)"],
        baseline_s=starlette,
        ours=False,
        note="floor: what sending the fields costs",
    )
    section.add(
        "Starlette + RateLimitMiddleware",
        results["Starlette + RateLimitMiddleware"],
        baseline_s=starlette,
        target_us=3.0,
        note="memory backend, IETF headers on; each request finds its bucket full",
    )
    section.add(
        "Starlette + RateLimitMiddleware, draining bucket",
        results["Starlette + RateLimitMiddleware, draining bucket"],
        baseline_s=starlette,
        target_us=3.0,
        note=f'the same at "{DRAINING}": each request takes a token (fields rendered each time)',
    )
    for name in (
        "Starlette + slowapi @limiter.limit decorator",
        "Starlette + slowapi SlowAPIASGIMiddleware",
        "Starlette + slowapi SlowAPIMiddleware (BaseHTTPMiddleware)",
    ):
        section.add(name, results[name], baseline_s=starlette, ours=False, note="headers_enabled")
    starlette_many = results["bare Starlette app" + many]
    section.add("bare Starlette app" + many, starlette_many, ours=True)
    section.add(
        "Starlette + RateLimitMiddleware" + many,
        results["Starlette + RateLimitMiddleware" + many],
        baseline_s=starlette_many,
        target_us=3.0,
        note="each request from the next of the addresses: a bucket and a key digest each",
    )
    section.add(
        "Starlette + slowapi @limiter.limit decorator" + many,
        results["Starlette + slowapi @limiter.limit decorator" + many],
        baseline_s=starlette_many,
        ours=False,
        note="headers_enabled",
    )
    ours_overhead = results["Starlette + RateLimitMiddleware"] - starlette
    peer_overhead = results["Starlette + slowapi @limiter.limit decorator"] - starlette
    ours_many = results["Starlette + RateLimitMiddleware" + many] - starlette_many
    peer_many = results["Starlette + slowapi @limiter.limit decorator" + many] - starlette_many
    section.notes.append(
        "Each call builds a fresh scope dict and runs the app to completion in one asyncio "
        "loop; no socket, no HTTP parsing. slowapi uses its default in-memory storage. "
        "Rows without a client count send every request from one client address; the "
        f"'{CLIENTS:,} clients' rows cycle through that many (more than the middleware's "
        "key-digest memo holds, so each request hashes its key). RateLimitMiddleware "
        f"costs {ours_overhead / peer_overhead:.1%} of the slowapi decorator's overhead "
        f"with one client and {ours_many / peer_many:.1%} with {CLIENTS:,} (a "
        "load-independent view when the machine is busy)."
    )


# -- uvicorn + wrk ---------------------------------------------------------------------------

#: The apps served by uvicorn: row name -> factory in this module. Each row is compared
#: with the bare app of its framework (:func:`_bare_of`).
SERVED = {
    "bare Starlette app": "bare_starlette",
    "Starlette + the two fields, constant (no limiter)": "constant_fields_starlette",
    "Starlette + RateLimitMiddleware": "ours_starlette",
    "Starlette + RateLimitMiddleware, draining bucket": "ours_starlette_draining",
    'Starlette + RateLimitMiddleware, headers="none"': "ours_starlette_no_fields",
    "Starlette + slowapi SlowAPIASGIMiddleware": "slowapi_asgi",
    "Starlette + slowapi @limiter.limit decorator": "slowapi_decorator",
    "bare FastAPI app (JSON endpoint)": "bare_fastapi",
    "FastAPI + RateLimitMiddleware": "ours_fastapi",
    "FastAPI + slowapi SlowAPIASGIMiddleware": "slowapi_asgi_fastapi",
}

#: The rows that carry issue 6's ">= 0.9x bare" target.
TARGETED = (
    "Starlette + RateLimitMiddleware",
    "Starlette + RateLimitMiddleware, draining bucket",
    "FastAPI + RateLimitMiddleware",
)


def _bare_of(name: str) -> str:
    """The row ``name`` is compared with: the bare app of the same framework."""
    return (
        "bare FastAPI app (JSON endpoint)"
        if name.startswith(("FastAPI", "bare FastAPI"))
        else "bare Starlette app"
    )


def _is_ours(name: str) -> bool:
    return "slowapi" not in name and "constant" not in name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_impl() -> str:
    """uvicorn's HTTP parser: httptools (what ``uvicorn[standard]`` deploys) when present."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _start_uvicorn(
    factory: str,
    *,
    wrapper: tuple[str, ...] = (),
    startup_s: float = 15,
    module: str = "benchmarks.bench_asgi",
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen(
        [
            *wrapper,
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            f"{module}:{factory}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--http",
            _http_impl(),
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stderr=subprocess.DEVNULL if wrapper else None,
    )
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"uvicorn ({factory}) did not start")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wrk(port: int, seconds: int) -> tuple[float, int]:
    """``(requests per second, requests)`` of one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", "-c32", f"-d{seconds}s", f"http://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        check=True,
    ).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if non_2xx:
        raise RuntimeError(f"wrk saw {non_2xx.group(1)} error responses:\n{out}")
    rate = re.search(r"Requests/sec:\s*([0-9.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rate is None or count is None:
        raise RuntimeError(f"cannot read wrk output:\n{out}")
    return float(rate.group(1)), int(count.group(1))


def ratio_verdict(ratios: list[float], target: float) -> bool | None:
    """Whether the per-round ratios' median reaches ``target``: ``True`` when its 90%
    interval (:func:`median_interval`) lies at or above ``target``, ``False`` when it lies
    below, ``None`` when it straddles ``target`` (this run cannot tell)."""
    low, high = median_interval(ratios)
    if low >= target:
        return True
    if high < target:
        return False
    return None


def _uvicorn(report: Report, quick: bool) -> None:
    section = report.section(
        "ASGI rate limiting under uvicorn + wrk on loopback (issue 6)",
        "the bare app of the same framework under the same server, same run",
    )
    if shutil.which("wrk") is None:
        section.notes.append(
            "Skipped: `wrk` is not installed (Debian: `apt-get install -y wrk`; the benchmark "
            "target installs it when it can)."
        )
        return
    factories = SERVED
    seconds = 2
    rounds = 4 if quick else 8
    servers = {}
    try:
        for name, factory in factories.items():
            servers[name] = _start_uvicorn(factory)
        rps: dict[str, list[float]] = {name: [] for name in factories}
        ratios: dict[str, list[float]] = {name: [] for name in factories}
        cpu: dict[str, list[float]] = {name: [] for name in factories}
        for _ in range(rounds):
            # One short run per app, interleaved: background load hits a round evenly,
            # so the ratio to the bare app of the *same round* is the robust number.
            measured: dict[str, float] = {}
            for name, (process, port) in servers.items():
                # A server idle while the others ran starts its turn slower (seen here:
                # 5-10% lower req/s in its first seconds): warm it up, then measure.
                _wrk(port, 1)
                before = _cpu_seconds(process.pid)
                measured[name], requests = _wrk(port, seconds)
                cpu[name].append((_cpu_seconds(process.pid) - before) / requests)
            for name, value in measured.items():
                rps[name].append(value)
                ratios[name].append(value / measured[_bare_of(name)])
    finally:
        for process, _ in servers.values():
            process.terminate()
        for process, _ in servers.values():
            process.wait(10)
    for name in factories:
        median_rps = statistics.median(rps[name])
        ratio = statistics.median(ratios[name])
        low, high = median_interval(ratios[name])
        server_cpu = statistics.median(cpu[name])
        bare_cpu = statistics.median(cpu[_bare_of(name)])
        target = ">= 0.9x bare" if name in TARGETED else ""
        section.add(
            name,
            1.0 / median_rps,
            ours=_is_ours(name),
            target_text=target,
            met=ratio_verdict(ratios[name], 0.9) if target else None,
            note=(
                f"{median_rps:,.0f} req/s, {ratio:.3f}x bare"
                + (
                    ""
                    if name.startswith("bare")
                    else f" (90% interval {low:.3f}-{high:.3f}; rounds "
                    f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f})"
                )
                + f"; server CPU {server_cpu * 1e6:.0f} µs/request "
                f"({bare_cpu / server_cpu:.2f}x bare)"
            ),
        )
    section.notes.append(
        f"`wrk -t1 -c32 -d{seconds}s` against one uvicorn worker per app ({_http_impl()}, no "
        f"access log), each run after a 1 s warm-up run, {rounds} interleaved rounds; medians "
        "of req/s and of the per-round ratio to the bare app. 'per call' is 1 / req/s. Every "
        "request comes from 127.0.0.1, one client key (see the in-process table for many "
        "clients). Client and servers share the machine's cores, so req/s moves with other "
        "load; the "
        "instruction counts below do not. A target is met when the 90% interval of the "
        "median ratio (distribution-free, from the rounds) lies at or above it, missed when "
        "the interval lies below it; an interval that straddles it gets no verdict: the "
        "run cannot tell."
    )


# -- uvicorn under callgrind ---------------------------------------------------------------

_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: bench\r\n\r\n"


def _requests(port: int, count: int) -> None:
    """``count`` GET requests, one after another on one keep-alive connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        pending = b""
        for _ in range(count):
            sock.sendall(_REQUEST)
            while b"\r\n\r\n" not in pending:
                pending += sock.recv(65536)
            head, _, pending = pending.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected response: {head!r}")
            found = re.search(rb"(?i)content-length: *(\d+)", head)
            if found is None:
                raise RuntimeError(f"no content-length: {head!r}")
            length = int(found.group(1))
            while len(pending) < length:
                pending += sock.recv(65536)
            pending = pending[length:]


def _instructions_per_request(factory: str, requests: int, out: Path) -> float:
    """Instructions the server process executes per request, counted by callgrind.

    The server starts under valgrind with counting off; after a warm-up, counting is
    switched on for exactly ``requests`` requests on one connection, then dumped.
    """
    process, port = _start_uvicorn(
        factory,
        wrapper=(
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
        ),
        startup_s=120,
    )
    try:
        _requests(port, 300)
        pid = str(process.pid)
        control = ["callgrind_control"]
        subprocess.run([*control, "-i", "on", pid], check=True, capture_output=True, timeout=60)
        _requests(port, requests)
        subprocess.run([*control, "-i", "off", pid], check=True, capture_output=True, timeout=60)
        subprocess.run([*control, "-d", pid], check=True, capture_output=True, timeout=120)
    finally:
        process.terminate()
        process.wait(60)
    totals = [
        int(match.group(1))
        for dump in out.parent.glob(out.name + "*")
        for match in re.finditer(r"^totals: (\d+)$", dump.read_text(), re.MULTILINE)
    ]
    return max(totals) / requests


def _callgrind(report: Report, quick: bool) -> None:
    section = report.section(
        "ASGI rate limiting under uvicorn: server instructions per request (issue 6)",
        "the bare app of the same framework under the same server",
        unit="k instructions",
    )
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        section.notes.append(
            "Skipped: valgrind is not installed (Debian: `apt-get install -y valgrind`)."
        )
        return
    factories = SERVED
    requests = 1_000 if quick else 3_000
    counts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, factory in factories.items():
            counts[name] = _instructions_per_request(
                factory, requests, Path(tmp) / f"{factory}.callgrind"
            )
    for name, count in counts.items():
        bare = counts[_bare_of(name)]
        section.add_count(
            name,
            count / 1000,
            baseline=None if name.startswith("bare") else bare / 1000,
            ours=_is_ours(name),
            note="" if name.startswith("bare") else f"{bare / count:.3f}x bare",
        )
    section.notes.append(
        f"`valgrind --tool=callgrind`, counting switched on for {requests:,} sequential "
        "keep-alive requests after a warm-up; every instruction of the server process "
        "(uvicorn, httptools, Starlette, the middleware, the kernel calls' user side). A "
        "count, not a time: the same on a busy or an idle machine, so it shows what the "
        "req/s table above cannot resolve through its noise. 'x bare' is the bare count "
        "over the case's: the req/s ratio the server would reach if every instruction took "
        "the same time (header-writing C code runs faster than interpreted Python, so the "
        "constant-fields floor usually costs less time than its count suggests)."
    )


def run(report: Report, quick: bool) -> None:
    """Entry point for ``python -m benchmarks``."""
    _in_process(report, quick)
    _uvicorn(report, quick)
    _callgrind(report, quick)
