"""The distributed bulkhead: slots are Redis leases shared by every process.

Per key, one sorted set holds the live leases (token -> expiry in Redis time); the
Lua scripts under ``resilience/backends/lua/bulkhead_*.lua`` acquire (idempotent by
token, reaping expired leases), renew and release a lease in one ``EVALSHA`` each.

* A holder's lease is renewed every ``lease / 3`` by the process's lease keeper
  (:mod:`._keeper`); if it is lost the permit is told (event, hook, LeaseLost at release).
* A caller that finds the key full (or local waiters of the key ahead of it) waits in a
  local queue (priority, then arrival). The first local waiter of a key sleeps until a
  release notification (:mod:`._notifier`), the earliest lease expiry or its deadline,
  then retries; the others sleep until they become first. Across processes there is no
  queue: whoever asks first after a release wins (see docs/bulkhead.md for what is and
  is not guaranteed).
* When Redis fails, ``on_backend_error`` applies through the shared
  :class:`~resilience.backends.Failover`: an in-process twin of ``local_limit`` slots,
  admit, or raise :class:`~resilience.BackendError`. The twin is the process's ledger:
  every lease asked for or granted here also occupies a twin slot, so the leases held
  (or on their way) when Redis fails count against ``local_limit``. When Redis answers
  again (a caller's first success, or the keeper's check every second while anything
  waits) the keeper sends the releases that failed and enters the local slots still
  held as leases (past the limit if need be: their holders are running), so Redis
  counts the whole fleet again.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _deadline
from ..backends._failover import Failover
from ..errors import BackendError, BulkheadFull, ConfigurationError
from ._events import BulkheadLeaseLost, LeaseLost
from ._keeper import KEEPER
from ._notifier import Notifier
from ._permit import Permit
from ._signals import AsyncioSignal, ThreadSignal, TrioSignal, async_signal

if TYPE_CHECKING:
    from ._bulkhead import Bulkhead

__all__ = ["Distributed", "LeasePermit"]

T = TypeVar("T")
Signal = ThreadSignal | AsyncioSignal | TrioSignal


#: The longest the first waiter of a key sleeps between two tries (it also wakes on a
#: release, or when the earliest lease expires).
_HEAD_POLL = 1.0
#: After a recovery, when to look once more for twin waiters that queued just after it.
_LATE_CHECK = 0.1


def _count_down(counts: dict[Hashable, int], key: Hashable) -> None:
    """One fewer of ``key`` in ``counts`` (a key at zero is dropped)."""
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


def _lua(name: str) -> str:
    return resources.files("resilience.backends").joinpath(f"lua/{name}").read_text()


ACQUIRE_LUA = _lua("bulkhead_acquire.lua")
RENEW_LUA = _lua("bulkhead_renew.lua")
RELEASE_LUA = _lua("bulkhead_release.lua")
COUNT_LUA = _lua("bulkhead_count.lua")

_now = time.monotonic

# The limit passed when a local slot is entered in Redis after an outage: always admitted.
_PAST_ANY_LIMIT = 2**31
# Failed releases remembered for the recovery (beyond this the oldest are dropped).
_MAX_UNRELEASED = 10_000
# While something waits for Redis, the keeper tries to reconcile this often (seconds),
# so that a process that makes no further call still reaches Redis.
_RECONCILE_EVERY = 1.0


def _new_token() -> str:
    return os.urandom(12).hex()


def _key_part(key: Hashable) -> str | bytes | int | float:
    if isinstance(key, str | bytes | int | float) and not isinstance(key, bool):
        return key
    return repr(key)


class LeasePermit(Permit):
    """A slot of a distributed bulkhead: a Redis lease renewed in the background.

    See :class:`Permit`. ``lost`` turns true if the lease expired or could not be renewed
    in time; :meth:`release` then raises :class:`LeaseLost` (once) unless the bulkhead
    was built with ``on_lease_lost="event"``.

    Example::

        with bulkhead.acquire(key="example.com") as permit:
            permit.on_lost(scope.cancel)
            ...
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_dist",
        "_job",
        "_lost",
        "_registered",
        "keys",
        "reason",
        "token",
    )

    def __init__(
        self,
        dist: Distributed,
        key: Hashable,
        keys: list[str],
        token: str,
        *,
        registered: bool = True,
    ) -> None:
        super().__init__(dist.owner, key, _now())
        self._dist = dist
        #: The Redis keys of this lease (the sorted set, the waiting flag).
        self.keys = keys
        #: The lease's token in the sorted set.
        self.token = token
        self._lost = False
        #: Why the lease was lost (``"expired"`` or ``"unreachable"``), or ``""``.
        self.reason = ""
        self._callbacks: list[Callable[[], object]] = []
        self._job: _Renewal | None = None
        # False for a slot of the local twin taken while Redis failed, until it is
        # entered in Redis (adopted) once Redis answers again.
        self._registered = registered

    @property
    def lost(self) -> bool:
        """Whether the lease was lost while held."""
        return self._lost

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from the keeper thread) if the lease is lost while held.

        Called at once if it was already lost. Example: ``permit.on_lost(scope.cancel)``
        """
        with self._dist.lock:
            if not self._lost:
                self._callbacks.append(callback)
                return
        callback()

    def release(self) -> None:
        """Release the lease (one EVALSHA); raises :class:`LeaseLost` if it was lost."""
        self._release(quiet=False)

    async def release_async(self) -> None:
        """Release the lease without blocking the event loop; see :meth:`release`."""
        await self._release_async(quiet=False)

    def _release(self, *, quiet: bool) -> None:
        dist = self._dist
        if not dist.begin_release(self):
            return
        removed = None  # a local slot never entered Redis: nothing to remove there
        if self._registered:
            try:
                removed = dist.release_script.run(self.keys, dist.release_args(self))
            except BackendError:
                dist.release_on_recovery(self.keys, self.token)
        dist.end_release(self, removed, quiet=quiet)

    async def _release_async(self, *, quiet: bool) -> None:
        dist = self._dist
        if not dist.begin_release(self):
            return
        removed = None
        if self._registered:
            try:
                removed = await dist.release_script.run_async(self.keys, dist.release_args(self))
            except BackendError:
                dist.release_on_recovery(self.keys, self.token)
            except BaseException:
                dist.release_later(self.keys, self.token)
                dist.end_release(self, None, quiet=True)
                raise
        dist.end_release(self, removed, quiet=quiet)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release(quiet=exc_type is not None)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release_async(quiet=exc_type is not None)

    def _mark_lost(self, reason: str) -> bool:
        """Record the loss (once, while held); returns whether this call recorded it."""
        with self._dist.lock:
            if self._lost or self._released:
                return False
            self._lost = True
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, []
        self._dist.lease_lost(self, reason)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                pass
        return True

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self._lost else "held")
        return f"<LeasePermit {self._bulkhead.name!r} key={self.key!r} {state}>"


class _OpenPermit(Permit):
    """Admitted without a slot (``on_backend_error="open"`` while Redis fails).

    It holds no slot, but it is a call in flight in this process: counted in
    ``statistics().in_flight`` until released.
    """

    __slots__ = ("__weakref__", "_dist")

    def __init__(self, dist: Distributed, key: Hashable) -> None:
        super().__init__(dist.owner, key)
        self._dist = dist
        with dist.lock:
            dist._open.add(self)  # weakly: a dropped permit stops counting by itself

    def release(self) -> None:
        """No slot to give back; it stops counting as in flight."""
        with self._dist.lock:
            self._released = True
            self._dist._open.discard(self)


class _RenewalGate:
    """When a lease renewal on one Redis server last failed (``-inf``: the last worked).

    Shared by every bulkhead on the server, because the keeper thread renews them all
    in turn: after one renewal times out, the others on that server fail at once for a
    moment (each bulkhead's ``lease / 12``) rather than each blocking the keeper in turn.
    """

    __slots__ = ("failed_at",)

    def __init__(self) -> None:
        self.failed_at = -math.inf


class _RenewalGates:
    """The renewal gates of one backend's servers: the server's own gate, shared by
    every bulkhead and backend object on that server (found by its address; a private
    one where the address is unknown), or one per node of a Redis Cluster (a stalled
    node must not hold back the leases on healthy ones)."""

    __slots__ = ("cluster_client", "gate")

    def __init__(self, backend: Any) -> None:
        cluster = getattr(backend, "cluster", False) is True
        self.cluster_client: Any = backend.sync_client if cluster else None
        server = None if cluster else _server_of(backend.sync_client)
        self.gate = _RenewalGate() if server is None else _server_gate(server)

    def for_key(self, key: str) -> _RenewalGate:
        """The gate of the server that holds ``key`` (only the keeper thread asks)."""
        client = self.cluster_client
        if client is None:
            return self.gate
        try:
            name = client.get_node_from_key(key).name  # the client's slot map: no I/O
        except Exception:  # no slot map at the moment: the cluster as a whole
            return self.gate
        return _server_gate(str(name))


def _server_of(client: Any) -> str | None:
    """A standalone client's server address (``host:port`` or a socket path), if known."""
    try:
        options = client.connection_pool.connection_kwargs
    except AttributeError:
        return None
    if options.get("path"):
        return f"unix:{options['path']}"
    if options.get("host"):
        return f"{options['host']}:{options.get('port', 6379)}"
    return None  # a Sentinel-managed pool: its server changes with failovers


_SERVER_GATES: dict[str, _RenewalGate] = {}
_GATES_LOCK = threading.Lock()


def _server_gate(server: str) -> _RenewalGate:
    """The renewal gate of a Redis server (by address; a few per process at most)."""
    gate = _SERVER_GATES.get(server)
    if gate is None:
        with _GATES_LOCK:
            gate = _SERVER_GATES.setdefault(server, _RenewalGate())
    return gate


class _Renewal:
    """The keeper job of one lease: renew every ``lease / 3`` until released or lost."""

    __slots__ = ("active", "confirmed_until", "dist", "key", "keys", "permit", "token")

    def __init__(self, dist: Distributed, permit: LeasePermit, started: float) -> None:
        self.dist = dist
        self.permit = weakref.ref(permit)
        self.key = permit.key
        self.keys = permit.keys
        self.token = permit.token
        self.active = True
        # The lease certainly lives until then (it was set no earlier than we asked).
        self.confirmed_until = started + dist.lease

    def __call__(self) -> float | None:
        if not self.active:
            return None
        dist = self.dist
        permit = self.permit()
        if permit is None:
            # Dropped without release(): give the slot back.
            self.active = False
            dist.forget_held(self.key)
            dist.release_now(self.keys, self.token)
            return None
        sent = _now()
        gate = dist.renewals.for_key(self.keys[0])
        if sent < gate.failed_at + dist.renew_every / 4:
            # A renewal on this backend just failed: this one would block the keeper
            # (which renews every lease, other backends' too) for the timeout in vain.
            return self._failed(permit, sent)
        try:
            alive = dist.renew_script.run(self.keys, [self.token, dist.lease_ms])
        except BackendError:
            gate.failed_at = _now()
            return self._failed(permit, sent)
        gate.failed_at = -math.inf
        dist.failover.succeeded()  # Redis answers: the bulkhead is healthy (reported)
        if permit._released:  # released while the renewal was on the wire
            return None
        if not alive:
            self.active = False
            permit._mark_lost("expired")
            return None
        self.confirmed_until = sent + dist.lease
        return sent + dist.renew_every

    def _failed(self, permit: LeasePermit, sent: float) -> float | None:
        """A renewal that did not reach Redis: lost once the lease may have run out."""
        if sent >= self.confirmed_until:
            self.active = False
            permit._mark_lost("unreachable")
            return None
        # Try again sooner, but not after the lease would run out.
        return min(sent + self.dist.renew_every / 2, self.confirmed_until)


class _Attempt:
    """One caller's way to a lease: its token, its place among local waiters, its deadline."""

    __slots__ = (
        "deadline",
        "in_flight",
        "key",
        "keys",
        "max_wait",
        "may_wait",
        "priority",
        "queued",
        "signal",
        "signal_factory",
        "token",
    )

    def __init__(
        self,
        key: Hashable,
        keys: list[str],
        priority: int,
        max_wait: float,
        signal_factory: Callable[[], Signal],
    ) -> None:
        self.key = key
        self.keys = keys
        self.priority = priority
        self.max_wait = max_wait
        self.signal_factory = signal_factory
        self.token = _new_token()
        self.deadline: float | None = None
        # ThreadSignal for threads (sync wait), AsyncioSignal/TrioSignal for tasks.
        self.signal: Any = None
        self.queued = False
        self.in_flight = False
        #: Asked before this attempt first queues (the ASGI middleware's queue bound).
        self.may_wait: Callable[[], bool] | None = None


class _LocalQueue:
    """This process's waiters for one Redis key: a heap with lazy deletion."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, _Attempt]] = []
        self.live = 0

    def head(self) -> _Attempt | None:
        heap = self.heap
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][2] if heap else None


class Distributed:
    """The Redis side of a :class:`~resilience.Bulkhead` built with ``backend=``.

    Used by the Bulkhead shells; not public. Example::

        bulkhead = rs.Bulkhead(5, backend=RedisBackend.from_url(url), lease=30.0)
        # bulkhead._remote is a Distributed
    """

    def __init__(
        self,
        owner: Bulkhead,
        backend: Any,
        *,
        lease: float,
        on_backend_error: str,
        local_limit: int,
        on_lease_lost: str,
        named: bool = True,
    ) -> None:
        for attribute in ("script", "key", "sync_client", "round_trip_bound"):
            if not hasattr(backend, attribute):
                raise ConfigurationError(
                    "backend must be a resilience.backends.RedisBackend (or MemoryBackend), "
                    f"got {backend!r}"
                )
        self.owner = owner
        self.backend = backend
        self.limit = owner.max_concurrent
        #: The identity in Redis: the name; an unnamed bulkhead's default name plus its
        #: limit, so that two unnamed bulkheads with different limits (say a storage
        #: and a database bulkhead) do not share slots, while a fleet's copies of one do.
        self.identity = owner.name if named else f"{owner.name}-{owner.max_concurrent}"
        # One Redis key part: a name with ":" is hashed (as bytes), or "dl:x" with key
        # "y" would share the slots of "dl" with key "x:y".
        self._name_part: str | bytes = (
            self.identity.encode("utf-8", "surrogatepass")
            if ":" in self.identity
            else self.identity
        )
        self.lease = lease
        self.lease_ms = max(1, round(lease * 1000))
        self.renew_every = lease / 3
        #: When a renewal on each of this backend's servers last failed (see _Renewal).
        self.renewals = _RenewalGates(backend)
        self.raise_lost = on_lease_lost == "raise"
        self.failover = Failover(on_backend_error, owner=owner, clock=owner._clock)
        self.twin: Bulkhead | None = None
        if self.failover.mode == "local":
            from ._bulkhead import Bulkhead

            self.twin = Bulkhead(local_limit, clock=owner._clock, name=owner.name)
            self.twin._listeners = owner._listeners  # its rejections are the owner's events
            self.failover.on_recovery = self._twin_waiters_to_redis
        client = backend.sync_client  # renewals and notifications need the sync client
        self.acquire_script = backend.script(ACQUIRE_LUA)
        self.renew_script = backend.script(RENEW_LUA)
        self.release_script = backend.script(RELEASE_LUA)
        self.count_script = backend.script(COUNT_LUA)
        self.channel = backend.key("bulkhead", self._name_part) + ":released"
        self.lock = threading.Lock()
        self._queues: dict[str, _LocalQueue] = {}
        # Permits held by this process per key: leases and local slots (when a twin
        # exists its counts are the same, because it is this process's ledger).
        self._held: dict[Hashable, int] = {}
        #: Callers from the twin asking Redis for their leases now, per key.
        self._asking: dict[Hashable, int] = {}
        self._late_check = False  # a late pass over the twin's queues is scheduled
        # Local slots taken while Redis failed, not yet entered in Redis (by token).
        self._local: weakref.WeakValueDictionary[str, LeasePermit] = weakref.WeakValueDictionary()
        # Permits admitted without a slot ("open" mode while Redis fails), still held.
        self._open: weakref.WeakSet[_OpenPermit] = weakref.WeakSet()
        # token -> key of every local slot not yet released or entered in Redis: one
        # that left _local without either was dropped (collected), its twin slot held.
        self._local_keys: dict[str, Hashable] = {}
        # Releases that failed while Redis was down: (keys, token), sent on recovery.
        self._unreleased: list[tuple[list[str], str]] = []
        self._reconciling = False
        self._watching = False
        self._seq = itertools.count()
        #: Leases lost while held, since construction.
        self.leases_lost = 0
        self.notifier = Notifier(
            client, self.channel, self._notified, self._wake_all_heads, self._has_waiters
        )

    # ------------------------------------------------------------------ keys and args

    def keys_for(self, key: Hashable) -> list[str]:
        """The Redis keys of ``key``: ``[leases, waiting-flag]`` (one hash tag)."""
        name = self._name_part
        backend = self.backend
        base = (
            backend.key("bulkhead", name)
            if key is None
            else backend.key("bulkhead", name, _key_part(key))
        )
        return [base + ":leases", base + ":waiting"]

    def acquire_args(self, token: str, name: str | None = None) -> list[str | int]:
        """ARGV of the acquire script for ``token`` (on the leases key ``name``).

        Slots this process took locally while Redis was down, and has not entered in
        Redis yet, come off the limit: until the keeper enters them, Redis cannot count
        them, and a grant past them would put this process over ``max_concurrent``.
        """
        limit = self.limit
        if self._local and name is not None:
            with self.lock:
                limit -= sum(1 for permit in self._local.values() if permit.keys[0] == name)
        return [token, limit, self.lease_ms]

    def release_args(self, permit: LeasePermit | str) -> list[str]:
        """ARGV of the release script (token, channel, message)."""
        if isinstance(permit, str):
            return [permit, self.channel, ""]
        return [permit.token, self.channel, permit.keys[0]]

    # ------------------------------------------------------------------ acquiring

    def acquire(
        self, key: Hashable, priority: int, max_wait: float, turn: list[bool] | None = None
    ) -> Permit:
        """Take a lease of ``key``, blocking the thread up to ``max_wait`` (shell).

        ``turn``: a caller let go from the twin to ask Redis (see ``_local_slot_kept``);
        its turn ends if it has to wait in the twin again.
        """
        hash(key)  # an unhashable key fails here, not after its lease is taken on Redis
        if not self.failover.use_backend():
            self.failover.fallback(key)
            self._end_turn(key, turn)
            return self._degraded(key, priority, max_wait)
        attempt = _Attempt(key, self.keys_for(key), priority, max_wait, ThreadSignal)
        try:
            delay: Permit | float = self._join(attempt)
            while True:
                if delay:
                    attempt.signal.wait(delay)
                    if not self.failover.use_backend():  # Redis failed meanwhile
                        self.failover.fallback(key)
                        self._end_turn(key, turn)
                        return self._degraded(key, priority, self._leave(attempt))
                    delay = self._turn(attempt)
                    if delay:
                        continue
                self._before_try(attempt)
                try:
                    reply = self.acquire_script.run(
                        attempt.keys, self.acquire_args(attempt.token, attempt.keys[0])
                    )
                except BackendError as exc:
                    wait = self._backend_failed(attempt, exc)
                    self._end_turn(key, turn)
                    return self._degraded(key, priority, wait)
                delay = self._after_try(attempt, reply)
                if isinstance(delay, Permit):
                    return delay
        finally:
            self._finish(attempt)

    async def acquire_async(
        self,
        key: Hashable,
        priority: int,
        max_wait: float,
        may_wait: Callable[[], bool] | None = None,
        turn: list[bool] | None = None,
    ) -> Permit:
        """Take a lease of ``key``, suspending the task up to ``max_wait`` (shell).

        ``may_wait``: see ``Bulkhead._acquire_quietly_async``; ``turn``: see ``acquire``.
        """
        hash(key)  # as in acquire()
        if not self.failover.use_backend():
            self.failover.fallback(key)
            self._end_turn(key, turn)
            return await self._degraded_async(key, priority, max_wait, may_wait)
        attempt = _Attempt(key, self.keys_for(key), priority, max_wait, async_signal)
        attempt.may_wait = may_wait
        try:
            delay: Permit | float = self._join(attempt)
            while True:
                if delay:
                    await attempt.signal.wait(delay)
                    if not self.failover.use_backend():  # Redis failed meanwhile
                        self.failover.fallback(key)
                        wait = self._leave(attempt)
                        self._end_turn(key, turn)
                        return await self._degraded_async(key, priority, wait, may_wait)
                    delay = self._turn(attempt)
                    if delay:
                        continue
                self._before_try(attempt)
                try:
                    reply = await self.acquire_script.run_async(
                        attempt.keys, self.acquire_args(attempt.token, attempt.keys[0])
                    )
                except BackendError as exc:
                    wait = self._backend_failed(attempt, exc)
                    self._end_turn(key, turn)
                    return await self._degraded_async(key, priority, wait, may_wait)
                delay = self._after_try(attempt, reply)
                if isinstance(delay, Permit):
                    return delay
        finally:
            self._finish(attempt)

    def call(
        self,
        fn: Callable[..., T],
        key: Hashable,
        priority: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """Run ``fn`` holding a lease of ``key`` (the Bulkhead.call shell)."""
        permit = self.acquire(key, priority, self.owner.max_wait)
        with permit:
            return fn(*args, **kwargs)

    async def call_async(
        self,
        fn: Callable[..., Awaitable[T]],
        key: Hashable,
        priority: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """Run ``await fn`` holding a lease of ``key`` (the Bulkhead.call_async shell)."""
        permit = await self.acquire_async(key, priority, self.owner.max_wait)
        async with permit:
            return await fn(*args, **kwargs)

    # The steps shared by both shells (they differ only by ``await``).

    def _join(self, attempt: _Attempt) -> float:
        """Seconds to wait before the first try: 0 unless local waiters are ahead.

        A newcomer that may wait queues behind this process's waiters of the key
        instead of overtaking them; it asks Redis when it is first in line.
        """
        if attempt.keys[0] not in self._queues:
            return 0.0
        budget = _deadline.clamp(attempt.max_wait)
        if budget <= 0:
            return 0.0  # may not wait: one try (it can only win a free slot)
        self._may_queue(attempt)
        attempt.deadline = _now() + budget
        attempt.signal = attempt.signal_factory()
        self._enqueue(attempt)
        return 0.0 if self._is_head(attempt) else budget

    def _turn(self, attempt: _Attempt) -> float:
        """After a sleep: 0.0 to ask Redis now, or the seconds to sleep on.

        Only the first in line asks: a waiter whose sleep ran out (the earliest lease
        expiry it slept to as the head) after a more urgent one queued ahead of it
        waits for its turn, or its deadline (then refused without a round trip), instead
        of taking the slot from under the new head.
        """
        if not attempt.queued:
            return 0.0
        attempt.signal.clear()  # before the check: a wake that makes it the head is kept
        if self._is_head(attempt):
            return 0.0
        assert attempt.deadline is not None  # queued: it has one
        remaining = attempt.deadline - _now()
        if remaining <= 0:
            raise self._rejected(attempt.key)
        return remaining

    def _before_try(self, attempt: _Attempt) -> None:
        if attempt.signal is not None:
            attempt.signal.clear()
        attempt.in_flight = True
        if self.twin is not None:
            # The twin counts the lease from now on, not once granted: if Redis fails
            # while the reply is on its way, the process's own local slots must leave
            # room for it (a grant arriving after them put the process over its limit).
            self.twin._slots.occupy(attempt.key)

    def _after_try(self, attempt: _Attempt, reply: Any) -> Permit | float:
        """Turn a reply of the acquire script into a permit or a sleep (raises if full)."""
        attempt.in_flight = False
        self.failover.succeeded()
        granted, count, wait_ms = int(reply[0]), int(reply[1]), int(reply[2])
        if not granted:
            self._twin_gives_back(attempt.key)
        if self._local or self._unreleased:
            self._reconcile_soon()
        if granted:
            permit = self._grant(attempt)
            if count < self.limit:
                self._wake_next(attempt)  # another slot is free: let the next one try
            return permit
        now = _now()
        if attempt.deadline is None:
            budget = _deadline.clamp(attempt.max_wait)
            if budget <= 0:
                raise self._rejected(attempt.key)
            self._may_queue(attempt)
            attempt.deadline = now + budget
            attempt.signal = attempt.signal_factory()
            self._enqueue(attempt)
        remaining = attempt.deadline - now
        if remaining <= 0:
            raise self._rejected(attempt.key)
        if self._is_head(attempt):
            # At most _HEAD_POLL: a Redis that stopped answering (paused) sends nothing,
            # and the head's next try is what finds it out for every waiter.
            return min(remaining, wait_ms / 1000.0, _HEAD_POLL)
        return remaining

    @staticmethod
    def _wait_left(attempt: _Attempt) -> float:
        if attempt.deadline is None:
            return attempt.max_wait
        return max(0.0, attempt.deadline - _now())

    def _leave(self, attempt: _Attempt) -> float:
        """Leave the Redis queue for the failure mode's; returns the wait left.

        Waiting in the twin, the caller must not stay queued here too: it would be
        counted twice, and once Redis is back newcomers would queue behind it.
        """
        wait = self._wait_left(attempt)
        self._finish(attempt)
        return wait

    def _may_queue(self, attempt: _Attempt) -> None:
        """Raise BulkheadFull if the caller's ``may_wait`` refuses to let it queue."""
        if attempt.may_wait is not None and not attempt.may_wait():
            raise self._rejected(attempt.key)

    def _backend_failed(self, attempt: _Attempt, error: BackendError) -> float:
        """Redis failed mid-attempt: clean up, switch mode; returns the wait left."""
        attempt.in_flight = False
        # The script may have run before the reply was lost: drop that lease, if any.
        self.release_later(attempt.keys, attempt.token)
        self.failover.failed(error, attempt.key)
        self._twin_gives_back(attempt.key)
        # Slots the twin took back from waiters let go to Redis are theirs again.
        self._fill_twin()
        # Every waiter sleeps on a signal Redis will not send now: wake them, so that
        # each takes the failure mode at once rather than at its deadline.
        self._wake_all_waiters()
        return self._leave(attempt)

    def _finish(self, attempt: _Attempt) -> None:
        if attempt.queued:
            self._dequeue(attempt, wake_next=True)
        if attempt.in_flight:  # cancelled during the round trip: the lease may exist
            attempt.in_flight = False
            self.release_later(attempt.keys, attempt.token)
            self._twin_gives_back(attempt.key)

    def _grant(self, attempt: _Attempt) -> LeasePermit:
        if attempt.queued:
            # The next waiter becomes the head: it must ask Redis now, to sleep until
            # the earliest lease expiry and to mark the key as waited on (a release then
            # notifies), not on the long sleep it had while others were ahead.
            self._dequeue(attempt, wake_next=True)
        permit = LeasePermit(self, attempt.key, attempt.keys, attempt.token)
        job = _Renewal(self, permit, permit._t0 or _now())
        permit._job = job
        key = attempt.key
        with self.lock:
            self._held[key] = self._held.get(key, 0) + 1
        # (the twin counts it since the try: see _before_try)
        KEEPER.schedule(_now() + self.renew_every, job)
        return permit

    def _twin_gives_back(self, key: Hashable) -> None:
        """A slot of ``key`` the twin counts is over (a lease, or an attempt at one).

        While Redis fails it goes to the twin's next waiter. While Redis answers it is
        only counted down: the twin's waiters then ask Redis one at a time (see
        :meth:`_local_slot_kept`), and get the twin's free slots if it fails again
        (:meth:`_fill_twin`).
        """
        twin = self.twin
        if twin is None:
            return
        failover = self.failover
        if not failover.healthy:
            twin._give_back(key, None)
            return
        twin._slots.retract(key)
        if failover.failing():  # just now: the slot may be a waiter's
            self._fill_twin()

    def _fill_twin(self) -> None:
        """Redis fails: the twin's free slots go to its waiters (see ``Slots.retract``)."""
        twin = self.twin
        if twin is None:
            return
        slots = twin._slots
        with slots.lock:
            keys = list(slots.queues)
        for key in keys:
            for waiter in slots.fill(key):
                twin._wake(waiter)

    def _without_twin(self, key: Hashable) -> Permit | None:
        """The failure mode's answer when it needs no twin slot (raises if ``"closed"``)."""
        mode = self.failover.mode
        if mode == "closed":
            self.failover.raise_closed()
        if mode == "open" or self.twin is None:
            return _OpenPermit(self, key)
        return None

    def _degraded(self, key: Hashable, priority: int, max_wait: float) -> Permit:
        permit = self._without_twin(key)
        if permit is not None:
            return permit
        twin = self.twin
        assert twin is not None
        ends = _now() + max_wait
        # Redis may have answered again since this caller decided to fall back: then
        # it asks Redis (a recovery lets go only the waiters already queued).
        while not self.failover.healthy:
            # Quietly: the twin shares this bulkhead's name and listeners, and the
            # caller reports the admission once (a loud twin counted every one twice).
            try:
                twin._acquire_quietly(key, priority, max(0.0, ends - _now()))
            except BaseException:
                self._twin_turn_passed(key)
                raise
            if self._local_slot_kept(key):
                return self._local_slot(key)
        turn = self._start_turn(key)
        try:  # see _local_slot_kept
            return self.acquire(key, priority, max(0.0, ends - _now()), turn)
        finally:
            self._end_turn(key, turn)

    async def _degraded_async(
        self,
        key: Hashable,
        priority: int,
        max_wait: float,
        may_wait: Callable[[], bool] | None = None,
    ) -> Permit:
        permit = self._without_twin(key)
        if permit is not None:
            return permit
        twin = self.twin
        assert twin is not None
        ends = _now() + max_wait
        while not self.failover.healthy:  # (see _degraded)
            try:
                wait = max(0.0, ends - _now())
                await twin._acquire_quietly_async(key, priority, wait, may_wait)
            except BaseException:
                self._twin_turn_passed(key)
                raise
            if self._local_slot_kept(key):
                return self._local_slot(key)
        turn = self._start_turn(key)
        try:  # see _local_slot_kept
            wait = max(0.0, ends - _now())
            return await self.acquire_async(key, priority, wait, may_wait, turn)
        finally:
            self._end_turn(key, turn)

    def _local_slot_kept(self, key: Hashable) -> bool:
        """A twin slot was just taken: whether it stays a local slot (Redis still
        fails and the slot is within ``local_limit``). Otherwise the slot is taken back:
        once Redis answers, the caller asks Redis for its lease, within the fleet's limit
        (a local slot taken now would be entered in Redis past it, beside a newer
        caller's lease from the same release); a caller let go to Redis past the
        twin's limit that finds Redis failing again waits in the twin once more.

        Twin waiters are let go to Redis one at a time, by priority: the first of each
        key when Redis answers again (:meth:`_twin_waiters_to_redis`), the next when
        the one before has its answer (:meth:`_end_turn`) or gives up.
        """
        assert self.twin is not None
        slots = self.twin._slots
        if not self.failover.healthy and not slots.over_limit(key):
            return True
        slots.retract(key)
        if self.failover.failing():  # failed again just now: the slot may be a waiter's
            self._fill_twin()
        return False

    def _start_turn(self, key: Hashable) -> list[bool]:
        """A caller from the twin asks Redis: its turn (``[True]`` until it ends)."""
        with self.lock:
            self._asking[key] = self._asking.get(key, 0) + 1
        return [True]

    def _end_turn(self, key: Hashable, turn: list[bool] | None) -> None:
        """The turn ends, once: the caller has its answer from Redis, or waits in the
        twin again (Redis failed once more). The next may ask."""
        if turn is None or not turn[0]:
            return
        turn[0] = False
        with self.lock:
            _count_down(self._asking, key)
        self._let_next_go(key)

    def _twin_turn_passed(self, key: Hashable) -> None:
        """A twin waiter gave up (timed out, cancelled): while nobody from the twin is
        asking Redis, the next waiter of ``key`` may (one let go at recovery but
        cancelled before it ran would otherwise leave the next waiting its whole
        ``max_wait`` while Redis had room)."""
        if not self._asking.get(key):
            self._let_next_go(key)

    def _let_next_go(self, key: Hashable) -> None:
        """While Redis answers, let the twin's first waiter of ``key`` ask Redis."""
        if not self.failover.healthy:
            return
        assert self.twin is not None
        waiter = self.twin._slots.admit_next(key)
        if waiter is not None:
            self.twin._wake(waiter)

    def _twin_waiters_to_redis(self) -> None:
        """Redis answers again: the first twin waiter of each key asks Redis now (the
        others follow one by one, see :meth:`_local_slot_kept`), not when a local slot
        frees (the leases granted since count in the twin and may keep it full)."""
        self._let_twin_waiters_go()
        if not self._late_check:
            # A caller that fell back a moment before the recovery may queue just after
            # this pass: one more pass shortly lets it go too.
            self._late_check = True
            KEEPER.schedule(_now() + _LATE_CHECK, self._late_twin_waiters)

    def _late_twin_waiters(self) -> None:
        self._late_check = False
        self._let_twin_waiters_go()

    def _let_twin_waiters_go(self) -> None:
        twin = self.twin
        if twin is None or not self.failover.healthy:
            return
        slots = twin._slots
        with slots.lock:
            keys = list(slots.queues)
        for key in keys:
            if not self._asking.get(key):
                self._let_next_go(key)

    def _local_slot(self, key: Hashable) -> LeasePermit:
        """A twin slot was taken while Redis failed: a permit to enter in Redis later.

        The twin slot itself is given back through :meth:`forget_held` at release.
        """
        permit = LeasePermit(self, key, self.keys_for(key), _new_token(), registered=False)
        with self.lock:
            self._held[key] = self._held.get(key, 0) + 1
            self._local[permit.token] = permit
            self._local_keys[permit.token] = key
        if self.failover.healthy:  # Redis came back while this caller waited
            self._reconcile_soon()
        self._watch()
        return permit

    # ------------------------------------------------------------------ after an outage

    def _reconcile_soon(self) -> None:
        with self.lock:
            if self._reconciling:
                return
            self._reconciling = True
        KEEPER.soon(self._reconcile)

    def _watch(self) -> None:
        """Keep a keeper job reconciling while anything waits for Redis (see ``_check``)."""
        with self.lock:
            if self._watching:
                return
            self._watching = True
        KEEPER.schedule(_now() + _RECONCILE_EVERY, self._check)

    def _check(self) -> float | None:
        """Keeper job: reconcile once; again in a second while something still waits.

        A caller's first success after an outage reconciles at once; this job covers a
        process that makes no further call while its local slots keep running.
        """
        self._give_back_dropped()
        self._reconcile()
        with self.lock:
            if self._local or self._unreleased or self._local_keys:
                return _now() + _RECONCILE_EVERY
            self._watching = False
        return None

    def _give_back_dropped(self) -> None:
        """Local slots whose permits were collected without release(): give them back
        (a leased permit's renewal job does the same for dropped leases)."""
        with self.lock:
            dropped = [
                (token, key) for token, key in self._local_keys.items() if token not in self._local
            ]
            for token, _ in dropped:
                del self._local_keys[token]
        for _, key in dropped:
            self.forget_held(key)

    def _reconcile(self) -> None:
        """Redis answers again: make it count what this process did without it.

        Releases that failed are sent (their slots would stay taken until the leases
        expire), and every local slot still held becomes a lease (entered past the
        limit if need be: its holder is running) renewed like any other. Until then
        other processes cannot see these holders; see docs/bulkhead.md. Runs in the
        keeper thread only (one job at a time); stops at the first backend failure.
        """
        with self.lock:
            self._reconciling = False
            unreleased, self._unreleased = self._unreleased, []
            local = list(self._local.values())
        # Every one is sent, even if its lease should have expired by now: a paused Redis
        # runs a timed-out acquire only when it resumes, so that lease starts then.
        for i, (keys, token) in enumerate(unreleased):
            try:
                self.release_script.run(keys, self.release_args(token))
            except BackendError:
                with self.lock:
                    self._unreleased[:0] = unreleased[i:]
                return
        for permit in local:
            sent = _now()
            try:
                self.acquire_script.run(permit.keys, [permit.token, _PAST_ANY_LIMIT, self.lease_ms])
            except BackendError:
                return  # still listed: the next success tries again
            with self.lock:
                self._local.pop(permit.token, None)
                self._local_keys.pop(permit.token, None)
                released = permit._released
                if not released:
                    permit._registered = True
                    job = permit._job = _Renewal(self, permit, sent)
            if released:  # released while it was being entered: take it out again
                self.release_now(permit.keys, permit.token)
            else:
                KEEPER.schedule(sent + self.renew_every, job)
        if unreleased or local:
            self.failover.succeeded()  # all sent: Redis answers again (reported)

    def release_on_recovery(self, keys: list[str], token: str) -> None:
        """A release failed (Redis down): send it again once Redis answers."""
        with self.lock:
            if len(self._unreleased) >= _MAX_UNRELEASED:
                del self._unreleased[0]  # the oldest lease expires first anyway
            self._unreleased.append((keys, token))
        self._watch()

    def _rejected(self, key: Hashable) -> BulkheadFull:
        return self.owner._rejected(key)

    # ------------------------------------------------------------------ local waiters

    def _enqueue(self, attempt: _Attempt) -> None:
        with self.lock:
            queue = self._queues.get(attempt.keys[0])
            if queue is None:
                queue = self._queues[attempt.keys[0]] = _LocalQueue()
            heapq.heappush(queue.heap, (attempt.priority, next(self._seq), attempt))
            queue.live += 1
            attempt.queued = True
        self.notifier.ensure_running()

    def _dequeue(self, attempt: _Attempt, *, wake_next: bool) -> None:
        with self.lock:
            if not attempt.queued:
                return
            attempt.queued = False
            name = attempt.keys[0]
            queue = self._queues[name]
            queue.live -= 1
            if not queue.live:
                del self._queues[name]
                return
            if len(queue.heap) > 2 * queue.live + 8:
                queue.heap = [entry for entry in queue.heap if entry[2].queued]
                heapq.heapify(queue.heap)
            head = queue.head() if wake_next else None
        if head is not None and head.signal is not None:
            head.signal.set()

    def _is_head(self, attempt: _Attempt) -> bool:
        with self.lock:
            queue = self._queues.get(attempt.keys[0])
            return queue is not None and queue.head() is attempt

    def _wake_next(self, attempt: _Attempt) -> None:
        with self.lock:
            queue = self._queues.get(attempt.keys[0])
            head = None if queue is None else queue.head()
        if head is not None and head.signal is not None:
            head.signal.set()

    def _notified(self, name: str) -> None:
        """A release of the key whose leases set is ``name``: wake its first waiter."""
        with self.lock:
            queue = self._queues.get(name)
            head = None if queue is None else queue.head()
        if head is not None and head.signal is not None:
            head.signal.set()

    def _wake_all_waiters(self) -> None:
        with self.lock:
            waiters = [entry[2] for queue in self._queues.values() for entry in queue.heap]
        for waiter in waiters:
            if waiter.queued and waiter.signal is not None:
                waiter.signal.set()

    def _wake_all_heads(self) -> None:
        with self.lock:
            heads = [queue.head() for queue in self._queues.values()]
        for head in heads:
            if head is not None and head.signal is not None:
                head.signal.set()

    def waiting(self, key: Hashable) -> int:
        """This process's waiters of ``key`` (they queue here, not in the local slots)."""
        with self.lock:
            queue = self._queues.get(self.keys_for(key)[0])
            return 0 if queue is None else queue.live

    def _has_waiters(self) -> bool:
        return bool(self._queues)

    # ------------------------------------------------------------------ releasing

    def begin_release(self, permit: LeasePermit) -> bool:
        """Mark ``permit`` released (False if it already was) and stop its renewals."""
        with self.lock:
            if permit._released:
                return False
            permit._released = True
            job = permit._job
            if job is not None:
                job.active = False
        if job is not None:
            KEEPER.cancelled()
        return True

    def end_release(self, permit: LeasePermit, removed: Any, *, quiet: bool) -> None:
        """After the release script: account, report a loss, maybe raise LeaseLost."""
        if not permit._registered:
            with self.lock:
                self._local.pop(permit.token, None)
                self._local_keys.pop(permit.token, None)
        self.forget_held(permit.key)
        self._notified(permit.keys[0])  # this process's own waiter need not hear Redis
        if permit._t0 is not None:
            self.owner._slots.record_hold(_now() - permit._t0)
        if removed is not None and not int(removed) and not permit._lost:
            with self.lock:
                permit._lost = True
                permit.reason = "expired"
                permit._callbacks = []
            self.lease_lost(permit, "expired")
        if permit._lost and self.raise_lost and not quiet:
            raise LeaseLost(
                key=None if permit.key is None else str(permit.key), reason=permit.reason
            )

    def forget_held(self, key: Hashable) -> None:
        """One lease of ``key`` held by this process is gone."""
        with self.lock:
            _count_down(self._held, key)
        self._twin_gives_back(key)

    def release_now(self, keys: list[str], token: str) -> None:
        """Release ``token``'s lease, if any; if Redis fails, again once it answers.

        (A paused Redis runs a timed-out acquire when it resumes: without the second
        try that lease would hold a slot until it expires.)
        """
        try:
            self.release_script.run(keys, self.release_args(token))
        except BackendError:
            self.release_on_recovery(keys, token)

    def release_later(self, keys: list[str], token: str) -> None:
        """Release ``token``'s lease from the keeper thread (never blocks the caller).

        Used when a round trip was cut short, so its script may still reach Redis: an
        abandoned worker thread (trio) or a half-sent command can land *after* this
        release, which goes out on another connection. A second release, once any such
        straggler must be over (the backend's round-trip bound, and a little), removes a
        lease that would otherwise hold a slot until it expired.
        """

        def release() -> None:
            self.release_now(keys, token)

        KEEPER.soon(release)
        KEEPER.schedule(time.monotonic() + self.backend.round_trip_bound + 0.05, release)

    def lease_lost(self, permit: LeasePermit, reason: str) -> None:
        """Count and report a lost lease."""
        with self.lock:
            self.leases_lost += 1
        owner = self.owner
        if owner._observed:
            key = permit.key
            owner._emit(
                BulkheadLeaseLost(
                    policy=owner.name, key=None if key is None else str(key), reason=reason
                )
            )

    # ------------------------------------------------------------------ introspection

    def statistics(
        self, key: Hashable
    ) -> tuple[int | None, dict[str, Any], tuple[int, int, int, int]]:
        """``(leases in Redis for key, backend counters, (held, waiting, keys, rejected)
        here)``; ``rejected`` counts the local twin's refusals while Redis failed."""
        with self.lock:
            opened = [permit.key for permit in self._open]
            if key is None:
                held = sum(self._held.values()) + len(opened)
                waiting = sum(queue.live for queue in self._queues.values())
                keys = len(self._held.keys() | set(opened))
            else:
                held = self._held.get(key, 0) + opened.count(key)
                queue = self._queues.get(self.keys_for(key)[0])
                waiting = 0 if queue is None else queue.live
                keys = 1 if held else 0
        rejected = 0
        if self.twin is not None:
            twin = self.twin.statistics(key)
            waiting += twin.waiting
            rejected = twin.rejected
        shared: int | None = None
        if key is not None or self.owner._key is None:
            try:
                shared = int(self.count_script.run([self.keys_for(key)[0]]))
            except BackendError:
                shared = None
        backend: dict[str, Any] = dict(self.failover.statistics())
        backend["leases_lost"] = self.leases_lost
        backend["lease"] = self.lease
        return shared, backend, (held, waiting, keys, rejected)

    def close(self) -> None:
        """Stop the notification listener (held leases keep being renewed until released)."""
        self.notifier.close()
