"""The result cache: summaries by source URL (valid while the source version holds),
results by job id, and a short-TTL negative cache for sources that do not exist.

* :class:`SqliteCache` (default): one local file, WAL mode; operations are
  sub-millisecond local writes, run inline.
* :class:`RedisCache` (``--redis``): shared by every worker, each operation bounded by
  a short timeout; when Redis is down a lookup is a miss and a write is dropped (and
  counted), so the cache can never take the service down with it.

An entry is *fresh* for ``freshness`` seconds after its version was last checked:
fresh entries are served without touching any upstream; stale ones are revalidated by
the job's metadata stage (same version: served from cache; new version: summarized
again, the entry replaced).

Example::

    cache = SqliteCache("/tmp/summaries.db")
    await cache.put_url(url, {"version": 3, "summary": "...", "id": "abc"})
    entry = await cache.get_url(url)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections import Counter
from typing import Any

__all__ = ["Cache", "CacheUnavailable", "RedisCache", "SqliteCache", "build_cache"]


def _h(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class CacheUnavailable(Exception):
    """The store could not be asked (it is down): neither a hit nor a miss."""


_FAILED = object()


class Cache:
    """Interface of the result cache (see the module docstring)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    async def get_url(self, url: str) -> dict[str, Any] | None:
        """The cached entry of ``url`` (``checked_at`` included), or ``None``."""
        raise NotImplementedError

    async def put_url(self, url: str, entry: dict[str, Any]) -> None:
        """Store the entry of ``url`` (its version was just checked)."""
        raise NotImplementedError

    async def invalidate(self, url: str) -> None:
        """Drop the entry of ``url``."""
        raise NotImplementedError

    async def get_result(self, job_id: str) -> dict[str, Any] | None:
        """A finished job's public document by id, or ``None`` (no such id).

        Raises :class:`CacheUnavailable` when the store cannot answer: a miss then would
        be taken for an unknown id (and negatively cached).
        """
        raise NotImplementedError

    async def put_result(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store a finished job's public document."""
        raise NotImplementedError

    async def is_missing(self, url: str) -> bool:
        """Whether ``url`` is negatively cached (known not to exist, for a short while)."""
        raise NotImplementedError

    async def put_missing(self, url: str, ttl: float) -> None:
        """Remember for ``ttl`` seconds that ``url`` does not exist."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources."""


class SqliteCache(Cache):
    """The default cache: a local SQLite file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS by_url (url TEXT PRIMARY KEY, entry TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS by_id (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS missing (url TEXT PRIMARY KEY, expires REAL NOT NULL);
            """
        )

    async def get_url(self, url: str) -> dict[str, Any] | None:
        """See :meth:`Cache.get_url`."""
        row = self.db.execute("SELECT entry FROM by_url WHERE url = ?", (url,)).fetchone()
        self.counts["hit" if row else "miss"] += 1
        return None if row is None else dict(json.loads(row[0]))

    async def put_url(self, url: str, entry: dict[str, Any]) -> None:
        """See :meth:`Cache.put_url`."""
        entry = {**entry, "checked_at": time.time()}
        self.db.execute(
            "INSERT OR REPLACE INTO by_url (url, entry) VALUES (?, ?)", (url, json.dumps(entry))
        )

    async def invalidate(self, url: str) -> None:
        """See :meth:`Cache.invalidate`."""
        self.db.execute("DELETE FROM by_url WHERE url = ?", (url,))

    async def get_result(self, job_id: str) -> dict[str, Any] | None:
        """See :meth:`Cache.get_result`."""
        row = self.db.execute("SELECT doc FROM by_id WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    async def put_result(self, job_id: str, doc: dict[str, Any]) -> None:
        """See :meth:`Cache.put_result`."""
        self.db.execute(
            "INSERT OR REPLACE INTO by_id (id, doc) VALUES (?, ?)", (job_id, json.dumps(doc))
        )

    async def is_missing(self, url: str) -> bool:
        """See :meth:`Cache.is_missing`."""
        row = self.db.execute("SELECT expires FROM missing WHERE url = ?", (url,)).fetchone()
        return row is not None and row[0] > time.time()

    async def put_missing(self, url: str, ttl: float) -> None:
        """See :meth:`Cache.put_missing`."""
        self.db.execute(
            "INSERT OR REPLACE INTO missing (url, expires) VALUES (?, ?)", (url, time.time() + ttl)
        )

    def close(self) -> None:
        """Close the database."""
        self.db.close()


_POOL_SIZE = 32
_POOL_WAIT = 1.0
_CONNECT_TIMEOUT = 0.5


class RedisCache(Cache):
    """The shared cache on Redis, behind a circuit breaker.

    Every command is bounded by ``timeout`` seconds (no client-side retries; a call may
    first wait up to a second for one of the pool's 32 connections); after two
    failures in a row the breaker opens and the cache answers "miss" at once for a
    second, then one call probes Redis again. A dead Redis costs the service one
    timeout per second, not one per request.
    """

    def __init__(self, url: str, *, prefix: str = "summarizer:cache", timeout: float = 0.1) -> None:
        super().__init__()
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        import resilience as rs

        # A bounded pool: a burst of lookups on a cold pool opened one connection each,
        # at once, and the connects that missed the command timeout on a busy loop
        # failed healthy lookups and tripped the breaker (503s with Redis idle). A
        # connection is waited for up to _POOL_WAIT (commands take well under 1 ms),
        # and a connect gets _CONNECT_TIMEOUT (a refused one fails at once anyway).
        self.client = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=_POOL_SIZE,
                timeout=_POOL_WAIT,
                socket_timeout=timeout,
                socket_connect_timeout=max(timeout, _CONNECT_TIMEOUT),
                retry=Retry(NoBackoff(), 0),
            )
        )
        self.prefix = prefix
        self.breaker = rs.CircuitBreaker(
            failure_rate=None, consecutive_failures=2, open_for=1.0, name="summarizer.cache"
        )

    def _k(self, kind: str, value: str) -> str:
        return f"{self.prefix}:{kind}:{_h(value)}"

    async def _run(self, op: str, *args: Any, failed: Any = None) -> Any:
        """``op`` on Redis; ``failed`` when Redis fails or the breaker is open."""
        import resilience as rs

        try:
            permit = self.breaker.acquire_nowait()
        except rs.CircuitOpen:
            self.counts["skipped"] += 1
            return failed
        try:
            result = await getattr(self.client, op)(*args)
        except Exception as exc:
            permit.failure(exc)
            self.counts["errors"] += 1
            return failed
        permit.success()
        return result

    async def get_url(self, url: str) -> dict[str, Any] | None:
        """See :meth:`Cache.get_url` (a miss when Redis fails)."""
        raw = await self._run("get", self._k("url", url))
        self.counts["hit" if raw else "miss"] += 1
        return None if raw is None else dict(json.loads(raw))

    async def put_url(self, url: str, entry: dict[str, Any]) -> None:
        """See :meth:`Cache.put_url` (dropped when Redis fails)."""
        entry = {**entry, "checked_at": time.time()}
        await self._run("set", self._k("url", url), json.dumps(entry))

    async def invalidate(self, url: str) -> None:
        """See :meth:`Cache.invalidate`."""
        await self._run("delete", self._k("url", url))

    async def get_result(self, job_id: str) -> dict[str, Any] | None:
        """See :meth:`Cache.get_result` (:class:`CacheUnavailable` when Redis fails)."""
        raw = await self._run("get", self._k("id", job_id), failed=_FAILED)
        if raw is _FAILED:
            raise CacheUnavailable
        return None if raw is None else dict(json.loads(raw))

    async def put_result(self, job_id: str, doc: dict[str, Any]) -> None:
        """See :meth:`Cache.put_result` (kept a day)."""
        await self._run("set", self._k("id", job_id), json.dumps(doc), 86400)

    async def is_missing(self, url: str) -> bool:
        """See :meth:`Cache.is_missing`."""
        return bool(await self._run("exists", self._k("missing", url)))

    async def put_missing(self, url: str, ttl: float) -> None:
        """See :meth:`Cache.put_missing`."""
        await self._run("set", self._k("missing", url), "1", max(1, int(ttl)))


def build_cache(redis_url: str | None, sqlite_path: str) -> Cache:
    """Redis when configured, else SQLite at ``sqlite_path``."""
    if redis_url:
        return RedisCache(redis_url)
    return SqliteCache(sqlite_path)
