"""Request dependencies. The session dependency owns the transaction: commit on success, roll
back on any error; query functions never commit.

``scope="function"`` makes FastAPI finish the dependency (the commit) when the path function
returns, *before* the response is sent; by default it would commit after, and a client could be
told 201 for a write that is not yet durable, or never is.

Dependencies that do no I/O are ``async``: FastAPI runs a plain ``def`` dependency on a worker
thread, and each such hop costs a request more than the lookup it serves (measured: a lookup
went through six). The session is opened on the event loop (no I/O until its first query) and
ended, committed or rolled back, in one hop to a worker thread; a path function on the hot path
(the lookup) commits its reads itself, on its own thread, and spares that hop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import Depends, Path, Request
from pydantic import BeforeValidator
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from cache_server.settings import ServerSettings
from tunecache.schemas import MAX_ID


def _end(session: Session, commit: bool) -> None:
    try:
        if commit:
            session.commit()
    finally:
        session.close()  # rolls back whatever was not committed


async def get_session(request: Request) -> AsyncIterator[Session]:
    session: Session = request.app.state.sessionmaker()
    committed = False
    try:
        yield session
        committed = True
    finally:
        if session.in_transaction():
            with anyio.CancelScope(shield=True):  # a client that hung up still ends it
                await run_in_threadpool(_end, session, committed)
        else:
            session.close()  # nothing was read or written: no I/O


async def get_settings(request: Request) -> ServerSettings:
    settings: ServerSettings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]


def _one_spelling(value: object) -> object:
    """An id in a path spelled one way only: ASCII digits, no sign, no leading zero. A plain
    ``int`` reads ``/records/1.0``, ``+1``, `` 1 `` and ``0001`` as record 1, and ``1_000`` as
    record 1000."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and value[:1] != "0"):
        if value == "0":  # spelled well, out of range (the range's own words were never reached)
            raise ValueError(f"ids start at 1: expected 1 to {MAX_ID}")
        raise ValueError(
            "an id is written in decimal digits, without a sign or a leading zero, such as 12"
        )
    return value


# An id in a path: an INTEGER column, int32 on PostgreSQL.
IdPath = Annotated[int, Path(ge=1, le=MAX_ID), BeforeValidator(_one_spelling)]


class _Digits(Convertor[str]):
    """``{name:digits}`` in a route: a path segment of digits only, passed on as written for
    :data:`IdPath` to check (starlette's ``:int`` turns ``01`` into 1 before it can)."""

    regex = "[0-9]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return str(value)


register_url_convertor("digits", _Digits())
