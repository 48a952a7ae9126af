"""Every answer says it comes from tunecache (:data:`tunecache.http.IDENTITY_HEADER`), and none
sends a client to a host the request named.

A client that gets a 404 without it knows it is talking to something else (a wrong URL, a
proxy's error page, another web server) instead of taking it for a miss. Starlette's redirects
(``/v1/records/`` to ``/v1/records``, ``/ui/static`` to ``/ui/static/``) were absolute, built
from the request's ``Host`` header: ``Host: evil.example`` got ``Location:
http://evil.example/…``, which a shared cache in front could hand to everyone. They are relative.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tunecache import __version__
from tunecache.http import IDENTITY_HEADER

IDENTITY = (IDENTITY_HEADER.lower().encode(), f"tunecache/{__version__}".encode())
# No answer is read as another type than it says (a JSON answer echoing an uploader's text
# taken for HTML by a browser that sniffs).
NOSNIFF = (b"x-content-type-options", b"nosniff")


def relative(location: bytes) -> bytes:
    """``location`` without its scheme and host: ``http://h/v1/records?x`` -> ``/v1/records?x``
    (no redirect of this server leads off it)."""
    parts = urlsplit(location.decode("latin-1"))
    if not parts.scheme and not parts.netloc:
        return location
    path = "/" + parts.path.lstrip("/")  # never "//host": a relative URL naming a host
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


class Identify:
    """Pure ASGI middleware: adds the identity header (and ``nosniff``) to every HTTP answer,
    and makes its ``Location`` relative."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def identified(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, relative(v) if k == b"location" else v)
                           for k, v in message.get("headers", [])]  # fmt: skip
                if not any(k == NOSNIFF[0] for k, _ in headers):  # a page sets its own
                    headers.append(NOSNIFF)
                message = {**message, "headers": [*headers, IDENTITY]}
            await send(message)

        await self.app(scope, receive, identified)
