"""Circuit breakers: stop calling what fails, probe it after a cool-down, degrade meanwhile.

* :class:`CircuitBreaker`: the policy (decorator, ``with``/``async with``, ``Pipeline``
  step, low-level :class:`Permit` seam), per key if asked, shared across processes
  through Redis if asked.
* :class:`CircuitState`: CLOSED, OPEN, HALF_OPEN, DISABLED, FORCED_OPEN, METRICS_ONLY.
* :class:`BreakerCore`, :class:`CountWindow`, :class:`TimeWindow`: the pure state
  machine and its sliding windows (time is an argument; no I/O).
* :class:`SharedState`: the advisory Redis shared state (pub/sub open signals, one
  fleet-wide half-open probe, optional quorum).
* :class:`PyBreakerPolicy`: an existing ``pybreaker.CircuitBreaker`` as a policy.

Example::

    import resilience as rs

    breaker = rs.CircuitBreaker(failure_rate=0.5, window=50, open_for=30,
                                fallback=lambda exc: "degraded answer")

    @breaker
    async def ask(prompt: str) -> str: ...
"""

from ._breaker import CircuitBreaker, Permit
from ._config import BreakerConfig
from ._core import BreakerCore, BreakerStatistics
from ._events import BreakerStateChanged, OutcomeRecorded
from ._pybreaker import PyBreakerPolicy
from ._shared import SharedState
from ._state import CircuitState
from ._windows import CountWindow, TimeWindow

__all__ = [
    "BreakerConfig",
    "BreakerCore",
    "BreakerStateChanged",
    "BreakerStatistics",
    "CircuitBreaker",
    "CircuitState",
    "CountWindow",
    "OutcomeRecorded",
    "Permit",
    "PyBreakerPolicy",
    "SharedState",
    "TimeWindow",
]
