"""The public surface: every exported name is documented with an example, and
``import resilience`` stays light (optional dependencies load only when used)."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from typing import Any

import pytest

import resilience
import resilience as rs

PUBLIC_MODULES = [
    "resilience",
    "resilience.backoff",
    "resilience.errors",
    "resilience.testing",
    "resilience.backends",
    "resilience.breaker",
    "resilience.bulkhead",
    "resilience.ratelimit",
    "resilience.asgi",
    "resilience.chaos",
    "resilience.httpx",
    "resilience.observability",
]


def public_names() -> list[tuple[str, str]]:
    names = []
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an area not built yet, or an optional extra missing
            continue
        for name in getattr(module, "__all__", []):
            names.append((module_name, name))
    return names


@pytest.mark.parametrize(("module_name", "name"), public_names())
def test_every_public_name_has_a_docstring_with_an_example(module_name: str, name: str) -> None:
    """Users read docstrings: each public class and function shows how to use it."""
    obj = getattr(importlib.import_module(module_name), name)
    if inspect.ismodule(obj):
        doc = obj.__doc__ or ""
        assert doc.strip(), f"{module_name}.{name} has no docstring"
        return
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # constants and type aliases
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"{module_name}.{name} has no docstring"
    assert "Example" in doc or ">>>" in doc, f"{module_name}.{name}: docstring lacks an example"


def test_the_api_reference_shows_every_public_name() -> None:
    """docs/api.md renders each public name: by itself (``::: resilience.X``), or as a
    member of a module it renders whole (``::: resilience.asgi``), or as the same
    object under another public path (``rs.Bulkhead`` for ``resilience.bulkhead``'s)."""
    import pathlib
    import re

    api = (pathlib.Path(__file__).parents[1] / "docs" / "api.md").read_text()
    targets = re.findall(r"^::: (\S+)", api, re.MULTILINE)
    whole = {t for t in targets if t in PUBLIC_MODULES}
    shown: list[object] = []
    for target in targets:
        if target in whole:
            module = importlib.import_module(target)
            shown.extend(getattr(module, n) for n in getattr(module, "__all__", []))
            continue
        parent, _, attribute = target.rpartition(".")
        shown.append(getattr(importlib.import_module(parent), attribute))
    missing = [
        f"{module_name}.{name}"
        for module_name, name in public_names()
        if module_name not in whole
        and not inspect.ismodule(obj := getattr(importlib.import_module(module_name), name))
        and not any(obj is other for other in shown)
    ]
    assert missing == []


def test_all_is_sorted_and_resolvable() -> None:
    """The top-level __all__ is sorted and every name in it exists."""
    assert list(resilience.__all__) == sorted(resilience.__all__)
    for name in resilience.__all__:
        assert hasattr(resilience, name), name


OPTIONAL = ["redis", "starlette", "httpx", "prometheus_client", "opentelemetry", "pybreaker"]


def test_import_resilience_loads_no_optional_dependency() -> None:
    """import resilience needs only anyio and limits."""
    code = (
        "import sys, json, resilience; "
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == []


def test_reprs_show_the_configuration_that_tells_objects_apart() -> None:
    """A breaker, a retry, the key functions and the middlewares show what they are
    configured with, not only a name (``route()`` and ``client_ip()`` dropped options,
    which made two different keys read the same in logs)."""
    import resilience as rs
    from resilience.asgi import RateLimitMiddleware, api_key, client_ip, route

    breaker = rs.CircuitBreaker(failure_rate=0.3, window=20, open_for=5)
    assert (
        repr(breaker) == "<CircuitBreaker 'CircuitBreaker' failure_rate=0.3 window=20 open_for=5>"
    )
    retry = rs.Retry(on=OSError, attempts=5, deadline=3)
    assert repr(retry) == "<Retry 'Retry' on=(OSError) attempts=5 deadline=3>"
    assert repr(route(["/items/{id}"])) == "route(['/items/{id}'])"
    assert repr(client_ip(ipv6_prefix=64)).endswith("ipv6_prefix=64)")
    assert repr(api_key("authorization", scheme="Bearer")) == (
        "api_key('authorization', scheme='Bearer')"
    )

    async def app(scope: object, receive: object, send: object) -> None: ...

    middleware = RateLimitMiddleware(app, limiter=rs.RateLimiter("1/s"), name="api")
    assert repr(middleware).startswith("<RateLimitMiddleware 'api' app=")
    assert ".<locals>.app limiter=<RateLimiter" in repr(middleware)


def test_every_docstring_doctest_runs() -> None:
    """The ``>>>`` examples of the package's docstrings (the API pages show them) run as
    written, with the docs' own ``import resilience as rs``."""
    import doctest
    import importlib
    import pkgutil

    import resilience

    failed: list[str] = []
    attempted = 0
    for info in pkgutil.walk_packages(resilience.__path__, "resilience."):
        module = importlib.import_module(info.name)
        result = doctest.testmod(
            module, extraglobs={"rs": resilience}, optionflags=doctest.ELLIPSIS, report=False
        )
        attempted += result.attempted
        if result.failed:
            failed.append(f"{info.name}: {result.failed} of {result.attempted}")
    assert failed == []
    assert attempted >= 15


def test_reprs_say_what_is_configured() -> None:
    """Two policies configured differently never read the same: the algorithm, a
    reservation wait, a key, the fallback value and what a transport or a middleware
    holds are in their reprs (a window limiter read like a token bucket, two Fallbacks
    alike, the middlewares named only their app)."""
    from resilience.asgi import ConcurrencyLimitMiddleware, RateLimitMiddleware, TimeoutMiddleware
    from resilience.httpx import ResilientTransport

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    assert repr(rs.RateLimiter("7/s", burst=3, max_wait=0.25, key=lambda: "k")) == (
        "<RateLimiter 'RateLimiter' 7/1s burst=3 max_wait=0.25 keyed>"
    )
    assert "algorithm=fixed-window" in repr(rs.RateLimiter("7/s", algorithm="fixed-window"))
    assert repr(rs.Bulkhead(5, max_wait=0.75, key=lambda: 1)) == (
        "<Bulkhead 'Bulkhead' max_concurrent=5 max_wait=0.75 keyed>"
    )
    assert repr(rs.Fallback("n/a")) == "<Fallback 'Fallback' on=(Rejected, Timeout) returns 'n/a'>"
    assert "on=(KeyError) returns from" in repr(rs.Fallback(lambda exc: 1, on=KeyError))
    transport = repr(ResilientTransport(bulkhead=4, limiter="10/s", attempts=2))
    assert "attempts=2 bulkhead=<Bulkhead" in transport
    assert "limiter=<RateLimiter" in transport
    limited = repr(RateLimitMiddleware(app, limiter=rs.RateLimiter("1/s"), shadow=True))
    assert "limiter=<RateLimiter 'RateLimiter' 1/1s burst=1> shadow" in limited
    assert "seconds=3" in repr(TimeoutMiddleware(app, seconds=3))
    assert "bulkhead='Bulkhead'" in repr(ConcurrencyLimitMiddleware(app, bulkhead=rs.Bulkhead(2)))
