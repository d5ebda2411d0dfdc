"""chaos.FaultMiddleware: inbound delays and aborts, by rate or by header; opt-in only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import resilience as rs
from resilience import chaos
from resilience.chaos import FaultMiddleware
from resilience.testing import FakeClock
from tests.asgi._support import serve


async def app(scope: Any, receive: Any, send: Any) -> None:
    """A tiny ASGI app: 200 "hello" for HTTP, records lifespan."""
    if scope["type"] == "lifespan":
        message = await receive()
        assert message["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def client(middleware: FaultMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://t")


def test_refuses_to_start_unless_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without enabled=True or RESILIENCE_CHAOS=1 the constructor raises."""
    monkeypatch.delenv("RESILIENCE_CHAOS", raising=False)
    with pytest.raises(rs.ConfigurationError, match="refuses to start"):
        FaultMiddleware(app)
    with chaos.enabled(), pytest.raises(rs.ConfigurationError):
        FaultMiddleware(app)  # the in-process switch is not an opt-in for real traffic
    for setting in ("false", "0", 0, "", 1, "true"):  # a settings file's text is no switch
        with pytest.raises(rs.ConfigurationError, match="None, True or False"):
            FaultMiddleware(app, enabled=setting)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_enabled_false_passes_every_request_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """``enabled=settings.CHAOS_ENABLED`` (the docstring's example) with the flag off in
    production: the middleware starts and injects nothing, fault headers included,
    even with RESILIENCE_CHAOS=1 (it used to refuse to start)."""
    monkeypatch.setenv("RESILIENCE_CHAOS", "1")
    middleware = FaultMiddleware(app, faults=[chaos.Status(503)], enabled=False)
    async with client(middleware) as c:
        plain = await c.get("/")
        asked = await c.get("/", headers={"x-fault-abort-request": "503"})
    assert [(r.status_code, r.text) for r in (plain, asked)] == [(200, "hello")] * 2
    assert middleware.statistics().injected == {}


def test_every_middleware_refuses_an_app_that_is_not_callable() -> None:
    """``app=None`` fails at construction, not at the first request."""
    from resilience.asgi import ConcurrencyLimitMiddleware, RateLimitMiddleware, TimeoutMiddleware

    builds = [
        lambda: FaultMiddleware(None, enabled=True),
        lambda: RateLimitMiddleware(None, limiter=rs.RateLimiter("1/s")),
        lambda: ConcurrencyLimitMiddleware(None, bulkhead=rs.Bulkhead(1)),
        lambda: TimeoutMiddleware(None, seconds=1),
    ]
    for build in builds:
        with pytest.raises(rs.ConfigurationError, match="app must be callable"):
            build()


def test_environment_variable_enables_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """RESILIENCE_CHAOS=1 at construction is an explicit opt-in."""
    monkeypatch.setenv("RESILIENCE_CHAOS", "1")
    assert isinstance(FaultMiddleware(app), FaultMiddleware)


@pytest.mark.anyio
async def test_requests_pass_through_without_fault_headers() -> None:
    """Headers mode on, no fault headers: the app answers."""
    async with client(FaultMiddleware(app, enabled=True)) as c:
        response = await c.get("/")
    assert (response.status_code, response.text) == (200, "hello")


@pytest.mark.anyio
async def test_abort_header_answers_with_that_status() -> None:
    """x-fault-abort-request: 503 aborts the request with 503."""
    async with client(FaultMiddleware(app, enabled=True)) as c:
        response = await c.get("/", headers={"x-fault-abort-request": "503"})
    assert response.status_code == 503
    assert response.text == "injected fault\n"


@pytest.mark.anyio
async def test_envoy_header_names_with_envoy_prefix() -> None:
    """header_prefix="x-envoy-fault-" reads Envoy's own fault headers."""
    middleware = FaultMiddleware(app, enabled=True, header_prefix="x-envoy-fault-")
    async with client(middleware) as c:
        response = await c.get("/", headers={"x-envoy-fault-abort-request": "429"})
        ignored = await c.get("/", headers={"x-fault-abort-request": "429"})
    assert response.status_code == 429
    assert ignored.status_code == 200


@pytest.mark.anyio
async def test_header_percentage_is_a_seeded_rate() -> None:
    """abort-request-percentage: 0 never aborts, 100 always, 50 about half (seeded)."""
    middleware = FaultMiddleware(app, enabled=True, seed=4)
    async with client(middleware) as c:
        never = await c.get(
            "/", headers={"x-fault-abort-request": "500", "x-fault-abort-request-percentage": "0"}
        )
        statuses = [
            (
                await c.get(
                    "/",
                    headers={
                        "x-fault-abort-request": "500",
                        "x-fault-abort-request-percentage": "50",
                    },
                )
            ).status_code
            for _ in range(100)
        ]
    assert never.status_code == 200
    assert 30 < statuses.count(500) < 70
    assert middleware.statistics().injected["header"] == statuses.count(500)


@pytest.mark.anyio
async def test_delay_header_sleeps_on_the_clock_and_is_capped() -> None:
    """x-fault-delay-request is milliseconds, slept on the clock, capped by max_header_delay."""
    clock = FakeClock()
    middleware = FaultMiddleware(app, enabled=True, clock=clock, max_header_delay=1.0)
    async with client(middleware) as c:
        fast = await c.get("/", headers={"x-fault-delay-request": "250"})
        capped = await c.get("/", headers={"x-fault-delay-request": "999999"})
        junk = await c.get("/", headers={"x-fault-delay-request": "soon"})
    assert [fast.status_code, capped.status_code, junk.status_code] == [200, 200, 200]
    assert clock.sleeps == [0.25, 1.0]


@pytest.mark.anyio
async def test_configured_faults_by_rate() -> None:
    """faults= inject by rate: a seeded share of requests get 503 + Retry-After."""
    middleware = FaultMiddleware(
        app, faults=[chaos.Status(503, retry_after=3, rate=0.25)], headers=False, enabled=True
    )
    async with client(middleware) as c:
        responses = [await c.get("/") for _ in range(200)]
        ignored = await c.get("/", headers={"x-fault-abort-request": "500"})
    aborted = [r for r in responses if r.status_code == 503]
    assert 25 < len(aborted) < 75
    assert all(r.headers["retry-after"] == "3" for r in aborted)
    assert ignored.status_code != 500  # headers=False ignores fault headers
    assert middleware.statistics().calls == 201


@pytest.mark.anyio
async def test_predicate_receives_the_scope() -> None:
    """when= gets the ASGI scope: fault only one path."""
    middleware = FaultMiddleware(
        app, faults=chaos.Status(500, when=lambda scope: scope["path"] == "/slow"), enabled=True
    )
    async with client(middleware) as c:
        assert (await c.get("/fast")).status_code == 200
        assert (await c.get("/slow")).status_code == 500


@pytest.mark.anyio
async def test_error_fault_raises_inside_the_server() -> None:
    """Error faults raise out of the app, as a crashing handler would."""
    middleware = FaultMiddleware(app, faults=chaos.Error(RuntimeError), enabled=True)
    async with client(middleware) as c:
        with pytest.raises(RuntimeError, match="injected fault"):
            await c.get("/")


@pytest.mark.anyio
async def test_hang_returns_when_the_client_disconnects() -> None:
    """A Hang never answers; it ends (without a response) when the client goes away."""
    middleware = FaultMiddleware(app, faults=chaos.Hang(), enabled=True)
    sent: list[Any] = []
    messages = [
        {"type": "http.request", "body": b"", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Any:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware({"type": "http", "path": "/", "headers": []}, receive, send)
    assert sent == []
    assert messages == []


@pytest.mark.anyio
async def test_lifespan_and_other_scopes_pass_through() -> None:
    """Non-HTTP scopes (lifespan, websocket) go straight to the app."""
    middleware = FaultMiddleware(app, faults=chaos.Status(500), enabled=True)
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware({"type": "lifespan"}, receive, send)
    assert sent == [{"type": "lifespan.startup.complete"}]


def test_bad_arguments() -> None:
    """Only ASGI-compatible faults; something to inject is required."""
    with pytest.raises(rs.ConfigurationError, match="Latency, Status, Hang and Error"):
        FaultMiddleware(app, faults=chaos.Truncate(), enabled=True)
    with pytest.raises(rs.ConfigurationError, match="needs faults= or headers=True"):
        FaultMiddleware(app, headers=False, enabled=True)
    # Not a TypeError or AttributeError from deep inside: the argument named.
    with pytest.raises(rs.ConfigurationError, match="faults must be a fault or a list"):
        FaultMiddleware(app, faults=0.1, enabled=True)  # type: ignore[arg-type]
    with pytest.raises(rs.ConfigurationError, match="header_prefix"):
        FaultMiddleware(app, header_prefix=5, enabled=True)  # type: ignore[arg-type]
    with pytest.raises(rs.ConfigurationError, match="header_prefix"):
        FaultMiddleware(app, header_prefix="x fault ", enabled=True)  # no header matches
    FaultMiddleware(app, header_prefix="", enabled=True)  # the bare names: abort-request


@pytest.mark.anyio
async def test_a_delay_header_of_nan_is_ignored_and_requests_are_counted() -> None:
    """x-fault-delay-request: nan survived min/max and the sleep raised ValueError: a
    500 any client could cause. And statistics().calls stayed 0 with header faults only."""
    middleware = FaultMiddleware(app, enabled=True, seed=1)
    async with client(middleware) as http:
        for value in ("nan", "NaN", "abc"):
            response = await http.get("/", headers={"x-fault-delay-request": value})
            assert response.status_code == 200
        aborted = await http.get("/", headers={"x-fault-abort-request": "503"})
        assert aborted.status_code == 503
    stats = middleware.statistics()
    assert stats.calls == 4
    assert stats.injected == {"header": 1}


@pytest.mark.parametrize("status", [204, 304])
def test_a_bodiless_abort_leaves_the_connection_usable(status: int) -> None:
    """An abort with 204 or 304 sends no body and no Content-Length (RFC 9110): the
    next request on the same keep-alive connection gets its own answer (uvicorn put
    the 15-byte "injected fault" on the wire, and the next response read it as its
    status line; hypercorn's h2 reset the stream)."""
    with serve(FaultMiddleware(app, enabled=True)) as url, httpx.Client(base_url=url) as c:
        aborted = c.get("/", headers={"x-fault-abort-request": str(status)})
        following = c.get("/")
    assert (aborted.status_code, aborted.content) == (status, b"")
    assert "content-length" not in aborted.headers
    assert (following.status_code, following.text) == (200, "hello")


def test_a_status_fault_without_a_final_answer_or_with_a_body_it_cannot_have_is_refused() -> None:
    """1xx is no final answer; a 204 or 304 has no body: refused when built."""
    with pytest.raises(rs.ConfigurationError, match="code"):
        chaos.Status(101)
    with pytest.raises(rs.ConfigurationError, match="no body"):
        chaos.Status(204, body=b"gone")
    assert chaos.Status(304).body == b""
