"""What the middlewares share: a name and listeners, like a policy's."""

from __future__ import annotations

from .._events import Observable

__all__ = ["Observed"]

#: The middlewares' base: :class:`resilience._events.Observable` under its ASGI name.
Observed = Observable
