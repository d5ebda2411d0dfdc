"""Rate limiting (issue 3): ours against limits, pyrate-limiter, aiolimiter and raw Redis.

Sections:

* **memory, sync**: an admitted call through ``@rs.RateLimiter`` (unkeyed and keyed),
  ``try_acquire`` and the peers' admitted calls (limits fixed/moving window,
  pyrate-limiter), as overhead over a bare call. Target: <= 0.8 µs.
* **memory, async**: ``@rs.RateLimiter`` on an ``async def`` vs ``aiolimiter``.
  Target: <= 1.0 µs.
* **Redis, sequential sync**: one decision per call vs redis-py's raw ``EVALSHA`` of a
  trivial script (``return 1``), the ceiling for one round trip. Also the raw EVALSHA
  of our own GCRA script and limits' Redis storage. Target: <= 1.05x the ceiling.
* **Redis, asyncio, 64 tasks**: throughput of 64 concurrent tasks vs the same number
  of tasks doing raw ``redis.asyncio`` ``EVALSHA`` of the trivial script.
  Target: >= 0.9x the ceiling's throughput.
* **denial cache**: repeat refusals, with the EVALSHA count from ``INFO commandstats``.

Every limiter admits everything (a huge rate) except in the denial-cache section.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import resilience as rs

from ._harness import Report, measure, measure_async

HUGE = rs.Rate(10**6, 1.0)  # 1 µs per token, burst 10^6: never refuses in a run
TASKS = 64


def _bare() -> int:
    return 1


async def _abare() -> int:
    return 1


def _memory_sync(report: Report, number: int) -> None:
    import limits
    import limits.storage
    import limits.strategies
    import pyrate_limiter

    unkeyed = rs.RateLimiter(HUGE)(_bare)
    keyed_limiter = rs.RateLimiter(HUGE, key=lambda host: host)
    keyed = keyed_limiter(lambda host: 1)
    direct = rs.RateLimiter(HUGE)

    item = limits.RateLimitItemPerSecond(10**9)
    fixed = limits.strategies.FixedWindowRateLimiter(limits.storage.MemoryStorage())
    moving = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
    pyrate = pyrate_limiter.Limiter(pyrate_limiter.Rate(10**9, pyrate_limiter.Duration.SECOND))

    def limits_fixed() -> int:
        if fixed.hit(item, "k"):
            return _bare()
        raise RuntimeError

    def limits_moving() -> int:
        if moving.hit(item, "k"):
            return _bare()
        raise RuntimeError

    spread_keys = itertools.cycle([f"k{i}" for i in range(1000)])

    def limits_moving_spread() -> int:
        if moving.hit(item, next(spread_keys)):
            return _bare()
        raise RuntimeError

    def pyrate_call() -> int:
        if pyrate.try_acquire("k", blocking=False):
            return _bare()
        raise RuntimeError

    cases: dict[str, Callable[[], object]] = {
        "bare call": _bare,
        "rs.RateLimiter decorator (unkeyed)": unkeyed,
        "rs.RateLimiter(key=host) decorator": lambda: keyed("example.com"),
        "rs.RateLimiter.try_acquire()": direct.try_acquire,
        "limits FixedWindowRateLimiter.hit + call": limits_fixed,
        "limits MovingWindowRateLimiter.hit + call": limits_moving,
        "limits MovingWindowRateLimiter.hit + call, 1000 keys": limits_moving_spread,
        "pyrate-limiter Limiter.try_acquire + call": pyrate_call,
    }
    results = measure(cases, number=number, rounds=report.rounds)
    bare = results["bare call"]
    section = report.section("Rate limiter, memory, sync admitted call (issue 3)", "a bare call")
    for name, value in results.items():
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=0.8 if name == "rs.RateLimiter decorator (unkeyed)" else None,
            ours=name.startswith("rs.") or name == "bare call",
        )
    section.notes.append(
        "The `key=` lambda of the keyed case (about 0.1 µs) is part of the measured call; "
        "the peers' wrapper functions (hit, then call) are too. limits' moving window "
        "keeps every hit of the last window in a list per key, so one key hit at full "
        "speed is its worst case; the 1000-key row spreads the same hits."
    )


def _memory_async(report: Report, number: int) -> None:
    import aiolimiter

    unkeyed = rs.RateLimiter(HUGE)(_abare)
    keyed_limiter = rs.RateLimiter(HUGE, key=lambda host: host)

    @keyed_limiter
    async def keyed(host: str) -> int:
        return 1

    direct = rs.RateLimiter(HUGE)
    state: dict[str, Any] = {}

    async def aiolimiter_call() -> int:
        limiter = state.get("aio")
        if limiter is None:  # bound to the running loop: made inside it
            limiter = state["aio"] = aiolimiter.AsyncLimiter(10**9, 1)
        async with limiter:
            return await _abare()

    async def keyed_call() -> int:
        return await keyed("example.com")

    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "bare async call": _abare,
        "rs.RateLimiter decorator (unkeyed), async": unkeyed,
        "rs.RateLimiter(key=host) decorator, async": keyed_call,
        "rs.RateLimiter.try_acquire_async()": direct.try_acquire_async,
        "aiolimiter AsyncLimiter: async with + call": aiolimiter_call,
    }
    results = measure_async(cases, number=number, rounds=report.rounds)
    bare = results["bare async call"]
    section = report.section(
        "Rate limiter, memory, async admitted call (issue 3)", "a bare async call"
    )
    for name, value in results.items():
        section.add(
            name,
            value,
            baseline_s=bare,
            target_us=1.0 if name == "rs.RateLimiter decorator (unkeyed), async" else None,
            ours=name.startswith("rs.") or name == "bare async call",
        )


def _ratio_row(section: Any, name: str, value: float, ceiling: float, limit: float) -> None:
    ratio = value / ceiling
    section.add(
        name,
        value,
        target_text=f"<= {limit:g}x ceiling",
        met=ratio <= limit,
        note=f"{ratio:.3f}x the ceiling",
    )


def _on_redis(*limiters: rs.RateLimiter) -> None:
    """Refuse a run whose limiters decided in memory (``on_backend_error="local"``
    answers from the in-process twin while Redis fails: a fast, wrong measurement)."""
    for limiter in limiters:
        stats = limiter.statistics()
        if stats.backend_errors or stats.fallback_decisions or not stats.round_trips:
            raise RuntimeError(f"{limiter.name}: the run did not decide on Redis: {stats}")


def _redis_sync(report: Report, server: Any, number: int) -> None:
    import limits
    import limits.storage
    import limits.strategies
    import redis

    from resilience.backends import RedisBackend
    from resilience.ratelimit._redis import GCRA_LUA

    raw = redis.Redis.from_url(server.url)
    trivial = raw.script_load("return 1")
    gcra = raw.script_load(GCRA_LUA)
    backend = RedisBackend.from_url(server.url, timeout=1.0)
    limiter = rs.RateLimiter(HUGE, backend=backend, name="bench")
    decorating = rs.RateLimiter(HUGE, backend=backend, name="bench-dec")
    decorated = decorating(_bare)
    call = limiter._buckets.primary._call("k", 1, 0)  # the same key and arguments as ours
    storage = limits.storage.RedisStorage(server.url)
    fixed = limits.strategies.FixedWindowRateLimiter(storage)
    item = limits.RateLimitItemPerSecond(10**9)

    lean_trivial = backend.script("return 1")
    cases: dict[str, Callable[[], object]] = {
        "raw redis-py EVALSHA 'return 1' (ceiling)": lambda: raw.evalsha(trivial, 0),
        "EVALSHA 'return 1' on our client path (RedisScript.run)": lambda: lean_trivial.run([]),
        "raw redis-py EVALSHA of our gcra.lua": lambda: raw.evalsha(
            gcra, 1, *call.keys, *call.args
        ),
        "rs.RateLimiter(backend=redis).try_acquire(key)": lambda: limiter.try_acquire("k"),
        "rs.RateLimiter(backend=redis) decorator": decorated,
        "limits FixedWindowRateLimiter.hit (RedisStorage)": lambda: fixed.hit(item, "k"),
    }
    # Round trips vary with whatever else the host runs: many short interleaved rounds.
    results = measure(cases, number=number, rounds=max(report.rounds, 15))
    _on_redis(limiter, decorating)
    ceiling = results["raw redis-py EVALSHA 'return 1' (ceiling)"]
    section = report.section(
        "Rate limiter on Redis, sequential sync (issue 3)",
        "redis-py `evalsha` of a trivial script on the same server (one round trip)",
    )
    for name, value in results.items():
        if name.startswith("rs."):
            _ratio_row(section, name, value, ceiling, 1.05)
        else:
            section.add(name, value, ours=False, note=f"{value / ceiling:.3f}x the ceiling")
    lean = results["EVALSHA 'return 1' on our client path (RedisScript.run)"]
    ours = results["rs.RateLimiter(backend=redis).try_acquire(key)"]
    section.notes.append(
        "Each decision of ours is one EVALSHA of gcra.lua (TIME, GET, SET PX): heavier on "
        "the server than `return 1`; the client side sends pre-packed commands on its own "
        "connections, skipping redis-py's per-command dispatch. The target (issue 3) is "
        "against redis-py's round trip; against `return 1` on our own client path, a "
        f"decision measures {ours / lean:.2f}x (the script's server work and the "
        "decision code)."
    )
    backend.close()


async def _tasks(fn: Callable[[], Awaitable[object]], per_task: int) -> float:
    async def worker() -> None:
        for _ in range(per_task):
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return (time.perf_counter() - started) / (TASKS * per_task)


def _redis_async(report: Report, server: Any, per_task: int) -> None:
    import limits
    import limits.aio.storage
    import limits.aio.strategies
    import redis.asyncio

    from resilience.backends import RedisBackend

    async def main() -> dict[str, float]:
        raw = redis.asyncio.Redis.from_url(server.url)
        trivial = await raw.script_load("return 1")
        backend = RedisBackend.from_url(server.url, timeout=1.0)
        limiter = rs.RateLimiter(HUGE, backend=backend, name="bench-async")
        decorating = rs.RateLimiter(HUGE, backend=backend, name="bench-async-dec")
        decorated = decorating(_abare)
        # The peer the issue names: limits' fixed window through its redis-py bridge.
        storage = limits.aio.storage.RedisStorage("async+" + server.url, implementation="redispy")
        fixed = limits.aio.strategies.FixedWindowRateLimiter(storage)
        item = limits.RateLimitItemPerSecond(10**9)

        lean_trivial = backend.script("return 1")

        async def ceiling() -> object:
            return await raw.evalsha(trivial, 0)

        async def lean() -> object:
            return await lean_trivial.run_async([])

        async def ours() -> object:
            return await limiter.try_acquire_async("k")

        async def peer() -> object:
            return await fixed.hit(item, "k")

        cases = {
            "raw redis.asyncio EVALSHA 'return 1' (ceiling)": ceiling,
            "EVALSHA 'return 1' on our client path (RedisScript.run_async)": lean,
            "rs.RateLimiter(backend=redis).try_acquire_async(key)": ours,
            "rs.RateLimiter(backend=redis) async decorator": decorated,
            "limits.aio FixedWindowRateLimiter.hit (RedisStorage, redis-py)": peer,
        }
        for fn in cases.values():  # warm up: connections for every task
            await _tasks(fn, 5)
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(max(3, report.rounds // 2)):
            for name, fn in cases.items():
                samples[name].append(await _tasks(fn, per_task))
        _on_redis(limiter, decorating)
        await raw.aclose()
        await backend.aclose()
        return {name: statistics.median(values) for name, values in samples.items()}

    results = asyncio.run(main())
    ceiling = results["raw redis.asyncio EVALSHA 'return 1' (ceiling)"]
    section = report.section(
        f"Rate limiter on Redis, asyncio, {TASKS} concurrent tasks (issue 3)",
        f"{TASKS} tasks doing redis.asyncio `evalsha` of a trivial script (throughput ceiling)",
    )
    for name, value in results.items():
        throughput = ceiling / value
        if name.startswith("rs."):
            section.add(
                name,
                value,
                target_text=">= 0.9x ceiling throughput",
                met=throughput >= 0.9,
                note=f"{throughput:.3f}x the ceiling's throughput",
            )
        elif name.startswith("limits"):
            section.add(name, value, ours=False, note=f"{throughput:.3f}x the ceiling's throughput")
        else:
            section.add(name, value, ours=False, note="per call = wall time / calls")
    lean_s = results["EVALSHA 'return 1' on our client path (RedisScript.run_async)"]
    ours_s = results["rs.RateLimiter(backend=redis).try_acquire_async(key)"]
    section.notes.append(
        "The target (issue 3) is against redis.asyncio. Ours runs scripts on its own "
        "lean connections (no per-command task or pool lock): against `return 1` on that "
        f"path, a decision reaches {lean_s / ours_s:.2f}x its throughput."
    )


def _denial_cache(report: Report, server: Any, number: int) -> None:
    from resilience.backends import RedisBackend

    backend = RedisBackend.from_url(server.url, timeout=1.0)
    limiter = rs.RateLimiter("1/h", backend=backend, name="bench-denied")
    limiter.try_acquire("k")
    limiter.try_acquire("k")  # refused: cached
    server.reset_stats()
    results = measure({"refusal": lambda: limiter.try_acquire("k")}, number=number, rounds=3)
    calls = 3 * number + min(number, 1000)
    evalsha = server.commandstats().get("evalsha", 0)
    section = report.section(
        "Rate limiter on Redis, repeat refusals (denial cache, issue 3)", "none"
    )
    section.add(
        "rs.RateLimiter(backend=redis): repeat refusal",
        results["refusal"],
        target_text="0 round trips",
        met=evalsha == 0,
        note=f"{calls} refusals, {evalsha} EVALSHA (INFO commandstats)",
    )
    backend.close()


def run(report: Report, quick: bool) -> None:
    """Measure every rate-limiting row of the issue's acceptance, peers in the same run."""
    number = 10_000 if quick else 20_000
    _memory_sync(report, number)
    _memory_async(report, number // 2)
    from resilience.testing import RedisServer, RedisUnavailable

    try:
        server = RedisServer().start()
    except RedisUnavailable as exc:
        report.section("Rate limiter on Redis (issue 3)", "skipped").notes.append(
            f"Redis unavailable: {exc}"
        )
        return
    try:
        _redis_sync(report, server, 500 if quick else 1_000)
        _redis_async(report, server, 20 if quick else 60)
        _denial_cache(report, server, 10_000)
    finally:
        server.stop()
