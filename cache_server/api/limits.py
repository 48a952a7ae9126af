"""Bodies are bounded before they are read: by who sends them, then by their JSON's shape.

:class:`BodyLimits` is an ASGI middleware that runs before any body is read or parsed. A request
without a token may send at most ``max_body_anonymous`` bytes (a lookup or a miss report is a few
KB); one with a ``read`` or ``verify`` token ``max_body_read``; one with a ``write`` or ``admin``
token ``max_body``. The token is looked up only when the body is larger than an anonymous one may
be (its declared length, or the bytes streamed so far): the hot path, small lookups, costs no
database query here. Over its limit a request gets 413 at once (a declared length) or as soon as
the limit is passed (a streamed body), never after the whole body was read; an unknown or revoked
token sending a large body gets 401, also before its body is read. A body that takes longer than
``body_seconds`` to arrive gets 408: a client trickling its body cannot hold a request slot.

The whole body is read (bounded so) before the request goes on: a client that trickles its body
holds a connection, never one of the request slots load shedding counts
(:mod:`cache_server.api.shedding`), and its 10 s run out first.

Once read, a JSON body is parsed off the event loop (:func:`parse_json`, in a worker thread) with
bounds on its nesting depth and element count, so a small body cannot expand into millions of
objects (``[{},{},…]``: 3 bytes each).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from tunecache.tokens import Scope

ScopeDict = dict[str, Any]
Message = dict[str, Any]
Authenticate = Callable[[str], Scope | None]  # a token's scope, None when unknown or revoked


class Refused(Exception):
    """A request refused before it reaches the app: its status and why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class TooComplex(ValueError):
    """A JSON body nested deeper, or holding more elements, than the server takes."""


@dataclass(frozen=True)
class JsonLimits:
    """How deep a JSON body may nest and how many values (containers, keys' values, array
    items) it may hold."""

    depth: int = 64
    elements: int = 1_000_000

    def check(self, value: Any) -> None:
        """Raises :class:`TooComplex` when ``value`` (parsed JSON) is over a limit."""
        stack = [(value, 1)]
        count = 0
        while stack:
            node, depth = stack.pop()
            if depth > self.depth:
                raise TooComplex(f"it is nested too deeply (more than {self.depth} levels)")
            children = node.values() if isinstance(node, dict) else node
            count += len(children)
            if count > self.elements:
                raise TooComplex(f"it holds more than {self.elements} values")
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def parse_json(body: bytes, limits: JsonLimits) -> Any:
    """``body`` parsed, within ``limits``.

    A cheap count of the bytes that open a container or separate values comes first: a body
    with far more of them than ``limits.elements`` is refused before it is parsed (an
    over-estimate: those characters inside strings count too).

    Raises:
        TooComplex: over a limit.
        json.JSONDecodeError, UnicodeDecodeError, RecursionError: not parsable.
    """
    structural = body.count(b"{") + body.count(b"[") + body.count(b",")
    if structural > 2 * limits.elements:
        raise TooComplex(f"it holds more than {limits.elements} values")
    value = json.loads(body)
    if isinstance(value, dict | list):
        limits.check(value)
    return value


async def parse_json_off_loop(body: bytes, limits: JsonLimits) -> Any:
    """:func:`parse_json` in a worker thread: the event loop keeps answering meanwhile."""
    return await anyio.to_thread.run_sync(parse_json, body, limits)


@dataclass(frozen=True)
class ScopeLimits:
    """Body bytes a request may send, by its token's scope."""

    anonymous: int = 64 * 2**10
    read: int = 2**20
    write: int = 16 * 2**20

    def of(self, scope: Scope | None) -> int:
        if scope is None:
            return self.anonymous
        return self.read if scope in ("read", "verify") else self.write


def bearer(scope: ScopeDict) -> str | None:
    """The bearer token of a request, if it sends one."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if kind.lower() == "bearer" else None
    return None


def declared_length(scope: ScopeDict) -> int | None:
    """The request's ``Content-Length`` (``-1`` when it is not a number), or ``None``."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


class BodyLimits:
    """Answers 413 to a body over its sender's limit, and 401 to an unknown token sending more
    than an anonymous request may, before the body is read (see the module doc).

    Args:
        app: the ASGI app.
        limits: bytes by scope.
        authenticate: a token's scope (``None``: unknown or revoked); called in a worker thread.
        seconds: how long the whole body may take to arrive (then 408).
        reject: sends an error answer ``(send, status, detail, headers)``.
    """

    def __init__(self, app: Any, *, limits: ScopeLimits, authenticate: Authenticate,
                 seconds: float, reject: Callable[..., Awaitable[None]]) -> None:  # fmt: skip
        self.app, self.limits, self.authenticate, self.reject = app, limits, authenticate, reject
        self.seconds = seconds

    async def _limit(self, scope: ScopeDict) -> int:
        """The sender's limit; :class:`Refused` (401) for an unknown or revoked token."""
        token = bearer(scope)
        if token is None:
            return self.limits.anonymous
        try:
            held = await anyio.to_thread.run_sync(self.authenticate, token)
        except Exception as exc:  # the database: not the client's fault, and not for good
            raise Refused(
                503, f"the token could not be checked now ({type(exc).__name__})"
            ) from exc
        if held is None:
            raise Refused(401, "the token is not known to this server, or was revoked")
        return self.limits.of(held)

    def _too_large(self, scope: ScopeDict, limit: int, size: int | None) -> Refused:
        who = "a request without a token" if bearer(scope) is None else "this token's scope"
        sent = "the body" if size is None else f"the body of {size} bytes"
        more = "; send a token" if bearer(scope) is None and limit < self.limits.write else ""
        return Refused(413, f"{sent} is over the limit of {limit} bytes for {who}{more}")

    async def _read(self, scope: ScopeDict, receive: Any) -> bytes | None:
        """The whole body, within its sender's limit and the deadline (``None``: the client
        went away).

        Raises:
            Refused: over the limit (413), an unknown token (401), too slow (408).
        """
        limit, known = self.limits.anonymous, False
        declared = declared_length(scope)
        if declared is not None and (declared < 0 or declared > limit):
            limit, known = await self._limit(scope), True
            if declared < 0 or declared > limit:
                raise self._too_large(scope, limit, declared if declared >= 0 else None)
        chunks: list[bytes] = []
        received = 0
        with anyio.move_on_after(self.seconds) as waited:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None  # http.disconnect
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > limit and not known:
                    limit, known = await self._limit(scope), True
                if received > limit:
                    raise self._too_large(scope, limit, None)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        assert waited.cancelled_caught
        raise Refused(408, f"the body did not arrive within {self.seconds:g} s")

    async def __call__(self, scope: ScopeDict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except Refused as refused:
            await self._refuse(send, refused)
            return
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:  # the body, in one piece; then what the client does next
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: Message = await receive()
            return message

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, refused: Refused) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else {}
        if refused.status in (401, 408, 413):  # the rest of the body is never read
            headers["Connection"] = "close"
        if refused.status == 503:
            headers["Retry-After"] = "1"
        await self.reject(send, refused.status, refused.detail, headers)
