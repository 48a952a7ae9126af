"""Error answers: every failure a client causes is a 4xx with a reason it can act on.

- a validation error whose input no JSON encoder writes (NaN, a lone surrogate) still renders,
  without its input;
- FastAPI's generic "There was an error parsing the body" says what it was;
- :class:`tunecache.errors.InvalidInput` raised anywhere in a request is a 422.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tunecache.errors import InvalidInput


def install(app: FastAPI) -> None:
    """Registers the handlers on ``app``."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        try:
            return await request_validation_exception_handler(request, exc)
        except (ValueError, RecursionError):  # an input no JSON encoder writes: NaN, a surrogate
            errors = [
                {k: v for k, v in e.items() if k not in ("input", "ctx")} for e in exc.errors()
            ]
            return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and (why := _unparsable(exc.__cause__)) is not None:
            return JSONResponse({"detail": why}, status_code=400)
        return await http_exception_handler(request, exc)

    @app.exception_handler(InvalidInput)
    async def invalid_input(_request: Request, exc: InvalidInput) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)


def _unparsable(cause: BaseException | None) -> str | None:
    """What FastAPI's "There was an error parsing the body" was, in words a client can act on."""
    if isinstance(cause, RecursionError):
        return "the body could not be parsed: it is nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"the body could not be parsed: it is not UTF-8 (byte {cause.start})"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body could not be parsed: a number in it has more than 4300 digits"
    return None
