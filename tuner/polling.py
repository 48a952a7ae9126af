"""Asking a server for work: claims with back-off while it is away or while work fails
(:func:`poll`), and a claimed job's lease renewed while it runs (:func:`leased`). The tuning
daemon and the verifier share them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from tunecache.client import Client
from tunecache.errors import ServerError
from tunecache.jobs import JobPublic
from tunecache.server_source import unreachable

logger = logging.getLogger("tuner.daemon")  # the daemon's log, which its command shows
T = TypeVar("T")

MAX_BACKOFF = 60.0  # seconds between claims while the server does not answer
FAILED_WAIT = 0.1  # seconds before the claim after a failed job, doubling with each in a row


def passing(exc: ServerError) -> bool:
    """Whether a call's failure may pass (the server restarting, unreachable, overloaded, a
    proxy's 502 meanwhile), rather than an answer that asking again cannot change (a revoked
    token: 401, 403; an answer this client cannot read, after which a claim was made but not
    taken)."""
    return unreachable(exc) or exc.status_code in (408, 429)


def poll(claim: Callable[[], T | None], work: Callable[[T], object], *,
         stopping: threading.Event, once: bool, every: float) -> None:  # fmt: skip
    """Claims and works on what it claimed until ``stopping`` is set; when a claim finds
    nothing, waits ``every`` seconds (or, ``once``, returns). After work that failed (``work``
    returned ``False``) it waits before the next claim, 0.1 s doubling with each failure in a
    row up to ``every``: a server that hands out jobs failing at once (139 in 12 s) gets a
    claim every ``every`` seconds, not a loop.

    A server that stops answering (:func:`passing`) is asked again, the wait doubling up to
    :data:`MAX_BACKOFF` (or what it asked for), said once when it goes and once when it is back:
    a team's daemons outlive a restart of the server. ``once``, or another refusal, raises.
    """
    down_since: float | None = None
    wait, failures = every, 0
    while not stopping.is_set():
        try:
            claimed = claim()
        except ServerError as exc:
            if once or not passing(exc):
                raise
            if down_since is None:
                down_since = time.monotonic()
                logger.warning("the server does not answer (%s): asking again, at most every "
                               "%g s", exc, MAX_BACKOFF)  # fmt: skip
            wait = min(MAX_BACKOFF, max(wait * 2, exc.retry_after or 0))
            stopping.wait(wait)
            continue
        if down_since is not None:
            logger.warning("the server answers again (after %.0f s)", time.monotonic() - down_since)
            down_since, wait = None, every
        if claimed is None:
            if once:
                return
            stopping.wait(every)
            continue
        if work(claimed) is False:
            failures += 1
            stopping.wait(min(every, FAILED_WAIT * 2 ** min(failures - 1, 32)))
        else:
            failures = 0


@contextlib.contextmanager
def leased(client: Client, job: JobPublic, worker: str, seconds: float) -> Iterator[None]:
    """Renews ``job``'s lease every third of ``seconds`` while the block runs."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(seconds / 3):
            try:
                client.heartbeat_job(job.id, worker, lease_seconds=seconds)
            except ServerError as exc:
                logger.warning("job %d: lease not renewed: %s", job.id, exc)

    thread = threading.Thread(target=renew, daemon=True, name=f"lease-{job.id}")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
