"""The objects behind the ``faults`` and ``fault_proxy`` fixtures of the pytest plugin."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ..chaos import Fault, Faults
from ._fault_proxy import FaultProxy

if TYPE_CHECKING:
    from ..chaos import FaultyTransport

__all__ = ["FaultProxyFactory", "FaultsFixture", "seed_for"]

P = ParamSpec("P")
R = TypeVar("R")


def _arguments_of(
    target: Callable[[], Callable[P, R]],
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """Type a method that passes its arguments on as taking ``target()``'s: a type
    checker then catches a misspelt keyword at the call, not when the test runs.
    ``target`` is never called (it names a class that is imported lazily)."""

    def typed(method: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        return method

    return typed


def seed_for(nodeid: str, option: str | None) -> int:
    """The chaos seed of a test: ``option`` if given, else stable per test id.

    ``option`` is the ``--chaos-seed`` value: an integer, or ``"random"`` for a fresh
    seed (printed when the test fails, so the run can be replayed).
    """
    if option is None or option.strip() == "":
        return zlib.crc32(nodeid.encode())
    if option.strip().lower() == "random":
        from .._chaos._core import new_seed

        return new_seed()
    try:
        return int(option)
    except ValueError:
        from ..errors import ConfigurationError

        raise ConfigurationError(
            f"the chaos seed must be an integer or 'random', got {option!r} "
            "(--chaos-seed or RESILIENCE_CHAOS_SEED)"
        ) from None


class FaultsFixture:
    """The ``faults`` fixture: builds seeded injectors; chaos is enabled for the test.

    ``faults(...)`` takes the arguments of :class:`resilience.Faults` and fills in
    ``seed=`` from the test's seed (the n-th injector of a test gets ``seed + n``), so
    a failing test replays with ``pytest --chaos-seed=<seed>``; the seed is printed in
    the failure report. ``faults.transport(...)`` does the same for
    :class:`resilience.chaos.FaultyTransport`.

    Example::

        def test_fallback_answers(faults, fake_clock):
            injector = faults(error_rate=1.0, clock=fake_clock)
            lookup = rs.Pipeline(rs.Fallback("cached", on=rs.InjectedFault), injector)(real)
            assert lookup("k") == "cached"
    """

    def __init__(self, seed: int) -> None:
        from .._validate import check_int

        #: The test's chaos seed (``--chaos-seed`` replays it).
        self.seed: int = check_int("seed", seed, minimum=-(2**63))
        self._built = 0
        #: Every injector built by this fixture, in order.
        self.built: list[Any] = []

    def _next_seed(self) -> int:
        seed = self.seed + self._built
        self._built += 1
        return seed

    @_arguments_of(lambda: Faults)
    def __call__(self, *faults: Fault, **kwargs: Any) -> Faults:
        """A :class:`resilience.Faults` seeded from the test's seed."""
        kwargs.setdefault("seed", self._next_seed())
        injector = Faults(*faults, **kwargs)
        self.built.append(injector)
        return injector

    @_arguments_of(lambda: FaultyTransport)
    def transport(self, inner: Any = None, **kwargs: Any) -> FaultyTransport:
        """A :class:`resilience.chaos.FaultyTransport` seeded from the test's seed."""
        from ..chaos import FaultyTransport

        kwargs.setdefault("seed", self._next_seed())
        transport = FaultyTransport(inner, **kwargs)
        self.built.append(transport)
        return transport

    def __repr__(self) -> str:
        return f"<faults fixture seed={self.seed}>"


class FaultProxyFactory:
    """The ``fault_proxy`` fixture: ``fault_proxy(port)`` starts a :class:`FaultProxy`.

    Every proxy it started is stopped at the end of the test.

    Example::

        def test_breaker_sees_resets(redis_server, fault_proxy):
            proxy = fault_proxy(redis_server.port)
            proxy.reset_new = True
    """

    def __init__(self) -> None:
        self.proxies: list[FaultProxy] = []

    def __call__(
        self, target_port: int, target_host: str = "127.0.0.1", **kwargs: Any
    ) -> FaultProxy:
        """Start a proxy to ``target_host:target_port`` (see :class:`FaultProxy`)."""
        proxy = FaultProxy(target_port, target_host, **kwargs).start()
        self.proxies.append(proxy)
        return proxy

    def stop_all(self) -> None:
        """Stop every proxy started here."""
        while self.proxies:
            self.proxies.pop().stop()
