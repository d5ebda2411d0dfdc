"""ResilientTransport holding slots of a distributed (Redis) bulkhead."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.httpx import ResilientTransport
from resilience.testing import RedisServer

URL = "http://a.test/x"


def redis_bulkhead(redis_server: RedisServer, events: list[rs.Event]) -> rs.Bulkhead:
    bulkhead = rs.Bulkhead(
        2, backend=RedisBackend.from_url(redis_server.url), name="downloads", lease=30.0
    )
    bulkhead.add_listener(events.append)
    return bulkhead


def lose_leases(redis_server: RedisServer, bulkhead: rs.Bulkhead) -> None:
    """What a Redis restart does to the leases held (their set is gone)."""
    remote = bulkhead._remote
    assert remote is not None
    redis_server.command("DEL", remote.keys_for("a.test")[0])


def lost(events: list[rs.Event]) -> list[str | None]:
    return [event.key for event in events if isinstance(event, rs.BulkheadLeaseLost)]


def test_a_lease_lost_while_the_body_arrives_loses_no_answer(redis_server: RedisServer) -> None:
    """The lease of a response's slot vanishes mid-body: the whole body is still the
    answer (client.get() raised LeaseLost as the body closed, and a complete download
    was thrown away); the loss is reported as an event."""
    events: list[rs.Event] = []
    bulkhead = redis_bulkhead(redis_server, events)

    def body() -> Iterator[bytes]:
        yield b"first half, "
        lose_leases(redis_server, bulkhead)
        yield b"second half"

    inner = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))
    with httpx.Client(transport=ResilientTransport(inner, bulkhead=bulkhead)) as client:
        response = client.get(URL)
    assert response.content == b"first half, second half"
    assert lost(events) == ["a.test"]
    assert bulkhead.statistics("a.test").in_flight == 0


@pytest.mark.anyio
async def test_a_lease_lost_while_the_body_arrives_loses_no_answer_async(
    redis_server: RedisServer,
) -> None:
    """The same through the async shell, streamed."""
    events: list[rs.Event] = []
    bulkhead = redis_bulkhead(redis_server, events)

    async def body() -> AsyncIterator[bytes]:
        yield b"first half, "
        lose_leases(redis_server, bulkhead)
        yield b"second half"

    inner = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))
    transport = ResilientTransport(inner, bulkhead=bulkhead)
    async with (
        httpx.AsyncClient(transport=transport) as client,
        client.stream("GET", URL) as response,
    ):
        assert await response.aread() == b"first half, second half"
    assert lost(events) == ["a.test"]
    assert bulkhead.statistics("a.test").in_flight == 0


@pytest.mark.anyio
async def test_a_failed_exchange_raises_its_own_error_when_its_lease_was_lost(
    redis_server: RedisServer,
) -> None:
    """The connection fails after the slot's lease vanished: the caller gets the
    connection error (not LeaseLost chained over it) and the slot is given back."""
    events: list[rs.Event] = []
    bulkhead = redis_bulkhead(redis_server, events)

    def refuse(request: httpx.Request) -> httpx.Response:
        lose_leases(redis_server, bulkhead)
        raise httpx.ConnectError("refused", request=request)

    transport = ResilientTransport(httpx.MockTransport(refuse), bulkhead=bulkhead, attempts=1)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(URL)
    assert lost(events) == ["a.test"]
    assert bulkhead.statistics("a.test").in_flight == 0
