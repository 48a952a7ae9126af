"""Snapshots: the validated winners of one device arch as one file.

A snapshot is a :class:`SnapshotPublic` document, ``{"format", "filters", "records"}`` (and,
from ``tunecache snapshot export``, ``"provenance"``: who measured and vouched for each record,
:mod:`tunecache.snapshot_provenance`), written as canonical JSON with records ordered by key hash.
It carries no timestamp of its own (a provenance states each record's date) and no trials, so the
same winners always give the same bytes, and its ETag (the SHA-256 of the canonical records, and
of their provenance where stated) is a pure function of them: two servers holding the same winners
give the same ETag for a snapshot without provenance. Clients keep one as a local file for lookups
without a server (``Client(snapshot=path)``), and images can have one baked in.

Example:
    >>> from pathlib import Path
    >>> from tunecache import Client
    >>> with Client("http://127.0.0.1:8765") as client:  # doctest: +SKIP
    ...     document, etag = client.export_snapshot("cpu-avx2")
    ...     save_snapshot(Path("winners.json"), document)
    >>> client = Client(snapshot=Path("winners.json"))  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from tunecache.answers import SNAPSHOT_CONTAINERS
from tunecache.canonical import canonical_json
from tunecache.errors import InvalidInput, validation_problems
from tunecache.folders import open_regular, read_bounded, shared_mode, write_atomic
from tunecache.http import MAX_ANSWER_BYTES
from tunecache.jsonsafe import parse_json, past_bound
from tunecache.schemas import Backend, KeyModel, Line, Name, RecordCreate, _Strict
from tunecache.snapshot_provenance import RecordProvenance, stated_for
from tunecache.strict import SERVED

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "tunecache-snapshot/1"
MAX_SNAPSHOT_RECORDS = 50_000


class SnapshotFilters(_Strict):
    """Which winners a snapshot holds: one device arch, optionally narrowed further."""

    device_arch: Name
    device_name: Annotated[Line, Field(min_length=1, max_length=128)] | None = None
    kernel: Name | None = None
    backend: Backend | None = None

    def mismatch(self, key: KeyModel) -> str | None:
        """Why ``key`` falls outside these filters, or ``None`` when it matches them."""
        for name, wanted, actual in (
            ("device_arch", self.device_arch, key.device.arch),
            ("device_name", self.device_name, key.device.name),
            ("kernel", self.kernel, key.kernel),
            ("backend", self.backend, key.backend),
        ):
            if wanted is not None and actual != wanted:
                return f"{name} is {actual!r}, not the snapshot's {wanted!r}"
        return None


class SnapshotPublic(_Strict):
    """The validated winners of one device arch, as one document.

    Only winners are exported, without their trials (``trials`` is empty), to keep snapshots
    small. On import every record, validated or not, must match ``filters``; the count is checked
    before any record is parsed, so an oversized snapshot is refused at once. ``provenance``, one
    per record in the same order, states who measured and vouched for each (``None``: a snapshot
    that states nobody's, as every one did before it existed: imported pending).
    """

    format: Literal["tunecache-snapshot/1"]
    filters: SnapshotFilters
    records: Annotated[list[RecordCreate], Field(max_length=MAX_SNAPSHOT_RECORDS)]
    provenance: Annotated[list[RecordProvenance], Field(max_length=MAX_SNAPSHOT_RECORDS)] | None = (
        None
    )

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("records", "provenance"):
                held = data.get(name)
                if isinstance(held, list) and len(held) > MAX_SNAPSHOT_RECORDS:
                    raise ValueError(
                        f"a snapshot holds at most {MAX_SNAPSHOT_RECORDS} {name}, not "
                        f"{len(held)}; split it by kernel or backend"
                    )
        return data

    @model_validator(mode="after")
    def _records_match_filters(self) -> SnapshotPublic:
        for i, record in enumerate(self.records):
            if (why := self.filters.mismatch(record.key)) is not None:
                raise ValueError(f"records[{i}]: key {why}")
        if self.provenance is None:
            return self
        if len(self.provenance) != len(self.records):
            raise ValueError(f"provenance states {len(self.provenance)} records' for "
                             f"{len(self.records)} records: one each, in their order")  # fmt: skip
        for i, (record, stated) in enumerate(zip(self.records, self.provenance, strict=True)):
            if (why := stated_for(record, stated)) is not None:
                raise ValueError(f"provenance[{i}].{why}")
        return self


class SnapshotImportResult(_Strict):
    imported: int  # records stored, validated or not
    winners_changed: int  # keys whose winner is now a record of this snapshot


__all__ = [
    "SNAPSHOT_FORMAT",
    "index_snapshot",
    "load_snapshot",
    "parse_snapshot",
    "render_snapshot",
    "save_snapshot",
    "snapshot_etag",
]


def _records_json(records: Sequence[RecordCreate]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json", by_alias=True, exclude={"trials"}) for r in records]


def _provenance_json(provenance: Sequence[RecordProvenance]) -> list[dict[str, Any]]:
    return [p.model_dump(mode="json", exclude_none=True) for p in provenance]


def snapshot_etag(
    records: Sequence[RecordCreate], provenance: Sequence[RecordProvenance] | None = None
) -> str:
    """The quoted ETag of ``records``: the SHA-256 of their canonical JSON, trials left out, and
    of their ``provenance`` with it where the snapshot states one (a record verified since, or
    imported by another token, is another snapshot).

    Records must be in snapshot order (by key hash), as the server exports them.
    """
    held: Any = _records_json(records)
    if provenance is not None:
        held = {"records": held, "provenance": _provenance_json(provenance)}
    text = canonical_json(held)
    return f'"{hashlib.sha256(text.encode("utf-8")).hexdigest()}"'


def render_snapshot(
    filters: SnapshotFilters, records: Sequence[RecordCreate],
    provenance: Sequence[RecordProvenance] | None = None,
) -> tuple[bytes, str]:  # fmt: skip
    """The canonical document bytes of a snapshot and its ETag.

    Args:
        filters: what the snapshot was selected by (unset filters are left out).
        records: the winners, ordered by key hash; their trials are left out.
        provenance: each record's, in their order (``None``: left out, as before it existed).
    """
    document: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "filters": filters.model_dump(mode="json", exclude_none=True),
        "records": _records_json(records),
    }
    if provenance is not None:
        document["provenance"] = _provenance_json(provenance)
    return canonical_json(document).encode("utf-8"), snapshot_etag(records, provenance)


def parse_snapshot(
    document: Mapping[str, Any] | SnapshotPublic, *, served: bool = False
) -> SnapshotPublic:
    """Validates a snapshot document; ``served``: one a server sent, whose stored text is taken
    as stored (escaped where shown).

    Raises:
        InvalidInput: the document is not a valid snapshot, naming the first problems.
    """
    if isinstance(document, SnapshotPublic):
        return document
    try:
        return SnapshotPublic.model_validate(document, context=SERVED if served else None)
    except ValidationError as exc:
        raise InvalidInput(f"not a valid snapshot: {validation_problems(exc)}") from None


def load_snapshot(path: Path) -> SnapshotPublic:
    """Reads and validates a snapshot file (as served: text a server stored before it checked
    text is read as stored, and escaped where shown), leaving out (with one warning) each record
    that does not validate on its own — a config outside the closed schemas of this version,
    say — so one bad record does not cost the others.

    A file over the bounds of a server's snapshot answer (``MAX_ANSWER_BYTES``, 256 MiB, and
    ``SNAPSHOT_CONTAINERS`` JSON arrays and objects) is refused before it is parsed: what
    ``tunecache sync`` writes always loads, and no file costs a lookup more than a snapshot a
    server may send (a crafted file of 100 MB of empty lists was parsed, twice).

    Raises:
        InvalidInput: the file cannot be read, is past those bounds or is not a valid snapshot.
    """
    return validated_snapshot(path, read_snapshot_bytes(path))


def read_snapshot_bytes(path: Path) -> bytes:
    """The bytes of the snapshot file at ``path``, within the bounds :func:`load_snapshot` says.

    Opened without blocking and refused unless the opened file is a regular one (a symlink to
    one is; :func:`tunecache.folders.open_regular`): a FIFO blocked the read until the process
    was killed, and ``/dev/zero`` was read to the 256 MiB bound.
    """
    try:
        with open_regular(path) as file:
            text = read_bounded(file, MAX_ANSWER_BYTES)
    except OSError as exc:
        raise InvalidInput(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    if text is None:
        raise InvalidInput(f"{path} is over {MAX_ANSWER_BYTES:,} bytes: not a snapshot this "
                           "reads (a server's snapshot answer is at most that)")  # fmt: skip
    if past := past_bound(text, SNAPSHOT_CONTAINERS):
        raise InvalidInput(f"{path} is not a snapshot this reads: {past}")
    return text


def validated_snapshot(path: Path, text: bytes) -> SnapshotPublic:
    """:func:`load_snapshot`'s checks of the ``text`` of the file at ``path``, which
    :func:`read_snapshot_bytes` read: every record is validated now."""
    try:
        return SnapshotPublic.model_validate_json(text, context=SERVED)
    except ValidationError as exc:
        whole = exc
    salvaged = _salvage(text)
    try:
        if salvaged is None:
            raise whole
        document, kept, left_out = salvaged
        snapshot = SnapshotPublic.model_validate({**document, **kept}, context=SERVED)
    except ValidationError:
        raise InvalidInput(
            f"{path} is not a valid snapshot: {validation_problems(whole)}"
        ) from None
    logger.warning("%s: %d record(s) of the snapshot left out: %s", path, len(left_out),
                   "; ".join(left_out[:3]))  # fmt: skip
    return snapshot


def _salvage(text: bytes) -> tuple[dict[str, Any], dict[str, list[Any]], list[str]] | None:
    """The document, the records that validate on their own (with their provenance, where it
    states one for each), and why each other one does not; ``None`` when it is not a snapshot's
    shape at all (nothing to salvage)."""
    try:
        document = parse_json(text)
    except ValueError:
        return None
    records = document.get("records") if isinstance(document, dict) else None
    if not isinstance(records, list) or len(records) > MAX_SNAPSHOT_RECORDS:
        return None
    stated = document.get("provenance")
    aligned = isinstance(stated, list) and len(stated) == len(records)
    kept: dict[str, list[Any]] = {"records": [], **({"provenance": []} if aligned else {})}
    left_out = []
    for i, record in enumerate(records):
        try:
            RecordCreate.model_validate(record, context=SERVED)
        except ValidationError as exc:
            left_out.append(f"records[{i}]: {validation_problems(exc, 1)}")
            continue
        kept["records"].append(record)
        if aligned:
            kept["provenance"].append(stated[i])
    return document, kept, left_out


def index_snapshot(snapshot: SnapshotPublic) -> dict[str, RecordCreate]:
    """The snapshot's validated records by key digest; of two for one key, the faster wins."""
    return winners(snapshot.records)


def winners(records: Iterable[RecordCreate]) -> dict[str, RecordCreate]:
    """:func:`index_snapshot` of ``records``, in their order."""
    index: dict[str, RecordCreate] = {}
    for record in records:
        if not record.validation.passed:
            continue  # stored by an import, never served
        digest = record.key.digest()
        held = index.get(digest)
        if held is None or record.timing.median_ms < held.timing.median_ms:
            index[digest] = record
    return index


def save_snapshot(path: Path, document: Mapping[str, Any] | SnapshotPublic) -> None:
    """Writes a snapshot atomically (:func:`tunecache.folders.write_atomic`) as canonical JSON,
    keeping the mode of the file it replaces (:func:`tunecache.folders.shared_mode`: a snapshot
    other users' processes read was rewritten 0600, unreadable to them).

    A dict from :meth:`tunecache.Client.export_snapshot` is written byte for byte as the server
    sent it; it is validated first, so a file this writes always loads.

    Raises:
        InvalidInput: ``document`` is not a valid snapshot, or ``path`` cannot be written.
    """
    snapshot = parse_snapshot(document, served=True)  # what sync wrote, as the server sent it
    if isinstance(document, SnapshotPublic):
        data = render_snapshot(snapshot.filters, snapshot.records, snapshot.provenance)[0]
    else:
        data = canonical_json(dict(document)).encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, mode=shared_mode(path))  # other users' processes may read it
    except OSError as exc:
        raise InvalidInput(f"cannot write snapshot {path}: {exc.strerror or exc}") from None
