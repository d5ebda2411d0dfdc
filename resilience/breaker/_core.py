"""The breaker's pure state machine: time and outcomes in, decisions out.

:class:`BreakerCore` is one breaker (one key of a keyed breaker). It reads no clock
and does no I/O: every method takes ``now``. Its lock guards O(1) bookkeeping only and
is never held while the user's call runs; the CLOSED happy path takes no lock at all
(see :mod:`._windows`).

A call goes through three steps::

    ticket = core.acquire(now)             # raises CircuitOpen, or admits
    ... the call runs, without any lock ...
    core.settle(ticket, outcome, now, duration)

The ticket says which episode admitted the call: the CLOSED window (every call
admitted while it is current), the half-open episode (a probe) or the disabled marker.
An outcome whose episode is over (the breaker moved on while the call ran) is
dropped, so a late result can never count as a probe or trip a fresh window.

Transitions are reported to the owner (the :class:`~resilience.CircuitBreaker` policy)
after the lock is released, for events and for shared state.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from ..errors import CircuitOpen
from ._config import FAILURE, IGNORE, BreakerConfig, Outcome
from ._state import CircuitState
from ._windows import AtomicCounter, CountWindow, TimeWindow, Window

__all__ = ["BreakerCore", "BreakerStatistics", "Election", "FastTicket", "Ticket"]

CLOSED = CircuitState.CLOSED
OPEN = CircuitState.OPEN
HALF_OPEN = CircuitState.HALF_OPEN
DISABLED = CircuitState.DISABLED
FORCED_OPEN = CircuitState.FORCED_OPEN
METRICS_ONLY = CircuitState.METRICS_ONLY

_new_error = BaseException.__new__

#: (old, new, reason, open_for): a transition to report once the lock is released.
_Change = tuple[CircuitState, CircuitState, str, float | None]


class Owner(Protocol):
    """What a core reports to (the policy)."""

    def _transitioned(self, core: BreakerCore, change: _Change, now: float) -> None: ...

    def _rejected(self, core: BreakerCore, retry_after: float | None) -> None: ...


class _HalfOpen:
    """One half-open episode: its probe slots and their outcomes; also the probes' ticket."""

    __slots__ = ("admitted", "elected", "electing", "failures", "results", "since", "slow")

    def __init__(self, *, elected: bool) -> None:
        #: When the probes now outstanding began (``max_half_open_wait`` counts from
        #: there); ``None`` before the first probe.
        self.since: float | None = None
        self.admitted = 0
        self.results = 0
        self.failures = 0
        self.slow = 0
        self.electing = False
        self.elected = elected

    @staticmethod
    def quick_success() -> bool:
        return False

    @staticmethod
    def quick_success_at(now: float, start: float) -> bool:
        return False


class _Disabled:
    """The ticket of a DISABLED breaker: nothing is recorded."""

    __slots__ = ("pending", "tick")

    def __init__(self) -> None:
        self.pending = False
        self.tick = itertools.count().__next__  # counts nothing anybody reads

    @staticmethod
    def quick_success() -> bool:
        return True

    @staticmethod
    def quick_success_at(now: float, start: float) -> bool:
        return True


_DISABLED = _Disabled()

#: The ticket of a call admitted without bookkeeping (CLOSED, METRICS_ONLY, DISABLED).
FastTicket = CountWindow | TimeWindow | _Disabled
Ticket = CountWindow | TimeWindow | _HalfOpen | _Disabled


class Election:
    """Returned by :meth:`BreakerCore.acquire` when the caller must win the fleet probe.

    The shell asks the shared state (one Redis ``SET NX PX``) and reports the answer
    with :meth:`BreakerCore.elected`.
    """

    __slots__ = ("episode",)

    def __init__(self, episode: _HalfOpen) -> None:
        self.episode = episode


@dataclass(frozen=True, slots=True)
class BreakerStatistics:
    """A snapshot of one breaker (one key of a keyed breaker).

    ``calls``, ``failures`` and ``slow_calls`` are what the sliding window holds now
    (zero outside CLOSED and METRICS_ONLY); the rates are ``None`` below ``min_calls``.
    ``retry_after`` is the time left until half-open while OPEN. ``rejected`` and
    ``opened`` count since the breaker was created.

    Example::

        stats = breaker.statistics()
        print(stats.state, stats.failure_rate, stats.rejected)
    """

    state: CircuitState
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float | None
    slow_call_rate: float | None
    consecutive_failures: int
    rejected: int
    opened: int
    retry_after: float | None
    half_open_in_flight: int


class BreakerCore:
    """One circuit breaker's state machine (thread-safe, pure: ``now`` is an argument).

    Example::

        core = BreakerCore(BreakerConfig.build(consecutive_failures=2, open_for=10))
        for _ in range(2):
            ticket = core.acquire(now=0.0)
            core.settle(ticket, "failure", now=0.0)
        assert core.state_at(0.0) is rs.CircuitState.OPEN
        assert core.state_at(10.0) is rs.CircuitState.HALF_OPEN
    """

    __slots__ = (
        "_draw",
        "_half",
        "_lock",
        "_open_message",
        "_open_until",
        "_outbox",
        "_rejected",
        "_remote",
        "_reporting",
        "_trips",
        "_window",
        "config",
        "elect",
        "fast",
        "held_until",
        "key",
        "opened",
        "owner",
        "state",
    )

    def __init__(
        self,
        config: BreakerConfig,
        *,
        key: Hashable = None,
        owner: Owner | None = None,
        now: float = 0.0,
        state: CircuitState = CLOSED,
        draw: Callable[[], float] = random.random,
        label: str = "",
        elect: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.key = key
        self.owner = owner
        #: With shared state: says whether the fleet-wide probe election can run now.
        self.elect = elect
        self._lock = threading.Lock()
        self._draw = draw
        self._open_message = f"circuit breaker {label or 'breaker'} is open"
        #: The ticket of every call while all calls are admitted (CLOSED, METRICS_ONLY,
        #: DISABLED); ``None`` otherwise. Read without the lock by the shells.
        self.fast: FastTicket | None = None
        self.state = CLOSED
        self._window: Window | None = None
        self._half: _HalfOpen | None = None
        self._open_until = 0.0
        self._remote = False
        self._trips = 0
        self._rejected = AtomicCounter()
        #: Changes made under the lock, in order, not yet reported to the owner; one
        #: thread at a time reports them (``_reporting``: the pid of its process, 0 for
        #: none), so listeners and the fleet hear them in the order they happened.
        self._outbox: list[_Change] = []
        self._reporting = 0
        #: Times the breaker opened since creation.
        self.opened = 0
        #: Until when a state set by hand must outlive the keyed map's eviction
        #: (``inf``: until closed by hand; 0: nothing held).
        self.held_until = 0.0
        self._move(state, now, "initial")

    # ----------------------------------------------------------------- transitions

    def _new_window(self, now: float) -> Window:
        config = self.config
        if config.window_type == "count":
            return CountWindow._unchecked(int(config.window), config.slow_after)
        return TimeWindow._unchecked(config.window, config.buckets, now, config.slow_after)

    def _move(
        self,
        new: CircuitState,
        now: float,
        reason: str,
        *,
        open_for: float | None = None,
        remote: bool = False,
    ) -> None:
        old = self.state
        if new is OPEN:  # before the state: lock-free readers see OPEN with its end
            if open_for is None:
                self._trips += 1
                open_for = self.config.open_duration(self._trips, self._draw())
            self._open_until = now + open_for
        self.state = new
        self._half = None
        self._remote = False
        if new is CLOSED or new is METRICS_ONLY:
            self._window = self._new_window(now)
            self.fast = self._window
            if new is CLOSED:
                self._trips = 0
        else:
            self._window = None
            self.fast = _DISABLED if new is DISABLED else None
        if new is OPEN:
            self._remote = remote
            if reason != "fleet_probe":  # waiting for another process's probe is no trip
                self.opened += 1
        elif new is HALF_OPEN:
            self._half = _HalfOpen(elected=self.elect is None)
        if reason != "initial" and self.owner is not None:
            self._outbox.append((old, new, reason, open_for if new is OPEN else None))

    def _poll(self, now: float) -> None:
        state = self.state
        if state is OPEN:
            if now >= self._open_until:
                self._move(HALF_OPEN, now, "cool_down")
        elif state is HALF_OPEN:
            # Only probes that are out can be late: with none admitted yet (no traffic),
            # the breaker waits, half-open, for the next call.
            wait = self.config.max_half_open_wait
            half = self._half
            assert half is not None
            if (
                wait is not None
                and half.since is not None
                and half.admitted > half.results
                and now >= half.since + wait
            ):
                self._move(OPEN, now, "half_open_timeout")

    def _flush(self, now: float) -> None:
        """Report the queued changes to the owner, outside the lock (listeners may be
        slow or call back into the breaker).

        One thread reports at a time and takes every change queued meanwhile, so two
        threads' transitions are never reported in the opposite order to the one they
        happened in: an operator's ``close()`` right after a trip reaches listeners and
        the fleet last. A change queued while another thread reports is reported by
        that thread."""
        pid = os.getpid()
        while True:
            with self._lock:
                # A reporter of another pid is a thread a fork left behind: none here.
                if self._reporting == pid or not self._outbox:
                    return
                self._reporting = pid
                changes, self._outbox = self._outbox, []
            reported = 0
            try:
                owner = self.owner
                assert owner is not None  # changes are queued only for an owner
                for change in changes:
                    reported += 1
                    owner._transitioned(self, change, now)
            except BaseException:
                # A listener's KeyboardInterrupt, say: the changes behind it are
                # reported by the next flush, in their order.
                with self._lock:
                    self._outbox[:0] = changes[reported:]
                raise
            finally:
                with self._lock:
                    self._reporting = 0

    def _flush_holding(self, ticket: Ticket | Election | None, now: float) -> None:
        """:meth:`_flush` for a caller holding a ``ticket`` it has not handed out yet: a
        listener that raises a BaseException (the others are logged) interrupts the
        call, and the ticket's probe slot must not stay taken."""
        try:
            self._flush(now)
        except BaseException:
            if isinstance(ticket, Election):
                self.election_abandoned(ticket)
            elif ticket is not None:
                self.settle(ticket, IGNORE, now)
            raise

    def _reject(self, retry_after: float | None) -> CircuitOpen:
        if self.owner is not None:
            self.owner._rejected(self, retry_after)
        # What CircuitOpen(message, retry_after=...) builds, at a third of the cost:
        # rejections are the hot path of an open breaker.
        error = _new_error(CircuitOpen, self._open_message)
        error.retry_after = retry_after
        return error

    # ----------------------------------------------------------------- the call path

    def acquire(self, now: float) -> Ticket | Election:
        """Admit a call (return its ticket) or raise :class:`~resilience.CircuitOpen`.

        With shared state, when the ``elect`` check says the fleet is reachable, the
        first half-open probe of an episode must first win the fleet-wide election: an
        :class:`Election` is returned; report its result with :meth:`elected`.
        """
        ticket: Ticket | Election | None = self.fast
        if ticket is not None:
            return ticket
        if self.state is OPEN:  # the common rejection, decided without the lock
            left = self._open_until - now
            if left > 0:
                self._rejected.tick()
                raise self._reject(left)
        retry_after: float | None = None
        with self._lock:
            self._poll(now)
            state = self.state
            ticket = self.fast
            if ticket is None:
                if state is HALF_OPEN:
                    half = self._half
                    assert half is not None
                    if not half.electing and half.admitted < self.config.half_open_calls:
                        if half.admitted == half.results:  # none out: the wait starts now
                            half.since = now
                        half.admitted += 1
                        if not half.elected and self.elect is not None and self.elect():
                            half.electing = True
                            ticket = Election(half)
                        else:
                            ticket = half
                    elif self.config.max_half_open_wait is not None and half.since is not None:
                        retry_after = max(0.0, half.since + self.config.max_half_open_wait - now)
                elif state is OPEN:
                    retry_after = max(0.0, self._open_until - now)
                if ticket is None:
                    self._rejected.tick()
        if self._outbox:
            self._flush_holding(ticket, now)
        if ticket is None:
            raise self._reject(retry_after)
        return ticket

    def elected(self, election: Election, now: float, won: bool, wait: float) -> Ticket | Election:
        """Report the fleet election: a probe ticket if ``won``, else raise CircuitOpen.

        A loser stays OPEN for ``wait`` seconds (the winner's probe lease), or until the
        winner shares its outcome. If the breaker moved on while the election ran, the
        call is admitted afresh (which may ask for another election).
        """
        stale = False
        with self._lock:
            half = election.episode
            if self._half is not half:
                stale = True  # the breaker moved on while the election ran
            else:
                half.electing = False
                if won:
                    half.elected = True
                else:
                    self._move(OPEN, now, "fleet_probe", open_for=wait, remote=True)
                    self._rejected.tick()
        if self._outbox:
            self._flush_holding(None if stale or not won else half, now)
        if stale:
            return self.acquire(now)
        if not won:
            raise self._reject(wait)
        return half

    def election_abandoned(self, election: Election) -> None:
        """The election's round trip was cancelled or interrupted: free its probe slot.

        (Had it been won on Redis, the fleet's probe lease expires by itself.)
        """
        with self._lock:
            half = election.episode
            if self._half is half and half.electing:
                half.electing = False
                half.admitted -= 1

    def settle(
        self,
        ticket: Ticket,
        outcome: Outcome,
        now: float,
        duration: float | None = None,
    ) -> tuple[Outcome, bool]:
        """Record the outcome of a call admitted with ``ticket``; returns ``(outcome, slow)``.

        ``duration`` (seconds) marks slow calls. Outcomes of an episode that is over
        are dropped.
        """
        slow = duration is not None and duration > self.config.slow_after
        if ticket is _DISABLED:
            return outcome, slow
        with self._lock:
            self._poll(now)
            if ticket is self.fast:
                if outcome is not IGNORE:
                    window = ticket
                    assert isinstance(window, CountWindow | TimeWindow)
                    calls, failures, slows = window.record(now, outcome is FAILURE, slow)
                    if self.state is CLOSED:
                        reason = self.config.trip_reason(calls, failures, slows, window.consecutive)
                        if reason is not None:
                            self._move(OPEN, now, reason)
            elif ticket is self._half:
                half = ticket
                assert isinstance(half, _HalfOpen)
                if outcome is IGNORE:
                    half.admitted -= 1
                else:
                    half.results += 1
                    half.failures += outcome is FAILURE
                    half.slow += slow
                    if half.results >= self.config.half_open_calls:
                        if self.config.probes_failed(half.results, half.failures, half.slow):
                            self._move(OPEN, now, "probes_failed")
                        else:
                            self._move(CLOSED, now, "probes_succeeded")
                if self._half is half and half.admitted == half.results and self.elect is not None:
                    # No probe out: the fleet lease is no longer renewed (see
                    # SharedState._keep_lease), so the next probe is elected again
                    # (this process wins at once while its lease lasts).
                    half.elected = False
        if self._outbox:
            self._flush(now)
        return outcome, slow

    # ----------------------------------------------------------------- control

    def probe_out(self, now: float) -> bool:
        """Whether a probe of this half-open episode, whose fleet election this process
        won, is still out and not overdue. A plain read (no poll, no events, no lock):
        the lease keeper asks it to renew the fleet's probe lease, and must run no
        listener of the user's."""
        half = self._half
        if self.state is not HALF_OPEN or half is None or not half.elected:
            return False
        if half.admitted <= half.results:  # none out (an ignored probe gave its slot back)
            return False
        wait = self.config.max_half_open_wait
        return wait is None or half.since is None or now < half.since + wait

    def state_at(self, now: float) -> CircuitState:
        """The state at ``now`` (an elapsed cool-down makes OPEN half-open)."""
        if self.fast is not None:
            return self.state
        with self._lock:
            self._poll(now)
            state = self.state
        if self._outbox:
            self._flush(now)
        return state

    def transition(self, target: CircuitState, now: float, *, seconds: float | None = None) -> None:
        """Move to ``target`` by hand (``open()``, ``close()``, ``force_open()``, ...).

        CLOSED always starts a fresh window; OPEN always restarts the cool-down, which
        lasts ``seconds`` (default ``open_for``) and does not grow later cool-downs.
        Moving to the current state is otherwise a no-op.
        """
        with self._lock:
            old = self.state
            if target is old and target is not OPEN and target is not CLOSED:
                return
            open_for = None
            if target is OPEN:
                open_for = self.config.open_for if seconds is None else seconds
            # CLOSED to CLOSED is reported too: no state change for listeners (the
            # owner skips it), but an operator's close() for the fleet to hear.
            self._move(target, now, "manual", open_for=open_for)
        if self._outbox:
            self._flush(now)

    def remote_open(self, now: float, seconds: float, trips: int = 0) -> None:
        """Another process opened this breaker for ``seconds``: open too (CLOSED/HALF_OPEN).

        Manual states (DISABLED, FORCED_OPEN, METRICS_ONLY) are left alone; an OPEN
        breaker keeps the later of the two ends. ``trips`` is the fleet's count of trips
        in a row: a later trip of this process grows its cool-down from there.
        """
        with self._lock:
            if self.state is not HALF_OPEN:  # (see remote_close)
                self._poll(now)
            state = self.state
            if state is CLOSED or state is HALF_OPEN:
                self._move(OPEN, now, "remote", open_for=seconds, remote=True)
            elif state is OPEN and now + seconds > self._open_until:
                self._open_until = now + seconds
            if self.state is OPEN and trips > self._trips:
                self._trips = trips
        if self._outbox:
            self._flush(now)

    @property
    def trips(self) -> int:
        """Trips in a row since the breaker last closed (the cool-down grows with it)."""
        return self._trips

    def remote_close(self, now: float, *, manual: bool = False) -> None:
        """Another process's half-open probe succeeded: close, unless this breaker is in
        a cool-down of its own (then it probes for itself when that ends). ``manual``:
        an operator closed the breaker there; close from any OPEN state here too (the
        states set by hand, DISABLED, FORCED_OPEN and METRICS_ONLY, stay).
        """
        with self._lock:
            # The fleet's news supersedes a late probe noticed only now: a timeout
            # (half_open_timeout) would be a trip to broadcast after that news,
            # reopening a fleet that another process's probe just closed.
            if self.state is not HALF_OPEN:
                self._poll(now)
            state = self.state
            if state is HALF_OPEN or (state is OPEN and (self._remote or manual)):
                self._move(CLOSED, now, "remote")
        if self._outbox:
            self._flush(now)

    def retry_after(self, now: float) -> float | None:
        """Seconds until half-open while OPEN, else ``None``."""
        if self.state is OPEN:
            return max(0.0, self._open_until - now)
        return None

    def statistics(self, now: float) -> BreakerStatistics:
        """A consistent snapshot at ``now``."""
        with self._lock:
            self._poll(now)
            window = self._window
            calls = failures = slow = consecutive = 0
            if window is not None:
                calls, failures, slow = window.counts(now)
                consecutive = window.consecutive
            enough = calls >= self.config.min_calls and calls > 0
            half = self._half
            stats = BreakerStatistics(
                state=self.state,
                calls=calls,
                failures=failures,
                slow_calls=slow,
                failure_rate=failures / calls if enough else None,
                slow_call_rate=slow / calls if enough else None,
                consecutive_failures=consecutive,
                rejected=self._rejected.total(),
                opened=self.opened,
                retry_after=max(0.0, self._open_until - now) if self.state is OPEN else None,
                half_open_in_flight=0 if half is None else half.admitted - half.results,
            )
        if self._outbox:
            self._flush(now)
        return stats

    def __repr__(self) -> str:
        return f"<BreakerCore key={self.key!r} {self.state.value}>"
