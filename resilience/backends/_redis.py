"""Redis as shared state: one backend object, one generic script seam.

Every distributed decision of every policy (take tokens, lease a bulkhead slot,
record a breaker outcome) is **one** Lua script run with ``EVALSHA``: one round trip,
atomic, with time read from Redis ``TIME`` inside the script. This module gives the
policies what they need for that and nothing more:

* :class:`RedisBackend`: the clients (sync, async per event loop, trio through a
  worker thread), the timeout, the key prefix, :meth:`RedisBackend.key` (Redis Cluster
  hash tags, hashed user keys) and :meth:`RedisBackend.script`.
* :class:`RedisScript`: ``run(keys, args)`` / ``await run_async(keys, args)``:
  ``EVALSHA`` with transparent ``NOSCRIPT`` reload, bounded by the backend timeout,
  every failure raised as :class:`~resilience.BackendError` (original as ``__cause__``).

redis-py is imported lazily: ``import resilience`` works without it, and using a
Redis backend without it raises ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .._validate import check_bool, check_number
from ..errors import BackendError, ConfigurationError
from . import _reply_first as reply_first

__all__ = ["PreparedCall", "RedisBackend", "RedisScript", "require_redis"]

#: What a key part or script argument may be.
Part = str | bytes | int | float

_MAX_RAW_PART = 64
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@=+,")


#: Seconds a fresh connection's handshake may take beyond the backend timeout (a busy
#: host): a run is then bounded by ``timeout`` for the handshake plus this, and
#: ``timeout`` for the command, which is ``RedisBackend.round_trip_bound``.
_HANDSHAKE_ALLOWANCE = 0.05
#: Connections an async lane opens at once (see ``_Lane``).
_MAX_OPENING = 4
#: Seconds a new async cluster client may take to read the slot map and command table
#: (in the background; decisions meanwhile go through the sync client).
_CLUSTER_INIT_BUDGET = 5.0


def require_redis() -> Any:
    """Import and return :mod:`redis`, or raise ``ImportError`` naming the extra."""
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the Redis backend needs redis-py: pip install 'resilience[redis]'"
        ) from exc
    return redis


def _safe_part(part: Part) -> str:
    """A key part as it appears in a Redis key: short safe text raw, anything else hashed."""
    if isinstance(part, int | float):  # bool included: True is "True", not bytes(True)
        return repr(part)
    if isinstance(part, str) and len(part) <= _MAX_RAW_PART and _SAFE.issuperset(part):
        return part
    data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else bytes(part)
    return "#" + hashlib.blake2b(data, digest_size=12).hexdigest()


def _redis_errors() -> tuple[type[BaseException], ...]:
    redis = require_redis()
    return (redis.RedisError, OSError, asyncio.TimeoutError)


def _encode(value: Part) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    raise TypeError(f"Redis script keys and arguments are str, bytes, int or float: {value!r}")


def _pack(parts: Sequence[bytes]) -> bytes:
    """One RESP command (an array of bulk strings), as redis-py would send it."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class PreparedCall:
    """One run of a :class:`RedisScript` with fixed keys and arguments, packed once.

    Build it with :meth:`RedisScript.prepare` and run it as often as needed with
    :meth:`RedisScript.run_prepared`: hot paths (a limiter's default decision for a
    key) skip argument encoding entirely.

    Example::

        call = script.prepare([backend.key("k")], [1, 0])
        script.run_prepared(call)
    """

    __slots__ = ("args", "evalsha", "keys")

    def __init__(self, sha: bytes, keys: Sequence[Part], args: Sequence[Part]) -> None:
        self.keys = tuple(keys)
        self.args = tuple(args)
        encoded = [_encode(part) for part in (*self.keys, *self.args)]
        #: The packed ``EVALSHA sha numkeys keys... args...`` command.
        self.evalsha = _pack([b"EVALSHA", sha, b"%d" % len(self.keys), *encoded])

    def eval(self, lua: bytes) -> bytes:
        """The packed ``EVAL`` command (sent once after ``NOSCRIPT``)."""
        encoded = [_encode(part) for part in (*self.keys, *self.args)]
        return _pack([b"EVAL", lua, b"%d" % len(self.keys), *encoded])


class RedisScript:
    """A Lua script bound to a :class:`RedisBackend`; run it with :meth:`run`/:meth:`run_async`.

    Made by :meth:`RedisBackend.script` (usually once, at policy construction). Each run
    is one ``EVALSHA`` round trip; when Redis does not know the script (``NOSCRIPT``
    after a restart, a failover or ``SCRIPT FLUSH``) it is sent again with ``EVAL``
    transparently. Every failure (connection refused, reset, a paused server hitting
    the backend timeout, a Lua error) is raised as :class:`~resilience.BackendError`
    with the original exception as ``__cause__``. Keys and arguments may be ``str``,
    ``bytes``, ``int`` or ``float``; replies are redis-py's (bytes for strings).

    Example::

        incr = backend.script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        assert incr.run([backend.key("counter")], [5]) == 5
        assert await incr.run_async([backend.key("counter")], [1]) == 6
    """

    __slots__ = ("_backend", "_lua_bytes", "_sha_bytes", "lua", "sha")

    def __init__(self, backend: RedisBackend, lua: str) -> None:
        if not isinstance(lua, str) or not lua.strip():
            raise ConfigurationError(f"lua must be a non-empty string, got {lua!r}")
        self._backend = backend
        self.lua = lua
        self._lua_bytes = lua.encode()
        #: The SHA1 that ``EVALSHA`` uses.
        self.sha = hashlib.sha1(self._lua_bytes).hexdigest()
        self._sha_bytes = self.sha.encode()

    def prepare(self, keys: Sequence[Part], args: Sequence[Part] = ()) -> PreparedCall:
        """Pack a run once, for :meth:`run_prepared` / :meth:`run_prepared_async`.

        Example: ``call = script.prepare([key], [1, 0])``
        """
        return PreparedCall(self._sha_bytes, keys, args)

    def run(self, keys: Sequence[Part], args: Sequence[Part] = ()) -> Any:
        """Run the script synchronously (bounded by the backend timeout).

        Raises :class:`~resilience.BackendError` on any Redis or network failure.

        Example: ``allowed, remaining = script.run([key], [10, 1])``
        """
        return self._backend._run_sync(self, PreparedCall(self._sha_bytes, keys, args))

    async def run_async(self, keys: Sequence[Part], args: Sequence[Part] = ()) -> Any:
        """Run the script from asyncio or trio (bounded by the backend timeout).

        On asyncio it uses the backend's ``redis.asyncio`` client for the running loop;
        on trio it runs the sync client in a worker thread. Raises
        :class:`~resilience.BackendError` on any failure, and never waits longer than
        the backend timeout for a paused or unreachable server.

        Example: ``allowed, remaining = await script.run_async([key], [10, 1])``
        """
        return await self._backend._run_async(self, PreparedCall(self._sha_bytes, keys, args))

    def run_prepared(self, call: PreparedCall) -> Any:
        """Like :meth:`run`, for a call packed by :meth:`prepare`.

        Example: ``script.run_prepared(call)``
        """
        return self._backend._run_sync(self, call)

    async def run_prepared_async(self, call: PreparedCall) -> Any:
        """Like :meth:`run_async`, for a call packed by :meth:`prepare`.

        Example: ``await script.run_prepared_async(call)``
        """
        return await self._backend._run_async(self, call)

    def __repr__(self) -> str:
        return f"<RedisScript {self.sha[:10]}>"


#: The longest backend timeout accepted (seconds): a round trip that may take longer
#: is no failure mode at all, and socket timeouts overflow far beyond it.
_MAX_TIMEOUT = 3600.0


def _check_timeout(timeout: Any) -> float:
    seconds: float = check_number("timeout", timeout, minimum=0.0, strict=True)
    if seconds > _MAX_TIMEOUT:
        raise ConfigurationError(
            f"timeout is the bound on one Redis round trip (default 0.05 s); it must be "
            f"<= {_MAX_TIMEOUT:g} s, got {timeout!r}"
        )
    return seconds


class RedisBackend:
    """Shared state on Redis (standalone, Sentinel-managed or Cluster) for every policy.

    Build it from a URL, or from redis-py clients you already have::

        backend = RedisBackend.from_url("redis://localhost:6379/0", prefix="myapp")
        backend = RedisBackend(sync_client=redis.Redis(...), async_client=redis.asyncio.Redis(...))
        backend = RedisBackend.from_url("redis://node1:7000", cluster=True)   # Redis Cluster

    ``timeout`` (seconds, default 50 ms) bounds every script run, so a dead or paused
    Redis never adds more than ``timeout`` to a call. Script runs on a plain
    ``redis.Redis`` / ``redis.asyncio.Redis`` (built here or passed in) use the backend's
    own connections, made with the client's options but with ``timeout`` as socket
    timeout and no redis-py retries; async runs are cut at ``timeout`` as a whole. Other
    clients (Redis Cluster, Sentinel, client-side caching) are used as they are: the
    ones :meth:`from_url` builds get ``timeout`` as socket timeout; give yours the same.

    The async side: with ``async_client=`` that client is used; otherwise, when the
    backend was built from a URL, one ``redis.asyncio`` client is made per running
    asyncio event loop (they cannot be shared between loops). On trio, or when no
    async client is available, async runs use the sync client in a worker thread.

    Policies use two methods: :meth:`key` and :meth:`script`. Pass one backend to many
    policies; it is thread-safe and cheap to share.

    Example::

        redis_backend = rs.backends.RedisBackend.from_url("redis://localhost:6379/0")
        limiter = rs.RateLimiter("100/s", key=lambda user, *_: user, backend=redis_backend)
    """

    def __init__(
        self,
        sync_client: Any = None,
        async_client: Any = None,
        *,
        prefix: str = "rs",
        timeout: float = 0.05,
        url: str | None = None,
        cluster: bool = False,
    ) -> None:
        require_redis()
        for name, client in (("sync_client", sync_client), ("async_client", async_client)):
            if client is not None and not callable(getattr(client, "evalsha", None)):
                raise ConfigurationError(
                    f"{name} must be a redis-py client (redis.Redis or redis.asyncio.Redis, "
                    f"or their cluster clients), got {client!r}"
                )
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"prefix must be a non-empty string without braces: {prefix!r}"
            )
        self.prefix = prefix
        self.timeout: float = _check_timeout(timeout)
        self.cluster = check_bool("cluster", cluster)
        self._url = url
        self._sync_client = sync_client
        self._async_client = async_client
        # Per event loop (clients are bound to one). Not weak: a client's connections
        # refer to its loop, so a weak key would never die; the clients of closed loops
        # are dropped whenever a new loop needs one (see _forget_closed_loops).
        self._loop_clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._lock = threading.Lock()
        self._errors = _redis_errors()
        redis = require_redis()
        self._noscript: type[BaseException] = redis.exceptions.NoScriptError
        self._response_error: type[BaseException] = redis.ResponseError
        self._lanes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        # Async cluster clients being initialised in the background (see _run_async).
        self._initializing: weakref.WeakKeyDictionary[Any, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        # (loop, lane) of the last async run: one identity check on the hot path. It keeps
        # at most one finished loop (and its client) alive until another loop runs a script.
        self._last_lane: tuple[Any, Any] = (None, None)
        self._sync_lane = _SyncLane.for_client(sync_client, self.timeout)

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "rs",
        timeout: float = 0.05,
        cluster: bool = False,
        **client_options: Any,
    ) -> RedisBackend:
        """A backend whose clients are built from ``url`` with ``timeout`` as socket timeout.

        ``cluster=True`` builds ``redis.cluster.RedisCluster`` clients (the URL names any
        node). Extra keyword arguments go to the redis-py client constructor.

        Example::

            backend = RedisBackend.from_url("redis://localhost:6379/0", prefix="api", timeout=0.1)
        """
        timeout = _check_timeout(timeout)
        if not isinstance(url, str) or not url:
            raise ConfigurationError(
                f"url must be a Redis URL such as 'redis://host:6379/0', got {url!r}"
            )
        _check_db_path(url)
        backend = cls(prefix=prefix, timeout=timeout, url=url, cluster=cluster)
        backend._client_options = client_options
        try:
            backend._sync_client = backend._make_client(asynchronous=False)
            pool = getattr(backend._sync_client, "connection_pool", None)
            if pool is not None:  # options the connections would refuse at first use
                pool.connection_class(**pool.connection_kwargs)
        except (ValueError, TypeError) as exc:  # a malformed URL, an unknown option
            raise ConfigurationError(f"cannot build a Redis client for {url!r}: {exc}") from exc
        backend._sync_lane = _SyncLane.for_client(backend._sync_client, backend.timeout)
        return backend

    _client_options: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance

    def _make_client(self, *, asynchronous: bool) -> Any:
        assert self._url is not None
        redis = require_redis()
        # Sync sockets get the timeout once (settimeout, free per call). Async clients
        # get none for reads and writes: redis.asyncio would then wrap every write in
        # asyncio.wait_for (a task per command); script runs are bounded as a whole by
        # one asyncio.timeout instead.
        options: dict[str, Any] = {
            "socket_timeout": None if asynchronous else self.timeout,
            "socket_connect_timeout": self.timeout,
        }
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: redis-py's defaults (a cluster's above all: each retry waits out
        # the timeout again and re-reads the slot map) would multiply the time a dead
        # or paused node adds to a call; the failure modes take over after one timeout.
        if self.cluster:
            if asynchronous:
                from redis.asyncio.cluster import RedisCluster as AsyncCluster
                from redis.asyncio.retry import Retry as AsyncRetry

                options["retry"] = AsyncRetry(NoBackoff(), 0)
                options.update(self._client_options)
                return AsyncCluster.from_url(self._url, **options)
            from redis.cluster import RedisCluster

            options["retry"] = Retry(NoBackoff(), 0)
            options.update(self._client_options)
            return RedisCluster.from_url(self._url, **options)
        options["retry"] = Retry(NoBackoff(), 0)
        options.update(self._client_options)
        if asynchronous:
            from redis.asyncio.retry import Retry as AsyncRetry

            options["retry"] = self._client_options.get("retry", AsyncRetry(NoBackoff(), 0))
            return redis.asyncio.Redis.from_url(self._url, **options)
        return redis.Redis.from_url(self._url, **options)

    # ----------------------------------------------------------------- public seam

    @property
    def sync_client(self) -> Any:
        """The redis-py sync client (``redis.Redis`` or ``redis.cluster.RedisCluster``).

        Example: ``backend.sync_client.ping()``
        """
        if self._sync_client is None:
            raise ConfigurationError(
                "this RedisBackend has no sync client: pass sync_client= or use from_url()"
            )
        return self._sync_client

    def async_client(self) -> Any:
        """The ``redis.asyncio`` client for the running asyncio loop, or ``None``.

        ``None`` means async runs go through the sync client in a worker thread (trio,
        or a backend given only a sync client). A client made from the URL is cached per
        event loop, because redis.asyncio clients are bound to the loop that first used them.
        It has a connect timeout but no read timeout (so that blocking reads such as
        pub/sub work): bound your own awaits, e.g. with ``asyncio.timeout(backend.timeout)``;
        script runs are bounded already.

        Example::

            client = backend.async_client()
            if client is not None:
                await client.ping()
        """
        loop = asyncio._get_running_loop()
        if loop is None:  # trio (or no loop at all): a redis.asyncio client cannot run
            return None
        if self._async_client is not None:
            return self._async_client
        if self._url is None:
            return None
        client = self._loop_clients.get(loop)
        if client is None:
            with self._lock:
                client = self._loop_clients.get(loop)
                if client is None:
                    self._forget_closed_loops()
                    client = self._make_client(asynchronous=True)
                    self._loop_clients = {**self._loop_clients, loop: client}
        return client

    def _forget_closed_loops(self) -> None:
        """Drop the clients (and lanes) of event loops that are closed.

        Their connections can never be used again; once unreferenced, their sockets are
        closed as they are collected. Without this, a process that runs
        ``asyncio.run()`` per job kept one server connection per job until Redis'
        ``maxclients`` refused everyone.
        """
        closed = [loop for loop in self._loop_clients if loop.is_closed()]
        if not closed:
            return
        clients = dict(self._loop_clients)
        for loop in closed:
            self._lanes.pop(clients.pop(loop), None)
        self._loop_clients = clients
        if self._last_lane[0] in closed:
            self._last_lane = (None, None)

    @property
    def round_trip_bound(self) -> float:
        """Seconds after which a round trip is over, one way or the other: the socket
        timeouts (the backend ``timeout``) bound every operation, with room for a fresh
        connection's handshake on a busy host; async runs in a worker thread are cut
        (and the thread abandoned) at this bound."""
        return 2 * self.timeout + _HANDSHAKE_ALLOWANCE

    def key(self, *parts: Part) -> str:
        """A Redis key ``"{prefix}:{<parts>}"`` whose hash tag covers all ``parts``.

        Short parts made of safe characters appear as they are; long, binary or unusual
        parts (user input) are hashed (``#`` + 24 hex digits), so user keys are never
        pasted raw into Redis keys. Keys built from the same parts share one hash tag,
        so a script may append suffixes for sibling keys of the same decision and still
        run on one Redis Cluster slot.

        Example::

            base = backend.key("bulkhead", "downloads", "example.com")
            # 'rs:{bulkhead:downloads:example.com}'
            leases, queue = base + ":leases", base + ":queue"   # same slot
        """
        if not parts:
            raise ConfigurationError("key() needs at least one part")
        return f"{self.prefix}:{{{':'.join(map(_safe_part, parts))}}}"

    def script(self, lua: str) -> RedisScript:
        """Wrap Lua source as a :class:`RedisScript` (one ``EVALSHA`` per run).

        Example::

            take = backend.script(open("take.lua").read())
            result = take.run([backend.key("k")], [1])
        """
        return RedisScript(self, lua)

    def close(self) -> None:
        """Close the sync client's connections (clients you passed in are left open).

        Example: ``backend.close()``
        """
        if self._sync_lane is not None:
            self._sync_lane.close()
        if self._url is not None and self._sync_client is not None:
            self._sync_client.close()

    async def aclose(self) -> None:
        """Close the async client of the running loop, if this backend made it.

        Example: ``await backend.aclose()``
        """
        loop = asyncio._get_running_loop()
        if self._url is not None and loop is not None:
            client = self._loop_clients.pop(loop, None)
            self._last_lane = (None, None)
            if client is not None:
                lane = self._lanes.pop(client, None)
                if isinstance(lane, _Lane):
                    await lane.close()
                initializing = self._initializing.pop(client, None)
                if initializing is not None and not initializing.done():
                    # A cluster client still being set up: redis-py's aclose() would not
                    # close it, and the setup would then open connections nobody holds.
                    initializing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await initializing
                await client.aclose()

    def __repr__(self) -> str:
        where = self._url or "clients"
        return f"<RedisBackend {where} prefix={self.prefix!r} timeout={self.timeout:g}>"

    # ----------------------------------------------------------------- running scripts

    def _run_sync(self, script: RedisScript, call: PreparedCall) -> Any:
        try:
            lane = self._sync_lane
            if lane is not None:
                return lane.run(script, call)
            client = self.sync_client
            try:
                return client.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
            except self._noscript:
                return client.eval(script.lua, len(call.keys), *call.keys, *call.args)
        except self._errors as exc:
            raise BackendError(f"redis script failed: {exc!r}") from exc

    async def _run_async(self, script: RedisScript, call: PreparedCall) -> Any:
        lane = self._async_lane()
        try:
            if lane is None:
                return await self._run_in_thread(script, call)
            if isinstance(lane, _Lane):
                return await lane.run(script, call)  # bounds its own steps
            if getattr(lane, "_initialize", False) is True:
                # A new cluster client (one per event loop) first reads the slot map and
                # the command table, which can take longer than a decision may: it does
                # so in the background while the sync client (set up already) decides.
                if self._sync_client is not None:
                    self._initialize_in_background(lane)
                    return await self._run_in_thread(script, call)
                async with asyncio.timeout(self.timeout + _HANDSHAKE_ALLOWANCE):
                    await lane.initialize()
            async with asyncio.timeout(self.timeout):
                try:
                    return await lane.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
                except self._noscript:
                    return await lane.eval(script.lua, len(call.keys), *call.keys, *call.args)
        except self._errors as exc:
            raise BackendError(f"redis script failed: {exc!r}") from exc

    def _async_lane(self) -> Any:
        """How async runs reach Redis on this loop: a lean lane, a client, or None (thread)."""
        loop = asyncio._get_running_loop()
        cached_loop, cached_lane = self._last_lane
        if loop is cached_loop and loop is not None:
            return cached_lane
        client = self.async_client()
        if client is None:
            return None
        lane = self._lanes.get(client)
        if lane is None:
            lane = _Lane.for_client(client, self.timeout) or _NO_LANE
            self._lanes[client] = lane
        lane = client if lane is _NO_LANE else lane
        self._last_lane = (loop, lane)
        return lane

    def _initialize_in_background(self, client: Any) -> None:
        """Start initialising an async cluster client, unless that is under way."""
        task = self._initializing.get(client)
        if task is None or task.done():
            self._initializing[client] = asyncio.get_running_loop().create_task(
                self._initialize(client)
            )

    async def _initialize(self, client: Any) -> None:
        try:
            async with asyncio.timeout(_CLUSTER_INIT_BUDGET):
                await client.initialize()
        except Exception:  # a node down or paused: the next decision starts over
            pass

    async def _run_in_thread(self, script: RedisScript, call: PreparedCall) -> Any:
        import anyio
        import anyio.to_thread

        # The socket timeouts (= the backend timeout) bound every operation of the thread;
        # this scope is a safety net for clients built without one (the thread is then
        # abandoned). It leaves room for a fresh connection's handshake on a busy host.
        with anyio.fail_after(self.round_trip_bound):
            return await anyio.to_thread.run_sync(
                self._run_sync, script, call, abandon_on_cancel=True
            )


_NO_LANE = object()


class _SyncLane:
    """Connections of one plain ``redis.Redis`` client, used directly (thread-safe).

    redis-py's pool takes a lock, records metrics and polls the socket on every
    checkout and release. A lane keeps its own stack of idle connections, made by the
    client's pool (same class, options and socket timeout), and sends pre-packed
    commands on them: ``list.pop``/``append`` are atomic, so threads share it without a
    lock. A reused connection that the server closed (restart, idle timeout) is
    reconnected once; a connection that fails any other way is disconnected and
    dropped, never reused. After ``fork()`` the child starts with no connections.
    """

    __slots__ = ("_idle", "_make", "_pid", "_reconnect_errors", "_response_error")

    def __init__(self, pool: Any, timeout: float) -> None:
        redis = require_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # The client's connection class and options, with the backend's bound: socket
        # timeouts = the backend timeout, no retries (whatever the client was built with).
        self._make = _connection_maker(
            pool,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._reconnect_errors = (redis.ConnectionError, ConnectionError)
        self._response_error = redis.ResponseError

    @classmethod
    def for_client(cls, client: Any, timeout: float) -> _SyncLane | None:
        """A lane for a plain client with a plain pool; ``None`` for anything else."""
        if client is None:
            return None
        redis = require_redis()
        if (
            type(client) is not redis.Redis
            or getattr(client, "connection", None) is not None
            or type(client.connection_pool) is not redis.ConnectionPool
            or getattr(client.connection_pool, "cache", None) is not None
        ):
            return None
        return cls(client.connection_pool, timeout)

    def run(self, script: RedisScript, call: PreparedCall) -> Any:
        """One script run on an idle (or new) connection."""
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._idle, self._pid = [], os.getpid()
        idle = self._idle
        try:
            conn = idle.pop()
            reused = True
        except IndexError:
            conn = self._make()
            reused = False
        healthy = False
        try:
            try:
                reply = self._evalsha(conn, script, call)
            except self._reconnect_errors:
                if not reused:
                    raise
                conn.disconnect()
                reply = self._evalsha(conn, script, call)
            healthy = True
            return reply
        except self._response_error:
            healthy = True  # a Lua error: the connection is fine
            raise
        finally:
            if healthy:
                idle.append(conn)
            else:
                conn.disconnect()  # never wait on a broken connection again

    @staticmethod
    def _evalsha(conn: Any, script: RedisScript, call: PreparedCall) -> Any:
        conn.send_packed_command((call.evalsha,), check_health=False)
        try:
            return conn.read_response()
        except script._backend._noscript:
            conn.send_packed_command((call.eval(script._lua_bytes),), check_health=False)
            return conn.read_response()

    def close(self) -> None:
        """Disconnect the idle connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()


class _Lane:
    """Pooled connections of one plain ``redis.asyncio.Redis`` client, used directly.

    The asyncio twin of :class:`_SyncLane` (one per client, so per event loop): redis-py's
    async pool takes a lock and dispatches events on every checkout. A connection that
    fails or is cancelled mid-command is disconnected and dropped, never reused.

    A caller that finds no idle connection opens one, but at most
    :data:`_MAX_OPENING` are opened at once: the others wait for a connection that a
    caller is done with. A handshake costs this event loop about a millisecond of
    CPU and several round trips, and every handshake of a burst shares the loop: a
    hundred callers on a cold lane, each opening its own, would all finish their
    handshakes around the same late moment (past the backend timeout on a small
    host), while a few connections serve the same hundred commands in a few
    milliseconds.
    """

    __slots__ = (
        "_closed",
        "_connect_budget",
        "_idle",
        "_make",
        "_opening",
        "_reconnect_errors",
        "_response_error",
        "_timeout",
        "_waiters",
    )

    def __init__(self, pool: Any, timeout: float) -> None:
        redis = require_redis()
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No read/write timeout (redis.asyncio would add a task per write): each command
        # is bounded by one timer (reply_first.wait_until). A new connection (or the
        # wait for one) gets a budget of its own for the handshake (HELLO, CLIENT
        # SETINFO: several round trips), as the sync client's per-operation socket
        # timeouts give it: inside the run's budget a Redis a few milliseconds away
        # could never be connected to. Together they stay within
        # RedisBackend.round_trip_bound (2 x timeout + 0.05 s). No retries.
        self._timeout = timeout
        self._connect_budget = timeout + _HANDSHAKE_ALLOWANCE
        self._make = _connection_maker(
            pool,
            socket_timeout=None,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._idle: list[Any] = []
        self._closed = False
        self._opening = 0
        # Callers waiting for a connection: each future gets one handed over, or None
        # (an opening failed or a connection was dropped: open one yourself).
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reconnect_errors = (redis.ConnectionError, ConnectionError)
        self._response_error = redis.ResponseError

    @classmethod
    def for_client(cls, client: Any, timeout: float) -> _Lane | None:
        """A lane for a plain asyncio client with a plain pool; ``None`` otherwise."""
        redis = require_redis()
        if (
            type(client) is not redis.asyncio.Redis
            or client.connection is not None
            or type(client.connection_pool) is not redis.asyncio.ConnectionPool
        ):
            return None
        return cls(client.connection_pool, timeout)

    async def run(self, script: RedisScript, call: PreparedCall) -> Any:
        """One script run on an idle (or new, or handed-over) connection, bounded in time:
        a wait for the connection and its handshake share one budget (``timeout`` +
        0.05 s), the command has ``timeout``."""
        idle = self._idle
        loop = asyncio.get_running_loop()
        # The end of the budget a wait for a connection and its handshake share.
        handshake_end = loop.time() + self._connect_budget
        if idle:
            conn = idle.pop()
            reused = True
        else:
            conn, reused = await self._connection(handshake_end)
        healthy = False
        try:
            try:
                reply = await reply_first.wait_until(
                    self._evalsha(conn, script, call), loop.time() + self._timeout
                )
            except self._reconnect_errors:
                if not reused:
                    raise
                # The server closed a connection used before (a restart, CLIENT KILL, its
                # idle timeout): the command never ran there. Retry once on a connection
                # got as any other (at most _MAX_OPENING opened at once: after a restart
                # every caller is here), and drop the idle ones: what closed this one
                # most likely closed them too.
                stale, conn = conn, None
                dead = idle[:]
                idle.clear()
                for each in (stale, *dead):
                    await _drop(each)
                # The budget counts from the run's start: the failed command took some
                # of it (at most its timeout), so the run stays within the round-trip
                # bound (2 x timeout + 0.05 s).
                conn, _ = await self._connection(handshake_end)
                reply = await reply_first.wait_until(
                    self._evalsha(conn, script, call), loop.time() + self._timeout
                )
            healthy = True
            return reply
        except self._response_error:
            healthy = True  # a Lua error: the connection is fine
            raise
        finally:
            if conn is not None:  # (None: _connection failed and cleaned up)
                if healthy and not self._closed:
                    if self._waiters:
                        self._hand_over(conn)
                    else:
                        idle.append(conn)
                else:
                    await self._lose(conn)

    async def _connection(self, deadline: float) -> tuple[Any, bool]:
        """A connection for a caller that found none idle, and whether it was used
        before (handed over by another caller) or opened now (at most
        :data:`_MAX_OPENING` at once); the wait and the handshake end by ``deadline``
        (loop time)."""
        loop = asyncio.get_running_loop()
        while self._opening >= _MAX_OPENING:
            waiter: asyncio.Future[Any] = loop.create_future()
            self._waiters.append(waiter)
            # A timer handle (reply_first.fail_at) instead of a timeout scope: this wait
            # is on the path of every caller a burst queues.
            expiry = reply_first.fail_at(loop, deadline, waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    # Handed over as we gave up: pass it on, unless the lane was closed
                    # meanwhile (its idle list is no longer closed by anyone).
                    handed = waiter.result()
                    if handed is not None and self._closed:
                        await self._lose(handed)
                    else:
                        self._hand_over(handed)
                raise
            finally:
                expiry.cancel()
            if conn is not None:
                return conn, True
        conn = self._make()
        self._opening += 1
        opened = False
        # Each handshake read is bounded by the timeout, as the sync client's socket
        # timeouts bound it: a paused Redis (its kernel still accepts connections)
        # fails after one timeout, not after the whole handshake budget.
        conn.socket_timeout = self._timeout
        try:
            await reply_first.wait_until(conn.connect(), deadline)
            opened = True
        finally:
            conn.socket_timeout = None
            self._opening -= 1
            if not opened:
                await self._lose(conn)
        return conn, False

    async def _lose(self, conn: Any) -> None:
        """Drop a connection that failed (or outlived its lane): a waiter may open the
        one this lane loses."""
        self._hand_over(None)
        await _drop(conn)

    def _hand_over(self, conn: Any) -> None:
        """Give ``conn`` (or ``None``: leave to open one) to the longest waiter; a
        connection nobody waits for goes back to the idle ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # not given up (cancelled, expired) meanwhile
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    @staticmethod
    async def _evalsha(conn: Any, script: RedisScript, call: PreparedCall) -> Any:
        await conn.send_packed_command((call.evalsha,), check_health=False)
        try:
            return await conn.read_response()
        except script._backend._noscript:
            await conn.send_packed_command((call.eval(script._lua_bytes),), check_health=False)
            return await conn.read_response()

    async def close(self) -> None:
        """Disconnect the idle connections; those in use are disconnected as their
        commands end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _drop(conn)


def _connection_maker(pool: Any, **overrides: Any) -> Callable[[], Any]:
    """Build connections of ``pool``'s class and options, with ``overrides``.

    redis-py 8 looks its own version up (``importlib.metadata``, most of a millisecond)
    for every connection built without a ``driver_info``: for redis-py's own classes
    it is looked up once here (a user's subclass may not take ``driver_info``, and
    its signature hides that behind ``**kwargs``).
    """
    options = {**pool.connection_kwargs, **overrides}
    cls = pool.connection_class
    if (
        not options.keys() & {"driver_info", "lib_name", "lib_version"}
        and cls.__module__.partition(".")[0] == "redis"
    ):
        try:
            from redis.driver_info import resolve_driver_info
        except ImportError:  # redis-py before 8: no such lookup
            pass
        else:
            options["driver_info"] = resolve_driver_info()
    return functools.partial(cls, **options)


async def _drop(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # best effort on a connection we abandon
        pass


def _check_db_path(url: str) -> None:
    """Refuse a ``redis://host/<path>`` whose path is not a database number: redis-py
    ignores such a path and silently uses database 0, perhaps another service's data."""
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return  # redis-py reports a malformed URL itself
    if parts.scheme not in ("redis", "rediss"):
        return
    db = unquote(parts.path).strip("/")
    if db and not (db.isascii() and db.isdigit()):
        raise ConfigurationError(
            f"the path of {url!r} must be a database number (redis://host:6379/0), got {db!r}"
        )
