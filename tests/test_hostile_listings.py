"""What a hostile server lists cannot make a client read without bound: every answer's arrays and
objects are counted before it is parsed (a listing of 8 MiB of empty lists took 29 s and 4.9 GB,
one of 32 MiB 10 GB), and a read of many pages stops at a bound in records and bytes (a server
answering every page with a thousand records and a count of a billion grew ``tunecache report``
by 12 MB a page, ``coverage`` by 6 MB a page of new jobs).

The servers are hostile at the socket (:mod:`tests.hostile`), as in
:mod:`tests.test_hostile_answers`; each test asserts the refusal or the stop, not the memory.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import tunecache.answers
import tunecache_cli.job_reads
from tests.factories import make_key, make_record
from tests.hostile import Request, Seen, answer, serve
from tunecache import Client, ServerError
from tunecache.answers import LISTED_PAGE_CONTAINERS, job_page, record_page
from tunecache.pages import fetch_first
from tunecache.schemas import KeyModel, RecordCreate, RecordList

SECONDS = 30.0  # a deadline, not a speed: a loaded 2-core machine builds and reads the pages
REFUSED = r"JSON arrays and objects \(or brackets\), where at most [\d,]+ are read"


def _record(record_id: int = 7, **changes: Any) -> dict[str, Any]:
    """A record as a server answers it, with ``changes`` to its fields."""
    data = make_record(make_key()).model_dump(mode="json", by_alias=True)
    return {**data, "id": record_id, "key_hash": "0" * 64,
            "created_at": "2026-01-01T00:00:00Z", **changes}  # fmt: skip


def _job(job_id: int) -> dict[str, Any]:
    """A queued job as a server lists it, of a key of its own."""
    key = KeyModel.from_key(make_key(m=job_id)).model_dump(mode="json", by_alias=True)
    return {"id": job_id, "key_hash": f"{job_id:064x}", "key": key, "state": "queued",
            "priority": 0, "source": "api", "attempts": 0, "max_attempts": 3,
            "lease_owner": None, "lease_expires_at": None, "error": "", "record_id": None,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}  # fmt: skip


def _query(request: Request) -> dict[str, int]:
    return {k: int(v[0]) for k, v in parse_qs(urlsplit(request.path).query).items()
            if v[0].isdigit()}  # fmt: skip


def _send(conn: socket.socket, body: Any) -> None:
    answer(conn, 200, json.dumps(body, separators=(",", ":")).encode())


def lists_everywhere(lists: int) -> Callable[[socket.socket, Request, Seen], None]:
    """A server whose every answer is well formed (where its shape has room for it) and holds
    ``lists`` empty lists more."""
    junk = [[]] * lists

    def behave(conn: socket.socket, request: Request, seen: Seen) -> None:
        path = urlsplit(request.path).path
        if path == "/v1/records":
            _send(conn, {"items": [_record(config={"a": junk})], "count": 1})
        elif path.startswith("/v1/records/"):
            _send(conn, _record(config={"a": junk}))
        elif path == "/v1/snapshot":
            record = {k: v for k, v in _record(config={"a": junk}).items()
                      if k in RecordCreate.model_fields}  # fmt: skip
            _send(conn, {"format": "tunecache-snapshot/1", "filters": {"device_arch": "x"},
                         "records": [record]})  # fmt: skip
        elif path == "/health":
            _send(conn, {"status": "ok", "database": "x", "records": 1, "version": "1",
                         "extra": junk})  # fmt: skip
        else:  # jobs: a job has no room for them, but a server may send them all the same
            _send(conn, {**_job(1), "extra": junk})

    return behave


CALLS: dict[str, Callable[[Client], Any]] = {
    "records": lambda c: c.list_records(limit=1000),
    "a few records": lambda c: c.list_records(limit=2),
    "record": lambda c: c.get_record(7),
    "snapshot": lambda c: c.export_snapshot("cpu-avx2"),
    "health": lambda c: c.health(),
    "jobs": lambda c: c.list_jobs(limit=1000),
    "claimed job": lambda c: c.claim_job("w"),
    "heartbeat": lambda c: c.heartbeat_job(1, "w"),
}
# Lists past each call's bound (the record's and the snapshot's lowered below: theirs are
# millions, as a real server's uploads and snapshots may hold).
LISTS = {"records": LISTED_PAGE_CONTAINERS, "a few records": record_page(2), "record": 20_000,
         "snapshot": 20_000, "health": 1024, "jobs": job_page(1000), "claimed job": 1024,
         "heartbeat": 1024}  # fmt: skip


@pytest.mark.parametrize("call", CALLS)
def test_an_answer_of_too_many_lists_is_refused_before_it_is_parsed(
    call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listings, records, snapshots, jobs and ``/health`` were parsed whatever they held."""
    monkeypatch.setattr(tunecache.answers, "RECORD_CONTAINERS", 10_000)
    monkeypatch.setattr(tunecache.answers, "SNAPSHOT_CONTAINERS", 10_000)
    with (
        serve(lists_everywhere(LISTS[call] + 1)) as (url, _),
        Client(url, timeout=SECONDS, token="t" * 40) as client,
        pytest.raises(ServerError, match=REFUSED),
    ):
        CALLS[call](client)


def test_a_real_big_page_is_read() -> None:
    """The bounds leave room: a page of 1,000 records with a MetaSchedule trace's worth of lists
    each (a real page held 108,666 containers) and a page of 1,000 jobs are read."""
    trace = [[["Split", ["l1", "None"], [], ["l2", "l3"]]] * 18, [[0, [1, 2]]] * 4]
    records = [_record(i, config={"schedule": "meta_schedule", "trace": trace})
               for i in range(1, 1001)]  # fmt: skip
    jobs = [_job(i) for i in range(1, 1001)]

    def real(conn: socket.socket, request: Request, seen: Seen) -> None:
        wanted = records if request.path.startswith("/v1/records") else jobs
        _send(conn, {"items": wanted, "count": len(wanted)})

    with serve(real) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        assert len(client.list_records(limit=1000).items) == 1000
        assert len(client.list_jobs(limit=1000).items) == 1000


def endless_records(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Every page as large as asked, of records read before, and a count of a billion."""
    query = _query(request)
    record = _record()
    items = [{**record, "id": query.get("offset", 0) + i + 1} for i in range(query["limit"])]
    _send(conn, {"items": items, "count": 10**9})


def _read_endless(caplog: pytest.LogCaptureFixture, **bounds: Any) -> tuple[RecordList, Seen]:
    """What :func:`fetch_first` reads of :func:`endless_records`, with ``bounds``."""
    with (
        serve(endless_records) as (url, seen),
        Client(url, timeout=SECONDS, token="") as client,
        caplog.at_level(logging.WARNING),
    ):
        return fetch_first(client, None, **bounds), seen


def test_a_listing_that_never_ends_stops_at_a_bound_in_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found, seen = _read_endless(caplog, max_records=250, page=100)
    assert len(found.items) == 250 and found.count == 10**9
    assert len(seen.requests) == 3
    assert "read 250 of the 1,000,000,000 records" in caplog.text
    assert "at most 250 records" in caplog.text


def test_a_listing_that_never_ends_stops_at_a_bound_in_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found, seen = _read_endless(caplog, page=10, max_bytes=100_000)
    assert 0 < len(found.items) < 100 and len(seen.requests) < 12  # pages of ~20 KB
    assert "at most 100,000 bytes" in caplog.text
    with serve(endless_records) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        assert len(fetch_first(client, 25, page=10).items) == 25  # a limit is no bound's stop


def endless_jobs(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Every page as large as asked, of jobs of new keys, and a count of a billion."""
    query = _query(request)
    first = query.get("offset", 0) + 1
    _send(conn, {"items": [_job(i) for i in range(first, first + query["limit"])],
                 "count": 10**9})  # fmt: skip


@pytest.mark.parametrize("bound", ["MAX_JOBS", "MAX_JOB_BYTES"])
def test_a_job_queue_that_never_ends_is_refused_at_a_bound(
    bound: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``coverage`` and ``pretune`` read the whole queue: one of new jobs on every page grew
    them by 6 MB a page, for 1,000 pages."""
    monkeypatch.setattr(tunecache_cli.job_reads, bound, 2500 if bound == "MAX_JOBS" else 1 << 20)
    with (
        serve(endless_jobs) as (url, seen),
        Client(url, timeout=SECONDS, token="") as client,
        pytest.raises(ServerError, match=r"lists over .* more than one read holds"),
    ):
        tunecache_cli.job_reads.all_jobs(client)
    assert len(seen.requests) <= 3


def numbers_where_items_belong(count: int) -> Callable[[socket.socket, Request, Seen], None]:
    """A server whose every listing holds ``count`` numbers where its items belong: one
    container, but an error each (a million took 11 s and 1.7 GB of a 2 MiB answer)."""
    body = b'{"items":[' + b",".join([b"1"] * count) + b'],"count":1}'

    def behave(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 200, body)

    return behave


LISTINGS: dict[str, Callable[[Client], Any]] = {
    "records": lambda c: c.list_records(limit=5),
    "jobs": lambda c: c.list_jobs(limit=5),
    "tokens": lambda c: c.list_tokens(),
}


@pytest.mark.parametrize("call", LISTINGS)
def test_a_listing_longer_than_any_page_is_one_error(call: str) -> None:
    """Refused at its length, the first error named: not a million errors built to find it."""
    with (
        serve(numbers_where_items_belong(1_000_001)) as (url, _),
        Client(url, timeout=SECONDS, token="t" * 40) as client,
        pytest.raises(ServerError, match=r"List should have at most [\d,]+ items.* \(1 error"),
    ):
        LISTINGS[call](client)


def test_an_answer_of_one_small_object_is_read_to_a_small_bound() -> None:
    """A claim, an upload's result, whoami: a hostile 64 MiB claim answer took a daemon from
    453 MB to 1.83 GB; now the read stops at SMALL_ANSWER_BYTES."""
    from tunecache.http import SMALL_ANSWER_BYTES

    padding = {"x": "a" * 2 * SMALL_ANSWER_BYTES}

    def behave(conn: socket.socket, request: Request, seen: Seen) -> None:
        _send(conn, {**_job(1), **padding})

    small = {"claim": lambda c: c.claim_job("w"), "whoami": lambda c: c.whoami(),
             "upload": lambda c: c.upload(make_record(make_key()))}  # fmt: skip
    with serve(behave) as (url, _), Client(url, timeout=SECONDS, token="t" * 40) as client:
        for call in small.values():  # each refused at the bound, not read whole and parsed
            with pytest.raises(ServerError, match=f"over {SMALL_ANSWER_BYTES:,} bytes"):
                call(client)


def test_a_redirect_is_named_and_not_followed() -> None:
    """It read as broken JSON ("EOF while parsing a value"); the token never follows it."""
    followed: list[str] = []

    def elsewhere(conn: socket.socket, request: Request, seen: Seen) -> None:
        followed.append(request.path)

    def redirect(conn: socket.socket, request: Request, seen: Seen) -> None:
        conn.sendall(f"HTTP/1.1 307 X\r\nLocation: {target}/steal\r\nContent-Length: 0\r\n"
                     "\r\n".encode())  # fmt: skip

    with (
        serve(elsewhere) as (target, _),
        serve(redirect) as (url, _),
        Client(url, timeout=SECONDS, token="t" * 40) as client,
        pytest.raises(ServerError, match=f"redirected to '{target}/steal', not followed"),
    ):
        client.list_records(limit=5)
    assert followed == []


def test_a_bad_snapshot_is_named_in_one_line_without_the_servers_data() -> None:
    """sync printed pydantic's message: newlines, an excerpt of the server's data and a URL."""

    def behave(conn: socket.socket, request: Request, seen: Seen) -> None:
        _send(conn, {"format": "tunecache-snapshot/1", "filters": {"device_arch": "x"},
                     "records": [1, "\x1b[31mred"]})  # fmt: skip

    with (
        serve(behave) as (url, _),
        Client(url, timeout=SECONDS, token="t" * 40) as client,
        pytest.raises(ServerError) as raised,
    ):
        client.export_snapshot("x")
    said = str(raised.value)
    assert said.startswith("GET /v1/snapshot sent no valid snapshot: ") and "(2 error(s))" in said
    assert "\n" not in said and "pydantic.dev" not in said and "\x1b" not in said, said


def test_an_error_answer_over_the_small_bound_keeps_its_status() -> None:
    """An older server's 422 naming each of 20,000 trials (a field it does not know) is over a
    small answer's bound: it was read as an outage (no status), and the outbox kept trying."""
    detail = {"status": 422, "detail": "unknown field", "errors": [
        {"loc": ["body", "trials", i, "times_ms"], "msg": "Extra inputs are not permitted",
         "type": "extra_forbidden"} for i in range(20_000)]}  # fmt: skip

    def older(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 422, json.dumps(detail).encode())

    with (
        serve(older) as (url, _),
        Client(url, timeout=SECONDS, token="t" * 40) as client,
        pytest.raises(ServerError) as raised,
    ):
        client.upload(make_record(make_key()))
    assert raised.value.status_code == 422, raised.value
    assert len(json.dumps(detail)) > 1024 * 1024  # over the small bound, read all the same


def test_a_token_name_no_new_token_may_take_is_shown_quoted_in_ascii(capsys: Any) -> None:
    """``token list`` and ``token whoami`` printed a server's token names as sent: a Cyrillic
    ``а`` made ``аdmin`` read as the team's admin token (control characters were escaped
    already). Such a name is shown quoted in ASCII, as records' uploaders are."""
    from tunecache_cli import main

    token = {"id": 3, "name": "\u0430dmin", "scope": "admin", "prefix": "tc_abcd",
             "created_at": "2026-01-01T00:00:00Z"}  # fmt: skip

    def tokens(conn: socket.socket, request: Request, seen: Seen) -> None:
        if request.path.startswith("/v1/whoami"):
            _send(conn, {"token": token, "scope": "admin", "reads": "open"})
        else:
            _send(conn, {"items": [token, {**token, "id": 4, "name": "ops"}]})

    with serve(tokens) as (url, _):
        assert main(["token", "list", "--server", url]) == 0
        listed = capsys.readouterr().out
        assert main(["token", "whoami", "--server", url]) == 0
        me = capsys.readouterr().out
    assert '"\\u0430dmin"' in listed and "\u0430" not in listed and "\n4   ops  " in listed
    assert 'token 3 "\\u0430dmin" (tc_abcd...)' in me, me
