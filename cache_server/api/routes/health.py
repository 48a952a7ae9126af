from __future__ import annotations

from fastapi import APIRouter, Response, status
from sqlalchemy import select

from cache_server import quota, tokens
from cache_server.api.auth import ReadAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.models import TokenRow
from cache_server.queries import count_records
from tunecache import __version__
from tunecache.schemas import Health
from tunecache.tokens import WhoAmI

router = APIRouter(route_class=JsonRoute, tags=["health"])


@router.get(
    "/health",
    responses={503: {"description": "the database is not answering (or the server is busy): "
                     "`Retry-After` says when to ask again"}},
)  # fmt: skip
def health(session: SessionDep) -> Health:
    """Liveness and readiness: 200 only when the database answers; while it does not, 503 with
    ``Retry-After`` (see :mod:`cache_server.api.errors`), and 200 again once it is back. It reads
    the tables every request needs (tokens, records): a lock held on either stalls the API, and
    the statement bound (:func:`cache_server.db.make_engine`) turns that into this 503."""
    session.execute(select(TokenRow.id).limit(1))
    return Health(
        database=session.get_bind().dialect.name,
        records=count_records(session),
        version=__version__,
    )


@router.head("/health", include_in_schema=False)
def health_head(session: SessionDep) -> Response:
    """``GET /health``'s status, from the same reads, without its body: for probes that ask
    with ``HEAD`` (HAProxy's ``option httpchk HEAD``), which read a 405 as the server down."""
    health(session)
    return Response(status_code=status.HTTP_200_OK)


@router.get(
    "/v1/whoami",
    responses={401: {"description": "the token is unknown or revoked, or reads need one"}},
)
def whoami(caller: ReadAccess, settings: SettingsDep, session: SessionDep) -> WhoAmI:
    """The caller's token (with the bytes it has stored: ``stored_bytes``) and scope: a client
    checks it may do its work before starting it.

    Any live token may ask (401 for an unknown or revoked one); without a token the answer is
    ``token: null`` where reads are open, 401 where they need a token.
    """
    public = (
        None
        if caller is None
        else tokens.public(caller, stored_bytes=quota.used(session, caller.id))
    )
    return WhoAmI(token=public, scope=None if public is None else public.scope,
                  reads=settings.reads)  # fmt: skip
