"""ConcurrencyLimitMiddleware(max_loop_lag=...): shedding while the event loop lags.

The lag is the real event loop's (how late it runs what is due), so these tests hold
the loop with ``time.sleep`` as a CPU-bound burst would; nothing waits for a policy.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.asgi import REDUCED_CAPACITY, ConcurrencyLimitMiddleware, Rule
from resilience.errors import ConfigurationError

from ._support import call, http_scope, ok_app

pytestmark = pytest.mark.anyio

#: The bound under test, and a stall well past it.
BOUND = 0.05
STALL = 0.25


def _hold_loop() -> None:
    """Keep the event loop from running anything, as CPU-bound requests would."""
    time.sleep(STALL)


def _middleware(**options: Any) -> ConcurrencyLimitMiddleware:
    return ConcurrencyLimitMiddleware(ok_app, bulkhead=rs.Bulkhead(8), **options)


async def _admitted_again(app: ConcurrencyLimitMiddleware) -> int:
    """Requests until one is admitted (the loop keeping time again), at most 2 s."""
    with anyio.fail_after(2):
        tries = 1
        while (await call(app, http_scope())).status != 200:
            tries += 1
            await anyio.sleep(BOUND / 5)
        return tries


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_request_right_after_a_stall_is_shed_with_503(anyio_backend: str) -> None:
    """The loop held five times past the bound: the next request is refused at once
    with 503, Retry-After and a temporary-reduced-capacity problem saying why, counted
    in shed and shed_by_lag, and it never took a slot of the bulkhead."""
    bulkhead = rs.Bulkhead(8)
    app = ConcurrencyLimitMiddleware(ok_app, bulkhead=bulkhead, max_loop_lag=BOUND, retry_after=3)
    assert (await call(app, http_scope())).status == 200  # the probe starts
    _hold_loop()
    refused = await call(app, http_scope())
    assert refused.status == 503
    assert refused.header("retry-after") == "3"
    problem = json.loads(refused.body)
    assert problem["type"] == REDUCED_CAPACITY
    assert "behind" in problem["detail"]
    assert (app.shed, app.shed_by_lag) == (1, 1)
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.rejected) == (0, 0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_requests_pass_again_once_the_loop_keeps_time(anyio_backend: str) -> None:
    """After the stall, requests are admitted as soon as the probe has run on time
    again (within a few periods), and each refusal until then was counted."""
    app = _middleware(max_loop_lag=BOUND)
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    tries = await _admitted_again(app)
    assert tries >= 2  # the first one after the stall was shed
    assert app.shed_by_lag == tries - 1
    assert (await call(app, http_scope())).status == 200


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stall_after_a_quiet_spell_is_still_seen(anyio_backend: str) -> None:
    """A request in flight that waits (on a database, say) with no other request
    coming, then holds the loop: the requests served after it are shed all the same
    (the probe kept measuring through the quiet spell)."""
    app = _middleware(max_loop_lag=BOUND)
    assert (await call(app, http_scope())).status == 200
    await anyio.sleep(0.1)  # four probe periods without a request
    _hold_loop()
    assert (await call(app, http_scope())).status == 503


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_idle_server_stops_measuring_until_the_next_request(anyio_backend: str) -> None:
    """After twenty periods without a request the probe stops (an idle server is not
    woken); the next request starts it afresh and, not having seen what came before,
    is admitted; a stall after that is seen again."""
    app = _middleware(max_loop_lag=0.01)  # a 5 ms period: idle after 0.1 s
    assert (await call(app, http_scope())).status == 200
    await anyio.sleep(0.3)
    _hold_loop()
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    assert (await call(app, http_scope())).status == 503


def test_each_event_loop_has_its_own_probe() -> None:
    """One middleware serving requests on two event loops (two threads) measures each:
    a stall on one loop is seen there though the other loop served a request between,
    and the other loop, which kept time, is not shed."""
    import asyncio
    import threading

    app = _middleware(max_loop_lag=BOUND)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    threads = [threading.Thread(target=loop.run_forever, daemon=True) for loop in loops]
    for thread in threads:
        thread.start()

    async def request(stall: bool) -> int | None:
        if stall:
            _hold_loop()
        return (await call(app, http_scope())).status

    def on(index: int, stall: bool = False) -> int | None:
        future = asyncio.run_coroutine_threadsafe(request(stall), loops[index])
        return future.result(timeout=5)

    try:
        assert [on(0), on(1)] == [200, 200]
        assert on(0, stall=True) == 503
        assert on(1) == 200
    finally:
        for loop, thread in zip(loops, threads, strict=True):
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_at_the_deadline_of_a_timeout_outside_it_is_that_timeouts_504(
    anyio_backend: str,
) -> None:
    """A request whose TimeoutMiddleware deadline ran out in the stall is answered with
    that middleware's 504, not shed with a 503 (nothing counted shed), as for a wait for
    a slot cut at the deadline."""
    from resilience.asgi import TimeoutMiddleware

    limited = _middleware(max_loop_lag=BOUND)

    async def stall_then_limited(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/stall":
            _hold_loop()
        await limited(scope, receive, send)

    app = TimeoutMiddleware(stall_then_limited, seconds=0.1)
    assert (await call(app, http_scope())).status == 200
    assert (await call(app, http_scope("/stall"))).status == 504
    assert (limited.shed, limited.shed_by_lag) == (0, 0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_listener_that_raises_leaves_the_counters_in_step(anyio_backend: str) -> None:
    """A listener raising a BaseException on the refusal ends the request, but the
    refusal was counted in both shed and shed_by_lag first."""
    app = _middleware(max_loop_lag=BOUND)

    def interrupt(event: rs.Event) -> None:
        if isinstance(event, rs.CallRejected):
            raise KeyboardInterrupt

    app.add_listener(interrupt)
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    with pytest.raises(KeyboardInterrupt):
        await call(app, http_scope())
    assert (app.shed, app.shed_by_lag) == (1, 1)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_exempt_requests_are_not_shed_by_lag(anyio_backend: str) -> None:
    """A health check exempted by path or by rule still answers while the loop lags."""
    app = _middleware(max_loop_lag=BOUND, exempt=["/healthz"], rules=[Rule("/ready", exempt=True)])
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    assert (await call(app, http_scope("/healthz"))).status == 200
    assert (await call(app, http_scope("/ready"))).status == 200
    assert (await call(app, http_scope("/"))).status == 503


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_lag_is_not_measured_unless_asked(anyio_backend: str) -> None:
    """Without max_loop_lag (the default) a stall sheds nothing."""
    app = _middleware()
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    assert (await call(app, http_scope())).status == 200
    assert (app.shed, app.shed_by_lag) == (0, 0)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_trio_lag_is_not_measured(anyio_backend: str) -> None:
    """trio has no asyncio loop to measure: max_loop_lag sheds nothing there."""
    app = _middleware(max_loop_lag=BOUND)
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    assert (await call(app, http_scope())).status == 200


@pytest.mark.parametrize("bad", [0, -0.1, float("nan"), float("inf"), "0.1", True])
def test_max_loop_lag_must_be_a_positive_number(bad: Any) -> None:
    """A bound that cannot work is refused at construction, not per request."""
    with pytest.raises(ConfigurationError, match="max_loop_lag"):
        _middleware(max_loop_lag=bad)


def test_the_repr_shows_the_bound() -> None:
    """The configuration is visible where the middleware is printed."""
    assert "max_loop_lag=0.05" in repr(_middleware(max_loop_lag=0.05))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_refusal_by_lag_is_reported_as_the_middlewares_call_rejected(
    anyio_backend: str,
) -> None:
    """Listeners see each refusal by lag as a CallRejected named after the middleware
    (the bulkhead refused nothing), with the Retry-After it sent."""
    app = _middleware(max_loop_lag=BOUND, name="api-shed", retry_after=2)
    events: list[rs.Event] = []
    app.add_listener(events.append)
    assert (await call(app, http_scope())).status == 200
    _hold_loop()
    assert (await call(app, http_scope())).status == 503
    rejected = [e for e in events if isinstance(e, rs.CallRejected)]
    assert [(e.policy, e.retry_after) for e in rejected] == [("api-shed", 2.0)]
