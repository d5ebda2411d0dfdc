"""ASGI type aliases, so that the middleware needs no framework installed, and the one
fact about messages every middleware here needs: when a response is complete."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send", "ends_response"]

Scope = MutableMapping[str, Any]
"""The connection scope an ASGI server passes to the app (``scope["type"]``,
``scope["path"]``, ...). Example: ``def key(scope: Scope) -> str | None: ...``"""
Message = MutableMapping[str, Any]
"""One ASGI event, received or sent. Example: ``{"type": "http.response.body", "body":
b""}``"""
Receive = Callable[[], Awaitable[Message]]
"""The awaitable that returns the next incoming message. Example: ``message = await
receive()``"""
Send = Callable[[Message], Awaitable[None]]
"""The awaitable that sends one message to the client. Example: ``await send(message)``"""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application, which every middleware here is and wraps. Example: ``async def
app(scope: Scope, receive: Receive, send: Send) -> None: ...``"""


#: A scope key TimeoutMiddleware sets when its deadline cut the request, for the
#: middlewares outside it (a cut sync endpoint returns normally, its answer dropped).
TIMED_OUT = "resilience.timed_out"

#: A scope key TimeoutMiddleware sets to ``(deadline, seconds)`` of the request: a
#: middleware inside it that is refused at that deadline raises ``Timeout`` for it to
#: answer (504), as an inner policy clamped to the deadline does.
DEADLINE = "resilience.deadline"

#: Seconds before a request's deadline within which a 5xx answer or a ``Timeout`` is
#: taken for the deadline's own: an inner policy clamped to it ends on its own timer,
#: which may fire a moment before TimeoutMiddleware's (see ``overrun`` there).
DEADLINE_ECHO = 0.02


def ends_response(message: Message) -> bool:
    """Whether sending ``message`` completes the response: the last body chunk, or a
    file sent whole (``http.response.pathsend``, or a last ``http.response.zerocopysend``).

    Example: ``ends_response({"type": "http.response.body", "body": b"ok"})`` is ``True``.
    """
    kind = message["type"]
    if kind == "http.response.body" or kind == "http.response.zerocopysend":
        return not message.get("more_body", False)
    return bool(kind == "http.response.pathsend")
