"""Pure-ASGI middleware: rate limits, load shedding and timeouts for any ASGI app.

Works with Starlette, FastAPI, Quart, Litestar or a bare ASGI callable; needs no
framework installed. Every middleware is a class ``Middleware(app, **options)`` with
``async __call__(scope, receive, send)``: options are resolved once at construction,
request bodies are never read and responses never buffered; websocket and lifespan
scopes pass through untouched unless a :class:`Rule` names them.

Example::

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    import resilience as rs
    from resilience.asgi import (ConcurrencyLimitMiddleware, RateLimitMiddleware, Rule,
                                 TimeoutMiddleware, client_ip)

    app = Starlette(routes=routes, middleware=[
        Middleware(TimeoutMiddleware, seconds=10),
        Middleware(ConcurrencyLimitMiddleware, bulkhead=rs.Bulkhead(64, max_wait=0.5)),
        Middleware(RateLimitMiddleware, limiter=rs.RateLimiter("100/minute"),
                   key=client_ip(trusted_proxies=["10.0.0.0/8"]), exempt=["/healthz"]),
    ])
"""

from ._concurrency import PRIORITY_CLASSES, ConcurrencyLimitMiddleware, header_priority
from ._events import RequestAdmitted, RequestCompleted, ShadowRejected
from ._headers import (
    RateLimitHeaders,
    format_policy,
    format_ratelimit,
    quota_and_window,
    retry_after_value,
)
from ._keys import Key, KeyFunction, api_key, client_ip, combine, digest, first, header, route, user
from ._problem import QUOTA_EXCEEDED, REDUCED_CAPACITY, Problem
from ._ratelimit import RateLimitMiddleware
from ._rules import UNSET, Rule, route_path
from ._timeout import TimeoutMiddleware
from ._types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "PRIORITY_CLASSES",
    "QUOTA_EXCEEDED",
    "REDUCED_CAPACITY",
    "UNSET",
    "ASGIApp",
    "ConcurrencyLimitMiddleware",
    "Key",
    "KeyFunction",
    "Message",
    "Problem",
    "RateLimitHeaders",
    "RateLimitMiddleware",
    "Receive",
    "RequestAdmitted",
    "RequestCompleted",
    "Rule",
    "Scope",
    "Send",
    "ShadowRejected",
    "TimeoutMiddleware",
    "api_key",
    "client_ip",
    "combine",
    "digest",
    "first",
    "format_policy",
    "format_ratelimit",
    "header",
    "header_priority",
    "quota_and_window",
    "retry_after_value",
    "route",
    "route_path",
    "user",
]
