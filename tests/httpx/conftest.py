"""Fixtures of the outbound HTTP tests: one ``send`` per shell, scripted mock upstreams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from resilience.testing import FakeClock

Send = Callable[..., httpx.Response]


@pytest.fixture(params=["sync", "asyncio", "trio"])
def shell(request: pytest.FixtureRequest) -> str:
    """Which shell of the transport a test drives: sync, or async on asyncio or trio."""
    return str(request.param)


@pytest.fixture
def send(shell: str) -> Send:
    """``send(transport, method, url, **kwargs)``: one request through a fresh client.

    The body is read before returning (like ``client.request``), so the response is
    complete and closed.
    """

    def do(transport: Any, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if shell == "sync":
            client = httpx.Client(transport=transport)
            return client.request(method, url, **kwargs)

        async def main() -> httpx.Response:
            client = httpx.AsyncClient(transport=transport)
            return await client.request(method, url, **kwargs)

        return anyio.run(main, backend=shell)

    return do


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that records whether it was closed (leak detection)."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield self.data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class Call:
    """One request as the upstream saw it, at (fake) time ``at``."""

    host: str
    method: str
    at: float
    request: httpx.Request
    timeout: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Upstream:
    """A scripted upstream for ``httpx.MockTransport``, sync and async.

    ``script(request, n)`` answers the ``n``-th request (0-based) to the request's host
    with ``(status, headers)``, a full ``httpx.Response``, or an exception to raise.
    Bodies are :class:`Body` streams, so tests can check that none is left open.
    """

    clock: FakeClock
    script: Callable[[httpx.Request, int], Any]
    calls: list[Call] = field(default_factory=list)
    bodies: list[Body] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        n = sum(1 for call in self.calls if call.host == host)
        timeout = dict(request.extensions.get("timeout", {}))
        call = Call(host, request.method, self.clock.monotonic(), request, timeout, {})
        call.headers = dict(request.headers)
        self.calls.append(call)
        answer = self.script(request, n)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        status, headers = answer
        body = Body(b"answer %d" % n)
        self.bodies.append(body)
        return httpx.Response(status, headers=headers, stream=body)

    def to(self, host: str) -> list[Call]:
        """The calls that reached ``host``."""
        return [call for call in self.calls if call.host == host]

    @property
    def transport(self) -> httpx.MockTransport:
        """A MockTransport answering with this script."""
        return httpx.MockTransport(self)

    def leaked(self) -> list[Body]:
        """Bodies of answers that nobody closed."""
        return [body for body in self.bodies if not body.closed]
