"""The pipeline: four download stages, then inference; one task per job.

Stages run in the seed's order, metadata -> video -> audio -> subtitles. Each stage
writes ``<name>.part`` and renames it when complete, so a finished file is always
whole. An attempt that breaks mid-transfer leaves the ``.part`` behind and the next
attempt asks for ``Range: bytes=<size of .part>-`` (with ``If-Range`` on the source's
ETag, so a changed source restarts from zero). Attempts run under
:class:`~integrations.summarizer.policies.Downloads` (admission, outcome, retries).

File-system calls run in worker threads, never on the event loop: creating, renaming
and deleting files waits for the file system's journal, which a busy disk can hold for
hundreds of milliseconds, and every request of the service would wait with it.

Media live in ``<workdir>/worker<index>/<domain>/<video id>``: within a worker one job
per URL runs at a time (the job table collapses the others) and a later job resumes
what a failed one fetched; workers sharing a workdir never touch each other's files. A
full job's media are removed before its URL is free again (unless ``keep_media``); what
degraded and failed jobs left is kept for ``max_leftover_media`` URLs, the least
recently ended removed first (a job of such a URL waits for that removal to finish).

When a stage's retries run out, resilient mode retries **that stage alone** after the
breaker's cool-down (or a jittered pause), within the job's deadline; the stages
already done are not repeated. Naive mode fails the job.

Example::

    pipeline = Pipeline(cfg, downloads, summarizer, cache, events)
    job = await pipeline.submit("https://vidhub.test/watch/abc", priority=0)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import os
import random
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

import resilience as rs

from ._wire import send
from .cache import Cache
from .config import ServiceConfig
from .content import subtitle_text
from .inference import Summarizer
from .jobs import STAGES, Job, JobTable
from .policies import (
    Downloads,
    EventLog,
    NotFound,
    Refused,
    TooLarge,
    UpstreamStatus,
    retryable,
)

__all__ = ["BadRequest", "Pipeline", "canonical_url", "parse_url"]


def _save_part(part: Path, chunks: list[bytes], *, append: bool, final: Path | None) -> None:
    """Write ``chunks`` to ``part`` (after what it holds, if ``append``); then, if the
    transfer is complete, rename it to ``final``. Runs in a worker thread."""
    with open(part, "ab" if append else "wb") as f:
        f.writelines(chunks)
    if final is not None:
        os.replace(part, final)


async def _to_the_end(write: Callable[[], None]) -> None:
    """Run ``write`` in a worker thread and wait for it to end, even when cancelled
    meanwhile (the cancellation is re-raised after): the next attempt must not touch
    the file while this one still writes it."""
    future = asyncio.get_running_loop().run_in_executor(None, write)
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            cancelled = exc
    future.result()
    if cancelled is not None:
        raise cancelled


class BadRequest(ValueError):
    """The submitted URL is not one this service can summarize."""


def parse_url(url: str, domains: tuple[str, ...]) -> tuple[str, str]:
    """``(domain, video_id)`` of ``https://<domain>/watch/<id>``; raises :class:`BadRequest`.

    Example::

        >>> parse_url("https://vidhub.test/watch/abc", ("vidhub.test",))
        ('vidhub.test', 'abc')
    """
    parts = urlsplit(url)
    path = parts.path.strip("/").split("/")
    if parts.scheme not in ("http", "https") or parts.hostname not in domains:
        raise BadRequest(f"unsupported source {url!r}")
    if len(path) != 2 or path[0] != "watch" or not path[1].isalnum() or len(path[1]) > 64:
        raise BadRequest(f"not a video URL: {url!r}")
    return parts.hostname, path[1]


def canonical_url(domain: str, video_id: str) -> str:
    """The one spelling of a video's URL that jobs and caches are keyed by.

    Example::

        >>> canonical_url(*parse_url("HTTP://VidHub.test:443//watch/abc/?t=30#x", ("vidhub.test",)))
        'https://vidhub.test/watch/abc'
    """
    return f"https://{domain}/watch/{video_id}"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return min(30.0, max(0.0, float(value)))
    except ValueError:
        return None


def _unsatisfiable_total(response: httpx.Response) -> int | None:
    """The size a 416 answer gives (``Content-Range: bytes */<size>``), if any."""
    value = response.headers.get("content-range", "")
    unit, _, rest = value.partition(" ")
    if unit.strip().lower() != "bytes" or not rest.startswith("*/"):
        return None
    total = rest[2:].strip()
    return int(total) if total.isdigit() else None


_PATHS = {
    "metadata": "/api/videos/{id}",
    "video": "/media/{id}/video",
    "audio": "/media/{id}/audio",
    "subtitles": "/media/{id}/subtitles",
}


class Pipeline:
    """Runs jobs: downloads through ``downloads``, inference through ``summarizer``."""

    def __init__(
        self,
        cfg: ServiceConfig,
        downloads: Downloads,
        summarizer: Summarizer,
        cache: Cache,
        events: EventLog,
    ) -> None:
        self.cfg = cfg
        self.downloads = downloads
        self.summarizer = summarizer
        self.cache = cache
        self.events = events
        self.jobs = JobTable()
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts: dict[str, int] = {
            "submitted": 0,
            "full": 0,
            "degraded": 0,
            "failed": 0,
            "not_found": 0,
            "cache_hits": 0,
            "collapsed": 0,
            "stage_retries": 0,
            "resumed": 0,
        }
        self.stage_inflight: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.workdir = Path(cfg.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        #: This worker's media: ``<workdir>/worker<index>/<domain>/<video id>``.
        self.media = self.workdir / f"worker{cfg.worker_index}"
        # URLs whose media a degraded or failed job left (for a resume), oldest first,
        # and the removals of those evicted, which a new job of the URL waits for.
        self._leftovers: OrderedDict[str, Path] = OrderedDict()
        self._removing: dict[str, asyncio.Task[None]] = {}
        self._rng = random.Random(cfg.worker_index)
        #: Called with each job when it ends (the service feeds its metrics from it).
        self.on_finish: Callable[[Job], None] | None = None

    # -- submission ---------------------------------------------------------------

    def start(self, url: str, domain: str, video_id: str, priority: int, *, revalidate: Any) -> Job:
        """Start a job for ``url`` (or return the one already running for it)."""
        running = self.jobs.running.get(url)
        if running is not None:
            self.counts["collapsed"] += 1
            return running
        job = Job.new(url, domain, video_id, priority)
        self.jobs.add(job)
        self.counts["submitted"] += 1
        # A fresh context: the job must not inherit the submitting request's deadline
        # (TimeoutMiddleware's ContextVar), or its retries would stop after one second.
        task = asyncio.get_running_loop().create_task(
            self._run(job, revalidate), context=contextvars.Context()
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return job

    # -- one job ------------------------------------------------------------------

    async def _run(self, job: Job, cached: dict[str, Any] | None) -> None:
        # One directory per URL and worker: within a worker one job per URL runs at a
        # time (the job table collapses the others), and a later job resumes what a
        # failed one left; workers sharing a workdir never touch each other's files.
        directory = self.media / job.domain / job.video_id
        try:
            removing = self._removing.get(job.url)
            if removing is not None:  # its leftovers are being removed: not under our feet
                await asyncio.shield(removing)
            with rs.deadline(self.cfg.job_deadline):
                await self._stages(job, directory, cached)
        except NotFound:
            job.status = "not_found"
            job.error = "no such video"
            await self.cache.put_missing(job.url, self.cfg.negative_ttl)
        except Exception as exc:
            job.status = "failed"
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            if not job.final:
                job.status = "failed"
                job.error = job.error or "cancelled"
            try:
                # Before the URL is free again: the next job of this URL must not see
                # these files vanish under it. (A failed or degraded job leaves what it
                # fetched for the next one to resume.)
                if job.outcome == "full" and not self.cfg.keep_media:
                    await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
                    self._leftovers.pop(job.url, None)
            finally:
                job.finished = time.monotonic()
                self.counts[job.outcome] = self.counts.get(job.outcome, 0) + 1
                self.jobs.finish(job)
                if job.outcome != "full" and not self.cfg.keep_media:
                    self._left(job.url, directory)  # the URL is free: it may go at once
                job.emit("done", job.public())
                if self.on_finish is not None:
                    self.on_finish(job)
                self.events.write(
                    "job",
                    id=job.id,
                    outcome=job.outcome,
                    domain=job.domain,
                    first_token=(
                        None
                        if job.first_token is None or job.inference_started is None
                        else job.first_token - job.inference_started
                    ),
                )
            with contextlib.suppress(Exception):
                await self.cache.put_result(job.id, job.public())

    def _left(self, url: str, directory: Path) -> None:
        """Note the media a degraded or failed job of ``url`` left; evict beyond the cap."""
        self._leftovers[url] = directory
        self._leftovers.move_to_end(url)
        while len(self._leftovers) > self.cfg.max_leftover_media:
            old_url, old_directory = self._leftovers.popitem(last=False)
            if old_url in self.jobs.running:
                continue  # its job is using the files; it notes them again when it ends
            task = asyncio.get_running_loop().create_task(self._remove(old_url, old_directory))
            self._removing[old_url] = task
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _remove(self, url: str, directory: Path) -> None:
        try:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
        finally:
            del self._removing[url]

    async def _stages(self, job: Job, directory: Path, cached: dict[str, Any] | None) -> None:
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        job.status = "downloading"
        await self._stage(job, "metadata", directory)
        meta = json.loads(await asyncio.to_thread((directory / "metadata").read_bytes))
        job.version, job.etag, job.title = meta["version"], meta["etag"], meta["title"]
        if cached is not None and cached.get("version") == job.version:
            # revalidated: the source did not change, serve the cached summary
            await self.cache.put_url(job.url, cached)
            self._finish_cached(job, cached)
            return
        media = directory / f"v{job.version}"  # a new source version starts afresh
        await asyncio.to_thread(media.mkdir, exist_ok=True)
        missing: list[str] = []
        for stage in ("video", "audio", "subtitles"):
            try:
                await self._stage(job, stage, media)
            except NotFound:
                raise
            except Exception:
                if not self.cfg.resilient:
                    raise
                missing.append(stage)
        job.status = "summarizing"
        text = None
        if "subtitles" not in missing:
            text = await self._subtitles(media / "subtitles")
            if text is None:
                missing.append("subtitles")
        if text is None:
            text = str(meta.get("description", ""))
        await self.summarizer.run(job, text)
        if missing:
            job.degraded = True
            job.reasons.extend(f"missing_{m}" for m in missing)
        job.status = "done"
        if not job.degraded:
            await self.cache.put_url(
                job.url,
                {"id": job.id, "version": job.version, "summary": job.summary, "title": job.title},
            )

    async def _subtitles(self, path: Path) -> str | None:
        """The text of the subtitles at ``path``, parsed off the event loop; ``None`` if
        they cannot be read as UTF-8 (the platform sent something else).

        Such a file is removed, or every later job of this URL would reuse it as a
        finished stage and never fetch it again. A naive pipeline fails the job.
        """
        try:
            raw = await asyncio.to_thread(path.read_bytes)
            return await asyncio.to_thread(subtitle_text, raw.decode("utf-8"))
        except UnicodeDecodeError:
            await asyncio.to_thread(path.unlink, missing_ok=True)
            if not self.cfg.resilient:
                raise
            return None

    def _finish_cached(self, job: Job, cached: dict[str, Any]) -> None:
        job.cached = True
        job.summary = str(cached.get("summary", ""))
        job.status = "done"
        self.counts["cache_hits"] += 1
        # No inference ran: no first-token time (it would pull the model's latency
        # histogram down as the cache hit rate rises).
        job.emit("inference", {"segments": 0, "cached": True})
        job.emit("token", {"text": job.summary})

    # -- one stage ----------------------------------------------------------------

    async def _stage(self, job: Job, stage: str, directory: Path) -> None:
        final = directory / stage
        info = job.stages[stage]
        if final.exists() and stage != "metadata":
            info["status"] = "done"  # a previous job of this URL got it already
            return
        job.emit("stage", {"stage": stage, "status": "started"})
        self.stage_inflight[stage] += 1
        try:
            while True:
                try:
                    await self.downloads.retry.call_async(self._attempt, job, stage, directory)
                    break
                except NotFound:
                    info["status"] = "failed"
                    raise
                except Exception as exc:
                    wait = self._stage_pause(exc)
                    if wait is None:
                        info["status"] = "failed"
                        job.emit("stage", {"stage": stage, "status": "failed"})
                        raise
                    self.counts["stage_retries"] += 1
                    job.emit("stage", {"stage": stage, "status": "waiting", "retry_in": wait})
                    await asyncio.sleep(wait)
        except asyncio.CancelledError:
            info["status"] = "cancelled"  # a shutdown: the stored record says so
            raise
        finally:
            self.stage_inflight[stage] -= 1
        info["status"] = "done"
        job.emit("stage", {"stage": stage, "status": "done", "bytes": info["bytes"]})

    def _stage_pause(self, exc: Exception) -> float | None:
        """How long to park a failed stage before retrying it alone (None: give up)."""
        if not self.cfg.resilient or not retryable(exc):
            return None
        hint = getattr(exc, "retry_after", None)
        wait = float(hint) if isinstance(hint, int | float) and hint > 0 else 0.5
        wait += self._rng.uniform(0.0, 0.5)
        remaining = rs.time_remaining()
        if remaining is not None and wait >= remaining:
            return None
        return wait

    async def _attempt(self, job: Job, stage: str, directory: Path) -> None:
        info = job.stages[stage]
        info["attempts"] += 1
        part = directory / f"{stage}.part"
        offset = part.stat().st_size if part.exists() else 0
        headers = {}
        if offset and job.etag:
            headers = {"range": f"bytes={offset}-", "if-range": job.etag}
        url = f"http://{job.domain}{_PATHS[stage].format(id=job.video_id)}"
        downloads = self.downloads
        transport = downloads.transport
        assert transport is not None
        async with downloads.slot(job.domain, job.priority) as attempt:
            response = await send(
                transport,
                "GET",
                url,
                headers=headers,
                timeout=downloads.timeout(),
                extensions=downloads.request_extensions(job.priority),
            )
            try:
                status = response.status_code
                attempt.result(status)
                if status not in (200, 206):
                    await response.aread()  # small error bodies: keep the connection
                    if status == 404:
                        raise NotFound(url)
                    if status == 416:
                        if offset and offset == _unsatisfiable_total(response):
                            # The .part is the whole file (a transfer that broke after its
                            # last byte): it is the file, nothing is left to fetch.
                            info["bytes"] = offset
                            save = functools.partial(
                                _save_part, part, [], append=True, final=directory / stage
                            )
                            await _to_the_end(save)
                            return
                        # A .part the platform cannot resume: the next try starts over.
                        await _to_the_end(functools.partial(part.unlink, missing_ok=True))
                    elif status not in (408, 429) and status < 500:
                        raise Refused(status)  # the same answer however often it is asked
                    raise UpstreamStatus(status, _retry_after(response))
                if status == 206:
                    info["resumed_from"] = offset
                    self.counts["resumed"] += 1
                received: list[bytes] = []
                written = offset if status == 206 else 0
                complete = False
                try:
                    async for chunk in response.aiter_raw():
                        received.append(chunk)
                        written += len(chunk)
                        info["bytes"] = written
                        if written > self.cfg.max_download_bytes:
                            received.clear()  # nothing of it is kept to resume from
                            await _to_the_end(functools.partial(part.unlink, missing_ok=True))
                            raise TooLarge(f"{stage} is over {self.cfg.max_download_bytes} bytes")
                    complete = True
                finally:
                    # What arrived is kept even when the transfer breaks: the next
                    # attempt resumes from it.
                    if received or complete:
                        await _to_the_end(
                            functools.partial(
                                _save_part,
                                part,
                                received,
                                append=status == 206,
                                final=directory / stage if complete else None,
                            )
                        )
            finally:
                await response.aclose()

    # -- introspection ------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters, downloads in flight per domain and stage, breaker states.

        ``downloads_inflight``: downloads holding a slot; ``download_attempts``: attempts
        in progress, queued ones included (``downloads_peak`` is their peak).
        """
        return {
            "mode": self.cfg.mode,
            "worker": self.cfg.worker_index,
            "counts": dict(self.counts),
            "jobs_running": len(self.jobs.running),
            "downloads_inflight": self.downloads.admitted(),
            "download_attempts": {d: n for d, n in self.downloads.inflight.items() if n},
            "downloads_peak": dict(self.downloads.peak),
            "download_errors": dict(self.downloads.errors),
            "stage_inflight": dict(self.stage_inflight),
            "breakers": {
                **{f"domain:{k}": v for k, v in self.downloads.breaker_states().items()},
                **{f"model:{k}": v for k, v in self.summarizer.breaker_states().items()},
            },
            "model_calls": dict(self.summarizer.calls),
            "cache": dict(self.cache.counts),
            "events": dict(self.events.counts),
        }
