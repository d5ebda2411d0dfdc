"""The simulated model provider: a streaming (SSE) completion endpoint with two tiers.

There is no language model here. A "completion" is the deterministic extractive
summary of the prompt (:func:`~integrations.summarizer.content.extract`, keeping
``ratio`` of its sentences), paced like a real provider: a log-normal time to first
token, then ``tokens_per_s`` words per second, sent as Server-Sent Events. The two
tiers differ only in their controls: ``strong`` has a slower first token and longer
output, ``cheap`` is fast and terse.

API::

    POST /v1/completions  {"model": "strong"|"cheap", "prompt": "...", "stream": true}
        stream=true  -> text/event-stream: data: {"delta": "words "} ... data: [DONE]
        stream=false -> {"model": ..., "text": "...", "tokens": n} once it is all generated
    GET  /_control/state              controls + stats per tier
    POST /_control/tiers/{tier}       JSON patch of a TierControl
    POST /_control/reset              defaults, zero stats

Example::

    app = ModelsApp(seed=3)
    app.tiers["strong"].down = True        # the strong model is down (hangs)
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ._asgi import DisconnectWatch, Receive, Scope, Send, read_json, send_json
from .content import extract, sentences_of

__all__ = ["TIERS", "ModelsApp", "TierControl", "TierStats"]

TIERS = ("strong", "cheap")


@dataclass
class TierControl:
    """Run-time behaviour of one model tier.

    Example::

        TierControl(ttft_ms=900, error_rate=0.2)      # an overloaded strong model
    """

    ttft_ms: float = 60.0
    ttft_sigma: float = 0.3
    tokens_per_s: float = 250.0
    ratio: float = 0.1
    event_ms: float = 40.0
    error_rate: float = 0.0
    down: bool = False
    down_mode: str = "hang"


def _defaults() -> dict[str, TierControl]:
    return {
        "strong": TierControl(ttft_ms=150.0, ttft_sigma=0.25, tokens_per_s=90.0, ratio=0.2),
        "cheap": TierControl(ttft_ms=50.0, ttft_sigma=0.25, tokens_per_s=250.0, ratio=0.1),
    }


@dataclass
class TierStats:
    """Requests, statuses, tokens and concurrency seen by one tier."""

    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    inflight: int = 0
    peak: int = 0

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return {
            "requests": self.requests,
            "statuses": dict(self.statuses),
            "tokens": self.tokens,
            "inflight": self.inflight,
            "peak": self.peak,
        }


class ModelsApp:
    """ASGI app simulating a two-tier streaming completion provider (see module docstring).

    Example::

        uvicorn.run(ModelsApp(seed=1), port=8002)
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.tiers: dict[str, TierControl] = {}
        self.stats: dict[str, TierStats] = {}
        self._rng: dict[str, random.Random] = {}
        self.reset()

    def reset(self) -> None:
        """Default controls and zero stats."""
        self.tiers = _defaults()
        self.stats = {t: TierStats() for t in TIERS}
        self._rng = {t: random.Random(f"{self.seed}:{t}") for t in TIERS}

    def state(self) -> dict[str, Any]:
        """Controls and stats of every tier, JSON-ready."""
        return {
            "time": time.time(),
            "tiers": {
                t: {"control": dataclasses.asdict(self.tiers[t]), "stats": self.stats[t].snapshot()}
                for t in TIERS
            },
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            return
        path: str = scope["path"]
        if path.startswith("/_control"):
            await self._control(scope, receive, send, path)
            return
        if path != "/v1/completions" or scope["method"] != "POST":
            await send_json(send, 404, {"error": "no such endpoint"})
            return
        body = await read_json(receive)
        tier = body.get("model")
        if tier not in self.tiers:
            await send_json(send, 400, {"error": f"unknown model {tier!r}"})
            return
        stats = self.stats[tier]
        stats.requests += 1
        stats.inflight += 1
        stats.peak = max(stats.peak, stats.inflight)
        watch = DisconnectWatch(receive)
        status = 0
        try:
            status = await self._complete(send, tier, str(body.get("prompt", "")), body, watch)
        finally:
            watch.close()
            stats.inflight -= 1
            stats.statuses[str(status)] += 1

    async def _complete(
        self, send: Send, tier: str, prompt: str, body: dict[str, Any], watch: DisconnectWatch
    ) -> int:
        c = self.tiers[tier]
        rng = self._rng[tier]
        if c.down:
            if c.down_mode == "503":
                await send_json(send, 503, {"error": "model unavailable"})
                return 503
            await watch.wait_gone(60.0)
            return 499
        if c.error_rate > 0 and rng.random() < c.error_rate:
            await send_json(send, 503, {"error": "overloaded"}, [(b"retry-after", b"1")])
            return 503
        ttft = c.ttft_ms / 1000.0 * math.exp(c.ttft_sigma * rng.gauss(0.0, 1.0))
        # output length grows with the input: ``ratio`` of its sentences (at least one)
        keep = max(1, round(len(sentences_of(prompt)) * c.ratio))
        words = extract(prompt, keep).split()
        t0 = time.monotonic()
        if not body.get("stream", True):
            if await watch.sleep(ttft + len(words) / c.tokens_per_s):
                return 499
            self.stats[tier].tokens += len(words)
            text = " ".join(words)
            await send_json(send, 200, {"model": tier, "text": text, "tokens": len(words)})
            return 200
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        sent = 0
        step = c.event_ms / 1000.0
        due = t0 + ttft
        while sent < len(words):
            if await watch.sleep(due - time.monotonic()):
                return 499
            elapsed = time.monotonic() - t0 - ttft
            upto = min(len(words), max(sent + 1, int(elapsed * c.tokens_per_s) + 1))
            delta = " ".join(words[sent:upto]) + " "
            sent = upto
            event = b"data: " + json.dumps({"delta": delta}).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            due = time.monotonic() + step
        self.stats[tier].tokens += sent
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        return 200

    async def _control(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        parts = path.strip("/").split("/")[1:]
        method = scope["method"]
        if method == "GET" and parts == ["state"]:
            await send_json(send, 200, self.state())
        elif method == "POST" and len(parts) == 2 and parts[0] == "tiers":
            c = self.tiers.get(parts[1])
            if c is None:
                await send_json(send, 404, {"error": "unknown tier"})
                return
            patch = await read_json(receive)
            for key, value in patch.items():
                if not hasattr(c, key):
                    await send_json(send, 400, {"error": f"unknown control {key!r}"})
                    return
                setattr(c, key, value)
            await send_json(send, 200, dataclasses.asdict(c))
        elif method == "POST" and parts == ["reset"]:
            self.reset()
            await send_json(send, 200, {"reset": True})
        else:
            await send_json(send, 404, {"error": "no such control"})
