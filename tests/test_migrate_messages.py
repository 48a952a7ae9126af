"""What schema management says: an upgrade command that works as printed, ``postgres://`` URLs,
an upgrade to a revision the database is past, and tables without a revision."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cache_server import SchemaOutdated
from cache_server.db import make_engine
from cache_server.migrate import check_schema, current_revision, head_revision, prepare, upgrade
from cache_server.settings import ServerSettings

_made = iter(range(1_000_000))


def _tunecache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})  # fmt: skip


def test_the_printed_upgrade_command_works_when_the_url_holds_a_password(
    postgres_admin: str,
) -> None:
    from tests.pg import create_database

    plain = create_database(postgres_admin, f"messages_{os.getpid()}_{next(_made)}")
    url = plain.replace("://tunecache@", "://tunecache:s3cret@")  # trust auth: any password
    upgrade(url, "0015")
    with pytest.raises(SchemaOutdated) as refused:
        check_schema(make_engine(url))
    message = str(refused.value)
    assert "s3cret" not in message and "***" not in message, message
    printed = message.split("Run: ", 1)[1]
    assert printed.startswith("TUNECACHE_SERVER_DB=") and "PASSWORD" in printed, printed
    command = printed.split(" (", 1)[0].replace("PASSWORD", "s3cret")  # what the operator runs
    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_SERVER_DB"}
    done = subprocess.run(command.replace("tunecache db", f"{sys.executable} -m tunecache_cli db"),
                          shell=True, capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert current_revision(make_engine(plain)) == head_revision()


def test_a_url_without_a_password_is_printed_on_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0015")
    with pytest.raises(SchemaOutdated, match=f"Run: tunecache db upgrade --db {url}$"):
        check_schema(make_engine(url))


@pytest.mark.parametrize("scheme", ["postgres://", "postgres+psycopg://", "postgresql://"])
def test_postgres_urls_mean_psycopg_3(scheme: str) -> None:
    assert ServerSettings(db=f"{scheme}u:p@host/db").db == "postgresql+psycopg://u:p@host/db"


def test_an_upgrade_to_a_revision_the_database_is_past_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    upgrade(url)
    done = _tunecache("db", "upgrade", "--db", url, "--revision", "0005")
    assert done.returncode == 0, done.stderr
    assert f"at revision {head_revision()}, already past 0005" in done.stderr, done.stderr
    assert current_revision(make_engine(url)) == head_revision()


def test_tables_without_a_revision_are_named_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lost.db'}"
    upgrade(url)
    with sqlite3.connect(tmp_path / "lost.db") as db:
        db.execute("DELETE FROM alembic_version")
    done = _tunecache("db", "upgrade", "--db", url)
    assert done.returncode == 2, done.stderr
    assert "no schema revision" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    with pytest.raises(SchemaOutdated, match="no schema revision"):
        prepare(url)  # what serve does
    with sqlite3.connect(tmp_path / "lost.db") as db:
        db.execute("DROP TABLE alembic_version")
    with pytest.raises(SchemaOutdated, match="no schema revision"):
        prepare(url, create=False)


def test_a_database_a_newer_tunecache_migrated_can_be_taken_back(
    database: tuple[str, Path | None],
) -> None:
    """A rollback had no path: an older server refused the database a newer one migrated, and
    its printed command (an upgrade) failed; there was no downgrade. ``db downgrade`` takes it
    back to the revision the older server names, which then serves it; a revision this code
    does not know, or no database, is refused (exit 2) and changes nothing."""
    url, _ = database
    upgrade(url)
    unknown = _tunecache("db", "downgrade", "--db", url, "--revision", "0999")
    assert unknown.returncode == 2 and "does not know revision 0999" in unknown.stderr
    assert current_revision(make_engine(url)) == head_revision()
    asked = _tunecache("db", "downgrade", "--db", url, "--revision", "0012")
    assert asked.returncode == 2 and "run again with --yes" in asked.stderr, asked.stderr
    listed = [line.split(":")[0].strip() for line in asked.stderr.splitlines()[1:-1]]
    assert listed[0] == head_revision() and listed[-1] == "0013"  # newest first, 0012 kept
    assert listed == sorted(listed, reverse=True)  # nothing taken out yet:
    # each says what it added in plain words, not its docstring's first line (cut mid-sentence,
    # its ``markup`` raw)
    assert (
        "``" not in asked.stderr
        and "0022: What each token has stored, counted against the "
        "server's quota (token_usage: cache_server.quota): a write token"
        in asked.stderr
    )
    assert current_revision(make_engine(url)) == head_revision()
    back = _tunecache("db", "downgrade", "--db", url, "--revision", "0012", "--yes")
    assert back.returncode == 0, back.stderr
    assert f"at revision 0012 (was revision {head_revision()})" in back.stderr
    assert current_revision(make_engine(url)) == "0012"
    with pytest.raises(SchemaOutdated, match="needs revision"):
        check_schema(make_engine(url))  # this server wants it upgraded again
    again = _tunecache("db", "upgrade", "--db", url)
    assert again.returncode == 0 and current_revision(make_engine(url)) == head_revision()


def test_a_server_refusing_a_newer_database_names_the_downgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    upgrade(url)
    with sqlite3.connect(tmp_path / "newer.db") as db:
        db.execute("update alembic_version set version_num = '0999'")
    with pytest.raises(
        SchemaOutdated, match=f"tunecache db downgrade --revision {head_revision()}"
    ):
        check_schema(make_engine(url))
    missing = _tunecache("db", "downgrade", "--db", f"sqlite:///{tmp_path / 'none.db'}",
                         "--revision", "0012", "--yes")  # fmt: skip
    assert missing.returncode == 2 and "no database at" in missing.stderr
    assert not (tmp_path / "none.db").exists()
