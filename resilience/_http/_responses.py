"""Response plumbing: bodies that hold a bulkhead slot, closing losers, signal checks."""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx

from ._signals import SIGNAL_FIELDS

__all__ = ["HeldStream", "aclose_quietly", "discard", "mentions_signals"]


class HeldStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that gives the host's bulkhead slot back when it is closed.

    Example: ``response.stream = HeldStream(response.stream, permit)``
    """

    def __init__(self, stream: Any, slot: Any) -> None:
        self._stream = stream
        self._slot = slot

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    def close(self) -> None:
        """Close the body, then release the slot (whatever closing raised)."""
        try:
            self._stream.close()
        finally:
            self._slot.release()

    async def aclose(self) -> None:
        """Close the body, then release the slot (whatever closing raised)."""
        try:
            await self._stream.aclose()
        finally:
            await self._slot.release_async()


def mentions_signals(headers: httpx.Headers) -> bool:
    """Whether a response has any field ``read_signals`` reads (the common answer: no).

    Reads httpx's internal ``(raw, lower-case, value)`` triples when they are there: the
    check then costs a tenth of going through ``headers.raw``.
    """
    fields = getattr(headers, "_list", None)
    if fields is None:  # pragma: no cover - another httpx layout
        return any(name.lower() in SIGNAL_FIELDS for name, _ in headers.raw)
    for field in fields:  # noqa: SIM110 - a plain loop is twice as fast as any()
        if field[1] in SIGNAL_FIELDS:
            return True
    return False


def discard(future: concurrent.futures.Future[httpx.Response]) -> None:
    """Close the response of a hedged attempt that lost (or whose caller went away)."""
    if future.cancelled() or future.exception() is not None:
        return
    try:
        future.result().close()
    except Exception:  # pragma: no cover - closing a dead connection
        pass


async def aclose_quietly(response: httpx.Response) -> None:
    """Close ``response``, even in a cancelled scope, ignoring errors of a dead connection."""
    with anyio.CancelScope(shield=True):
        try:
            await response.aclose()
        except Exception:  # pragma: no cover - closing a dead connection
            pass
