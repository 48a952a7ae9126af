"""The run-time resolver: answers a key from an ordered list of sources, and never raises.

A :class:`Resolver` asks each :class:`Source` in turn — by default the in-process memo, a local
snapshot file, the server — and returns the first answer whose config passes the caller's ``fits``
check (a config the device cannot launch falls through to the next source), else the caller's
default. Sources never raise either: a failure is logged once and is a miss. The typed API client
(:class:`tunecache.client.Client`, which raises) is what :class:`ServerSource` talks through.

No source is trusted: every record a source would answer with is checked first
(:func:`tunecache.served.served_problem`: validated, not disputed, a key the lookup rules allow,
a config inside its backend's closed schema). With ``verify`` (``verify="first"`` in the
integrations), the first use of an answer in this process is also checked against the caller's
reference: an answer that fails is not used, and the server is told (a dispute of the record,
sent in the background), so it stops serving it until a verifier has looked again.

Example:
    >>> resolver = Resolver([MemoSource(), RecordsSource([])])
    >>> key = tunecache.key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32")
    >>> resolver.resolve(key, default={"schedule": "default"}).source  # doctest: +SKIP
    'default'
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from httpx import TransportError

from tunecache.canonical import canonical_json
from tunecache.errors import InvalidInput, ServerError, one_line
from tunecache.key import Key
from tunecache.policies import VersionPolicy
from tunecache.rules import Rule, best
from tunecache.schemas import CheckModel, DeviceModel, RecordCreate, RecordPublic
from tunecache.served import served_problem
from tunecache.verification import DisputeCreate, FailedCheck

if TYPE_CHECKING:
    from tunecache.best import BestBackend
    from tunecache.client import Client
    from tunecache.device import Device, DeviceFingerprint

logger = logging.getLogger(__name__)
SourceName = Literal["memo", "snapshot", "server", "default"]
Fits = Callable[[dict[str, Any]], str | None]  # why a config cannot launch here, or None
# The served config's outputs against the caller's reference, on the same inputs.
Verify = Callable[[dict[str, Any]], CheckModel]
MAX_PENDING_REPORTS = 256


@dataclass(frozen=True)
class LookupResult:
    """What a lookup found: the config to launch, where it came from, and the record on a hit.

    ``record`` is the server's record on a memo or server hit; a snapshot hit has none (a snapshot
    holds the winners' data without server ids), but is still a :attr:`hit`. ``rule`` says which
    lookup rule matched (:mod:`tunecache.rules`: ``exact``, ``same_arch``, ``bucket``) and
    ``policy`` under which version policy; both are ``None`` for the default. ``time_ms``,
    ``device`` (``arch name``) and ``problem`` say what the served record was timed at, where
    (``time_ms``: the verifier's time once a verifier re-timed it, else the uploader's claim).
    """

    config: dict[str, Any] | None
    source: SourceName
    record: RecordPublic | None = None
    rule: Rule | None = None
    policy: VersionPolicy | None = None
    time_ms: float | None = None
    device: str | None = None
    problem: dict[str, Any] | None = None

    @classmethod
    def served(cls, record: RecordCreate, source: SourceName, rule: Rule | None,
               policy: VersionPolicy | None) -> LookupResult:  # fmt: skip
        """The answer that serves ``record`` (a server's :class:`RecordPublic` is kept)."""
        device = record.key.device
        public = record if isinstance(record, RecordPublic) else None
        timing = record.timing if public is None else public.believed_timing
        return cls(
            record.config, source, public, rule, policy, timing.median_ms,
            f"{device.arch} {device.name}", dict(record.key.problem),
        )  # fmt: skip

    @property
    def hit(self) -> bool:
        return self.source != "default"


class Source(abc.ABC):
    """Where answers come from. ``get`` never raises: a failure is logged and is ``None``."""

    @abc.abstractmethod
    def get(self, key: Key, digest: str) -> LookupResult | None:
        """The answer for ``key`` (``digest`` is ``key.digest()``), or ``None``."""

    def close(self) -> None:  # noqa: B027  # most sources have no background work
        """Finishes background work (the server source's miss reports)."""

    def dispute(self, key: Key, answer: LookupResult, check: CheckModel) -> None:  # noqa: B027
        """Tells where ``answer`` came from that its config failed ``check`` at ``key``'s
        problem (the server marks the record disputed); nothing for a local source."""


class MemoSource(Source):
    """This process's earlier answers, by key digest (the resolver fills it)."""

    def __init__(self) -> None:
        self.answers: dict[str, LookupResult] = {}

    def get(self, key: Key, digest: str) -> LookupResult | None:
        return self.answers.get(digest)

    def put(self, digest: str, answer: LookupResult) -> None:
        self.answers[digest] = dataclasses.replace(answer, source="memo")


class RecordsSource(Source):
    """Validated records held here (a snapshot's, or a test's), answered by the lookup rules.

    Answers are kept per key: the rules scan the records once per key, not once per lookup.
    """

    name: SourceName = "snapshot"

    def __init__(self, records: Iterable[RecordCreate], policy: VersionPolicy = "strict") -> None:
        self.policy: VersionPolicy = policy
        self._records: list[tuple[dict[str, Any], RecordCreate]] | None = None
        self._given = records
        self._answers: dict[str, LookupResult | None] = {}
        self._lock = threading.Lock()

    def records(self) -> Iterable[RecordCreate]:
        return self._given

    def get(self, key: Key, digest: str) -> LookupResult | None:
        if self._records is None:
            with self._lock:
                if self._records is None:
                    held = [r for r in self.records() if r.validation.passed]
                    self._records = [(r.key.model_dump(mode="json", by_alias=True), r)
                                     for r in held]  # fmt: skip
        if not self._records:
            return None
        if digest not in self._answers:
            found = best(key.to_json(), self._records, self.policy)
            answer = None
            if found is not None:
                record, rule = found
                if (why := served_problem(key, record, rule, self.policy)) is not None:
                    logger.warning("%s: ignoring the %s's record: %s", key.short(), self.name, why)
                else:
                    answer = LookupResult.served(record, self.name, rule, self.policy)
            self._answers[digest] = answer
        return self._answers[digest]


class SnapshotSource(RecordsSource):
    """A snapshot file (:func:`tunecache.snapshot.save_snapshot`), read once, on first use; a
    missing or corrupt file is logged once and answers nothing."""

    def __init__(self, path: Path, policy: VersionPolicy = "strict") -> None:
        super().__init__((), policy)
        self.path = path

    def records(self) -> Iterable[RecordCreate]:
        from tunecache.snapshot import index_snapshot, load_snapshot

        try:
            index = index_snapshot(load_snapshot(self.path))
        except InvalidInput as exc:
            logger.warning("%s; ignoring the snapshot", exc)
            return []
        logger.debug("snapshot %s: %d winners", self.path, len(index))
        return index.values()


@dataclass(frozen=True)
class _Report:
    """One call the server source sends in the background: a miss report, a dispute, an upload.
    ``loud``: a refusal is a warning (an upload lost), not a debug line (a report dropped)."""

    what: str
    send: Callable[[], object]
    loud: bool = False
    marker: bool = False  # not a call: run even while the server is down (see ``drain``)


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

    def __init__(self, client: Client, *, retry_after: float = 30.0, miss_ttl: float = 60.0,
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

    @property
    def down(self) -> bool:
        """Whether the server is skipped now, after a failure less than ``retry_after`` ago."""
        return self._down_until > time.monotonic()

    def get(self, key: Key, digest: str) -> LookupResult | None:
        now = time.monotonic()
        with self._lock:
            if self._misses.get(digest, -1.0) > now or self._down_until > now:
                return None
        timeout = self.client.timeout.lookup
        try:
            answer = self.client.fetch_answer(key, timeout=timeout)
        except ServerError as exc:
            self._failed(exc)
            return None
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

    def send_later(self, what: str, send: Callable[[], object], *, loud: bool = False) -> bool:
        """Queues ``send()`` for the background thread; ``False`` (and a log line) when it is
        not queued: the server is down, or the queue is full. ``loud``: a failure or a skip is
        a warning (an upload lost), else a debug line (a report dropped)."""
        log = logger.warning if loud else logger.debug
        if self.down:
            log("%s skipped: %s was unreachable less than %.0f s ago", what, self.client.url,
                self.retry_after)  # fmt: skip
            return False
        try:
            self._reports.put_nowait(_Report(what, send, loud))
        except queue.Full:
            log("%s dropped: %d calls are waiting to be sent", what, MAX_PENDING_REPORTS)
            return False
        with self._lock:
            if self._reporter is None:
                self._reporter = threading.Thread(target=self._send_reports, daemon=True,
                                                  name="tunecache-background")  # fmt: skip
                self._reporter.start()
        return True

    def _send_reports(self) -> None:
        while (report := self._reports.get()) is not None:
            if report.marker:
                report.send()
                continue
            if self.down:
                (logger.warning if report.loud else logger.debug)(
                    "%s skipped: %s is down", report.what, self.client.url)  # fmt: skip
                continue
            try:
                report.send()
            except ServerError as exc:
                if unreachable(exc):
                    self._failed(exc)  # not asked for a while: lookups fall back at once
                (logger.warning if report.loud else logger.debug)(
                    "%s failed: %s", report.what, exc)  # fmt: skip
            except Exception as exc:  # a bad answer too: the background thread must not die
                (logger.warning if report.loud else logger.debug)(
                    "%s failed: %s", report.what, one_line(exc))  # fmt: skip

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
        """Sends the calls still queued (within ``timeout`` seconds), then stops the thread."""
        if self._reporter is None:
            return
        try:
            self._reports.put(None, timeout=timeout)
        except queue.Full:
            return
        self._reporter.join(timeout)

    def _failed(self, exc: Exception) -> None:
        """Skips the server for ``retry_after`` seconds (or as long as a busy server asked)."""
        asked = getattr(exc, "retry_after", None)
        pause = self.retry_after if asked is None else min(asked, self.retry_after)
        with self._lock:
            self._down_until = time.monotonic() + pause
            first, self._warned = not self._warned, True
        log = logger.warning if first else logger.debug
        log("%s; using default configs, retrying in %.0f s", exc, pause)


class Resolver:
    """Answers keys from ``sources`` in order, remembering hits; never raises.

    Args:
        sources: asked in order after the memo.
        memo: keep answers in this process (a memo hit is a dict lookup).
    """

    def __init__(self, sources: Sequence[Source], *, memo: bool = True) -> None:
        self.memo = MemoSource() if memo else None
        self.sources = list(sources)
        self._warned: set[str] = set()
        self._verified: set[tuple[str, str]] = set()  # (key digest, config) checked here

    def resolve(self, key: Key, *, default: dict[str, Any] | None = None, fits: Fits | None = None,
                verify: Verify | None = None) -> LookupResult:  # fmt: skip
        """The first fitting answer for ``key``, else ``default`` (source ``"default"``).

        Args:
            fits: why a config cannot launch here (``None``: it can); such an answer is passed
                over.
            verify: checks a config against the caller's reference on the same inputs; given,
                an answer is used only once its check passed (once per process: a memo hit is
                never checked again). A failed check passes the answer over and disputes it
                with its source.
        """
        digest = key.digest()
        found = None if self.memo is None else self.memo.answers.get(digest)
        if found is not None and (verify is None or self._memo_verified(key, digest, found,
                                                                        verify)):  # fmt: skip
            return found
        for source in self.sources:
            answer = source.get(key, digest)
            if answer is None or answer.config is None:
                continue
            if fits is not None and (reason := fits(answer.config)) is not None:
                self._warn_once(digest, f"{key.short()}: the {answer.source}'s config does not "
                                        f"fit here ({reason}); trying the next source")  # fmt: skip
                continue
            if verify is not None and not self._verified_here(key, digest, source, answer, verify):
                continue
            if self.memo is not None and answer.source == "server":
                self.memo.put(digest, answer)
            return answer
        return LookupResult(config=default, source="default")

    async def aresolve(self, key: Key, *, default: dict[str, Any] | None = None,
                       fits: Fits | None = None,
                       verify: Verify | None = None) -> LookupResult:  # fmt: skip
        """:meth:`resolve` for async code: a memo hit answers at once; anything that may wait
        (a snapshot's first read, the server, a verification) runs in a worker thread, so the
        event loop never blocks. One path, not two: the sources stay synchronous."""
        if self.memo is not None and (found := self.memo.answers.get(key.digest())) is not None:
            return found
        return await asyncio.to_thread(self.resolve, key, default=default, fits=fits,
                                       verify=verify)  # fmt: skip

    def _memo_verified(self, key: Key, digest: str, found: LookupResult,
                       verify: Verify) -> bool:  # fmt: skip
        """Whether a memo answer may be used by a caller that verifies: it was verified here
        already, or is now (memoised by a caller that did not verify); else it is forgotten and
        disputed with the server it came from."""
        assert self.memo is not None
        origin = next((s for s in self.sources if isinstance(s, ServerSource)), self.memo)
        if self._verified_here(key, digest, origin, found, verify):
            return True
        self.memo.answers.pop(digest, None)
        return False

    def _verified_here(self, key: Key, digest: str, source: Source, answer: LookupResult,
                       verify: Verify) -> bool:  # fmt: skip
        """Whether ``answer``'s config passed ``verify`` (run now unless it passed before)."""
        assert answer.config is not None
        seen = (digest, canonical_json(answer.config))
        if seen in self._verified:
            return True
        try:
            check = verify(answer.config)
        except Exception as exc:  # the served config broke the caller's check: it failed
            check = CheckModel(problem=dict(key.problem), seed=0, rel_error=None,
                               max_abs_error=None, tolerance=1.0, passed=False,
                               note=f"the check raised {one_line(exc)}"[:512])  # fmt: skip
        if check.passed:
            self._verified.add(seen)
            return True
        where = f"record #{answer.record.id}" if answer.record is not None else "its record"
        why = check.note or "failed"
        if not check.note and check.rel_error is not None:
            why = f"relative error {check.rel_error:.3g} > tolerance {check.tolerance:g}"
        self._warn_once(digest, f"{key.short()}: the {answer.source}'s config {answer.config} "
                                f"failed its check on first use ({why}); not using it, "
                                f"disputing {where}")  # fmt: skip
        source.dispute(key, answer, check)
        return False

    def best(
        self,
        kernel: Any,
        problem: Mapping[str, Any],
        dtype: str,
        device: Device | DeviceFingerprint | str | None = None,
        *,
        backends: Sequence[str] | None = None,
    ) -> BestBackend:
        """The fastest validated backend for ``kernel`` at ``problem`` in ``dtype``, with the
        others' times and whether they compare (:func:`tunecache.best.best_backend`).

        Raises:
            InvalidInput: an unknown kernel or backend, a malformed problem, an unsupported dtype.
        """
        from tunecache.best import best_backend

        return best_backend(self, kernel, problem, dtype, device, backends=backends)

    def close(self) -> None:
        """Finishes every source's background work."""
        for source in self.sources:
            source.close()

    def _warn_once(self, digest: str, message: str) -> None:
        log = logger.debug if digest in self._warned else logger.warning
        self._warned.add(digest)
        log("%s", message)
