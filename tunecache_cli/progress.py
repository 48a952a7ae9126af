"""Progress of a tuning run on stderr: the phase, how far it is, the best so far, elapsed and ETA.

On a terminal it is a live ``rich`` progress line that refreshes by itself (so it is never still);
otherwise, plain lines: one per report, and a heartbeat line when a phase has said nothing for
:data:`HEARTBEAT_SECONDS` — a long MetaSchedule batch or a slow candidate is never silent.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, TextIO

from backends.base import Progress

HEARTBEAT_SECONDS = 5.0
# When a printer last wrote a line, or the command started (:func:`command_started`); ``None``
# outside a command. A printer's silence counts from it: each phase's printer counted its own,
# and a TVM tune was silent 8.7 s from its start (3.7 s loading, then 5 s searching).
_SAID: list[float | None] = [None]
# When the command started (``None``: outside one): :func:`command_start`
_STARTED: list[float | None] = [None]
_SAID_LOCK = threading.Lock()  # a heartbeat thread's update never outlives the command's end
_HUSHED = threading.Event()  # set by :func:`hush`: no printer writes another line
_PRINTERS: weakref.WeakSet[ProgressPrinter] = weakref.WeakSet()  # made and not yet collected
PHASES = {"load": "loading", "search": "searching", "validate": "validating", "time": "timing",
          "upload": "uploading", "ask": "asking the server", "done": "done"}  # fmt: skip


def command_started(started: bool = True) -> None:
    """The command starts now (``False``: it ended): no printer's heartbeat waits longer than
    :data:`HEARTBEAT_SECONDS` after it, or after the last line any printer wrote."""
    with _SAID_LOCK:
        _SAID[0] = _STARTED[0] = time.monotonic() if started else None


def command_start() -> float | None:
    """When the command started (a ``time.monotonic()``), or ``None`` outside one: the time a
    one-key command's printer counts from (``since``), what it loaded before included."""
    return _STARTED[0]


def _said(now: float) -> None:
    """A printer wrote a line at ``now`` (within a command)."""
    with _SAID_LOCK:
        if _SAID[0] is not None:
            _SAID[0] = now


def hush(hushed: bool = True) -> None:
    """Silences every :class:`ProgressPrinter` from now on (``False``: lets them speak again).

    Ctrl-C calls it (:mod:`tunecache_cli.interrupt`): while a tune stopped its workers, the
    heartbeat still said "(still working)" after the interrupt, and the last line was to be
    "interrupted". A line being written as it is called is the last one: each is written under
    its printer's lock, which this takes.
    """
    if not hushed:
        _HUSHED.clear()
        return
    _HUSHED.set()
    for printer in list(_PRINTERS):
        with printer._lock:  # a line being written ends first; none starts after
            if printer._rich is not None:  # the live line stays as it is, the cursor shown
                printer._rich[0].stop()


@contextlib.contextmanager
def working(label: str, message: str, phase: str = "search", *, live: bool | None = None,
            since: float | None = None) -> Iterator[ProgressPrinter]:  # fmt: skip
    """A phase with no steps of its own to count (importing, compiling, checking): nothing if
    it ends within :data:`HEARTBEAT_SECONDS` (bad input stays one line), else a line saying
    what it is doing at least that often until it ends (``live``, ``since``:
    :class:`ProgressPrinter`'s)."""
    with ProgressPrinter(label, live=live, since=since) as printer:
        printer.expect(Progress(0, 0, message=message, phase=phase))
        yield printer


def asking(
    label: str, url: str, seconds: float | None = None
) -> contextlib.AbstractContextManager[ProgressPrinter]:
    """A wait on the server at ``url``, which a call gives up after ``seconds``: said every few
    seconds while it lasts, with that bound (a server that took the connection and never
    answered kept ``records ls`` silent for its whole timeout, then said only "still working"
    for a minute). ``None``: a client's default write timeout."""
    from tunecache.http import Timeout

    seconds = Timeout.write if seconds is None else seconds
    return working(label, f"at {url}, waiting for its answer up to {seconds:.0f} s a call",
                   phase="ask", live=False)  # a terminal's bar would stay  # fmt: skip


def eta_seconds(elapsed: float, done: int, total: int) -> float | None:
    """Seconds left at the pace so far, or ``None`` before the first step or without a count."""
    if done <= 0 or total <= 0 or done >= total:
        return None
    return elapsed / done * (total - done)


def _no_new_trial(event: Progress, last: Progress) -> bool:
    """Whether ``event`` counts no trial beyond ``last`` (same phase, same budget): its best
    then cannot be a trial of this run's, and "best" stays the best of the trials counted. A
    MetaSchedule search's closing report gives the best record of its local database, which
    holds earlier runs' records too: "[8/8] best 0.01616 ms meta_schedule: done" named a time
    that neither the trial table nor the closing line (the search's fastest, 0.01743 ms) had."""
    return bool(event.total) and event.total == last.total and event.done <= last.done


class Countdown:
    """An ETA that counts down between steps: the pace as of the last step, less the time since
    (waiting for the next step does not make the work left grow); never past ``deadline`` (a
    ``time.monotonic()``: when a ``--seconds`` budget stops the run, whatever the pace), and
    none once it has passed (what runs over the budget, the winner's validation, has no pace to
    go by: "ETA 0s" for as long as it lasts was not true either); none either once the
    countdown has run out before the next step (a step slower than the pace so far: the demo
    said "ETA 0s" for 20 s)."""

    def __init__(self, deadline: float | None = None) -> None:
        self._at: tuple[float, float] | None = None  # (seconds left, when) at the last step
        self.deadline = deadline

    def step(self, elapsed: float, done: int, total: int, now: float) -> None:
        """A step was made: ``done`` of ``total`` in ``elapsed`` seconds, at ``now``."""
        eta = eta_seconds(elapsed, done, total)
        self._at = None if eta is None else (eta, now)

    def left(self, now: float) -> float | None:
        """Seconds left at ``now``, or ``None`` before the first step, past the deadline or
        once the pace's countdown ran out."""
        at, deadline = self._at, self.deadline  # read once: the live line's thread asks too
        if at is None or (deadline is not None and now >= deadline):
            return None
        left = at[0] - (now - at[1])
        if left < 0:  # the step awaited is slower than the pace: no count to go by
            return None
        return left if deadline is None else min(left, deadline - now)


class ProgressPrinter:
    """Reports :class:`Progress` events for one run; use it as a context manager (it stops the
    heartbeat thread or the live display on exit).

    Args:
        label: what is being tuned, shown on every line.
        stream: where to write (this process's ``sys.stderr`` when made).
        live: a ``rich`` live line; by default when ``stream`` is a terminal.
        heartbeat: seconds of silence before a plain "still ..." line.
        seconds: the run's time budget (``--seconds``), from its first report on (the tuner
            starts its clock as it says what it searches with): no ETA goes past it.
        since: when the work shown began (a ``time.monotonic()``, :func:`command_start` for a
            one-key command), for the time each line shows; default: now.
    """

    def __init__(self, label: str, stream: TextIO | None = None, *, live: bool | None = None,
                 heartbeat: float = HEARTBEAT_SECONDS, seconds: float | None = None,
                 since: float | None = None) -> None:  # fmt: skip
        stream = sys.stderr if stream is None else stream  # now: not the one at import time
        self.label = label
        self.stream = stream
        self.started = time.monotonic()
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._last = Progress(done=0, total=0, phase="search")
        self._said_text = ""  # the last line printed, past its elapsed time
        self._phase_started = self.started
        said = _SAID[0]  # silence counts from the command's last line, or its start
        self._last_line = self.started if said is None else min(said, self.started)
        # The time shown counts from ``since``: a one-key command's, from its start (a --tvm
        # tune's first line, after 4 s loading TVM and the module, read "1.5s").
        self._shown_from = self.started if since is None else min(since, self.started)
        self._eta = Countdown()
        self._seconds = seconds
        self._expected = False  # the last event was only expected (:meth:`expect`): not printed
        self._stop = threading.Event()
        self._rich: Any = None
        self._thread: threading.Thread | None = None
        _PRINTERS.add(self)
        if stream.isatty() if live is None else live:
            self._start_rich()
        else:
            self._thread = threading.Thread(target=self._beat, daemon=True,
                                            name="tunecache-progress")  # fmt: skip
            self._thread.start()

    def __enter__(self) -> ProgressPrinter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops the heartbeat or the live line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
        if self._rich is not None:
            self._rich[0].stop()

    def __call__(self, event: Progress) -> None:
        now = time.monotonic()
        with self._lock:
            # A report of no new trial (MetaSchedule's rounds of candidates already measured) is
            # no step: its ETA grew at each, 133 s, 136 s, ... 146 s, with nothing measured.
            stepped = event.phase != self._last.phase or not _no_new_trial(event, self._last)
            if event.phase != self._last.phase:
                self._phase_started = now
            if event.phase == self._last.phase and (event.best_ms is None or _no_new_trial(
                    event, self._last)):  # fmt: skip
                event = Progress(event.done, event.total, self._last.best_ms, event.message,
                                 event.phase)  # fmt: skip
            self._last, self._expected = event, False
            if self._seconds is not None and self._eta.deadline is None:
                self._eta.deadline = now + self._seconds  # the budget's clock starts now
            if stepped:
                self._eta.step(now - self._phase_started, event.done, event.total, now)
            line = self._line(event, now)
            said = line.lstrip().split(" ", 1)[-1]  # past its elapsed time
            if self._rich is None and said == self._said_text and not _HUSHED.is_set():
                # It says again what the last line said (MetaSchedule's rounds of no new
                # candidate printed five identical lines in 0.2 s): not printed, nor counted as
                # said, so the heartbeat still says the run is working.
                return
            self._last_line = now
            _said(now)
            if _HUSHED.is_set():
                return
            if self._rich is not None:
                self._update_rich(event, line)
            else:
                self._said_text = said
                print(line, file=self.stream, flush=True)

    def expect(self, event: Progress) -> None:
        """What the run is doing, said by the heartbeat only (a phase that ends quickly prints
        nothing); on a terminal, the live line shows it at once."""
        with self._lock:
            self._last, self._expected = event, True
            if self._rich is not None and not _HUSHED.is_set():
                self._update_rich(event, "")

    def _line(self, event: Progress, now: float) -> str:
        elapsed = now - self._shown_from
        count = f" [{event.done}/{event.total}]" if event.total else ""
        best = f" best {event.best_ms:.4g} ms" if event.best_ms is not None else ""
        eta = self._eta.left(now)
        left = f" ETA {eta:.0f}s" if eta is not None else ""
        message = f" {event.message}" if event.message else ""
        phase = PHASES.get(event.phase, event.phase)
        return f"{elapsed:6.1f}s {self.label} {phase}{count}{best}{left}{message}"

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._lock:
                if now - self._last_line < self.heartbeat or self._last.phase == "done":
                    continue
                self._last_line = now
                _said(now)
                said = f"{self._last.message} " if self._expected else ""
                still = Progress(self._last.done, self._last.total, self._last.best_ms,
                                 f"{said}(still working)", self._last.phase)  # fmt: skip
                line = self._line(still, now)
                if not _HUSHED.is_set():
                    print(line, file=self.stream, flush=True)

    def _start_rich(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            ProgressColumn,
            Task,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as Bar
        from rich.table import Column
        from rich.text import Text

        countdown = self._eta

        class Eta(ProgressColumn):  # the plain lines' ETA, counted down at each refresh
            def render(self, task: Task) -> Text:
                left = countdown.left(time.monotonic())
                return Text("ETA " + ("-" if left is None else f"{left:.0f}s"))

        # The note takes what the line leaves, cut short: a long note squeezed the count, the
        # time and the ETA to "…". Text is shown as it is: a label's "[...]" is no markup.
        note = Column(ratio=1, no_wrap=True, overflow="ellipsis")
        bar = Bar(
            TextColumn("{task.description}", markup=False), BarColumn(bar_width=20),
            MofNCompleteColumn(), TextColumn("{task.fields[best]}", markup=False),
            TimeElapsedColumn(), Eta(),
            TextColumn("{task.fields[note]}", markup=False, table_column=note),
            console=Console(file=self.stream), refresh_per_second=4, expand=True,
        )  # fmt: skip
        task = bar.add_task(f"{self.label} searching", total=None, best="", note="",
                            phase="search")  # fmt: skip
        bar.start()
        self._rich = (bar, task)

    def _update_rich(self, event: Progress, line: str) -> None:
        bar, task = self._rich
        if event.phase != bar.tasks[0].fields.get("phase"):
            # elapsed and ETA count from the phase start
            bar.reset(task, phase=event.phase, best="", note="")
        best = f"best {event.best_ms:.4g} ms" if event.best_ms is not None else ""
        phase = PHASES.get(event.phase, event.phase)
        bar.update(task, description=f"{self.label} {phase}", total=event.total or None,
                   completed=event.done, best=best, note=event.message[:60],
                   visible=True)  # fmt: skip
        if event.phase == "done" or event.message.startswith("rejected"):
            bar.console.print(line, markup=False, highlight=False)  # stays in the scrollback
        if event.phase == "done":  # said in full above: the live line's last frame showed it
            bar.update(task, visible=False)  # again, cut off
