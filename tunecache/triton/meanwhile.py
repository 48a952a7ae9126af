"""Keys launched with the first config while the server did not answer, and when to ask again.

A server that does not answer is not a miss: the drop-in launches the kernel's first config and
tunes nothing (:mod:`tunecache.triton.outage`). That must not fix the key's config for the
process: a slow first lookup (connecting to a remote server), one shed 503 or a few seconds of
outage at start-up would otherwise leave a training job on its first configs for days. Such a
key is asked again at a launch once the server may be asked (``retry_after`` later, and the
server not marked down); one thread asks at a time, the others launch what is there meanwhile.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class Meanwhile:
    """The keys waiting to be asked again, each with the time before which it is not."""

    def __init__(self) -> None:
        self._due: dict[Any, float] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._due)  # the launch path's one test while no key waits

    def add(self, tuning_key: Any, wait: float) -> None:
        """``tuning_key`` is asked again no sooner than ``wait`` seconds from now."""
        with self._lock:
            self._due[tuning_key] = time.monotonic() + wait

    def due(self, tuning_key: Any, server: Callable[[], tuple[bool, float]]) -> bool:
        """Whether this thread asks for ``tuning_key`` again now: it waits, its time has come
        and the server is not down (``server()``: down, and how long it is then skipped, asked
        only then: it takes the shared client's lock); the next time is then that long away
        (another thread meanwhile launches what is there)."""
        now = time.monotonic()
        when = self._due.get(tuning_key)
        if when is None or now < when:
            return False
        down, wait = server()
        with self._lock:
            if self._due.get(tuning_key) != when or down:  # another thread took it meanwhile
                return False
            self._due[tuning_key] = now + wait
            return True

    def settle(self, tuning_key: Any) -> None:
        """``tuning_key`` is asked no more: answered (a config served, or a miss), or agreed."""
        with self._lock:
            self._due.pop(tuning_key, None)


def capturing() -> bool:
    """Whether a CUDA graph is being captured on this thread's stream: a lookup's check then
    would synchronise the device, which a capture forbids."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available()
                    and torch.cuda.is_current_stream_capturing())  # fmt: skip
    except Exception:  # a torch without it: no capture either
        return False
