"""The server as a source of answers, and the background calls to it.

:class:`ServerSource` asks the cache server (through the API client, bounded by its lookup
timeout) and sends what the caller must never wait for — miss reports, disputes, uploads — from
one background thread. After a failure (unreachable, too slow, a server error, not a tunecache
server) the server is skipped for a while; lookups fall back at once meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from httpx import TransportError

from tunecache.backoff import backoff
from tunecache.errors import ServerError, one_line
from tunecache.key import Key
from tunecache.lookup import LookupResult
from tunecache.resolver import Source
from tunecache.schemas import CheckModel, DeviceModel, LookupResponse
from tunecache.served import served_problem
from tunecache.verification import DisputeCreate, FailedCheck

if TYPE_CHECKING:
    from tunecache.http import Timeout
    from tunecache.jobs import JobEnqueued
    from tunecache.policies import VersionPolicy
    from tunecache.verification import DisputeResult


class ServerApi(Protocol):
    """The calls a :class:`ServerSource` makes (:class:`tunecache.client.Client` has them)."""

    url: str
    timeout: Timeout
    policy: VersionPolicy

    def fetch_answer(self, key: Key, *, timeout: float | None = None) -> LookupResponse | None: ...

    def report_miss(self, key: Key, *, timeout: float | None = None) -> JobEnqueued: ...

    def dispute(
        self, record_id: int, dispute: DisputeCreate, *, timeout: float | None = None
    ) -> DisputeResult: ...


logger = logging.getLogger(__name__)
MAX_PENDING_REPORTS = 256
# Lookups one client has at the server at once (a server's worker takes 2 by default and sheds
# what waits longer than 20 ms: 32 threads' lookups of one key at once were 32 requests, 25 of
# them shed, each caller given the default config). More wait for a slot within their timeout.
MAX_LOOKUPS_IN_FLIGHT = 2


@dataclass
class _Flight:
    """One key's lookup in progress: the threads asking for it meanwhile wait for its answer."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    answer: LookupResult | None = None
    unanswered: bool = True  # the server gave no answer (see ``ServerSource.unanswered``)


SEND_ATTEMPTS = 3  # times an upload is sent to a server that could not be reached


@dataclass(frozen=True)
class _Report:
    """One call the server source sends in the background: a miss report, a dispute, an upload.
    ``loud``: a refusal is a warning (an upload lost), not a debug line (a report dropped)."""

    what: str
    send: Callable[[], object]
    loud: bool = False
    marker: bool = False  # not a call: run even while the server is down (see ``drain``)
    attempts: int = 0
    lost: Callable[[], object] | None = None  # called once it is given up unsent


def unreachable(exc: ServerError) -> bool:
    """Whether a failed call says the server cannot answer now (no connection, too slow, a
    server error), as opposed to one refused or malformed answer."""
    code = exc.status_code
    return isinstance(exc.__cause__, TransportError) or (code is not None and code >= 500)


class ServerSource(Source):
    """The cache server, through the API client, bounded by its lookup timeout.

    After a failure (unreachable, too slow, a server error, not a tunecache server) the server is
    skipped for ``retry_after`` seconds (one warning, then debug), a miss is remembered for
    ``miss_ttl`` seconds, and with ``report_misses`` the server is asked to tune what it missed
    (once per key per ``miss_ttl``). Reports, disputes and uploads (:meth:`send_later`) go in the
    background: they wait in a bounded queue (a full queue drops them) that one thread sends, and
    are skipped while the server is down; the caller never waits.
    """

    fills_memo = True

    def __init__(self, client: ServerApi, *, retry_after: float = 30.0, miss_ttl: float = 60.0,
                 report_misses: bool = False) -> None:  # fmt: skip
        self.client = client
        self.retry_after, self.miss_ttl, self.report_misses = retry_after, miss_ttl, report_misses
        self._lock = threading.Lock()
        self._misses: dict[str, float] = {}
        self._down_until = 0.0
        self._warned = False
        self._reports: queue.Queue[_Report | None] = queue.Queue(maxsize=MAX_PENDING_REPORTS)
        self._reporter: threading.Thread | None = None
        self._refused = False
        self._unsent = 0  # uploads queued and not yet sent (or given up on)
        self._closing = threading.Event()
        self._flights: dict[str, _Flight] = {}
        self._slots = threading.BoundedSemaphore(MAX_LOOKUPS_IN_FLIGHT)
        self._shut = threading.Event()  # closed: no lookup goes to the server any more
        self._outcome = threading.local()  # what this thread's last ``get`` met (``unanswered``)
        self._down_unanswered = False  # the failure that made it down: no answer (not a refusal)
        self._failures = 0  # failures since the server last answered a lookup or a send

    @property
    def down(self) -> bool:
        """Whether the server is skipped now, after a failure less than ``retry_after`` ago."""
        return self._down_until > time.monotonic()

    def inherit(self, parent: ServerSource) -> None:
        """Takes what ``parent`` knows of the server, as a forked child's source: until when it
        is skipped and why, whether that failure was warned of, the misses it remembers (each
        of a parent's forked workers waited a lookup timeout for a server the parent knew down,
        and warned again). Run in the child alone: no lock taken."""
        now = time.monotonic()
        self._misses = {digest: until for digest, until in parent._misses.items() if until > now}
        if parent._down_until > now:
            self._down_until, self._down_unanswered = parent._down_until, parent._down_unanswered
            self._warned, self._failures = parent._warned, parent._failures

    def unanswered(self) -> bool:
        """Whether the calling thread's last :meth:`get` had no answer from the server (it is
        down or skipped after a failure, failed, or did not answer within the timeout), as
        opposed to a miss the server answered: a caller may then launch its default rather than
        do the work a miss asks for (the Triton drop-in does not tune while the server is down)."""
        return bool(getattr(self._outcome, "unanswered", False))

    def forget_outcome(self) -> None:
        """Clears :meth:`unanswered` for the calling thread, before a lookup that may not ask."""
        self._outcome.unanswered = False

    def get(self, key: Key, digest: str) -> LookupResult | None:
        """The server's answer: one request per key at a time (the threads asking for a key
        meanwhile wait for that one's answer), at most :data:`MAX_LOOKUPS_IN_FLIGHT` keys at
        once (the others wait for a slot), all within the lookup timeout."""
        now = time.monotonic()
        timeout = self.client.timeout.lookup
        mine = _Flight()
        self._outcome.unanswered = True  # until the server answers (a miss is an answer)
        try:
            with self._lock:
                # A miss remembered is an answer, and so is a refusal the server is skipped for;
                # otherwise none until ``_fetch`` has one.
                refused = self._down_until > now and not self._down_unanswered
                self._outcome.unanswered = not (self._misses.get(digest, -1.0) > now or refused)
                if self._skipped(digest, now) or self._shut.is_set():
                    return None
                flight = self._flights.setdefault(digest, mine)
            if flight is not mine:  # another thread asks for this key: its answer is ours
                if not flight.done.wait(timeout):
                    return None
                self._outcome.unanswered = flight.unanswered
                return flight.answer
            if self._slots.acquire(timeout=timeout):  # else the default, the server not blamed
                try:
                    with self._lock:  # the server may have failed another lookup meanwhile
                        skipped = self._skipped(digest, time.monotonic()) or self._shut.is_set()
                    if not skipped:
                        left = now + timeout - time.monotonic()
                        mine.answer = self._fetch(key, digest, now, left)
                        mine.unanswered = self._outcome.unanswered
                finally:
                    self._slots.release()
            return mine.answer
        finally:
            with self._lock:
                if self._flights.get(digest) is mine:
                    del self._flights[digest]
            mine.done.set()

    def _skipped(self, digest: str, now: float) -> bool:
        """Whether the key missed lately, or the server is skipped (under ``_lock``)."""
        return self._misses.get(digest, -1.0) > now or self._down_until > now

    def _fetch(self, key: Key, digest: str, now: float, timeout: float) -> LookupResult | None:
        """Asks the server for ``key`` within ``timeout`` seconds: a checked answer, or ``None``
        (a miss remembered, and reported when asked to; a failure, the server then skipped)."""
        if timeout <= 0:
            return None
        try:
            answer = self.client.fetch_answer(key, timeout=timeout)
        except ServerError as exc:
            self._failed(exc)
            self._outcome.unanswered = unreachable(exc)  # a refusal (401, not tunecache) answers
            return None
        self._outcome.unanswered = False  # a record, or a miss: the server answered
        self._failures = 0
        if answer is not None:
            why = served_problem(key, answer.record, answer.match, self.client.policy)
            if why is None:
                return LookupResult.served(answer.record, "server", answer.match, answer.policy)
            log = logger.debug if self._refused else logger.warning
            self._refused = True
            log("%s: ignoring record #%d from %s: %s", key.short(), answer.record.id,
                self.client.url, why)  # fmt: skip
        with self._lock:
            self._misses[digest] = now + self.miss_ttl
        if self.report_misses:
            self.send_later(f"miss of {key.short()}", lambda: self.client.report_miss(
                key, timeout=self.client.timeout.lookup))  # fmt: skip
        return None

    def dispute(self, key: Key, answer: LookupResult, check: CheckModel) -> None:
        """Reports that the server's record failed ``check`` at ``key``'s problem, in the
        background; the record is forgotten here (the next lookup asks again)."""
        record = answer.record
        if record is None:
            return
        with self._lock:
            self._misses[key.digest()] = time.monotonic() + self.miss_ttl
        report = DisputeCreate(problem=dict(key.problem),
                               check=FailedCheck.model_validate(check.model_dump()),
                               device=DeviceModel.model_validate(key.device.to_json()))  # fmt: skip
        self.send_later(f"dispute of record #{record.id}", lambda: self.client.dispute(
            record.id, report, timeout=self.client.timeout.lookup))  # fmt: skip

    def send_later(self, what: str, send: Callable[[], object], *, loud: bool = False,
                   lost: Callable[[], object] | None = None) -> bool:  # fmt: skip
        """Queues ``send()`` for the background thread; ``False`` (and a log line) when it is
        not queued: the queue is full, or (a report, not ``loud``) the server is down.

        ``loud`` calls (uploads) are never skipped for the down state: they wait in the
        background until the server may be asked again, and are sent again (up to
        :data:`SEND_ATTEMPTS` times) when it could not be reached; a failure is a warning, and
        :meth:`close` says how many were never sent. ``lost()`` is called for a call given up
        unsent (failed for good, or still queued at :meth:`close`), not when the queue is full.
        """
        log = logger.warning if loud else logger.debug
        if self.down and not loud:
            log("%s skipped: %s was unreachable less than %.0f s ago", what, self.client.url,
                self.retry_after)  # fmt: skip
            return False
        return self._enqueue(_Report(what, send, loud, lost=lost))

    def _enqueue(self, report: _Report) -> bool:
        try:
            self._reports.put_nowait(report)
        except queue.Full:
            log = logger.warning if report.loud else logger.debug
            log("%s dropped: %d calls are waiting to be sent", report.what, MAX_PENDING_REPORTS)
            return False
        with self._lock:
            self._unsent += report.loud
            if self._reporter is None:
                self._reporter = threading.Thread(target=self._send_reports, daemon=True,
                                                  name="tunecache-background")  # fmt: skip
                self._reporter.start()
        return True

    def _send_reports(self) -> None:
        while (report := self._reports.get()) is not None:
            if self._closing.is_set():
                _give_up(report)
                break
            if report.marker:
                report.send()
                continue
            if self.down and not report.loud:
                logger.debug("%s skipped: %s is down", report.what, self.client.url)
                continue
            while report.loud and self.down and not self._closing.is_set():
                self._closing.wait(min(1.0, max(0.0, self._down_until - time.monotonic())))
            if self._closing.is_set():
                _give_up(report)
                break
            self._send(report)

    def _send(self, report: _Report) -> None:
        """Sends one call; an upload the server could not take now goes back in the queue."""
        log = logger.debug if not report.loud or self._closing.is_set() else logger.warning
        try:
            report.send()
            self._failures = 0  # it answered: a failure's pause starts again from the least
        except ServerError as exc:
            if unreachable(exc):
                self._failed(exc)  # not asked for a while: lookups fall back at once
                if report.loud and report.attempts + 1 < SEND_ATTEMPTS:
                    with self._lock:
                        self._unsent -= 1
                    self._enqueue(dataclasses.replace(report, attempts=report.attempts + 1))
                    return
            log("%s failed: %s", report.what, exc)
            _give_up(report)
        except Exception as exc:  # a bad answer too: the background thread must not die
            log("%s failed: %s", report.what, one_line(exc))
            _give_up(report)
        with self._lock:
            self._unsent -= report.loud

    def drain(self, timeout: float = 5.0) -> bool:
        """Waits until the calls queued so far are sent (or skipped); whether they were within
        ``timeout`` seconds."""
        if self._reporter is None:
            return True
        done = threading.Event()
        try:
            self._reports.put(_Report("drain", done.set, marker=True), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Sends the calls still queued (within ``timeout`` seconds), then stops the thread; a
        warning says how many uploads were not sent by then. A server that will not be asked
        again within ``timeout`` (unreachable, or it refused a call) is not waited for.

        Lookups asked from now on answer without the server; those at the server are waited for
        (each within its lookup timeout): closing the connections under them failed them, and
        blamed the server."""
        self._shut.set()
        self._wait_for_lookups(self.client.timeout.lookup)
        if self._reporter is None:
            return
        skipped = self._down_until - time.monotonic() > timeout
        if skipped:  # nothing would be sent before the wait ended: the process exits now
            self._closing.set()
        with contextlib.suppress(queue.Full):
            self._reports.put(None, timeout=timeout)
        self._reporter.join(timeout)
        self._closing.set()
        with contextlib.suppress(queue.Empty):
            while True:  # what the thread will not send now: given up
                if (report := self._reports.get_nowait()) is not None:
                    _give_up(report)
        with contextlib.suppress(queue.Full):  # taken above: a thread still sending stops after
            self._reports.put_nowait(None)  # it, rather than wait for the queue for good
        if self._unsent:
            why = (f"it failed less than {self.retry_after:.0f} s ago" if skipped else
                   f"it did not take them within {timeout:.0f} s of closing")  # fmt: skip
            logger.warning("%d upload(s) to %s not sent: %s", self._unsent, self.client.url,
                           why)  # fmt: skip

    def _wait_for_lookups(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds until no lookup holds a slot at the server."""
        deadline = time.monotonic() + timeout
        taken = 0
        while taken < MAX_LOOKUPS_IN_FLIGHT and self._slots.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            taken += 1
        for _ in range(taken):
            self._slots.release()

    def _failed(self, exc: Exception) -> None:
        """Skips the server for ``retry_after`` seconds, or as long as a busy server asked if
        shorter, but at least 0.1 s doubled for each failure since it last answered: a server
        answering each lookup near its timeout with a 503 and ``Retry-After: 0`` had each call
        wait that long, never skipped."""
        asked = getattr(exc, "retry_after", None)
        unanswered = isinstance(exc, ServerError) and unreachable(exc)
        with self._lock:
            self._failures += 1
            floor = backoff(self._failures)
            pause = self.retry_after if asked is None else min(max(asked, floor), self.retry_after)
            self._down_until = time.monotonic() + pause
            self._down_unanswered = unanswered
            first, self._warned = not self._warned, True
        log = logger.warning if first else logger.debug
        # A refusal (a token it does not take, not a tunecache server) is an answer: a miss,
        # which the Triton drop-in tunes; "using default configs" said otherwise before it did.
        then = (
            "using default configs, retrying in"
            if unanswered
            else "each lookup a miss, asking again in"
        )
        log("%s; %s %.3g s", exc, then, pause)


def _give_up(report: _Report) -> None:
    """``report`` will not be sent by this process: its ``lost`` hook runs (never raising)."""
    if report.lost is not None:
        try:
            report.lost()
        except Exception as exc:
            logger.warning("%s: %s", report.what, one_line(exc))
