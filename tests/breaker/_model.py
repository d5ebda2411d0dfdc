"""A small, obviously-correct reference model of the circuit breaker rules.

Written from the issue's rules, independently of the implementation: it keeps every
recorded outcome in a list and recomputes the window from scratch each time, and it
identifies episodes by an integer epoch that changes on every state entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    failure_rate: float | None
    window: float
    window_type: str
    buckets: int
    min_calls: int
    slow_call: float | None
    slow_call_rate: float
    consecutive_failures: int | None
    open_for: float
    open_for_max: float | None
    half_open_calls: int
    max_half_open_wait: float | None

    def kwargs(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class Admitted:
    epoch: int
    kind: str  # "window" | "probe" | "disabled"
    start: float


@dataclass
class Record:
    at: float
    failed: bool
    slow: bool


@dataclass
class Model:
    config: ModelConfig
    state: str = "closed"
    epoch: int = 0
    records: list[Record] = field(default_factory=list)
    consecutive: int = 0
    trips: int = 0
    open_until: float = 0.0
    half_since: float = 0.0
    half_admitted: int = 0
    half_results: list[tuple[bool, bool]] = field(default_factory=list)

    # ------------------------------------------------------------------ entering states

    def enter(self, state: str, now: float, *, open_for: float | None = None) -> None:
        self.epoch += 1
        self.state = state
        if state in ("closed", "metrics_only"):
            self.records = []
            self.consecutive = 0
            if state == "closed":
                self.trips = 0
        if state == "open":
            if open_for is None:
                self.trips += 1
                open_for = self.config.open_for
                if self.config.open_for_max is not None:
                    open_for = min(self.config.open_for * self.trips, self.config.open_for_max)
            self.open_until = now + open_for
        if state == "half_open":
            self.half_since = now  # set again when the first outstanding probe starts
            self.half_admitted = 0
            self.half_results = []

    def poll(self, now: float) -> None:
        if self.state == "open" and now >= self.open_until:
            self.enter("half_open", now)
        elif (
            self.state == "half_open"
            and self.config.max_half_open_wait is not None
            and self.half_admitted > len(self.half_results)
            and now >= self.half_since + self.config.max_half_open_wait
        ):
            self.enter("open", now)

    # ------------------------------------------------------------------ the window

    def live(self, now: float) -> list[Record]:
        config = self.config
        if config.window_type == "count":
            return self.records[-int(config.window) :]
        width = config.window / config.buckets
        current = math.floor(now // width)
        return [r for r in self.records if math.floor(r.at // width) > current - config.buckets]

    def counts(self, now: float) -> tuple[int, int, int]:
        if self.state not in ("closed", "metrics_only"):
            return 0, 0, 0
        live = self.live(now)
        return len(live), sum(r.failed for r in live), sum(r.slow for r in live)

    def should_trip(self, now: float) -> bool:
        config = self.config
        if config.consecutive_failures is not None and (
            self.consecutive >= config.consecutive_failures
        ):
            return True
        calls, failures, slow = self.counts(now)
        if calls < config.min_calls:
            return False
        if config.failure_rate is not None and failures / calls >= config.failure_rate:
            return True
        return config.slow_call is not None and slow / calls >= config.slow_call_rate

    # ------------------------------------------------------------------ calls

    def acquire(self, now: float) -> Admitted | float | None:
        """An Admitted, or the rejection's retry_after (a float, or None)."""
        self.poll(now)
        if self.state in ("closed", "metrics_only"):
            return Admitted(self.epoch, "window", now)
        if self.state == "disabled":
            return Admitted(self.epoch, "disabled", now)
        if self.state == "half_open":
            if self.half_admitted < self.config.half_open_calls:
                if self.half_admitted == len(self.half_results):  # none out before this one
                    self.half_since = now
                self.half_admitted += 1
                return Admitted(self.epoch, "probe", now)
            if self.config.max_half_open_wait is not None:
                return max(0.0, self.half_since + self.config.max_half_open_wait - now)
            return None
        if self.state == "open":
            return self.open_until - now
        return None  # forced_open

    def settle(self, admitted: Admitted, outcome: str, now: float) -> None:
        self.poll(now)
        if admitted.epoch != self.epoch or admitted.kind == "disabled":
            return
        slow = self.config.slow_call is not None and now - admitted.start > self.config.slow_call
        if admitted.kind == "window":
            if outcome == "ignored":
                return
            failed = outcome == "failure"
            self.records.append(Record(now, failed, slow))
            self.consecutive = self.consecutive + 1 if failed else 0
            if self.state == "closed" and self.should_trip(now):
                self.enter("open", now)
            return
        # a probe
        if outcome == "ignored":
            self.half_admitted -= 1
            return
        self.half_results.append((outcome == "failure", slow))
        if len(self.half_results) < self.config.half_open_calls:
            return
        n = len(self.half_results)
        failures = sum(f for f, _ in self.half_results)
        slows = sum(s for _, s in self.half_results)
        rate = self.config.failure_rate
        failed = (failures > 0) if rate is None else failures / n >= rate
        if self.config.slow_call is not None and slows / n >= self.config.slow_call_rate:
            failed = True
        self.enter("open" if failed else "closed", now)

    # ------------------------------------------------------------------ manual control

    def manual(self, target: str, now: float) -> None:
        if target == self.state and target not in ("open", "closed"):
            return
        self.enter(target, now, open_for=self.config.open_for if target == "open" else None)
