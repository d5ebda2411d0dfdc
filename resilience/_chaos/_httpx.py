"""Outbound HTTP faults: an httpx transport that breaks requests on purpose, per host."""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

from .._clock import Clock
from .._http._hosts import check_host_patterns, split_port
from .._validate import check_clock, check_int
from ..errors import ConfigurationError

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "resilience.chaos.FaultyTransport needs httpx: pip install 'resilience[httpx]'"
    ) from exc

from ._core import FaultCore, Gate, Plan, new_seed
from ._shell import (
    FaultStatistics,
    Observable,
    emit_plan,
    hang_async,
    sleep_async,
    statistics_of,
    switch_for,
)
from ._specs import (
    ConnectFailure,
    Error,
    Fault,
    Hang,
    Latency,
    RequestTimeout,
    Result,
    Status,
    Truncate,
    fault_list,
)

__all__ = ["FaultyTransport"]

_HTTP_FAULTS = (Latency, Error, Result, Hang, Status, ConnectFailure, RequestTimeout, Truncate)

_TIMEOUTS: dict[str, type[httpx.TimeoutException]] = {
    "connect": httpx.ConnectTimeout,
    "read": httpx.ReadTimeout,
    "write": httpx.WriteTimeout,
    "pool": httpx.PoolTimeout,
}


def _faults_of(
    name: str, value: Fault | Iterable[Fault], canned: dict[int, _Canned]
) -> list[Fault]:
    """The faults of ``name``, checked; the responses of Result faults go to ``canned``."""
    items = fault_list(name, value)
    for fault in items:
        if not isinstance(fault, _HTTP_FAULTS):
            raise ConfigurationError(f"{name} must contain chaos faults, got {fault!r}")
        if isinstance(fault, Result) and not isinstance(fault.value, httpx.Response):
            raise ConfigurationError(
                f"{name}: a Result fault of FaultyTransport must return an httpx.Response, "
                f"got {fault.value!r} (use chaos.Status for error statuses)"
            )
        if isinstance(fault, Result):
            # Keyed by the fault itself: the transport's core keeps every fault alive.
            canned[id(fault)] = _Canned(name, fault.value)
    return items


# Headers that describe a body as it travelled, not the decoded bytes ``read()`` returns.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class _Canned:
    """A Result fault's ``httpx.Response``, used as a template: one new response per request.

    An ``httpx.Response`` belongs to one request (httpx binds ``.request`` to it and
    wraps its ``.stream`` on every send), so handing the same object to every request
    would mix them up. The body is read once, here, because a streamed body can only be
    read once; an async-only stream cannot be read without an event loop and is refused.
    """

    __slots__ = ("body", "extensions", "headers", "status_code")

    def __init__(self, name: str, template: httpx.Response) -> None:
        self.status_code = template.status_code
        # Only what describes the response; a real one's network stream is not shared.
        self.extensions: dict[str, Any] = {
            key: template.extensions[key]
            for key in ("http_version", "reason_phrase")
            if key in template.extensions
        }
        stream = template.stream
        if isinstance(stream, httpx.ByteStream):
            # Built from bytes (content=, text=, json=): the raw body reads again and
            # again, and goes out encoded as the headers say, as it would on the wire.
            self.body = b"".join(stream)
            self.headers = template.headers.multi_items()
            return
        try:
            template.content  # noqa: B018 - raises if the body was never read
        except httpx.ResponseNotRead:
            if not isinstance(stream, httpx.SyncByteStream):
                raise ConfigurationError(
                    f"{name}: the httpx.Response of a Result fault has an async-only stream "
                    "body, which cannot be read in advance: pass the body as bytes "
                    "(httpx.Response(..., content=b'...'))"
                ) from None
        try:
            self.body = template.read()
        except httpx.StreamError as exc:
            raise ConfigurationError(
                f"{name}: cannot read the body of a Result fault's httpx.Response ({exc})"
            ) from None
        # read() decoded the body: the new responses carry it as is, with its own length.
        self.headers = [
            (key, value)
            for key, value in template.headers.multi_items()
            if key.lower() not in _WIRE_HEADERS
        ]
        self.headers.append(("content-length", str(len(self.body))))

    def respond(self, request: httpx.Request) -> httpx.Response:
        """A new response for ``request``, equal to the template, unread like a real one."""
        return httpx.Response(
            self.status_code,
            headers=self.headers,
            stream=httpx.ByteStream(self.body),
            extensions=dict(self.extensions),
            request=request,
        )


def _host_gate(pattern: str) -> Gate:
    """Whether a request goes to ``pattern``: a host (any port), a glob, or, with a
    port (``"127.0.0.1:8001"``), that host and port only, as ``ResilientTransport``'s
    ``hosts=`` names them."""
    pattern = pattern.lower()
    name, port = split_port(pattern)
    if port is not None:

        def with_port(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
            url = args[0].url
            return url.port is not None and str(url.port) == port and _matches(url.host, name)

        return with_port
    return lambda args, kwargs: _matches(args[0].url.host, pattern)


def _matches(host: str, pattern: str) -> bool:
    if not any(ch in pattern for ch in "*?["):
        return host == pattern
    return fnmatch.fnmatchcase(host, pattern)


class _TruncatedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """The first bytes of a body, then the error a dropped connection gives."""

    def __init__(self, data: bytes, request: httpx.Request) -> None:
        self._data = data
        self._request = request

    def _error(self) -> httpx.RemoteProtocolError:
        return httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body (injected)",
            request=self._request,
        )

    def __iter__(self) -> Iterator[bytes]:
        if self._data:
            yield self._data
        raise self._error()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._data:
            yield self._data
        raise self._error()


class FaultyTransport(httpx.BaseTransport, httpx.AsyncBaseTransport, Observable):
    """An httpx transport that injects faults into outgoing requests, per host.

    Wraps a real transport (``inner``; by default ``httpx.HTTPTransport()`` for sync
    clients and ``httpx.AsyncHTTPTransport()`` for async ones) and works with both
    ``httpx.Client`` and ``httpx.AsyncClient``. ``faults=`` apply to every request;
    ``hosts=`` maps a host (or a glob such as ``"*.example.com"``) to faults for that
    host only, tried before the general ones. Faults:

    * :class:`~resilience.chaos.Latency`: delay, then send;
    * :class:`~resilience.chaos.Status`: answer ``code`` (e.g. 429 or 503, with
      ``Retry-After``) without sending;
    * :class:`~resilience.chaos.ConnectFailure`: raise ``httpx.ConnectError``;
    * :class:`~resilience.chaos.RequestTimeout`: wait the request's timeout, then
      raise ``httpx.ReadTimeout`` (or the ``phase`` chosen);
    * :class:`~resilience.chaos.Truncate`: send, then cut the body short with
      ``httpx.RemoteProtocolError``;
    * :class:`~resilience.chaos.Error`, :class:`~resilience.chaos.Hang` (sync: block
      ``block`` seconds or the request's read timeout if shorter, then
      ``httpx.ReadTimeout``), :class:`~resilience.chaos.Result` (a canned
      ``httpx.Response``: a template, each request gets a new copy of its status,
      headers and body; a streamed body is read when the transport is built, an
      async-only one is refused).

    Like :class:`resilience.Faults`, it injects only when chaos is enabled
    (``with chaos.enabled():``, ``RESILIENCE_CHAOS=1``, or ``enabled=True``); ``when``
    predicates receive the ``httpx.Request``; ``seed=`` makes runs replayable.

    Example::

        from resilience import chaos

        transport = chaos.FaultyTransport(
            httpx.AsyncHTTPTransport(),
            hosts={"api.example.com": [chaos.Status(503, retry_after=1, rate=0.2)]},
            faults=[chaos.Latency(chaos.uniform(0.0, 0.2))],
            seed=7,
        )
        async with httpx.AsyncClient(transport=transport) as client:
            with chaos.enabled():
                response = await client.get("https://api.example.com/v1/items")
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        *,
        faults: Fault | Iterable[Fault] = (),
        hosts: Mapping[str, Fault | Iterable[Fault]] | None = None,
        seed: int | None = None,
        enabled: bool | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        Observable.__init__(self, name)
        if inner is not None and not isinstance(
            inner, httpx.BaseTransport | httpx.AsyncBaseTransport
        ):
            raise ConfigurationError(f"inner must be an httpx transport, got {inner!r}")
        specs: list[tuple[Fault, Gate | None]] = []
        self._canned: dict[int, _Canned] = {}
        for host, host_faults in check_host_patterns("hosts", hosts):
            gate = _host_gate(host)
            specs.extend(
                (fault, gate) for fault in _faults_of(f"hosts[{host!r}]", host_faults, self._canned)
            )
        specs.extend((fault, None) for fault in _faults_of("faults", faults, self._canned))
        if not specs:
            raise ConfigurationError("FaultyTransport needs faults= or hosts=")
        self.seed: int = check_int("seed", new_seed() if seed is None else seed, minimum=-(2**63))
        self._inner = inner
        self._sync_inner: httpx.BaseTransport | None = (
            inner if isinstance(inner, httpx.BaseTransport) else None
        )
        self._async_inner: httpx.AsyncBaseTransport | None = (
            inner if isinstance(inner, httpx.AsyncBaseTransport) else None
        )
        self._clock = check_clock("clock", clock)
        self._switch = switch_for(enabled)
        self._core = FaultCore(specs, seed=self.seed, epoch=self._clock.monotonic())

    # -- plumbing -----------------------------------------------------------------------

    def _sync(self) -> httpx.BaseTransport:
        if self._sync_inner is None:
            if self._inner is not None:
                raise TypeError(f"{self._inner!r} is async-only: use it with httpx.AsyncClient")
            self._sync_inner = httpx.HTTPTransport()
        return self._sync_inner

    def _async(self) -> httpx.AsyncBaseTransport:
        if self._async_inner is None:
            if self._inner is not None:
                raise TypeError(f"{self._inner!r} is sync-only: use it with httpx.Client")
            self._async_inner = httpx.AsyncHTTPTransport()
        return self._async_inner

    def _plan(self, request: httpx.Request) -> Plan | None:
        plan = self._core.decide(self._clock.monotonic(), (request,), {})
        if plan is not None and self._observed:
            emit_plan(self, plan, request.url.host)
        return plan

    @staticmethod
    def _timeout_wait(fault: RequestTimeout, request: httpx.Request) -> float:
        if fault.wait is not None:
            return fault.wait
        timeouts = request.extensions.get("timeout") or {}
        value = timeouts.get(fault.phase)
        return float(value) if isinstance(value, int | float) else 0.0

    def _end(self, fault: Fault, request: httpx.Request) -> httpx.Response:
        """The faults that end a request without waiting or sending."""
        if isinstance(fault, Status):
            return httpx.Response(
                fault.code, headers=fault.header_list(), content=fault.body, request=request
            )
        if isinstance(fault, ConnectFailure):
            raise httpx.ConnectError("injected: connection refused", request=request)
        if isinstance(fault, Error):
            raise fault.build()
        assert isinstance(fault, Result)
        return self._canned[id(fault)].respond(request)

    @staticmethod
    def _truncated(
        response: httpx.Response, raw: bytes, fault: Truncate, request: httpx.Request
    ) -> httpx.Response:
        keep = int(len(raw) * fault.keep)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_TruncatedStream(raw[:keep], request),
            extensions=response.extensions,
            request=request,
        )

    # -- sync ---------------------------------------------------------------------------

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the inner transport, injecting faults when enabled."""
        if not self._switch():
            return self._sync().handle_request(request)
        plan = self._plan(request)
        if plan is None:
            return self._sync().handle_request(request)
        if plan.delay:
            self._clock.sleep(plan.delay)
        fault = plan.fault
        if fault is None:
            return self._sync().handle_request(request)
        if isinstance(fault, Truncate):
            response = self._sync().handle_request(request)
            stream = response.stream
            assert isinstance(stream, httpx.SyncByteStream)
            try:
                raw = b"".join(stream)  # the raw bytes, even if already read
            finally:
                stream.close()
            return self._truncated(response, raw, fault, request)
        if isinstance(fault, RequestTimeout):
            self._clock.sleep(self._timeout_wait(fault, request))
            raise _TIMEOUTS[fault.phase]("injected timeout", request=request)
        if isinstance(fault, Hang):
            # A hung server: the socket's read timeout ends the wait, if shorter.
            read = (request.extensions.get("timeout") or {}).get("read")
            waited = min(fault.block, read) if isinstance(read, int | float) else fault.block
            self._clock.sleep(waited)
            raise httpx.ReadTimeout(f"injected hang: no answer after {waited:g}s", request=request)
        return self._end(fault, request)

    def close(self) -> None:
        """Close the inner transport."""
        if self._sync_inner is not None:
            self._sync_inner.close()

    # -- async --------------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the inner transport, injecting faults when enabled."""
        if not self._switch():
            return await self._async().handle_async_request(request)
        plan = self._plan(request)
        if plan is None:
            return await self._async().handle_async_request(request)
        if plan.delay:
            await sleep_async(self._clock, plan.delay)
        fault = plan.fault
        if fault is None:
            return await self._async().handle_async_request(request)
        if isinstance(fault, Truncate):
            response = await self._async().handle_async_request(request)
            astream = response.stream
            assert isinstance(astream, httpx.AsyncByteStream)
            try:
                raw = b"".join([chunk async for chunk in astream])
            finally:
                await astream.aclose()
            return self._truncated(response, raw, fault, request)
        if isinstance(fault, RequestTimeout):
            await sleep_async(self._clock, self._timeout_wait(fault, request))
            raise _TIMEOUTS[fault.phase]("injected timeout", request=request)
        if isinstance(fault, Hang):
            await hang_async(self._clock)
        return self._end(fault, request)

    async def aclose(self) -> None:
        """Close the inner transport."""
        if self._async_inner is not None:
            await self._async_inner.aclose()

    # -- inspection ---------------------------------------------------------------------

    def statistics(self) -> FaultStatistics:
        """Requests seen while enabled and faults injected per kind.

        Example: ``transport.statistics().injected.get("status", 0)``
        """
        return statistics_of(self._core)

    def reset(self) -> None:
        """Replay from the start: schedules restart now, RNGs restart from the seed.

        Example: ``transport.reset()``
        """
        self._core.reset(self._clock.monotonic())

    def __repr__(self) -> str:
        return f"<FaultyTransport {self.name!r} seed={self.seed}>"
