"""Small raw-ASGI helpers shared by the simulated upstreams (kept lean: they serve the load)."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

__all__ = [
    "DisconnectWatch",
    "LoopLag",
    "tune_gc",
    "Receive",
    "Scope",
    "Send",
    "header",
    "read_json",
    "send_json",
]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case bytes) in ``scope``, or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_json(receive: Receive) -> Any:
    """Read the whole request body and parse it as JSON (``{}`` when empty)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return json.loads(body) if body else {}


async def send_json(
    send: Send,
    status: int,
    document: Any,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send ``document`` as a complete ``application/json`` response."""
    body = json.dumps(document, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class DisconnectWatch:
    """Notices when the client of a GET request goes away while the app still streams.

    uvicorn silently drops what is sent after a disconnect, so a paced body would go on
    "sending" (and count as in flight) for a client that is gone. This reads the
    request, then waits for ``http.disconnect`` in a task.
    """

    __slots__ = ("_task", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return

    async def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; return True if the client has disconnected by then."""
        if seconds > 0:
            await asyncio.sleep(seconds)
        return self.gone.is_set()

    async def wait_gone(self, timeout: float) -> bool:
        """Wait until the client disconnects (True) or ``timeout`` passes (False)."""
        try:
            await asyncio.wait_for(self.gone.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Stop watching.

        Nothing to cancel: once the response is complete (or the connection lost)
        uvicorn's ``receive()`` returns ``http.disconnect`` and the watcher ends by
        itself; cancelling it would leave a CancelledError and its frames as cyclic
        garbage for every request.
        """


class LoopLag:
    """Measures event-loop lag: how late a 50 ms sleep wakes up (a saturation signal).

    ``snapshot()`` returns the max and p99 lag (ms) since the previous snapshot.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self.task: asyncio.Task[None] | None = None

    def start(self) -> LoopLag:
        """Start measuring in a background task of the running loop."""
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.samples.append(loop.time() - start - self.interval)
            if len(self.samples) > 10_000:
                del self.samples[:5_000]

    def snapshot(self) -> dict[str, float]:
        """``{"max_ms", "p99_ms"}`` since the previous call (zeros when nothing ran)."""
        data, self.samples = sorted(self.samples), []
        if not data:
            return {"max_ms": 0.0, "p99_ms": 0.0}
        return {
            "max_ms": round(data[-1] * 1000, 1),
            "p99_ms": round(data[min(len(data) - 1, int(len(data) * 0.99))] * 1000, 1),
        }

    def stop(self) -> None:
        """Stop measuring."""
        if self.task is not None:
            self.task.cancel()


def tune_gc() -> Callable[[], None]:
    """Keep garbage-collection pauses short in a latency-sensitive process.

    Everything alive after start-up (modules, apps, clients) is moved out of the
    collector's view (:func:`gc.freeze`), and young collections run less often, so a
    full collection scans only what the traffic keeps alive. Returns a function that
    undoes it (for a process that goes on doing other things, like a test run).
    """
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(2_000, 10, 10)

    def restore() -> None:
        gc.unfreeze()
        gc.set_threshold(*previous)

    return restore
