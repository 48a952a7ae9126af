"""Error answers: every failure a client causes is a 4xx with a reason it can act on, all in one
shape (:class:`cache_server.api.problems.ErrorBody`).

- a validation error is a 422 whose ``detail`` names the first fields and what is wrong with
  them, and whose ``errors`` lists every field (without the input: it may be huge, or something
  no JSON encoder writes, such as NaN or a lone surrogate);
- FastAPI's generic "There was an error parsing the body" says what it was;
- :class:`tunecache.errors.InvalidInput` raised anywhere in a request is a 422;
- anything else that escapes a route is a 500 in the same shape (a bug; it is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from cache_server.api.limits import TooComplex
from cache_server.api.openapi import allowed_methods
from cache_server.api.problems import body
from cache_server.queries import BucketFull
from tunecache.errors import InvalidInput, error_message, one_line

logger = logging.getLogger(__name__)
SHOWN = 3  # fields named in a validation error's detail


def _where(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ())) or "request"


def validation_detail(errors: Sequence[dict[str, Any]]) -> str:
    """``body.key.dtype: Input should be …; query.limit: …`` (the first few, then a count)."""
    parts = [f"{_where(e)}: {e.get('msg', 'invalid')}" for e in errors[:SHOWN]]
    more = len(errors) - SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "") or "invalid request"


def install(app: FastAPI) -> None:
    """Registers the handlers on ``app``."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
             "msg": error_message(e), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]  # fmt: skip
        if any(e["type"] == "json_invalid" for e in errors):  # not JSON at all
            why = f"the body is not valid JSON: {validation_detail(errors)}"
            return JSONResponse(body(400, why), status_code=400)
        return JSONResponse(body(422, validation_detail(errors), errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and (why := _unparsable(exc.__cause__)) is not None:
            detail = why
        headers = exc.headers
        if exc.status_code == 405:  # every method of the path, not only the first route's
            methods = allowed_methods(app.openapi(), _request.url.path)
            if methods is not None:
                headers = {**(headers or {}), "Allow": ", ".join(methods)}
        if exc.status_code in (204, 304):  # no body allowed
            return Response(status_code=exc.status_code, headers=headers)
        return JSONResponse(body(exc.status_code, detail), status_code=exc.status_code,
                            headers=headers)  # fmt: skip

    @app.exception_handler(BucketFull)
    async def bucket_full(_request: Request, exc: BucketFull) -> JSONResponse:
        return JSONResponse(body(409, str(exc)), status_code=409)

    @app.exception_handler(InvalidInput)
    async def invalid_input(_request: Request, exc: InvalidInput) -> JSONResponse:
        return JSONResponse(body(422, str(exc)), status_code=422)

    @app.exception_handler(SQLAlchemyTimeout)
    async def database_busy(request: Request, exc: SQLAlchemyTimeout) -> JSONResponse:
        logger.warning("no database connection free for %s %s: %s", request.method,
                       request.url.path, one_line(exc))  # fmt: skip
        detail = "the server's database connections are all busy; retry in 1 s"
        return JSONResponse(body(503, detail), status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        detail = f"internal error ({type(exc).__name__}); the server's log has the traceback"
        return JSONResponse(body(500, detail), status_code=500)


def _unparsable(cause: BaseException | None) -> str | None:
    """What FastAPI's "There was an error parsing the body" was, in words a client can act on."""
    if isinstance(cause, TooComplex):
        return f"the body is refused: {cause}"
    if isinstance(cause, RecursionError):
        return "the body could not be parsed: it is nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"the body could not be parsed: it is not UTF-8 (byte {cause.start})"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body could not be parsed: a number in it has more than 4300 digits"
    return None
