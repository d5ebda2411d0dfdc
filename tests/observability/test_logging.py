"""LoggingListener: levels, repeats summarized per event type and policy, episodes."""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resilience as rs
from resilience.asgi import RequestAdmitted
from resilience.errors import ConfigurationError
from resilience.observability import TRANSITIONS, LoggingListener
from resilience.testing import FakeClock


def fallback(policy: str = "limiter", key: str = "k") -> rs.BackendFallback:
    return rs.BackendFallback(policy=policy, key=key, mode="local", error=None)


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="resilience.events")
    return caplog


def test_an_outage_logs_one_fallback_per_interval_with_the_count(
    log: pytest.LogCaptureFixture,
) -> None:
    """1,000 fallback decisions in 5 s: one record; the next, over 10 s after the first, says
    the 1,000 in between were left out."""
    clock = FakeClock()
    listener = LoggingListener(clock=clock)
    for i in range(1000):
        listener(fallback(key=f"client{i}"))
        clock.advance(0.005)
    assert len(log.records) == 1
    assert log.records[0].levelno == logging.WARNING
    assert "repeats" not in log.records[0].getMessage()
    clock.advance(4.0)  # 9 s after the first record: still counted
    listener(fallback())
    assert len(log.records) == 1
    clock.advance(1.5)
    listener(fallback())
    assert len(log.records) == 2
    assert log.records[1].getMessage().endswith(" repeats=1000")
    assert getattr(log.records[1], "resilience_repeats") == 1000


def test_repeats_are_counted_per_event_type_and_policy(
    log: pytest.LogCaptureFixture,
) -> None:
    """Another policy, or another event type of the same policy, is logged at once."""
    listener = LoggingListener(clock=FakeClock())
    listener(fallback("a"))
    listener(fallback("a"))
    listener(fallback("b"))
    listener(rs.RetriesExhausted(policy="a", attempts=3, reason="attempts"))
    assert [r.getMessage().split()[:2] for r in log.records] == [
        ["BackendFallback", "policy=a"],
        ["BackendFallback", "policy=b"],
        ["RetriesExhausted", "policy=a"],
    ]


def test_a_transition_is_always_logged_and_reports_what_was_left_out(
    log: pytest.LogCaptureFixture,
) -> None:
    """Recovery carries the outage's left-out count; the next outage is logged at once."""
    listener = LoggingListener(clock=FakeClock())
    for _ in range(50):
        listener(fallback())
    listener(rs.BackendRecovered(policy="limiter"))
    listener(rs.BackendRecovered(policy="limiter"))
    listener(fallback())  # a new outage, within the interval of the first record
    messages = [r.getMessage() for r in log.records]
    assert len(messages) == 4
    assert messages[1].startswith("BackendRecovered policy=limiter")
    assert messages[1].endswith(" left_out={'BackendFallback': 49}")
    assert "left_out" not in messages[2]
    assert messages[3].startswith("BackendFallback")
    assert "repeats" not in messages[3]


def test_a_transition_below_the_level_still_starts_a_new_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With INFO off, the recovery is not written, but the next outage's first fallback is."""
    caplog.set_level(logging.WARNING, logger="resilience.events")
    listener = LoggingListener(clock=FakeClock())
    listener(fallback())
    listener(rs.BackendRecovered(policy="limiter"))
    listener(fallback())
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]


def test_what_an_unwritten_transition_closed_is_reported_by_the_next_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At WARNING the recovery (INFO) is not written; the fallbacks left out before it
    used to vanish with it. The next outage's first record reports them: repeats=N."""
    caplog.set_level(logging.WARNING, logger="resilience.events")
    clock = FakeClock()
    listener = LoggingListener(clock=clock)
    for _ in range(1000):
        listener(fallback())
        clock.advance(0.005)
    listener(rs.BackendRecovered(policy="limiter"))
    clock.advance(60)
    listener(fallback())
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage().endswith("repeats=999")
    assert caplog.records[1].resilience_repeats == 999


def test_a_logger_adapter_keeps_the_event_on_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A LoggerAdapter's own extra replaced ours: record.resilience_event was missing.
    Both ride along now, and the adapter's process() still shapes the message."""

    class Prefixed(logging.LoggerAdapter):  # type: ignore[type-arg]
        def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
            msg, kwargs = super().process(msg, kwargs)
            return f"[svc] {msg}", kwargs

    caplog.set_level(logging.DEBUG, logger="resilience.adapted")
    adapter = Prefixed(logging.getLogger("resilience.adapted"), {"service": "api"})
    listener = LoggingListener(adapter, repeat_interval=None)
    event = rs.StateChanged(policy="br", old="closed", new="open")
    listener(event)
    (record,) = caplog.records
    assert record.resilience_event is event
    assert record.service == "api"
    assert record.getMessage().startswith("[svc] StateChanged policy=br")


def test_state_changes_are_never_summarized(log: pytest.LogCaptureFixture) -> None:
    """Every breaker transition gets its own record, however close together."""
    listener = LoggingListener(clock=FakeClock())
    for old, new in [("closed", "open"), ("open", "half_open"), ("half_open", "open")] * 3:
        listener(rs.StateChanged(policy="payments", old=old, new=new))
    assert len(log.records) == 9
    assert all(issubclass(t, rs.Event) for t in TRANSITIONS)


def test_repeat_interval_none_logs_every_event(log: pytest.LogCaptureFixture) -> None:
    """The summary can be switched off."""
    listener = LoggingListener(repeat_interval=None)
    for _ in range(20):
        listener(fallback())
    assert len(log.records) == 20


def test_disabled_levels_count_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Events below the logger's level are dropped before the repeat table."""
    caplog.set_level(logging.INFO, logger="resilience.events")
    listener = LoggingListener(clock=FakeClock())
    for _ in range(10):
        listener(rs.CallRejected(policy="api", key="k"))  # DEBUG
    caplog.set_level(logging.DEBUG, logger="resilience.events")
    listener(rs.CallRejected(policy="api", key="k"))
    assert len(caplog.records) == 1
    assert "repeats" not in caplog.records[0].getMessage()


def test_admissions_log_at_debug(log: pytest.LogCaptureFixture) -> None:
    """One event per admitted request is only worth a record when debugging."""
    listener = LoggingListener()
    assert listener.level_of(RequestAdmitted(policy="api", key="k")) == logging.DEBUG
    assert listener.level_of(rs.BackendFallback(policy="l", mode="local")) == logging.WARNING


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "10"])
def test_bad_repeat_interval_is_refused(bad: object) -> None:
    """A negative, NaN or non-number interval fails at construction."""
    with pytest.raises(ConfigurationError, match="repeat_interval"):
        LoggingListener(repeat_interval=bad)  # type: ignore[arg-type]


def capture(
    name: str, clock: FakeClock | None = None
) -> tuple[logging.Logger, list[tuple[float, logging.LogRecord]]]:
    """A private logger whose records are kept, each with the fake clock's time."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.handlers.clear()
    written: list[tuple[float, logging.LogRecord]] = []
    handler = logging.Handler()
    handler.emit = lambda record: written.append(  # type: ignore[method-assign]
        (clock.monotonic() if clock is not None else 0.0, record)
    )
    logger.addHandler(handler)
    return logger, written


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=60),
    interval=st.floats(0.5, 20),
)
def test_every_event_is_logged_or_counted_once(gaps: list[float], interval: float) -> None:
    """Records + the repeats they report + the count left out at recovery = events sent;
    two records of one type and policy are never closer than the interval."""
    clock = FakeClock()
    logger, written = capture("test.logging.invariant", clock)
    listener = LoggingListener(logger, repeat_interval=interval, clock=clock)
    for gap in gaps:
        clock.advance(gap)
        listener(fallback())
    listener(rs.BackendRecovered(policy="limiter"))
    fallbacks = written[:-1]
    reported = sum(getattr(record, "resilience_repeats") for _, record in fallbacks)
    final = written[-1][1].getMessage()
    left_out = int(final.split("'BackendFallback': ")[1].rstrip("}")) if "left_out" in final else 0
    assert len(fallbacks) + reported + left_out == len(gaps)
    times = [at for at, _ in fallbacks]
    assert all(later - earlier >= interval for earlier, later in itertools.pairwise(times))


def test_concurrent_threads_lose_no_event() -> None:
    """Eight threads emitting at once: every event is written or counted exactly once."""
    logger, written = capture("test.logging.threads")
    listener = LoggingListener(logger, repeat_interval=3600.0)

    def emit() -> None:
        for _ in range(2000):
            listener(fallback())

    threads = [threading.Thread(target=emit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    listener(rs.BackendRecovered(policy="limiter"))
    assert len(written) == 2
    assert written[1][1].getMessage().endswith(" left_out={'BackendFallback': 15999}")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"logger": "myapp"}, "logger"),  # a name: nothing would ever be logged
        ({"levels": {rs.CallRejected: "WARNING"}}, "levels"),
        ({"levels": {rs.RateLimited: logging.WARNING}}, "levels keys"),  # not an event
        ({"levels": []}, "levels"),
        ({"default_level": "INFO"}, "default_level"),
        ({"default_level": None}, "default_level"),
        ({"default_level": float("nan")}, "default_level"),
    ],
)
def test_bad_logger_and_levels_are_refused(kwargs: dict[str, Any], argument: str) -> None:
    """Arguments that made every event fail inside the listener (nothing logged, a
    "listener failed" record instead) are refused when it is built."""
    with pytest.raises(ConfigurationError, match=argument):
        LoggingListener(**kwargs)
