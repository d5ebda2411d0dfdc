"""Hedging against mock upstreams: who wins, what is cancelled or closed, what is paid."""

from __future__ import annotations

import io
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

import resilience as rs
from resilience.bulkhead import Bulkhead
from resilience.httpx import HedgeStarted, ResilientTransport
from resilience.testing import FakeClock

URL = "http://a.test/"


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that signals when it is closed (threads may close it later)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        yield self.data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data

    def close(self) -> None:
        self.closed.set()

    async def aclose(self) -> None:
        self.closed.set()


class StuckThenFast:
    """Async upstream: the first request never answers (until cancelled); later ones do."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        n = self.calls
        self.calls += 1
        if n == 0:
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled += 1
        return httpx.Response(200, text=f"answer {n}")


@pytest.mark.anyio
async def test_the_hedge_answers_and_the_stuck_attempt_is_cancelled(fake_clock: FakeClock) -> None:
    """After the hedge delay a second copy goes out; its answer wins, the first is cancelled."""
    upstream = StuckThenFast()
    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=0.2, clock=fake_clock)
    events: list[rs.Event] = []
    transport.add_listener(events.append)
    with anyio.fail_after(5):
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.get(URL)
    assert response.text == "answer 1"
    assert (upstream.calls, upstream.cancelled) == (2, 1)
    stats = transport.statistics()
    assert (stats.hedges, stats.hedge_wins) == (1, 1)
    assert [type(event) for event in events] == [HedgeStarted]
    assert events[0].key == "a.test"


@pytest.mark.anyio
async def test_a_quick_answer_is_not_hedged() -> None:
    """An answer before the hedge delay ends the round: no second copy."""
    calls = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=30.0)
    with anyio.fail_after(5):
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(URL)).status_code == 200
    assert len(calls) == 1
    assert transport.statistics().hedges == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("POST", {"content": b"order"}),  # not idempotent: never sent twice
        ("PUT", {"files": {"f": io.BytesIO(b"hello")}}),  # two copies would read one file
    ],
    ids=["post", "file-upload"],
)
async def test_requests_that_must_not_be_sent_twice_at_once_are_not_hedged(
    fake_clock: FakeClock, method: str, body: dict[str, Any]
) -> None:
    """A POST, or a file upload, waits for its only attempt, however long it takes."""
    upstream = StuckThenFast()
    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=0.01, clock=fake_clock)
    async with httpx.AsyncClient(transport=transport) as client:
        with anyio.move_on_after(0.2):
            await client.request(method, URL, **body)
    assert upstream.calls == 1
    assert transport.statistics().hedges == 0


@pytest.mark.anyio
async def test_multipart_bodies_of_bytes_are_hedged(fake_clock: FakeClock) -> None:
    """A multipart body of bytes renders the same for two senders at once: hedged. It used
    to be treated as a generator, neither hedged nor retried."""
    upstream = StuckThenFast()
    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=0.2, clock=fake_clock)
    with anyio.fail_after(5):
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.put(URL, files={"f": b"hello"})
    assert response.text == "answer 1"
    assert transport.statistics().hedges == 1


@pytest.mark.anyio
async def test_hedges_draw_from_the_retry_budget(fake_clock: FakeClock) -> None:
    """An empty retry budget means no hedge: the request waits for its first attempt."""
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.0, clock=fake_clock)
    upstream = StuckThenFast()
    transport = ResilientTransport(
        httpx.MockTransport(upstream), hedge=0.01, budget=budget, clock=fake_clock
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with anyio.move_on_after(0.2):
            await client.get(URL)
    assert upstream.calls == 1
    assert budget.statistics().retries == 0


@pytest.mark.anyio
async def test_a_full_bulkhead_means_no_hedge(fake_clock: FakeClock) -> None:
    """The hedge needs a slot of its own at once; with none free it is not sent."""
    upstream = StuckThenFast()
    transport = ResilientTransport(
        httpx.MockTransport(upstream),
        hedge=0.01,
        bulkhead=Bulkhead(1, clock=fake_clock),
        clock=fake_clock,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with anyio.move_on_after(0.2):
            await client.get(URL)
    assert upstream.calls == 1


@pytest.mark.anyio
async def test_a_hedge_not_sent_costs_nothing(fake_clock: FakeClock) -> None:
    """A hedge the full bulkhead cannot take spends no retry from the budget and counts
    no bulkhead rejection: hedges never sent used to drain the budget, so that a real
    retry later was refused."""
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.1, clock=fake_clock)  # 1 retry
    bulkhead = Bulkhead(1, clock=fake_clock)
    upstream = StuckThenFast()
    transport = ResilientTransport(
        httpx.MockTransport(upstream),
        hedge=0.01,
        budget=budget,
        bulkhead=bulkhead,
        clock=fake_clock,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with anyio.move_on_after(0.2):
            await client.get(URL)
    assert upstream.calls == 1
    assert budget.statistics().retries == 0
    assert bulkhead.statistics().rejected == 0
    assert transport.statistics().hedges == 0


@pytest.mark.anyio
async def test_a_bad_first_answer_waits_for_the_hedge(fake_clock: FakeClock) -> None:
    """First good answer wins: a 503 arriving first does not end the round."""
    release = anyio.Event()
    calls = []

    async def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            await release.wait()
            return httpx.Response(503)
        release.set()  # the hedge lets the first attempt fail now, then answers
        await anyio.sleep(0.01)
        return httpx.Response(200, text="hedge")

    transport = ResilientTransport(
        httpx.MockTransport(upstream), hedge=0.1, attempts=1, clock=fake_clock
    )
    with anyio.fail_after(5):
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.get(URL)
    assert (response.status_code, response.text) == (200, "hedge")


def test_sync_hedge_wins_and_the_loser_is_closed_when_it_answers() -> None:
    """Sync: the stuck first attempt keeps its worker thread; when it finally answers,
    its response is closed, not leaked."""
    release = threading.Event()
    bodies: list[Body] = []
    lock = threading.Lock()

    def upstream(request: httpx.Request) -> httpx.Response:
        with lock:
            n = len(bodies)
            body = Body(b"answer %d" % n)
            bodies.append(body)
        if n == 0:
            release.wait(5)
        return httpx.Response(200, stream=body)

    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=0.01)
    with httpx.Client(transport=transport) as client:
        assert client.get(URL).content == b"answer 1"
        release.set()
        assert bodies[0].closed.wait(5)
    assert bodies[1].closed.is_set()
    assert transport.statistics().hedge_wins == 1


class SlowHost:
    """A mock upstream: ``slow.test`` answers once ``release`` is set, others at once;
    ``sent`` lists the hosts asked, in order."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sent: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url.host)
        if request.url.host == "slow.test":
            self.release.wait(5)
        return httpx.Response(200, text=request.url.host)

    def take_the_only_thread(self, client: httpx.Client) -> threading.Thread:
        """A slow.test round on the client's one hedging thread, until ``release``."""
        slow = threading.Thread(target=client.get, args=("http://slow.test/",))
        slow.start()
        while "slow.test" not in self.sent:
            self.release.wait(0.001)
        return slow


def test_sync_hedge_delay_starts_when_the_first_attempt_starts() -> None:
    """With every hedging thread busy with another host's slow round, a request's
    first attempt waits for a thread; its hedge delay runs from when it is sent, not
    from when it was queued. (The hedge used to be admitted while the first attempt
    was still queued, took the host's only bulkhead slot, and the first attempt then
    waited ``max_wait`` for the slot its own hedge held.)"""
    upstream = SlowHost()
    sent = upstream.sent
    transport = ResilientTransport(
        httpx.MockTransport(upstream), hedge=0.05, bulkhead=1, max_wait=2.0, hedge_threads=1
    )
    with httpx.Client(transport=transport) as client:
        slow = upstream.take_the_only_thread(client)
        quick = threading.Thread(target=lambda: sent.append(client.get(URL).text + " answered"))
        quick.start()
        quick.join(0.25)  # well past the 50 ms hedge delay, still queued
        upstream.release.set()
        quick.join(5)
        slow.join(5)
    assert sent.count("a.test answered") == 1
    assert sent.count("a.test") == 1  # sent once: no hedge for an answer that came at once
    stats = transport.statistics()
    assert (stats.hedges, stats.hedge_wins, stats.rejected) == (0, 0, 0)


def test_a_sync_hedge_still_queued_when_the_round_is_decided_is_never_sent() -> None:
    """A hedge waiting for a hedging thread when its round is answered is cancelled:
    it is not sent after the caller has its answer, and it held nothing meanwhile."""
    upstream = SlowHost()
    sent = upstream.sent
    transport = ResilientTransport(httpx.MockTransport(upstream), hedge=0.05, hedge_threads=1)
    with httpx.Client(transport=transport) as client:
        slow = upstream.take_the_only_thread(client)
        slow.join(0.25)  # its hedge is queued behind it, on the only thread
        upstream.release.set()
        slow.join(5)
        assert client.get(URL).text == "a.test"  # the thread is free again
    assert sent == ["slow.test", "a.test"]
    assert transport.statistics().hedges == 0
