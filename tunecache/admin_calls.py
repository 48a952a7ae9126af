"""The API calls about tokens and the server itself: token management (a token with the admin
scope), who this client's token is, and the server's health.

A part of :class:`tunecache.client.Client` (which it is mixed into): each call goes through the
client's ``_call`` (one deadline per call; a :class:`~tunecache.errors.ServerError` on failure).
"""

from __future__ import annotations

from typing import Any

import httpx

from tunecache import answers
from tunecache.errors import ServerError
from tunecache.http import parse
from tunecache.tokens import (
    Scope,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    TokenRevoked,
    WhoAmI,
)


class AdminCalls:
    """Token, identity and health calls (mixed into :class:`tunecache.client.Client`)."""

    def _call(
        self, method: str, path: str, timeout: float | None = None, *, read: bool = False,
        small: bool = False, **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        raise NotImplementedError  # the client's

    def create_token(self, name: str, scope: Scope, *, trusted: bool = False) -> TokenCreated:
        """A new token; the answer holds it in clear, for the only time. ``trusted``: its
        uploads are served as verified at once."""
        body = TokenCreate(name=name, scope=scope, trusted=trusted).model_dump()
        return parse(
            TokenCreated, self._call("POST", "/v1/tokens", small=True, json=body), "/v1/tokens"
        )

    def list_tokens(self, *, include_revoked: bool = False) -> list[TokenPublic]:
        params = {"include_revoked": "true"} if include_revoked else {}
        response = self._call("GET", "/v1/tokens", params=params)
        return parse(TokenList, response, "/v1/tokens").items

    def revoke_token(self, token_id: int, *, withdraw: bool = False) -> TokenRevoked:
        """Revokes a token; ``withdraw`` disputes the records served on its word alone (out of
        service until a verifier checks each). The answer counts them."""
        path = f"/v1/tokens/{token_id}" + ("?withdraw=true" if withdraw else "")
        return parse(TokenRevoked, self._call("DELETE", path, small=True), path)

    def whoami(self, *, timeout: float | None = None) -> WhoAmI:
        """The token this client sends, as the server sees it, and its scope.

        Raises:
            ServerError: unreachable (``status_code`` None), or the token is refused (401).
        """
        response = self._call("GET", "/v1/whoami", timeout, read=True, small=True)
        return parse(WhoAmI, response, "/v1/whoami")

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's ``/health`` answer (``status``, ``database``, ``records``, ``version``),
        within ``timeout`` seconds (default: the write timeout).

        Raises:
            ServerError: unreachable, or the answer is not a JSON object.
        """
        response = self._call("GET", "/health", timeout, read=True, small=True)
        result = answers.json_answer(response, "/health", answers.SMALL_ANSWER_CONTAINERS)
        if not isinstance(result, dict):
            raise ServerError("GET /health gave no JSON object")
        return result
