"""Virtual users and the recorder: what the demo measures, measured from the outside.

Each arrival (open loop, Poisson, seeded) is one user wanting one summary::

    POST /summaries -> GET /summaries/{id} -> GET /summaries/{id}/stream -> GET /summaries/{id}

The user measures every API call's latency, the first-token latency (from the stream's
``inference`` event to its first ``token`` event, both as received), and the job's
outcome (``full`` / ``degraded`` / ``failed``; a job not finished within the user's
patience is ``failed``). A shed or rate-limited POST is retried after its
``Retry-After`` while patience lasts. A separate "scraper" asks for unknown ids above its
per-user rate limit (the negative cache and the 429s show up in the report).

A sampler records, every ``interval`` seconds, what the upstreams measured themselves
(downloads in flight per domain, responses by status, model calls) and what each
service worker reports (breaker states, downloads it has in flight).

Example::

    recorder = Recorder()
    driver = LoadDriver(service_ports=[8000], platforms_port=8001, models_port=8002,
                        recorder=recorder, seed=1)
    await driver.run(phases)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ._asgi import LoopLag, tune_gc
from ._wire import LoopbackTransport, send
from .content import DOMAINS

__all__ = ["ApiSample", "JobRecord", "LoadDriver", "Phase", "Recorder"]


@dataclass
class Phase:
    """One phase of a run: its name, length, and the faults switched on during it.

    ``faults`` are ``(target, name, patch)`` with target ``"platform"``, ``"model"`` or
    ``"redis"``; each is applied when the phase starts and undone (``clear``) when it ends.
    """

    name: str
    seconds: float
    description: str
    faults: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    clear: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    rate_factor: float = 1.0


@dataclass
class JobRecord:
    """What one virtual user saw of one job."""

    t: float
    phase: str
    domain: str
    priority: str
    submitted: bool = False
    outcome: str = "pending"
    cached: bool = False
    first_token: float | None = None
    #: When the job reached the model (seconds into the run) and in which phase.
    inference_t: float | None = None
    inference_phase: str | None = None
    latency: float | None = None
    rejections: int = 0
    job_id: str | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass
class ApiSample:
    """One API call: when (seconds into the run), which endpoint, how long, what status."""

    t: float
    endpoint: str
    latency: float
    status: int
    phase: str


class Recorder:
    """Everything measured during one run, with the phase schedule."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.jobs: list[JobRecord] = []
        self.api: list[ApiSample] = []
        self.scraper: list[ApiSample] = []
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.phase = "starting"

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    def to_json(self) -> dict[str, Any]:
        """The raw measurements, JSON-ready."""
        return {
            "wall_start": self.wall0,
            "phases": self.phases,
            "jobs": [asdict(j) for j in self.jobs],
            "api": [asdict(a) for a in self.api],
            "scraper": [asdict(a) for a in self.scraper],
            "samples": self.samples,
        }


def _sse_events(buffer: bytes) -> tuple[list[tuple[str, str]], bytes]:
    events: list[tuple[str, str]] = []
    while b"\n\n" in buffer:
        raw, buffer = buffer.split(b"\n\n", 1)
        name, data = "message", ""
        for line in raw.decode().split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        events.append((name, data))
    return events, buffer


class LoadDriver:
    """Drives virtual users against the service and samples the system (see module doc)."""

    def __init__(
        self,
        *,
        service_ports: Sequence[int],
        platforms_port: int,
        models_port: int,
        recorder: Recorder,
        rate: float = 30.0,
        seed: int = 1,
        patience: float = 40.0,
        interval: float = 0.5,
        scraper_rate: float = 30.0,
        repeat_share: float = 0.12,
        batch_share: float = 0.2,
        domains: Sequence[str] = DOMAINS,
        on_phase: Callable[[Phase], Any] | None = None,
        redis_control: Any = None,
        ramp_seconds: float = 5.0,
    ) -> None:
        self.ports = list(service_ports)
        self.platforms = f"http://127.0.0.1:{platforms_port}"
        self.models = f"http://127.0.0.1:{models_port}"
        self.rec = recorder
        self.rate = rate
        self.rng = random.Random(seed)
        self.backoff_rng = random.Random(seed + 1)
        self.seed = seed
        self.patience = patience
        self.interval = interval
        self.scraper_rate = scraper_rate
        self.repeat_share = repeat_share
        self.batch_share = batch_share
        self.domains = list(domains)
        self.on_phase = on_phase
        self.redis_control = redis_control
        self.ramp_seconds = ramp_seconds
        self.transport = LoopbackTransport(max_idle=2048)
        self.control = httpx.AsyncClient(transport=LoopbackTransport(), timeout=5.0)
        self.tasks: set[asyncio.Task[None]] = set()
        self.counter = 0
        self.popular: dict[str, list[str]] = {d: [] for d in self.domains}
        self.live: dict[str, Any] = {}
        self.stop_sampling = asyncio.Event()
        self.lag = LoopLag()

    # -- one user -------------------------------------------------------------------

    def _base(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index % len(self.ports)]}"

    async def _call(
        self, method: str, url: str, endpoint: str, headers: dict[str, str], **kw: Any
    ) -> httpx.Response:
        start = time.monotonic()
        try:
            response = await send(self.transport, method, url, headers=headers, **kw)
            try:
                await response.aread()
            finally:
                await response.aclose()
        except BaseException:
            # An error, or a call still waiting when its user gave up (or the run ended):
            # its time counts, status 0 (a hung API must show in the percentiles).
            self.rec.api.append(
                ApiSample(self.rec.now(), endpoint, time.monotonic() - start, 0, self.rec.phase)
            )
            raise
        self.rec.api.append(
            ApiSample(
                self.rec.now(),
                endpoint,
                time.monotonic() - start,
                response.status_code,
                self.rec.phase,
            )
        )
        return response

    def _next_url(self) -> tuple[str, str]:
        domain = self.rng.choice(self.domains)
        popular = self.popular[domain]
        if popular and self.rng.random() < self.repeat_share:
            video = self.rng.choice(popular)
        else:
            self.counter += 1
            video = f"s{self.seed}n{self.counter}"
            if len(popular) < 25 and self.rng.random() < 0.3:
                popular.append(video)
        return domain, f"https://{domain}/watch/{video}"

    async def user(self, index: int, domain: str, url: str, priority: str) -> None:
        """One virtual user: submit, check, follow the stream, fetch the result."""
        record = JobRecord(self.rec.now(), self.rec.phase, domain, priority)
        self.rec.jobs.append(record)
        base = self._base(index)
        headers = {"x-user": f"user{index % 500}", "x-priority": priority}
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.patience):
                await self._user(record, base, url, headers, started)
        except TimeoutError:
            record.outcome = "failed"
            record.reasons.append("patience")
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            record.outcome = "failed"
            record.reasons.append(type(exc).__name__)
        record.latency = time.monotonic() - started

    async def _user(
        self, record: JobRecord, base: str, url: str, headers: dict[str, str], started: float
    ) -> None:
        while True:
            response = await self._call(
                "POST", f"{base}/summaries", "POST /summaries", headers, json={"url": url}
            )
            if response.status_code in (429, 503):
                record.rejections += 1
                retry = float(response.headers.get("retry-after", "1") or 1)
                # Its own generator: a rejection must not change the arrivals and URLs
                # that follow (both runs face the same seeded load).
                jitter = self.backoff_rng.random()
                await asyncio.sleep(min(2.0, max(0.05, retry)) * (0.5 + jitter))
                continue
            break
        if response.status_code == 200:
            doc = response.json()
            record.submitted, record.cached = True, True
            record.outcome = "degraded" if doc.get("degraded") else "full"
            record.job_id = doc.get("id")
            return
        if response.status_code != 202:
            record.outcome = "failed"
            record.reasons.append(f"POST {response.status_code}")
            return
        record.submitted = True
        job_id = response.json()["id"]
        record.job_id = job_id
        await self._call("GET", f"{base}/summaries/{job_id}", "GET /summaries/{id}", headers)
        await self._follow(record, base, job_id, headers)
        while record.outcome == "pending":  # the stream broke: poll the job
            await asyncio.sleep(0.5)
            doc = (
                await self._call(
                    "GET", f"{base}/summaries/{job_id}", "GET /summaries/{id}", headers
                )
            ).json()
            if doc.get("outcome") in ("full", "degraded", "failed", "not_found"):
                record.outcome = doc["outcome"]
        final = await self._call(
            "GET", f"{base}/summaries/{job_id}", "GET /summaries/{id}", headers
        )
        if final.status_code == 200:
            doc = final.json()
            record.reasons.extend(doc.get("reasons") or [])
            if doc.get("error"):
                record.reasons.append(str(doc["error"])[:120])

    async def _follow(
        self, record: JobRecord, base: str, job_id: str, headers: dict[str, str]
    ) -> None:
        start = time.monotonic()
        try:
            response = await send(
                self.transport, "GET", f"{base}/summaries/{job_id}/stream", headers=headers
            )
        except BaseException:
            self.rec.api.append(
                ApiSample(
                    self.rec.now(),
                    "GET /summaries/{id}/stream",
                    time.monotonic() - start,
                    0,
                    self.rec.phase,
                )
            )
            raise
        self.rec.api.append(
            ApiSample(
                self.rec.now(),
                "GET /summaries/{id}/stream",
                time.monotonic() - start,
                response.status_code,
                self.rec.phase,
            )
        )
        inference_at: float | None = None
        try:
            if response.status_code != 200:
                return
            buffer = b""
            with contextlib.suppress(httpx.HTTPError):
                async for chunk in response.aiter_raw():
                    events, buffer = _sse_events(buffer + chunk)
                    for name, data in events:
                        if name == "inference":
                            inference_at = time.monotonic()
                            # First-token latency counts in the phase the model is asked
                            # in (a job submitted in a fault phase may get there later).
                            record.inference_t = self.rec.now()
                            record.inference_phase = self.rec.phase
                        elif name == "token" and record.first_token is None:
                            if inference_at is not None:
                                record.first_token = time.monotonic() - inference_at
                        elif name == "done":
                            doc = json.loads(data)
                            record.outcome = str(doc.get("outcome", "failed"))
                            record.cached = bool(doc.get("cached"))
        finally:
            await response.aclose()

    # -- the scraper ----------------------------------------------------------------

    async def scraper(self) -> None:
        """Unknown ids at ``scraper_rate``/s from one user: negative cache and 429s."""
        if self.scraper_rate <= 0:
            return
        rng = random.Random(self.seed + 99)
        pending: set[asyncio.Task[None]] = set()
        n = 0
        try:
            while True:
                await asyncio.sleep(rng.expovariate(self.scraper_rate))
                n += 1
                if len(pending) < 64:
                    task = asyncio.create_task(self._scrape(n, f"nope{rng.randrange(200)}"))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
        finally:
            for task in pending:
                task.cancel()

    async def _scrape(self, n: int, job_id: str) -> None:
        start = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):
            response = await send(
                self.transport,
                "GET",
                f"{self._base(n)}/summaries/{job_id}",
                headers={"x-user": "scraper", "x-priority": "batch"},
            )
            await response.aread()
            await response.aclose()
            self.rec.scraper.append(
                ApiSample(
                    self.rec.now(),
                    "GET /summaries/{id}",
                    time.monotonic() - start,
                    response.status_code,
                    self.rec.phase,
                )
            )

    # -- the system, sampled --------------------------------------------------------

    async def _json(self, url: str) -> Any:
        try:
            response = await self.control.get(url)
            return response.json()
        except (httpx.HTTPError, ValueError):
            return None

    async def sampler(self) -> None:
        """Every ``interval``: upstream truth and service reports, into the recorder."""
        while not self.stop_sampling.is_set():
            t = self.rec.now()
            platforms, models, *workers = await asyncio.gather(
                self._json(f"{self.platforms}/_control/state"),
                self._json(f"{self.models}/_control/state"),
                *(self._json(f"http://127.0.0.1:{p}/internal/stats") for p in self.ports),
            )
            sample: dict[str, Any] = {"t": round(t, 3), "phase": self.rec.phase}
            if platforms:
                sample["platforms"] = {
                    d: {
                        "inflight": v["stats"]["inflight"],
                        "media_inflight": v["stats"]["media_inflight"],
                        "peak": v["stats"]["peak"],
                        "statuses": v["stats"]["statuses"],
                    }
                    for d, v in platforms["domains"].items()
                }
            if models:
                sample["models"] = {
                    t: {
                        "inflight": v["stats"]["inflight"],
                        "statuses": v["stats"]["statuses"],
                        "requests": v["stats"]["requests"],
                    }
                    for t, v in models["tiers"].items()
                }
            sample["driver_lag"] = self.lag.snapshot()
            sample["workers"] = [
                {
                    "loop_lag": w.get("loop_lag", {}),
                    "breakers": w.get("breakers", {}),
                    "downloads_inflight": w.get("downloads_inflight", {}),
                    "counts": w.get("counts", {}),
                    "jobs_running": w.get("jobs_running", 0),
                    "model_calls": w.get("model_calls", {}),
                    "download_errors": w.get("download_errors", {}),
                }
                for w in workers
                if w
            ]
            self.rec.samples.append(sample)
            self.live = sample
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_sampling.wait(), self.interval)

    # -- faults ---------------------------------------------------------------------

    async def apply(self, faults: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """Switch faults on or off through the upstreams' control endpoints (or Redis)."""
        for target, name, patch in faults:
            if target == "platform":
                await self.control.post(f"{self.platforms}/_control/domains/{name}", json=patch)
            elif target == "model":
                await self.control.post(f"{self.models}/_control/tiers/{name}", json=patch)
            elif target == "redis" and self.redis_control is not None:
                await asyncio.to_thread(self.redis_control, patch)

    # -- a whole run ----------------------------------------------------------------

    async def run(self, phases: Sequence[Phase], *, drain: float) -> None:
        """Run every phase in order, then wait up to ``drain`` s for jobs to finish."""
        restore_gc = tune_gc()
        self.lag.start()
        sampler = asyncio.create_task(self.sampler())
        scraper = asyncio.create_task(self.scraper())
        try:
            for i, phase in enumerate(phases):
                self.rec.phase = phase.name
                start = self.rec.now()
                await self.apply(phase.faults)
                if self.on_phase is not None:
                    self.on_phase(phase)
                await self._arrivals(phase, ramp=(i == 0))
                await self.apply(phase.clear)
                self.rec.phases.append(
                    {
                        "name": phase.name,
                        "description": phase.description,
                        "start": round(start, 3),
                        "end": round(self.rec.now(), 3),
                        "faults": [[t, n] for t, n, _ in phase.faults],
                    }
                )
            self.rec.phase = "drain"
            scraper.cancel()
            pending = [t for t in self.tasks if not t.done()]
            if pending:
                await asyncio.wait(pending, timeout=drain)
            for task in self.tasks:
                task.cancel()
            for record in self.rec.jobs:
                if record.outcome == "pending":
                    record.outcome = "failed"
                    record.reasons.append("unfinished at end of run")
        finally:
            self.lag.stop()
            scraper.cancel()
            self.stop_sampling.set()
            await asyncio.gather(sampler, scraper, return_exceptions=True)
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.transport.aclose()
            await self.control.aclose()
            restore_gc()

    async def _arrivals(self, phase: Phase, *, ramp: bool) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + phase.seconds
        ramp_until = loop.time() + min(phase.seconds / 2, self.ramp_seconds) if ramp else 0.0
        next_at = loop.time()
        while True:
            now = loop.time()
            rate = self.rate * phase.rate_factor * (2.0 if now < ramp_until else 1.0)
            next_at += self.rng.expovariate(rate)
            if next_at >= end:
                await asyncio.sleep(max(0.0, end - loop.time()))
                return
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            domain, url = self._next_url()
            priority = "batch" if self.rng.random() < self.batch_share else "interactive"
            index = len(self.rec.jobs)
            task = asyncio.create_task(self.user(index, domain, url, priority))
            self.tasks.add(task)
