"""A key's validated records of one config ("twins"): a finding about one is a question for all.

A dispute or a verifier's rejection is a finding about a config at a key, not about one upload of
it. Before, a write token defeated every finding with copies: a copy of a disputed config,
uploaded beforehand with another time, served the moment the dispute took the first out; one
uploaded again after a rejection (one byte changed: not the same upload) was served anew. Now:

- a dispute of a record, or its rejection, makes its twins ``disputed``: out of service under every
  policy until a verifier checks each (a rejection is a verdict on one record only, so an uploader
  cannot have an honest record rejected by a copy of it; a copy costs a verification);
- a new upload is stored ``disputed`` while a twin is disputed, or rejected with none verified
  since (a rejection makes every verified twin disputed: a verified one passed since);
- a verifier that passes a record has run every twin's open dispute (its task listed them): those
  are settled, and the twins disputed with it get their standing back.

Twins share the key's hash and the config's canonical digest (``records.config_digest``: sorted
keys, types kept, so ``True`` is not ``1`` nor ``64.0`` ``64``, as the closed schemas and a space's
membership tell them apart), and passed their uploader's validation (an unvalidated record is never
served nor claimed by a verifier: a finding on one would stand for good). An upload, a dispute and a
verifier's finding each take their key's lock first (:func:`lock_key`), so none misses what another
wrote meanwhile: a copy uploaded in the instant a dispute lands is disputed with the others.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Select, and_, bindparam, exists, false, func, or_, select, text, update
from sqlalchemy.orm import Session

from cache_server.models import DisputeRow, RecordRow, TokenRow
from tunecache.configcheck import as_run

LOCK_CLASS = 0x74756E65  # "tune": the advisory locks' first key, apart from other users' locks
CHUNK = 1000  # ids a statement names at once (PostgreSQL takes at most 65,535 parameters)


def config_digest(backend: str, config: Any, *, kernel: str) -> str | None:
    """The digest twins share: of the config as it runs (:func:`tunecache.configcheck.as_run`,
    the SHA-256 of its canonical JSON, as :func:`tunecache.canonical.digest`); ``None`` for one
    that is not plain JSON data (no record's, since the schemas admit only that)."""
    shown = as_run(backend, config, kernel=kernel)
    return None if shown is None else hashlib.sha256(shown.encode("utf-8")).hexdigest()


def lock_key(session: Session, key_hash: str) -> None:
    """Holds the key's lock until the transaction ends: PostgreSQL, an advisory lock of the
    key's slot (:data:`LOCK_CLASS`, the hash's first byte: an import takes at most 256 locks
    however many keys it holds, where PostgreSQL sizes its shared lock table for 64 a connection
    by default; 20,000 distinct ones fitted in a test cluster's slack, which is no bound; sorted
    keys take their slots in order); SQLite, the database's write lock (one writer at a time),
    taken now rather than at the first write, so that what this transaction reads from here on
    is what it writes over.

    A write waits for its key's slot longer than the API's statement bound (5 s, a read's): a
    snapshot import holds its keys' slots until it commits, and an upload, a dispute or a job's
    result behind it got 503 past the bound and was sent again and again. Only that wait is
    longer (:func:`_wait_patiently`), the fast path (the slot free) one statement as before.
    An import commits its keys a chunk at a time (:func:`cache_server.snapshots.import_records`):
    one of 4,097 keys held every slot for 30 s, every other writer waiting behind it."""
    slot = int(key_hash[:2], 16)
    if session.get_bind().dialect.name != "postgresql":
        lock_slot(session, slot)
    elif not session.execute(_TRY_LOCK, {"slot": slot}).scalar():
        _wait_patiently(session, slot)


KEY_SLOTS = 256  # the keys' slots of LOCK_CLASS (a key hash's first byte)


def lock_every_key(session: Session) -> None:
    """Holds every key's slot until the transaction ends, taken in order (as an import takes its
    keys'), each waited for as :func:`lock_key` waits: every write of a record in flight ends
    first, and none starts until this transaction does (SQLite: its one write lock)."""
    if session.get_bind().dialect.name != "postgresql":
        lock_slot(session, 0)
        return
    for slot in range(KEY_SLOTS):
        if not session.execute(_TRY_LOCK, {"slot": slot}).scalar():
            _wait_patiently(session, slot)


def lock_slot(session: Session, slot: int) -> None:
    """Holds lock ``slot`` of :data:`LOCK_CLASS` until the transaction ends (PostgreSQL: 0-255
    are the keys', :func:`lock_key`; others are named where they are used), or on SQLite the
    database's write lock, which is every slot's."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_ADVISORY_LOCK, {"slot": slot})
    else:  # an update of no row still opens SQLite's write transaction
        session.connection().exec_driver_sql(_SQLITE_WRITE_LOCK)


# Built once (each upload takes a lock and reads its twins: built per call, through the ORM,
# they cost 2.5 ms of an upload's 10, this machine)
_ADVISORY_LOCK = select(func.pg_advisory_xact_lock(LOCK_CLASS, bindparam("slot")))
_SQLITE_WRITE_LOCK = "UPDATE records SET status = status WHERE id = -1"
_TRY_LOCK = select(func.pg_try_advisory_xact_lock(LOCK_CLASS, bindparam("slot")))
# What a write waits for its key's slot at most: under the client's write deadline (60 s), so
# that a wait that ends is answered before the client gives up (and sends the write again).
WRITE_WAIT_MS = 45_000
_BOUNDS = ("lock_timeout", "statement_timeout")
_SET = text("SELECT set_config('lock_timeout', :lock, true), "
            "set_config('statement_timeout', :statement, true)")  # fmt: skip
_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _wait_patiently(session: Session, slot: int) -> None:
    """Waits for ``slot`` up to :data:`WRITE_WAIT_MS` (or the bounds set, if longer; none where
    none is set), then puts this transaction's bounds back as they were."""
    were = [str(session.execute(text(f"SHOW {name}")).scalar()) for name in _BOUNDS]
    longer = [value if _ms(value) in (0, None) or (_ms(value) or 0) >= WRITE_WAIT_MS
              else f"{WRITE_WAIT_MS}ms" for value in were]  # fmt: skip
    session.execute(_SET, {"lock": longer[0], "statement": longer[1]})
    session.execute(_ADVISORY_LOCK, {"slot": slot})
    session.execute(_SET, {"lock": were[0], "statement": were[1]})


def _ms(shown: str) -> int | None:
    """A timeout as PostgreSQL shows it (``0``, ``500ms``, ``5s``, ``2min``) in milliseconds;
    ``None`` for a form not known here (left as it is)."""
    found = re.fullmatch(r"(\d+)\s*(ms|s|min|h|d)?", shown.strip())
    if found is None:
        return None
    return int(found[1]) * _UNITS_MS[found[2] or "ms"]


def _twin_standing(status: str) -> Any:
    return (
        exists().where(RecordRow.key_hash == bindparam("key_hash"),
                       RecordRow.config_digest == bindparam("digest"),
                       RecordRow.validated.is_(True), RecordRow.status == status)
        .label(f"twin_{status}")
    )  # fmt: skip


# Whether a validated twin of a config (parameters ``key_hash`` and ``digest``) stands in each
# status: columns of an upload's one read behind its key's lock (cache_server.queries.add_record)
STANDING = tuple(_twin_standing(status) for status in ("disputed", "rejected", "verified"))


def _of(row: RecordRow) -> Any:
    """The condition a twin of ``row`` meets (none for a record without a digest, or one its
    uploader's validation failed: its findings are not the config's)."""
    if row.config_digest is None or not row.validated:
        return false()
    return and_(RecordRow.key_hash == row.key_hash, RecordRow.config_digest == row.config_digest,
                RecordRow.validated.is_(True))  # fmt: skip


def lock(session: Session, record_id: int) -> RecordRow | None:
    """The record ``record_id`` read afresh and locked, behind its key's lock (``None``: none)."""
    row = session.get(RecordRow, record_id)
    if row is None:
        return None
    lock_key(session, row.key_hash)
    return session.get(RecordRow, record_id, with_for_update=True, populate_existing=True)


def mates(row: RecordRow) -> Any:
    """The ids of ``row`` and of its twins (whatever their status), as a subquery."""
    return select(RecordRow.id).where(or_(RecordRow.id == row.id, _of(row))).scalar_subquery()


def disputes_of(row: RecordRow) -> Select[Any]:
    """The ids of the open disputes of ``row`` and of its twins (whatever their status)."""
    return select(DisputeRow.id).where(DisputeRow.record_id.in_(mates(row)),
                                       DisputeRow.resolved_at.is_(None))  # fmt: skip


def inherit_findings(row: RecordRow, standing: Any) -> None:
    """A new upload (``row``, not yet stored, behind its key's lock) stands ``disputed`` while a
    twin is disputed, or rejected with none verified since; a trusted token's too (a consumer's
    failed check and a verifier's verdict outrank an uploader's word). ``standing``: a row with
    the columns of :data:`STANDING`, read for ``row``'s key and config behind the lock."""
    if row.config_digest is None or not row.validated:
        return  # no twin: its findings are not the config's (_of)
    if standing.twin_disputed or (standing.twin_rejected and not standing.twin_verified):
        row.status, row.verification = "disputed", None


# A finding about a config at a key: a validated twin that stands disputed, rejected or verified
_FINDING = (RecordRow.validated.is_(True), RecordRow.config_digest.is_not(None),
            RecordRow.status.in_(("disputed", "rejected", "verified")))  # fmt: skip
_FINDINGS = (
    select(RecordRow.config_digest, RecordRow.status)
    .where(RecordRow.key_hash == bindparam("key_hash"), *_FINDING)
    .distinct()
)


def refused_at(session: Session, key_hash: str) -> set[str]:
    """The digests of the configs that stand refused at a key: a twin disputed, or rejected with
    none verified since (what a new upload of one inherits: :func:`inherit_findings`). A lookup
    of the key serves none of them by another rule either (another device's copy of the same
    arch, a bucket mate): a config disputed at a key was served again there from a copy
    uploaded under another device's name."""
    found: dict[str, set[str]] = {}
    for digest, status in session.execute(_FINDINGS, {"key_hash": key_hash}):
        found.setdefault(status, set()).add(str(digest))  # never None: the query's
    return _refused(found)


def refused_among(session: Session, key_hashes: Collection[str]) -> dict[str, set[str]]:
    """:func:`refused_at` of each of ``key_hashes`` (those with none left out), read
    :data:`CHUNK` keys a statement: a snapshot import's check before it takes any key's lock
    (:mod:`cache_server.snapshots`)."""
    keys = sorted(key_hashes)
    found: dict[str, dict[str, set[str]]] = {}
    for at in range(0, len(keys), CHUNK):
        stmt = select(RecordRow.key_hash, RecordRow.config_digest, RecordRow.status).where(
            RecordRow.key_hash.in_(keys[at : at + CHUNK]), *_FINDING
        )
        for key_hash, digest, status in session.execute(stmt.distinct()):
            found.setdefault(key_hash, {}).setdefault(status, set()).add(str(digest))
    return {key_hash: _refused(statuses) for key_hash, statuses in found.items()}


def _refused(found: dict[str, set[str]]) -> set[str]:
    """The refused digests among a key's findings (digests by status): :func:`refused_at`."""
    disputed, rejected = found.get("disputed", set()), found.get("rejected", set())
    return disputed | (rejected - found.get("verified", set()))


def dispute(session: Session, row: RecordRow, statuses: Sequence[str]) -> bool:
    """Makes ``row``'s twins standing in ``statuses`` disputed: a new question for the verifiers,
    however often it was asked (their attempts start again). One statement, however many copies
    a key holds; whether any changed."""
    changed = session.execute(
        update(RecordRow)
        .where(_of(row), RecordRow.id != row.id, RecordRow.status.in_(list(statuses)))
        .values(status="disputed", verify_attempts=0)
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    return bool(changed.rowcount)  # type: ignore[attr-defined]


def settle(session: Session, row: RecordRow) -> None:
    """Gives ``row``'s disputed twins their standing back, ``row`` just passed by a verifier that
    ran every open dispute of their config: verified if a verifier (or a trusted uploader's
    token) passed them before, else pending; their standing is that verifier's finding now
    (``checked_by``, ``row``'s). Not a twin on the word of a token whose records were withdrawn
    (:mod:`cache_server.withdrawal`: its uploader's, or the verifier's whose pass set its time):
    its time is that token's claim, which this verifier did not check (a made-up time over an
    honest copy ranked the config first again); a verifier checks it itself. A token revoked
    without withdrawing (rotated, a teammate leaving) keeps its twins' standing, as it keeps
    its records': each would cost a verification of its own."""
    revoked = select(TokenRow.id).where(
        TokenRow.id.in_((RecordRow.vouched_by, RecordRow.checked_by)),
        TokenRow.withdrawn_at.is_not(None),
    )  # fmt: skip
    found = session.execute(
        select(RecordRow.id, RecordRow.verification)
        .where(_of(row), RecordRow.id != row.id, RecordRow.status == "disputed",
               ~revoked.exists())
    ).all()  # fmt: skip
    passed_before = {i for i, seen in found if (seen or {}).get("passed") is True}
    for status in ("verified", "pending"):
        ids = [i for i, _ in found if (i in passed_before) == (status == "verified")]
        for at in range(0, len(ids), CHUNK):
            session.execute(
                update(RecordRow).where(RecordRow.id.in_(ids[at : at + CHUNK]))
                .values(status=status, checked_by=row.checked_by)
                .execution_options(synchronize_session=False)
            )  # fmt: skip
