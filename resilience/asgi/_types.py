"""ASGI type aliases, so that the middleware needs no framework installed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]

#: The connection scope an ASGI server passes to the app (``scope["type"]``,
#: ``scope["path"]``, ...). Example: ``def key(scope: Scope) -> str | None: ...``
Scope = MutableMapping[str, Any]
#: One ASGI event, received or sent. Example: ``{"type": "http.response.body", "body": b""}``
Message = MutableMapping[str, Any]
#: The awaitable that returns the next incoming message. Example: ``message = await receive()``
Receive = Callable[[], Awaitable[Message]]
#: The awaitable that sends one message to the client. Example: ``await send(message)``
Send = Callable[[Message], Awaitable[None]]
#: An ASGI 3 application, which every middleware here is and wraps.
#: Example: ``async def app(scope: Scope, receive: Receive, send: Send) -> None: ...``
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
