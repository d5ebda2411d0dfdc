"""Inbound HTTP faults: a pure ASGI middleware that delays or aborts requests on purpose."""

from __future__ import annotations

import random
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .._clock import Clock
from .._validate import (
    check_bool,
    check_callable,
    check_clock,
    check_header_name,
    check_int,
    check_number,
)
from ..errors import ConfigurationError
from ._core import FaultCore, Plan, new_seed
from ._shell import FaultStatistics, Observable, emit_plan, sleep_async, statistics_of
from ._specs import Error, Fault, Hang, Latency, Status, fault_list
from ._switch import ENV_VAR, env_enabled

__all__ = ["FaultMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ASGI_FAULTS = (Latency, Status, Hang, Error)


def _percentage(value: bytes | None) -> float:
    """A header percentage (0..100, default 100) as a probability; bad values give 0."""
    if value is None:
        return 1.0
    try:
        number = float(value)
    except ValueError:
        return 0.0
    return min(max(number, 0.0), 100.0) / 100.0


#: Statuses whose responses carry no body.
_BODILESS = frozenset({204, 304})


class FaultMiddleware(Observable):
    """Pure ASGI middleware that delays or aborts incoming HTTP requests on purpose.

    Two ways to inject, usable together:

    * **configured faults** (``faults=``): :class:`~resilience.chaos.Latency` (delay,
      then serve), :class:`~resilience.chaos.Status` (abort with that status and
      optional ``Retry-After``), :class:`~resilience.chaos.Hang` (never answer; the
      request waits until the client disconnects) and
      :class:`~resilience.chaos.Error` (raise inside the server: a 500 or a dropped
      connection), each by rate, schedule or predicate (``when`` receives the ASGI
      scope);
    * **per-request headers**, like Envoy's fault filter (with
      ``header_prefix="x-envoy-fault-"`` the names are Envoy's own):

      ============================================  ==================================
      ``x-fault-abort-request: 503``                 abort with this status
      ``x-fault-abort-request-percentage: 50``       ... for this % of requests
      ``x-fault-delay-request: 200``                 delay this many milliseconds
      ``x-fault-delay-request-percentage: 10``       ... for this % of requests
      ============================================  ==================================

    **Refuses to start unless explicitly enabled**: without ``enabled=True`` or
    ``RESILIENCE_CHAOS=1`` in the process, the constructor raises
    :class:`~resilience.ConfigurationError`, so a fault middleware left in a production
    configuration stops the deploy instead of breaking traffic. ``enabled=False`` is
    explicit too: the middleware passes every request through untouched (a settings
    flag that is off in production). Header delays are capped at ``max_header_delay``
    seconds.

    Example::

        from resilience import chaos

        app = chaos.FaultMiddleware(
            app,
            faults=[chaos.Status(503, retry_after=1, rate=0.05), chaos.Latency(0.2, rate=0.1)],
            enabled=settings.CHAOS_ENABLED,      # or run with RESILIENCE_CHAOS=1
            seed=1,
        )
        # curl -H 'x-fault-abort-request: 429' http://127.0.0.1:8000/  ->  429
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        faults: Fault | Iterable[Fault] = (),
        headers: bool = True,
        header_prefix: str = "x-fault-",
        max_header_delay: float = 60.0,
        enabled: bool | None = None,
        seed: int | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        Observable.__init__(self, name)
        if enabled is not None and enabled is not True and enabled is not False:
            # "false", 0 or "" from a settings file would be truthy or falsy by accident:
            # a switch that breaks real traffic takes a bool only.
            raise ConfigurationError(f"enabled must be None, True or False, got {enabled!r}")
        #: Built with ``enabled=False``: every request passes through untouched.
        self._off = enabled is False
        if enabled is None and not env_enabled():
            raise ConfigurationError(
                "FaultMiddleware injects faults into real requests and refuses to start "
                f"unless enabled: pass enabled=True or run with {ENV_VAR}=1"
            )
        items = fault_list("faults", faults)
        for fault in items:
            if not isinstance(fault, _ASGI_FAULTS):
                raise ConfigurationError(
                    f"FaultMiddleware injects Latency, Status, Hang and Error faults, got {fault!r}"
                )
        if not items and not headers:
            raise ConfigurationError("FaultMiddleware needs faults= or headers=True")
        check_callable("app", app, allow_none=False)
        self.app = app
        self.seed: int = check_int("seed", new_seed() if seed is None else seed, minimum=-(2**63))
        self._clock = check_clock("clock", clock)
        self._core = (
            FaultCore([(f, None) for f in items], seed=self.seed, epoch=self._clock.monotonic())
            if items
            else None
        )
        self._headers = check_bool("headers", headers)
        if header_prefix != "":  # "" is allowed: the bare names ("abort-request")
            check_header_name("header_prefix", header_prefix)
        prefix = header_prefix.lower().encode("latin-1")
        self._abort_header = prefix + b"abort-request"
        self._abort_pct_header = prefix + b"abort-request-percentage"
        self._delay_header = prefix + b"delay-request"
        self._delay_pct_header = prefix + b"delay-request-percentage"
        self._max_header_delay = check_number("max_header_delay", max_header_delay)
        self._rng = random.Random(f"{self.seed}/headers")
        self._rng_lock = threading.Lock()
        self._header_faults = 0
        self._requests = 0  # HTTP requests seen (the core counts only when it has faults)

    def _draw(self) -> float:
        with self._rng_lock:
            return self._rng.random()

    def _from_headers(self, scope: Scope) -> tuple[float, int | None]:
        """``(delay seconds, abort status or None)`` asked for by the request's headers."""
        wanted: dict[bytes, bytes] = {}
        names = (
            self._abort_header,
            self._abort_pct_header,
            self._delay_header,
            self._delay_pct_header,
        )
        for name, value in scope.get("headers") or ():
            if name.lower() in names:
                wanted[name.lower()] = value
        if not wanted:
            return 0.0, None
        delay = 0.0
        status: int | None = None
        delay_ms = wanted.get(self._delay_header)
        if delay_ms is not None and self._draw() < _percentage(wanted.get(self._delay_pct_header)):
            try:
                seconds = float(delay_ms) / 1000.0
            except ValueError:
                seconds = 0.0
            # "nan" parses as a float and survives min/max: a client must not get a 500.
            delay = min(max(seconds, 0.0), self._max_header_delay) if seconds == seconds else 0.0
        code = wanted.get(self._abort_header)
        if code is not None and self._draw() < _percentage(wanted.get(self._abort_pct_header)):
            try:
                parsed = int(code)
            except ValueError:
                parsed = 0
            if 200 <= parsed <= 599:
                status = parsed
        if delay or status is not None:
            self._header_faults += 1
        return delay, status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection, injecting faults into HTTP requests."""
        if scope["type"] != "http" or self._off:
            await self.app(scope, receive, send)
            return
        self._requests += 1
        delay, status = self._from_headers(scope) if self._headers else (0.0, None)
        plan: Plan | None = None
        if self._core is not None:
            plan = self._core.decide(self._clock.monotonic(), (scope,), {})
            if plan is not None:
                if self._observed:
                    emit_plan(self, plan, scope.get("path"))
                delay += plan.delay
        if delay:
            await sleep_async(self._clock, delay)
        if status is not None:
            await self._respond(send, Status(status))
            return
        fault = plan.fault if plan is not None else None
        if fault is None:
            await self.app(scope, receive, send)
        elif isinstance(fault, Status):
            await self._respond(send, fault)
        elif isinstance(fault, Hang):
            await self._hang(receive)
        else:
            assert isinstance(fault, Error)
            raise fault.build()

    @staticmethod
    async def _respond(send: Send, fault: Status) -> None:
        headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in fault.header_list()
        ]
        body = b""
        # A 204 or 304 has no body and no Content-Length for one (RFC 9110): servers
        # that pass one on break the connection (h2) or the next response on it.
        if fault.code not in _BODILESS:
            body = fault.body or b"injected fault\n"
            headers.append((b"content-type", b"text/plain; charset=utf-8"))
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": fault.code, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _hang(receive: Receive) -> None:
        # Never answer; return (sending nothing) once the client has gone away.
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                return

    def statistics(self) -> FaultStatistics:
        """Requests seen and faults injected per kind (``"header"``: asked for by headers).

        Example: ``middleware.statistics().injected.get("status", 0)``
        """
        stats = FaultStatistics(0, {}) if self._core is None else statistics_of(self._core)
        injected = dict(stats.injected)
        if self._header_faults:
            injected["header"] = self._header_faults
        return FaultStatistics(self._requests, injected)

    def __repr__(self) -> str:
        return f"<FaultMiddleware {self.name!r} seed={self.seed}>"
