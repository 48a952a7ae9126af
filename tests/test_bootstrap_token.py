"""The bootstrap token's start-up line says what is true on every database: stored, already
known, or known and revoked (a warning: the variable's token grants nothing)."""

from __future__ import annotations

from pathlib import Path

import httpx

from cache_server import tokens
from cache_server.db import make_sessionmaker
from cache_server.migrate import prepare
from tests.conftest import start_server
from tests.factories import AUTH, TEST_TOKEN
from tunecache.tokens import new_token

STORED = "stored the bootstrap admin token (hashed)"


def test_ensure_tells_stored_known_and_revoked(database: tuple[str, Path | None]) -> None:
    engine = prepare(database[0])
    token = new_token()
    try:
        sessions = make_sessionmaker(engine)
        for expected in ("stored", "known"):
            with sessions.begin() as session:
                assert tokens.ensure(session, token=token, name="bootstrap",
                                     scope="admin") == expected  # fmt: skip
        with sessions.begin() as session:
            tokens.issue(session, name="other-admin", scope="admin")
            row = tokens.authenticate(session, token=token)
            assert row is not None
            tokens.revoke(session, token_id=row.id)
        with sessions.begin() as session:
            assert tokens.ensure(session, token=token, name="bootstrap", scope="admin") == "revoked"
            assert tokens.authenticate(session, token=token) is None  # and it stays revoked
    finally:
        engine.dispose()


def test_a_restart_with_a_revoked_bootstrap_token_warns(
    database: tuple[str, Path | None], tmp_path: Path
) -> None:
    url, path = database
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    live = start_server(url, path, first_log)  # TEST_TOKEN is the bootstrap token
    try:
        me = httpx.get(f"{live.url}/v1/whoami", headers=AUTH).json()["token"]["id"]
        other = httpx.post(f"{live.url}/v1/tokens", json={"name": "other-admin", "scope": "admin"},
                           headers=AUTH, timeout=30)  # fmt: skip
        assert other.status_code == 201
        assert httpx.delete(f"{live.url}/v1/tokens/{me}", headers=AUTH).status_code == 200
    finally:
        live.stop()
    assert STORED in first_log.read_text()
    again = start_server(url, path, second_log)  # the same variable
    try:
        assert httpx.get(f"{again.url}/v1/whoami", headers=AUTH).status_code == 401
    finally:
        again.stop()
    said = second_log.read_text()
    assert STORED not in said, said
    assert "WARNING" in said and "REVOKED" in said, said
    assert TEST_TOKEN not in said  # the token itself is never logged
