"""What can be injected: fault descriptions, time windows and latency distributions.

A fault is an immutable description: *what* happens (latency, an exception, a replaced
result, a hang, an HTTP status...) and *when* (``rate``, ``schedule``, ``when``). The
injectors (:class:`resilience.Faults`, the httpx transport, the ASGI middleware) read
them; the faults themselves hold no state.
"""

from __future__ import annotations

import math
import random
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._validate import (
    check_choice,
    check_int,
    check_key_function,
    check_number,
    check_predicate,
    check_probability,
)
from ..errors import ConfigurationError, InjectedFault, _restored

__all__ = [
    "ConnectFailure",
    "Distribution",
    "Error",
    "Fault",
    "Hang",
    "Latency",
    "RequestTimeout",
    "Result",
    "Schedule",
    "Status",
    "Truncate",
    "Window",
    "exponential",
    "fault_list",
    "lognormal",
    "normalize_schedule",
    "uniform",
]


# -- time windows ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """A time window ``[start, end)`` in seconds since the injector started.

    Times are read from the injector's clock (a :class:`~resilience.testing.FakeClock`
    in tests) and counted from its construction or its last ``reset()``. With
    ``every=``, the window repeats with that period: ``Window(10, 15, every=60)`` is
    on from 10 s to 15 s, from 70 s to 75 s, and so on.

    Example::

        rs.Faults(chaos.Error(rate=1.0, schedule=[chaos.Window(5, 10)]))   # fail 5..10 s
        rs.Faults(latency=0.5, schedule=[(0, 2), (30, 32)])                 # tuples work too
    """

    start: float
    end: float = math.inf
    every: float | None = None

    def __post_init__(self) -> None:
        check_number("Window start", self.start)
        end = self.end
        if isinstance(end, bool) or not (isinstance(end, int | float) and end > self.start):
            raise ConfigurationError(
                f"Window end must be a number > start ({self.start!r}), got {self.end!r}"
            )
        if self.every is not None:
            check_number("Window every", self.every, strict=True)
            if self.end - self.start > self.every:
                raise ConfigurationError(
                    f"Window every must be >= end - start ({self.end - self.start!r}), "
                    f"got {self.every!r}"
                )

    def contains(self, elapsed: float) -> bool:
        """Whether ``elapsed`` seconds since the start of the schedule fall in this window.

        Example: ``assert Window(1, 2).contains(1.5)``
        """
        if elapsed < self.start:
            return False
        if self.every is not None:
            elapsed = self.start + (elapsed - self.start) % self.every
        return elapsed < self.end


#: What ``schedule=`` accepts: windows, ``(start, end)`` pairs, or one window.
Schedule = Window | tuple[float, float] | Iterable[Window | tuple[float, float]]


def normalize_schedule(name: str, schedule: Any) -> tuple[Window, ...] | None:
    """``schedule`` as a tuple of windows (``None`` stays ``None``: always on)."""
    if schedule is None:
        return None
    if isinstance(schedule, Window):
        return (schedule,)
    if (
        isinstance(schedule, tuple)
        and len(schedule) == 2
        and all(isinstance(x, int | float) for x in schedule)
    ):
        return (Window(*schedule),)
    try:
        items = list(schedule)
    except TypeError:
        raise ConfigurationError(
            f"{name} must be Window objects or (start, end) pairs, got {schedule!r}"
        ) from None
    windows: list[Window] = []
    for item in items:
        if isinstance(item, Window):
            windows.append(item)
        elif isinstance(item, tuple) and len(item) in (2, 3):
            windows.append(Window(*item))
        else:
            raise ConfigurationError(
                f"{name} must be Window objects or (start, end) pairs, got {item!r}"
            )
    if not windows:
        raise ConfigurationError(f"{name} must contain at least one window (or be None)")
    return tuple(windows)


# -- latency distributions ---------------------------------------------------------------


class Distribution:
    """A latency distribution: ``dist(rng)`` draws seconds (never negative) from ``rng``.

    Build one with :func:`uniform`, :func:`exponential` or :func:`lognormal`, or pass
    any callable ``f(rng: random.Random) -> float`` where a distribution is accepted.

    Example::

        rs.Faults(latency=chaos.exponential(0.05, cap=1.0), seed=3)
    """

    __slots__ = ("_draw", "_text")

    def __init__(self, draw: Callable[[random.Random], float], text: str) -> None:
        self._draw = draw
        self._text = text

    def __call__(self, rng: random.Random) -> float:
        """Draw one delay in seconds."""
        return max(0.0, float(self._draw(rng)))

    def __repr__(self) -> str:
        return self._text


def _cap(value: float, cap: float | None) -> float:
    return value if cap is None else min(value, cap)


def uniform(low: float, high: float) -> Distribution:
    """Delays drawn uniformly from ``[low, high]`` seconds.

    Example: ``chaos.Latency(chaos.uniform(0.05, 0.2), rate=0.5)``
    """
    low = check_number("low", low)
    high = check_number("high", high, minimum=low)
    return Distribution(lambda rng: rng.uniform(low, high), f"uniform({low:g}, {high:g})")


def exponential(mean: float, *, cap: float | None = None) -> Distribution:
    """Exponentially distributed delays with the given ``mean``, cut at ``cap`` seconds.

    Example: ``chaos.Latency(chaos.exponential(0.1, cap=2.0))``
    """
    mean = check_number("mean", mean, strict=True)
    cap = check_number("cap", cap, allow_none=True)
    return Distribution(
        lambda rng: _cap(rng.expovariate(1.0 / mean), cap), f"exponential({mean:g}, cap={cap})"
    )


def lognormal(median: float, sigma: float = 0.5, *, cap: float | None = None) -> Distribution:
    """Log-normal delays (a long tail, like real network latency), cut at ``cap`` seconds.

    ``median`` is the 50th percentile; ``sigma`` the spread of ``log(delay)``.

    Example: ``chaos.Latency(chaos.lognormal(0.05, sigma=1.0, cap=3.0))``
    """
    median = check_number("median", median, strict=True)
    sigma = check_number("sigma", sigma)
    if sigma > 10:  # exp() of a draw would overflow (a spread of 40 orders of magnitude)
        raise ConfigurationError(f"sigma must be at most 10, got {sigma!r}")
    cap = check_number("cap", cap, allow_none=True)
    mu = math.log(median)
    return Distribution(
        lambda rng: _cap(rng.lognormvariate(mu, sigma), cap),
        f"lognormal({median:g}, sigma={sigma:g}, cap={cap})",
    )


# -- faults ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """Base of every fault: *when* it fires.

    * ``rate``: the probability (0..1) that it fires on a call, drawn from the
      injector's seeded RNG;
    * ``schedule``: time windows (:class:`Window`) outside of which it never fires;
    * ``when``: a predicate; it is called with the injector's key when the injector
      has ``key=``, else with the call's arguments (the httpx transport passes the
      ``httpx.Request``, the ASGI middleware the ASGI ``scope``).

    All three must agree for the fault to fire. Concrete faults say *what* happens.

    Example::

        chaos.Error(ConnectionError, rate=0.2, schedule=[(10, 20)], when=lambda host: host == "b")
    """

    rate: float = 1.0
    schedule: Schedule | None = None
    when: Callable[..., bool] | None = None

    #: Short name used in statistics and events.
    kind: ClassVar[str] = "fault"
    #: Whether the fault ends the call (the function is not called).
    terminal: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", check_probability("rate", self.rate))
        object.__setattr__(self, "schedule", normalize_schedule("schedule", self.schedule))
        # Its arguments depend on the injector (its key, or the call's): only its kind
        # is checked here.
        check_key_function("when", self.when, gives="its answer")


@dataclass(frozen=True, slots=True)
class Latency(Fault):
    """Delay the call by ``seconds`` (a number or a :class:`Distribution`), then run it.

    The delay is a sleep on the injector's clock, so a
    :class:`~resilience.testing.FakeClock` makes it instant and an async
    :class:`~resilience.Timeout` cancels it like any slow call. Latency does not end
    the call: other faults of the same injector may still fire after it.

    Example::

        chaos.Latency(0.2, rate=0.1)                     # 10% of calls wait 200 ms
        chaos.Latency(chaos.uniform(0.0, 0.5))           # every call waits 0..500 ms
    """

    seconds: float | Callable[[random.Random], float] = 0.0

    kind: ClassVar[str] = "latency"
    terminal: ClassVar[bool] = False

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        if callable(self.seconds):  # a distribution: called with the fault's RNG
            check_predicate("Latency seconds", self.seconds, gives="a delay")
        else:
            object.__setattr__(
                self, "seconds", check_number("Latency seconds", self.seconds, allow_inf=False)
            )

    def draw(self, rng: random.Random) -> float:
        """The delay of one call, in seconds."""
        seconds = self.seconds
        if callable(seconds):
            return max(0.0, float(seconds(rng)))
        return seconds


def _instantiate(exc_type: type[BaseException]) -> BaseException:
    try:
        return exc_type("injected fault")
    except TypeError:
        return exc_type()


@dataclass(frozen=True, slots=True)
class Error(Fault):
    """Raise an exception instead of calling the function.

    ``exception`` is an exception type (built with the message ``"injected fault"``),
    an instance (a copy is raised each time), or a factory called with no argument
    that returns one. The default is :class:`resilience.InjectedFault`.

    Example::

        chaos.Error(rate=0.1)                                        # rs.InjectedFault
        chaos.Error(ConnectionResetError, rate=0.05)
        chaos.Error(lambda: rs.RateLimited(retry_after=1.0), rate=0.2)
    """

    exception: type[BaseException] | BaseException | Callable[[], BaseException] = InjectedFault

    kind: ClassVar[str] = "error"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        exc = self.exception
        if isinstance(exc, type):
            if not issubclass(exc, BaseException):
                raise ConfigurationError(f"exception must be an exception type, got {exc!r}")
            try:
                _instantiate(exc)
            except Exception as error:
                raise ConfigurationError(
                    f"exception {exc.__name__} cannot be built from a message; pass an "
                    f"instance or a factory instead ({error})"
                ) from None
        elif isinstance(exc, BaseException):
            try:
                _copy_exception(exc)
            except Exception as error:
                # Raising the one instance every time would share it between calls and
                # grow its traceback (and the frames it holds) with every raise.
                raise ConfigurationError(
                    f"the exception {exc!r} cannot be copied ({error}); pass a factory "
                    "instead: Error(lambda: ...)"
                ) from None
        elif not callable(exc):
            raise ConfigurationError(
                f"exception must be an exception type, instance or factory, got {exc!r}"
            )
        else:
            check_predicate("exception", exc, arguments=0, gives="an exception")

    def build(self) -> BaseException:
        """A fresh exception to raise."""
        exc = self.exception
        if isinstance(exc, type):
            return _instantiate(exc)
        if isinstance(exc, BaseException):
            return _copy_exception(exc)  # copyable: checked when built
        made = exc()
        if not isinstance(made, BaseException):
            raise TypeError(f"the exception factory {exc!r} returned {made!r}, not an exception")
        return made


_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Result(Fault):
    """Return ``value`` instead of calling the function (a wrong or empty answer).

    Example::

        chaos.Result(None, rate=0.05)       # 5% of lookups come back empty
        chaos.Result([], when=lambda user: user == "mallory")
    """

    value: Any = _MISSING

    kind: ClassVar[str] = "result"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        if self.value is _MISSING:
            raise ConfigurationError("Result needs the value to return: Result(value)")


@dataclass(frozen=True, slots=True)
class Hang(Fault):
    """Never answer: async calls wait until cancelled; sync calls block, then fail.

    An ``async`` call hangs until something cancels it (a :class:`resilience.Timeout`,
    a cancel scope, a client disconnect), exactly like a dependency that accepted the
    request and went silent. A running thread cannot be cancelled, so a sync call
    blocks for ``block`` seconds on the injector's clock and then raises
    :class:`resilience.InjectedFault` (a hung socket with an OS timeout). With a
    :class:`~resilience.testing.FakeClock` both are instant in real time; the async
    hang moves virtual time forward in steps that stop at the ambient deadline.

    Example::

        chaos.Hang(rate=0.01)                   # 1% of calls never come back
        chaos.Hang(rate=1.0, block=2.0)         # sync calls block 2 s, then fail
    """

    block: float = 10.0

    kind: ClassVar[str] = "hang"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        object.__setattr__(self, "block", check_number("block", self.block))


# -- HTTP faults (httpx transport and ASGI middleware) -------------------------------------


@dataclass(frozen=True, slots=True)
class Status(Fault):
    """Answer with an HTTP error status instead of forwarding the request.

    ``retry_after`` (seconds) adds a ``Retry-After`` header, as a server that sheds
    load or rate limits would. Used by :class:`FaultyTransport` (outbound) and
    :class:`FaultMiddleware` (inbound).

    Example::

        chaos.Status(503, retry_after=2, rate=0.1)
        chaos.Status(429, retry_after=1, when=lambda request: request.method == "POST")
    """

    code: int = 503
    retry_after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    kind: ClassVar[str] = "status"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        # 1xx are interim responses, never the answer to a request
        check_int("code", self.code, minimum=200, maximum=599)
        check_number("retry_after", self.retry_after, allow_none=True)
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise ConfigurationError(
                f"headers must map names to values (str), got {self.headers!r}"
            )
        if not isinstance(self.body, bytes):
            raise ConfigurationError(f"body must be bytes, got {type(self.body).__name__}")
        if self.body and self.code in (204, 304):
            raise ConfigurationError(f"a {self.code} response has no body, got body={self.body!r}")

    def header_list(self) -> list[tuple[str, str]]:
        """The response headers, ``Retry-After`` (rounded up to whole seconds) included."""
        headers = [(str(k), str(v)) for k, v in dict(self.headers).items()]
        if self.retry_after is not None:
            headers.append(("retry-after", str(math.ceil(self.retry_after))))
        return headers


@dataclass(frozen=True, slots=True)
class ConnectFailure(Fault):
    """Fail to connect (``httpx.ConnectError``): the host refused or was unreachable.

    Example: ``chaos.ConnectFailure(rate=0.05)``
    """

    kind: ClassVar[str] = "connect"


@dataclass(frozen=True, slots=True)
class RequestTimeout(Fault):
    """Time out (``httpx.ConnectTimeout``/``ReadTimeout``/``WriteTimeout``/``PoolTimeout``).

    The transport first waits ``wait`` seconds on its clock (default: the request's
    own timeout for that ``phase``, as a real timeout would), then raises.

    Example: ``chaos.RequestTimeout(phase="read", rate=0.1)``
    """

    phase: str = "read"
    wait: float | None = None

    kind: ClassVar[str] = "timeout"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        check_choice("phase", self.phase, ("connect", "read", "write", "pool"))
        check_number("wait", self.wait, allow_none=True)


@dataclass(frozen=True, slots=True)
class Truncate(Fault):
    """Deliver only the first ``keep`` fraction of the response body, then drop the connection.

    The response is received from the real transport; its body stops after
    ``keep × length`` bytes and reading further raises ``httpx.RemoteProtocolError``
    (peer closed the connection without sending the complete body).

    Example: ``chaos.Truncate(keep=0.5, rate=0.1)``
    """

    keep: float = 0.5

    kind: ClassVar[str] = "truncate"

    def __post_init__(self) -> None:
        Fault.__post_init__(self)
        keep = check_probability("keep", self.keep)
        if keep >= 1.0:
            raise ConfigurationError(f"keep must be a fraction in [0, 1), got {self.keep!r}")
        object.__setattr__(self, "keep", keep)


def fault_list(name: str, value: Any) -> list[Fault]:
    """``value`` (one fault or an iterable of them) as a list; the kinds are checked by
    the caller, which knows the ones it injects."""
    if isinstance(value, Fault):
        return [value]
    if value is None or isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{name} must be a fault or a list of faults, got {value!r}")
    return list(value)


# Attributes every exception has, copied by hand (or, for the traceback, left behind).
_OWN = frozenset(
    {"__dict__", "__weakref__", "args", "__traceback__", "__cause__", "__context__"}
    | {"__suppress_context__"}
)
_SLOT_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)
_UNSET = object()


def _copy_exception(exc: BaseException) -> BaseException:
    """A copy of ``exc`` with its args and attributes, and no traceback.

    Not ``copy.copy``: for exceptions it calls ``type(exc)(*exc.args)``, which runs an
    ``__init__`` that formats its message again on the formatted one (``Upstream(503)``
    whose message is "upstream answered 503" came out as "upstream answered upstream
    answered 503"). ``__new__`` takes the args without running ``__init__``; what an
    ``__init__`` stored outside ``__dict__`` is copied from the slots of every class
    in the MRO: built-in ones (``SystemExit.code``, ``StopIteration.value``,
    ``OSError.errno``, ``ImportError.name``, the ``UnicodeError`` fields) and declared
    ``__slots__`` alike.
    """
    cls = type(exc)
    fresh = _restored(cls, exc.args)
    state = getattr(exc, "__dict__", None)
    if state:
        fresh.__dict__.update(state)
    for klass in cls.__mro__:
        for name, member in vars(klass).items():
            if name in _OWN or not isinstance(member, _SLOT_TYPES):
                continue
            try:
                value = getattr(exc, name)
                # None where the copy reads None already: left alone, since setting it
                # is not the same (OSError.filename2 = None prints as "... -> None").
                if value is not None or getattr(fresh, name, _UNSET) is not None:
                    setattr(fresh, name, value)
            except (AttributeError, TypeError):
                pass  # unset on the original (OSError.characters_written), or read-only
    fresh.__cause__ = exc.__cause__
    fresh.__context__ = exc.__context__
    fresh.__suppress_context__ = exc.__suppress_context__
    return fresh
