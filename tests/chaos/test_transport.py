"""chaos.FaultyTransport: outbound HTTP faults per host, for httpx sync and async clients."""

from __future__ import annotations

import gzip
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import resilience as rs
from resilience import chaos
from resilience.chaos import FaultyTransport
from resilience.testing import FakeClock

BODY = b"x" * 1000


def handler(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=BODY)


def mock() -> httpx.MockTransport:
    return httpx.MockTransport(handler)


def test_disabled_transport_passes_requests_through() -> None:
    """Off by default: a 100% status fault does nothing without the switch."""
    transport = FaultyTransport(mock(), faults=chaos.Status(503), seed=1)
    with httpx.Client(transport=transport) as client:
        assert client.get("http://a.test/").status_code == 200
    assert transport.statistics().calls == 0


def test_status_with_retry_after_per_host() -> None:
    """hosts= targets one host: it answers 503 + Retry-After, the other host is untouched."""
    transport = FaultyTransport(
        mock(), hosts={"flaky.test": [chaos.Status(503, retry_after=1.5)]}, seed=1
    )
    with httpx.Client(transport=transport) as client, chaos.enabled():
        flaky = client.get("http://flaky.test/x")
        good = client.get("http://good.test/x")
    assert flaky.status_code == 503
    assert flaky.headers["retry-after"] == "2"
    assert good.status_code == 200
    assert good.content == BODY


def test_host_globs_match_subdomains() -> None:
    """A glob pattern such as *.cdn.test matches every subdomain."""
    transport = FaultyTransport(mock(), hosts={"*.cdn.test": chaos.Status(429)}, enabled=True)
    with httpx.Client(transport=transport) as client:
        assert client.get("http://img.cdn.test/").status_code == 429
        assert client.get("http://cdn.test.example/").status_code == 200


def test_a_host_with_a_port_targets_that_port_only() -> None:
    """``"127.0.0.1:8001"`` targets that host and port (it used to match nothing: only
    the host was compared); a name without a port covers every port."""
    transport = FaultyTransport(
        mock(),
        hosts={"127.0.0.1:8001": chaos.Status(503), "api.test": chaos.Status(429)},
        enabled=True,
    )
    with httpx.Client(transport=transport) as client:
        assert client.get("http://127.0.0.1:8001/").status_code == 503
        assert client.get("http://127.0.0.1:8002/").status_code == 200
        assert client.get("http://api.test:9000/").status_code == 429


def test_a_sync_hang_ends_at_the_request_read_timeout() -> None:
    """A hung server answers nothing: a sync client's read timeout (2 s here) ends the
    wait before the fault's ``block`` (10 s), as a real socket would (it used to block
    the full 10 s whatever the request's timeout)."""
    clock = FakeClock()
    transport = FaultyTransport(mock(), faults=[chaos.Hang()], enabled=True, clock=clock)
    with httpx.Client(transport=transport, timeout=2.0) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.get("http://a.test/")
    assert clock.monotonic() == 2.0


def test_connect_failure_raises_connect_error() -> None:
    """ConnectFailure raises httpx.ConnectError carrying the request."""
    transport = FaultyTransport(mock(), faults=[chaos.ConnectFailure()], enabled=True)
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.ConnectError) as info:
        client.get("http://a.test/")
    assert info.value.request.url.host == "a.test"


def test_timeout_waits_the_request_timeout_on_the_clock() -> None:
    """RequestTimeout waits the request's own read timeout, then raises ReadTimeout."""
    clock = FakeClock()
    transport = FaultyTransport(mock(), faults=[chaos.RequestTimeout()], enabled=True, clock=clock)
    with httpx.Client(transport=transport, timeout=3.0) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.get("http://a.test/")
        with pytest.raises(httpx.ReadTimeout):
            client.get("http://a.test/", timeout=httpx.Timeout(1.0, read=0.5))
    assert clock.sleeps == [3.0, 0.5]


@pytest.mark.parametrize(
    ("phase", "error"),
    [("connect", httpx.ConnectTimeout), ("write", httpx.WriteTimeout), ("pool", httpx.PoolTimeout)],
)
def test_timeout_phases(phase: str, error: type[Exception]) -> None:
    """Each phase raises its own httpx timeout."""
    transport = FaultyTransport(
        mock(), faults=chaos.RequestTimeout(phase=phase, wait=0), enabled=True
    )
    with httpx.Client(transport=transport) as client, pytest.raises(error):
        client.get("http://a.test/")


def test_truncated_body_breaks_mid_read() -> None:
    """Truncate keeps a fraction of the body, then the read fails like a dropped connection."""
    transport = FaultyTransport(mock(), faults=chaos.Truncate(keep=0.25), enabled=True)
    with httpx.Client(transport=transport) as client:
        with client.stream("GET", "http://a.test/") as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            received = next(chunks)
            with pytest.raises(httpx.RemoteProtocolError, match="injected"):
                next(chunks)
    assert received == BODY[:250]


def test_latency_and_rates_on_the_fake_clock() -> None:
    """Latency sleeps on the clock; rates follow the seeded RNG."""
    clock = FakeClock()
    transport = FaultyTransport(
        mock(), faults=[chaos.Latency(0.2, rate=0.5)], seed=3, enabled=True, clock=clock
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(200):
            assert client.get("http://a.test/").status_code == 200
    assert clock.sleeps == [0.2] * transport.statistics().injected["latency"]
    assert 70 < len(clock.sleeps) < 130


def test_same_seed_same_statuses() -> None:
    """A seed replays the same faulty responses."""

    def run(seed: int) -> list[int]:
        transport = FaultyTransport(
            mock(), faults=[chaos.Status(503, rate=0.3)], seed=seed, enabled=True
        )
        with httpx.Client(transport=transport) as client:
            return [client.get("http://a.test/").status_code for _ in range(100)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sync_hang_blocks_then_times_out() -> None:
    """A sync hang blocks `block` seconds on the clock, then raises ReadTimeout."""
    clock = FakeClock()
    transport = FaultyTransport(mock(), faults=chaos.Hang(block=4.0), enabled=True, clock=clock)
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.ReadTimeout):
        client.get("http://a.test/")
    assert clock.monotonic() == 4.0


def test_result_fault_returns_a_canned_response() -> None:
    """A Result fault answers with the given httpx.Response."""
    canned = httpx.Response(200, json={"cached": True})
    transport = FaultyTransport(mock(), faults=chaos.Result(canned), enabled=True)
    with httpx.Client(transport=transport) as client:
        assert client.get("http://a.test/").json() == {"cached": True}


def test_result_response_is_a_template_each_request_gets_its_own() -> None:
    """Every request answered by a Result gets its own response, bound to it.

    The transport used to hand the very same httpx.Response to every request: the first
    response's ``.request`` became the second request, and httpx wrapped the shared
    ``.stream`` once more on each send (a nesting 1000 deep after 1000 requests).
    """
    canned = httpx.Response(418, headers={"x-canned": "1"}, content=b"teapot")
    template_stream = canned.stream
    transport = FaultyTransport(mock(), faults=chaos.Result(canned), enabled=True)
    with httpx.Client(transport=transport) as client:
        first = client.get("http://a.test/first")
        second = client.get("http://a.test/second")
        for _ in range(50):
            client.get("http://a.test/again")
    assert first is not second
    assert first.request.url == "http://a.test/first"
    assert second.request.url == "http://a.test/second"
    for response in (first, second):
        assert (response.status_code, response.content) == (418, b"teapot")
        assert response.headers["x-canned"] == "1"
    assert canned.stream is template_stream  # the template itself is never sent


def test_result_streamed_template_is_read_up_front() -> None:
    """A template whose body is a sync iterator is read once, at construction; every
    request gets the whole body. An async-only body, which cannot be read there, is
    refused at construction instead of failing (or being shared) later."""
    streamed = httpx.Response(200, content=iter([b"hel", b"lo"]))
    transport = FaultyTransport(mock(), faults=chaos.Result(streamed), enabled=True)
    with httpx.Client(transport=transport) as client:
        responses = [client.get(f"http://a.test/{i}") for i in range(3)]
    assert [r.content for r in responses] == [b"hello"] * 3
    assert [r.headers["content-length"] for r in responses] == ["5"] * 3
    assert len({id(r) for r in responses}) == 3

    async def chunks() -> AsyncIterator[bytes]:
        yield b"never read"

    with pytest.raises(rs.ConfigurationError, match="async-only stream"):
        FaultyTransport(mock(), faults=chaos.Result(httpx.Response(200, content=chunks())))


def test_result_template_keeps_its_encoded_body() -> None:
    """A template built from encoded bytes is sent as a server would send it: the same
    Content-Encoding and raw bytes, decoded by httpx for each request, streamable raw."""
    raw = gzip.compress(b"zipped body")
    canned = httpx.Response(200, headers={"content-encoding": "gzip"}, content=raw)
    transport = FaultyTransport(mock(), faults=chaos.Result(canned), enabled=True)
    with httpx.Client(transport=transport) as client:
        assert client.get("http://a.test/").content == b"zipped body"
        with client.stream("GET", "http://a.test/") as response:
            assert b"".join(response.iter_raw()) == raw


def test_predicate_receives_the_request() -> None:
    """when= sees the httpx.Request: fault only POSTs."""
    transport = FaultyTransport(
        mock(), faults=chaos.Status(500, when=lambda r: r.method == "POST"), enabled=True
    )
    with httpx.Client(transport=transport) as client:
        assert client.get("http://a.test/").status_code == 200
        assert client.post("http://a.test/").status_code == 500


def test_events_name_the_host() -> None:
    """FaultInjected events carry the request's host as key."""
    events: list[rs.Event] = []
    transport = FaultyTransport(mock(), faults=chaos.Status(503), enabled=True, name="out")
    transport.add_listener(events.append)
    with httpx.Client(transport=transport) as client:
        client.get("http://a.test/")
    assert [(e.policy, e.key, getattr(e, "kind", None)) for e in events] == [
        ("out", "a.test", "status")
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs faults= or hosts="),
        ({"faults": [object()]}, "must contain chaos faults"),
        ({"faults": chaos.Result("x")}, "must return an httpx.Response"),
        ({"hosts": {"": chaos.Status()}}, "hosts keys must be host names"),
        ({"hosts": {"https://a.test": chaos.Status()}}, "no scheme"),  # never matched
        ({"hosts": [("a.test", chaos.Status())]}, "must map"),
        ({"faults": None}, "faults must be a fault or a list"),
        ({"faults": "status"}, "faults must be a fault or a list"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    """Bad arguments fail at construction."""
    with pytest.raises(rs.ConfigurationError, match=message):
        FaultyTransport(mock(), **kwargs)  # type: ignore[arg-type]


def test_retry_honours_injected_retry_after() -> None:
    """Composed with Retry: a 503 + Retry-After is retried after the hinted delay."""
    clock = FakeClock()
    transport = FaultyTransport(
        mock(),
        faults=chaos.Status(503, retry_after=2, schedule=[(0, 1)]),
        enabled=True,
        clock=clock,
    )

    class Unavailable(Exception):
        def __init__(self, retry_after: float) -> None:
            self.retry_after = retry_after

    def fetch(client: httpx.Client) -> int:
        response = client.get("http://a.test/")
        if response.status_code == 503:
            raise Unavailable(float(response.headers["retry-after"]))
        return response.status_code

    retry = rs.Retry(on=Unavailable, attempts=3, backoff=rs.backoff.constant(0.1), clock=clock)
    with httpx.Client(transport=transport) as client:
        assert retry.call(fetch, client) == 200
    assert clock.sleeps == [2.0]


# -- async -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_client_faults() -> None:
    """The same transport serves httpx.AsyncClient: status, truncation, connect errors."""
    transport = FaultyTransport(
        mock(),
        hosts={
            "status.test": chaos.Status(429, retry_after=1),
            "cut.test": chaos.Truncate(keep=0.5),
            "down.test": chaos.ConnectFailure(),
        },
        enabled=True,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get("http://status.test/")).status_code == 429
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("http://cut.test/")
        with pytest.raises(httpx.ConnectError):
            await client.get("http://down.test/")
        assert (await client.get("http://fine.test/")).content == BODY


@pytest.mark.anyio
async def test_async_result_gives_each_request_its_own_response() -> None:
    """With httpx.AsyncClient too, a Result answers each request with a new response
    bound to it (it used to be one shared object, re-bound to the latest request)."""
    canned = httpx.Response(200, json={"cached": True})
    transport = FaultyTransport(mock(), faults=chaos.Result(canned), enabled=True)
    async with httpx.AsyncClient(transport=transport) as client:
        first = await client.get("http://a.test/first")
        second = await client.get("http://a.test/second")
    assert first is not second
    assert str(first.request.url) == "http://a.test/first"
    assert first.json() == second.json() == {"cached": True}


@pytest.mark.anyio
async def test_async_hang_is_cut_by_a_timeout() -> None:
    """An async hang waits until cancelled: an outer rs.Timeout ends it."""
    clock = FakeClock()
    transport = FaultyTransport(mock(), faults=chaos.Hang(), enabled=True, clock=clock)
    timeout = rs.Timeout(1.5, clock=clock)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(rs.Timeout):
            await timeout.call_async(client.get, "http://a.test/")
    assert clock.monotonic() == pytest.approx(1.5)


@pytest.mark.anyio
async def test_async_latency_and_timeout_use_the_clock() -> None:
    """Async latency and timeouts sleep on the injected clock."""
    clock = FakeClock()
    transport = FaultyTransport(
        mock(),
        faults=[chaos.Latency(0.3), chaos.RequestTimeout(wait=2.0)],
        enabled=True,
        clock=clock,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get("http://a.test/")
    assert clock.sleeps == [0.3, 2.0]


def test_sync_only_inner_refuses_async_use() -> None:
    """A sync inner transport cannot serve an AsyncClient; the error says so."""
    transport = FaultyTransport(httpx.HTTPTransport(), faults=chaos.Status(), enabled=True)
    with pytest.raises(TypeError, match="sync-only"):
        transport._async()
    transport.close()


# -- against a real local server (default inner transports) ----------------------------------


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_default_inner_sync_truncates_a_real_response(http_server: str) -> None:
    """With no inner transport, real requests go through httpx.HTTPTransport."""
    transport = FaultyTransport(faults=chaos.Truncate(keep=0.1, rate=0.5), seed=2, enabled=True)
    outcomes = set()
    with httpx.Client(transport=transport, timeout=5) as client:
        for _ in range(10):
            try:
                outcomes.add(len(client.get(http_server).content))
            except httpx.RemoteProtocolError:
                outcomes.add("cut")
    assert outcomes == {len(BODY), "cut"}


@pytest.mark.anyio
async def test_default_inner_async_real_server(http_server: str) -> None:
    """With no inner transport, async requests go through httpx.AsyncHTTPTransport."""
    transport = FaultyTransport(hosts={"other.test": chaos.Status()}, enabled=True)
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        response = await client.get(http_server)
    assert response.content == BODY
