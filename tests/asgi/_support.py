"""Helpers for the ASGI tests: an in-process ASGI driver and a real uvicorn server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from resilience.testing import free_port

Scope = dict[str, Any]


def http_scope(
    path: str = "/",
    *,
    method: str = "GET",
    client: tuple[str, int] | None = ("203.0.113.7", 50000),
    headers: list[tuple[str, str]] | None = None,
    query: str = "",
    **extra: Any,
) -> Scope:
    """A minimal HTTP scope as a server would build it."""
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or [])],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    scope.update(extra)
    return scope


@dataclass
class Result:
    """What the driver saw the app send."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> int | None:
        for message in self.messages:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    @property
    def headers(self) -> list[tuple[str, str]]:
        for message in self.messages:
            if message["type"] == "http.response.start":
                return [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
        return []

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]

    @property
    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )

    @property
    def complete(self) -> bool:
        bodies = [m for m in self.messages if m["type"] == "http.response.body"]
        return bool(bodies) and not bodies[-1].get("more_body", False)


async def call(app: Callable[..., Any], scope: Scope, body: bytes = b"") -> Result:
    """Run one request through ``app`` in process; return what it sent."""
    result = Result()
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        result.messages.append(message)

    await app(scope, receive, send)
    return result


async def receive_nothing() -> dict[str, Any]:
    """An ASGI receive for a request whose body never comes (nor a disconnect)."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    """A bare ASGI app answering 200 "ok"."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Run ``app`` under a real uvicorn on 127.0.0.1 (in a thread); yield its base URL.

    ``proxy_headers`` is off so that uvicorn does not rewrite the client address
    from X-Forwarded-For itself: the middleware under test decides.
    """
    import uvicorn

    port = free_port()
    options: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "proxy_headers": False,
        "lifespan": "auto",
    }
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "uvicorn did not stop within 10 s"
