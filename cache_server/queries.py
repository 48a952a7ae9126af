"""Query functions. Keyword-only, typed, and they never commit: the session's owner does.

The winner upsert is one statement,
``INSERT … ON CONFLICT DO UPDATE … WHERE winners.time_ms > excluded.time_ms``, atomic on SQLite and
PostgreSQL alike: concurrent uploads of one key leave the fastest validated record as the winner
whatever order they commit in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from sqlalchemy import Select, func, insert, select
from sqlalchemy.orm import Session

from cache_server.db import upsert_insert
from cache_server.models import RecordRow, TrialRow, WinnerRow, utcnow
from tunecache.rules import bucket_digest
from tunecache.schemas import RecordCreate, RecordPublic, Trial

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


def record_row(*, key_hash: str, record: RecordCreate) -> RecordRow:
    """The row that stores ``record`` (its trials and winner aside)."""
    key = record.key
    return RecordRow(
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
    )


def add_record(session: Session, *, key_hash: str, record: RecordCreate) -> tuple[int, int | None]:
    """Stores ``record`` and its trials; makes it the key's winner if validated and fastest.

    Returns:
        ``(record_id, winner_record_id)``; the winner is ``None`` while the key has no
        validated record.
    """
    row = record_row(key_hash=key_hash, record=record)
    session.add(row)
    session.flush()
    _insert_trials(session, row.id, record)
    if record.validation.passed:
        stmt = upsert_insert(session, WinnerRow).values(
            key_hash=key_hash, record_id=row.id, time_ms=row.time_ms, updated_at=utcnow()
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[WinnerRow.key_hash],
            set_={
                "record_id": stmt.excluded.record_id,
                "time_ms": stmt.excluded.time_ms,
                "updated_at": stmt.excluded.updated_at,
            },
            where=WinnerRow.time_ms > stmt.excluded.time_ms,
        )
        session.execute(stmt)
    winner = session.scalar(select(WinnerRow.record_id).where(WinnerRow.key_hash == key_hash))
    return row.id, winner


def record_fields(row: RecordRow) -> dict[str, Any]:
    """What a client sent for ``row`` (as in :class:`RecordCreate`), less its trials."""
    return {
        "key": row.key,
        "config": row.config,
        "config_summary": row.config_summary,
        "timing": row.timing,
        "baselines": row.baselines,
        "validation": row.validation,
        "search": row.search,
        "provenance": row.provenance,
    }


def public_record(
    row: RecordRow, *, is_winner: bool, trials: Sequence[TrialRow] = ()
) -> RecordPublic:
    return RecordPublic.model_validate(
        {
            "id": row.id,
            "key_hash": row.key_hash,
            "created_at": row.created_at,
            "is_winner": is_winner,
            **record_fields(row),
            "trials": [
                Trial(config=t.config, status=t.status, time_ms=t.time_ms, error=t.error)  # type: ignore[arg-type]
                for t in trials
            ],
        }
    )


def get_winner(session: Session, *, key_hash: str) -> RecordPublic | None:
    """The winning record of ``key_hash`` (without its trials), or ``None`` on a miss."""
    row = session.scalar(
        select(RecordRow)
        .join(WinnerRow, WinnerRow.record_id == RecordRow.id)
        .where(WinnerRow.key_hash == key_hash)
    )
    return None if row is None else public_record(row, is_winner=True)


def get_record(
    session: Session, *, record_id: int, with_trials: bool = True
) -> RecordPublic | None:
    """One record by id, with its trials in the order they ran."""
    row = session.get(RecordRow, record_id)
    if row is None:
        return None
    trials: Sequence[TrialRow] = ()
    if with_trials:
        trials = session.scalars(
            select(TrialRow).where(TrialRow.record_id == record_id).order_by(TrialRow.position)
        ).all()
    winner = session.scalar(select(WinnerRow.record_id).where(WinnerRow.key_hash == row.key_hash))
    return public_record(row, is_winner=winner == row.id, trials=trials)


@dataclass(frozen=True)
class RecordFilters:
    """Filters of a record listing, each a :class:`RecordRow` column; ``None`` matches any value."""

    kernel: str | None = None
    backend: str | None = None
    dtype: str | None = None
    device_arch: str | None = None
    key_hash: str | None = None
    validated: bool | None = None


def _filtered(stmt: S, filters: RecordFilters) -> S:
    for name, value in asdict(filters).items():
        if value is not None:
            stmt = stmt.where(getattr(RecordRow, name) == value)
    return stmt


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
) -> tuple[list[RecordPublic], int]:
    """Records matching every given filter, and the total count matching.

    Newest first; with ``by_key``, grouped by kernel, device, backend and dtype, fastest first
    within a group (the dashboard's table).
    """
    base = select(RecordRow, WinnerRow.record_id).outerjoin(
        WinnerRow, WinnerRow.record_id == RecordRow.id
    )
    if winners_only:
        base = base.where(WinnerRow.record_id.is_not(None))
    base = _filtered(base, filters)
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    order = _BY_KEY if by_key else (RecordRow.id.desc(),)
    rows = session.execute(base.order_by(*order).limit(limit).offset(offset)).all()
    return [public_record(r[0], is_winner=r[1] is not None) for r in rows], total


def count_records(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(RecordRow)) or 0
