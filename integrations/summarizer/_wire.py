"""A lean HTTP/1.1 transport for httpx over asyncio streams, for loopback traffic.

The demo runs hundreds of concurrent downloads on a 2-core machine. httpcore's pool
scans (and polls) every idle connection on each request, which costs milliseconds per
request at that scale, so the simulated network uses this small transport instead:
an idle-connection stack per origin, ``Content-Length`` and chunked bodies, and the
timeouts of ``request.extensions["timeout"]`` mapped to httpx's exceptions. It also
routes the simulated domains (``vidhub.test``) to the local servers that play them,
keeping the ``Host`` header, so per-host policies see the real domain names.

It is the *network* of the simulation, not a policy: every resilience policy sits
above it (``ResilientTransport(inner=LoopbackTransport(...))``).

Example::

    transport = LoopbackTransport(routes={"vidhub.test": ("127.0.0.1", 8001)})
    async with httpx.AsyncClient(transport=transport) as client:
        r = await client.get("http://vidhub.test/api/videos/abc")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

__all__ = ["LoopbackTransport", "send"]

_READ = 65536


class _Conn:
    __slots__ = ("key", "reader", "reused", "writer")

    def __init__(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.reused = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Body(httpx.AsyncByteStream):
    """A response body read from a pooled connection; returns it to the pool when done."""

    __slots__ = ("_chunked", "_conn", "_done", "_keep", "_left", "_owner", "_timeout")

    _conn: _Conn | None

    def __init__(
        self,
        owner: LoopbackTransport,
        conn: _Conn,
        length: int | None,
        chunked: bool,
        keep: bool,
        timeout: float | None,
    ) -> None:
        self._owner = owner
        self._conn = conn
        self._left = length
        self._chunked = chunked
        self._keep = keep and (length is not None or chunked)
        self._timeout = timeout
        self._done = length == 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._conn is not None, "the body was already closed"
        reader = self._conn.reader
        try:
            if self._chunked:
                while True:
                    async with asyncio.timeout(self._timeout):
                        line = await reader.readuntil(b"\r\n")
                        size = int(line.split(b";", 1)[0], 16)
                        if size == 0:
                            await reader.readuntil(b"\r\n")
                            self._done = True
                            return
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._left is not None:
                while self._left > 0:
                    async with asyncio.timeout(self._timeout):
                        data = await reader.read(min(self._left, _READ))
                    if not data:
                        raise httpx.RemoteProtocolError(
                            "peer closed connection without sending complete message body"
                        )
                    self._left -= len(data)
                    yield data
                self._done = True
            else:
                while True:
                    async with asyncio.timeout(self._timeout):
                        data = await reader.read(_READ)
                    if not data:
                        self._done = True
                        return
                    yield data
        except TimeoutError as exc:
            raise httpx.ReadTimeout("timed out reading the response body") from exc
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise httpx.RemoteProtocolError(f"connection broken: {exc!r}") from exc

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._owner._release(conn)
        else:
            conn.close()


class LoopbackTransport(httpx.AsyncBaseTransport):
    """httpx async transport over plain asyncio streams with a per-origin idle stack.

    ``routes`` maps a host name to the ``(ip, port)`` that serves it (the request keeps
    its ``Host``); other hosts are connected to as written. ``max_idle`` caps idle
    connections kept per origin.

    Example::

        LoopbackTransport(routes={"cheap.models.test": ("127.0.0.1", 9000)})
    """

    def __init__(
        self, routes: Mapping[str, tuple[str, int]] | None = None, *, max_idle: int = 512
    ) -> None:
        self.routes = dict(routes or {})
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle and not conn.writer.is_closing():
            conn.reused = True
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int], timeout: float | None) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn
            conn.close()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(key[0], key[1], limit=1 << 20)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {key} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connect to {key} failed: {exc}") from exc
        return _Conn(key, reader, writer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return a response whose body streams from the socket."""
        url = request.url
        host = url.host
        key = self.routes.get(host) or (host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        body = request.read() if request.method in ("POST", "PUT", "PATCH") else b""
        head = [f"{request.method} {url.raw_path.decode()} HTTP/1.1\r\n".encode()]
        for name, value in request.headers.raw:
            head.append(name + b": " + value + b"\r\n")
        if body and "content-length" not in request.headers:
            head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"\r\n")
        payload = b"".join(head) + body
        for attempt in (0, 1):
            conn = await self._connect(key, timeouts.get("connect"))
            try:
                return await self._exchange(conn, payload, timeouts.get("read"), request)
            except _Stale:
                conn.close()
                if attempt:
                    raise httpx.RemoteProtocolError("server closed the connection") from None
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(
        self, conn: _Conn, payload: bytes, read_timeout: float | None, request: httpx.Request
    ) -> httpx.Response:
        try:
            conn.writer.write(payload)
            async with asyncio.timeout(read_timeout):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
        except TimeoutError as exc:
            raise httpx.ReadTimeout("timed out waiting for the response") from exc
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if conn.reused:
                raise _Stale from exc
            raise httpx.RemoteProtocolError(f"server disconnected: {exc!r}") from exc
        lines = raw[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = False
        keep = True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            value = value.strip()
            lname = name.lower()
            headers.append((name, value))
            if lname == b"content-length":
                length = int(value)
            elif lname == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lname == b"connection":
                keep = value.lower() != b"close"
        if request.method == "HEAD" or status in (204, 304):
            length = 0
        stream = _Body(self, conn, None if chunked else length, chunked, keep, read_timeout)
        return httpx.Response(
            status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"}
        )

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    """A reused keep-alive connection was closed by the server before it answered."""


async def send(
    transport: httpx.AsyncBaseTransport,
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    json: Any = None,
    timeout: httpx.Timeout | float | None = 30.0,
    extensions: dict[str, Any] | None = None,
) -> httpx.Response:
    """Send one request straight through ``transport``; the body streams (close it).

    ``httpx.AsyncClient.send`` wraps every response in a stream that points back to the
    response: a reference cycle per request, so a garbage-collection pause every few
    thousand requests. Hot paths of the demo (downloads, model calls, virtual users)
    send through the transport directly; the transport stack is the same.
    """
    extensions = dict(extensions or {})
    extensions.setdefault("timeout", httpx.Timeout(timeout).as_dict())
    request = httpx.Request(method, url, headers=headers, json=json, extensions=extensions)
    return await transport.handle_async_request(request)
