"""Four real processes share one breaker through a real Redis (issue 5 acceptance)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from resilience.testing import RedisServer

from ._fleet import OPEN_FOR, worker

pytestmark = pytest.mark.redis

PROCESSES = 4
# make chaos: repeat the trip / probe cycle; the default run does it once.
ROUNDS = 10 if os.environ.get("RESILIENCE_CHAOS_LONG") == "1" else 1


class Workers:
    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conns = []
        self.procs = []
        for index in range(PROCESSES):
            parent, child = context.Pipe()
            proc = context.Process(target=worker, args=(child, url, index), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def ask(self, index: int, *command: Any, timeout: float = 15.0) -> Any:
        self.conns[index].send(command)
        return self.reply(index, timeout)

    def reply(self, index: int, timeout: float = 15.0) -> Any:
        conn = self.conns[index]
        if not conn.poll(timeout):
            raise AssertionError(f"worker {index} did not answer within {timeout}s")
        return conn.recv()

    def all(self, *command: Any, timeout: float = 15.0) -> list[Any]:
        for conn in self.conns:
            conn.send(command)
        return [self.reply(index, timeout) for index in range(PROCESSES)]

    def stop(self) -> None:
        for index, proc in enumerate(self.procs):
            if proc.is_alive():
                try:
                    self.conns[index].send(("stop",))
                    self.conns[index].poll(3)
                except (OSError, EOFError):
                    pass
            proc.join(3)
            if proc.is_alive():
                proc.kill()
                proc.join(3)


def trip_and_probe(workers: Workers) -> None:
    """One process trips, the others follow; after the cool-down exactly one probes."""
    assert workers.all("mark") == [("marked",)] * PROCESSES
    # Process 0 trips; the three others hear it and reject.
    _, tripped_at, state = workers.ask(0, "trip")
    assert state == "open"
    lags = []
    for index in range(1, PROCESSES):
        _, seen, rejected = workers.ask(index, "heard")
        assert seen is not None, f"process {index} never opened"
        reason, at = seen
        assert reason == "remote"
        assert rejected
        lags.append(at - tripped_at)
    print(f"propagation lags (ms): {[round(lag * 1000, 2) for lag in lags]}")
    assert max(lags) < 0.1, f"propagation lags {lags}"

    # After the cool-down, all four try at the same instant: exactly one probe runs,
    # and its success closes everybody.
    start_at = time.monotonic() + OPEN_FOR + 0.1
    replies = workers.all("probe", start_at)
    outcomes = sorted(reply[1] for reply in replies)
    assert outcomes == ["ran", "rejected", "rejected", "rejected"]
    assert all(reply[2] for reply in replies), replies
    assert [reply[3] for reply in replies] == ["closed"] * 4


@pytest.fixture
def workers(redis_server: RedisServer) -> Iterator[Workers]:
    group = Workers(redis_server.url)
    try:
        yield group
    finally:
        group.stop()


def test_four_processes_share_one_breaker(workers: Workers, redis_server: RedisServer) -> None:
    """One trips and the others reject within 100 ms; one probe fleet-wide; no command per
    CLOSED call; Redis killed mid-run: every process keeps working on its own breaker.
    """
    assert [workers.reply(i, timeout=60) for i in range(PROCESSES)] == [("ready", True)] * 4

    # The CLOSED happy path costs no Redis command.
    redis_server.reset_stats()
    assert workers.all("ok", 2_000) == [("done", "closed")] * 4
    counts = redis_server.commandstats()
    # Only connection set-up (a pooled connection opened late) may appear, never per call.
    setup = ("config", "info", "hello", "client")
    assert {k: v for k, v in counts.items() if not k.startswith(setup)} == {}
    assert sum(counts.values()) < 20

    for _ in range(ROUNDS):
        trip_and_probe(workers)

    # Redis dies mid-run: local breakers keep tripping, rejecting, probing; no hang.
    redis_server.kill()
    for _, results, slowest, closed in workers.all("chaos", timeout=20):
        assert results == ["failed"] * 3 + ["rejected"] * 5 + ["probe"]
        assert slowest < 0.5
        assert closed
