from __future__ import annotations

from fastapi import APIRouter

from cache_server.api.deps import SessionDep
from cache_server.queries import count_records
from tunecache import __version__
from tunecache.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health")
def health(session: SessionDep) -> Health:
    """Liveness and readiness: answers only when the database does."""
    return Health(
        database=session.get_bind().dialect.name,
        records=count_records(session),
        version=__version__,
    )
