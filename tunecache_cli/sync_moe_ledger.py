"""What ``sync --format vllm-moe`` wrote into a folder, so that a later sync removes the files
the cache no longer serves.

A file written from an imported entry or a tuned winner stayed in ``VLLM_TUNED_CONFIG_FOLDER``
after its token was revoked with ``--withdraw``, its record disputed or its artifact deleted:
the engine kept using it, and the next sync said "wrote 0 files". Each sync now keeps a ledger
of the files it wrote into a folder, for each device, and the SHA-256 of their bytes, in this
user's work folder (:func:`ledger_path`: the engine's folder holds the engine's files only); a
later sync of that device into that folder removes those it no longer writes whose bytes are
still the ones it wrote (a file changed since, or one it never wrote, is the user's, never
touched). A sync that reads no imported files (no ``--accept imported``) keeps the files it
wrote from them: it cannot tell whether they are still served. The ledger is read bounded, each
name held to the engine's file names of its device. A file that was there before the sync
wrote it, and not as the ledger has it, is the user's: overwritten (as a sync always did), never
removed. The ledger is written after each device (a later device's failure keeps what the first
wrote). A sync holds its ledger (:func:`held`) from its read to its last write: two syncs into one
folder at once each kept only their own devices' entries, and the other's files were never
removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tunecache.errors import InvalidInput
from tunecache.folders import own_folder, write_atomic
from tunecache.vllm_moe import MoeShape

MAX_LEDGER_BYTES = 4 * 2**20  # thousands of files' names and digests
# A file's entry: its digest, and whether an imported file went into it (kept by a sync that
# reads none).
Ledger = dict[str, dict[str, tuple[str, bool]]]  # device -> file name -> (sha256, imported)


def ledger_path(folder: Path, url: str) -> Path:
    """Where the ledger of syncs from the server at ``url`` into ``folder`` is kept: this
    user's work folder's ``vllm-moe-sync``, named by the server and the folder's resolved path
    (a sync from another server removed every file the first one's wrote)."""
    from tunecache.settings import work_dir

    name = hashlib.sha256(f"{url}\0{folder.resolve()}".encode()).hexdigest()
    return work_dir() / "vllm-moe-sync" / f"{name}.json"


@contextlib.contextmanager
def held(folder: Path, url: str) -> Iterator[Ledger]:
    """The ledger of syncs from ``url`` into ``folder`` (:func:`read_ledger`), held from this
    read until the block ends: another sync of the two waits for it, said once. Its folder is
    this user's alone, checked before anything is read in it (a link planted there had its
    ledger read through it, to remove the engine's files it names).

    Raises:
        InvalidInput: the ledgers' folder or the lock cannot be used (naming it).
    """
    path = ledger_path(folder, url)
    lock = path.with_suffix(".lock")
    try:
        own_folder(path.parent, "the sync ledgers' folder")
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(lock, flags, 0o600)
    except OSError as exc:
        raise InvalidInput(f"{lock}: cannot be used ({exc.strerror or exc})") from None
    try:
        _lock(fd, folder)
        yield read_ledger(folder, url)
    finally:
        os.close(fd)  # the lock with it


def _lock(fd: int, folder: Path) -> None:
    """Takes the lock on ``fd``, waiting (said once) while another sync into ``folder`` holds
    it."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"waiting for another sync from this server into {folder} to end",
              file=sys.stderr)  # fmt: skip
        fcntl.flock(fd, fcntl.LOCK_EX)


def read_ledger(folder: Path, url: str) -> Ledger:
    """The ledger of syncs from ``url`` into ``folder``; empty where there is none, or it
    cannot be read as one (an entry not of its device's file names, or not a digest, is left
    out)."""
    path = ledger_path(folder, url)
    try:
        if path.is_symlink() or not path.is_file():
            return {}
        with path.open("rb") as file:
            data = file.read(MAX_LEDGER_BYTES + 1)
        document = json.loads(data) if len(data) <= MAX_LEDGER_BYTES else None
    except (OSError, ValueError):
        return {}
    ledger: Ledger = {}
    for device, files in document.items() if isinstance(document, dict) else ():
        if isinstance(files, dict):
            ledger[device] = {name: (entry[0], entry[1]) for name, entry in files.items()
                              if _owned(device, name, entry)}  # fmt: skip
    return ledger


def _owned(device: object, name: str, entry: object) -> bool:
    """Whether ``name`` and ``entry`` are a ledger's entry of a file of ``device``."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
            and len(entry[0]) == 64 and isinstance(entry[1], bool)):  # fmt: skip
        return False
    try:
        shape = MoeShape.parse(name)
    except InvalidInput:
        return False
    return shape.file_name() == name and shape.device_name == device


def digest(path: Path) -> str:
    """The SHA-256 of the file at ``path`` as a ledger keeps it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prune(folder: Path, written: dict[str, tuple[str, bool]], before: dict[str, tuple[str, bool]],
          imported_read: bool) -> list[str]:  # fmt: skip
    """Removes the files of ``before`` (a device's ledger) not in ``written`` (this sync's)
    whose bytes are still those the ledger holds; returns their names. A file an imported entry
    went into is kept where this sync read no imported files (``imported_read``)."""
    removed = []
    for name, (sha, imported) in sorted(before.items()):
        if name in written or (imported and not imported_read):
            continue
        if not as_written(folder, name, sha):
            continue  # the user's now
        try:
            (folder / name).unlink()
        except OSError:
            continue
        removed.append(name)
    return removed


def as_written(folder: Path, name: str, sha: str) -> bool:
    """Whether ``name`` in ``folder`` is a plain file still holding the bytes of digest
    ``sha`` (what a sync wrote), not a link, nor changed since."""
    path = folder / name
    try:
        return not path.is_symlink() and path.is_file() and digest(path) == sha
    except OSError:
        return False


def write_ledger(folder: Path, url: str, ledger: Ledger) -> None:
    """Writes ``ledger`` as the ledger of syncs from ``url`` into ``folder``, whole.

    Raises:
        InvalidInput: it cannot be written (naming it).
    """
    path = ledger_path(folder, url)
    data = json.dumps({d: {n: list(e) for n, e in sorted(f.items())} for d, f in
                       sorted(ledger.items()) if f}, indent=1).encode()  # fmt: skip
    try:
        own_folder(path.parent, "the sync ledgers' folder")
        write_atomic(path, data)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be written ({exc.strerror or exc})") from None
