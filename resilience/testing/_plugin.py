"""The resilience pytest plugin, registered through the ``pytest11`` entry point.

Installing resilience gives every test suite these fixtures:

* ``fake_clock``: a :class:`FakeClock` starting at 0.
* ``redis_server``: a private, disposable ``redis-server`` (see :class:`RedisServer`).
  Skipped with a loud reason when the binary is missing; fails instead when
  ``RESILIENCE_REQUIRE_REDIS=1``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ._fake_clock import FakeClock
from ._redis import RedisServer, RedisUnavailable

REQUIRE_ENV = "RESILIENCE_REQUIRE_REDIS"


def redis_required() -> bool:
    """Whether missing Redis must fail tests instead of skipping them."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0", "false", "no")


def spawn_redis(**kwargs: object) -> RedisServer:
    """Start a :class:`RedisServer`, skipping (or failing under CI) if that is impossible."""
    try:
        return RedisServer(**kwargs).start()  # type: ignore[arg-type]
    except RedisUnavailable as exc:
        message = f"REDIS UNAVAILABLE, test needs a redis-server binary: {exc}"
        if redis_required():
            pytest.fail(f"{message} ({REQUIRE_ENV}=1)")
        pytest.skip(message)


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
