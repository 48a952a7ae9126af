"""Request dependencies. The session dependency owns the transaction: commit on success, roll
back on any error; query functions never commit."""

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


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
