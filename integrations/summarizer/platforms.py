"""The simulated video platforms: one ASGI app serving several domains by ``Host`` header.

Each domain (see :data:`~integrations.summarizer.content.DOMAINS`) serves, for any video
id (ids starting with ``missing`` do not exist)::

    GET /api/videos/{id}           metadata (JSON, ETag = the source version)
    GET /media/{id}/video          pseudo-random bytes, paced at the domain's bandwidth
    GET /media/{id}/audio          idem
    GET /media/{id}/subtitles      WebVTT text

Media honour ``Range: bytes=N-`` (206 + ``Content-Range``) and ``If-Range``. Every
domain has run-time controls (:class:`DomainControl`): a latency distribution
(log-normal time to first byte), bandwidth per response, an error rate (503), a rate of
connections cut mid-body, a ``Retry-After`` quota (429 beyond ``quota_rps``) and an
outage switch (``down`` with ``down_mode`` ``"hang"`` or ``"503"``). The server also
measures what clients cannot fake: requests in flight per domain and their peak.

Controls and measurements are served under ``/_control`` on any host::

    GET  /_control/state                      controls + stats of every domain
    POST /_control/domains/{domain}           JSON patch of a DomainControl
    POST /_control/versions/{domain}/{id}     {"version": 2}: the source changed
    POST /_control/reset                      controls to defaults, stats zeroed
    POST /_control/reset_peaks                peaks := current in-flight counts
    GET  /_control/log?domain=d               recent media requests (range start, bytes)

Example::

    app = PlatformsApp(seed=1)
    app.control("vidhub.test").down = True          # or POST /_control/domains/vidhub.test
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from ._asgi import DisconnectWatch, Receive, Scope, Send, header, read_json, send_json
from .content import DOMAINS, Video, media_bytes, video

__all__ = ["DomainControl", "DomainStats", "PlatformsApp"]


@dataclass
class DomainControl:
    """Run-time behaviour of one simulated domain (every field may change at any time).

    Example::

        DomainControl(latency_ms=400, quota_rps=20, bandwidth=16_384)   # a slow platform
    """

    latency_ms: float = 25.0
    latency_sigma: float = 0.5
    bandwidth: float = 32 * 1024
    chunk: int = 32768
    error_rate: float = 0.0
    cut_rate: float = 0.0
    cut_next: int = 0
    cut_fraction: float = 0.5
    quota_rps: float = 0.0
    quota_burst: float = 20.0
    down: bool = False
    down_mode: str = "hang"
    video_kb: tuple[int, int] = (160, 320)
    audio_kb: tuple[int, int] = (48, 96)
    sentences: tuple[int, int] = (8, 60)


@dataclass
class DomainStats:
    """What one domain measured: requests by kind and status, bytes, in-flight and peaks."""

    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0
    inflight: int = 0
    peak: int = 0
    media_inflight: int = 0
    media_peak: int = 0
    log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=4000))

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy (without the request log)."""
        return {
            "requests": dict(self.requests),
            "statuses": dict(self.statuses),
            "bytes_sent": self.bytes_sent,
            "inflight": self.inflight,
            "peak": self.peak,
            "media_inflight": self.media_inflight,
            "media_peak": self.media_peak,
        }


class _Cut(Exception):
    """Raised to drop a connection mid-body on purpose (uvicorn closes the socket)."""


class _Quota:
    __slots__ = ("stamp", "tokens")

    def __init__(self) -> None:
        self.tokens = -1.0
        self.stamp = 0.0

    def take(self, rate: float, burst: float, now: float) -> float:
        """Take one token; return 0 if allowed, else seconds until one is available."""
        if self.tokens < 0:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / rate


class PlatformsApp:
    """ASGI app simulating several video platforms (see the module docstring).

    Example::

        app = PlatformsApp(seed=7, domains=("a.test", "b.test"))
        uvicorn.run(app, port=8001)
    """

    def __init__(self, *, seed: int = 0, domains: tuple[str, ...] = DOMAINS) -> None:
        self.seed = seed
        self.domains = tuple(domains)
        self.controls: dict[str, DomainControl] = {}
        self.stats: dict[str, DomainStats] = {}
        self.versions: dict[tuple[str, str], int] = {}
        self._rng: dict[str, random.Random] = {}
        self._quota: dict[str, _Quota] = {}
        self.reset()

    def reset(self) -> None:
        """Default controls, zero stats, every source back to version 1."""
        self.controls = {d: DomainControl() for d in self.domains}
        self.stats = {d: DomainStats() for d in self.domains}
        self.versions.clear()
        self._rng = {d: random.Random(f"{self.seed}:{d}") for d in self.domains}
        self._quota = {d: _Quota() for d in self.domains}

    def control(self, domain: str) -> DomainControl:
        """The live controls of ``domain``."""
        return self.controls[domain]

    def video_of(self, domain: str, video_id: str) -> Video:
        """The current version of a video of ``domain``."""
        c = self.controls[domain]
        return video(
            domain,
            video_id,
            self.versions.get((domain, video_id), 1),
            video_kb=c.video_kb,
            audio_kb=c.audio_kb,
            sentences=c.sentences,
        )

    def state(self) -> dict[str, Any]:
        """Controls and stats of every domain, JSON-ready."""
        return {
            "time": time.time(),
            "domains": {
                d: {
                    "control": dataclasses.asdict(self.controls[d]),
                    "stats": self.stats[d].snapshot(),
                }
                for d in self.domains
            },
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/_control"):
            await self._control_endpoint(scope, receive, send, path)
            return
        host = (header(scope, b"host") or b"").decode().rsplit(":", 1)[0]
        if host not in self.controls:
            await send_json(send, 404, {"error": f"unknown host {host!r}"})
            return
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "api" and parts[1] == "videos":
            kind, video_id = "metadata", parts[2]
        elif (
            len(parts) == 3 and parts[0] == "media" and parts[2] in ("video", "audio", "subtitles")
        ):
            kind, video_id = parts[2], parts[1]
        else:
            await send_json(send, 404, {"error": "no such endpoint"})
            return
        stats = self.stats[host]
        stats.requests[kind] += 1
        stats.inflight += 1
        stats.peak = max(stats.peak, stats.inflight)
        media = kind != "metadata"
        if media:
            stats.media_inflight += 1
            stats.media_peak = max(stats.media_peak, stats.media_inflight)
        watch = DisconnectWatch(receive)
        status = 0
        try:
            status = await self._serve(scope, send, host, kind, video_id, watch)
        finally:
            watch.close()
            stats.inflight -= 1
            if media:
                stats.media_inflight -= 1
            stats.statuses[str(status or "cut")] += 1

    async def _serve(
        self,
        scope: Scope,
        send: Send,
        domain: str,
        kind: str,
        video_id: str,
        watch: DisconnectWatch,
    ) -> int:
        c = self.controls[domain]
        rng = self._rng[domain]
        if c.down:
            if c.down_mode == "503":
                await send_json(send, 503, {"error": "platform unavailable"})
                return 503
            # a black hole: the connection stays silent until the client gives up (even if
            # the platform comes back meanwhile: those connections were lost)
            await watch.wait_gone(60.0)
            return 499
        if c.quota_rps > 0:
            wait = self._quota[domain].take(c.quota_rps, c.quota_burst, time.monotonic())
            if wait > 0:
                retry = max(1, math.ceil(wait))
                await send_json(
                    send,
                    429,
                    {"error": "quota exceeded"},
                    [
                        (b"retry-after", str(retry).encode()),
                        (b"ratelimit-policy", f'"quota";q={int(c.quota_burst)};w=1'.encode()),
                        (b"ratelimit", f'"quota";r=0;t={retry}'.encode()),
                    ],
                )
                return 429
        delay = c.latency_ms / 1000.0 * math.exp(c.latency_sigma * rng.gauss(0.0, 1.0))
        if await watch.sleep(min(delay, 30.0)):
            return 499
        if c.error_rate > 0 and rng.random() < c.error_rate:
            await send_json(send, 503, {"error": "injected error"}, [(b"retry-after", b"1")])
            return 503
        if video_id.startswith("missing"):
            await send_json(send, 404, {"error": "no such video"})
            return 404
        v = self.video_of(domain, video_id)
        etag = v.etag.encode()
        if kind == "metadata":
            await send_json(send, 200, v.metadata(), [(b"etag", etag)])
            return 200
        return await self._media(scope, send, domain, c, rng, v, kind, watch)

    async def _media(
        self,
        scope: Scope,
        send: Send,
        domain: str,
        c: DomainControl,
        rng: random.Random,
        v: Video,
        kind: str,
        watch: DisconnectWatch,
    ) -> int:
        size = v.size_of(kind)
        start, end, status = 0, size, 200
        rng_header = header(scope, b"range")
        if_range = header(scope, b"if-range")
        if rng_header is not None and (if_range is None or if_range.decode() == v.etag):
            parsed = _parse_range(rng_header.decode(), size)
            if parsed is None:
                await send_json(
                    send,
                    416,
                    {"error": "bad range"},
                    [(b"content-range", f"bytes */{size}".encode())],
                )
                return 416
            start, end = parsed
            status = 206
        headers = [
            (b"content-type", b"text/vtt" if kind == "subtitles" else b"application/octet-stream"),
            (b"content-length", str(end - start).encode()),
            (b"etag", v.etag.encode()),
            (b"accept-ranges", b"bytes"),
        ]
        if status == 206:
            headers.append((b"content-range", f"bytes {start}-{end - 1}/{size}".encode()))
        cut_at = end + 1
        if c.cut_next > 0:
            c.cut_next -= 1
            cut_at = start + int((end - start) * c.cut_fraction)
        elif c.cut_rate > 0 and rng.random() < c.cut_rate:
            cut_at = start + int((end - start) * rng.uniform(0.2, 0.8))
        stats = self.stats[domain]
        entry = {"id": v.video_id, "kind": kind, "start": start, "status": status, "bytes": 0}
        stats.log.append(entry)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        pos = start
        due = time.monotonic()
        while pos < end:
            if pos >= cut_at:
                raise _Cut(f"connection cut at byte {pos} on purpose")
            # at most one second of data per write: a slow platform trickles, it does
            # not go silent for longer than a client's read timeout between writes
            chunk = min(c.chunk, max(4096, int(c.bandwidth))) if c.bandwidth > 0 else c.chunk
            n = min(chunk, end - pos, cut_at - pos)
            data = media_bytes(v, kind, pos, pos + n)
            pos += n
            await send({"type": "http.response.body", "body": data, "more_body": pos < end})
            stats.bytes_sent += n
            entry["bytes"] = pos - start
            if pos < end and c.bandwidth > 0:
                # pace chunk by chunk at the bandwidth of the moment (a rate change
                # applies from now on, it does not re-time what was already sent)
                due += n / c.bandwidth
                if await watch.sleep(due - time.monotonic()):
                    return 499
        return status

    async def _control_endpoint(
        self, scope: Scope, receive: Receive, send: Send, path: str
    ) -> None:
        parts = path.strip("/").split("/")[1:]
        method = scope["method"]
        if method == "GET" and parts == ["state"]:
            await send_json(send, 200, self.state())
        elif method == "GET" and parts == ["log"]:
            query = parse_qs(scope.get("query_string", b"").decode())
            domain = query.get("domain", [self.domains[0]])[0]
            await send_json(send, 200, list(self.stats[domain].log))
        elif method == "POST" and len(parts) == 2 and parts[0] == "domains":
            patch = await read_json(receive)
            c = self.controls.get(parts[1])
            if c is None:
                await send_json(send, 404, {"error": "unknown domain"})
                return
            for key, value in patch.items():
                if not hasattr(c, key):
                    await send_json(send, 400, {"error": f"unknown control {key!r}"})
                    return
                setattr(c, key, tuple(value) if isinstance(value, list) else value)
            await send_json(send, 200, dataclasses.asdict(c))
        elif method == "POST" and len(parts) == 3 and parts[0] == "versions":
            body = await read_json(receive)
            self.versions[(parts[1], parts[2])] = int(body["version"])
            await send_json(send, 200, {"version": int(body["version"])})
        elif method == "POST" and parts == ["reset"]:
            self.reset()
            await send_json(send, 200, {"reset": True})
        elif method == "POST" and parts == ["reset_peaks"]:
            for s in self.stats.values():
                s.peak, s.media_peak = s.inflight, s.media_inflight
            await send_json(send, 200, {"reset": True})
        else:
            await send_json(send, 404, {"error": "no such control"})


def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    unit, _, spec = value.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return (max(0, size - n), size) if n > 0 else None
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return None
    return start, min(end, size)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
