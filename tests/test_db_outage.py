"""A database outage is a 503 with ``Retry-After`` (the server is not working now), never a 500
(a bug), and the server serves again by itself once the database is back.

PostgreSQL only: its outage is made cleanly by refusing new connections to the test's database
(``ALLOW_CONNECTIONS false``) and ending the server's open ones, then allowing them again. On
SQLite the server's pooled connections keep the file open (a removed or locked-out file does not
reach them), and a lock is only felt after the 30 s busy timeout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_server
from tests.pg import create_database


def _admin(admin_url: str, *statements: str) -> None:
    import psycopg

    dsn = admin_url.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@contextmanager
def database_down(admin_url: str, name: str) -> Iterator[None]:
    """No connection to ``name`` while inside: the open ones ended, new ones refused."""
    _admin(admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false',
           "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
           f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")  # fmt: skip
    try:
        yield
    finally:
        _admin(admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def _assert_outage(response: httpx.Response, admin_url: str) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0
    answer = response.json()
    assert answer["status"] == 503 and answer["errors"] == []
    assert answer["detail"].startswith("the database is not answering")
    host_and_port = admin_url.split("@", 1)[1]  # the URL, its user or its address: none shown
    assert host_and_port not in answer["detail"] and "tunecache@" not in answer["detail"]


def test_a_database_outage_is_a_503_and_the_server_recovers(
    postgres_admin: str, tmp_path: Path
) -> None:
    name = f"outage_{os.getpid()}"
    url = create_database(postgres_admin, name)
    log = tmp_path / "server.log"
    live = start_server(url, None, log)
    try:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            assert http.get("/v1/records").status_code == 200
            with database_down(postgres_admin, name):
                for _ in range(2):  # the broken pooled connection, then a refused new one
                    _assert_outage(http.get("/health"), postgres_admin)
                _assert_outage(http.get("/v1/records"), postgres_admin)
                _assert_outage(http.get("/v1/records/1"), postgres_admin)
                assert http.head("/health").status_code == 503  # a probe's HEAD: down too
            assert http.head("/health").status_code == 200
            health = http.get("/health")  # back: served again, without a restart
            assert health.status_code == 200 and health.json()["database"] == "postgresql"
            assert http.get("/v1/records").status_code == 200
    finally:
        live.stop()
    text = log.read_text()
    assert "the database did not answer GET /health" in text
    assert "internal error" not in text and "Traceback" not in text


@pytest.mark.parametrize(
    ("code", "outage"),
    [(5, True), (5 | 2 << 8, True), (8, True), (10, True), (13, True), (14, True),
     (6, False), (1, False), (19, False)],
)  # fmt: skip
def test_which_sqlite_errors_are_an_outage(code: int, outage: bool) -> None:
    """BUSY (locked past the busy timeout), READONLY, IOERR, FULL and CANTOPEN are the database
    not answering (503); LOCKED (a table locked within one connection), a syntax error or a
    constraint are bugs of ours (500)."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from cache_server.api.errors import database_outage

    orig = sqlite3.OperationalError("an error")
    orig.sqlite_errorcode = code
    assert database_outage(OperationalError("SELECT 1", {}, orig)) is outage


@pytest.mark.parametrize(
    ("name", "ended"),
    [("DeadlockDetected", True), ("SerializationFailure", True), ("UniqueViolation", False),
     ("QueryCanceled", False), ("AdminShutdown", False)],
)  # fmt: skip
def test_a_transaction_postgresql_ended_for_another_is_a_retry(name: str, ended: bool) -> None:
    """A deadlock or a serialisation failure ended the transaction so that another could go on:
    a 503 to send again (Retry-After: 1), not a 500 nor an outage of 5 s; a unique index's
    refusal is a bug's 500, a statement cut or a shutdown an outage."""
    import psycopg.errors
    from sqlalchemy.exc import IntegrityError, OperationalError

    from cache_server.api.errors import transaction_ended

    orig = getattr(psycopg.errors, name)("an error")
    kind = IntegrityError if name == "UniqueViolation" else OperationalError
    assert transaction_ended(kind("UPDATE tokens", {}, orig)) is ended
    assert transaction_ended(orig) is False  # not through SQLAlchemy: not a database's answer
