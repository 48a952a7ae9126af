"""Keeps a timed call's threads apart while it is timed: the timing thread on the core it is on,
every other thread of the process on the other cores; as they were afterwards.

Left to the scheduler, a process's threads can share a core for as long as it lives: on a 2-core
VM, torch eager's two OpenMP threads timed a 128×128×128 matmul at 26.6 µs in one process and
34.4 µs in the next (where the scheduler placed its threads), so its ratio to a
one-thread TVM kernel read 0.56 in one process and 0.72 in another. Apart, six processes in a
row timed 26.2-27.5 µs. Threads are set one by one through ``/proc/self/task`` (Linux); elsewhere,
or with one core, nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_TASKS = "/proc/self/task"


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_TASKS) if name.isdigit()]
    except OSError:
        return []


def _core_of(tid: int) -> int | None:
    """The core thread ``tid`` last ran on (``/proc``'s ``processor`` field), or ``None``."""
    try:
        with open(f"{_TASKS}/{tid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def apart() -> Iterator[int | None]:
    """For the block, the calling thread on its current core and the process's other threads on
    the rest; yields that core (``None``: nothing was changed). Threads started meanwhile, and
    every thread afterwards, get their own mask back (a new one, the caller's original)."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    me = threading.get_native_id()
    try:
        cores = set(os.sched_getaffinity(0))
    except OSError:
        yield None
        return
    here = _core_of(me)
    if len(cores) < 2 or here not in cores:
        yield None
        return
    saved: dict[int, set[int]] = {}
    for tid in _threads():
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to set
            saved[tid] = set(os.sched_getaffinity(tid))
            os.sched_setaffinity(tid, {here} if tid == me else cores - {here})
    try:
        yield here
    finally:
        for tid in _threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, saved.get(tid, cores))
