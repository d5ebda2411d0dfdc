"""Logging adapter: policy events as structured log records, without floods.

Events fall in two groups. *Transitions* (a breaker changing state, a backend
recovering, a lost bulkhead lease) are rare by nature and always logged. *Per-call*
events (a fallback decision, a rejection, a retry, a failed outcome...) can come by the
thousand per second during an outage, so by default at most one record per event type
and policy is written every ``repeat_interval`` seconds; the next record says how many
were left out. A transition of a policy starts a new episode: its pending counts are
reported on the transition's record, and the next per-call event is logged at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from .._clock import Clock
from .._events import (
    BackendFallback,
    BackendRecovered,
    CallAdmitted,
    CallRejected,
    Event,
    FallbackUsed,
    RetriesExhausted,
    RetryBudgetExhausted,
    RetryScheduled,
    StateChanged,
    TimedOut,
    add_listener,
    remove_listener,
)
from .._repeats import Repeats
from .._validate import check_clock, check_int, check_number
from ..asgi._events import RequestAdmitted, RequestCompleted
from ..breaker._events import OutcomeRecorded
from ..bulkhead._events import BulkheadLeaseLost
from ..errors import ConfigurationError

__all__ = ["DEFAULT_LEVELS", "TRANSITIONS", "LoggingListener"]

#: Log level per event type (the first ``isinstance`` match wins; others: INFO).
DEFAULT_LEVELS: Mapping[type[Event], int] = {
    StateChanged: logging.WARNING,
    BackendFallback: logging.WARNING,
    RetriesExhausted: logging.WARNING,
    RetryBudgetExhausted: logging.WARNING,
    BulkheadLeaseLost: logging.WARNING,
    BackendRecovered: logging.INFO,
    TimedOut: logging.INFO,
    FallbackUsed: logging.INFO,
    CallRejected: logging.DEBUG,
    CallAdmitted: logging.DEBUG,
    RetryScheduled: logging.DEBUG,
    # One per request on the happy path: only worth a record when debugging.
    RequestAdmitted: logging.DEBUG,
    RequestCompleted: logging.DEBUG,
    OutcomeRecorded: logging.DEBUG,
}

#: Event types that are always logged, never counted as repeats (``isinstance``).
TRANSITIONS: tuple[type[Event], ...] = (StateChanged, BackendRecovered, BulkheadLeaseLost)

_MAX_KEYS = 10_000  # bound on the repeat table: (policy, event type) pairs are few in practice


class LoggingListener:
    """Log policy events on the ``resilience.events`` logger, repeats summarized.

    The message reads ``"<EventType> policy=<name> key=<key> field=value ..."``; the
    event itself is attached as ``record.resilience_event`` for structured handlers.
    Levels come from ``levels`` (state changes and backend fallbacks WARNING,
    rejections, scheduled retries and per-call admissions and outcomes DEBUG, the rest INFO); a
    disabled level costs one check.

    Of the same event type from the same policy, at most one record is written per
    ``repeat_interval`` seconds (``None``: every event). The next record of that type
    and policy ends with ``repeats=N``, the events left out since the previous record
    (also ``record.resilience_repeats``). :data:`TRANSITIONS` are always logged; such
    a record ends with the policy's left-out counts (``left_out={'BackendFallback':
    1234}``), and after it the next event of any type is logged at once.

    Example::

        rs.observability.LoggingListener().install()
        logging.basicConfig(level=logging.INFO)
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        levels: Mapping[type[Event], int] = DEFAULT_LEVELS,
        default_level: int = logging.INFO,
        repeat_interval: float | None = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if logger is not None and not isinstance(logger, logging.Logger | logging.LoggerAdapter):
            raise ConfigurationError(
                f"logger must be a logging.Logger (e.g. logging.getLogger('myapp')), got {logger!r}"
            )
        self.logger = logging.getLogger("resilience.events") if logger is None else logger
        if not isinstance(levels, Mapping):
            raise ConfigurationError(f"levels must map event types to log levels, got {levels!r}")
        for event_type, level in levels.items():
            if not (isinstance(event_type, type) and issubclass(event_type, Event)):
                raise ConfigurationError(f"levels keys must be event types, got {event_type!r}")
            check_int(f"levels[{event_type.__name__}]", level, minimum=0, maximum=50)
        self._levels = tuple(levels.items())
        self._default = check_int("default_level", default_level, minimum=0, maximum=50)
        self.repeat_interval: float | None = (
            None
            if repeat_interval is None
            else check_number("repeat_interval", repeat_interval, minimum=0)
        )
        self._clock = check_clock("clock", clock)
        self._cache: dict[type[Event], tuple[int, bool]] = {}
        # Keyed by (policy, event type); listeners run in whatever thread emits.
        self._repeats: Repeats[tuple[str, type[Event]]] | None = (
            None
            if self.repeat_interval is None
            else Repeats(self.repeat_interval, max_keys=_MAX_KEYS)
        )
        # Events left out in an episode whose closing transition was not written (its
        # level disabled): the next record of their type reports them (repeats=N).
        self._carried: dict[tuple[str, type[Event]], int] = {}

    def level_of(self, event: Event) -> int:
        """The level ``event`` is logged at."""
        return self._kind(type(event))[0]

    def _kind(self, kind: type[Event]) -> tuple[int, bool]:
        found = self._cache.get(kind)
        if found is None:
            level = next((lvl for cls, lvl in self._levels if issubclass(kind, cls)), self._default)
            found = (level, issubclass(kind, TRANSITIONS))
            self._cache[kind] = found
        return found

    def __call__(self, event: Event) -> None:
        """Log ``event`` (this is what makes the adapter a listener)."""
        kind = type(event)
        level, transition = self._kind(kind)
        suffix = ""
        repeats = 0
        repeats_table = self._repeats
        if transition and repeats_table is not None:
            # A new episode for this policy, whether or not this record is written.
            policy = event.policy
            episode = repeats_table.forget(lambda key: key[0] == policy)
            if not self.logger.isEnabledFor(level):
                carried = self._carried
                for key, count in episode.items():
                    if count and (key in carried or len(carried) < _MAX_KEYS):
                        carried[key] = carried.get(key, 0) + count
                return
            left_out = {key[1].__name__: count for key, count in episode.items()}
            if left_out:
                suffix = f"left_out={left_out!r}"
        elif not self.logger.isEnabledFor(level):
            return
        elif repeats_table is not None:
            counted = repeats_table.admit((event.policy, kind), self._clock.monotonic())
            if counted is None:
                return
            repeats = counted
            if self._carried:
                repeats += self._carried.pop((event.policy, kind), 0)
            if repeats:
                suffix = f"repeats={repeats}"
        fields = [
            f"{field.name}={getattr(event, field.name)!r}"
            for field in dataclasses.fields(event)
            if field.name not in ("policy", "key")
        ]
        if suffix:
            fields.append(suffix)
        extra = {"resilience_event": event, "resilience_repeats": repeats}
        logger: Any = self.logger
        kwargs: MutableMapping[str, Any] = {"extra": extra}
        message: Any = "%s policy=%s key=%s%s"
        if isinstance(logger, logging.LoggerAdapter):
            # An adapter's process() replaces extra with its own: ours ride along too.
            message, kwargs = logger.process(message, kwargs)
            kwargs["extra"] = {**(kwargs.get("extra") or {}), **extra}
            logger = logger.logger
        logger.log(
            level,
            message,
            kind.__name__,
            event.policy,
            event.key,
            "".join(" " + text for text in fields),
            **kwargs,
        )

    def install(self) -> LoggingListener:
        """Listen to the events of every policy (:func:`resilience.add_listener`).

        Example: ``LoggingListener().install()``
        """
        add_listener(self)
        return self

    def uninstall(self) -> None:
        """Stop listening."""
        remove_listener(self)
