"""Static typing of policy arguments, checked by ``mypy --strict`` (``make typecheck``).

Nothing here runs under pytest. ``warn_unused_ignores`` (part of ``--strict``) makes
each ``# type: ignore[...]`` below an assertion that the checker reports that error.
"""

from __future__ import annotations

from typing import Any

import resilience as rs
from resilience.testing import FaultsFixture

# Exception collections kept in a constant: a checker infers ``list[type[OSError]]``
# and ``set[type[Exception]]`` here, which must be accepted like the literals.
TRANSIENT = [ConnectionError, TimeoutError]
IGNORED = {KeyError, LookupError}
FROZEN = frozenset(TRANSIENT)


def exception_collections() -> list[object]:
    return [
        rs.Retry(on=TRANSIENT),
        rs.Retry(on=tuple(TRANSIENT)),
        rs.Retry(on=FROZEN),
        rs.Fallback(b"", on=TRANSIENT),
        rs.CircuitBreaker(record=TRANSIENT, exclude=IGNORED),
        rs.Retry(on=lambda exc: isinstance(exc, OSError)),
    ]


def faults_arguments(faults: FaultsFixture) -> None:
    faults(error_rate=1.0, error=ConnectionError)
    faults(error=lambda: rs.RateLimited(retry_after=1.0), error_rate=0.5)
    faults.transport(enabled=True)
    faults(eror_rate=1.0)  # type: ignore[call-arg]
    faults(error_rate="always")  # type: ignore[arg-type]
    faults.transport(staus_rate=1.0)  # type: ignore[call-arg]
    rs.Faults(error="boom")  # type: ignore[arg-type]


def layers_of_a_pipeline() -> rs.Pipeline:
    """The collection type docs/fallback.md gives for layers that include a Fallback."""
    cached = rs.Fallback(b"")
    layers: list[rs.Policy | rs.Fallback[Any]] = [cached, rs.Timeout(1.0)]
    return rs.Pipeline(*layers)
