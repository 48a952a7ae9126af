"""Folders a command writes into (``report -o DIR``, ``sync --format vllm-moe -o DIR``): made if
need be and checked writable before any work, each refusal one line; the one way a local file
is written whole (:func:`write_atomic`); and private folders and files, which only their owner
can read (:func:`private_folder`, :func:`private_file`: the server's default database)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from tunecache.errors import InvalidInput


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


def private_folder(path: Path) -> Path:
    """``path`` as a folder only its owner can open (0700), made with its missing parents; one
    found open to others (made by an older version) is closed to 0700. Only for a folder the
    product owns (the default database's), never one a user named.

    Raises:
        OSError: it cannot be made or closed, or is not a plain folder (a file, or a link).
    """
    with contextlib.suppress(FileExistsError):  # a file or a link there: said below
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(0, f"{path} is not a plain folder (a file, or a link)")
    if mode & 0o077:
        os.chmod(path, 0o700)
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
