"""Release notifications: a pub/sub listener per distributed bulkhead.

A release that frees a slot while somebody waits publishes the key's id on the
bulkhead's channel (``bulkhead_release.lua``). Each process with local waiters runs one
listener thread subscribed to that channel and wakes the first local waiter of the
key, which then retries at once. So waiters do not poll: they sleep until a release
notification, the earliest lease expiry (a crashed holder), or their deadline.

The listener subscribes when the first waiter appears and leaves a second after the
last one is gone. Whenever it (re)subscribes it wakes every first waiter once, because
releases published before the subscription was live were not seen.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Notifier"]

logger = logging.getLogger("resilience")

# Seconds between checks for "nobody waits any more", and the linger before leaving.
_POLL = 0.25
_LINGER = 1.0
# Reconnect backoff after a Redis failure (doubling).
_MIN_BACKOFF = 0.05
_MAX_BACKOFF = 1.0


class Notifier:
    """Listens on ``channel`` while ``wanted()`` is true; calls ``on_message(data)``.

    ``on_subscribed()`` runs every time the subscription becomes live (first start and
    every reconnect).

    Example::

        notifier = Notifier(client, "rs:bulkhead:dl:released", wake_key, wake_all, has_waiters)
        notifier.ensure_running()
    """

    def __init__(
        self,
        client: Any,
        channel: str,
        on_message: Callable[[str], None],
        on_subscribed: Callable[[], None],
        wanted: Callable[[], bool],
    ) -> None:
        self._client = client
        self.channel = channel
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._wanted = wanted
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Times the subscription went live (1 + reconnects).
        self.subscriptions = 0

    def ensure_running(self) -> None:
        """Start the listener thread unless it runs."""
        with self._lock:
            thread = self._thread
            if thread is not None and thread.is_alive():
                return
            self._stop.clear()
            thread = threading.Thread(
                target=self._run, name=f"resilience-bulkhead-notify:{self.channel}", daemon=True
            )
            self._thread = thread
            thread.start()

    def close(self) -> None:
        """Stop the listener (it exits within a fraction of a second)."""
        self._stop.set()

    def _run(self) -> None:
        backoff = _MIN_BACKOFF
        idle = 0.0
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=_POLL)
                    if message is None:
                        if self._wanted():
                            idle = 0.0
                        else:
                            idle += _POLL
                            if idle >= _LINGER and self._leave():
                                return
                        continue
                    kind = message.get("type")
                    if kind == "subscribe":
                        backoff = _MIN_BACKOFF
                        self.subscriptions += 1
                        self._on_subscribed()
                    elif kind == "message":
                        data = message.get("data")
                        if isinstance(data, bytes):
                            data = data.decode("utf-8", "replace")
                        self._on_message(str(data))
            except Exception as exc:
                logger.debug("resilience: bulkhead notifier lost Redis: %r", exc)
                if not self._wanted() and self._leave():
                    return
                # Waiters fall back to their timers meanwhile; wake them to re-check.
                self._on_subscribed()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass

    def _leave(self) -> bool:
        """Exit if still nobody waits (checked under the lock ensure_running takes)."""
        with self._lock:
            if self._wanted():
                return False
            if self._thread is threading.current_thread():
                self._thread = None
            return True
