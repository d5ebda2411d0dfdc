"""Per-route rules: which requests a rule applies to, and what it overrides.

One :class:`Rule` type serves every middleware: it says *which* requests (path
pattern, methods, scope types) and carries the options it overrides. Each middleware
reads the options it knows and refuses, at construction, a rule that sets others.
Rules are tried in order; the first match wins.

Path patterns: ``"/health"`` (exact), ``"/items/{id}"`` (``{name}`` is one path
segment, ``{name:path}`` anything), ``"/static/*"`` (``*`` is anything, slashes
included), or a compiled :class:`re.Pattern` (full match). They match the path the
application routes on (:func:`route_path`): under a ``Mount("/v2", ...)`` or behind
``uvicorn --root-path /v2`` a request for ``/v2/healthz`` matches ``"/healthz"``, as
the app's own routes do.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigurationError
from ._types import Scope

if TYPE_CHECKING:
    from ..bulkhead import Bulkhead
    from ..ratelimit import RateLimiter

__all__ = ["UNSET", "Matcher", "Rule", "compile_pattern", "route_path"]


class _Unset(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset.UNSET
"""Marks a :class:`Rule` option as "not overridden" (distinct from ``None``)."""

SCOPE_TYPES: Final = frozenset({"http", "websocket"})
"""The ASGI scope types a rule can name."""


def _items(value: Any) -> tuple[Any, ...]:
    """``value``'s items as a tuple; ``()`` (refused by the caller) if it holds none or
    is no collection at all (``methods=True``)."""
    try:
        return tuple(value)
    except TypeError:
        return ()


def method_names(methods: Iterable[str]) -> frozenset[str]:
    """HTTP method names as requests carry them: ``"post "`` and ``"POST"`` are one.

    ``GET`` brings ``HEAD``: Starlette (and Django, Flask) answer HEAD with the GET
    endpoint, so a GET rule that left HEAD out would let it run that endpoint unlimited.
    """
    names = frozenset(m.strip().upper() for m in methods)
    return names | {"HEAD"} if "GET" in names else names


_PARAM = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)(?::([a-zA-Z_]+))?\}")
_CONVERTORS = {
    "str": "[^/]+",
    "path": ".*",
    "int": "[0-9]+",
    "float": r"[0-9]+(?:\.[0-9]+)?",
    "uuid": "[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}",
}


def route_path(scope: Scope) -> str:
    """The path the application routes on: ``scope["path"]`` less its ``root_path``.

    ASGI servers and Starlette's ``Mount`` put the whole path in ``scope["path"]`` and
    the prefix the app is served under in ``scope["root_path"]`` (``uvicorn
    --root-path``, a mounted sub-app); the app's routes are written without it, and so
    are the middlewares' path patterns. A path that does not start with the root path
    (older servers strip it themselves) is used as it is.

    Example::

        >>> route_path({"path": "/v2/items/1", "root_path": "/v2"})
        '/items/1'
    """
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        rest = path[len(root) :]
        if not rest:
            return "/"
        if rest[0] == "/":
            return rest
    return path


class _AsDollar:
    """A compiled pattern a user gave, matched as Starlette's ``$`` would match it: the
    path, or the path less one final newline (``/login%0A`` reaches /login)."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self._pattern = pattern

    def fullmatch(self, path: str) -> re.Match[str] | None:
        found = self._pattern.fullmatch(path)
        if found is None and path[-1:] == "\n":
            found = self._pattern.fullmatch(path[:-1])
        return found


#: What a path pattern compiles to: ``fullmatch(path)`` tells whether it matches.
PathPattern = re.Pattern[str] | _AsDollar


def compile_pattern(pattern: str | re.Pattern[str]) -> PathPattern:
    """The regular expression (for ``fullmatch``) of a path pattern.

    Example::

        >>> bool(compile_pattern("/items/{id:int}").fullmatch("/items/42"))
        True
    """
    if isinstance(pattern, re.Pattern):
        return _AsDollar(pattern)
    if not isinstance(pattern, str) or not pattern:
        raise ConfigurationError(
            f"a path pattern must be a non-empty str or re.Pattern, got {pattern!r}"
        )
    if not pattern.startswith(("/", "*")):  # scope["path"] always starts with "/"
        raise ConfigurationError(f"a path pattern must start with '/', got {pattern!r}")
    if pattern.count("{") != pattern.count("}"):
        raise ConfigurationError(f"unbalanced braces in the path pattern {pattern!r}")
    # The runs of glob text, each with the parameter after it (None after the last).
    pieces: list[tuple[str, str | None]] = []
    position = 0
    for match in _PARAM.finditer(pattern):
        pieces.append((pattern[position : match.start()], match.group(2) or "str"))
        position = match.end()
    pieces.append((pattern[position:], None))
    out: list[str] = []
    # Unbounded parts (a "*", a {name:path}) with a parameter between them backtrack
    # into each other: matching would be polynomial in an attacker's path length. So
    # does a star in a parameter's segment ("*.{ext}", "{id}*"): the two take turns
    # over it. "/*/{name}" is linear, a "/" parts them.
    unbounded_before = False
    for index, (glob, convertor) in enumerate(pieces):
        if "*" in glob:
            shares_a_segment = (convertor is not None and "/" not in glob[glob.rindex("*") :]) or (
                index > 0 and "/" not in glob[: glob.index("*")]
            )
            if unbounded_before or shares_a_segment:
                raise _polynomial(pattern)
            unbounded_before = True
        out.append(_glob(glob))
        if convertor is None:
            break
        if convertor not in _CONVERTORS:
            raise ConfigurationError(
                f"unknown path convertor {convertor!r} in {pattern!r}; "
                f"use one of {', '.join(_CONVERTORS)}"
            )
        if convertor == "path":
            if unbounded_before:
                raise _polynomial(pattern)
            unbounded_before = True
        out.append(_CONVERTORS[convertor])
    # "\n?": Starlette's route regexes end in "$", which also matches before one final
    # newline, so "/login%0A" reaches the /login endpoint and must meet its rules.
    return re.compile("(?:" + "".join(out) + ")\n?")


def _polynomial(pattern: str) -> ConfigurationError:
    return ConfigurationError(
        f"the path pattern {pattern!r} has unbounded parts ('*' or {{name:path}}) apart "
        f"from each other, or a '*' in a parameter's segment (stars in one run of text "
        f"between parameters are fine, and so is '/*/{{name}}'): matching it could take "
        f"time polynomial in the path length, which any client chooses. Use one '*' "
        f"there, or a compiled re.Pattern if you accept that cost"
    )


def _glob(text: str) -> str:
    """The regex of a glob (``*`` any text), linear to match, as ``fnmatch`` builds it.

    Each star but the last is an atomic lazy group up to the literal after it: taking
    its first occurrence loses no match (a star follows), and nothing backtracks into
    it, so several stars cost linear time, not polynomial (``/a/*/b/*/c/*/d`` against a
    6 KB path held the event loop 5 s). A star crosses newlines, as Starlette's path
    segments do.
    """
    parts = text.split("*")
    if len(parts) == 1:
        return re.escape(text)
    middle = "".join(f"(?>.*?{re.escape(part)})" for part in parts[1:-1])
    return f"(?s:{re.escape(parts[0])}{middle}.*{re.escape(parts[-1])})"


def _is_literal(pattern: str | re.Pattern[str]) -> bool:
    return isinstance(pattern, str) and "*" not in pattern and _PARAM.search(pattern) is None


@dataclass(frozen=True, slots=True)
class Rule:
    """Options for the requests that match ``path`` (and ``methods``, ``scopes``).

    ``scopes`` names the ASGI scope types the rule applies to: by default only
    ``"http"``; a rule with ``scopes=("websocket",)`` makes a middleware look at
    websocket handshakes, which it otherwise passes through untouched. Options left
    :data:`UNSET` keep the middleware's own value:

    * :class:`RateLimitMiddleware`: ``limiter``, ``cost``, ``key``, ``exempt``,
      ``policy_name``;
    * :class:`ConcurrencyLimitMiddleware`: ``bulkhead``, ``priority``, ``key``,
      ``max_wait``, ``exempt``;
    * :class:`TimeoutMiddleware`: ``seconds`` (``None``: no timeout), ``exempt``.

    Example::

        rules = [
            Rule("/login", methods=["POST"], limiter=strict, key=rs.asgi.client_ip()),
            Rule("/search/{query}", cost=5),
            Rule("/reports/*", seconds=120.0),
            Rule("/healthz", exempt=True),
        ]
    """

    path: str | re.Pattern[str]
    _: KW_ONLY
    methods: Collection[str] | None = None
    scopes: Collection[str] = ("http",)
    exempt: bool = False
    limiter: RateLimiter | _Unset = UNSET
    cost: int | Callable[[Scope], int] | _Unset = UNSET
    key: Callable[[Scope], str | None] | _Unset = UNSET
    policy_name: str | _Unset = UNSET
    bulkhead: Bulkhead | _Unset = UNSET
    priority: int | Callable[[Scope], int] | _Unset = UNSET
    max_wait: float | _Unset | None = UNSET
    seconds: float | _Unset | None = UNSET

    def __post_init__(self) -> None:
        compile_pattern(self.path)  # refuses an empty or malformed pattern now
        if self.methods is not None:
            # A lone string is one method: methods="POST" must not mean {"P", "O", "S", "T"}.
            methods = (self.methods,) if isinstance(self.methods, str) else _items(self.methods)
            if not methods or not all(isinstance(m, str) and m.strip() for m in methods):
                raise ConfigurationError(
                    f"Rule methods must be HTTP method names, got {self.methods!r}"
                )
            object.__setattr__(self, "methods", methods)
        scopes = (self.scopes,) if isinstance(self.scopes, str) else _items(self.scopes)
        unknown = [kind for kind in scopes if not isinstance(kind, str) or kind not in SCOPE_TYPES]
        if not scopes or unknown:
            raise ConfigurationError(
                f"Rule scopes must name ASGI scope types among {sorted(SCOPE_TYPES)}, "
                f"got {self.scopes!r} (lifespan is never limited)"
            )
        object.__setattr__(self, "scopes", scopes)
        if (
            self.methods is not None
            and "http" not in scopes
            and "GET" not in method_names(self.methods)
        ):
            # Websocket scopes carry no method: they match as the GET of their handshake.
            raise ConfigurationError(
                f"Rule methods {self.methods!r} never match a websocket handshake (a GET): "
                "a websocket-only rule takes no methods, or GET"
            )
        if not isinstance(self.exempt, bool):
            raise ConfigurationError(f"Rule exempt must be True or False, got {self.exempt!r}")

    def options(self) -> dict[str, Any]:
        """The options this rule sets (those not left :data:`UNSET`)."""
        skip = {"path", "methods", "scopes", "exempt", "_"}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) is not UNSET
        }


class Matcher:
    """Finds the first rule matching a request; built once per middleware.

    ``match(scope)`` returns ``(index, rule)`` or ``None``. Exact-path rules are looked
    up in a dict; patterns are tried in order only when needed.

    Example::

        matcher = Matcher([Rule(path="/a"), Rule(path="/b/*")], allowed={"cost"}, owner="X")
        matcher.match({"type": "http", "method": "GET", "path": "/b/c"})
    """

    __slots__ = ("_exact", "_patterns", "rules", "scope_types")

    def __init__(
        self, rules: Iterable[Rule] | Rule, *, allowed: Collection[str], owner: str
    ) -> None:
        given: object = rules  # typed, but checked: untyped callers exist
        if isinstance(given, Rule):  # one rule, as exempt= takes one path
            given = (given,)
        elif isinstance(given, str) or not isinstance(given, Iterable):
            raise ConfigurationError(f"{owner} rules must be a list of Rule objects, got {rules!r}")
        self.rules: tuple[Rule, ...] = tuple(given)
        self._exact: dict[str, list[tuple[int, Rule, frozenset[str] | None]]] = {}
        self._patterns: list[tuple[int, Rule, PathPattern, frozenset[str] | None]] = []
        scope_types: set[str] = set()
        for index, rule in enumerate(self.rules):
            if not isinstance(rule, Rule):
                raise ConfigurationError(f"{owner} rules must be Rule objects, got {rule!r}")
            unknown = set(rule.options()) - set(allowed)
            if unknown:
                raise ConfigurationError(
                    f"{owner} does not understand rule option(s) {sorted(unknown)} in {rule!r}; "
                    f"it reads {sorted(allowed)}"
                )
            methods = None if rule.methods is None else method_names(rule.methods)
            scope_types.update(rule.scopes)
            if _is_literal(rule.path):
                # Starlette's "$" also matches before one final newline: so does the map.
                for path in (str(rule.path), str(rule.path) + "\n"):
                    self._exact.setdefault(path, []).append((index, rule, methods))
            else:
                self._patterns.append((index, rule, compile_pattern(rule.path), methods))
        self.scope_types = frozenset(scope_types)

    def match(self, scope: Scope) -> tuple[int, Rule] | None:
        """The first rule (in declaration order) that applies to ``scope``."""
        kind = scope["type"]
        method = scope.get("method", "GET")
        path = route_path(scope)
        best: tuple[int, Rule] | None = None
        for index, rule, methods in self._exact.get(path, ()):
            if kind in rule.scopes and (methods is None or method in methods):
                best = (index, rule)
                break
        for index, rule, pattern, methods in self._patterns:
            if best is not None and index > best[0]:
                break
            if (
                kind in rule.scopes
                and (methods is None or method in methods)
                and pattern.fullmatch(path) is not None
            ):
                return index, rule
        return best


def path_predicate(
    patterns: Sequence[str | re.Pattern[str]] | str | re.Pattern[str],
) -> Callable[[str], bool] | None:
    """A fast ``path -> bool`` for exempt lists (``None`` if the list is empty)."""
    given: object = patterns  # typed, but checked: untyped callers exist
    if isinstance(given, str | re.Pattern):
        given = [given]
    elif not isinstance(given, Iterable) or isinstance(given, bytes):
        raise ConfigurationError(f"exempt must be a list of path patterns, got {patterns!r}")
    patterns = list(given)
    if not patterns:
        return None
    exact = frozenset(p for p in patterns if isinstance(p, str) and _is_literal(p))
    for path in exact:  # compile_pattern checks the others
        if not path.startswith("/"):  # a request path does: this would exempt nothing
            raise ConfigurationError(
                f"an exempt path must start with '/', got {path!r} (did you mean {'/' + path!r}?)"
            )
    compiled = [compile_pattern(p) for p in patterns if not _is_literal(p)]
    # Starlette's "$" also matches before one final newline: so does the set.
    exact = exact | {path + "\n" for path in exact}
    if not compiled:
        return exact.__contains__

    def matches(path: str) -> bool:
        return path in exact or any(p.fullmatch(path) is not None for p in compiled)

    return matches
