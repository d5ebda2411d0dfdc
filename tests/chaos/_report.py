"""What the chaos suite measured, for the ``make chaos`` summary table.

Each chaos test records, per scenario: how many fault schedules it tried, how many
calls it made, how each call ended (outcome -> count), the worst call latency and the
recovery times (from "faults cleared" to "served normally again"). ``python -m
tests.chaos`` prints the table; ``RESILIENCE_CHAOS_REPORT=path`` also writes it as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Longer, randomized schedules (``make chaos``); the default run stays bounded.
LONG = os.environ.get("RESILIENCE_CHAOS_LONG", "") not in ("", "0", "false", "no")


def scaled(default: int, long: int) -> int:
    """``default`` in the bounded run, ``long`` under RESILIENCE_CHAOS_LONG=1."""
    return long if LONG else default


@dataclass
class Scenario:
    """The record of one scenario (a policy under one kind of fault)."""

    name: str
    clock: str = "virtual"
    schedules: int = 0
    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    worst_latency: float = 0.0
    recoveries: list[float] = field(default_factory=list)

    def call(self, outcome: str, latency: float) -> None:
        """Record one call: how it ended and how long it took."""
        self.calls += 1
        self.outcomes[outcome] += 1
        self.worst_latency = max(self.worst_latency, latency)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "clock": self.clock,
            "schedules": self.schedules,
            "calls": self.calls,
            "outcomes": dict(self.outcomes),
            "worst_latency": self.worst_latency,
            "recoveries": self.recoveries,
        }


class Recorder:
    """Scenarios by name; thread-safe enough for the suite (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scenarios: dict[str, Scenario] = {}

    def scenario(self, name: str, *, clock: str = "virtual") -> Scenario:
        with self._lock:
            if name not in self.scenarios:
                self.scenarios[name] = Scenario(name, clock)
            return self.scenarios[name]

    def as_json(self) -> str:
        return json.dumps([s.as_dict() for s in self.scenarios.values()], indent=1)

    def table(self) -> str:
        """The summary table (markdown), one row per scenario."""
        rows = [
            "| scenario | clock | schedules | calls | outcomes | worst latency "
            "| recovery (max / median) |",
            "|---|---|---:|---:|---|---:|---|",
        ]
        for s in sorted(self.scenarios.values(), key=lambda s: s.name):
            outcomes = ", ".join(f"{k} {v}" for k, v in s.outcomes.most_common())
            if s.recoveries:
                recovery = (
                    f"{max(s.recoveries) * 1000:.0f} ms / "
                    f"{statistics.median(s.recoveries) * 1000:.0f} ms (n={len(s.recoveries)})"
                )
            else:
                recovery = "n/a"
            rows.append(
                f"| {s.name} | {s.clock} | {s.schedules} | {s.calls} | {outcomes} "
                f"| {s.worst_latency * 1000:.0f} ms | {recovery} |"
            )
        return "\n".join(rows)


RECORD = Recorder()
