"""The policy model: one protocol, one decorator, one way to compose.

A policy runs a call: ``policy.call(fn, *args, **kwargs)`` for sync code and
``await policy.call_async(fn, *args, **kwargs)`` for async code. Everything else is
derived from those two methods:

* ``@policy`` decorates ``def`` and ``async def`` functions and methods (instance,
  class and static), keeping ``__name__``, ``__doc__``, :func:`inspect.signature`
  and the static type (``Callable[P, T] -> Callable[P, T]``).
* ``Pipeline(a, b, c)`` runs ``a`` around ``b`` around ``c`` around the call. The
  arguments of the call reach every policy unchanged, so keyed policies (per domain,
  per user) work at any depth.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from types import FunctionType, MethodType
from typing import (
    TYPE_CHECKING,
    Any,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
    runtime_checkable,
)

from . import _deferred
from ._clock import Clock
from ._events import L, Listener, Observable

if TYPE_CHECKING:
    from ._fallback import Fallback  # it widens the return type, so it is no Policy

__all__ = ["Pipeline", "PipelineStatistics", "Policy", "PolicyBase", "decorate"]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")

_CO_COROUTINE = inspect.CO_COROUTINE
#: The code flags of generator and async generator functions (a hot ``call_async`` may
#: test them inline before calling :func:`refuse_generator_async`).
GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_CO_REFUSED = _CO_COROUTINE | GENERATOR_FLAGS


@runtime_checkable
class Policy(Protocol):
    """What every policy implements; anything with these two methods composes.

    Example::

        class LogCalls:
            def call(self, fn, /, *args, **kwargs):
                print("calling", fn)
                return fn(*args, **kwargs)

            async def call_async(self, fn, /, *args, **kwargs):
                print("calling", fn)
                return await fn(*args, **kwargs)

        pipeline = rs.Pipeline(LogCalls(), rs.Retry(on=OSError))
    """

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` under this policy."""
        ...

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` under this policy."""
        ...


def _is_function_stand_in(fn: object) -> bool:
    """Whether ``fn`` only poses as a function: ``MagicMock(spec=some_def)`` passes
    ``isinstance(fn, FunctionType)`` and answers every code-flag test with a truthy
    mock, so :mod:`inspect` calls it a coroutine and an async generator function at
    once. Such a stand-in is judged as what it returns when called: a plain call (an
    ``AsyncMock`` carries real ``int`` flags and stays async)."""
    if type(fn) is FunctionType or not isinstance(fn, FunctionType):
        return False
    code = getattr(fn, "__code__", None)
    return not isinstance(getattr(code, "co_flags", None), int)


def is_generator_function(fn: object) -> bool:
    """Whether calling ``fn`` creates a generator, sync or async (which :func:`decorate`
    and ``call`` refuse): a generator function or method, a ``functools.partial`` of
    one, or an object whose ``__call__`` is one. Policies with their own decorator fast
    paths leave these to :func:`decorate`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if _is_function_stand_in(fn):
        return False
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return True
    if not callable(fn) or inspect.isroutine(fn):
        return False
    call = type(fn).__call__
    return inspect.isasyncgenfunction(call) or inspect.isgeneratorfunction(call)


def refuse_generator(fn: object) -> None:
    """Raise ``TypeError`` if calling ``fn`` creates a generator (see
    :func:`is_generator_function`): a policy would time, retry or count nothing of the
    work, which runs later, as the caller iterates, outside it."""
    if not is_generator_function(fn):
        return
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn if inspect.isroutine(fn) else type(fn).__call__
    kind = "an async generator" if inspect.isasyncgenfunction(target) else "a generator"
    raise TypeError(
        f"{fn!r} is {kind} function: policies wrap calls that return once "
        "(apply the policy to the calls the generator makes, or collect its items "
        "in a function that returns them)"
    )


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine to await: an ``async def`` function or
    method, a ``functools.partial`` of one, or an object whose ``__call__`` is one (a
    client object, say). A policy must wrap those with an ``async`` wrapper, or it
    would only time, retry or count the creation of the coroutine."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if _is_function_stand_in(fn):
        return False
    if inspect.iscoroutinefunction(fn):
        return True
    return (
        callable(fn)
        and not inspect.isroutine(fn)
        and inspect.iscoroutinefunction(type(fn).__call__)
    )


def refuse_async(policy: object, fn: object) -> None:
    """Refuse ``policy.call(async_fn)`` (and generator functions) with ``TypeError``.

    The sync ``call`` of an ``async def`` function only creates the coroutine: the
    policy would admit, time or retry nothing of the work, which runs when the caller
    awaits the coroutine, outside the policy (``await breaker.call(fetch)`` reads
    right and protects nothing); a generator function's call only creates the
    generator (see :func:`refuse_generator`). Functions and bound methods, the common
    cases, are judged inline on their code flags; anything else by
    :func:`is_async_callable` and :func:`is_generator_function`.
    """
    target, kind = fn, type(fn)
    if kind is _Layer:  # a pipeline's own layer: sync by construction
        return
    if kind is MethodType:
        target = fn.__func__  # type: ignore[attr-defined]
        kind = type(target)
    if kind is FunctionType:
        flags = target.__code__.co_flags  # type: ignore[attr-defined]
        if not flags & _CO_REFUSED:
            return
        if not flags & _CO_COROUTINE:
            refuse_generator(target)
    else:
        try:
            generator = is_generator_function(target)
            coroutine = not generator and is_async_callable(target)
        except Exception:  # a proxy whose attributes misbehave: not ours to judge
            return
        if generator:
            refuse_generator(target)
        if not coroutine:
            return
    raise TypeError(
        f"{fn!r} is an async function: use `await policy.call_async(fn, ...)` "
        f"(or decorate it) to run it under {policy!r}"
    )


def refuse_generator_async(fn: object) -> None:
    """``call_async``'s guard: refuse a generator or async generator function with
    ``TypeError`` before the policy spends a token, a slot or an attempt on it (see
    :func:`refuse_generator`). A plain ``def`` is not refused: it may return an
    awaitable (``call_async(lambda: fetch(url))``), which only calling it tells.
    Functions and bound methods are judged inline on their code flags."""
    kind = type(fn)
    if kind is _AsyncLayer:  # a pipeline's own layer: checked when the chain was built
        return
    if kind is MethodType:
        fn = fn.__func__  # type: ignore[attr-defined]
        kind = type(fn)
    if kind is FunctionType:
        if fn.__code__.co_flags & GENERATOR_FLAGS:  # type: ignore[attr-defined]
            refuse_generator(fn)
        return
    try:
        generator = is_generator_function(fn)
    except Exception:  # a proxy whose attributes misbehave: not ours to judge
        return
    if generator:
        refuse_generator(fn)


@overload
def decorate(
    policy: Fallback[R], fn: Callable[P, Coroutine[Any, Any, T]]
) -> Callable[P, Coroutine[Any, Any, T | R]]: ...
@overload
def decorate(policy: Fallback[R], fn: Callable[P, T]) -> Callable[P, T | R]: ...
@overload
def decorate(policy: Policy, fn: Callable[P, T]) -> Callable[P, T]: ...
def decorate(policy: Policy | Fallback[Any], fn: Callable[P, Any]) -> Callable[P, Any]:
    """Wrap ``fn`` so that every call runs under ``policy``.

    ``async def`` functions (and other async callables, see :func:`is_async_callable`) get
    an ``async def`` wrapper that awaits ``policy.call_async``; everything else gets a
    plain wrapper around ``policy.call``.
    ``classmethod`` and ``staticmethod`` objects are unwrapped, decorated and re-wrapped,
    so the decorator may sit above or below them. Generator functions (sync or async)
    are refused with ``TypeError``: calling one only creates the generator.

    A :class:`Fallback` widens the return type to ``T | R``, as when it decorates.

    Example::

        fetch = rs.decorate(rs.Retry(on=OSError), fetch)
    """
    if isinstance(policy, type):
        raise TypeError(
            f"decorate() needs a policy object, got the class {policy.__name__}: call it "
            f"({policy.__name__}(...))"
        )
    if isinstance(fn, classmethod | staticmethod):
        inner = decorate(policy, fn.__func__)
        return cast(Callable[P, T], type(fn)(inner))
    if not callable(fn):
        raise TypeError(f"a policy decorates a function or method, got {fn!r}")
    refuse_generator(fn)
    is_async = is_async_callable(fn)
    # A policy may offer a specialised wrapper body (same semantics as call/call_async,
    # fewer layers); it returns None when its configuration needs the general path.
    wrap = getattr(policy, "_wrap", None)
    special = wrap(fn, is_async) if wrap is not None else None
    if special is not None:
        return cast(Callable[P, T], functools.wraps(fn)(special))
    if is_async:
        call_async = policy.call_async

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await call_async(fn, *args, **kwargs)

        return cast(Callable[P, T], async_wrapper)

    call = policy.call

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return call(fn, *args, **kwargs)

    return cast(Callable[P, T], wrapper)


class PolicyBase(Observable):
    """Shared plumbing of the built-in policies: naming, listeners, decorating.

    Subclasses implement ``call`` and ``call_async``; this class gives them
    ``@policy`` decoration, ``add_listener``/``remove_listener`` and cheap event emission.

    Example::

        class Audit(rs.PolicyBase):
            def call(self, fn, /, *args, **kwargs):
                return fn(*args, **kwargs)

            async def call_async(self, fn, /, *args, **kwargs):
                return await fn(*args, **kwargs)
    """

    #: True for policies that raise :class:`Rejected` without running the call.
    raises_rejected: bool = False
    #: Which :class:`Rejected` they raise (checked against an outer Retry's ``on=``);
    #: ``None``: any.
    rejection: type[BaseException] | None = None

    def __init__(self, *, name: str | None = None) -> None:
        Observable.__init__(self, name)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` under this policy."""
        raise NotImplementedError

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` under this policy."""
        raise NotImplementedError

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Decorate ``fn`` (``def`` or ``async def``, function or method).

        Example::

            @rs.Retry(on=ConnectionError)
            async def fetch(url: str) -> bytes: ...
        """
        return decorate(self, fn)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Pipeline(PolicyBase):
    """Compose policies, outermost first; a pipeline is itself a policy.

    ``Pipeline(a, b, c)`` runs ``a`` around ``b`` around ``c`` around the call. Nested
    pipelines are flattened. The recommended order, outermost first::

        Fallback -> Retry(deadline=...) -> CircuitBreaker -> RateLimiter / Bulkhead
                 -> Timeout (per attempt) -> Faults -> the call

    The fallback sees the final outcome; the retry sees each attempt and honours the
    ``retry_after`` of a rejection; the breaker records every attempt, not just the
    last; limits are taken per attempt; the timeout bounds each attempt; injected
    faults hit the call as a real failure would.

    Building a pipeline warns (:class:`PipelineOrderWarning`) on orders known to
    hurt: a ``Retry`` that retries ``Rejected`` errors from a policy inside it without
    honouring ``retry_after`` (it hammers a limiter or an open breaker), and a
    per-attempt ``Timeout`` inside a ``Retry`` with no total deadline anywhere (the
    call can take ``attempts × timeout`` plus sleeps).

    ``clock=`` is accepted like on every policy and checked; the pipeline itself reads
    no time (its policies keep the clocks they were built with).

    Example::

        resilient = rs.Pipeline(
            rs.Fallback("n/a"),
            rs.Retry(on=OSError, attempts=3, deadline=2.0),
            rs.Timeout(0.5),
        )

        @resilient
        def lookup(key: str) -> str: ...
    """

    def __init__(
        self,
        *policies: Policy | Fallback[Any],
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        from ._validate import check_clock  # _validate imports errors, which import this

        self._clock: Clock = check_clock("clock", clock)
        flat: list[Policy] = []
        #: Order problems a nested pipeline warned about when it was built: not again.
        reported: set[str] = set()
        for policy in policies:
            if isinstance(policy, Pipeline):
                flat.extend(policy.policies)
                reported.update(_order_problems(policy.policies))
                continue
            candidate: object = policy  # typed Policy, but checked: untyped callers exist
            if isinstance(candidate, type) or not isinstance(candidate, Policy):
                from .errors import ConfigurationError

                if isinstance(candidate, type):
                    raise ConfigurationError(
                        f"policies must be policy objects, got the class "
                        f"{candidate.__name__}: call it ({candidate.__name__}(...))"
                    )
                raise ConfigurationError(
                    f"policies must implement call() and call_async(), got {policy!r}"
                )
            # An error-only rs.Timeout("...") refuses now, not at the first call.
            refuse_without_limit = getattr(candidate, "_refuse_without_limit", None)
            if refuse_without_limit is not None:
                refuse_without_limit()
            flat.append(policy)
        seen: set[int] = set()
        for policy in flat:
            if id(policy) in seen:
                from .errors import ConfigurationError

                # One object twice is two layers sharing one state: a bulkhead of one
                # would wait for its own slot, a breaker would count each call twice.
                raise ConfigurationError(
                    f"{policy!r} appears twice in the pipeline (directly or through a "
                    f"nested pipeline): a policy is one layer; build another one for a "
                    f"second layer"
                )
            seen.add(id(policy))
        self.policies: tuple[Policy, ...] = tuple(flat)
        for message in _order_problems(self.policies):
            if message not in reported:
                warnings.warn(message, PipelineOrderWarning, stacklevel=2)

    def add_listener(self, listener: L) -> L:
        """Receive the events of every policy in the pipeline; returns ``listener``.

        The pipeline emits no events of its own: the listener is added to each policy
        that takes listeners, so it also hears a policy that is shared with other code
        when that code calls it. :meth:`remove_listener` takes it off them all.

        Example::

            pipeline.add_listener(lambda event: print(event))
        """
        super().add_listener(listener)
        for policy in self.policies:
            add = getattr(policy, "add_listener", None)
            if callable(add):
                add(listener)
        return listener

    def remove_listener(self, listener: Listener) -> None:
        """Stop sending the events of the pipeline's policies to ``listener``.

        Listeners are not counted: it comes off each of the pipeline's policies, also
        one that had it from its own ``add_listener`` or from another pipeline.

        Example: ``pipeline.remove_listener(print)``
        """
        super().remove_listener(listener)
        for policy in self.policies:
            remove = getattr(policy, "remove_listener", None)
            if callable(remove):
                remove(listener)

    def _chain(
        self, fn: Callable[..., Any], *, is_async: bool, lasting: bool = False
    ) -> Callable[..., Any]:
        """The policies' layers around ``fn``, innermost built first.

        A layer that may be deferred (a disabled ``Faults`` before fault injection was
        ever switched on; see ``_deferred``) is left out. In a ``lasting`` chain (a
        decorated function) it is recorded with the next outer layer and spliced in
        when fault injection is first switched on, or put in at once where it cannot
        be spliced later; a one-off chain simply runs without it.
        """
        deferred: list[Policy] = []
        for policy in reversed(self.policies):
            defer = getattr(policy, "_defer", None)
            if defer is not None and defer():
                deferred.append(policy)
                continue
            outer = _layer(policy, fn, is_async)
            if deferred:
                group = tuple(reversed(deferred))
                deferred = []
                if lasting:
                    build = functools.partial(_layers, group, is_async=is_async)
                    if not _deferred.splice_later(outer, fn, build):
                        outer = _layer(policy, build(fn), is_async)
            fn = outer
        if deferred and lasting:  # nothing outside them to splice them into later
            fn = _layers(tuple(reversed(deferred)), fn, is_async=is_async)
        return fn

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` through every policy, outermost first."""
        refuse_async(self, fn)
        return self._chain(fn, is_async=False)(*args, **kwargs)  # type: ignore[no-any-return]

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)`` through every policy, outermost first."""
        refuse_generator_async(fn)
        return await self._chain(fn, is_async=True)(*args, **kwargs)  # type: ignore[no-any-return]

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any] | None:
        """The decorator body (see ``decorate``): the chain of policies, built once."""
        chain = self._chain(fn, is_async=is_async, lasting=True)
        if chain is fn:  # an empty pipeline: the general wrapper will do
            return None
        if inspect.isfunction(chain):
            # The outermost layer is a fresh function: it can be the wrapper itself.
            return chain
        if is_async:

            async def pipeline_async(*args: Any, **kwargs: Any) -> Any:
                return await chain(*args, **kwargs)

            return pipeline_async

        def pipeline_sync(*args: Any, **kwargs: Any) -> Any:
            return chain(*args, **kwargs)

        return pipeline_sync

    def statistics(self) -> PipelineStatistics:
        """Each policy's own ``statistics()``, outermost first (``None`` if it has none).

        Example::

            fallback_stats, retry_stats = rs.Pipeline(rs.Fallback(0), retry).statistics().policies
        """
        snapshots = []
        for policy in self.policies:
            statistics = getattr(policy, "statistics", None)
            snapshots.append(statistics() if callable(statistics) else None)
        return PipelineStatistics(tuple(snapshots))

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __len__(self) -> int:
        return len(self.policies)

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.policies)
        return f"Pipeline({inner})"


def _layer(policy: Policy, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    """One policy around ``fn``: its own lean wrapper when it has one, otherwise a
    ``functools.partial`` of its call method (implemented in C: no closure per call)."""
    wrap = getattr(policy, "_wrap", None)
    special = wrap(fn, is_async) if wrap is not None else None
    if special is not None:
        return special  # type: ignore[no-any-return]
    if is_async:
        return _AsyncLayer(policy.call_async, fn)
    return _Layer(policy.call, fn)


class _Layer(functools.partial[Any]):
    """A pipeline layer: a policy's sync ``call`` bound to what it runs (a sync
    callable, checked when the chain was built), which ``refuse_async`` need not
    inspect on every call."""

    __slots__ = ()


class _AsyncLayer(functools.partial[Any]):
    """A pipeline layer of ``call_async``: what it runs was checked when the chain was
    built, so ``refuse_generator_async`` need not inspect it on every call."""

    __slots__ = ()


def _layers(
    policies: tuple[Policy, ...], fn: Callable[..., Any], *, is_async: bool
) -> Callable[..., Any]:
    """``policies`` (outermost first) around ``fn``."""
    for policy in reversed(policies):
        fn = _layer(policy, fn, is_async)
    return fn


@dataclass(frozen=True, slots=True)
class PipelineStatistics:
    """The statistics of a :class:`Pipeline`'s policies, outermost first.

    Example::

        for snapshot in pipeline.statistics().policies:
            print(snapshot)
    """

    policies: tuple[Any, ...]


class PipelineOrderWarning(UserWarning):
    """Emitted when a :class:`Pipeline` is built in an order known to be harmful.

    Example::

        import warnings
        warnings.simplefilter("error", rs.PipelineOrderWarning)   # make it fatal in CI
    """


def _rejecting(retry: Any, inner: list[Any]) -> list[Any]:
    """The policies inside ``retry`` whose rejections reach it: raised, not answered by
    a Fallback on the way (or by the policy's own ``fallback=``), and caught by its
    ``on=``."""
    from ._fallback import Fallback
    from .errors import Rejected

    found: list[Any] = []
    answered: list[Fallback[Any]] = []
    for policy in inner:
        kind = getattr(policy, "rejection", None) or Rejected
        own = getattr(policy, "_fallback", None)  # a breaker's fallback=
        if (
            getattr(policy, "raises_rejected", False)
            and retry._may_retry(kind)
            and not any(f._absorbs(kind) for f in (*answered, own) if isinstance(f, Fallback))
        ):
            found.append(policy)
        if isinstance(policy, Fallback):
            answered.append(policy)
    return found


def _order_problems(policies: Iterable[Policy]) -> list[str]:
    from ._retry import Retry
    from ._timeout import Timeout

    problems: list[str] = []
    ordered = list(policies)
    for index, policy in enumerate(ordered):
        if not isinstance(policy, Retry):
            continue
        inner = ordered[index + 1 :]
        outer = ordered[:index]
        rejecting = _rejecting(policy, inner)
        if rejecting and not policy.respect_retry_after:
            problems.append(
                f"{policy!r} retries Rejected errors raised by {rejecting[0]!r} inside it "
                "without honouring retry_after: it will hammer the policy that refused. "
                "Use respect_retry_after=True or stop retrying rs.Rejected."
            )
        has_inner_timeout = any(isinstance(p, Timeout) for p in inner)
        has_total = policy.deadline is not None or any(
            isinstance(p, Timeout) or (isinstance(p, Retry) and p.deadline is not None)
            for p in outer
        )
        if has_inner_timeout and not has_total:
            problems.append(
                f"{policy!r} retries a per-attempt Timeout with no total deadline: the call "
                "may take attempts x timeout plus backoff. Give the Retry a deadline= or put "
                "a Timeout outside it."
            )
    return problems
