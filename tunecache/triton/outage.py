"""What the drop-in says once per process, not once per kernel, and whether a lookup failed.

A server that is down, or a process without a write token, is one fact about the process: a
library routed whole (``TUNECACHE_TRITON_AUTOTUNE=1``) has dozens of kernels, and one warning
each for the same cause buried the one line that mattered (20 lines for 20 kernels).
"""

from __future__ import annotations

import logging
from typing import Any

from tunecache.processlock import ProcessLock

logger = logging.getLogger("tunecache.triton.autotuner")
_said: set[str] = set()
_lock = ProcessLock()  # a forked child gets it free


def say_once(cause: str, message: str) -> None:
    """``message`` as a warning the first time this process meets ``cause``; debug after."""
    with _lock:
        first = cause not in _said
        _said.add(cause)
    (logger.warning if first else logger.debug)("tunecache.triton: %s", message)


def server_failed(client: Any) -> bool:
    """Whether the calling thread's lookup through ``client`` missed because the server gave
    no answer (down, failed, too slow), not because it had no record: with no server asked (a
    malformed ``TUNECACHE_URL``), never."""
    server = getattr(client, "server", None)
    if server is None or server not in client.resolver.sources:
        return False
    unanswered = getattr(server, "unanswered", None)
    return bool(unanswered()) if callable(unanswered) else False


def forget_outcome(client: Any) -> None:
    """Clears what the calling thread's last lookup through ``client`` met: a lookup answered
    by the memo or the snapshot (then refused here) does not ask the server, and must not be
    taken for the earlier lookup's outage."""
    forget = getattr(getattr(client, "server", None), "forget_outcome", None)
    if callable(forget):
        forget()
