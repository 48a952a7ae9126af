"""Who may call a route: ``Authorization: Bearer <token>`` checked against the token's scope.

Routes declare the scope they need with ``dependencies=[READ]``, ``[WRITE]`` or ``[ADMIN]``.
Without a token: 401 (unless the route only reads and the server leaves reads open). A token
the server does not know, or one revoked: 401, even where none was needed, so a misconfigured
client learns it at once. A live token whose scope is too small: 403.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cache_server import tokens
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.models import TokenRow
from tunecache.tokens import Scope, grants

_bearer = HTTPBearer(auto_error=False, description="An API token: `tunecache token create`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


def requires(needed: Scope, *, anonymous: bool = True) -> Callable[..., TokenRow | None]:
    """A dependency that lets the request through only with a token granting ``needed``
    (``anonymous=False``: a token even where the server leaves reads open)."""

    def check(
        credentials: Credentials, session: SessionDep, settings: SettingsDep
    ) -> TokenRow | None:
        if credentials is None:
            if needed == "read" and settings.reads == "open" and anonymous:
                return None
            raise _unauthorized(
                f"this needs a token with the {needed!r} scope: "
                "send 'Authorization: Bearer <token>' (see `tunecache token create`)"
            )
        row = tokens.authenticate(session, token=credentials.credentials)
        if row is None:
            raise _unauthorized("the token is not known to this server, or was revoked")
        if not grants(row.scope, needed):  # type: ignore[arg-type]
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"token {row.name!r} has the {row.scope!r} scope; this needs {needed!r}",
            )
        return row

    check.scope = needed  # type: ignore[attr-defined]  # marks routes that check a token
    return check


# The caller's token row (``None`` without one), for routes that need to know who called.
ReadAccess = Annotated[TokenRow | None, Depends(requires("read"))]
# The caller's token row, for routes that record who called: always a row.
IdentifiedAccess = Annotated[TokenRow, Depends(requires("read", anonymous=False))]
WriteAccess = Annotated[TokenRow, Depends(requires("write"))]
VerifyAccess = Annotated[TokenRow, Depends(requires("verify"))]
# For a route's ``dependencies=[...]``.
READ = Depends(requires("read"))
WRITE = Depends(requires("write"))
VERIFY = Depends(requires("verify"))
ADMIN = Depends(requires("admin"))
