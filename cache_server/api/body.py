"""JSON bodies parsed off the event loop, within the server's depth and element limits.

Every API router is an ``APIRouter(route_class=JsonRoute)``: FastAPI reads a route's JSON body
through ``Request.json()``, which :class:`JsonRequest` answers with
:func:`cache_server.api.limits.parse_json_off_loop` (FastAPI's documented way to change how a
body is read: a custom request and route class). A body over a limit is a 400 that says which
(:mod:`cache_server.api.errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from cache_server.api.limits import JsonLimits, parse_json_off_loop


class JsonRequest(Request):
    """A request whose JSON body is parsed in a worker thread, within the app's limits."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            limits: JsonLimits = self.app.state.json_limits
            self._json = await parse_json_off_loop(await self.body(), limits)
        return self._json


class JsonRoute(APIRoute):
    """A route that reads its body as a :class:`JsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route
