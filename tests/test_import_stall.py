"""A snapshot import holds no other writer back for its whole run, nor for nothing.

An audit's write token imported 4,097 new keys into one shape bucket (one over the server's
``BUCKET_WINNERS``): the import held every key-lock slot for 30 s (PostgreSQL; SQLite its one write
lock), then answered 409 and rolled back, storing nothing, and could be sent again and again;
every other token's uploads waited behind it, one 45 s and then a 503. Now what would refuse an
import is checked before it takes any lock, and it commits its records a chunk at a time
(:mod:`cache_server.snapshots`). On SQLite and on PostgreSQL; no assertion on a time: on orders
(answered while the locks are held, answered before the import was) and on what was stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from cache_server import snapshots, tokens
from cache_server.db import make_engine, make_sessionmaker
from cache_server.migrate import upgrade
from cache_server.models import RecordRow
from cache_server.queries import get_winner
from cache_server.twins import lock_slot
from tests.conftest import LiveServer, database_server
from tests.factories import AUTH, make_key, make_record
from tunecache.snapshot import SNAPSHOT_FORMAT

ARCH = "cpu-avx2"
BUCKET = 600_000  # M of a bucket (524,288 to 1,048,576] no other record is in


def document(count: int, *, m: int = BUCKET) -> dict[str, Any]:
    """A snapshot of ``count`` new keys of one shape bucket, validated, without trials."""
    records = [make_record(make_key(m + i), trials=0).model_dump(mode="json", by_alias=True)
               for i in range(count)]  # fmt: skip
    return {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": ARCH}, "records": records}


def stored(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=30).json()["records"])


@pytest.fixture
def small_buckets(database: tuple[str, Path | None], tmp_path: Path) -> Iterator[LiveServer]:
    """A server over each kind of database whose buckets hold 300 winners of an admin's token
    (twice the limit, 150)."""
    yield from database_server(database, tmp_path, {"TUNECACHE_SERVER_BUCKET_WINNERS": "150"})


@contextmanager
def every_key_locked(db: str) -> Iterator[None]:
    """Holds every key's lock, as a writer does its own (PostgreSQL: the 256 slots of
    :func:`cache_server.twins.lock_key`; SQLite: the database's write lock)."""
    engine = make_engine(db)
    try:
        with make_sessionmaker(engine).begin() as session:
            for slot in range(256):
                lock_slot(session, slot)
            yield
    finally:
        engine.dispose()


@pytest.mark.slow
def test_an_import_a_full_bucket_refuses_is_a_409_before_it_takes_any_lock(
    small_buckets: LiveServer,
) -> None:
    """Before: it stored its keys one by one behind their locks, and found the bucket full at
    the 301st (here it would wait behind the locks held and never answer in time)."""
    url = small_buckets.url
    too_many = document(301)
    assert stored(url) == 0
    # the token's use, written once a minute (SQLite: the write lock), is written now
    assert httpx.get(f"{url}/v1/records", headers=AUTH, timeout=30).status_code == 200
    answer: list[httpx.Response] = []
    with every_key_locked(small_buckets.db):
        sent = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{url}/v1/snapshot", json=too_many, headers=AUTH, timeout=25)))  # fmt: skip
        sent.start()
        sent.join(timeout=30)  # the locks stay held until it is answered
        assert answer, "the import waited for the key locks"
    assert answer[0].status_code == 409, answer[0].text
    assert "holds 300 winners, twice the server's limit" in answer[0].json()["detail"]
    assert stored(url) == 0
    fits = httpx.post(f"{url}/v1/snapshot", json=document(300), headers=AUTH, timeout=120)
    assert fits.json() == {"imported": 300, "winners_changed": 300}, fits.text


@pytest.mark.slow
def test_an_upload_sent_while_a_big_import_runs_is_not_held_for_all_of_it(
    any_server: LiveServer,
) -> None:
    """Before: the import's one transaction held every key's lock (SQLite: the write lock)
    until it committed, and an upload of an unrelated key was answered only after it; now it
    waits one chunk at most, and is answered while the import still runs."""
    url, big = any_server.url, document(1500)
    assert stored(url) == 0
    done: dict[str, Any] = {}

    def run_import() -> None:
        done["import"] = httpx.post(f"{url}/v1/snapshot", json=big, headers=AUTH, timeout=300)
        done["import_at"] = time.monotonic()

    importing = threading.Thread(target=run_import)
    importing.start()
    while "import" not in done and stored(url) == 0:  # until its first chunk is committed
        time.sleep(0.05)
    other = make_record(make_key(64), trials=0).model_dump(mode="json", by_alias=True)
    upload = httpx.post(f"{url}/v1/records", json=other, headers=AUTH, timeout=120)
    answered_at = time.monotonic()
    importing.join(timeout=300)
    assert upload.status_code == 201, upload.text
    assert done["import"].json() == {"imported": 1500, "winners_changed": 1500}
    assert answered_at < done["import_at"], "the upload waited for the whole import"
    assert stored(url) == 1501


def test_an_import_in_chunks_stores_and_counts_as_in_one(
    database: tuple[str, Path | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of one record each: every record its own transaction, the answer the same."""
    url, _ = database
    upgrade(url)
    monkeypatch.setattr(snapshots, "CHUNK_RECORDS", 1)
    monkeypatch.setattr(snapshots, "SQLITE_TURN_SECONDS", 0.0)
    a, b, unvalidated = make_key(64), make_key(128), make_key(256)
    records = [make_record(a, time_ms=2.0), make_record(b, time_ms=3.0),
               make_record(a, time_ms=0.5), make_record(a, time_ms=0.1, passed=False),
               make_record(unvalidated, passed=False), make_record(a, time_ms=1.0)]  # fmt: skip
    engine = make_engine(url)
    try:
        sessions = make_sessionmaker(engine)
        for expected in ((6, 2), (0, 0)):  # the second time: each record is stored already
            with sessions() as session:  # as the API's: its owner commits the last chunk
                found = snapshots.import_records(session, records=records, bucket_limit=2)
                session.commit()
            assert found == expected
        with sessions.begin() as session:
            count = session.scalar(select(func.count()).select_from(RecordRow))
            winner = get_winner(session, key_hash=a.digest())
    finally:
        engine.dispose()
    assert count == 6 and winner is not None and winner.timing.median_ms == 0.5


def test_a_token_revoked_mid_import_stores_no_more(
    database: tuple[str, Path | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write token revoked while its import runs (between two chunks, by an admin's request
    in another transaction) stores no chunk after it: the import stops with the token's
    revocation named and what it stored before counted (those records stay); it went on
    writing until its end."""
    url, _ = database
    upgrade(url)
    monkeypatch.setattr(snapshots, "CHUNK_RECORDS", 1)
    monkeypatch.setattr(snapshots, "SQLITE_TURN_SECONDS", 0.0)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    committed = snapshots._next_chunk

    def revoked_meanwhile(session: Any) -> None:
        committed(session)
        with sessions.begin() as admin:  # the admin's request, between two chunks
            tokens.revoke(admin, token_id=uploader.id)

    try:
        with sessions.begin() as session:
            _, uploader = tokens.issue(session, name="importer", scope="write")
        monkeypatch.setattr(snapshots, "_next_chunk", revoked_meanwhile)
        records = [make_record(make_key(64 * (i + 1)), trials=0) for i in range(3)]
        with sessions() as session, pytest.raises(tokens.Revoked) as refused:
            snapshots.import_records(session, records=records, uploader=uploader)
        with sessions.begin() as session:
            count = session.scalar(select(func.count()).select_from(RecordRow))
    finally:
        engine.dispose()
    assert "revoked while this request ran" in str(refused.value), refused.value
    assert "the 1 records this import stored before it stay stored" in str(refused.value)
    assert count == 1
