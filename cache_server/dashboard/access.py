"""Who may see a page: the API's read check (:func:`cache_server.api.auth.requires`), with the
token also taken from ``?token=`` or a cookie, since a browser cannot send a header.

A token comes from, in order: the ``Authorization: Bearer`` header; ``?token=``, which, once
checked, is moved into an HttpOnly cookie by a redirect to the same page without it (so it
leaves the address bar and history); the cookie. A refusal is an HTML page saying how to pass
a token, not the API's JSON, and clears a cookie that no longer works. So is a page's bad
address (a filter or a row out of range): an HTML page naming what was wrong (:class:`PageRoute`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials

from cache_server.api.auth import Credentials, requires
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.api.errors import validation_detail
from cache_server.api.problems import UNPROCESSABLE
from cache_server.dashboard.templating import page, root_path
from cache_server.models import TokenRow
from tunecache.errors import error_message

COOKIE = "tunecache_token"
HOW = (
    "Open the page once with ?token=<token> (it is then kept in a cookie), "
    "or send 'Authorization: Bearer <token>'; `tunecache token create` makes one."
)
_check_read = requires("read")


class PageError(Exception):
    """A page that cannot be shown: rendered as an HTML error page with ``status_code``."""

    def __init__(self, status_code: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = headers or {}


class PageRoute(APIRoute):
    """A page's route: a query or path it cannot take is a 422 page in HTML, naming it (the
    API's JSON answer reached a browser as a wall of text)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = [{**e, "msg": error_message(e)} for e in exc.errors()]  # as the API
                why = validation_detail(errors)
                raise PageError(UNPROCESSABLE, why) from exc

        return route


class _TokenAccepted(Exception):
    """``?token=`` was good: redirect to ``location`` (the page without it), setting the cookie."""

    def __init__(self, location: str, token: str):
        super().__init__(location)
        self.location = location
        self.token = token


async def reader(
    request: Request,
    credentials: Credentials,
    session: SessionDep,
    settings: SettingsDep,
    token: Annotated[str | None, Query(max_length=512)] = None,
) -> TokenRow | None:
    """The caller's token row (``None`` when reads are open and none was given).

    Raises:
        PageError: 401 as :func:`~cache_server.api.auth.requires` decides, with how to pass one.
    """
    given = token or request.cookies.get(COOKIE)
    if credentials is None and given:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=given)
    try:
        row = await _check_read(credentials, session, settings, request)
    except HTTPException as exc:
        raise PageError(exc.status_code, f"{exc.detail}. {HOW}", dict(exc.headers or {})) from exc
    if token and request.method == "GET" and "authorization" not in request.headers:
        rest = request.url.remove_query_params("token")
        raise _TokenAccepted(rest.path + (f"?{rest.query}" if rest.query else ""), token)
    return row


Reader = Annotated[TokenRow | None, Depends(reader)]


def install(app: FastAPI) -> None:
    """Registers the HTML answers to :class:`PageError` and the ``?token=`` redirect."""

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> HTMLResponse:
        response = page(
            request,
            "error.html",
            {"status_code": exc.status_code, "message": exc.message},
            status_code=exc.status_code,
        )
        response.headers.update(exc.headers)
        if exc.status_code == status.HTTP_401_UNAUTHORIZED and COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path=root_path(request) + "/")
        return response

    @app.exception_handler(_TokenAccepted)
    async def token_accepted(request: Request, exc: _TokenAccepted) -> Response:
        response = RedirectResponse(exc.location, status_code=status.HTTP_303_SEE_OTHER)
        response.set_cookie(
            COOKIE,
            exc.token,
            path=root_path(request) + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response
