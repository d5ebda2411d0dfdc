"""A worker process for the distributed-bulkhead chaos tests (run with ``python -m``).

``load``: W workers (threads or asyncio tasks) loop for D seconds over the keys: take a
lease, bump an independent per-key counter in Redis (INCR, recording the maximum seen),
hold a few milliseconds, DECR, release. Prints one JSON line of counts at the end.

``hold``: take one lease, print ``HELD``, and sleep until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time

import redis

import resilience as rs
from resilience.backends import RedisBackend

# INCR the per-key counter and keep its maximum in a sibling key: one atomic step.
ENTER = """
local v = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if v > m then redis.call('SET', KEYS[2], v) end
return v
"""


def counters(key: str) -> list[str]:
    """The independent counter of ``key`` and its maximum."""
    return [f"chaos:{{{key}}}:active", f"chaos:{{{key}}}:max"]


def barrier(client: redis.Redis, processes: int) -> None:
    """Start the load in every process at about the same time."""
    client.incr("chaos:ready")
    end = time.monotonic() + 30
    while int(client.get("chaos:ready") or 0) < processes:
        if time.monotonic() > end:
            raise SystemExit("barrier timed out")
        time.sleep(0.01)


def load(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(args.url, socket_timeout=5)
    enter = client.register_script(ENTER)
    backend = RedisBackend.from_url(args.url, timeout=1.0)
    bulkhead = rs.Bulkhead(
        args.limit,
        backend=backend,
        name="chaos",
        lease=args.lease,
        max_wait=args.max_wait,
        on_lease_lost="event",
        on_backend_error="closed",
    )
    lost: list[rs.Event] = []
    bulkhead.add_listener(lambda e: lost.append(e) if isinstance(e, rs.BulkheadLeaseLost) else None)
    keys = args.keys.split(",")
    counts = {"admitted": 0, "rejected": 0, "over": 0}
    lock = threading.Lock()

    def bump(name: str) -> None:
        with lock:
            counts[name] += 1

    def critical(key: str) -> None:
        if int(enter(keys=counters(key))) > args.limit:
            bump("over")
        time.sleep(random.uniform(0.001, 0.004))
        client.decr(counters(key)[0])

    barrier(client, args.processes)
    stop = time.monotonic() + args.duration

    def thread_worker() -> None:
        while time.monotonic() < stop:
            key = random.choice(keys)
            try:
                with bulkhead.acquire(key, priority=random.randint(0, 2)):
                    critical(key)
                bump("admitted")
            except rs.BulkheadFull:
                bump("rejected")

    async def task_worker() -> None:
        while time.monotonic() < stop:
            key = random.choice(keys)
            try:
                permit = await bulkhead.acquire_async(key, priority=random.randint(0, 2))
                async with permit:
                    # The counter uses a blocking client: run it off the loop.
                    await asyncio.to_thread(critical, key)
                bump("admitted")
            except rs.BulkheadFull:
                bump("rejected")

    if args.mode == "threads":
        threads = [threading.Thread(target=thread_worker) for _ in range(args.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:

        async def main() -> None:
            await asyncio.gather(*(task_worker() for _ in range(args.workers)))

        asyncio.run(main())
    counts["lost"] = len(lost)
    print(json.dumps(counts), flush=True)


def hold(args: argparse.Namespace) -> None:
    backend = RedisBackend.from_url(args.url, timeout=1.0)
    bulkhead = rs.Bulkhead(1, backend=backend, name="chaos-kill", lease=args.lease)
    permit = bulkhead.acquire(args.keys)  # kept referenced: a dropped permit is released
    print("HELD", flush=True)
    time.sleep(600)
    permit.release()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["load", "hold"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", default="threads", choices=["threads", "asyncio"])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--keys", default="k0,k1,k2")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--max-wait", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=2.0)
    args = parser.parse_args()
    if args.command == "load":
        load(args)
    else:
        hold(args)


if __name__ == "__main__":
    sys.exit(main())
