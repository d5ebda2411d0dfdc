"""Events: what policies tell the world, as typed frozen dataclasses.

Every policy keeps its own listeners (``policy.add_listener(fn)``) and also notifies
the global ones (:func:`add_listener`). A policy checks ``if self._listeners or
GLOBAL_LISTENERS`` before it builds an event, so nobody listening costs one truth test.
A listener that raises is logged and never breaks the call it observes; a listener
that keeps raising is logged once per 10 seconds, with the count of failures left out,
so that a broken listener cannot flood the log.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ._repeats import Repeats

__all__ = [
    "GLOBAL_LISTENERS",
    "BackendFallback",
    "BackendRecovered",
    "CallAdmitted",
    "CallRejected",
    "Event",
    "FallbackUsed",
    "Listener",
    "Observable",
    "RetriesExhausted",
    "RetryBudgetExhausted",
    "RetryScheduled",
    "StateChanged",
    "TimedOut",
    "add_listener",
    "emit",
    "remove_listener",
]

logger = logging.getLogger("resilience")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: the name of the policy that emitted it and, if keyed, the key.

    Example::

        def log_everything(event: rs.Event) -> None:
            print(type(event).__name__, event.policy, event.key)

        rs.add_listener(log_everything)
    """

    policy: str
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryScheduled(Event):
    """An attempt failed and another one will start after ``delay`` seconds.

    Example::

        retry.add_listener(lambda e: isinstance(e, rs.RetryScheduled) and print(e.attempt, e.delay))
    """

    attempt: int
    delay: float
    exception: BaseException | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetriesExhausted(Event):
    """The last attempt failed; ``reason`` is ``"attempts"``, ``"deadline"``, ``"budget"``
    or (the httpx transport) ``"max_wait"``: a server pause would hold the retry longer,
    or ``"rejected"``: its limiter, bulkhead or breaker refused the retry before sending.

    Example::

        retry.add_listener(lambda e: isinstance(e, rs.RetriesExhausted) and alert(e.reason))
    """

    attempts: int
    reason: str
    exception: BaseException | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBudgetExhausted(Event):
    """A retry was skipped because the shared :class:`RetryBudget` was empty.

    Example::

        retry.add_listener(
            lambda e: isinstance(e, rs.RetryBudgetExhausted) and metrics.inc("budget_empty")
        )
    """

    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOut(Event):
    """A call was cut off (async) or overran (sync) after ``seconds``.

    Example: ``timeout.add_listener(lambda e: print("timed out after", e.seconds))``
    """

    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackUsed(Event):
    """A fallback replaced the result of a call that raised ``exception``.

    Example: ``fallback.add_listener(lambda e: print("degraded:", e.exception))``
    """

    exception: BaseException


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAdmitted(Event):
    """A rate limiter or a bulkhead let a call through (``allowed`` is always true) after
    ``waited`` seconds (0.0: at once; a limiter's reservation, a bulkhead's queueing).

    Emitted only while anyone listens, so it costs nothing otherwise; with
    :class:`CallRejected` it gives the ``resilience.decisions`` counter both outcomes,
    and ``waited`` feeds the wait-time histogram.

    Example::

        limiter.add_listener(
            lambda e: isinstance(e, rs.CallAdmitted) and print(e.policy, e.key, e.waited)
        )
    """

    allowed: bool = True
    waited: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRejected(Event):
    """A policy refused a call (rate limited, bulkhead full, circuit open).

    Example::

        limiter.add_listener(
            lambda e: isinstance(e, rs.CallRejected) and print("rejected", e.key, e.retry_after)
        )
    """

    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged(Event):
    """A stateful policy (a circuit breaker) moved from ``old`` to ``new``.

    Example::

        breaker.add_listener(lambda e: isinstance(e, rs.StateChanged) and print(e.old, "->", e.new))
    """

    old: str
    new: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendFallback(Event):
    """A shared backend failed; the policy applied its ``on_backend_error`` ``mode``.

    Example::

        limiter.add_listener(
            lambda e: isinstance(e, rs.BackendFallback) and print("redis down, mode", e.mode)
        )
    """

    mode: str
    error: BaseException | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRecovered(Event):
    """A shared backend answered again after a failure; the policy is back on it.

    Example::

        limiter.add_listener(
            lambda e: isinstance(e, rs.BackendRecovered) and print("redis is back")
        )
    """


class Listener(Protocol):
    """What receives events: any callable taking one :class:`Event` (its return value is
    ignored). A listener runs in the thread or task that emitted the event, so keep it
    quick; one that raises is logged and skipped, never breaking the observed call.

    Example::

        def on_event(event: rs.Event) -> None:
            if isinstance(event, rs.StateChanged):
                alert(f"{event.policy}: {event.old} -> {event.new}")

        rs.add_listener(on_event)          # every policy
        breaker.add_listener(print)        # one policy
    """

    def __call__(self, event: Event, /) -> object:
        """Receive ``event``."""
        ...


#: Listeners that receive every event of every policy. Mutated in place, never rebound.
GLOBAL_LISTENERS: list[Listener] = []

#: A listener's own type: ``add_listener`` used as a decorator keeps it.
L = TypeVar("L", bound=Listener)


def add_listener(listener: L) -> L:
    """Receive every event of every policy; returns ``listener`` (usable as a decorator).

    Adding a listener that is already there does nothing: an app factory or a test
    setup that installs an adapter twice must not count every event twice.

    Example::

        @rs.add_listener
        def audit(event: rs.Event) -> None:
            logging.info("%r", event)
    """
    with _LISTENERS_LOCK:
        if _index(GLOBAL_LISTENERS, listener) is None:
            GLOBAL_LISTENERS.append(listener)
    _forget_failures(listener)
    return listener


def remove_listener(listener: Listener) -> None:
    """Stop sending events to a global listener added with :func:`add_listener`.

    Example: ``rs.remove_listener(audit)``
    """
    with _LISTENERS_LOCK:
        index = _index(GLOBAL_LISTENERS, listener)
        if index is not None:
            del GLOBAL_LISTENERS[index]
    _forget_failures(listener)


#: Adding and removing listeners find then change a list: one lock for all of them
#: (rare calls), or threads removing two listeners at once could delete a third.
_LISTENERS_LOCK = threading.Lock()


def _index(listeners: list[Listener], listener: object) -> int | None:
    """Where ``listener`` itself is in ``listeners``: the same object, or the same bound
    method (``obj.method`` is a new object on every access). Equality is not enough: two
    distinct listeners may compare equal (dataclass instances) and both must receive."""
    # Bound methods, Python's and builtins' (``events.append``): equal when they are of
    # the same object (compared by identity) and function.
    bound = getattr(listener, "__self__", None) is not None
    for index, known in enumerate(listeners):
        if known is listener or (bound and known == listener):
            return index
    return None


# Failing listeners: at most one log record each per 10 seconds, the others counted.
_failures: Repeats[object] = Repeats(10.0, max_keys=1_000)
_monotonic = time.monotonic  # a module attribute, so that tests can replace it


def emit(listeners: list[Listener], event: Event) -> None:
    """Deliver ``event`` to a policy's listeners, then to the global ones.

    A listener that raises is logged at WARNING (with its traceback) and skipped; the
    same listener failing again within 10 seconds is counted, and the next record says
    how many failures were left out.
    """
    for listener in (*listeners, *GLOBAL_LISTENERS):
        try:
            listener(event)
        except Exception:
            _listener_failed(listener)


def _slot(listener: Listener) -> object:
    """The failure table's key for ``listener``: identities, never the listener itself
    (the table must not keep a removed listener, and what it holds, alive). A bound
    method is a new object on every access: its key is its object's and function's."""
    owner = getattr(listener, "__self__", None)
    if owner is not None:
        function = getattr(listener, "__func__", None)
        return (
            id(owner),
            id(function) if function is not None else getattr(listener, "__name__", ""),
        )
    return id(listener)


def _forget_failures(listener: Listener) -> None:
    """A listener added (again) starts afresh: its next failure is logged at once."""
    if _failures:
        slot = _slot(listener)
        _failures.forget(lambda key: key == slot)


def _listener_failed(listener: Listener) -> None:
    left_out = _failures.admit(_slot(listener), _monotonic())
    if left_out is None:
        return
    logger.warning(
        "resilience: event listener %r failed%s",
        listener,
        f" ({left_out} more failures since its last record)" if left_out else "",
        exc_info=True,
    )


class Observable:
    """A name and event listeners: what policies, middleware and transports share.

    Subclasses either call ``Observable.__init__(self, name)`` or set ``name`` and
    ``_listeners`` themselves (slotted classes list both in their ``__slots__``).

    Example::

        middleware.add_listener(lambda event: print(event))
    """

    __slots__ = ()

    name: str
    _listeners: list[Listener]

    def __init__(self, name: str | None = None) -> None:
        # Subclasses provide the storage (their own __slots__ or a __dict__).
        from ._validate import check_name

        self.name = check_name(name, type(self).__name__)  # type: ignore[misc]
        self._listeners = []  # type: ignore[misc]

    def add_listener(self, listener: L) -> L:
        """Receive this object's events; returns ``listener`` (usable as a decorator).
        Adding one that is already there does nothing.

        Example::

            retry = rs.Retry(on=OSError)
            retry.add_listener(print)
        """
        with _LISTENERS_LOCK:
            if _index(self._listeners, listener) is None:
                self._listeners.append(listener)
        _forget_failures(listener)
        return listener

    def remove_listener(self, listener: Listener) -> None:
        """Stop sending this object's events to ``listener``.

        Example: ``retry.remove_listener(print)``
        """
        with _LISTENERS_LOCK:
            index = _index(self._listeners, listener)
            if index is not None:
                del self._listeners[index]
        _forget_failures(listener)

    @property
    def _observed(self) -> bool:
        """Whether anybody listens; check it before building an event."""
        return bool(self._listeners or GLOBAL_LISTENERS)

    def _emit(self, event: Event) -> None:
        emit(self._listeners, event)

    def _report_admission(self, key: object, waited: float) -> None:
        """Emit :class:`CallAdmitted` for ``key`` after ``waited`` seconds (a limiter's
        or a bulkhead's admission; callers check that anyone listens first)."""
        self._emit(
            CallAdmitted(policy=self.name, key=None if key is None else str(key), waited=waited)
        )
