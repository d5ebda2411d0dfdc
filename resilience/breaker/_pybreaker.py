"""An existing ``pybreaker.CircuitBreaker`` as a resilience policy (the ``pybreaker`` extra).

pybreaker holds its lock around the user's call (so calls through one breaker run one
at a time) and needs tornado for coroutines. :class:`PyBreakerPolicy` drives the same
pybreaker object, with its counters, storage (memory or Redis), exclusions and
listeners, but holds the pybreaker lock only for the bookkeeping before and after the
call, and serves ``async def`` functions natively (asyncio and trio).
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from .._policy import PolicyBase, refuse_async, refuse_generator_async
from .._validate import check_bool
from ..errors import CircuitOpen, ConfigurationError, Rejected
from ._events import BreakerStateChanged, OutcomeRecorded
from ._state import CircuitState

__all__ = ["PyBreakerPolicy"]

T = TypeVar("T")
P = ParamSpec("P")

_STATES = {
    "closed": CircuitState.CLOSED,
    "open": CircuitState.OPEN,
    "half-open": CircuitState.HALF_OPEN,
}

_ERROR_CLASS: type[CircuitOpen] | None = None


def _require_pybreaker() -> Any:
    try:
        import pybreaker
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "PyBreakerPolicy needs pybreaker: pip install 'resilience[pybreaker]'"
        ) from exc
    return pybreaker


def _open_error() -> type[CircuitOpen]:
    """``CircuitOpen`` that is also a ``pybreaker.CircuitBreakerError`` (both ``except`` work)."""
    global _ERROR_CLASS
    if _ERROR_CLASS is None:
        pybreaker = _require_pybreaker()
        _ERROR_CLASS = type(
            "PyBreakerOpen",
            (CircuitOpen, pybreaker.CircuitBreakerError),
            {
                "__doc__": "An open pybreaker refused the call (CircuitOpen and "
                "pybreaker.CircuitBreakerError).",
                "__module__": __name__,
            },
        )
    return _ERROR_CLASS


def _state_name(state: Any) -> str:
    if state is None:
        return CircuitState.CLOSED.value
    return _STATES.get(getattr(state, "name", ""), CircuitState.CLOSED).value


#: Whether a half-open trial call is running, per pybreaker: shared by every policy
#: that wraps the same pybreaker (one decorating several functions), as pybreaker's own
#: one-trial rule is. Read and written under the pybreaker's lock.
_TRIALS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class PyBreakerPolicy(PolicyBase):
    """Use an existing ``pybreaker.CircuitBreaker`` as a resilience policy.

    Its configuration, storage and listeners keep working; on top of that:

    * calls run **without** pybreaker's lock held (only its bookkeeping is locked), so
      calls through one breaker run concurrently; a half-open breaker lets one trial
      call through at a time;
    * ``async def`` functions work on asyncio and trio, without tornado;
    * an open breaker raises an error that is both :class:`~resilience.CircuitOpen`
      (with ``retry_after``) and ``pybreaker.CircuitBreakerError``;
    * the call that trips the breaker raises its own exception (it was attempted);
    * cancellation is not a failure, and :class:`~resilience.Rejected` errors from
      policies inside this one are not failures unless ``record_rejected=True``;
    * pybreaker's listener notifications become resilience events:
      :class:`BreakerStateChanged` (``reason="pybreaker"``) and :class:`OutcomeRecorded`.

    Example::

        import pybreaker
        legacy = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60, name="db")
        breaker = rs.breaker.PyBreakerPolicy(legacy)

        @rs.Pipeline(rs.Retry(on=OSError), breaker)
        async def query(sql: str) -> list[Row]: ...
    """

    raises_rejected = True
    rejection = CircuitOpen

    def __init__(
        self, breaker: Any, *, record_rejected: bool = False, name: str | None = None
    ) -> None:
        pybreaker = _require_pybreaker()
        if not isinstance(breaker, pybreaker.CircuitBreaker):
            raise ConfigurationError(f"breaker must be a pybreaker.CircuitBreaker, got {breaker!r}")
        super().__init__(name=name if name is not None else (breaker.name or "pybreaker"))
        self.breaker = breaker
        self._record_rejected = check_bool("record_rejected", record_rejected)
        self._open_state = pybreaker.STATE_OPEN
        self._half_open_state = pybreaker.STATE_HALF_OPEN
        self._breaker_error = pybreaker.CircuitBreakerError
        self._error = _open_error()
        self._bridge = _make_bridge(pybreaker, self)
        breaker.add_listener(self._bridge)

    # ----------------------------------------------------------------- shared core

    def _before(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, bool]:
        cb = self.breaker
        with cb._lock:
            state = cb.state
            if state.name == self._open_state:
                opened_at = cb._state_storage.opened_at
                if opened_at is not None:
                    reopen = opened_at + timedelta(seconds=cb.reset_timeout)
                    left = (reopen - datetime.now(UTC)).total_seconds()
                    if left > 0:
                        raise self._reject(left)
                cb.half_open()
                state = cb.state
            trial = state.name == self._half_open_state
            if trial:
                # One trial per pybreaker, whichever of its policies admits it.
                if _TRIALS.get(cb, False):
                    raise self._reject(None)
                _TRIALS[cb] = True
            try:
                for listener in cb.listeners:
                    listener.before_call(cb, fn, *args, **kwargs)
            except BaseException:
                if trial:  # the trial never ran: the next call may try
                    _TRIALS[cb] = False
                raise
            return state, trial

    def _reject(self, retry_after: float | None) -> CircuitOpen:
        if self._observed:
            from .._events import CallRejected

            self._emit(CallRejected(policy=self.name, retry_after=retry_after))
        return self._error(f"pybreaker {self.name!r} is open", retry_after=retry_after)

    def _after(self, state: Any, trial: bool, exc: BaseException | None) -> None:
        cb = self.breaker
        with cb._lock:
            if trial:
                _TRIALS[cb] = False
            if exc is not None and (
                not isinstance(exc, Exception)
                or (isinstance(exc, Rejected) and not self._record_rejected)
            ):
                return  # cancellation, or refused by an inner policy: not an outcome
            if cb.state is not state:
                return  # the breaker moved on while the call ran: a stale outcome
            if exc is None:
                state._handle_success()
                return
            try:
                state._handle_error(exc, reraise=False)
            except self._breaker_error:
                pass  # it tripped: the caller gets the call's own exception

    # ----------------------------------------------------------------- shells

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` under the pybreaker (its lock not held during it)."""
        refuse_async(self, fn)
        state, trial = self._before(fn, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._after(state, trial, exc)
            raise
        self._after(state, trial, None)
        return result

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` under the pybreaker (no tornado needed)."""
        refuse_generator_async(fn)
        state, trial = self._before(fn, args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self._after(state, trial, exc)
            raise
        self._after(state, trial, None)
        return result

    @property
    def state(self) -> CircuitState:
        """The pybreaker's state as a :class:`CircuitState`.

        Example: ``assert policy.state is rs.CircuitState.CLOSED``
        """
        return _STATES[self.breaker.current_state]

    def close(self) -> None:
        """Detach the event bridge from the pybreaker (the pybreaker itself is untouched).

        Example: ``policy.close()``
        """
        try:
            self.breaker.remove_listener(self._bridge)
        except ValueError:
            pass

    def __repr__(self) -> str:
        return f"<PyBreakerPolicy {self.name!r}>"


def _make_bridge(pybreaker: Any, policy: PyBreakerPolicy) -> Any:
    class _Bridge(pybreaker.CircuitBreakerListener):  # type: ignore[misc]
        """Turns pybreaker listener calls into resilience events."""

        def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
            if policy._observed:
                policy._emit(
                    BreakerStateChanged(
                        policy=policy.name,
                        old=_state_name(old_state),
                        new=_state_name(new_state),
                        reason="pybreaker",
                        open_for=float(cb.reset_timeout)
                        if getattr(new_state, "name", "") == pybreaker.STATE_OPEN
                        else None,
                    )
                )

        def failure(self, cb: Any, exc: BaseException) -> None:
            if policy._observed:
                policy._emit(OutcomeRecorded(policy=policy.name, outcome="failure", exception=exc))

        def success(self, cb: Any) -> None:
            if policy._observed:
                policy._emit(OutcomeRecorded(policy=policy.name, outcome="success"))

    return _Bridge()
