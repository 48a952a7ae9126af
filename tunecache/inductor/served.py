"""Which groups of Inductor's choice file came from the server: a record beside the file.

Inductor's choice file (:mod:`tunecache.inductor.choices`) is persistent state: every later
compile on that cache folder reads it, with tunecache on or off, and Inductor prefers what it
holds to benchmarking. A served group merged into it stays there until something takes it out;
nothing in the file says it was served. This record says so: for each group :func:`enable
<tunecache.inductor.enable>` merged, its identity (op, inputs key and precision, hashed) and a
digest of the times merged (:func:`identity`, :func:`digest`), in ``<choice file>`` +
:data:`SUFFIX`. A group of the file whose pair is in the record is still exactly a served copy:
it is taken out when the server no longer serves it so (revoked, disputed, replaced), and never
uploaded as this machine's own. A group Inductor timed or re-timed here has another digest, or
none recorded: it is never taken out, and it is what an upload shares.

The record is data from a file anyone with the cache folder may have written: it is parsed as
JSON, bounded (:data:`MAX_RECORD_BYTES`, :data:`MAX_ENTRIES`), and anything else about it (missing,
unreadable, malformed) reads as "nothing merged": every group of the file is then taken as timed
here, as before there was a record. It names groups by hash only: it can make a group count as
served (then it is not uploaded, and is taken out if not served so), never add one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from tunecache import folders
from tunecache.devicelock import poll_lock
from tunecache.jsonsafe import parse_json

logger = logging.getLogger(__name__)

SUFFIX: Final = ".tunecache-served.json"
FORMAT: Final = "tunecache.inductor.served/1"
MAX_RECORDED: Final = 32_768  # served groups one file may hold: about 140 bytes each here
MAX_ENTRIES: Final = 2 * MAX_RECORDED  # a record may hold the pairs before and after one merge
MAX_RECORD_BYTES: Final = MAX_ENTRIES * 160

LOCK_SUFFIX: Final = ".tunecache-lock"
LOCK_WAIT_S: Final = 10.0  # then the merge goes on unlocked, warned

Pair = tuple[str, str]  # (identity, digest)
_HEX = re.compile(r"[0-9a-f]{64}\Z")


def record_path(choice_file: Path) -> Path:
    """The record of ``choice_file``: beside it, its name plus :data:`SUFFIX`."""
    return choice_file.with_name(choice_file.name + SUFFIX)


def identity(op: str, inputs: str, precision: str) -> str:
    """A group's identity: its op, inputs key and precision, hashed (unambiguous, fixed size)."""
    return hashlib.sha256(json.dumps([op, inputs, precision]).encode()).hexdigest()


def digest(timings: Mapping[str, float]) -> str:
    """A digest of a group's times: the same for the same choices and times, in any order."""
    canonical = json.dumps(sorted((choice, float(ms)) for choice, ms in timings.items()))
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_record(choice_file: Path) -> set[Pair]:
    """The (identity, digest) pairs merged into ``choice_file``; none when the record is missing,
    past its bound, unreadable or malformed (with a warning for the last three)."""
    path = record_path(choice_file)
    try:
        if not path.is_file():
            return set()
        if path.stat().st_size > MAX_RECORD_BYTES:
            logger.warning("%s is past %d bytes: read as no served group", path, MAX_RECORD_BYTES)
            return set()
        document = parse_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        logger.warning("%s cannot be read (%s): read as no served group", path, exc)
        return set()
    pairs = _pairs(document)
    if pairs is None:
        logger.warning("%s is not tunecache's record: read as no served group", path)
        return set()
    return pairs


def _pairs(document: object) -> set[Pair] | None:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return None
    entries = document.get("groups")
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        return None
    pairs: set[Pair] = set()
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(part, str) and _HEX.match(part) for part in entry)):  # fmt: skip
            return None
        pairs.add((entry[0], entry[1]))
    return pairs


def write_record(choice_file: Path, pairs: Iterable[Pair]) -> None:
    """Writes the record of ``choice_file`` whole (removes it when there is no pair), keeping
    the mode of the record it replaces (:func:`tunecache.folders.shared_mode`: every user of a
    shared cache folder reads it; it was rewritten 0600).

    Raises:
        OSError: it cannot be written.
    """
    path = record_path(choice_file)
    entries = sorted(set(pairs))
    if not entries:
        path.unlink(missing_ok=True)
        return
    text = json.dumps({"format": FORMAT, "groups": [list(pair) for pair in entries]})
    path.parent.mkdir(parents=True, exist_ok=True)
    folders.write_atomic(path, text.encode("ascii"), mode=folders.shared_mode(path))


@contextlib.contextmanager
def locked(choice_file: Path) -> Iterator[None]:
    """Holds the lock of ``choice_file`` and its record (an advisory ``flock`` on a file beside
    them) while they are read and written: two processes merging at once each wrote the record
    whole, and a group one of them merged was left out of it, so counted as this machine's own
    and uploaded. Waits at most :data:`LOCK_WAIT_S`; a lock that cannot be had (a link, a
    folder that cannot be written, a holder that hangs) is gone on without, warned."""
    path = choice_file.with_name(choice_file.name + LOCK_SUFFIX)
    fd = None
    try:
        fd = _opened(path)
    except OSError as exc:
        logger.warning("%s cannot be opened (%s): choice groups merged without a lock", path, exc)
    try:
        if fd is not None and not _taken(fd, time.monotonic() + LOCK_WAIT_S):
            logger.warning("%s held for %.0f s: choice groups merged without it", path,
                           LOCK_WAIT_S)  # fmt: skip
        yield
    finally:
        if fd is not None:
            os.close(fd)  # lets the lock go


def _opened(path: Path) -> int:
    """The lock file, created if missing (readable by all: a team's shared cache folder holds
    one lock for every user), else opened for reading only where it is another user's (a lock
    is taken on any open file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY | flags)


def _taken(fd: int, deadline: float) -> bool:
    try:
        return poll_lock(fd, deadline)
    except OSError:  # a file system without locks
        return False
