"""On PostgreSQL every statement the API makes, and every wait for a lock, is bounded
(``TUNECACHE_SERVER_STATEMENT_SECONDS``): a table an operator holds locked gets 503 with
``Retry-After`` while the lock lasts, not requests hung for as long as it does (39 s, each
holding an API slot, and the client long gone)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cache_server.db import make_engine
from tests.conftest import LiveServer, start_server
from tests.factories import TEST_TOKEN

_made = iter(range(1_000_000))


@pytest.fixture
def pg_server(postgres_admin: str, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.pg import create_database

    url = create_database(postgres_admin, f"bounds_{os.getpid()}_{next(_made)}")
    live = start_server(url, None, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_STATEMENT_SECONDS": "1"})  # fmt: skip
    yield live
    live.stop()


@contextmanager
def locked(url: str, table: str) -> Iterator[None]:
    """``table`` held in ACCESS EXCLUSIVE mode by another connection until the block ends."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


@pytest.mark.parametrize(
    ("table", "path", "token"),
    [("tokens", "/v1/whoami", True),  # the token checked before the body, in a middleware
     ("records", "/health", False),  # a route's own query
     ("tokens", "/health", False),  # every request with a token needs it: so does health
     ("records", "/v1/records", True)],
)  # fmt: skip
def test_a_locked_table_is_a_503_with_retry_after_while_the_lock_lasts(
    pg_server: LiveServer, table: str, path: str, token: bool
) -> None:
    headers = {"Authorization": f"Bearer {TEST_TOKEN}"} if token else {}
    with locked(pg_server.db, table):
        # The lock is given back only once the answer is in: a request that waits for it
        # waits for ever (here, until the client's timeout fails the test).
        during = httpx.get(pg_server.url + path, headers=headers, timeout=90)
    assert during.status_code == 503, during.text
    assert int(during.headers["Retry-After"]) >= 1
    after = httpx.get(pg_server.url + path, headers=headers, timeout=30)
    assert after.status_code == 200, after.text  # and it serves again by itself


def test_the_bound_is_set_on_the_connection_and_none_lifts_it(postgres_admin: str) -> None:
    from sqlalchemy import text

    from tests.pg import create_database

    url = create_database(postgres_admin, f"bounds_{os.getpid()}_{next(_made)}")
    for seconds, shown in ((0.5, "500ms"), (None, "0")):
        engine = make_engine(url, statement_seconds=seconds)
        with engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == shown
            assert conn.execute(text("SHOW lock_timeout")).scalar() == shown
        engine.dispose()


def test_a_migration_may_wait_for_a_table_longer_than_the_apis_bound(postgres_admin: str) -> None:
    """``db upgrade`` waits for a table the server (or anyone) holds, however long: the API's
    bound is on the serving engine, not on migrations."""
    import threading
    import time

    from cache_server.migrate import current_revision, head_revision, upgrade
    from cache_server.settings import STATEMENT_SECONDS
    from tests.pg import create_database

    url = create_database(postgres_admin, f"bounds_{os.getpid()}_{next(_made)}")
    upgrade(url, "0015")  # 0016 adds a column to records
    failed: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # reported below
            failed.append(exc)

    with locked(url, "records"):
        migrating = threading.Thread(target=migrate)
        migrating.start()
        _wait_for_a_lock_wait(url)
        time.sleep(STATEMENT_SECONDS + 1)  # past the API's bound, the lock still held
        assert migrating.is_alive() and not failed
    migrating.join(60)
    assert not failed, failed
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def _wait_for_a_lock_wait(url: str) -> None:
    import time

    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as conn:  # fmt: skip
        for _ in range(600):
            waiting = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                   "WHERE wait_event_type = 'Lock'").fetchone()  # fmt: skip
            if waiting and waiting[0]:
                return
            time.sleep(0.1)
    raise AssertionError("the migration never waited for the table")


def test_an_upload_waits_for_its_keys_lock_past_the_bound(pg_server: LiveServer) -> None:
    """A snapshot import holds its keys' slots until it commits: an upload behind it got 503
    once the API's statement bound passed (1 s here), and was sent again and again. A write
    waits for its key's slot up to the client's write deadline instead."""
    import threading
    import time

    import psycopg

    from cache_server.twins import LOCK_CLASS
    from tests.factories import make_key, make_record

    record = make_record(make_key(m=96))
    slot = int(record.key.digest()[:2], 16)
    answers: list[httpx.Response] = []

    def upload() -> None:
        answers.append(httpx.post(f"{pg_server.url}/v1/records", json=record.model_dump(mode="json", by_alias=True),
                                  headers={"Authorization": f"Bearer {TEST_TOKEN}"},
                                  timeout=90))  # fmt: skip

    with psycopg.connect(pg_server.db.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, slot))
        sending = threading.Thread(target=upload)
        sending.start()
        _wait_for_a_lock_wait(pg_server.db)
        time.sleep(2.5)  # past the bound, the slot still held: as by a long import
        conn.rollback()
    sending.join(60)
    assert [a.status_code for a in answers] == [201], [a.text for a in answers]
