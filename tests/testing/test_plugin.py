"""The pytest plugin in a user's project: fixtures from the installed package, seeds replay."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import socket

import pytest

import resilience as rs
from resilience import chaos


def test_faults_fixture_enables_chaos_and_seeds(faults, fake_clock):
    injector = faults(error_rate=1.0, clock=fake_clock)
    assert chaos.is_enabled()
    assert injector.seed == faults.seed
    assert faults(latency=0.1).seed == faults.seed + 1
    with pytest.raises(rs.InjectedFault):
        injector.call(lambda: "ok")


def test_chaos_is_off_again_in_the_next_test():
    assert not chaos.is_enabled()


@pytest.mark.anyio
async def test_async_test_sees_chaos_enabled(faults, fake_clock):
    injector = faults(latency=0.5, clock=fake_clock)

    async def ok():
        return "ok"

    assert await injector.call_async(ok) == "ok"
    assert fake_clock.sleeps == [0.5]


def test_fault_proxy_in_front_of_redis(redis_server, fault_proxy):
    proxy = fault_proxy(redis_server.port)
    with socket.create_connection(proxy.address, timeout=2) as sock:
        sock.sendall(b"PING\\r\\n")
        assert sock.recv(64) == b"+PONG\\r\\n"
    proxy.refuse = True
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=2)
"""


def test_fixtures_work_in_a_users_project(pytester: pytest.Pytester) -> None:
    """A separate pytest process, in a fresh project, gets the fixtures from the entry point."""
    pytester.makepyfile(test_user=USER_TESTS)
    pytester.makeconftest(
        "import pytest\n\n"
        "@pytest.fixture(params=['asyncio', 'trio'])\n"
        "def anyio_backend(request):\n"
        "    return request.param\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=5)  # the async test runs on asyncio and trio


def test_fixtures_are_documented(pytester: pytest.Pytester) -> None:
    """pytest --fixtures lists the plugin's fixtures with their descriptions."""
    result = pytester.runpytest("--fixtures", "-p", "no:cacheprovider")
    text = result.stdout.str()
    for name in ("fake_clock", "redis_server", "faults", "fault_proxy"):
        assert re.search(rf"^{name}\b", text, re.MULTILINE), name
    assert "--chaos-seed" in pytester.runpytest("--help").stdout.str()


FAILING = """
def test_fails(faults):
    injector = faults(error_rate=0.5)
    print("SEED", injector.seed)
    assert False
"""


def test_failure_report_prints_the_seed_and_it_replays(pytester: pytest.Pytester) -> None:
    """A failing test's report names its chaos seed; --chaos-seed=N replays that seed."""
    pytester.makepyfile(test_failing=FAILING)
    first = pytester.runpytest("-p", "no:cacheprovider")
    first.assert_outcomes(failed=1)
    match = re.search(r"chaos seed (\d+): replay with --chaos-seed=(\d+)", first.stdout.str())
    assert match is not None
    assert match.group(1) == match.group(2)
    seed = match.group(1)
    assert f"SEED {seed}" in first.stdout.str()  # the default seed is stable per test id
    replay = pytester.runpytest("-p", "no:cacheprovider", f"--chaos-seed={seed}")
    assert f"SEED {seed}" in replay.stdout.str()
    other = pytester.runpytest("-p", "no:cacheprovider", "--chaos-seed=12345")
    assert "SEED 12345" in other.stdout.str()


def test_plugin_needs_only_core_dependencies() -> None:
    """The plugin imports with httpx, redis, starlette and hypothesis unavailable."""
    code = (
        "import sys\n"
        "for name in ('httpx', 'redis', 'starlette', 'hypothesis', 'prometheus_client'):\n"
        "    sys.modules[name] = None\n"
        "import resilience.testing._plugin as plugin\n"
        "print(plugin.faults.__name__, plugin.fault_proxy.__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["faults", "fault_proxy"]


def test_a_chaos_seed_that_is_not_a_number_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """``--chaos-seed=banana`` stops pytest at once, instead of erroring in every test."""
    pytester.makepyfile(test_failing=FAILING)
    result = pytester.runpytest("-p", "no:cacheprovider", "--chaos-seed=banana")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "expected an integer or 'random'" in result.stderr.str()
    assert pytester.runpytest("-p", "no:cacheprovider", "--chaos-seed=Random").ret == 1
