"""Window algorithms delegated to the ``limits`` library, behind the RateLimiter API.

``algorithm="fixed-window" | "moving-window" | "sliding-window"`` maps to limits'
``FixedWindowRateLimiter``, ``MovingWindowRateLimiter`` and
``SlidingWindowCounterRateLimiter``. Storage is limits' ``MemoryStorage`` for a
:class:`~resilience.backends.MemoryBackend`, and limits' Redis storages built on the
:class:`~resilience.backends.RedisBackend`'s own connection pools for Redis (the async
side through limits' redis-py bridge, never coredis; on trio, the sync side in a worker
thread). Failures surface as :class:`~resilience.BackendError` so the limiter's
``on_backend_error`` applies exactly as for the token bucket.

Windows have whole-second periods (limits' granularity) and read limits' wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from ..backends._redis import RedisBackend
from ..errors import BackendError, ConfigurationError
from ._gcra import Decision
from ._rate import Rate

__all__ = ["WindowBuckets"]

T = TypeVar("T")

_STRATEGIES = {
    "fixed-window": "FixedWindowRateLimiter",
    "moving-window": "MovingWindowRateLimiter",
    "sliding-window": "SlidingWindowCounterRateLimiter",
}


def _limit_item(rate: Rate) -> Any:
    from limits import RateLimitItemPerSecond

    seconds = rate.period_us / 1_000_000
    if seconds != int(seconds):
        raise ConfigurationError(
            f"window algorithms need a whole number of seconds as period, got {rate}"
        )
    return RateLimitItemPerSecond(rate.amount, int(seconds))


#: Characters a window key part may keep as they are: limits joins parts with "/", so
#: a "/" in a name or key could make two limits share a window ("api" + "v2/alice" and
#: "api/v2" + "alice"); "#" marks a hashed part, so raw and hashed parts never meet.
_RAW = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@=+,")
_MAX_RAW = 64


def _identifier(key: Hashable) -> str:
    """A key (or limiter name) as one part of limits' storage key.

    Short text of safe characters stays readable; anything else (long, binary, with a
    separator, user input) is hashed, so it is never pasted raw into a Redis key.
    """
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    if isinstance(key, str) and 0 < len(key) <= _MAX_RAW and _RAW.issuperset(key):
        return key
    if isinstance(key, bytes):
        data = key
    else:
        text = key if isinstance(key, str) else repr(key)
        data = text.encode("utf-8", "surrogatepass")
    return "#" + hashlib.blake2b(data, digest_size=12).hexdigest()


class WindowBuckets:
    """A ``limits`` strategy and storage answering with :class:`Decision` objects.

    Built with :meth:`in_memory` or :meth:`on_redis`. ``take`` records a hit (``cost``
    0 only tests) and reads the window statistics for ``remaining`` and ``reset_after``.
    The key ``None`` is the limiter's one unkeyed window (no key part in storage, so no
    key can share it). In memory, at most ``max_keys`` keys are tracked: beyond, the
    least recently used tenth is cleared (limits' own expiry drops idle windows sooner).

    Example::

        buckets = WindowBuckets.in_memory("moving-window", Rate(5, 60), name="api")
        assert buckets.take("alice", 1, 0).allowed
    """

    __slots__ = (
        "_async_strategies",
        "_backend",
        "_errors",
        "_expiry_slack",
        "_item",
        "_keys",
        "_lock",
        "_max_keys",
        "_moving",
        "_name",
        "_period",
        "_sliding",
        "_strategy",
        "_strategy_name",
        "evictions",
        "local",
        "round_trips",
    )

    def __init__(
        self,
        algorithm: str,
        rate: Rate,
        storage: Any,
        *,
        name: str,
        backend: RedisBackend | None = None,
        local: bool,
        max_keys: int | None = None,
    ) -> None:
        import limits.strategies

        self._strategy_name = _STRATEGIES[algorithm]
        self._item = _limit_item(rate)
        self._strategy = getattr(limits.strategies, self._strategy_name)(storage)
        self._name = _identifier(name)
        self._moving = algorithm == "moving-window"
        self._sliding = algorithm == "sliding-window"
        self._period = rate.period_us / 1_000_000
        self._backend = backend
        self.local = local
        #: Storage operations sent to Redis (two per decision: hit or test, then stats).
        self.round_trips = 0
        #: Windows cleared by the ``max_keys`` cap (in memory).
        self.evictions = 0
        # limits reads a Redis fixed window's expiry with TTL: whole seconds, rounded.
        # Half a second more makes retry_after an upper bound (a client that waits it is
        # admitted), and a refusal near the window's end no longer says "retry now".
        self._expiry_slack = 0.5 if backend is not None and algorithm == "fixed-window" else 0.0
        # limits' MemoryStorage checks a counter's expiry outside the lock it increments
        # under: a thread descheduled in between can wipe a window another just started
        # (16 threads on "3/s" admitted 15 in 3 s). In memory, decisions are serialised.
        self._lock = contextlib.nullcontext() if backend is not None else threading.Lock()
        self._async_strategies: dict[asyncio.AbstractEventLoop, Any] = {}
        # The keys seen in memory, least recently used first (None: no cap, on Redis).
        self._max_keys = max_keys or 0
        self._keys: OrderedDict[tuple[str, ...], None] | None = (
            None if max_keys is None else OrderedDict()
        )
        errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        if backend is not None:
            import limits.errors
            import redis

            errors = (redis.RedisError, limits.errors.StorageError, *errors)
        self._errors = errors

    @classmethod
    def in_memory(
        cls, algorithm: str, rate: Rate, *, name: str, max_keys: int = 100_000
    ) -> WindowBuckets:
        """Windows in process memory (limits' ``MemoryStorage``), ``max_keys`` at most."""
        return cls(algorithm, rate, _memory_storage(), name=name, local=True, max_keys=max_keys)

    @classmethod
    def on_redis(
        cls, algorithm: str, rate: Rate, backend: RedisBackend, *, name: str
    ) -> WindowBuckets:
        """Windows on the backend's Redis, through limits' redis-py storages."""
        import limits.storage

        storage: Any
        if backend.cluster:
            url = backend._url
            if url is None:
                raise ConfigurationError("window algorithms on Redis Cluster need from_url()")
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            # The backend's own client options (password, ssl, ...) and none of
            # redis-py's default retries, as on the backend's cluster client: each retry
            # would wait out the timeout again (a paused master cost 0.6 s a decision).
            options: dict[str, Any] = {
                "socket_timeout": backend.timeout,
                "socket_connect_timeout": backend.timeout,
                "retry": Retry(NoBackoff(), 0),
                **backend._client_options,
            }
            if url.startswith("rediss://"):  # TLS, as the backend's own client reads it
                options.setdefault("ssl", True)
                url = "redis://" + url[len("rediss://") :]
            storage = limits.storage.RedisClusterStorage(
                url.replace("redis://", "redis+cluster://", 1),
                key_prefix=backend.prefix,
                **options,
            )
        else:
            storage = limits.storage.RedisStorage(
                "redis://",
                connection_pool=backend.sync_client.connection_pool,
                key_prefix=backend.prefix,
            )
        return cls(algorithm, rate, storage, name=name, backend=backend, local=False)

    def _async_strategy(self) -> Any:
        # limits.aio with the redis-py bridge, one per event loop (clients are loop-bound).
        assert self._backend is not None
        client = self._backend.async_client()
        if client is None or self._backend.cluster:
            return None
        loop = asyncio.get_running_loop()
        strategy = self._async_strategies.get(loop)
        if strategy is None:
            import limits.aio.storage
            import limits.aio.strategies

            storage = limits.aio.storage.RedisStorage(
                "async+redis://",
                implementation="redispy",
                connection_pool=client.connection_pool,
                key_prefix=self._backend.prefix,
            )
            strategy = getattr(limits.aio.strategies, self._strategy_name)(storage)
            # Closed loops' strategies go: their connections can never be used again.
            live = {k: v for k, v in self._async_strategies.items() if not k.is_closed()}
            self._async_strategies = {**live, loop: strategy}
        return strategy

    def _decision(self, allowed: bool, stats: Any, cost: int) -> Decision:
        remaining = int(stats.remaining)
        # Nothing counted: full now. (limits dates an empty moving window a whole period
        # ahead, and a sliding window whose hits have all expired by its last hit.)
        if remaining >= self._item.amount:
            reset_after = 0.0
        else:
            reset_after = float(stats.reset_time) - time.time()
            if reset_after <= 0 and self._sliding:
                # Used, yet "full now": limits reads a fresh sliding window's expiry on
                # Redis modulo its period (0 when a whole period is left). Within a
                # period the count moves on; the period is the bound it reports then.
                # (A fixed window's end on Redis is a TTL in whole seconds: under half a
                # second left reads 0, and the refusal's slack covers it.)
                reset_after = self._period
            reset_after = max(0.0, reset_after)
        retry_after = (
            0.0 if allowed else max(min(reset_after + self._expiry_slack, self._period), 1e-6)
        )
        if not allowed and cost - remaining > 1:
            # limits tells when one slot frees; this request needs more, and when the
            # others free is not exposed: an upper bound never sends a client back too
            # early. A moving window's hits all expire within its length. A sliding
            # window's current count becomes the previous one within a period, and
            # then decays by cost/amount of itself in period * cost/amount more.
            if self._moving:
                retry_after = self._period
            elif self._sliding:
                retry_after = self._period * (1 + cost / self._item.amount)
        return Decision(allowed, remaining, retry_after, reset_after, self._item.amount)

    def _identifiers(self, key: Hashable) -> tuple[str, ...]:
        return (self._name,) if key is None else (self._name, _identifier(key))

    def _track(self, ids: tuple[str, ...]) -> None:
        """Note ``ids`` as just used; at the cap, clear the least recently used tenth."""
        keys = self._keys
        if keys is None:
            return
        if ids in keys:
            keys.move_to_end(ids)
            return
        if len(keys) >= self._max_keys:
            for _ in range(max(self._max_keys // 10, 1)):
                old, _none = keys.popitem(last=False)
                self._strategy.clear(self._item, *old)
                self.evictions += 1
        keys[ids] = None

    def take(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """One decision (two storage operations: hit or test, then window stats)."""
        ids = self._identifiers(key)
        strategy = self._strategy
        if self._backend is not None:
            self.round_trips += 2
        try:
            with self._lock:
                self._track(ids)
                if cost:
                    allowed = strategy.hit(self._item, *ids, cost=cost)
                else:
                    allowed = strategy.test(self._item, *ids)
                stats = strategy.get_window_stats(self._item, *ids)
        except self._errors as exc:
            raise BackendError(f"limits storage failed: {exc!r}") from exc
        return self._decision(allowed, stats, cost)

    async def take_async(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Like :meth:`take` from asyncio (limits.aio) or trio (a worker thread)."""
        ids = self._identifiers(key)

        async def decide(strategy: Any) -> Decision:
            self.round_trips += 2
            if cost:
                allowed = await strategy.hit(self._item, *ids, cost=cost)
            else:
                allowed = await strategy.test(self._item, *ids)
            stats = await strategy.get_window_stats(self._item, *ids)
            return self._decision(allowed, stats, cost)

        return await self._run_async(functools.partial(self.take, key, cost, max_wait_us), decide)

    def reset(self, key: Hashable) -> None:
        """Clear ``key``'s window (limits' ``clear``); raises ``BackendError``."""
        try:
            with self._lock:
                ids = self._identifiers(key)
                self._strategy.clear(self._item, *ids)
                if self._keys is not None:
                    self._keys.pop(ids, None)
        except self._errors as exc:
            raise BackendError(f"limits storage failed: {exc!r}") from exc

    async def reset_async(self, key: Hashable) -> None:
        """Like :meth:`reset`, from asyncio (limits.aio) or trio (a worker thread)."""
        ids = self._identifiers(key)

        async def clear(strategy: Any) -> None:
            await strategy.clear(self._item, *ids)

        await self._run_async(functools.partial(self.reset, key), clear)

    async def _run_async(
        self, sync_op: Callable[[], T], async_op: Callable[[Any], Awaitable[T]]
    ) -> T:
        """``async_op(strategy)`` on this loop's limits.aio strategy, else ``sync_op()``:
        at once in memory, or in a worker thread (trio, Redis Cluster). Either is cut at
        the backend's round-trip bound; a failure is a :class:`BackendError`."""
        backend = self._backend
        if backend is None:
            return sync_op()
        strategy = self._async_strategy()
        try:
            if strategy is None:
                import anyio.to_thread

                with anyio.fail_after(backend.round_trip_bound):
                    return await anyio.to_thread.run_sync(sync_op, abandon_on_cancel=True)
            # A decision is two or three round trips (plus a new connection's handshake):
            # the round-trip bound, not one timeout, or a Redis 10 ms away never answers
            # in time and every decision falls back.
            async with asyncio.timeout(backend.round_trip_bound):
                return await async_op(strategy)
        except self._errors as exc:
            raise BackendError(f"limits storage failed: {exc!r}") from exc

    def statistics(self) -> dict[str, int | None]:
        """``round_trips``: storage operations sent to Redis (0 in memory); in memory
        also ``keys`` (windows tracked) and ``evictions`` (windows the cap cleared)."""
        if self._keys is None:
            return {"round_trips": self.round_trips}
        return {
            "round_trips": self.round_trips,
            "keys": len(self._keys),
            "evictions": self.evictions,
        }

    # Every window decision asks the storage: the recovery probe is a plain decision.
    probe = take
    probe_async = take_async


@functools.cache
def _memory_storage_class() -> Any:
    """limits' ``MemoryStorage``, its expiry sweep made quiet about keys that vanish.

    The sweep runs on a timer thread of its own and reads keys it listed earlier without
    a lock, while a decision's ``get`` of an expired key (limits' own) or the
    ``max_keys`` cap's ``clear`` (ours) removes them: a ``KeyError`` there printed
    "Exception in thread" tracebacks under key floods. The sweep gives up until the
    next write schedules another (what the error did, without the noise).
    """
    from limits.storage import MemoryStorage

    found = getattr(MemoryStorage, "_MemoryStorage__expire_events", None)
    if found is None:  # another limits: its sweep as it is
        return MemoryStorage
    sweep: Callable[[Any], None] = found

    class QuietMemoryStorage(MemoryStorage):
        def _MemoryStorage__expire_events(self) -> None:  # limits' private name
            with contextlib.suppress(KeyError):
                sweep(self)

    return QuietMemoryStorage


def _memory_storage() -> Any:
    """A new quiet ``MemoryStorage`` (see :func:`_memory_storage_class`)."""
    return _memory_storage_class()()
