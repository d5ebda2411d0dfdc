"""Key functions: which bucket (or which concurrency domain) a request belongs to.

A key function takes the ASGI scope and returns a string, or ``None`` when the request
has no such key (no API key header, anonymous user): the middleware then leaves it
unlimited, so compose with a fallback (``api_key() | client_ip()``) when that matters.

Keys are combined with ``+`` (all parts: per client *and* route) and ``|`` (the first
that exists). Every key is prefixed by its kind (``ip:``, ``key:``, ``route:``...) and
the middleware hashes it (BLAKE2b, 128 bits) before it reaches a limiter or backend, so
raw IP addresses and API keys are never stored in Redis.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any
from urllib.parse import parse_qsl

from .._validate import TOKEN as _TOKEN
from .._validate import check_header_name, check_predicate
from ..errors import ConfigurationError
from ._types import Scope

__all__ = [
    "Key",
    "KeyFunction",
    "api_key",
    "client_ip",
    "combine",
    "digest",
    "first",
    "header",
    "route",
    "user",
]

KeyFunction = Callable[[Scope], str | None]
"""What a middleware accepts as ``key=``: a :class:`Key` or any ``scope -> str | None``."""


class Key:
    """A composable key function: ``key(scope) -> str | None``.

    ``a + b`` keys by both (``client_ip() + route()``: per client per route);
    ``a | b`` uses ``a`` and falls back to ``b`` when ``a`` is ``None``
    (``api_key() | client_ip()``: per API key, anonymous callers per IP).

    Example::

        key = rs.asgi.api_key() | rs.asgi.client_ip(trusted_proxies=["10.0.0.0/8"])
        RateLimitMiddleware(app, limiter=limiter, key=key)
    """

    __slots__ = ("_digest", "func", "name")

    def __init__(self, func: KeyFunction, name: str) -> None:
        self.func: KeyFunction = func
        self.name = name
        # ``scope -> digest(func(scope))`` in one step, where a key knows a faster way
        # than hashing its own result (None: hash what ``func`` returns).
        self._digest: KeyFunction | None = None

    def __call__(self, scope: Scope) -> str | None:
        """The key of the request described by ``scope`` (``None``: no key)."""
        return self.func(scope)

    def __add__(self, other: KeyFunction) -> Key:
        return combine(self, other)

    def __or__(self, other: KeyFunction) -> Key:
        return first(self, other)

    def __radd__(self, other: KeyFunction) -> Key:
        return combine(other, self)

    def __ror__(self, other: KeyFunction) -> Key:
        return first(other, self)

    def __repr__(self) -> str:
        return self.name


def _as_key(func: KeyFunction) -> Key:
    if isinstance(func, Key):
        return func
    if not callable(func):
        raise ConfigurationError(f"key must be a key function (scope -> str | None), got {func!r}")
    check_predicate("key", func, gives="the key")  # a coroutine per request: no key at all
    try:
        name = str(getattr(func, "__name__", None) or repr(func))
    except Exception:  # a proxy whose attributes misbehave
        name = type(func).__name__
    return Key(func, name)


_DIGESTS: dict[str, str] = {}
_DIGESTS_MAX = 8192
#: Longer keys (and paths) are hashed (looked up) every time instead of memoised: a
#: memo counted in entries would otherwise hold 8192 attacker-sized 16 KB keys.
_MEMO_KEY_MAX = 256


def cached_digest(key: str) -> str:
    """:func:`digest` through a small bounded memo (cleared when full): repeat clients
    skip the hash. Bounded in entries and in their size, so attacker-chosen keys
    cannot grow it."""
    value = _DIGESTS.get(key)
    if value is None:
        value = _blake2b(key)
        if len(key) <= _MEMO_KEY_MAX:
            _remember(_DIGESTS, key, value)
    return value


def _remember(memo: dict[Any, str], key: Any, value: str) -> None:
    """Store in a digest memo, cleared when full: attacker-chosen keys cannot grow it."""
    if len(memo) >= _DIGESTS_MAX:
        memo.clear()
    memo[key] = value


_PEER_DIGESTS: dict[str | None, str] = {}


def _peer_digest(scope: Scope) -> str:
    """``cached_digest(peer(scope))`` for the socket-peer key of :func:`client_ip`,
    memoised by the peer address itself: the middleware's default key, one lookup."""
    client = scope.get("client")
    # granian on a Unix socket reports ("", 0): no peer address, like None
    host: str | None = (client[0] or None) if client else None
    value = _PEER_DIGESTS.get(host)
    if value is None:
        # Straight to the hash: this memo is the one that serves these keys again.
        if host is None:
            value = _blake2b("ip:unknown")
        else:  # (an IPv4 address, the usual peer, skips the call)
            value = _blake2b("ip:" + (host if ":" not in host else _unmapped(host)))
        _remember(_PEER_DIGESTS, host, value)
    return value


def _unmapped(host: str) -> str:
    """A peer address as the key names it: an IPv4-mapped IPv6 address (a dual-stack
    socket's IPv4 client, ``::ffff:192.0.2.7``) as its IPv4 address, as the forwarded
    path reads it, so an IPv4-only and a dual-stack server share that client's bucket."""
    if host[:7].lower() == "::ffff:" and "." in host:
        return host[7:]
    return host


def digest(key: str) -> str:
    """The 128-bit BLAKE2b hex digest of ``key``: what reaches limiters and backends.

    Stable across processes and machines (no per-process salt), so every replica of a
    service shares the same Redis buckets.

    Example::

        >>> len(rs.asgi.digest("ip:203.0.113.7"))
        32
    """
    return _blake2b(key)


def _blake2b(key: str) -> str:
    """The 128-bit BLAKE2b hex digest of ``key`` in UTF-8, undecodable bytes
    (``surrogateescape``) as they were.

    A lone surrogate no bytes stand for (``"\\ud800"`` from a JSON claim) is hashed
    too, instead of failing the request: in its ``surrogatepass`` encoding, under a
    personalization of its own, since those bytes are also what ``surrogateescape``
    gives another key (every byte string is some key's).
    """
    try:
        data = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = key.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, digest_size=16, person=b"surrogatepass").hexdigest()
    hasher = _BLAKE2B_16.copy()  # a third cheaper than building one (no option parsing)
    hasher.update(data)
    return hasher.hexdigest()


_BLAKE2B_16 = hashlib.blake2b(digest_size=16)


# -- client_ip ---------------------------------------------------------------------------


#: One ``name=value`` pair of a Forwarded element; the value a token or a quoted-string.
#: The value is taken greedily and stripped in code: a lazy value before ``\s*`` made a
#: long run of spaces not followed by ``;`` cost quadratic time (12 KB: 1.3 s).
_PAIR = re.compile(r'\s*([^=;"\s]+)\s*=\s*("(?:[^"\\]|\\.)*"\s*|[^;"]*)(?:;|$)')


def _parse_node(token: str) -> IPv4Address | IPv6Address | None:
    """An address from an X-Forwarded-For entry or a Forwarded ``for=`` node."""
    token = token.strip().strip('"').strip()
    if token.startswith("["):  # "[2001:db8::1]:4711"
        end = token.find("]")
        if end < 0:
            return None
        token = token[1:end]
    elif token.count(":") == 1:  # "192.0.2.1:8080"
        token = token.partition(":")[0]
    try:
        address = ip_address(token)
    except ValueError:
        return None  # "unknown", "_hidden" obfuscated identifiers, garbage
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _for_node(element: str) -> str:
    """The ``for=`` value of one Forwarded element; ``""`` if absent or malformed.

    The element is read pair by pair, so a ``for=`` inside another parameter's
    quoted value (``host="a;for=1.2.3.4"``, text the client chose) is never taken.
    """
    element = element.strip()
    found: str | None = None
    position = 0
    while position < len(element):
        pair = _PAIR.match(element, position)
        if pair is None or pair.end() == position:
            return ""  # not a list of pairs: no address to believe
        if pair.group(1).lower() == "for":
            if found is not None:
                return ""  # RFC 7239: a parameter occurs at most once per element
            found = pair.group(2).strip()
        position = pair.end()
    return found or ""


def _forwarded_for(values: list[str]) -> list[str]:
    """The ``for=`` node of every element of ``Forwarded`` (RFC 7239), in order."""
    return [_for_node(element) for value in values for element in _elements(value)]


def _elements(value: str) -> list[str]:
    """The comma-separated elements of a ``Forwarded`` field value, commas inside
    quoted strings kept, in time linear in the value.

    A quote a client leaves open (``for="``) makes the text up to the first comma after
    which the rest of the value pairs its quotes one unreadable element: the elements
    the proxies appended after it (well-formed, quoted IPv6 nodes too) are read as
    written. Where each quoted string from ``i`` ends (``ends``) and whether the value
    from ``p`` on closes every string it opens (``clean``) are computed once, from the
    right, so no quote rescans the rest of the value (a run of escaped quotes without
    its closing quote cost quadratic time).
    """
    n = len(value)
    ends: list[int] = [-1] * (n + 2)  # ends[i]: the closing quote of a string from i
    clean: list[bool] = [True] * (n + 2)  # clean[p]: value[p:] closes every string
    for i in range(n - 1, -1, -1):
        char = value[i]
        if char == '"':
            ends[i] = i
            end = ends[i + 1]
            clean[i] = end >= 0 and clean[end + 1]
        else:
            ends[i] = ends[i + 2] if char == "\\" else ends[i + 1]
            clean[i] = clean[i + 1]
    elements: list[str] = []
    start = i = 0
    while i < n:
        char = value[i]
        if char == ",":
            elements.append(value[start:i])
            start = i = i + 1
        elif char == '"':
            if clean[i]:
                i = ends[i + 1] + 1
                continue
            # The quote left open: resume after the first comma the rest is clean from
            # (at most once: from there on every quote closes).
            comma = value.find(",", i + 1)
            while comma >= 0 and not clean[comma + 1]:
                comma = value.find(",", comma + 1)
            if comma < 0:
                break
            elements.append(value[start:comma])
            start = i = comma + 1
        else:
            i += 1
    elements.append(value[start:])
    return [element for element in elements if element.strip()]


def _x_forwarded_for(values: list[str]) -> list[str]:
    return [part for value in values for part in value.split(",")]


def client_ip(
    trusted_proxies: Iterable[str] = (),
    *,
    header: str = "x-forwarded-for",
    ipv6_prefix: int | None = None,
) -> Key:
    """Key by client IP address, believing forwarding headers only from trusted hops.

    Without ``trusted_proxies`` the key is the socket peer (``scope["client"]``) and
    forwarding headers are ignored, so clients cannot choose their own key. With them,
    when the peer is a trusted proxy, the addresses in ``header`` (``"x-forwarded-for"``
    or ``"forwarded"``, RFC 7239) are walked from the right, skipping trusted hops; the
    first untrusted address is the client. Entries that are not IP addresses
    (``unknown``, obfuscated ``_hidden`` nodes) stop the walk at the last trusted hop.
    ``trusted_proxies`` holds addresses and networks (``"10.0.0.0/8"``), and ``"unix"``
    to trust a peer on a Unix socket (no ``scope["client"]``). ``ipv6_prefix=64`` keys
    IPv6 clients by network, since one host usually owns a whole /64.

    Name only the header your outermost proxy *overwrites or appends to*: a client can
    send any header the proxy passes through untouched.

    Example::

        # nginx on 10.0.0.5 appends $remote_addr to X-Forwarded-For
        key = rs.asgi.client_ip(trusted_proxies=["10.0.0.5"])
    """
    if isinstance(trusted_proxies, str) or trusted_proxies is None:
        raise ConfigurationError(
            "trusted_proxies must be a list of addresses or networks, "
            f"e.g. ['10.0.0.0/8'], got {trusted_proxies!r}"
        )
    if not isinstance(header, str):
        raise ConfigurationError(f"header must be 'x-forwarded-for' or 'forwarded', got {header!r}")
    try:
        proxies = [str(p) for p in trusted_proxies]
    except TypeError:
        raise ConfigurationError(
            "trusted_proxies must be a list of addresses or networks, "
            f"e.g. ['10.0.0.0/8'], got {trusted_proxies!r}"
        ) from None
    trust_unix = "unix" in proxies
    try:
        networks = tuple(ip_network(p, strict=False) for p in proxies if p != "unix")
    except ValueError as exc:
        raise ConfigurationError(
            f"trusted_proxies must hold IP addresses or networks (or 'unix'): {exc}"
        ) from None
    header_name = header.lower()
    if header_name not in ("x-forwarded-for", "forwarded"):
        raise ConfigurationError(
            f"header must be one of 'x-forwarded-for', 'forwarded', got {header!r}"
        )
    if ipv6_prefix is not None and (
        isinstance(ipv6_prefix, bool)
        or not isinstance(ipv6_prefix, int)
        or not 0 < ipv6_prefix <= 128
    ):
        raise ConfigurationError(f"ipv6_prefix must be an integer in [1, 128], got {ipv6_prefix!r}")
    name = f"client_ip(trusted_proxies={proxies!r}, header={header_name!r}" + (
        ")" if ipv6_prefix is None else f", ipv6_prefix={ipv6_prefix})"
    )

    if not networks and not trust_unix and ipv6_prefix is None:
        # The common case: the socket peer, no parsing at all.
        def peer(scope: Scope) -> str | None:
            client = scope.get("client")
            return "ip:" + _unmapped(client[0]) if client and client[0] else "ip:unknown"

        key = Key(peer, name)
        key._digest = _peer_digest
        return key

    header_bytes = header_name.encode("latin-1")
    chain = _forwarded_for if header_name == "forwarded" else _x_forwarded_for

    @functools.lru_cache(maxsize=4096)
    def trusted(host: str) -> bool:
        address = _parse_node(host)
        return address is not None and any(address in network for network in networks)

    def render(address: IPv4Address | IPv6Address | str) -> str:
        if ipv6_prefix is not None and isinstance(address, IPv6Address):
            network = ip_network(f"{address}/{ipv6_prefix}", strict=False)
            return f"ip:{network}"
        if ipv6_prefix is not None and isinstance(address, str):
            parsed = _parse_node(address)  # IPv4-mapped IPv6 reads as IPv4
            if parsed is not None:
                return render(parsed)
        return f"ip:{address}"

    def resolve(scope: Scope) -> str | None:
        client = scope.get("client")
        last: str | None
        if client and client[0]:  # granian on a Unix socket: ("", 0), no peer
            last = client[0]
            if not trusted(last):
                return render(last)
        elif trust_unix:
            last = None
        else:
            return "ip:unknown"
        values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == header_bytes]
        for token in reversed(chain(values)):
            address = _parse_node(token)
            if address is None:
                break
            text = str(address)
            if not trusted(text):
                return render(address)
            last = text
        return "ip:unknown" if last is None else render(last)

    return Key(resolve, name)


# -- other key functions -----------------------------------------------------------------


def _first_header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def header(name: str, *, default: str | None = None) -> Key:
    """Key by the value of request header ``name`` (``None``, i.e. unlimited, if absent).

    Example::

        key = rs.asgi.header("x-tenant-id") | rs.asgi.client_ip()
    """
    lowered = check_header_name("header name", name)
    if default is not None and not isinstance(default, str):
        raise ConfigurationError(f"default must be a string or None, got {default!r}")
    name_bytes = lowered.encode("latin-1")
    prefix = f"h:{lowered}:"

    def by_header(scope: Scope) -> str | None:
        value = _first_header(scope, name_bytes)
        if value is None:
            value = default
        return None if value is None else prefix + value

    return Key(by_header, f"header({lowered!r})")


def api_key(
    header: str = "x-api-key", *, scheme: str | None = None, query_param: str | None = None
) -> Key:
    """Key by API key: from ``header`` (optionally after an auth ``scheme``) or a query param.

    ``api_key("authorization", scheme="Bearer")`` keys by bearer token. The key is
    hashed before it reaches a limiter, so tokens are never stored.

    Example::

        key = rs.asgi.api_key() | rs.asgi.client_ip()
    """
    name_bytes = check_header_name("header", header).encode("latin-1")
    if scheme is not None:
        if not isinstance(scheme, str) or not _TOKEN.fullmatch(scheme.strip()):
            raise ConfigurationError(
                f"scheme must be an auth scheme such as 'Bearer', got {scheme!r}"
            )
        scheme = scheme.strip()
    if query_param is not None and (not isinstance(query_param, str) or not query_param):
        raise ConfigurationError(f"query_param must be a parameter name, got {query_param!r}")
    scheme_prefix = None if scheme is None else scheme.lower() + " "

    def by_api_key(scope: Scope) -> str | None:
        value = _first_header(scope, name_bytes)
        if value is not None and scheme_prefix is not None:
            value = (
                value[len(scheme_prefix) :].strip()
                if value.lower().startswith(scheme_prefix)
                else None
            )
        if not value and query_param is not None:
            query = scope.get("query_string", b"").decode("latin-1")
            for param, param_value in parse_qsl(query):
                if param == query_param:
                    value = param_value
                    break
        return "key:" + value if value else None

    options = "".join(
        f", {name}={value!r}"
        for name, value in (("scheme", scheme), ("query_param", query_param))
        if value is not None
    )
    return Key(by_api_key, f"api_key({header!r}{options})")


def user(scope_key: str = "user") -> Key:
    """Key by authenticated user: ``scope[scope_key]`` as set by authentication middleware.

    Reads ``identity``, then ``username``, of the object (Starlette's ``BaseUser``), or
    the value itself if it is a string; anonymous users (``is_authenticated`` false) have
    no key. The authentication middleware must run *outside* (before) this one.

    Example::

        app.add_middleware(RateLimitMiddleware, limiter=per_user, key=rs.asgi.user())
        app.add_middleware(AuthenticationMiddleware, backend=TokenAuth())
    """

    if not isinstance(scope_key, str) or not scope_key:
        raise ConfigurationError(f"scope_key must be a scope key such as 'user', got {scope_key!r}")

    def by_user(scope: Scope) -> str | None:
        value = scope.get(scope_key)
        if value is None or getattr(value, "is_authenticated", True) is False:
            return None
        if isinstance(value, str):
            return "user:" + value if value else None
        for attribute in ("identity", "username"):
            try:
                found = getattr(value, attribute)
            except (AttributeError, NotImplementedError):
                continue
            if found:
                return f"user:{found}"
        return None

    return Key(by_user, f"user({scope_key!r})")


def _route_templates(routes: Iterable[Any], scope: Scope, prefix: str = "") -> str | None:
    from starlette.routing import Match, Mount

    for candidate in routes:
        included = getattr(candidate, "effective_route_contexts", None)
        if callable(included) and getattr(candidate, "path", None) is None:
            # FastAPI's include_router() branch (recent FastAPI): no path of its own;
            # its routes, prefixes applied, are its effective route contexts.
            try:
                found = _included_template(included(), scope, prefix)
            except Exception:
                found = None
            if found is not None:
                return found
            continue
        try:
            match, child = candidate.matches(scope)
        except Exception:
            continue
        if match is Match.NONE:
            continue
        if isinstance(candidate, Mount):
            template = prefix + str(candidate.path).rstrip("/")
            inner = _route_templates(candidate.routes, {**scope, **child}, template)
            return inner if inner is not None else template + "/{path}"
        if match is Match.FULL:
            return prefix + str(getattr(candidate, "path_format", getattr(candidate, "path", "")))
    return None


def _included_template(contexts: Iterable[Any], scope: Scope, prefix: str) -> str | None:
    """The template of the route of a FastAPI included router that takes ``scope``."""
    from ._rules import route_path

    path = route_path(scope)
    method = scope.get("method")
    for context in contexts:
        route = getattr(context, "starlette_route", None)
        if route is not None:  # a Starlette route, mount or websocket route, prefixed
            found = _route_templates([route], scope, prefix)
            if found is not None:
                return found
            continue
        regex = getattr(context, "path_regex", None)
        methods = getattr(context, "methods", None)
        if regex is None or regex.match(path) is None:
            continue
        if scope.get("type") == "http" and methods and method not in methods:
            continue
        return prefix + str(getattr(context, "path_format", "") or getattr(context, "path", ""))
    return None


def route(templates: Iterable[str] = ()) -> Key:
    """Key by route template (``GET /items/{id}``), not by raw path.

    With a Starlette or FastAPI application (found in ``scope["app"]``, which the
    middlewares set first when they wrap the app from outside) the template of the
    route that will handle the request is used; otherwise the first of
    ``templates`` (``{name}`` one segment, ``{name:path}`` and ``*`` anything) that
    matches. Unmatched paths share one ``<unmatched>`` key, so random URLs cannot
    create keys; with neither routes nor templates the raw path is the key. Results
    are cached (bounded).

    Example::

        key = rs.asgi.client_ip() + rs.asgi.route()    # per client, per endpoint
    """
    from ._rules import compile_pattern, route_path

    if isinstance(templates, str):  # one template, not its characters
        templates = [templates]
    try:
        patterns = [(t, compile_pattern(t)) for t in templates]
    except TypeError:
        raise ConfigurationError(f"templates must be route templates, got {templates!r}") from None

    @functools.lru_cache(maxsize=4096)
    def lookup(app: Any, kind: str, method: str, path: str, root_path: str) -> str:
        routes = getattr(app, "routes", None)
        if routes is not None:
            try:
                sub = {"type": kind, "method": method, "path": path, "root_path": root_path}
                found = _route_templates(routes, sub)
            except ImportError:  # pragma: no cover - routes without starlette
                found = None
            return found if found is not None else "<unmatched>"
        # Templates are written like the app's routes: without the prefix it is
        # served under (a Mount, --root-path), as rules' patterns are.
        local = route_path({"path": path, "root_path": root_path})
        for template, pattern in patterns:
            if pattern.fullmatch(local):
                return template
        return "<unmatched>" if patterns else path

    def find(scope: Scope, method: str) -> str:
        path = scope.get("path", "")
        args = (
            scope.get("app"),
            scope.get("type", "http"),
            method,
            path,
            scope.get("root_path", ""),
        )
        if len(path) > _MEMO_KEY_MAX:  # an attacker-sized path: not kept in the cache
            return lookup.__wrapped__(*args)
        try:
            return lookup(*args)
        except TypeError:  # an unhashable app object: no cache
            return lookup.__wrapped__(*args)

    def by_route(scope: Scope) -> str | None:
        method = scope.get("method", "")
        if method == "HEAD":
            # Answered by the GET endpoint where there is one: that endpoint's key.
            template = find(scope, "GET")
            if template != "<unmatched>":
                return f"route:GET {template}"
        return f"route:{method} {find(scope, method)}"

    return Key(by_route, f"route({[t for t, _ in patterns]!r})" if patterns else "route()")


def scope_app_of(app: Any) -> Any:
    """The Starlette (or FastAPI) application ``app`` is or wraps, else ``None``.

    Such an app sets ``scope["app"]`` to itself on entry, which :func:`route` reads to
    find the routes. A middleware wrapped around it from outside
    (``RateLimitMiddleware(app, ...)`` rather than ``app.add_middleware``), directly or
    through other middlewares (followed by their ``app`` attribute), computes its keys
    before that happens, so its key functions get a copy of the scope with this app in
    it (the scope itself is left alone: under a ``Mount`` it holds the parent app).
    """
    starlette = sys.modules.get("starlette.applications")
    if starlette is None:
        return None
    for _ in range(32):  # a chain of middlewares, each holding the next as .app
        if isinstance(app, starlette.Starlette):
            return app
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


def keyed_scope(scope: Scope, app: Any) -> Scope:
    """The scope the key, cost and priority functions of a middleware wrapped around
    ``app`` (see :func:`scope_app_of`) see: ``scope`` itself when ``app`` is already in
    it, else a copy with it; the scope stays as it is (under a ``Mount``, the parent app
    is in it until ``app`` sets itself)."""
    if scope.get("app") is app:
        return scope
    return {**scope, "app": app}


# -- composition -------------------------------------------------------------------------


def combine(*keys: KeyFunction, sep: str = "|") -> Key:
    """A key made of every part (missing parts count as empty): ``a + b``.

    Example::

        key = rs.asgi.combine(rs.asgi.client_ip(), rs.asgi.route())
    """
    if not keys:
        raise ConfigurationError("combine() needs at least one key function")
    if not isinstance(sep, str):
        raise ConfigurationError(f"sep must be a string, got {sep!r}")
    parts = tuple(_as_key(k).func for k in keys)

    def combined(scope: Scope) -> str | None:
        return sep.join([part(scope) or "" for part in parts])

    return Key(combined, " + ".join(repr(_as_key(k)) for k in keys))


def first(*keys: KeyFunction) -> Key:
    """The first key that is not ``None``: ``a | b``.

    Example::

        key = rs.asgi.first(rs.asgi.api_key(), rs.asgi.client_ip())
    """
    if not keys:
        raise ConfigurationError("first() needs at least one key function")
    parts = tuple(_as_key(k).func for k in keys)

    def first_present(scope: Scope) -> str | None:
        for part in parts:
            value = part(scope)
            if value is not None:
                return value
        return None

    return Key(first_present, " | ".join(repr(_as_key(k)) for k in keys))
