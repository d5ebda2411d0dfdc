"""The seam between the pipeline and the resilience library: who may call an upstream, when.

The pipeline asks two questions and never looks behind them:

* :meth:`Downloads.slot` -- may I send this download attempt to ``domain`` now? (an
  async context manager that is held for the whole transfer and records its outcome)
* :meth:`Downloads.retry` -- the retry policy wrapped around one attempt.

:class:`ResilientDownloads` composes the library's policies per domain, in the order the
seed article arrived at: a **bulkhead per domain** (interactive jobs before batch ones),
a **token bucket per domain** (pace, never burst a platform), a **circuit breaker per
domain** (a 429 is not a failure, a 5xx or a timeout is), and **budgeted, jittered
retries** that honour ``Retry-After`` and the breaker's cool-down. With a Redis backend
the bulkhead leases, the buckets and the breaker trips are shared by every worker.

:class:`NaiveDownloads` is the article's starting point: one global semaphore, no
breaker, fixed-delay retries.

Example::

    downloads = build_downloads(cfg, backend=None, events=recorder)
    async with downloads.slot("vidhub.test", priority=0) as attempt:
        response = await send()
        attempt.result(response.status_code)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

import resilience as rs
from resilience import backoff

from .config import ServiceConfig

__all__ = [
    "Attempt",
    "Downloads",
    "EventLog",
    "NaiveDownloads",
    "NotFound",
    "Refused",
    "ResilientDownloads",
    "TooLarge",
    "TransportDownloads",
    "UpstreamStatus",
    "build_backend",
    "build_downloads",
    "retryable",
]


class UpstreamStatus(Exception):
    """An upstream answered with a retryable status (429, 5xx); ``retry_after`` if it said."""

    def __init__(self, status: int, retry_after: float | None = None) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.retry_after = retry_after


class NotFound(Exception):
    """The upstream says the resource does not exist (404): never retried."""


class Refused(Exception):
    """The upstream refused the request for good (a redirect, 401, 403, 410, ...; any
    status but 2xx, 404, 408, 416, 429 and 5xx): asking again gets the same answer, so
    it is never retried."""

    def __init__(self, status: int) -> None:
        super().__init__(f"upstream refused with {status}")
        self.status = status


class TooLarge(Exception):
    """A download went past ``max_download_bytes``: never retried."""


def retryable(exc: BaseException) -> bool:
    """Transport errors, timeouts, 429/5xx answers and rejections by a policy."""
    return isinstance(exc, httpx.TransportError | UpstreamStatus | rs.Rejected | TimeoutError)


class EventLog:
    """Appends JSON lines (breaker transitions, job outcomes) to a file shared by workers.

    Lines are short and written with one ``write`` in append mode, so several worker
    processes can share one file. ``None`` path: events are only counted.
    """

    def __init__(self, path: str | None, worker: int = 0) -> None:
        self.path = path
        self.worker = worker
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None

    def write(self, kind: str, **fields: Any) -> None:
        """Record one event of ``kind`` with ``fields``."""
        self.counts[kind] += 1
        if self._fd is None:
            return
        line = json.dumps({"t": time.time(), "kind": kind, "worker": self.worker, **fields})
        with self._lock:
            os.write(self._fd, line.encode() + b"\n")

    def listener(self, event: rs.Event) -> None:
        """A resilience listener: records state changes (breakers) and backend failovers."""
        if isinstance(event, rs.StateChanged):
            self.write(
                "state", policy=event.policy, key=_text(event.key), old=event.old, new=event.new
            )
        elif isinstance(event, rs.BackendFallback):
            self.write("backend_fallback", policy=event.policy, mode=event.mode)
        elif isinstance(event, rs.BackendRecovered):
            self.write("backend_recovered", policy=event.policy)

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _text(key: object) -> str | None:
    return None if key is None else str(key)


class Attempt:
    """One admitted attempt: tell it how the upstream answered (``result``) or raise.

    The breaker judges the upstream by its answer, not by the transfer that follows:
    ``result(status)`` records the outcome as soon as the response head arrives (a 5xx
    is a failure, a 429 is neither, anything else a success), so a half-open probe
    takes one round trip, not one whole download. An attempt that ends by an exception
    before ``result`` is a failure (a timeout, a refused connection).
    """

    __slots__ = ("permit", "status")

    def __init__(self, permit: Any) -> None:
        self.permit = permit
        self.status = 0

    def result(self, status: int) -> None:
        """Record the HTTP status of the answer (call it before reading the body)."""
        self.status = status
        permit = self.permit
        if permit is None:
            return
        self.permit = None
        if status == 429:
            permit.ignore()  # the platform is alive, only pacing us
        elif status >= 500:
            permit.failure(UpstreamStatus(status))
        else:
            permit.success()

    def settle(self, exc: BaseException | None) -> None:
        """Record the outcome of an attempt that never got an answer (or ended cleanly)."""
        permit = self.permit
        if permit is None:
            return
        self.permit = None
        if exc is None:
            permit.success()
        elif isinstance(exc, Exception) and not isinstance(exc, NotFound):
            permit.failure(exc)
        else:
            permit.ignore()


class Downloads:
    """Admission and retries for download attempts (see the module docstring)."""

    resilient = False

    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg
        #: The httpx transport download attempts are sent through.
        self.transport: httpx.AsyncBaseTransport | None = None
        self.inflight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        #: Why attempts failed, by "domain error-type" (for the stats endpoint).
        self.errors: Counter[str] = Counter()
        self.retry: Any = None

    def _enter(self, domain: str) -> None:
        n = self.inflight[domain] + 1
        self.inflight[domain] = n
        if n > self.peak[domain]:
            self.peak[domain] = n

    def _leave(self, domain: str) -> None:
        self.inflight[domain] -= 1

    def admitted(self) -> dict[str, int]:
        """Downloads holding a slot now, per domain (attempts still queued left out)."""
        return {domain: n for domain, n in self.inflight.items() if n}

    def slot(self, domain: str, priority: int) -> contextlib.AbstractAsyncContextManager[Attempt]:
        """Admission for one attempt to ``domain`` (held during the whole transfer)."""
        raise NotImplementedError

    def breaker_states(self) -> dict[str, str]:
        """Breaker state per domain (empty when there are no breakers)."""
        return {}

    def timeout(self) -> httpx.Timeout:
        """The per-attempt httpx timeout."""
        raise NotImplementedError

    def request_extensions(self, priority: int) -> dict[str, Any]:
        """Extensions of a download request (none unless the seam reads them)."""
        return {}


class ResilientDownloads(Downloads):
    """Per-domain bulkhead + token bucket + breaker, budgeted jittered retries."""

    resilient = True

    def __init__(self, cfg: ServiceConfig, *, backend: Any = None, events: EventLog) -> None:
        super().__init__(cfg)
        self.bulkhead = rs.Bulkhead(
            cfg.domain_limit,
            key=lambda domain, *a, **k: domain,
            max_wait=cfg.slot_wait,
            backend=backend,
            # while Redis is down each worker keeps its share of the fleet-wide limit
            local_limit=max(1, cfg.domain_limit // max(1, cfg.workers)),
            # A lease lost mid-transfer (Redis restarted) is an event, not the download's
            # failure: what arrived is whole, and the slot is gone either way.
            on_lease_lost="event",
            name="summarizer.downloads",
        )
        self.limiter = rs.RateLimiter(
            rs.Rate(int(cfg.domain_rate), 1.0),
            burst=cfg.domain_burst,
            backend=backend,
            name="summarizer.domain-rate",
        )
        self.breaker = rs.CircuitBreaker(
            failure_rate=cfg.breaker_failure_rate,
            window=cfg.breaker_window,
            min_calls=cfg.breaker_min_calls,
            open_for=cfg.breaker_open_for,
            half_open_calls=cfg.breaker_half_open_calls,
            key=lambda domain, *a, **k: domain,
            backend=backend,
            name="summarizer.domain",
        )
        self.breaker.add_listener(events.listener)
        self.bulkhead.add_listener(events.listener)
        self.limiter.add_listener(events.listener)
        self.budget = rs.RetryBudget(cfg.budget_ratio, cfg.budget_min_per_second)
        self.retry = rs.Retry(
            on=retryable,
            attempts=cfg.attempts,
            backoff=backoff.full_jitter(cfg.backoff_base, cap=cfg.backoff_cap),
            budget=self.budget,
            name="summarizer.download-retry",
        )
        self._timeout = httpx.Timeout(
            cfg.read_timeout, connect=cfg.connect_timeout, pool=cfg.connect_timeout
        )

    @contextlib.asynccontextmanager
    async def slot(self, domain: str, priority: int) -> AsyncIterator[Attempt]:
        """Bulkhead slot, then a token, then the breaker; outcome recorded on exit."""
        permit = await self.bulkhead.acquire_async(domain, priority=priority)
        try:
            await self.limiter.acquire_async(domain, max_wait=self.cfg.rate_wait)
            attempt = Attempt(self.breaker.acquire_nowait(domain))
            self._enter(domain)
            try:
                yield attempt
            except BaseException as exc:
                attempt.settle(exc)
                self.errors[f"{domain} {type(exc).__name__}"] += 1
                raise
            else:
                attempt.settle(None)
            finally:
                self._leave(domain)
        finally:
            # never the sync release() here: with a Redis backend it is a blocking
            # round trip (up to the backend timeout) on the event loop
            await permit.release_async()

    def breaker_states(self) -> dict[str, str]:
        """Breaker state per domain."""
        return {d: self.breaker.state_of(d).value for d in self.cfg.domains}

    def timeout(self) -> httpx.Timeout:
        """Short connect/read timeouts: a silent platform fails fast and trips its breaker."""
        return self._timeout


class TransportDownloads(Downloads):
    """The same policies, applied by :class:`resilience.httpx.ResilientTransport`.

    The transport holds the per-domain bulkhead slot until the body is closed, paces
    each domain with its token bucket, keeps a breaker per domain (429: not a failure),
    retries idempotent requests with jittered backoff within the retry budget and obeys
    ``Retry-After``. What it cannot see -- a body cut off mid-transfer -- is retried
    here, by resuming from the ``.part`` file, within the same budget.
    """

    resilient = True

    def __init__(self, cfg: ServiceConfig, *, backend: Any = None, events: EventLog) -> None:
        super().__init__(cfg)
        from resilience.httpx import PRIORITY, ResilientTransport

        composed = ResilientDownloads(cfg, backend=backend, events=events)
        self.bulkhead = composed.bulkhead
        self.limiter = composed.limiter
        self.breaker = composed.breaker
        self.budget = composed.budget
        self.retry = composed.retry
        self._timeout = composed.timeout()
        self._priority_key = PRIORITY
        self.transport_factory: Callable[[Any], httpx.AsyncBaseTransport] = lambda inner: (
            ResilientTransport(
                inner,
                bulkhead=self.bulkhead,
                limiter=self.limiter,
                breaker=self.breaker,
                attempts=cfg.attempts,
                backoff=backoff.full_jitter(cfg.backoff_base, cap=cfg.backoff_cap),
                budget=self.budget,
                max_wait=cfg.slot_wait,
                name="summarizer.downloads-transport",
            )
        )

    def request_extensions(self, priority: int) -> dict[str, Any]:
        """Per-request extensions: the job's priority for the bulkhead queue."""
        return {self._priority_key: priority}

    @contextlib.asynccontextmanager
    async def slot(self, domain: str, priority: int) -> AsyncIterator[Attempt]:
        """No admission here (the transport does it); only bookkeeping."""
        self._enter(domain)
        try:
            yield Attempt(None)
        except BaseException as exc:
            self.errors[f"{domain} {type(exc).__name__}"] += 1
            raise
        finally:
            self._leave(domain)

    def breaker_states(self) -> dict[str, str]:
        """Breaker state per domain."""
        return {d: self.breaker.state_of(d).value for d in self.cfg.domains}

    def admitted(self) -> dict[str, int]:
        """See :meth:`Downloads.admitted`: the transport's bulkhead slots held (the
        attempts counted by :meth:`slot` include those queued inside the transport)."""
        held = {d: self.bulkhead.statistics(d).in_flight for d in self.cfg.domains}
        return {domain: n for domain, n in held.items() if n}

    def timeout(self) -> httpx.Timeout:
        """The same short timeouts as the composed seam."""
        return self._timeout


class NaiveDownloads(Downloads):
    """One global semaphore, no breaker, fixed-delay retries: the seed's starting point."""

    def __init__(self, cfg: ServiceConfig) -> None:
        super().__init__(cfg)
        self.semaphore = asyncio.Semaphore(cfg.global_limit)
        self.retry = rs.Retry(
            on=retryable,
            attempts=cfg.naive_attempts,
            backoff=backoff.constant(cfg.naive_retry_delay),
            respect_retry_after=False,
            name="summarizer.naive-retry",
        )
        self._timeout = httpx.Timeout(cfg.naive_timeout)

    @contextlib.asynccontextmanager
    async def slot(self, domain: str, priority: int) -> AsyncIterator[Attempt]:
        """Wait for the global semaphore, however long it takes."""
        async with self.semaphore:
            self._enter(domain)
            try:
                yield Attempt(None)
            except BaseException as exc:
                self.errors[f"{domain} {type(exc).__name__}"] += 1
                raise
            finally:
                self._leave(domain)

    def timeout(self) -> httpx.Timeout:
        """httpx-like generous timeouts."""
        return self._timeout


def build_backend(cfg: ServiceConfig) -> Any:
    """The shared-state backend: Redis when ``cfg.redis_url`` is set, else ``None`` (memory)."""
    if not cfg.redis_url:
        return None
    from resilience.backends import RedisBackend

    return RedisBackend.from_url(cfg.redis_url, prefix="summarizer")


def build_downloads(
    cfg: ServiceConfig, *, backend: Any, events: EventLog, inner: httpx.AsyncBaseTransport
) -> Downloads:
    """The download policies for ``cfg.mode`` (and ``cfg.download_seam``), with their client.

    ``inner`` is the network transport; in ``"transport"`` seam it is wrapped in a
    :class:`resilience.httpx.ResilientTransport`.
    """
    downloads: Downloads
    if not cfg.resilient:
        downloads = NaiveDownloads(cfg)
    elif cfg.download_seam == "transport":
        transport_downloads = TransportDownloads(cfg, backend=backend, events=events)
        inner = transport_downloads.transport_factory(inner)
        downloads = transport_downloads
    else:
        downloads = ResilientDownloads(cfg, backend=backend, events=events)
    downloads.transport = inner
    return downloads
