"""The outbox is this user's alone: every file in it is uploaded under this user's token. A
folder another local user made (a ``TUNECACHE_OUTBOX`` path in ``/tmp``), one others may write
in, or a link, is refused in one line naming it (``tunecache push``: exit 2; a library that
queues quietly: a warning); files in it this user does not own are left alone, named once."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_key, make_record
from tunecache import outbox
from tunecache.settings import outbox_dir

URL = "http://cache.example:8765"
NOBODY = 65534
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="giving a file to another user (os.chown) needs root",
)


def planted(folder: Path) -> Path:
    """A record waiting in ``folder``, as another user would leave it."""
    return outbox.release(outbox.put(URL, make_record(make_key(8)), folder))


def push(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNECACHE_OUTBOX": str(folder)}
    return subprocess.run([sys.executable, "-m", "tunecache_cli", "push", "--server", URL],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


@needs_root
def test_a_folder_another_user_made_is_refused_and_nothing_in_it_sent(tmp_path: Path) -> None:
    folder = tmp_path / "tunecache-outbox"  # the team's path, in a /tmp anyone writes
    record = planted(folder)
    os.chmod(folder, 0o755)
    for path in (folder, record):
        os.chown(path, NOBODY, NOBODY)
    pushed = push(folder)
    assert pushed.returncode == 2, pushed.stderr
    assert pushed.stderr.splitlines() == [
        f"tunecache: error: the outbox cannot be used: outbox folder {folder} belongs to another "
        f"user (uid {NOBODY}), not this one: refused (what it holds may not be this user's)"
    ]
    with pytest.raises(PermissionError, match=f"outbox folder {folder} belongs to another user"):
        outbox.take(URL, folder)
    assert record.exists()


def test_a_folder_others_may_write_in_is_refused(
    own_outbox: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = planted(own_outbox)
    os.chmod(own_outbox, 0o777)
    pushed = push(own_outbox)
    assert pushed.returncode == 2, pushed.stderr
    assert len(pushed.stderr.splitlines()) == 1
    assert f"outbox folder {own_outbox} is writable by group or others (mode 0777)" \
        in pushed.stderr  # fmt: skip
    with pytest.raises(PermissionError, match="writable by group or others"):
        outbox.put(URL, make_record(make_key(16)), own_outbox)
    with caplog.at_level(logging.WARNING):  # the library, queueing quietly: a warning
        later = outbox.Later(URL, make_record(make_key(16)), "the record")
    assert later.taken is None
    assert any(str(own_outbox) in r.getMessage() and "writable by group or others"
               in r.getMessage() for r in caplog.records), caplog.text  # fmt: skip
    assert [p.name for p in own_outbox.iterdir()] == [record.name]


def test_a_link_for_the_outbox_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    planted(real)
    link = tmp_path / "outbox"
    link.symlink_to(real)
    with pytest.raises(NotADirectoryError, match=f"{link} is not a plain folder"):
        outbox.put(URL, make_record(make_key(16)), link)
    with pytest.raises(NotADirectoryError, match=f"{link} is not a plain folder"):
        outbox.waiting(URL, link)
    assert push(link).returncode == 2


@needs_root
def test_files_another_user_owns_are_never_sent_and_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ours = planted(tmp_path)
    theirs = outbox.release(outbox.put(URL, make_record(make_key(16)), tmp_path))
    os.chown(theirs, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING):
        assert outbox.waiting(URL, tmp_path) == 1
        assert outbox.set_aside_unreadable(tmp_path) == []
        (item,) = outbox.take(URL, tmp_path)
    assert item.name == ours.name
    assert theirs.exists()
    said = [r.getMessage() for r in caplog.records if theirs.name in r.getMessage()]
    assert len(said) == 1 and "not this user's, so never sent" in said[0]
    outbox.done(item.path)


def test_the_default_outbox_an_older_version_left_open_is_closed_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made under an umask of 002 (0775) before: refusing it would strand every user's uploads;
    it is the product's own, so it is closed, as the default database's folder is."""
    monkeypatch.delenv("TUNECACHE_OUTBOX")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = outbox_dir()
    folder.mkdir(parents=True)
    os.chmod(folder, 0o775)
    taken = outbox.put(URL, make_record(make_key(8)))
    assert taken.parent == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    outbox.done(taken)
