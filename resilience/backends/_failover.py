"""What a policy does when its shared backend fails: the ``on_backend_error`` machinery.

Every policy with a ``backend=`` takes ``on_backend_error``:

* ``"local"`` (default): decide with an in-process twin of the policy (a local limiter,
  a local semaphore, a local breaker), as if the backend were not configured.
* ``"open"``: admit the call (fail open: availability over protection).
* ``"closed"``: refuse with :class:`~resilience.BackendError` (fail closed).

:class:`Failover` is the shared part: it tracks the backend's health for one policy,
stops sending calls to a failed backend (no caller waits on a dead Redis twice), lets
one call probe it again after a backoff (50 ms doubling up to 1 s, so the policy is
back on the backend within about a second of it returning), counts everything for
``statistics()`` and emits :class:`~resilience.BackendFallback` and
:class:`~resilience.BackendRecovered` events. The policy keeps the decision itself.

The pattern in a policy shell::

    failover = Failover(on_backend_error, owner=self, clock=clock)

    def decide(self, key):
        if failover.use_backend():
            try:
                result = script.run(keys, args)
            except BackendError as exc:
                failover.failed(exc, key)        # counts, emits, schedules a probe
                return self._degraded(key, exc)  # local twin / admit / raise
            failover.succeeded()
            return result
        failover.fallback(key)                   # counts, emits
        return self._degraded(key, failover.last_error)

where ``_degraded`` branches on ``failover.mode`` (``failover.raise_closed()`` raises the
documented :class:`~resilience.BackendError` for ``"closed"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal

from .._clock import Clock
from .._events import BackendFallback, BackendRecovered
from .._validate import check_choice, check_number
from ..errors import BackendError

if TYPE_CHECKING:
    from .._policy import PolicyBase

__all__ = ["MODES", "Failover", "FailureMode"]

#: What a policy does while its Redis backend fails (``on_backend_error=``): decide with
#: a local twin, admit everything, or refuse with ``BackendError``.
#: Example: ``rs.RateLimiter("100/s", backend=redis, on_backend_error="local")``
FailureMode = Literal["local", "open", "closed"]
"""What a policy does while its shared backend fails (``on_backend_error=``): decide
in process (``"local"``), admit (``"open"``) or refuse (``"closed"``)."""

MODES: Final[tuple[FailureMode, ...]] = ("local", "open", "closed")
"""The accepted values of every policy's ``on_backend_error``."""


class Failover:
    """Backend health, probing and accounting for one policy's ``on_backend_error``.

    ``use_backend()`` says whether the next decision should go to the backend: always
    while it is healthy; after a failure only once per probe interval (one caller
    probes, the others degrade at once). ``failed()`` and ``succeeded()`` report the
    outcome of a backend call; ``fallback()`` records a decision made without it.

    Example::

        failover = Failover("local", owner=limiter, clock=rs.SYSTEM_CLOCK)
        if failover.use_backend():
            ...
        print(failover.statistics())
        # {'on_backend_error': 'local', 'backend_healthy': True, 'backend_errors': 0,
        #  'fallback_decisions': 0, 'backend_recoveries': 0}
    """

    __slots__ = (
        "_backoff",
        "_clock",
        "_next_probe",
        "_owner",
        "backend_errors",
        "fallback_decisions",
        "healthy",
        "last_error",
        "max_probe_interval",
        "min_probe_interval",
        "mode",
        "on_recovery",
        "recoveries",
    )

    def __init__(
        self,
        mode: str,
        *,
        owner: PolicyBase,
        clock: Clock,
        min_probe_interval: float = 0.05,
        max_probe_interval: float = 1.0,
    ) -> None:
        self.mode: str = check_choice("on_backend_error", mode, MODES)
        self.min_probe_interval: float = check_number(
            "min_probe_interval", min_probe_interval, minimum=0.0, strict=True
        )
        self.max_probe_interval: float = check_number(
            "max_probe_interval", max_probe_interval, minimum=self.min_probe_interval
        )
        self._owner = owner
        self._clock = clock
        #: Called (no arguments) when the backend answers again after failing.
        self.on_recovery: Callable[[], object] | None = None
        #: Whether the last backend call succeeded.
        self.healthy = True
        #: The last backend failure (a :class:`BackendError`), for events and ``"closed"``.
        self.last_error: BaseException | None = None
        self._backoff = self.min_probe_interval
        self._next_probe = 0.0
        #: Backend calls that failed (timeouts, connection errors, script errors).
        self.backend_errors = 0
        #: Decisions made without the backend (by the failure mode).
        self.fallback_decisions = 0
        #: Times the backend answered again after failing.
        self.recoveries = 0

    def use_backend(self) -> bool:
        """Whether the next decision should try the backend (healthy, or a probe is due).

        When a probe is due, exactly the first caller gets ``True`` and the next probe is
        scheduled after a doubled backoff, so a dead backend sees one call per interval.
        """
        if self.healthy:
            return True
        now = self._clock.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_probe_interval)
        return True

    def failing(self) -> bool:
        """``not healthy``, read anew (a check after one made before a call that may
        have changed it)."""
        return not self.healthy

    def succeeded(self) -> None:
        """Report a successful backend call; ends a failure episode (event + counter)."""
        if self.healthy:
            return
        self.healthy = True
        self._backoff = self.min_probe_interval
        self.recoveries += 1
        if self._owner._observed:
            self._owner._emit(BackendRecovered(policy=self._owner.name))
        if self.on_recovery is not None:
            self.on_recovery()

    def failed(self, error: BaseException, key: object = None) -> None:
        """Report a failed backend call; the decision it was for is a fallback decision.

        The first failure of an episode schedules a probe after ``min_probe_interval``.
        """
        self.backend_errors += 1
        self.last_error = error
        if self.healthy:
            self.healthy = False
            self._backoff = self.min_probe_interval
            self._next_probe = self._clock.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, self.max_probe_interval)
        self.fallback(key, error)
        _forget_frames(error)

    def fallback(self, key: object = None, error: BaseException | None = None) -> None:
        """Count a decision made by the failure mode, and emit :class:`BackendFallback`."""
        self.fallback_decisions += 1
        if self._owner._observed:
            self._owner._emit(
                BackendFallback(
                    policy=self._owner.name,
                    key=None if key is None else str(key),
                    mode=self.mode,
                    error=error if error is not None else self.last_error,
                )
            )

    def raise_closed(self) -> None:
        """Raise the :class:`BackendError` of mode ``"closed"`` (the last failure as cause)."""
        cause = self.last_error
        if isinstance(cause, BackendError):
            raise BackendError(str(cause)) from cause.__cause__
        raise BackendError(f"{self._owner.name}: backend unavailable") from cause

    def statistics(self) -> dict[str, int | bool | str]:
        """Counters for the owning policy's ``statistics()``.

        Example: ``failover.statistics()["fallback_decisions"]``
        """
        return {
            "on_backend_error": self.mode,
            "backend_healthy": self.healthy,
            "backend_errors": self.backend_errors,
            "fallback_decisions": self.fallback_decisions,
            "backend_recoveries": self.recoveries,
        }

    def __repr__(self) -> str:
        state = "healthy" if self.healthy else "failing"
        return f"<Failover {self.mode} {state} errors={self.backend_errors}>"


def _forget_frames(error: BaseException) -> None:
    """Drop the tracebacks of a handled backend error and its causes: kept as
    ``last_error`` until the next failure, their frames (and through ``f_back`` the
    caller's whole stack, a request and its body say) would live as long."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        todo.append(current.__cause__)
        todo.append(current.__context__)
