"""The pure core of every injector: given ``now`` and the call, which faults fire.

It does no I/O and reads no clock: the shells (the policy, the httpx transport, the
ASGI middleware) pass ``now`` in and carry out the returned :class:`Plan`.

Determinism: each fault owns two RNG streams derived from the seed and its position,
one for "does it fire" and one for its values (latency draws). The "does it fire" draw
is made on *every* call, whether or not the fault's schedule or predicate lets it fire,
so the n-th call of a run gets the same draws whatever the timing: same seed and same
sequence of calls, same faults.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigurationError
from ._specs import Fault, Latency, Window

__all__ = ["FaultCore", "Gate", "Plan", "new_seed"]

#: A gate: extra condition on the call's ``(args, kwargs)`` (e.g. the host of a request).
Gate = Callable[[tuple[Any, ...], dict[str, Any]], bool]


def new_seed() -> int:
    """A fresh random seed (recorded by the injector so that the run can be replayed)."""
    return int.from_bytes(os.urandom(4), "big")


class Plan:
    """What to do with one call: sleep ``delay`` seconds, then end with ``fault`` (or run).

    ``fired`` lists the faults that fired, in order (for events and statistics).
    """

    __slots__ = ("delay", "fault", "fired")

    def __init__(self) -> None:
        self.delay = 0.0
        self.fault: Fault | None = None
        self.fired: list[tuple[Fault, float]] = []


class _Compiled:
    __slots__ = ("fault", "gate", "rate", "rate_rng", "value_rng", "when", "windows")

    def __init__(self, fault: Fault, gate: Gate | None, seed: int, index: int) -> None:
        self.fault = fault
        self.rate = fault.rate
        self.windows: tuple[Window, ...] | None = fault.schedule  # type: ignore[assignment]
        self.when = fault.when
        self.gate = gate
        self.rate_rng = random.Random(f"{seed}/{index}/rate")
        self.value_rng = random.Random(f"{seed}/{index}/value")


def _in_windows(windows: tuple[Window, ...], elapsed: float) -> bool:
    return any(window.contains(elapsed) for window in windows)


class FaultCore:
    """Decides, call by call, which faults fire; counts what it injected.

    ``key`` (optional) turns the call's arguments into the value given to every
    ``when`` predicate; without it predicates receive the arguments themselves.
    ``schedule`` and ``when`` here apply to all faults, on top of each fault's own.
    """

    def __init__(
        self,
        faults: Sequence[tuple[Fault, Gate | None]],
        *,
        seed: int,
        epoch: float,
        key: Callable[..., Any] | None = None,
        schedule: tuple[Window, ...] | None = None,
        when: Callable[..., bool] | None = None,
    ) -> None:
        if not faults:
            raise ConfigurationError("give at least one fault to inject")
        if key is not None and not callable(key):
            raise ConfigurationError(f"key must be callable, got {key!r}")
        if when is not None and not callable(when):
            raise ConfigurationError(f"when must be callable, got {when!r}")
        self.faults = tuple(fault for fault, _ in faults)
        self._gates = tuple(gate for _, gate in faults)
        self.seed = seed
        self._key = key
        self._schedule = schedule
        self._when = when
        self._needs_subject = when is not None or any(f.when is not None for f in self.faults)
        self._lock = threading.Lock()
        self.reset(epoch)

    def reset(self, epoch: float) -> None:
        """Start again: schedules count from ``epoch``, RNGs restart, counters are zeroed."""
        with self._lock:
            self.epoch = epoch
            self._compiled = [
                _Compiled(fault, gate, self.seed, index)
                for index, (fault, gate) in enumerate(zip(self.faults, self._gates))
            ]
            self.calls = 0
            self.counts: dict[str, int] = {}

    def _predicate(self, when: Callable[..., bool], subject: Any, args: Any, kwargs: Any) -> bool:
        if self._key is not None:
            return bool(when(subject))
        return bool(when(*args, **kwargs))

    def decide(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan | None:
        """The plan for one call made at ``now``; ``None`` when nothing fires."""
        elapsed = now - self.epoch
        subject = None
        if self._key is not None and self._needs_subject:
            subject = self._key(*args, **kwargs)
        with self._lock:
            self.calls += 1
            # Every draw on every call, used or not (a closed window, an earlier fault
            # ending the plan): the n-th call gets the same values whatever the timing.
            draws = [
                (
                    c,
                    c.rate_rng.random(),
                    c.fault.draw(c.value_rng) if isinstance(c.fault, Latency) else 0.0,
                )
                for c in self._compiled
            ]
        allowed = (self._schedule is None or _in_windows(self._schedule, elapsed)) and (
            self._when is None or self._predicate(self._when, subject, args, kwargs)
        )
        if not allowed:
            return None
        plan: Plan | None = None
        for compiled, draw, delay in draws:
            if draw >= compiled.rate:
                continue
            if compiled.windows is not None and not _in_windows(compiled.windows, elapsed):
                continue
            if compiled.gate is not None and not compiled.gate(args, kwargs):
                continue
            if compiled.when is not None and not self._predicate(
                compiled.when, subject, args, kwargs
            ):
                continue
            fault = compiled.fault
            if plan is None:
                plan = Plan()
            if isinstance(fault, Latency):
                plan.delay += delay
                plan.fired.append((fault, delay))
                continue
            plan.fault = fault
            plan.fired.append((fault, 0.0))
            break
        if plan is not None:
            with self._lock:
                for fault, _ in plan.fired:
                    self.counts[fault.kind] = self.counts.get(fault.kind, 0) + 1
        return plan

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """``(calls seen while enabled, injected count per fault kind)``."""
        with self._lock:
            return self.calls, dict(self.counts)
