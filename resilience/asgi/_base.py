"""What the middlewares share: a name and listeners, like a policy's."""

from __future__ import annotations

from .._events import Observable

__all__ = ["Observed"]


class Observed(Observable):
    """The middlewares' base: :class:`resilience._events.Observable` with a repr that
    names the middleware and the app it wraps."""

    __slots__ = ()

    def __repr__(self) -> str:
        app = getattr(self, "app", None)
        inner = getattr(app, "__qualname__", None) or type(app).__name__
        details = "".join(f" {part}" for part in self._configured())
        return f"<{type(self).__name__} {self.name!r} app={inner}{details}>"

    def _configured(self) -> list[str]:
        """What the repr shows of the middleware's configuration."""
        return []
