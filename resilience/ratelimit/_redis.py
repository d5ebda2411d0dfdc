"""GCRA buckets on Redis: one ``EVALSHA`` per decision, plus a local denial cache.

The script (``resilience/backends/lua/gcra.lua``) is the same transition as the pure
core in :mod:`._gcra`, with time from Redis ``TIME`` in integer microseconds and the
emission interval kept exact as ``eq + er/d`` microseconds. Keys are
``prefix:{rl:<limiter>:<params>:<key>}`` (one hash tag: Redis Cluster works; long or
binary user keys hashed) and expire (``PX``) when the bucket is full again.

**Denial cache.** A refusal carries the bucket's state: ``reset_after``, the time until
it is full again, gives its theoretical arrival time ``tat``. Until ``tat`` has passed,
any request for that key that the bucket could not admit yet (``tat + cost·E - T > now``)
is refused locally, with no round trip and with its own exact ``retry_after``. The cache
only ever refuses, and ``tat`` only grows on Redis, so it never admits anything Redis
would refuse; its clock starts when the reply arrived (in real time, like Redis'), so it
errs towards refusing for at most that round trip longer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable
from importlib import resources
from typing import Any

from ..backends._redis import PreparedCall, RedisBackend
from ..errors import ConfigurationError
from ._gcra import GCRA, Decision, make_decision

__all__ = ["GCRA_LUA", "RedisBuckets"]

#: The Lua source of the GCRA decision.
GCRA_LUA = resources.files("resilience.backends").joinpath("lua/gcra.lua").read_text()

#: Forget a bucket (an absent key is a full bucket).
_DELETE_LUA = "return redis.call('DEL', KEYS[1])"

_MAX_CACHED_KEYS = 8192


#: The longest refill (microseconds) the script keeps exact.
_MAX_EXACT = 2**52


class RedisBuckets:
    """The GCRA buckets of one limiter on Redis (used by :class:`~resilience.RateLimiter`).

    ``take()``/``take_async()`` make one ``EVALSHA`` (or none, when the denial cache
    answers) and return a :class:`Decision`; backend failures raise
    :class:`~resilience.BackendError` for the failure-mode layer above.

    The denial cache keeps a refusal until its ``retry_after`` has passed in real
    (monotonic) time, not on the limiter's clock: the state it stands for lives on
    Redis, which counts real time, so a test on a :class:`FakeClock` that really waits
    out a refusal is not refused again from the cache.

    Example::

        buckets = RedisBuckets(backend, GCRA(Rate(10, 1), 10), namespace="api")
        decision = buckets.take("alice", 1, 0)
    """

    __slots__ = (
        "_argv",
        "_burst",
        "_calls",
        "_delete",
        "_denied",
        "_emission_s",
        "_emission_us",
        "_frac",
        "_monotonic",
        "_namespace",
        "_resets",
        "_run",
        "_run_async",
        "_script",
        "_tolerance_s",
        "_tolerance_us",
        "_unkeyed",
        "backend",
        "denial_cache_hits",
        "denial_cache_size",
        "gcra",
        "round_trips",
    )

    local = False

    def __init__(
        self,
        backend: RedisBackend,
        gcra: GCRA,
        *,
        namespace: str,
        denial_cache_size: int = 10_000,
    ) -> None:
        self.backend = backend
        self.gcra = gcra
        script = backend.script(GCRA_LUA)
        self._script = script
        self._delete = backend.script(_DELETE_LUA)
        self._run = script.run_prepared
        self._run_async = script.run_prepared_async
        d = gcra.denominator
        eq, er = divmod(gcra.emission, d)
        tq, tr = divmod(gcra.tolerance, d)
        # The script's state is a Lua double, exact below 2**53 microseconds (Redis' own
        # clock is 1.8e15 of them): the time to refill the whole burst must leave it room.
        # (A fractional interval's products with the amount may round below a
        # microsecond's fraction on huge quotas: no decision moves by a microsecond.)
        if tq > _MAX_EXACT:
            raise ConfigurationError(
                f"burst {gcra.burst} at {gcra.rate} takes too long to refill for the Redis "
                "backend (its state is an exact number of microseconds below 2**52 of "
                "refill, about 142 years): use a smaller burst or a faster rate"
            )
        # Whole-microsecond emission intervals need no fractional part (the fast path).
        self._argv = (eq, tq)
        self._emission_us, self._tolerance_us = eq, tq
        self._emission_s = gcra.emission / d / 1e6
        self._tolerance_s = gcra.tolerance / d / 1e6
        self._frac = () if er == 0 else (er, d, tr)
        self._burst = gcra.burst
        self._monotonic = time.monotonic
        params = f"{gcra.rate.amount}/{gcra.rate.period_us}/{gcra.burst}"
        self._namespace = ("rl", namespace, params)
        self._unkeyed = backend.key(*self._namespace)
        #: key -> the packed default decision (cost 1, no reservation) for that key
        self._calls: dict[Hashable, PreparedCall] = {}
        #: key -> its bucket's theoretical arrival time on the local monotonic clock,
        #: learnt from a refusal
        self._denied: dict[Hashable, float] = {}
        # Bumped by reset(): a refusal computed before a reset must not be cached after it.
        self._resets = 0
        self.denial_cache_size = denial_cache_size
        #: Refusals answered by the denial cache (no round trip).
        self.denial_cache_hits = 0
        #: Scripts run on Redis.
        self.round_trips = 0

    def _redis_key(self, key: Hashable) -> str:
        if key is None:
            return self._unkeyed
        part = key if isinstance(key, str | bytes | int) else repr(key)
        return self.backend.key(*self._namespace, part)

    def _call(self, key: Hashable, cost: int, max_wait_us: int) -> PreparedCall:
        """The packed script run for this decision (cached for the default one)."""
        if cost == 1 and not max_wait_us:
            slot = _slot(key)
            call = self._calls.get(slot)
            if call is None:
                call = self._script.prepare(
                    (self._redis_key(key),), (*self._argv, 1, 0, *self._frac)
                )
                if len(self._calls) >= _MAX_CACHED_KEYS:
                    self._calls.clear()
                self._calls[slot] = call
            return call
        hash(key)  # an unhashable key fails before its token is spent, as above
        return self._script.prepare(
            (self._redis_key(key),), (*self._argv, cost, max_wait_us, *self._frac)
        )

    def _cached_refusal(self, key: Hashable, cost: int, max_wait_us: int) -> Decision | None:
        """The refusal Redis would give, from the cached ``tat``; None: ask Redis."""
        tat = self._denied.get(_slot(key))
        if tat is None:
            return None
        fill = tat - self._monotonic()  # the bucket's reset_after now
        if fill <= 0:
            # Full again: nothing left to refuse (another thread may be dropping it too).
            self._denied.pop(_slot(key), None)
            return None
        retry_after = fill + cost * self._emission_s - self._tolerance_s
        if retry_after <= 0 or max_wait_us >= retry_after * 1_000_000:
            return None
        self.denial_cache_hits += 1
        # Whole tokens left (the 1e-9 absorbs float error at exact multiples).
        remaining = max(0, int((self._tolerance_s - fill) / self._emission_s + 1e-9))
        return make_decision((False, remaining, retry_after, fill, self._burst, 0.0))

    def _decision(self, key: Hashable, cost: int, reply: Any, resets: int) -> Decision:
        # reply: b"wait_us reset_us" (+ b" remaining" for fractional emission intervals);
        # a negative wait is a refusal. See lua/gcra.lua.
        fields = reply.split()
        wait_us, reset_us = int(fields[0]), int(fields[1])
        if len(fields) > 2:
            remaining = int(fields[2])
        else:
            remaining = (self._tolerance_us - reset_us) // self._emission_us
            if remaining < 0:
                remaining = 0
        if wait_us >= 0:
            if self._denied:
                self._admitted_after_refusal(key, reset_us, resets)
            return make_decision((True, remaining, 0.0, reset_us / 1e6, self._burst, wait_us / 1e6))
        retry_after = -wait_us / 1e6
        denied = self._denied
        if resets != self._resets:  # a reset ran meanwhile: this refusal may be stale
            return make_decision((False, remaining, retry_after, reset_us / 1e6, self._burst, 0.0))
        if len(denied) >= self.denial_cache_size:
            # The oldest entry; threads share the cache, so it may change under us.
            with contextlib.suppress(StopIteration, RuntimeError, KeyError):
                del denied[next(iter(denied))]
        self._cache_refill(_slot(key), reset_us, resets)
        return make_decision((False, remaining, retry_after, reset_us / 1e6, self._burst, 0.0))

    def _cache_refill(self, slot: Hashable, reset_us: int, resets: int) -> None:
        """Cache when ``slot``'s bucket is full again; a reset that ran since the reply
        (``resets`` was read before it) drops it again: written first, so seen."""
        denied = self._denied
        denied[slot] = self._monotonic() + reset_us / 1e6
        if resets != self._resets:
            denied.pop(slot, None)

    def _admitted_after_refusal(self, key: Hashable, reset_us: int, resets: int) -> None:
        """A key with a cached refusal was admitted (a cheaper request, a reservation):
        its bucket now refills later, and the cached time moves with it, or the next
        cached refusal would tell its client to come back too early."""
        slot = _slot(key)
        if slot in self._denied:
            self._cache_refill(slot, reset_us, resets)

    def take(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """One decision on Redis (or from the denial cache); raises ``BackendError``."""
        if self._denied:
            cached = self._cached_refusal(key, cost, max_wait_us)
            if cached is not None:
                return cached
        return self.probe(key, cost, max_wait_us)

    async def take_async(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Like :meth:`take`, from asyncio or trio."""
        if self._denied:
            cached = self._cached_refusal(key, cost, max_wait_us)
            if cached is not None:
                return cached
        return await self.probe_async(key, cost, max_wait_us)

    def probe(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Like :meth:`take`, always a round trip (the failure mode's recovery probe)."""
        call = self._call(key, cost, max_wait_us)
        self.round_trips += 1
        resets = self._resets
        reply = self._run(call)
        return self._decision(key, cost, reply, resets)

    async def probe_async(self, key: Hashable, cost: int, max_wait_us: int) -> Decision:
        """Like :meth:`take_async`, always a round trip."""
        call = self._call(key, cost, max_wait_us)
        self.round_trips += 1
        resets = self._resets
        reply = await self._run_async(call)
        return self._decision(key, cost, reply, resets)

    def reset(self, key: Hashable) -> None:
        """Delete ``key``'s bucket on Redis (full again for every process); raises
        ``BackendError``. This process's denial cache forgets the key, and no refusal
        in flight meanwhile (computed before the delete) is cached after it."""
        self._forget(key)
        try:
            self._delete.run([self._redis_key(key)])
        finally:
            self._forget(key)

    async def reset_async(self, key: Hashable) -> None:
        """Like :meth:`reset`, from asyncio or trio."""
        self._forget(key)
        try:
            await self._delete.run_async([self._redis_key(key)])
        finally:
            self._forget(key)

    def _forget(self, key: Hashable) -> None:
        # Before and after the delete: a refusal sent before the second bump may have
        # been computed before the delete, and is then not cached (see _decision).
        self._resets += 1
        self._denied.pop(_slot(key), None)

    def statistics(self) -> dict[str, int]:
        """Round trips and denial-cache hits."""
        return {"round_trips": self.round_trips, "denial_cache_hits": self.denial_cache_hits}


def _slot(key: Hashable) -> Hashable:
    """``key`` as the client-side caches' key: ``1``, ``1.0`` and ``True`` are equal in
    a dict but name different Redis buckets (``"1"``, ``"1.0"``, ``"True"``), so keys
    other than text carry their type."""
    return key if key is None or key.__class__ is str else (key.__class__, key)
