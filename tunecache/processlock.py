"""A module's lock that a forked child does not inherit held.

A lock a parent thread held at the fork stays held in the child for good: the child's first
warning (or rank read) would wait for ever. A :class:`ProcessLock` is a new, free lock in each
forked child.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType


class ProcessLock:
    """A ``threading.Lock`` for module-level state, renewed in each forked child (for the
    process's lifetime: meant for module globals, not for objects made again and again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:  # fmt: skip
        self._lock.release()
