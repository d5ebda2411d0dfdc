"""Logging adapter: every policy event as one structured log record."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from .._events import (
    BackendFallback,
    BackendRecovered,
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

__all__ = ["DEFAULT_LEVELS", "LoggingListener"]

#: Log level per event type (the first ``isinstance`` match wins; others: INFO).
DEFAULT_LEVELS: Mapping[type[Event], int] = {
    StateChanged: logging.WARNING,
    BackendFallback: logging.WARNING,
    RetriesExhausted: logging.WARNING,
    RetryBudgetExhausted: logging.WARNING,
    BackendRecovered: logging.INFO,
    TimedOut: logging.INFO,
    FallbackUsed: logging.INFO,
    CallRejected: logging.DEBUG,
    RetryScheduled: logging.DEBUG,
}


class LoggingListener:
    """Log every event of every policy: ``resilience.events`` logger, one record each.

    The message reads ``"<EventType> policy=<name> key=<key> field=value ..."``; the
    event itself is attached as ``record.resilience_event`` for structured handlers.
    Levels come from ``levels`` (state changes and backend fallbacks WARNING,
    rejections and scheduled retries DEBUG, ...); a disabled level costs one check.

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
    ) -> None:
        self.logger = logging.getLogger("resilience.events") if logger is None else logger
        self._levels = tuple(levels.items())
        self._default = default_level
        self._cache: dict[type[Event], int] = {}

    def level_of(self, event: Event) -> int:
        """The level ``event`` is logged at."""
        kind = type(event)
        level = self._cache.get(kind)
        if level is None:
            level = next((lvl for cls, lvl in self._levels if issubclass(kind, cls)), self._default)
            self._cache[kind] = level
        return level

    def __call__(self, event: Event) -> None:
        """Log ``event`` (this is what makes the adapter a listener)."""
        level = self.level_of(event)
        if not self.logger.isEnabledFor(level):
            return
        details = " ".join(
            f"{field.name}={getattr(event, field.name)!r}"
            for field in dataclasses.fields(event)
            if field.name not in ("policy", "key")
        )
        self.logger.log(
            level,
            "%s policy=%s key=%s %s",
            type(event).__name__,
            event.policy,
            event.key,
            details,
            extra={"resilience_event": event},
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
