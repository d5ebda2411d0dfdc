"""IETF RateLimit field formatting, problem+json bodies and rule matching."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilience.asgi import (
    QUOTA_EXCEEDED,
    Problem,
    RateLimitHeaders,
    Rule,
    format_policy,
    format_ratelimit,
    quota_and_window,
    retry_after_value,
)
from resilience.asgi._rules import Matcher, compile_pattern, path_predicate
from resilience.errors import ConfigurationError

from ._support import http_scope


def fake_limiter(amount: int, period: float, burst: int) -> SimpleNamespace:
    return SimpleNamespace(rate=SimpleNamespace(amount=amount, period=period), burst=burst)


def decision(
    allowed: bool, remaining: int, retry_after: float, reset_after: float
) -> SimpleNamespace:
    return SimpleNamespace(
        allowed=allowed, remaining=remaining, retry_after=retry_after, reset_after=reset_after
    )


def test_field_syntax_follows_the_draft() -> None:
    """``"name";q=..;w=..`` and ``"name";r=..;t=..`` with sf-string names."""
    assert format_policy("default", 100, 60) == '"default";q=100;w=60'
    assert format_ratelimit("default", 42, 6.2) == '"default";r=42;t=7'
    assert format_ratelimit('a"b', 0, 0) == '"a\\"b";r=0;t=0'
    with pytest.raises(ConfigurationError, match="printable ASCII"):
        format_policy("caf\u00e9", 1, 1)


def test_quota_and_window_are_integers() -> None:
    """Fractional periods are scaled to whole seconds."""
    assert quota_and_window(5, 1.0) == (5, 1)
    assert quota_and_window(100, 60) == (100, 60)
    assert quota_and_window(10, 0.1) == (100, 1)
    assert quota_and_window(3, 2.5) == (2, 2)


def test_retry_after_rounds_up_to_at_least_one_second() -> None:
    """A client that waits Retry-After seconds is admitted: never round down."""
    assert retry_after_value(0.01) == b"1"
    assert retry_after_value(1.0) == b"1"
    assert retry_after_value(1.0001) == b"2"
    assert retry_after_value(None) == b"1"


@given(st.floats(0, 10_000, allow_nan=False))
def test_reset_is_never_earlier_than_the_state(seconds: float) -> None:
    """``t`` and ``Retry-After`` are >= the true delay (rounded up to whole seconds)."""
    t = int(format_ratelimit("x", 0, seconds).rsplit("t=", 1)[1])
    assert t + 1e-6 >= seconds
    assert int(retry_after_value(seconds)) + 1e-6 >= seconds


def test_header_modes() -> None:
    """ietf, legacy, both and none render the expected fields from a decision."""
    limiter = fake_limiter(5, 1.0, 5)
    admitted = decision(True, 3, 0.0, 0.4)
    ietf = RateLimitHeaders("default", limiter, "ietf").admitted(admitted)
    assert list(ietf) == [
        (b"ratelimit-policy", b'"default";q=5;w=1'),
        (b"ratelimit", b'"default";r=3;t=1'),
    ]
    legacy = RateLimitHeaders("default", limiter, "legacy").admitted(admitted)
    assert legacy == [
        (b"x-ratelimit-limit", b"5"),
        (b"x-ratelimit-remaining", b"3"),
        (b"x-ratelimit-reset", b"1"),
    ]
    assert len(RateLimitHeaders("default", limiter, "both").admitted(admitted)) == 5
    none = RateLimitHeaders("default", limiter, None)
    assert not none.enabled
    assert none.admitted(admitted) == []
    refused = RateLimitHeaders("default", limiter, "ietf").refused(decision(False, 0, 2.5, 3.0))
    assert refused[1] == (b"ratelimit", b'"default";r=0;t=3')
    with pytest.raises(ConfigurationError, match="headers"):
        RateLimitHeaders("default", limiter, "draft-7")


@given(
    rate=st.sampled_from(["5/s", "10/5s", "1000/s", "3/h"]),
    burst=st.integers(1, 50),
    mode=st.sampled_from(["ietf", "both", "legacy"]),
    data=st.data(),
)
def test_fields_for_a_fill_are_the_fields_of_its_state(
    rate: str, burst: int, mode: str, data: st.DataObject
) -> None:
    """The middleware's one-call path from take_one's fill renders exactly what
    admitted_values renders for the Decision's (remaining, reset_after)."""
    from resilience import RateLimiter

    limiter = RateLimiter(rate, burst=burst)
    gcra = limiter._buckets.gcra  # type: ignore[union-attr]
    # One emission is the fill after one token from a full bucket (precomputed).
    fill = data.draw(
        st.one_of(
            st.just(gcra.emission), st.integers(gcra.emission, gcra.tolerance + gcra.emission)
        )
    )
    headers = RateLimitHeaders("default", limiter, mode)
    for_fill = headers.for_fill(gcra)
    want = list(
        RateLimitHeaders("default", limiter, mode).admitted_values(*gcra.admitted_state(fill))
    )
    assert list(for_fill(fill)) == want
    assert list(for_fill(fill)) == want  # again (no state kept between calls)


@pytest.mark.anyio
async def test_problem_response_is_complete_problem_json() -> None:
    """The refusal is one start + one body message with a valid RFC 9457 document."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    problem = Problem(429, QUOTA_EXCEEDED, "quota", extra={"violated-policies": ["default"]})
    await problem.send(send, [(b"retry-after", b"3")])
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 429
    assert headers[b"content-type"] == b"application/problem+json"
    assert headers[b"retry-after"] == b"3"
    document = json.loads(body["body"])
    assert document == {
        "type": QUOTA_EXCEEDED,
        "title": "quota",
        "status": 429,
        "violated-policies": ["default"],
    }
    assert int(headers[b"content-length"]) == len(body["body"])
    assert body.get("more_body", False) is False


def test_patterns() -> None:
    """Templates, convertors, globs and regexes compile to full matches."""
    assert compile_pattern("/items/{id}").fullmatch("/items/42")
    assert not compile_pattern("/items/{id}").fullmatch("/items/42/x")
    assert compile_pattern("/files/{p:path}").fullmatch("/files/a/b/c")
    assert not compile_pattern("/n/{n:int}").fullmatch("/n/x")
    assert compile_pattern("/static/*").fullmatch("/static/css/a.css")
    assert compile_pattern("/a.b").fullmatch("/a.b")
    assert not compile_pattern("/a.b").fullmatch("/axb")
    assert compile_pattern(re.compile(r"/v\d+/.*")).fullmatch("/v2/x")
    # {u:uuid} like Starlette's convertor: with or without the dashes.
    uuid = compile_pattern("/i/{u:uuid}")
    assert uuid.fullmatch("/i/0a1b2c3d-0000-1111-2222-333344445555")
    assert uuid.fullmatch("/i/0a1b2c3d000011112222333344445555")
    assert not uuid.fullmatch("/i/0a1b2c3d")
    with pytest.raises(ConfigurationError, match="convertor"):
        compile_pattern("/x/{y:nope}")


def test_matcher_first_rule_wins_with_methods_and_scopes() -> None:
    """Declaration order decides, methods and scope types filter."""
    rules = [
        Rule("/items/*", methods=["post"], cost=5),
        Rule("/items/special", cost=2),
        Rule("/items/{id}", cost=1),
        Rule("/ws", scopes=("websocket",), cost=3),
    ]
    matcher = Matcher(rules, allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope("/items/special", method="POST")) == (0, rules[0])
    assert matcher.match(http_scope("/items/special")) == (1, rules[1])
    assert matcher.match(http_scope("/items/7")) == (2, rules[2])
    assert matcher.match(http_scope("/ws")) is None
    assert matcher.match({"type": "websocket", "path": "/ws"}) == (3, rules[3])
    assert matcher.scope_types == {"http", "websocket"}


def test_matcher_rejects_options_the_middleware_does_not_read() -> None:
    """A TimeoutMiddleware rule with ``cost=`` is a configuration error."""
    with pytest.raises(ConfigurationError, match="cost"):
        Matcher([Rule("/x", cost=2)], allowed={"seconds"}, owner="TimeoutMiddleware")
    with pytest.raises(ConfigurationError, match="Rule"):
        Matcher(["/x"], allowed={"seconds"}, owner="TimeoutMiddleware")  # type: ignore[list-item]


def test_a_lone_method_string_is_one_method() -> None:
    """``methods="POST"`` means POST, not the letters P, O, S and T."""
    rule = Rule("/login", methods="post", cost=2)
    assert rule.methods == ("post",)
    matcher = Matcher([rule], allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope("/login", method="POST")) == (0, rule)
    assert matcher.match(http_scope("/login")) is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"path": ""}, "path pattern"),
        ({"path": "/x", "methods": []}, "methods"),
        ({"path": "/x", "methods": ["GET", 7]}, "methods"),
        ({"path": "/x", "scopes": ("websockets",)}, "scopes"),
        ({"path": "/x", "scopes": ("lifespan",)}, "scopes"),
        ({"path": "/x", "scopes": ()}, "scopes"),
        ({"path": "/x", "exempt": "yes"}, "exempt"),
        ({"path": "/x/{y:nope}"}, "convertor"),
        ({"path": "/ws", "scopes": ("websocket",), "methods": ["POST"]}, "websocket handshake"),
    ],
)
def test_rules_that_could_never_match_are_refused(options: dict[str, Any], named: str) -> None:
    """Typos in a rule fail when it is built, not by silently never matching (a
    websocket-only rule for POST left the websocket route unlimited)."""
    with pytest.raises(ConfigurationError, match=named):
        Rule(**options)
    Rule("/ws", scopes=("websocket",), methods=["get"])  # the handshake's GET matches
    # A stray space or lower case still names the method (" GET" passed the check above
    # and never matched).
    matcher = Matcher([Rule("/login", methods=["POST "])], allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope("/login", method="POST")) is not None


def test_exempt_predicate() -> None:
    """Exact paths use a set lookup, patterns a regex."""
    assert path_predicate([]) is None
    exact = path_predicate(["/healthz"])
    assert exact is not None
    assert exact("/healthz")
    assert not exact("/healthz/x")
    mixed = path_predicate(["/healthz", "/static/*"])
    assert mixed is not None
    assert mixed("/static/x.js")
    assert not mixed("/api")


@pytest.mark.parametrize("pattern", ["items", "/a/{id", "items/*"])
def test_a_path_pattern_that_could_never_match_is_refused(pattern: str) -> None:
    """A pattern without its leading slash (scope paths always have one) or with an
    unbalanced brace matched nothing, silently: refused when the rule is built."""
    with pytest.raises(ConfigurationError, match="pattern"):
        Rule(pattern)


@pytest.mark.anyio
async def test_patterns_match_the_path_under_the_root_path() -> None:
    """A middleware on a mounted sub-app, or on an app behind ``uvicorn --root-path``,
    sees the whole path in ``scope["path"]`` and the prefix in ``root_path``. Its
    patterns are written like the app's routes, so they match the path less the prefix:
    ``/v2/healthz`` was rate limited despite ``exempt=["/healthz"]``, a rule for
    ``/login`` fell back to the default limiter, and ``Rule("/events", seconds=None)``
    no longer spared the stream its timeout."""
    import resilience as rs
    from resilience.asgi import (
        ConcurrencyLimitMiddleware,
        RateLimitMiddleware,
        Rule,
        TimeoutMiddleware,
        route_path,
    )

    from ._support import call, http_scope, ok_app

    assert route_path(http_scope("/v2/healthz", root_path="/v2")) == "/healthz"
    assert route_path(http_scope("/v2", root_path="/v2")) == "/"
    assert route_path(http_scope("/v2x/a", root_path="/v2")) == "/v2x/a"  # not under it
    assert route_path(http_scope("/healthz", root_path="/v2")) == "/healthz"  # stripped

    login = rs.RateLimiter("5/minute", name="login")
    limited = RateLimitMiddleware(
        ok_app,
        limiter=rs.RateLimiter("1/hour", name="api"),
        exempt=["/healthz"],
        rules=[Rule("/login", limiter=login)],
    )
    for _ in range(3):
        result = await call(limited, http_scope("/v2/healthz", root_path="/v2"))
        assert result.status == 200
        assert result.header("ratelimit") is None
    result = await call(limited, http_scope("/v2/login", root_path="/v2"))
    assert result.header("ratelimit-policy") == '"login";q=5;w=60'

    entered, release = anyio.Event(), anyio.Event()

    async def busy_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/busy":
            entered.set()
            await release.wait()
        await ok_app(scope, receive, send)

    shedding = ConcurrencyLimitMiddleware(busy_app, bulkhead=rs.Bulkhead(1), exempt=["/healthz"])
    async with anyio.create_task_group() as group:
        group.start_soon(call, shedding, http_scope("/busy"))
        await entered.wait()  # the one slot is taken
        assert (await call(shedding, http_scope("/v2/healthz", root_path="/v2"))).status == 200
        assert (await call(shedding, http_scope("/v2/other", root_path="/v2"))).status == 503
        release.set()

    async def slow_stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await anyio.sleep(0.02)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    timed = TimeoutMiddleware(slow_stream, seconds=0.01, rules=[Rule("/events", seconds=None)])
    result = await call(timed, http_scope("/v2/events", root_path="/v2"))
    assert result.body == b"xxx"


def _starlette_routes_to(template: str, path: str) -> bool:
    """Whether Starlette routes ``path`` to a route of ``template``."""
    from starlette.routing import Match, Route

    route = Route(template, lambda request: None)
    return route.matches({"type": "http", "path": path, "method": "GET"})[0] is Match.FULL


@pytest.mark.parametrize(
    ("rule", "template", "path"),
    [
        ("/login", "/login", "/login\n"),
        ("/admin/*", "/admin/{name}", "/admin/a\nb"),
        ("/admin/*", "/admin/{name}", "/admin/x\n"),
        ("/items/{id:int}", "/items/{id:int}", "/items/7\n"),
        ("/users/{name}", "/users/{name}", "/users/\n"),
        ("/users/{name}", "/users/{name}", "/users/\n\n"),
    ],
)
def test_a_request_starlette_routes_to_a_rules_endpoint_meets_the_rule(
    rule: str, template: str, path: str
) -> None:
    """Starlette's route regexes end in ``$`` (which matches before a final newline) and
    its segments take newlines: ``POST /login%0A`` reaches the /login endpoint. The
    rule must match it too (it fell back to the default limit)."""
    assert _starlette_routes_to(template, path)
    matcher = Matcher([Rule(rule, cost=5)], allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope(path)) is not None
    exempt = path_predicate([rule])
    assert exempt is not None
    assert exempt(path)


@pytest.mark.parametrize(
    ("template", "path"),
    [("/users/{name}", "/users/"), ("/login", "/login\n\n"), ("/a/{n:int}", "/a/7\nx")],
)
def test_a_request_starlette_routes_elsewhere_does_not_meet_the_rule(
    template: str, path: str
) -> None:
    """Matching follows Starlette both ways: no rule for a path its route rejects."""
    assert not _starlette_routes_to(template, path)
    matcher = Matcher([Rule(template, cost=5)], allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope(path)) is None


@pytest.mark.parametrize(
    "pattern",
    [
        "/*/{id}/*",
        "/*/{id}/*/{sub}/*.json",
        "/{a:path}/x/*",
        "/*/{rest:path}",
        "/static/*.{ext}",
        "/x/*{id}",
        "/files/*-{id}.json",
        "/{id}*",
    ],
)
def test_unbounded_parts_apart_from_each_other_are_refused(pattern: str) -> None:
    """Stars (or ``{name:path}``) with other parts between them backtrack into each
    other: ``/*/{id}/*/{sub}/*.json`` took 1.7 s against a 4 KB path, growing with its
    cube; a star in a parameter's segment (``/static/*.{ext}``) took 0.6 s at 8 KB.
    Such a pattern is refused when built; stars in one run of text are fine."""
    with pytest.raises(ConfigurationError, match="polynomial"):
        compile_pattern(pattern)
    assert compile_pattern("/a/*/b/*/c").fullmatch("/a/x/b/y/c")
    assert compile_pattern("/users/{id}/*").fullmatch("/users/7/posts/1")
    assert compile_pattern("/static/*/{name}.css").fullmatch("/static/a/b/site.css")


def test_a_compiled_pattern_meets_a_final_newline_too() -> None:
    """A rule or exempt entry given as a compiled ``re.Pattern`` matches the path with
    one final newline more, as the string patterns and Starlette's ``$`` do
    (``/api/v1/login%0A`` escaped a compiled rule and exempt entry)."""
    login = re.compile(r"/api/v[12]/login")
    matcher = Matcher([Rule(login, cost=5)], allowed={"cost"}, owner="Test")
    assert matcher.match(http_scope("/api/v1/login\n")) is not None
    assert matcher.match(http_scope("/api/v1/login\n\n")) is None
    exempt = path_predicate([login])
    assert exempt is not None
    assert exempt("/api/v2/login\n")
    assert compile_pattern(re.compile(r"(?i)/A")).fullmatch("/a\n")


def test_a_get_rule_covers_head() -> None:
    """Starlette answers HEAD with the GET endpoint: a GET rule limits HEAD too (HEAD
    ran the endpoint under the default limit)."""
    matcher = Matcher([Rule("/search", methods=["GET"], cost=5)], allowed={"cost"}, owner="T")
    assert matcher.match(http_scope("/search", method="HEAD")) is not None
    assert matcher.match(http_scope("/search", method="POST")) is None


glob_text = st.text(alphabet="ab/*\n", max_size=8).map(lambda t: "/" + t)
paths = st.text(alphabet="ab/\n", max_size=12).map(lambda t: "/" + t)


def _glob_matches(pattern: str, path: str) -> bool:
    """The reference: ``*`` is any text (newlines too), everything else literal."""
    if not pattern:
        return not path
    if pattern[0] == "*":
        return any(_glob_matches(pattern[1:], path[i:]) for i in range(len(path) + 1))
    return bool(path) and path[0] == pattern[0] and _glob_matches(pattern[1:], path[1:])


@given(pattern=glob_text, path=paths)
def test_globs_match_exactly_what_a_star_means(pattern: str, path: str) -> None:
    """The linear-time glob regex (atomic groups) matches exactly the paths the
    definition of ``*`` does, and like Starlette's ``$`` a path with one final newline
    more."""
    expected = _glob_matches(pattern, path) or (
        path.endswith("\n") and _glob_matches(pattern, path[:-1])
    )
    assert (compile_pattern(pattern).fullmatch(path) is not None) == expected


def test_many_stars_against_a_long_path_take_linear_time() -> None:
    """``/a/*/b/*/c/*/d`` against a 24 KB path built to make ``.*`` backtrack: it held
    the event loop 5 s at 6 KB (polynomial in the length); now it is one pass. The
    bound is loose on purpose: a few milliseconds against the minutes it took."""
    import time

    pattern = compile_pattern("/a/*/b/*/c/*/d")
    path = "/a/" + "/b//c/" * 4000 + "x"
    started = time.perf_counter()
    assert pattern.fullmatch(path) is None
    assert time.perf_counter() - started < 2.0
