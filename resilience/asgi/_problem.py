"""``application/problem+json`` refusals (RFC 9457), rendered once and sent raw.

The problem types are those registered by the rate-limit headers draft:
``quota-exceeded`` (429) and ``temporary-reduced-capacity`` (503); timeouts use
``about:blank`` with status 504.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ._types import Receive, Scope, Send

__all__ = [
    "QUOTA_EXCEEDED",
    "REDUCED_CAPACITY",
    "Problem",
]

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
"""The ``type`` of a 429 problem body (RFC 9457, IANA HTTP Problem Types). Example:
``problem["type"] == QUOTA_EXCEEDED``"""
REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
"""The ``type`` of a 503 problem body (load shed, or the limiter's backend is down).
Example: ``problem["type"] == REDUCED_CAPACITY``"""

Header = tuple[bytes, bytes]


class Problem:
    """A precomputed problem response: status, JSON body and its fixed headers.

    Example::

        problem = Problem(429, QUOTA_EXCEEDED, "Request cannot be satisfied as assigned "
                          "quota has been exceeded", extra={"violated-policies": ["default"]})
        await problem.send(send, [(b"retry-after", b"3")])
    """

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        *,
        detail: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        document: dict[str, Any] = {"type": type, "title": title, "status": status}
        if detail:
            document["detail"] = detail
        if extra:
            document.update(extra)
        self.status = status
        self.body = json.dumps(document, separators=(",", ":")).encode()
        self.headers: list[Header] = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(self.body)).encode()),
            (b"cache-control", b"no-store"),
        ]

    async def send(self, send: Send, headers: Iterable[Header] = ()) -> None:
        """Send the whole response (start and body) with extra ``headers``."""
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [*self.headers, *headers],
            }
        )
        await send({"type": "http.response.body", "body": self.body, "more_body": False})

    async def send_websocket(
        self,
        send: Send,
        scope: Scope,
        code: int,
        headers: Iterable[Header] = (),
        receive: Receive | None = None,
    ) -> None:
        """Refuse a websocket handshake: an HTTP response when the server supports the
        ``websocket.http.response`` extension, else the connection is accepted and
        closed with ``code`` (a close before the accept reaches the client as an HTTP
        403, a refusal for good; ``1013`` says "try again later"; a server that allows
        no such code, daphne, gets ``4000`` + the status instead). ``receive`` takes the
        ``websocket.connect`` message first, as an app answering the handshake does."""
        extensions = scope.get("extensions") or {}
        if "websocket.http.response" in extensions:
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": self.status,
                    "headers": [*self.headers, *headers],
                }
            )
            await send({"type": "websocket.http.response.body", "body": self.body})
            return
        if receive is not None and (await receive())["type"] != "websocket.connect":
            return  # the client left before its handshake was answered
        await send({"type": "websocket.accept"})
        try:
            await send({"type": "websocket.close", "code": code})
        except Exception:
            if code == 1000 or 3000 <= code <= 4999:
                raise
            # daphne (autobahn) lets a server close only with 1000 or 3000-4999 and
            # raises, having sent nothing, on 1013 and 1011: close with the private-use
            # code 4000 + the HTTP status (4429, 4503), which says the same.
            await send({"type": "websocket.close", "code": 4000 + self.status})
