"""Inference: split the subtitles, summarize the segments concurrently, stream in order.

Resilient mode, as the seed article ended up:

* the text is split into about ``cfg.segments`` segments, summarized concurrently;
* **tiering**: a short segment goes to the ``cheap`` model, a long one to ``strong``;
* each tier sits behind its own **circuit breaker** and a **first-token timeout**; a
  failed or refused strong call **falls back** to cheap, and a failed cheap call to a
  local **extractive summary** (the last resort, which marks the result ``degraded``);
* tokens are **streamed** to the job as they arrive, segment 1 live, later segments as
  soon as the ones before them are complete, so the merged text is in order.

Naive mode is the article's starting point: one non-streamed call to the strong model
with the whole text, fixed-delay retries, no fallback.

The "models" are simulated and extractive (see :mod:`integrations.summarizer.models`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

import resilience as rs
from resilience import backoff

from ._wire import send
from .config import MODEL_HOST, ServiceConfig
from .content import extract, segment
from .jobs import Job
from .policies import EventLog, UpstreamStatus, retryable

__all__ = ["ModelError", "Summarizer"]

_URL = f"http://{MODEL_HOST}/v1/completions"


class ModelError(Exception):
    """The model call failed (status, protocol, or no first token in time)."""


class _Segment:
    """The streamed output of one segment: deltas so far, and a wake-up for the merger."""

    __slots__ = ("deltas", "done", "tier", "wake")

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.done = False
        self.tier = ""
        self.wake = asyncio.Event()

    def push(self, delta: str) -> None:
        self.deltas.append(delta)
        self.wake.set()

    def finish(self, tier: str) -> None:
        self.tier = tier
        self.done = True
        self.wake.set()


class Summarizer:
    """Runs the inference step of a job (see the module docstring)."""

    def __init__(
        self,
        cfg: ServiceConfig,
        transport: httpx.AsyncBaseTransport,
        *,
        backend: Any = None,
        events: EventLog,
        on_token: Callable[[Job], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.transport = transport
        self.on_token = on_token
        self.calls: dict[str, int] = {"strong": 0, "cheap": 0, "extractive": 0, "fallbacks": 0}
        self.breaker: rs.CircuitBreaker | None = None
        if cfg.resilient:
            self.breaker = rs.CircuitBreaker(
                failure_rate=0.5,
                window=cfg.model_breaker_window,
                min_calls=cfg.model_breaker_min_calls,
                open_for=cfg.model_breaker_open_for,
                half_open_calls=2,
                key=lambda tier, *a, **k: tier,
                backend=backend,
                name="summarizer.model",
            )
            self.breaker.add_listener(events.listener)
        self.naive_retry = rs.Retry(
            on=retryable,
            attempts=cfg.naive_attempts,
            backoff=backoff.constant(cfg.naive_retry_delay),
            respect_retry_after=False,
            name="summarizer.naive-model-retry",
        )

    def breaker_states(self) -> dict[str, str]:
        """Breaker state per model tier (empty in naive mode)."""
        if self.breaker is None:
            return {}
        return {t: self.breaker.state_of(t).value for t in ("strong", "cheap")}

    async def run(self, job: Job, text: str) -> None:
        """Summarize ``text`` into ``job`` (tokens as events, then ``job.summary``)."""
        job.inference_started = time.monotonic()
        if not self.cfg.resilient:
            await self._naive(job, text)
            return
        # Off the event loop: a large text takes a while to split (22 MB: 0.6 s), and
        # every other request of the service would wait for it.
        parts = await asyncio.to_thread(segment, text, self.cfg.segments) or [text]
        job.emit("inference", {"segments": len(parts)})
        outputs = [_Segment() for _ in parts]
        tasks = [
            asyncio.ensure_future(self._segment(part, out)) for part, out in zip(parts, outputs)
        ]
        try:
            pieces: list[str] = []
            for out in outputs:
                sent = 0
                while True:
                    while sent < len(out.deltas):
                        delta = out.deltas[sent]
                        sent += 1
                        self._token(job, delta)
                        pieces.append(delta)
                    if out.done:
                        break
                    out.wake.clear()
                    await out.wake.wait()
                job.tiers.append(out.tier)
                if out.tier == "extractive" and "extractive_summary" not in job.reasons:
                    job.degraded = True
                    job.reasons.append("extractive_summary")
            job.summary = "".join(pieces).strip()
        finally:
            for task in tasks:
                task.cancel()

    def _token(self, job: Job, delta: str) -> None:
        if job.first_token is None:
            job.first_token = time.monotonic()
        job.emit("token", {"text": delta})

    async def _segment(self, text: str, out: _Segment) -> None:
        assert self.breaker is not None
        long = len(text.split()) > self.cfg.strong_threshold_words
        tiers = ("strong", "cheap") if long else ("cheap",)
        for i, tier in enumerate(tiers):
            if i:
                self.calls["fallbacks"] += 1
            try:
                permit = self.breaker.acquire_nowait(tier)
            except rs.CircuitOpen:
                self.calls[f"{tier}_open"] = self.calls.get(f"{tier}_open", 0) + 1
                continue
            timeout = (
                self.cfg.strong_first_token_timeout
                if tier == "strong"
                else self.cfg.cheap_first_token_timeout
            )
            try:
                await self._stream(tier, text, out, timeout)
            except Exception as exc:
                permit.failure(exc)
                key = f"{tier}_error:{type(exc).__name__}"
                self.calls[key] = self.calls.get(key, 0) + 1
                if out.deltas:
                    # Cut mid-stream: what was streamed stays (it cannot be taken back),
                    # and the segment is completed by its extractive summary, which is
                    # what the label then says.
                    self.calls["extractive"] += 1
                    out.push("… " + extract(text, 1) + " ")
                    out.finish("extractive")
                    return
                continue
            except BaseException:
                permit.ignore()
                raise
            permit.success()
            out.finish(tier)
            return
        self.calls["extractive"] += 1
        out.push(extract(text, 1) + " ")
        out.finish("extractive")

    async def _stream(self, tier: str, prompt: str, out: _Segment, first_timeout: float) -> None:
        self.calls[tier] += 1
        body = {"model": tier, "prompt": prompt, "stream": True}
        async with asyncio.timeout(first_timeout) as cm:
            response = await send(
                self.transport, "POST", _URL, json=body, timeout=self.cfg.model_timeout
            )
            try:
                if response.status_code != 200:
                    await response.aread()
                    raise ModelError(f"{tier} answered {response.status_code}")
                buffer = b""
                done = False
                # read to the end of the body (past [DONE]) so the connection is reused
                async for chunk in response.aiter_raw():
                    buffer += chunk
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        data = event.partition(b"data: ")[2]
                        if data == b"[DONE]":
                            done = True
                            continue
                        delta = json.loads(data)["delta"]
                        if not isinstance(delta, str):  # would fail the join, not the tier
                            raise ModelError(f"{tier} sent a delta of {type(delta).__name__}")
                        if not out.deltas:
                            cm.reschedule(
                                asyncio.get_running_loop().time() + self.cfg.model_timeout
                            )
                        out.push(delta)
                if not done:
                    raise ModelError(f"{tier} stream ended without [DONE]")
            finally:
                await response.aclose()

    async def _naive(self, job: Job, text: str) -> None:
        job.emit("inference", {"segments": 1})

        async def call() -> str:
            self.calls["strong"] += 1
            response = await send(
                self.transport,
                "POST",
                _URL,
                json={"model": "strong", "prompt": text, "stream": False},
                timeout=self.cfg.naive_timeout,
            )
            try:
                await response.aread()
            finally:
                await response.aclose()
            if response.status_code != 200:
                raise UpstreamStatus(response.status_code)
            return str(response.json()["text"])

        summary = await self.naive_retry.call_async(call)
        job.tiers.append("strong")
        self._token(job, summary)
        job.summary = summary
