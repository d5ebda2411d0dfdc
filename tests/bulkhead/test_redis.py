"""The distributed Bulkhead on a real Redis: leases, renewals, notifications, failures.

Two ``Bulkhead`` objects with the same name and separate backends stand for two
processes (the multi-process test is in test_redis_chaos.py). Waits that depend on
Redis time (lease expiry, renewals) use short leases and generous upper bounds.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
def backends(redis_server: RedisServer) -> Iterator[Callable[..., RedisBackend]]:
    """Build backends on the test's server; closed at the end."""
    made: list[RedisBackend] = []

    def make(**kwargs: object) -> RedisBackend:
        options = {"timeout": 0.5, **kwargs}
        backend = RedisBackend.from_url(redis_server.url, **options)  # type: ignore[arg-type]
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Spin until another thread or process reached a state."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached within 5 s")
        time.sleep(0.005)


def test_limit_holds_across_instances_sharing_a_name(backends: Callable[..., RedisBackend]) -> None:
    """Two bulkheads with one name (two processes) share max_concurrent per key."""
    one = rs.Bulkhead(2, backend=backends(), name="dl")
    two = rs.Bulkhead(2, backend=backends(), name="dl")
    other = rs.Bulkhead(2, backend=backends(), name="other")
    a = one.acquire_nowait("example.com")
    b = two.acquire_nowait("example.com")
    with pytest.raises(rs.BulkheadFull):
        one.acquire_nowait("example.com")
    with pytest.raises(rs.BulkheadFull):
        two.acquire_nowait("example.com")
    other.acquire_nowait("example.com").release()  # another name is another bulkhead
    one.acquire_nowait("example.org").release()  # another key has its own slots
    assert one.statistics("example.com").shared_in_flight == 2
    assert one.statistics("example.com").in_flight == 1
    a.release()
    two.acquire_nowait("example.com").release()
    b.release()
    assert one.statistics("example.com").shared_in_flight == 0


def test_one_evalsha_per_acquire_and_per_release(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """An uncontended acquire + release costs exactly two EVALSHA round trips."""
    bulkhead = rs.Bulkhead(3, backend=backends(), name="rt")
    bulkhead.acquire_nowait("k").release()  # scripts loaded
    redis_server.reset_stats()
    for _ in range(10):
        permit = bulkhead.acquire_nowait("k")
        permit.release()
    stats = redis_server.commandstats()
    assert stats.get("evalsha") == 20  # (commands run inside scripts are counted apart)
    assert "eval" not in stats
    assert "publish" not in stats


def test_acquire_is_idempotent_by_token(backends: Callable[..., RedisBackend]) -> None:
    """Retrying an acquire with the same token (a lost reply) takes no second slot."""
    bulkhead = rs.Bulkhead(2, backend=backends(), name="idem")
    remote = bulkhead._remote
    assert remote is not None
    keys = remote.keys_for("k")
    first = remote.acquire_script.run(keys, remote.acquire_args("token-1"))
    again = remote.acquire_script.run(keys, remote.acquire_args("token-1"))
    assert [int(first[0]), int(first[1])] == [1, 1]
    assert [int(again[0]), int(again[1])] == [1, 1]
    assert bulkhead.statistics("k").shared_in_flight == 1
    assert int(remote.release_script.run(keys, remote.release_args("token-1"))) == 1


def test_expired_lease_of_a_crashed_holder_is_reaped(
    backends: Callable[..., RedisBackend],
) -> None:
    """A lease nobody renews expires; a waiter wakes at its expiry, not by polling."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="reap", lease=0.3)
    remote = bulkhead._remote
    assert remote is not None
    # A "crashed" holder: acquired, never renewed, never released.
    assert int(remote.acquire_script.run(remote.keys_for("k"), remote.acquire_args("dead"))[0])
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait("k")
    started = time.monotonic()
    permit = bulkhead.acquire("k", max_wait=5.0)
    waited = time.monotonic() - started
    permit.release()
    assert waited < 2.0


def test_release_notification_wakes_a_waiter_of_another_process(
    backends: Callable[..., RedisBackend],
) -> None:
    """A waiter sleeps until the holder (elsewhere) releases, long before lease expiry."""
    holder_side = rs.Bulkhead(1, backend=backends(), name="notify", lease=30.0)
    waiter_side = rs.Bulkhead(1, backend=backends(), name="notify", lease=30.0)
    held = holder_side.acquire("k")
    got: list[float] = []

    def wait() -> None:
        with waiter_side.acquire("k", max_wait=20.0):
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiter_side.statistics("k").waiting == 1)
    wait_until(
        lambda: waiter_side._remote is not None and waiter_side._remote.notifier.subscriptions > 0
    )
    released = time.monotonic()
    held.release()
    thread.join(10)
    assert got
    assert got[0] - released < 5.0


def test_local_waiters_for_redis_are_served_by_priority(
    backends: Callable[..., RedisBackend],
) -> None:
    """Waiters of one process go to Redis one at a time, by priority then arrival."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="prio", max_wait=20.0)
    held = bulkhead.acquire("k")
    order: list[str] = []
    threads = []
    for name, priority in [("batch", 10), ("click", 0), ("batch2", 10)]:

        def run(name: str = name, priority: int = priority) -> None:
            with bulkhead.acquire("k", priority=priority):
                order.append(name)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        count = len(threads)
        wait_until(lambda count=count: bulkhead.statistics("k").waiting == count)
    held.release()
    for thread in threads:
        thread.join(10)
    assert order == ["click", "batch", "batch2"]
    stats = bulkhead.statistics("k")
    assert (stats.in_flight, stats.waiting, stats.shared_in_flight) == (0, 0, 0)


@pytest.mark.anyio
async def test_priority_holds_when_the_slot_frees_by_lease_expiry(
    backends: Callable[..., RedisBackend],
) -> None:
    """A crashed holder's lease runs out (no release to notify): a batch waiter that
    was first in line slept until that expiry; an interactive one queued after it is
    first now. The batch waiter's timer must not win it the slot (it asked Redis as
    it woke, and took the slot in about half the trials)."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="expiry", lease=0.3, max_wait=5.0)
    remote = bulkhead._remote
    assert remote is not None
    for trial in range(4):
        keys = remote.keys_for("k")
        assert int(remote.acquire_script.run(keys, remote.acquire_args(f"crashed{trial}"))[0])
        order: list[str] = []

        async def wait(name: str, priority: int) -> None:
            permit = await bulkhead.acquire_async("k", priority=priority)
            order.append(name)
            await anyio.sleep(0.01)
            await permit.release_async()

        async with anyio.create_task_group() as group:
            group.start_soon(wait, "batch", 10)
            with anyio.fail_after(5):
                while bulkhead.statistics("k").waiting < 1:
                    await anyio.sleep(0.005)
            group.start_soon(wait, "interactive", 0)
        assert order == ["interactive", "batch"], f"trial {trial}"


def test_a_name_with_a_colon_shares_no_slots_with_another_name_and_key(
    backends: Callable[..., RedisBackend],
) -> None:
    """ "dl" with key "x:y" and "dl:x" with key "y" are two bulkheads' keys (they were one
    Redis key, "dl:x:y", and shared its slots)."""
    first = rs.Bulkhead(1, backend=backends(), name="dl")
    second = rs.Bulkhead(1, backend=backends(), name="dl:x")
    with first.acquire_nowait("x:y"), second.acquire_nowait("y"):
        assert first.statistics("x:y").shared_in_flight == 1
        assert second.statistics("y").shared_in_flight == 1


@pytest.mark.anyio
async def test_an_unhashable_key_takes_no_lease(backends: Callable[..., RedisBackend]) -> None:
    """A key function returning a list fails with TypeError before any lease is taken
    (the lease was taken on Redis first, then the local ledger raised, and the slot
    stayed taken for the whole lease, for every process, under the list's text)."""
    bulkhead = rs.Bulkhead(1, key=lambda parts: parts, backend=backends(), name="dl", lease=30)

    @bulkhead
    def download(parts: list[str]) -> str:
        return "ok"

    @bulkhead
    async def download_async(parts: list[str]) -> str:
        return "ok"

    with pytest.raises(TypeError, match="unhashable"):
        download(["example.com"])
    with pytest.raises(TypeError, match="unhashable"):
        await download_async(["example.com"])
    assert bulkhead.statistics("['example.com']").shared_in_flight == 0
    with bulkhead.acquire_nowait("['example.com']"):
        pass


def test_renewal_keeps_a_long_call_s_lease(backends: Callable[..., RedisBackend]) -> None:
    """A holder running longer than its lease keeps the slot (renewed every lease/3;
    a lease of 0.6 s: a loaded 2-core machine once kept the renewal thread off the CPU
    for 0.3 s)."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="renew", lease=0.6)
    other = rs.Bulkhead(1, backend=backends(), name="renew", lease=0.6)
    permit = bulkhead.acquire("k")
    time.sleep(1.8)  # three leases long: only renewals keep it
    with pytest.raises(rs.BulkheadFull):
        other.acquire_nowait("k")
    assert not permit.lost
    permit.release()
    other.acquire_nowait("k").release()


def test_lost_lease_is_reported_by_event_hook_and_exception(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """If Redis drops the lease, the holder learns it: event, on_lost hook, LeaseLost."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="lost", lease=0.3)
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    permit = bulkhead.acquire("k")
    hooked = threading.Event()
    permit.on_lost(hooked.set)
    redis_server.command("DEL", permit.keys[0])  # e.g. a failover lost it
    assert hooked.wait(5.0)
    assert permit.lost
    lost = [e for e in events if not isinstance(e, rs.CallAdmitted)]
    assert [type(e) for e in lost] == [rs.BulkheadLeaseLost]
    assert lost[0].reason == "expired"  # type: ignore[attr-defined]
    with pytest.raises(rs.LeaseLost) as info:
        permit.release()
    assert info.value.key == "k"
    permit.release()  # once only
    assert bulkhead.statistics().backend["leases_lost"] == 1  # type: ignore[index]


def test_lost_lease_at_release_without_renewal(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A lease gone by release time is reported there; on_lease_lost="event" only emits."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="quiet", on_lease_lost="event")
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    with bulkhead.acquire("k") as permit:
        redis_server.command("DEL", permit.keys[0])
    assert permit.lost
    assert [type(e) for e in events if not isinstance(e, rs.CallAdmitted)] == [rs.BulkheadLeaseLost]


def test_with_body_error_wins_over_lease_lost(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """When the body raised, leaving the block re-raises that error, not LeaseLost."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="body")
    permit = bulkhead.acquire("k")

    def body() -> None:
        with permit:
            redis_server.command("DEL", permit.keys[0])  # type: ignore[attr-defined]
            raise KeyError("body")

    with pytest.raises(KeyError):
        body()
    assert permit.lost


def test_noscript_after_flush_is_transparent(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """SCRIPT FLUSH (a restart, a failover) does not break acquire or release."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="flush")
    permit = bulkhead.acquire_nowait("k")
    redis_server.flush_scripts()
    permit.release()
    redis_server.flush_scripts()
    bulkhead.acquire_nowait("k").release()


def test_with_bulkhead_and_decorator_on_redis(backends: Callable[..., RedisBackend]) -> None:
    """``with bulkhead`` (nested) and the keyed decorator hold Redis leases."""
    bulkhead = rs.Bulkhead(2, backend=backends(), name="ctx", key=lambda host: host)

    @bulkhead
    def fetch(host: str) -> int | None:
        return bulkhead.statistics(host).shared_in_flight

    assert fetch("a") == 1
    with bulkhead, bulkhead:
        assert bulkhead.statistics().in_flight == 2
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait()
    assert bulkhead.statistics().in_flight == 0
    with pytest.raises(RuntimeError, match="without a matching"):
        bulkhead.__exit__(None, None, None)


def test_dropped_permit_is_released_by_the_keeper(
    backends: Callable[..., RedisBackend],
) -> None:
    """A permit garbage-collected without release() gives its lease back."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="gc", lease=0.3)
    permit = bulkhead.acquire("k")
    del permit
    gc.collect()
    permit = bulkhead.acquire("k", max_wait=5.0)  # freed at the next renewal tick
    permit.release()
    assert bulkhead.statistics("k").in_flight == 0


@pytest.mark.anyio
async def test_async_acquire_wait_and_release(backends: Callable[..., RedisBackend]) -> None:
    """Tasks (asyncio and trio) acquire, wait for and release leases."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="async", max_wait=10.0)
    order: list[str] = []

    async def worker(name: str) -> None:
        async with bulkhead:
            order.append(name)
            await anyio.sleep(0.01)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for name in ("a", "b", "c"):
                tg.start_soon(worker, name)
    assert sorted(order) == ["a", "b", "c"]
    permit = await bulkhead.acquire_async("k")
    await permit.release_async()
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.waiting, stats.shared_in_flight) == (0, 0, 0)


@pytest.mark.anyio
async def test_cancelled_redis_waiter_leaves_nothing(
    backends: Callable[..., RedisBackend],
) -> None:
    """Cancelling a task that waits for a lease removes it; no lease is left in Redis."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="cancel", max_wait=math.inf)
    held = await bulkhead.acquire_async("k")
    async with anyio.create_task_group() as tg:
        tg.start_soon(bulkhead.acquire_async, "k")
        with anyio.fail_after(5):
            while bulkhead.statistics("k").waiting == 0:
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    assert bulkhead.statistics("k").waiting == 0
    await held.release_async()
    with anyio.fail_after(5):
        while bulkhead.statistics("k").shared_in_flight:
            await anyio.sleep(0.01)  # a cancelled round trip is released by the keeper


@pytest.mark.anyio
async def test_an_acquire_cancelled_on_the_wire_leaves_no_lease_behind(
    backends: Callable[..., RedisBackend], redis_server: RedisServer
) -> None:
    """Cancelled while its acquire waits on a stalled Redis: the script still runs when
    Redis resumes, maybe after the background release (on trio the round trip is an
    abandoned worker thread, racing the release on another connection). The second
    release, once the straggler must be over (2 x timeout + 0.1 s), frees that lease,
    which used to hold the slot until it expired (30 s)."""
    timeout = 0.2
    for attempt in range(2):
        bulkhead = rs.Bulkhead(
            1, backend=backends(timeout=timeout), name=f"wire{attempt}", lease=30
        )
        redis_server.pause()
        try:
            with anyio.move_on_after(0.05):
                await bulkhead.acquire_async()
        finally:
            redis_server.resume()
        # Lease time is Redis' real time: wait past the second release, then look.
        await anyio.sleep(2 * timeout + 0.1 + 0.3)
        with anyio.fail_after(5):
            while bulkhead.statistics().shared_in_flight:
                await anyio.sleep(0.01)
        permit = await bulkhead.acquire_async()  # the one slot is free
        await permit.release_async()


def test_a_straggling_acquire_after_the_background_release_is_released_again(
    backends: Callable[..., RedisBackend],
) -> None:
    """The race above, in a fixed order: the background release of a cut-short round
    trip runs first, then the straggling acquire script grants the lease; the second
    release (2 x timeout + 0.1 s later) removes it."""
    timeout = 0.2
    bulkhead = rs.Bulkhead(1, backend=backends(timeout=timeout), name="straggler", lease=30)
    dist = bulkhead._remote
    assert dist is not None
    keys, token = dist.keys_for(None), "straggler-token"
    dist.release_later(keys, token)  # what a cut-short round trip leaves to the keeper
    time.sleep(0.05)  # the first release has run (no lease yet: a no-op)
    dist.acquire_script.run(keys, dist.acquire_args(token))  # the straggler lands
    assert bulkhead.statistics().shared_in_flight == 1
    wait_until(lambda: bulkhead.statistics().shared_in_flight == 0, timeout=2 * timeout + 2.0)
    with bulkhead.acquire_nowait():
        pass


# ---------------------------------------------------------------------- failure modes


def test_local_mode_uses_an_in_process_twin_while_redis_is_down(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """on_backend_error="local": local_limit slots per key, events, then back to Redis."""
    bulkhead = rs.Bulkhead(4, backend=backends(timeout=0.05), name="local", local_limit=1)
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    redis_server.kill()
    started = time.monotonic()
    permit = bulkhead.acquire_nowait("k")  # the twin
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait("k")  # local_limit=1
    # the twin's refusals are the bulkhead's (they used to be left out)
    assert bulkhead.statistics().rejected == bulkhead.statistics("k").rejected == 1
    permit.release()
    assert time.monotonic() - started < 1.0
    assert any(isinstance(e, rs.BackendFallback) and e.mode == "local" for e in events)
    redis_server.start()
    deadline = time.monotonic() + 5
    while bulkhead.statistics().backend["backend_healthy"] is not True:  # type: ignore[index]
        assert time.monotonic() < deadline, "did not return to Redis"
        bulkhead.acquire_nowait("k").release()
        time.sleep(0.05)
    assert any(isinstance(e, rs.BackendRecovered) for e in events)
    permit = bulkhead.acquire_nowait("k")
    assert bulkhead.statistics("k").shared_in_flight == 1  # on Redis again
    permit.release()


def test_admissions_by_the_local_twin_are_reported_once(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """While Redis is down the local twin admits: each admission is one CallAdmitted
    (the twin shares the bulkhead's listeners and used to report it a second time,
    doubling the decisions counter and the wait histogram for the whole outage)."""
    bulkhead = rs.Bulkhead(5, backend=backends(timeout=0.05), name="twice")
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    redis_server.kill()

    async def take_async() -> None:
        async with await bulkhead.acquire_async("k"):
            pass

    with bulkhead.acquire("k"):
        pass
    bulkhead.call(lambda: None)
    anyio.run(take_async)
    assert sum(isinstance(e, rs.CallAdmitted) for e in events) == 3


def test_open_and_closed_modes(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """ "open" admits without a slot; "closed" raises BackendError."""
    open_ = rs.Bulkhead(1, backend=backends(timeout=0.05), name="o", on_backend_error="open")
    closed = rs.Bulkhead(1, backend=backends(timeout=0.05), name="c", on_backend_error="closed")
    redis_server.kill()
    permits = [open_.acquire_nowait("k") for _ in range(3)]  # no limit while Redis is down
    # Slotless, but in flight in this process (they used to be left out of in_flight).
    assert open_.statistics("k").in_flight == 3
    for permit in permits:
        permit.release()
        permit.release()  # idempotent: counted off once
    assert open_.statistics("k").in_flight == 0
    with pytest.raises(rs.BackendError):
        closed.acquire_nowait("k")
    with pytest.raises(rs.BackendError):
        closed.acquire_nowait("k")  # degraded at once, without waiting on Redis again


def test_paused_redis_costs_at_most_the_backend_timeout(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A paused (SIGSTOPped) Redis adds at most the timeout, once per probe interval."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="pause")
    bulkhead.acquire_nowait("k").release()
    redis_server.pause()
    try:
        started = time.monotonic()
        for _ in range(20):
            bulkhead.acquire_nowait("k").release()
        assert time.monotonic() - started < 2.0
    finally:
        redis_server.resume()
    deadline = time.monotonic() + 5
    while bulkhead.statistics().backend["backend_healthy"] is not True:  # type: ignore[index]
        assert time.monotonic() < deadline, "did not return to Redis"
        bulkhead.acquire_nowait("k").release()
        time.sleep(0.05)


# ---------------------------------------------------------------------- across an outage


def _back_on_redis(bulkhead: rs.Bulkhead, key: str) -> None:
    """Probe until the bulkhead decides on Redis again (each probe is a real acquire)."""
    deadline = time.monotonic() + 5
    while bulkhead.statistics().backend["backend_healthy"] is not True:  # type: ignore[index]
        assert time.monotonic() < deadline, "did not return to Redis"
        try:
            bulkhead.acquire_nowait(key).release()
        except rs.BulkheadFull:
            pass  # decided locally: the twin is full
        time.sleep(0.02)


def _queue_in_the_twin(
    redis_server: RedisServer, bulkhead: rs.Bulkhead, waiters: list[threading.Thread]
) -> None:
    """Pause Redis; the first failure switches ``bulkhead`` (which holds its
    ``local_limit``) to its twin; start ``waiters``, each queued in the twin before the
    next starts; then Redis answers again and the bulkhead decides on it once more."""
    redis_server.pause()
    try:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")
        _start_one_by_one(bulkhead, waiters)
    finally:
        redis_server.resume()
    _back_on_redis(bulkhead, "k")


def _start_one_by_one(bulkhead: rs.Bulkhead, waiters: list[threading.Thread]) -> None:
    """Start ``waiters``, each waiting in ``bulkhead`` before the next starts."""
    for count, waiter in enumerate(waiters, 1):
        waiter.start()
        wait_until(lambda count=count: bulkhead.statistics("k").waiting == count)


def test_leases_held_when_redis_fails_count_against_local_limit(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """The twin is the process's ledger: leases held when Redis fails use up local_limit,
    so the outage adds no slots on top of them (and a freed lease's slot goes local)."""
    bulkhead = rs.Bulkhead(4, backend=backends(timeout=0.05), name="ledger", local_limit=2)
    leases = [bulkhead.acquire_nowait("k") for _ in range(2)]
    redis_server.pause()
    try:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")  # 2 leases = local_limit: nothing more
        leases[0].release()  # cannot reach Redis: remembered for the recovery
        local = bulkhead.acquire_nowait("k")
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")
        assert bulkhead.statistics("k").in_flight == 2
        assert not local.lost
    finally:
        redis_server.resume()
    local.release()
    leases[1].release()
    assert bulkhead.statistics("k").in_flight == 0


def test_an_acquire_in_flight_when_redis_fails_counts_against_local_limit(
    redis_server: RedisServer, fault_proxy: Any
) -> None:
    """A lease asked for just before Redis fails, whose grant arrives after, counts in
    the twin from the moment it was asked for: the process's local slots leave room for
    it, and the process never holds more than ``max_concurrent``. (The twin counted it
    once granted: a local slot taken meanwhile made 3 of 2.)"""
    proxy = fault_proxy(redis_server.port)
    backend = RedisBackend.from_url(proxy.url("redis", "/0"), timeout=5.0)
    bulkhead = rs.Bulkhead(2, backend=backend, name="in-flight")
    direct = RedisBackend.from_url(redis_server.url)
    fleet = rs.Bulkhead(2, backend=direct, name="in-flight")  # reads Redis, not the proxy
    held = [bulkhead.acquire_nowait("k")]  # a lease: the twin counts 1 of 2
    got: list[rs.Permit] = []
    proxy.set(latency=1.0)  # replies come a second late
    asking = threading.Thread(target=lambda: got.append(bulkhead.acquire_nowait("k")))
    asking.start()
    try:
        wait_until(lambda: fleet.statistics("k").shared_in_flight == 2)  # granted in Redis
        proxy.set(reset_new=True)  # another call needs a new connection: reset at once
        other = bulkhead.acquire_nowait("x")  # Redis failed: the twin decides
        assert bulkhead._remote is not None
        assert not bulkhead._remote.failover.healthy
        assert not got  # the grant is still on its way
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")  # 1 lease + 1 asked for = local_limit
        other.release()
    finally:
        proxy.heal()
    asking.join(10)
    held += got
    assert len(held) == 2
    assert bulkhead.statistics("k").in_flight == 2
    for permit in held:
        permit.release()
    wait_until(lambda: fleet.statistics("k").shared_in_flight == 0)
    assert bulkhead.statistics("k").in_flight == 0
    backend.close()
    direct.close()


def test_a_released_lease_does_not_hand_a_slot_over_the_local_limit(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """Leases past local_limit (taken while Redis was healthy) keep a local waiter waiting
    until the process is back under the limit, not merely until one lease is released."""
    bulkhead = rs.Bulkhead(4, backend=backends(timeout=0.05), name="over", local_limit=1)
    leases = [bulkhead.acquire_nowait("k") for _ in range(2)]
    redis_server.pause()
    got: list[rs.Permit] = []
    try:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")  # the first failure switches to the twin
        waiter = threading.Thread(target=lambda: got.append(bulkhead.acquire("k", max_wait=10)))
        waiter.start()
        wait_until(lambda: bulkhead.statistics("k").waiting == 1)
        leases[0].release()
        assert bulkhead.statistics("k").waiting == 1  # 1 held = local_limit: still waits
        assert got == []
        leases[1].release()
        waiter.join(5)
        assert len(got) == 1
        assert bulkhead.statistics("k").in_flight == 1
    finally:
        redis_server.resume()
    got[0].release()


def test_a_waiter_moved_to_the_local_twin_leaves_the_redis_queue(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A caller queued for Redis when Redis fails waits in the local twin instead, and
    only there: it used to stay in the Redis queue too, counted twice in ``waiting``,
    and once Redis was back every newcomer queued behind it (and was refused at its
    ``max_wait``) while Redis had a free slot. Once Redis answers it asks Redis again."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="moved", local_limit=1)
    leases = [bulkhead.acquire_nowait("k") for _ in range(2)]
    got: list[rs.Permit] = []
    waiter = threading.Thread(target=lambda: got.append(bulkhead.acquire("k", max_wait=10)))
    waiter.start()
    wait_until(lambda: bulkhead.statistics("k").waiting == 1)  # in the Redis queue
    assert bulkhead._remote is not None
    assert bulkhead._remote.twin is not None
    twin = bulkhead._remote.twin
    redis_server.pause()
    try:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("k")  # the first failure switches to the twin
        wait_until(lambda: twin.statistics("k").waiting == 1)  # the waiter moved
        assert bulkhead.statistics("k").waiting == 1
    finally:
        redis_server.resume()
    _back_on_redis(bulkhead, "k")
    # Redis answers: the waiter leaves the twin for Redis, where it queues (2 of 2).
    wait_until(lambda: twin.statistics("k").waiting == 0 and bulkhead.statistics("k").waiting == 1)
    assert got == []
    leases[0].release()  # the waiter, first in line, takes the freed lease
    waiter.join(5)
    assert len(got) == 1
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait("k")  # the waiter's lease and leases[1]: the limit
    for permit in (got[0], leases[1]):
        permit.release()
    assert bulkhead.statistics("k").waiting == 0
    assert bulkhead.statistics("k").shared_in_flight == 0


def test_a_local_waiter_served_after_recovery_takes_its_lease_within_the_limit(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A caller that waited in the twin through the outage and gets its local slot after
    Redis answers again asks Redis for a lease, within the limit. Its local slot used to
    be entered in Redis past the limit, beside the lease another process's newcomer took
    from the same release: 3 leases of 2."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="after", local_limit=1)
    other = rs.Bulkhead(2, backend=backends(), name="after")  # another process
    mine = bulkhead.acquire_nowait("k")
    theirs = other.acquire_nowait("k")
    got: list[rs.Permit] = []
    waiter = threading.Thread(target=lambda: got.append(bulkhead.acquire("k", max_wait=10)))
    _queue_in_the_twin(redis_server, bulkhead, [waiter])
    assert bulkhead._remote is not None
    assert bulkhead._remote.twin is not None
    twin = bulkhead._remote.twin
    mine.release()  # frees a local slot (the waiter's) and a lease in Redis...
    try:
        newcomer: rs.Permit | None = other.acquire_nowait("k")  # ...for whoever asks first
    except rs.BulkheadFull:
        newcomer = None  # the waiter asked Redis first
    # The waiter holds a lease, or waits for Redis (not in the twin any more).
    wait_until(
        lambda: (
            bool(got)
            or (twin.statistics("k").waiting == 0 and bulkhead.statistics("k").waiting == 1)
        )
    )
    if newcomer is not None:
        assert got == []  # before the fix: a local slot, entered in Redis past the limit
        assert other.statistics("k").shared_in_flight == 2
        newcomer.release()
    waiter.join(5)
    assert len(got) == 1
    assert other.statistics("k").shared_in_flight == 2  # the waiter's lease and theirs
    for permit in (got[0], theirs):
        permit.release()
    assert other.statistics("k").shared_in_flight == 0


def test_local_waiters_go_back_to_redis_by_priority_once_it_answers(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """Callers that queued in the twin during an outage ask Redis once it answers again,
    one at a time by priority: the more urgent one (queued later) gets the first slot
    that frees. They used to wait for a local slot, which the leases granted since could
    keep from them past their ``max_wait`` although Redis had room; and, briefly, all
    went to Redis at once, the less urgent one winning the race."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="order", local_limit=1)
    other = rs.Bulkhead(2, backend=backends(), name="order")  # another process
    mine = bulkhead.acquire_nowait("k")
    theirs = other.acquire_nowait("k")
    got: list[tuple[str, rs.Permit]] = []

    def wait(tag: str, priority: int) -> None:
        got.append((tag, bulkhead.acquire("k", priority=priority, max_wait=10)))

    waiters = [
        threading.Thread(target=wait, args=("batch", 5)),
        threading.Thread(target=wait, args=("interactive", 0)),
    ]
    _queue_in_the_twin(redis_server, bulkhead, waiters)
    mine.release()  # one lease frees in Redis
    wait_until(lambda: len(got) == 1)
    assert got[0][0] == "interactive"
    theirs.release()
    for waiter in waiters:
        waiter.join(5)
    assert [tag for tag, _ in got] == ["interactive", "batch"]
    for _, permit in got:
        permit.release()
    assert other.statistics("k").shared_in_flight == 0
    assert bulkhead.statistics("k").waiting == 0


def test_when_redis_fails_again_the_twin_s_free_slot_goes_to_its_oldest_waiter(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A local slot given back while Redis answers stays free for the twin's waiters,
    who ask Redis one at a time; if Redis fails again before their turn, the first
    of them gets it, and a newcomer does not barge past them. (The slot went to a
    waiter that then asked Redis and gave it up: a newer, less urgent caller took it
    at once while an older one kept waiting.)"""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="barge", local_limit=1)
    other = rs.Bulkhead(2, backend=backends(), name="barge")  # another process
    theirs = [other.acquire_nowait("k") for _ in range(2)]  # the fleet is full
    assert bulkhead._remote is not None
    remote = bulkhead._remote
    assert remote.twin is not None
    twin = remote.twin
    got: list[str] = []
    permits: list[rs.Permit] = []

    def wait(tag: str) -> None:
        with contextlib.suppress(rs.BulkheadFull):
            permits.append(bulkhead.acquire("k", max_wait=8))
            got.append(tag)

    waiters = [threading.Thread(target=wait, args=(tag,)) for tag in ("w1", "w2", "w3")]
    redis_server.pause()
    try:
        mine = bulkhead.acquire_nowait("k")  # Redis does not answer: the twin's slot
        _start_one_by_one(bulkhead, waiters)
    finally:
        redis_server.resume()
    _back_on_redis(bulkhead, "k")
    wait_until(lambda: remote.waiting("k") == 1)  # w1 asks Redis (full), w2, w3 queue here
    mine.release()  # the twin's slot frees
    redis_server.pause()
    try:
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire("k", priority=10, max_wait=0)  # Redis fails: the twin decides
        wait_until(lambda: got == ["w2"])  # the first waiter of the twin has the slot
        wait_until(lambda: twin.statistics("k").waiting == 2)  # w1 (back from Redis), w3
    finally:
        redis_server.resume()
    permits[0].release()
    for permit in theirs:
        permit.release()
    for waiter in waiters:
        waiter.join(10)
    for permit in permits[1:]:
        permit.release()
    assert sorted(got) == ["w1", "w2", "w3"]
    wait_until(lambda: other.statistics("k").shared_in_flight == 0)


def test_a_twin_waiter_cancelled_as_it_is_let_go_passes_its_turn_on(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """When Redis answers again the first twin waiter is let go to ask Redis; cancelled
    at that moment (its client went away), it passes its turn to the next, which asks
    Redis at once. The next one used to wait in the twin for its whole ``max_wait``
    while Redis had room, and was then refused."""
    import asyncio

    async def main() -> dict[str, str]:
        bulkhead = rs.Bulkhead(3, backend=backends(timeout=0.05), name="turn", local_limit=1)
        remote = bulkhead._remote
        assert remote is not None
        redis_server.command("CLIENT", "PAUSE", "1500", "ALL")
        held = await bulkhead.acquire_async(max_wait=0.0)  # a twin slot: Redis is paused
        out: dict[str, str] = {}

        async def wait(tag: str, priority: int, max_wait: float) -> None:
            begun = time.monotonic()
            try:
                permit = await bulkhead.acquire_async(priority=priority, max_wait=max_wait)
            except asyncio.CancelledError:
                out[tag] = "cancelled"
                return
            except rs.BulkheadFull:
                out[tag] = "refused"
                return
            out[tag] = f"admitted after {time.monotonic() - begun:.1f} s"
            await permit.release_async()

        first = asyncio.create_task(wait("first", 0, 8.0))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(wait("second", 5, 4.0))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        let_go = remote.failover.on_recovery
        assert let_go is not None

        def let_go_then_cancel() -> None:
            let_go()  # the first waiter is let go to Redis...
            loop.call_soon_threadsafe(first.cancel)  # ...and its client goes away

        remote.failover.on_recovery = let_go_then_cancel
        await asyncio.gather(first, second)
        await held.release_async()
        return out

    out = asyncio.run(asyncio.wait_for(main(), 20))
    assert out["first"] == "cancelled"
    assert out["second"].startswith("admitted after")
    assert float(out["second"].split()[2]) < 3.5  # not at the end of its 4 s max_wait


def test_a_caller_refused_after_an_outage_is_counted_once(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """Callers that waited through an outage in the twin and are refused (the fleet's
    only slot stays taken) count one rejection each, with one ``CallRejected``."""
    other = rs.Bulkhead(1, backend=backends(), name="once")  # another process
    bulkhead = rs.Bulkhead(1, backend=backends(timeout=0.05), name="once")
    refusals: list[rs.Event] = []
    bulkhead.add_listener(lambda e: refusals.append(e) if isinstance(e, rs.CallRejected) else None)
    theirs = other.acquire_nowait()  # the fleet's only slot
    redis_server.command("CLIENT", "PAUSE", "1500", "ALL")
    held = bulkhead.acquire(max_wait=0.0)  # Redis does not answer: the twin's slot
    outcomes: list[str] = []

    def wait(priority: int, max_wait: float) -> None:
        try:
            bulkhead.acquire(priority=priority, max_wait=max_wait).release()
        except rs.BulkheadFull:
            outcomes.append("refused")

    waiters = [
        threading.Thread(target=wait, args=(0, 4.0)),
        threading.Thread(target=wait, args=(10, 3.0)),  # times out after the recovery
    ]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(10)
    assert outcomes == ["refused", "refused"]
    assert bulkhead.statistics().rejected == 2
    assert len(refusals) == 2
    held.release()
    theirs.release()


def _one_waiter_in_the_twin(
    redis_server: RedisServer, bulkhead: rs.Bulkhead, max_wait: float
) -> tuple[Any, rs.Bulkhead, rs.Permit, threading.Thread, list[rs.Permit]]:
    """Pause Redis for 0.8 s; ``bulkhead`` (``local_limit=1``) takes the twin's only
    slot (``held``, kept by the test) and one caller waits in the twin for up to
    ``max_wait``. Returns ``(remote, twin, held, waiter thread, its permits)``."""
    remote = bulkhead._remote
    assert remote is not None
    assert remote.twin is not None
    twin = remote.twin
    redis_server.command("CLIENT", "PAUSE", "800", "ALL")
    held = bulkhead.acquire(max_wait=0.0)  # Redis does not answer: the twin's slot
    got: list[rs.Permit] = []
    waiter = threading.Thread(target=lambda: got.append(bulkhead.acquire(max_wait=max_wait)))
    waiter.start()
    wait_until(lambda: twin.statistics().waiting == 1)
    return remote, twin, held, waiter, got


def test_a_waiter_let_go_to_redis_that_fails_again_waits_within_the_limit(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A twin waiter let go when Redis answered asks Redis without its twin slot: when
    Redis fails again it waits in the twin within ``local_limit``, and gets the local
    slot the process's last holder gives back. (It used to hold the slot it was let go
    with and wait for a second one, behind itself, until its ``max_wait``.)"""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="again", local_limit=1)
    remote, twin, held, waiter, got = _one_waiter_in_the_twin(redis_server, bulkhead, 5.0)
    let_go = remote.failover.on_recovery
    assert let_go is not None

    def fail_again_then_let_go() -> None:
        redis_server.command("CLIENT", "PAUSE", "1500", "ALL")
        let_go()

    remote.failover.on_recovery = fail_again_then_let_go
    wait_until(lambda: remote.failover.recoveries == 1 or _probe(bulkhead))
    wait_until(lambda: twin.statistics().waiting == 1)  # asked, failed, back in the twin
    assert got == []
    held.release()  # the process holds nothing else: the waiter's local slot
    waiter.join(3)
    assert len(got) == 1
    got[0].release()


def test_a_waiter_back_in_the_twin_is_let_go_again_at_the_next_recovery(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A twin waiter let go to Redis that finds it failing again waits in the twin, and
    is let go again when Redis answers once more: it gets the lease Redis has free
    (its first turn used to stay counted, so nobody let it go before its ``max_wait``)."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="twice", local_limit=1)
    remote, _, held, waiter, got = _one_waiter_in_the_twin(redis_server, bulkhead, 6.0)
    let_go = remote.failover.on_recovery
    assert let_go is not None

    def fail_again_then_let_go() -> None:
        remote.failover.on_recovery = let_go
        redis_server.command("CLIENT", "PAUSE", "700", "ALL")
        let_go()

    remote.failover.on_recovery = fail_again_then_let_go
    wait_until(lambda: remote.failover.recoveries == 1 or _probe(bulkhead))
    begun = time.monotonic()
    waiter.join(6)  # the second recovery (the keeper enters `held` in Redis) lets it go
    assert len(got) == 1
    assert time.monotonic() - begun < 4.0  # well before its 6 s max_wait
    for permit in (got[0], held):
        permit.release()
    assert bulkhead.statistics().waiting == 0


def test_a_caller_falling_back_as_redis_recovers_asks_redis(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A caller that decided to fall back to the twin a moment before Redis answered
    again (after the recovery let the queued twin waiters go) asks Redis too. It used
    to queue in a full twin and wait out its ``max_wait`` while Redis had room."""
    from resilience.backends._failover import Failover

    bulkhead = rs.Bulkhead(
        4, backend=backends(timeout=0.05), name="late", local_limit=2, max_wait=3.0
    )
    remote = bulkhead._remote
    assert remote is not None
    failover = remote.failover
    recovered = threading.Event()

    class Slow(Failover):
        """The caller "late" is preempted between the fallback and the twin's queue."""

        __slots__ = ()

        def fallback(self, key: object = None, error: BaseException | None = None) -> None:
            super().fallback(key, error)
            if threading.current_thread().name == "late":
                recovered.wait(5)

    failover.__class__ = Slow
    held = [bulkhead.acquire("k"), bulkhead.acquire("k")]  # local_limit: the twin is full
    redis_server.command("CLIENT", "PAUSE", "400", "ALL")
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire("k", max_wait=0.0)  # fails on Redis: local mode
    got: list[rs.Permit] = []
    late = threading.Thread(target=lambda: got.append(bulkhead.acquire("k")), name="late")
    late.start()
    time.sleep(0.5)  # the pause is over
    probe = None
    deadline = time.monotonic() + 5
    while probe is None:  # another caller finds Redis answering (the late one waits)
        assert time.monotonic() < deadline
        with contextlib.suppress(rs.BulkheadFull):
            probe = bulkhead.acquire_nowait("k")
        time.sleep(0.02)
    assert failover.healthy
    recovered.set()
    late.join(2)  # well before its 3 s max_wait
    assert len(got) == 1
    for permit in (*got, probe, *held):
        permit.release()


def _probe(bulkhead: rs.Bulkhead) -> bool:
    """One call that may find Redis answering again (False: keep probing)."""
    try:
        bulkhead.acquire_nowait().release()
    except rs.BulkheadFull:
        pass
    time.sleep(0.02)
    return False


def test_after_an_outage_redis_counts_local_slots_and_forgets_failed_releases(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """Once Redis answers again, slots taken locally become leases (other processes see
    them) and releases that failed during the outage are sent: the fleet-wide count is
    right again, and a local slot released before the recovery never reaches Redis."""
    bulkhead = rs.Bulkhead(5, backend=backends(timeout=0.05), name="heal")
    other = rs.Bulkhead(5, backend=backends(), name="heal")  # another process
    leases = [bulkhead.acquire_nowait("k") for _ in range(3)]
    redis_server.pause()
    try:
        leases[0].release()  # fails: Redis keeps this lease for now
        local = [bulkhead.acquire_nowait("k") for _ in range(2)]
        brief = bulkhead.acquire_nowait("k")
        brief.release()  # never to be entered in Redis
        assert bulkhead.statistics("k").in_flight == 4
    finally:
        redis_server.resume()
    assert other.statistics("k").shared_in_flight == 3  # what Redis saw: 3 leases
    _back_on_redis(bulkhead, "k")
    # 3 - the failed release + the 2 local slots (3, 2, 3, 4 on the way: 4 is the end)
    wait_until(lambda: other.statistics("k").shared_in_flight == 4)
    taken = other.acquire_nowait("k")
    with pytest.raises(rs.BulkheadFull):
        other.acquire_nowait("k")  # 5 = max_concurrent, counting the local slots
    local[0].release()  # a lease now: released in Redis
    other.acquire_nowait("k").release()
    for permit in [taken, local[1], *leases[1:]]:
        permit.release()
    assert not any(p.lost for p in local)
    assert other.statistics("k").shared_in_flight == 0
    assert bulkhead.statistics("k").in_flight == 0


def test_an_idle_process_enters_its_local_slots_once_redis_returns(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """With no further call from this process, the keeper enters its local slot in Redis
    within about a second of Redis answering again (a restarted, empty Redis here)."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="idle")
    redis_server.kill()
    local = bulkhead.acquire_nowait("k")  # decided by the twin
    redis_server.start()
    other = rs.Bulkhead(2, backend=backends(), name="idle")  # another process
    assert other.statistics("k").shared_in_flight == 0  # Redis came back empty
    wait_until(lambda: other.statistics("k").shared_in_flight == 1)
    taken = other.acquire_nowait("k")
    with pytest.raises(rs.BulkheadFull):
        other.acquire_nowait("k")  # the idle process's slot counts
    local.release()
    taken.release()
    assert other.statistics("k").shared_in_flight == 0


def test_the_next_waiter_takes_a_slot_as_soon_as_it_frees(
    backends: Callable[..., RedisBackend],
) -> None:
    """Two queued threads: when the first is served, the second becomes the head and
    must ask Redis at once (sleeping until the earliest lease expiry, the key marked
    as waited on). It used to keep its long sleep and wake at its deadline, with the
    slot free for seconds."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="head", lease=1.0, max_wait=8.0)
    holder = bulkhead.acquire_nowait("k")
    got: dict[str, float] = {}
    release_first = threading.Event()

    def wait_in_line(name: str, then: threading.Event | None) -> None:
        with bulkhead.acquire("k"):
            got[name] = time.monotonic()
            if then is not None:
                then.wait(5)

    first = threading.Thread(target=wait_in_line, args=("first", release_first))
    second = threading.Thread(target=wait_in_line, args=("second", None))
    first.start()
    wait_until(lambda: bulkhead.statistics("k").waiting == 1)
    second.start()
    wait_until(lambda: bulkhead.statistics("k").waiting == 2)
    holder.release()
    wait_until(lambda: "first" in got)
    time.sleep(1.5)  # past the lease the second's first refusal saw
    released = time.monotonic()
    release_first.set()
    first.join(5)
    second.join(5)
    assert got["second"] - released < 0.5


def test_waiters_take_the_failure_mode_soon_when_redis_hangs(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A waiter queued, then Redis paused: it and a newcomer behind it get the failure
    mode within about a second (they used to wait out their whole max_wait, 8 s)."""
    bulkhead = rs.Bulkhead(
        1, backend=backends(timeout=0.05), name="hang", max_wait=8.0, on_backend_error="open"
    )
    holder = bulkhead.acquire_nowait("k")
    outcomes: list[tuple[str, float]] = []

    def wait(name: str) -> None:
        with bulkhead.acquire("k"):
            outcomes.append((name, time.monotonic()))

    waiter = threading.Thread(target=wait, args=("waiter",))
    waiter.start()
    wait_until(lambda: bulkhead.statistics("k").waiting == 1)
    redis_server.pause()
    try:
        paused = time.monotonic()
        newcomer = threading.Thread(target=wait, args=("newcomer",))
        newcomer.start()
        waiter.join(6)
        newcomer.join(6)
    finally:
        redis_server.resume()
        holder.release()
    assert sorted(name for name, _ in outcomes) == ["newcomer", "waiter"]
    assert max(at for _, at in outcomes) - paused < 3.0


def test_a_full_distributed_bulkhead_counts_its_waiters_in_retry_after(
    backends: Callable[..., RedisBackend],
) -> None:
    """retry_after = hold / limit * (waiters ahead + 1) counts this process's queued
    waiters, which a distributed bulkhead keeps in its own queues (it said hold/limit)."""
    bulkhead = rs.Bulkhead(1, backend=backends(), name="eta", max_wait=5.0)
    for _ in range(3):  # a measured hold time of about 0.1 s
        with bulkhead.acquire("k"):
            time.sleep(0.1)
    holder = bulkhead.acquire_nowait("k")
    waiters = [threading.Thread(target=lambda: bulkhead.acquire("k").release()) for _ in range(3)]
    for thread in waiters:
        thread.start()
    wait_until(lambda: bulkhead.statistics("k").waiting == 3)
    with pytest.raises(rs.BulkheadFull) as refused:
        bulkhead.acquire_nowait("k")
    holder.release()
    for thread in waiters:
        thread.join(5)
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > 0.3  # four holds of about 0.1 s


def test_a_dropped_local_permit_gives_its_slot_back(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A permit of the local twin (Redis down) dropped without release(): its slot
    comes back (it stayed taken for good, and was entered in Redis on recovery)."""
    bulkhead = rs.Bulkhead(2, backend=backends(timeout=0.05), name="dropped", lease=0.6)
    redis_server.kill()
    bulkhead.acquire_nowait("k")  # dropped at once
    gc.collect()
    wait_until(lambda: bulkhead.statistics("k").in_flight == 0)
    permits = [bulkhead.acquire_nowait("k") for _ in range(2)]  # both slots free again
    for permit in permits:
        permit.release()


def test_unnamed_distributed_bulkheads_with_different_limits_do_not_share_slots(
    backends: Callable[..., RedisBackend],
) -> None:
    """Without name= both used the identity "Bulkhead" in Redis: a storage bulkhead's
    two holders filled a database bulkhead of 2 that nobody used. The default identity
    now carries the limit; a fleet's copies of one bulkhead (same limit) still share."""
    backend = backends()
    storage, database = rs.Bulkhead(5, backend=backend), rs.Bulkhead(2, backend=backend)
    held = [storage.acquire_nowait() for _ in range(2)]
    permit = database.acquire_nowait()
    twin = rs.Bulkhead(2, backend=backends())  # another process's copy of the database one
    assert twin.statistics().shared_in_flight == 1
    for each in (*held, permit):
        each.release()


def test_open_mode_permits_dropped_without_release_stop_counting(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """A slotless permit ("open" mode, Redis down) counts as in flight while held, and
    no longer once dropped without release()."""
    bulkhead = rs.Bulkhead(
        1, backend=backends(timeout=0.05), name="open-drop", on_backend_error="open"
    )
    redis_server.kill()
    held = bulkhead.acquire_nowait("k")
    bulkhead.acquire_nowait("k")  # dropped at once
    gc.collect()
    assert bulkhead.statistics("k").in_flight == 1
    held.release()
    assert bulkhead.statistics("k").in_flight == 0


def test_a_limit_spent_by_local_slots_is_a_refusal_not_a_script_error(
    redis_server: RedisServer, backends: Callable[..., RedisBackend]
) -> None:
    """Redis back, a local slot not yet entered: the limit passed to the script is 0
    and the leases set empty. The script failed on the empty set (a new 'outage')."""
    bulkhead = rs.Bulkhead(1, backend=backends(timeout=0.05), name="spent", lease=30.0)
    redis_server.pause()
    try:
        local = bulkhead.acquire_nowait("k")  # the twin's slot
    finally:
        redis_server.resume()
    time.sleep(1.2)  # past the probe interval: the next call asks Redis
    with pytest.raises(rs.BulkheadFull):
        bulkhead.acquire_nowait("k")
    assert bulkhead.statistics("k").backend["backend_errors"] == 1  # type: ignore[index]
    local.release()
