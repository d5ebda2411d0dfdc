"""Testing helpers: virtual time, a disposable Redis, scoped no-wait retries, chaos tools.

The pytest plugin (installed with the package) exposes them as fixtures:
``fake_clock``, ``redis_server``, ``faults`` and ``fault_proxy``. Hypothesis
strategies for fault schedules live in :mod:`resilience.testing.strategies` (imported
on demand: it needs hypothesis).
"""

from ._chaos_fixtures import FaultProxyFactory, FaultsFixture
from ._fake_clock import FakeClock, TimerHandle
from ._fault_proxy import FaultProxy, ProxyStatistics
from ._no_wait import no_wait
from ._redis import RedisServer, RedisUnavailable, free_port, resp_command

__all__ = [
    "FakeClock",
    "FaultProxy",
    "FaultProxyFactory",
    "FaultsFixture",
    "ProxyStatistics",
    "RedisServer",
    "RedisUnavailable",
    "TimerHandle",
    "free_port",
    "no_wait",
    "resp_command",
]
