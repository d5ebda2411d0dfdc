"""Shared breaker state across processes through Redis: advisory, cheap, never in the way.

The rules:

* **The local breaker stays authoritative for its own traffic.** The CLOSED happy path
  sends no Redis command at all.
* **Trips are broadcast.** When a process's breaker opens, a background thread runs
  one Lua script: ``SET`` an open signal with a TTL (the cool-down), index it, and
  ``PUBLISH`` it. Every other process hears it on its subscriber thread and opens
  its own breaker for the rest of that TTL. A cached read of the index every
  ``sync_interval`` seconds (off the call path) catches a missed message.
* **One probe fleet-wide.** When a process's cool-down ends, the first call that would
  probe wins the probe with ``SET NX PX`` (one round trip, once per cool-down); the
  losers stay OPEN until the winner shares its outcome: a ``close`` message (the
  probes passed: everybody closes) or a new open signal (they failed).
* **Quorum** (``quorum=M``): a trip only opens the fleet once ``M`` processes report
  open within the cool-down; until then each process's own breaker decides alone.
* **Fork**: a child process (a pre-forking server's worker) gets its own identity and
  threads, so breakers built before the fork keep sharing.
* **Redis down**: the subscriber notices, elections stop, every process keeps its
  local breaker; nothing in the call path waits on Redis (a publish is a queue put;
  an election is bounded by the backend timeout and skipped while Redis is down).
  A trip that could not be published is sent when Redis answers again (at the next
  poll, one on reconnection included), for what is left of its cool-down, if the
  breaker is still open. A close that could not be published stays local: the
  breaker follows the fleet again at its next poll. Between processes, the order in
  which Redis receives trips and closes decides.

Keys (all of one breaker share one Redis Cluster hash tag)::

    {prefix}:{cb:<name>}:<key>:open      the open signal (value: member), PX = cool-down
    {prefix}:{cb:<name>}:<key>:probe     the fleet probe lease (value: member; SET NX PX)
    {prefix}:{cb:<name>}:<key>:reports   quorum reports (ZSET process -> expiry)
    {prefix}:{cb:<name>}:index           open keys (ZSET key -> expiry), for the cached read
    {prefix}:{cb:<name>}:started         open keys (ZSET key -> stamp of its newest trip)
    {prefix}:{cb:<name>}:stamp           the last stamp (Redis ms x 1000, strictly rising)
    channel {prefix}:cb:events           JSON messages {op, name, key, ttl, origin}

A *member* is one breaker (``SharedState.origin``): two breakers of one name in one
process hear each other and hold probe leases of their own. A quorum counts processes
(``_Hub.origin``): two breakers of a process that see the same failures are one report.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

from ..backends._failover import Failover
from ..bulkhead._keeper import KEEPER
from ..errors import BackendError
from ._state import CircuitState

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker
    from ._config import BreakerConfig

__all__ = ["SharedState"]

logger = logging.getLogger("resilience.breaker")

_STOP = object()  # tells the publisher thread to exit
#: Publishes waiting for the publisher thread, at most: one per (name, key), the newest
#: state replacing an older one still queued; past this cap a publish is dropped (the
#: fleet still learns the state by polling).
_MAX_PENDING = 10_000
#: How long a close that reached Redis is remembered, to tell the trips it removed
#: (those stamped before it) from later ones when they come late.
_CLOSE_MEMORY = 60.0

_TRIP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local quorum = tonumber(ARGV[3])
local reports = 1
if quorum > 1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[7])
  redis.call('PEXPIRE', KEYS[3], ttl)
  reports = redis.call('ZCARD', KEYS[3])
  if reports < quorum then
    -- No fleet trip yet. Our own probe lease (our probe just failed) lasts our new
    -- cool-down: no other process probes in it. Another process's lease is left
    -- alone: its probe's cool-down is not over because we tripped.
    if redis.call('GET', KEYS[4]) == ARGV[2] then
      redis.call('PEXPIRE', KEYS[4], ttl)
    end
    return {0, reports}
  end
end
redis.call('DEL', KEYS[4])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('ZREM', KEYS[5], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local score = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[4]) or '0')
if score < now + ttl then redis.call('ZADD', KEYS[2], now + ttl, ARGV[4]) end
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
-- When the key's newest trip began, as a stamp (Redis ms x 1000, strictly rising per
-- breaker name): a close knows which trips it removed by comparing its own stamp
-- with it (see SharedState._closed_since).
local last = tonumber(redis.call('GET', KEYS[6]) or '0')
local stamp = math.max(now * 1000, last + 1)
redis.call('SET', KEYS[6], string.format('%.0f', stamp), 'PX', 86400000)
redis.call('ZADD', KEYS[5], stamp, ARGV[4])
if redis.call('PTTL', KEYS[5]) < ttl then redis.call('PEXPIRE', KEYS[5], ttl) end
local message = string.gsub(ARGV[6], '"__BEGAN__"', string.format('%.0f', stamp), 1)
redis.call('PUBLISH', ARGV[5], message)
return {1, reports}
"""

# Returns the close's stamp (see _TRIP): the trips with a lower one are closed.
_CLOSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[6]) or '0')
local stamp = math.max(now * 1000, last + 1)
redis.call('SET', KEYS[6], string.format('%.0f', stamp), 'PX', 86400000)
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return string.format('%.0f', stamp)
"""

_ELECT = """
local signal = redis.call('GET', KEYS[2])
if signal and signal ~= ARGV[1] then
  local left = redis.call('PTTL', KEYS[2])
  if left > 0 then return {0, left} end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- Won again while our lease lasts: a whole lease from now, as a new win gets (what
  -- is left of it may end before the first renewal, a lease / 3 from now).
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_POLL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #entries, 2 do
  out[#out + 1] = entries[i]
  out[#out + 1] = tonumber(entries[i + 1]) - now
  out[#out + 1] = tonumber(redis.call('ZSCORE', KEYS[2], entries[i]) or '-1')
end
return out
"""


def _safe(part: str) -> str:
    if len(part) <= 64 and part.replace("-", "").replace("_", "").replace(".", "").isalnum():
        return part
    return "#" + hashlib.blake2b(part.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


class _Hub:
    """One per backend per process: the subscriber thread, the publisher thread."""

    _hubs: ClassVar[weakref.WeakKeyDictionary[Any, _Hub]] = weakref.WeakKeyDictionary()
    _hubs_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_backend(cls, backend: Any) -> _Hub:
        with cls._hubs_lock:
            hub = cls._hubs.get(backend)
            if hub is None or hub.stopped:
                hub = cls(backend)
                cls._hubs[backend] = hub
            return hub

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        #: This process's identity in quorum reports (each breaker has its own origin).
        self.origin = uuid.uuid4().hex
        self.channel = f"{backend.prefix}:cb:events"
        self.connected = False
        self.stopped = False
        #: name -> the breakers of that name (several may share one: each hears all).
        self._members: dict[str, weakref.WeakSet[SharedState]] = {}
        self._lock = threading.Lock()
        # The publisher's work: slots in order, each slot's newest job in _pending.
        self._jobs: queue.SimpleQueue[Hashable] = queue.SimpleQueue()
        self._pending: dict[Hashable, Callable[[], object]] = {}
        self._pending_lock = threading.Lock()
        #: Publishes dropped because _MAX_PENDING were waiting.
        self.dropped = 0
        self._stop = threading.Event()
        #: Stopping, the publisher sends what is queued until then (monotonic seconds).
        self._flush_until = 0.0
        self._subscriber: threading.Thread | None = None
        self._publisher: threading.Thread | None = None
        self._next_poll = 0.0
        self.interval = 1.0
        #: Held by the subscriber thread while it works on breakers (a remote trip, a
        #: poll), and by a fork: a child must not inherit a breaker lock that thread
        #: held, or its first call through that breaker would wait for good.
        self._applying = threading.RLock()

    # ---------------------------------------------------------------- membership

    def register(self, shared: SharedState) -> bool:
        """Add ``shared``; ``False`` if this hub stopped meanwhile (ask for a new one)."""
        with self._lock:
            if self.stopped:
                return False
            self._members.setdefault(shared.name, weakref.WeakSet()).add(shared)
            self.interval = min((m.sync_interval for m in self._live()), default=1.0)
            if self._subscriber is None:
                self._start_threads()
            return True

    def _start_threads(self) -> None:
        self._subscriber = threading.Thread(
            target=self._subscribe_loop, name="resilience-breaker-sub", daemon=True
        )
        self._publisher = threading.Thread(
            target=self._publish_loop, name="resilience-breaker-pub", daemon=True
        )
        self._subscriber.start()
        self._publisher.start()

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, prefork workers): the parent's threads
        did not come along and its identity is not the child's (the child would skip
        its parent's messages as its own). A new identity, fresh locks and queues, and
        the threads again if breakers use this hub."""
        self.origin = uuid.uuid4().hex
        self.connected = False
        self._lock = threading.Lock()
        self._applying = threading.RLock()
        self._jobs = queue.SimpleQueue()
        self._pending = {}
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._subscriber = None
        self._publisher = None
        members = self._live()
        for member in members:
            member.origin = uuid.uuid4().hex  # the parent's leases and messages are not ours
            member._unsent_lock = threading.Lock()
            member._unsent = {}  # the parent's trips, not this process's to report
            member._closing = {}  # the parent's closes, likewise
            member._deferred = {}
        if not self.stopped and members:
            self._start_threads()

    def unregister(self, shared: SharedState) -> None:
        with self._lock:
            group = self._members.get(shared.name)
            if group is not None:
                group.discard(shared)
                if not group:
                    del self._members[shared.name]
            empty = not self._live()
            if empty:
                self.stopped = True  # under the lock: no register() slips in after
        if empty:
            self.stop()

    def _forget(self) -> None:
        """Leave the backend -> hub table: this hub holds its backend, so as a value of a
        table weakly keyed by that backend it would keep both alive for good."""
        with _Hub._hubs_lock:
            if _Hub._hubs.get(self.backend) is self:
                del _Hub._hubs[self.backend]

    def _live(self) -> list[SharedState]:
        return [member for group in list(self._members.values()) for member in list(group)]

    def stop(self, timeout: float = 2.0) -> None:
        """Stop both threads: the publisher once it has sent what was queued before
        (a trip or a probe's outcome just before the last breaker left the fleet), the
        subscriber within about 0.1 s. Waits ``timeout`` seconds for each at most."""
        self._forget()
        self.finish(timeout)
        thread = self._subscriber
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def finish(self, timeout: float) -> None:
        """Take no more publishes, send those queued, and stop publishing; wait up to
        ``timeout`` seconds for that (the subscriber is told to stop, not awaited)."""
        self.stopped = True
        self._flush_until = time.monotonic() + _FLUSH_SECONDS
        self._stop.set()
        self._jobs.put(_STOP)
        thread = self._publisher
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ---------------------------------------------------------------- publishing

    def submit(self, slot: Hashable, job: Callable[[], object]) -> bool:
        """Run ``job`` on the publisher thread (never blocks the caller).

        A job of a ``slot`` (a breaker name and key) still waiting is replaced: only the
        newest state of a key is worth publishing, and the queue stays bounded when
        transitions come faster than Redis takes them. ``False``: dropped (stopped, or
        :data:`_MAX_PENDING` publishes wait).
        """
        if self.stopped:
            return False
        with self._pending_lock:
            if slot not in self._pending:
                if len(self._pending) >= _MAX_PENDING:
                    self.dropped += 1
                    return False
                self._jobs.put(slot)
            self._pending[slot] = job
        return True

    def _publish_loop(self) -> None:
        while True:
            slot = self._jobs.get()
            if slot is _STOP:  # queued after every job it must not drop
                return
            if self._stop.is_set() and time.monotonic() > self._flush_until:
                return  # Redis too slow to take the rest: stop is bounded, the rest is lost
            with self._pending_lock:
                job = self._pending.pop(slot, None)
            try:
                if job is not None:
                    job()
            except Exception:  # pragma: no cover - jobs report their own errors
                logger.warning("resilience: breaker publish failed", exc_info=True)
            # Not kept while waiting for the next one: the job's closure holds its
            # breaker, which could then never be collected (nor these threads stop).
            job = None

    # ---------------------------------------------------------------- subscribing

    def _subscribe_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self.backend.sync_client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                with self._applying:
                    self._poll_all()  # catch up on what was missed while away
                    self._set_connected(True, None)
                backoff = 0.05
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.1)
                    if message is not None and message.get("type") == "message":
                        with self._applying:
                            self._dispatch(message["data"])
                    if time.monotonic() >= self._next_poll:
                        with self._applying:
                            self._poll_all()
            except Exception as exc:
                with self._applying:
                    self._set_connected(False, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # pragma: no cover - best effort
                        pass

    def _set_connected(self, connected: bool, error: BaseException | None) -> None:
        if connected == self.connected:
            return
        self.connected = connected
        for member in self._live():
            member._connection_changed(connected, error)

    def _dispatch(self, data: Any) -> None:
        try:
            message = json.loads(data)
            origin = message.get("origin")
            trips = int(message.get("trips", 0))
            for member in list(self._members.get(message["name"], ())):
                if member.origin == origin:
                    continue  # its own message; another breaker of this process hears it
                ttl = float(message.get("ttl", 0))
                began = int(message.get("began", -1))
                member._remote(message["op"], message.get("key"), ttl, trips, began)
        except Exception:
            logger.warning("resilience: bad breaker message %r", data, exc_info=True)

    def _poll_all(self) -> None:
        self._next_poll = time.monotonic() + self.interval
        with self._lock:  # drop the names whose breakers are all gone
            for name in [name for name, group in self._members.items() if not group]:
                del self._members[name]
            members = self._live()
            if not members:  # every breaker of this backend is gone
                self.stopped = True  # under the lock: no register() slips in after
        if not members:
            self.stop(timeout=0)  # on the subscriber thread: no waiting for either
            return
        for member in members:
            member._poll()


#: The hubs whose subscriber a fork in progress keeps out of breaker code.
_HELD_AT_FORK: list[_Hub] = []
#: How long a fork waits for a subscriber to finish what it applies (a listener that
#: blocks must not block every fork: past it, the fork goes on).
_FORK_WAIT = 1.0


def _before_fork() -> None:
    with _Hub._hubs_lock:
        hubs = list(_Hub._hubs.values())
    for hub in hubs:
        if hub._applying.acquire(timeout=_FORK_WAIT):
            _HELD_AT_FORK.append(hub)


def _after_fork_in_parent() -> None:
    for hub in _HELD_AT_FORK:
        hub._applying.release()
    _HELD_AT_FORK.clear()


def _after_fork_in_child() -> None:
    _HELD_AT_FORK.clear()  # each hub gets a new lock
    _Hub._hubs_lock = threading.Lock()
    for hub in list(_Hub._hubs.values()):
        try:
            hub._after_fork()
        except Exception:  # pragma: no cover - never fail the fork itself
            logger.warning("resilience: breaker hub not restarted after fork", exc_info=True)


if hasattr(os, "register_at_fork"):  # pragma: no branch
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )

#: How long an exiting process waits, in all, to send the trips and closes it queued.
_EXIT_FLUSH_SECONDS = 1.0
#: How long a stopping publisher goes on sending what was queued (Redis slow or down).
_FLUSH_SECONDS = 1.0


def _flush_at_exit() -> None:
    """The process is exiting: send what the publishers still hold (within
    :data:`_EXIT_FLUSH_SECONDS` in all), so a worker that trips and exits at once (a
    CLI job, a recycled server worker) still tells the fleet."""
    end = time.monotonic() + _EXIT_FLUSH_SECONDS
    for hub in list(_Hub._hubs.values()):
        try:
            hub.finish(max(0.0, end - time.monotonic()))
        except Exception:  # pragma: no cover - never fail the exit itself
            logger.warning("resilience: breaker flush at exit failed", exc_info=True)


# threading's exit hooks run before the interpreter joins its threads, while daemon
# threads still run, and in multiprocessing children too (which skip atexit).
try:
    threading._register_atexit(_flush_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):  # pragma: no cover - no such hook, or exiting now
    import atexit

    atexit.register(_flush_at_exit)


def default_identity(name: str, config: BreakerConfig) -> str:
    """The fleet identity of a shared breaker built without ``name=``: its default
    name and a digest of its thresholds, so that a fleet's copies of one breaker share
    state while two unnamed breakers with different settings do not (as an unnamed
    distributed bulkhead's identity carries its limit)."""
    settings = (
        config.failure_rate,
        config.window,
        config.window_type,
        config.buckets,
        config.min_calls,
        config.slow_call,
        config.slow_call_rate,
        config.consecutive_failures,
        config.open_for,
        config.open_for_max,
        config.half_open_calls,
    )
    return f"{name}-{hashlib.sha256(repr(settings).encode()).hexdigest()[:12]}"


class SharedState:
    """The advisory Redis shared state of one :class:`~resilience.CircuitBreaker`.

    Built by the breaker when given ``backend=RedisBackend(...)``; its ``name`` is the
    breaker's identity across the fleet (without one, :func:`default_identity`). See
    :mod:`resilience.breaker` (module ``_shared``) for the protocol. Counters for
    dashboards are in :meth:`statistics`.

    Example::

        backend = rs.backends.RedisBackend.from_url("redis://localhost:6379/0")
        breaker = rs.CircuitBreaker(name="llm", backend=backend, quorum=2)
        breaker.shared.statistics()   # {'backend_healthy': True, 'published': 0, ...}
    """

    def __init__(
        self,
        backend: Any,
        breaker: CircuitBreaker,
        *,
        quorum: int = 1,
        sync_interval: float = 1.0,
        identity: str | None = None,
    ) -> None:
        self.backend = backend
        #: The breaker's identity across the fleet: its name (see :func:`default_identity`).
        self.name = breaker.name if identity is None else identity
        self.quorum = quorum
        self.sync_interval = sync_interval
        self._closed = False  # left the fleet (close()): no more elections or publishes
        config = breaker.config
        lease = config.max_half_open_wait or max(config.open_for, 1.0)
        #: How long the winner of the fleet probe holds it (ms) before others may try.
        self.lease_ms = max(1, int(lease * 1000))
        self._breaker = weakref.ref(breaker)
        self._failover = Failover("local", owner=breaker, clock=breaker._clock)
        self._trip = backend.script(_TRIP)
        self._close = backend.script(_CLOSE)
        self._elect = backend.script(_ELECT)
        self._renew = backend.script(_RENEW)
        self._poll_script = backend.script(_POLL)
        self._tag = backend.key("cb", _safe(self.name))
        self._index = self._tag + ":index"
        self._started = self._tag + ":started"
        self._hub = _Hub.for_backend(backend)
        #: This breaker's identity in the fleet: its messages, open signals and probe
        #: leases (a new one in a forked child).
        self.origin = uuid.uuid4().hex
        # Trips not published (Redis unreachable): wire key -> (key, monotonic end of
        # the cool-down, trips, quorum); sent again once Redis answers (see _poll).
        self._unsent: dict[str | None, tuple[Hashable, float, int, int]] = {}
        # This breaker's closes: index member -> (the close's id, its stamp from Redis
        # (see _TRIP), None while it is on its way; when that was known here). A trip
        # with a lower stamp, or any trip while the close is on its way, is one the
        # close removes: a poll that read it, or its message come
        # late, does not re-open this breaker. A close Redis did not take is forgotten:
        # the breaker follows the fleet again (its next poll re-opens it if the trip is
        # still there).
        self._closing: dict[str, tuple[str, int | None, float]] = {}
        # A trip message that came while this breaker's close was on its way: decided
        # when the close lands (index member -> key, ttl ms, trips, began, heard at).
        self._deferred: dict[str, tuple[str | None, float, int, int, float]] = {}
        self._unsent_lock = threading.Lock()
        #: Messages sent / applied, and fleet elections won / lost.
        self.published = 0
        self.applied = 0
        self.won = 0
        self.lost = 0

    def start(self) -> None:
        """Join the fleet: start (or share) the subscriber and publisher threads."""
        while not self._hub.register(self):
            # That hub stopped (its last breaker went) since this one picked it.
            self._hub = _Hub.for_backend(self.backend)

    def close(self) -> None:
        """Leave the fleet; the threads stop when no breaker of this backend remains.
        The breaker goes on alone: it no longer takes part in the fleet's half-open
        elections (it could not tell the fleet the outcome).

        Example: ``breaker.shared.close()``
        """
        self._closed = True
        self._hub.unregister(self)

    @property
    def connected(self) -> bool:
        """Whether the subscriber is connected to Redis (``False`` once closed)."""
        return not self._closed and self._hub.connected

    def reachable(self) -> bool:
        """Whether the half-open election may use Redis now (in the fleet, connected,
        not backing off)."""
        return not self._closed and self._hub.connected and self._failover.use_backend()

    def _keys(self, key: Hashable) -> list[str]:
        base = f"{self._tag}:{_safe('' if key is None else str(key))}"
        return [
            base + ":open",
            self._index,
            base + ":reports",
            base + ":probe",
            self._started,
            self._tag + ":stamp",
        ]

    # ---------------------------------------------------------------- outbound

    def local_change(
        self,
        key: Hashable,
        new: CircuitState,
        reason: str,
        open_for: float | None,
        trips: int = 0,
    ) -> None:
        """The local breaker moved; tell the fleet (queued, never blocks)."""
        if self._closed or reason in ("remote", "fleet_probe", "initial", "cool_down"):
            return
        wire = None if key is None else str(key)
        if new is CircuitState.OPEN and open_for is not None:
            ttl = max(1, int(open_for * 1000))
            # An operator's open() opens the fleet at once: it is no report to a quorum.
            quorum = 1 if reason == "manual" else self.quorum
            with self._unsent_lock:
                self._closing.pop(wire or "", None)  # tripped again: that close is old news
                self._deferred.pop(wire or "", None)
            # One publish slot per breaker and key: a sibling breaker's (same name, same
            # backend) must not replace this one's.
            self._hub.submit(
                (self.origin, wire), lambda: self._publish_open(key, wire, ttl, trips, quorum)
            )
        elif new is CircuitState.CLOSED and reason in ("probes_succeeded", "manual"):
            # An operator's close() closes the fleet, cool-downs of their own included
            # ("reset"); a probe's success closes those that wait for it ("close").
            op = "reset" if reason == "manual" else "close"
            with self._unsent_lock:
                closing = self._closing
                closing.pop(wire or "", None)  # re-inserted as the newest
                self._deferred.pop(wire or "", None)  # this close removes that trip too
                if len(closing) >= _MAX_PENDING:
                    del closing[next(iter(closing))]
                close = uuid.uuid4().hex
                closing[wire or ""] = (close, None, time.monotonic())
            job = functools.partial(self._publish_close, wire, op, close)
            if not self._hub.submit((self.origin, wire), job):
                self._close_settled(wire, close, None)

    def _message(self, op: str, key: str | None, ttl: int = 0, trips: int = 0) -> str:
        # "began" first: the trip script replaces the first "__BEGAN__" with the trip's
        # stamp, which must not be a name or key spelled so.
        body: dict[str, Any] = {"began": "__BEGAN__"} if op == "open" else {}
        body.update(op=op, name=self.name, key=key, ttl=ttl, origin=self.origin)
        if op == "open":
            body["trips"] = trips
        return json.dumps(body)

    def _publish_open(
        self, key: Hashable, wire: str | None, ttl: int, trips: int, quorum: int
    ) -> None:
        args = [ttl, self.origin, quorum, wire or "", self._hub.channel]
        message = self._message("open", wire, ttl, trips)
        reply = self._run(self._trip, self._keys(wire), [*args, message, self._hub.origin])
        sent = reply is not None
        with self._unsent_lock:
            if sent:
                self._unsent.pop(wire, None)
                return
            now = time.monotonic()
            unsent = self._unsent
            unsent.pop(wire, None)  # re-inserted as the newest
            if len(unsent) >= _MAX_PENDING:  # a long outage: forget what is over, then the oldest
                for old in [w for w, entry in unsent.items() if entry[1] <= now]:
                    del unsent[old]
                if len(unsent) >= _MAX_PENDING:
                    del unsent[next(iter(unsent))]
            unsent[wire] = (key, now + ttl / 1000.0, trips, quorum)

    def _publish_close(self, wire: str | None, op: str, close: str) -> None:
        with self._unsent_lock:
            self._unsent.pop(wire, None)  # closed since: that trip is news no more
        args = [wire or "", self._hub.channel, self._message(op, wire)]
        ran = self._run(self._close, self._keys(wire), args)
        self._close_settled(wire, close, None if ran is None else int(ran))

    def _close_settled(self, wire: str | None, close: str, ran: int | None) -> None:
        """``close`` ran in Redis with the stamp ``ran`` (noted), or never will (forgotten).

        A trip message that came meanwhile is applied now if the close did not remove
        it (it began after the close ran, or the close never ran).
        """
        member = wire or ""
        with self._unsent_lock:
            entry = self._closing.get(member)
            if entry is None or entry[0] != close:
                return  # tripped or closed again since: that is the news now
            if ran is not None:
                self._closing[member] = (close, ran, time.monotonic())
            else:
                del self._closing[member]
            deferred = self._deferred.pop(member, None)
        if deferred is None:
            return
        key, ttl_ms, trips, began, heard = deferred
        left = ttl_ms - (time.monotonic() - heard) * 1000
        if left > 0 and (ran is None or not 0 <= began <= ran):
            with self._hub._applying:  # as the subscriber applies a message
                self._remote("open", key, left, trips)

    def _closed_since(self, wire: str | None, began: int) -> bool:
        """Whether this breaker's close removed the trip of ``wire`` stamped ``began``
        (-1: not known): it came before the close ran, or the close is still on its
        way (it will remove whatever is there)."""
        entry = self._closing.get(wire or "")
        if entry is None:
            return False
        ran = entry[1]
        return ran is None or 0 <= began <= ran

    def _resend(self, breaker: CircuitBreaker) -> None:
        """Publish the trips Redis missed, for what is left of their cool-downs."""
        with self._unsent_lock:
            unsent, self._unsent = self._unsent, {}
        now = time.monotonic()
        for wire, (key, until, trips, quorum) in unsent.items():
            ttl = int((until - now) * 1000)
            if ttl <= 0 or breaker.state_of(key) is not CircuitState.OPEN:
                continue
            job = functools.partial(self._publish_open, key, wire, ttl, trips, quorum)
            with self._unsent_lock:
                # Under the lock a close records itself before it is queued: one made
                # since the check above is seen here (this trip must not replace it in
                # the publish slot), one made after queues behind this and replaces it.
                if (wire or "") not in self._closing:
                    self._hub.submit((self.origin, wire), job)

    def _failed(self, exc: Exception, key: Hashable = None) -> None:
        if not isinstance(exc, BackendError):  # a client bug must not escape either
            logger.warning("resilience: unexpected Redis client error", exc_info=exc)
            wrapped = BackendError(f"redis client failed: {exc!r}")
            wrapped.__cause__ = exc
            exc = wrapped
        self._failover.failed(exc, key)

    def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            result = script.run(keys, args)
        except Exception as exc:
            self._failed(exc)
            return None
        self._failover.succeeded()
        self.published += 1
        return result

    # ---------------------------------------------------------------- election

    def _elect_keys(self, key: Hashable) -> list[str]:
        keys = self._keys(key)
        return [keys[3], keys[0]]

    def _election(self, raw: Any, key: Hashable) -> tuple[bool, float]:
        won, wait = bool(int(raw[0])), max(0, int(raw[1])) / 1000.0
        if won:
            self.won += 1
            self._keep_lease(key)
        else:
            self.lost += 1
        return won, wait

    def _keep_lease(self, key: Hashable) -> None:
        """Renew a won probe lease while this process's probe is out.

        The lease must outlive a slow probe: the local breaker waits for its probes (up
        to ``max_half_open_wait``, or for ever), and another process that won the next
        election meanwhile would probe too. Renewal stops when no probe is out (it
        reported, was ignored, or is overdue), when the breaker is gone or leaves the
        fleet; a winner that dies stops renewing, and its lease expires as before.

        The job runs in the lease keeper's thread, which renews bulkhead leases too: it
        holds nothing strongly (a dropped breaker is collected) and runs no user code.
        """
        keys = self._elect_keys(key)[:1]
        every = self.lease_ms / 3000.0
        shared_ref = weakref.ref(self)
        origin, lease_ms, script = self.origin, self.lease_ms, self._renew

        def renew() -> float | None:
            shared = shared_ref()
            breaker = None if shared is None else shared._breaker()
            if shared is None or breaker is None or shared._closed:
                return None
            core = breaker._peek(key)
            if core is None or not core.probe_out(breaker._now()):
                return None  # its outcome (or the next trip) deletes the lease
            del breaker, core
            try:
                kept = script.run(keys, [origin, lease_ms])
            except Exception:
                return time.monotonic() + every  # Redis may answer before the lease ends
            return time.monotonic() + every if int(kept) else None

        KEEPER.schedule(time.monotonic() + every, renew)

    def elect(self, key: Hashable) -> tuple[bool, float]:
        """Try to win the fleet-wide half-open probe: ``(won, seconds to wait if lost)``.

        Redis errors count as a win: without Redis, the local breaker decides.
        """
        try:
            raw = self._elect.run(self._elect_keys(key), [self.origin, self.lease_ms])
        except Exception as exc:
            self._failed(exc, key)
            return True, 0.0
        self._failover.succeeded()
        return self._election(raw, key)

    async def elect_async(self, key: Hashable) -> tuple[bool, float]:
        """:meth:`elect` for async callers (asyncio client, or a worker thread on trio)."""
        try:
            raw = await self._elect.run_async(self._elect_keys(key), [self.origin, self.lease_ms])
        except Exception as exc:
            self._failed(exc, key)
            return True, 0.0
        self._failover.succeeded()
        return self._election(raw, key)

    # ---------------------------------------------------------------- inbound (hub thread)

    def _remote(
        self, op: str, key: str | None, ttl_ms: float, trips: int = 0, began: int = -1
    ) -> None:
        if op != "open":
            with self._unsent_lock:  # that close removed a trip waiting for ours too
                self._deferred.pop(key or "", None)
        elif began != -1:
            with self._unsent_lock:
                entry = self._closing.get(key or "")
                if entry is not None and entry[1] is None:  # decided when the close lands
                    self._deferred[key or ""] = (key, ttl_ms, trips, began, time.monotonic())
                    return
            if self._closed_since(key, began):
                return
        breaker = self._breaker()
        if breaker is None:
            return
        self.applied += 1
        breaker._apply_remote(key, op, ttl_ms / 1000.0, trips)

    def _poll(self) -> None:
        breaker = self._breaker()
        if breaker is None:
            return
        # A failure propagates to the subscriber loop, which reports it (once) to every
        # breaker of the backend as the connection lost.
        raw = self._poll_script.run([self._index, self._started], [])
        self._failover.succeeded()
        with self._unsent_lock:
            closing = self._closing
            old = time.monotonic() - _CLOSE_MEMORY
            for done in [w for w, (_, ran, at) in closing.items() if ran is not None and at < old]:
                del closing[done]
        if self._unsent:
            self._resend(breaker)
        for index in range(0, len(raw), 3):
            member = raw[index]
            wire = member.decode() if isinstance(member, bytes) else str(member)
            if self._closed_since(wire, int(raw[index + 2])):
                continue  # a trip this breaker's close removed (or will)
            key = wire if breaker.keyed else None
            if breaker.state_of(key) is CircuitState.CLOSED:
                self.applied += 1
                breaker._apply_remote(key, "open", int(raw[index + 1]) / 1000.0)

    def _connection_changed(self, connected: bool, error: BaseException | None) -> None:
        if connected:
            self._failover.succeeded()
        else:
            wrapped = error if isinstance(error, BackendError) else BackendError(repr(error))
            self._failover.failed(wrapped)

    def statistics(self) -> dict[str, Any]:
        """Counters: messages published and applied, elections won and lost, health.

        Example: ``breaker.shared.statistics()["won"]``
        """
        return {
            **self._failover.statistics(),
            "connected": self.connected,
            "published": self.published,
            "applied": self.applied,
            "won": self.won,
            "lost": self.lost,
            "dropped": self._hub.dropped,
        }

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return f"<SharedState {self.name!r} {state} quorum={self.quorum}>"
