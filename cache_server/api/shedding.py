"""Load shedding: a server process works on a bounded number of requests; beyond what it can
answer in time, it says so at once (503 with ``Retry-After``) instead of letting every request
wait.

:class:`LoadShedding` (pure ASGI middleware) admits up to ``max_in_flight`` requests at a time.
One more waits for a free slot only when the slots should free up within ``max_wait`` seconds:
its expected wait is the time the requests ahead of it take (moving averages of how long admitted
requests took and of its spread: their mean plus two standard deviations of their sum), divided
by the slots. A request that would wait longer, or that waited ``max_wait`` without a slot, gets
503 with ``Retry-After`` before its body is read. The margin keeps the second kind rare, so a
refusal comes at once: with the mean alone, more than one 503 in a hundred came only after
waiting ``max_wait`` (bench/server_load.py ``--overload`` at twice the sustainable rate: 503 p99
23 ms, against 4–8 ms with the margin). Without shedding a burst above capacity queues in the
event loop and every request waits seconds (measured: 400 lookups/s against a 200/s server,
p50 21.8 s, p99 40 s).

``/health`` and ``/metrics`` have slots of their own (:data:`MONITOR_SLOTS` each, no waiting):
an overloaded server still says how it is, and a flood of them (each counts the records) cannot
take the database connections the API needs; nor can a flood of ``/metrics`` (anyone may read
it) make ``/health`` fail and a liveness probe call the server down (4 connections on
``/metrics`` did, 32 of 42 checks). So do snapshots (``/v1/snapshot``, :data:`BULK_SLOTS`):
an export's cost grows with the winners of an arch (20,000 took 22 s), and two anonymous ones
held both slots of a process, every lookup refused meanwhile (and their times would have made
the moving average shed what followed). A lookup never waits behind one. So do the dashboard's pages
(:func:`browsing`), whose cost grows with what uploaders stored (two anonymous views of the index
over records of 1.75 MB each took 10 to 15 s and every lookup of the process was refused
meanwhile). So do the API's listings (:func:`listing`: records, jobs, artifacts, a record with
its trials), a hundred times a lookup's cost: one client with no token keeping 4 connections
on ``GET /v1/jobs?limit=1000`` had 47 of 52 lookups of another refused. Listings wait for one
of their slots when they should get one within :data:`LISTING_WAIT`, from the listings' own
recent times (as the API's requests wait for theirs): daemons' warm starts list records at
once. So do writes (:func:`writing`: uploads, job claims and reports, disputes, misses): on
SQLite they wait for its one write lock, and one token's snapshot import held it for 52 s
(12,000 records in one transaction) while other tokens' uploads waited in the API's slots and
114 of 132 lookups were refused; writes now wait in theirs, and a lookup never waits behind one.
So do static files (``/ui/static/``, ``/ui/swagger/``, :func:`static`): cheap to read, but
streamed in chunks, and a chunk waits for the client to read the one before. A page loads
several at once (``/docs``: three), so one more waits for one of their slots when it should get
one within :data:`STATIC_WAIT`, from their own recent times, rather than leave a page unstyled.

A slot stands for the server's work, not for the client's reading (:class:`_Answer`): it is given
back as the answer's last body message is sent, before uvicorn's ``send`` waits for the socket to
drain. Held until the app returned, it was held for as long as a client chose not to read: two
connections with a tiny receive buffer, each pipelining ``GET /ui/swagger/swagger-ui-bundle.js``
(1.5 MB) and reading nothing, held both of the API's slots of a process, and every lookup and
upload was refused for as long as they stayed open. A streamed answer keeps its slot while it
streams, and one ``send`` waits at most :data:`SEND_SECONDS` for the client: then the connection
is given up, so a client that stops reading holds its lane's slot that long at most.

Answers made and not yet taken are bounded too (:class:`Backlog`): with the slot given back, an
answer's bytes waited in the connection's write buffer, counted by no budget, until the client
read them or ``drain_seconds`` cut it off. One client with no token opening 200 connections, each
asking for a record of 20,000 trials (15.5 MB) and reading nothing, took a server process from
310 MB to 1071 MB (snapshots of 121 MB: 520 to 1225 MB). An answer larger than :data:`CHUNK` is
now sent a chunk at a time, and uvicorn's ``send`` waits for the client to read one before it
writes the next; its bytes are charged to the process's backlog until the last is written. A
request whose answer may be large (a snapshot, a listing, a dashboard page) is refused with 503
and ``Retry-After`` before it is made while the backlog is past :data:`ANSWER_BYTES`, or its
client address's share of it past :data:`ADDRESS_ANSWER_BYTES` (one address cannot refuse
everyone's); lookups and the other small answers are never refused for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from cache_server.api.peers import client_of

MONITOR_SLOTS = 2  # each of /health and /metrics
BULK = frozenset({"/v1/snapshot"})
BULK_SLOTS = 1
BROWSE_SLOTS = 2
LISTINGS = frozenset({"/v1/records", "/v1/jobs", "/v1/artifacts"})
LISTING_SLOTS = 2
LISTING_WAIT = 2.0  # seconds a listing may wait for one of its slots
WRITE_SLOTS = 2
READS = frozenset({"/v1/lookup"})  # a POST that only reads
STATIC = ("/ui/static/", "/ui/swagger/")
STATIC_SLOTS = 4
STATIC_WAIT = 1.0  # seconds a static file may wait for one of its slots
SMOOTHING = 0.1  # weight of the newest request in the moving average of request times
RANKING_SLOTS = 2  # lookups ranking a large bucket (see LoadShedding.move) at once, at least
MOVE = "tunecache.move"  # in a request's scope["state"]: moves it to the ranking lane
# The longest one ``send`` may wait for the client to read: 64 KiB (a static file's chunk) in
# that long is 2 KiB/s, slower than any client that means to read its answer.
SEND_SECONDS = 30.0
CHUNK = 64 * 2**10  # an answer larger is sent in pieces this large, each once the last is read
# The bytes of answers made and not yet taken that a process holds before it refuses more big
# ones: several snapshots of the default bound (128 MiB), or dozens of the largest records.
ANSWER_BYTES = 256 * 2**20
ADDRESS_ANSWER_BYTES = ANSWER_BYTES // 4  # of those, what one client address may hold

logger = logging.getLogger(__name__)


def route_path(scope: dict[str, Any]) -> str:
    """The path the app routes ``scope`` by: behind a prefix (``--root-path``), uvicorn's path
    holds it too."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def _read(scope: dict[str, Any]) -> bool:
    return scope.get("method") in ("GET", "HEAD")


def browsing(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is a dashboard page (not its static files: cheap, and a page loads
    several at once)."""
    path = route_path(scope)
    page = path.startswith("/ui/") and not path.startswith(STATIC)
    return _read(scope) and (path == "/" or page)


def static(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` reads a static file of the dashboard or of Swagger UI: streamed in chunks,
    so its slot is held while the client reads (see :class:`_Answer`); never one of the API's."""
    return _read(scope) and route_path(scope).startswith(STATIC)


def writing(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` writes to the database (every method but GET and HEAD, lookups and the
    admin's tokens aside): writes wait for each other, on SQLite for its one write lock, and
    waiting in the API's slots they refused the lookups. (The admin's token calls stay in the
    API's slots: a revocation must not wait behind the writes of the token it revokes.)"""
    path = route_path(scope)
    return not _read(scope) and path not in READS and not path.startswith("/v1/tokens")


def listing(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` reads a listing of the API (records, jobs, artifacts) or a record with
    its trials (up to 20,000): reads whose cost grows with what was stored. (The admin's token
    list stays in the API's slots: an admin revoking a hostile token must not wait behind it.)"""
    path = route_path(scope)
    return _read(scope) and (path in LISTINGS or path.startswith("/v1/records/"))


class _Lane:
    """Slots for one kind of request: up to ``slots`` at a time; one more waits for a slot only
    when the slots should free up within ``max_wait`` seconds (none: refused at once), from the
    moving averages of how long its admitted requests took. A ``big`` lane's answers may be
    large: it admits none while the :class:`Backlog` is full."""

    def __init__(self, slots: int, max_wait: float, what: str = "", *, big: bool = False) -> None:
        self.slots, self.max_wait, self.what, self.big = slots, max_wait, what, big
        self.in_flight = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.seconds_per_request = 0.005  # until measured
        self.square_per_request = self.seconds_per_request**2  # their squares' moving average

    def expected_wait(self) -> float:
        """Seconds one more request would wait for a slot, from the recent times per request:
        the ``k`` requests ahead of it take ``k`` mean times, plus two standard deviations of
        their sum (``√k`` of one), so that one admitted to wait seldom waits in vain."""
        if self.in_flight < self.slots:
            return 0.0
        ahead = len(self.waiting) + 1
        spread = math.sqrt(max(self.square_per_request - self.seconds_per_request**2, 0.0))
        took = ahead * self.seconds_per_request + 2 * math.sqrt(ahead) * spread
        return took / self.slots

    async def admit(self) -> bool:
        """Takes a slot, waiting at most ``max_wait``; whether it got one."""
        if self.in_flight < self.slots:
            self.in_flight += 1
            return True
        if self.max_wait <= 0 or self.expected_wait() > self.max_wait:
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), self.max_wait)
        except TimeoutError:
            if slot.done():  # handed over just as the wait ran out: take it
                return True
            self.waiting.remove(slot)
            return False
        except asyncio.CancelledError:  # the client went away while waiting
            if slot.done():
                self.release(None)  # the slot handed over: pass it on
            else:
                self.waiting.remove(slot)
            raise
        return True

    def release(self, took: float | None) -> None:
        """Counts a request that took ``took`` seconds in the averages and hands its slot to the
        first request still waiting, else frees it."""
        if took is not None:
            self.seconds_per_request += SMOOTHING * (took - self.seconds_per_request)
            self.square_per_request += SMOOTHING * (took * took - self.square_per_request)
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self.in_flight -= 1

    def busy(self) -> str:
        what = f"{self.what} " if self.what else ""
        return f"{self.in_flight} {what}requests in progress, {len(self.waiting)} waiting"


class Backlog:
    """The bytes of answers made and not yet taken by their clients, in all and by client address
    (see the module doc). One event loop charges it: no lock.

    Args:
        limit: past this many bytes held, no big answer is made.
        address_limit: likewise, for the answers to one client address.
    """

    def __init__(
        self, limit: int = ANSWER_BYTES, address_limit: int = ADDRESS_ANSWER_BYTES
    ) -> None:
        self.limit, self.address_limit = limit, address_limit
        self.held = 0
        self.by_address: dict[str, int] = {}

    def full(self, address: str) -> str | None:
        """Why no big answer may be made for ``address`` now (``None``: one may). Each address
        counts toward the process's limit with its share at most: one address's unread
        answers (``/openapi.json`` on thousands of connections, whose lane is never refused)
        must not refuse everyone's."""
        shares = sum(min(held, self.address_limit) for held in self.by_address.values())
        if shares >= self.limit:
            return f"{self.held} bytes of answers wait for their clients to read them"
        mine = self.by_address.get(address, 0)
        if mine >= self.address_limit:
            return f"{mine} bytes of answers wait for clients at this address to read them"
        return None

    def add(self, address: str, size: int) -> None:
        """Charges ``size`` bytes (given back: negative) to ``address``."""
        self.held += size
        left = self.by_address.get(address, 0) + size
        if left:
            self.by_address[address] = left
        else:  # an address that holds nothing is not kept
            self.by_address.pop(address, None)


class ClientNotReading(Exception):
    """Raised to the app from a ``send`` whose client took nothing for :data:`SEND_SECONDS`: the
    app stops making the answer, and uvicorn closes the connection."""


class _Answer:
    """The ``send`` of one admitted request, giving its slot back (once) when the answer is made.

    uvicorn's ``send`` first waits for what was written before to drain: a client that does not
    read makes it wait for ever. So the slot is given back as the last body message is sent,
    before that ``send`` is awaited, and ``http.response.start`` is held back until the first
    body message: an answer in one message (every answer of the API) is then sent with no slot
    held, even behind an unread answer to an earlier request pipelined on its connection (there
    the start waits). A streamed answer (a static file, read from disk a chunk at a time) keeps
    its slot until its last chunk, and while it does a ``send`` waits at most
    :data:`SEND_SECONDS`; then the app is stopped (:class:`ClientNotReading`).

    A ``send`` with no slot held waits as long as the client takes: giving up there would free
    nothing (uvicorn's close waits for what it buffered to drain, so the connection stays until
    the client goes), and a start given up before uvicorn took it made uvicorn send a 500 over it,
    then log a traceback when the client left. Such a start is sent after the slot is given
    back (:meth:`finish`): uvicorn's ``send`` waits for the drain before it writes anything.

    A body larger than :data:`CHUNK` is sent in pieces, charged to ``backlog`` (as ``address``'s)
    until the last is written: uvicorn's ``send`` writes a message whole, whatever the client has
    read, and waits for the client only before the next.
    """

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]], lane: _Lane,
                 backlog: Backlog, address: str) -> None:  # fmt: skip
        self.downstream, self.lane = send, lane
        self.backlog, self.address = backlog, address
        self.started = time.perf_counter()
        self.held = True
        self.head: dict[str, Any] | None = None  # the start, until it is sent
        self.given_up = False

    def release(self) -> None:
        """Gives the slot back, counting how long it was held; at most once."""
        if self.held:
            self.held = False
            self.lane.release(time.perf_counter() - self.started)

    async def send(self, message: dict[str, Any]) -> None:
        if self.given_up:
            raise ClientNotReading(f"the client took nothing for {SEND_SECONDS:g} s")
        if message["type"] == "http.response.start":
            self.head = message
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.release()
        await self._bounded(self.head)
        self.head = None
        body = message.get("body", b"")
        if message["type"] != "http.response.body" or len(body) <= CHUNK:
            await self._bounded(message)
            return
        more = bool(message.get("more_body", False))
        self.backlog.add(self.address, len(body))
        try:
            whole = memoryview(body)
            for start in range(0, len(body), CHUNK):
                end = start + CHUNK
                piece = {"type": "http.response.body", "body": bytes(whole[start:end]),
                         "more_body": more or end < len(body)}  # fmt: skip
                await self._bounded(piece)
        finally:
            self.backlog.add(self.address, -len(body))

    async def finish(self) -> None:
        """Gives the slot back, then sends the start if it is still held back (the app ended
        without a body, or the client took nothing before the start)."""
        self.release()
        if self.head is not None:
            head, self.head = self.head, None
            await self.downstream(head)

    async def _bounded(self, message: dict[str, Any] | None) -> None:
        if message is None:
            return
        if not self.held:
            await self.downstream(message)
            return
        try:
            async with asyncio.timeout(SEND_SECONDS):
                await self.downstream(message)
        except TimeoutError:
            self.given_up = True
            raise ClientNotReading(f"the client took nothing for {SEND_SECONDS:g} s") from None


def _on(paths: frozenset[str]) -> Callable[[dict[str, Any]], bool]:
    return lambda scope: route_path(scope) in paths


class LoadShedding:
    """Answers 503 to what this process cannot start within ``max_wait`` (see the module doc).

    Args:
        app: the ASGI app.
        max_in_flight: API requests worked on at once (:attr:`api`).
        max_wait: seconds an API request may wait for a slot.
        retry_after: seconds a shed request is told to wait (``Retry-After``).
        reject: sends an error answer ``(send, status, detail, headers)``.
        backlog: the answers made and not yet taken (default: :data:`ANSWER_BYTES`'s).
    """

    def __init__(self, app: Any, *, max_in_flight: int, max_wait: float, retry_after: int,
                 reject: Callable[..., Awaitable[None]],
                 backlog: Backlog | None = None) -> None:  # fmt: skip
        self.app, self.reject, self.retry_after = app, reject, retry_after
        self.backlog = Backlog() if backlog is None else backlog
        self.api = _Lane(max_in_flight, max_wait)
        # requests on slots of their own: which, and their lane
        self.sides = [(_on(frozenset({"/health"})), _Lane(MONITOR_SLOTS, 0, "health")),
                      (_on(frozenset({"/metrics"})), _Lane(MONITOR_SLOTS, 0, "metrics")),
                      (_on(BULK), _Lane(BULK_SLOTS, 0, "snapshot", big=True)),
                      (writing, _Lane(WRITE_SLOTS, max_wait, "write")),
                      (browsing, _Lane(BROWSE_SLOTS, 0, "dashboard page", big=True)),
                      (static, _Lane(STATIC_SLOTS, STATIC_WAIT, "static file")),
                      (listing, _Lane(LISTING_SLOTS, LISTING_WAIT, "listing",
                                      big=True))]  # fmt: skip
        self.ranking = _Lane(max(RANKING_SLOTS, max_in_flight), max_wait, "bucket ranking")

    def lane(self, scope: dict[str, Any]) -> _Lane:
        """The lane ``scope`` is admitted in."""
        return next((lane for takes, lane in self.sides if takes(scope)), self.api)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lane = self.lane(scope)
        client = scope.get("client")
        address = client_of(client[0]) if client else ""
        busy = await self._admit(lane, address)
        if busy is not None:
            detail = f"the server is busy ({busy}); retry in {self.retry_after} s"
            await self.reject(send, 503, detail, {"Retry-After": str(self.retry_after)})
            return
        answer = _Answer(send, lane, self.backlog, address)
        scope.setdefault("state", {})[MOVE] = lambda: self.move(answer)
        try:
            await self.app(scope, receive, answer.send)
        except ClientNotReading as exc:
            # One line, not a traceback per connection: returning with the answer unfinished,
            # uvicorn closes the connection (and logs one line of its own).
            logger.warning("gave up on %s %s: %s", scope["method"], route_path(scope), exc)
        finally:
            answer.release()
        await answer.finish()

    async def move(self, answer: _Answer) -> str | None:
        """Moves an admitted API request to the ranking lane (its slot given back, one taken
        there); why not, when none is had. A lookup ranking a large shape bucket calls it, from
        its route (``scope["state"][MOVE]``): an anonymous client's lookups of a bucket of 2,000
        winners, 80 ms each, held the API's slots and 137 of 148 lookups of another were
        refused; ranking in a lane of its own, they hold none of the API's."""
        answer.release()
        if not await self.ranking.admit():
            return self.ranking.busy()
        answer.lane, answer.started, answer.held = self.ranking, time.perf_counter(), True
        return None

    async def _admit(self, lane: _Lane, address: str) -> str | None:
        """Takes a slot of ``lane`` for a request of ``address``; why not, when none is had."""
        if lane.big and (full := self.backlog.full(address)) is not None:
            return full
        if not await lane.admit():
            return lane.busy()
        if lane.big and (full := self.backlog.full(address)) is not None:  # filled meanwhile
            lane.release(None)
            return full
        return None
