"""Chaos for the distributed Bulkhead: many processes, killed holders, a dying Redis.

Bounded by default (about 2 s of load); ``RESILIENCE_CHAOS_LONG=1`` runs the load for
30 s and the outage scenario for longer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

LONG = os.environ.get("RESILIENCE_CHAOS_LONG", "") not in ("", "0", "false", "no")
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 8
WORKERS = 8
KEYS = ("k0", "k1", "k2")
LIMIT = 5


def worker(url: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m tests.bulkhead._redis_worker`` with ``args``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bulkhead._redis_worker", *args, "--url", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_processes_of_eight_workers_never_exceed_the_limit(
    redis_server: RedisServer,
) -> None:
    """8 processes x 8 workers (threads and asyncio tasks) on 3 keys, limit 5 each.

    Each holder bumps an independent per-key counter in Redis while it holds its lease;
    the maximum that counter ever reached must stay <= 5.
    """
    duration = 30.0 if LONG else 2.0
    procs = [
        worker(
            redis_server.url,
            "load",
            "--mode",
            "threads" if index % 2 == 0 else "asyncio",
            "--workers",
            str(WORKERS),
            "--processes",
            str(PROCESSES),
            "--keys",
            ",".join(KEYS),
            "--limit",
            str(LIMIT),
            "--duration",
            str(duration),
        )
        for index in range(PROCESSES)
    ]
    totals: Counter[str] = Counter()
    for proc in procs:
        out, err = proc.communicate(timeout=duration + 90)
        assert proc.returncode == 0, err
        totals.update(json.loads(out.strip().splitlines()[-1]))
    maxima = {key: int(redis_server.command("GET", f"chaos:{{{key}}}:max") or 0) for key in KEYS}
    active = {key: int(redis_server.command("GET", f"chaos:{{{key}}}:active") or 0) for key in KEYS}
    print(f"\n8x8 load {duration:g}s: {dict(totals)}, max concurrency per key {maxima}")
    assert all(value <= LIMIT for value in maxima.values()), maxima
    assert totals["over"] == 0
    assert totals["lost"] == 0
    assert active == dict.fromkeys(KEYS, 0)
    assert totals["admitted"] > 100  # the load really ran
    assert max(maxima.values()) == LIMIT  # and really contended
    # Every lease was given back.
    bulkhead = rs.Bulkhead(LIMIT, backend=RedisBackend.from_url(redis_server.url), name="chaos")
    assert [bulkhead.statistics(key).shared_in_flight for key in KEYS] == [0, 0, 0]


def test_sigkilled_holder_frees_its_slot_within_lease_plus_one_second(
    redis_server: RedisServer,
) -> None:
    """A holder killed with SIGKILL stops renewing; its slot frees within lease + 1 s."""
    lease = 1.0
    proc = worker(redis_server.url, "hold", "--keys", "victim", "--lease", str(lease))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "HELD", proc.stderr.read() if proc.stderr else line
        bulkhead = rs.Bulkhead(
            1, backend=RedisBackend.from_url(redis_server.url), name="chaos-kill", lease=lease
        )
        time.sleep(lease)  # the holder renews meanwhile: the slot stays taken
        with pytest.raises(rs.BulkheadFull):
            bulkhead.acquire_nowait("victim")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        permit = bulkhead.acquire("victim", max_wait=10.0)
        freed = time.monotonic() - killed
        permit.release()
        print(f"\nSIGKILLed holder (lease {lease:g}s): slot free after {freed:.3f}s")
        assert freed <= lease + 1.0, f"slot freed {freed:.2f}s after SIGKILL"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.parametrize("failure", ["kill", "pause"])
def test_redis_outage_degrades_with_bounded_latency_and_comes_back(
    redis_server: RedisServer, failure: str
) -> None:
    """While Redis is killed or paused: "local" mode with local_limit respected (counting
    the calls still holding leases from before the outage) and every admitted call fast
    (backend timeout + twin wait, well under 1 s); afterwards the calls go to Redis
    again on their own."""
    timeout = 0.05
    outage = 5.0 if LONG else 1.0
    backend = RedisBackend.from_url(redis_server.url, timeout=timeout)
    bulkhead = rs.Bulkhead(4, backend=backend, name="outage", local_limit=2, max_wait=0.2)
    events: list[rs.Event] = []
    bulkhead.add_listener(events.append)
    lock = threading.Lock()
    active = Counter[str]()
    peak_local = 0
    latencies: list[float] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    # Set once calls that were on their way to Redis when it failed have settled.
    settled = threading.Event()

    def loop() -> None:
        nonlocal peak_local
        while not stop.is_set():
            started = time.monotonic()
            try:
                permit = bulkhead.acquire("k")
            except rs.BulkheadFull:
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            latencies.append(time.monotonic() - started)
            try:
                with lock:
                    active["k"] += 1
                    if settled.is_set() and not getattr(permit, "_registered", True):
                        # Admitted by the twin: everything this process runs is
                        # within local_limit (leases from before the outage count).
                        peak_local = max(peak_local, active["k"])
                time.sleep(0.002)
                with lock:
                    active["k"] -= 1
            finally:
                try:
                    permit.release()
                except rs.LeaseLost:
                    pass  # held across the outage: Redis forgot it

    threads = [threading.Thread(target=loop) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        latencies.clear()
        if failure == "kill":
            redis_server.kill()
        else:
            redis_server.pause()
        time.sleep(0.2)  # in-flight acquires and releases give up after the 50 ms timeout
        settled.set()
        time.sleep(outage - 0.2)
        settled.clear()
        outage_latencies = list(latencies)
        if failure == "kill":
            redis_server.start()
        else:
            redis_server.resume()
        restarted = time.monotonic()
        back = restarted + 5.0
        while bulkhead.statistics().backend["backend_healthy"] is not True:  # type: ignore[index]
            assert time.monotonic() < back, "did not return to Redis within 5 s"
            time.sleep(0.02)
        returned = time.monotonic()
        time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    print(
        f"\nRedis {failure}: {len(outage_latencies)} calls admitted during the outage, "
        f"max latency {max(outage_latencies or [0]) * 1000:.1f} ms, twin peak {peak_local}, "
        f"back on Redis {returned - restarted:.2f}s after restart"
    )
    assert not errors
    assert outage_latencies, "no call was admitted during the outage"
    # A probe pays the backend timeout, then the twin's max_wait: a generous bound that a
    # call hanging on the paused server (no timeout) would blow through.
    assert max(outage_latencies) < 1.0
    assert 0 < peak_local <= 2
    assert any(isinstance(e, rs.BackendFallback) for e in events)
    assert any(isinstance(e, rs.BackendRecovered) for e in events)
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    backend.close()


def test_an_acquire_redis_runs_after_a_long_pause_is_released(
    redis_server: RedisServer,
) -> None:
    """An acquire times out on a paused Redis, which runs it when it resumes, longer than
    a lease later. Its release is sent on recovery all the same, so the slot is free
    at once (the release used to be dropped as "expired by now", and the lease that
    Redis created at resume held the slot for a whole lease)."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    bulkhead = rs.Bulkhead(1, backend=backend, name="orphan", lease=1.0, on_backend_error="local")
    try:
        bulkhead.acquire_nowait("k").release()  # one pooled connection
        redis_server.pause()
        try:
            with bulkhead.acquire_nowait("k"):  # times out: a local slot
                pass
            time.sleep(1.3)  # longer than the lease
        finally:
            redis_server.resume()
        deadline = time.monotonic() + 0.8  # well within the 1 s lease
        while True:
            try:
                bulkhead.acquire_nowait("k").release()
                break
            except rs.BulkheadFull:
                assert time.monotonic() < deadline, "the orphan lease still holds the slot"
                time.sleep(0.05)
    finally:
        bulkhead.close()


def test_recovery_never_puts_one_process_over_the_limit(redis_server: RedisServer) -> None:
    """A local slot taken while Redis was down is still held when Redis returns (empty):
    until the keeper enters it in Redis, new grants count it, so this one process never
    holds more than ``max_concurrent`` (it held 3 of 2 in 7 of 10 runs)."""
    backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    bulkhead = rs.Bulkhead(
        2, backend=backend, name="over", lease=5.0, local_limit=1, on_backend_error="local"
    )
    held = []
    try:
        bulkhead.acquire_nowait("k").release()
        redis_server.kill()
        held.append(bulkhead.acquire_nowait("k"))  # the local twin's one slot
        redis_server.start()
        time.sleep(0.3)  # past the probe interval, before the keeper's next check
        for _ in range(3):
            try:
                held.append(bulkhead.acquire_nowait("k"))
            except rs.BulkheadFull:
                pass
        assert len(held) == 2
    finally:
        for permit in held:
            permit.release()
        bulkhead.close()


@pytest.mark.parametrize(
    ("bulkheads", "leases", "own_backends"), [(1, 60, False), (30, 2, False), (30, 2, True)]
)
def test_a_paused_redis_does_not_starve_another_backends_renewals(
    redis_server: RedisServer, bulkheads: int, leases: int, own_backends: bool
) -> None:
    """One keeper thread renews every lease. With 60 leases on a paused Redis, each
    renewal used to block it for the backend timeout in turn, so a lease on a second,
    healthy Redis was not renewed in time and was lost (its only slot granted again).
    After one renewal fails, the paused backend's others fail at once for a moment:
    those of every bulkhead on that backend (30 bulkheads, each blocking once in turn,
    used to starve the healthy lease as well, and so did 30 bulkheads each built with
    its own backend object for the same server)."""
    other_server = RedisServer().start()
    shared_backend = RedisBackend.from_url(redis_server.url, timeout=0.05)
    paused = [
        rs.Bulkhead(
            leases,
            backend=(
                RedisBackend.from_url(redis_server.url, timeout=0.05)
                if own_backends
                else shared_backend
            ),
            name=f"on-paused-{index}",
            lease=1.0,
            on_lease_lost="event",
        )
        for index in range(bulkheads)
    ]
    healthy = rs.Bulkhead(
        1,
        backend=RedisBackend.from_url(other_server.url, timeout=0.05),
        name="on-healthy",
        lease=1.0,
        on_lease_lost="event",
    )
    held = [bulkhead.acquire_nowait("k") for bulkhead in paused for _ in range(leases)]
    kept = healthy.acquire_nowait("k")
    try:
        redis_server.pause()
        try:
            time.sleep(2.5)  # well past the 1 s lease
        finally:
            redis_server.resume()
        assert not kept.lost
        with pytest.raises(rs.BulkheadFull):
            healthy.acquire_nowait("k")
    finally:
        kept.release()
        for permit in held:
            permit.release()
        for bulkhead in paused:
            bulkhead.close()
        healthy.close()
        other_server.stop()
