"""The summarizer service: a Starlette app over the pipeline.

Endpoints::

    POST /summaries {"url": ...}        202 {"id", "stream"} (a job started or joined)
                                        200 {"id", "summary", "cached": true} from cache
                                        404 source known not to exist (negative cache)
                                        503 the service is shutting down
    GET  /summaries/{id}                the job (stages, outcome, summary when done)
    GET  /summaries/{id}/stream         SSE: stage / inference / token / done events
                                        (``shutdown`` instead of ``done``: the service
                                        stopped first; the job is then cancelled)
    GET  /healthz                       liveness
    GET  /metrics                       Prometheus (policy series + service series)
    GET  /internal/stats                counters, downloads in flight, breaker states

In resilient mode the app runs behind the library's middleware, outermost first:
``TimeoutMiddleware`` (request deadline, streams exempt), ``RateLimitMiddleware`` (per
user from ``X-User``, IETF ``RateLimit`` headers) and ``ConcurrencyLimitMiddleware``
(load shedding: a bounded, prioritised queue, interactive before batch by
``X-Priority``). Naive mode has none of them.

Example::

    app = create_app(ServiceConfig(mode="resilient", platforms=("127.0.0.1", 8001)))
    uvicorn.run(app, port=8000)

Served by :func:`~integrations.summarizer.servers.uvicorn_server` (as ``serve`` and the
tests do), open streams end with a ``shutdown`` event as soon as the server is asked to
exit; plain uvicorn runs nothing before its requests in flight end, so there a stream
holds the shutdown until its job ends (give it ``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import resilience as rs

from ._asgi import LoopLag, tune_gc
from ._wire import LoopbackTransport
from .cache import CacheUnavailable, build_cache
from .config import ServiceConfig
from .inference import Summarizer
from .jobs import TtlSet
from .pipeline import BadRequest, Pipeline, canonical_url, parse_url
from .policies import EventLog, build_backend, build_downloads

__all__ = ["Service", "create_app", "create_app_from_env"]

_PRIORITIES = {"interactive": 0, "default": 5, "batch": 10}

#: How long closing waits for the cancelled jobs to record their end (seconds).
_CANCEL_GRACE = 3.0


def _priority(request: Request, body: dict[str, Any]) -> int:
    raw = str(body.get("priority") or request.headers.get("x-priority") or "default").lower()
    if raw in _PRIORITIES:
        return _PRIORITIES[raw]
    # ASCII digits, and few: "²" passes isdigit() and thousands of digits pass
    # isdecimal(), but int() refuses both (a 500, not a priority).
    return min(10, max(0, int(raw))) if raw.isascii() and raw.isdecimal() and len(raw) <= 9 else 5


class Service:
    """Everything one worker process holds: config, client, policies, pipeline, caches."""

    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg
        self.started = time.time()
        Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
        self.events = EventLog(cfg.events_path, cfg.worker_index)
        self.backend = build_backend(cfg) if cfg.resilient else None
        self.transport = LoopbackTransport(cfg.routes())
        cache_path = cfg.cache_path or os.path.join(cfg.workdir, "cache.sqlite")
        self.cache = build_cache(cfg.redis_url, cache_path)
        cache_breaker = getattr(self.cache, "breaker", None)
        if cache_breaker is not None:
            cache_breaker.add_listener(self.events.listener)
        self.unknown_ids = TtlSet(cfg.negative_ttl)
        self.downloads = build_downloads(
            cfg, backend=self.backend, events=self.events, inner=LoopbackTransport(cfg.routes())
        )
        self.summarizer = Summarizer(cfg, self.transport, backend=self.backend, events=self.events)
        self.pipeline = Pipeline(cfg, self.downloads, self.summarizer, self.cache, self.events)
        self.lag = LoopLag()
        self.metrics: Any = None
        self.api_counts: dict[str, int] = {"unknown_id_hits": 0, "negative_source_hits": 0}
        self._job_metric: Any = None
        self._first_token_metric: Any = None
        #: Set when the server starts shutting down: streams end, submissions get a 503.
        self.stopping = asyncio.Event()

    def install_metrics(self) -> Any:
        """Prometheus: the library's policy series plus the service's own."""
        from prometheus_client import Counter, Histogram

        from resilience.observability import PrometheusMetrics

        self.metrics = PrometheusMetrics()
        # only this service's policies feed the registry (no global listener)
        for policy in self._policies():
            policy.add_listener(self.metrics)
        self._job_metric = Counter(
            "summarizer_jobs", "Jobs by outcome", ["outcome"], registry=self.metrics.registry
        )
        self._first_token_metric = Histogram(
            "summarizer_first_token_seconds",
            "Inference start to first token",
            registry=self.metrics.registry,
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0),
        )
        return self.metrics

    def _policies(self) -> list[Any]:
        found: list[Any] = []
        for name in ("bulkhead", "limiter", "breaker", "retry"):
            policy = getattr(self.downloads, name, None)
            if policy is not None:
                found.append(policy)
        if self.summarizer.breaker is not None:
            found.append(self.summarizer.breaker)
        return found

    def job_finished(self, job: Any) -> None:
        """Feed the service metrics when a job ends."""
        if self._job_metric is None:
            return
        self._job_metric.labels(job.outcome).inc()
        if job.first_token is not None and job.inference_started is not None:
            self._first_token_metric.observe(job.first_token - job.inference_started)

    def shutdown_started(self) -> None:
        """The server was asked to exit: end every stream (a ``shutdown`` event) now.

        Called by the server (:func:`~integrations.summarizer.servers.uvicorn_server`)
        before it waits for the requests in flight, which the lifespan shutdown (and so
        :meth:`close`) only follows: a stream that lasted until its job ended held the
        shutdown up to ``job_deadline``. New jobs are refused from now on (a 503).
        """
        self.stopping.set()
        for job in list(self.pipeline.jobs.by_id.values()):
            if not job.ended:
                job.wake()

    async def close(self) -> None:
        """Cancel running jobs and let them record their end, close clients and files.

        A cancelled job stores its final document (``failed``, error ``cancelled``) as it
        ends: the store must still be open then, or its id is unknown after a restart.
        """
        self.shutdown_started()
        self.lag.stop()
        tasks = list(self.pipeline.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_GRACE)
        await self.transport.aclose()
        if self.downloads.transport is not None:
            await self.downloads.transport.aclose()
        self.cache.close()
        self.events.close()

    # -- endpoints -----------------------------------------------------------------

    async def submit(self, request: Request) -> Response:
        """``POST /summaries``."""
        try:
            body = await request.json()
            url = str(body["url"])
            domain, video_id = parse_url(url, self.cfg.domains)
        except (ValueError, KeyError, TypeError, BadRequest, RecursionError) as exc:
            # RecursionError: JSON nested too deep for the parser (a 500 otherwise).
            return JSONResponse({"error": str(exc) or "bad request"}, status_code=422)
        # One spelling per video (scheme, host case, port, query, fragment and slashes
        # aside): the job table, the caches and the media directory must agree on what
        # "the same URL" is, or two spellings run two jobs in one directory.
        url = canonical_url(domain, video_id)
        if self.stopping.is_set():  # the job would be cancelled at once
            return JSONResponse(
                {"error": "the service is shutting down"},
                status_code=503,
                headers={"retry-after": "1"},
            )
        priority = _priority(request, body)
        if await self.cache.is_missing(url):
            self.api_counts["negative_source_hits"] += 1
            return JSONResponse({"error": "no such video", "cached": True}, status_code=404)
        entry = None if url in self.pipeline.jobs.running else await self.cache.get_url(url)
        if entry is not None:
            age = time.time() - float(entry.get("checked_at", 0))
            if age < self.cfg.cache_freshness:
                self.pipeline.counts["cache_hits"] += 1
                return JSONResponse(
                    {
                        "id": entry.get("id"),
                        "status": "done",
                        "outcome": "full",
                        "summary": entry.get("summary"),
                        "version": entry.get("version"),
                        "cached": True,
                    }
                )
        job = self.pipeline.start(url, domain, video_id, priority, revalidate=entry)
        return JSONResponse(
            {"id": job.id, "status": job.status, "stream": f"/summaries/{job.id}/stream"},
            status_code=202,
        )

    async def _lookup(self, job_id: str) -> tuple[Any, dict[str, Any] | None]:
        """The job (running or recent) or its stored document; raises
        :class:`CacheUnavailable` when only the store could tell and it is down."""
        job = self.pipeline.jobs.get(job_id)
        if job is not None:
            return job, None
        if job_id in self.unknown_ids:
            self.api_counts["unknown_id_hits"] += 1
            return None, None
        doc = await self.cache.get_result(job_id)
        if doc is None:  # a real miss, not an outage: remember it for a short while
            self.unknown_ids.add(job_id)
        return None, doc

    @staticmethod
    def _store_down() -> Response:
        # Not a 404: the id may well exist, the store that knows it is down for now.
        return JSONResponse(
            {"error": "the summary store is temporarily unavailable"},
            status_code=503,
            headers={"retry-after": "1"},
        )

    async def get(self, request: Request) -> Response:
        """``GET /summaries/{id}``."""
        try:
            job, doc = await self._lookup(request.path_params["id"])
        except CacheUnavailable:
            return self._store_down()
        if job is not None:
            return JSONResponse(job.public())
        if doc is not None:
            return JSONResponse(doc)
        return JSONResponse({"error": "unknown summary id"}, status_code=404)

    async def stream(self, request: Request) -> Response:
        """``GET /summaries/{id}/stream`` (Server-Sent Events)."""
        try:
            job, doc = await self._lookup(request.path_params["id"])
        except CacheUnavailable:
            return self._store_down()
        if job is None and doc is None:
            return JSONResponse({"error": "unknown summary id"}, status_code=404)

        async def events() -> AsyncIterator[bytes]:
            if job is None:
                yield b"event: done\ndata: " + json.dumps(doc).encode() + b"\n\n"
                return
            async for event in job.follow(stop=self.stopping):
                yield event

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``."""
        return JSONResponse({"status": "ok", "mode": self.cfg.mode, "pid": os.getpid()})

    async def stats(self, request: Request) -> Response:
        """``GET /internal/stats``."""
        doc = self.pipeline.stats()
        doc["api"] = dict(self.api_counts)
        doc["pid"] = os.getpid()
        doc["loop_lag"] = self.lag.snapshot()
        doc["time"] = time.time()
        return JSONResponse(doc)


def _middleware(cfg: ServiceConfig, backend: Any, service: Service) -> list[Middleware]:
    if not cfg.resilient:
        return []
    from resilience.asgi import (
        ConcurrencyLimitMiddleware,
        RateLimitMiddleware,
        Rule,
        TimeoutMiddleware,
        header,
        header_priority,
    )

    stream = "/summaries/{id}/stream"
    internal = ["/healthz", "/metrics", "/internal/*"]
    user_limiter = rs.RateLimiter(
        cfg.user_rate, burst=cfg.user_burst, backend=backend, name="summarizer.user-rate"
    )
    api_bulkhead = rs.Bulkhead(
        cfg.api_concurrency, max_wait=cfg.api_max_wait, name="summarizer.api"
    )
    for policy in (user_limiter, api_bulkhead):
        policy.add_listener(service.events.listener)
    return [
        Middleware(
            TimeoutMiddleware,
            seconds=cfg.request_timeout,
            rules=[Rule(stream, seconds=None), *(Rule(p, exempt=True) for p in internal)],
        ),
        Middleware(
            RateLimitMiddleware,
            limiter=user_limiter,
            key=header("x-user", default="anonymous"),
            exempt=internal,
        ),
        Middleware(
            ConcurrencyLimitMiddleware,
            bulkhead=api_bulkhead,
            priority=header_priority("x-priority"),
            rules=[Rule(stream, exempt=True), *(Rule(p, exempt=True) for p in internal)],
        ),
    ]


def create_app(cfg: ServiceConfig | None = None) -> Starlette:
    """The service as an ASGI app (its pipeline starts with the app's lifespan)."""
    cfg = cfg or ServiceConfig.from_env()
    holder: dict[str, Service] = {}

    def service() -> Service:
        return holder["service"]

    async def submit(request: Request) -> Response:
        return await service().submit(request)

    async def get(request: Request) -> Response:
        return await service().get(request)

    async def stream(request: Request) -> Response:
        return await service().stream(request)

    async def healthz(request: Request) -> Response:
        return await service().healthz(request)

    async def stats(request: Request) -> Response:
        return await service().stats(request)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        holder["service"].lag.start()
        restore_gc = tune_gc()
        try:
            yield
        finally:
            await holder["service"].close()
            restore_gc()

    svc = Service(cfg)
    holder["service"] = svc
    metrics = svc.install_metrics()
    svc.pipeline.on_finish = svc.job_finished

    routes = [
        Route("/summaries", submit, methods=["POST"]),
        Route("/summaries/{id}", get, methods=["GET"]),
        Route("/summaries/{id}/stream", stream, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/internal/stats", stats, methods=["GET"]),
        Route("/metrics", metrics.asgi_app()),
    ]
    app = Starlette(routes=routes, middleware=_middleware(cfg, svc.backend, svc), lifespan=lifespan)
    app.state.service = svc
    app.state.on_shutdown_started = svc.shutdown_started  # see servers.uvicorn_server
    return app


def create_app_from_env() -> Starlette:
    """The app configured by the ``SUMMARIZER_CONFIG`` environment variable (for workers)."""
    return create_app(ServiceConfig.from_env())
