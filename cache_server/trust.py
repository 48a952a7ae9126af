"""Trust query functions: consumers' disputes, verifiers' claims and findings, and the winners
that follow a record's status. Keyword-only; they never commit (the session's owner does).

A record is ``pending`` when uploaded (``verified`` at once from a trusted token). A consumer whose
check of it failed disputes it: it is then served under no policy. A verifier claims pending and
disputed records of its arch (the fairest uploader's first: :func:`_fairest`), re-checks them on
its own device (at the record's problem, its edge problem and every disputed problem) and
re-times them: ``verified`` (its time
now ranks the record: an uploader's fake time is replaced) or ``rejected`` (never served). Each
change hands the key's winner places on (:func:`recompute_winners`), under a row lock, so a
concurrent upload's atomic upsert still leaves the fastest servable record as the winner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, delete, func, or_, select, update
from sqlalchemy.orm import Session

from cache_server import twins
from cache_server.fairness import fewest_first
from cache_server.leases import token_live
from cache_server.models import (
    DisputeRow,
    RecordRow,
    TokenRow,
    VerifiedWinnerRow,
    WinnerRow,
    utcnow,
)
from cache_server.queries import WinnerTable, ensure_live, offer_winner
from tunecache.believed import APART_RATIO
from tunecache.canonical import canonical_json
from tunecache.policies import server_bucket, widest_bucket
from tunecache.schemas import VerificationPublic
from tunecache.verification import DisputeCreate, VerificationCreate

SERVED_STATUSES: dict[str, tuple[str, ...]] = {
    "validated": ("pending", "verified"),
    "verified": ("verified",),
}
# A verifier's timing more than this much slower than the uploader's flags the uploaded time.
TIMING_FLAG_RATIO = APART_RATIO  # the uploader's time is over 20 % below the verifier's
MAX_RATIO = 1e9  # a verifier / uploader time ratio beyond this is reported as this
MAX_VERIFY_ATTEMPTS = 3  # claims of one record (a verifier that cannot run it gives it back)
MAX_OPEN_DISPUTES = 32  # unresolved disputes kept per record (more are counted, not stored)
MAX_TASK_PROBLEMS = 16  # disputed problems one verification runs (tunecache.verification)
# A record a verifier could not run waits this long before another claim (another verifier of
# the arch may have the right versions; this one should not take it again at once).
UNVERIFIABLE_BACKOFF = timedelta(minutes=10)
_TIERS: tuple[tuple[WinnerTable, tuple[str, ...]], ...] = (
    (WinnerRow, SERVED_STATUSES["validated"]),
    (VerifiedWinnerRow, SERVED_STATUSES["verified"]),
)


def time_ratio(verifier_ms: float, uploaded: Any) -> float | None:
    """The verifier's median over the uploaded timing's (``TimingModel`` JSON, as uploaded:
    a re-verification compares with the same claim), at most :data:`MAX_RATIO`."""
    try:
        uploaded_ms = float(uploaded["median_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    if not math.isfinite(uploaded_ms) or uploaded_ms <= 0:
        return None
    ratio = verifier_ms / uploaded_ms
    return round(min(ratio, MAX_RATIO), 6) if math.isfinite(ratio) else MAX_RATIO


def winner_table(policy: str) -> WinnerTable:
    """The winners a serving policy serves: ``validated`` (the default) or ``verified``."""
    return VerifiedWinnerRow if policy == "verified" else WinnerRow


def recompute_winners(session: Session, *, key_hash: str) -> None:
    """Sets each policy's winner of ``key_hash`` to its fastest servable record (or none)."""
    for table, statuses in _TIERS:
        session.execute(
            select(table.key_hash).where(table.key_hash == key_hash).with_for_update()
        ).all()  # the held row is locked: a concurrent upload waits, then compares with ours
        best = session.execute(
            select(RecordRow.id, RecordRow.time_ms)
            .where(
                RecordRow.key_hash == key_hash,
                RecordRow.validated.is_(True),
                RecordRow.status.in_(statuses),
            )
            .order_by(RecordRow.time_ms, RecordRow.id)
            .limit(1)
        ).first()
        if best is None:
            session.execute(delete(table).where(table.key_hash == key_hash))
            continue
        session.execute(
            update(table)
            .where(table.key_hash == key_hash)
            .values(record_id=best.id, time_ms=best.time_ms, updated_at=utcnow())
        )
        offer_winner(session, table, key_hash=key_hash, record_id=best.id, time_ms=best.time_ms)


def served(session: Session, key_hash: str, policy: str) -> bool:
    """Whether ``policy`` serves a winner of ``key_hash``."""
    table = winner_table(policy)
    return session.scalar(select(table.key_hash).where(table.key_hash == key_hash)) is not None


class OutsideBucket(Exception):
    """A dispute of a problem the record does not serve (a 409: it conflicts with the record)."""


def add_dispute(
    session: Session, *, record_id: int, reporter: str, dispute: DisputeCreate
) -> RecordRow | None:
    """Records ``reporter``'s dispute of a record (once while it is open) and stops serving the
    record until a verifier re-verifies it; ``None`` if there is no such record. A rejected
    record stays rejected.

    Raises:
        OutsideBucket: the disputed problem is not one the record may serve (its own, or one of its
            shape bucket): no lookup could have handed it out there.
    """
    row = twins.lock(session, record_id)
    if row is None:
        return None
    # A built-in's bucket; another kernel's widest: the server does not know its bucket, and
    # served it to whatever bucket its caller said (tunecache.rules.bucket_digest).
    buckets = server_bucket(row.kernel)
    bucket = widest_bucket if buckets is None else buckets.bucket
    problem = dict(dispute.problem)
    if bucket(problem) != bucket(row.key["problem"]):
        raise OutsideBucket(
            f"record {record_id} serves {row.key['problem']} and its shape bucket, not {problem}"
        )
    open_ones = select(DisputeRow.id).where(DisputeRow.record_id == record_id,
                                            DisputeRow.resolved_at.is_(None))  # fmt: skip
    # One open dispute per reporter and record counts; a repeated one still reaches the twins.
    if session.scalar(open_ones.where(DisputeRow.reporter == reporter)) is None:
        if row.status == "disputed":  # claimable again (its verifiers' attempts ran out), the
            row.verify_attempts = 0  # open disputes at their cap too
        if len(session.scalars(open_ones).all()) < MAX_OPEN_DISPUTES:
            session.add(DisputeRow(
                record_id=record_id, reporter=reporter,
                problem=dict(dispute.problem), check=dispute.check.model_dump(mode="json"),
                device=None if dispute.device is None else dispute.device.model_dump(mode="json"),
                note=dispute.note, created_at=utcnow(),
            ))  # fmt: skip
        row.disputes += 1
    # The key's other records of the config too (copies, whoever uploaded them): served, they
    # would hand straight back the config the consumer's check refused (cache_server.twins).
    changed = row.status in ("pending", "verified")
    if changed:
        row.status, row.verify_attempts = "disputed", 0  # a new question, however often asked
    if twins.dispute(session, row, ("pending", "verified")) or changed:
        session.flush()
        recompute_winners(session, key_hash=row.key_hash)
    return row


def _claimable(now: Any) -> Any:
    free = or_(RecordRow.verify_expires_at.is_(None), RecordRow.verify_expires_at < now)
    return and_(RecordRow.validated.is_(True), RecordRow.status.in_(("pending", "disputed")),
                RecordRow.verify_attempts < MAX_VERIFY_ATTEMPTS, free)  # fmt: skip


def claim(
    session: Session, *, worker: str, token_id: int, device_arch: str, backends: Sequence[str],
    lease_seconds: float,
) -> RecordRow | None:  # fmt: skip
    """Leases the next record of ``device_arch`` and ``backends`` to re-check (the fairest
    uploader's, :func:`_fairest`; its disputed ones first, then its oldest) to ``worker`` under
    token ``token_id``, or ``None``. One statement,
    as a job claim is: two verifiers never hold one record, and a token revoked meanwhile leases
    none. A verifier holding a live lease on such a record (this worker, this token) is handed it
    again (a claim asked again after its answer was lost: no second record leased, no attempt
    spent), with the disputes open now, which its finding settles; its lease is not renewed, so
    a verifier whose findings are refused gets it back only until the lease runs out."""
    if not token_live(session, token_id):  # revoked, or being revoked: no lease
        return None
    now = utcnow()
    # Never a record on this token's own word (its upload or import): a verify token may upload,
    # and passed its own made-up record, which then stood as a verifier's finding.
    not_its_own = or_(RecordRow.vouched_by.is_(None), RecordRow.vouched_by != token_id)
    fits = (RecordRow.device_arch == device_arch, RecordRow.backend.in_(list(backends)),
            not_its_own)  # fmt: skip
    held = session.scalar(
        select(RecordRow)
        .where(RecordRow.verify_owner == worker, RecordRow.verify_token_id == token_id,
               RecordRow.verify_expires_at >= now, RecordRow.status.in_(("pending", "disputed")),
               *fits)
        .order_by(RecordRow.id).limit(1).with_for_update()
    )  # fmt: skip
    if held is not None:
        held.verify_claimed_at = now  # the task lists the disputes open now: it settles them
        session.flush()
        return held
    live = select(TokenRow.id).where(TokenRow.id == token_id, TokenRow.revoked_at.is_(None))
    # The fairest uploaders' records in turn (a concurrent claim may hold the first meanwhile),
    # then the first of all.
    for pick in (*_fairest(session, now, fits), _first(now, fits)):
        stmt = (
            update(RecordRow)
            .where(RecordRow.id == pick, _claimable(now), live.exists())
            .values(
                verify_owner=worker,
                verify_token_id=token_id,
                verify_expires_at=now + timedelta(seconds=lease_seconds),
                verify_attempts=RecordRow.verify_attempts + 1,
                verify_claimed_at=now,
            )
            .returning(RecordRow.id)
            .execution_options(synchronize_session=False)
        )
        if (record_id := session.execute(stmt).scalar()) is not None:
            return session.get(RecordRow, record_id, populate_existing=True)
    return None


def own_awaiting(session: Session, *, token_id: int, device_arch: str,
                 backends: Sequence[str]) -> int:  # fmt: skip
    """How many records of ``device_arch`` and ``backends`` a verifier would be handed but for
    being on token ``token_id``'s own word (:func:`claim` never hands them to it): told with a
    claim that found nothing, as one verify token held by a tuning daemon and its verifier
    left the daemon's uploads unverified for good, without a word."""
    now = utcnow()
    return int(session.scalar(
        select(func.count()).where(_claimable(now), RecordRow.vouched_by == token_id,
                                   RecordRow.device_arch == device_arch,
                                   RecordRow.backend.in_(list(backends)))
    ) or 0)  # fmt: skip


def _first(now: datetime, fits: Sequence[Any], *where: Any) -> Any:
    """The claimable record that ``fits`` (and ``where``) a claim takes first, disputed ones
    before the rest, the oldest first: a scalar subquery, its row locked."""
    return (
        select(RecordRow.id)
        .where(_claimable(now), *fits, *where)
        .order_by(case((RecordRow.status == "disputed", 0), else_=1), RecordRow.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )


FAIREST_TRIED = 8  # uploaders a claim tries in turn before the first record of all


def _fairest(session: Session, now: datetime, fits: Sequence[Any]) -> list[Any]:
    """The records a claim tries first (:func:`_first` form), one of each uploader with
    claimable records that ``fits``, the uploader with the fewest awaiting a verifier (leased
    ones too) first, the one whose record waited longest among equals, up to
    :data:`FAIREST_TRIED`. The uploader is the token that put the record here (its importer for
    a snapshot's); records of none are one uploader's. One write token's three records of a
    6000-cube matmul (five minutes and 2.4 GB of a verifier's each, then rejected) came before
    an honest record uploaded after them, and its own disputes put its records before every
    pending one: now a flood, or a token disputing its own records, waits behind every other
    uploader's. Chosen in two small aggregates before a row is locked
    (:mod:`cache_server.fairness`)."""
    who = func.coalesce(RecordRow.imported_by, RecordRow.uploaded_by, "")
    waiting = (select(who.label("name"), func.min(RecordRow.id).label("first"))
               .where(_claimable(now), *fits).group_by(who).subquery("waiting"))  # fmt: skip
    awaiting = (select(who.label("name"), func.count().label("n"))
                .where(RecordRow.validated.is_(True),
                       RecordRow.status.in_(("pending", "disputed")),
                       RecordRow.verify_attempts < MAX_VERIFY_ATTEMPTS, *fits)
                .group_by(who).subquery("awaiting"))  # fmt: skip
    uploaders = fewest_first(session, waiting, awaiting, FAIREST_TRIED)
    return [_first(now, fits, who == uploader) for uploader in uploaders]


def release_verifications(
    session: Session, *, token_id: int, record_id: int | None = None, worker: str | None = None
) -> int:
    """Gives back the live verification leases taken with token ``token_id`` (revoked; or, with
    ``record_id`` and ``worker``, that record's, its verifier stopped mid-way: Ctrl-C): each
    record is claimable at once, the attempt it spent refunded (as a revoked token's jobs are,
    :func:`cache_server.jobs.release_leases`). Otherwise each stop spent one of its attempts,
    and a record three stops met was never verified. Returns how many."""
    refunded = case((RecordRow.verify_attempts > 0, RecordRow.verify_attempts - 1), else_=0)
    one = [] if record_id is None else [RecordRow.id == record_id, RecordRow.verify_owner == worker]
    stmt = (
        update(RecordRow)
        .where(RecordRow.verify_token_id == token_id, RecordRow.verify_owner.is_not(None),
               RecordRow.verify_expires_at >= utcnow(), *one)
        .values(verify_owner=None, verify_token_id=None, verify_expires_at=None,
                verify_attempts=refunded)
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    return int(getattr(session.execute(stmt), "rowcount", 0) or 0)


def renew_verification(session: Session, *, record_id: int, worker: str, token_id: int,
                       lease_seconds: float) -> bool:  # fmt: skip
    """Extends the live verification lease ``worker`` holds on ``record_id`` under token
    ``token_id`` (live: read as a claim reads it), as a job's heartbeat does; whether it held
    one. A check longer than its lease (a record disputed at 64 problems, each compiled and
    validated anew) was claimed by another verifier meanwhile and its finding refused, an
    attempt spent each time: three, and it was never verified. A lapsed lease is not renewed
    (a revocation releases only live ones: a renewal crossing it held the record for a day, for
    a token that may store no finding), nor one taken before leases had tokens."""
    if not token_live(session, token_id):
        return False
    stmt = (
        update(RecordRow)
        .where(RecordRow.id == record_id, RecordRow.verify_owner == worker,
               RecordRow.verify_token_id == token_id, RecordRow.verify_expires_at >= utcnow(),
               RecordRow.status.in_(("pending", "disputed")))
        .values(verify_expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    return bool(getattr(session.execute(stmt), "rowcount", 0))


def disputed_problems(
    session: Session, *, record_id: int, at: datetime | None = None
) -> list[dict[str, Any]]:
    """The distinct problems of the disputes of a record and of its key's other records of its
    config (a copy is checked where the config failed) open now, or at ``at``: the oldest
    :data:`MAX_TASK_PROBLEMS`. A verifier runs each; the rest wait for the next verification
    (copies disputed 32 times each at distinct problems of the bucket made a task of thousands,
    hours of one verifier's time)."""
    row = session.get(RecordRow, record_id)
    if row is None:
        return []
    stmt = select(DisputeRow.problem).where(DisputeRow.record_id.in_(twins.mates(row)))
    if at is None:
        stmt = stmt.where(DisputeRow.resolved_at.is_(None))
    else:  # the ones open then, resolved since or not
        still = or_(DisputeRow.resolved_at.is_(None), DisputeRow.resolved_at > at)
        stmt = stmt.where(DisputeRow.created_at <= at, still)
    problems: dict[str, dict[str, Any]] = {}
    found = session.scalars(stmt.order_by(DisputeRow.id).execution_options(yield_per=500))
    try:
        for problem in found:
            problems.setdefault(canonical_json(problem), problem)
            if len(problems) == MAX_TASK_PROBLEMS:
                break
    finally:
        found.close()  # a cursor left behind its first rows
    return list(problems.values())


def _settle_disputes(session: Session, row: RecordRow, answered: Sequence[Any] | None) -> None:
    """Resolves the disputes of ``row`` and its twins the verifier that passed it ran: those
    created by its claim at a problem its finding answers (``answered``; an older verifier's
    says none: those its task listed, :func:`disputed_problems` at the claim). Any sent since,
    or at another problem, were not run: the record then stays disputed, for the next verifier."""
    claimed = row.verify_claimed_at or utcnow()
    if answered is None:
        answered = disputed_problems(session, record_id=row.id, at=claimed)
    ran = {canonical_json(dict(p)) for p in answered} | {canonical_json(row.key["problem"])}
    found = session.execute(
        select(DisputeRow.id, DisputeRow.problem)
        .where(DisputeRow.id.in_(twins.disputes_of(row).scalar_subquery()),
               DisputeRow.created_at <= claimed)
    ).all()  # fmt: skip
    ids = [i for i, problem in found if canonical_json(problem) in ran]
    for at in range(0, len(ids), twins.CHUNK):
        session.execute(
            update(DisputeRow).where(DisputeRow.id.in_(ids[at : at + twins.CHUNK]))
            .values(resolved_at=utcnow()).execution_options(synchronize_session=False)
        )  # fmt: skip


def finish(
    session: Session, *, record_id: int, worker: str, token_id: int, verifier: str,
    result: VerificationCreate,
) -> RecordRow | None:  # fmt: skip
    """Stores a verifier's finding on a record ``worker`` holds the lease of under token
    ``token_id``, or ``None`` when it does not (no such record, another verifier's — another
    worker's, or the same worker name under another token —, or already decided). A lease taken
    before leases had tokens (migration 0014) is its worker's under any verify token.

    Raises:
        Revoked: token ``token_id`` was revoked after the request authenticated it.
    """
    row = twins.lock(session, record_id)
    if (row is None or row.verify_owner != worker
            or row.verify_token_id not in (None, token_id)
            or row.status not in ("pending", "disputed")):  # fmt: skip
        return None
    # Read behind the key's lock, as an upload reads its token: a finding authenticated before
    # a withdrawal and stored after it, on a lease run out (which a revocation does not
    # release), was a revoked token's pass, verified and served.
    ensure_live(session, token_id, doing="no finding was stored")
    row.verify_owner, row.verify_expires_at, row.verify_token_id = None, None, None
    if result.outcome == "unverifiable":  # back in the queue, after a while, until its attempts
        row.verify_expires_at = utcnow() + UNVERIFIABLE_BACKOFF  # run out
        return row
    ratio = None if result.timing is None else time_ratio(result.timing.median_ms, row.timing)
    passed = result.outcome == "passed"
    row.verification = VerificationPublic(
        passed=passed, verifier=verifier, device_name=result.device_name, verified_at=utcnow(),
        timing=result.timing, validation=result.validation, error=result.error,
        time_ratio=ratio, timing_flag=ratio is not None and ratio > TIMING_FLAG_RATIO,
    ).model_dump(mode="json")  # fmt: skip
    row.checked_by = token_id  # its finding, withdrawn with the token (cache_server.withdrawal)
    if passed:  # served on this server's verifier's word now, not on its uploader's alone
        row.vouched_by = None
    if passed and result.timing is not None:
        row.time_ms = result.timing.median_ms  # the verifier's time ranks the record from now on
    if not passed:  # its disputes stay open: each twin, a question now, is checked there too
        row.status = "rejected"
        twins.dispute(session, row, ("pending", "verified", "disputed"))  # not a verdict
        session.flush()
        recompute_winners(session, key_hash=row.key_hash)
        return row
    _settle_disputes(session, row, result.disputed_problems)
    open_ones = DisputeRow.id.in_(twins.disputes_of(row).scalar_subquery())
    newer = session.scalar(select(DisputeRow.id).where(open_ones).limit(1)) is not None
    if newer:
        row.status, row.verify_attempts = "disputed", 0
    else:
        row.status = "verified"
        twins.settle(session, row)
    session.flush()
    recompute_winners(session, key_hash=row.key_hash)
    return row
