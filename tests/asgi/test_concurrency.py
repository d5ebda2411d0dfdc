"""ConcurrencyLimitMiddleware: shedding with 503, priority queueing, permits always returned."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from resilience.asgi import (
    REDUCED_CAPACITY,
    ConcurrencyLimitMiddleware,
    RequestAdmitted,
    RequestCompleted,
    Rule,
    client_ip,
    header_priority,
)
from resilience.bulkhead import Bulkhead
from resilience.errors import ConfigurationError
from resilience.testing import FakeClock

from ._support import Result, call, http_scope, ok_app, receive_nothing

pytestmark = pytest.mark.anyio


class Gate:
    """An app whose requests block until released, recording the order they ran in."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.release = anyio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.entered.append(scope["path"])
        if scope["path"] == "/hold":
            await self.release.wait()
        await ok_app(scope, receive, send)


async def wait_for(predicate: Any) -> None:
    with anyio.fail_after(5):
        while not predicate():
            await anyio.sleep(0)


async def test_over_capacity_is_shed_with_503_problem() -> None:
    """No free slot and no queue: 503, Retry-After and temporary-reduced-capacity."""
    gate = Gate()
    bulkhead = Bulkhead(1, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, retry_after=2)
    results: list[Result] = []

    async def hold() -> None:
        results.append(await call(app, http_scope("/hold")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await wait_for(lambda: gate.entered)
        shed = await call(app, http_scope("/other"))
        gate.release.set()
    assert shed.status == 503
    assert shed.header("retry-after") == "2"
    assert json.loads(shed.body)["type"] == REDUCED_CAPACITY
    assert results[0].status == 200
    assert app.statistics() == {"shed": 1}
    assert bulkhead.statistics().in_flight == 0
    assert (await call(app, http_scope("/other"))).status == 200


async def test_queued_requests_are_served_by_priority() -> None:
    """Interactive (0) waiters go before batch (10) ones, whatever their arrival order."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(
        gate,
        bulkhead=bulkhead,
        priority=header_priority("x-priority"),
        rules=[Rule("/reports/*", priority=10)],
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, app, http_scope("/hold"))
        await wait_for(lambda: gate.entered)
        tg.start_soon(call, app, http_scope("/reports/a"))
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(call, app, http_scope("/batch", headers=[("x-priority", "batch")]))
        await wait_for(lambda: bulkhead.statistics().waiting == 2)
        tg.start_soon(call, app, http_scope("/ui", headers=[("x-priority", "interactive")]))
        await wait_for(lambda: bulkhead.statistics().waiting == 3)
        gate.release.set()
    assert gate.entered == ["/hold", "/ui", "/reports/a", "/batch"]


async def record(app: Any, scope: dict[str, Any], results: dict[str, int]) -> None:
    results[scope["path"]] = (await call(app, scope)).status


async def test_a_full_queue_refuses_newcomers_at_once() -> None:
    """``max_queue=2``: two requests wait, the third is refused at once (503) although
    ``max_wait`` would let it wait; the two queued ones are served in order."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, max_queue=2)
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/a"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(record, app, http_scope("/b"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 2)
        with anyio.fail_after(5):
            assert (await call(app, http_scope("/c"))).status == 503
        gate.release.set()
    assert gate.entered == ["/hold", "/a", "/b"]
    assert results == {"/hold": 200, "/a": 200, "/b": 200}
    assert app.statistics() == {"shed": 1}
    # The queue emptied: two may wait again.
    assert (await call(app, http_scope("/d"))).status == 200


async def test_max_wait_inf_waits_like_the_bulkhead_s_own_inf() -> None:
    """``max_wait=math.inf`` is accepted as the bulkhead itself accepts it (it used to be
    refused here while ``Bulkhead(max_wait=inf)`` as the default was taken): a queued
    request waits for a slot however long, the queue's length still bounding it."""
    import math

    gate = Gate()
    bulkhead = Bulkhead(1, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, max_wait=math.inf, max_queue=1)
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/a"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        with anyio.fail_after(5):
            assert (await call(app, http_scope("/b"))).status == 503
        gate.release.set()
    assert results == {"/hold": 200, "/a": 200}


async def test_an_urgent_newcomer_displaces_the_newest_least_urgent_waiter() -> None:
    """Queue full of batch (10) requests: an interactive (0) one takes the place of the
    newest batch request, which is refused; an equally urgent newcomer is refused."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(
        gate, bulkhead=bulkhead, priority=header_priority("x-priority"), max_queue=2
    )
    batch = [("x-priority", "batch")]
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/batch-old", headers=batch), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(record, app, http_scope("/batch-new", headers=batch), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 2)
        with anyio.fail_after(5):
            assert (await call(app, http_scope("/batch-late", headers=batch))).status == 503
        tg.start_soon(
            record, app, http_scope("/ui", headers=[("x-priority", "interactive")]), results
        )
        await wait_for(lambda: results.get("/batch-new") == 503)
        assert bulkhead.statistics().waiting == 2
        gate.release.set()
    assert gate.entered == ["/hold", "/ui", "/batch-old"]
    assert results == {"/hold": 200, "/batch-old": 200, "/batch-new": 503, "/ui": 200}
    assert bulkhead.statistics().in_flight == 0


async def test_rules_sharing_a_bulkhead_share_its_queue() -> None:
    """``max_queue`` bounds the waiters of a bulkhead, whichever rule they came by: a
    batch request queued through ``Rule("/reports/*", priority=10)`` is the one an
    interactive request displaces, and no more than ``max_queue`` wait (each rule used
    to keep a queue of its own: three waited, and an interactive request was shed
    while the batch one stayed)."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(
        gate, bulkhead=bulkhead, priority=0, rules=[Rule("/reports/*", priority=10)], max_queue=2
    )
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/reports/1"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(record, app, http_scope("/a"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 2)
        tg.start_soon(record, app, http_scope("/b"), results)
        await wait_for(lambda: results.get("/reports/1") == 503)
        assert bulkhead.statistics().waiting == 2
        with anyio.fail_after(5):
            assert (await call(app, http_scope("/c"))).status == 503
        gate.release.set()
    assert gate.entered == ["/hold", "/a", "/b"]
    assert results == {"/hold": 200, "/reports/1": 503, "/a": 200, "/b": 200}


async def test_a_displaced_request_is_a_rejection_of_the_bulkhead() -> None:
    """The request a more urgent one displaces is refused like any other: the bulkhead
    counts it and emits ``CallRejected`` (it used to get its 503 unreported, so the
    rejection metrics missed it)."""
    from resilience import CallRejected

    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock(), name="slots")
    rejected: list[Any] = []
    bulkhead.add_listener(lambda e: rejected.append(e) if isinstance(e, CallRejected) else None)
    app = ConcurrencyLimitMiddleware(
        gate, bulkhead=bulkhead, priority=header_priority("x-priority"), max_queue=1
    )
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/batch", headers=[("x-priority", "10")]), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(record, app, http_scope("/ui", headers=[("x-priority", "0")]), results)
        await wait_for(lambda: results.get("/batch") == 503)
        gate.release.set()
    assert results == {"/hold": 200, "/batch": 503, "/ui": 200}
    assert [e.policy for e in rejected] == ["slots"]
    assert bulkhead.statistics().rejected == 1
    assert app.statistics() == {"shed": 1}


async def test_by_default_the_queue_is_bounded_too() -> None:
    """200 requests at a cap of 2: two run, 64 wait (the default bound: the cap, at least
    64), the other 134 are refused at once instead of waiting out ``max_wait``;
    ``max_queue=None`` lifts the bound."""
    gate = Gate()
    bulkhead = Bulkhead(2, max_wait=60, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead)
    statuses: list[int] = []

    async def one(path: str) -> None:
        statuses.append((await call(app, http_scope(path))).status)

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one, "/hold")
        await wait_for(lambda: len(gate.entered) == 2)
        for index in range(198):
            tg.start_soon(one, f"/{index}")
        await wait_for(lambda: len(statuses) == 134)
        assert bulkhead.statistics().waiting == 64
        assert set(statuses) == {503}
        gate.release.set()
    assert sorted(statuses) == [200] * 66 + [503] * 134
    unbounded = ConcurrencyLimitMiddleware(gate, bulkhead=Bulkhead(1), max_queue=None)
    assert (await call(unbounded, http_scope())).status == 200


async def test_max_queue_must_be_a_non_negative_int() -> None:
    """A bad ``max_queue`` is refused at construction."""
    for bad in (-1, 1.5, "many"):
        with pytest.raises(ConfigurationError, match="max_queue"):
            ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), max_queue=bad)


async def test_permit_is_held_while_streaming_and_returned_on_errors() -> None:
    """The slot is held until the app returns, and returned when it raises or is cancelled."""
    bulkhead = Bulkhead(1, clock=FakeClock())
    in_flight_during_stream: list[int] = []

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        if scope["path"] == "/forever":
            await anyio.sleep_forever()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        in_flight_during_stream.append(bulkhead.statistics().in_flight)
        await send({"type": "http.response.body", "body": b"b"})

    app = ConcurrencyLimitMiddleware(streaming, bulkhead=bulkhead)
    assert (await call(app, http_scope("/stream"))).body == b"ab"
    assert in_flight_during_stream == [1]
    with pytest.raises(RuntimeError, match="boom"):
        await call(app, http_scope("/boom"))
    assert bulkhead.statistics().in_flight == 0
    with anyio.move_on_after(0.05):
        await call(app, http_scope("/forever"))
    assert bulkhead.statistics().in_flight == 0


async def test_per_client_key_exempt_and_passthrough() -> None:
    """``key`` makes the cap per client; exempt paths and non-HTTP scopes skip it."""
    gate = Gate()
    bulkhead = Bulkhead(1, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, key=client_ip(), exempt=["/healthz"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, app, http_scope("/hold", client=("192.0.2.1", 1)))
        await wait_for(lambda: gate.entered)
        other = await call(app, http_scope("/x", client=("192.0.2.2", 1)))
        same = await call(app, http_scope("/x", client=("192.0.2.1", 1)))
        health = await call(app, http_scope("/healthz", client=("192.0.2.1", 1)))
        seen: list[Any] = []

        async def raw(scope: Any, receive: Any, send: Any) -> None:
            seen.append(scope)

        passthrough = ConcurrencyLimitMiddleware(raw, bulkhead=bulkhead)
        await passthrough({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
        gate.release.set()
    assert (other.status, same.status, health.status) == (200, 503, 200)
    assert seen == [{"type": "lifespan"}]


def test_header_priority_parsing() -> None:
    """Integers, class names and RFC 9218 urgency; clamped; default when absent or bad.
    An RFC 9218 field without ``u`` (``i`` alone) has that RFC's default urgency, 3 (it
    used to read as unreadable, the middleware's default)."""
    priority = header_priority("priority", default=5, maximum=10)
    values = {
        "2": 2,
        "batch": 10,
        "Interactive": 0,
        "u=1, i": 1,
        "i, u=7": 7,
        "i": 3,
        "i=?1": 3,
        "-5": 0,
        "99": 10,
        "garbage": 5,
        "u=1, u=5": 5,  # a dictionary's last member wins (RFC 8941)
        "u=1.5": 3,  # not an integer: ignored, the RFC's default urgency
        "u=8": 3,  # out of 0..7: ignored
        "u=2;x=1, foo": 2,  # parameters and unknown members ignored
    }
    for raw, expected in values.items():
        assert priority(http_scope(headers=[("priority", raw)])) == expected, raw
    assert priority(http_scope()) == 5
    # Two field lines are one field, joined by a comma (RFC 9110): "i, u=1".
    assert priority(http_scope(headers=[("priority", "i"), ("priority", "u=1")])) == 1
    with pytest.raises(ConfigurationError, match="default"):
        header_priority(default=42)


def test_configuration_errors() -> None:
    """A non-bulkhead, unknown rule options and bad waits fail at construction."""
    with pytest.raises(ConfigurationError, match="bulkhead"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=object())
    with pytest.raises(ConfigurationError, match="cost"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), rules=[Rule("/x", cost=1)])
    with pytest.raises(ConfigurationError, match="max_wait"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), max_wait=-1)


async def test_events_report_queue_wait_and_request_duration() -> None:
    """Observed, the middleware reports the time queued and the time held, per outcome."""
    clock = FakeClock()
    bulkhead = Bulkhead(1, clock=clock, name="web")
    events: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        clock.advance(0.25)
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        await ok_app(scope, receive, send)

    middleware = ConcurrencyLimitMiddleware(app, bulkhead=bulkhead, priority=3, clock=clock)
    middleware.add_listener(events.append)
    await call(middleware, http_scope())
    with pytest.raises(RuntimeError):
        await call(middleware, http_scope("/boom"))
    admitted = [e for e in events if isinstance(e, RequestAdmitted)]
    completed = [e for e in events if isinstance(e, RequestCompleted)]
    assert [(e.policy, e.waited, e.priority) for e in admitted] == [("web", 0.0, 3)] * 2
    assert [(e.duration, e.outcome) for e in completed] == [(0.25, "completed"), (0.25, "error")]


async def test_a_client_that_leaves_mid_response_is_a_cancelled_request() -> None:
    """Starlette ends a stream quietly when its client disconnects (it stops and
    returns): the request was reported ``completed``. A disconnect seen before the
    response is complete makes it ``cancelled``; one after it changes nothing."""
    events: list[Any] = []

    async def streams_until_disconnect(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        # returns without ending the response, as Starlette's StreamingResponse does

    async def answers_then_listens(scope: Any, receive: Any, send: Any) -> None:
        await ok_app(scope, receive, send)
        while (await receive())["type"] != "http.disconnect":
            pass

    async def sends_a_file_then_listens(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.pathsend", "path": "/etc/hostname"})
        while (await receive())["type"] != "http.disconnect":
            pass

    for app in (streams_until_disconnect, answers_then_listens, sends_a_file_then_listens):
        middleware = ConcurrencyLimitMiddleware(app, bulkhead=Bulkhead(1))
        middleware.add_listener(events.append)
        messages = iter(
            [{"type": "http.request", "body": b"", "more_body": False}, {"type": "http.disconnect"}]
        )

        async def receive() -> Any:
            return next(messages)

        async def send(message: Any) -> None:
            pass

        await middleware(http_scope(), receive, send)
    completed = [e.outcome for e in events if isinstance(e, RequestCompleted)]
    assert completed == ["cancelled", "completed", "completed"]


@pytest.mark.parametrize("timeout_outside", [True, False])
async def test_a_timed_out_request_is_reported_cancelled(timeout_outside: bool) -> None:
    """A request cut by a TimeoutMiddleware is ``cancelled``, with the timeout inside
    the concurrency limit or outside it, also when the app returns normally after its
    cut (a sync endpoint's thread, whose late answer is dropped): that one was
    reported ``completed``, a timed-out call counted as a success."""
    from resilience.asgi import TimeoutMiddleware

    clock = FakeClock()
    started = anyio.Event()
    release = anyio.Event()
    events: list[Any] = []

    async def sync_like(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        with anyio.CancelScope(shield=True):  # a worker thread no cut can stop
            await release.wait()
        await ok_app(scope, receive, send)

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            release.set()  # the 504 is out: let the "thread" end

    if timeout_outside:
        limited = ConcurrencyLimitMiddleware(sync_like, bulkhead=Bulkhead(1))
        app: Any = TimeoutMiddleware(limited, seconds=5, clock=clock)
    else:
        timed = TimeoutMiddleware(sync_like, seconds=5, clock=clock)
        app = limited = ConcurrencyLimitMiddleware(timed, bulkhead=Bulkhead(1))
    limited.add_listener(events.append)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app, http_scope(), receive_nothing, send)
            await started.wait()
            clock.advance(5)
            await anyio.sleep(0)
            release.set()  # trio answers once the app ends
    completed = [e.outcome for e in events if isinstance(e, RequestCompleted)]
    assert completed == ["cancelled"]


async def test_each_request_is_one_admission_in_the_metrics() -> None:
    """The middleware reports each admitted request once (RequestAdmitted, with its
    queueing time); the bulkhead's own CallAdmitted is not added on top."""
    from resilience import add_listener, remove_listener
    from resilience.observability import samples

    app = ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(2, name="slots"))
    waits: list[float] = []
    decisions: list[str] = []

    def count(event: Any) -> None:
        for series, value, labels in samples(event):
            if series.name == "resilience.decisions":
                decisions.append(labels[1])
            elif series.name == "resilience.wait.duration":
                waits.append(value)

    add_listener(count)
    try:
        for _ in range(3):
            assert (await call(app, http_scope())).status == 200
    finally:
        remove_listener(count)
    assert decisions == ["admitted"] * 3
    assert len(waits) == 3


@pytest.mark.redis
@pytest.mark.parametrize("observed", [False, True], ids=["quiet", "observed"])
async def test_a_distributed_release_never_blocks_the_event_loop(
    redis_server: Any, observed: bool
) -> None:
    """The lease of a distributed bulkhead is released with an awaited round trip: while
    a paused Redis holds the release, other tasks on the loop keep running (the release
    used to be the blocking sync call, freezing the loop for the backend timeout)."""
    from resilience.backends import RedisBackend

    bulkhead = Bulkhead(
        2, backend=RedisBackend.from_url(redis_server.url, timeout=2.0), name="asgi-release"
    )
    app = ConcurrencyLimitMiddleware(ok_app, bulkhead=bulkhead)
    if observed:
        app.add_listener(lambda event: None)
    seen: list[tuple[bool, bool]] = []
    finished = anyio.Event()
    result = Result()

    async def send(message: Any) -> None:
        result.messages.append(message)
        if message["type"] == "http.response.body":
            redis_server.pause()  # the release comes next, and hangs until resumed

    async def request() -> None:
        await app(http_scope("/"), _receive_nothing, send)
        finished.set()

    async def watch() -> None:
        await wait_for(lambda: len(result.messages) == 2)
        # Body sent, release pending: this task runs only if the release awaits.
        seen.append((len(result.messages) == 2, finished.is_set()))
        redis_server.resume()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            tg.start_soon(watch)
    finally:
        redis_server.resume()
        bulkhead.close()
    assert seen == [(True, False)]
    assert bulkhead.statistics().in_flight == 0


@pytest.mark.redis
async def test_a_distributed_round_trip_is_not_a_place_in_the_queue(redis_server: Any) -> None:
    """With free slots, requests still in their Redis round trip are not waiting: a
    burst of ten, one of them batch, all get in through ``max_queue=1`` (they used to
    count as waiters, and the batch one was displaced by an interactive one)."""
    from resilience.backends import RedisBackend

    bulkhead = Bulkhead(
        50, max_wait=5, backend=RedisBackend.from_url(redis_server.url), name="asgi-burst"
    )
    app = ConcurrencyLimitMiddleware(
        ok_app, bulkhead=bulkhead, priority=header_priority("x-priority"), max_queue=1
    )
    statuses: list[int] = []

    async def one(priority: str) -> None:
        scope = http_scope(headers=[("x-priority", priority)])
        statuses.append((await call(app, scope)).status)

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "10")
                for _ in range(9):
                    tg.start_soon(one, "0")
        assert statuses == [200] * 10
        assert app.statistics() == {"shed": 0}
        assert bulkhead.statistics().rejected == 0
    finally:
        bulkhead.close()


@pytest.mark.redis
async def test_a_distributed_bulkhead_bounds_its_queue(redis_server: Any) -> None:
    """A full distributed bulkhead: one request waits (``max_queue=1``), the next
    equally urgent one is refused at once and counted by the bulkhead."""
    from resilience.backends import RedisBackend

    gate = Gate()
    bulkhead = Bulkhead(
        1, max_wait=30, backend=RedisBackend.from_url(redis_server.url), name="asgi-full"
    )
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, max_queue=1)
    results: dict[str, int] = {}
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(record, app, http_scope("/hold"), results)
                await wait_for(lambda: gate.entered)
                tg.start_soon(record, app, http_scope("/a"), results)
                await wait_for(lambda: bulkhead.statistics().waiting == 1)
                assert (await call(app, http_scope("/b"))).status == 503
                gate.release.set()
        assert results == {"/hold": 200, "/a": 200}
        assert bulkhead.statistics().rejected == 1
    finally:
        bulkhead.close()


async def _receive_nothing() -> dict[str, Any]:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def test_a_bulkhead_or_priority_it_would_refuse_per_request_is_refused_when_built() -> None:
    """Not a Bulkhead (a limiter has an acquire_async too), or a priority out of the
    bulkhead's range: a ConfigurationError at construction, not a 500 per request."""
    from resilience.ratelimit import RateLimiter

    with pytest.raises(ConfigurationError, match="bulkhead"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=RateLimiter("1/s"))
    with pytest.raises(ConfigurationError, match="priority"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), priority=10**20)


@pytest.mark.parametrize("value", ["\u00b2", "1\u00b3", "--3", "9" * 12, "u=" + "9" * 5000])
def test_a_priority_header_that_is_no_number_gives_the_default(value: str) -> None:
    """ "²" passed str.isdigit() and broke int(); so did "--3" and 5000 digits: a 500
    any client could cause. An unreadable priority is the default."""
    priority = header_priority("x-priority", default=5)
    scope = http_scope(headers=[("x-priority", value)])
    scope["headers"] = [(b"x-priority", value.encode("latin-1", "replace"))]
    # The default; a Priority field whose u is no urgency (0..7) has RFC 9218's, 3.
    assert priority(scope) == (3 if value.startswith("u=") else 5)


async def test_a_request_without_priority_ranks_at_the_bulkhead_s_default() -> None:
    """The bounded queue ranked a request without a priority as 0 (most urgent), though
    the bulkhead serves it at its default (10 here): an interactive request (0) was
    then refused instead of displacing it."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, priority=10, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(
        gate, bulkhead=bulkhead, max_queue=1, rules=[Rule("/interactive", priority=0)]
    )
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/hold"), results)
        await wait_for(lambda: gate.entered)
        tg.start_soon(record, app, http_scope("/batchy"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        tg.start_soon(record, app, http_scope("/interactive"), results)
        await wait_for(lambda: "/batchy" in results)
        gate.release.set()
    assert results == {"/hold": 200, "/batchy": 503, "/interactive": 200}


async def test_a_listener_that_raises_on_admission_does_not_keep_the_slot() -> None:
    """RequestAdmitted was emitted before the block that releases the permit: a
    listener raising a BaseException there kept the slot for good."""
    bulkhead = Bulkhead(1, clock=FakeClock())
    app = ConcurrencyLimitMiddleware(ok_app, bulkhead=bulkhead)

    def interrupt(event: Any) -> None:
        if type(event).__name__ == "RequestAdmitted":
            raise KeyboardInterrupt

    app.add_listener(interrupt)
    with pytest.raises(KeyboardInterrupt):
        await call(app, http_scope())
    assert bulkhead.statistics().in_flight == 0


def test_an_exempt_path_without_its_slash_is_refused() -> None:
    """exempt=["healthz"] never matched a request path (they start with "/")."""
    with pytest.raises(ConfigurationError, match="did you mean '/healthz'"):
        ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), exempt=["healthz"])


async def test_a_waiter_moved_to_the_local_twin_is_in_line_once(redis_server: Any) -> None:
    """Redis fails while a request waits for a distributed bulkhead: it goes on waiting
    on the local twin, which asked the queue bound again and entered it a second time;
    only one entry left with it, and the phantom kept a queue place for good."""
    from resilience.backends import RedisBackend

    gates: dict[str, anyio.Event] = {}

    async def gated(scope: Any, receive: Any, send: Any) -> None:
        await gates.setdefault(scope["path"], anyio.Event()).wait()
        await ok_app(scope, receive, send)

    bulkhead = Bulkhead(
        1,
        max_wait=5,
        name="phantom",
        backend=RedisBackend.from_url(redis_server.url, timeout=0.05),
        on_backend_error="local",
    )
    app = ConcurrencyLimitMiddleware(gated, bulkhead=bulkhead, max_queue=1)
    results: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(record, app, http_scope("/a"), results)
        await anyio.sleep(0.1)
        tg.start_soon(record, app, http_scope("/b"), results)
        await wait_for(lambda: bulkhead.statistics().waiting == 1)
        redis_server.kill()
        await anyio.sleep(1.5)  # b's next try finds Redis gone: it waits on the twin
        gates.setdefault("/a", anyio.Event()).set()
        gates.setdefault("/b", anyio.Event()).set()
    assert results == {"/a": 200, "/b": 200}
    assert app._default.queue.waiting == {}  # no phantom left in the bounded queue


def test_an_exempt_wildcard_is_still_accepted() -> None:
    """The leading-slash check of exempt paths concerns literal paths: "*" (every path)
    and "/static/*" are patterns, checked as before."""
    ConcurrencyLimitMiddleware(ok_app, bulkhead=Bulkhead(1), exempt=["*", "/static/*"])


class Client:
    """A client of one request: its body, then (after ``leave()``) a disconnect."""

    def __init__(self, body: list[bytes] | None = None) -> None:
        chunks = body or [b""]
        self.messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
            for i, chunk in enumerate(chunks)
        ]
        self.left = anyio.Event()
        self.sent: list[dict[str, Any]] = []

    def leave(self) -> None:
        self.left.set()

    async def receive(self) -> dict[str, Any]:
        if self.messages:
            return self.messages.pop(0)
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def hold_then_queue(
    tg: Any, app: Any, gate: Gate, bulkhead: Bulkhead, queued: list[tuple[str, Client]]
) -> None:
    """Start a request holding the one slot (``/hold``), then queue each client's
    request in order."""
    holder = Client()
    tg.start_soon(app, http_scope("/hold"), holder.receive, holder.send)
    await wait_for(lambda: gate.entered)
    for count, (path, client) in enumerate(queued, 1):
        tg.start_soon(app, http_scope(path), client.receive, client.send)
        await wait_for(lambda count=count: bulkhead.statistics().waiting == count)


async def _queued_client_leaves(bulkhead: Bulkhead) -> None:
    gate = Gate()
    app = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead, max_queue=2)
    leaving, staying = Client(), Client()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await hold_then_queue(
                tg, app, gate, bulkhead, [("/gone", leaving), ("/stays", staying)]
            )
            leaving.leave()
            await wait_for(lambda: app.abandoned == 1)
            assert bulkhead.statistics().waiting == 1
            # Its place is free: another request may queue (max_queue=2).
            late = Client()
            tg.start_soon(app, http_scope("/late"), late.receive, late.send)
            await wait_for(lambda: bulkhead.statistics().waiting == 2)
            gate.release.set()
    assert gate.entered == ["/hold", "/stays", "/late"]  # "/gone" never ran
    assert leaving.sent == []  # nobody to answer
    assert app.abandoned == 1
    assert app.statistics() == {"shed": 0}
    assert bulkhead.statistics().in_flight == 0


async def test_a_client_that_leaves_while_queued_leaves_the_queue() -> None:
    """A request whose client hangs up while it waits for a slot leaves the queue and
    never runs (it kept its place, filled the bounded queue so that newcomers got 503,
    and then ran for nobody)."""
    await _queued_client_leaves(Bulkhead(1, max_wait=60, clock=FakeClock()))


@pytest.mark.redis
async def test_a_client_that_leaves_while_queued_for_a_distributed_slot(
    redis_server: Any,
) -> None:
    """The same with the slots in Redis: its waiter is cancelled, no lease is left."""
    from resilience.backends import RedisBackend

    bulkhead = Bulkhead(
        1,
        max_wait=60,
        # A loaded machine's slow round trip must not move it to the local twin.
        backend=RedisBackend.from_url(redis_server.url, timeout=1.0),
        name="asgi-leave",
    )
    try:
        await _queued_client_leaves(bulkhead)
        assert bulkhead.statistics().shared_in_flight == 0
    finally:
        bulkhead.close()


async def test_what_is_read_while_queued_reaches_the_app() -> None:
    """Watching for a disconnect reads the request's one body message: the app gets it
    all the same; a body of several messages is left for the app to read."""
    received: list[bytes] = []
    gate = Gate()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            await gate(scope, receive, send)
            return
        while True:
            message = await receive()
            received.append(message["body"])
            if not message["more_body"]:
                break
        await ok_app(scope, receive, send)

    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    middleware = ConcurrencyLimitMiddleware(app, bulkhead=bulkhead)
    one, several = Client([b"whole"]), Client([b"a", b"b", b"c"])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            queued = [("/one", one), ("/several", several)]
            await hold_then_queue(tg, middleware, gate, bulkhead, queued)
            gate.release.set()
    assert received == [b"whole", b"a", b"b", b"c"]
    assert [m["status"] for m in one.sent + several.sent if "status" in m] == [200, 200]


async def test_what_receive_raises_while_queued_reaches_the_app_unwrapped() -> None:
    """A receive() that raises while the request waits (a server's error for a client
    gone, a body-size limit's 413): the app meets that error where it reads, as it
    would have, not a task group's ExceptionGroup."""
    gate = Gate()
    seen: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            await gate(scope, receive, send)
            return
        try:
            await receive()
        except OSError as exc:
            seen.append(exc)
            raise

    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    middleware = ConcurrencyLimitMiddleware(app, bulkhead=bulkhead)
    broken = anyio.Event()
    raised: list[BaseException] = []

    async def raising_receive() -> dict[str, Any]:
        await broken.wait()
        raise OSError("connection reset")

    async def queued() -> None:
        try:
            await middleware(http_scope("/read"), raising_receive, Client().send)
        except BaseException as exc:
            raised.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await hold_then_queue(tg, middleware, gate, bulkhead, [])
            tg.start_soon(queued)
            await wait_for(lambda: bulkhead.statistics().waiting == 1)
            broken.set()
            await anyio.sleep(0.1)  # past the watcher's start on asyncio
            gate.release.set()
    assert [type(e) for e in seen] == [OSError]
    assert [type(e) for e in raised] == [OSError]
    assert bulkhead.statistics().in_flight == 0


async def test_a_receive_that_never_blocks_is_read_at_most_twice_while_queued() -> None:
    """A receive that answers at once every time (a middleware replaying a body it
    read, against the ASGI rules): watching it must not spin the loop (it froze and
    grew without bound); the app reads what it would have read."""
    gate = Gate()
    reads = 0

    async def replaying() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"body", "more_body": False}

    got: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            await gate(scope, receive, send)
            return
        got.append((await receive())["body"])
        await ok_app(scope, receive, send)

    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    middleware = ConcurrencyLimitMiddleware(app, bulkhead=bulkhead)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await hold_then_queue(tg, middleware, gate, bulkhead, [])
            tg.start_soon(middleware, http_scope("/read"), replaying, Client().send)
            await wait_for(lambda: bulkhead.statistics().waiting == 1)
            await wait_for(lambda: reads == 2)
            await anyio.sleep(0.1)
            assert reads == 2
            gate.release.set()
    assert got == [b"body"]


async def test_a_client_expecting_100_continue_is_not_asked_for_its_body_while_queued() -> None:
    """``Expect: 100-continue``: reading receive makes the server ask for the body
    (uvicorn sends 100 Continue), which a request that may yet be shed must not do."""
    gate = Gate()
    bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
    middleware = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead)
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = http_scope("/upload", method="POST", headers=[("expect", "100-continue")])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await hold_then_queue(tg, middleware, gate, bulkhead, [])
            tg.start_soon(middleware, scope, receive, Client().send)
            await wait_for(lambda: bulkhead.statistics().waiting == 1)
            await anyio.sleep(0.1)  # past the watcher's start on asyncio
            assert reads == 0
            gate.release.set()
    assert gate.entered == ["/hold", "/upload"]


async def test_a_request_cancelled_as_its_slot_comes_gives_the_slot_back() -> None:
    """A queued request granted its slot and cancelled from outside a moment later
    (a TimeoutMiddleware around the middleware): the slot comes back, at every point
    (it was kept for good while the watcher ended)."""
    for delay in range(6):
        gate = Gate()
        bulkhead = Bulkhead(1, max_wait=60, clock=FakeClock())
        middleware = ConcurrencyLimitMiddleware(gate, bulkhead=bulkhead)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await hold_then_queue(tg, middleware, gate, bulkhead, [])
                scope = anyio.CancelScope()

                async def queued(scope: anyio.CancelScope = scope) -> None:
                    with scope:
                        await middleware(http_scope("/q"), Client().receive, Client().send)

                tg.start_soon(queued)
                await wait_for(lambda: bulkhead.statistics().waiting == 1)
                gate.release.set()
                for _ in range(delay):
                    await anyio.sleep(0)
                scope.cancel()
        assert bulkhead.statistics().in_flight == 0, delay


async def test_a_slow_body_after_a_wait_in_the_queue_is_still_the_client_s_408() -> None:
    """TimeoutMiddleware outside: a request that waited (long enough to be watched)
    whose client never sends its body gets 408 as it does unqueued (the cancelled
    watcher's receive ended after the app's began and hid the slow client: 504)."""
    from resilience.asgi import TimeoutMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            await anyio.sleep(0.2)
        else:
            while (await receive()).get("more_body"):
                pass
        await ok_app(scope, receive, send)

    bulkhead = Bulkhead(1, max_wait=5)
    stack = TimeoutMiddleware(ConcurrencyLimitMiddleware(app, bulkhead=bulkhead), seconds=0.6)
    statuses: dict[str, int] = {}

    async def request(path: str) -> None:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = http_scope(path, method="POST", headers=[("content-length", "10")])
        await stack(scope, receive_nothing, send)  # the body never comes
        statuses[path] = Result(sent).status

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(request, "/hold")
            await wait_for(lambda: bulkhead.statistics().in_flight == 1)
            tg.start_soon(request, "/upload")
    assert statuses == {"/hold": 200, "/upload": 408}


@pytest.mark.parametrize(
    ("seconds", "max_wait", "busy"),
    [(0.3, 5.0, True), (0.3, 0.29, False), (0.015, 0.0, False)],
    ids=["wait-clamped-to-the-deadline", "wait-ends-10ms-before", "refused-at-once-near-it"],
)
async def test_requests_refused_at_their_deadline_are_timeouts_not_shed(
    seconds: float, max_wait: float, busy: bool
) -> None:
    """TimeoutMiddleware outside: a queued request refused at its deadline (a wait
    clamped to it, a wait ending within 20 ms of it, a full bulkhead just before it)
    gets the 504, and is no 503 in ``shed``. The wait and the deadline's cut end on
    two timers; on asyncio, when the wait's ran first (or both in one tick of a busy
    loop), the refusal was counted as shed and its 503 dropped for the 504: ``shed``
    counted requests nobody refused (10 of 12; never on trio)."""
    import time

    from resilience.asgi import TimeoutMiddleware

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep(2)
        await ok_app(scope, receive, send)

    limited = ConcurrencyLimitMiddleware(slow, bulkhead=Bulkhead(1, max_wait=max_wait))
    stack = TimeoutMiddleware(limited, seconds=seconds)
    statuses: list[int] = []

    async def request() -> None:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            return await receive_nothing()

        await stack(http_scope(), receive, send)
        statuses.append(Result(sent).status)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(request)
            if busy:
                await anyio.sleep(0.2)
                time.sleep(0.2)  # the loop is busy across the deadline: both timers are due
    assert statuses == [504] * 12
    assert limited.shed == 0
