"""The distributed bulkhead on a Redis Cluster of 3 masters started by the test."""

from __future__ import annotations

import time

import pytest

import resilience as rs
from resilience.backends import RedisBackend
from resilience.testing import RedisServer

from ..ratelimit.test_redis_cluster import cluster

__all__ = ["cluster"]  # the fixture, shared with the rate limiter's cluster tests

pytestmark = pytest.mark.redis


def _node_of(bulkhead: rs.Bulkhead, cluster: list[RedisServer]) -> RedisServer:
    """The master that holds the bulkhead's slots (of its key ``None``)."""
    remote = bulkhead._remote
    assert remote is not None
    node = remote.backend.sync_client.get_node_from_key(remote.keys_for(None)[0])
    return next(server for server in cluster if server.port == node.port)


def test_a_stalled_node_does_not_cost_the_leases_on_a_healthy_one(
    cluster: list[RedisServer],
) -> None:
    """One backend covers every node of a cluster, and bulkheads' slots sit on different
    nodes. While one node is paused, its renewals fail and the others on it fail at once
    for a moment; a lease on a healthy node must still be renewed (a gate shared by the
    whole backend skipped its renewals until the lease was lost, and the slot was granted
    a second time)."""
    backend = RedisBackend.from_url(
        cluster[0].url, cluster=True, prefix=f"t{time.monotonic_ns()}", timeout=0.05
    )
    by_node: dict[int, rs.Bulkhead] = {}
    index = 0
    while len(by_node) < 2:
        bulkhead = rs.Bulkhead(
            60, backend=backend, name=f"b{index}", lease=1.0, on_lease_lost="event"
        )
        by_node.setdefault(_node_of(bulkhead, cluster).port, bulkhead)
        index += 1
    stalled_bulkhead, healthy_bulkhead = by_node.values()
    healthy = rs.Bulkhead(
        1, backend=backend, name=healthy_bulkhead.name, lease=1.0, on_lease_lost="event"
    )
    stalled_node = _node_of(stalled_bulkhead, cluster)
    assert _node_of(healthy, cluster) is not stalled_node
    held = [stalled_bulkhead.acquire_nowait() for _ in range(60)]
    kept = healthy.acquire_nowait()
    try:
        stalled_node.pause()
        try:
            time.sleep(3.0)  # three 1 s leases
        finally:
            stalled_node.resume()
        assert not kept.lost
        with pytest.raises(rs.BulkheadFull):
            healthy.acquire_nowait()
    finally:
        kept.release()
        for permit in held:
            permit.release()
        for bulkhead in (*by_node.values(), healthy):
            bulkhead.close()
        backend.close()
