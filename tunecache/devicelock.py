"""One timing at a time on a device, across processes: two tuners that share a GPU or cores
time their candidates in turn, not at once.

Two processes timing on one GPU at once share its SMs in time slices: each one's CUDA events
time the other's turns too, and both tunes store times of the machine, not of their kernels
(NVML names the other process, where it is installed, and the timing is flagged noisy, but the
time is kept). On the CPU, two timings on the same cores preempt each other. So every timing
(:mod:`tunecache.timing`, and TVM's runner) holds the device's lock while it runs: an advisory
``flock`` on a file per GPU (by its UUID, whatever ``CUDA_VISIBLE_DEVICES`` numbers it) and per
CPU core the process may run on (taken in core order: two processes pinned to different cores
do not wait for each other, overlapping ones do). Compiles, checks and everything else go on
while another process times.

The lock files live in ``TUNECACHE_LOCK_DIR`` (:func:`tunecache.settings.lock_dir`): by default
the user's own cache folder, so the processes of one user take turns; a team whose tuners run as
several users on one machine points them all at one folder they can all write. A lock is never
waited for longer than :data:`MAX_WAIT_S`: a holder that hangs (stopped in a debugger) does not
stall the tune; the timing then runs beside it, marked noisy for that reason, and until this
process gets the lock again it does not wait for it. A folder that is not a plain folder (a
link) is not used: timings then take no turns, as before, and a warning says so once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tunecache.settings import lock_dir

try:
    import fcntl
except ImportError:  # not on Windows: no turns
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MAX_WAIT_S = 30.0  # the longest a timing waits for its device
_POLL_S = (0.001, 0.05)  # first and longest pause between tries


@dataclass(frozen=True)
class Turn:
    """How a timing got its device: seconds waited, and whether another process may have been
    timing on it meanwhile (its lock could not be had within :data:`MAX_WAIT_S`)."""

    waited_s: float = 0.0
    shared: bool = False

    @property
    def noise(self) -> list[str]:
        """The noise reason this turn gives the timing (none when it had the device)."""
        if not self.shared:
            return []
        return [f"another process held the device's timing lock over {MAX_WAIT_S:g} s"]


class _Locks:
    """This process's lock files (opened once: a file a core), its turn and its depth."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.files: dict[str, int] = {}  # by path
        self.given_up: set[str] = set()  # paths waited out: tried, not waited for, until had
        self.turn = threading.RLock()  # one timing at a time in this process too
        self.depth = 0
        self.warned = False


_locks = _Locks()


def _mine() -> _Locks:
    """This process's locks (a forked child's own: its parent's descriptors share its locks)."""
    global _locks
    if _locks.pid != os.getpid():
        for fd in _locks.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        _locks = _Locks()
    return _locks


@contextlib.contextmanager
def timing_on(device: str) -> Iterator[Turn]:
    """Holds ``device`` (``"cpu"``, or ``"cuda"``: the current CUDA device) for the block, and
    yields the :class:`Turn` it got. Never raises for want of a lock."""
    locks = _mine()
    began = time.monotonic()
    if fcntl is None or not locks.turn.acquire(timeout=MAX_WAIT_S):  # no flock; a hung thread
        yield Turn(time.monotonic() - began, shared=fcntl is not None)
        return
    try:
        held: list[int] = []
        shared = False
        if not locks.depth:  # else a timing inside a timing: the device is this process's
            held, shared = _take(locks, _files(locks, _names(device)), began + MAX_WAIT_S)
        locks.depth += 1
        try:
            yield Turn(time.monotonic() - began, shared)
        finally:
            locks.depth -= 1
            for fd in held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        locks.turn.release()


def _take(locks: _Locks, files: dict[str, int], deadline: float) -> tuple[list[int], bool]:
    """Locks ``files`` in order, each waited for until ``deadline`` (only tried, when waited
    out before); the descriptors locked, and whether one could not be."""
    held: list[int] = []
    shared = False
    for path, fd in files.items():
        try:
            got = _lock(fd, deadline if path not in locks.given_up else 0.0)
        except OSError as exc:  # a file system without flock: no turns on it
            _warn_once(locks, f"cannot lock {path}: {exc.strerror or exc}")
            continue
        if got:
            locks.given_up.discard(path)
            held.append(fd)
            continue
        if path not in locks.given_up:
            logger.warning("%s: held by another process over %g s; timing beside it (noted as "
                           "noise) until it is free", path, MAX_WAIT_S)  # fmt: skip
            locks.given_up.add(path)
        shared = True
    return held, shared


def _lock(fd: int, deadline: float) -> bool:
    """Whether ``fd``'s lock was had before ``deadline`` (tried at least once)."""
    assert fcntl is not None
    pause = _POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(pause)
        pause = min(2 * pause, _POLL_S[1])


def _names(device: str) -> list[str]:
    """The lock files a timing on ``device`` takes: one per core this process may run on, in
    core order; the current GPU's; none for another device."""
    if device == "cpu":
        try:
            cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = list(range(os.cpu_count() or 1))
        return [f"cpu{core}" for core in cores]
    if device == "cuda":
        import torch

        found = _gpu_name(torch.cuda.current_device())
        return [] if found is None else [found]
    return []


@functools.cache
def _gpu_name(index: int) -> str | None:
    """GPU ``index``'s lock name, by its UUID (``None``: this torch does not say it)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return None if uuid is None else f"gpu-{uuid}"


def _files(locks: _Locks, names: list[str]) -> dict[str, int]:
    """``names``' lock files (by path, in ``names``' order), opened (made if need be) once per
    process."""
    folder = _folder(locks)
    if folder is None:
        return {}
    flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    found: dict[str, int] = {}
    for name in names:
        path = str(folder / f"{name}.lock")
        if path not in locks.files:
            try:  # never through a link: a file someone else planted is not ours to make
                locks.files[path] = os.open(path, flags, 0o666)
            except OSError as exc:
                _warn_once(locks, f"cannot open {path}: {exc.strerror or exc}")
                continue
        found[path] = locks.files[path]
    return found


def _folder(locks: _Locks) -> Path | None:
    """The lock folder, made (private) if missing; ``None`` when it is not a plain folder."""
    folder = lock_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise NotADirectoryError("not a plain folder (a link?)")
    except OSError as exc:
        _warn_once(locks, f"lock folder {folder}: {exc.strerror or exc}")
        return None
    return folder


def _warn_once(locks: _Locks, why: str) -> None:
    if not locks.warned:
        locks.warned = True
        logger.warning("%s: timings take no turns with other processes' (TUNECACHE_LOCK_DIR)", why)
