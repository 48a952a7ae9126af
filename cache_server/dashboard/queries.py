"""The dashboard's own query functions (the rest it borrows from :mod:`cache_server.queries` and
:mod:`cache_server.jobs`). Keyword-only; they never commit."""

from __future__ import annotations

from typing import Final, get_args

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from cache_server.models import JobRow, RecordRow, WinnerRow
from tunecache.jobs import JobState

JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)


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
