"""API tokens: create (shown once), list, revoke. Every route needs the ``admin`` scope."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from cache_server import tokens
from cache_server.api.auth import ADMIN, AdminAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import IdPath, SessionDep, SettingsDep
from tunecache.tokens import TokenCreate, TokenCreated, TokenList, TokenRevoked

router = APIRouter(
    route_class=JsonRoute, prefix="/v1/tokens", tags=["tokens"], dependencies=[ADMIN]
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={409: {"description": "a live token already has this name (case aside)"}},
)
def create_token(request: TokenCreate, session: SessionDep) -> TokenCreated:
    """A new token with one scope. The answer holds the token: it is never shown again.

    Its name (ASCII letters, digits and ``_.@:/-``, words one space apart) is who records and the
    dashboard say uploaded or verified something: one a live token has, case aside, is refused
    (409).
    """
    try:
        token, row = tokens.create(session, name=request.name, scope=request.scope,
                                   trusted=request.trusted)  # fmt: skip
    except tokens.NameTaken as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return TokenCreated(token=token, info=tokens.public(row, stored_bytes=0))  # nothing yet


@router.get("")
def list_tokens(session: SessionDep, include_revoked: bool = False) -> TokenList:
    """Every live token (and the revoked ones on request), without the tokens themselves, each
    with the bytes of records and artifacts it has stored (``stored_bytes``: what the server's
    quota of a non-admin token bounds)."""
    return TokenList(items=tokens.list_tokens(session, include_revoked=include_revoked))


@router.delete(
    "/{token_id}",
    responses={
        404: {"description": "no such token"},
        409: {"description": "the last live admin token: create another first"},
    },
)
def revoke_token(
    token_id: IdPath,
    session: SessionDep,
    settings: SettingsDep,
    caller: AdminAccess,
    withdraw: bool = False,
) -> TokenRevoked:
    """Revokes a token at once, on every server process; its row stays, marked revoked. The
    answer counts the records served on its word alone (its uploads and imports that no verifier
    here passed); ``withdraw=true`` disputes them, out of service until a verifier checks each
    (for a token that leaked: asked again of a revoked token, it withdraws them then), and opens
    again the done jobs they answered at keys left served by none.

    The last live admin token cannot be revoked (409): nobody could manage tokens afterwards.
    """
    # The caller's own row, its last use written as it was authenticated, is committed first:
    # held to the end, two admins revoking at once each waited for the other's row while
    # holding its own (PostgreSQL ended one: a 500).
    session.commit()
    try:
        revoked = tokens.revoke(session, token_id=token_id, withdraw=withdraw, by=caller.id,
                                policy=settings.policy)  # fmt: skip
    except tokens.LastAdmin as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if revoked is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id}")
    return revoked
