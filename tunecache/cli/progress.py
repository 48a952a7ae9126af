"""Progress lines for long CLI runs, on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from backends.base import Progress


class ProgressPrinter:
    """Prints each progress report as one line: elapsed time, label, trial count, best time."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, event: Progress) -> None:
        elapsed = time.monotonic() - self.started
        count = f" [{event.done}/{event.total}]" if event.total else ""
        best = f" best {event.best_ms:.4g} ms" if event.best_ms is not None else ""
        message = f" {event.message}" if event.message else ""
        print(f"{elapsed:6.1f}s {self.label}{count}{best}{message}", file=self.stream, flush=True)
