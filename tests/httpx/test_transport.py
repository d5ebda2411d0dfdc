"""ResilientTransport against scripted mock upstreams, in virtual time, in every shell."""

from __future__ import annotations

import os
import weakref
from typing import Any

import anyio
import httpx
import pytest

import resilience as rs
from resilience import backoff
from resilience.breaker import CircuitBreaker, CircuitState
from resilience.bulkhead import Bulkhead
from resilience.errors import BulkheadFull, CircuitOpen, ConfigurationError, RateLimited, Rejected
from resilience.httpx import HostPaused, HostPolicy, ResilientTransport, host_key
from resilience.testing import FakeClock

from .._clocks import StallingClock
from .conftest import Send, Upstream

A = "http://a.test/x"
B = "http://b.test/x"
NO_BACKOFF = backoff.constant(0.0)


def always(status: int, headers: dict[str, str] | None = None) -> Any:
    return lambda request, n: (status, headers or {})


def first(failure: Any, then: Any = (200, {})) -> Any:
    """The first answer is ``failure`` (a status or an exception), then ``then``."""

    def script(request: httpx.Request, n: int) -> Any:
        if n:
            return then
        return failure if isinstance(failure, BaseException) else (failure, {})

    return script


def transport(upstream: Upstream, **kwargs: Any) -> ResilientTransport:
    kwargs.setdefault("backoff", NO_BACKOFF)
    return ResilientTransport(upstream.transport, clock=upstream.clock, **kwargs)


def test_a_good_answer_passes_through(send: Send, fake_clock: FakeClock) -> None:
    """One request, one call upstream, the body as sent, nothing slept."""
    upstream = Upstream(fake_clock, always(200))
    response = send(transport(upstream), "GET", A)
    assert (response.status_code, response.content) == (200, b"answer 0")
    assert len(upstream.calls) == 1
    assert fake_clock.sleeps == []


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retryable_statuses_are_retried_and_closed(
    send: Send, fake_clock: FakeClock, status: int
) -> None:
    """A 429/502/503/504 is retried; the failed attempt's response is closed (no leak)."""
    upstream = Upstream(fake_clock, first(status))
    t = transport(upstream)
    response = send(t, "GET", A)
    assert response.status_code == 200
    assert len(upstream.calls) == 2
    assert upstream.leaked() == []
    assert t.statistics().recovered == 1


@pytest.mark.parametrize("status", [400, 404, 500, 501])
def test_other_statuses_are_returned_as_is(send: Send, fake_clock: FakeClock, status: int) -> None:
    """Statuses outside retry_statuses are answers, not failures to retry."""
    upstream = Upstream(fake_clock, always(status))
    assert send(transport(upstream), "GET", A).status_code == status
    assert len(upstream.calls) == 1


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("closed early"),
    ],
)
def test_transport_errors_are_retried(send: Send, fake_clock: FakeClock, error: Exception) -> None:
    """Connection errors, timeouts and early closes are retried."""
    upstream = Upstream(fake_clock, first(error))
    assert send(transport(upstream), "GET", A).status_code == 200
    assert len(upstream.calls) == 2


def test_exhausted_retries_raise_the_last_error(send: Send, fake_clock: FakeClock) -> None:
    """After ``attempts`` failures the last exception propagates."""
    upstream = Upstream(fake_clock, lambda request, n: httpx.ConnectError(f"refused {n}"))
    with pytest.raises(httpx.ConnectError, match="refused 2"):
        send(transport(upstream, attempts=3), "GET", A)
    assert len(upstream.calls) == 3


def test_exhausted_retries_return_the_last_response(send: Send, fake_clock: FakeClock) -> None:
    """After ``attempts`` 503s the caller gets the last 503, readable; earlier ones closed."""
    upstream = Upstream(fake_clock, always(503))
    t = transport(upstream, attempts=3)
    response = send(t, "GET", A)
    assert (response.status_code, response.content) == (503, b"answer 2")
    assert len(upstream.calls) == 3
    assert upstream.leaked() == []
    assert t.statistics().exhausted == 1


def test_other_exceptions_are_not_retried(send: Send, fake_clock: FakeClock) -> None:
    """An error that is not in retry_on propagates after one attempt."""
    upstream = Upstream(fake_clock, first(httpx.UnsupportedProtocol("gopher")))
    with pytest.raises(httpx.UnsupportedProtocol):
        send(transport(upstream), "GET", A)
    assert len(upstream.calls) == 1


def test_retries_wait_the_backoff(send: Send, fake_clock: FakeClock) -> None:
    """Attempts are separated by the backoff schedule's delays."""
    upstream = Upstream(fake_clock, always(503))
    send(transport(upstream, attempts=3, backoff=[0.5, 1.5]), "GET", A)
    assert [call.at for call in upstream.calls] == [0.0, 0.5, 2.0]


def test_retry_after_2_on_a_429_makes_the_next_attempt_wait_2s(
    send: Send, fake_clock: FakeClock
) -> None:
    """The retry waits at least Retry-After, even when the backoff is shorter."""
    upstream = Upstream(
        fake_clock, lambda request, n: (429, {"Retry-After": "2"}) if n == 0 else (200, {})
    )
    response = send(transport(upstream, backoff=[0.1]), "GET", A)
    assert response.status_code == 200
    first_at, second_at = (call.at for call in upstream.calls)
    assert second_at - first_at >= 2.0


def test_retry_after_as_http_date(send: Send, fake_clock: FakeClock) -> None:
    """An HTTP-date Retry-After is measured from the response's Date."""
    headers = {
        "Date": "Tue, 14 Nov 2023 22:13:20 GMT",
        "Retry-After": "Tue, 14 Nov 2023 22:13:23 GMT",
    }
    upstream = Upstream(fake_clock, lambda request, n: (503, headers) if n == 0 else (200, {}))
    send(transport(upstream), "GET", A)
    assert upstream.calls[1].at - upstream.calls[0].at >= 3.0


def test_server_delays_are_capped(send: Send, fake_clock: FakeClock) -> None:
    """A Retry-After of a day is trusted only up to max_server_delay."""
    upstream = Upstream(
        fake_clock, lambda request, n: (503, {"Retry-After": "86400"}) if n == 0 else (200, {})
    )
    send(transport(upstream, max_server_delay=5.0), "GET", A)
    assert upstream.calls[1].at == pytest.approx(5.0)


def test_ratelimit_r0_pauses_that_host_only(send: Send, fake_clock: FakeClock) -> None:
    """After ``RateLimit: r=0;t=5`` the host waits for its reset; another host does not."""

    def script(request: httpx.Request, n: int) -> Any:
        paused = request.url.host == "a.test" and n == 0
        return 200, {"RateLimit": "r=0;t=5"} if paused else {}

    upstream = Upstream(fake_clock, script)
    t = transport(upstream)
    send(t, "GET", A)
    send(t, "GET", B)
    send(t, "GET", A)
    assert [(call.host, call.at) for call in upstream.calls] == [
        ("a.test", 0.0),
        ("b.test", 0.0),
        ("a.test", 5.0),
    ]
    assert t.statistics().pauses == 1


def test_advertised_quota_is_spent_then_waits_for_reset(send: Send, fake_clock: FakeClock) -> None:
    """``r=2;t=10`` lets two more requests go at once; the third waits for the reset."""
    upstream = Upstream(
        fake_clock, lambda request, n: (200, {"RateLimit": '"default";r=2;t=10'} if n == 0 else {})
    )
    t = transport(upstream)
    for _ in range(4):
        send(t, "GET", A)
    assert [call.at for call in upstream.calls] == [0.0, 0.0, 0.0, 10.0]


def test_legacy_fields_pace_too(send: Send, fake_clock: FakeClock) -> None:
    """X-RateLimit-Remaining: 0 with X-RateLimit-Reset pauses the host."""
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3"}
    upstream = Upstream(fake_clock, lambda request, n: (200, headers if n == 0 else {}))
    t = transport(upstream)
    send(t, "GET", A)
    send(t, "GET", A)
    assert upstream.calls[1].at == 3.0


def test_server_signals_can_be_ignored(send: Send, fake_clock: FakeClock) -> None:
    """server_signals=False: no pause, no waiting for Retry-After."""
    upstream = Upstream(fake_clock, lambda request, n: (200, {"RateLimit": "r=0;t=5"}))
    t = transport(upstream, server_signals=False)
    send(t, "GET", A)
    send(t, "GET", A)
    assert [call.at for call in upstream.calls] == [0.0, 0.0]


def test_a_pause_beyond_max_wait_rejects_without_sending(send: Send, fake_clock: FakeClock) -> None:
    """A host paused longer than max_wait fails fast with Rejected(retry_after), unsent."""
    upstream = Upstream(fake_clock, always(503, {"Retry-After": "50"}))
    t = transport(upstream, attempts=1, max_wait=10.0)
    assert send(t, "GET", A).status_code == 503
    with pytest.raises(Rejected) as caught:
        send(t, "GET", A)
    assert isinstance(caught.value, RateLimited)
    assert caught.value.retry_after == pytest.approx(50.0)
    assert len(upstream.calls) == 1
    assert t.statistics().rejected == 1
    assert send(t, "GET", B).status_code == 503  # other hosts are not paused


def test_a_retry_is_not_held_by_a_pause_beyond_max_wait(send: Send, fake_clock: FakeClock) -> None:
    """A 503 with Retry-After 45 and max_wait=5: the 503 is returned at once, as a fresh
    request to that paused host would fail at once; a pause within max_wait is waited.
    The retry used to wait out the whole 45 s pause, ignoring max_wait."""
    upstream = Upstream(
        fake_clock, lambda request, n: (503, {"Retry-After": "45"}) if n == 0 else (200, {})
    )
    t = transport(upstream, max_wait=5.0)
    events: list[rs.Event] = []
    t.add_listener(events.append)
    response = send(t, "GET", A)
    assert (response.status_code, response.content) == (503, b"answer 0")
    assert len(upstream.calls) == 1
    assert fake_clock.monotonic() == 0.0
    assert [(type(e), getattr(e, "reason", None)) for e in events] == [
        (HostPaused, "retry-after"),
        (rs.RetriesExhausted, "max_wait"),
    ]
    assert upstream.leaked() == []

    upstream = Upstream(
        fake_clock, lambda request, n: (503, {"Retry-After": "4"}) if n == 0 else (200, {})
    )
    assert send(transport(upstream, max_wait=5.0), "GET", A).status_code == 200
    assert upstream.calls[1].at - upstream.calls[0].at == pytest.approx(4.0)


def test_non_idempotent_requests_are_not_retried(send: Send, fake_clock: FakeClock) -> None:
    """A POST that got a 503, or a connection error, is not sent again."""
    upstream = Upstream(fake_clock, first(503))
    assert send(transport(upstream), "POST", A, content=b"order").status_code == 503
    upstream = Upstream(fake_clock, first(httpx.ConnectError("refused")))
    with pytest.raises(httpx.ConnectError):
        send(transport(upstream), "POST", A, content=b"order")
    assert len(upstream.calls) == 1


def test_non_idempotent_requests_are_retried_when_configured(
    send: Send, fake_clock: FakeClock
) -> None:
    """POST joins the retried methods through ``idempotent=``, or per request with an
    Idempotency-Key field."""
    upstream = Upstream(fake_clock, first(503))
    t = transport(upstream, idempotent={"GET", "POST"})
    assert send(t, "POST", A, content=b"order").status_code == 200
    upstream = Upstream(fake_clock, first(503))
    keyed = send(transport(upstream), "POST", A, content=b"x", headers={"Idempotency-Key": "k1"})
    assert keyed.status_code == 200
    assert [call.request.content for call in upstream.calls] == [b"x", b"x"]


def test_streamed_request_bodies_are_not_retried(
    send: Send, fake_clock: FakeClock, shell: str
) -> None:
    """A body from a generator can be sent once only, even with an idempotent method."""
    upstream = Upstream(fake_clock, first(503))
    if shell == "sync":
        content: Any = iter([b"a", b"b"])
    else:

        async def chunks() -> Any:
            yield b"a"
            yield b"b"

        content = chunks()
    assert send(transport(upstream), "PUT", A, content=content).status_code == 503
    assert len(upstream.calls) == 1


class BodyReader(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An upstream that reads every request body from its stream, as a network transport
    does (MockTransport keeps the bytes of its first reading): the first answer is a 503,
    the next ones 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def _answer(self, body: bytes) -> httpx.Response:
        self.bodies.append(body)
        return httpx.Response(503 if len(self.bodies) == 1 else 200)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        return self._answer(b"".join(request.stream))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        return self._answer(b"".join([chunk async for chunk in request.stream]))


def test_multipart_bodies_are_retried(send: Send, fake_clock: FakeClock) -> None:
    """A PUT with a multipart body (``files=``) is retried like any idempotent request,
    with the same bytes. It used to be sent once only, as if it were a generator."""
    upstream = Upstream(fake_clock, first(503))
    response = send(transport(upstream), "PUT", A, files={"f": b"hello"}, data={"k": "v"})
    assert response.status_code == 200
    first_body, second_body = (call.request.content for call in upstream.calls)
    assert b"hello" in first_body
    assert second_body == first_body


def test_multipart_uploads_of_seekable_files_are_retried(
    send: Send, fake_clock: FakeClock, tmp_path: Any
) -> None:
    """httpx reads an uploaded file again from its start on every send, so a seekable
    file is resent whole; the upstream reads the stream itself each time."""
    path = tmp_path / "upload.bin"
    path.write_bytes(bytes(range(256)) * 1000)  # 256 kB: several read chunks
    upstream = BodyReader()
    t = ResilientTransport(upstream, backoff=NO_BACKOFF, clock=fake_clock)
    with path.open("rb") as file:
        assert send(t, "PUT", A, files={"f": file}).status_code == 200
    first_body, second_body = upstream.bodies
    assert path.read_bytes() in first_body
    assert second_body == first_body


def test_multipart_uploads_of_unseekable_files_are_sent_once(
    send: Send, fake_clock: FakeClock
) -> None:
    """A pipe cannot be read twice: its upload is sent once, whatever the method."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"once only")
    os.close(write_end)
    upstream = BodyReader()
    t = ResilientTransport(upstream, backoff=NO_BACKOFF, clock=fake_clock)
    with open(read_end, "rb") as pipe:
        assert send(t, "PUT", A, files={"f": pipe}).status_code == 503
    assert len(upstream.bodies) == 1
    assert b"once only" in upstream.bodies[0]


def test_retry_budget_caps_retries(send: Send, fake_clock: FakeClock) -> None:
    """An empty budget stops retrying: the failure is returned at once."""
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.1, window=10.0, clock=fake_clock)
    upstream = Upstream(fake_clock, always(503))
    t = transport(upstream, attempts=5, budget=budget)
    send(t, "GET", A)
    assert len(upstream.calls) == 2  # the budget held one retry (0.1/s over 10 s)
    send(t, "GET", A)
    assert len(upstream.calls) == 3


@pytest.mark.anyio
async def test_a_retry_cancelled_in_its_backoff_is_not_paid_for() -> None:
    """A caller that goes away during a retry's backoff never sends it: the retry is
    given back to the budget and not counted, so callers that leave mid-backoff do not
    drain the budget of those that retry."""

    clock = StallingClock()
    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.1, window=10.0, clock=clock)
    t = ResilientTransport(
        httpx.MockTransport(lambda request: httpx.Response(503)),
        budget=budget,
        backoff=[1.0],
        clock=clock,
    )
    async with httpx.AsyncClient(transport=t) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(client.get, A)
            await anyio.wait_all_tasks_blocked()  # in the backoff, the retry paid for
            assert budget.statistics().retries == 1
            group.cancel_scope.cancel()
    assert budget.statistics().retries == 0
    assert t.statistics().retries == 0


@pytest.mark.anyio
async def test_a_retry_cancelled_while_it_waits_for_a_slot_is_not_paid_for() -> None:
    """The same for a retry cancelled while it queues for the host's bulkhead slot
    (or its limiter, or a pause): it was never sent, so it is given back to the budget
    and not counted."""
    flaky_in, hog_queued, release = anyio.Event(), anyio.Event(), anyio.Event()
    calls: list[str] = []

    async def upstream(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path.endswith("/hog"):  # takes the slot /flaky frees, and keeps it
            await release.wait()
            return httpx.Response(200)
        flaky_in.set()
        await hog_queued.wait()
        return httpx.Response(503)

    budget = rs.RetryBudget(ratio=0.0, min_per_second=0.1, window=10.0)
    t = ResilientTransport(
        httpx.MockTransport(upstream), bulkhead=1, max_wait=30, backoff=[0.0], budget=budget
    )
    async with httpx.AsyncClient(transport=t, base_url=A) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(client.get, "/flaky")
                await flaky_in.wait()
                group.start_soon(client.get, "/hog")
                await anyio.wait_all_tasks_blocked()  # /hog queues for the slot
                hog_queued.set()
                await anyio.wait_all_tasks_blocked()  # /flaky's retry queues behind it
                assert calls == ["/x/flaky", "/x/hog"]
                assert budget.statistics().retries == 1
                group.cancel_scope.cancel()
    assert budget.statistics().retries == 0
    assert t.statistics().retries == 0


def test_a_retry_out_of_time_before_it_is_sent_returns_the_answer_in_hand(
    send: Send, fake_clock: FakeClock
) -> None:
    """A retry that waits for the host's limiter token until the deadline was never
    sent: the caller gets the 503 in hand (it got an httpx.TimeoutException), and the
    retry is neither counted nor paid for."""
    sized = {"content-length": "8"}  # "answer 0": kept while the retry runs
    upstream = Upstream(fake_clock, lambda request, n: (503, sized) if n == 0 else (200, {}))
    t = transport(upstream, limiter="1/s", backoff=backoff.constant(0.1))
    with rs.deadline(1.0, clock=fake_clock):
        response = send(t, "GET", A)
    assert (response.status_code, response.content) == (503, b"answer 0")
    assert len(upstream.calls) == 1
    stats = t.statistics()
    assert (stats.retries, stats.exhausted) == (0, 1)
    assert t.budget.statistics().retries == 0


def test_a_refused_retry_after_an_unsized_answer_is_counted_as_given_up(
    send: Send, fake_clock: FakeClock
) -> None:
    """An unsized answer cannot be kept while its retry runs, so a retry the breaker
    refuses raises CircuitOpen (documented); the run still gave up, and says so
    (``exhausted`` stayed 0 and no RetriesExhausted was emitted)."""
    breaker = CircuitBreaker(
        key=host_key, consecutive_failures=1, failure_rate=None, clock=fake_clock
    )
    upstream = Upstream(fake_clock, always(503))  # unsized bodies
    t = transport(upstream, breaker=breaker, backoff=backoff.constant(0.1))
    given_up: list[Any] = []
    t.add_listener(lambda event: given_up.append(getattr(event, "reason", None)))
    with pytest.raises(CircuitOpen):
        send(t, "GET", A)
    assert t.statistics().exhausted == 1
    assert "rejected" in given_up
    assert upstream.leaked() == []


def test_a_retry_after_of_many_digits_pauses_for_the_cap(send: Send, fake_clock: FakeClock) -> None:
    """``Retry-After: 1234567890123456`` means "much later": the cap (max_server_delay),
    beyond max_wait, so the answer is returned at once (the value used to be ignored
    and the request retried after the backoff)."""
    huge = {"Retry-After": "1234567890123456"}
    upstream = Upstream(fake_clock, lambda request, n: (503, huge) if n == 0 else (200, {}))
    t = transport(upstream, backoff=backoff.constant(0.1), max_wait=30)
    paused: list[Any] = []
    t.add_listener(lambda event: paused.append(event) if isinstance(event, HostPaused) else None)
    assert send(t, "GET", A).status_code == 503
    assert len(upstream.calls) == 1
    assert [(event.seconds, event.reason) for event in paused] == [(60.0, "retry-after")]


def test_a_pause_set_by_the_quota_says_quota(send: Send, fake_clock: FakeClock) -> None:
    """429 with ``Retry-After: 2`` and a quota spent for 8 s: the pause is the quota's
    (it was reported as reason="retry-after")."""
    headers = {"Retry-After": "2", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "8"}
    upstream = Upstream(fake_clock, always(429, headers))
    t = transport(upstream, attempts=1)
    paused: list[Any] = []
    t.add_listener(lambda event: paused.append(event) if isinstance(event, HostPaused) else None)
    assert send(t, "GET", A).status_code == 429
    assert [(event.seconds, event.reason) for event in paused] == [(8.0, "quota")]


def test_deadline_clamps_timeouts_and_is_forwarded(send: Send, fake_clock: FakeClock) -> None:
    """Each attempt's timeouts are cut to the time left; the header carries it."""
    upstream = Upstream(fake_clock, lambda request, n: (503, {}) if n == 0 else (200, {}))
    t = transport(upstream, backoff=[0.5], deadline_header="Request-Timeout")
    with rs.deadline(2.0, clock=fake_clock):
        send(t, "GET", A, timeout=httpx.Timeout(10.0, connect=1.0))
    first_try, second_try = upstream.calls
    assert first_try.timeout == {"connect": 1.0, "read": 2.0, "write": 2.0, "pool": 2.0}
    assert first_try.headers["request-timeout"] == "2.000"
    assert second_try.timeout["read"] == pytest.approx(1.5)
    assert second_try.headers["request-timeout"] == "1.500"


def test_no_deadline_leaves_timeouts_alone(send: Send, fake_clock: FakeClock) -> None:
    """Without an ambient deadline the client's timeouts and headers are untouched."""
    upstream = Upstream(fake_clock, always(200))
    send(transport(upstream, deadline_header="Request-Timeout"), "GET", A, timeout=7.0)
    call = upstream.calls[0]
    assert call.timeout["read"] == 7.0
    assert "request-timeout" not in call.headers


def test_a_retry_that_would_overrun_the_deadline_is_not_made(
    send: Send, fake_clock: FakeClock
) -> None:
    """Retry-After 5 with 1 s left: the 429 is returned now instead of waiting in vain."""
    upstream = Upstream(fake_clock, always(429, {"Retry-After": "5"}))
    t = transport(upstream)
    with rs.deadline(1.0, clock=fake_clock):
        assert send(t, "GET", A).status_code == 429
    assert len(upstream.calls) == 1
    assert fake_clock.monotonic() == 0.0


@pytest.mark.parametrize("left", [0.0, 0.00005, 0.005])
def test_a_retry_with_no_time_left_after_its_backoff_is_not_made(
    send: Send, fake_clock: FakeClock, left: float
) -> None:
    """A backoff that would leave the retry no time (or a few ms) before the deadline: the
    503 in hand is returned. The retry used to start anyway: with 0 s left it raised
    httpx.TimeoutException before sending, and with 50 µs it was sent with no hope."""
    upstream = Upstream(fake_clock, always(503))
    t = transport(upstream, backoff=[1.0 - left])
    with rs.deadline(1.0, clock=fake_clock):
        response = send(t, "GET", A)
    assert (response.status_code, response.content) == (503, b"answer 0")
    assert len(upstream.calls) == 1
    assert fake_clock.sleeps == []


def test_a_retry_with_time_left_after_its_backoff_is_made(
    send: Send, fake_clock: FakeClock
) -> None:
    """The counterpart: 50 ms left after the backoff is enough to try again."""
    upstream = Upstream(fake_clock, first(503))
    t = transport(upstream, backoff=[0.95])
    with rs.deadline(1.0, clock=fake_clock):
        assert send(t, "GET", A).status_code == 200
    assert [call.at for call in upstream.calls] == [0.0, pytest.approx(0.95)]


def test_a_passed_deadline_raises_without_sending(send: Send, fake_clock: FakeClock) -> None:
    """No time left: a timeout error, and nothing reaches the upstream."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream)
    with rs.deadline(1.0, clock=fake_clock):
        fake_clock.advance(1.0)
        with pytest.raises(httpx.TimeoutException):
            send(t, "GET", A)
    assert upstream.calls == []


class Trickle(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that arrives a byte every 0.3 s (of fake time), as a stalling server's."""

    def __init__(self, clock: FakeClock, chunks: int) -> None:
        self.clock = clock
        self.chunks = chunks
        self.closed = False

    def __iter__(self) -> Any:
        for _ in range(self.chunks):
            self.clock.advance(0.3)
            yield b"y"

    async def __aiter__(self) -> Any:
        for chunk in self:
            yield chunk

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def test_a_body_trickling_past_the_deadline_is_cut(send: Send, fake_clock: FakeClock) -> None:
    """The attempt's read timeout bounds each read, not the body: a server sending a
    byte every 0.3 s kept the reader 3 s into a 1 s deadline. The first chunk that
    arrives after the deadline raises ReadTimeout instead (the body is closed); a
    body read within the deadline is whole."""
    bodies: list[Trickle] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        bodies.append(Trickle(fake_clock, chunks=10))
        return httpx.Response(200, stream=bodies[-1])

    t = ResilientTransport(httpx.MockTransport(upstream), clock=fake_clock)
    with rs.deadline(1.0, clock=fake_clock), pytest.raises(httpx.ReadTimeout):
        send(t, "GET", A)
    assert fake_clock.monotonic() == pytest.approx(1.2)  # cut at the 4th byte, not the 10th
    assert bodies[-1].closed
    with rs.deadline(5.0, clock=fake_clock):
        assert send(t, "GET", A).content == b"y" * 10


def test_a_body_read_after_leaving_its_deadline_is_read_whole(fake_clock: FakeClock) -> None:
    """The deadline a body is held to is its reader's: a response received under
    ``rs.deadline`` (or returned by a ``@rs.Timeout`` function) and read after the
    block is read whole, as before the trickle fix."""
    t = ResilientTransport(
        httpx.MockTransport(lambda request: httpx.Response(200, stream=Trickle(fake_clock, 3))),
        clock=fake_clock,
    )
    with httpx.Client(transport=t) as client:
        with rs.deadline(1.0, clock=fake_clock):
            response = client.send(client.build_request("GET", A), stream=True)
        fake_clock.advance(5.0)
        assert response.read() == b"yyy"


def test_5xx_opens_the_hosts_breaker_others_unaffected(send: Send, fake_clock: FakeClock) -> None:
    """A host answering 503s trips its own circuit; another host keeps being called."""
    breaker = CircuitBreaker(
        key=host_key, failure_rate=0.5, window=4, min_calls=4, open_for=30, clock=fake_clock
    )
    upstream = Upstream(
        fake_clock, lambda request, n: (503, {}) if request.url.host == "a.test" else (200, {})
    )
    t = transport(upstream, attempts=1, breaker=breaker)
    for _ in range(4):
        assert send(t, "GET", A).status_code == 503
    with pytest.raises(CircuitOpen):
        send(t, "GET", A)
    assert len(upstream.to("a.test")) == 4
    assert send(t, "GET", B).status_code == 200
    assert breaker.state_of("a.test") is CircuitState.OPEN
    assert breaker.state_of("b.test") is CircuitState.CLOSED


def test_an_open_breaker_refuses_before_the_limiter_waits(
    send: Send, fake_clock: FakeClock
) -> None:
    """A host whose breaker is open is refused at once: no wait for a token (or a slot),
    and no token spent. The ticket used to be taken after the limiter's wait, so each
    refusal came at the limiter's pace (one a second here) and used up its tokens."""
    breaker = CircuitBreaker(key=host_key, consecutive_failures=1, open_for=30, clock=fake_clock)
    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream, attempts=1, limiter="1/s", breaker=breaker)
    breaker.open("a.test")
    for _ in range(5):
        with pytest.raises(CircuitOpen):
            send(t, "GET", A)
    assert fake_clock.monotonic() == 0.0
    breaker.close("a.test")
    send(t, "GET", A)  # the token is still there: no wait
    assert [(call.host, call.at) for call in upstream.calls] == [("a.test", 0.0)]


def test_429_is_not_a_breaker_failure(send: Send, fake_clock: FakeClock) -> None:
    """Rate limiting is the server working as intended: the circuit stays closed."""
    breaker = CircuitBreaker(
        key=host_key, failure_rate=0.5, window=4, min_calls=4, clock=fake_clock
    )
    upstream = Upstream(fake_clock, always(429))
    t = transport(upstream, attempts=1, breaker=breaker)
    for _ in range(6):
        assert send(t, "GET", A).status_code == 429
    assert breaker.state_of("a.test") is CircuitState.CLOSED


def test_connection_errors_are_breaker_failures(send: Send, fake_clock: FakeClock) -> None:
    """Refused connections trip the breaker like 5xx answers."""
    upstream = Upstream(fake_clock, lambda request, n: httpx.ConnectError("refused"))
    t = transport(upstream, attempts=1, breaker=True)
    for _ in range(100):
        try:
            send(t, "GET", A)
        except httpx.ConnectError:
            continue
        except CircuitOpen:
            break
    else:
        pytest.fail("the breaker never opened")
    assert len(upstream.calls) < 100


def test_limiter_is_per_host(send: Send, fake_clock: FakeClock) -> None:
    """limiter="1/s": a second request to the same host waits a second, another host does not."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream, limiter="1/s")
    send(t, "GET", A)
    send(t, "GET", A)
    send(t, "GET", B)
    assert [(call.host, call.at) for call in upstream.calls] == [
        ("a.test", 0.0),
        ("a.test", 1.0),
        ("b.test", 1.0),
    ]


def test_hosts_overrides_match_exact_names_and_globs(send: Send, fake_clock: FakeClock) -> None:
    """``hosts=`` gives matching hosts their own limits; False removes one."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(
        upstream,
        limiter="1/s",
        hosts={"*.test": HostPolicy(limiter="1/10s"), "b.test": HostPolicy(limiter=False)},
    )
    for url in (A, A, B, B, "http://c.example/"):
        send(t, "GET", url)
    assert [(call.host, call.at) for call in upstream.calls] == [
        ("a.test", 0.0),
        ("a.test", 10.0),
        ("b.test", 10.0),
        ("b.test", 10.0),
        ("c.example", 10.0),
    ]


def test_hosts_overrides_without_a_port_cover_every_port(send: Send, fake_clock: FakeClock) -> None:
    """``"a.test"`` names a.test on port 8080 too (it used to match only the default
    port, since the host key carries the port); ``"b.test:8080"`` names that port only."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(
        upstream,
        limiter=False,
        hosts={"a.test": HostPolicy(limiter="1/10s"), "b.test:8080": HostPolicy(limiter="1/10s")},
    )
    for url in ("http://a.test:8080/", "http://a.test:8080/", "http://b.test:8080/"):
        send(t, "GET", url)
    send(t, "GET", "http://b.test:9090/")
    send(t, "GET", "http://b.test:9090/")
    assert [call.at for call in upstream.calls] == [0.0, 10.0, 10.0, 10.0, 10.0]


def test_events_tell_what_happened(send: Send, fake_clock: FakeClock) -> None:
    """Retries, pauses and give-ups are announced with the host as key."""
    events: list[rs.Event] = []
    upstream = Upstream(fake_clock, always(429, {"Retry-After": "1"}))
    t = transport(upstream, attempts=2)
    t.add_listener(events.append)
    send(t, "GET", A)
    kinds = [(type(event).__name__, event.key) for event in events]
    assert kinds == [
        ("HostPaused", "a.test"),
        ("RetryScheduled", "a.test"),
        ("HostPaused", "a.test"),
        ("RetriesExhausted", "a.test"),
    ]
    paused = events[0]
    assert isinstance(paused, HostPaused)
    assert (paused.seconds, paused.reason) == (1.0, "retry-after")
    t.remove_listener(events.append)


def test_custom_key_groups_hosts(send: Send, fake_clock: FakeClock) -> None:
    """key= decides what "one host" is: here every host of the same domain."""
    upstream = Upstream(fake_clock, lambda request, n: (200, {"RateLimit": "r=0;t=4"}))
    t = transport(upstream, key=lambda request: request.url.host.split(".", 1)[-1])
    send(t, "GET", "http://one.shared.test/")
    send(t, "GET", "http://two.shared.test/")
    assert [call.at for call in upstream.calls] == [0.0, 4.0]


def test_chaos_faulty_transport_inside(send: Send, fake_clock: FakeClock) -> None:
    """Faults injected by chaos.FaultyTransport are retried per host as real ones."""
    from resilience import chaos

    upstream = Upstream(fake_clock, always(200))
    faulty = chaos.FaultyTransport(
        upstream.transport,
        hosts={"a.test": [chaos.Status(503, retry_after=1)]},
        enabled=True,
        seed=1,
        clock=fake_clock,
    )
    t = ResilientTransport(faulty, attempts=3, backoff=NO_BACKOFF, clock=fake_clock)
    assert send(t, "GET", A).status_code == 503
    assert fake_clock.monotonic() == pytest.approx(2.0)  # two retries, Retry-After 1 each
    assert send(t, "GET", B).status_code == 200
    assert len(upstream.calls) == 1  # a.test never got through


# -- bulkhead slots and response lifetime (sync client streaming) ------------------------------


def test_bulkhead_slot_is_held_until_the_body_is_closed(fake_clock: FakeClock) -> None:
    """A streaming response keeps its host's slot until closed; other hosts are free."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream, bulkhead=Bulkhead(1, clock=fake_clock))
    client = httpx.Client(transport=t)
    with client.stream("GET", A) as streaming:
        with pytest.raises(BulkheadFull):
            client.get(A)
        assert client.get(B).status_code == 200
        assert streaming.read() == b"answer 0"
    assert client.get(A).status_code == 200
    assert upstream.leaked() == []


def test_bulkhead_slot_is_released_when_the_attempt_fails(
    send: Send, fake_clock: FakeClock
) -> None:
    """Failed attempts and retries give their slots back."""
    bulkhead = Bulkhead(1, clock=fake_clock)
    upstream = Upstream(
        fake_clock, lambda request, n: httpx.ConnectError("x") if n < 2 else (503, {})
    )
    t = transport(upstream, bulkhead=bulkhead, attempts=4)
    assert send(t, "GET", A).status_code == 503
    assert bulkhead.statistics(key="a.test").in_flight == 0


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"attempts": 0}, "attempts"),
        ({"hedge": -1}, "hedge"),
        ({"hedge": "p100"}, "hedge"),
        ({"hedge": "fast"}, "hedge"),
        ({"bulkhead": 0}, "bulkhead"),
        ({"bulkhead": "4"}, "bulkhead"),
        ({"limiter": 5}, "limiter"),
        ({"breaker": "yes"}, "breaker"),
        ({"max_wait": -1}, "max_wait"),
        ({"max_server_delay": 0}, "max_server_delay"),
        ({"retry_statuses": [200, 999]}, "retry_statuses"),
        ({"idempotent": "GET"}, "idempotent"),
        ({"retry_on": [ValueError, 3]}, "retry_on"),
        ({"budget": 0.2}, "budget"),
        ({"backoff": 1.0}, "backoff"),
        ({"backoff": iter([0.1, 0.2])}, "re-iterable"),
        ({"clock": "fake"}, "clock"),
        ({"key": "host"}, "key"),
        ({"deadline_header": ""}, "deadline_header"),
        ({"deadline_header": "bad name"}, "deadline_header"),  # httpx refuses it per request
        ({"backoff": "9"}, "string"),  # read as one 9 s delay before
        ({"backoff": [0.1, -1.0]}, "backoff delay"),
        ({"backoff": [float("nan")]}, "backoff delay"),
        ({"hosts": {"https://a.example": HostPolicy(bulkhead=1)}}, "no scheme"),  # never matched
        ({"hosts": {"a.example/v1": HostPolicy(bulkhead=1)}}, "no scheme"),
        ({"hosts": [("a", HostPolicy())]}, "must map"),
        ({"hosts": {"a": {"bulkhead": 1}}}, "HostPolicy"),
        ({"hosts": {"a": HostPolicy(bulkhead=-2)}}, "hosts['a'].bulkhead"),
        ({"max_hosts": 0}, "max_hosts"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], fragment: str) -> None:
    """Every bad argument raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ResilientTransport(httpx.MockTransport(lambda r: httpx.Response(200)), **kwargs)


def test_threads_sharing_a_client_get_one_default_inner_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default inner transport is made on the first request: threads that made
    theirs together each built one, and all but the last kept their pools (and sockets)
    open past ``client.close()``."""
    import threading
    import time

    built: list[httpx.MockTransport] = []

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)

    def fake_http_transport(*args: Any, **kwargs: Any) -> httpx.MockTransport:
        time.sleep(0.01)  # building a pool takes a while: the window the threads met in
        built.append(httpx.MockTransport(answer))
        return built[-1]

    monkeypatch.setattr(httpx, "HTTPTransport", fake_http_transport)
    start = threading.Barrier(8)
    statuses: list[int] = []
    with httpx.Client(transport=ResilientTransport()) as client:

        def first_request() -> None:
            start.wait()
            statuses.append(client.get(A).status_code)

        threads = [threading.Thread(target=first_request) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert statuses == [200] * 8
    assert len(built) == 1


def test_inner_must_be_a_transport() -> None:
    """A non-transport inner is refused at construction."""
    with pytest.raises(ConfigurationError, match="inner"):
        ResilientTransport(object())  # type: ignore[arg-type]


def test_host_key_includes_non_default_ports() -> None:
    """Two servers on one address are two hosts; default ports are left out."""
    assert host_key(httpx.Request("GET", "http://127.0.0.1:8001/")) == "127.0.0.1:8001"
    assert host_key(httpx.Request("GET", "https://Example.COM:443/")) == "example.com"


@pytest.mark.anyio
async def test_bulkhead_waiters_are_served_by_request_priority(fake_clock: FakeClock) -> None:
    """extensions={PRIORITY: n}: when the host's slot frees, the lower number goes first."""
    from resilience.httpx import PRIORITY

    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream, bulkhead=Bulkhead(1, max_wait=60.0, clock=fake_clock))
    order: list[str] = []

    async def get(client: httpx.AsyncClient, name: str, priority: int) -> None:
        await client.get(A, extensions={PRIORITY: priority})
        order.append(name)

    async with httpx.AsyncClient(transport=t) as client:
        async with client.stream("GET", A) as holding:
            async with anyio.create_task_group() as group:
                group.start_soon(get, client, "batch", 10)
                await anyio.wait_all_tasks_blocked()
                group.start_soon(get, client, "interactive", 0)
                await anyio.wait_all_tasks_blocked()
                await holding.aread()
                await holding.aclose()
    assert order == ["interactive", "batch"]


@pytest.mark.anyio
async def test_cancelled_requests_leak_no_slot_and_no_probe(fake_clock: FakeClock) -> None:
    """Cancelled while waiting for a slot, or while in flight: the slot and the breaker's
    half-open probe are given back, so the host keeps working."""
    started = anyio.Event()

    async def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/hang":
            started.set()
            await anyio.sleep_forever()
        return httpx.Response(200)

    bulkhead = Bulkhead(1, max_wait=60.0, clock=fake_clock)
    breaker = CircuitBreaker(key=host_key, half_open_calls=1, clock=fake_clock)
    t = ResilientTransport(
        httpx.MockTransport(upstream), bulkhead=bulkhead, breaker=breaker, clock=fake_clock
    )
    breaker.open("a.test", seconds=1.0)
    fake_clock.advance(1.0)  # half-open: one probe allowed
    async with httpx.AsyncClient(transport=t) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(client.get, "http://a.test/hang")
            await started.wait()
            group.start_soon(client.get, A)  # waits for the only slot
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
        assert bulkhead.statistics(key="a.test").in_flight == 0
        assert (await client.get(A)).status_code == 200  # the probe was freed, slot too


class _StuckBody(httpx.AsyncByteStream, httpx.SyncByteStream):
    """A 10-byte body whose first 4 bytes arrive and the rest never (or, sync, never
    before the caller is interrupted)."""

    def __init__(self, interrupt: BaseException | None = None) -> None:
        self.interrupt = interrupt
        self.closed = False

    async def __aiter__(self) -> Any:
        yield b"busy"
        await anyio.sleep_forever()

    def __iter__(self) -> Any:
        yield b"busy"
        assert self.interrupt is not None
        raise self.interrupt

    async def aclose(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_a_request_cancelled_while_its_503_is_read_gives_its_slot_back(
    fake_clock: FakeClock,
) -> None:
    """Before a retry the transport reads a small retryable answer (to return it should
    the retry be refused). A caller cancelled during that read left the answer open: its
    slot was never given back, and every later request to the host was refused."""
    bodies: list[_StuckBody] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        bodies.append(_StuckBody())
        return httpx.Response(503, headers={"content-length": "10"}, stream=bodies[-1])

    bulkhead = Bulkhead(1, clock=fake_clock)
    t = ResilientTransport(
        httpx.MockTransport(upstream), bulkhead=bulkhead, attempts=3, clock=fake_clock
    )
    async with httpx.AsyncClient(transport=t) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(client.get, A)
            await anyio.wait_all_tasks_blocked()  # stuck in the read
            group.cancel_scope.cancel()
    assert bodies[0].closed
    assert bulkhead.statistics(key="a.test").in_flight == 0
    # The retry it was reading for was never sent: not counted, not paid for.
    assert t.statistics().retries == 0
    assert t.budget.statistics().retries == 0


def test_a_sync_request_interrupted_while_its_503_is_read_gives_its_slot_back(
    fake_clock: FakeClock,
) -> None:
    """The same for the sync client and a KeyboardInterrupt during the read."""
    bodies: list[_StuckBody] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        bodies.append(_StuckBody(KeyboardInterrupt()))
        return httpx.Response(503, headers={"content-length": "10"}, stream=bodies[-1])

    bulkhead = Bulkhead(1, clock=fake_clock)
    t = ResilientTransport(
        httpx.MockTransport(upstream), bulkhead=bulkhead, attempts=3, clock=fake_clock
    )
    with httpx.Client(transport=t) as client, pytest.raises(KeyboardInterrupt):
        client.get(A)
    assert bodies[0].closed
    assert bulkhead.statistics(key="a.test").in_flight == 0


# -- garbage ----------------------------------------------------------------------------


class Unreachable(httpx.ConnectError):
    """A connection failure that can be weakly referenced (to see when it is freed)."""


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise Unreachable("down", request=request)


def test_giving_up_leaves_no_reference_cycles(fake_clock: FakeClock) -> None:
    """The exception re-raised after the last attempt is freed by reference counting
    alone (no exception <-> frame cycle): under thousands of failed requests a second
    such cycles made the cycle collector pause a service for hundreds of milliseconds."""
    import gc
    import weakref

    t = ResilientTransport(
        httpx.MockTransport(_unreachable), attempts=3, backoff=NO_BACKOFF, clock=fake_clock
    )
    request = httpx.Request("GET", "http://a.test/")
    gc.disable()
    try:
        try:
            t.handle_request(request)
        except Unreachable as exc:
            ref = weakref.ref(exc)
        assert ref() is None
    finally:
        gc.enable()


def test_giving_up_leaves_no_reference_cycles_async() -> None:
    """The same for the async transport."""
    import asyncio
    import gc
    import weakref

    async def unreachable(request: httpx.Request) -> httpx.Response:
        raise Unreachable("down", request=request)

    t = ResilientTransport(httpx.MockTransport(unreachable), attempts=3, backoff=NO_BACKOFF)

    async def freed() -> bool:
        gc.disable()
        try:
            try:
                await t.handle_async_request(httpx.Request("GET", "http://a.test/"))
            except Unreachable as exc:
                ref = weakref.ref(exc)
            return ref() is None
        finally:
            gc.enable()

    assert asyncio.run(freed())


def test_a_retry_refused_before_sending_returns_the_answer_in_hand(
    send: Send, fake_clock: FakeClock
) -> None:
    """The first attempt's 503 is read before its retry; when the host's limiter refuses
    the retry, the caller gets that 503, not a RateLimited for a call that was made,
    and the run ends as exhausted ("rejected")."""
    upstream = Upstream(fake_clock, always(503, {"content-length": "8"}))
    t = transport(upstream, limiter=rs.RateLimiter("1/minute", clock=fake_clock))
    events: list[rs.Event] = []
    t.add_listener(events.append)
    response = send(t, "GET", A)
    assert (response.status_code, response.content) == (503, b"answer 0")
    assert len(upstream.calls) == 1
    assert upstream.leaked() == []
    exhausted = [e for e in events if isinstance(e, rs.RetriesExhausted)]
    assert [e.reason for e in exhausted] == ["rejected"]
    assert t.statistics().exhausted == 1
    # The refused retry was never sent: not counted (the server saw one request) and
    # not paid for (its budget unit was spent for other hosts too).
    assert t.statistics().retries == 0
    assert t.budget.statistics().retries == 0


def test_a_retry_the_breaker_refuses_returns_the_answer_that_opened_it(
    send: Send, fake_clock: FakeClock
) -> None:
    """A 503 that opens the host's breaker: its retry is refused (CircuitOpen) before it
    is sent, and the caller gets the 503."""
    upstream = Upstream(fake_clock, always(503, {"content-length": "8"}))
    breaker = CircuitBreaker(
        key=host_key, failure_rate=None, consecutive_failures=1, clock=fake_clock
    )
    response = send(transport(upstream, breaker=breaker), "GET", A)
    assert response.status_code == 503
    assert len(upstream.calls) == 1


def test_a_retry_refused_after_an_exception_raises_that_exception(
    send: Send, fake_clock: FakeClock
) -> None:
    """When the answer in hand is an exception, the caller gets it back unchanged."""
    upstream = Upstream(fake_clock, always(200))
    failing = first(httpx.ConnectError("refused"))
    upstream.script = failing
    t = transport(upstream, limiter=rs.RateLimiter("1/minute", clock=fake_clock))
    with pytest.raises(httpx.ConnectError):
        send(t, "GET", A)
    assert len(upstream.calls) == 1


def test_a_request_sent_inside_a_deadline_is_left_as_it_was(fake_clock: FakeClock) -> None:
    """The transport sends a copy with clamped timeouts and the deadline header: the
    caller's request kept them for good, so sending it again later (no deadline) still
    timed out at the old deadline and told the server so."""
    upstream = Upstream(fake_clock, always(200))
    t = transport(upstream, deadline_header="Request-Timeout")
    with httpx.Client(transport=t, timeout=5) as client:
        request = client.build_request("GET", A)
        before = dict(request.extensions["timeout"])
        with rs.deadline(1.0, clock=fake_clock):
            client.send(request)
        assert request.extensions["timeout"] == before
        assert "request-timeout" not in request.headers
        client.send(request)
    first_call, second_call = upstream.calls
    assert first_call.timeout["read"] == pytest.approx(1.0)
    assert first_call.headers["request-timeout"] == "1.000"
    assert second_call.timeout["read"] == 5
    assert "request-timeout" not in second_call.headers


@pytest.mark.parametrize("status", [500, 501])
def test_a_retry_that_ends_in_a_server_error_is_not_counted_recovered(
    send: Send, fake_clock: FakeClock, status: int
) -> None:
    """recovered counts requests that succeeded after a retry: a 503 then a 500 did not."""
    upstream = Upstream(fake_clock, first(503, (status, {})))
    t = transport(upstream)
    assert send(t, "GET", A).status_code == status
    assert t.statistics().recovered == 0


def test_an_inner_transport_can_read_the_body_inside_a_deadline() -> None:
    """The attempt's copy of a read request is read too: an inner transport reading
    request.content got RequestNotRead inside a deadline."""

    class Echo(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, content=request.content)

    with httpx.Client(transport=ResilientTransport(Echo())) as client:
        with rs.deadline(5.0):
            response = client.post("http://api.test/echo", json={"a": 1})
    assert response.json() == {"a": 1}


def test_the_last_error_chains_the_attempts_in_order(fake_clock: FakeClock) -> None:
    """Each attempt's error has the one before as its context, as rs.Retry's do (the
    third pointed at the first: every attempt after the first resumed inside the first
    one's except block)."""
    count = iter(range(1, 10))

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"attempt {next(count)}", request=request)

    transport = ResilientTransport(
        httpx.MockTransport(refuse), attempts=3, backoff=NO_BACKOFF, clock=fake_clock
    )
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.ConnectError) as info:
        client.get(A)
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__context__
    assert chain == ["attempt 3", "attempt 2", "attempt 1"]


_REFUSED: list[Any] = []


class _Refused(httpx.ConnectError):
    """A connection error that can be watched for being freed (a weak reference to each
    is kept in ``_REFUSED``; none is kept in a local of the raising frame, which its
    traceback references)."""

    def __init__(self, message: str, *, request: httpx.Request) -> None:
        super().__init__(message, request=request)
        _REFUSED.append(weakref.ref(self))


@pytest.mark.parametrize("case", ["retries", "refused retry", "hedged async"])
def test_errors_of_a_retried_request_are_freed_without_the_collector(case: str) -> None:
    """After the call, every attempt's error is freed by reference counting: the resume
    loop, a refused retry and an async hedged round kept theirs in exception <-> frame
    cycles, for the garbage collector's next full pass."""
    import asyncio
    import gc

    refs = _REFUSED
    refs.clear()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise _Refused("refused", request=request)

    options: dict[str, Any] = {"attempts": 3, "backoff": NO_BACKOFF}
    if case == "refused retry":
        options["limiter"] = "1/minute"
    if case == "hedged async":
        options["hedge"] = 5.0
    transport = ResilientTransport(httpx.MockTransport(refuse), **options)
    request = httpx.Request("GET", A)

    async def send_async() -> bool:
        try:  # caught in the task: a task that ends in an error keeps it
            await transport.handle_async_request(request)
        except _Refused:
            return True
        return False

    def send() -> bool:
        if case == "hedged async":
            return asyncio.run(send_async())
        try:  # not pytest.raises: its ExceptionInfo would keep the error (and a cycle)
            transport.handle_request(request)
        except _Refused:
            return True
        return False

    gc.disable()
    try:
        assert send()
        assert refs
        assert [ref for ref in refs if ref() is not None] == []
    finally:
        gc.enable()


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised inside a listener."""


def test_a_retry_a_listener_interrupted_as_it_was_scheduled_is_not_paid_for() -> None:
    """A listener raising a BaseException on RetryScheduled ends the request before
    the retry is sent: neither counted nor paid for, as a retry cancelled in its
    backoff."""
    clock = FakeClock()
    budget = rs.RetryBudget(ratio=0.0, min_per_second=1.0, window=10.0, clock=clock)
    sent: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(503)

    t = ResilientTransport(httpx.MockTransport(upstream), attempts=3, budget=budget, clock=clock)

    def interrupt(event: rs.Event) -> None:
        if isinstance(event, rs.RetryScheduled):
            raise _Interrupt

    t.add_listener(interrupt)
    with httpx.Client(transport=t) as client, pytest.raises(_Interrupt):
        client.get(A)
    assert len(sent) == 1
    assert budget.statistics().retries == 0
    assert t.statistics().retries == 0
