"""Asking a server for work: claims with back-off while it is away or while work fails
(:func:`poll`), and a claimed job's lease renewed while it runs (:func:`leased`). The tuning
daemon and the verifier share them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tunecache.client import Client
from tunecache.errors import ServerError, TuningError
from tunecache.jobs import JobPublic, cancelled
from tunecache.server_source import unreachable
from tunecache.strict import shown
from tunecache.verification import VerifyTask

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
         stopping: threading.Event, once: bool, every: float,
         give_back: Callable[[T], object] | None = None) -> None:  # fmt: skip
    """Claims and works on what it claimed until ``stopping`` is set; when a claim finds
    nothing, waits ``every`` seconds (or, ``once``, returns). After work that failed (``work``
    returned ``False``) it waits before the next claim, 0.1 s doubling with each failure in a
    row up to ``every``: a server that hands out jobs failing at once (139 in 12 s) gets a
    claim every ``every`` seconds, not a loop.

    A server that stops answering (:func:`passing`) is asked again, the wait doubling up to
    :data:`MAX_BACKOFF` (or what it asked for), said once when it goes and once when it is back:
    a team's daemons outlive a restart of the server. ``once``, or another refusal, raises.

    Stopped while it works (Ctrl-C, an exit: no failure of the work's), it hands what it claimed
    to ``give_back``, then raises.
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
        try:
            worked = work(claimed)
        except BaseException as exc:
            if give_back is not None and not isinstance(exc, Exception):
                give_back(claimed)
            raise
        if worked is False:
            failures += 1
            stopping.wait(min(every, FAILED_WAIT * 2 ** min(failures - 1, 32)))
        else:
            failures = 0


class Ended(TuningError):
    """The job ended on the server while it ran here (cancelled, or answered by another): its
    tune stopped at its next step, as nothing it found was wanted."""


@dataclass
class Lease:
    """A lease :func:`leased` renews: ``ended`` says why the job ended on the server while it
    ran here (``None``: it has not)."""

    ended: str | None = None

    def check(self, _progress: object = None) -> None:
        """Raises :class:`Ended` once the job has ended on the server (a tune's progress
        callback: the tune stops at its next step).

        Raises:
            Ended: the job was cancelled, or answered by another, while it ran here.
        """
        if self.ended is not None:
            raise Ended(self.ended)


@contextlib.contextmanager
def leased(client: Client, held: JobPublic | VerifyTask, worker: str,
           seconds: float) -> Iterator[Lease]:  # fmt: skip
    """Renews the lease of ``held`` (a job, a record to verify) every third of ``seconds``
    while the block runs: while the server does not answer (:func:`passing`), asked again
    each time; refused (the lease lost, the token refused, a server with no such route), said
    once and not asked again (a lost lease was warned of every third of the lease). A job
    refused as no longer running because it ended on the server (cancelled: ``pretune
    --cancel``; answered by another) sets the :class:`Lease`'s ``ended``: before, its worker
    tuned it to the end, and every daemon's time went on a cancelled manifest's running jobs."""
    done = threading.Event()
    what, number = _named(held)
    lease = Lease()

    def renewing() -> None:
        while not done.wait(seconds / 3):
            try:
                if isinstance(held, JobPublic):
                    client.heartbeat_job(number, worker, lease_seconds=seconds)
                else:
                    client.heartbeat_verification(number, worker, lease_seconds=seconds)
            except ServerError as exc:
                if done.is_set():  # the block ended meanwhile (its job completed: a 409)
                    return
                logger.warning("%s: lease not renewed: %s", what, exc)
                if exc.status_code == 409 and isinstance(held, JobPublic):
                    lease.ended = ended(client, number)
                if not passing(exc):
                    return

    thread = threading.Thread(target=renewing, daemon=True, name=f"lease-{what}")
    thread.start()
    try:
        yield lease
    finally:
        done.set()
        thread.join(timeout=5)


def ended(client: Client, job_id: int) -> str | None:
    """Why job ``job_id`` ended on the server so that nothing this worker finds is wanted
    (cancelled; done: answered by another's upload), or ``None``: it runs on (under another's
    lease), failed otherwise (its last attempt's lease lapsed while this worker was cut off:
    its record is still worth storing, served for the key), or the server does not say."""
    try:
        job = client.get_job(job_id)
    except ServerError:
        return None
    if job.state != "done" and not cancelled(job):
        return None
    why = shown(job.error.splitlines()[0][:200]) if job.error.strip() else "no error given"
    return f"it ended on the server while it ran here ({job.state}: {why})"


def _named(held: JobPublic | VerifyTask) -> tuple[str, int]:
    """How the log names ``held``, and its id."""
    if isinstance(held, JobPublic):
        return f"job {held.id}", held.id
    return f"record #{held.record.id}", held.record.id


RELEASE_SECONDS = 5.0  # a stopping worker's wait to give its job back


def release(client: Client, held: JobPublic | VerifyTask, worker: str) -> None:
    """Gives back ``held`` (a job, a record to verify), its attempt unfinished (the worker
    stopped: Ctrl-C, an exit): claimable again at once, the attempt refunded. Left leased, a
    stopped worker's job waited out its lease, and on its last attempt failed, blamed on the
    worker; a record three stops met was never verified. Never raises on the server's refusal:
    one no longer held (completed, decided) is left as it is; else said (the lease then
    lapses)."""
    what, number = _named(held)
    call = client.release_job if isinstance(held, JobPublic) else client.release_verification
    try:
        call(number, worker, timeout=RELEASE_SECONDS)
    except ServerError as exc:
        if exc.status_code != 409:  # 409: not held any more, ended as it was
            older = " (a server older than this client)" if exc.status_code in (404, 405) else ""
            logger.warning("%s: stopped, not given back%s: %s; it is claimable again once its "
                           "lease lapses", what, older, exc)  # fmt: skip
        return
    logger.warning("%s: stopped mid-way: given back, claimable again", what)
