"""The dashboard's own query functions (the rest it borrows from :mod:`cache_server.queries` and
:mod:`cache_server.jobs`). Keyword-only; they never commit."""

from __future__ import annotations

from dataclasses import asdict
from typing import Final, get_args

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from cache_server.models import JobRow, RecordRow, WinnerRow
from cache_server.queries import RecordFilters, public_record
from tunecache.schemas import JobState, RecordPublic

JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)


def list_by_key(
    session: Session,
    *,
    filters: RecordFilters,
    winners_only: bool = True,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[RecordPublic], int]:
    """Records (by default winners only, without trials) matching ``filters``, grouped by kernel,
    device, backend and dtype, fastest first within a group; and how many match in all."""
    stmt = select(RecordRow, WinnerRow.record_id).outerjoin(
        WinnerRow, WinnerRow.record_id == RecordRow.id
    )
    if winners_only:
        stmt = stmt.where(WinnerRow.record_id.is_not(None))
    for name, value in asdict(filters).items():
        if value is not None:
            stmt = stmt.where(getattr(RecordRow, name) == value)
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    order = (RecordRow.kernel, RecordRow.device_arch, RecordRow.device_name, RecordRow.backend,
             RecordRow.dtype, RecordRow.time_ms, RecordRow.id)  # fmt: skip
    rows = session.execute(stmt.order_by(*order).limit(limit).offset(offset)).all()
    return [public_record(r[0], is_winner=r[1] is not None) for r in rows], total


def choices(session: Session) -> dict[str, list[str]]:
    """The kernels, backends and device archs that have a winner: the filters' options."""
    columns: dict[str, InstrumentedAttribute[str]] = {
        "kernel": RecordRow.kernel,
        "backend": RecordRow.backend,
        "device_arch": RecordRow.device_arch,
    }
    found = {}
    for name, column in columns.items():
        stmt = select(column).distinct().join(WinnerRow, WinnerRow.record_id == RecordRow.id)
        found[name] = sorted(session.scalars(stmt))
    return found


def job_counts(session: Session) -> dict[str, int]:
    """How many jobs are in each state, every state listed (0 where none)."""
    counted = session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
    return {state: 0 for state in JOB_STATES} | {state: n for state, n in counted}
