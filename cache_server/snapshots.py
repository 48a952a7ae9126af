"""Snapshot queries: the winners of a device arch, and merging a snapshot's records.

Keyword-only and typed, and they never commit: the session's owner does, so an import is one
transaction. An export states each record's provenance (:mod:`tunecache.snapshot_provenance`);
an import keeps it and never raises trust above it: a record pending at export stays pending, a
verified one is verified only when a trusted token imports it (the importer vouches for the file),
and the importer is recorded as the importer, never as the uploader.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Select, func, select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from cache_server.models import RecordRow, TokenRow, WinnerRow, utcnow
from cache_server.queries import (
    RECORD_SIZE,
    WinnerTable,
    add_record,
    public_record,
    record_fields,
    record_row,
)
from cache_server.trust import TIMING_FLAG_RATIO, time_ratio
from tunecache.canonical import canonical_json
from tunecache.errors import InvalidInput
from tunecache.kernels import builtin_problem
from tunecache.measured import speedup_problem
from tunecache.schemas import STORED, RecordCreate, RecordPublic, VerificationPublic
from tunecache.snapshot import MAX_SNAPSHOT_RECORDS, SnapshotFilters
from tunecache.snapshot_provenance import RecordProvenance, StatedVerification, uploaders_of

# The winners as a snapshot carries them, and what it states of each (None: not asked for).
Exported = tuple[list[RecordCreate], list[RecordProvenance] | None]


def _create(row: RecordRow, *, provenance: bool) -> tuple[RecordCreate, RecordProvenance | None]:
    """``row`` as a snapshot carries it: the time the server believes (a verifier's, once one
    re-timed it) and only the comparisons that stand (none of an uploader whose time the
    verifier's differs from past :data:`tunecache.believed.APART_RATIO`; beside a verifier's
    time, only interleaved ones, and of those only the ones its time agrees with). A snapshot has
    no verification of its own: exported as uploaded, a time the verifier found 3x too fast won
    again on the server that imported it."""
    public = public_record(row, is_winner=True)
    baselines = public.comparisons()
    if public.believed_timing is not public.timing:  # a verifier's time beside the uploader's
        # baselines: a ratio of medians would divide one machine's by another's; an interleaved
        # comparison's ratio stands on its own, unless the time exported contradicts it (an
        # import refuses such figures: tunecache.measured.speedup_problem).
        believed = public.believed_timing
        baselines = [b for b in baselines
                     if b.speedup is not None and speedup_problem(b, believed) is None]  # fmt: skip
    fields = {**record_fields(row), "timing": public.believed_timing, "baselines": baselines}
    record = RecordCreate.model_validate(fields, context=STORED)
    return record, _provenance(row, public, record) if provenance else None


def _provenance(row: RecordRow, public: RecordPublic, record: RecordCreate) -> RecordProvenance:
    """What this server knows of who measured and vouched for ``row`` (exported as ``record``):
    a passed verification with the device it timed on, and the uploader's own time where the
    exported one is the verifier's."""
    check = public.verification if public.status == "verified" else None
    retimed = public.timed()[0] == "verifier"
    stated = None
    if check is not None and check.passed:
        stated = StatedVerification(verifier=check.verifier, device_name=check.device_name,
                                    verified_at=check.verified_at, retimed=retimed)  # fmt: skip
    # An imported record's uploader is what its file said, which no one here vouched for: stated
    # on, it read as the uploader's own word one import later, its importer gone.
    uploader = None if row.imported_by is not None else row.uploaded_by
    fields = {
        "status": "verified" if stated is not None else "pending",
        "uploaded_by": uploader, "created_at": row.created_at, "verification": stated,
        "uploader_timing": public.timing if retimed else None,
        "uploaders": uploaders_of(record, retimed=retimed),
    }  # fmt: skip
    try:
        return RecordProvenance.model_validate(fields, context=STORED)
    except ValidationError:  # a name stored before names were checked: stated as nobody's
        return RecordProvenance.model_validate({**fields, "uploaded_by": None}, context=STORED)


class SnapshotTooLarge(Exception):
    """The winners a snapshot would hold are over the server's bounds (a 422 naming them)."""


def snapshot_winners(
    session: Session, *, filters: SnapshotFilters, table: WinnerTable = WinnerRow,
    max_bytes: int | None = None, provenance: bool = False,
) -> Exported:  # fmt: skip
    """The winner (in ``table``) of every key matching ``filters``, by key hash, no trials, and
    with ``provenance`` what the snapshot states of each (built only then: an export without it
    is a ``sync`` client's, polled).

    Raises:
        SnapshotTooLarge: more than :data:`~tunecache.snapshot.MAX_SNAPSHOT_RECORDS` winners
            (what a client reads), or with ``max_bytes``, more stored JSON than that: counted
            in the database before any is read (a write token's fat winners made one export
            gigabytes to build).
    """
    stmt = (
        select(RecordRow)
        .join(table, table.record_id == RecordRow.id)
        .where(RecordRow.device_arch == filters.device_arch)
    )  # fmt: skip
    for column, value in (
        (RecordRow.device_name, filters.device_name),
        (RecordRow.kernel, filters.kernel),
        (RecordRow.backend, filters.backend),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    _check_size(session, stmt, max_bytes)
    # A built-in kernel's record at a problem it does not take (stored before uploads were
    # checked) is never looked up, and another server would refuse it: left out.
    exported = [_create(row, provenance=provenance)
                for row in session.scalars(stmt.order_by(table.key_hash))
                if builtin_problem(row.key["kernel"], row.key["problem"]) is None]  # fmt: skip
    records = [record for record, _ in exported]
    return records, [s for _, s in exported if s is not None] if provenance else None


def _check_size(session: Session, stmt: Select[Any], max_bytes: int | None) -> None:
    count, held = session.execute(
        stmt.with_only_columns(
            func.count(), func.coalesce(func.sum(RECORD_SIZE), 0), maintain_column_froms=True
        )
    ).one()
    over = []
    if count > MAX_SNAPSHOT_RECORDS:
        over.append(f"{count} winners (a snapshot holds at most {MAX_SNAPSHOT_RECORDS})")
    if max_bytes is not None and held > max_bytes:
        over.append(f"{held:,} bytes of records (the server's limit is {max_bytes:,}: "
                    "TUNECACHE_SERVER_SNAPSHOT_BYTES)")  # fmt: skip
    if over:
        raise SnapshotTooLarge(f"this snapshot would hold {' and '.join(over)}: narrow it with "
                               "kernel, backend or device_name (or have the server's operator "
                               "raise its limit)")  # fmt: skip


def import_records(
    session: Session, *, records: Sequence[RecordCreate], uploader: TokenRow | None = None,
    bucket_limit: int | None = None, provenance: Sequence[RecordProvenance] | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Adds every record through :func:`add_record`, imported by ``uploader`` with what
    ``provenance`` states of it (:func:`imported_row`; ``None``: nothing, as a snapshot before
    provenance): the faster validated record of a key wins. A record whose time a verifier
    re-timed is left out unless ``uploader`` is trusted (:func:`imported_row`).

    Returns:
        ``(imported, winners_changed)``: records stored (not those this uploader had sent
        before: a snapshot imported twice is stored once), and keys whose winner is now one of
        them.

    Raises:
        InvalidInput: the database refused a record's data (PostgreSQL refuses NUL characters in
            text columns, for one); the caller's rollback then undoes the whole import.
        BucketFull: a record is a new key's in a bucket at ``bucket_limit`` winners (the same).
    """
    changed: set[str] = set()
    stored = 0
    # By key, each key's in the order sent: every writer takes its keys' locks in one order
    # (cache_server.twins.lock_key), so two imports at once never wait for each other in a circle.
    ordered = sorted((record.key.digest(), i, record) for i, record in enumerate(records))
    for key_hash, i, record in ordered:
        stated = None if provenance is None else provenance[i]
        row = imported_row(key_hash=key_hash, record=record, stated=stated, importer=uploader)
        if row is None:  # a verifier's time only a trusted importer may vouch for
            continue
        try:
            added = add_record(session, key_hash=key_hash, record=record, uploader=uploader,
                               bucket_limit=bucket_limit, row=row)  # fmt: skip
        except DataError as exc:
            raise InvalidInput(f"records[{i}]: the database refused it: {exc.orig}") from exc
        stored += not added.again
        if added.winner == added.record_id and not added.again:
            changed.add(key_hash)
    return stored, len(changed)


def imported_row(
    *, key_hash: str, record: RecordCreate, stated: RecordProvenance | None,
    importer: TokenRow | None,
) -> RecordRow | None:  # fmt: skip
    """The row that stores ``record`` as ``importer`` imported it, with what ``stated`` says of
    it: the uploader it names (the importer is ``imported_by``), its date (one past now is now),
    and its verification with the device the verifier timed on — verified only where ``stated``
    says so and a trusted token imports it. ``stated`` ``None`` (a snapshot without provenance)
    states nobody's word: pending, no uploader named, dated now. Ranked by the snapshot's time,
    whatever is stated.

    ``None`` (not imported) for a record whose time a verifier re-timed, where the importer is
    not trusted: the time is the verifier's, measured on the verifier's device, and a pending
    record has no verification to say so (it read as its uploader's own, on the key's device);
    the uploader's own time instead would revive a claim the verifier did not confirm."""
    vouched = importer is not None and importer.trusted and record.validation.passed
    verified = stated is not None and stated.status == "verified" and stated.verification
    if stated is not None and stated.retimed and not (vouched and verified):
        return None
    row = record_row(key_hash=key_hash, record=record, uploader=importer)
    row.imported_by = None if importer is None else importer.name
    row.status, row.uploaded_by, row.verification = "pending", None, None
    if stated is None:
        return row
    row.uploaded_by, row.created_at = stated.uploaded_by, min(stated.created_at, utcnow())
    # One import of the same record with other provenance (verified since) is another import.
    said = canonical_json(stated.model_dump(mode="json")).encode()
    row.upload_digest = hashlib.sha256(
        (row.upload_digest or "").encode() + b"\n" + said
    ).hexdigest()
    if not (vouched and verified):
        return row
    row.status, row.verification = "verified", _verification(record, stated)
    if stated.uploader_timing is not None:  # shown as the uploader's claim; time_ms ranks
        row.timing = stated.uploader_timing.model_dump(mode="json")
    return row


def _verification(record: RecordCreate, stated: RecordProvenance) -> dict[str, Any]:
    """The stated verification as this server stores one: the verifier's time is the
    snapshot's, where it re-timed the record, and the ratio to its uploader's is worked out
    here (never taken from the file)."""
    check = stated.verification
    assert check is not None
    timing = record.timing if check.retimed else None
    ratio = None
    if timing is not None and stated.uploader_timing is not None:
        ratio = time_ratio(timing.median_ms, stated.uploader_timing.model_dump(mode="json"))
    return VerificationPublic(
        passed=True, verifier=check.verifier, device_name=check.device_name,
        verified_at=min(check.verified_at, utcnow()), timing=timing, time_ratio=ratio,
        timing_flag=ratio is not None and ratio > TIMING_FLAG_RATIO,
    ).model_dump(mode="json")  # fmt: skip
