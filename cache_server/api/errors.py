"""Error answers: every failure a client causes is a 4xx with a reason it can act on, all in one
shape (:class:`cache_server.api.problems.ErrorBody`).

- a validation error is a 422 whose ``detail`` names the first fields and what is wrong with
  them, and whose ``errors`` lists every field (without the input: it may be huge, or something
  no JSON encoder writes, such as NaN or a lone surrogate);
- FastAPI's generic "There was an error parsing the body" says what it was;
- :class:`tunecache.errors.InvalidInput` raised anywhere in a request is a 422;
- a token revoked while its request ran (:class:`cache_server.tokens.Revoked`) is a 401;
- an upload past its token's quota of stored bytes (:class:`cache_server.quota.QuotaFull`) is a
  403 (sending it again cannot help until an admin raises the quota; 429 would say it can);
- a database that cannot be reached (down, restarting, refusing connections, a SQLite file locked
  past its busy timeout or that cannot be opened, a PostgreSQL statement or lock wait cut at the
  server's bound) is a 503 with ``Retry-After``, as a busy server
  is: the next request tries it again, so the server recovers by itself when it is back;
- a transaction PostgreSQL ended to break a deadlock or a serialisation failure (40P01, 40001)
  is a 503 with ``Retry-After: 1``: what it wrote since it last committed was not stored, and
  the same request sent again goes through (the deadlock is logged as the error of ours it is);
- anything else that escapes a route is a 500 in the same shape (a bug; it is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from cache_server.api.json_bounds import NotPlain, TooComplex
from cache_server.api.openapi import allowed_methods
from cache_server.api.problems import body
from cache_server.queries import BucketFull
from cache_server.quota import QuotaFull
from cache_server.tokens import Revoked
from tunecache.errors import InvalidInput, error_message, one_line

logger = logging.getLogger(__name__)
SHOWN = 3  # fields named in a validation error's detail
OUTAGE_RETRY_AFTER = 5  # seconds: a database that went away is seldom back within one

# What says the database could not be reached or written, not that the statement was wrong:
# PostgreSQL's SQLSTATE classes 08 (connection), 53 (insufficient resources: too many
# connections, disk full) and 58 (system: I/O), its shutting down or starting up, a standby
# that only reads (25006, after a failover), and a statement cut at the server's bound on it or
# on its wait for a lock (57014 query_canceled, 55P03 lock_not_available: a table an operator or
# a migration locked, cache_server.db.make_engine); SQLite's primary result codes BUSY (locked
# past the busy timeout), READONLY, IOERR, CANTOPEN and FULL (LOCKED, a table locked within one
# connection, is a bug of ours: a 500).
_PG_OUTAGE_CLASSES = ("08", "53", "58")
_PG_OUTAGE_CODES = frozenset({"57P01", "57P02", "57P03", "25006", "57014", "55P03"})
_SQLITE_OUTAGE_CODES = frozenset({5, 8, 10, 13, 14})
_SQLITE_OUTAGE_MESSAGES = ("database is locked", "unable to open database file")
# A transaction PostgreSQL ended so that another could go on: deadlock_detected,
# serialization_failure. Nothing of it is stored; sent again, it runs alone.
_PG_ENDED_CODES = frozenset({"40P01", "40001"})


# A 422 lists at most this many fields, each part of a field's place at most PART characters: a
# 63 KB body without a token, a mapping of 4,000 entries each of the wrong type, was answered
# with 4,000 errors in 419 KB (a read token's 1 MB, 6.3 MB in 0.96 s), and two clients sending
# them had most honest lookups shed; a key of 60 KB was a part of its entry's place, echoed.
LISTED = 20
PART = 64


def _part(name: str) -> str:
    return name if len(name) <= PART else f"{name[: PART - 1]}…"


def _where(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ())) or "request"


def validation_detail(errors: Sequence[dict[str, Any]]) -> str:
    """``body.key.dtype: Input should be …; query.limit: …`` (the first few, then a count)."""
    parts = [f"{_where(e)}: {e.get('msg', 'invalid')}" for e in errors[:SHOWN]]
    more = len(errors) - SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "") or "invalid request"


# What is refused for a reason of the server's own, the exception's text the answer's detail
_REFUSALS: dict[type[Exception], tuple[int, dict[str, str]]] = {
    BucketFull: (409, {}),
    QuotaFull: (403, {}),
    Revoked: (401, {"WWW-Authenticate": "Bearer"}),
    InvalidInput: (422, {}),
}


def _refusal(status: int, headers: dict[str, str]) -> Callable[..., Awaitable[JSONResponse]]:
    async def refuse(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(body(status, str(exc)), status_code=status, headers=headers or None)

    return refuse


def install(app: FastAPI) -> None:
    """Registers the handlers on ``app``."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [p if isinstance(p, int) else _part(str(p)) for p in e.get("loc", ())],
             "msg": error_message(e), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]  # fmt: skip
        if any(e["type"] == "json_invalid" for e in errors):  # not JSON at all
            why = f"the body is not valid JSON: {validation_detail(errors)}"
            return JSONResponse(body(400, why), status_code=400)
        listed = errors[:LISTED]  # the detail counts them all
        return JSONResponse(body(422, validation_detail(errors), listed), status_code=422)

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

    for kind, (status, headers) in _REFUSALS.items():
        app.add_exception_handler(kind, _refusal(status, headers))

    @app.exception_handler(SQLAlchemyTimeout)
    async def database_busy(request: Request, exc: SQLAlchemyTimeout) -> JSONResponse:
        logger.warning("no database connection free for %s %s: %s", request.method,
                       request.url.path, one_line(exc))  # fmt: skip
        detail = "the server's database connections are all busy; retry in 1 s"
        return JSONResponse(body(503, detail), status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if transaction_ended(exc):
            return _ended(request, exc)
        if database_outage(exc):
            return _outage(request, exc)
        return _internal(request, exc)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        if transaction_ended(exc):  # one raised in a middleware, outside the handlers above
            return _ended(request, exc)
        if database_outage(exc):
            return _outage(request, exc)
        return _internal(request, exc)


def database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached (down, restarting, refusing
    connections, locked or unopenable), not that a statement was wrong: a 503, not a bug."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == "25006":  # a read-only standby: an InternalError
        return True
    if not isinstance(exc, OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:  # extended result codes keep the primary one in their low byte
        return code & 0xFF in _SQLITE_OUTAGE_CODES
    if any(message in str(orig) for message in _SQLITE_OUTAGE_MESSAGES):
        return True
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None:  # the driver never got an answer: no connection, or it broke
        return True
    return sqlstate[:2] in _PG_OUTAGE_CLASSES or sqlstate in _PG_OUTAGE_CODES


def transaction_ended(exc: BaseException) -> bool:
    """Whether ``exc`` says PostgreSQL ended the request's transaction so that another could go
    on (a deadlock, a serialisation failure): nothing of it was stored, and sent again it goes
    through, so a 503 to retry, not a 500."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else None
    return getattr(orig, "sqlstate", None) in _PG_ENDED_CODES


def _ended(request: Request, exc: BaseException) -> JSONResponse:
    """503 with ``Retry-After: 1``; logged with its traceback: two writers waiting for each
    other is a bug of ours in the order they take their locks."""
    logger.error("the database ended %s %s to break a conflict with another request",
                 request.method, request.url.path, exc_info=exc)  # fmt: skip
    detail = (
        "the database ended this request's transaction to let a concurrent one go on (a "
        "deadlock or a serialisation failure); what it wrote since it last committed was "
        "not stored (an import keeps the chunks it committed before): retry in 1 s"
    )
    return JSONResponse(body(503, detail), status_code=503, headers={"Retry-After": "1"})


def _outage(request: Request, exc: BaseException) -> JSONResponse:
    """503 with ``Retry-After``; the reason, for the operator, only in the log (a driver's
    message may name the database's host)."""
    why = one_line(getattr(exc, "orig", None) or exc)
    logger.warning("the database did not answer %s %s: %s", request.method, request.url.path,
                   why)  # fmt: skip
    detail = (f"the database is not answering ({type(exc).__name__}); the server tries it again "
              f"with each request: retry in {OUTAGE_RETRY_AFTER} s")  # fmt: skip
    headers = {"Retry-After": str(OUTAGE_RETRY_AFTER)}
    return JSONResponse(body(503, detail), status_code=503, headers=headers)


def _internal(request: Request, exc: Exception) -> JSONResponse:
    logger.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    detail = f"internal error ({type(exc).__name__}); the server's log has the traceback"
    return JSONResponse(body(500, detail), status_code=500)


def _unparsable(cause: BaseException | None) -> str | None:
    """What FastAPI's "There was an error parsing the body" was, in words a client can act on."""
    if isinstance(cause, TooComplex | NotPlain):
        return f"the body is refused: {cause}"
    if isinstance(cause, RecursionError):
        return "the body could not be parsed: it is nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"the body could not be parsed: it is not UTF-8 (byte {cause.start})"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body could not be parsed: a number in it has more than 4300 digits"
    return None
