"""The per-host table: bounded in size and idle time, whatever the keys."""

from __future__ import annotations

from collections.abc import Hashable

import httpx
from hypothesis import given
from hypothesis import strategies as st

from resilience._http._hosts import HostTable
from resilience.httpx import ResilientTransport
from resilience.testing import FakeClock


class Entry:
    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.used = 0


@given(st.lists(st.integers(0, 200), max_size=400), st.integers(1, 50))
def test_the_table_never_exceeds_max_keys(keys: list[int], max_keys: int) -> None:
    """Attacker-chosen keys cannot grow the table beyond its bound; lookups always answer."""
    table = HostTable(Entry, max_keys=max_keys, idle_ttl=600.0, clock=FakeClock())
    for key in keys:
        assert table.get(key).key == key
        assert len(table) <= max_keys


def test_a_hot_entry_survives_eviction() -> None:
    """Least recently used first: an entry in use outlives a flood of new keys."""
    table = HostTable(Entry, max_keys=10, idle_ttl=600.0, clock=FakeClock())
    hot = table.get("hot")
    for key in range(100):
        table.get(key)
        assert table.get("hot") is hot


def test_idle_entries_are_dropped() -> None:
    """An entry unused for two idle periods is forgotten; a used one is kept."""
    clock = FakeClock()
    table = HostTable(Entry, max_keys=100, idle_ttl=10.0, clock=clock)
    table.get("idle")
    busy = table.get("busy")
    for _ in range(3):
        clock.advance(10.0)
        assert table.get("busy") is busy
        table.get(f"new-{clock.monotonic()}")  # inserts run the sweeps
    assert "idle" not in table
    assert "busy" in table


def test_transport_state_is_bounded_per_host() -> None:
    """A transport meeting many hosts tracks at most max_hosts of them."""
    transport = ResilientTransport(
        httpx.MockTransport(lambda request: httpx.Response(200)), max_hosts=8
    )
    for n in range(50):
        transport.handle_request(httpx.Request("GET", f"http://host-{n}.test/"))
    assert transport.statistics().hosts <= 8


def test_a_per_host_breaker_keeps_no_more_hosts_than_max_hosts() -> None:
    """breaker=True keeps its per-host windows within max_hosts too (it kept 10,000
    hosts whatever max_hosts said): 3,000 hosts at max_hosts=8 leave little behind."""
    import gc
    import tracemalloc

    transport = ResilientTransport(
        httpx.MockTransport(lambda request: httpx.Response(200)), breaker=True, max_hosts=8
    )
    transport.handle_request(httpx.Request("GET", "http://warm.test/"))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(3000):
            transport.handle_request(httpx.Request("GET", f"http://host-{n}.test/"))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert transport.statistics().hosts <= 8
    assert grown < 500_000  # the 3,000 breaker windows it kept took 7.6 MB
