"""What a caller has queued, counted for the queue's caps: the jobs misses created in a window
(the server-wide budget of new jobs from misses, and each caller's share of it) and a token's
open jobs; each count taken behind a lock of its own, held until the insert it allows commits.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cache_server.models import JobRow
from cache_server.twins import lock_slot
from tunecache.jobs import OPEN_STATES


def count_created(
    session: Session,
    *,
    source: str,
    since: datetime,
    requested_by: str | None = None,
    callers: str | None = None,
) -> int:
    """Jobs from ``source`` created at or after ``since`` (whatever their state now); with
    ``requested_by``, only those that caller asked for; with ``callers``, those the callers
    whose names start with it asked for."""
    stmt = select(func.count()).where(JobRow.source == source, JobRow.created_at >= since)
    if requested_by is not None:
        stmt = stmt.where(JobRow.requested_by == requested_by)
    if callers is not None:
        stmt = stmt.where(JobRow.requested_by.startswith(callers, autoescape=True))
    return session.scalar(stmt) or 0


def lock_miss_budget(session: Session) -> None:
    """Holds the lock of the budget of new jobs from misses until the transaction ends, taken
    before counting them (:func:`count_created`): the count and the insert it allows are then
    one step. Counted first and inserted after, concurrent misses (server processes on
    PostgreSQL: 16 jobs where the limit was 15) each read a count below the limit.

    PostgreSQL: an advisory lock (:data:`cache_server.twins.LOCK_CLASS`, a slot of its own);
    each statement after it (read committed) sees what the holder before committed. SQLite: the
    database's write lock, taken now rather than at the insert, so that no other writer commits
    between the count and the insert (reads run outside a transaction until the first write).
    """
    lock_slot(session, MISS_BUDGET_SLOT)


MISS_BUDGET_SLOT = 256  # past the keys' slots (0-255: cache_server.twins.lock_key)


def count_open(session: Session, *, requested_by: str) -> int:
    """The open (queued or running) jobs ``requested_by`` asked for, whatever their source."""
    stmt = select(func.count()).where(
        JobRow.requested_by == requested_by, JobRow.state.in_(OPEN_STATES)
    )
    return session.scalar(stmt) or 0


def lock_open_jobs(session: Session, *, token_id: int) -> None:
    """Holds the lock of token ``token_id``'s open jobs until the transaction ends, taken
    before counting them (:func:`count_open`): concurrent requests of one token never both fit
    under a cap that has room for one (as :func:`lock_miss_budget`; tokens share
    :data:`OPEN_JOBS_SLOTS` slots)."""
    lock_slot(session, OPEN_JOBS_SLOT + token_id % OPEN_JOBS_SLOTS)


OPEN_JOBS_SLOT = 512  # 512-767: past the keys', the miss budget's and token names' (257)
OPEN_JOBS_SLOTS = 256
