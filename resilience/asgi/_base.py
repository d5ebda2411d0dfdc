"""What the middlewares share: a name, listeners, rule resolution."""

from __future__ import annotations

from .._events import GLOBAL_LISTENERS, Event, Listener, emit

__all__ = ["Observed"]


class Observed:
    """A name and event listeners, like a policy's (``add_listener``/``remove_listener``).

    Example::

        middleware.add_listener(lambda event: print(event))
    """

    __slots__ = ()

    name: str
    _listeners: list[Listener]

    def add_listener(self, listener: Listener) -> Listener:
        """Receive this middleware's events; returns ``listener``.

        Example: ``middleware.add_listener(print)``
        """
        self._listeners.append(listener)
        return listener

    def remove_listener(self, listener: Listener) -> None:
        """Stop sending this middleware's events to ``listener``."""
        try:
            self._listeners.remove(listener)
        except ValueError:
            pass

    @property
    def _observed(self) -> bool:
        return bool(self._listeners or GLOBAL_LISTENERS)

    def _emit(self, event: Event) -> None:
        emit(self._listeners, event)
