"""The outbox's files as one process reads and holds them (:mod:`tunecache.outbox` decides
what to do with them).

A file is taken before it is sent: an advisory lock (``flock``) held on it from before it is
renamed ``.sending-PID-NAME`` (the PID for people reading the folder) until its upload is done
with, so no record is sent twice. The kernel drops the lock when its process dies: a taken file
whose lock can be had waits again (so does one taken before the lock). The PID judged it, and a
PID reused (a container's PID 1, a reboot) left the upload never sent again. Only this user's
files are read, in a folder only this user can write (:func:`tunecache.folders.own_folder`: they
are uploaded under this user's token), opened without following links or blocking and read
within :data:`MAX_FILE_BYTES`; one that is no regular file or is larger is set aside.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tunecache.folders import NotRegularFile, open_regular, own_folder, read_bounded
from tunecache.settings import outbox_dir

logger = logging.getLogger("tunecache.outbox")

# What flock answers on a file system without locks (NFS without lockd, Lustre without its flock
# option): there a file is taken by its rename alone, as before the lock, and one a sender that
# died had taken waits for good (a live sender's may be sent twice by two pushers: the server
# stores an upload sent twice once).
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


def lock_new(fd: int) -> None:
    """Takes the lock of a file this process just wrote (nobody else holds it), where the file
    system has locks (:data:`NO_LOCKS`)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            raise


TAKEN = ".sending-"
WRITING = ".writing-"
UNFINISHED_SECONDS = 3600.0  # a file is written in well under a second: one older was abandoned
MAX_FILE_BYTES = 64 * 2**20  # four times the largest body a server takes by default (16 MiB)


_held: dict[Path, BinaryIO] = {}  # the files this process has taken, each open, its lock held
_held_guard = threading.RLock()  # Later sends from a background thread; reentrant: a fork
_said: set[tuple[str, str]] = set()  # (folder, name) a warning named already: said once


@dataclass
class Found:
    """A file of the outbox as read: what it holds, or why it cannot hold an upload."""

    path: Path
    file: BinaryIO | None = None  # open while it is looked at; handed to _held once taken
    data: dict[str, Any] | None = None  # None: no JSON object (or no file to read at all)
    problem: str = ""  # no regular file, or too large: never read as an upload

    def lock(self, exclusive: bool) -> bool:
        """Whether no live process sends it: its lock had (``exclusive``: kept, to take it;
        else only tried, as a reader, and let go at once). A file exclusively locked is checked
        to be the one its name still holds (another process may have taken it meanwhile)."""
        if self.file is None:  # a FIFO, a link: nobody sends it
            return True
        fd = self.file.fileno()
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                raise
            return True  # a file system without locks: one rename wins (:data:`NO_LOCKS`)
        if not exclusive:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        with contextlib.suppress(OSError):
            now, opened = os.lstat(self.path), os.fstat(fd)
            return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)
        return False

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def let_go(taken: Path) -> None:
    """Closes the taken file, which lets its lock go (a write that failed to flush, a full
    disk's, is not raised again: the file is given up either way)."""
    with _held_guard:
        file = _held.pop(taken, None)
    if file is not None:
        with contextlib.suppress(OSError):
            file.close()


def new_held(folder: Path) -> tuple[Path, BinaryIO]:
    """A new file to write in ``folder`` (``.writing-*.tmp``), locked and held from the moment
    it is made (:func:`let_go`, :func:`rename_held`): a child forked meanwhile closes its copy,
    and :func:`sweep_unfinished` leaves it alone while its writer lives. One made before it was
    held stayed open in a child forked then: its lock outlived the parent, and the upload was
    not sent while the child ran. Unbuffered: a child closes its copy without flushing what the
    parent's write buffered (twice in the file) or waiting on the buffer's lock, held for good
    by a parent thread writing at the fork (the child hung in its fork)."""
    with _held_guard:  # no fork between making it and holding it (:func:`_before_fork`)
        fd, name = tempfile.mkstemp(dir=folder, prefix=WRITING, suffix=".tmp")
        path, file = Path(name), os.fdopen(fd, "wb", buffering=0)
        _held[path] = file
    try:
        lock_new(fd)
    except OSError:
        let_go(path)
        path.unlink(missing_ok=True)
        raise
    return path, file


def rename_held(held: Path, taken: Path) -> None:
    """Names ``held`` (written, its lock taken) ``taken``, still held under that name."""
    os.replace(held, taken)
    with _held_guard:
        _held[taken] = _held.pop(held)


def sweep_unfinished(folder: Path) -> None:
    """Removes this user's files of ``folder`` left half-written (``.writing-*``) by a process
    killed while it wrote them: at least :data:`UNFINISHED_SECONDS` old, and no live process
    holds its lock (:func:`new_held`; a writer whose clock, or its file server's, is an hour
    behind, or one stopped mid-write, still holds it). Nothing reads them, and they were left on
    every upload of a killed writer. None goes where the file system has no locks: a live
    writer's could not be told from a dead one's."""
    for path in folder.glob(f"{WRITING}*.tmp"):
        with contextlib.suppress(OSError):
            found = os.lstat(path)
            old = time.time() - found.st_mtime > UNFINISHED_SECONDS
            if old and found.st_uid == os.getuid() and stat.S_ISREG(found.st_mode):
                _remove_unheld(path)


def _remove_unheld(path: Path) -> None:
    """Removes ``path`` if its lock can be had (its writer is dead).

    Raises:
        OSError: it is gone, or cannot be opened or locked (a file system without locks).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its writer lives
        now, opened = os.lstat(path), os.fstat(fd)
        if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            path.unlink()
    finally:
        os.close(fd)


def _before_fork() -> None:
    # A file being made is held before the fork copies it. Reentrant: a signal handler forking
    # on the thread that holds it went on (else it waited on itself for good).
    _held_guard.acquire()


def _after_fork_in_parent() -> None:
    _held_guard.release()


def _forget_in_child() -> None:
    """A forked child sends none of its parent's files: its copies are closed (the parent's
    lock stays with the parent), so a parent that dies leaves them waiting."""
    global _held_guard
    _held_guard = threading.RLock()  # the parent's was held at the fork
    for file in _held.values():
        with contextlib.suppress(OSError):
            file.close()
    _held.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_forget_in_child)  # fmt: skip


def checked_folder(folder: Path | None, make: bool) -> Path | None:
    """The outbox folder, checked as this user's alone (made if ``make``; ``None``: it is not
    there). The product's own folder, under the user cache dir, is closed if an older version
    left it open to the group (an umask of 002); one a user named is refused.

    Raises:
        OSError: it is a link or no folder, another user's, or others may write in it.
    """
    folder = folder or outbox_dir()
    if not make and not os.path.lexists(folder):
        return None
    return own_folder(folder, "outbox folder", close=folder == outbox_dir({}))


def own_name(name: str) -> str:
    """A file's name while it waits (``.sending-PID-NAME`` → ``NAME``; a name not of that form,
    ``.sending-x.json``, put there by hand, less the prefix: it failed every push)."""
    if not name.startswith(TAKEN):
        return name
    pid, dash, rest = name.removeprefix(TAKEN).partition("-")
    return rest if dash and pid.isdigit() else name.removeprefix(TAKEN)


def read_file(path: Path, foreign: list[str]) -> Found | None:
    """``path`` as read, left open (``None``: gone meanwhile, unreadable, or another user's,
    its name added to ``foreign``). A file is written whole before it is named ``*.json``
    (:func:`put`), so one that does not parse is never still being written."""
    try:
        if os.lstat(path).st_uid != os.getuid():  # put there by another user: never sent
            foreign.append(path.name)
            return None
        file = open_regular(path, follow_links=False)
    except NotRegularFile as exc:
        return Found(path, problem=str(exc))
    except OSError:
        return None
    found = Found(path, file)
    try:
        text = read_bounded(file, MAX_FILE_BYTES)
        data: Any = None if text is None else json.loads(text)
    except OSError:
        found.close()
        return None
    except (ValueError, RecursionError):  # not JSON, not text, or nested past the parser
        data = None
    found.problem = f"over {MAX_FILE_BYTES:,} bytes" if text is None else ""
    found.data = data if isinstance(data, dict) else None
    return found


def files(folder: Path | None) -> Iterator[Found]:
    """The outbox's files, oldest first, each open while its consumer looks at it (one it
    took is handed on, :func:`take_found`). Files of another user are left alone, named in one
    warning.

    Raises:
        OSError: the outbox folder is refused (:func:`checked_folder`).
    """
    checked = checked_folder(folder, make=False)
    if checked is None:
        return
    foreign: list[str] = []
    try:
        for path in sorted(checked.glob("*.json"), key=lambda p: own_name(p.name)):
            if (found := read_file(path, foreign)) is None:
                continue
            try:
                yield found
            finally:
                found.close()
    finally:
        _say_foreign(checked, foreign)


def _say_foreign(folder: Path, names: list[str]) -> None:
    """One warning naming the files of another user found in the outbox (each named once)."""
    new = [name for name in names if (str(folder), name) not in _said]
    if not new:
        return
    _said.update((str(folder), name) for name in new)
    logger.warning("%d file(s) in the outbox %s are not this user's, so never sent: %s",
                   len(new), folder, ", ".join(new))  # fmt: skip


def take_found(found: Found) -> Path | None:
    """Takes ``found`` (its lock held): renamed ``.sending-PID-NAME``, held by this process;
    ``None`` when it is gone meanwhile."""
    assert found.file is not None
    taken = found.path.with_name(f"{TAKEN}{os.getpid()}-{own_name(found.path.name)}")
    try:
        os.replace(found.path, taken)
    except OSError:
        return None
    with _held_guard:
        _held[taken], found.file = found.file, None
    return taken
