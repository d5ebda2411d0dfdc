"""Per-key state is reference-counted: a million distinct keys leave nothing behind."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import resilience as rs

pytestmark = pytest.mark.timeout(60)

KEYS = 1_000_000
BATCH = 10_000  # held at once, so the per-key map really grows before it empties


def test_a_million_distinct_keys_leave_the_map_empty_and_memory_at_baseline() -> None:
    """Acquire and release 1,000,000 keys (10,000 held at a time): memory returns."""
    bulkhead = rs.Bulkhead(2)
    acquire = bulkhead.acquire_nowait
    # Warm up every code path once so that lazily created objects are not counted.
    for key in range(2 * BATCH):
        acquire(key).release()
    gc.collect()
    tracemalloc.start()
    try:
        baseline = _held_by_this_bulkhead_s_code()
        peak_keys = 0
        for start in range(0, KEYS, BATCH):
            held = [acquire(key) for key in range(start, start + BATCH)]
            peak_keys = max(peak_keys, bulkhead.statistics().keys)
            for permit in held:
                permit.release()
            del held
        gc.collect()
        after = _held_by_this_bulkhead_s_code()
    finally:
        tracemalloc.stop()
    assert peak_keys == BATCH
    stats = bulkhead.statistics()
    assert (stats.in_flight, stats.waiting, stats.keys) == (0, 0, 0)
    assert after - baseline < 16 * 1024, f"{after - baseline} bytes not returned"


def _held_by_this_bulkhead_s_code() -> int:
    """Bytes allocated by the in-process bulkhead's modules and still held: not the whole
    process's, which background threads of earlier tests (a keeper reconciling with a
    Redis that a test killed) change at any time."""
    local = [
        tracemalloc.Filter(True, f"*/resilience/bulkhead/{name}")
        for name in ("_bulkhead.py", "_slots.py", "_permit.py", "_waiters.py")
    ]
    snapshot = tracemalloc.take_snapshot().filter_traces(local)
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_keyed_decorator_drops_idle_keys() -> None:
    """The decorator path drops a key as soon as its last holder leaves."""
    bulkhead = rs.Bulkhead(1, key=lambda host: host)
    fetch = bulkhead(lambda host: bulkhead.statistics().keys)
    assert [fetch(f"host-{i}") for i in range(100)] == [1] * 100
    assert bulkhead.statistics().keys == 0
