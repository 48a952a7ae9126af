"""The dashboard's own query functions (the rest it borrows from :mod:`cache_server.queries` and
:mod:`cache_server.jobs`). Keyword-only; they never commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, get_args

from sqlalchemy import Text, case, cast, func, null, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from cache_server.models import JobRow, RecordRow, TrialRow, WinnerRow
from cache_server.queries import WinnerTable
from tunecache import trialcount
from tunecache.jobs import JobState
from tunecache.schemas import RecordPublic

JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)


# Options a filter offers at most: an uploader may store any number of kernel names (40,000
# made every view of the index 10.7 MB and 0.8 s); past it, the filter is typed in.
MAX_CHOICES = 200


def choices(session: Session, table: WinnerTable = WinnerRow) -> dict[str, list[str] | None]:
    """The kernels, backends and device archs that have a winner in ``table`` (the serving
    policy's): the filters' options, in order; ``None`` where there are over :data:`MAX_CHOICES`."""
    columns: dict[str, InstrumentedAttribute[str]] = {
        "kernel": RecordRow.kernel,
        "backend": RecordRow.backend,
        "device_arch": RecordRow.device_arch,
    }
    found: dict[str, list[str] | None] = {}
    for name, column in columns.items():
        stmt = (select(column).distinct().join(table, table.record_id == RecordRow.id)
                .order_by(column).limit(MAX_CHOICES + 1))  # fmt: skip
        values = list(session.scalars(stmt))
        found[name] = values if len(values) <= MAX_CHOICES else None
    return found


def job_counts(session: Session) -> dict[str, int]:
    """How many jobs are in each state, every state listed (0 where none)."""
    counted = session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
    return {state: 0 for state in JOB_STATES} | {state: n for state, n in counted}


def stored_trials(session: Session, record_ids: Sequence[int]) -> dict[int, int]:
    """How many trials the server stores of each record of ``record_ids`` (what the record's
    page counts; an uploader's ``search.trials`` is only its claim)."""
    if not record_ids:
        return {}
    stmt = select(RecordRow.id, RecordRow.trial_count).where(RecordRow.id.in_(record_ids))
    return {record_id: count for record_id, count in session.execute(stmt).all()}


# A backend's default config is a few bytes (``{"schedule": "default"}``); a trial's config may
# be 256 KiB, and a page of 100 records' last trials is not read whole to find one. A longer
# config is no backend's default: it stands for itself as this, which equals none.
DEFAULT_CONFIG_CHARS = 256
_LONGER: Final[Mapping[str, Any]] = {"": "a config longer than any backend's default"}


def default_last(session: Session, records: Sequence[RecordPublic]) -> set[int]:
    """The ids of ``records`` whose last stored trial is the default config timed beside the
    winner, no trial of the search (:func:`tunecache.trialcount.default_last`, as ``records
    show`` decides it): the pages count it apart, as the CLI does."""
    maybe = {r.id: r for r in records if trialcount.may_end_with_default(r)}
    if not maybe:
        return set()
    short = func.length(cast(TrialRow.config, Text)) <= DEFAULT_CONFIG_CHARS
    stmt = (select(TrialRow.record_id, case((short, TrialRow.config), else_=null()))
            .join(RecordRow, RecordRow.id == TrialRow.record_id)
            .where(TrialRow.record_id.in_(list(maybe)),
                   TrialRow.position == RecordRow.trial_count - 1))  # fmt: skip
    rows = session.execute(stmt).all()
    return {
        record_id for record_id, config in rows
        if trialcount.default_last(maybe[record_id], _LONGER if config is None else config)
    }  # fmt: skip
