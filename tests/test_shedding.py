"""Load shedding, at the middleware: a bounded number of requests in flight, a bounded wait for a
slot, a fast 503 with ``Retry-After`` for the rest, and monitoring in slots of its own.

The app behind the middleware is a stand-in that holds each request until told to finish: what
is under test is the middleware's admission, which a real server's timing would make flaky.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from cache_server.api import shedding as shedding_module
from cache_server.api.problems import send as send_error
from cache_server.api.shedding import (
    BROWSE_SLOTS,
    BULK_SLOTS,
    LISTING_SLOTS,
    MONITOR_SLOTS,
    STATIC_SLOTS,
    WRITE_SLOTS,
    LoadShedding,
    browsing,
    listing,
    static,
    writing,
)


class Held:
    """An ASGI app that answers 200 once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.started += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class HeldWhere(Held):
    """:class:`Held` for the requests ``holds`` picks; the others are answered 200 at once."""

    def __init__(self, holds: Callable[[dict[str, Any]], bool]) -> None:
        super().__init__()
        self.holds = holds

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.holds(scope):
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(
    app: Any, path: str = "/v1/lookup", method: str = "POST"
) -> tuple[int, dict[bytes, bytes], float]:
    """One request through ``app``: its status, headers and seconds."""
    answer: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.update(status=message["status"], headers=dict(message["headers"]))

    started = time.perf_counter()
    await app({"type": "http", "path": path, "method": method, "headers": []}, receive, send)
    return answer["status"], answer["headers"], time.perf_counter() - started


# A refusal "at once" is told from one that waited by a wait far longer than any busy machine's
# delay (a refusal took 15 ms beside a CI run, against a 10 ms bound): these tests' requests may
# wait WAIT seconds, and one refused at once takes under AT_ONCE.
WAIT = 4.0
AT_ONCE = WAIT / 4


def shedding(inner: Any, slots: int, wait: float) -> LoadShedding:
    return LoadShedding(inner, max_in_flight=slots, max_wait=wait, retry_after=2,
                        reject=send_error)  # fmt: skip


def test_beyond_its_slots_a_request_waits_a_little_then_gets_503() -> None:
    async def run() -> None:
        held = Held()
        app = shedding(held, slots=2, wait=0.05)
        first = [asyncio.create_task(call(app)) for _ in range(2)]
        await asyncio.sleep(0.01)
        status, headers, seconds = await call(app)  # both slots held
        assert status == 503 and headers[b"retry-after"] == b"2"
        assert seconds < AT_ONCE  # waited its 0.05 s at most, not for the slots (held)
        held.release.set()
        assert [(await t)[0] for t in first] == [200, 200]
        assert (await call(app))[0] == 200  # slots given back
        assert app.api.in_flight == 0 and not app.api.waiting

    asyncio.run(run())


def test_a_request_that_would_wait_too_long_is_refused_without_waiting() -> None:
    async def run() -> None:
        held = Held()
        app = shedding(held, slots=1, wait=WAIT)
        app.api.seconds_per_request = 20 * WAIT  # requests have been taking that long each
        holder = asyncio.create_task(call(app))
        await asyncio.sleep(0.01)
        status, _, seconds = await call(app)
        assert status == 503 and seconds < AT_ONCE  # no wait: it could not start in WAIT
        held.release.set()
        await holder

    asyncio.run(run())


def test_requests_of_erratic_times_are_refused_at_once_not_after_waiting() -> None:
    """The same mean time, a wide spread: a wait the mean alone would promise within
    ``max_wait`` is refused at once, not after waiting ``max_wait`` in vain."""

    async def admitted_to_wait(spread: float) -> bool:
        held = Held()
        app = shedding(held, slots=1, wait=WAIT)
        mean = 0.6 * WAIT  # a slot frees in that long on average, under WAIT
        app.api.seconds_per_request = mean
        app.api.square_per_request = mean**2 + (spread * WAIT) ** 2
        holder = asyncio.create_task(call(app))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(call(app))
        await asyncio.sleep(0.01)
        waited = len(app.api.waiting) == 1
        held.release.set()
        await holder
        status, _, seconds = await second
        assert status == 200 if waited else (status == 503 and seconds < AT_ONCE)
        return waited

    async def run() -> None:
        assert await admitted_to_wait(spread=0.0)  # always 0.6 WAIT: it waits for the slot
        assert not await admitted_to_wait(spread=0.4)  # give or take 0.4 WAIT: refused at once

    asyncio.run(run())


async def one_held_one_waiting(wait: float) -> tuple[Held, LoadShedding, Any, Any]:
    """One slot: a request holding it and one waiting for it (as tasks)."""
    held = Held()
    app = shedding(held, slots=1, wait=wait)
    holder = asyncio.create_task(call(app))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(call(app))
    await asyncio.sleep(0.01)
    assert len(app.api.waiting) == 1
    return held, app, holder, waiter


def test_a_waiting_request_gets_the_slot_handed_over() -> None:
    async def run() -> None:
        held, app, holder, waiter = await one_held_one_waiting(1.0)
        held.release.set()
        assert (await holder)[0] == 200 and (await waiter)[0] == 200
        assert app.api.in_flight == 0

    asyncio.run(run())


def test_a_client_gone_while_waiting_leaks_no_slot() -> None:
    async def run() -> None:
        held, app, holder, gone = await one_held_one_waiting(5.0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        held.release.set()
        await holder
        assert app.api.in_flight == 0 and not app.api.waiting
        assert (await call(app))[0] == 200

    asyncio.run(run())


def test_health_has_slots_of_its_own() -> None:
    """A flood of /health (each counts the records) neither takes the API's slots nor all the
    database connections: beyond its own slots it is refused at once."""

    async def run() -> None:
        held = Held()
        app = shedding(held, slots=1, wait=WAIT)
        checks = [asyncio.create_task(call(app, "/health")) for _ in range(MONITOR_SLOTS)]
        await asyncio.sleep(0.01)
        status, _, seconds = await call(app, "/health")
        assert status == 503 and seconds < AT_ONCE
        assert app.api.in_flight == 0  # the API's slot is free
        held.release.set()
        assert [(await t)[0] for t in checks] == [200] * MONITOR_SLOTS
        assert (await call(app))[0] == 200

    asyncio.run(run())


def test_a_snapshot_never_holds_the_slots_lookups_need() -> None:
    """Two anonymous exports of 20,000 winners (22 s each) held both of a process's slots and
    every lookup got 503 meanwhile: snapshots have a slot of their own, and a lookup is
    admitted beside one; one more snapshot is refused at once."""

    async def run() -> None:
        held = HeldWhere(lambda scope: scope["path"] == "/v1/snapshot")
        app = shedding(held, slots=2, wait=WAIT)
        exports = [asyncio.create_task(call(app, "/v1/snapshot")) for _ in range(BULK_SLOTS)]
        await asyncio.sleep(0.01)
        status, _, seconds = await call(app, "/v1/snapshot")
        assert status == 503 and seconds < AT_ONCE
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4  # lookups: answered
        held.release.set()
        assert [(await t)[0] for t in exports] == [200] * BULK_SLOTS

    asyncio.run(run())


def test_browsing_never_holds_the_slots_lookups_need() -> None:
    """Two anonymous views of a dashboard page over records of 1.75 MB each (10 to 15 s) held
    both of a process's slots and every lookup got 503 meanwhile: pages have slots of their
    own, one more is refused at once, and uploads are not among them."""

    async def run() -> None:
        held = HeldWhere(browsing)
        app = shedding(held, slots=2, wait=WAIT)
        paths = ["/", "/ui/jobs", "/ui/records/3"][:BROWSE_SLOTS]
        views = [asyncio.create_task(call(app, path, "GET")) for path in paths]
        await asyncio.sleep(0.01)
        status, _, seconds = await call(app, "/ui/records/7", "GET")
        assert status == 503 and seconds < AT_ONCE
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4  # lookups: answered
        assert (await call(app, "/v1/records"))[0] == 200  # an upload: the API's slots
        held.release.set()
        assert [(await t)[0] for t in views] == [200] * BROWSE_SLOTS

    asyncio.run(run())


def test_what_browses_and_what_lists() -> None:
    def scope(method: str, path: str, root: str = "") -> dict[str, Any]:
        return {"type": "http", "method": method, "path": root + path, "root_path": root}

    assert all(browsing(scope("GET", p)) for p in ("/", "/ui/jobs", "/ui/records/3"))
    assert browsing(scope("HEAD", "/"))
    # Behind a prefix, uvicorn's path holds it: the page is still a page.
    assert browsing(scope("GET", "/", "/tc")) and browsing(scope("GET", "/ui/jobs", "/tc"))
    lists = [("GET", "/v1/jobs"), ("GET", "/v1/records"), ("GET", "/v1/records/3"),
             ("GET", "/v1/artifacts"), ("HEAD", "/v1/records")]  # fmt: skip
    assert all(listing(scope(m, p)) for m, p in lists)
    assert listing(scope("GET", "/v1/jobs", "/tc"))
    neither = [("POST", "/v1/records"), ("POST", "/v1/records/3/disputes"), ("POST", "/v1/lookup"),
               ("GET", "/v1/jobs/3"), ("POST", "/v1/jobs/claim"), ("PUT", "/v1/artifacts"),
               ("GET", "/v1/tokens"),
               ("GET", "/health"), ("GET", "/ui/static/dashboard.css"),
               ("GET", "/ui/swagger/swagger-ui-bundle.js")]  # fmt: skip
    assert not any(browsing(scope(m, p)) or listing(scope(m, p)) for m, p in neither)
    assert not any(browsing(scope(m, p)) for m, p in lists)
    files = [("GET", "/ui/static/dashboard.css"), ("GET", "/ui/swagger/swagger-ui-bundle.js"),
             ("HEAD", "/ui/swagger/swagger-ui.css")]  # fmt: skip
    assert all(static(scope(m, p)) for m, p in files) and static(scope(*files[0], "/tc"))
    assert not any(static(scope(m, p)) for m, p in [*lists, ("GET", "/ui/jobs"), ("GET", "/")])
    # ``/health`` behind a prefix is still in monitoring's slots.
    from cache_server.api.shedding import route_path

    assert route_path(scope("GET", "/health", "/tc")) == "/health"


def test_listings_never_hold_the_slots_lookups_need() -> None:
    """One client with no token kept 4 connections on ``GET /v1/jobs?limit=1000`` and 47 of
    52 lookups of another were refused: listings have slots of their own; one more waits for
    one of them (a listing's time, not a lookup's), and lookups are answered meanwhile."""

    async def run() -> None:
        held = HeldWhere(listing)
        app = shedding(held, slots=2, wait=WAIT)
        lists = [asyncio.create_task(call(app, "/v1/jobs", "GET")) for _ in range(LISTING_SLOTS)]
        await asyncio.sleep(0.01)
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4  # lookups: answered
        more = asyncio.create_task(call(app, "/v1/records", "GET"))
        await asyncio.sleep(0.01)
        assert not more.done()  # waiting for a listing's slot
        held.release.set()
        assert [(await t)[0] for t in [*lists, more]] == [200] * (LISTING_SLOTS + 1)
        assert app.api.in_flight == 0

    asyncio.run(run())


def test_writes_waiting_for_the_database_never_hold_the_slots_lookups_need() -> None:
    """One token's snapshot import held SQLite's write lock for 52 s; other tokens' uploads
    waited for it in the API's slots, and 114 of 132 lookups were refused. Writes have slots
    of their own: lookups, and an admin's token calls, are answered while they wait."""

    async def run() -> None:
        held = HeldWhere(writing)
        app = shedding(held, slots=2, wait=WAIT)
        writes = [asyncio.create_task(call(app, p)) for p in ("/v1/records", "/v1/jobs/claim")]
        await asyncio.sleep(0.01)
        assert len(writes) == WRITE_SLOTS and held.started == WRITE_SLOTS
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4  # lookups: answered
        assert (await call(app, "/v1/tokens/3", "DELETE"))[0] == 200  # a revocation too
        held.release.set()
        assert [(await t)[0] for t in writes] == [200] * WRITE_SLOTS
        assert app.api.in_flight == 0

    asyncio.run(run())
    scope = {"type": "http", "path": "/v1/records/3/disputes", "method": "POST", "root_path": ""}
    assert writing(scope) and not writing({**scope, "path": "/v1/lookup"})
    assert not writing({**scope, "method": "GET", "path": "/v1/records"})


def test_a_metrics_flood_never_fails_the_health_check() -> None:
    """Four connections on ``/metrics`` (anyone may read it) made 32 of 42 health checks 503:
    a liveness probe would have called the server down. Each has slots of its own."""

    async def run() -> None:
        held = HeldWhere(lambda scope: scope["path"] == "/metrics")
        app = shedding(held, slots=1, wait=0.05)
        flood = [asyncio.create_task(call(app, "/metrics", "GET")) for _ in range(MONITOR_SLOTS)]
        await asyncio.sleep(0.01)
        assert (await call(app, "/metrics", "GET"))[0] == 503  # one more: refused at once
        assert [(await call(app, "/health", "GET"))[0] for _ in range(4)] == [200] * 4
        held.release.set()
        assert [(await t)[0] for t in flood] == [200] * MONITOR_SLOTS

    asyncio.run(run())


class Streamed:
    """An ASGI app that streams ``chunks`` body messages, then the last one (as a static file
    is sent, a chunk at a time), counting the messages it sent."""

    def __init__(self, chunks: int = 4) -> None:
        self.chunks, self.sent = chunks, 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(self.chunks):
            await send({"type": "http.response.body", "body": b"x" * 100, "more_body": True})
            self.sent += 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.sent += 1


class Unread:
    """The ``send`` of a connection whose client stopped reading after ``taken`` messages: the
    next waits until ``reads`` is set (uvicorn's ``send`` waits so for the socket to drain)."""

    def __init__(self, taken: int = 0) -> None:
        self.taken, self.reads = taken, asyncio.Event()
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if len(self.messages) >= self.taken:
            await self.reads.wait()
        self.messages.append(message)


async def unread_call(app: Any, unread: Unread, path: str = "/v1/lookup") -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    await app({"type": "http", "path": path, "method": "GET", "headers": []}, receive, unread)


def test_an_answer_its_client_does_not_read_holds_no_slot() -> None:
    """Two connections pipelining requests and reading none of the answers held both of a
    process's slots (each until ``send`` returned) and every lookup got 503: the slot is given
    back as the answer is made, before the client takes it."""

    async def run() -> None:
        held = Held()
        held.release.set()  # answers at once, in one message, as every answer of the API
        app = shedding(held, slots=1, wait=0.05)
        unread = Unread()
        stuck = asyncio.create_task(unread_call(app, unread))
        await asyncio.sleep(0.05)
        assert not stuck.done() and app.api.in_flight == 0
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4
        unread.reads.set()
        await stuck
        assert [m["type"] for m in unread.messages] == ["http.response.start", "http.response.body"]
        assert app.api.in_flight == 0

    asyncio.run(run())


def test_a_client_gone_while_its_answer_is_unread_gives_the_slot_back_once() -> None:
    async def run() -> None:
        held = Held()
        held.release.set()
        app = shedding(held, slots=1, wait=WAIT)
        stuck = asyncio.create_task(unread_call(app, Unread()))
        await asyncio.sleep(0.05)
        assert app.api.in_flight == 0  # given back as the answer was made
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        assert app.api.in_flight == 0 and not app.api.waiting  # and not once more
        assert (await call(app))[0] == 200 and app.api.in_flight == 0

    asyncio.run(run())


def test_an_app_failing_after_its_answer_gives_the_slot_back_once() -> None:
    async def run() -> None:
        after = asyncio.Event()

        async def answers_then_fails(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            await after.wait()
            raise RuntimeError("after the answer")

        app = shedding(answers_then_fails, slots=1, wait=WAIT)
        failing = asyncio.create_task(call(app))
        await asyncio.sleep(0.05)
        assert app.api.in_flight == 0
        after.set()
        with pytest.raises(RuntimeError):
            await failing
        assert app.api.in_flight == 0

    asyncio.run(run())


def test_a_streamed_answer_holds_its_slot_while_it_streams_and_no_longer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that stops reading a streamed answer holds its slot ``SEND_SECONDS`` at most:
    then the app is stopped and the connection left to uvicorn to close, with one line logged."""
    monkeypatch.setattr(shedding_module, "SEND_SECONDS", 0.3)

    async def run() -> None:
        streamed = Streamed()
        app = shedding(streamed, slots=1, wait=0.05)
        unread = Unread(taken=2)  # the start and the first chunk, then nothing
        stuck = asyncio.create_task(unread_call(app, unread))
        await asyncio.sleep(0.05)
        assert app.api.in_flight == 1 and (await call(app))[0] == 503  # streaming: held
        await asyncio.wait_for(stuck, WAIT)  # given up, not raised to uvicorn
        assert app.api.in_flight == 0 and streamed.sent == 1  # stopped at the unread chunk
        assert (await call(app))[0] == 200

    with caplog.at_level("WARNING", logger="cache_server.api.shedding"):
        asyncio.run(run())
    assert [r.getMessage() for r in caplog.records] == [
        "gave up on GET /v1/lookup: the client took nothing for 0.3 s"
    ]


def test_a_streamed_answer_given_up_before_it_started_is_started_without_a_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind an unread answer to a request pipelined before it, even its start waits: given
    up, it is sent once the client reads (or leaves), with no slot held, so that uvicorn does
    not answer 500 over it."""
    monkeypatch.setattr(shedding_module, "SEND_SECONDS", 0.3)

    async def run() -> None:
        streamed = Streamed()
        app = shedding(streamed, slots=1, wait=0.05)
        unread = Unread()
        stuck = asyncio.create_task(unread_call(app, unread))
        await asyncio.sleep(0.6)
        assert app.api.in_flight == 0 and streamed.sent == 0 and not stuck.done()
        assert (await call(app))[0] == 200
        unread.reads.set()
        await asyncio.wait_for(stuck, WAIT)
        assert [m["type"] for m in unread.messages] == ["http.response.start"]

    asyncio.run(run())


def test_static_files_never_hold_the_slots_lookups_need() -> None:
    """Streamed to a client that may not read them, static files have slots of their own."""

    async def run() -> None:
        held = HeldWhere(static)
        app = shedding(held, slots=2, wait=WAIT)
        path = "/ui/swagger/swagger-ui-bundle.js"
        files = [asyncio.create_task(call(app, path, "GET")) for _ in range(STATIC_SLOTS)]
        await asyncio.sleep(0.01)
        assert app.api.in_flight == 0
        assert [(await call(app))[0] for _ in range(4)] == [200] * 4  # lookups: answered
        held.release.set()
        assert [(await t)[0] for t in files] == [200] * STATIC_SLOTS

    asyncio.run(run())


def test_lookups_ranking_a_large_bucket_never_hold_the_slots_lookups_need() -> None:
    """An anonymous client's lookups of a bucket of 2,000 winners (80 ms each) held the API's
    slots, and 137 of 148 lookups of another were refused: a lookup about to rank a large
    bucket moves to a lane of its own (scope["state"][MOVE]), giving its API slot back."""

    class Ranks(Held):
        """Lookups to ``/v1/lookup?rank`` move, as the route does, then are held."""

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("query_string") == b"rank":
                busy = await scope["state"][shedding_module.MOVE]()
                if busy is not None:
                    await send_error(send, 503, f"the server is busy ({busy})", {})
                    return
                await super().__call__(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    async def ranking(app: Any) -> int:
        answer: dict[str, Any] = {}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]

        scope = {"type": "http", "path": "/v1/lookup", "method": "POST", "headers": [],
                 "query_string": b"rank"}  # fmt: skip
        await app(scope, receive, send)
        return int(answer["status"])

    async def run() -> None:
        held = Ranks()
        app = shedding(held, slots=2, wait=0.0)
        ranks = [asyncio.create_task(ranking(app)) for _ in range(shedding_module.RANKING_SLOTS)]
        await asyncio.sleep(0.05)
        assert app.api.in_flight == 0 and app.ranking.in_flight == shedding_module.RANKING_SLOTS
        status, _, seconds = await call(app)  # an exact lookup: an API slot at once
        assert status == 200 and seconds < AT_ONCE
        assert await ranking(app) == 503  # the ranking lane is full: refused there
        assert app.api.in_flight == 0
        held.release.set()
        assert [await t for t in ranks] == [200] * shedding_module.RANKING_SLOTS
        assert app.ranking.in_flight == 0 and app.api.in_flight == 0  # each slot given back once

    asyncio.run(run())
