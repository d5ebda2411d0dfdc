"""``rs.Faults``: the fault-injection policy (latency, errors, results, hangs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from .._clock import Clock
from .._deferred import armed
from .._policy import PolicyBase, refuse_async, refuse_generator_async
from .._validate import check_clock, check_int, check_key_function, check_number, check_probability
from ..errors import ConfigurationError, InjectedFault
from ._core import FaultCore, Plan, new_seed
from ._shell import (
    FaultStatistics,
    emit_plan,
    hang_async,
    sleep_async,
    statistics_of,
    switch_for,
)
from ._specs import (
    _MISSING,
    Error,
    Fault,
    Hang,
    Latency,
    Result,
    Schedule,
    normalize_schedule,
)
from ._switch import chaos_active

__all__ = ["Faults"]

T = TypeVar("T")
P = ParamSpec("P")

_POLICY_FAULTS = (Latency, Error, Result, Hang)


def _rate(name: str, value: float | None) -> float:
    return 1.0 if value is None else check_probability(name, value)


class Faults(PolicyBase):
    """Inject faults into calls, on purpose and reproducibly: latency, errors, results, hangs.

    **Off by default.** Faults fire only inside ``with resilience.chaos.enabled():``,
    in a process started with ``RESILIENCE_CHAOS=1``, or when built with
    ``enabled=True``. Disabled, it costs nothing in a decorated ``Pipeline`` until
    fault injection is first switched on in the process: the pipeline leaves the
    layer out and splices it in at that moment. After that, and as a decorator on
    its own, a disabled call costs one wrapper frame and one ContextVar lookup
    (``benchmarks/bench_chaos.py`` measures both).

    **What** to inject: fault objects from :mod:`resilience.chaos` as positional
    arguments (:class:`~resilience.chaos.Latency`, :class:`~resilience.chaos.Error`,
    :class:`~resilience.chaos.Result`, :class:`~resilience.chaos.Hang`), each with
    its own ``rate``, ``schedule`` and ``when``; or the shorthand keywords:

    * ``latency=`` seconds or a distribution (:func:`~resilience.chaos.uniform`,
      :func:`~resilience.chaos.exponential`, :func:`~resilience.chaos.lognormal`),
      with ``latency_rate=`` (default 1);
    * ``error=`` an exception type, instance or factory (default
      :class:`rs.InjectedFault <resilience.InjectedFault>`), with ``error_rate=``
      (default 1; ``error_rate=`` alone injects ``InjectedFault``);
    * ``result=`` a value returned instead of calling, with ``result_rate=`` (default 1);
    * ``hang_rate=`` (async calls hang until cancelled; sync calls block
      ``hang_block`` seconds, then raise ``InjectedFault``).

    **When**: ``schedule=`` (time windows on this policy's clock, counted from its
    construction or :meth:`reset`) and ``when=`` (a predicate, called with the key
    computed by ``key=`` from the call's arguments, or with the arguments themselves)
    gate every fault, on top of each fault's own conditions.

    **How rates compound.** Each fault draws independently. Latency faults add up and
    do not end the call; the other faults are tried in order and the first that fires
    ends it, so with ``error_rate=a`` and ``result_rate=b`` a call fails with
    probability ``a`` and gets the replaced result with probability ``(1 - a) * b``.
    Across a pipeline, a ``Retry`` of ``n`` attempts outside ``Faults(error_rate=p)``
    fails a call with probability ``p ** n``.

    **Where it goes**: innermost, right around the call, inside the real policies,
    so that they see injected faults exactly as they would see real ones::

        Pipeline(Fallback, Retry, CircuitBreaker, RateLimiter, Timeout, Faults) -> call

    **Replay**: ``seed=`` fixes every draw: the same seed and the same sequence of
    calls give the same faults. Without a seed, a random one is chosen and kept in
    :attr:`seed` (print it when a test fails).

    Example::

        import resilience as rs
        from resilience import chaos

        faults = rs.Faults(
            chaos.Latency(chaos.uniform(0.05, 0.3), rate=0.2),
            chaos.Error(ConnectionError, rate=0.1, schedule=[(10, 20)]),
            seed=42,
        )

        @rs.Pipeline(rs.Retry(on=ConnectionError, deadline=3.0), rs.Timeout(1.0), faults)
        async def fetch(url: str) -> bytes: ...

        with chaos.enabled():
            await fetch("https://example.com")
    """

    __slots__ = ("_clock", "_core", "_key", "_switch", "faults", "seed")

    def __init__(
        self,
        *faults: Fault,
        latency: float | Callable[..., float] | None = None,
        latency_rate: float | None = None,
        error: type[BaseException] | BaseException | Callable[[], BaseException] | None = None,
        error_rate: float | None = None,
        result: Any = _MISSING,
        result_rate: float | None = None,
        hang_rate: float | None = None,
        hang_block: float = 10.0,
        schedule: Schedule | None = None,
        key: Callable[..., Any] | None = None,
        when: Callable[..., bool] | None = None,
        seed: int | None = None,
        enabled: bool | None = None,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        specs: list[Fault] = []
        for fault in faults:
            if not isinstance(fault, _POLICY_FAULTS):
                raise ConfigurationError(
                    f"Faults injects Latency, Error, Result and Hang faults, got {fault!r} "
                    "(HTTP faults go to chaos.FaultyTransport or chaos.FaultMiddleware)"
                )
            specs.append(fault)
        if latency is not None:
            specs.append(Latency(latency, rate=_rate("latency_rate", latency_rate)))
        elif latency_rate is not None:
            raise ConfigurationError("latency_rate needs latency= (seconds or a distribution)")
        if error is not None or error_rate is not None:
            specs.append(
                Error(
                    InjectedFault if error is None else error, rate=_rate("error_rate", error_rate)
                )
            )
        if result is not _MISSING:
            specs.append(Result(result, rate=_rate("result_rate", result_rate)))
        elif result_rate is not None:
            raise ConfigurationError("result_rate needs result= (the value to return)")
        hang_block = check_number("hang_block", hang_block)
        if hang_rate is not None:
            specs.append(Hang(rate=check_probability("hang_rate", hang_rate), block=hang_block))
        if not specs:
            raise ConfigurationError(
                "Faults needs at least one fault: e.g. Faults(error_rate=0.1) or "
                "Faults(chaos.Latency(0.2, rate=0.5))"
            )
        if seed is None:
            seed = new_seed()
        self.seed: int = check_int("seed", seed, minimum=-(2**63))
        #: The faults this policy injects, in the order they are tried.
        self.faults: tuple[Fault, ...] = tuple(specs)
        self._clock = check_clock("clock", clock)
        self._switch = switch_for(enabled)
        # events carry the call's key, as the transports' carry theirs
        self._key = check_key_function("key", key)
        self._core = FaultCore(
            [(spec, None) for spec in specs],
            seed=self.seed,
            epoch=self._clock.monotonic(),
            key=key,
            schedule=normalize_schedule("schedule", schedule),
            when=check_key_function("when", when, gives="its answer"),
        )

    # -- the shells: the same plan, carried out with and without await ------------------

    def _plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan | None:
        plan = self._core.decide(self._clock.monotonic(), args, kwargs)
        if plan is not None and self._observed:
            emit_plan(self, plan, None if self._key is None else self._key(*args, **kwargs))
        return plan

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)``, injecting faults when chaos is enabled."""
        refuse_async(self, fn)
        if not self._switch():
            return fn(*args, **kwargs)
        plan = self._plan(args, kwargs)
        if plan is None:
            return fn(*args, **kwargs)
        if plan.delay:
            self._clock.sleep(plan.delay)
        fault = plan.fault
        if fault is None:
            return fn(*args, **kwargs)
        if isinstance(fault, Hang):
            self._clock.sleep(fault.block)
            raise InjectedFault(f"injected hang: no answer after {fault.block:g}s")
        return self._end(fault)  # type: ignore[no-any-return]

    def _defer(self) -> bool:
        """Whether a pipeline may leave this layer out for now (see ``_deferred``).

        True while nothing can switch it on yet: it follows the global switch and
        fault injection was never switched on in this process.
        """
        return self._switch is chaos_active and not armed()

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        """The decorator body: with chaos off, one switch check around the call."""
        switch = self._switch
        if is_async:
            call_async = self.call_async

            async def faults_async(*args: Any, **kwargs: Any) -> Any:
                if not switch():
                    return await fn(*args, **kwargs)
                return await call_async(fn, *args, **kwargs)

            return faults_async
        call = self.call

        def faults_sync(*args: Any, **kwargs: Any) -> Any:
            if not switch():
                return fn(*args, **kwargs)
            return call(fn, *args, **kwargs)

        return faults_sync

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``await fn(*args, **kwargs)``, injecting faults when chaos is enabled."""
        refuse_generator_async(fn)
        if not self._switch():
            return await fn(*args, **kwargs)
        plan = self._plan(args, kwargs)
        if plan is None:
            return await fn(*args, **kwargs)
        if plan.delay:
            await sleep_async(self._clock, plan.delay)
        fault = plan.fault
        if fault is None:
            return await fn(*args, **kwargs)
        if isinstance(fault, Hang):
            await hang_async(self._clock)
        return self._end(fault)  # type: ignore[no-any-return]

    @staticmethod
    def _end(fault: Fault) -> Any:
        if isinstance(fault, Error):
            raise fault.build()
        assert isinstance(fault, Result)
        return fault.value

    # -- inspection ---------------------------------------------------------------------

    def statistics(self) -> FaultStatistics:
        """Calls seen while enabled and faults injected per kind.

        Example::

            assert faults.statistics().injected.get("error", 0) <= faults.statistics().calls
        """
        return statistics_of(self._core)

    def reset(self) -> None:
        """Replay from the start: schedules restart now, RNGs restart from the seed.

        Example::

            faults.reset()      # the next calls see the same faults as the first ones did
        """
        self._core.reset(self._clock.monotonic())

    def __repr__(self) -> str:
        inner = ", ".join(repr(f) for f in self.faults)
        return f"Faults({inner}, seed={self.seed})"
