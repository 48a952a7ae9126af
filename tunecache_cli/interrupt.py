"""Ctrl-C during a tune: stopped within moments, said once, nothing printed after it.

Python runs a signal's handler in the main thread, between two steps of Python code. A tune's
main thread spends seconds at a time where none runs: inside TVM's C++ search (MetaSchedule's
first evolution went on 5.4 s after a Ctrl-C before it called back into Python), or waiting for
a measurement worker. So the signal is watched from a thread of its own, through
:func:`signal.set_wakeup_fd` (written by the C-level handler at once, whatever the main thread
is doing): at a Ctrl-C it silences the progress lines (:func:`tunecache_cli.progress.hush`),
and when the main thread has not unwound within :data:`GRACE_SECONDS` it says "interrupted"
itself, kills the worker processes and ends the process, exit 130. What the interrupted tune
had measured is dropped: only a finished, validated record is ever uploaded (kept in the
outbox first), and the tune had none.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator

from tunecache_cli import progress

GRACE_SECONDS = 1.0  # after a Ctrl-C, the main thread's time to unwind before the process ends
EXIT_INTERRUPTED = 130
MESSAGE = "tunecache: interrupted"
# A busy worker killed at a Ctrl-C (tuner.harness.processes.stop) leaves the semaphores it
# registered to Python's resource tracker, a process of its own, which unlinks them and warned of
# each on this terminal after the "interrupted" line (a CI run: "There appear to be 1 leaked
# semaphore objects"). The tracker and the workers take this process's warning options as -W.
QUIET_TRACKER = "ignore:resource_tracker:UserWarning"
_saying = threading.Lock()  # held while the line is said; by the watcher, until the end


def say_interrupted() -> None:
    """Prints the one "interrupted" line (the main thread's; waits, never to return, when the
    watcher is saying it as it ends the process)."""
    with _saying:
        print(MESSAGE, file=sys.stderr, flush=True)


@contextlib.contextmanager
def prompt() -> Iterator[None]:
    """For the block, a Ctrl-C silences the progress at once and ends the process within
    :data:`GRACE_SECONDS` (the main thread's ``KeyboardInterrupt`` still unwinds it meanwhile,
    its workers stopped on the way). Only in the main thread, where the wake-up fd can be set;
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if QUIET_TRACKER not in sys.warnoptions:  # read as workers and the tracker start
        sys.warnoptions.append(QUIET_TRACKER)
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()
    progress.hush(False)
    watcher = threading.Thread(target=_watch, args=(read, done), daemon=True,
                               name="tunecache-interrupt")  # fmt: skip
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write)  # the watcher's read ends
        watcher.join(timeout=GRACE_SECONDS)


def _watch(read: int, done: threading.Event) -> None:
    """The watcher thread: waits for a SIGINT's byte on ``read`` (its end: the block ended);
    then hushes the progress, and ends the process unless ``done`` is set within the grace."""
    with open(read, "rb", buffering=0) as pipe:  # closed on the way out
        while data := pipe.read(64):
            if signal.SIGINT in data:
                break
        else:
            return
    progress.hush()
    if done.wait(GRACE_SECONDS):
        return
    _saying.acquire()  # never released: the process ends
    if done.is_set():  # the main thread unwound meanwhile: it says it, and ends
        _saying.release()
        return
    print(MESSAGE, file=sys.stderr, flush=True)
    _end()


def _end() -> None:
    """Kills this process's worker processes (a worker left behind would finish its candidate,
    then fail to answer), and ends the process without unwinding it."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError, ValueError):
            child.kill()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)
