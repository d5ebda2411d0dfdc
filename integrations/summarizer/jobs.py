"""Jobs: one summary request, its stages, and the event stream clients follow.

A :class:`Job` is an append-only list of events (``stage``, ``inference``, ``token``,
``done``) plus a wake-up signal; any number of SSE clients read it from any index, so a
client that connects late still gets everything, and nothing is buffered per client. A
stream that the service ends before its job does (a shutdown) ends with a ``shutdown``
event instead of ``done``.

Example::

    job = Job.new("https://vidhub.test/watch/abc", "vidhub.test", "abc", priority=0)
    job.emit("stage", {"stage": "metadata", "status": "done"})
    async for chunk in job.follow():    # SSE bytes: one or more whole events
        ...
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STAGES", "Job", "JobTable", "TtlSet"]

#: The download stages, in the order the seed's pipeline ran them.
STAGES = ("metadata", "video", "audio", "subtitles")

FINAL = frozenset({"done", "failed", "not_found"})


@dataclass(eq=False)
class Job:
    """One summary job (see the module docstring)."""

    id: str
    url: str
    domain: str
    video_id: str
    priority: int
    created: float
    status: str = "queued"
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int | None = None
    etag: str | None = None
    title: str | None = None
    summary: str = ""
    degraded: bool = False
    reasons: list[str] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)
    cached: bool = False
    error: str | None = None
    inference_started: float | None = None
    first_token: float | None = None
    finished: float | None = None
    events: list[bytes] = field(default_factory=list)
    #: Set with the last event, ``done``: the stream is complete. (``final`` comes
    #: earlier: the pipeline may still write the cache before it sends ``done``.)
    ended: bool = False
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def new(cls, url: str, domain: str, video_id: str, priority: int) -> Job:
        """A fresh queued job with a random id."""
        job = cls(uuid.uuid4().hex[:16], url, domain, video_id, priority, time.time())
        for stage in STAGES:
            job.stages[stage] = {"status": "pending", "bytes": 0, "attempts": 0, "resumed_from": 0}
        return job

    @property
    def final(self) -> bool:
        """Whether the job has ended (done, failed or not found)."""
        return self.status in FINAL

    @property
    def outcome(self) -> str:
        """``full``, ``degraded``, ``failed``, ``not_found`` or ``running``."""
        if self.status == "done":
            return "degraded" if self.degraded else "full"
        return self.status if self.final else "running"

    def emit(self, name: str, data: dict[str, Any]) -> None:
        """Append an event (encoded once, as Server-Sent Events) and wake every follower."""
        payload = json.dumps(data, separators=(",", ":"))
        self.events.append(f"event: {name}\ndata: {payload}\n\n".encode())
        if name == "done":
            self.ended = True
        self.wake()

    def wake(self) -> None:
        """Wake every follower without an event (to look at its ``stop`` signal)."""
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def follow(
        self, start: int = 0, *, stop: asyncio.Event | None = None
    ) -> AsyncIterator[bytes]:
        """Every event (SSE bytes) from index ``start`` on, through the ``done`` event.

        Events that are already waiting go out as one chunk: one socket write for a
        burst of tokens instead of one per token (SSE events delimit themselves).

        If ``stop`` is set before the job ends (the service is shutting down; set it,
        then :meth:`wake` the job), the stream ends after the events already there with
        a ``shutdown`` event instead of ``done``: an SSE client would otherwise hold the
        server's graceful shutdown until its job ends.
        """
        index = start
        while True:
            events = self.events
            if index < len(events):
                pending = events[index:]
                index += len(pending)
                yield pending[0] if len(pending) == 1 else b"".join(pending)
            if self.ended:
                return
            if stop is not None and stop.is_set():
                data = {"id": self.id, "reason": "the service is shutting down"}
                payload = json.dumps(data, separators=(",", ":"))
                yield f"event: shutdown\ndata: {payload}\n\n".encode()
                return
            await self._wake.wait()

    def public(self) -> dict[str, Any]:
        """The JSON document served by ``GET /summaries/{id}``."""
        doc: dict[str, Any] = {
            "id": self.id,
            "url": self.url,
            "status": self.status,
            "outcome": self.outcome,
            "priority": self.priority,
            "stages": self.stages,
            "version": self.version,
            "title": self.title,
            "cached": self.cached,
        }
        if self.final:
            doc.update(
                summary=self.summary,
                degraded=self.degraded,
                reasons=self.reasons,
                tiers=self.tiers,
                error=self.error,
            )
        return doc


class JobTable:
    """Jobs by id and running jobs by URL.

    Finished jobs stay in memory only while they are among the ``max_jobs`` most recent
    (their results live on in the cache store, by id); fewer live objects, shorter
    garbage-collection pauses.
    """

    def __init__(self, max_jobs: int = 2000) -> None:
        self.max_jobs = max_jobs
        self.by_id: OrderedDict[str, Job] = OrderedDict()
        self.running: dict[str, Job] = {}

    def add(self, job: Job) -> None:
        """Register a new running job."""
        self.by_id[job.id] = job
        self.running[job.url] = job
        while len(self.by_id) > self.max_jobs:
            oldest_id, oldest = next(iter(self.by_id.items()))
            if not oldest.final:
                break
            del self.by_id[oldest_id]

    def finish(self, job: Job) -> None:
        """The job ended: it no longer collapses new requests for its URL."""
        if self.running.get(job.url) is job:
            del self.running[job.url]

    def get(self, job_id: str) -> Job | None:
        """The job ``job_id`` if this process knows it."""
        return self.by_id.get(job_id)


class TtlSet:
    """A bounded set whose members expire after ``ttl`` seconds (the negative cache).

    Example::

        unknown = TtlSet(ttl=10.0, max_size=10_000)
        unknown.add("abc")
        "abc" in unknown       # True for 10 s
    """

    def __init__(self, ttl: float, max_size: int = 50_000) -> None:
        self.ttl = ttl
        self.max_size = max_size
        self._items: OrderedDict[str, float] = OrderedDict()
        self.hits = 0

    def add(self, item: str) -> None:
        """Remember ``item`` for ``ttl`` seconds."""
        self._items[item] = time.monotonic() + self.ttl
        self._items.move_to_end(item)
        while len(self._items) > self.max_size:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        expiry = self._items.get(item)  # type: ignore[call-overload]
        if expiry is None:
            return False
        if expiry < time.monotonic():
            del self._items[item]  # type: ignore[arg-type]
            return False
        self.hits += 1
        return True

    def __len__(self) -> int:
        return len(self._items)
