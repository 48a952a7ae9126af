"""Job-queue query functions. Keyword-only; they never commit (the session's owner does).

A claim is one statement — ``UPDATE jobs … WHERE id = (SELECT id … LIMIT 1 FOR UPDATE SKIP
LOCKED) RETURNING id`` — so concurrent claimers never get the same job: PostgreSQL skips rows
another transaction holds; SQLite runs the statement under its single write lock (``FOR UPDATE``
is not rendered there). A running job whose lease has expired is claimable again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from cache_server.db import upsert_insert
from cache_server.models import JobRow, utcnow
from tunecache.key import kernel_module


def enqueue(
    session: Session,
    *,
    key_hash: str,
    key: dict[str, Any],
    priority: int = 0,
    max_attempts: int = 3,
    source: str = "api",
    strategy: str | None = None,
    trials: int | None = None,
) -> tuple[JobRow, bool]:
    """Queues a job for ``key_hash`` unless one exists; returns it and whether it is new."""
    now = utcnow()
    stmt = upsert_insert(session, JobRow).values(
        key_hash=key_hash, key=key, state="queued", priority=priority, source=source,
        attempts=0, max_attempts=max_attempts, error="", created_at=now, updated_at=now,
        backend=key["backend"], device_arch=key["device"]["arch"], strategy=strategy,
        trials=trials, kernel_module=kernel_module(key["kernel"]),
    )  # fmt: skip
    new_id = session.execute(
        stmt.on_conflict_do_nothing(index_elements=["key_hash"]).returning(JobRow.id)
    ).scalar()
    job = find(session, key_hash=key_hash)
    assert job is not None
    return job, new_id is not None


def find(session: Session, *, key_hash: str) -> JobRow | None:
    return session.scalar(select(JobRow).where(JobRow.key_hash == key_hash))


def count_created(session: Session, *, source: str, since: datetime) -> int:
    """Jobs from ``source`` created at or after ``since`` (whatever their state now)."""
    stmt = select(func.count()).where(JobRow.source == source, JobRow.created_at >= since)
    return session.scalar(stmt) or 0


def _claimable(now: datetime) -> ColumnElement[bool]:
    expired = and_(
        JobRow.state == "running",
        JobRow.lease_expires_at < now,
        JobRow.attempts < JobRow.max_attempts,
    )
    # A queued job's lease_expires_at, when set, is when a failed attempt may be retried.
    due = or_(JobRow.lease_expires_at.is_(None), JobRow.lease_expires_at <= now)
    return or_(and_(JobRow.state == "queued", due), expired)


def claim(
    session: Session,
    *,
    worker: str,
    lease_seconds: float,
    device_arch: str | None = None,
    backends: Sequence[str] | None = None,
    kernel_packages: Sequence[str] | None = None,
) -> JobRow | None:
    """Leases the most urgent claimable job to ``worker``, or ``None`` when there is none.

    With ``device_arch``, ``backends`` and ``kernel_packages``, only a job for that arch, one of
    those backends and a built-in kernel or one from those packages (or their subpackages): a
    worker is never handed a job it cannot run.
    """
    now = utcnow()
    fits = [_claimable(now)]
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
    pick = (
        select(JobRow.id)
        .where(*fits)
        .order_by(JobRow.priority.desc(), JobRow.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stmt = (
        update(JobRow)
        .where(JobRow.id == pick, _claimable(now))
        .values(
            state="running",
            lease_owner=worker,
            attempts=JobRow.attempts + 1,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            updated_at=now,
        )
        .returning(JobRow.id)
        .execution_options(synchronize_session=False)
    )
    job_id = session.execute(stmt).scalar()
    return None if job_id is None else session.get(JobRow, job_id, populate_existing=True)


def _owned(job_id: int, worker: str) -> ColumnElement[bool]:
    return and_(JobRow.id == job_id, JobRow.state == "running", JobRow.lease_owner == worker)


def _change(session: Session, job_id: int, worker: str, **values: Any) -> JobRow | None:
    stmt = (
        update(JobRow)
        .where(_owned(job_id, worker))
        .values(updated_at=utcnow(), **values)
        .returning(JobRow.id)
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).scalar() is None:
        return None
    return session.get(JobRow, job_id, populate_existing=True)


def heartbeat(session: Session, *, job_id: int, worker: str, lease_seconds: float) -> JobRow | None:
    """Extends ``worker``'s lease; ``None`` if it no longer holds the job."""
    expires = utcnow() + timedelta(seconds=lease_seconds)
    return _change(session, job_id, worker, lease_expires_at=expires)


def complete(session: Session, *, job_id: int, worker: str, record_id: int | None) -> JobRow | None:
    """Marks the job done; ``None`` if ``worker`` no longer holds it."""
    return _change(session, job_id, worker, state="done", record_id=record_id,
                   lease_owner=None, lease_expires_at=None)  # fmt: skip


MAX_RETRY_SECONDS = 3600.0


def fail(session: Session, *, job_id: int, worker: str, error: str,
         retry_seconds: float = 0.0) -> JobRow | None:  # fmt: skip
    """Records a failed attempt: back to the queue, claimable again after ``retry_seconds``
    doubled for each attempt after the first (at most :data:`MAX_RETRY_SECONDS`), or ``failed``
    once out of attempts. (A queued job's ``lease_expires_at`` is that time.)"""
    job = session.get(JobRow, job_id)
    attempts = job.attempts if job is not None else 1
    delay = min(retry_seconds * 2 ** max(0, attempts - 1), MAX_RETRY_SECONDS)
    out = JobRow.attempts >= JobRow.max_attempts
    state = case((out, "failed"), else_="queued")
    retry_at = case((out, None), else_=utcnow() + timedelta(seconds=delay)) if delay else None
    return _change(session, job_id, worker, state=state, error=error,
                   lease_owner=None, lease_expires_at=retry_at)  # fmt: skip


def list_jobs(
    session: Session, *, state: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[list[JobRow], int]:
    stmt = select(JobRow)
    if state is not None:
        stmt = stmt.where(JobRow.state == state)
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(stmt.order_by(JobRow.id).limit(limit).offset(offset)).all()
    return list(rows), total


def get_job(session: Session, *, job_id: int) -> JobRow | None:
    return session.get(JobRow, job_id)
