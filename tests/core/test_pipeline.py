"""Decorating and composing: metadata, methods, order, flattening and order warnings."""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import pybreaker
import pytest

import resilience as rs
from resilience._repeats import Repeats
from resilience.testing import FakeClock


class Recorder(rs.PolicyBase):
    """A policy that logs entry and exit, and the call's arguments."""

    def __init__(self, label: str, log: list[Any]) -> None:
        super().__init__(name=label)
        self.log = log

    def call(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.log.append((self.name, "in", args, kwargs))
        try:
            return fn(*args, **kwargs)
        finally:
            self.log.append((self.name, "out"))

    async def call_async(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.log.append((self.name, "in", args, kwargs))
        try:
            return await fn(*args, **kwargs)
        finally:
            self.log.append((self.name, "out"))


def test_decorator_keeps_name_doc_and_signature() -> None:
    """functools.wraps semantics: name, doc and inspect.signature survive."""

    def fetch(url: str, *, timeout: float = 1.0) -> bytes:
        """Fetch a URL."""
        return b""

    wrapped = rs.Retry(on=OSError)(fetch)
    assert wrapped.__name__ == "fetch"
    assert wrapped.__doc__ == "Fetch a URL."
    assert inspect.signature(wrapped) == inspect.signature(fetch)
    assert list(inspect.signature(wrapped).parameters) == ["url", "timeout"]


@pytest.mark.anyio
async def test_async_functions_stay_coroutine_functions() -> None:
    """Decorating async def gives an async def."""

    @rs.Timeout(1)
    async def ping() -> str:
        return "pong"

    assert inspect.iscoroutinefunction(ping)
    assert await ping() == "pong"


@pytest.mark.anyio
async def test_an_async_callable_object_or_partial_is_decorated_as_async() -> None:
    """An object whose ``__call__`` is ``async def`` (a client object) and a partial of
    an async function get the async wrapper: each policy sees the awaited work (a
    retry used to run one attempt, a fallback to miss the error, since the sync
    wrapper only saw the coroutine being created)."""
    import functools

    class Client:
        def __init__(self) -> None:
            self.calls = 0

        async def __call__(self, url: str) -> int:
            self.calls += 1
            raise ConnectionError(url)

    async def fetch(url: str, *, client: Client) -> int:
        return await client(url)

    for make in (lambda c: c, lambda c: functools.partial(fetch, client=c)):
        client = Client()
        retried = rs.Retry(on=ConnectionError, attempts=3, backoff=rs.backoff.constant(0))
        with pytest.raises(ConnectionError):
            await retried(make(client))("u")
        assert client.calls == 3
        assert await rs.Fallback(-1, on=ConnectionError)(make(Client()))("u") == -1
        assert await rs.Pipeline(rs.Fallback(-2, on=ConnectionError))(make(Client()))("u") == -2
        breaker = rs.CircuitBreaker(consecutive_failures=1)
        with pytest.raises(ConnectionError):
            await breaker(make(Client()))("u")
        assert breaker.state is rs.CircuitState.OPEN
        limiter = rs.RateLimiter("1/minute")
        with pytest.raises(ConnectionError):
            await limiter(make(Client()))("u")
        assert limiter.statistics().admitted == 1


def test_methods_of_every_kind() -> None:
    """Instance, class and static methods can be decorated, above or below the builtin."""
    retry = rs.Retry(on=OSError)

    class Client:
        base = "c"

        @retry
        def instance(self, x: int) -> str:
            return f"{self.base}{x}"

        @retry
        @classmethod
        def klass(cls, x: int) -> str:
            return f"{cls.base}{x}"

        @classmethod
        @retry
        def klass_below(cls, x: int) -> str:
            return f"{cls.base}{x}"

        @retry
        @staticmethod
        def static(x: int) -> str:
            return f"s{x}"

    client = Client()
    assert client.instance(1) == "c1"
    assert Client.klass(2) == "c2"
    assert Client.klass_below(3) == "c3"
    assert Client.static(4) == "s4"


@pytest.mark.parametrize(
    "policy",
    [
        rs.Retry(on=OSError),
        rs.Timeout(1),
        rs.CircuitBreaker(),
        rs.RateLimiter("1/s"),
        rs.Bulkhead(1),
        rs.Fallback(None),
        rs.Pipeline(rs.Timeout(1)),
    ],
    ids=["retry", "timeout", "breaker", "limiter", "bulkhead", "fallback", "pipeline"],
)
def test_generator_functions_are_refused(policy: Any) -> None:
    """Calling a generator function only creates the generator, so a policy around it
    would guard nothing: both kinds are refused, decorated or called."""

    def items() -> Any:
        yield 1

    async def stream() -> Any:
        yield 1

    class Items:
        def __call__(self) -> Any:
            yield 1

    with pytest.raises(TypeError, match="is a generator function"):
        policy(items)
    with pytest.raises(TypeError, match="is an async generator function"):
        policy(stream)
    # Also through call() (it returned the generator, unguarded: a Timeout(0.05)
    # around a 0.3 s iteration raised nothing), partials and callable objects.
    for target in (items, functools.partial(items), Items()):
        with pytest.raises(TypeError, match="is a generator function"):
            policy.call(target)
        with pytest.raises(TypeError, match="is a generator function"):
            policy(target)
    with pytest.raises(TypeError, match="is an async generator function"):
        policy.call(stream)


#: Every built-in policy, fresh per test (the pipeline holds a limiter: its one token
#: shows whether a refusal spent anything).
EVERY_POLICY: dict[str, Callable[[], Any]] = {
    "retry": lambda: rs.Retry(on=OSError),
    "timeout": lambda: rs.Timeout(1),
    "breaker": lambda: rs.CircuitBreaker(),
    "limiter": lambda: rs.RateLimiter("1/s"),
    "bulkhead": lambda: rs.Bulkhead(1),
    "fallback": lambda: rs.Fallback(None),
    "faults": lambda: rs.Faults(latency=0.0, latency_rate=1.0, enabled=True),
    "pipeline": lambda: rs.Pipeline(rs.RateLimiter("1/s"), rs.Timeout(1)),
    "pybreaker": lambda: rs.breaker.PyBreakerPolicy(pybreaker.CircuitBreaker()),
}


@pytest.mark.parametrize("make", list(EVERY_POLICY.values()), ids=list(EVERY_POLICY))
def test_sync_call_of_an_async_function_is_refused(make: Any) -> None:
    """``policy.call(async_fn)`` only creates the coroutine, so ``await
    policy.call(fetch)`` would run the work outside the policy: it raises TypeError
    naming call_async, before the policy takes anything (the limiter keeps its token,
    the bulkhead its slot) and without leaving a never-awaited coroutine behind."""
    policy = make()
    started: list[str] = []

    async def fetch(url: str) -> str:
        started.append(url)
        return url

    class Client:
        async def get(self, url: str) -> str:
            return url

        async def __call__(self, url: str) -> str:
            return url

    class Proxy:
        """Answers every attribute, ``__code__`` included (like xmlrpc's proxies)."""

        def __getattr__(self, name: str) -> Any:
            return Proxy()

        def __call__(self, url: str) -> str:
            return url.upper()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a created, never-awaited coroutine would warn
        for fn in (fetch, Client().get, Client(), functools.partial(fetch)):
            with pytest.raises(TypeError, match="call_async"):
                policy.call(fn, "u")
    assert started == []
    assert policy.call(Proxy(), "u") == "U"  # the one token, the slot
    if isinstance(policy, rs.Bulkhead):
        assert policy.statistics().in_flight == 0


@pytest.mark.anyio
@pytest.mark.parametrize("make", list(EVERY_POLICY.values()), ids=list(EVERY_POLICY))
async def test_call_async_of_a_generator_function_is_refused_before_it_acts(make: Any) -> None:
    """``await policy.call_async(agen)`` only creates the generator: refused with the
    policy's TypeError, as ``call(gen)`` is, before the limiter spends its one token
    (it was spent, then Python's "can't be used in 'await' expression" followed)."""
    policy = make()

    async def stream() -> Any:
        yield 1

    def items() -> Any:
        yield 1

    class Stream:
        async def __call__(self) -> Any:
            yield 1

    for target in (stream, functools.partial(stream), Stream()):
        with pytest.raises(TypeError, match="is an async generator function"):
            await policy.call_async(target)
    with pytest.raises(TypeError, match="is a generator function"):
        await policy.call_async(items)

    async def fetch() -> str:
        return "ok"

    assert await policy.call_async(fetch) == "ok"  # the one token: still there
    if isinstance(policy, rs.CircuitBreaker):
        assert policy.statistics().calls == 1
    if isinstance(policy, rs.Bulkhead):
        assert policy.statistics().in_flight == 0


@pytest.mark.anyio
@pytest.mark.parametrize("make", list(EVERY_POLICY.values()), ids=list(EVERY_POLICY))
async def test_mocks_of_functions_run_as_what_they_return(make: Any) -> None:
    """``MagicMock(spec=some_def)`` poses as a function whose every code flag is set, so
    :mod:`inspect` calls it an async generator function: ``call`` refused it. A mock
    runs as a plain call; an ``AsyncMock`` (or a mock spec'd on an ``async def``) is
    still an async function that ``call`` refuses and ``call_async`` awaits."""

    def plain(url: str) -> str:
        return url

    async def fetch(url: str) -> str:
        return url

    policy = make()
    sync_mock = mock.MagicMock(spec=plain, return_value="body")
    assert policy.call(sync_mock, "u") == "body"
    sync_mock.assert_called_once_with("u")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mock's own unawaited call
        for async_mock in (mock.AsyncMock(), mock.MagicMock(spec=fetch)):
            with pytest.raises(TypeError, match="call_async"):
                policy.call(async_mock, "u")
            async_mock.assert_not_called()
    fresh = make()  # the limiter's one token
    async_mock = mock.AsyncMock(return_value="async body")
    assert await fresh.call_async(async_mock, "u") == "async body"
    async_mock.assert_awaited_once_with("u")


def test_a_policy_class_instead_of_a_policy_is_refused() -> None:
    """``rs.CircuitBreaker`` without parentheses has call and call_async (unbound), so
    it passed the pipeline's check and every call then failed with a TypeError."""
    with pytest.raises(rs.ConfigurationError, match=r"the class CircuitBreaker: call it"):
        rs.Pipeline(rs.Retry(on=OSError), rs.CircuitBreaker)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"the class CircuitBreaker: call it"):
        rs.decorate(rs.CircuitBreaker, len)  # type: ignore[arg-type]


def test_pipeline_runs_outermost_first_and_passes_arguments() -> None:
    """Pipeline(a, b) is a around b around the call; every layer sees the arguments."""
    log: list[Any] = []
    pipeline = rs.Pipeline(Recorder("a", log), Recorder("b", log))

    @pipeline
    def add(x: int, y: int = 0) -> int:
        return x + y

    assert add(1, y=2) == 3
    assert log == [
        ("a", "in", (1,), {"y": 2}),
        ("b", "in", (1,), {"y": 2}),
        ("b", "out"),
        ("a", "out"),
    ]


@pytest.mark.anyio
async def test_pipeline_async_and_direct_call() -> None:
    """call_async runs the chain for coroutine functions; call() works without decorating."""
    log: list[Any] = []
    pipeline = rs.Pipeline(Recorder("a", log), Recorder("b", log))

    async def double(x: int) -> int:
        return 2 * x

    assert await pipeline.call_async(double, 4) == 8
    assert pipeline.call(lambda x: x + 1, 1) == 2
    assert [entry[0] for entry in log[:2]] == ["a", "b"]


def test_nested_pipelines_are_flattened() -> None:
    """A pipeline inside a pipeline contributes its policies in place."""
    a, b, c = rs.Fallback(1), rs.Retry(on=OSError), rs.Fallback(2)
    assert rs.Pipeline(a, rs.Pipeline(b, c)).policies == (a, b, c)


def test_a_policy_twice_in_a_pipeline_is_refused() -> None:
    """One policy object twice, directly or through nested pipelines, is one state in
    two layers (a bulkhead of one would wait for its own slot, a breaker count each
    call twice): refused at construction, naming the policy."""
    bulkhead = rs.Bulkhead(1, name="db")
    with pytest.raises(rs.ConfigurationError, match=r"'db'.* twice"):
        rs.Pipeline(bulkhead, rs.Timeout(5), bulkhead)
    breaker = rs.CircuitBreaker(name="api")
    first = rs.Pipeline(breaker, rs.Timeout(5))
    second = rs.Pipeline(breaker, rs.Fallback(0))
    with pytest.raises(rs.ConfigurationError, match=r"'api'.* twice"):
        rs.Pipeline(first, second)
    # Equal but distinct policies are two layers.
    assert len(rs.Pipeline(rs.Timeout(5), rs.Timeout(5))) == 2


def test_a_pipeline_listener_hears_its_policies() -> None:
    """Pipeline.add_listener puts the listener on each of its policies (a nested
    pipeline's listener stays on its own), and remove_listener takes it off them."""
    seen: list[rs.Event] = []
    inner_seen: list[rs.Event] = []
    retry = rs.Retry(on=OSError, attempts=2, backoff=[0])
    inner = rs.Pipeline(retry)
    inner.add_listener(inner_seen.append)
    pipeline = rs.Pipeline(rs.Fallback("degraded", on=OSError), inner, Limiter())
    assert pipeline.add_listener(seen.append) == seen.append

    def down() -> str:
        raise OSError("down")

    assert pipeline.call(down) == "degraded"
    kinds = [type(event).__name__ for event in seen]
    assert kinds == ["RetryScheduled", "RetriesExhausted", "FallbackUsed"]
    assert [type(event).__name__ for event in inner_seen] == kinds[:2]
    pipeline.remove_listener(seen.append)
    assert pipeline.call(down) == "degraded"
    assert len(seen) == 3
    assert len(inner_seen) == 4


def test_non_policies_are_refused() -> None:
    """Only objects with call/call_async compose."""
    with pytest.raises(rs.ConfigurationError, match="call"):
        rs.Pipeline(object())


def test_retry_around_timeout_without_total_deadline_warns() -> None:
    """Retry(no deadline) around a per-attempt Timeout warns, pointing at the user's line."""
    with pytest.warns(rs.PipelineOrderWarning, match="no total deadline") as record:
        rs.Pipeline(rs.Retry(on=TimeoutError), rs.Timeout(1))
    assert record[0].filename == __file__


def test_a_nested_pipeline_does_not_repeat_its_warning() -> None:
    """A pipeline built from one that warned says only what is new: the inner order
    problem was reported when the inner pipeline was built (once, at the user's line)."""
    with pytest.warns(rs.PipelineOrderWarning, match="no total deadline"):
        inner = rs.Pipeline(rs.Retry(on=TimeoutError), rs.Timeout(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.Pipeline(rs.Fallback(0), inner)
    with pytest.warns(rs.PipelineOrderWarning, match="no total deadline"):
        rs.Pipeline(rs.Retry(on=TimeoutError), rs.Pipeline(rs.Fallback(0), rs.Timeout(1)))


def test_an_error_only_timeout_is_refused_when_the_pipeline_is_built() -> None:
    """``rs.Timeout("message")`` is an error, not a policy: a pipeline refuses it when
    it is built, as a decorator does, instead of at the first call."""
    with pytest.raises(rs.ConfigurationError, match="without a limit"):
        rs.Pipeline(rs.Retry(on=KeyError, deadline=1), rs.Timeout("just an error"))


def test_retry_with_deadline_or_outer_timeout_does_not_warn() -> None:
    """A total deadline anywhere outside makes the order fine."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.Pipeline(rs.Retry(on=TimeoutError, deadline=5), rs.Timeout(1))
        rs.Pipeline(rs.Timeout(5), rs.Retry(on=TimeoutError), rs.Timeout(1))
        # An outer Retry's deadline bounds the inner one too (it used to warn).
        rs.Pipeline(rs.Retry(on=OSError, deadline=5), rs.Retry(on=TimeoutError), rs.Timeout(1))


class Limiter(rs.PolicyBase):
    """A stand-in for a policy that refuses calls."""

    raises_rejected = True

    def call(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    async def call_async(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)


def test_retry_ignoring_retry_after_around_rejecting_policy_warns() -> None:
    """Retrying rejections without honouring retry_after hammers the limiter: warn."""
    with pytest.warns(rs.PipelineOrderWarning, match="retry_after"):
        rs.Pipeline(rs.Retry(on=Exception, respect_retry_after=False), Limiter())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.Pipeline(rs.Retry(on=Exception), Limiter())
        rs.Pipeline(rs.Retry(on=OSError, respect_retry_after=False), Limiter())


def test_the_retry_after_warning_names_only_rejections_the_retry_can_catch() -> None:
    """A Retry whose ``on=`` cannot catch what an inner policy raises (retrying open
    breakers around a limiter) hammers nothing: no warning. One that can still warns,
    naming that policy, not another."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.Pipeline(rs.Retry(on=rs.CircuitOpen, respect_retry_after=False), rs.RateLimiter("1/s"))
        rs.Pipeline(rs.Retry(on=rs.BulkheadFull, respect_retry_after=False), rs.CircuitBreaker())
    with pytest.warns(rs.PipelineOrderWarning, match="raised by <RateLimiter"):
        rs.Pipeline(
            rs.Retry(on=rs.RateLimited, respect_retry_after=False),
            rs.CircuitBreaker(),
            rs.RateLimiter("1/s"),
        )


def test_the_retry_after_warning_skips_rejections_a_fallback_answers() -> None:
    """A breaker with ``fallback=``, or a Fallback between the Retry and the policy
    whose ``on=`` covers its rejection, answers the rejection: the Retry never sees it,
    so there is nothing to warn about. A Fallback that covers something else does not
    count."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.Pipeline(
            rs.Retry(on=Exception, respect_retry_after=False),
            rs.CircuitBreaker(fallback="degraded"),
        )
        rs.Pipeline(
            rs.Retry(on=Exception, respect_retry_after=False),
            rs.Fallback("degraded", on=rs.CircuitOpen),
            rs.CircuitBreaker(),
        )
    with pytest.warns(rs.PipelineOrderWarning, match="raised by <RateLimiter"):
        rs.Pipeline(
            rs.Retry(on=Exception, respect_retry_after=False),
            rs.Fallback("degraded", on=rs.CircuitOpen),
            rs.RateLimiter("1/s"),
        )


def test_a_policy_with_its_own_fallback_attribute_is_no_fallback() -> None:
    """Only a Fallback answers rejections for the order check: a user's policy with a
    ``_fallback`` attribute of its own is left alone (Pipeline raised AttributeError)."""

    class Gate(rs.PolicyBase):
        raises_rejected = True

        def __init__(self) -> None:
            super().__init__()
            self._fallback = lambda: "mine"

        def call(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        async def call_async(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

    with pytest.warns(rs.PipelineOrderWarning, match="retry_after"):
        rs.Pipeline(rs.Retry(on=rs.Rejected, respect_retry_after=False), Gate())


def test_recommended_pipeline_degrades_end_to_end(fake_clock: FakeClock) -> None:
    """Fallback -> Retry(deadline) -> Timeout: a dead dependency yields the fallback."""
    calls = 0

    def dead() -> str:
        nonlocal calls
        calls += 1
        fake_clock.advance(0.4)
        raise ConnectionError

    pipeline = rs.Pipeline(
        rs.Fallback("stale", on=(ConnectionError, rs.Timeout)),
        rs.Retry(on=ConnectionError, attempts=5, deadline=1.0, clock=fake_clock),
        rs.Timeout(0.5, clock=fake_clock),
    )
    assert pipeline(dead)() == "stale"
    assert 1 <= calls <= 3


def test_failing_listener_never_breaks_the_call(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that raises is logged; the call still returns."""
    fallback = rs.Fallback("ok")

    def broken(event: rs.Event) -> None:
        raise RuntimeError("listener bug")

    fallback.add_listener(broken)
    assert fallback(lambda: (_ for _ in ()).throw(rs.Rejected()))() == "ok"
    assert "listener" in caplog.text


def test_global_listeners_see_every_policy() -> None:
    """rs.add_listener receives events of all policies until removed."""
    seen: list[rs.Event] = []
    rs.add_listener(seen.append)
    try:
        rs.Fallback(0)(lambda: (_ for _ in ()).throw(rs.Rejected()))()
    finally:
        rs.remove_listener(seen.append)
    rs.Fallback(0)(lambda: (_ for _ in ()).throw(rs.Rejected()))()
    assert len(seen) == 1


def test_pipeline_statistics_collects_each_policy() -> None:
    """Pipeline.statistics() lists every policy's snapshot, outermost first."""
    fallback = rs.Fallback("x")
    retry = rs.Retry(on=OSError)
    pipeline = rs.Pipeline(fallback, retry, Limiter())
    pipeline(lambda: (_ for _ in ()).throw(rs.Rejected()))()
    stats = pipeline.statistics()
    assert stats.policies == (rs.FallbackStatistics(used=1), retry.statistics(), None)


def test_a_listener_that_keeps_failing_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 failures in a burst: one record; the next, 10 s later, counts the 999 left out."""
    from resilience import _events

    now = [1_000.0]
    monkeypatch.setattr(_events, "_monotonic", lambda: now[0])
    monkeypatch.setattr(_events, "_failures", Repeats(10.0, max_keys=1_000))

    def broken(event: rs.Event) -> None:
        raise RuntimeError("listener bug")

    def working(event: rs.Event) -> None:
        seen.append(event)

    seen: list[rs.Event] = []
    event = rs.CallRejected(policy="api")
    with caplog.at_level(logging.WARNING, logger="resilience"):
        for _ in range(1000):
            _events.emit([broken, working], event)
        assert len(seen) == 1000  # the broken listener never stops the others
        assert len(caplog.records) == 1
        assert caplog.records[0].exc_info is not None
        now[0] += 10.0
        _events.emit([broken], event)
    assert len(caplog.records) == 2
    assert "999 more failures since its last record" in caplog.records[1].getMessage()


def test_a_listener_added_again_is_logged_at_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-adding a listener forgets its failures: the next one is logged, no waiting."""
    from resilience import _events

    monkeypatch.setattr(_events, "_monotonic", lambda: 5.0)
    monkeypatch.setattr(_events, "_failures", Repeats(10.0, max_keys=1_000))

    def broken(event: rs.Event) -> None:
        raise RuntimeError("listener bug")

    fallback = rs.Fallback("ok")
    with caplog.at_level(logging.WARNING, logger="resilience"):
        fallback.add_listener(broken)
        fallback(lambda: (_ for _ in ()).throw(rs.Rejected()))()
        fallback(lambda: (_ for _ in ()).throw(rs.Rejected()))()
        assert len(caplog.records) == 1
        fallback.remove_listener(broken)
        fallback.add_listener(broken)
        fallback(lambda: (_ for _ in ()).throw(rs.Rejected()))()
    assert len(caplog.records) == 2


def test_a_removed_listener_that_failed_is_not_kept_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure log's memory of a listener keeps nothing alive: once removed and
    dropped, a listener that raised (and what it holds) is collected, as is a bound
    method's object (they stayed until 1,000 other listeners had failed)."""
    import gc
    import weakref

    # No log record: the test's own log capture would keep the traceback, and the
    # listener with it.
    monkeypatch.setattr(logging.getLogger("resilience"), "disabled", True)

    class Broken:
        def __call__(self, event: rs.Event) -> None:
            raise RuntimeError("listener bug")

        def method(self, event: rs.Event) -> None:
            raise RuntimeError("listener bug")

    for make in (lambda obj: obj, lambda obj: obj.method):
        fallback = rs.Fallback("ok")
        owner = Broken()
        alive = weakref.ref(owner)
        fallback.add_listener(make(owner))
        fallback(lambda: (_ for _ in ()).throw(rs.Rejected()))()  # the listener raises
        fallback.remove_listener(make(owner))
        del owner
        gc.collect()
        assert alive() is None


def test_listeners_removed_from_two_threads_are_the_ones_removed() -> None:
    """Two threads removing two listeners at once remove exactly those: a removal that
    found its listener's place, then was overtaken by another thread's, deleted a third
    listener and left its own (here the other thread runs, or tries to, right after the
    first one has found its place)."""
    import threading

    retry = rs.Retry(on=OSError)
    a, b, c = (lambda event: None), (lambda event: None), (lambda event: None)
    others: list[threading.Thread] = []

    class Overtaken(list[Any]):
        def __iter__(self) -> Any:
            try:
                yield from super().__iter__()
            finally:  # the first look is over (its place found): ``a`` goes now
                if not others:
                    other = threading.Thread(target=retry.remove_listener, args=(a,))
                    others.append(other)
                    other.start()
                    other.join(0.2)  # it waits for the first removal to finish, or not

    retry._listeners = Overtaken([a, b, c])
    retry.remove_listener(b)
    others[0].join(5)
    assert list(retry._listeners) == [c]


def test_distinct_listeners_that_compare_equal_both_receive() -> None:
    """add_listener ignores the same listener added twice (the same object, or the same
    bound method), not a distinct one that merely compares equal (dataclasses)."""
    import dataclasses

    @dataclasses.dataclass
    class Collector:
        events: list[rs.Event] = dataclasses.field(default_factory=list)

        def __call__(self, event: rs.Event) -> None:
            self.events.append(event)

    audit, metrics = Collector(), Collector()
    assert audit == metrics
    retry = rs.Retry(on=ValueError, attempts=1)
    for listener in (audit, metrics, audit):
        retry.add_listener(listener)
    seen: list[rs.Event] = []
    retry.add_listener(seen.append)
    retry.add_listener(seen.append)  # the same bound method: once
    with pytest.raises(ValueError):
        retry.call(int, "x")
    assert (len(audit.events), len(metrics.events), len(seen)) == (1, 1, 1)
    retry.remove_listener(metrics)
    retry.remove_listener(seen.append)
    with pytest.raises(ValueError):
        retry.call(int, "x")
    assert (len(audit.events), len(metrics.events), len(seen)) == (2, 1, 1)


@pytest.mark.anyio
async def test_a_sync_function_given_to_call_async_is_a_bug_not_a_failure() -> None:
    """``await policy.call_async(sync_fn)`` runs the function, then cannot await what it
    returned. That TypeError is the caller's bug: no retry runs the function again (it
    charged a card three times), no breaker counts it (it opened), no fallback hides
    it (it answered "degraded")."""
    calls: list[str] = []

    def charge(card: str) -> str:
        calls.append(card)
        return "charged"

    breaker = rs.CircuitBreaker(consecutive_failures=1, failure_rate=None)
    policies: list[Any] = [
        rs.Retry(on=Exception, attempts=3, backoff=rs.backoff.constant(0)),
        breaker,
        rs.Fallback("degraded", on=Exception),
        rs.Pipeline(
            rs.Fallback("degraded", on=Exception),
            rs.CircuitBreaker(consecutive_failures=1, failure_rate=None),
            rs.Retry(on=Exception, attempts=3, backoff=rs.backoff.constant(0)),
        ),
    ]
    for policy in policies:
        calls.clear()
        with pytest.raises(TypeError, match="await"):
            await policy.call_async(charge, "4242")  # type: ignore[arg-type]
        assert calls == ["4242"], policy
    assert breaker.state is rs.CircuitState.CLOSED

    async def fails() -> None:
        raise TypeError("a TypeError of the dependency's own")

    with pytest.raises(TypeError):
        await breaker.call_async(fails)
    assert breaker.state is rs.CircuitState.OPEN  # the function's own errors still count
