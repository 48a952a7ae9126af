"""One client per process and settings, shared by every decorated kernel and thread, and the
environment's settings read once (a malformed variable taken as unset, with a warning)."""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from pathlib import Path

from tunecache.client import Client
from tunecache.policies import VersionPolicy
from tunecache.settings import Settings, settings_without_bad

logger = logging.getLogger("tunecache.triton.autotuner")


@functools.cache
def settings() -> Settings:
    """The environment's settings, read once; a malformed variable is taken as unset (a
    warning each): a bad ``TUNECACHE_*`` value must not break the user's import or launch."""
    found, problems = settings_without_bad()
    for problem in problems:
        logger.warning("tunecache.triton: %s; taking it as unset", problem)
    return found


_CREATING = threading.Lock()


def shared_client(url: str | None, snapshot: Path | None, policy: VersionPolicy) -> Client:
    """One client per process and settings, shared by every decorated kernel (and thread: 16
    threads' first launches at once made 16 clients, each with its pool, memo and thread)."""
    with _CREATING:
        return _shared_client(url, snapshot, policy)


@functools.cache
def _shared_client(url: str | None, snapshot: Path | None, policy: VersionPolicy) -> Client:
    found = settings()
    client = Client(url or found.url, timeout=found.timeout, token=found.token or "",
                    snapshot=snapshot, policy=policy, report_misses=True)  # fmt: skip
    # Disputes and miss reports still queued at exit reach the server (a few seconds at most).
    atexit.register(client.close)
    return client
