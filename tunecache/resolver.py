"""The run-time resolver: answers a key from an ordered list of sources, and never raises.

A :class:`Resolver` asks each :class:`Source` in turn — by default the in-process memo, a local
snapshot file, the server — and returns the first answer whose config passes the caller's ``fits``
check (a config the device cannot launch falls through to the next source), else the caller's
default. Sources never raise either: a failure is logged once and is a miss. The typed API client
(:class:`tunecache.client.Client`, which raises) is what
:class:`~tunecache.server_source.ServerSource` talks through.

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
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunecache.canonical import canonical_json
from tunecache.errors import CheckUnavailable, InvalidInput, one_line
from tunecache.key import Key
from tunecache.lookup import LookupResult, SourceName
from tunecache.policies import VersionPolicy
from tunecache.record_index import RecordIndex
from tunecache.schemas import CheckModel, RecordCreate
from tunecache.served import served_problem
from tunecache.strict import printable_text

if TYPE_CHECKING:
    from tunecache.best import BestBackend
    from tunecache.device import Device, DeviceFingerprint

logger = logging.getLogger(__name__)
Fits = Callable[[dict[str, Any]], str | None]  # why a config cannot launch here, or None
# The served config's outputs against the caller's reference, on the same inputs.
Verify = Callable[[dict[str, Any]], CheckModel]
# A check that could not run here (tunecache.CheckUnavailable: memory, say) is tried again after
# this long; until then its answer is passed over, as it was.
UNCHECKED_RETRY_S = 60.0
ASYNC_WORKERS = 8  # threads aresolve's lookups run in (they wait on the server's two slots)


class Source(abc.ABC):
    """Where answers come from. ``get`` never raises: a failure is logged and is ``None``."""

    fills_memo = False  # its answers go into the resolver's memo (the server's do)

    @abc.abstractmethod
    def get(self, key: Key, digest: str) -> LookupResult | None:
        """The answer for ``key`` (``digest`` is ``key.digest()``), or ``None``."""

    def close(self) -> None:  # noqa: B027  # most sources have no background work
        """Finishes background work (the server source's miss reports)."""

    def dispute(self, key: Key, answer: LookupResult, check: CheckModel) -> None:  # noqa: B027
        """Tells where ``answer`` came from that its config failed ``check`` at ``key``'s
        problem (the server marks the record disputed); nothing for a local source."""

    def renew_after_fork(self) -> None:  # noqa: B027  # most sources hold no lock
        """In a forked child, alone: locks of its own (a parent thread may have held one at
        the fork, for good in the child: :mod:`tunecache.forksafe`)."""


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

    The records are indexed once, on first use, by what the rules require equal
    (:class:`~tunecache.record_index.RecordIndex`), so a lookup reads its key's group, not all
    of them; and answers are kept per key.
    """

    name: SourceName = "snapshot"

    def __init__(self, records: Iterable[RecordCreate], policy: VersionPolicy = "strict") -> None:
        self.policy: VersionPolicy = policy
        self._index: RecordIndex[RecordCreate] | None = None
        self._given = records
        self._answers: dict[str, LookupResult | None] = {}
        self._lock = threading.Lock()

    def renew_after_fork(self) -> None:
        self._lock = threading.Lock()  # a parent thread loading the snapshot held it
        if self._index is not None:
            self._index.renew_after_fork()

    def records(self) -> Iterable[RecordCreate]:
        return self._given

    def index(self) -> RecordIndex[RecordCreate]:
        """The records for the lookup rules (built once, on the first lookup)."""
        from tunecache.snapshot_index import key_json

        return RecordIndex((key_json(r), r) for r in self.records() if r.validation.passed)

    def get(self, key: Key, digest: str) -> LookupResult | None:
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = self.index()
        if digest not in self._answers:
            found = self._index.best(key.to_json(), self.policy)
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
    """A snapshot file (:func:`tunecache.snapshot.save_snapshot`), read and checked once, on
    first use, each record validated on the first lookup of its group
    (:func:`tunecache.snapshot_index.load_snapshot_index`); a missing, corrupt or unreadable
    file (a FIFO, a device: refused without waiting) is logged once and answers nothing."""

    def __init__(self, path: Path, policy: VersionPolicy = "strict") -> None:
        super().__init__((), policy)
        self.path = path

    def records(self) -> Iterable[RecordCreate]:
        """Every winner of the file, validated now (lookups use :meth:`index`)."""
        from tunecache.snapshot import index_snapshot, load_snapshot

        try:
            return index_snapshot(load_snapshot(self.path)).values()
        except InvalidInput as exc:
            logger.warning("%s; ignoring the snapshot", exc)
            return []

    def index(self) -> RecordIndex[RecordCreate]:
        from tunecache.snapshot_index import load_snapshot_index

        try:
            return load_snapshot_index(self.path)
        except InvalidInput as exc:
            logger.warning("%s; ignoring the snapshot", exc)
            return RecordIndex()


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
        # (key digest, config) whose check failed here: never used in this process, by any caller
        self._failed: set[tuple[str, str]] = set()
        self._failed_keys: set[str] = set()  # their digests: a memo hit's cheap test
        # One check at a time of each; re-entrant: a check that looks its own key up goes on
        self._gates: dict[tuple[str, str], threading.RLock] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # aresolve's threads, made on first use
        # (key digest, config) whose check could not run here: not tried again until then
        self._unchecked: dict[tuple[str, str], float] = {}

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
        if found is not None and self._failed_here(digest, found):  # memoised meanwhile
            assert self.memo is not None
            self.memo.answers.pop(digest, None)
        elif found is not None and (verify is None or self._memo_verified(key, digest, found,
                                                                          verify)):  # fmt: skip
            return found.own()
        for source in self.sources:
            answer = self._ask(source, key, digest)
            if answer is None or answer.config is None or self._failed_here(digest, answer):
                continue
            if fits is not None and (reason := _misfit(fits, answer.config)) is not None:
                self._warn_once(digest, f"{key.short()}: the {answer.source}'s config does not "
                                        f"fit here ({reason}); trying the next source")  # fmt: skip
                continue
            if verify is not None and not self._verified_here(key, digest, source, answer, verify):
                continue
            if self.memo is not None and source.fills_memo:
                self.memo.put(digest, answer)
            return answer.own()
        return LookupResult(config=default, source="default")

    async def aresolve(self, key: Key, *, default: dict[str, Any] | None = None,
                       fits: Fits | None = None, verify: Verify | None = None,
                       timeout: float | None = None) -> LookupResult:  # fmt: skip
        """:meth:`resolve` for async code: a memo hit answers at once; anything that may wait
        (a snapshot's first read, the server, a verification) runs in one of the resolver's own
        :data:`ASYNC_WORKERS` threads, so the event loop never blocks, nor waits behind its
        default executor's other work (64 tasks took 3.9 s of a 0.5 s timeout there, and what
        else used it waited as long). ``timeout``: the answer is ``default`` after that many
        seconds (a lookup already running goes on, and a later call finds its answer in the
        memo). One path, not two: the sources stay synchronous."""
        digest = key.digest()
        found = None if self.memo is None else self.memo.answers.get(digest)
        if (
            found is not None
            and not self._failed_here(digest, found)
            and (verify is None or self._checked(digest, found))
        ):
            return found.own()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(ASYNC_WORKERS, thread_name_prefix="tunecache")
        try:
            call = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(
                self.resolve, key, default=default, fits=fits, verify=verify))  # fmt: skip
            return await asyncio.wait_for(call, timeout)
        except (TimeoutError, RuntimeError):  # too slow; or closed: no thread takes it now
            return LookupResult(config=default, source="default")

    def inherit_checks(self, parent: Resolver) -> None:
        """Takes ``parent``'s verified and failed configs as this resolver's own (a forked
        child's: :func:`tunecache.forksafe.renewed`)."""
        self._verified |= parent._verified
        self._failed |= parent._failed
        self._failed_keys |= parent._failed_keys

    def _memo_verified(self, key: Key, digest: str, found: LookupResult,
                       verify: Verify) -> bool:  # fmt: skip
        """Whether a memo answer may be used by a caller that verifies: it was verified here
        already, or is now (memoised by a caller that did not verify); else it is forgotten and
        disputed with the server it came from."""
        assert self.memo is not None
        origin = next((s for s in self.sources if s.fills_memo), self.memo)
        if self._verified_here(key, digest, origin, found, verify):
            return True
        self.memo.answers.pop(digest, None)
        return False

    def _failed_here(self, digest: str, answer: LookupResult) -> bool:
        """Whether ``answer``'s config failed a check in this process (whoever checked it)."""
        return digest in self._failed_keys and answer.config is not None and \
            (digest, canonical_json(answer.config)) in self._failed  # fmt: skip

    def _checked(self, digest: str, answer: LookupResult) -> bool:
        """Whether ``answer``'s config passed a check in this process."""
        if answer.config is None:
            return False
        return (digest, canonical_json(answer.config)) in self._verified

    def _verified_here(self, key: Key, digest: str, source: Source, answer: LookupResult,
                       verify: Verify) -> bool:  # fmt: skip
        """Whether ``answer``'s config passed ``verify`` (run now unless it passed or failed
        before: threads asking meanwhile wait for the one check running)."""
        assert answer.config is not None
        seen = (digest, canonical_json(answer.config))
        if seen in self._verified:
            return True
        with self._lock:
            gate = self._gates.setdefault(seen, threading.RLock())
        with gate:
            if seen in self._verified or seen in self._failed:
                return seen in self._verified
            if self._unchecked.get(seen, 0.0) > time.monotonic():
                return False
            return self._check(key, digest, seen, source, answer, verify)

    def _check(self, key: Key, digest: str, seen: tuple[str, str], source: Source,
               answer: LookupResult, verify: Verify) -> bool:  # fmt: skip
        """Runs ``verify`` on ``answer``'s config: passed, remembered; failed, remembered and
        disputed with ``source``; unable to run here, not tried again for a while."""
        assert answer.config is not None
        try:
            check = verify(answer.own().config or {})  # its own copy: it may change it
        except CheckUnavailable as exc:  # not the config's fault: unused, not disputed
            self._unchecked[seen] = time.monotonic() + UNCHECKED_RETRY_S
            self._warn_once(digest, f"{key.short()}: could not check the {answer.source}'s "
                                    f"config here ({one_line(exc)}); not using it, not "
                                    f"disputing it, not checking again for "
                                    f"{UNCHECKED_RETRY_S:g} s")  # fmt: skip
            return False
        except Exception as exc:  # the served config broke the caller's check: it failed
            check = CheckModel.raised(
                key.problem, 0, printable_text(f"the check raised {one_line(exc)}", 512)
            )
        if check.passed:
            self._verified.add(seen)
            return True
        self._failed.add(seen)
        self._failed_keys.add(digest)
        where = f"record #{answer.record.id}" if answer.record is not None else "its record"
        self._warn_once(digest, f"{key.short()}: the {answer.source}'s config {answer.config} "
                                f"failed its check on first use ({check.failure()}); not using it, "
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
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # what is queued still answers, by default at worst

    def _ask(self, source: Source, key: Key, digest: str) -> LookupResult | None:
        """``source``'s answer; ``None``, logged, should it raise after all: a source's bug
        never reaches the caller's launch."""
        try:
            return source.get(key, digest)
        except Exception as exc:
            self._warn_once(digest, f"{key.short()}: the {type(source).__name__} failed "
                                    f"({one_line(exc)}); trying the next "
                                    "source")  # fmt: skip
            return None

    def _warn_once(self, digest: str, message: str) -> None:
        log = logger.debug if digest in self._warned else logger.warning
        self._warned.add(digest)
        log("%s", message)


def _misfit(fits: Fits, config: dict[str, Any]) -> str | None:
    """``fits(config)``; a ``fits`` that raises refuses the config, naming what it raised."""
    try:
        return fits(dict(config))  # its own copy: the answer's stays as served
    except Exception as exc:
        return f"checking it raised {one_line(exc)}"
