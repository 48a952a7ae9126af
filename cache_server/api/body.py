"""JSON bodies parsed off the event loop, within the server's depth and element limits.

Every API router is an ``APIRouter(route_class=JsonRoute)``: FastAPI reads a route's JSON body
through ``Request.json()``, which :class:`JsonRequest` answers with
:func:`cache_server.api.json_bounds.parse_json_off_loop` (FastAPI's documented way to change how a
body is read: a custom request and route class). A body over a limit is a 400 that says which
(:mod:`cache_server.api.errors`).

A body the route would not read as JSON is refused first, with 415 naming why: a
``Content-Type`` that is not JSON (``text/plain``, a form) or none at all (FastAPI reads a body as
JSON only when it says it is), or a ``Content-Encoding`` the server does not decode (it decodes
none: send the body as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response, status
from fastapi.routing import APIRoute

from cache_server.api.json_bounds import JsonLimits, parse_json_off_loop


class JsonRequest(Request):
    """A request whose JSON body is parsed in a worker thread, within the app's limits."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            limits: JsonLimits = self.app.state.json_limits
            self._json = await parse_json_off_loop(await self.body(), limits)
        return self._json


def is_json(content_type: str) -> bool:
    """Whether FastAPI reads a body of ``content_type`` as JSON: ``application/json`` or
    ``application/<anything>+json``, whatever its parameters."""
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def unsupported(request: Request) -> str | None:
    """Why a body this request sends cannot be read as JSON (a 415), or ``None``."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return (f"the body's Content-Encoding {encoding!r} is not one the server decodes: "
                "send it uncompressed")  # fmt: skip
    content_type = request.headers.get("content-type", "")
    if not content_type.strip():
        return "the body has no Content-Type: send application/json"
    if not is_json(content_type):
        return f"the body's Content-Type {content_type!r} is not JSON: send application/json"
    return None


class JsonRoute(APIRoute):
    """A route that reads its body as a :class:`JsonRequest`, and only a body that is JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route(request: Request) -> Response:
            json_request = JsonRequest(request.scope, request.receive)
            if takes_body and await json_request.body() and (why := unsupported(request)):
                raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, why,
                                    headers={"Accept-Encoding": "identity"})  # fmt: skip
            return await handler(json_request)

        return route
