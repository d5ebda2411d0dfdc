"""Acceptance under real servers: uvicorn on 127.0.0.1 + httpx, Starlette and FastAPI apps."""

from __future__ import annotations

import threading
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from resilience.asgi import RateLimitMiddleware, TimeoutMiddleware, client_ip, digest
from resilience.ratelimit import RateLimiter
from resilience.testing import FakeClock

from ._support import serve

with warnings.catch_warnings():  # starlette asks for httpx2 in its test client
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def fastapi_app(limiter: RateLimiter, **options: Any) -> Any:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/items/{item_id}")
    async def read_item(item_id: int) -> dict[str, int]:
        return {"item_id": item_id}

    app.add_middleware(RateLimitMiddleware, limiter=limiter, **options)
    return app


def test_uvicorn_fastapi_sixth_request_429_then_passes_after_retry_after() -> None:
    """5/s under uvicorn: the 6th request of a burst is refused with Retry-After,
    RateLimit and RateLimit-Policy matching the limiter; after Retry-After it passes."""
    clock = FakeClock()
    limiter = RateLimiter("5/s", clock=clock)
    with serve(fastapi_app(limiter)) as url, httpx.Client(base_url=url, timeout=10) as client:
        burst = [client.get("/items/1") for _ in range(6)]
        assert [r.status_code for r in burst] == [200] * 5 + [429]
        assert burst[0].json() == {"item_id": 1}
        assert [r.headers["ratelimit"] for r in burst[:5]] == [
            f'"default";r={n};t=1' for n in (4, 3, 2, 1, 0)
        ]
        refused = burst[5]
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["ratelimit-policy"] == '"default";q=5;w=1'
        assert refused.headers["ratelimit"] == '"default";r=0;t=1'
        assert refused.headers["content-type"] == "application/problem+json"
        state = limiter.try_acquire(key=digest("ip:127.0.0.1"), cost=0)
        assert state.remaining == 0
        assert limiter.statistics().rejected == 1
        clock.advance(int(refused.headers["retry-after"]))
        assert client.get("/items/2").status_code == 200


def test_uvicorn_spoofed_forwarded_for_only_counts_from_trusted_proxies() -> None:
    """From an untrusted peer X-Forwarded-For is ignored (one shared bucket); from a
    trusted proxy (here: loopback) each forwarded client gets its own bucket."""
    untrusted = fastapi_app(RateLimiter("1/minute", clock=FakeClock()))
    with serve(untrusted) as url, httpx.Client(base_url=url, timeout=10) as client:
        first = client.get("/items/1", headers={"x-forwarded-for": "192.0.2.1"})
        spoofed = client.get("/items/1", headers={"x-forwarded-for": "192.0.2.2"})
        assert (first.status_code, spoofed.status_code) == (200, 429)
    trusted = fastapi_app(
        RateLimiter("1/minute", clock=FakeClock()), key=client_ip(trusted_proxies=["127.0.0.1"])
    )
    with serve(trusted) as url, httpx.Client(base_url=url, timeout=10) as client:
        statuses = [
            client.get("/items/1", headers={"x-forwarded-for": ip}).status_code
            for ip in ("192.0.2.1", "192.0.2.2", "192.0.2.1")
        ]
        assert statuses == [200, 200, 429]


def test_uvicorn_starlette_sse_streams_chunk_by_chunk() -> None:
    """The first server-sent event reaches the client before the last one is produced."""
    produced: list[str] = []
    client_got_first = threading.Event()

    async def events(request: Request) -> StreamingResponse:
        async def stream() -> AsyncIterator[bytes]:
            import anyio

            produced.append("first")
            yield b"data: first\n\n"
            with anyio.move_on_after(5):
                while not client_got_first.is_set():
                    await anyio.sleep(0.01)
            produced.append("last")
            yield b"data: last\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    limiter = RateLimiter("5/s", clock=FakeClock())
    app = Starlette(
        routes=[Route("/events", events)],
        middleware=[
            Middleware(TimeoutMiddleware, seconds=30),
            Middleware(RateLimitMiddleware, limiter=limiter),
        ],
    )
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("GET", "/events") as response:
            assert response.headers["ratelimit"] == '"default";r=4;t=1'
            chunks = response.iter_raw()
            first = next(chunks)
            assert first == b"data: first\n\n"
            assert produced == ["first"], "the first chunk arrived before the last was produced"
            client_got_first.set()
            assert b"".join(chunks) == b"data: last\n\n"
        assert produced == ["first", "last"]


def test_starlette_websocket_and_lifespan_untouched() -> None:
    """Through a Starlette app: lifespan runs and websockets connect without limits."""
    lifespan_events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        lifespan_events.append("startup")
        yield
        lifespan_events.append("shutdown")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("home")

    limiter = RateLimiter("1/minute", clock=FakeClock())
    app = Starlette(
        routes=[Route("/", home), WebSocketRoute("/ws", echo)],
        middleware=[
            Middleware(TimeoutMiddleware, seconds=0.5),
            Middleware(RateLimitMiddleware, limiter=limiter),
        ],
        lifespan=lifespan,
    )
    with TestClient(app) as client:
        assert lifespan_events == ["startup"]
        for _ in range(3):
            with client.websocket_connect("/ws") as websocket:
                websocket.send_text("hi")
                assert websocket.receive_text() == "hi"
        assert client.get("/").status_code == 200
        assert client.get("/").status_code == 429
    assert lifespan_events == ["startup", "shutdown"]
    assert limiter.statistics().admitted == 1
