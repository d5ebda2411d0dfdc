"""Response plumbing: bodies that hold a bulkhead slot, closing losers, signal checks."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx

from .._deadline import current_deadline
from ..bulkhead import LeaseLost
from ._signals import SIGNAL_FIELDS

__all__ = [
    "DeadlineStream",
    "HeldStream",
    "aclose_quietly",
    "discard",
    "mentions_signals",
    "release_slot",
    "release_slot_async",
]


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
        """Close the body, then release the slot (whatever closing raised).

        A distributed slot whose lease was lost meanwhile (Redis restarted, say) is not
        the response's failure: see :func:`release_slot`.
        """
        try:
            self._stream.close()
        finally:
            release_slot(self._slot)

    async def aclose(self) -> None:
        """Close the body, then release the slot (whatever closing raised), without
        blocking the event loop on a distributed slot's round trip."""
        try:
            await self._stream.aclose()
        finally:
            await release_slot_async(self._slot)


class DeadlineStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that was received under a deadline: read under one still, the
    chunk that arrives after it raises ``httpx.ReadTimeout`` instead.

    The attempt's socket timeouts were cut to the time left when it was sent, but they
    bound each read, not the body: a server trickling a byte at a time would keep the
    reader past its deadline without end. This bounds the overrun to one read. The
    deadline is the reader's own (the one current where each chunk is read): a body
    read after its code left the deadline's block is read as before.

    Example: ``response.stream = DeadlineStream(response.stream, request)``
    """

    def __init__(self, stream: Any, request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    def _overrun(self) -> httpx.ReadTimeout:
        return httpx.ReadTimeout(
            "the deadline passed while the response body was read", request=self._request
        )

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            deadline = current_deadline()
            if deadline is not None and deadline.remaining() <= 0:
                raise self._overrun()
            yield chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            deadline = current_deadline()
            if deadline is not None and deadline.remaining() <= 0:
                raise self._overrun()
            yield chunk

    def close(self) -> None:
        """Close the body."""
        self._stream.close()

    async def aclose(self) -> None:
        """Close the body."""
        await self._stream.aclose()


def release_slot(slot: Any) -> None:
    """Give a bulkhead slot back.

    A lease lost meanwhile does not raise :class:`~resilience.LeaseLost` here: the
    bulkhead reported it (``BulkheadLeaseLost``, ``on_lost`` hooks), and the exchange
    it guarded is whole (``client.get()`` lost good answers to it), or already failed
    with an error of its own that matters more.
    """
    with contextlib.suppress(LeaseLost):
        slot.release()


async def release_slot_async(slot: Any) -> None:
    """:func:`release_slot` for async callers: a distributed slot's round trip is
    awaited, not run on the event loop, and done in a cancelled scope too (shielded)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(LeaseLost):
        await slot.release_async()


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


def discard(future: concurrent.futures.Future[httpx.Response | None]) -> None:
    """Close the response of a hedged attempt that lost (or whose caller went away)."""
    if future.cancelled() or future.exception() is not None:
        return
    response = future.result()
    if response is None:  # a hedge that was not sent
        return
    try:
        response.close()
    except Exception:  # pragma: no cover - closing a dead connection
        pass


async def aclose_quietly(response: httpx.Response) -> None:
    """Close ``response``, even in a cancelled scope, ignoring errors of a dead connection."""
    with anyio.CancelScope(shield=True):
        try:
            await response.aclose()
        except Exception:  # pragma: no cover - closing a dead connection
            pass
