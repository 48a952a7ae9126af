"""Snapshot queries: the winners of a device arch, and merging a snapshot's records.

Keyword-only and typed, and they never commit: the session's owner does, but for an import's
chunks (:func:`import_records`), each committed as it is stored so that an import holds other
writers back one chunk at most, never for its whole run. An export states each record's
provenance (:mod:`tunecache.snapshot_provenance`); an import keeps it and never raises trust above
it: a record pending at export stays pending, a verified one is verified only when a trusted token
imports it (the importer vouches for the file), and the importer is recorded as the importer,
never as the uploader.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy import Select, func, select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from cache_server import buckets, tokens, twins
from cache_server.models import RecordRow, TokenRow, WinnerRow, utcnow
from cache_server.queries import (
    RECORD_SIZE,
    BucketFull,
    WinnerTable,
    add_record,
    ensure_live,
    public_record,
    record_fields,
    record_row,
)
from cache_server.quota import QuotaFull, charge, room
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


# An import commits its records a chunk at a time, each chunk taking only its own keys' locks
# (cache_server.twins.lock_key) and giving them back as it commits. As one transaction, one import
# of 4,097 keys held every lock slot for 30 s (PostgreSQL; SQLite's one write lock as long): every
# other token's uploads waited, one 45 s and then a 503, and it failed at the end (a full bucket).
CHUNK_RECORDS = 256  # records a chunk stores at most
CHUNK_SECONDS = 0.25  # and it commits once it has held its locks this long
# What an import waits between chunks on SQLite, where its write lock is the whole database's: a
# writer waiting for it polls this far apart at most (SQLite's busy handler), and so gets a turn.
SQLITE_TURN_SECONDS = 0.1


class _Planned(NamedTuple):
    """A snapshot's record as an import stores it: its key's hash, its position in the snapshot,
    what its provenance states, and the row (:func:`imported_row`)."""

    key_hash: str
    position: int
    record: RecordCreate
    stated: RecordProvenance | None
    row: RecordRow


def import_records(
    session: Session, *, records: Sequence[RecordCreate], uploader: TokenRow | None = None,
    bucket_limit: int | None = None, provenance: Sequence[RecordProvenance] | None = None,
    quota: int | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Adds every record through :func:`add_record`, imported by ``uploader`` with what
    ``provenance`` states of it (:func:`imported_row`; ``None``: nothing, as a snapshot before
    provenance): the faster validated record of a key wins. A record whose time a verifier
    re-timed is left out unless ``uploader`` is trusted (:func:`imported_row`).

    What would refuse the import midway is checked first, before any key's lock is taken: a new
    key in a full bucket is a :class:`BucketFull` at once, nothing stored. Then the records are
    stored by key, a chunk at a time (:data:`CHUNK_RECORDS`, :data:`CHUNK_SECONDS`), and each
    chunk but the last is committed here (the session's owner commits the last): a write waits
    for an import at most one chunk, and only a write of the keys the chunk holds (PostgreSQL).
    One refused midway all the same (a writer filled the bucket meanwhile, or the uploader's
    quota ran out: ``quota``, :mod:`cache_server.quota`, a chunk ending before a record that
    would not fit) keeps the chunks before it, its error says how many records they stored,
    and sent again it stores the rest (past the quota: none).

    Returns:
        ``(imported, winners_changed)``: records stored (not those this uploader had sent
        before: a snapshot imported twice is stored once), and keys whose winner is now one of
        them.

    Raises:
        InvalidInput: the database refused a record's data (PostgreSQL refuses NUL characters in
            text columns, for one); the caller's rollback then undoes its chunk.
        BucketFull: a record is a new key's in a bucket with no room for ``uploader``'s (same).
        QuotaFull: the records of a chunk would take ``uploader`` past ``quota`` (the same).
        Revoked: ``uploader`` was revoked while the import ran; the chunks before stay stored.
    """
    planned = _plan(session, records=records, provenance=provenance, importer=uploader)
    if bucket_limit is not None:
        _check_rooms(session, planned, bucket_limit, uploader)
    changed: set[str] = set()
    stored = at = 0
    while at < len(planned):
        if at:
            _next_chunk(session)
        before = (f"the {stored} records this import stored before it stay stored, and no "
                  "more were") if stored else "nothing was stored"  # fmt: skip
        if uploader is not None:  # one revoked meanwhile stores no more
            ensure_live(session, uploader.id, doing=before)
        try:
            at, new, won = _store_chunk(session, planned, at, _Importer(uploader, bucket_limit,
                                                                        quota))  # fmt: skip
        except tokens.Revoked:  # read behind a key's lock, mid-chunk (its rollback undoes it)
            raise tokens.Revoked(
                f"the token was revoked while this request ran: {before}"
            ) from None
        except (BucketFull, InvalidInput, QuotaFull) as exc:
            if not stored:
                raise
            again = "" if isinstance(exc, QuotaFull) else ": sent again, it stores the rest"
            raise type(exc)(f"{exc} (the {stored} records this import stored before it stay "
                            f"stored, committed a chunk at a time{again})") from exc  # fmt: skip
        stored += new
        changed |= won
    return stored, len(changed)


def _plan(
    session: Session, *, records: Sequence[RecordCreate],
    provenance: Sequence[RecordProvenance] | None, importer: TokenRow | None,
) -> list[_Planned]:  # fmt: skip
    """What an import stores: by key, each key's records in the order sent (every writer takes
    its keys' locks in one order, :func:`cache_server.twins.lock_key`, so two imports at once
    never wait for each other in a circle); not a record :func:`imported_row` leaves out, nor
    one this importer stored before (records are never deleted: it is stored still)."""
    planned = []
    for key_hash, i, record in sorted((r.key.digest(), i, r) for i, r in enumerate(records)):
        stated = None if provenance is None else provenance[i]
        row = imported_row(key_hash=key_hash, record=record, stated=stated, importer=importer)
        if row is not None:
            planned.append(_Planned(key_hash, i, record, stated, row))
    digests = (p.row.upload_digest for p in planned)
    held = {d for (d,) in _among(session, select(RecordRow.upload_digest),
                                 RecordRow.upload_digest, digests)}  # fmt: skip
    kept = []
    for p in planned:  # a record twice in the snapshot is one upload: stored once, charged once
        if p.row.upload_digest not in held:
            held.add(p.row.upload_digest)
            kept.append(p)
    return kept


def _among(
    session: Session, stmt: Select[*tuple[Any, ...]], column: Any, values: Iterable[Any]
) -> list[Any]:
    """The rows of ``stmt`` whose ``column`` is one of ``values``, read
    :data:`cache_server.twins.CHUNK` values a statement."""
    wanted = sorted(set(values))
    rows: list[Any] = []
    for at in range(0, len(wanted), twins.CHUNK):
        rows += session.execute(stmt.where(column.in_(wanted[at : at + twins.CHUNK]))).all()
    return rows


def _check_rooms(session: Session, planned: Sequence[_Planned], limit: int,
                 importer: TokenRow | None) -> None:  # fmt: skip
    """Raises :class:`BucketFull` where :func:`add_record` would, before any lock is taken: a
    validated record of a key without a winner, in a bucket where ``importer`` may add no new
    key (:func:`cache_server.buckets.refusal`) with the winners the import's records before it
    add (none for one a twin's finding makes disputed:
    :func:`cache_server.twins.inherit_findings`). Read without locks: a bucket a writer fills
    meanwhile, :func:`add_record` still finds (its check holds the key's lock)."""
    validated = [p for p in planned if p.record.validation.passed]
    won = {k for (k,) in _among(session, select(WinnerRow.key_hash), WinnerRow.key_hash,
                                (p.key_hash for p in validated))}  # fmt: skip
    new = [p for p in validated if p.key_hash not in won]
    if not new:
        return
    counted = _among(session, buckets.winners(importer), RecordRow.bucket_hash,
                     (p.row.bucket_hash or "" for p in new))  # fmt: skip
    held: dict[str, list[int]] = {bucket: [n, own] for bucket, n, own in counted}
    refused = twins.refused_among(session, {p.key_hash for p in new})
    for p in new:
        bucket = p.row.bucket_hash or ""
        if p.key_hash in won:
            continue
        n, own = held.setdefault(bucket, [0, 0])
        if (why := buckets.refusal(n, own, limit, importer)) is not None:
            before = "with this snapshot's records before it"
            raise BucketFull(f"records[{p.position}]: a new key in a shape bucket that, {before}, "
                             f"{why}: nothing was stored")  # fmt: skip
        if p.row.config_digest not in refused.get(p.key_hash, set()):
            won.add(p.key_hash)
            held[bucket] = [n + 1, own + 1]


def _next_chunk(session: Session) -> None:
    """Commits the chunk stored (its keys' locks go back); on SQLite, waits for a writer behind
    it to take its turn (:data:`SQLITE_TURN_SECONDS`)."""
    session.commit()
    if session.get_bind().dialect.name == "sqlite":
        time.sleep(SQLITE_TURN_SECONDS)


class _Importer(NamedTuple):
    """Who imports (``None``: behind the API), and the bounds its import keeps: winners a bucket
    may hold, bytes the importer may store (``None``: neither bounded)."""

    token: TokenRow | None
    bucket_limit: int | None
    quota: int | None


def _store_chunk(
    session: Session, planned: list[_Planned], at: int, importer: _Importer
) -> tuple[int, int, set[str]]:
    """Stores ``planned[at:]`` until the chunk is full: the index it ended at, the records it
    stored and the keys whose winner is now one of them. A unique index that refuses one (the
    same upload, stored meanwhile by another request) rolls the chunk back, and it runs once
    more on rows built afresh, finding what the other stored."""
    try:
        return _chunk(session, planned, at, importer)
    except IntegrityError:
        session.rollback()
    for i in range(at, min(at + CHUNK_RECORDS, len(planned))):
        p = planned[i]
        row = imported_row(key_hash=p.key_hash, record=p.record, stated=p.stated,
                           importer=importer.token)  # fmt: skip
        assert row is not None  # as it was built before
        planned[i] = p._replace(row=row)
    return _chunk(session, planned, at, importer)


def _chunk(
    session: Session, planned: Sequence[_Planned], at: int, importer: _Importer
) -> tuple[int, int, set[str]]:
    """:func:`_store_chunk`, once: at most :data:`CHUNK_RECORDS` records, and none more once
    its first took :data:`CHUNK_SECONDS` and on, nor once the next would not fit in the
    importer's quota; the importer is charged the chunk's bytes as it ends (the last lock it
    takes: :mod:`cache_server.quota`). So an import past the quota stores its records, in the
    order it stores them, up to the first that does not fit, however the chunks fell (when a
    chunk ended by the clock, one refused whole stored more or less of them run to run)."""
    started, changed, stored, end, sent = time.monotonic(), set(), 0, at, 0
    left = room(session, importer.token, importer.quota)
    while end < len(planned) and end - at < CHUNK_RECORDS:
        if end > at and time.monotonic() - started >= CHUNK_SECONDS:
            break
        p = planned[end]
        # Its room: what is left less what the chunk stored, checked by add_record once the
        # row is as it would be stored (after its twins' findings, and its 'sent again' check).
        fits = None if left is None else replace(left, held=left.held + sent,
                                                 what=f"records[{p.position}]")  # fmt: skip
        try:
            added = add_record(session, key_hash=p.key_hash, record=p.record,
                               uploader=importer.token, bucket_limit=importer.bucket_limit,
                               row=p.row, room=fits)  # fmt: skip
        except QuotaFull:
            if end > at:
                break  # nothing of it written: the next chunk starts with it, refused there
            raise
        except DataError as exc:
            raise InvalidInput(
                f"records[{p.position}]: the database refused it: {exc.orig}"
            ) from exc
        stored += not added.again
        sent += added.stored_bytes
        if added.winner == added.record_id and not added.again:
            changed.add(p.key_hash)
        end += 1
    if importer.quota is not None:
        charge(session, importer.token, sent, quota=importer.quota,
               what=f"the import's next {stored} records")  # fmt: skip
    return end, stored, changed


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
