"""What the injectors share around the core: the switch, events, statistics, hangs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._clock import Clock
from .._deadline import clamp
from .._events import Event, Observable
from ..errors import ConfigurationError
from ._core import FaultCore, Plan
from ._specs import Fault
from ._switch import chaos_active

__all__ = [
    "HANG_STEP",
    "FaultInjected",
    "FaultStatistics",
    "Observable",
    "emit_plan",
    "hang_async",
    "sleep_async",
    "switch_for",
]

#: How far an async hang moves its clock per step (a FakeClock's timers fire in between).
HANG_STEP = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultInjected(Event):
    """A fault injector fired ``fault`` (its ``kind``: latency, error, result, hang, ...).

    ``delay`` is the injected latency in seconds (0 for other kinds).

    Example::

        faults.add_listener(lambda e: print("injected", e.kind, e.delay))
    """

    kind: str
    delay: float = 0.0
    fault: Fault | None = None


@dataclass(frozen=True, slots=True)
class FaultStatistics:
    """What an injector did since it was built (or ``reset()``).

    ``calls`` counts the calls it saw while enabled; ``injected`` maps a fault kind
    (``"latency"``, ``"error"``, ``"result"``, ``"hang"``, ``"status"``, ...) to how
    many times it fired.

    Example::

        stats = faults.statistics()
        print(stats.calls, stats.injected.get("error", 0), stats.total)
    """

    calls: int
    injected: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Faults injected, all kinds together."""
        return sum(self.injected.values())


def statistics_of(core: FaultCore) -> FaultStatistics:
    """A snapshot of a core's counters."""
    calls, counts = core.snapshot()
    return FaultStatistics(calls, counts)


def _always() -> bool:
    return True


def _never() -> bool:
    return False


def switch_for(enabled: bool | None) -> Callable[[], bool]:
    """The "is chaos on?" test of an injector: the global switch, or a fixed answer."""
    if enabled is None:
        return chaos_active
    if enabled is True:
        return _always
    if enabled is False:
        return _never
    raise ConfigurationError(f"enabled must be None, True or False, got {enabled!r}")


def emit_plan(policy: Any, plan: Plan, key: Any = None) -> None:
    """Send one :class:`FaultInjected` per fired fault to ``policy``'s listeners."""
    name = policy.name
    for fault, delay in plan.fired:
        policy._emit(
            FaultInjected(
                policy=name,
                key=None if key is None else str(key),
                kind=fault.kind,
                delay=delay,
                fault=fault,
            )
        )


async def sleep_async(clock: Clock, seconds: float) -> None:
    """Sleep ``seconds`` on ``clock``, in two steps when the ambient deadline falls inside.

    The total is the same; the split lets a FakeClock fire an enclosing Timeout exactly
    at its virtual deadline instead of after the whole injected delay.
    """
    first = clamp(seconds)
    if 0 < first < seconds:
        await clock.sleep_async(first)
        seconds -= first
    await clock.sleep_async(seconds)


async def hang_async(clock: Clock) -> None:
    """Wait until cancelled, moving ``clock`` forward in steps cut at the ambient deadline.

    On the system clock this is an endless sleep. On a FakeClock each step advances
    virtual time (firing the timers of an enclosing Timeout), so a hang under
    ``Timeout(2)`` ends at virtual time 2, not later.
    """
    while True:
        step = clamp(HANG_STEP)
        if step <= 0 or math.isnan(step):
            step = HANG_STEP
        await clock.sleep_async(step)
