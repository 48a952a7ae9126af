"""Query functions. Keyword-only, typed, and they never commit: the session's owner does.

The winner upsert is one statement,
``INSERT … ON CONFLICT DO UPDATE … WHERE winners.time_ms > excluded.time_ms``, atomic on SQLite and
PostgreSQL alike: concurrent uploads of one key leave the fastest validated record as the winner
whatever order they commit in. Two tables hold winners: ``winners`` (the default policy: pending and
verified records) and ``verified_winners`` (the ``verified`` policy); a record that stops being
served (disputed, rejected) hands its place on (:mod:`cache_server.trust`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Select, bindparam, func, insert, select
from sqlalchemy.orm import Session

from cache_server import buckets, twins
from cache_server.budget import stored_size, within
from cache_server.db import upsert_insert
from cache_server.models import RecordRow, TokenRow, TrialRow, VerifiedWinnerRow, WinnerRow, utcnow
from cache_server.quota import Room, record_bytes
from tunecache.rules import bucket_digest
from tunecache.schemas import STORED, RecordCreate, RecordPublic, VerificationPublic
from tunecache.tokens import TRUSTED_UPLOADER, name_text

WinnerTable = type[WinnerRow] | type[VerifiedWinnerRow]

S = TypeVar("S", bound=Select)


def _insert_trials(session: Session, record_id: int, record: RecordCreate) -> None:
    """Every trial of ``record``, in order (the spread ``times_ms`` is not stored)."""
    if not record.trials:
        return
    rows = [
        {"record_id": record_id, "position": i, "config": t.config, "status": t.status,
         "time_ms": t.time_ms, "error": t.error}
        for i, t in enumerate(record.trials)
    ]  # fmt: skip
    session.execute(insert(TrialRow), rows)


def record_row(
    *, key_hash: str, record: RecordCreate, uploader: TokenRow | None = None
) -> RecordRow:
    """The row that stores ``record`` (its trials and winner aside), uploaded by ``uploader``:
    ``pending``, or ``verified`` at once when that token is trusted."""
    key = record.key
    sent = record.model_dump_json(by_alias=True).encode()
    trusted = uploader is not None and uploader.trusted and record.validation.passed
    verification = None
    if trusted:
        assert uploader is not None
        verification = VerificationPublic(
            passed=True, verifier=uploader.name + TRUSTED_UPLOADER,
            device_name=key.device.name, verified_at=utcnow(),
        ).model_dump(mode="json")  # fmt: skip
    return RecordRow(
        status="verified" if trusted else "pending",
        uploaded_by=None if uploader is None else uploader.name,
        vouched_by=None if uploader is None else uploader.id,
        verification=verification,
        disputes=0,
        verify_attempts=0,
        key_hash=key_hash,
        kernel=key.kernel,
        backend=key.backend,
        dtype=key.dtype,
        device_arch=key.device.arch,
        device_name=key.device.name,
        key=key.model_dump(mode="json", by_alias=True),
        config=record.config,
        config_summary=record.config_summary,
        time_ms=record.timing.median_ms,
        timing=record.timing.model_dump(mode="json"),
        baselines=[b.model_dump(mode="json") for b in record.baselines],
        validated=record.validation.passed,
        max_rel_error=record.validation.max_rel_error,
        validation=record.validation.model_dump(mode="json"),
        search=record.search.model_dump(mode="json"),
        provenance=record.provenance.model_dump(mode="json"),
        trial_count=len(record.trials),
        bucket_hash=bucket_digest(record.key.model_dump(mode="json", by_alias=True)),
        upload_digest=upload_digest(sent, uploader),
        config_digest=twins.config_digest(key.backend, record.config, kernel=key.kernel),
    )


def upload_digest(sent: bytes, uploader: TokenRow | None) -> str:
    """What makes an upload the same upload: its uploader (a token, by id: names may repeat)
    and every field it sent (``sent``: the record's JSON, as parsed, in the order sent). Two
    tunes never send the same record (their times differ); one upload sent twice does (its
    answer was lost and it was sent again, an outbox pushed twice, a snapshot imported twice),
    in the same order. Not canonical JSON: a
    record of 20,000 trials took 0.5 s to hash canonically, 0.05 s so; the same record sent
    with its keys in another order is stored twice, as every record was before."""
    who = "-" if uploader is None else str(uploader.id)
    return hashlib.sha256(who.encode() + b"\n" + sent).hexdigest()


def offer_winner(
    session: Session, table: WinnerTable, *, key_hash: str, record_id: int, time_ms: float
) -> int | None:
    """Makes the record the key's winner in ``table`` if it has none or a slower one (atomic):
    ``record_id`` if it is the winner now, else ``None`` (the key's winner is faster)."""
    stmt = upsert_insert(session, table).values(
        key_hash=key_hash, record_id=record_id, time_ms=time_ms, updated_at=utcnow()
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.key_hash],
        set_={
            "record_id": stmt.excluded.record_id,
            "time_ms": stmt.excluded.time_ms,
            "updated_at": stmt.excluded.updated_at,
        },
        where=table.time_ms > stmt.excluded.time_ms,
    )
    return session.scalar(stmt.returning(table.record_id))


class Added(NamedTuple):
    """A stored record: its id, the key's winner now (``None`` while the key has no validated
    record) and the record's status (``pending``, or ``verified`` from a trusted token; a record
    sent again: its status now, disputed or rejected as it may be since), and whether this
    uploader had sent this very record before (``again``: nothing was stored); ``stored_bytes``:
    what storing it stored, which its uploader is charged (:mod:`cache_server.quota`; 0 when
    ``again``)."""

    record_id: int
    winner: int | None
    status: str
    again: bool = False
    stored_bytes: int = 0


class BucketFull(Exception):
    """A new key's record for a shape bucket that holds its limit of winners (a 409)."""


class Revoked(Exception):
    """The token a request came with was revoked while the request ran (a 401): a write reads
    its token again behind its key's lock (:func:`add_record`); a snapshot import, committed a
    chunk at a time, stores no chunk after (:func:`ensure_live`), nor a verifier's finding
    after it (:func:`cache_server.trust.finish`)."""


def ensure_live(session: Session, token_id: int, *, doing: str) -> None:
    """Raises :class:`Revoked` when token ``token_id`` was revoked since the request
    authenticated it (``doing``: what the error says stays as it is). A plain read: a share lock
    of the token's row would wait for a revocation that waits for a key this request holds."""
    revoked = session.scalar(select(TokenRow.revoked_at).where(TokenRow.id == token_id))
    if revoked is not None:
        raise Revoked(f"the token was revoked while this request ran: {doing}")


def add_record(
    session: Session, *, key_hash: str, record: RecordCreate, uploader: TokenRow | None = None,
    bucket_limit: int | None = None, row: RecordRow | None = None, room: Room | None = None,
) -> Added:  # fmt: skip
    """Stores ``record`` and its trials; makes it the key's winner if validated and fastest
    (and the verified policy's too when ``uploader`` is a trusted token). ``row``: the row to
    store, built already (an import's, whose status and provenance its snapshot states:
    :mod:`cache_server.snapshots`); else :func:`record_row`'s. ``room``: what the uploader
    may still store (:func:`cache_server.quota.room`), checked before anything is (its charge,
    the caller's, decides: ``stored_bytes``).

    Raises:
        BucketFull: ``record`` would be a new key's winner in a bucket with no room for
            ``uploader``'s at ``bucket_limit`` (:func:`cache_server.buckets.refusal`; nothing
            is stored).
        QuotaFull: ``record`` would not fit in ``room`` (nothing is stored; one sent again is
            answered all the same).
        Revoked: ``uploader`` is revoked, read behind the key's lock (nothing is stored): a
            write authenticated just before a revocation was stored after it, on the revoked
            token's word, and a withdrawal, which takes every key's lock first
            (:mod:`cache_server.withdrawal`), did not count it.
    """
    if row is None:
        row = record_row(key_hash=key_hash, record=record, uploader=uploader)
    twins.lock_key(session, key_hash)
    state = session.execute(_UPLOAD_STATE, {"upload": row.upload_digest, "key_hash": key_hash,
                                            "digest": row.config_digest,
                                            "token": None if uploader is None else uploader.id,
                                            }).one()  # fmt: skip
    if uploader is not None and state.revoked is not None:
        raise Revoked("the token was revoked while this request ran: nothing was stored")
    if state.held_id is not None:  # sent again: answered as it stands, not stored twice nor revived
        return Added(state.held_id, state.winner, state.held_status, again=True)
    if bucket_limit is not None and record.validation.passed and state.winner is None:
        _check_room(session, row.bucket_hash or "", bucket_limit, uploader)  # a new key's first
    twins.inherit_findings(row, state)
    if room is not None:
        room.ensure(record_bytes(row, record.trials))
    session.add(row)
    session.flush()
    _insert_trials(session, row.id, record)
    winner = state.winner
    if record.validation.passed and row.status in ("pending", "verified"):
        winner = offer_winner(session, WinnerRow, key_hash=key_hash, record_id=row.id,
                              time_ms=row.time_ms) or _winner(session, key_hash)  # fmt: skip
        if row.status == "verified":
            offer_winner(session, VerifiedWinnerRow, key_hash=key_hash, record_id=row.id,
                         time_ms=row.time_ms)  # fmt: skip
    return Added(row.id, winner, row.status, stored_bytes=record_bytes(row, record.trials))


def _of_upload(column: Any) -> Any:
    return select(column).where(RecordRow.upload_digest == bindparam("upload")).scalar_subquery()


# What an upload reads behind its key's lock, in one statement (each is a round trip to the
# database: the key lock's reads cost a fifth of PostgreSQL's upload rate until they were one
# with the others): this very upload if stored before, the key's winner, its twins' standing
_UPLOAD_STATE = select(
    _of_upload(RecordRow.id).label("held_id"),
    _of_upload(RecordRow.status).label("held_status"),
    select(WinnerRow.record_id).where(WinnerRow.key_hash == bindparam("key_hash"))
    .scalar_subquery().label("winner"),
    select(TokenRow.revoked_at).where(TokenRow.id == bindparam("token"))
    .scalar_subquery().label("revoked"),
    *twins.STANDING,
)  # fmt: skip


def _winner(session: Session, key_hash: str) -> int | None:
    return session.scalar(select(WinnerRow.record_id).where(WinnerRow.key_hash == key_hash))


def _check_room(session: Session, bucket_hash: str, limit: int, uploader: TokenRow | None) -> None:
    """Raises :class:`BucketFull` where ``uploader`` may add no new key to the bucket
    (:func:`cache_server.buckets.refusal`)."""
    found = session.execute(buckets.winners(uploader).where(RecordRow.bucket_hash == bucket_hash))
    _, held, own = found.one_or_none() or (bucket_hash, 0, 0)
    if (why := buckets.refusal(held, own, limit, uploader)) is not None:
        raise BucketFull(f"the key's shape bucket {why}: no new key there")


def record_fields(row: RecordRow) -> dict[str, Any]:
    """What a client sent for ``row`` (as in :class:`RecordCreate`), less its trials (kept in
    rows of their own)."""
    return {name: getattr(row, name) for name in RecordCreate.model_fields if name != "trials"}


def public_record(
    row: RecordRow, *, is_winner: bool, trials: Sequence[TrialRow] = (), listed: bool = False
) -> RecordPublic:
    """``row`` as the API shows it, with ``trials``; ``listed``: its validation's worst check
    only (:func:`worst_check`)."""
    fields = record_fields(row)
    if listed:
        fields["validation"] = worst_check(row.validation)
    return RecordPublic.model_validate(
        {
            "id": row.id,
            "key_hash": row.key_hash,
            "created_at": row.created_at,
            "is_winner": is_winner,
            "status": row.status,
            "uploaded_by": uploader_text(row),
            "verification": row.verification,
            "disputes": row.disputes,
            **fields,
            # as stored too: an error written before its text was checked stays readable
            "trials": [
                {"config": t.config, "status": t.status, "time_ms": t.time_ms, "error": t.error}
                for t in trials
            ],
        },
        context=STORED,
    )


def uploader_text(row: RecordRow) -> str | None:
    """Who ``row`` says uploaded it: its uploader's token, or for an imported record the uploader
    its snapshot named and the token that imported it (``alice, imported by ci-sync``: a token
    name holds no comma), so an importer never reads as the uploader of what it imported."""
    uploader = None if row.uploaded_by is None else name_text(row.uploaded_by)
    if row.imported_by is None:
        return uploader
    return f"{uploader or 'an unnamed uploader'}, imported by {name_text(row.imported_by)}"


def worst_check(validation: Any) -> Any:
    """A stored validation with one check left: the worst, the one ``max_rel_error`` names (one
    without an error counts as the largest, as there; a failed one first among equals). A
    listing's records carry it: an upload may hold 256 checks of 32 parameters and a note each
    (1.75 MB), and a page of a hundred took 10 to 15 s to read; a record read by id has all."""
    checks = validation.get("checks") if isinstance(validation, dict) else None
    if not isinstance(checks, list) or len(checks) < 2:
        return validation

    def badness(check: Any) -> tuple[bool, float, bool]:
        error = check.get("rel_error") if isinstance(check, dict) else None
        failed = isinstance(check, dict) and check.get("passed") is False
        return error is None, error if isinstance(error, int | float) else 0.0, failed

    return {**validation, "checks": [max(checks, key=badness)]}


def get_winner(
    session: Session, *, key_hash: str, table: WinnerTable = WinnerRow
) -> RecordPublic | None:
    """The winning record of ``key_hash`` in ``table`` (without its trials), or ``None``."""
    row = session.scalar(_WINNER_OF[table], {"key_hash": key_hash})
    return None if row is None else public_record(row, is_winner=True)


# Built once: a statement takes ~50 µs to build, a tenth of the lookups they serve.
_WINNER_OF = {
    table: select(RecordRow)
    .join(table, table.record_id == RecordRow.id)
    .where(table.key_hash == bindparam("key_hash"))
    for table in (WinnerRow, VerifiedWinnerRow)
}
BUCKET_SIZE = {
    table: select(func.count())
    .select_from(RecordRow)
    .join(table, table.record_id == RecordRow.id)
    .where(RecordRow.bucket_hash == bindparam("bucket_hash"))
    for table in (WinnerRow, VerifiedWinnerRow)
}
BUCKET_WINNERS = {
    table: select(RecordRow.id, RecordRow.key, RecordRow.config_digest)
    .join(table, table.record_id == RecordRow.id)
    .where(RecordRow.bucket_hash == bindparam("bucket_hash"))
    .order_by(RecordRow.id)
    for table in (WinnerRow, VerifiedWinnerRow)
}


def get_record(
    session: Session, *, record_id: int, with_trials: bool | int = True,
    table: WinnerTable = WinnerRow,
) -> RecordPublic | None:  # fmt: skip
    """One record by id, with its trials in the order they ran, or the first ``with_trials``
    of them (``is_winner``: in ``table``, the serving policy's winners)."""
    row = session.get(RecordRow, record_id)
    if row is None:
        return None
    trials: Sequence[TrialRow] = ()
    if with_trials is not False:
        stmt = select(TrialRow).where(TrialRow.record_id == record_id).order_by(TrialRow.position)
        if with_trials is not True:
            stmt = stmt.limit(with_trials)
        trials = session.scalars(stmt).all()
    winner = session.scalar(select(table.record_id).where(table.key_hash == row.key_hash))
    return public_record(row, is_winner=winner == row.id, trials=trials)


def trial_times(session: Session, *, record_id: int) -> list[float | None]:
    """The times of a record's trials in the order they ran (``None``: the trial failed)."""
    return list(session.scalars(select(TrialRow.time_ms).where(TrialRow.record_id == record_id)
                                .order_by(TrialRow.position)))  # fmt: skip


@dataclass(frozen=True)
class RecordFilters:
    """Filters of a record listing, each a :class:`RecordRow` column; ``None`` matches any value."""

    kernel: str | None = None
    backend: str | None = None
    dtype: str | None = None
    device_arch: str | None = None
    key_hash: str | None = None
    validated: bool | None = None
    status: str | None = None


def _filtered(stmt: S, filters: RecordFilters) -> S:
    for name, value in asdict(filters).items():
        if value is not None:
            stmt = stmt.where(getattr(RecordRow, name) == value)
    return stmt


# The stored JSON a record's listing loads (cache_server.budget).
RECORD_SIZE = stored_size(RecordRow.key, RecordRow.config, RecordRow.timing, RecordRow.baselines,
                          RecordRow.validation, RecordRow.search, RecordRow.provenance,
                          RecordRow.verification)  # fmt: skip

# Grouped by kernel, device, backend and dtype; fastest first within a group.
_BY_KEY = (RecordRow.kernel, RecordRow.device_arch, RecordRow.device_name, RecordRow.backend,
           RecordRow.dtype, RecordRow.time_ms, RecordRow.id)  # fmt: skip


def list_records(
    session: Session,
    *,
    filters: RecordFilters = RecordFilters(),
    winners_only: bool = False,
    limit: int = 100,
    offset: int = 0,
    by_key: bool = False,
    table: WinnerTable = WinnerRow,
    budget: int | None = None,
) -> tuple[list[RecordPublic], int]:
    """Records matching every given filter, and the total count matching.

    Newest first; with ``by_key``, grouped by kernel, device, backend and dtype, fastest first
    within a group (the dashboard's table). With ``budget``, the leading records of the page
    whose stored JSON fits in ``budget`` bytes together (:mod:`cache_server.budget`; at least
    one).
    """
    base = select(RecordRow, table.record_id).outerjoin(table, table.record_id == RecordRow.id)
    if winners_only:
        base = base.where(table.record_id.is_not(None))
    base = _filtered(base, filters)
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    order = _BY_KEY if by_key else (RecordRow.id.desc(),)
    page = base.order_by(*order).limit(limit).offset(offset)
    if budget is not None:
        keys = [(c, False) for c in _BY_KEY] if by_key else [(RecordRow.id, True)]
        kept = within(base, keys, RecordRow, RECORD_SIZE, budget, limit=limit, offset=offset)
        page = base.where(RecordRow.id.in_(select(kept.c.id))).order_by(*order)
    rows = session.execute(page).all()
    return [public_record(r[0], is_winner=r[1] is not None, listed=True) for r in rows], total


def count_records(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(RecordRow)) or 0
