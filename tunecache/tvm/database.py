"""A MetaSchedule database backed by the tunecache server, shared by a whole team.

``tune_tir(..., database=db)`` uploads every measured record as MetaSchedule commits it;
``compile_tir(db, mod, target)`` in any other process, on any other host with the same target and
TVM version, then schedules ``mod`` with the team's best record (see :mod:`tunecache.tvm.wire`
for the layout). Records are read once per workload and kept in this object (the in-process
memo); each is checked (:mod:`tunecache.tvm.check`) before MetaSchedule sees it. In a
``torch.distributed`` job one rank reads a workload's records for all of them
(:func:`tunecache.ranks.shared_artifacts`), so every rank schedules from the same records; each
rank still checks every record itself.

The database never raises into MetaSchedule: with the server down, slow, refusing the token or
answering nonsense it logs one warning and answers from what this process committed, so
``compile_tir`` returns ``None`` (TVM's default schedule) instead of failing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

from tunecache.artifacts import ArtifactIn, ArtifactPublic, ArtifactPutResult
from tunecache.configcheck.tvm import target_device
from tunecache.errors import InvalidInput
from tunecache.http import BAD_ANSWER_CHARS
from tunecache.ranks import shared_artifacts
from tunecache.settings import MAX_LOOKUP_TIMEOUT, Settings
from tunecache.tvm.check import args_info_json, check_record
from tunecache.tvm.remote import Remote
from tunecache.tvm.wire import (
    RECORD,
    mean_seconds,
    partition_for,
    record_artifact,
    record_item,
    target_json,
    workload_artifact,
    workload_key,
)

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.target import Target

logger = logging.getLogger(__name__)
T = TypeVar("T")

KEY_LIMIT = 256  # records read per workload, best score first
# Seconds of checking (TVM's replays) one workload's served records may take in all: past them the
# rest are not used. A record that passes every check can still replay slowly, and 256 of them
# made one compile_tir check for minutes.
CHECK_SECONDS = 10.0


@dataclass
class _Entry:
    """What this database knows of one workload (one ``workload_key``)."""

    workload: Workload
    args: list[Any]  # its argument info as JSON: a record must carry exactly this
    committed: bool = False
    uploaded: bool = False  # its tvm.workload artifact is on the server
    local: dict[str, TuningRecord] = field(default_factory=dict)  # committed here, by item
    # The server's items, best first; None: not answered yet (unasked, or the call failed).
    fetched: list[ArtifactPublic] | None = None
    cursor: int = 0  # how many of ``fetched`` have been checked
    spent: float = 0.0  # seconds spent checking them
    checked: dict[str, TuningRecord] = field(default_factory=dict)  # server records that passed


@derived_object
class Database(PyDatabase):
    """MetaSchedule records on a tunecache server, partitioned by target and TVM version.

    Args:
        url: the server; ``TUNECACHE_URL`` when omitted.
        target: the target the records are for (a ``Target``, a target dict or string).
            MetaSchedule ignores the target on lookup, so the database only ever reads and writes
            this target's partition.
        token: the API token (reads need 'read', uploads 'write'); ``TUNECACHE_TOKEN`` when
            omitted.
        timeout: seconds one read may take (``TUNECACHE_TIMEOUT`` when omitted); writes get
            at least 10 s.

    Example:
        >>> from tvm.s_tir import meta_schedule as ms
        >>> target = {"kind": "llvm", "num-cores": 2}
        >>> db = Database("http://127.0.0.1:8765", target=target)  # doctest: +SKIP
        >>> ms.tune_tir(mod, target, "work", 64, database=db)  # doctest: +SKIP
        >>> # in any other process, later:
        >>> sch = ms.tir_integration.compile_tir(db, mod, target)  # doctest: +SKIP
        >>> lib = tvm.tirx.build(sch.mod if sch else mod, target=target)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        target: Target | Mapping[str, Any] | str,
        token: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        if timeout is None:
            timeout = Settings.from_env(with_url=False).timeout
        if isinstance(timeout, bool) or not (
            isinstance(timeout, int | float) and 0 < timeout <= MAX_LOOKUP_TIMEOUT
        ):
            raise InvalidInput(f"timeout must be a positive number of seconds, at most "
                               f"{MAX_LOOKUP_TIMEOUT:g}: {timeout!r}")  # fmt: skip
        self.partition = partition_for(target)
        self.device = target_device(target_json(target))  # what the traces it takes are for
        self.remote = Remote(url, token, float(timeout), self.partition)
        self._entries: dict[str, _Entry] = {}
        self._rejected = 0

    # -- MetaSchedule's interface: none of these raises ----------------------------------------
    def has_workload(self, mod: IRModule) -> bool:
        """Whether ``mod`` was committed here or has records on the server."""

        def answer() -> bool:
            entry = self._entry(mod)
            return entry.committed or bool(entry.local) or bool(self._best(entry, 1))

        return self._guard("has_workload", answer, False)

    def commit_workload(self, mod: IRModule) -> Workload:
        """The workload of ``mod`` (uploaded with its first record, not now)."""

        def commit() -> Workload:
            entry = self._entry(mod)
            entry.committed = True
            return entry.workload

        return self._guard("commit_workload", commit, None) or Workload(mod)

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Keeps ``record`` here and uploads it (with its workload, the first time)."""

        def commit() -> None:
            entry = self._entry(record.workload.mod)
            self._keep(entry, record)
            self._upload(entry, [record])

        self._guard("commit_tuning_record", commit, None)

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        """Up to ``top_k`` successfully measured records of ``workload``, fastest first."""
        return self._guard("get_top_k", lambda: self._best(self._entry(workload.mod), top_k), [])

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every record of the workloads this database has seen, this process's and the team's.

        Not the whole partition: listing it would mean rebuilding other workloads' modules from
        the server's JSON, and ``tvm.ir.load_json`` crashes the process (segfaults) on malformed
        input, which a client must never risk on what a server sends.
        """

        def collect() -> list[TuningRecord]:
            records: list[TuningRecord] = []
            for entry in self._entries.values():
                self._check(entry, math.inf)
                records.extend(_merged(entry).values())
            return records

        return self._guard("get_all_tuning_records", collect, [])

    def __len__(self) -> int:
        return len(self.get_all_tuning_records())

    # -- tooling ------------------------------------------------------------------------------
    def upload(self, mod: IRModule, records: Sequence[TuningRecord]) -> ArtifactPutResult:
        """Uploads ``records`` of ``mod`` (and ``mod``), raising on failure.

        Raises:
            ServerError: the server is unreachable or refused them.
        """
        return self.remote.client.put_artifacts(self.artifacts(mod, records))

    def artifacts(self, mod: IRModule, records: Sequence[TuningRecord]) -> list[ArtifactIn]:
        """What uploads ``records`` of ``mod`` (``mod``'s workload first), for a caller that
        sends them itself (``tunecache tune --tvm``, through its outbox); this database keeps
        the records too."""
        entry = self._entry(mod)
        for record in records:
            self._keep(entry, record)
        return self._items(entry, records, workload=True)

    def refresh(self) -> None:
        """Forgets the server's answers (not this process's records): the next lookups re-read."""
        for entry in self._entries.values():
            entry.fetched, entry.cursor, entry.checked, entry.spent = None, 0, {}, 0.0

    def close(self) -> None:
        """Closes the HTTP connection pool."""
        self.remote.close()

    # -- internals ----------------------------------------------------------------------------
    def _entry(self, mod: IRModule) -> _Entry:
        key = workload_key(mod)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(Workload(mod), args_info_json(mod))
        return entry

    def _keep(self, entry: _Entry, record: TuningRecord) -> None:
        item = record_item(record.as_json())
        known = entry.local.get(item)
        if known is None or _sort_key(record) < _sort_key(known):
            entry.local[item] = record

    def _items(
        self, entry: _Entry, records: Iterable[TuningRecord], *, workload: bool
    ) -> list[ArtifactIn]:
        """The artifacts of ``records`` (those that can be stored), after ``entry``'s workload
        when ``workload`` and there are any."""
        key = workload_key(entry.workload.mod)
        items: list[ArtifactIn] = []
        for record in records:
            artifact = record_artifact(self.partition, key, record)
            if artifact is not None:
                items.append(artifact)
        if items and workload:
            first = workload_artifact(self.partition, key, entry.workload.mod)
            items[:0] = [] if first is None else [first]
        return items

    def _upload(self, entry: _Entry, records: Iterable[TuningRecord]) -> None:
        """Stores ``records`` on the server as MetaSchedule commits them (a failure is logged
        and the records stay here)."""
        items = self._items(entry, records, workload=not entry.uploaded)
        if items and self.remote.put(items):
            entry.uploaded = True

    def _best(self, entry: _Entry, k: int) -> list[TuningRecord]:
        self._check(entry, k)
        ok = [r for r in _merged(entry).values() if mean_seconds(r.run_secs) is not None]
        ok.sort(key=_sort_key)
        return ok[: max(0, k)]

    def _check(self, entry: _Entry, k: float) -> None:
        """Checks the server's records of ``entry``, best score first, until ``k`` passed."""
        if entry.fetched is None:  # asked again while the server has not answered
            key = workload_key(entry.workload.mod)
            entry.fetched = shared_artifacts(lambda: self.remote.get(RECORD, key, KEY_LIMIT),
                                             RECORD, self.partition, key)  # fmt: skip
        fetched = entry.fetched or []
        while len(entry.checked) < k and entry.cursor < len(fetched):
            if entry.spent >= CHECK_SECONDS:
                self._reject(f"{len(fetched) - entry.cursor} more record(s) of this workload",
                             f"checking its records took {entry.spent:.0f} s already")  # fmt: skip
                entry.cursor = len(fetched)
                break
            item = fetched[entry.cursor]
            entry.cursor += 1
            started = time.monotonic()
            record, why = check_record(item.value, entry.workload, entry.args, self.device)
            entry.spent += time.monotonic() - started
            if record is not None:
                entry.checked[item.item] = record
            else:
                self._reject(f"record #{item.id}", why)

    def _reject(self, what: str, why: str) -> None:
        self._rejected += 1
        log = logger.warning if self._rejected == 1 else logger.debug
        log(
            "tunecache.tvm: ignoring %s from %s: %s",
            what,
            self.remote.client.url,
            why[:BAD_ANSWER_CHARS],
        )  # TVM's block names grow with each cache: 29 KB lines

    def _guard(self, what: str, call: Callable[[], T], fallback: T) -> T:
        try:
            return call()
        except Exception:
            logger.warning(
                "tunecache.tvm: %s failed; answering as if nothing were stored", what, exc_info=True
            )
            return fallback


def _merged(entry: _Entry) -> dict[str, TuningRecord]:
    """The server's checked records of ``entry`` with this process's, the faster per item."""
    merged = dict(entry.checked)
    for item, record in entry.local.items():
        known = merged.get(item)
        if known is None or _sort_key(record) < _sort_key(known):
            merged[item] = record
    return merged


def _sort_key(record: TuningRecord) -> float:
    seconds = mean_seconds(record.run_secs)
    return math.inf if seconds is None else seconds
