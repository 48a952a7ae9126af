"""The server's SQLite database is its owner's alone: token hashes, records and jobs were
readable by every local user (``-rw-r--r--`` files in a ``drwxr-xr-x`` folder)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from cache_server.db import make_engine
from tunecache.errors import InvalidInput
from tunecache.settings import default_db_url


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The usual umask (022), under which the files were world-readable."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """The default database's URL and folder, under ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = default_db_url()
    folder = Path(url.removeprefix("sqlite:///")).parent
    assert folder.is_relative_to(tmp_path)
    return url, folder


def write_something(url: str) -> None:
    """Opens ``url`` and writes, leaving its ``-wal`` and ``-shm`` files while it is open."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER)"))
            connection.execute(text("INSERT INTO t VALUES (1)"))
        with engine.connect() as connection:  # the WAL files exist while a connection is open
            db = Path(url.removeprefix("sqlite:///"))
            files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
            assert all(f.exists() for f in files), files
            assert {f.name: oct(mode(f)) for f in files} == {f.name: "0o600" for f in files}
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("existing", [False, True])
def test_the_default_database_folder_is_0700_and_its_files_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    url, folder = default_folder(tmp_path, monkeypatch)
    if existing:  # made 0755 by an older version: the product's own, closed
        folder.mkdir(parents=True, mode=0o755)
        folder.chmod(0o755)
    write_something(url)
    assert oct(mode(folder)) == "0o700"


def test_a_named_folder_is_left_as_it_is_and_the_database_made_in_it_is_0600(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o755)
    write_something(f"sqlite:///{tmp_path / 'named.db'}")
    assert oct(mode(tmp_path)) == "0o755"


def test_a_link_for_the_default_database_folder_is_refused_and_its_target_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, folder = default_folder(tmp_path, monkeypatch)
    target = tmp_path / "shared"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    folder.parent.mkdir(parents=True)
    folder.symlink_to(target)
    with pytest.raises(InvalidInput, match=f"database folder {folder} is not a plain folder"):
        make_engine(url)
    assert oct(mode(target)) == "0o755"
    assert list(target.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (chown)")
def test_a_default_database_folder_another_user_owns_is_refused_not_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, folder = default_folder(tmp_path, monkeypatch)
    folder.mkdir(parents=True, mode=0o777)
    folder.chmod(0o777)
    os.chown(folder, 65534, 65534)  # nobody's, open to all
    with pytest.raises(InvalidInput, match=f"{folder} belongs to another user"):
        make_engine(url)
    assert oct(mode(folder)) == "0o777"
    assert list(folder.iterdir()) == []
