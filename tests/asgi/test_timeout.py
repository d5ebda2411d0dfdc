"""TimeoutMiddleware: 504 before start, clean end mid-stream, ambient deadline, rules."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio
import httpx
import pytest

import resilience as rs
from resilience.asgi import Rule, TimeoutMiddleware
from resilience.errors import ConfigurationError
from resilience.testing import FakeClock

from ._support import Result, call, http_scope, ok_app, receive_nothing, serve

pytestmark = pytest.mark.anyio


async def run_until_started(
    middleware: Any, started: anyio.Event, clock: FakeClock, advance: float, path: str = "/"
) -> Result:
    """Start a request, wait until the app runs, move virtual time, return the result."""
    results: list[Result] = []

    async def request() -> None:
        results.append(await call(middleware, http_scope(path)))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await started.wait()
            clock.advance(advance)
    return results[0]


async def sent_past_the_deadline(
    middleware: Any, scope: Any, receive: Any, ready: anyio.Event, clock: FakeClock
) -> Result:
    """Run a request until ``ready``, move virtual time past its deadline, and return
    what the middleware sent."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    assert middleware.seconds is not None
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(middleware, scope, receive, send)
            await ready.wait()
            clock.advance(middleware.seconds)
    return Result(sent)


async def test_504_before_the_response_starts() -> None:
    """An app that has not answered when time runs out is cancelled; the client gets 504."""
    clock = FakeClock()
    started = anyio.Event()
    cancelled = []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    middleware = TimeoutMiddleware(slow, seconds=5, clock=clock)
    result = await run_until_started(middleware, started, clock, 5)
    assert result.status == 504
    assert result.header("content-type") == "application/problem+json"
    assert b'"status":504' in result.body
    assert result.complete
    assert cancelled == [True]


async def test_a_sync_endpoint_gets_its_504_at_the_deadline(anyio_backend: str) -> None:
    """A sync endpoint (FastAPI's ``def``) runs in a worker thread that no cancellation
    can stop: the client used to wait for the thread, then got a 504 anyway. On asyncio
    the 504 now goes out at the deadline; the request ends when the thread does, and its
    late answer is dropped (the client already has its response). On trio the 504 still
    waits for the app to end."""
    clock = FakeClock()
    started = anyio.Event()
    release = threading.Event()
    sent: list[dict[str, Any]] = []
    answered = anyio.Event()

    async def blocking(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        with anyio.CancelScope(shield=True):  # as Starlette's run_in_threadpool waits
            await anyio.to_thread.run_sync(release.wait, 10)  # bounded, should this fail
        await ok_app(scope, receive, send)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    middleware = TimeoutMiddleware(blocking, seconds=5, clock=clock)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(middleware, http_scope("/"), receive_nothing, send)
            await started.wait()
            clock.advance(5)
            if anyio_backend == "asyncio":
                await answered.wait()  # while the thread is still blocked
                assert not release.is_set()
            release.set()
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [504]
    assert Result(sent).complete


async def test_an_app_that_fails_after_its_cut_is_answered_504_and_its_error_logged(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut app whose cleanup raises: its time ran out all the same, so the client
    gets the 504 (sent at the deadline on asyncio, when the app ends on trio) and the
    error is logged, not raised: a server closes the connection of a request that raises
    after a complete response, and with it the next request already read from it."""
    clock = FakeClock()
    started = anyio.Event()
    sent: list[dict[str, Any]] = []
    events: list[Any] = []

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            raise RuntimeError("cleanup failed") from None

    async def send(message: dict[str, Any]) -> None:
        await anyio.sleep(0)
        sent.append(message)

    middleware = TimeoutMiddleware(failing, seconds=5, clock=clock)
    middleware.add_listener(events.append)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(middleware, http_scope("/"), receive_nothing, send)
            await started.wait()
            clock.advance(5)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [504]
    assert Result(sent).complete
    assert [type(event).__name__ for event in events] == ["TimedOut"]
    [record] = [r for r in caplog.records if r.name == "resilience"]
    assert "failed after its deadline" in record.getMessage()
    assert record.exc_info is not None
    assert "cleanup failed" in str(record.exc_info[1])


class ClockWithoutTimers:
    """Time that moves by hand and arms nothing: the middleware cuts by an event loop
    timer, which has not fired when the app reads the clock past its deadline."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.now += seconds
        await anyio.sleep(0)


async def test_an_error_page_for_an_inner_timeout_at_the_deadline_is_a_504(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An inner rs.Timeout clamped to the request's deadline fires a moment before the
    middleware's own timer; the app's error middleware answers 500 for it. Past the
    deadline by the clock, the answer is the 504 (a burst under uvicorn got 11 of 480
    requests 500s), and the inner timeout, this deadline's echo, is not logged."""
    clock = ClockWithoutTimers()

    async def error_page(scope: Any, receive: Any, send: Any) -> None:
        clock.now = 10.0  # past the deadline: the inner Timeout raised, caught as a 500
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def raising(scope: Any, receive: Any, send: Any) -> None:
        clock.now = 10.0
        raise rs.Timeout(1.0)  # no error middleware: the inner Timeout itself

    for app in (error_page, raising):
        clock.now = 0.0
        result = await call(TimeoutMiddleware(app, seconds=1, clock=clock), http_scope("/"))
        assert result.status == 504, app
        assert result.complete
    assert [r for r in caplog.records if r.name == "resilience"] == []

    async def almost(scope: Any, receive: Any, send: Any) -> None:
        clock.now = 0.99  # 10 ms left: uvloop's timers may fire an inner timeout sooner
        await error_page_now(send)

    async def error_page_now(send: Any) -> None:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def in_time(scope: Any, receive: Any, send: Any) -> None:
        clock.now = 0.99  # an answer that is no error, at the same moment: it stands
        await ok_app(scope, receive, send)

    async def early(scope: Any, receive: Any, send: Any) -> None:
        clock.now = 0.5  # an error page well before the deadline: the app's own
        await error_page_now(send)

    statuses = []
    for app in (almost, in_time, early):
        clock.now = 0.0
        middleware = TimeoutMiddleware(app, seconds=1, clock=clock)
        statuses.append((await call(middleware, http_scope("/"))).status)
    assert statuses == [504, 200, 500]


async def test_an_app_that_fails_before_its_deadline_raises_as_before() -> None:
    """Only a failure after the cut is answered 504: an app that fails in time raises
    to the server untouched."""

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("broken")

    with pytest.raises(RuntimeError, match="broken"):
        await call(TimeoutMiddleware(failing, seconds=5, clock=FakeClock()), http_scope("/"))


async def test_a_file_sent_whole_completes_the_response() -> None:
    """A response ended by ``http.response.pathsend`` (Starlette's FileResponse on a
    server with that extension) is complete: the deadline is lifted for the work after
    it, which is not cut, and nothing is reported as timed out."""
    clock = FakeClock()
    seen: list[float | None] = []
    events: list[Any] = []

    async def file_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.pathsend", "path": "/etc/hostname"})
        clock.advance(10)  # a background task running past the request's 1 s
        await anyio.lowlevel.checkpoint()
        seen.append(rs.time_remaining())

    middleware = TimeoutMiddleware(file_app, seconds=1, clock=clock)
    middleware.add_listener(events.append)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(http_scope("/"), receive_nothing, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.pathsend"]
    assert seen == [None]
    assert events == []


@pytest.mark.parametrize("body_arrives", [False, True])
async def test_a_body_that_does_not_arrive_in_time_is_the_client_s_408(
    body_arrives: bool,
) -> None:
    """Time runs out while the app waits for a request body the client is slow to send:
    the client is the slow party, so 408 (with ``Connection: close``: its unread body
    must not be taken for the next request), not a 504 that counts against the server.
    Once the body is in, an app that overruns gets its 504."""
    clock = FakeClock()
    waiting = anyio.Event()
    chunks = [
        {"type": "http.request", "body": b"part", "more_body": not body_arrives},
    ]

    async def receive() -> dict[str, Any]:
        if chunks:
            return chunks.pop(0)
        waiting.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def reader(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        while message.get("more_body"):
            message = await receive()
        waiting.set()
        await anyio.sleep_forever()  # working on the request: the server's time

    middleware = TimeoutMiddleware(reader, seconds=5, clock=clock)
    scope = http_scope("/upload", method="POST")
    result = await sent_past_the_deadline(middleware, scope, receive, waiting, clock)
    assert result.complete
    if body_arrives:
        assert result.status == 504
        assert result.header("connection") is None
    else:
        assert result.status == 408
        assert result.header("connection") == "close"
        assert b"did not arrive in time" in result.body


async def test_a_receive_the_app_cancels_itself_is_no_slow_client() -> None:
    """An app that polls for a disconnect in a scope it cancels at once (Starlette's
    ``request.is_disconnected()``), then overruns, gets its 504: that cancellation is
    the app's, not a body still on its way (it read as one: a 408 that closed the
    connection, when the server's receive checkpoints)."""
    clock = FakeClock()
    polled = anyio.Event()

    async def receive() -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()  # a server whose receive always yields
        return {"type": "http.request", "body": b"", "more_body": False}

    async def polling(scope: Any, receive: Any, send: Any) -> None:
        with anyio.CancelScope() as poll:
            poll.cancel()
            await receive()
        polled.set()
        await anyio.sleep_forever()

    middleware = TimeoutMiddleware(polling, seconds=5, clock=clock)
    result = await sent_past_the_deadline(middleware, http_scope("/poll"), receive, polled, clock)
    assert result.status == 504


async def test_no_timeout_before_the_deadline() -> None:
    """Advancing less than ``seconds`` leaves the request alone."""
    clock = FakeClock()
    started = anyio.Event()
    release = anyio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        await release.wait()
        await ok_app(scope, receive, send)

    middleware = TimeoutMiddleware(app, seconds=5, clock=clock)
    results: list[Result] = []

    async def request() -> None:
        results.append(await call(middleware, http_scope()))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await started.wait()
            clock.advance(4.9)
            release.set()
    assert results[0].status == 200


async def test_mid_stream_timeout_cancels_the_app_and_ends_the_response() -> None:
    """Streaming started: the app and its helper task are cancelled; the body is ended."""
    clock = FakeClock()
    started = anyio.Event()
    finished: list[str] = []

    async def producer() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            finished.append("producer")

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(producer)
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send(
                    {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
                )
                started.set()
                await anyio.sleep_forever()
        finally:
            finished.append("app")

    middleware = TimeoutMiddleware(streaming, seconds=3, clock=clock)
    result = await run_until_started(middleware, started, clock, 3)
    assert result.status == 200
    assert result.body == b"data: 1\n\n"
    assert result.complete, "the response must be ended with more_body=False"
    assert sorted(finished) == ["app", "producer"]


async def test_an_app_that_swallows_the_cut_still_gets_its_504() -> None:
    """An app that catches the cancellation and returns without answering: the client
    gets the 504 and TimedOut is reported (the server used to answer 500, "returned
    without starting response", and nothing was reported)."""
    clock = FakeClock()
    started = anyio.Event()

    async def swallows(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return

    middleware = TimeoutMiddleware(swallows, seconds=2, clock=clock)
    events: list[rs.Event] = []
    middleware.add_listener(events.append)
    result = await run_until_started(middleware, started, clock, 2)
    assert result.status == 504
    assert result.complete
    assert [type(e).__name__ for e in events] == ["TimedOut"]


async def test_a_cut_body_with_a_declared_length_is_left_for_the_server_to_close() -> None:
    """A stream that declared Content-Length cannot end cleanly when cut: no closing
    empty body (h11 raised "Too little data for declared Content-Length" out of the
    middleware); the middleware returns and the server closes the connection."""
    clock = FakeClock()
    started = anyio.Event()

    async def sized(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"Content-Length", b"100")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"x" * 10, "more_body": True})
        started.set()
        await anyio.sleep_forever()

    middleware = TimeoutMiddleware(sized, seconds=2, clock=clock)
    result = await run_until_started(middleware, started, clock, 2)
    assert result.body == b"x" * 10
    assert not result.complete


async def test_the_end_of_a_cut_stream_to_a_client_that_stopped_reading_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that stopped reading blocks the server's send: the clean end of a cut
    stream gives up after a grace period, so the request (and any slot held outside
    it) ends instead of lasting until the client leaves."""
    import resilience.asgi._timeout as timeout_module

    monkeypatch.setattr(timeout_module, "_END_GRACE", 0.05)
    clock = FakeClock()
    started = anyio.Event()
    sent: list[dict[str, Any]] = []

    async def blocked_send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) > 2:  # the closing message: the socket buffer is full
            await anyio.sleep_forever()

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1", "more_body": True})
        started.set()
        await anyio.sleep_forever()

    middleware = TimeoutMiddleware(streaming, seconds=2, clock=clock)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(middleware, http_scope(), receive_nothing, blocked_send)
            await started.wait()
            clock.advance(2)
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_deadline_is_lifted_once_the_response_is_complete() -> None:
    """Work after the response (background tasks) is not cut by the timeout."""
    clock = FakeClock()
    started = anyio.Event()
    proceed = anyio.Event()
    after: list[str] = []

    async def with_background(scope: Any, receive: Any, send: Any) -> None:
        await ok_app(scope, receive, send)
        started.set()
        await proceed.wait()
        after.append("background done")

    middleware = TimeoutMiddleware(with_background, seconds=1, clock=clock)
    results: list[Result] = []

    async def request() -> None:
        results.append(await call(middleware, http_scope()))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await started.wait()
            clock.advance(10)
            await anyio.lowlevel.checkpoint()
            proceed.set()
    assert results[0].status == 200
    assert after == ["background done"]


async def test_work_after_the_response_sees_no_deadline() -> None:
    """After the last body chunk, ``rs.time_remaining()`` is None again, so a
    background task's own ``rs.Timeout`` is not cut by the spent request deadline."""
    clock = FakeClock()
    seen: list[float | None] = []

    async def with_background(scope: Any, receive: Any, send: Any) -> None:
        seen.append(rs.time_remaining())
        await ok_app(scope, receive, send)
        clock.advance(5)  # the background task runs past the request's 1 s
        seen.append(rs.time_remaining())
        seen.append(await rs.Timeout(1, clock=clock).call_async(anyio.sleep, 0))

    middleware = TimeoutMiddleware(with_background, seconds=1, clock=clock)
    result = await call(middleware, http_scope())
    assert result.status == 200
    assert seen == [1.0, None, None]


async def test_deadline_is_lifted_for_the_request_task_when_a_child_task_ends_it() -> None:
    """A streaming response whose last chunk is sent from a child task (Starlette's
    StreamingResponse does so) lifts the deadline for the request's own task too."""
    clock = FakeClock()
    seen: list[float | None] = []

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        async def stream() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done", "more_body": False})

        async with anyio.create_task_group() as tg:
            tg.start_soon(stream)
        seen.append(rs.time_remaining())

    await call(TimeoutMiddleware(streaming, seconds=1, clock=clock), http_scope())
    assert seen == [None]


async def test_a_sooner_outer_deadline_is_not_lifted() -> None:
    """Only the middleware's own deadline is lifted: an outer, sooner one stays."""
    clock = FakeClock()
    seen: list[float | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await ok_app(scope, receive, send)
        seen.append(rs.time_remaining())

    with rs.deadline(0.5, clock=clock):
        await call(TimeoutMiddleware(app, seconds=1, clock=clock), http_scope())
        assert rs.time_remaining() == 0.5
    assert seen == [0.5]


async def test_bad_timeouts_are_refused_at_construction() -> None:
    """Zero or negative seconds (every request a 504) and websocket rules are refused."""
    for bad in (0, -1, float("nan")):
        with pytest.raises(ConfigurationError, match="seconds"):
            TimeoutMiddleware(ok_app, seconds=bad)
        with pytest.raises(ConfigurationError, match="seconds"):
            TimeoutMiddleware(ok_app, seconds=1, rules=[Rule("/x", seconds=bad)])
    with pytest.raises(ConfigurationError, match="HTTP requests only"):
        TimeoutMiddleware(ok_app, seconds=1, rules=[Rule("/ws", scopes=("websocket",))])


async def test_ambient_deadline_is_set_for_inner_policies() -> None:
    """Inside the app, ``rs.time_remaining()`` is the request's remaining time."""
    clock = FakeClock(100.0)
    seen: list[float | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(rs.time_remaining())
        await ok_app(scope, receive, send)

    middleware = TimeoutMiddleware(app, seconds=2.5, clock=clock)
    await call(middleware, http_scope())
    assert seen == [2.5]
    assert rs.time_remaining() is None, "the deadline is popped after the request"


async def test_rules_per_path() -> None:
    """A rule can lengthen, remove (None) or exempt a path's timeout."""
    clock = FakeClock()
    seen: dict[str, float | None] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen[scope["path"]] = rs.time_remaining()
        await ok_app(scope, receive, send)

    middleware = TimeoutMiddleware(
        app,
        seconds=1,
        clock=clock,
        rules=[
            Rule("/reports/*", seconds=120),
            Rule("/events", seconds=None),
            Rule("/h", exempt=True),
        ],
    )
    for path in ("/", "/reports/q1", "/events", "/h"):
        assert (await call(middleware, http_scope(path))).status == 200
    assert seen == {"/": 1.0, "/reports/q1": 120.0, "/events": None, "/h": None}
    with pytest.raises(ConfigurationError, match="cost"):
        TimeoutMiddleware(app, seconds=1, rules=[Rule("/x", cost=2)])
    with pytest.raises(ConfigurationError, match="seconds"):
        TimeoutMiddleware(app, seconds=-1)


async def test_timed_out_event() -> None:
    """A timeout emits ``TimedOut`` with the middleware's name."""
    clock = FakeClock()
    started = anyio.Event()
    events: list[rs.Event] = []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        await anyio.sleep_forever()

    middleware = TimeoutMiddleware(slow, seconds=1, clock=clock, name="api-timeout")
    middleware.add_listener(events.append)
    await run_until_started(middleware, started, clock, 1)
    assert events == [rs.TimedOut(policy="api-timeout", key=None, seconds=1.0)]


async def test_non_http_scopes_pass_through_untouched() -> None:
    """Websocket and lifespan scopes reach the app with the very same callables."""
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    middleware = TimeoutMiddleware(app, seconds=0.001)

    async def receive() -> dict[str, Any]:
        return {}

    async def send(message: Any) -> None:
        pass

    for scope in ({"type": "websocket", "path": "/ws"}, {"type": "lifespan"}):
        await middleware(scope, receive, send)
        assert seen[-1] == (scope, receive, send)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_uvicorn_504_and_mid_stream_cancellation_leave_no_task(anyio_backend: str) -> None:
    """Under a real server: 504 before start; mid-stream the client gets a complete
    truncated body, and the app's tasks are all finished afterwards."""
    tasks: list[asyncio.Task[Any]] = []
    done = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await asyncio.sleep(30)
            return

        async def producer() -> None:
            await asyncio.sleep(30)

        task = asyncio.create_task(producer())
        tasks.append(task)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await task
        finally:
            task.cancel()
            done.set()

    with serve(TimeoutMiddleware(app, seconds=0.3)) as url, httpx.Client(timeout=10) as client:
        response = client.get(f"{url}/slow")
        assert response.status_code == 504
        with client.stream("GET", f"{url}/stream") as streamed:
            assert streamed.status_code == 200
            assert b"".join(streamed.iter_bytes()) == b"first"
        assert done.wait(5)
        deadline = time.monotonic() + 5
        while not (tasks and all(t.done() for t in tasks)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tasks
        assert all(t.done() for t in tasks), "a task of the cancelled app is still running"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_a_late_failure_after_the_504_spares_the_next_request_on_the_connection(
    anyio_backend: str,
) -> None:
    """Under uvicorn: a sync endpoint answered 504 at its deadline that raises later
    leaves the keep-alive connection alone; the next request on it gets its answer
    (it used to be reset: the late error made the server close the connection)."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    def boom(request: Any) -> Any:
        time.sleep(0.5)  # a blocking endpoint, in the thread pool
        raise RuntimeError("late failure after the deadline")

    async def ok(request: Any) -> Any:
        await asyncio.sleep(0.1)
        return PlainTextResponse("ok")

    app = TimeoutMiddleware(Starlette(routes=[Route("/boom", boom), Route("/ok", ok)]), seconds=0.2)
    with serve(app) as url, httpx.Client(timeout=10) as client:
        assert client.get(f"{url}/boom").status_code == 504
        time.sleep(0.2)  # the thread fails while the next request runs
        response = client.get(f"{url}/ok")
        assert (response.status_code, response.text) == (200, "ok")
