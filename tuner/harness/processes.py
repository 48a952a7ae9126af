"""Worker processes of the harness: started by spawn, told apart by their pipes, killed at will.

Both kinds of harness process run :func:`~tuner.harness.worker.worker_main`: the measurement
workers (:mod:`tuner.harness.pool`) and the compile farm's (:mod:`tuner.harness.farm`), which
start with an environment of their own (no Triton interpreter, no GPU).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from tunecache.errors import TuningError
from tuner.harness.messages import Request
from tuner.harness.worker import worker_main

STOP_GRACE_S = 5.0  # an idle worker asked to stop exits within this; then it is killed
_CONTEXT = multiprocessing.get_context("spawn")  # no fork: CUDA and thread pools don't survive it


@dataclass
class Slot:
    """One worker process and what it is doing."""

    process: BaseProcess
    conn: Connection
    config: str | None = None  # the request in flight (its config's label)
    deadline: float = 0.0
    tasks: set[str] = field(default_factory=set)  # tasks this process has set up
    built: set[tuple[str, str]] = field(default_factory=set)  # (task, config label) it compiled
    task: str | None = None  # the task of the request in flight (the farm's)


@contextmanager
def _interrupts_ignored_by_children() -> Iterator[None]:
    """Processes started inside ignore SIGINT from their first instruction (an ignored signal
    stays ignored across ``exec``), as does this process for the block: a Ctrl-C in the few
    milliseconds a start takes is lost (pressed again, it comes). Only the main thread may
    change a handler: elsewhere the block does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def start_worker(env: Mapping[str, str | None] | None = None, cores: list[int] | None = None,
                 preload: Sequence[str] = ()) -> Slot:  # fmt: skip
    """A new worker process; ``env`` changes its environment before it imports anything
    (``None`` removes a variable); ``cores``: a measurement worker's, pinned to them;
    ``preload``: modules it imports before it says it is ready."""
    parent, child = _CONTEXT.Pipe()
    process = _CONTEXT.Process(target=worker_main, args=(child, dict(env or {}), cores,
                                                         tuple(preload)), daemon=True)  # fmt: skip
    # Ctrl-C reaches the terminal's whole process group; the parent stops its workers, and a
    # worker reached while still importing printed a KeyboardInterrupt traceback of its own
    with _interrupts_ignored_by_children():
        process.start()
    child.close()
    return Slot(process=process, conn=parent)


def await_ready(slot: Slot, timeout: float) -> None:
    """Waits for a new worker's hello.

    Raises:
        TuningError: it did not start within ``timeout`` seconds, or died starting.
    """
    if not slot.conn.poll(timeout):
        kill(slot)
        raise TuningError(f"a measurement worker did not start in {timeout:g} s")
    try:
        slot.conn.recv()
    except EOFError:
        raise TuningError(f"a measurement worker died at start: {death(slot.process)}") from None


def await_all(slots: Sequence[Slot], timeout: float) -> None:
    """Waits for each new worker's hello, ``timeout`` seconds each; when one does not come (or
    the wait is interrupted), kills them all before raising: none is left running unowned.

    Raises:
        TuningError: a worker did not start within ``timeout`` seconds, or died starting.
    """
    try:
        for slot in slots:
            await_ready(slot, timeout)
    except BaseException:
        for slot in slots:
            kill(slot)
        raise


def kill(slot: Slot) -> None:
    if slot.process.is_alive():
        slot.process.kill()
    slot.process.join(timeout=5)
    slot.conn.close()


def stop(slots: list[Slot], grace: float = STOP_GRACE_S) -> None:
    """Stops every worker: an idle one is asked to and given ``grace`` seconds (all together,
    not each), one with a request in flight is killed at once.

    A worker ignores Ctrl-C and reads the next request only once it has answered the current
    one, so one asked to stop mid-build or mid-timing finished its candidate first: a Ctrl-C
    while both workers built took up to 5 s each, one after the other, on top of the search.
    Whatever a busy worker was doing is dropped anyway (the caller stops waiting for it).
    """
    import contextlib

    for slot in slots:
        if slot.config is not None:
            slot.process.kill()
            continue
        with contextlib.suppress(OSError, ValueError):
            slot.conn.send(Request(op="stop"))
    deadline = time.monotonic() + grace
    for slot in slots:
        slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
        kill(slot)


def death(process: BaseProcess) -> str:
    """Why a worker process ended, in a few words."""
    process.join(timeout=1)
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"
