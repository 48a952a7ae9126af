"""Who may call a route: ``Authorization: Bearer <token>`` checked against the token's scope.

Routes declare the scope they need with ``dependencies=[READ]``, ``[WRITE]`` or ``[ADMIN]``.
Without a token: 401 (unless the route only reads and the server leaves reads open). A token
the server does not know, or one revoked: 401, even where none was needed, so a misconfigured
client learns it at once. A live token whose scope is too small: 403.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from cache_server import tokens
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.models import TokenRow
from tunecache.tokens import Scope, grants

_bearer = HTTPBearer(auto_error=False, description="An API token: `tunecache token create`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
# The same scheme, named apart in the OpenAPI document for the reads a caller may make without a
# token where the server leaves reads open (cache_server.api.openapi makes the token optional
# there, and renames it back).
OPEN_READ_SCHEME = "OpenReadBearer"
_open_bearer = HTTPBearer(auto_error=False, scheme_name=OPEN_READ_SCHEME)
OpenReadCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_open_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


def requires(needed: Scope, *, anonymous: bool = True) -> Callable[..., Awaitable[TokenRow | None]]:
    """A dependency that lets the request through only with a token granting ``needed``
    (``anonymous=False``: a token even where the server leaves reads open)."""
    if needed == "read" and anonymous:

        async def check(credentials: OpenReadCredentials, session: SessionDep,
                        settings: SettingsDep, request: Request) -> TokenRow | None:  # fmt: skip
            return await _authorize(credentials, session, settings, request, needed, anonymous)

    else:

        async def check(credentials: Credentials, session: SessionDep, settings: SettingsDep,
                        request: Request) -> TokenRow | None:  # fmt: skip
            return await _authorize(credentials, session, settings, request, needed, anonymous)

    check.scope = needed  # type: ignore[attr-defined]  # marks routes that check a token
    return check


async def _authorize(
    credentials: HTTPAuthorizationCredentials | None, session: SessionDep,
    settings: SettingsDep, request: Request, needed: Scope, anonymous: bool,
) -> TokenRow | None:  # fmt: skip
    if len(request.headers.getlist("authorization")) > 1:  # a proxy's and the caller's: which?
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            "the request has more than one Authorization header: send one",
        )
    if credentials is None and request.headers.get("authorization") is not None:
        raise _unauthorized("the Authorization header is not 'Bearer <token>'")
    if credentials is None:
        if needed == "read" and settings.reads == "open" and anonymous:
            return None
        raise _unauthorized(
            f"this needs a token with the {needed!r} scope: "
            "send 'Authorization: Bearer <token>' (see `tunecache token create`)"
        )
    # the only I/O: on a worker thread, as the path function's own queries are
    row = await run_in_threadpool(tokens.authenticate, session, token=credentials.credentials)
    if row is None:
        raise _unauthorized("the token is not known to this server, or was revoked")
    if not grants(row.scope, needed):  # type: ignore[arg-type]
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"token {row.name!r} has the {row.scope!r} scope; this needs {needed!r}",
        )
    return row


# The caller's token row (``None`` without one), for routes that need to know who called.
ReadAccess = Annotated[TokenRow | None, Depends(requires("read"))]
# The caller's token row, for routes that record who called: always a row.
IdentifiedAccess = Annotated[TokenRow, Depends(requires("read", anonymous=False))]
WriteAccess = Annotated[TokenRow, Depends(requires("write"))]
VerifyAccess = Annotated[TokenRow, Depends(requires("verify"))]
_ADMIN = requires("admin")  # one dependency: a route with both checks the token once
AdminAccess = Annotated[TokenRow, Depends(_ADMIN)]
# For a route's ``dependencies=[...]``.
READ = Depends(requires("read"))
WRITE = Depends(requires("write"))
VERIFY = Depends(requires("verify"))
ADMIN = Depends(_ADMIN)
