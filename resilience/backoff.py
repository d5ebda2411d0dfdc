"""Pure backoff schedules: how long to wait before each retry.

A schedule is an iterable of delays in seconds: ``iter(schedule)`` starts a fresh
sequence whose first value is the wait before the second attempt. Schedules never
sleep and never read a clock; :class:`resilience.Retry` does the waiting. Jittered
schedules take ``seed=`` (an int or a :class:`random.Random`) for reproducible runs.

The formulas, with ``n`` = 0 for the first retry (from the AWS Architecture Blog's
"Exponential Backoff And Jitter")::

    constant(d)                 d
    linear(base, step, cap)     min(cap, base + step·n)
    exponential(base, cap, m)   min(cap, base·mⁿ)
    full_jitter(base, cap)      uniform(0, min(cap, base·2ⁿ))
    equal_jitter(base, cap)     t/2 + uniform(0, t/2),   t = min(cap, base·2ⁿ)
    decorrelated_jitter(b, cap) sₙ = min(cap, uniform(b, 3·sₙ₋₁)),   s₋₁ = b

Full jitter spreads retries the most and is the default of :class:`Retry`.

Example::

    >>> import itertools
    >>> from resilience import backoff
    >>> list(itertools.islice(backoff.exponential(0.1, cap=1.0), 5))
    [0.1, 0.2, 0.4, 0.8, 1.0]
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ._validate import check_number
from .errors import ConfigurationError

__all__ = [
    "Backoff",
    "constant",
    "decorrelated_jitter",
    "equal_jitter",
    "exponential",
    "full_jitter",
    "linear",
]

Seed = int | random.Random | None


def _rng(seed: Seed) -> random.Random:
    if isinstance(seed, random.Random):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigurationError(f"seed must be an int, a random.Random or None, got {seed!r}")
    return random.Random(seed)


@dataclass(frozen=True)
class Backoff(Iterable[float]):
    """Base of the schedules: an iterable of delays, each call to ``iter`` starting over.

    Subclass it and implement ``__iter__`` for a custom schedule, or pass a list or a
    tuple of floats (any iterable each call can iterate afresh; not a generator) as
    ``Retry(backoff=...)``.

    Example::

        class Fibonacci(Backoff):
            def __iter__(self):
                a, b = 0.1, 0.1
                while True:
                    yield a
                    a, b = b, a + b
    """

    def __iter__(self) -> Iterator[float]:
        raise NotImplementedError


def _cap(name: str, cap: float | None) -> float:
    if cap is None:
        return float("inf")
    return float(check_number(name, cap, minimum=0.0))


@dataclass(frozen=True)
class _Constant(Backoff):
    delay: float

    def __iter__(self) -> Iterator[float]:
        delay = self.delay
        while True:
            yield delay


@dataclass(frozen=True)
class _Linear(Backoff):
    base: float
    step: float
    cap: float

    def __iter__(self) -> Iterator[float]:
        n = 0
        while True:
            yield min(self.cap, self.base + self.step * n)
            n += 1


@dataclass(frozen=True)
class _Exponential(Backoff):
    base: float
    cap: float
    multiplier: float

    def __iter__(self) -> Iterator[float]:
        delay = self.base
        while True:
            if delay >= self.cap:
                while True:
                    yield self.cap
            yield delay
            delay *= self.multiplier


@dataclass(frozen=True)
class _FullJitter(Backoff):
    base: float
    cap: float
    rng: random.Random = field(compare=False, repr=False)

    def __iter__(self) -> Iterator[float]:
        uniform = self.rng.uniform
        for ceiling in _Exponential(self.base, self.cap, 2.0):
            yield uniform(0.0, ceiling)


@dataclass(frozen=True)
class _EqualJitter(Backoff):
    base: float
    cap: float
    rng: random.Random = field(compare=False, repr=False)

    def __iter__(self) -> Iterator[float]:
        uniform = self.rng.uniform
        for ceiling in _Exponential(self.base, self.cap, 2.0):
            half = ceiling / 2
            yield half + uniform(0.0, half)


@dataclass(frozen=True)
class _DecorrelatedJitter(Backoff):
    base: float
    cap: float
    rng: random.Random = field(compare=False, repr=False)

    def __iter__(self) -> Iterator[float]:
        uniform = self.rng.uniform
        previous = self.base
        while True:
            previous = min(self.cap, uniform(self.base, previous * 3))
            yield previous


def constant(delay: float) -> Backoff:
    """Always wait ``delay`` seconds.

    Example: ``rs.Retry(on=OSError, backoff=backoff.constant(0.5))``
    """
    return _Constant(check_number("delay", delay))


def linear(base: float, step: float, cap: float | None = None) -> Backoff:
    """Wait ``min(cap, base + step·n)`` before retry ``n`` (0-based).

    Example: ``backoff.linear(0.1, 0.1, cap=1.0)`` gives 0.1, 0.2, 0.3, ...
    """
    return _Linear(check_number("base", base), check_number("step", step), _cap("cap", cap))


def exponential(base: float = 0.1, cap: float | None = 30.0, multiplier: float = 2.0) -> Backoff:
    """Wait ``min(cap, base·multiplierⁿ)`` before retry ``n`` (0-based), no jitter.

    Example: ``backoff.exponential(0.1, cap=1.0)`` gives 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, ...
    """
    return _Exponential(
        check_number("base", base, strict=True),
        _cap("cap", cap),
        check_number("multiplier", multiplier, minimum=1.0),
    )


def full_jitter(base: float = 0.1, cap: float | None = 30.0, *, seed: Seed = None) -> Backoff:
    """Wait ``uniform(0, min(cap, base·2ⁿ))``: the most spread-out schedule (AWS).

    Example: ``rs.Retry(on=OSError, backoff=backoff.full_jitter(0.05, cap=2.0, seed=7))``
    """
    return _FullJitter(check_number("base", base, strict=True), _cap("cap", cap), _rng(seed))


def equal_jitter(base: float = 0.1, cap: float | None = 30.0, *, seed: Seed = None) -> Backoff:
    """Wait ``t/2 + uniform(0, t/2)`` with ``t = min(cap, base·2ⁿ)``: never less than half.

    Example: ``backoff.equal_jitter(0.1, cap=5.0)``
    """
    return _EqualJitter(check_number("base", base, strict=True), _cap("cap", cap), _rng(seed))


def decorrelated_jitter(
    base: float = 0.1, cap: float | None = 30.0, *, seed: Seed = None
) -> Backoff:
    """Wait ``sₙ = min(cap, uniform(base, 3·sₙ₋₁))`` with ``s₋₁ = base`` (AWS).

    Example: ``backoff.decorrelated_jitter(0.1, cap=10.0)``
    """
    return _DecorrelatedJitter(
        check_number("base", base, strict=True), _cap("cap", cap), _rng(seed)
    )
