"""A page of the job queue, within the server's byte budget (:mod:`cache_server.budget`).

A job's key may hold a user kernel's problem of 32 long parameter names, environment entries and
device flags (13 KB), and its last error 4 KB: a page of 1,000 such, queued by one write token
within its open-jobs cap, was 17 MB to build for any reader of ``GET /v1/jobs``, past the
``answer_bytes`` every other listing keeps to. A page cut short is a shorter page: clients page
on by the count they received (``tunecache pretune``), the dashboard says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cache_server.budget import stored_size, within
from cache_server.models import JobRow

JOB_SIZE = stored_size(JobRow.key, JobRow.error)  # what a job's row holds that may be large


def list_jobs(
    session: Session, *, state: str | None = None, limit: int = 100, offset: int = 0,
    budget: int, key_hashes: Sequence[str] | None = None,
) -> tuple[list[JobRow], int]:  # fmt: skip
    """The jobs of ``state`` (any: ``None``; of ``key_hashes`` only, unless ``None``) by id,
    ``limit`` from ``offset``, those leading ones whose key and error fit in ``budget`` bytes
    together (at least one); and how many there are of those."""
    listed = select(JobRow) if state is None else select(JobRow).where(JobRow.state == state)
    if key_hashes is not None:
        listed = listed.where(JobRow.key_hash.in_(list(key_hashes)))
    total = session.scalar(select(func.count()).select_from(listed.subquery())) or 0
    kept = within(listed, [(JobRow.id, False)], JobRow, JOB_SIZE, budget, limit=limit,
                  offset=offset)  # fmt: skip
    rows = session.scalars(select(JobRow).where(JobRow.id.in_(select(kept.c.id)))
                           .order_by(JobRow.id)).all()  # fmt: skip
    return list(rows), total
