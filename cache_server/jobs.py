"""Job-queue query functions. Keyword-only; they never commit (the session's owner does).

A claim is one statement — ``UPDATE jobs … WHERE id = (SELECT id … LIMIT 1 FOR UPDATE SKIP
LOCKED) RETURNING id`` — so concurrent claimers never get the same job: PostgreSQL skips rows
another transaction holds; SQLite runs the statement under its single write lock (``FOR UPDATE``
is not rendered there). A running job whose lease has expired is claimable again.

A lease is held by the worker that claimed it *and* the token it claimed with: a worker's name is
public (the job list shows it), so renewing, completing or failing a lease needs both, except with
an admin token (``holder=None``), which may end any lease.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, literal, or_, select, update
from sqlalchemy.orm import Session, aliased

from cache_server.db import upsert_insert
from cache_server.fairness import fewest_first
from cache_server.leases import token_live
from cache_server.models import JobRow, RecordRow, TokenRow, utcnow
from cache_server.settings import VERSION_WAIT_SECONDS
from tunecache.canonical import canonical_json
from tunecache.jobs import CANCELLED, MISS_SOURCE, OPEN_STATES
from tunecache.key import Key, kernel_module


def enqueue(
    session: Session,
    key: Key,
    *,
    priority: int = 0,
    max_attempts: int = 3,
    source: str = "api",
    strategy: str | None = None,
    trials: int | None = None,
    requested_by: str | None = None,
) -> tuple[JobRow, bool]:
    """Queues a job for ``key`` unless one exists; returns it and whether it is new.

    ``requested_by``: the caller whose miss asks for it (see
    :func:`cache_server.job_counts.count_created`).
    """
    now = utcnow()
    key_hash, as_json = key.digest(), key.to_json()
    stmt = upsert_insert(session, JobRow).values(
        key_hash=key_hash, key=as_json, state="queued", priority=priority, source=source,
        attempts=0, max_attempts=max_attempts, error="", created_at=now, updated_at=now,
        backend=key.backend, device_arch=key.device.arch, strategy=strategy, trials=trials,
        kernel_module=kernel_module(key.kernel), requested_by=requested_by, kernel=key.kernel,
        source_hash=key.source_hash,
    )  # fmt: skip
    new_id = session.execute(
        stmt.on_conflict_do_nothing(index_elements=["key_hash"]).returning(JobRow.id)
    ).scalar()
    job = find(session, key_hash=key_hash)
    assert job is not None
    return job, new_id is not None


SERVER = ""  # a job's ``error_by`` when the server wrote its error (NULL: not recorded)
NO_LEASE: dict[str, None] = {"lease_owner": None, "lease_token_id": None,
                             "lease_token_name": None, "lease_expires_at": None}  # fmt: skip


def _set(session: Session, where: Sequence[Any], **values: Any) -> int:
    """``UPDATE jobs SET values WHERE where`` in one statement; how many rows it changed."""
    stmt = update(JobRow).where(*where).values(updated_at=utcnow(), **values)
    changed = session.execute(stmt.execution_options(synchronize_session=False))
    return int(changed.rowcount or 0)  # type: ignore[attr-defined]


def requeue_failed(session: Session, *, key_hash: str, max_attempts: int, priority: int,
                   strategy: str | None, trials: int | None, requester: str,
                   caps: tuple[int, int] | None = None) -> int:  # fmt: skip
    """Queues again, with fresh attempts, the job of ``key_hash`` if it failed (ran out of its
    attempts; its last error kept, until an attempt ends): a caller asking for the key again
    (``tunecache pretune``, ``POST /v1/jobs``) after what failed was mended, or after a token
    spent its attempts on leases it let expire, is not answered with the old failure for ever.

    The job re-opened is ``requester``'s (a caller's ``requested_by`` name), counted among its
    open jobs, whose cap the caller checked (it counted as its first requester's, past that
    one's cap). With ``caps`` (a non-admin's call), it takes this call's attempts, priority and
    budget only if that caller asked for it: another's job is queued again with its own (a write
    token re-queued anyone's failed job with 100 attempts and its own priority and budget), its
    priority and attempts no more than ``caps`` (a flood's job queued before the bounds came
    back at priority 1000 with 100 attempts; an admin's cancelled job, asked for again by a
    write token, at the admin's 500). Without (an admin's call), this call's, whoever queued it
    (an admin asking again for a write token's job left it that token's, uncapped). Returns how
    many it queued (0 or 1)."""
    asked: dict[str, Any] = {"max_attempts": max_attempts, "priority": priority,
                             "strategy": strategy, "trials": trials}  # fmt: skip
    if caps is not None:
        own = JobRow.requested_by == requester
        kept: dict[str, Any] = {name: getattr(JobRow, name) for name in asked}
        for name, cap in zip(("priority", "max_attempts"), caps, strict=True):
            kept[name] = case((kept[name] > cap, cap), else_=kept[name])
        asked = {name: case((own, value), else_=kept[name]) for name, value in asked.items()}
    return _set(session, [JobRow.key_hash == key_hash, JobRow.state == "failed"], state="queued",
                attempts=0, requested_by=requester, **asked, **NO_LEASE)  # fmt: skip


# A lease given back before its attempt ended: queued again, claimable at once, the attempt its
# claim spent refunded (the job's error, of an earlier attempt, kept).
_GIVEN_BACK: dict[str, Any] = {
    "state": "queued",
    "attempts": case((JobRow.attempts > 0, JobRow.attempts - 1), else_=0),
    **NO_LEASE,
}


def release_leases(session: Session, *, token_id: int) -> int:
    """Gives back the leases of the running jobs claimed with token ``token_id`` (revoked): each
    is queued again, claimable at once, the attempt it spent refunded. Otherwise a revoked
    token's leases held its jobs until they ran out (a day at most), or an admin failed each.
    Returns how many."""
    held = [JobRow.state == "running", JobRow.lease_token_id == token_id]
    return _set(session, held, **_GIVEN_BACK)


def find(session: Session, *, key_hash: str) -> JobRow | None:
    """The job of ``key_hash``, as stored now (one loaded before is refreshed: the updates
    here bypass the session's copies)."""
    stmt = select(JobRow).where(JobRow.key_hash == key_hash)
    return session.scalar(stmt.execution_options(populate_existing=True))


def _claimable(now: datetime) -> ColumnElement[bool]:
    expired = and_(
        JobRow.state == "running",
        JobRow.lease_expires_at < now,
        JobRow.attempts < JobRow.max_attempts,
    )
    # A queued job's lease_expires_at, when set, is when a failed attempt may be retried.
    due = or_(JobRow.lease_expires_at.is_(None), JobRow.lease_expires_at <= now)
    return or_(and_(JobRow.state == "queued", due), expired)


def _expire_last_attempts(session: Session, now: datetime) -> None:
    """Fails each running job whose lease ran out on its last attempt: no worker may claim it
    again, and it stayed ``running`` for good (its worker killed on that attempt), a pretune
    following it waiting for ever."""
    why = "its worker stopped renewing the lease of its last attempt (killed, or cut off); "
    # Whose lease it was: a token failing jobs by leases it lets lapse is named (it failed all 65
    # jobs of a queue in 3 s, the server named as the author), for an admin to revoke.
    whose = literal(why + "the lease was token ") + func.coalesce(JobRow.lease_token_name, "?")
    stmt = update(JobRow).where(
        JobRow.state == "running",
        JobRow.lease_expires_at < now,
        JobRow.attempts >= JobRow.max_attempts,
    )
    stmt = stmt.values(state="failed", updated_at=now, error=whose, error_by=SERVER, **NO_LEASE)
    session.execute(stmt.execution_options(synchronize_session=False))


def claim(
    session: Session,
    *,
    worker: str,
    token_id: int,
    token_name: str,
    lease_seconds: float,
    device_arch: str | None = None,
    backends: Sequence[str] | None = None,
    kernel_packages: Sequence[str] | None = None,
    key_hashes: Sequence[str] | None = None,
    sources: Sequence[tuple[str, str, str]] = (),
    version_wait: float = VERSION_WAIT_SECONDS,
) -> JobRow | None:
    """Leases the most urgent claimable job to ``worker`` under token ``token_id``, or ``None``
    when there is none.

    With ``device_arch``, ``backends`` and ``kernel_packages``, only a job for that arch, one of
    those backends and a built-in kernel or one from those packages (or their subpackages): a
    worker is never handed a job it cannot run. With ``key_hashes``, only a job for one of those
    keys (``pretune --local`` tunes its manifest's keys, not whatever else anyone queued).
    With ``sources`` (``(kernel, backend, source_hash)``: the versions of kernels the worker
    runs), no job of another version of one (:func:`_of_versions`) that waited less than
    ``version_wait`` seconds since it was last written (queued, claimed, renewed or failed).

    A worker that claims while it holds a live lease (under this token, on a job this claim
    could be given) is handed that job again: a claim asked again because its answer was lost
    leases no second job, and spends none of the job's attempts. The lease is not renewed (a
    heartbeat renews it): a worker that keeps claiming without finishing its job gets it back
    only until the lease runs out, and then as any worker, an attempt spent.
    """
    if not token_live(session, token_id):  # revoked, or being revoked: no lease
        return None
    now = utcnow()
    _expire_last_attempts(session, now)
    fits = _runnable(device_arch, backends, kernel_packages)
    if sources:
        fits.append(_of_versions(sources, now - timedelta(seconds=version_wait)))
    if key_hashes is not None:
        fits.append(JobRow.key_hash.in_(list(key_hashes)))
    if (held := _held_by(session, worker, token_id, now, fits)) is not None:
        return held
    live = select(TokenRow.id).where(TokenRow.id == token_id, TokenRow.revoked_at.is_(None))
    lease = {"state": "running", "lease_owner": worker, "lease_token_id": token_id,
             "lease_token_name": token_name, "attempts": JobRow.attempts + 1,
             "lease_expires_at": now + timedelta(seconds=lease_seconds),
             "updated_at": now}  # fmt: skip
    # The fairest requesters' jobs in turn (another claim may hold or take the first one's
    # meanwhile: concurrent claimers all reach for it), then the oldest.
    for pick in (*_fairest(session, now, fits), _oldest(now, fits)):
        stmt = (
            update(JobRow)
            .where(JobRow.id == pick, _claimable(now), live.exists())  # not revoked meanwhile
            .values(**lease)
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
        if (job_id := session.execute(stmt).scalar()) is not None:
            return session.get(JobRow, job_id, populate_existing=True)
    return None


def _oldest(now: datetime, fits: Sequence[ColumnElement[bool]], *where: Any) -> Any:
    """The id of the most urgent claimable job that ``fits`` (and ``where``), the oldest of its
    priority, as a scalar subquery whose row is locked (``SKIP LOCKED``: concurrent claimers
    skip each other's pick; not rendered on SQLite, whose write lock the claim holds)."""
    return (
        select(JobRow.id)
        .where(_claimable(now), *fits, *where)
        .order_by(JobRow.priority.desc(), JobRow.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )


def _fairest(session: Session, now: datetime, fits: Sequence[ColumnElement[bool]]) -> list[Any]:
    """The jobs a claim tries first (:func:`_oldest` form), fairest first, up to
    :data:`FAIREST_TRIED` (none when no job is claimable): of the most urgent claimable jobs
    that ``fits``, one of each requester (``requested_by``: the token
    that queued it, the caller whose miss asked for it) with the fewest open (queued or
    running) jobs, the oldest first among equals. One requester's flood at a priority (500 jobs
    in 2 s, each an hour's tune) held every daemon for as long as it lasted; now it waits
    behind everyone else's jobs there, whether daemons take jobs one at a time or many at once.
    Jobs of no recorded requester are one requester.

    Chosen in two small aggregates (the requesters waiting at the top priority, and each one's
    open jobs) before the claim locks a row (:mod:`cache_server.fairness`)."""
    claimable = [_claimable(now), *fits]
    top = session.scalar(select(func.max(JobRow.priority)).where(*claimable))
    if top is None:
        return []
    who = func.coalesce(JobRow.requested_by, "")
    waiting = (select(who.label("name"), func.min(JobRow.id).label("first"))
               .where(*claimable, JobRow.priority == top).group_by(who)
               .subquery("waiting"))  # fmt: skip
    other = aliased(JobRow)
    theirs = func.coalesce(other.requested_by, "")
    open_by = (select(theirs.label("name"), func.count().label("n"))
               .where(other.state.in_(OPEN_STATES)).group_by(theirs)
               .subquery("open_by"))  # fmt: skip
    requesters = fewest_first(session, waiting, open_by, FAIREST_TRIED)
    return [_oldest(now, fits, JobRow.priority == top,
                    JobRow.requested_by.is_(None) if r == "" else JobRow.requested_by == r)
            for r in requesters]  # fmt: skip


FAIREST_TRIED = 8  # requesters a claim tries in turn before the oldest job


def _runnable(device_arch: str | None, backends: Sequence[str] | None,
              kernel_packages: Sequence[str] | None) -> list[ColumnElement[bool]]:  # fmt: skip
    """The conditions of a job a worker with these (``None``: any) can run."""
    fits: list[ColumnElement[bool]] = []
    if device_arch is not None:
        fits.append(JobRow.device_arch == device_arch)
    if backends is not None:
        fits.append(JobRow.backend.in_(list(backends)))
    if kernel_packages is not None:
        # A prefix compared as a substring: LIKE ignores case on SQLite and knows wildcards.
        fits.append(or_(JobRow.kernel_module.is_(None),
                        JobRow.kernel_module.in_(list(kernel_packages)),
                        *(func.substr(JobRow.kernel_module, 1, len(p) + 1) == f"{p}."
                          for p in kernel_packages)))  # fmt: skip
    return fits


def _of_versions(sources: Sequence[tuple[str, str, str]], since: datetime) -> ColumnElement[bool]:
    """A job of a kernel and backend not in ``sources``, or of a version listed there, or left
    waiting since before ``since``. A worker of another version would fail it, an attempt spent
    (a fleet half upgraded failed the new version's jobs); one that waited so long is an old
    version's, no worker of which is left: a worker of another version fails it, ending it.

    Compared as one string each ("/" is in no kernel name, backend or hash): a list of row
    values made a claim of 1,024 made-up kernels take 2.8 s over 40,000 jobs on SQLite, and of
    1,024 versions of one kernel 4.7 s on PostgreSQL; one column's list is a hashed lookup on
    both."""
    named = JobRow.kernel + "/" + JobRow.backend
    pairs = sorted({f"{k}/{b}" for k, b, _ in sources})
    versions = sorted({"/".join(s) for s in sources})
    listed = named + "/" + JobRow.source_hash
    waited = JobRow.updated_at < since
    return or_(JobRow.kernel.is_(None), named.not_in(pairs), listed.in_(versions), waited)


def _held_by(session: Session, worker: str, token_id: int, now: datetime,
             fits: Sequence[ColumnElement[bool]]) -> JobRow | None:  # fmt: skip
    """The job ``worker`` holds a live lease on under ``token_id`` that ``fits``, if any."""
    return session.scalar(
        select(JobRow)
        .where(JobRow.state == "running", JobRow.lease_owner == worker,
               JobRow.lease_token_id == token_id, JobRow.lease_expires_at >= now, *fits)
        .order_by(JobRow.id)
        .limit(1)
        .with_for_update()
    )  # fmt: skip


def _owned(job_id: int, worker: str, holder: int | None) -> ColumnElement[bool]:
    """The job's lease is ``worker``'s, taken with token ``holder`` (``None``: any token's)."""
    held = and_(JobRow.id == job_id, JobRow.state == "running", JobRow.lease_owner == worker)
    return held if holder is None else and_(held, JobRow.lease_token_id == holder)


def held(session: Session, *, job_id: int, worker: str, holder: int | None) -> JobRow | None:
    """Job ``job_id`` if ``worker`` holds its lease, taken with token ``holder`` (``None``: any
    token's), else ``None``."""
    return session.scalar(select(JobRow).where(_owned(job_id, worker, holder)))


def _change(
    session: Session, job_id: int, worker: str, holder: int | None, **values: Any
) -> JobRow | None:
    stmt = (
        update(JobRow)
        .where(_owned(job_id, worker, holder))
        .values(updated_at=utcnow(), **values)
        .returning(JobRow.id)
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).scalar() is None:
        return None
    return session.get(JobRow, job_id, populate_existing=True)


def heartbeat(
    session: Session, *, job_id: int, worker: str, holder: int | None, lease_seconds: float
) -> JobRow | None:
    """Extends ``worker``'s lease, taken with token ``holder`` (``None``: an admin's call, any
    token's lease); ``None`` if it no longer holds the job."""
    expires = utcnow() + timedelta(seconds=lease_seconds)
    return _change(session, job_id, worker, holder, lease_expires_at=expires)


def release(session: Session, *, job_id: int, worker: str, holder: int | None) -> JobRow | None:
    """Gives back the lease ``worker`` holds, taken with token ``holder`` (``None``: an admin's
    call, any token's), its attempt unfinished (the worker stopped: Ctrl-C, a restart): queued
    again, claimable at once, the attempt refunded. Otherwise the job waited out its lease, and
    on its last attempt failed, a stopped worker blamed. ``None`` if it no longer holds the job."""
    return _change(session, job_id, worker, holder, **_GIVEN_BACK)


def cancel(session: Session, *, job_id: int, requester: str | None, by: str) -> JobRow | None:
    """Ends job ``job_id``, if open (queued or running), as ``failed``, its error "cancelled by
    ``by``" (a token's name), its lease dropped, its attempts as they were: no worker claims it
    again, and one running it loses its lease (its renewal and completion are refused). Asking
    for its key again queues it again (:func:`requeue_failed`). ``requester``: the caller it
    must have been queued by (``None``: an admin's call, any job). ``None`` if no such open job
    was changed."""
    where = [JobRow.id == job_id, JobRow.state.in_(OPEN_STATES)]
    if requester is not None:
        where.append(JobRow.requested_by == requester)
    if not _set(session, where, state="failed", error=CANCELLED + by, error_by=SERVER, **NO_LEASE):
        return None
    return session.get(JobRow, job_id, populate_existing=True)


def complete(
    session: Session, *, job_id: int, worker: str, holder: int | None, record_id: int
) -> JobRow | None:
    """Marks the job done; ``None`` if ``worker`` (with token ``holder``) no longer holds it."""
    return _change(session, job_id, worker, holder, state="done", record_id=record_id, error="",
                   error_by=None, **NO_LEASE)  # fmt: skip


def answered(session: Session, *, key_hash: str, record_id: int) -> int:
    """Marks the queued (or failed) miss of ``key_hash`` done with ``record_id``, the key's new
    served winner uploaded outside the queue (a drop-in's tune, a user's): the miss is answered.
    A running job is its worker's; a job queued with a budget or strategy of its own (a re-tune
    asked for) stays. Returns how many it marked."""
    miss = [JobRow.key_hash == key_hash, JobRow.state.in_(("queued", "failed")),
            JobRow.source == MISS_SOURCE, JobRow.strategy.is_(None),
            JobRow.trials.is_(None)]  # fmt: skip
    return _set(session, miss, state="done", record_id=record_id, lease_expires_at=None, error="",
                error_by=None)  # fmt: skip


def reopen(session: Session, *, key_hash: str, error: str) -> int:
    """Opens again each done job whose answer was a record of ``key_hash``, a key now served
    by none (a verifier rejected its last servable record): queued (claimable at once) while it
    has attempts left, else ``failed``, with ``error``. Whichever of the key's records answered
    it (an earlier one, since beaten by the one rejected now), and whatever the job's own key (a
    worker keys its record with its own device and versions). Otherwise a key answered by a bad
    upload, or by a worker whose record a verifier refused, was never tuned again: its misses
    found the job done. Returns how many it opened."""
    out = JobRow.attempts >= JobRow.max_attempts
    of_key = select(RecordRow.id).where(RecordRow.key_hash == key_hash)
    return _set(session, [JobRow.state == "done", JobRow.record_id.in_(of_key)],
                state=case((out, "failed"), else_="queued"), record_id=None, error=error,
                error_by=SERVER, **NO_LEASE)  # fmt: skip


def _asked(key: Mapping[str, Any]) -> dict[str, Any]:
    """What a job asks of the record that completes it: what a worker keeps of the job's key
    when it keys its run with its own device and environment (``tuner.daemon.Daemon.local_key``),
    and the arch its claim matched."""
    asked = {name: key[name] for name in ("kernel", "source_hash", "backend", "dtype", "problem")}
    return {**asked, "device.arch": key["device"]["arch"]}


def mismatch(job_key: Mapping[str, Any], record_key: Mapping[str, Any]) -> str | None:
    """Why a record of ``record_key`` cannot complete a job for ``job_key`` (it answers another
    kernel, kernel source, backend, dtype, problem or arch), or ``None``. Its device's name and
    size and its versions are the worker's own.

    The source too: every lookup rule serves only records of the asking kernel's source, so a
    worker whose kernel (or tunecache, for a built-in) hashed otherwise closed the job with a
    record none of the processes that asked is served, and their misses found the job done."""
    wanted, got = _asked(job_key), _asked(record_key)
    for name, value in wanted.items():
        if canonical_json(value) != canonical_json(got[name]):
            return f"its {name} is {canonical_json(got[name])}, the job's {canonical_json(value)}"
    return None


MAX_RETRY_SECONDS = 3600.0


def fail(session: Session, *, job_id: int, worker: str, holder: int | None, error: str,
         reporter: str, retry_seconds: float = 0.0) -> JobRow | None:  # fmt: skip
    """Records a failed attempt, ``error`` as token ``reporter`` wrote it: back to the queue,
    claimable again after ``retry_seconds`` doubled for each attempt after the first (at most
    :data:`MAX_RETRY_SECONDS`), or ``failed`` once out of attempts. (A queued job's
    ``lease_expires_at`` is that time.) ``None`` if ``worker`` (with token ``holder``; ``None``:
    any token) no longer holds the job."""
    job = session.get(JobRow, job_id)
    attempts = job.attempts if job is not None else 1
    delay = min(retry_seconds * 2 ** max(0, attempts - 1), MAX_RETRY_SECONDS)
    out = JobRow.attempts >= JobRow.max_attempts
    state = case((out, "failed"), else_="queued")
    retry_at = case((out, None), else_=utcnow() + timedelta(seconds=delay)) if delay else None
    return _change(session, job_id, worker, holder, state=state, error=error, error_by=reporter,
                   **{**NO_LEASE, "lease_expires_at": retry_at})  # fmt: skip


def get_job(session: Session, *, job_id: int) -> JobRow | None:
    return session.get(JobRow, job_id)
