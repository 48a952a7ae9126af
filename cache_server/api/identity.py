"""Every answer says it comes from tunecache (:data:`tunecache.http.IDENTITY_HEADER`).

A client that gets a 404 without it knows it is talking to something else (a wrong URL, a
proxy's error page, another web server) instead of taking it for a miss.
"""

from __future__ import annotations

from typing import Any

from tunecache import __version__
from tunecache.http import IDENTITY_HEADER

IDENTITY = (IDENTITY_HEADER.lower().encode(), f"tunecache/{__version__}".encode())


class Identify:
    """Pure ASGI middleware: adds the identity header to every HTTP answer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def identified(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), IDENTITY]}
            await send(message)

        await self.app(scope, receive, identified)
