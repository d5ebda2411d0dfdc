"""RateLimiter behaviour through the public API, in memory, on virtual time."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

import resilience as rs
from resilience.testing import FakeClock


def test_refuses_after_the_burst_with_retry_after(fake_clock: FakeClock) -> None:
    """A 3/s limiter admits a burst of 3, then refuses with the exact time to the next token."""
    limiter = rs.RateLimiter("3/s", clock=fake_clock)
    assert [limiter.try_acquire().allowed for _ in range(4)] == [True, True, True, False]
    refused = limiter.try_acquire()
    assert not refused
    assert refused.retry_after == pytest.approx(1 / 3, abs=1e-6)
    assert refused.limit == 3
    assert refused.remaining == 0
    fake_clock.advance(refused.retry_after)
    assert limiter.try_acquire().allowed


def test_decision_fields_track_the_bucket(fake_clock: FakeClock) -> None:
    """remaining counts down, reset_after is the time until the bucket is full again."""
    limiter = rs.RateLimiter("10/s", burst=5, clock=fake_clock)
    first = limiter.try_acquire(cost=2)
    assert (first.allowed, first.remaining, first.retry_after, first.limit) == (True, 3, 0.0, 5)
    assert first.reset_after == pytest.approx(0.2)
    fake_clock.advance(0.1)
    peek = limiter.try_acquire(cost=0)
    assert peek.allowed
    assert peek.remaining == 4
    assert peek.reset_after == pytest.approx(0.1)
    assert limiter.try_acquire(cost=0).remaining == 4  # peeking takes nothing


def test_burst_defaults_to_amount_and_can_be_set() -> None:
    """burst defaults to the rate's amount."""
    assert rs.RateLimiter("7/min").burst == 7
    assert rs.RateLimiter("7/min", burst=1).burst == 1
    assert rs.RateLimiter(rs.Rate(5, 2)).rate == rs.Rate.parse("5/2s")


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"rate": "fast"}, "rate"),
        ({"rate": 5}, "rate"),
        ({"rate": "5/s", "burst": 0}, "burst"),
        ({"rate": "5/s", "max_wait": -1}, "max_wait"),
        ({"rate": "5/s", "on_backend_error": "maybe"}, "on_backend_error"),
        ({"rate": "5/s", "algorithm": "leaky"}, "algorithm"),
        ({"rate": "5/s", "backend": object()}, "backend"),
        ({"rate": "5/s", "local_rate": "garbage"}, "garbage"),
        ({"rate": "5/s", "clock": "x"}, "clock"),
        ({"rate": "5/s", "name": 5}, "name"),
        ({"rate": "5/s", "key": ["tenant"]}, "key must be hashable"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, object], word: str) -> None:
    """Bad configuration raises ConfigurationError naming the argument."""
    rate = kwargs.pop("rate")
    with pytest.raises(rs.ConfigurationError, match=word):
        rs.RateLimiter(rate, **kwargs)  # type: ignore[arg-type]


def test_cost_above_burst_is_refused_at_once(fake_clock: FakeClock) -> None:
    """A cost that can never be admitted raises ConfigurationError instead of waiting forever."""
    limiter = rs.RateLimiter("5/s", max_wait=60, clock=fake_clock)
    with pytest.raises(rs.ConfigurationError, match="exceeds the burst"):
        limiter.acquire(cost=6)
    with pytest.raises(rs.ConfigurationError):
        limiter.try_acquire(cost=-1)
    assert fake_clock.sleeps == []


def test_decorator_raises_rate_limited(fake_clock: FakeClock) -> None:
    """The decorated function is not called when refused; RateLimited carries retry_after."""
    calls = []
    limiter = rs.RateLimiter("2/s", clock=fake_clock)

    @limiter
    def work(x: int) -> int:
        calls.append(x)
        return x * 2

    assert work(1) == 2
    assert work(2) == 4
    with pytest.raises(rs.RateLimited) as info:
        work(3)
    assert calls == [1, 2]
    assert info.value.retry_after == pytest.approx(0.5)
    assert work.__name__ == "work"


def test_per_domain_key_function(fake_clock: FakeClock) -> None:
    """key= as a function of the call's arguments gives each domain its own bucket."""
    from urllib.parse import urlsplit

    limiter = rs.RateLimiter("1/s", key=lambda url: urlsplit(url).hostname, clock=fake_clock)
    fetch = limiter(lambda url: url)
    assert fetch("https://a.example/1")
    assert fetch("https://b.example/1")
    with pytest.raises(rs.RateLimited) as info:
        fetch("https://a.example/2")
    # The message says which key, and for how long (it said "rate limited" alone).
    assert str(info.value) == "RateLimiter: rate limited for 'a.example', retry after 1.000s"
    assert limiter.try_acquire("b.example").allowed is False
    assert limiter.try_acquire("c.example").allowed is True


def test_constant_key_is_the_default_key(fake_clock: FakeClock) -> None:
    """With a constant key, the decorator, `with` and try_acquire() share one bucket."""
    limiter = rs.RateLimiter("2/s", key="partner-api", clock=fake_clock)
    limiter(lambda: None)()
    with limiter:
        pass
    assert not limiter.try_acquire()
    assert limiter.try_acquire("another").allowed


def test_reservation_sleeps_exactly(fake_clock: FakeClock) -> None:
    """With max_wait, calls book the next slots and sleep exactly until them (no polling)."""
    limiter = rs.RateLimiter("4/s", burst=1, max_wait=1.0, clock=fake_clock)
    tick = limiter(lambda: fake_clock.monotonic())
    times = [tick() for _ in range(4)]
    assert times == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert fake_clock.sleeps == pytest.approx([0.25, 0.25, 0.25])
    assert limiter.statistics().waited == 3


def test_reservation_beyond_max_wait_is_refused_without_waiting(fake_clock: FakeClock) -> None:
    """A slot further away than max_wait is refused at once, and nothing is booked."""
    limiter = rs.RateLimiter("1/s", max_wait=0.5, clock=fake_clock)
    limiter.acquire()
    with pytest.raises(rs.RateLimited) as info:
        limiter.acquire()
    assert info.value.retry_after == pytest.approx(1.0)
    assert fake_clock.sleeps == []
    fake_clock.advance(0.6)
    assert limiter.acquire().wait == pytest.approx(0.4)


def test_waits_are_clamped_by_the_ambient_deadline(fake_clock: FakeClock) -> None:
    """Inside rs.deadline(), a reservation longer than the time left is refused."""
    limiter = rs.RateLimiter("1/s", max_wait=5.0, clock=fake_clock)
    limiter.acquire()
    with rs.deadline(0.5, clock=fake_clock), pytest.raises(rs.RateLimited):
        limiter.acquire()
    with rs.deadline(2.0, clock=fake_clock):
        assert limiter.acquire().wait == pytest.approx(1.0)


def test_context_manager_takes_a_token(fake_clock: FakeClock) -> None:
    """`with limiter:` takes one token and yields the Decision."""
    limiter = rs.RateLimiter("1/s", clock=fake_clock)
    with limiter as decision:
        assert decision.allowed
    with pytest.raises(rs.RateLimited), limiter:
        pass


def test_events_and_statistics(fake_clock: FakeClock) -> None:
    """Admissions emit CallAdmitted and refusals CallRejected (with key and
    retry_after), while anyone listens; both are counted either way."""
    limiter = rs.RateLimiter("1/s", key=lambda k: k, clock=fake_clock, name="api")
    events: list[rs.Event] = []
    limiter.add_listener(events.append)
    guarded = limiter(lambda k: k)
    guarded("alice")
    with pytest.raises(rs.RateLimited):
        guarded("alice")
    assert limiter.try_acquire("alice").allowed is False
    assert limiter.try_acquire("bob").allowed is True
    assert [type(e) for e in events] == [
        rs.CallAdmitted,
        rs.CallRejected,
        rs.CallRejected,
        rs.CallAdmitted,
    ]
    assert [e.key for e in events] == ["alice", "alice", "alice", "bob"]
    assert {e.policy for e in events} == {"api"}
    stats = limiter.statistics()
    assert (stats.admitted, stats.rejected, stats.keys) == (2, 2, 2)
    limiter.remove_listener(events.append)
    guarded("carol")
    assert len(events) == 4  # nobody listens: no event is built


@pytest.mark.anyio
@pytest.mark.parametrize(
    "make",
    [
        lambda clock: rs.RateLimiter("5/s", clock=clock),  # unkeyed, inlined decorator
        lambda clock: rs.RateLimiter("5/s", key=lambda: "k", clock=clock),  # keyed, inlined
        lambda clock: rs.RateLimiter("5/s", max_wait=1.0, clock=clock),  # reservations
    ],
)
async def test_every_admission_path_reports_decisions_and_waits(make: Any) -> None:
    """Decorators (sync and async), ``call``, ``with`` and ``try_acquire`` all report
    admissions; a reservation reports how long it waited."""
    from resilience.observability import samples

    clock = FakeClock()
    limiter = make(clock)
    seen: list[tuple[str, float, tuple[str, ...]]] = []
    limiter.add_listener(lambda e: seen.extend((s.name, v, labels) for s, v, labels in samples(e)))

    def decisions() -> list[str]:
        return [labels[1] for name, _, labels in seen if name == "resilience.decisions"]

    def waits() -> list[float]:
        return [v for name, v, _ in seen if name == "resilience.wait.duration"]

    sync = limiter(lambda: "ok")

    async def job() -> str:
        return "ok"

    assert sync() == "ok"
    assert await limiter(job)() == "ok"
    assert limiter.call(lambda: "ok") == "ok"
    with limiter:
        pass
    assert limiter.try_acquire(cost=1).allowed
    assert decisions() == ["admitted"] * 5
    assert waits() == [0.0] * 5
    # Empty the decorator's bucket: then a reservation waits, or a call is refused.
    for _ in range(5):
        if limiter.max_wait:
            sync()
        else:
            with contextlib.suppress(rs.RateLimited):
                sync()
    if limiter.max_wait:
        assert max(waits()) > 0
    else:
        assert decisions()[-1] == "rejected"


def test_threads_never_over_admit() -> None:
    """Many threads racing on one bucket with a frozen clock get exactly the burst."""
    clock = FakeClock()
    limiter = rs.RateLimiter("1000/h", clock=clock)
    unkeyed_admitted = []
    keyed = rs.RateLimiter("50/h", key=lambda: "k", clock=clock)
    keyed_admitted = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(400):
            unkeyed_admitted.append(limiter.try_acquire().allowed)
            try:
                keyed.call(lambda: keyed_admitted.append(True))
            except rs.RateLimited:
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(unkeyed_admitted) == 1000
    assert len(keyed_admitted) == 50


def test_pipeline_passes_arguments_to_the_key(fake_clock: FakeClock) -> None:
    """Inside a Pipeline the limiter still sees the call's arguments for its key."""
    limiter = rs.RateLimiter("1/s", key=lambda user: user, clock=fake_clock)
    handler = rs.Pipeline(rs.Fallback("busy"), limiter)(lambda user: f"hi {user}")
    assert handler("a") == "hi a"
    assert handler("b") == "hi b"
    assert handler("a") == "busy"


def test_methods_can_be_decorated(fake_clock: FakeClock) -> None:
    """Instance methods keep working; the key function sees self."""

    class Client:
        @rs.RateLimiter("1/s", key=lambda self, host: host, clock=fake_clock)
        def get(self, host: str) -> str:
            return host

    client = Client()
    assert client.get("a") == "a"
    assert client.get("b") == "b"
    with pytest.raises(rs.RateLimited):
        client.get("a")


@pytest.mark.anyio
async def test_async_decorator_and_context_manager() -> None:
    """Async functions, `async with` and try_acquire_async behave like their sync twins."""
    clock = FakeClock()
    limiter = rs.RateLimiter("2/s", clock=clock)

    @limiter
    async def work() -> str:
        return "done"

    assert await work() == "done"
    async with limiter as decision:
        assert decision.remaining == 0
    with pytest.raises(rs.RateLimited):
        await work()
    assert not await limiter.try_acquire_async()
    clock.advance(0.5)
    assert (await limiter.try_acquire_async()).allowed


@pytest.mark.anyio
async def test_async_reservation_sleeps_on_the_clock() -> None:
    """acquire_async sleeps through the injected clock for its reservation."""
    clock = FakeClock()
    limiter = rs.RateLimiter("10/s", burst=1, key=lambda d: d, max_wait=1, clock=clock)
    fetch = limiter(_echo)
    assert [await fetch("x") for _ in range(3)] == ["x", "x", "x"]
    assert clock.sleeps == pytest.approx([0.1, 0.1])
    with pytest.raises(rs.RateLimited):
        await limiter.acquire_async("x", max_wait=0.05)


async def _echo(value: str) -> str:
    return value


def test_reset_gives_a_key_its_full_burst_back() -> None:
    """``reset(key)`` refills that key's bucket and no other; ``reset()`` refills the
    unkeyed bucket the decorator uses."""
    clock = FakeClock()
    limiter = rs.RateLimiter("3/min", clock=clock)
    for _ in range(3):
        assert limiter.try_acquire("alice")
        assert limiter.try_acquire("bob")
    assert not limiter.try_acquire("alice")
    limiter.reset("alice")
    assert limiter.try_acquire("alice").remaining == 2
    assert not limiter.try_acquire("bob")

    @limiter
    def ping() -> str:
        return "pong"

    for _ in range(3):
        ping()
    with pytest.raises(rs.RateLimited):
        ping()
    limiter.reset()
    assert ping() == "pong"


def test_reset_refills_a_key_the_cap_evicted() -> None:
    """A key dropped by ``max_keys`` while not full starts from the eviction floor (never
    over-admitting); ``reset`` still makes it full."""
    from resilience.backends import MemoryBackend

    clock = FakeClock()
    limiter = rs.RateLimiter("1/min", clock=clock, backend=MemoryBackend(max_keys=1))
    assert limiter.try_acquire("a")
    assert limiter.try_acquire("b")  # evicts "a", not yet full
    assert not limiter.try_acquire("a")
    limiter.reset("a")
    assert limiter.try_acquire("a")


@pytest.mark.anyio
async def test_reset_async_in_memory() -> None:
    """``reset_async`` works on asyncio and trio."""
    limiter = rs.RateLimiter("1/min", clock=FakeClock())
    assert await limiter.try_acquire_async("k")
    assert not await limiter.try_acquire_async("k")
    await limiter.reset_async("k")
    assert await limiter.try_acquire_async("k")


class _GatedClock:
    """A clock whose reading pauses one chosen thread right after it reads the time,
    as a busy machine deschedules a thread between its clock read and its lock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.gate: tuple[int, threading.Event] | None = None
        self.read = threading.Event()

    def monotonic(self) -> float:
        now, gate = self.now, self.gate
        if gate is not None and gate[0] == threading.get_ident():
            self.gate = None
            self.read.set()
            gate[1].wait(5)
        return now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    async def sleep_async(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


@pytest.mark.parametrize("variant", ["sweep", "peek", "max_keys"])
def test_a_thread_acting_on_an_older_time_never_over_admits(variant: str) -> None:
    """ "1/s", burst 1. A thread reads t=0.5 and stalls; meanwhile, at t=1.0, the key is
    dropped as full (a new key's sweep, a peek, the ``max_keys`` cap). The stalled
    thread used to find it missing and take it as full: 3 admissions in 1.5 s, where
    burst + rate x 1.5 s = 2.5. The time is now read under the lock."""
    from resilience.backends import MemoryBackend

    clock = _GatedClock()
    backend = MemoryBackend(max_keys=1) if variant == "max_keys" else None
    limiter = rs.RateLimiter("1/s", burst=1, clock=clock, backend=backend)
    admitted = [limiter.try_acquire("k").allowed]  # t=0
    clock.now = 0.5
    go = threading.Event()
    results: dict[str, bool] = {}

    def stalled() -> None:
        clock.gate = (threading.get_ident(), go)
        results["stalled"] = limiter.try_acquire("k").allowed

    def at_one_second() -> None:
        if variant == "peek":
            limiter.try_acquire("k", cost=0)
        else:
            limiter.try_acquire("other")

    first = threading.Thread(target=stalled)
    first.start()
    assert clock.read.wait(5)
    clock.now = 1.0
    second = threading.Thread(target=at_one_second)
    second.start()
    second.join(0.2)  # with the fix it waits for the stalled thread's lock
    go.set()
    first.join(5)
    second.join(5)
    admitted.append(results["stalled"])
    admitted.append(limiter.try_acquire("k").allowed)  # t=1.0
    clock.now = 1.5
    admitted.append(limiter.try_acquire("k").allowed)  # t=1.5
    assert sum(admitted) <= 2


@pytest.mark.parametrize("cost", [True, 1.0])
def test_a_cost_that_only_equals_one_is_refused(cost: object) -> None:
    """``cost=True`` and ``cost=1.0`` equal 1 but are no integer cost: refused like
    ``cost=2.0`` (they used to be taken as 1, and 1.0 left a float ``remaining``)."""
    limiter = rs.RateLimiter("10/s")
    with pytest.raises(rs.ConfigurationError, match="cost"):
        limiter.try_acquire(cost=cost)  # type: ignore[arg-type]


def test_peeks_are_neither_admissions_nor_refusals() -> None:
    """cost=0 takes nothing: it used to count as admitted (or, on a full window, as
    rejected) and to emit CallAdmitted, feeding the decisions counter for no call."""
    events: list[rs.Event] = []
    limiter = rs.RateLimiter("10/minute")
    limiter.add_listener(events.append)
    for _ in range(5):
        assert limiter.try_acquire(key="alice", cost=0).remaining == 10
    window = rs.RateLimiter("1/minute", algorithm="moving-window")
    window.add_listener(events.append)
    assert window.try_acquire("bob")
    assert not window.try_acquire("bob", cost=0)
    assert (limiter.statistics().admitted, limiter.statistics().rejected) == (0, 0)
    assert (window.statistics().admitted, window.statistics().rejected) == (1, 0)
    assert [type(e).__name__ for e in events] == ["CallAdmitted"]


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised inside a listener."""


def test_a_reservation_a_listener_interrupted_is_still_counted_as_waited() -> None:
    """A listener raising a BaseException on the admission of a booked reservation
    ends the call; the reservation stays booked (tokens are spent when taken, as a
    backoff interrupted mid-sleep also leaves them), and the statistics say so: the
    call counts as admitted and as waited."""
    clock = FakeClock()
    limiter = rs.RateLimiter("1/s", max_wait=5.0, clock=clock)

    def interrupt(event: rs.Event) -> None:
        if isinstance(event, rs.CallAdmitted) and event.waited > 0:
            raise _Interrupt

    limiter.add_listener(interrupt)
    for run in (limiter.acquire, lambda: limiter.call(int)):
        limiter.acquire()  # takes the burst
        with pytest.raises(_Interrupt):
            run()  # books the next token, 1 s ahead
        clock.advance(5)
    stats = limiter.statistics()
    assert (stats.admitted, stats.waited) == (4, 2)
