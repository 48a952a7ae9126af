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
several users on one machine points them all at one folder they can all write. (Create such a folder
yourself, mode 1777: one this library makes is private.) Turns are fair: a waiter takes the
lock's gate before the lock, so a process that times back to back cannot take the device again
while another waits. A turn is never waited for longer than :data:`MAX_WAIT_S`: a holder that
hangs (stopped in a debugger) does not stall the tune; the timing then runs beside it, flagged
noisy for that reason, and until this process gets that lock again it only tries it. A folder
or lock file that is a link or not a plain one (a FIFO) is not used: timings then take no turns,
as before, and a warning says so once. Nothing here raises into the timing for want of a lock.
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
from dataclasses import dataclass, field
from pathlib import Path

from tunecache.settings import lock_dir, lock_warned, mark_lock_warned

try:
    import fcntl
except ImportError:  # not on Windows: no turns
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MAX_WAIT_S = 30.0  # the longest a timing waits for its device
_POLL_S = (0.001, 0.01)  # first and longest pause between tries
_REOPENS = 3  # a lock file removed or replaced while waited for: opened again, this often


@dataclass(frozen=True)
class Turn:
    """How a timing got its device: seconds waited, and whether another timing may have run on
    it meanwhile (a lock could not be had within :data:`MAX_WAIT_S`)."""

    waited_s: float = 0.0
    shared: bool = False

    @property
    def noise(self) -> list[str]:
        """The noise reason this turn gives the timing (none when it had the device)."""
        if not self.shared:
            return []
        return [f"another timing held the device's lock over {MAX_WAIT_S:g} s"]


@dataclass
class _Hold:
    path: str
    lock: threading.Lock
    fd: int | None = None


@dataclass
class _State:
    """This process's turns: a thread lock per lock file (threads of one process share its
    ``flock``\\ s), what each thread holds, the descriptors open (closed in a forked child: its
    copies would hold the parent's locks past the parent's end)."""

    pid: int = field(default_factory=os.getpid)
    threads: dict[str, threading.Lock] = field(default_factory=dict)
    local: threading.local = field(default_factory=threading.local)
    open_fds: set[int] = field(default_factory=set)
    given_up: set[str] = field(default_factory=set)  # waited out: only tried, until had
    guard: threading.Lock = field(default_factory=threading.Lock)
    warned: bool = False

    def mine(self) -> set[str]:
        """The lock files this thread holds."""
        if not hasattr(self.local, "paths"):
            self.local.paths = set()
        paths: set[str] = self.local.paths
        return paths

    def thread_lock(self, path: str) -> threading.Lock:
        with self.guard:
            return self.threads.setdefault(path, threading.Lock())


_state = _State()


def _forget_in_child() -> None:
    """A forked child closes the lock files it inherited and holds no turn."""
    global _state
    for fd in _state.open_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _state = _State(warned=_state.warned)  # said once in the parent is said


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@contextlib.contextmanager
def timing_on(device: str) -> Iterator[Turn]:
    """Holds ``device`` (``"cpu"``, or ``"cuda"``: the current CUDA device) for the block, and
    yields the :class:`Turn` it got. Never raises for want of a lock.

    A timing inside a timing takes what the outer one does not hold only if it is free at once
    (waiting for it could deadlock against another process's order).
    """
    state = _state
    began = time.monotonic()
    held: list[_Hold] = []
    try:
        shared = fcntl is not None and _take(state, _names(device), began, held)
        yield Turn(time.monotonic() - began, shared)
    finally:
        _release(state, held)


def _take(state: _State, names: list[str], began: float, held: list[_Hold]) -> bool:
    """Takes ``names``' locks in order into ``held`` (released by the caller however this
    ends); whether one could not be had in time."""
    folder = _folder(state)
    if folder is None:
        return False
    mine = state.mine()
    nested = bool(mine)
    shared = False
    for name in names:
        path = str(folder / f"{name}.lock")
        if path in mine:
            continue
        deadline = 0.0 if nested else began + MAX_WAIT_S
        lock = state.thread_lock(path)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            shared = True  # another thread of this process holds it
            continue
        hold = _Hold(path, lock)
        held.append(hold)
        mine.add(path)
        hold.fd, busy = _flock(state, path, 0.0 if path in state.given_up else deadline)
        shared = shared or busy
    return shared


def _flock(state: _State, path: str, deadline: float) -> tuple[int | None, bool]:
    """``path`` opened and locked by ``deadline`` (tried once at least), and whether another
    process held it past then; ``(None, False)`` where it cannot be used (warned)."""
    assert fcntl is not None
    for _ in range(_REOPENS):
        fd = _open(state, path)
        if fd is None:
            return None, False
        try:
            got = _fairly(state, path, fd, deadline)
        except BaseException as exc:
            _close(state, fd)
            if not isinstance(exc, OSError):
                raise
            _warn_once(state, f"cannot lock {path}: {exc.strerror or exc}")
            return None, False
        if not got:
            _close(state, fd)
            if path not in state.given_up:
                logger.warning("%s: held by another process over %g s; timing beside it (noted "
                               "as noise) until it is free", path, MAX_WAIT_S)  # fmt: skip
                state.given_up.add(path)
            return None, True
        if _same_file(fd, path):
            state.given_up.discard(path)
            return fd, False
        _close(state, fd)  # removed or replaced while waited for: the file there now decides
    return None, True


def _fairly(state: _State, path: str, fd: int, deadline: float) -> bool:
    """Locks ``fd`` through ``path``'s gate: a process that just let the lock go finds the gate
    held by the one waiting, and waits its turn."""
    gate = _open(state, path.removesuffix(".lock") + ".gate")
    try:
        if gate is not None and not poll_lock(gate, deadline):
            return False
        return poll_lock(fd, deadline)
    finally:
        if gate is not None:
            _close(state, gate)


def poll_lock(fd: int, deadline: float) -> bool:
    """Whether ``fd``'s ``flock`` was had before ``deadline`` (tried at least once; another
    process's hold polled, the pause doubling)."""
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


def _release(state: _State, held: list[_Hold]) -> None:
    """Lets ``held`` go (not in a forked child: they are its parent's)."""
    if state is not _state:
        return
    mine = state.mine()
    for hold in reversed(held):
        if hold.fd is not None:
            _close(state, hold.fd)  # the last descriptor of the lock: it is let go
        mine.discard(hold.path)
        hold.lock.release()


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


def _open(state: _State, path: str) -> int | None:
    """``path`` opened for locking, made (readable by all: any user of a shared folder may lock
    it) if missing; never through a link, never a FIFO or device (``None``, warned)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                with contextlib.suppress(OSError):
                    os.fchmod(fd, 0o644)  # whatever the umask
            except FileExistsError:  # another process made it meanwhile
                fd = os.open(path, flags)
    except OSError as exc:
        _warn_once(state, f"cannot open {path}: {exc.strerror or exc}")
        return None
    state.open_fds.add(fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        _close(state, fd)
        _warn_once(state, f"{path} is not a plain file")
        return None
    return fd


def _close(state: _State, fd: int) -> None:
    state.open_fds.discard(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        opened, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (there.st_dev, there.st_ino)


def _folder(state: _State) -> Path | None:
    """The lock folder, made (private) if missing; ``None`` when it is not a plain folder."""
    folder = lock_dir().absolute()
    try:
        with contextlib.suppress(FileExistsError):  # a file or a link there: said below
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise NotADirectoryError(0, "not a plain folder (a file, or a link)")
    except OSError as exc:
        _warn_once(state, f"lock folder {folder}: {exc.strerror or exc}")
        return None
    return folder


def check_folder() -> None:
    """Says now (once) when the lock folder cannot be used: called before a tune starts its
    worker processes, which then say it no more (:func:`tunecache.settings.lock_warned`): a tune
    said it twice, once from MetaSchedule's runner and once from its own re-timing."""
    _folder(_state)


def _warn_once(state: _State, why: str) -> None:
    if not state.warned and not lock_warned():
        state.warned = True
        mark_lock_warned()
        logger.warning("%s: timings take no turns with other processes' (TUNECACHE_LOCK_DIR)", why)
