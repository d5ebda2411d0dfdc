"""Hosts: the default key of a request, the state kept per host, and their table.

The table is a plain dict on the read path, bounded in size and idle time.

:class:`~resilience._keyed.BoundedMap` keeps exact LRU order under a lock; every request
of the transport looks its host up, so this table trades a little exactness for a
lock-free read (one ``dict.get``, one counter bump, one store). Each read stamps the
entry with a use counter; the table is bounded two ways:

* **size**: an insert beyond ``max_keys`` evicts the least recently used tenth of the
  table (by stamp; amortised O(log n) per insert);
* **idle time**: at most every ``idle_ttl`` seconds, an insert drops the entries not
  used since the previous such sweep (so an entry goes after ``idle_ttl`` to twice that
  of idleness).

A dropped entry is re-created by ``factory`` on its next use, in a fresh state.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._clock import Clock
from .._validate import check_int, check_number
from ..errors import ConfigurationError
from ._latency import Latencies
from ._pace import Pace

if TYPE_CHECKING:
    import httpx

    from ..breaker import CircuitBreaker
    from ..bulkhead import Bulkhead
    from ..ratelimit import RateLimiter

__all__ = ["Host", "HostTable", "host_key", "split_port"]


def host_key(request: httpx.Request) -> str:
    """The default key of a request: its host, with the port when it is not the default.

    Example: ``host_key(httpx.Request("GET", "http://127.0.0.1:8000/")) == "127.0.0.1:8000"``
    """
    url = request.url
    port = url.port
    return url.host if port is None else f"{url.host}:{port}"


def split_port(text: str) -> tuple[str, str | None]:
    """``("host", "8080")`` for ``"host:8080"``; ``(text, None)`` without a port.

    Text with more colons (an IPv6 literal) is left whole: its colons are ambiguous.

    Example: ``split_port("api.example.com:8443") == ("api.example.com", "8443")``
    """
    name, _, port = text.rpartition(":")
    if port.isdigit() and name and ":" not in name:
        return name, port
    return text, None


def check_host_patterns(what: str, hosts: Any) -> list[tuple[str, Any]]:
    """``hosts`` (a mapping of host names or globs, optionally with ``:port``) as pairs;
    a pattern with a scheme, a path or spaces could never match a host: refused.

    Example: ``check_host_patterns("hosts", {"*.example.com": policy})``
    """
    if hosts is None:
        return []
    if not isinstance(hosts, Mapping):
        raise ConfigurationError(f"{what} must map host names or globs to settings, got {hosts!r}")
    for pattern in hosts:
        if (
            not isinstance(pattern, str)
            or not pattern
            or "/" in pattern  # a scheme (://) or a path
            or any(c.isspace() for c in pattern)
        ):
            raise ConfigurationError(
                f"{what} keys must be host names or globs such as 'api.example.com' or "
                f"'*.example.com:8443' (no scheme, no path), got {pattern!r}"
            )
    return list(hosts.items())


class Host:
    """The state of one host: its policies, what its server said, its recent latencies.

    Example: ``Host("api.example.com", bulkhead, None, None, None).pace.active is False``
    """

    __slots__ = (
        "breaker",
        "breaker_key",
        "bulkhead",
        "key",
        "latencies",
        "limiter",
        "pace",
        "used",
    )

    def __init__(
        self,
        key: Hashable,
        bulkhead: Bulkhead | None,
        limiter: RateLimiter | None,
        breaker: CircuitBreaker | None,
        latencies: Latencies | None,
    ) -> None:
        self.key = key
        self.bulkhead = bulkhead
        self.limiter = limiter
        self.breaker = breaker
        # A keyed breaker keeps one circuit per host; an unkeyed one is shared.
        self.breaker_key = key if breaker is not None and breaker.keyed else None
        self.latencies = latencies
        self.pace = Pace()
        #: When it was last used, by the table's use counter.
        self.used = 0


class Entry(Protocol):
    """What the table needs of its values: a ``used`` stamp it writes."""

    used: int


V = TypeVar("V", bound=Entry)


class HostTable(Generic[V]):
    """A bounded, thread-safe ``key -> entry`` table whose reads take no lock.

    Example::

        hosts = HostTable(new_host, max_keys=10_000, idle_ttl=600.0, clock=clock)
        host = hosts.get("api.example.com")
    """

    __slots__ = (
        "_clock",
        "_data",
        "_factory",
        "_lock",
        "_next_sweep",
        "_swept_at",
        "_uses",
        "idle_ttl",
        "max_keys",
    )

    def __init__(
        self, factory: Callable[[Hashable], V], *, max_keys: int, idle_ttl: float, clock: Clock
    ) -> None:
        self.max_keys: int = check_int("max_hosts", max_keys, minimum=1)
        self.idle_ttl: float = check_number("idle_ttl", idle_ttl, strict=True)
        self._factory = factory
        self._clock = clock
        self._data: dict[Hashable, V] = {}
        self._lock = threading.Lock()
        self._uses = 0  # the use counter (races may lose a bump: only order matters)
        self._swept_at = 0  # the counter at the last idle sweep
        self._next_sweep = clock.monotonic() + self.idle_ttl

    def get(self, key: Hashable) -> V:
        """The entry of ``key``, created if needed, stamped as used now."""
        entry = self._data.get(key)
        if entry is None:
            return self._insert(key)
        self._uses = uses = self._uses + 1
        entry.used = uses
        return entry

    def _insert(self, key: Hashable) -> V:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                now = self._clock.monotonic()
                if now >= self._next_sweep:
                    self._sweep()
                    self._next_sweep = now + self.idle_ttl
                if len(self._data) >= self.max_keys:
                    self._evict(max(self.max_keys // 10, 1))
                entry = self._factory(key)
                self._data[key] = entry
            self._uses = uses = self._uses + 1
            entry.used = uses
            return entry

    def _sweep(self) -> None:
        """Drop the entries unused since the previous sweep."""
        data = self._data
        cutoff = self._swept_at
        for key in [key for key, entry in data.items() if entry.used <= cutoff]:
            del data[key]
        self._swept_at = self._uses

    def _evict(self, count: int) -> None:
        """Drop the ``count`` least recently used entries."""
        data = self._data
        for key, _ in heapq.nsmallest(count, data.items(), key=_stamp):
            del data[key]

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data


def _stamp(item: tuple[Hashable, Entry]) -> int:
    return item[1].used
