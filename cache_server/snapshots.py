"""Snapshot queries: the winners of a device arch, and merging a snapshot's records.

Keyword-only and typed, and they never commit: the session's owner does, so an import is one
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from cache_server.models import RecordRow, TokenRow, WinnerRow
from cache_server.queries import (
    RECORD_SIZE,
    WinnerTable,
    add_record,
    public_record,
    record_fields,
)
from tunecache.errors import InvalidInput
from tunecache.kernels import builtin_problem
from tunecache.schemas import STORED, RecordCreate
from tunecache.snapshot import MAX_SNAPSHOT_RECORDS, SnapshotFilters


def _create(row: RecordRow) -> RecordCreate:
    """``row`` as a snapshot carries it: the time the server believes (a verifier's, once one
    re-timed it) and only the comparisons that stand (none of an uploader whose time the
    verifier's differs from past :data:`tunecache.believed.APART_RATIO`; beside a verifier's
    time, only interleaved ones). A snapshot has no verification of its own: exported as
    uploaded, a time the verifier found 3x too fast won again on the server that imported it."""
    public = public_record(row, is_winner=True)
    baselines = public.comparisons()
    if public.believed_timing is not public.timing:  # a verifier's time beside the uploader's
        # baselines: a ratio of medians would divide one machine's by another's; an interleaved
        # comparison's ratio stands on its own.
        baselines = [b for b in baselines if b.speedup is not None]
    fields = {**record_fields(row), "timing": public.believed_timing, "baselines": baselines}
    return RecordCreate.model_validate(fields, context=STORED)


class SnapshotTooLarge(Exception):
    """The winners a snapshot would hold are over the server's bounds (a 422 naming them)."""


def snapshot_winners(
    session: Session, *, filters: SnapshotFilters, table: WinnerTable = WinnerRow,
    max_bytes: int | None = None,
) -> list[RecordCreate]:  # fmt: skip
    """The winner (in ``table``) of every key matching ``filters``, by key hash, no trials.

    Raises:
        SnapshotTooLarge: more than :data:`~tunecache.snapshot.MAX_SNAPSHOT_RECORDS` winners
            (what a client reads), or with ``max_bytes``, more stored JSON than that: counted
            in the database before any is read (a write token's fat winners made one export
            gigabytes to build).
    """
    stmt = (
        select(RecordRow)
        .join(table, table.record_id == RecordRow.id)
        .where(RecordRow.device_arch == filters.device_arch)
    )  # fmt: skip
    for column, value in (
        (RecordRow.device_name, filters.device_name),
        (RecordRow.kernel, filters.kernel),
        (RecordRow.backend, filters.backend),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    _check_size(session, stmt, max_bytes)
    # A built-in kernel's record at a problem it does not take (stored before uploads were
    # checked) is never looked up, and another server would refuse it: left out.
    return [_create(row) for row in session.scalars(stmt.order_by(table.key_hash))
            if builtin_problem(row.key["kernel"], row.key["problem"]) is None]  # fmt: skip


def _check_size(session: Session, stmt: Select[Any], max_bytes: int | None) -> None:
    count, held = session.execute(
        stmt.with_only_columns(
            func.count(), func.coalesce(func.sum(RECORD_SIZE), 0), maintain_column_froms=True
        )
    ).one()
    over = []
    if count > MAX_SNAPSHOT_RECORDS:
        over.append(f"{count} winners (a snapshot holds at most {MAX_SNAPSHOT_RECORDS})")
    if max_bytes is not None and held > max_bytes:
        over.append(f"{held:,} bytes of records (the server's limit is {max_bytes:,}: "
                    "TUNECACHE_SERVER_SNAPSHOT_BYTES)")  # fmt: skip
    if over:
        raise SnapshotTooLarge(f"this snapshot would hold {' and '.join(over)}: narrow it with "
                               "kernel, backend or device_name (or have the server's operator "
                               "raise its limit)")  # fmt: skip


def import_records(
    session: Session, *, records: Sequence[RecordCreate], uploader: TokenRow | None = None,
    bucket_limit: int | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Adds every record through :func:`add_record` as ``uploader``'s: the faster validated
    record of a key wins.

    Returns:
        ``(imported, winners_changed)``: records stored (not those this uploader had sent
        before: a snapshot imported twice is stored once), and keys whose winner is now one of
        them.

    Raises:
        InvalidInput: the database refused a record's data (PostgreSQL refuses NUL characters in
            text columns, for one); the caller's rollback then undoes the whole import.
        BucketFull: a record is a new key's in a bucket at ``bucket_limit`` winners (the same).
    """
    changed: set[str] = set()
    stored = 0
    # By key, each key's in the order sent: every writer takes its keys' locks in one order
    # (cache_server.twins.lock_key), so two imports at once never wait for each other in a circle.
    ordered = sorted((record.key.digest(), i, record) for i, record in enumerate(records))
    for key_hash, i, record in ordered:
        try:
            added = add_record(session, key_hash=key_hash, record=record, uploader=uploader,
                               bucket_limit=bucket_limit)  # fmt: skip
        except DataError as exc:
            raise InvalidInput(f"records[{i}]: the database refused it: {exc.orig}") from exc
        stored += not added.again
        if added.winner == added.record_id and not added.again:
            changed.add(key_hash)
    return stored, len(changed)
