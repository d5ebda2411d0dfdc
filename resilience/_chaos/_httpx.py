"""Outbound HTTP faults: an httpx transport that breaks requests on purpose, per host."""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping

from .._clock import SYSTEM_CLOCK, Clock
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
)

__all__ = ["FaultyTransport"]

_HTTP_FAULTS = (Latency, Error, Result, Hang, Status, ConnectFailure, RequestTimeout, Truncate)

_TIMEOUTS: dict[str, type[httpx.TimeoutException]] = {
    "connect": httpx.ConnectTimeout,
    "read": httpx.ReadTimeout,
    "write": httpx.WriteTimeout,
    "pool": httpx.PoolTimeout,
}


def _faults_of(name: str, value: Fault | Iterable[Fault]) -> list[Fault]:
    items = [value] if isinstance(value, Fault) else list(value)
    for fault in items:
        if not isinstance(fault, _HTTP_FAULTS):
            raise ConfigurationError(f"{name} must contain chaos faults, got {fault!r}")
        if isinstance(fault, Result) and not isinstance(fault.value, httpx.Response):
            raise ConfigurationError(
                f"{name}: a Result fault of FaultyTransport must return an httpx.Response, "
                f"got {fault.value!r} (use chaos.Status for error statuses)"
            )
    return items


def _host_gate(pattern: str) -> Gate:
    pattern = pattern.lower()
    if not any(ch in pattern for ch in "*?["):
        return lambda args, kwargs: bool(args[0].url.host == pattern)
    return lambda args, kwargs: fnmatch.fnmatchcase(args[0].url.host, pattern)


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
    * :class:`~resilience.chaos.Error`, :class:`~resilience.chaos.Hang` (sync: block,
      then ``httpx.ReadTimeout``), :class:`~resilience.chaos.Result` (a canned
      ``httpx.Response``).

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
        clock: Clock = SYSTEM_CLOCK,
        name: str | None = None,
    ) -> None:
        Observable.__init__(self, name)
        if inner is not None and not isinstance(
            inner, httpx.BaseTransport | httpx.AsyncBaseTransport
        ):
            raise ConfigurationError(f"inner must be an httpx transport, got {inner!r}")
        specs: list[tuple[Fault, Gate | None]] = []
        for host, host_faults in (hosts or {}).items():
            if not isinstance(host, str) or not host:
                raise ConfigurationError(f"hosts keys must be host names, got {host!r}")
            gate = _host_gate(host)
            specs.extend((fault, gate) for fault in _faults_of(f"hosts[{host!r}]", host_faults))
        specs.extend((fault, None) for fault in _faults_of("faults", faults))
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

    @staticmethod
    def _end(fault: Fault, request: httpx.Request) -> httpx.Response:
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
        response: httpx.Response = fault.value
        return response

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
            self._clock.sleep(fault.block)
            raise httpx.ReadTimeout(
                f"injected hang: no answer after {fault.block:g}s", request=request
            )
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
