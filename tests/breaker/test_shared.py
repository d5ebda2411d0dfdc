"""Shared breaker state through a real Redis, with several "processes" in one test.

Each simulated process has its own RedisBackend, hence its own subscriber, publisher
and identity, exactly as separate processes would. (test_fleet.py runs real ones.)
Redis TTLs are real time, so these breakers use the system clock and short cool-downs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.breaker import BreakerStateChanged, CircuitBreaker, CircuitState
from resilience.testing import RedisServer

pytestmark = pytest.mark.redis

OPEN_FOR = 0.3


class Boom(Exception):
    """A failure of the protected dependency."""


def boom(*_: Any) -> None:
    raise Boom


#: The options of every breaker of the fleet in these tests.
FLEET_OPTIONS: dict[str, Any] = {
    "name": "fleet",
    "failure_rate": None,
    "consecutive_failures": 2,
    "open_for": OPEN_FOR,
    "sync_interval": 30.0,
}


class Fleet:
    """Breakers with one name, each on its own backend (its own 'process')."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.breakers: list[CircuitBreaker] = []

    def add(self, **kwargs: Any) -> CircuitBreaker:
        options = {**FLEET_OPTIONS, **kwargs}
        # A generous backend timeout: on a loaded test machine a 50 ms election could
        # time out and (correctly) fall back to a local probe, which is not under test.
        backend = RedisBackend.from_url(self.url, timeout=1.0)
        breaker = CircuitBreaker(backend=backend, **options)
        self.breakers.append(breaker)
        assert wait_for(lambda: breaker.shared is not None and breaker.shared.connected)
        return breaker

    def close(self) -> None:
        for breaker in self.breakers:
            assert breaker.shared is not None
            breaker.shared.close()


def wait_for(condition: Any, timeout: float = 3.0) -> bool:
    """Wait for something another thread or process does (not for a policy's timer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.002)
    return bool(condition())


def opened_event(breaker: CircuitBreaker, state: str = "open") -> threading.Event:
    event = threading.Event()
    breaker.add_listener(
        lambda e: event.set() if isinstance(e, BreakerStateChanged) and e.new == state else None
    )
    return event


def trip_while_redis_is_down(breaker: CircuitBreaker, redis_server: RedisServer) -> None:
    """Kill Redis, trip ``breaker`` (two failures), and wait until its publisher has
    tried to tell the fleet and failed: the trip waits for Redis."""
    shared = breaker.shared
    assert shared is not None
    redis_server.kill()
    assert wait_for(lambda: not shared.connected)
    errors = shared.statistics()["backend_errors"]
    for _ in range(2):
        with pytest.raises(Boom):
            breaker.call(boom)
    assert breaker.state is CircuitState.OPEN
    assert wait_for(lambda: shared.statistics()["backend_errors"] > errors)


def trip_and_cool_down(tripper: CircuitBreaker, listener: CircuitBreaker) -> None:
    """Trip ``tripper`` (two failures), wait until ``listener`` heard it, and let the
    cool-down pass (it is Redis time)."""
    heard = opened_event(listener)
    for _ in range(2):
        with pytest.raises(Boom):
            tripper.call(boom)
    assert heard.wait(3)
    time.sleep(OPEN_FOR + 0.05)


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    group = Fleet(redis_server.url)
    try:
        yield group
    finally:
        group.close()


def test_unnamed_shared_breakers_share_state_by_their_settings(fleet: Fleet) -> None:
    """Without ``name=`` (it used to be required), a shared breaker's fleet identity
    is its default name and a digest of its thresholds: a fleet's copies of one breaker
    hear each other's trips, an unnamed breaker with other settings (another
    dependency's) does not."""
    a, b = fleet.add(name=None), fleet.add(name=None)
    other = fleet.add(name=None, consecutive_failures=3)
    assert a.shared is not None
    assert b.shared is not None
    assert other.shared is not None
    assert a.name == "CircuitBreaker"
    assert a.shared.name == b.shared.name != other.shared.name
    assert a.shared.name.startswith("CircuitBreaker-")
    heard, misheard = opened_event(b), opened_event(other)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert heard.wait(3)
    # The trip was published to every subscriber at once: give other's a moment.
    assert not misheard.wait(0.2)
    assert other.state is CircuitState.CLOSED


def test_a_trip_opens_the_others(fleet: Fleet) -> None:
    """One process trips; the others hear it and reject, for the rest of the cool-down."""
    a, b = fleet.add(), fleet.add()
    heard = opened_event(b)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert a.state is CircuitState.OPEN
    assert heard.wait(3)
    with pytest.raises(rs.CircuitOpen) as caught:
        b.call(int)
    assert 0 < caught.value.retry_after <= OPEN_FOR


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised inside a listener."""


def test_a_trip_whose_listener_was_interrupted_still_opens_the_fleet(fleet: Fleet) -> None:
    """A listener raising a BaseException on a trip interrupts that call, not the news:
    the other processes still hear the trip."""
    a, b = fleet.add(), fleet.add()
    heard = opened_event(b)

    def interrupt(event: rs.Event) -> None:
        if isinstance(event, BreakerStateChanged):
            raise _Interrupt

    a.add_listener(interrupt)
    with pytest.raises(Boom):
        a.call(boom)
    with pytest.raises(_Interrupt):
        a.call(boom)
    assert a.state is CircuitState.OPEN
    assert heard.wait(3)


def test_breakers_sharing_a_name_and_a_backend_all_hear_the_fleet(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """Two breakers of one name on one backend (one process, two modules): a trip
    elsewhere opens both (the later one used to replace the earlier in the process's
    table: the earlier stayed CLOSED for good), and dropping one leaves the other
    subscribed (its hub used to stop)."""
    tripper = fleet.add()
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    options = {**FLEET_OPTIONS, "open_for": 30.0}
    first = CircuitBreaker(backend=backend, **options)
    second = CircuitBreaker(backend=backend, **options)
    dropped = CircuitBreaker(backend=backend, **options)
    try:
        assert wait_for(lambda: first.shared is not None and first.shared.connected)
        assert dropped.shared is not None
        dropped.shared.close()
        del dropped
        heard = [opened_event(first), opened_event(second)]
        for _ in range(2):
            with pytest.raises(Boom):
                tripper.call(boom)
        assert all(event.wait(3) for event in heard)
        assert first.state is CircuitState.OPEN
        assert second.state is CircuitState.OPEN
    finally:
        for breaker in (first, second):
            assert breaker.shared is not None
            breaker.shared.close()


def test_breakers_sharing_a_name_and_a_backend_are_members_of_their_own(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """Two breakers of one name on one backend hear each other's trips as another
    process's, and only one of them wins the fleet's probe. (They shared the process's
    identity: a trip of one never reached the other, and both won the probe.)"""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    options = FLEET_OPTIONS
    first = CircuitBreaker(backend=backend, **options)
    second = CircuitBreaker(backend=backend, **options)
    other = fleet.add()
    try:
        assert wait_for(lambda: first.shared is not None and first.shared.connected)
        trip_and_cool_down(first, second)  # second hears first's trip
        probes = []
        for breaker in (first, second, other):
            with contextlib.suppress(rs.CircuitOpen):
                probes.append(breaker.acquire_nowait())
        assert len(probes) == 1
        probes[0].success()
    finally:
        for breaker in (first, second):
            assert breaker.shared is not None
            breaker.shared.close()


def test_exactly_one_probe_fleet_wide_and_its_success_closes_all(fleet: Fleet) -> None:
    """After the cool-down one process wins the probe; its success closes everybody."""
    a, b, c = fleet.add(), fleet.add(), fleet.add()
    heard = [opened_event(x) for x in (b, c)]
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert all(event.wait(3) for event in heard)
    closed = [opened_event(x, "closed") for x in (a, b, c)]
    time.sleep(OPEN_FOR + 0.05)  # the cool-down is Redis time: let it pass

    ran: list[str] = []
    entered = threading.Event()
    release = threading.Event()

    def probe(who: str) -> str:
        ran.append(who)
        entered.set()
        release.wait(3)
        return "ok"

    outcomes: dict[str, str] = {}

    def attempt(who: str, breaker: CircuitBreaker) -> None:
        try:
            outcomes[who] = breaker.call(probe, who)
        except rs.CircuitOpen:
            outcomes[who] = "rejected"

    first = threading.Thread(target=attempt, args=("b", b))
    first.start()
    assert entered.wait(3)
    attempt("a", a)
    attempt("c", c)
    release.set()
    first.join(3)
    assert ran == ["b"]
    assert outcomes == {"a": "rejected", "b": "ok", "c": "rejected"}
    assert all(event.wait(3) for event in closed)
    assert [x.state for x in (a, b, c)] == [CircuitState.CLOSED] * 3


def test_a_failed_probe_reopens_the_fleet(fleet: Fleet) -> None:
    """The winner's failed probe is shared: the others stay open for the new cool-down."""
    a, b = fleet.add(open_for=0.2), fleet.add(open_for=0.2)
    heard = opened_event(b)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert heard.wait(3)
    time.sleep(0.25)
    assert a.shared is not None
    assert b.shared is not None
    reopened = opened_event(b)
    with pytest.raises(Boom):
        a.call(boom)  # a wins the probe, which fails
    assert a.state is CircuitState.OPEN
    assert reopened.wait(3)
    assert b.state is CircuitState.OPEN
    assert a.shared.statistics()["won"] == 1


def test_quorum_opens_the_fleet_only_when_enough_report(fleet: Fleet) -> None:
    """quorum=2: one trip stays local; the second process's trip opens the third."""
    a, b, c = (fleet.add(quorum=2) for _ in range(3))
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert a.state is CircuitState.OPEN
    assert a.shared is not None
    assert wait_for(lambda: a.shared is not None and a.shared.published == 1)
    assert c.state is CircuitState.CLOSED
    heard = opened_event(c)
    for _ in range(2):
        with pytest.raises(Boom):
            b.call(boom)
    assert heard.wait(3)
    assert c.state is CircuitState.OPEN


def test_with_a_quorum_a_failed_probe_still_keeps_the_others_from_probing(
    fleet: Fleet,
) -> None:
    """quorum=2: the fleet is open (both reported); the winner's probe fails. Its re-trip
    is one report, short of the quorum, but its probe lease lasts its new cool-down, so
    the other process loses the election and stays open: one probe fleet-wide per
    cool-down (each process probed in the same cool-down)."""
    a, b = fleet.add(open_for=0.2, quorum=2), fleet.add(open_for=0.2, quorum=2)
    for breaker in (a, b):
        for _ in range(2):
            with pytest.raises(Boom):
                breaker.call(boom)
    assert a.state is CircuitState.OPEN
    assert b.state is CircuitState.OPEN
    time.sleep(0.25)  # both half-open: real time, like Redis' own clock
    with pytest.raises(Boom):
        a.call(boom)  # a wins the probe, which fails
    assert a.state is CircuitState.OPEN
    assert a.shared is not None
    assert wait_for(lambda: a.shared is not None and a.shared.published >= 2)
    with pytest.raises(rs.CircuitOpen):
        b.call(boom)  # b loses the election: a's lease holds for a's cool-down
    assert b.shared is not None
    assert (a.shared.statistics()["won"], b.shared.statistics()["won"]) == (1, 0)


def test_another_process_s_trip_below_the_quorum_leaves_the_probe_lease_alone(
    fleet: Fleet,
) -> None:
    """quorum=3: a's failed probe holds its lease for a's new cool-down; a trip report
    from another process (d, below the quorum) must not release it (it deleted the
    lease, and b won a second probe in a's cool-down)."""
    a, b, c = (fleet.add(open_for=0.5, quorum=3) for _ in range(3))
    for breaker in (a, b, c):
        for _ in range(2):
            with pytest.raises((Boom, rs.CircuitOpen)):
                breaker.call(boom)
    assert wait_for(lambda: all(x.state is CircuitState.OPEN for x in (a, b, c)))
    time.sleep(0.55)  # every cool-down over: real time, like Redis' own clock
    with pytest.raises(Boom):
        a.call(boom)  # a wins the probe, which fails
    assert a.shared is not None
    assert wait_for(lambda: a.shared is not None and a.shared.published >= 2)
    d = fleet.add(open_for=0.5, quorum=3)
    for _ in range(2):
        with pytest.raises(Boom):
            d.call(boom)  # d's own trip: two reports in the window, short of three
    assert d.shared is not None
    assert wait_for(lambda: d.shared is not None and d.shared.published >= 1)
    with pytest.raises(rs.CircuitOpen):
        b.call(boom)  # still within a's cool-down: a's lease holds
    assert b.shared is not None
    assert b.shared.statistics()["won"] == 0


def test_a_manual_close_closes_a_manual_open_elsewhere(fleet: Fleet) -> None:
    """An operator's close() closes the fleet: also a process whose breaker was opened
    by hand, a cool-down of its own (it stayed open, rejecting, while the rest closed)."""
    a, b = fleet.add(open_for=30), fleet.add(open_for=30)
    heard = opened_event(b)
    a.open()
    assert heard.wait(3)
    closed = opened_event(a, "closed")
    b.close()
    assert closed.wait(3)
    assert a.state is CircuitState.CLOSED


def test_a_close_by_a_closed_member_is_broadcast(fleet: Fleet) -> None:
    """An operator's close() reaches the fleet from any member, also one whose own
    breaker is CLOSED (an admin process): it used to be a silent local reset there."""
    admin = fleet.add(open_for=30)
    assert admin.shared is not None
    assert admin.state is CircuitState.CLOSED
    changes: list[rs.Event] = []
    admin.add_listener(lambda e: changes.append(e) if isinstance(e, BreakerStateChanged) else None)
    published = admin.shared.statistics()["published"]
    admin.close()
    assert wait_for(
        lambda: admin.shared is not None and admin.shared.statistics()["published"] > published
    )
    assert changes == []  # no state change here


def test_a_slow_probe_keeps_the_fleet_probe(fleet: Fleet) -> None:
    """The winner's probe lease is renewed while its probe is out: a probe slower than
    the lease (here 1 s) is still the only one. Another process used to win a second
    election once the lease ran out and probe too."""
    a, b = fleet.add(), fleet.add()
    trip_and_cool_down(a, b)
    entered = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def probe(who: str) -> str:
        ran.append(who)
        entered.set()
        release.wait(5)
        return "ok"

    slow = threading.Thread(target=lambda: a.call(probe, "a"))
    slow.start()
    try:
        assert entered.wait(3)
        time.sleep(1.5)  # past the 1 s lease
        with pytest.raises(rs.CircuitOpen):
            b.call(probe, "b")
        assert ran == ["a"]
    finally:
        release.set()
        slow.join(5)
    assert wait_for(lambda: b.state is CircuitState.CLOSED)


def test_an_ignored_probe_does_not_keep_the_fleet_probe(fleet: Fleet) -> None:
    """A won probe that ended with an ignored outcome (a 429 through the transport, say)
    leaves no probe out: its lease is not renewed, and once it ends another process
    probes (it used to be renewed for as long as the winner stayed half-open)."""
    a, b = fleet.add(), fleet.add()
    trip_and_cool_down(a, b)
    a.acquire_nowait().ignore()  # a wins the fleet probe, and gives it back
    probed: list[rs.breaker.Permit] = []

    def b_probes() -> bool:
        try:
            probed.append(b.acquire_nowait())
        except rs.CircuitOpen:
            return False
        return True

    assert wait_for(b_probes, timeout=4.0)  # after a's 1 s lease at the latest
    probed[0].success()


def test_a_probe_after_an_ignored_one_is_elected_again(fleet: Fleet) -> None:
    """After an ignored probe the winner's lease is no longer renewed, so its next
    probe asks the fleet again (and wins, its lease still there), which renews the
    lease anew: another process does not probe beside it. (The next probe used to go
    out unelected while the lease ran out, and a second process probed too.)"""
    a, b = fleet.add(), fleet.add()
    trip_and_cool_down(a, b)
    assert a.shared is not None
    a.acquire_nowait().ignore()  # a wins the fleet probe, and gives it back
    time.sleep(0.5)  # longer than a third of the 1 s lease: its renewal stopped
    probe = a.acquire_nowait()
    assert a.shared.statistics()["won"] == 2
    try:
        time.sleep(1.2)  # past the first lease
        with pytest.raises(rs.CircuitOpen):
            b.acquire_nowait()
    finally:
        probe.success()


def test_a_probe_won_again_late_in_the_lease_holds_a_whole_lease(fleet: Fleet) -> None:
    """A winner that probes again when less than a renewal interval of its lease is
    left holds a whole lease from that win: no other process probes beside it. (The
    lease was kept as it was, ended before its first renewal, and a second process
    won a probe too.)"""
    a, b = fleet.add(), fleet.add()
    trip_and_cool_down(a, b)
    assert a.shared is not None
    won_at = time.monotonic()
    a.acquire_nowait().ignore()  # a wins the fleet probe (a 1 s lease), gives it back
    time.sleep(0.8)  # its renewal stopped; less than a third of the lease is left
    probe = a.acquire_nowait()
    assert a.shared.statistics()["won"] == 2
    try:
        time.sleep(max(0.0, won_at + 1.1 - time.monotonic()))  # past the first lease
        with pytest.raises(rs.CircuitOpen):
            b.acquire_nowait()
    finally:
        probe.success()


def test_the_probe_lease_keeper_runs_no_listener(fleet: Fleet) -> None:
    """The winner's lease is renewed by the process's lease keeper thread, which also
    renews bulkhead leases: it never moves a breaker (an overdue probe is noticed by the
    breaker's own callers), so no listener of the user's runs there."""
    a = fleet.add(max_half_open_wait=1.0)
    threads: list[str] = []
    a.add_listener(lambda event: threads.append(threading.current_thread().name))
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    time.sleep(OPEN_FOR + 0.05)
    probe = a.acquire_nowait()
    time.sleep(1.5)  # the probe is overdue; the keeper renewed the lease meanwhile
    probe.ignore()
    assert "resilience-bulkhead-leases" not in threads


def test_a_dropped_breaker_holding_the_fleet_probe_is_collected(
    redis_server: RedisServer,
) -> None:
    """The lease renewal job holds nothing strongly: a breaker dropped while its won
    probe is out is collected, and its lease runs out."""
    import gc
    import weakref

    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    breaker = _trips_at_once(backend, "dropped-probe", open_for=0.2)
    with pytest.raises(Boom):
        breaker.call(boom)
    time.sleep(0.25)
    permit = breaker.acquire_nowait()  # the fleet probe, never settled
    assert breaker.shared is not None
    assert breaker.shared.statistics()["won"] == 1
    gone = weakref.ref(breaker)
    del breaker, permit
    assert wait_for(lambda: gc.collect() >= 0 and gone() is None)


def test_cool_downs_grow_fleet_wide_whoever_probes(fleet: Fleet) -> None:
    """open_for_max growth counts the fleet's trips in a row: when another process
    wins the next probe and it fails, the cool-down grows on (it fell back to
    open_for, for the whole fleet, since each process counted only its own trips)."""
    a, b = fleet.add(open_for=0.2, open_for_max=5), fleet.add(open_for=0.2, open_for_max=5)
    heard = opened_event(b)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert heard.wait(3)  # trip 1: 0.2 s
    time.sleep(0.25)
    heard = opened_event(b)
    with pytest.raises(Boom):
        a.call(boom)  # a's probe fails: trip 2, 0.4 s
    assert heard.wait(3)
    time.sleep(0.45)
    heard = opened_event(a)
    with pytest.raises(Boom):
        b.call(boom)  # b wins this probe, which fails: trip 3, 0.6 s
    assert heard.wait(3)
    retry_after = b.statistics().retry_after
    assert retry_after is not None
    assert retry_after > 0.45


def test_a_manual_open_opens_the_fleet_whatever_the_quorum(fleet: Fleet) -> None:
    """An operator's open() is broadcast at once; with quorum=2 it used to count as
    one process's report and stay local."""
    a, b = fleet.add(quorum=2), fleet.add(quorum=2)
    heard = opened_event(b)
    a.open(seconds=60)
    assert heard.wait(3)
    assert b.state is CircuitState.OPEN


def test_a_breaker_that_left_the_fleet_no_longer_takes_its_probe(fleet: Fleet) -> None:
    """After shared.close() a breaker goes on alone: it does not win the fleet's
    half-open election (it used to, and, unable to publish the outcome, left the rest
    of the fleet open for the whole probe lease)."""
    a, b = fleet.add(open_for=0.2), fleet.add(open_for=0.2)
    heard = opened_event(a)
    for _ in range(2):
        with pytest.raises(Boom):
            b.call(boom)
    assert heard.wait(3)
    assert a.shared is not None
    assert b.shared is not None
    a.shared.close()
    assert not a.shared.connected
    time.sleep(0.25)
    assert a.call(lambda: "ok") == "ok"  # its own probe, no election
    assert a.shared.statistics()["won"] == 0
    assert b.call(lambda: "ok") == "ok"  # b wins the fleet's probe for itself
    assert b.state is CircuitState.CLOSED


@pytest.mark.parametrize("bad", ["bad.example", "__BEGAN__"])
def test_keys_are_shared_one_by_one(fleet: Fleet, bad: str) -> None:
    """A keyed breaker shares each key's trips; other keys stay closed. (A key spelled
    like the trip script's stamp placeholder had its trip messages lost.)"""
    a = fleet.add(key=lambda host: host)
    b = fleet.add(key=lambda host: host)
    heard = opened_event(b)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom, bad)
    assert heard.wait(3)
    assert b.state_of(bad) is CircuitState.OPEN
    assert b.state_of("good.example") is CircuitState.CLOSED
    assert b.call(lambda host: host, "good.example") == "good.example"


def test_a_late_joiner_catches_up_by_reading_the_index(fleet: Fleet) -> None:
    """A process that missed the message opens from the cached read of open signals."""
    a = fleet.add(open_for=30)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert a.shared is not None
    assert wait_for(lambda: a.shared is not None and a.shared.published == 1)
    late = fleet.add(open_for=30)
    assert wait_for(lambda: late.state is CircuitState.OPEN)
    assert late.statistics().retry_after is not None


def test_closed_happy_path_sends_no_redis_command(fleet: Fleet, redis_server: RedisServer) -> None:
    """INFO commandstats: thousands of CLOSED calls, not one command."""
    a, b = fleet.add(), fleet.add()
    redis_server.reset_stats()
    for _ in range(2000):
        a.call(int)
        b.call(int)
    counts = redis_server.commandstats()
    calls_made = {k: v for k, v in counts.items() if not k.startswith(("config", "info"))}
    assert calls_made == {}


def test_redis_down_keeps_local_breakers_working(fleet: Fleet, redis_server: RedisServer) -> None:
    """Redis dies: every process trips, rejects and probes on its own; nothing hangs."""
    a = fleet.add(open_for=0.05)
    events: list[rs.Event] = []
    a.add_listener(events.append)
    redis_server.kill()
    assert wait_for(lambda: a.shared is not None and not a.shared.connected)
    started = time.monotonic()
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    with pytest.raises(rs.CircuitOpen):
        a.call(int)
    time.sleep(0.06)
    assert a.call(lambda: "probe") == "probe"  # a local probe: no election without Redis
    assert a.state is CircuitState.CLOSED
    assert time.monotonic() - started < 2.0
    assert any(isinstance(e, rs.BackendFallback) for e in events)
    redis_server.start()
    assert wait_for(lambda: a.shared is not None and a.shared.connected, timeout=5)
    assert wait_for(lambda: any(isinstance(e, rs.BackendRecovered) for e in events))


def test_a_trip_made_while_redis_was_down_reaches_the_fleet_once_it_is_back(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A process that tripped during an outage could not tell the fleet; when Redis
    answers again the trip is published for what is left of its cool-down, so the
    others stop sending to the failing dependency too."""
    a, b = fleet.add(open_for=30.0), fleet.add(open_for=30.0)
    assert a.shared is not None
    assert b.shared is not None
    heard = opened_event(b)
    trip_while_redis_is_down(a, redis_server)
    assert not heard.is_set()
    redis_server.start()
    assert heard.wait(10)
    with pytest.raises(rs.CircuitOpen) as caught:
        b.call(int)
    assert caught.value.retry_after is not None
    assert 20 < caught.value.retry_after <= 30.0


def test_a_close_made_while_redis_is_down_is_local_and_the_fleet_s_state_wins_after(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A close() that Redis did not take is this breaker's alone: once Redis answers,
    the breaker follows the fleet again, open for what is left of the trip (a fleet
    split otherwise: closed here, open everywhere else, for the whole cool-down)."""
    a = fleet.add(open_for=30, sync_interval=0.2)
    b = fleet.add(open_for=30, sync_interval=0.2)
    assert a.shared is not None
    moves: list[tuple[str, str]] = []
    a.add_listener(
        lambda e: moves.append((e.new, e.reason)) if isinstance(e, BreakerStateChanged) else None
    )
    heard = opened_event(b)
    a.open()
    assert heard.wait(3)
    assert wait_for(lambda: a.shared is not None and a.shared.statistics()["published"] >= 1)
    redis_server.pause()
    try:
        errors = a.shared.statistics()["backend_errors"]
        a.close()
        assert wait_for(
            lambda: a.shared is not None and a.shared.statistics()["backend_errors"] > errors, 5
        )
        assert a.state is CircuitState.CLOSED
    finally:
        redis_server.resume()
    assert wait_for(lambda: a.state is CircuitState.OPEN, timeout=5)
    assert b.state is CircuitState.OPEN
    assert moves == [("open", "manual"), ("closed", "manual"), ("open", "remote")]


def test_a_close_redis_missed_does_not_undo_a_trip_made_after_it(
    fleet: Fleet, redis_server: RedisServer, fault_proxy: Any
) -> None:
    """A close made while its process could not reach Redis does not close a trip
    another process made after it once Redis answers: that trip stands, and the closing
    process opens from it too."""
    proxy = fault_proxy(redis_server.port)
    cut_off = Fleet(proxy.url("redis", "/0"))
    a = cut_off.add(open_for=30, sync_interval=0.2)
    try:
        b, c = fleet.add(open_for=30), fleet.add(open_for=30)
        assert a.shared is not None
        moves: dict[str, list[tuple[str, str]]] = {"b": [], "c": []}
        for name, breaker in (("b", b), ("c", c)):
            breaker.add_listener(
                lambda e, name=name: (
                    moves[name].append((e.new, e.reason))
                    if isinstance(e, BreakerStateChanged)
                    else None
                )
            )
        proxy.set(reset_new=True)
        proxy.reset_connections()
        assert wait_for(lambda: a.shared is not None and not a.shared.connected)
        errors = a.shared.statistics()["backend_errors"]
        a.close()  # an operator's close: it cannot reach Redis
        assert wait_for(
            lambda: a.shared is not None and a.shared.statistics()["backend_errors"] > errors
        )
        heard = opened_event(c)
        for _ in range(2):
            with pytest.raises(Boom):
                b.call(boom)  # then b's dependency fails
        assert heard.wait(3)
        proxy.heal()
        assert wait_for(lambda: a.state is CircuitState.OPEN, timeout=5)  # from the index
        time.sleep(0.5)  # a's close had its chance to go out
        assert b.state is CircuitState.OPEN
        assert c.state is CircuitState.OPEN
        assert moves == {"b": [("open", "consecutive_failures")], "c": [("open", "remote")]}
    finally:
        cut_off.close()


def test_breakers_of_one_process_publish_each_their_own_news(redis_server: RedisServer) -> None:
    """Two breakers of one name on one backend each get their publish out, even when
    one's follows the other's at once. (They shared one publish slot per key, and the
    later replaced the earlier still waiting: a close was never sent.)"""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    first = _trips_at_once(backend, "siblings")
    second = _trips_at_once(backend, "siblings")
    assert first.shared is not None
    assert second.shared is not None
    hub = first.shared._hub
    gate = threading.Event()
    hub.submit(("busy", "gate"), gate.wait)  # holds the publisher thread
    try:
        first.close()  # a close for the fleet (from a closed breaker) ...
        with pytest.raises(Boom):
            second.call(boom)  # ... and a trip right after it
    finally:
        gate.set()
    assert wait_for(lambda: first.shared is not None and first.shared.published == 1)
    assert wait_for(lambda: second.shared is not None and second.shared.published == 1)
    for breaker in (first, second):
        assert breaker.shared is not None
        breaker.shared.close()
    backend.close()


def test_a_close_right_after_the_closer_s_own_trip_closes_the_fleet(fleet: Fleet) -> None:
    """A breaker's own trip always came before its close, however late the trip reached
    Redis: an open() and a close() at once leave the fleet closed."""
    a, b = fleet.add(open_for=30), fleet.add(open_for=30)
    assert a.shared is not None
    heard = opened_event(b)
    a.open()
    assert heard.wait(3)
    a.open()  # a trip Redis sees after the close below was made ...
    a.close()  # ... and the close, which must not be taken for an older one
    assert wait_for(lambda: b.state is CircuitState.CLOSED)
    a.shared._poll()
    assert a.state is CircuitState.CLOSED


def test_a_slow_poll_does_not_reopen_a_breaker_from_the_trip_it_closed(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll that read the fleet's trips just before this breaker closed one, and whose
    reply came back after, does not re-open the breaker from that trip. (The trip was
    dated from the reply: late enough to look newer than the close.)"""
    a, b = fleet.add(open_for=30), fleet.add(open_for=30)
    assert a.shared is not None
    heard = opened_event(a)
    for _ in range(2):
        with pytest.raises(Boom):
            b.call(boom)
    assert heard.wait(3)
    shared = a.shared
    script = shared._poll_script

    class SlowReply:
        def run(self, keys: list[str], args: list[Any]) -> Any:
            raw = script.run(keys, args)  # read while the trip is listed
            a.close()  # closed meanwhile, the close out before the reply is read
            assert wait_for(lambda: b.state is CircuitState.CLOSED)
            time.sleep(0.3)
            return raw

    monkeypatch.setattr(shared, "_poll_script", SlowReply())
    shared._poll()
    assert a.state is CircuitState.CLOSED


def test_a_close_made_as_a_missed_trip_is_re_sent_wins(
    fleet: Fleet, redis_server: RedisServer, fault_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close made just as the trip Redis missed is being re-sent (after the re-send
    saw the breaker open) is what the fleet learns: the stale trip does not replace it
    and re-open the others. (It took the close's publish slot: the close was lost, the
    fleet re-opened, and this breaker's polls then ignored the key for good.)"""
    proxy = fault_proxy(redis_server.port)
    cut_off = Fleet(proxy.url("redis", "/0"))
    a = cut_off.add(open_for=5, sync_interval=0.1)
    try:
        b = fleet.add(open_for=5)
        moves: list[str] = []
        b.add_listener(
            lambda e: moves.append(e.new) if isinstance(e, BreakerStateChanged) else None
        )
        proxy.set(reset_new=True)
        proxy.reset_connections()
        assert wait_for(lambda: a.shared is not None and not a.shared.connected)
        for _ in range(2):
            with pytest.raises(Boom):
                a.call(boom)  # a trip Redis misses: re-sent once it answers
        assert wait_for(lambda: a.shared is not None and bool(a.shared._unsent))
        state_of = a.state_of
        closed: list[bool] = []

        def closing_state_of(key: Any = None) -> CircuitState:
            state = state_of(key)
            if threading.current_thread().name == "resilience-breaker-sub" and not closed:
                closed.append(True)
                a.close()  # an operator's close, just after the re-send saw OPEN
            return state

        monkeypatch.setattr(a, "state_of", closing_state_of)
        proxy.heal()
        assert wait_for(lambda: bool(closed))
        assert wait_for(lambda: a.shared is not None and a.shared.published >= 1)
        time.sleep(0.3)  # a few polls of a's
        assert a.state is CircuitState.CLOSED
        assert moves == []  # b never heard the stale trip
        assert a.shared is not None
        assert all(ran is not None for _, ran, _ in a.shared._closing.values())
    finally:
        cut_off.close()


def test_a_trip_message_older_than_this_breaker_s_close_does_not_reopen_it(
    fleet: Fleet, redis_server: RedisServer, fault_proxy: Any
) -> None:
    """A trip that reached Redis before this breaker's close, whose message arrives
    after the close, was closed by it (Redis's order decides): the breaker stays closed
    with the rest of the fleet. (It re-opened for the rest of the trip's cool-down.)"""
    proxy = fault_proxy(redis_server.port)
    late = Fleet(proxy.url("redis", "/0"))
    a = late.add(open_for=3)
    try:
        b, c = fleet.add(open_for=3), fleet.add(open_for=3)
        assert b.shared is not None
        proxy.set(latency=0.3)  # what Redis sends a arrives 0.3 s late
        client = RedisBackend.from_url(redis_server.url).sync_client
        heard = opened_event(c)
        for _ in range(2):
            with pytest.raises(Boom):
                b.call(boom)
        assert heard.wait(3)  # b's trip is in Redis; its message is on its way to a
        assert a.state is CircuitState.CLOSED
        a.close()  # reaches Redis after the trip, at once: it closes the trip
        assert wait_for(lambda: b.state is CircuitState.CLOSED and c.state is CircuitState.CLOSED)
        time.sleep(0.8)  # b's trip message, then a's own close, have reached a
        assert [k for k in client.keys("*") if not k.endswith(b":stamp")] == []  # no trip
        assert a.state is CircuitState.CLOSED
    finally:
        late.close()


def test_a_close_published_while_the_subscriber_reconnects_does_not_mute_later_trips(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A close that reached Redis while this process's subscriber was reconnecting
    never comes back on the channel; trips made after it are still heard. (Trip
    messages were taken for older than the close until a poll, up to sync_interval.)"""
    a, b = fleet.add(open_for=3), fleet.add(open_for=3)
    assert a.shared is not None
    a.open()
    assert wait_for(lambda: b.state is CircuitState.OPEN)
    client = RedisBackend.from_url(redis_server.url).sync_client
    errors = a.shared.statistics()["backend_errors"]
    client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # every subscriber
    a.close()  # reaches Redis while a's subscriber waits to reconnect
    assert wait_for(lambda: a.shared is not None and a.shared.published >= 2)
    assert wait_for(
        lambda: a.shared is not None and a.shared.statistics()["backend_errors"] > errors
    )
    assert wait_for(lambda: a.shared is not None and a.shared.connected)
    c = fleet.add(open_for=3)  # (b missed the close: it stays open its cool-down)
    heard = opened_event(a)
    for _ in range(2):
        with pytest.raises(Boom):
            c.call(boom)  # a trip after the close
    assert heard.wait(3)


def test_a_trip_heard_while_a_close_is_on_its_way_waits_for_the_close(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trip message heard while this breaker's close is still on its way is decided
    when the close lands: a close that never reached Redis removed nothing, so the
    breaker opens with the fleet then (not at its next poll, sync_interval later)."""
    a, b = fleet.add(open_for=5), fleet.add(open_for=5)
    assert a.shared is not None
    shared = a.shared

    class Unreachable:
        def run(self, keys: list[str], args: list[Any]) -> Any:
            raise rs.BackendError("redis unreachable")

    monkeypatch.setattr(shared, "_close", Unreachable())
    gate = threading.Event()
    shared._hub.submit(("busy", "gate"), gate.wait)  # holds a's publisher
    try:
        a.close()  # on its way ...
        heard = opened_event(c := fleet.add(open_for=5))
        for _ in range(2):
            with pytest.raises(Boom):
                b.call(boom)  # ... when b trips
        assert heard.wait(3)
        assert wait_for(lambda: shared._deferred)  # a heard it too, and waits
        assert a.state is CircuitState.CLOSED
    finally:
        gate.set()  # the close fails: it removed nothing
    assert wait_for(lambda: a.state is CircuitState.OPEN, timeout=2)
    assert c.state is CircuitState.OPEN


def test_a_trip_right_after_a_close_in_the_same_millisecond_reopens_the_closer(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A trip that Redis runs right after this breaker's close, within the same
    millisecond, is newer than the close: the closer opens with the fleet. (Both were
    dated in whole Redis milliseconds, and the tie counted as removed by the close.)"""
    import redis

    from resilience.breaker import _shared

    a, b = fleet.add(open_for=5), fleet.add(open_for=5)
    assert a.shared is not None
    assert b.shared is not None
    tripper = b.shared
    client = redis.Redis.from_url(redis_server.url)
    close, trip = client.register_script(_shared._CLOSE), client.register_script(_shared._TRIP)

    class CloseThenTrip:  # the close, then b's trip, back to back in one transaction
        def run(self, keys: list[str], args: list[Any]) -> Any:
            pipe = client.pipeline(transaction=True)
            close(keys=keys, args=args, client=pipe)
            message = tripper._message("open", None, 5000, 1)
            trip_args = [5000, tripper.origin, 1, "", tripper._hub.channel, message]
            trip(keys=tripper._keys(None), args=[*trip_args, tripper._hub.origin], client=pipe)
            return pipe.execute()[0]

    a.shared._close = CloseThenTrip()  # type: ignore[assignment]
    a.close()
    assert wait_for(lambda: a.state is CircuitState.OPEN, timeout=2)


def test_a_trip_waiting_for_a_close_is_dropped_by_a_later_close_of_the_fleet(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trip message heard while this breaker's close was on its way, and closed since
    by another process, is not applied when the close lands. (It re-opened the breaker
    for its cool-down while the fleet was closed.)"""
    a, b, c = fleet.add(open_for=5), fleet.add(open_for=5), fleet.add(open_for=5)
    assert a.shared is not None
    script = a.shared._close
    reply = threading.Event()
    ran: list[Any] = []

    class LateReply:  # the close runs at once; its reply comes when the test says
        def run(self, keys: list[str], args: list[Any]) -> Any:
            ran.append(script.run(keys, args))
            reply.wait(5)
            return ran[0]

    monkeypatch.setattr(a.shared, "_close", LateReply())
    try:
        a.close()
        assert wait_for(lambda: bool(ran))
        heard = opened_event(c)
        for _ in range(2):
            with pytest.raises(Boom):
                b.call(boom)  # a trip after a's close: a waits for its reply
        assert heard.wait(3)
        assert wait_for(lambda: a.shared is not None and bool(a.shared._deferred))
        c.close()  # another process closes the fleet, that trip included
        assert wait_for(lambda: b.state is CircuitState.CLOSED)
        assert wait_for(lambda: a.shared is not None and not a.shared._deferred)
    finally:
        reply.set()
    time.sleep(0.2)
    assert a.state is CircuitState.CLOSED


def test_a_trip_closed_during_the_outage_is_not_sent_later(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A breaker that tripped and recovered while Redis was down has nothing to tell:
    the fleet is not opened for a failure that is over."""
    a, b = fleet.add(open_for=0.05), fleet.add()
    assert a.shared is not None
    assert b.shared is not None
    opened = opened_event(b)
    redis_server.kill()
    assert wait_for(lambda: a.shared is not None and not a.shared.connected)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert wait_for(lambda: a.state is CircuitState.HALF_OPEN, timeout=2)
    assert a.call(lambda: "probe") == "probe"
    assert a.state is CircuitState.CLOSED
    redis_server.start()
    assert wait_for(lambda: a.shared is not None and a.shared.connected, timeout=10)
    assert wait_for(lambda: b.shared is not None and b.shared.connected, timeout=10)
    b.shared._poll()  # the catch-up read a reconnecting process makes
    assert not opened.is_set()
    assert b.state is CircuitState.CLOSED


def _trip_after_fork(breaker: CircuitBreaker, parent_origin: str) -> None:
    """The child of test_a_breaker_built_before_a_fork...: exit 0 once its trip is out."""
    shared = breaker.shared
    assert shared is not None
    if not wait_for(lambda: shared.connected, timeout=10) or shared.origin == parent_origin:
        os._exit(2)
    for _ in range(2):
        with contextlib.suppress(Boom):
            breaker.call(boom)
    os._exit(0 if wait_for(lambda: shared.statistics()["published"] >= 1, timeout=10) else 3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_breaker_built_before_a_fork_keeps_sharing_in_the_child(fleet: Fleet) -> None:
    """Pre-forking servers (gunicorn --preload, prefork worker pools) build the breaker
    in the parent. The child had neither the parent's threads nor an identity of its
    own: its trips were never published and it skipped its parent's messages as its
    own, silently. The child gets both; its trip reaches the parent."""
    parent = fleet.add(open_for=30.0)
    assert parent.shared is not None
    heard = opened_event(parent)
    assert _forked_exit_code(_trip_after_fork, parent, parent.shared.origin) == 0
    assert heard.wait(5)
    assert parent.state is CircuitState.OPEN


def _forked_exit_code(target: Any, *args: Any) -> int | None:
    """Run ``target(*args)`` in a forked child; its exit code (None: still running at 60 s)."""
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    child.start()
    child.join(60)
    return child.exitcode


def test_a_trip_just_before_leaving_the_fleet_still_reaches_it(fleet: Fleet) -> None:
    """A trip (or a probe's outcome) still queued for the publisher when the breaker
    leaves the fleet (``shared.close()``, the backend's last breaker) is sent before
    the publisher stops: it used to be dropped, and the fleet never opened."""
    leaving, staying = fleet.add(open_for=30.0), fleet.add(open_for=30.0)
    assert leaving.shared is not None
    heard = opened_event(staying)
    for _ in range(2):
        with pytest.raises(Boom):
            leaving.call(boom)
    leaving.shared.close()
    assert heard.wait(5)
    assert staying.state is CircuitState.OPEN


_TRIP_AND_EXIT = """
import sys, time
import resilience as rs
from resilience.backends import RedisBackend

breaker = rs.CircuitBreaker(
    name="fleet", backend=RedisBackend.from_url(sys.argv[1], timeout=1.0),
    failure_rate=None, consecutive_failures=1, open_for=30.0, sync_interval=30.0,
)
end = time.monotonic() + 10
while not breaker.shared.connected and time.monotonic() < end:
    time.sleep(0.002)
try:
    breaker.call(lambda: 1 / 0)
except ZeroDivisionError:
    pass
"""  # and exit at once: the interpreter's exit sends the trip


@pytest.mark.parametrize("how", ["interpreter exit", "forked worker returns"])
def test_a_process_that_trips_and_exits_at_once_tells_the_fleet(
    fleet: Fleet, redis_server: RedisServer, how: str
) -> None:
    """A short-lived process (a CLI job, a recycled worker) that trips and exits right
    away: the publisher is a daemon thread, and the trip it still held died with the
    process. Exit now waits (1 s at most) for what is queued."""
    staying = fleet.add(open_for=30.0)
    heard = opened_event(staying)
    if how == "interpreter exit":
        done = subprocess.run(
            [sys.executable, "-c", _TRIP_AND_EXIT, redis_server.url], timeout=60, check=False
        )
        assert done.returncode == 0
    else:
        assert _forked_exit_code(_trip_and_return, redis_server.url) == 0
    assert heard.wait(5)
    assert staying.state is CircuitState.OPEN


def _trip_and_return(url: str) -> None:
    """A forked worker's whole life: build a breaker, trip it, return (no waiting)."""
    exec(_TRIP_AND_EXIT.replace("sys.argv[1]", repr(url)), {})


class _LingeringLock:
    """A lock that the breaker subscriber thread holds a while (0.2 s) when it takes it:
    a fork at that moment finds it held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held_by_subscriber = threading.Event()

    def __enter__(self) -> bool:
        self._lock.acquire()
        if threading.current_thread().name == "resilience-breaker-sub":
            self.held_by_subscriber.set()
            time.sleep(0.2)
        return True

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_child_forked_while_the_subscriber_applies_a_remote_trip_can_use_the_breaker(
    fleet: Fleet,
) -> None:
    """A pre-forking master forks a worker while its subscriber thread is applying
    another process's trip (inside a breaker's lock): the fork waits for the thread to
    finish, so the child does not inherit that lock held by a thread it does not
    have. (The child's first call through the breaker waited for good: 11 of 200 forks
    under a stream of remote trips.)"""
    master = fleet.add(key=lambda k: k, open_for=30.0)
    other = fleet.add(key=lambda k: k, open_for=30.0)
    lock = _LingeringLock()
    master._cores._lock = lock  # type: ignore[union-attr,assignment]
    for _ in range(2):
        with contextlib.suppress(Boom):
            other.call(boom, "remote-key")  # its trip reaches the master's subscriber
    assert lock.held_by_subscriber.wait(5)
    pid = os.fork()
    if pid == 0:  # the worker: one call through the breaker, then leave
        try:
            master.call(lambda k: None, "fresh-key")
        finally:
            os._exit(0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on its first call through the breaker")


def _report_unsent(breaker: CircuitBreaker) -> None:
    shared = breaker.shared
    assert shared is not None
    os._exit(len(shared._unsent))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_report_its_parents_unsent_trips(
    fleet: Fleet, redis_server: RedisServer
) -> None:
    """A trip the parent could not publish is the parent's to send: a child sending it
    too (as its own report, under its own identity) counted twice toward a quorum."""
    parent = fleet.add(open_for=30.0)
    trip_while_redis_is_down(parent, redis_server)
    assert _forked_exit_code(_report_unsent, parent) == 0  # nothing of the parent's to send


@pytest.mark.anyio
async def test_async_election(fleet: Fleet) -> None:
    """The async path wins the fleet probe without blocking (asyncio client / trio thread)."""
    a, b = fleet.add(open_for=0.1), fleet.add(open_for=0.1)
    heard = opened_event(b)
    for _ in range(2):
        with pytest.raises(Boom):
            a.call(boom)
    assert heard.wait(3)
    time.sleep(0.15)

    async def probe() -> str:
        return "ok"

    assert await b.call_async(probe) == "ok"
    assert b.state is CircuitState.CLOSED
    assert b.shared is not None
    assert b.shared.statistics()["won"] == 1


def one_failure_trips(
    redis_server: RedisServer, name: str, *, timeout: float, **options: Any
) -> CircuitBreaker:
    """A lone shared breaker that one failure opens, subscribed to its fleet channel."""
    breaker = CircuitBreaker(
        name=name,
        backend=RedisBackend.from_url(redis_server.url, timeout=timeout),
        failure_rate=None,
        consecutive_failures=1,
        **options,
    )
    assert wait_for(lambda: breaker.shared is not None and breaker.shared.connected)
    return breaker


def test_a_failed_poll_is_one_backend_error(fleet: Fleet, redis_server: RedisServer) -> None:
    """Redis not answering a poll is one error and one fallback, as the connection lost.
    (The poll reported its failure, and the subscriber reported it again.)"""
    a = fleet.add(sync_interval=0.2)
    assert a.shared is not None
    fallbacks: list[rs.Event] = []
    a.add_listener(lambda e: fallbacks.append(e) if isinstance(e, rs.BackendFallback) else None)
    redis_server.pause()
    try:
        assert wait_for(lambda: a.shared is not None and not a.shared.connected, timeout=5)
        stats = a.shared.statistics()
    finally:
        redis_server.resume()
    assert len(fallbacks) == 1
    assert stats["backend_errors"] == 1
    assert stats["fallback_decisions"] == 1


def test_paused_redis_costs_at_most_one_backend_timeout(redis_server: RedisServer) -> None:
    """A hung Redis (SIGSTOP): the election gives up after the backend timeout, once."""
    breaker = one_failure_trips(redis_server, "paused", timeout=0.05, open_for=0.05)
    assert breaker.shared is not None
    try:
        redis_server.pause()
        with pytest.raises(Boom):
            breaker.call(boom)
        time.sleep(0.06)
        slowest = 0.0
        for _ in range(3):  # the probe, then closed calls
            started = time.monotonic()
            assert breaker.call(lambda: "ok") == "ok"
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < 1.0  # one election bounded by the 50 ms timeout, generously
        assert breaker.state is CircuitState.CLOSED
        assert breaker.shared.statistics()["backend_errors"] >= 1
    finally:
        redis_server.resume()
        breaker.shared.close()


@pytest.mark.anyio
async def test_a_probe_cancelled_during_its_election_frees_the_half_open_slot(
    redis_server: RedisServer,
) -> None:
    """The first half-open probe of a shared breaker asks Redis for the fleet probe; if
    it is cancelled while that round trip hangs, its probe slot is given back (it stayed
    taken, and the breaker refused every call until another process spoke)."""
    clock = rs.testing.FakeClock()
    breaker = one_failure_trips(
        redis_server, "cancelled-election", timeout=2.0, open_for=10, clock=clock
    )
    assert breaker.shared is not None
    try:
        with pytest.raises(Boom):
            breaker.call(boom)
        clock.advance(10)
        assert breaker.state is CircuitState.HALF_OPEN

        async def probe() -> str:
            return "ok"

        redis_server.pause()
        try:
            with anyio.move_on_after(0.1) as scope:
                await breaker.call_async(probe)
            assert scope.cancelled_caught
        finally:
            redis_server.resume()
        assert breaker.statistics().half_open_in_flight == 0
        assert await breaker.call_async(probe) == "ok"
        assert breaker.state is CircuitState.CLOSED
    finally:
        breaker.shared.close()


def _trips_at_once(backend: RedisBackend, name: str, **options: Any) -> CircuitBreaker:
    """A shared breaker that opens at its first failure."""
    return CircuitBreaker(
        name=name, backend=backend, failure_rate=None, consecutive_failures=1, **options
    )


def _breaker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("resilience-breaker-")]


def test_a_dropped_shared_breaker_is_collected_and_its_threads_stop(
    redis_server: RedisServer,
) -> None:
    """A shared breaker that tripped (so published) and was then dropped without close():
    it is collected and the backend's subscriber and publisher threads stop (the
    publisher used to keep its last job, hence the breaker, alive for good)."""
    import gc
    import weakref

    before = set(_breaker_threads())
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    breaker = _trips_at_once(backend, "dropped", sync_interval=0.1)
    with pytest.raises(Boom):
        breaker.call(boom)
    shared = breaker.shared
    assert shared is not None
    deadline = time.monotonic() + 3
    while shared.statistics()["published"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert set(_breaker_threads()) - before  # this backend's two threads
    gone = weakref.ref(breaker)
    del breaker, shared
    # "published" counts inside the job, so the publisher thread may hold the job (and
    # the breaker) for a moment more: wait for it to let go rather than race it.
    assert wait_for(lambda: gc.collect() >= 0 and gone() is None)
    assert wait_for(lambda: set(_breaker_threads()) <= before)
    backend_gone = weakref.ref(backend)  # the stopped hub let go of it too
    del backend
    gc.collect()
    assert backend_gone() is None


def test_publishes_of_one_key_coalesce(redis_server: RedisServer) -> None:
    """Transitions faster than the publisher thread publishes keep one pending publish
    per key (the newest state), so the queue stays bounded however fast keys trip."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    breaker = _trips_at_once(backend, "busy", key=lambda k: k)
    shared = breaker.shared
    assert shared is not None
    hub = shared._hub
    gate = threading.Event()
    hub.submit(("busy", "gate"), gate.wait)  # holds the publisher thread
    try:
        for _ in range(200):
            for key in ("a", "b"):
                breaker.open(key)
                breaker.close(key)
        assert len(hub._pending) <= 3  # the gate, and one publish each for "a" and "b"
    finally:
        gate.set()
    assert wait_for(lambda: not hub._pending)
    shared.close()
    backend.close()


def test_a_breaker_joining_a_hub_that_just_stopped_gets_a_new_one(
    redis_server: RedisServer,
) -> None:
    """The backend's hub stops when its last breaker goes; a breaker that picked that hub
    just before joins a new one instead of one whose threads are gone (it would never
    publish nor hear the fleet)."""
    backend = RedisBackend.from_url(redis_server.url, timeout=1.0)
    breaker = CircuitBreaker(name="joiner", backend=backend, consecutive_failures=1)
    shared = breaker.shared
    assert shared is not None
    stale = shared._hub
    stale.stop()  # as if its last member had gone just before this breaker joined
    shared.start()
    assert shared._hub is not stale
    assert not shared._hub.stopped
    assert wait_for(lambda: shared.connected)
    shared.close()
    backend.close()
