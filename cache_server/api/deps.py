"""Request dependencies. The session dependency owns the transaction: commit on success, roll
back on any error; query functions never commit.

``scope="function"`` makes FastAPI finish the dependency (the commit) when the path function
returns, *before* the response is sent; by default it would commit after, and a client could be
told 201 for a write that is not yet durable, or never is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from cache_server.settings import ServerSettings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessionmaker() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def get_settings(request: Request) -> ServerSettings:
    settings: ServerSettings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
