"""Folders a command writes into (``report -o DIR``, ``sync --format vllm-moe -o DIR``): made if
need be and checked writable before any work, each refusal one line; the one way a local file
is written whole (:func:`write_atomic`); private folders and files, which only their owner
can read (:func:`private_folder`, :func:`private_file`: the server's default database); folders
no other user can have put files in (:func:`own_folder`: the outbox); and the one way a file
named by a path is read without blocking or without bound (:func:`open_regular`,
:func:`read_bounded`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tunecache.errors import InvalidInput

logger = logging.getLogger(__name__)


def output_dir(path: Path, label: str = "output folder") -> Path:
    """``path`` as a folder a command can write into, created if need be; ``label`` says what
    it is in a refusal (``-o``'s output folder, the ``TUNECACHE_WORK_DIR`` folder).

    Raises:
        InvalidInput: it cannot be created, is not a folder, or is not writable.
    """
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"{label} {path} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot create {label} {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidInput(f"{label} {path} is not writable")
    return path


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Writes ``data`` to ``path`` whole: into a private temporary file beside it (``mkstemp``: a
    new name made exclusively, never a link planted there, never another writer's), given
    ``mode`` (0600: its owner's; a file another user's program reads, such as a vLLM config,
    0644), flushed to disk, then renamed over ``path`` (a link at ``path`` is replaced, not
    followed). A reader never sees half a file; on failure no temporary file is left.

    Raises:
        OSError: the file cannot be written (callers say which file, in one line).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def shared_mode(path: Path) -> int:
    """The mode for a file other programs read (a vLLM config): that of the file ``path`` holds
    already, else what the process's umask leaves of 0666 (its owner's choice, not ours)."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """This process's umask, read without changing it where Linux says it (``/proc``)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)  # elsewhere: read by setting it, at once set back
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _plain_folder(path: Path, label: str) -> Iterator[tuple[int, os.stat_result]]:
    """``path`` opened as a plain folder, made (0700, with its missing parents) if missing: the
    open descriptor and its status. Its mode is changed through the descriptor, never by name
    again: a folder swapped for a link between a check and a ``chmod`` by name had the link's
    target changed.

    Raises:
        OSError: it cannot be made or opened, or is not a plain folder (a file, or a link).
    """
    with contextlib.suppress(FileExistsError):  # a file or a link there: said below
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_PATH where Linux has it: a folder of one's own without read permission (0300) opens too
    access = getattr(os, "O_PATH", os.O_RDONLY)
    flags = access | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    refused = NotADirectoryError(f"{label} {path} is not a plain folder (a file, or a link)")
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refused from None
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISDIR(found.st_mode):  # where O_DIRECTORY is not known
            raise refused
        yield fd, found
    finally:
        os.close(fd)


def _close_up(fd: int) -> None:
    """Makes the folder open as ``fd`` 0700, through the descriptor (an ``O_PATH`` one takes no
    ``fchmod``: Linux changes it through ``/proc/self/fd``, which names that very folder)."""
    try:
        os.fchmod(fd, 0o700)
    except OSError as exc:
        if exc.errno != errno.EBADF:
            raise
        os.chmod(f"/proc/self/fd/{fd}", 0o700)


def _refuse_others(path: Path, found: os.stat_result, label: str) -> None:
    """Refuses a folder another user owns: what it holds may not be this user's, and its mode
    is not this user's to change."""
    if found.st_uid != os.getuid():
        raise PermissionError(
            f"{label} {path} belongs to another user (uid {found.st_uid}), "
            "not this one: refused (what it holds may not be this user's)"
        )


def private_folder(path: Path, label: str = "folder") -> Path:
    """``path`` as a folder only its owner can open (0700), made with its missing parents; one
    found open to others (made by an older version) is closed to 0700. Only for a folder the
    product owns (the default database's), never one a user named.

    Raises:
        OSError: it cannot be made or closed, is not a plain folder (a file, or a link), or
            belongs to another user; a refusal's message names ``label`` and ``path``.
    """
    with _plain_folder(path, label) as (fd, found):
        _refuse_others(path, found, label)
        if found.st_mode & 0o077:
            _close_up(fd)
    return path


def own_folder(path: Path, label: str = "folder", *, close: bool = False) -> Path:
    """``path`` as a folder no other user can have put files in, made (0700) if missing: what
    it holds is this user's to act on (the outbox, whose files are uploaded under this user's
    token: one another user made in ``/tmp`` held their records). ``close``: a folder of the
    product's own found writable by others (made under an umask of 002 by an older version) is
    closed to 0700, as :func:`private_folder` does, rather than refused.

    Raises:
        OSError: it cannot be made, is a link or no folder, belongs to another user, or group or
            others may write in it; the message names ``label`` and ``path`` in one line.
    """
    with _plain_folder(path, label) as (fd, found):
        _refuse_others(path, found, label)
        if found.st_mode & 0o022 and close:
            _close_up(fd)
            logger.warning("%s %s was writable by group or others (mode %04o): closed to 0700, "
                           "as what it holds is this user's alone", label, path,
                           stat.S_IMODE(found.st_mode))  # fmt: skip
        elif found.st_mode & 0o022:
            raise PermissionError(f"{label} {path} is writable by group or others (mode "
                                  f"{stat.S_IMODE(found.st_mode):04o}): refused (what it holds "
                                  f"may not be this user's); chmod go-w {path}")  # fmt: skip
    return path


def private_file(path: Path) -> None:
    """Creates ``path`` empty with mode 0600 unless something is there already (left as it is;
    a link is never followed). SQLite gives a database's ``-wal`` and ``-shm`` files the
    database file's mode, so a database created here stays its owner's.

    Raises:
        OSError: it cannot be created.
    """
    try:
        no_links = getattr(os, "O_NOFOLLOW", 0)  # not on Windows
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | no_links, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class NotRegularFile(OSError):
    """A path read for its bytes that names no regular file: a FIFO, a device, a folder, or a
    link where links are not followed. Its message says which, in the words of
    :func:`file_kind`."""


def open_regular(path: Path, *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened for reading without blocking, refused unless the file opened is a regular
    one (``follow_links``: a link to one is; else a link is refused unread): a FIFO blocked the
    read until the process was killed, and ``/dev/zero`` was read without end. The check is of
    the file opened, not a ``stat`` before, which races.

    Raises:
        NotRegularFile: it is no regular file ("not a regular file (a FIFO)").
        OSError: it cannot be opened.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    no_links = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | no_links)
    except OSError as exc:
        if no_links and exc.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a link
            raise NotRegularFile("not a regular file (a link, not followed)") from None
        raise
    file = open(fd, "rb", closefd=True)  # noqa: SIM115 (returned open: the caller's to close)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        file.close()
        raise NotRegularFile(f"not a regular file ({file_kind(mode)})")
    return file


def read_bounded(file: BinaryIO, limit: int) -> bytes | None:
    """The bytes of ``file`` (from :func:`open_regular`), or ``None`` when it holds more than
    ``limit``: its size is looked at first, so a huge file is never read, and at most
    ``limit + 1`` bytes are, should it grow meanwhile."""
    if os.fstat(file.fileno()).st_size > limit:
        return None
    data = file.read(limit + 1)
    return None if len(data) > limit else data


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message ("a FIFO")."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return kind
    return "not a plain file"
