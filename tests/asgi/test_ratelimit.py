"""RateLimitMiddleware in process: headers, refusals, rules, shadow mode, pass-through."""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.asgi import (
    QUOTA_EXCEEDED,
    RateLimitMiddleware,
    Rule,
    ShadowRejected,
    client_ip,
    digest,
    header,
    route,
)
from resilience.backends import MemoryBackend, RedisBackend
from resilience.errors import ConfigurationError
from resilience.ratelimit import RateLimiter
from resilience.testing import FakeClock, free_port

from ._support import call, http_scope, ok_app

pytestmark = pytest.mark.anyio

CLIENT = "203.0.113.7"


def limiter_5s(clock: FakeClock, **kwargs: Any) -> RateLimiter:
    return RateLimiter("5/s", clock=clock, **kwargs)


async def test_sixth_request_is_refused_with_matching_headers() -> None:
    """5/s: five pass with RateLimit fields counting down, the sixth gets 429 whose
    Retry-After, RateLimit and RateLimit-Policy match the limiter; after Retry-After
    the next request passes."""
    clock = FakeClock()
    limiter = limiter_5s(clock)
    app = RateLimitMiddleware(ok_app, limiter=limiter)
    for remaining in (4, 3, 2, 1, 0):
        result = await call(app, http_scope())
        assert result.status == 200
        assert result.body == b"ok"
        assert result.header("ratelimit-policy") == '"default";q=5;w=1'
        assert result.header("ratelimit") == f'"default";r={remaining};t=1'
        assert result.header("content-type") == "text/plain", "the app's own headers stay"
    refused = await call(app, http_scope())
    assert refused.status == 429
    assert refused.header("retry-after") == "1"
    assert refused.header("ratelimit-policy") == '"default";q=5;w=1'
    assert refused.header("ratelimit") == '"default";r=0;t=1'
    assert refused.header("content-type") == "application/problem+json"
    document = json.loads(refused.body)
    assert document["type"] == QUOTA_EXCEEDED
    assert document["status"] == 429
    assert document["violated-policies"] == ["default"]
    # The headers describe the limiter's own state for this (hashed) key.
    peek = limiter.try_acquire(key=digest(f"ip:{CLIENT}"), cost=0)
    assert peek.remaining == 0
    assert peek.reset_after == pytest.approx(1.0)
    clock.advance(float(refused.header("retry-after") or 0))
    again = await call(app, http_scope())
    assert again.status == 200
    assert limiter.statistics().rejected == 1


async def test_other_clients_have_their_own_bucket() -> None:
    """One client's exhaustion does not refuse another client."""
    app = RateLimitMiddleware(ok_app, limiter=RateLimiter("1/minute", clock=FakeClock()))
    assert (await call(app, http_scope(client=("192.0.2.1", 1)))).status == 200
    assert (await call(app, http_scope(client=("192.0.2.1", 1)))).status == 429
    assert (await call(app, http_scope(client=("192.0.2.2", 1)))).status == 200


async def test_header_modes_and_policy_name() -> None:
    """legacy / both / none, and the limiter's own name as the policy name."""
    clock = FakeClock()
    legacy = RateLimitMiddleware(ok_app, limiter=limiter_5s(clock), headers="legacy")
    result = await call(legacy, http_scope())
    assert result.header("x-ratelimit-limit") == "5"
    assert result.header("x-ratelimit-remaining") == "4"
    assert result.header("x-ratelimit-reset") == "1"
    assert result.header("ratelimit") is None
    both = RateLimitMiddleware(ok_app, limiter=limiter_5s(clock, name="api"), headers="both")
    result = await call(both, http_scope())
    assert result.header("ratelimit") == '"api";r=4;t=1'
    assert result.header("x-ratelimit-limit") == "5"
    none = RateLimitMiddleware(ok_app, limiter=limiter_5s(clock), headers="none", policy_name="x")
    result = await call(none, http_scope())
    assert result.header("ratelimit") is None
    assert result.header("x-ratelimit-limit") is None
    minute = RateLimitMiddleware(ok_app, limiter=RateLimiter("100/minute", burst=10, clock=clock))
    result = await call(minute, http_scope())
    assert result.header("ratelimit-policy") == '"default";q=100;w=60'
    assert result.header("ratelimit") == '"default";r=9;t=1'


async def test_keys_are_hashed_before_the_limiter() -> None:
    """The limiter sees a digest, never the raw IP (unless hash_keys=False)."""
    clock = FakeClock()
    limiter = limiter_5s(clock)
    await call(RateLimitMiddleware(ok_app, limiter=limiter), http_scope())
    assert limiter.try_acquire(key=digest(f"ip:{CLIENT}"), cost=0).remaining == 4
    assert limiter.try_acquire(key=f"ip:{CLIENT}", cost=0).remaining == 5
    raw = limiter_5s(clock)
    await call(RateLimitMiddleware(ok_app, limiter=raw, hash_keys=False), http_scope())
    assert raw.try_acquire(key=f"ip:{CLIENT}", cost=0).remaining == 4


async def test_shadow_mode_counts_but_never_refuses() -> None:
    """Shadow mode: every request passes, without headers; would-be refusals are counted."""
    clock = FakeClock()
    app = RateLimitMiddleware(ok_app, limiter=limiter_5s(clock), shadow=True)
    events: list[rs.Event] = []
    app.add_listener(events.append)
    results = [await call(app, http_scope()) for _ in range(8)]
    assert [r.status for r in results] == [200] * 8
    assert all(r.header("ratelimit") is None for r in results)
    assert app.statistics()["shadow_rejected"] == 3
    assert app.statistics()["rejected"] == 0
    shadow = [e for e in events if isinstance(e, ShadowRejected)]
    assert len(shadow) == 3
    assert [type(e).__name__ for e in events] == ["RequestAdmitted"] * 5 + ["ShadowRejected"] * 3
    assert shadow[0].policy == "RateLimiter", "events carry the limiter's name"
    assert shadow[0].key == digest(f"ip:{CLIENT}")


async def test_metrics_line_up_with_the_limiter() -> None:
    """With a metrics adapter installed, admissions (middleware) and rejections
    (limiter) are counted under the limiter's name."""
    from resilience.observability import PrometheusMetrics

    metrics = PrometheusMetrics().install()
    try:
        limiter = RateLimiter("2/s", clock=FakeClock(), name="api")
        app = RateLimitMiddleware(ok_app, limiter=limiter)
        for _ in range(3):
            await call(app, http_scope())
    finally:
        metrics.uninstall()
    text = metrics.exposition().decode()
    assert 'resilience_decisions_total{outcome="admitted",policy="api"} 2.0' in text
    assert 'resilience_decisions_total{outcome="rejected",policy="api"} 1.0' in text


async def test_exempt_paths_predicate_and_missing_keys() -> None:
    """Exempt paths, the predicate and a None key all skip limiting (no headers)."""
    clock = FakeClock()
    limiter = RateLimiter("1/minute", clock=clock)
    app = RateLimitMiddleware(
        ok_app,
        limiter=limiter,
        exempt=["/healthz", "/static/*"],
        exempt_when=lambda scope: scope["method"] == "OPTIONS",
    )
    for _ in range(3):
        for scope in (
            http_scope("/healthz"),
            http_scope("/static/app.js"),
            http_scope("/api", method="OPTIONS"),
        ):
            result = await call(app, scope)
            assert result.status == 200
            assert result.header("ratelimit") is None
    assert limiter.statistics().admitted == 0
    keyed = RateLimitMiddleware(ok_app, limiter=limiter, key=header("x-tenant"))
    for _ in range(3):
        assert (await call(keyed, http_scope())).status == 200


async def test_per_route_rules_with_own_limiters_costs_and_keys() -> None:
    """Rules override limiter, cost, key and policy name; first match wins."""
    clock = FakeClock()
    default = RateLimiter("100/s", clock=clock)
    login = RateLimiter("2/minute", clock=clock, name="login")
    app = RateLimitMiddleware(
        ok_app,
        limiter=default,
        rules=[
            Rule("/login", methods=["POST"], limiter=login),
            Rule("/search/{q}", cost=40, policy_name="search"),
            Rule("/tenant/*", key=header("x-tenant")),
            Rule("/public/*", exempt=True),
        ],
    )
    statuses = [(await call(app, http_scope("/login", method="POST"))).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    refused = await call(app, http_scope("/login", method="POST"))
    assert refused.header("ratelimit-policy") == '"login";q=2;w=60'
    assert json.loads(refused.body)["violated-policies"] == ["login"]
    assert (await call(app, http_scope("/login"))).status == 200, "GET is not the POST rule"
    search = await call(app, http_scope("/search/cats"))
    assert search.header("ratelimit") == '"search";r=59;t=1'  # 100 - 1 (GET /login) - 40
    a = await call(app, http_scope("/tenant/x", headers=[("x-tenant", "a")]))
    assert a.header("ratelimit") == '"default";r=99;t=1', "tenant a has its own bucket"
    for _ in range(5):
        assert (await call(app, http_scope("/public/x"))).header("ratelimit") is None


async def test_cost_function() -> None:
    """``cost`` may depend on the request."""
    clock = FakeClock()
    app = RateLimitMiddleware(
        ok_app,
        limiter=RateLimiter("10/s", clock=clock),
        cost=lambda scope: 4 if scope["method"] == "POST" else 1,
    )
    assert (await call(app, http_scope(method="POST"))).header("ratelimit") == '"default";r=6;t=1'
    assert (await call(app, http_scope())).header("ratelimit") == '"default";r=5;t=1'


@pytest.mark.parametrize("shadow", [False, True])
async def test_a_request_costing_more_than_the_burst_is_refused_not_an_error(
    shadow: bool,
) -> None:
    """A cost function returning more than the burst (say, from a query parameter) gets
    that request a 429 without Retry-After (waiting never helps), never a server error;
    in shadow mode it is counted and let through. Cheaper requests are unaffected."""
    app = RateLimitMiddleware(
        ok_app,
        limiter=RateLimiter("10/s", clock=FakeClock()),
        cost=lambda scope: int(scope["query_string"] or b"1"),
        shadow=shadow,
    )
    costly = await call(app, http_scope(query="11"))
    if shadow:
        assert costly.status == 200
        assert app.statistics()["shadow_rejected"] == 1
    else:
        assert costly.status == 429
        assert costly.header("retry-after") is None
        problem = json.loads(costly.body)
        assert problem["type"].endswith("quota-exceeded")
        assert "costs 11" in problem["detail"]
        assert app.statistics()["rejected"] == 1
    assert (await call(app, http_scope(query="10"))).status == 200


async def test_a_cost_function_bug_is_not_taken_for_a_costly_request() -> None:
    """Only a valid cost above the burst is refused with a 429: a cost function returning
    a float or a negative number is a bug of the app, and fails loudly as before."""
    for bad in (2.0, -1):
        app = RateLimitMiddleware(
            ok_app, limiter=RateLimiter("10/s", clock=FakeClock()), cost=lambda scope, c=bad: c
        )
        with pytest.raises(ConfigurationError):
            await call(app, http_scope())


async def test_configuration_errors() -> None:
    """Missing limiter, unknown rule options and bad costs fail at construction."""
    with pytest.raises(ConfigurationError, match="limiter"):
        RateLimitMiddleware(ok_app)
    with pytest.raises(ConfigurationError, match="seconds"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), rules=[Rule("/x", seconds=1)])
    with pytest.raises(ConfigurationError, match="limiter"):
        RateLimitMiddleware(ok_app, rules=[Rule("/x", cost=2)])
    with pytest.raises(ConfigurationError, match="cost"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), cost=-1)
    with pytest.raises(ConfigurationError, match="headers"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), headers="draft")
    with pytest.raises(ConfigurationError, match="limiter"):
        RateLimitMiddleware(ok_app, limiter=object())
    # A cost above the burst could never be admitted: every request would fail.
    with pytest.raises(ConfigurationError, match="exceeds the burst"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("5/s"), cost=10)
    with pytest.raises(ConfigurationError, match="exceeds the burst"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("5/s"), rules=[Rule("/x", cost=6)])
    # Not iterable: a TypeError from inside used to say so.
    with pytest.raises(ConfigurationError, match="exempt must be a list"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), exempt=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="rules must be a list"):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), rules=5)  # type: ignore[arg-type]


async def test_one_rule_or_one_exempt_path_needs_no_list() -> None:
    """``rules=Rule(...)`` is one rule, as ``exempt="/healthz"`` is one path (a lone Rule
    failed with "'Rule' object is not iterable")."""
    app = RateLimitMiddleware(
        ok_app,
        limiter=RateLimiter("1/hour", clock=FakeClock()),
        rules=Rule("/login", limiter=RateLimiter("5/minute", name="login", clock=FakeClock())),  # type: ignore[arg-type]
        exempt="/healthz",
    )
    login = await call(app, http_scope("/login"))
    assert login.header("ratelimit-policy") == '"login";q=5;w=60'
    for _ in range(3):
        assert (await call(app, http_scope("/healthz"))).status == 200


def test_a_middleware_or_transport_name_that_is_not_a_str_is_refused() -> None:
    """A name labels events and metrics: ``name=5`` fails when built, not in an exporter
    later; ``None`` means the class's own name."""
    from resilience.asgi import ConcurrencyLimitMiddleware, TimeoutMiddleware
    from resilience.httpx import ResilientTransport

    builders: list[Any] = [
        lambda name: RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), name=name),
        lambda name: ConcurrencyLimitMiddleware(ok_app, bulkhead=rs.Bulkhead(2), name=name),
        lambda name: TimeoutMiddleware(ok_app, seconds=1, name=name),
        lambda name: ResilientTransport(name=name),
    ]
    for build in builders:
        with pytest.raises(ConfigurationError, match="name must be a str"):
            build(5)
        assert build(None).name == type(build(None)).__name__
        assert build("edge").name == "edge"


async def test_only_rules_limit_when_there_is_no_default_limiter() -> None:
    """With rules only, unmatched requests pass untouched."""
    app = RateLimitMiddleware(ok_app, rules=[Rule("/x", limiter=RateLimiter("1/minute"))])
    assert (await call(app, http_scope("/y"))).header("ratelimit") is None
    assert (await call(app, http_scope("/x"))).status == 200
    assert (await call(app, http_scope("/x"))).status == 429


async def test_streaming_is_not_buffered_and_bodies_are_not_read() -> None:
    """Each message reaches the server as the app sends it; ``receive`` is untouched."""
    clock = FakeClock()
    sent: list[dict[str, Any]] = []
    second_chunk = anyio.Event()
    seen_before_second: list[int] = []

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        seen_before_second.append(len(sent))
        await second_chunk.wait()
        await send({"type": "http.response.body", "body": b"two"})

    async def receive() -> dict[str, Any]:
        raise AssertionError("the middleware must not read the request body")

    async def send(message: Any) -> None:
        sent.append(message)

    app = RateLimitMiddleware(streaming, limiter=limiter_5s(clock))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.__call__, http_scope(), receive, send)
            while not seen_before_second:
                await anyio.sleep(0)
            second_chunk.set()
    assert seen_before_second == [2], "start and first chunk were forwarded immediately"
    assert [m.get("body") for m in sent[1:]] == [b"one", b"two"]
    assert (b"ratelimit", b'"default";r=4;t=1') in sent[0]["headers"]


async def test_shared_header_lists_are_not_mutated() -> None:
    """An app re-sending the same header list does not accumulate rate-limit fields."""
    shared = [(b"content-type", b"text/plain")]

    async def app_with_shared_headers(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": shared})
        await send({"type": "http.response.body", "body": b""})

    app = RateLimitMiddleware(app_with_shared_headers, limiter=limiter_5s(FakeClock()))
    await call(app, http_scope())
    await call(app, http_scope())
    assert shared == [(b"content-type", b"text/plain")]


async def test_a_shared_start_message_is_not_mutated() -> None:
    """An app sending one prebuilt start message on every request: each response has
    one pair of fields (they used to pile up in the app's own dict, one pair more per
    request, and the dict grew for good)."""
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]}

    async def app_with_one_start(scope: Any, receive: Any, send: Any) -> None:
        await send(start)
        await send({"type": "http.response.body", "body": b""})

    app = RateLimitMiddleware(app_with_one_start, limiter=limiter_5s(FakeClock()))
    for _ in range(3):
        response = await call(app, http_scope())
        assert [name for name, _ in response.headers].count("ratelimit") == 1
    assert start["headers"] == [(b"x-app", b"1")]


async def test_websocket_and_lifespan_pass_through_untouched() -> None:
    """Non-HTTP scopes reach the app with the very same callables, unlimited."""
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    limiter = RateLimiter("1/minute", clock=FakeClock())
    middleware = RateLimitMiddleware(app, limiter=limiter)

    async def receive() -> dict[str, Any]:
        return {}

    async def send(message: Any) -> None:
        pass

    for scope in ({"type": "websocket", "path": "/ws", "client": ("1.2.3.4", 1)},) * 3 + (
        {"type": "lifespan"},
    ):
        await middleware(scope, receive, send)
        assert seen[-1] == (scope, receive, send)
    assert limiter.statistics().admitted == 0


WEBSOCKET_SCOPE = {"type": "websocket", "path": "/ws", "client": ("1.2.3.4", 1), "headers": []}


async def _accepting_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "websocket.accept"})


async def _connect() -> dict[str, Any]:
    return {"type": "websocket.connect"}


def _one_handshake_a_minute() -> RateLimitMiddleware:
    """A middleware that admits one websocket handshake on /ws a minute."""
    limiter = RateLimiter("1/minute", clock=FakeClock())
    return RateLimitMiddleware(
        _accepting_app, limiter=limiter, rules=[Rule("/ws", scopes=("websocket",))]
    )


async def test_websocket_rule_refuses_handshakes() -> None:
    """A rule naming websocket limits handshakes: 429 via the HTTP-response extension,
    else close code 1013, after the accept (a close before it reaches the client as an
    HTTP 403, a refusal for good)."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = _one_handshake_a_minute()
    await middleware(dict(WEBSOCKET_SCOPE), _connect, send)
    assert sent[-1] == {"type": "websocket.accept"}
    sent.clear()
    await middleware(dict(WEBSOCKET_SCOPE), _connect, send)
    assert sent == [{"type": "websocket.accept"}, {"type": "websocket.close", "code": 1013}]
    extended = {**WEBSOCKET_SCOPE, "extensions": {"websocket.http.response": {}}}
    await middleware(extended, _connect, send)
    assert sent[-2]["type"] == "websocket.http.response.start"
    assert sent[-2]["status"] == 429
    assert (b"retry-after", b"60") in sent[-2]["headers"]


async def test_websocket_refusal_on_a_server_that_refuses_close_code_1013() -> None:
    """daphne (autobahn) lets a server close only with 1000 or 3000-4999 and raises on
    1013, having sent nothing: the refusal closes with 4429 (4000 + the HTTP status)
    instead of raising out of the middleware (the client got 1011, the server logged
    an application error)."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        code = message.get("code", 1000)
        if message["type"] == "websocket.close" and not (code == 1000 or 3000 <= code <= 4999):
            raise Exception(f"invalid close code {code} (must be 1000 or from [3000, 4999])")
        sent.append(message)

    middleware = _one_handshake_a_minute()
    await middleware(dict(WEBSOCKET_SCOPE), _connect, send)
    sent.clear()
    await middleware(dict(WEBSOCKET_SCOPE), _connect, send)
    assert sent == [{"type": "websocket.accept"}, {"type": "websocket.close", "code": 4429}]


async def test_backend_failure_follows_on_backend_error() -> None:
    """A dead Redis: ``closed`` answers 503 (shadow: passes), ``open`` admits,
    ``local`` limits in process."""
    url = f"redis://127.0.0.1:{free_port()}/0"

    def limiter(mode: str) -> RateLimiter:
        return RateLimiter("1/minute", backend=RedisBackend.from_url(url), on_backend_error=mode)

    closed = RateLimitMiddleware(ok_app, limiter=limiter("closed"))
    result = await call(closed, http_scope())
    assert result.status == 503
    assert result.header("retry-after") == "1"
    assert "temporary-reduced-capacity" in json.loads(result.body)["type"]
    assert closed.statistics()["backend_errors"] == 1
    shadow = RateLimitMiddleware(ok_app, limiter=limiter("closed"), shadow=True)
    assert (await call(shadow, http_scope())).status == 200
    opened = RateLimitMiddleware(ok_app, limiter=limiter("open"))
    assert [(await call(opened, http_scope())).status for _ in range(3)] == [200] * 3
    local = RateLimitMiddleware(ok_app, limiter=limiter("local"))
    assert [(await call(local, http_scope())).status for _ in range(2)] == [200, 429]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_100k_client_keys_stay_bounded_by_the_cap(anyio_backend: str) -> None:
    """100,000 distinct clients: the limiter keeps at most max_keys buckets and the
    process does not grow with the number of clients."""
    clock = FakeClock()
    cap = 1_000
    limiter = RateLimiter("1/minute", clock=clock, backend=MemoryBackend(max_keys=cap))
    app = RateLimitMiddleware(ok_app, limiter=limiter, key=client_ip(trusted_proxies=["10.0.0.1"]))
    sink: list[Any] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("unused")

    async def send(message: Any) -> None:
        sink.append(message)

    base = http_scope(client=("10.0.0.1", 1))

    async def run(first: int, count: int) -> None:
        for n in range(first, first + count):
            scope = dict(base)
            scope["headers"] = [
                (b"x-forwarded-for", f"11.{n >> 16}.{(n >> 8) & 255}.{n & 255}".encode())
            ]
            await app(scope, receive, send)
            sink.clear()

    await run(0, 20_000)
    gc.collect()
    blocks_after_20k = sys.getallocatedblocks()
    await run(20_000, 80_000)
    gc.collect()
    grown = sys.getallocatedblocks() - blocks_after_20k
    stats = limiter.statistics()
    assert stats.keys is not None
    assert stats.keys <= cap
    assert stats.admitted + stats.rejected == 100_000, "every request was decided"
    # A per-client leak would leave >= 80,000 blocks (one string per key at least).
    assert grown < 10_000, f"{grown} memory blocks more after 80,000 further clients"


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_redis_replicas_share_buckets_under_hashed_keys(
    anyio_backend: str, redis_server: Any
) -> None:
    """Two replicas on one Redis share each client's bucket (one script call per request),
    and Redis never sees the raw client address."""

    def replica() -> RateLimitMiddleware:
        backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
        return RateLimitMiddleware(ok_app, limiter=RateLimiter("3/minute", backend=backend))

    first, second = replica(), replica()
    redis_server.reset_stats()
    statuses = [(await call(app, http_scope())).status for app in (first, second, first, second)]
    assert statuses == [200, 200, 200, 429]
    stats = redis_server.commandstats()
    assert stats.get("evalsha") == 4, stats  # one decision per request
    keys = redis_server.command("KEYS", "*")
    assert keys, "the buckets live in Redis"
    assert not any(
        CLIENT.encode() in (k if isinstance(k, bytes) else str(k).encode()) for k in keys
    )


class _Named(RateLimiter):
    """A subclass overriding no acquisition method."""


@pytest.mark.parametrize("cost", [1, 2])
@pytest.mark.parametrize("kind", [RateLimiter, _Named], ids=["class", "plain-subclass"])
async def test_each_request_is_one_decision_in_the_metrics(
    cost: int, kind: type[RateLimiter]
) -> None:
    """The middleware reports an admission once (RequestAdmitted), whichever path the
    limiter takes (the lean one for cost 1, a full decision for cost 2); the limiter's
    own CallAdmitted is not added on top, so the decisions counter is not doubled. A
    subclass overriding no acquisition method counts the same (it used to be doubled)."""
    from resilience.observability import samples

    limiter = kind("4/s", name="api")
    app = RateLimitMiddleware(ok_app, limiter=limiter, cost=cost)
    outcomes: list[str] = []

    def count(event: rs.Event) -> None:
        outcomes.extend(
            labels[1] for s, _, labels in samples(event) if s.name == "resilience.decisions"
        )

    rs.add_listener(count)
    try:
        statuses = [(await call(app, http_scope())).status for _ in range(4 // cost + 1)]
    finally:
        rs.remove_listener(count)
    assert statuses == [200] * (4 // cost) + [429]
    assert outcomes == ["admitted"] * (4 // cost) + ["rejected"]


class _SyncSpy(RateLimiter):
    keys: list[object]

    def try_acquire(self, key: Any = None, cost: int = 1) -> Any:
        self.keys.append(key)
        return super().try_acquire(key, cost)


class _AsyncSpy(RateLimiter):
    keys: list[object]

    async def try_acquire_async(self, key: Any = None, cost: int = 1) -> Any:
        self.keys.append(key)
        return await super().try_acquire_async(key, cost)


@pytest.mark.parametrize("spy", [_SyncSpy, _AsyncSpy], ids=["try_acquire", "try_acquire_async"])
async def test_a_limiter_subclass_is_called_through_its_own_methods(
    spy: type[_SyncSpy | _AsyncSpy],
) -> None:
    """A RateLimiter subclass overriding either acquisition method sees every decision,
    with the hashed key (the lean paths are kept for the exact class); an in-memory
    limiter overriding only the async method used to be bypassed."""
    keys: list[object] = []
    limiter = spy("100/s")
    limiter.keys = keys
    app = RateLimitMiddleware(ok_app, limiter=limiter)
    assert (await call(app, http_scope(client=("203.0.113.9", 1)))).status == 200
    assert len(keys) == 1
    assert "203.0.113.9" not in str(keys[0])


@pytest.mark.parametrize("flag", ["shadow", "hash_keys"])
def test_flags_must_be_booleans(flag: str) -> None:
    """``shadow="no"`` is a mistake that bool() would read as True: refused."""
    with pytest.raises(ConfigurationError, match=flag):
        RateLimitMiddleware(ok_app, limiter=RateLimiter("1/s"), **{flag: "no"})


@pytest.mark.parametrize("rule_key", [None, client_ip()])
async def test_forgetting_a_clients_failed_logins_resets_the_key_the_rule_uses(
    rule_key: Any,
) -> None:
    """docs/migrating.md's "N failed logins" recipe: after a success the app resets
    the login limiter's bucket of this client, the digest of the key the login rule
    uses (its own ``key=``, else the middleware's ``client_ip() + route()``), and the
    client may log in again at once."""
    login_limiter = RateLimiter("2/minute", clock=FakeClock(), name="login")
    used_key = rule_key if rule_key is not None else client_ip() + route()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["query_string"] == b"ok=1":
            login_limiter.reset(digest(used_key(scope)))
        await ok_app(scope, receive, send)

    middleware = RateLimitMiddleware(
        app,
        limiter=RateLimiter("100/minute", clock=FakeClock()),
        key=client_ip() + route(),
        rules=[
            Rule("/login", methods=["POST"], limiter=login_limiter)
            if rule_key is None
            else Rule("/login", methods=["POST"], limiter=login_limiter, key=rule_key)
        ],
    )
    statuses = [
        (await call(middleware, http_scope("/login", method="POST", query=query))).status
        for query in ("", "ok=1", "", "")
    ]
    assert statuses == [200, 200, 200, 200]
