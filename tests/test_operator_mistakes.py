"""An operator's mistakes with the server are one line naming what is wrong, exit 2: a bootstrap
token pasted with its newline, a database a newer tunecache migrated (a rollback), a revision
that does not exist, a PostgreSQL endpoint that accepts connections and never answers."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cache_server.embedded import free_port
from cache_server.migrate import upgrade


def tunecache(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})  # fmt: skip


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def test_a_bootstrap_token_with_its_newline_is_refused_naming_the_variable(
    tmp_path: Path,
) -> None:
    """It was stored, and no client could send it: every admin was locked out."""
    token = "tc_" + "a" * 43
    said = one_line(tunecache("serve", "--db", f"sqlite:///{tmp_path / 'c.db'}", "--port",
                              str(free_port()),
                              env={"TUNECACHE_SERVER_BOOTSTRAP_TOKEN": token + "\n"}))  # fmt: skip
    assert "TUNECACHE_SERVER_BOOTSTRAP_TOKEN: holds a space, a newline" in said
    assert token not in said and "Value error" not in said
    assert not (tmp_path / "c.db").exists()


def test_a_database_a_newer_tunecache_migrated_is_named_so(tmp_path: Path) -> None:
    """Rolled back, the server said to run `db upgrade`, which then failed with 'internal error:
    CommandError', exit 1; a --revision that does not exist did too."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(url)
    with sqlite3.connect(tmp_path / "c.db") as db:
        db.execute("update alembic_version set version_num = '9999'")
    said = one_line(tunecache("serve", "--db", url, "--port", str(free_port())))
    assert "at revision 9999, which a newer tunecache made" in said and "db upgrade" not in said
    said = one_line(tunecache("db", "upgrade", "--db", url))
    assert "it is at revision 9999, which a newer tunecache made" in said
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    said = one_line(tunecache("db", "upgrade", "--db", fresh, "--revision", "8888"))
    assert "cannot upgrade" in said and "8888" in said
    done = tunecache("db", "upgrade", "--db", fresh)
    assert done.returncode == 0 and "(was an empty database)" in done.stderr, done.stderr


def test_a_postgresql_endpoint_that_never_answers_is_an_error_not_a_hang() -> None:
    """A listener that accepts and says nothing hung `db upgrade` (and `serve`) with no word."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        said = one_line(tunecache("db", "upgrade", "--db",
                                  f"postgresql://u:secret@127.0.0.1:{port}/db"))  # fmt: skip
        assert time.monotonic() - started < 60
    assert f"cannot upgrade postgresql+psycopg://u:***@127.0.0.1:{port}/db" in said
    assert "secret" not in said
