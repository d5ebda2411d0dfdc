"""The resilience pytest plugin, registered through the ``pytest11`` entry point.

Installing resilience gives every test suite these fixtures:

* ``fake_clock``: a :class:`FakeClock` starting at 0.
* ``redis_server``: a private, disposable ``redis-server`` (see :class:`RedisServer`).
  Skipped with a loud reason when the binary is missing; fails instead when
  ``RESILIENCE_REQUIRE_REDIS=1``.
* ``faults``: chaos enabled for the test, and a factory of seeded
  :class:`resilience.Faults` (see :class:`FaultsFixture`); the seed is stable per test,
  printed when the test fails, and replayed with ``--chaos-seed=N``
  (``--chaos-seed=random`` explores).
* ``fault_proxy``: a factory of :class:`FaultProxy` TCP proxies, stopped after the test.

The plugin needs only pytest and the core dependencies.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Generator, Iterator

import pytest

from .._chaos._switch import enabled as chaos_enabled
from ..errors import ConfigurationError
from ._chaos_fixtures import FaultProxyFactory, FaultsFixture, seed_for
from ._fake_clock import FakeClock
from ._redis import RedisServer, RedisUnavailable

REQUIRE_ENV = "RESILIENCE_REQUIRE_REDIS"
SEED_ENV = "RESILIENCE_CHAOS_SEED"

_SEED_KEY = pytest.StashKey[int]()


def redis_required() -> bool:
    """Whether missing Redis must fail tests instead of skipping them."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0", "false", "no")


def spawn_redis(**kwargs: object) -> RedisServer:
    """Start a :class:`RedisServer`, skipping (or failing under CI) if that is impossible.

    Without an explicit ``port``, a start that loses its free port to another process
    (parallel test workers) is tried again on a new one, twice.
    """
    attempts = 1 if "port" in kwargs else 3
    try:
        for attempt in range(attempts):
            try:
                return RedisServer(**kwargs).start()  # type: ignore[arg-type]
            except RedisUnavailable:
                if attempt + 1 == attempts or shutil.which("redis-server") is None:
                    raise
                # Most likely a port race: the next RedisServer draws a new free port.
        raise AssertionError("unreachable")  # pragma: no cover
    except RedisUnavailable as exc:
        message = f"REDIS UNAVAILABLE: {exc}"
        if redis_required():
            pytest.fail(f"{message} ({REQUIRE_ENV}=1)")
        pytest.skip(message)


def _seed_option(value: str) -> str:
    """``--chaos-seed`` is checked when pytest parses it, by :func:`seed_for`."""
    try:
        seed_for("", value)
    except ConfigurationError:
        message = f"expected an integer or 'random', got {value!r}"
        raise argparse.ArgumentTypeError(message) from None
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--chaos-seed``: replay (an integer) or explore (``random``) chaos seeds."""
    group = parser.getgroup("resilience")
    group.addoption(
        "--chaos-seed",
        default=None,
        type=_seed_option,
        help="seed of the `faults` fixture: an integer to replay a failure, or 'random' "
        f"(default: stable per test; also ${SEED_ENV})",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Print the chaos seed of a failed test that used the ``faults`` fixture."""
    report = yield
    seed = item.stash.get(_SEED_KEY, None)
    if seed is not None and report.failed:
        report.sections.append(
            ("resilience chaos", f"chaos seed {seed}: replay with --chaos-seed={seed}")
        )
    return report


@pytest.fixture
def fake_clock() -> FakeClock:
    """A :class:`resilience.testing.FakeClock` at time 0."""
    return FakeClock()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private ``redis-server`` on a free port, stopped after the test."""
    server = spawn_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> Iterator[FaultsFixture]:
    """Chaos on for this test, and a factory of seeded :class:`resilience.Faults`."""
    option = request.config.getoption("--chaos-seed", None) or os.environ.get(SEED_ENV)
    seed = seed_for(request.node.nodeid, option)
    request.node.stash[_SEED_KEY] = seed
    with chaos_enabled():
        yield FaultsFixture(seed)


@pytest.fixture
def fault_proxy() -> Iterator[FaultProxyFactory]:
    """``fault_proxy(port)`` starts a :class:`FaultProxy` to ``127.0.0.1:port``."""
    factory = FaultProxyFactory()
    try:
        yield factory
    finally:
        factory.stop_all()
