"""Key functions: client_ip through trusted hops only, header, api_key, route, user."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import resilience as rs
from resilience.asgi import api_key, client_ip, combine, digest, first, header, route, user
from resilience.errors import ConfigurationError

from ._support import http_scope

PROXY = "10.0.0.5"


def test_peer_is_the_key_without_trusted_proxies() -> None:
    """Forwarding headers are ignored unless a proxy is trusted."""
    key = client_ip()
    scope = http_scope(client=("198.51.100.1", 1), headers=[("x-forwarded-for", "1.1.1.1")])
    assert key(scope) == "ip:198.51.100.1"


def test_a_dual_stack_peer_is_keyed_by_its_ipv4_address() -> None:
    """A dual-stack socket reports IPv4 clients as IPv4-mapped IPv6 addresses: keyed as
    the IPv4 address (as the forwarded path reads them), so an IPv4-only server and a
    dual-stack one sharing Redis give that client one bucket."""
    key = client_ip()
    for peer in ("::ffff:198.51.100.1", "::FFFF:198.51.100.1", "198.51.100.1"):
        assert key(http_scope(client=(peer, 1))) == "ip:198.51.100.1"
    assert key(http_scope(client=("::ffff:c633:6401", 1))) == "ip:::ffff:c633:6401"


def test_spoofed_header_from_untrusted_peer_is_ignored() -> None:
    """A client that is not a trusted proxy cannot choose its key."""
    key = client_ip(trusted_proxies=[PROXY])
    scope = http_scope(client=("198.51.100.1", 1), headers=[("x-forwarded-for", "1.1.1.1")])
    assert key(scope) == "ip:198.51.100.1"


def test_trusted_proxy_header_gives_the_client() -> None:
    """Behind a trusted proxy the rightmost untrusted address is the client."""
    key = client_ip(trusted_proxies=[PROXY])
    scope = http_scope(client=(PROXY, 1), headers=[("x-forwarded-for", "1.1.1.1, 192.0.2.9")])
    assert key(scope) == "ip:192.0.2.9"


def test_walk_skips_every_trusted_hop_from_the_right() -> None:
    """Several trusted hops (CDN + load balancer) are skipped; spoofed entries stay left."""
    key = client_ip(trusted_proxies=["10.0.0.0/8", "172.16.0.0/12"])
    scope = http_scope(
        client=("10.1.1.1", 1),
        headers=[
            ("x-forwarded-for", "6.6.6.6, 192.0.2.9, 172.16.3.3"),
            ("x-forwarded-for", "10.2.2.2"),
        ],
    )
    assert key(scope) == "ip:192.0.2.9"


def test_all_trusted_chain_returns_leftmost_and_garbage_stops_the_walk() -> None:
    """An all-trusted chain yields its leftmost hop; a non-address stops at the last trusted hop."""
    key = client_ip(trusted_proxies=["10.0.0.0/8"])
    scope = http_scope(client=("10.0.0.1", 1), headers=[("x-forwarded-for", "10.9.9.9, 10.0.0.2")])
    assert key(scope) == "ip:10.9.9.9"
    scope = http_scope(client=("10.0.0.1", 1), headers=[("x-forwarded-for", "unknown, 10.0.0.2")])
    assert key(scope) == "ip:10.0.0.2"


def test_forwarded_header_rfc7239() -> None:
    """``Forwarded: for=`` nodes, quoted IPv6 with ports, several elements and lines."""
    key = client_ip(trusted_proxies=[PROXY, "2001:db8:cafe::17"], header="forwarded")
    scope = http_scope(
        client=(PROXY, 1),
        headers=[
            ("forwarded", 'for=1.1.1.1;proto=http, for="[2001:db8:cafe::17]:4711"'),
            ("forwarded", "for=10.0.0.5:8080;by=10.0.0.5"),
        ],
    )
    # 10.0.0.5 and 2001:db8:cafe::17 are trusted, so 1.1.1.1 is the client.
    assert key(scope) == "ip:1.1.1.1"
    scope = http_scope(client=(PROXY, 1), headers=[("x-forwarded-for", "9.9.9.9")])
    assert key(scope) == f"ip:{PROXY}", "with header='forwarded', X-Forwarded-For is ignored"


@pytest.mark.parametrize("inside", ["a;for=1.1.1.1", "a;for=_hidden", "x, for=1.1.1.1"])
def test_forwarded_for_inside_a_quoted_value_is_not_an_address(inside: str) -> None:
    """A trusted proxy quoting the client's Host (``host="..."``) before ``for=``: the
    text inside the quotes is the client's, and a ``for=`` in it must not become the
    key (it used to: the client could pick a fresh bucket per request)."""
    key = client_ip(trusted_proxies=[PROXY], header="forwarded")
    scope = http_scope(
        client=(PROXY, 1), headers=[("forwarded", f'host="{inside}";for=198.51.100.17')]
    )
    assert key(scope) == "ip:198.51.100.17"


def test_a_malformed_forwarded_element_stops_the_walk_at_the_proxy() -> None:
    """An element that is not a list of pairs, or names ``for=`` twice, gives no address:
    the key is the last trusted hop, not anything the element spells."""
    key = client_ip(trusted_proxies=[PROXY], header="forwarded")
    for value in ("for=1.1.1.1;for=2.2.2.2", "for=1.1.1.1 garbage=", 'for="1.1.1.1'):
        scope = http_scope(client=(PROXY, 1), headers=[("forwarded", value)])
        assert key(scope) == f"ip:{PROXY}", value


def test_ipv6_prefix_groups_a_network_and_mapped_ipv4_is_unwrapped() -> None:
    """``ipv6_prefix=64`` keys IPv6 clients by /64; IPv4-mapped addresses read as IPv4."""
    key = client_ip(ipv6_prefix=64)
    assert key(http_scope(client=("2001:db8:1:2:aaaa::1", 1))) == "ip:2001:db8:1:2::/64"
    assert key(http_scope(client=("2001:db8:1:2:bbbb::9", 1))) == "ip:2001:db8:1:2::/64"
    # A dual-stack socket's IPv4 peer: spelt as IPv4, as through a proxy.
    assert key(http_scope(client=("::ffff:192.0.2.1", 1))) == "ip:192.0.2.1"
    trusted = client_ip(trusted_proxies=[PROXY])
    scope = http_scope(client=(PROXY, 1), headers=[("x-forwarded-for", "::ffff:192.0.2.1")])
    assert trusted(scope) == "ip:192.0.2.1"


def test_unix_socket_peer() -> None:
    """No ``client`` (Unix socket): one shared key unless ``"unix"`` is trusted."""
    assert client_ip()(http_scope(client=None)) == "ip:unknown"
    key = client_ip(trusted_proxies=["unix"])
    scope = http_scope(client=None, headers=[("x-forwarded-for", "192.0.2.44")])
    assert key(scope) == "ip:192.0.2.44"


@pytest.mark.parametrize("unix_peer", [None, ("", 0), ("", "0")])
def test_a_unix_socket_peer_however_the_server_spells_it(unix_peer: Any) -> None:
    """granian spells a Unix-socket peer ``("", 0)`` where uvicorn and hypercorn give
    ``None``: either way it is no address. ``"unix"`` trusts it, so clients behind a
    same-host proxy are keyed apart (they all shared the key ``"ip:"``)."""
    behind_proxy = client_ip(trusted_proxies=["unix"])
    keys = {
        behind_proxy(http_scope(client=unix_peer, headers=[("x-forwarded-for", address)]))
        for address in ("203.0.113.1", "203.0.113.2")
    }
    assert keys == {"ip:203.0.113.1", "ip:203.0.113.2"}
    scope = http_scope(client=unix_peer)
    assert client_ip()(scope) == "ip:unknown"
    peer = client_ip()
    assert peer._digest is not None  # the middleware's one-step hashed key agrees
    assert peer._digest(scope) == digest("ip:unknown")


def test_bad_configuration_is_refused() -> None:
    """Unknown proxies, headers and prefixes fail at construction."""
    with pytest.raises(ConfigurationError, match="trusted_proxies"):
        client_ip(trusted_proxies=["not-an-ip"])
    with pytest.raises(ConfigurationError, match="header"):
        client_ip(header="x-real-ip")
    with pytest.raises(ConfigurationError, match="ipv6_prefix"):
        client_ip(ipv6_prefix=0)


ips = st.builds(lambda n: str(IPv4Address(n)), st.integers(0x0B000000, 0xDF000000))


@given(spoofed=st.lists(ips | st.sampled_from(["unknown", "garbage", ""]), max_size=5), real=ips)
def test_prefix_spoofing_never_changes_the_key(spoofed: list[str], real: str) -> None:
    """Whatever a client puts in X-Forwarded-For, the trusted proxy's entry decides."""
    key = client_ip(trusted_proxies=["10.0.0.0/8"])
    chain = ", ".join([*spoofed, real])
    scope = http_scope(client=("10.0.0.1", 1), headers=[("x-forwarded-for", chain)])
    assert key(scope) == f"ip:{real}"


def test_header_and_api_key() -> None:
    """Header keys are namespaced; api_key reads a header, a bearer scheme or a query param."""
    scope = http_scope(headers=[("X-Tenant", "acme"), ("authorization", "Bearer s3cret")])
    assert header("x-tenant")(scope) == "h:x-tenant:acme"
    assert header("x-missing")(scope) is None
    assert header("x-missing", default="anon")(scope) == "h:x-missing:anon"
    assert api_key("authorization", scheme="bearer")(scope) == "key:s3cret"
    assert api_key()(scope) is None
    assert api_key(query_param="api_key")(http_scope(query="a=1&api_key=k2")) == "key:k2"
    assert api_key("authorization", scheme="Basic")(scope) is None


def test_user_key() -> None:
    """``user()`` reads identity/username of scope["user"]; anonymous users have no key."""

    class Authenticated:
        is_authenticated = True
        username = "alice"

        @property
        def identity(self) -> str:
            raise NotImplementedError

    class Anonymous:
        is_authenticated = False

    assert user()(http_scope(user=Authenticated())) == "user:alice"
    assert user()(http_scope(user=Anonymous())) is None
    assert user()(http_scope()) is None
    assert user("principal")(http_scope(principal="bob")) == "user:bob"


def test_route_from_templates_and_from_starlette() -> None:
    """``route()`` keys by template, not raw path; unmatched paths share one key."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def endpoint(request: object) -> PlainTextResponse:
        return PlainTextResponse("x")

    key = route(["/items/{id}", "/static/*"])
    assert key(http_scope("/items/42")) == "route:GET /items/{id}"
    assert key(http_scope("/static/a/b.css")) == "route:GET /static/*"
    assert key(http_scope("/random/1")) == key(http_scope("/random/2"))

    app = Starlette(
        routes=[
            Route("/users/{user_id:int}", endpoint),
            Mount("/api", routes=[Route("/orders/{order}", endpoint, methods=["POST"])]),
        ]
    )
    key = route()
    assert key(http_scope("/users/7", app=app)) == "route:GET /users/{user_id}"
    assert (
        key(http_scope("/api/orders/9", method="POST", app=app)) == "route:POST /api/orders/{order}"
    )
    assert key(http_scope("/nope/1", app=app)) == "route:GET <unmatched>"


@pytest.mark.anyio
async def test_route_keys_hold_when_a_middleware_wraps_the_app_from_outside() -> None:
    """``RateLimitMiddleware(app, ...)`` around a Starlette app (the form the docs show
    for any ASGI app) runs before Starlette sets ``scope["app"]``: ``route()`` used to
    fall back to the raw path there, so ``/items/0`` .. ``/items/4`` each had a bucket
    and a per-endpoint limit never bit. Both middlewares now see the routes."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from resilience.asgi import ConcurrencyLimitMiddleware, RateLimitMiddleware

    async def endpoint(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    seen: list[str | None] = []
    keyed = client_ip() + route()

    def spy(scope: Any) -> str | None:
        seen.append(keyed(scope))
        return seen[-1]

    app = Starlette(routes=[Route("/items/{id}", endpoint)])
    limited = RateLimitMiddleware(app, limiter=rs.RateLimiter("2/hour"), key=keyed)
    shed = ConcurrencyLimitMiddleware(limited, bulkhead=rs.Bulkhead(4), key=spy)
    transport = httpx.ASGITransport(app=shed)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        statuses = [(await client.get(f"/items/{n}")).status_code for n in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    assert set(seen) == {"ip:127.0.0.1|route:GET /items/{id}"}


@pytest.mark.anyio
async def test_route_keys_hold_for_a_mounted_app_wrapped_from_outside() -> None:
    """A middleware around a Starlette sub-app mounted at ``/v2``: the parent app is in
    ``scope["app"]`` when the middleware runs, and its router knows no ``/a``; every
    endpoint used to share one ``<unmatched>`` bucket. Templates, like rules, match the
    path less the prefix the app is served under."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from resilience.asgi import RateLimitMiddleware

    async def endpoint(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    sub = Starlette(routes=[Route("/a", endpoint), Route("/b", endpoint)])
    limited = RateLimitMiddleware(sub, limiter=rs.RateLimiter("1/minute"), key=route())
    parent = Starlette(routes=[Mount("/v2", app=limited)])
    transport = httpx.ASGITransport(app=parent)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        statuses = [(await client.get(path)).status_code for path in ("/v2/a", "/v2/b", "/v2/a")]
    assert statuses == [200, 200, 429]

    key = route(["/items/{id}"])
    assert key(http_scope("/v2/items/1", root_path="/v2")) == "route:GET /items/{id}"


@pytest.mark.anyio
async def test_keying_leaves_the_scope_s_app_alone() -> None:
    """The wrapped app is handed to the key functions on a copy of the scope: what the
    scope holds is left as the server or a parent app set it (a middleware between ours
    and a mounted sub-app reads the parent in ``request.app``, as without ours; it used
    to find the sub-app there and miss the parent's state)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from resilience.asgi import ConcurrencyLimitMiddleware, RateLimitMiddleware

    seen: list[Any] = []

    async def endpoint(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    sub = Starlette(routes=[Route("/hello", endpoint)])

    async def spy(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get("app"))
        await sub(scope, receive, send)

    spy.app = sub  # type: ignore[attr-defined]  # a middleware, as scope_app_of follows
    keyed = client_ip() + route()
    limited = RateLimitMiddleware(spy, limiter=rs.RateLimiter("100/s"), key=keyed)
    shed = ConcurrencyLimitMiddleware(limited, bulkhead=rs.Bulkhead(4), key=keyed)
    parent = Starlette(routes=[Mount("/api", app=shed)])
    transport = httpx.ASGITransport(app=parent)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/api/hello")).status_code == 200
    assert seen == [parent]


def test_route_keys_the_endpoints_of_fastapi_included_routers_apart() -> None:
    """Recent FastAPI keeps an ``include_router()`` as one branch without a path of its
    own: ``route()`` gave every endpoint of every included router the key ``GET ``
    (one shared bucket). Each endpoint has its prefixed template again, nested routers
    included; a method the route does not take stays unmatched."""
    from fastapi import APIRouter, FastAPI

    app = FastAPI()
    users = APIRouter(prefix="/users")
    deep = APIRouter(prefix="/deep")
    orders = APIRouter()

    @users.get("/{uid}")
    def get_user(uid: str) -> str:
        return uid

    @users.post("/{uid}")
    def post_user(uid: str) -> str:
        return uid

    @deep.get("/x/{y:int}")
    def get_deep(y: int) -> int:
        return y

    @orders.get("/orders/{oid}")
    def get_order(oid: str) -> str:
        return oid

    @app.get("/items/{item_id}")
    def get_item(item_id: int) -> int:
        return item_id

    users.include_router(deep)
    app.include_router(users, prefix="/api/v1")
    app.include_router(orders, prefix="/api/v1")
    key = route()
    cases = {
        ("GET", "/api/v1/users/a"): "route:GET /api/v1/users/{uid}",
        ("POST", "/api/v1/users/b"): "route:POST /api/v1/users/{uid}",
        ("GET", "/api/v1/users/deep/x/3"): "route:GET /api/v1/users/deep/x/{y}",
        ("GET", "/api/v1/orders/1"): "route:GET /api/v1/orders/{oid}",
        ("GET", "/items/1"): "route:GET /items/{item_id}",
        ("DELETE", "/api/v1/users/a"): "route:DELETE <unmatched>",
        ("GET", "/nope"): "route:GET <unmatched>",
    }
    for (method, path), expected in cases.items():
        assert key(http_scope(path, method=method, app=app)) == expected


def test_composition() -> None:
    """``+`` combines parts, ``|`` falls back; plain callables compose too."""
    scope = http_scope("/items/1", headers=[("x-api-key", "k")])
    both = client_ip() + route(["/items/{id}"])
    assert both(scope) == "ip:203.0.113.7|route:GET /items/{id}"
    fallback = api_key() | client_ip()
    assert fallback(scope) == "key:k"
    assert fallback(http_scope()) == "ip:203.0.113.7"
    custom = first(lambda s: None, lambda s: "custom")
    assert custom(scope) == "custom"
    assert combine(header("x-none"), client_ip())(scope) == "|ip:203.0.113.7"
    assert "client_ip" in repr(fallback)


def test_digest_is_stable_and_opaque() -> None:
    """Keys are hashed to 32 hex chars, stably, without the raw value."""
    assert digest("ip:203.0.113.7") == digest("ip:203.0.113.7")
    assert digest("ip:203.0.113.7") != digest("ip:203.0.113.8")
    assert len(digest("key:" + "x" * 10_000)) == 32
    assert "203" not in digest("ip:203.0.113.7")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "client",
    [
        ("203.0.113.7", 5000),
        ("2001:db8::1", 443),
        ("::ffff:203.0.113.8", 5000),
        None,
        ("", 0),
        ("unknown", 0),
    ],
)
async def test_the_default_key_reaches_the_limiter_as_the_digest_of_the_peer(
    client: tuple[str, int] | None,
) -> None:
    """The middleware's default key takes a shortcut to its digest (one lookup by
    peer address); what reaches the limiter is still ``digest(client_ip()(scope))``,
    the key users pass to ``reset()``, for every peer, twice (memoised the second time)."""
    from resilience.asgi import RateLimitMiddleware

    from ._support import call, ok_app

    scope = http_scope()
    scope["client"] = client
    limiter = rs.RateLimiter("2/minute")
    middleware = RateLimitMiddleware(ok_app, limiter=limiter)
    expected = digest(client_ip()(scope) or "")
    for remaining in (1, 0):
        assert (await call(middleware, dict(scope))).status == 200
        assert limiter.try_acquire(key=expected, cost=0).remaining == remaining


@pytest.mark.parametrize(
    "build",
    [
        lambda: rs.asgi.header(""),
        lambda: rs.asgi.header("bad name"),
        lambda: rs.asgi.header(5),  # type: ignore[arg-type]
        lambda: rs.asgi.header("x-tenant", default=5),  # type: ignore[arg-type]
        lambda: rs.asgi.api_key(""),
        lambda: rs.asgi.api_key("authorization", scheme=""),
        lambda: rs.asgi.api_key(query_param=5),  # type: ignore[arg-type]
        lambda: rs.asgi.user(""),
        lambda: rs.asgi.user(5),  # type: ignore[arg-type]
        lambda: rs.asgi.client_ip(trusted_proxies="10.0.0.0/8"),  # type: ignore[arg-type]
        lambda: rs.asgi.client_ip(trusted_proxies=None),  # type: ignore[arg-type]
        lambda: rs.asgi.combine(rs.asgi.client_ip(), sep=5),  # type: ignore[arg-type]
        lambda: rs.asgi.header_priority(minimum=0.5),  # type: ignore[arg-type]
        lambda: rs.asgi.header_priority(minimum=10, maximum=0),
        lambda: rs.asgi.header_priority(classes={"x": 2.7}),  # type: ignore[dict-item]
        lambda: rs.asgi.header_priority(classes=None),  # type: ignore[arg-type]
    ],
)
def test_key_and_priority_functions_refuse_what_could_never_match(build: Any) -> None:
    """A header name no request can carry, or an argument that fails per request, is a
    ConfigurationError when the function is built (it used to leave every request
    unlimited, silently, or fail each request with a 500)."""
    with pytest.raises(rs.ConfigurationError):
        build()


def test_a_trailing_space_in_the_scheme_is_ignored() -> None:
    """``scheme="Bearer "`` keys bearer tokens like ``scheme="Bearer"`` (it matched none)."""
    key = rs.asgi.api_key("authorization", scheme="Bearer ")
    scope = {"type": "http", "headers": [(b"authorization", b"Bearer abc")]}
    assert key(scope) == "key:abc"


def test_route_with_one_template_string() -> None:
    """``route("/items/{id}")`` is one template, not one template per character."""
    key = rs.asgi.route("/items/{id}")
    assert key({"type": "http", "method": "GET", "path": "/items/3"}) == "route:GET /items/{id}"


def test_a_forwarded_header_built_to_backtrack_is_read_in_linear_time() -> None:
    """A run of spaces not followed by ``;`` made the pair pattern backtrack
    quadratically (12 KB: 1.3 s per request, from any client behind a proxy that
    passes Forwarded on). 96 KB is read in one pass; the address is still right."""
    import time

    key = client_ip(trusted_proxies=["10.0.0.0/8"], header="forwarded")
    value = "for=1.2.3.4" + " " * 96_000 + "x, for=203.0.113.9"
    scope = http_scope(client=("10.0.0.1", 1), headers=[("forwarded", value)])
    started = time.perf_counter()
    assert key(scope) == "ip:203.0.113.9"
    # Escaped quotes with no closing quote, or ending in a lone backslash, made every
    # quote rescan the rest (16 KB: 2.3 s and 4 s). A quote left open makes only its
    # own element unreadable: the element the proxy appended after it is read.
    for garbage in ('for="' + '\\"' * 48_000, '"\\' * 48_000):
        value = garbage + ", for=198.51.100.7"
        scope = http_scope(client=("10.0.0.1", 1), headers=[("forwarded", value)])
        assert key(scope) == "ip:198.51.100.7"
    assert time.perf_counter() - started < 2.0  # loose: minutes before, milliseconds now
    padded = 'for = "[2001:db8::1]:80"  ;proto=https, for=192.0.2.60  '
    scope = http_scope(client=("10.0.0.1", 1), headers=[("forwarded", padded)])
    assert key(scope) == "ip:192.0.2.60"


def test_long_keys_and_paths_are_not_memoised() -> None:
    """The digest memo and the route cache count entries, not bytes: 8192 distinct
    16 KB API keys held 122 MiB per worker. Keys and paths longer than 256
    characters are hashed (looked up) every time instead."""
    from resilience.asgi import _keys

    long_key = "k" * 16_384
    before = dict(_keys._DIGESTS)
    assert _keys.cached_digest(long_key) == digest(long_key)
    assert long_key not in _keys._DIGESTS
    assert _keys._DIGESTS.keys() >= before.keys()
    by_route = route(["/items/{id}"])
    long_path = "/items/" + "x" * 16_384 + "/y"
    assert by_route(http_scope(long_path)) == "route:GET <unmatched>"
    assert by_route(http_scope("/items/7")) == "route:GET /items/{id}"


def test_head_is_keyed_as_the_get_endpoint_it_runs() -> None:
    """``route()`` keys HEAD as GET: Starlette answers HEAD with the GET endpoint, so a
    HEAD request must spend that endpoint's quota (it had a bucket of its own, which
    doubled it)."""
    by_route = route(["/report"])
    assert by_route(http_scope("/report", method="HEAD")) == by_route(http_scope("/report"))


class LazyKey:
    """A sync key object whose attribute lookups raise (an unbound LocalProxy)."""

    def __call__(self, scope: Any) -> str:
        return "k"

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"not bound yet ({name})")


def test_a_key_object_with_misbehaving_attributes_works_in_the_middlewares() -> None:
    """The key's display name falls back to its type when reading ``__name__`` raises
    (building the middleware raised the proxy's RuntimeError)."""
    from resilience.asgi import ConcurrencyLimitMiddleware, RateLimitMiddleware, Rule

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    RateLimitMiddleware(app, limiter=rs.RateLimiter("1/min"), key=LazyKey())
    ConcurrencyLimitMiddleware(app, bulkhead=rs.Bulkhead(1), key=LazyKey())
    RateLimitMiddleware(app, limiter=rs.RateLimiter("1/min"), rules=[Rule("/x", key=LazyKey())])


def test_a_quote_a_client_left_open_does_not_swallow_the_proxys_element() -> None:
    """``Forwarded: for="`` from a client, then the proxy's ``, for=<client>``: the
    client is keyed by the address the proxy wrote (an unclosed quote swallowed the
    proxy's element, and the client joined the proxy's shared bucket at will). A
    quoted comma inside a closed string stays in its element."""
    key = client_ip(trusted_proxies=[PROXY], header="forwarded")
    for sent in ('for="x', 'for="x, for="y', 'host="a,b";for=1.2.3.4', '"', 'x="'):
        for appended, client in (
            ("for=203.0.113.7", "ip:203.0.113.7"),
            ('for="[2001:db8::7]:4711"', "ip:2001:db8::7"),  # RFC 7239's quoted form
            ('for="203.0.113.7:4711"', "ip:203.0.113.7"),
        ):
            value = f"{sent}, {appended}"
            scope = http_scope(client=(PROXY, 1), headers=[("forwarded", value)])
            assert key(scope) == client, value
    quoted = 'for="[2001:db8::1]:80", for=192.0.2.43'
    scope = http_scope(client=(PROXY, 1), headers=[("forwarded", quoted)])
    assert key(scope) == "ip:192.0.2.43"


def test_head_to_a_head_only_route_keeps_that_routes_key() -> None:
    """HEAD is keyed as GET only where a GET endpoint answers it: a HEAD-only route
    (a health probe) keeps its own key, not the ``<unmatched>`` one every scanner's
    404 shares."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def ok(request: Any) -> Response:
        return Response("")

    app = Starlette(routes=[Route("/healthz", ok, methods=["HEAD"]), Route("/items/{id}", ok)])
    by_route = route()
    assert by_route(http_scope("/healthz", method="HEAD", app=app)) == "route:HEAD /healthz"
    assert by_route(http_scope("/items/1", method="HEAD", app=app)) == "route:GET /items/{id}"
