"""Testing helpers: virtual time, a disposable Redis, scoped no-wait retries.

The pytest plugin (installed with the package) exposes them as fixtures:
``fake_clock`` and ``redis_server``.
"""

from ._fake_clock import FakeClock, TimerHandle
from ._no_wait import no_wait
from ._redis import RedisServer, RedisUnavailable, free_port, resp_command

__all__ = [
    "FakeClock",
    "RedisServer",
    "RedisUnavailable",
    "TimerHandle",
    "free_port",
    "no_wait",
    "resp_command",
]
