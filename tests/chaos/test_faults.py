"""rs.Faults: off by default, seeded, on the policy's clock, by rate, schedule and key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import resilience as rs
from resilience import chaos
from resilience.chaos import Faults
from resilience.testing import FakeClock


def ok(*args: Any, **kwargs: Any) -> str:
    return "ok"


async def ok_async(*args: Any, **kwargs: Any) -> str:
    return "ok"


def outcomes(faults: Faults, calls: int, *args: Any) -> list[str]:
    """Run ``calls`` sync calls and name each outcome."""
    seen = []
    for _ in range(calls):
        try:
            seen.append(str(faults.call(ok, *args)))
        except BaseException as exc:
            seen.append(type(exc).__name__)
    return seen


# -- the switch ------------------------------------------------------------------------------


def test_off_by_default_nothing_is_injected() -> None:
    """Without the switch, a 100% error rate injects nothing and the call runs."""
    faults = Faults(error_rate=1.0, seed=1)
    assert not chaos.is_enabled()
    assert faults.call(ok) == "ok"
    assert faults.statistics().calls == 0


def test_enabled_block_turns_injection_on_and_restores() -> None:
    """chaos.enabled() injects inside the block only; disabled() nests inside it."""
    faults = Faults(error_rate=1.0, seed=1)
    with chaos.enabled():
        with pytest.raises(rs.InjectedFault):
            faults.call(ok)
        with chaos.disabled():
            assert faults.call(ok) == "ok"
        with pytest.raises(rs.InjectedFault):
            faults.call(ok)
    assert faults.call(ok) == "ok"


def test_enabled_argument_overrides_the_switch() -> None:
    """enabled=True always injects; enabled=False never does."""
    always = Faults(error_rate=1.0, enabled=True, seed=1)
    never = Faults(error_rate=1.0, enabled=False, seed=1)
    with pytest.raises(rs.InjectedFault):
        always.call(ok)
    with chaos.enabled():
        assert never.call(ok) == "ok"


def test_switch_is_scoped_to_the_thread() -> None:
    """Another thread does not see a block enabled in this one."""
    import threading

    faults = Faults(error_rate=1.0, seed=1)
    seen: list[str] = []
    with chaos.enabled():
        thread = threading.Thread(target=lambda: seen.append(faults.call(ok)))
        thread.start()
        thread.join()
    assert seen == ["ok"]


def test_environment_variable_enables_the_whole_process() -> None:
    """RESILIENCE_CHAOS=1 turns injection on everywhere, in every thread."""
    code = (
        "import threading, resilience as rs\n"
        "from resilience import chaos\n"
        "f = rs.chaos.Faults(error_rate=1.0, seed=1)\n"
        "out = []\n"
        "def run():\n"
        "    try: f.call(lambda: None); out.append('ran')\n"
        "    except rs.InjectedFault: out.append('injected')\n"
        "t = threading.Thread(target=run); t.start(); t.join(); run()\n"
        "print(chaos.is_enabled(), out)\n"
    )
    env = {**os.environ, "RESILIENCE_CHAOS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True ['injected', 'injected']"


@pytest.mark.parametrize(
    ("value", "on", "warned"),
    [
        ("yes", True, False),
        ("ON", True, False),
        ("off", False, False),
        ("", False, False),
        ("disabled", False, True),
        ("2", False, True),
    ],
)
def test_only_true_values_of_the_variable_turn_chaos_on(value: str, on: bool, warned: bool) -> None:
    """A typo or ``RESILIENCE_CHAOS=disabled`` leaves fault injection off, with a warning."""
    code = "from resilience import chaos\nprint(chaos.is_enabled())\n"
    env = {**os.environ, "RESILIENCE_CHAOS": value}
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(on)
    assert ("fault injection stays off" in result.stderr) is warned


# -- determinism -------------------------------------------------------------------------


def sequence(seed: int) -> list[str]:
    clock = FakeClock()
    faults = Faults(
        chaos.Latency(chaos.uniform(0.0, 1.0), rate=0.5),
        chaos.Error(rate=0.2),
        chaos.Result("replaced", rate=0.1),
        seed=seed,
        clock=clock,
    )
    seen = []
    with chaos.enabled():
        for _ in range(200):
            before = clock.monotonic()
            try:
                outcome = faults.call(ok)
            except rs.InjectedFault:
                outcome = "error"
            seen.append(f"{outcome}+{clock.monotonic() - before:.6f}")
    return seen


def test_same_seed_same_fault_sequence() -> None:
    """Two injectors with one seed inject the same faults, latencies included."""
    assert sequence(1234) == sequence(1234)
    assert sequence(1234) != sequence(4321)


def test_same_seed_same_sequence_across_processes() -> None:
    """A seed replays in another process (different hash randomization)."""
    code = (
        "import json, sys\n"
        "sys.path.insert(0, '.')\n"
        "from tests.chaos.test_faults import sequence\n"
        "print(json.dumps(sequence(1234)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert json.loads(result.stdout) == sequence(1234)


def test_draws_do_not_depend_on_schedules() -> None:
    """The n-th call gets the same draw whether or not earlier calls were in a window."""
    clock = FakeClock()
    gated = Faults(chaos.Error(rate=0.5, schedule=[(10, 20)]), seed=9, clock=clock)
    always = Faults(chaos.Error(rate=0.5), seed=9, clock=clock)
    with chaos.enabled():
        outcomes(gated, 30)  # before the window: draws made, nothing injected
        outcomes(always, 30)
        clock.advance(10)
        assert outcomes(gated, 50) == outcomes(always, 50)


def latencies(faults: Faults, clock: FakeClock, calls: int) -> list[float]:
    """The delay each of ``calls`` calls got (0.0 when none fired)."""
    delays = []
    for _ in range(calls):
        before = clock.monotonic()
        try:
            faults.call(lambda: None)
        except rs.InjectedFault:
            pass
        delays.append(round(clock.monotonic() - before, 9))
    return delays


def test_latency_amounts_do_not_depend_on_schedules_or_earlier_faults() -> None:
    """A latency's amount is drawn on every call too: a call outside the window, or one an
    earlier fault ended, does not shift the delays every later call gets."""

    def injector(clock: FakeClock) -> Faults:
        return Faults(
            chaos.Error(rate=0.3),
            chaos.Latency(chaos.uniform(0, 1), schedule=[chaos.Window(0, 10, every=100)]),
            seed=1,
            clock=clock,
        )

    with chaos.enabled():
        clock = FakeClock()
        straight = latencies(injector(clock), clock, 8)  # all inside the first window
        clock = FakeClock()
        detour = injector(clock)
        first = latencies(detour, clock, 2)
        clock.advance(50 - clock.monotonic())
        third = latencies(detour, clock, 1)  # the window is closed for this one
        clock.advance(100 - clock.monotonic())
        rest = latencies(detour, clock, 5)  # open again
    assert third == [0.0]
    assert 0.0 in straight  # the error fault ended some calls
    assert any(d > 0.0 for d in straight[3:])
    assert first + rest == straight[:2] + straight[3:]


def test_reset_replays_from_the_start(fake_clock: FakeClock) -> None:
    """reset() restarts the RNG and the schedule: the same faults come again."""
    faults = Faults(error_rate=0.5, seed=5, clock=fake_clock)
    with chaos.enabled():
        first = outcomes(faults, 40)
        faults.reset()
        assert outcomes(faults, 40) == first
    assert faults.statistics().calls == 40


def test_unseeded_injector_records_its_seed() -> None:
    """Without seed=, a random seed is chosen and kept for replay."""
    faults = Faults(error_rate=0.5)
    replay = Faults(error_rate=0.5, seed=faults.seed)
    with chaos.enabled():
        assert outcomes(faults, 50) == outcomes(replay, 50)


# -- what is injected ------------------------------------------------------------------------


def test_latency_sleeps_on_the_policy_clock(fake_clock: FakeClock) -> None:
    """Latency is a sleep on the injected clock (instant with FakeClock), then the call runs."""
    faults = Faults(latency=0.25, seed=1, clock=fake_clock)
    with chaos.enabled():
        assert faults.call(ok) == "ok"
    assert fake_clock.sleeps == [0.25]
    assert fake_clock.monotonic() == 0.25


@pytest.mark.anyio
async def test_latency_async_uses_the_clock(fake_clock: FakeClock) -> None:
    """The async shell sleeps on the same clock."""
    faults = Faults(chaos.Latency(chaos.uniform(0.1, 0.2)), seed=1, clock=fake_clock)
    with chaos.enabled():
        for _ in range(20):
            assert await faults.call_async(ok_async) == "ok"
    assert len(fake_clock.sleeps) == 20
    assert all(0.1 <= s <= 0.2 for s in fake_clock.sleeps)


def test_distributions_stay_in_their_bounds() -> None:
    """uniform, exponential and lognormal draws are non-negative and capped."""
    import random

    rng = random.Random(3)
    for dist, low, high in [
        (chaos.uniform(0.1, 0.3), 0.1, 0.3),
        (chaos.exponential(0.5, cap=1.0), 0.0, 1.0),
        (chaos.lognormal(0.05, sigma=2.0, cap=0.4), 0.0, 0.4),
    ]:
        draws = [dist(rng) for _ in range(500)]
        assert all(low <= d <= high for d in draws), dist
        assert len(set(draws)) > 100, dist
    assert "uniform(0.1, 0.3)" == repr(chaos.uniform(0.1, 0.3))


def test_error_forms_type_instance_and_factory() -> None:
    """Types are built with a message, instances copied, factories called each time."""
    instance = ConnectionResetError("reset by chaos")
    faults = [
        Faults(error=ConnectionError, seed=1),
        Faults(error=instance, seed=1),
        Faults(error=lambda: rs.RateLimited(retry_after=2.0), seed=1),
    ]
    raised = []
    with chaos.enabled():
        for injector in faults:
            for _ in range(2):
                with pytest.raises(Exception) as info:
                    injector.call(ok)
                raised.append(info.value)
    assert isinstance(raised[0], ConnectionError)
    assert str(raised[0]) == "injected fault"
    assert raised[0] is not raised[1]
    assert isinstance(raised[2], ConnectionResetError)
    assert str(raised[2]) == "reset by chaos"
    assert raised[2] is not instance
    assert raised[2] is not raised[3]
    assert isinstance(raised[4], rs.RateLimited)
    assert raised[4].retry_after == 2.0


def test_result_replaces_the_call_without_running_it() -> None:
    """A Result fault returns its value; the function is not called."""
    called = []
    faults = Faults(result={"degraded": True}, seed=1)
    with chaos.enabled():
        assert faults.call(lambda: called.append(1)) == {"degraded": True}
    assert called == []


def test_sync_hang_is_a_bounded_block_then_injected_fault(fake_clock: FakeClock) -> None:
    """A sync call cannot be cancelled: it blocks hang_block seconds on the clock, then fails."""
    faults = Faults(hang_rate=1.0, hang_block=3.0, seed=1, clock=fake_clock)
    with chaos.enabled(), pytest.raises(rs.InjectedFault, match="hang"):
        faults.call(ok)
    assert fake_clock.monotonic() == 3.0


@pytest.mark.anyio
async def test_async_hang_lasts_until_a_fake_clock_timeout(fake_clock: FakeClock) -> None:
    """An async hang ends when the enclosing Timeout fires, at exactly its virtual deadline."""
    faults = Faults(hang_rate=1.0, seed=1, clock=fake_clock)
    pipeline = rs.Pipeline(rs.Timeout(2.5, clock=fake_clock), faults)
    with chaos.enabled(), pytest.raises(rs.Timeout):
        await pipeline.call_async(ok_async)
    assert fake_clock.monotonic() == pytest.approx(2.5)


@pytest.mark.anyio
async def test_async_hang_on_the_real_clock_until_cancelled() -> None:
    """On the system clock the hang is a real wait that a cancel scope ends."""
    faults = Faults(hang_rate=1.0, seed=1)
    with chaos.enabled():
        with anyio.move_on_after(0.05) as scope:
            await faults.call_async(ok_async)
    assert scope.cancelled_caught


def test_first_terminal_fault_wins_and_latency_adds_up(fake_clock: FakeClock) -> None:
    """Latencies accumulate; among ending faults the first listed that fires ends the call."""
    faults = Faults(
        chaos.Latency(0.1),
        chaos.Latency(0.2),
        chaos.Error(ValueError),
        chaos.Result("never"),
        seed=1,
        clock=fake_clock,
    )
    with chaos.enabled(), pytest.raises(ValueError):
        faults.call(ok)
    assert fake_clock.monotonic() == pytest.approx(0.3)
    assert faults.statistics().injected == {"latency": 2, "error": 1}


def test_rates_compound_as_documented() -> None:
    """error_rate a then result_rate b: P(error) = a, P(result) = (1 - a) * b."""
    faults = Faults(error_rate=0.3, result="r", result_rate=0.5, seed=11)
    with chaos.enabled():
        seen = outcomes(faults, 4000)
    assert seen.count("InjectedFault") / 4000 == pytest.approx(0.3, abs=0.03)
    assert seen.count("r") / 4000 == pytest.approx(0.7 * 0.5, abs=0.03)


def test_retry_outside_faults_fails_with_rate_to_the_power_attempts() -> None:
    """A Retry of n attempts around Faults(error_rate=p) fails about p**n of calls."""
    faults = Faults(error_rate=0.5, seed=21)
    pipeline = rs.Pipeline(
        rs.Retry(on=rs.InjectedFault, attempts=3, backoff=rs.backoff.constant(0)), faults
    )
    failures = 0
    with chaos.enabled():
        for _ in range(2000):
            try:
                pipeline.call(ok)
            except rs.InjectedFault:
                failures += 1
    assert failures / 2000 == pytest.approx(0.125, abs=0.025)


# -- when: schedules and keys ------------------------------------------------------------


def test_schedule_windows_use_the_policy_clock(fake_clock: FakeClock) -> None:
    """Faults fire only inside their windows, counted from construction."""
    fake_clock.advance(100)  # the epoch is the construction time, not clock zero
    faults = Faults(error_rate=1.0, schedule=[(1, 2), chaos.Window(5, 6)], clock=fake_clock)
    timeline = {}
    with chaos.enabled():
        for t in [0, 1, 1.5, 2, 3, 5.5, 6, 10]:
            fake_clock.set(100 + t)
            timeline[t] = outcomes(faults, 1)[0]
    assert [t for t, o in timeline.items() if o == "InjectedFault"] == [1, 1.5, 5.5]


def test_periodic_window_repeats(fake_clock: FakeClock) -> None:
    """Window(start, end, every=) repeats with that period."""
    window = chaos.Window(10, 15, every=60)
    assert [window.contains(t) for t in (9, 10, 14.9, 15, 70, 74, 76, 130)] == [
        False,
        True,
        True,
        False,
        True,
        True,
        False,
        True,
    ]


def test_each_fault_has_its_own_schedule(fake_clock: FakeClock) -> None:
    """Per-fault windows: latency early, errors later."""
    faults = Faults(
        chaos.Latency(0.5, schedule=[(0, 10)]),
        chaos.Error(rate=1.0, schedule=[(10, 20)]),
        clock=fake_clock,
    )
    with chaos.enabled():
        assert faults.call(ok) == "ok"
        fake_clock.set(12)
        with pytest.raises(rs.InjectedFault):
            faults.call(ok)
    assert fake_clock.sleeps == [0.5]


def test_key_predicate_targets_some_keys() -> None:
    """key= computes a key from the call; when= selects the keys that get faults."""
    faults = Faults(
        error_rate=1.0,
        key=lambda url: url.split("/")[2],
        when=lambda host: host == "flaky.example",
        seed=1,
    )
    with chaos.enabled():
        assert faults.call(ok, "https://good.example/x") == "ok"
        with pytest.raises(rs.InjectedFault):
            faults.call(ok, "https://flaky.example/x")


def test_predicate_without_key_receives_the_arguments() -> None:
    """Without key=, when= is called with the call's own arguments."""
    faults = Faults(chaos.Error(when=lambda user, *, admin=False: admin), seed=1)
    with chaos.enabled():
        assert faults.call(ok, "alice") == "ok"
        with pytest.raises(rs.InjectedFault):
            faults.call(ok, "root", admin=True)


# -- composition, events, statistics --------------------------------------------------------


@pytest.mark.anyio
async def test_decorates_async_functions_inside_a_pipeline(fake_clock: FakeClock) -> None:
    """Faults is a policy: innermost in a Pipeline, the fallback sees injected errors."""
    faults = Faults(error_rate=1.0, seed=3, clock=fake_clock)

    @rs.Pipeline(rs.Fallback("fallback", on=rs.InjectedFault), faults)
    async def lookup(key: str) -> str:
        return f"value of {key}"

    assert await lookup("a") == "value of a"
    with chaos.enabled():
        assert await lookup("a") == "fallback"


def test_emits_fault_injected_events() -> None:
    """Listeners get one FaultInjected per fault that fired."""
    events: list[rs.Event] = []
    faults = Faults(chaos.Latency(0.0), chaos.Error(), seed=1, clock=FakeClock(), name="f")
    faults.add_listener(events.append)
    with chaos.enabled(), pytest.raises(rs.InjectedFault):
        faults.call(ok)
    assert [(e.policy, e.kind) for e in events if isinstance(e, chaos.FaultInjected)] == [
        ("f", "latency"),
        ("f", "error"),
    ]


def test_statistics_count_calls_and_kinds() -> None:
    """statistics() counts enabled calls and injections per kind."""
    faults = Faults(error_rate=0.5, seed=8)
    with chaos.enabled():
        seen = outcomes(faults, 100)
    stats = faults.statistics()
    assert stats.calls == 100
    assert stats.injected == {"error": seen.count("InjectedFault")}
    assert stats.total == seen.count("InjectedFault")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one fault"),
        ({"error_rate": 1.5}, "error_rate must be a number in"),
        ({"latency_rate": 0.5}, "latency_rate needs latency"),
        ({"result_rate": 0.5}, "result_rate needs result"),
        ({"latency": -1}, "Latency seconds must be >= 0"),
        ({"error": 42}, "exception must be an exception type"),
        ({"error": UnicodeDecodeError}, "cannot be built from a message"),
        ({"error_rate": 0.1, "schedule": [(5, 1)]}, "Window end must be"),
        ({"error_rate": 0.1, "schedule": "soon"}, "schedule must be"),
        ({"error_rate": 0.1, "key": 3}, "key must be callable"),
        ({"error_rate": 0.1, "enabled": "yes"}, "enabled must be None, True or False"),
        ({"hang_rate": 0.1, "hang_block": -1}, "hang_block must be >= 0"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], message: str) -> None:
    """Bad arguments raise ConfigurationError naming the argument."""
    with pytest.raises(rs.ConfigurationError, match=message):
        Faults(**kwargs)


def test_http_faults_are_refused_by_the_call_policy() -> None:
    """Status and other HTTP faults belong to the transport and middleware."""
    with pytest.raises(rs.ConfigurationError, match="FaultyTransport"):
        Faults(chaos.Status(503))


def test_window_validation() -> None:
    """A periodic window must fit in its period."""
    with pytest.raises(rs.ConfigurationError, match="every must be >="):
        chaos.Window(0, 10, every=5)
    with pytest.raises(rs.ConfigurationError, match="Result needs the value"):
        chaos.Result()


@pytest.mark.anyio
async def test_async_latency_longer_than_the_timeout_ends_at_the_deadline(
    fake_clock: FakeClock,
) -> None:
    """A 5 s injected delay under Timeout(1): cut at virtual time 1, not after 5 s."""
    faults = Faults(latency=5.0, seed=1, clock=fake_clock)
    pipeline = rs.Pipeline(rs.Timeout(1.0, clock=fake_clock), faults)
    with chaos.enabled(), pytest.raises(rs.Timeout):
        await pipeline.call_async(ok_async)
    assert fake_clock.monotonic() == pytest.approx(1.0)


def test_repr_names_faults_and_seed() -> None:
    """repr shows what is injected and the seed to replay it."""
    text = repr(Faults(chaos.Latency(chaos.uniform(0.1, 0.2)), seed=77))
    assert "uniform(0.1, 0.2)" in text
    assert "seed=77" in text


def test_an_instance_is_raised_as_a_true_copy() -> None:
    """chaos.Error(instance) raises a copy each time (never the one object, whose
    traceback, and the frames it holds, would grow with every raise). The copy has the
    instance's message, args and attributes, also when its __init__ formats the message
    from other arguments (it was refused, or rebuilt as "upstream answered upstream
    answered 503" by calling the class again with the formatted args)."""

    class UpstreamError(Exception):
        def __init__(self, service: str, status: int) -> None:
            super().__init__(f"{service} answered {status}")
            self.status = status

    given = UpstreamError("billing", 502)
    error = chaos.Error(given)
    first, second = error.build(), error.build()
    assert first is not second
    assert first is not given
    for raised in (first, second):
        assert type(raised) is UpstreamError
        assert str(raised) == "billing answered 502"
        assert raised.args == given.args
        assert raised.status == 502  # type: ignore[attr-defined]
        assert raised.__traceback__ is None
    factory = chaos.Error(lambda: UpstreamError("billing", 502))
    assert factory.build() is not factory.build()


class _Coded(Exception):
    __slots__ = ("code",)


class _CodedMore(_Coded):
    __slots__ = "more"  # one slot, spelled as a string


class _Refused(ConnectionRefusedError):
    def __init__(self, host: str) -> None:
        super().__init__(111, f"{host} refused the connection")


def test_copies_keep_what_built_in_bases_and_slots_hold() -> None:
    """What an __init__ stores outside __dict__ survives the copy: the fields of built-in
    exceptions (SystemExit.code, StopIteration.value, ImportError.name, OSError.errno,
    the UnicodeError fields) and slots declared by the class or its parents (copies
    of SystemExit(3) exited with status 0, an OSError subclass printed its args tuple)."""
    coded = _CodedMore("x")
    coded.code, coded.more = 7, 8
    cases: list[tuple[BaseException, Callable[[Any], object]]] = [
        (SystemExit(3), lambda e: e.code),
        (StopIteration(42), lambda e: e.value),
        (ImportError("no module", name="foo", path="/p"), lambda e: (e.name, e.path)),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), lambda e: (e.start, e.reason)),
        (_Refused("db1"), lambda e: (e.errno, e.strerror, e.filename)),
        (FileNotFoundError(2, "nope", "/f"), lambda e: (e.errno, e.filename, e.filename2)),
        (coded, lambda e: (e.code, e.more)),
    ]
    for given, fields in cases:
        copy = chaos.Error(given).build()
        assert copy is not given
        assert type(copy) is type(given)
        assert fields(copy) == fields(given)
        assert str(copy) == str(given)
    assert str(chaos.Error(_Refused("db1")).build()) == "[Errno 111] db1 refused the connection"


def test_fault_events_carry_the_call_s_key() -> None:
    """Faults(key=...) reported FaultInjected with key=None."""
    events: list[rs.Event] = []
    faults = rs.Faults(error_rate=1.0, key=lambda user: user, seed=1, enabled=True)
    faults.add_listener(events.append)
    with pytest.raises(rs.InjectedFault):
        faults.call(lambda user: "ok", "alice")
    assert [e.key for e in events] == ["alice"]


def test_a_proxy_on_ipv6_loopback_gives_a_url_clients_parse() -> None:
    """FaultProxy(host="::1").url() was redis://::1:PORT/0, which nothing parses."""
    from urllib.parse import urlsplit

    from resilience.testing import FaultProxy

    proxy = FaultProxy(6390, host="::1")
    assert urlsplit(proxy.url("redis", "/0")).hostname == "::1"
