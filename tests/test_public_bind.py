"""``serve`` on an address other machines reach warns once of what is open there without a token,
and when nobody can administer the server; on loopback it says nothing of it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cache_server import tokens
from cache_server.app import warn_if_public
from cache_server.db import make_sessionmaker
from cache_server.migrate import prepare
from cache_server.settings import ServerSettings
from tests.conftest import start_server
from tunecache.tokens import new_token

OPEN = "open to anyone who reaches it"
NO_ADMIN = "no live admin token"


def _warnings(caplog: pytest.LogCaptureFixture, **settings: object) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cache_server.app"):
        warn_if_public(ServerSettings(**settings))  # type: ignore[arg-type]
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_what_is_open_on_a_public_address(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    prepare(db).dispose()
    bare = {"db": db, "bootstrap_token": None}
    (said,) = _warnings(caplog, host="0.0.0.0", **bare)
    assert OPEN in said and "TUNECACHE_SERVER_READS=token" in said and NO_ADMIN in said
    assert "miss reports" in said
    (said,) = _warnings(caplog, host="::", reads="token", **bare)
    assert OPEN not in said and NO_ADMIN in said
    for loopback in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert _warnings(caplog, host=loopback, **bare) == []
    # A bootstrap token start-up will store is an admin to be.
    (said,) = _warnings(caplog, host="0.0.0.0", db=db, bootstrap_token=new_token())
    assert OPEN in said and NO_ADMIN not in said
    engine = prepare(db)
    with make_sessionmaker(engine).begin() as session:
        tokens.issue(session, name="ops", scope="admin")
    engine.dispose()
    assert _warnings(caplog, host="0.0.0.0", reads="token", **bare) == []
    (said,) = _warnings(caplog, host="0.0.0.0", **bare)
    assert OPEN in said and NO_ADMIN not in said


def test_serve_on_all_addresses_of_an_empty_database_warns(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    log = tmp_path / "server.log"
    live = start_server(f"sqlite:///{db_path}", db_path, log, args=["--host", "0.0.0.0"],
                        env={"TUNECACHE_SERVER_BOOTSTRAP_TOKEN": ""})  # fmt: skip
    live.stop()
    said = log.read_text()
    (line,) = [line for line in said.splitlines() if "not loopback" in line]
    assert line.startswith("WARNING") and OPEN in line and NO_ADMIN in line, said


def test_serve_on_loopback_says_nothing_of_it(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    log = tmp_path / "server.log"
    start_server(f"sqlite:///{db_path}", db_path, log,
                 env={"TUNECACHE_SERVER_BOOTSTRAP_TOKEN": ""}).stop()  # fmt: skip
    assert "not loopback" not in log.read_text()


def test_a_database_that_cannot_say_does_not_fail_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The admin count is advice: a database error there (PgBouncer refusing the bound's
    ``options``, a hiccup) was a traceback out of ``tunecache serve``."""
    db = f"sqlite:///{tmp_path / 'cache.db'}"  # no schema: the token table is missing
    (said,) = _warnings(caplog, host="0.0.0.0", db=db, bootstrap_token=None)
    assert OPEN in said and NO_ADMIN not in said
