"""Real HTTP servers for the transport tests: uvicorn on 127.0.0.1, in a thread, bounded."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn

#: ``behave(scope, n)`` -> (status, headers, delay seconds) for the n-th request (0-based).
Behaviour = Callable[[dict[str, Any], int], Awaitable[tuple[int, dict[str, str], float]]]


async def ok(scope: dict[str, Any], n: int) -> tuple[int, dict[str, str], float]:
    """Answer 200 at once."""
    return 200, {}, 0.0


@dataclass
class LiveApp:
    """A pure ASGI app whose answers a test scripts; it counts and measures concurrency."""

    behave: Behaviour = ok
    count: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    seen: list[dict[str, str]] = field(default_factory=list)

    def reset(self, behave: Behaviour = ok) -> None:
        """Forget everything; answer with ``behave`` from now on."""
        self.behave = behave
        self.count = self.in_flight = self.max_in_flight = 0
        self.seen = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        n = self.count
        self.count += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        try:
            status, headers, delay = await self.behave(scope, n)
            if delay:
                await anyio.sleep(delay)
            body = f"answer {n}".encode()
            raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            raw.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": body})
        finally:
            self.in_flight -= 1


@dataclass
class LiveServer:
    """One running server: its ``url`` (``http://127.0.0.1:<port>``) and its ``app``."""

    url: str
    port: int
    app: LiveApp


@contextmanager
def serve(app: LiveApp, *, start_timeout: float = 10.0) -> Iterator[LiveServer]:
    """Run ``app`` under uvicorn on a free port of 127.0.0.1 until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="error",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    give_up = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > give_up:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", port, app)
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
