"""A worker process of the fleet test: one shared breaker, driven by commands on a pipe.

Times are ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process on Linux),
so the parent can compare when one process tripped and when the others heard it.
"""

from __future__ import annotations

import time
from typing import Any

OPEN_FOR = 0.5


class Boom(Exception):
    """A failure of the protected dependency."""


def worker(conn: Any, url: str, index: int) -> None:
    """Serve commands until "stop"; every reply is a tuple."""
    import resilience as rs
    from resilience.backends import RedisBackend
    from resilience.breaker import BreakerStateChanged, CircuitBreaker, CircuitState

    breaker = CircuitBreaker(
        name="fleet",
        backend=RedisBackend.from_url(url, timeout=0.5),  # loaded CI machines
        failure_rate=None,
        consecutive_failures=3,
        open_for=OPEN_FOR,
        sync_interval=30.0,
    )
    changes: list[tuple[str, str, float]] = []
    breaker.add_listener(
        lambda e: (
            changes.append((e.new, e.reason, time.monotonic()))
            if isinstance(e, BreakerStateChanged)
            else None
        )
    )
    shared = breaker.shared
    assert shared is not None

    def boom() -> None:
        raise Boom

    def first_change(state: str, timeout: float = 3.0) -> tuple[str, float] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for new, reason, at in changes:
                if new == state:
                    return reason, at
            time.sleep(0.001)
        return None

    deadline = time.monotonic() + 10
    while not shared.connected and time.monotonic() < deadline:
        time.sleep(0.005)
    conn.send(("ready", shared.connected))
    while True:
        command, *args = conn.recv()
        if command == "mark":
            changes.clear()
            conn.send(("marked",))
        elif command == "ok":
            for _ in range(args[0]):
                breaker.call(int)
            conn.send(("done", breaker.state.value))
        elif command == "trip":
            for _ in range(3):
                try:
                    breaker.call(boom)
                except Boom:
                    pass
            conn.send(("tripped", time.monotonic(), breaker.state.value))
        elif command == "heard":
            seen = first_change("open")
            try:
                breaker.call(int)
                rejected = False
            except rs.CircuitOpen:
                rejected = True
            conn.send(("heard", seen, rejected))
        elif command == "probe":
            at = args[0]
            time.sleep(max(0.0, at - time.monotonic()))

            def probe() -> str:
                time.sleep(0.2)  # the probe is in flight while the others try
                return "ran"

            try:
                outcome = breaker.call(probe)
            except rs.CircuitOpen:
                outcome = "rejected"
            closed = first_change("closed")
            conn.send(("probe", outcome, closed is not None, breaker.state.value))
        elif command == "chaos":
            # Redis was killed: trip, reject, cool down, probe: all on the local breaker.
            changes.clear()
            slowest = 0.0
            results = []
            for step in range(8):
                started = time.monotonic()
                try:
                    breaker.call(boom if step < 3 else int)
                    results.append("ok")
                except Boom:
                    results.append("failed")
                except rs.CircuitOpen:
                    results.append("rejected")
                slowest = max(slowest, time.monotonic() - started)
            time.sleep(OPEN_FOR + 0.05)
            started = time.monotonic()
            results.append(str(breaker.call(lambda: "probe")))
            slowest = max(slowest, time.monotonic() - started)
            conn.send(("chaos", results, slowest, breaker.state is CircuitState.CLOSED))
        elif command == "stop":
            shared.close()
            conn.send(("stopped",))
            return
