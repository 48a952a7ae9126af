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

Bodies are also bounded together: each process holds at most :class:`BodyBudget`'s bytes of
request bodies at once, whoever sends them. Per request, each limit was bounded, and their sum
was not: 24 connections with a write token, each sending 16 MiB less one byte and then stalling,
took a server process from 114 MiB to 499 MiB (256 connections an address allowed: 4 GiB). A
declared body is charged whole before a byte of it is read, a streamed one as it arrives; one
that does not fit is refused at once with 503 and ``Retry-After`` (the server is busy, the request
is not wrong: the same one fits once others have ended), and a request whose body fit keeps its
bytes until it ends, a token's (one without a token, until its answer starts: see ``answer``);
a client that stops reading its answers is cut off after ``drain_seconds``
(:mod:`cache_server.header_deadline`), which ends its request. A body arrives into one
``bytearray``, not a list of chunks: after those 24 connections closed, the chunks' memory
stayed with the process (469 MiB of 485 at the peak: many freed pieces of a few hundred KB
each, in the allocator's heap), a ``bytearray``'s went back to
the system (104 MiB); and a list costs an object for each chunk, uncharged.

The bodies without a token are shared: one address may hold a share of their pool
(``ADDRESS_BODIES``), and a body that finds the pool full cuts off bodies that have stopped
arriving (none for a second, or slower than ``MIN_RATE``), from the address that holds the most
first (503, ``Retry-After``, saying so). Four addresses, each holding its share of stalled 64 KiB
bodies, filled the pool and shed 290 of 293 honest lookups over 30 s. A body still arriving is
never cut: cutting by holdings alone, 286 addresses each holding a stalled body a little smaller
than an honest client's slow one had it cut. A token not checked yet spares no body (any
``Authorization`` header would do).

Once read, a JSON body is parsed within bounds (:mod:`cache_server.api.json_bounds`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio

from cache_server.api.peers import client_of
from tunecache.tokens import Scope

ScopeDict = dict[str, Any]
Message = dict[str, Any]
Authenticate = Callable[[str], Scope | None]  # a token's scope, None when unknown or revoked


class Refused(Exception):
    """A request refused before it reaches the app: its status and why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


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


# The bodies one process holds at once, in bodies of the largest size each may be (defaults:
# 3 x 16 MiB + 256 x 64 KiB = 64 MiB). Bodies whose sender is not known to hold a token (every
# body up to the anonymous limit: its token is checked only when it is larger, or when this pool
# is full) have a pool of their own, which a token's bodies never take: uploads cannot make
# lookups wait, nor can a flood of anonymous bodies refuse uploads.
TOKEN_BODIES: Final = 3  # write limits' worth; read and verify scopes take at most half of it
ANONYMOUS_BODIES: Final = 256  # anonymous limits' worth
ADDRESS_BODIES: Final = 64  # of those, what one client address may hold: one cannot fill it
# A body without a token is arriving (never cut for another) while bytes came within the last
# STALL_SECONDS and, past its first GRACE_SECONDS, at MIN_RATE bytes a second at least (a 64 KiB
# lookup in 5 s): a slow honest client sends far faster, one holding its body back cannot.
STALL_SECONDS: Final = 1.0
GRACE_SECONDS: Final = 1.0
MIN_RATE: Final = 16 * 2**10


class Hold:
    """The body bytes one request holds in a :class:`BodyBudget`, and whose they are."""

    __slots__ = ("address", "checked", "cut", "cut_off", "last", "received", "scope", "size",
                 "started", "token")  # fmt: skip

    def __init__(self, address: str) -> None:
        self.address = address
        self.scope: Scope | None = None  # None: anonymous, or its token not checked yet
        self.token = b""  # its checked token's digest (b"": none)
        self.checked = False  # whether its token was looked up (once at most)
        self.size = 0
        # While its body arrives: what cuts it off (BodyBudget.make_room), and whether it was
        self.cut: Callable[[], Any] | None = None
        self.cut_off = False
        # Its body's bytes arrived, and when it began and when bytes last came (monotonic)
        self.received = 0
        self.started = self.last = time.monotonic()

    def arriving(self, now: float) -> bool:
        """Whether its body is arriving as a client that means to send it sends one: bytes
        within the last :data:`STALL_SECONDS`, at :data:`MIN_RATE` since its first second."""
        due = max(0.0, now - self.started - GRACE_SECONDS) * MIN_RATE
        return now - self.last < STALL_SECONDS and self.received >= due


class BodyBudget:
    """The request-body bytes one server process holds at once (see the module doc).

    Two pools: bodies of a checked token (``read`` and ``verify`` scopes at most half of it, so
    they cannot refuse uploads; one token at most half of its scope's: a write token's three
    stalled 16 MiB bodies refused every other token's upload, an admin's too) and the others,
    of which one client address may hold only a share (so one address cannot refuse everyone's
    lookups). Each pool holds at least one body of the largest size its senders may send. One
    event loop charges it: no lock.
    """

    def __init__(self, limits: ScopeLimits) -> None:
        self.tokens_limit = max(TOKEN_BODIES * limits.write, limits.read)
        self.read_limit = max(self.tokens_limit // 2, limits.read)
        self.token_limit = max(self.tokens_limit // 2, limits.write)  # one write token's share
        self.read_token_limit = max(self.read_limit // 2, limits.read)  # a read or verify one's
        self.anonymous_limit = ANONYMOUS_BODIES * limits.anonymous
        self.address_limit = ADDRESS_BODIES * limits.anonymous
        self.tokens = self.read = self.anonymous = 0
        self.by_address: dict[str, int] = {}
        self.by_token: dict[bytes, int] = {}
        self.arriving: set[Hold] = set()  # holds whose body still arrives, and can be cut off

    @property
    def total(self) -> int:
        """The most bytes of bodies this process holds at once."""
        return self.tokens_limit + self.anonymous_limit

    @property
    def held(self) -> int:
        return self.tokens + self.anonymous

    def room(self, hold: Hold) -> int:
        """Bytes more ``hold`` may take now."""
        if hold.scope is None:
            by_address = self.address_limit - self.by_address.get(hold.address, 0)
            return min(self.anonymous_limit - self.anonymous, by_address)
        return min(self.pool_room(hold.scope), self.token_room(hold.scope, hold.token))

    def pool_room(self, scope: Scope) -> int:
        """Bytes more the pool of ``scope``'s tokens may take now."""
        room = self.tokens_limit - self.tokens
        return min(room, self.read_limit - self.read) if scope in ("read", "verify") else room

    def token_room(self, scope: Scope, token: bytes) -> int:
        """Bytes more the token of ``scope`` whose digest is ``token`` may take now: half of its
        scope's pool at most."""
        share = self.read_token_limit if scope in ("read", "verify") else self.token_limit
        return share - self.by_token.get(token, 0)

    def take(self, hold: Hold, size: int) -> bool:
        """Charges ``size`` bytes more to ``hold`` if they fit (else charges nothing)."""
        if hold.cut_off or size > self.room(hold):
            return False
        self._add(hold, size)
        return True

    def move(self, hold: Hold, scope: Scope, token: bytes) -> bool:
        """Moves ``hold``'s bytes to the pool of ``scope``, its checked token's (whose digest is
        ``token``), if they fit there (else leaves them where they are)."""
        size = hold.size
        self._add(hold, -size)
        hold.scope, hold.token, was = scope, token, hold.scope
        if self.take(hold, size):
            return True
        hold.scope, hold.token = was, b""
        self._add(hold, size)
        return False

    def release(self, hold: Hold) -> None:
        """Gives back every byte ``hold`` holds (the request ended)."""
        self._add(hold, -hold.size)

    def make_room(self, hold: Hold, size: int) -> bool:
        """Charges ``size`` bytes more to ``hold``, a body without a token, cutting off bodies
        without a token that have stopped arriving (:meth:`Hold.arriving`: stalled, or
        trickled), from the address that holds the most first; ``False`` (nothing cut, nothing
        charged) when that does not make room. Within its address's share only. A body still
        arriving is never cut. (One that sends a token not checked yet can be: any header would
        do, and spared, bodies claiming one filled the pool as stalled ones had.)"""
        if hold.scope is not None or size > self.address_limit - self.by_address.get(
            hold.address, 0
        ):
            return False
        now = time.monotonic()
        while size > self.room(hold):
            held = [h for h in self.arriving if h.scope is None and h.size
                    and h.cut is not None and h is not hold and not h.arriving(now)]  # fmt: skip
            if not held:
                return False
            self._cut(max(held, key=lambda h: (self.by_address[h.address], h.size)))
        return self.take(hold, size)

    def _cut(self, hold: Hold) -> None:
        self.release(hold)
        self.arriving.discard(hold)
        hold.cut_off = True
        assert hold.cut is not None
        hold.cut()

    def _add(self, hold: Hold, size: int) -> None:
        hold.size += size
        if hold.scope is not None:
            self.tokens += size
            self.read += size if hold.scope in ("read", "verify") else 0
            left = self.by_token.get(hold.token, 0) + size
            if left:
                self.by_token[hold.token] = left
            else:
                self.by_token.pop(hold.token, None)
            return
        self.anonymous += size
        left = self.by_address.get(hold.address, 0) + size
        if left:
            self.by_address[hold.address] = left
        else:  # an address that holds nothing is not kept
            self.by_address.pop(hold.address, None)


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
    than an anonymous request may, before the body is read; 503 to a body the process's
    :class:`BodyBudget` has no room for (see the module doc).

    Args:
        app: the ASGI app.
        limits: bytes by scope.
        authenticate: a token's scope (``None``: unknown or revoked); called in a worker thread.
        seconds: how long the whole body may take to arrive (then 408).
        reject: sends an error answer ``(send, status, detail, headers)``.
        budget: the bodies held at once (default: from ``limits``, see :class:`BodyBudget`).
    """

    def __init__(self, app: Any, *, limits: ScopeLimits, authenticate: Authenticate,
                 seconds: float, reject: Callable[..., Awaitable[None]],
                 budget: BodyBudget | None = None) -> None:  # fmt: skip
        self.app, self.limits, self.authenticate, self.reject = app, limits, authenticate, reject
        self.seconds = seconds
        self.budget = BodyBudget(limits) if budget is None else budget

    async def _check(self, scope: ScopeDict, hold: Hold) -> int:
        """The sender's limit, its token looked up (once) and its bytes moved to its scope's
        pool; :class:`Refused` for an unknown or revoked token (401), or no room there (503)."""
        if hold.checked:
            return self.limits.of(hold.scope)
        hold.checked = True
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
        digest = hashlib.sha256(token.encode()).digest()
        if not self.budget.move(hold, held, digest):
            raise self._busy(hold, (held, digest))  # its bytes stayed where they were
        return self.limits.of(held)

    async def _charge(self, scope: ScopeDict, hold: Hold, size: int) -> None:
        """Charges ``size`` bytes more to the request, or refuses it (503). A body not known to
        be a token's whose pool is full has its token checked first: then it may use its
        scope's pool (an anonymous flood refuses no token), and only then does a small body
        cost a database query."""
        if size <= 0 or self.budget.take(hold, size):
            return
        if not hold.checked and bearer(scope) is not None:
            await self._check(scope, hold)
            if self.budget.take(hold, size):
                return
        if self.budget.make_room(hold, size):
            return
        raise self._busy(hold)

    def _busy(self, hold: Hold, token: tuple[Scope, bytes] | None = None) -> Refused:
        """The 503 for ``hold``, sent with ``token`` (scope, digest; default: its own)."""
        budget = self.budget
        scope, digest = token or (hold.scope, hold.token)
        if scope is not None and budget.token_room(scope, digest) < budget.pool_room(scope):
            who = f"bodies of this token (at most half of all {scope} tokens')"
        elif scope is not None:
            who = f"bodies of {scope} tokens"
        elif budget.address_limit - budget.by_address.get(hold.address, 0) <= (
            budget.anonymous_limit - budget.anonymous
        ):
            who = "bodies without a token from this address"
        else:
            who = "bodies without a token"
        held = f"{budget.held} bytes of bodies in all"
        return Refused(503, f"the server holds as many {who} as it takes at once ({held}); "
                            "retry in 1 s")  # fmt: skip

    def _too_large(self, scope: ScopeDict, limit: int, size: int | None) -> Refused:
        who = "a request without a token" if bearer(scope) is None else "this token's scope"
        sent = "the body" if size is None else f"the body of {size} bytes"
        more = "; send a token" if bearer(scope) is None and limit < self.limits.write else ""
        return Refused(413, f"{sent} is over the limit of {limit} bytes for {who}{more}")

    async def _read(self, scope: ScopeDict, receive: Any, hold: Hold) -> bytes | None:
        """The whole body, within its sender's limit, the budget and the deadline (``None``: the
        client went away).

        Raises:
            Refused: over the limit (413), an unknown token (401), too slow (408), no room (503).
        """
        declared = declared_length(scope)
        if declared is not None and (declared < 0 or declared > self.limits.anonymous):
            limit = await self._check(scope, hold)
            if declared < 0 or declared > limit:
                raise self._too_large(scope, limit, declared if declared >= 0 else None)
        if declared is not None:  # charged whole, before a byte is read
            await self._charge(scope, hold, declared)
        with anyio.move_on_after(self.seconds) as waited:
            hold.cut = waited.cancel
            self.budget.arriving.add(hold)
            try:
                return await self._arrive(scope, receive, hold)
            finally:
                self.budget.arriving.discard(hold)
                hold.cut = None
        if hold.cut_off:
            raise Refused(503, "the server holds as many bodies without a token as it takes at "
                               f"once, and this one had stopped arriving (nothing for "
                               f"{STALL_SECONDS:g} s, or under {MIN_RATE} bytes a second): cut "
                               "off for another; retry in 1 s")  # fmt: skip
        assert waited.cancelled_caught
        raise Refused(408, f"the body did not arrive within {self.seconds:g} s")

    async def _arrive(self, scope: ScopeDict, receive: Any, hold: Hold) -> bytes | None:
        """:meth:`_read`'s loop: the body as it arrives, charged, within its sender's limit."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # http.disconnect
            chunk = message.get("body", b"")
            received = len(body) + len(chunk)
            if received > self.limits.of(hold.scope) and not hold.checked:
                await self._check(scope, hold)
            if received > (limit := self.limits.of(hold.scope)):
                raise self._too_large(scope, limit, None)
            await self._charge(scope, hold, received - hold.size)
            body += chunk
            if chunk:
                hold.received, hold.last = received, time.monotonic()
            if not message.get("more_body", False):
                return bytes(body)  # a copy: one body at a time (no await until it is freed)

    async def __call__(self, scope: ScopeDict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        hold = Hold(client_of(client[0]) if client else "")
        try:
            await self._serve(scope, receive, send, hold)
        finally:  # however the request ended: answered, refused, gone, failed
            self.budget.release(hold)

    async def _serve(self, scope: ScopeDict, receive: Any, send: Any, hold: Hold) -> None:
        try:
            body = await self._read(scope, receive, hold)
        except Refused as refused:
            await self._refuse(send, refused)
            return
        if body is None:  # the client went away: no one to answer (counted as 499, not 500:
            return  # cache_server.metrics.ObserveRequests saw the http.disconnect)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:  # the body, in one piece; then what the client does next
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: Message = await receive()
            return message

        async def answer(message: Message) -> None:
            # A body without a token is given back as its answer starts, before the client
            # reads it: held until the answer drained, four addresses' unread answers filled
            # the pool and refused every tokenless lookup. A token's stays charged until the
            # request ends (at most drain_seconds past the client's last read: the connection
            # is then aborted, cache_server.header_deadline): given back earlier, the
            # requests stuck behind unread answers, 256 connections an address, each kept
            # its 16 MiB body in memory uncounted.
            if hold.scope is None:
                self.budget.release(hold)
            await send(message)

        await self.app(scope, replay, answer)

    async def _refuse(self, send: Any, refused: Refused) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else {}
        headers["Connection"] = "close"  # refused before its body was read: never read it
        if refused.status == 503:
            headers["Retry-After"] = "1"
        await self.reject(send, refused.status, refused.detail, headers)
